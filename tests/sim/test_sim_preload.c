/* test_sim_preload.c -- runs with libsimpreload.so preloaded, which defines driver names the way an
 * interposer does. The simulator must hand out its own functions from cuGetProcAddress and never reach the
 * preloaded definitions from inside (a real libcuda binds internally to itself). */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <dlfcn.h>

typedef int (*hits_fn)(void);

Test(sim_preload, the_driver_never_binds_to_preloaded_names) {
  hits_fn hits = (hits_fn)dlsym(RTLD_DEFAULT, "simpreload_hits");
  cr_assert_not_null(hits, "libsimpreload.so is not preloaded");
  void *preloaded = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
  void *own = sim_dlsym("cuMemAlloc_v2");
  cr_assert_neq(preloaded, own, "the preloaded definition must win global lookup, or this test proves nothing");

  typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  gpa_t gpa = (gpa_t)sim_dlsym("cuGetProcAddress_v2");
  void *fn = NULL;
  cr_assert_eq(gpa("cuMemAlloc", &fn, 13000, 0, NULL), CUDA_SUCCESS);
  cr_assert_eq(fn, own, "cuGetProcAddress returns the driver's own function");
  cr_assert_eq(gpa("cuGetProcAddress", &fn, 12000, 0, NULL), CUDA_SUCCESS);
  cr_assert_eq(fn, (void *)gpa);

#define GET(type, name, sym)                                                                                  \
  __typeof__(type) name;                                                                                      \
  cr_assert_eq(gpa(sym, (void **)&name, 13000, 0, NULL), CUDA_SUCCESS)
  GET(CUresult (*)(unsigned), init, "cuInit");
  GET(CUresult (*)(CUcontext *, CUdevice), retain, "cuDevicePrimaryCtxRetain");
  GET(CUresult (*)(CUcontext), set_current, "cuCtxSetCurrent");
  GET(CUresult (*)(CUdeviceptr *, size_t), alloc, "cuMemAlloc");
  GET(CUresult (*)(CUdeviceptr), mfree, "cuMemFree");
  GET(CUresult (*)(CUdeviceptr *, size_t, CUstream), alloc_async, "cuMemAllocAsync");
  GET(CUresult (*)(CUdeviceptr, CUstream), free_async, "cuMemFreeAsync");
  GET(CUresult (*)(CUstream), sync, "cuStreamSynchronize");
  GET(CUresult (*)(void **, size_t, unsigned), host_alloc, "cuMemHostAlloc");
  GET(CUresult (*)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice), create, "cuCtxCreate");
  GET(CUresult (*)(CUcontext), destroy, "cuCtxDestroy");
  GET(CUresult (*)(CUdevice), reset, "cuDevicePrimaryCtxReset");
  GET(CUresult (*)(CUmemoryPool *, CUdevice), default_pool, "cuDeviceGetDefaultMemPool");
  GET(CUresult (*)(CUmemoryPool, size_t), trim, "cuMemPoolTrimTo");

  CUcontext pc, c;
  CUdeviceptr p, q;
  void *h;
  CUmemoryPool pool;
  cr_assert_eq(init(0), CUDA_SUCCESS);
  cr_assert_eq(retain(&pc, 0), CUDA_SUCCESS);
  cr_assert_eq(set_current(pc), CUDA_SUCCESS);
  cr_assert_eq(alloc(&p, MiB), CUDA_SUCCESS);
  cr_assert_eq(mfree(p), CUDA_SUCCESS);
  cr_assert_eq(alloc_async(&q, MiB, NULL), CUDA_SUCCESS);
  cr_assert_eq(free_async(q, NULL), CUDA_SUCCESS);
  cr_assert_eq(sync(NULL), CUDA_SUCCESS); /* releases pool memory internally */
  cr_assert_eq(create(&c, NULL, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(alloc(&p, MiB), CUDA_SUCCESS);
  cr_assert_eq(alloc_async(&q, MiB, NULL), CUDA_SUCCESS);
  cr_assert_eq(host_alloc(&h, 4096, 0), CUDA_SUCCESS);
  cr_assert_eq(destroy(c), CUDA_SUCCESS); /* frees all of them internally */
  cr_assert_eq(default_pool(&pool, 0), CUDA_SUCCESS);
  cr_assert_eq(trim(pool, 0), CUDA_SUCCESS);
  cr_assert_eq(alloc(&p, MiB), CUDA_SUCCESS);
  cr_assert_eq(reset(0), CUDA_SUCCESS);
  simcuda_stats_t s = sim_stats(-1, NULL);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.host_blocks, 0);
  cr_assert_eq(s.pool_reserved_bytes, 0);
  cr_assert_eq(hits(), 0, "the simulator called a preloaded definition %d times", hits());
}
