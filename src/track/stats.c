/*
 * stats.c -- counters behind gpureclaim_stats().
 *
 * Counts (allocations, frees, pinned and address-space bytes) live in per-thread shards written with plain
 * stores by their owner only, so an allocation adds no shared read-modify-write for them; a read sums the
 * shards. A thread's shard lives in its epoch record (table.h), so one per-thread record serves the table and
 * the counters. When the thread exits, its counts stay in the record, summed as before, and the next new thread
 * that takes the record goes on from them (as the record's table counts do, epoch.c): nothing moves, so a read
 * never sees a count in two places or in none. A thread that has no record (memory ran out) counts in g_norec.
 *
 * Live device bytes and their peak
 *   Live bytes of a device are a shared atomic `committed` plus every thread's `pending` change, which the
 *   thread keeps at or below zero: an allocation that would make its pending change positive adds it to
 *   `committed` instead (one atomic add) and raises the peak from the new value; frees stay pending until they
 *   pass -4 MiB. So a thread that allocates and frees in turn (a loop of alloc+free pairs, a framework's
 *   pool growing and shrinking) makes no shared read-modify-write at all once it has freed as much as it
 *   allocates. The exact live count is `committed` plus the pending changes, summed when read.
 *   The peak is raised only when `committed` grows, and live bytes never exceed `committed` (pending changes
 *   are never positive), so the peak is never below the true peak. It is exact while one thread does all the
 *   allocating and freeing (a release frees on gpureclaim's worker thread, which then counts as another);
 *   otherwise it may exceed the true peak by the frees still pending in other records: at most 4 MiB per
 *   thread record (a thread's, or an exited thread's until a new thread takes it) and device. A process that uses a second device also keeps a process total for its overall peak
 *   (with one device, that device's peak is the process's).
 */
#include "stats.h"
#include "limit.h"
#include "real.h"
#include "registry.h"
#include "gate.h"
#include "state.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Per-kind counts; totals are their sums, so an allocation or a free touches one count of its own kind. */
enum { C_DEV_ALLOCS, C_DEV_FREES, C_HOST_IN, C_HOST_OUT, C_HOST_BYTES_IN, C_HOST_BYTES_OUT, C_VA_IN, C_VA_OUT,
       C_VA_ALLOCS, C_VA_FREES, C_MAP_IN, C_MAP_OUT, C_MAP_ALLOCS, C_MAP_FREES, C_N };

/* One slot per value of a record's 7-bit device field, so that the hot path indexes with the field as it is
 * (no clamp); GR_DEVICE_NONE's slot counts blocks of no device (pinned host memory). Ordinals reach the slots
 * between GR_MAX_DEV and it only from outside the registry (a VMM handle's device): they count in the process
 * totals, as every slot does, and no device reads them. */
#define NDEV 128
#define SLOT_NONE GR_DEVICE_NONE
_Static_assert(GR_DEVICE_NONE == NDEV - 1 && GR_MAX_DEV <= SLOT_NONE, "stats.c: the device slots");

/* Frees below this stay pending in their thread (see above). */
#define PENDING_FLOOR (-(INT64_C(4) << 20))

/* One device's counters in a thread, the hot ones first: an allocation and a free of a device block touch
 * pending and one count, all in the first cache line of the device's 128 bytes. */
typedef struct dev_counts {
  _Atomic int64_t pending;  /* live bytes not yet in committed: always <= 0 */
  _Atomic uint64_t c[C_N];  /* by counter (C_DEV_ALLOCS and C_DEV_FREES first) */
  uint64_t pad;             /* to 128 bytes, so that each device's first line starts a cache line */
} dev_counts_t;
_Static_assert(sizeof(dev_counts_t) == 128 && offsetof(dev_counts_t, c[C_DEV_FREES]) < 64 &&
                   offsetof(dev_counts_t, c[C_DEV_ALLOCS]) < 64,
               "stats.c: the hot line");

typedef struct shard {
  dev_counts_t d[NDEV]; /* by device, then counter */
} shard_t; /* in the thread's epoch record (table.h): whole cache lines, written by its thread on every allocation */
_Static_assert(sizeof(shard_t) <= GR_THREAD_STATS_BYTES, "the counters must fit in the thread record");

