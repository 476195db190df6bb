/* Scopes with GPURECLAIM_BACKTRACE=1 (set by CMake for this test): a record's site then holds a stack id, not a
 * code address, and the owner of a block must still be found from the code address (src/track/stacks.c). A
 * framework's block that became an orphan would be freed by the next release while the framework uses it. */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)

static void init(void) { (void)h_cuda_start(0); }

TestSuite(scope_backtrace, .init = init);

/* The text leak report of this process now. */
static char *leak_report(void) {
  char path[] = "/tmp/gr_scope_bt_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(gpureclaim_leak_report(path, 0), 0);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  static char out[1 << 16];
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  fclose(f);
  unlink(path);
  return out;
}

Test(scope_backtrace, backtraces_are_on) {
  cr_assert(gpureclaim_enabled(), "libgpureclaim.so is preloaded");
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 1 * MiB));
  const char *out = leak_report();
  /* Without backtraces a group lists one frame (the call site); with them its callers too. */
  cr_assert_not_null(strstr(out, "    #1 0x"), "the leak report shows recorded stacks:\n%s", out);
  OK(cuMemFree(p));
}

Test(scope_backtrace, framework_blocks_are_never_orphans) {
  h_fw_alloc_t fw_alloc = h_framework_alloc();
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  CUdeviceptr mine, theirs;
  OK(cuMemAlloc(&mine, 1 * MiB));
  OK(fw_alloc(&theirs, 2 * MiB));
  gpureclaim_block_t b;
  cr_assert(h_find(theirs, &b));
  cr_assert_str_eq(b.owner, "pytorch");
  cr_assert_eq(b.scope, s, "allocated inside the scope");
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert(h_find(mine, &b) && b.state == GPURECLAIM_BLOCK_ORPHAN, "the program's own block is an orphan");
  cr_assert(h_find(theirs, &b), "the framework's block is tracked");
  cr_assert_eq(b.state, GPURECLAIM_BLOCK_LIVE, "and stays live: the framework owns it");
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 1, "the release frees the program's block only");
  cr_assert(!h_find(mine, &b));
  cr_assert(h_find(theirs, &b) && b.state == GPURECLAIM_BLOCK_LIVE, "the framework's block was not freed");
  cr_assert(h_table_matches_sim("framework block kept"));
  OK(cuMemFree(theirs));
}

Test(scope_backtrace, free_now_leaves_framework_blocks) {
  h_fw_alloc_t fw_alloc = h_framework_alloc();
  uint64_t s = gpureclaim_scope_begin();
  CUdeviceptr mine, theirs;
  OK(cuMemAlloc(&mine, 1 * MiB));
  OK(fw_alloc(&theirs, 2 * MiB));
  cr_assert_eq(gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW), 0);
  gpureclaim_block_t b;
  cr_assert(!h_find(mine, &b), "the program's own block was freed");
  cr_assert(h_find(theirs, &b) && b.state == GPURECLAIM_BLOCK_LIVE, "the framework's block was not");
  cr_assert(h_table_matches_sim("framework block kept"));
  OK(cuMemFree(theirs));
}
