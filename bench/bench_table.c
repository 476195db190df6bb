/*
 * bench_table -- insert+delete throughput of gpureclaim's lock-free table against a mutex-protected table of
 * the same layout (40-byte records in one open-addressing array, linear probing), at 1, 2, 4, 8, 16 threads.
 *
 * Each thread inserts a block and deletes the block it inserted `window` operations earlier, as a program
 * allocating and freeing does, over its own addresses. Prints million pairs per second and ns per pair, the
 * ratio of the two tables in the same run, and the lock-free table's throughput against one thread.
 * Usage: bench_table [seconds-per-point] [window] [reuse]. Without reuse it runs two address patterns: ever-new
 * addresses (every thread writes slots all over the table, so each operation moves cache lines between cores)
 * and reused ones (a freed address comes back, as from a pool or the driver's free list; reuse = window).
 * BENCH_LOCKFREE_ONLY=1 skips the mutex table.
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

/* ---- the baseline: the same slots under one mutex ---- */
typedef struct {
  uint64_t ctl, key, w1, w2, w3;
} lslot_t;

typedef struct {
  pthread_mutex_t lock;
  lslot_t *s;
  uint64_t cap, used, live;
} ltable_t;

static ltable_t g_lt = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

static uint64_t lhash(uint64_t k, uint64_t cap) {
  uint64_t h = k * UINT64_C(0x9E3779B97F4A7C15);
  h ^= h >> 29;
  return (uint64_t)(((unsigned __int128)h * cap) >> 64);
}

static void lt_rehash(uint64_t cap) {
  lslot_t *old = g_lt.s;
  uint64_t ocap = g_lt.cap;
  g_lt.s = calloc(cap, sizeof *g_lt.s);
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
typedef struct {
  int id, lockfree;
  unsigned window;
  _Atomic int *stop;
  uint64_t pairs;
} arg_t;

/* Addresses: with reuse (the driver hands freed addresses out again) from a per-thread range of `reuse` slots,
 * else ever new. */
static uint64_t g_reuse;
static uint64_t key_of(int t, uint64_t i) {
  return UINT64_C(0x200000000000) + ((uint64_t)t << 36) + (g_reuse ? i % g_reuse : i) * 512;
}

static void *run(void *p) {
  arg_t *a = p;
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.kind = 1;
  r.state = GR_ST_LIVE;
  r.size = 4096;
  uint64_t i = 0;
  while (!atomic_load_explicit(a->stop, memory_order_relaxed)) {
    for (int k = 0; k < 256; k++, i++) {
      /* Free first, then allocate: with reuse, the address just freed is the one handed out again. */
      r.key = key_of(a->id, i);
      if (a->lockfree) {
        if (i >= a->window)
          gr_table_take(GR_KS_ADDR, key_of(a->id, i - a->window), GR_STMASK(GR_ST_LIVE), NULL);
        gr_table_insert(&r);
      } else {
        if (i >= a->window)
          lt_delete(key_of(a->id, i - a->window));
        lt_insert(r.key, r.size);
      }
    }
  }
  a->pairs = i;
  return NULL;
}

static double point(int threads, int lockfree, double secs, unsigned window) {
  _Atomic int stop = 0;
  pthread_t th[64];
  arg_t args[64];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int t = 0; t < threads; t++) {
    args[t] = (arg_t){t, lockfree, window, &stop, 0};
    pthread_create(&th[t], NULL, run, &args[t]);
  }
  struct timespec d = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  nanosleep(&d, NULL);
  atomic_store(&stop, 1);
  uint64_t pairs = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(th[t], NULL);
    pairs += args[t].pairs;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  /* Leave both tables empty for the next point. */
  for (int t = 0; t < threads; t++)
    for (uint64_t i = args[t].pairs > window ? args[t].pairs - window : 0; i < args[t].pairs; i++) {
      if (lockfree)
        gr_table_take(GR_KS_ADDR, key_of(t, i), GR_STMASK(GR_ST_LIVE), NULL);
      else
        lt_delete(key_of(t, i));
    }
  return (double)pairs / el;
}

/* One table of figures for one address pattern; the last column is lock-free throughput against 1 thread. */
static void series(double secs, unsigned window, uint64_t reuse, bool with_mutex) {
  g_reuse = reuse;
  if (reuse)
    printf("\naddresses reused: each thread's freed addresses come back (%llu per thread), as from a pool\n",
           (unsigned long long)reuse);
  else
    printf("\naddresses ever new: every allocation gets an address never seen before\n");
  printf("%8s %16s %12s %16s %12s %10s %12s %11s\n", "threads", "lock-free Mp/s", "ns/pair", "mutex Mp/s",
         "ns/pair", "ratio", "vs 1 thread", "migrations");
  static const int counts[] = {1, 2, 4, 8, 16};
  double one = 0;
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    int t = counts[i];
    uint64_t m0 = gr_table_migrations();
    double lf = point(t, 1, secs, window);
    unsigned long long migr = (unsigned long long)(gr_table_migrations() - m0);
    if (i == 0)
      one = lf;
    if (with_mutex) {
      double mx = point(t, 0, secs, window);
      printf("%8d %16.2f %12.1f %16.2f %12.1f %9.2fx %11.2fx %11llu\n", t, lf / 1e6, 1e9 * t / lf, mx / 1e6,
             1e9 * t / mx, lf / mx, lf / one, migr);
    } else {
      printf("%8d %16.2f %12.1f %16s %12s %10s %11.2fx %11llu\n", t, lf / 1e6, 1e9 * t / lf, "-", "-", "-", lf / one,
             migr);
    }
  }
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  unsigned window = argc > 2 ? (unsigned)atoi(argv[2]) : 64;
  if (!(secs > 0) || window == 0 || (argc > 3 && atoll(argv[3]) < 0)) {
    fprintf(stderr, "usage: bench_table [seconds-per-point > 0] [window > 0] [reuse >= window, 0 = ever new]\n");
    return 2;
  }
  const char *only = getenv("BENCH_LOCKFREE_ONLY");
  bool with_mutex = !(only && strcmp(only, "0") != 0 && *only);
  gr_table_init();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_table: insert+delete pairs, %u blocks live per thread, %.1fs per point, %ld cores online\n", window,
         secs, cores);
  printf("(Mp/s: million pairs per second, all threads together; ns/pair: the time one thread takes per pair)\n");
  if (argc > 3) {
    uint64_t reuse = (uint64_t)atoll(argv[3]);
    series(secs, window, reuse && reuse < window ? window : reuse, with_mutex);
  } else {
    series(secs, window, 0, with_mutex);
    series(secs, window, window, with_mutex);
  }
  printf("\ntable memory now: %zu bytes, %llu migrations\n", gr_table_bytes(),
         (unsigned long long)gr_table_migrations());
  return 0;
}
