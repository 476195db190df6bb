/*
 * driver.c -- the driver entry points gpureclaim wraps.
 *
 * Each hooked variant in hooklist.h gets two thin wrappers that share one body:
 *   - the exported definition (a program linked with -lcuda, or a dlsym() of that name, reaches it), which
 *     calls the function of that name in the process's libcuda;
 *   - a static wrapper handed out by cuGetProcAddress (procaddr.c), which calls the pointer the driver returned
 *     for that (symbol, version, flags).
 * Both pass the sleep gate first (gate.h: one flag test; while the process sleeps, the call wakes it).
 * A body calls the real function first and records what it did only when it succeeded; it never changes the
 * result, except for the out-of-memory retry (GPURECLAIM_OOM_RETRY), a late free of a block a release
 * already freed (gpureclaim.h, scopes), and GPURECLAIM_LIMIT: an allocation past the process's limit fails with
 * CUDA_ERROR_OUT_OF_MEMORY without reaching the driver, and cuMemGetInfo reports the limit (limit.c).
 */
/* cuCtxDetach is deprecated in cuda.h, and this file defines it (an interposer wraps what programs still call). */
#define CUDA_ENABLE_DEPRECATED 1
#include "export.h"
#include "real.h"
#include "hooks.h"
#include "registry.h"
#include "stats.h"
#include "limit.h"
#include "track.h"
#include "release.h"
#include "peer.h"
#include "wait.h"
#include "sleep.h"
#include "admit.h"
#include "capture.h"
#include "core.h"
#include "hooklist.h"
#include "gate.h"
#include "options.h"

#include <cudaTypedefs.h>
#include <string.h>

/* cuda.h maps these names to later versions; this file defines each version under its own name. */
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuIpcOpenMemHandle
#undef cuStreamBeginCapture
#undef cuMemGetInfo

/* Real pointers: the export route resolves the symbol in libcuda once; the procaddr route keeps the pointer
 * cuGetProcAddress returned (procaddr.c fills it). */
static _Atomic(void *) g_ex_real[GR_H_COUNT];
_Atomic(void *) gr_pa_real[GR_H_COUNT];

static const char *const g_sym_names[GR_H_COUNT] = {
#define NAME(sym, base, ver, ptsz, body, params, args) #sym,
    GR_DRIVER_HOOKS(NAME)
#undef NAME
};

GR_COLD static void *resolve_export(int id) {
  void *p = gr_real_driver(g_sym_names[id]);
  if (p)
    atomic_store_explicit(&g_ex_real[id], p, memory_order_release);
  else
    gr_warn("the driver has no %s; the call fails with CUDA_ERROR_NOT_FOUND", g_sym_names[id]);
  return p;
}

static inline void *ex_real(int id) {
  void *p = atomic_load_explicit(&g_ex_real[id], memory_order_acquire);
  return GR_LIKELY(p != NULL) ? p : resolve_export(id);
}
static inline void *pa_real(int id) { return atomic_load_explicit(&gr_pa_real[id], memory_order_acquire); }

#define DEVICE_KINDS                                                                                       \
  ((1u << GPURECLAIM_KIND_DEVICE) | (1u << GPURECLAIM_KIND_PITCH) | (1u << GPURECLAIM_KIND_MANAGED) |     \
   (1u << GPURECLAIM_KIND_ASYNC))

/* What a body does when its allocation ran out of memory (in its cold retry_ function below): first retries
 * after releasing what is safe from this thread (GPURECLAIM_OOM_RETRY times at most); then, if it still failed,
 * asks the other gpureclaim processes on the same GPU (peer.c) and retries once more: after a peer reclaim, or
 * when another thread or process ran one on this GPU while this one waited for it; then, still short, waits
 * for memory to come (wait.c: GPURECLAIM_WAIT, while another gpureclaim process shares the GPU), retrying at
 * its turn in the GPU's queue. device: the ordinal the allocation is on (-1: the current context's). */
#define RETRIES(rc, bytes, device, call)                                                                   \
  do {                                                                                                     \
    for (unsigned attempt_ = 0; (rc) == CUDA_ERROR_OUT_OF_MEMORY && attempt_ < gr_opt()->oom_retry;        \
         attempt_++) {                                                                                     \
      if (gr_release_for_oom() == 0)                                                                       \
        break;                                                                                             \
      (rc) = (call);                                                                                       \
      gr_stats_oom_retry((rc) == CUDA_SUCCESS);                                                            \
    }                                                                                                      \
    gr_peer_op_t op_;                                                                                      \
    if ((rc) == CUDA_ERROR_OUT_OF_MEMORY && gr_peer_begin(&op_, (bytes), (device))) {                     \
      if (op_.waited)                                                                                      \
        (rc) = (call);                                                                                     \
      if ((rc) == CUDA_ERROR_OUT_OF_MEMORY && gr_peer_ask(&op_) > 0)                                       \
        (rc) = (call);                                                                                     \
      gr_peer_end(&op_, (rc) == CUDA_SUCCESS);                                                             \
    }                                                                                                      \
    /* Still short: wait for memory to come (wait.c, GPURECLAIM_WAIT), in the GPU's queue; at each turn retry,  \
     * and ask the peers again now and then (an allocation past its own limit never reaches here). */        \
    gr_wait_t w_;                                                                                          \
    if ((rc) == CUDA_ERROR_OUT_OF_MEMORY && !gr_peer_busy_here() &&                                        \
        gr_wait_begin(&w_, (bytes), (device), NULL, GR_WAIT_ALLOC, 0)) {                                   \
      while ((rc) == CUDA_ERROR_OUT_OF_MEMORY && gr_wait_turn(&w_)) {                                      \
        (rc) = (call);                                                                                     \
        if ((rc) == CUDA_ERROR_OUT_OF_MEMORY && gr_wait_ask_due(&w_) && gr_peer_begin(&op_, (bytes), (device))) { \
          if (op_.waited || gr_peer_ask(&op_) > 0)                                                         \
            (rc) = (call);                                                                                 \
          gr_peer_end(&op_, (rc) == CUDA_SUCCESS);                                                         \
        }                                                                                                  \
      }                                                                                                    \
      gr_wait_end(&w_, (rc) == CUDA_SUCCESS);                                                              \
    }                                                                                                      \
  } while (0)

