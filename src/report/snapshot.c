/*
 * snapshot.c -- what this process holds, for the control socket's stats and snapshot answers and
 * gpureclaim_snapshot(): the counters, per device, the pools, the GPUs, the framework caches, and with a
 * snapshot every block of the table. Format: docs/PROTOCOL.md.
 */
#include "real.h"
#include "registry.h"
#include "stats.h"
#include "scope.h"
#include "stacks.h"
#include "python.h"
#include "gate.h"
#include "json.h"
#include "report.h"
#include "state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static void stats_fields(jbuf_t *b, const gpureclaim_stats_t *s) {
#define F(name) jb_u64(b, #name, s->name)
  F(live_blocks); F(live_bytes); F(peak_bytes); F(total_allocs); F(total_frees); F(pool_reserved_bytes);
  F(pool_used_bytes); F(host_pinned_blocks); F(host_pinned_bytes); F(va_reserved_bytes); F(vmm_mapped_bytes);
  F(orphan_blocks); F(orphan_bytes); F(ctx_destroyed_blocks); F(ctx_destroyed_bytes); F(untracked_frees);
  F(late_frees); F(untracked_routes); F(releases); F(released_bytes); F(oom_retries); F(oom_retry_successes);
  F(table_bytes); F(contexts); F(pools); F(peer_reclaims); F(peer_reclaim_successes); F(peer_received_bytes);
  F(peer_gives); F(peer_given_bytes);
#undef F
}

static void device_stats(jbuf_t *b) {
  jb_arr(b, "devices");
  for (int d = 0; d < GR_MAX_DEV; d++) {
    gpureclaim_stats_t s = {.size = sizeof s};
    if (gr_stats_get(d, &s) != 0 || (!s.total_allocs && !s.pool_reserved_bytes && !s.live_blocks))
      continue;
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d);
    stats_fields(b, &s);
    jb_obj_end(b);
  }
  jb_arr_end(b);
}

static void pool_json(uint16_t id, CUmemoryPool pool, int device, void *arg) {
  (void)id;
  jbuf_t *b = arg;
  cuuint64_t reserved = 0, used = 0;
  if (gr_drv.cuMemPoolGetAttribute && gr_gate_driver_begin()) { /* asleep: the driver cannot be asked */
    gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    gr_gate_leave(); /* counted in flight meanwhile: a sleep locks only after */
  }
  jb_key(b, NULL);
  jb_obj(b);
  jb_hex(b, "pool", (uint64_t)(uintptr_t)pool);
  jb_i64(b, "device", device);
  jb_u64(b, "reserved_bytes", reserved);
  jb_u64(b, "used_bytes", used);
  jb_obj_end(b);
}


/* Framework caches' releasable bytes per device, as last measured (the status file's "peer" object shows them
 * as what could be given). */
static _Atomic uint64_t g_fw[GR_MAX_DEV];

uint64_t gr_report_framework_releasable(int device) {
  return device >= 0 && device < GR_MAX_DEV ? atomic_load_explicit(&g_fw[device], memory_order_relaxed) : 0;
}

static void note_frameworks(const gr_py_cache_t *c, int n) {
  uint64_t fw[GR_MAX_DEV] = {0};
  for (int i = 0; i < n; i++)
    if (c[i].device >= 0 && c[i].device < GR_MAX_DEV)
      fw[c[i].device] += c[i].releasable;
  for (int d = 0; d < GR_MAX_DEV; d++)
    atomic_store_explicit(&g_fw[d], fw[d], memory_order_relaxed);
}

/* "frameworks": what framework caches hold, read through CPython (releasers/python.c). */
static void frameworks_json(jbuf_t *b) {
  gr_py_cache_t c[16];
  int n = gr_py_caches(c, (int)GR_ARRAY_LEN(c));
  note_frameworks(c, n); /* what the status file says a peer could give ("as last measured") */
  jb_arr(b, "frameworks");
  for (int i = 0; i < n; i++) {
    jb_key(b, NULL);
    jb_obj(b);
    jb_str(b, "framework", c[i].name);
    jb_i64(b, "device", c[i].device);
    jb_u64(b, "reserved_bytes", c[i].reserved);
    jb_u64(b, "allocated_bytes", c[i].allocated);
    jb_u64(b, "releasable_bytes", c[i].releasable);
    jb_obj_end(b);
  }
  jb_arr_end(b);
}

