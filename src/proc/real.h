/* real.h -- the real entry points of the driver, the runtime and libc, resolved once (real.c). Internal. */
#ifndef GR_REAL_H
#define GR_REAL_H

#include <cuda.h>

typedef struct gr_real_libc {
  void *(*dlsym)(void *, const char *);
  void *(*dlopen)(const char *, int);
} gr_real_libc_t;

/* libc's dlsym and dlopen (never the public names, which gpureclaim overrides). */
const gr_real_libc_t *gr_real_libc(void);
/* name as the caller's own scope (its object and that object's dependencies) resolves it, the caller given by a
 * code address in it; NULL if that scope has no such symbol. */
void *gr_real_caller_sym(const void *caller, const char *name);
/* The process's libcuda.so.1 (the one already loaded, else loaded now); NULL if there is none. */
void *gr_real_libcuda(void);
/* A driver function by its exported name, from that libcuda; NULL if missing. Cached per name by callers. */
void *gr_real_driver(const char *name);

/* Driver functions gpureclaim itself calls (not through the program's routes), resolved at start-up. */
typedef struct gr_drv {
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxGetDevice)(CUdevice *);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuCtxGetApiVersion)(CUcontext, unsigned *);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuMemGetInfo)(size_t *, size_t *);
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
  CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*cuMemFreeHost)(void *);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuGetErrorName)(CUresult, const char **);
} gr_drv_t;

/* The table above (every member may be NULL if the driver lacks it). Resolved by gr_core_start_slow(). */
extern gr_drv_t gr_drv;
int gr_real_resolve_drv(void);

#endif /* GR_REAL_H */
