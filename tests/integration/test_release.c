/* The release engine against the simulator: what a release gives back, and what it must never touch. */
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)

static CUcontext g_ctx;

static void init(void) { g_ctx = h_cuda_start(0); }

TestSuite(release, .init = init);

/* The size contract of gpureclaim.h: min(size, the library's sizeof) bytes are filled, and size says how many. */
Test(release, struct_sizes_of_older_and_newer_headers) {
  struct {
    gpureclaim_stats_t s;
    uint64_t added_later[4];
  } newer;
  memset(&newer, 0xab, sizeof newer);
  newer.s.size = sizeof newer;
  cr_assert_eq(gpureclaim_stats(-1, &newer.s), 0);
  cr_assert_eq(newer.s.size, sizeof(gpureclaim_stats_t), "size tells a newer program what was filled");
  cr_assert_eq(newer.added_later[0], UINT64_C(0xabababababababab), "nothing past the library's struct written");
  gpureclaim_stats_t older;
  memset(&older, 0xab, sizeof older);
  older.size = offsetof(gpureclaim_stats_t, live_blocks) + sizeof(uint64_t);
  cr_assert_eq(gpureclaim_stats(-1, &older), 0);
  cr_assert_eq(older.size, offsetof(gpureclaim_stats_t, live_blocks) + sizeof(uint64_t));
  cr_assert_eq(older.live_bytes, UINT64_C(0xabababababababab), "an older program's struct is not overrun");
  struct {
    gpureclaim_report_t r;
    uint64_t added_later;
  } rnewer;
  memset(&rnewer, 0xab, sizeof rnewer);
  rnewer.r.size = sizeof rnewer;
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &rnewer.r), 0);
  cr_assert_eq(rnewer.r.size, sizeof(gpureclaim_report_t));
  cr_assert_eq(rnewer.added_later, UINT64_C(0xabababababababab));
}

Test(release, bad_requests) {
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(0, &r), -EINVAL);
  cr_assert_eq(gpureclaim_release(0x80, &r), -EINVAL);
  gpureclaim_report_t tiny = {.size = 4};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &tiny), -EINVAL);
  cr_assert_eq(gpureclaim_release_context(NULL, &r), -EINVAL);
  cr_assert_eq(gpureclaim_release_context((void *)0x1234, &r), -ENOENT);
  cr_assert_eq(gpureclaim_scope_end(0, 0), -EINVAL);
  cr_assert_eq(gpureclaim_scope_end(12345, 0), -ENOENT);
  cr_assert_eq(gpureclaim_scope_end(gpureclaim_scope_begin(), 0x8), -EINVAL);
  cr_assert_eq(gpureclaim_register_releaser(NULL, NULL, NULL), -EINVAL);
  cr_assert_eq(gpureclaim_unregister_releaser(999), -ENOENT);
}

Test(release, pool_retention_then_trim) {
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep = UINT64_MAX; /* PyTorch's cudaMallocAsync backend keeps everything */
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  CUdeviceptr a, b;
  OK(cuMemAllocAsync(&a, 64 * MiB, NULL));
  OK(cuMemAllocAsync(&b, 16 * MiB, NULL));
  OK(cuMemFreeAsync(a, NULL));
  OK(cuMemFreeAsync(b, NULL));
  OK(cuCtxSynchronize());
  uint64_t held = h_sim(-1, NULL).pool_reserved_bytes;
  cr_assert_geq(held, 80 * MiB, "the pool retains what was freed");
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(h_sim(-1, NULL).pool_reserved_bytes, 0, "trimmed to nothing");
  cr_assert_eq(r.pool_bytes, held, "the report says exactly what the pool gave back");
  cr_assert_eq(r.cached_bytes, held);
  cr_assert_eq(r.trigger, GPURECLAIM_TRIGGER_API);
  cr_assert_eq(r.ndevices, 1);
  cr_assert_eq(r.devices[0].device, 0);
  cr_assert_eq(r.devices[0].pool_bytes, held);
  cr_assert_eq(r.devices[0].free_after - r.devices[0].free_before, held, "cuMemGetInfo before and after");
  cr_assert_gt(r.seq, 0);
  cr_assert(h_table_matches_sim("after trim"));
  gpureclaim_stats_t s = h_grs(-1);
  cr_assert_eq(s.releases, 1);
  cr_assert_eq(s.released_bytes, held);
}

Test(release, created_pools_are_trimmed_too) {
  CUmemPoolProps p;
  memset(&p, 0, sizeof p);
  p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  CUmemoryPool pool;
  OK(cuMemPoolCreate(&pool, &p));
  cuuint64_t keep = UINT64_MAX;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  CUdeviceptr x;
  OK(cuMemAllocFromPoolAsync(&x, 8 * MiB, pool, NULL));
  OK(cuMemFreeAsync(x, NULL));
  cr_assert_geq(h_sim(-1, NULL).pool_reserved_bytes, 8 * MiB);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(h_sim(-1, NULL).pool_reserved_bytes, 0);
  cr_assert_geq(r.pool_bytes, 8 * MiB);
}

