/*
 * simcudart.c -- the simulated CUDA runtime (libcudart.so.13 and libcudart_static.a from this one source).
 *
 * It reaches the driver exactly like the real CUDA 13 runtime, because that route is what gpureclaim has to
 * intercept: it imports no cu* symbol; it dlopen()s libcuda.so.1, dlsym()s only "cuGetProcAddress_v2", and
 * at init sends the very requests the real CUDA 13.0 runtime sends, in its order (data/cudart13-procaddr-
 * requests.txt, compiled in as cudart13_requests.inc): an empty-name probe, cuInit, "cuGetProcAddress" at
 * 11030 and 12000 through the dlsym()ed getter, then about 436 entry points through the 12000 getter, each
 * at the version that introduced the ABI wanted (so old ABIs such as cuCtxCreate@3020 on purpose), those
 * taking a stream a second time with the per-thread default stream flag. Like the real runtime it tolerates
 * CUDA_ERROR_NOT_FOUND (the driver lacks that name or version): only the few entry points it calls must be
 * there.
 *
 * What it then calls is what the real CUDA 13.0 runtime was seen to call (docs/ARCHITECTURE.md, "The real CUDA 13
 * runtime, as the simulator models it"): cuInit, then cuDriverGetVersion (a driver of an older major version:
 * the start fails with cudaErrorInsufficientDriver and libcuda.so.1 is dlclose()d, as the real runtime does),
 * cuDeviceGetCount, and cuModuleGetLoadingMode as the first call after start-up. Each thread's context is set up
 * once, at the thread's first runtime call: a context already current (made so through the driver, or by
 * another runtime instance in the process) is used as it is, else the device's primary context is retained (once
 * per runtime instance) and made current with cuCtxSetCurrent; later calls make no context call (the real
 * runtime makes a few cuCtxGetCurrent calls in a whole run). Kernels are loaded through cuLibraryLoadData and
 * cuLibraryGetKernel, once each, and launched as the CUkernel. A cudaDeviceReset goes through
 * cuDevicePrimaryCtxReset at the 7000 ABI. Several instances may live in one process (the static one linked into
 * a library, as cuBLAS embeds one): each loads the driver, asks its requests and retains the primary context on
 * its own. The runtime's private driver integrity check is not modelled.
 */
#define _GNU_SOURCE
/* Declares both the plain and the _ptsz/_ptds runtime entry points with no renaming macro. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "simcuda.h" /* the image cuLibraryLoadData takes (a type only: nothing of the driver is linked) */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define RT_API __attribute__((visibility("default"))) cudaError_t CUDARTAPI
#define RT_MAX_DEV 64

/* ------------------------------------------------------------------------------------ driver table */

