/* Interned backtraces (src/track/stacks.c, GPURECLAIM_BACKTRACE=1): a site is a plain code address or a tagged stack
 * id; a captured stack starts with the attributed caller, drops the leading frames of gpureclaim itself (here,
 * the test program, which has stacks.c linked in) and, inside a runtime call, the runtime's frames above that
 * caller; one stack gets one id however often and from however many threads it is captured. */
#include "gpureclaim_internal.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <string.h>

#define TAG (UINT64_C(1) << 63)

/* Code addresses no frame of a real stack holds (the depot compares them, never runs them). */
static uintptr_t fake_pc(unsigned i) { return (uintptr_t)0x100000 + (uintptr_t)i * 16; }

Test(stacks, a_plain_site_is_its_code_address) {
  uintptr_t pc = fake_pc(1), f[4] = {0};
  gr_site_t s = gr_site_at(pc);
  cr_assert_eq(s.bits & TAG, 0);
  cr_assert_eq(gr_site_pc(s), pc);
  cr_assert_eq(gr_site_frames(s, f, 4), 1);
  cr_assert_eq(f[0], pc);
  cr_assert_eq(gr_site_frames(s, f, 0), 0, "no room, no frame");
  cr_assert_eq(gr_site_pc(gr_site_at(0)), 0);
}

/* A tagged id the depot never gave (0, or past the last one) is a site without a stack, not a crash. */
Test(stacks, an_unknown_id_has_no_stack) {
  uintptr_t f[4];
  cr_assert_eq(gr_site_pc((gr_site_t){TAG | 12345}), 0);
  cr_assert_eq(gr_site_pc((gr_site_t){TAG}), 0);
  cr_assert_eq(gr_site_frames((gr_site_t){TAG | 12345}, f, 4), 1);
}

/* Whether a frame lies in this test program (what stacks.c calls "self": it is linked in). */
static bool in_self(uintptr_t pc) {
  Dl_info me, it;
  return dladdr((void *)(uintptr_t)&in_self, &me) && dladdr((void *)pc, &it) && it.dli_fbase == me.dli_fbase;
}

typedef struct {
  uintptr_t pc;
  unsigned rt_depth;
  uintptr_t outer[GR_STACK_MAX]; /* the frames of this thread below the test program's, as backtrace sees them */
  int nouter;
  gr_site_t a, b;
  uintptr_t f[GR_STACK_MAX];
  int n;
} capture_t;

static __attribute__((noinline)) void *capture_twice(void *arg) {
  capture_t *c = arg;
  void *raw[64];
  int n = backtrace(raw, 64), i = 0;
  while (i < n && !in_self((uintptr_t)raw[i])) /* a sanitizer's backtrace interceptor */
    i++;
  while (i < n && in_self((uintptr_t)raw[i]))
    i++;
  for (c->nouter = 0; i < n && c->nouter < GR_STACK_MAX; i++)
    c->outer[c->nouter++] = (uintptr_t)raw[i];
  gr_tls.rt_depth = c->rt_depth;
  for (int k = 0; k < 2; k++) { /* the same stack twice: one loop, one call site */
    gr_site_t s = gr_stack_capture(c->pc);
    if (k == 0)
      c->a = s;
    else
      c->b = s;
  }
  gr_tls.rt_depth = 0;
  c->n = gr_site_frames(c->a, c->f, GR_STACK_MAX);
  return NULL;
}

/* The stack is the attributed caller, then what lies below the test program's own frames; captured again, it
 * is the same id. */
Test(stacks, a_capture_is_the_caller_then_the_frames_outside_gpureclaim) {
  capture_t c = {.pc = fake_pc(7)};
  gr_thread_run(capture_twice, &c);
  cr_assert_neq(c.a.bits & TAG, 0, "no stack was interned");
  cr_assert(gr_site_same(c.a, c.b), "one stack, two ids: %llx, %llx", (unsigned long long)c.a.bits,
            (unsigned long long)c.b.bits);
  cr_assert_eq(gr_site_pc(c.a), c.pc);
  cr_assert_gt(c.nouter, 0, "the thread has no frame below the test program: nothing to compare");
  cr_assert_eq(c.n, 1 + c.nouter, "%d frames, expected the caller and %d", c.n, c.nouter);
  cr_assert_eq(c.f[0], c.pc);
  for (int i = 0; i < c.nouter; i++)
    cr_assert_eq(c.f[1 + i], c.outer[i], "frame %d", 1 + i);
  uintptr_t two[2];
  cr_assert_eq(gr_site_frames(c.a, two, 2), 2, "frames beyond max were written");
  cr_assert_eq(two[1], c.outer[0]);
}

