/*
 * gpureclaim.h -- the one installed header of gpureclaim.
 *
 * gpureclaim is a CUDA allocation interposer. Preloaded in front of any program (LD_PRELOAD) or linked into it
 * (-lgpureclaim, placed before -lcuda), it sees every device allocation the program makes, keeps an exact table
 * of the live blocks per context and device, and gives cached and orphaned device memory back on request:
 * through gpureclaim_release(), a signal (SIGUSR1 by default) or the `gpureclaim` command.
 *
 * Conventions
 *  - Every function is safe to call from any thread, concurrently.
 *  - Functions returning int return 0 (or a documented non-negative value) on success and a negative errno
 *    value on failure: -EINVAL for a bad argument, -ENOTSUP when gpureclaim is disabled (GPURECLAIM_DISABLE=1),
 *    -ENOMEM when memory ran out, -EIO for a file that could not be written.
 *  - Structs that may grow start with `size_t size`: set it to sizeof the struct you pass. The library fills
 *    min(size, its own sizeof) bytes, so a program built against an older header keeps working, and sets
 *    `size` to that number (a program built against a newer header learns which fields were filled).
 *  - gpureclaim never changes what a CUDA call returns, except for the out-of-memory retry (GPURECLAIM_OOM_RETRY,
 *    then GPURECLAIM_PEERS, then a wait for memory, GPURECLAIM_WAIT: an allocation that fails with
 *    out-of-memory may first wait up to that many seconds, 30 by default, while another gpureclaim process
 *    shares the GPU), a free of a pointer that a release already freed (see gpureclaim_scope_end), and
 *    GPURECLAIM_LIMIT (unset by default: no limit; a size, or a fraction of the device: the device memory the
 *    process may hold on each device). With a limit set, an allocation that would pass it fails with CUDA_ERROR_OUT_OF_MEMORY (after the
 *    process's own cache was released, as for an out-of-memory) without reaching the driver, and cuMemGetInfo
 *    (so cudaMemGetInfo) reports total = min(limit, the device's total) and free = min(the driver's free, limit
 *    minus what the process holds), so that frameworks sizing themselves from it fit inside. Without a limit,
 *    cuMemGetInfo is the driver's.
 *
 * Configuration is read once, from the environment; docs/LIBRARY.md lists every GPURECLAIM_* variable.
 */
#ifndef GPURECLAIM_H
#define GPURECLAIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GPURECLAIM_BUILDING)
#define GPURECLAIM_API __attribute__((visibility("default")))
#else
#define GPURECLAIM_API
#endif

/* ------------------------------------------------------------------------------------------------------------
 * Version
 * ---------------------------------------------------------------------------------------------------------- */

#define GPURECLAIM_VERSION_MAJOR 0
#define GPURECLAIM_VERSION_MINOR 1
#define GPURECLAIM_VERSION_PATCH 0
#define GPURECLAIM_VERSION_STRING "0.1.0"

/* The library's version, "MAJOR.MINOR.PATCH". Always works, also when disabled. */
GPURECLAIM_API const char *gpureclaim_version(void);

/* 1 when gpureclaim is interposing in this process, 0 when it is disabled (GPURECLAIM_DISABLE=1). */
GPURECLAIM_API int gpureclaim_enabled(void);

/* ------------------------------------------------------------------------------------------------------------
 * Statistics
 * ---------------------------------------------------------------------------------------------------------- */

