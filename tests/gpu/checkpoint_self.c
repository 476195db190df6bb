/* checkpoint_self.c -- what gpureclaim's sleep relies on in the driver's checkpoint API, checked on a real GPU
 * without gpureclaim: a process applies cuCheckpointProcessLock / Checkpoint / Restore / Unlock to its own pid
 * from one thread, and reads the device's free memory meanwhile through a private copy of NVML (dlmopen), since
 * its own NVML blocks from the lock to the unlock (docs/DRIVER.md). A watchdog bounds every step: a call that
 * does not return is reported, not waited for.
 *
 *   cc -O2 -I/usr/local/cuda/include -o checkpoint_self checkpoint_self.c -L/usr/local/cuda/lib64/stubs -lcuda \
 *      -ldl -lpthread && ./checkpoint_self [MiB]
 *
 * Checks (GPUTEST lines, tests/gpu/collect.py): self_checkpoint (each call succeeds, the states are as documented,
 * the contents are back), private_nvml (a private NVML answers while checkpointed and sees the device gain what
 * the process held), nvml_after_unlock (the process's own NVML answers again after the unlock). The data say
 * whether the own NVML blocked while locked and whether another thread's cuDeviceGetCount returned while
 * checkpointed (observations, not requirements). */
#define _GNU_SOURCE
#include "gpucheck.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  unsigned long long total, free, used;
} mem_t;
typedef struct {
  int (*init)(void);
  int (*by_index)(unsigned, void **);
  int (*mem)(void *, mem_t *);
} nvml_t;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int load(nvml_t *n, void *h) {
  if (!h)
    return -1;
  *(void **)&n->init = dlsym(h, "nvmlInit_v2");
  *(void **)&n->by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
  *(void **)&n->mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
  return n->init && n->by_index && n->mem ? 0 : -1;
}

/* A call run on a thread of its own, so that one that blocks is seen without blocking the test. */
typedef struct job {
  nvml_t *n;      /* NVML free memory of device 0, or NULL: cuDeviceGetCount */
  _Atomic int done;
  int rc;
  double free_mib;
} job_t;

static void *run_job(void *arg) {
  job_t *j = arg;
  if (j->n) {
    void *dev = NULL;
    mem_t m = {0, 0, 0};
    j->rc = j->n->init() | j->n->by_index(0, &dev) | j->n->mem(dev, &m);
    j->free_mib = (double)m.free / GT_MIB;
  } else {
    int c = 0;
    j->rc = (int)cuDeviceGetCount(&c);
  }
  atomic_store(&j->done, 1);
  return NULL;
}

/* Starts the job and waits up to limit seconds; the job is left running (and leaked) when it blocks. */
static job_t *try_job(nvml_t *n, double limit) {
  job_t *j = calloc(1, sizeof *j);
  j->n = n;
  pthread_t t;
  pthread_create(&t, NULL, run_job, j);
  pthread_detach(t);
  double t0 = now();
  while (!atomic_load(&j->done) && now() - t0 < limit)
    usleep(2000);
  return j;
}

static const char *g_step = "start";
static _Atomic double g_step_at;
static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    usleep(200000);
    if (now() - atomic_load(&g_step_at) > 60.0) {
      gt_result("self_checkpoint", 0, NULL, "%s did not return within 60 s", g_step);
      fflush(stdout);
      _exit(1);
    }
  }
  return NULL;
}
static void step(const char *s) {
  g_step = s;
  atomic_store(&g_step_at, now());
}

