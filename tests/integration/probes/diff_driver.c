/*
 * diff_driver SEED [STEPS] -- a random sequence of driver calls, valid and invalid (unknown and freed
 * pointers, double frees, zero sizes, out-of-memory, wrong free functions, stale handles), printing one line
 * per call: its result and its out-parameters. test_differential runs it with and without gpureclaim and
 * requires identical output: gpureclaim never changes what a call returns or writes (GPURECLAIM_OOM_RETRY=0
 * there, the one documented exception being off). Device addresses are deterministic on the simulator; host
 * pointers are printed as set/unset only.
 * With DIFF_EVIDENCE=FILE it also writes, to FILE, whether gpureclaim is loaded and enabled in this process and
 * whether its table agrees with the simulator at the end (the "verdict" line): the proof that a run "with
 * gpureclaim" had it, and had it tracking.
 */
#include "gpureclaim.h"
#include "simcuda.h"

#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_seed;
static uint64_t rnd(void) {
  g_seed ^= g_seed << 13;
  g_seed ^= g_seed >> 7;
  g_seed ^= g_seed << 17;
  return g_seed;
}

#define N 32
static CUdeviceptr dev[N];   /* live or stale device pointers */
static void *host[N];
static CUmemGenericAllocationHandle handle[N];
static CUdeviceptr va[4];
static size_t va_size[4];

static size_t size_of(void) {
  switch (rnd() % 6) {
  case 0: return 0;                             /* invalid */
  case 1: return (size_t)1 << 40;               /* beyond capacity: out of memory */
  case 2: return 1;
  default: return 256 + rnd() % (4u << 20);
  }
}

static unsigned g_allocs; /* successful allocations of every kind */

static void evidence(const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(3);
  }
  /* Looked up, not linked: the same binary runs without gpureclaim. */
  int (*enabled)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpureclaim_enabled");
  int (*stats)(int, gpureclaim_stats_t *) = (int (*)(int, gpureclaim_stats_t *))dlsym(RTLD_DEFAULT, "gpureclaim_stats");
  fprintf(f, "loaded %d\n", enabled && stats);
  if (!enabled || !stats) {
    fprintf(f, "verdict gpureclaim is not loaded\n");
    fclose(f);
    return;
  }
  int on = enabled();
  gpureclaim_stats_t g = {.size = sizeof g};
  simcuda_stats_t m = {.size = sizeof m};
  int grc = stats(-1, &g);
  CUresult src = simcuda_stats(-1, NULL, &m);
  fprintf(f, "enabled %d\nallocs %u tracked %llu\n", on, g_allocs, (unsigned long long)g.total_allocs);
  fprintf(f, "live blocks %llu (simulator %llu), host blocks %llu (simulator %llu), va bytes %llu (simulator %llu)\n",
          (unsigned long long)g.live_blocks, (unsigned long long)(m.live_blocks + m.vmm_handles),
          (unsigned long long)g.host_pinned_blocks, (unsigned long long)m.host_blocks,
          (unsigned long long)g.va_reserved_bytes, (unsigned long long)m.va_reserved_bytes);
  const char *why = !on ? "gpureclaim is disabled"
                    : grc != 0 || src != CUDA_SUCCESS ? "no statistics"
                    : g_allocs == 0 ? "the program allocated nothing"
                    : g.total_allocs == 0 ? "gpureclaim saw no allocation"
                    : g.live_blocks != m.live_blocks + m.vmm_handles || g.host_pinned_blocks != m.host_blocks ||
                            g.va_reserved_bytes != m.va_reserved_bytes
                        ? "gpureclaim's table differs from the simulator"
                        : NULL;
  fprintf(f, "verdict %s\n", why ? why : "tracked");
  fclose(f);
}