typedef struct dev_atomics {
  _Atomic uint64_t live_bytes /* committed */, peak, orphan_blocks, orphan_bytes, ctxd_blocks, ctxd_bytes, ctxd_host;
} __attribute__((aligned(64))) dev_atomics_t;

_Atomic uint64_t gr_untracked_routes; /* stats.h */
static dev_atomics_t g_dev[NDEV];
static shard_t g_norec; /* counts of threads without a record */
static _Atomic int g_used_devices_mask_set;
static _Atomic uint64_t g_devmask; /* devices seen, first 64 */
static _Atomic uint64_t g_total_live, g_total_peak;
static _Atomic uint64_t g_untracked_frees, g_late_frees, g_releases, g_released_bytes, g_oom_retries, g_oom_ok;

static inline shard_t *shard_of(gr_thread_rec_t *r) { return (shard_t *)(void *)r->stats; }

/* The calling thread's counters; NULL when it has no record (memory ran out): then counts go to the shared
 * totals directly. */
GR_COLD static shard_t *register_shard(void) {
  gr_thread_rec_t *r = gr_epoch_self();
  return r ? shard_of(r) : NULL;
}

static inline shard_t *my_shard(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  return GR_LIKELY(r != NULL) ? shard_of(r) : register_shard();
}

static inline void add(int dev, int c, uint64_t v) {
  shard_t *s = my_shard();
  if (GR_UNLIKELY(!s)) {
    atomic_fetch_add_explicit(&g_norec.d[dev].c[c], v, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&s->d[dev].c[c], atomic_load_explicit(&s->d[dev].c[c], memory_order_relaxed) + v,
                        memory_order_relaxed);
}

static inline int dev_index(unsigned device) { return (int)(device & (NDEV - 1)); } /* as gr_pk_w1 packs it */

static inline void max_into(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);
  while (v > p && !atomic_compare_exchange_weak_explicit(peak, &p, v, memory_order_relaxed, memory_order_relaxed))
    ;
}

/* Adds bytes to device d's committed live bytes and raises the peaks. */
static void commit_add(int d, uint64_t bytes) {
  uint64_t v = atomic_fetch_add_explicit(&g_dev[d].live_bytes, bytes, memory_order_relaxed) + bytes;
  max_into(&g_dev[d].peak, v);
  uint64_t bit = d < GR_MAX_DEV ? UINT64_C(1) << d : 0;
  uint64_t mask = atomic_load_explicit(&g_devmask, memory_order_relaxed);
  if (GR_UNLIKELY(bit && !(mask & bit))) {
    mask = atomic_fetch_or_explicit(&g_devmask, bit, memory_order_relaxed) | bit;
    if (mask & (mask - 1) && !atomic_exchange_explicit(&g_used_devices_mask_set, 1, memory_order_relaxed)) {
      /* A second device: from now on keep a process total (it starts as the sum of the devices). */
      uint64_t sum = 0;
      for (int i = 0; i < NDEV; i++)
        if (i != d)
          sum += atomic_load_explicit(&g_dev[i].live_bytes, memory_order_relaxed);
      atomic_fetch_add_explicit(&g_total_live, sum, memory_order_relaxed);
    }
  }
  if (atomic_load_explicit(&g_used_devices_mask_set, memory_order_relaxed))
    max_into(&g_total_peak, atomic_fetch_add_explicit(&g_total_live, bytes, memory_order_relaxed) + bytes);
}

static void commit_sub(int d, uint64_t bytes) {
  atomic_fetch_sub_explicit(&g_dev[d].live_bytes, bytes, memory_order_relaxed);
  if (atomic_load_explicit(&g_used_devices_mask_set, memory_order_relaxed))
    atomic_fetch_sub_explicit(&g_total_live, bytes, memory_order_relaxed);
}

