/* GPU acceptance: a C/C++ "inference binary" linked with -lgpureclaim (no preload).
 *
 *  1. scope: "model A" is loaded inside gpureclaim_scope_begin/end (cudaMalloc blocks and stream-ordered
 *     blocks); the scope ends with the blocks still live (abandoned); gpureclaim_release(GPURECLAIM_ORPHANED)
 *     frees them: cudaMemGetInfo free memory comes back to where it started (within 2 MiB). A block allocated
 *     outside the scope keeps its contents. A late cudaFree of a released pointer is swallowed and counted.
 *  2. all: "model B" is loaded without a scope; gpureclaim_release(GPURECLAIM_ALL) frees every tracked block:
 *     free memory comes back to where it started (within 2 MiB).
 *  3. pool: stream-ordered blocks freed into the default pool (release threshold UINT64_MAX) stay reserved;
 *     gpureclaim_release(GPURECLAIM_CACHED) trims the pool: free memory comes back (within 2 MiB).
 *  4. a third "model load" after all that works, and its memory holds what is written to it. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpureclaim.h>

#include "gpucheck.h"

#define CK(call)                                                                                                  \
  do {                                                                                                            \
    cudaError_t e_ = (call);                                                                                      \
    if (e_ != cudaSuccess) {                                                                                      \
      gt_result("cuda", 0, NULL, "%s failed: %s (%d) at line %d", #call, cudaGetErrorString(e_), (int)e_,         \
                __LINE__);                                                                                        \
      exit(1);                                                                                                    \
    }                                                                                                             \
  } while (0)

static const uint64_t TOL = 2ull << 20; /* 2 MiB */

