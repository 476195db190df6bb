/* test_sim_checkpoint.c -- the simulated checkpoint API (cuCheckpointProcess*): the lock holds every other
 * thread's calls and waits for calls in flight, a checkpoint moves device contents to the host and frees the
 * device's capacity, a restore needs that capacity back and puts the contents back at the same addresses, and a
 * call that reaches the driver while checkpointed aborts loudly. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include "../common/threads.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static CUprocessState state(void) {
  CUprocessState s = (CUprocessState)-1;
  OK(cuCheckpointProcessGetState(getpid(), &s));
  return s;
}

typedef struct {
  unsigned long long total, free, used;
} mem_t;
typedef struct {
  int (*init)(void);
  int (*by_uuid)(const char *, void **);
  int (*info)(void *, mem_t *);
} nvml_t;

/* The simulated NVML: the process's own (dlopen) or a private copy in a namespace of its own (dlmopen), which is
 * how a process reads free memory while it is locked (the process's own NVML blocks then, as NVIDIA's does). */
static nvml_t nvml(int private_copy) {
  void *h = private_copy ? dlmopen(LM_ID_NEWLM, "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)
                         : dlopen("libnvidia-ml.so.1", RTLD_NOW);
  cr_assert_not_null(h, "the simulated libnvidia-ml.so.1: %s", dlerror());
  nvml_t n;
  *(void **)&n.init = dlsym(h, "nvmlInit_v2");
  *(void **)&n.by_uuid = dlsym(h, "nvmlDeviceGetHandleByUUID");
  *(void **)&n.info = dlsym(h, "nvmlDeviceGetMemoryInfo");
  cr_assert(n.init && n.by_uuid && n.info);
  return n;
}

static void uuid_of(int dev, char *s, size_t len) {
  CUuuid u;
  OK(cuDeviceGetUuid(&u, dev));
  const unsigned char *x = (const unsigned char *)u.bytes;
  snprintf(s, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1], x[2], x[3],
           x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
}

static uint64_t nvml_free_uuid(nvml_t n, const char *s) {
  cr_assert_eq(n.init(), 0);
  void *d = NULL;
  cr_assert_eq(n.by_uuid(s, &d), 0, "%s", s);
  mem_t m;
  cr_assert_eq(n.info(d, &m), 0);
  return m.free;
}

static uint64_t nvml_free(nvml_t n, int dev) {
  char s[48];
  uuid_of(dev, s, sizeof s); /* (a driver call: not from another thread while locked) */
  return nvml_free_uuid(n, s);
}

static uint64_t dev_free(int dev) {
  static nvml_t priv;
  static int have;
  if (!have) {
    priv = nvml(1);
    have = 1;
  }
  return nvml_free(priv, dev);
}

Test(sim_checkpoint, states_and_contents) {
  setenv("SIMCUDA_DEVICE_MEM", "1G", 1);
  sim_primary(0);
  size_t fr0, tot;
  OK(cuMemGetInfo(&fr0, &tot));
  CUdeviceptr a, b;
  OK(cuMemAlloc(&a, 64 * MiB));
  OK(cuMemAlloc(&b, 4096));
  unsigned char *pat = malloc(64 * MiB);
  for (size_t i = 0; i < 64 * MiB; i++) pat[i] = (unsigned char)(i * 7 + 3);
  OK(cuMemcpyHtoD(a, pat, 64 * MiB));
  OK(cuMemsetD8(b, 0x5a, 4096));
  cr_assert_eq(state(), CU_PROCESS_STATE_RUNNING);
  ERR(cuCheckpointProcessCheckpoint(getpid(), NULL), CUDA_ERROR_ILLEGAL_STATE);
  ERR(cuCheckpointProcessUnlock(getpid(), NULL), CUDA_ERROR_ILLEGAL_STATE);
  ERR(cuCheckpointProcessLock(getpid() + 100000, NULL), CUDA_ERROR_NOT_SUPPORTED);
  CUcheckpointLockArgs la = {.timeoutMs = 1000, .reserved0 = 1};
  ERR(cuCheckpointProcessLock(getpid(), &la), CUDA_ERROR_INVALID_VALUE);
  la.reserved0 = 0;
  uint64_t before = dev_free(0);
  cr_assert_lt(before, fr0, "the allocations count");
  OK(cuCheckpointProcessLock(getpid(), &la));
  cr_assert_eq(state(), CU_PROCESS_STATE_LOCKED);
  ERR(cuCheckpointProcessLock(getpid(), &la), CUDA_ERROR_ILLEGAL_STATE);
  OK(cuCheckpointProcessCheckpoint(getpid(), NULL));
  cr_assert_eq(state(), CU_PROCESS_STATE_CHECKPOINTED);
  cr_assert_eq(dev_free(0), 1 * GiB, "the device holds nothing of the process while checkpointed");
  /* no room: the restore fails and leaves everything as it was */
  simcuda_set_capacity(0, 32 * MiB);
  ERR(cuCheckpointProcessRestore(getpid(), NULL), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(state(), CU_PROCESS_STATE_CHECKPOINTED);
  simcuda_set_capacity(0, 1 * GiB);
  OK(cuCheckpointProcessRestore(getpid(), NULL));
  cr_assert_eq(state(), CU_PROCESS_STATE_LOCKED);
  cr_assert_eq(dev_free(0), before);
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  cr_assert_eq(state(), CU_PROCESS_STATE_RUNNING);
  unsigned char *back = malloc(64 * MiB);
  OK(cuMemcpyDtoH(back, a, 64 * MiB));
  cr_assert(memcmp(back, pat, 64 * MiB) == 0, "contents identical at the same address after restore");
  unsigned char small[4096];
  OK(cuMemcpyDtoH(small, b, 4096));
  for (int i = 0; i < 4096; i++) cr_assert_eq(small[i], 0x5a);
  OK(cuMemFree(a));
  OK(cuMemFree(b));
  free(pat);
  free(back);
}

static _Atomic int g_done;
static void *other_thread(void *arg) {
  CUdeviceptr p;
  cuCtxSetCurrent((CUcontext)arg);
  CUresult r = cuMemAlloc(&p, 4096); /* waits while the process is locked */
  atomic_store(&g_done, r == CUDA_SUCCESS ? 1 : -1);
  return NULL;
}

Test(sim_checkpoint, lock_holds_other_threads) {
  CUcontext c = sim_primary(0);
  OK(cuCheckpointProcessLock(getpid(), NULL));
  pthread_t th;
  th = gr_thread_start(other_thread, c);
  nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
  cr_assert_eq(atomic_load(&g_done), 0, "another thread's call waits while locked");
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 4096)); /* the locking thread itself goes on */
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  gr_thread_join(th);
  cr_assert_eq(atomic_load(&g_done), 1);
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_inside, g_release;
static void stall(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  g_inside = 1;
  pthread_cond_broadcast(&g_cv);
  while (!g_release) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}
static void *stuck_thread(void *arg) {
  cuCtxSetCurrent((CUcontext)arg);
  CUdeviceptr p;
  cuMemAlloc(&p, 4096); /* stalls inside the call (on return) */
  return NULL;
}

Test(sim_checkpoint, lock_waits_for_calls_in_flight) {
  CUcontext c = sim_primary(0);
  cr_assert_eq(simcuda_on_return("cuMemAlloc_v2", stall, NULL), 0);
  pthread_t th;
  th = gr_thread_start(stuck_thread, c);
  pthread_mutex_lock(&g_mu);
  while (!g_inside) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  CUcheckpointLockArgs la = {.timeoutMs = 100};
  ERR(cuCheckpointProcessLock(getpid(), &la), CUDA_ERROR_NOT_READY);
  cr_assert_eq(state(), CU_PROCESS_STATE_RUNNING, "a lock that timed out leaves the process running");
  pthread_mutex_lock(&g_mu);
  g_release = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  gr_thread_join(th);
  OK(cuCheckpointProcessLock(getpid(), &la));
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
}

Test(sim_checkpoint, call_while_checkpointed_aborts) {
  CUcontext c = sim_primary(0);
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 4096));
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    if (cuCheckpointProcessLock(getpid(), NULL) != CUDA_SUCCESS) _exit(10);
    if (cuCheckpointProcessCheckpoint(getpid(), NULL) != CUDA_SUCCESS) _exit(11);
    cuCtxSetCurrent(c);
    cuMemsetD8(p, 1, 4096); /* a use of device memory before any restore */
    _exit(12);
  }
  close(fds[1]);
  char buf[512] = {0};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  (void)n;
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %#x, stderr: %s", st, buf);
  cr_assert(strstr(buf, "cuCtxSetCurrent called by thread") && strstr(buf, "checkpointed"), "%s", buf);
}

