/*
 * bench_gate -- what a sleep gate (src/proc/gate.S) adds to a driver call while the process is awake.
 *
 * `bench_gate [rounds] [calls]` (default 9 rounds of 20,000,000 calls) times, in thread CPU time, a loop of
 * indirect calls to a function that does almost nothing, once through its own pointer and once through the gate
 * gr_gate_wrap() hands out for it (flag clear: a byte compare and an indirect jump), alternating per round, and
 * prints min and median ns per call of each and the difference. The pointer is read through a volatile, as a
 * program reads the pointer cuGetProcAddress gave it.
 */
#include "gpureclaim_internal.h"
#include "gate.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) static int tiny(int x) { return x + 1; }

static double per_call(int (*volatile *fp)(int), long calls) {
  struct timespec a, b;
  int acc = 0;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  for (long i = 0; i < calls; i++)
    acc = (*fp)(acc);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  if (acc != (int)calls)
    abort();
  return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 9;
  long calls = argc > 2 ? atol(argv[2]) : 20000000;
  if (rounds < 1 || rounds > 99 || calls < 1)
    return 2;
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  int (*volatile direct)(int) = tiny;
  int (*volatile gated)(int) = (int (*)(int))gr_gate_wrap((void *)tiny);
  if ((void *)gated == (void *)tiny) {
    fprintf(stderr, "bench_gate: no gate was handed out\n");
    return 1;
  }
  double d[99], g[99], diff[99];
  for (int r = 0; r < rounds; r++) {
    if (r % 2) {
      g[r] = per_call(&gated, calls);
      d[r] = per_call(&direct, calls);
    } else {
      d[r] = per_call(&direct, calls);
      g[r] = per_call(&gated, calls);
    }
    diff[r] = g[r] - d[r];
  }
  qsort(d, (size_t)rounds, sizeof d[0], cmp);
  qsort(g, (size_t)rounds, sizeof g[0], cmp);
  qsort(diff, (size_t)rounds, sizeof diff[0], cmp);
  printf("ns per call (thread CPU time), %d rounds of %ld calls      min   median\n", rounds, calls);
  printf("direct call through a pointer                            %6.3f %6.3f\n", d[0], d[rounds / 2]);
  printf("through a sleep gate, awake                              %6.3f %6.3f\n", g[0], g[rounds / 2]);
  printf("the gate adds                                            %6.3f %6.3f\n", g[0] - d[0], diff[rounds / 2]);
  return 0;
}
