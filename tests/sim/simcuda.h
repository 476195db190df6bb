/*
 * simcuda.h -- test-only inspection and fault-injection interface of the CUDA simulator (tests/sim/).
 *
 * The simulator is a CPU-backed stand-in for libcuda.so.1 and libcudart.so.13 that gpureclaim cannot tell apart
 * from the real ones on the paths it hooks. It is test infrastructure: never installed, never loaded by a user.
 * These functions are exported by the simulated libcuda.so.1 only; tests reach them either by linking
 * against it or with dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "simcuda_...").
 * Every call here bypasses gpureclaim (nothing hooks simcuda_*), so it reports the driver's own truth.
 *
 * Environment (read at cuInit):
 *   SIMCUDA_DEVICES      number of devices of the machine, 0..8 (default 2)
 *   SIMCUDA_DEVICE_MEM   capacity of each device, bytes with optional K/M/G/T suffix (default 80G)
 *   SIMCUDA_MACHINE      the simulated machine: a directory (created 0700 if missing) that holds one accounting
 *                        file per GPU. Default: $XDG_RUNTIME_DIR/simcuda, else /dev/shm/simcuda-UID, else
 *                        /tmp/simcuda-UID. A directory of another owner, or with group/other permission bits, is
 *                        refused: cuInit fails with CUDA_ERROR_OPERATING_SYSTEM and says why on stderr.
 *                        tests/run_test.sh gives every CTest test a fresh one (RUNDIR.sim), and
 *                        sim_test_machine.c every test process of a Criterion suite one inside it.
 *   CUDA_VISIBLE_DEVICES as the driver reads it: comma-separated indices of the machine's devices or UUIDs
 *                        (GPU-..., a prefix that names one device will do), renumbered from 0 in the order given;
 *                        the list ends at the first entry that names no device or repeats one; empty: no device.
 *   SIMCUDA_TRACE        1: print every driver call to stderr
 *   SIMCUDA_CHECKPOINT_RATE bytes per second a checkpoint moves out and a restore back (K/M/G suffixes; 0: at
 *                        once). Default: what NVIDIA's driver did on an H200, 1.8 GiB/s out, 2.9 GiB/s back
 *                        (docs/DRIVER.md); the memcpy is done at once, the rest of the time slept. Read at
 *                        each checkpoint and restore.
 *   SIMCUDA_CHECKPOINT_BLOCK 1: a call that reaches the driver while the process is checkpointed waits for the
 *                        restore, as NVIDIA's does, instead of aborting (the default: a test notices it)
 *   SIMCUDA_DRIVER_VERSION what cuDriverGetVersion reports (default 13000, read at each call): an older major
 *                        version makes the simulated runtime refuse to start (cudaErrorInsufficientDriver), and
 *                        it then dlclose()s libcuda.so.1 as the real runtime does. The simulated libcuda.so.1 is
 *                        linked -z nodelete, as NVIDIA's libcuda keeps its code mapped once loaded: the service
 *                        thread cuInit starts runs on after such a dlclose.
 *   CUDA_MODULE_LOADING  LAZY (default) or EAGER: what cuModuleGetLoadingMode reports
 *
 * One machine, several processes. Processes on one machine share its GPUs as processes on a real GPU do. Every
 * device has a UUID derived from the machine directory's identity (device and inode) and its index on the machine:
 * every process of the machine agrees on it, whatever ordinal CUDA_VISIBLE_DEVICES gives it, and two machines
 * never share one. Each GPU has an accounting file in the machine directory, named after its UUID (GPU-...,
 * 0600), with one slot per process: pid, start time, bytes held. A process claims its slot at cuInit; its
 * allocations (plain, pitch, managed, pool growth, cuMemCreate) take from the GPU's capacity and fail with
 * CUDA_ERROR_OUT_OF_MEMORY exactly when every live process's bytes plus the request exceed it; cuMemGetInfo
 * reports the GPU's free memory (every process's bytes subtracted). A process that ends normally clears its slot;
 * one that dies (kill -9) leaves it, and the next process to find the GPU full, to ask cuMemGetInfo or to need a
 * slot reclaims it (a slot is dead when its pid is gone or a zombie, or runs a process with another start time).
 * A forked child is a new process for the driver: it inherits the simulator's state as before (it may go on
 * using it, which the real driver forbids), but the GPUs' slots and the memory they count stay the parent's; the
 * child takes a slot of its own, empty, the first time it uses a GPU, and counts only what it allocates itself
 * (freeing inherited memory gives nothing back, and never takes the child's count below zero). A process that
 * calls exec keeps its slot until it ends or the new program initialises CUDA, which reclaims it (the real driver
 * frees the memory at the exec itself).
 * The capacity is the GPU's, stored in its file: the first process to use a GPU that nobody uses sets it (its
 * SIMCUDA_DEVICE_MEM, or simcuda_set_capacity before cuInit); a process whose setting differs while others use
 * the GPU gets the GPU as it is and a warning on stderr. simcuda_set_capacity after cuInit changes the GPU's
 * capacity for every process on it.
 *
 * Where it is simpler than a GPU, it errs on the side that exposes mistakes: a stream-ordered free takes
 * effect only when a synchronisation covers its stream (or a later allocation on that stream runs), so a
 * trim before it returns nothing; freed VMM handle values and addresses are handed out again at once.
 */
