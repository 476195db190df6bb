/*
 * simcuda.c -- the simulated CUDA driver (libcuda.so.1): devices backed by host memory.
 *
 * Shape of the implementation:
 *  - every exported entry point is a thin wrapper: count the call, apply an injected fault, call a static
 *    implementation, trace the result. Internal code only ever calls the static implementations, never an
 *    exported name, because gpureclaim preloads definitions of the same names and a real libcuda never
 *    binds to those (the library is also linked with -Bsymbolic-functions). Where several ABI variants of a call
 *    (cuCtxDestroy and cuCtxDestroy_v2, the _ptsz and _ptds ones, the 32-bit ones) do the same work, their wrappers
 *    are generated from the lists SIM_SAME_ABI, SIM_PER_THREAD and SIM_ABI_32, after the implementations;
 *  - one mutex serialises the state, as the real driver does;
 *  - device memory of each device is carved from one MAP_NORESERVE arena placed at a fixed hint address, so
 *    the same call sequence yields the same addresses in two processes. Chunks are rounded to size classes
 *    (8 per power of two), freed chunks wait in per-class LIFO caches and are reused at once; only when the
 *    arena's address space runs out are the caches flushed back into coalesced free extents;
 *  - the capacity is the GPU's, shared with the other processes of the simulated machine (sim_machine.c): every
 *    allocation that takes device memory takes it from the GPU's accounting file under its process-shared lock,
 *    every free gives it back; a process's own figures (simcuda_stats) stay here.
 */
#define _GNU_SOURCE
/* Makes cuda.h declare every ABI version of each entry point (cuMemAlloc and cuMemAlloc_v2, the _ptsz and
 * _ptds variants ...) with no renaming macro left behind, so each definition below is checked against the
 * real prototype of exactly the symbol it defines. */
#define __CUDA_API_VERSION_INTERNAL 1
#include "simcuda.h"

#include "sim_internal.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SIM_EXPORT __attribute__((visibility("default")))
#define SIM_API SIM_EXPORT CUresult CUDAAPI

#define SIM_DRIVER_VERSION 13000
#define SIM_MAX_DEV 8
_Static_assert(SIM_MAX_DEV == SIMM_MAX_GPUS, "the driver's devices are the machine's GPUs");
#define SIM_GRAN (2ULL << 20) /* VMM granularity, and the alignment of chunks of 2 MiB and more */
#define SIM_NCLASS 288
#define SIM_MAX_ALLOC (1ULL << 46)
#define CTX_STACK_MAX 32
#define PA_LOG_MAX 8192

/* ------------------------------------------------------------------------------- entry-point registry */

#define SIM_ENTRY_POINTS(X)                                                                                   \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceTotalMem)   \
  X(cuDeviceGetUuid) X(cuDeviceGetUuid_v2)                                                                  \
  X(cuDeviceTotalMem_v2) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)     \
  X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2)                    \
  X(cuDevicePrimaryCtxGetState) X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)          \
  X(cuCtxDestroy) X(cuCtxDestroy_v2) X(cuCtxPushCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent)            \
  X(cuCtxPopCurrent_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxAttach) X(cuCtxDetach) X(cuCtxGetApiVersion) \
  X(cuGLCtxCreate) X(cuGLCtxCreate_v2) X(cuVDPAUCtxCreate) X(cuVDPAUCtxCreate_v2) X(cuCtxGetDevice) X(cuCtxGetDevice_v2)          \
  X(cuCtxSynchronize) X(cuCtxSynchronize_v2) X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemAllocPitch)                \
  X(cuMemAllocPitch_v2) X(cuMemAllocManaged) X(cuMemFree) X(cuMemFree_v2) X(cuMemGetInfo) X(cuMemGetInfo_v2)  \
  X(cuMemGetAddressRange) X(cuMemGetAddressRange_v2) X(cuMemHostAlloc) X(cuMemAllocHost)                      \
  X(cuMemAllocHost_v2) X(cuMemFreeHost) X(cuMemcpyHtoD) X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds)            \
  X(cuMemcpyDtoH) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds) X(cuMemcpyDtoD) X(cuMemcpyDtoD_v2)               \
  X(cuMemcpyDtoD_v2_ptds) X(cuMemsetD8) X(cuMemsetD8_v2) X(cuMemsetD8_v2_ptds) X(cuStreamCreate)              \
  X(cuStreamDestroy) X(cuStreamDestroy_v2) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz)                 \
  X(cuStreamGetCtx) X(cuStreamGetCtx_ptsz) X(cuStreamGetCtx_v2) X(cuStreamGetCtx_v2_ptsz) X(cuMemAllocAsync)  \
  X(cuMemAllocAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemAllocFromPoolAsync)                 \
  X(cuMemAllocFromPoolAsync_ptsz) X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolTrimTo)                   \
  X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute) X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool)        \
  X(cuDeviceSetMemPool) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAllocationGranularity) X(cuGetErrorName) X(cuGetErrorString)      \
  X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemGetDefaultMemPool)  \
  X(cuMemGetMemPool) X(cuMemSetMemPool) X(cuLaunchKernel) X(cuLaunchKernel_ptsz)                          \
  X(cuCheckpointProcessLock) X(cuCheckpointProcessCheckpoint) X(cuCheckpointProcessRestore)                 \
  X(cuCheckpointProcessUnlock) X(cuCheckpointProcessGetState) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle)       \
  X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle) X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz)           \
  X(cuStreamBeginCapture_v2) X(cuStreamBeginCapture_v2_ptsz)                                                  \
  X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz) X(cuStreamIsCapturing) X(cuStreamIsCapturing_ptsz)         \
  X(cuGraphDestroy) X(cuModuleGetLoadingMode) X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel)      \
  X(cuKernelGetFunction)

enum {
#define X(n) SIMFN_##n,
  SIM_ENTRY_POINTS(X)
#undef X
  SIMFN_COUNT
};

static const char *const g_fn_names[SIMFN_COUNT] = {
#define X(n) #n,
    SIM_ENTRY_POINTS(X)
#undef X
};

/* Call counts, per thread: a shared counter would make every simulated call a locked read-modify-write on a
 * cache line all threads write, which libcuda does not do, and bench_hooks would charge it to every driver call
 * gpureclaim adds (5-6 ns each). A block outlives its thread: it is handed to the next new thread, and the
 * counts it holds stay in the sums. */
typedef struct sim_counts {
  _Atomic uint64_t n[SIMFN_COUNT]; /* written by the owning thread only */
  _Atomic int owned;
  _Atomic int in_call;     /* driver calls the owning thread is inside now (checkpoint lock waits for 0) */
  struct sim_counts *next; /* immutable once published */
} sim_counts_t;
static _Atomic(sim_counts_t *) g_counts;
static _Atomic uint64_t g_calls_unowned[SIMFN_COUNT]; /* calls made while a thread had no block */
static __thread sim_counts_t *t_counts;
static pthread_key_t g_counts_key;
static pthread_once_t g_counts_once = PTHREAD_ONCE_INIT;

static void counts_release(void *p) {
  sim_counts_t *c = p;
  t_counts = NULL;
  atomic_store_explicit(&c->owned, 0, memory_order_release);
}
static void counts_key_init(void) { pthread_key_create(&g_counts_key, counts_release); }

static sim_counts_t *counts_self(void) {
  pthread_once(&g_counts_once, counts_key_init);
  sim_counts_t *c;
  for (c = atomic_load_explicit(&g_counts, memory_order_acquire); c; c = c->next) {
    int free_ = 0;
    if (atomic_load_explicit(&c->owned, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&c->owned, &free_, 1, memory_order_acquire, memory_order_relaxed))
      break;
  }
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_store_explicit(&c->owned, 1, memory_order_relaxed);
    sim_counts_t *head = atomic_load_explicit(&g_counts, memory_order_relaxed);
    do c->next = head;
    while (!atomic_compare_exchange_weak_explicit(&g_counts, &head, c, memory_order_release, memory_order_relaxed));
  }
  t_counts = c;
  pthread_setspecific(g_counts_key, c);
  return c;
}

static inline void count_call(int id) {
  sim_counts_t *c = t_counts;
  if (__builtin_expect(c == NULL, 0) && (c = counts_self()) == NULL) {
    atomic_fetch_add_explicit(&g_calls_unowned[id], 1, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&c->n[id], atomic_load_explicit(&c->n[id], memory_order_relaxed) + 1, memory_order_relaxed);
}

static uint64_t calls_of(int id) {
  uint64_t sum = atomic_load_explicit(&g_calls_unowned[id], memory_order_relaxed);
  for (sim_counts_t *c = atomic_load_explicit(&g_counts, memory_order_acquire); c; c = c->next)
    sum += atomic_load_explicit(&c->n[id], memory_order_relaxed);
  return sum;
}
static _Atomic int g_inj_count[SIMFN_COUNT];
static CUresult g_inj_err[SIMFN_COUNT]; /* guarded by g_inj_lock */
static pthread_mutex_t g_inj_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_trace; /* set once by the constructor, before any thread can call in */

static int fn_id(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < SIMFN_COUNT; i++)
    if (strcmp(g_fn_names[i], name) == 0) return i;
  return -1;
}

static int take_injection(int id, CUresult *r) {
  int hit = 0;
  pthread_mutex_lock(&g_inj_lock);
  int n = atomic_load_explicit(&g_inj_count[id], memory_order_relaxed);
  if (n > 0) {
    atomic_store_explicit(&g_inj_count[id], n - 1, memory_order_relaxed);
    *r = g_inj_err[id];
    hit = 1;
  }
  pthread_mutex_unlock(&g_inj_lock);
  return hit;
}

static const char *err_name(CUresult e);

static void trace_call(int id, CUresult r) {
  const char *n = err_name(r);
  fprintf(stderr, "[simcuda %d] %s -> %d (%s)\n", (int)getpid(), g_fn_names[id], (int)r, n ? n : "?");
}

/* ---- the checkpoint lock (cuCheckpointProcessLock): every driver call of every thread but the locking one
 * waits while the process is locked. A call that arrives while the process is checkpointed is a use of device
 * memory the real driver would hold until a restore; the simulator aborts there instead, naming the call, so a
 * test notices a call that slipped past gpureclaim's gate (SIMCUDA_CHECKPOINT_BLOCK=1: it waits, as the driver
 * does). Device queries that need no context pass, from any thread (ck_query_only). A thread's in_call count says
 * it is inside a call; the lock waits for every other thread's to be 0. */
static _Atomic int g_ck_state;  /* CUprocessState */
static _Atomic int g_ck_owner;  /* thread id of the locking thread, 0 when unlocked */
static int g_ck_block;          /* SIMCUDA_CHECKPOINT_BLOCK, set once by the constructor */
static _Atomic uint64_t g_ck_late; /* calls of other threads that reached the driver while it was locked */
/* What a checkpoint and a restore cost: NVIDIA's driver moved 1.55 GiB (1 GiB allocated and the context) in
 * 0.85 s out and 0.54 s back on an H200 (docs/DRIVER.md), so 1.8 and 2.9 GiB/s; SIMCUDA_CHECKPOINT_RATE (bytes
 * per second, K/M/G suffixes; 0: no wait) sets both. The moving itself is a memcpy here: the rest is slept. */
#define CK_RATE_OUT 1932735283ull
#define CK_RATE_IN 3113851289ull
static pthread_mutex_t g_ck_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_ck_cv = PTHREAD_COND_INITIALIZER;
static __thread int t_tid;

static int self_tid(void) {
  if (!t_tid) t_tid = (int)gettid();
  return t_tid;
}

static inline void in_call_add(sim_counts_t *c, int d) {
  if (c) atomic_store(&c->in_call, atomic_load_explicit(&c->in_call, memory_order_relaxed) + d); /* seq_cst */
}

/* Calls any thread may still make while the process is locked or checkpointed: device queries that need no
 * context. */
static int ck_query_only(int id) {
  return id == SIMFN_cuInit || id == SIMFN_cuDriverGetVersion || id == SIMFN_cuDeviceGet ||
         id == SIMFN_cuDeviceGetCount || id == SIMFN_cuDeviceGetName || id == SIMFN_cuDeviceGetUuid ||
         id == SIMFN_cuDeviceGetUuid_v2 || id == SIMFN_cuDeviceTotalMem || id == SIMFN_cuDeviceTotalMem_v2 ||
         id == SIMFN_cuDeviceGetAttribute || id == SIMFN_cuGetErrorName || id == SIMFN_cuGetErrorString ||
         id == SIMFN_cuGetProcAddress || id == SIMFN_cuGetProcAddress_v2;
}

static void ck_slipped(int id) {
  fprintf(stderr, "simcuda: %s called by thread %d while the process is checkpointed: device memory used "
                  "before a restore (a call that slipped past a gate)\n", g_fn_names[id], self_tid());
  abort();
}

static void ck_wait(int id) {
  sim_counts_t *c = t_counts;
  if (ck_query_only(id)) return; /* observed on driver 580: another thread's cuDeviceGetCount returns while the
                                  * process is checkpointed (docs/DRIVER.md) */
  int late = 0;
  for (;;) {
    int st = atomic_load(&g_ck_state);
    if (st == CU_PROCESS_STATE_RUNNING) return;
    if (atomic_load(&g_ck_owner) == self_tid()) {
      if (st == CU_PROCESS_STATE_CHECKPOINTED && !ck_query_only(id)) ck_slipped(id);
      return;
    }
    if (!late) {
      late = 1;
      atomic_fetch_add(&g_ck_late, 1);
      fprintf(stderr, "simcuda: %s called by thread %d while the process is %s: it waits for the unlock\n",
              g_fn_names[id], self_tid(), st == CU_PROCESS_STATE_LOCKED ? "locked" : "checkpointed");
    }
    if (st == CU_PROCESS_STATE_CHECKPOINTED && !g_ck_block) ck_slipped(id);
    in_call_add(c, -1);
    pthread_mutex_lock(&g_ck_mu);
    while (atomic_load(&g_ck_state) != CU_PROCESS_STATE_RUNNING) pthread_cond_wait(&g_ck_cv, &g_ck_mu);
    pthread_mutex_unlock(&g_ck_mu);
    in_call_add(c, 1);
  }
}

static void run_on_enter(int id); /* simcuda_on_enter(), at the end of this file */
static _Atomic int g_on_enter_armed;

/* Counts the call and applies an injected fault; non-zero when the call must return *r at once. */
static inline int sim_enter(int id, CUresult *r) {
  if (__builtin_expect(atomic_load_explicit(&g_on_enter_armed, memory_order_acquire) != 0, 0)) run_on_enter(id);
  count_call(id);
  in_call_add(t_counts, 1);
  if (__builtin_expect(atomic_load(&g_ck_state) != CU_PROCESS_STATE_RUNNING, 0)) ck_wait(id);
  if (atomic_load_explicit(&g_inj_count[id], memory_order_relaxed) > 0) return take_injection(id, r);
  return 0;
}

static void run_on_return(int id); /* simcuda_on_return(), at the end of this file */
static _Atomic int g_on_return_armed;

static inline CUresult sim_leave(int id, CUresult r) {
  if (g_trace) trace_call(id, r);
  if (__builtin_expect(atomic_load_explicit(&g_on_return_armed, memory_order_acquire) != 0, 0)) run_on_return(id);
  in_call_add(t_counts, -1);
  return r;
}

