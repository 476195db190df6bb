/*
 * gpureclaim_internal.h -- declarations shared between gpureclaim's modules. Not installed.
 *
 * What the command shares with the library is in common.h and options.h (no CUDA), included here.
 * Module prefixes: gr_opt_ (options.c), gr_log_ (log.c), gr_real_ (real.c), gr_hook_ (hooks/), gr_reg_
 * (registry.c), gr_stats_ (stats.c), gr_table_/gr_epoch_ (table.h), gr_scope_ (scope.c), gr_release_ (release.c),
 * gr_sig_ (signal.c), gr_py_ (releasers/python.c), gr_report_ (report/), gr_control_ (control.c), gr_core_
 * (core.h: start-up, fork, exit; state.h: what every module reads of the process), gr_tick_ (tick.h).
 */
#ifndef GPURECLAIM_INTERNAL_H
#define GPURECLAIM_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "common.h"
#include "gpureclaim.h"
#include "names.h"
#include "options.h"
#include "state.h"
#include "table.h"

#include <cuda.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* What the library exports, one macro per kind (src/gpureclaim.map lists both, check_exports.cmake checks them):
 * the public functions of gpureclaim.h carry GPURECLAIM_API (that header's, on their declarations and
 * definitions), and the symbols that stand in for the driver's, the CUDA runtime's and libc's carry GR_INTERPOSE
 * (hooks/). Everything else is hidden (the version script's "local: *"). */
#define GR_INTERPOSE __attribute__((visibility("default")))
#define GR_HIDDEN __attribute__((visibility("hidden")))
/* Code that sanitizer runtimes reach before they are initialised: their start-up looks up real functions with
 * dlsym, which is gpureclaim's override. It must not be instrumented. */
#define GR_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

/* ------------------------------------------------------------------------------------------------------------
 * real.c: the real entry points, resolved once
 * ---------------------------------------------------------------------------------------------------------- */

typedef struct gr_real_libc {
  void *(*dlsym)(void *, const char *);
  void *(*dlopen)(const char *, int);
} gr_real_libc_t;

/* libc's dlsym and dlopen (never the public names, which gpureclaim overrides). */
const gr_real_libc_t *gr_real_libc(void);
/* name as the caller's own scope (its object and that object's dependencies) resolves it, the caller given by a
 * code address in it; NULL if that scope has no such symbol. */
void *gr_real_caller_sym(const void *caller, const char *name);
/* The process's libcuda.so.1 (the one already loaded, else loaded now); NULL if there is none. */
void *gr_real_libcuda(void);
/* A driver function by its exported name, from that libcuda; NULL if missing. Cached per name by callers. */
void *gr_real_driver(const char *name);

/* Driver functions gpureclaim itself calls (not through the program's routes), resolved at start-up. */
typedef struct gr_drv {
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxGetDevice)(CUdevice *);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext *);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
  CUresult (*cuDeviceGetCount)(int *);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned *, int *);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuMemGetInfo)(size_t *, size_t *);
  CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemFreeHost)(void *);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuGetErrorName)(CUresult, const char **);
} gr_drv_t;

/* The table above (every member may be NULL if the driver lacks it). Resolved by gr_core_start_slow(). */
extern gr_drv_t gr_drv;
int gr_real_resolve_drv(void);

/* ------------------------------------------------------------------------------------------------------------
 * hooks/: interposition
 * ---------------------------------------------------------------------------------------------------------- */

/* Calls that make blocks (record api field): GR_API_* and gr_api_name() in names.h. */
/* Public view of a record (library resolved now). */
void gr_block_from_rec(const gr_rec_t *r, gpureclaim_block_t *b);

/* Entries handed out unwrapped because their ABI could not be proven (README, "Limits"). */
extern _Atomic uint64_t gr_untracked_routes;

