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
 * result, except for the out-of-memory retry (GPURECLAIM_OOM_RETRY) and a late free of a block a release
 * already freed (gpureclaim.h, scopes).
 */
/* cuCtxDetach is deprecated in cuda.h, and this file defines it (an interposer wraps what programs still call). */
#define CUDA_ENABLE_DEPRECATED 1
#include "export.h"
#include "real.h"
#include "hooks.h"
#include "registry.h"
#include "stats.h"
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
     * and ask the peers again now and then. own_limit false: the process's own limit never reaches here. */  \
    gr_wait_t w_;                                                                                          \
    if ((rc) == CUDA_ERROR_OUT_OF_MEMORY && !gr_peer_busy_here() &&                                        \
        gr_wait_begin(&w_, (bytes), (device), NULL, GR_WAIT_ALLOC, 0, false)) {                            \
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

/* The device of a stream-ordered allocation: its pool's, else its stream's. */
static int async_device(CUmemoryPool pool, CUstream s) {
  if (pool) {
    int d = gr_reg_pool_device(gr_reg_pool(pool, -1, false));
    if (d >= 0)
      return d;
  }
  gr_where_t w = gr_reg_stream_where(s);
  return w.ok && w.device != GR_DEVICE_NONE ? w.device : -1;
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
  RETRIES(rc, bytesize, async_device(NULL, hStream), real(dptr, bytesize, hStream));
  return rc;
}

GR_COLD static CUresult retry_mem_alloc_from_pool(PFN_cuMemAllocFromPoolAsync_v11020 real, CUdeviceptr *dptr,
                                                  size_t bytesize, CUmemoryPool pool, CUstream hStream, CUresult rc) {
  RETRIES(rc, bytesize, async_device(pool, hStream), real(dptr, bytesize, pool, hStream));
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

/* ---- common tails ---- */

/* seq0: gr_track_ctx_seq() read before the driver call (track.c: a destroy of the context may overlap). */
static GR_HOT_INLINE void track_in_current_ctx(unsigned kind, uint64_t key, uint64_t size, unsigned api, uintptr_t ra,
                                               uint64_t seq0) {
  gr_where_t w = gr_reg_here();
  gr_track_alloc(kind, key, size, api, ra, w.ctx_id, kind == GPURECLAIM_KIND_HOST ? GR_DEVICE_NONE : w.device, 0,
                 seq0);
}



/* Whether a tracked block whose free the driver answered with CUDA_ERROR_INVALID_VALUE is gone: for device memory
 * that answer means "no such block" (two threads freed one pointer at once, and the other free, finding no
 * record, reached the driver first), unless the driver still has a block based at that address, which it refused
 * to free for another reason (asked with cuMemGetAddressRange, in the current context; no answer counts as gone).
 * Put back when gone, the record would outlive its block, and a release could later free the address for whoever
 * has it then. Other kinds keep their record: the driver also answers INVALID_VALUE for a reservation that is
 * still mapped or freed with another size (cuMemAddressFree), and has no cheap question for host memory. */
GR_COLD static bool free_found_nothing(const gr_packed_t *p) {
  if (!((DEVICE_KINDS >> gr_pk_kind(p)) & 1))
    return false;
  CUdeviceptr base = 0;
  size_t size = 0;
  return !gr_drv.cuMemGetAddressRange ||
         gr_drv.cuMemGetAddressRange(&base, &size, (CUdeviceptr)p->key) != CUDA_SUCCESS || base != p->key;
}

/* The same for a VMM handle whose cuMemRelease got CUDA_ERROR_INVALID_VALUE: gone unless the driver still knows
 * it. */
GR_COLD static bool handle_gone(CUmemGenericAllocationHandle h) {
  CUmemAllocationProp prop;
  return !gr_drv.cuMemGetAllocationPropertiesFromHandle ||
         gr_drv.cuMemGetAllocationPropertiesFromHandle(&prop, h) != CUDA_SUCCESS;
}

/* After a free answered CUDA_ERROR_INVALID_VALUE, of any address kind (pinned host memory too): whether the table
 * holds a block at the address again. The driver gave the address to a new block, so this one is gone: another
 * thread's free of the same pointer reached the driver first, and an allocation got the address before this
 * free returned. Put back, the record would sit beside the new block's, outlive its block, and a release could
 * free the new block in its place. (An allocation that has the address from the driver but has not inserted its
 * record yet is not seen: that window stays, for a program that frees one pointer on two threads at once.) */
GR_COLD static bool address_given_again(const gr_packed_t *p) {
  gr_rec_t o;
  return gr_kind_keyspace(gr_pk_kind(p)) == GR_KS_ADDR &&
         gr_table_lookup(GR_KS_ADDR, p->key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), &o) == 0;
}

