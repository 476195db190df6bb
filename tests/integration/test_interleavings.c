/* Interleavings of a context destroy, a release and the program's own calls, made exact with the simulator's
 * simcuda_on_return(): another thread's step runs right after one of gpureclaim's driver calls returns and before
 * gpureclaim acts on the result. Each test names the step it places; each failed on the code before its fix.
 * What they all check: a record stays only for a block the driver still has (the table equals the simulator),
 * and a release never frees a block the program still uses. */
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)

static CUcontext g_a, g_b; /* A: the context destroyed; B: another one, current on this thread between steps */

static void init(void) {
  CUdevice dev;
  OK(cuInit(0));
  OK(cuDeviceGet(&dev, 0));
  OK(cuCtxCreate_v2(&g_b, 0, dev));
  OK(cuCtxPopCurrent(NULL));
  OK(cuCtxCreate_v2(&g_a, 0, dev)); /* A stays current */
}

static void fini(void) {
  simcuda_on_return(NULL, NULL, NULL);
  simcuda_inject(NULL, CUDA_SUCCESS, 0);
}

TestSuite(interleavings, .init = init, .fini = fini);

/* A block of A abandoned in a scope: an orphan a release would free. */
static CUdeviceptr orphan_in_a(size_t size) {
  CUcontext cur;
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, g_a);
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr p;
  OK(cuMemAlloc(&p, size));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  return p;
}

static CUdeviceptr alloc_in_b(size_t size) {
  CUdeviceptr p;
  OK(cuCtxPushCurrent(g_b));
  OK(cuMemAlloc(&p, size));
  OK(cuCtxPopCurrent(NULL));
  return p;
}

/* Properties of pinned memory on device 0, and its allocation granularity. */
static size_t device0_prop(CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  size_t gran;
  OK(cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return gran;
}

/* ---- rollbacks: the driver refuses, every record stays ---- */

Test(interleavings, a_refused_cuctxdestroy_puts_every_record_back) {
  CUdeviceptr live, orphan = orphan_in_a(1 * MiB);
  OK(cuMemAlloc(&live, 2 * MiB));
  gpureclaim_stats_t before = h_grs(-1);
  cr_assert_eq(simcuda_inject("cuCtxDestroy_v2", CUDA_ERROR_INVALID_CONTEXT, 1), 0);
  cr_assert_eq(cuCtxDestroy(g_a), CUDA_ERROR_INVALID_CONTEXT, "the driver's refusal is returned");
  gpureclaim_stats_t after = h_grs(-1);
  cr_assert_eq(after.live_blocks, before.live_blocks);
  cr_assert_eq(after.orphan_blocks, before.orphan_blocks);
  cr_assert_eq(after.ctx_destroyed_blocks, before.ctx_destroyed_blocks);
  cr_assert(h_table_matches_sim("after the refused destroy"));
  gpureclaim_block_t b;
  cr_assert(h_find(orphan, &b) && b.state == GPURECLAIM_BLOCK_ORPHAN, "the orphan is still an orphan");
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 1);
  cr_assert_eq(rep.failed_blocks, 0);
  uint64_t untracked = h_grs(-1).untracked_frees;
  OK(cuMemFree(live));
  cr_assert_eq(h_grs(-1).untracked_frees, untracked, "the live block's free was a tracked one");
  cr_assert(h_table_matches_sim("after the frees"));
}

