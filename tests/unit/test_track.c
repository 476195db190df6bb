/* track.c's context-destroy rules, compiled in here (as tests/unit/test_scope.c does with scope.c) so that a
 * context destroy can be placed exactly between two of a thread's steps. Each step placed is one the real
 * scheduler can produce: the destroy runs on another thread, holding the gate, while this thread is between
 * its check of the destroy sequence and its table insert. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <errno.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static int hooked_insert(const gr_packed_t *r);
static int hooked_insert_ks(const gr_packed_t *r, unsigned ks);
static int hooked_insert_young(const gr_packed_t *r);
static int hooked_visit(gr_visit_fn fn, void *arg);
#define gr_table_insert_pk hooked_insert
#define gr_table_insert_ks hooked_insert_ks /* the allocation's insert, with its key space given */
#define gr_table_insert_young hooked_insert_young /* a new block's insert, into its thread's log */
#define gr_table_visit hooked_visit
#include "../../src/track.c"
#undef gr_table_insert_pk
#undef gr_table_insert_ks
#undef gr_table_insert_young
#undef gr_table_visit

#define CTX_A 5
#define CTX_B 6
#define X 0x7f0000100000ull

static int g_destroy_before_insert; /* one-shot: a complete, successful destroy of CTX_A before the insert */

static void destroy_a(void) {
  gr_detached_t d = {0};
  gr_track_gate_enter();
  gr_track_ctx_detach(CTX_A, &d); /* the marking visit: this thread's record is not in the table yet */
  /* the driver destroys A and frees X here; it may hand X out again at once */
  gr_track_ctx_commit(&d, true);
  gr_track_gate_exit();
}

static void fill(gr_rec_t *r, uint16_t ctx) {
  gr_track_fill(r, GPURECLAIM_KIND_DEVICE, X, 1 << 20, 0, (uintptr_t)0x1234);
  r->ctx_id = ctx;
  r->device = 0;
}

static int hooked_insert(const gr_packed_t *r) {
  if (g_destroy_before_insert) {
    g_destroy_before_insert = 0;
    destroy_a();
  }
  return gr_table_insert_pk(r);
}

/* The same for a new block's record, which goes to its thread's log of young records: the destroy's marking
 * visit drains the logs, and this record is not in one yet. */
static int hooked_insert_young(const gr_packed_t *r) {
  cr_assert_eq(gr_kind_keyspace(gr_pk_kind(r)), GR_KS_ADDR, "a young record is an address record");
  if (g_destroy_before_insert) {
    g_destroy_before_insert = 0;
    destroy_a();
  }
  return gr_table_insert_young(r);
}

static int hooked_insert_ks(const gr_packed_t *r, unsigned ks) {
  cr_assert_eq(ks, gr_kind_keyspace(gr_pk_kind(r)), "the key space given is not the record's");
  return hooked_insert(r);
}

/* One-shot: before this thread looks for its own record to drop it (settle_slow), another thread in context B
 * gets X from the driver (which the destroy freed), tracks it, and frees it again. */
static int g_other_ctx_reuses_x;
static int g_other_ctx_done;

static void *other_ctx_thread(void *arg) {
  (void)arg;
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, X, 1 << 20, 0, (uintptr_t)0x5678);
  r.ctx_id = CTX_B;
  r.device = 1;
  gr_track_insert_ctx(&r, gr_track_ctx_seq()); /* cuMemAlloc in B returned X */
  gr_rec_t taken;
  uint64_t seq0 = gr_track_ctx_seq(); /* cuMemFree(X) in B */
  int rc = gr_track_take(GR_KS_ADDR, X, ~0u, &taken);
  if (rc == 1)
    gr_track_freed(&taken);
  g_other_ctx_done = 1;
  (void)seq0;
  return NULL;
}

static int hooked_visit(gr_visit_fn fn, void *arg) {
  if (fn == drop_mine && g_other_ctx_reuses_x) {
    g_other_ctx_reuses_x = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, other_ctx_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
  }
  return gr_table_visit(fn, arg);
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

/* The destroy commits while this thread's record, which its marking missed, is still in the table; before
 * this thread finds and drops it, a thread of context B gets X from the driver, tracks it and frees it. That
 * free must take B's own record (or the stale one must be gone first): were it to take this thread's stale
 * record, B's record would stay behind for freed memory, and a later release could free X under its next
 * owner. */
Test(track, a_block_reused_in_another_context_before_the_stale_record_is_dropped_leaves_no_record) {
  gr_rec_t r;
  fill(&r, CTX_A);
  uint64_t seq0 = gr_track_ctx_seq(); /* read before the driver call that returned X */
  g_destroy_before_insert = 1;
  g_other_ctx_reuses_x = 1;
  gr_track_insert_ctx(&r, seq0);
  cr_assert(g_other_ctx_done, "the other context's allocation did not run: the stale record was not looked for");
  gr_rec_t left;
  cr_assert_not(records_at_x(&left), "a record (ctx %u) stayed for X, which is freed", left.ctx_id);
}

/* A destroy of context A that has begun and not ended (its driver call still running: cuCtxDestroy waits for
 * A's work, which may wait for work this thread enqueues next) must not hold up an allocation in context B. */
static _Atomic int g_b_inserted, g_destroy_began, g_guard_fired;

static void *slow_destroy_of_a(void *arg) {
  (void)arg;
  gr_detached_t d = {0};
  gr_track_gate_enter();
  gr_track_ctx_detach(CTX_A, &d);
  atomic_store(&g_destroy_began, 1);
  /* the driver call: it returns once the other thread went on (a hang guard, not a timing: 60 s) */
  for (int i = 0; i < 60000 && !atomic_load(&g_b_inserted); i++)
    usleep(1000);
  if (!atomic_load(&g_b_inserted))
    atomic_store(&g_guard_fired, 1);
  gr_track_ctx_commit(&d, true);
  gr_track_gate_exit();
  return NULL;
}

Test(track, an_allocation_in_another_context_does_not_wait_for_a_destroy) {
  uint64_t seq0 = gr_track_ctx_seq(); /* B's allocation read the sequence before its driver call... */
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, slow_destroy_of_a, NULL), 0);
  while (!atomic_load(&g_destroy_began)) /* ...and the destroy of A began during it */
    usleep(100);
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, X, 1 << 20, 0, (uintptr_t)0x5678);
  r.ctx_id = CTX_B;
  r.device = 1;
  gr_track_insert_ctx(&r, seq0);
  atomic_store(&g_b_inserted, 1);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_not(atomic_load(&g_guard_fired), "the allocation in context B waited for the destroy of context A");
  gr_rec_t left;
  cr_assert(records_at_x(&left) && left.ctx_id == CTX_B, "context B's block is not tracked");
}
