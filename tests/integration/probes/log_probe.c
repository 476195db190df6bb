/* log_probe: a release of each kind that writes to GPURECLAIM_LOG on the calling thread: the retry of an
 * allocation that ran out of memory, then gpureclaim_release(). Prints "oom=R release=R" and exits 0.
 * `log_probe exit-race`: four threads release in a loop (each rewriting the status file) while the main thread
 * calls exit(), once every thread has released at least once; nothing of the process may stay in the run
 * directory. With LOG_PROBE_CHDIR set, it changes to that directory first (before CUDA starts gpureclaim). */
#include "gpureclaim.h"

#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int g_started;

static void *release_forever(void *arg) {
  (void)arg;
  for (int first = 1;; first = 0) {
    gpureclaim_release(GPURECLAIM_CACHED, NULL);
    if (first)
      atomic_fetch_add(&g_started, 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *dir = getenv("LOG_PROBE_CHDIR");
  if (dir && chdir(dir) != 0)
    return 4;
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  if (argc > 1 && !strcmp(argv[1], "exit-race")) {
    pthread_t th;
    for (int i = 0; i < 4; i++)
      if (pthread_create(&th, NULL, release_forever, NULL) != 0)
        return 3;
    while (atomic_load(&g_started) < 4)
      sched_yield();
    exit(0);
  }
  CUdeviceptr p;
  CUresult oom = cuMemAlloc(&p, (size_t)1 << 50); /* more than the simulated device has */
  gpureclaim_report_t r = {.size = sizeof r};
  int rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
  printf("oom=%d release=%d\n", (int)oom, rc);
  return 0;
}
