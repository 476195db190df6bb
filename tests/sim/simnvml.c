/*
 * simnvml.c -- libnvidia-ml.so.1 of the simulated machine: the few NVML calls gpureclaim makes (a device's free
 * memory without a CUDA context, which a checkpointed process no longer has).
 *
 * Like NVIDIA's, it is a library of its own that reads the machine's state, not the calling process's driver:
 * every GPU of the simulated machine, in its physical order (CUDA_VISIBLE_DEVICES does not apply), and a GPU's
 * free memory is what every live process of the machine leaves (sim_machine.c's file for that UUID), whoever
 * asks.
 *
 * And like NVIDIA's, observed on driver 580 (docs/DRIVER.md), its calls block while the process is locked by the
 * driver's checkpoint API (cuCheckpointProcessLock until cuCheckpointProcessUnlock, so through a whole sleep),
 * while a private copy loaded with dlmopen(LM_ID_NEWLM) answers. The copy asks the simulated driver of its own
 * link-map namespace (dlopen RTLD_NOLOAD): in the process's namespace that is the driver in use, in a private one
 * there is none. A blocked call says so once on stderr, and one blocked for 30 s aborts, naming the call: on
 * NVIDIA's it would never return, here a test fails instead of hanging.
 *
 * Built without sanitizers, as NVIDIA's is: a private namespace has no sanitizer runtime to load.
 */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NVML_API __attribute__((visibility("default"))) int

enum { NVML_OK = 0, NVML_UNINITIALIZED = 1, NVML_INVALID_ARGUMENT = 2, NVML_NOT_FOUND = 6, NVML_UNKNOWN = 999 };

typedef struct {
  unsigned long long total, free, used;
} nvml_memory_t;

typedef struct simnvml_dev {
  char uuid[48];
} simnvml_dev_t;

#define MAX_HANDLES 64
static simnvml_dev_t g_dev[MAX_HANDLES];
static int g_ndev;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_inits;
static _Atomic int g_waiters;
static _Atomic int g_said;

static int uuid_of_index(unsigned i, char *buf, size_t len);
static simnvml_dev_t *handle_for(const char *uuid);

/* Whether the driver of this namespace holds the process locked. */
static int locked(void) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  int (*fn)(void) = (int (*)(void))dlsym(h, "simcuda_checkpoint_locked");
  int r = fn ? fn() : 0;
  dlclose(h);
  return r;
}

static void wait_unlocked(const char *call) {
  if (!locked()) return;
  atomic_fetch_add(&g_waiters, 1);
  if (!atomic_exchange(&g_said, 1))
    fprintf(stderr, "simnvml: %s waits: the process is locked by cuCheckpointProcessLock, and NVIDIA's NVML blocks "
                    "its own process's calls until cuCheckpointProcessUnlock (a private copy, dlmopen, does not)\n",
            call);
  /* NVIDIA's waits as long as the lock lasts, so for ever when the process waits on itself (a sleeping process
   * asking its own NVML whether it may wake). A hang guard makes that a loud failure here instead of a test that
   * never ends. */
  for (long ms = 0; locked(); ms++) {
    if (ms == 30000) {
      fprintf(stderr, "simnvml: %s waited 30 s for cuCheckpointProcessUnlock; NVIDIA's NVML would wait for ever "
                      "(does the process ask its own NVML while it sleeps?)\n", call);
      abort();
    }
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  atomic_fetch_sub(&g_waiters, 1);
}

/* For tests: how many calls are waiting for an unlock now. */
__attribute__((visibility("default"))) int simnvml_waiters(void);
__attribute__((visibility("default"))) int simnvml_waiters(void) { return atomic_load(&g_waiters); }

NVML_API nvmlInit_v2(void);
NVML_API nvmlInit_v2(void) {
  wait_unlocked("nvmlInit_v2");
  atomic_fetch_add(&g_inits, 1);
  return NVML_OK;
}

NVML_API nvmlShutdown(void);
NVML_API nvmlShutdown(void) {
  wait_unlocked("nvmlShutdown");
  int n = atomic_load(&g_inits);
  while (n > 0 && !atomic_compare_exchange_weak(&g_inits, &n, n - 1)) {
  }
  return n > 0 ? NVML_OK : NVML_UNINITIALIZED;
}

NVML_API nvmlDeviceGetHandleByUUID(const char *uuid, void **device);
NVML_API nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
  wait_unlocked("nvmlDeviceGetHandleByUUID");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  if (!uuid || !device) return NVML_INVALID_ARGUMENT;
  int found = 0;
  for (unsigned i = 0; i < (unsigned)simm_env_devices() && !found; i++) {
    char u[48];
    found = uuid_of_index(i, u, sizeof u) == 0 && strcmp(u, uuid) == 0;
  }
  if (!found) return NVML_NOT_FOUND;
  simnvml_dev_t *d = handle_for(uuid);
  if (!d) return NVML_UNKNOWN;
  *device = d;
  return NVML_OK;
}

