/* The allocation-time tick (src/proc/tick.c), driven here by hand in the worker's place: a running tick answers its
 * own time and is marked read by the first allocation; a stopped one (0) answers the clock and wakes the worker
 * through the eventfd once, not once per allocation; the worker stops after a second of ticks nobody read and
 * after a fork; resume drains the wake-ups. No test waits for time to pass: the clock is only bounded. */
#include "tick.h"
#include "state.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define IDLE_TICKS (1000 / GR_TICK_MS)

/* The wake-ups written to the eventfd since the last drain (0 when none: it is non-blocking). */
static uint64_t wakeups(void) {
  uint64_t n = 0;
  if (read(gr_tick_fd(), &n, sizeof n) != sizeof n) {
    cr_assert_eq(errno, EAGAIN, "read: %s", strerror(errno));
    return 0;
  }
  return n;
}

Test(tick, a_running_tick_answers_its_time_and_the_first_reader_marks_it) {
  atomic_store(&gr_tick, UINT64_C(123456) << 1);
  cr_assert_eq(gr_tick_now_ms(), 123456);
  cr_assert_eq(atomic_load(&gr_tick), (UINT64_C(123456) << 1) | 1, "the first read did not mark the tick");
  cr_assert_eq(gr_tick_now_ms(), 123456);
  cr_assert_eq(atomic_load(&gr_tick), (UINT64_C(123456) << 1) | 1);
}

/* Stopped, the clock answers (bounded by reads before and after); before the worker made its eventfd there is
 * nothing to wake. */
Test(tick, a_stopped_tick_answers_the_clock) {
  cr_assert_eq(gr_tick_fd(), -1);
  uint64_t before = gr_state_now_ms();
  uint64_t t = gr_tick_now_ms();
  uint64_t after = gr_state_now_ms();
  cr_assert(before <= t && t <= after, "%llu not within [%llu, %llu]", (unsigned long long)t,
            (unsigned long long)before, (unsigned long long)after);
  cr_assert_eq(atomic_load(&gr_tick), 0, "reading the clock started the tick");
}

/* The first allocation that finds the tick stopped wakes the worker; the next ones do not write again until
 * the worker has stopped once more. */
Test(tick, a_stopped_tick_wakes_the_worker_once) {
  gr_tick_open();
  int fd = gr_tick_fd();
  cr_assert_geq(fd, 0);
  gr_tick_open();
  cr_assert_eq(gr_tick_fd(), fd, "a second open made another eventfd");
  cr_assert_eq(wakeups(), 0);
  for (int i = 0; i < 100; i++)
    gr_tick_now_ms();
  cr_assert_eq(wakeups(), 1, "one wake-up per stop, not per allocation");
  for (int i = 0; i < 10; i++)
    gr_tick_now_ms();
  cr_assert_eq(wakeups(), 0, "woken again before the worker stopped");
}

/* A worker that wants to tick (its start, or a resume) is not woken by allocations. Resume drains the
 * eventfd. */
Test(tick, resume_drains_and_wanted_ticks_are_not_woken) {
  gr_tick_open();
  gr_tick_want();
  gr_tick_now_ms();
  cr_assert_eq(wakeups(), 0, "woke a worker that already ticks");
  gr_tick_atfork_child(); /* forget the request (and the descriptor) */
  gr_tick_open();
  gr_tick_now_ms();
  gr_tick_resume();
  cr_assert_eq(wakeups(), 0, "resume left the wake-up unread: the worker would poll it again at once");
  gr_tick_now_ms();
  cr_assert_eq(wakeups(), 0, "resume did not mark the worker as ticking");
}

/* Each step stores the clock's time, unread; a step that finds its tick read starts the idle count again; a
 * second of unread steps stops the tick (0) and makes the next allocation wake the worker. */
Test(tick, the_worker_stops_after_a_second_of_unread_ticks) {
  gr_tick_open();
  gr_tick_want();
  unsigned idle = 0;
  cr_assert_not(gr_tick_step(false, &idle), "a stopped worker ticked");
  cr_assert_eq(atomic_load(&gr_tick), 0);
  uint64_t before = gr_state_now_ms();
  cr_assert(gr_tick_step(true, &idle));
  uint64_t v = atomic_load(&gr_tick), after = gr_state_now_ms();
  cr_assert_eq(v & 1, 0, "a new tick is unread");
  cr_assert(before <= v >> 1 && v >> 1 <= after);
  cr_assert_eq(idle, 1);
  gr_tick_now_ms(); /* an allocation */
  cr_assert(gr_tick_step(true, &idle));
  cr_assert_eq(idle, 0, "a read tick did not reset the idle count");
  for (unsigned i = 1; i < IDLE_TICKS; i++)
    cr_assert(gr_tick_step(true, &idle), "stopped after %u unread ticks", i);
  cr_assert_eq(idle, IDLE_TICKS - 1);
  cr_assert_eq(wakeups(), 0);
  cr_assert_not(gr_tick_step(true, &idle), "still ticking after %u unread ticks", IDLE_TICKS);
  cr_assert_eq(atomic_load(&gr_tick), 0);
  gr_tick_now_ms();
  cr_assert_eq(wakeups(), 1, "an allocation after the stop did not wake the worker");
}

/* In a child the parent's worker is gone: the tick is stopped and the eventfd (shared with the parent) is
 * closed and forgotten, so the child's worker makes its own. */
Test(tick, a_fork_child_stops_the_tick_and_drops_the_eventfd) {
  gr_tick_open();
  int fd = gr_tick_fd();
  gr_tick_want();
  atomic_store(&gr_tick, UINT64_C(99) << 1 | 1);
  gr_tick_atfork_child();
  cr_assert_eq(atomic_load(&gr_tick), 0);
  cr_assert_eq(gr_tick_fd(), -1);
  cr_assert_eq(fcntl(fd, F_GETFD), -1, "the parent's eventfd is still open in the child");
  gr_tick_open();
  gr_tick_now_ms();
  cr_assert_eq(wakeups(), 1, "the request was not forgotten: the child's worker is never woken");
}

/* Allocations on many threads at once find the tick stopped: exactly one of them wakes the worker. */
#define THREADS 8
static _Atomic int g_go;
static void *allocate(void *arg) {
  (void)arg;
  while (!atomic_load(&g_go))
    ;
  for (int i = 0; i < 1000; i++)
    gr_tick_now_ms();
  return NULL;
}

Test(tick, many_threads_finding_the_tick_stopped_wake_the_worker_once) {
  gr_tick_open();
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    t[i] = gr_thread_start(allocate, NULL);
  atomic_store(&g_go, 1);
  for (int i = 0; i < THREADS; i++)
    gr_thread_join(t[i]);
  cr_assert_eq(wakeups(), 1);
}
