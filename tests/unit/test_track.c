/* track.c's context-destroy rules, compiled in here (as tests/unit/test_scope.c does with scope.c) so that a
 * context destroy can be placed exactly between two of a thread's steps. Each step placed is one the real
 * scheduler can produce: the destroy runs on another thread, holding the gate, while this thread is between
 * its check of the destroy sequence and its table insert. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <errno.h>

static int hooked_insert(const gr_rec_t *r);
#define gr_table_insert hooked_insert
#include "../../src/track.c"
#undef gr_table_insert

#define CTX_A 5
#define X 0x7f0000100000ull

static int g_destroy_before_insert; /* one-shot: a complete, successful destroy of CTX_A before the insert */

static void destroy_a(void) {
  gr_detached_t d = {0};
  gr_rel_gate_enter();
  gr_track_ctx_detach(CTX_A, &d); /* the marking visit: this thread's record is not in the table yet */
  /* the driver destroys A and frees X here; it may hand X out again at once */
  gr_track_ctx_commit(&d, true);
  gr_rel_gate_exit();
}

static void fill(gr_rec_t *r, uint16_t ctx) {
  gr_track_fill(r, GPURECLAIM_KIND_DEVICE, X, 1 << 20, 0, (uintptr_t)0x1234);
  r->ctx_id = ctx;
  r->device = 0;
}

static int hooked_insert(const gr_rec_t *r) {
  if (g_destroy_before_insert) {
    g_destroy_before_insert = 0;
    destroy_a();
  }
  return gr_table_insert(r);
}

static int records_at_x(gr_rec_t *out) {
  return gr_table_lookup(GR_KS_ADDR, X, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), out) == 0;
}

static void setup(void) {
  cr_assert_eq(gr_table_init(), 0);
  atomic_store(&gr_core_state, 1);
}

TestSuite(track, .init = setup);

/* A new block's record: the sequence is read again after the insert, and the record dropped. */
Test(track, insert_ctx_drops_a_record_whose_context_a_destroy_took_before_its_insert) {
  gr_rec_t r;
  fill(&r, CTX_A);
  uint64_t seq0 = gr_track_ctx_seq(); /* read before the driver call that returned X */
  g_destroy_before_insert = 1;
  gr_track_insert_ctx(&r, seq0);
  gr_rec_t left;
  cr_assert_not(records_at_x(&left), "a record stayed for X, which the destroy freed");
}

/* A refused free's record going back: a destroy that begins after the check before the insert, and marks the
 * table before the record is back in it, must not leave it there for a block the destroy freed. */
Test(track, restore_ctx_puts_back_a_record_whose_context_a_destroy_took_before_the_insert) {
  gr_rec_t r;
  fill(&r, CTX_A);
  gr_track_insert_ctx(&r, gr_track_ctx_seq());
  uint64_t seq0 = gr_track_ctx_seq(); /* FREE_BODY */
  gr_rec_t taken;
  cr_assert_eq(gr_track_take(GR_KS_ADDR, X, ~0u, &taken), 1);
  /* the driver refuses the free */
  g_destroy_before_insert = 1; /* the destroy begins right after gr_track_restore_ctx's check */
  gr_track_restore_ctx(&taken, seq0);
  gr_rec_t left;
  cr_assert_not(records_at_x(&left), "a record (ctx %u) came back for X, which the destroy freed", left.ctx_id);
}