typedef struct gpureclaim_stats {
  size_t size;                   /* caller: sizeof(gpureclaim_stats_t) */
  uint64_t live_blocks;          /* device blocks live now: cuMemAlloc, pitch, managed, stream-ordered, VMM */
  uint64_t live_bytes;           /* their bytes (VMM: physical bytes, until the handle is released and unmapped) */
  uint64_t peak_bytes;           /* highest live_bytes seen: exact while one thread allocates and frees; else never
                                    below the true peak and at most 4 MiB per other thread (and device) above
                                    it: frees another thread has not yet added to the shared count */
  uint64_t total_allocs;         /* successful allocations seen, every kind */
  uint64_t total_frees;          /* frees of tracked blocks, every kind, including releases */
  uint64_t pool_reserved_bytes;  /* stream-ordered pools: memory the pools hold (asked of the driver now) */
  uint64_t pool_used_bytes;      /* ... of which handed out to the program */
  uint64_t host_pinned_blocks;   /* pinned host memory (cuMemHostAlloc, cuMemAllocHost), not in live_bytes */
  uint64_t host_pinned_bytes;
  uint64_t va_reserved_bytes;    /* virtual address space reserved (cuMemAddressReserve): not memory */
  uint64_t vmm_mapped_bytes;     /* bytes mapped with cuMemMap */
  uint64_t orphan_blocks;        /* live blocks of ended scopes, waiting for a release */
  uint64_t orphan_bytes;
  uint64_t ctx_destroyed_blocks; /* blocks dropped because their context was destroyed (the driver freed them) */
  uint64_t ctx_destroyed_bytes;
  uint64_t untracked_frees;      /* frees of pointers gpureclaim never saw, passed to the driver unchanged */
  uint64_t late_frees;           /* frees of pointers a release had already freed, swallowed */
  uint64_t untracked_routes;     /* entry points handed out unwrapped (docs/LIBRARY.md, "Limits") */
  uint64_t releases;             /* releases run */
  uint64_t released_bytes;       /* bytes they gave back, all categories */
  uint64_t oom_retries;          /* allocations retried after an out-of-memory error */
  uint64_t oom_retry_successes;  /* ... that then succeeded */
  uint64_t table_bytes;          /* memory gpureclaim's block table uses now (threads' logs of new blocks included) */
  uint64_t contexts;             /* contexts seen and not destroyed */
  uint64_t pools;                /* stream-ordered pools seen and not destroyed */
  /* Peer reclaim (GPURECLAIM_PEERS): an allocation that still failed after its own retry asks the other
   * gpureclaim processes of this user on the same GPU to give memory back. */
  uint64_t peer_reclaims;        /* peer reclaims this process ran (it asked its peers) */
  uint64_t peer_reclaim_successes; /* ... after which the allocation succeeded */
  uint64_t peer_received_bytes;  /* what its peers said they gave it */
  uint64_t peer_gives;           /* peer reclaims it served (it was asked and gave) */
  uint64_t peer_given_bytes;     /* what it gave them */
} gpureclaim_stats_t;

/* Totals for one device ordinal (0 to 63; one gpureclaim has not seen reads all zeros), or for all devices when
 * device is -1. Pinned host memory belongs to no device and is counted under -1 only, as are the process-wide
 * counts (untracked_frees, late_frees, untracked_routes, releases, released_bytes, oom_retries,
 * oom_retry_successes, table_bytes, peer_*): 0 for one device. contexts and pools count that device's own. Returns
 * -EINVAL for a NULL out, a too small out->size, a device < -1 or a device > 63. */
GPURECLAIM_API int gpureclaim_stats(int device, gpureclaim_stats_t *out);

/* ------------------------------------------------------------------------------------------------------------
 * Blocks
 * ---------------------------------------------------------------------------------------------------------- */

typedef enum gpureclaim_kind {
  GPURECLAIM_KIND_DEVICE = 1,      /* cuMemAlloc / cudaMalloc */
  GPURECLAIM_KIND_PITCH = 2,       /* cuMemAllocPitch / cudaMallocPitch */
  GPURECLAIM_KIND_MANAGED = 3,     /* cuMemAllocManaged / cudaMallocManaged */
  GPURECLAIM_KIND_ASYNC = 4,       /* stream-ordered, from a pool: cuMemAllocAsync, cuMemAllocFromPoolAsync */
  GPURECLAIM_KIND_VMM = 5,         /* physical memory of a cuMemCreate handle; address is the handle */
  GPURECLAIM_KIND_VMM_MAPPING = 6, /* a cuMemMap mapping; not counted as memory (its handle is) */
  GPURECLAIM_KIND_VA = 7,          /* a cuMemAddressReserve reservation; address space, not memory */
  GPURECLAIM_KIND_HOST = 8         /* pinned host memory: cuMemHostAlloc, cuMemAllocHost */
} gpureclaim_kind_t;

