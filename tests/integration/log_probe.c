/* log_probe: a release of each kind that writes to GPURECLAIM_LOG on the calling thread: the retry of an
 * allocation that ran out of memory, then gpureclaim_release(). Prints "oom=R release=R" and exits 0. */
#include "gpureclaim.h"

#include <cuda.h>
#include <stdio.h>

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  CUdeviceptr p;
  CUresult oom = cuMemAlloc(&p, (size_t)1 << 50); /* more than the simulated device has */
  gpureclaim_report_t r = {.size = sizeof r};
  int rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
  printf("oom=%d release=%d\n", (int)oom, rc);
  return 0;
}
