/*
 * floor.c -- a throwaway tracker that finds the floor of what tracking an allocation + free can cost, for
 * bench_hooks' "floor" columns. Never used by tests or shipped; not gpureclaim.
 *
 * What it keeps per block, and how: an open-addressing table keyed by device pointer (fixed size, linear
 * probing, 32-byte slots aligned to 32 so none straddles a cache line), one compare-and-swap to insert and one
 * to delete (a deleted slot becomes a tombstone that the next insert may take), the block's size, calling
 * site and thread in the slot, an epoch announcement around each table operation (a plain store and a compiler
 * fence, as gpureclaim's table does with membarrier), per-thread counters (allocations, frees, live bytes,
 * plain stores), no clock read and no context (resolved later, were this real). With FLOOR_CTX=1 in the
 * environment it also calls the driver's cuCtxGetCurrent and reads CLOCK_MONOTONIC_COARSE per allocation and
 * keeps both: the floor of a tracker that resolves the context and the time on the hot path. FLOOR_CAS=1 makes the
 * delete a plain store, FLOOR_CAS=0 the insert too: the floor of a tracker that needs one compare-and-swap per
 * pair, and none (bench/README.md, "Owner takes"). Both are only measurements of a single thread's loop (no other
 * thread writes the table), never a tracker to use.
 *
 * FLOOR_DUTIES=1 adds, each in the least form it could take, what gpureclaim's hot path does besides the table
 * (bench/README.md, "The floor with gpureclaim's duties"): the hook's checks (sleep gate, core active, hook depth
 * around the driver call), the context-destroy sequence read before the driver call and checked after the insert
 * with the thread's insert published, the late-free watch check on a free, the allocation tick (a global the
 * worker would advance, in place of the clock), the scope check, per-thread per-device statistics (allocations,
 * frees, live bytes) and, with FLOOR_CTX=1, a per-thread context cache (context id and device, validated against
 * a liveness array) after cuCtxGetCurrent. The record keeps key, size/kind/device/api, site and tick/context/thread
 * in the 32-byte slot.
 *
 * FLOOR_RING=1 is the floor of another design: an allocation appends its record to a per-thread log of 16 (plain
 * stores inside the epoch announcement), a free of the log's newest record (or any in the log) drops it there,
 * and only a full log, or a free of a block the log does not hold, reaches the shared table (a compare-and-swap
 * each). A release or snapshot would drain every thread's log first, through the announcement (not built here).
 * Each log operation checks a per-thread drain flag inside the announcement (a drainer would set it, wait for the
 * announcement to clear, then own the log). FLOOR_RING needs FLOOR_DUTIES=1; the ring keeps the duties a log
 * cannot defer (hook checks, watch, tick, scope, context cache, allocation and free counts); the statistics' live
 * bytes and the destroy sequence move to the drain.
 *
 * Routes: the four entry points bench_hooks times, by exported name and through cuGetProcAddress (a dlsym
 * override hands out a wrapper of cuGetProcAddress_v2, which wraps what it returns for those four names).
 * Frees of pointers it never saw go to the driver unchanged. No growth, no migration, no reclamation: a
 * table of 2^20 slots is enough for a benchmark that holds up to 50,000 blocks at a time, and one of 2^21
 * (FLOOR_BITS=21, libgrfloor21.so) for a million.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
#define API __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)

#ifndef FLOOR_BITS
#define FLOOR_BITS 20 /* built with 21 too, as libgrfloor21.so: room for bench_hooks --scale's million blocks */
#endif
#define BITS FLOOR_BITS
#define CAP (UINT64_C(1) << BITS)
#define TOMB UINT64_C(1)

typedef struct slot {
  _Atomic uint64_t key; /* 0 empty, TOMB deleted, else the device pointer */
  uint64_t size;
  uint64_t site;
  uint64_t meta; /* thread (and with FLOOR_CTX the context and the time) */
} __attribute__((aligned(32))) slot_t;

static slot_t g_slots[CAP];

