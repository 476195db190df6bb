/* Route 4 (shared runtime: attribution by the runtime hooks) and the runtime's own route to the driver
 * (cuGetProcAddress), through the simulated libcudart.so.13 or, compiled with STATIC_CUDART, the static
 * archive (nvcc's default): then no runtime hook sees the call and the driver hooks attribute the block to
 * this binary. */
#include "harness.h"

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <string.h>

#ifdef STATIC_CUDART
#define SUITE route_static_runtime
#define EXPECT_API "cuMemAlloc_v2"
#else
#define SUITE route_shared_runtime
#define EXPECT_API "cudaMalloc"
#endif

#define RT_OK(call) cr_assert_eq((call), cudaSuccess, "%s", #call)

Test(SUITE, runtime_calls_tracked_and_attributed) {
  void *d = NULL, *p = NULL, *m = NULL, *h = NULL, *h2 = NULL;
  size_t pitch = 0;
  RT_OK(cudaMalloc(&d, 1 << 20));
  cr_assert(h_table_matches_sim("cudaMalloc"));
  gpureclaim_block_t b;
  cr_assert(h_find((uint64_t)(uintptr_t)d, &b));
  cr_assert_str_eq(b.api, EXPECT_API);
  cr_assert_not_null(strstr(b.library, "test_route"), "attributed to %s", b.library);
  cr_assert_eq(b.kind, GPURECLAIM_KIND_DEVICE);
  RT_OK(cudaMallocPitch(&p, &pitch, 100, 10));
  RT_OK(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal));
  RT_OK(cudaMallocHost(&h, 8192));
  RT_OK(cudaHostAlloc(&h2, 4096, cudaHostAllocDefault));
  cr_assert(h_table_matches_sim("every runtime allocation"));
#ifndef STATIC_CUDART
  cr_assert(h_find((uint64_t)(uintptr_t)h, &b));
  cr_assert_str_eq(b.api, "cudaMallocHost");
  cr_assert(h_find((uint64_t)(uintptr_t)m, &b));
  cr_assert_str_eq(b.api, "cudaMallocManaged");
#endif
  RT_OK(cudaFree(d));
  RT_OK(cudaFree(p));
  RT_OK(cudaFree(m));
  RT_OK(cudaFreeHost(h));
  RT_OK(cudaFreeHost(h2));
  RT_OK(cudaFree(NULL));
  cr_assert(h_table_matches_sim("runtime frees"));
  cr_assert_eq(h_count(0), 0);
}

Test(SUITE, stream_ordered_and_pools) {
  cudaStream_t s;
  RT_OK(cudaStreamCreate(&s));
  void *a = NULL, *c = NULL;
  RT_OK(cudaMallocAsync(&a, 100000, s));
  cudaMemPool_t pool;
  RT_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  RT_OK(cudaMallocFromPoolAsync(&c, 5000, pool, s));
  cr_assert(h_table_matches_sim("cudaMallocAsync"));
  gpureclaim_block_t b;
  cr_assert(h_find((uint64_t)(uintptr_t)a, &b));
  cr_assert_eq(b.kind, GPURECLAIM_KIND_ASYNC);
#ifndef STATIC_CUDART
  cr_assert_str_eq(b.api, "cudaMallocAsync");
#endif
  RT_OK(cudaFreeAsync(a, s));
  RT_OK(cudaFreeAsync(c, s));
  cr_assert(h_table_matches_sim("cudaFreeAsync (retained in the pool until a synchronization)"));
  RT_OK(cudaStreamSynchronize(s)); /* threshold 0: the pool releases at the synchronization */
  cr_assert(h_table_matches_sim("after cudaStreamSynchronize"));
  RT_OK(cudaStreamDestroy(s));
}

Test(SUITE, device_reset_drops_everything_and_reinitialises) {
  void *d = NULL, *h = NULL;
  RT_OK(cudaMalloc(&d, 12345));
  RT_OK(cudaMallocHost(&h, 4096));
  cr_assert_eq(h_count(0), 2);
  RT_OK(cudaDeviceReset());
  cr_assert(h_table_matches_sim("cudaDeviceReset"));
  cr_assert_eq(h_count(0), 0);
  gpureclaim_stats_t s = {.size = sizeof s};
  cr_assert_eq(gpureclaim_stats(-1, &s), 0);
  cr_assert_eq(s.ctx_destroyed_blocks, 1, "the device block went with the context");
  RT_OK(cudaMalloc(&d, 100)); /* the runtime initialises again */
  cr_assert(h_table_matches_sim("after re-initialisation"));
  cr_assert_eq(h_count(0), 1);
}
