/* Sleep and wake (sleep.c, gate.c) on the simulator, through the runtime route (the simulated libcudart reaches
 * the driver through cuGetProcAddress only, as the real CUDA 13 runtime does): a process holding live, cached
 * and orphaned memory sleeps, the device holds nothing of it, and the first CUDA call of any kind (an
 * allocation, a memcpy, a kernel launch) wakes it with its contents unchanged. The simulated driver aborts on
 * any call that reaches it while the process is checkpointed, so a call that slipped past a gate fails the test.
 */
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RT_OK(call) cr_assert_eq((call), cudaSuccess, "%s", #call)
#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

typedef struct {
  unsigned long long total, free, used;
} nvml_mem_t;

/* The device's free memory as NVML reports it (no context needed: also while the process sleeps), through a
 * private copy of NVML (dlmopen): the process's own blocks while the driver holds the process locked, so through
 * a sleep, as NVIDIA's does (docs/DRIVER.md). */
static uint64_t nvml_free(int dev) {
  static void *h;
  if (!h)
    h = dlmopen(LM_ID_NEWLM, "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  int (*by_uuid)(const char *, void **) = (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID");
  int (*info)(void *, nvml_mem_t *) = (int (*)(void *, nvml_mem_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
  int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
  cr_assert(by_uuid && info && init && init() == 0);
  static char uuid[8][64];
  if (!uuid[dev][0]) { /* read once, while awake */
    CUuuid u;
    cr_assert_eq(cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
    const unsigned char *x = (const unsigned char *)u.bytes;
    snprintf(uuid[dev], sizeof uuid[dev], "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
  }
  void *d;
  nvml_mem_t m;
  cr_assert_eq(by_uuid(uuid[dev], &d), 0);
  cr_assert_eq(info(d, &m), 0);
  return m.free;
}

static int state(uint64_t *host) { return gpureclaim_sleep_state(host); }

static unsigned char *pattern(size_t n, unsigned seed) {
  unsigned char *p = malloc(n);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)(i * 131 + seed);
  return p;
}

/* Live 64 MiB with a pattern, 8 MiB cached in the default pool, 4 MiB orphaned. */
static void *hold(unsigned char **pat) {
  void *live;
  RT_OK(cudaMalloc(&live, 64 * MiB));
  *pat = pattern(64 * MiB, 7);
  RT_OK(cudaMemcpy(live, *pat, 64 * MiB, cudaMemcpyHostToDevice));
  cudaMemPool_t pool;
  RT_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX;
  RT_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  void *c;
  RT_OK(cudaMallocAsync(&c, 8 * MiB, NULL));
  RT_OK(cudaFreeAsync(c, NULL));
  RT_OK(cudaDeviceSynchronize());
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  void *o;
  RT_OK(cudaMalloc(&o, 4 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  return live;
}

static void check(void *live, const unsigned char *pat) {
  unsigned char *back = malloc(64 * MiB);
  RT_OK(cudaMemcpy(back, live, 64 * MiB, cudaMemcpyDeviceToHost));
  cr_assert(memcmp(back, pat, 64 * MiB) == 0, "contents identical after the wake");
  free(back);
}

static gpureclaim_sleep_report_t sleep_ok(void) {
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  int rc = gpureclaim_sleep(&r);
  cr_assert_eq(rc, 0, "gpureclaim_sleep -> %d: %s", rc, r.reason);
  cr_assert_eq(r.size, sizeof r);
  cr_assert_eq(r.slept, 1);
  cr_assert_eq(r.reason[0], '\0');
  return r;
}

Test(sleep, live_cached_orphaned_sleep_and_wake_by_memcpy) {
  RT_OK(cudaSetDevice(0));
  void *probe;
  RT_OK(cudaMalloc(&probe, 512)); /* the context exists; what follows is what the process holds */
  RT_OK(cudaFree(probe));
  uint64_t empty = nvml_free(0);
  unsigned char *pat;
  void *live = hold(&pat);
  cr_assert_lt(nvml_free(0), empty - 76 * MiB + 1, "the device holds the process's 76 MiB");
  gpureclaim_sleep_report_t r = sleep_ok();
  cr_assert_geq(r.released_bytes, 12 * MiB, "cached and orphaned memory released first: %llu",
                (unsigned long long)r.released_bytes);
  cr_assert_geq(r.moved_bytes, 64 * MiB);
  cr_assert_lt(r.moved_bytes, 76 * MiB, "only live memory moves: %llu", (unsigned long long)r.moved_bytes);
  cr_assert_eq(r.left_bytes, 0);
  cr_assert_gt(r.duration_ns, 0);
  uint64_t host = 0;
  cr_assert_eq(state(&host), GPURECLAIM_STATE_SLEEPING);
  cr_assert_eq(host, r.moved_bytes);
  cr_assert_eq(nvml_free(0), 80 * GiB, "the device holds nothing of the process while it sleeps");
  cr_assert_geq(nvml_free(0), empty, "free memory back to where it was before the process held anything");
  gpureclaim_sleep_report_t again = {.size = sizeof again};
  cr_assert_eq(gpureclaim_sleep(&again), -EALREADY);
  check(live, pat); /* the memcpy wakes it */
  cr_assert_eq(state(&host), GPURECLAIM_STATE_AWAKE);
  cr_assert_eq(host, 0);
  free(pat);
}

static void add_one(void **args) {
  unsigned char *p = *(unsigned char **)args[0];
  size_t n = *(size_t *)args[1];
  for (size_t i = 0; i < n; i++)
    p[i]++;
}

Test(sleep, wake_by_kernel_launch_and_by_allocation) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  sleep_ok();
  size_t n = 64 * MiB;
  void *args[] = {&live, &n};
  RT_OK(cudaLaunchKernel((const void *)add_one, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, NULL));
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  for (size_t i = 0; i < n; i++)
    pat[i]++;
  check(live, pat);
  sleep_ok();
  void *more;
  RT_OK(cudaMalloc(&more, 1 * MiB)); /* an allocation wakes it */
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  check(live, pat);
  free(pat);
}

/* The first call after a sleep wakes the process on every route to an allocation entry point, before the call
 * reaches the driver (the simulator aborts on a call that reaches it checkpointed): the runtime's cudaMalloc
 * (which, set up once per thread as the real runtime is, calls its cuMemAlloc_v2 from cuGetProcAddress straight
 * away: gpureclaim's wrapper, no gate in front), the exported name (a program linked with -lcuda), a pointer a
 * program got from cuGetProcAddress, and one that a library got with dlsym() on its own handle (libcublasLt's
 * route; libsimblaslt.so stands in). Every pointer is had before the sleep, as programs keep them. */
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
Test(sleep, the_first_call_after_a_sleep_wakes_it_on_every_route) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  void *lt = dlopen("libsimblaslt.so", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(lt, "%s", dlerror());
  const char *missing = NULL;
  cr_assert_eq(((int (*)(const char **))dlsym(lt, "simblaslt_create"))(&missing), 0, "missing: %s",
               missing ? missing : "-");
  alloc_fn lt_alloc = (alloc_fn)dlsym(lt, "simblaslt_alloc"), pa_alloc = NULL;
  CUdriverProcAddressQueryResult q;
  cr_assert_eq(cuGetProcAddress_v2("cuMemAlloc", (void **)&pa_alloc, 12000, 0, &q), CUDA_SUCCESS);
  cr_assert(lt_alloc && pa_alloc);
  static const char *const route[] = {"cudaMalloc", "exported cuMemAlloc_v2", "cuGetProcAddress", "dlsym"};
  uint64_t calls = simcuda_calls("cuMemAlloc_v2");
  for (int i = 0; i < 4; i++) {
    sleep_ok();
    uint64_t before = simcuda_calls("cuMemAlloc_v2");
    CUdeviceptr d = 0;
    void *p = NULL;
    int ok = i == 0 ? cudaMalloc(&p, 1 * MiB) == cudaSuccess
             : i == 1 ? cuMemAlloc(&d, 1 * MiB) == CUDA_SUCCESS
             : i == 2 ? pa_alloc(&d, 1 * MiB) == CUDA_SUCCESS
                      : lt_alloc(&d, 1 * MiB) == CUDA_SUCCESS;
    cr_assert(ok, "%s after a sleep failed", route[i]);
    cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE, "%s woke the process", route[i]);
    cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), before + 1, "%s reached the driver once, awake", route[i]);
    gpureclaim_block_t b;
    uint64_t addr = i == 0 ? (uint64_t)(uintptr_t)p : (uint64_t)d;
    cr_assert(h_find(addr, &b), "%s's block is tracked", route[i]);
    OK(cuMemFree(addr));
  }
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), calls + 4);
  check(live, pat);
  free(pat);
}

