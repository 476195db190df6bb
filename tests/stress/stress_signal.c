/*
 * stress_signal -- a storm of release signals during heavy multithreaded allocation.
 *
 * Under LD_PRELOAD with the simulator: worker threads allocate and free (plain, stream-ordered and scoped
 * blocks, some left as orphans), while a child process sends SIGNALS release signals as fast as it can. At the
 * end nothing crashed or deadlocked (the test's timeout), every signal was handled (coalesced into releases),
 * and gpureclaim's table equals the simulator's live set. Standalone so it also runs under ThreadSanitizer.
 * Usage: stress_signal [threads] [signals]
 */
#include "check.h"
#include "gpureclaim.h"
#include "simcuda.h"

#include <cuda.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

static CUcontext g_ctx;
static _Atomic int g_stop;

static void *worker(void *arg) {
  uint64_t seed = gr_rng_stream((uint64_t)(uintptr_t)arg);
  cuCtxSetCurrent(g_ctx);
  CUdeviceptr live[64] = {0};
  while (!atomic_load(&g_stop)) {
    gr_rng(&seed);
    unsigned i = (unsigned)(seed % 64);
    if (live[i]) {
      CUresult rc = (seed >> 8) & 1 ? cuMemFree(live[i]) : cuMemFreeAsync(live[i], NULL);
      CHECK(rc == CUDA_SUCCESS, "free: %d", rc);
      live[i] = 0;
    } else if ((seed >> 9) % 16 == 0) {
      /* A scope whose block is abandoned: the releases the signals trigger free it. */
      uint64_t s = gpureclaim_scope_begin();
      CUdeviceptr p;
      CHECK(cuMemAlloc(&p, 4096 + (seed >> 20) % 65536) == CUDA_SUCCESS, "scoped alloc");
      gpureclaim_scope_end(s, 0);
    } else {
      size_t n = 512 + (seed >> 24) % (1 << 20);
      CUresult rc = (seed >> 10) & 1 ? cuMemAlloc(&live[i], n) : cuMemAllocAsync(&live[i], n, NULL);
      CHECK(rc == CUDA_SUCCESS, "alloc: %d", rc);
    }
  }
  return NULL; /* blocks still live stay: the final comparison checks them */
}

typedef struct {
  uint64_t *addr;
  size_t n, cap;
} set_t;

static void add(set_t *s, uint64_t a) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    s->addr = realloc(s->addr, s->cap * sizeof *s->addr);
  }
  s->addr[s->n++] = a;
}
static int from_gr(const gpureclaim_block_t *b, void *arg) {
  if (b->kind == GPURECLAIM_KIND_DEVICE || b->kind == GPURECLAIM_KIND_ASYNC)
    add(arg, b->address);
  return 0;
}
static int from_sim(const simcuda_block_t *b, void *arg) {
  if (b->kind == SIMCUDA_DEVICE || b->kind == SIMCUDA_ASYNC)
    add(arg, b->address);
  return 0;
}
static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int nthreads = argc > 1 ? atoi(argv[1]) : 8;
  int nsignals = argc > 2 ? atoi(argv[2]) : 10000;
  CUdevice dev;
  CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "init");
  CHECK(cuDevicePrimaryCtxRetain(&g_ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS, "ctx");
  pthread_t th[64];
  for (int i = 0; i < nthreads; i++)
    th[i] = gr_thread_start(worker, (void *)(uintptr_t)(i + 1));
  pid_t parent = getpid(), child = fork();
  if (child == 0) {
    for (int i = 0; i < nsignals; i++)
      if (kill(parent, SIGUSR1) != 0)
        _exit(1);
    _exit(0);
  }
  int st;
  waitpid(child, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the sender failed");
  /* Let the last signal's release happen while the workers still run, then stop them. The signals are all
   * delivered by now, so a release is due: how long it takes (a first one can free hundreds of thousands of
   * orphans, seconds on a loaded machine) decides nothing; the bound is only a guard against a hang. */
  gpureclaim_stats_t s = {.size = sizeof s};
  for (int i = 0; i < 120000; i++) {
    gpureclaim_stats(-1, &s);
    if (s.releases > 0)
      break;
    usleep(1000);
  }
  CHECK(s.releases > 0, "no release after %d signals", nsignals);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < nthreads; i++)
    gr_thread_join(th[i]);
  /* One more release for the orphans left since the last signal, then the table must equal the driver. */
  gpureclaim_report_t r = {.size = sizeof r};
  CHECK(gpureclaim_release(GPURECLAIM_ORPHANED | GPURECLAIM_CACHED, &r) == 0, "final release");
  set_t a = {0}, b = {0};
  gpureclaim_foreach_block(from_gr, &a);
  simcuda_foreach_block(from_sim, &b);
  if (a.n)
    qsort(a.addr, a.n, sizeof *a.addr, cmp);
  if (b.n)
    qsort(b.addr, b.n, sizeof *b.addr, cmp);
  CHECK(a.n > 0, "nothing live to compare");
  CHECK(a.n == b.n && (a.n == 0 || memcmp(a.addr, b.addr, a.n * sizeof *a.addr) == 0),
        "table (%zu blocks) differs from the simulator (%zu blocks)", a.n, b.n);
  gpureclaim_stats(-1, &s);
  CHECK(s.orphan_blocks == 0, "%llu orphans left", (unsigned long long)s.orphan_blocks);
  printf("stress_signal: %d threads, %d signals: %llu releases, %llu blocks live, %llu frees, table exact\n",
         nthreads, nsignals, (unsigned long long)s.releases, (unsigned long long)a.n,
         (unsigned long long)s.total_frees);
  free(a.addr);
  free(b.addr);
  return 0;
}