/* driver.c: one entry per hooked variant (hooks/hooklist.h). */
typedef struct gr_hook_info {
  const char *symbol; /* exported name of the variant */
  const char *base;   /* name asked of cuGetProcAddress */
  int version;        /* first version returning this variant */
  int ptsz;           /* per-thread default stream variant */
  void *export_fn;    /* gpureclaim's exported definition */
  void *pa_fn;        /* the wrapper cuGetProcAddress hands out */
} gr_hook_info_t;
extern const gr_hook_info_t gr_hooks[];
extern _Atomic(void *) gr_pa_real[];
int gr_hook_count(void);
/* Index of an exported hook function, -1 if fn is not one. */
int gr_hook_export_id(const void *fn);
/* The libcuda function the exported hook id calls (resolved on first use), NULL if the driver lacks it. */
void *gr_hook_export_real(int id);

/* dlsym.c, deepbind.c: the overrides of dlsym and dlopen. */
void *gr_dlsym_hook(void *handle, const char *symbol);
void *gr_dlopen_hook(const char *file, int mode);

/* procaddr.c: our exported getter for a dlsym of "cuGetProcAddress[_v2]" that found libcuda's, else NULL. */
void *gr_hook_getproc_for(const char *symbol, void *real);
bool gr_hook_is_getproc_export(const void *fn);
/* driver.c: the exported-route wrapper for an exported name, NULL if not hooked. */
void *gr_hook_export_for(const char *exported_name);

/* ------------------------------------------------------------------------------------------------------------
 * registry.c: contexts, devices, pools, libraries
 * ---------------------------------------------------------------------------------------------------------- */

#define GR_MAX_CTX 4096
#define GR_MAX_POOLS 4096
#define GR_MAX_DEV 64
/* What a block record's packed fields must hold (table.h, gr_packed_t). */
_Static_assert(GR_MAX_CTX <= 1 << 12 && GR_MAX_POOLS <= 1 << 12, "context and pool ids fit 12 bits");
_Static_assert(GR_MAX_DEV < GR_DEVICE_NONE, "device ordinals fit 7 bits, GR_DEVICE_NONE apart");
_Static_assert(GPURECLAIM_KIND_HOST < 16, "kinds fit 4 bits");
_Static_assert(GR_API_COUNT <= 32, "APIs fit 5 bits");

/* Context -> id (1..4095), adding it; 0 when the registry is full. device: its ordinal, or -1 to look up. */
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
void gr_reg_ctx_destroyed(uint16_t id);
/* The calling thread's current context id and device (cached per thread). Returns false without one. */
bool gr_reg_current(uint16_t *ctx_id, uint8_t *device, CUcontext *ctx);
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

/* owner.c: who owns the blocks the library at path allocates (never orphans): a framework ("pytorch", "cupy",
 * "xla", "tensorflow") or a CUDA library keeping workspaces ("cublas", "cudnn", "nccl", ...); NULL for the
 * program's own code. */
const char *gr_owner_of(const char *path);

void gr_reg_atfork_child(void);

/* ------------------------------------------------------------------------------------------------------------
 * stats.c: counters
 * ---------------------------------------------------------------------------------------------------------- */

void gr_stats_alloc(const gr_rec_t *r);
void gr_stats_free(const gr_rec_t *r);
/* The same for a record as a slot holds it (the hot path: no unpacking for a device block). */
void gr_stats_alloc_pk(const gr_packed_t *p);
/* gr_stats_alloc_pk with p's kind, device (as packed) and size given, from values the caller holds. */
void gr_stats_alloc_v(const gr_packed_t *p, unsigned kind, unsigned device, uint64_t size);
void gr_stats_free_pk(const gr_packed_t *p);
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

/* ------------------------------------------------------------------------------------------------------------
 * track.c: what a hook does with a block
 * ---------------------------------------------------------------------------------------------------------- */

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
/* A block the driver just allocated in context ctx_id (0: none) of device (GR_DEVICE_NONE: none), from pool
 * pool_id (0: none): its record is built as the slot holds it (time, thread, site, scope as gr_track_fill
 * gives them) and inserted as gr_track_insert_ctx does. seq0: gr_track_ctx_seq() before the driver call. */