/* GPURECLAIM_LIMIT (limit.c): whether an allocation of bytes on device (-1: unknown) is refused because the
 * process would pass its limit there. Before refusing, it releases what is safe from this thread, as an
 * out-of-memory does (GPURECLAIM_OOM_RETRY rounds at most), and admits the allocation if that made room. It
 * asks no peer and does not wait: memory other processes give cannot bring this one back under its own limit.
 * Admitted, the allocation holds its bytes until its block is counted, or the driver fails it (ALLOC_BODY:
 * gr_limit_end). */
GR_COLD static bool limit_refused(int device, uint64_t bytes) {
  if (gr_limit_admit(device, bytes))
    return false;
  for (unsigned attempt = 0; attempt < gr_opt()->oom_retry; attempt++) {
    if (gr_release_for_oom() == 0)
      break;
    bool ok = gr_limit_admit(device, bytes) != 0;
    gr_stats_oom_retry(ok);
    if (ok)
      return false;
  }
  char a[32], b[32], c[32];
  gr_warn_once(w_limit, "an allocation of %s on GPU %d fails with CUDA_ERROR_OUT_OF_MEMORY: this process holds %s "
                        "there and its limit is %s (GPURECLAIM_LIMIT; raise it, or free memory first); further "
                        "refusals are not reported",
               gr_log_bytes(bytes, a, sizeof a), device, gr_log_bytes(gr_limit_held(device), b, sizeof b),
               gr_log_bytes(gr_limit_bytes(device), c, sizeof c));
  return true;
}


/* RETRIES, one function per allocating body, out of line: only a failed allocation pays for them, and the hot
 * bodies keep a small frame (a peer reclaim's state is over a kilobyte). */
GR_COLD static CUresult retry_mem_alloc(PFN_cuMemAlloc_v3020 real, CUdeviceptr *dptr, size_t bytesize, CUresult rc) {
  RETRIES(rc, bytesize, -1, real(dptr, bytesize));
  return rc;
}

