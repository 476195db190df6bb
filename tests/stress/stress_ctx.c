/*
 * stress_ctx -- contexts destroyed (or refused destruction) while other threads allocate and free in them and a
 * release frees orphans. After each round gpureclaim's records equal the simulator's live blocks: no record
 * outlives a block its context took with it, none is lost for a block the driver kept. Standalone (runs under
 * ThreadSanitizer). Usage: stress_ctx [threads] [rounds]
 */
#include "check.h"
#include "gpureclaim.h"
#include "simcuda.h"

#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

typedef struct {
  CUcontext ctx;
  _Atomic int started;
} round_t;

/* Allocates and frees in the round's context (some blocks abandoned in scopes) until the context is gone. */
static void *worker(void *arg) {
  round_t *r = arg;
  if (cuCtxSetCurrent(r->ctx) != CUDA_SUCCESS)
    return NULL;
  CUdeviceptr d[16] = {0};
  uint64_t seed = gr_rng_stream((uint64_t)(uintptr_t)&d);
  for (int n = 0; n < 100000; n++) {
    gr_rng(&seed);
    unsigned i = (unsigned)(seed % 16);
    if (n == 32)
      atomic_fetch_add(&r->started, 1);
    if (d[i]) {
      if (cuMemFree(d[i]) != CUDA_SUCCESS && n > 32)
        break; /* the context went with the block */
      d[i] = 0;
    } else if ((seed >> 8) % 4 == 0) {
      uint64_t s = gpureclaim_scope_begin();
      CUdeviceptr p;
      CUresult rc = cuMemAlloc(&p, 512 + (seed >> 20) % 8192);
      gpureclaim_scope_end(s, 0);
      if (rc != CUDA_SUCCESS)
        break;
    } else if (cuMemAlloc(&d[i], 512 + (seed >> 20) % 8192) != CUDA_SUCCESS) {
      break;
    }
  }
  return NULL;
}

static void *releaser(void *arg) {
  _Atomic int *stop = arg;
  while (!atomic_load(stop)) {
    gpureclaim_report_t rep = {.size = sizeof rep};
    CHECK(gpureclaim_release(GPURECLAIM_ORPHANED, &rep) == 0, "release");
    sched_yield();
  }
  return NULL;
}

static int print_block(const gpureclaim_block_t *b, void *arg) {
  (void)arg;
  fprintf(stderr, "stress_ctx: left: %#llx %llu B kind %d state %d ctx %p thread %u scope %#llx\n",
          (unsigned long long)b->address, (unsigned long long)b->bytes, b->kind, b->state, b->context,
          b->thread_id, (unsigned long long)b->scope);
  return 0;
}

static uint64_t tracked_blocks(void) {
  gpureclaim_stats_t s = {.size = sizeof s};
  CHECK(gpureclaim_stats(-1, &s) == 0, "stats");
  return s.live_blocks + s.orphan_blocks;
}

static uint64_t sim_blocks(CUcontext ctx) {
  simcuda_stats_t s = {.size = sizeof s};
  CHECK(simcuda_stats(-1, ctx, &s) == CUDA_SUCCESS, "simcuda_stats");
  return s.live_blocks;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 3, rounds = argc > 2 ? atoi(argv[2]) : 30;
  CUdevice dev;
  CHECK(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "init");
  CHECK(threads > 0 && threads <= 64, "threads 1..64");
  for (int round = 0; round < rounds; round++) {
    round_t r = {0};
    CHECK(cuCtxCreate_v2(&r.ctx, 0, dev) == CUDA_SUCCESS, "create");
    CHECK(cuCtxPopCurrent(NULL) == CUDA_SUCCESS, "pop");
    _Atomic int stop = 0;
    pthread_t th[64], rel;
    for (int i = 0; i < threads; i++)
      th[i] = gr_thread_start(worker, &r);
    rel = gr_thread_start(releaser, &stop);
    while (atomic_load(&r.started) < threads)
      sched_yield();
    /* Every other round the driver refuses first: the records must all stay, then all go. */
    if (round % 2)
      CHECK(simcuda_inject("cuCtxDestroy_v2", CUDA_ERROR_INVALID_CONTEXT, 1) == 0, "inject");
    CUresult rc = cuCtxDestroy(r.ctx);
    if (round % 2) {
      CHECK(rc == CUDA_ERROR_INVALID_CONTEXT, "refused destroy returned %d", (int)rc);
      CHECK(cuCtxDestroy(r.ctx) == CUDA_SUCCESS, "destroy");
    } else {
      CHECK(rc == CUDA_SUCCESS, "destroy returned %d", (int)rc);
    }
    for (int i = 0; i < threads; i++)
      gr_thread_join(th[i]);
    atomic_store(&stop, 1);
    gr_thread_join(rel);
    CHECK(sim_blocks(NULL) == 0, "round %d: the simulator holds %llu blocks", round,
          (unsigned long long)sim_blocks(NULL));
    if (tracked_blocks())
      gpureclaim_foreach_block(print_block, NULL);
    CHECK(tracked_blocks() == 0, "round %d: %llu records outlived their blocks", round,
          (unsigned long long)tracked_blocks());
  }
  printf("stress_ctx: %d rounds with %d threads: no record outlived its block\n", rounds, threads);
  return 0;
}