static inline void live_add(int d, uint64_t bytes) {
  shard_t *s = my_shard();
  if (GR_UNLIKELY(!s)) {
    commit_add(d, bytes);
    return;
  }
  int64_t p = atomic_load_explicit(&s->d[d].pending, memory_order_relaxed) + (int64_t)bytes;
  if (GR_LIKELY(p <= 0)) {
    atomic_store_explicit(&s->d[d].pending, p, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&s->d[d].pending, 0, memory_order_relaxed);
  commit_add(d, (uint64_t)p);
}

static inline void live_sub(int d, uint64_t bytes) {
  shard_t *s = my_shard();
  if (GR_UNLIKELY(!s)) {
    commit_sub(d, bytes);
    return;
  }
  int64_t p = atomic_load_explicit(&s->d[d].pending, memory_order_relaxed) - (int64_t)bytes;
  if (GR_LIKELY(p >= PENDING_FLOOR)) {
    atomic_store_explicit(&s->d[d].pending, p, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&s->d[d].pending, 0, memory_order_relaxed);
  commit_sub(d, (uint64_t)-p);
}

/* The hot path's counts: a device block in a thread with a record touches one count and its pending bytes. */
static inline bool dev_fast(gr_thread_rec_t *t, unsigned kind, shard_t **sp) {
  *sp = t ? shard_of(t) : NULL;
  const unsigned other = 1u << GPURECLAIM_KIND_HOST | 1u << GPURECLAIM_KIND_VA | 1u << GPURECLAIM_KIND_VMM_MAPPING;
  return GR_LIKELY(*sp != NULL) && GR_LIKELY(!((other >> kind) & 1));
}

GR_HOT_INLINE void gr_stats_alloc_pk(const gr_packed_t *p) {
  gr_stats_alloc_v(p, gr_pk_kind(p), gr_pk_device(p), gr_pk_size(p));
}

GR_HOT_INLINE void gr_stats_alloc_v(const gr_packed_t *p, unsigned kind, unsigned device, uint64_t size) {
  gr_stats_alloc_t(gr_epoch_t_rec, p, kind, device, size);
}

GR_HOT_INLINE void gr_stats_alloc_t(gr_thread_rec_t *t, const gr_packed_t *p, unsigned kind, unsigned device,
                                    uint64_t size) {
  shard_t *s;
  if (GR_LIKELY(dev_fast(t, kind, &s))) {
    int d = dev_index(device);
    if (GR_UNLIKELY(gr_limit_on()))
      gr_limit_counted((unsigned)d, size);
    atomic_store_explicit(&s->d[d].c[C_DEV_ALLOCS], atomic_load_explicit(&s->d[d].c[C_DEV_ALLOCS], memory_order_relaxed) + 1,
                          memory_order_relaxed);
    int64_t v = atomic_load_explicit(&s->d[d].pending, memory_order_relaxed) + (int64_t)size;
    if (GR_LIKELY(v <= 0)) {
      atomic_store_explicit(&s->d[d].pending, v, memory_order_relaxed);
      return;
    }
    atomic_store_explicit(&s->d[d].pending, 0, memory_order_relaxed);
    commit_add(d, (uint64_t)v);
    return;
  }
  gr_rec_t r;
  gr_pk_unpack(p, &r);
  gr_stats_alloc(&r);
}

GR_HOT_INLINE void gr_stats_free_pk(const gr_packed_t *p) { gr_stats_free_t(gr_epoch_t_rec, p); }

GR_HOT_INLINE void gr_stats_free_t(gr_thread_rec_t *t, const gr_packed_t *p) {
  shard_t *s;
  unsigned st = gr_pk_state(p);
  if (GR_LIKELY(dev_fast(t, gr_pk_kind(p), &s)) &&
      GR_LIKELY(!((GR_STMASK(GR_ST_ORPHAN) | GR_STMASK(GR_ST_RECLAIMING)) >> st & 1))) {
    int d = dev_index(gr_pk_device(p));
    if (GR_UNLIKELY(gr_limit_on()))
      gr_limit_uncounted((unsigned)d, gr_pk_size(p));
    atomic_store_explicit(&s->d[d].c[C_DEV_FREES], atomic_load_explicit(&s->d[d].c[C_DEV_FREES], memory_order_relaxed) + 1,
                          memory_order_relaxed);
    int64_t v = atomic_load_explicit(&s->d[d].pending, memory_order_relaxed) - (int64_t)gr_pk_size(p);
    if (GR_LIKELY(v >= PENDING_FLOOR)) {
      atomic_store_explicit(&s->d[d].pending, v, memory_order_relaxed);
      return;
    }
    atomic_store_explicit(&s->d[d].pending, 0, memory_order_relaxed);
    commit_sub(d, (uint64_t)-v);
    return;
  }
  gr_rec_t r;
  gr_pk_unpack(p, &r);
  gr_stats_free(&r);
}

void gr_stats_alloc(const gr_rec_t *r) {
  int d = dev_index(r->device);
  switch (r->kind) {
  case GPURECLAIM_KIND_HOST:
    add(d, C_HOST_IN, 1);
    add(d, C_HOST_BYTES_IN, r->size);
    break;
  case GPURECLAIM_KIND_VA:
    add(d, C_VA_ALLOCS, 1);
    add(d, C_VA_IN, r->size);
    break;
  case GPURECLAIM_KIND_VMM_MAPPING:
    add(d, C_MAP_ALLOCS, 1);
    add(d, C_MAP_IN, r->size);
    break;
  default:
    add(d, C_DEV_ALLOCS, 1);
    if (GR_UNLIKELY(gr_limit_on()))
      gr_limit_counted((unsigned)d, r->size);
    live_add(d, r->size);
  }
}

static void gone(const gr_rec_t *r, bool counted_as_free) {
  int d = dev_index(r->device);
  if (GR_UNLIKELY(r->state == GR_ST_ORPHAN || r->state == GR_ST_RECLAIMING))
    gr_stats_orphaned(r, -1);
  switch (r->kind) {
  case GPURECLAIM_KIND_HOST:
    add(d, C_HOST_OUT, 1); /* a pinned block leaves only by a free or with its context */
    add(d, C_HOST_BYTES_OUT, r->size);
    break;
  case GPURECLAIM_KIND_VA:
    add(d, C_VA_FREES, 1);
    add(d, C_VA_OUT, r->size);
    break;
  case GPURECLAIM_KIND_VMM_MAPPING:
    add(d, C_MAP_FREES, 1);
    add(d, C_MAP_OUT, r->size);
    break;
  default:
    if (counted_as_free)
      add(d, C_DEV_FREES, 1);
    if (GR_UNLIKELY(gr_limit_on()))
      gr_limit_uncounted((unsigned)d, r->size);
    live_sub(d, r->size);
  }
}

void gr_stats_free(const gr_rec_t *r) { gone(r, true); }

void gr_stats_ctx_destroyed(const gr_rec_t *r) {
  gone(r, false);
  if (r->kind == GPURECLAIM_KIND_HOST) /* left with its context: not a free */
    atomic_fetch_add_explicit(&g_dev[dev_index(r->device)].ctxd_host, 1, memory_order_relaxed);
  if (gr_kind_is_device_memory(r->kind)) {
    int d = dev_index(r->device);
    atomic_fetch_add_explicit(&g_dev[d].ctxd_blocks, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_dev[d].ctxd_bytes, r->size, memory_order_relaxed);
  }
}

void gr_stats_orphaned(const gr_rec_t *r, int delta) {
  if (!gr_kind_is_device_memory(r->kind) && r->kind != GPURECLAIM_KIND_HOST)
    return;
  int d = dev_index(r->device);
  if (delta > 0) {
    atomic_fetch_add_explicit(&g_dev[d].orphan_blocks, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_dev[d].orphan_bytes, r->size, memory_order_relaxed);
  } else {
    atomic_fetch_sub_explicit(&g_dev[d].orphan_blocks, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&g_dev[d].orphan_bytes, r->size, memory_order_relaxed);
  }
}

void gr_stats_untracked_free(void) { atomic_fetch_add_explicit(&g_untracked_frees, 1, memory_order_relaxed); }
void gr_stats_late_free(void) { atomic_fetch_add_explicit(&g_late_frees, 1, memory_order_relaxed); }
void gr_stats_release(uint64_t bytes) {
  atomic_fetch_add_explicit(&g_releases, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_released_bytes, bytes, memory_order_relaxed);
}
static _Atomic uint64_t g_peer_asks, g_peer_ask_ok, g_peer_received, g_peer_gives, g_peer_given;
void gr_stats_peer_ask(bool ok, uint64_t received) {
  atomic_fetch_add_explicit(&g_peer_asks, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_peer_received, received, memory_order_relaxed);
  if (ok)
    atomic_fetch_add_explicit(&g_peer_ask_ok, 1, memory_order_relaxed);
}
void gr_stats_peer_give(uint64_t given) {
  atomic_fetch_add_explicit(&g_peer_gives, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_peer_given, given, memory_order_relaxed);
}
void gr_stats_oom_retry(bool ok) {
  atomic_fetch_add_explicit(&g_oom_retries, 1, memory_order_relaxed);
  if (ok)
    atomic_fetch_add_explicit(&g_oom_ok, 1, memory_order_relaxed);
}

/* ---- reading ---- */

static uint64_t sum(int d, int c) {
  uint64_t v = atomic_load_explicit(&g_norec.d[d].c[c], memory_order_relaxed);
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next)
    v += atomic_load_explicit(&shard_of(r)->d[d].c[c], memory_order_relaxed);
  return v;
}

typedef struct pool_sum {
  int device;
  uint64_t reserved, used, count;
} pool_sum_t;

typedef struct ctx_count {
  int device;
  uint64_t n;
} ctx_count_t;

static void count_ctx(uint16_t id, CUcontext ctx, int device, void *arg) {
  (void)id, (void)ctx;
  ctx_count_t *c = arg;
  c->n += device == c->device;
}

static void add_pool(uint16_t id, CUmemoryPool pool, int device, void *arg) {
  (void)id;
  pool_sum_t *ps = arg;
  if (ps->device >= 0 && device != ps->device)
    return;
  ps->count++;
  if (!gr_gate_driver_begin())
    return; /* asleep: the pools hold nothing on the device, and the driver cannot be asked */
  cuuint64_t v = 0;
  if (gr_drv.cuMemPoolGetAttribute &&
      gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS)
    ps->reserved += v;
  v = 0;
  if (gr_drv.cuMemPoolGetAttribute &&
      gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v) == CUDA_SUCCESS)
    ps->used += v;
  gr_gate_leave(); /* counted in flight meanwhile: a sleep locks only after */
}