Test(release, orphans_of_ended_scopes_only) {
  CUdeviceptr keep1, keep2, o1, o2, o3;
  OK(cuMemAlloc(&keep1, 1 * MiB)); /* no scope */
  uint64_t outer = gpureclaim_scope_begin();
  cr_assert_neq(outer, 0);
  cr_assert_eq(gpureclaim_scope_current(), outer);
  OK(cuMemAlloc(&keep2, 2 * MiB)); /* the outer scope stays open */
  uint64_t inner = gpureclaim_scope_begin();
  OK(cuMemAlloc(&o1, 3 * MiB));
  OK(cuMemAlloc(&o2, 4 * MiB));
  void *host;
  OK(cuMemHostAlloc(&host, 8192, 0));
  OK(cuMemAlloc(&o3, 5 * MiB));
  OK(cuMemFree(o3)); /* freed by the program: not an orphan */
  gpureclaim_block_t b;
  cr_assert(h_find(o1, &b));
  cr_assert_eq(b.scope, inner);
  cr_assert_eq(gpureclaim_scope_end(inner, 0), 0);
  cr_assert_eq(gpureclaim_scope_end(inner, 0), -ENOENT, "ended once");
  cr_assert_eq(gpureclaim_scope_current(), outer);
  gpureclaim_stats_t s = h_grs(-1);
  cr_assert_eq(s.orphan_blocks, 3);
  cr_assert_eq(s.orphan_bytes, 7 * MiB + 8192);
  cr_assert(h_find(o1, &b));
  cr_assert_eq(b.state, GPURECLAIM_BLOCK_ORPHAN);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 3);
  cr_assert_eq(r.orphaned_bytes, 7 * MiB + 8192);
  cr_assert(h_table_matches_sim("orphans freed"));
  cr_assert(h_find(keep1, &b) && h_find(keep2, &b), "live blocks of open scopes and of none untouched");
  cr_assert(!h_find(o1, &b) && !h_find(o2, &b));
  s = h_grs(-1);
  cr_assert_eq(s.orphan_blocks, 0);
  cr_assert_eq(gpureclaim_scope_end(outer, 0), 0);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 1, "the outer scope's block after the outer scope ended");
  cr_assert(h_find(keep1, &b));
}

/* Allocates 256 KiB on another thread into ((CUdeviceptr *)arg)[0], in a scope of its own that it ends (the
 * block is then that scope's orphan) when ((CUdeviceptr *)arg)[1] is non-zero. */
static void *alloc_256k_elsewhere(void *arg) {
  CUdeviceptr *p = arg;
  OK(cuCtxSetCurrent(g_ctx));
  uint64_t s = p[1] ? gpureclaim_scope_begin() : 0;
  OK(cuMemAlloc(&p[0], 256 * 1024));
  if (s)
    cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  return NULL;
}

Test(release, free_now) {
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 3 * MiB));
  uint64_t before = h_sim(-1, NULL).live_bytes;
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  cr_assert_eq(h_sim(-1, NULL).live_bytes, before - 3 * MiB, "freed at once");
  cr_assert(h_table_matches_sim("free now"));
}

/* FREE_NOW frees what the scope left live and nothing else: not another ended scope's orphans (a release
 * frees those), not unscoped blocks, not a block that got an address the scope had freed. */
