/*
 * gate.c -- hands out gates (gate.h, gate.S): every driver entry point the program gets through
 * cuGetProcAddress or dlsym(libcuda) goes through one, so that the first call of any thread while the process
 * sleeps wakes it before the call goes on (sleep.c). Awake, a gate costs a byte compare and an indirect jump.
 * The gates call no module: the slow path is the function core.c's constructor handed over (gr_gate_set_slow).
 *
 * Gates are handed out once per distinct real function (a small hash table under a mutex: this runs at symbol
 * lookup, never per call) and never taken back: a program may keep the pointer for good. When all GR_GATE_MAX
 * are in use, further entry points are handed out ungated (warned about once; calls through them are not seen).
 * GPURECLAIM_SLEEP=0 installs none; auto installs them when the driver has the checkpoint API.
 */
#include "export.h"
#include "real.h"
#include "gate.h"
#include "options.h"

#include <pthread.h>

_Atomic unsigned char gr_gate_flag;
GR_HIDDEN void *gr_gate_target[GR_GATE_MAX];
extern char gr_gate_stubs[];
GR_HIDDEN void *gr_gate_slow(unsigned idx);

#define HASH_CAP (2 * GR_GATE_MAX) /* power of two, at most half full */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_keys[HASH_CAP];
static unsigned short g_idx[HASH_CAP];
static _Atomic unsigned g_n;
static _Atomic int g_enabled = -2; /* -2 not decided yet, else 0/1 */

bool gr_gate_enabled(void) {
  int e = atomic_load_explicit(&g_enabled, memory_order_acquire);
  if (GR_LIKELY(e >= 0))
    return e;
  int want = gr_opt()->sleep;
  if (want < 0) /* auto: only where a sleep can work */
    want = gr_real_driver("cuCheckpointProcessLock") != NULL;
  atomic_store_explicit(&g_enabled, want, memory_order_release);
  return want;
}

unsigned gr_gate_count(void) { return atomic_load_explicit(&g_n, memory_order_relaxed); }

void *gr_gate_wrap(void *real) {
  if (!real || !gr_gate_enabled())
    return real;
  uintptr_t h = ((uintptr_t)real >> 4) * UINT64_C(0x9e3779b97f4a7c15);
  size_t i = (size_t)(h >> 32) & (HASH_CAP - 1);
  void *gate = real;
  pthread_mutex_lock(&g_mu);
  while (g_keys[i] && g_keys[i] != real)
    i = (i + 1) & (HASH_CAP - 1);
  if (g_keys[i]) {
    gate = gr_gate_stubs + (size_t)g_idx[i] * GR_GATE_STUB;
  } else {
    unsigned n = atomic_load_explicit(&g_n, memory_order_relaxed);
    if (n < GR_GATE_MAX) {
      /* The target is in place before the gate's address is published (the mutex and the caller's own
       * hand-over order it for every thread that later gets the pointer). */
      __atomic_store_n(&gr_gate_target[n], real, __ATOMIC_RELEASE);
      g_keys[i] = real;
      g_idx[i] = (unsigned short)n;
      atomic_store_explicit(&g_n, n + 1, memory_order_relaxed);
      gate = gr_gate_stubs + (size_t)n * GR_GATE_STUB;
    }
  }
  pthread_mutex_unlock(&g_mu);
  if (gate == real)
    gr_warn_once(w_full, "all %d gates are in use: further driver entry points are handed out without one, and "
                         "a call through them while the process sleeps is not seen (it blocks in the driver "
                         "until a wake)", GR_GATE_MAX);
  return gate;
}

static _Atomic(gr_gate_slow_fn) g_slow;

void gr_gate_set_slow(gr_gate_slow_fn fn) { atomic_store_explicit(&g_slow, fn, memory_order_release); }

CUresult gr_gate_check_slow(void) {
  gr_gate_slow_fn fn = atomic_load_explicit(&g_slow, memory_order_acquire);
  return fn ? fn() : CUDA_SUCCESS;
}

/* Called by a gate whose flag was set; the argument registers are saved. */
void *gr_gate_slow(unsigned idx) {
  void *target = __atomic_load_n(&gr_gate_target[idx], __ATOMIC_ACQUIRE);
  return gr_gate_check_slow() == CUDA_SUCCESS ? target : NULL;
}
