/*
 * bench_table -- gpureclaim's lock-free table against a mutex-protected table with the same operations, at 1, 2,
 * 4, 8 and 16 threads, with many blocks held live while the threads churn.
 *
 * Usage: bench_table [seconds-per-point, default 0.2] [window, default 64] [held, default 100000] [reps, default 5]
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
 * BENCH_LOCKFREE_ONLY=1 skips the mutex table.
 *
 * The mutex table: one pthread mutex around an open-addressing array of 40-byte records (linear probing,
 * tombstones, rebuilt at 85% used into an array sized for 75% live), the simple design the lock-free one has
 * to beat.
 */
#include "table.h"

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

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.2;
  long window = argc > 2 ? atol(argv[2]) : 64, held = argc > 3 ? atol(argv[3]) : 100000;
  int reps = argc > 4 ? atoi(argv[4]) : 5;
  if (!(secs > 0) || window <= 0 || held < 0 || reps < 1 || reps > 64 || argc > 5) {
    fprintf(stderr, "usage: bench_table [seconds-per-point > 0, default 0.2] [window > 0, default 64] "
                    "[held >= 0, default 100000] [reps 1-64, default 5]\n");
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
  return 0;
}
