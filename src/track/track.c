/*
 * track.c -- what a hook does with a block: fill its record, insert it, take it out before a free, put it
 * back when the driver refused the free, and drop a destroyed context's blocks.
 *
 * Destroying a context (cuCtxDestroy, cuDevicePrimaryCtxReset, the final cuDevicePrimaryCtxRelease) frees its
 * blocks inside the driver call, and the driver may hand their addresses to other allocations at once. A record
 * must outlive its block nowhere: a record left for a freed block becomes an orphan whose address belongs to
 * someone else by the time a release frees it. So, under the context lock (gr_track_ctxlock_enter, below),
 * a destroy
 *   1. makes the destroy sequence odd (gr_track_seq), then marks every record of the context DETACHING (aux)
 *      in place, leaving it in the table, so that a free of the block that races the destroy still finds it
 *      and is a tracked free: a refused destroy then has nothing to put back for a block the program freed;
 *   2. calls the driver;
 *   3. commits: deletes the marked records when the context went (and notes the sequence number against the
 *      context), or clears the mark when the driver refused; then makes the sequence even again.
 * (A primary release is known to be the final one only after the driver call: step 1 makes the sequence odd
 * before it, and marks after it.)
 * While a record is marked, an allocation that gets its address from the driver proves the block gone and
 * deletes it (key_reused), so two records never share an address. A free reads the sequence before it
 * takes its record (one load); when the driver refused it and a destroy of its context overlapped, the record
 * does not come back: the destroy may have freed the block (gr_track_restore_ctx).
 * An allocation in the context whose driver call returned before the destroy but whose record is inserted
 * after step 1 looked at the table would leave a record for a freed block. Each allocation reads the sequence
 * before its driver call (seq0, one load) and again just before and just after its insert; when it changed or
 * was odd (a destroy overlapped), it waits for a destroy of its own context under way to end (never for
 * another context's: destroyed_since) and drops its record if its own context was destroyed at or after seq0.
 * The reads around the insert pair with the barrier after step 1's increment (the table's asymmetric barrier,
 * see table.c): either the marking sees the record, or the allocation sees the change. Until an allocation
 * that the marking missed has dropped its record, the destroy's watch stays raised ("Lingering" below), so
 * that an allocation that gets the same address meanwhile takes the stale record out first.
 *
 * Lingering. A destroy's watch (gr_track_watch) makes every allocation look for a stale record at the address
 * the driver gave it (key_reused). An insert the destroy's marking missed leaves a record for a freed
 * block until its own thread finds and drops it (settle_slow); were the watch lowered before that, a thread of
 * another context that gets the address from the driver would insert beside the stale record, and its free
 * could take the stale one and leave its own for freed memory. So each insert of an address record publishes
 * the sequence number it read before its driver call in its thread's record (track_op) while it runs, and a
 * destroy that commits while an insert that began before it is under way keeps its watch (g_linger); the
 * first allocation after the last such insert ended lowers it (gr_track_linger_check).
 * Why the destroy sees every insert it must: an insert its marking missed came after the barrier that follows
 * the destroy's increment (gr_track_ctx_begin). Had the insert's publication come after that barrier too, the
 * insert's check before the table insert would have seen the increment and waited for the destroy instead.
 * So the publication came before the barrier, which makes it visible to the commit.
 * An insert reads gr_epoch_asym once (asym) and uses that answer for every step (its publication, its log
 * operation, the read after it): it changes only when membarrier stops working (epoch.c), and an insert already
 * under way then is as safe as the fence of that change makes it, whichever steps it had taken.
 *
 * Stale records and young logs. The search for a stale record at a new block's address (key_reused_slow) runs
 * on every allocation while tombstones exist, and must not drain the logs of young records each time
 * (GR_NOT_YOUNG). Tombstones, RECLAIMING and DETACHING records are never young (a release and a destroy drain
 * the logs before they claim or mark); a stale live record still in a log (a block freed where no hook saw it)
 * is left as it would be were the watch down. Except while a destroy runs or lingers: a record its marking
 * missed (Lingering) is young, in its allocating thread's log until that thread drops it, and must leave before
 * the new block's record goes in, or a free of the new block that drains the logs may take the stale record and
 * leave its own for freed memory. The sequence is read first (acquire): a commit stores g_linger before it makes
 * the sequence even. Destroys are rare; a drain sets the owners' cool-down.
 */
#include "track.h"
#include "registry.h"
#include "limit.h"
#include "real.h"
#include "stats.h"
#include "stacks.h"
#include "scope.h"
#include "tick.h"
#include "names.h"
#include "options.h"
#include "state.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- tombstones, the watch, the context lock ---- */

/* RECLAIMED tombstones in the table, per key space: addresses (GR_KS_ADDR) and VMM handles (GR_KS_HANDLE).
 * Each has its own bound: a driver that never hands a handle value out again leaves handle tombstones in place
 * for good, and they must not use up the addresses' room. docs/LIBRARY.md and gpureclaim.h state the bounds. */
static _Atomic uint64_t g_reclaimed[2];
static const uint64_t k_max_reclaimed[2] = {65536, 4096};
/* Release rounds and context destroys in progress (gr_track_watch); next to g_reclaimed, read with it. */
static _Atomic uint64_t g_watch;

void gr_track_watch(int d) {
  if (d > 0) {
    atomic_fetch_add_explicit(&g_watch, 1, memory_order_seq_cst);
  } else {
    uint64_t was = atomic_fetch_sub_explicit(&g_watch, 1, memory_order_release);
    GR_ASSERT(was > 0);
    (void)was;
  }
}

bool gr_track_tombstone_add(unsigned ks) {
  if (ks != GR_KS_ADDR && ks != GR_KS_HANDLE)
    return false;
  if (atomic_fetch_add_explicit(&g_reclaimed[ks], 1, memory_order_relaxed) < k_max_reclaimed[ks])
    return true;
  atomic_fetch_sub_explicit(&g_reclaimed[ks], 1, memory_order_relaxed);
  return false;
}

