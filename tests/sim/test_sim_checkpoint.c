/* test_sim_checkpoint.c -- the simulated checkpoint API (cuCheckpointProcess*): the lock holds every other
 * thread's calls and waits for calls in flight, a checkpoint moves device contents to the host and frees the
 * device's capacity, a restore needs that capacity back and puts the contents back at the same addresses, and a
 * call that reaches the driver while checkpointed aborts loudly. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include "../common/threads.h"

#include <dlfcn.h>
#include <pthread.h>
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

static uint64_t dev_free(int dev) {
  typedef struct {
    unsigned long long total, free, used;
  } mem_t;
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  cr_assert_not_null(h, "the simulated libnvidia-ml.so.1: %s", dlerror());
  int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
  int (*by_uuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID");
  int (*info)(void *, mem_t *) = (int (*)(void *, mem_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
  cr_assert(init && by_uuid && info);
  cr_assert_eq(init(), 0);
  CUuuid u;
  OK(cuDeviceGetUuid(&u, dev));
  const unsigned char *x = (const unsigned char *)u.bytes;
  char s[48];
  snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1], x[2],
           x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
  void *d = NULL;
  cr_assert_eq(by_uuid(s, &d), 0, "%s", s);
  mem_t m;
  cr_assert_eq(info(d, &m), 0);
  return m.free;
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
