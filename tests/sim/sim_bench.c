/*
 * sim_bench.c -- what one alloc+free pair costs in the simulator (single thread, median of 7 runs), so
 * gpureclaim's benchmarks know the floor they measure on top of.
 * Usage: sim_bench [max_ns]   exits 1 when a cuMemAlloc+cuMemFree median exceeds max_ns (0: never).
 */
#define _POSIX_C_SOURCE 200809L
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
  double max_ns = argc > 1 ? atof(argv[1]) : 0;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "simulator setup failed\n");
    return 2;
  }
  static const size_t sizes[] = {512, 4096, 65536, 1u << 20, 64u << 20, 1u << 30};
  int bad = 0;
  printf("%-12s %18s %22s\n", "bytes", "cuMemAlloc+Free ns", "cuMemAllocAsync+Free ns");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double plain = median_pair_ns(0, sizes[i], 200000);
    double async = median_pair_ns(1, sizes[i], 200000);
    printf("%-12zu %18.1f %22.1f\n", sizes[i], plain, async);
    if (max_ns > 0 && plain > max_ns) bad = 1;
  }
  if (bad) fprintf(stderr, "an alloc+free pair costs more than %.0f ns\n", max_ns);
  return bad;
}