void gr_track_tombstone_gone(unsigned ks) {
  uint64_t was = atomic_fetch_sub_explicit(&g_reclaimed[ks], 1, memory_order_relaxed);
  GR_ASSERT(was > 0);
  (void)was;
}

/* The driver handed (ks, key) out to a new block, so no earlier block has that address any more: a record
 * still there is of a block the driver freed. A RECLAIMED tombstone, a RECLAIMING record whose free the
 * release has made (it then leaves no tombstone), a block of a context being destroyed (DETACHING): each
 * leaves now, before the new block's record goes in. Called by every tracked allocation (gr_track_insert): one
 * load of each counter unless tombstones exist or a release or destroy runs. Those set their counter before
 * their driver call, and the allocation follows that call (the driver handed out what it freed), so it sees
 * them. */
static _Atomic uint64_t g_linger;

GR_COLD static void key_reused_slow(unsigned ks, uint64_t key) {
  /* GR_NOT_YOUNG unless a destroy runs or lingers: "Stale records and young logs", file head. */
  bool destroying = (atomic_load_explicit(&gr_track_seq, memory_order_acquire) & 1) ||
                    atomic_load_explicit(&g_linger, memory_order_acquire) != 0;
  const unsigned stale = GR_STMASK(GR_ST_RECLAIMED) | GR_STMASK(GR_ST_RECLAIMING) | GR_STMASK(GR_ST_LIVE) |
                         GR_STMASK(GR_ST_ORPHAN) | (destroying ? 0u : GR_NOT_YOUNG);
  gr_track_linger_check();
  gr_rec_t r;
  for (int n = 0; n < 8 && gr_table_take(ks, key, stale, &r) == 0; n++) {
    if (r.state == GR_ST_RECLAIMED)
      gr_track_tombstone_gone(ks);
    else if (r.state == GR_ST_RECLAIMING)
      continue; /* the release counts it */
    else if (r.aux == GR_AUX_DETACHING && ks == GR_KS_ADDR)
      gr_stats_ctx_destroyed(&r), gr_scope_unref(r.scope);
    else
      gr_track_freed(&r); /* freed behind gpureclaim's back */
  }
}

static inline void key_reused(unsigned ks, uint64_t key) {
  /* g_watch first, with acquire: a round's end (its release decrement) then makes the tombstones it counted
   * visible to the second load. The other order could read the tombstone count from before the round and the
   * watch from after it, and leave a tombstone beside the new block (whose double free would then pass as a
   * late free). */
  if (GR_LIKELY(atomic_load_explicit(&g_watch, memory_order_acquire) == 0 &&
                atomic_load_explicit(&g_reclaimed[ks], memory_order_relaxed) == 0))
    return;
  key_reused_slow(ks, key);
}

static pthread_mutex_t g_ctxlock = PTHREAD_MUTEX_INITIALIZER;
static GR_TLS unsigned t_ctxlock;

void gr_track_ctxlock_enter(void) {
  GR_ASSERT(t_ctxlock < 64); /* re-entered per thread, never without bound */
  if (t_ctxlock++ == 0)
    pthread_mutex_lock(&g_ctxlock);
}

void gr_track_ctxlock_exit(void) {
  GR_ASSERT(t_ctxlock > 0);
  if (--t_ctxlock == 0)
    pthread_mutex_unlock(&g_ctxlock);
}

bool gr_track_ctxlock_held(void) { return t_ctxlock != 0; }

/* ---- a block's life ---- */

void gr_track_fill(gr_rec_t *r, unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra) {
  memset(r, 0, sizeof *r);
  r->key = key;
  r->size = size > GR_SIZE_MAX ? GR_SIZE_MAX : size;
  r->kind = (uint8_t)kind;
  r->state = GR_ST_LIVE;
  r->device = GR_DEVICE_NONE;
  r->time_ms = gr_tick_now_ms(); /* the worker's tick: no clock read per allocation */
  r->tid = gr_state_tid();
  uintptr_t pc = ra;
  r->api = (uint8_t)driver_api;
  if (gr_tls.rt_depth) { /* inside a runtime call: attribute the block to the runtime call and its caller */
    pc = gr_tls.rt_caller;
    r->api = (uint8_t)gr_tls.rt_api;
  }
  r->site = gr_opt_backtrace() ? gr_stack_capture(pc) : gr_site_at(pc);
  if (kind != GPURECLAIM_KIND_VMM_MAPPING && kind != GPURECLAIM_KIND_VA)
    r->scope = gr_scope_tag();
}

/* The out-of-line steps of an insert, each given its own copy of the record: the hot path's copy never has its
 * address taken, so it stays in registers. */
GR_COLD static int insert_ks_copy(gr_packed_t p, unsigned ks) { return gr_table_insert_ks(&p, ks); }
GR_COLD static void scope_note_copy(gr_packed_t p) {
  gr_rec_t r;
  gr_pk_unpack(&p, &r);
  gr_scope_note(&r);
}

/* Inserts p and counts it: what gr_track_insert does, on the record as the slot holds it. kind, device and size:
 * p's (device as packed), from the caller's registers: the fences of the insert make the compiler read p again
 * after them, and the kind it decodes there would not fold to the hook's constant. */
