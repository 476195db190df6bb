/*
 * sim_bench.c -- what one alloc+free pair costs in the simulator (single thread, median of 7 runs), so
 * gpureclaim's benchmarks know the floor they measure on top of.
 * Usage: sim_bench [ITERS]   ITERS pairs per run (default 200000). Prints figures only: timing on a shared
 * machine decides nothing. Exits 2 when a call failed or a block was left behind.
 */
#define _POSIX_C_SOURCE 200809L
#include "simcuda.h"

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_pair_ns(int async, size_t bytes, int iters) {
  double runs[7];
  for (int r = 0; r < 7; r++) {
    double t0 = now_ns();
    for (int i = 0; i < iters; i++) {
      CUdeviceptr p;
      CUresult e = async ? cuMemAllocAsync(&p, bytes, 0) : cuMemAlloc(&p, bytes);
      if (e == CUDA_SUCCESS) e = async ? cuMemFreeAsync(p, 0) : cuMemFree(p);
      if (e != CUDA_SUCCESS) {
        fprintf(stderr, "alloc/free of %zu bytes failed: %d\n", bytes, (int)e);
        exit(2);
      }
    }
    runs[r] = (now_ns() - t0) / iters;
  }
  qsort(runs, 7, sizeof runs[0], cmp);
  return runs[3];
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 200000;
  if (iters <= 0) {
    fprintf(stderr, "usage: sim_bench [ITERS]\n");
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "simulator setup failed\n");
    return 2;
  }
  static const size_t sizes[] = {512, 4096, 65536, 1u << 20, 64u << 20, 1u << 30};
  printf("%-12s %18s %22s\n", "bytes", "cuMemAlloc+Free ns", "cuMemAllocAsync+Free ns");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double plain = median_pair_ns(0, sizes[i], iters);
    double async = median_pair_ns(1, sizes[i], iters);
    printf("%-12zu %18.1f %22.1f\n", sizes[i], plain, async);
  }
  simcuda_stats_t st = {.size = sizeof st};
  if (simcuda_stats(-1, NULL, &st) != CUDA_SUCCESS || st.live_blocks != 0) {
    fprintf(stderr, "blocks left behind: %llu\n", (unsigned long long)st.live_blocks);
    return 2;
  }
  printf("every pair succeeded\n");
  return 0;
}
