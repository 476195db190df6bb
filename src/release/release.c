/*
 * release.c -- the release engine: gives cached and orphaned device memory back.
 *
 * What a release does, in order (docs/ARCHITECTURE.md, "What may be released", says what is safe):
 *   1. framework caches, through the framework's own call (releasers/python.c), never by freeing their blocks;
 *   2. orphans (blocks of ended scopes), or with GPURECLAIM_ALL every tracked block (of one context);
 *   3. stream-ordered pools: synchronize every context, then cuMemPoolTrimTo(pool, 0) on every pool seen;
 *   4. releasers the program registered.
 * A block is freed only after its record moved ORPHAN/LIVE -> RECLAIMING by CAS, so a release and a
 * concurrent free of the same block never both free it; it then stays RECLAIMED (a tombstone with its address)
 * until the driver hands the address out again, so that a late free of it is recognised and swallowed.
 * The driver may hand the address out between its free and the record's move to RECLAIMED: the allocation
 * that gets it deletes the RECLAIMING record (gr_track_insert), and the release then leaves no tombstone, so
 * that the new block's own double free reaches the driver instead of passing as a late free.
 *
 * Who runs it: the caller of gpureclaim_release(), the worker thread (the signal, the control socket), or an
 * allocation that ran out of memory (then only pools, orphans and releasers, on the allocating thread).
 * Concurrent requests coalesce: while a release runs, later requests wait and are all served by one more
 * release covering everything they asked for. A waiter that holds Python's GIL gives it up while it waits,
 * since the running release may need it for step 1.
 */
#include "release.h"
#include "admit.h"
#include "real.h"
#include "registry.h"
#include "stats.h"
#include "track.h"
#include "scope.h"
#include "python.h"
#include "report.h"
#include "gate.h"
#include "options.h"
#include "state.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- registered releasers ---- */

#define MAX_RELEASERS 64

typedef struct releaser {
  _Atomic int state;   /* 0 free, 1 registered, 2 leaving */
  _Atomic int running; /* a release is calling it now */
  int id;
  char name[64];
  size_t (*fn)(void *);
  void *arg;
} releaser_t;

static releaser_t g_rel[MAX_RELEASERS];
static pthread_mutex_t g_rel_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_next_id;
static GR_TLS int t_in_releaser; /* id of the releaser this thread is inside, 0 for none */

GPURECLAIM_API int gpureclaim_register_releaser(const char *name, size_t (*fn)(void *arg), void *arg) {
  if (!name || !fn)
    return -EINVAL;
  if (gr_state_disabled())
    return -ENOTSUP;
  pthread_mutex_lock(&g_rel_lock);
  for (int i = 0; i < MAX_RELEASERS; i++) {
    releaser_t *r = &g_rel[i];
    if (atomic_load_explicit(&r->state, memory_order_acquire) != 0 ||
        atomic_load_explicit(&r->running, memory_order_acquire))
      continue;
    snprintf(r->name, sizeof r->name, "%s", name);
    r->fn = fn;
    r->arg = arg;
    r->id = ++g_next_id;
    int id = r->id;
    atomic_store_explicit(&r->state, 1, memory_order_release);
    pthread_mutex_unlock(&g_rel_lock);
    return id;
  }
  pthread_mutex_unlock(&g_rel_lock);
  return -ENOSPC;
}

GPURECLAIM_API int gpureclaim_unregister_releaser(int id) {
  if (id <= 0)
    return -ENOENT;
  pthread_mutex_lock(&g_rel_lock);
  releaser_t *found = NULL;
  for (int i = 0; i < MAX_RELEASERS; i++)
    if (atomic_load_explicit(&g_rel[i].state, memory_order_acquire) == 1 && g_rel[i].id == id) {
      found = &g_rel[i];
      atomic_store_explicit(&found->state, 2, memory_order_release);
      break;
    }
  pthread_mutex_unlock(&g_rel_lock);
  if (!found)
    return -ENOENT;
  /* When this returns, fn is not running and will not run again (unless we are inside it ourselves). */
  if (t_in_releaser != id)
    while (atomic_load_explicit(&found->running, memory_order_acquire))
      sched_yield();
  atomic_store_explicit(&found->state, 0, memory_order_release);
  return 0;
}