Test(release, free_now_frees_only_its_own_scope) {
  uint64_t other = gpureclaim_scope_begin();
  CUdeviceptr o;
  OK(cuMemAlloc(&o, 1 * MiB));
  cr_assert_eq(gpureclaim_scope_end(other, 0), 0);
  CUdeviceptr mine[8], outside[64];
  for (int i = 0; i < 64; i++)
    OK(cuMemAlloc(&outside[i], 64 * 1024));
  uint64_t s = gpureclaim_scope_begin();
  for (int i = 0; i < 8; i++)
    OK(cuMemAlloc(&mine[i], 256 * 1024));
  /* The scope frees two blocks; the driver hands both addresses out again at once, to other threads: one to a
   * block of no scope, one to a block of another scope, which ends and leaves it an orphan. */
  CUdeviceptr unscoped[2] = {0, 0}, orphan[2] = {0, 1};
  OK(cuMemFree(mine[0]));
  gr_thread_run(alloc_256k_elsewhere, unscoped);
  OK(cuMemFree(mine[1]));
  gr_thread_run(alloc_256k_elsewhere, orphan);
  cr_assert_eq(unscoped[0], mine[0], "the simulator handed the scope's freed address out again");
  cr_assert_eq(orphan[0], mine[1]);
  uint64_t live = h_sim(-1, NULL).live_bytes;
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  cr_assert_eq(h_sim(-1, NULL).live_bytes, live - 6 * 256 * 1024, "the scope's 6 live blocks, and only them, freed");
  gpureclaim_block_t b;
  cr_assert(h_find(unscoped[0], &b) && b.state == GPURECLAIM_BLOCK_LIVE, "the unscoped block kept");
  cr_assert(h_find(orphan[0], &b) && b.state == GPURECLAIM_BLOCK_ORPHAN, "the other scope's orphan kept");
  cr_assert(h_find(o, &b) && b.state == GPURECLAIM_BLOCK_ORPHAN, "another scope's orphan kept for a release");
  for (int i = 0; i < 64; i++)
    cr_assert(h_find(outside[i], &b) && b.state == GPURECLAIM_BLOCK_LIVE);
  cr_assert(h_table_matches_sim("free now, own scope only"));
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 2, "the other scopes' orphans, by a release");
  OK(cuMemFree(unscoped[0]));
  for (int i = 0; i < 64; i++)
    OK(cuMemFree(outside[i]));
}

/* Properties of a cuMemCreate on device 0; returns the allocation granularity. */
static size_t vmm_prop(CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  size_t gran = 0;
  OK(cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return gran;
}

/* A cuMemCreate handle abandoned in a scope, which a release then freed. */
static CUmemGenericAllocationHandle released_orphan_handle(void) {
  CUmemAllocationProp prop;
  size_t gran = vmm_prop(&prop);
  uint64_t s = gpureclaim_scope_begin();
  CUmemGenericAllocationHandle h;
  OK(cuMemCreate(&h, gran, &prop, 0));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 1);
  return h;
}

/* A cuMemCreate handle abandoned in a scope and freed by a release: the program's late cuMemRelease returns
 * what it would have returned without gpureclaim (CUDA_SUCCESS), and does not reach the driver. */
Test(release, a_late_cumemrelease_is_swallowed_like_a_late_free) {
  CUmemGenericAllocationHandle h = released_orphan_handle();
  uint64_t late = h_grs(-1).late_frees;
  OK(cuMemRelease(h));
  cr_assert_eq(h_grs(-1).late_frees, late + 1);
  cr_assert(h_table_matches_sim("after the late release"));
  cr_assert_neq(cuMemRelease(h), CUDA_SUCCESS, "a second one is the program's own double release");
}

/* A handle value a release freed can be live again without cuMemCreate (imported, or still referenced through
 * cuMemRetainAllocationHandle): when the driver knows it, cuMemRelease is the program's own and reaches it.
 * The simulator never reuses handle values, so its answer is injected here. */
Test(release, a_cumemrelease_of_a_handle_the_driver_knows_reaches_the_driver) {
  CUmemGenericAllocationHandle h = released_orphan_handle();
  uint64_t late = h_grs(-1).late_frees, calls = simcuda_calls("cuMemRelease");
  cr_assert_eq(simcuda_inject("cuMemGetAllocationPropertiesFromHandle", CUDA_SUCCESS, 1), 0);
  cr_assert_eq(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE, "the driver's answer (it released h already)");
  cr_assert_eq(simcuda_calls("cuMemRelease"), calls + 1, "it reached the driver");
  cr_assert_eq(h_grs(-1).late_frees, late);
}

/* A release frees in rounds of 4,096 blocks (the context lock is held one round at a time). When the driver
 * refuses every free of a round, the release ends there instead of claiming the same blocks again forever;
 * the blocks stay tracked, and the next release frees them. */
Test(release, a_driver_that_refuses_every_free_ends_the_release) {
  uint64_t s = gpureclaim_scope_begin();
  for (int i = 0; i < 5000; i++) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 4096));
  }
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_ERROR_LAUNCH_FAILED, 1 << 30), 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 0);
  cr_assert_eq(r.failed_blocks, 4096, "one round, then it stops");
  cr_assert_eq(h_grs(-1).orphan_blocks, 5000, "all still tracked");
  cr_assert_eq(simcuda_inject("cuMemFree_v2", CUDA_SUCCESS, 0), 0);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, 5000);
  cr_assert_eq(h_grs(-1).orphan_blocks, 0);
  cr_assert(h_table_matches_sim("after the second release"));
}

/* Handle tombstones stay for good when the driver never hands a handle value out again (the simulator does
 * not): more than the addresses' bound of them must not cost a late cuMemFree its tombstone. */
