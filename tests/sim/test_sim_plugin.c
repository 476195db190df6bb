/* test_sim_plugin.c -- a plugin loaded with RTLD_DEEPBIND that dlopen()s and dlsym()s the driver itself,
 * and the reproducibility of addresses across processes. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The sanitizer runtimes abort on RTLD_DEEPBIND (google/sanitizers#611): there the plugin is loaded
 * without it, which still exercises its own dlopen/dlsym route. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PLUGIN_FLAGS (RTLD_NOW | RTLD_LOCAL)
#else
#define PLUGIN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)
#endif

typedef int (*alloc_fn)(size_t, int, CUdeviceptr *);
typedef int (*free_fn)(const CUdeviceptr *, int);
typedef int (*alloc_pa_fn)(size_t, CUdeviceptr *);

Test(sim_plugin, deepbind_plugin_reaches_the_driver_by_name) {
  void *h = dlopen(SIM_PLUGIN, PLUGIN_FLAGS);
  cr_assert_not_null(h, "dlopen %s: %s", SIM_PLUGIN, dlerror());
  alloc_fn palloc = (alloc_fn)dlsym(h, "simplugin_alloc");
  free_fn pfree = (free_fn)dlsym(h, "simplugin_free");
  alloc_pa_fn palloc_pa = (alloc_pa_fn)dlsym(h, "simplugin_alloc_via_procaddr");
  cr_assert(palloc && pfree && palloc_pa);
  CUdeviceptr p[3];
  cr_assert_eq(palloc(2 * MiB, 3, p), CUDA_SUCCESS);
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 3, "the plugin's blocks are in the same simulator as ours");
  cr_assert_eq(s.live_bytes, 6 * MiB);
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(sim_block(p[i], SIMCUDA_DEVICE).bytes, 2 * MiB);
  CUdeviceptr q;
  cr_assert_eq(palloc_pa(MiB, &q), CUDA_SUCCESS);
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), 4, "the pointer from cuGetProcAddress is cuMemAlloc_v2");
  cr_assert_eq(sim_count_blocks(SIMCUDA_DEVICE, q), 1);
  cr_assert_eq(pfree(p, 3), CUDA_SUCCESS);
  cr_assert_eq(pfree(&q, 1), CUDA_SUCCESS);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  cr_assert_eq(pfree(&q, 1), CUDA_ERROR_INVALID_VALUE);
  dlclose(h);
}

static char *run_prog(void) {
  static char out[2][4096];
  static int which;
  char *buf = out[which++ % 2];
  FILE *f = popen("'" SIM_DRIVER_PROG "' 6 300000", "r");
  cr_assert_not_null(f);
  size_t n = fread(buf, 1, 4095, f);
  buf[n] = 0;
  cr_assert_eq(pclose(f), 0, "%s failed: %s", SIM_DRIVER_PROG, buf);
  return buf;
}

Test(sim_determinism, a_program_run_twice_prints_the_same_addresses) {
  char *a = run_prog(), *b = run_prog();
  cr_assert(strstr(a, "block 5:") != NULL, "unexpected output: %s", a);
  cr_assert_str_eq(a, b, "two runs of the same program differ");
  /* and it did reuse the freed address */
  unsigned long long first = 0, reused = 1;
  cr_assert_eq(sscanf(strstr(a, "block 0:"), "block 0: %llx", &first), 1);
  cr_assert_eq(sscanf(strstr(a, "reused:"), "reused: %llx", &reused), 1);
  cr_assert_eq(first, reused);
}

/* A mixed call sequence; writes every address it got to fd. */
static void sequence(int fd) {
  CUdevice d;
  CUcontext c;
  uint64_t v[32];
  int n = 0;
  if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) _exit(3);
  CUdeviceptr p[8];
  for (int i = 0; i < 8; i++) {
    if (cuMemAlloc(&p[i], (size_t)(i + 1) * 777777)) _exit(4);
    v[n++] = p[i];
  }
  cuMemFree(p[2]);
  cuMemFree(p[5]);
  CUdeviceptr a, b;
  if (cuMemAllocAsync(&a, 5 * MiB, NULL) || cuMemAlloc(&b, 3 * 777777)) _exit(5);
  v[n++] = a;
  v[n++] = b;
  void *h;
  if (cuMemHostAlloc(&h, 4096, 0)) _exit(6);
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle mh;
  CUdeviceptr va;
  if (cuMemCreate(&mh, 4 * MiB, &prop, 0) || cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0)) _exit(7);
  v[n++] = mh;
  v[n++] = va;
  uint64_t base = 0;
  v[n++] = (uint64_t)simcuda_arena(0, &base, NULL);
  if (write(fd, v, sizeof v[0] * (size_t)n) < 0) _exit(8);
  _exit(0);
}

static size_t run_child(uint64_t *v, size_t max) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    sequence(fds[1]);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], v, max * sizeof v[0]);
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status %d)", st);
  cr_assert_gt(got, 0);
  return (size_t)got / sizeof v[0];
}

Test(sim_determinism, the_same_call_sequence_gives_the_same_addresses) {
  /* this process never initialized the simulator: each child starts from scratch */
  uint64_t a[32], b[32];
  size_t na = run_child(a, 32), nb = run_child(b, 32);
  cr_assert_eq(na, 13);
  cr_assert_eq(na, nb);
  cr_assert_eq(a[na - 1], 1, "the arena sits at its hint address");
  for (size_t i = 0; i < na; i++) cr_assert_eq(a[i], b[i], "value %zu: %#llx vs %#llx", i,
                                               (unsigned long long)a[i], (unsigned long long)b[i]);
  cr_assert_eq(a[9], a[2], "the freed block of the same size class is handed out again");
}
