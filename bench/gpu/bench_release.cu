/* GPU benchmark: what a release costs against cudaFree of the same blocks, in one run.
 *
 *   bench_release [OUT.json] [ROUNDS]        linked with -lgpureclaim
 *
 * Each round, with N = 10,000 blocks of 1 MiB:
 *   cudafree   cudaMalloc N blocks, then time cudaFree of all N                                (the baseline)
 *   tableorder the same, freed in the order gpureclaim_foreach_block visits them (the order a release frees
 *              in): shows how much of a release's cost is the driver's, for that order
 *   addrorder  the same, freed in ascending address order (an order a release could sort its batch into)
 *   orphaned   cudaMalloc N blocks inside a scope that then ends, time gpureclaim_release(GPURECLAIM_ORPHANED)
 *   cached     cudaMallocAsync N blocks into the default pool (release threshold UINT64_MAX), cudaFreeAsync them
 *              all and synchronize, then time gpureclaim_release(GPURECLAIM_CACHED)
 *   trim       the same fill, then time cudaStreamSynchronize + cudaMemPoolTrimTo(pool, 0) directly
 * Medians over rounds (the first three rotate their order each round); ratios orphaned/cudafree and
 * cached/cudafree (target <= 1.1), orphaned/tableorder, cached/trim. Every
 * release's report is checked (blocks and bytes given back) and free memory must come back. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gpureclaim.h>

#include "../../tests/gpu/gpucheck.h"

#define N 10000
#define BLK (1u << 20)
#define MAXR 9

#define CK(call)                                                                                                  \
  do {                                                                                                            \
    cudaError_t e_ = (call);                                                                                      \
    if (e_ != cudaSuccess) {                                                                                      \
      gt_result("cuda", 0, NULL, "%s failed: %s at line %d", #call, cudaGetErrorString(e_), __LINE__);            \
      exit(1);                                                                                                    \
    }                                                                                                             \
  } while (0)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v0, int n) {
  double v[MAXR];
  memcpy(v, v0, sizeof(double) * (size_t)n);
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t free_mem(void) {
  size_t f = 0, t = 0;
  CK(cudaMemGetInfo(&f, &t));
  return f;
}

static void *ptr[N], *sorted_ptr[N], *tbl[N];

static int cmp_p(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}
static void sort_ptrs(void) {
  memcpy(sorted_ptr, ptr, sizeof ptr);
  qsort(sorted_ptr, N, sizeof *sorted_ptr, cmp_p);
}
struct order {
  int n;
};
/* Records, in the order the table visits them, the blocks of ptr[] (looked up in sorted_ptr). */
static int order_cb(const gpureclaim_block_t *b, void *arg) {
  struct order *o = (struct order *)arg;
  void *key = (void *)(uintptr_t)b->address;
  if (b->kind == GPURECLAIM_KIND_DEVICE && o->n < N && bsearch(&key, sorted_ptr, N, sizeof *sorted_ptr, cmp_p))
    tbl[o->n++] = key;
  return 0;
}

