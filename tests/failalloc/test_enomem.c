/*
 * gpureclaim when its own memory runs out (malloc, calloc, realloc, aligned_alloc and mmap of the library fail
 * on demand: failalloc.c). What must hold, as documented: every CUDA call still returns the driver's result;
 * a block gpureclaim has no room for goes untracked (with one warning) and its free passes to the driver; the
 * API returns -ENOMEM where it needed memory; nothing crashes and no live memory is freed. Each test proves the
 * failures happened (a count of failed calls) and that the library was the one preloaded.
 */
#include "failalloc.h"
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)

/* ---- the plan: which kinds fail, after how many calls let through, and in which thread ---- */

static atomic_uint g_mask;
static atomic_long g_skip, g_failed, g_limit; /* g_limit: failures left (negative: no limit) */
static atomic_int g_one_thread;
static _Thread_local int t_target;

int gr_failalloc_fail(int what, size_t bytes);
__attribute__((visibility("default"))) int gr_failalloc_fail(int what, size_t bytes) {
  (void)bytes;
  if (!(atomic_load(&g_mask) & (1u << what)) || (atomic_load(&g_one_thread) && !t_target))
    return 0;
  if (atomic_fetch_sub(&g_skip, 1) > 0)
    return 0;
  long left = atomic_load(&g_limit);
  while (left > 0 && !atomic_compare_exchange_weak(&g_limit, &left, left - 1))
    ;
  if (left == 0)
    return 0; /* as many failures as asked for */
  atomic_fetch_add(&g_failed, 1);
  return 1;
}

#define ALL_KINDS ((1u << FA_KINDS) - 1)
static void arm_n(unsigned mask, long n) {
  atomic_store(&g_failed, 0);
  atomic_store(&g_skip, 0);
  atomic_store(&g_limit, n);
  atomic_store(&g_mask, mask);
}
static void arm(unsigned mask) { arm_n(mask, -1); }
/* The first `skip` calls of the kinds in mask pass, then n fail (negative: every one after). */
static void arm_after(unsigned mask, long skip, long n) {
  arm_n(mask, n);
  atomic_store(&g_skip, skip);
}
static long disarm(void) {
  atomic_store(&g_mask, 0);
  return atomic_load(&g_failed);
}

/* ---- helpers ---- */

static CUcontext g_ctx;
static char g_err[256];

static void init(void) {
  void *lib = dlopen("libgpureclaim_failalloc.so", RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib, "libgpureclaim_failalloc.so is not the preloaded library");
  cr_assert_eq(gpureclaim_enabled(), 1);
  CUdevice dev;
  OK(cuInit(0));
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
  OK(cuCtxSetCurrent(g_ctx));
  CUdeviceptr p; /* the table exists and this thread is registered before anything fails */
  OK(cuMemAlloc(&p, 4096));
  OK(cuMemFree(p));
  /* The library's warnings go to stderr: keep them to read. */
  snprintf(g_err, sizeof g_err, "%s/stderr.%d", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  int fd = open(g_err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_geq(dup2(fd, STDERR_FILENO), 0);
  close(fd);
}

TestSuite(enomem, .init = init);

static bool warned(const char *text) {
  static char buf[1 << 16];
  FILE *f = fopen(g_err, "r");
  cr_assert_not_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strstr(buf, text) != NULL;
}

/* ---- the table cannot grow ---- */

#define NBLK 3000 /* well past the first generation's 1024 slots */

Test(enomem, a_table_that_cannot_grow_leaves_new_blocks_untracked, .timeout = 120) {
  static CUdeviceptr p[NBLK];
  arm(1u << FA_MMAP);
  for (int i = 0; i < NBLK; i++)
    OK(cuMemAlloc(&p[i], 4096));
  long failed = disarm();
  cr_assert_gt(failed, 0, "no mmap failed: the growth was never attempted");
  gpureclaim_stats_t g = h_grs(-1);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, NBLK, "every allocation is the driver's");
  cr_assert_gt(g.live_blocks, 0);
  cr_assert_lt(g.live_blocks, NBLK, "without memory for a larger table some blocks go untracked");
  cr_assert(warned("no memory for the block table"), "the loss of tracking is said");
  uint64_t tracked = g.live_blocks;
  /* A release frees nothing live: these blocks belong to no ended scope. */
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, NBLK);
  /* Memory back: the table grows and tracks new blocks again. */
  CUdeviceptr q[NBLK];
  for (int i = 0; i < NBLK; i++)
    OK(cuMemAlloc(&q[i], 4096));
  cr_assert_eq(h_grs(-1).live_blocks, tracked + NBLK);
  /* Every free reaches the driver, tracked or not. */
  uint64_t untracked0 = h_grs(-1).untracked_frees;
  for (int i = 0; i < NBLK; i++) {
    OK(cuMemFree(p[i]));
    OK(cuMemFree(q[i]));
  }
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 0);
  cr_assert_eq(h_grs(-1).live_blocks, 0);
  cr_assert_eq(h_grs(-1).untracked_frees - untracked0, NBLK - tracked);
  cr_assert(h_table_matches_sim("after the frees"));
}

