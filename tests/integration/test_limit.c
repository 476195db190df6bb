/* GPURECLAIM_LIMIT against the simulator: an allocation past the process's limit releases the process's own
 * cache first and then fails with CUDA_ERROR_OUT_OF_MEMORY without reaching the driver; every allocation route
 * counts; frees give room back; concurrent allocations never overshoot; cuMemGetInfo (exported, through
 * cuGetProcAddress, and cudaMemGetInfo of the runtime) reports the limit. Built three times (CMakeLists.txt):
 * GPURECLAIM_LIMIT=64M (the default build), a fraction of a 256 MiB device (LIMIT_FRACTION), and no limit
 * (NO_LIMIT: every figure is the driver's). */
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define OOM(call) cr_assert_eq((call), CUDA_ERROR_OUT_OF_MEMORY, "%s", #call)
#define MiB (1024ull * 1024)
#define LIMIT (64 * MiB)

static CUcontext g_ctx;
static void init(void) { g_ctx = h_cuda_start(0); }

/* cuMemGetInfo as each route hands it out: the exported name, cuGetProcAddress (the runtime's way), and the
 * 32-bit variant. */
typedef CUresult (*info_t)(size_t *, size_t *);
typedef CUresult (*info32_t)(unsigned *, unsigned *);
__attribute__((unused)) static info_t procaddr_info(void) {
  typedef CUresult (*getproc_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  getproc_t gp = (getproc_t)dlsym(h_libcuda(), "cuGetProcAddress_v2");
  cr_assert_not_null(gp);
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  OK(gp("cuMemGetInfo", &fn, 12000, 0, &st));
  cr_assert_neq(fn, dlsym(RTLD_NEXT, "cuMemGetInfo_v2"), "the runtime's route gets gpureclaim's wrapper");
  return (info_t)fn;
}

/* The driver's own figures (the simulator's, not through any hook). */
__attribute__((unused)) static void driver_info(uint64_t *free_b, uint64_t *total) {
  simcuda_stats_t s = h_sim(0, NULL);
  *total = s.capacity_bytes;
  *free_b = s.capacity_bytes - s.gpu_used_bytes;
}

#ifndef NO_LIMIT
#ifndef LIMIT_FRACTION
TestSuite(limit, .init = init);

Test(limit, an_allocation_past_the_limit_fails_without_reaching_the_driver) {
  CUdeviceptr a, b, c;
  OK(cuMemAlloc(&a, 48 * MiB));
  uint64_t calls = simcuda_calls("cuMemAlloc_v2");
  OOM(cuMemAlloc(&b, 17 * MiB));
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), calls, "refused before the driver");
  cr_assert_eq(h_sim(0, NULL).live_bytes, 48 * MiB);
  OK(cuMemAlloc(&b, 16 * MiB)); /* exactly up to the limit */
  OOM(cuMemAlloc(&c, 1));
  /* frees give the room back */
  OK(cuMemFree(a));
  OK(cuMemAlloc(&c, 48 * MiB));
  OK(cuMemFree(b));
  OK(cuMemFree(c));
  OOM(cuMemAlloc(&c, LIMIT + 1)); /* larger than the limit on its own */
  OK(cuMemAlloc(&c, LIMIT));
  OK(cuMemFree(c));
}

Test(limit, the_process_cache_is_released_first_and_covers_the_allocation) {
  CUdeviceptr orphan, b;
  uint64_t scope = gpureclaim_scope_begin();
  OK(cuMemAlloc(&orphan, 48 * MiB));
  cr_assert_eq(gpureclaim_scope_end(scope, 0), 0); /* abandoned: an orphan, the process's own cache */
  cr_assert_eq(h_grs(0).orphan_bytes, 48 * MiB);
  OK(cuMemAlloc(&b, 32 * MiB)); /* 48 + 32 > 64: the orphan goes first */
  cr_assert_eq(h_grs(0).orphan_bytes, 0);
  cr_assert_eq(h_sim(0, NULL).live_bytes, 32 * MiB, "only the new block is left");
  OK(cuMemFree(b));
}

Test(limit, a_cache_that_does_not_cover_it_is_released_and_the_allocation_fails) {
  CUdeviceptr orphan, live, b;
  uint64_t scope = gpureclaim_scope_begin();
  OK(cuMemAlloc(&orphan, 16 * MiB));
  cr_assert_eq(gpureclaim_scope_end(scope, 0), 0);
  OK(cuMemAlloc(&live, 40 * MiB));
  uint64_t asks = h_grs(-1).peer_reclaims;
  OOM(cuMemAlloc(&b, 32 * MiB)); /* 40 + 32 > 64 even without the orphan */
  cr_assert_eq(h_grs(0).orphan_bytes, 0, "the cache was released before the refusal");
  cr_assert_eq(h_sim(0, NULL).live_bytes, 40 * MiB);
  cr_assert_eq(h_grs(-1).peer_reclaims, asks, "no peer is asked for the process's own limit");
  OK(cuMemAlloc(&b, 24 * MiB));
  OK(cuMemFree(b));
  OK(cuMemFree(live));
}

