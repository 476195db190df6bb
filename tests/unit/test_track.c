/* track.c's context-destroy rules, compiled in here (as tests/unit/test_scope.c does with scope.c) so that a
 * context destroy can be placed exactly between two of a thread's steps. Each step placed is one the real
 * scheduler can produce: the destroy runs on another thread, holding the context lock, while this thread is between
 * its check of the destroy sequence and its table insert. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <errno.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static int hooked_insert(const gr_packed_t *r);
static int hooked_insert_ks(const gr_packed_t *r, unsigned ks);
static int hooked_insert_young(gr_thread_rec_t *me, gr_packed_t r, bool asym);
static int hooked_visit(gr_visit_fn fn, void *arg);
static int hooked_lookup(unsigned ks, uint64_t key, unsigned mask, gr_rec_t *out);
static int hooked_take(unsigned ks, uint64_t key, unsigned mask, gr_rec_t *out);
#define gr_table_lookup hooked_lookup /* a late free's looks for the record a release claimed */
#define gr_table_take hooked_take
#define gr_table_insert_pk hooked_insert
#define gr_table_insert_ks hooked_insert_ks /* the allocation's insert, with its key space given */
#define gr_table_insert_young_v hooked_insert_young /* a new block's insert, into its thread's log */
#define gr_table_visit hooked_visit
#include "../../src/track/track.c"
#undef gr_table_insert_pk
#undef gr_table_insert_ks
#undef gr_table_insert_young_v
#undef gr_table_visit
#undef gr_table_lookup
#undef gr_table_take

#define CTX_A 5
#define CTX_B 6
#define X 0x7f0000100000ull

static int g_destroy_before_insert; /* one-shot: a complete, successful destroy of CTX_A before the insert */

static void destroy_a(void) {
  gr_detached_t d = {0};
  gr_track_ctxlock_enter();
  gr_track_ctx_detach(CTX_A, &d); /* the marking visit: this thread's record is not in the table yet */
  /* the driver destroys A and frees X here; it may hand X out again at once */
  gr_track_ctx_commit(&d, true);
  gr_track_ctxlock_exit();
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
static int hooked_insert_young(gr_thread_rec_t *me, gr_packed_t r, bool asym) {
  cr_assert_eq(gr_kind_keyspace(gr_pk_kind(&r)), GR_KS_ADDR, "a young record is an address record");
  if (g_destroy_before_insert) {
    g_destroy_before_insert = 0;
    destroy_a();
  }
  return gr_table_insert_young_v(me, r, asym);
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

/* One-shot, for a_block_reused_..._freed_by_a_third_thread: before the stale record's thread looks for it
 * (settle_slow), a thread of context B that registered before it (so its log drains after the stale one's)
 * gets X from the driver and tracks it, and a third thread frees X (a consumer: its free drains the logs). */
static int g_b_allocates_c_frees;
static pthread_mutex_t g_b_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_b_cv = PTHREAD_COND_INITIALIZER;
static int g_b_step = -1; /* 0: registered, 1: allocate now, 2: allocated, 3: exit */

static void b_step_set(int v) {
  pthread_mutex_lock(&g_b_mu);
  g_b_step = v;
  pthread_cond_broadcast(&g_b_cv);
  pthread_mutex_unlock(&g_b_mu);
}

static void b_step_wait(int v) {
  pthread_mutex_lock(&g_b_mu);
  while (g_b_step != v)
    pthread_cond_wait(&g_b_cv, &g_b_mu);
  pthread_mutex_unlock(&g_b_mu);
}

static void *b_thread(void *arg) {
  (void)arg;
  cr_assert_not_null(gr_epoch_self());
  b_step_set(0);
  b_step_wait(1);
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, X, 1 << 20, 0, (uintptr_t)0x5678);
  r.ctx_id = CTX_B;
  r.device = 1;
  gr_track_insert_ctx(&r, gr_track_ctx_seq()); /* cuMemAlloc in B returned X */
  b_step_set(2);
  b_step_wait(3); /* alive while the third thread frees X: its log is not handed to that thread */
  return NULL;
}

static void *c_thread(void *arg) {
  (void)arg;
  gr_rec_t taken;
  if (gr_track_take(GR_KS_ADDR, X, ~0u, &taken) == 1) /* cuMemFree(X), B's block */
    gr_track_freed(&taken);
  return NULL;
}

static int hooked_visit(gr_visit_fn fn, void *arg) {
  if (fn == drop_mine && g_b_allocates_c_frees) {
    g_b_allocates_c_frees = 0;
    b_step_set(1);
    b_step_wait(2);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, c_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
  }
  if (fn == drop_mine && g_other_ctx_reuses_x) {
    g_other_ctx_reuses_x = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, other_ctx_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
  }
  return gr_table_visit(fn, arg);
}

/* One-shot, for a_late_free_...: right after a late free's first look at g_race_key, whatever it looked for and
 * found, the release that claimed that block gets its driver free back and moves the record on: RECLAIMING to
 * RECLAIMED (release.c). The scheduler can place that step there: the late free's two looks are two table
 * operations, and the release runs on another thread. */
static uint64_t g_race_key;
static int g_race_fired;

static bool to_reclaimed(gr_rec_t *r, void *arg) {
  (void)arg;
  if (r->state != GR_ST_RECLAIMING)
    return false;
  r->state = GR_ST_RECLAIMED;
  return true;
}

static void after_look(unsigned ks, uint64_t key) {
  if (!g_race_key || key != g_race_key || ks != GR_KS_ADDR)
    return;
  g_race_key = 0;
  gr_rec_t before;
  cr_assert_eq(gr_table_update(GR_KS_ADDR, key, GR_STMASK(GR_ST_RECLAIMING), to_reclaimed, NULL, &before), 0,
               "the release's record was not RECLAIMING any more at the late free's first look");
  g_race_fired = 1;
}

static int hooked_lookup(unsigned ks, uint64_t key, unsigned mask, gr_rec_t *out) {
  int rc = gr_table_lookup(ks, key, mask, out);
  after_look(ks, key);
  return rc;
}

static int hooked_take(unsigned ks, uint64_t key, unsigned mask, gr_rec_t *out) {
  int rc = gr_table_take(ks, key, mask, out);
  after_look(ks, key);
  return rc;
}

static int records_at_x(gr_rec_t *out) {
  return gr_table_lookup(GR_KS_ADDR, X, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), out) == 0;
}

