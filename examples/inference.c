/*
 * inference -- a C inference server that loads and unloads "models" in a loop. Linked with -lgpureclaim (before
 * the CUDA libraries); no preload needed. Each model is loaded inside a scope; unloading ends the scope with
 * GPURECLAIM_FREE_NOW, so whatever the loader forgot to free goes too and memory stays flat.
 *     build/examples/inference [iterations]
 * Exits non-zero if live memory after an unload ever exceeds what it was after the first one.
 */
#include "gpureclaim.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MiB (1024ull * 1024)

/* A loader with a leak, as real ones have: it frees its staging buffer but forgets the layer buffers. */
static int load_model(int layers, void **keep) {
  void *staging;
  if (cudaMalloc(&staging, 64 * MiB) != cudaSuccess)
    return -1;
  for (int i = 0; i < layers; i++)
    if (cudaMalloc(&keep[i], (size_t)(8 + i) * MiB) != cudaSuccess)
      return -1;
  cudaFree(staging);
  return 0;
}

int main(int argc, char **argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 20;
  uint64_t baseline = 0;
  void *layers[16];
  for (int it = 0; it < iterations; it++) {
    uint64_t scope = gpureclaim_scope_begin();
    if (!scope || load_model(16, layers) != 0) {
      fprintf(stderr, "inference: cannot load the model (is gpureclaim linked, is there a device?)\n");
      return 2;
    }
    /* ... serve requests with the model ... */
    gpureclaim_scope_end(scope, GPURECLAIM_FREE_NOW); /* unload: every block of the model goes */
    gpureclaim_stats_t s = {.size = sizeof s};
    gpureclaim_stats(-1, &s);
    if (it == 0)
      baseline = s.live_bytes;
    printf("iteration %2d: live %6.1f MiB, released so far %8.1f MiB\n", it, (double)s.live_bytes / MiB,
           (double)s.released_bytes / MiB);
    if (s.live_bytes > baseline) {
      fprintf(stderr, "inference: memory grew: %llu > %llu bytes\n", (unsigned long long)s.live_bytes,
              (unsigned long long)baseline);
      return 1;
    }
  }
  printf("memory stayed flat over %d model loads\n", iterations);
  return 0;
}
