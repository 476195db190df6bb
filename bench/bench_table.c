/*
 * bench_table -- gpureclaim's lock-free table against a mutex-protected table with the same operations, at 1, 2,
 * 4, 8 and 16 threads, with many blocks held live while the threads churn.
 *
 * Usage: bench_table [seconds-per-point, default 0.2] [window, default 64] [held, default 100000] [reps, default 5]
 *                    [N ..., default 100000 1000000]
 *   Both tables first get `held` blocks that stay live for the whole run (while they grow, the memory each maps
 *   is sampled after every insert: the peak per block is the moment an old and a new generation, or array, are
 *   mapped side by side). Then each thread inserts a block and deletes the block it inserted `window` pairs
 *   earlier, as a program allocating and freeing does, over its own addresses, for `seconds` per point. Each
 *   point runs `reps` times, the two tables alternating, and prints min and median of:
 *     CPU ns/pair  thread CPU time (CLOCK_THREAD_CPUTIME_ID) of all threads / pairs: what one pair costs;
 *     Mpairs/s     pairs of all threads / wall time: throughput, where contention shows.
 *   Two address patterns: ever new (every allocation an address never seen before, so every thread writes
 *   slots all over the table) and reused (a freed address comes back, as from a pool: each thread cycles
 *   through `window` addresses).
 *   Last, memory per tracked block: steady (after the run, mapped bytes / live blocks) and the peak while
 *   growing to `held` blocks (counted from 4096 blocks on: below, the minimum sizes dominate).
 * Then, for each N, the lock-free table at scale, alone on one thread (thread CPU time, one run each: these are
 * counts and sizes as much as times):
 *   grow        N records inserted into the smallest generation: ns per insert (migrations included),
 *               migrations, and the most bytes mapped per record at any moment (from 4096 records on, sampled
 *               every 256th insert: a migration's two generations side by side);
 *   steady      then two windows of inserts and takes at N live (what a program's steady loop does): bytes per
 *               record, and the migrations (the generation settling to the size it needs);
 *   free loop   the N taken in a loop: ns per take, migrations (none: a take never migrates);
 *   oscillation 0 -> N -> 0, eight times from the smallest generation: ns per insert+take pair over cycles 5-8,
 *               migrations in cycle 1 (growth), in cycles 2-4 (the window that settles) and in cycles 5-8;
 *   release     N orphans released as gpureclaim_release() does it to the table (release.c): rounds of 4,096
 *               claims (ORPHAN -> RECLAIMING, the visit resuming where the last round stopped), then each moved
 *               to RECLAIMED (the first 65,536: tombstones) or DELETED: ms, ns per orphan, and the probe bound
 *               left among the tombstones once the table has been compacted to them.
 *   The release line ends with the time of the largest N over the smallest, and their ratio.
 * BENCH_LOCKFREE_ONLY=1 skips the mutex table.
 *
 * The mutex table: one pthread mutex around an open-addressing array of 40-byte records (linear probing,
 * tombstones, rebuilt at 85% used into an array sized for 75% live), the simple design the lock-free one has
 * to beat.
 */
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the baseline: a mutex around an open-addressing array ---- */
typedef struct {
  uint64_t ctl, key, w1, w2, w3;
} lslot_t;

typedef struct {
  pthread_mutex_t lock;
  lslot_t *s;
  uint64_t cap, used, live;
  size_t bytes, peak_bytes; /* mapped now; most ever mapped at once (old and new array during a rebuild) */
  double peak_per_block;    /* most bytes per live block while rebuilding, from 4096 blocks on */
} ltable_t;

static ltable_t g_lt = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0, 0, 0, 0};

static uint64_t lhash(uint64_t k, uint64_t cap) {
  uint64_t h = k * UINT64_C(0x9E3779B97F4A7C15);
  h ^= h >> 29;
  return (uint64_t)(((unsigned __int128)h * cap) >> 64);
}

static void lt_rehash(uint64_t cap) {
  lslot_t *old = g_lt.s;
  uint64_t ocap = g_lt.cap;
  g_lt.s = calloc(cap, sizeof *g_lt.s);
  if (!g_lt.s)
    abort();
  size_t both = g_lt.bytes + cap * sizeof *g_lt.s;
  if (g_lt.live >= 4096 && (double)both / (double)g_lt.live > g_lt.peak_per_block)
    g_lt.peak_per_block = (double)both / (double)g_lt.live;
  g_lt.cap = cap;
  g_lt.used = 0;
  for (uint64_t i = 0; i < ocap; i++)
    if (old[i].ctl == 2) {
      uint64_t j = lhash(old[i].key, cap);
      while (g_lt.s[j].ctl)
        j = j + 1 == cap ? 0 : j + 1;
      g_lt.s[j] = old[i];
      g_lt.used++;
    }
  free(old);
  g_lt.bytes = cap * sizeof *g_lt.s;
}

