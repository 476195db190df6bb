/*
 * inference -- a C inference server that loads and unloads "models" in a loop. Linked with -lgpureclaim (before
 * the CUDA libraries); no preload needed. Each model is loaded inside a scope; unloading ends the scope with
 * GPURECLAIM_FREE_NOW, so whatever the loader forgot to free goes too and memory stays flat.
 *     build/examples/inference [iterations]
 * Exits 1 if live memory after an unload ever exceeds what it was after the first one, 2 on bad usage or when
 * the model cannot be loaded.
 */
#include "gpureclaim.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024)

static const char g_usage[] = "usage: inference [ITERATIONS]  (a whole number from 1 to 1000000; default 20)\n";

/* A loader with a leak, as real ones have: it frees its staging buffer but forgets the layer buffers. What
 * failed is returned, for its message. */
static cudaError_t load_model(int layers, void **keep) {
  void *staging;
  cudaError_t err = cudaMalloc(&staging, 64 * MiB);
  for (int i = 0; err == cudaSuccess && i < layers; i++)
    err = cudaMalloc(&keep[i], (size_t)(8 + i) * MiB);
  if (err == cudaSuccess)
    cudaFree(staging);
  return err;
}

int main(int argc, char **argv) {
  long iterations = 20;
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(g_usage, stdout);
    return 0;
  }
  if (argc > 1) { /* strictly a number: atoi() made "--help" or "ten" zero model loads, and a success */
    char *end;
    errno = 0;
    iterations = strtol(argv[1], &end, 10);
    if (argc > 2 || errno || end == argv[1] || *end || iterations < 1 || iterations > 1000000) {
      fprintf(stderr, "inference: bad arguments\n%s", g_usage);
      return 2;
    }
  }
  uint64_t baseline = 0;
  void *layers[16];
  for (long it = 0; it < iterations; it++) {
    uint64_t scope = gpureclaim_scope_begin();
    if (!scope) {
      fprintf(stderr, "inference: gpureclaim_scope_begin() failed (is gpureclaim linked and enabled?)\n");
      return 2;
    }
    cudaError_t err = load_model(16, layers);
    if (err != cudaSuccess) {
      fprintf(stderr, "inference: cannot load the model: %s (%s)\n", cudaGetErrorString(err),
              cudaGetErrorName(err));
      return 2;
    }
    /* ... serve requests with the model ... */
    gpureclaim_scope_end(scope, GPURECLAIM_FREE_NOW); /* unload: every block of the model goes */
    gpureclaim_stats_t s = {.size = sizeof s}; /* .size first: without it the call fails (-EINVAL) */
    int rc = gpureclaim_stats(-1, &s);
    if (rc != 0) {
      fprintf(stderr, "inference: gpureclaim_stats: %s\n", strerror(-rc));
      return 1;
    }
    if (it == 0)
      baseline = s.live_bytes;
    printf("iteration %2ld: live %6.1f MiB, released so far %8.1f MiB\n", it, (double)s.live_bytes / MiB,
           (double)s.released_bytes / MiB);
    if (s.live_bytes > baseline) {
      fprintf(stderr, "inference: memory grew: %llu > %llu bytes\n", (unsigned long long)s.live_bytes,
              (unsigned long long)baseline);
      return 1;
    }
  }
  printf("memory stayed flat over %ld model loads\n", iterations);
  return 0;
}