GR_COLD static CUresult retry_mem_alloc_pitch(PFN_cuMemAllocPitch_v3020 real, CUdeviceptr *dptr, size_t *pPitch,
                                              size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes,
                                              CUresult rc) {
  RETRIES(rc, (uint64_t)WidthInBytes * Height, -1, real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
  return rc;
}

GR_COLD static CUresult retry_mem_alloc_managed(PFN_cuMemAllocManaged_v6000 real, CUdeviceptr *dptr, size_t bytesize,
                                                unsigned int flags, CUresult rc) {
  RETRIES(rc, bytesize, -1, real(dptr, bytesize, flags));
  return rc;
}

GR_COLD static CUresult retry_mem_alloc_async(PFN_cuMemAllocAsync_v11020 real, CUdeviceptr *dptr, size_t bytesize,
                                              CUstream hStream, CUresult rc) {
  RETRIES(rc, bytesize, gr_reg_async_device(NULL, hStream), real(dptr, bytesize, hStream));
  return rc;
}

GR_COLD static CUresult retry_mem_alloc_from_pool(PFN_cuMemAllocFromPoolAsync_v11020 real, CUdeviceptr *dptr,
                                                  size_t bytesize, CUmemoryPool pool, CUstream hStream, CUresult rc) {
  RETRIES(rc, bytesize, gr_reg_async_device(pool, hStream), real(dptr, bytesize, pool, hStream));
  return rc;
}

/* The device ordinal a VMM allocation's properties name, -1 for none (host memory, or out of range). */
static int prop_device(const CUmemAllocationProp *prop) {
  return prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
                 prop->location.id < GR_MAX_DEV
             ? prop->location.id
             : -1;
}

GR_COLD static CUresult retry_mem_create(PFN_cuMemCreate_v10020 real, CUmemGenericAllocationHandle *handle, size_t size,
                                         const CUmemAllocationProp *prop, unsigned long long flags, CUresult rc) {
  RETRIES(rc, size, prop_device(prop), real(handle, size, prop, flags));
  return rc;
}

/* ---- common bodies ---- */

/* The allocation body that every allocating hook shares (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged,
 * cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemHostAlloc, cuMemAllocHost, cuMemCreate): the driver call with
 * the hook depth raised; after an out-of-memory, retry (the body's cold retry_ function above, handed the failed
 * rc_; no_retry where there is none); after a success, track (its record, which may read seq0_:
 * gr_track_ctx_seq() before the driver call, as a destroy of the context may overlap, track.c). A check that every
 * allocation makes before it reaches the driver (a limit, a wait for memory) belongs here, once, before the
 * first call: GPURECLAIM_LIMIT's admission (limit_dev: the device the bytes count on, -1 for none; evaluated only
 * with a limit set). */
#define ALLOC_BODY(limit_dev, limit_bytes, call, retry, track)                                              \
  do {                                                                                                     \
    if (!gr_core_active())                                                                                 \
      return (call);                                                                                       \
    gr_tls.hook_depth++;                                                                                   \
    if (GR_UNLIKELY(gr_limit_on()) && limit_refused((limit_dev), (limit_bytes))) {                         \
      gr_tls.hook_depth--;                                                                                 \
      return CUDA_ERROR_OUT_OF_MEMORY; /* past GPURECLAIM_LIMIT, its own cache released: no driver call */  \
    }                                                                                                      \
    uint64_t seq0_ = gr_track_ctx_seq(); /* a context destroy may overlap (track.c) */                     \
    (void)seq0_; /* a body whose record does not need it (cuMemCreate) */                                  \
    CUresult rc_ = (call);                                                                                 \
    if (GR_UNLIKELY(rc_ != CUDA_SUCCESS) && rc_ == CUDA_ERROR_OUT_OF_MEMORY) /* success tested first */    \
      rc_ = (retry);                                                                                       \
    if (GR_LIKELY(rc_ == CUDA_SUCCESS))                                                                    \
      track;                                                                                               \
    else if (GR_UNLIKELY(gr_limit_on()))                                                                   \
      gr_limit_end(); /* failed: what it held under the limit goes back (a tracked block's count took it) */ \
    gr_tls.hook_depth--;                                                                                   \
    return rc_;                                                                                            \
  } while (0)

/* ALLOC_BODY's limit_dev for what no limit counts (pinned host memory). */
#define NOT_LIMITED (-1)

/* Pinned host memory is not retried: a release frees device memory. */
static inline CUresult no_retry(CUresult rc) { return rc; }

/* The same for a VMM handle whose cuMemRelease got CUDA_ERROR_INVALID_VALUE: gone unless the driver still knows
 * it. */
GR_COLD static bool handle_gone(CUmemGenericAllocationHandle h) {
  CUmemAllocationProp prop;
  return !gr_drv.cuMemGetAllocationPropertiesFromHandle ||
         gr_drv.cuMemGetAllocationPropertiesFromHandle(&prop, h) != CUDA_SUCCESS;
}

/* A free: untrack first (CUDA reuses addresses), call the driver, and on a refusal put the record back unless the
 * block is gone (gr_track_free_refused). */
#define FREE_BODY(ks, key, kinds, call)                                                                    \
  do {                                                                                                     \
    gr_packed_t rec_;                                                                                      \
    uint64_t seq0_ = gr_track_ctx_seq(); /* a context destroy may overlap (track.c) */                     \
    int taken_ = gr_track_take_pk((ks), (key), (kinds), &rec_);                                            \
    if (taken_ < 0)                                                                                        \
      return CUDA_SUCCESS; /* late free of a block a release freed: must not reach the driver */           \
    gr_tls.hook_depth++;                                                                                   \
    CUresult rc_ = (call);                                                                                 \
    gr_tls.hook_depth--;                                                                                   \
    if (taken_ > 0) {                                                                                      \
      if (GR_LIKELY(rc_ == CUDA_SUCCESS))                                                                  \
        gr_track_freed_pk(&rec_);                                                                          \
      else                                                                                                 \
        gr_track_free_refused(&rec_, seq0_, rc_);                                                          \
    }                                                                                                      \
    return rc_;                                                                                            \
  } while (0)

#define NEED_REAL(realp)                                                                                   \
  do {                                                                                                     \
    if (GR_UNLIKELY(!(realp)))                                                                             \
      return CUDA_ERROR_NOT_FOUND;                                                                         \
  } while (0)

/* ---- bodies ---- */

static CUresult b_init(void *realp, uintptr_t ra, unsigned int Flags) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuInit_v2000)realp)(Flags);
  if (rc == CUDA_SUCCESS && atomic_load_explicit(&gr_state_run, memory_order_acquire) == 0)
    gr_core_start_slow();
  return rc;
}

static GR_HOT_INLINE CUresult b_mem_alloc(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize) {
  NEED_REAL(realp);
  PFN_cuMemAlloc_v3020 real = (PFN_cuMemAlloc_v3020)realp;
  ALLOC_BODY(gr_reg_here_device(), bytesize, real(dptr, bytesize), retry_mem_alloc(real, dptr, bytesize, rc_),
             gr_track_alloc_here(GPURECLAIM_KIND_DEVICE, *dptr, bytesize, GR_API_cuMemAlloc, ra, seq0_));
}

static CUresult b_mem_alloc_pitch(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t *pPitch,
                                  size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes) {
  NEED_REAL(realp);
  PFN_cuMemAllocPitch_v3020 real = (PFN_cuMemAllocPitch_v3020)realp;
  ALLOC_BODY(gr_reg_here_device(), (uint64_t)WidthInBytes * Height, /* the rows' padding counts once the block is */
             real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes),
             retry_mem_alloc_pitch(real, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, rc_),
             gr_track_alloc_here(GPURECLAIM_KIND_PITCH, *dptr, (uint64_t)*pPitch * Height, GR_API_cuMemAllocPitch, ra,
                                 seq0_));
}