/* Holds 40 MiB through one route, proves a 32 MiB cuMemAlloc is refused meanwhile, frees it, and proves the
 * room came back. */
static void refused_beside(const char *route) {
  CUdeviceptr b;
  OOM(cuMemAlloc(&b, 32 * MiB));
  cr_assert(h_grs(0).live_bytes >= 40 * MiB, "%s: counted", route);
  (void)route;
}
static void room_back(void) {
  CUdeviceptr b;
  OK(cuMemAlloc(&b, 60 * MiB));
  OK(cuMemFree(b));
}

Test(limit, every_allocation_route_counts) {
  CUdeviceptr p;
  size_t pitch;
  OK(cuMemAllocPitch(&p, &pitch, 4000, 10 * 1024, 4)); /* ~40 MiB, rows padded */
  refused_beside("pitch");
  OK(cuMemFree(p));
  room_back();

  OK(cuMemAllocManaged(&p, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  refused_beside("managed");
  OK(cuMemFree(p));
  room_back();

  CUstream s;
  OK(cuStreamCreate(&s, 0));
  OK(cuMemAllocAsync(&p, 40 * MiB, s));
  refused_beside("stream-ordered");
  OK(cuMemFreeAsync(p, s));
  OK(cuStreamSynchronize(s));
  room_back();

  CUmemoryPool pool;
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  OK(cuMemPoolCreate(&pool, &props));
  OK(cuMemAllocFromPoolAsync(&p, 40 * MiB, pool, s));
  refused_beside("pool");
  OK(cuMemFreeAsync(p, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemPoolDestroy(pool));
  room_back();

  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  CUmemGenericAllocationHandle h, h2;
  OK(cuMemCreate(&h, 40 * MiB, &prop, 0));
  refused_beside("cuMemCreate");
  OOM(cuMemCreate(&h2, 32 * MiB, &prop, 0)); /* and a VMM allocation is refused as well */
  OK(cuMemRelease(h));
  room_back();
  OK(cuStreamDestroy(s));

  /* pinned host memory and address reservations are no device memory: not counted */
  void *host;
  OK(cuMemHostAlloc(&host, 80 * MiB, 0));
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 128 * MiB, 0, 0, 0));
  room_back();
  OK(cuMemAddressFree(va, 128 * MiB));
  OK(cuMemFreeHost(host));
}

Test(limit, a_failed_allocation_gives_back_what_it_held) {
  CUdeviceptr a;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(simcuda_inject("cuMemAlloc_v2", CUDA_ERROR_INVALID_VALUE, 1), 0);
    cr_assert_eq(cuMemAlloc(&a, 40 * MiB), CUDA_ERROR_INVALID_VALUE, "the driver's answer, unchanged");
  }
  OK(cuMemAlloc(&a, LIMIT)); /* nothing of the three failures is still held */
  OK(cuMemFree(a));
}

Test(limit, blocks_that_go_with_their_context_give_room_back) {
  CUcontext ctx;
  CUdeviceptr a;
  OK(cuCtxCreate_v2(&ctx, 0, 0));
  OK(cuMemAlloc(&a, 48 * MiB));
  OOM(cuMemAlloc(&a, 32 * MiB));
  OK(cuCtxDestroy(ctx)); /* frees its blocks: the driver's, not a free the hooks see */
  OK(cuCtxSetCurrent(g_ctx));
  OK(cuMemAlloc(&a, LIMIT));
  OK(cuMemFree(a));
}