static uint64_t call_releasers(void) {
  uint64_t total = 0;
  for (int i = 0; i < MAX_RELEASERS; i++) {
    releaser_t *r = &g_rel[i];
    int idle = 0;
    if (atomic_load_explicit(&r->state, memory_order_acquire) != 1 ||
        !atomic_compare_exchange_strong_explicit(&r->running, &idle, 1, memory_order_acq_rel, memory_order_relaxed))
      continue; /* not registered, or another release is calling it right now */
    if (atomic_load_explicit(&r->state, memory_order_acquire) == 1) {
      int outer = t_in_releaser;
      t_in_releaser = r->id;
      total += r->fn(r->arg);
      t_in_releaser = outer;
    }
    atomic_store_explicit(&r->running, 0, memory_order_release);
  }
  return total;
}

/* ---- contexts for the driver calls a release makes ---- */

/* Makes ctx current for a while; returns whether it pushed (then pop()). */
static bool push(CUcontext ctx) {
  CUcontext cur = NULL;
  if (!ctx || !gr_drv.cuCtxPushCurrent)
    return false;
  if (gr_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx)
    return false;
  gr_reg_switched(); /* the thread's cached current context (registry.c) is not trusted inside the window */
  return gr_drv.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
}
static void pop(bool pushed) {
  CUcontext c;
  if (pushed)
    gr_drv.cuCtxPopCurrent(&c);
}


/* ---- the report ---- */

static gpureclaim_device_report_t *dev_report(gpureclaim_report_t *rep, int device) {
  if (device < 0)
    return NULL;
  for (int i = 0; i < rep->ndevices; i++)
    if (rep->devices[i].device == device)
      return &rep->devices[i];
  if (rep->ndevices == GPURECLAIM_MAX_DEVICES)
    return NULL;
  gpureclaim_device_report_t *d = &rep->devices[rep->ndevices++];
  memset(d, 0, sizeof *d);
  d->device = device;
  return d;
}

static void mem_info(gpureclaim_report_t *rep, bool after) {
  int count = 0;
  if (!gr_drv.cuDeviceGetCount || !gr_drv.cuMemGetInfo || gr_drv.cuDeviceGetCount(&count) != CUDA_SUCCESS)
    return;
  for (int d = 0; d < count && d < GPURECLAIM_MAX_DEVICES; d++) {
    CUcontext ctx = gr_reg_ctx_on_device(d);
    if (!ctx)
      continue; /* gpureclaim has seen no context there: nothing of ours on that device */
    bool pushed = push(ctx);
    size_t free_b = 0, total = 0;
    if (gr_drv.cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS) {
      gpureclaim_device_report_t *dr = dev_report(rep, d);
      if (dr) {
        if (after)
          dr->free_after = free_b;
        else
          dr->free_before = free_b;
        dr->total = total;
      }
    }
    pop(pushed);
  }
}

/* ---- freeing blocks ---- */

enum { PASS_MAPPINGS, PASS_BLOCKS, PASS_VA };

typedef struct free_job {
  gpureclaim_report_t *rep;
  unsigned states;   /* GR_STMASK of states to take */
  int pass;
  uint16_t scope;    /* 0: any */
  uint16_t ctx_id;   /* 0: any */
  bool only_ctx;
  bool all;          /* GPURECLAIM_ALL (else orphans) */
  uint16_t pools[64];/* pools that got stream-ordered blocks back */
  unsigned npools;
  gr_rec_t *claimed; /* claimed this round (state RECLAIMING in the table; the records as they were before) */
  size_t nclaimed, cap;
  bool more;         /* the array could not grow: another round claims the rest */
  const gr_scope_key_t *keys; /* non-NULL: claim only under these keys (a scope's end), not by a table visit */
  size_t nkeys, next; /* next: the first key not yet looked at, across rounds */
  gr_visit_pos_t pos; /* where the last round's visit stopped: the next one goes on from there */
  uint64_t devmask;  /* 0: any device; else only blocks of the devices whose bits are set (a peer's request) */
} free_job_t;

static bool in_pass(const free_job_t *j, unsigned kind) {
  switch (j->pass) {
  case PASS_MAPPINGS: return kind == GPURECLAIM_KIND_VMM_MAPPING;
  case PASS_VA: return kind == GPURECLAIM_KIND_VA;
  default: return kind != GPURECLAIM_KIND_VMM_MAPPING && kind != GPURECLAIM_KIND_VA;
  }
}