static CUresult b_mem_alloc_managed(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize,
                                    unsigned int flags) {
  NEED_REAL(realp);
  PFN_cuMemAllocManaged_v6000 real = (PFN_cuMemAllocManaged_v6000)realp;
  ALLOC_BODY(gr_reg_here_device(), bytesize, real(dptr, bytesize, flags),
             retry_mem_alloc_managed(real, dptr, bytesize, flags, rc_),
             gr_track_alloc_here(GPURECLAIM_KIND_MANAGED, *dptr, bytesize, GR_API_cuMemAllocManaged, ra, seq0_));
}

static GR_HOT_INLINE CUresult b_mem_free(void *realp, uintptr_t ra, CUdeviceptr dptr) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemFree_v3020 real = (PFN_cuMemFree_v3020)realp;
  if (!dptr || !gr_core_active())
    return real(dptr);
  FREE_BODY(GR_KS_ADDR, dptr, DEVICE_KINDS, real(dptr));
}

static GR_HOT_INLINE CUresult b_mem_alloc_async(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize,
                                                CUstream hStream) {
  NEED_REAL(realp);
  PFN_cuMemAllocAsync_v11020 real = (PFN_cuMemAllocAsync_v11020)realp;
  ALLOC_BODY(gr_reg_async_device(NULL, hStream), bytesize, real(dptr, bytesize, hStream),
             retry_mem_alloc_async(real, dptr, bytesize, hStream, rc_),
             gr_track_alloc_async(*dptr, bytesize, NULL, hStream, GR_API_cuMemAllocAsync, ra, seq0_));
}

static GR_HOT_INLINE CUresult b_mem_alloc_from_pool(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize,
                                                    CUmemoryPool pool, CUstream hStream) {
  NEED_REAL(realp);
  PFN_cuMemAllocFromPoolAsync_v11020 real = (PFN_cuMemAllocFromPoolAsync_v11020)realp;
  ALLOC_BODY(gr_reg_async_device(pool, hStream), bytesize, real(dptr, bytesize, pool, hStream),
             retry_mem_alloc_from_pool(real, dptr, bytesize, pool, hStream, rc_),
             gr_track_alloc_async(*dptr, bytesize, pool, hStream, GR_API_cuMemAllocFromPoolAsync, ra, seq0_));
}

static GR_HOT_INLINE CUresult b_mem_free_async(void *realp, uintptr_t ra, CUdeviceptr dptr, CUstream hStream) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemFreeAsync_v11020 real = (PFN_cuMemFreeAsync_v11020)realp;
  if (!dptr || !gr_core_active())
    return real(dptr, hStream);
  FREE_BODY(GR_KS_ADDR, dptr, DEVICE_KINDS, real(dptr, hStream));
}

static CUresult b_mem_host_alloc(void *realp, uintptr_t ra, void **pp, size_t bytesize, unsigned int Flags) {
  NEED_REAL(realp);
  PFN_cuMemHostAlloc_v2020 real = (PFN_cuMemHostAlloc_v2020)realp;
  ALLOC_BODY(NOT_LIMITED, 0, real(pp, bytesize, Flags), no_retry(rc_),
             gr_track_alloc_here(GPURECLAIM_KIND_HOST, (uint64_t)(uintptr_t)*pp, bytesize, GR_API_cuMemHostAlloc, ra,
                                 seq0_));
}

static CUresult b_mem_alloc_host(void *realp, uintptr_t ra, void **pp, size_t bytesize) {
  NEED_REAL(realp);
  PFN_cuMemAllocHost_v3020 real = (PFN_cuMemAllocHost_v3020)realp;
  ALLOC_BODY(NOT_LIMITED, 0, real(pp, bytesize), no_retry(rc_),
             gr_track_alloc_here(GPURECLAIM_KIND_HOST, (uint64_t)(uintptr_t)*pp, bytesize, GR_API_cuMemAllocHost, ra,
                                 seq0_));
}

static CUresult b_mem_free_host(void *realp, uintptr_t ra, void *p) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemFreeHost_v2000 real = (PFN_cuMemFreeHost_v2000)realp;
  if (!p || !gr_core_active())
    return real(p);
  FREE_BODY(GR_KS_ADDR, (uint64_t)(uintptr_t)p, 1u << GPURECLAIM_KIND_HOST, real(p));
}

/* ---- cuMemGetInfo: the one answer GPURECLAIM_LIMIT changes (gpureclaim.h) ---- */

/* With a limit on the current context's device: total = min(limit, total), free = min(free, limit - held). */
GR_COLD static void limited_info(uint64_t *free_b, uint64_t *total) {
  if (gr_core_active())
    gr_limit_mem_info(gr_reg_here_device(), free_b, total);
}

static CUresult b_mem_get_info(void *realp, uintptr_t ra, size_t *free_b, size_t *total) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemGetInfo_v3020)realp)(free_b, total);
  if (GR_UNLIKELY(gr_limit_on()) && rc == CUDA_SUCCESS && free_b && total) {
    uint64_t f = *free_b, t = *total;
    limited_info(&f, &t);
    *free_b = (size_t)f, *total = (size_t)t;
  }
  return rc;
}

/* The 32-bit ABI: the driver saturates its figures at 4 GiB; the smaller of two saturated figures is the
 * saturated smaller one. */
