/*
 * sleep.c -- sleep and wake: an idle process gives back all of its device memory and gets it back transparently.
 *
 * Sleep (gpureclaim_sleep, the `sleep` request of the control socket, GPURECLAIM_ON_SIGNAL=sleep, the idle
 * watch), on the thread that asked (the worker for the command, the signal and the idle watch):
 *   1. a release of cached,orphaned (release.c), so that only memory in use has to move;
 *   2. what must move (the tracked device memory left, per device) against the host's MemAvailable: refused
 *      when it would not fit, because the driver keeps the checkpoint in this process's own memory;
 *   3. every context synchronised (work in flight finishes);
 *   4. the gates' flag goes up (gate.h, through admit.c): from now on every call a gate sees waits here instead of
 *      entering the driver; releases already running on other threads are waited for, new ones refused; calls
 *      that passed their gate before are waited for too (gr_gate_quiesce), up to the timeout (a thread inside a
 *      CUDA call that does not return in time: refused, saying so), so that none reaches the driver locked;
 *   5. cuCheckpointProcessLock on our own pid with what is left of the timeout; a sleep whose asker stopped
 *      waiting meanwhile (a command's client that hung
 *      up) is withdrawn here, unlocked again; then cuCheckpointProcessCheckpoint: the driver moves the process's
 *      device memory, contexts included, to host memory. From that call on the sleep is begun.
 * The free memory of each device the process used is read through NVML before and after (a checkpointed
 * process has no context to ask cuMemGetInfo with): what the device gained is what a restore needs back.
 *
 * Wake (gpureclaim_wake, the `wake` request, or a gate: the first CUDA call of any thread), on the thread that
 * asked: waits up to GPURECLAIM_WAKE_TIMEOUT for every device to have room for what it gave (NVML), in the
 * short GPU's queue of waiters (wait.c) when other gpureclaim processes share it, asking them for the shortfall
 * at its turn (peer reclaim), and only then calls cuCheckpointProcessRestore and Unlock: a restore is never called when it could fail for lack of
 * memory. Without room the process stays asleep and intact, the waiting calls return CUDA_ERROR_OUT_OF_MEMORY,
 * and the next call tries again. One wake at a time; other callers wait for its outcome. A process that woke
 * less than GPURECLAIM_SLEEP_MIN_AWAKE seconds ago, or one a thread of which waits for memory, is not idle for
 * a peer's sleep request nor for the idle watch.
 *
 * States: AWAKE -> ENTERING (steps 1-5; calls pass until step 4) -> ASLEEP -> WAKING -> AWAKE. A refused sleep
 * goes back to AWAKE, a wake without room back to ASLEEP.
 */
#include "sleep.h"
#include "real.h"
#include "registry.h"
#include "stats.h"
#include "admit.h"
#include "capture.h"
#include "release.h"
#include "peer.h"
#include "wait.h"
#include "report.h"
#include "gate.h"
#include "json.h"
#include "options.h"
#include "state.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ST_AWAKE = 0, ST_ENTERING, ST_ASLEEP, ST_WAKING };

#define DEFAULT_LOCK_TIMEOUT_MS 10000u

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_state;              /* ST_*, under g_mu */
static _Atomic int g_state_pub;  /* the same, for lock-free readers (reports) */
static _Atomic uint64_t g_host_bytes;
static uint64_t g_attempt, g_failed_attempt; /* wakes begun; the last one that found no room */
static uint64_t g_need[GR_MAX_DEV];          /* per device: what a restore needs back */
static char g_uuid[GR_MAX_DEV][64];
static int g_ndev_used;
static _Atomic uint64_t g_sleeps, g_wakes;
static _Atomic uint64_t g_idle_since_ms; /* idle watch: when the probe was armed */
static _Atomic uint64_t g_idle_since_wall_ms; /* the same moment by the wall clock, for the status file */
static _Atomic uint64_t g_idle_shown;        /* the idle_since_ms the status file shows (0: null) */
static _Atomic uint64_t g_woke_ms;       /* gr_state_now_ms() of the last wake: GPURECLAIM_SLEEP_MIN_AWAKE */
static _Atomic int g_ipc_exported;       /* cuIpcGetMemHandle succeeded once */
static _Atomic long g_ipc_opened;        /* other processes' memory mapped now */

void gr_sleep_note_ipc(int exported, int opened) {
  if (exported)
    atomic_store_explicit(&g_ipc_exported, 1, memory_order_relaxed);
  if (opened)
    atomic_fetch_add_explicit(&g_ipc_opened, opened, memory_order_relaxed);
}