static GR_HOT_INLINE void insert_pk_v(gr_thread_rec_t *t, gr_packed_t p, unsigned kind, unsigned device,
                                       uint64_t size, unsigned scope, bool young, bool asym) {
  unsigned ks = gr_kind_keyspace(kind);
  if (ks == GR_KS_ADDR || ks == GR_KS_HANDLE)
    key_reused(ks, p.key); /* a freed orphan's address (handle) is back: late frees of it are this one's */
  /* A new block's record goes to its thread's log of young records (table.h), unless a scope lists it. */
  int rc = young && ks == GR_KS_ADDR && !scope ? gr_table_insert_young_v(t, p, asym) : insert_ks_copy(p, ks);
  if (GR_UNLIKELY(rc != 0)) {
    gr_warn_once(w_nomem, "no memory for the block table: new blocks are not tracked until memory frees up");
    gr_scope_unref((uint16_t)scope);
    if (gr_limit_on())
      gr_limit_end(); /* not counted: what its allocation held under GPURECLAIM_LIMIT goes back */
    return;
  }
  if (GR_UNLIKELY(scope))
    scope_note_copy(p);
  gr_stats_alloc_t(t, &p, kind, device, size);
}

static GR_HOT_INLINE void insert_pk(const gr_packed_t *p) {
  insert_pk_v(gr_epoch_t_rec, *p, gr_pk_kind(p), gr_pk_device(p), gr_pk_size(p), gr_pk_scope(p), false, false);
}

void gr_track_insert(gr_rec_t *r) {
  gr_packed_t p;
  gr_pk_pack(r, &p);
  insert_pk(&p);
}

/* Whether the driver knows VMM handle h now: a value a release freed can be live again without cuMemCreate
 * (cuMemImportFromShareableHandle), or still live by a reference the program took (cuMemRetainAllocationHandle):
 * then cuMemRelease is the program's own, for the driver. Unknown (no such entry point): not live. */
static bool handle_live(uint64_t h) {
  CUmemAllocationProp prop;
  return gr_drv.cuMemGetAllocationPropertiesFromHandle &&
         gr_drv.cuMemGetAllocationPropertiesFromHandle(&prop, (CUmemGenericAllocationHandle)h) == CUDA_SUCCESS;
}

bool gr_track_late_free(unsigned ks, uint64_t key) {
  /* A block a release freed (or is freeing) must not be freed again by the driver. RECLAIMING is looked for
   * before RECLAIMED, the order in which a release moves the record: the other order misses a record that
   * moves between the two looks, and the free reached the driver a second time (test_release's race). */
  bool consumed = false;
  if ((ks != GR_KS_ADDR && ks != GR_KS_HANDLE) ||
      !(gr_table_lookup(ks, key, GR_STMASK(GR_ST_RECLAIMING), NULL) == 0 ||
        (consumed = gr_table_take(ks, key, GR_STMASK(GR_ST_RECLAIMED), NULL) == 0)))
    return false;
  if (consumed)
    gr_track_tombstone_gone(ks);
  if (consumed && ks == GR_KS_HANDLE && handle_live(key))
    return false;
  gr_stats_late_free();
  gr_warn_once(w_late, "the program freed %#llx, which a release had already freed as an orphan; the free was "
                       "not passed to the driver (further late frees are counted in late_frees)",
               (unsigned long long)key);
  return true;
}

GR_HOT_INLINE int gr_track_take_pk(unsigned ks, uint64_t key, unsigned kind_mask, gr_packed_t *out) {
  if (GR_LIKELY(gr_table_take_kind_pk(ks, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), kind_mask, out) ==
                0))
    return 1;
  if (gr_track_late_free(ks, key))
    return -1;
  /* The driver may have handed the address out again meanwhile (a late free racing another thread's
   * allocation, which consumed the tombstone): this free is then a free of that block, record included, or
   * its record would outlive it. */
  if (gr_table_take_kind_pk(ks, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), kind_mask, out) == 0)
    return 1;
  gr_stats_untracked_free();
  return 0;
}

int gr_track_take(unsigned ks, uint64_t key, unsigned kind_mask, gr_rec_t *out) {
  gr_packed_t p;
  int rc = gr_track_take_pk(ks, key, kind_mask, &p);
  if (rc > 0)
    gr_pk_unpack(&p, out);
  return rc;
}

void gr_track_freed(const gr_rec_t *r) {
  gr_stats_free(r);
  gr_scope_unref(r->scope);
}

GR_HOT_INLINE void gr_track_freed_pk(const gr_packed_t *p) {
  gr_stats_free_pk(p);
  if (GR_UNLIKELY(gr_pk_scope(p)))
    gr_scope_unref((uint16_t)gr_pk_scope(p));
}

void gr_track_restore(const gr_rec_t *r) {
  /* The driver refused the free: the block is still there. Its counts never changed. */
  gr_packed_t p;
  gr_pk_pack(r, &p);
  if (gr_table_insert_pk(&p) != 0)
    gr_warn_once(w_restore, "no memory to keep tracking a block whose free the driver refused");
  else if (r->scope)
    gr_scope_note(r); /* its scope's list may have dropped it while it was out of the table */
}

/* ---- VMM handles and mappings ----
 * The physical memory of a handle lives while the handle is unreleased or mapped: its record's aux counts its
 * mappings, and a released handle that is still mapped stays in the table as RELEASED until its last unmap. */

static bool edit_release(gr_rec_t *r, void *arg) {
  (void)arg;
  if (r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN)
    return false;
  r->state = r->aux ? GR_ST_RELEASED : GR_ST_DELETED;
  return true;
}

static bool edit_unrelease(gr_rec_t *r, void *arg) {
  if (r->state != GR_ST_RELEASED)
    return false;
  r->state = *(uint8_t *)arg;
  return true;
}

static bool edit_map_count(gr_rec_t *r, void *arg) {
  int d = *(int *)arg;
  if (d > 0) {
    if (r->aux == 255) {
      gr_warn_once(w_sat, "a VMM handle is mapped more than 255 times; its memory is counted until release");
      return false;
    }
    r->aux++;
    return true;
  }
  if (r->aux == 0)
    return false;
  r->aux--;
  if (r->aux == 0 && r->state == GR_ST_RELEASED)
    r->state = GR_ST_DELETED; /* released and no longer mapped: the driver frees the memory now */
  return true;
}