/* ---- a thread that cannot register ---- */

static void *alloc_in_new_thread(void *arg) {
  CUdeviceptr *p = arg;
  t_target = 1;
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || cuMemAlloc(&p[0], 1 << 20) != CUDA_SUCCESS ||
      cuMemAlloc(&p[1], 8192) != CUDA_SUCCESS || cuMemFree(p[1]) != CUDA_SUCCESS)
    p[0] = 0;
  return NULL;
}

Test(enomem, a_thread_whose_every_allocation_fails_still_allocates_and_is_tracked) {
  CUdeviceptr p[2] = {0, 0};
  atomic_store(&g_one_thread, 1);
  arm(ALL_KINDS);
  gr_thread_run(alloc_in_new_thread, p);
  long failed = disarm();
  cr_assert_neq(p[0], 0, "a CUDA call failed in the thread");
  cr_assert_gt(failed, 0, "nothing the library allocated for the new thread failed");
  gpureclaim_block_t b;
  cr_assert(h_find(p[0], &b), "the block is tracked all the same");
  cr_assert(h_table_matches_sim("after the thread"));
  OK(cuMemFree(p[0]));
  cr_assert(h_table_matches_sim("after the free"));
}

/* ---- reports ---- */

Test(enomem, snapshot_and_leak_report_return_enomem_and_write_nothing) {
  CUdeviceptr p[64];
  for (int i = 0; i < 64; i++)
    OK(cuMemAlloc(&p[i], 4096));
  char snap[512], leaks[512];
  snprintf(snap, sizeof snap, "%s/snapshot.json", getenv("GPURECLAIM_RUNDIR"));
  snprintf(leaks, sizeof leaks, "%s/leaks.json", getenv("GPURECLAIM_RUNDIR"));
  unsigned kinds[] = {1u << FA_MALLOC, 1u << FA_CALLOC, 1u << FA_REALLOC, ALL_KINDS};
  long failed = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    unlink(snap);
    unlink(leaks);
    arm(kinds[k]);
    int rs = gpureclaim_snapshot(snap), rl = gpureclaim_leak_report(leaks, 1);
    long f = disarm();
    failed += f;
    printf("kinds %#x: %ld calls failed; snapshot %d, leak report %d\n", kinds[k], f, rs, rl);
    if (f == 0) /* this kind is not one the reports use */
      continue;
    cr_assert(rs == -ENOMEM || rs == 0, "snapshot: %d", rs);
    cr_assert(rl == -ENOMEM || rl == 0, "leak report: %d", rl);
    cr_assert(rs == -ENOMEM || rl == -ENOMEM, "a failed allocation made no report fail (kinds %#x)", kinds[k]);
    struct stat st;
    cr_assert(rs == 0 || stat(snap, &st) != 0, "a failed snapshot left a file");
    cr_assert(rl == 0 || stat(leaks, &st) != 0, "a failed leak report left a file");
  }
  cr_assert_gt(failed, 0, "the reports allocated nothing that could fail");
  /* One failure only, the first realloc (the leak report's list of groups, before any output): the report
   * must not come out complete-looking and empty. */
  unlink(leaks);
  arm_n(1u << FA_REALLOC, 1);
  int rl = gpureclaim_leak_report(leaks, 1);
  cr_assert_eq(disarm(), 1);
  cr_assert_eq(rl, -ENOMEM, "a leak report missing its blocks was written as complete");
  struct stat st;
  cr_assert_neq(stat(leaks, &st), 0, "a failed leak report left a file");
  cr_assert_eq(gpureclaim_snapshot(snap), 0, "memory back: the snapshot works");
  cr_assert_eq(gpureclaim_leak_report(leaks, 1), 0);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 64);
  for (int i = 0; i < 64; i++)
    OK(cuMemFree(p[i]));
}