typedef enum gpureclaim_block_state {
  GPURECLAIM_BLOCK_LIVE = 1,       /* owned by the program or a framework */
  GPURECLAIM_BLOCK_ORPHAN = 2,     /* its scope ended: the next release frees it */
  GPURECLAIM_BLOCK_RELEASED = 3    /* a VMM handle released by the program but still mapped */
} gpureclaim_block_state_t;

typedef struct gpureclaim_block {
  size_t size;              /* sizeof(gpureclaim_block_t) as the library knows it */
  uint64_t address;         /* device pointer, host pointer, virtual address, or VMM handle (KIND_VMM) */
  uint64_t bytes;
  int kind;                 /* gpureclaim_kind_t */
  int state;                /* gpureclaim_block_state_t */
  int device;               /* device ordinal, -1 when none (pinned host memory) or unknown */
  uint32_t thread_id;       /* Linux thread id of the allocating thread */
  void *context;            /* CUcontext the block belongs to: the current one of its allocating call; for a
                               stream-ordered block, its stream's; NULL for VMM memory, or when none was current */
  void *pool;               /* CUmemoryPool of a stream-ordered block, else NULL */
  uint64_t scope;           /* scope the block was allocated in, 0 for none */
  uint64_t alloc_time_ms;   /* CLOCK_MONOTONIC milliseconds at allocation */
  const void *caller;       /* return address of the allocation call (of the runtime call when there was one) */
  const char *library;      /* file name of the library that made the call; valid during the callback only */
  const char *api;          /* the call: "cudaMalloc", "cuMemAlloc_v2", ... */
  const char *owner;        /* who keeps it, so that no scope makes it an orphan: "pytorch", "cupy", "xla",
                               "tensorflow" (a framework's allocator), "cublas", "cudnn", "nccl", "cufft",
                               "cusparse", "cusolver", "curand", "cutensor", "nvshmem" (a CUDA library's
                               workspace); NULL for the program's own blocks. From the calling library's file
                               name, else its Python package (the directory under site-packages) */
  uint64_t handle;          /* KIND_VMM_MAPPING: the handle mapped there */
} gpureclaim_block_t;

/* Calls fn once for every block tracked now. Blocks allocated or freed while it runs may or may not be seen;
 * every other block is seen exactly once. fn returns 0 to go on, anything else to stop (that value is then
 * returned). fn may call CUDA and gpureclaim functions, but should not block for long: memory retired by the
 * table is not reclaimed until it returns. */
GPURECLAIM_API int gpureclaim_foreach_block(int (*fn)(const gpureclaim_block_t *block, void *arg), void *arg);

/* Writes every live block and the per-context and per-device totals as one JSON document to path ("-" for
 * stdout). A new path or a regular file is written to a temporary name in the same directory, flushed and
 * renamed into place (a replaced file keeps its permissions; a new one is 0644 less the umask); a symbolic
 * link is followed and its target treated so (the link stays); a device such as /dev/null or a FIFO is written
 * into (a FIFO that gets no reader within 2 seconds fails); /dev/stdout, /dev/stderr and /dev/fd/N write to
 * that descriptor. A link, device or FIFO owned by another user (root excepted) is refused. */
GPURECLAIM_API int gpureclaim_snapshot(const char *path);

/* Writes the leak report (blocks never freed, grouped by calling library and return address, with totals per
 * device) to path ("-" for stderr), as gpureclaim_snapshot() writes files. With GPURECLAIM_LEAK_REPORT=1 it is
 * also written at exit. json != 0 gives JSON instead of text. */
GPURECLAIM_API int gpureclaim_leak_report(const char *path, int json);

/* ------------------------------------------------------------------------------------------------------------
 * Release
 * ---------------------------------------------------------------------------------------------------------- */

#define GPURECLAIM_CACHED 0x1u   /* pools trimmed, framework caches emptied, registered releasers called */
#define GPURECLAIM_ORPHANED 0x2u /* blocks of ended scopes freed */
#define GPURECLAIM_ALL 0x4u      /* every tracked block freed: only for programs that own all their memory */

#define GPURECLAIM_MAX_DEVICES 16

