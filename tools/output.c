/* output.c -- how the gpureclaim command writes numbers and JSON: binary units for people, exact integers and
 * escaped strings for programs. */
#include "command.h"
#include "common.h"
#include "options.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static bool g_json;
bool cmd_json_out(void) { return g_json; }
void cmd_set_json(bool on) { g_json = on; }

const char *cmd_bytes(uint64_t v, char *buf, size_t len) { return gr_log_bytes(v, buf, len); }

const char *cmd_iso_time(int64_t ms, char *buf, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  char date[32], zone[8];
  if (!localtime_r(&t, &tm) || !strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm) ||
      !strftime(zone, sizeof zone, "%z", &tm) || strlen(zone) != 5) {
    snprintf(buf, len, "?");
    return buf;
  }
  snprintf(buf, len, "%s.%03d%.3s:%s", date, (int)(ms % 1000), zone, zone + 3);
  return buf;
}

static void put_file(void *f, const char *p, size_t n) { fwrite(p, 1, n, f); }
void cmd_json_str(FILE *f, const char *s) { gr_json_escape(s, put_file, f); }

char *cmd_printable(char *s) {
  unsigned char *w = (unsigned char *)s;
  for (const unsigned char *p = w; *p;) {
    size_t n = gr_utf8_len(p);
    /* Not UTF-8, a C0 control or DEL (one byte), a C1 control (U+0080..U+009F, two bytes; a terminal may
     * read U+009B as CSI): one '?' each. */
    if (!n || *p < 0x20 || *p == 0x7f || (n == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
      *w++ = '?';
      p += n ? n : 1;
      continue;
    }
    memmove(w, p, n);
    w += n;
    p += n;
  }
  *w = '\0';
  return s;
}

void cmd_json_dump(FILE *f, const jnode_t *n) {
  if (!n) {
    fputs("null", f);
    return;
  }
  switch (n->type) {
  case JN_NULL: fputs("null", f); break;
  case JN_BOOL: fputs(n->b ? "true" : "false", f); break;
  case JN_NUM:
    /* Integers as read (byte counts exceed a double's precision); others with enough digits for a duration. */
    if (n->is_int)
      fprintf(f, "%lld", (long long)n->i);
    else
      fprintf(f, "%.6g", n->num);
    break;
  case JN_STR: cmd_json_str(f, n->s); break;
  case JN_ARR:
  case JN_OBJ:
    fputc(n->type == JN_ARR ? '[' : '{', f);
    for (size_t i = 0; i < n->n; i++) {
      if (i)
        fputc(',', f);
      if (n->type == JN_OBJ) {
        cmd_json_str(f, n->keys[i]);
        fputc(':', f);
      }
      cmd_json_dump(f, &n->kids[i]);
    }
    fputc(n->type == JN_ARR ? ']' : '}', f);
    break;
  }
}