/* Inside a runtime call the stack starts at the caller the hook attributed (the frame equal to pc), skipping
 * the runtime's frames above it; outside one the same pc is only put in front. */
Test(stacks, inside_a_runtime_call_the_stack_starts_at_the_attributed_caller) {
  capture_t probe = {.pc = fake_pc(8)};
  gr_thread_run(capture_twice, &probe);
  cr_assert_geq(probe.nouter, 2, "need two frames below the test program, have %d", probe.nouter);
  uintptr_t caller = probe.outer[1]; /* as if the runtime's own frame were outer[0] */

  capture_t rt = {.pc = caller, .rt_depth = 1};
  gr_thread_run(capture_twice, &rt);
  cr_assert_eq(rt.n, rt.nouter - 1, "%d frames, expected %d from the caller on", rt.n, rt.nouter - 1);
  for (int i = 0; i < rt.n; i++)
    cr_assert_eq(rt.f[i], rt.outer[1 + i], "frame %d", i);

  capture_t plain = {.pc = caller};
  gr_thread_run(capture_twice, &plain);
  cr_assert_eq(plain.n, 1 + plain.nouter);
  cr_assert_eq(plain.f[0], caller);
  cr_assert_eq(plain.f[1], plain.outer[0], "outside a runtime call no frame is skipped");
  cr_assert_not(gr_site_same(rt.a, plain.a), "two different stacks share an id");
}

/* Many distinct stacks (past the id index's first 256 and its growth): each its own id, each still answering
 * its own caller, the ids 1, 2, 3... in order of first capture. */
Test(stacks, distinct_stacks_get_distinct_ids_past_the_first_allocation) {
  enum { N = 1000 };
  static gr_site_t s[N];
  for (unsigned i = 0; i < N; i++) {
    s[i] = gr_stack_capture(fake_pc(i));
    cr_assert_eq(s[i].bits, TAG | (i + 1), "stack %u has id %llx", i, (unsigned long long)(s[i].bits & ~TAG));
  }
  for (unsigned i = 0; i < N; i++) {
    cr_assert_eq(gr_site_pc(s[i]), fake_pc(i), "stack %u", i);
    cr_assert(gr_site_same(gr_stack_capture(fake_pc(i)), s[i]), "stack %u interned again", i);
  }
}

/* Threads capturing the same stacks at once: each stack is interned once, every thread gets its id. */
#define THREADS 4
#define PCS 300
typedef struct {
  gr_site_t s[PCS];
} seen_t;

static void *capture_all(void *arg) {
  seen_t *seen = arg;
  for (unsigned i = 0; i < PCS; i++)
    seen->s[i] = gr_stack_capture(fake_pc(i));
  return NULL;
}

Test(stacks, threads_capturing_one_stack_share_its_id) {
  static seen_t seen[THREADS];
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    t[i] = gr_thread_start(capture_all, &seen[i]);
  for (int i = 0; i < THREADS; i++)
    gr_thread_join(t[i]);
  for (unsigned i = 0; i < PCS; i++) {
    cr_assert_neq(seen[0].s[i].bits & TAG, 0);
    cr_assert_eq(gr_site_pc(seen[0].s[i]), fake_pc(i));
    cr_assert_leq(seen[0].s[i].bits & ~TAG, PCS, "more ids than stacks: one was interned twice");
    for (int k = 1; k < THREADS; k++)
      cr_assert(gr_site_same(seen[k].s[i], seen[0].s[i]), "thread %d got another id for stack %u", k, i);
  }
}
