/*
 * sim_internal.h -- data structures shared by the simulated driver's translation units (never exported).
 *
 * The simulator keeps its bookkeeping out of the simulated device memory, so a program that scribbles over
 * its own buffers cannot corrupt the allocator, and everything here is O(1) or O(log n) so that an
 * alloc+free pair stays far below the cost gpureclaim adds on top of it.
 */
#ifndef SIM_INTERNAL_H
#define SIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* ---- u64 -> pointer hash map (open addressing, linear probing, backward-shift deletion).
 * Key 0 marks an empty slot: every key used (addresses, handles, object pointers) is non-zero. */
typedef struct simmap {
  uint64_t *keys;
  void **vals;
  size_t cap; /* power of two, or 0 before the first insert */
  size_t n;
} simmap_t;

void *simmap_get(const simmap_t *m, uint64_t key);
/* Inserts or replaces; returns 0, or -1 when memory is exhausted (map unchanged). */
int simmap_put(simmap_t *m, uint64_t key, void *val);
/* Removes the key; returns its value or NULL. */
void *simmap_del(simmap_t *m, uint64_t key);
void simmap_free(simmap_t *m);

/* ---- free-extent manager: hands out [start, start+len) ranges of an address window with alignment and
 * coalesces them on return. Extents are binned by floor(log2(len)); neighbours are found through two maps. */
typedef struct simext {
  uint64_t start, len;
  struct simext *prev, *next;
  int bin;
} simext_t;

typedef struct simextmgr {
  simmap_t by_start, by_end;
  simext_t *bins[64];
  uint64_t nonempty; /* bit b: bins[b] non-empty */
  uint64_t free_bytes;
} simextmgr_t;

int simext_init(simextmgr_t *m, uint64_t start, uint64_t len);
/* Returns the start of a range of len bytes aligned to align (a power of two), or 0 when none fits. */
uint64_t simext_alloc(simextmgr_t *m, uint64_t len, uint64_t align);
/* Takes exactly [start, start+len) when it is free; returns 0 on success, -1 otherwise. */
int simext_alloc_at(simextmgr_t *m, uint64_t start, uint64_t len);
/* Returns a range; returns 0, or -1 when bookkeeping memory is exhausted (the range is then lost). */
int simext_free(simextmgr_t *m, uint64_t start, uint64_t len);

/* ---- hierarchical bitmap with predecessor search: which 512-byte units start a carved chunk, so an
 * interior device pointer finds its chunk in a handful of word operations. Levels live in MAP_NORESERVE
 * mappings: only the pages touched are committed. */
#define SIMBITS_MAXLVL 8
typedef struct simbits {
  uint64_t *lvl[SIMBITS_MAXLVL];
  size_t words[SIMBITS_MAXLVL];
  int nlvl;
  uint64_t nbits;
} simbits_t;

int simbits_init(simbits_t *b, uint64_t nbits);
void simbits_set(simbits_t *b, uint64_t i);
void simbits_clear(simbits_t *b, uint64_t i);
/* Largest set index <= i, or -1. */
int64_t simbits_pred(const simbits_t *b, uint64_t i);

/* ---- the simulated machine (sim_machine.c): the GPUs several processes share, one accounting file per GPU in
 * the machine's directory. Called with the simulator's lock held. */
#define SIMM_MAX_GPUS 8
typedef struct simgpu simgpu_t;
typedef struct simm_info {
  uint64_t capacity, used, mine, reclaimed;
  int processes; /* live processes with a slot, this one included */
} simm_info_t;

/* The machine's number of GPUs (SIMCUDA_DEVICES, default 2, at most SIMM_MAX_GPUS) and a GPU's capacity
 * (SIMCUDA_DEVICE_MEM, default 80 GiB), as the driver and NVML read them. */
int simm_env_devices(void);
/* "80G", "512M", "1073741824", "1.5G" -> bytes (binary units); 0 when unparsable. */
uint64_t simm_parse_bytes(const char *s);
uint64_t simm_env_capacity(void);
/* Opens (creating it 0700 if missing) SIMCUDA_MACHINE or the per-user default and checks it is the user's own
 * and private; returns its directory fd and identity, or -1 with a message in err. */
int simm_open_machine(uint64_t *dev, uint64_t *ino, char *err, size_t errlen);
/* The UUID of physical GPU `phys` of the machine with that identity (version 4 form), and nvidia-smi's text. */
void simm_uuid(uint64_t machine_dev, uint64_t machine_ino, int phys, unsigned char out[16]);
void simm_uuid_string(const unsigned char u[16], char *buf, size_t len);
/* Maps the GPU's file (creating it) and claims a slot; capacity: this process's setting. NULL + err on failure. */
simgpu_t *simm_attach(int dirfd, const unsigned char uuid[16], uint64_t capacity, char *err, size_t errlen);
/* Takes n bytes if every live process's bytes plus n fit the capacity: 0, else -1 (nothing taken). */
int simm_take(simgpu_t *g, uint64_t n);
void simm_give(simgpu_t *g, uint64_t n);
/* A lock-free estimate of whether n more bytes would fail now (for choosing to trim a pool first). */
int simm_would_exceed(const simgpu_t *g, uint64_t n);
uint64_t simm_capacity(const simgpu_t *g);
void simm_set_capacity(simgpu_t *g, uint64_t bytes);
/* Exact figures: dead processes' slots are reclaimed first. */
void simm_info(simgpu_t *g, simm_info_t *out);
/* NVML's view of a GPU (simnvml.c): its capacity and the bytes every live process holds on it, read from the file
 * named uuid ("GPU-xxxxxxxx-...") without claiming a slot; dead processes' slots are reclaimed first. 0, or -1
 * with errno (ENOENT: no process of the machine has used that GPU yet; EINVAL: not a UUID). Needs no lock. */
int simm_peek(const char *uuid, uint64_t *capacity, uint64_t *used);
/* In a forked child: the slots are the parent's; the child claims its own when it next uses a GPU. */
void simm_atfork_child(void);
/* At exit: clears this process's slots. */
void simm_fini(void);

#endif /* SIM_INTERNAL_H */
