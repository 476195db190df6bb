/*
 * sim_preload.c -- a stand-in for an interposer: preloaded, it defines driver entry points under their
 * exported names, as gpureclaim does. Each definition only counts the call and fails. test_sim_preload
 * drives the simulator through the pointers cuGetProcAddress returns and checks that nothing inside the
 * simulator ever reached these definitions: a real libcuda never binds internally to preloaded names.
 */
#include <cuda.h>
#include <stdatomic.h>

#define PRELOAD_API __attribute__((visibility("default")))

static atomic_int hits;

PRELOAD_API int simpreload_hits(void);

PRELOAD_API int simpreload_hits(void) { return atomic_load(&hits); }

#define STUB(name, params)                                                                                    \
  PRELOAD_API CUresult name params {                                                                          \
    atomic_fetch_add(&hits, 1);                                                                               \
    return CUDA_ERROR_UNKNOWN;                                                                                \
  }

STUB(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))
STUB(cuMemFree_v2, (CUdeviceptr dptr))
STUB(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream))
STUB(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))
STUB(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep))
STUB(cuStreamSynchronize, (CUstream hStream))
STUB(cuCtxSynchronize_v2, (CUcontext ctx))
STUB(cuCtxSetCurrent, (CUcontext ctx))
STUB(cuCtxGetCurrent, (CUcontext * pctx))
STUB(cuMemFreeHost, (void *p))
STUB(cuMemRelease, (CUmemGenericAllocationHandle h))
STUB(cuMemUnmap, (CUdeviceptr ptr, size_t size))
STUB(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))