Test(sleep, wake_without_room_stays_asleep_and_intact) {
  setenv("GPURECLAIM_WAKE_TIMEOUT", "1", 1);
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  sleep_ok();
  simcuda_set_capacity(0, 16 * MiB); /* another process took the device */
  cr_assert_eq(cudaMemcpy(pat, live, 16, cudaMemcpyDeviceToHost), cudaErrorMemoryAllocation,
               "the call waiting for the wake fails with out-of-memory");
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING, "and the process stays asleep");
  cr_assert_eq(gpureclaim_wake(), -ENOMEM);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING);
  simcuda_set_capacity(0, 80 * GiB); /* room again: the next call wakes it */
  check(live, pat);
  free(pat);
}

/* A checkpoint the driver refuses leaves the process as it was before the sleep began: awake, the driver unlocked,
 * the gates' flag down (a release is admitted again: while the flag is up every release is refused), and the
 * next sleep and wake work. Without the reset of its state, the next call waited for ever for a sleep that never
 * came: the time limit is the hang guard. */
Test(sleep, a_refused_checkpoint_leaves_the_process_awake_and_able_to_sleep, .timeout = 60) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  cr_assert_eq(simcuda_inject("cuCheckpointProcessCheckpoint", CUDA_ERROR_NOT_SUPPORTED, 1), 0);
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -ENOTSUP);
  cr_assert_eq(r.slept, 0);
  cr_assert_not_null(strstr(r.reason, "refused the checkpoint"), "%s", r.reason);
  cr_assert_eq(simcuda_calls("cuCheckpointProcessCheckpoint"), 1, "the refusal was the driver's");
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  CUprocessState ps;
  OK(cuCheckpointProcessGetState(getpid(), &ps));
  cr_assert_eq(ps, CU_PROCESS_STATE_RUNNING, "the process was unlocked again");
  /* A release is admitted (while the gates' flag is up, every release is refused, with an empty report). */
  uint64_t s = gpureclaim_scope_begin();
  void *o;
  RT_OK(cudaMalloc(&o, 2 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_bytes, 2 * MiB, "the release after the refused sleep freed %llu B of a 2 MiB orphan",
               (unsigned long long)rep.orphaned_bytes);
  check(live, pat); /* a call through a gate goes straight on */
  sleep_ok();
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING);
  check(live, pat);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  free(pat);
}

