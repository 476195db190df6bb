/*
 * bench_hooks -- what gpureclaim adds to an allocation + free pair, per route, in thread CPU time.
 *
 * `bench_hooks [rounds] [pairs]` (default 7 rounds of 200000 pairs) runs itself as a child eight times per round:
 * without anything preloaded, with libgpureclaim.so (GPURECLAIM_LIBRARY, else next to this binary's build tree),
 * with the floor tracker (bench/floor/floor.c, BENCH_FLOOR_LIB: the least a tracker can add, the yardstick) and
 * with the floor tracker reading the current context and a coarse clock per allocation, on two drivers: the null
 * driver (bench/nullcuda.c: entry points that do almost nothing, so the figure is the tracker's cost) and the
 * simulator (tests/sim). The order rotates between rounds to cancel drift. Each child first starts a second
 * thread that only waits, before it initialises CUDA: glibc drops the lock prefix of its mutexes while a
 * process has one thread, which would make a driver's own locking cheaper in the baseline than in any real
 * process (libcuda starts threads). Each child times each shape's loop on each route with
 * CLOCK_THREAD_CPUTIME_ID (thread CPU time: on a shared machine wall time moves with the load, CPU time repeats
 * within about a nanosecond) and prints ns per pair; the parent prints min and median over the rounds, without,
 * with, and added (with minus without, of the mins and of the medians), the floor trackers' added figures
 * beside them, and gpureclaim's added figure divided by the floor-with-context's (of the mins, of the medians).
 * Shapes: K blocks live at once, allocated one after the other and then freed, newest first (LIFO) or oldest
 * first (FIFO), for K = 1, 64, 1,024 and 4,096; and an oscillation, 0 -> 50,000 -> 0 blocks repeated (FIFO),
 * where a table that resizes on the way up and down would show it. Every shape is warmed up first by four
 * cycles, or a tenth of the pairs if more: gpureclaim's table settles to the size a pattern needs within a
 * window of as many allocations as it has slots (about 2.6 cycles of the oscillation), so the figures are of
 * the shape repeated, as in a program's steady loop; bench_table counts the migrations on the way.
 * Routes:
 *   cuMemAlloc_v2 + cuMemFree_v2 by exported name (a program linked with -lcuda);
 *   the same through cuGetProcAddress (the CUDA runtime's route);
 *   cuMemAllocAsync + cuMemFreeAsync by exported name (stream-ordered, pool hits);
 *   the same through cuGetProcAddress.
 * Then it times, alone, steps every tracked pair may take (the driver's cuCtxGetCurrent, a clock read, two
 * compare-and-swaps), on the null driver.
 *
 * `bench_hooks --callgrind [pairs] [shape]` prints instructions per pair instead: for each route, without, with
 * gpureclaim and with the two floor trackers, it runs the child under `valgrind --tool=callgrind` on the null
 * driver, collecting only inside the timed loop (--toggle-collect), once with `pairs` pairs (default 20000) and
 * once with twice as many, and divides the difference of the instruction counts by `pairs` (so one-time costs
 * cancel). The shape is one of the short names below (default 1: one block live at a time). Needs valgrind.
 *
 * `bench_hooks --scale [rounds] [N ...]` (default 3 rounds, N = 100000 1000000) measures gpureclaim with N blocks
 * live, on the null driver, each child as above: N allocations by cuMemAlloc_v2 then N frees oldest first (three
 * cycles to warm up, in which gpureclaim's table grows and then settles to its size, then one timed: ns per
 * allocation and per free; bench_table times the growth), without anything preloaded, with
 * gpureclaim and with the floor tracker reading the context and a clock (built with a table of 2^21 slots,
 * BENCH_FLOOR21_LIB, so that a million blocks leave it half empty). The gpureclaim child then reads, through
 * its public API: the table's bytes per block right after N allocations and again after 3 N more (freeing the
 * oldest, allocating a new one: the table settles within a window of as many allocations as it has slots); the
 * time of gpureclaim_snapshot() with N blocks live and the file's bytes per block; the time of
 * gpureclaim_release(GPURECLAIM_ORPHANED) of N blocks whose scope ended (thread CPU and wall).
 *
 * Driver directories: BENCH_NULL_DIR and BENCH_SIM_DIR (environment), else the build tree's. Children are
 * multi-threaded processes, as every process that initialised CUDA is (both drivers start a thread in cuInit).
 * Each child reports which libcuda it loaded, and the parent refuses figures from the wrong one.
 */
