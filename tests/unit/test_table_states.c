/* The table's state moves (table.c, k_moves), checked in the debug build: a record moves only along the paths a
 * block's life takes, and an edit that breaks them aborts. table.c is compiled in here with the checks on, whatever
 * the build, so that this test runs in every configuration (as test_assert.c does for track.c and scope.c). */
#define GR_DEBUG 1
#include "../../src/table/table.c"
#include "../../src/table/young.c"
#include "gpureclaim.h"

#include <criterion/criterion.h>
#include <signal.h>

static bool to_state(gr_rec_t *r, void *arg) {
  r->state = *(const uint8_t *)arg;
  return true;
}

static void insert_live(uint64_t key) {
  cr_assert_eq(gr_table_init(), 0);
  gr_rec_t r = {.key = key, .size = 64, .state = GR_ST_LIVE, .kind = GPURECLAIM_KIND_DEVICE, .device = 0};
  cr_assert_eq(gr_table_insert(&r), 0);
}

static int move(uint64_t key, uint8_t to) {
  gr_rec_t before;
  return gr_table_update(GR_KS_ADDR, key, GR_PRESENT_MASK, to_state, &to, &before);
}

Test(assert, a_release_s_path_through_the_states_passes) {
  insert_live(0x1000);
  cr_assert_eq(move(0x1000, GR_ST_ORPHAN), 0);
  cr_assert_eq(move(0x1000, GR_ST_RECLAIMING), 0);
  cr_assert_eq(move(0x1000, GR_ST_ORPHAN), 0, "a release the driver refused gives the block back");
  cr_assert_eq(move(0x1000, GR_ST_RECLAIMING), 0);
  cr_assert_eq(move(0x1000, GR_ST_RECLAIMED), 0);
  cr_assert_eq(move(0x1000, GR_ST_DELETED), 0, "a late free takes the tombstone");
  cr_assert_eq(gr_table_check(), 0);
}

Test(assert, a_block_freed_by_a_release_without_claiming_it_first_aborts, .signal = SIGABRT) {
  insert_live(0x2000);
  move(0x2000, GR_ST_RECLAIMED);
}

Test(assert, a_tombstone_made_live_again_aborts, .signal = SIGABRT) {
  insert_live(0x3000);
  cr_assert_eq(move(0x3000, GR_ST_RECLAIMING), 0);
  cr_assert_eq(move(0x3000, GR_ST_RECLAIMED), 0);
  move(0x3000, GR_ST_LIVE);
}

Test(assert, a_record_inserted_in_a_state_the_program_does_not_own_aborts, .signal = SIGABRT) {
  cr_assert_eq(gr_table_init(), 0);
  gr_rec_t r = {.key = 0x4000, .size = 64, .state = GR_ST_RECLAIMING, .kind = GPURECLAIM_KIND_DEVICE};
  gr_table_insert(&r);
}