/* The checkpoint entry points themselves: counted and injectable, never held by the lock. */
#define CK_ENTER(name)                                                                                        \
  CUresult sim_inj_;                                                                                          \
  count_call(SIMFN_##name);                                                                                   \
  if (atomic_load_explicit(&g_inj_count[SIMFN_##name], memory_order_relaxed) > 0 &&                            \
      take_injection(SIMFN_##name, &sim_inj_))                                                                \
    return sim_inj_
#define CK_LEAVE(name, expr)                                                                                  \
  do {                                                                                                        \
    CUresult ck_r_ = (expr);                                                                                  \
    if (g_trace) trace_call(SIMFN_##name, ck_r_);                                                             \
    return ck_r_;                                                                                             \
  } while (0)

#define ENTER(name)                                                                                           \
  CUresult sim_inj_;                                                                                          \
  if (sim_enter(SIMFN_##name, &sim_inj_)) return sim_leave(SIMFN_##name, sim_inj_)
#define LEAVE(name, expr) return sim_leave(SIMFN_##name, (expr))

/* ---------------------------------------------------------------------------------------- state types */

/* ST_PENDING: freed with cuMemFreeAsync, waiting in its stream's pending list for the stream to reach the free. */
enum { ST_LIVE = 1, ST_ARENA_CACHED = 2, ST_POOL_CACHED = 3, ST_PENDING = 4 };

typedef struct blk {
  uint64_t addr;
  uint64_t rounded; /* chunk (size-class) bytes; mapping length for host blocks */
  uint64_t bytes;   /* requested */
  struct blk *next, *prev; /* owner context's live list, or a cache's LIFO / a pending list (next only) */
  struct CUctx_st *ctx;
  struct CUmemPoolHandle_st *pool;
  uint16_t cls;
  uint8_t kind;  /* simcuda_kind_t */
  uint8_t state; /* ST_* */
  int8_t device;
  uint8_t dirty; /* written through cuMemcpy/cuMemset: pages are committed */
} blk_t;

struct CUctx_st {
  int device;
  int primary;
  int alive;
  int refcount; /* primary only */
  int usage;    /* others: 1 from cuCtxCreate, +1 per cuCtxAttach, -1 per cuCtxDetach (0 destroys it) */
  unsigned flags;
  blk_t *blocks;
  struct CUstream_st *streams;
  blk_t *pend_legacy, *pend_pt; /* stream-ordered frees not yet reached: legacy and per-thread default streams */
  uint64_t live_blocks, live_bytes, plain_bytes, pool_used, host_blocks, host_bytes;
  struct CUctx_st *all_next; /* every context ever made: handles stay unique and dereferenceable */
};

static int g_capturing; /* streams capturing now (cuStreamBeginCapture), under the lock */

struct CUstream_st {
  struct CUctx_st *ctx;
  unsigned flags;
  int capturing; /* between cuStreamBeginCapture and cuStreamEndCapture (created streams only, see below) */
  int cap_mode;  /* its capture's CUstreamCaptureMode */
  int cap_invalid; /* an unsafe call invalidated its capture: EndCapture fails */
  pthread_t cap_thread; /* the thread that began it */
  blk_t *pend; /* stream-ordered frees on this stream not yet reached */
  struct CUstream_st *next, *prev;
};

struct CUmemPoolHandle_st {
  int device;
  int is_default;
  int alive;
  int reuse[3]; /* REUSE_FOLLOW_EVENT_DEPENDENCIES, _ALLOW_OPPORTUNISTIC, _ALLOW_INTERNAL_DEPENDENCIES */
  uint64_t threshold, reserved, reserved_high, used, used_high, max_size;
  blk_t *cache[SIM_NCLASS];
  struct CUmemPoolHandle_st *dev_next; /* the device's pools, for release at synchronization */
};

typedef struct arena {
  uint64_t base, size;
  int hinted;
  simextmgr_t ext;
  simbits_t starts; /* 512-byte units that begin a carved chunk */
  blk_t *cache[SIM_NCLASS];
} arena_t;

typedef struct simdev {
  simgpu_t *gpu;          /* the GPU's shared accounting: capacity, and every process's bytes on it */
  int phys;               /* the machine's device this ordinal names (CUDA_VISIBLE_DEVICES renumbers) */
  unsigned char uuid[16];
  arena_t ar;
  struct CUctx_st primary;
  struct CUmemPoolHandle_st defpool;
  struct CUmemPoolHandle_st *curpool;
  struct CUmemPoolHandle_st *pools; /* list through dev_next, default pool included */
  uint64_t live_blocks, live_bytes, plain_bytes, pool_reserved, pool_used;
  uint64_t vmm_handles, vmm_phys, vmm_mappings, vmm_mapped, host_blocks, host_bytes, contexts;
  uint64_t ck_bytes; /* checkpointed: what the device held, now on the host (0: not checkpointed) */
} simdev_t;

typedef struct vmm_handle {
  uint64_t handle, size;
  int device;
  int released;
  int nmaps;
} vmm_handle_t;

typedef struct vmm_map {
  uint64_t va, size;
  vmm_handle_t *h;
  int prot; /* CU_MEM_ACCESS_FLAGS_PROT_* */
  struct vmm_map *next; /* sorted by va within the reservation */
} vmm_map_t;

typedef struct va_res {
  uint64_t va, size;
  vmm_map_t *maps;
  struct va_res *next;
} va_res_t;

typedef struct pa_log {
  char symbol[64];
  int version;
  uint64_t flags;
} pa_log_t;

static struct {
  pthread_mutex_t lock;
  atomic_int initialized;
  int ndev;
  simdev_t dev[SIM_MAX_DEV];
  simmap_t blocks;  /* chunk base or host address -> blk_t (live and cached chunks) */
  simmap_t ctxs;    /* valid context handles */
  simmap_t streams; /* live streams */
  simmap_t pools;   /* live pools (default pools included) */
  simmap_t vmm;     /* handle -> vmm_handle_t */
  va_res_t *res;    /* address reservations */
  uint64_t va_base, va_size, va_reserved;
  simextmgr_t va_ext;
  /* Pinned host memory comes from a window of its own: the same calls give the same addresses whatever else the
   * process maps meanwhile (gpureclaim's own mappings included), and a freed address is handed out again by
   * the window's allocator, not by the kernel's mmap placement. */
  simextmgr_t host_ext;
  uint64_t vmm_seq;
  uint64_t *vmm_freed; /* handle values whose memory is gone, most recent last: reused first, as the driver does */
  size_t vmm_nfreed, vmm_capfreed;
  struct CUctx_st *all_ctx;
  struct CUmemPoolHandle_st *all_pools; /* destroyed pools stay reachable (blocks may point to them) */
  blk_t *rec_free;
  blk_t *slabs;
  pa_log_t *pa_log;
  uint64_t pa_count;
  uint64_t cap_override[SIM_MAX_DEV];
  int cap_overridden[SIM_MAX_DEV];
  int cap_all_overridden;
  uint64_t cap_all;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread struct {
  int n;
  struct CUctx_st *s[CTX_STACK_MAX];
} t_ctx;

#define LOCK() pthread_mutex_lock(&g.lock)
#define UNLOCK() pthread_mutex_unlock(&g.lock)

/* Streams capturing now, under the lock (g_ncap_streams is also read without it, as a hint). */
#define SIM_CAP_MAX 64
static struct CUstream_st *g_cap_streams[SIM_CAP_MAX];
static _Atomic int g_ncap_streams;

static void cap_drop_locked(struct CUstream_st *s) {
  int n = atomic_load_explicit(&g_ncap_streams, memory_order_relaxed);
  for (int i = 0; i < n; i++)
    if (g_cap_streams[i] == s) {
      g_cap_streams[i] = g_cap_streams[n - 1];
      atomic_store_explicit(&g_ncap_streams, n - 1, memory_order_relaxed);
      return;
    }
}

/* A "potentially unsafe" call (cuMemAlloc, cuMemFree, cuCtxSynchronize, cuMemPoolTrimTo, cuMemAllocHost,
 * cuMemFreeHost, synchronous copies and sets) while a capture restricts the calling thread: a global-mode capture
 * on any thread, or a thread-local one begun by this thread (a relaxed one restricts nobody). As on a real driver,
 * the call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures running now, whose
 * EndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Returns whether the call must fail. */
static int capture_forbids(void) {
  if (atomic_load_explicit(&g_ncap_streams, memory_order_relaxed) == 0) return 0;
  int forbid = 0;
  pthread_mutex_lock(&g.lock);
  int n = atomic_load_explicit(&g_ncap_streams, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    struct CUstream_st *s = g_cap_streams[i];
    if (s->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
        (s->cap_mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(s->cap_thread, pthread_self())))
      forbid = 1;
  }
  if (forbid)
    for (int i = 0; i < n; i++) g_cap_streams[i]->cap_invalid = 1;
  pthread_mutex_unlock(&g.lock);
  return forbid;
}

static inline int inited(void) { return atomic_load_explicit(&g.initialized, memory_order_acquire); }

/* ------------------------------------------------------------------------------------------- errors */

#define SIM_ERRORS(E)                                                                                         \
  E(CUDA_SUCCESS, "no error")                                                                                 \
  E(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                                             \
  E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                                \
  E(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                                       \
  E(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                                         \
  E(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool")                    \
  E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                                                 \
  E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")                       \
  E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                               \
  E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                                      \
  E(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license")                                 \
  E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                               \
  E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                                     \
  E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                                            \
  E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                                                 \
  E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                                             \
  E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                                     \
  E(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                                             \
  E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "exclusive-thread device already in use by a different thread")        \
  E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid")                                              \
  E(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                                              \
  E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                                     \
  E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")                       \
  E(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                                           \
  E(CUDA_ERROR_NOT_READY, "device not ready")                                                                 \
  E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                                   \
  E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                                   \
  E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                                  \
  E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                                      \
  E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                                      \
  E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")                      \
  E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                                                \
  E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing")                \
  E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture")         \
  E(CUDA_ERROR_TIMEOUT, "timeout occurred")                                                                   \
  E(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct {
  CUresult code;
  const char *name, *text;
} g_errors[] = {
#define E(c, s) {c, #c, s},
    SIM_ERRORS(E)
#undef E
};

static const char *err_name(CUresult e) {
  for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
    if (g_errors[i].code == e) return g_errors[i].name;
  return NULL;
}

static const char *err_text(CUresult e) {
  for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
    if (g_errors[i].code == e) return g_errors[i].text;
  return NULL;
}

/* ------------------------------------------------------------------------------------ env and setup */

static uint64_t capacity_for(int d, uint64_t env_cap) {
  if (g.cap_overridden[d]) return g.cap_override[d];
  if (g.cap_all_overridden) return g.cap_all;
  return env_cap;
}

/* Address windows. Each device's arena sits at a fixed hint so runs are reproducible. The hints keep
 * clear of Criterion's sandbox arena (BoxFort maps it at random in [0x2000'0000'0000, 0x6000'0000'0000)),
 * of ASan's allocator (0x6000'0000'0000 + 4 TiB) and of the libraries near the stack. Under
 * ThreadSanitizer only the low 512 GiB are application memory there, so use that. */
#if defined(__SANITIZE_THREAD__)
#define ARENA_HINT0 0x1000000000ULL
#define ARENA_SPAN 0x6000000000ULL
#define VA_HINT 0x7000000000ULL
#define VA_SIZE 0x1000000000ULL
#define HOST_HINT 0x800000000ULL
#define HOST_SIZE 0x400000000ULL
#else
#define ARENA_HINT0 0x680000000000ULL
#define ARENA_SPAN 0x80000000000ULL /* 8 TiB: 1 TiB per device */
#define VA_HINT 0x700000000000ULL
#define VA_SIZE 0x40000000000ULL
#define HOST_HINT 0x660000000000ULL /* past ASan's allocator, below the device arenas */
#define HOST_SIZE 0x1000000000ULL
#endif

static void *map_window(uint64_t hint, uint64_t *size, int prot, int *hinted) {
  uint64_t sz = *size;
  while (sz >= (1ULL << 30)) {
    void *p = mmap((void *)hint, sz, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      *size = sz;
      *hinted = (uint64_t)p == hint;
      return p;
    }
    sz /= 2; /* strict overcommit or a crowded address space: settle for less */
  }
  return NULL;
}

static int pool_init(struct CUmemPoolHandle_st *p, int device, int is_default) {
  memset(p, 0, sizeof *p);
  p->device = device;
  p->is_default = is_default;
  p->alive = 1;
  p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
  return simmap_put(&g.pools, (uint64_t)(uintptr_t)p, p);
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: comma-separated entries, each an index of the machine's devices or
 * a UUID as nvidia-smi writes it (GPU-..., a prefix that names one device only will do). The list ends at the
 * first entry that names no device, or one already listed: the devices before it are visible, in the order
 * given. Unset: every device, in the machine's order. Fills vis with physical indices; returns how many. */
static int visible_devices(int nphys, unsigned char uuids[][16], int *vis) {
  const char *s = getenv("CUDA_VISIBLE_DEVICES");
  if (!s) {
    for (int i = 0; i < nphys; i++) vis[i] = i;
    return nphys;
  }
  int n = 0;
  for (const char *p = s; n < SIM_MAX_DEV;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char tok[64];
    if (len >= sizeof tok) break;
    memcpy(tok, p, len);
    tok[len] = '\0';
    char *t = tok;
    while (isspace((unsigned char)*t)) t++;
    for (char *z = t + strlen(t); z > t && isspace((unsigned char)z[-1]);) *--z = '\0';
    int phys = -1;
    if (*t && strspn(t, "0123456789") == strlen(t)) {
      long v = strtol(t, NULL, 10);
      if (v < nphys) phys = (int)v;
    } else if (strncmp(t, "GPU-", 4) == 0 && t[4]) {
      for (int i = 0; i < nphys; i++) {
        char u[48];
        simm_uuid_string(uuids[i], u, sizeof u);
        if (strncasecmp(u, t, strlen(t)) == 0) {
          if (phys >= 0) { /* ambiguous */
            phys = -1;
            break;
          }
          phys = i;
        }
      }
    }
    for (int i = 0; i < n && phys >= 0; i++)
      if (vis[i] == phys) phys = -1;
    if (phys < 0) break;
    vis[n++] = phys;
    if (!e) break;
    p = e + 1;
  }
  return n;
}

/* The machine: its directory, the UUIDs of its devices, those this process sees, and their shared accounting. */
static CUresult machine_setup_locked(uint64_t env_cap, int *ndev) {
  int nphys = simm_env_devices();
  if (nphys == 0) return CUDA_ERROR_NO_DEVICE;
  char err[4400];
  uint64_t mdev, mino;
  int dirfd = simm_open_machine(&mdev, &mino, err, sizeof err);
  if (dirfd < 0) {
    fprintf(stderr, "simcuda: %s\n", err);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  unsigned char uuids[SIM_MAX_DEV][16];
  for (int i = 0; i < nphys; i++) simm_uuid(mdev, mino, i, uuids[i]);
  int vis[SIM_MAX_DEV];
  int n = visible_devices(nphys, uuids, vis);
  CUresult r = n ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
  for (int d = 0; d < n && r == CUDA_SUCCESS; d++) {
    simdev_t *dv = &g.dev[d];
    dv->phys = vis[d];
    memcpy(dv->uuid, uuids[vis[d]], 16);
    dv->gpu = simm_attach(dirfd, dv->uuid, capacity_for(d, env_cap), err, sizeof err);
    if (!dv->gpu) {
      fprintf(stderr, "simcuda: %s\n", err);
      r = CUDA_ERROR_OPERATING_SYSTEM;
    }
  }
  close(dirfd);
  *ndev = n;
  return r;
}

static CUresult setup_locked(void) {
  uint64_t env_cap = simm_env_capacity();
  int n = 0;
  CUresult mr = machine_setup_locked(env_cap, &n);
  if (mr != CUDA_SUCCESS) return mr;
  uint64_t span = ARENA_SPAN / (uint64_t)(n > 1 ? n : 1);
  span &= ~(SIM_GRAN - 1);
  if (span > (1ULL << 40)) span = 1ULL << 40;
  for (int d = 0; d < n; d++) {
    simdev_t *dv = &g.dev[d];
    uint64_t sz = span;
    int hinted = 0;
    void *p = map_window(ARENA_HINT0 + (uint64_t)d * span, &sz, PROT_READ | PROT_WRITE, &hinted);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    dv->ar.base = (uint64_t)(uintptr_t)p;
    dv->ar.size = sz;
    dv->ar.hinted = hinted;
    if (simext_init(&dv->ar.ext, dv->ar.base, sz) != 0 || simbits_init(&dv->ar.starts, sz >> 9) != 0)
      return CUDA_ERROR_OUT_OF_MEMORY;
    dv->primary.device = d;
    dv->primary.primary = 1;
    if (simmap_put(&g.ctxs, (uint64_t)(uintptr_t)&dv->primary, &dv->primary) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (pool_init(&dv->defpool, d, 1) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    dv->curpool = &dv->defpool;
    dv->pools = &dv->defpool;
  }
  uint64_t vsz = VA_SIZE;
  int vh = 0;
  void *va = map_window(VA_HINT, &vsz, PROT_NONE, &vh);
  if (!va) return CUDA_ERROR_OUT_OF_MEMORY;
  g.va_base = (uint64_t)(uintptr_t)va;
  g.va_size = vsz;
  if (simext_init(&g.va_ext, g.va_base, vsz) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t hsz = HOST_SIZE;
  int hh = 0;
  void *host = map_window(HOST_HINT, &hsz, PROT_NONE, &hh);
  if (!host || simext_init(&g.host_ext, (uint64_t)(uintptr_t)host, hsz) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  g.ndev = n;
  return CUDA_SUCCESS;
}

/* Keeps the mutex consistent across fork(): a child never inherits it locked by a vanished thread. */
static void atfork_prepare(void) { LOCK(); }
static void atfork_parent(void) { UNLOCK(); }
/* The child is a new process for the driver: the GPUs' slots, and the memory they count, are the parent's; it
 * takes an empty slot of its own when it next uses a GPU (sim_machine.c). */
static void atfork_child(void) {
  simm_atfork_child();
  UNLOCK(); /* the forking thread took it in prepare */
}

__attribute__((constructor)) static void sim_ctor(void) {
  const char *t = getenv("SIMCUDA_TRACE");
  g_trace = t && *t && strcmp(t, "0") != 0;
  const char *b = getenv("SIMCUDA_CHECKPOINT_BLOCK");
  g_ck_block = b && *b && strcmp(b, "0") != 0;
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* A process that ends normally gives its memory back, as closing the device does. A thread that keeps the
 * simulator locked must not hang the exit: then the slots are left to be reclaimed as a dead process's. */
__attribute__((destructor)) static void sim_dtor(void) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 2;
  if (pthread_mutex_timedlock(&g.lock, &dl) != 0) return;
  if (inited()) simm_fini();
  UNLOCK();
}

/* --------------------------------------------------------------------------------------- size classes */

/* Rounds to 512 bytes up to 4 KiB, then to 8 steps per power of two (at most 12.5% slack). */
static inline int size_class(uint64_t s, unsigned *cls, uint64_t *rounded) {
  if (s == 0 || s > SIM_MAX_ALLOC) return 0;
  if (s <= 4096) {
    uint64_t r = (s + 511) & ~511ULL;
    *rounded = r;
    *cls = (unsigned)(r / 512 - 1);
    return 1;
  }
  int q = 63 - __builtin_clzll(s);
  uint64_t step = 1ULL << (q - 3);
  uint64_t r = (s + step - 1) & ~(step - 1);
  int q2 = 63 - __builtin_clzll(r);
  unsigned m = (unsigned)((r >> (q2 - 3)) & 7);
  *rounded = r;
  *cls = 8u + (unsigned)(q2 - 12) * 8u + m - 1u;
  return 1;
}

/* ------------------------------------------------------------------------------------------ records */

static blk_t *rec_new(void) {
  blk_t *b = g.rec_free;
  if (b) {
    g.rec_free = b->next;
  } else {
    /* Records come in slabs that are never returned; slot 0 chains the slabs so they stay reachable. */
    enum { SLAB = 1024 };
    blk_t *s = calloc(SLAB, sizeof *s);
    if (!s) return NULL;
    s[0].next = g.slabs;
    g.slabs = s;
    for (int i = 2; i < SLAB; i++) {
      s[i].next = g.rec_free;
      g.rec_free = &s[i];
    }
    b = &s[1];
  }
  memset(b, 0, sizeof *b);
  return b;
}

static void rec_free(blk_t *b) {
  b->state = 0;
  b->next = g.rec_free;
  g.rec_free = b;
}

/* ------------------------------------------------------------------------------------------ arena */

/* While the process is checkpointed its memory is on the host: the device holds nothing of it. */
static inline uint64_t dev_used(const simdev_t *d) {
  return atomic_load_explicit(&g_ck_state, memory_order_relaxed) == CU_PROCESS_STATE_CHECKPOINTED
             ? 0
             : d->plain_bytes + d->pool_reserved + d->vmm_phys;
}

/* Takes `add` bytes of the GPU's capacity, which every process using it shares: 0, or -1 when the bytes of every
 * live process plus `add` exceed it. cap_give returns them. */
static inline int cap_take(simdev_t *d, uint64_t add) { return simm_take(d->gpu, add); }
static inline void cap_give(simdev_t *d, uint64_t n) { simm_give(d->gpu, n); }

static void release_pages(blk_t *b) {
  if (b->dirty) {
    madvise((void *)(uintptr_t)b->addr, b->rounded, MADV_DONTNEED);
    b->dirty = 0;
  }
}

/* Gives every cached chunk back to the free extents, coalescing them; used when address space runs out. */
static void arena_flush(arena_t *a) {
  for (int c = 0; c < SIM_NCLASS; c++) {
    blk_t *b = a->cache[c];
    a->cache[c] = NULL;
    while (b) {
      blk_t *nx = b->next;
      release_pages(b);
      simbits_clear(&a->starts, (b->addr - a->base) >> 9);
      simmap_del(&g.blocks, b->addr);
      simext_free(&a->ext, b->addr, b->rounded);
      rec_free(b);
      b = nx;
    }
  }
}

/* A chunk of `bytes` (rounded to its class) from the arena's cache, or freshly carved. */
static CUresult arena_get(simdev_t *d, uint64_t bytes, blk_t **out) {
  unsigned cls;
  uint64_t rounded;
  if (!size_class(bytes, &cls, &rounded)) return CUDA_ERROR_OUT_OF_MEMORY;
  arena_t *a = &d->ar;
  blk_t *b = a->cache[cls];
  if (b) {
    a->cache[cls] = b->next;
    *out = b;
    return CUDA_SUCCESS;
  }
  uint64_t align = rounded >= SIM_GRAN ? SIM_GRAN : 512;
  uint64_t addr = simext_alloc(&a->ext, rounded, align);
  if (!addr) {
    arena_flush(a);
    addr = simext_alloc(&a->ext, rounded, align);
    if (!addr) return CUDA_ERROR_OUT_OF_MEMORY; /* the arena's address space is exhausted */
  }
  b = rec_new();
  if (!b || simmap_put(&g.blocks, addr, b) != 0) {
    if (b) rec_free(b);
    simext_free(&a->ext, addr, rounded);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  b->addr = addr;
  b->rounded = rounded;
  b->cls = (uint16_t)cls;
  b->device = (int8_t)(d - g.dev);
  simbits_set(&a->starts, (addr - a->base) >> 9);
  *out = b;
  return CUDA_SUCCESS;
}

/* Puts a chunk back in the arena's cache: its address is the first one reused for the same class. */
static void arena_put(simdev_t *d, blk_t *b) {
  if (b->rounded >= (1ULL << 20)) release_pages(b);
  b->state = ST_ARENA_CACHED;
  b->ctx = NULL;
  b->pool = NULL;
  b->prev = NULL;
  b->next = d->ar.cache[b->cls];
  d->ar.cache[b->cls] = b;
}

static inline void ctx_link(struct CUctx_st *c, blk_t *b) {
  b->prev = NULL;
  b->next = c->blocks;
  if (c->blocks) c->blocks->prev = b;
  c->blocks = b;
}

static inline void ctx_unlink(struct CUctx_st *c, blk_t *b) {
  if (b->prev) b->prev->next = b->next;
  else c->blocks = b->next;
  if (b->next) b->next->prev = b->prev;
  b->next = b->prev = NULL;
}

/* ------------------------------------------------------------------------------------- context state */

static inline struct CUctx_st *tls_top(void) { return t_ctx.n ? t_ctx.s[t_ctx.n - 1] : NULL; }

/* The calling thread's usable current context (caller holds the lock). */
static inline CUresult cur_ctx(struct CUctx_st **out) {
  struct CUctx_st *c = tls_top();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

static struct CUctx_st *ctx_lookup(CUcontext h) {
  return h ? simmap_get(&g.ctxs, (uint64_t)(uintptr_t)h) : NULL;
}

static inline int dev_ok(CUdevice d) { return d >= 0 && d < g.ndev; }

/* ------------------------------------------------------------------------------------- plain blocks */

static CUresult plain_alloc_locked(struct CUctx_st *c, uint64_t bytes, int kind, CUdeviceptr *out) {
  simdev_t *d = &g.dev[c->device];
  if (cap_take(d, bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  blk_t *b;
  CUresult r = arena_get(d, bytes, &b);
  if (r != CUDA_SUCCESS) {
    cap_give(d, bytes);
    return r;
  }
  b->state = ST_LIVE;
  b->kind = (uint8_t)kind;
  b->bytes = bytes;
  b->ctx = c;
  ctx_link(c, b);
  d->live_blocks++;
  d->live_bytes += bytes;
  d->plain_bytes += bytes;
  c->live_blocks++;
  c->live_bytes += bytes;
  c->plain_bytes += bytes;
  *out = (CUdeviceptr)b->addr;
  return CUDA_SUCCESS;
}

static void plain_free_locked(blk_t *b) {
  simdev_t *d = &g.dev[b->device];
  struct CUctx_st *c = b->ctx;
  ctx_unlink(c, b);
  d->live_blocks--;
  d->live_bytes -= b->bytes;
  d->plain_bytes -= b->bytes;
  c->live_blocks--;
  c->live_bytes -= b->bytes;
  c->plain_bytes -= b->bytes;
  cap_give(d, b->bytes);
  arena_put(d, b);
}

static inline int is_device_kind(int k) {
  return k == SIMCUDA_DEVICE || k == SIMCUDA_PITCH || k == SIMCUDA_MANAGED || k == SIMCUDA_ASYNC;
}

/* ------------------------------------------------------------------------------------------- pools */

static void pool_release_chunk(struct CUmemPoolHandle_st *p, blk_t *b) {
  simdev_t *d = &g.dev[p->device];
  p->reserved -= b->rounded;
  d->pool_reserved -= b->rounded;
  cap_give(d, b->rounded);
  arena_put(d, b);
}

/* Releases cached (unused) chunks, largest classes first, until the pool reserves at most `keep`. */
static void pool_trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep) {
  for (int c = SIM_NCLASS - 1; c >= 0 && p->reserved > keep; c--) {
    while (p->reserved > keep && p->cache[c]) {
      blk_t *b = p->cache[c];
      p->cache[c] = b->next;
      pool_release_chunk(p, b);
    }
  }
}

static CUresult pool_alloc_locked(struct CUmemPoolHandle_st *p, struct CUctx_st *c, uint64_t bytes,
                                  CUdeviceptr *out) {
  unsigned cls;
  uint64_t rounded;
  if (!size_class(bytes, &cls, &rounded)) return CUDA_ERROR_OUT_OF_MEMORY;
  simdev_t *d = &g.dev[p->device];
  blk_t *b = p->cache[cls];
  if (b) {
    p->cache[cls] = b->next;
  } else {
    /* A real pool suballocates what it holds: before failing, give back what it caches and retry. */
    if ((p->max_size && p->reserved + rounded > p->max_size) || simm_would_exceed(d->gpu, rounded))
      pool_trim_locked(p, 0);
    if (p->max_size && p->reserved + rounded > p->max_size) return CUDA_ERROR_OUT_OF_MEMORY;
    if (cap_take(d, rounded) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = arena_get(d, bytes, &b);
    if (r != CUDA_SUCCESS) {
      cap_give(d, rounded);
      return r;
    }
    p->reserved += rounded;
    d->pool_reserved += rounded;
    if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  }
  b->state = ST_LIVE;
  b->kind = SIMCUDA_ASYNC;
  b->bytes = bytes;
  b->ctx = c;
  b->pool = p;
  ctx_link(c, b);
  p->used += rounded;
  if (p->used > p->used_high) p->used_high = p->used;
  d->live_blocks++;
  d->live_bytes += bytes;
  d->pool_used += rounded;
  c->live_blocks++;
  c->live_bytes += bytes;
  c->pool_used += rounded;
  *out = (CUdeviceptr)b->addr;
  return CUDA_SUCCESS;
}

/* Stream-ordered frees, as the device runs them. cuMemFreeAsync takes the block from the program at once (it
 * is no longer live, its address is no longer valid), but the memory goes back to its pool only when the
 * stream's work reaches the free: at the next synchronisation covering that stream (cuStreamSynchronize of
 * it, of the legacy default stream for blocking streams, cuCtxSynchronize, cuMemFree of a stream-ordered
 * block, which synchronises the device, or the context's destruction), or when a later allocation on the same
 * stream runs (stream order: the free happened before it). Until then the pool counts the memory as used,
 * and cuMemPoolTrimTo cannot return it. The simulator has no events, so no event synchronisation. */

/* The block leaves the program: no longer live, still used in its pool. */
static void pool_unlive_locked(blk_t *b) {
  simdev_t *d = &g.dev[b->pool->device];
  struct CUctx_st *c = b->ctx;
  ctx_unlink(c, b);
  d->live_blocks--;
  d->live_bytes -= b->bytes;
  c->live_blocks--;
  c->live_bytes -= b->bytes;
  c->pool_used -= b->rounded;
  b->ctx = NULL;
}

/* The free has run: the block's chunk goes back to its pool (cached, still reserved), or to the arena when the
 * pool is gone. */
static void pool_complete_locked(blk_t *b) {
  struct CUmemPoolHandle_st *p = b->pool;
  simdev_t *d = &g.dev[p->device];
  p->used -= b->rounded;
  d->pool_used -= b->rounded;
  if (!p->alive) {
    pool_release_chunk(p, b);
    return;
  }
  b->state = ST_POOL_CACHED;
  b->ctx = NULL;
  b->prev = NULL;
  b->next = p->cache[b->cls];
  p->cache[b->cls] = b;
}

/* A free that takes effect at once (cuMemFree of a stream-ordered block, a context's teardown). */
static void pool_free_locked(blk_t *b) {
  pool_unlive_locked(b);
  pool_complete_locked(b);
}

/* A stream-ordered free: queued on the stream's pending list. */
static void pool_free_async_locked(blk_t *b, blk_t **pend) {
  pool_unlive_locked(b);
  b->state = ST_PENDING;
  b->prev = NULL;
  b->next = *pend;
  *pend = b;
}

/* The stream reached its queued frees. */
static void pend_complete_locked(blk_t **pend) {
  blk_t *fifo = NULL; /* the list is newest first: run the frees in the order they were made */
  while (*pend) {
    blk_t *b = *pend;
    *pend = b->next;
    b->next = fifo;
    fifo = b;
  }
  while (fifo) {
    blk_t *b = fifo;
    fifo = b->next;
    pool_complete_locked(b);
  }
}

/* Every stream of the context reached its queued frees. */
static void ctx_complete_locked(struct CUctx_st *c) {
  pend_complete_locked(&c->pend_legacy);
  pend_complete_locked(&c->pend_pt);
  for (struct CUstream_st *s = c->streams; s; s = s->next) pend_complete_locked(&s->pend);
}

/* Every context of the device reached its queued frees. */
static void dev_complete_locked(int device) {
  ctx_complete_locked(&g.dev[device].primary);
  for (struct CUctx_st *c = g.all_ctx; c; c = c->all_next)
    if (c->alive && c->device == device) ctx_complete_locked(c);
}

/* What a synchronization does to pools: memory above each pool's release threshold goes back. */
static void sync_device_locked(int device) {
  for (struct CUmemPoolHandle_st *p = g.dev[device].pools; p; p = p->dev_next)
    if (p->alive && p->reserved > p->threshold) pool_trim_locked(p, p->threshold);
}

static struct CUmemPoolHandle_st *pool_lookup(CUmemoryPool h) {
  return h ? simmap_get(&g.pools, (uint64_t)(uintptr_t)h) : NULL;
}

/* ------------------------------------------------------------------------------------------ host */

/* Gives a host range back to its window: its pages go (contents discarded), the reservation stays. */
static void host_unmap(uint64_t at, uint64_t len) {
  mmap((void *)(uintptr_t)at, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  simext_free(&g.host_ext, at, len);
}

static CUresult host_alloc_locked(struct CUctx_st *c, uint64_t bytes, void **out) {
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t len = (bytes + (uint64_t)pg - 1) & ~((uint64_t)pg - 1);
  if (len < bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t at = simext_alloc(&g.host_ext, len, (uint64_t)pg);
  if (!at) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = mmap((void *)(uintptr_t)at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) {
    simext_free(&g.host_ext, at, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  blk_t *b = rec_new();
  if (!b || simmap_put(&g.blocks, (uint64_t)(uintptr_t)p, b) != 0) {
    if (b) rec_free(b);
    host_unmap(at, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  b->addr = (uint64_t)(uintptr_t)p;
  b->rounded = len;
  b->bytes = bytes;
  b->kind = SIMCUDA_HOST;
  b->state = ST_LIVE;
  b->device = (int8_t)c->device;
  b->ctx = c;
  ctx_link(c, b);
  simdev_t *d = &g.dev[c->device];
  d->host_blocks++;
  d->host_bytes += bytes;
  c->host_blocks++;
  c->host_bytes += bytes;
  *out = p;
  return CUDA_SUCCESS;
}

static void host_free_locked(blk_t *b) {
  struct CUctx_st *c = b->ctx;
  simdev_t *d = &g.dev[c->device];
  ctx_unlink(c, b);
  d->host_blocks--;
  d->host_bytes -= b->bytes;
  c->host_blocks--;
  c->host_bytes -= b->bytes;
  simmap_del(&g.blocks, b->addr);
  host_unmap(b->addr, b->rounded);
  rec_free(b);
}

/* ------------------------------------------------------------------------------------- ctx teardown */

/* Frees everything a context owns, as destroying, resetting or finally releasing it does. */
static void ctx_teardown_locked(struct CUctx_st *c) {
  while (c->blocks) {
    blk_t *b = c->blocks;
    if (b->kind == SIMCUDA_ASYNC) pool_free_locked(b);
    else if (b->kind == SIMCUDA_HOST) host_free_locked(b);
    else plain_free_locked(b);
  }
  ctx_complete_locked(c); /* destroying a context waits for its streams */
  while (c->streams) {
    struct CUstream_st *s = c->streams;
    c->streams = s->next;
    simmap_del(&g.streams, (uint64_t)(uintptr_t)s);
    g_capturing -= s->capturing; /* its capture ends with it */
    if (s->capturing) cap_drop_locked(s);
    free(s);
  }
  if (c->alive) g.dev[c->device].contexts--;
  c->alive = 0;
}

/* ------------------------------------------------------------------------------------------ streams */

static inline int special_stream(CUstream h) { return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD; }

/* The context a stream works in: the current one for the legacy and per-thread default streams. */
static CUresult stream_ctx_locked(CUstream h, struct CUctx_st **out) {
  if (special_stream(h)) return cur_ctx(out);
  struct CUstream_st *s = simmap_get(&g.streams, (uint64_t)(uintptr_t)h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (!s->ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = s->ctx;
  return CUDA_SUCCESS;
}

/* The pending-free list of a stream in context c: its own, or the context's for a default stream. per_thread:
 * the call is a _ptsz variant, where stream 0 means the per-thread default stream. Caller holds the lock;
 * h is valid (stream_ctx_locked succeeded). The per-thread default streams of all threads share one list. */
static blk_t **pend_list_locked(CUstream h, int per_thread, struct CUctx_st *c) {
  if (h == CU_STREAM_PER_THREAD || (h == NULL && per_thread)) return &c->pend_pt;
  if (special_stream(h)) return &c->pend_legacy;
  return &((struct CUstream_st *)simmap_get(&g.streams, (uint64_t)(uintptr_t)h))->pend;
}

/* ------------------------------------------------------------------------------- address validation */

static simdev_t *arena_of(uint64_t a) {
  for (int d = 0; d < g.ndev; d++)
    if (a - g.dev[d].ar.base < g.dev[d].ar.size) return &g.dev[d];
  return NULL;
}

/* The live device block that contains address a (interior pointers included), or NULL. */
static blk_t *chunk_at(uint64_t a) {
  simdev_t *d = arena_of(a);
  if (!d) return NULL;
  int64_t j = simbits_pred(&d->ar.starts, (a - d->ar.base) >> 9);
  if (j < 0) return NULL;
  blk_t *b = simmap_get(&g.blocks, d->ar.base + (uint64_t)j * 512);
  if (!b || b->state != ST_LIVE || a >= b->addr + b->bytes) return NULL;
  return b;
}

static va_res_t *res_at(uint64_t a) {
  for (va_res_t *r = g.res; r; r = r->next)
    if (a - r->va < r->size) return r;
  return NULL;
}

/* Is [a, a+n) covered by adjacent VMM mappings granting at least `prot`? Reports the first mapping. */
static int vmm_range_ok(uint64_t a, uint64_t n, int prot, uint64_t *base, uint64_t *size) {
  va_res_t *r = res_at(a);
  if (!r) return 0;
  vmm_map_t *m = r->maps;
  while (m && m->va + m->size <= a) m = m->next;
  if (!m || m->va > a) return 0;
  if (base) *base = m->va;
  if (size) *size = m->size;
  uint64_t end = a + n;
  for (;;) {
    if ((m->prot & prot) != prot) return 0;
    uint64_t at = m->va + m->size;
    if (at >= end) return 1;
    m = m->next;
    if (!m || m->va != at) return 0;
  }
}

/* Validates a device range for a copy or set; marks arena chunks written to. */
static CUresult dev_range_locked(uint64_t a, uint64_t n, int write) {
  if (a + n < a) return CUDA_ERROR_INVALID_VALUE;
  blk_t *b = chunk_at(a);
  if (b) {
    if (a + n > b->addr + b->bytes) return CUDA_ERROR_INVALID_VALUE;
    if (write) b->dirty = 1;
    return CUDA_SUCCESS;
  }
  if (vmm_range_ok(a, n, write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ, NULL, NULL))
    return CUDA_SUCCESS;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ===================================================================================== entry points */

/* ---- initialization and version */

/* The driver's own service thread. libcuda starts threads in cuInit (an event handler among them), so every
 * process that initialises CUDA is multi-threaded; glibc then makes every pthread mutex (the simulator's, the
 * program's) a real atomic operation instead of its single-threaded shortcut. The simulator does the same, so
 * that a process's costs do not change just because an interposer starts a thread of its own. It blocks every
 * signal (process signals go to the program's threads) and sleeps for good. */
static void *service_thread(void *arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static void start_service_thread(void) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited by the new thread */
  pthread_attr_t attr;
  pthread_t th;
  if (pthread_attr_init(&attr) == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (pthread_create(&th, &attr, service_thread, NULL) == 0) pthread_setname_np(th, "simcuda-svc");
    pthread_attr_destroy(&attr);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static CUresult impl_init(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (inited()) return CUDA_SUCCESS;
  LOCK();
  CUresult r = CUDA_SUCCESS;
  int first = 0;
  if (!inited()) {
    r = setup_locked();
    if (r == CUDA_SUCCESS) atomic_store_explicit(&g.initialized, 1, memory_order_release), first = 1;
  }
  UNLOCK();
  if (first) start_service_thread();
  return r;
}

SIM_API cuInit(unsigned int Flags) {
  ENTER(cuInit);
  LEAVE(cuInit, impl_init(Flags));
}

SIM_API cuDriverGetVersion(int *driverVersion) {
  ENTER(cuDriverGetVersion);
  if (!driverVersion) LEAVE(cuDriverGetVersion, CUDA_ERROR_INVALID_VALUE);
  const char *v = getenv("SIMCUDA_DRIVER_VERSION"); /* an older driver, for a runtime to refuse */
  *driverVersion = v && *v ? atoi(v) : SIM_DRIVER_VERSION;
  LEAVE(cuDriverGetVersion, CUDA_SUCCESS);
}

/* ---- devices */

static CUresult impl_device_get(CUdevice *device, int ordinal) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

SIM_API cuDeviceGet(CUdevice *device, int ordinal) {
  ENTER(cuDeviceGet);
  LEAVE(cuDeviceGet, impl_device_get(device, ordinal));
}

SIM_API cuDeviceGetCount(int *count) {
  ENTER(cuDeviceGetCount);
  if (!inited()) LEAVE(cuDeviceGetCount, CUDA_ERROR_NOT_INITIALIZED);
  if (!count) LEAVE(cuDeviceGetCount, CUDA_ERROR_INVALID_VALUE);
  *count = g.ndev;
  LEAVE(cuDeviceGetCount, CUDA_SUCCESS);
}

SIM_API cuDeviceGetName(char *name, int len, CUdevice dev) {
  ENTER(cuDeviceGetName);
  if (!inited()) LEAVE(cuDeviceGetName, CUDA_ERROR_NOT_INITIALIZED);
  if (!name || len <= 0) LEAVE(cuDeviceGetName, CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(dev)) LEAVE(cuDeviceGetName, CUDA_ERROR_INVALID_DEVICE);
  snprintf(name, (size_t)len, "NVIDIA H100 80GB HBM3 (simcuda)");
  LEAVE(cuDeviceGetName, CUDA_SUCCESS);
}

/* The UUID of the machine's device behind the ordinal (CUDA_VISIBLE_DEVICES renumbers ordinals, never UUIDs):
 * derived from the machine directory's identity and the device's index on the machine, so that every process
 * of one machine agrees on it and two machines never share one; random-looking and marked as a version 4 UUID.
 * nvidia-smi writes it as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static CUresult impl_device_uuid(CUuuid *uuid, CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  memcpy(uuid->bytes, g.dev[dev].uuid, 16);
  return CUDA_SUCCESS;
}

static CUresult impl_total_mem(uint64_t *bytes, CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  *bytes = simm_capacity(g.dev[dev].gpu);
  UNLOCK();
  return CUDA_SUCCESS;
}

SIM_API cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  ENTER(cuDeviceTotalMem_v2);
  uint64_t v;
  CUresult r = impl_total_mem(bytes ? &v : NULL, dev);
  if (r == CUDA_SUCCESS) *bytes = (size_t)v;
  LEAVE(cuDeviceTotalMem_v2, r);
}

SIM_API cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
  ENTER(cuDeviceTotalMem);
  uint64_t v;
  CUresult r = impl_total_mem(bytes ? &v : NULL, dev);
  if (r == CUDA_SUCCESS) *bytes = v > UINT_MAX ? UINT_MAX : (unsigned int)v; /* the 32-bit ABI saturates */
  LEAVE(cuDeviceTotalMem, r);
}

SIM_API cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  ENTER(cuDeviceGetAttribute);
  if (!inited()) LEAVE(cuDeviceGetAttribute, CUDA_ERROR_NOT_INITIALIZED);
  if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) LEAVE(cuDeviceGetAttribute, CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(dev)) LEAVE(cuDeviceGetAttribute, CUDA_ERROR_INVALID_DEVICE);
  int v = 0;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + g.dev[dev].phys; break;
  case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
  default: v = 0; break;
  }
  *pi = v;
  LEAVE(cuDeviceGetAttribute, CUDA_SUCCESS);
}

/* ---- primary contexts */

static CUresult impl_primary_retain(CUcontext *pctx, CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  struct CUctx_st *p = &g.dev[dev].primary;
  if (!p->alive) {
    p->alive = 1;
    g.dev[dev].contexts++;
  }
  p->refcount++;
  UNLOCK();
  *pctx = p;
  return CUDA_SUCCESS;
}

SIM_API cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  ENTER(cuDevicePrimaryCtxRetain);
  LEAVE(cuDevicePrimaryCtxRetain, impl_primary_retain(pctx, dev));
}

static CUresult impl_primary_release(CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  CUresult r = CUDA_SUCCESS;
  LOCK();
  struct CUctx_st *p = &g.dev[dev].primary;
  if (p->refcount <= 0) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else if (--p->refcount == 0) {
    ctx_teardown_locked(p); /* the final release destroys it, whatever thread it is current to */
  }
  UNLOCK();
  return r;
}

static CUresult impl_primary_reset(CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  LOCK();
  /* Frees everything but keeps the retain count: holders still release, a retain re-activates it. */
  ctx_teardown_locked(&g.dev[dev].primary);
  UNLOCK();
  return CUDA_SUCCESS;
}

SIM_API cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  ENTER(cuDevicePrimaryCtxGetState);
  if (!inited()) LEAVE(cuDevicePrimaryCtxGetState, CUDA_ERROR_NOT_INITIALIZED);
  if (!flags || !active) LEAVE(cuDevicePrimaryCtxGetState, CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(dev)) LEAVE(cuDevicePrimaryCtxGetState, CUDA_ERROR_INVALID_DEVICE);
  LOCK();
  *flags = g.dev[dev].primary.flags;
  *active = g.dev[dev].primary.alive;
  UNLOCK();
  LEAVE(cuDevicePrimaryCtxGetState, CUDA_SUCCESS);
}

/* ---- explicit contexts and the per-thread stack */

static CUresult impl_ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (t_ctx.n == CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
  struct CUctx_st *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->device = dev;
  c->flags = flags;
  c->alive = 1;
  c->usage = 1;
  LOCK();
  if (simmap_put(&g.ctxs, (uint64_t)(uintptr_t)c, c) != 0) {
    UNLOCK();
    free(c);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  c->all_next = g.all_ctx;
  g.all_ctx = c;
  g.dev[dev].contexts++;
  UNLOCK();
  t_ctx.s[t_ctx.n++] = c; /* a new context is pushed current on the calling thread */
  *pctx = c;
  return CUDA_SUCCESS;
}

SIM_API cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                       CUdevice dev) {
  ENTER(cuCtxCreate_v3);
  if (numParams < 0 || (numParams > 0 && !paramsArray)) LEAVE(cuCtxCreate_v3, CUDA_ERROR_INVALID_VALUE);
  LEAVE(cuCtxCreate_v3, impl_ctx_create(pctx, flags, dev));
}

SIM_API cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) {
  ENTER(cuCtxCreate_v4);
  LEAVE(cuCtxCreate_v4, impl_ctx_create(pctx, flags, dev));
}

static CUresult impl_ctx_destroy(CUcontext h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c = ctx_lookup(h);
  if (!c || c->primary) {
    UNLOCK();
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  ctx_teardown_locked(c);
  simmap_del(&g.ctxs, (uint64_t)(uintptr_t)c);
  UNLOCK();
  if (tls_top() == c) t_ctx.n--; /* popped when current to the calling thread */
  return CUDA_SUCCESS;
}

static CUresult ctx_arg_locked(CUcontext h, struct CUctx_st **out);

/* cuCtxAttach and cuCtxDetach (deprecated, still exported and asked for by the CUDA 13 runtime): a usage count
 * on the current, non-primary context; the detach that takes it to 0 destroys the context as cuCtxDestroy does. */
SIM_API cuCtxAttach(CUcontext *pctx, unsigned int flags) {
  ENTER(cuCtxAttach);
  if (!inited()) LEAVE(cuCtxAttach, CUDA_ERROR_NOT_INITIALIZED);
  if (!pctx || flags) LEAVE(cuCtxAttach, CUDA_ERROR_INVALID_VALUE);
  struct CUctx_st *c = tls_top();
  if (!c || c->primary || !c->alive) LEAVE(cuCtxAttach, CUDA_ERROR_INVALID_CONTEXT);
  LOCK();
  c->usage++;
  UNLOCK();
  *pctx = c;
  LEAVE(cuCtxAttach, CUDA_SUCCESS);
}

SIM_API cuCtxDetach(CUcontext ctx) {
  ENTER(cuCtxDetach);
  if (!inited()) LEAVE(cuCtxDetach, CUDA_ERROR_NOT_INITIALIZED);
  if (!ctx) LEAVE(cuCtxDetach, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  struct CUctx_st *c = ctx_lookup(ctx);
  if (!c || c->primary || c != tls_top()) { /* must be current to the calling thread */
    UNLOCK();
    LEAVE(cuCtxDetach, CUDA_ERROR_INVALID_CONTEXT);
  }
  int left = --c->usage;
  UNLOCK();
  LEAVE(cuCtxDetach, left > 0 ? CUDA_SUCCESS : impl_ctx_destroy(ctx));
}

/* The context's API version (3020, as the real driver answers for contexts made since CUDA 3.2); NULL: the
 * current one. A destroyed context is an invalid one. */
SIM_API cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
  ENTER(cuCtxGetApiVersion);
  if (!inited()) LEAVE(cuCtxGetApiVersion, CUDA_ERROR_NOT_INITIALIZED);
  if (!version) LEAVE(cuCtxGetApiVersion, CUDA_ERROR_INVALID_VALUE);
  struct CUctx_st *c;
  LOCK();
  CUresult r = ctx_arg_locked(ctx, &c);
  UNLOCK();
  if (r == CUDA_SUCCESS) *version = 3020;
  LEAVE(cuCtxGetApiVersion, r);
}

static CUresult impl_ctx_push(CUcontext h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c = ctx_lookup(h);
  UNLOCK();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx.n == CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
  t_ctx.s[t_ctx.n++] = c;
  return CUDA_SUCCESS;
}

static CUresult impl_ctx_pop(CUcontext *pctx) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx.n == 0) return CUDA_ERROR_INVALID_CONTEXT;
  struct CUctx_st *c = t_ctx.s[--t_ctx.n];
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

SIM_API cuCtxGetCurrent(CUcontext *pctx) {
  ENTER(cuCtxGetCurrent);
  if (!inited()) LEAVE(cuCtxGetCurrent, CUDA_ERROR_NOT_INITIALIZED);
  if (!pctx) LEAVE(cuCtxGetCurrent, CUDA_ERROR_INVALID_VALUE);
  *pctx = tls_top();
  LEAVE(cuCtxGetCurrent, CUDA_SUCCESS);
}

static CUresult impl_ctx_set(CUcontext h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!h) {
    if (t_ctx.n) t_ctx.n--; /* NULL pops the top, a no-op on an empty stack */
    return CUDA_SUCCESS;
  }
  LOCK();
  struct CUctx_st *c = ctx_lookup(h);
  UNLOCK();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_ctx.n) t_ctx.s[t_ctx.n - 1] = c;
  else t_ctx.s[t_ctx.n++] = c;
  return CUDA_SUCCESS;
}

SIM_API cuCtxSetCurrent(CUcontext ctx) {
  ENTER(cuCtxSetCurrent);
  LEAVE(cuCtxSetCurrent, impl_ctx_set(ctx));
}

/* Resolves an explicit context argument, NULL meaning the current one. */
static CUresult ctx_arg_locked(CUcontext h, struct CUctx_st **out) {
  if (!h) return cur_ctx(out);
  struct CUctx_st *c = ctx_lookup(h);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

static CUresult impl_ctx_get_device(CUdevice *device, CUcontext h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  struct CUctx_st *c;
  LOCK();
  CUresult r = ctx_arg_locked(h, &c);
  UNLOCK();
  if (r == CUDA_SUCCESS) *device = c->device;
  return r;
}

SIM_API cuCtxGetDevice(CUdevice *device) {
  ENTER(cuCtxGetDevice);
  LEAVE(cuCtxGetDevice, impl_ctx_get_device(device, NULL));
}

SIM_API cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
  ENTER(cuCtxGetDevice_v2);
  LEAVE(cuCtxGetDevice_v2, impl_ctx_get_device(device, ctx));
}

static CUresult impl_ctx_sync(CUcontext h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  struct CUctx_st *c;
  LOCK();
  CUresult r = ctx_arg_locked(h, &c);
  if (r == CUDA_SUCCESS) {
    ctx_complete_locked(c);
    sync_device_locked(c->device);
  }
  UNLOCK();
  return r;
}

SIM_API cuCtxSynchronize(void) {
  ENTER(cuCtxSynchronize);
  LEAVE(cuCtxSynchronize, impl_ctx_sync(NULL));
}

SIM_API cuCtxSynchronize_v2(CUcontext ctx) {
  ENTER(cuCtxSynchronize_v2);
  LEAVE(cuCtxSynchronize_v2, impl_ctx_sync(ctx));
}

/* ---- plain device memory */

static CUresult impl_alloc(CUdeviceptr *dptr, uint64_t bytes, int kind) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS) {
    if (!dptr || bytes == 0) r = CUDA_ERROR_INVALID_VALUE;
    else r = plain_alloc_locked(c, bytes, kind, dptr);
  }
  UNLOCK();
  return r;
}

SIM_API cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  ENTER(cuMemAlloc_v2);
  LEAVE(cuMemAlloc_v2, impl_alloc(dptr, bytesize, SIMCUDA_DEVICE));
}

SIM_API cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                           unsigned int ElementSizeBytes) {
  ENTER(cuMemAllocPitch_v2);
  if (!inited()) LEAVE(cuMemAllocPitch_v2, CUDA_ERROR_NOT_INITIALIZED);
  if (!dptr || !pPitch || !WidthInBytes || !Height ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
    LEAVE(cuMemAllocPitch_v2, CUDA_ERROR_INVALID_VALUE);
  uint64_t pitch = ((uint64_t)WidthInBytes + 511) & ~511ULL;
  if (pitch < WidthInBytes || Height > SIM_MAX_ALLOC / pitch) LEAVE(cuMemAllocPitch_v2, CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr p;
  CUresult r = impl_alloc(&p, pitch * Height, SIMCUDA_PITCH);
  if (r == CUDA_SUCCESS) {
    *dptr = p;
    *pPitch = (size_t)pitch;
  }
  LEAVE(cuMemAllocPitch_v2, r);
}

SIM_API cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
  ENTER(cuMemAllocManaged);
  if (!inited()) LEAVE(cuMemAllocManaged, CUDA_ERROR_NOT_INITIALIZED);
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) LEAVE(cuMemAllocManaged, CUDA_ERROR_INVALID_VALUE);
  LEAVE(cuMemAllocManaged, impl_alloc(dptr, bytesize, SIMCUDA_MANAGED));
}

static CUresult impl_free(CUdeviceptr dptr) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (dptr == 0) return CUDA_SUCCESS; /* the real driver has free(NULL) semantics here */
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS) {
    blk_t *b = simmap_get(&g.blocks, (uint64_t)dptr);
    if (!b || b->state != ST_LIVE || !is_device_kind(b->kind)) {
      r = CUDA_ERROR_INVALID_VALUE;
    } else if (b->kind == SIMCUDA_ASYNC) {
      int dev = b->device;
      pool_free_locked(b);
      dev_complete_locked(dev); /* cuMemFree of a stream-ordered block synchronizes the device */
      sync_device_locked(dev);
    } else {
      plain_free_locked(b);
    }
  }
  UNLOCK();
  return r;
}

SIM_API cuMemFree_v2(CUdeviceptr dptr) {
  ENTER(cuMemFree_v2);
  LEAVE(cuMemFree_v2, impl_free(dptr));
}

static CUresult impl_mem_info(uint64_t *fr, uint64_t *total) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS) {
    if (!fr || !total) {
      r = CUDA_ERROR_INVALID_VALUE;
    } else {
      /* The GPU's: every live process's memory counts (dead processes' is reclaimed first). */
      simm_info_t in;
      simm_info(g.dev[c->device].gpu, &in);
      *total = in.capacity;
      *fr = in.used >= in.capacity ? 0 : in.capacity - in.used;
    }
  }
  UNLOCK();
  return r;
}

SIM_API cuMemGetInfo_v2(size_t *free, size_t *total) {
  ENTER(cuMemGetInfo_v2);
  uint64_t f, t;
  CUresult r = impl_mem_info(free ? &f : NULL, total ? &t : NULL);
  if (r == CUDA_SUCCESS) {
    *free = (size_t)f;
    *total = (size_t)t;
  }
  LEAVE(cuMemGetInfo_v2, r);
}

SIM_API cuMemGetInfo(unsigned int *free, unsigned int *total) {
  ENTER(cuMemGetInfo);
  uint64_t f, t;
  CUresult r = impl_mem_info(free ? &f : NULL, total ? &t : NULL);
  if (r == CUDA_SUCCESS) {
    *free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
    *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
  }
  LEAVE(cuMemGetInfo, r);
}

SIM_API cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  ENTER(cuMemGetAddressRange_v2);
  if (!inited()) LEAVE(cuMemGetAddressRange_v2, CUDA_ERROR_NOT_INITIALIZED);
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  uint64_t base = 0, size = 0;
  if (r == CUDA_SUCCESS) {
    blk_t *b = chunk_at((uint64_t)dptr);
    if (b) {
      base = b->addr;
      size = b->bytes;
    } else if (!vmm_range_ok((uint64_t)dptr, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE, &base, &size)) {
      r = CUDA_ERROR_NOT_FOUND;
    }
  }
  UNLOCK();
  if (r == CUDA_SUCCESS) {
    if (pbase) *pbase = (CUdeviceptr)base;
    if (psize) *psize = (size_t)size;
  }
  LEAVE(cuMemGetAddressRange_v2, r);
}

/* ---- pinned host memory */

static CUresult impl_host_alloc(void **pp, uint64_t bytes, unsigned flags) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS) {
    if (!pp || bytes == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
      r = CUDA_ERROR_INVALID_VALUE;
    else
      r = host_alloc_locked(c, bytes, pp);
  }
  UNLOCK();
  return r;
}

SIM_API cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  ENTER(cuMemHostAlloc);
  LEAVE(cuMemHostAlloc, impl_host_alloc(pp, bytesize, Flags));
}

SIM_API cuMemAllocHost_v2(void **pp, size_t bytesize) {
  ENTER(cuMemAllocHost_v2);
  LEAVE(cuMemAllocHost_v2, impl_host_alloc(pp, bytesize, 0));
}

SIM_API cuMemAllocHost(void **pp, unsigned int bytesize) {
  ENTER(cuMemAllocHost);
  LEAVE(cuMemAllocHost, impl_host_alloc(pp, bytesize, 0));
}

SIM_API cuMemFreeHost(void *p) {
  ENTER(cuMemFreeHost);
  if (!inited()) LEAVE(cuMemFreeHost, CUDA_ERROR_NOT_INITIALIZED);
  if (capture_forbids()) LEAVE(cuMemFreeHost, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (!p) LEAVE(cuMemFreeHost, CUDA_SUCCESS);
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS) {
    blk_t *b = simmap_get(&g.blocks, (uint64_t)(uintptr_t)p);
    if (!b || b->state != ST_LIVE || b->kind != SIMCUDA_HOST) r = CUDA_ERROR_INVALID_VALUE;
    else host_free_locked(b);
  }
  UNLOCK();
  LEAVE(cuMemFreeHost, r);
}

/* ---- copies and sets (streams are synchronous: the work is done before returning) */

enum { CP_HTOD, CP_DTOH, CP_DTOD };

static CUresult impl_copy(int dir, uint64_t dst, uint64_t src, uint64_t n) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS && n) {
    if (!dst || !src) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && dir != CP_DTOH) r = dev_range_locked(dst, n, 1);
    if (r == CUDA_SUCCESS && dir != CP_HTOD) r = dev_range_locked(src, n, 0);
    if (r == CUDA_SUCCESS) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  }
  UNLOCK();
  return r;
}

static CUresult impl_memset(uint64_t dst, unsigned char v, uint64_t n) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (capture_forbids()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS && n) {
    r = dev_range_locked(dst, n, 1);
    if (r == CUDA_SUCCESS) memset((void *)(uintptr_t)dst, v, n);
  }
  UNLOCK();
  return r;
}

/* ---- streams */

SIM_API cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  ENTER(cuStreamCreate);
  if (!inited()) LEAVE(cuStreamCreate, CUDA_ERROR_NOT_INITIALIZED);
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS && (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING))) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s || simmap_put(&g.streams, (uint64_t)(uintptr_t)s, s) != 0) {
      free(s);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      s->ctx = c;
      s->flags = Flags;
      s->next = c->streams;
      if (c->streams) c->streams->prev = s;
      c->streams = s;
      *phStream = s;
    }
  }
  UNLOCK();
  LEAVE(cuStreamCreate, r);
}

static CUresult impl_stream_destroy(CUstream h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (special_stream(h)) return CUDA_ERROR_INVALID_HANDLE;
  LOCK();
  struct CUstream_st *s = simmap_del(&g.streams, (uint64_t)(uintptr_t)h);
  if (s) {
    struct CUctx_st *c = s->ctx;
    g_capturing -= s->capturing; /* its capture ends with it */
    if (s->capturing) cap_drop_locked(s);
    if (s->prev) s->prev->next = s->next;
    else c->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    /* Destroying a stream does not wait for it: its queued frees run at the context's next synchronisation. */
    while (s->pend) {
      blk_t *b = s->pend;
      s->pend = b->next;
      b->next = c->pend_legacy;
      c->pend_legacy = b;
    }
    free(s);
  }
  UNLOCK();
  return s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult impl_stream_sync(CUstream h, int per_thread) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  if (r == CUDA_SUCCESS) {
    blk_t **pend = pend_list_locked(h, per_thread, c);
    pend_complete_locked(pend);
    if (pend == &c->pend_legacy) /* the legacy default stream waits for every blocking stream */
      for (struct CUstream_st *s = c->streams; s; s = s->next)
        if (!(s->flags & CU_STREAM_NON_BLOCKING)) pend_complete_locked(&s->pend);
    sync_device_locked(c->device);
  }
  UNLOCK();
  return r;
}

static CUresult impl_stream_get_ctx(CUstream h, CUcontext *pctx) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  UNLOCK();
  if (r == CUDA_SUCCESS) *pctx = c;
  return r;
}

static CUresult impl_stream_get_ctx_v2(CUstream h, CUcontext *pctx, CUgreenCtx *pgreen) {
  CUresult r = impl_stream_get_ctx(h, pctx);
  if (r == CUDA_SUCCESS && pgreen) *pgreen = NULL; /* no green contexts in the simulator */
  return r;
}

/* ---- stream-ordered allocation */

static CUresult impl_alloc_async(CUdeviceptr *dptr, uint64_t bytes, CUmemoryPool hpool, int from_pool, CUstream h,
                                 int per_thread) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  if (r == CUDA_SUCCESS) {
    pend_complete_locked(pend_list_locked(h, per_thread, c)); /* earlier frees on this stream have run */
    struct CUmemPoolHandle_st *p = from_pool ? pool_lookup(hpool) : g.dev[c->device].curpool;
    if (!p) r = CUDA_ERROR_INVALID_VALUE;
    else r = pool_alloc_locked(p, c, bytes, dptr);
  }
  UNLOCK();
  return r;
}

static CUresult impl_free_async(CUdeviceptr dptr, CUstream h, int per_thread) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  if (r == CUDA_SUCCESS) {
    blk_t *b = simmap_get(&g.blocks, (uint64_t)dptr);
    if (!b || b->state != ST_LIVE || !is_device_kind(b->kind)) r = CUDA_ERROR_INVALID_VALUE;
    else if (b->kind == SIMCUDA_ASYNC) pool_free_async_locked(b, pend_list_locked(h, per_thread, c));
    else plain_free_locked(b); /* a cuMemAlloc block may be freed stream-ordered too (at once, here) */
  }
  UNLOCK();
  return r;
}

/* ---- memory pools */

SIM_API cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
  ENTER(cuMemPoolCreate);
  if (!inited()) LEAVE(cuMemPoolCreate, CUDA_ERROR_NOT_INITIALIZED);
  if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !dev_ok(poolProps->location.id))
    LEAVE(cuMemPoolCreate, CUDA_ERROR_INVALID_VALUE);
  struct CUmemPoolHandle_st *p = malloc(sizeof *p);
  if (!p) LEAVE(cuMemPoolCreate, CUDA_ERROR_OUT_OF_MEMORY);
  LOCK();
  if (pool_init(p, poolProps->location.id, 0) != 0) {
    UNLOCK();
    free(p);
    LEAVE(cuMemPoolCreate, CUDA_ERROR_OUT_OF_MEMORY);
  }
  p->max_size = poolProps->maxSize;
  simdev_t *d = &g.dev[p->device];
  p->dev_next = d->pools;
  d->pools = p;
  UNLOCK();
  *pool = p;
  LEAVE(cuMemPoolCreate, CUDA_SUCCESS);
}

