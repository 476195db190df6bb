/* gate_shape.c -- gate.S alone, on any architecture it is written for (check_gate_aarch64.cmake runs it under
 * qemu-aarch64 where that is at hand): the harness gives the trampolines the symbols gate.c gives them and checks
 * that a call through a stub reaches its target with every argument (integer and floating-point registers, ten
 * slots of the stack, varargs, a structure returned through memory), runs counted in flight and is uncounted
 * after; that a raised flag or a thread without a record sends the call down the slow path, unmarked, with
 * the registers restored after it; and that a slow path answering NULL returns CUDA_ERROR_OUT_OF_MEMORY (2).
 * Exit 0 and "gate shape: ok" when all holds; otherwise the first difference, exit 1. */
#include "gate.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

_Atomic unsigned char gr_gate_flag;
_Atomic unsigned char gr_gate_fence;
__thread gr_gate_rec_t *gr_gate_tls __attribute__((tls_model("initial-exec")));
void *gr_gate_target[GR_GATE_MAX];
extern char gr_gate_stubs[], gr_gate_stubs_end[];
void *gr_gate_slow(unsigned idx);

static gr_gate_rec_t g_rec;
static int g_slow_calls, g_slow_marked, g_slow_fail;

void *gr_gate_slow(unsigned idx) {
  g_slow_calls++;
  if (gr_gate_tls && atomic_load(&gr_gate_tls->inflight) != 0)
    g_slow_marked++;
  if (g_slow_fail)
    return NULL;
  gr_gate_tls = &g_rec; /* as gate.c: a record, the flag down (a wake), the thread marked */
  atomic_store(&gr_gate_flag, 0);
  atomic_fetch_add(&g_rec.inflight, 1);
  return gr_gate_target[idx];
}

static int g_fail;
#define CHECK(c, ...)                                                                                         \
  do {                                                                                                        \
    if (!(c)) {                                                                                               \
      fprintf(stderr, "gate shape: line %d: ", __LINE__);                                                     \
      fprintf(stderr, __VA_ARGS__);                                                                           \
      fprintf(stderr, "\n");                                                                                  \
      g_fail = 1;                                                                                             \
    }                                                                                                         \
  } while (0)

static long inflight(void) { return gr_gate_tls ? atomic_load(&gr_gate_tls->inflight) : -1; }

__attribute__((noinline)) static double many(int a, long b, short c, char d, void *e, long f, long g, long h,
                                             long i, long j, double k, double l, double m, double n, double o,
                                             double p, double q, double r, double s, float t) {
  return a + 2.0 * b + 3.0 * c + 4.0 * d + 5.0 * (double)(uintptr_t)e + 6.0 * f + 7.0 * g + 8.0 * h + 9.0 * i +
         10.0 * j + 11 * k + 12 * l + 13 * m + 14 * n + 15 * o + 16 * p + 17 * q + 18 * r + 19 * s + 20 * t +
         1e6 * (double)inflight();
}
typedef double (*many_t)(int, long, short, char, void *, long, long, long, long, long, double, double, double,
                         double, double, double, double, double, double, float);

__attribute__((noinline)) static long wide(long a, long b, long c, long d, long e, long f, long g, long h, long i,
                                           long j, long k, long l, long m, long n, long o, long p) {
  long v[16] = {a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p};
  unsigned long s = 0; /* each argument in its place: a hash that wraps */
  for (int x = 0; x < 16; x++)
    s = s * 31 + (unsigned long)v[x];
  return (long)(s >> 1);
}
typedef long (*wide_t)(long, long, long, long, long, long, long, long, long, long, long, long, long, long, long,
                       long);

__attribute__((noinline)) static long sum_va(int n, ...) {
  va_list ap;
  va_start(ap, n);
  long s = 0;
  for (int i = 0; i < n; i++)
    s += va_arg(ap, long) * (i + 1);
  double x = va_arg(ap, double);
  va_end(ap);
  return s + (long)(x * 1000);
}

struct big {
  long v[6];
};
__attribute__((noinline)) static struct big make_big(long a, long b) {
  struct big r = {{a, b, a + b, a - b, a * b, 42}};
  return r;
}

static void *stub(int i) { return gr_gate_stubs + (size_t)i * GR_GATE_STUB; }

static void calls(const char *how) {
  many_t m = (many_t)stub(1);
  /* what many() returns uncounted, plus 1e6 for the one call counted while it runs */
  double want = many(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f) -
                1e6 * (double)inflight() + 1e6;
  double got = m(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f);
  CHECK(got == want, "%s: many() %f, want %f (counted once)", how, got, want);
  CHECK(inflight() == 0, "%s: %ld in flight after the call", how, inflight());
  long w = ((wide_t)stub(2))(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16);
  CHECK(w == wide(1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16), "%s: wide() %ld", how, w);
  long v = ((long (*)(int, ...))stub(3))(4, 10L, 20L, 30L, 40L, 0.25);
  CHECK(v == 10 + 40 + 90 + 160 + 250, "%s: sum_va() %ld", how, v);
  struct big b = ((struct big(*)(long, long))stub(4))(7, 3);
  CHECK(b.v[0] == 7 && b.v[1] == 3 && b.v[2] == 10 && b.v[3] == 4 && b.v[4] == 21 && b.v[5] == 42,
        "%s: make_big()", how);
}

int main(void) {
  CHECK(gr_gate_stubs_end - gr_gate_stubs == (long)GR_GATE_MAX * GR_GATE_STUB, "stubs span %ld bytes",
        (long)(gr_gate_stubs_end - gr_gate_stubs));
  gr_gate_target[1] = (void *)many;
  gr_gate_target[2] = (void *)wide;
  gr_gate_target[3] = (void *)sum_va;
  gr_gate_target[4] = (void *)make_big;
  calls("no record yet");
  CHECK(g_slow_calls == 1 && gr_gate_tls == &g_rec, "a thread without a record takes the slow path once");
  calls("fast");
  CHECK(g_slow_calls == 1, "the fast path took the slow one");
  atomic_store(&gr_gate_fence, 1);
  calls("fenced");
  atomic_store(&gr_gate_fence, 0);
  int before = g_slow_calls;
  atomic_store(&gr_gate_flag, 1);
  double got = ((many_t)stub(1))(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5,
                                 9.5, 10.5f);
  CHECK(got == many(1, 2, 3, 4, (void *)5, 6, 7, 8, 9, 10, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5f) +
                   1e6,
        "flag raised: many() %f", got);
  CHECK(g_slow_calls == before + 1 && g_slow_marked == 0, "flag raised: the slow path, entered unmarked");
  atomic_store(&gr_gate_flag, 1);
  g_slow_fail = 1;
  long r = ((wide_t)stub(2))(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
  CHECK(r == 2, "a refused call returns CUDA_ERROR_OUT_OF_MEMORY, got %ld", r);
  CHECK(inflight() == 0, "and is not counted");
  if (!g_fail)
    printf("gate shape: ok\n");
  return g_fail;
}