static void set_state(int st) {
  g_state = st;
  atomic_store_explicit(&g_state_pub, st, memory_order_release);
  pthread_cond_broadcast(&g_cv);
}


/* ---- the driver's checkpoint API and NVML ---- */

typedef CUresult (*ck_lock_t)(int, CUcheckpointLockArgs *);
typedef CUresult (*ck_ckpt_t)(int, CUcheckpointCheckpointArgs *);
typedef CUresult (*ck_restore_t)(int, CUcheckpointRestoreArgs *);
typedef CUresult (*ck_unlock_t)(int, CUcheckpointUnlockArgs *);
typedef struct {
  unsigned long long total, free, used;
} nvml_memory_t;

static struct {
  ck_lock_t lock;
  ck_ckpt_t checkpoint;
  ck_restore_t restore;
  ck_unlock_t unlock;
  int (*nvml_init)(void);
  int (*nvml_by_uuid)(const char *, void **);
  int (*nvml_memory)(void *, nvml_memory_t *);
  bool nvml_ok;
  char nvml_why[160]; /* why not, when !nvml_ok */
} A;
static pthread_once_t g_resolve_once = PTHREAD_ONCE_INIT;

static void resolve(void) {
  *(void **)&A.lock = gr_real_driver("cuCheckpointProcessLock");
  *(void **)&A.checkpoint = gr_real_driver("cuCheckpointProcessCheckpoint");
  *(void **)&A.restore = gr_real_driver("cuCheckpointProcessRestore");
  *(void **)&A.unlock = gr_real_driver("cuCheckpointProcessUnlock");
  /* A private copy of NVML, in a link-map namespace of its own: the process's own NVML blocks from the driver's
   * lock to its unlock, so through the whole sleep (observed on driver 580, docs/DRIVER.md), and the reads after
   * the checkpoint and before a restore would never return. The copy shares nothing with it and answers. */
  void *h = dlmopen(LM_ID_NEWLM, "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(A.nvml_why, sizeof A.nvml_why, "%s", e ? e : "not found");
    return;
  }
  *(void **)&A.nvml_init = gr_real_libc()->dlsym(h, "nvmlInit_v2");
  *(void **)&A.nvml_by_uuid = gr_real_libc()->dlsym(h, "nvmlDeviceGetHandleByUUID");
  *(void **)&A.nvml_memory = gr_real_libc()->dlsym(h, "nvmlDeviceGetMemoryInfo");
  int rc = -1;
  if (A.nvml_init && A.nvml_by_uuid && A.nvml_memory)
    rc = A.nvml_init();
  A.nvml_ok = rc == 0;
  if (!A.nvml_ok)
    snprintf(A.nvml_why, sizeof A.nvml_why, rc < 0 ? "it lacks nvmlInit_v2, nvmlDeviceGetHandleByUUID or "
                                                     "nvmlDeviceGetMemoryInfo" : "nvmlInit_v2 failed with %d", rc);
}

/* Free memory of the device with that UUID, by NVML; false when unknown. */
static bool dev_free(const char *uuid, uint64_t *out) {
  void *dev = NULL;
  nvml_memory_t m;
  if (!A.nvml_ok || A.nvml_by_uuid(uuid, &dev) != 0 || A.nvml_memory(dev, &m) != 0)
    return false;
  *out = m.free;
  return true;
}

static const char *err_name(CUresult rc, char *buf, size_t len) {
  const char *s = NULL;
  if (gr_drv.cuGetErrorName && gr_drv.cuGetErrorName(rc, &s) == CUDA_SUCCESS && s)
    return s;
  snprintf(buf, len, "error %d", (int)rc);
  return buf;
}

static uint64_t mem_available(void) {
  char buf[4096];
  int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return UINT64_MAX;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = '\0';
  const char *p = strstr(buf, "MemAvailable:");
  return p ? strtoull(p + 13, NULL, 10) * 1024 : UINT64_MAX;
}