static void setup(void) {
  cr_assert_eq(gr_table_init(), 0);
  atomic_store(&gr_state_run, 1);
}

TestSuite(track, .init = setup);

/* A new block's record: the sequence is read again after the insert, and the record dropped. */
/* This thread's allocation of X in context A, with context A's destroy placed between the allocation's check and
 * its insert (hooked_insert*); what else happens there is set by the caller's flags. */
static void insert_x_with_a_destroy_before(void) {
  gr_rec_t r;
  fill(&r, CTX_A);
  uint64_t seq0 = gr_track_ctx_seq(); /* read before the driver call that returned X */
  g_destroy_before_insert = 1;
  gr_track_insert_ctx(&r, seq0);
}

Test(track, insert_ctx_drops_a_record_whose_context_a_destroy_took_before_its_insert) {
  insert_x_with_a_destroy_before();
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
  g_other_ctx_reuses_x = 1;
  insert_x_with_a_destroy_before();
  cr_assert(g_other_ctx_done, "the other context's allocation did not run: the stale record was not looked for");
  gr_rec_t left;
  cr_assert_not(records_at_x(&left), "a record (ctx %u) stayed for X, which is freed", left.ctx_id);
}

/* The same, with the stale record in its thread's log of young records when B's allocation looks for it, and
 * X freed by a third thread (which drains the logs, the stale record first). B's allocation must take the stale
 * record out, as it would from the table: else the third thread's free may take the stale record and leave B's
 * for freed memory. */
static void *stale_thread(void *arg) {
  (void)arg;
  g_b_allocates_c_frees = 1;
  insert_x_with_a_destroy_before();
  return NULL;
}

Test(track, a_young_stale_record_is_taken_out_by_another_contexts_allocation_of_its_address) {
  pthread_t b, a;
  cr_assert_eq(pthread_create(&b, NULL, b_thread, NULL), 0);
  b_step_wait(0);
  cr_assert_eq(pthread_create(&a, NULL, stale_thread, NULL), 0); /* registers after B: drained before B */
  cr_assert_eq(pthread_join(a, NULL), 0);
  cr_assert_eq(g_b_step, 2, "B's allocation did not run: the stale record was not looked for");
  b_step_set(3);
  cr_assert_eq(pthread_join(b, NULL), 0);
  gr_rec_t left;
  cr_assert_not(records_at_x(&left), "a record (ctx %u) stayed for X, which is freed", left.ctx_id);
}

/* A destroy of context A that has begun and not ended (its driver call still running: cuCtxDestroy waits for
 * A's work, which may wait for work this thread enqueues next) must not hold up an allocation in context B. */