static CUresult driver_free(const gr_rec_t *r) {
  CUcontext ctx = gr_reg_ctx_alive(r->ctx_id) ? gr_reg_ctx_handle(r->ctx_id) : NULL;
  if (!ctx)
    ctx = gr_reg_ctx_on_device(r->device == GR_DEVICE_NONE ? -1 : r->device);
  bool pushed = push(ctx);
  CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
  switch (r->kind) {
  case GPURECLAIM_KIND_HOST:
    rc = gr_drv.cuMemFreeHost ? gr_drv.cuMemFreeHost((void *)(uintptr_t)r->key) : rc;
    break;
  case GPURECLAIM_KIND_VMM:
    rc = gr_drv.cuMemRelease ? gr_drv.cuMemRelease((CUmemGenericAllocationHandle)r->key) : rc;
    break;
  case GPURECLAIM_KIND_VMM_MAPPING:
    rc = gr_drv.cuMemUnmap ? gr_drv.cuMemUnmap((CUdeviceptr)r->key, r->size) : rc;
    break;
  case GPURECLAIM_KIND_VA:
    rc = gr_drv.cuMemAddressFree ? gr_drv.cuMemAddressFree((CUdeviceptr)r->key, r->size) : rc;
    break;
  default:
    rc = gr_drv.cuMemFree((CUdeviceptr)r->key);
  }
  pop(pushed);
  return rc;
}

/* Blocks claimed (and so freed under the context lock) per round: a context's destroy, reset or retain waits
 * for one round at most, not for a whole release of a hundred thousand blocks. */
#define ROUND_MAX 4096

/* Blocks are claimed while the table is visited, then freed in address order. The driver's cost depends on the
 * order: 10,000 1 MiB blocks freed in address order take about what cudaFree in allocation order takes, in the
 * table's hash order 1.5-1.6 times that (H100, bench/gpu/bench_release.cu). */
/* Whether this release frees r. */
static bool claimable(const free_job_t *j, const gr_rec_t *r) {
  if (!((j->states >> r->state) & 1) || !in_pass(j, r->kind) || (j->scope && r->scope != j->scope) ||
      (j->only_ctx && r->ctx_id != j->ctx_id))
    return false;
  if (j->devmask && (r->device >= 64 || !((j->devmask >> r->device) & 1)))
    return false;
  /* A block of a context gpureclaim could not register (4095 alive at once: registry.c) may have gone with a
   * destroy of that context, which could not drop its record: its address may be another block's by now. */
  if (!r->ctx_id && gr_kind_keyspace(r->kind) == GR_KS_ADDR)
    return false;
  return !(r->kind == GPURECLAIM_KIND_VMM && r->aux); /* still mapped: the mapping pass (ALL) or the program
                                                         unmaps it first */
}

/* Room for one more claim this round; false when the round is full or the array cannot grow (then `more`: the
 * next round, after these are freed, claims the rest). */
static bool claim_room(free_job_t *j) {
  if (j->nclaimed == ROUND_MAX) {
    j->more = true; /* the context lock is held one round at a time */
    return false;
  }
  if (j->nclaimed == j->cap) {
    size_t cap = j->cap ? j->cap * 2 : 256;
    gr_rec_t *v = realloc(j->claimed, cap * sizeof *v);
    if (!v) {
      j->more = true;
      return false;
    }
    j->claimed = v;
    j->cap = cap;
  }
  return true;
}

static int claim_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  free_job_t *j = arg;
  if (!claimable(j, r))
    return 0;
  if (!claim_room(j))
    return 1; /* stop here: the next round's visit begins with this record (going on would skip what it
               * cannot claim now, and a resumed visit never comes back to it) */
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_RECLAIMING;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN) {
    if (!((j->states >> expect.state) & 1))
      return 0; /* freed, or changed state, meanwhile */
    want = expect;
    want.state = GR_ST_RECLAIMING;
  }
  if (rc == 0)
    j->claimed[j->nclaimed++] = expect;
  return 0;
}

static bool claim_edit(gr_rec_t *r, void *arg) {
  if (!claimable(arg, r))
    return false;
  r->state = GR_ST_RECLAIMING;
  return true;
}

/* claim_one for a job with a list of keys: looks up each key once, across rounds. */
static void claim_keys(free_job_t *j) {
  for (; j->next < j->nkeys; j->next++) {
    if (!claim_room(j))
      return;
    const gr_scope_key_t *k = &j->keys[j->next];
    gr_rec_t before;
    if (gr_table_update(k->ks, k->key, j->states, claim_edit, j, &before) == 0)
      j->claimed[j->nclaimed++] = before;
  }
}

static int by_key(const void *a, const void *b) {
  uint64_t x = ((const gr_rec_t *)a)->key, y = ((const gr_rec_t *)b)->key;
  return (x > y) - (x < y);
}

static bool edit_state(gr_rec_t *r, void *arg) {
  r->state = *(const uint8_t *)arg;
  return true;
}