SIM_API cuMemPoolDestroy(CUmemoryPool pool) {
  ENTER(cuMemPoolDestroy);
  if (!inited()) LEAVE(cuMemPoolDestroy, CUDA_ERROR_NOT_INITIALIZED);
  LOCK();
  struct CUmemPoolHandle_st *p = pool_lookup(pool);
  CUresult r = CUDA_SUCCESS;
  if (!p || p->is_default) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    simdev_t *d = &g.dev[p->device];
    if (d->curpool == p) d->curpool = &d->defpool; /* the device falls back to its default pool */
    pool_trim_locked(p, 0);
    p->alive = 0; /* blocks still out return their memory as they are freed */
    simmap_del(&g.pools, (uint64_t)(uintptr_t)p);
    struct CUmemPoolHandle_st **pp = &d->pools;
    while (*pp != p) pp = &(*pp)->dev_next;
    *pp = p->dev_next;
    p->dev_next = g.all_pools;
    g.all_pools = p;
  }
  UNLOCK();
  LEAVE(cuMemPoolDestroy, r);
}

SIM_API cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  ENTER(cuMemPoolTrimTo);
  if (!inited()) LEAVE(cuMemPoolTrimTo, CUDA_ERROR_NOT_INITIALIZED);
  if (capture_forbids()) LEAVE(cuMemPoolTrimTo, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  LOCK();
  struct CUmemPoolHandle_st *p = pool_lookup(pool);
  if (p) pool_trim_locked(p, minBytesToKeep);
  UNLOCK();
  LEAVE(cuMemPoolTrimTo, p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

SIM_API cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  ENTER(cuMemPoolSetAttribute);
  if (!inited()) LEAVE(cuMemPoolSetAttribute, CUDA_ERROR_NOT_INITIALIZED);
  if (!value) LEAVE(cuMemPoolSetAttribute, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  struct CUmemPoolHandle_st *p = pool_lookup(pool);
  CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (p) {
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(const int *)value != 0;
      break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(const cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: /* only a reset (to the current value) is allowed */
      if (*(const cuuint64_t *)value != 0) r = CUDA_ERROR_INVALID_VALUE;
      else p->reserved_high = p->reserved;
      break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*(const cuuint64_t *)value != 0) r = CUDA_ERROR_INVALID_VALUE;
      else p->used_high = p->used;
      break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
  }
  UNLOCK();
  LEAVE(cuMemPoolSetAttribute, r);
}

SIM_API cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  ENTER(cuMemPoolGetAttribute);
  if (!inited()) LEAVE(cuMemPoolGetAttribute, CUDA_ERROR_NOT_INITIALIZED);
  if (!value) LEAVE(cuMemPoolGetAttribute, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  struct CUmemPoolHandle_st *p = pool_lookup(pool);
  CUresult r = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (p) {
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *(int *)value = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
  }
  UNLOCK();
  LEAVE(cuMemPoolGetAttribute, r);
}

SIM_API cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  ENTER(cuDeviceGetDefaultMemPool);
  if (!inited()) LEAVE(cuDeviceGetDefaultMemPool, CUDA_ERROR_NOT_INITIALIZED);
  if (!pool_out) LEAVE(cuDeviceGetDefaultMemPool, CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(dev)) LEAVE(cuDeviceGetDefaultMemPool, CUDA_ERROR_INVALID_DEVICE);
  *pool_out = &g.dev[dev].defpool;
  LEAVE(cuDeviceGetDefaultMemPool, CUDA_SUCCESS);
}

SIM_API cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
  ENTER(cuDeviceGetMemPool);
  if (!inited()) LEAVE(cuDeviceGetMemPool, CUDA_ERROR_NOT_INITIALIZED);
  if (!pool) LEAVE(cuDeviceGetMemPool, CUDA_ERROR_INVALID_VALUE);
  if (!dev_ok(dev)) LEAVE(cuDeviceGetMemPool, CUDA_ERROR_INVALID_DEVICE);
  LOCK();
  *pool = g.dev[dev].curpool;
  UNLOCK();
  LEAVE(cuDeviceGetMemPool, CUDA_SUCCESS);
}