static void sync_ctx(uint16_t id, CUcontext ctx, int device, void *arg) {
  (void)id;
  (void)device;
  (void)arg;
  CUcontext popped;
  if (gr_drv.cuCtxPushCurrent && gr_drv.cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {
    if (gr_drv.cuCtxSynchronize)
      gr_drv.cuCtxSynchronize();
    gr_drv.cuCtxPopCurrent(&popped);
  }
}

/* ---- reports ---- */

static void copy_out(gpureclaim_sleep_report_t *out, const gpureclaim_sleep_report_t *r) {
  if (!out)
    return;
  size_t n = out->size < sizeof *r ? out->size : sizeof *r;
  memcpy(out, r, n);
  out->size = n;
}

void gr_sleep_report_json(jbuf_t *b, const gpureclaim_sleep_report_t *r) {
  jb_obj(b);
  jb_bool(b, "slept", r->slept);
  jb_str(b, "trigger", gr_trigger_name(r->trigger));
  jb_u64(b, "released_bytes", r->released_bytes);
  jb_u64(b, "moved_bytes", r->moved_bytes);
  jb_u64(b, "left_bytes", r->left_bytes);
  jb_u64(b, "host_available_bytes", r->host_available_bytes);
  jb_u64(b, "device_freed_bytes", r->device_freed_bytes);
  jb_f64(b, "ms", (double)r->duration_ns / 1e6);
  jb_str(b, "reason", r->reason[0] ? r->reason : NULL);
  jb_obj_end(b);
}

static const char *state_name(int st) {
  return gr_sleep_state_name(st == ST_ASLEEP   ? GPURECLAIM_STATE_SLEEPING
                             : st == ST_WAKING ? GPURECLAIM_STATE_WAKING
                                               : GPURECLAIM_STATE_AWAKE);
}

void gr_sleep_json(jbuf_t *b) {
  jb_key(b, "sleep");
  jb_obj(b);
  jb_str(b, "state", state_name(atomic_load_explicit(&g_state_pub, memory_order_acquire)));
  jb_u64(b, "host_bytes", atomic_load_explicit(&g_host_bytes, memory_order_relaxed));
  jb_u64(b, "sleeps", atomic_load_explicit(&g_sleeps, memory_order_relaxed));
  jb_u64(b, "wakes", atomic_load_explicit(&g_wakes, memory_order_relaxed));
  jb_bool(b, "available", gr_gate_enabled());
  /* Idle since (wall-clock ms): no CUDA call seen for a second or more since then; null while it works (or
   * waits for memory). A peer short after every cache asks the idle ones to sleep least recently used first. */
  uint64_t idle = gr_sleep_idle_since_wall_ms();
  if (idle)
    jb_u64(b, "idle_since_ms", idle);
  else
    jb_null(b, "idle_since_ms");
  jb_obj_end(b);
}

static void log_event(const char *event, const gpureclaim_sleep_report_t *r, uint64_t bytes, double ms,
                      const char *why) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "event", event);
  jb_i64(&b, "pid", getpid());
  if (r) {
    jb_key(&b, "report");
    gr_sleep_report_json(&b, r);
  } else {
    jb_u64(&b, "bytes", bytes);
    jb_f64(&b, "ms", ms);
    jb_str(&b, "reason", why);
  }
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  gr_report_event(&b);
  jb_free(&b);
  if (gr_opt()->status)
    gr_report_status_update();
}

/* ---- sleep ---- */

/* Goes back to AWAKE after a refused sleep (the flag down first: calls waiting at gates go on). */
static int refuse(gpureclaim_sleep_report_t *out, gpureclaim_sleep_report_t *r, uint64_t t0, int rc,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int refuse(gpureclaim_sleep_report_t *out, gpureclaim_sleep_report_t *r, uint64_t t0, int rc,
                  const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->reason, sizeof r->reason, fmt, ap);
  va_end(ap);
  r->slept = 0;
  r->duration_ns = gr_mono_ns() - t0;
  atomic_store_explicit(&gr_gate_flag, GR_GATE_AWAKE, memory_order_release);
  pthread_mutex_lock(&g_mu);
  set_state(ST_AWAKE);
  pthread_mutex_unlock(&g_mu);
  gr_info("sleep refused: %s", r->reason);
  log_event("sleep", r, 0, 0, NULL);
  copy_out(out, r);
  return rc;
}

int gr_sleep_run(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out) {
  return gr_sleep_run_progress(trigger, timeout_ms, out, NULL, NULL, NULL);
}

