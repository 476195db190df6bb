/* stats.h -- the counters behind gpureclaim_stats() (stats.c). Internal. */
#ifndef GR_STATS_H
#define GR_STATS_H

#include "gpureclaim.h"
#include "table.h"

void gr_stats_alloc(const gr_rec_t *r);
void gr_stats_free(const gr_rec_t *r);
/* The same for a record as a slot holds it (the hot path: no unpacking for a device block). */
void gr_stats_alloc_pk(const gr_packed_t *p);
/* gr_stats_alloc_pk with p's kind, device (as packed) and size given, from values the caller holds. */
void gr_stats_alloc_v(const gr_packed_t *p, unsigned kind, unsigned device, uint64_t size);
void gr_stats_free_pk(const gr_packed_t *p);
/* The same two with the calling thread's record given (gr_epoch_t_rec, read once by the caller; NULL: none yet). */
void gr_stats_alloc_t(gr_thread_rec_t *t, const gr_packed_t *p, unsigned kind, unsigned device, uint64_t size);
void gr_stats_free_t(gr_thread_rec_t *t, const gr_packed_t *p);
/* A block that left the table without a free: context destroyed (the driver freed it). */
void gr_stats_ctx_destroyed(const gr_rec_t *r);
void gr_stats_orphaned(const gr_rec_t *r, int delta);
void gr_stats_untracked_free(void);
void gr_stats_late_free(void);
void gr_stats_release(uint64_t bytes);
void gr_stats_oom_retry(bool succeeded);
/* Fills out (size set by the caller) for device (-1 all). */
int gr_stats_get(int device, gpureclaim_stats_t *out);
void gr_stats_atfork_child(void);
/* Whether a kind counts as device memory in live_bytes. */
static inline bool gr_kind_is_device_memory(unsigned kind) {
  return kind == GPURECLAIM_KIND_DEVICE || kind == GPURECLAIM_KIND_PITCH || kind == GPURECLAIM_KIND_MANAGED ||
         kind == GPURECLAIM_KIND_ASYNC || kind == GPURECLAIM_KIND_VMM;
}

void gr_stats_peer_ask(bool ok, uint64_t received);
void gr_stats_peer_give(uint64_t given);

/* Entries handed out unwrapped because their ABI could not be proven (docs/LIBRARY.md, "Limits"): counted by the hooks
 * (procaddr.c, dlsym.c), read with the other counters. */
extern _Atomic uint64_t gr_untracked_routes;

#endif /* GR_STATS_H */