int main(int argc, char **argv) {
  const char *out = argc > 1 ? argv[1] : "bench_release.json";
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1)
    rounds = 1;
  if (rounds > MAXR)
    rounds = MAXR;
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t thr = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));

  double t_free[MAXR], t_tfree[MAXR], t_sfree[MAXR], t_orph[MAXR], t_cached[MAXR], t_trim[MAXR];
  int bad_reports = 0;
  uint64_t worst_free_gap = 0;
  gpureclaim_report_t r;
  for (int k = 0; k < rounds; k++) {
    uint64_t f0 = free_mem();
    uint64_t t0;
    int rc = 0;
    /* cudaFree in allocation order (the baseline), in the order gpureclaim's table visits the blocks, in address
     * order, and the release of orphans: the order rotates from round to round so that drift favours none */
    for (int j = 0; j < 4; j++) {
      int which = (j + k) % 4;
      if (which == 0) {
        for (int i = 0; i < N; i++)
          CK(cudaMalloc(&ptr[i], BLK));
        t0 = now_ns();
        for (int i = 0; i < N; i++)
          CK(cudaFree(ptr[i]));
        t_free[k] = (double)(now_ns() - t0);
      } else if (which == 1) {
        for (int i = 0; i < N; i++)
          CK(cudaMalloc(&ptr[i], BLK));
        struct order o = {0};
        sort_ptrs();
        gpureclaim_foreach_block(order_cb, &o);
        if (o.n != N) {
          fprintf(stderr, "round %d: gpureclaim_foreach_block found %d of the %d blocks\n", k, o.n, N);
          bad_reports++;
          for (int i = 0; i < N; i++)
            tbl[i] = ptr[i]; /* fall back to allocation order */
        }
        t0 = now_ns();
        for (int i = 0; i < N; i++)
          CK(cudaFree(tbl[i]));
        t_tfree[k] = (double)(now_ns() - t0);
      } else if (which == 3) {
        for (int i = 0; i < N; i++)
          CK(cudaMalloc(&ptr[i], BLK));
        sort_ptrs();
        t0 = now_ns();
        for (int i = 0; i < N; i++)
          CK(cudaFree(sorted_ptr[i]));
        t_sfree[k] = (double)(now_ns() - t0);
      } else {
        /* orphans of an ended scope */
        uint64_t s = gpureclaim_scope_begin();
        for (int i = 0; i < N; i++)
          CK(cudaMalloc(&ptr[i], BLK));
        gpureclaim_scope_end(s, 0);
        memset(&r, 0, sizeof r);
        r.size = sizeof r;
        t0 = now_ns();
        rc = gpureclaim_release(GPURECLAIM_ORPHANED, &r);
        t_orph[k] = (double)(now_ns() - t0);
      }
    }
    if (rc != 0 || r.orphaned_blocks != N || r.orphaned_bytes != (uint64_t)N * BLK) {
      bad_reports++;
      fprintf(stderr, "round %d: release(ORPHANED) rc %d, %llu blocks, %llu bytes\n", k, rc,
              (unsigned long long)r.orphaned_blocks, (unsigned long long)r.orphaned_bytes);
    }
    uint64_t f1 = free_mem();
    uint64_t gap = f0 > f1 ? f0 - f1 : f1 - f0;
    if (gap > worst_free_gap)
      worst_free_gap = gap;

    /* pool: cached stream-ordered memory, released by gpureclaim */
    for (int i = 0; i < N; i++)
      CK(cudaMallocAsync(&ptr[i], BLK, st));
    for (int i = 0; i < N; i++)
      CK(cudaFreeAsync(ptr[i], st));
    CK(cudaStreamSynchronize(st));
    size_t reserved = 0;
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    memset(&r, 0, sizeof r);
    r.size = sizeof r;
    t0 = now_ns();
    rc = gpureclaim_release(GPURECLAIM_CACHED, &r);
    t_cached[k] = (double)(now_ns() - t0);
    size_t reserved2 = 1;
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved2));
    if (rc != 0 || reserved < (size_t)N * BLK || reserved2 != 0 || r.pool_bytes + (2u << 20) < reserved) {
      bad_reports++;
      fprintf(stderr, "round %d: release(CACHED) rc %d, pool reserved %zu -> %zu, pool_bytes %llu\n", k, rc,
              reserved, reserved2, (unsigned long long)r.pool_bytes);
    }
    uint64_t f2 = free_mem();
    gap = f0 > f2 ? f0 - f2 : f2 - f0;
    if (gap > worst_free_gap)
      worst_free_gap = gap;

    /* pool: the same trimmed directly */
    for (int i = 0; i < N; i++)
      CK(cudaMallocAsync(&ptr[i], BLK, st));
    for (int i = 0; i < N; i++)
      CK(cudaFreeAsync(ptr[i], st));
    CK(cudaStreamSynchronize(st));
    t0 = now_ns();
    CK(cudaStreamSynchronize(st));
    CK(cudaMemPoolTrimTo(pool, 0));
    t_trim[k] = (double)(now_ns() - t0);
    fprintf(stderr,
            "round %d: cudaFree %.2f ms, in table order %.2f ms, in address order %.2f ms, release(ORPHANED) "
            "%.2f ms, release(CACHED) %.2f ms, trim %.2f ms\n",
            k, t_free[k] / 1e6, t_tfree[k] / 1e6, t_sfree[k] / 1e6, t_orph[k] / 1e6, t_cached[k] / 1e6,
            t_trim[k] / 1e6);
  }
  double mf = median(t_free, rounds), mtf = median(t_tfree, rounds), msf = median(t_sfree, rounds),
         mo = median(t_orph, rounds),
         mc = median(t_cached, rounds), mt = median(t_trim, rounds);
  double ro = mo / mf, rot = mtf > 0 ? mo / mtf : 0, rtf = mtf / mf, rcf = mc / mf, rct = mt > 0 ? mc / mt : 0;
  char txt[4096];
  snprintf(txt, sizeof txt, "%s", out);
  char *dot = strrchr(txt, '.');
  if (dot && !strcmp(dot, ".json"))
    strcpy(dot, ".txt");
  else
    strncat(txt, ".txt", sizeof txt - strlen(txt) - 1);
  char body[2048];
  snprintf(body, sizeof body,
           "releasing %d x 1 MiB blocks, median of %d rounds (one run)\n"
           "  cudaFree of all blocks (baseline)           %10.2f ms\n"
           "  cudaFree in the table's visiting order      %10.2f ms   ratio %.3f  (what the order alone costs)\n"
           "  cudaFree in ascending address order         %10.2f ms   ratio %.3f\n"
           "  gpureclaim_release(ORPHANED), ended scope   %10.2f ms   ratio %.3f  (target <= 1.1); vs table order %.3f\n"
           "  gpureclaim_release(CACHED), pool of frees   %10.2f ms   ratio %.3f  (target <= 1.1)\n"
           "  cudaMemPoolTrimTo of the same pool          %10.2f ms   release(CACHED)/trim %.3f\n"
           "  worst free-memory gap after a release: %llu bytes; bad reports: %d\n",
           N, rounds, mf / 1e6, mtf / 1e6, rtf, msf / 1e6, msf / mf, mo / 1e6, ro, rot, mc / 1e6, rcf, mt / 1e6, rct,
           (unsigned long long)worst_free_gap, bad_reports);
  fputs(body, stdout);
  FILE *ft = fopen(txt, "w");
  if (ft) {
    fputs(body, ft);
    fclose(ft);
  }
  enum { NS = 6 };
  char runs[NS][256];
  const double *series[NS] = {t_free, t_tfree, t_sfree, t_orph, t_cached, t_trim};
  for (int q = 0; q < NS; q++) {
    size_t o = 0;
    runs[q][0] = 0;
    for (int k = 0; k < rounds && o < sizeof runs[q]; k++)
      o += (size_t)snprintf(runs[q] + o, sizeof runs[q] - o, "%s%.3f", k ? ", " : "", series[q][k] / 1e6);
  }
  char data[3072];
  snprintf(data, sizeof data,
           "{\"blocks\": %d, \"block_bytes\": %u, \"rounds\": %d, \"cudafree_ms\": %.3f, "
           "\"cudafree_table_order_ms\": %.3f, \"cudafree_address_order_ms\": %.3f, \"release_orphaned_ms\": %.3f, \"release_cached_ms\": %.3f, "
           "\"pool_trim_ms\": %.3f, \"ratio_orphaned_vs_cudafree\": %.4f, "
           "\"ratio_orphaned_vs_cudafree_table_order\": %.4f, \"ratio_table_order_vs_cudafree\": %.4f, "
           "\"ratio_cached_vs_cudafree\": %.4f, \"ratio_cached_vs_trim\": %.4f, \"worst_free_gap_bytes\": %llu, "
           "\"bad_reports\": %d, \"runs_ms\": {\"cudafree\": [%s], \"cudafree_table_order\": [%s], "
           "\"cudafree_address_order\": [%s], \"orphaned\": [%s], \"cached\": [%s], \"trim\": [%s]}}",
           N, BLK, rounds, mf / 1e6, mtf / 1e6, msf / 1e6, mo / 1e6, mc / 1e6, mt / 1e6, ro, rot, rtf, rcf, rct,
           (unsigned long long)worst_free_gap, bad_reports, runs[0], runs[1], runs[2], runs[3], runs[4], runs[5]);
  FILE *fj = fopen(out, "w");
  if (fj) {
    fprintf(fj, "%s\n", data);
    fclose(fj);
  }
  gt_result("orphaned_vs_cudafree", ro <= 1.1 && bad_reports == 0, data,
            "release(ORPHANED) of %d x 1 MiB: %.2f ms vs cudaFree %.2f ms: ratio %.3f (target <= 1.1); cudaFree "
            "of the same blocks in the table's visiting order %.2f ms (release / that %.3f), in address order "
            "%.2f ms",
            N, mo / 1e6, mf / 1e6, ro, mtf / 1e6, rot, msf / 1e6);
  gt_result("cached_vs_cudafree", rcf <= 1.1 && bad_reports == 0, data,
            "release(CACHED) of a pool holding %d x 1 MiB freed blocks: %.2f ms vs cudaFree %.2f ms: ratio %.3f "
            "(target <= 1.1); direct cudaMemPoolTrimTo %.2f ms",
            N, mc / 1e6, mf / 1e6, rcf, mt / 1e6);
  gt_result("memory_back", worst_free_gap <= (2u << 20) && bad_reports == 0, data,
            "after every release free memory within %llu bytes of the start (tolerance 2 MiB); %d bad reports",
            (unsigned long long)worst_free_gap, bad_reports);
  CK(cudaStreamDestroy(st));
  return gt_failed ? 1 : 0;
}
