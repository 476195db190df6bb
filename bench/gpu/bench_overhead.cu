/* GPU benchmark: what gpureclaim adds to real allocation calls.
 *
 *   bench_overhead LIBGPURECLAIM [OUT.json]          driver: runs itself as children, prints and writes figures
 *   bench_overhead --child                           one measurement run (LD_PRELOAD decides with or without)
 *
 * The driver runs the same binary as child processes, alternately without and with
 * LD_PRELOAD=LIBGPURECLAIM (ROUNDS times each), and for every figure reports the median over rounds of each
 * child's median, the nanoseconds added and the ratio. Figures:
 *   malloc_free_<size>   cudaMalloc + cudaFree pair, each pair timed (512 B, 1 MiB, 64 MiB)
 *   async_hit_<size>     cudaMallocAsync + cudaFreeAsync pair served from the default pool (release threshold
 *                        UINT64_MAX, warmed), timed in batches of 64 pairs on one stream
 *   threads_<n>          cudaMalloc + cudaFree 1 MiB pairs per second in total from n threads (1, 4, 16)
 * Writes OUT.json and OUT.txt (OUT with .json replaced) and GPUTEST lines for tests/gpu/run.sh. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sched.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gpureclaim.h>

#include "../../tests/gpu/gpucheck.h"

extern char **environ;

#define ROUNDS 7
#define MAXM 32

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  if (n <= 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define CK(call)                                                                                                  \
  do {                                                                                                            \
    cudaError_t e_ = (call);                                                                                      \
    if (e_ != cudaSuccess) {                                                                                      \
      fprintf(stderr, "%s failed: %s at line %d\n", #call, cudaGetErrorString(e_), __LINE__);                     \
      exit(3);                                                                                                    \
    }                                                                                                             \
  } while (0)

/* ---------------------------------------------------------------- child ---------------------------------- */

static void bench_malloc_free(const char *name, size_t sz, int n) {
  static double t[4000];
  void *p;
  for (int i = 0; i < 20; i++) {
    CK(cudaMalloc(&p, sz));
    CK(cudaFree(p));
  }
  for (int i = 0; i < n; i++) {
    uint64_t t0 = now_ns();
    CK(cudaMalloc(&p, sz));
    CK(cudaFree(p));
    t[i] = (double)(now_ns() - t0);
  }
  printf("M %s %.1f\n", name, median(t, n));
  fflush(stdout);
}

static void bench_async(const char *name, size_t sz, cudaStream_t st) {
  enum { BATCH = 64, NB = 1500 };
  static double t[NB];
  void *p;
  for (int i = 0; i < 200; i++) {
    CK(cudaMallocAsync(&p, sz, st));
    CK(cudaFreeAsync(p, st));
  }
  CK(cudaStreamSynchronize(st));
  for (int b = 0; b < NB; b++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < BATCH; i++) {
      CK(cudaMallocAsync(&p, sz, st));
      CK(cudaFreeAsync(p, st));
    }
    t[b] = (double)(now_ns() - t0) / BATCH;
    if (b % 16 == 15)
      CK(cudaStreamSynchronize(st));
  }
  CK(cudaStreamSynchronize(st));
  printf("M %s %.1f\n", name, median(t, NB));
  fflush(stdout);
}

struct thr {
  pthread_barrier_t *bar;
  volatile int *stop;
  uint64_t pairs;
};

static void *thr_main(void *arg) {
  struct thr *t = (struct thr *)arg;
  CK(cudaSetDevice(0));
  void *p;
  CK(cudaMalloc(&p, 1 << 20));
  CK(cudaFree(p));
  pthread_barrier_wait(t->bar);
  uint64_t n = 0;
  while (!__atomic_load_n(t->stop, __ATOMIC_RELAXED)) {
    CK(cudaMalloc(&p, 1 << 20));
    CK(cudaFree(p));
    n++;
  }
  t->pairs = n;
  return NULL;
}

static void bench_threads(int nt, double seconds) {
  pthread_t th[16];
  struct thr ts[16];
  pthread_barrier_t bar;
  volatile int stop = 0;
  pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
  for (int i = 0; i < nt; i++) {
    ts[i].bar = &bar;
    ts[i].stop = &stop;
    ts[i].pairs = 0;
    pthread_create(&th[i], NULL, thr_main, &ts[i]);
  }
  pthread_barrier_wait(&bar);
  uint64_t t0 = now_ns();
  usleep((useconds_t)(seconds * 1e6));
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
  uint64_t total = 0;
  for (int i = 0; i < nt; i++) {
    pthread_join(th[i], NULL);
    total += ts[i].pairs;
  }
  double el = (double)(now_ns() - t0) / 1e9;
  pthread_barrier_destroy(&bar);
  printf("M threads_%d %.1f\n", nt, (double)total / el);
  fflush(stdout);
}

