/* registry.h -- contexts, devices, pools and libraries by id (registry.c). Internal. */
#ifndef GR_REGISTRY_H
#define GR_REGISTRY_H

#include "names.h"
#include "state.h"
#include "table.h"

#include <cuda.h>

#define GR_MAX_CTX 4096
#define GR_MAX_POOLS 4096
#define GR_MAX_DEV 64
/* What a block record's packed fields must hold (table.h, gr_packed_t). */
_Static_assert(GR_MAX_CTX <= 1 << 12 && GR_MAX_POOLS <= 1 << 12, "context and pool ids fit 12 bits");
_Static_assert(GR_MAX_DEV < GR_DEVICE_NONE, "device ordinals fit 7 bits, GR_DEVICE_NONE apart");
_Static_assert(GPURECLAIM_KIND_HOST < 16, "kinds fit 4 bits");
_Static_assert(GR_API_COUNT <= 32, "APIs fit 5 bits");

/* Context -> id (1..4095), adding it; 0 when 4095 contexts are alive at once (registry.c: dead ids are given
 * again once no record names them). device: its ordinal, or -1 to look up. */
uint16_t gr_reg_ctx(CUcontext ctx, int device);
/* Context -> id without adding it; 0 if unknown. */
uint16_t gr_reg_ctx_find(CUcontext ctx);
/* The primary context of a device, as cuDevicePrimaryCtxRetain returned it. */
void gr_reg_primary(int device, CUcontext ctx);
uint16_t gr_reg_primary_id(int device);
/* The device's primary context was reset or finally released: forget cached pools. */
void gr_reg_device_reset(int device);
CUcontext gr_reg_ctx_handle(uint16_t id);
int gr_reg_ctx_device(uint16_t id); /* -1 unknown */
bool gr_reg_ctx_alive(uint16_t id);
/* A context was destroyed (id 0: one gpureclaim had not registered): every thread's kept current context is
 * asked again. */
void gr_reg_ctx_destroyed(uint16_t id);
/* The calling thread's current context id and device (cached per thread: registry.c says when the cache is
 * trusted). Returns false without one. */
bool gr_reg_current(uint16_t *ctx_id, uint8_t *device, CUcontext *ctx);
/* Where an allocation is: its context's id (0 none), its device (GR_DEVICE_NONE unknown), and whether there was a
 * context at all. Returned by value, so the hot path keeps it in a register. */
typedef struct gr_where {
  uint16_t ctx_id;
  uint8_t device;
  bool ok;
} gr_where_t;
/* gr_reg_current and gr_reg_stream, by value (no context handle). */
gr_where_t gr_reg_here(void);
gr_where_t gr_reg_stream_where(CUstream s);
/* The device of the calling thread's current context, -1 for none. */
int gr_reg_here_device(void);
/* The device of a stream-ordered allocation: its pool's (NULL: none), else its stream's; -1 for none known. */
int gr_reg_async_device(CUmemoryPool pool, CUstream s);
/* The calling thread's current context may have changed (it switched, pushed, popped, created or destroyed
 * one, or gpureclaim did for it): its next allocation asks the driver. */
static inline void gr_reg_switched(void) { gr_tls.cur_known = 0; }
/* Before a call that may change the current context: while the thread trusts a kept answer, checks it against the
 * driver's, so a switch by a route gpureclaim does not see is found even when a seen switch follows it. */
void gr_reg_switch_begin(void);
/* Context id and device of a stream (0 and special handles: the current context). */
bool gr_reg_stream(CUstream s, uint16_t *ctx_id, uint8_t *device);

uint16_t gr_reg_pool(CUmemoryPool pool, int device, bool is_default);
CUmemoryPool gr_reg_pool_handle(uint16_t id);
int gr_reg_pool_device(uint16_t id);
void gr_reg_pool_destroyed(CUmemoryPool pool);
/* The device's current pool (cuDeviceGetMemPool, cached; cuDeviceSetMemPool and cuMemSetMemPool update it). */
uint16_t gr_reg_device_pool(int device);
void gr_reg_device_set_pool(int device, CUmemoryPool pool);
/* Calls fn for every live pool. */
void gr_reg_foreach_pool(void (*fn)(uint16_t id, CUmemoryPool pool, int device, void *arg), void *arg);
/* Calls fn for every live context. */
void gr_reg_foreach_ctx(void (*fn)(uint16_t id, CUcontext ctx, int device, void *arg), void *arg);
/* A live context of this process on the device, for driver calls made on its behalf: its primary one when
 * active, else any other; NULL when it has none there (or device < 0). */
CUcontext gr_reg_ctx_on_device(int device);
/* Whether the process has a live context on the device, from the registry alone (no driver call: also asleep). */
bool gr_reg_ctx_known_on_device(int device);
uint64_t gr_reg_ctx_count(void);
uint64_t gr_reg_pool_count(void);

/* Library of a code address: file name (basename; "?" unknown) and owner (gr_owner_of). Cached; slow path
 * only (reports, scope ends). */
typedef struct gr_lib {
  const char *name;
  const char *path;
  const char *owner;
} gr_lib_t;
gr_lib_t gr_reg_library(uintptr_t pc);

void gr_reg_atfork_child(void);

#endif /* GR_REGISTRY_H */