typedef struct thr {
  _Atomic uint64_t announce; /* the epoch announcement */
  _Atomic uint64_t allocs, frees;
  _Atomic int64_t live_bytes;
  uint32_t tid;
} __attribute__((aligned(64))) thr_t;

#define RING 16
#define NDEV 8

/* What FLOOR_DUTIES keeps per thread (beside thr_t, to leave the default modes' record as it was). */
typedef struct duty {
  uint32_t depth, scope_depth;
  void *last_ctx;
  uint16_t last_ctx_id;
  uint8_t last_dev;
  _Atomic uint64_t track_op; /* the insert in flight, for a context destroy (seq0 + 1) */
  _Atomic uint64_t allocs[NDEV], frees[NDEV];
  _Atomic int64_t live[NDEV];
  _Atomic int drain; /* FLOOR_RING: a drainer wants the log (never set here; the owner checks it per operation) */
  unsigned rn;       /* FLOOR_RING: records in the log */
  uint64_t rk[RING], rw1[RING], rsite[RING], rw3[RING];
} __attribute__((aligned(64))) duty_t;

static TLS thr_t t_rec;
static TLS duty_t t_duty;
static bool g_duties, g_ring;
static _Atomic int g_gate, g_core = 1;
static _Atomic uint64_t g_seq, g_watch, g_tick = 3;
static _Atomic uint8_t g_alive[4096];
static _Atomic uint16_t g_next_ctx = 1;
static _Atomic uint32_t g_next_tid = 1;
static _Atomic uint64_t g_epoch = 1;
static bool g_ctx_mode;
static int g_cas = 2; /* compare-and-swaps per pair: 2, or 1 (plain delete), or 0 (plain insert too) */

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*aalloc_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*afree_t)(CUdeviceptr, CUstream);
typedef CUresult (*getproc_t)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*curctx_t)(void **);

static alloc_t ex_alloc, pa_alloc;
static free_t ex_free, pa_free;
static aalloc_t ex_aalloc, pa_aalloc;
static afree_t ex_afree, pa_afree;
static getproc_t real_getproc;
static curctx_t real_curctx;
static void *(*real_dlsym)(void *, const char *);

__attribute__((constructor)) static void floor_init(void) {
  real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  ex_alloc = (alloc_t)real_dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  ex_free = (free_t)real_dlsym(RTLD_NEXT, "cuMemFree_v2");
  ex_aalloc = (aalloc_t)real_dlsym(RTLD_NEXT, "cuMemAllocAsync");
  ex_afree = (afree_t)real_dlsym(RTLD_NEXT, "cuMemFreeAsync");
  real_getproc = (getproc_t)real_dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
  real_curctx = (curctx_t)real_dlsym(RTLD_NEXT, "cuCtxGetCurrent");
  const char *e = getenv("FLOOR_CTX");
  g_ctx_mode = e && *e == '1';
  e = getenv("FLOOR_DUTIES");
  g_duties = e && *e == '1';
  e = getenv("FLOOR_RING");
  g_ring = e && *e == '1';
  e = getenv("FLOOR_CAS");
  if (e && (*e == '0' || *e == '1'))
    g_cas = *e - '0';
}

static inline thr_t *me(void) {
  thr_t *t = &t_rec;
  if (__builtin_expect(!t->tid, 0))
    t->tid = atomic_fetch_add_explicit(&g_next_tid, 1, memory_order_relaxed);
  return t;
}

static inline void enter(thr_t *t) {
  atomic_store_explicit(&t->announce, atomic_load_explicit(&g_epoch, memory_order_relaxed) << 1 | 1,
                        memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
}
static inline void leave(thr_t *t) { atomic_store_explicit(&t->announce, 0, memory_order_release); }
static inline void bump(_Atomic uint64_t *c) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}
static inline uint64_t home(uint64_t key) { return (key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - BITS); }