int gr_track_vmm_release_begin(uint64_t handle, gr_rec_t *before) {
  if (gr_table_update(GR_KS_HANDLE, handle, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), edit_release, NULL,
                      before) == 0)
    return 1;
  if (gr_track_late_free(GR_KS_HANDLE, handle))
    return -1; /* a release freed this orphan's memory already: as a late cuMemFree */
  gr_stats_untracked_free();
  return 0;
}

void gr_track_vmm_release_end(const gr_rec_t *before, bool ok) {
  bool deleted = before->aux == 0;
  if (ok) {
    if (deleted)
      gr_track_freed(before);
  } else if (deleted) {
    gr_track_restore(before);
  } else {
    (void)gr_table_update(GR_KS_HANDLE, before->key, GR_STMASK(GR_ST_RELEASED), edit_unrelease,
                          (void *)&before->state, NULL);
  }
}

void gr_track_vmm_map(uint64_t ptr, uint64_t size, uint64_t handle, uintptr_t ra) {
  gr_rec_t h;
  int one = 1;
  bool known = gr_table_update(GR_KS_HANDLE, handle, GR_PRESENT_MASK, edit_map_count, &one, &h) == 0;
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_VMM_MAPPING, ptr, size, GR_API_cuMemMap, ra);
  r.map_handle = handle;
  r.device = known ? h.device : GR_DEVICE_NONE;
  gr_track_insert(&r);
}

void gr_track_unmapped(uint64_t handle) {
  gr_rec_t h;
  int minus = -1;
  if (gr_table_update(GR_KS_HANDLE, handle, GR_PRESENT_MASK, edit_map_count, &minus, &h) == 0 &&
      h.state == GR_ST_RELEASED && h.aux == 1)
    gr_track_freed(&h); /* that was the last mapping of a released handle */
}

/* One cuMemUnmap covers whole mappings: usually one, or several side by side, but any number, and the range may
 * also hold mappings gpureclaim has no record of (made before it loaded, or by a route it does not see). Each
 * tracked mapping in the range is taken before the driver call (the program may map the range again on another
 * thread as soon as the call returns: a take after it could take that new mapping's record) and settled after
 * it: gone, or put back when the driver refused. Side by side, each record's size leads to the next; past a gap,
 * visits of the table find the rest. Should the list outgrow the memory it can get, the records not taken stay
 * in the table until the call succeeds, then are taken (the narrow race above, only then). */
static bool unmap_keep(gr_unmap_t *u, const gr_rec_t *r) {
  if (u->n == u->cap) {
    unsigned cap = u->cap * 2;
    gr_rec_t *v = u->v == u->stack ? malloc(cap * sizeof *v) : realloc(u->v, cap * sizeof *v);
    if (!v) {
      u->short_of_memory = true;
      return false;
    }
    if (u->v == u->stack)
      memcpy(v, u->stack, sizeof u->stack);
    u->v = v;
    u->cap = cap;
  }
  u->v[u->n++] = *r;
  return true;
}

typedef struct {
  uint64_t lo, end;
  uint64_t keys[256];
  unsigned n;
  bool more; /* keys was full */
} in_range_t;

static int mapping_in_range(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  in_range_t *a = arg;
  if (r->kind != GPURECLAIM_KIND_VMM_MAPPING || r->key < a->lo || r->key >= a->end ||
      (r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN))
    return 0;
  if (a->n == GR_ARRAY_LEN(a->keys)) {
    a->more = true;
    return 1;
  }
  a->keys[a->n++] = r->key;
  return 0;
}

/* Takes every tracked mapping in [lo, end), by visits of the table; keep: into u (else settled as unmapped). */
static void take_in_range(gr_unmap_t *u, uint64_t lo, uint64_t end, bool keep) {
  in_range_t *a = malloc(sizeof *a);
  if (!a) {
    u->short_of_memory = true;
    return;
  }
  do {
    a->lo = lo;
    a->end = end;
    a->n = 0;
    a->more = false;
    gr_table_visit(mapping_in_range, a);
    for (unsigned i = 0; i < a->n; i++) {
      gr_rec_t r;
      if (gr_track_take(GR_KS_MAPPING, a->keys[i], 1u << GPURECLAIM_KIND_VMM_MAPPING, &r) <= 0)
        continue;
      if (!keep) {
        gr_track_freed(&r);
        gr_track_unmapped(r.map_handle);
      } else if (!unmap_keep(u, &r)) {
        gr_track_restore(&r); /* taken after the call instead */
        free(a);
        return;
      }
    }
  } while (a->more);
  free(a);
}

void gr_track_vmm_unmap_begin(gr_unmap_t *u, uint64_t ptr, uint64_t size) {
  u->ptr = ptr;
  u->end = size > UINT64_MAX - ptr ? UINT64_MAX : ptr + size;
  u->v = u->stack;
  u->n = 0;
  u->cap = GR_ARRAY_LEN(u->stack);
  u->short_of_memory = false;
  uint64_t p = ptr;
  gr_rec_t r;
  while (p < u->end && gr_track_take(GR_KS_MAPPING, p, 1u << GPURECLAIM_KIND_VMM_MAPPING, &r) > 0) {
    if (!unmap_keep(u, &r)) {
      gr_track_restore(&r);
      return;
    }
    if (r.size == 0)
      break;
    p += r.size;
  }
  if (p < u->end) /* a gap: a mapping gpureclaim has no record of, or none there */
    take_in_range(u, p, u->end, true);
}

