/* sim_test_util.c -- helpers shared by the simulator's Criterion suites. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <dlfcn.h>

CUcontext sim_primary(int dev) {
  CUdevice d;
  CUcontext c;
  OK(cuInit(0));
  OK(cuDeviceGet(&d, dev));
  OK(cuDevicePrimaryCtxRetain(&c, d));
  OK(cuCtxSetCurrent(c));
  return c;
}

simcuda_stats_t sim_stats(int dev, CUcontext ctx) {
  simcuda_stats_t s = {.size = sizeof s};
  OK(simcuda_stats(dev, ctx, &s));
  return s;
}

struct count_arg {
  int kind;
  uint64_t address;
  int n;
  simcuda_block_t last;
};

static int count_cb(const simcuda_block_t *b, void *arg) {
  struct count_arg *a = arg;
  if ((a->kind == 0 || b->kind == a->kind) && (a->address == 0 || b->address == a->address)) {
    a->n++;
    a->last = *b;
  }
  return 0;
}

int sim_count_blocks(int kind, uint64_t address) {
  struct count_arg a = {.kind = kind, .address = address};
  cr_assert_eq(simcuda_foreach_block(count_cb, &a), 0);
  return a.n;
}

simcuda_block_t sim_block(uint64_t address, int kind) {
  struct count_arg a = {.kind = kind, .address = address};
  simcuda_foreach_block(count_cb, &a);
  cr_assert_eq(a.n, 1, "expected one block at %#llx (kind %d), found %d", (unsigned long long)address, kind, a.n);
  return a.last;
}

void *sim_proc(const char *symbol, int version, uint64_t flags) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
  CUresult r = cuGetProcAddress(symbol, &fn, version, flags, &st);
  cr_assert_eq(r, CUDA_SUCCESS, "cuGetProcAddress(%s, %d, %llu) -> %d", symbol, version, (unsigned long long)flags,
               (int)r);
  cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
  cr_assert_not_null(fn);
  return fn;
}

void *sim_dlsym(const char *name) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(h, "libcuda.so.1 not loaded");
  void *p = dlsym(h, name);
  dlclose(h);
  return p;
}