Test(limit, cuMemGetInfo_reports_the_limit_on_every_route) {
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 16 * MiB));
  size_t f = 0, t = 0;
  OK(cuMemGetInfo(&f, &t));
  cr_assert_eq(t, LIMIT, "total: the limit");
  cr_assert_eq(f, LIMIT - 16 * MiB, "free: what is left under it");
  f = t = 0;
  OK(procaddr_info()(&f, &t));
  cr_assert_eq(t, LIMIT);
  cr_assert_eq(f, LIMIT - 16 * MiB);
  info32_t v1 = (info32_t)dlsym(RTLD_DEFAULT, "cuMemGetInfo");
  cr_assert_not_null(v1);
  unsigned f32 = 0, t32 = 0;
  OK(v1(&f32, &t32));
  cr_assert_eq(t32, LIMIT);
  cr_assert_eq(f32, LIMIT - 16 * MiB);
  size_t rf = 0, rt = 0; /* the runtime asks the driver through cuGetProcAddress */
  cr_assert_eq(cudaMemGetInfo(&rf, &rt), cudaSuccess);
  cr_assert_eq(rt, LIMIT);
  cr_assert_eq(rf, LIMIT - 16 * MiB);
  /* free is the driver's when that is smaller: another process took most of the device */
  uint64_t df, dt;
  driver_info(&df, &dt);
  uint64_t small = h_sim(0, NULL).gpu_used_bytes + 8 * MiB; /* a device smaller than the limit, now */
  cr_assert_lt(small, LIMIT);
  simcuda_set_capacity(0, small);
  OK(cuMemGetInfo(&f, &t));
  cr_assert_eq(f, 8 * MiB, "free: min(driver free, limit - held)");
  cr_assert_eq(t, small, "total: min(limit, device total)");
  simcuda_set_capacity(0, dt);
  OK(cuMemFree(a));
  OK(cuMemGetInfo(&f, &t));
  cr_assert_eq(f, LIMIT);
}

/* Threads allocating 1 MiB blocks at once, without freeing, until refused: together they end at the limit
 * exactly (every 1 MiB that fits is admitted, none past it), in every round. */
#define THREADS 8
#define PER_THREAD 24 /* 8 x 24 MiB: three times the limit, so that an unlimited run fails the test */
static atomic_int g_go;
typedef struct {
  CUdeviceptr blocks[PER_THREAD];
  int n;
} held_t;
static void *grab(void *arg) {
  held_t *h = arg;
  OK(cuCtxSetCurrent(g_ctx));
  while (!atomic_load(&g_go))
    ;
  h->n = 0;
  for (int i = 0; i < PER_THREAD; i++) {
    CUresult rc = cuMemAlloc(&h->blocks[h->n], MiB);
    if (rc == CUDA_SUCCESS)
      h->n++;
    else
      cr_assert_eq(rc, CUDA_ERROR_OUT_OF_MEMORY);
  }
  return NULL;
}

Test(limit, concurrent_allocations_never_overshoot, .timeout = 120) {
  for (int round = 0; round < 20; round++) {
    held_t h[THREADS];
    pthread_t t[THREADS];
    atomic_store(&g_go, 0);
    for (int i = 0; i < THREADS; i++)
      t[i] = gr_thread_start(grab, &h[i]);
    atomic_store(&g_go, 1);
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
      gr_thread_join(t[i]);
      total += h[i].n;
    }
    cr_assert_eq(h_sim(0, NULL).live_bytes, (uint64_t)total * MiB);
    cr_assert_eq((uint64_t)total * MiB, LIMIT, "round %d: %d MiB held under a 64 MiB limit", round, total);
    for (int i = 0; i < THREADS; i++)
      for (int k = 0; k < h[i].n; k++)
        OK(cuMemFree(h[i].blocks[k]));
  }
}

#else /* LIMIT_FRACTION: GPURECLAIM_LIMIT=0.25 of a 256 MiB device */
TestSuite(limit_fraction, .init = init);

Test(limit_fraction, a_fraction_of_the_device) {
  size_t f, t;
  OK(cuMemGetInfo(&f, &t));
  cr_assert_eq(h_sim(0, NULL).capacity_bytes, 256 * MiB);
  cr_assert_eq(t, 64 * MiB, "a quarter of 256 MiB");
  CUdeviceptr a, b;
  OOM(cuMemAlloc(&a, 64 * MiB + 1));
  OK(cuMemAlloc(&a, 64 * MiB));
  OOM(cuMemAlloc(&b, 1));
  OK(cuMemFree(a));
}
#endif

#else /* NO_LIMIT */
TestSuite(no_limit, .init = init);

Test(no_limit, figures_are_the_drivers) {
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 512 * MiB));
  uint64_t df, dt;
  driver_info(&df, &dt);
  size_t f, t;
  OK(cuMemGetInfo(&f, &t));
  cr_assert_eq(t, dt);
  cr_assert_eq(f, df);
  OK(procaddr_info()(&f, &t));
  cr_assert_eq(t, dt);
  cr_assert_eq(f, df);
  size_t rf, rt;
  cr_assert_eq(cudaMemGetInfo(&rf, &rt), cudaSuccess);
  cr_assert_eq(rt, dt);
  cr_assert_eq(rf, df);
  OK(cuMemFree(a));
}
#endif
