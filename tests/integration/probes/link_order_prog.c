/* Allocates one block through the driver's exported cuMemAlloc and prints how many blocks gpureclaim tracks.
 * Built twice (CMakeLists.txt): linked -lgpureclaim before -lcuda, and the other way round. */
#include <cuda.h>
#include <gpureclaim.h>
#include <stdio.h>

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
      cuMemAlloc(&p, 4096))
    return 2;
  gpureclaim_stats_t s = {.size = sizeof s};
  int rc = gpureclaim_stats(-1, &s);
  printf("stats %d tracked %llu\n", rc, (unsigned long long)s.live_blocks);
  return cuMemFree(p) == CUDA_SUCCESS ? 0 : 2;
}
