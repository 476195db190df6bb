/* Contexts that go while a release runs (found by an adversarial pass): a release must never free a block of a
 * context that is still alive, and records of a destroyed context must leave the table. Both races are timing
 * dependent; before the context lock each test failed in most runs. */
#include "harness.h"

#include "../common/rng.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)

static void orphans(size_t n, size_t size) {
  uint64_t s = gpureclaim_scope_begin();
  cr_assert_neq(s, 0);
  for (size_t i = 0; i < n; i++) {
    CUdeviceptr p;
    OK(cuMemAlloc(&p, size));
  }
  cr_assert_eq(gpureclaim_scope_end(s, 0), 0);
}

static atomic_int g_go, g_released;

static void *release_orphans(void *arg) {
  gpureclaim_report_t *rep = arg;
  while (!atomic_load(&g_go))
    ;
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, rep), 0);
  atomic_store(&g_released, 1);
  return NULL;
}

#define N 8000

/* A release frees context A's orphans while the program destroys A and allocates in B: the driver may hand A's
 * addresses to B, and the release must not free B's blocks at them. */
Test(ctx_race, a_context_destroyed_during_a_release) {
  CUdevice dev;
  CUcontext a, b;
  OK(cuInit(0));
  OK(cuDeviceGet(&dev, 0));
  OK(cuCtxCreate_v2(&b, 0, dev));
  OK(cuCtxPopCurrent(NULL));
  OK(cuCtxCreate_v2(&a, 0, dev));
  orphans(N, 4096);
  OK(cuCtxPopCurrent(NULL));
  gpureclaim_report_t rep = {.size = sizeof rep};
  pthread_t t;
  t = gr_thread_start(release_orphans, &rep);
  /* Read before the release may begin: read after, on a loaded machine the release could have freed them all
   * already, and the wait below never ended (seen once: the test hung until ctest's timeout). */
  uint64_t start = h_sim(-1, a).live_blocks;
  atomic_store(&g_go, 1);
  while (h_sim(-1, a).live_blocks == start && !atomic_load(&g_released)) /* the release has begun to free */
    ;
  OK(cuCtxDestroy(a));
  OK(cuCtxPushCurrent(b));
  static CUdeviceptr mine[N];
  for (size_t i = 0; i < N; i++)
    OK(cuMemAlloc(&mine[i], 4096));
  gr_thread_join(t);
  cr_assert_eq(h_sim(-1, b).live_blocks, N, "the release freed none of B's blocks");
  cr_assert_eq(rep.failed_blocks, 0);
  cr_assert_eq(h_grs(-1).orphan_blocks, 0, "A's orphans were freed or went with A");
  cr_assert(h_table_matches_sim("after the race"));
  rep = (gpureclaim_report_t){.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_ORPHANED, &rep), 0);
  cr_assert_eq(rep.orphaned_blocks, 0);
  cr_assert_eq(h_sim(-1, b).live_blocks, N);
  for (size_t i = 0; i < N; i++)
    OK(cuMemFree(mine[i]));
}

static pthread_barrier_t g_bar;

static void *retain_primary(void *arg) {
  int n = *(const int *)arg; /* how long to wait after the barrier: random, so the race goes either way */
  CUcontext c;
  pthread_barrier_wait(&g_bar);
  for (volatile int i = 0; i < n; i++)
    ;
  OK(cuDevicePrimaryCtxRetain(&c, 0));
  return NULL;
}

/* The final cuDevicePrimaryCtxRelease destroys the primary context and its blocks; a retain on another thread
 * creates it again. Whichever comes first, gpureclaim's records must match the driver's blocks afterwards. */
Test(ctx_race, a_retain_racing_the_final_primary_release, .timeout = 120) {
  OK(cuInit(0));
  uint64_t s = gr_rng_stream(7);
  for (int it = 0; it < 60; it++) {
    CUcontext c;
    OK(cuDevicePrimaryCtxRetain(&c, 0));
    OK(cuCtxSetCurrent(c));
    orphans(1024, 4096);
    cr_assert_eq(pthread_barrier_init(&g_bar, NULL, 2), 0);
    pthread_t t;
    int wait = (int)gr_rng_below(&s, 100000);
    t = gr_thread_start(retain_primary, &wait);
    pthread_barrier_wait(&g_bar);
    OK(cuDevicePrimaryCtxRelease(0));
    gr_thread_join(t);
    pthread_barrier_destroy(&g_bar);
    cr_assert(h_table_matches_sim("after the race"), "iteration %d", it);
    cr_assert_eq(h_grs(-1).orphan_blocks, h_sim(-1, NULL).live_blocks, "iteration %d", it);
    OK(cuDevicePrimaryCtxRelease(0)); /* the other thread's retain: now the context goes */
    cr_assert_eq(h_sim(-1, NULL).live_blocks, 0);
    cr_assert_eq(h_grs(-1).orphan_blocks, 0, "iteration %d", it);
  }
}

/* Threads allocate in a context while another destroys it (a program breaking CUDA's rules). An allocation whose
 * driver call returned before the destroy but whose record went in after the destroy looked at the table left a
 * record for a block the driver had freed with the context: afterwards, every record must be of a live block. */
typedef struct {
  CUcontext ctx;
  atomic_int started;
} alloc_in_t;

static void *alloc_until_gone(void *arg) {
  alloc_in_t *a = arg;
  if (cuCtxSetCurrent(a->ctx) != CUDA_SUCCESS)
    return NULL;
  CUdeviceptr p;
  for (int i = 0; i < 200000 && cuMemAlloc(&p, 512) == CUDA_SUCCESS; i++)
    if (i == 16)
      atomic_fetch_add(&a->started, 1);
  return NULL;
}

Test(ctx_race, allocations_racing_a_successful_destroy_leave_no_records, .timeout = 300) {
  CUdevice dev;
  OK(cuInit(0));
  OK(cuDeviceGet(&dev, 0));
  enum { THREADS = 3, ROUNDS = 40 };
  for (int round = 0; round < ROUNDS; round++) {
    alloc_in_t a = {0};
    OK(cuCtxCreate_v2(&a.ctx, 0, dev));
    OK(cuCtxPopCurrent(NULL));
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
      t[i] = gr_thread_start(alloc_until_gone, &a);
    while (atomic_load(&a.started) < THREADS)
      sched_yield();
    OK(cuCtxDestroy(a.ctx));
    for (int i = 0; i < THREADS; i++)
      gr_thread_join(t[i]);
    cr_assert_eq(h_sim(-1, NULL).live_blocks, 0, "round %d: the driver freed the context's blocks", round);
    cr_assert_eq(h_grs(-1).live_blocks, 0, "round %d: no record outlived its block", round);
  }
  cr_assert(h_table_matches_sim("after the races"));
}