Test(interleavings, a_refused_primary_reset_puts_every_record_back) {
  CUcontext primary;
  OK(cuDevicePrimaryCtxRetain(&primary, 0));
  OK(cuCtxPushCurrent(primary));
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  OK(cuCtxPopCurrent(NULL));
  cr_assert_eq(simcuda_inject("cuDevicePrimaryCtxReset_v2", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(cuDevicePrimaryCtxReset(0), CUDA_ERROR_INVALID_VALUE);
  cr_assert(h_table_matches_sim("after the refused reset"));
  gpureclaim_block_t b;
  cr_assert(h_find(p, &b) && b.state == GPURECLAIM_BLOCK_LIVE);
  OK(cuDevicePrimaryCtxReset(0));
  cr_assert(!h_find(p, &b), "a reset that happened drops the record");
  cr_assert(h_table_matches_sim("after the reset"));
  OK(cuDevicePrimaryCtxRelease(0));
}

Test(interleavings, a_refused_cumemunmap_keeps_its_mapping) {
  CUmemAllocationProp prop;
  size_t gran = device0_prop(&prop);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h;
  OK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
  OK(cuMemCreate(&h, 2 * gran, &prop, 0));
  OK(cuMemMap(va, 2 * gran, 0, h, 0));
  OK(cuMemRelease(h)); /* the mapping keeps the memory */
  cr_assert_eq(simcuda_inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(cuMemUnmap(va, 2 * gran), CUDA_ERROR_INVALID_VALUE);
  cr_assert(h_table_matches_sim("after the refused unmap"));
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM_MAPPING), 1, "the mapping is still tracked");
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 1, "and so is its released handle, which it keeps alive");
  OK(cuMemUnmap(va, 2 * gran));
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 0, "the last unmap frees the released handle's memory");
  OK(cuMemAddressFree(va, 2 * gran));
  cr_assert(h_table_matches_sim("after the unmap"));
}

/* One cuMemUnmap over n mappings side by side, each of its own released handle: the table follows the driver
 * whatever n is (a fixed list of 64 left the 65th mapping, and its handle, behind), and a refused unmap of them all
 * keeps every record. */
static void unmap_many(int n) {
  CUmemAllocationProp prop;
  size_t gran = device0_prop(&prop);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, (size_t)n * gran, 0, 0, 0));
  for (int i = 0; i < n; i++) {
    CUmemGenericAllocationHandle h;
    OK(cuMemCreate(&h, gran, &prop, 0));
    OK(cuMemMap(va + (size_t)i * gran, gran, 0, h, 0));
    OK(cuMemRelease(h)); /* the mapping keeps the memory */
  }
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM_MAPPING), (size_t)n);
  cr_assert_eq(simcuda_inject("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(cuMemUnmap(va, (size_t)n * gran), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM_MAPPING), (size_t)n, "a refused unmap of %d mappings keeps them all", n);
  cr_assert(h_table_matches_sim("after the refused unmap of many"));
  OK(cuMemUnmap(va, (size_t)n * gran));
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM_MAPPING), 0, "one unmap of %d mappings left records behind", n);
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 0, "the last unmaps free the released handles' memory");
  cr_assert(h_table_matches_sim("after the unmap of many"));
  gpureclaim_stats_t st = h_grs(-1);
  cr_assert_eq(st.vmm_mapped_bytes, 0);
  OK(cuMemAddressFree(va, (size_t)n * gran));
}

Test(interleavings, one_cumemunmap_of_65_mappings) { unmap_many(65); }
Test(interleavings, one_cumemunmap_of_200_mappings) { unmap_many(200); }

/* ---- a free racing a refused destroy ---- */

typedef struct {
  CUdeviceptr freed, reused;
} free_then_reuse_t;

/* Another thread frees A's block while A's destroy is in the driver, and the driver hands its address to a block
 * of B. */
static void free_then_reuse(void *arg) {
  free_then_reuse_t *f = arg;
  OK(cuMemFree(f->freed));
  f->reused = alloc_in_b(1 * MiB);
}

Test(interleavings, a_block_freed_during_a_refused_destroy_is_not_put_back) {
  free_then_reuse_t f = {.freed = orphan_in_a(1 * MiB)};
  uint64_t untracked = h_grs(-1).untracked_frees;
  cr_assert_eq(simcuda_on_return("cuCtxDestroy_v2", free_then_reuse, &f), 0);
  cr_assert_eq(simcuda_inject("cuCtxDestroy_v2", CUDA_ERROR_INVALID_CONTEXT, 1), 0);
  cr_assert_eq(cuCtxDestroy(g_a), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(f.reused, f.freed, "the driver handed the address out again (the step this test places)");
  cr_assert_eq(h_grs(-1).untracked_frees, untracked, "the free during the destroy was a tracked one");
  cr_assert(h_table_matches_sim("after the refused destroy"));
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "no orphan came back");
  cr_assert_eq(h_sim(-1, g_b).live_blocks, 1, "B's block at the reused address is alive");
  OK(cuMemFree(f.reused));
}

/* ---- an allocation racing a destroy that succeeds ---- */

