/* h_cuda_start (harness.h), in its own object of the harness library: it calls the driver by name, which only
 * the tests linked with the driver may do (the dlsym route's test is not). */
#include "harness.h"

#include <criterion/criterion.h>

CUcontext h_cuda_start(int device) {
  CUdevice dev;
  CUcontext ctx;
  cr_assert_eq(cuInit(0), CUDA_SUCCESS, "cuInit");
  cr_assert_eq(cuDeviceGet(&dev, device), CUDA_SUCCESS, "cuDeviceGet(%d)", device);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
  cr_assert_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS, "cuCtxSetCurrent");
  return ctx;
}
