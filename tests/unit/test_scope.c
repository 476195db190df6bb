/* Scopes (src/track/scope.c), compiled in here so that a test can interleave a concurrent end and fail the growth of a
 * scope's key list.
 *
 * Two threads ending one scope at once. The second one checked the scope open just before the
 * first ended it; meanwhile the slot was freed and another scope opened in it. The second end must then fail
 * with -ENOENT and leave the newer scope open: ending it would make its live blocks orphans that a release
 * frees while they are in use.
 * The interleaving is made deterministic by compiling scope.c here with its race point defined: the first
 * time an end passes its checks, the "other thread" (this one, re-entering) ends the scope and opens scopes
 * until one takes the same slot. */
#include "gpureclaim_internal.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <errno.h>

static void race(uint64_t scope);
static void *failing_realloc(void *p, size_t n);
#define GR_SCOPE_END_RACE_POINT(scope) race(scope)
#define GR_SCOPE_REALLOC failing_realloc
#include "../../src/track/scope.c"

#include <pthread.h>

static int g_growths_left = -1; /* >= 0: that many more growths of a key list succeed, then every one fails */

static void *failing_realloc(void *p, size_t n) {
  if (g_growths_left == 0)
    return NULL;
  if (g_growths_left > 0)
    g_growths_left--;
  return realloc(p, n);
}

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

/* ---- what an end orphans ---- */

static void start(void) {
  cr_assert_eq(gr_table_init(), 0);
  atomic_store(&gr_state_run, 1); /* as once CUDA started: ends act on the table */
}

static uint64_t g_next_key = 0x7f0000000000;

/* A block allocated on this thread at key (0: a new one), as a hook records it. */
static uint64_t alloc_at(uint64_t key) {
  if (!key)
    key = g_next_key += 0x10000;
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, key, 4096, 0, (uintptr_t)__builtin_return_address(0));
  gr_track_insert(&r);
  return key;
}
static uint64_t alloc(void) { return alloc_at(0); }

static void free_block(uint64_t key) {
  gr_rec_t r;
  cr_assert_eq(gr_track_take(GR_KS_ADDR, key, 1u << GPURECLAIM_KIND_DEVICE, &r), 1, "%#llx is tracked",
               (unsigned long long)key);
  gr_track_freed(&r);
}

/* The record at key: its state, and the id of its scope. */
static int state_of(uint64_t key, uint64_t *scope) {
  gr_rec_t r;
  if (gr_table_lookup(GR_KS_ADDR, key, GR_PRESENT_MASK, &r) != 0)
    return -1;
  if (scope)
    *scope = gr_scope_id(r.scope);
  return r.state;
}

static uint64_t orphans(void) {
  gpureclaim_stats_t st = {.size = sizeof st};
  cr_assert_eq(gr_stats_get(-1, &st), 0);
  return st.orphan_blocks;
}

TestSuite(scope_end, .init = start);

Test(scope_end, orphans_exactly_the_scopes_live_blocks) {
  uint64_t before[100], inside[10];
  for (int i = 0; i < 100; i++)
    before[i] = alloc();
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  for (int i = 0; i < 10; i++)
    inside[i] = alloc();
  free_block(inside[3]);
  free_block(inside[7]);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  uint64_t after = alloc();
  for (int i = 0; i < 10; i++) {
    uint64_t id = UINT64_MAX; /* (set by state_of; initialised for the compiler under TSan's stand-in harness) */
    if (i == 3 || i == 7) {
      cr_assert_eq(state_of(inside[i], NULL), -1, "freed in the scope: gone");
      continue;
    }
    cr_assert_eq(state_of(inside[i], &id), GR_ST_ORPHAN, "block %d of the scope", i);
    cr_assert_eq(id, s);
  }
  for (int i = 0; i < 100; i++)
    cr_assert_eq(state_of(before[i], NULL), GR_ST_LIVE, "blocks outside the scope stay live");
  cr_assert_eq(state_of(after, NULL), GR_ST_LIVE);
  cr_assert_eq(orphans(), 8);
  cr_assert_eq(gr_table_check(), 0);
}

typedef struct {
  uint64_t key;
  bool scoped; /* allocate it inside a scope of that thread */
  uint64_t scope;
} other_t;

static void *alloc_elsewhere(void *arg) {
  other_t *o = arg;
  if (o->scoped)
    o->scope = gpureclaim_scope_begin();
  alloc_at(o->key);
  return NULL;
}

Test(scope_end, an_address_reused_outside_the_scope_is_not_orphaned) {
  uint64_t s = gpureclaim_scope_begin();
  uint64_t a = alloc(), b = alloc(), kept = alloc();
  /* The driver hands freed addresses out again at once: to a thread with no scope, and to one with its own. */
  free_block(a);
  free_block(b);
  other_t plain = {.key = a}, scoped = {.key = b, .scoped = true};
  gr_thread_run(alloc_elsewhere, &plain);
  gr_thread_run(alloc_elsewhere, &scoped);
  cr_assert_neq(scoped.scope, 0);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  uint64_t id = UINT64_MAX;
  cr_assert_eq(state_of(a, &id), GR_ST_LIVE, "the new block at a freed address of the scope is not its");
  cr_assert_eq(id, 0);
  cr_assert_eq(state_of(b, &id), GR_ST_LIVE, "nor is one of another scope");
  cr_assert_eq(id, scoped.scope);
  cr_assert_eq(state_of(kept, NULL), GR_ST_ORPHAN);
  cr_assert_eq(orphans(), 1);
  cr_assert_eq(gpureclaim_scope_end(scoped.scope, 0), 0, "ended from another thread than its own");
  cr_assert_eq(state_of(b, NULL), GR_ST_ORPHAN, "the other scope's end orphans it");
  cr_assert_eq(orphans(), 2);
}