void gr_track_vmm_unmap_end(gr_unmap_t *u, bool ok) {
  for (unsigned i = 0; i < u->n; i++) {
    if (!ok) {
      gr_track_restore(&u->v[i]);
      continue;
    }
    gr_track_freed(&u->v[i]);
    gr_track_unmapped(u->v[i].map_handle);
  }
  if (ok && u->short_of_memory)
    take_in_range(u, u->ptr, u->end, false);
  if (u->v != u->stack)
    free(u->v);
  u->v = u->stack;
  u->n = 0;
}

/* ---- context destroys ---- */

_Atomic uint64_t gr_track_seq;
/* Per context id: the (odd) sequence number of its last destroy that the driver carried out; 0 for none. */
static _Atomic uint64_t g_destroyed[4096];
/* The context whose destroy is under way while gr_track_seq is odd (destroys run one at a time, under the
 * context lock). */
static _Atomic uint16_t g_running;
/* A destroy's end, for threads that wait for the destroy of their own context. */
static pthread_mutex_t g_end_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_end_cv = PTHREAD_COND_INITIALIZER;
/* g_linger (declared above key_reused_slow): the sequence number of the last destroy whose watch outlives its
 * commit (see "Lingering"); 0 for none. */

GR_COLD static uint64_t wait_end(uint64_t s) {
  int old;
  (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old); /* never leave g_end_mu locked */
  pthread_mutex_lock(&g_end_mu);
  uint64_t now;
  while ((now = atomic_load_explicit(&gr_track_seq, memory_order_acquire)) == s)
    pthread_cond_wait(&g_end_cv, &g_end_mu);
  pthread_mutex_unlock(&g_end_mu);
  (void)pthread_setcancelstate(old, NULL);
  return now;
}

/* Whether the sequence number now says that the calling thread runs a destroy of ctx_id itself. */
static bool inside_destroy_of(uint16_t ctx_id, uint64_t now) {
  return (now & 1) && atomic_load_explicit(&g_running, memory_order_acquire) == ctx_id && gr_track_ctxlock_held();
}

/* Whether the context ctx_id was destroyed by a destroy that may have come after a driver call made once the
 * sequence read seq0: then a block that call returned is gone. Waits for a destroy of ctx_id under way (on
 * another thread) to end, and for no other: an allocation never waits for another context's destroy, whose
 * driver call may wait for work this thread has yet to enqueue. *now: the sequence the answer holds for, odd
 * while another context's destroy runs (which cannot free this context's blocks). */
static bool destroyed_since(uint16_t ctx_id, uint64_t seq0, uint64_t *now) {
  uint64_t s = atomic_load_explicit(&gr_track_seq, memory_order_acquire);
  while ((s & 1) && atomic_load_explicit(&g_running, memory_order_acquire) == ctx_id && !gr_track_ctxlock_held())
    s = wait_end(s);
  uint64_t d = atomic_load_explicit(&g_destroyed[ctx_id & 0xfff], memory_order_acquire);
  *now = s;
  return d != 0 && d >= seq0;
}

/* An insert publishes the sequence it read before its driver call while it runs, for a destroy that commits
 * meanwhile ("Lingering", file head); it reads gr_epoch_asym once and uses that answer for every step. t: the
 * thread's record as read, NULL to take one now. */
static inline bool asym_now(void) { return atomic_load_explicit(&gr_epoch_asym, memory_order_relaxed) != 0; }

static inline gr_thread_rec_t *op_begin(gr_thread_rec_t *t, uint64_t seq0, bool asym) {
  if (GR_UNLIKELY(!t) && !(t = gr_epoch_self())) {
    gr_epoch_track_op_anon(1);
    return NULL;
  }
  if (GR_LIKELY(asym)) {
    atomic_store_explicit(&t->track_op, seq0 + 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst); /* the destroy's membarrier supplies the hardware fence */
  } else {
    atomic_exchange_explicit(&t->track_op, seq0 + 1, memory_order_seq_cst);
  }
  return t;
}

static inline void op_end(gr_thread_rec_t *t) {
  if (GR_LIKELY(t != NULL))
    atomic_store_explicit(&t->track_op, 0, memory_order_release);
  else
    gr_epoch_track_op_anon(-1);
}

void gr_track_linger_check(void) {
  uint64_t s = atomic_load_explicit(&g_linger, memory_order_acquire);
  if (GR_LIKELY(s == 0) || gr_epoch_track_op_before(s))
    return;
  if (atomic_compare_exchange_strong_explicit(&g_linger, &s, 0, memory_order_acq_rel, memory_order_relaxed))
    gr_track_watch(-1);
}

/* This thread's record r, as inserted: the same key, context, thread, time and site. */
static bool same_insert(const gr_rec_t *a, const gr_rec_t *r) {
  return a->key == r->key && a->kind == r->kind && a->ctx_id == r->ctx_id && a->tid == r->tid &&
         a->time_ms == r->time_ms && gr_site_same(a->site, r->site) && a->size == r->size;
}

typedef struct {
  const gr_rec_t *mine;
  bool taken;
  gr_rec_t before;
} drop_t;

static int drop_mine(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  drop_t *a = arg;
  if (!((GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN)) >> r->state & 1) || !same_insert(r, a->mine))
    return 0;
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_DELETED;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN) {
    if (!((GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN)) >> expect.state & 1))
      return 1;
    want = expect, want.state = GR_ST_DELETED;
  }
  if (rc == 0) {
    a->taken = true;
    a->before = expect;
  }
  return 1;
}

/* The destroy sequence, read before an insert, after the thread published its insert (op_begin). */
static inline uint64_t seq_before_insert(void) { return atomic_load_explicit(&gr_track_seq, memory_order_seq_cst); }

/* The destroy sequence, read after an insert and ordered after it: with the destroy's barrier after its
 * increment (the table's asymmetric barrier, see table.c), either the destroy's marking sees the record, or this
 * read sees the change. */