int gr_sleep_run_progress(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out,
                          gr_sleep_progress_fn progress, gr_sleep_wanted_fn wanted, void *arg) {
  gpureclaim_sleep_report_t r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  r.trigger = trigger;
  uint64_t t0 = gr_mono_ns();
  pthread_mutex_lock(&g_mu);
  while (g_state == ST_ENTERING || g_state == ST_WAKING)
    pthread_cond_wait(&g_cv, &g_mu);
  if (g_state == ST_ASLEEP) {
    pthread_mutex_unlock(&g_mu);
    r.slept = 1;
    r.moved_bytes = atomic_load_explicit(&g_host_bytes, memory_order_relaxed);
    snprintf(r.reason, sizeof r.reason, "already asleep");
    copy_out(out, &r);
    return -EALREADY;
  }
  set_state(ST_ENTERING);
  pthread_mutex_unlock(&g_mu);
  pthread_once(&g_resolve_once, resolve);

  int rc = 0;
  /* 1. the release: only memory in use has to move */
  if (progress)
    progress("release", 0, 0, arg);
  gpureclaim_report_t rel = {.size = sizeof rel};
  if (gr_release_run(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, trigger == GPURECLAIM_TRIGGER_IDLE ?
                 GPURECLAIM_TRIGGER_API : trigger, &rel) == 0)
    r.released_bytes = rel.cached_bytes + rel.orphaned_bytes;

  /* what is left on each device */
  uint64_t need[GR_MAX_DEV] = {0}, total = 0;
  int ndev = 0;
  for (int d = 0; d < GR_MAX_DEV; d++) {
    gpureclaim_stats_t s = {.size = sizeof s};
    if (gr_stats_get(d, &s) != 0)
      continue;
    uint64_t n = s.live_bytes - s.pool_used_bytes + s.pool_reserved_bytes;
    if (s.live_bytes < s.pool_used_bytes)
      n = s.pool_reserved_bytes;
    if (n || s.contexts) {
      need[d] = n;
      total += n;
      ndev = d + 1;
    }
  }
  r.left_bytes = total;

  if (!gr_gate_enabled())
    return refuse(out, &r, t0, -ENOTSUP, "GPURECLAIM_SLEEP=0 (or auto without the checkpoint API): "
                                     "no gates, so a sleeping process could not wake on its next call");
  if (!A.lock || !A.checkpoint || !A.restore || !A.unlock)
    return refuse(out, &r, t0, -ENOTSUP, "the driver has no checkpoint API (driver 570 or later, "
                                     "on x86-64); the release's memory stays given back");
  CUstream capturing = NULL;
  if (gr_capture_running(&capturing))
    return refuse(out, &r, t0, -EBUSY, "a CUDA graph is being captured (stream %p, cuStreamBeginCapture): a capture "
                                       "cannot be checkpointed; sleep once it ends (cuStreamEndCapture); the "
                                       "release's memory stays given back", (void *)capturing);
  if (atomic_load_explicit(&g_ipc_exported, memory_order_relaxed))
    return refuse(out, &r, t0, -EBUSY, "the process exported device memory over IPC (cuIpcGetMemHandle): another "
                                       "process may have it mapped; the release's memory stays given back");
  if (atomic_load_explicit(&g_ipc_opened, memory_order_relaxed) > 0)
    return refuse(out, &r, t0, -EBUSY, "the process has another process's device memory open over IPC "
                                       "(cuIpcOpenMemHandle); the release's memory stays given back");
  char uuid[GR_MAX_DEV][64];
  memset(uuid, 0, sizeof uuid);
  uint64_t free0[GR_MAX_DEV] = {0};
  for (int d = 0; d < ndev; d++) {
    uuid[d][0] = '\0';
    if (!need[d] && !gr_reg_primary_id(d))
      continue;
    if (!A.nvml_ok)
      return refuse(out, &r, t0, -ENOTSUP, "no private NVML to check the device's room before a wake "
                                       "(dlmopen of libnvidia-ml.so.1: %s)", A.nvml_why);
    if (!gr_report_gpu_uuid(d, uuid[d], sizeof uuid[d]) || !dev_free(uuid[d], &free0[d]))
      return refuse(out, &r, t0, -ENOTSUP, "cannot read device %d's free memory through NVML "
                                       "(libnvidia-ml.so.1), which a wake needs to check room before a restore", d);
  }

  /* 2. room on the host */
  r.host_available_bytes = mem_available();
  if (total > r.host_available_bytes) {
    char a[32], b[32];
    return refuse(out, &r, t0, -ENOSPC, "the host has %s available, %s would have to move",
                                     gr_log_bytes(r.host_available_bytes, a, sizeof a),
                                     gr_log_bytes(total, b, sizeof b));
  }

  /* 3. work in flight finishes */
  gr_reg_foreach_ctx(sync_ctx, NULL);

  /* 4. gates closed; releases that call the driver are waited for, and so are the calls that passed their gate
   * before it closed (gate.h): one that reached the driver only after the lock would wait there for an unlock
   * that nothing makes. */
  gr_admit_close();
  if (progress) /* the wait for calls in flight is the first part of the moving (a client may hang up there) */
    progress("moving", 0, total, arg);
  unsigned lock_ms = timeout_ms ? timeout_ms : DEFAULT_LOCK_TIMEOUT_MS;
  uint64_t tq = gr_mono_ns();
  int busy_tid = 0;
  int q = gr_gate_quiesce(lock_ms, &busy_tid);
  if (q == -EBUSY)
    return refuse(out, &r, t0, -EBUSY, "a thread is inside a CUDA call that did not return within %.1f s (thread "
                                       "%d); sleep once it returned", lock_ms / 1000.0, busy_tid);
  if (q == -ENOMEM)
    return refuse(out, &r, t0, -ENOMEM, "a thread runs without a record of its CUDA calls (there was no memory "
                                        "for one), so a call of its could reach the driver after the lock; "
                                        "restart the process to sleep it");
  if (q != 0)
    return refuse(out, &r, t0, -ENOTSUP, "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after it was "
                                         "registered: the calls in flight cannot be told");
  uint64_t waited_ms = (gr_mono_ns() - tq) / 1000000u;

  /* 5. lock and checkpoint (the driver moves everything in one call: no progress inside it) */
  CUcheckpointLockArgs la;
  memset(&la, 0, sizeof la);
  la.timeoutMs = waited_ms + 1 < lock_ms ? lock_ms - (unsigned)waited_ms : 1;
  char eb[32];
  CUresult cr = A.lock(getpid(), &la);
  if (cr == CUDA_ERROR_NOT_READY || cr == CUDA_ERROR_TIMEOUT)
    return refuse(out, &r, t0, -EBUSY, "a thread is inside a CUDA call that did not return within "
                                     "%.1f s", lock_ms / 1000.0);
  if (cr != CUDA_SUCCESS)
    return refuse(out, &r, t0, -ENOTSUP, "the driver refused to lock the process: %s",
                                     err_name(cr, eb, sizeof eb));
  /* The point of no return: whoever asked must still be waiting (a command that hung up while the release, the
   * synchronisation or the lock took their time was told nothing would happen, or has gone). */
  if (wanted && !wanted(arg)) {
    A.unlock(getpid(), NULL);
    return refuse(out, &r, t0, -ECANCELED, "withdrawn: whoever asked for it hung up before the sleep began; the "
                                           "release's memory stays given back");
  }
  cr = A.checkpoint(getpid(), NULL);
  if (cr != CUDA_SUCCESS) {
    A.unlock(getpid(), NULL);
    return refuse(out, &r, t0, -ENOTSUP, "the driver refused the checkpoint: %s (MIG, managed "
                                     "memory, memory shared over IPC or a graph being captured can cause it); "
                                     "the release's memory stays given back", err_name(cr, eb, sizeof eb));
  }
  uint64_t freed = 0;
  for (int d = 0; d < ndev; d++) {
    uint64_t f1 = 0;
    uint64_t gained = uuid[d][0] && dev_free(uuid[d], &f1) && f1 > free0[d] ? f1 - free0[d] : 0;
    freed += gained;
    need[d] = gained > need[d] ? gained : need[d];
  }
  pthread_mutex_lock(&g_mu);
  memcpy(g_need, need, sizeof g_need);
  memcpy(g_uuid, uuid, sizeof g_uuid);
  g_ndev_used = ndev;
  atomic_store_explicit(&g_host_bytes, total, memory_order_relaxed);
  set_state(ST_ASLEEP);
  pthread_mutex_unlock(&g_mu);
  atomic_fetch_add_explicit(&g_sleeps, 1, memory_order_relaxed);
  if (progress)
    progress("moved", total, total, arg);
  r.slept = 1;
  r.moved_bytes = total;
  r.left_bytes = 0;
  r.device_freed_bytes = freed;
  r.duration_ns = gr_mono_ns() - t0;
  char mb[32];
  gr_info("asleep: %s moved to host memory in %.1f ms (%s released first)", gr_log_bytes(total, mb, sizeof mb),
          (double)r.duration_ns / 1e6, gr_log_bytes(r.released_bytes, eb, sizeof eb));
  log_event("sleep", &r, 0, 0, NULL);
  copy_out(out, &r);
  return rc;
}

