/*
 * log.c -- gpureclaim's messages: one line each on stderr, "gpureclaim[pid]: ...", written with a single
 * write(2) from a stack buffer (no stdio locks, no allocation), so it is usable from any hook.
 * Quiet by default: a library inside other people's programs writes nothing there unless something is wrong
 * (warnings) or it was asked (GPURECLAIM_VERBOSE). Release reports (JSON lines) go to GPURECLAIM_LOG when it
 * names a file or stderr, else nowhere (report.c); at GPURECLAIM_VERBOSE=1 each release also gets one short
 * line for people here (gr_log_release()).
 */
#include "gpureclaim_internal.h"
#include "gpureclaim.h"

#include <errno.h>
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

const char *gr_log_bytes(uint64_t v, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double x = (double)v;
  size_t i = 0;
  while (x >= 1024 && i + 1 < GR_ARRAY_LEN(u)) {
    x /= 1024;
    i++;
  }
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", x, u[i]);
  return buf;
}

void gr_assert_fail(const char *what, const char *file, int line) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "gpureclaim[%d]: internal invariant broken at %s:%d: %s\n", (int)getpid(), file,
                   line, what);
  if (n > 0)
    (void)!write(STDERR_FILENO, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
  abort();
}

void gr_log_release(const gpureclaim_report_t *r) {
  if (gr_opt()->verbose < 1)
    return;
  static const char *const by[] = {"?", "the API", "the signal", "an out-of-memory retry", "the gpureclaim command",
                                   "a scope's end", "a peer"};
  char total[32], cached[32], orphaned[32], peer[48] = "";
  if (r->trigger == GPURECLAIM_TRIGGER_PEER)
    snprintf(peer, sizeof peer, " (pid %d, out of memory on the same GPU)", r->peer_pid);
  uint64_t sum = r->cached_bytes + r->orphaned_bytes + r->all_bytes;
  gr_info("released %s in %.2f ms (cached %s, orphaned %s in %llu block%s), asked by %s%s",
          gr_log_bytes(sum, total, sizeof total), (double)r->duration_ns / 1e6,
          gr_log_bytes(r->cached_bytes, cached, sizeof cached), gr_log_bytes(r->orphaned_bytes, orphaned, sizeof orphaned),
          (unsigned long long)r->orphaned_blocks, gr_plural(r->orphaned_blocks),
          r->trigger >= 0 && (size_t)r->trigger < GR_ARRAY_LEN(by) ? by[r->trigger] : by[0], peer);
}
