/* The gates (gate.S, gate.c): signature-agnostic trampolines. A call through a gate reaches the same function
 * with every argument intact (integer and floating-point registers, arguments on the stack, varargs) and
 * returns its result unchanged, on the fast path (flag clear) and on the slow one (flag set: registers saved,
 * the slow path run, registers restored); the same function gets the same gate; GPURECLAIM_SLEEP=0 hands out
 * the function itself. A call is counted in flight from its gate until it returned, and gr_gate_quiesce (a sleep's
 * side) waits for it, with membarrier and with fences. */
#include "gpureclaim_internal.h"
#include "gate.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef double (*many_t)(int, long, short, char, void *, long, long, long, long, long, double, double, double,
                         double, double, double, double, double, double, float);

static double many(int a, long b, short c, char d, void *e, long f, long g, long h, long i, long j, double k,
                   double l, double m, double n, double o, double p, double q, double r, double s, float t) {
  return a + 2.0 * b + 3.0 * c + 4.0 * d + 5.0 * (double)(uintptr_t)e + 6.0 * f + 7.0 * g + 8.0 * h + 9.0 * i +
         10.0 * j + 11 * k + 12 * l + 13 * m + 14 * n + 15 * o + 16 * p + 17 * q + 18 * r + 19 * s + 20 * t;
}

static long sum_va(int n, ...) {
  va_list ap;
  va_start(ap, n);
  long s = 0;
  for (int i = 0; i < n; i++)
    s += va_arg(ap, long) * (i + 1);
  double x = va_arg(ap, double);
  va_end(ap);
  return s + (long)(x * 1000);
}

static struct big {
  long v[6];
} make_big(long a, long b) {
  struct big r = {{a, b, a + b, a - b, a * b, 42}};
  return r; /* returned through memory: x86-64 passes its address in rdi, aarch64 in x8 */
}

static double expect(void) {
  return many(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f);
}

static void calls_through(void) {
  many_t g = (many_t)gr_gate_wrap((void *)many);
  cr_assert_neq((void *)g, (void *)many, "a gate was handed out");
  cr_assert_eq(gr_gate_wrap((void *)many), (void *)g, "the same function gets the same gate");
  double got = g(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f);
  cr_assert_eq(got, expect());
  long (*v)(int, ...) = (long (*)(int, ...))gr_gate_wrap((void *)sum_va);
  cr_assert_eq(v(4, 10L, 20L, 30L, 40L, 0.25), 10 + 40 + 90 + 160 + 250);
  struct big (*mb)(long, long) = (struct big(*)(long, long))gr_gate_wrap((void *)make_big);
  struct big b = mb(7, 3);
  cr_assert(b.v[0] == 7 && b.v[1] == 3 && b.v[2] == 10 && b.v[3] == 4 && b.v[4] == 21 && b.v[5] == 42);
}

Test(gate, fast_path_keeps_every_argument) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  cr_assert(gr_gate_enabled());
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  calls_through();
}

Test(gate, slow_path_restores_every_argument) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  gr_gate_set_slow(gr_sleep_gate_slow); /* as core.c hands it over when gpureclaim starts */
  /* The idle probe sends the next call down the slow path, which clears it: each call here takes it. */
  many_t g = (many_t)gr_gate_wrap((void *)many);
  for (int i = 0; i < 3; i++) {
    atomic_store(&gr_gate_flag, GR_GATE_PROBE);
    double got = g(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f);
    cr_assert_eq(got, expect());
    cr_assert_eq(atomic_load(&gr_gate_flag), GR_GATE_AWAKE, "the slow path ran (it cleared the probe)");
  }
  atomic_store(&gr_gate_flag, GR_GATE_PROBE);
  long (*v)(int, ...) = (long (*)(int, ...))gr_gate_wrap((void *)sum_va);
  cr_assert_eq(v(4, 10L, 20L, 30L, 40L, 0.25), 10 + 40 + 90 + 160 + 250);
  cr_assert_eq(atomic_load(&gr_gate_flag), GR_GATE_AWAKE);
  atomic_store(&gr_gate_flag, GR_GATE_PROBE);
  struct big (*mb)(long, long) = (struct big(*)(long, long))gr_gate_wrap((void *)make_big);
  struct big b = mb(7, 3);
  cr_assert(b.v[0] == 7 && b.v[1] == 3 && b.v[2] == 10 && b.v[3] == 4 && b.v[4] == 21 && b.v[5] == 42);
  cr_assert_eq(atomic_load(&gr_gate_flag), GR_GATE_AWAKE);
}

Test(gate, off_hands_out_the_function_itself) {
  setenv("GPURECLAIM_SLEEP", "0", 1);
  gr_opt_reload();
  cr_assert_not(gr_gate_enabled());
  cr_assert_eq(gr_gate_wrap((void *)many), (void *)many);
  cr_assert_eq(gr_gate_count(), 0);
}

Test(gate, many_functions_many_gates) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  /* Distinct addresses inside one function are distinct targets to the gate table (it never calls them). */
  void *seen[64];
  for (int i = 0; i < 64; i++) {
    seen[i] = gr_gate_wrap((char *)(void *)many + i);
    for (int j = 0; j < i; j++)
      cr_assert_neq(seen[i], seen[j]);
  }
  cr_assert_eq(gr_gate_count(), 64);
}

/* The widest driver entry point has 16 arguments (cuTensorMapEncodeIm2colWide): 10 on the stack on x86-64. */
typedef long (*wide_t)(long, long, long, long, long, long, long, long, long, long, long, long, long, long, long,
                       long);
