/*
 * simplugin.c -- a plugin fixture in the shape of JAX's CUDA plugin: loaded by its host with
 * RTLD_DEEPBIND | RTLD_LOCAL, it dlopen()s libcuda.so.1 itself and dlsym()s driver entry points by name,
 * so it imports no cu* symbol. A library loaded with RTLD_DEEPBIND binds dlsym to libc directly: this is
 * the known escape route of a preloaded dlsym override (see docs/ARCHITECTURE.md).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#define PLUGIN_API __attribute__((visibility("default")))

/* The plugin's interface (dlsym()ed by its host); each returns a CUresult. */
PLUGIN_API int simplugin_alloc(size_t bytes, int n, CUdeviceptr *out);
PLUGIN_API int simplugin_free(const CUdeviceptr *p, int n);
PLUGIN_API int simplugin_alloc_via_procaddr(size_t bytes, CUdeviceptr *out);

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*set_current_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
  CUresult err;
  init_fn init;
  device_get_fn device_get;
  retain_fn retain;
  set_current_fn set_current;
  alloc_fn alloc;
  free_fn free;
  gpa_fn gpa;
  CUcontext ctx;
} P;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    P.err = CUDA_ERROR_STUB_LIBRARY;
    return;
  }
  /* The names are spelled out: cuda.h's renaming macros do not reach string literals. */
  P.init = (init_fn)dlsym(h, "cuInit");
  P.device_get = (device_get_fn)dlsym(h, "cuDeviceGet");
  P.retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
  P.set_current = (set_current_fn)dlsym(h, "cuCtxSetCurrent");
  P.alloc = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
  P.free = (free_fn)dlsym(h, "cuMemFree_v2");
  P.gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
  if (!P.init || !P.device_get || !P.retain || !P.set_current || !P.alloc || !P.free || !P.gpa) {
    P.err = CUDA_ERROR_NOT_FOUND;
    return;
  }
  CUdevice dev;
  CUresult r = P.init(0);
  if (r == CUDA_SUCCESS) r = P.device_get(&dev, 0);
  if (r == CUDA_SUCCESS) r = P.retain(&P.ctx, dev);
  P.err = r;
}

/* Every entry makes the primary context current on the calling thread, as a plugin's own threads would. */
static CUresult ready(void) {
  pthread_once(&once, load);
  if (P.err != CUDA_SUCCESS) return P.err;
  return P.set_current(P.ctx);
}

PLUGIN_API int simplugin_alloc(size_t bytes, int n, CUdeviceptr *out) {
  CUresult r = ready();
  for (int i = 0; r == CUDA_SUCCESS && i < n; i++) r = P.alloc(&out[i], bytes);
  return (int)r;
}

PLUGIN_API int simplugin_free(const CUdeviceptr *p, int n) {
  CUresult r = ready();
  for (int i = 0; r == CUDA_SUCCESS && i < n; i++) r = P.free(p[i]);
  return (int)r;
}

PLUGIN_API int simplugin_alloc_via_procaddr(size_t bytes, CUdeviceptr *out) {
  CUresult r = ready();
  if (r != CUDA_SUCCESS) return (int)r;
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  r = P.gpa("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  if (r != CUDA_SUCCESS) return (int)r;
  return (int)((alloc_fn)fn)(out, bytes);
}