/* A free the driver refused (rc): the record goes back, unless the driver found no such block or gave its address
 * to a new one; a destroy of the block's context that overlapped decides first (gr_track_restore_ctx: the block
 * is then counted as the destroy's). */
GR_COLD static void refused_pk(const gr_packed_t *p, uint64_t seq0, CUresult rc) {
  gr_rec_t r;
  gr_pk_unpack(p, &r);
  bool overlapped = r.aux == GR_AUX_DETACHING || gr_track_ctx_seq() != seq0 || (seq0 & 1);
  if (rc == CUDA_ERROR_INVALID_VALUE && !overlapped && (free_found_nothing(p) || address_given_again(p)))
    gr_track_freed(&r);
  else
    gr_track_restore_ctx(&r, seq0);
}

/* A free: untrack first (CUDA reuses addresses), call the driver, and on a refusal put the record back unless the
 * block is gone (refused_pk). */
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
        refused_pk(&rec_, seq0_, rc_);                                                                     \
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
  if (rc == CUDA_SUCCESS && atomic_load_explicit(&gr_core_state, memory_order_acquire) == 0)
    gr_core_start_slow();
  return rc;
}

static GR_HOT_INLINE CUresult b_mem_alloc(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize) {
  NEED_REAL(realp);
  PFN_cuMemAlloc_v3020 real = (PFN_cuMemAlloc_v3020)realp;
  if (!gr_core_active())
    return real(dptr, bytesize);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(dptr, bytesize);
  if (GR_UNLIKELY(rc != CUDA_SUCCESS) && rc == CUDA_ERROR_OUT_OF_MEMORY) /* success tested first: the usual case */
    rc = retry_mem_alloc(real, dptr, bytesize, rc);
  if (GR_LIKELY(rc == CUDA_SUCCESS))
    track_in_current_ctx(GPURECLAIM_KIND_DEVICE, *dptr, bytesize, GR_API_cuMemAlloc, ra, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static CUresult b_mem_alloc_pitch(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t *pPitch,
                                  size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes) {
  NEED_REAL(realp);
  PFN_cuMemAllocPitch_v3020 real = (PFN_cuMemAllocPitch_v3020)realp;
  if (!gr_core_active())
    return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  if (GR_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY))
    rc = retry_mem_alloc_pitch(real, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, rc);
  if (rc == CUDA_SUCCESS)
    track_in_current_ctx(GPURECLAIM_KIND_PITCH, *dptr, (uint64_t)*pPitch * Height, GR_API_cuMemAllocPitch, ra, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static CUresult b_mem_alloc_managed(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize,
                                    unsigned int flags) {
  NEED_REAL(realp);
  PFN_cuMemAllocManaged_v6000 real = (PFN_cuMemAllocManaged_v6000)realp;
  if (!gr_core_active())
    return real(dptr, bytesize, flags);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(dptr, bytesize, flags);
  if (GR_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY))
    rc = retry_mem_alloc_managed(real, dptr, bytesize, flags, rc);
  if (rc == CUDA_SUCCESS)
    track_in_current_ctx(GPURECLAIM_KIND_MANAGED, *dptr, bytesize, GR_API_cuMemAllocManaged, ra, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static GR_HOT_INLINE CUresult b_mem_free(void *realp, uintptr_t ra, CUdeviceptr dptr) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemFree_v3020 real = (PFN_cuMemFree_v3020)realp;
  if (!dptr || !gr_core_active())
    return real(dptr);
  FREE_BODY(GR_KS_ADDR, dptr, DEVICE_KINDS, real(dptr));
}

static GR_HOT_INLINE void track_async(CUdeviceptr p, size_t size, CUmemoryPool pool, CUstream s, uintptr_t ra,
                                      unsigned api, uint64_t seq0) {
  uint16_t pool_id;
  gr_where_t w = gr_reg_stream_where(s);
  uint16_t cid = w.ctx_id;
  uint8_t dev = w.device;
  unsigned device = dev;
  if (pool) {
    pool_id = gr_reg_pool(pool, -1, false);
    int pd = gr_reg_pool_device(pool_id);
    if (pd >= 0)
      device = (unsigned)pd;
  } else {
    pool_id = GR_LIKELY(dev != GR_DEVICE_NONE) ? gr_reg_device_pool(dev) : 0;
  }
  gr_track_alloc(GPURECLAIM_KIND_ASYNC, p, size, api, ra, cid, device, pool_id, seq0);
}

static GR_HOT_INLINE CUresult b_mem_alloc_async(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  NEED_REAL(realp);
  PFN_cuMemAllocAsync_v11020 real = (PFN_cuMemAllocAsync_v11020)realp;
  if (!gr_core_active())
    return real(dptr, bytesize, hStream);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(dptr, bytesize, hStream);
  if (GR_UNLIKELY(rc != CUDA_SUCCESS) && rc == CUDA_ERROR_OUT_OF_MEMORY) /* success tested first: the usual case */
    rc = retry_mem_alloc_async(real, dptr, bytesize, hStream, rc);
  if (GR_LIKELY(rc == CUDA_SUCCESS))
    track_async(*dptr, bytesize, NULL, hStream, ra, GR_API_cuMemAllocAsync, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static GR_HOT_INLINE CUresult b_mem_alloc_from_pool(void *realp, uintptr_t ra, CUdeviceptr *dptr, size_t bytesize,
                                      CUmemoryPool pool, CUstream hStream) {
  NEED_REAL(realp);
  PFN_cuMemAllocFromPoolAsync_v11020 real = (PFN_cuMemAllocFromPoolAsync_v11020)realp;
  if (!gr_core_active())
    return real(dptr, bytesize, pool, hStream);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(dptr, bytesize, pool, hStream);
  if (GR_UNLIKELY(rc != CUDA_SUCCESS) && rc == CUDA_ERROR_OUT_OF_MEMORY) /* success tested first: the usual case */
    rc = retry_mem_alloc_from_pool(real, dptr, bytesize, pool, hStream, rc);
  if (GR_LIKELY(rc == CUDA_SUCCESS))
    track_async(*dptr, bytesize, pool, hStream, ra, GR_API_cuMemAllocFromPoolAsync, seq0);
  gr_tls.hook_depth--;
  return rc;
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
  if (!gr_core_active())
    return real(pp, bytesize, Flags);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(pp, bytesize, Flags);
  if (rc == CUDA_SUCCESS)
    track_in_current_ctx(GPURECLAIM_KIND_HOST, (uint64_t)(uintptr_t)*pp, bytesize, GR_API_cuMemHostAlloc, ra, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static CUresult b_mem_alloc_host(void *realp, uintptr_t ra, void **pp, size_t bytesize) {
  NEED_REAL(realp);
  PFN_cuMemAllocHost_v3020 real = (PFN_cuMemAllocHost_v3020)realp;
  if (!gr_core_active())
    return real(pp, bytesize);
  gr_tls.hook_depth++;
  uint64_t seq0 = gr_track_ctx_seq();
  CUresult rc = real(pp, bytesize);
  if (rc == CUDA_SUCCESS)
    track_in_current_ctx(GPURECLAIM_KIND_HOST, (uint64_t)(uintptr_t)*pp, bytesize, GR_API_cuMemAllocHost, ra, seq0);
  gr_tls.hook_depth--;
  return rc;
}

static CUresult b_mem_free_host(void *realp, uintptr_t ra, void *p) {
  (void)ra;
  NEED_REAL(realp);
  PFN_cuMemFreeHost_v2000 real = (PFN_cuMemFreeHost_v2000)realp;
  if (!p || !gr_core_active())
    return real(p);
  FREE_BODY(GR_KS_ADDR, (uint64_t)(uintptr_t)p, 1u << GPURECLAIM_KIND_HOST, real(p));
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
  if (!gr_core_active())
    return real(handle, size, prop, flags);
  gr_tls.hook_depth++;
  CUresult rc = real(handle, size, prop, flags);
  if (GR_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY))
    rc = retry_mem_create(real, handle, size, prop, flags, rc);
  if (rc == CUDA_SUCCESS) {
    gr_rec_t r;
    gr_track_fill(&r, GPURECLAIM_KIND_VMM, (uint64_t)*handle, size, GR_API_cuMemCreate, ra);
    int d = prop_device(prop);
    if (d >= 0)
      r.device = (uint8_t)d;
    gr_track_insert(&r);
  }
  gr_tls.hook_depth--;
  return rc;
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
  if (rc == CUDA_SUCCESS) {
    gr_rec_t r;
    gr_track_fill(&r, GPURECLAIM_KIND_VA, *ptr, size, GR_API_cuMemAddressReserve, ra);
    gr_track_insert(&r);
  }
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
  gr_track_gate_enter(); /* not between a final release and its state check (b_primary_release) */
  CUresult rc = real(pctx, dev);
  if (rc == CUDA_SUCCESS)
    gr_reg_primary(dev, *pctx);
  gr_track_gate_exit();
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

/* cuCtxDetach (deprecated) takes one off the context's usage count (cuCtxAttach's) and destroys it, with its
 * memory, when that reaches 0; the driver does not say which happened, so this is a destroy that may not happen,
 * as the last primary release is (b_primary_release): begun before, marked and committed once the context is
 * known to be gone. */
static CUresult b_ctx_detach(void *realp, uintptr_t ra, CUcontext ctx) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  PFN_cuCtxDetach_v2000 real = (PFN_cuCtxDetach_v2000)realp;
  if (!ctx || !gr_core_active()) {
    CUresult rc = real(ctx);
    gr_reg_switched();
    return rc;
  }
  gr_track_gate_enter();
  uint16_t id = gr_reg_ctx_find(ctx);
  gr_detached_t d = {0};
  if (id)
    gr_track_ctx_begin(id, &d);
  CUcontext before = current_ctx();
  CUresult rc = real(ctx);
  gr_reg_switched();
  bool gone = rc == CUDA_SUCCESS && ctx_gone(ctx, before);
  if (id) {
    if (gone)
      gr_track_ctx_mark(&d);
    gr_track_ctx_commit(&d, gone);
  }
  if (gone)
    gr_reg_ctx_destroyed(id); /* id 0 too: every thread's kept context is asked again (registry.c) */
  gr_track_gate_exit();
  return rc;
}

/* Destroying a context frees its memory. Its records are marked detaching before the driver call and leave the
 * table after it, or lose the mark if the driver refused; a free or an allocation of their addresses meanwhile
 * is told apart from them (track.c). */
static CUresult b_ctx_destroy(void *realp, uintptr_t ra, CUcontext ctx) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  PFN_cuCtxDestroy_v4000 real = (PFN_cuCtxDestroy_v4000)realp;
  if (!ctx || !gr_core_active()) {
    CUresult rc = real(ctx);
    gr_reg_switched(); /* a context current to the calling thread is popped */
    return rc;
  }
  gr_track_gate_enter(); /* not while a release holds claimed blocks of it */
  uint16_t id = gr_reg_ctx_find(ctx);
  gr_detached_t d = {0};
  if (id)
    gr_track_ctx_detach(id, &d);
  CUresult rc = real(ctx);
  gr_reg_switched();
  if (id)
    gr_track_ctx_commit(&d, rc == CUDA_SUCCESS);
  if (rc == CUDA_SUCCESS)
    gr_reg_ctx_destroyed(id); /* id 0 too: every thread's kept context is asked again (registry.c) */
  gr_track_gate_exit();
  return rc;
}

static CUresult b_primary_reset(void *realp, uintptr_t ra, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  PFN_cuDevicePrimaryCtxReset_v11000 real = (PFN_cuDevicePrimaryCtxReset_v11000)realp;
  if (!gr_core_active()) {
    CUresult rc = real(dev);
    gr_reg_switched();
    return rc;
  }
  gr_track_gate_enter();
  uint16_t id = gr_reg_primary_id(dev);
  gr_detached_t d = {0};
  if (id)
    gr_track_ctx_detach(id, &d);
  CUresult rc = real(dev);
  gr_reg_switched();
  if (id)
    gr_track_ctx_commit(&d, rc == CUDA_SUCCESS);
  if (rc == CUDA_SUCCESS)
    gr_reg_device_reset(dev);
  gr_track_gate_exit();
  return rc;
}

/* Only the final release destroys the primary context; the driver's state says whether this was it. The gate
 * keeps a retain (b_primary_retain) from making the context active again between the two calls. The destroy
 * begins before the call all the same (track.c), so that allocations overlapping it, and those that get its
 * blocks' addresses before the records are marked, are told apart from its blocks. */
static CUresult b_primary_release(void *realp, uintptr_t ra, CUdevice dev) {
  (void)ra;
  NEED_REAL(realp);
  gr_reg_switch_begin(); /* a switch by a route gpureclaim does not see, before this one (registry.c) */
  PFN_cuDevicePrimaryCtxRelease_v11000 real = (PFN_cuDevicePrimaryCtxRelease_v11000)realp;
  if (!gr_core_active()) {
    CUresult rc = real(dev);
    gr_reg_switched();
    return rc;
  }
  gr_track_gate_enter();
  uint16_t id = gr_reg_primary_id(dev);
  gr_detached_t d = {0};
  if (id)
    gr_track_ctx_begin(id, &d);
  CUresult rc = real(dev);
  gr_reg_switched();
  unsigned flags = 0;
  int active = 1;
  bool gone = rc == CUDA_SUCCESS && gr_drv.cuDevicePrimaryCtxGetState &&
              gr_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active;
  if (id) {
    if (gone)
      gr_track_ctx_mark(&d);
    gr_track_ctx_commit(&d, gone);
  }
  if (gone)
    gr_reg_device_reset(dev);
  gr_track_gate_exit();
  return rc;
}

/* ---- the wrappers ---- */

#define DEFINE_WRAPPERS(sym, base, ver, ptsz, body, params, args)                                           \
  GR_INTERPOSE CUresult CUDAAPI sym params;                                                                \
  GR_INTERPOSE CUresult CUDAAPI sym params {                                                               \
    CUresult gate_ = gr_gate_check();                                                                      \
    if (GR_UNLIKELY(gate_ != CUDA_SUCCESS))                                                                \
      return gate_;                                                                                        \
    return body(ex_real(GR_H_##sym), (uintptr_t)__builtin_return_address(0), GR_EXPAND args);              \
  }                                                                                                        \
  static CUresult CUDAAPI gr_pa_##sym params {                                                             \
    CUresult gate_ = gr_gate_check();                                                                      \
    if (GR_UNLIKELY(gate_ != CUDA_SUCCESS))                                                                \
      return gate_;                                                                                        \
    return body(pa_real(GR_H_##sym), (uintptr_t)__builtin_return_address(0), GR_EXPAND args);              \
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
