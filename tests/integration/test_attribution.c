/* Attribution on two devices: every block gpureclaim records carries the context, device, pool and scope the
 * driver gives it, and a release gives pool memory back only after the frees before it have run. The
 * simulator exposes two devices (its default) and runs stream-ordered frees only when their stream is
 * synchronised, as the device does. Each test also compares the whole table with the simulator's own view. */
#include "harness.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)
#define CHECK(step) cr_assert(h_table_matches_sim(step), "table differs from the simulator after %s", step)

static CUcontext g_p0, g_p1; /* primary contexts of devices 0 and 1; device 0's is current */

static void init(void) {
  OK(cuInit(0));
  int n = 0;
  OK(cuDeviceGetCount(&n));
  cr_assert_geq(n, 2, "these tests need the simulator's two devices (SIMCUDA_DEVICES)");
  OK(cuDevicePrimaryCtxRetain(&g_p0, 0));
  OK(cuDevicePrimaryCtxRetain(&g_p1, 1));
  OK(cuCtxSetCurrent(g_p0));
}

TestSuite(attribution, .init = init);

static gpureclaim_block_t block(uint64_t address) {
  gpureclaim_block_t b;
  cr_assert(h_find(address, &b), "gpureclaim tracks %#llx", (unsigned long long)address);
  return b;
}

static uint64_t reserved(CUmemoryPool pool) {
  cuuint64_t v = 0;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
  return v;
}

static void keep_everything(CUmemoryPool pool) { /* a synchronisation then releases nothing by itself */
  cuuint64_t max = UINT64_MAX;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
}

static const gpureclaim_device_report_t *dev_report(const gpureclaim_report_t *r, int device) {
  for (int i = 0; i < r->ndevices; i++)
    if (r->devices[i].device == device)
      return &r->devices[i];
  return NULL;
}

/* A stream-ordered block belongs to its stream's context and is on its pool's device, whatever context is
 * current on the allocating thread. */
Test(attribution, async_blocks_take_the_stream_s_context_and_the_pool_s_device) {
  CUcontext c1, popped;
  OK(cuCtxCreate_v2(&c1, 0, 1)); /* pushed current */
  CUstream s1;
  OK(cuStreamCreate(&s1, 0));
  OK(cuCtxPopCurrent(&popped));
  cr_assert_eq(popped, c1);
  CUcontext cur = NULL;
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, g_p0, "device 0's context is current while allocating on device 1's stream");

  CUdeviceptr a, b;
  OK(cuMemAllocAsync(&a, 3 * MiB, s1));
  gpureclaim_block_t ba = block(a);
  cr_assert_eq(ba.kind, GPURECLAIM_KIND_ASYNC);
  cr_assert_eq(ba.context, (void *)c1, "the stream's context, not the current one");
  cr_assert_eq(ba.device, 1);
  CUmemoryPool def1;
  OK(cuDeviceGetDefaultMemPool(&def1, 1));
  cr_assert_eq(ba.pool, (void *)def1, "device 1's current pool");

  /* from a pool of device 0 on device 1's stream: device 0's memory, c1's stream */
  CUmemoryPool def0;
  OK(cuDeviceGetDefaultMemPool(&def0, 0));
  OK(cuMemAllocFromPoolAsync(&b, MiB, def0, s1));
  gpureclaim_block_t bb = block(b);
  cr_assert_eq(bb.context, (void *)c1);
  cr_assert_eq(bb.device, 0);
  cr_assert_eq(bb.pool, (void *)def0);
  CHECK("stream-ordered allocations on another context's stream");
  cr_assert_eq(h_grs(1).live_bytes, 3 * MiB);
  cr_assert_eq(h_grs(0).live_bytes, MiB);

  OK(cuMemFreeAsync(a, s1));
  OK(cuMemFreeAsync(b, s1));
  CHECK("stream-ordered frees (not yet run)");
  OK(cuCtxDestroy(c1));
  CHECK("the stream's context destroyed");
}

/* Every kind of block made on device 1 is recorded on device 1, and the per-device figures agree with the
 * driver's. */