SIM_API cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  ENTER(cuDeviceSetMemPool);
  if (!inited()) LEAVE(cuDeviceSetMemPool, CUDA_ERROR_NOT_INITIALIZED);
  if (!dev_ok(dev)) LEAVE(cuDeviceSetMemPool, CUDA_ERROR_INVALID_DEVICE);
  LOCK();
  struct CUmemPoolHandle_st *p = pool_lookup(pool);
  CUresult r = (!p || p->device != dev) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) g.dev[dev].curpool = p;
  UNLOCK();
  LEAVE(cuDeviceSetMemPool, r);
}

/* CUDA 13's pools by location and allocation type. cuMemSetMemPool on a device's pinned memory is
 * cuDeviceSetMemPool: cuMemAllocAsync on that device then uses the pool. The simulator's pools are all device
 * pools of pinned memory: host locations and managed pools answer CUDA_ERROR_NOT_SUPPORTED. */
static CUresult pool_location(const CUmemLocation *loc, CUmemAllocationType type, int *dev) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!loc || (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED))
    return CUDA_ERROR_INVALID_VALUE;
  if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (!dev_ok(loc->id)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = loc->id;
  return CUDA_SUCCESS;
}

SIM_API cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type) {
  ENTER(cuMemGetDefaultMemPool);
  int dev = 0;
  CUresult r = pool_location(location, type, &dev);
  if (r == CUDA_SUCCESS && !pool_out) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *pool_out = &g.dev[dev].defpool;
  LEAVE(cuMemGetDefaultMemPool, r);
}

