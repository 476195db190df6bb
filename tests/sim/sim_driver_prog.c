/*
 * sim_driver_prog.c -- the shape of a C inference binary linked with -lcuda: initialise, take the primary
 * context, allocate a few blocks, print them, free them, exit 0. Its output is reproducible: running it twice
 * must print the same addresses (the determinism test compares two runs).
 * Usage: sim_driver_prog [nblocks [bytes]]
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                                           \
  do {                                                                                                        \
    CUresult r_ = (call);                                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                                                 \
      const char *n_ = NULL;                                                                                  \
      cuGetErrorName(r_, &n_);                                                                                \
      fprintf(stderr, "%s failed: %d %s\n", #call, (int)r_, n_ ? n_ : "?");                                   \
      return 1;                                                                                               \
    }                                                                                                         \
  } while (0)

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  size_t bytes = argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)1 << 20;
  if (n < 1 || n > 1024 || bytes == 0) {
    fprintf(stderr, "usage: %s [nblocks 1..1024 [bytes]]\n", argv[0]);
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p[1024];
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  for (int i = 0; i < n; i++) {
    CHECK(cuMemAlloc(&p[i], bytes * (size_t)(i + 1)));
    printf("block %d: %#llx %zu\n", i, (unsigned long long)p[i], bytes * (size_t)(i + 1));
  }
  CHECK(cuMemFree(p[0]));
  CHECK(cuMemAlloc(&p[0], bytes)); /* a freed address is handed out again */
  printf("reused: %#llx\n", (unsigned long long)p[0]);
  for (int i = 0; i < n; i++) CHECK(cuMemFree(p[i]));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
