/*
 * log.c -- gpureclaim's messages: one line each on stderr, "gpureclaim[pid]: ...", written with a single
 * write(2) from a stack buffer (no stdio locks, no allocation), so it is usable from any hook.
 * Quiet by default: a library inside other people's programs writes nothing there unless something is wrong
 * (warnings) or it was asked (GPURECLAIM_VERBOSE). Release reports (JSON lines) go to GPURECLAIM_LOG when it
 * names a file or stderr, else nowhere; at GPURECLAIM_VERBOSE=1 each release also gets one short line for
 * people (both in report/event.c).
 */
#include "common.h"
#include "gpureclaim.h"
#include "options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void gr_log(int level, const char *fmt, ...) {
  if (level > 0 && gr_opt()->verbose < level)
    return;
  int saved = errno;
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "gpureclaim[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0)
    m = 0;
  size_t len = (size_t)n + ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
  errno = saved;
}

void gr_assert_fail(const char *what, const char *file, int line) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "gpureclaim[%d]: internal invariant broken at %s:%d: %s\n", (int)getpid(), file,
                   line, what);
  if (n > 0)
    (void)!write(STDERR_FILENO, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
  abort();
}