#include "gpureclaim.h"

#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_NULL_DIR_DEFAULT
#define BENCH_NULL_DIR_DEFAULT ""
#endif
#ifndef BENCH_SIM_DIR_DEFAULT
#define BENCH_SIM_DIR_DEFAULT ""
#endif
#ifndef BENCH_FLOOR_LIB_DEFAULT
#define BENCH_FLOOR_LIB_DEFAULT ""
#endif
#ifndef BENCH_FLOOR21_LIB_DEFAULT
#define BENCH_FLOOR21_LIB_DEFAULT ""
#endif

#define NROUTES 4
static const char *const g_route[NROUTES] = {
    "cuMemAlloc_v2+cuMemFree_v2 (exported)", "cuMemAlloc+cuMemFree (cuGetProcAddress)",
    "cuMemAllocAsync+cuMemFreeAsync (exported)", "cuMemAllocAsync+cuMemFreeAsync (cuGetProcAddress)"};
#define NSTEPS 3
static const char *const g_step[NSTEPS] = {"the driver's cuCtxGetCurrent", "clock_gettime(CLOCK_MONOTONIC_COARSE)",
                                           "two compare-and-swaps"};
#define STEP_KEY 100
#define NDRV 2
static const char *const g_drv[NDRV] = {"null", "sim"};
/* The shapes: k blocks live at once, freed newest first or oldest first. */
#define OSC_K 50000
#define NSHAPES 8
static const struct {
  long k;
  bool fifo;
  const char *name, *what;
} g_shape[NSHAPES] = {
    {1, false, "1", "K = 1: one block live at a time"},
    {64, false, "64", "K = 64 live, freed newest first (LIFO)"},
    {64, true, "64fifo", "K = 64 live, freed oldest first (FIFO)"},
    {1024, false, "1024", "K = 1,024 live, LIFO"},
    {1024, true, "1024fifo", "K = 1,024 live, FIFO"},
    {4096, false, "4096", "K = 4,096 live, LIFO"},
    {4096, true, "4096fifo", "K = 4,096 live, FIFO"},
    {OSC_K, true, "osc", "oscillation: 0 -> 50,000 -> 0 live, repeated (FIFO)"},
};
/* What a child preloads: nothing, gpureclaim, the floor tracker (bench/floor), the floor tracker that also reads
 * the current context and a coarse clock per allocation (FLOOR_CTX=1). */
enum { M_NONE, M_GR, M_FLOOR, M_FLOOR_CTX, NMODES };

static double cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*aalloc_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*afree_t)(CUdeviceptr, CUstream);

static void *g_fn[NROUTES][2];

/* The blocks of a cycle, and the loop's pointer argument for K = 1. */
static CUdeviceptr g_live[OSC_K];

/* The timed loop of one route and shape (named, and kept out of line, for callgrind's --toggle-collect): whole
 * cycles of the shape, at least one, about n pairs in all. Returns the number of pairs. */
long bench_timed_loop(int route, int shape, long n);
__attribute__((noinline)) long bench_timed_loop(int route, int shape, long n) {
  long k = g_shape[shape].k, cycles = n / k > 0 ? n / k : 1;
  bool fifo = g_shape[shape].fifo;
  bool sync = route < 2;
  alloc_t a = (alloc_t)g_fn[route][0];
  free_t f = (free_t)g_fn[route][1];
  aalloc_t aa = (aalloc_t)g_fn[route][0];
  afree_t af = (afree_t)g_fn[route][1];
  if (k == 1) { /* the pair as bench_hooks always timed it */
    CUdeviceptr p;
    for (long i = 0; i < cycles; i++)
      if (sync ? a(&p, 512) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS
               : aa(&p, 4096, NULL) != CUDA_SUCCESS || af(p, NULL) != CUDA_SUCCESS) {
        fprintf(stderr, "bench_hooks: allocation failed\n");
        exit(1);
      }
    return cycles;
  }
  for (long c = 0; c < cycles; c++) {
    for (long i = 0; i < k; i++)
      if (sync ? a(&g_live[i], 512) != CUDA_SUCCESS : aa(&g_live[i], 4096, NULL) != CUDA_SUCCESS) {
        fprintf(stderr, "bench_hooks: allocation failed\n");
        exit(1);
      }
    for (long j = 0; j < k; j++) {
      CUdeviceptr p = g_live[fifo ? j : k - 1 - j];
      if (sync ? f(p) != CUDA_SUCCESS : af(p, NULL) != CUDA_SUCCESS) {
        fprintf(stderr, "bench_hooks: free failed\n");
        exit(1);
      }
    }
  }
  return cycles * k;
}

