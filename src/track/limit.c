/*
 * limit.c -- GPURECLAIM_LIMIT: the device memory this process may hold on each device.
 *
 * What counts: the process's live device memory as the block table has it (stats.c tells this module of every
 * block of a device kind that comes and goes: cuMemAlloc, pitch, managed, stream-ordered and pool blocks,
 * cuMemCreate's physical handles), so a framework's cache, which the driver sees as live blocks, counts too.
 * What a stream-ordered pool keeps reserved after its blocks were freed does not (the driver hands it to the
 * next allocation from that pool; a release trims it), nor do address reservations or pinned host memory.
 *
 * Admission: an allocation adds its bytes to the device's count before it reaches the driver, with a
 * compare-and-swap that refuses to pass the limit, so that concurrent allocations never overshoot together. The
 * calling thread keeps that reservation (t_res) until the block is tracked: stats.c's gr_limit_counted then
 * turns it into the block's own count (correcting it by what the driver allocated: a pitch allocation's rows
 * are padded), on the same thread and before the hook returns; gr_limit_end gives back a reservation nobody
 * took (the driver failed). Frees, releases and context destroys take the block's bytes off again.
 *
 * Ordering: each device's count is one atomic, and nothing else is published through it, so relaxed operations
 * suffice: the compare-and-swap makes admissions a total order on the count (no two pass the limit together),
 * and a free's subtraction is seen by the next admission that reads the count after it. The count is exact:
 * an admitted block is counted once (its reservation, corrected), never twice.
 */
#include "limit.h"
#include "real.h"
#include "registry.h"
#include "state.h"
#include "options.h"

#include <stddef.h>

_Atomic int gr_limit_flag;

/* By device: what counts against the limit (signed: a reservation given back and a block counted in the other
 * order never show a huge figure), and the limit itself once known (0: not yet asked; NONE: no limit). */
#define NONE UINT64_MAX
static struct {
  _Atomic int64_t held;
  _Atomic uint64_t limit;
  _Atomic uint64_t guarantee; /* GPURECLAIM_GUARANTEE given as a fraction, once resolved (0: not yet) */
} __attribute__((aligned(64))) g_dev[GR_MAX_DEV];

typedef struct {
  int device; /* -1: no reservation */
  uint64_t bytes;
} reservation_t;
static GR_TLS reservation_t t_res = {-1, 0};

void gr_limit_start(void) {
  const gr_opt_size_t *l = &gr_opt()->limit;
  atomic_store_explicit(&gr_limit_flag, l->bytes || l->ppm, memory_order_relaxed);
}

/* The device's total memory, 0 when the driver does not say. */
static uint64_t device_total(int device) {
  CUdevice dev;
  size_t total = 0;
  if (!gr_drv.cuDeviceGet || !gr_drv.cuDeviceTotalMem || gr_drv.cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      gr_drv.cuDeviceTotalMem(&total, dev) != CUDA_SUCCESS)
    return 0;
  return total;
}

GR_COLD static uint64_t resolve(int device) {
  const gr_opt_size_t *l = &gr_opt()->limit;
  uint64_t total = device_total(device), v;
  char a[32], b[32];
  if (l->ppm && !total) {
    gr_warn_once(w_no_total, "GPURECLAIM_LIMIT is a fraction of the device, and the driver does not say how much "
                             "memory GPU %d has: no limit there (give the limit in bytes, e.g. GPURECLAIM_LIMIT=8G)",
                 device);
    v = NONE;
  } else {
    v = gr_opt_size_bytes(l, total);
    if (v == 0)
      v = 1; /* a fraction of a tiny device: one byte, not "unset" */
    if (total && v > total)
      gr_warn_once(w_above, "GPURECLAIM_LIMIT (%s) is above GPU %d's memory (%s): it limits nothing there, and "
                            "cuMemGetInfo reports the device's total",
                   gr_log_bytes(v, a, sizeof a), device, gr_log_bytes(total, b, sizeof b));
    else
      gr_info("GPU %d: this process may hold %s of its %s (GPURECLAIM_LIMIT)", device, gr_log_bytes(v, a, sizeof a),
              gr_log_bytes(total, b, sizeof b));
  }
  uint64_t expected = 0;
  atomic_compare_exchange_strong_explicit(&g_dev[device].limit, &expected, v, memory_order_relaxed,
                                          memory_order_relaxed);
  return atomic_load_explicit(&g_dev[device].limit, memory_order_relaxed);
}