/* Frees one claimed block and settles its record: back to its old state when the driver refused. */
static bool free_claimed(free_job_t *j, const gr_rec_t *expect) {
  unsigned ks = gr_kind_keyspace(expect->kind);
  CUresult fr = driver_free(expect);
  if (fr != CUDA_SUCCESS) {
    uint8_t back = expect->state;
    (void)gr_table_update(ks, expect->key, GR_STMASK(GR_ST_RECLAIMING), edit_state, &back, NULL);
    j->rep->failed_blocks++;
    gr_warn_once(w_fail, "the driver refused to free a block during a release (%d); it stays tracked", (int)fr);
    return false;
  }
  /* Remember the address until the driver hands it out again (late frees), within a bound. Counted before the
   * record becomes a tombstone, so that an allocation consuming it never takes the count below zero. */
  bool tomb = gr_track_tombstone_add(ks);
  uint8_t done = tomb ? GR_ST_RECLAIMED : GR_ST_DELETED;
  /* -ENOENT: the driver handed the address out already and that allocation deleted the record. */
  if (gr_table_update(ks, expect->key, GR_STMASK(GR_ST_RECLAIMING), edit_state, &done, NULL) != 0 && tomb)
    gr_track_tombstone_gone(ks);
  gr_stats_free(expect);
  gr_scope_unref(expect->scope);
  if (expect->kind == GPURECLAIM_KIND_VMM_MAPPING)
    gr_track_unmapped(expect->map_handle);
  if (expect->kind == GPURECLAIM_KIND_ASYNC && expect->pool_id && j->npools < GR_ARRAY_LEN(j->pools)) {
    unsigned k = 0;
    while (k < j->npools && j->pools[k] != expect->pool_id)
      k++;
    if (k == j->npools)
      j->pools[j->npools++] = expect->pool_id;
  }
  bool counted = gr_kind_is_device_memory(expect->kind) || expect->kind == GPURECLAIM_KIND_HOST;
  gpureclaim_device_report_t *dr = dev_report(j->rep, expect->device == GR_DEVICE_NONE ? -1 : expect->device);
  if (j->all) {
    j->rep->all_blocks++;
    j->rep->all_bytes += counted ? expect->size : 0;
    if (dr) {
      dr->all_blocks++;
      dr->all_bytes += counted ? expect->size : 0;
    }
  } else {
    j->rep->orphaned_blocks++;
    j->rep->orphaned_bytes += expect->size;
    if (dr) {
      dr->orphaned_blocks++;
      dr->orphaned_bytes += expect->size;
    }
  }
  return true;
}

/* One pass of a release: claim what it frees, then free it in address order; again while the claim array
 * could not hold everything. Each round holds the context lock: a context destroyed between the claim and the
 * free would take the claimed blocks with it, and the driver could hand their addresses to another context's
 * allocations before this release freed them. Each round's visit goes on where the last one stopped
 * (gr_table_visit_from), so a pass looks at each slot about once, however many rounds it takes: a round that
 * began at the table's first slot again made a release of a million orphans scan the table 244 times. */
static void free_pass(free_job_t *j) {
  j->pos = (gr_visit_pos_t){0};
  do {
    gr_track_ctxlock_enter();
    gr_track_watch(1); /* before any claim: an allocation that gets a freed address sees its RECLAIMING record */
    j->nclaimed = 0;
    j->more = false;
    if (j->keys)
      claim_keys(j);
    else
      gr_table_visit_from(&j->pos, claim_one, j);
    if (j->nclaimed > 1) /* (qsort of NULL, even of nothing, is undefined) */
      qsort(j->claimed, j->nclaimed, sizeof *j->claimed, by_key);
    size_t freed = 0;
    for (size_t i = 0; i < j->nclaimed; i++)
      freed += free_claimed(j, &j->claimed[i]);
    gr_track_watch(-1);
    gr_track_ctxlock_exit();
    /* A round that freed nothing (the driver refused every block, which stay claimable) ends the pass: the
     * driver is refusing frees, and a release that is asked again claims them again. */
    if (!freed)
      break;
  } while (j->more && j->nclaimed);
}

/* ---- pools ---- */

typedef struct {
  gpureclaim_report_t *rep;
  const uint16_t *only; /* NULL: every pool */
  unsigned nonly;
  uint64_t devmask;     /* 0: every device */
  bool limited;         /* give `need` bytes at most (trim to what is reserved less it), counting down */
  uint64_t need;
} trim_job_t;