static nvml_t g_own;
static char g_uuid0[48];
static _Atomic int g_nvml_done;
static _Atomic unsigned long long g_nvml_free;
static void *nvml_thread(void *arg) {
  (void)arg;
  atomic_store(&g_nvml_free, nvml_free_uuid(g_own, g_uuid0));
  atomic_store(&g_nvml_done, 1);
  return NULL;
}

/* Observed on NVIDIA's driver 580: a process's own NVML blocks from cuCheckpointProcessLock to the unlock, while a
 * private copy (dlmopen) answers; gpureclaim's sleep depends on the difference. */
Test(sim_checkpoint, own_nvml_waits_while_locked_a_private_copy_answers) {
  setenv("SIMCUDA_DEVICE_MEM", "1G", 1);
  sim_primary(0);
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 64 * MiB));
  g_own = nvml(0);
  void *own = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(own);
  int (*waiters)(void) = (int (*)(void))dlsym(own, "simnvml_waiters");
  cr_assert_not_null(waiters, "the process's own libnvidia-ml.so.1 is loaded and exports simnvml_waiters");
  uuid_of(0, g_uuid0, sizeof g_uuid0);
  uint64_t running = nvml_free(g_own, 0);
  cr_assert_eq(running, dev_free(0), "both copies read the same machine");
  OK(cuCheckpointProcessLock(getpid(), NULL));
  pthread_t th = gr_thread_start(nvml_thread, NULL);
  while (waiters() == 0) sched_yield(); /* the thread is inside NVML, waiting for the unlock */
  OK(cuCheckpointProcessCheckpoint(getpid(), NULL));
  cr_assert_eq(dev_free(0), 1 * GiB, "the private copy answers while checkpointed: the device holds nothing of it");
  cr_assert_eq(atomic_load(&g_nvml_done), 0, "the process's own NVML still waits");
  OK(cuCheckpointProcessRestore(getpid(), NULL));
  cr_assert_eq(atomic_load(&g_nvml_done), 0, "restored but still locked: it still waits");
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  gr_thread_join(th);
  cr_assert_eq(atomic_load(&g_nvml_done), 1);
  cr_assert_eq(atomic_load(&g_nvml_free), running, "after the unlock it answers, with the memory back in use");
  OK(cuMemFree(a));
}

