/* test_sim_driver.c -- the simulated driver's entry points: success and error behaviour, capacity, reuse. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include "../common/rng.h"
#include "../common/threads.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SENTINEL ((CUdeviceptr)0xdeadbeef)

Test(sim_driver, before_init) {
  CUdeviceptr p = SENTINEL;
  CUdevice d = 77;
  int v = 0;
  ERR(cuMemAlloc(&p, 1024), CUDA_ERROR_NOT_INITIALIZED);
  cr_assert_eq(p, SENTINEL);
  ERR(cuDeviceGet(&d, 0), CUDA_ERROR_NOT_INITIALIZED);
  cr_assert_eq(d, 77);
  ERR(cuCtxGetCurrent(&(CUcontext){0}), CUDA_ERROR_NOT_INITIALIZED);
  /* these work before cuInit */
  OK(cuDriverGetVersion(&v));
  cr_assert_eq(v, 13000);
  const char *s = NULL;
  OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  cr_assert_str_eq(s, "CUDA_ERROR_OUT_OF_MEMORY");
  simcuda_stats_t st = sim_stats(-1, NULL);
  cr_assert_eq(st.capacity_bytes, 2 * 80 * GiB, "two devices of 80 GiB by default");
  cr_assert_eq(sim_stats(1, NULL).capacity_bytes, 80 * GiB);
  cr_assert_eq(st.live_blocks, 0);
  ERR(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  OK(cuInit(0));
  OK(cuInit(0)); /* idempotent */
  ERR(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_driver, no_device) {
  setenv("SIMCUDA_DEVICES", "0", 1);
  ERR(cuInit(0), CUDA_ERROR_NO_DEVICE);
}

Test(sim_driver, devices_and_attributes) {
  setenv("SIMCUDA_DEVICES", "3", 1);
  setenv("SIMCUDA_DEVICE_MEM", "4G", 1);
  OK(cuInit(0));
  int n = 0;
  OK(cuDeviceGetCount(&n));
  cr_assert_eq(n, 3);
  CUdevice d = -1;
  OK(cuDeviceGet(&d, 2));
  cr_assert_eq(d, 2);
  d = -1;
  ERR(cuDeviceGet(&d, 3), CUDA_ERROR_INVALID_DEVICE);
  cr_assert_eq(d, -1);
  ERR(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  char name[64];
  OK(cuDeviceGetName(name, sizeof name, 1));
  cr_assert(strstr(name, "H100") != NULL, "%s", name);
  ERR(cuDeviceGetName(name, 0, 1), CUDA_ERROR_INVALID_VALUE);
  ERR(cuDeviceGetName(name, sizeof name, 5), CUDA_ERROR_INVALID_DEVICE);
  /* A UUID per device: the same for the same ordinal, different between devices, version 4. */
  CUuuid u0, u1, u1b;
  OK(cuDeviceGetUuid(&u0, 0));
  OK(cuDeviceGetUuid(&u1, 1));
  OK(cuDeviceGetUuid_v2(&u1b, 1));
  cr_assert(memcmp(u0.bytes, u1.bytes, 16) != 0);
  cr_assert(memcmp(u1.bytes, u1b.bytes, 16) == 0);
  cr_assert_eq((unsigned char)u0.bytes[6] >> 4, 4u);
  ERR(cuDeviceGetUuid(&u0, 3), CUDA_ERROR_INVALID_DEVICE);
  ERR(cuDeviceGetUuid(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  size_t total = 0;
  OK(cuDeviceTotalMem(&total, 0));
  cr_assert_eq(total, 4 * GiB);
  ERR(cuDeviceTotalMem(&total, 9), CUDA_ERROR_INVALID_DEVICE);
  cr_assert_eq(sim_stats(-1, NULL).capacity_bytes, 12 * GiB);

  static const struct {
    CUdevice_attribute a;
    int v;
  } want[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},  {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},   {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
      {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1}, {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
      {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0},              {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int v = -1;
    OK(cuDeviceGetAttribute(&v, want[i].a, 2));
    cr_assert_eq(v, want[i].v, "attribute %d: %d, expected %d", (int)want[i].a, v, want[i].v);
  }
  int v = -1;
  ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 3), CUDA_ERROR_INVALID_DEVICE);
  ERR(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(v, -1);
}

Test(sim_driver, alloc_needs_context_and_valid_arguments) {
  OK(cuInit(0));
  CUdeviceptr p = SENTINEL;
  ERR(cuMemAlloc(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(p, SENTINEL);
  sim_primary(0);
  ERR(cuMemAlloc(NULL, 1024), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(p, SENTINEL);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
}

Test(sim_driver, alloc_free_and_stats) {
  CUcontext ctx = sim_primary(0);
  CUdeviceptr a, b, c;
  OK(cuMemAlloc(&a, 1000));
  OK(cuMemAlloc(&b, 3 * MiB));
  OK(cuMemAlloc(&c, 1));
  cr_assert(a && b && c);
  cr_assert_eq(a % 512, 0);
  cr_assert_eq(b % (2 * MiB), 0, "large blocks are 2 MiB aligned like the real driver's");
  cr_assert_eq(c % 512, 0);
  cr_assert(a != b && b != c && a != c);
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 3);
  cr_assert_eq(s.live_bytes, 1000 + 3 * MiB + 1);
  cr_assert_eq(s.used_bytes, 1000 + 3 * MiB + 1);
  cr_assert_eq(s.contexts, 1);
  simcuda_block_t blk = sim_block(b, SIMCUDA_DEVICE);
  cr_assert_eq(blk.bytes, 3 * MiB);
  cr_assert_eq(blk.device, 0);
  cr_assert_eq(blk.ctx, ctx);
  cr_assert_eq(sim_stats(0, ctx).live_blocks, 3);

  OK(cuMemFree(b));
  ERR(cuMemFree(b), CUDA_ERROR_INVALID_VALUE); /* double free */
  ERR(cuMemFree(a + 512), CUDA_ERROR_INVALID_VALUE); /* interior pointer */
  ERR(cuMemFree(0x12345000), CUDA_ERROR_INVALID_VALUE); /* never allocated */
  OK(cuMemFree(0));                                  /* free(NULL) semantics */
  s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 2);
  cr_assert_eq(s.live_bytes, 1001);
  cr_assert_eq(sim_count_blocks(0, b), 0);
  OK(cuMemFree(a));
  OK(cuMemFree(c));
  cr_assert_eq(sim_stats(-1, NULL).live_blocks, 0);
  cr_assert_eq(sim_stats(-1, NULL).used_bytes, 0);
}

Test(sim_driver, freed_addresses_are_reused_lifo) {
  sim_primary(0);
  CUdeviceptr a, b, c, d, e;
  OK(cuMemAlloc(&a, 64 * MiB));
  OK(cuMemAlloc(&b, 64 * MiB));
  OK(cuMemFree(a));
  OK(cuMemFree(b));
  OK(cuMemAlloc(&c, 64 * MiB));
  OK(cuMemAlloc(&d, 62 * MiB)); /* same size class (rounds to 64 MiB) */
  cr_assert_eq(c, b, "the last freed address comes back first");
  cr_assert_eq(d, a);
  OK(cuMemAlloc(&e, 64 * MiB));
  cr_assert(e != a && e != b);
}

Test(sim_driver, out_of_memory_at_capacity) {
  setenv("SIMCUDA_DEVICE_MEM", "1G", 1);
  sim_primary(0);
  CUdeviceptr a, b, c = SENTINEL;
  OK(cuMemAlloc(&a, 512 * MiB));
  OK(cuMemAlloc(&b, 512 * MiB));
  ERR(cuMemAlloc(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(c, SENTINEL);
  size_t fr = 1, total = 0;
  OK(cuMemGetInfo(&fr, &total));
  cr_assert_eq(fr, 0);
  cr_assert_eq(total, GiB);
  OK(cuMemFree(a));
  OK(cuMemGetInfo(&fr, &total));
  cr_assert_eq(fr, 512 * MiB);
  ERR(cuMemAlloc(&c, 512 * MiB + 1), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuMemAlloc(&c, 512 * MiB));
  ERR(cuMemAlloc(&c, (size_t)-1), CUDA_ERROR_OUT_OF_MEMORY);
  ERR(cuMemGetInfo(NULL, &total), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_driver, capacity_set_at_run_time) {
  sim_primary(0);
  CUdeviceptr a, b;
  OK(cuMemAlloc(&a, 100 * MiB));
  simcuda_set_capacity(0, 64 * MiB);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 1, "existing memory is kept above the new capacity");
  ERR(cuMemAlloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuMemFree(a));
  OK(cuMemAlloc(&b, 64 * MiB));
  size_t total;
  OK(cuDeviceTotalMem(&total, 0));
  cr_assert_eq(total, 64 * MiB);
}

Test(sim_driver, capacity_set_before_init) {
  simcuda_set_capacity(-1, 10 * MiB);
  cr_assert_eq(sim_stats(0, NULL).capacity_bytes, 10 * MiB);
  sim_primary(0);
  CUdeviceptr a;
  ERR(cuMemAlloc(&a, 11 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuMemAlloc(&a, 10 * MiB));
}

Test(sim_driver, huge_blocks_up_to_capacity) {
  sim_primary(0);
  CUdeviceptr a, b, c;
  OK(cuMemAlloc(&a, 60 * GiB));
  OK(cuMemAlloc(&b, 20 * GiB));
  ERR(cuMemAlloc(&c, 512), CUDA_ERROR_OUT_OF_MEMORY);
  /* the simulated memory is real (committed only when touched): write at both ends */
  OK(cuMemsetD8(a + 60 * GiB - 4096, 0x5a, 4096));
  unsigned char x = 0;
  OK(cuMemcpyDtoH(&x, a + 60 * GiB - 1, 1));
  cr_assert_eq(x, 0x5a);
  OK(cuMemFree(a));
  OK(cuMemFree(b));
}

/* Address space recycling: when the arena is exhausted by cached chunks of other size classes, the caches
 * are coalesced back and the allocation still succeeds. */
Test(sim_driver, arena_address_space_is_recycled) {
  sim_primary(0);
  uint64_t base = 0, size = 0;
  cr_assert_geq(simcuda_arena(0, &base, &size), 0);
  simcuda_set_capacity(0, size);
  uint64_t total = 0;
  for (int k = 0; k < 12; k++) {
    uint64_t bytes = size / 4 + (uint64_t)k * (size / 32); /* a new size class each round */
    CUdeviceptr p;
    OK(cuMemAlloc(&p, bytes));
    cr_assert(p >= base && p + bytes <= base + size);
    OK(cuMemFree(p));
    total += bytes;
  }
  cr_assert_gt(total, size, "the rounds used more address space than the arena has");
}

Test(sim_driver, pitch_and_managed) {
  sim_primary(0);
  CUdeviceptr p = SENTINEL;
  size_t pitch = 0;
  OK(cuMemAllocPitch(&p, &pitch, 1000, 7, 4));
  cr_assert_eq(pitch % 512, 0);
  cr_assert_geq(pitch, 1000);
  simcuda_block_t b = sim_block(p, SIMCUDA_PITCH);
  cr_assert_eq(b.bytes, pitch * 7);
  CUdeviceptr q = SENTINEL;
  ERR(cuMemAllocPitch(&q, &pitch, 1000, 7, 3), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAllocPitch(&q, &pitch, 0, 7, 4), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(q, SENTINEL);
  OK(cuMemFree(p));

  OK(cuMemAllocManaged(&q, 5000, CU_MEM_ATTACH_GLOBAL));
  cr_assert_eq(sim_block(q, SIMCUDA_MANAGED).bytes, 5000);
  memset((void *)(uintptr_t)q, 1, 5000); /* managed memory is host accessible */
  CUdeviceptr r = SENTINEL;
  ERR(cuMemAllocManaged(&r, 5000, 4), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(r, SENTINEL);
  OK(cuMemFree(q));
}

Test(sim_driver, pinned_host_memory) {
  CUcontext ctx = sim_primary(0);
  void *h = NULL;
  OK(cuMemHostAlloc(&h, 10000, CU_MEMHOSTALLOC_PORTABLE));
  cr_assert_not_null(h);
  cr_assert_eq((uintptr_t)h % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
  memset(h, 7, 10000);
  void *h2 = NULL;
  OK(cuMemAllocHost(&h2, 100));
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.host_blocks, 2);
  cr_assert_eq(s.host_bytes, 10100);
  cr_assert_eq(s.used_bytes, 0, "pinned host memory is not device memory");
  simcuda_block_t b = sim_block((uint64_t)(uintptr_t)h, SIMCUDA_HOST);
  cr_assert_eq(b.device, -1);
  cr_assert_eq(b.ctx, ctx);
  ERR(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
  void *bad = (void *)0x1;
  ERR(cuMemHostAlloc(&bad, 100, 0x80), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemHostAlloc(&bad, 0, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(bad, (void *)0x1);
  OK(cuMemFreeHost(h));
  ERR(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
  OK(cuMemFreeHost(NULL));
  CUdeviceptr d;
  OK(cuMemAlloc(&d, 4096));
  ERR(cuMemFreeHost((void *)(uintptr_t)d), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(sim_stats(0, NULL).host_blocks, 1);
}

Test(sim_driver, copies_and_sets) {
  sim_primary(0);
  CUdeviceptr a, b;
  OK(cuMemAlloc(&a, 3000));
  OK(cuMemAlloc(&b, 3000));
  char src[3000], dst[3000];
  for (int i = 0; i < 3000; i++) src[i] = (char)(i * 7);
  OK(cuMemcpyHtoD(a, src, sizeof src));
  OK(cuMemcpyDtoD(b + 100, a, 2900));
  OK(cuMemsetD8(b, 0xee, 100));
  OK(cuMemcpyDtoH(dst, b, sizeof dst));
  for (int i = 0; i < 100; i++) cr_assert_eq((unsigned char)dst[i], 0xee);
  cr_assert_eq(memcmp(dst + 100, src, 2900), 0);
  ERR(cuMemcpyHtoD(a + 1, src, 3000), CUDA_ERROR_INVALID_VALUE); /* runs past the block */
  ERR(cuMemsetD8(a + 3000, 0, 1), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemcpyDtoH(dst, 0x1000, 1), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemcpyHtoD(a, NULL, 1), CUDA_ERROR_INVALID_VALUE);
  OK(cuMemcpyHtoD(a, NULL, 0));
  OK(cuMemFree(a));
  ERR(cuMemcpyHtoD(a, src, 1), CUDA_ERROR_INVALID_VALUE); /* freed */
  /* the 32-bit ABIs are not supported */
  CUresult (*v1)(unsigned int, const void *, unsigned int) = sim_dlsym("cuMemcpyHtoD");
  cr_assert_not_null(v1);
  ERR(v1(0, src, 1), CUDA_ERROR_NOT_SUPPORTED);
}

Test(sim_driver, address_range) {
  sim_primary(0);
  CUdeviceptr a, base = 0;
  size_t size = 0;
  OK(cuMemAlloc(&a, 5 * MiB + 3));
  OK(cuMemGetAddressRange(&base, &size, a + 4 * MiB));
  cr_assert_eq(base, a);
  cr_assert_eq(size, 5 * MiB + 3);
  OK(cuMemGetAddressRange(NULL, &size, a));
  base = SENTINEL;
  ERR(cuMemGetAddressRange(&base, &size, a + 5 * MiB + 3), CUDA_ERROR_NOT_FOUND);
  cr_assert_eq(base, SENTINEL);
  OK(cuMemFree(a));
  ERR(cuMemGetAddressRange(&base, &size, a), CUDA_ERROR_NOT_FOUND);
  ERR(cuMemGetAddressRange(&base, &size, 0x4000), CUDA_ERROR_NOT_FOUND);
}

Test(sim_driver, streams) {
  OK(cuInit(0));
  CUstream s = (CUstream)0x77;
  ERR(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext ctx = sim_primary(0);
  ERR(cuStreamCreate(&s, 0x40), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(s, (CUstream)0x77);
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUcontext got = NULL;
  OK(cuStreamGetCtx(s, &got));
  cr_assert_eq(got, ctx);
  got = NULL;
  OK(cuStreamGetCtx(CU_STREAM_LEGACY, &got));
  cr_assert_eq(got, ctx);
  OK(cuStreamSynchronize(s));
  OK(cuStreamSynchronize(NULL));
  OK(cuStreamDestroy(s));
  ERR(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  ERR(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  ERR(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
  OK(cuCtxSetCurrent(NULL));
  ERR(cuStreamSynchronize(NULL), CUDA_ERROR_INVALID_CONTEXT);
}

Test(sim_driver, error_strings) {
  const char *s = NULL;
  OK(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  cr_assert_str_eq(s, "invalid argument");
  OK(cuGetErrorName(CUDA_ERROR_NOT_FOUND, &s));
  cr_assert_str_eq(s, "CUDA_ERROR_NOT_FOUND");
  s = "x";
  ERR(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  cr_assert_null(s);
  ERR(cuGetErrorString(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_driver, fault_injection_and_call_counts) {
  sim_primary(0);
  uint64_t before = simcuda_calls("cuMemAlloc_v2");
  cr_assert_eq(simcuda_inject("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 2), 0);
  CUdeviceptr p = SENTINEL;
  ERR(cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  ERR(cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(p, SENTINEL);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0, "an injected failure does nothing");
  OK(cuMemAlloc(&p, 4096));
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), before + 3, "injected calls are counted too");
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, 5), 0);
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, 0), 0); /* count 0 clears */
  OK(cuMemFree(p));
  cr_assert_eq(simcuda_inject("cuMemAlloc_v2", CUDA_ERROR_UNKNOWN, 1), 0);
  cr_assert_eq(simcuda_inject("cuInit", CUDA_ERROR_UNKNOWN, 1), 0);
  cr_assert_eq(simcuda_inject(NULL, CUDA_SUCCESS, 0), 0); /* clears every injection */
  OK(cuMemAlloc(&p, 4096));
  OK(cuInit(0));
  cr_assert_eq(simcuda_inject("cuMemAlloc", CUDA_ERROR_UNKNOWN, 1), 0, "v1 names are entry points too");
  cr_assert_eq(simcuda_inject("cudaMalloc", CUDA_ERROR_UNKNOWN, 1), -1);
  cr_assert_eq(simcuda_inject("cuNoSuchThing", CUDA_ERROR_UNKNOWN, 1), -1);
  cr_assert_eq(simcuda_calls("cuNoSuchThing"), 0);
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), 1);
}

Test(sim_driver, stats_arguments) {
  simcuda_stats_t s = {.size = sizeof s};
  ERR(simcuda_stats(0, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
  s.size = 8;
  ERR(simcuda_stats(0, NULL, &s), CUDA_ERROR_INVALID_VALUE);
  s.size = sizeof s;
  ERR(simcuda_stats(2, NULL, &s), CUDA_ERROR_INVALID_VALUE);
  ERR(simcuda_stats(-2, NULL, &s), CUDA_ERROR_INVALID_VALUE);
  sim_primary(0);
  ERR(simcuda_stats(0, (CUcontext)&s, &s), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(simcuda_arena(2, NULL, NULL), -1);
  uint64_t base = 0, size = 0;
  cr_assert_geq(simcuda_arena(0, &base, &size), 0);
  cr_assert(base && size >= 64 * GiB);
}

#define NTHREADS 4
#define ROUNDS 3000

static void *churn(void *arg) {
  CUcontext ctx = arg;
  cr_assert_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr live[16] = {0};
  static _Atomic uint64_t streams;
  uint64_t seed = gr_rng_stream(atomic_fetch_add(&streams, 1));
  for (int i = 0; i < ROUNDS; i++) {
    int k = (int)gr_rng_below(&seed, 16);
    if (live[k]) {
      unsigned char tag = 0;
      cr_assert_eq(cuMemcpyDtoH(&tag, live[k], 1), CUDA_SUCCESS);
      cr_assert_eq(tag, (unsigned char)(live[k] >> 9), "another thread wrote into this block");
      cr_assert_eq(cuMemFree(live[k]), CUDA_SUCCESS);
      live[k] = 0;
    } else {
      size_t bytes = 512u << gr_rng_below(&seed, 12);
      cr_assert_eq(cuMemAlloc(&live[k], bytes), CUDA_SUCCESS);
      cr_assert_eq(cuMemsetD8(live[k], (unsigned char)(live[k] >> 9), bytes), CUDA_SUCCESS);
    }
  }
  for (int k = 0; k < 16; k++)
    if (live[k]) cr_assert_eq(cuMemFree(live[k]), CUDA_SUCCESS);
  return NULL;
}

Test(sim_driver, threads_share_the_driver) {
  CUcontext ctx = sim_primary(0);
  pthread_t t[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) t[i] = gr_thread_start(churn, ctx);
  for (int i = 0; i < NTHREADS; i++) gr_thread_join(t[i]);
  simcuda_stats_t s = sim_stats(-1, NULL);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_geq(simcuda_calls("cuMemAlloc_v2"), NTHREADS * ROUNDS / 4);
}

/* Call counts are kept per thread: calls of threads that exited stay counted, and a block handed to a new
 * thread goes on counting. Exact, since every thread was joined before the read. */
#define COUNT_CALLS 1000

static void *count_calls(void *arg) {
  (void)arg;
  CUcontext c;
  for (int i = 0; i < COUNT_CALLS; i++) cr_assert_eq(cuCtxGetCurrent(&c), CUDA_SUCCESS);
  return NULL;
}

Test(sim_driver, call_counts_are_exact_across_threads) {
  sim_primary(0);
  uint64_t before = simcuda_calls("cuCtxGetCurrent");
  for (int wave = 0; wave < 3; wave++) { /* later waves reuse the blocks of exited threads */
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) t[i] = gr_thread_start(count_calls, NULL);
    for (int i = 0; i < NTHREADS; i++) gr_thread_join(t[i]);
    cr_assert_eq(simcuda_calls("cuCtxGetCurrent"), before + (uint64_t)(wave + 1) * NTHREADS * COUNT_CALLS);
  }
  count_calls(NULL);
  cr_assert_eq(simcuda_calls("cuCtxGetCurrent"), before + 3u * NTHREADS * COUNT_CALLS + COUNT_CALLS);
}

/* Stream capture restricts "potentially unsafe" calls: a global-mode capture on any thread, a thread-local one on
 * its own thread; a relaxed one restricts nobody. A forbidden call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidates the capture, whose EndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
static void *unsafe_calls(void *arg) {
  CUcontext c = arg;
  cuCtxSetCurrent(c);
  CUdeviceptr p = 0;
  void *h = NULL;
  intptr_t bad = 0;
  bad += cuMemAlloc(&p, 1024) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  bad += cuCtxSynchronize() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  bad += cuMemAllocHost(&h, 1024) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (p) cuMemFree(p);
  if (h) cuMemFreeHost(h);
  return (void *)bad;
}

static intptr_t unsafe_on_thread(CUcontext c) {
  pthread_t t;
  void *res = NULL;
  cr_assert_eq(pthread_create(&t, NULL, unsafe_calls, c), 0);
  pthread_join(t, &res);
  return (intptr_t)res;
}

Test(sim_driver, capture_forbids_unsafe_calls) {
  CUcontext c = sim_primary(0);
  CUstream s;
  CUgraph g = NULL;
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ERR(cuStreamBeginCapture(s, (CUstreamCaptureMode)7), CUDA_ERROR_INVALID_VALUE);
  /* global: another thread's unsafe calls fail and invalidate the capture */
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  cr_assert_eq(unsafe_on_thread(c), 3, "a global-mode capture restricts every thread");
  ERR(cuMemFree(p), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ERR(cuMemPoolTrimTo(NULL, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ERR(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cr_assert_null(g);
  /* the capture ended: the calls work again */
  OK(cuCtxSynchronize());
  /* global, untouched: ends well */
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphDestroy(g));
  /* thread-local: other threads are free, the capturing one is not */
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  cr_assert_eq(unsafe_on_thread(c), 0);
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphDestroy(g));
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  ERR(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ERR(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* relaxed: nobody is restricted */
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  cr_assert_eq(unsafe_on_thread(c), 0);
  OK(cuCtxSynchronize());
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphDestroy(g));
  /* a stream destroyed while capturing takes its capture with it */
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuStreamDestroy(s));
  OK(cuMemFree(p));
}

/* cuStreamBeginCapture without a mode (the CUDA 10.0 entry point, cuGetProcAddress version 10000) begins a
 * global-mode capture: another thread's unsafe calls fail and invalidate it. */
Test(sim_driver, capture_without_mode_is_global) {
  CUcontext c = sim_primary(0);
  CUstream s;
  CUgraph g = NULL;
  CUresult (*begin1)(CUstream) = (CUresult(*)(CUstream))sim_proc("cuStreamBeginCapture", 10000, 0);
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(begin1(s));
  cr_assert_eq(unsafe_on_thread(c), 3, "a capture begun without a mode restricts every thread");
  ERR(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(begin1(s));
  OK(cuStreamEndCapture(s, &g));
  OK(cuGraphDestroy(g));
  OK(cuStreamDestroy(s));
}
