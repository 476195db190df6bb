/* Route 3: cuGetProcAddress, including "cuGetProcAddress" itself, by version and flags. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <string.h>

typedef CUresult (*getproc_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc_v1_t)(const char *, void **, int, cuuint64_t);

Test(route_procaddr, every_entry_point_tracked_exactly) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  drv_api_t a;
  h_fill_procaddr(&a, h);
  cr_assert_gt(h_scenario(&a), 20);
}

static const char *lib_of(void *p) {
  Dl_info info;
  return dladdr(p, &info) && info.dli_fname ? info.dli_fname : "?";
}

Test(route_procaddr, the_getter_is_wrapped_at_both_abis) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  getproc_v2_t first = (getproc_v2_t)dlsym(h, "cuGetProcAddress_v2");
  void *g1 = NULL, *g2 = NULL;
  CUdriverProcAddressQueryResult st;
  cr_assert_eq(first("cuGetProcAddress", &g1, 11030, 0, &st), CUDA_SUCCESS);
  cr_assert_eq(first("cuGetProcAddress", &g2, 12000, 0, &st), CUDA_SUCCESS);
  cr_assert_not_null(strstr(lib_of(g1), "libgpureclaim"), "v1 getter from %s", lib_of(g1));
  cr_assert_not_null(strstr(lib_of(g2), "libgpureclaim"));
  cr_assert_neq(g1, g2, "4- and 5-argument getters are different functions");
  /* Through the re-fetched v1 (4 arguments) getter, allocations are still caught. */
  void *alloc = NULL;
  cr_assert_eq(((getproc_v1_t)g1)("cuMemAlloc", &alloc, 11030, 0), CUDA_SUCCESS);
  cr_assert_not_null(strstr(lib_of(alloc), "libgpureclaim"));
  void *init = NULL, *retain = NULL, *set = NULL;
  ((getproc_v1_t)g1)("cuInit", &init, 11030, 0);
  ((getproc_v1_t)g1)("cuDevicePrimaryCtxRetain", &retain, 11030, 0);
  ((getproc_v1_t)g1)("cuCtxSetCurrent", &set, 11030, 0);
  ((CUresult(*)(unsigned))init)(0);
  CUcontext ctx;
  ((CUresult(*)(CUcontext *, CUdevice))retain)(&ctx, 0);
  ((CUresult(*)(CUcontext))set)(ctx);
  CUdeviceptr p;
  cr_assert_eq(((CUresult(*)(CUdeviceptr *, size_t))alloc)(&p, 999), CUDA_SUCCESS);
  gpureclaim_block_t b;
  cr_assert(h_find(p, &b));
  cr_assert_eq(b.bytes, 999);
}

Test(route_procaddr, variants_follow_version_and_flags) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  getproc_v2_t g = (getproc_v2_t)dlsym(h, "cuGetProcAddress_v2");
  CUdriverProcAddressQueryResult st;
  void *plain = NULL, *ptsz = NULL, *old = NULL, *v4 = NULL, *v2 = NULL;
  cr_assert_eq(g("cuMemAllocAsync", &plain, 13000, 0, &st), CUDA_SUCCESS);
  cr_assert_eq(g("cuMemAllocAsync", &ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st), CUDA_SUCCESS);
  cr_assert_neq(plain, ptsz, "the per-thread variant keeps its own wrapper");
  cr_assert_eq(g("cuCtxCreate", &v2, 3020, 0, &st), CUDA_SUCCESS);
  cr_assert_eq(g("cuCtxCreate", &v4, 13000, 0, &st), CUDA_SUCCESS);
  cr_assert_neq(v2, v4, "an old ABI asked for on purpose gets its own wrapper");
  /* Below the first version of a variant: whatever the driver says, unchanged. */
  CUresult rc = g("cuMemAllocAsync", &old, 11000, 0, &st);
  cr_assert_eq(rc, CUDA_ERROR_NOT_FOUND);
  cr_assert_null(old);
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  /* Unknown names: the driver's answer, unchanged. */
  void *none = (void *)1;
  cr_assert_eq(g("cuNoSuchThing", &none, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  cr_assert_null(none);
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  /* Unhooked names come back behind a sleep gate (gate.c) that leads to the driver's own function. */
  void *name = NULL;
  cr_assert_eq(g("cuGetErrorName", &name, 13000, 0, &st), CUDA_SUCCESS);
  cr_assert_not_null(strstr(lib_of(name), "libgpureclaim"));
  const char *nm = NULL;
  cr_assert_eq(((CUresult(*)(CUresult, const char **))name)(CUDA_ERROR_INVALID_VALUE, &nm), CUDA_SUCCESS);
  cr_assert_str_eq(nm, "CUDA_ERROR_INVALID_VALUE");
  gpureclaim_stats_t s = {.size = sizeof s};
  gpureclaim_stats(-1, &s);
  cr_assert_eq(s.untracked_routes, 0);
}