SIM_API cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type) {
  ENTER(cuMemGetMemPool);
  int dev = 0;
  CUresult r = pool_location(location, type, &dev);
  if (r == CUDA_SUCCESS && !pool) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    LOCK();
    *pool = g.dev[dev].curpool;
    UNLOCK();
  }
  LEAVE(cuMemGetMemPool, r);
}

SIM_API cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool) {
  ENTER(cuMemSetMemPool);
  int dev = 0;
  CUresult r = pool_location(location, type, &dev);
  if (r == CUDA_SUCCESS) {
    LOCK();
    struct CUmemPoolHandle_st *p = pool_lookup(pool);
    if (!p || p->device != dev) r = CUDA_ERROR_INVALID_VALUE;
    else g.dev[dev].curpool = p;
    UNLOCK();
  }
  LEAVE(cuMemSetMemPool, r);
}

/* ---- virtual memory management */

static CUresult check_alloc_prop(const CUmemAllocationProp *prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

SIM_API cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                      CUmemAllocationGranularity_flags option) {
  ENTER(cuMemGetAllocationGranularity);
  if (!inited()) LEAVE(cuMemGetAllocationGranularity, CUDA_ERROR_NOT_INITIALIZED);
  if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    LEAVE(cuMemGetAllocationGranularity, CUDA_ERROR_INVALID_VALUE);
  CUresult r = check_alloc_prop(prop);
  if (r == CUDA_SUCCESS) *granularity = (size_t)SIM_GRAN;
  LEAVE(cuMemGetAllocationGranularity, r);
}

SIM_API cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags) {
  ENTER(cuMemCreate);
  if (!inited()) LEAVE(cuMemCreate, CUDA_ERROR_NOT_INITIALIZED);
  if (!handle || size == 0 || size % SIM_GRAN || flags != 0) LEAVE(cuMemCreate, CUDA_ERROR_INVALID_VALUE);
  CUresult r = check_alloc_prop(prop);
  if (r != CUDA_SUCCESS) LEAVE(cuMemCreate, r);
  vmm_handle_t *h = calloc(1, sizeof *h);
  if (!h) LEAVE(cuMemCreate, CUDA_ERROR_OUT_OF_MEMORY);
  LOCK();
  simdev_t *d = &g.dev[prop->location.id];
  if (cap_take(d, size) != 0) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
  } else {
    /* Opaque but reproducible: the same call sequence gives the same handles. Like the real driver, the value
     * of a handle whose memory is gone is handed out again, the most recently freed first. */
    int reuse = g.vmm_nfreed > 0;
    h->handle = reuse ? g.vmm_freed[g.vmm_nfreed - 1]
                      : 0x5e00000000000000ULL | ((g.vmm_seq + 1) << 8) | (uint64_t)prop->location.id;
    h->size = size;
    h->device = prop->location.id;
    if (simmap_put(&g.vmm, h->handle, h) != 0) {
      cap_give(d, size);
      r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      if (reuse) g.vmm_nfreed--;
      else g.vmm_seq++;
      d->vmm_handles++;
      d->vmm_phys += size;
      *handle = h->handle;
    }
  }
  UNLOCK();
  if (r != CUDA_SUCCESS) free(h);
  LEAVE(cuMemCreate, r);
}

static void vmm_handle_drop_locked(vmm_handle_t *h) {
  simdev_t *d = &g.dev[h->device];
  d->vmm_handles--;
  d->vmm_phys -= h->size;
  cap_give(d, h->size);
  simmap_del(&g.vmm, h->handle);
  if (g.vmm_nfreed == g.vmm_capfreed) {
    size_t nc = g.vmm_capfreed ? 2 * g.vmm_capfreed : 64;
    uint64_t *nv = realloc(g.vmm_freed, nc * sizeof *nv);
    if (nv) g.vmm_freed = nv, g.vmm_capfreed = nc;
  }
  if (g.vmm_nfreed < g.vmm_capfreed) g.vmm_freed[g.vmm_nfreed++] = h->handle; /* else: never reused */
  free(h);
}

SIM_API cuMemRelease(CUmemGenericAllocationHandle handle) {
  ENTER(cuMemRelease);
  if (!inited()) LEAVE(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
  LOCK();
  vmm_handle_t *h = handle ? simmap_get(&g.vmm, handle) : NULL;
  CUresult r = (!h || h->released) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    h->released = 1;
    if (h->nmaps == 0) vmm_handle_drop_locked(h); /* otherwise the mappings keep the memory alive */
  }
  UNLOCK();
  LEAVE(cuMemRelease, r);
}

/* Properties of a handle the program still holds (not released); the driver's way to ask whether a handle is
 * valid. */
SIM_API cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
  ENTER(cuMemGetAllocationPropertiesFromHandle);
  if (!inited()) LEAVE(cuMemGetAllocationPropertiesFromHandle, CUDA_ERROR_NOT_INITIALIZED);
  if (!prop) LEAVE(cuMemGetAllocationPropertiesFromHandle, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  vmm_handle_t *h = handle ? simmap_get(&g.vmm, handle) : NULL;
  CUresult r = (!h || h->released) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = h->device;
  }
  UNLOCK();
  LEAVE(cuMemGetAllocationPropertiesFromHandle, r);
}

SIM_API cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                            unsigned long long flags) {
  ENTER(cuMemAddressReserve);
  if (!inited()) LEAVE(cuMemAddressReserve, CUDA_ERROR_NOT_INITIALIZED);
  if (!ptr || size == 0 || size % SIM_GRAN || flags != 0 || (alignment & (alignment - 1)))
    LEAVE(cuMemAddressReserve, CUDA_ERROR_INVALID_VALUE);
  uint64_t align = alignment < SIM_GRAN ? SIM_GRAN : alignment;
  va_res_t *res = calloc(1, sizeof *res);
  if (!res) LEAVE(cuMemAddressReserve, CUDA_ERROR_OUT_OF_MEMORY);
  LOCK();
  uint64_t va = 0;
  /* The fixed address is a hint, honoured when that range is free. */
  if (addr && addr % align == 0 && simext_alloc_at(&g.va_ext, addr, size) == 0) va = addr;
  if (!va) va = simext_alloc(&g.va_ext, size, align);
  if (va) {
    res->va = va;
    res->size = size;
    res->next = g.res;
    g.res = res;
    g.va_reserved += size;
    *ptr = (CUdeviceptr)va;
  }
  UNLOCK();
  if (!va) free(res);
  LEAVE(cuMemAddressReserve, va ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

SIM_API cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ENTER(cuMemAddressFree);
  if (!inited()) LEAVE(cuMemAddressFree, CUDA_ERROR_NOT_INITIALIZED);
  LOCK();
  va_res_t **rp = &g.res;
  while (*rp && (*rp)->va != (uint64_t)ptr) rp = &(*rp)->next;
  va_res_t *res = *rp;
  CUresult r = (!res || res->size != size || res->maps) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    *rp = res->next;
    g.va_reserved -= size;
    simext_free(&g.va_ext, res->va, res->size);
    free(res);
  }
  UNLOCK();
  LEAVE(cuMemAddressFree, r);
}

SIM_API cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                 unsigned long long flags) {
  ENTER(cuMemMap);
  if (!inited()) LEAVE(cuMemMap, CUDA_ERROR_NOT_INITIALIZED);
  uint64_t va = (uint64_t)ptr;
  if (!va || size == 0 || size % SIM_GRAN || va % SIM_GRAN || offset != 0 || flags != 0)
    LEAVE(cuMemMap, CUDA_ERROR_INVALID_VALUE);
  vmm_map_t *m = calloc(1, sizeof *m);
  if (!m) LEAVE(cuMemMap, CUDA_ERROR_OUT_OF_MEMORY);
  LOCK();
  CUresult r = CUDA_SUCCESS;
  vmm_handle_t *h = handle ? simmap_get(&g.vmm, handle) : NULL;
  va_res_t *res = res_at(va);
  if (!h || h->released || size > h->size || !res || va + size > res->va + res->size) r = CUDA_ERROR_INVALID_VALUE;
  vmm_map_t **mp = res ? &res->maps : NULL;
  if (r == CUDA_SUCCESS) {
    while (*mp && (*mp)->va + (*mp)->size <= va) mp = &(*mp)->next;
    if (*mp && (*mp)->va < va + size) r = CUDA_ERROR_INVALID_VALUE; /* overlaps a live mapping */
  }
  if (r == CUDA_SUCCESS) {
    m->va = va;
    m->size = size;
    m->h = h;
    m->prot = CU_MEM_ACCESS_FLAGS_PROT_NONE; /* inaccessible until cuMemSetAccess, as on the device */
    m->next = *mp;
    *mp = m;
    h->nmaps++;
    g.dev[h->device].vmm_mappings++;
    g.dev[h->device].vmm_mapped += size;
  }
  UNLOCK();
  if (r != CUDA_SUCCESS) free(m);
  LEAVE(cuMemMap, r);
}

SIM_API cuMemUnmap(CUdeviceptr ptr, size_t size) {
  ENTER(cuMemUnmap);
  if (!inited()) LEAVE(cuMemUnmap, CUDA_ERROR_NOT_INITIALIZED);
  uint64_t va = (uint64_t)ptr, end = va + size;
  if (!va || size == 0 || end < va) LEAVE(cuMemUnmap, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  CUresult r = CUDA_SUCCESS;
  va_res_t *res = res_at(va);
  vmm_map_t **mp = res ? &res->maps : NULL;
  if (!res) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    while (*mp && (*mp)->va < va) mp = &(*mp)->next;
    /* The range must consist of whole, adjacent mappings. */
    uint64_t at = va;
    vmm_map_t *m = *mp;
    while (m && m->va == at && at < end) {
      at += m->size;
      m = m->next;
    }
    if (at != end) r = CUDA_ERROR_INVALID_VALUE;
  }
  if (r == CUDA_SUCCESS) {
    while (*mp && (*mp)->va < end) {
      vmm_map_t *m = *mp;
      *mp = m->next;
      madvise((void *)(uintptr_t)m->va, m->size, MADV_DONTNEED);
      mprotect((void *)(uintptr_t)m->va, m->size, PROT_NONE);
      vmm_handle_t *h = m->h;
      g.dev[h->device].vmm_mappings--;
      g.dev[h->device].vmm_mapped -= m->size;
      if (--h->nmaps == 0 && h->released) vmm_handle_drop_locked(h);
      free(m);
    }
  }
  UNLOCK();
  LEAVE(cuMemUnmap, r);
}

SIM_API cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  ENTER(cuMemSetAccess);
  if (!inited()) LEAVE(cuMemSetAccess, CUDA_ERROR_NOT_INITIALIZED);
  uint64_t va = (uint64_t)ptr;
  if (!va || size == 0 || !desc || count == 0) LEAVE(cuMemSetAccess, CUDA_ERROR_INVALID_VALUE);
  int prot = 0;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) LEAVE(cuMemSetAccess, CUDA_ERROR_INVALID_VALUE);
    if (!dev_ok(desc[i].location.id)) LEAVE(cuMemSetAccess, CUDA_ERROR_INVALID_DEVICE);
    int f = (int)desc[i].flags;
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      LEAVE(cuMemSetAccess, CUDA_ERROR_INVALID_VALUE);
    prot |= f; /* one CPU view stands for every device: grant the widest access asked for */
  }
  LOCK();
  CUresult r = vmm_range_ok(va, size, CU_MEM_ACCESS_FLAGS_PROT_NONE, NULL, NULL) ? CUDA_SUCCESS
                                                                                 : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    int mp = prot == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
             : prot == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                        : PROT_NONE;
    if (mprotect((void *)(uintptr_t)va, size, mp) != 0) r = CUDA_ERROR_INVALID_VALUE;
    for (vmm_map_t *m = res_at(va)->maps; r == CUDA_SUCCESS && m; m = m->next)
      if (m->va < va + size && va < m->va + m->size) m->prot = prot; /* access is tracked per mapping */
  }
  UNLOCK();
  LEAVE(cuMemSetAccess, r);
}