static void sync_ctx(uint16_t id, CUcontext ctx, int device, void *arg) {
  (void)id;
  (void)device;
  (void)arg;
  bool pushed = push(ctx);
  if (gr_drv.cuCtxSynchronize)
    gr_drv.cuCtxSynchronize();
  pop(pushed);
}

static void trim_pool(uint16_t id, CUmemoryPool pool, int device, void *arg) {
  trim_job_t *t = arg;
  if (t->only) {
    unsigned k = 0;
    while (k < t->nonly && t->only[k] != id)
      k++;
    if (k == t->nonly)
      return;
  }
  if (!gr_drv.cuMemPoolTrimTo || !gr_drv.cuMemPoolGetAttribute)
    return;
  if ((t->devmask && (device < 0 || device >= 64 || !((t->devmask >> device) & 1))) || (t->limited && !t->need))
    return;
  bool pushed = push(gr_reg_ctx_on_device(device));
  cuuint64_t before = 0, after = 0, used = 0, keep = 0;
  gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &before);
  if (t->limited && gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == CUDA_SUCCESS &&
      before > used && before - used > t->need)
    keep = before - t->need; /* only what is needed: the pool keeps the rest of its unused memory */
  if (gr_drv.cuMemPoolTrimTo(pool, (size_t)keep) == CUDA_SUCCESS &&
      gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &after) == CUDA_SUCCESS &&
      before > after) {
    t->rep->pool_bytes += before - after;
    if (t->limited)
      t->need = before - after >= t->need ? 0 : t->need - (before - after);
    gpureclaim_device_report_t *dr = dev_report(t->rep, device);
    if (dr)
      dr->pool_bytes += before - after;
  }
  pop(pushed);
}

/* ---- one release ---- */

typedef struct {
  unsigned what;
  int trigger;
  bool python;      /* step 1 allowed (not from inside an allocation) */
  bool only_ctx;
  uint16_t ctx_id;
  uint16_t scope;
  const gr_scope_key_t *keys; /* with scope: only these keys (NULL: visit the table) */
  size_t nkeys;
  bool served_signal; /* a release signal asked for it (alone or coalesced with other requests) */
} rel_args_t;

static _Atomic uint64_t g_seq;

static void do_release_now(const rel_args_t *a, gpureclaim_report_t *rep) {
  memset(rep, 0, sizeof *rep);
  rep->size = sizeof *rep;
  rep->what = a->what;
  rep->trigger = a->trigger;
  rep->seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed) + 1;
  uint64_t t0 = gr_mono_ns();
  mem_info(rep, false);
  if ((a->what & GPURECLAIM_CACHED) && a->python && gr_opt()->python)
    rep->framework_bytes = gr_py_release();
  free_job_t job;
  memset(&job, 0, sizeof job);
  job.rep = rep;
  job.scope = a->scope;
  job.only_ctx = a->only_ctx;
  job.ctx_id = a->ctx_id;
  job.keys = a->keys;
  job.nkeys = a->nkeys;
  if (a->what & GPURECLAIM_ALL) {
    job.all = true;
    job.states = GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN);
    for (job.pass = PASS_MAPPINGS; job.pass <= PASS_VA; job.pass++)
      free_pass(&job);
  } else if (a->what & GPURECLAIM_ORPHANED) {
    job.states = GR_STMASK(GR_ST_ORPHAN);
    job.pass = PASS_BLOCKS;
    free_pass(&job);
  }
  free(job.claimed);
  if (a->what & GPURECLAIM_CACHED) {
    gr_reg_foreach_ctx(sync_ctx, NULL);
    trim_job_t t = {rep, NULL, 0, 0, false, 0};
    gr_reg_foreach_pool(trim_pool, &t);
    rep->releaser_bytes = call_releasers();
  } else if (job.npools) {
    /* Stream-ordered blocks went back to their pools: give those pools' free memory back too. */
    gr_reg_foreach_ctx(sync_ctx, NULL);
    trim_job_t t = {rep, job.pools, job.npools, 0, false, 0};
    gr_reg_foreach_pool(trim_pool, &t);
  }
  rep->cached_bytes = rep->pool_bytes + rep->framework_bytes + rep->releaser_bytes;
  mem_info(rep, true);
  rep->duration_ns = gr_mono_ns() - t0;
  gr_stats_release(rep->cached_bytes + rep->orphaned_bytes + rep->all_bytes);
  gr_report_release(rep);
  gr_report_status_release(rep, a->served_signal);
}

