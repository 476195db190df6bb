/*
 * sim_holder.c -- a second process on the simulated machine, driven line by line by test_sim_machine.c.
 *
 * It reads one command per line on stdin and answers one line on stdout:
 *   init                 cuInit(0)                                          -> "ok" | "err CODE"
 *   count                cuDeviceGetCount                                   -> "N"
 *   uuid D               the UUID of ordinal D as nvidia-smi writes it       -> "GPU-..."
 *   info D               cuMemGetInfo in D's primary context                 -> "FREE TOTAL"
 *   alloc D N            cuMemAlloc of N bytes on D (kept)                   -> "ok" | "err CODE"
 *   free                 cuMemFree of the most recent alloc still held       -> "ok" | "err CODE"
 *   pool D N             N bytes cached in D's default pool: release threshold UINT64_MAX, cuMemAllocAsync,
 *                        cuMemFreeAsync, cuStreamSynchronize                 -> "ok" | "err CODE"
 *   trim D               cuMemPoolTrimTo(D's default pool, 0)                -> "ok" | "err CODE"
 *   vmm D N              cuMemCreate of N bytes on D (kept)                  -> "ok" | "err CODE"
 *   unvmm                cuMemRelease of the most recent handle still held   -> "ok" | "err CODE"
 *   exec                 execs itself (same pid, stdin and stdout): the new program answers "ok" when it starts
 *   exit / quit          exit(0) (the normal end: the driver state goes with it) / _exit(0)
 * End of input ends it with exit(0).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static CUdeviceptr g_ptr[256];
static int g_nptr;
static CUmemGenericAllocationHandle g_h[256];
static int g_nh;

static CUresult make_current(int d) {
  CUdevice dev;
  CUcontext c;
  CUresult r = cuDeviceGet(&dev, d);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&c, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(c);
  return r;
}

static void answer(CUresult r) {
  if (r == CUDA_SUCCESS) printf("ok\n");
  else printf("err %d\n", (int)r);
}

int main(int argc, char **argv) {
  char line[256];
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && !strcmp(argv[1], "--execd")) printf("ok\n"); /* nothing was read ahead: the test waits for it */
  while (fgets(line, sizeof line, stdin)) {
    char cmd[32] = "";
    int d = 0;
    unsigned long long n = 0;
    int k = sscanf(line, "%31s %d %llu", cmd, &d, &n);
    if (k < 1) continue;
    CUresult r = CUDA_SUCCESS;
    if (!strcmp(cmd, "init")) {
      answer(cuInit(0));
    } else if (!strcmp(cmd, "count")) {
      int c = -1;
      r = cuDeviceGetCount(&c);
      if (r) answer(r);
      else printf("%d\n", c);
    } else if (!strcmp(cmd, "uuid")) {
      CUdevice dev;
      CUuuid u;
      r = cuDeviceGet(&dev, d);
      if (!r) r = cuDeviceGetUuid(&u, dev);
      if (r) {
        answer(r);
        continue;
      }
      unsigned char *x = (unsigned char *)u.bytes;
      printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", x[0], x[1], x[2], x[3], x[4],
             x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
    } else if (!strcmp(cmd, "info")) {
      size_t fr = 0, tot = 0;
      r = make_current(d);
      if (!r) r = cuMemGetInfo(&fr, &tot);
      if (r) answer(r);
      else printf("%zu %zu\n", fr, tot);
    } else if (!strcmp(cmd, "alloc")) {
      CUdeviceptr p = 0;
      r = make_current(d);
      if (!r) r = cuMemAlloc(&p, (size_t)n);
      if (!r && g_nptr < 256) g_ptr[g_nptr++] = p;
      answer(r);
    } else if (!strcmp(cmd, "free")) {
      answer(g_nptr ? cuMemFree(g_ptr[--g_nptr]) : CUDA_ERROR_INVALID_VALUE);
    } else if (!strcmp(cmd, "pool") || !strcmp(cmd, "trim")) {
      CUdevice dev;
      CUmemoryPool pool;
      r = make_current(d);
      if (!r) r = cuDeviceGet(&dev, d);
      if (!r) r = cuDeviceGetDefaultMemPool(&pool, dev);
      if (!r && cmd[0] == 't') {
        answer(cuMemPoolTrimTo(pool, 0));
        continue;
      }
      cuuint64_t keep = UINT64_MAX;
      CUdeviceptr p = 0;
      if (!r) r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
      if (!r) r = cuMemAllocAsync(&p, (size_t)n, NULL);
      if (!r) r = cuMemFreeAsync(p, NULL);
      if (!r) r = cuStreamSynchronize(NULL);
      answer(r);
    } else if (!strcmp(cmd, "vmm")) {
      CUmemAllocationProp prop;
      memset(&prop, 0, sizeof prop);
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = d;
      CUmemGenericAllocationHandle h = 0;
      r = cuMemCreate(&h, (size_t)n, &prop, 0);
      if (!r && g_nh < 256) g_h[g_nh++] = h;
      answer(r);
    } else if (!strcmp(cmd, "unvmm")) {
      answer(g_nh ? cuMemRelease(g_h[--g_nh]) : CUDA_ERROR_INVALID_VALUE);
    } else if (!strcmp(cmd, "exec")) {
      execl("/proc/self/exe", "sim_holder", "--execd", (char *)NULL);
      printf("err exec\n");
    } else if (!strcmp(cmd, "exit")) {
      exit(0);
    } else if (!strcmp(cmd, "quit")) {
      _exit(0);
    } else {
      printf("unknown %s\n", cmd);
    }
  }
  return 0;
}
