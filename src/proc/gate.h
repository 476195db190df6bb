/*
 * gate.h -- the gates: one tiny trampoline per driver entry point handed out (gate.S), shared by gate.S and C.
 *
 * A gate tests one byte (gr_gate_flag) and jumps to its entry point's real function. While the flag is set
 * (the process sleeps, is going to sleep, or an idle probe is armed) it saves the argument registers, calls
 * gr_gate_slow(index), restores them and jumps on to what that returned; NULL makes the gate return
 * CUDA_ERROR_OUT_OF_MEMORY (2, which is cudaErrorMemoryAllocation too) to its caller without the call.
 */
#ifndef GR_GATE_H
#define GR_GATE_H

#define GR_GATE_MAX 4096
#if defined(__aarch64__)
#define GR_GATE_STUB 64
#else
#define GR_GATE_STUB 32
#endif

#ifndef __ASSEMBLER__
#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>

/* 0 awake: every gate jumps straight on. GR_GATE_SLEEP: asleep or on the way (sleep.c). GR_GATE_PROBE: the
 * idle watch wants to know whether any call happens (the first one clears it). */
enum { GR_GATE_AWAKE = 0, GR_GATE_SLEEP = 1, GR_GATE_PROBE = 2 };
extern _Atomic unsigned char gr_gate_flag;

/* The gate for real (a driver function, or a wrapper of gpureclaim's), or real itself when gates are off or
 * all GR_GATE_MAX are in use. The same real gets the same gate. */
void *gr_gate_wrap(void *real);
/* Whether gates are installed in this process (GPURECLAIM_SLEEP, and the driver's checkpoint API for auto). */
bool gr_gate_enabled(void);
/* Gates handed out so far. */
unsigned gr_gate_count(void);

/* The slow path, in C: what a call that meets the flag set does (wake the process: sleep.c's
 * gr_sleep_gate_slow, handed over by core.c's constructor). CUDA_SUCCESS to go on with the call, else the error
 * the call returns; CUDA_SUCCESS while none was handed over. */
typedef CUresult (*gr_gate_slow_fn)(void);
void gr_gate_set_slow(gr_gate_slow_fn fn);
CUresult gr_gate_check_slow(void);

/* For gpureclaim's own wrappers (hooks/driver.c, procaddr.c), which are not behind a gate: the same test. */
static inline CUresult gr_gate_check(void) {
  if (__builtin_expect(atomic_load_explicit(&gr_gate_flag, memory_order_relaxed) == 0, 1))
    return CUDA_SUCCESS;
  return gr_gate_check_slow();
}

/* True while gpureclaim must not call the driver itself (asleep, waking, or the lock is about to be taken):
 * reports leave out what only the driver knows (releases are refused by admit.c, which reads the flag too). */
static inline bool gr_gate_driver_off(void) {
  return atomic_load_explicit(&gr_gate_flag, memory_order_acquire) == GR_GATE_SLEEP;
}

#endif
#endif