static struct drv {
  PFN_cuGetProcAddress_v11030 gpa_v11030; /* fetched like the real runtime does, not used afterwards */
  PFN_cuGetProcAddress_v12000 gpa;
  PFN_cuInit_v2000 init;
  PFN_cuDriverGetVersion_v2020 driverGetVersion;
  PFN_cuDeviceGet_v2000 deviceGet;
  PFN_cuDeviceGetCount_v2000 deviceGetCount;
  PFN_cuDevicePrimaryCtxRetain_v7000 primaryRetain;
  PFN_cuDevicePrimaryCtxRelease_v7000 primaryRelease; /* old ABIs, asked for on purpose */
  PFN_cuDevicePrimaryCtxReset_v7000 primaryReset;
  PFN_cuCtxCreate_v3020 ctxCreate;
  PFN_cuCtxGetCurrent_v4000 ctxGetCurrent;
  PFN_cuCtxSetCurrent_v4000 ctxSetCurrent;
  PFN_cuCtxGetDevice_v13000 ctxGetDevice;
  PFN_cuCtxSynchronize_v13000 ctxSynchronize;
  PFN_cuMemAlloc_v3020 memAlloc;
  PFN_cuMemFree_v3020 memFree;
  PFN_cuMemAllocPitch_v3020 memAllocPitch;
  PFN_cuMemAllocManaged_v6000 memAllocManaged;
  PFN_cuMemHostAlloc_v2020 memHostAlloc;
  PFN_cuMemFreeHost_v2000 memFreeHost;
  PFN_cuMemGetInfo_v3020 memGetInfo;
  PFN_cuMemGetAddressRange_v3020 memGetAddressRange;
  PFN_cuMemcpyHtoD_v3020 memcpyHtoD;
  PFN_cuMemcpyDtoH_v3020 memcpyDtoH;
  PFN_cuMemcpyDtoD_v3020 memcpyDtoD;
  PFN_cuMemsetD8_v3020 memsetD8;
  PFN_cuMemcpyHtoD_v7000_ptds memcpyHtoD_ptds;
  PFN_cuMemcpyDtoH_v7000_ptds memcpyDtoH_ptds;
  PFN_cuMemcpyDtoD_v7000_ptds memcpyDtoD_ptds;
  PFN_cuMemsetD8_v7000_ptds memsetD8_ptds;
  PFN_cuStreamCreate_v2000 streamCreate;
  PFN_cuStreamDestroy_v4000 streamDestroy;
  PFN_cuStreamSynchronize_v2000 streamSynchronize;
  PFN_cuStreamSynchronize_v7000_ptsz streamSynchronize_ptsz;
  PFN_cuStreamGetCtx_v9020 streamGetCtx;
  PFN_cuMemAllocAsync_v11020 memAllocAsync;
  PFN_cuMemAllocAsync_v11020_ptsz memAllocAsync_ptsz;
  PFN_cuMemFreeAsync_v11020 memFreeAsync;
  PFN_cuMemFreeAsync_v11020_ptsz memFreeAsync_ptsz;
  PFN_cuMemAllocFromPoolAsync_v11020 memAllocFromPoolAsync;
  PFN_cuMemAllocFromPoolAsync_v11020_ptsz memAllocFromPoolAsync_ptsz;
  PFN_cuMemPoolCreate_v11020 memPoolCreate;
  PFN_cuMemPoolDestroy_v11020 memPoolDestroy;
  PFN_cuMemPoolTrimTo_v11020 memPoolTrimTo;
  PFN_cuMemPoolSetAttribute_v11020 memPoolSetAttribute;
  PFN_cuMemPoolGetAttribute_v11020 memPoolGetAttribute;
  PFN_cuDeviceGetDefaultMemPool_v11020 deviceGetDefaultMemPool;
  PFN_cuDeviceGetMemPool_v11020 deviceGetMemPool;
  PFN_cuDeviceSetMemPool_v11020 deviceSetMemPool;
  PFN_cuMemGetDefaultMemPool_v13000 memGetDefaultMemPool;
  PFN_cuMemGetMemPool_v13000 memGetMemPool;
  PFN_cuMemSetMemPool_v13000 memSetMemPool;
  PFN_cuLaunchKernel_v4000 launchKernel;
  PFN_cuLaunchKernel_v7000_ptsz launchKernel_ptsz;
  PFN_cuModuleGetLoadingMode_v11070 moduleGetLoadingMode;
  PFN_cuLibraryLoadData_v12000 libraryLoadData;
  PFN_cuLibraryGetKernel_v12000 libraryGetKernel;
} D;

/* What the real runtime asks cuGetProcAddress for, in its order. */
static const struct request {
  const char *name;
  int version;
  int flags;
} k_requests[] = {
#define REQ(name, ver, flags) {name, ver, flags},
#include "cudart13_requests.inc"
#undef REQ
};

