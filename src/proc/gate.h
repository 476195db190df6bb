/*
 * gate.h -- the gates: one tiny trampoline per driver entry point handed out (gate.S), shared by gate.S and C.
 *
 * A gate marks its thread in flight (the counter of the thread's record, gr_gate_rec_t, which the gate reads
 * through the thread-local gr_gate_tls), tests one byte (gr_gate_flag) and, while it is clear, calls its entry
 * point's real function (with a copy of GR_GATE_STACK_SLOTS argument slots of the stack, every argument register
 * untouched), clears the mark and returns what the function returned. While the flag is set (the process sleeps,
 * is going to sleep, or an idle probe is armed), or the thread has no record yet, it takes the mark back, saves
 * the argument registers, calls gr_gate_slow(index), restores them and starts over when that returned non-NULL;
 * NULL makes the gate return CUDA_ERROR_OUT_OF_MEMORY (2, which is cudaErrorMemoryAllocation too) to its caller
 * without the call.
 *
 * So a call that passed its gate is counted until it returns: a sleep raises the flag, makes the raising
 * visible to every thread (gr_gate_quiesce: membarrier, or seq_cst operations and fences on both sides where
 * the kernel lacks it), and waits for the counters to fall to 0 before it takes the driver's checkpoint lock; a call that comes
 * later meets the flag and waits at its gate. The counter is written by its own thread only (no atomic
 * read-modify-write on the fast path); with membarrier, the gate's store and its read of the flag need no fence.
 */
#ifndef GR_GATE_H
#define GR_GATE_H

#define GR_GATE_MAX 4096
#define GR_GATE_STUB 16
/* Argument slots of the stack a gate copies for the call: the widest driver entry point has 16 arguments
 * (cuTensorMapEncodeIm2colWide; CUDA 13's cuda.h), 10 of them on the stack on x86-64 (6 in registers), 8 on
 * aarch64; none is variadic and none takes a structure by value. Even, so the copy keeps the stack aligned. */
#define GR_GATE_STACK_SLOTS 12
/* The record's layout, for gate.S. */
#define GR_GATE_REC_INFLIGHT 0

#ifndef __ASSEMBLER__
#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>

/* 0 awake: every gate jumps straight on. GR_GATE_SLEEP: asleep or on the way (sleep.c). GR_GATE_PROBE: the
 * idle watch wants to know whether any call happens (the first one clears it). */
enum { GR_GATE_AWAKE = 0, GR_GATE_SLEEP = 1, GR_GATE_PROBE = 2 };
extern _Atomic unsigned char gr_gate_flag;

/* A thread's record: how many calls it has in flight past a gate (written by the thread only, read by a
 * sleep). Records are never freed: a thread that ends hands its record to the next new one. */
typedef struct gr_gate_rec {
  _Atomic long inflight; /* at GR_GATE_REC_INFLIGHT */
  _Atomic int used;      /* held by a live thread */
  _Atomic int tid;       /* that thread's id (for a refusal's reason) */
  char pad[64 - sizeof(long) - 2 * sizeof(int)];
} __attribute__((aligned(64))) gr_gate_rec_t;
/* The calling thread's record, NULL until its first call through a gate or gr_gate_enter (initial-exec TLS,
 * read by gate.S). */
extern __thread gr_gate_rec_t *gr_gate_tls __attribute__((tls_model("initial-exec")));
/* Non-zero while membarrier is not available: the gates then fence between their mark and their read of the
 * flag (gr_gate_quiesce fences on its side). Set before any gate is handed out (gr_gate_enabled). */
extern _Atomic unsigned char gr_gate_fence;

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

/* For gpureclaim's own wrappers (hooks/driver.c, procaddr.c), which are not always behind a gate: what a gate
 * does, in C. gr_gate_enter marks the thread in flight and returns CUDA_SUCCESS when the call may go on (the
 * caller then calls gr_gate_leave once the driver returned), or, unmarked, the error the call returns. */
CUresult gr_gate_enter_slow(void);
static inline __attribute__((always_inline)) CUresult gr_gate_enter(void) {
  gr_gate_rec_t *r = gr_gate_tls;
  if (__builtin_expect(r != NULL, 1)) {
    if (__builtin_expect(atomic_load_explicit(&gr_gate_fence, memory_order_relaxed) == 0, 1)) {
      atomic_store_explicit(&r->inflight, atomic_load_explicit(&r->inflight, memory_order_relaxed) + 1,
                            memory_order_relaxed);
      atomic_signal_fence(memory_order_seq_cst); /* the mark before the read of the flag (membarrier: gate.c) */
      if (__builtin_expect(atomic_load_explicit(&gr_gate_flag, memory_order_relaxed) == 0, 1))
        return CUDA_SUCCESS;
    } else { /* no membarrier: the mark and the read in the one order every thread agrees on */
      atomic_fetch_add_explicit(&r->inflight, 1, memory_order_seq_cst);
      if (atomic_load_explicit(&gr_gate_flag, memory_order_seq_cst) == 0)
        return CUDA_SUCCESS;
    }
    atomic_store_explicit(&r->inflight, atomic_load_explicit(&r->inflight, memory_order_relaxed) - 1,
                          memory_order_relaxed); /* the slow path is entered unmarked */
  }
  return gr_gate_enter_slow();
}
static inline __attribute__((always_inline)) void gr_gate_leave(void) {
  gr_gate_rec_t *r = gr_gate_tls;
  atomic_store_explicit(&r->inflight, atomic_load_explicit(&r->inflight, memory_order_relaxed) - 1,
                        memory_order_release);
}

/* The sleep's side (sleep.c, with the flag already GR_GATE_SLEEP): makes the flag visible to every thread, then
 * waits up to timeout_ms for every other thread's calls past a gate to return. 0 when none is in flight; -EBUSY
 * when one still is at the timeout (*tid says which thread); -ENOMEM when a thread runs without a record (none
 * could be had: its calls cannot be counted). */
int gr_gate_quiesce(unsigned timeout_ms, int *tid);
/* Calls in flight past a gate on every thread now (tests, reports). */
long gr_gate_inflight(void);
/* A forked child: only the calling thread lives on; its record is kept, the others are free. */
void gr_gate_atfork_child(void);
/* Tests: 1 makes the gates fence as where membarrier is missing, 0 back to what the kernel offers. */
void gr_gate_force_fence(int on);

/* For gpureclaim's own entry points that only need the process awake (gpureclaim_release): the test alone. */
static inline CUresult gr_gate_check(void) {
  if (__builtin_expect(atomic_load_explicit(&gr_gate_flag, memory_order_relaxed) == 0, 1))
    return CUDA_SUCCESS;
  return gr_gate_check_slow();
}

/* For gpureclaim's own driver calls outside any gate (reports, stats): true, with the thread counted in flight
 * (gr_gate_leave() once the driver returned), when the driver may be asked; false, uncounted, while the process
 * sleeps or the lock is about to be taken. So a sleep waits for such a call as for one past a gate. */
bool gr_gate_driver_begin(void);

/* True while gpureclaim must not call the driver itself (asleep, waking, or the lock is about to be taken):
 * reports leave out what only the driver knows (releases are refused by admit.c, which reads the flag too). */
static inline bool gr_gate_driver_off(void) {
  return atomic_load_explicit(&gr_gate_flag, memory_order_acquire) == GR_GATE_SLEEP;
}

#endif
#endif
