/* GPU acceptance: exact counts for an nvcc-built program under LD_PRELOAD=libgpureclaim.so.
 *
 * Built twice by run.sh: with the static cudart (nvcc's default) and with -cudart shared. Both reach the
 * driver only through cuGetProcAddress. The program allocates N blocks with cudaMalloc (and a few of every
 * other runtime kind), checks that gpureclaim's live_blocks / live_bytes / total_allocs moved by exactly what
 * it allocated, prints each block's api / library / owner, frees everything and checks the counts come back,
 * and that untracked_routes and untracked_frees stayed 0.
 *
 * gpureclaim is reached with dlsym(RTLD_DEFAULT, ...) so the binary does not link it. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpureclaim.h>

#include "gpucheck.h"

typedef int (*stats_fn_t)(int, gpureclaim_stats_t *);
typedef int (*foreach_fn_t)(int (*)(const gpureclaim_block_t *, void *), void *);

static stats_fn_t p_stats;
static foreach_fn_t p_foreach;

#define NDEV 64

struct want {
  uint64_t addr, bytes;
  int kind;
  int found;
  uint64_t got_bytes;
  char api[48], library[128], owner[24];
};

static struct want wants[256];
static int nwants;

static int collect_cb(const gpureclaim_block_t *b, void *arg) {
  (void)arg;
  for (int i = 0; i < nwants; i++) {
    if (wants[i].addr == b->address && wants[i].kind == b->kind) {
      wants[i].found++;
      wants[i].got_bytes = b->bytes;
      snprintf(wants[i].api, sizeof wants[i].api, "%s", b->api ? b->api : "(null)");
      snprintf(wants[i].library, sizeof wants[i].library, "%s", b->library ? b->library : "(null)");
      snprintf(wants[i].owner, sizeof wants[i].owner, "%s", b->owner ? b->owner : "(null)");
    }
  }
  return 0;
}

static gpureclaim_stats_t get_stats(int dev) {
  gpureclaim_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  int rc = p_stats(dev, &s);
  if (rc != 0) {
    fprintf(stderr, "gpureclaim_stats(%d) = %d\n", dev, rc);
  }
  return s;
}

static void add_want(uint64_t addr, uint64_t bytes, int kind) {
  wants[nwants].addr = addr;
  wants[nwants].bytes = bytes;
  wants[nwants].kind = kind;
  wants[nwants].found = 0;
  nwants++;
}

#define CK(call)                                                                                                  \
  do {                                                                                                            \
    cudaError_t e_ = (call);                                                                                      \
    if (e_ != cudaSuccess) {                                                                                      \
      gt_result("cuda", 0, NULL, "%s failed: %s (%d) at line %d", #call, cudaGetErrorString(e_), (int)e_,         \
                __LINE__);                                                                                        \
      exit(1);                                                                                                    \
    }                                                                                                             \
  } while (0)

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "?";
  char data[8192];
  p_stats = (stats_fn_t)dlsym(RTLD_DEFAULT, "gpureclaim_stats");
  p_foreach = (foreach_fn_t)dlsym(RTLD_DEFAULT, "gpureclaim_foreach_block");
  if (!p_stats || !p_foreach) {
    gt_result("loaded", 0, NULL, "gpureclaim symbols not found (LD_PRELOAD=%s)",
              getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "unset");
    return 1;
  }
  int rtver = 0, drver = 0;
  cudaRuntimeGetVersion(&rtver);
  cudaDriverGetVersion(&drver);
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* creates the primary context */

  gpureclaim_stats_t s0 = get_stats(-1);

  /* ---- N cudaMalloc of assorted sizes ---- */
  enum { N = 48 };
  static const size_t base_sizes[] = {1, 512, 4097, 65536, 1 << 20, (3 << 20) + 5, 20 << 20, 64 << 20};
  void *ptrs[N];
  uint64_t sum = 0;
  for (int i = 0; i < N; i++) {
    size_t sz = base_sizes[i % 8] + (size_t)(i / 8) * 4096;
    CK(cudaMalloc(&ptrs[i], sz));
    add_want((uint64_t)(uintptr_t)ptrs[i], sz, GPURECLAIM_KIND_DEVICE);
    sum += sz;
  }
  gpureclaim_stats_t s1 = get_stats(-1);
  uint64_t db = s1.live_blocks - s0.live_blocks, dbytes = s1.live_bytes - s0.live_bytes;
  uint64_t dallocs = s1.total_allocs - s0.total_allocs;
  snprintf(data, sizeof data,
           "{\"cudart\": \"%s\", \"runtime_version\": %d, \"driver_version\": %d, \"n\": %d, \"bytes\": %llu, "
           "\"live_blocks_delta\": %llu, \"live_bytes_delta\": %llu, \"total_allocs_delta\": %llu}",
           label, rtver, drver, N, (unsigned long long)sum, (unsigned long long)db, (unsigned long long)dbytes,
           (unsigned long long)dallocs);
  gt_result("cudaMalloc_count", db == N && dbytes == sum && dallocs == N, data,
            "%s cudart: %d cudaMalloc of %llu bytes -> live_blocks +%llu, live_bytes +%llu, total_allocs +%llu",
            label, N, (unsigned long long)sum, (unsigned long long)db, (unsigned long long)dbytes,
            (unsigned long long)dallocs);

  /* ---- the other runtime kinds ---- */
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  void *managed[3], *pitched[2], *async[4], *host[2];
  size_t pitch[2];
  uint64_t kind_bytes = 0, kinds_n = 0;
  for (int i = 0; i < 3; i++) {
    size_t sz = (size_t)(i + 1) * (1 << 20) + 123;
    CK(cudaMallocManaged(&managed[i], sz, cudaMemAttachGlobal));
    add_want((uint64_t)(uintptr_t)managed[i], sz, GPURECLAIM_KIND_MANAGED);
    kind_bytes += sz;
    kinds_n++;
  }
  for (int i = 0; i < 2; i++) {
    size_t w = 1000 + (size_t)i * 333, h = 77 + (size_t)i;
    CK(cudaMallocPitch(&pitched[i], &pitch[i], w, h));
    add_want((uint64_t)(uintptr_t)pitched[i], (uint64_t)pitch[i] * h, GPURECLAIM_KIND_PITCH);
    kind_bytes += (uint64_t)pitch[i] * h;
    kinds_n++;
  }
  for (int i = 0; i < 4; i++) {
    size_t sz = (size_t)(i + 1) * (2 << 20) + 4096;
    CK(cudaMallocAsync(&async[i], sz, st));
    add_want((uint64_t)(uintptr_t)async[i], sz, GPURECLAIM_KIND_ASYNC);
    kind_bytes += sz;
    kinds_n++;
  }
  CK(cudaStreamSynchronize(st));
  uint64_t host_bytes = 0;
  for (int i = 0; i < 2; i++) {
    size_t sz = (size_t)(i + 1) * (1 << 20);
    CK(cudaMallocHost(&host[i], sz));
    add_want((uint64_t)(uintptr_t)host[i], sz, GPURECLAIM_KIND_HOST);
    host_bytes += sz;
  }
  gpureclaim_stats_t s2 = get_stats(-1);
  uint64_t kb = s2.live_blocks - s1.live_blocks, kbytes = s2.live_bytes - s1.live_bytes;
  uint64_t hb = s2.host_pinned_blocks - s1.host_pinned_blocks, hbytes = s2.host_pinned_bytes - s1.host_pinned_bytes;
  snprintf(data, sizeof data,
           "{\"device_kinds_blocks\": %llu, \"device_kinds_bytes\": %llu, \"live_blocks_delta\": %llu, "
           "\"live_bytes_delta\": %llu, \"host_blocks\": 2, \"host_bytes\": %llu, \"host_pinned_blocks_delta\": %llu, "
           "\"host_pinned_bytes_delta\": %llu, \"pool_reserved_bytes\": %llu, \"pool_used_bytes\": %llu}",
           (unsigned long long)kinds_n, (unsigned long long)kind_bytes, (unsigned long long)kb,
           (unsigned long long)kbytes, (unsigned long long)host_bytes, (unsigned long long)hb,
           (unsigned long long)hbytes, (unsigned long long)s2.pool_reserved_bytes,
           (unsigned long long)s2.pool_used_bytes);
  gt_result("other_kinds_count", kb == kinds_n && kbytes == kind_bytes && hb == 2 && hbytes == host_bytes, data,
            "managed x3 + pitch x2 + async x4 = %llu blocks / %llu bytes -> live +%llu / +%llu; pinned host x2 "
            "%llu bytes -> +%llu / +%llu",
            (unsigned long long)kinds_n, (unsigned long long)kind_bytes, (unsigned long long)kb,
            (unsigned long long)kbytes, (unsigned long long)host_bytes, (unsigned long long)hb,
            (unsigned long long)hbytes);

  /* ---- every block seen once, with its size; attribution ---- */
  p_foreach(collect_cb, NULL);
  int missing = 0, dup = 0, badsize = 0;
  for (int i = 0; i < nwants; i++) {
    if (wants[i].found == 0)
      missing++;
    else if (wants[i].found > 1)
      dup++;
    else if (wants[i].got_bytes != wants[i].bytes)
      badsize++;
  }
  /* attribution summary: distinct (kind, api, library, owner) */
  char attr[4096];
  size_t off = 0;
  attr[0] = 0;
  for (int i = 0; i < nwants; i++) {
    int seen = 0;
    for (int j = 0; j < i; j++)
      if (wants[j].kind == wants[i].kind && !strcmp(wants[j].api, wants[i].api) &&
          !strcmp(wants[j].library, wants[i].library) && !strcmp(wants[j].owner, wants[i].owner))
        seen = 1;
    if (seen || !wants[i].found)
      continue;
    off += (size_t)snprintf(attr + off, sizeof attr - off, "%skind %d: api=%s library=%s owner=%s",
                            off ? "; " : "", wants[i].kind, wants[i].api, wants[i].library, wants[i].owner);
    if (off >= sizeof attr)
      break;
  }
  printf("  attribution (%s cudart): %s\n", label, attr);
  int first_api_ok = wants[0].found && (strstr(wants[0].api, "cudaMalloc") || strstr(wants[0].api, "cuMemAlloc"));
  {
    char *p = data;
    p += snprintf(p, sizeof data, "{\"blocks\": %d, \"missing\": %d, \"duplicates\": %d, \"wrong_size\": %d, "
                                  "\"attribution\": ",
                  nwants, missing, dup, badsize);
    FILE *mf = fmemopen(p, sizeof data - (size_t)(p - data) - 2, "w");
    if (mf) {
      gt_json_str(mf, attr);
      fclose(mf);
    }
    strcat(data, "}");
  }
  gt_result("blocks_attribution", missing == 0 && dup == 0 && badsize == 0 && first_api_ok, data,
            "%d blocks: %d missing, %d seen twice, %d with a wrong size; %s", nwants, missing, dup, badsize, attr);

  /* ---- free everything ---- */
  for (int i = 0; i < N; i++)
    CK(cudaFree(ptrs[i]));
  for (int i = 0; i < 3; i++)
    CK(cudaFree(managed[i]));
  for (int i = 0; i < 2; i++)
    CK(cudaFree(pitched[i]));
  for (int i = 0; i < 4; i++)
    CK(cudaFreeAsync(async[i], st));
  CK(cudaStreamSynchronize(st));
  for (int i = 0; i < 2; i++)
    CK(cudaFreeHost(host[i]));
  gpureclaim_stats_t s3 = get_stats(-1);
  uint64_t nfree = (uint64_t)N + kinds_n + 2;
  uint64_t dfrees = s3.total_frees - s2.total_frees;
  snprintf(data, sizeof data,
           "{\"live_blocks_before\": %llu, \"live_blocks_after\": %llu, \"live_bytes_before\": %llu, "
           "\"live_bytes_after\": %llu, \"host_pinned_bytes_after\": %llu, \"frees\": %llu, "
           "\"total_frees_delta\": %llu}",
           (unsigned long long)s0.live_blocks, (unsigned long long)s3.live_blocks,
           (unsigned long long)s0.live_bytes, (unsigned long long)s3.live_bytes,
           (unsigned long long)s3.host_pinned_bytes, (unsigned long long)nfree, (unsigned long long)dfrees);
  gt_result("free_count",
            s3.live_blocks == s0.live_blocks && s3.live_bytes == s0.live_bytes &&
                s3.host_pinned_bytes == s0.host_pinned_bytes && s3.host_pinned_blocks == s0.host_pinned_blocks &&
                dfrees == nfree,
            data, "after %llu frees: live_blocks %llu (start %llu), live_bytes %llu (start %llu), total_frees +%llu",
            (unsigned long long)nfree, (unsigned long long)s3.live_blocks, (unsigned long long)s0.live_blocks,
            (unsigned long long)s3.live_bytes, (unsigned long long)s0.live_bytes, (unsigned long long)dfrees);

  snprintf(data, sizeof data,
           "{\"untracked_routes\": %llu, \"untracked_frees\": %llu, \"contexts\": %llu, \"pools\": %llu, "
           "\"table_bytes\": %llu}",
           (unsigned long long)s3.untracked_routes, (unsigned long long)(s3.untracked_frees - s0.untracked_frees),
           (unsigned long long)s3.contexts, (unsigned long long)s3.pools, (unsigned long long)s3.table_bytes);
  gt_result("routes", s3.untracked_routes == 0 && s3.untracked_frees == s0.untracked_frees, data,
            "untracked_routes %llu, untracked_frees during the test %llu (contexts %llu, pools %llu)",
            (unsigned long long)s3.untracked_routes, (unsigned long long)(s3.untracked_frees - s0.untracked_frees),
            (unsigned long long)s3.contexts, (unsigned long long)s3.pools);
  CK(cudaStreamDestroy(st));
  return gt_failed ? 1 : 0;
}