/* ---- error strings */

SIM_API cuGetErrorName(CUresult error, const char **pStr) {
  ENTER(cuGetErrorName);
  if (!pStr) LEAVE(cuGetErrorName, CUDA_ERROR_INVALID_VALUE);
  const char *s = err_name(error);
  *pStr = s; /* NULL for an unknown code, as the real driver does */
  LEAVE(cuGetErrorName, s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

SIM_API cuGetErrorString(CUresult error, const char **pStr) {
  ENTER(cuGetErrorString);
  if (!pStr) LEAVE(cuGetErrorString, CUDA_ERROR_INVALID_VALUE);
  const char *s = err_text(error);
  *pStr = s;
  LEAVE(cuGetErrorString, s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

/* ---- kernels: a CUfunction of the simulator is a host function void fn(void **kernelParams), run to completion
 * on the calling thread (streams are synchronous here). It may read and write device memory directly. CUDA 13's
 * runtime loads its kernels with cuLibraryLoadData and launches the CUkernel cuLibraryGetKernel gives
 * (simcuda.h: the image is a simcuda_image_t); a CUkernel is accepted wherever a CUfunction is, as by the
 * driver. Libraries and their kernels are context-independent; a kernel lives until its library is unloaded. */

typedef void (*sim_kernel_t)(void **params);

#define SIM_KERNEL_MAGIC 0x53494d4b45524e31ULL /* "SIMKERN1" */
struct CUkern_st {
  uint64_t magic;
  sim_kernel_t fn;
  struct CUlib_st *lib;
  char name[128];
};
struct CUlib_st {
  unsigned count;
  struct CUkern_st *kernels;
};
static simmap_t g_libs, g_kernels; /* live handles, under the lock */

static CUresult impl_loading_mode(CUmoduleLoadingMode *mode) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  const char *m = getenv("CUDA_MODULE_LOADING");
  *mode = m && strcmp(m, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}

SIM_API cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
  ENTER(cuModuleGetLoadingMode);
  LEAVE(cuModuleGetLoadingMode, impl_loading_mode(mode));
}

static CUresult impl_library_load(CUlibrary *out, const void *code) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  const simcuda_image_t *img = code;
  if (!out || !img) return CUDA_ERROR_INVALID_VALUE;
  if (img->magic != SIMCUDA_IMAGE_MAGIC || !img->count || !img->kernels) return CUDA_ERROR_INVALID_IMAGE;
  struct CUlib_st *l = calloc(1, sizeof *l);
  struct CUkern_st *k = l ? calloc(img->count, sizeof *k) : NULL;
  if (!k) {
    free(l);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  l->count = img->count;
  l->kernels = k;
  for (unsigned i = 0; i < img->count; i++) {
    if (!img->kernels[i].fn || !img->kernels[i].name) {
      free(k);
      free(l);
      return CUDA_ERROR_INVALID_IMAGE;
    }
    k[i].magic = SIM_KERNEL_MAGIC;
    k[i].fn = img->kernels[i].fn;
    k[i].lib = l;
    snprintf(k[i].name, sizeof k[i].name, "%s", img->kernels[i].name);
  }
  CUresult r = CUDA_SUCCESS;
  LOCK();
  if (simmap_put(&g_libs, (uint64_t)(uintptr_t)l, l) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
  for (unsigned i = 0; r == CUDA_SUCCESS && i < l->count; i++)
    if (simmap_put(&g_kernels, (uint64_t)(uintptr_t)&k[i], &k[i]) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (r != CUDA_SUCCESS) {
    simmap_del(&g_libs, (uint64_t)(uintptr_t)l);
    for (unsigned i = 0; i < l->count; i++) simmap_del(&g_kernels, (uint64_t)(uintptr_t)&k[i]);
  }
  UNLOCK();
  if (r != CUDA_SUCCESS) {
    free(k);
    free(l);
    return r;
  }
  *out = l;
  return CUDA_SUCCESS;
}

SIM_API cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                          unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,
                          unsigned int numLibraryOptions) {
  ENTER(cuLibraryLoadData);
  (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions, (void)libraryOptions, (void)libraryOptionValues;
  (void)numLibraryOptions;
  LEAVE(cuLibraryLoadData, impl_library_load(library, code));
}

static CUresult impl_library_unload(CUlibrary lib) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  LOCK();
  struct CUlib_st *l = simmap_del(&g_libs, (uint64_t)(uintptr_t)lib);
  if (l)
    for (unsigned i = 0; i < l->count; i++) simmap_del(&g_kernels, (uint64_t)(uintptr_t)&l->kernels[i]);
  UNLOCK();
  if (!l) return CUDA_ERROR_INVALID_HANDLE;
  free(l->kernels);
  free(l);
  return CUDA_SUCCESS;
}

SIM_API cuLibraryUnload(CUlibrary library) {
  ENTER(cuLibraryUnload);
  LEAVE(cuLibraryUnload, impl_library_unload(library));
}

static CUresult impl_library_get_kernel(CUkernel *out, CUlibrary lib, const char *name) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_ERROR_INVALID_HANDLE;
  LOCK();
  struct CUlib_st *l = simmap_get(&g_libs, (uint64_t)(uintptr_t)lib);
  if (l) {
    r = CUDA_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < l->count; i++)
      if (strcmp(l->kernels[i].name, name) == 0) {
        *out = (CUkernel)&l->kernels[i];
        r = CUDA_SUCCESS;
        break;
      }
  }
  UNLOCK();
  return r;
}

SIM_API cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
  ENTER(cuLibraryGetKernel);
  LEAVE(cuLibraryGetKernel, impl_library_get_kernel(pKernel, library, name));
}

static CUresult impl_kernel_get_function(CUfunction *out, CUkernel k) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = cur_ctx(&c);
  if (r == CUDA_SUCCESS && !simmap_get(&g_kernels, (uint64_t)(uintptr_t)k)) r = CUDA_ERROR_INVALID_HANDLE;
  UNLOCK();
  if (r == CUDA_SUCCESS) *out = (CUfunction)k; /* the same handle: one function for every context */
  return r;
}

SIM_API cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
  ENTER(cuKernelGetFunction);
  LEAVE(cuKernelGetFunction, impl_kernel_get_function(pFunc, kernel));
}

static CUresult impl_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, CUstream h, void **params, void **extra) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || extra) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = special_stream(h) ? cur_ctx(&c) : stream_ctx_locked(h, &c);
  struct CUkern_st *k = simmap_get(&g_kernels, (uint64_t)(uintptr_t)f); /* a CUkernel, or a host function */
  sim_kernel_t fn = k ? k->fn : (sim_kernel_t)(void *)f;
  UNLOCK();
  if (r == CUDA_SUCCESS) fn(params);
  return r;
}

/* ---- IPC: a handle names a live device block of this process (its pid and address). Opening one needs another
 * process's memory, which the simulator does not share between processes: it refuses, as the driver refuses a
 * process opening its own handle. */

#define SIM_IPC_MAGIC 0x53494d4950433031ULL /* "SIMIPC01" */

SIM_API cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  ENTER(cuIpcGetMemHandle);
  if (!inited()) LEAVE(cuIpcGetMemHandle, CUDA_ERROR_NOT_INITIALIZED);
  if (!pHandle) LEAVE(cuIpcGetMemHandle, CUDA_ERROR_INVALID_VALUE);
  LOCK();
  blk_t *b = chunk_at((uint64_t)dptr);
  CUresult r = b && b->state == ST_LIVE && b->addr == (uint64_t)dptr && (b->kind == SIMCUDA_DEVICE || b->kind == SIMCUDA_PITCH)
                   ? CUDA_SUCCESS
                   : CUDA_ERROR_INVALID_VALUE;
  UNLOCK();
  if (r == CUDA_SUCCESS) {
    uint64_t w[3] = {SIM_IPC_MAGIC, (uint64_t)getpid(), (uint64_t)dptr};
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, w, sizeof w);
  }
  LEAVE(cuIpcGetMemHandle, r);
}

static CUresult impl_ipc_open(CUdeviceptr *pdptr, CUipcMemHandle h) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  uint64_t w[3];
  memcpy(w, h.reserved, sizeof w);
  if (!pdptr || w[0] != SIM_IPC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
  return w[1] == (uint64_t)getpid() ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_SUPPORTED;
}

SIM_API cuIpcCloseMemHandle(CUdeviceptr dptr) {
  ENTER(cuIpcCloseMemHandle);
  (void)dptr;
  LEAVE(cuIpcCloseMemHandle, inited() ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED); /* none open */
}

/* ---- stream capture: a stream records its work into a graph between BeginCapture and EndCapture. Simulated on
 * created streams (the default streams answer CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as the legacy one does on a
 * real driver; its per-thread default stream can capture there). Work enqueued meanwhile is not checked; the
 * graph is an empty placeholder for cuGraphDestroy. A checkpoint is refused while a stream captures. */

static CUresult impl_capture(CUstream h, int begin, int mode, CUgraph *out) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!begin && !out) return CUDA_ERROR_INVALID_VALUE;
  if (begin && mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  struct CUstream_st *s = r == CUDA_SUCCESS && !special_stream(h) ? simmap_get(&g.streams, (uint64_t)(uintptr_t)h) : NULL;
  if (r == CUDA_SUCCESS && !s) r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  else if (r == CUDA_SUCCESS && begin && s->capturing) r = CUDA_ERROR_ILLEGAL_STATE;
  else if (r == CUDA_SUCCESS && !begin && !s->capturing) r = CUDA_ERROR_ILLEGAL_STATE;
  else if (r == CUDA_SUCCESS && begin && atomic_load_explicit(&g_ncap_streams, memory_order_relaxed) == SIM_CAP_MAX)
    r = CUDA_ERROR_OUT_OF_MEMORY;
  int invalid = 0;
  if (r == CUDA_SUCCESS) {
    s->capturing = begin;
    g_capturing += begin ? 1 : -1;
    if (begin) {
      s->cap_mode = mode;
      s->cap_invalid = 0;
      s->cap_thread = pthread_self();
      int n = atomic_load_explicit(&g_ncap_streams, memory_order_relaxed);
      g_cap_streams[n] = s;
      atomic_store_explicit(&g_ncap_streams, n + 1, memory_order_relaxed);
    } else {
      invalid = s->cap_invalid;
      cap_drop_locked(s);
    }
  }
  UNLOCK();
  if (invalid) { /* the capture ended, with no graph */
    *out = NULL;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  if (r == CUDA_SUCCESS && !begin) {
    *out = malloc(16); /* a placeholder graph */
    if (!*out) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}

static CUresult impl_is_capturing(CUstream h, CUstreamCaptureStatus *st) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!st) return CUDA_ERROR_INVALID_VALUE;
  LOCK();
  struct CUctx_st *c;
  CUresult r = stream_ctx_locked(h, &c);
  struct CUstream_st *s = r == CUDA_SUCCESS && !special_stream(h) ? simmap_get(&g.streams, (uint64_t)(uintptr_t)h) : NULL;
  if (r == CUDA_SUCCESS) *st = s && s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  UNLOCK();
  return r;
}

SIM_API cuGraphDestroy(CUgraph graph) {
  ENTER(cuGraphDestroy);
  if (!graph) LEAVE(cuGraphDestroy, CUDA_ERROR_INVALID_VALUE);
  free(graph);
  LEAVE(cuGraphDestroy, CUDA_SUCCESS);
}

/* ---- entry points written once for several ABI variants. The driver exports a function per ABI (cuCtxDestroy
 * and cuCtxDestroy_v2, cuMemcpyHtoD_v2 and cuMemcpyHtoD_v2_ptds ...) and where the simulator does the same work
 * for each, the wrappers are generated from these lists instead of written out twice. Each generated function is
 * still its own exported symbol, declared and checked against cuda.h's prototype, counted and injectable under
 * its own name (ENTER/LEAVE), exactly as a written one; only its source is shared. All return CUresult, as every
 * driver entry point does. Variants that do different work (cuMemGetInfo's 32-bit saturation, cuCtxCreate_v3's
 * check of its affinity array, cuGetProcAddress_v2's status ...) stay written out above, next to their
 * implementation. */

/* SIM_SAME_ABI: X(name, variant, impl, (params), (args)) defines name and variant, both with these parameters and
 * both returning impl args. */
#define SIM_SAME_ABI(X)                                                                                       \
  /* cuDeviceGetUuid_v2 is declared by CUDA 12's headers only; MIG instances aside (none here), the same call */ \
  X(cuDeviceGetUuid, cuDeviceGetUuid_v2, impl_device_uuid, (CUuuid * uuid, CUdevice dev), (uuid, dev))         \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, impl_primary_release, (CUdevice dev), (dev))     \
  X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, impl_primary_reset, (CUdevice dev), (dev))           \
  X(cuCtxCreate, cuCtxCreate_v2, impl_ctx_create, (CUcontext * pctx, unsigned int flags, CUdevice dev),       \
    (pctx, flags, dev))                                                                                       \
  X(cuCtxDestroy, cuCtxDestroy_v2, impl_ctx_destroy, (CUcontext ctx), (ctx))                                  \
  X(cuCtxPushCurrent, cuCtxPushCurrent_v2, impl_ctx_push, (CUcontext ctx), (ctx))                             \
  X(cuCtxPopCurrent, cuCtxPopCurrent_v2, impl_ctx_pop, (CUcontext * pctx), (pctx))                            \
  X(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, impl_copy, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount), \
    (CP_HTOD, dstDevice, (uint64_t)(uintptr_t)srcHost, ByteCount))                                            \
  X(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, impl_copy, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount), \
    (CP_DTOH, (uint64_t)(uintptr_t)dstHost, srcDevice, ByteCount))                                            \
  X(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, impl_copy,                                                         \
    (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount), (CP_DTOD, dstDevice, srcDevice, ByteCount)) \
  X(cuMemsetD8_v2, cuMemsetD8_v2_ptds, impl_memset, (CUdeviceptr dstDevice, unsigned char uc, size_t N),      \
    (dstDevice, uc, N))                                                                                       \
  X(cuStreamDestroy, cuStreamDestroy_v2, impl_stream_destroy, (CUstream hStream), (hStream))                  \
  X(cuStreamGetCtx, cuStreamGetCtx_ptsz, impl_stream_get_ctx, (CUstream hStream, CUcontext * pctx), (hStream, pctx)) \
  X(cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz, impl_stream_get_ctx_v2,                                        \
    (CUstream hStream, CUcontext * pCtx, CUgreenCtx * pGreenCtx), (hStream, pCtx, pGreenCtx))                 \
  X(cuLaunchKernel, cuLaunchKernel_ptsz, impl_launch,                                                         \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,           \
     void **kernelParams, void **extra),                                                                      \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams, extra))         \
  X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, impl_ipc_open,                                                 \
    (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags), (pdptr, handle))                        \
  X(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz, impl_capture, (CUstream h, CUstreamCaptureMode mode), \
    (h, 1, (int)mode, NULL))                                                                                  \
  X(cuStreamEndCapture, cuStreamEndCapture_ptsz, impl_capture, (CUstream h, CUgraph * graph), (h, 0, 0, graph)) \
  X(cuStreamIsCapturing, cuStreamIsCapturing_ptsz, impl_is_capturing, (CUstream h, CUstreamCaptureStatus * st), \
    (h, st))

/* One exported entry point returning `call`; declared first, for the few cuda.h leaves undeclared (the _ptsz
 * capture calls, cuDeviceGetUuid_v2) and so that each one is checked against a prototype. */
#define SIM_WRAPPER(name, params, call)                                                                       \
  SIM_API name params;                                                                                        \
  SIM_API name params {                                                                                       \
    ENTER(name);                                                                                              \
    LEAVE(name, call);                                                                                        \
  }
#define SIM_DEF_SAME_ABI(name, variant, impl, params, args)                                                   \
  SIM_WRAPPER(name, params, impl args)                                                                        \
  SIM_WRAPPER(variant, params, impl args)
SIM_SAME_ABI(SIM_DEF_SAME_ABI)
#undef SIM_DEF_SAME_ABI

/* cuStreamBeginCapture before CUDA 10.1 took no mode: its capture is a global-mode one. */
SIM_WRAPPER(cuStreamBeginCapture, (CUstream h), impl_capture(h, 1, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL))
SIM_WRAPPER(cuStreamBeginCapture_ptsz, (CUstream h), impl_capture(h, 1, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL))

/* cuGLCtxCreate and cuVDPAUCtxCreate (cudaGL.h, cudaVDPAU.h; deprecated, asked for by the CUDA 13 runtime): a
 * context made and pushed current as cuCtxCreate does; the simulator has no graphics to bind it to, and takes
 * the VDPAU device and its procedure lookup without looking at them. */
SIM_WRAPPER(cuGLCtxCreate, (CUcontext * pCtx, unsigned int Flags, CUdevice device),
            impl_ctx_create(pCtx, Flags, device))
SIM_WRAPPER(cuGLCtxCreate_v2, (CUcontext * pCtx, unsigned int Flags, CUdevice device),
            impl_ctx_create(pCtx, Flags, device))
SIM_WRAPPER(cuVDPAUCtxCreate,
            (CUcontext * pCtx, unsigned int flags, CUdevice device, uint32_t vdpDevice, void *vdpGetProcAddress),
            ((void)vdpDevice, (void)vdpGetProcAddress, impl_ctx_create(pCtx, flags, device)))
SIM_WRAPPER(cuVDPAUCtxCreate_v2,
            (CUcontext * pCtx, unsigned int flags, CUdevice device, uint32_t vdpDevice, void *vdpGetProcAddress),
            ((void)vdpDevice, (void)vdpGetProcAddress, impl_ctx_create(pCtx, flags, device)))

/* SIM_PER_THREAD: X(name, impl, (params), (args)) defines name, returning impl(args..., 0), and name_ptsz, returning
 * impl(args..., 1): the last argument of impl says whether stream 0 is the per-thread default stream. */
#define SIM_PER_THREAD(X)                                                                                     \
  X(cuStreamSynchronize, impl_stream_sync, (CUstream hStream), (hStream))                                     \
  X(cuMemAllocAsync, impl_alloc_async, (CUdeviceptr * dptr, size_t bytesize, CUstream hStream),               \
    (dptr, bytesize, NULL, 0, hStream))                                                                       \
  X(cuMemAllocFromPoolAsync, impl_alloc_async,                                                                \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, 1, hStream)) \
  X(cuMemFreeAsync, impl_free_async, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream))