/* ---- wake ---- */

/* Whether every device has room for what it gave. */
static bool room(const uint64_t *need, char uuid[][64], int ndev, int *short_dev) {
  for (int d = 0; d < ndev; d++) {
    uint64_t f = 0;
    if (!need[d])
      continue;
    if (!dev_free(uuid[d], &f) || f < need[d]) {
      *short_dev = d;
      return false;
    }
  }
  return true;
}

int gr_sleep_wake(int trigger) {
  pthread_mutex_lock(&g_mu);
  uint64_t seen = 0; /* a wake attempt this call waited for, 0 for none */
  for (;;) {
    if (g_state == ST_AWAKE) {
      pthread_mutex_unlock(&g_mu);
      return 0;
    }
    if (g_state == ST_ASLEEP)
      break;
    if (g_state == ST_WAKING) {
      seen = g_attempt; /* the attempt under way: its outcome is ours */
    }
    pthread_cond_wait(&g_cv, &g_mu);
    if (g_state == ST_ASLEEP && seen && g_failed_attempt >= seen) {
      pthread_mutex_unlock(&g_mu);
      return -ENOMEM; /* the wake we waited for found no room: this call fails too, the next one tries again */
    }
  }
  uint64_t attempt = ++g_attempt;
  set_state(ST_WAKING);
  uint64_t need[GR_MAX_DEV];
  char uuid[GR_MAX_DEV][64];
  memcpy(need, g_need, sizeof need);
  memcpy(uuid, g_uuid, sizeof uuid);
  int ndev = g_ndev_used;
  pthread_mutex_unlock(&g_mu);

  /* The bound: GPURECLAIM_WAKE_TIMEOUT; in the GPU's queue, GPURECLAIM_WAIT when longer, as for an allocation */
  unsigned bound_s = gr_opt()->wake_timeout > gr_opt()->wait ? gr_opt()->wake_timeout : gr_opt()->wait;
  uint64_t t0 = gr_mono_ns(), deadline = t0 + (uint64_t)gr_opt()->wake_timeout * 1000000000u, now;
  int short_dev = -1;
  bool ok;
  bool asked[GR_MAX_DEV] = {false};
  gr_wait_t w;
  int queued = 0;        /* 1: in the GPU's queue of waiters (wait.c) */
  uint64_t next_join = 0; /* when to try to join it again: every second while not in it */
  for (;;) {
    ok = room(need, uuid, ndev, &short_dev);
    /* Room, but others wait in the GPU's queue (for memory a peer just gave up, maybe by sleeping for them):
     * the wake queues behind them rather than take it first. At the head of the queue, room is enough. */
    for (int d = 0; ok && queued != 1 && d < ndev; d++)
      if (need[d] && gr_wait_queue_busy(uuid[d]))
        ok = false, short_dev = d;
    if (ok || (now = gr_mono_ns()) >= deadline)
      break;
    /* Short on a GPU: the wake joins the GPU's queue of waiters, as an allocation that found no memory does
     * (wait.c: first come, first served, within their guarantee first); at its turn it looks for room again,
     * and asks the other gpureclaim processes of the GPU for the shortfall every GR_WAIT_ASK_MS (peer reclaim,
     * GPURECLAIM_PEERS, bounded by GPURECLAIM_PEER_TIMEOUT), until GPURECLAIM_WAKE_TIMEOUT, or GPURECLAIM_WAIT
     * when longer. Not in the queue (no other process held memory there a moment ago: they may be waking
     * themselves), it tries again every second. */
    if (queued != 1 && now >= next_join) {
      next_join = now + 1000000000ull;
      if ((queued = gr_wait_begin(&w, need[short_dev], short_dev, uuid[short_dev], GR_WAIT_WAKE,
                                  (uint64_t)bound_s * 1000 - (now - t0) / 1000000)) == 1)
        deadline = t0 + (uint64_t)bound_s * 1000000000u;
    }
    bool ask = false;
    if (queued == 1) {
      if (!gr_wait_turn(&w)) {
        gr_wait_end(&w, false);
        queued = 0;
        continue;
      }
      ask = gr_wait_ask_due(&w);
    } else {
      ask = !asked[short_dev]; /* no queue (nobody else on the GPU, GPURECLAIM_WAIT=0): asked once */
    }
    uint64_t f = 0;
    gr_peer_op_t op;
    if (ask && dev_free(uuid[short_dev], &f) && f < need[short_dev] &&
        gr_peer_begin(&op, need[short_dev] - f, short_dev)) {
      asked[short_dev] = true;
      if (!op.waited) /* another peer reclaim of this GPU ran meanwhile: look at the room first */
        gr_peer_ask(&op);
      int again = -1;
      gr_peer_end(&op, room(need, uuid, ndev, &again));
      continue;
    }
    asked[short_dev] = true;
    if (queued != 1)
      nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  CUresult cr = CUDA_SUCCESS;
  if (ok) {
    cr = A.restore(getpid(), NULL);
    if (cr == CUDA_SUCCESS)
      cr = A.unlock(getpid(), NULL);
  }
  /* Out of the queue only now: at its head until the restore took the room, so that the next waiter does not
   * take the same room meanwhile (the driver then refused the restore for lack of memory) */
  if (queued == 1)
    gr_wait_end(&w, ok && cr == CUDA_SUCCESS);
  uint64_t host = atomic_load_explicit(&g_host_bytes, memory_order_relaxed);
  double ms = (double)(gr_mono_ns() - t0) / 1e6;
  if (!ok || cr != CUDA_SUCCESS) {
    char why[160], eb[32], nb[32];
    if (!ok)
      snprintf(why, sizeof why, "no room on device %d for %s within %.0f s: the process stays asleep", short_dev,
               gr_log_bytes(need[short_dev], nb, sizeof nb), (double)(gr_mono_ns() - t0) / 1e9);
    else
      snprintf(why, sizeof why, "the driver refused the restore: %s", err_name(cr, eb, sizeof eb));
    pthread_mutex_lock(&g_mu);
    g_failed_attempt = attempt;
    set_state(ST_ASLEEP);
    pthread_mutex_unlock(&g_mu);
    gr_warn("wake failed: %s", why);
    log_event("wake-failed", NULL, host, ms, why);
    return ok ? -EIO : -ENOMEM;
  }
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  pthread_mutex_lock(&g_mu);
  atomic_store_explicit(&g_host_bytes, 0, memory_order_relaxed);
  set_state(ST_AWAKE);
  pthread_mutex_unlock(&g_mu);
  atomic_fetch_add_explicit(&g_wakes, 1, memory_order_relaxed);
  atomic_store_explicit(&g_idle_since_ms, 0, memory_order_relaxed);
  atomic_store_explicit(&g_woke_ms, gr_state_now_ms() | 1, memory_order_relaxed);
  char hb[32];
  static const char *const by[] = {"?", "the API", "the signal", "?", "the gpureclaim command", "?", "?",
                                   "a CUDA call"};
  gr_info("awake: %s back on the device in %.1f ms, woken by %s", gr_log_bytes(host, hb, sizeof hb), ms,
          trigger >= 0 && (size_t)trigger < GR_ARRAY_LEN(by) ? by[trigger] : "?");
  log_event("wake", NULL, host, ms, NULL);
  return 0;
}

/* ---- what others ask ---- */

CUresult gr_sleep_gate_slow(void) {
  unsigned char f = atomic_load_explicit(&gr_gate_flag, memory_order_acquire);
  if (f == GR_GATE_AWAKE)
    return CUDA_SUCCESS;
  if (f == GR_GATE_PROBE) { /* the idle watch: a call happened */
    unsigned char p = GR_GATE_PROBE;
    atomic_compare_exchange_strong(&gr_gate_flag, &p, GR_GATE_AWAKE);
    atomic_store_explicit(&g_idle_since_ms, 0, memory_order_relaxed);
    return CUDA_SUCCESS;
  }
  int saved = errno;
  int rc = gr_sleep_wake(GPURECLAIM_TRIGGER_CALL);
  errno = saved;
  return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

int gr_sleep_state_now(uint64_t *host_bytes) {
  if (host_bytes)
    *host_bytes = atomic_load_explicit(&g_host_bytes, memory_order_relaxed);
  int st = atomic_load_explicit(&g_state_pub, memory_order_acquire);
  return st == ST_ASLEEP ? GPURECLAIM_STATE_SLEEPING : st == ST_WAKING ? GPURECLAIM_STATE_WAKING
                                                                       : GPURECLAIM_STATE_AWAKE;
}

/* GPURECLAIM_SLEEP_MIN_AWAKE: whether the process woke less than that long ago (a peer's or the idle watch's
 * sleep is then not honoured, so that two processes cannot take the device from each other in turn). */
static bool just_woke(void) {
  uint64_t woke = atomic_load_explicit(&g_woke_ms, memory_order_relaxed);
  return woke && gr_state_now_ms() - woke < (uint64_t)gr_opt()->sleep_min_awake * 1000;
}

uint64_t gr_sleep_idle_since_wall_ms(void) {
  if (!gr_gate_enabled() || atomic_load_explicit(&g_state_pub, memory_order_acquire) != ST_AWAKE ||
      atomic_load(&gr_gate_flag) != GR_GATE_PROBE || gr_wait_active())
    return 0;
  uint64_t since = atomic_load_explicit(&g_idle_since_ms, memory_order_relaxed), now = gr_state_now_ms();
  if (!since || now < since || now - since < 1000)
    return 0;
  uint64_t wall = atomic_load_explicit(&g_idle_since_wall_ms, memory_order_relaxed);
  return wall ? wall : 1;
}

/* The idle watch, on the worker's tick: arms the probe (the first gated call clears it); once it stayed armed
 * GPURECLAIM_SLEEP_IDLE seconds, no thread made a call gpureclaim saw for that long, and the process sleeps.
 * With GPURECLAIM_PEERS naming sleep the probe is armed too, for gr_sleep_idle_for_peer(). */
int gr_sleep_idle_tick(void) {
  unsigned idle = gr_opt()->sleep_idle;
  bool peer_sleep = (gr_opt()->peers & GR_PEERS_SLEEP) != 0;
  if ((!idle && !peer_sleep) || !gr_gate_enabled())
    return 2000;
  if (atomic_load_explicit(&g_state_pub, memory_order_acquire) != ST_AWAKE)
    return 1000;
  if (peer_sleep && gr_opt()->status) { /* the status file's idle_since_ms follows, within a tick */
    uint64_t shown = gr_sleep_idle_since_wall_ms();
    if (atomic_exchange_explicit(&g_idle_shown, shown, memory_order_relaxed) != shown)
      gr_report_status_update();
  }
  uint64_t now = gr_state_now_ms(), since = atomic_load_explicit(&g_idle_since_ms, memory_order_relaxed);
  unsigned char awake = GR_GATE_AWAKE;
  if (!since || atomic_load(&gr_gate_flag) != GR_GATE_PROBE) {
    if (atomic_compare_exchange_strong(&gr_gate_flag, &awake, GR_GATE_PROBE)) {
      atomic_store_explicit(&g_idle_since_wall_ms, gr_wall_ms(), memory_order_relaxed);
      atomic_store_explicit(&g_idle_since_ms, now, memory_order_relaxed);
    }
    return 1000;
  }
  if (!idle)
    return 1000; /* armed for peers only: this process does not sleep by itself */
  if (gr_wait_active() || just_woke())
    return 1000; /* a thread waits for memory (it is not idle), or it woke a moment ago */
  if (now - since < (uint64_t)idle * 1000)
    return (int)((uint64_t)idle * 1000 - (now - since) < 1000 ? (uint64_t)idle * 1000 - (now - since) : 1000);
  unsigned char probe = GR_GATE_PROBE;
  if (!atomic_compare_exchange_strong(&gr_gate_flag, &probe, GR_GATE_AWAKE))
    return 1000; /* a call came just now */
  atomic_store_explicit(&g_idle_since_ms, 0, memory_order_relaxed);
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  gr_info("no CUDA call for %u s: going to sleep (GPURECLAIM_SLEEP_IDLE)", idle);
  gr_sleep_run(GPURECLAIM_TRIGGER_IDLE, 0, &r);
  return 1000;
}

bool gr_sleep_idle_for_peer(void) {
  if (!gr_gate_enabled() || atomic_load_explicit(&g_state_pub, memory_order_acquire) != ST_AWAKE ||
      atomic_load(&gr_gate_flag) != GR_GATE_PROBE)
    return false;
  if (gr_wait_active() || just_woke())
    return false;
  uint64_t since = atomic_load_explicit(&g_idle_since_ms, memory_order_relaxed);
  return since && gr_state_now_ms() - since >= 1000;
}

void gr_sleep_atfork_child(void) {
  /* The child has none of the parent's CUDA state to wake: it starts awake, gates open. */
  pthread_mutex_init(&g_mu, NULL);
  pthread_cond_init(&g_cv, NULL);
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  g_state = ST_AWAKE;
  atomic_store(&g_state_pub, ST_AWAKE);
  atomic_store(&g_host_bytes, 0);
  atomic_store(&g_idle_since_ms, 0);
  atomic_store(&g_woke_ms, 0);
  atomic_store(&g_ipc_exported, 0); /* the child's own CUDA use starts over */
  atomic_store(&g_ipc_opened, 0);
}

/* ---- the public functions ---- */

GPURECLAIM_API int gpureclaim_sleep(gpureclaim_sleep_report_t *out) {
  if (out && out->size < offsetof(gpureclaim_sleep_report_t, trigger) + sizeof(int))
    return -EINVAL;
  if (gr_state_disabled() || atomic_load_explicit(&gr_state_run, memory_order_acquire) != 1)
    return -ENOTSUP;
  if (gr_tls.hook_depth || gr_admit_held())
    return -EDEADLK; /* the sleep's release, or the release this thread runs, would wait for itself */
  return gr_sleep_run(GPURECLAIM_TRIGGER_API, 0, out);
}

GPURECLAIM_API int gpureclaim_wake(void) {
  if (gr_state_disabled())
    return -ENOTSUP;
  if (gr_tls.hook_depth || gr_admit_held())
    return -EDEADLK; /* a sleep's release that runs this releaser would never end while the wake waits for it */
  return gr_sleep_wake(GPURECLAIM_TRIGGER_API);
}

GPURECLAIM_API int gpureclaim_sleep_state(uint64_t *host_bytes) { return gr_sleep_state_now(host_bytes); }
