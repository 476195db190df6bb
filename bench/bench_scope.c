/*
 * bench_scope -- what gpureclaim_scope_end() costs with many live blocks outside the scope.
 *
 * `bench_scope [rounds] [live blocks...]` (default 21 rounds, 100000 and 200000 blocks): for each table size it
 * inserts that many unscoped blocks as the hooks record them, then per round opens a scope, records 10 blocks in
 * it and ends it, and prints the median thread CPU time of the end (CLOCK_THREAD_CPUTIME_ID, so that other
 * processes on the machine do not count) and of recording one allocation inside and outside a scope (mean of
 * 10). The round's blocks are freed again, so the table keeps its size.
 */
#include "gpureclaim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define IN_SCOPE 10

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static uint64_t g_key = 0x100000000;

static uint64_t record(void) {
  gr_rec_t r;
  uint64_t key = g_key += 0x1000;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, key, 4096, 0, (uintptr_t)&record);
  gr_track_insert(&r);
  return key;
}

static void drop(uint64_t key) {
  gr_rec_t r;
  if (gr_table_take(GR_KS_ADDR, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), &r) == 0)
    gr_track_freed(&r); /* counts an orphan's free too */
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 21;
  if (rounds < 1)
    rounds = 1;
  if (gr_table_init() != 0) {
    fprintf(stderr, "bench_scope: no table\n");
    return 1;
  }
  atomic_store(&gr_state_run, 1); /* as once CUDA started: ends act on the table */
  long sizes_default[] = {100000, 200000};
  int nsizes = argc > 2 ? argc - 2 : 2;
  double *end_ns = calloc((size_t)rounds, sizeof *end_ns), *in_ns = calloc((size_t)rounds, sizeof *in_ns),
         *out_ns = calloc((size_t)rounds, sizeof *out_ns);
  if (!end_ns || !in_ns || !out_ns)
    return 1;
  printf("%12s %14s %18s %18s\n", "live blocks", "scope_end us", "record ns (scope)", "record ns (none)");
  long have = 0;
  for (int i = 0; i < nsizes; i++) {
    long want = argc > 2 ? atol(argv[2 + i]) : sizes_default[i];
    for (; have < want; have++)
      record();
    for (int r = 0; r < rounds; r++) {
      uint64_t keys[IN_SCOPE];
      double t0 = cpu_ns();
      for (int k = 0; k < IN_SCOPE; k++)
        keys[k] = record();
      out_ns[r] = (cpu_ns() - t0) / IN_SCOPE;
      for (int k = 0; k < IN_SCOPE; k++)
        drop(keys[k]);
      uint64_t s = gpureclaim_scope_begin();
      if (!s) {
        fprintf(stderr, "bench_scope: no scope\n");
        return 1;
      }
      t0 = cpu_ns();
      for (int k = 0; k < IN_SCOPE; k++)
        keys[k] = record();
      in_ns[r] = (cpu_ns() - t0) / IN_SCOPE;
      t0 = cpu_ns();
      int rc = gpureclaim_scope_end(s, 0);
      end_ns[r] = cpu_ns() - t0;
      gpureclaim_stats_t st = {.size = sizeof st};
      if (rc != 0 || gr_stats_get(-1, &st) != 0 || st.orphan_blocks != IN_SCOPE) {
        fprintf(stderr, "bench_scope: the end did not orphan the scope's %d blocks\n", IN_SCOPE);
        return 1;
      }
      for (int k = 0; k < IN_SCOPE; k++)
        drop(keys[k]);
    }
    printf("%12ld %14.1f %18.0f %18.0f\n", have, median(end_ns, rounds) / 1e3, median(in_ns, rounds),
           median(out_ns, rounds));
  }
  free(end_ns);
  free(in_ns);
  free(out_ns);
  return 0;
}