Test(release, many_handle_tombstones_leave_room_for_addresses) {
  CUmemAllocationProp prop;
  size_t gran = vmm_prop(&prop);
  gpureclaim_report_t r = {.size = sizeof r};
  for (int round = 0; round < 5; round++) { /* 5 x 14,000 > 65,536, in rounds the device can hold */
    uint64_t s = gpureclaim_scope_begin();
    for (int i = 0; i < 14000; i++) {
      CUmemGenericAllocationHandle h;
      OK(cuMemCreate(&h, gran, &prop, 0));
    }
    cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
    cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
    cr_assert_eq(r.orphaned_blocks, 14000);
  }
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  uint64_t late = h_grs(-1).late_frees;
  OK(cuMemFree(p));
  cr_assert_eq(h_grs(-1).late_frees, late + 1, "the late free was recognised, not passed to the driver");
}

/* A scope ended from another thread leaves its thread's stack lazily. When its slot is open again, for a scope
 * of another thread, the first thread's blocks must not join that scope (and be freed as its orphans). */
typedef struct {
  uint64_t ended, reopened;
} reuse_t;

static void *end_and_reopen_its_slot(void *arg) {
  reuse_t *r = arg;
  if (gpureclaim_scope_end(r->ended, 0) != 0)
    return NULL;
  for (int i = 0; i < 2 * 65536; i++) {
    uint64_t s = gpureclaim_scope_begin();
    if (!s)
      return NULL;
    if ((s & 0xffff) == (r->ended & 0xffff)) {
      r->reopened = s; /* left open, on this thread's stack */
      return NULL;
    }
    gpureclaim_scope_end(s, 0);
  }
  return NULL;
}

Test(release, a_reused_scope_slot_does_not_adopt_another_threads_blocks) {
  reuse_t r = {.ended = gpureclaim_scope_begin()};
  cr_assert_neq(r.ended, 0);
  gr_thread_run(end_and_reopen_its_slot, &r);
  cr_assert_neq(r.reopened, 0, "the slot is open again, for another scope");
  cr_assert_neq(r.reopened, r.ended);
  cr_assert_eq(gpureclaim_scope_current(), 0, "this thread's scope ended; the slot's new scope is not this thread's");
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  gpureclaim_block_t b;
  cr_assert(h_find(p, &b));
  cr_assert_eq(b.scope, 0, "allocated under no scope");
  cr_assert_eq(gpureclaim_scope_end(r.reopened, 0), 0);
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0, "this thread's live block is no orphan of the other thread's scope");
  cr_assert(h_find(p, &b) && b.state == GPURECLAIM_BLOCK_LIVE);
  OK(cuMemFree(p));
  cr_assert(h_table_matches_sim("after the free"));
}

Test(release, framework_blocks_are_never_orphans) {
  h_fw_alloc_t fw_alloc = h_framework_alloc();
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr mine, theirs;
  OK(cuMemAlloc(&mine, 1 * MiB));
  OK(fw_alloc(&theirs, 2 * MiB));
  gpureclaim_block_t b;
  cr_assert(h_find(theirs, &b));
  cr_assert_str_eq(b.owner, "pytorch");
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  cr_assert(!h_find(mine, &b), "the program's own block was freed");
  cr_assert(h_find(theirs, &b), "the framework's block was not");
  cr_assert_eq(b.state, GPURECLAIM_BLOCK_LIVE);
  cr_assert(h_table_matches_sim("framework block kept"));
}

Test(release, a_late_free_is_swallowed_until_the_address_is_reused) {
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  uint64_t calls = simcuda_calls("cuMemFree_v2");
  cr_assert_eq(cuMemFree(p), CUDA_SUCCESS, "a late free of a reclaimed block succeeds");
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), calls, "and never reaches the driver");
  cr_assert_eq(h_grs(-1).late_frees, 1);
  cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "a second one is the driver's business again");
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), calls + 1);
  cr_assert_eq(h_grs(-1).late_frees, 1);
  /* Reclaim again, let the driver hand the address out, then free: that frees the new block. */
  s = gpureclaim_scope_begin();
  OK(cuMemAlloc(&p, 1 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  CUdeviceptr q;
  OK(cuMemAlloc(&q, 1 * MiB));
  cr_assert_eq(q, p, "the simulator reuses the address (as the driver does)");
  calls = simcuda_calls("cuMemFree_v2");
  OK(cuMemFree(q));
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), calls + 1, "a free of the new block reaches the driver");
  cr_assert_eq(h_grs(-1).late_frees, 1, "and is not a late free");
  cr_assert(h_table_matches_sim("after reuse"));
}

typedef struct {
  CUdeviceptr p;
  _Atomic int go;
  CUresult rc;
} racer_t;

