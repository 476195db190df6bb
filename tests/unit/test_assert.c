/* The debug build's invariant checks (GR_ASSERT, GPURECLAIM_DEBUG=ON): a broken invariant aborts with a message
 * instead of going on with a corrupt state. track.c and scope.c are compiled in here with the checks on, whatever
 * the build (table.c in test_table_states.c), so that this test runs in every configuration. */
#define GR_DEBUG 1
#include "../../src/track/track.c"
#include "../../src/track/scope.c"

#include <criterion/criterion.h>
#include <signal.h>

Test(assert, leaving_the_context_lock_more_often_than_it_was_entered_aborts, .signal = SIGABRT) {
  gr_track_ctxlock_enter();
  gr_track_ctxlock_exit();
  gr_track_ctxlock_exit();
}

Test(assert, a_context_destroy_begun_without_the_lock_aborts, .signal = SIGABRT) {
  gr_detached_t d = {0};
  gr_track_ctx_begin(5, &d);
}

Test(assert, the_checks_let_a_correct_sequence_through) {
  gr_detached_t d = {0};
  gr_track_ctxlock_enter();
  gr_track_ctx_begin(5, &d);
  gr_track_ctx_commit(&d, false);
  gr_track_ctxlock_exit();
  cr_assert_eq(gr_track_ctx_seq() & 1, 0);
}

Test(assert, a_scope_reference_given_back_twice_aborts, .signal = SIGABRT) {
  uint64_t id = gpureclaim_scope_begin();
  cr_assert_neq(id, 0);
  uint16_t s = slot_of(id);
  cr_assert_eq(gpureclaim_scope_end(id, 0), 0); /* gives back the scope's own reference: none is left */
  gr_scope_unref(s);
}

Test(assert, a_scope_reference_taken_and_given_back_passes) {
  uint64_t id = gpureclaim_scope_begin();
  cr_assert_neq(id, 0);
  uint16_t s = gr_scope_tag(); /* a block's reference */
  cr_assert_eq(s, slot_of(id));
  gr_scope_unref(s);
  cr_assert_eq(gpureclaim_scope_end(id, 0), 0);
  cr_assert_eq(atomic_load(&g_slots[s].refs), 0);
}

