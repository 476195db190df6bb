/* Route 1: a program linked with -lcuda calls the driver's exported names directly (a C inference binary).
 * Run with gpureclaim preloaded (and, in test_linked, linked before libcuda instead). */
#define CUDA_ENABLE_DEPRECATED 1 /* cuCtxAttach and cuCtxDetach: deprecated, still exported and wrapped */
#include "harness.h"

#include <criterion/criterion.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Exported names cuda.h declares only for the driver's own build. */
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v3(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
/* cudaGL.h's and cudaVDPAU.h's (which need the graphics headers). */
CUresult cuGLCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuVDPAUCtxCreate_v2(CUcontext *, unsigned int, CUdevice, uint32_t, void *);

static void fill_linked(drv_api_t *a) {
  *a = (drv_api_t){
      .route = "exported symbols",
      .cuInit = cuInit,
      .cuDeviceGet = cuDeviceGet,
      .cuDevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain,
      .cuDevicePrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2,
      .cuDevicePrimaryCtxReset = cuDevicePrimaryCtxReset_v2,
      .cuCtxSetCurrent = cuCtxSetCurrent,
      .cuCtxGetCurrent = cuCtxGetCurrent,
      .cuCtxCreate_v2 = cuCtxCreate_v2,
      .cuCtxCreate_v3 = cuCtxCreate_v3,
      .cuCtxCreate_v4 = cuCtxCreate_v4,
      .cuCtxDestroy = cuCtxDestroy_v2,
      .cuCtxPopCurrent = cuCtxPopCurrent_v2,
      .cuCtxPushCurrent = cuCtxPushCurrent_v2,
      .cuCtxAttach = cuCtxAttach,
      .cuCtxDetach = cuCtxDetach,
      .cuGLCtxCreate = cuGLCtxCreate_v2,
      .cuVDPAUCtxCreate = cuVDPAUCtxCreate_v2,
      .cuCtxSynchronize = cuCtxSynchronize,
      .cuStreamCreate = cuStreamCreate,
      .cuStreamDestroy = cuStreamDestroy_v2,
      .cuMemAlloc = cuMemAlloc_v2,
      .cuMemAllocPitch = cuMemAllocPitch_v2,
      .cuMemAllocManaged = cuMemAllocManaged,
      .cuMemFree = cuMemFree_v2,
      .cuMemAllocAsync = cuMemAllocAsync,
      .cuMemAllocAsync_ptsz = cuMemAllocAsync_ptsz,
      .cuMemAllocFromPoolAsync = cuMemAllocFromPoolAsync,
      .cuMemAllocFromPoolAsync_ptsz = cuMemAllocFromPoolAsync_ptsz,
      .cuMemFreeAsync = cuMemFreeAsync,
      .cuMemFreeAsync_ptsz = cuMemFreeAsync_ptsz,
      .cuMemHostAlloc = cuMemHostAlloc,
      .cuMemAllocHost = cuMemAllocHost_v2,
      .cuMemFreeHost = cuMemFreeHost,
      .cuMemGetAllocationGranularity = cuMemGetAllocationGranularity,
      .cuMemCreate = cuMemCreate,
      .cuMemRelease = cuMemRelease,
      .cuMemMap = cuMemMap,
      .cuMemUnmap = cuMemUnmap,
      .cuMemAddressReserve = cuMemAddressReserve,
      .cuMemAddressFree = cuMemAddressFree,
      .cuMemPoolCreate = cuMemPoolCreate,
      .cuMemPoolDestroy = cuMemPoolDestroy,
      .cuMemPoolTrimTo = cuMemPoolTrimTo,
      .cuDeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool,
  };
}

Test(route_driver, every_entry_point_tracked_exactly) {
  drv_api_t a;
  fill_linked(&a);
  cr_assert_gt(h_scenario(&a), 20);
}

Test(route_driver, blocks_are_attributed_to_the_calling_binary) {
  drv_api_t a;
  fill_linked(&a);
  CUdevice dev;
  CUcontext ctx;
  cr_assert_eq(a.cuInit(0), CUDA_SUCCESS);
  a.cuDeviceGet(&dev, 0);
  a.cuDevicePrimaryCtxRetain(&ctx, dev);
  a.cuCtxSetCurrent(ctx);
  CUdeviceptr p;
  cr_assert_eq(a.cuMemAlloc(&p, 1234), CUDA_SUCCESS);
  gpureclaim_block_t b;
  cr_assert(h_find(p, &b));
  cr_assert_str_eq(b.api, "cuMemAlloc_v2");
  cr_assert_not_null(strstr(b.library, "test_route_driver"), "library %s", b.library);
  cr_assert_null(b.owner);
  cr_assert_gt(b.thread_id, 0);
  cr_assert_gt(b.alloc_time_ms, 0);
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A block's time comes from a tick gpureclaim's thread advances while the process allocates, not from a clock
 * read per allocation: it must still be the allocation's time, in a burst of allocations and after an idle
 * second (when the thread stops ticking). Bounds are generous: a tick is 4 ms. */
Test(route_driver, allocation_times_follow_the_clock_in_bursts_and_after_idle_periods) {
  drv_api_t a;
  fill_linked(&a);
  CUdevice dev;
  CUcontext ctx;
  cr_assert_eq(a.cuInit(0), CUDA_SUCCESS);
  a.cuDeviceGet(&dev, 0);
  a.cuDevicePrimaryCtxRetain(&ctx, dev);
  a.cuCtxSetCurrent(ctx);
  CUdeviceptr first, p;
  uint64_t t0 = mono_ms();
  cr_assert_eq(a.cuMemAlloc(&first, 512), CUDA_SUCCESS);
  gpureclaim_block_t b0, b1, b2;
  cr_assert(h_find(first, &b0));
  cr_assert_leq(b0.alloc_time_ms, mono_ms(), "never later than the clock");
  cr_assert_geq(b0.alloc_time_ms + 1000, t0, "the time of the allocation, not of an earlier tick");
  /* A burst of 300 ms: the ticks move on under it. */
  do {
    cr_assert_eq(a.cuMemAlloc(&p, 512), CUDA_SUCCESS);
    cr_assert_eq(a.cuMemFree(p), CUDA_SUCCESS);
  } while (mono_ms() - t0 < 300);
  cr_assert_eq(a.cuMemAlloc(&p, 512), CUDA_SUCCESS);
  cr_assert(h_find(p, &b1));
  cr_assert_geq(b1.alloc_time_ms, b0.alloc_time_ms + 150, "%llu then %llu", (unsigned long long)b0.alloc_time_ms,
                (unsigned long long)b1.alloc_time_ms);
  cr_assert_leq(b1.alloc_time_ms, mono_ms());
  cr_assert_eq(a.cuMemFree(p), CUDA_SUCCESS);
  /* Idle for 2.5 s: the thread stops ticking after a second (a tick left standing would be 1.5 s stale); the
   * next block's time is still its own. */
  usleep(2500 * 1000);
  uint64_t t2 = mono_ms();
  cr_assert_eq(a.cuMemAlloc(&p, 512), CUDA_SUCCESS);
  cr_assert(h_find(p, &b2));
  cr_assert_geq(b2.alloc_time_ms, b1.alloc_time_ms + 2000, "%llu then %llu",
                (unsigned long long)b1.alloc_time_ms, (unsigned long long)b2.alloc_time_ms);
  cr_assert_geq(b2.alloc_time_ms + 1000, t2);
  cr_assert_leq(b2.alloc_time_ms, mono_ms());
  cr_assert_eq(a.cuMemFree(p), CUDA_SUCCESS);
  cr_assert_eq(a.cuMemFree(first), CUDA_SUCCESS);
}

Test(route_driver, frees_of_unknown_pointers_reach_the_driver_unchanged) {
  drv_api_t a;
  fill_linked(&a);
  CUdevice dev;
  CUcontext ctx;
  a.cuInit(0);
  a.cuDeviceGet(&dev, 0);
  a.cuDevicePrimaryCtxRetain(&ctx, dev);
  a.cuCtxSetCurrent(ctx);
  uint64_t before = simcuda_calls("cuMemFree_v2");
  CUresult rc = a.cuMemFree((CUdeviceptr)0x1234000);
  cr_assert_eq(rc, CUDA_ERROR_INVALID_VALUE, "the driver's code comes back: %d", rc);
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), before + 1, "the free reached the driver");
  gpureclaim_stats_t s = {.size = sizeof s};
  gpureclaim_stats(-1, &s);
  cr_assert_eq(s.untracked_frees, 1);
  CUdeviceptr p;
  a.cuMemAlloc(&p, 100);
  cr_assert_eq(a.cuMemFree(p), CUDA_SUCCESS);
  cr_assert_eq(a.cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "a double free is the driver's business");
  cr_assert(h_table_matches_sim("double free"));
}

