/*
 * track.c -- what a hook does with a block: fill its record, insert it, take it out before a free, put it
 * back when the driver refused the free, and drop a destroyed context's blocks.
 */
#include "gpureclaim_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void gr_track_fill(gr_rec_t *r, unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra) {
  memset(r, 0, sizeof *r);
  r->key = key;
  r->size = size > GR_SIZE_MAX ? GR_SIZE_MAX : size;
  r->kind = (uint8_t)kind;
  r->state = GR_ST_LIVE;
  r->device = GR_DEVICE_NONE;
  r->time_ms = gr_core_now_ms();
  r->tid = gr_core_tid();
  uintptr_t pc = ra;
  r->api = (uint8_t)driver_api;
  if (gr_tls.rt_depth) { /* inside a runtime call: attribute the block to the runtime call and its caller */
    pc = gr_tls.rt_caller;
    r->api = (uint8_t)gr_tls.rt_api;
  }
  r->site = GR_UNLIKELY(gr_opt()->backtrace) ? gr_stack_capture(pc) : gr_site_at(pc);
  if (kind != GPURECLAIM_KIND_VMM_MAPPING && kind != GPURECLAIM_KIND_VA)
    r->scope = gr_scope_tag();
}

void gr_track_insert(gr_rec_t *r) {
  unsigned ks = gr_kind_keyspace(r->kind);
  if (ks == GR_KS_ADDR || ks == GR_KS_HANDLE)
    gr_rel_key_reused(ks, r->key); /* a freed orphan's address (handle) is back: late frees of it are this one's */
  if (GR_UNLIKELY(gr_table_insert(r) != 0)) {
    gr_warn_once(w_nomem, "no memory for the block table: new blocks are not tracked until memory frees up");
    gr_scope_unref(r->scope);
    return;
  }
  if (r->scope)
    gr_scope_note(r);
  gr_stats_alloc(r);
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
  /* A block a release freed (or is freeing) must not be freed again by the driver. */
  bool consumed = false;
  if ((ks != GR_KS_ADDR && ks != GR_KS_HANDLE) ||
      !((consumed = gr_table_take(ks, key, GR_STMASK(GR_ST_RECLAIMED), NULL) == 0) ||
        gr_table_lookup(ks, key, GR_STMASK(GR_ST_RECLAIMING), NULL) == 0))
    return false;
  if (consumed)
    gr_rel_tombstone_gone(ks);
  if (consumed && ks == GR_KS_HANDLE && handle_live(key))
    return false;
  gr_stats_late_free();
  gr_warn_once(w_late, "the program freed %#llx, which a release had already freed as an orphan; the free was "
                       "not passed to the driver (further late frees are counted in late_frees)",
               (unsigned long long)key);
  return true;
}

int gr_track_take(unsigned ks, uint64_t key, unsigned kind_mask, gr_rec_t *out) {
  if (GR_LIKELY(gr_table_take_kind(ks, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), kind_mask, out) == 0))
    return 1;
  if (gr_track_late_free(ks, key))
    return -1;
  /* The driver may have handed the address out again meanwhile (a late free racing another thread's
   * allocation, which consumed the tombstone): this free is then a free of that block, record included, or
   * its record would outlive it. */
  if (gr_table_take_kind(ks, key, GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN), kind_mask, out) == 0)
    return 1;
  gr_stats_untracked_free();
  return 0;
}

void gr_track_freed(const gr_rec_t *r) {
  gr_stats_free(r);
  gr_scope_unref(r->scope);
}

void gr_track_restore(const gr_rec_t *r) {
  /* The driver refused the free: the block is still there. Its counts never changed. */
  if (gr_table_insert(r) != 0)
    gr_warn_once(w_restore, "no memory to keep tracking a block whose free the driver refused");
  else if (r->scope)
    gr_scope_note(r); /* its scope's list may have dropped it while it was out of the table */
}

typedef struct {
  uint16_t ctx_id;
  gr_detached_t *d;
} detach_t;

static int detach_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  detach_t *a = arg;
  /* RECLAIMING: claimed by a release, which holds the context gate until it has freed it, so a detach (which
   * holds the gate too) never meets one; were it to, the release settles that record itself. */
  if (r->ctx_id != a->ctx_id || r->state == GR_ST_RECLAIMING)
    return 0;
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_DELETED;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN)
    want = expect, want.state = GR_ST_DELETED;
  if (rc != 0)
    return 0;
  gr_detached_t *d = a->d;
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 64;
    gr_rec_t *p = realloc(d->recs, cap * sizeof *p);
    if (!p) { /* cannot remember it for a rollback: count it as gone now */
      if (expect.state != GR_ST_RECLAIMED) {
        gr_stats_ctx_destroyed(&expect);
        gr_scope_unref(expect.scope);
      }
      return 0;
    }
    d->recs = p;
    d->cap = cap;
  }
  d->recs[d->n++] = expect;
  return 0;
}

void gr_track_ctx_detach(uint16_t ctx_id, gr_detached_t *d) {
  detach_t a = {ctx_id, d};
  gr_table_visit(detach_one, &a);
}

void gr_track_ctx_commit(gr_detached_t *d, bool destroyed) {
  for (size_t i = 0; i < d->n; i++) {
    gr_rec_t *r = &d->recs[i];
    if (!destroyed) {
      gr_track_restore(r);
      continue;
    }
    if (r->state == GR_ST_RECLAIMED) {
      gr_rel_tombstone_gone(gr_kind_keyspace(r->kind)); /* counted, and its scope released, when the release freed it */
      continue;
    }
    gr_stats_ctx_destroyed(r);
    gr_scope_unref(r->scope);
  }
  free(d->recs);
  d->recs = NULL;
  d->n = d->cap = 0;
}