#define PT ((int)CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
static const struct {
  const char *name;
  int version;
  int flags;
  size_t off;
} k_syms[] = { /* the entry points this runtime calls: each is one of k_requests */
#define S(name, ver, flags, field) {name, ver, flags, offsetof(struct drv, field)},
    S("cuInit", 2000, 0, init)
    S("cuDriverGetVersion", 2020, 0, driverGetVersion)
    S("cuDeviceGet", 2000, 0, deviceGet)
    S("cuDeviceGetCount", 2000, 0, deviceGetCount)
    S("cuDevicePrimaryCtxRetain", 7000, 0, primaryRetain)
    S("cuDevicePrimaryCtxRelease", 7000, 0, primaryRelease)
    S("cuDevicePrimaryCtxReset", 7000, 0, primaryReset)
    S("cuCtxCreate", 3020, 0, ctxCreate)
    S("cuCtxGetCurrent", 4000, 0, ctxGetCurrent)
    S("cuCtxSetCurrent", 4000, 0, ctxSetCurrent)
    S("cuCtxGetDevice", 13000, 0, ctxGetDevice)
    S("cuCtxSynchronize", 13000, 0, ctxSynchronize)
    S("cuMemAlloc", 3020, 0, memAlloc)
    S("cuMemFree", 3020, 0, memFree)
    S("cuMemAllocPitch", 3020, 0, memAllocPitch)
    S("cuMemAllocManaged", 6000, 0, memAllocManaged)
    S("cuMemHostAlloc", 2020, 0, memHostAlloc)
    S("cuMemFreeHost", 2000, 0, memFreeHost)
    S("cuMemGetInfo", 3020, 0, memGetInfo)
    S("cuMemGetAddressRange", 3020, 0, memGetAddressRange)
    S("cuMemcpyHtoD", 3020, 0, memcpyHtoD)
    S("cuMemcpyDtoH", 3020, 0, memcpyDtoH)
    S("cuMemcpyDtoD", 3020, 0, memcpyDtoD)
    S("cuMemsetD8", 3020, 0, memsetD8)
    S("cuMemcpyHtoD", 7000, PT, memcpyHtoD_ptds)
    S("cuMemcpyDtoH", 7000, PT, memcpyDtoH_ptds)
    S("cuMemcpyDtoD", 7000, PT, memcpyDtoD_ptds)
    S("cuMemsetD8", 7000, PT, memsetD8_ptds)
    S("cuStreamCreate", 2000, 0, streamCreate)
    S("cuStreamDestroy", 4000, 0, streamDestroy)
    S("cuStreamSynchronize", 2000, 0, streamSynchronize)
    S("cuStreamSynchronize", 7000, PT, streamSynchronize_ptsz)
    S("cuStreamGetCtx", 9020, 0, streamGetCtx)
    S("cuLaunchKernel", 4000, 0, launchKernel)
    S("cuLaunchKernel", 7000, PT, launchKernel_ptsz)
    S("cuMemAllocAsync", 11020, 0, memAllocAsync)
    S("cuMemAllocAsync", 11020, PT, memAllocAsync_ptsz)
    S("cuMemFreeAsync", 11020, 0, memFreeAsync)
    S("cuMemFreeAsync", 11020, PT, memFreeAsync_ptsz)
    S("cuMemAllocFromPoolAsync", 11020, 0, memAllocFromPoolAsync)
    S("cuMemAllocFromPoolAsync", 11020, PT, memAllocFromPoolAsync_ptsz)
    S("cuMemPoolCreate", 11020, 0, memPoolCreate)
    S("cuMemPoolDestroy", 11020, 0, memPoolDestroy)
    S("cuMemPoolTrimTo", 11020, 0, memPoolTrimTo)
    S("cuMemPoolSetAttribute", 11020, 0, memPoolSetAttribute)
    S("cuMemPoolGetAttribute", 11020, 0, memPoolGetAttribute)
    S("cuDeviceGetDefaultMemPool", 11020, 0, deviceGetDefaultMemPool)
    S("cuDeviceGetMemPool", 11020, 0, deviceGetMemPool)
    S("cuDeviceSetMemPool", 11020, 0, deviceSetMemPool)
    S("cuMemGetDefaultMemPool", 13000, 0, memGetDefaultMemPool)
    S("cuMemGetMemPool", 13000, 0, memGetMemPool)
    S("cuMemSetMemPool", 13000, 0, memSetMemPool)
    S("cuModuleGetLoadingMode", 11070, 0, moduleGetLoadingMode)
    S("cuLibraryLoadData", 12000, 0, libraryLoadData)
    S("cuLibraryGetKernel", 12000, 0, libraryGetKernel)
#undef S
};

/* ----------------------------------------------------------------------------------------- state */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_load_err; /* written once under g_once */
static int g_ndev;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_pctx[RT_MAX_DEV]; /* primary context handles (stable across resets) */
static int g_retained[RT_MAX_DEV];   /* the runtime holds a retain on that primary context */

static __thread int t_dev;           /* cudaSetDevice's choice; device 0 until then */
static __thread cudaError_t t_err;   /* last error, kept until cudaGetLastError reads it */
static __thread int t_ready;         /* this thread's context is set up (its first runtime call did it) */
static __thread int t_primary;       /* ... and it is t_dev's primary context, which the runtime retains */

static cudaError_t map_err(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS: return cudaSuccess;
  case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
  case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
  case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
  case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
  case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
  case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
  case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
  case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
  case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
  case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
  case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
  case CUDA_ERROR_NOT_PERMITTED: return cudaErrorNotPermitted;
  case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
  case CUDA_ERROR_STUB_LIBRARY: return cudaErrorStubLibrary;
  default: return cudaErrorUnknown;
  }
}

/* Every runtime call records a failure as the thread's last error. */
static inline cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) t_err = e;
  return e;
}

static void *g_req_fn[sizeof k_requests / sizeof k_requests[0]]; /* what each request got, or NULL */

