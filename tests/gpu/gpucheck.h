/* Result lines for the nvcc-built GPU tests: `GPUTEST {"name","status","detail","data"}` (see collect.py). */
#ifndef GR_GPU_GPUCHECK_H
#define GR_GPU_GPUCHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gt_failed;

static const char *gt_prefix(void) {
  const char *p = getenv("GPU_TEST_NAME");
  return p && *p ? p : "gpu";
}

/* Writes s as a JSON string (quotes included). */
static void gt_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* status: 1 PASS, 0 FAIL, -1 SKIP. data_json: a JSON object text ("{}" when NULL). */
static void gt_result(const char *check, int status, const char *data_json, const char *fmt, ...) {
  char detail[2048], name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  snprintf(name, sizeof name, "%s.%s", gt_prefix(), check);
  if (status == 0)
    gt_failed = 1;
  printf("GPUTEST {\"name\": ");
  gt_json_str(stdout, name);
  printf(", \"status\": \"%s\", \"detail\": ", status > 0 ? "PASS" : status == 0 ? "FAIL" : "SKIP");
  gt_json_str(stdout, detail);
  printf(", \"data\": %s}\n", data_json ? data_json : "{}");
  fflush(stdout);
}

#define GT_MIB (1024.0 * 1024.0)

#endif
