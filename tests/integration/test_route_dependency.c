/* Runtime and dlsym routes taken from a library loaded only as another library's dependency (PyTorch's
 * libc10_cuda.so calls cudaMalloc that way). gpureclaim looks the real function up in the caller's own scope;
 * such a caller's link_map is no valid dlsym handle (glibc dereferences its missing search list), which once
 * crashed every PyTorch program on its first cudaMalloc. The program links neither libcuda nor libcudart:
 * they are only in the dependency's scope. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <string.h>

typedef int (*alloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef void *(*lookup_fn)(const char *);

static void *root(void) {
  void *h = dlopen("libgr_dep_root.so", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s", dlerror());
  return h;
}

Test(route_dependency, runtime_calls_tracked_and_attributed) {
  void *h = root();
  alloc_fn a = (alloc_fn)dlsym(h, "dep_leaf_alloc");
  free_fn f = (free_fn)dlsym(h, "dep_leaf_free");
  cr_assert(a && f, "the dependency's functions are in the root's scope");
  void *p = NULL, *q = NULL;
  cr_assert_eq(a(&p, 1 << 20), 0);
  cr_assert_eq(a(&q, 12345), 0);
  cr_assert(h_table_matches_sim("cudaMalloc from a dependency"));
  gpureclaim_block_t b;
  cr_assert(h_find((uint64_t)(uintptr_t)p, &b));
  cr_assert_str_eq(b.api, "cudaMalloc");
  cr_assert_not_null(strstr(b.library, "dep_leaf"), "attributed to %s", b.library);
  cr_assert_eq(f(p), 0);
  cr_assert_eq(f(q), 0);
  cr_assert(h_table_matches_sim("cudaFree from a dependency"));
  cr_assert_eq(h_count(GPURECLAIM_KIND_DEVICE), 0);
}

Test(route_dependency, dlsym_default_finds_the_dependencys_driver) {
  void *h = root();
  lookup_fn look = (lookup_fn)dlsym(h, "dep_leaf_lookup");
  cr_assert_not_null(look);
  /* Not wrapped by gpureclaim, and not in the global scope: found in the caller's scope, as glibc would. */
  void *fn = look("cuDeviceGetName");
  cr_assert_not_null(fn);
  cr_assert_eq(fn, dlsym(h_libcuda(), "cuDeviceGetName"));
  cr_assert_null(look("cuNoSuchFunction"));
}