/* One compare-and-swap claims a free slot (a plain store with FLOOR_CAS=0); the payload follows. */
static inline bool slot_insert(uint64_t key, uint64_t w1, uint64_t site, uint64_t w3) {
  for (uint64_t i = home(key), n = 0; n < CAP; n++, i = (i + 1) & (CAP - 1)) {
    slot_t *s = &g_slots[i];
    uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
    if (k > TOMB)
      continue;
    if (g_cas == 0)
      atomic_store_explicit(&s->key, key, memory_order_release);
    else if (!atomic_compare_exchange_strong_explicit(&s->key, &k, key, memory_order_acq_rel, memory_order_relaxed))
      continue;
    s->size = w1;
    s->site = site;
    s->meta = w3;
    return true;
  }
  return false;
}

/* Finds key and deletes it with one compare-and-swap (a plain store with FLOOR_CAS below 2); *w1: its second word. */
static inline bool slot_take(uint64_t key, uint64_t *w1) {
  for (uint64_t i = home(key), n = 0; n < CAP; n++, i = (i + 1) & (CAP - 1)) {
    slot_t *s = &g_slots[i];
    uint64_t k = atomic_load_explicit(&s->key, memory_order_acquire);
    if (k == 0)
      return false;
    if (k != key)
      continue;
    *w1 = s->size;
    if (g_cas < 2)
      atomic_store_explicit(&s->key, TOMB, memory_order_release);
    else if (!atomic_compare_exchange_strong_explicit(&s->key, &k, TOMB, memory_order_acq_rel, memory_order_relaxed))
      return false;
    return true;
  }
  return false;
}

static inline void track(CUdeviceptr p, size_t size, uintptr_t site) {
  thr_t *t = me();
  uint64_t meta = t->tid;
  if (__builtin_expect(g_ctx_mode, 0)) {
    void *ctx = NULL;
    struct timespec ts;
    real_curctx(&ctx);
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    meta |= ((uint64_t)(uintptr_t)ctx ^ (uint64_t)ts.tv_nsec) << 22;
  }
  enter(t);
  slot_insert(p, size, site, meta);
  leave(t);
  bump(&t->allocs);
  atomic_store_explicit(&t->live_bytes, atomic_load_explicit(&t->live_bytes, memory_order_relaxed) + (int64_t)size,
                        memory_order_relaxed);
}

static inline void untrack(CUdeviceptr p) {
  thr_t *t = me();
  uint64_t size;
  enter(t);
  if (slot_take(p, &size)) {
    bump(&t->frees);
    atomic_store_explicit(&t->live_bytes, atomic_load_explicit(&t->live_bytes, memory_order_relaxed) - (int64_t)size,
                          memory_order_relaxed);
  }
  leave(t);
}

#define SITE ((uintptr_t)__builtin_return_address(0))

/* ---- FLOOR_DUTIES and FLOOR_RING ---- */

#define SIZE_MASK ((UINT64_C(1) << 48) - 1)
#define W1(n, dev) ((uint64_t)(n) | UINT64_C(1) << 48 | (uint64_t)(dev) << 52 | UINT64_C(1) << 59)
#define W1_DEV(w1) ((unsigned)((w1) >> 52) & (NDEV - 1))

/* A context the thread's cache does not hold: a new id, marked alive (a registry would look it up). */
__attribute__((noinline, cold)) static void ctx_slow(duty_t *d, void *ctx) {
  uint16_t id = (uint16_t)(atomic_fetch_add_explicit(&g_next_ctx, 1, memory_order_relaxed) & 4095);
  atomic_store_explicit(&g_alive[id], 1, memory_order_release);
  d->last_ctx = ctx;
  d->last_ctx_id = id;
  d->last_dev = 0;
}

/* A full log: every record goes to the table, as a drain would. */
__attribute__((noinline, cold)) static void ring_flush(duty_t *d) {
  for (unsigned i = 0; i < d->rn; i++) {
    slot_insert(d->rk[i], d->rw1[i], d->rsite[i], d->rw3[i]);
    int dev = W1_DEV(d->rw1[i]);
    atomic_store_explicit(&d->live[dev],
                          atomic_load_explicit(&d->live[dev], memory_order_relaxed) + (int64_t)(d->rw1[i] & SIZE_MASK),
                          memory_order_relaxed);
  }
  d->rn = 0;
}

