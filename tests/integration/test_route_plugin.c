/* Route 5: a plugin loaded with RTLD_DEEPBIND that dlopen()s libcuda.so.1 itself and dlsym()s driver entry
 * points by name. Its references to dlsym/dlopen bind to libc's own, past the preloaded overrides; gpureclaim's
 * dlopen override redirects them (and its driver references) in the objects such a load brings in. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dlfcn.h>

/* AddressSanitizer refuses RTLD_DEEPBIND loads (google/sanitizers#611) and its dlopen interceptor makes
 * itself the caller glibc sees, which defeats RUNPATH-relative loads whatever gpureclaim does. These tests run
 * in the normal build. */
#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN() cr_skip_test("AddressSanitizer changes dlopen itself (RTLD_DEEPBIND, the caller's RUNPATH)")
#else
#define SKIP_UNDER_ASAN() ((void)0)
#endif

typedef CUresult (*alloc_fn)(size_t, int, CUdeviceptr *);
typedef CUresult (*free_fn)(const CUdeviceptr *, int);
typedef CUresult (*pa_fn)(size_t, CUdeviceptr *);

Test(route_plugin, deepbind_plugin_allocations_are_tracked) {
  SKIP_UNDER_ASAN();
  void *h = dlopen("libsimplugin.so", RTLD_NOW | RTLD_DEEPBIND | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  alloc_fn a = (alloc_fn)dlsym(h, "simplugin_alloc");
  free_fn f = (free_fn)dlsym(h, "simplugin_free");
  pa_fn pa = (pa_fn)dlsym(h, "simplugin_alloc_via_procaddr");
  cr_assert(a && f && pa);
  CUdeviceptr p[4];
  cr_assert_eq(a(4096, 4, p), CUDA_SUCCESS);
  cr_assert(h_table_matches_sim("plugin cuMemAlloc_v2 by dlsym"));
  cr_assert_eq(h_count(GPURECLAIM_KIND_DEVICE), 4);
  gpureclaim_block_t b;
  cr_assert(h_find(p[0], &b));
  cr_assert_not_null(strstr(b.library, "simplugin"), "attributed to %s", b.library);
  CUdeviceptr q;
  cr_assert_eq(pa(777, &q), CUDA_SUCCESS);
  cr_assert(h_table_matches_sim("plugin cuMemAlloc through cuGetProcAddress_v2"));
  cr_assert_eq(f(p, 4), CUDA_SUCCESS);
  cr_assert(h_table_matches_sim("plugin frees"));
  cr_assert_eq(h_count(GPURECLAIM_KIND_DEVICE), 1);
}

/* The dlopen/dlsym overrides must not change what glibc resolves relative to the caller. */
typedef void *(*load_fn)(void);
typedef int (*probe_fn)(void);

Test(route_plugin, runpath_relative_dlopen_still_works) {
  SKIP_UNDER_ASAN();
  void *h = dlopen("librp_outer.so", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  load_fn load = (load_fn)dlsym(h, "rp_outer_load");
  cr_assert_not_null(load(), "librp_inner.so is only on librp_outer.so's RUNPATH");
}

Test(route_plugin, runpath_relative_dlopen_works_under_deepbind) {
  SKIP_UNDER_ASAN();
  void *h = dlopen("librp_outer.so", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  cr_assert_not_null(h, "%s", dlerror());
  load_fn load = (load_fn)dlsym(h, "rp_outer_load");
  cr_assert_not_null(load());
}

Test(route_plugin, rtld_next_is_relative_to_the_caller) {
  /* next_a.so (which depends on next_b.so) and next_b.so both define next_probe_value(); next_a's
   * dlsym(RTLD_NEXT) must find next_b's. Resolved relative to libgpureclaim.so instead, it finds nothing. */
  void *a = dlopen("libnext_a.so", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(a, "%s", dlerror());
  probe_fn probe = (probe_fn)dlsym(a, "next_a_probe");
  cr_assert_eq(probe(), 2, "RTLD_NEXT from libnext_a.so must reach libnext_b.so");
}
