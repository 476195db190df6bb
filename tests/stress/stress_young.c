/*
 * stress_young -- the logs of young records (table.c) under everything that reads them from elsewhere, while the
 * table migrates. Standalone (runs under ThreadSanitizer). Usage: stress_young [owners] [seconds]
 *
 * Owner threads allocate (gr_table_insert_young) and free in waves that aim at a few, hundreds or more than a log
 * holds (GR_YOUNG_MAX) blocks live, so that their logs grow from the inline slots to a mapping, between the drains
 * that the other threads' reads make; they hand some blocks to a consumer thread, which frees them while they are young, and publish some as
 * orphans (table inserts) that a releaser claims in rounds as release.c does (gr_table_visit_from, resuming where
 * the last round stopped, then a CAS to RECLAIMING and the free) and that the owner may free itself meanwhile.
 * An owner thread exits with blocks still live in its log, and a new thread, which may be given the exited one's
 * thread record and with it the log, frees them later. A compactor forces migrations and drains the logs.
 * Every free finds its record once with its payload whole, every orphan goes exactly once, every record a visit
 * shows is whole, every insert returns 0, and at the end the table holds exactly what the model says is live.
 * It found settles and compactions that mapped a generation too small for what the old one held by the time it
 * was linked (a drain had moved thousands of records in meanwhile): the migration could never finish, and every
 * insert then spun for ever (about one run in 20 of 4 owners hung; test_table_stranded has the deterministic
 * cases).
 */
#include "check.h"
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS 8192u /* per owner: more than a log holds */
#define MAX_OWNERS 16u
#define Q 4096u

enum { ABSENT, LIVE, HANDED, ORPHAN };

static uint64_t key_of(unsigned o, unsigned k) { return UINT64_C(0x300000000000) + ((uint64_t)o * KEYS + k) * 512; }
static uint64_t size_of(uint64_t key) { return (key >> 9) & 0xffffff; } /* the payload tells a record's key */

typedef struct {
  _Atomic unsigned state[KEYS];
  unsigned live; /* LIVE keys: the owner lineage's own count */
  uint64_t seed;
} range_t;

static range_t g_range[MAX_OWNERS];
static _Atomic int g_stop;
static _Atomic uint64_t g_lives, g_exits_with_live, g_claimed, g_orphan_takes, g_handed, g_rounds;

static gr_packed_t mk(uint64_t key, unsigned state) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = key;
  r.size = size_of(key);
  r.kind = 1; /* GPURECLAIM_KIND_DEVICE */
  r.state = (uint8_t)state;
  r.device = 0;
  r.ctx_id = 1;
  r.site.bits = key ^ 0x5a5a;
  gr_packed_t p;
  gr_pk_pack(&r, &p);
  return p;
}

static void check_payload(uint64_t key, const gr_rec_t *r, const char *what) {
  CHECK(r->key == key && r->size == size_of(key) && r->site.bits == (key ^ 0x5a5a) && r->kind == 1 && r->ctx_id == 1,
        "%s: the record of %#llx came back as key %#llx size %llu", what, (unsigned long long)key,
        (unsigned long long)r->key, (unsigned long long)r->size);
}

/* ---- the consumer's queue ---- */
static uint64_t g_q[Q];
static unsigned g_q_head, g_q_tail;
static pthread_mutex_t g_q_mu = PTHREAD_MUTEX_INITIALIZER;

static bool push(uint64_t key) {
  pthread_mutex_lock(&g_q_mu);
  bool ok = g_q_tail - g_q_head < Q;
  if (ok)
    g_q[g_q_tail++ % Q] = key;
  pthread_mutex_unlock(&g_q_mu);
  return ok;
}

static uint64_t pop(void) {
  pthread_mutex_lock(&g_q_mu);
  uint64_t key = g_q_head < g_q_tail ? g_q[g_q_head++ % Q] : 0;
  pthread_mutex_unlock(&g_q_mu);
  return key;
}

