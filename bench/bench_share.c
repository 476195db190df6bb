/*
 * bench_share -- several processes sharing one simulated GPU larger than the device: each holds GIB of device
 * memory in use, then for ROUNDS rounds works (a driver call every millisecond for WORK ms) and idles (IDLE ms
 * without a call). All run under libgpureclaim.so with GPURECLAIM_PEERS=ask,give,sleep, started STAGGER ms apart,
 * so an out-of-memory is relieved by idle peers going to sleep, and a sleeper wakes on its next call.
 *
 *   bench_share [-n N] [-g GIB] [-d DEVICE_GIB] [-r ROUNDS] [-w WORK_MS] [-i IDLE_MS] [-s STAGGER_MS] [-e VAR=VAL]...
 *   bench_share --help
 *
 * defaults: 4 processes of 3 GiB on an 8 GiB device, 4 rounds of 500 ms work and 3,000 ms idle, 500 ms apart.
 * -e sets a variable for every worker (GPURECLAIM_..., SIMCUDA_...); the simulator's checkpoint moves at the rate
 * NVIDIA's driver did on an H200 unless SIMCUDA_CHECKPOINT_RATE says otherwise.
 *
 * Every call reaches the driver through cuGetProcAddress (as the CUDA runtime's calls do), so gpureclaim sees it:
 * a sleeping process's first call wakes it. Printed, per process and in all: the calls made and failed (the
 * allocation of GIB included: a process whose allocation failed tries again at its next round), the time each
 * call took (p50, p99, max: a call that waited for room, for a wake or for a peer's sleep shows here), its
 * sleeps and wakes (from its GPURECLAIM_LOG), and its share: the calls that succeeded while it held its memory
 * over those it set out to make (a round without its memory does no work). Then the wait distribution: the
 * waits for memory the library logged ("wait" events, GPURECLAIM_WAIT: how many, served or not, p50/p99/max of
 * how long they took) and how many calls took 10 ms, 100 ms, 1 s and 10 s or more. Figures, not a test: the
 * smoke test (bench_share_runs) checks that every figure is printed.
 *
 * Needs LD_LIBRARY_PATH with the simulated libcuda.so.1 and GR_PRELOAD naming libgpureclaim.so (the CMake
 * target's defaults are set at build time). Everything it writes is under a fresh directory in $TMPDIR, removed
 * at the end.
 */
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef BENCH_PRELOAD_DEFAULT
#define BENCH_PRELOAD_DEFAULT ""
#endif
#ifndef BENCH_SIM_DIR_DEFAULT
#define BENCH_SIM_DIR_DEFAULT ""
#endif

#define MAX_PROCS 64
#define MAX_ENV 32

typedef struct opts {
  int n, rounds, work_ms, idle_ms, stagger_ms;
  double gib, device_gib;
  const char *env[MAX_ENV];
  int nenv;
} opts_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void nap_until(double t) {
  double d = t - now_s();
  if (d <= 0)
    return;
  struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ---- a worker ---- */

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*memset_t)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*sync_t)(void);

