/* A C/C++ inference binary linked with -lgpureclaim before -lcuda, without LD_PRELOAD. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdlib.h>

Test(linked, tracked_without_preload) {
  cr_assert_null(getenv("LD_PRELOAD"), "this test runs without the preload");
  CUdevice dev;
  CUcontext ctx;
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cuDeviceGet(&dev, 0);
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  CUdeviceptr p;
  cr_assert_eq(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  cr_assert_eq(h_count(GPURECLAIM_KIND_DEVICE), 1);
  cr_assert(h_table_matches_sim("linked alloc"));
  cr_assert_eq(cuMemFree(p), CUDA_SUCCESS);
  cr_assert_eq(h_count(0), 0);
  cr_assert(h_table_matches_sim("linked free"));
}
