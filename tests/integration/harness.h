/*
 * harness.h -- shared by the interposition tests: the driver entry points as reached through one route, and
 * a check that gpureclaim's table equals the simulator's own inspection.
 */
#ifndef GR_TEST_HARNESS_H
#define GR_TEST_HARNESS_H

#include "gpureclaim.h"
#include "simcuda.h"

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every driver function a scenario uses, filled by one route. */
typedef struct drv_api {
  const char *route;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, CUdevice);
  CUresult (*cuCtxCreate_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
  CUresult (*cuCtxCreate_v4)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
  CUresult (*cuCtxDestroy)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxAttach)(CUcontext *, unsigned);
  CUresult (*cuCtxDetach)(CUcontext);
  CUresult (*cuGLCtxCreate)(CUcontext *, unsigned, CUdevice);
  CUresult (*cuVDPAUCtxCreate)(CUcontext *, unsigned, CUdevice, uint32_t, void *);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuStreamCreate)(CUstream *, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
  CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
  CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
  CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
  CUresult (*cuMemAllocHost)(void **, size_t);
  CUresult (*cuMemFreeHost)(void *);
  CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
  CUresult (*cuMemPoolDestroy)(CUmemoryPool);
  CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
} drv_api_t;

/* cuInit, then device's primary context retained and made current (asserting each step); returns it. */
CUcontext h_cuda_start(int device);

/* The simulated libcuda.so.1 (loaded already), for simcuda_* and for dlsym routes. */
void *h_libcuda(void);
/* Fills api by dlsym() of the driver's exported names from handle (route 2). */
void h_fill_dlsym(drv_api_t *api, void *handle);
/* Fills api through cuGetProcAddress_v2 (route 3), itself obtained with getter (as the runtime does:
 * "cuGetProcAddress" asked for at 12000 through the first one). */
void h_fill_procaddr(drv_api_t *api, void *handle);

/* Compares gpureclaim's blocks with the simulator's: same set of (kind, address) with the same size, device and
 * context, and gpureclaim_stats() agreeing with simcuda_stats(). On a difference it prints both sides and
 * returns false. `what` names the step for the message. */
bool h_table_matches_sim(const char *what);
/* simcuda_stats() of device (-1: all) and ctx (NULL: any), asserted to succeed. */
simcuda_stats_t h_sim(int device, CUcontext ctx);
/* gpureclaim_stats() of device (-1: all), asserted to succeed. */
gpureclaim_stats_t h_grs(int device);
/* Number of blocks gpureclaim tracks now, by kind (0: all). */
size_t h_count(int kind);
/* The block gpureclaim tracks at address (any kind); false if none. */
bool h_find(uint64_t address, gpureclaim_block_t *out);

/* A stand-in for a framework allocator: standin_alloc of libc10_cuda_standin.so, a library whose file name says
 * it is PyTorch's (its blocks must never become orphans). Fails the test when it cannot be loaded. */
typedef CUresult (*h_fw_alloc_t)(CUdeviceptr *, size_t);
h_fw_alloc_t h_framework_alloc(void);

/* Runs every entry point of api through a life cycle, checking the table against the simulator after every
 * step. Returns the number of checks made; fails the Criterion test on a mismatch. */
int h_scenario(const drv_api_t *api);

#endif