static inline void duty_track(duty_t *d, CUdeviceptr p, size_t size, uintptr_t site, uint64_t seq0) {
  thr_t *t = me();
  unsigned cid = 0, dev = 0;
  if (__builtin_expect(g_ctx_mode, 0)) {
    void *ctx = NULL;
    real_curctx(&ctx);
    if (__builtin_expect(!(ctx == d->last_ctx && atomic_load_explicit(&g_alive[d->last_ctx_id], memory_order_acquire)),
                         0))
      ctx_slow(d, ctx);
    cid = d->last_ctx_id;
    dev = d->last_dev;
  }
  uint64_t tick = atomic_load_explicit(&g_tick, memory_order_relaxed);
  tick = LIKELY(tick & 1) ? tick >> 1 : 0;
  uint64_t scope = LIKELY(d->scope_depth == 0) ? 0 : 1;
  uint64_t w1 = W1(size, dev);
  uint64_t w3 = (tick & 0xffffff) << 40 | (uint64_t)cid << 28 | scope << 27 | t->tid;
  if (g_ring) {
    enter(t);
    if (__builtin_expect(d->rn == RING || atomic_load_explicit(&d->drain, memory_order_relaxed), 0))
      ring_flush(d);
    unsigned i = d->rn;
    d->rk[i] = p;
    d->rw1[i] = w1;
    d->rsite[i] = site;
    d->rw3[i] = w3;
    d->rn = i + 1;
    leave(t);
    bump(&d->allocs[dev]);
    return;
  }
  atomic_store_explicit(&d->track_op, seq0 + 1, memory_order_relaxed); /* seen by a destroy (with membarrier) */
  enter(t);
  slot_insert(p, w1, site, w3);
  leave(t);
  if (__builtin_expect(atomic_load_explicit(&g_seq, memory_order_acquire) != seq0, 0))
    atomic_store_explicit(&g_watch, 0, memory_order_relaxed); /* a destroy overlapped: gpureclaim re-checks */
  atomic_store_explicit(&d->track_op, 0, memory_order_release);
  bump(&d->allocs[dev]);
  atomic_store_explicit(&d->live[dev], atomic_load_explicit(&d->live[dev], memory_order_relaxed) + (int64_t)size,
                        memory_order_relaxed);
}

/* Takes p's record (from the log, else the table); 1 with its w1, or 0 when never seen. */
static inline int duty_untrack(duty_t *d, CUdeviceptr p, uint64_t *w1) {
  thr_t *t = me();
  int found = 0;
  enter(t);
  if (g_ring && LIKELY(!atomic_load_explicit(&d->drain, memory_order_relaxed))) {
    for (unsigned i = d->rn; i-- > 0;) {
      if (d->rk[i] != p)
        continue;
      *w1 = d->rw1[i];
      unsigned last = --d->rn;
      d->rk[i] = d->rk[last];
      d->rw1[i] = d->rw1[last];
      d->rsite[i] = d->rsite[last];
      d->rw3[i] = d->rw3[last];
      leave(t);
      return 2; /* never reached the table: no live bytes to take back */
    }
  }
  found = slot_take(p, w1);
  leave(t);
  return found;
}

static inline void duty_freed(duty_t *d, uint64_t w1, int where) {
  unsigned dev = W1_DEV(w1);
  bump(&d->frees[dev]);
  if (where == 1)
    atomic_store_explicit(&d->live[dev],
                          atomic_load_explicit(&d->live[dev], memory_order_relaxed) - (int64_t)(w1 & SIZE_MASK),
                          memory_order_relaxed);
}

