/* test_sim_procaddr.c -- cuGetProcAddress[_v2]: resolution by base name, version and flags; the request log. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <stdio.h>
#include <string.h>

#define PT CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* Asserts that (symbol, version, flags) resolves to the driver's exported `name`. */
static void expect(const char *symbol, int version, uint64_t flags, const char *name) {
  void *want = sim_dlsym(name);
  cr_assert_not_null(want, "%s is not exported", name);
  void *got = sim_proc(symbol, version, flags);
  cr_assert_eq(got, want, "%s@%d flags %llu: got %p, expected %s (%p)", symbol, version, (unsigned long long)flags,
               got, name, want);
}

static void expect_not_found(const char *symbol, int version, uint64_t flags, CUdriverProcAddressQueryResult why) {
  void *fn = (void *)0x1;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  ERR(cuGetProcAddress(symbol, &fn, version, flags, &st), CUDA_ERROR_NOT_FOUND);
  cr_assert_null(fn, "pfn is set to NULL on failure");
  cr_assert_eq(st, why, "%s@%d: status %d, expected %d", symbol, version, (int)st, (int)why);
}

Test(sim_procaddr, versions_select_the_abi) {
  expect("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
  expect("cuMemAlloc", 13000, 0, "cuMemAlloc_v2");
  expect("cuMemAlloc", 2000, 0, "cuMemAlloc");
  expect("cuMemAlloc", 3010, 0, "cuMemAlloc");
  expect("cuMemFree", 13000, 0, "cuMemFree_v2");
  expect("cuCtxCreate", 2000, 0, "cuCtxCreate");
  expect("cuCtxCreate", 3020, 0, "cuCtxCreate_v2");
  expect("cuCtxCreate", 11040, 0, "cuCtxCreate_v3");
  expect("cuCtxCreate", 12040, 0, "cuCtxCreate_v3");
  expect("cuCtxCreate", 12050, 0, "cuCtxCreate_v4");
  expect("cuCtxCreate", 13000, 0, "cuCtxCreate_v4");
  expect("cuCtxDestroy", 3020, 0, "cuCtxDestroy");
  expect("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2");
  expect("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease");
  expect("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease");
  expect("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2");
  expect("cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset");
  expect("cuDevicePrimaryCtxReset", 13000, 0, "cuDevicePrimaryCtxReset_v2");
  expect("cuCtxGetDevice", 12090, 0, "cuCtxGetDevice");
  expect("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2");
  expect("cuCtxSynchronize", 12000, 0, "cuCtxSynchronize");
  expect("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2");
  expect("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
  expect("cuGetProcAddress", 11080, 0, "cuGetProcAddress");
  expect("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
  expect("cuStreamDestroy", 13000, 0, "cuStreamDestroy_v2");
  expect("cuDeviceTotalMem", 13000, 0, "cuDeviceTotalMem_v2");
  expect("cuMemHostAlloc", 13000, 0, "cuMemHostAlloc");
  expect("cuMemCreate", 10020, 0, "cuMemCreate");
}

Test(sim_procaddr, per_thread_flag_selects_ptsz) {
  expect("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync");
  expect("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync");
  expect("cuMemAllocAsync", 13000, PT, "cuMemAllocAsync_ptsz");
  expect("cuMemFreeAsync", 13000, PT, "cuMemFreeAsync_ptsz");
  expect("cuMemAllocFromPoolAsync", 13000, PT, "cuMemAllocFromPoolAsync_ptsz");
  expect("cuStreamSynchronize", 13000, PT, "cuStreamSynchronize_ptsz");
  expect("cuStreamSynchronize", 6050, PT, "cuStreamSynchronize"); /* before the per-thread ABI existed */
  expect("cuStreamGetCtx", 11000, PT, "cuStreamGetCtx_ptsz");
  expect("cuStreamGetCtx", 13000, PT, "cuStreamGetCtx_v2_ptsz");
  expect("cuStreamGetCtx", 13000, 0, "cuStreamGetCtx_v2");
  expect("cuMemcpyHtoD", 13000, PT, "cuMemcpyHtoD_v2_ptds");
  expect("cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2");
  expect("cuMemsetD8", 13000, PT, "cuMemsetD8_v2_ptds");
  /* no per-thread variant: the legacy function */
  expect("cuMemAlloc", 13000, PT, "cuMemAlloc_v2");
  expect("cuMemPoolTrimTo", 13000, PT, "cuMemPoolTrimTo");
}

Test(sim_procaddr, failures) {
  expect_not_found("cuMemAlloc", 1000, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  expect_not_found("cuMemAllocAsync", 11010, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  expect_not_found("cuMemAllocAsync", 11010, PT, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  expect_not_found("cuDevicePrimaryCtxRelease", 6050, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  expect_not_found("cuNoSuchFunction", 13000, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  expect_not_found("cuMemAlloc_v2", 13000, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND); /* base names only */
  expect_not_found("cudaMalloc", 13000, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  void *fn = (void *)0x1;
  ERR(cuGetProcAddress(NULL, &fn, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuGetProcAddress("cuMemAlloc", NULL, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuGetProcAddress("cuMemAlloc", &fn, 13000, 4, NULL), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(fn, (void *)0x1);
  OK(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, NULL)); /* the status is optional */
  /* A version above the driver's own (13000) gets the newest ABI at or below it, as from the real driver. */
  for (int v = 13000; v <= 13020; v += 10) {
    fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    OK(cuGetProcAddress("cuMemAlloc", &fn, v, 0, &st));
    cr_assert_eq(fn, sim_dlsym("cuMemAlloc_v2"), "at %d", v);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
    OK(cuGetProcAddress("cuMemFreeAsync", &fn, v, PT, &st));
    cr_assert_eq(fn, sim_dlsym("cuMemFreeAsync_ptsz"), "at %d", v);
  }
  OK(cuGetProcAddress("cuMemSetMemPool", &fn, 13010, 0, NULL));
  cr_assert_eq(fn, sim_dlsym("cuMemSetMemPool"));
  expect_not_found("cuMemSetMemPool", 12090, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  expect_not_found("", 0, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND); /* the real runtime's first, empty probe */
}

Test(sim_procaddr, v1_abi_resolves_the_same_way) {
  CUresult (*gpa_v1)(const char *, void **, int, cuuint64_t) = sim_proc("cuGetProcAddress", 11030, 0);
  void *fn = NULL;
  OK(gpa_v1("cuMemAllocAsync", &fn, 12000, PT));
  cr_assert_eq(fn, sim_dlsym("cuMemAllocAsync_ptsz"));
  OK(gpa_v1("cuGetProcAddress", &fn, 12000, 0));
  cr_assert_eq(fn, sim_dlsym("cuGetProcAddress_v2"));
  fn = (void *)0x1;
  ERR(gpa_v1("cuNope", &fn, 12000, 0), CUDA_ERROR_NOT_FOUND);
  cr_assert_null(fn);
  cr_assert_eq(simcuda_calls("cuGetProcAddress"), 3);
}

Test(sim_procaddr, works_before_init_and_pointers_are_the_exports) {
  /* no cuInit: the runtime calls cuGetProcAddress first */
  CUresult (*alloc)(CUdeviceptr *, size_t) = sim_proc("cuMemAlloc", 13000, 0);
  cr_assert_eq((void *)alloc, (void *)cuMemAlloc_v2);
  CUresult (*init)(unsigned) = sim_proc("cuInit", 13000, 0);
  OK(init(0));
  sim_primary(0);
  uint64_t before = simcuda_calls("cuMemAlloc_v2");
  CUdeviceptr p;
  OK(alloc(&p, 4096));
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), before + 1, "counted under its exported name, whatever the route");
}

struct log_check {
  int n;
  char sym[4][32];
  int ver[4];
  uint64_t flags[4];
};

static void collect(const char *symbol, int version, uint64_t flags, void *arg) {
  struct log_check *c = arg;
  if (c->n < 4) {
    snprintf(c->sym[c->n], sizeof c->sym[0], "%s", symbol);
    c->ver[c->n] = version;
    c->flags[c->n] = flags;
  }
  c->n++;
}

Test(sim_procaddr, every_request_is_logged_in_order) {
  cr_assert_eq(simcuda_procaddr_requests(NULL, NULL), 0);
  void *fn;
  cuGetProcAddress("cuMemAlloc", &fn, 3020, 0, NULL);
  cuGetProcAddress("cuMemAllocAsync", &fn, 13000, PT, NULL);
  cuGetProcAddress("cuNope", &fn, 13000, 0, NULL);
  CUresult (*gpa_v1)(const char *, void **, int, cuuint64_t) = sim_dlsym("cuGetProcAddress");
  gpa_v1("cuInit", &fn, 11030, 1);
  struct log_check c = {0};
  cr_assert_eq(simcuda_procaddr_requests(collect, &c), 4);
  cr_assert_eq(c.n, 4);
  cr_assert_str_eq(c.sym[0], "cuMemAlloc");
  cr_assert_eq(c.ver[0], 3020);
  cr_assert_str_eq(c.sym[1], "cuMemAllocAsync");
  cr_assert_eq(c.flags[1], PT);
  cr_assert_str_eq(c.sym[2], "cuNope");
  cr_assert_str_eq(c.sym[3], "cuInit");
  cr_assert_eq(c.ver[3], 11030);
  cr_assert_eq(c.flags[3], 1);
}