static _Atomic int g_b_inserted, g_destroy_began, g_guard_fired;

static void *slow_destroy_of_a(void *arg) {
  (void)arg;
  gr_detached_t d = {0};
  gr_track_ctxlock_enter();
  gr_track_ctx_detach(CTX_A, &d);
  atomic_store(&g_destroy_began, 1);
  /* the driver call: it returns once the other thread went on (a hang guard, not a timing: 60 s) */
  for (int i = 0; i < 60000 && !atomic_load(&g_b_inserted); i++)
    usleep(1000);
  if (!atomic_load(&g_b_inserted))
    atomic_store(&g_guard_fired, 1);
  gr_track_ctx_commit(&d, true);
  gr_track_ctxlock_exit();
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

static unsigned mappings_in(uint64_t lo, uint64_t end) {
  unsigned n = 0;
  for (uint64_t p = lo; p < end; p += 2u << 20)
    n += gr_table_lookup(GR_KS_MAPPING, p, GR_STMASK(GR_ST_LIVE), NULL) == 0;
  return n;
}

/* cuMemUnmap's range may hold a mapping gpureclaim has no record of (made before it loaded, or by a route it does
 * not see): the tracked ones past it are taken all the same (the walk from record to record stopped at the gap
 * and left them, for mappings the driver then no longer had), and one past the range stays. Refused, all come
 * back. */
Test(track, an_unmap_takes_every_tracked_mapping_in_its_range_past_a_gap) {
  const uint64_t gran = 2u << 20, va = UINT64_C(0x7c0000000000);
  for (int i = 1; i < 5; i++) /* va itself: untracked */
    gr_track_vmm_map(va + i * gran, gran, 0x1000 + i, 0);
  gr_track_vmm_map(va + 6 * gran, gran, 0x2000, 0); /* past a second gap */
  gr_track_vmm_map(va + 8 * gran, gran, 0x3000, 0); /* past the range */
  gr_unmap_t u;
  gr_track_vmm_unmap_begin(&u, va, 8 * gran);
  cr_assert_eq(u.n, 5, "%u of the range's 5 tracked mappings taken", u.n);
  cr_assert_eq(mappings_in(va, 8 * gran + va), 0);
  gr_track_vmm_unmap_end(&u, false);
  cr_assert_eq(mappings_in(va, 9 * gran + va), 6, "a refused unmap puts every mapping back");
  gr_track_vmm_unmap_begin(&u, va, 8 * gran);
  gr_track_vmm_unmap_end(&u, true);
  cr_assert_eq(mappings_in(va, 8 * gran + va), 0, "mappings of the range left behind");
  cr_assert_eq(mappings_in(va + 8 * gran, 9 * gran + va), 1, "the mapping past the range was taken");
}

/* A late free (the program frees a block a release already claimed as an orphan) while that release moves the
 * block's record on, from RECLAIMING (claimed, its driver free under way) to RECLAIMED (freed), between the late
 * free's two looks: it must still be recognised, or the program's free goes to the driver, a second free of the
 * address (of another block's, once the driver handed it out again). Looking for RECLAIMING first, then RECLAIMED
 * (the order of the record's moves), one of the two looks finds it whenever the move comes; the other order
 * missed it (test_release's race caught that by chance, once in eight runs under load). */
static bool to_state(gr_rec_t *r, void *arg) {
  r->state = *(const uint8_t *)arg;
  return true;
}

Test(track, a_late_free_finds_a_record_a_release_moves_between_its_looks) {
  gr_rec_t r, before;
  fill(&r, CTX_A);
  r.state = GR_ST_ORPHAN;
  gr_track_insert(&r);
  static const uint8_t reclaiming = GR_ST_RECLAIMING;
  cr_assert_eq(gr_table_update(GR_KS_ADDR, X, GR_STMASK(GR_ST_ORPHAN), to_state, (void *)&reclaiming, &before), 0,
               "the release claims the orphan");
  gpureclaim_stats_t st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
  cr_assert_eq(gr_stats_get(-1, &st0), 0);
  g_race_key = X;
  bool late = gr_track_late_free(GR_KS_ADDR, X);
  cr_assert(g_race_fired, "the release's step was not placed between the late free's looks");
  cr_assert(late, "a free of a block the release freed was taken for an unknown one: the driver would free it again");
  cr_assert_eq(gr_stats_get(-1, &st1), 0);
  cr_assert_eq(st1.late_frees, st0.late_frees + 1, "counted as a late free");
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, X, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), NULL), -ENOENT);
}
