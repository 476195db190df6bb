/*
 * event.c -- the event lines (JSON, one per line) of releases, peer reclaims, sleeps and wakes, written to
 * GPURECLAIM_LOG when set (or stderr when asked), and a release's one line for people (GPURECLAIM_VERBOSE=1).
 * Formats: docs/PROTOCOL.md. Nothing here runs inside an allocation.
 */
#include "names.h"
#include "options.h"

#include "json.h"
#include "outfile.h"
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void gr_report_release_json(jbuf_t *b, const gpureclaim_report_t *r) {
  char what[64];
  jb_obj(b);
  jb_u64(b, "seq", r->seq);
  jb_str(b, "trigger", gr_trigger_name(r->trigger));
  jb_str(b, "what", gr_opt_what_name(r->what, what, sizeof what));
  jb_u64(b, "cached_bytes", r->cached_bytes);
  jb_u64(b, "pool_bytes", r->pool_bytes);
  jb_u64(b, "framework_bytes", r->framework_bytes);
  jb_u64(b, "releaser_bytes", r->releaser_bytes);
  jb_u64(b, "orphaned_bytes", r->orphaned_bytes);
  jb_u64(b, "orphaned_blocks", r->orphaned_blocks);
  jb_u64(b, "all_bytes", r->all_bytes);
  jb_u64(b, "all_blocks", r->all_blocks);
  jb_u64(b, "failed_blocks", r->failed_blocks);
  jb_f64(b, "ms", (double)r->duration_ns / 1e6);
  if (r->trigger == GPURECLAIM_TRIGGER_PEER)
    jb_i64(b, "peer_pid", r->peer_pid); /* the process that asked */
  jb_arr(b, "devices");
  for (int i = 0; i < r->ndevices && i < GPURECLAIM_MAX_DEVICES; i++) {
    const gpureclaim_device_report_t *d = &r->devices[i];
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d->device);
    jb_u64(b, "pool_bytes", d->pool_bytes);
    jb_u64(b, "orphaned_bytes", d->orphaned_bytes);
    jb_u64(b, "orphaned_blocks", d->orphaned_blocks);
    jb_u64(b, "all_bytes", d->all_bytes);
    jb_u64(b, "all_blocks", d->all_blocks);
    jb_u64(b, "free_before", d->free_before);
    jb_u64(b, "free_after", d->free_after);
    jb_u64(b, "total", d->total);
    jb_obj_end(b);
  }
  jb_arr_end(b);
  jb_obj_end(b);
}

/* Appends one JSON line (b, newline included) where events go (a release report, a peer reclaim, a sleep, a
 * wake): GPURECLAIM_LOG, or stderr when asked. */
void gr_report_event(const jbuf_t *b) {
  const char *log = gr_opt()->log;
  if (log[0]) {
    /* Not waiting: a FIFO nobody reads would block the open for good, and a release runs on an allocating
     * thread (OOM retry), in gpureclaim_release() and on the worker that serves the control socket. It fails
     * with ENXIO instead, and the report goes to stderr. */
    int fd = gr_out_open_nowait(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd >= 0) {
      int rc = jb_write_fd(b, fd); /* one write of a short line: appends stay whole */
      if (close(fd) != 0 && rc == 0 && errno != EINTR)
        rc = -errno;
      if (rc < 0) { /* a full disk, a quota, an I/O error: the report is not lost without a word */
        gr_warn_once(w_log_write, "cannot write to GPURECLAIM_LOG=%s: %s; reports that cannot be written there "
                                  "go to stderr", log, strerror(-rc));
        jb_write_fd(b, STDERR_FILENO);
      }
    } else {
      const char *why = errno == ENXIO ? "a FIFO nobody reads" : strerror(errno);
      gr_warn_once(w_log, "cannot open GPURECLAIM_LOG=%s: %s; reports go to stderr", log, why);
      jb_write_fd(b, STDERR_FILENO);
    }
  } else if (gr_opt()->log_stderr) { /* asked for: GPURECLAIM_LOG=stderr */
    jb_write_fd(b, STDERR_FILENO);
  } /* else quiet: nothing on the program's stderr unless asked */
}

void gr_report_release(const gpureclaim_report_t *r) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "event", "release");
  jb_i64(&b, "pid", getpid());
  jb_key(&b, "report");
  gr_report_release_json(&b, r);
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  gr_report_event(&b);
  gr_log_release(r);
  jb_free(&b);
}

/* ---- one line for people ---- */

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
          gr_log_bytes(r->cached_bytes, cached, sizeof cached),
          gr_log_bytes(r->orphaned_bytes, orphaned, sizeof orphaned),
          (unsigned long long)r->orphaned_blocks, gr_plural(r->orphaned_blocks),
          r->trigger >= 0 && (size_t)r->trigger < GR_ARRAY_LEN(by) ? by[r->trigger] : by[0], peer);
}