static void lt_insert(uint64_t key, uint64_t size) {
  pthread_mutex_lock(&g_lt.lock);
  if (!g_lt.s)
    lt_rehash(1024);
  uint64_t i = lhash(key, g_lt.cap);
  while (g_lt.s[i].ctl == 2)
    i = i + 1 == g_lt.cap ? 0 : i + 1;
  if (g_lt.s[i].ctl == 0)
    g_lt.used++;
  g_lt.s[i] = (lslot_t){2, key, size, 0, 0};
  g_lt.live++;
  if (g_lt.used * 1000 >= g_lt.cap * 850)
    lt_rehash(g_lt.live * 1000 / 750 + 1024);
  pthread_mutex_unlock(&g_lt.lock);
}

static void lt_delete(uint64_t key) {
  pthread_mutex_lock(&g_lt.lock);
  for (uint64_t i = lhash(key, g_lt.cap); g_lt.s[i].ctl; i = i + 1 == g_lt.cap ? 0 : i + 1)
    if (g_lt.s[i].ctl == 2 && g_lt.s[i].key == key) {
      g_lt.s[i].ctl = 7;
      g_lt.live--;
      break;
    }
  pthread_mutex_unlock(&g_lt.lock);
}

/* ---- the run ---- */
#define MAXT 16
typedef struct {
  int id, lockfree;
  unsigned window;
  _Atomic int *go, *stop;
  uint64_t first, pairs; /* pair numbers [first, first + pairs) */
  double cpu_ns;
} arg_t;

/* Addresses: thread t's i-th allocation. With reuse (a pool hands freed addresses out again) from a per-thread
 * range of g_reuse addresses, else ever new. The held blocks use thread number MAXT. */