static void *free_racer(void *arg) {
  racer_t *r = arg;
  cuCtxSetCurrent(g_ctx);
  while (!atomic_load(&r->go))
    ;
  r->rc = cuMemFree(r->p);
  return NULL;
}

Test(release, a_release_racing_a_free_frees_once, .timeout = 120) {
  for (int i = 0; i < 300; i++) {
    uint64_t s = gpureclaim_scope_begin();
    racer_t r = {0};
    OK(cuMemAlloc(&r.p, 4096));
    cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
    uint64_t calls = simcuda_calls("cuMemFree_v2");
    pthread_t th;
    th = gr_thread_start(free_racer, &r);
    atomic_store(&r.go, 1);
    gpureclaim_report_t rep = {.size = sizeof rep};
    cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
    gr_thread_join(th);
    cr_assert_eq(r.rc, CUDA_SUCCESS, "iteration %d: the program's free failed (%d)", i, r.rc);
    cr_assert_eq(simcuda_calls("cuMemFree_v2") - calls, 1, "iteration %d: freed twice", i);
    cr_assert_eq(rep.failed_blocks, 0);
  }
  cr_assert(h_table_matches_sim("after the races"));
}

/* A free by the thread that allocated the block (its owner: the table takes the record with a plain store while
 * no other thread writes it) or by another thread, racing a release on a third thread that claims the block as
 * an orphan: the block is freed once, by one of them, and the program's free succeeds either way. */
typedef struct {
  _Atomic int seq, done; /* commands given, commands done */
  int cmd;               /* 1: allocate a block in a scope that ends (an orphan), 2: free it, 3: stop */
  CUdeviceptr p;
  CUresult rc;
} owner_t;

static void *owner_thread(void *arg) {
  owner_t *o = arg;
  cuCtxSetCurrent(g_ctx);
  for (int seen = 0;; seen++) {
    while (atomic_load(&o->seq) == seen)
      ;
    if (o->cmd == 3)
      return NULL;
    if (o->cmd == 1) {
      uint64_t s = gpureclaim_scope_begin();
      o->rc = cuMemAlloc(&o->p, 4096);
      if (gpureclaim_scope_end(s, 0) != 0)
        o->rc = CUDA_ERROR_UNKNOWN;
    } else {
      o->rc = cuMemFree(o->p);
    }
    atomic_fetch_add(&o->done, 1);
  }
}

/* Has the owner's thread run cmd, and waits until it has. */
static void owner_run(owner_t *o, int cmd) {
  int d = atomic_load(&o->done);
  o->cmd = cmd;
  atomic_fetch_add(&o->seq, 1);
  while (cmd != 3 && atomic_load(&o->done) == d)
    ;
}

static void *release_orphans_once(void *arg) { return (void *)(intptr_t)gpureclaim_release(GPURECLAIM_ORPHANED, arg); }

Test(release, frees_by_the_owner_or_another_thread_racing_a_release_free_once, .timeout = 120) {
  owner_t o = {0};
  pthread_t owner = gr_thread_start(owner_thread, &o);
  unsigned released[2] = {0}, freed[2] = {0}; /* [0] the owner frees, [1] another thread: who freed the block */
  /* At least 300 rounds, and on until the release and the free each won against both kinds of free. */
  for (int i = 0; i < 300 || !(released[0] && released[1] && freed[0] && freed[1]); i++) {
    cr_assert_lt(i, 100000, "the release and the frees never overlapped: released %u/%u, freed %u/%u", released[0],
                 released[1], freed[0], freed[1]);
    owner_run(&o, 1);
    cr_assert_eq(o.rc, CUDA_SUCCESS, "iteration %d: the allocation", i);
    uint64_t calls = simcuda_calls("cuMemFree_v2");
    gpureclaim_report_t rep = {.size = sizeof rep};
    pthread_t rel = gr_thread_start(release_orphans_once, &rep);
    int other = i % 2;
    CUresult rc;
    if (!other) {
      owner_run(&o, 2);
      rc = o.rc;
    } else {
      rc = cuMemFree(o.p); /* this thread, not the block's */
    }
    cr_assert_eq((intptr_t)gr_thread_join(rel), 0, "iteration %d: the release failed", i);
    cr_assert_eq(rc, CUDA_SUCCESS, "iteration %d: the program's free failed (%d)", i, rc);
    cr_assert_eq(simcuda_calls("cuMemFree_v2") - calls, 1, "iteration %d: freed %llu times", i,
                 (unsigned long long)(simcuda_calls("cuMemFree_v2") - calls));
    cr_assert_eq(rep.failed_blocks, 0);
    cr_assert_leq(rep.orphaned_blocks, 1);
    released[other] += rep.orphaned_blocks == 1;
    freed[other] += rep.orphaned_blocks == 0;
  }
  owner_run(&o, 3);
  gr_thread_join(owner);
  fprintf(stderr,
          "the release freed the block %u times against the owner's free, %u against another thread's; "
          "the program's free won %u and %u times\n",
          released[0], released[1], freed[0], freed[1]);
  cr_assert(h_table_matches_sim("after the races"));
}