static void *destroy_a(void *arg) {
  (void)arg;
  OK(cuCtxDestroy(g_a));
  return NULL;
}

/* A's destroy runs on another thread after the driver handed out a block of A and before gpureclaim records it. */
static void destroy_a_elsewhere(void *arg) {
  (void)arg;
  gr_thread_run(destroy_a, NULL);
}

Test(interleavings, a_block_allocated_as_its_context_is_destroyed_leaves_no_record) {
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr p;
  cr_assert_eq(simcuda_on_return("cuMemAlloc_v2", destroy_a_elsewhere, NULL), 0);
  OK(cuMemAlloc(&p, 1 * MiB)); /* the driver's answer, though the block is gone by the time it returns */
  cr_assert_eq(h_sim(-1, NULL).contexts, 1, "A is gone (the step this test places)");
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  OK(cuCtxSetCurrent(g_b));
  gpureclaim_block_t b;
  cr_assert(!h_find(p, &b), "no record of a block the driver freed with its context");
  CUdeviceptr q;
  OK(cuMemAlloc(&q, 1 * MiB));
  cr_assert_eq(q, p, "the driver hands the address out again");
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0);
  cr_assert_eq(h_sim(-1, g_b).live_blocks, 1, "B's block at that address is alive");
  cr_assert(h_table_matches_sim("after the release"));
  OK(cuMemFree(q));
}

/* ---- a release's free and the driver's reuse of the address ---- */

typedef struct {
  CUdeviceptr p;
} realloc_t;

static void allocate_again(void *arg) {
  realloc_t *r = arg;
  OK(cuMemAlloc(&r->p, 1 * MiB));
}

/* The release freed an orphan; before it marks the record freed, another thread gets the address from the
 * driver. That block's double free is the program's error and must reach the driver, not pass as a late free. */
Test(interleavings, a_double_free_of_an_address_reused_during_a_release_reaches_the_driver) {
  CUdeviceptr old = orphan_in_a(1 * MiB);
  realloc_t r = {0};
  cr_assert_eq(simcuda_on_return("cuMemFree_v2", allocate_again, &r), 0);
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 1);
  cr_assert_eq(r.p, old, "the driver handed the address out during the release (the step this test places)");
  uint64_t late = h_grs(-1).late_frees, calls = simcuda_calls("cuMemFree_v2");
  OK(cuMemFree(r.p));
  cr_assert_eq(cuMemFree(r.p), CUDA_ERROR_INVALID_VALUE, "the double free gets the driver's answer");
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), calls + 2, "both frees reached the driver");
  cr_assert_eq(h_grs(-1).late_frees, late);
  cr_assert(h_table_matches_sim("after the frees"));
}

/* ---- a free answered "no such block" ---- */

/* Another thread's free of the same pointer reaches the driver while this thread's free is in it (as when two
 * threads free one pointer at once and the other one, finding no record, gets to the driver first). */
static void free_it_too(void *arg) { OK(cuMemFree(*(CUdeviceptr *)arg)); }

Test(interleavings, a_free_the_driver_found_no_block_for_does_not_put_the_record_back) {
  CUdeviceptr p = orphan_in_a(1 * MiB); /* an orphan: a stale record of it is what a release would free */
  uint64_t untracked = h_grs(-1).untracked_frees;
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, 1), 0); /* this thread's call does nothing */
  cr_assert_eq(simcuda_on_return("cuMemFree_v2", free_it_too, &p), 0);
  cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h_grs(-1).untracked_frees, untracked + 1, "the other free found no record (the step this test places)");
  cr_assert_eq(h_count(0), 0, "no record is left for the freed block");
  cr_assert(h_table_matches_sim("after the double free"));
  CUdeviceptr q = alloc_in_b(1 * MiB); /* the driver hands the address out again */
  cr_assert_eq(q, p, "the address came back (the step this test places)");
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "no orphan record of the freed block");
  cr_assert_eq(h_sim(-1, g_b).live_blocks, 1, "B's block at the address is alive");
  OK(cuMemFree(q));
}

/* The same double free, and another context gets the address before this thread's free returns: the driver has
 * a block at the address again (the new one), so asking it cannot tell; the new block's record in the table does. */
