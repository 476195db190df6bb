/*
 * lazy_probe: under LD_PRELOAD, before the process initialises CUDA gpureclaim starts no thread, installs no
 * handler, writes no file and maps nothing; after cuInit it has them; a child that never touches CUDA (forked,
 * or exec'd with the preload inherited) has none of them. Exits 0 when all holds, else prints why.
 */
#include "gpureclaim.h"

#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Threads of the process. The simulated driver starts one in cuInit, as libcuda does. */
#define DRIVER_THREADS 1
static int threads(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  if (f)
    fclose(f);
  return n;
}

static int handler_is_default(void) {
  struct sigaction sa;
  sigaction(SIGUSR1, NULL, &sa);
  return !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL;
}

static int status_file_exists(pid_t pid) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%d.json", getenv("GPURECLAIM_RUNDIR"), (int)pid);
  struct stat st;
  return stat(p, &st) == 0;
}

#define EXPECT(cond, what)                                                                                 \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      fprintf(stderr, "lazy_probe: %s: %s\n", stage, what);                                                \
      return 1;                                                                                            \
    }                                                                                                      \
  } while (0)

static int nothing(const char *stage) {
  gpureclaim_stats_t s = {.size = sizeof s};
  EXPECT(threads() == 1, "a thread was started");
  EXPECT(handler_is_default(), "a SIGUSR1 handler is installed");
  EXPECT(!status_file_exists(getpid()), "a status file exists");
  EXPECT(gpureclaim_stats(-1, &s) == 0 && s.table_bytes == 0, "the table is mapped");
  return 0;
}

int main(int argc, char **argv) {
  const char *stage = "exec'd child without CUDA";
  if (argc > 1 && !strcmp(argv[1], "--child"))
    return nothing(stage);
  if (nothing("before CUDA initialisation"))
    return 1;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  CUdeviceptr p;
  cuMemAlloc(&p, 4096);
  stage = "after cuInit";
  EXPECT(threads() == 2 + DRIVER_THREADS, "expected the worker thread");
  EXPECT(!handler_is_default(), "expected the SIGUSR1 handler");
  EXPECT(status_file_exists(getpid()), "expected the status file");
  pid_t child = fork();
  if (child == 0)
    _exit(nothing("forked child without CUDA"));
  int st;
  waitpid(child, &st, 0);
  stage = "forked child";
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "see above");
  child = fork();
  if (child == 0) {
    execl("/proc/self/exe", argv[0], "--child", (char *)NULL);
    _exit(3);
  }
  waitpid(child, &st, 0);
  stage = "exec'd child";
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "see above");
  stage = "parent after fork";
  EXPECT(threads() == 2 + DRIVER_THREADS && !handler_is_default(), "the parent lost its machinery");
  printf("lazy_probe: ok\n");
  return 0;
}
