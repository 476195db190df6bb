/*
 * give.c -- serving a peer's "give" request (peer reclaim, peer.c): another gpureclaim process of the same user
 * is out of memory on a GPU this one uses and asks, over the control socket, for up to so many bytes before a
 * deadline. The release engine gives what it can, cheapest first (gr_release_give, trigger `peer`); an idle
 * process that opted in may then sleep (GPURECLAIM_PEERS sleep). Format: docs/PROTOCOL.md.
 */
#include "real.h"
#include "release.h"
#include "give.h"
#include "peer.h"
#include "sleep.h"
#include "wait.h"
#include "report.h"
#include "gate.h"
#include "json.h"
#include "options.h"
#include "registry.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* "key=value" at *p (one of the request's fields); advances past it and one space. */
static bool field(const char **p, const char *key, char *val, size_t cap) {
  size_t k = strlen(key);
  if (strncmp(*p, key, k) != 0 || (*p)[k] != '=')
    return false;
  const char *v = *p + k + 1, *end = strchr(v, ' ');
  size_t n = end ? (size_t)(end - v) : strlen(v);
  if (n == 0 || n >= cap)
    return false;
  memcpy(val, v, n);
  val[n] = '\0';
  *p = end ? end + 1 : v + n;
  return true;
}

static bool uuid_ok(const char *u) {
  if (strncmp(u, "GPU-", 4) != 0 && strncmp(u, "MIG-", 4) != 0)
    return false;
  for (const char *c = u + 4; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || *c == '-'))
      return false;
  return strlen(u) > 4;
}

static void error_answer(jbuf_t *b, const char *why) {
  jb_bool(b, "ok", false);
  jb_str(b, "error", why);
}