/* A start that fails closes the driver again, as the real runtime does. */
static void load_failed(void *h, cudaError_t e) {
  g_load_err = e;
  memset(&D, 0, sizeof D);
  if (h) dlclose(h);
}

static void load_once(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    g_load_err = cudaErrorInsufficientDriver;
    return;
  }
  PFN_cuGetProcAddress_v12000 first = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  if (!first) {
    load_failed(h, cudaErrorInsufficientDriver);
    return;
  }
  /* Every request in order; until the driver handed out its 12000 getter, through the dlsym()ed one. A name
   * the driver does not have (CUDA_ERROR_NOT_FOUND, or any other refusal) just leaves that slot empty. */
  for (size_t i = 0; i < sizeof k_requests / sizeof k_requests[0]; i++) {
    const struct request *q = &k_requests[i];
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    void *p = NULL;
    CUresult r = (D.gpa ? D.gpa : first)(q->name, &p, q->version, (cuuint64_t)q->flags, &st);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS) p = NULL;
    g_req_fn[i] = p;
    if (p && strcmp(q->name, "cuGetProcAddress") == 0) {
      if (q->version == 11030) D.gpa_v11030 = (PFN_cuGetProcAddress_v11030)p;
      else if (q->version == 12000) D.gpa = (PFN_cuGetProcAddress_v12000)p;
    }
  }
  if (!D.gpa_v11030 || !D.gpa) {
    load_failed(h, cudaErrorInsufficientDriver);
    return;
  }
  /* The entry points this runtime calls must all be there (the real one needs far more). */
  for (size_t i = 0; i < sizeof k_syms / sizeof k_syms[0]; i++) {
    void *p = NULL;
    for (size_t j = 0; j < sizeof k_requests / sizeof k_requests[0]; j++)
      if (k_requests[j].version == k_syms[i].version && k_requests[j].flags == k_syms[i].flags &&
          strcmp(k_requests[j].name, k_syms[i].name) == 0)
        p = g_req_fn[j];
    if (!p) {
      load_failed(h, cudaErrorInsufficientDriver);
      return;
    }
    memcpy((char *)&D + k_syms[i].off, &p, sizeof p);
  }
  CUresult r = D.init(0);
  int version = 0;
  if (r == CUDA_SUCCESS) r = D.driverGetVersion(&version);
  if (r == CUDA_SUCCESS && version / 1000 < CUDART_VERSION / 1000) {
    load_failed(h, cudaErrorInsufficientDriver); /* a runtime needs a driver of its major version or newer */
    return;
  }
  if (r == CUDA_SUCCESS) r = D.deviceGetCount(&g_ndev);
  if (r != CUDA_SUCCESS) {
    load_failed(h, r == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : map_err(r));
    return;
  }
  if (g_ndev > RT_MAX_DEV) g_ndev = RT_MAX_DEV;
  /* The primary contexts' handles, once, without retaining them: the real runtime gets them through a private
   * export table of the driver's (cuGetExportTable), which gpureclaim does not see either; the simulator's
   * stand-in for that route is simcuda_primary_context. */
  CUresult (*primary)(int, CUcontext *) = (CUresult(*)(int, CUcontext *))dlsym(h, "simcuda_primary_context");
  for (int d = 0; d < g_ndev; d++)
    if (!primary || primary(d, &g_pctx[d]) != CUDA_SUCCESS) {
      load_failed(h, cudaErrorInsufficientDriver);
      return;
    }
  /* The first call after start-up, as the real runtime's: it decides how its kernels are loaded. */
  CUmoduleLoadingMode mode;
  r = D.moduleGetLoadingMode(&mode);
  if (r != CUDA_SUCCESS) load_failed(h, map_err(r));
}

static cudaError_t rt_load(void) {
  pthread_once(&g_once, load_once);
  return g_load_err;
}

/* Retains device dev's primary context for the runtime unless it already holds it. */
static cudaError_t retain_primary(int dev, CUcontext *out) {
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&g_lock);
  if (!g_retained[dev]) {
    CUcontext c; /* (g_pctx[dev], which every thread reads without the lock) */
    r = D.primaryRetain(&c, dev);
    if (r == CUDA_SUCCESS) __atomic_store_n(&g_retained[dev], 1, __ATOMIC_RELEASE);
  }
  if (out) *out = g_pctx[dev];
  pthread_mutex_unlock(&g_lock);
  return map_err(r);
}