Test(scope_end, an_address_the_scope_got_back_is_orphaned_once) {
  uint64_t s = gpureclaim_scope_begin();
  uint64_t a = alloc();
  for (int i = 0; i < 1000; i++) { /* freed and handed back to the scope: listed again each time */
    free_block(a);
    alloc_at(a);
  }
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(state_of(a, NULL), GR_ST_ORPHAN);
  cr_assert_eq(orphans(), 1, "counted once");
  cr_assert_null(g_slots[slot_of(s)].keys, "the end freed the list");
}

Test(scope_end, nested_scopes_orphan_their_own_blocks) {
  uint64_t outer = gpureclaim_scope_begin();
  uint64_t a = alloc();
  uint64_t inner = gpureclaim_scope_begin();
  uint64_t b = alloc();
  cr_assert_eq(gpureclaim_scope_end(inner, 0), 0);
  uint64_t c = alloc();
  cr_assert_eq(state_of(b, NULL), GR_ST_ORPHAN);
  cr_assert_eq(state_of(a, NULL), GR_ST_LIVE, "the outer scope is still open");
  cr_assert_eq(state_of(c, NULL), GR_ST_LIVE);
  cr_assert_eq(gpureclaim_scope_end(outer, 0), 0);
  cr_assert_eq(state_of(a, NULL), GR_ST_ORPHAN);
  cr_assert_eq(state_of(c, NULL), GR_ST_ORPHAN, "allocated in the outer scope after the inner one ended");
  cr_assert_eq(orphans(), 3);
}

typedef struct {
  uint64_t scope;
  uint64_t keys[20];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int phase; /* 1: allocated, scope open; 2: ended elsewhere */
} owner_t;

static void *scoped_thread(void *arg) {
  owner_t *o = arg;
  o->scope = gpureclaim_scope_begin();
  for (int i = 0; i < 10; i++)
    o->keys[i] = alloc();
  pthread_mutex_lock(&o->mu);
  o->phase = 1;
  pthread_cond_broadcast(&o->cv);
  while (o->phase != 2)
    pthread_cond_wait(&o->cv, &o->mu);
  pthread_mutex_unlock(&o->mu);
  /* Its scope ended on another thread: what this thread allocates now is no scope's. */
  for (int i = 10; i < 20; i++)
    o->keys[i] = alloc();
  return NULL;
}

Test(scope_end, a_scope_ended_from_another_thread) {
  owner_t o = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t t;
  t = gr_thread_start(scoped_thread, &o);
  pthread_mutex_lock(&o.mu);
  while (o.phase != 1)
    pthread_cond_wait(&o.cv, &o.mu);
  cr_assert_eq(gpureclaim_scope_end(o.scope, 0), 0);
  o.phase = 2;
  pthread_cond_broadcast(&o.cv);
  pthread_mutex_unlock(&o.mu);
  gr_thread_join(t);
  uint64_t id = UINT64_MAX;
  for (int i = 0; i < 10; i++)
    cr_assert_eq(state_of(o.keys[i], NULL), GR_ST_ORPHAN, "block %d", i);
  for (int i = 10; i < 20; i++) {
    cr_assert_eq(state_of(o.keys[i], &id), GR_ST_LIVE, "block %d, after the end", i);
    cr_assert_eq(id, 0);
  }
  cr_assert_eq(orphans(), 10);
}

Test(scope_end, a_churning_scope_keeps_a_short_list) {
  uint64_t s = gpureclaim_scope_begin();
  uint64_t live[5];
  for (int i = 0; i < 5; i++)
    live[i] = alloc();
  for (int i = 0; i < 100000; i++) /* temporaries at ever new addresses */
    free_block(alloc());
  cr_assert_leq(g_slots[slot_of(s)].cap, 64, "the list holds what the scope holds, not what it made (%u)",
                g_slots[slot_of(s)].cap);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(state_of(live[i], NULL), GR_ST_ORPHAN);
  cr_assert_eq(orphans(), 5);
}

Test(scope_end, a_block_whose_free_was_refused_stays_listed) {
  uint64_t s = gpureclaim_scope_begin();
  uint64_t a = alloc();
  gr_rec_t r;
  cr_assert_eq(gr_track_take(GR_KS_ADDR, a, 1u << GPURECLAIM_KIND_DEVICE, &r), 1);
  for (int i = 0; i < 200; i++) /* the list fills and is compacted while a is out of the table */
    free_block(alloc());
  gr_track_restore(&r); /* the driver refused the free */
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  cr_assert_eq(state_of(a, NULL), GR_ST_ORPHAN);
}

Test(scope_end, without_memory_for_its_list_an_end_scans_the_table) {
  uint64_t outside = alloc();
  uint64_t s = gpureclaim_scope_begin();
  uint64_t k[300];
  g_growths_left = 2; /* 64, then 128 keys; the next growth fails */
  for (int i = 0; i < 300; i++)
    k[i] = alloc();
  cr_assert(g_slots[slot_of(s)].overflow, "the list could not grow");
  free_block(k[0]);
  other_t plain = {.key = k[0]};
  gr_thread_run(alloc_elsewhere, &plain);
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
  for (int i = 1; i < 300; i++)
    cr_assert_eq(state_of(k[i], NULL), GR_ST_ORPHAN, "block %d", i);
  cr_assert_eq(state_of(k[0], NULL), GR_ST_LIVE, "the address reused by no scope");
  cr_assert_eq(state_of(outside, NULL), GR_ST_LIVE);
  cr_assert_eq(orphans(), 299);
}