void gr_give_serve(const char *args, int pid, jbuf_t *b) {
  /* give bytes=N uuid=GPU-... deadline_ms=N pid=N [sleep=1 [above=1]]: every field, in this order, nothing else.
   * sleep=1: if what the caches give falls short, sleep (GPURECLAIM_PEERS names sleep, and this process is
   * idle). above=1: the asker is above its guarantee; a process within its own then does not sleep for it. */
  char vbytes[24], uuid[48], vdeadline[24], vpid[16], vsleep[4] = "", vabove[4] = "";
  unsigned long long bytes = 0, deadline = 0, asker = 0;
  const char *p = args;
  if (!field(&p, "bytes", vbytes, sizeof vbytes) || !field(&p, "uuid", uuid, sizeof uuid) ||
      !field(&p, "deadline_ms", vdeadline, sizeof vdeadline) || !field(&p, "pid", vpid, sizeof vpid) ||
      (*p && (!field(&p, "sleep", vsleep, sizeof vsleep) || strcmp(vsleep, "1") != 0)) ||
      (*p && (!field(&p, "above", vabove, sizeof vabove) || strcmp(vabove, "1") != 0)) || *p || p[-1] == ' ' ||
      gr_opt_parse_uint(vbytes, UINT64_MAX >> 1, &bytes) != 0 || bytes == 0 || !uuid_ok(uuid) ||
      gr_opt_parse_uint(vdeadline, UINT64_MAX >> 1, &deadline) != 0 ||
      gr_opt_parse_uint(vpid, 0x7fffffff, &asker) != 0 || asker == 0) {
    error_answer(b, "malformed give request (expected: give bytes=N uuid=GPU-... deadline_ms=N pid=N [sleep=1 "
                    "[above=1]])");
    return;
  }
  if ((int)asker != pid) {
    error_answer(b, "the pid in the request is not the connection's");
    return;
  }
  if (!gr_peer_on(GR_PEERS_GIVE)) {
    error_answer(b, "this process does not give to peers (GPURECLAIM_PEERS)");
    return;
  }
  uint64_t now = gr_mono_ns() / 1000000;
  if (deadline <= now) {
    error_answer(b, "the request's deadline has passed");
    return;
  }
  uint64_t mask = 0;
  int count = 0;
  /* Asleep, the driver is not asked (the device holds nothing of this process then: nothing to give). Nor is a
   * device without a context of ours: nothing of ours is there (an asker short of memory asks every peer, also
   * those whose status file does not list its GPU: they answer on_gpu false at once). */
  if (!gr_gate_driver_off() && gr_drv.cuDeviceGetCount && gr_drv.cuDeviceGetCount(&count) == CUDA_SUCCESS)
    for (int d = 0; d < count && d < 64; d++) {
      char u[64];
      if (gr_reg_ctx_on_device(d) && gr_report_gpu_uuid(d, u, sizeof u) && !strcmp(u, uuid))
        mask |= 1ull << d;
    }
  gpureclaim_report_t rep;
  memset(&rep, 0, sizeof rep);
  uint64_t slept = 0;
  if (mask) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    uint64_t left = deadline - now;
    dl.tv_sec += (time_t)(left / 1000);
    dl.tv_nsec += (long)(left % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000L;
    }
    /* No framework cache while a thread of ours handles an out-of-memory or waits for memory: it may hold the
     * GIL the framework's release needs, and it waits for peers, maybe for the one asking us. */
    gr_release_give(bytes, mask, pid, !gr_peer_busy() && !gr_wait_active(), &dl, &rep);
    /* Short after the caches: an idle process that opted in sleeps (its whole device memory goes to the host),
     * within what is left of the asker's deadline for the lock on calls in flight. */
    uint64_t gave = rep.cached_bytes + rep.orphaned_bytes + rep.all_bytes;
    /* A process within its guarantee (GPURECLAIM_GUARANTEE) on the GPU of the request does not sleep for an
     * asker above its own: the guarantee is what it keeps against those who burst (it still gave its caches). */
    bool keep = false;
    for (int d = 0; d < 64 && vabove[0]; d++)
      if (((mask >> d) & 1) && gr_wait_within_guarantee(d, 0))
        keep = true;
    if (keep && vsleep[0] && gave < bytes)
      gr_info("a peer (pid %d) above its guarantee is short of memory on %s: this process is within its own "
              "guarantee and does not sleep for it", pid, uuid);
    if (vsleep[0] && !keep && gave < bytes && gr_peer_on(GR_PEERS_SLEEP) && !gr_peer_busy() &&
        gr_sleep_idle_for_peer()) {
      uint64_t t = gr_mono_ns() / 1000000;
      gpureclaim_sleep_report_t sr = {.size = sizeof sr};
      gr_info("a peer (pid %d) is short of memory on %s and this process is idle: going to sleep", pid, uuid);
      if (deadline > t && gr_sleep_run(GPURECLAIM_TRIGGER_PEER, (unsigned)(deadline - t), &sr) == 0)
        slept = sr.device_freed_bytes;
    }
    if (slept) /* (what the caches gave, gr_release_give noted before its report rewrote the status file) */
      gr_release_note_give();
  }
  jb_bool(b, "ok", true);
  jb_i64(b, "pid", getpid());
  jb_bool(b, "on_gpu", mask != 0);
  jb_key(b, "given");
  jb_obj(b);
  jb_u64(b, "orphaned_bytes", rep.orphaned_bytes);
  jb_u64(b, "pool_bytes", rep.pool_bytes);
  jb_u64(b, "framework_bytes", rep.framework_bytes);
  jb_u64(b, "releaser_bytes", rep.releaser_bytes);
  jb_u64(b, "all_bytes", rep.all_bytes);
  jb_u64(b, "slept_bytes", slept);
  jb_u64(b, "total_bytes", rep.cached_bytes + rep.orphaned_bytes + rep.all_bytes + slept);
  jb_obj_end(b);
  if (mask) {
    jb_key(b, "report");
    gr_report_release_json(b, &rep);
  }
}