static const char *trigger_name(int trigger) {
  switch (trigger) {
  case GPURECLAIM_TRIGGER_SIGNAL: return "signal";
  case GPURECLAIM_TRIGGER_COMMAND: return "command";
  case GPURECLAIM_TRIGGER_OOM: return "out-of-memory retry";
  case GPURECLAIM_TRIGGER_PEER: return "peer's request";
  case GPURECLAIM_TRIGGER_SCOPE: return "scope end";
  default: return "API call";
  }
}

/* A release calls the driver: never while the process sleeps or is about to (sleep.c), and never while a CUDA
 * graph is being captured (admit.c: the driver would fail its calls and invalidate the capture). Refused then,
 * with an empty report: -EAGAIN (asleep: the command and the signal say why; the API and scope ends wake the
 * process first) or -EBUSY (capturing: logged here, and the API and the command return it). */
static int do_release(const rel_args_t *a, gpureclaim_report_t *rep) {
  int rc = gr_admit_release_begin();
  if (rc) {
    memset(rep, 0, sizeof *rep);
    rep->size = sizeof *rep;
    rep->what = a->what;
    rep->trigger = a->trigger;
    if (rc == -EBUSY) /* a warning where a person asked (the signal, the command): the release they asked for
                         did not happen */
      gr_log(a->trigger == GPURECLAIM_TRIGGER_SIGNAL || a->trigger == GPURECLAIM_TRIGGER_COMMAND ? 0 : 1, "release (%s) refused: a CUDA graph is being captured (cuStreamBeginCapture); the driver forbids "
              "the frees and synchronizations a release makes until it ends (cuStreamEndCapture)",
              trigger_name(a->trigger));
    return rc;
  }
  do_release_now(a, rep);
  gr_admit_release_end();
  return 0;
}

/* ---- coalescing ---- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_running;
static unsigned g_pending_what;
static int g_pending_trigger;
static bool g_pending_signal;
static uint64_t g_requested, g_served;
static gpureclaim_report_t g_last;
static int g_last_rc; /* what do_release returned for g_last */

static void copy_report(gpureclaim_report_t *out, const gpureclaim_report_t *r) {
  if (!out)
    return;
  size_t want = out->size, n = want < sizeof *r ? want : sizeof *r;
  memcpy(out, r, n);
  out->size = n;
}

int gr_release_run(unsigned what, int trigger, gpureclaim_report_t *out) {
  pthread_mutex_lock(&g_mu);
  uint64_t ticket = ++g_requested;
  g_pending_what |= what;
  if (!g_pending_trigger)
    g_pending_trigger = trigger;
  g_pending_signal |= trigger == GPURECLAIM_TRIGGER_SIGNAL;
  void *gil = NULL;
  while (g_served < ticket) {
    if (!g_running) {
      g_running = true;
      rel_args_t a = {.what = g_pending_what, .trigger = g_pending_trigger, .python = true,
                      .served_signal = g_pending_signal};
      uint64_t covers = g_requested;
      g_pending_what = 0;
      g_pending_trigger = 0;
      g_pending_signal = false;
      pthread_mutex_unlock(&g_mu);
      if (gil) { /* we run the release ourselves: we may need the GIL back for step 1 */
        gr_py_restore(gil);
        gil = NULL;
      }
      gpureclaim_report_t rep;
      int rc = do_release(&a, &rep);
      pthread_mutex_lock(&g_mu);
      g_last = rep;
      g_last_rc = rc;
      g_served = covers;
      g_running = false;
      pthread_cond_broadcast(&g_cv);
    } else {
      if (!gil)
        gil = gr_py_save_if_held();
      pthread_cond_wait(&g_cv, &g_mu);
    }
  }
  gpureclaim_report_t last = g_last;
  int rc = g_last_rc;
  pthread_mutex_unlock(&g_mu);
  if (gil)
    gr_py_restore(gil);
  copy_report(out, &last);
  return rc == -EBUSY ? rc : 0; /* -EAGAIN (asleep) keeps its old answer: an empty report */
}

static int check_what(unsigned what) {
  if (what == 0 || (what & ~(GPURECLAIM_CACHED | GPURECLAIM_ORPHANED | GPURECLAIM_ALL)))
    return -EINVAL;
  if (gr_state_disabled() || atomic_load_explicit(&gr_state_run, memory_order_acquire) != 1)
    return -ENOTSUP;
  if (gr_tls.hook_depth || gr_admit_held())
    return -EDEADLK; /* inside an allocation, or a releaser of a release this thread runs: it would wait for itself */
  return 0;
}

