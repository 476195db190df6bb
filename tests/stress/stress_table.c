/*
 * stress_table -- the block table under concurrent insert, take, state changes, iteration and migration.
 *
 * Standalone (no Criterion) so that it runs under ThreadSanitizer too. Usage: stress_table [threads] [seconds]
 *
 * Each worker owns a range of keys and keeps a private model of which of its keys are present, so at the end
 * the table must equal the union of the models exactly. A shared range of keys is raced by every worker:
 * inserted as ORPHAN by one, then claimed by "free" (take) and "release" (visit + CAS) concurrently; each
 * shared record must be claimed exactly once. Meanwhile an iterator checks that a set of stable records is
 * seen exactly once per pass, and a compactor forces migrations.
 */
#include "check.h"
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS_PER_WORKER 4096u
#define STABLE 2000u
#define SHARED 1024u

static uint64_t key_of(uint64_t i) { return UINT64_C(0x300000000000) + i * 256; }
static uint64_t worker_key(unsigned w, unsigned k) { return key_of(1000000 + (uint64_t)w * KEYS_PER_WORKER + k); }
static uint64_t shared_key(unsigned k) { return key_of(500000 + k); }

static _Atomic int g_stop;
static _Atomic uint64_t g_shared_inserted, g_shared_claims;
static _Atomic unsigned g_shared_state[SHARED]; /* 0 free, 1 inserted (owner thread knows), 2 claimed */

static gr_rec_t mkrec(uint64_t key, unsigned state, uint64_t tag) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = key;
  r.size = tag & GR_SIZE_MAX;
  r.kind = 1;
  r.state = (uint8_t)state;
  r.device = 0;
  return r;
}

typedef struct {
  unsigned id;
  unsigned char present[KEYS_PER_WORKER];
  uint64_t ops;
} worker_t;

static bool to_orphan(gr_rec_t *r, void *arg) {
  (void)arg;
  if (r->state != GR_ST_LIVE)
    return false;
  r->state = GR_ST_ORPHAN;
  return true;
}

static void *worker(void *arg) {
  worker_t *w = arg;
  uint64_t seed = gr_rng_stream(w->id);
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    uint64_t x = gr_rng(&seed);
    unsigned k = (unsigned)(x % KEYS_PER_WORKER);
    uint64_t key = worker_key(w->id, k);
    switch ((x >> 32) % 8) {
    case 0: case 1: case 2: /* insert if absent */
      if (!w->present[k]) {
        gr_rec_t r = mkrec(key, GR_ST_LIVE, key ^ 0x5a5a);
        CHECK(gr_table_insert(&r) == 0, "insert");
        w->present[k] = 1;
      }
      break;
    case 3: case 4: { /* take */
      gr_rec_t out;
      int rc = gr_table_take(GR_KS_ADDR, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), &out);
      CHECK((rc == 0) == (w->present[k] == 1), "take of key %u: rc %d, model %d", k, rc, w->present[k]);
      if (rc == 0)
        CHECK(out.size == ((key ^ 0x5a5a) & GR_SIZE_MAX), "payload of key %u", k);
      w->present[k] = 0;
      break;
    }
    case 5: { /* lookup */
      gr_rec_t out;
      int rc = gr_table_lookup(GR_KS_ADDR, key, GR_PRESENT_MASK, &out);
      CHECK((rc == 0) == (w->present[k] == 1), "lookup of key %u: rc %d, model %d", k, rc, w->present[k]);
      if (rc == 0)
        CHECK(out.key == key && out.size == ((key ^ 0x5a5a) & GR_SIZE_MAX), "torn record for key %u", k);
      break;
    }
    case 6: /* state change */
      if (w->present[k])
        (void)gr_table_update(GR_KS_ADDR, key, GR_PRESENT_MASK, to_orphan, NULL, NULL);
      break;
    case 7: { /* shared: publish an orphan, or race to free it */
      unsigned s = (unsigned)((x >> 40) % SHARED);
      unsigned expect = 0;
      if (atomic_compare_exchange_strong(&g_shared_state[s], &expect, 1)) {
        gr_rec_t r = mkrec(shared_key(s), GR_ST_ORPHAN, 1);
        CHECK(gr_table_insert(&r) == 0, "shared insert");
        atomic_fetch_add(&g_shared_inserted, 1);
      } else if (expect == 1) {
        if (gr_table_take(GR_KS_ADDR, shared_key(s), GR_STMASK(GR_ST_ORPHAN), NULL) == 0) {
          atomic_fetch_add(&g_shared_claims, 1);
          unsigned one = 1;
          CHECK(atomic_compare_exchange_strong(&g_shared_state[s], &one, 0), "shared %u claimed twice", s);
        }
      }
      break;
    }
    }
    w->ops++;
  }
  return NULL;
}

/* The "release": claims shared orphans through iteration and CAS, racing the workers' takes. */
static int claim_shared(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)arg;
  if (r->key < shared_key(0) || r->key >= shared_key(SHARED) || r->state != GR_ST_ORPHAN)
    return 0;
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_DELETED;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN)
    if (expect.state != GR_ST_ORPHAN)
      return 0;
  if (rc == 0) {
    unsigned s = (unsigned)((r->key - shared_key(0)) / 256);
    atomic_fetch_add(&g_shared_claims, 1);
    unsigned one = 1;
    CHECK(atomic_compare_exchange_strong(&g_shared_state[s], &one, 0), "shared %u claimed twice (release)", s);
  }
  return 0;
}

