/* limit.h -- GPURECLAIM_LIMIT: the device memory this process may hold per device (limit.c). Internal. */
#ifndef GR_LIMIT_H
#define GR_LIMIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* 1 once a limit is set (gr_limit_start), for the whole life of the process: every test of it is one relaxed load,
 * and a process without a limit pays nothing else. */
extern _Atomic int gr_limit_flag;
static inline bool gr_limit_on(void) { return atomic_load_explicit(&gr_limit_flag, memory_order_relaxed) != 0; }

/* Reads GPURECLAIM_LIMIT (core.c, as gpureclaim starts, before any block is tracked). */
void gr_limit_start(void);

/* An allocation of bytes on device (its ordinal; -1: unknown, not limited) is about to reach the driver: 1 when
 * it fits under the limit, which then holds the bytes for it (reserved atomically: concurrent allocations never
 * overshoot together) until gr_limit_end; 0 when it does not fit (nothing held). */
int gr_limit_admit(int device, uint64_t bytes);
/* On the thread that was admitted, when its allocation will not be counted: the driver failed it (the hooks), or
 * its block could not be tracked (track.c). A tracked block's count takes the reservation over (gr_limit_counted);
 * without a reservation this does nothing. */
void gr_limit_end(void);

/* stats.c: a block of device memory of bytes on device (its packed device field) is counted as live, or no
 * longer (a free, a release, its context destroyed). */
void gr_limit_counted(unsigned device, uint64_t bytes);
void gr_limit_uncounted(unsigned device, uint64_t bytes);

/* The limit on device in bytes (GPURECLAIM_LIMIT, a fraction made bytes with the device's total), 0 for none. */
uint64_t gr_limit_bytes(int device);
/* What counts against it now: live device memory of this process on device, and admissions under way. */
uint64_t gr_limit_held(int device);
/* cuMemGetInfo's figures as a limited process sees them on device: total = min(limit, total), free =
 * min(free, limit - held). Unchanged where device has no limit. */
void gr_limit_mem_info(int device, uint64_t *free_b, uint64_t *total);

void gr_limit_atfork_child(void);

/* GPURECLAIM_GUARANTEE on device (its ordinal), in bytes (a fraction of the device resolved with its total);
 * 0 for none. The guarantee orders waiters and givers (wait.c, peer.c); it lives here beside the limit because
 * both are what the process may hold on a device, read from the same kind of option. */
uint64_t gr_limit_guarantee_bytes(int device);

#endif /* GR_LIMIT_H */