Test(attribution, blocks_made_on_device_1_are_recorded_on_device_1) {
  OK(cuCtxSetCurrent(g_p1));
  CUdeviceptr d, p, m, a;
  size_t pitch;
  void *h;
  OK(cuMemAlloc(&d, 5 * MiB));
  OK(cuMemAllocPitch(&p, &pitch, 1000, 100, 4));
  OK(cuMemAllocManaged(&m, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocAsync(&a, 7 * MiB, NULL));
  OK(cuMemHostAlloc(&h, 8192, 0));
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  CUmemGenericAllocationHandle vh;
  OK(cuMemCreate(&vh, 4 * MiB, &prop, 0));
  CUmemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pp.location.id = 1;
  CUmemoryPool pool;
  OK(cuMemPoolCreate(&pool, &pp));
  CUdeviceptr f;
  OK(cuCtxSetCurrent(g_p0)); /* allocating from device 1's pool on device 0's default stream */
  OK(cuMemAllocFromPoolAsync(&f, MiB, pool, NULL));
  OK(cuCtxSetCurrent(g_p1));

  const uint64_t addrs[] = {d, p, m, a, (uint64_t)vh, f};
  for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++)
    cr_assert_eq(block(addrs[i]).device, 1, "block %zu is on device 1", i);
  cr_assert_eq(block((uint64_t)(uintptr_t)h).context, (void *)g_p1);
  CHECK("allocations on device 1");
  simcuda_stats_t s1 = h_sim(1, NULL), s0 = h_sim(0, NULL);
  gpureclaim_stats_t g1 = h_grs(1), g0 = h_grs(0);
  cr_assert_eq(g1.live_bytes, s1.live_bytes + s1.vmm_phys_bytes);
  cr_assert_eq(g1.live_blocks, s1.live_blocks + s1.vmm_handles);
  cr_assert_eq(g0.live_bytes, 0);
  cr_assert_eq(s0.live_bytes, 0);
  cr_assert_eq(g1.pool_reserved_bytes, s1.pool_reserved_bytes);
  cr_assert_eq(g1.pool_used_bytes, s1.pool_used_bytes);

  /* a release reports what it freed on the device it was on */
  uint64_t sc = gpureclaim_scope_begin();
  cr_assert_neq(sc, 0);
  CUdeviceptr o;
  OK(cuMemAlloc(&o, 9 * MiB));
  cr_assert_eq(gpureclaim_scope_end(sc, 0), 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_bytes, 9 * MiB);
  const gpureclaim_device_report_t *r1 = dev_report(&r, 1), *r0 = dev_report(&r, 0);
  cr_assert_not_null(r1);
  cr_assert_eq(r1->orphaned_bytes, 9 * MiB);
  cr_assert(r0 == NULL || r0->orphaned_bytes == 0);
  CHECK("orphans of device 1 released");
}

/* VMM mappings on both devices: gpureclaim's mapped bytes are the driver's, per device and in total. */
Test(attribution, vmm_mapped_bytes_per_device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h0, h1;
  prop.location.id = 0;
  OK(cuMemCreate(&h0, 8 * MiB, &prop, 0));
  prop.location.id = 1;
  OK(cuMemCreate(&h1, 4 * MiB, &prop, 0));
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 32 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 8 * MiB, 0, h0, 0));
  OK(cuMemMap(va + 8 * MiB, 2 * MiB, 0, h1, 0)); /* part of a handle */
  OK(cuMemMap(va + 16 * MiB, 4 * MiB, 0, h1, 0)); /* the same handle twice */
  CHECK("mappings on two devices");
  cr_assert_eq(h_grs(-1).vmm_mapped_bytes, 14 * MiB);
  cr_assert_eq(h_grs(0).vmm_mapped_bytes, h_sim(0, NULL).vmm_mapped_bytes);
  cr_assert_eq(h_grs(1).vmm_mapped_bytes, h_sim(1, NULL).vmm_mapped_bytes);
  cr_assert_eq(h_grs(1).vmm_mapped_bytes, 6 * MiB);
  OK(cuMemUnmap(va + 8 * MiB, 2 * MiB));
  OK(cuMemRelease(h1));
  CHECK("one mapping gone, its handle released but still mapped");
  cr_assert_eq(h_grs(1).vmm_mapped_bytes, 4 * MiB);
  OK(cuMemUnmap(va, 8 * MiB));
  OK(cuMemUnmap(va + 16 * MiB, 4 * MiB));
  CHECK("all unmapped");
  cr_assert_eq(h_grs(-1).vmm_mapped_bytes, 0);
  OK(cuMemRelease(h0));
  OK(cuMemAddressFree(va, 32 * MiB));
}

/* A scope tags stream-ordered blocks like the others; ending it makes them orphans a release frees, and the
 * pool they went back to is trimmed. */