static CUdeviceptr g_again;
static void free_it_and_allocate_in_b(void *arg) {
  OK(cuMemFree(*(CUdeviceptr *)arg));
  g_again = alloc_in_b(1 * MiB);
}

Test(interleavings, a_double_free_whose_address_is_given_again_before_it_returns_leaves_one_record) {
  CUdeviceptr p = orphan_in_a(1 * MiB);
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(simcuda_on_return("cuMemFree_v2", free_it_and_allocate_in_b, &p), 0);
  cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(g_again, p, "the address came back (the step this test places)");
  cr_assert_eq(h_count(0), 1, "one record: the new block's");
  cr_assert(h_table_matches_sim("after the double free and the new allocation"));
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "the release freed B's live block at the address");
  cr_assert_eq(h_sim(-1, g_b).live_blocks, 1, "B's block at the address is alive");
  OK(cuMemFree(g_again));
}

/* The same for pinned host memory, which the driver is not asked about. */
static void *g_host_again;
static void free_host_and_allocate(void *arg) {
  OK(cuMemFreeHost(*(void **)arg));
  OK(cuMemHostAlloc(&g_host_again, 4096, 0));
}

Test(interleavings, a_double_free_of_pinned_memory_whose_address_is_given_again_leaves_one_record) {
  uint64_t s = gpureclaim_scope_begin();
  void *h;
  OK(cuMemHostAlloc(&h, 4096, 0));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(simcuda_inject("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(simcuda_on_return("cuMemFreeHost", free_host_and_allocate, &h), 0);
  cr_assert_eq(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(g_host_again, h, "the address came back (the step this test places)");
  cr_assert_eq(h_count(GPURECLAIM_KIND_HOST), 1, "one record: the new block's");
  cr_assert(h_table_matches_sim("after the double free of pinned memory"));
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "the release freed the new pinned block");
  OK(cuMemFreeHost(g_host_again));
}

/* The driver refuses with the same code a block it still has: the record stays. */
Test(interleavings, a_free_refused_with_invalid_value_of_a_block_the_driver_has_keeps_it_tracked) {
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h_count(0), 1, "the block is still tracked");
  cr_assert(h_table_matches_sim("after the refused free"));
  OK(cuMemFree(p));
  cr_assert(h_table_matches_sim("after the free"));
}

static void release_it_too(void *arg) { OK(cuMemRelease(*(CUmemGenericAllocationHandle *)arg)); }

/* The same for a VMM handle released twice at once. */
Test(interleavings, a_release_of_a_handle_the_driver_no_longer_knows_does_not_put_the_record_back) {
  CUmemAllocationProp prop;
  size_t gran = device0_prop(&prop);
  CUmemGenericAllocationHandle h;
  OK(cuMemCreate(&h, gran, &prop, 0));
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 1);
  cr_assert_eq(simcuda_inject("cuMemRelease", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(simcuda_on_return("cuMemRelease", release_it_too, &h), 0);
  cr_assert_eq(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 0, "no record is left for the released handle");
  cr_assert(h_table_matches_sim("after the double release"));
  /* And one the driver still has stays tracked. */
  OK(cuMemCreate(&h, gran, &prop, 0));
  cr_assert_eq(simcuda_inject("cuMemRelease", CUDA_ERROR_INVALID_VALUE, 1), 0);
  cr_assert_eq(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h_count(GPURECLAIM_KIND_VMM), 1, "the refused release keeps the handle tracked");
  OK(cuMemRelease(h));
  cr_assert(h_table_matches_sim("after the release"));
}

/* The driver answers CUDA_ERROR_INVALID_VALUE for a reservation that still exists (freed with another size, or
 * still mapped): its record stays. */
Test(interleavings, a_refused_cumemaddressfree_keeps_its_reservation) {
  CUmemAllocationProp prop;
  size_t gran = device0_prop(&prop);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
  cr_assert_eq(cuMemAddressFree(va, gran), CUDA_ERROR_INVALID_VALUE, "the driver's answer to a wrong size");
  cr_assert_eq(h_count(GPURECLAIM_KIND_VA), 1, "the reservation is still tracked");
  cr_assert(h_table_matches_sim("after the refused free"));
  OK(cuMemAddressFree(va, 2 * gran));
  cr_assert_eq(h_count(GPURECLAIM_KIND_VA), 0);
}