void gr_track_alloc(unsigned kind, uint64_t key, uint64_t size, unsigned driver_api, uintptr_t ra, unsigned ctx_id,
                    unsigned device, unsigned pool_id, uint64_t seq0);
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
/* The context gate: a release holds it while it claims and frees blocks, and the hooks that destroy, reset,
 * release or retain a context hold it around the driver call and the table's update. So a context never goes
 * (and its addresses are never handed out again) while a release holds claimed blocks of it, and a final
 * primary release and the driver's state read after it are not split by a retain. Reentrant per thread. */
void gr_track_gate_enter(void);
void gr_track_gate_exit(void);
bool gr_track_gate_held(void);
/* VMM. cuMemRelease: begin before the driver call (1: tracked, call end after it; 0: untracked, pass it on;
 * -1: a late free of a handle a release freed, return CUDA_SUCCESS without the driver). cuMemMap: after a
 * successful call. cuMemUnmap: take the mappings in the range before the call (at most cap), settle after.
 * gr_track_unmapped: one mapping of handle is gone (the last one of a released handle frees its memory). */
int gr_track_vmm_release_begin(uint64_t handle, gr_rec_t *before);
void gr_track_vmm_release_end(const gr_rec_t *before, bool ok);
void gr_track_vmm_map(uint64_t ptr, uint64_t size, uint64_t handle, uintptr_t ra);
unsigned gr_track_vmm_unmap_begin(uint64_t ptr, uint64_t size, gr_rec_t *maps, unsigned cap);
void gr_track_vmm_unmap_end(const gr_rec_t *maps, unsigned n, bool ok);
void gr_track_unmapped(uint64_t handle);
/* Destroying a context frees its blocks: under the context gate, they are marked detaching before the driver
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

/* ------------------------------------------------------------------------------------------------------------
 * stacks.c: short backtraces per allocation (GPURECLAIM_BACKTRACE=1)
 * ---------------------------------------------------------------------------------------------------------- */

#define GR_STACK_MAX 16
/* A record's site (gr_site_t, table.h) is a code address, or with backtraces on an interned stack: never read
 * its bits as either, ask these. */
static inline gr_site_t gr_site_at(uintptr_t pc) { return (gr_site_t){(uint64_t)pc}; }
static inline bool gr_site_same(gr_site_t a, gr_site_t b) { return a.bits == b.bits; }
/* With backtraces on, the interned stack of the calling allocation, whose first frame is pc; otherwise, or
 * when memory ran out, gr_site_at(pc). */
gr_site_t gr_stack_capture(uintptr_t pc);
/* The code address of the allocating call (0 for none). */
uintptr_t gr_site_pc(gr_site_t site);
/* The frames of a site, pc first (1 frame when it holds no stack). */
int gr_site_frames(gr_site_t site, uintptr_t *frames, int max);

/* ------------------------------------------------------------------------------------------------------------
 * scope.c
 * ---------------------------------------------------------------------------------------------------------- */

/* Scope slot (1..65535) of the calling thread's innermost open scope, 0 for none; takes a reference. */
uint16_t gr_scope_tag(void);
/* Lists record r, just inserted into the table with a scope, for that scope's end. */
void gr_scope_note(const gr_rec_t *r);
/* Drops the reference a record of scope slot s held. */
void gr_scope_unref(uint16_t slot);
uint64_t gr_scope_id(uint16_t slot);
void gr_scope_atfork_child(void);
/* A key a scope listed for its end: where one of its records may be. */
typedef struct gr_scope_key {
  uint64_t key;
  uint32_t ks; /* GR_KS_ADDR or GR_KS_HANDLE */
} gr_scope_key_t;
/* gpureclaim_scope_end (release.c) in two steps. end: the scope's live blocks become orphans (0, or -ENOENT when the
 * scope is not open); ended says which (slot, the keys it listed, or scan: every record of the slot in the
 * table) and how many. finish: gives back the keys and the scope's own reference, after a FREE_NOW release. */
