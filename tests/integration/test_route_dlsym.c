/* Route 2: dlopen("libcuda.so.1") and dlsym() of the driver's names, as PyTorch does for ~230 of them. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <string.h>

Test(route_dlsym, every_entry_point_tracked_exactly) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h);
  drv_api_t a;
  h_fill_dlsym(&a, h);
  cr_assert_gt(h_scenario(&a), 20);
}

Test(route_dlsym, only_driver_names_are_touched) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  /* cuGetErrorName is not hooked: it comes back behind a sleep gate (gate.c), which leads to the library's own. */
  void *p = dlsym(h, "cuGetErrorName");
  Dl_info info;
  cr_assert(dladdr(p, &info));
  cr_assert_not_null(strstr(info.dli_fname, "libgpureclaim"), "cuGetErrorName came from %s", info.dli_fname);
  const char *nm = NULL;
  cr_assert_eq(((CUresult(*)(CUresult, const char **))p)(CUDA_ERROR_OUT_OF_MEMORY, &nm), CUDA_SUCCESS);
  cr_assert_str_eq(nm, "CUDA_ERROR_OUT_OF_MEMORY");
  p = dlsym(h, "cuMemAlloc_v2");
  cr_assert(dladdr(p, &info));
  cr_assert_not_null(strstr(info.dli_fname, "libgpureclaim"), "cuMemAlloc_v2 came from %s", info.dli_fname);
  cr_assert_null(dlsym(h, "cuNoSuchFunction"));
  /* The old 32-bit cuMemAlloc ABI is not wrapped: only gated, and the gate leads to the driver's own. */
  p = dlsym(h, "cuMemAlloc");
  if (p) {
    cr_assert(dladdr(p, &info));
    cr_assert_not_null(strstr(info.dli_fname, "libgpureclaim"));
    cr_assert_neq(p, dlsym(h, "cuMemAlloc_v2"));
  }
}

Test(route_dlsym, rtld_default_finds_the_driver_through_gpureclaim) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(h);
  void *p = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
  cr_assert_not_null(p);
  Dl_info info;
  cr_assert(dladdr(p, &info));
  cr_assert_not_null(strstr(info.dli_fname, "libgpureclaim"));
}
