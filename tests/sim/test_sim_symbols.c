/* test_sim_symbols.c -- the simulated libcuda.so.1 exports exactly the real driver's names (versioned ones
 * included, each a distinct function) plus simcuda_*, read from its dynamic symbol table. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const char *const k_expected[] = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName", "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2", "cuDeviceTotalMem",
    "cuDeviceTotalMem_v2", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2",
    "cuDevicePrimaryCtxGetState", "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4",
    "cuCtxDestroy", "cuCtxDestroy_v2", "cuCtxPushCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent",
    "cuCtxPopCurrent_v2", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxAttach", "cuCtxDetach",
    "cuCtxGetApiVersion", "cuGLCtxCreate", "cuGLCtxCreate_v2", "cuVDPAUCtxCreate", "cuVDPAUCtxCreate_v2", "cuCtxGetDevice", "cuCtxGetDevice_v2",
    "cuCtxSynchronize", "cuCtxSynchronize_v2", "cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocPitch",
    "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemFree", "cuMemFree_v2", "cuMemGetInfo", "cuMemGetInfo_v2",
    "cuMemGetAddressRange", "cuMemGetAddressRange_v2", "cuMemHostAlloc", "cuMemAllocHost", "cuMemAllocHost_v2",
    "cuMemFreeHost", "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH", "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoD", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds", "cuMemsetD8",
    "cuMemsetD8_v2", "cuMemsetD8_v2_ptds", "cuStreamCreate", "cuStreamDestroy", "cuStreamDestroy_v2",
    "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuStreamGetCtx", "cuStreamGetCtx_ptsz",
    "cuStreamGetCtx_v2", "cuStreamGetCtx_v2_ptsz", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", "cuMemPoolCreate",
    "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemPoolSetAttribute", "cuMemPoolGetAttribute",
    "cuDeviceGetDefaultMemPool", "cuDeviceGetMemPool", "cuDeviceSetMemPool", "cuMemAddressReserve",
    "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
    "cuMemGetAllocationGranularity", "cuGetErrorName", "cuGetErrorString", "cuGetProcAddress",
    "cuGetProcAddress_v2", "cuMemGetAllocationPropertiesFromHandle", "cuMemGetDefaultMemPool", "cuMemGetMemPool",
    "cuModuleGetLoadingMode", "cuLibraryLoadData", "cuLibraryUnload", "cuLibraryGetKernel", "cuKernelGetFunction",
    "simcuda_primary_context", /* (the simulated runtime's stand-in for a private route: simcuda.h) */
    "cuMemSetMemPool", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState", "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle", "cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
    "cuStreamBeginCapture_v2_ptsz", "cuStreamEndCapture",
    "cuStreamEndCapture_ptsz", "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz", "cuGraphDestroy",
    /* inspection interface */
    "simcuda_stats", "simcuda_foreach_block", "simcuda_inject", "simcuda_calls", "simcuda_procaddr_requests",
    "simcuda_set_capacity", "simcuda_arena", "simcuda_on_return", "simcuda_checkpoint_locked", "simcuda_on_enter",
    "simcuda_checkpoint_late_calls",
};
#define NEXPECTED (sizeof k_expected / sizeof k_expected[0])

static int expected_index(const char *name) {
  for (size_t i = 0; i < NEXPECTED; i++)
    if (strcmp(k_expected[i], name) == 0) return (int)i;
  return -1;
}

Test(sim_symbols, every_name_is_exported_as_a_distinct_function) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(h);
  void *addr[NEXPECTED];
  for (size_t i = 0; i < NEXPECTED; i++) {
    addr[i] = dlsym(h, k_expected[i]);
    cr_assert_not_null(addr[i], "libcuda.so.1 does not export %s", k_expected[i]);
    Dl_info info;
    cr_assert(dladdr(addr[i], &info) && info.dli_sname && strcmp(info.dli_sname, k_expected[i]) == 0,
              "%s resolves to %s", k_expected[i], info.dli_sname ? info.dli_sname : "?");
    for (size_t j = 0; j < i; j++)
      cr_assert_neq(addr[i], addr[j], "%s and %s are the same function", k_expected[i], k_expected[j]);
  }
  /* names a careless definition under cuda.h's macros would have produced are absent */
  cr_assert_null(dlsym(h, "cuMemAlloc_v2_v2"));
  cr_assert_null(dlsym(h, "cuMemAllocAsync_ptsz_ptsz"));
  dlclose(h);
}