static long wide(long a, long b, long c, long d, long e, long f, long g, long h, long i, long j, long k, long l,
                 long m, long n, long o, long p) {
  long v[16] = {a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p};
  unsigned long s = 0; /* each argument in its place: a hash that wraps */
  for (int x = 0; x < 16; x++)
    s = s * 31 + (unsigned long)v[x];
  return (long)(s >> 1);
}

Test(gate, the_widest_signature_keeps_its_stack_arguments) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  wide_t g = (wide_t)gr_gate_wrap((void *)wide);
  cr_assert_neq((void *)g, (void *)wide);
  long want = wide(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16);
  cr_assert_eq(g(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16), want);
}

/* What the calling thread has in flight, as the function called through a gate sees it. */
static long mine(void) { return gr_gate_tls ? atomic_load(&gr_gate_tls->inflight) : -1; }
static long seen_inside(long x) { return mine() * 1000 + x; }

Test(gate, a_call_is_in_flight_from_its_gate_until_it_returned) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  long (*g)(long) = (long (*)(long))gr_gate_wrap((void *)seen_inside);
  cr_assert_eq(g(7), 1007, "the function runs with its call counted (a tail jump would leave it uncounted)");
  cr_assert_eq(mine(), 0, "and the count is back once it returned");
  cr_assert_eq(gr_gate_inflight(), 0);
  /* gpureclaim's own wrappers (hooks/driver.c): the same in C */
  cr_assert_eq(gr_gate_enter(), CUDA_SUCCESS);
  cr_assert_eq(mine(), 1);
  cr_assert_eq(g(7), 2007, "nested: the wrapper's count and the gate's");
  gr_gate_leave();
  cr_assert_eq(mine(), 0);
}

/* A call held inside the function behind a gate; a sleep's side waits for it. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_inside, g_go, g_tid;
static long blocker(long x) {
  pthread_mutex_lock(&g_mu);
  g_inside = 1;
  g_tid = (int)syscall(SYS_gettid);
  pthread_cond_broadcast(&g_cv);
  while (!g_go)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return x + 1;
}
static long (*g_blocker_gate)(long);
static void *call_blocker(void *arg) { return (void *)(intptr_t)g_blocker_gate((long)(intptr_t)arg); }

/* The slow path a sleep's flag sends calls to: counts them, checks that they come unmarked, and lets them go
 * (the flag down, as a wake does). */
static _Atomic int g_slow_calls, g_slow_marked;
static CUresult slow_wake(void) {
  atomic_fetch_add(&g_slow_calls, 1);
  if (mine() != 0)
    atomic_fetch_add(&g_slow_marked, 1);
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  return CUDA_SUCCESS;
}
static long after(long x) { return mine() * 1000 + x; }

static void quiesce_waits(int fence) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  cr_assert(gr_gate_enabled());
  gr_gate_force_fence(fence);
  if (fence)
    cr_assert_eq(atomic_load(&gr_gate_fence), 1, "the gates fence as where membarrier is missing");
  else if (atomic_load(&gr_gate_fence))
    fprintf(stderr, "the gates fence here: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) is missing, or this is "
                    "a ThreadSanitizer build (it models no membarrier)\n");
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  g_blocker_gate = (long (*)(long))gr_gate_wrap((void *)blocker);
  pthread_t t = gr_thread_start(call_blocker, (void *)(intptr_t)41);
  pthread_mutex_lock(&g_mu);
  while (!g_inside)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  atomic_store(&gr_gate_flag, GR_GATE_SLEEP);
  int tid = 0;
  cr_assert_eq(gr_gate_quiesce(50, &tid), -EBUSY, "a call in flight is waited for, up to the timeout");
  cr_assert_eq(tid, g_tid, "and named");
  pthread_mutex_lock(&g_mu);
  g_go = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  cr_assert_eq(gr_gate_quiesce(60000, &tid), 0, "once it returned, nothing is in flight");
  cr_assert_eq((intptr_t)gr_thread_join(t), 42);
  /* a call that meets the raised flag waits at its gate (the slow path), unmarked, and runs marked after it */
  gr_gate_set_slow(slow_wake);
  long (*g)(long) = (long (*)(long))gr_gate_wrap((void *)after);
  cr_assert_eq(g(5), 1005);
  cr_assert_eq(atomic_load(&g_slow_calls), 1);
  cr_assert_eq(atomic_load(&g_slow_marked), 0, "the slow path is entered unmarked");
  atomic_store(&gr_gate_flag, GR_GATE_SLEEP);
  cr_assert_eq(gr_gate_enter(), CUDA_SUCCESS);
  cr_assert_eq(mine(), 1);
  gr_gate_leave();
  cr_assert_eq(atomic_load(&g_slow_calls), 2);
  cr_assert_eq(atomic_load(&g_slow_marked), 0);
  cr_assert_eq(gr_gate_inflight(), 0);
}

Test(gate, a_sleep_waits_for_the_calls_past_their_gate) { quiesce_waits(0); }
Test(gate, a_sleep_waits_for_the_calls_past_their_gate_with_fences) { quiesce_waits(1); }

/* Threads that end give their record back to the threads that come after them. */
static void *one_call(void *arg) {
  (void)arg;
  long (*g)(long) = (long (*)(long))gr_gate_wrap((void *)seen_inside);
  return (void *)(intptr_t)(g(1) == 1001 ? (intptr_t)gr_gate_tls : 0);
}
Test(gate, records_are_reused_by_new_threads) {
  setenv("GPURECLAIM_SLEEP", "1", 1);
  gr_opt_reload();
  atomic_store(&gr_gate_flag, GR_GATE_AWAKE);
  void *first = gr_thread_run(one_call, NULL);
  cr_assert_not_null(first, "the call ran, counted");
  for (int i = 0; i < 200; i++)
    cr_assert_eq(gr_thread_run(one_call, NULL), first, "thread %d got the record the ones before gave back", i);
}
