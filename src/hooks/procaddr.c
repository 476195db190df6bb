/*
 * procaddr.c -- cuGetProcAddress[_v2]: the only route by which the CUDA 12/13 runtime (static or shared), and
 * so PyTorch, CuPy, JAX and every nvcc-built binary, reach the driver.
 *
 * What the driver returns is wrapped when the symbol is a hooked variant (hooklist.h) or "cuGetProcAddress"
 * itself (the runtime re-fetches it through the first one and would otherwise bypass the wrapper).
 * The variant is chosen by (name, version, flags) exactly as the driver chooses it: the highest variant whose
 * first version is <= the requested version, the _ptsz one when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * is set. Old ABIs asked for on purpose (cuCtxCreate@3020, cuDevicePrimaryCtxRelease@7000) get their own
 * wrappers. Each variant keeps the one real pointer it was handed; a different pointer for the same variant,
 * or a version newer than this build's headers (CUDA_VERSION) whose function differs from the one at the
 * variant's first version, is handed out unwrapped (never substituted) and counted in untracked_routes.
 */
#include "export.h"
#include "real.h"
#include "hooks.h"
#include "hooklist.h" /* GR_H_COUNT */
#include "stats.h"

#include "gate.h"
#include "state.h"

#include <cudaTypedefs.h>
#include <string.h>

#undef cuGetProcAddress


static _Atomic(void *) g_ex_v1, g_ex_v2; /* libcuda's exported cuGetProcAddress / _v2 */
static _Atomic(void *) g_pa_v1, g_pa_v2; /* what the driver returned when asked for "cuGetProcAddress" */
static _Atomic int g_abi_checked[GR_H_COUNT]; /* per variant: 0 unknown, 1 proven, -1 refused */

typedef CUresult (*getproc_v1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*getproc_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void untracked(const char *symbol, int version, const char *why) {
  atomic_fetch_add_explicit(&gr_untracked_routes, 1, memory_order_relaxed);
  gr_warn("%s (version %d) handed out unwrapped: %s; allocations through it are not tracked", symbol, version, why);
}

static bool has_ptsz(const char *base) {
  for (int i = 0; i < gr_hook_count(); i++)
    if (gr_hooks[i].ptsz && strcmp(gr_hooks[i].base, base) == 0)
      return true;
  return false;
}

static int find_variant(const char *symbol, int version, uint64_t flags) {
  int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
  int best = -1;
  bool checked_ptsz = false, ptsz_exists = false;
  for (int i = 0; i < gr_hook_count(); i++) {
    const gr_hook_info_t *h = &gr_hooks[i];
    if (h->version > version || strcmp(h->base, symbol) != 0)
      continue;
    if (!checked_ptsz) {
      ptsz_exists = has_ptsz(symbol);
      checked_ptsz = true;
    }
    if (ptsz_exists && h->ptsz != want_ptsz)
      continue;
    if (best < 0 || h->version > gr_hooks[best].version)
      best = i;
  }
  return best;
}

/* Asks the real driver for symbol at an exact version, through whichever real getter we have. */
static void *query(const char *symbol, int version, uint64_t flags, getproc_v1_t v1, getproc_v2_t v2) {
  void *p = NULL;
  CUresult rc;
  if (v2) {
    CUdriverProcAddressQueryResult st;
    rc = v2(symbol, &p, version, flags, &st);
  } else {
    rc = v1(symbol, &p, version, flags);
  }
  return rc == CUDA_SUCCESS ? p : NULL;
}

static void *wrap(const char *symbol, void *real, int version, uint64_t flags, getproc_v1_t v1, getproc_v2_t v2);

/* ---- the getters themselves ---- */

static CUresult CUDAAPI pa_getproc_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  CUresult gate = gr_gate_check();
  if (GR_UNLIKELY(gate != CUDA_SUCCESS))
    return gate;
  getproc_v1_t real = (getproc_v1_t)atomic_load_explicit(&g_pa_v1, memory_order_acquire);
  CUresult rc = real(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && pfn && *pfn && symbol)
    *pfn = wrap(symbol, *pfn, version, flags, real, NULL);
  return rc;
}

static CUresult CUDAAPI pa_getproc_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status) {
  CUresult gate = gr_gate_check();
  if (GR_UNLIKELY(gate != CUDA_SUCCESS))
    return gate;
  getproc_v2_t real = (getproc_v2_t)atomic_load_explicit(&g_pa_v2, memory_order_acquire);
  CUresult rc = real(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && pfn && *pfn && symbol)
    *pfn = wrap(symbol, *pfn, version, flags, NULL, real);
  return rc;
}