/* A wake that finds no room is remembered: a call that waited for it fails with it, and does not begin a wake of
 * its own (another GPURECLAIM_WAKE_TIMEOUT on the device). Placed exactly: the first wake is held in its peer
 * reclaim (the test holds the GPU's peer-reclaim lock in the run directory) until the second waiter is seen
 * blocked in its wait; then the first one fails, and the log has one failed wake, not two. */
static _Atomic int g_waker_tid;
static void *waker(void *arg) {
  (void)arg;
  atomic_store(&g_waker_tid, (int)syscall(SYS_gettid));
  return (void *)(intptr_t)gpureclaim_wake();
}

/* Whether thread tid is blocked in a futex wait (/proc/self/task/TID/syscall: its system call's number first). */
static bool in_futex_wait(int tid) {
  char path[64], buf[256] = "";
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool got = fgets(buf, sizeof buf, f) != NULL;
  fclose(f);
  return got && atol(buf) == SYS_futex && buf[0] != 'r'; /* ("running" while it runs) */
}

static int failed_wakes(const char *log) {
  FILE *f = fopen(log, "r");
  if (!f) return 0;
  char line[4096], pid[32];
  snprintf(pid, sizeof pid, "\"pid\":%d,", (int)getpid());
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, "\"event\":\"wake-failed\"") && strstr(line, pid);
  fclose(f);
  return n;
}

