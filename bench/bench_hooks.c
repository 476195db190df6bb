/*
 * bench_hooks -- what gpureclaim adds to an allocation + free pair, on the simulator (or a real driver).
 *
 * `bench_hooks [rounds] [pairs]` runs itself as a child twice per round, once without and once with
 * libgpureclaim.so preloaded (GPURECLAIM_LIBRARY, else next to this binary's build tree), alternating to cancel
 * drift, and prints per route and size the median ns per pair, the ns gpureclaim adds and the ratio.
 * Routes: the exported driver symbols (a -lcuda program), cuGetProcAddress (the runtime's route), and
 * stream-ordered pool hits. The child mode (`--child`) prints one line per measurement.
 * Both children are multi-threaded processes, as every process that initialised CUDA is: the simulated driver
 * starts a thread in cuInit like libcuda (glibc's mutexes are cheaper in a single-threaded process, which
 * would charge gpureclaim's own thread to it).
 * Then it times, alone, the steps every tracked pair takes whatever the implementation: asking the driver for
 * the current context, reading the clock, and the two compare-and-swaps of a lock-free insert and of the
 * claim on a record's state.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NCASES 5
/* Steps every tracked pair takes, timed alone in the run without gpureclaim: what they cost here is the part of
 * the added time that no trimming of gpureclaim's own code removes. */
#define NSTEPS 3
static const char *const g_step[NSTEPS] = {"the driver's cuCtxGetCurrent (context of a cuMemAlloc)",
                                           "clock_gettime(CLOCK_MONOTONIC_COARSE) (the record's time)",
                                           "two compare-and-swaps (claim a slot, claim a record)"};
#define STEP_KEY 100
static const char *const g_case[NCASES] = {"cuMemAlloc+cuMemFree 512 B (exported)",
                                           "cuMemAlloc+cuMemFree 1 MiB (exported)",
                                           "cuMemAlloc+cuMemFree 512 B (cuGetProcAddress)",
                                           "cuMemAllocAsync+cuMemFreeAsync 4 KiB (pool hit)",
                                           "cuMemAllocAsync+cuMemFreeAsync 4 KiB (cuGetProcAddress)"};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*aalloc_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*afree_t)(CUdeviceptr, CUstream);

static double pairs(alloc_t a, free_t f, size_t size, long n) {
  CUdeviceptr p;
  double t0 = now();
  for (long i = 0; i < n; i++) {
    if (a(&p, size) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS) {
      fprintf(stderr, "bench_hooks: allocation failed\n");
      exit(1);
    }
  }
  return (now() - t0) / (double)n;
}

static double apairs(aalloc_t a, afree_t f, size_t size, long n) {
  CUdeviceptr p;
  double t0 = now();
  for (long i = 0; i < n; i++)
    if (a(&p, size, NULL) != CUDA_SUCCESS || f(p, NULL) != CUDA_SUCCESS) {
      fprintf(stderr, "bench_hooks: stream-ordered allocation failed\n");
      exit(1);
    }
  return (now() - t0) / (double)n;
}

static int child(long n) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
    return 2;
  typedef CUresult (*gp_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
  gp_t gp = (gp_t)dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "cuGetProcAddress_v2");
  void *pa = NULL, *pf = NULL, *paa = NULL, *paf = NULL;
  CUdriverProcAddressQueryResult st;
  gp("cuMemAlloc", &pa, 13000, 0, &st);
  gp("cuMemFree", &pf, 13000, 0, &st);
  gp("cuMemAllocAsync", &paa, 13000, 0, &st);
  gp("cuMemFreeAsync", &paf, 13000, 0, &st);
  CUmemoryPool pool;
  cuDeviceGetDefaultMemPool(&pool, dev);
  cuuint64_t keep = UINT64_MAX; /* pool hits, as PyTorch's cudaMallocAsync backend sets it */
  cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  /* Warm up every path once, then measure. */
  pairs(cuMemAlloc_v2, cuMemFree_v2, 512, n / 10);
  printf("0 %.2f\n", pairs(cuMemAlloc_v2, cuMemFree_v2, 512, n));
  printf("1 %.2f\n", pairs(cuMemAlloc_v2, cuMemFree_v2, 1 << 20, n));
  printf("2 %.2f\n", pairs((alloc_t)pa, (free_t)pf, 512, n));
  apairs(cuMemAllocAsync, cuMemFreeAsync, 4096, n / 10);
  printf("3 %.2f\n", apairs(cuMemAllocAsync, cuMemFreeAsync, 4096, n));
  printf("4 %.2f\n", apairs((aalloc_t)paa, (afree_t)paf, 4096, n));
  if (getenv("LD_PRELOAD"))
    return 0;
  CUcontext cur;
  double t0 = now();
  for (long i = 0; i < n; i++)
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
      return 2;
  printf("%d %.2f\n", STEP_KEY, (now() - t0) / (double)n);
  struct timespec ts;
  t0 = now();
  for (long i = 0; i < n; i++)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  printf("%d %.2f\n", STEP_KEY + 1, (now() - t0) / (double)n);
  static _Atomic unsigned long word;
  t0 = now();
  for (long i = 0; i < n; i++) {
    unsigned long v = atomic_load_explicit(&word, memory_order_relaxed);
    atomic_compare_exchange_strong(&word, &v, v + 1);
    v++;
    atomic_compare_exchange_strong(&word, &v, v + 1);
  }
  printf("%d %.2f\n", STEP_KEY + 2, (now() - t0) / (double)n);
  return 0;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Runs the child with or without the preload and reads its NCASES figures (and, without, the NSTEPS ones). */
