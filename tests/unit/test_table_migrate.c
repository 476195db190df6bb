/* Records keep what they are across the table's migrations (src/table/table.c): a record copied to a new generation,
 * whatever made the table migrate (growth, shrinking, gr_table_compact), keeps its state (orphans stay orphans,
 * a claimed block stays claimed, a tombstone stays a tombstone, a released VMM handle stays released), its scope,
 * its aux (mapping counts, a context destroy's mark) and every other field. Written against the table's interface
 * only, whatever the policy that sizes its generations: each step checks that migrations did happen.
 * (Every table unit test passed with a migration that made every copied record LIVE; only whole-library stress
 * tests noticed, by chance.) */
#include "table.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define NREC 600 /* records whose states are followed, in every state and key space */

static gr_rec_t g_want[NREC];

static uint64_t addr(uint64_t i) { return UINT64_C(0x200000000000) + i * 512; }

static gr_rec_t rec(unsigned i) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = addr(i);
  r.size = 4096 + i;
  r.kind = 1; /* GPURECLAIM_KIND_DEVICE */
  r.state = GR_ST_LIVE;
  r.device = (uint8_t)(i % 3);
  r.site.bits = 0x1000 + i;
  r.time_ms = 1000 + i;
  r.tid = 100 + i;
  r.ctx_id = (uint16_t)(1 + i % 7);
  r.api = (uint8_t)(i % 5);
  switch (i % 4) { /* the other key spaces too: VMM handles, mappings, reservations */
  case 1:
    r.kind = 5; /* VMM handle */
    r.key = 0x9000 + i;
    r.pool_id = 0;
    break;
  case 2:
    r.kind = 6; /* mapping: its site word holds the handle mapped */
    r.map_handle = 0x9000 + i;
    r.site.bits = 0;
    break;
  case 3:
    r.kind = 4; /* stream-ordered, from a pool */
    r.pool_id = (uint16_t)(1 + i % 11);
    break;
  }
  return r;
}

static bool to_state(gr_rec_t *r, void *arg) {
  const gr_rec_t *w = arg;
  r->state = w->state;
  r->scope = w->scope;
  r->aux = w->aux;
  return true;
}

static void move(unsigned i, uint8_t state, uint16_t scope, uint8_t aux) {
  gr_rec_t *w = &g_want[i], before;
  w->state = state;
  w->scope = scope;
  w->aux = aux;
  cr_assert_eq(gr_table_update(gr_kind_keyspace(w->kind), w->key, GR_PRESENT_MASK, to_state, w, &before), 0,
               "record %u: no move to state %u", i, state);
}

/* NREC records in every state a block's life takes them through, each in its own way. */
static void populate(void) {
  cr_assert_eq(gr_table_init(), 0);
  for (unsigned i = 0; i < NREC; i++) {
    g_want[i] = rec(i);
    cr_assert_eq(gr_table_insert(&g_want[i]), 0);
  }
  for (unsigned i = 0; i < NREC; i++) {
    unsigned ks = gr_kind_keyspace(g_want[i].kind);
    switch ((i / 4) % 6) {
    case 0: /* live, in a scope still open */
      move(i, GR_ST_LIVE, (uint16_t)(2 + i % 300), 0);
      break;
    case 1: /* its scope ended: an orphan */
      move(i, GR_ST_ORPHAN, (uint16_t)(2 + i % 300), 0);
      break;
    case 2: /* claimed by a release, its free under way */
      move(i, GR_ST_ORPHAN, 5, 0);
      move(i, GR_ST_RECLAIMING, 5, 0);
      break;
    case 3: /* freed by a release: a tombstone for its late free (addresses and handles only) */
      if (ks == GR_KS_ADDR || ks == GR_KS_HANDLE) {
        move(i, GR_ST_RECLAIMING, 0, 0);
        move(i, GR_ST_RECLAIMED, 0, 0);
      } else {
        move(i, GR_ST_LIVE, 0, 3);
      }
      break;
    case 4: /* a VMM handle the program released, kept by its mappings; an address record a destroy marked */
      if (ks == GR_KS_HANDLE)
        move(i, GR_ST_RELEASED, 0, 2);
      else if (ks == GR_KS_ADDR)
        move(i, GR_ST_LIVE, 0, GR_AUX_DETACHING);
      break;
    default: /* live, as inserted */
      break;
    }
  }
}