/* The program frees one block from two threads at once, one of them the thread that allocated it: exactly one
 * free succeeds, the other gets the driver's CUDA_ERROR_INVALID_VALUE (both reach the driver), and no record
 * is left for the freed block. */
typedef struct {
  _Atomic int go;
  CUdeviceptr p;
  CUresult rc;
} dfree_t;

static void *double_freer(void *arg) {
  dfree_t *d = arg;
  cuCtxSetCurrent(g_ctx);
  while (!atomic_load(&d->go))
    ;
  d->rc = cuMemFree(d->p);
  return NULL;
}

Test(release, a_double_free_from_two_threads_at_once_frees_once, .timeout = 120) {
  for (int i = 0; i < 2000; i++) {
    dfree_t d = {0};
    OK(cuMemAlloc(&d.p, 4096));
    uint64_t calls = simcuda_calls("cuMemFree_v2");
    pthread_t th = gr_thread_start(double_freer, &d);
    atomic_store(&d.go, 1);
    CUresult mine = cuMemFree(d.p); /* the owner's free */
    gr_thread_join(th);
    cr_assert((mine == CUDA_SUCCESS && d.rc == CUDA_ERROR_INVALID_VALUE) ||
                  (mine == CUDA_ERROR_INVALID_VALUE && d.rc == CUDA_SUCCESS),
              "iteration %d: the owner's free %d, the other thread's %d", i, mine, d.rc);
    cr_assert_eq(simcuda_calls("cuMemFree_v2") - calls, 2, "iteration %d: both reach the driver", i);
    cr_assert_eq(h_count(0), 0,
                 "iteration %d: a record is left for the freed block (the owner's free %d, the other thread's %d)", i,
                 mine, d.rc);
  }
  cr_assert(h_table_matches_sim("after the double frees"));
}

Test(release, all_frees_every_tracked_block_and_context_scoped_all) {
  CUdeviceptr a, b2;
  void *h;
  OK(cuMemAlloc(&a, 1 * MiB));
  OK(cuMemHostAlloc(&h, 4096, 0));
  CUcontext c2, popped;
  OK(cuCtxCreate_v2(&c2, 0, 0));
  OK(cuMemAlloc(&b2, 2 * MiB));
  /* A stream-ordered block on one of c2's streams belongs to c2 (header: gpureclaim_block_t.context). */
  CUstream s2;
  CUdeviceptr as2;
  OK(cuStreamCreate(&s2, 0));
  OK(cuMemAllocAsync(&as2, 64 * 1024, s2));
  OK(cuStreamSynchronize(s2));
  gpureclaim_block_t b;
  cr_assert(h_find(as2, &b));
  cr_assert_eq(b.context, (void *)c2, "a stream-ordered block has its stream's context");
  cr_assert_not_null(b.pool);
  OK(cuCtxPopCurrent(&popped));
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release_context(c2, &r), 0);
  cr_assert_eq(r.all_blocks, 2);
  cr_assert_eq(r.all_bytes, 2 * MiB + 64 * 1024);
  cr_assert(!h_find(as2, &b), "the stream-ordered block of c2 was freed too");
  cr_assert(h_table_matches_sim("context release"));
  cr_assert(h_find(a, &b), "other contexts untouched");
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ALL, &r), 0);
  cr_assert_eq(r.all_blocks, 2);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 0);
  cr_assert_eq(h_sim(-1, NULL).host_blocks, 0);
  cr_assert(h_table_matches_sim("release all"));
  OK(cuCtxPushCurrent(c2));
  OK(cuStreamDestroy(s2));
  OK(cuCtxPopCurrent(&popped));
  OK(cuCtxDestroy(c2));
}

static _Atomic int g_calls;
static size_t give_back_7(void *arg) {
  atomic_fetch_add(&g_calls, 1);
  return (size_t)(uintptr_t)arg;
}