#ifndef SIMCUDA_H
#define SIMCUDA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the simulator holds, for one device (or all: device -1) and one context (or any: ctx NULL). */
typedef struct simcuda_stats {
  size_t size;                  /* caller: sizeof(simcuda_stats_t) */
  uint64_t live_blocks;         /* cuMemAlloc/Pitch/Managed blocks + stream-ordered blocks handed out */
  uint64_t live_bytes;          /* their requested sizes */
  uint64_t pool_reserved_bytes; /* memory all pools hold (handed out or cached) */
  uint64_t pool_used_bytes;     /* memory of pools handed out, or freed stream-ordered and not yet reached by its
                                   stream (a free runs at the stream's next synchronisation) */
  uint64_t vmm_handles;         /* cuMemCreate handles whose memory still exists (unreleased, or mapped) */
  uint64_t vmm_phys_bytes;      /* their bytes */
  uint64_t vmm_mappings;        /* live cuMemMap mappings */
  uint64_t va_reserved_bytes;   /* cuMemAddressReserve ranges */
  uint64_t host_blocks;         /* pinned host allocations */
  uint64_t host_bytes;
  uint64_t used_bytes;          /* counted against capacity: live (not pool) + pool reserved + vmm physical */
  uint64_t capacity_bytes;      /* SIMCUDA_DEVICE_MEM (times devices for -1) */
  uint64_t contexts;            /* live contexts (primary contexts that are active, created ones) */
  uint64_t vmm_mapped_bytes;    /* bytes of live cuMemMap mappings */
  /* The GPU's, shared with the other processes on it (device stats only; 0 for a context's): */
  uint64_t gpu_used_bytes;      /* every live process's used_bytes (dead processes' reclaimed first) */
  uint64_t gpu_processes;       /* live processes using it, this one included */
  uint64_t gpu_reclaimed;       /* dead processes' slots reclaimed since the GPU's file was made */
  uint64_t primary_retains;     /* device stats only: the primary context's retain count (cuDevicePrimaryCtxRetain
                                   less releases; a reset leaves it as it is) */
} simcuda_stats_t;

/* Returns 0, CUDA_ERROR_INVALID_VALUE for a bad device/NULL out, CUDA_ERROR_INVALID_CONTEXT for an unknown ctx.
 * out->size: what the caller's struct holds (a struct without the gpu_ fields, from an older header, is filled up
 * to its size).
 * Works before cuInit (everything zero, capacity from the environment). */
CUresult simcuda_stats(int device, CUcontext ctx, simcuda_stats_t *out);

typedef enum simcuda_kind {
  SIMCUDA_DEVICE = 1,      /* cuMemAlloc */
  SIMCUDA_PITCH = 2,       /* cuMemAllocPitch */
  SIMCUDA_MANAGED = 3,     /* cuMemAllocManaged */
  SIMCUDA_ASYNC = 4,       /* handed out by a pool */
  SIMCUDA_VMM = 5,         /* a cuMemCreate handle whose memory exists; address = handle */
  SIMCUDA_VMM_MAPPING = 6, /* a cuMemMap mapping; address = virtual address */
  SIMCUDA_VA = 7,          /* a cuMemAddressReserve range */
  SIMCUDA_HOST = 8         /* pinned host memory */
} simcuda_kind_t;

typedef struct simcuda_block {
  uint64_t address; /* pointer, virtual address, or handle (SIMCUDA_VMM) */
  uint64_t bytes;   /* requested size */
  int kind;         /* simcuda_kind_t */
  int device;       /* -1 for host memory */
  CUcontext ctx;    /* context it belongs to; NULL for VMM and VA */
  CUmemoryPool pool;/* SIMCUDA_ASYNC: its pool */
  int released;     /* SIMCUDA_VMM: cuMemRelease was called, memory kept alive by mappings */
} simcuda_block_t;

/* Calls fn for every block the simulator holds (order unspecified); fn returns non-zero to stop.
 * Returns 0 or fn's non-zero value. fn must not call the driver. */
int simcuda_foreach_block(int (*fn)(const simcuda_block_t *b, void *arg), void *arg);

/* Fault injection: the next `count` calls of the driver entry point named fn (exported name, e.g.
 * "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync") return err without doing anything. count 0 clears it.
 * fn NULL clears every injection. Returns 0, or -1 for an unknown name. */