void gr_report_stats_json(jbuf_t *b) {
  gpureclaim_stats_t s = {.size = sizeof s};
  gr_stats_get(-1, &s);
  jb_key(b, "total");
  jb_obj(b);
  stats_fields(b, &s);
  jb_obj_end(b);
  device_stats(b);
  jb_arr(b, "pools");
  gr_reg_foreach_pool(pool_json, b);
  jb_arr_end(b);
  gr_report_gpus_json(b, true);
  frameworks_json(b);
  gr_report_status_sleep_json(b);
}

/* ---- snapshots ---- */

typedef struct {
  jbuf_t *b;
  uint64_t ctx_blocks[GR_MAX_CTX], ctx_bytes[GR_MAX_CTX];
} snap_t;

static void block_json(jbuf_t *b, const gpureclaim_block_t *x) {
  jb_key(b, NULL);
  jb_obj(b);
  jb_hex(b, "address", x->address);
  jb_u64(b, "bytes", x->bytes);
  jb_str(b, "kind", gr_kind_name(x->kind));
  jb_str(b, "state", gr_block_state_name(x->state));
  jb_i64(b, "device", x->device);
  if (x->context)
    jb_hex(b, "context", (uint64_t)(uintptr_t)x->context);
  else
    jb_null(b, "context");
  if (x->pool)
    jb_hex(b, "pool", (uint64_t)(uintptr_t)x->pool);
  else
    jb_null(b, "pool");
  jb_u64(b, "scope", x->scope);
  jb_u64(b, "thread", x->thread_id);
  jb_u64(b, "time_ms", x->alloc_time_ms);
  jb_hex(b, "caller", (uint64_t)(uintptr_t)x->caller);
  jb_str(b, "library", x->library);
  jb_str(b, "api", x->api);
  jb_str(b, "owner", x->owner);
  if (x->kind == GPURECLAIM_KIND_VMM_MAPPING)
    jb_hex(b, "handle", x->handle);
  jb_obj_end(b);
}

static int snap_block(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  if (r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN && r->state != GR_ST_RELEASED)
    return 0;
  snap_t *s = arg;
  gpureclaim_block_t x;
  gr_block_from_rec(r, &x);
  block_json(s->b, &x);
  if (r->ctx_id && r->ctx_id < GR_MAX_CTX && gr_kind_is_device_memory(r->kind)) {
    s->ctx_blocks[r->ctx_id]++;
    s->ctx_bytes[r->ctx_id] += r->size;
  }
  return 0;
}

int gr_report_snapshot_json(jbuf_t *b) {
  snap_t *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->b = b;
  jb_obj(b);
  jb_i64(b, "pid", getpid());
  jb_str(b, "version", GPURECLAIM_VERSION_STRING);
  jb_u64(b, "time_ms", gr_wall_ms());
  gr_report_stats_json(b);
  jb_arr(b, "blocks");
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1)
    gr_table_visit(snap_block, s);
  jb_arr_end(b);
  jb_arr(b, "contexts");
  for (uint16_t id = 1; id < GR_MAX_CTX; id++) {
    if (!s->ctx_blocks[id] && !gr_reg_ctx_alive(id))
      continue;
    jb_key(b, NULL);
    jb_obj(b);
    jb_hex(b, "context", (uint64_t)(uintptr_t)gr_reg_ctx_handle(id));
    jb_i64(b, "device", gr_reg_ctx_device(id));
    jb_u64(b, "blocks", s->ctx_blocks[id]);
    jb_u64(b, "bytes", s->ctx_bytes[id]);
    jb_obj_end(b);
  }
  jb_arr_end(b);
  jb_obj_end(b);
  free(s);
  return jb_failed(b) ? -ENOMEM : 0;
}