int main(int argc, char **argv) {
  g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) * 0x9E3779B97F4A7C15ull + 1 : 1;
  int steps = argc > 2 ? atoi(argv[2]) : 400;
  CUdevice d;
  CUcontext ctx;
  printf("init %d\n", cuInit(0));
  printf("get %d\n", cuDeviceGet(&d, 0));
  printf("retain %d\n", cuDevicePrimaryCtxRetain(&ctx, d));
  printf("set %d\n", cuCtxSetCurrent(ctx));
  CUmemoryPool pool;
  printf("pool %d\n", cuDeviceGetDefaultMemPool(&pool, d));
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  printf("gran %d %zu\n", cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), gran);
  for (int s = 0; s < steps; s++) {
    unsigned i = (unsigned)(rnd() % N);
    CUresult rc;
    CUdeviceptr p = 0xdead;
    void *h = (void *)0xdead;
    size_t pitch = 7;
    switch (rnd() % 16) {
    case 0: case 1:
      rc = cuMemAlloc(&p, size_of());
      if (rc == CUDA_SUCCESS)
        dev[i] = p, g_allocs++;
      printf("alloc %d %#llx\n", rc, (unsigned long long)p);
      break;
    case 2:
      rc = cuMemAllocPitch(&p, &pitch, 1 + rnd() % 5000, rnd() % 3, 1u << (rnd() % 5));
      if (rc == CUDA_SUCCESS)
        dev[i] = p, g_allocs++;
      printf("pitch %d %#llx %zu\n", rc, (unsigned long long)p, pitch);
      break;
    case 3:
      rc = cuMemAllocManaged(&p, size_of(), CU_MEM_ATTACH_GLOBAL);
      if (rc == CUDA_SUCCESS)
        dev[i] = p, g_allocs++;
      printf("managed %d %#llx\n", rc, (unsigned long long)p);
      break;
    case 4:
      rc = cuMemAllocAsync(&p, size_of(), NULL);
      if (rc == CUDA_SUCCESS)
        dev[i] = p, g_allocs++;
      printf("async %d %#llx\n", rc, (unsigned long long)p);
      break;
    case 5: case 6: /* live, already freed, never allocated, or inside a block */
      p = rnd() % 4 == 0 ? dev[i] + 16 : rnd() % 8 == 0 ? 0x1234000 : dev[i];
      printf("free %d\n", cuMemFree(p));
      break;
    case 7:
      printf("freeasync %d\n", cuMemFreeAsync(dev[i], NULL));
      break;
    case 8:
      rc = cuMemHostAlloc(&h, size_of(), 0);
      if (rc == CUDA_SUCCESS)
        host[i] = h, g_allocs++;
      printf("hostalloc %d %s\n", rc, h == (void *)0xdead ? "unset" : "set");
      break;
    case 9:
      printf("freehost %d\n", cuMemFreeHost(rnd() % 4 ? host[i] : (void *)(uintptr_t)dev[i]));
      if (rnd() % 2)
        host[i] = NULL;
      break;
    case 10: {
      CUmemGenericAllocationHandle hd = 0xdead;
      rc = cuMemCreate(&hd, rnd() % 3 ? gran * (1 + rnd() % 3) : 12345, &prop, 0);
      if (rc == CUDA_SUCCESS)
        handle[i] = hd, g_allocs++;
      printf("create %d %#llx\n", rc, (unsigned long long)hd);
      break;
    }
    case 11:
      printf("release %d\n", cuMemRelease(handle[i]));
      break;
    case 12: {
      unsigned k = (unsigned)(rnd() % 4);
      if (!va[k]) {
        va_size[k] = gran * 4;
        CUdeviceptr v = 0xdead;
        rc = cuMemAddressReserve(&v, va_size[k], 0, 0, 0);
        if (rc == CUDA_SUCCESS)
          va[k] = v;
        printf("reserve %d %#llx\n", rc, (unsigned long long)v);
      } else {
        printf("map %d\n", cuMemMap(va[k] + gran * (rnd() % 4), gran, 0, handle[i], 0));
      }
      break;
    }
    case 13: {
      unsigned k = (unsigned)(rnd() % 4);
      printf("unmap %d\n", cuMemUnmap(va[k] + gran * (rnd() % 4), gran));
      break;
    }
    case 14: {
      unsigned k = (unsigned)(rnd() % 4);
      rc = cuMemAddressFree(va[k], va_size[k]);
      if (rc == CUDA_SUCCESS)
        va[k] = 0;
      printf("addrfree %d\n", rc);
      break;
    }
    default: {
      size_t free_b = 0, total = 0;
      printf("info %d %zu %zu\n", cuMemGetInfo(&free_b, &total), free_b, total);
      printf("trim %d\n", cuMemPoolTrimTo(pool, rnd() % 2 ? 0 : 1u << 20));
    }
    }
  }
  const char *ev = getenv("DIFF_EVIDENCE");
  if (ev)
    evidence(ev);
  return 0;
}
