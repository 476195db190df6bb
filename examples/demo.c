/*
 * demo -- what gpureclaim sees and gives back, in a few seconds. Run it under gpureclaim:
 *     gpureclaim run -- build/examples/demo
 * On the CUDA simulator (no GPU) or a real GPU alike. It keeps model weights (live), leaves 1 GiB cached in a
 * stream-ordered pool (freed, but the pool keeps it, as PyTorch's cudaMallocAsync backend does) and abandons
 * 512 MiB of activations in a scope; a release gives back the last two and never touches the first.
 */
#include "gpureclaim.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024)

static void die(const char *what, cudaError_t e) {
  fprintf(stderr, "demo: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}
#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess)                                                                                 \
      die(#call, e_);                                                                                      \
  } while (0)

static void show(const char *when) {
  gpureclaim_stats_t s = {.size = sizeof s};
  size_t free_b = 0, total = 0;
  cudaMemGetInfo(&free_b, &total);
  int rc = gpureclaim_stats(-1, &s);
  if (rc != 0) {
    printf("%-28s device free %8.1f MiB (%s)\n", when, (double)free_b / MiB,
           !gpureclaim_enabled() ? "gpureclaim is disabled: GPURECLAIM_DISABLE=1" : strerror(-rc));
    return;
  }
  printf("%-28s live %7.1f MiB in %llu blocks | pools hold %7.1f MiB | orphans %6.1f MiB | device free %9.1f MiB\n",
         when, (double)s.live_bytes / MiB, (unsigned long long)s.live_blocks, (double)s.pool_reserved_bytes / MiB,
         (double)s.orphan_bytes / MiB, (double)free_b / MiB);
}

int main(void) {
  void *weights[3], *cached, *acts[4];
  show("start");
  for (int i = 0; i < 3; i++)
    CHECK(cudaMalloc(&weights[i], 256 * MiB));
  show("model weights loaded");

  cudaMemPool_t pool;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep = UINT64_MAX; /* the pool keeps what is freed into it */
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  CHECK(cudaMallocAsync(&cached, 1024 * MiB, 0));
  CHECK(cudaFreeAsync(cached, 0));
  CHECK(cudaDeviceSynchronize());
  show("1 GiB freed into the pool");

  uint64_t scope = gpureclaim_scope_begin();
  for (int i = 0; i < 4; i++)
    CHECK(cudaMalloc(&acts[i], 128 * MiB));
  gpureclaim_scope_end(scope, 0); /* abandoned: never freed by the program */
  show("512 MiB abandoned in a scope");

  gpureclaim_report_t r = {.size = sizeof r};
  int rc = gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &r);
  if (rc == 0)
    printf("\ngpureclaim_release: %.1f MiB back in %.2f ms (pools %.1f MiB, orphans %.1f MiB in %llu blocks); "
           "device %d free %.1f -> %.1f MiB\n\n",
           (double)(r.cached_bytes + r.orphaned_bytes) / MiB, (double)r.duration_ns / 1e6,
           (double)r.pool_bytes / MiB, (double)r.orphaned_bytes / MiB, (unsigned long long)r.orphaned_blocks,
           r.ndevices ? r.devices[0].device : 0, r.ndevices ? (double)r.devices[0].free_before / MiB : 0.0,
           r.ndevices ? (double)r.devices[0].free_after / MiB : 0.0);
  show("after the release");
  for (int i = 0; i < 3; i++)
    CHECK(cudaFree(weights[i])); /* the weights were never touched: still the program's */
  show("weights freed by the program");
  return rc == 0 ? 0 : 1;
}
