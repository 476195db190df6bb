/*
 * sim_static_prog.c -- a program linked against the simulated static runtime (libcudart_static.a, nvcc's
 * default), like an nvcc-built binary: it calls cudaMalloc, then checks through the simulator's inspection
 * entry point (reached with dlopen(RTLD_NOLOAD), since the program itself does not link libcuda) that the
 * driver holds the block. Exit 0 when it does.
 */
#define _GNU_SOURCE
#include "simcuda.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*stats_fn)(int, CUcontext, simcuda_stats_t *);
typedef int (*foreach_fn)(int (*)(const simcuda_block_t *, void *), void *);

static int find_block(const simcuda_block_t *b, void *arg) {
  return b->kind == SIMCUDA_DEVICE && b->address == (uint64_t)(uintptr_t)arg;
}

int main(void) {
  void *p = NULL;
  const size_t bytes = 3u << 20;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    printf("cudaMalloc failed: %s\n", cudaGetErrorName(e));
    return 1;
  }
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) {
    printf("libcuda.so.1 is not loaded after cudaMalloc: %s\n", dlerror());
    return 1;
  }
  stats_fn stats = (stats_fn)dlsym(h, "simcuda_stats");
  foreach_fn each = (foreach_fn)dlsym(h, "simcuda_foreach_block");
  if (!stats || !each) {
    printf("the loaded libcuda.so.1 is not the simulator (no simcuda_stats)\n");
    return 1;
  }
  simcuda_stats_t st = {.size = sizeof st};
  CUresult r = stats(-1, NULL, &st);
  if (r != CUDA_SUCCESS || st.live_blocks != 1 || st.live_bytes != bytes) {
    printf("simulator shows %llu blocks / %llu bytes (r=%d), expected 1 / %zu\n", (unsigned long long)st.live_blocks,
           (unsigned long long)st.live_bytes, (int)r, bytes);
    return 1;
  }
  if (!each(find_block, p)) {
    printf("block %p not among the simulator's blocks\n", p);
    return 1;
  }
  if ((e = cudaFree(p)) != cudaSuccess) {
    printf("cudaFree failed: %s\n", cudaGetErrorName(e));
    return 1;
  }
  if (stats(-1, NULL, &st) != CUDA_SUCCESS || st.live_blocks != 0) {
    printf("block still live after cudaFree\n");
    return 1;
  }
  printf("ok: cudaMalloc from the static runtime reached the simulator (%p, %zu bytes)\n", p, bytes);
  return 0;
}