/* The limit on device: NONE for none. */
static uint64_t limit_of(int device) {
  if (!gr_limit_on() || device < 0 || device >= GR_MAX_DEV)
    return NONE;
  uint64_t v = atomic_load_explicit(&g_dev[device].limit, memory_order_relaxed);
  return GR_LIKELY(v != 0) ? v : resolve(device);
}

uint64_t gr_limit_guarantee_bytes(int device) {
  const gr_opt_size_t *g = &gr_opt()->guarantee;
  if (g->bytes || !g->ppm)
    return g->bytes; /* in bytes, or none */
  if (device < 0 || device >= GR_MAX_DEV)
    return 0;
  uint64_t v = atomic_load_explicit(&g_dev[device].guarantee, memory_order_relaxed);
  if (v)
    return v;
  uint64_t total = device_total(device); /* a fraction of a device the driver does not describe: none */
  v = total ? gr_opt_size_bytes(g, total) : 0;
  if (v)
    atomic_store_explicit(&g_dev[device].guarantee, v, memory_order_relaxed);
  return v;
}

uint64_t gr_limit_bytes(int device) {
  uint64_t v = limit_of(device);
  return v == NONE ? 0 : v;
}

uint64_t gr_limit_held(int device) {
  if (device < 0 || device >= GR_MAX_DEV)
    return 0;
  int64_t h = atomic_load_explicit(&g_dev[device].held, memory_order_relaxed);
  return h > 0 ? (uint64_t)h : 0;
}

int gr_limit_admit(int device, uint64_t bytes) {
  uint64_t lim = limit_of(device);
  if (lim == NONE)
    return 1;
  if (bytes > lim)
    return 0;
  int64_t cur = atomic_load_explicit(&g_dev[device].held, memory_order_relaxed);
  do {
    if (cur > 0 && (uint64_t)cur > lim - bytes)
      return 0;
  } while (!atomic_compare_exchange_weak_explicit(&g_dev[device].held, &cur, cur + (int64_t)bytes,
                                                  memory_order_relaxed, memory_order_relaxed));
  t_res = (reservation_t){device, bytes};
  return 1;
}

void gr_limit_end(void) {
  if (t_res.device < 0)
    return;
  atomic_fetch_sub_explicit(&g_dev[t_res.device].held, (int64_t)t_res.bytes, memory_order_relaxed);
  t_res.device = -1;
}

void gr_limit_counted(unsigned device, uint64_t bytes) {
  int64_t add = (int64_t)bytes;
  if (t_res.device >= 0) { /* this thread's admitted allocation: its reservation becomes the block's count */
    if ((unsigned)t_res.device == device)
      add -= (int64_t)t_res.bytes;
    else
      atomic_fetch_sub_explicit(&g_dev[t_res.device].held, (int64_t)t_res.bytes, memory_order_relaxed);
    t_res.device = -1;
  }
  if (device < GR_MAX_DEV && add)
    atomic_fetch_add_explicit(&g_dev[device].held, add, memory_order_relaxed);
}

void gr_limit_uncounted(unsigned device, uint64_t bytes) {
  if (device < GR_MAX_DEV)
    atomic_fetch_sub_explicit(&g_dev[device].held, (int64_t)bytes, memory_order_relaxed);
}

void gr_limit_mem_info(int device, uint64_t *free_b, uint64_t *total) {
  uint64_t lim = limit_of(device);
  if (lim == NONE)
    return;
  uint64_t held = gr_limit_held(device), room = lim > held ? lim - held : 0;
  if (*total > lim)
    *total = lim;
  if (*free_b > room)
    *free_b = room;
}

void gr_limit_atfork_child(void) {
  /* The child starts over with no device memory (core.c), and reads the options again as it starts. */
  for (int d = 0; d < GR_MAX_DEV; d++) {
    atomic_store_explicit(&g_dev[d].held, 0, memory_order_relaxed);
    atomic_store_explicit(&g_dev[d].limit, 0, memory_order_relaxed);
  }
  t_res.device = -1;
}