/* Blocks of odd sizes share pages (512-byte steps): a checkpoint must keep every byte of each, whichever is saved
 * first. (It dropped a saved block's pages whole, zeroing the start of a neighbour not yet saved.) */
Test(sim_checkpoint, blocks_that_share_pages_keep_every_byte) {
  setenv("SIMCUDA_CHECKPOINT_RATE", "0", 1);
  sim_primary(0);
  enum { N = 300 };
  CUdeviceptr p[N];
  size_t len[N];
  unsigned seed = 12345;
  for (int i = 0; i < N; i++) {
    seed = seed * 1103515245u + 12345u;
    len[i] = 1 + (seed >> 8) % 6000; /* 1 byte to 6,000: several blocks to a page, blocks across pages */
    OK(cuMemAlloc(&p[i], len[i]));
    unsigned char *h = malloc(len[i]);
    for (size_t k = 0; k < len[i]; k++) h[k] = (unsigned char)(i * 31 + k * 7 + 1);
    OK(cuMemcpyHtoD(p[i], h, len[i]));
    free(h);
  }
  int shared = 0; /* the premise: some blocks begin on a page another block ends on */
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N && !shared; j++)
      shared = i != j && (p[i] & ~(CUdeviceptr)4095) == ((p[j] + len[j] - 1) & ~(CUdeviceptr)4095);
  cr_assert(shared, "no two blocks share a page: the test shows nothing");
  OK(cuCheckpointProcessLock(getpid(), NULL));
  OK(cuCheckpointProcessCheckpoint(getpid(), NULL));
  OK(cuCheckpointProcessRestore(getpid(), NULL));
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  int bad = 0;
  for (int i = 0; i < N; i++) {
    unsigned char *h = malloc(len[i]);
    OK(cuMemcpyDtoH(h, p[i], len[i]));
    for (size_t k = 0; k < len[i]; k++)
      if (h[k] != (unsigned char)(i * 31 + k * 7 + 1)) {
        bad++;
        break;
      }
    free(h);
    OK(cuMemFree(p[i]));
  }
  cr_assert_eq(bad, 0, "%d of %d blocks changed by a checkpoint and restore", bad, N);
}