static uint64_t g_reuse;
static uint64_t g_next[MAXT]; /* first pair number of each thread's next point: ever-new stays new */
static uint64_t key_of(int t, uint64_t i) {
  return UINT64_C(0x200000000000) + ((uint64_t)t << 40) + (g_reuse ? i % g_reuse : i) * 256;
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The record as an allocation hook hands it to the table: packed once (gr_packed_t), only the key changing from
 * block to block, inserted and taken through the calls the hooks use (gr_table_insert_ks, gr_table_take_kind_pk).
 * The mutex table, likewise, is given the key and size and stores them as they come. */
static gr_packed_t rec_for(uint64_t key) {
  gr_packed_t p = {.ctl = GR_ST_LIVE, .key = key, .w1 = gr_pk_w1(4096, 1, 0, 0)};
  return p;
}

static void lf_insert(gr_packed_t *p, uint64_t key) {
  p->key = key;
  gr_table_insert_ks(p, GR_KS_ADDR);
}

static void lf_delete(uint64_t key) {
  gr_table_take_kind_pk(GR_KS_ADDR, key, GR_STMASK(GR_ST_LIVE), ~0u, NULL);
}

static void *run(void *p) {
  arg_t *a = p;
  gr_packed_t r = rec_for(0);
  uint64_t i = a->first, end_fill = a->first + a->window;
  /* Fill the window before the clock starts: every timed pair is one delete and one insert. */
  for (; i < end_fill; i++) {
    if (a->lockfree) {
      lf_insert(&r, key_of(a->id, i));
    } else {
      lt_insert(key_of(a->id, i), 4096);
    }
  }
  while (!atomic_load_explicit(a->go, memory_order_acquire))
    ;
  double c0 = cpu_now();
  uint64_t n = 0;
  while (!atomic_load_explicit(a->stop, memory_order_relaxed)) {
    for (int k = 0; k < 256; k++, i++, n++) {
      /* Free first, then allocate: with reuse, the address just freed is the one handed out again. */
      if (a->lockfree) {
        lf_delete(key_of(a->id, i - a->window));
        lf_insert(&r, key_of(a->id, i));
      } else {
        lt_delete(key_of(a->id, i - a->window));
        lt_insert(key_of(a->id, i), 4096);
      }
    }
  }
  a->cpu_ns = cpu_now() - c0;
  a->pairs = n;
  /* Leave the table as it was: only the held blocks. */
  for (uint64_t j = i - a->window; j < i; j++) {
    if (a->lockfree)
      lf_delete(key_of(a->id, j));
    else
      lt_delete(key_of(a->id, j));
  }
  g_next[a->id] = i;
  return NULL;
}

typedef struct {
  double cpu, mps; /* CPU ns per pair, million pairs per second (wall) */
} fig_t;

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static fig_t point(int threads, int lockfree, double secs, unsigned window) {
  _Atomic int go = 0, stop = 0;
  pthread_t th[MAXT];
  arg_t args[MAXT];
  for (int t = 0; t < threads; t++) {
    args[t] = (arg_t){t, lockfree, window, &go, &stop, g_next[t], 0, 0};
    pthread_create(&th[t], NULL, run, &args[t]);
  }
  usleep(10000); /* let every thread fill its window */
  double t0 = wall_now();
  atomic_store_explicit(&go, 1, memory_order_release);
  struct timespec d = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  nanosleep(&d, NULL);
  atomic_store(&stop, 1);
  double el = wall_now() - t0;
  uint64_t pairs = 0;
  double cpu = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(th[t], NULL);
    pairs += args[t].pairs;
    cpu += args[t].cpu_ns;
  }
  return (fig_t){cpu / (double)pairs, (double)pairs / el / 1e6};
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double med(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmpd);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One table of figures for one address pattern. */
static void series(double secs, unsigned window, int reps, bool reuse, bool with_mutex) {
  g_reuse = reuse ? window : 0;
  if (reuse)
    printf("\naddresses reused: each thread's freed addresses come back (%u per thread), as from a pool\n", window);
  else
    printf("\naddresses ever new: every allocation gets an address never seen before\n");
  printf("%7s | %-28s | %-28s | %8s %11s\n", "", "lock-free", "mutex", "lf/mutex", "");
  printf("%7s | %8s %8s %10s | %8s %8s %10s | %8s %11s\n", "threads", "CPU min", "CPU med", "Mpairs/s", "CPU min",
         "CPU med", "Mpairs/s", "CPU med", "migrations");
  static const int counts[] = {1, 2, 4, 8, 16};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    int t = counts[c];
    double lc[64], lm[64], mc[64], mm[64];
    uint64_t m0 = gr_table_migrations();
    for (int r = 0; r < reps; r++)
      for (int o = 0; o < 2; o++) {
        int lf = o ^ (r & 1); /* alternate which goes first */
        if (!lf && !with_mutex)
          continue;
        fig_t f = point(t, lf, secs, window);
        if (lf)
          lc[r] = f.cpu, lm[r] = f.mps;
        else
          mc[r] = f.cpu, mm[r] = f.mps;
      }
    unsigned long long migr = (unsigned long long)(gr_table_migrations() - m0);
    double lmed = med(lc, reps), lmps = med(lm, reps);
    if (with_mutex) {
      double mmed = med(mc, reps), mmps = med(mm, reps);
      printf("%7d | %8.1f %8.1f %10.2f | %8.1f %8.1f %10.2f | %7.2fx %11llu\n", t, lc[0], lmed, lmps, mc[0], mmed,
             mmps, lmed / mmed, migr);
    } else {
      printf("%7d | %8.1f %8.1f %10.2f | %8s %8s %10s | %8s %11llu\n", t, lc[0], lmed, lmps, "-", "-", "-", "-", migr);
    }
    fflush(stdout);
  }
}

/* ---- at scale: the lock-free table alone, one thread ---- */

static uint64_t scale_key(uint64_t i) { return UINT64_C(0x500000000000) + i * 512; }

static double wall_ms(void) { return wall_now() * 1e3; }

static void scale_fill(uint64_t first, uint64_t n, unsigned state) {
  gr_packed_t p = rec_for(0);
  p.ctl = state;
  for (uint64_t i = first; i < first + n; i++)
    lf_insert(&p, scale_key(i));
}

static void scale_take(uint64_t first, uint64_t n) {
  for (uint64_t i = first; i < first + n; i++)
    lf_delete(scale_key(i));
}

#define ROUND 4096
typedef struct {
  gr_rec_t claimed[ROUND];
  size_t n;
} round_t;

static int claim(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  round_t *j = arg;
  if (r->state != GR_ST_ORPHAN)
    return 0;
  if (j->n == ROUND)
    return 1; /* the next round begins with this record */
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_RECLAIMING;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN)
    want = expect, want.state = GR_ST_RECLAIMING;
  if (rc == 0)
    j->claimed[j->n++] = expect;
  return 0;
}

static int by_key(const void *a, const void *b) {
  uint64_t x = ((const gr_rec_t *)a)->key, y = ((const gr_rec_t *)b)->key;
  return (x > y) - (x < y);
}