#define SIM_LEGACY_STREAM(...) (__VA_ARGS__, 0)
#define SIM_PER_THREAD_STREAM(...) (__VA_ARGS__, 1)
#define SIM_DEF_PER_THREAD(name, impl, params, args)                                                          \
  SIM_WRAPPER(name, params, impl SIM_LEGACY_STREAM args)                                                      \
  SIM_WRAPPER(name##_ptsz, params, impl SIM_PER_THREAD_STREAM args)
SIM_PER_THREAD(SIM_DEF_PER_THREAD)
#undef SIM_DEF_PER_THREAD

/* SIM_ABI_32: X(name, (params)) defines the 32-bit ABI (CUdeviceptr_v1, unsigned int sizes) of a call whose _v2 is
 * written above: those cannot carry the 64-bit addresses the simulator hands out, so each answers
 * CUDA_ERROR_NOT_SUPPORTED once the driver is initialised. */
#define SIM_ABI_32(X)                                                                                         \
  X(cuMemAlloc, (CUdeviceptr_v1 * dptr, unsigned int bytesize))                                              \
  X(cuMemAllocPitch, (CUdeviceptr_v1 * dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, \
                      unsigned int ElementSizeBytes))                                                         \
  X(cuMemFree, (CUdeviceptr_v1 dptr))                                                                         \
  X(cuMemGetAddressRange, (CUdeviceptr_v1 * pbase, unsigned int *psize, CUdeviceptr_v1 dptr))                 \
  X(cuMemcpyHtoD, (CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount))                    \
  X(cuMemcpyDtoH, (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount))                          \
  X(cuMemcpyDtoD, (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount))               \
  X(cuMemsetD8, (CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N))

#define SIM_DEF_ABI_32(name, params)                                                                          \
  SIM_WRAPPER(name, params, inited() ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED)
SIM_ABI_32(SIM_DEF_ABI_32)
#undef SIM_DEF_ABI_32

/* ---- checkpoint (cuCheckpointProcess*): the simulator checkpoints its own process only (pid == getpid()).
 * Lock: RUNNING -> LOCKED once every other thread is out of the driver (CUDA_ERROR_NOT_READY, and RUNNING
 * again, when timeoutMs passes first). Checkpoint: LOCKED -> CHECKPOINTED; device contents (live chunks,
 * pool chunks, mapped VMM ranges) are copied to host memory, their pages given back, the device's capacity
 * freed, and the arenas made inaccessible. Restore: CHECKPOINTED -> LOCKED, only when every device has room for
 * what it held (else CUDA_ERROR_OUT_OF_MEMORY and nothing changes); contents come back at the same addresses.
 * Unlock: LOCKED -> RUNNING, waking every waiting call. */

typedef struct ck_saved {
  uint64_t addr, len;
  int prot; /* VMM ranges: the mprotect protection to give back; -1 for arena chunks */
  void *buf;
  struct ck_saved *next;
} ck_saved_t;
static ck_saved_t *g_ck_saved; /* guarded by g.lock */

static int ck_args_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

static CUresult ck_pid(int pid) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pid != (int)getpid()) return CUDA_ERROR_NOT_SUPPORTED; /* the simulator knows only its own process */
  return CUDA_SUCCESS;
}

static int ck_others_in_call(void) {
  for (sim_counts_t *c = atomic_load_explicit(&g_counts, memory_order_acquire); c; c = c->next)
    if (c != t_counts && atomic_load(&c->in_call) > 0) return 1;
  return 0;
}

static void ck_set_state(int st, int owner) {
  pthread_mutex_lock(&g_ck_mu);
  atomic_store(&g_ck_owner, owner);
  atomic_store(&g_ck_state, st);
  pthread_cond_broadcast(&g_ck_cv);
  pthread_mutex_unlock(&g_ck_mu);
}

static CUresult impl_ck_lock(int pid, CUcheckpointLockArgs *a) {
  CUresult r = ck_pid(pid);
  if (r != CUDA_SUCCESS) return r;
  if (a && (a->reserved0 || !ck_args_zero(a->reserved1, sizeof a->reserved1))) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&g_ck_mu);
  if (atomic_load(&g_ck_state) != CU_PROCESS_STATE_RUNNING) {
    pthread_mutex_unlock(&g_ck_mu);
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  atomic_store(&g_ck_owner, self_tid());
  atomic_store(&g_ck_state, CU_PROCESS_STATE_LOCKED);
  pthread_mutex_unlock(&g_ck_mu);
  unsigned ms = a ? a->timeoutMs : 0;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (ck_others_in_call()) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t el = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    if (ms && el >= (int64_t)ms) {
      ck_set_state(CU_PROCESS_STATE_RUNNING, 0);
      return CUDA_ERROR_NOT_READY;
    }
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
  return CUDA_SUCCESS;
}

/* Host copies are mapped populated (one call instead of a page fault per page: faults dominate a copy of
 * gigabytes, on a VM most of all). */
static void *ck_buf(uint64_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static int ck_save(uint64_t addr, uint64_t len, int prot) {
  ck_saved_t *s = malloc(sizeof *s);
  void *buf = s ? ck_buf(len) : NULL;
  if (!buf) {
    free(s);
    return -1;
  }
  memcpy(buf, (const void *)(uintptr_t)addr, len);
  *s = (ck_saved_t){addr, len, prot, buf, g_ck_saved};
  g_ck_saved = s;
  return 0;
}

static void ck_drop_saved(int put_back) {
  while (g_ck_saved) {
    ck_saved_t *s = g_ck_saved;
    g_ck_saved = s->next;
    if (put_back) {
      if (s->prot >= 0) mprotect((void *)(uintptr_t)s->addr, s->len, PROT_READ | PROT_WRITE);
#ifdef MADV_POPULATE_WRITE
      madvise((void *)(uintptr_t)s->addr, s->len, MADV_POPULATE_WRITE); /* as above; older kernels: faults */
#endif
      memcpy((void *)(uintptr_t)s->addr, s->buf, s->len);
      if (s->prot >= 0) mprotect((void *)(uintptr_t)s->addr, s->len, s->prot);
    }
    munmap(s->buf, s->len);
    free(s);
  }
}

/* Sleeps what is left of bytes / rate since t0 (CLOCK_MONOTONIC): a checkpoint or restore takes as long as the
 * driver's would. */
static void ck_pace(uint64_t bytes, uint64_t rate, const struct timespec *t0) {
  const char *env = getenv("SIMCUDA_CHECKPOINT_RATE"); /* read at each checkpoint: a test may set it */
  if (env && *env) {
    uint64_t v = simm_parse_bytes(env);
    if (v || strcmp(env, "0") == 0)
      rate = v;
    else
      fprintf(stderr, "simcuda: ignoring SIMCUDA_CHECKPOINT_RATE=%s (bytes per second, or 0)\n", env);
  }
  if (!rate || !bytes) return;
  uint64_t want_ns = (uint64_t)((double)bytes / (double)rate * 1e9);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t spent = (int64_t)(now.tv_sec - t0->tv_sec) * 1000000000 + (now.tv_nsec - t0->tv_nsec);
  if (spent < 0 || (uint64_t)spent >= want_ns) return;
  uint64_t left = want_ns - (uint64_t)spent;
  struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The whole pages of [addr, addr + len): a block's pages that no other block shares. */
static void ck_drop_pages(uint64_t addr, uint64_t len) {
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), lo = (addr + pg - 1) & ~(pg - 1), hi = (addr + len) & ~(pg - 1);
  if (hi > lo) madvise((void *)(uintptr_t)lo, hi - lo, MADV_DONTNEED);
}

static int vmm_mprot(int prot) {
  return prot == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
         : prot == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                    : PROT_NONE;
}

static CUresult impl_ck_checkpoint(int pid, CUcheckpointCheckpointArgs *a) {
  CUresult r = ck_pid(pid);
  if (r != CUDA_SUCCESS) return r;
  if (a && !ck_args_zero(a, sizeof *a)) return CUDA_ERROR_INVALID_VALUE;
  if (atomic_load(&g_ck_state) != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  LOCK();
  if (g_capturing) { /* a graph being captured cannot be checkpointed */
    UNLOCK();
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  /* Each block's device pages go as soon as its copy is made, so that the process holds its memory about once,
   * not twice, while it moves (as a real checkpoint, whose device memory is not host memory): the pages it alone
   * covers. A page it shares with a neighbour (blocks of 512-byte steps share pages) goes with the rest below,
   * once every block is saved: dropping it here zeroed the start of a neighbour not yet saved. */
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int fail = 0;
  for (size_t i = 0; i < g.blocks.cap && !fail; i++) {
    blk_t *b = g.blocks.keys[i] ? g.blocks.vals[i] : NULL;
    if (!b || !is_device_kind(b->kind) || b->state == ST_ARENA_CACHED || !b->dirty) continue;
    fail = ck_save(b->addr, b->rounded, -1) != 0;
    if (!fail) ck_drop_pages(b->addr, b->rounded);
  }
  for (va_res_t *res = g.res; res && !fail; res = res->next)
    for (vmm_map_t *m = res->maps; m && !fail; m = m->next)
      if (m->prot != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
        fail = ck_save(m->va, m->size, vmm_mprot(m->prot)) != 0;
        if (!fail) madvise((void *)(uintptr_t)m->va, m->size, MADV_DONTNEED);
      }
  if (fail) {
    ck_drop_saved(1); /* what moved goes back where it was */
    UNLOCK();
    return CUDA_ERROR_OUT_OF_MEMORY; /* the host has no room: nothing changed, still LOCKED */
  }
  for (ck_saved_t *s = g_ck_saved; s; s = s->next) {
    madvise((void *)(uintptr_t)s->addr, s->len, MADV_DONTNEED);
    if (s->prot >= 0) mprotect((void *)(uintptr_t)s->addr, s->len, PROT_NONE);
  }
  for (int d = 0; d < g.ndev; d++) {
    simdev_t *dv = &g.dev[d];
    dv->ck_bytes = dv->plain_bytes + dv->pool_reserved + dv->vmm_phys;
    if (dv->ck_bytes) cap_give(dv, dv->ck_bytes); /* the GPU's capacity, for every process of the machine */
    mprotect((void *)(uintptr_t)dv->ar.base, dv->ar.size, PROT_NONE);
  }
  uint64_t moved = 0;
  for (int d = 0; d < g.ndev; d++) moved += g.dev[d].ck_bytes;
  atomic_store(&g_ck_state, CU_PROCESS_STATE_CHECKPOINTED);
  UNLOCK();
  ck_pace(moved, CK_RATE_OUT, &t0);
  return CUDA_SUCCESS;
}

static CUresult impl_ck_restore(int pid, CUcheckpointRestoreArgs *a) {
  CUresult r = ck_pid(pid);
  if (r != CUDA_SUCCESS) return r;
  if (a && (a->gpuPairs || a->gpuPairsCount || a->reserved1 || !ck_args_zero(a->reserved, sizeof a->reserved)))
    return CUDA_ERROR_INVALID_VALUE; /* remapping onto other GPUs is not simulated */
  if (atomic_load(&g_ck_state) != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  LOCK();
  uint64_t moved = 0;
  for (int d = 0; d < g.ndev; d++) moved += g.dev[d].ck_bytes;
  for (int d = 0; d < g.ndev; d++) {
    simdev_t *dv = &g.dev[d];
    if (dv->ck_bytes && cap_take(dv, dv->ck_bytes) != 0) { /* the GPU's room, shared with other processes */
      while (d-- > 0)
        if (g.dev[d].ck_bytes) cap_give(&g.dev[d], g.dev[d].ck_bytes);
      UNLOCK();
      return CUDA_ERROR_OUT_OF_MEMORY; /* no room: still CHECKPOINTED, contents intact on the host */
    }
  }
  for (int d = 0; d < g.ndev; d++) {
    simdev_t *dv = &g.dev[d];
    mprotect((void *)(uintptr_t)dv->ar.base, dv->ar.size, PROT_READ | PROT_WRITE);
    dv->ck_bytes = 0;
  }
  ck_drop_saved(1);
  atomic_store(&g_ck_state, CU_PROCESS_STATE_LOCKED);
  UNLOCK();
  ck_pace(moved, CK_RATE_IN, &t0);
  return CUDA_SUCCESS;
}

static CUresult impl_ck_unlock(int pid, CUcheckpointUnlockArgs *a) {
  CUresult r = ck_pid(pid);
  if (r != CUDA_SUCCESS) return r;
  if (a && !ck_args_zero(a, sizeof *a)) return CUDA_ERROR_INVALID_VALUE;
  if (atomic_load(&g_ck_state) != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  ck_set_state(CU_PROCESS_STATE_RUNNING, 0);
  return CUDA_SUCCESS;
}

SIM_API cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
  CK_ENTER(cuCheckpointProcessLock);
  CK_LEAVE(cuCheckpointProcessLock, impl_ck_lock(pid, args));
}
SIM_API cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
  CK_ENTER(cuCheckpointProcessCheckpoint);
  CK_LEAVE(cuCheckpointProcessCheckpoint, impl_ck_checkpoint(pid, args));
}
SIM_API cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
  CK_ENTER(cuCheckpointProcessRestore);
  CK_LEAVE(cuCheckpointProcessRestore, impl_ck_restore(pid, args));
}
SIM_API cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
  CK_ENTER(cuCheckpointProcessUnlock);
  CK_LEAVE(cuCheckpointProcessUnlock, impl_ck_unlock(pid, args));
}
SIM_API cuCheckpointProcessGetState(int pid, CUprocessState *state) {
  CK_ENTER(cuCheckpointProcessGetState);
  CUresult r = ck_pid(pid);
  if (r == CUDA_SUCCESS && !state) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) *state = (CUprocessState)atomic_load(&g_ck_state);
  CK_LEAVE(cuCheckpointProcessGetState, r);
}

/* ---- for the simulated NVML (simnvml.c, libnvidia-ml.so.1): whether this driver holds its process locked
 * (cuCheckpointProcessLock until cuCheckpointProcessUnlock), during which NVIDIA's NVML of the same process blocks
 * (docs/DRIVER.md). The simulated NVML asks the driver of its own link-map namespace, so that a private copy of
 * NVML (dlmopen) is not held, as on the real driver. */
SIM_EXPORT int simcuda_checkpoint_locked(void);
SIM_EXPORT int simcuda_checkpoint_locked(void) { return atomic_load(&g_ck_state) != CU_PROCESS_STATE_RUNNING; }
SIM_EXPORT uint64_t simcuda_checkpoint_late_calls(void);
SIM_EXPORT uint64_t simcuda_checkpoint_late_calls(void) { return atomic_load(&g_ck_late); }

/* ---- cuGetProcAddress */

/* One row per ABI: the base name, the CUDA version that introduced this ABI, whether it is the per-thread
 * default stream variant, and the exported function itself (bound locally: -Bsymbolic-functions). */
