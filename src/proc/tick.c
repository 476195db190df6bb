/* tick.c -- see tick.h. */
#include "tick.h"
#include "state.h"

#include <sys/eventfd.h>
#include <unistd.h>

_Atomic uint64_t gr_tick;
static _Atomic int g_tick_wanted;      /* 1 from an allocation's request until the worker stops ticking */
static _Atomic int g_tick_fd = -1;     /* an allocation that finds the tick stopped wakes the worker through it */
#define IDLE_TICKS (1000 / GR_TICK_MS) /* a second of ticks no allocation read: stop ticking */

uint64_t gr_tick_slow(uint64_t tick) {
  if (tick) { /* the first allocation of this tick: mark it read */
    atomic_fetch_or_explicit(&gr_tick, 1, memory_order_relaxed);
    return tick >> 1;
  }
  uint64_t now = gr_state_now_ms();
  if (!atomic_exchange_explicit(&g_tick_wanted, 1, memory_order_relaxed)) {
    int fd = atomic_load_explicit(&g_tick_fd, memory_order_acquire); /* published after it was made */
    uint64_t one = 1;
    if (fd >= 0) {
      ssize_t w = write(fd, &one, sizeof one); /* cannot fill up: the worker drains it */
      (void)w;
    }
  }
  return now;
}

bool gr_tick_step(bool ticking, unsigned *idle) {
  if (!ticking)
    return false;
  uint64_t was = atomic_exchange_explicit(&gr_tick, gr_state_now_ms() << 1, memory_order_relaxed);
  if (was & 1) {
    *idle = 0;
    return true;
  }
  if (++*idle < IDLE_TICKS)
    return true;
  /* Stopped: 0 first, so an allocation from now on reads the clock and, once the request below is cleared,
   * wakes the worker again. */
  atomic_store_explicit(&gr_tick, 0, memory_order_relaxed);
  atomic_store_explicit(&g_tick_wanted, 0, memory_order_relaxed);
  return false;
}

void gr_tick_open(void) {
  if (atomic_load_explicit(&g_tick_fd, memory_order_relaxed) < 0)
    atomic_store_explicit(&g_tick_fd, eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), memory_order_release);
}

int gr_tick_fd(void) { return atomic_load_explicit(&g_tick_fd, memory_order_relaxed); }

void gr_tick_resume(void) {
  uint64_t count;
  while (read(atomic_load_explicit(&g_tick_fd, memory_order_relaxed), &count, sizeof count) > 0)
    ;
  atomic_store_explicit(&g_tick_wanted, 1, memory_order_relaxed);
}

void gr_tick_want(void) { atomic_store_explicit(&g_tick_wanted, 1, memory_order_relaxed); }

void gr_tick_atfork_child(void) {
  /* The worker did not survive the fork: allocations read the clock until the child's own worker ticks. */
  atomic_store_explicit(&gr_tick, 0, memory_order_relaxed);
  atomic_store_explicit(&g_tick_wanted, 0, memory_order_relaxed);
  /* The parent's eventfd is shared with it: the child's worker makes its own, or it could swallow the wake-ups
   * of the parent's allocations. */
  int fd = atomic_exchange_explicit(&g_tick_fd, -1, memory_order_relaxed);
  if (fd >= 0)
    close(fd);
}
