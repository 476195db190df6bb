/*
 * real.c -- the real entry points gpureclaim calls, resolved once.
 *
 * gpureclaim overrides dlsym and dlopen, so it must never call those public names itself (that would re-enter
 * its own overrides). libc's versions are reached with dlvsym, which gpureclaim does not override: dlvsym
 * with a version never matches gpureclaim's unversioned definitions.
 */
#include "real.h"
#include "export.h"
#include "state.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>

gr_drv_t gr_drv;

/* libc's own function: RTLD_NEXT finds it when libc comes after gpureclaim (always when preloaded or linked
 * at start-up); else libc's scope itself, found from one of its functions. Never RTLD_DEFAULT, which would
 * find gpureclaim's dlsym (it carries libc's versions). */
GR_NO_SANITIZE static void *libc_sym(const char *name) {
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
  Dl_info info;
  void *libc = NULL;
  if (!dladdr1((void *)&gnu_get_libc_version, &info, &libc, RTLD_DL_LINKMAP))
    libc = NULL;
  for (size_t i = 0; i < GR_ARRAY_LEN(versions); i++) {
    void *p = dlvsym(RTLD_NEXT, name, versions[i]);
    if (!p && libc)
      p = dlvsym(libc, name, versions[i]);
    if (p)
      return p;
  }
  return NULL;
}

GR_NO_SANITIZE const gr_real_libc_t *gr_real_libc(void) {
  static gr_real_libc_t real;
  static _Atomic int state; /* 0 unresolved, 2 resolved */
  if (GR_LIKELY(atomic_load_explicit(&state, memory_order_acquire) == 2))
    return &real;
  /* Racing first calls resolve the same values; the stores are idempotent. */
  void *s = libc_sym("dlsym"), *o = libc_sym("dlopen");
  __atomic_store_n((void **)&real.dlsym, s, __ATOMIC_RELAXED);
  __atomic_store_n((void **)&real.dlopen, o, __ATOMIC_RELAXED);
  atomic_store_explicit(&state, 2, memory_order_release);
  return &real;
}

/* A link_map from dladdr1 is a valid dlsym handle only for the main program and for objects that were
 * dlopen()ed themselves: glibc builds an object's search list when it is opened, not when it is loaded as
 * another object's dependency (libc10_cuda.so under torch's extension module), and dlsym on such a map
 * dereferences the missing list. dlopen(its name, RTLD_NOLOAD) builds it and yields a proper handle. */
void *gr_real_caller_sym(const void *caller, const char *name) {
  const gr_real_libc_t *r = gr_real_libc();
  Dl_info info;
  struct link_map *lm = NULL;
  if (!caller || !dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm || !lm->l_name)
    return NULL;
  if (!lm->l_name[0])
    return r->dlsym(lm, name); /* the main program: its search list is the global scope */
  void *h = r->dlopen(lm->l_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h)
    return NULL;
  void *fn = r->dlsym(h, name);
  dlclose(h); /* the object stays: it was loaded before, and is still needed by what loaded it */
  return fn;
}

void *gr_real_libcuda(void) {
  static _Atomic(void *) handle;
  void *h = atomic_load_explicit(&handle, memory_order_acquire);
  if (GR_LIKELY(h != NULL))
    return h;
  const gr_real_libc_t *r = gr_real_libc();
  if (!r->dlopen)
    return NULL;
  h = r->dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    h = r->dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h)
    atomic_store_explicit(&handle, h, memory_order_release);
  return h;
}

void *gr_real_driver(const char *name) {
  void *h = gr_real_libcuda();
  const gr_real_libc_t *r = gr_real_libc();
  return h && r->dlsym ? r->dlsym(h, name) : NULL;
}

int gr_real_resolve_drv(void) {
#define R(field, name) *(void **)&gr_drv.field = gr_real_driver(name)
  R(cuCtxGetCurrent, "cuCtxGetCurrent");
  R(cuCtxGetDevice, "cuCtxGetDevice");
  R(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  R(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  R(cuCtxSynchronize, "cuCtxSynchronize");
  R(cuCtxGetApiVersion, "cuCtxGetApiVersion");
  R(cuStreamGetCtx, "cuStreamGetCtx");
  R(cuDeviceGetCount, "cuDeviceGetCount");
  R(cuDeviceGet, "cuDeviceGet");
  R(cuDeviceGetMemPool, "cuDeviceGetMemPool");
  R(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
  R(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
  R(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  R(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  R(cuMemGetInfo, "cuMemGetInfo_v2");
  R(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
  R(cuMemPoolTrimTo, "cuMemPoolTrimTo");
  R(cuMemPoolGetAttribute, "cuMemPoolGetAttribute");
  R(cuMemFree, "cuMemFree_v2");
  R(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
  R(cuMemFreeHost, "cuMemFreeHost");
  R(cuMemRelease, "cuMemRelease");
  R(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
  R(cuMemUnmap, "cuMemUnmap");
  R(cuMemAddressFree, "cuMemAddressFree");
  R(cuGetErrorName, "cuGetErrorName");
#undef R
  return gr_drv.cuCtxGetCurrent && gr_drv.cuMemFree ? 0 : -1;
}