typedef enum gpureclaim_trigger {
  GPURECLAIM_TRIGGER_API = 1,     /* gpureclaim_release() */
  GPURECLAIM_TRIGGER_SIGNAL = 2,  /* the release signal (possibly sent by `gpureclaim release`) */
  GPURECLAIM_TRIGGER_OOM = 3,     /* an allocation failed with out-of-memory and was retried */
  GPURECLAIM_TRIGGER_COMMAND = 4, /* the `gpureclaim` command, over the control socket */
  GPURECLAIM_TRIGGER_SCOPE = 5,   /* gpureclaim_scope_end(..., GPURECLAIM_FREE_NOW) */
  GPURECLAIM_TRIGGER_PEER = 6,   /* another gpureclaim process on the same GPU ran out of memory and asked */
  GPURECLAIM_TRIGGER_IDLE = 7,   /* GPURECLAIM_SLEEP_IDLE: no CUDA call for that long (sleep only) */
  GPURECLAIM_TRIGGER_CALL = 8    /* a CUDA call of the program while it slept (wake only) */
} gpureclaim_trigger_t;

typedef struct gpureclaim_device_report {
  int device;                /* ordinal; -1 marks an unused entry */
  uint64_t pool_bytes;       /* given back by trimming this device's pools */
  uint64_t orphaned_bytes;
  uint64_t orphaned_blocks;
  uint64_t all_bytes;        /* GPURECLAIM_ALL */
  uint64_t all_blocks;
  uint64_t free_before;      /* cuMemGetInfo, before and after the release */
  uint64_t free_after;
  uint64_t total;
} gpureclaim_device_report_t;

typedef struct gpureclaim_report {
  size_t size;               /* caller: sizeof(gpureclaim_report_t) */
  uint64_t seq;              /* number of the release in this process, from 1 */
  unsigned what;             /* categories released (after coalescing) */
  int trigger;               /* gpureclaim_trigger_t */
  uint64_t cached_bytes;     /* pool_bytes + framework_bytes + releaser_bytes */
  uint64_t pool_bytes;
  uint64_t framework_bytes;  /* PyTorch, CuPy: their reserved memory before minus after */
  uint64_t releaser_bytes;   /* what registered releasers said they released */
  uint64_t orphaned_bytes;
  uint64_t orphaned_blocks;
  uint64_t all_bytes;
  uint64_t all_blocks;
  uint64_t failed_blocks;    /* frees the driver refused; those blocks stay tracked */
  uint64_t duration_ns;
  int ndevices;              /* entries used in devices[] */
  gpureclaim_device_report_t devices[GPURECLAIM_MAX_DEVICES];
  int peer_pid;              /* GPURECLAIM_TRIGGER_PEER: the process that asked; else 0 */
} gpureclaim_report_t;

/* Releases the categories in what (GPURECLAIM_CACHED | GPURECLAIM_ORPHANED | GPURECLAIM_ALL) and fills out (may
 * be NULL). Concurrent calls coalesce: a call that arrives while a release runs waits for it and then for one
 * more release covering every request made meanwhile, and gets that one's report. Called from inside an
 * intercepted allocation, or from a releaser (C or Python) of a release the same thread is running, it returns
 * -EDEADLK instead of waiting for itself. A release that frees blocks holds off cuCtxDestroy,
 * cuDevicePrimaryCtxReset/Release/Retain on other threads until the blocks it claimed are freed (those calls
 * wait), so a context never takes claimed blocks with it.
 * A release and a CUDA graph capture never overlap: while a stream captures (cuStreamBeginCapture* until its
 * cuStreamEndCapture, any capture mode, any thread) a release is refused and returns -EBUSY with an empty report,
 * because the driver would fail its frees and synchronizations and invalidate the capture; call again once the
 * capture ended. A capture that begins while a release runs waits in cuStreamBeginCapture until the release ends.
 * Returns 0, -EBUSY (a graph is being captured), -EINVAL for what == 0 or unknown bits, -ENOTSUP when disabled
 * or before CUDA was initialised. */
GPURECLAIM_API int gpureclaim_release(unsigned what, gpureclaim_report_t *out);

/* GPURECLAIM_ALL for one context: frees every tracked block that belongs to ctx (a CUcontext), stream-ordered
 * blocks allocated on its streams included; the pools those came from are then trimmed, as a release of cached
 * memory trims them. VMM memory belongs to no context and is left alone. Returns -ENOENT for a context
 * gpureclaim has not seen, -EBUSY while a CUDA graph is being captured (as gpureclaim_release). */