Test(sleep, a_wake_without_room_is_remembered_by_the_calls_that_waited_for_it, .timeout = 120) {
  char log[4200];
  snprintf(log, sizeof log, "%s/wake-%d.log", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  setenv("GPURECLAIM_LOG", log, 1);
  setenv("GPURECLAIM_WAKE_TIMEOUT", "1", 1);
  setenv("GPURECLAIM_PEER_TIMEOUT", "60", 1); /* the first wake waits for the lock until the test lets it go */
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  nvml_free(0); /* (reads the device's UUID while awake) */
  CUuuid u;
  OK(cuDeviceGetUuid(&u, 0));
  const unsigned char *x = (const unsigned char *)u.bytes;
  char lock[4300];
  snprintf(lock, sizeof lock, "%s/gpu-GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x.lock",
           getenv("GPURECLAIM_RUNDIR"), x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11],
           x[12], x[13], x[14], x[15]);
  sleep_ok();
  simcuda_set_capacity(0, 16 * MiB); /* another process took the device */
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  cr_assert_geq(fd, 0, "%s: %s", lock, strerror(errno));
  cr_assert_eq(flock(fd, LOCK_EX), 0);
  pthread_t first = gr_thread_start(waker, NULL);
  while (state(NULL) != GPURECLAIM_STATE_WAKING) /* (the time limit guards these waits) */
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  atomic_store(&g_waker_tid, 0);
  pthread_t second = gr_thread_start(waker, NULL);
  int tid;
  while (!(tid = atomic_load(&g_waker_tid)))
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  for (int seen = 0; seen < 3;) { /* blocked, waiting for the first wake's outcome (seen three times running) */
    seen = in_futex_wait(tid) ? seen + 1 : 0;
    nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_WAKING, "the first wake is still under way");
  cr_assert_eq(failed_wakes(log), 0);
  close(fd); /* the first wake goes on, finds no room, and fails */
  cr_assert_eq((intptr_t)gr_thread_join(first), -ENOMEM);
  cr_assert_eq((intptr_t)gr_thread_join(second), -ENOMEM, "the waiter shares the failed wake's outcome");
  cr_assert_eq(failed_wakes(log), 1, "one wake was tried, not one per waiting call");
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING);
  simcuda_set_capacity(0, 80 * GiB);
  check(live, pat); /* room again: the next call wakes it */
  unlink(lock);
  unlink(log);
  free(pat);
}

Test(sleep, explicit_wake) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  sleep_ok();
  cr_assert_eq(gpureclaim_wake(), 0);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  cr_assert_eq(gpureclaim_wake(), 0, "waking an awake process is a no-op");
  check(live, pat);
  free(pat);
}

Test(sleep, refused_when_the_host_lacks_room) {
  setenv("SIMCUDA_DEVICE_MEM", "8T", 1);
  RT_OK(cudaSetDevice(0));
  FILE *f = fopen("/proc/meminfo", "r");
  cr_assert_not_null(f);
  char line[256];
  unsigned long long avail_kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &avail_kb) == 1)
      break;
  fclose(f);
  cr_assert_gt(avail_kb, 0);
  void *big; /* untouched: the simulator commits no page of it, but a sleep would have to move all of it */
  RT_OK(cudaMalloc(&big, (size_t)avail_kb * 1024 * 2));
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -ENOSPC);
  cr_assert_eq(r.slept, 0);
  cr_assert_not_null(strstr(r.reason, "available"), "%s", r.reason);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  void *p;
  RT_OK(cudaMalloc(&p, 4096)); /* goes on as before */
}

/* A thread stuck inside a CUDA call: the lock cannot be had within the timeout, and the sleep is refused. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_inside, g_go;
static void stall(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  g_inside = 1;
  pthread_cond_broadcast(&g_cv);
  while (!g_go)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}
static void *stuck(void *arg) {
  cudaMemset(arg, 1, 4096);
  return NULL;
}

Test(sleep, refused_while_a_thread_is_stuck_in_a_call) {
  void *p;
  RT_OK(cudaSetDevice(0));
  RT_OK(cudaMalloc(&p, 4096));
  cr_assert_eq(simcuda_on_return("cuMemsetD8_v2", stall, NULL), 0);
  pthread_t th;
  th = gr_thread_start(stuck, p);
  pthread_mutex_lock(&g_mu);
  while (!g_inside)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -EBUSY);
  cr_assert_not_null(strstr(r.reason, "inside a CUDA call"), "%s", r.reason);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  pthread_mutex_lock(&g_mu);
  g_go = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  gr_thread_join(th);
  RT_OK(cudaMemset(p, 2, 4096));
  sleep_ok(); /* once the call returned, the sleep works */
  RT_OK(cudaMemset(p, 3, 4096));
}

/* A sleep whose client hung up before the sleep began is never run. The client sends `sleep` on the control socket,
 * reads the progress line `moving` (the sleep then waits for a thread the test holds inside
 * a CUDA call) and closes; only then is that call let go: the lock is had, and the sleep, asking at its last moment
 * whether its client still waits, is withdrawn and the process unlocked. The client used to be looked at once,
 * when its line was read, and one that closed just after sending had its sleep run. */
static void *ping_answered(void *arg) { /* a ping answered: the worker is done with the request before it */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  char buf[512] = "";
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && write(fd, "ping\n", 5) == 5)
    (void)!read(fd, buf, sizeof buf - 1);
  if (fd >= 0)
    close(fd);
  *(bool *)arg = strstr(buf, "\"ok\":true") != NULL;
  return NULL;
}

