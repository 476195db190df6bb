/*
 * api.c -- the public functions of gpureclaim.h that read the table and the counters. The release functions
 * are in release.c, scopes in scope.c, files in report/.
 */
#include "gpureclaim_internal.h"

#include <errno.h>
#include <string.h>

GPURECLAIM_API const char *gpureclaim_version(void) { return GPURECLAIM_VERSION_STRING; }

GPURECLAIM_API int gpureclaim_enabled(void) { return !gr_core_disabled(); }

GPURECLAIM_API int gpureclaim_stats(int device, gpureclaim_stats_t *out) {
  if (!out || out->size < offsetof(gpureclaim_stats_t, live_blocks) + sizeof(uint64_t) || device < -1 ||
      device >= GR_MAX_DEV)
    return -EINVAL;
  if (gr_core_disabled())
    return -ENOTSUP;
  return gr_stats_get(device, out);
}

void gr_block_from_rec(const gr_rec_t *r, gpureclaim_block_t *b) {
  memset(b, 0, sizeof *b);
  b->size = sizeof *b;
  b->address = r->key;
  b->bytes = r->size;
  b->kind = r->kind;
  b->state = r->state == GR_ST_ORPHAN ? GPURECLAIM_BLOCK_ORPHAN
             : r->state == GR_ST_RELEASED ? GPURECLAIM_BLOCK_RELEASED
                                          : GPURECLAIM_BLOCK_LIVE;
  b->device = r->device == GR_DEVICE_NONE ? -1 : r->device;
  b->thread_id = r->tid;
  b->context = gr_reg_ctx_handle(r->ctx_id);
  b->pool = gr_reg_pool_handle(r->pool_id);
  b->scope = r->kind == GPURECLAIM_KIND_VMM_MAPPING || r->kind == GPURECLAIM_KIND_VA ? 0 : gr_scope_id(r->scope);
  b->alloc_time_ms = r->time_ms;
  b->api = gr_api_name(r->api);
  if (r->kind == GPURECLAIM_KIND_VMM_MAPPING) {
    b->handle = r->map_handle;
    b->library = "?";
  } else {
    uintptr_t pc = gr_site_pc(r->site);
    gr_lib_t lib = gr_reg_library(pc);
    b->caller = (const void *)pc;
    b->library = lib.name;
    b->owner = lib.owner;
  }
}

typedef struct {
  int (*fn)(const gpureclaim_block_t *, void *);
  void *arg;
} each_t;

static int each(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  if (r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN && r->state != GR_ST_RELEASED)
    return 0; /* being freed by a release, or already freed */
  each_t *e = arg;
  gpureclaim_block_t b;
  gr_block_from_rec(r, &b);
  return e->fn(&b, e->arg);
}

GPURECLAIM_API int gpureclaim_foreach_block(int (*fn)(const gpureclaim_block_t *block, void *arg), void *arg) {
  if (!fn)
    return -EINVAL;
  if (gr_core_disabled())
    return -ENOTSUP;
  if (atomic_load_explicit(&gr_core_state, memory_order_acquire) != 1)
    return 0;
  each_t e = {fn, arg};
  return gr_table_visit(each, &e);
}