static int child(void) {
  /* single-threaded figures on one fixed CPU (the last one allowed): less scheduler noise */
  cpu_set_t all, one;
  int pinned = 0;
  if (sched_getaffinity(0, sizeof all, &all) == 0) {
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &all))
        last = c;
    CPU_ZERO(&one);
    if (last >= 0) {
      CPU_SET(last, &one);
      pinned = sched_setaffinity(0, sizeof one, &one) == 0;
    }
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  typedef int (*stats_fn_t)(int, gpureclaim_stats_t *);
  stats_fn_t st_fn = (stats_fn_t)dlsym(RTLD_DEFAULT, "gpureclaim_stats");
  bench_malloc_free("malloc_free_512B", 512, 1500);
  bench_malloc_free("malloc_free_1MiB", 1 << 20, 1500);
  bench_malloc_free("malloc_free_64MiB", 64 << 20, 600);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  CK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t thr = UINT64_MAX;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
  bench_async("async_hit_512B", 512, st);
  bench_async("async_hit_1MiB", 1 << 20, st);
  bench_async("async_hit_64MiB", 64 << 20, st);
  CK(cudaStreamDestroy(st));
  if (pinned)
    sched_setaffinity(0, sizeof all, &all);
  bench_threads(1, 0.6);
  bench_threads(4, 0.6);
  bench_threads(16, 0.6);
  if (st_fn) {
    gpureclaim_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    int rc = st_fn(-1, &s);
    printf("T tracked %d %llu\n", rc, (unsigned long long)s.total_allocs);
  } else {
    printf("T tracked -1 0\n");
  }
  return 0;
}

/* ---------------------------------------------------------------- driver --------------------------------- */

struct metric {
  char name[64];
  double v[2][ROUNDS]; /* [0] without, [1] with */
  int n[2];
};
static struct metric ms[MAXM];
static int nms;

static struct metric *metric(const char *name) {
  for (int i = 0; i < nms; i++)
    if (!strcmp(ms[i].name, name))
      return &ms[i];
  if (nms == MAXM)
    return NULL;
  snprintf(ms[nms].name, sizeof ms[nms].name, "%s", name);
  return &ms[nms++];
}

/* After median() sorted a series ascending: the best run is the first for times, the last for rates. */
static int rate_best_index(const char *name, int n) { return strncmp(name, "threads_", 8) ? 0 : n - 1; }

