/* track.h -- what a hook does with a block: insert, take, restore, late frees, VMM rules, context destroys (track.c). Internal. */
#ifndef GR_TRACK_H
#define GR_TRACK_H

#include "table.h"

#include <cuda.h>

/* Fills the common fields of a new record: time, thread, site (runtime attribution if inside a runtime
 * call), scope of the calling thread. */
void gr_track_fill(gr_rec_t *r, unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra);
/* Inserts r and counts it. */
void gr_track_insert(gr_rec_t *r);
/* Removes the block (ks, key) whose kind is in kind_mask before the real free. Returns:
 *   1  removed, *out filled: call the real free, then gr_track_freed() or gr_track_restore();
 *   0  not tracked: pass the free to the driver unchanged;
 *  -1  a late free of a block a release already freed: return CUDA_SUCCESS without calling the driver. */
int gr_track_take(unsigned ks, uint64_t key, unsigned kind_mask, gr_rec_t *out);
/* The same, the record as the slot held it (a free's hot path); gr_track_freed_pk after a successful free. */
int gr_track_take_pk(unsigned ks, uint64_t key, unsigned kind_mask, gr_packed_t *out);
void gr_track_freed_pk(const gr_packed_t *p);
/* A free the driver refused with rc, of the record p taken by gr_track_take_pk after seq0 was read: the record
 * goes back, unless the driver found no such block or gave its address to a new one (track.c, "Refused frees"). */
void gr_track_free_refused(const gr_packed_t *p, uint64_t seq0, CUresult rc);
/* A block the driver just allocated in context ctx_id (0: none) of device (GR_DEVICE_NONE: none), from pool
 * pool_id (0: none): its record is built as the slot holds it (time, thread, site, scope as gr_track_fill
 * gives them) and inserted as gr_track_insert_ctx does. seq0: gr_track_ctx_seq() before the driver call. */
void gr_track_alloc(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, unsigned ctx_id,
                    unsigned device, unsigned pool_id, uint64_t seq0);
/* The hooks' allocations, recorded after the driver call succeeded (seq0 as for gr_track_alloc):
 * _here: a block of the calling thread's current context (cuMemAlloc, Pitch, Managed; host memory: no device);
 * _async: a stream-ordered block, in the context and device of its stream, the device of its pool (NULL: the
 * device's current pool); gr_track_add: a VMM handle or address reservation, on device (-1: none known). */
void gr_track_alloc_here(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, uint64_t seq0);
void gr_track_alloc_async(uint64_t key, uint64_t size, CUmemoryPool pool, CUstream s, unsigned driver_api,
                          uintptr_t ra, uint64_t seq0);
void gr_track_add(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, int device);
/* Whether freeing (ks, key), which is not live, is a late free of a block (or VMM handle) a release freed or
 * is freeing: then it is counted and the caller returns CUDA_SUCCESS without calling the driver. */
bool gr_track_late_free(unsigned ks, uint64_t key);
void gr_track_freed(const gr_rec_t *r);
void gr_track_restore(const gr_rec_t *r);
/* A RECLAIMED tombstone is about to be left for (ks, key) by a release: counts it and says whether it may stay
 * (within the bound); a tombstone that left the table another way (late free, its context went, an allocation
 * got its address) is uncounted with gr_track_tombstone_gone. */
bool gr_track_tombstone_add(unsigned ks);
void gr_track_tombstone_gone(unsigned ks);
/* d = +1/-1 around work that leaves records at addresses the driver may hand out again meanwhile (a release's
 * round, a context's destroy): while any runs, every tracked allocation looks for such a record. */
void gr_track_watch(int d);
/* The context lock: a release holds it while it claims and frees blocks, and the hooks that destroy, reset,
 * release or retain a context hold it around the driver call and the table's update. So a context never goes
 * (and its addresses are never handed out again) while a release holds claimed blocks of it, and a final
 * primary release and the driver's state read after it are not split by a retain. Reentrant per thread. */