int simcuda_inject(const char *fn, CUresult err, int count);

/* Test-only interleaving: the next call of the entry point named fn, once it has done its work (or returned an
 * injected error), calls cb(arg) just before it returns, on the calling thread and with no simulator lock held;
 * cb may call the driver. So a test places another thread's step at an exact point between gpureclaim's driver
 * call and what gpureclaim does next. One-shot; cb NULL disarms fn, fn NULL disarms every entry point.
 * Returns 0, or -1 for an unknown name. */
int simcuda_on_return(const char *fn, void (*cb)(void *arg), void *arg);

/* The same at the entry: the next call of fn runs cb(arg) first, before the driver counts it or sees it (the
 * checkpoint lock does not wait for it, and a lock taken meanwhile holds it as it goes on). A test holds a thread
 * there: it has passed gpureclaim's gate and not yet reached the driver. One-shot; cb NULL disarms fn, fn NULL
 * every entry point. Returns 0, or -1 for an unknown name. */
int simcuda_on_enter(const char *fn, void (*cb)(void *arg), void *arg);

/* Number of calls made to the driver entry point with that exported name since start (every route). */
uint64_t simcuda_calls(const char *fn);

/* Every cuGetProcAddress[_v2] request seen, in order: calls fn(symbol, version, flags, arg) for each (the
 * log keeps the first 8192). Returns the number of requests seen. */
uint64_t simcuda_procaddr_requests(void (*fn)(const char *symbol, int version, uint64_t flags, void *arg),
                                   void *arg);

/* Kernels. A kernel of the simulator is a host function void fn(void **kernelParams), run to completion on the
 * calling thread (streams are synchronous). cuLaunchKernel takes one as its CUfunction, or a CUkernel that
 * cuLibraryGetKernel returned (CUDA 12 and 13 pass a CUkernel where a CUfunction is expected; cuKernelGetFunction
 * answers the same handle). cuLibraryLoadData takes, as its code, a simcuda_image_t naming such functions (the
 * real driver takes a cubin, PTX or a fatbinary): the simulated runtime loads each kernel it launches that way,
 * as the real CUDA 13 runtime does, and launches the CUkernel. The image is copied at the load. */
#define SIMCUDA_IMAGE_MAGIC 0x53494d494d473031ULL /* "SIMIMG01" */
typedef struct simcuda_image_kernel {
  const char *name;
  void (*fn)(void **kernelParams);
} simcuda_image_kernel_t;
typedef struct simcuda_image {
  uint64_t magic; /* SIMCUDA_IMAGE_MAGIC */
  unsigned count;
  const simcuda_image_kernel_t *kernels;
} simcuda_image_t;

/* The handle of a device's primary context, without retaining it (CUDA_ERROR_NOT_INITIALIZED before cuInit). The
 * simulated runtime's stand-in for the private route (a driver export table) by which the real runtime gets
 * that handle once at start; like that route, gpureclaim does not see it. */
CUresult simcuda_primary_context(int device, CUcontext *out);

/* Sets the capacity of one device (or all: -1) at run time; allocations beyond it fail with
 * CUDA_ERROR_OUT_OF_MEMORY. Existing memory is kept even when above the new capacity. The capacity is the GPU's:
 * after cuInit, every process on the GPU sees the change; before, it is this process's setting (as
 * SIMCUDA_DEVICE_MEM). */
void simcuda_set_capacity(int device, uint64_t bytes);

/* Where a device's simulated memory lives: its arena's base and size. Returns 1 when the arena sits at its
 * fixed hint address (the same call sequence then gives the same addresses in every process), 0 when the
 * kernel placed it elsewhere, -1 before cuInit or for a bad device.
 * Notes on the figures above: pool_reserved_bytes/pool_used_bytes count whole chunks (requests rounded to
 * the simulator's size classes: 512 B steps up to 4 KiB, then 8 steps per power of two), live_bytes the
 * requested sizes; VA reservations belong to no device and are counted for device -1 only. */
int simcuda_arena(int device, uint64_t *base, uint64_t *size);

/* 1 while the process is locked by cuCheckpointProcessLock (LOCKED or CHECKPOINTED), else 0. The simulated
 * NVML (libnvidia-ml.so.1, a library of its own) blocks its calls meanwhile, as NVIDIA's does; a private copy
 * of it loaded with dlmopen asks its own namespace, where no driver is locked, and answers. */
int simcuda_checkpoint_locked(void);

/* Calls of threads other than the locking one that reached the driver while it held the process locked or
 * checkpointed (device queries that need no context aside): each waited there for the unlock, as on NVIDIA's
 * driver, or aborted the process when it came while checkpointed (SIMCUDA_CHECKPOINT_BLOCK unset). */
uint64_t simcuda_checkpoint_late_calls(void);

#ifdef __cplusplus
}
#endif
#endif /* SIMCUDA_H */
