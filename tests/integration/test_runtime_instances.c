/* A process with several CUDA runtime instances, as a cuBLAS program is (docs/ARCHITECTURE.md, "The real CUDA 13
 * runtime, as the simulator models it"): the program's shared runtime, a static one inside libsimblas.so (cuBLAS's
 * stand-in, whose workspace comes from its own runtime through cuGetProcAddress) and one inside libsimblaslt.so
 * (cublasLt's, which also looks up driver entry points with dlsym() on its own handle of libcuda.so.1 and allocates
 * through them). Each runtime retains the one primary context; gpureclaim tracks every block of all three in it,
 * by whichever route, attributed to the library that made the call. */
#include "harness.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define RT_OK(call) cr_assert_eq((call), cudaSuccess, "%s", #call)
#define MiB (1024ull * 1024)

typedef int (*blas_create_t)(void *ws[3]);
typedef int (*lt_create_t)(const char **missing);
typedef CUresult (*lt_alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*lt_free_t)(CUdeviceptr);
typedef void *(*lt_fn_t)(const char *);

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  cr_assert_not_null(p, "%s: %s", name, dlerror());
  return p;
}

static void *open_fixture(const char *name) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "%s: %s", name, dlerror());
  return h;
}

/* What gpureclaim says of the block at address: its context and the file name of the library that made it. */
typedef struct {
  uint64_t address;
  void *context;
  char library[256];
  bool found;
} seen_t;

static int find(const gpureclaim_block_t *b, void *arg) {
  seen_t *s = arg;
  if (b->address != s->address) return 0;
  s->found = true;
  s->context = b->context;
  const char *slash = b->library ? strrchr(b->library, '/') : NULL;
  snprintf(s->library, sizeof s->library, "%s", slash ? slash + 1 : b->library ? b->library : "");
  return 1;
}

static seen_t seen(uint64_t address) {
  seen_t s = {.address = address};
  gpureclaim_foreach_block(find, &s);
  cr_assert(s.found, "gpureclaim does not track %#llx", (unsigned long long)address);
  return s;
}

Test(runtime_instances, three_runtimes_share_one_primary_context_and_every_block_is_tracked) {
  void *mine;
  RT_OK(cudaMalloc(&mine, 1 * MiB)); /* the program's runtime */
  void *blas = open_fixture("libsimblas.so"), *lt = open_fixture("libsimblaslt.so");
  void *ws[3];
  cr_assert_eq(((blas_create_t)sym(blas, "simblas_create"))(ws), 0, "the cuBLAS stand-in's workspace");
  const char *missing = NULL;
  cr_assert_eq(((lt_create_t)sym(lt, "simblaslt_create"))(&missing), 0, "missing: %s", missing ? missing : "-");
  CUdeviceptr lt_block;
  cr_assert_eq(((lt_alloc_t)sym(lt, "simblaslt_alloc"))(&lt_block, 2 * MiB), CUDA_SUCCESS);

  simcuda_stats_t st = h_sim(0, NULL);
  cr_assert_eq(st.primary_retains, 3, "each runtime instance retains the primary context: %llu",
               (unsigned long long)st.primary_retains);
  cr_assert_eq(st.contexts, 1);
  cr_assert_eq(simcuda_calls("cuCtxSetCurrent"), 1, "the thread's context was set once, by the first runtime");
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxRetain"), 3);
  cr_assert_eq(simcuda_calls("cuModuleGetLoadingMode"), 3, "every runtime started on its own");

  /* Every block, each route's, in the one primary context, attributed to the library that made the call. */
  cr_assert(h_table_matches_sim("three runtimes"));
  CUcontext primary;
  cr_assert_eq(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  seen_t a = seen((uint64_t)(uintptr_t)mine), c = seen((uint64_t)lt_block);
  cr_assert_eq(a.context, (void *)primary);
  cr_assert_eq(c.context, (void *)primary);
  cr_assert_str_eq(c.library, "libsimblaslt.so", "the dlsym route's block is the library's: %s", c.library);
  for (int i = 0; i < 3; i++) {
    seen_t w = seen((uint64_t)(uintptr_t)ws[i]);
    cr_assert_eq(w.context, (void *)primary);
    cr_assert_str_eq(w.library, "libsimblas.so", "the workspace is the library's: %s", w.library);
  }
  cr_assert_eq(h_grs(-1).contexts, 1, "one context, however many runtimes retained it");

  /* Freed through each route: the table follows, and no free was one gpureclaim did not know. */
  uint64_t untracked = h_grs(-1).untracked_frees;
  cr_assert_eq(((lt_free_t)sym(lt, "simblaslt_free"))(lt_block), CUDA_SUCCESS);
  cr_assert_eq(((blas_create_t)sym(blas, "simblas_destroy"))(ws), 0);
  RT_OK(cudaFree(mine));
  cr_assert_eq(h_grs(-1).untracked_frees, untracked);
  cr_assert_eq(h_grs(-1).live_blocks, 0);
  cr_assert(h_table_matches_sim("after the frees"));
}

/* The entry points libcublasLt looks up with dlsym() on its own handle come from gpureclaim: the allocation
 * entry points wrapped, the others behind a sleep gate; none is the driver's own. */
Test(runtime_instances, a_library_s_own_dlsym_lookups_come_from_gpureclaim) {
  void *lt = open_fixture("libsimblaslt.so");
  const char *missing = NULL;
  cr_assert_eq(((lt_create_t)sym(lt, "simblaslt_create"))(&missing), 0, "missing: %s", missing ? missing : "-");
  lt_fn_t fn = (lt_fn_t)sym(lt, "simblaslt_fn");
  static const char *const names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "cuGetErrorName", "cuLaunchKernel",
                                      "cuLibraryLoadData"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    Dl_info info;
    void *p = fn(names[i]);
    cr_assert(p && dladdr(p, &info), "%s", names[i]);
    cr_assert_not_null(strstr(info.dli_fname, "libgpureclaim"), "%s came from %s", names[i], info.dli_fname);
  }
  cr_assert_eq(h_grs(-1).untracked_routes, 0);
}