static unsigned owner_of(uint64_t key) { return (unsigned)(((key - key_of(0, 0)) / 512) / KEYS); }
static unsigned index_of(uint64_t key) { return (unsigned)(((key - key_of(0, 0)) / 512) % KEYS); }

/* ---- owners ---- */

static void take_live(unsigned o, unsigned k, const char *what) {
  uint64_t key = key_of(o, k);
  gr_rec_t r;
  int rc = gr_table_take(GR_KS_ADDR, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), &r);
  CHECK(rc == 0, "%s of live key %u/%u: %d", what, o, k, rc);
  CHECK(r.state == GR_ST_LIVE, "%s: live key %u/%u in state %u", what, o, k, r.state);
  check_payload(key, &r, what);
}

/* One life of an owner of range o: `steps` operations keeping about `target` blocks live, then the thread exits
 * with what is live still in its log. */
typedef struct {
  unsigned o, target, steps;
} life_t;

static void *owner_life(void *arg) {
  life_t *l = arg;
  range_t *g = &g_range[l->o];
  CHECK(gr_epoch_self() != NULL, "no thread record");
  for (unsigned s = 0; s < l->steps && !atomic_load_explicit(&g_stop, memory_order_relaxed); s++) {
    uint64_t x = gr_rng(&g->seed);
    unsigned k = (unsigned)(x % KEYS), op = (unsigned)((x >> 32) % 16);
    uint64_t key = key_of(l->o, k);
    unsigned st = atomic_load(&g->state[k]);
    if (op < 9) { /* allocate, or free one of its own */
      if (st == ABSENT && g->live < l->target) {
        gr_packed_t p = mk(key, GR_ST_LIVE);
        CHECK(gr_table_insert_young(&p) == 0, "young insert");
        atomic_store(&g->state[k], LIVE);
        g->live++;
      } else if (st == LIVE && (g->live >= l->target || (x >> 40) % 4 == 0)) {
        take_live(l->o, k, "owner's free");
        atomic_store(&g->state[k], ABSENT);
        g->live--;
      }
    } else if (op < 11) { /* a block freed by another thread while young (not in the lives that fill a log) */
      if (st == LIVE) {
        atomic_store(&g->state[k], HANDED); /* before the push: the consumer may free it at once */
        if (push(key)) {
          g->live--;
          atomic_fetch_add(&g_handed, 1);
        } else {
          atomic_store(&g->state[k], LIVE);
        }
      }
    } else if (op < 13) { /* an orphan (a scoped block whose scope ended: never young) */
      if (st == ABSENT) {
        atomic_store(&g->state[k], ORPHAN); /* before the insert: the releaser may claim it at once */
        gr_rec_t r;
        gr_packed_t p = mk(key, GR_ST_ORPHAN);
        gr_pk_unpack(&p, &r);
        CHECK(gr_table_insert(&r) == 0, "orphan insert");
      }
    } else if (op < 14) { /* the program frees an orphan itself, racing the releaser */
      if (st == ORPHAN) {
        gr_rec_t r;
        if (gr_table_take(GR_KS_ADDR, key, GR_STMASK(GR_ST_ORPHAN) | GR_NOT_YOUNG, &r) == 0) {
          check_payload(key, &r, "orphan free");
          unsigned was = ORPHAN;
          CHECK(atomic_compare_exchange_strong(&g->state[k], &was, ABSENT), "orphan %u/%u freed twice", l->o, k);
          atomic_fetch_add(&g_orphan_takes, 1);
        }
      }
    } else { /* a lookup */
      if (st == LIVE) {
        gr_rec_t r;
        CHECK(gr_table_lookup(GR_KS_ADDR, key, GR_STMASK(GR_ST_LIVE), &r) == 0, "lookup of live key %u/%u", l->o, k);
        check_payload(key, &r, "lookup");
      }
    }
  }
  if (g->live)
    atomic_fetch_add(&g_exits_with_live, 1);
  atomic_fetch_add(&g_lives, 1);
  return NULL;
}