static CUresult b_mem_get_info_v1(void *realp, uintptr_t ra, unsigned int *free_b, unsigned int *total) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((CUresult(CUDAAPI *)(unsigned int *, unsigned int *))realp)(free_b, total);
  if (GR_UNLIKELY(gr_limit_on()) && rc == CUDA_SUCCESS && free_b && total) {
    uint64_t f = *free_b, t = *total;
    limited_info(&f, &t);
    *free_b = (unsigned int)f, *total = (unsigned int)t;
  }
  return rc;
}

/* ---- IPC: memory shared with another process cannot be moved away under it (sleep.c refuses) ---- */

static CUresult b_ipc_get(void *realp, uintptr_t ra, CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuIpcGetMemHandle_v4010)realp)(pHandle, dptr);
  if (rc == CUDA_SUCCESS)
    gr_sleep_note_ipc(1, 0); /* exported: another process may map it at any time from now on */
  return rc;
}

static CUresult b_ipc_open(void *realp, uintptr_t ra, CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned Flags) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuIpcOpenMemHandle_v11000)realp)(pdptr, handle, Flags);
  if (rc == CUDA_SUCCESS)
    gr_sleep_note_ipc(0, 1);
  return rc;
}

static CUresult b_ipc_close(void *realp, uintptr_t ra, CUdeviceptr dptr) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuIpcCloseMemHandle_v4010)realp)(dptr);
  if (rc == CUDA_SUCCESS)
    gr_sleep_note_ipc(0, -1);
  return rc;
}

/* ---- stream capture: a graph being captured cannot be checkpointed (sleep.c refuses a sleep meanwhile) ---- */

/* A capture and a release never overlap (admit.c): each begin waits for a running release first
 * (gr_admit_capture_enter), and stays counted until capture.c knows the capture. */
static CUresult capture_begun(CUresult rc, CUstream s, bool ptsz) {
  if (rc == CUDA_SUCCESS)
    gr_capture_note(s, ptsz, true);
  gr_admit_capture_leave();
  return rc;
}
static CUresult b_capture_begin1(void *realp, uintptr_t ra, CUstream s) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((CUresult(CUDAAPI *)(CUstream))realp)(s), s, false);
}
static CUresult b_capture_begin1_pt(void *realp, uintptr_t ra, CUstream s) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((CUresult(CUDAAPI *)(CUstream))realp)(s), s, true);
}
static CUresult b_capture_begin(void *realp, uintptr_t ra, CUstream s, CUstreamCaptureMode mode) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((PFN_cuStreamBeginCapture_v10010)realp)(s, mode), s, false);
}
static CUresult b_capture_begin_pt(void *realp, uintptr_t ra, CUstream s, CUstreamCaptureMode mode) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((PFN_cuStreamBeginCapture_v10010)realp)(s, mode), s, true);
}
static CUresult b_capture_to_graph(void *realp, uintptr_t ra, CUstream s, CUgraph g, const CUgraphNode *deps,
                                   const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((PFN_cuStreamBeginCaptureToGraph_v12030)realp)(s, g, deps, data, n, mode), s, false);
}
static CUresult b_capture_to_graph_pt(void *realp, uintptr_t ra, CUstream s, CUgraph g, const CUgraphNode *deps,
                                      const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
  (void)ra;
  NEED_REAL(realp);
  gr_admit_capture_enter();
  return capture_begun(((PFN_cuStreamBeginCaptureToGraph_v12030)realp)(s, g, deps, data, n, mode), s, true);
}
/* A capture ends with its EndCapture whatever that returns (an invalidated capture ends with an error). */
static CUresult b_capture_end(void *realp, uintptr_t ra, CUstream s, CUgraph *g) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuStreamEndCapture_v10000)realp)(s, g);
  gr_capture_note(s, false, false);
  return rc;
}
static CUresult b_capture_end_pt(void *realp, uintptr_t ra, CUstream s, CUgraph *g) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuStreamEndCapture_v10000)realp)(s, g);
  gr_capture_note(s, true, false);
  return rc;
}

/* ---- virtual memory management ---- */

static CUresult b_mem_create(void *realp, uintptr_t ra, CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
  NEED_REAL(realp);
  PFN_cuMemCreate_v10020 real = (PFN_cuMemCreate_v10020)realp;
  ALLOC_BODY(prop_device(prop), size, /* physical memory: counted once, however often it is mapped */
             real(handle, size, prop, flags), retry_mem_create(real, handle, size, prop, flags, rc_),
             gr_track_add(GPURECLAIM_KIND_VMM, (uint64_t)*handle, size, GR_API_cuMemCreate, ra, prop_device(prop)));
}

static CUresult b_mem_release(void *realp, uintptr_t ra, CUmemGenericAllocationHandle handle) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemRelease_v10020 real = (PFN_cuMemRelease_v10020)realp;
  if (!gr_core_active())
    return real(handle);
  gr_rec_t before;
  int known = gr_track_vmm_release_begin((uint64_t)handle, &before);
  if (known < 0)
    return CUDA_SUCCESS; /* a late free of memory a release freed: must not reach the driver */
  CUresult rc = real(handle);
  if (known)
    gr_track_vmm_release_end(&before, rc == CUDA_SUCCESS || (rc == CUDA_ERROR_INVALID_VALUE && handle_gone(handle)));
  return rc;
}

static CUresult b_mem_map(void *realp, uintptr_t ra, CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  NEED_REAL(realp);
  PFN_cuMemMap_v10020 real = (PFN_cuMemMap_v10020)realp;
  if (!gr_core_active())
    return real(ptr, size, offset, handle, flags);
  CUresult rc = real(ptr, size, offset, handle, flags);
  if (rc == CUDA_SUCCESS)
    gr_track_vmm_map(ptr, size, (uint64_t)handle, ra);
  return rc;
}

