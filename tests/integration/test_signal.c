/* The release signal: from the process itself and from another one, chained to an earlier handler, and left
 * alone when the program installs its own later. */
#include "harness.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
#define MiB (1024ull * 1024)

static void init_cuda(void) { (void)h_cuda_start(0); }

/* 8 MiB cached in the default pool, which keeps freed memory. */
static void cache_8mib(void) {
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep = UINT64_MAX;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  CUdeviceptr p;
  OK(cuMemAllocAsync(&p, 8 * MiB, NULL));
  OK(cuMemFreeAsync(p, NULL));
}

static uint64_t releases(void) {
  gpureclaim_stats_t s = {.size = sizeof s};
  gpureclaim_stats(-1, &s);
  return s.releases;
}

static uint64_t pool_reserved(void) {
  simcuda_stats_t s = {.size = sizeof s};
  simcuda_stats(-1, NULL, &s);
  return s.pool_reserved_bytes;
}

static bool wait_for_release(uint64_t before, double seconds) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    if (releases() > before)
      return true;
    usleep(1000);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
  return false;
}

Test(signal, from_the_process_itself) {
  init_cuda();
  cache_8mib();
  cr_assert_geq(pool_reserved(), 8 * MiB);
  raise(SIGUSR1);
  cr_assert(wait_for_release(0, 10), "no release after SIGUSR1");
  cr_assert_eq(pool_reserved(), 0);
  cr_assert(h_table_matches_sim("after the signal"));
}

Test(signal, from_another_process) {
  init_cuda();
  cache_8mib();
  pid_t child = fork();
  if (child == 0) {
    kill(getppid(), SIGUSR1);
    _exit(0);
  }
  int st;
  waitpid(child, &st, 0);
  cr_assert(wait_for_release(0, 10));
  cr_assert_eq(pool_reserved(), 0);
}

static _Atomic int g_earlier;
static void earlier(int sig) {
  (void)sig;
  atomic_fetch_add(&g_earlier, 1);
}

Test(signal, chained_to_an_earlier_handler) {
  signal(SIGUSR1, earlier); /* installed before CUDA initialisation */
  init_cuda();
  cache_8mib();
  raise(SIGUSR1);
  cr_assert(wait_for_release(0, 10));
  cr_assert_eq(atomic_load(&g_earlier), 1, "the earlier handler still runs");
  cr_assert_eq(pool_reserved(), 0);
}

static _Atomic int g_later;
static void later(int sig) {
  (void)sig;
  atomic_fetch_add(&g_later, 1);
}

Test(signal, a_handler_installed_later_is_left_alone) {
  init_cuda();
  cache_8mib();
  signal(SIGUSR1, later); /* the program takes the signal back */
  raise(SIGUSR1);
  cr_assert_eq(atomic_load(&g_later), 1);
  cr_assert(!wait_for_release(0, 0.5), "gpureclaim fought the program's handler");
  struct sigaction cur;
  sigaction(SIGUSR1, NULL, &cur);
  cr_assert_eq(cur.sa_handler, later, "the program's handler stays installed");
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0, "releases by call still work");
  cr_assert_eq(pool_reserved(), 0);
}

/* The program forks and signals the child at once, before the child's atfork handler can give the signal back.
 * The inherited handler wrote to the parent's eventfd: the child survived the signal (its default action is to
 * end it), and the parent ran a release nobody asked for. */
Test(signal, a_child_signalled_at_once_dies_and_the_parent_does_not_release) {
  init_cuda();
  cache_8mib();
  for (int i = 0; i < 100; i++) {
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
      alarm(30); /* a child that survived the signal ends here, by SIGALRM: the test fails, it does not hang */
      for (;;)
        pause();
    }
    kill(child, SIGUSR1);
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGUSR1, "child %d was not ended by SIGUSR1 (status %#x)", i, st);
  }
  raise(SIGUSR1); /* the one release asked for */
  cr_assert(wait_for_release(0, 30), "no release after SIGUSR1");
  cr_assert_eq(releases(), 1, "the children's signals made the parent release");
  cr_assert_eq(pool_reserved(), 0);
}