static inline uint64_t seq_after_insert(bool asym) {
  if (GR_LIKELY(asym)) {
    atomic_signal_fence(memory_order_seq_cst); /* the destroy's membarrier supplies the hardware fence */
    return atomic_load_explicit(&gr_track_seq, memory_order_relaxed);
  }
  return atomic_fetch_add_explicit(&gr_track_seq, 0, memory_order_seq_cst); /* orders the insert before it */
}

GR_COLD static bool precheck_slow(gr_rec_t *r, uint64_t *seq0) {
  uint64_t now;
  if (r->ctx_id && destroyed_since(r->ctx_id, *seq0, &now)) {
    gr_scope_unref(r->scope); /* never inserted, never counted */
    return false;
  }
  if (r->ctx_id)
    *seq0 = now; /* destroys up to now spared this block's context */
  return true;
}

GR_COLD static void settle_slow(const gr_rec_t *r, uint64_t seq0) {
  uint64_t now;
  if (!destroyed_since(r->ctx_id, seq0, &now))
    return;
  /* The record may be gone already (the destroy's marking saw it, or an allocation that got the address from
   * the driver took it while the destroy's watch lingered), or another thread's block may have its address by
   * now: take exactly this one. Rare (a destroy of this context overlapped this allocation), so a visit of the
   * table is affordable. */
  drop_t a = {.mine = r};
  gr_table_visit(drop_mine, &a);
  if (a.taken) {
    gr_stats_ctx_destroyed(&a.before);
    gr_scope_unref(a.before.scope);
  }
}

void gr_track_restore_ctx(const gr_rec_t *r, uint64_t seq0) {
  bool asym = asym_now();
  gr_thread_rec_t *t = op_begin(gr_epoch_t_rec, seq0, asym);
  gr_rec_t back = *r;
  bool in_ctx = gr_kind_keyspace(r->kind) == GR_KS_ADDR && r->ctx_id, slow = false;
  if (in_ctx && (r->aux == GR_AUX_DETACHING || seq_before_insert() != seq0 || (seq0 & 1))) {
    /* A destroy of its context overlapped the free: the driver may have refused because the destroy took the
     * block. Then it must not come back (not tracking a block that still exists would be safe; a record for
     * one the driver freed is not). */
    uint64_t now;
    slow = true;
    if (destroyed_since(r->ctx_id, seq0, &now)) {
      gr_stats_ctx_destroyed(r);
      gr_scope_unref(r->scope);
      goto out;
    }
    back.aux = inside_destroy_of(r->ctx_id, now) ? GR_AUX_DETACHING : 0; /* that destroy commits it */
    seq0 = now; /* destroys up to now spared the block's context */
  }
  gr_track_restore(&back);
  /* A destroy that began after the check above may have marked the table while the record was out of it, as
   * for a new block's insert (gr_track_insert_ctx): the same check after the insert. */
  if (in_ctx && GR_UNLIKELY(seq_after_insert(asym) != seq0)) {
    slow = true;
    settle_slow(&back, seq0);
  }
out:
  op_end(t);
  if (slow)
    gr_track_linger_check();
}

/* ---- refused frees ---- */

/* The kinds of device memory, which cuMemGetAddressRange knows. */
static const unsigned k_device_kinds = (1u << GPURECLAIM_KIND_DEVICE) | (1u << GPURECLAIM_KIND_PITCH) |
                                       (1u << GPURECLAIM_KIND_MANAGED) | (1u << GPURECLAIM_KIND_ASYNC);

/* Whether a tracked block whose free the driver answered with CUDA_ERROR_INVALID_VALUE is gone: for device memory
 * that answer means "no such block" (two threads freed one pointer at once, and the other free, finding no
 * record, reached the driver first), unless the driver still has a block based at that address, which it refused
 * to free for another reason (asked with cuMemGetAddressRange, in the current context; no answer counts as gone).
 * Put back when gone, the record would outlive its block, and a release could later free the address for whoever
 * has it then. Other kinds keep their record: the driver also answers INVALID_VALUE for a reservation that is
 * still mapped or freed with another size (cuMemAddressFree), and has no cheap question for host memory. */
