/* test_sim_ctx.c -- primary and explicit contexts, the per-thread stack, and what their end frees. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include "../common/threads.h"

#include <pthread.h>
#include <stdlib.h>

typedef CUresult (*dev_fn)(CUdevice);

Test(sim_ctx, primary_retain_release_frees_on_final_release) {
  OK(cuInit(0));
  CUcontext a = NULL, b = NULL;
  unsigned flags = 99;
  int active = -1;
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  cr_assert_eq(active, 0);
  cr_assert_eq(sim_stats(0, NULL).contexts, 0);
  OK(cuDevicePrimaryCtxRetain(&a, 0));
  OK(cuDevicePrimaryCtxRetain(&b, 0));
  cr_assert_eq(a, b, "one primary context per device");
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  cr_assert_eq(active, 1);
  cr_assert_eq(sim_stats(0, NULL).contexts, 1);
  OK(cuCtxSetCurrent(a));
  CUdeviceptr p;
  void *h;
  OK(cuMemAlloc(&p, MiB));
  OK(cuMemHostAlloc(&h, 4096, 0));
  OK(cuDevicePrimaryCtxRelease(0)); /* one reference left: nothing freed */
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 1);
  cr_assert_eq(sim_stats(0, NULL).host_blocks, 1);
  OK(cuDevicePrimaryCtxRelease(0)); /* final release destroys it and its memory */
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.host_blocks, 0);
  cr_assert_eq(s.used_bytes, 0);
  cr_assert_eq(s.contexts, 0);
  cr_assert_eq(sim_count_blocks(0, 0), 0);
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  cr_assert_eq(active, 0);
  ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  /* still current on this thread, but destroyed */
  ERR(cuMemAlloc(&p, MiB), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ERR(cuDevicePrimaryCtxRetain(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuDevicePrimaryCtxRetain(&a, 2), CUDA_ERROR_INVALID_DEVICE); /* two devices by default */
  OK(cuDevicePrimaryCtxRetain(&b, 0)); /* re-activates the same handle */
  cr_assert_eq(a, b);
  OK(cuMemAlloc(&p, MiB));
}

Test(sim_ctx, primary_reset_frees_at_once_and_keeps_the_retain_count) {
  CUcontext c = sim_primary(0);
  CUdeviceptr p, q;
  OK(cuMemAlloc(&p, MiB));
  OK(cuMemAllocAsync(&q, MiB, NULL));
  OK(cuDevicePrimaryCtxReset(0));
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.contexts, 0);
  cr_assert_eq(s.pool_used_bytes, 0);
  cr_assert_eq(s.pool_reserved_bytes, MiB, "a stream-ordered block goes back to its pool");
  int active = 1;
  unsigned flags;
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  cr_assert_eq(active, 0);
  ERR(cuMemAlloc(&p, MiB), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ERR(cuMemFree(p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUcontext again;
  OK(cuDevicePrimaryCtxRetain(&again, 0));
  cr_assert_eq(again, c);
  OK(cuMemAlloc(&p, MiB));
  /* reset did not release: two references are held, both releases succeed, a third fails */
  OK(cuDevicePrimaryCtxRelease(0));
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 1);
  OK(cuDevicePrimaryCtxRelease(0));
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
}

Test(sim_ctx, v1_and_v2_primary_entry_points_behave_alike) {
  sim_primary(0);
  dev_fn reset_v1 = (dev_fn)sim_dlsym("cuDevicePrimaryCtxReset");
  dev_fn release_v1 = (dev_fn)sim_dlsym("cuDevicePrimaryCtxRelease");
  cr_assert(reset_v1 && release_v1);
  cr_assert_neq((void *)reset_v1, (void *)cuDevicePrimaryCtxReset, "v1 and _v2 are distinct symbols");
  CUdeviceptr p;
  OK(cuMemAlloc(&p, MiB));
  uint64_t v2_calls = simcuda_calls("cuDevicePrimaryCtxReset_v2");
  OK(reset_v1(0));
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxReset"), 1);
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxReset_v2"), v2_calls);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  OK(release_v1(0));
  ERR(release_v1(0), CUDA_ERROR_INVALID_CONTEXT);
}

Test(sim_ctx, explicit_context_create_destroy) {
  OK(cuInit(0));
  CUcontext c = NULL, cur = NULL;
  OK(cuCtxCreate(&c, NULL, 0, 0)); /* cuCtxCreate_v4 */
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, c, "a new context is current on the creating thread");
  cr_assert_eq(sim_stats(0, NULL).contexts, 1);
  CUdeviceptr p, q;
  void *h;
  CUstream s;
  OK(cuMemAlloc(&p, 2 * MiB));
  OK(cuMemHostAlloc(&h, 100, 0));
  OK(cuStreamCreate(&s, 0));
  OK(cuMemAllocAsync(&q, 4 * MiB, s));
  simcuda_stats_t st = sim_stats(0, c);
  cr_assert_eq(st.live_blocks, 2);
  cr_assert_eq(st.host_blocks, 1);
  cr_assert_eq(st.pool_used_bytes, 4 * MiB);
  OK(cuCtxDestroy(c));
  OK(cuCtxGetCurrent(&cur));
  cr_assert_null(cur, "destroying the current context pops it");
  st = sim_stats(0, NULL);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(st.host_blocks, 0);
  cr_assert_eq(st.contexts, 0);
  cr_assert_eq(st.pool_reserved_bytes, 4 * MiB, "its stream-ordered block went back to the pool");
  cr_assert_eq(st.pool_used_bytes, 0);
  cr_assert_eq(sim_count_blocks(0, 0), 0);
  ERR(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
  ERR(simcuda_stats(0, c, &st), CUDA_ERROR_INVALID_CONTEXT);
  ERR(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE); /* its streams went with it */
  ERR(cuCtxDestroy(NULL), CUDA_ERROR_INVALID_VALUE);
  CUcontext prim;
  OK(cuDevicePrimaryCtxRetain(&prim, 0));
  ERR(cuCtxDestroy(prim), CUDA_ERROR_INVALID_CONTEXT);
  ERR(cuCtxCreate(NULL, NULL, 0, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuCtxCreate(&c, NULL, 0, 4), CUDA_ERROR_INVALID_DEVICE);
}

Test(sim_ctx, older_create_abis) {
  OK(cuInit(0));
  typedef CUresult (*create_v2)(CUcontext *, unsigned, CUdevice);
  typedef CUresult (*create_v3)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice);
  create_v2 v1 = (create_v2)sim_proc("cuCtxCreate", 2000, 0);
  create_v2 v2 = (create_v2)sim_proc("cuCtxCreate", 3020, 0);
  create_v3 v3 = (create_v3)sim_proc("cuCtxCreate", 11040, 0);
  CUcontext a, b, c;
  OK(v1(&a, 0, 0));
  OK(v2(&b, 0, 0));
  OK(v3(&c, NULL, 0, 0, 0));
  ERR(v3(&c, NULL, 2, 0, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert(a != b && b != c);
  cr_assert_eq(simcuda_calls("cuCtxCreate"), 1);
  cr_assert_eq(simcuda_calls("cuCtxCreate_v2"), 1);
  cr_assert_eq(simcuda_calls("cuCtxCreate_v3"), 2);
  cr_assert_eq(sim_stats(0, NULL).contexts, 3);
  CUcontext top;
  OK(cuCtxPopCurrent(&top));
  cr_assert_eq(top, c);
  OK(cuCtxPopCurrent(&top));
  cr_assert_eq(top, b);
}

Test(sim_ctx, the_context_stack) {
  OK(cuInit(0));
  CUcontext a, b, cur = (CUcontext)0x1;
  OK(cuCtxGetCurrent(&cur));
  cr_assert_null(cur);
  ERR(cuCtxPopCurrent(&cur), CUDA_ERROR_INVALID_CONTEXT);
  OK(cuCtxSetCurrent(NULL)); /* no-op on an empty stack */
  OK(cuCtxCreate(&a, NULL, 0, 0));
  OK(cuCtxCreate(&b, NULL, 0, 0)); /* stack: a b */
  OK(cuCtxPopCurrent(&cur));
  cr_assert_eq(cur, b);
  OK(cuCtxPushCurrent(b)); /* a b */
  OK(cuCtxSetCurrent(a));  /* a a */
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, a);
  OK(cuCtxSetCurrent(NULL)); /* a */
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, a);
  OK(cuCtxPopCurrent(NULL));
  OK(cuCtxGetCurrent(&cur));
  cr_assert_null(cur);
  ERR(cuCtxPushCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuCtxPushCurrent((CUcontext)&cur), CUDA_ERROR_INVALID_CONTEXT);
  ERR(cuCtxSetCurrent((CUcontext)&cur), CUDA_ERROR_INVALID_CONTEXT);
  CUdevice d = -1;
  ERR(cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
  ERR(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(d, -1);
}

Test(sim_ctx, blocks_belong_to_the_context_current_at_allocation) {
  OK(cuInit(0));
  CUcontext a, b;
  OK(cuCtxCreate(&a, NULL, 0, 0));
  CUstream sa;
  OK(cuStreamCreate(&sa, 0));
  CUdeviceptr pa, pb, qa;
  OK(cuMemAlloc(&pa, MiB));
  OK(cuCtxCreate(&b, NULL, 0, 0));
  OK(cuMemAlloc(&pb, MiB));
  OK(cuMemAllocAsync(&qa, MiB, sa)); /* stream-ordered: the stream's context, not the current one */
  cr_assert_eq(sim_block(pa, SIMCUDA_DEVICE).ctx, a);
  cr_assert_eq(sim_block(pb, SIMCUDA_DEVICE).ctx, b);
  cr_assert_eq(sim_block(qa, SIMCUDA_ASYNC).ctx, a);
  cr_assert_eq(sim_stats(0, a).live_blocks, 2);
  cr_assert_eq(sim_stats(0, b).live_blocks, 1);
  OK(cuCtxDestroy(b));
  cr_assert_eq(sim_count_blocks(0, pb), 0);
  cr_assert_eq(sim_count_blocks(0, pa), 1);
  cr_assert_eq(sim_count_blocks(0, qa), 1);
  /* freeing works from any context, as with unified addressing */
  CUcontext other;
  OK(cuCtxCreate(&other, NULL, 0, 0));
  OK(cuMemFree(pa));
  cr_assert_eq(sim_stats(0, a).live_blocks, 1);
}

Test(sim_ctx, get_device_and_synchronize) {
  setenv("SIMCUDA_DEVICES", "2", 1);
  OK(cuInit(0));
  CUcontext c0, c1;
  OK(cuCtxCreate(&c0, NULL, 0, 0));
  OK(cuCtxCreate(&c1, NULL, 0, 1));
  CUdevice d = -1;
  OK(cuCtxGetDevice(&d));
  cr_assert_eq(d, 1);
  CUresult (*get_v2)(CUdevice *, CUcontext) = sim_proc("cuCtxGetDevice", 13000, 0);
  OK(get_v2(&d, c0));
  cr_assert_eq(d, 0);
  OK(get_v2(&d, NULL));
  cr_assert_eq(d, 1);
  CUresult (*sync_v2)(CUcontext) = sim_proc("cuCtxSynchronize", 13000, 0);
  OK(sync_v2(c0));
  OK(cuCtxSynchronize());
  OK(cuCtxDestroy(c0));
  ERR(get_v2(&d, c0), CUDA_ERROR_INVALID_CONTEXT);
  ERR(sync_v2(c0), CUDA_ERROR_INVALID_CONTEXT);
  CUdeviceptr p;
  OK(cuMemAlloc(&p, MiB));
  cr_assert_eq(sim_stats(1, NULL).live_blocks, 1);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  cr_assert_eq(sim_stats(0, c1).live_blocks, 0, "ctx on device 1 filtered by device 0: nothing");
  cr_assert_eq(sim_stats(-1, c1).live_blocks, 1);
}

static void *other_thread(void *arg) {
  CUcontext c = arg;
  CUdeviceptr p;
  CUcontext cur = (CUcontext)0x1;
  cr_assert_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  cr_assert_null(cur, "a new thread has no current context");
  cr_assert_eq(cuMemAlloc(&p, MiB), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(cuCtxPushCurrent(c), CUDA_SUCCESS);
  return NULL;
}

Test(sim_ctx, current_context_is_per_thread) {
  OK(cuInit(0));
  CUcontext c;
  OK(cuCtxCreate(&c, NULL, 0, 0));
  gr_thread_run(other_thread, c);
  CUcontext cur;
  OK(cuCtxGetCurrent(&cur));
  cr_assert_eq(cur, c, "another thread's push does not change ours");
  OK(cuCtxDestroy(c));
  ERR(cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
}

struct two_ctx {
  CUcontext c;
  pthread_barrier_t *bar;
  CUresult after;
};

static void *hold_current(void *arg) {
  struct two_ctx *t = arg;
  CUdeviceptr p;
  cuCtxSetCurrent(t->c);
  pthread_barrier_wait(t->bar); /* current here */
  pthread_barrier_wait(t->bar); /* destroyed by the main thread */
  t->after = cuMemAlloc(&p, MiB);
  return NULL;
}

Test(sim_ctx, destroyed_while_current_elsewhere) {
  OK(cuInit(0));
  CUcontext c;
  OK(cuCtxCreate(&c, NULL, 0, 0));
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  struct two_ctx t = {.c = c, .bar = &bar};
  pthread_t th;
  th = gr_thread_start(hold_current, &t);
  pthread_barrier_wait(&bar);
  OK(cuCtxDestroy(c));
  pthread_barrier_wait(&bar);
  gr_thread_join(th);
  pthread_barrier_destroy(&bar);
  cr_assert_eq(t.after, CUDA_ERROR_CONTEXT_IS_DESTROYED);
}
