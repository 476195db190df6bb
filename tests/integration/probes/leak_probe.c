/* leak_probe: allocates from load_model() and exits without freeing: the leak report at exit must name them. */
#include <cuda.h>
#include <stdio.h>

__attribute__((noinline)) void load_model(CUdeviceptr *p, int n);
__attribute__((noinline)) void load_model(CUdeviceptr *p, int n) {
  for (int i = 0; i < n; i++)
    if (cuMemAlloc(&p[i], (size_t)(i + 1) << 20) != CUDA_SUCCESS)
      fprintf(stderr, "leak_probe: allocation failed\n");
  __asm__ volatile("" ::: "memory"); /* no tail call: the caller address stays in load_model */
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  CUdeviceptr p[3], q;
  load_model(p, 3);
  cuMemAlloc(&q, 4096);
  cuMemFree(q);
  return 0; /* p[] leaks */
}