static CUresult b_mem_unmap(void *realp, uintptr_t ra, CUdeviceptr ptr, size_t size) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemUnmap_v10020 real = (PFN_cuMemUnmap_v10020)realp;
  if (!gr_core_active())
    return real(ptr, size);
  gr_unmap_t u;
  gr_track_vmm_unmap_begin(&u, ptr, size);
  CUresult rc = real(ptr, size);
  gr_track_vmm_unmap_end(&u, rc == CUDA_SUCCESS);
  return rc;
}

static CUresult b_mem_address_reserve(void *realp, uintptr_t ra, CUdeviceptr *ptr, size_t size, size_t alignment,
                                      CUdeviceptr addr, unsigned long long flags) {
  NEED_REAL(realp);
  PFN_cuMemAddressReserve_v10020 real = (PFN_cuMemAddressReserve_v10020)realp;
  if (!gr_core_active())
    return real(ptr, size, alignment, addr, flags);
  CUresult rc = real(ptr, size, alignment, addr, flags);
  if (rc == CUDA_SUCCESS)
    gr_track_add(GPURECLAIM_KIND_VA, *ptr, size, GR_API_cuMemAddressReserve, ra, -1);
  return rc;
}

static CUresult b_mem_address_free(void *realp, uintptr_t ra, CUdeviceptr ptr, size_t size) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemAddressFree_v10020 real = (PFN_cuMemAddressFree_v10020)realp;
  if (!gr_core_active())
    return real(ptr, size);
  FREE_BODY(GR_KS_VA, ptr, 1u << GPURECLAIM_KIND_VA, real(ptr, size));
}

/* ---- pools ---- */

static CUresult b_pool_create(void *realp, uintptr_t ra, CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemPoolCreate_v11020)realp)(pool, poolProps);
  if (rc == CUDA_SUCCESS && gr_core_active()) {
    int dev = poolProps && poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? poolProps->location.id : -1;
    gr_reg_pool(*pool, dev, false);
  }
  return rc;
}

static CUresult b_pool_destroy(void *realp, uintptr_t ra, CUmemoryPool pool) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemPoolDestroy_v11020)realp)(pool);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_pool_destroyed(pool);
  return rc;
}

static CUresult b_pool_trim(void *realp, uintptr_t ra, CUmemoryPool pool, size_t minBytesToKeep) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemPoolTrimTo_v11020)realp)(pool, minBytesToKeep);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_pool(pool, -1, false);
  return rc;
}

static CUresult b_pool_set_attr(void *realp, uintptr_t ra, CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemPoolSetAttribute_v11020)realp)(pool, attr, value);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_pool(pool, -1, false);
  return rc;
}

static CUresult b_dev_default_pool(void *realp, uintptr_t ra, CUmemoryPool *pool_out, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuDeviceGetDefaultMemPool_v11020)realp)(pool_out, dev);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_pool(*pool_out, dev, true);
  return rc;
}

static CUresult b_dev_get_pool(void *realp, uintptr_t ra, CUmemoryPool *pool, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuDeviceGetMemPool_v11020)realp)(pool, dev);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_pool(*pool, dev, false);
  return rc;
}

static CUresult b_dev_set_pool(void *realp, uintptr_t ra, CUdevice dev, CUmemoryPool pool) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuDeviceSetMemPool_v11020)realp)(dev, pool);
  if (rc == CUDA_SUCCESS && gr_core_active())
    gr_reg_device_set_pool(dev, pool);
  return rc;
}

/* CUDA 13's pools by location and allocation type. A device's pinned-memory pools are the ones the
 * cuDevice*MemPool calls name, learnt the same way: cuMemSetMemPool there changes the pool cuMemAllocAsync
 * takes from, so the blocks name the right pool and a release trims it. Pools of other locations (host,
 * host NUMA) and managed-memory pools are registered too (device -1 unless the location is a device): a
 * release trims every pool seen, and a trim only returns memory no allocation uses. */
static int pool_location_device(const CUmemLocation *loc, CUmemAllocationType type, bool *device_pinned) {
  bool dev = loc && loc->type == CU_MEM_LOCATION_TYPE_DEVICE && loc->id >= 0;
  *device_pinned = dev && type == CU_MEM_ALLOCATION_TYPE_PINNED;
  return dev ? loc->id : -1;
}

static CUresult b_mem_default_pool(void *realp, uintptr_t ra, CUmemoryPool *pool_out, CUmemLocation *location,
                                   CUmemAllocationType type) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemGetDefaultMemPool_v13000)realp)(pool_out, location, type);
  if (rc == CUDA_SUCCESS && gr_core_active()) {
    bool pinned;
    int dev = pool_location_device(location, type, &pinned);
    gr_reg_pool(*pool_out, dev, pinned);
  }
  return rc;
}

static CUresult b_mem_get_pool(void *realp, uintptr_t ra, CUmemoryPool *pool, CUmemLocation *location,
                               CUmemAllocationType type) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemGetMemPool_v13000)realp)(pool, location, type);
  if (rc == CUDA_SUCCESS && gr_core_active()) {
    bool pinned;
    gr_reg_pool(*pool, pool_location_device(location, type, &pinned), false);
  }
  return rc;
}

