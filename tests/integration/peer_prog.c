/*
 * peer_prog: one process of a peer reclaim test (test_peers.py), driven line by line on stdin. Linked with
 * -lgpureclaim (no preload needed) and the simulator, on device PEER_DEVICE (default 0). It prints
 * "ready PID UUID" once it has a context, then answers each command with one line:
 *   cache N          N MiB through cuMemAllocAsync, freed again: N MiB in the default pool, unused ("cached")
 *   orphan N         N MiB with cuMemAlloc in a scope that then ends ("orphaned")
 *   live N           N MiB with cuMemAlloc, filled with 0xA5 ("live")
 *   check            whether every live block still reads 0xA5 ("intact" or "corrupt")
 *   alloc N ROUTE    N MiB through ROUTE (alloc, async, pool, create, managed, pitch), kept:
 *                    "ok MS", "oom MS" or "err CODE MS" (MS: milliseconds the call took)
 *   free             frees what alloc got ("freed")
 *   stats            "stats PEER_RECLAIMS SUCCESSES RECEIVED GIVES GIVEN POOL_RESERVED"
 *   info             "info FREE TOTAL" (cuMemGetInfo: the whole simulated GPU's free memory)
 */
#include "gpureclaim.h"

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024)
#define MAXB 256

static CUdevice g_dev;
static CUdeviceptr g_live[MAXB];
static size_t g_live_n[MAXB], g_nlive;
static CUdeviceptr g_got[MAXB];
static CUmemGenericAllocationHandle g_got_h[MAXB];
static int g_got_kind[MAXB]; /* 0 pointer, 1 async, 2 handle */
static size_t g_ngot;
static CUmemoryPool g_pool;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void must(CUresult rc, const char *what) {
  if (rc != CUDA_SUCCESS) {
    printf("fail %s %d\n", what, (int)rc);
    fflush(stdout);
    exit(1);
  }
}

static CUresult alloc_route(const char *route, size_t bytes) {
  CUdeviceptr p = 0;
  CUresult rc;
  int kind = 0;
  CUmemGenericAllocationHandle h = 0;
  if (!strcmp(route, "alloc")) {
    rc = cuMemAlloc(&p, bytes);
  } else if (!strcmp(route, "managed")) {
    rc = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
  } else if (!strcmp(route, "pitch")) {
    size_t pitch = 0;
    rc = cuMemAllocPitch(&p, &pitch, 1 * MiB, bytes / MiB, 4);
  } else if (!strcmp(route, "async")) {
    rc = cuMemAllocAsync(&p, bytes, 0);
    if (rc == CUDA_SUCCESS)
      cuStreamSynchronize(0);
    kind = 1;
  } else if (!strcmp(route, "pool")) {
    rc = cuMemAllocFromPoolAsync(&p, bytes, g_pool, 0);
    if (rc == CUDA_SUCCESS)
      cuStreamSynchronize(0);
    kind = 1;
  } else if (!strcmp(route, "create")) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)g_dev;
    rc = cuMemCreate(&h, bytes, &prop, 0);
    kind = 2;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (rc == CUDA_SUCCESS && g_ngot < MAXB) {
    g_got[g_ngot] = p;
    g_got_h[g_ngot] = h;
    g_got_kind[g_ngot++] = kind;
  }
  return rc;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *dv = getenv("PEER_DEVICE");
  must(cuInit(0), "cuInit");
  must(cuDeviceGet(&g_dev, dv ? atoi(dv) : 0), "cuDeviceGet");
  CUcontext ctx;
  must(cuDevicePrimaryCtxRetain(&ctx, g_dev), "retain");
  must(cuCtxSetCurrent(ctx), "set");
  must(cuDeviceGetDefaultMemPool(&g_pool, g_dev), "pool");
  cuuint64_t keep = UINT64_MAX; /* the pool keeps what is freed into it, as a framework's pool does */
  must(cuMemPoolSetAttribute(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), "threshold");
  CUuuid u;
  must(cuDeviceGetUuid(&u, g_dev), "uuid");
  const unsigned char *x = (const unsigned char *)u.bytes;
  printf("ready %d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", (int)getpid(), x[0],
         x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    char cmd[32] = "", route[32] = "alloc";
    unsigned long n = 0;
    if (sscanf(line, "%31s %lu %31s", cmd, &n, route) < 1)
      continue;
    size_t bytes = (size_t)n * MiB;
    if (!strcmp(cmd, "cache")) {
      CUdeviceptr p;
      must(cuMemAllocAsync(&p, bytes, 0), "cache alloc");
      must(cuMemFreeAsync(p, 0), "cache free");
      must(cuStreamSynchronize(0), "sync");
      printf("cached\n");
    } else if (!strcmp(cmd, "orphan")) {
      uint64_t s = gpureclaim_scope_begin();
      CUdeviceptr p;
      must(cuMemAlloc(&p, bytes), "orphan alloc");
      gpureclaim_scope_end(s, 0);
      printf("orphaned\n");
    } else if (!strcmp(cmd, "live")) {
      CUdeviceptr p;
      must(cuMemAlloc(&p, bytes), "live alloc");
      must(cuMemsetD8(p, 0xA5, bytes), "memset");
      if (g_nlive < MAXB) {
        g_live[g_nlive] = p;
        g_live_n[g_nlive++] = bytes;
      }
      printf("live\n");
    } else if (!strcmp(cmd, "check")) {
      bool ok = true;
      for (size_t i = 0; i < g_nlive && ok; i++) {
        unsigned char *h = malloc(g_live_n[i]);
        ok = h && cuMemcpyDtoH(h, g_live[i], g_live_n[i]) == CUDA_SUCCESS;
        for (size_t k = 0; ok && k < g_live_n[i]; k += 4096)
          ok = h[k] == 0xA5 && h[g_live_n[i] - 1] == 0xA5;
        free(h);
      }
      printf("%s\n", ok ? "intact" : "corrupt");
    } else if (!strcmp(cmd, "alloc")) {
      double t0 = now_ms();
      CUresult rc = alloc_route(route, bytes);
      double ms = now_ms() - t0;
      if (rc == CUDA_SUCCESS)
        printf("ok %.3f\n", ms);
      else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
        printf("oom %.3f\n", ms);
      else
        printf("err %d %.3f\n", (int)rc, ms);
    } else if (!strcmp(cmd, "free")) {
      for (size_t i = 0; i < g_ngot; i++) {
        if (g_got_kind[i] == 2)
          cuMemRelease(g_got_h[i]);
        else if (g_got_kind[i] == 1)
          cuMemFreeAsync(g_got[i], 0);
        else
          cuMemFree(g_got[i]);
      }
      cuStreamSynchronize(0);
      g_ngot = 0;
      printf("freed\n");
    } else if (!strcmp(cmd, "stats")) {
      gpureclaim_stats_t s = {.size = sizeof s};
      gpureclaim_stats(-1, &s);
      printf("stats %llu %llu %llu %llu %llu %llu\n", (unsigned long long)s.peer_reclaims,
             (unsigned long long)s.peer_reclaim_successes, (unsigned long long)s.peer_received_bytes,
             (unsigned long long)s.peer_gives, (unsigned long long)s.peer_given_bytes,
             (unsigned long long)s.pool_reserved_bytes);
    } else if (!strcmp(cmd, "info")) {
      size_t fr = 0, tot = 0;
      cuMemGetInfo(&fr, &tot);
      printf("info %zu %zu\n", fr, tot);
    } else {
      printf("unknown %s\n", cmd);
    }
  }
  return 0;
}
