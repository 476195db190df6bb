/*
 * hooklist.h -- every driver entry point gpureclaim wraps, one line per ABI variant.
 *
 *   X(symbol, base, version, ptsz, body, (params), (args))
 *     symbol   the driver's exported name of this variant, which gpureclaim exports too (route 1)
 *     base     the name cuGetProcAddress is asked for (route 3)
 *     version  the first CUDA version whose cuGetProcAddress returns this variant (cudaTypedefs.h's PFN_*_vNNNNN)
 *     ptsz     1 for the per-thread-default-stream variant (asked for with CU_GET_PROC_ADDRESS_PER_THREAD_...)
 *     body     the function in driver.c that does the work, called with the real pointer and return address
 *
 * Names that cuda.h #defines to a later version (cuCtxCreate -> cuCtxCreate_v4, ...) are #undef'd before this
 * list is expanded, so each line defines exactly the symbol it names (cuMemGetInfo included: its 32-bit
 * variant is the one of that name).
 */
#define GR_DRIVER_HOOKS(X)                                                                                   \
  X(cuInit, "cuInit", 2000, 0, b_init, (unsigned int Flags), (Flags))                                        \
  X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0, b_mem_alloc, (CUdeviceptr * dptr, size_t bytesize), (dptr, bytesize)) \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0, b_mem_alloc_pitch,                                       \
    (CUdeviceptr * dptr, size_t * pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes), \
    (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))                                                  \
  X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0, b_mem_alloc_managed,                                    \
    (CUdeviceptr * dptr, size_t bytesize, unsigned int flags), (dptr, bytesize, flags))                      \
  X(cuMemFree_v2, "cuMemFree", 3020, 0, b_mem_free, (CUdeviceptr dptr), (dptr))                              \
  X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0, b_mem_alloc_async,                                         \
    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream))                      \
  X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1, b_mem_alloc_async,                                    \
    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream))                      \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0, b_mem_alloc_from_pool,                     \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
  X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1, b_mem_alloc_from_pool,                \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
  X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0, b_mem_free_async, (CUdeviceptr dptr, CUstream hStream),      \
    (dptr, hStream))                                                                                         \
  X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1, b_mem_free_async, (CUdeviceptr dptr, CUstream hStream), \
    (dptr, hStream))                                                                                         \
  X(cuMemGetInfo, "cuMemGetInfo", 2000, 0, b_mem_get_info_v1, (unsigned int *free_b, unsigned int *total),    \
    (free_b, total))                                                                                         \
  X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0, b_mem_get_info, (size_t * free_b, size_t * total), (free_b, total)) \
  X(cuMemHostAlloc, "cuMemHostAlloc", 2020, 0, b_mem_host_alloc, (void **pp, size_t bytesize, unsigned int Flags), \
    (pp, bytesize, Flags))                                                                                   \
  X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, 0, b_mem_alloc_host, (void **pp, size_t bytesize), (pp, bytesize)) \
  X(cuMemFreeHost, "cuMemFreeHost", 2000, 0, b_mem_free_host, (void *p), (p))                                \
  X(cuMemCreate, "cuMemCreate", 10020, 0, b_mem_create,                                                      \
    (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,                    \
     unsigned long long flags),                                                                              \
    (handle, size, prop, flags))                                                                             \
  X(cuMemRelease, "cuMemRelease", 10020, 0, b_mem_release, (CUmemGenericAllocationHandle handle), (handle))  \
  X(cuMemMap, "cuMemMap", 10020, 0, b_mem_map,                                                               \
    (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags), \
    (ptr, size, offset, handle, flags))                                                                      \
  X(cuMemUnmap, "cuMemUnmap", 10020, 0, b_mem_unmap, (CUdeviceptr ptr, size_t size), (ptr, size))            \
  X(cuMemAddressReserve, "cuMemAddressReserve", 10020, 0, b_mem_address_reserve,                             \
    (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags),          \
    (ptr, size, alignment, addr, flags))                                                                     \
  X(cuMemAddressFree, "cuMemAddressFree", 10020, 0, b_mem_address_free, (CUdeviceptr ptr, size_t size),      \
    (ptr, size))                                                                                             \
  X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0, b_pool_create,                                             \
    (CUmemoryPool * pool, const CUmemPoolProps *poolProps), (pool, poolProps))                               \
  X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0, b_pool_destroy, (CUmemoryPool pool), (pool))             \
  X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0, b_pool_trim, (CUmemoryPool pool, size_t minBytesToKeep),   \
    (pool, minBytesToKeep))                                                                                  \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0, b_pool_set_attr,                               \
    (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value))                         \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0, b_dev_default_pool,                    \
    (CUmemoryPool * pool_out, CUdevice dev), (pool_out, dev))                                                \
  X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0, b_dev_get_pool, (CUmemoryPool * pool, CUdevice dev), \
    (pool, dev))                                                                                             \
  X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, 0, b_dev_set_pool, (CUdevice dev, CUmemoryPool pool),   \
    (dev, pool))                                                                                             \
  X(cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", 13000, 0, b_mem_default_pool,                          \
    (CUmemoryPool * pool_out, CUmemLocation * location, CUmemAllocationType type), (pool_out, location, type)) \
  X(cuMemGetMemPool, "cuMemGetMemPool", 13000, 0, b_mem_get_pool,                                            \
    (CUmemoryPool * pool, CUmemLocation * location, CUmemAllocationType type), (pool, location, type))       \
  X(cuMemSetMemPool, "cuMemSetMemPool", 13000, 0, b_mem_set_pool,                                            \
    (CUmemLocation * location, CUmemAllocationType type, CUmemoryPool pool), (location, type, pool))         \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0, b_primary_retain,                         \
    (CUcontext * pctx, CUdevice dev), (pctx, dev))                                                           \
  X(cuCtxCreate, "cuCtxCreate", 2000, 0, b_ctx_create, (CUcontext * pctx, unsigned int flags, CUdevice dev), \
    (pctx, flags, dev))                                                                                      \
  X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0, b_ctx_create, (CUcontext * pctx, unsigned int flags, CUdevice dev), \
    (pctx, flags, dev))                                                                                      \
  X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0, b_ctx_create_v3,                                                \
    (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags, CUdevice dev),  \
    (pctx, paramsArray, numParams, flags, dev))                                                              \
  X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0, b_ctx_create_v4,                                                \
    (CUcontext * pctx, CUctxCreateParams * ctxCreateParams, unsigned int flags, CUdevice dev),               \
    (pctx, ctxCreateParams, flags, dev))                                                                     \
  X(cuCtxDestroy, "cuCtxDestroy", 2000, 0, b_ctx_destroy, (CUcontext ctx), (ctx))                            \
  X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0, b_ctx_destroy, (CUcontext ctx), (ctx))                         \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0, b_ctx_switch, (CUcontext ctx), (ctx))                        \
  X(cuCtxPushCurrent, "cuCtxPushCurrent", 2000, 0, b_ctx_switch, (CUcontext ctx), (ctx))                       \
  X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0, b_ctx_switch, (CUcontext ctx), (ctx))                    \
  X(cuCtxPopCurrent, "cuCtxPopCurrent", 2000, 0, b_ctx_pop, (CUcontext * pctx), (pctx))                      \
  X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0, b_ctx_pop, (CUcontext * pctx), (pctx))                   \
  X(cuCtxDetach, "cuCtxDetach", 2000, 0, b_ctx_detach, (CUcontext ctx), (ctx))                               \
  X(cuGLCtxCreate, "cuGLCtxCreate", 2000, 0, b_ctx_create, (CUcontext * pctx, unsigned int flags, CUdevice dev), \
    (pctx, flags, dev))                                                                                      \
  X(cuGLCtxCreate_v2, "cuGLCtxCreate", 3020, 0, b_ctx_create, (CUcontext * pctx, unsigned int flags, CUdevice dev), \
    (pctx, flags, dev))                                                                                      \
  X(cuVDPAUCtxCreate, "cuVDPAUCtxCreate", 3010, 0, b_vdpau_ctx_create,                                       \
    (CUcontext * pctx, unsigned int flags, CUdevice dev, uint32_t vdp, void *vdp_proc), (pctx, flags, dev, vdp, vdp_proc)) \
  X(cuVDPAUCtxCreate_v2, "cuVDPAUCtxCreate", 3020, 0, b_vdpau_ctx_create,                                    \
    (CUcontext * pctx, unsigned int flags, CUdevice dev, uint32_t vdp, void *vdp_proc), (pctx, flags, dev, vdp, vdp_proc)) \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0, b_primary_release, (CUdevice dev), (dev)) \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0, b_primary_release, (CUdevice dev), \
    (dev))                                                                                                   \
  X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0, b_primary_reset, (CUdevice dev), (dev))     \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0, b_primary_reset, (CUdevice dev), (dev)) \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0, b_ipc_get, (CUipcMemHandle * pHandle, CUdeviceptr dptr),  \
    (pHandle, dptr))                                                                                         \
  X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0, b_ipc_open,                                          \
    (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags), (pdptr, handle, Flags))                \
  X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0, b_ipc_open,                                      \
    (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags), (pdptr, handle, Flags))                \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0, b_ipc_close, (CUdeviceptr dptr), (dptr))          \
  X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0, b_capture_begin1, (CUstream hStream), (hStream)) \
  X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 1, b_capture_begin1_pt, (CUstream hStream),   \
    (hStream))                                                                                               \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0, b_capture_begin,                             \
    (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))                                           \
  X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1, b_capture_begin_pt,                     \
    (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))                                           \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0, b_capture_to_graph,              \
    (CUstream hStream, CUgraph hGraph, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,       \
     CUstreamCaptureMode mode),                                                                              \
    (hStream, hGraph, deps, data, n, mode))                                                                  \
  X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1, b_capture_to_graph_pt,      \
    (CUstream hStream, CUgraph hGraph, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n,       \
     CUstreamCaptureMode mode),                                                                              \
    (hStream, hGraph, deps, data, n, mode))                                                                  \
  X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0, b_capture_end, (CUstream hStream, CUgraph * phGraph), \
    (hStream, phGraph))                                                                                      \
  X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1, b_capture_end_pt,                              \
    (CUstream hStream, CUgraph * phGraph), (hStream, phGraph))

/* Ids: GR_H_<symbol>. */
#define GR_HOOK_ENUM(sym, base, ver, ptsz, body, params, args) GR_H_##sym,
enum { GR_DRIVER_HOOKS(GR_HOOK_ENUM) GR_H_COUNT };
#undef GR_HOOK_ENUM

#define GR_EXPAND(...) __VA_ARGS__
