/*
 * bench_young -- what the log of young records (table.c, gr_table_insert_young) costs where it wins and where it
 * loses, on the table alone (no hook, no driver):
 *   same thread   an insert into the log and the same thread's take, per pair (thread CPU time), against
 *                 gr_table_insert_ks + take on the table (the path every allocation took before the log);
 *   other thread  a record taken by another thread while it is still young (the two threads hand records over
 *                 one at a time): the first take finds nothing in the table and drains every log (an
 *                 asymmetric barrier: membarrier), and the owner's next YOUNG_COOL inserts go to the table.
 *                 Thread CPU time and wall time of the take calls alone (two clock reads included), per take,
 *                 against the same handover of records inserted into the table;
 *   visit         a gr_table_visit of an empty table while another thread holds young records: the drain
 *                 every reader pays.
 * Runs interleave, and each figure is the min and the median over the runs.
 *
 * Usage: bench_young [runs >= 1, default 7] [pairs >= 100, default 200000]
 */
#include "table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static gr_packed_t rec(uint64_t key) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = key;
  r.size = 4096;
  r.kind = 1; /* GPURECLAIM_KIND_DEVICE */
  r.state = GR_ST_LIVE;
  r.ctx_id = 1;
  gr_packed_t p;
  gr_pk_pack(&r, &p);
  return p;
}

#define LIVE (GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN))
static uint64_t addr(uint64_t i) { return UINT64_C(0x400000000000) + (i % 4096) * 512; }

static double same_thread(long n, bool young) {
  gr_packed_t out;
  double t0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  for (long i = 0; i < n; i++) {
    gr_packed_t p = rec(addr((uint64_t)i));
    if ((young ? gr_table_insert_young(&p) : gr_table_insert_ks(&p, GR_KS_ADDR)) != 0 ||
        gr_table_take_kind_pk(GR_KS_ADDR, p.key, LIVE, ~0u, &out) != 0) {
      fprintf(stderr, "bench_young: a record was lost\n");
      exit(1);
    }
  }
  return (now_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / (double)n;
}

/* The handover: the producer inserts one young record and raises g_turn; the consumer takes it. */
static _Atomic long g_turn; /* odd: a record is waiting for the consumer */
static _Atomic int g_quit;
static long g_n;
static bool g_young;

static void *producer(void *arg) {
  (void)arg;
  gr_epoch_self();
  for (long i = 0; i < g_n; i++) {
    while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i)
      ;
    gr_packed_t p = rec(addr((uint64_t)i));
    if (g_young)
      gr_table_insert_young(&p);
    else
      gr_table_insert_ks(&p, GR_KS_ADDR);
    atomic_store_explicit(&g_turn, 2 * i + 1, memory_order_release);
  }
  return NULL;
}

static void other_thread(long n, bool young, double *cpu, double *wall) {
  g_n = n;
  g_young = young;
  atomic_store(&g_turn, 0);
  pthread_t t;
  pthread_create(&t, NULL, producer, NULL);
  gr_packed_t out;
  double cpu_sum = 0, wall_sum = 0;
  for (long i = 0; i < n; i++) {
    while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i + 1)
      ;
    double c0 = now_ns(CLOCK_THREAD_CPUTIME_ID), w0 = now_ns(CLOCK_MONOTONIC);
    int rc = gr_table_take_kind_pk(GR_KS_ADDR, addr((uint64_t)i), LIVE, ~0u, &out);
    cpu_sum += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    wall_sum += now_ns(CLOCK_MONOTONIC) - w0;
    if (rc != 0) {
      fprintf(stderr, "bench_young: a handed-over record was lost\n");
      exit(1);
    }
    atomic_store_explicit(&g_turn, 2 * i + 2, memory_order_release);
  }
  *cpu = cpu_sum / (double)n;
  *wall = wall_sum / (double)n;
  pthread_join(t, NULL);
}

static pthread_barrier_t g_bar;
static void *holder(void *arg) {
  (void)arg;
  gr_epoch_self();
  while (!atomic_load(&g_quit)) {
    gr_packed_t p = rec(addr(9999));
    gr_table_insert_young(&p); /* keeps one young record in its log, again after each drain */
    pthread_barrier_wait(&g_bar);
    pthread_barrier_wait(&g_bar);
    gr_packed_t out;
    gr_table_take_kind_pk(GR_KS_ADDR, addr(9999), LIVE, ~0u, &out);
  }
  return NULL;
}

static int nothing(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref, (void)r, (void)arg;
  return 0;
}

static double visit_cost(long n) {
  atomic_store(&g_quit, 0);
  pthread_barrier_init(&g_bar, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, holder, NULL);
  double sum = 0;
  for (long i = 0; i < n; i++) {
    pthread_barrier_wait(&g_bar); /* the holder has a young record */
    double c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    gr_table_visit(nothing, NULL);
    sum += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (i == n - 1)
      atomic_store(&g_quit, 1);
    pthread_barrier_wait(&g_bar);
  }
  pthread_join(t, NULL);
  pthread_barrier_destroy(&g_bar);
  return sum / (double)n;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void row(const char *name, double *v, int n, const char *unit) {
  qsort(v, (size_t)n, sizeof v[0], cmp);
  printf("%-52s %9.1f %9.1f  %s\n", name, v[0], v[n / 2], unit);
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 7;
  long pairs = argc > 2 ? atol(argv[2]) : 200000;
  if (runs < 1 || pairs < 100) {
    fprintf(stderr, "usage: bench_young [runs >= 1] [pairs >= 100]\n");
    return 2;
  }
  if (gr_table_init() != 0 || !gr_epoch_self()) {
    fprintf(stderr, "bench_young: no table\n");
    return 1;
  }
  long handovers = pairs / 20 < 100 ? 100 : pairs / 20, visits = handovers / 10 < 10 ? 10 : handovers / 10;
  double *v[7];
  for (int k = 0; k < 7; k++)
    v[k] = calloc((size_t)runs, sizeof(double));
  for (int r = 0; r < runs; r++) {
    v[0][r] = same_thread(pairs, true);
    v[1][r] = same_thread(pairs, false);
    other_thread(handovers, true, &v[2][r], &v[3][r]);
    other_thread(handovers, false, &v[4][r], &v[5][r]);
    v[6][r] = visit_cost(visits);
  }
  printf("bench_young: %d interleaved runs; min and median\n", runs);
  row("same thread: young insert + take (thread CPU)", v[0], runs, "ns per pair");
  row("same thread: table insert + take (thread CPU)", v[1], runs, "ns per pair");
  row("taken by another thread while young (its CPU)", v[2], runs, "ns per take");
  row("taken by another thread while young (wall)", v[3], runs, "ns per take");
  row("taken by another thread from the table (its CPU)", v[4], runs, "ns per take");
  row("taken by another thread from the table (wall)", v[5], runs, "ns per take");
  row("a visit while another thread has a young record", v[6], runs, "ns per visit");
  for (int k = 0; k < 7; k++)
    free(v[k]);
  return 0;
}