static double timed(int route, int shape, long n) {
  double t0 = cpu_ns();
  long pairs = bench_timed_loop(route, shape, n);
  return (cpu_ns() - t0) / (double)pairs;
}

/* The second thread every child starts before cuInit: it only waits. */
static void *waiter(void *arg) {
  (void)arg;
  for (;;)
    pause();
  return NULL;
}

/* Prints the path of the libcuda this process loaded. */
static void print_driver(void) {
  FILE *m = fopen("/proc/self/maps", "r");
  char line[4096];
  while (m && fgets(line, sizeof line, m)) {
    char *p = strstr(line, "/libcuda.so");
    if (p) {
      char *s = strchr(line, '/');
      line[strcspn(line, "\n")] = '\0';
      printf("driver %s\n", s);
      break;
    }
  }
  if (m)
    fclose(m);
}

/* route < 0: every shape on every route, and (without the preload) the steps; else that route and shape only
 * (callgrind). */
static int child(long n, int route, int shape) {
  CUdevice dev;
  CUcontext ctx;
  pthread_t th;
  if (pthread_create(&th, NULL, waiter, NULL) != 0)
    return 2;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  print_driver();
  typedef CUresult (*gp_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  gp_t gp = (gp_t)dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cuGetProcAddress_v2");
  CUdriverProcAddressQueryResult st;
  g_fn[0][0] = (void *)cuMemAlloc_v2;
  g_fn[0][1] = (void *)cuMemFree_v2;
  g_fn[2][0] = (void *)cuMemAllocAsync;
  g_fn[2][1] = (void *)cuMemFreeAsync;
  if (!gp || gp("cuMemAlloc", &g_fn[1][0], 13000, 0, &st) || gp("cuMemFree", &g_fn[1][1], 13000, 0, &st) ||
      gp("cuMemAllocAsync", &g_fn[3][0], 13000, 0, &st) || gp("cuMemFreeAsync", &g_fn[3][1], 13000, 0, &st))
    return 2;
  CUmemoryPool pool;
  cuDeviceGetDefaultMemPool(&pool, dev);
  cuuint64_t keep = UINT64_MAX; /* pool hits, as PyTorch's cudaMallocAsync backend sets it */
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  if (route >= 0) {
    bench_timed_loop(route, shape, 1000); /* warm up: the same in every run, so it cancels */
    bench_timed_loop(route, shape, n);
    return 0;
  }
  for (int sh = 0; sh < NSHAPES; sh++)
    for (int k = 0; k < NROUTES; k++) {
      bench_timed_loop(k, sh, n / 10 > 4 * g_shape[sh].k ? n / 10 : 4 * g_shape[sh].k); /* warm up */
      printf("%d %d %.3f\n", sh, k, timed(k, sh, n));
    }
  fflush(stdout);
  if (getenv("LD_PRELOAD"))
    return 0;
  CUcontext cur;
  double t0 = cpu_ns();
  for (long i = 0; i < n; i++)
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
      return 2;
  printf("%d 0 %.3f\n", STEP_KEY, (cpu_ns() - t0) / (double)n);
  struct timespec ts;
  t0 = cpu_ns();
  for (long i = 0; i < n; i++)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  printf("%d 0 %.3f\n", STEP_KEY + 1, (cpu_ns() - t0) / (double)n);
  static _Atomic unsigned long word;
  t0 = cpu_ns();
  for (long i = 0; i < n; i++) {
    unsigned long v = atomic_load_explicit(&word, memory_order_relaxed);
    atomic_compare_exchange_strong(&word, &v, v + 1);
    v++;
    atomic_compare_exchange_strong(&word, &v, v + 1);
  }
  printf("%d 0 %.3f\n", STEP_KEY + 2, (cpu_ns() - t0) / (double)n);
  return 0;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static char g_self[PATH_MAX], g_lib[PATH_MAX], g_floor[PATH_MAX], g_floor21[PATH_MAX], g_dir[NDRV][PATH_MAX];
static bool g_scale; /* --scale: the floor with the larger table */

/* Child environment: the driver's directory first on LD_LIBRARY_PATH, the preload (mode) or none. */
static void child_env(int drv, int mode) {
  const char *old = getenv("LD_LIBRARY_PATH");
  char path[2 * PATH_MAX + 2];
  snprintf(path, sizeof path, "%s%s%s", g_dir[drv], old && *old ? ":" : "", old && *old ? old : "");
  setenv("LD_LIBRARY_PATH", path, 1);
  unsetenv("FLOOR_CTX");
  if (mode == M_GR) {
    setenv("LD_PRELOAD", g_lib, 1);
    setenv("GPURECLAIM_STATUS", "0", 1); /* no files from a benchmark */
  } else if (mode == M_FLOOR || mode == M_FLOOR_CTX) {
    setenv("LD_PRELOAD", g_scale ? g_floor21 : g_floor, 1);
    if (mode == M_FLOOR_CTX)
      setenv("FLOOR_CTX", "1", 1);
  } else {
    unsetenv("LD_PRELOAD");
  }
}

/* Whether the child's "driver PATH" line names a libcuda in drv's directory. */
static bool right_driver(int drv, const char *path) {
  char real_dir[PATH_MAX], real_path[PATH_MAX];
  if (!realpath(g_dir[drv], real_dir) || !realpath(path, real_path))
    return false;
  size_t l = strlen(real_dir);
  return !strncmp(real_path, real_dir, l) && real_path[l] == '/' && !strchr(real_path + l + 1, '/');
}

/* Runs the child on driver drv with the preload of mode; reads its NSHAPES x NROUTES figures (and the NSTEPS
 * ones). */
static int run(int drv, int mode, long n, double (*out)[NROUTES], double *steps) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    child_env(drv, mode);
    char num[32];
    snprintf(num, sizeof num, "%ld", n);
    execl(g_self, g_self, "--child", num, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char line[PATH_MAX + 64];
  int got = 0;
  bool driver_ok = false;
  while (fgets(line, sizeof line, f)) {
    int sh, k;
    double v;
    if (!strncmp(line, "driver ", 7)) {
      line[strcspn(line, "\n")] = '\0';
      driver_ok = right_driver(drv, line + 7);
      if (!driver_ok)
        fprintf(stderr, "bench_hooks: the child loaded %s, not the %s driver of %s\n", line + 7, g_drv[drv],
                g_dir[drv]);
    } else if (sscanf(line, "%d %d %lf", &sh, &k, &v) == 3) {
      if (sh >= 0 && sh < NSHAPES && k >= 0 && k < NROUTES)
        out[sh][k] = v, got++;
      else if (steps && sh >= STEP_KEY && sh < STEP_KEY + NSTEPS)
        steps[sh - STEP_KEY] = v;
    }
  }
  fclose(f);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == NSHAPES * NROUTES && driver_ok ? 0 : -1;
}

/* Instructions callgrind counted in the timed loop of one child run (null driver), or -1. */
static double callgrind_ir(int route, int shape, int mode, long n) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0)
      dup2(devnull, 1);
    child_env(0, mode);
    char num[32], r[16], sh[16];
    snprintf(num, sizeof num, "%ld", n);
    snprintf(r, sizeof r, "%d", route);
    snprintf(sh, sizeof sh, "%d", shape);
    /* --fair-sched=yes: without it valgrind seldom lets gpureclaim's worker thread run, its tick stops, and
     * allocations take their time from the clock (tick.h), which added 0 to 45 instructions per pair from one run
     * to the next. */
    execlp("valgrind", "valgrind", "--tool=callgrind", "--fair-sched=yes", "--callgrind-out-file=/dev/null",
           "--collect-atstart=no",
           "--toggle-collect=bench_timed_loop", g_self, "--child", num, r, sh, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char line[1024];
  double ir = -1;
  while (fgets(line, sizeof line, f)) {
    char *p = strstr(line, "Collected : ");
    if (p)
      ir = atof(p + 12);
  }
  fclose(f);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? ir : -1;
}

static int callgrind_main(long n, int shape) {
  printf("bench_hooks --callgrind: instructions per alloc+free pair in the timed loop, null driver, %s\n",
         g_shape[shape].what);
  printf("((Ir of %ld pairs - Ir of %ld pairs) / %ld, so one-time costs cancel)\n", 2 * n, n, n);
  printf("(floor: the throwaway minimal tracker of bench/floor; floor+ctx: the same reading the current context "
         "and a coarse clock per allocation)\n");
  printf("%-50s %10s %10s %10s %12s %12s\n", "route", "without", "with", "added", "floor added",
         "floor+ctx added");
  for (int k = 0; k < NROUTES; k++) {
    double v[NMODES];
    for (int w = 0; w < NMODES; w++) {
      double a = callgrind_ir(k, shape, w, n), b = callgrind_ir(k, shape, w, 2 * n);
      if (a < 0 || b < 0) {
        fprintf(stderr, "bench_hooks: a callgrind run failed (is valgrind installed?)\n");
        return 1;
      }
      v[w] = (b - a) / (double)n;
    }
    printf("%-50s %10.1f %10.1f %10.1f %12.1f %12.1f\n", g_route[k], v[M_NONE], v[M_GR], v[M_GR] - v[M_NONE],
           v[M_FLOOR] - v[M_NONE], v[M_FLOOR_CTX] - v[M_NONE]);
  }
  return 0;
}

static void min_med(double *v, long n, double *mn, double *md) {
  qsort(v, (size_t)n, sizeof(double), cmpd);
  *mn = v[0];
  *md = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- --scale ---- */

static double wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define SCALE_KEYS 9
static const char *const g_scale_key[SCALE_KEYS] = {"alloc", "free", "grown", "steady", "snap_ms", "snap_bytes",
                                                    "rel_cpu_ms", "rel_wall_ms", "released"};

/* What one child measures with n blocks live ("key value" lines, g_scale_key). */
static int scale_child(long n) {
  CUdevice dev;
  CUcontext ctx;
  pthread_t th;
  if (pthread_create(&th, NULL, waiter, NULL) != 0 || cuInit(0) || cuDeviceGet(&dev, 0) ||
      cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  print_driver();
  CUdeviceptr *p = malloc((size_t)n * sizeof *p);
  int (*stats)(int, gpureclaim_stats_t *) = (int (*)(int, gpureclaim_stats_t *))dlsym(RTLD_DEFAULT, "gpureclaim_stats");
  gpureclaim_stats_t st = {.size = sizeof st};
  if (!p)
    return 2;
  for (int c = 0; c < 4; c++) { /* three cycles to warm up (the table grows, then settles), one timed */
    bool timed = c == 3;
    double t0 = cpu_ns();
    for (long i = 0; i < n; i++)
      if (cuMemAlloc_v2(&p[i], 512) != CUDA_SUCCESS)
        return 2;
    double t1 = cpu_ns();
    if (c == 0 && stats && stats(-1, &st) == 0) /* the table has just grown from its smallest size */
      printf("grown %.3f\n", (double)st.table_bytes / (double)n);
    for (long i = 0; i < n; i++)
      if (cuMemFree_v2(p[i]) != CUDA_SUCCESS)
        return 2;
    if (timed)
      printf("alloc %.3f\nfree %.3f\n", (t1 - t0) / (double)n, (cpu_ns() - t1) / (double)n);
  }
  int (*snap)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "gpureclaim_snapshot");
  uint64_t (*begin)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "gpureclaim_scope_begin");
  int (*end)(uint64_t, unsigned) = (int (*)(uint64_t, unsigned))dlsym(RTLD_DEFAULT, "gpureclaim_scope_end");
  int (*rel)(unsigned, gpureclaim_report_t *) =
      (int (*)(unsigned, gpureclaim_report_t *))dlsym(RTLD_DEFAULT, "gpureclaim_release");
  if (!stats || !snap || !begin || !end || !rel)
    return 0; /* not gpureclaim */
  for (long i = 0; i < n; i++)
    if (cuMemAlloc_v2(&p[i], 512) != CUDA_SUCCESS)
      return 2;
  for (long j = 0; j < 3 * n; j++) /* n live all along: the oldest freed, a new one allocated */
    if (cuMemFree_v2(p[j % n]) != CUDA_SUCCESS || cuMemAlloc_v2(&p[j % n], 512) != CUDA_SUCCESS)
      return 2;
  stats(-1, &st);
  printf("steady %.3f\n", (double)st.table_bytes / (double)n);
  /* A directory of its own for the snapshot: in the test's run directory when CTest runs it, else the temporary
   * directory. */
  const char *base = getenv("GPURECLAIM_RUNDIR") ? getenv("GPURECLAIM_RUNDIR") : getenv("TMPDIR");
  char dir[PATH_MAX], path[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/bench_hooks.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(dir))
    return 2;
  snprintf(path, sizeof path, "%s/snap.json", dir);
  double t0 = wall_ns();
  int rc = snap(path);
  double ms = (wall_ns() - t0) / 1e6;
  struct stat sb;
  if (rc != 0 || stat(path, &sb) != 0)
    return 2;
  printf("snap_ms %.3f\nsnap_bytes %.3f\n", ms, (double)sb.st_size / (double)n);
  unlink(path);
  rmdir(dir);
  for (long i = 0; i < n; i++)
    if (cuMemFree_v2(p[i]) != CUDA_SUCCESS)
      return 2;
  uint64_t scope = begin();
  for (long i = 0; i < n; i++)
    if (cuMemAlloc_v2(&p[i], 512) != CUDA_SUCCESS)
      return 2;
  if (end(scope, 0) != 0)
    return 2;
  gpureclaim_report_t r = {.size = sizeof r};
  double c0 = cpu_ns(), w0 = wall_ns();
  rc = rel(GPURECLAIM_ORPHANED, &r);
  printf("rel_cpu_ms %.3f\nrel_wall_ms %.3f\nreleased %llu\n", (cpu_ns() - c0) / 1e6, (wall_ns() - w0) / 1e6,
         (unsigned long long)r.orphaned_blocks);
  free(p);
  return rc == 0 ? 0 : 2;
}

/* Runs scale_child(n) with the preload of mode on the null driver; fills out[] (NAN for what it did not print). */
static int scale_run(int mode, long n, double *out) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    child_env(0, mode);
    if (mode == M_FLOOR_CTX)
      setenv("FLOOR_CTX", "1", 1);
    char num[32];
    snprintf(num, sizeof num, "%ld", n);
    execl(g_self, g_self, "--scale-child", num, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char line[PATH_MAX + 64], key[64];
  bool driver_ok = false;
  for (int k = 0; k < SCALE_KEYS; k++)
    out[k] = -1;
  while (fgets(line, sizeof line, f)) {
    double v;
    if (!strncmp(line, "driver ", 7)) {
      line[strcspn(line, "\n")] = '\0';
      driver_ok = right_driver(0, line + 7);
    } else if (sscanf(line, "%63s %lf", key, &v) == 2) {
      for (int k = 0; k < SCALE_KEYS; k++)
        if (!strcmp(key, g_scale_key[k]))
          out[k] = v;
    }
  }
  fclose(f);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && driver_ok && out[0] >= 0 && out[1] >= 0 ? 0 : -1;
}

static int scale_main(long rounds, const long *sizes, int nsizes) {
  static const int modes[3] = {M_NONE, M_GR, M_FLOOR_CTX};
  printf("bench_hooks --scale: N blocks allocated by cuMemAlloc_v2, then freed oldest first, null driver; thread "
         "CPU ns per operation, min and median of %ld interleaved rounds, each after three cycles to warm up\n",
         rounds);
  printf("(floor+ctx: the minimal tracker of bench/floor with a table of 2^21 slots, reading the context and a "
         "clock per allocation; added: with minus without; ratio: gpureclaim's added pair / floor+ctx's)\n");
  printf("%9s | %15s %15s | %15s %15s %15s | %15s %15s %15s | %11s\n", "N", "without alloc", "without free",
         "added alloc", "added free", "added pair", "floor+ctx alloc", "floor+ctx free", "floor+ctx pair", "ratio");
  static double v[3][SCALE_KEYS][64];
  for (int k = 0; k < nsizes; k++) {
    for (long r = 0; r < rounds; r++)
      for (int o = 0; o < 3; o++) {
        int m = (int)((o + r) % 3);
        double out[SCALE_KEYS];
        if (scale_run(modes[m], sizes[k], out) != 0) {
          fprintf(stderr, "bench_hooks: a --scale child failed\n");
          return 1;
        }
        for (int q = 0; q < SCALE_KEYS; q++)
          v[m][q][r] = out[q];
      }
    double mn[3][SCALE_KEYS], md[3][SCALE_KEYS];
    for (int m = 0; m < 3; m++)
      for (int q = 0; q < SCALE_KEYS; q++)
        min_med(v[m][q], rounds, &mn[m][q], &md[m][q]);
    double gp_mn = mn[1][0] + mn[1][1] - mn[0][0] - mn[0][1], gp_md = md[1][0] + md[1][1] - md[0][0] - md[0][1];
    double fp_mn = mn[2][0] + mn[2][1] - mn[0][0] - mn[0][1], fp_md = md[2][0] + md[2][1] - md[0][0] - md[0][1];
    printf("%9ld | %7.1f %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f %7.1f %7.1f "
           "%7.1f | %5.2f %5.2f\n",
           sizes[k], mn[0][0], md[0][0], mn[0][1], md[0][1], mn[1][0] - mn[0][0], md[1][0] - md[0][0],
           mn[1][1] - mn[0][1], md[1][1] - md[0][1], gp_mn, gp_md, mn[2][0] - mn[0][0], md[2][0] - md[0][0],
           mn[2][1] - mn[0][1], md[2][1] - md[0][1], fp_mn, fp_md, fp_mn > 0 ? gp_mn / fp_mn : 0.0,
           fp_md > 0 ? gp_md / fp_md : 0.0);
    printf("%9s   gpureclaim (min, median): table %.1f / %.1f B per block after growing, %.1f / %.1f steady; snapshot "
           "%.1f / %.1f ms, %.1f B per block; release of %ld orphans %.1f / %.1f ms CPU, %.1f / %.1f ms wall (%.0f "
           "released)\n",
           "", mn[1][2], md[1][2], mn[1][3], md[1][3], mn[1][4], md[1][4], md[1][5], sizes[k], mn[1][6], md[1][6],
           mn[1][7], md[1][7], md[1][8]);
    fflush(stdout);
  }
  return 0;
}

static int shape_named(const char *name) {
  for (int sh = 0; sh < NSHAPES; sh++)
    if (!strcmp(name, g_shape[sh].name))
      return sh;
  return -1;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--child"))
    return child(atol(argv[2]), argc > 3 ? atoi(argv[3]) : -1, argc > 4 ? atoi(argv[4]) : 0);
  if (argc > 2 && !strcmp(argv[1], "--scale-child"))
    return scale_child(atol(argv[2]));
  g_scale = argc > 1 && !strcmp(argv[1], "--scale");
  long sizes[16] = {100000, 1000000};
  int nsizes = 2;
  bool cg = argc > 1 && !strcmp(argv[1], "--callgrind");
  char *end = NULL;
  long rounds = 7, n = cg ? 20000 : 200000;
  int cg_shape = 0;
  bool bad = false;
  if (cg) {
    if (argc > 2)
      n = strtol(argv[2], &end, 10), bad = *end || n < 10;
    if (argc > 3)
      cg_shape = shape_named(argv[3]), bad = bad || cg_shape < 0;
    bad = bad || argc > 4;
  } else if (g_scale) {
    rounds = 3;
    if (argc > 2)
      rounds = strtol(argv[2], &end, 10), bad = *end || rounds < 1 || rounds > 64;
    if (argc > 3)
      nsizes = 0;
    for (int k = 3; k < argc && !bad; k++)
      sizes[nsizes] = strtol(argv[k], &end, 10), bad = *end || sizes[nsizes] < 1000 || ++nsizes > 15;
  } else {
    if (argc > 1)
      rounds = strtol(argv[1], &end, 10), bad = *end || rounds < 1 || rounds > 64;
    if (argc > 2)
      n = strtol(argv[2], &end, 10), bad = bad || *end || n < 10;
    bad = bad || argc > 3;
  }
  if (bad) {
    fprintf(stderr, "usage: bench_hooks [rounds 1-64, default 7] [pairs per measurement >= 10, default 200000]\n"
                    "       bench_hooks --callgrind [pairs >= 10, default 20000] [shape, default 1]\n"
                    "       bench_hooks --scale [rounds 1-64, default 3] [N >= 1000 ..., default 100000 1000000]\n"
                    "shapes:");
    for (int sh = 0; sh < NSHAPES; sh++)
      fprintf(stderr, " %s", g_shape[sh].name);
    fprintf(stderr, "\n");
    return 2;
  }
  ssize_t len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
  if (len <= 0)
    return 1;
  g_self[len] = '\0';
  const char *env = getenv("GPURECLAIM_LIBRARY");
  if (env) {
    snprintf(g_lib, sizeof g_lib, "%s", env);
  } else {
    char *slash = strrchr(g_self, '/');
    snprintf(g_lib, sizeof g_lib, "%.*s/../src/libgpureclaim.so", (int)(slash - g_self), g_self);
  }
  const char *fl = getenv("BENCH_FLOOR_LIB");
  snprintf(g_floor, sizeof g_floor, "%s", fl ? fl : BENCH_FLOOR_LIB_DEFAULT);
  if (access(g_floor, R_OK) != 0) {
    fprintf(stderr, "bench_hooks: the floor tracker %s not found (set BENCH_FLOOR_LIB)\n", g_floor);
    return 1;
  }
  fl = getenv("BENCH_FLOOR21_LIB");
  snprintf(g_floor21, sizeof g_floor21, "%s", fl ? fl : BENCH_FLOOR21_LIB_DEFAULT);
  if (g_scale && access(g_floor21, R_OK) != 0) {
    fprintf(stderr, "bench_hooks: the floor tracker %s not found (set BENCH_FLOOR21_LIB)\n", g_floor21);
    return 1;
  }
  const char *nd = getenv("BENCH_NULL_DIR"), *sd = getenv("BENCH_SIM_DIR");
  snprintf(g_dir[0], sizeof g_dir[0], "%s", nd ? nd : BENCH_NULL_DIR_DEFAULT);
  snprintf(g_dir[1], sizeof g_dir[1], "%s", sd ? sd : BENCH_SIM_DIR_DEFAULT);
  if (access(g_lib, R_OK) != 0) {
    fprintf(stderr, "bench_hooks: %s not found (set GPURECLAIM_LIBRARY)\n", g_lib);
    return 1;
  }
  for (int d = 0; d < NDRV; d++) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/libcuda.so.1", g_dir[d]);
    if (access(p, R_OK) != 0) {
      fprintf(stderr, "bench_hooks: no %s (set BENCH_%s_DIR)\n", p, d ? "SIM" : "NULL");
      return 1;
    }
  }
  if (cg)
    return callgrind_main(n, cg_shape);
  if (g_scale)
    return scale_main(rounds, sizes, nsizes);
  static double v[NDRV][NMODES][NSHAPES][NROUTES][64], step[NSTEPS][64];
  for (int r = 0; r < rounds; r++)
    for (int d = 0; d < NDRV; d++)
      for (int o = 0; o < NMODES; o++) {
        int w = (o + r) % NMODES; /* rotate which goes first */
        double out[NSHAPES][NROUTES], st[NSTEPS] = {0};
        if (run(d, w, n, out, d == 0 && w == M_NONE ? st : NULL) != 0) {
          fprintf(stderr, "bench_hooks: a child failed\n");
          return 1;
        }
        for (int sh = 0; sh < NSHAPES; sh++)
          for (int k = 0; k < NROUTES; k++)
            v[d][w][sh][k][r] = out[sh][k];
        if (d == 0 && w == M_NONE)
          for (int k = 0; k < NSTEPS; k++)
            step[k][r] = st[k];
      }
  printf("bench_hooks: %ld interleaved rounds of about %ld pairs per shape and route; thread CPU time per "
         "alloc+free pair in ns, min and median\n",
         rounds, n);
  printf("(every child process runs a second thread, started before cuInit; floor: the throwaway minimal tracker "
         "of bench/floor, two compare-and-swaps per pair; floor+ctx: the same reading the current context and a "
         "coarse clock per allocation; their added cost, min and median; ratio: gpureclaim's added cost / "
         "floor+ctx's, of the mins and of the medians)\n");
  for (int sh = 0; sh < NSHAPES; sh++) {
    printf("\n%s\n", g_shape[sh].what);
    printf("%-50s %-6s %15s %15s %15s %15s %15s %13s\n", "route", "driver", "without", "with", "added",
           "floor added", "floor+ctx added", "ratio");
    for (int k = 0; k < NROUTES; k++)
      for (int d = 0; d < NDRV; d++) {
        double mn[NMODES], md[NMODES];
        for (int w = 0; w < NMODES; w++)
          min_med(v[d][w][sh][k], rounds, &mn[w], &md[w]);
        double a_mn = mn[M_GR] - mn[M_NONE], a_md = md[M_GR] - md[M_NONE];
        double f_mn = mn[M_FLOOR_CTX] - mn[M_NONE], f_md = md[M_FLOOR_CTX] - md[M_NONE];
        printf("%-50s %-6s %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %7.1f %6.2f %6.2f\n",
               d ? "" : g_route[k], g_drv[d], mn[M_NONE], md[M_NONE], mn[M_GR], md[M_GR], a_mn, a_md,
               mn[M_FLOOR] - mn[M_NONE], md[M_FLOOR] - md[M_NONE], f_mn, f_md, f_mn > 0 ? a_mn / f_mn : 0.0,
               f_md > 0 ? a_md / f_md : 0.0);
      }
  }
  printf("\nsteps a tracked pair may take, each timed alone on the null driver (ns, min and median)\n");
  for (int k = 0; k < NSTEPS; k++) {
    double mn, md;
    min_med(step[k], rounds, &mn, &md);
    printf("%-50s %7.1f %7.1f\n", g_step[k], mn, md);
  }
  return 0;
}