GR_COLD static bool free_found_nothing(const gr_packed_t *p) {
  if (!((k_device_kinds >> gr_pk_kind(p)) & 1))
    return false;
  CUdeviceptr base = 0;
  size_t size = 0;
  return !gr_drv.cuMemGetAddressRange ||
         gr_drv.cuMemGetAddressRange(&base, &size, (CUdeviceptr)p->key) != CUDA_SUCCESS || base != p->key;
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

/* A free the driver refused (rc; the hooks' free body, driver.c): the record goes back, unless the driver found
 * no such block or gave its address to a new one; a destroy of the block's context that overlapped decides first
 * (gr_track_restore_ctx: the block is then counted as the destroy's). */
GR_COLD void gr_track_free_refused(const gr_packed_t *p, uint64_t seq0, CUresult rc) {
  gr_rec_t r;
  gr_pk_unpack(p, &r);
  bool overlapped = r.aux == GR_AUX_DETACHING || gr_track_ctx_seq() != seq0 || (seq0 & 1);
  if (rc == CUDA_ERROR_INVALID_VALUE && !overlapped && (free_found_nothing(p) || address_given_again(p)))
    gr_track_freed(&r);
  else
    gr_track_restore_ctx(&r, seq0);
}

GR_COLD static bool precheck_copy(gr_packed_t p, uint64_t *seq0) {
  gr_rec_t r;
  gr_pk_unpack(&p, &r);
  return precheck_slow(&r, seq0);
}

GR_COLD static void settle_copy(gr_packed_t p, uint64_t seq0) {
  gr_rec_t r;
  gr_pk_unpack(&p, &r);
  settle_slow(&r, seq0);
}

/* A new block's insert, with the thread's record t as read (NULL: take one) and asym read once (op_begin). */
static GR_HOT_INLINE void insert_ctx_with(gr_thread_rec_t *t, bool asym, gr_packed_t p, uint64_t seq0, unsigned kind,
                                          unsigned device, uint64_t size, unsigned scope) {
  t = op_begin(t, seq0, asym);
  bool slow = false;
  if (GR_UNLIKELY(seq_before_insert() != seq0 || (seq0 & 1))) {
    slow = true;
    if (!precheck_copy(p, &seq0)) {
      if (gr_limit_on())
        gr_limit_end(); /* the block went with its context, not counted: what it held goes back */
      goto out;
    }
  }
  insert_pk_v(t, p, kind, device, size, scope, true, asym);
  if (GR_UNLIKELY(seq_after_insert(asym) != seq0) && gr_pk_ctx(&p)) {
    slow = true;
    settle_copy(p, seq0);
  }
out:
  op_end(t);
  if (GR_UNLIKELY(slow))
    gr_track_linger_check();
}

/* A thread without its record yet, or no asymmetric barrier: the same steps, with both read here. A thread's
 * first insert reads gr_epoch_asym before its registration (op_begin) may decide it: then 0, the fenced forms,
 * which are right whatever the destroyer uses. */
GR_COLD static void insert_ctx_general(gr_packed_t p, uint64_t seq0, unsigned kind, unsigned device, uint64_t size,
                                       unsigned scope) {
  insert_ctx_with(gr_epoch_t_rec, asym_now(), p, seq0, kind, device, size, scope);
}

/* The usual case, with the thread's record and the asymmetric barrier both known here: the compiler drops every
 * later test of either (the record's in op_begin, the log insert and op_end; the barrier's in each step). */
static GR_HOT_INLINE void insert_ctx_pk(gr_packed_t p, uint64_t seq0, unsigned kind, unsigned device, uint64_t size,
                                         unsigned scope) {
  gr_thread_rec_t *t = gr_epoch_t_rec;
  if (GR_LIKELY(t != NULL) && GR_LIKELY(asym_now()))
    insert_ctx_with(t, true, p, seq0, kind, device, size, scope);
  else
    insert_ctx_general(p, seq0, kind, device, size, scope);
}

void gr_track_insert_ctx(gr_rec_t *r, uint64_t seq0) {
  gr_packed_t p;
  gr_pk_pack(r, &p);
  insert_ctx_pk(p, seq0, gr_pk_kind(&p), gr_pk_device(&p), gr_pk_size(&p), gr_pk_scope(&p));
}

GR_HOT_INLINE void gr_track_alloc(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, unsigned ctx_id,
                    unsigned device, unsigned pool_id, uint64_t seq0) {
  uintptr_t pc = ra;
  unsigned api = driver_api;
  if (GR_UNLIKELY(gr_tls.rt_depth)) { /* inside a runtime call: the runtime call and its caller (gr_track_fill) */
    pc = gr_tls.rt_caller;
    api = gr_tls.rt_api;
  }
  gr_site_t site = gr_opt_backtrace() ? gr_stack_capture(pc) : gr_site_at(pc);
  unsigned scope = kind != GPURECLAIM_KIND_VMM_MAPPING && kind != GPURECLAIM_KIND_VA ? gr_scope_tag() : 0;
  uint64_t psize = size > GR_SIZE_MAX ? GR_SIZE_MAX : size;
  gr_packed_t p = {
      .ctl = gr_pk_meta(ctx_id, pool_id, scope, 0) | GR_ST_LIVE,
      .key = key,
      .w1 = gr_pk_w1(psize, kind, device, api),
      .w2 = site.bits,
      .w3 = gr_pk_w3(gr_tick_now_ms(), gr_state_tid()),
  };
  insert_ctx_pk(p, seq0, kind & 0xf, device & 0x7f, psize, scope); /* as gr_pk_w1 packs them */
}

GR_HOT_INLINE void gr_track_alloc_here(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra,
                                       uint64_t seq0) {
  gr_where_t w = gr_reg_here();
  gr_track_alloc(kind, key, size, driver_api, ra, w.ctx_id, kind == GPURECLAIM_KIND_HOST ? GR_DEVICE_NONE : w.device, 0,
                 seq0);
}

GR_HOT_INLINE void gr_track_alloc_async(uint64_t key, uint64_t size, CUmemoryPool pool, CUstream s,
                                        unsigned driver_api, uintptr_t ra, uint64_t seq0) {
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
  gr_track_alloc(GPURECLAIM_KIND_ASYNC, key, size, driver_api, ra, cid, device, pool_id, seq0);
}

void gr_track_add(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, int device) {
  gr_rec_t r;
  gr_track_fill(&r, kind, key, size, driver_api, ra);
  if (device >= 0)
    r.device = (uint8_t)device;
  gr_track_insert(&r);
}

typedef struct {
  uint16_t ctx_id;
  bool destroyed; /* commit: the driver destroyed the context */
} detach_t;

static bool marked(const gr_rec_t *r, uint16_t ctx_id) {
  return r->ctx_id == ctx_id && r->aux == GR_AUX_DETACHING && gr_kind_keyspace(r->kind) == GR_KS_ADDR;
}

static int mark_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  detach_t *a = arg;
  /* RECLAIMING: claimed by a release, which holds the context lock until it has freed it, so a detach (which
   * holds the lock too) never meets one; were it to, the release settles that record itself. Records of a
   * context are address records (VMM handles, mappings and reservations belong to none): aux is free there. */
  if (r->ctx_id != a->ctx_id || r->state == GR_ST_RECLAIMING || r->state == GR_ST_RELEASED ||
      gr_kind_keyspace(r->kind) != GR_KS_ADDR || r->aux)
    return 0;
  gr_rec_t expect = *r, want = *r;
  want.aux = GR_AUX_DETACHING;
  while (gr_table_cas(ref, &expect, &want) == -EAGAIN && expect.state != GR_ST_RECLAIMING)
    want = expect, want.aux = GR_AUX_DETACHING;
  return 0;
}