Test(route_driver, a_refused_free_keeps_the_block_tracked) {
  drv_api_t a;
  fill_linked(&a);
  CUdevice dev;
  CUcontext ctx;
  a.cuInit(0);
  a.cuDeviceGet(&dev, 0);
  a.cuDevicePrimaryCtxRetain(&ctx, dev);
  a.cuCtxSetCurrent(ctx);
  CUdeviceptr p;
  a.cuMemAlloc(&p, 4096);
  simcuda_inject("cuMemFree_v2", CUDA_ERROR_LAUNCH_FAILED, 1);
  cr_assert_eq(a.cuMemFree(p), CUDA_ERROR_LAUNCH_FAILED);
  cr_assert(h_table_matches_sim("refused free"), "the block is still there");
  cr_assert_eq(a.cuMemFree(p), CUDA_SUCCESS);
  cr_assert(h_table_matches_sim("second free"));
}

Test(route_driver, failed_allocations_are_not_tracked_and_return_the_drivers_code) {
  drv_api_t a;
  fill_linked(&a);
  CUdevice dev;
  CUcontext ctx;
  a.cuInit(0);
  a.cuDeviceGet(&dev, 0);
  a.cuDevicePrimaryCtxRetain(&ctx, dev);
  a.cuCtxSetCurrent(ctx);
  CUdeviceptr p = 0xdead;
  cr_assert_eq(a.cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(p, 0xdead, "out-parameters of a failed call untouched");
  simcuda_inject("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 5);
  cr_assert_eq(a.cuMemAlloc(&p, 64), CUDA_ERROR_OUT_OF_MEMORY);
  simcuda_inject(NULL, CUDA_SUCCESS, 0);
  cr_assert_eq(h_count(0), 0);
  cr_assert(h_table_matches_sim("failed allocations"));
}