static CUresult b_mem_set_pool(void *realp, uintptr_t ra, CUmemLocation *location, CUmemAllocationType type,
                               CUmemoryPool pool) {
  (void)ra;
  NEED_REAL(realp);
  CUresult rc = ((PFN_cuMemSetMemPool_v13000)realp)(location, type, pool);
  if (rc == CUDA_SUCCESS && gr_core_active()) {
    bool pinned;
    int dev = pool_location_device(location, type, &pinned);
    if (pinned)
      gr_reg_device_set_pool(dev, pool); /* what cuDeviceSetMemPool(dev, pool) does */
    else
      gr_reg_pool(pool, dev, false);
  }
  return rc;
}

/* ---- contexts ---- */

static CUresult b_primary_retain(void *realp, uintptr_t ra, CUcontext *pctx, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuDevicePrimaryCtxRetain_v7000 real = (PFN_cuDevicePrimaryCtxRetain_v7000)realp;
  if (!gr_core_active())
    return real(pctx, dev);
  gr_track_ctxlock_enter(); /* not between a final release and its state check (b_primary_release) */
  CUresult rc = real(pctx, dev);
  if (rc == CUDA_SUCCESS)
    gr_reg_primary(dev, *pctx);
  gr_track_ctxlock_exit();
  return rc;
}

/* A context was made (and pushed current on this thread, as the driver does for a new context). */
static void created(CUresult rc, CUcontext *pctx, CUdevice dev) {
  gr_reg_switched();
  if (rc == CUDA_SUCCESS && pctx && gr_core_active())
    gr_reg_ctx(*pctx, dev);
}

static CUresult b_ctx_create(void *realp, uintptr_t ra, CUcontext *pctx, unsigned int flags, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((PFN_cuCtxCreate_v3020)realp)(pctx, flags, dev);
  created(rc, pctx, dev);
  return rc;
}

static CUresult b_ctx_create_v3(void *realp, uintptr_t ra, CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                int numParams, unsigned int flags, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((PFN_cuCtxCreate_v11040)realp)(pctx, paramsArray, numParams, flags, dev);
  created(rc, pctx, dev);
  return rc;
}

static CUresult b_ctx_create_v4(void *realp, uintptr_t ra, CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                unsigned int flags, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((PFN_cuCtxCreate_v12050)realp)(pctx, ctxCreateParams, flags, dev);
  created(rc, pctx, dev);
  return rc;
}

/* cuGLCtxCreate_v2 and cuVDPAUCtxCreate_v2 (cudaGL.h, cudaVDPAU.h: the same for both versions) make a context as
 * cuCtxCreate does, bound to graphics. */
typedef CUresult(CUDAAPI *gr_pfn_vdpau_ctx_create)(CUcontext *, unsigned int, CUdevice, uint32_t, void *);

static CUresult b_vdpau_ctx_create(void *realp, uintptr_t ra, CUcontext *pctx, unsigned int flags, CUdevice dev,
                                   uint32_t vdp, void *vdp_proc) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((gr_pfn_vdpau_ctx_create)realp)(pctx, flags, dev, vdp, vdp_proc);
  created(rc, pctx, dev);
  return rc;
}

/* The calls that change the calling thread's current context and nothing else gpureclaim keeps: the thread's
 * cached answer goes (registry.c), whatever the driver answered. cuCtxSetCurrent and cuCtxPushCurrent (both
 * versions) share one body: the same parameters, the same work around the call. */
static CUresult b_ctx_switch(void *realp, uintptr_t ra, CUcontext ctx) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((PFN_cuCtxSetCurrent_v4000)realp)(ctx);
  gr_reg_switched();
  return rc;
}

static CUresult b_ctx_pop(void *realp, uintptr_t ra, CUcontext *pctx) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  CUresult rc = ((PFN_cuCtxPopCurrent_v4000)realp)(pctx);
  gr_reg_switched();
  return rc;
}

/* The calling thread's current context, NULL for none or no answer. */
static CUcontext current_ctx(void) {
  CUcontext c = NULL;
  if (!gr_drv.cuCtxGetCurrent || gr_drv.cuCtxGetCurrent(&c) != CUDA_SUCCESS)
    return NULL;
  return c;
}

/* Whether a context the driver knew is gone after a detach that succeeded. cuCtxDetach needs the context current
 * on the calling thread, and the detach that destroys it pops it: current before and not after means gone, even
 * if another thread's new context got the same handle meanwhile. Failing that evidence, a context that no longer
 * answers a question about itself is gone. */
static bool ctx_gone(CUcontext ctx, CUcontext before) {
  unsigned version = 0;
  if (before == ctx && current_ctx() != ctx)
    return true;
  return gr_drv.cuCtxGetApiVersion && gr_drv.cuCtxGetApiVersion(ctx, &version) != CUDA_SUCCESS;
}

/* Whether the primary context of dev is gone after a release that succeeded: the driver's state says so (only
 * the final release destroys it). */
static bool primary_gone(CUdevice dev) {
  unsigned flags = 0;
  int active = 1;
  return gr_drv.cuDevicePrimaryCtxGetState && gr_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
         !active;
}