static int commit_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  detach_t *a = arg;
  if (!marked(r, a->ctx_id))
    return 0;
  gr_rec_t expect = *r, want = *r;
  int rc;
  for (;;) {
    if (a->destroyed)
      want.state = GR_ST_DELETED;
    else
      want.aux = 0;
    if ((rc = gr_table_cas(ref, &expect, &want)) != -EAGAIN)
      break;
    if (!marked(&expect, a->ctx_id))
      return 0;
    want = expect;
  }
  if (rc != 0 || !a->destroyed)
    return 0;
  if (expect.state == GR_ST_RECLAIMED) {
    gr_track_tombstone_gone(GR_KS_ADDR); /* counted, and its scope released, when the release freed it */
    return 0;
  }
  gr_stats_ctx_destroyed(&expect);
  gr_scope_unref(expect.scope);
  return 0;
}

void gr_track_ctx_begin(uint16_t ctx_id, gr_detached_t *d) {
  d->ctx_id = ctx_id;
  d->marked = false;
  GR_ASSERT(gr_track_ctxlock_held()); /* destroys run one at a time */
  GR_ASSERT((atomic_load_explicit(&gr_track_seq, memory_order_relaxed) & 1) == 0);
  /* Release: a thread that reads this context id (destroyed_since) after it read the odd sequence of the
   * previous destroy must also see that destroy's g_destroyed entry, stored before its commit. */
  atomic_store_explicit(&g_running, ctx_id, memory_order_release);
  d->seq = atomic_fetch_add_explicit(&gr_track_seq, 1, memory_order_seq_cst) + 1;
  gr_track_watch(1);
  gr_epoch_heavy_barrier(); /* an insert the marking misses sees the odd sequence (gr_track_insert_ctx) */
}

void gr_track_ctx_mark(gr_detached_t *d) {
  detach_t a = {d->ctx_id, false};
  d->marked = true;
  gr_table_visit(mark_one, &a);
}

void gr_track_ctx_detach(uint16_t ctx_id, gr_detached_t *d) {
  gr_track_ctx_begin(ctx_id, d);
  gr_track_ctx_mark(d);
}

void gr_track_ctx_commit(gr_detached_t *d, bool destroyed) {
  GR_ASSERT(gr_track_ctxlock_held() && atomic_load_explicit(&gr_track_seq, memory_order_relaxed) == d->seq);
  detach_t a = {d->ctx_id, destroyed};
  if (d->marked)
    gr_table_visit(commit_one, &a);
  if (destroyed)
    atomic_store_explicit(&g_destroyed[d->ctx_id & 0xfff], d->seq, memory_order_relaxed);
  /* An insert that began before this destroy and is still under way may hold a record the marking missed, for
   * a block the driver has now freed: the watch stays raised until it is gone ("Lingering", file head). */
  if (destroyed && gr_epoch_track_op_before(d->seq)) {
    if (atomic_exchange_explicit(&g_linger, d->seq, memory_order_acq_rel) != 0)
      gr_track_watch(-1); /* one held watch is enough: the inserts the earlier one waited for began before this */
  } else {
    gr_track_watch(-1);
  }
  pthread_mutex_lock(&g_end_mu);
  atomic_fetch_add_explicit(&gr_track_seq, 1, memory_order_release);
  pthread_cond_broadcast(&g_end_cv);
  pthread_mutex_unlock(&g_end_mu);
}

void gr_track_ctx_end_before(gr_ctx_end_t *e, CUcontext ctx, int device, bool certain) {
  gr_track_ctxlock_enter(); /* not while a release holds claimed blocks of it, nor between a final primary
                             * release and its state read (a retain holds the lock too) */
  e->primary = ctx == NULL;
  e->device = device;
  e->id = e->primary ? gr_reg_primary_id(device) : gr_reg_ctx_find(ctx);
  e->d = (gr_detached_t){0};
  if (e->id && certain)
    gr_track_ctx_detach(e->id, &e->d);
  else if (e->id)
    gr_track_ctx_begin(e->id, &e->d);
}

void gr_track_ctx_end_after(gr_ctx_end_t *e, bool gone) {
  if (e->id) {
    if (gone && !e->d.marked)
      gr_track_ctx_mark(&e->d);
    gr_track_ctx_commit(&e->d, gone);
  }
  if (gone && e->primary)
    gr_reg_device_reset(e->device);
  else if (gone)
    gr_reg_ctx_destroyed(e->id); /* id 0 too: every thread's kept context is asked again (registry.c) */
  gr_track_ctxlock_exit();
}

void gr_track_atfork_child(void) {
  /* A destroy that another thread had under way will never end here: its sequence must not stay odd. The
   * locks may have been held by threads that did not survive the fork. */
  uint64_t q = atomic_load_explicit(&gr_track_seq, memory_order_relaxed);
  atomic_store_explicit(&gr_track_seq, q + (q & 1), memory_order_relaxed);
  atomic_store_explicit(&g_running, 0, memory_order_relaxed);
  atomic_store_explicit(&g_linger, 0, memory_order_relaxed);
  atomic_store_explicit(&g_reclaimed[GR_KS_ADDR], 0, memory_order_relaxed);
  atomic_store_explicit(&g_reclaimed[GR_KS_HANDLE], 0, memory_order_relaxed);
  atomic_store_explicit(&g_watch, 0, memory_order_relaxed);
  pthread_mutex_init(&g_ctxlock, NULL);
  t_ctxlock = 0;
  pthread_mutex_init(&g_end_mu, NULL);
  pthread_cond_init(&g_end_cv, NULL);
}