/* Committed plus every thread's pending change. */
static uint64_t live_bytes(int d) {
  int64_t v = (int64_t)atomic_load_explicit(&g_dev[d].live_bytes, memory_order_relaxed);
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next)
    v += atomic_load_explicit(&shard_of(r)->d[d].pending, memory_order_relaxed);
  return v < 0 ? 0 : (uint64_t)v; /* read mid-update */
}

int gr_stats_get(int device, gpureclaim_stats_t *out) {
  gpureclaim_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  int lo = device < 0 ? 0 : device, hi = device < 0 ? NDEV - 1 : device;
  for (int d = lo; d <= hi; d++) {
    uint64_t allocs = sum(d, C_DEV_ALLOCS), frees = sum(d, C_DEV_FREES);
    uint64_t ctxd = atomic_load_explicit(&g_dev[d].ctxd_blocks, memory_order_relaxed);
    s.live_blocks += allocs - frees - ctxd;
    s.live_bytes += live_bytes(d);
    s.total_allocs += allocs + sum(d, C_HOST_IN) + sum(d, C_VA_ALLOCS) + sum(d, C_MAP_ALLOCS);
    s.total_frees += frees + sum(d, C_VA_FREES) + sum(d, C_MAP_FREES) + sum(d, C_HOST_OUT) -
                     atomic_load_explicit(&g_dev[d].ctxd_host, memory_order_relaxed);
    s.va_reserved_bytes += sum(d, C_VA_IN) - sum(d, C_VA_OUT);
    s.vmm_mapped_bytes += sum(d, C_MAP_IN) - sum(d, C_MAP_OUT);
    s.orphan_blocks += atomic_load_explicit(&g_dev[d].orphan_blocks, memory_order_relaxed);
    s.orphan_bytes += atomic_load_explicit(&g_dev[d].orphan_bytes, memory_order_relaxed);
    s.ctx_destroyed_blocks += ctxd;
    s.ctx_destroyed_bytes += atomic_load_explicit(&g_dev[d].ctxd_bytes, memory_order_relaxed);
  }
  if (device < 0) {
    s.host_pinned_blocks = sum(SLOT_NONE, C_HOST_IN) - sum(SLOT_NONE, C_HOST_OUT);
    s.host_pinned_bytes = sum(SLOT_NONE, C_HOST_BYTES_IN) - sum(SLOT_NONE, C_HOST_BYTES_OUT);
    if (atomic_load_explicit(&g_used_devices_mask_set, memory_order_relaxed))
      s.peak_bytes = atomic_load_explicit(&g_total_peak, memory_order_relaxed);
    else
      for (int d = 0; d < NDEV; d++)
        s.peak_bytes += atomic_load_explicit(&g_dev[d].peak, memory_order_relaxed);
    s.untracked_frees = atomic_load_explicit(&g_untracked_frees, memory_order_relaxed);
    s.late_frees = atomic_load_explicit(&g_late_frees, memory_order_relaxed);
    s.releases = atomic_load_explicit(&g_releases, memory_order_relaxed);
    s.released_bytes = atomic_load_explicit(&g_released_bytes, memory_order_relaxed);
    s.oom_retries = atomic_load_explicit(&g_oom_retries, memory_order_relaxed);
    s.oom_retry_successes = atomic_load_explicit(&g_oom_ok, memory_order_relaxed);
    s.untracked_routes = atomic_load_explicit(&gr_untracked_routes, memory_order_relaxed);
    s.peer_reclaims = atomic_load_explicit(&g_peer_asks, memory_order_relaxed);
    s.peer_reclaim_successes = atomic_load_explicit(&g_peer_ask_ok, memory_order_relaxed);
    s.peer_received_bytes = atomic_load_explicit(&g_peer_received, memory_order_relaxed);
    s.peer_gives = atomic_load_explicit(&g_peer_gives, memory_order_relaxed);
    s.peer_given_bytes = atomic_load_explicit(&g_peer_given, memory_order_relaxed);
    s.table_bytes = gr_table_bytes();
    s.contexts = gr_reg_ctx_count();
    s.pools = gr_reg_pool_count();
  } else {
    s.peak_bytes = atomic_load_explicit(&g_dev[device].peak, memory_order_relaxed);
    ctx_count_t cc = {device, 0};
    gr_reg_foreach_ctx(count_ctx, &cc);
    s.contexts = cc.n;
  }
  pool_sum_t ps = {device, 0, 0, 0};
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1)
    gr_reg_foreach_pool(add_pool, &ps);
  s.pool_reserved_bytes = ps.reserved;
  s.pool_used_bytes = ps.used;
  if (device >= 0)
    s.pools = ps.count;
  /* Sums of relaxed counters can be read mid-update; never report a transient underflow. */
  if ((int64_t)s.live_blocks < 0)
    s.live_blocks = 0;
  size_t n = out->size < sizeof s ? out->size : sizeof s;
  size_t keep = out->size;
  memcpy(out, &s, n);
  out->size = keep < sizeof s ? keep : sizeof s;
  return 0;
}

void gr_stats_atfork_child(void) {
  memset(g_dev, 0, sizeof g_dev);
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next) /* (the records themselves: epoch.c) */
    memset((void *)shard_of(r), 0, sizeof(shard_t));
  memset((void *)&g_norec, 0, sizeof g_norec);
  atomic_store(&g_devmask, 0);
  atomic_store(&g_used_devices_mask_set, 0);
  atomic_store(&g_total_live, 0);
  atomic_store(&g_total_peak, 0);
  atomic_store(&g_untracked_frees, 0);
  atomic_store(&g_late_frees, 0);
  atomic_store(&g_releases, 0);
  atomic_store(&g_released_bytes, 0);
  atomic_store(&g_oom_retries, 0);
  atomic_store(&g_oom_ok, 0);
  atomic_store(&g_peer_asks, 0);
  atomic_store(&g_peer_ask_ok, 0);
  atomic_store(&g_peer_received, 0);
  atomic_store(&g_peer_gives, 0);
  atomic_store(&g_peer_given, 0);
}