/* The four calls that end a context and free its memory, in one sequence (gr_track_ctx_end_before/after, under
 * the context lock): the context's records are marked detaching before the driver call and leave the table after
 * it, or lose the mark if the driver refused; a free or an allocation of their addresses meanwhile is told apart
 * from them (track.c).
 *   END_DESTROY  cuCtxDestroy: gone when it succeeds.
 *   END_DETACH   cuCtxDetach (deprecated) takes one off the context's usage count (cuCtxAttach's) and destroys
 *                it when that reaches 0; the driver does not say which happened (ctx_gone).
 *   END_RESET    cuDevicePrimaryCtxReset: gone when it succeeds.
 *   END_RELEASE  cuDevicePrimaryCtxRelease: only the final release destroys the primary context; the driver's
 *                state says whether this was it (primary_gone), and the context lock keeps a retain
 *                (b_primary_retain) from making it active again between the two calls.
 * A destroy that may not happen (detach, release) begins before the call all the same, so that allocations
 * overlapping it, and those that get its blocks' addresses before the records are marked, are told apart from its
 * blocks; it is marked and committed once the context is known to be gone. */
enum ctx_end { END_DESTROY, END_DETACH, END_RESET, END_RELEASE };

static CUresult ctx_end_call(void *realp, enum ctx_end how, CUcontext ctx, CUdevice dev) {
  if (how == END_DESTROY || how == END_DETACH)
    return ((CUresult(CUDAAPI *)(CUcontext))realp)(ctx); /* PFN_cuCtxDestroy_v4000, PFN_cuCtxDetach_v2000 */
  return ((CUresult(CUDAAPI *)(CUdevice))realp)(dev);    /* PFN_cuDevicePrimaryCtxReset/Release_v11000 */
}

static CUresult ctx_end(void *realp, enum ctx_end how, CUcontext ctx, CUdevice dev) {
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  bool by_ctx = how == END_DESTROY || how == END_DETACH;
  if ((by_ctx && !ctx) || !gr_core_active()) {
    CUresult rc = ctx_end_call(realp, how, ctx, dev);
    gr_reg_switched(); /* a context current to the calling thread is popped */
    return rc;
  }
  gr_ctx_end_t e;
  gr_track_ctx_end_before(&e, by_ctx ? ctx : NULL, dev, how == END_DESTROY || how == END_RESET);
  CUcontext before = how == END_DETACH ? current_ctx() : NULL;
  CUresult rc = ctx_end_call(realp, how, ctx, dev);
  gr_reg_switched();
  bool gone = rc == CUDA_SUCCESS && (how == END_DETACH    ? ctx_gone(ctx, before)
                                     : how == END_RELEASE ? primary_gone(dev)
                                                          : true);
  gr_track_ctx_end_after(&e, gone);
  return rc;
}

static CUresult b_ctx_destroy(void *realp, uintptr_t ra, CUcontext ctx) {
  (void)ra;
  return ctx_end(realp, END_DESTROY, ctx, 0);
}
static CUresult b_ctx_detach(void *realp, uintptr_t ra, CUcontext ctx) {
  (void)ra;
  return ctx_end(realp, END_DETACH, ctx, 0);
}
static CUresult b_primary_reset(void *realp, uintptr_t ra, CUdevice dev) {
  (void)ra;
  return ctx_end(realp, END_RESET, NULL, dev);
}
static CUresult b_primary_release(void *realp, uintptr_t ra, CUdevice dev) {
  (void)ra;
  return ctx_end(realp, END_RELEASE, NULL, dev);
}

/* ---- the wrappers ---- */

#define DEFINE_WRAPPERS(sym, base, ver, ptsz, body, params, args)                                           \
  GR_INTERPOSE CUresult CUDAAPI sym params;                                                                \
  GR_INTERPOSE CUresult CUDAAPI sym params {                                                               \
    CUresult gate_ = gr_gate_enter(); /* in flight until the driver returned: a sleep waits for it */      \
    if (GR_UNLIKELY(gate_ != CUDA_SUCCESS))                                                                \
      return gate_;                                                                                        \
    gate_ = body(ex_real(GR_H_##sym), (uintptr_t)__builtin_return_address(0), GR_EXPAND args);             \
    gr_gate_leave();                                                                                       \
    return gate_;                                                                                          \
  }                                                                                                        \
  static CUresult CUDAAPI gr_pa_##sym params {                                                             \
    CUresult gate_ = gr_gate_enter();                                                                      \
    if (GR_UNLIKELY(gate_ != CUDA_SUCCESS))                                                                \
      return gate_;                                                                                        \
    gate_ = body(pa_real(GR_H_##sym), (uintptr_t)__builtin_return_address(0), GR_EXPAND args);             \
    gr_gate_leave();                                                                                       \
    return gate_;                                                                                          \
  }
GR_DRIVER_HOOKS(DEFINE_WRAPPERS)
#undef DEFINE_WRAPPERS

const gr_hook_info_t gr_hooks[GR_H_COUNT] = {
#define INFO(sym, base, ver, ptsz, body, params, args) {#sym, base, ver, ptsz, (void *)sym, (void *)gr_pa_##sym},
    GR_DRIVER_HOOKS(INFO)
#undef INFO
};

void *gr_hook_export_for(const char *exported_name) {
  for (int i = 0; i < GR_H_COUNT; i++)
    if (strcmp(gr_hooks[i].symbol, exported_name) == 0)
      return gr_hooks[i].export_fn;
  return NULL;
}

int gr_hook_export_id(const void *fn) {
  for (int i = 0; i < GR_H_COUNT; i++)
    if (gr_hooks[i].export_fn == fn)
      return i;
  return -1;
}

void *gr_hook_export_real(int id) { return ex_real(id); }
int gr_hook_count(void) { return GR_H_COUNT; }
