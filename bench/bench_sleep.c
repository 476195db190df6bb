/*
 * bench_sleep -- sleep and wake times on the simulator, for a process holding 1, 4 and 16 GiB of live device
 * memory (every page written, so the checkpoint copies all of it).
 *
 * `bench_sleep [GiB ...]` runs under libgpureclaim.so and the simulated driver (LD_PRELOAD, LD_LIBRARY_PATH as
 * the tests set them). For each size: cudaMalloc, cudaMemset (every page committed), gpureclaim_sleep() (the
 * release, the host-room check, the lock, the checkpoint), then gpureclaim_wake() (the room check, the restore,
 * the unlock), and a read-back of the first and last bytes. A size whose device pages and host copy would not
 * both fit in the host's available memory is skipped and said so (the simulator's device memory is host memory:
 * a sleep holds it twice until the checkpoint gives the device pages back). On the simulator the figures measure
 * gpureclaim's own steps plus a memcpy of the contents; a GPU's copy runs over the host link instead.
 */
#include <cuda_runtime_api.h>
#include <gpureclaim.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static unsigned long long mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
      break;
  if (f)
    fclose(f);
  return kb * 1024;
}

int main(int argc, char **argv) {
  static const int def[] = {1, 4, 16};
  int n = argc > 1 ? argc - 1 : 3;
  if (cudaSetDevice(0) != cudaSuccess || !gpureclaim_enabled()) {
    fprintf(stderr, "bench_sleep: needs the simulated runtime and libgpureclaim.so preloaded\n");
    return 1;
  }
  printf("GiB   sleep ms   wake ms   moved GiB   released MiB\n");
  for (int i = 0; i < n; i++) {
    int gib = argc > 1 ? atoi(argv[i + 1]) : def[i];
    size_t bytes = (size_t)gib << 30;
    unsigned long long avail = mem_available();
    if (gib <= 0 || 2 * (unsigned long long)bytes + (512ull << 20) > avail) {
      printf("%3d   skipped: needs %d GiB of host memory (device pages and their copy), %.1f GiB available\n", gib,
             2 * gib, (double)avail / (1 << 30));
      continue;
    }
    void *p;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0x5a, bytes) != cudaSuccess) {
      fprintf(stderr, "bench_sleep: cannot hold %d GiB on the simulated device\n", gib);
      return 1;
    }
    gpureclaim_sleep_report_t r = {.size = sizeof r};
    double t0 = now_ms();
    int rc = gpureclaim_sleep(&r);
    double t1 = now_ms();
    if (rc != 0) {
      fprintf(stderr, "bench_sleep: sleep refused (%d): %s\n", rc, r.reason);
      return 1;
    }
    rc = gpureclaim_wake();
    double t2 = now_ms();
    unsigned char first = 0, last = 0;
    if (rc != 0 || cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(&last, (char *)p + bytes - 1, 1, cudaMemcpyDeviceToHost) != cudaSuccess || first != 0x5a ||
        last != 0x5a) {
      fprintf(stderr, "bench_sleep: wake failed or contents changed\n");
      return 1;
    }
    printf("%3d   %8.1f   %7.1f   %9.2f   %12.1f\n", gib, t1 - t0, t2 - t1, (double)r.moved_bytes / (1 << 30),
           (double)r.released_bytes / (1 << 20));
    cudaFree(p);
  }
  return 0;
}