/* Lazy initialization: loads the driver once; sets the calling thread's context up at its first call (the
 * context already current, or its device's primary context, retained and made current); afterwards only
 * retains the primary context again after a cudaDeviceReset let it go. No driver call on the usual path. */
static cudaError_t rt_ctx(void) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return e;
  if (t_ready)
    return !t_primary || __atomic_load_n(&g_retained[t_dev], __ATOMIC_ACQUIRE) ? cudaSuccess
                                                                             : retain_primary(t_dev, NULL);
  CUcontext cur = NULL;
  CUresult r = D.ctxGetCurrent(&cur);
  if (r != CUDA_SUCCESS) return map_err(r);
  if (cur) {
    int dev = -1; /* a primary context (made current by another runtime instance, or through the driver)? */
    for (int d = 0; d < g_ndev; d++)
      if (g_pctx[d] == cur) dev = d;
    if (dev >= 0) {
      e = retain_primary(dev, NULL);
      if (e != cudaSuccess) return e;
      t_dev = dev;
      t_primary = 1;
    }
    t_ready = 1; /* else someone's own context, used as it is */
    return cudaSuccess;
  }
  CUcontext ctx;
  e = retain_primary(t_dev, &ctx);
  if (e != cudaSuccess) return e;
  r = D.ctxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) return map_err(r);
  t_ready = 1;
  t_primary = 1;
  return cudaSuccess;
}

/* Returns from the calling runtime function what a call that is one driver call answers: rt_ctx's error, or else
 * the driver call's result as a runtime error (call is evaluated only once the context is there). */
#define RT_RETURN_DRIVER(call)                                                                                \
  do {                                                                                                        \
    cudaError_t rt_e_ = rt_ctx();                                                                             \
    return ret(rt_e_ != cudaSuccess ? rt_e_ : map_err(call));                                                 \
  } while (0)

static int current_device(void) {
  CUcontext cur = NULL;
  CUdevice dev;
  if (D.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur && D.ctxGetDevice(&dev, NULL) == CUDA_SUCCESS) return dev;
  return t_dev;
}

/* ------------------------------------------------------------------------------------- device memory */

RT_API cudaMalloc(void **devPtr, size_t size) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = NULL; /* the runtime answers a zero-byte request itself */
    return cudaSuccess;
  }
  CUdeviceptr p;
  e = map_err(D.memAlloc(&p, size));
  if (e == cudaSuccess) *devPtr = (void *)(uintptr_t)p;
  return ret(e);
}

RT_API cudaFree(void *devPtr) {
  cudaError_t e = rt_ctx(); /* cudaFree(NULL) is the classic way to force initialization */
  if (e != cudaSuccess || !devPtr) return ret(e);
  return ret(map_err(D.memFree((CUdeviceptr)(uintptr_t)devPtr)));
}

RT_API cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  CUdeviceptr p;
  e = map_err(D.memAllocManaged(&p, size, flags));
  if (e == cudaSuccess) *devPtr = (void *)(uintptr_t)p;
  return ret(e);
}

RT_API cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!devPtr || !pitch) return ret(cudaErrorInvalidValue);
  CUdeviceptr p;
  size_t pp;
  e = map_err(D.memAllocPitch(&p, &pp, width, height, 4));
  if (e == cudaSuccess) {
    *devPtr = (void *)(uintptr_t)p;
    *pitch = pp;
  }
  return ret(e);
}

RT_API cudaMemGetInfo(size_t *free, size_t *total) {
  RT_RETURN_DRIVER(D.memGetInfo(free, total));
}

/* ---------------------------------------------------------------------------------------- host memory */

/* Exported names never call each other: a preloaded interposer must see each call once. */
static cudaError_t host_alloc(void **pHost, size_t size, unsigned int flags) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!pHost) return ret(cudaErrorInvalidValue);
  if (size == 0) {
    *pHost = NULL;
    return cudaSuccess;
  }
  return ret(map_err(D.memHostAlloc(pHost, size, flags)));
}

RT_API cudaHostAlloc(void **pHost, size_t size, unsigned int flags) { return host_alloc(pHost, size, flags); }

RT_API cudaMallocHost(void **ptr, size_t size) { return host_alloc(ptr, size, cudaHostAllocDefault); }

RT_API cudaFreeHost(void *ptr) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess || !ptr) return ret(e);
  return ret(map_err(D.memFreeHost(ptr)));
}

/* ------------------------------------------------------------------------------------------- streams */