Test(sleep, a_sleep_whose_client_hung_up_before_it_began_is_not_run, .timeout = 120) {
  char log[4200];
  snprintf(log, sizeof log, "%s/hangup-%d.log", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  setenv("GPURECLAIM_LOG", log, 1);
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat), *p;
  RT_OK(cudaMalloc(&p, 4096));
  cr_assert_eq(simcuda_on_return("cuMemsetD8_v2", stall, NULL), 0);
  pthread_t th = gr_thread_start(stuck, p);
  pthread_mutex_lock(&g_mu);
  while (!g_inside)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%s: %s", sa.sun_path, strerror(errno));
  cr_assert_eq(write(fd, "sleep 30000\n", 12), 12);
  char got[4096];
  size_t n = 0;
  while (!memmem(got, n, "\"progress\":\"moving\"", 19)) { /* (the time limit is the hang guard) */
    ssize_t r = read(fd, got + n, sizeof got - 1 - n);
    cr_assert_gt(r, 0, "the process answered %.*s", (int)n, got);
    n += (size_t)r;
  }
  cr_assert_eq(close(fd), 0); /* the client hangs up while the sleep waits for the lock */
  pthread_mutex_lock(&g_mu);
  g_go = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  gr_thread_join(th);
  bool answered = false;
  gr_thread_join(gr_thread_start(ping_answered, &answered));
  cr_assert(answered, "the worker answered no ping after the sleep request");
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE, "the sleep of a client that hung up was run");
  cr_assert_eq(simcuda_calls("cuCheckpointProcessLock"), 1, "it got as far as the lock");
  cr_assert_eq(simcuda_calls("cuCheckpointProcessCheckpoint"), 0, "and no further");
  CUprocessState ps;
  OK(cuCheckpointProcessGetState(getpid(), &ps));
  cr_assert_eq(ps, CU_PROCESS_STATE_RUNNING, "the process was unlocked again");
  FILE *f = fopen(log, "r");
  cr_assert_not_null(f);
  char line[4096];
  bool withdrawn = false;
  while (fgets(line, sizeof line, f))
    withdrawn |= strstr(line, "\"event\":\"sleep\"") && strstr(line, "withdrawn");
  fclose(f);
  cr_assert(withdrawn, "no sleep event says the sleep was withdrawn (%s)", log);
  RT_OK(cudaMemset(p, 3, 4096));
  check(live, pat);
  unlink(log);
  free(pat);
}

/* Threads calling CUDA and releasing while other sleeps and wakes come and go: every call either runs awake
 * or wakes the process first (the simulator aborts on one that reaches it while checkpointed, and counts one
 * that reaches it while locked). */
static _Atomic int g_stop;
static void *worker_calls(void *arg) {
  unsigned char buf[256];
  while (!atomic_load(&g_stop)) {
    if (cudaMemcpy(buf, arg, sizeof buf, cudaMemcpyDeviceToHost) != cudaSuccess)
      return (void *)1;
  }
  return NULL;
}
static void *worker_releases(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    gpureclaim_report_t r = {.size = sizeof r};
    int rc = gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &r);
    if (rc != 0)
      return (void *)2;
  }
  return NULL;
}

Test(sleep, races_with_calls_and_releases) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  pthread_t a, b;
  a = gr_thread_start(worker_calls, live);
  b = gr_thread_start(worker_releases, NULL);
  int slept = 0;
  for (int i = 0; i < 40; i++) {
    gpureclaim_sleep_report_t r = {.size = sizeof r};
    int rc = gpureclaim_sleep(&r);
    /* -EALREADY: still asleep from the round before, when no call of the other thread has woken it yet (under
     * load that thread may not have run: seen under ASan with the suite in parallel). */
    cr_assert(rc == 0 || rc == -EBUSY || rc == -EALREADY, "sleep -> %d: %s", rc, r.reason);
    slept += rc == 0;
    if (i % 2)
      cr_assert_eq(gpureclaim_wake(), 0);
  }
  atomic_store(&g_stop, 1);
  void *ra, *rb;
  ra = gr_thread_join(a);
  rb = gr_thread_join(b);
  cr_assert_null(ra, "a memcpy failed");
  cr_assert_null(rb, "a release failed");
  cr_assert_gt(slept, 0, "some of the sleeps happened");
  /* none reached the driver locked either, before the checkpoint (it would wait there, not abort) */
  cr_assert_eq(simcuda_checkpoint_late_calls(), 0, "a call reached the driver while the process was locked");
  check(live, pat);
  free(pat);
}

Test(sleep, on_signal_sleep) {
  setenv("GPURECLAIM_ON_SIGNAL", "sleep", 1);
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  kill(getpid(), SIGUSR1);
  for (int i = 0; i < 3000 && state(NULL) != GPURECLAIM_STATE_SLEEPING; i++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING, "the signal put the process to sleep");
  check(live, pat);
  free(pat);
}