GPURECLAIM_API int gpureclaim_release_context(void *ctx, gpureclaim_report_t *out);

/* A releaser frees memory a program caches itself (a C/C++ inference binary's pool) and returns the bytes it
 * gave back. Every release with GPURECLAIM_CACHED calls it, on gpureclaim's worker thread or on the caller of
 * gpureclaim_release(); an out-of-memory retry calls it on the allocating thread, so it must not take a lock
 * that thread may hold while allocating, nor wait for a thread that may be beginning a CUDA graph capture (its
 * cuStreamBeginCapture waits for the release to end). name is copied (at most 63 bytes kept). Returns a releaser id > 0,
 * -EINVAL for a NULL name or fn, -ENOSPC when 64 releasers are registered. */
GPURECLAIM_API int gpureclaim_register_releaser(const char *name, size_t (*fn)(void *arg), void *arg);
/* Returns 0, or -ENOENT for an unknown id. When it returns, fn is not running and will not be called again. */
GPURECLAIM_API int gpureclaim_unregister_releaser(int id);

/* ------------------------------------------------------------------------------------------------------------
 * Sleep and wake
 *
 * gpureclaim_sleep() gives back all of the process's device memory, live memory included, and the process
 * carries on unchanged when it is needed again. First a release of GPURECLAIM_CACHED | GPURECLAIM_ORPHANED,
 * so that only memory in use has to move; then the host's available memory is checked against what must move;
 * every context is synchronised; the driver's checkpoint API (driver 570 or later) locks the process (waiting
 * up to the timeout for threads inside CUDA calls) and moves the rest of its device memory, contexts included,
 * to host memory. The process then sleeps: the first CUDA call of any thread that gpureclaim sees (every entry
 * point handed out through cuGetProcAddress or dlsym, and gpureclaim's own exported ones) wakes it before the
 * call goes on, as does gpureclaim_wake(). A wake first waits, up to GPURECLAIM_WAKE_TIMEOUT seconds, for the
 * device to have room for what comes back (in the GPU's queue of waiters, asking its peers at its turn); without room the process stays asleep and intact, and the waiting
 * call returns CUDA_ERROR_OUT_OF_MEMORY (cudaErrorMemoryAllocation through the runtime); the next call tries
 * again. docs/LIBRARY.md, "Sleep and wake", says which calls gpureclaim cannot see.
 * ---------------------------------------------------------------------------------------------------------- */

typedef enum gpureclaim_sleep_state {
  GPURECLAIM_STATE_AWAKE = 0,
  GPURECLAIM_STATE_SLEEPING = 1, /* its device memory is on the host */
  GPURECLAIM_STATE_WAKING = 2    /* waiting for room on the device, or restoring */
} gpureclaim_sleep_state_t;

typedef struct gpureclaim_sleep_report {
  size_t size;                   /* caller: sizeof(gpureclaim_sleep_report_t) */
  int slept;                     /* 1: the process sleeps now; 0: it does not (reason says why) */
  int trigger;                   /* gpureclaim_trigger_t */
  uint64_t released_bytes;       /* given back by the release that came first (cached + orphaned) */
  uint64_t moved_bytes;          /* device memory moved to host memory (what the process holds on the host) */
  uint64_t left_bytes;           /* device memory of the process left on the device (reason says why) */
  uint64_t host_available_bytes; /* the host's available memory (MemAvailable) before moving */
  uint64_t device_freed_bytes;   /* what the devices gained, by the driver's own count (contexts included) */
  uint64_t duration_ns;
  char reason[192];              /* "" when it slept; else why not, in words */
} gpureclaim_sleep_report_t;

