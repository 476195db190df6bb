/*
 * nvml.c -- the machine's GPUs as nvidia-smi numbers them. Each process numbers the GPUs it sees from 0
 * (CUDA_VISIBLE_DEVICES renumbers them), so two processes' "GPU 0" may be two GPUs; NVML (libnvidia-ml.so.1)
 * numbers every GPU of the machine once, in the order nvidia-smi shows them, and names each by the UUID the
 * processes report. The command loads NVML itself, with dlopen: it is a process of its own, never one that
 * sleeps (a sleeping process's own NVML blocks: docs/DRIVER.md), and it needs no NVIDIA header to build.
 * Where NVML cannot be loaded (no driver, a container given only the compute libraries) GPUs are named by UUID
 * and each process's own ordinal stands in for the number; ps and top say so.
 */
#include "command.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  unsigned long long total, free, used;
} nvml_memory_t;

static struct {
  bool tried, ok;
  char why[300];
  void *h;
  int (*device_count)(unsigned *);
  int (*handle_by_index)(unsigned, void **);
  int (*uuid)(void *, char *, unsigned);
  int (*memory)(void *, nvml_memory_t *);
  const char *(*error_string)(int);
  cmd_gpu_t gpus[CMD_MAX_GPUS];
  void *handles[CMD_MAX_GPUS];
  size_t n;
} g;

static const char *nvml_error(int rc, char *buf, size_t len) {
  if (g.error_string && g.error_string(rc))
    return g.error_string(rc);
  snprintf(buf, len, "NVML error %d", rc);
  return buf;
}

static bool load(void) {
  if (g.tried)
    return g.ok;
  g.tried = true;
  g.h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!g.h) {
    const char *e = dlerror();
    snprintf(g.why, sizeof g.why, "NVML (libnvidia-ml.so.1) cannot be loaded: %s", e ? e : "not found");
    return false;
  }
  int (*init)(void) = (int (*)(void))dlsym(g.h, "nvmlInit_v2");
  g.device_count = (int (*)(unsigned *))dlsym(g.h, "nvmlDeviceGetCount_v2");
  g.handle_by_index = (int (*)(unsigned, void **))dlsym(g.h, "nvmlDeviceGetHandleByIndex_v2");
  g.uuid = (int (*)(void *, char *, unsigned))dlsym(g.h, "nvmlDeviceGetUUID");
  g.memory = (int (*)(void *, nvml_memory_t *))dlsym(g.h, "nvmlDeviceGetMemoryInfo");
  g.error_string = (const char *(*)(int))dlsym(g.h, "nvmlErrorString");
  if (!init || !g.device_count || !g.handle_by_index || !g.uuid) {
    snprintf(g.why, sizeof g.why, "NVML (libnvidia-ml.so.1) lacks nvmlInit_v2, nvmlDeviceGetCount_v2, "
                                  "nvmlDeviceGetHandleByIndex_v2 or nvmlDeviceGetUUID");
    return false;
  }
  char eb[32];
  int rc = init();
  unsigned count = 0;
  if (rc == 0)
    rc = g.device_count(&count);
  if (rc != 0) {
    snprintf(g.why, sizeof g.why, "NVML (libnvidia-ml.so.1) does not answer: %s", nvml_error(rc, eb, sizeof eb));
    return false;
  }
  for (unsigned i = 0; i < count && g.n < CMD_MAX_GPUS; i++) {
    cmd_gpu_t *x = &g.gpus[g.n];
    if (g.handle_by_index(i, &g.handles[g.n]) != 0 || g.uuid(g.handles[g.n], x->uuid, sizeof x->uuid) != 0)
      continue; /* a GPU NVML cannot name (lost, or being reset): not listed, as nvidia-smi shows it in error */
    x->index = (int)i;
    g.n++;
  }
  g.ok = true;
  cmd_nvml_refresh();
  return true;
}

size_t cmd_nvml_gpus(const cmd_gpu_t **out, const char **why) {
  *out = g.gpus;
  if (!load()) {
    if (why)
      *why = g.why;
    return 0;
  }
  if (why)
    *why = NULL;
  return g.n;
}

bool cmd_nvml_ok(const char **why) {
  bool ok = load();
  if (why)
    *why = ok ? NULL : g.why;
  return ok;
}

int cmd_nvml_index(const char *uuid) {
  if (!uuid || !*uuid || !load())
    return -1;
  for (size_t i = 0; i < g.n; i++)
    if (!strcmp(g.gpus[i].uuid, uuid))
      return g.gpus[i].index;
  return -1;
}

void cmd_nvml_refresh(void) {
  if (!g.ok)
    return;
  for (size_t i = 0; i < g.n; i++) {
    nvml_memory_t m;
    g.gpus[i].have_mem = g.memory && g.memory(g.handles[i], &m) == 0;
    if (g.gpus[i].have_mem) {
      g.gpus[i].free = m.free;
      g.gpus[i].total = m.total;
    }
  }
}
