/*
 * gpus.c -- the GPUs as reports show them: ordinal, UUID as nvidia-smi writes it, and the driver's memory
 * figures. Asleep, the driver is not asked: what was read before is shown.
 */
#include "real.h"
#include "registry.h"
#include "gate.h"
#include "json.h"
#include "report.h"
#include "state.h"

#include <pthread.h>
#include <stdio.h>

typedef CUresult (*uuid_fn_t)(CUuuid *, CUdevice);
static uuid_fn_t g_uuid_fn;
static pthread_once_t g_uuid_once = PTHREAD_ONCE_INIT;

static void resolve_uuid(void) {
  /* _v2 names a MIG instance by its own UUID; the first version, the GPU's. */
  *(void **)&g_uuid_fn = gr_real_driver("cuDeviceGetUuid_v2");
  if (!g_uuid_fn)
    *(void **)&g_uuid_fn = gr_real_driver("cuDeviceGetUuid");
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of device ordinal d, as nvidia-smi -L shows it; false if unknown. */
static struct {
  _Atomic int known;
  CUuuid u;
} g_uuid_cache[GR_MAX_DEV]; /* a device's UUID never changes: asleep, the driver is not asked again */

bool gr_report_gpu_uuid(int d, char *buf, size_t len) {
  pthread_once(&g_uuid_once, resolve_uuid);
  CUdevice dev;
  CUuuid u;
  if (d >= 0 && d < GR_MAX_DEV && atomic_load_explicit(&g_uuid_cache[d].known, memory_order_acquire)) {
    u = g_uuid_cache[d].u;
  } else {
    if (gr_gate_driver_off() || !g_uuid_fn || !gr_drv.cuDeviceGet || gr_drv.cuDeviceGet(&dev, d) != CUDA_SUCCESS ||
        g_uuid_fn(&u, dev) != CUDA_SUCCESS)
      return false;
    if (d >= 0 && d < GR_MAX_DEV && !atomic_load_explicit(&g_uuid_cache[d].known, memory_order_relaxed)) {
      g_uuid_cache[d].u = u; /* the same bytes whichever thread writes them first */
      atomic_store_explicit(&g_uuid_cache[d].known, 1, memory_order_release);
    }
  }
  const unsigned char *x = (const unsigned char *)u.bytes;
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1], x[2], x[3],
           x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
  return true;
}

/* "gpus": ordinal and UUID of each GPU; with memory, of those this process has a context on, with
 * cuMemGetInfo's figures (the whole device's: every process's memory and every context's own included), else
 * of every GPU it can see (none before cuInit). */
static _Atomic int g_count_seen; /* the last device count read: asleep, the driver is not asked */

void gr_report_gpus_json(jbuf_t *b, bool memory) {
  int count = 0;
  bool off = !gr_gate_driver_begin(); /* awake: counted in flight to the end, a sleep locks only after */
  if (off)
    count = atomic_load_explicit(&g_count_seen, memory_order_relaxed);
  else if (!gr_drv.cuDeviceGetCount || gr_drv.cuDeviceGetCount(&count) != CUDA_SUCCESS)
    count = 0;
  else
    atomic_store_explicit(&g_count_seen, count, memory_order_relaxed);
  /* Asleep, the GPUs of its contexts still, as the registry knows them (no figures: the driver is not asked). A
   * sleep once listed every GPU the process could see here, so ps showed GPUs it never used while it slept. */
  bool used_only = memory && atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1;
  memory = memory && !off;
  jb_arr(b, "gpus");
  for (int d = 0; d < count && d < GR_MAX_DEV; d++) {
    CUcontext ctx = used_only && memory ? gr_reg_ctx_on_device(d) : NULL;
    if (used_only ? (memory ? !ctx : !gr_reg_ctx_known_on_device(d)) : memory)
      continue;
    char uuid[64];
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d);
    jb_str(b, "uuid", gr_report_gpu_uuid(d, uuid, sizeof uuid) ? uuid : NULL);
    if (memory) {
      size_t free_b = 0, total = 0;
      CUcontext cur = NULL;
      bool pushed = false;
      if (gr_drv.cuCtxPushCurrent && gr_drv.cuCtxGetCurrent && gr_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS &&
          cur != ctx)
        pushed = gr_drv.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
      if (gr_drv.cuMemGetInfo && gr_drv.cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS) {
        jb_u64(b, "free_bytes", free_b);
        jb_u64(b, "total_bytes", total);
      }
      if (pushed)
        gr_drv.cuCtxPopCurrent(&cur);
    }
    jb_obj_end(b);
  }
  jb_arr_end(b);
  if (!off)
    gr_gate_leave();
}
