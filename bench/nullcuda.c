/*
 * nullcuda.c -- a null driver for bench_hooks: a libcuda.so.1 whose entry points do almost nothing, so that
 * what bench_hooks measures on it is gpureclaim's own cost and not the simulator's.
 *
 * One device, one context, one default pool, the NULL stream. Allocations come from a per-thread free list
 * (LIFO, so an allocate+free pair gets the same address back, as from a pool; it keeps every freed address,
 * so a program cycling through K live blocks reuses the same K addresses at any K) and, when it is empty, from
 * a shared bump pointer: every live block has an address of its own. Sizes are not kept (a free list serves
 * every size). It answers only what gpureclaim and bench_hooks ask; anything else is not exported.
 * cuInit starts an idle thread, as libcuda does (a single-threaded process gets cheaper glibc locks).
 * Not a simulator: no checks, no stream order, no accounting. Never use it for tests.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, NOT_FOUND = 500 };
#define API __attribute__((visibility("default"))) CUresult

static char g_ctx_obj, g_pool_obj;
static void *const g_ctx = &g_ctx_obj, *const g_pool = &g_pool_obj;
static __thread void *t_cur;

static _Atomic uint64_t g_bump = UINT64_C(0x7f0000000000);
static __thread uint64_t *t_free;
static __thread size_t t_nfree, t_cap;

static inline uint64_t take_addr(size_t bytes) {
  if (t_nfree)
    return t_free[--t_nfree];
  uint64_t stride = (bytes + 511) & ~(uint64_t)511;
  return atomic_fetch_add_explicit(&g_bump, stride ? stride : 512, memory_order_relaxed);
}
__attribute__((noinline)) static void grow_free(void) {
  size_t cap = t_cap ? 2 * t_cap : 4096;
  uint64_t *p = realloc(t_free, cap * sizeof *p);
  if (p)
    t_free = p, t_cap = cap;
}
static inline void give_addr(uint64_t p) {
  if (__builtin_expect(t_nfree == t_cap, 0))
    grow_free();
  if (t_nfree < t_cap)
    t_free[t_nfree++] = p;
}

static void *idle(void *arg) {
  (void)arg;
  for (;;)
    pause();
  return NULL;
}

static void start(void) {
  pthread_t th;
  if (pthread_create(&th, NULL, idle, NULL) == 0)
    pthread_detach(th);
}
API cuInit(unsigned flags) {
  (void)flags;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, start);
  return OK;
}
API cuDriverGetVersion(int *v) { *v = 13000; return OK; }
API cuDeviceGet(int *dev, int ordinal) { *dev = 0; return ordinal == 0 ? OK : INVALID_VALUE; }
API cuDeviceGetCount(int *n) { *n = 1; return OK; }
API cuDeviceGetName(char *name, int len, int dev) {
  (void)dev;
  if (len > 0)
    snprintf(name, (size_t)len, "null device");
  return OK;
}
API cuDeviceTotalMem_v2(size_t *b, int dev) { (void)dev; *b = (size_t)80 << 30; return OK; }
API cuDeviceGetAttribute(int *v, int attr, int dev) { (void)attr; (void)dev; *v = 0; return OK; }
API cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = g_ctx; return OK; }
API cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
API cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) {
  (void)dev;
  *flags = 0;
  *active = 1;
  return OK;
}
API cuCtxGetCurrent(void **ctx) { *ctx = t_cur; return OK; }
API cuCtxSetCurrent(void *ctx) { t_cur = ctx; return OK; }
API cuCtxGetDevice(int *dev) { *dev = 0; return OK; }
API cuCtxPushCurrent_v2(void *ctx) { t_cur = ctx; return OK; }
API cuCtxPopCurrent_v2(void **ctx) {
  if (ctx)
    *ctx = t_cur;
  return OK;
}
API cuCtxSynchronize(void) { return OK; }
API cuStreamGetCtx(void *stream, void **ctx) { (void)stream; *ctx = t_cur ? t_cur : g_ctx; return OK; }
API cuDeviceGetMemPool(void **pool, int dev) { (void)dev; *pool = g_pool; return OK; }
API cuDeviceGetDefaultMemPool(void **pool, int dev) { (void)dev; *pool = g_pool; return OK; }
API cuMemPoolGetAttribute(void *pool, int attr, void *value) {
  (void)pool;
  if (attr >= 1 && attr <= 3)
    *(int *)value = 0;
  else
    *(uint64_t *)value = 0;
  return OK;
}
API cuMemPoolSetAttribute(void *pool, int attr, void *value) { (void)pool; (void)attr; (void)value; return OK; }
API cuMemPoolTrimTo(void *pool, size_t keep) { (void)pool; (void)keep; return OK; }
API cuMemGetInfo_v2(size_t *free_b, size_t *total) {
  *free_b = (size_t)40 << 30;
  *total = (size_t)80 << 30;
  return OK;
}
API cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) { *p = take_addr(bytes); return OK; }
API cuMemFree_v2(CUdeviceptr p) { give_addr(p); return OK; }
API cuMemAllocAsync(CUdeviceptr *p, size_t bytes, void *stream) { (void)stream; *p = take_addr(bytes); return OK; }
API cuMemFreeAsync(CUdeviceptr p, void *stream) { (void)stream; give_addr(p); return OK; }
API cuMemFreeHost(void *p) { (void)p; return OK; }
API cuMemRelease(uint64_t h) { (void)h; return OK; }
API cuMemGetAllocationPropertiesFromHandle(void *prop, uint64_t h) { (void)prop; (void)h; return INVALID_VALUE; }
API cuMemUnmap(CUdeviceptr p, size_t size) { (void)p; (void)size; return OK; }
API cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return OK; }
API cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) { (void)data; (void)attr; (void)p; return INVALID_VALUE; }
API cuGetErrorName(CUresult e, const char **s) { *s = e == OK ? "CUDA_SUCCESS" : "CUDA_ERROR_NULL_DRIVER"; return OK; }
API cuGetErrorString(CUresult e, const char **s) { return cuGetErrorName(e, s); }

API cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, uint64_t flags, int *status);
API cuGetProcAddress(const char *symbol, void **pfn, int ver, uint64_t flags);

/* cuGetProcAddress answers by base name (the newest version of each), as the driver does. */
static const struct {
  const char *name;
  void *fn;
} g_procs[] = {
#define P(n, f) {n, (void *)f},
    P("cuInit", cuInit) P("cuDriverGetVersion", cuDriverGetVersion) P("cuDeviceGet", cuDeviceGet)
    P("cuDeviceGetCount", cuDeviceGetCount) P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2) P("cuCtxGetCurrent", cuCtxGetCurrent)
    P("cuCtxSetCurrent", cuCtxSetCurrent) P("cuCtxGetDevice", cuCtxGetDevice) P("cuStreamGetCtx", cuStreamGetCtx)
    P("cuDeviceGetMemPool", cuDeviceGetMemPool) P("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool)
    P("cuMemPoolGetAttribute", cuMemPoolGetAttribute) P("cuMemPoolSetAttribute", cuMemPoolSetAttribute)
    P("cuMemAlloc", cuMemAlloc_v2) P("cuMemFree", cuMemFree_v2) P("cuMemAllocAsync", cuMemAllocAsync)
    P("cuMemFreeAsync", cuMemFreeAsync) P("cuGetProcAddress", cuGetProcAddress_v2)
    P("cuGetErrorName", cuGetErrorName) P("cuGetErrorString", cuGetErrorString)
#undef P
};

API cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, uint64_t flags, int *status) {
  (void)ver;
  (void)flags;
  for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++)
    if (!strcmp(symbol, g_procs[i].name)) {
      *pfn = g_procs[i].fn;
      if (status)
        *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
      return OK;
    }
  *pfn = NULL;
  if (status)
    *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return NOT_FOUND;
}
API cuGetProcAddress(const char *symbol, void **pfn, int ver, uint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, ver, flags, NULL);
}