Test(sleep, fork_while_asleep) {
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  sleep_ok();
  pid_t pid = fork();
  if (pid == 0) /* the child has none of the parent's CUDA state: it starts awake */
    _exit(gpureclaim_sleep_state(NULL) == GPURECLAIM_STATE_AWAKE ? 0 : 1);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING, "the parent still sleeps");
  check(live, pat);
  free(pat);
}

Test(sleep, idle_sleep) {
  setenv("GPURECLAIM_SLEEP_IDLE", "1", 1);
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  for (int i = 0; i < 3000 && state(NULL) != GPURECLAIM_STATE_SLEEPING; i++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING, "no CUDA call for a second: asleep");
  check(live, pat);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  free(pat);
}

Test(sleep, off_when_gates_are_off) {
  setenv("GPURECLAIM_SLEEP", "0", 1);
  RT_OK(cudaSetDevice(0));
  void *p;
  RT_OK(cudaMalloc(&p, 4096));
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -ENOTSUP);
  cr_assert_not_null(strstr(r.reason, "GPURECLAIM_SLEEP=0"), "%s", r.reason);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  RT_OK(cudaFree(p));
}

Test(sleep, refused_once_memory_was_shared_over_ipc) {
  void *p;
  RT_OK(cudaSetDevice(0));
  RT_OK(cudaMalloc(&p, 1 * MiB));
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), 0, "%s", r.reason);
  cr_assert_eq(gpureclaim_wake(), 0);
  /* Through cuGetProcAddress, as the runtime's cudaIpcGetMemHandle reaches it. */
  CUresult (*get)(CUipcMemHandle *, CUdeviceptr) = NULL;
  CUdriverProcAddressQueryResult q;
  cr_assert_eq(cuGetProcAddress_v2("cuIpcGetMemHandle", (void **)&get, 13000, 0, &q), CUDA_SUCCESS);
  CUipcMemHandle h;
  cr_assert_eq(get(&h, (CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
  r = (gpureclaim_sleep_report_t){.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -EBUSY);
  cr_assert_not_null(strstr(r.reason, "IPC"), "%s", r.reason);
  cr_assert_eq(r.slept, 0);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  RT_OK(cudaFree(p));
}

/* A graph being captured cannot be checkpointed: the sleep is refused, saying so, until the capture ends; the
 * capture is begun through cuGetProcAddress (the runtime's route) and ended by the exported name. */
Test(sleep, refused_while_a_graph_is_being_captured) {
  void *p;
  RT_OK(cudaSetDevice(0));
  RT_OK(cudaMalloc(&p, 1 * MiB));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUresult (*begin)(CUstream, CUstreamCaptureMode) = NULL;
  CUdriverProcAddressQueryResult q;
  cr_assert_eq(cuGetProcAddress_v2("cuStreamBeginCapture", (void **)&begin, 13000, 0, &q), CUDA_SUCCESS);
  OK(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), -EBUSY, "%s", r.reason);
  cr_assert_not_null(strstr(r.reason, "graph is being captured"), "%s", r.reason);
  cr_assert_eq(r.slept, 0);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_AWAKE);
  CUgraph g;
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphDestroy(g));
  r = (gpureclaim_sleep_report_t){.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), 0, "once the capture ended: %s", r.reason);
  cr_assert_eq(gpureclaim_wake(), 0);
  /* A capture that a destroyed stream ended is not counted against a sleep for ever. */
  OK(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  OK(cuStreamDestroy(s));
  r = (gpureclaim_sleep_report_t){.size = sizeof r};
  cr_assert_eq(gpureclaim_sleep(&r), 0, "after the capturing stream was destroyed: %s", r.reason);
  cr_assert_eq(gpureclaim_wake(), 0);
  RT_OK(cudaFree(p));
}

/* Another process of the simulated machine (sim_holder, not under gpureclaim) reads the device's free memory:
 * while this process sleeps it is back to where it was before this process held anything. */
typedef struct {
  pid_t pid;
  FILE *in, *out;
} other_t;

