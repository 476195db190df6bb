/*
 * file.c -- gpureclaim_snapshot() and gpureclaim_leak_report(): a snapshot or a leak report to a path the
 * program names ("-": standard output or error). A regular file is replaced through a temporary name, so a
 * reader never sees half a file; a device, FIFO or link is written into (outfile.c).
 */
#include "state.h"

#include "json.h"
#include "outfile.h"
#include "report.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/* Writes b to path: outfile.c replaces a regular file through a temporary name, writes into anything else. */
static int write_file(const char *path, const jbuf_t *b, mode_t mode) {
  if (b->failed)
    return -ENOMEM;
  return gr_out_write(path, b->p, b->len, mode);
}

static int to_path(const char *path, int std_fd, int (*fill)(jbuf_t *, bool), bool arg) {
  if (!path || !*path)
    return -EINVAL;
  if (gr_state_disabled())
    return -ENOTSUP;
  jbuf_t b;
  jb_init(&b);
  int rc = fill(&b, arg);
  if (rc == 0)
    rc = strcmp(path, "-") == 0 ? jb_write_fd(&b, std_fd) : write_file(path, &b, 0644);
  jb_free(&b);
  if (rc < 0 && rc != -ENOMEM)
    rc = -EIO; /* the header's promise: a file that could not be written */
  return rc;
}

static int fill_snapshot(jbuf_t *b, bool unused) {
  (void)unused;
  int rc = gr_report_snapshot_json(b);
  jb_raw(b, "\n", 1);
  return rc;
}

GPURECLAIM_API int gpureclaim_snapshot(const char *path) { return to_path(path, STDOUT_FILENO, fill_snapshot, false); }

GPURECLAIM_API int gpureclaim_leak_report(const char *path, int json) {
  return to_path(path, STDERR_FILENO, gr_report_leaks, json != 0);
}
