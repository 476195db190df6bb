/* The leak report (src/report/leaks.c) and the snapshot (src/report/snapshot.c), read back as JSON: blocks
 * tracked through the track API are counted by device and grouped by site, largest group first; freed blocks
 * and an empty table give an empty report. Each test runs in a process of its own, with a fresh table. */
#include "gpureclaim_internal.h"
#include "json.h"
#include "jsonread.h"
#include "report.h"

#include <criterion/criterion.h>
#include <string.h>

#define MiB (UINT64_C(1) << 20)

static void setup(void) {
  cr_assert_eq(gr_table_init(), 0);
  atomic_store(&gr_state_run, 1);
}

TestSuite(leaks, .init = setup);

static void track(uint64_t addr, uint64_t size, int device, uintptr_t ra) {
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, addr, size, 0, ra);
  r.device = (uint8_t)device;
  gr_track_insert(&r);
}

static jnode_t *leaks_json(void) {
  jbuf_t b;
  jb_init(&b);
  cr_assert_eq(gr_report_leaks(&b, true), 0);
  const char *err = NULL;
  jnode_t *j = jparse_object(b.p, &err);
  cr_assert_not_null(j, "the leak report is not a JSON object (%s): %s", err, b.p);
  jb_free(&b);
  return j;
}

static const jnode_t *device_entry(const jnode_t *devs, int d) {
  for (size_t i = 0; devs && i < devs->n; i++)
    if (jint(&devs->kids[i], "device", -2) == d)
      return &devs->kids[i];
  return NULL;
}

Test(leaks, an_empty_table_reports_no_block) {
  jnode_t *j = leaks_json();
  cr_assert_eq(jint(j, "blocks", -1), 0);
  cr_assert_eq(jint(j, "bytes", -1), 0);
  cr_assert_eq(jget(j, "devices")->n, 0);
  cr_assert_eq(jget(j, "groups")->n, 0);
  jdelete(j);
  jbuf_t b;
  jb_init(&b);
  cr_assert_eq(gr_report_leaks(&b, false), 0);
  cr_assert(strstr(b.p, "0 blocks") && strstr(b.p, "(every block was freed)"), "%s", b.p);
  jb_free(&b);
}

Test(leaks, blocks_are_counted_by_device_and_grouped_largest_first) {
  track(0x7f0000100000ull, 1 * MiB, 0, 0x1000);
  track(0x7f0000200000ull, 1 * MiB, 0, 0x1000);
  track(0x7f0000300000ull, 5 * MiB, 1, 0x2000);
  track(0x7f0000900000ull, 2 * MiB, 0, 0x3000);
  /* one freed: not a leak */
  gr_rec_t taken;
  cr_assert_eq(gr_track_take(GR_KS_ADDR, 0x7f0000900000ull, ~0u, &taken), 1);
  gr_track_freed(&taken);
  jnode_t *j = leaks_json();
  cr_assert_eq(jint(j, "blocks", -1), 3);
  cr_assert_eq(jint(j, "bytes", -1), (int64_t)(7 * MiB));
  const jnode_t *devs = jget(j, "devices");
  cr_assert_eq(devs->n, 2);
  const jnode_t *d0 = device_entry(devs, 0), *d1 = device_entry(devs, 1);
  cr_assert(d0 && d1, "a device is missing");
  cr_assert_eq(jint(d0, "blocks", -1), 2);
  cr_assert_eq(jint(d0, "bytes", -1), (int64_t)(2 * MiB));
  cr_assert_eq(jint(d1, "blocks", -1), 1);
  cr_assert_eq(jint(d1, "bytes", -1), (int64_t)(5 * MiB));
  const jnode_t *g = jget(j, "groups");
  cr_assert_geq(g->n, 1);
  int64_t sum = 0, prev = INT64_MAX, blocks = 0;
  for (size_t i = 0; i < g->n; i++) {
    int64_t by = jint(&g->kids[i], "bytes", -1);
    cr_assert_leq(by, prev, "group %zu is larger than the one before it", i);
    prev = by;
    sum += by;
    blocks += jint(&g->kids[i], "blocks", 0);
    cr_assert_str_eq(jstr(&g->kids[i], "kind", ""), gr_kind_name(GPURECLAIM_KIND_DEVICE));
  }
  cr_assert_eq(sum, (int64_t)(7 * MiB), "the groups do not add up to the total");
  cr_assert_eq(blocks, 3);
  cr_assert_eq(jint(&g->kids[0], "bytes", -1), (int64_t)(5 * MiB), "the largest group is not first");
  jdelete(j);
}

Test(leaks, many_blocks_are_all_counted) {
  enum { N = 5000 };
  for (int i = 0; i < N; i++)
    track(0x7f1000000000ull + (uint64_t)i * 0x1000, 4096, i % 3, 0x1000 + (uintptr_t)(i % 40) * 0x10);
  jnode_t *j = leaks_json();
  cr_assert_eq(jint(j, "blocks", -1), N);
  cr_assert_eq(jint(j, "bytes", -1), (int64_t)N * 4096);
  int64_t blocks = 0;
  const jnode_t *g = jget(j, "groups");
  for (size_t i = 0; i < g->n; i++)
    blocks += jint(&g->kids[i], "blocks", 0);
  cr_assert_eq(blocks, N);
  const jnode_t *d2 = device_entry(jget(j, "devices"), 2);
  cr_assert(d2 && jint(d2, "blocks", -1) == N / 3, "device 2's blocks");
  jdelete(j);
}

Test(leaks, a_snapshot_lists_every_live_block) {
  track(0x7f0000100000ull, 3 * MiB, 0, 0x1000);
  track(0x7f0000400000ull, 1 * MiB, 1, 0x2000);
  jbuf_t b;
  jb_init(&b);
  cr_assert_eq(gr_report_snapshot_json(&b), 0);
  const char *err = NULL;
  jnode_t *j = jparse_object(b.p, &err);
  cr_assert_not_null(j, "the snapshot is not a JSON object (%s): %s", err, b.p);
  cr_assert_eq(jint(j, "pid", -1), getpid());
  const jnode_t *bl = jget(j, "blocks");
  cr_assert(bl && bl->type == JN_ARR && bl->n == 2, "blocks: %s", b.p);
  for (size_t i = 0; i < bl->n; i++) {
    uint64_t a = jhex(&bl->kids[i], "address", 0);
    int64_t by = jint(&bl->kids[i], "bytes", -1), dev = jint(&bl->kids[i], "device", -1);
    cr_assert((a == 0x7f0000100000ull && by == (int64_t)(3 * MiB) && dev == 0) ||
                  (a == 0x7f0000400000ull && by == (int64_t)MiB && dev == 1),
              "block %zu: %#llx %lld bytes on device %lld", i, (unsigned long long)a, (long long)by, (long long)dev);
    cr_assert_str_eq(jstr(&bl->kids[i], "state", ""), gr_block_state_name(GPURECLAIM_BLOCK_LIVE));
  }
  const jnode_t *tot = jget(j, "total");
  cr_assert_not_null(tot);
  cr_assert_eq(jint(tot, "live_blocks", -1), 2);
  cr_assert_eq(jint(tot, "live_bytes", -1), (int64_t)(4 * MiB));
  jdelete(j);
  jb_free(&b);
}