static const char *state_name(CUprocessState s) {
  switch (s) {
  case CU_PROCESS_STATE_RUNNING: return "RUNNING";
  case CU_PROCESS_STATE_LOCKED: return "LOCKED";
  case CU_PROCESS_STATE_CHECKPOINTED: return "CHECKPOINTED";
  case CU_PROCESS_STATE_FAILED: return "FAILED";
  }
  return "?";
}
static CUprocessState state(void) {
  CUprocessState s = CU_PROCESS_STATE_FAILED;
  return cuCheckpointProcessGetState(getpid(), &s) == CUDA_SUCCESS ? s : CU_PROCESS_STATE_FAILED;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
  size_t bytes = mib << 20;
  step("cuInit");
  pthread_t wd;
  pthread_create(&wd, NULL, watchdog, NULL);
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuMemAlloc(&p, bytes) != CUDA_SUCCESS || cuMemsetD8(p, 0x5a, bytes) != CUDA_SUCCESS ||
      cuCtxSynchronize() != CUDA_SUCCESS) {
    gt_result("self_checkpoint", 0, NULL, "setup failed (cuInit, context or a %zu MiB allocation)", mib);
    return 1;
  }
  void *lock_fn = NULL;
  cuGetProcAddress("cuCheckpointProcessLock", &lock_fn, 12080, 0, NULL);
  if (!lock_fn) {
    gt_result("self_checkpoint", -1, NULL, "the driver has no checkpoint API (570 or later)");
    return 0;
  }
  nvml_t own, priv;
  if (load(&own, dlopen("libnvidia-ml.so.1", RTLD_NOW)) != 0 || own.init() != 0) {
    gt_result("self_checkpoint", 0, NULL, "libnvidia-ml.so.1 cannot be loaded or initialised");
    return 1;
  }
  job_t *j = try_job(&own, 5);
  double free_running = j->free_mib;

  CUcheckpointLockArgs la;
  memset(&la, 0, sizeof la);
  la.timeoutMs = 10000;
  double t0 = now();
  step("cuCheckpointProcessLock");
  CUresult r_lock = cuCheckpointProcessLock(getpid(), &la);
  double t_lock = now() - t0;
  CUprocessState s_lock = state();
  job_t *own_locked = try_job(&own, 3); /* the process's own NVML, while locked */
  int own_blocked = !atomic_load(&own_locked->done);
  t0 = now();
  step("cuCheckpointProcessCheckpoint");
  CUresult r_ck = cuCheckpointProcessCheckpoint(getpid(), NULL);
  double t_ck = now() - t0;
  CUprocessState s_ck = state();
  job_t *other = try_job(NULL, 3); /* another thread's device query, while checkpointed */
  int other_returned = atomic_load(&other->done);
  step("dlmopen of a private NVML");
  int priv_ok = load(&priv, dlmopen(LM_ID_NEWLM, "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) == 0;
  job_t *pj = priv_ok ? try_job(&priv, 10) : NULL;
  t0 = now();
  step("cuCheckpointProcessRestore");
  CUresult r_rs = cuCheckpointProcessRestore(getpid(), NULL);
  double t_rs = now() - t0;
  CUprocessState s_rs = state();
  t0 = now();
  step("cuCheckpointProcessUnlock");
  CUresult r_un = cuCheckpointProcessUnlock(getpid(), NULL);
  double t_un = now() - t0;
  CUprocessState s_un = state();
  step("the contents");
  unsigned char *h = malloc(bytes);
  CUresult r_cp = cuMemcpyDtoH(h, p, bytes);
  size_t bad = 0;
  for (size_t i = 0; r_cp == CUDA_SUCCESS && i < bytes; i++)
    bad += h[i] != 0x5a;
  double wait0 = now();
  while (!atomic_load(&own_locked->done) && now() - wait0 < 5)
    usleep(2000);
  step("done");

  char data[1024];
  snprintf(data, sizeof data,
           "{\"mib\": %zu, \"lock_ms\": %.1f, \"checkpoint_ms\": %.1f, \"restore_ms\": %.1f, \"unlock_ms\": %.1f, "
           "\"own_nvml_blocked_while_locked\": %s, \"other_thread_query_returned_while_checkpointed\": %s}",
           mib, t_lock * 1e3, t_ck * 1e3, t_rs * 1e3, t_un * 1e3, own_blocked ? "true" : "false",
           other_returned ? "true" : "false");
  int ok = r_lock == CUDA_SUCCESS && r_ck == CUDA_SUCCESS && r_rs == CUDA_SUCCESS && r_un == CUDA_SUCCESS &&
           s_lock == CU_PROCESS_STATE_LOCKED && s_ck == CU_PROCESS_STATE_CHECKPOINTED &&
           s_rs == CU_PROCESS_STATE_LOCKED && s_un == CU_PROCESS_STATE_RUNNING && r_cp == CUDA_SUCCESS && bad == 0;
  gt_result("self_checkpoint", ok, data,
            "own pid, one thread: lock %d (%s, %.1f ms), checkpoint %d (%s, %.1f ms for %zu MiB), restore %d (%s, "
            "%.1f ms), unlock %d (%s, %.1f ms); contents: %zu of %zu bytes differ",
            (int)r_lock, state_name(s_lock), t_lock * 1e3, (int)r_ck, state_name(s_ck), t_ck * 1e3, mib, (int)r_rs,
            state_name(s_rs), t_rs * 1e3, (int)r_un, state_name(s_un), t_un * 1e3, bad, bytes);
  int priv_done = pj && atomic_load(&pj->done);
  double gained = priv_done ? pj->free_mib - free_running : 0;
  gt_result("private_nvml", priv_done && pj->rc == 0 && gained >= (double)mib, NULL,
            "%s; free memory %.1f MiB running, %.1f MiB checkpointed: the device gained %.1f MiB for the %zu MiB "
            "allocated (the rest is the context); the process's own NVML %s while locked; another thread's "
            "cuDeviceGetCount %s while checkpointed",
            !priv_ok     ? "dlmopen of libnvidia-ml.so.1 failed"
            : !priv_done ? "a private NVML (dlmopen) BLOCKED"
                         : "a private NVML (dlmopen) answered",
            free_running, priv_done ? pj->free_mib : 0.0, gained, mib, own_blocked ? "blocked" : "answered",
            other_returned ? "returned" : "blocked");
  gt_result("nvml_after_unlock", atomic_load(&own_locked->done) && own_locked->rc == 0, NULL,
            "the process's own NVML call made while locked %s after the unlock (free %.1f MiB)",
            atomic_load(&own_locked->done) ? "returned" : "had still not returned 5 s", own_locked->free_mib);
  fflush(stdout);
  _exit(gt_failed ? 1 : 0); /* a blocked job thread must not hold the exit */
}
