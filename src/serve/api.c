/*
 * api.c -- the public functions of gpureclaim.h that read the table and the counters. The release functions
 * (a scope's end included: it may release at once) are in release.c, the other scope functions in scope.c,
 * files in report/.
 */
#include "registry.h"
#include "stats.h"
#include "state.h"
#include "report.h"

#include <errno.h>
#include <string.h>

GPURECLAIM_API const char *gpureclaim_version(void) { return GPURECLAIM_VERSION_STRING; }

GPURECLAIM_API int gpureclaim_enabled(void) { return !gr_state_disabled(); }

GPURECLAIM_API int gpureclaim_stats(int device, gpureclaim_stats_t *out) {
  if (!out || out->size < offsetof(gpureclaim_stats_t, live_blocks) + sizeof(uint64_t) || device < -1 ||
      device >= GR_MAX_DEV)
    return -EINVAL;
  if (gr_state_disabled())
    return -ENOTSUP;
  return gr_stats_get(device, out);
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
  if (gr_state_disabled())
    return -ENOTSUP;
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) != 1)
    return 0;
  each_t e = {fn, arg};
  return gr_table_visit(each, &e);
}