GPURECLAIM_API int gpureclaim_release(unsigned what, gpureclaim_report_t *out) {
  if (out && out->size < offsetof(gpureclaim_report_t, seq) + sizeof(uint64_t))
    return -EINVAL;
  int rc = check_what(what);
  if (!rc && gr_gate_check() != CUDA_SUCCESS)
    rc = -ENOMEM; /* it slept, and the device had no room to wake it: as any CUDA call would fail */
  return rc ? rc : gr_release_run(what, GPURECLAIM_TRIGGER_API, out);
}

GPURECLAIM_API int gpureclaim_release_context(void *ctx, gpureclaim_report_t *out) {
  if (!ctx || (out && out->size < offsetof(gpureclaim_report_t, seq) + sizeof(uint64_t)))
    return -EINVAL;
  int rc = check_what(GPURECLAIM_ALL);
  if (!rc && gr_gate_check() != CUDA_SUCCESS)
    rc = -ENOMEM;
  if (rc)
    return rc;
  uint16_t id = gr_reg_ctx_find((CUcontext)ctx);
  if (!id || !gr_reg_ctx_alive(id))
    return -ENOENT;
  rel_args_t a = {.what = GPURECLAIM_ALL, .trigger = GPURECLAIM_TRIGGER_API, .only_ctx = true, .ctx_id = id};
  gpureclaim_report_t rep;
  rc = do_release(&a, &rep);
  copy_report(out, &rep);
  return rc == -EBUSY ? rc : 0;
}

GPURECLAIM_API int gpureclaim_scope_end(uint64_t scope, unsigned flags) {
  if (gr_state_disabled())
    return -ENOTSUP;
  if (scope == 0 || (flags & ~GPURECLAIM_FREE_NOW))
    return -EINVAL;
  gr_scope_ended_t e;
  int rc = gr_scope_end(scope, &e);
  if (rc != 0)
    return rc;
  /* Under the same keys: the release costs what the scope held too. */
  if ((flags & GPURECLAIM_FREE_NOW) && e.orphans)
    gr_release_free_scope_now(e.slot, e.scan ? NULL : e.keys, e.scan ? 0 : e.n, NULL);
  gr_scope_end_finish(&e);
  return 0;
}

void gr_release_free_scope_now(uint16_t slot, const gr_scope_key_t *keys, size_t n, gpureclaim_report_t *out) {
  rel_args_t a = {.what = GPURECLAIM_ORPHANED, .trigger = GPURECLAIM_TRIGGER_SCOPE, .scope = slot, .keys = keys,
                  .nkeys = n};
  gpureclaim_report_t rep;
  gr_gate_check(); /* the calling thread wakes the process first, as its CUDA call would (without room: the
                      release is refused, and the orphans wait for the next one) */
  do_release(&a, &rep);
  copy_report(out, &rep);
}

/* ---- a peer's request (give.c) ---- */

typedef struct {
  uint64_t devmask;
} sync_dev_t;

static void sync_ctx_on(uint16_t id, CUcontext ctx, int device, void *arg) {
  const sync_dev_t *s = arg;
  if (device >= 0 && device < 64 && ((s->devmask >> device) & 1))
    sync_ctx(id, ctx, device, NULL);
}

static bool past(const struct timespec *deadline) { return gr_ms_until(deadline) == 0; }

/* Cheapest first, and only while short: orphans (nobody uses them), then the pools' unused memory (trimmed by
 * what is still missing), then framework caches and registered releasers (the giver allocates again later),
 * then, only when GPURECLAIM_ON_SIGNAL names it, every block of those devices. */