static int run(const char *self, const char *lib, long n, double *out, double *steps) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    if (lib) {
      setenv("LD_PRELOAD", lib, 1);
      setenv("GPURECLAIM_STATUS", "0", 1); /* no files from a benchmark */
    } else {
      unsetenv("LD_PRELOAD");
    }
    char num[32];
    snprintf(num, sizeof num, "%ld", n);
    execl(self, self, "--child", num, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  int k, got = 0;
  double v;
  while (fscanf(f, "%d %lf", &k, &v) == 2)
    if (k >= 0 && k < NCASES)
      out[k] = v, got++;
    else if (steps && k >= STEP_KEY && k < STEP_KEY + NSTEPS)
      steps[k - STEP_KEY] = v;
  fclose(f);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == NCASES ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--child"))
    return child(atol(argv[2]));
  char *end = NULL;
  long rounds = argc > 1 ? strtol(argv[1], &end, 10) : 7;
  bool bad = argc > 3 || (argc > 1 && (*end || rounds < 1 || rounds > 64));
  long n = argc > 2 ? strtol(argv[2], &end, 10) : 200000;
  bad = bad || (argc > 2 && (*end || n < 10));
  if (bad) {
    fprintf(stderr, "usage: bench_hooks [rounds 1-64, default 7] [pairs per measurement >= 10, default 200000]\n");
    return 2;
  }
  char self[PATH_MAX], lib[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    return 1;
  self[len] = '\0';
  const char *env = getenv("GPURECLAIM_LIBRARY");
  if (env) {
    snprintf(lib, sizeof lib, "%s", env);
  } else {
    char *slash = strrchr(self, '/');
    snprintf(lib, sizeof lib, "%.*s/../src/libgpureclaim.so", (int)(slash - self), self);
  }
  if (access(lib, R_OK) != 0) {
    fprintf(stderr, "bench_hooks: %s not found (set GPURECLAIM_LIBRARY)\n", lib);
    return 1;
  }
  double base[NCASES][64], with[NCASES][64], step[NSTEPS][64];
  for (int r = 0; r < rounds; r++) {
    double b[NCASES], w[NCASES], st[NSTEPS] = {0};
    if (run(self, NULL, n, b, st) != 0 || run(self, lib, n, w, NULL) != 0) {
      fprintf(stderr, "bench_hooks: a child failed\n");
      return 1;
    }
    for (int k = 0; k < NCASES; k++)
      base[k][r] = b[k], with[k][r] = w[k];
    for (int k = 0; k < NSTEPS; k++)
      step[k][r] = st[k];
  }
  printf("bench_hooks: %ld rounds of %ld pairs, median ns per pair, without and with libgpureclaim.so\n", rounds, n);
  printf("%-58s %10s %10s %10s %8s\n", "pair", "baseline", "gpureclaim", "added", "ratio");
  for (int k = 0; k < NCASES; k++) {
    qsort(base[k], (size_t)rounds, sizeof(double), cmpd);
    qsort(with[k], (size_t)rounds, sizeof(double), cmpd);
    double b = base[k][rounds / 2], w = with[k][rounds / 2];
    printf("%-58s %10.1f %10.1f %10.1f %7.2fx\n", g_case[k], b, w, w - b, w / b);
  }
  printf("\nsteps every tracked pair takes, each timed alone (median ns; within a pair they partly overlap)\n");
  double total = 0;
  for (int k = 0; k < NSTEPS; k++) {
    qsort(step[k], (size_t)rounds, sizeof(double), cmpd);
    total += step[k][rounds / 2];
    printf("%-58s %10.1f\n", g_step[k], step[k][rounds / 2]);
  }
  printf("%-58s %10.1f\n", "sum", total);
  return 0;
}
