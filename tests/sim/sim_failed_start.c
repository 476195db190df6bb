/* sim_failed_start.c -- a runtime whose start fails after cuInit: the driver reports an older major version
 * (SIMCUDA_DRIVER_VERSION=12080, set by CTest), the simulated runtime refuses with cudaErrorInsufficientDriver and
 * dlclose()s libcuda.so.1, as NVIDIA's runtime does. cuInit has started the simulated driver's service thread by
 * then; the driver must stay mapped under it (-z nodelete), or the thread runs into unmapped code. This program
 * links the shared runtime only: nothing else holds libcuda.so.1 open. Exit 0 when all holds, 1 with the reason. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const char *why) {
  fprintf(stderr, "sim_failed_start: %s\n", why);
  return 1;
}

/* Whether a thread of this process is named name (/proc/self/task/TID/comm). */
static int has_thread(const char *name) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent *e;
  int found = 0;
  while (!found && (e = readdir(d))) {
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (fgets(comm, sizeof comm, f)) found = strncmp(comm, name, strlen(name)) == 0;
    fclose(f);
  }
  closedir(d);
  return found;
}

/* Whether libcuda.so.1 is mapped, as /proc/self/maps lists it. */
static int driver_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, "/libcuda.so.1") != NULL;
  fclose(f);
  return found;
}

int main(void) {
  const char *v = getenv("SIMCUDA_DRIVER_VERSION");
  if (!v || atoi(v) / 1000 >= CUDART_VERSION / 1000) return fail("SIMCUDA_DRIVER_VERSION must name an older driver");
  if (driver_mapped()) return fail("libcuda.so.1 is mapped before the runtime loaded it: nothing would be tested");
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, 4096);
  if (e != cudaErrorInsufficientDriver) {
    fprintf(stderr, "sim_failed_start: cudaMalloc -> %s, expected cudaErrorInsufficientDriver\n", cudaGetErrorName(e));
    return 1;
  }
  int n = -1;
  if (cudaGetDeviceCount(&n) != cudaErrorInsufficientDriver || n != 0)
    return fail("the failed start is not remembered");
  /* The case that crashed: cuInit ran (its thread exists) and the runtime has closed the driver again. */
  if (!has_thread("simcuda-svc")) return fail("no service thread: cuInit did not run before the start failed");
  if (!driver_mapped()) return fail("libcuda.so.1 was unmapped under its service thread (link it -z nodelete)");
  /* It stays loaded for whoever opens it next, with the thread running on meanwhile. */
  nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) return fail("libcuda.so.1 is no longer loaded");
  dlclose(h);
  printf("sim_failed_start: the runtime refused an older driver and closed it; libcuda.so.1 stays mapped\n");
  return 0;
}