/* Runs one child; with != 0 adds LD_PRELOAD=lib. Returns the tracked allocation count (with) or 0; -1 on error. */
static long long run_child(const char *self, const char *lib, int with, int round) {
  int pfd[2];
  if (pipe(pfd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    close(pfd[1]);
    unsetenv("LD_PRELOAD");
    if (with) {
      setenv("LD_PRELOAD", lib, 1);
      setenv("GPURECLAIM_STATUS", "0", 1);
    }
    execl(self, self, "--child", (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  FILE *f = fdopen(pfd[0], "r");
  char line[256];
  long long tracked = -1;
  int rc_tracked = -99;
  while (f && fgets(line, sizeof line, f)) {
    char name[64];
    double v;
    unsigned long long tr;
    int rc;
    if (sscanf(line, "M %63s %lf", name, &v) == 2) {
      struct metric *m = metric(name);
      if (m && m->n[with] < ROUNDS)
        m->v[with][m->n[with]++] = v;
      fprintf(stderr, "  round %d %-8s %-20s %12.1f\n", round, with ? "with" : "without", name, v);
    } else if (sscanf(line, "T tracked %d %llu", &rc, &tr) == 2) {
      rc_tracked = rc;
      tracked = (long long)tr;
    }
  }
  if (f)
    fclose(f);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child (%s) failed: status %d\n", with ? "with" : "without", status);
    return -1;
  }
  if (with)
    return rc_tracked == 0 ? tracked : -1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--child"))
    return child();
  if (argc < 2) {
    fprintf(stderr, "usage: %s LIBGPURECLAIM [OUT.json]\n", argv[0]);
    return 2;
  }
  const char *lib = argv[1];
  const char *out = argc > 2 ? argv[2] : "bench_overhead.json";
  char self[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0)
    return 2;
  self[k] = 0;
  long long tracked_min = -1;
  int failures = 0;
  for (int r = 0; r < ROUNDS; r++) {
    /* alternate which goes first, so that drift over the run does not favour one side */
    for (int j = 0; j < 2; j++) {
      int with = (r % 2) ? !j : j;
      long long tr = run_child(self, lib, with, r);
      if (tr < 0)
        failures++;
      else if (with && (tracked_min < 0 || tr < tracked_min))
        tracked_min = tr;
    }
  }
  char txt[4096];
  snprintf(txt, sizeof txt, "%s", out);
  char *dot = strrchr(txt, '.');
  if (dot && !strcmp(dot, ".json"))
    strcpy(dot, ".txt");
  else
    strncat(txt, ".txt", sizeof txt - strlen(txt) - 1);
  FILE *fj = fopen(out, "w"), *ft = fopen(txt, "w");
  if (fj)
    fprintf(fj, "{\"rounds\": %d, \"tracked_allocs_with\": %lld, \"child_failures\": %d, \"metrics\": {", ROUNDS,
            tracked_min, failures);
  const char *hdr = "figure                  without          with         added    ratio  (median of runs)\n";
  printf("%s", hdr);
  if (ft)
    fprintf(ft, "gpureclaim overhead on real CUDA calls (median over %d rounds of per-run medians)\n%s", ROUNDS,
            hdr);
  for (int i = 0; i < nms; i++) {
    struct metric *m = &ms[i];
    double a = median(m->v[0], m->n[0]), b = median(m->v[1], m->n[1]);
    /* best run of each side (lowest time, highest rate): the least disturbed measurement */
    double ba = m->n[0] ? m->v[0][rate_best_index(m->name, m->n[0])] : 0;
    double bb = m->n[1] ? m->v[1][rate_best_index(m->name, m->n[1])] : 0;
    int rate = !strncmp(m->name, "threads_", 8);
    /* for rates (pairs per second) the cost added is expressed per pair: 1/b - 1/a */
    double added = rate ? (b > 0 && a > 0 ? 1e9 / b - 1e9 / a : 0) : b - a;
    double ratio = rate ? (b > 0 ? a / b : 0) : (a > 0 ? b / a : 0);
    const char *unit = rate ? "pairs/s" : "ns/pair";
    double badded = rate ? (bb > 0 && ba > 0 ? 1e9 / bb - 1e9 / ba : 0) : bb - ba;
    char line[600];
    snprintf(line, sizeof line, "%-18.18s %12.1f  %12.1f  %+10.1f ns  %6.3fx  (%s; best runs %.1f / %.1f: %+.1f ns)\n",
             m->name, a, b, added, ratio, unit, ba, bb, badded);
    printf("%s", line);
    if (ft)
      fputs(line, ft);
    if (fj) {
      fprintf(fj,
              "%s\"%s\": {\"unit\": \"%s\", \"without\": %.1f, \"with\": %.1f, \"added_ns_per_pair\": %.1f, "
              "\"cost_ratio\": %.4f, \"best_without\": %.1f, \"best_with\": %.1f, \"best_added_ns_per_pair\": %.1f",
              i ? ", " : "", m->name, unit, a, b, added, ratio, ba, bb, badded);
      for (int w = 0; w < 2; w++) {
        fprintf(fj, ", \"%s_runs\": [", w ? "with" : "without");
        for (int j = 0; j < m->n[w]; j++)
          fprintf(fj, "%s%.1f", j ? ", " : "", m->v[w][j]);
        fprintf(fj, "]");
      }
      fprintf(fj, "}");
    }
    char data[512];
    snprintf(data, sizeof data,
             "{\"unit\": \"%s\", \"without\": %.1f, \"with\": %.1f, \"added_ns_per_pair\": %.1f, \"cost_ratio\": %.4f}",
             unit, a, b, added, ratio);
    if (rate)
      gt_result(m->name, m->n[0] && m->n[1] ? 1 : 0, data,
                "1 MiB cudaMalloc+cudaFree from %s threads: %.0f pairs/s without, %.0f with (%+.1f ns per pair, "
                "cost ratio %.3f)",
                m->name + 8, a, b, added, ratio);
    else
      gt_result(m->name, m->n[0] && m->n[1] ? 1 : 0, data,
                "median %.1f ns per pair without, %.1f with: %+.1f ns added, ratio %.3f (best runs %.1f / %.1f: "
                "%+.1f ns)",
                a, b, added, ratio, ba, bb, badded);
  }
  if (fj) {
    fprintf(fj, "}}\n");
    fclose(fj);
  }
  if (ft) {
    fprintf(ft, "tracked allocations in a run with the preload: %lld; child failures: %d\n", tracked_min,
            failures);
    fclose(ft);
  }
  char data[256];
  snprintf(data, sizeof data, "{\"tracked_allocs_with\": %lld, \"child_failures\": %d}", tracked_min, failures);
  gt_result("runs", failures == 0 && tracked_min > 10000, data,
            "%d rounds without/with the preload, %d child failures; allocations gpureclaim tracked in a run with "
            "it: %lld",
            ROUNDS, failures, tracked_min);
  return gt_failed ? 1 : 0;
}
