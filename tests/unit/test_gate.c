/* The gates (gate.S, gate.c): signature-agnostic trampolines. A call through a gate reaches the same function
 * with every argument intact (integer and floating-point registers, arguments on the stack, varargs) and
 * returns its result unchanged, on the fast path (flag clear) and on the slow one (flag set: registers saved,
 * the slow path run, registers restored); the same function gets the same gate; GPURECLAIM_SLEEP=0 hands out
 * the function itself. */
#include "gpureclaim_internal.h"
#include "gate.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>

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