void gr_track_ctxlock_enter(void);
void gr_track_ctxlock_exit(void);
bool gr_track_ctxlock_held(void);
/* VMM. cuMemRelease: begin before the driver call (1: tracked, call end after it; 0: untracked, pass it on;
 * -1: a late free of a handle a release freed, return CUDA_SUCCESS without the driver). cuMemMap: after a
 * successful call. cuMemUnmap: take the mappings in the range before the call, settle after.
 * gr_track_unmapped: one mapping of handle is gone (the last one of a released handle frees its memory). */
int gr_track_vmm_release_begin(uint64_t handle, gr_rec_t *before);
void gr_track_vmm_release_end(const gr_rec_t *before, bool ok);
void gr_track_vmm_map(uint64_t ptr, uint64_t size, uint64_t handle, uintptr_t ra);
/* The mappings one cuMemUnmap takes out of the table before its driver call: any number (track.c). */
typedef struct gr_unmap {
  uint64_t ptr, end;
  gr_rec_t *v;       /* stack, or heap past it */
  unsigned n, cap;
  bool short_of_memory; /* some were left in the table: taken after a successful call instead */
  gr_rec_t stack[32];
} gr_unmap_t;
void gr_track_vmm_unmap_begin(gr_unmap_t *u, uint64_t ptr, uint64_t size);
void gr_track_vmm_unmap_end(gr_unmap_t *u, bool ok);
void gr_track_unmapped(uint64_t handle);
/* Destroying a context frees its blocks: under the context lock, they are marked detaching before the driver
 * call and either deleted (success) or unmarked (failure) after it. See track.c. */
typedef struct gr_detached {
  uint16_t ctx_id;
  bool marked;
  uint64_t seq; /* this destroy's (odd) number in gr_track_seq */
} gr_detached_t;
/* begin + mark. begin alone: a call that may destroy the context (the last primary release); mark once known. */
void gr_track_ctx_detach(uint16_t ctx_id, gr_detached_t *d);
void gr_track_ctx_begin(uint16_t ctx_id, gr_detached_t *d);
void gr_track_ctx_mark(gr_detached_t *d);
void gr_track_ctx_commit(gr_detached_t *d, bool destroyed);
/* The one sequence of the hooks that end a context (cuCtxDestroy, cuCtxDetach, cuDevicePrimaryCtxReset,
 * cuDevicePrimaryCtxRelease), around their driver call: _before takes the context lock (held until _after),
 * finds the context in the registry (ctx; NULL: device's primary context) and begins its destroy: marked at once
 * when certain (a call that destroys the context whenever it succeeds: destroy, reset), else once known
 * (detach, and a primary release, which destroys only when it is the last). _after commits it (gone: the
 * context went), forgets the context in the registry (a primary one: its device's) and drops the lock. */
typedef struct gr_ctx_end {
  gr_detached_t d;
  uint16_t id;  /* the registry's, 0: unknown to gpureclaim */
  bool primary; /* device's primary context (ctx NULL) */
  int device;
} gr_ctx_end_t;
void gr_track_ctx_end_before(gr_ctx_end_t *e, CUcontext ctx, int device, bool certain);
void gr_track_ctx_end_after(gr_ctx_end_t *e, bool gone);
/* A destroy that committed while an insert that began before it was still under way keeps its watch
 * (gr_track_watch) until no such insert is left; every allocation that meets a raised watch calls this, and the
 * last one lowers it. */
void gr_track_linger_check(void);
void gr_track_atfork_child(void);
/* Context destroys so far, times two; odd while one runs. An allocation reads it before its driver call
 * (gr_track_ctx_seq) and hands it to gr_track_insert_ctx, which inserts the record unless a destroy of its
 * context since then freed the block. */
extern _Atomic uint64_t gr_track_seq;
static inline uint64_t gr_track_ctx_seq(void) { return atomic_load_explicit(&gr_track_seq, memory_order_relaxed); }
void gr_track_insert_ctx(gr_rec_t *r, uint64_t seq0);
/* gr_track_restore() of an address block whose free read gr_track_ctx_seq() as seq0 before its take. */
void gr_track_restore_ctx(const gr_rec_t *r, uint64_t seq0);

#endif /* GR_TRACK_H */