static const struct pa_entry {
  const char *base;
  int version;
  int per_thread;
  void *fn;
} g_pa_table[] = {
#define PA(base, ver, pt, fn) {base, ver, pt, (void *)&fn},
    PA("cuInit", 2000, 0, cuInit)
    PA("cuDriverGetVersion", 2020, 0, cuDriverGetVersion)
    PA("cuDeviceGet", 2000, 0, cuDeviceGet)
    PA("cuDeviceGetCount", 2000, 0, cuDeviceGetCount)
    PA("cuDeviceGetName", 2000, 0, cuDeviceGetName)
    PA("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid)
    PA("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2)
    PA("cuDeviceTotalMem", 2000, 0, cuDeviceTotalMem)
    PA("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2)
    PA("cuDeviceGetAttribute", 2000, 0, cuDeviceGetAttribute)
    PA("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain)
    PA("cuDevicePrimaryCtxRelease", 7000, 0, cuDevicePrimaryCtxRelease)
    PA("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2)
    PA("cuDevicePrimaryCtxReset", 7000, 0, cuDevicePrimaryCtxReset)
    PA("cuDevicePrimaryCtxReset", 11000, 0, cuDevicePrimaryCtxReset_v2)
    PA("cuDevicePrimaryCtxGetState", 7000, 0, cuDevicePrimaryCtxGetState)
    PA("cuCtxCreate", 2000, 0, cuCtxCreate)
    PA("cuCtxCreate", 3020, 0, cuCtxCreate_v2)
    PA("cuCtxCreate", 11040, 0, cuCtxCreate_v3)
    PA("cuCtxCreate", 12050, 0, cuCtxCreate_v4)
    PA("cuCtxDestroy", 2000, 0, cuCtxDestroy)
    PA("cuCtxDestroy", 4000, 0, cuCtxDestroy_v2)
    PA("cuCtxPushCurrent", 2000, 0, cuCtxPushCurrent)
    PA("cuCtxPushCurrent", 4000, 0, cuCtxPushCurrent_v2)
    PA("cuCtxPopCurrent", 2000, 0, cuCtxPopCurrent)
    PA("cuCtxPopCurrent", 4000, 0, cuCtxPopCurrent_v2)
    PA("cuCtxGetCurrent", 4000, 0, cuCtxGetCurrent)
    PA("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent)
    PA("cuCtxAttach", 2000, 0, cuCtxAttach)
    PA("cuCtxDetach", 2000, 0, cuCtxDetach)
    PA("cuCtxGetApiVersion", 3020, 0, cuCtxGetApiVersion)
    PA("cuGLCtxCreate", 2000, 0, cuGLCtxCreate)
    PA("cuGLCtxCreate", 3020, 0, cuGLCtxCreate_v2)
    PA("cuVDPAUCtxCreate", 3010, 0, cuVDPAUCtxCreate)
    PA("cuVDPAUCtxCreate", 3020, 0, cuVDPAUCtxCreate_v2)
    PA("cuCtxGetDevice", 2000, 0, cuCtxGetDevice)
    PA("cuCtxGetDevice", 13000, 0, cuCtxGetDevice_v2)
    PA("cuCtxSynchronize", 2000, 0, cuCtxSynchronize)
    PA("cuCtxSynchronize", 13000, 0, cuCtxSynchronize_v2)
    PA("cuMemAlloc", 2000, 0, cuMemAlloc)
    PA("cuMemAlloc", 3020, 0, cuMemAlloc_v2)
    PA("cuMemAllocPitch", 2000, 0, cuMemAllocPitch)
    PA("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2)
    PA("cuMemAllocManaged", 6000, 0, cuMemAllocManaged)
    PA("cuMemFree", 2000, 0, cuMemFree)
    PA("cuMemFree", 3020, 0, cuMemFree_v2)
    PA("cuMemGetInfo", 2000, 0, cuMemGetInfo)
    PA("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2)
    PA("cuMemGetAddressRange", 2000, 0, cuMemGetAddressRange)
    PA("cuMemGetAddressRange", 3020, 0, cuMemGetAddressRange_v2)
    PA("cuMemHostAlloc", 2020, 0, cuMemHostAlloc)
    PA("cuMemAllocHost", 2000, 0, cuMemAllocHost)
    PA("cuMemAllocHost", 3020, 0, cuMemAllocHost_v2)
    PA("cuMemFreeHost", 2000, 0, cuMemFreeHost)
    PA("cuMemcpyHtoD", 2000, 0, cuMemcpyHtoD)
    PA("cuMemcpyHtoD", 3020, 0, cuMemcpyHtoD_v2)
    PA("cuMemcpyHtoD", 7000, 1, cuMemcpyHtoD_v2_ptds)
    PA("cuMemcpyDtoH", 2000, 0, cuMemcpyDtoH)
    PA("cuMemcpyDtoH", 3020, 0, cuMemcpyDtoH_v2)
    PA("cuMemcpyDtoH", 7000, 1, cuMemcpyDtoH_v2_ptds)
    PA("cuMemcpyDtoD", 2000, 0, cuMemcpyDtoD)
    PA("cuMemcpyDtoD", 3020, 0, cuMemcpyDtoD_v2)
    PA("cuMemcpyDtoD", 7000, 1, cuMemcpyDtoD_v2_ptds)
    PA("cuMemsetD8", 2000, 0, cuMemsetD8)
    PA("cuMemsetD8", 3020, 0, cuMemsetD8_v2)
    PA("cuMemsetD8", 7000, 1, cuMemsetD8_v2_ptds)
    PA("cuStreamCreate", 2000, 0, cuStreamCreate)
    PA("cuStreamDestroy", 2000, 0, cuStreamDestroy)
    PA("cuStreamDestroy", 4000, 0, cuStreamDestroy_v2)
    PA("cuStreamSynchronize", 2000, 0, cuStreamSynchronize)
    PA("cuStreamSynchronize", 7000, 1, cuStreamSynchronize_ptsz)
    PA("cuStreamGetCtx", 9020, 0, cuStreamGetCtx)
    PA("cuStreamGetCtx", 9020, 1, cuStreamGetCtx_ptsz)
    PA("cuStreamGetCtx", 12050, 0, cuStreamGetCtx_v2)
    PA("cuStreamGetCtx", 12050, 1, cuStreamGetCtx_v2_ptsz)
    PA("cuMemAllocAsync", 11020, 0, cuMemAllocAsync)
    PA("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz)
    PA("cuMemFreeAsync", 11020, 0, cuMemFreeAsync)
    PA("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz)
    PA("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync)
    PA("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz)
    PA("cuMemPoolCreate", 11020, 0, cuMemPoolCreate)
    PA("cuMemPoolDestroy", 11020, 0, cuMemPoolDestroy)
    PA("cuMemPoolTrimTo", 11020, 0, cuMemPoolTrimTo)
    PA("cuMemPoolSetAttribute", 11020, 0, cuMemPoolSetAttribute)
    PA("cuMemPoolGetAttribute", 11020, 0, cuMemPoolGetAttribute)
    PA("cuDeviceGetDefaultMemPool", 11020, 0, cuDeviceGetDefaultMemPool)
    PA("cuDeviceGetMemPool", 11020, 0, cuDeviceGetMemPool)
    PA("cuDeviceSetMemPool", 11020, 0, cuDeviceSetMemPool)
    PA("cuMemGetDefaultMemPool", 13000, 0, cuMemGetDefaultMemPool)
    PA("cuMemGetMemPool", 13000, 0, cuMemGetMemPool)
    PA("cuMemSetMemPool", 13000, 0, cuMemSetMemPool)
    PA("cuMemAddressReserve", 10020, 0, cuMemAddressReserve)
    PA("cuMemAddressFree", 10020, 0, cuMemAddressFree)
    PA("cuMemCreate", 10020, 0, cuMemCreate)
    PA("cuMemRelease", 10020, 0, cuMemRelease)
    PA("cuMemGetAllocationPropertiesFromHandle", 10020, 0, cuMemGetAllocationPropertiesFromHandle)
    PA("cuMemMap", 10020, 0, cuMemMap)
    PA("cuMemUnmap", 10020, 0, cuMemUnmap)
    PA("cuMemSetAccess", 10020, 0, cuMemSetAccess)
    PA("cuMemGetAllocationGranularity", 10020, 0, cuMemGetAllocationGranularity)
    PA("cuGetErrorName", 6000, 0, cuGetErrorName)
    PA("cuGetErrorString", 6000, 0, cuGetErrorString)
    PA("cuLaunchKernel", 4000, 0, cuLaunchKernel)
    PA("cuLaunchKernel", 7000, 1, cuLaunchKernel_ptsz)
    PA("cuModuleGetLoadingMode", 11070, 0, cuModuleGetLoadingMode)
    PA("cuLibraryLoadData", 12000, 0, cuLibraryLoadData)
    PA("cuLibraryUnload", 12000, 0, cuLibraryUnload)
    PA("cuLibraryGetKernel", 12000, 0, cuLibraryGetKernel)
    PA("cuKernelGetFunction", 12000, 0, cuKernelGetFunction)
    PA("cuIpcGetMemHandle", 4010, 0, cuIpcGetMemHandle)
    PA("cuIpcOpenMemHandle", 4010, 0, cuIpcOpenMemHandle)
    PA("cuIpcOpenMemHandle", 11000, 0, cuIpcOpenMemHandle_v2)
    PA("cuIpcCloseMemHandle", 4010, 0, cuIpcCloseMemHandle)
    PA("cuStreamBeginCapture", 10000, 0, cuStreamBeginCapture)
    PA("cuStreamBeginCapture", 10000, 1, cuStreamBeginCapture_ptsz)
    PA("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2)
    PA("cuStreamBeginCapture", 10010, 1, cuStreamBeginCapture_v2_ptsz)
    PA("cuStreamEndCapture", 10000, 0, cuStreamEndCapture)
    PA("cuStreamEndCapture", 10000, 1, cuStreamEndCapture_ptsz)
    PA("cuStreamIsCapturing", 10000, 0, cuStreamIsCapturing)
    PA("cuStreamIsCapturing", 10000, 1, cuStreamIsCapturing_ptsz)
    PA("cuGraphDestroy", 10000, 0, cuGraphDestroy)
    PA("cuCheckpointProcessLock", 12080, 0, cuCheckpointProcessLock)
    PA("cuCheckpointProcessCheckpoint", 12080, 0, cuCheckpointProcessCheckpoint)
    PA("cuCheckpointProcessRestore", 12080, 0, cuCheckpointProcessRestore)
    PA("cuCheckpointProcessUnlock", 12080, 0, cuCheckpointProcessUnlock)
    PA("cuCheckpointProcessGetState", 12080, 0, cuCheckpointProcessGetState)
    PA("cuGetProcAddress", 11030, 0, cuGetProcAddress)
    PA("cuGetProcAddress", 12000, 0, cuGetProcAddress_v2)
#undef PA
};

static void pa_log_locked(const char *symbol, int version, cuuint64_t flags) {
  if (g.pa_count < PA_LOG_MAX) {
    if (!g.pa_log) g.pa_log = calloc(PA_LOG_MAX, sizeof *g.pa_log);
    if (g.pa_log) {
      pa_log_t *e = &g.pa_log[g.pa_count];
      snprintf(e->symbol, sizeof e->symbol, "%s", symbol ? symbol : "(null)");
      e->version = version;
      e->flags = flags;
    }
  }
  g.pa_count++;
}

static CUresult impl_procaddr(const char *symbol, void **pfn, int version, cuuint64_t flags,
                              CUdriverProcAddressQueryResult *status) {
  LOCK();
  pa_log_locked(symbol, version, flags);
  UNLOCK();
  if (!symbol || !pfn || (flags & ~3ULL) || flags == 3) return CUDA_ERROR_INVALID_VALUE;
  /* A version above the driver's own is answered like the real CUDA 13 driver does: with the newest ABI it has
   * at or below that version (a runtime built for 13.1 asks for 13010 and later). */
  int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const struct pa_entry *best = NULL, *best_pt = NULL;
  int known = 0;
  for (size_t i = 0; i < sizeof g_pa_table / sizeof g_pa_table[0]; i++) {
    const struct pa_entry *e = &g_pa_table[i];
    if (strcmp(e->base, symbol) != 0) continue;
    known = 1;
    if (e->version > version) continue;
    if (e->per_thread) {
      if (per_thread && (!best_pt || e->version > best_pt->version)) best_pt = e;
    } else if (!best || e->version > best->version) {
      best = e;
    }
  }
  /* The per-thread flag falls back to the legacy function when no per-thread variant exists. */
  const struct pa_entry *hit = best_pt ? best_pt : best;
  if (!hit) {
    *pfn = NULL;
    if (status) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = hit->fn;
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

SIM_API cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *symbolStatus) {
  ENTER(cuGetProcAddress_v2);
  LEAVE(cuGetProcAddress_v2, impl_procaddr(symbol, pfn, cudaVersion, flags, symbolStatus));
}

SIM_API cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
  ENTER(cuGetProcAddress);
  LEAVE(cuGetProcAddress, impl_procaddr(symbol, pfn, cudaVersion, flags, NULL));
}

/* ================================================================================== inspection (simcuda_*) */

static void add_dev_stats(simcuda_stats_t *o, const simdev_t *d) {
  o->live_blocks += d->live_blocks;
  o->live_bytes += d->live_bytes;
  o->pool_reserved_bytes += d->pool_reserved;
  o->pool_used_bytes += d->pool_used;
  o->vmm_handles += d->vmm_handles;
  o->vmm_phys_bytes += d->vmm_phys;
  o->vmm_mappings += d->vmm_mappings;
  o->vmm_mapped_bytes += d->vmm_mapped;
  o->host_blocks += d->host_blocks;
  o->host_bytes += d->host_bytes;
  o->used_bytes += dev_used(d);
  simm_info_t in;
  simm_info(d->gpu, &in);
  o->capacity_bytes += in.capacity;
  o->gpu_used_bytes += in.used;
  o->gpu_processes += (uint64_t)in.processes;
  o->gpu_reclaimed += in.reclaimed;
  o->contexts += d->contexts;
  o->primary_retains += (uint64_t)(d->primary.refcount > 0 ? d->primary.refcount : 0);
}

SIM_EXPORT CUresult simcuda_stats(int device, CUcontext ctx, simcuda_stats_t *out) {
  /* A caller built with an older header (without the gpu_ figures) gets what its struct holds. */
  if (!out || out->size < offsetof(simcuda_stats_t, gpu_used_bytes)) return CUDA_ERROR_INVALID_VALUE;
  size_t nb = out->size < sizeof(simcuda_stats_t) ? out->size : sizeof(simcuda_stats_t);
  simcuda_stats_t o;
  memset(&o, 0, sizeof o);
  o.size = nb;
  CUresult r = CUDA_SUCCESS;
  LOCK();
  if (!inited()) {
    int n = simm_env_devices();
    uint64_t cap = simm_env_capacity();
    if (device < -1 || device >= n) r = CUDA_ERROR_INVALID_VALUE;
    else if (ctx) r = CUDA_ERROR_INVALID_CONTEXT;
    else
      for (int d = 0; d < n; d++)
        if (device == -1 || device == d) o.capacity_bytes += capacity_for(d, cap);
  } else if (device < -1 || device >= g.ndev) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (ctx) {
    struct CUctx_st *c = ctx_lookup(ctx);
    if (!c) {
      r = CUDA_ERROR_INVALID_CONTEXT;
    } else {
      o.capacity_bytes = simm_capacity(g.dev[device == -1 ? c->device : device].gpu);
      if (device == -1 || device == c->device) {
        o.live_blocks = c->live_blocks;
        o.live_bytes = c->live_bytes;
        o.pool_used_bytes = c->pool_used;
        o.host_blocks = c->host_blocks;
        o.host_bytes = c->host_bytes;
        o.used_bytes = c->plain_bytes;
        o.contexts = c->alive ? 1 : 0;
      }
    }
  } else {
    for (int d = 0; d < g.ndev; d++)
      if (device == -1 || device == d) add_dev_stats(&o, &g.dev[d]);
    if (device == -1) o.va_reserved_bytes = g.va_reserved; /* reservations belong to no device */
  }
  UNLOCK();
  if (r == CUDA_SUCCESS) memcpy(out, &o, nb);
  return r;
}

SIM_EXPORT CUresult simcuda_primary_context(int device, CUcontext *out) {
  if (!inited()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(device)) return CUDA_ERROR_INVALID_DEVICE;
  *out = &g.dev[device].primary; /* stable for the process's life: a reset or final release keeps the handle */
  return CUDA_SUCCESS;
}

SIM_EXPORT int simcuda_foreach_block(int (*fn)(const simcuda_block_t *b, void *arg), void *arg) {
  if (!fn) return 0;
  /* Snapshot under the lock, call back outside it, so fn may use the simulator. */
  size_t n = 0, cap = 0;
  simcuda_block_t *v = NULL;
#define PUSH(...)                                                                                             \
  do {                                                                                                        \
    if (n == cap) {                                                                                           \
      size_t nc = cap ? cap * 2 : 64;                                                                         \
      simcuda_block_t *nv = realloc(v, nc * sizeof *v);                                                       \
      if (!nv) goto snapshot_done;                                                                            \
      v = nv;                                                                                                 \
      cap = nc;                                                                                               \
    }                                                                                                         \
    v[n++] = (simcuda_block_t){__VA_ARGS__};                                                                  \
  } while (0)
  LOCK();
  for (size_t i = 0; i < g.blocks.cap; i++) {
    blk_t *b = g.blocks.keys[i] ? g.blocks.vals[i] : NULL;
    if (!b || b->state != ST_LIVE) continue;
    PUSH(.address = b->addr, .bytes = b->bytes, .kind = b->kind, .device = b->kind == SIMCUDA_HOST ? -1 : b->device,
         .ctx = b->ctx, .pool = b->pool, .released = 0);
  }
  for (size_t i = 0; i < g.vmm.cap; i++) {
    vmm_handle_t *h = g.vmm.keys[i] ? g.vmm.vals[i] : NULL;
    if (!h) continue;
    PUSH(.address = h->handle, .bytes = h->size, .kind = SIMCUDA_VMM, .device = h->device, .ctx = NULL, .pool = NULL,
         .released = h->released);
  }
  for (va_res_t *r = g.res; r; r = r->next) {
    PUSH(.address = r->va, .bytes = r->size, .kind = SIMCUDA_VA, .device = -1, .ctx = NULL, .pool = NULL,
         .released = 0);
    for (vmm_map_t *m = r->maps; m; m = m->next)
      PUSH(.address = m->va, .bytes = m->size, .kind = SIMCUDA_VMM_MAPPING, .device = m->h->device, .ctx = NULL,
           .pool = NULL, .released = 0);
  }
snapshot_done:
  UNLOCK();
#undef PUSH
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) rc = fn(&v[i], arg);
  free(v);
  return rc;
}

SIM_EXPORT int simcuda_inject(const char *fn, CUresult err, int count) {
  pthread_mutex_lock(&g_inj_lock);
  int rc = 0;
  if (!fn) {
    for (int i = 0; i < SIMFN_COUNT; i++) atomic_store_explicit(&g_inj_count[i], 0, memory_order_relaxed);
  } else {
    int id = fn_id(fn);
    if (id < 0) {
      rc = -1;
    } else {
      g_inj_err[id] = err;
      atomic_store_explicit(&g_inj_count[id], count > 0 ? count : 0, memory_order_relaxed);
    }
  }
  pthread_mutex_unlock(&g_inj_lock);
  return rc;
}

SIM_EXPORT uint64_t simcuda_calls(const char *fn) {
  int id = fn_id(fn);
  return id < 0 ? 0 : calls_of(id);
}

SIM_EXPORT uint64_t simcuda_procaddr_requests(void (*fn)(const char *symbol, int version, uint64_t flags, void *arg),
                                              void *arg) {
  LOCK();
  uint64_t total = g.pa_count;
  size_t n = (size_t)(total < PA_LOG_MAX ? total : PA_LOG_MAX);
  pa_log_t *copy = NULL;
  if (fn && n && g.pa_log) {
    copy = malloc(n * sizeof *copy);
    if (copy) memcpy(copy, g.pa_log, n * sizeof *copy);
  }
  UNLOCK();
  if (copy)
    for (size_t i = 0; i < n; i++) fn(copy[i].symbol, copy[i].version, copy[i].flags, arg);
  free(copy);
  return total;
}

SIM_EXPORT void simcuda_set_capacity(int device, uint64_t bytes) {
  LOCK();
  if (device == -1) {
    g.cap_all_overridden = 1;
    g.cap_all = bytes;
    memset(g.cap_overridden, 0, sizeof g.cap_overridden);
    if (inited())
      for (int d = 0; d < g.ndev; d++) simm_set_capacity(g.dev[d].gpu, bytes);
  } else if (device >= 0 && device < SIM_MAX_DEV) {
    g.cap_overridden[device] = 1;
    g.cap_override[device] = bytes;
    if (inited() && device < g.ndev) simm_set_capacity(g.dev[device].gpu, bytes);
  }
  UNLOCK();
}

SIM_EXPORT int simcuda_arena(int device, uint64_t *base, uint64_t *size) {
  int hinted = -1;
  LOCK();
  if (inited() && device >= 0 && device < g.ndev) {
    if (base) *base = g.dev[device].ar.base;
    if (size) *size = g.dev[device].ar.size;
    hinted = g.dev[device].ar.hinted;
  }
  UNLOCK();
  return hinted;
}

/* ------------------------------------------------------------------- test-only interleaving control */

/* One callback armed per entry point; taking it disarms it, so it runs once, on the thread that made the call.
 * Nothing of the simulator's is locked while it runs: it may call the driver, through gpureclaim too. */
typedef struct {
  void (*cb)(void *);
  void *arg;
} on_return_t;
static on_return_t g_on_return[SIMFN_COUNT]; /* guarded by g_on_return_lock */
static pthread_mutex_t g_on_return_lock = PTHREAD_MUTEX_INITIALIZER;

static void run_on_return(int id) {
  pthread_mutex_lock(&g_on_return_lock);
  on_return_t o = g_on_return[id];
  if (o.cb) {
    g_on_return[id].cb = NULL;
    atomic_fetch_sub_explicit(&g_on_return_armed, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_on_return_lock);
  if (o.cb) o.cb(o.arg);
}

SIM_EXPORT int simcuda_on_return(const char *fn, void (*cb)(void *arg), void *arg) {
  int id = fn ? fn_id(fn) : 0;
  if (id < 0) return -1;
  pthread_mutex_lock(&g_on_return_lock);
  for (int i = fn ? id : 0; i < (fn ? id + 1 : SIMFN_COUNT); i++) {
    on_return_t want = {fn ? cb : NULL, fn ? arg : NULL};
    int delta = (want.cb != NULL) - (g_on_return[i].cb != NULL);
    g_on_return[i] = want;
    atomic_fetch_add_explicit(&g_on_return_armed, delta, memory_order_release);
  }
  pthread_mutex_unlock(&g_on_return_lock);
  return 0;
}

/* The same for the entry: the callback runs before the driver counts or sees the call (a thread held there has
 * passed whatever gpureclaim put in front of the driver and is not yet inside it). */
static on_return_t g_on_enter[SIMFN_COUNT]; /* guarded by g_on_return_lock */

static void run_on_enter(int id) {
  pthread_mutex_lock(&g_on_return_lock);
  on_return_t o = g_on_enter[id];
  if (o.cb) {
    g_on_enter[id].cb = NULL;
    atomic_fetch_sub_explicit(&g_on_enter_armed, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_on_return_lock);
  if (o.cb) o.cb(o.arg);
}

SIM_EXPORT int simcuda_on_enter(const char *fn, void (*cb)(void *arg), void *arg) {
  int id = fn ? fn_id(fn) : 0;
  if (id < 0) return -1;
  pthread_mutex_lock(&g_on_return_lock);
  for (int i = fn ? id : 0; i < (fn ? id + 1 : SIMFN_COUNT); i++) {
    on_return_t want = {fn ? cb : NULL, fn ? arg : NULL};
    int delta = (want.cb != NULL) - (g_on_enter[i].cb != NULL);
    g_on_enter[i] = want;
    atomic_fetch_add_explicit(&g_on_enter_armed, delta, memory_order_release);
  }
  pthread_mutex_unlock(&g_on_return_lock);
  return 0;
}
