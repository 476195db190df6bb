/*
 * tick.h -- the allocation-time tick (tick.c): a block's allocation time without a clock read per allocation.
 * The worker thread (worker.c) stores gr_state_now_ms() << 1 in gr_tick every GR_TICK_MS while the process
 * allocates; the first allocation that reads a tick sets its bit 0 (so the worker knows the process still
 * allocates), and after a second of ticks that no allocation read the worker stores 0 and sleeps. An allocation
 * that reads 0 takes the time from the clock and wakes the worker (gr_tick_slow). So a block's time is the coarse
 * clock's at most a tick (plus the worker's scheduling delay) early, never stale across an idle period.
 */
#ifndef GPURECLAIM_TICK_H
#define GPURECLAIM_TICK_H

#include "common.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GR_TICK_MS 4
extern _Atomic uint64_t gr_tick;
uint64_t gr_tick_slow(uint64_t tick);
static inline uint64_t gr_tick_now_ms(void) {
  uint64_t v = atomic_load_explicit(&gr_tick, memory_order_relaxed);
  return GR_LIKELY(v & 1) ? v >> 1 : gr_tick_slow(v);
}

/* The worker's side. open: the descriptor an allocation that finds the tick stopped writes to (made once);
 * fd: it, for the worker's poll (-1 before open); resume: that descriptor became readable (drained, ticking
 * again); step: one tick, returns whether the worker keeps ticking (*idle counts ticks no allocation read). */
void gr_tick_open(void);
int gr_tick_fd(void);
void gr_tick_resume(void);
bool gr_tick_step(bool ticking, unsigned *idle);
/* The worker starts ticking (an allocation's request is not needed for its first second). */
void gr_tick_want(void);
void gr_tick_atfork_child(void);

#endif /* GPURECLAIM_TICK_H */