static other_t other_start(void) {
  int to[2], from[2];
  cr_assert(pipe(to) == 0 && pipe(from) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    unsetenv("LD_PRELOAD");
    execl(SIM_HOLDER, "sim_holder", (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  other_t o = {pid, fdopen(to[1], "w"), fdopen(from[0], "r")};
  setvbuf(o.in, NULL, _IOLBF, 0);
  return o;
}

static const char *other_ask(other_t *o, const char *line) {
  static char buf[256];
  fprintf(o->in, "%s\n", line);
  fflush(o->in);
  cr_assert_not_null(fgets(buf, sizeof buf, o->out), "the other process gave no answer to %s", line);
  buf[strcspn(buf, "\n")] = '\0';
  return buf;
}

static unsigned long long other_free(other_t *o) {
  unsigned long long f = 0, t = 0;
  const char *a = other_ask(o, "info 0");
  cr_assert_eq(sscanf(a, "%llu %llu", &f, &t), 2, "%s", a);
  return f;
}

Test(sleep, another_process_sees_the_free_memory_back) {
  other_t o = other_start();
  cr_assert_str_eq(other_ask(&o, "init"), "ok");
  unsigned long long before = other_free(&o); /* before this process holds anything */
  unsigned char *pat;
  RT_OK(cudaSetDevice(0));
  void *live = hold(&pat);
  cr_assert_lt(other_free(&o), before - 64 * MiB, "the other process sees what this one holds");
  sleep_ok();
  cr_assert_eq(other_free(&o), before, "asleep, this process holds nothing on the device");
  check(live, pat); /* wakes it */
  unsigned long long awake = other_free(&o);
  cr_assert_leq(awake, before - 64 * MiB, "awake, its live memory is back on the device");
  fprintf(o.in, "exit\n");
  fclose(o.in);
  fclose(o.out);
  int st;
  waitpid(o.pid, &st, 0);
  free(pat);
}

/* A releaser that calls gpureclaim_sleep() or gpureclaim_wake() gets -EDEADLK: a release runs its releasers, and a
 * sleep runs a release first, so either call would wait for the release (or the sleep) that waits for it. Both
 * hung before. Through a plain release and through a sleep's own release. */
static int g_nested_sleep_rc = 1, g_nested_wake_rc = 1;
static size_t nested_sleep_and_wake(void *arg) {
  (void)arg;
  gpureclaim_sleep_report_t r = {.size = sizeof r};
  g_nested_sleep_rc = gpureclaim_sleep(&r);
  g_nested_wake_rc = gpureclaim_wake();
  return 0;
}

Test(sleep, sleep_and_wake_from_a_releaser_return_edeadlk, .timeout = 60) {
  RT_OK(cudaSetDevice(0));
  int id = gpureclaim_register_releaser("nested", nested_sleep_and_wake, NULL);
  cr_assert_gt(id, 0);
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &rep), 0);
  cr_assert_eq(g_nested_sleep_rc, -EDEADLK, "gpureclaim_sleep() from a releaser returned %d", g_nested_sleep_rc);
  cr_assert_eq(g_nested_wake_rc, -EDEADLK, "gpureclaim_wake() from a releaser returned %d", g_nested_wake_rc);
  g_nested_sleep_rc = g_nested_wake_rc = 1;
  unsigned char *pat;
  void *live = hold(&pat);
  sleep_ok(); /* its release runs the releaser */
  cr_assert_eq(g_nested_sleep_rc, -EDEADLK, "gpureclaim_sleep() from a sleep's releaser returned %d",
               g_nested_sleep_rc);
  cr_assert_eq(g_nested_wake_rc, -EDEADLK, "gpureclaim_wake() from a sleep's releaser returned %d", g_nested_wake_rc);
  cr_assert_eq(gpureclaim_wake(), 0);
  check(live, pat);
  free(pat);
  cr_assert_eq(gpureclaim_unregister_releaser(id), 0);
}

/* The sleep window: a call that has passed its gate and not yet reached the driver when a sleep begins either
 * completes before the driver's checkpoint lock (the sleep waits for it) or waits at its gate; it never reaches
 * the driver while the process is locked, where NVIDIA's driver would hold it until an unlock that nothing makes
 * (docs/DRIVER.md). The simulator holds the call at its entry (simcuda_on_enter), before the driver sees it; a
 * sleep is asked for on another thread; the call is let go once the process is locked or the sleep returned or
 * 1 s passed, whichever comes first. Before the window was closed, the sleep took the lock at once and the call
 * reached the driver under it (the simulator counts it: simcuda_checkpoint_late_calls). Three routes: a driver
 * function the runtime got through cuGetProcAddress (a gate in front of the driver's own function), a hooked one
 * the same way (a gate in front of gpureclaim's wrapper), and a hooked one called by its exported name (the
 * wrapper alone, no gate). */
static pthread_mutex_t g_win_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_win_cv = PTHREAD_COND_INITIALIZER;
static int g_win_held, g_win_go;
static void win_hold(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_win_mu);
  g_win_held = 1;
  pthread_cond_broadcast(&g_win_cv);
  while (!g_win_go)
    pthread_cond_wait(&g_win_cv, &g_win_mu);
  pthread_mutex_unlock(&g_win_mu);
}
typedef struct {
  int route;
  void *dev;
  CUcontext ctx;
  _Atomic int done;
  int rc;
} win_call_t;
static void *win_call(void *arg) {
  win_call_t *c = arg;
  if (c->route == 0) {
    c->rc = cudaMemset(c->dev, 5, 4096);
  } else if (c->route == 1) {
    void *p = NULL;
    c->rc = cudaMalloc(&p, 4096);
  } else {
    CUdeviceptr p = 0;
    c->rc = cuCtxSetCurrent(c->ctx); /* the driver API: this thread's context first */
    if (c->rc == CUDA_SUCCESS)
      c->rc = cuMemAlloc_v2(&p, 4096);
  }
  atomic_store(&c->done, 1);
  return NULL;
}
typedef struct {
  int rc;
  _Atomic int done;
  gpureclaim_sleep_report_t r;
} win_sleep_t;
static void *win_sleep(void *arg) {
  win_sleep_t *s = arg;
  s->r.size = sizeof s->r;
  s->rc = gpureclaim_sleep(&s->r);
  atomic_store(&s->done, 1);
  return NULL;
}