static cudaError_t stream_create(cudaStream_t *pStream, unsigned int flags) {
  RT_RETURN_DRIVER(D.streamCreate(pStream, flags));
}

RT_API cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) { return stream_create(pStream, flags); }

RT_API cudaStreamCreate(cudaStream_t *pStream) { return stream_create(pStream, cudaStreamDefault); }

RT_API cudaStreamDestroy(cudaStream_t stream) {
  RT_RETURN_DRIVER(D.streamDestroy(stream));
}

RT_API cudaStreamSynchronize(cudaStream_t stream) {
  RT_RETURN_DRIVER(D.streamSynchronize(stream));
}

RT_API cudaStreamSynchronize_ptsz(cudaStream_t stream) {
  RT_RETURN_DRIVER(D.streamSynchronize_ptsz(stream));
}

RT_API cudaDeviceSynchronize(void) {
  RT_RETURN_DRIVER(D.ctxSynchronize(NULL));
}

/* -------------------------------------------------------------------------------- stream-ordered memory */

static cudaError_t malloc_async(PFN_cuMemAllocAsync_v11020 fn, void **devPtr, size_t size, cudaStream_t s) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!devPtr) return ret(cudaErrorInvalidValue);
  CUdeviceptr p;
  e = map_err(fn(&p, size, s));
  if (e == cudaSuccess) *devPtr = (void *)(uintptr_t)p;
  return ret(e);
}

RT_API cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  return malloc_async(D.memAllocAsync, devPtr, size, hStream);
}

RT_API cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
  return malloc_async(D.memAllocAsync_ptsz, devPtr, size, hStream);
}

static cudaError_t free_async(PFN_cuMemFreeAsync_v11020 fn, void *devPtr, cudaStream_t s) {
  RT_RETURN_DRIVER(fn((CUdeviceptr)(uintptr_t)devPtr, s));
}

RT_API cudaFreeAsync(void *devPtr, cudaStream_t hStream) { return free_async(D.memFreeAsync, devPtr, hStream); }

RT_API cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
  return free_async(D.memFreeAsync_ptsz, devPtr, hStream);
}

static cudaError_t malloc_from_pool(PFN_cuMemAllocFromPoolAsync_v11020 fn, void **ptr, size_t size,
                                   cudaMemPool_t pool, cudaStream_t s) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!ptr) return ret(cudaErrorInvalidValue);
  CUdeviceptr p;
  e = map_err(fn(&p, size, pool, s));
  if (e == cudaSuccess) *ptr = (void *)(uintptr_t)p;
  return ret(e);
}

RT_API cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  return malloc_from_pool(D.memAllocFromPoolAsync, ptr, size, memPool, stream);
}

RT_API cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  return malloc_from_pool(D.memAllocFromPoolAsync_ptsz, ptr, size, memPool, stream);
}

RT_API cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.deviceGetDefaultMemPool(memPool, device)));
}

RT_API cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.deviceGetMemPool(memPool, device)));
}

RT_API cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.deviceSetMemPool(device, memPool)));
}

RT_API cudaMemGetDefaultMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
                                enum cudaMemAllocationType type) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  if (!location) return ret(cudaErrorInvalidValue);
  CUmemLocation loc = {(CUmemLocationType)location->type, location->id};
  return ret(map_err(D.memGetDefaultMemPool(memPool, &loc, (CUmemAllocationType)type)));
}

RT_API cudaMemGetMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location, enum cudaMemAllocationType type) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  if (!location) return ret(cudaErrorInvalidValue);
  CUmemLocation loc = {(CUmemLocationType)location->type, location->id};
  return ret(map_err(D.memGetMemPool(memPool, &loc, (CUmemAllocationType)type)));
}

RT_API cudaMemSetMemPool(struct cudaMemLocation *location, enum cudaMemAllocationType type, cudaMemPool_t memPool) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  if (!location) return ret(cudaErrorInvalidValue);
  CUmemLocation loc = {(CUmemLocationType)location->type, location->id};
  return ret(map_err(D.memSetMemPool(&loc, (CUmemAllocationType)type, memPool)));
}

RT_API cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  if (!memPool || !poolProps) return ret(cudaErrorInvalidValue);
  CUmemPoolProps p;
  memset(&p, 0, sizeof p);
  p.allocType = (CUmemAllocationType)poolProps->allocType;
  p.handleTypes = (CUmemAllocationHandleType)poolProps->handleTypes;
  p.location.type = (CUmemLocationType)poolProps->location.type;
  p.location.id = poolProps->location.id;
  p.win32SecurityAttributes = poolProps->win32SecurityAttributes;
  p.maxSize = poolProps->maxSize;
  p.usage = poolProps->usage;
  return ret(map_err(D.memPoolCreate(memPool, &p)));
}