/* The hook bodies with the duties: a gate and core check first, the hook depth around the driver call. */
#define DUTY_ALLOC(call, n)                                                                                  \
  do {                                                                                                       \
    if (__builtin_expect(atomic_load_explicit(&g_gate, memory_order_relaxed) != 0, 0))                       \
      return 999;                                                                                            \
    if (__builtin_expect(!atomic_load_explicit(&g_core, memory_order_acquire), 0))                           \
      return (call);                                                                                         \
    duty_t *d_ = &t_duty;                                                                                    \
    d_->depth++;                                                                                             \
    uint64_t seq0_ = atomic_load_explicit(&g_seq, memory_order_acquire);                                     \
    CUresult rc_ = (call);                                                                                   \
    if (LIKELY(rc_ == 0))                                                                                    \
      duty_track(d_, *p, (n), SITE, seq0_);                                                                  \
    d_->depth--;                                                                                             \
    return rc_;                                                                                              \
  } while (0)

#define DUTY_FREE(call)                                                                                      \
  do {                                                                                                       \
    if (__builtin_expect(atomic_load_explicit(&g_gate, memory_order_relaxed) != 0, 0))                       \
      return 999;                                                                                            \
    if (__builtin_expect(!atomic_load_explicit(&g_core, memory_order_acquire), 0) ||                         \
        __builtin_expect(atomic_load_explicit(&g_watch, memory_order_acquire) != 0, 0))                      \
      return (call);                                                                                         \
    duty_t *d_ = &t_duty;                                                                                    \
    uint64_t w1_ = 0;                                                                                        \
    int where_ = duty_untrack(d_, p, &w1_);                                                                  \
    d_->depth++;                                                                                             \
    CUresult rc_ = (call);                                                                                   \
    d_->depth--;                                                                                             \
    if (where_ && LIKELY(rc_ == 0))                                                                          \
      duty_freed(d_, w1_, where_);                                                                           \
    return rc_;                                                                                              \
  } while (0)

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (g_duties)
    DUTY_ALLOC(ex_alloc(p, n), n);
  CUresult rc = ex_alloc(p, n);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
  if (g_duties)
    DUTY_FREE(ex_free(p));
  untrack(p);
  return ex_free(p);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  if (g_duties)
    DUTY_ALLOC(ex_aalloc(p, n, s), n);
  CUresult rc = ex_aalloc(p, n, s);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  if (g_duties)
    DUTY_FREE(ex_afree(p, s));
  untrack(p);
  return ex_afree(p, s);
}

static CUresult w_alloc(CUdeviceptr *p, size_t n) {
  if (g_duties)
    DUTY_ALLOC(pa_alloc(p, n), n);
  CUresult rc = pa_alloc(p, n);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
static CUresult w_free(CUdeviceptr p) {
  if (g_duties)
    DUTY_FREE(pa_free(p));
  untrack(p);
  return pa_free(p);
}
static CUresult w_aalloc(CUdeviceptr *p, size_t n, CUstream s) {
  if (g_duties)
    DUTY_ALLOC(pa_aalloc(p, n, s), n);
  CUresult rc = pa_aalloc(p, n, s);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
static CUresult w_afree(CUdeviceptr p, CUstream s) {
  if (g_duties)
    DUTY_FREE(pa_afree(p, s));
  untrack(p);
  return pa_afree(p, s);
}

API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *status) {
  CUresult rc = real_getproc(sym, pfn, ver, flags, status);
  if (rc != 0 || !*pfn)
    return rc;
  if (!strcmp(sym, "cuMemAlloc"))
    pa_alloc = (alloc_t)*pfn, *pfn = (void *)w_alloc;
  else if (!strcmp(sym, "cuMemFree"))
    pa_free = (free_t)*pfn, *pfn = (void *)w_free;
  else if (!strcmp(sym, "cuMemAllocAsync"))
    pa_aalloc = (aalloc_t)*pfn, *pfn = (void *)w_aalloc;
  else if (!strcmp(sym, "cuMemFreeAsync"))
    pa_afree = (afree_t)*pfn, *pfn = (void *)w_afree;
  return rc;
}

/* dlsym(libcuda, "cuGetProcAddress_v2") gets the wrapper above; everything else is libc's answer. */
API void *dlsym(void *handle, const char *sym) {
  if (handle != RTLD_NEXT && !strcmp(sym, "cuGetProcAddress_v2"))
    return (void *)cuGetProcAddress_v2;
  return real_dlsym(handle, sym);
}