/* The machine's GPUs in NVML's order (their physical index; CUDA_VISIBLE_DEVICES renumbers CUDA's ordinals, not
 * NVML's), as nvidia-smi numbers them. */
NVML_API nvmlDeviceGetCount_v2(unsigned *count);
NVML_API nvmlDeviceGetCount_v2(unsigned *count) {
  wait_unlocked("nvmlDeviceGetCount_v2");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  if (!count) return NVML_INVALID_ARGUMENT;
  *count = (unsigned)simm_env_devices();
  return NVML_OK;
}

static int uuid_of_index(unsigned i, char *buf, size_t len) {
  if (i >= (unsigned)simm_env_devices()) return -1;
  uint64_t dev, ino;
  char err[256];
  int fd = simm_open_machine(&dev, &ino, err, sizeof err);
  if (fd < 0) return -1;
  close(fd);
  unsigned char u[16];
  simm_uuid(dev, ino, (int)i, u);
  simm_uuid_string(u, buf, len);
  return 0;
}

static simnvml_dev_t *handle_for(const char *uuid) {
  pthread_mutex_lock(&g_mu);
  int i = 0;
  while (i < g_ndev && strcmp(g_dev[i].uuid, uuid) != 0) i++;
  if (i == g_ndev && g_ndev < MAX_HANDLES) snprintf(g_dev[g_ndev++].uuid, sizeof g_dev[0].uuid, "%s", uuid);
  pthread_mutex_unlock(&g_mu);
  return i < MAX_HANDLES ? &g_dev[i] : NULL;
}

NVML_API nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device);
NVML_API nvmlDeviceGetHandleByIndex_v2(unsigned index, void **device) {
  wait_unlocked("nvmlDeviceGetHandleByIndex_v2");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  char uuid[48];
  if (!device || uuid_of_index(index, uuid, sizeof uuid) != 0) return NVML_INVALID_ARGUMENT;
  simnvml_dev_t *d = handle_for(uuid);
  if (!d) return NVML_UNKNOWN;
  *device = d;
  return NVML_OK;
}

NVML_API nvmlDeviceGetUUID(void *device, char *uuid, unsigned length);
NVML_API nvmlDeviceGetUUID(void *device, char *uuid, unsigned length) {
  wait_unlocked("nvmlDeviceGetUUID");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  simnvml_dev_t *d = device;
  if (!d || d < g_dev || d >= g_dev + MAX_HANDLES || !uuid) return NVML_INVALID_ARGUMENT;
  if (length < strlen(d->uuid) + 1) return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
  memcpy(uuid, d->uuid, strlen(d->uuid) + 1);
  return NVML_OK;
}

NVML_API nvmlDeviceGetIndex(void *device, unsigned *index);
NVML_API nvmlDeviceGetIndex(void *device, unsigned *index) {
  wait_unlocked("nvmlDeviceGetIndex");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  simnvml_dev_t *d = device;
  if (!d || d < g_dev || d >= g_dev + MAX_HANDLES || !index) return NVML_INVALID_ARGUMENT;
  for (unsigned i = 0; i < (unsigned)simm_env_devices(); i++) {
    char u[48];
    if (uuid_of_index(i, u, sizeof u) == 0 && strcmp(u, d->uuid) == 0) {
      *index = i;
      return NVML_OK;
    }
  }
  return NVML_NOT_FOUND;
}

NVML_API nvmlDeviceGetMemoryInfo(void *device, nvml_memory_t *m);
NVML_API nvmlDeviceGetMemoryInfo(void *device, nvml_memory_t *m) {
  wait_unlocked("nvmlDeviceGetMemoryInfo");
  if (atomic_load(&g_inits) <= 0) return NVML_UNINITIALIZED;
  simnvml_dev_t *d = device;
  if (!d || d < g_dev || d >= g_dev + MAX_HANDLES || !m) return NVML_INVALID_ARGUMENT;
  uint64_t cap, used;
  if (simm_peek(d->uuid, &cap, &used) != 0) { /* no process has used this GPU yet */
    if (errno != ENOENT) return NVML_UNKNOWN;
    cap = simm_env_capacity();
    used = 0;
  }
  m->total = cap;
  m->free = used >= cap ? 0 : cap - used;
  m->used = m->total - m->free;
  return NVML_OK;
}