RT_API cudaMemPoolDestroy(cudaMemPool_t memPool) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.memPoolDestroy(memPool)));
}

RT_API cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.memPoolTrimTo(memPool, minBytesToKeep)));
}

RT_API cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.memPoolSetAttribute(memPool, (CUmemPool_attribute)attr, value)));
}

RT_API cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.memPoolGetAttribute(memPool, (CUmemPool_attribute)attr, value)));
}

/* ------------------------------------------------------------------------------------ copies and sets */

static int is_device_ptr(const void *p) {
  return D.memGetAddressRange(NULL, NULL, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS;
}

static cudaError_t do_memcpy(int per_thread, void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (count == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) { /* unified addressing: ask the driver what each pointer is */
    int dd = is_device_ptr(dst), sd = is_device_ptr(src);
    kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
              : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
  CUresult r;
  switch (kind) {
  case cudaMemcpyHostToHost:
    if (!dst || !src) return ret(cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
  case cudaMemcpyHostToDevice: r = (per_thread ? D.memcpyHtoD_ptds : D.memcpyHtoD)(d, src, count); break;
  case cudaMemcpyDeviceToHost: r = (per_thread ? D.memcpyDtoH_ptds : D.memcpyDtoH)(dst, s, count); break;
  case cudaMemcpyDeviceToDevice: r = (per_thread ? D.memcpyDtoD_ptds : D.memcpyDtoD)(d, s, count); break;
  default: return ret(cudaErrorInvalidMemcpyDirection);
  }
  return ret(map_err(r));
}

RT_API cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return do_memcpy(0, dst, src, count, kind);
}

RT_API cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return do_memcpy(1, dst, src, count, kind);
}

static cudaError_t do_memset(int per_thread, void *devPtr, int value, size_t count) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)devPtr;
  return ret(map_err((per_thread ? D.memsetD8_ptds : D.memsetD8)(d, (unsigned char)value, count)));
}

RT_API cudaMemset(void *devPtr, int value, size_t count) { return do_memset(0, devPtr, value, count); }

/* ------------------------------------------------------------------------------------------ kernels */

/* A kernel of the simulator is a host function void fn(void **args) (simcuda.c runs it on the calling thread).
 * The real runtime registers its kernels by name and loads them through the driver's library API; this one
 * loads each function it is asked to launch once, as a library of its own (cuLibraryLoadData of a
 * simcuda_image_t naming it), gets its CUkernel (cuLibraryGetKernel) and launches that. */
typedef void (*rt_kernel_fn)(void **);
static struct {
  rt_kernel_fn fn;
  CUkernel k;
} *g_kernels;
static size_t g_nkernels, g_capkernels; /* under g_lock */

static cudaError_t kernel_for(const void *func, CUkernel *out) {
  rt_kernel_fn fn = (rt_kernel_fn)(uintptr_t)func;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_nkernels; i++)
    if (g_kernels[i].fn == fn) {
      *out = g_kernels[i].k;
      pthread_mutex_unlock(&g_lock);
      return cudaSuccess;
    }
  char name[64];
  snprintf(name, sizeof name, "kernel_%p", func);
  simcuda_image_kernel_t entry = {name, fn};
  simcuda_image_t image = {SIMCUDA_IMAGE_MAGIC, 1, &entry};
  CUlibrary lib;
  CUresult r = D.libraryLoadData(&lib, &image, NULL, NULL, 0, NULL, NULL, 0);
  if (r == CUDA_SUCCESS) r = D.libraryGetKernel(out, lib, name);
  if (r == CUDA_SUCCESS && g_nkernels == g_capkernels) {
    size_t cap = g_capkernels ? 2 * g_capkernels : 16;
    void *p = realloc(g_kernels, cap * sizeof *g_kernels);
    if (p) g_kernels = p, g_capkernels = cap;
    else r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    g_kernels[g_nkernels].fn = fn;
    g_kernels[g_nkernels].k = *out;
    g_nkernels++;
  }
  pthread_mutex_unlock(&g_lock);
  return map_err(r);
}