Test(release, releasers) {
  int id = gpureclaim_register_releaser("pool", give_back_7, (void *)(uintptr_t)7000);
  cr_assert_gt(id, 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(r.releaser_bytes, 7000);
  cr_assert_eq(r.cached_bytes, 7000 + r.pool_bytes + r.framework_bytes);
  cr_assert_eq(atomic_load(&g_calls), 1);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(atomic_load(&g_calls), 1, "only releases of cached memory call releasers");
  cr_assert_eq(gpureclaim_unregister_releaser(id), 0);
  cr_assert_eq(gpureclaim_unregister_releaser(id), -ENOENT);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(atomic_load(&g_calls), 1);
  int ids[64];
  for (int i = 0; i < 64; i++)
    cr_assert_gt(ids[i] = gpureclaim_register_releaser("many", give_back_7, NULL), 0);
  cr_assert_eq(gpureclaim_register_releaser("one too many", give_back_7, NULL), -ENOSPC);
  for (int i = 0; i < 64; i++)
    cr_assert_eq(gpureclaim_unregister_releaser(ids[i]), 0);
}

/* A releaser that asks for a release itself would wait for the release that calls it. */
static atomic_int g_nested_rc = 1;
static size_t releases_again(void *arg) {
  (void)arg;
  gpureclaim_report_t r = {.size = sizeof r};
  atomic_store(&g_nested_rc, gpureclaim_release(GPURECLAIM_CACHED, &r));
  return 5;
}

/* No .timeout: a hang is caught by ctest's. (Two Criterion timeouts running at once leak 48 bytes in its
 * runner, which LeakSanitizer reports.) */
Test(release, a_releaser_that_releases_gets_edeadlk) {
  int id = gpureclaim_register_releaser("nested", releases_again, NULL);
  cr_assert_gt(id, 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(atomic_load(&g_nested_rc), -EDEADLK);
  cr_assert_eq(r.releaser_bytes, 5);
  /* The engine is not stuck: the next release runs (and the releaser is refused again). */
  atomic_store(&g_nested_rc, 1);
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(atomic_load(&g_nested_rc), -EDEADLK);
  cr_assert_eq(gpureclaim_unregister_releaser(id), 0);
}

#define NREQ 16
static atomic_int g_req_tids[NREQ], g_req_n, g_gate_calls;

/* Whether thread tid is blocked in a futex wait (on the engine's lock or condition variable). */
static int in_futex_wait(int tid) {
  char p[64];
  long nr = -1;
  snprintf(p, sizeof p, "/proc/self/task/%d/syscall", tid);
  FILE *f = fopen(p, "r");
  if (f) {
    if (fscanf(f, "%ld", &nr) != 1)
      nr = -1;
    fclose(f);
  }
  return nr == SYS_futex;
}

/* The first release holds until every other requester waits inside gpureclaim_release: then, whatever the
 * scheduling, one more release serves those that took a ticket and at most one after it those that were still
 * queued for the lock (a sleep here made the bound depend on how fast 16 threads start). */
static size_t gate_releaser(void *arg) {
  (void)arg;
  if (atomic_fetch_add(&g_gate_calls, 1) != 0)
    return 1;
  int me = (int)syscall(SYS_gettid), waiting = 0;
  for (int spins = 0; waiting < NREQ - 1; spins++) {
    cr_assert_lt(spins, 600000, "the other requesters never waited (%d of %d)", waiting, NREQ - 1);
    usleep(100);
    waiting = 0;
    if (atomic_load(&g_req_n) < NREQ)
      continue;
    for (int i = 0; i < NREQ; i++) {
      int t = atomic_load(&g_req_tids[i]);
      waiting += t != me && in_futex_wait(t);
    }
  }
  return 1;
}

static void *release_thread(void *arg) {
  atomic_store(&g_req_tids[(intptr_t)arg], (int)syscall(SYS_gettid));
  atomic_fetch_add(&g_req_n, 1);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  return NULL;
}

Test(release, concurrent_requests_coalesce) {
  cr_assert_gt(gpureclaim_register_releaser("gate", gate_releaser, NULL), 0);
  pthread_t th[NREQ];
  for (int i = 0; i < NREQ; i++)
    th[i] = gr_thread_start(release_thread, (void *)(intptr_t)i);
  for (int i = 0; i < NREQ; i++)
    gr_thread_join(th[i]);
  uint64_t n = h_grs(-1).releases;
  cr_assert_geq(n, 1);
  cr_assert_leq(n, 3, "16 concurrent requests ran %llu releases", (unsigned long long)n);
}

static int g_inner_rc = 1;
static size_t reentrant_releaser(void *arg) {
  (void)arg;
  gpureclaim_report_t r = {.size = sizeof r};
  g_inner_rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
  return 0;
}

Test(release, out_of_memory_retry_after_a_trim) {
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep = UINT64_MAX;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  simcuda_set_capacity(0, 100 * MiB);
  CUdeviceptr a, b;
  OK(cuMemAllocAsync(&a, 80 * MiB, NULL));
  OK(cuMemFreeAsync(a, NULL)); /* 80 MiB cached in the pool */
  int id = gpureclaim_register_releaser("reentrant", reentrant_releaser, NULL);
  OK(cuMemAlloc(&b, 50 * MiB)); /* fits only after the pool is trimmed */
  gpureclaim_stats_t s = h_grs(-1);
  cr_assert_eq(s.oom_retries, 1);
  cr_assert_eq(s.oom_retry_successes, 1);
  cr_assert_eq(g_inner_rc, -EDEADLK, "a release requested from inside an allocation is refused");
  gpureclaim_unregister_releaser(id);
  CUdeviceptr c = 0;
  cr_assert_eq(cuMemAlloc(&c, 200 * MiB), CUDA_ERROR_OUT_OF_MEMORY, "what never fits fails with the driver's code");
  cr_assert_eq(c, 0);
  cr_assert(h_table_matches_sim("after the retries"));
}

/* The documented bound: 65,536 reclaimed addresses are remembered at a time. A block reclaimed beyond it leaves
 * no tombstone, and its late free reaches the driver. */
Test(release, late_frees_are_recognised_for_65536_addresses_at_a_time, .timeout = 120) {
  enum { BOUND = 65536 };
  static CUdeviceptr p[BOUND + 1];
  uint64_t s = gpureclaim_scope_begin();
  for (int i = 0; i <= BOUND; i++)
    OK(cuMemAlloc(&p[i], 512));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, BOUND + 1);
  uint64_t late = h_grs(-1).late_frees, calls = simcuda_calls("cuMemFree_v2");
  int refused = 0;
  for (int i = 0; i <= BOUND; i++)
    refused += cuMemFree(p[i]) != CUDA_SUCCESS;
  cr_assert_eq(h_grs(-1).late_frees - late, BOUND, "each remembered address swallowed one late free");
  cr_assert_eq(simcuda_calls("cuMemFree_v2") - calls, 1, "the one past the bound reached the driver");
  cr_assert_eq(refused, 1, "which refused it (the block was freed)");
}

/* At scale, every step checked against the driver's own count: blocks that go up and down (20,000 live, more
 * than a thread's log of young records holds, so their records pass through the table too), six times, newest
 * or oldest freed first; then one release of 100,000 orphans, more than the 65,536 tombstones a release keeps
 * (the size at which a release slowed down by orders of magnitude, its rounds visiting the whole table again
 * and its tombstones crowding a shrunken generation), and allocations that get those addresses back. */
Test(release, an_oscillation_and_a_release_of_100000_orphans_agree_with_the_driver, .timeout = 120) {
  enum { K = 20000, N = 100000 };
  static CUdeviceptr p[N];
  uint64_t base = h_sim(-1, NULL).live_blocks, grbase = h_grs(-1).live_blocks;
  for (int c = 0; c < 6; c++) {
    for (int i = 0; i < K; i++)
      OK(cuMemAlloc(&p[i], 512));
    cr_assert_eq(h_grs(-1).live_blocks - grbase, K, "cycle %d: gpureclaim counts %llu blocks", c,
                 (unsigned long long)(h_grs(-1).live_blocks - grbase));
    cr_assert_eq(h_sim(-1, NULL).live_blocks - base, K);
    if (c == 5)
      cr_assert(h_table_matches_sim("the oscillation's last peak"));
    for (int i = 0; i < K; i++)
      OK(cuMemFree(p[c & 1 ? i : K - 1 - i]));
    cr_assert_eq(h_grs(-1).live_blocks, grbase, "cycle %d: blocks left after freeing all", c);
    cr_assert_eq(h_sim(-1, NULL).live_blocks, base);
  }
  uint64_t s = gpureclaim_scope_begin();
  for (int i = 0; i < N; i++)
    OK(cuMemAlloc(&p[i], 512));
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, N);
  gpureclaim_report_t r = {.size = sizeof r};
  uint64_t late = h_grs(-1).late_frees;
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &r), 0);
  cr_assert_eq(r.orphaned_blocks, N, "the release reported %llu of %d orphans", (unsigned long long)r.orphaned_blocks,
               N);
  cr_assert_eq(r.failed_blocks, 0);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, base, "the driver still holds blocks the release reported freed");
  cr_assert_eq(h_grs(-1).orphan_blocks, 0);
  cr_assert_eq(h_grs(-1).live_blocks, grbase);
  cr_assert(h_table_matches_sim("releasing 100,000 orphans"));
  /* The driver hands the freed addresses out again: each allocation replaces its address's tombstone, and a
   * late free of a released block that no allocation got back is still swallowed. */
  for (int i = 0; i < K; i++)
    OK(cuMemAlloc(&p[i], 512));
  cr_assert(h_table_matches_sim("allocating over the tombstones"));
  for (int i = 0; i < K; i++)
    OK(cuMemFree(p[i]));
  cr_assert_eq(h_sim(-1, NULL).live_blocks, base);
  cr_assert_eq(h_grs(-1).late_frees, late, "a free of a new block passed as a late free");
}