void gr_release_give(uint64_t want, uint64_t devmask, int asker, bool framework_ok, const struct timespec *deadline,
                 gpureclaim_report_t *rep) {
  unsigned allow = gr_opt()->on_signal;
  memset(rep, 0, sizeof *rep);
  rep->size = sizeof *rep;
  rep->trigger = GPURECLAIM_TRIGGER_PEER;
  rep->peer_pid = asker;
  /* A give calls the driver as a release does: never while the process sleeps (its device memory is on the
   * host then, so there is nothing to give) or is going to sleep. */
  if (gr_admit_release_begin() != 0)
    return; /* asleep, or a graph is being captured: nothing given (the asker asks the next process) */
  rep->seq = atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed) + 1;
  uint64_t t0 = gr_mono_ns();
  mem_info(rep, false);
  free_job_t job;
  memset(&job, 0, sizeof job);
  job.rep = rep;
  job.devmask = devmask;
  uint64_t given = 0;
  if (allow & GPURECLAIM_ORPHANED) {
    rep->what |= GPURECLAIM_ORPHANED;
    job.states = GR_STMASK(GR_ST_ORPHAN);
    job.pass = PASS_BLOCKS;
    free_pass(&job);
    given = rep->orphaned_bytes;
  }
  bool cached = (allow & GPURECLAIM_CACHED) != 0;
  if ((cached && given < want && !past(deadline)) || job.npools) {
    sync_dev_t sd = {devmask};
    gr_reg_foreach_ctx(sync_ctx_on, &sd);
    if (job.npools) { /* orphans' stream-ordered blocks went back to their pools: that memory goes too */
      trim_job_t t = {rep, job.pools, job.npools, devmask, false, 0};
      gr_reg_foreach_pool(trim_pool, &t);
    }
    if (cached && given < want) {
      uint64_t before = rep->pool_bytes;
      rep->what |= GPURECLAIM_CACHED;
      trim_job_t t = {rep, NULL, 0, devmask, true, want - given};
      gr_reg_foreach_pool(trim_pool, &t);
      given += rep->pool_bytes - before;
    }
  }
  if (cached && given < want && framework_ok && !past(deadline)) {
    rep->what |= GPURECLAIM_CACHED;
    if (gr_opt()->python)
      rep->framework_bytes = gr_py_release();
    rep->releaser_bytes = call_releasers();
    given += rep->framework_bytes + rep->releaser_bytes;
  }
  if ((allow & GPURECLAIM_ALL) && given < want && !past(deadline)) {
    rep->what |= GPURECLAIM_ALL;
    job.all = true;
    job.states = GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN);
    job.npools = 0;
    for (job.pass = PASS_MAPPINGS; job.pass <= PASS_VA; job.pass++)
      free_pass(&job);
    if (job.npools) {
      trim_job_t t = {rep, job.pools, job.npools, devmask, false, 0};
      gr_reg_foreach_pool(trim_pool, &t);
    }
  }
  free(job.claimed);
  rep->cached_bytes = rep->pool_bytes + rep->framework_bytes + rep->releaser_bytes;
  mem_info(rep, true);
  rep->duration_ns = gr_mono_ns() - t0;
  uint64_t total = rep->cached_bytes + rep->orphaned_bytes + rep->all_bytes;
  gr_stats_release(total);
  gr_stats_peer_give(total);
  if (total)
    gr_release_note_give(); /* before the report rewrites the status file: peers then ask us last for a while */
  gr_report_release(rep);
  gr_report_status_release(rep, false);
  gr_admit_release_end();
}

/* ---- out of memory ---- */

static _Atomic int g_oom_busy;

/* ---- the last give ---- */

static _Atomic uint64_t g_last_give_ms; /* CLOCK_REALTIME ms of the last give that gave something; 0 never */

void gr_release_note_give(void) { atomic_store_explicit(&g_last_give_ms, gr_wall_ms(), memory_order_relaxed); }

uint64_t gr_release_last_give_ms(void) { return atomic_load_explicit(&g_last_give_ms, memory_order_relaxed); }

uint64_t gr_release_for_oom(void) {
  if (atomic_exchange_explicit(&g_oom_busy, 1, memory_order_acq_rel))
    return 1; /* another allocation is releasing right now: worth one more try, never worth waiting */
  rel_args_t a = {.what = GPURECLAIM_CACHED | GPURECLAIM_ORPHANED, .trigger = GPURECLAIM_TRIGGER_OOM};
  gpureclaim_report_t rep;
  do_release(&a, &rep); /* refused while a graph is being captured: 0, so the allocation returns the driver's
                           out of memory unchanged, without a retry */
  atomic_store_explicit(&g_oom_busy, 0, memory_order_release);
  return rep.cached_bytes + rep.orphaned_bytes;
}

void gr_release_atfork_child(void) {
  /* Locks may have been held by threads that did not survive the fork. */
  pthread_mutex_init(&g_mu, NULL);
  pthread_cond_init(&g_cv, NULL);
  pthread_mutex_init(&g_rel_lock, NULL);
  g_running = false;
  g_pending_what = 0;
  g_pending_trigger = 0;
  g_pending_signal = false;
  g_requested = g_served = 0;
  g_last_rc = 0;
  atomic_store_explicit(&g_oom_busy, 0, memory_order_relaxed);
  atomic_store_explicit(&g_last_give_ms, 0, memory_order_relaxed);
  atomic_store_explicit(&g_seq, 0, memory_order_relaxed);
  for (int i = 0; i < MAX_RELEASERS; i++)
    atomic_store_explicit(&g_rel[i].running, 0, memory_order_relaxed);
}