Test(attribution, async_blocks_are_tagged_with_the_scope) {
  CUstream s;
  OK(cuStreamCreate(&s, 0));
  CUmemoryPool def0;
  OK(cuDeviceGetDefaultMemPool(&def0, 0));
  keep_everything(def0);
  uint64_t sc = gpureclaim_scope_begin();
  cr_assert_neq(sc, 0);
  CUdeviceptr a, b, c, outside;
  OK(cuMemAllocAsync(&a, 4 * MiB, s));
  OK(cuMemAllocFromPoolAsync(&b, 2 * MiB, def0, NULL));
  OK(cuMemAlloc(&c, MiB));
  cr_assert_eq(block(a).scope, sc, "cuMemAllocAsync takes the scope");
  cr_assert_eq(block(b).scope, sc, "cuMemAllocFromPoolAsync takes the scope");
  cr_assert_eq(block(c).scope, sc);
  cr_assert_eq(gpureclaim_scope_end(sc, 0), 0);
  OK(cuMemAllocAsync(&outside, MiB, s));
  cr_assert_eq(block(outside).scope, 0);
  cr_assert_eq(block(a).state, GPURECLAIM_BLOCK_ORPHAN);
  cr_assert_eq(block(b).state, GPURECLAIM_BLOCK_ORPHAN);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 3);
  cr_assert_eq(r.orphaned_bytes, 7 * MiB);
  gpureclaim_block_t left;
  cr_assert(!h_find(a, &left) && !h_find(b, &left));
  cr_assert_eq(block(outside).state, GPURECLAIM_BLOCK_LIVE);
  CHECK("orphaned stream-ordered blocks released");
  cr_assert_eq(reserved(def0), MiB, "the pool kept only the live block's memory");
}

/* A release synchronises before it trims: memory freed stream-ordered but not yet reached by its stream is
 * still in use, and a trim before the synchronisation cannot return it. */
Test(attribution, a_release_synchronises_before_trimming) {
  CUmemoryPool def0, def1;
  OK(cuDeviceGetDefaultMemPool(&def0, 0));
  OK(cuDeviceGetDefaultMemPool(&def1, 1));
  keep_everything(def0);
  keep_everything(def1);
  CUstream s0, s1;
  OK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  OK(cuCtxSetCurrent(g_p1));
  OK(cuStreamCreate(&s1, 0));
  CUdeviceptr a, b;
  OK(cuMemAllocAsync(&b, 16 * MiB, s1));
  OK(cuCtxSetCurrent(g_p0));
  OK(cuMemAllocAsync(&a, 32 * MiB, s0));
  OK(cuMemFreeAsync(a, s0));
  OK(cuMemFreeAsync(b, s1)); /* from device 0's thread, on device 1's stream */
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 0);
  cr_assert_eq(h_sim(-1, NULL).pool_used_bytes, 48 * MiB, "the frees have not run yet");
  CHECK("frees queued on two devices' streams");
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(reserved(def0), 0, "device 0's pool trimmed after its stream ran the free");
  cr_assert_eq(reserved(def1), 0, "device 1's pool too");
  cr_assert_eq(r.pool_bytes, 48 * MiB);
  const gpureclaim_device_report_t *r1 = dev_report(&r, 1);
  cr_assert_not_null(r1);
  cr_assert_eq(r1->pool_bytes, 16 * MiB);
  CHECK("after the release");
}

/* CUDA 13's cuMemSetMemPool makes a pool current for a device's pinned memory, like cuDeviceSetMemPool:
 * cuMemAllocAsync then takes from it, the blocks name it, and a release trims it. */