static uint64_t free_mem(void) {
  size_t f = 0, t = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

static int64_t diff(uint64_t a, uint64_t b) { return (int64_t)(a - b); }

static gpureclaim_stats_t stats(void) {
  gpureclaim_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  int rc = gpureclaim_stats(-1, &s);
  if (rc != 0)
    fprintf(stderr, "gpureclaim_stats: %d\n", rc);
  return s;
}

static void report_json(char *buf, size_t n, const gpureclaim_report_t *r, int rc) {
  const gpureclaim_device_report_t *d = r->ndevices > 0 ? &r->devices[0] : NULL;
  snprintf(buf, n,
           "\"rc\": %d, \"seq\": %llu, \"what\": %u, \"trigger\": %d, \"cached_bytes\": %llu, \"pool_bytes\": %llu, "
           "\"orphaned_bytes\": %llu, \"orphaned_blocks\": %llu, \"all_bytes\": %llu, \"all_blocks\": %llu, "
           "\"failed_blocks\": %llu, \"duration_ms\": %.3f, \"ndevices\": %d, \"dev0_free_before\": %llu, "
           "\"dev0_free_after\": %llu",
           rc, (unsigned long long)r->seq, r->what, r->trigger, (unsigned long long)r->cached_bytes,
           (unsigned long long)r->pool_bytes, (unsigned long long)r->orphaned_bytes,
           (unsigned long long)r->orphaned_blocks, (unsigned long long)r->all_bytes,
           (unsigned long long)r->all_blocks, (unsigned long long)r->failed_blocks, r->duration_ns / 1e6,
           r->ndevices, d ? (unsigned long long)d->free_before : 0ull, d ? (unsigned long long)d->free_after : 0ull);
}

/* Allocates a "model": nbig blocks of big bytes and some small ones, plus nasync stream-ordered blocks. */
struct model {
  void *p[64];
  int n;
  void *a[16];
  int na;
  uint64_t bytes;
};

static void load_model(struct model *m, int nbig, size_t big, int nasync, size_t asz, cudaStream_t st) {
  static const size_t small[] = {4096, 65536, 1 << 20, (5 << 20) + 17};
  memset(m, 0, sizeof *m);
  for (int i = 0; i < nbig; i++) {
    CK(cudaMalloc(&m->p[m->n], big));
    CK(cudaMemset(m->p[m->n], 0x5a, big));
    m->n++;
    m->bytes += big;
  }
  for (int i = 0; i < 4; i++) {
    CK(cudaMalloc(&m->p[m->n], small[i]));
    m->n++;
    m->bytes += small[i];
  }
  for (int i = 0; i < nasync; i++) {
    CK(cudaMallocAsync(&m->a[m->na], asz, st));
    CK(cudaMemsetAsync(m->a[m->na], 0x33, asz, st));
    m->na++;
    m->bytes += asz;
  }
  CK(cudaStreamSynchronize(st));
}

int main(void) {
  char data[4096], rj[1024];
  if (!gpureclaim_enabled()) {
    gt_result("enabled", 0, NULL, "gpureclaim_enabled() == 0 in a program linked with -lgpureclaim");
    return 1;
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t thr = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));

  /* warm up the driver's own bookkeeping so that the baseline is stable */
  for (int i = 0; i < 3; i++) {
    void *w, *wa;
    CK(cudaMalloc(&w, 64 << 20));
    CK(cudaMallocAsync(&wa, 8 << 20, st));
    CK(cudaFreeAsync(wa, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(w));
  }
  CK(cudaMemPoolTrimTo(pool, 0));

  /* a block the program keeps using all along, outside every scope */
  const size_t keep_n = 1 << 20;
  unsigned char *keep;
  CK(cudaMalloc((void **)&keep, keep_n));
  CK(cudaMemset(keep, 0xc3, keep_n));

  uint64_t free0 = free_mem();
  gpureclaim_stats_t s0 = stats();

  /* ---- 1. scope ---- */
  struct model a;
  uint64_t scope = gpureclaim_scope_begin();
  load_model(&a, 12, 128u << 20, 4, 32u << 20, st); /* ~1.6 GiB + 128 MiB stream-ordered */
  uint64_t cur = gpureclaim_scope_current();
  int erc = gpureclaim_scope_end(scope, 0);
  gpureclaim_stats_t s1 = stats();
  uint64_t free1 = free_mem();
  uint64_t nblocks = (uint64_t)a.n + (uint64_t)a.na;
  uint64_t orph_b = s1.orphan_blocks - s0.orphan_blocks, orph_bytes = s1.orphan_bytes - s0.orphan_bytes;
  gpureclaim_report_t r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  int rc = gpureclaim_release(GPURECLAIM_ORPHANED, &r);
  uint64_t free2 = free_mem();
  report_json(rj, sizeof rj, &r, rc);
  /* the kept block still holds its bytes */
  static unsigned char host[1 << 20];
  CK(cudaMemcpy(host, keep, keep_n, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < keep_n; i++)
    bad += host[i] != 0xc3;
  snprintf(data, sizeof data,
           "{\"scope\": %llu, \"scope_current_inside\": %llu, \"scope_end_rc\": %d, \"model_blocks\": %llu, "
           "\"model_bytes\": %llu, \"orphan_blocks\": %llu, \"orphan_bytes\": %llu, \"free_start\": %llu, "
           "\"free_loaded\": %llu, \"free_after_release\": %llu, \"free_delta_vs_start\": %lld, "
           "\"kept_block_bad_bytes\": %zu, %s}",
           (unsigned long long)scope, (unsigned long long)cur, erc, (unsigned long long)nblocks,
           (unsigned long long)a.bytes, (unsigned long long)orph_b, (unsigned long long)orph_bytes,
           (unsigned long long)free0, (unsigned long long)free1, (unsigned long long)free2,
           (long long)diff(free2, free0), bad, rj);
  int ok1 = scope != 0 && cur == scope && erc == 0 && rc == 0 && orph_b == nblocks && orph_bytes == a.bytes &&
            r.orphaned_blocks == nblocks && r.orphaned_bytes == a.bytes && llabs(diff(free2, free0)) <= (long long)TOL &&
            bad == 0;
  gt_result("scope_orphaned", ok1, data,
            "model A %.1f MiB in %llu blocks (incl. %d stream-ordered) in scope %llu -> orphans %llu / %.1f MiB; "
            "release(ORPHANED) freed %llu blocks / %.1f MiB in %.2f ms; free memory %.1f -> %.1f -> %.1f MiB "
            "(%+lld bytes vs start, tolerance 2 MiB); kept block intact: %s",
            a.bytes / GT_MIB, (unsigned long long)nblocks, a.na, (unsigned long long)scope,
            (unsigned long long)orph_b, orph_bytes / GT_MIB, (unsigned long long)r.orphaned_blocks,
            r.orphaned_bytes / GT_MIB, r.duration_ns / 1e6, free0 / GT_MIB, free1 / GT_MIB, free2 / GT_MIB,
            (long long)diff(free2, free0), bad ? "NO" : "yes");

  /* late free of a released pointer: swallowed (address not handed out again yet) */
  gpureclaim_stats_t s2 = stats();
  cudaError_t lf = cudaFree(a.p[0]);
  gpureclaim_stats_t s3 = stats();
  snprintf(data, sizeof data, "{\"cudaFree\": %d, \"late_frees_delta\": %llu}", (int)lf,
           (unsigned long long)(s3.late_frees - s2.late_frees));
  gt_result("late_free", lf == cudaSuccess && s3.late_frees == s2.late_frees + 1, data,
            "cudaFree of a pointer the release freed returned %d (%s), late_frees +%llu", (int)lf,
            cudaGetErrorName(lf), (unsigned long long)(s3.late_frees - s2.late_frees));
  (void)cudaGetLastError();

  /* ---- 2. GPURECLAIM_ALL between two model loads ---- */
  CK(cudaFree(keep)); /* ALL frees every tracked block: start from nothing of ours */
  uint64_t free3 = free_mem();
  struct model b;
  load_model(&b, 10, 160u << 20, 0, 0, st); /* ~1.6 GiB, no scope */
  uint64_t free4 = free_mem();
  gpureclaim_stats_t s4 = stats();
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  rc = gpureclaim_release(GPURECLAIM_ALL, &r);
  uint64_t free5 = free_mem();
  gpureclaim_stats_t s5 = stats();
  report_json(rj, sizeof rj, &r, rc);
  snprintf(data, sizeof data,
           "{\"model_blocks\": %d, \"model_bytes\": %llu, \"live_blocks_loaded\": %llu, \"live_blocks_after\": %llu, "
           "\"free_start\": %llu, \"free_loaded\": %llu, \"free_after_release\": %llu, "
           "\"free_delta_vs_start\": %lld, %s}",
           b.n, (unsigned long long)b.bytes, (unsigned long long)s4.live_blocks, (unsigned long long)s5.live_blocks,
           (unsigned long long)free3, (unsigned long long)free4, (unsigned long long)free5,
           (long long)diff(free5, free3), rj);
  int ok2 = rc == 0 && r.all_blocks >= (uint64_t)b.n && r.all_bytes >= b.bytes && s5.live_blocks == 0 &&
            llabs(diff(free5, free3)) <= (long long)TOL;
  gt_result("release_all", ok2, data,
            "model B %.1f MiB in %d blocks; release(ALL) freed %llu blocks / %.1f MiB in %.2f ms; live_blocks "
            "%llu -> %llu; free memory %.1f -> %.1f -> %.1f MiB (%+lld bytes vs start, tolerance 2 MiB)",
            b.bytes / GT_MIB, b.n, (unsigned long long)r.all_blocks, r.all_bytes / GT_MIB, r.duration_ns / 1e6,
            (unsigned long long)s4.live_blocks, (unsigned long long)s5.live_blocks, free3 / GT_MIB, free4 / GT_MIB,
            free5 / GT_MIB, (long long)diff(free5, free3));

  /* ---- 3. a pool holding freed stream-ordered memory; release(CACHED) trims it ---- */
  uint64_t free6 = free_mem();
  void *pa[32];
  for (int i = 0; i < 32; i++)
    CK(cudaMallocAsync(&pa[i], 32u << 20, st));
  for (int i = 0; i < 32; i++)
    CK(cudaFreeAsync(pa[i], st));
  CK(cudaStreamSynchronize(st));
  uint64_t free7 = free_mem();
  size_t reserved = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
  uint64_t free8 = free_mem();
  size_t reserved2 = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved2));
  report_json(rj, sizeof rj, &r, rc);
  snprintf(data, sizeof data,
           "{\"pool_reserved_before\": %zu, \"pool_reserved_after\": %zu, \"free_start\": %llu, "
           "\"free_cached\": %llu, \"free_after_release\": %llu, \"free_delta_vs_start\": %lld, %s}",
           reserved, reserved2, (unsigned long long)free6, (unsigned long long)free7, (unsigned long long)free8,
           (long long)diff(free8, free6), rj);
  int ok3 = rc == 0 && reserved >= (32ull << 25) && reserved2 == 0 && r.pool_bytes >= reserved - TOL &&
            llabs(diff(free8, free6)) <= (long long)TOL;
  gt_result("release_cached_pool", ok3, data,
            "pool held %.1f MiB after 32 x 32 MiB freed; release(CACHED) gave back pool_bytes %.1f MiB in %.2f ms; "
            "pool reserved now %zu; free memory %.1f -> %.1f -> %.1f MiB (%+lld bytes vs start)",
            reserved / GT_MIB, r.pool_bytes / GT_MIB, r.duration_ns / 1e6, reserved2, free6 / GT_MIB,
            free7 / GT_MIB, free8 / GT_MIB, (long long)diff(free8, free6));

  /* ---- 4. the next model load works and holds its data ---- */
  struct model c;
  load_model(&c, 4, 64u << 20, 2, 16u << 20, st);
  static unsigned char h2[1 << 20];
  CK(cudaMemcpy(h2, c.p[0], sizeof h2, cudaMemcpyDeviceToHost));
  size_t bad2 = 0;
  for (size_t i = 0; i < sizeof h2; i++)
    bad2 += h2[i] != 0x5a;
  for (int i = 0; i < c.n; i++)
    CK(cudaFree(c.p[i]));
  for (int i = 0; i < c.na; i++)
    CK(cudaFreeAsync(c.a[i], st));
  CK(cudaStreamSynchronize(st));
  gpureclaim_stats_t s6 = stats();
  snprintf(data, sizeof data, "{\"bad_bytes\": %zu, \"live_blocks_end\": %llu, \"untracked_routes\": %llu, "
                              "\"untracked_frees\": %llu, \"releases\": %llu}",
           bad2, (unsigned long long)s6.live_blocks, (unsigned long long)s6.untracked_routes,
           (unsigned long long)s6.untracked_frees, (unsigned long long)s6.releases);
  gt_result("reload", bad2 == 0 && s6.live_blocks == 0 && s6.untracked_routes == 0, data,
            "model C loaded after the releases: data intact %s, live_blocks at the end %llu, untracked_routes %llu, "
            "untracked_frees %llu, releases %llu",
            bad2 ? "NO" : "yes", (unsigned long long)s6.live_blocks, (unsigned long long)s6.untracked_routes,
            (unsigned long long)s6.untracked_frees, (unsigned long long)s6.releases);
  CK(cudaStreamDestroy(st));
  return gt_failed ? 1 : 0;
}