/* Every record is there once, exactly as it was left. */
static void check_all(const char *after) {
  for (unsigned i = 0; i < NREC; i++) {
    const gr_rec_t *w = &g_want[i];
    gr_rec_t got;
    cr_assert_eq(gr_table_lookup(gr_kind_keyspace(w->kind), w->key, GR_PRESENT_MASK | GR_NOT_YOUNG, &got), 0,
                 "after %s: record %u (key %#llx) is gone", after, i, (unsigned long long)w->key);
    cr_assert_eq(got.state, w->state, "after %s: record %u is in state %u, was %u", after, i, got.state, w->state);
    cr_assert_eq(got.scope, w->scope, "after %s: record %u's scope %u, was %u", after, i, got.scope, w->scope);
    cr_assert_eq(got.aux, w->aux, "after %s: record %u's aux %u, was %u", after, i, got.aux, w->aux);
    cr_assert(got.size == w->size && got.kind == w->kind && got.device == w->device && got.ctx_id == w->ctx_id &&
                  got.pool_id == w->pool_id && got.tid == w->tid && got.time_ms == w->time_ms && got.api == w->api &&
                  got.site.bits == w->site.bits && got.map_handle == w->map_handle,
              "after %s: record %u's fields changed", after, i);
  }
  cr_assert_eq(gr_table_check(), 0, "after %s", after);
}

Test(table_migrate, states_scopes_and_aux_survive_every_kind_of_migration) {
  populate();
  check_all("the moves");
  uint64_t m0 = gr_table_migrations();
  gr_table_compact(); /* a migration to a table sized for what it holds */
  cr_assert_gt(gr_table_migrations(), m0, "gr_table_compact did not migrate");
  check_all("a compaction");

  /* Growth: many more records, whose inserts make the table migrate to bigger generations. */
  uint64_t m1 = gr_table_migrations(), cap1 = gr_table_capacity();
  enum { MORE = 40000 };
  for (unsigned i = 0; i < MORE; i++) {
    gr_rec_t r = rec(NREC + i);
    r.kind = 1;
    r.key = addr(NREC + i);
    cr_assert_eq(gr_table_insert(&r), 0);
  }
  cr_assert_gt(gr_table_migrations(), m1, "growing to %u records did not migrate", NREC + MORE);
  cr_assert_gt(gr_table_capacity(), cap1);
  check_all("growth");

  /* Shrinking: the extra records leave, and the table migrates to smaller generations. */
  uint64_t m2 = gr_table_migrations();
  for (unsigned i = 0; i < MORE; i++)
    cr_assert_eq(gr_table_take(GR_KS_ADDR, addr(NREC + i), GR_STMASK(GR_ST_LIVE), NULL), 0);
  gr_table_compact();
  cr_assert_gt(gr_table_migrations(), m2, "emptying did not migrate");
  check_all("shrinking");
}

/* A record that changes while the table migrates: the change is mirrored in the copy, or made to the copy, never
 * lost. A thread moves records of every key space between ORPHAN and RECLAIMING (a release's claim, and its
 * refusal by the driver) while this one forces migrations, each side at least so many times (whichever finishes
 * first waits for the other: no timing decides); at the end every record holds the last state its thread gave it.
 * (Whether a change lands in the window where a copy is reserved but not yet published is up to the scheduler:
 * this checks the outcome, it does not place the change.) */
static _Atomic int g_stop;
static _Atomic unsigned g_rounds;

static void *toggler(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    for (unsigned i = 0; i < NREC; i += 5) {
      gr_rec_t w = g_want[i], before;
      w.state = w.state == GR_ST_ORPHAN ? GR_ST_RECLAIMING : GR_ST_ORPHAN;
      if (gr_table_update(gr_kind_keyspace(w.kind), w.key, GR_PRESENT_MASK, to_state, &w, &before) != 0)
        return (void *)1;
      g_want[i].state = w.state; /* read by the other thread only after the join */
    }
    atomic_fetch_add(&g_rounds, 1);
  }
  return NULL;
}

Test(table_migrate, a_change_made_during_a_migration_is_kept) {
  cr_assert_eq(gr_table_init(), 0);
  for (unsigned i = 0; i < NREC; i++) {
    g_want[i] = rec(i);
    cr_assert_eq(gr_table_insert(&g_want[i]), 0);
  }
  for (unsigned i = 0; i < NREC; i += 5)
    move(i, GR_ST_ORPHAN, 9, 0);
  uint64_t m0 = gr_table_migrations();
  pthread_t t = gr_thread_start(toggler, NULL);
  for (unsigned k = 0; k < 300 || atomic_load(&g_rounds) < 100; k++)
    gr_table_compact();
  atomic_store(&g_stop, 1);
  cr_assert_null(gr_thread_join(t), "a record vanished during the migrations");
  cr_assert_geq(gr_table_migrations(), m0 + 300);
  check_all("migrations under changes");
}
