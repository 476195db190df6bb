/*
 * names.h -- the names gpureclaim writes for its enumerations, each list written once: the JSON of reports,
 * snapshots and status files, the command's output, and (checked by tests/cli/test_names_docs.py against the
 * lists printed by tests/cli/layout.c) the tables of python/gpureclaim/ and of the GPU tests' ctypes shim.
 * No CUDA: the command includes this too.
 *
 *   X(value, "name")   value: an enumerator of include/gpureclaim.h (or GR_API_*, defined here from its list)
 */
#ifndef GPURECLAIM_NAMES_H
#define GPURECLAIM_NAMES_H

#include "gpureclaim.h"

/* gpureclaim_block_t.kind (gpureclaim_kind_t): a snapshot's and a leak report's "kind". */
#define GR_KINDS(X)                             \
  X(GPURECLAIM_KIND_DEVICE, "device")           \
  X(GPURECLAIM_KIND_PITCH, "pitch")             \
  X(GPURECLAIM_KIND_MANAGED, "managed")         \
  X(GPURECLAIM_KIND_ASYNC, "async")             \
  X(GPURECLAIM_KIND_VMM, "vmm")                 \
  X(GPURECLAIM_KIND_VMM_MAPPING, "vmm_mapping") \
  X(GPURECLAIM_KIND_VA, "va")                   \
  X(GPURECLAIM_KIND_HOST, "host")

/* gpureclaim_block_t.state (gpureclaim_block_state_t): a snapshot's "state" of a block. */
#define GR_BLOCK_STATES(X)             \
  X(GPURECLAIM_BLOCK_LIVE, "live")     \
  X(GPURECLAIM_BLOCK_ORPHAN, "orphan") \
  X(GPURECLAIM_BLOCK_RELEASED, "released")

/* gpureclaim_report_t.trigger and gpureclaim_sleep_report_t.trigger (gpureclaim_trigger_t): a report's
 * "trigger". */
#define GR_TRIGGERS(X)                     \
  X(GPURECLAIM_TRIGGER_API, "api")         \
  X(GPURECLAIM_TRIGGER_SIGNAL, "signal")   \
  X(GPURECLAIM_TRIGGER_OOM, "oom")         \
  X(GPURECLAIM_TRIGGER_COMMAND, "command") \
  X(GPURECLAIM_TRIGGER_SCOPE, "scope")     \
  X(GPURECLAIM_TRIGGER_PEER, "peer")       \
  X(GPURECLAIM_TRIGGER_IDLE, "idle")       \
  X(GPURECLAIM_TRIGGER_CALL, "call")

/* gpureclaim_sleep_state_t: the status file's sleep "state", the STATE column of `gpureclaim ps`. */
#define GR_SLEEP_STATES(X)                 \
  X(GPURECLAIM_STATE_AWAKE, "awake")       \
  X(GPURECLAIM_STATE_SLEEPING, "sleeping") \
  X(GPURECLAIM_STATE_WAKING, "waking")

/* What a release gives back (GPURECLAIM_CACHED, ...): GPURECLAIM_ON_SIGNAL, `release --what`, the control
 * socket's release request and a report's "what" take these words, comma-separated. "orphans" is accepted for
 * "orphaned" and never written. */
#define GR_WHATS(X)                  \
  X(GPURECLAIM_CACHED, "cached")     \
  X(GPURECLAIM_ORPHANED, "orphaned") \
  X(GPURECLAIM_ALL, "all")
#define GR_WHAT_ALIASES(X) X(GPURECLAIM_ORPHANED, "orphans")

/* The calls that make blocks: a block's "api" (the record's api field; 0..15 driver, 16.. runtime). */
#define GR_APIS(X)                                                 \
  X(GR_API_cuMemAlloc, 1, "cuMemAlloc_v2")                         \
  X(GR_API_cuMemAllocPitch, 2, "cuMemAllocPitch_v2")               \
  X(GR_API_cuMemAllocManaged, 3, "cuMemAllocManaged")              \
  X(GR_API_cuMemAllocAsync, 4, "cuMemAllocAsync")                  \
  X(GR_API_cuMemAllocFromPoolAsync, 5, "cuMemAllocFromPoolAsync")  \
  X(GR_API_cuMemHostAlloc, 6, "cuMemHostAlloc")                    \
  X(GR_API_cuMemAllocHost, 7, "cuMemAllocHost_v2")                 \
  X(GR_API_cuMemCreate, 8, "cuMemCreate")                          \
  X(GR_API_cuMemMap, 9, "cuMemMap")                                \
  X(GR_API_cuMemAddressReserve, 10, "cuMemAddressReserve")         \
  X(GR_API_cudaMalloc, 16, "cudaMalloc")                           \
  X(GR_API_cudaMallocPitch, 17, "cudaMallocPitch")                 \
  X(GR_API_cudaMallocManaged, 18, "cudaMallocManaged")             \
  X(GR_API_cudaMallocAsync, 19, "cudaMallocAsync")                 \
  X(GR_API_cudaMallocFromPoolAsync, 20, "cudaMallocFromPoolAsync") \
  X(GR_API_cudaMallocHost, 21, "cudaMallocHost")                   \
  X(GR_API_cudaHostAlloc, 22, "cudaHostAlloc")

#define GR_NAMES_ENUM_(id, value, name) id = value,
enum { GR_API_NONE = 0, GR_APIS(GR_NAMES_ENUM_) GR_API_COUNT };
#undef GR_NAMES_ENUM_

/* The name of a value, "?" for one not in the list. */
#define GR_NAMES_CASE_(value, name) \
  case value:                       \
    return name;
#define GR_NAMES_CASE3_(value, num, name) GR_NAMES_CASE_(value, name)
static inline const char *gr_kind_name(int v) {
  switch (v) { GR_KINDS(GR_NAMES_CASE_) }
  return "?";
}
static inline const char *gr_block_state_name(int v) {
  switch (v) { GR_BLOCK_STATES(GR_NAMES_CASE_) }
  return "?";
}
static inline const char *gr_trigger_name(int v) {
  switch (v) { GR_TRIGGERS(GR_NAMES_CASE_) }
  return "?";
}
static inline const char *gr_sleep_state_name(int v) {
  switch (v) { GR_SLEEP_STATES(GR_NAMES_CASE_) }
  return "?";
}
static inline const char *gr_api_name(unsigned v) {
  switch (v) { GR_APIS(GR_NAMES_CASE3_) }
  return "?";
}
#undef GR_NAMES_CASE3_
#undef GR_NAMES_CASE_

#endif