Test(sim_symbols, dynamic_symbol_table_holds_exactly_the_expected_names) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' -D --defined-only '%s'", SIM_NM, SIM_CUDA_SO);
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f);
  int seen[NEXPECTED] = {0};
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    char addr[64], type[8], name[256];
    if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3) continue;
    char *at = strchr(name, '@');
    if (at) *at = 0;
    if (strcmp(name, "_init") == 0 || strcmp(name, "_fini") == 0) continue;
    int i = expected_index(name);
    cr_assert_geq(i, 0, "unexpected export %s", name);
    cr_assert_eq(type[0], 'T', "%s is exported as '%s', not as a function", name, type);
    seen[i]++;
    n++;
  }
  cr_assert_eq(pclose(f), 0, "%s failed", cmd);
  for (size_t i = 0; i < NEXPECTED; i++) cr_assert_eq(seen[i], 1, "%s appears %d times", k_expected[i], seen[i]);
  cr_assert_eq(n, (int)NEXPECTED);
}

Test(sim_symbols, every_exported_driver_name_is_an_entry_point) {
  /* each one is counted and can be made to fail: the inspection interface knows all of them */
  for (size_t i = 0; i < NEXPECTED; i++) {
    if (strncmp(k_expected[i], "simcuda_", 8) == 0) continue;
    cr_assert_eq(simcuda_inject(k_expected[i], CUDA_ERROR_UNKNOWN, 0), 0, "%s unknown to simcuda_inject",
                 k_expected[i]);
  }
}

/* The driver's name for the function an exported variant is: cuMemcpyHtoD_v2_ptds -> cuMemcpyHtoD. */
static void base_name(const char *sym, char *out, size_t n) {
  snprintf(out, n, "%s", sym);
  for (;;) {
    size_t len = strlen(out);
    char *u = strrchr(out, '_');
    if (!u) return;
    if (strcmp(u, "_ptsz") == 0 || strcmp(u, "_ptds") == 0 ||
        (u[1] == 'v' && u[2] >= '0' && u[2] <= '9' && u + 3 == out + len))
      *u = 0;
    else
      return;
  }
}

Test(sim_symbols, cuGetProcAddress_hands_out_every_exported_driver_function) {
  /* Each exported variant is some (base name, version, flags) answer of cuGetProcAddress: a table row that lost its
   * variant, or points at another one, leaves a variant no query reaches. */
  static const int versions[] = {2000,  2020,  3010,  3020,  4000,  4010,  6000,  7000,  9020,  10000, 10010,
                                 10020, 11000, 11020, 11030, 11040, 12000, 12050, 12080, 13000, 13010};
  int checked = 0;
  for (size_t i = 0; i < NEXPECTED; i++) {
    if (strncmp(k_expected[i], "cu", 2) != 0) continue;
    void *want = sim_dlsym(k_expected[i]);
    cr_assert_not_null(want, "%s is not exported", k_expected[i]);
    char base[128];
    base_name(k_expected[i], base, sizeof base);
    int found = 0;
    for (size_t v = 0; v < sizeof versions / sizeof versions[0] && !found; v++)
      for (uint64_t fl = 0; fl <= CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && !found;
           fl += CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        if (cuGetProcAddress(base, &fn, versions[v], fl, &st) == CUDA_SUCCESS && fn == want) found = 1;
      }
    cr_assert(found, "no cuGetProcAddress(\"%s\", version, flags) answers %s", base, k_expected[i]);
    checked++;
  }
  cr_assert_geq(checked, 100, "only %d driver names checked", checked);
}