typedef struct gr_scope_ended {
  uint16_t slot;
  gr_scope_key_t *keys;
  uint32_t n;
  bool scan;
  uint64_t orphans;
} gr_scope_ended_t;
int gr_scope_end(uint64_t scope, gr_scope_ended_t *ended);
void gr_scope_end_finish(gr_scope_ended_t *ended);

/* ------------------------------------------------------------------------------------------------------------
 * release.c / signal.c / control.c / releasers (report/: report/report.h)
 * ---------------------------------------------------------------------------------------------------------- */

/* Runs (or joins) a release; trigger is a gpureclaim_trigger_t. Returns 0 or -errno. */
int gr_release_run(unsigned what, int trigger, gpureclaim_report_t *out);
/* What an out-of-memory failure may release on the allocating thread. Returns bytes given back. */
uint64_t gr_release_for_oom(void);
/* Frees the orphans of scope slot `slot` at once (GPURECLAIM_FREE_NOW): those under the n keys given, or with
 * keys NULL every orphan of the slot in the table. */
void gr_release_free_scope_now(uint16_t slot, const gr_scope_key_t *keys, size_t n, gpureclaim_report_t *rep);
void gr_release_atfork_child(void);
/* A give to a peer gave something now (gr_release_give, or a sleep a peer's request caused): the status file's
 * last_gave_ms, the time of the last such give (CLOCK_REALTIME ms, 0 never): peers ask a recent giver last. */
void gr_release_note_give(void);
uint64_t gr_release_last_give_ms(void);

/* worker.c: the thread that serves the signal and the control socket. */
int gr_worker_start(void);
void gr_worker_stop(void);
void gr_worker_atfork_child(void);

int gr_sig_install(void);
/* The descriptor the handler writes to; the worker polls it. -1 when the signal is off. */
int gr_sig_fd(void);
/* Whether the program replaced gpureclaim's handler since the last check (said once, with a warning). */
bool gr_sig_check_replaced(void);
/* Whether gpureclaim's handler is the signal's action now (false: off, ignored, or the program's own since). */
bool gr_sig_caught(void);
void gr_sig_atfork_child(void);

/* Framework caches through CPython; bytes given back. Never called from inside an allocation. */
uint64_t gr_py_release(void);
/* If the calling thread holds Python's GIL, gives it up and returns its thread state (else NULL). */
void *gr_py_save_if_held(void);
void gr_py_restore(void *state);
/* What framework caches hold (reserved, in use, releasable), read through CPython without changing them;
 * fills up to max entries and returns how many. 0 without Python or with GPURECLAIM_PYTHON=0. Takes the GIL:
 * never called from inside an allocation. */
typedef struct gr_py_cache {
  char name[40]; /* "pytorch", "cupy", or the module defining __gpureclaim_memory__ */
  int device;
  uint64_t reserved, allocated, releasable;
} gr_py_cache_t;
int gr_py_caches(gr_py_cache_t *out, int max);
void gr_stats_peer_ask(bool ok, uint64_t received);
void gr_stats_peer_give(uint64_t given);

/* peer.c: peer reclaim (GPURECLAIM_PEERS), both sides. */
struct jbuf;
/* The status file's "peer" object. */
void gr_peer_status_json(struct jbuf *b);
/* The worker's periodic check: rewrites the status file when what this process holds changed. */
void gr_peer_tick(void);
/* give.c: serves a "give" request line (after "give ") from the process whose credentials are pid/uid; fills the
 * answer into b (an open object). */