/* A checkpoint and a restore take as long as moving their bytes at SIMCUDA_CHECKPOINT_RATE takes (at least: the
 * bound below can only be exceeded, never missed, by a slow machine). */
Test(sim_checkpoint, moving_takes_the_time_the_rate_says) {
  setenv("SIMCUDA_CHECKPOINT_RATE", "256M", 1);
  sim_primary(0);
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 64 * MiB));
  OK(cuMemsetD8(a, 1, 64 * MiB));
  OK(cuCheckpointProcessLock(getpid(), NULL));
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  OK(cuCheckpointProcessCheckpoint(getpid(), NULL));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  OK(cuCheckpointProcessRestore(getpid(), NULL));
  clock_gettime(CLOCK_MONOTONIC, &t2);
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  double out = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  double in = (double)(t2.tv_sec - t1.tv_sec) + (double)(t2.tv_nsec - t1.tv_nsec) / 1e9;
  cr_assert_geq(out, 0.25, "64 MiB at 256 MiB/s out: %.3f s", out);
  cr_assert_geq(in, 0.25, "64 MiB at 256 MiB/s back: %.3f s", in);
  OK(cuMemFree(a));
}

/* simcuda_on_enter: the callback runs before the driver counts or sees the call, once; the checkpoint lock does
 * not wait for a thread held there, and that call, let go, reaches the driver locked: simcuda_checkpoint_late_calls
 * counts it (the locking thread's own calls are not late). */
static uint64_t g_calls_in_cb;
static void note_calls(void *arg) {
  (void)arg;
  g_calls_in_cb = simcuda_calls("cuMemAlloc_v2");
}
static int g_held, g_let_go;
static void hold_entry(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  g_held = 1;
  pthread_cond_broadcast(&g_cv);
  while (!g_let_go) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

Test(sim_checkpoint, on_enter_runs_before_the_driver_sees_the_call) {
  CUcontext c = sim_primary(0);
  (void)c;
  CUdeviceptr p;
  uint64_t n0 = simcuda_calls("cuMemAlloc_v2");
  cr_assert_eq(simcuda_on_enter("cuMemAlloc_v2", note_calls, NULL), 0);
  OK(cuMemAlloc(&p, 4096));
  cr_assert_eq(g_calls_in_cb, n0, "the callback ran before the call was counted");
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), n0 + 1);
  g_calls_in_cb = 0;
  OK(cuMemAlloc(&p, 4096));
  cr_assert_eq(g_calls_in_cb, 0, "once");
  cr_assert_eq(simcuda_on_enter("cuNoSuchFunction", note_calls, NULL), -1);
}

Test(sim_checkpoint, a_call_held_at_its_entry_reaches_the_driver_late) {
  CUcontext c = sim_primary(0);
  cr_assert_eq(simcuda_on_enter("cuMemAlloc_v2", hold_entry, NULL), 0);
  pthread_t th = gr_thread_start(other_thread, c);
  pthread_mutex_lock(&g_mu);
  while (!g_held) pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  CUcheckpointLockArgs la = {.timeoutMs = 60000};
  OK(cuCheckpointProcessLock(getpid(), &la)); /* the held call is not in the driver: nothing to wait for */
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 4096)); /* the locking thread's own call */
  cr_assert_eq(simcuda_checkpoint_late_calls(), 0);
  pthread_mutex_lock(&g_mu);
  g_let_go = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  while (simcuda_checkpoint_late_calls() == 0) nanosleep(&(struct timespec){0, 200000}, NULL);
  cr_assert_eq(atomic_load(&g_done), 0, "the late call waits in the driver while locked");
  OK(cuCheckpointProcessUnlock(getpid(), NULL));
  gr_thread_join(th);
  cr_assert_eq(atomic_load(&g_done), 1);
  cr_assert_eq(simcuda_checkpoint_late_calls(), 1, "counted once");
}