/* Puts the process to sleep (see above) and fills out (may be NULL). It waits up to 10 s for threads inside CUDA
 * calls (`gpureclaim sleep --timeout` chooses) before the driver's lock: a call that passed its gate before the
 * sleep began completes first, and later calls wait at their gate. Returns 0 when it sleeps; -EALREADY when it already
 * did; -EBUSY when a thread stayed inside a CUDA call past the timeout, device memory is shared over IPC
 * (exported with cuIpcGetMemHandle, or another process's opened and not closed), or a CUDA graph is being
 * captured (cuStreamBeginCapture* until cuStreamEndCapture); -ENOSPC when the host lacks the memory;
 * -ENOTSUP when the checkpoint API is missing (driver older than 570, GPURECLAIM_SLEEP=0, no NVML to check room
 * before a wake) or the driver refused (MIG, managed memory, ...): what the release
 * gave back stays given back. -ENOMEM when a thread could get no record of its CUDA calls (no memory: its calls
 * cannot be waited for). -EDEADLK when called from inside an intercepted call or a releaser. */
GPURECLAIM_API int gpureclaim_sleep(gpureclaim_sleep_report_t *out);

/* Wakes the process now. Returns 0 (also when it was awake), or -ENOMEM when the device had no room within
 * GPURECLAIM_WAKE_TIMEOUT (the process stays asleep and intact), -EIO when the driver refused the restore,
 * -EDEADLK when called from inside an intercepted call or a releaser (a sleep that runs the releaser would wait
 * for the wake, and the wake for the sleep). */
GPURECLAIM_API int gpureclaim_wake(void);

/* The sleep state (gpureclaim_sleep_state_t); *host_bytes (may be NULL) gets the bytes held on the host. */
GPURECLAIM_API int gpureclaim_sleep_state(uint64_t *host_bytes);

/* ------------------------------------------------------------------------------------------------------------
 * Scopes: declaring memory abandoned
 *
 * gpureclaim_scope_begin() opens a scope on the calling thread: every block that thread allocates from then on
 * (through any route) is tagged with it, until the scope ends. Scopes nest; a block takes the innermost one.
 * A scope outlives its thread: one still open when its thread exits stays open (its blocks stay live, and it
 * counts against the 65,535) until some thread ends it by its id.
 * gpureclaim_scope_end() ends a scope (from any thread): its blocks that are still live become orphans, freed
 * by the next release with GPURECLAIM_ORPHANED, or at once with GPURECLAIM_FREE_NOW. Ending looks only at the
 * blocks the scope allocated, not at every tracked block, and so does the release that GPURECLAIM_FREE_NOW runs
 * (but for a scope whose list of blocks could not grow for lack of memory: then both look at every block).
 * A block its thread allocates while another thread ends the scope is not part of it (it stays live). Blocks
 * that a framework's allocator made (attributed to PyTorch, CuPy or XLA) belong to the framework and never
 * become orphans. A cuMemCreate handle that is still mapped stays an orphan until the program unmaps it (a
 * release does not unmap the program's address space; GPURECLAIM_ALL does).
 *
 * A free of a pointer that a release already freed (cuMemFree, cuMemFreeAsync, cuMemFreeHost; cuMemRelease
 * of a cuMemCreate handle) does not reach the driver while the driver has not handed that address (handle)
 * out again: it returns CUDA_SUCCESS, is counted (late_frees) and warned about once. Once the
 * address has been handed out again, the free is indistinguishable from a free of the new block and frees it:
 * do not free memory you declared abandoned. At most 65,536 reclaimed addresses and 4,096 reclaimed cuMemCreate
 * handles are remembered at a time (each until handed out again or freed late); a block reclaimed while that
 * many are remembered is not, and a late free of it reaches the driver as a free of an unknown pointer.
 * ---------------------------------------------------------------------------------------------------------- */

#define GPURECLAIM_FREE_NOW 0x1u

/* Returns the new scope's id (never 0), or 0 when disabled, when 65,535 scopes hold live blocks at once, or when
 * the calling thread already has 32 scopes open (nested). */
GPURECLAIM_API uint64_t gpureclaim_scope_begin(void);
/* Returns 0, -EINVAL for scope 0 or unknown flags, -ENOENT for a scope that does not exist or already ended.
 * Of threads ending one scope at once, one gets 0 and the others -ENOENT; an id that ended never ends a later
 * scope, even one that reuses its slot. */
GPURECLAIM_API int gpureclaim_scope_end(uint64_t scope, unsigned flags);
/* The calling thread's innermost open scope, 0 for none. */
GPURECLAIM_API uint64_t gpureclaim_scope_current(void);

#ifdef __cplusplus
}
#endif
#endif /* GPURECLAIM_H */