static cudaError_t do_launch(int per_thread, const void *func, dim3 g, dim3 b, void **args, size_t shmem,
                             cudaStream_t s) {
  cudaError_t e = rt_ctx();
  if (e != cudaSuccess) return ret(e);
  if (!func) return ret(cudaErrorInvalidDeviceFunction);
  CUkernel k;
  e = kernel_for(func, &k);
  if (e != cudaSuccess) return ret(e);
  /* CUDA 13 passes the CUkernel where a CUfunction is expected */
  return ret(map_err((per_thread ? D.launchKernel_ptsz : D.launchKernel)((CUfunction)k, g.x, g.y, g.z, b.x, b.y,
                                                                          b.z, (unsigned)shmem, (CUstream)s, args,
                                                                          NULL)));
}

RT_API cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                        cudaStream_t stream) {
  return do_launch(0, func, gridDim, blockDim, args, sharedMem, stream);
}

RT_API cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream) {
  return do_launch(1, func, gridDim, blockDim, args, sharedMem, stream);
}

RT_API cudaMemset_ptds(void *devPtr, int value, size_t count) { return do_memset(1, devPtr, value, count); }

/* ------------------------------------------------------------------------------------------ devices */

RT_API cudaGetDeviceCount(int *count) {
  if (!count) return ret(cudaErrorInvalidValue);
  cudaError_t e = rt_load();
  if (e != cudaSuccess) {
    *count = 0;
    return ret(e);
  }
  *count = g_ndev;
  return cudaSuccess;
}

RT_API cudaSetDevice(int device) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  if (device < 0 || device >= g_ndev) return ret(cudaErrorInvalidDevice);
  t_dev = device;
  CUcontext ctx;
  e = retain_primary(device, &ctx);
  if (e != cudaSuccess) return ret(e);
  return ret(map_err(D.ctxSetCurrent(ctx)));
}

RT_API cudaGetDevice(int *device) {
  if (!device) return ret(cudaErrorInvalidValue);
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  *device = current_device();
  return cudaSuccess;
}

RT_API cudaDeviceReset(void) {
  cudaError_t e = rt_load();
  if (e != cudaSuccess) return ret(e);
  int dev = current_device();
  CUresult r;
  pthread_mutex_lock(&g_lock);
  /* Through the old (7000) ABIs the runtime asked for. The next runtime call retains it afresh. */
  r = D.primaryReset(dev);
  if (r == CUDA_SUCCESS && g_retained[dev]) {
    r = D.primaryRelease(dev);
    g_retained[dev] = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return ret(map_err(r));
}

RT_API cudaDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return ret(cudaErrorInvalidValue);
  if (rt_load() != cudaSuccess || !D.driverGetVersion) {
    *driverVersion = 0; /* no usable driver */
    return cudaSuccess;
  }
  return ret(map_err(D.driverGetVersion(driverVersion)));
}

RT_API cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

/* -------------------------------------------------------------------------------------------- errors */

RT_API cudaGetLastError(void) {
  cudaError_t e = t_err;
  t_err = cudaSuccess;
  return e;
}

RT_API cudaPeekAtLastError(void) { return t_err; }

static const struct {
  cudaError_t code;
  const char *name, *text;
} k_errors[] = {
#define E(c, s) {c, #c, s},
    E(cudaSuccess, "no error")
    E(cudaErrorInvalidValue, "invalid argument")
    E(cudaErrorMemoryAllocation, "out of memory")
    E(cudaErrorInitializationError, "initialization error")
    E(cudaErrorCudartUnloading, "driver shutting down")
    E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")
    E(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version")
    E(cudaErrorNoDevice, "no CUDA-capable device is detected")
    E(cudaErrorInvalidDevice, "invalid device ordinal")
    E(cudaErrorStubLibrary, "CUDA driver is a stub library")
    E(cudaErrorDeviceUninitialized, "invalid device context")
    E(cudaErrorInvalidResourceHandle, "invalid resource handle")
    E(cudaErrorSymbolNotFound, "named symbol not found")
    E(cudaErrorNotReady, "device not ready")
    E(cudaErrorIllegalAddress, "an illegal memory access was encountered")
    E(cudaErrorContextIsDestroyed, "context is destroyed")
    E(cudaErrorNotPermitted, "operation not permitted")
    E(cudaErrorNotSupported, "operation not supported")
    E(cudaErrorUnknown, "unknown error")
#undef E
};

__attribute__((visibility("default"))) const char *CUDARTAPI cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
    if (k_errors[i].code == error) return k_errors[i].name;
  return "unrecognized error code";
}

__attribute__((visibility("default"))) const char *CUDARTAPI cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
    if (k_errors[i].code == error) return k_errors[i].text;
  return "unrecognized error code";
}