void gr_peer_serve_give(const char *args, int pid, struct jbuf *b);
/* Whether a thread of this process is handling an out-of-memory with its peers now. */
bool gr_peer_busy(void);
/* Whether GPURECLAIM_PEERS names this role (GR_PEERS_ASK, _GIVE, _SLEEP) and status files are on. */
bool gr_peer_on(unsigned bit);
/* The asking side, called by the hooks after their own retry failed (driver.c, PEER_RETRY). */
#define GR_PEER_MAX 16 /* peers asked in one peer reclaim, at most */
typedef struct gr_peer_result {
  int pid;
  const char *error; /* NULL: it answered */
  uint64_t orphaned, pool, framework, releaser, all;
  uint64_t slept; /* what its sleep freed on the GPU (GPURECLAIM_PEERS sleep); 0 when not asked to sleep */
  double ms;
} gr_peer_result_t;
typedef struct gr_peer_op {
  int device;
  uint64_t bytes;
  char uuid[48];
  int lock_fd;
  bool waited;   /* another peer reclaim of this GPU ran meanwhile: retry first */
  bool asked;
  uint64_t given;
  uint64_t t0_ns;
  struct timespec deadline;
  unsigned nresults;
  gr_peer_result_t results[GR_PEER_MAX]; /* what each peer gave, for the event line */
} gr_peer_op_t;
bool gr_peer_begin(gr_peer_op_t *op, uint64_t bytes, int device);
uint64_t gr_peer_ask(gr_peer_op_t *op);
void gr_peer_end(gr_peer_op_t *op, bool succeeded);
void gr_peer_atfork_child(void);
/* release.c: a peer's request: gives up to want bytes on the devices in devmask (bit per ordinal), cheapest
 * first, within GPURECLAIM_ON_SIGNAL; framework caches only when framework_ok. Fills rep (trigger peer). */
void gr_release_give(uint64_t want, uint64_t devmask, int asker, bool framework_ok, const struct timespec *deadline,
                 gpureclaim_report_t *rep);


/* sleep.c: sleep and wake (gpureclaim_sleep). timeout_ms: how long the lock waits for calls in flight. */
int gr_sleep_run(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out);
/* The same, telling progress (may be NULL) as it goes: phase "release", "moving" (done 0 of total), "moved". */
typedef void (*gr_sleep_progress_fn)(const char *phase, uint64_t done, uint64_t total, void *arg);
int gr_sleep_run_progress(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out,
                          gr_sleep_progress_fn progress, void *arg);
/* Wakes the process (trigger: gpureclaim_trigger_t). 0, -ENOMEM (no room in time), -EIO (restore refused). */
int gr_sleep_wake(int trigger);
int gr_sleep_state_now(uint64_t *host_bytes);
/* The slow path of the gates (gate.h, gr_gate_set_slow): a call while the process sleeps wakes it. */
CUresult gr_sleep_gate_slow(void);
/* "sleep": {state, host_bytes, ...} for the status file and the stats answer. */
void gr_sleep_json(struct jbuf *b);
void gr_sleep_report_json(struct jbuf *b, const gpureclaim_sleep_report_t *r);
/* The worker's tick: the idle watch (GPURECLAIM_SLEEP_IDLE). Returns the poll timeout it wants, in ms. */
/* Whether no thread made a CUDA call gpureclaim sees for a second or more (the idle probe armed and untouched):
 * a peer short of memory after every cache may then ask this process to sleep (GPURECLAIM_PEERS sleep). */
bool gr_sleep_idle_for_peer(void);
int gr_sleep_idle_tick(void);
void gr_sleep_atfork_child(void);
/* IPC (hooks/driver.c): exported = 1 once memory was exported (cuIpcGetMemHandle); opened +1/-1 per handle of
 * another process's memory opened and closed. A sleep is refused while either says memory is shared. */
void gr_sleep_note_ipc(int exported, int opened);
/* A stream capture began (begin) or ended on stream s (ptsz: through a per-thread-default-stream variant). */
void gr_sleep_note_capture(CUstream s, bool ptsz, bool begin);

int gr_control_open(void);
/* In a forked child: close the parent's socket without removing it. */
void gr_control_forget(void);
int gr_control_fd(void);
void gr_control_serve_one(void);
void gr_control_close(void);

#endif /* GPURECLAIM_INTERNAL_H */
