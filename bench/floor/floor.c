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
 * Routes: the four entry points bench_hooks times, by exported name and through cuGetProcAddress (a dlsym
 * override hands out a wrapper of cuGetProcAddress_v2, which wraps what it returns for those four names).
 * Frees of pointers it never saw go to the driver unchanged. No growth, no migration, no reclamation: a
 * table of 2^20 slots is enough for a benchmark that holds one block at a time.
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

#define BITS 20
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

static TLS thr_t t_rec;
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
  for (uint64_t i = home(p), n = 0; n < CAP; n++, i = (i + 1) & (CAP - 1)) {
    slot_t *s = &g_slots[i];
    uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
    if (k > TOMB)
      continue;
    if (g_cas == 0)
      atomic_store_explicit(&s->key, p, memory_order_release);
    else if (!atomic_compare_exchange_strong_explicit(&s->key, &k, p, memory_order_acq_rel, memory_order_relaxed))
      continue;
    s->size = size;
    s->site = site;
    s->meta = meta;
    break;
  }
  leave(t);
  bump(&t->allocs);
  atomic_store_explicit(&t->live_bytes, atomic_load_explicit(&t->live_bytes, memory_order_relaxed) + (int64_t)size,
                        memory_order_relaxed);
}

static inline void untrack(CUdeviceptr p) {
  thr_t *t = me();
  enter(t);
  for (uint64_t i = home(p), n = 0; n < CAP; n++, i = (i + 1) & (CAP - 1)) {
    slot_t *s = &g_slots[i];
    uint64_t k = atomic_load_explicit(&s->key, memory_order_acquire);
    if (k == 0)
      break; /* never seen: the driver's business */
    if (k != p)
      continue;
    if (g_cas < 2 ? (atomic_store_explicit(&s->key, TOMB, memory_order_release), true)
                  : atomic_compare_exchange_strong_explicit(&s->key, &k, TOMB, memory_order_acq_rel,
                                                            memory_order_relaxed)) {
      bump(&t->frees);
      atomic_store_explicit(&t->live_bytes,
                            atomic_load_explicit(&t->live_bytes, memory_order_relaxed) - (int64_t)s->size,
                            memory_order_relaxed);
    }
    break;
  }
  leave(t);
}

#define SITE ((uintptr_t)__builtin_return_address(0))

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  CUresult rc = ex_alloc(p, n);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
  untrack(p);
  return ex_free(p);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  CUresult rc = ex_aalloc(p, n, s);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  untrack(p);
  return ex_afree(p, s);
}

static CUresult w_alloc(CUdeviceptr *p, size_t n) {
  CUresult rc = pa_alloc(p, n);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
static CUresult w_free(CUdeviceptr p) {
  untrack(p);
  return pa_free(p);
}
static CUresult w_aalloc(CUdeviceptr *p, size_t n, CUstream s) {
  CUresult rc = pa_aalloc(p, n, s);
  if (LIKELY(rc == 0))
    track(*p, n, SITE);
  return rc;
}
static CUresult w_afree(CUdeviceptr p, CUstream s) {
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