typedef struct {
  unsigned char seen[STABLE];
  _Atomic uint64_t passes;
} iter_t;

static int count_stable(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  iter_t *it = arg;
  if (r->key >= key_of(0) && r->key < key_of(STABLE)) {
    unsigned i = (unsigned)((r->key - key_of(0)) / 256);
    CHECK(it->seen[i] == 0, "stable record %u seen twice in one pass", i);
    CHECK(r->size == 7, "stable record %u torn", i);
    it->seen[i] = 1;
  }
  return 0;
}

static void *iterator(void *arg) {
  iter_t *it = arg;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    memset(it->seen, 0, sizeof it->seen);
    gr_table_visit(count_stable, it);
    for (unsigned i = 0; i < STABLE; i++)
      CHECK(it->seen[i] == 1, "stable record %u missed", i);
    gr_table_visit(claim_shared, NULL);
    it->passes++;
  }
  return NULL;
}

static void *compactor(void *arg) {
  _Atomic uint64_t *n = arg;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    gr_table_compact();
    (*n)++;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  unsigned nthreads = argc > 1 ? (unsigned)atoi(argv[1]) : 4;
  double seconds = argc > 2 ? atof(argv[2]) : 2.0;
  CHECK(nthreads >= 1 && nthreads <= 64, "threads 1..64");
  CHECK(gr_table_init() == 0, "init");
  for (unsigned i = 0; i < STABLE; i++) {
    gr_rec_t r = mkrec(key_of(i), GR_ST_LIVE, 7);
    CHECK(gr_table_insert(&r) == 0, "stable insert");
  }
  worker_t *ws = calloc(nthreads, sizeof *ws);
  pthread_t *th = calloc(nthreads, sizeof *th);
  static iter_t it;
  _Atomic uint64_t compactions = 0;
  pthread_t ith, cth;
  for (unsigned i = 0; i < nthreads; i++) {
    ws[i].id = i;
    th[i] = gr_thread_start(worker, &ws[i]);
  }
  ith = gr_thread_start(iterator, &it);
  cth = gr_thread_start(compactor, &compactions);
  /* At least `seconds`, and until the iterator and the compactor have each run twice during the churn: on a
   * loaded machine they may get no time slice for a while. They must all the same within MAX_SECONDS. */
  enum { MIN_PASSES = 2, MAX_SECONDS = 120 };
  struct timespec tick = {0, 10000000};
  for (double waited = 0; waited < MAX_SECONDS; waited += 0.01) {
    if (waited >= seconds && atomic_load(&it.passes) >= MIN_PASSES && atomic_load(&compactions) >= MIN_PASSES)
      break;
    nanosleep(&tick, NULL);
  }
  atomic_store(&g_stop, 1);
  for (unsigned i = 0; i < nthreads; i++)
    gr_thread_join(th[i]);
  gr_thread_join(ith);
  gr_thread_join(cth);

  /* The table equals the models: every modelled key present, nothing else in the workers' ranges. */
  uint64_t expected = STABLE, ops = 0;
  for (unsigned w = 0; w < nthreads; w++) {
    ops += ws[w].ops;
    for (unsigned k = 0; k < KEYS_PER_WORKER; k++) {
      int rc = gr_table_lookup(GR_KS_ADDR, worker_key(w, k), GR_PRESENT_MASK, NULL);
      CHECK((rc == 0) == (ws[w].present[k] == 1), "final: worker %u key %u rc %d model %d", w, k, rc,
            ws[w].present[k]);
      expected += ws[w].present[k];
    }
  }
  uint64_t live_shared = 0;
  for (unsigned s = 0; s < SHARED; s++)
    live_shared += atomic_load(&g_shared_state[s]) == 1;
  expected += live_shared;
  CHECK(gr_epoch_live_sum() == (int64_t)expected, "live count %lld, expected %llu",
        (long long)gr_epoch_live_sum(), (unsigned long long)expected);
  /* Every shared orphan ever inserted was claimed exactly once, or is still there. */
  CHECK(atomic_load(&g_shared_inserted) == atomic_load(&g_shared_claims) + live_shared,
        "shared: inserted %llu, claimed %llu, present %llu", (unsigned long long)atomic_load(&g_shared_inserted),
        (unsigned long long)atomic_load(&g_shared_claims), (unsigned long long)live_shared);
  CHECK(gr_table_check() == 0, "invariants: %d", gr_table_check());
  CHECK(it.passes >= MIN_PASSES && compactions >= MIN_PASSES, "iterator/compactor did not run in %ds: %llu, %llu",
        MAX_SECONDS, (unsigned long long)it.passes, (unsigned long long)compactions);
  printf("stress_table: %u threads, %.1fs: %llu ops, %llu iterations, %llu compactions, %llu migrations, "
         "%llu shared claims, %llu live\n",
         nthreads, seconds, (unsigned long long)ops, (unsigned long long)it.passes,
         (unsigned long long)compactions, (unsigned long long)gr_table_migrations(),
         (unsigned long long)atomic_load(&g_shared_claims), (unsigned long long)expected);
  free(ws);
  free(th);
  return 0;
}