static void *ex_getter(_Atomic(void *) *slot, const char *name) {
  void *p = atomic_load_explicit(slot, memory_order_acquire);
  if (!p && (p = gr_real_driver(name)))
    atomic_store_explicit(slot, p, memory_order_release);
  return p;
}

GR_INTERPOSE CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
GR_INTERPOSE CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
  getproc_v1_t real = (getproc_v1_t)ex_getter(&g_ex_v1, "cuGetProcAddress");
  if (!real)
    return CUDA_ERROR_NOT_FOUND;
  CUresult gate = gr_gate_check();
  if (GR_UNLIKELY(gate != CUDA_SUCCESS))
    return gate;
  CUresult rc = real(symbol, pfn, cudaVersion, flags);
  if (rc == CUDA_SUCCESS && pfn && *pfn && symbol)
    *pfn = wrap(symbol, *pfn, cudaVersion, flags, real, NULL);
  return rc;
}

GR_INTERPOSE CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                               CUdriverProcAddressQueryResult *symbolStatus) {
  getproc_v2_t real = (getproc_v2_t)ex_getter(&g_ex_v2, "cuGetProcAddress_v2");
  if (!real)
    return CUDA_ERROR_NOT_FOUND;
  CUresult gate = gr_gate_check();
  if (GR_UNLIKELY(gate != CUDA_SUCCESS))
    return gate;
  CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (rc == CUDA_SUCCESS && pfn && *pfn && symbol)
    *pfn = wrap(symbol, *pfn, cudaVersion, flags, NULL, real);
  return rc;
}

/* Keeps the first real pointer of a slot; false if the slot already holds another one. */
static bool keep(_Atomic(void *) *slot, void *real) {
  void *expected = NULL;
  return atomic_compare_exchange_strong_explicit(slot, &expected, real, memory_order_acq_rel,
                                                 memory_order_acquire) ||
         expected == real;
}

static void *wrap_or_real(const char *symbol, void *real, int version, uint64_t flags, getproc_v1_t v1, getproc_v2_t v2) {
  if (gr_state_disabled() || symbol[0] != 'c' || symbol[1] != 'u')
    return real;
  if (strcmp(symbol, "cuGetProcAddress") == 0) {
    bool is_v2 = version >= 12000;
    if (!keep(is_v2 ? &g_pa_v2 : &g_pa_v1, real)) {
      untracked(symbol, version, "the driver returned a second, different getter");
      return real;
    }
    return is_v2 ? (void *)pa_getproc_v2 : (void *)pa_getproc_v1;
  }
  int id = find_variant(symbol, version, flags);
  if (id < 0)
    return real;
  const gr_hook_info_t *h = &gr_hooks[id];
  if (version > CUDA_VERSION && (size_t)id < GR_ARRAY_LEN(g_abi_checked)) {
    /* Newer than the headers this build knows: the variant table cannot vouch for the ABI. The same function
     * as at the variant's first version means the same ABI; anything else is handed out unwrapped. */
    int state = atomic_load_explicit(&g_abi_checked[id], memory_order_acquire);
    if (state == 0) {
      void *at_first = query(symbol, h->version, flags, v1, v2);
      state = at_first == real ? 1 : -1;
      atomic_store_explicit(&g_abi_checked[id], state, memory_order_release);
    }
    if (state < 0) {
      untracked(symbol, version, "a newer ABI than this build of gpureclaim knows");
      return real;
    }
  }
  if (!keep(&gr_pa_real[id], real)) {
    untracked(symbol, version, "the driver returned a second, different function for the same variant");
    return real;
  }
  return h->pa_fn;
}

/* What the caller gets: a wrapper of ours (which tests the sleep flag itself), or the driver's function behind
 * a gate (gate.c), so that a call through it while the process sleeps wakes it first. */
static void *wrap(const char *symbol, void *real, int version, uint64_t flags, getproc_v1_t v1, getproc_v2_t v2) {
  void *fn = wrap_or_real(symbol, real, version, flags, v1, v2);
  return fn == real && !gr_state_disabled() ? gr_gate_wrap(real) : fn;
}

/* dlsym of the getters themselves: our exported definitions when real is libcuda's function. */
void *gr_hook_getproc_for(const char *symbol, void *real) {
  if (strcmp(symbol, "cuGetProcAddress") == 0)
    return real == ex_getter(&g_ex_v1, "cuGetProcAddress") ? (void *)cuGetProcAddress : NULL;
  if (strcmp(symbol, "cuGetProcAddress_v2") == 0)
    return real == ex_getter(&g_ex_v2, "cuGetProcAddress_v2") ? (void *)cuGetProcAddress_v2 : NULL;
  return NULL;
}

bool gr_hook_is_getproc_export(const void *fn) {
  return fn == (const void *)cuGetProcAddress || fn == (const void *)cuGetProcAddress_v2;
}
