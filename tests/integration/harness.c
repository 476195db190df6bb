/* harness.c -- see harness.h. */

#include "harness.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *h_libcuda(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "the simulated libcuda.so.1 is not loadable: %s", dlerror());
  return h;
}

#define SIMFN(type, name) ((type)dlsym(h_libcuda(), name))

void h_fill_dlsym(drv_api_t *a, void *h) {
  memset(a, 0, sizeof *a);
  a->route = "dlsym";
#define D(field, name) *(void **)&a->field = dlsym(h, name)
  D(cuInit, "cuInit");
  D(cuDeviceGet, "cuDeviceGet");
  D(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  D(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  D(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
  D(cuCtxSetCurrent, "cuCtxSetCurrent");
  D(cuCtxGetCurrent, "cuCtxGetCurrent");
  D(cuCtxCreate_v2, "cuCtxCreate_v2");
  D(cuCtxCreate_v3, "cuCtxCreate_v3");
  D(cuCtxCreate_v4, "cuCtxCreate_v4");
  D(cuCtxDestroy, "cuCtxDestroy_v2");
  D(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  D(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  D(cuCtxAttach, "cuCtxAttach");
  D(cuCtxDetach, "cuCtxDetach");
  D(cuGLCtxCreate, "cuGLCtxCreate_v2");
  D(cuVDPAUCtxCreate, "cuVDPAUCtxCreate_v2");
  D(cuCtxSynchronize, "cuCtxSynchronize");
  D(cuStreamCreate, "cuStreamCreate");
  D(cuStreamDestroy, "cuStreamDestroy_v2");
  D(cuMemAlloc, "cuMemAlloc_v2");
  D(cuMemAllocPitch, "cuMemAllocPitch_v2");
  D(cuMemAllocManaged, "cuMemAllocManaged");
  D(cuMemFree, "cuMemFree_v2");
  D(cuMemAllocAsync, "cuMemAllocAsync");
  D(cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz");
  D(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
  D(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz");
  D(cuMemFreeAsync, "cuMemFreeAsync");
  D(cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz");
  D(cuMemHostAlloc, "cuMemHostAlloc");
  D(cuMemAllocHost, "cuMemAllocHost_v2");
  D(cuMemFreeHost, "cuMemFreeHost");
  D(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  D(cuMemCreate, "cuMemCreate");
  D(cuMemRelease, "cuMemRelease");
  D(cuMemMap, "cuMemMap");
  D(cuMemUnmap, "cuMemUnmap");
  D(cuMemAddressReserve, "cuMemAddressReserve");
  D(cuMemAddressFree, "cuMemAddressFree");
  D(cuMemPoolCreate, "cuMemPoolCreate");
  D(cuMemPoolDestroy, "cuMemPoolDestroy");
  D(cuMemPoolTrimTo, "cuMemPoolTrimTo");
  D(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool");
#undef D
}

typedef CUresult (*getproc_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *gp(getproc_v2_t g, const char *name, int version, cuuint64_t flags) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CUresult rc = g(name, &p, version, flags, &st);
  cr_assert_eq(rc, CUDA_SUCCESS, "cuGetProcAddress(%s, %d, %llu) = %d", name, version, (unsigned long long)flags, rc);
  return p;
}

void h_fill_procaddr(drv_api_t *a, void *h) {
  memset(a, 0, sizeof *a);
  a->route = "cuGetProcAddress";
  /* As the runtime: the exported getter by dlsym, then "cuGetProcAddress" through it, then everything else. */
  getproc_v2_t first = (getproc_v2_t)dlsym(h, "cuGetProcAddress_v2");
  cr_assert_not_null(first);
  getproc_v2_t g = (getproc_v2_t)gp(first, "cuGetProcAddress", 12000, 0);
  const int V = 13000;
  const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
#define P(field, name, ver, flags) *(void **)&a->field = gp(g, name, ver, flags)
  P(cuInit, "cuInit", V, 0);
  P(cuDeviceGet, "cuDeviceGet", V, 0);
  P(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", V, 0);
  P(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0); /* the old ABI, as the runtime asks */
  P(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0);
  P(cuCtxSetCurrent, "cuCtxSetCurrent", V, 0);
  P(cuCtxGetCurrent, "cuCtxGetCurrent", V, 0);
  P(cuCtxCreate_v2, "cuCtxCreate", 3020, 0);
  P(cuCtxCreate_v3, "cuCtxCreate", 11040, 0);
  P(cuCtxCreate_v4, "cuCtxCreate", 12050, 0);
  P(cuCtxDestroy, "cuCtxDestroy", V, 0);
  P(cuCtxPopCurrent, "cuCtxPopCurrent", V, 0);
  P(cuCtxPushCurrent, "cuCtxPushCurrent", V, 0);
  P(cuCtxAttach, "cuCtxAttach", V, 0);
  P(cuCtxDetach, "cuCtxDetach", 2000, 0); /* as the runtime asks */
  P(cuGLCtxCreate, "cuGLCtxCreate", 3020, 0);
  P(cuVDPAUCtxCreate, "cuVDPAUCtxCreate", 3020, 0);
  P(cuCtxSynchronize, "cuCtxSynchronize", 12000, 0);
  P(cuStreamCreate, "cuStreamCreate", V, 0);
  P(cuStreamDestroy, "cuStreamDestroy", V, 0);
  P(cuMemAlloc, "cuMemAlloc", V, 0);
  P(cuMemAllocPitch, "cuMemAllocPitch", V, 0);
  P(cuMemAllocManaged, "cuMemAllocManaged", V, 0);
  P(cuMemFree, "cuMemFree", V, 0);
  P(cuMemAllocAsync, "cuMemAllocAsync", V, 0);
  P(cuMemAllocAsync_ptsz, "cuMemAllocAsync", V, PT);
  P(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", V, 0);
  P(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", V, PT);
  P(cuMemFreeAsync, "cuMemFreeAsync", V, 0);
  P(cuMemFreeAsync_ptsz, "cuMemFreeAsync", V, PT);
  P(cuMemHostAlloc, "cuMemHostAlloc", V, 0);
  P(cuMemAllocHost, "cuMemAllocHost", V, 0);
  P(cuMemFreeHost, "cuMemFreeHost", V, 0);
  P(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", V, 0);
  P(cuMemCreate, "cuMemCreate", V, 0);
  P(cuMemRelease, "cuMemRelease", V, 0);
  P(cuMemMap, "cuMemMap", V, 0);
  P(cuMemUnmap, "cuMemUnmap", V, 0);
  P(cuMemAddressReserve, "cuMemAddressReserve", V, 0);
  P(cuMemAddressFree, "cuMemAddressFree", V, 0);
  P(cuMemPoolCreate, "cuMemPoolCreate", V, 0);
  P(cuMemPoolDestroy, "cuMemPoolDestroy", V, 0);
  P(cuMemPoolTrimTo, "cuMemPoolTrimTo", V, 0);
  P(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", V, 0);
#undef P
}

/* ---- comparing the table with the simulator ---- */

typedef struct item {
  int kind;
  uint64_t address, bytes;
  int device;
  void *ctx;
} item_t;

typedef struct list {
  item_t *v;
  size_t n, cap;
} list_t;

static void push(list_t *l, item_t it) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
  }
  l->v[l->n++] = it;
}

static int by_key(const void *a, const void *b) {
  const item_t *x = a, *y = b;
  if (x->kind != y->kind)
    return x->kind < y->kind ? -1 : 1;
  return x->address < y->address ? -1 : x->address > y->address;
}

static int from_gr(const gpureclaim_block_t *b, void *arg) {
  /* VMM handles released by the program but kept by a mapping are still memory on both sides. */
  push(arg, (item_t){b->kind, b->address, b->bytes, b->device, b->context});
  return 0;
}

static int from_sim(const simcuda_block_t *b, void *arg) {
  push(arg, (item_t){b->kind, b->address, b->bytes, b->device, (void *)b->ctx});
  return 0;
}

static const char *kind_name(int k) {
  static const char *const n[] = {"?", "device", "pitch", "managed", "async", "vmm", "mapping", "va", "host"};
  return k >= 0 && k <= 8 ? n[k] : "?";
}

static void dump(const char *who, const list_t *l) {
  fprintf(stderr, "  %s (%zu):\n", who, l->n);
  for (size_t i = 0; i < l->n && i < 40; i++)
    fprintf(stderr, "    %-8s %#llx %llu dev %d ctx %p\n", kind_name(l->v[i].kind),
            (unsigned long long)l->v[i].address, (unsigned long long)l->v[i].bytes, l->v[i].device, l->v[i].ctx);
}

bool h_table_matches_sim(const char *what) {
  list_t gr = {0}, sim = {0};
  cr_assert_eq(gpureclaim_foreach_block(from_gr, &gr), 0);
  int (*sim_each)(int (*)(const simcuda_block_t *, void *), void *) =
      SIMFN(int (*)(int (*)(const simcuda_block_t *, void *), void *), "simcuda_foreach_block");
  cr_assert_not_null(sim_each);
  sim_each(from_sim, &sim);
  if (gr.n) /* qsort of a NULL array is undefined even for no elements */
    qsort(gr.v, gr.n, sizeof *gr.v, by_key);
  if (sim.n)
    qsort(sim.v, sim.n, sizeof *sim.v, by_key);
  bool ok = gr.n == sim.n;
  for (size_t i = 0; ok && i < gr.n; i++) {
    const item_t *a = &gr.v[i], *b = &sim.v[i];
    ok = a->kind == b->kind && a->address == b->address && a->bytes == b->bytes &&
         (a->kind == GPURECLAIM_KIND_HOST || a->device == b->device) &&
         (b->ctx == NULL || a->ctx == b->ctx);
  }
  /* The counters agree with the table. */
  gpureclaim_stats_t s = {.size = sizeof s};
  simcuda_stats_t ss = {.size = sizeof ss};
  cr_assert_eq(gpureclaim_stats(-1, &s), 0);
  CUresult (*sim_stats)(int, CUcontext, simcuda_stats_t *) =
      SIMFN(CUresult(*)(int, CUcontext, simcuda_stats_t *), "simcuda_stats");
  cr_assert_eq(sim_stats(-1, NULL, &ss), CUDA_SUCCESS);
  bool counters = s.live_bytes == ss.live_bytes + ss.vmm_phys_bytes &&
                  s.live_blocks == ss.live_blocks + ss.vmm_handles && s.host_pinned_bytes == ss.host_bytes &&
                  s.host_pinned_blocks == ss.host_blocks && s.va_reserved_bytes == ss.va_reserved_bytes &&
                  s.pool_reserved_bytes == ss.pool_reserved_bytes && s.pool_used_bytes == ss.pool_used_bytes &&
                  s.vmm_mapped_bytes == ss.vmm_mapped_bytes;
  if (!ok || !counters) {
    fprintf(stderr, "table differs from the simulator after: %s\n", what);
    dump("gpureclaim", &gr);
    dump("simulator", &sim);
    fprintf(stderr,
            "  stats: live %llu/%llu bytes (sim %llu+%llu vmm), blocks %llu (sim %llu+%llu), host %llu/%llu, va %llu/%llu, "
            "pool %llu/%llu used %llu/%llu, vmm mapped %llu/%llu\n",
            (unsigned long long)s.live_bytes, (unsigned long long)s.live_bytes, (unsigned long long)ss.live_bytes,
            (unsigned long long)ss.vmm_phys_bytes, (unsigned long long)s.live_blocks,
            (unsigned long long)ss.live_blocks, (unsigned long long)ss.vmm_handles,
            (unsigned long long)s.host_pinned_bytes, (unsigned long long)ss.host_bytes,
            (unsigned long long)s.va_reserved_bytes, (unsigned long long)ss.va_reserved_bytes,
            (unsigned long long)s.pool_reserved_bytes, (unsigned long long)ss.pool_reserved_bytes,
            (unsigned long long)s.pool_used_bytes, (unsigned long long)ss.pool_used_bytes,
            (unsigned long long)s.vmm_mapped_bytes, (unsigned long long)ss.vmm_mapped_bytes);
  }
  free(gr.v);
  free(sim.v);
  return ok && counters;
}

typedef struct {
  int kind;
  size_t n;
  uint64_t address;
  gpureclaim_block_t *found;
} count_t;

static int counter(const gpureclaim_block_t *b, void *arg) {
  count_t *c = arg;
  if (c->found) {
    if (b->address == c->address) {
      *c->found = *b;
      c->n++;
      return 1;
    }
    return 0;
  }
  if (!c->kind || b->kind == c->kind)
    c->n++;
  return 0;
}

simcuda_stats_t h_sim(int device, CUcontext ctx) {
  simcuda_stats_t s = {.size = sizeof s};
  CUresult (*sim_stats)(int, CUcontext, simcuda_stats_t *) =
      SIMFN(CUresult(*)(int, CUcontext, simcuda_stats_t *), "simcuda_stats");
  cr_assert_eq(sim_stats(device, ctx, &s), CUDA_SUCCESS);
  return s;
}

gpureclaim_stats_t h_grs(int device) {
  gpureclaim_stats_t s = {.size = sizeof s};
  cr_assert_eq(gpureclaim_stats(device, &s), 0);
  return s;
}

size_t h_count(int kind) {
  count_t c = {.kind = kind};
  gpureclaim_foreach_block(counter, &c);
  return c.n;
}

bool h_find(uint64_t address, gpureclaim_block_t *out) {
  count_t c = {.address = address, .found = out};
  gpureclaim_foreach_block(counter, &c);
  return c.n == 1;
}

/* ---- the scenario ---- */

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s: %s", api->route, #call)
#define CHECK(step)                                                                                        \
  do {                                                                                                     \
    cr_assert(h_table_matches_sim(step), "%s: table differs from the simulator after %s", api->route, step); \
    checks++;                                                                                              \
  } while (0)

/* Allocates in the current context through api (cuMemAlloc, and cuMemAllocAsync on the default stream, the second
 * one after the first: the cached path) and asserts both blocks are recorded in want, on device; frees them.
 * after: the call that made want current, for the message. Returns the checks made. */
static int expect_current(const drv_api_t *api, CUcontext want, int device, const char *after) {
  CUcontext cur = NULL;
  OK(api->cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, want, "%s: after %s the driver has another context current than the test expects", api->route,
               after);
  CUdeviceptr d, a;
  OK(api->cuMemAlloc(&d, 4096));
  OK(api->cuMemAllocAsync(&a, 8192, NULL));
  const CUdeviceptr made[2] = {d, a};
  for (int i = 0; i < 2; i++) {
    gpureclaim_block_t b;
    cr_assert(h_find(made[i], &b), "%s: a block made after %s is not tracked", api->route, after);
    cr_assert_eq(b.context, (void *)want, "%s: a block made after %s is recorded in context %p, the driver's is %p",
                 api->route, after, b.context, (void *)want);
    cr_assert_eq(b.device, device, "%s: a block made after %s is recorded on device %d, not %d", api->route, after,
                 b.device, device);
  }
  OK(api->cuMemFree(d));
  OK(api->cuMemFreeAsync(a, NULL));
  return 2;
}

int h_scenario(const drv_api_t *api) {
  int checks = 0;
  CUdevice dev;
  CUcontext primary;
  OK(api->cuInit(0));
  OK(api->cuDeviceGet(&dev, 0));
  OK(api->cuDevicePrimaryCtxRetain(&primary, dev));
  OK(api->cuCtxSetCurrent(primary));
  CHECK("init");

  CUdeviceptr d1, d2, p1, m1;
  size_t pitch = 0;
  OK(api->cuMemAlloc(&d1, 1 << 20));
  CHECK("cuMemAlloc");
  OK(api->cuMemAlloc(&d2, 4096));
  OK(api->cuMemAllocPitch(&p1, &pitch, 1000, 17, 4));
  CHECK("cuMemAllocPitch");
  OK(api->cuMemAllocManaged(&m1, 65536, CU_MEM_ATTACH_GLOBAL));
  CHECK("cuMemAllocManaged");
  gpureclaim_block_t b;
  cr_assert(h_find(d1, &b));
  cr_assert_eq(b.kind, GPURECLAIM_KIND_DEVICE);
  cr_assert_eq(b.context, (void *)primary);
  cr_assert_eq(b.device, 0);
  OK(api->cuMemFree(d2));
  CHECK("cuMemFree");

  /* Stream-ordered: default stream, a created stream, the per-thread variants, a created pool. */
  CUstream s;
  OK(api->cuStreamCreate(&s, 0));
  CUdeviceptr a1, a2, a3, a4;
  OK(api->cuMemAllocAsync(&a1, 300000, NULL));
  OK(api->cuMemAllocAsync(&a2, 5000, s));
  OK(api->cuMemAllocAsync_ptsz(&a3, 7000, CU_STREAM_PER_THREAD));
  CHECK("cuMemAllocAsync");
  cr_assert(h_find(a2, &b));
  cr_assert_eq(b.kind, GPURECLAIM_KIND_ASYNC);
  CUmemoryPool defpool;
  OK(api->cuDeviceGetDefaultMemPool(&defpool, dev));
  cr_assert_eq(b.pool, (void *)defpool, "an async block names its pool");
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool pool;
  OK(api->cuMemPoolCreate(&pool, &props));
  OK(api->cuMemAllocFromPoolAsync(&a4, 123456, pool, s));
  CUdeviceptr a5;
  OK(api->cuMemAllocFromPoolAsync_ptsz(&a5, 1000, pool, NULL));
  CHECK("cuMemAllocFromPoolAsync");
  cr_assert(h_find(a4, &b));
  cr_assert_eq(b.pool, (void *)pool);
  OK(api->cuMemFreeAsync(a1, NULL));
  OK(api->cuMemFreeAsync(a2, s));
  OK(api->cuMemFreeAsync_ptsz(a3, CU_STREAM_PER_THREAD));
  OK(api->cuMemFreeAsync(a4, s));
  CHECK("cuMemFreeAsync (pools keep the memory reserved)");
  OK(api->cuMemFreeAsync(d1, s)); /* a cuMemAlloc block may be freed stream-ordered too */
  CHECK("cuMemFreeAsync of a cuMemAlloc block");
  OK(api->cuMemFreeAsync(a5, NULL));
  OK(api->cuCtxSynchronize()); /* the stream-ordered frees run when their streams get there */
  OK(api->cuMemPoolTrimTo(pool, 0));
  OK(api->cuMemPoolTrimTo(defpool, 0));
  CHECK("cuMemPoolTrimTo");
  OK(api->cuMemPoolDestroy(pool));
  OK(api->cuStreamDestroy(s));

  /* Pinned host memory. */
  void *h1, *h2;
  OK(api->cuMemHostAlloc(&h1, 10000, 0));
  OK(api->cuMemAllocHost(&h2, 20000));
  CHECK("pinned host memory");
  cr_assert(h_find((uint64_t)(uintptr_t)h1, &b));
  cr_assert_eq(b.kind, GPURECLAIM_KIND_HOST);
  OK(api->cuMemFreeHost(h1));
  OK(api->cuMemFreeHost(h2));
  CHECK("cuMemFreeHost");

  /* Virtual memory management: create, reserve, map, release (memory kept by the mapping), unmap. */
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0;
  OK(api->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  cr_assert_gt(gran, 0);
  CUmemGenericAllocationHandle hA, hB;
  OK(api->cuMemCreate(&hA, 2 * gran, &prop, 0));
  OK(api->cuMemCreate(&hB, gran, &prop, 0));
  CHECK("cuMemCreate");
  CUdeviceptr va;
  OK(api->cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
  CHECK("cuMemAddressReserve");
  OK(api->cuMemMap(va, 2 * gran, 0, hA, 0));
  OK(api->cuMemMap(va + 2 * gran, gran, 0, hB, 0));
  CHECK("cuMemMap");
  OK(api->cuMemRelease(hA));
  CHECK("cuMemRelease of a mapped handle");
  cr_assert(h_find((uint64_t)hA, &b), "a released handle that is still mapped keeps its memory");
  cr_assert_eq(b.state, GPURECLAIM_BLOCK_RELEASED);
  OK(api->cuMemUnmap(va, 3 * gran)); /* both mappings at once */
  CHECK("cuMemUnmap of two mappings");
  cr_assert(!h_find((uint64_t)hA, &b), "released and unmapped: the memory is gone");
  OK(api->cuMemRelease(hB));
  CHECK("cuMemRelease");
  OK(api->cuMemAddressFree(va, 8 * gran));
  CHECK("cuMemAddressFree");

  /* Contexts: every cuCtxCreate ABI; destroying one drops its blocks, counted as such. */
  gpureclaim_stats_t st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
  cr_assert_eq(gpureclaim_stats(-1, &st0), 0);
  CUcontext c2, c3, c4, popped;
  OK(api->cuCtxCreate_v2(&c2, 0, dev));
  CUdeviceptr x2;
  OK(api->cuMemAlloc(&x2, 1000));
  OK(api->cuCtxPopCurrent(&popped));
  cr_assert_eq(popped, c2);
  OK(api->cuCtxCreate_v3(&c3, NULL, 0, 0, dev));
  CUdeviceptr x3;
  OK(api->cuMemAlloc(&x3, 3000));
  OK(api->cuCtxPopCurrent(&popped));
  OK(api->cuCtxCreate_v4(&c4, NULL, 0, dev));
  CUdeviceptr x4;
  void *hx;
  OK(api->cuMemAlloc(&x4, 5000));
  OK(api->cuMemHostAlloc(&hx, 4096, 0));
  CHECK("allocations in created contexts");
  cr_assert(h_find(x3, &b));
  cr_assert_eq(b.context, (void *)c3);
  OK(api->cuCtxDestroy(c4));
  OK(api->cuCtxDestroy(c3));
  OK(api->cuCtxDestroy(c2));
  CHECK("cuCtxDestroy");
  cr_assert_eq(gpureclaim_stats(-1, &st1), 0);
  cr_assert_eq(st1.ctx_destroyed_blocks - st0.ctx_destroyed_blocks, 3);
  cr_assert_eq(st1.ctx_destroyed_bytes - st0.ctx_destroyed_bytes, 9000);

  /* Context switches, on two devices: after each call that changes the current context, by this route, blocks
   * are recorded in the context the driver made them in (gpureclaim keeps each thread's current context and
   * must see every such call: registry.c). */
  CUcontext q1, q, g, v, v2;
  OK(api->cuDevicePrimaryCtxRetain(&q1, 1));
  OK(api->cuCtxSetCurrent(primary));
  checks += expect_current(api, primary, 0, "cuCtxSetCurrent");
  OK(api->cuCtxSetCurrent(q1));
  checks += expect_current(api, q1, 1, "cuCtxSetCurrent");
  OK(api->cuCtxPushCurrent(primary));
  checks += expect_current(api, primary, 0, "cuCtxPushCurrent");
  OK(api->cuCtxPopCurrent(&popped));
  cr_assert_eq(popped, primary);
  checks += expect_current(api, q1, 1, "cuCtxPopCurrent");
  OK(api->cuCtxCreate_v2(&q, 0, 0));
  checks += expect_current(api, q, 0, "cuCtxCreate");
  OK(api->cuCtxDestroy(q));
  checks += expect_current(api, q1, 1, "cuCtxDestroy of the current context");
  OK(api->cuGLCtxCreate(&g, 0, 0));
  checks += expect_current(api, g, 0, "cuGLCtxCreate");
  OK(api->cuCtxDestroy(g));
  OK(api->cuVDPAUCtxCreate(&v, 0, 0, 0, NULL));
  checks += expect_current(api, v, 0, "cuVDPAUCtxCreate");
  OK(api->cuCtxAttach(&v2, 0));
  cr_assert_eq(v2, v);
  CUdeviceptr kept;
  OK(api->cuMemAlloc(&kept, 5000));
  OK(api->cuCtxDetach(v)); /* usage 2 -> 1: the context stays, current */
  checks += expect_current(api, v, 0, "a cuCtxDetach that left the context");
  cr_assert(h_find(kept, &b), "%s: a cuCtxDetach that left the context dropped its block", api->route);
  OK(api->cuCtxDetach(v)); /* 1 -> 0: destroyed with its memory, and popped */
  cr_assert(!h_find(kept, &b), "%s: the context's last cuCtxDetach left its block in the table", api->route);
  checks += expect_current(api, q1, 1, "the last cuCtxDetach");
  OK(api->cuCtxSynchronize()); /* the stream-ordered frees on device 1 run */
  OK(api->cuCtxSetCurrent(primary));
  OK(api->cuCtxSynchronize());
  CHECK("context switches");
  OK(api->cuDevicePrimaryCtxRelease(1));

  /* The primary context: a reset frees its memory, so does the final release. */
  OK(api->cuCtxSetCurrent(primary));
  CUdeviceptr y1;
  OK(api->cuMemAlloc(&y1, 777));
  CHECK("before cuDevicePrimaryCtxReset");
  OK(api->cuDevicePrimaryCtxReset(dev));
  CHECK("cuDevicePrimaryCtxReset");
  cr_assert(!h_find(y1, &b));
  OK(api->cuDevicePrimaryCtxRetain(&primary, dev));
  OK(api->cuCtxSetCurrent(primary));
  CUdeviceptr y2;
  OK(api->cuMemAlloc(&y2, 888));
  CHECK("after re-retaining the primary context");
  OK(api->cuDevicePrimaryCtxRelease(dev)); /* the reset kept the first retain; this is the second */
  OK(api->cuDevicePrimaryCtxRelease(dev));
  CHECK("final cuDevicePrimaryCtxRelease");
  cr_assert(!h_find(y2, &b));
  cr_assert(!h_find(p1, &b) && !h_find(m1, &b), "the primary context's memory went with it");
  return checks;
}

h_fw_alloc_t h_framework_alloc(void) {
  void *fw = dlopen("libc10_cuda_standin.so", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(fw, "%s", dlerror());
  h_fw_alloc_t fn = (h_fw_alloc_t)dlsym(fw, "standin_alloc");
  cr_assert_not_null(fn, "%s", dlerror());
  return fn;
}