static void *proc_addr(const char *name) {
  void *fn = NULL;
  CUdriverProcAddressQueryResult q;
  if (cuGetProcAddress(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS)
    return NULL;
  return fn;
}

static int worker(const opts_t *o, int id, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lat-%d", dir, id);
  FILE *lat = fopen(path, "w");
  CUdevice dev;
  CUcontext ctx;
  if (!lat || cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "bench_share: worker %d: no simulated device\n", id);
    return 1;
  }
  alloc_t alloc = (alloc_t)proc_addr("cuMemAlloc");
  memset_t mset = (memset_t)proc_addr("cuMemsetD8");
  sync_t sync = (sync_t)proc_addr("cuCtxSynchronize");
  if (!alloc || !mset || !sync) {
    fprintf(stderr, "bench_share: worker %d: cuGetProcAddress failed\n", id);
    return 1;
  }
  size_t bytes = (size_t)(o->gib * (double)(1ull << 30));
  CUdeviceptr big = 0, small = 0;
  long calls = 0, failed = 0, ok = 0, planned = 0;
  for (int r = 0; r < o->rounds; r++) {
    if (!big) { /* the memory it holds in use: taken at its first round, or when an earlier try failed */
      double t = now_s();
      CUresult cr = alloc(&big, bytes);
      fprintf(lat, "%.6f\n", now_s() - t);
      calls++, planned++;
      if (cr == CUDA_SUCCESS) {
        ok++;
      } else {
        failed++;
        big = 0;
      }
    }
    /* The calls write a block of their own: the big one stays unwritten, so that a checkpoint moves nothing of it
     * in host memory (the simulator's device memory is host memory; it still charges the time for all of it). */
    if (!small && alloc(&small, 4096) != CUDA_SUCCESS)
      small = 0;
    double t0 = now_s();
    for (int k = 0; k < o->work_ms; k++) {
      nap_until(t0 + k * 1e-3);
      double t = now_s();
      CUresult cr = small ? mset(small, (unsigned char)k, 4096) : CUDA_ERROR_OUT_OF_MEMORY;
      if (cr == CUDA_SUCCESS)
        cr = sync();
      fprintf(lat, "%.6f\n", now_s() - t);
      calls++, planned++;
      if (cr != CUDA_SUCCESS)
        failed++;
      else if (big) /* work done: the process holds its memory */
        ok++;
    }
    nap_until(now_s() + o->idle_ms * 1e-3);
  }
  fclose(lat);
  snprintf(path, sizeof path, "%s/res-%d", dir, id);
  FILE *f = fopen(path, "w");
  if (!f)
    return 1;
  fprintf(f, "%ld %ld %ld %ld %d\n", calls, failed, ok, planned, big != 0);
  fclose(f);
  return 0;
}

/* ---- the parent ---- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct stats {
  double *v;
  size_t n, cap;
} stats_t;

static void push(stats_t *s, double x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 4096;
    s->v = realloc(s->v, s->cap * sizeof *s->v);
    if (!s->v)
      exit(1);
  }
  s->v[s->n++] = x;
}

static double pct(stats_t *s, double p) {
  if (!s->n)
    return NAN;
  size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
  return s->v[i];
}

/* Sleeps, wakes and waits in a worker's GPURECLAIM_LOG (each wait's milliseconds into waits, the unserved
 * counted in *unserved). */
static void count_events(const char *path, int *sleeps, int *wakes, int *wake_failed, stats_t *waits,
                         int *unserved) {
  FILE *f = fopen(path, "r");
  char line[8192];
  *sleeps = *wakes = *wake_failed = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (strstr(line, "\"event\":\"wait\"")) {
      const char *ms = strstr(line, "\"ms\":");
      push(waits, ms ? strtod(ms + 5, NULL) : NAN);
      if (!strstr(line, "\"served\":true"))
        ++*unserved;
      continue;
    }
    if (strstr(line, "\"event\":\"sleep\"") && strstr(line, "\"slept\":true"))
      ++*sleeps;
    else if (strstr(line, "\"event\":\"wake\""))
      ++*wakes;
    else if (strstr(line, "\"event\":\"wake-failed\""))
      ++*wake_failed;
  }
  if (f)
    fclose(f);
}

static const char g_usage[] =
    "usage: bench_share [-n N] [-g GIB] [-d DEVICE_GIB] [-r ROUNDS] [-w WORK_MS] [-i IDLE_MS] [-s STAGGER_MS]\n"
    "                   [-e VAR=VALUE]... [-E I:VAR=VALUE]...\n"
    "N processes (default 4) each hold GIB (3) of a simulated DEVICE_GIB (8) GPU in use, then for ROUNDS (4)\n"
    "rounds work (a CUDA call every ms for WORK_MS, 500) and idle (IDLE_MS, 3000), started STAGGER_MS (500)\n"
    "apart, under libgpureclaim.so with GPURECLAIM_PEERS=ask,give,sleep; -e sets a variable for every worker, -E for\n"
    "worker I only (0 is the first started: -E 0:GPURECLAIM_LIMIT=2G -E 1:GPURECLAIM_GUARANTEE=3G).\n"
    "Prints per process and for all: calls made and failed, p50/p99/max of the time a call took, sleeps and\n"
    "wakes, share; then the waits for memory (GPURECLAIM_WAIT) and the calls over 10 ms, 100 ms, 1 s, 10 s.\n";

static int usage(void) {
  fputs(g_usage, stderr);
  return 2;
}