static bool to_state(gr_rec_t *r, void *arg) {
  r->state = *(const uint8_t *)arg;
  return true;
}

/* The table's side of releasing every orphan, as release.c's free_pass does it (the driver's frees left out). */
static uint64_t release_orphans(void) {
  static round_t j;
  gr_visit_pos_t pos = {0};
  uint64_t tombs = 0;
  bool more;
  do {
    j.n = 0;
    more = gr_table_visit_from(&pos, claim, &j) != 0;
    qsort(j.claimed, j.n, sizeof j.claimed[0], by_key);
    for (size_t i = 0; i < j.n; i++) {
      uint8_t st = tombs < 65536 ? GR_ST_RECLAIMED : GR_ST_DELETED;
      tombs += st == GR_ST_RECLAIMED;
      gr_table_update(GR_KS_ADDR, j.claimed[i].key, GR_STMASK(GR_ST_RECLAIMING), to_state, &st, NULL);
    }
  } while (more);
  return tombs;
}

static void at_scale(const long *sizes, int nsizes) {
  printf("\nat scale: the lock-free table alone, one thread, N records (thread CPU time; release: wall time too)\n");
  printf("%9s | %-26s | %-14s | %-14s | %-29s | %s\n", "", "grow", "steady", "free loop",
         "oscillation 0 -> N -> 0, x 8", "release of N orphans");
  printf("%9s | %8s %6s %10s | %6s %7s | %7s %6s | %8s %6s %6s %6s | %8s %8s %8s %6s\n", "N", "ns/ins", "migr",
         "peak B/rec", "B/rec", "migr", "ns/take", "migr", "ns/pair", "m 1", "m 2-4", "m 5-8", "CPU ms", "wall ms",
         "ns/orph", "probes");
  double first_ms = 0, last_ms = 0;
  for (int k = 0; k < nsizes; k++) {
    uint64_t n = (uint64_t)sizes[k], base = (uint64_t)k << 32;
    /* grow, from the smallest generation */
    gr_table_compact();
    uint64_t m0 = gr_table_migrations();
    gr_table_bytes_peak(true);
    double c0 = cpu_now(), peak = 0;
    gr_packed_t p = rec_for(0);
    for (uint64_t i = 0; i < n; i++) {
      lf_insert(&p, scale_key(base + i));
      if (i + 1 >= 4096 && (i & 255) == 0) { /* sampled: the peak lasts a whole migration */
        double per = (double)gr_table_bytes_peak(true) / (double)(i + 1);
        peak = per > peak ? per : peak;
      }
    }
    double grow_ns = (cpu_now() - c0) / (double)n;
    uint64_t m_grow = gr_table_migrations() - m0;
    /* steady: two windows of churn at n live */
    m0 = gr_table_migrations();
    uint64_t churn = 2 * gr_table_capacity() + 2 * n;
    for (uint64_t i = 0; i < churn; i++) {
      lf_insert(&p, scale_key(base + n + i));
      lf_delete(scale_key(base + i));
    }
    gr_epoch_reclaim();
    gr_epoch_reclaim();
    double steady = (double)gr_table_bytes() / (double)n;
    uint64_t m_steady = gr_table_migrations() - m0;
    /* free loop */
    m0 = gr_table_migrations();
    c0 = cpu_now();
    scale_take(base + churn, n);
    double take_ns = (cpu_now() - c0) / (double)n;
    uint64_t m_free = gr_table_migrations() - m0;
    /* oscillation, from the smallest generation */
    gr_table_compact();
    uint64_t mc[9];
    double osc_ns = 0;
    mc[0] = gr_table_migrations();
    for (int c = 0; c < 8; c++) {
      c0 = cpu_now();
      scale_fill(base + (uint64_t)(c & 1) * n, n, GR_ST_LIVE);
      scale_take(base + (uint64_t)(c & 1) * n, n);
      if (c >= 4)
        osc_ns += cpu_now() - c0;
      mc[c + 1] = gr_table_migrations();
    }
    osc_ns /= 4.0 * (double)n;
    /* release */
    scale_fill(base, n, GR_ST_ORPHAN);
    c0 = cpu_now();
    double w0 = wall_ms();
    uint64_t tombs = release_orphans();
    double rel_ms = (cpu_now() - c0) / 1e6, rel_wall = wall_ms() - w0;
    gr_table_compact();
    uint64_t probes = gr_table_probe_bound();
    for (uint64_t i = 0; i < n; i++) /* the tombstones, as allocations of their addresses would */
      gr_table_take(GR_KS_ADDR, scale_key(base + i), GR_STMASK(GR_ST_RECLAIMED), NULL);
    if (tombs != (n < 65536 ? n : 65536) || gr_epoch_live_sum() != 0)
      fprintf(stderr, "bench_table: the release left %lld records\n", (long long)gr_epoch_live_sum());
    printf("%9llu | %8.1f %6llu %10.1f | %6.1f %7llu | %7.1f %6llu | %8.1f %6llu %6llu %6llu | %8.1f %8.1f %8.1f "
           "%6llu\n",
           (unsigned long long)n, grow_ns, (unsigned long long)m_grow, peak, steady, (unsigned long long)m_steady,
           take_ns, (unsigned long long)m_free, osc_ns, (unsigned long long)(mc[1] - mc[0]),
           (unsigned long long)(mc[4] - mc[1]), (unsigned long long)(mc[8] - mc[4]), rel_ms, rel_wall,
           rel_ms * 1e6 / (double)n, (unsigned long long)probes);
    fflush(stdout);
    if (k == 0)
      first_ms = rel_ms;
    last_ms = rel_ms;
  }
  if (nsizes > 1)
    printf("release: N = %ld took %.2fx the CPU time of N = %ld (%.1fx the records)\n", sizes[nsizes - 1],
           first_ms > 0 ? last_ms / first_ms : 0.0, sizes[0], (double)sizes[nsizes - 1] / (double)sizes[0]);
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.2;
  long window = argc > 2 ? atol(argv[2]) : 64, held = argc > 3 ? atol(argv[3]) : 100000;
  int reps = argc > 4 ? atoi(argv[4]) : 5;
  long sizes[16] = {100000, 1000000};
  int nsizes = argc > 5 ? argc - 5 : 2;
  bool bad = !(secs > 0) || window <= 0 || held < 0 || reps < 1 || reps > 64 || nsizes > 16;
  for (int k = 5; k < argc && !bad; k++)
    bad = (sizes[k - 5] = atol(argv[k])) < 1000 || sizes[k - 5] > 100000000;
  if (bad) {
    fprintf(stderr, "usage: bench_table [seconds-per-point > 0, default 0.2] [window > 0, default 64] "
                    "[held >= 0, default 100000] [reps 1-64, default 5] [N 1000-100000000 ..., up to 16, default "
                    "100000 1000000]\n");
    return 2;
  }
  const char *only = getenv("BENCH_LOCKFREE_ONLY");
  bool with_mutex = !(only && strcmp(only, "0") != 0 && *only);
  gr_table_init();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_table: insert+delete pairs, %ld blocks held live, %ld more live per thread, %.2fs per point, "
         "%d reps (min, median), %ld cores online\n",
         held, window, secs, reps, cores);
  printf("(CPU: thread CPU ns per pair, all threads' CPU time / pairs; Mpairs/s: wall throughput of all threads)\n");

  /* The held blocks; memory sampled while the tables grow. */
  double lf_peak = 0;
  gr_packed_t r = rec_for(0);
  for (long i = 0; i < held; i++) {
    lf_insert(&r, key_of(MAXT, (uint64_t)i));
    size_t pk = gr_table_bytes_peak(true); /* the insert may have mapped a new generation and unmapped the old */
    if (i + 1 >= 4096) {
      double per = (double)pk / (double)(i + 1);
      if (per > lf_peak)
        lf_peak = per;
    }
    if (with_mutex)
      lt_insert(r.key, gr_pk_size(&r));
  }
  series(secs, (unsigned)window, reps, false, with_mutex);
  series(secs, (unsigned)window, reps, true, with_mutex);

  gr_epoch_reclaim();
  int64_t live = gr_epoch_live_sum();
  printf("\nmemory per tracked block, bytes (steady: after the run, %lld live; peak: while growing to %ld)\n",
         (long long)live, held);
  printf("%-10s %8s %8s\n", "table", "steady", "peak");
  printf("%-10s %8.1f %8.1f\n", "lock-free", live ? (double)gr_table_bytes() / (double)live : 0.0, lf_peak);
  if (with_mutex)
    printf("%-10s %8.1f %8.1f\n", "mutex", g_lt.live ? (double)g_lt.bytes / (double)g_lt.live : 0.0,
           g_lt.peak_per_block);
  printf("\ntable memory now: %zu bytes, %llu migrations\n", gr_table_bytes(),
         (unsigned long long)gr_table_migrations());

  g_reuse = 0; /* the held blocks' keys */
  for (long i = 0; i < held; i++) /* an empty table for what follows */
    lf_delete(key_of(MAXT, (uint64_t)i));
  at_scale(sizes, nsizes);
  return 0;
}