/* ---- a context destroyed while no memory can be had ---- */

/* A destroy marks its context's records in place (track.c): it must need no memory, so that a process short of
 * it still drops every record of a destroyed context (a record left behind would later be freed as an orphan at
 * an address the driver gave to someone else). */
Test(enomem, a_context_destroyed_while_no_memory_can_be_had_drops_its_records) {
  CUdevice dev;
  CUcontext c;
  OK(cuDeviceGet(&dev, 0));
  OK(cuCtxCreate_v2(&c, 0, dev));
  for (int i = 0; i < 300; i++) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 4096));
  }
  uint64_t gone0 = h_grs(-1).ctx_destroyed_blocks;
  arm(1u << FA_REALLOC | 1u << FA_MALLOC | 1u << FA_CALLOC);
  OK(cuCtxDestroy(c));
  long failed = disarm();
  cr_assert_eq(failed, 0, "the destroy asked for memory (%ld allocations refused)", failed);
  cr_assert_eq(h_grs(-1).ctx_destroyed_blocks - gone0, 300, "every block of the context counted as gone with it");
  cr_assert(h_table_matches_sim("after cuCtxDestroy"));
  OK(cuCtxSetCurrent(g_ctx));
}

/* ---- a release that cannot grow its list of claimed blocks ---- */

Test(enomem, a_release_without_memory_frees_no_live_block_and_ends, .timeout = 120) {
  CUdeviceptr live;
  OK(cuMemAlloc(&live, 1 << 20));
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  for (int i = 0; i < 500; i++) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 4096));
  }
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 500);
  arm(1u << FA_REALLOC | 1u << FA_MALLOC | 1u << FA_CALLOC);
  gpureclaim_report_t rep = {.size = sizeof rep};
  int rc = gpureclaim_release(GPURECLAIM_ORPHANED, &rep);
  long failed = disarm();
  cr_assert_gt(failed, 0, "the release allocated nothing that could fail");
  cr_assert(rc == 0 || rc == -ENOMEM, "release: %d", rc);
  gpureclaim_block_t b;
  cr_assert(h_find(live, &b), "the live block is still tracked");
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 1 + h_grs(-1).orphan_blocks, "only orphans were freed");
  cr_assert(h_table_matches_sim("after the release"));
  /* Memory back: the rest goes. */
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 0);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 1);
  OK(cuMemFree(live));
}

/* The release's list of claimed blocks gets its first 256 and then cannot grow: a round claims what fits, frees
 * it, and the next round claims the rest (release.c, claim_room), so one release still frees every orphan. The
 * rounds go on where the last one's visit stopped: one that went on past the blocks it had no room for, instead
 * of stopping there, left the next round nothing to claim (256 of 600 freed, and with a single refused realloc
 * the block it happened at was left behind). */
static void release_orphans_with_a_list_that_cannot_grow(long failures) {
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  for (int i = 0; i < 600; i++) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 4096));
  }
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 600);
  arm_after(1u << FA_REALLOC, 1, failures); /* the list's first realloc (none to 256) passes */
  gpureclaim_report_t rep = {.size = sizeof rep};
  int rc = gpureclaim_release(GPURECLAIM_ORPHANED, &rep);
  long failed = disarm();
  cr_assert_gt(failed, 0, "the release's list never failed to grow");
  cr_assert_eq(rc, 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 0, "%llu of 600 orphans left after the release (%ld reallocs refused)",
               (unsigned long long)h_grs(-1).orphan_blocks, failed);
  cr_assert_eq(rep.orphaned_blocks, 600);
  cr_assert_eq(h_sim(-1, NULL).live_blocks, 0);
  cr_assert(h_table_matches_sim("after the release"));
}

Test(enomem, a_release_whose_list_cannot_grow_frees_every_orphan_in_rounds, .timeout = 120) {
  release_orphans_with_a_list_that_cannot_grow(-1);
}

Test(enomem, a_release_whose_list_once_failed_to_grow_frees_every_orphan, .timeout = 120) {
  release_orphans_with_a_list_that_cannot_grow(1);
}
