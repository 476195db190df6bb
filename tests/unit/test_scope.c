/* Two threads ending one scope at once (src/scope.c). The second one checked the scope open just before the
 * first ended it; meanwhile the slot was freed and another scope opened in it. The second end must then fail
 * with -ENOENT and leave the newer scope open: ending it would make its live blocks orphans that a release
 * frees while they are in use.
 * The interleaving is made deterministic by compiling scope.c here with its race point defined: the first
 * time an end passes its checks, the "other thread" (this one, re-entering) ends the scope and opens scopes
 * until one takes the same slot. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <errno.h>

static void race(uint64_t scope);
#define GR_SCOPE_END_RACE_POINT(scope) race(scope)
#include "../../src/scope.c"

static int g_armed;
static uint64_t g_newer;

static void race(uint64_t scope) {
  if (!g_armed)
    return;
  g_armed = 0;
  cr_assert_eq(gpureclaim_scope_end(scope, 0), 0, "the first end wins");
  /* Slots are taken round robin: at most one lap until this one comes back. */
  for (unsigned n = 0; n < NSLOTS; n++) {
    uint64_t id = gpureclaim_scope_begin();
    cr_assert_neq(id, 0);
    if (slot_of(id) == slot_of(scope)) {
      g_newer = id;
      return;
    }
    cr_assert_eq(gpureclaim_scope_end(id, 0), 0);
  }
  cr_assert_fail("slot %u never came back", slot_of(scope));
}

Test(scope, a_stale_end_cannot_end_a_newer_scope_in_the_same_slot) {
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  g_armed = 1;
  cr_assert_eq(gpureclaim_scope_end(s, 0), -ENOENT, "the scope had already ended");
  cr_assert_neq(g_newer, 0);
  cr_assert_neq(g_newer, s);
  cr_assert_eq(gpureclaim_scope_current(), g_newer, "the newer scope is still open");
  cr_assert_eq(gr_scope_id(slot_of(g_newer)), g_newer);
  cr_assert_eq(gpureclaim_scope_end(g_newer, 0), 0, "and only its own end ends it");
  cr_assert_eq(gr_scope_id(slot_of(g_newer)), g_newer, "an ended scope's blocks still report its id");
  cr_assert_eq(gpureclaim_scope_end(g_newer, 0), -ENOENT);
}

Test(scope, ended_ids_are_refused) {
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  cr_assert_eq(gpureclaim_scope_end(s | (UINT64_C(1) << 63), 0), -ENOENT);
  cr_assert_eq(gpureclaim_scope_current(), s);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
}
