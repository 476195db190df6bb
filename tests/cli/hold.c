/*
 * hold: a program that holds GPU memory and waits, for the command's tests. On the simulator (or a GPU):
 * 3 live 1 MiB blocks, 64 MiB cached in the default pool, a 5 MiB orphan (an ended scope), 64 KiB pinned host
 * memory. Prints "ready <pid>", then for every line "sim" on stdin prints the simulator's own view
 * ("sim live_bytes pool_reserved_bytes host_bytes"), for "exec" becomes `sleep 60` (a program that does not
 * run gpureclaim, under the same pid and start time), and exits when stdin closes. "exec-self" execs hold
 * itself (the same binary: same pid, start time and exe) in a mode that never uses CUDA and catches SIGUSR1
 * with a handler of its own: it prints "exec'd <pid>", then answers "signals" with "signals <count>".
 * "handler" installs the program's own SIGUSR1 handler over gpureclaim's and prints "handler"; "signals"
 * prints how many signals that handler counted.
 * "touch" writes the first live block through a pointer from cuGetProcAddress (behind a sleep gate: a sleeping
 * process wakes) and prints "touched <CUresult>".
 * "alloc N" allocates N MiB with cuMemAlloc (kept) and prints "alloc <CUresult>"; "info" prints what cuMemGetInfo
 * answers, "info <CUresult> <free> <total>" (a limit, GPURECLAIM_LIMIT, shows in both).
 * With GR_HOLD_GATE=PATH in the environment, a releaser ("gate") makes every release of cached memory wait
 * while PATH exists: a release that is slow for as long as a test wants, without timing.
 */
#define _POSIX_C_SOURCE 200809L
#include "simcuda.h"
#include "gpureclaim.h"

#include <cuda.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024)

static volatile sig_atomic_t g_signals;
static void count(int sig) {
  (void)sig;
  g_signals++;
}

/* The "gate" releaser: waits while the file named by GR_HOLD_GATE exists; frees nothing. */
static size_t gate(void *arg) {
  const char *path = arg;
  struct timespec nap = {0, 10000000};
  while (access(path, F_OK) == 0)
    nanosleep(&nap, NULL);
  return 0;
}

/* Prints "signals N" for each line "signals". */
static void answer(const char *line) {
  if (!strcmp(line, "signals\n")) {
    printf("signals %d\n", (int)g_signals);
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--exec-d")) {
    signal(SIGUSR1, count);
    printf("exec'd %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
      answer(line);
    return 0;
  }
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  CUdeviceptr live[3], cached, orphan;
  for (int i = 0; i < 3; i++)
    if (cuMemAlloc(&live[i], MiB))
      return 3;
  CUmemoryPool pool;
  cuDeviceGetDefaultMemPool(&pool, dev);
  cuuint64_t keep = UINT64_MAX;
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  /* The free runs when the stream reaches it: synchronise so that the pool caches the memory. */
  if (cuMemAllocAsync(&cached, 64 * MiB, NULL) || cuMemFreeAsync(cached, NULL) || cuStreamSynchronize(NULL))
    return 4;
  uint64_t s = gpureclaim_scope_begin();
  if (cuMemAlloc(&orphan, 5 * MiB))
    return 5;
  gpureclaim_scope_end(s, 0);
  void *host;
  if (cuMemHostAlloc(&host, 64 * 1024, 0))
    return 6;
  const char *gate_path = getenv("GR_HOLD_GATE");
  if (gate_path && gpureclaim_register_releaser("gate", gate, (void *)gate_path) <= 0)
    return 9;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (!strcmp(line, "exec\n")) {
      execlp("sleep", "sleep", "60", (char *)NULL);
      return 7;
    }
    if (!strcmp(line, "exec-self\n")) {
      execl("/proc/self/exe", "hold", "--exec-d", (char *)NULL);
      return 8;
    }
    if (!strcmp(line, "handler\n")) {
      signal(SIGUSR1, count);
      printf("handler\n");
      fflush(stdout);
      continue;
    }
    if (!strcmp(line, "signals\n")) {
      answer(line);
      continue;
    }
    unsigned mib;
    if (sscanf(line, "alloc %u", &mib) == 1) {
      CUdeviceptr p;
      printf("alloc %d\n", (int)cuMemAlloc(&p, mib * MiB));
      fflush(stdout);
      continue;
    }
    if (!strcmp(line, "info\n")) {
      size_t fr = 0, tot = 0;
      CUresult r = cuMemGetInfo(&fr, &tot);
      printf("info %d %zu %zu\n", (int)r, fr, tot);
      fflush(stdout);
      continue;
    }
    if (!strcmp(line, "touch\n")) {
      CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) = NULL;
      CUdriverProcAddressQueryResult q;
      CUresult r = cuGetProcAddress_v2("cuMemsetD8", (void **)&memset8, 13000, 0, &q);
      if (r == CUDA_SUCCESS)
        r = memset8(live[0], 7, MiB);
      printf("touched %d\n", (int)r);
      fflush(stdout);
      continue;
    }
    simcuda_stats_t st = {.size = sizeof st};
    simcuda_stats(-1, NULL, &st);
    printf("sim %llu %llu %llu\n", (unsigned long long)st.live_bytes, (unsigned long long)st.pool_reserved_bytes,
           (unsigned long long)st.host_bytes);
    fflush(stdout);
  }
  return 0;
}