static void *owner_lineage(void *arg) {
  unsigned o = (unsigned)(uintptr_t)arg;
  static const unsigned targets[] = {12, 400, 3000, GR_YOUNG_MAX + 700, 60};
  for (unsigned life = 0; !atomic_load(&g_stop); life++) {
    unsigned target = targets[(life + o) % 5];
    life_t l = {o, target, 4000 + (unsigned)(gr_rng(&g_range[o].seed) % 20000)};
    pthread_t t = gr_thread_start(owner_life, &l);
    gr_thread_join(t);
  }
  return NULL;
}

/* ---- the consumer ---- */

static void *consumer(void *arg) {
  (void)arg;
  CHECK(gr_epoch_self() != NULL, "no thread record");
  for (;;) {
    uint64_t key = pop();
    if (!key) {
      if (atomic_load(&g_stop) == 2)
        return NULL;
      sched_yield();
      continue;
    }
    unsigned o = owner_of(key), k = index_of(key);
    take_live(o, k, "consumer's free");
    unsigned was = HANDED;
    CHECK(atomic_compare_exchange_strong(&g_range[o].state[k], &was, ABSENT), "handed key %u/%u in state %u", o, k,
          was);
  }
}

/* ---- the releaser: rounds of claims as release.c makes them ---- */

#define ROUND 37
typedef struct {
  gr_rec_t claimed[ROUND];
  unsigned n;
  bool more;
} round_t;

static int claim(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  round_t *j = arg;
  if (r->key >= key_of(0, 0) && r->key < key_of(MAX_OWNERS, 0))
    check_payload(r->key, r, "visit");
  if (r->state != GR_ST_ORPHAN)
    return 0;
  if (j->n == ROUND) {
    j->more = true;
    return 1; /* the next round begins with this one */
  }
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_RECLAIMING;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN) {
    if (expect.state != GR_ST_ORPHAN)
      return 0;
    want = expect;
    want.state = GR_ST_RECLAIMING;
  }
  if (rc == 0)
    j->claimed[j->n++] = expect;
  return 0;
}

static bool to_deleted(gr_rec_t *r, void *arg) {
  (void)arg;
  r->state = GR_ST_DELETED;
  return true;
}

static void *releaser(void *arg) {
  (void)arg;
  CHECK(gr_epoch_self() != NULL, "no thread record");
  round_t j;
  while (!atomic_load(&g_stop)) {
    gr_visit_pos_t pos = {0};
    do {
      j.n = 0;
      j.more = false;
      gr_table_visit_from(&pos, claim, &j);
      atomic_fetch_add(&g_rounds, 1);
      for (unsigned i = 0; i < j.n; i++) {
        uint64_t key = j.claimed[i].key;
        check_payload(key, &j.claimed[i], "claim");
        gr_rec_t before;
        CHECK(gr_table_update(GR_KS_ADDR, key, GR_STMASK(GR_ST_RECLAIMING), to_deleted, NULL, &before) == 0,
              "the claimed record of %#llx is gone", (unsigned long long)key);
        unsigned o = owner_of(key), k = index_of(key), was = ORPHAN;
        CHECK(atomic_compare_exchange_strong(&g_range[o].state[k], &was, ABSENT), "orphan %u/%u in state %u claimed",
              o, k, was);
        atomic_fetch_add(&g_claimed, 1);
      }
    } while (j.more && !atomic_load(&g_stop));
  }
  return NULL;
}

/* ---- migrations and drains ---- */

