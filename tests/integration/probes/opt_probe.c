/* opt_probe: initialises CUDA on the simulator, allocates one block and prints what gpureclaim saw, as one
 * line "enabled=E live_blocks=N rc=R". Used to give options random and malformed values. */
#include "gpureclaim.h"

#include <cuda.h>
#include <stdio.h>

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  CUdeviceptr p;
  if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS)
    return 3;
  gpureclaim_stats_t s = {.size = sizeof s};
  int rc = gpureclaim_stats(-1, &s);
  printf("enabled=%d live_blocks=%llu rc=%d\n", gpureclaim_enabled(), (unsigned long long)s.live_blocks, rc);
  gpureclaim_report_t r = {.size = sizeof r};
  rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
  return cuMemFree(p) == CUDA_SUCCESS && (rc == 0 || !gpureclaim_enabled()) ? 0 : 4;
}