Test(attribution, a_pool_made_current_with_cuMemSetMemPool) {
  CUmemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pp.location.id = 1;
  CUmemoryPool mine;
  OK(cuMemPoolCreate(&mine, &pp));
  keep_everything(mine);
  CUdeviceptr before;
  OK(cuCtxSetCurrent(g_p1));
  OK(cuMemAllocAsync(&before, MiB, NULL)); /* gpureclaim learns device 1's current pool: the default one */
  /* Through cuGetProcAddress, as the runtime reaches it, and at 13010 as a CUDA 13.1 runtime asks. */
  CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = NULL;
  CUresult (*set)(CUmemLocation *, CUmemAllocationType, CUmemoryPool) = NULL;
  CUdriverProcAddressQueryResult st;
  OK(cuGetProcAddress("cuGetProcAddress", (void **)&gpa, 12000, 0, &st));
  OK(gpa("cuMemSetMemPool", (void **)&set, 13010, 0, &st));
  cr_assert_not_null(set);
  cr_assert_neq((void *)set, dlsym(h_libcuda(), "cuMemSetMemPool"), "gpureclaim wraps it");
  CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  OK(set(&l1, CU_MEM_ALLOCATION_TYPE_PINNED, mine));
  uint64_t sc = gpureclaim_scope_begin();
  CUdeviceptr a;
  OK(cuMemAllocAsync(&a, 8 * MiB, NULL));
  cr_assert_eq(gpureclaim_scope_end(sc, 0), 0);
  cr_assert_eq(block(a).pool, (void *)mine, "the pool cuMemSetMemPool made current");
  CHECK("allocation from the pool set current");
  cr_assert_eq(reserved(mine), 8 * MiB);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_bytes, 8 * MiB);
  cr_assert_eq(reserved(mine), 0, "the orphan's pool was trimmed");
  CHECK("after the release");
  OK(cuMemFreeAsync(before, NULL));
}

/* A pool the program reached only through cuMemGetDefaultMemPool or cuMemGetMemPool (CUDA 13) is known with
 * its device: blocks taken from it on another device's stream are on its device, and a release reports its
 * trim there. */
static void pool_by_location(CUresult (*get)(CUmemoryPool *, CUmemLocation *, CUmemAllocationType)) {
  CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemoryPool pool;
  OK(get(&pool, &l1, CU_MEM_ALLOCATION_TYPE_PINNED));
  keep_everything(pool);
  CUdeviceptr a;
  OK(cuMemAllocFromPoolAsync(&a, 6 * MiB, pool, NULL)); /* device 0's default stream */
  cr_assert_eq(block(a).device, 1, "the pool's device, not the stream's");
  CHECK("allocation from a pool found by location");
  OK(cuMemFreeAsync(a, NULL));
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  const gpureclaim_device_report_t *r1 = dev_report(&r, 1);
  cr_assert_not_null(r1);
  cr_assert_geq(r1->pool_bytes, 6 * MiB);
  cr_assert_eq(h_sim(1, NULL).pool_reserved_bytes, 0);
  CHECK("after the release");
}

Test(attribution, a_pool_found_with_cuMemGetDefaultMemPool) { pool_by_location(cuMemGetDefaultMemPool); }

Test(attribution, a_pool_found_with_cuMemGetMemPool) { pool_by_location(cuMemGetMemPool); }

/* Each thread's blocks take that thread's current context, while both switch between the two devices' contexts
 * at their own pace: gpureclaim keeps the current context per thread, and a switch on one thread must not leak
 * into another's. Run under TSan too. */
typedef struct {
  int first; /* device whose context the thread starts in */
  int wrong;
} switcher_t;

static void *switcher(void *arg) {
  switcher_t *s = arg;
  CUcontext ctx[2] = {g_p0, g_p1};
  int d = s->first;
  for (int i = 0; i < 400; i++) {
    if (i % (s->first ? 7 : 3) == 0) {
      d = !d;
      if (cuCtxSetCurrent(ctx[d]) != CUDA_SUCCESS)
        s->wrong++;
    }
    CUdeviceptr p;
    gpureclaim_block_t b;
    if (cuMemAlloc(&p, 4096 + (size_t)i) != CUDA_SUCCESS)
      s->wrong++;
    else if (!h_find(p, &b) || b.context != (void *)ctx[d] || b.device != d)
      s->wrong++;
    if (cuMemFree(p) != CUDA_SUCCESS)
      s->wrong++;
  }
  return NULL;
}

Test(attribution, each_thread_s_blocks_take_its_own_current_context) {
  switcher_t s[2] = {{.first = 0}, {.first = 1}};
  pthread_t t = gr_thread_start(switcher, &s[1]);
  switcher(&s[0]);
  gr_thread_join(t);
  cr_assert_eq(s[0].wrong + s[1].wrong, 0, "%d and %d blocks recorded in another context than their thread's",
               s[0].wrong, s[1].wrong);
  CHECK("two threads switching contexts");
}

/* gpureclaim's own pushes and pops (a release's driver calls, its memory figures, its synchronisation) on a thread
 * that holds a kept current context leave the thread's next blocks in its own context. */
