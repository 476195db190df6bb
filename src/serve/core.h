/*
 * core.h -- gpureclaim's life in a process (core.c): started by the first CUDA call a hook sees, reset in a
 * forked child, stopped at exit. Only the hooks start it; what the other modules read of it is in state.h.
 */
#ifndef GPURECLAIM_CORE_H
#define GPURECLAIM_CORE_H

#include "state.h"

/* Starts gpureclaim's machinery (table, worker thread, signal handler, status file), or waits while another
 * thread does. Idempotent, cheap after the first call. Returns true when tracking is on. */
bool gr_core_start_slow(void);
static inline bool gr_core_active(void) {
  int s = atomic_load_explicit(&gr_state_run, memory_order_acquire);
  /* 2: another thread is starting it; a block allocated meanwhile must be tracked too, so wait for it. */
  return GR_LIKELY(s == 1) || (s >= 0 && gr_core_start_slow());
}

#endif /* GPURECLAIM_CORE_H */