static void sleep_window(int route, const char *fn) {
  RT_OK(cudaSetDevice(0));
  void *dev;
  RT_OK(cudaMalloc(&dev, 4096));
  RT_OK(cudaMemset(dev, 1, 4096));
  win_call_t c = {.route = route, .dev = dev};
  OK(cuCtxGetCurrent(&c.ctx));
  win_sleep_t s = {.rc = 1};
  cr_assert_eq(simcuda_on_enter(fn, win_hold, NULL), 0);
  pthread_t ct = gr_thread_start(win_call, &c);
  pthread_mutex_lock(&g_win_mu);
  while (!g_win_held)
    pthread_cond_wait(&g_win_cv, &g_win_mu);
  pthread_mutex_unlock(&g_win_mu);
  /* held: past every gate gpureclaim has, unseen by the driver */
  uint64_t calls0 = simcuda_calls(fn);
  pthread_t st = gr_thread_start(win_sleep, &s);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (simcuda_checkpoint_locked() || atomic_load(&s.done) || (now.tv_sec - t0.tv_sec) * 1000000000L +
                                                           (now.tv_nsec - t0.tv_nsec) >= 1000000000L)
      break;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
  pthread_mutex_lock(&g_win_mu);
  g_win_go = 1;
  pthread_cond_broadcast(&g_win_cv);
  pthread_mutex_unlock(&g_win_mu);
  /* the call goes on: it completes, or it reached the driver under the lock (and waits there for an unlock) */
  while (!atomic_load(&c.done) && simcuda_checkpoint_late_calls() == 0)
    nanosleep(&(struct timespec){0, 200000}, NULL);
  cr_assert_eq(simcuda_checkpoint_late_calls(), 0, "%s reached the driver while the process was locked", fn);
  gr_thread_join(ct);
  gr_thread_join(st);
  cr_assert_eq(c.rc, 0, "%s -> %d", fn, c.rc);
  cr_assert_eq(simcuda_calls(fn), calls0 + 1, "the held call reached the driver once");
  /* the sleep waited for the call and went on (or, had it not returned in time, would have refused) */
  cr_assert_eq(s.rc, 0, "gpureclaim_sleep -> %d: %s", s.rc, s.r.reason);
  cr_assert_eq(state(NULL), GPURECLAIM_STATE_SLEEPING);
  unsigned char back[4096], want[4096];
  memset(want, route == 0 ? 5 : 1, sizeof want);
  RT_OK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost)); /* wakes it */
  cr_assert(memcmp(back, want, sizeof back) == 0, "the held call's work survived the sleep");
  cr_assert_eq(simcuda_checkpoint_late_calls(), 0);
}

Test(sleep, window_a_call_past_its_gate_completes_before_the_lock_runtime_route, .timeout = 60) {
  sleep_window(0, "cuMemsetD8_v2");
}
Test(sleep, window_a_call_past_its_gate_completes_before_the_lock_hooked_by_procaddr, .timeout = 60) {
  sleep_window(1, "cuMemAlloc_v2");
}
Test(sleep, window_a_call_past_its_gate_completes_before_the_lock_hooked_by_name, .timeout = 60) {
  sleep_window(2, "cuMemAlloc_v2");
}