Test(attribution, gpureclaim_s_own_push_and_pop_keep_the_thread_s_context) {
  OK(cuCtxSetCurrent(g_p1));
  CUdeviceptr a, b;
  OK(cuMemAlloc(&a, 4096)); /* kept: device 1's context */
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ALL, &rep), 0);
  for (int i = 0; i < 70; i++) { /* past the 1-in-64 check */
    OK(cuMemAlloc(&b, 4096));
    gpureclaim_block_t bb = block(b);
    cr_assert_eq(bb.context, (void *)g_p1);
    cr_assert_eq(bb.device, 1);
    OK(cuMemFree(b));
  }
  OK(cuCtxSetCurrent(g_p0));
}

/* Contexts and pools past the registry's 4095 ids over a process's life. A context made after 4100 others were
 * made and destroyed gets an id of its own (a dead one, that no record names), so its destroy drops its blocks'
 * records; a release afterwards frees nothing of the context that gets the same address. With ids never given
 * again, the later contexts got id 0: the orphan's record outlived the destroy, and the release freed the other
 * context's live block at that address. */
Test(attribution, contexts_past_the_registry_s_size_keep_their_blocks_apart, .timeout = 120) {
  CUcontext c, popped;
  for (int i = 0; i < 4100; i++) {
    OK(cuCtxCreate_v2(&c, 0, i & 1));
    OK(cuCtxDestroy(c));
  }
  OK(cuCtxCreate_v2(&c, 0, 1));
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 3 * MiB));
  gpureclaim_block_t ba = block(a);
  cr_assert_eq(ba.context, (void *)c, "the 4102nd context's block names it");
  cr_assert_eq(ba.device, 1);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0); /* abandoned: a is an orphan */
  OK(cuCtxDestroy(c));                          /* the driver frees a with its context */
  gpureclaim_block_t gone;
  cr_assert_not(h_find(a, &gone), "the destroy dropped the record of its context's block");
  OK(cuCtxGetCurrent(&popped));
  OK(cuCtxSetCurrent(g_p1));
  CUdeviceptr b;
  OK(cuMemAlloc(&b, 3 * MiB));
  cr_assert_eq(b, a, "the simulator gives the freed address again at once, as the driver does");
  cr_assert_eq(block(b).context, (void *)g_p1);
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "the release freed %llu blocks", (unsigned long long)rep.orphaned_blocks);
  CHECK("a release after a context past the registry's size was destroyed");
  OK(cuMemFree(b));
  CUmemoryPool pool;
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  for (int i = 0; i < 4100; i++) { /* pools too */
    OK(cuMemPoolCreate(&pool, &props));
    OK(cuMemPoolDestroy(pool));
  }
  OK(cuCtxSetCurrent(g_p0));
  OK(cuMemPoolCreate(&pool, &props));
  CUdeviceptr p;
  OK(cuMemAllocFromPoolAsync(&p, MiB, pool, NULL));
  cr_assert_eq(block(p).pool, (void *)pool, "the 4101st pool's block names it");
  OK(cuMemFreeAsync(p, NULL));
  OK(cuStreamSynchronize(NULL));
  OK(cuMemPoolDestroy(pool));
  CHECK("pools past the registry's size");
}

/* With 4095 contexts alive at once, the next one gets no id: a release never frees a block of it (its destroy
 * could not drop the block's record, and the address may be another context's block by then). */
Test(attribution, a_release_leaves_blocks_of_a_context_without_an_id, .timeout = 120) {
  static CUcontext many[4095];
  CUcontext c, popped;
  for (int i = 0; i < 4095; i++) {
    OK(cuCtxCreate_v2(&many[i], 0, 0));
    OK(cuCtxPopCurrent(&popped)); /* (the simulator's context stack is bounded, as the driver's is) */
  }
  OK(cuCtxCreate_v2(&c, 0, 1));
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 3 * MiB));
  cr_assert_null(block(a).context, "the registry is full: no context id");
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  OK(cuCtxDestroy(c));
  OK(cuCtxSetCurrent(g_p1));
  CUdeviceptr b;
  OK(cuMemAlloc(&b, 3 * MiB));
  cr_assert_eq(b, a, "the simulator gives the freed address again at once, as the driver does");
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "the release freed %llu blocks", (unsigned long long)rep.orphaned_blocks);
  OK(cuMemFree(b));
  for (int i = 0; i < 4095; i++)
    OK(cuCtxDestroy(many[i]));
}