int main(int argc, char **argv) {
  opts_t o = {.n = 4, .rounds = 4, .work_ms = 500, .idle_ms = 3000, .stagger_ms = 500, .gib = 3, .device_gib = 8};
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(g_usage, stdout);
    return 0;
  }
  if (argc == 4 && !strcmp(argv[1], "--worker")) {
    opts_t w;
    if (sscanf(argv[3], "%d %d %d %d %lf", &w.rounds, &w.work_ms, &w.idle_ms, &w.n, &w.gib) != 5)
      return 2;
    return worker(&w, atoi(argv[2]), getenv("BENCH_SHARE_DIR"));
  }
  int c;
  while ((c = getopt(argc, argv, "n:g:d:r:w:i:s:e:E:")) != -1) {
    switch (c) {
    case 'n': o.n = atoi(optarg); break;
    case 'g': o.gib = atof(optarg); break;
    case 'd': o.device_gib = atof(optarg); break;
    case 'r': o.rounds = atoi(optarg); break;
    case 'w': o.work_ms = atoi(optarg); break;
    case 'i': o.idle_ms = atoi(optarg); break;
    case 's': o.stagger_ms = atoi(optarg); break;
    case 'e':
      if (o.nenv == MAX_ENV || !strchr(optarg, '='))
        return usage();
      o.env[o.nenv++] = optarg;
      break;
    case 'E': { /* I:VAR=VALUE: kept whole, the worker's index checked as it starts */
      char *end;
      long w = strtol(optarg, &end, 10);
      if (o.nenv == MAX_ENV || end == optarg || *end != ':' || w < 0 || w >= MAX_PROCS || !strchr(end, '='))
        return usage();
      o.env[o.nenv++] = optarg;
      break;
    }
    default: return usage();
    }
  }
  if (optind != argc || o.n < 1 || o.n > MAX_PROCS || o.rounds < 1 || o.work_ms < 1 || o.gib <= 0 ||
      o.device_gib <= 0)
    return usage();
  const char *pre = getenv("GR_PRELOAD") ? getenv("GR_PRELOAD") : BENCH_PRELOAD_DEFAULT;
  if (!*pre) {
    fprintf(stderr, "bench_share: set GR_PRELOAD to libgpureclaim.so\n");
    return 2;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/bench_share.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    perror("bench_share: mkdtemp");
    return 1;
  }
  char rundir[4200], machine[4200], devmem[64], args[128];
  snprintf(rundir, sizeof rundir, "%s/run", dir);
  snprintf(machine, sizeof machine, "%s/machine", dir);
  mkdir(rundir, 0700);
  mkdir(machine, 0700);
  snprintf(devmem, sizeof devmem, "%.0fM", o.device_gib * 1024);
  snprintf(args, sizeof args, "%d %d %d %d %.6f", o.rounds, o.work_ms, o.idle_ms, o.n, o.gib);
  const char *sim = getenv("LD_LIBRARY_PATH") ? getenv("LD_LIBRARY_PATH") : BENCH_SIM_DIR_DEFAULT;
  pid_t pid[MAX_PROCS];
  double t0 = now_s();
  for (int i = 0; i < o.n; i++) {
    nap_until(t0 + i * o.stagger_ms * 1e-3);
    pid[i] = fork();
    if (pid[i] == 0) {
      char id[16], log[4300];
      snprintf(id, sizeof id, "%d", i);
      snprintf(log, sizeof log, "%s/log-%d", dir, i);
      setenv("LD_LIBRARY_PATH", sim, 1);
      setenv("LD_PRELOAD", pre, 1);
      setenv("SIMCUDA_MACHINE", machine, 1);
      setenv("SIMCUDA_DEVICES", "1", 1);
      setenv("SIMCUDA_DEVICE_MEM", devmem, 1);
      setenv("GPURECLAIM_RUNDIR", rundir, 1);
      setenv("GPURECLAIM_PEERS", "ask,give,sleep", 1);
      setenv("GPURECLAIM_LOG", log, 1);
      setenv("BENCH_SHARE_DIR", dir, 1);
      for (int k = 0; k < o.nenv; k++) {
        const char *e = o.env[k], *colon = strchr(e, ':'), *eq = strchr(e, '=');
        if (colon && eq && colon < eq && e[0] >= '0' && e[0] <= '9') { /* -E I:VAR=VALUE */
          if (atoi(e) == i)
            putenv((char *)colon + 1);
        } else {
          putenv((char *)e);
        }
      }
      execl("/proc/self/exe", argv[0], "--worker", id, args, (char *)NULL);
      _exit(127);
    }
  }
  int bad = 0;
  for (int i = 0; i < o.n; i++) {
    int st;
    waitpid(pid[i], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "bench_share: worker %d ended with status %#x\n", i, st);
      bad = 1;
    }
  }
  double wall = now_s() - t0;
  stats_t all = {0}, waits = {0};
  int unserved = 0;
  long tcalls = 0, tfailed = 0;
  int tsleeps = 0, twakes = 0, twf = 0;
  double min_share = 1, max_share = 0;
  printf("%d processes of %.1f GiB on a %.1f GiB device (%.2fx), %d rounds of %d ms work and %d ms idle, %d ms "
         "apart\n\n",
         o.n, o.gib, o.device_gib, o.n * o.gib / o.device_gib, o.rounds, o.work_ms, o.idle_ms, o.stagger_ms);
  printf("proc   calls  failed   p50 ms   p99 ms   max ms  sleeps  wakes  wake-failed  share\n");
  for (int i = 0; i < o.n; i++) {
    char path[4300];
    long calls = 0, failed = 0, ok = 0, planned = 1;
    int held = 0;
    snprintf(path, sizeof path, "%s/res-%d", dir, i);
    FILE *f = fopen(path, "r");
    if (!f || fscanf(f, "%ld %ld %ld %ld %d", &calls, &failed, &ok, &planned, &held) != 5)
      bad = 1;
    if (f)
      fclose(f);
    stats_t s = {0};
    snprintf(path, sizeof path, "%s/lat-%d", dir, i);
    f = fopen(path, "r");
    double x;
    while (f && fscanf(f, "%lf", &x) == 1) {
      push(&s, x * 1e3);
      push(&all, x * 1e3);
    }
    if (f)
      fclose(f);
    qsort(s.v, s.n, sizeof *s.v, cmp_d);
    int sl, wk, wf;
    snprintf(path, sizeof path, "%s/log-%d", dir, i);
    count_events(path, &sl, &wk, &wf, &waits, &unserved);
    double share = planned ? (double)ok / (double)planned : 0;
    min_share = share < min_share ? share : min_share;
    max_share = share > max_share ? share : max_share;
    printf("%4d %7ld %7ld %8.2f %8.2f %8.1f %7d %6d %12d  %4.0f%%\n", i, calls, failed, pct(&s, 0.5), pct(&s, 0.99),
           s.n ? s.v[s.n - 1] : NAN, sl, wk, wf, share * 100);
    tcalls += calls, tfailed += failed, tsleeps += sl, twakes += wk, twf += wf;
    free(s.v);
  }
  qsort(all.v, all.n, sizeof *all.v, cmp_d);
  printf("\nall: %ld calls, %ld failed; wait p50 %.2f ms, p99 %.2f ms, max %.1f ms; %.1f sleeps and %.1f wakes per "
         "minute (%d wakes failed); share %.0f%% to %.0f%%; %.1f s\n",
         tcalls, tfailed, pct(&all, 0.5), pct(&all, 0.99), all.n ? all.v[all.n - 1] : NAN, tsleeps * 60 / wall,
         twakes * 60 / wall, twf, min_share * 100, max_share * 100, wall);
  long over[4] = {0};
  for (size_t k = 0; k < all.n; k++)
    for (int j = 0; j < 4; j++)
      over[j] += all.v[k] >= 10.0 * pow(10, j);
  qsort(waits.v, waits.n, sizeof *waits.v, cmp_d);
  printf("waits: %zu (%d not served); p50 %.1f ms, p99 %.1f ms, max %.1f ms; calls of 10 ms or more: %ld, "
         "100 ms: %ld, 1 s: %ld, 10 s: %ld\n",
         waits.n, unserved, pct(&waits, 0.5), pct(&waits, 0.99), waits.n ? waits.v[waits.n - 1] : NAN, over[0],
         over[1], over[2], over[3]);
  free(all.v);
  free(waits.v);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "bench_share: could not remove %s\n", dir);
  return bad;
}
