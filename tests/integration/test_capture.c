/* Releases while another thread captures a CUDA graph in the global mode. The driver forbids the calls a release
 * makes (cuCtxSynchronize, cuMemFree, cuMemPoolTrimTo ...) meanwhile: they would fail and invalidate the capture,
 * so that the program's cuStreamEndCapture fails (the simulator models this, simcuda.c capture_forbids). A
 * release is refused instead (gpureclaim_release returns -EBUSY); the capture ends with CUDA_SUCCESS, nothing is
 * freed during it, and a release once it ended frees what it would have. */
#include "harness.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)

typedef struct {
  CUcontext ctx;
  bool no_mode; /* begin with the mode-less cuStreamBeginCapture (CUDA 10.0's: a global-mode capture) */
  pthread_barrier_t begun, go;
  CUresult begin, end;
} cap_t;

/* Begins a global-mode capture on a stream of its own, waits for the test, then ends it. */
static void *capturer(void *arg) {
  cap_t *c = arg;
  cuCtxSetCurrent(c->ctx);
  CUstream s = NULL;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  if (c->no_mode) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    c->begin = cuGetProcAddress("cuStreamBeginCapture", &fn, 10000, 0, &st);
    if (c->begin == CUDA_SUCCESS)
      c->begin = ((CUresult(*)(CUstream))fn)(s);
  } else {
    c->begin = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  }
  pthread_barrier_wait(&c->begun);
  pthread_barrier_wait(&c->go);
  CUgraph g = NULL;
  c->end = cuStreamEndCapture(s, &g);
  if (g)
    cuGraphDestroy(g);
  cuStreamDestroy(s);
  return NULL;
}

static pthread_t capture_start(cap_t *c, CUcontext ctx) {
  c->ctx = ctx;
  pthread_barrier_init(&c->begun, NULL, 2);
  pthread_barrier_init(&c->go, NULL, 2);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, capturer, c), 0);
  pthread_barrier_wait(&c->begun);
  cr_assert_eq(c->begin, CUDA_SUCCESS);
  return t;
}

static void capture_end(cap_t *c, pthread_t t) {
  pthread_barrier_wait(&c->go);
  pthread_join(t, NULL);
  cr_assert_eq(c->end, CUDA_SUCCESS, "the capture was invalidated: EndCapture -> %d", (int)c->end);
}

static uint64_t unsafe_calls(void) {
  return simcuda_calls("cuCtxSynchronize") + simcuda_calls("cuMemFree_v2") + simcuda_calls("cuMemPoolTrimTo");
}

static uint64_t pool_reserved(void) {
  simcuda_stats_t s = {.size = sizeof s};
  simcuda_stats(-1, NULL, &s);
  return s.pool_reserved_bytes;
}

/* 8 MiB cached in the default pool and a 1 MiB orphan (a block of an ended scope). */
static void cache_and_orphan(uint64_t orphan_bytes) {
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep = UINT64_MAX;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  CUdeviceptr p, o;
  OK(cuMemAllocAsync(&p, 8 * MiB, NULL));
  OK(cuMemFreeAsync(p, NULL));
  OK(cuCtxSynchronize());
  uint64_t sc = gpureclaim_scope_begin();
  OK(cuMemAlloc(&o, orphan_bytes));
  cr_assert_eq(gpureclaim_scope_end(sc, 0), 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 1);
}

/* After the capture: a release frees what the refused one would have. */
static void release_after(void) {
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_gt(r.orphaned_bytes, 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 0);
  cr_assert_eq(pool_reserved(), 0);
}

Test(capture, api_release_is_refused) {
  CUcontext ctx = h_cuda_start(0);
  cache_and_orphan(1 * MiB);
  cap_t c = {.no_mode = false};
  pthread_t t = capture_start(&c, ctx);
  uint64_t calls = unsafe_calls(), rel = h_grs(-1).releases;
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &r), -EBUSY);
  cr_assert_eq(unsafe_calls(), calls, "the release made capture-unsafe calls");
  cr_assert_eq(r.orphaned_bytes + r.cached_bytes, 0);
  cr_assert_eq(h_grs(-1).releases, rel);
  cr_assert_eq(h_grs(-1).orphan_blocks, 1);
  cr_assert_geq(pool_reserved(), 8 * MiB);
  capture_end(&c, t);
  release_after();
}

/* The same through the mode-less cuStreamBeginCapture, which gpureclaim hooks apart. */
Test(capture, api_release_is_refused_without_mode) {
  CUcontext ctx = h_cuda_start(0);
  cache_and_orphan(1 * MiB);
  cap_t c = {.no_mode = true};
  pthread_t t = capture_start(&c, ctx);
  uint64_t calls = unsafe_calls();
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &r), -EBUSY);
  cr_assert_eq(unsafe_calls(), calls, "the release made capture-unsafe calls");
  cr_assert_eq(h_grs(-1).orphan_blocks, 1);
  capture_end(&c, t);
  release_after();
}

/* The signal's release runs on gpureclaim's worker thread; its refusal is logged on stderr (warning level), which
 * the test reads to know the signal was handled. */
Test(capture, signal_release_is_refused) {
  CUcontext ctx = h_cuda_start(0);
  cache_and_orphan(1 * MiB);
  char path[] = "/tmp/gr_capture_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  cap_t c = {.no_mode = false};
  pthread_t t = capture_start(&c, ctx);
  uint64_t calls = unsafe_calls(), rel = h_grs(-1).releases;
  raise(SIGUSR1);
  bool refused = false;
  while (!refused && h_grs(-1).releases == rel) { /* until the worker handled the signal, one way or the other */
    char buf[4096] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    refused = n > 0 && strstr(buf, "release (signal) refused: a CUDA graph is being captured");
    if (!refused)
      usleep(1000);
  }
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fd);
  cr_assert_eq(unsafe_calls(), calls, "the release made capture-unsafe calls");
  cr_assert_eq(h_grs(-1).releases, rel);
  cr_assert_eq(h_grs(-1).orphan_blocks, 1);
  capture_end(&c, t);
  release_after();
}

/* An allocation that runs out of memory during the capture is not retried after a release: it returns the
 * driver's CUDA_ERROR_OUT_OF_MEMORY unchanged (a stream-ordered one, on a stream that does not capture, is
 * allowed during the capture). */
Test(capture, out_of_memory_is_not_retried) {
  CUcontext ctx = h_cuda_start(0);
  simcuda_set_capacity(0, 100 * MiB);
  cache_and_orphan(80 * MiB);
  cap_t c = {.no_mode = false};
  pthread_t t = capture_start(&c, ctx);
  uint64_t calls = unsafe_calls();
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr b = 0;
  cr_assert_eq(cuMemAllocAsync(&b, 50 * MiB, s), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(unsafe_calls(), calls, "the retry's release made capture-unsafe calls");
  cr_assert_eq(h_grs(-1).oom_retries, 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 1);
  capture_end(&c, t);
  OK(cuMemAllocAsync(&b, 50 * MiB, s)); /* after the capture, the retry releases the orphan */
  cr_assert_eq(h_grs(-1).oom_retries, 1);
  OK(cuMemFreeAsync(b, s));
  OK(cuStreamDestroy(s));
}
