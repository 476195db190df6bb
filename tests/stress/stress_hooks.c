/*
 * stress_hooks -- threads allocating and freeing through the driver (plain, stream-ordered, pinned, scoped)
 * while another thread iterates the table and writes snapshots. At the end gpureclaim's table equals the
 * simulator's live set exactly. Standalone (runs under ThreadSanitizer). Usage: stress_hooks [threads] [seconds]
 *
 * The snapshots go into a FIFO in the test's run directory ($GPURECLAIM_RUNDIR), drained by a thread of its
 * own: the writer's path for devices and FIFOs, with no disk write per iteration, and a writer that broke would
 * replace the test's own FIFO (checked at the end), never a file of the machine's.
 */
#include "check.h"
#include "gpureclaim.h"
#include "simcuda.h"

#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static CUcontext g_ctx;
static _Atomic int g_stop, g_drain_stop;
static _Atomic uint64_t g_ops, g_iterations, g_drained;
static char g_fifo[4200];
static int g_fifo_rd = -1;

static void *worker(void *arg) {
  uint64_t seed = gr_rng_stream((uint64_t)(uintptr_t)arg);
  cuCtxSetCurrent(g_ctx);
  CUdeviceptr d[32] = {0};
  void *h[8] = {0};
  while (!atomic_load(&g_stop)) {
    gr_rng(&seed);
    unsigned i = (unsigned)(seed % 32), k = (unsigned)((seed >> 8) % 8);
    switch ((seed >> 16) % 4) {
    case 0:
      if (d[i]) {
        CHECK(((seed >> 20) & 1 ? cuMemFree(d[i]) : cuMemFreeAsync(d[i], NULL)) == CUDA_SUCCESS, "free");
        d[i] = 0;
      } else {
        CHECK(((seed >> 21) & 1 ? cuMemAlloc(&d[i], 512 + (seed >> 30) % 100000)
                                : cuMemAllocAsync(&d[i], 512 + (seed >> 30) % 100000, NULL)) == CUDA_SUCCESS,
              "alloc");
      }
      break;
    case 1:
      if (h[k]) {
        CHECK(cuMemFreeHost(h[k]) == CUDA_SUCCESS, "free host");
        h[k] = NULL;
      } else {
        CHECK(cuMemHostAlloc(&h[k], 4096, 0) == CUDA_SUCCESS, "host alloc");
      }
      break;
    case 2: { /* a scope whose blocks are freed at its end */
      uint64_t s = gpureclaim_scope_begin();
      CUdeviceptr p;
      CHECK(cuMemAlloc(&p, 8192) == CUDA_SUCCESS, "scoped alloc");
      CHECK(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW) == 0, "scope end");
      break;
    }
    default: {
      gpureclaim_stats_t st = {.size = sizeof st};
      CHECK(gpureclaim_stats(-1, &st) == 0, "stats");
    }
    }
    atomic_fetch_add(&g_ops, 1);
  }
  return NULL; /* what is live stays: the final comparison checks it */
}

static int count(const gpureclaim_block_t *b, void *arg) {
  (void)b;
  ++*(uint64_t *)arg;
  return 0;
}

static void *observer(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    uint64_t n = 0;
    CHECK(gpureclaim_foreach_block(count, &n) == 0, "foreach");
    CHECK(gpureclaim_snapshot(g_fifo) == 0, "snapshot");
    atomic_fetch_add(&g_iterations, 1);
  }
  return NULL;
}

/* Reads what the snapshots write into the FIFO, so that every write finds a reader with room. */
static void *drain(void *arg) {
  (void)arg;
  char buf[65536];
  while (!atomic_load(&g_drain_stop)) {
    struct pollfd p = {g_fifo_rd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    ssize_t n = read(g_fifo_rd, buf, sizeof buf);
    if (n > 0)
      atomic_fetch_add(&g_drained, (uint64_t)n);
  }
  return NULL;
}

/* The FIFO, in a directory of its own inside the run directory (whose other files are the library's). */
static void make_fifo(void) {
  const char *rundir = getenv("GPURECLAIM_RUNDIR");
  CHECK(rundir && *rundir == '/', "GPURECLAIM_RUNDIR is not set (tests/run_test.sh sets it)");
  char dir[4100];
  snprintf(dir, sizeof dir, "%s/stress_hooks.out", rundir);
  CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", dir, strerror(errno));
  snprintf(g_fifo, sizeof g_fifo, "%s/snapshots.fifo", dir);
  unlink(g_fifo);
  CHECK(mkfifo(g_fifo, 0600) == 0, "mkfifo %s: %s", g_fifo, strerror(errno));
  /* The read end stays open throughout (non-blocking: opening it needs no writer). */
  g_fifo_rd = open(g_fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  CHECK(g_fifo_rd >= 0, "open %s: %s", g_fifo, strerror(errno));
}

typedef struct {
  uint64_t a[65536];
  size_t n;
} set_t;
static int from_gr(const gpureclaim_block_t *b, void *arg) {
  set_t *s = arg;
  if (s->n < 65536)
    s->a[s->n++] = b->address ^ ((uint64_t)b->kind << 60);
  return 0;
}
static int from_sim(const simcuda_block_t *b, void *arg) {
  set_t *s = arg;
  if (s->n < 65536)
    s->a[s->n++] = b->address ^ ((uint64_t)b->kind << 60);
  return 0;
}
static int cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  double secs = argc > 2 ? atof(argv[2]) : 2;
  CUdevice dev;
  CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
            cuDevicePrimaryCtxRetain(&g_ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS,
        "init");
  make_fifo();
  pthread_t th[64], ob, dr;
  dr = gr_thread_start(drain, NULL);
  for (int i = 0; i < n; i++)
    th[i] = gr_thread_start(worker, (void *)(uintptr_t)(i + 1));
  ob = gr_thread_start(observer, NULL);
  nanosleep(&(struct timespec){(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)}, NULL);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < n; i++)
    gr_thread_join(th[i]);
  gr_thread_join(ob);
  atomic_store(&g_drain_stop, 1);
  gr_thread_join(dr);
  struct stat st;
  CHECK(lstat(g_fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the snapshot writer replaced the FIFO %s", g_fifo);
  CHECK(atomic_load(&g_drained) > 0, "no snapshot reached the FIFO");
  close(g_fifo_rd);
  unlink(g_fifo);
  set_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  gpureclaim_foreach_block(from_gr, a);
  simcuda_foreach_block(from_sim, b);
  CHECK(a->n > 0, "nothing live to compare");
  qsort(a->a, a->n, sizeof a->a[0], cmp);
  qsort(b->a, b->n, sizeof b->a[0], cmp);
  CHECK(a->n == b->n && !memcmp(a->a, b->a, a->n * sizeof a->a[0]), "table %zu blocks, simulator %zu", a->n, b->n);
  printf("stress_hooks: %d threads, %.1fs: %llu operations, %llu iterations+snapshots, %zu blocks live, table exact\n",
         n, secs, (unsigned long long)atomic_load(&g_ops), (unsigned long long)atomic_load(&g_iterations), a->n);
  free(a);
  free(b);
  return 0;
}