static void *compactor(void *arg) {
  (void)arg;
  CHECK(gr_epoch_self() != NULL, "no thread record");
  for (unsigned i = 0; !atomic_load(&g_stop); i++) {
    if (i % 4 == 0)
      gr_table_compact();
    else
      gr_table_drain();
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int count_rec(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  if (r->key >= key_of(0, 0) && r->key < key_of(MAX_OWNERS, 0))
    check_payload(r->key, r, "final visit");
  ++*(uint64_t *)arg;
  return 0;
}

int main(int argc, char **argv) {
  unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 4;
  double secs = argc > 2 ? atof(argv[2]) : 2;
  if (n < 1 || n > MAX_OWNERS)
    n = 4;
  CHECK(gr_table_init() == 0, "init");
  CHECK(gr_epoch_self() != NULL, "no thread record");
  for (unsigned o = 0; o < MAX_OWNERS; o++)
    g_range[o].seed = gr_rng_stream(o + 1);
  pthread_t own[MAX_OWNERS], con, rel, cmp;
  for (unsigned o = 0; o < n; o++)
    own[o] = gr_thread_start(owner_lineage, (void *)(uintptr_t)o);
  con = gr_thread_start(consumer, NULL);
  rel = gr_thread_start(releaser, NULL);
  cmp = gr_thread_start(compactor, NULL);
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(&g_stop, 1);
  for (unsigned o = 0; o < n; o++)
    gr_thread_join(own[o]);
  gr_thread_join(rel);
  gr_thread_join(cmp);
  atomic_store(&g_stop, 2); /* the consumer empties its queue, then stops */
  gr_thread_join(con);

  /* What the model holds live is in the table or in a log (of this thread's record or another's), each once. */
  uint64_t live = 0, orphans = 0;
  for (unsigned o = 0; o < n; o++)
    for (unsigned k = 0; k < KEYS; k++) {
      unsigned st = atomic_load(&g_range[o].state[k]);
      CHECK(st == ABSENT || st == LIVE || st == ORPHAN, "key %u/%u left in state %u", o, k, st);
      live += st == LIVE;
      orphans += st == ORPHAN;
    }
  uint64_t seen = 0;
  CHECK(gr_table_visit(count_rec, &seen) == 0, "visit");
  CHECK(seen == live + orphans, "the table holds %llu records, the model %llu live and %llu orphans",
        (unsigned long long)seen, (unsigned long long)live, (unsigned long long)orphans);
  for (unsigned o = 0; o < n; o++)
    for (unsigned k = 0; k < KEYS; k++) {
      unsigned st = atomic_load(&g_range[o].state[k]);
      gr_rec_t r;
      if (st == LIVE) {
        take_live(o, k, "final free");
      } else if (st == ORPHAN) {
        CHECK(gr_table_take(GR_KS_ADDR, key_of(o, k), GR_STMASK(GR_ST_ORPHAN), &r) == 0, "orphan %u/%u lost", o, k);
        check_payload(key_of(o, k), &r, "final orphan free");
      }
    }
  seen = 0;
  gr_table_visit(count_rec, &seen);
  CHECK(seen == 0, "%llu records left after every block was freed", (unsigned long long)seen);
  CHECK(gr_epoch_live_sum() == 0, "live sum %lld", (long long)gr_epoch_live_sum());
  gr_table_compact();
  int rc = gr_table_check();
  CHECK(rc == 0, "table check: line %d", -rc);
  printf("stress_young: %u owners, %llu lives (%llu ended with blocks live), %llu handed, "
         "%llu orphans claimed in %llu rounds, %llu freed by their owner, %llu migrations\n",
         n, (unsigned long long)g_lives, (unsigned long long)g_exits_with_live,
         (unsigned long long)g_handed, (unsigned long long)g_claimed, (unsigned long long)g_rounds,
         (unsigned long long)g_orphan_takes, (unsigned long long)gr_table_migrations());
  CHECK(g_lives > 0 && g_exits_with_live > 0 && g_handed > 0 && g_claimed > 0 && g_rounds > 1,
        "a part of the scenario never ran");
  return 0;
}
