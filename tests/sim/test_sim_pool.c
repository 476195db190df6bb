/* test_sim_pool.c -- stream-ordered allocation: pools, retention, reuse, trim, release at synchronization. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <stdlib.h>

static uint64_t attr(CUmemoryPool p, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  OK(cuMemPoolGetAttribute(p, a, &v));
  return v;
}

static void set_threshold(CUmemoryPool p, uint64_t v) {
  cuuint64_t t = v;
  OK(cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
}

static CUmemoryPool default_pool(int dev) {
  CUmemoryPool p = NULL;
  OK(cuDeviceGetDefaultMemPool(&p, dev));
  cr_assert_not_null(p);
  return p;
}

static CUmemoryPool make_pool(int dev) {
  CUmemPoolProps props = {0};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool p = NULL;
  OK(cuMemPoolCreate(&p, &props));
  return p;
}

Test(sim_pool, default_and_current_pool) {
  sim_primary(0);
  CUmemoryPool d1 = default_pool(0), d2 = default_pool(0), cur = NULL;
  cr_assert_eq(d1, d2, "the default pool handle is stable");
  OK(cuDeviceGetMemPool(&cur, 0));
  cr_assert_eq(cur, d1, "the default pool is the initial current pool");
  CUmemoryPool mine = make_pool(0);
  cr_assert_neq(mine, d1);
  OK(cuDeviceSetMemPool(0, mine));
  OK(cuDeviceGetMemPool(&cur, 0));
  cr_assert_eq(cur, mine);
  CUdeviceptr p;
  OK(cuMemAllocAsync(&p, MiB, NULL));
  cr_assert_eq(sim_block(p, SIMCUDA_ASYNC).pool, mine, "cuMemAllocAsync takes from the current pool");
  cr_assert_eq(attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MiB);
  cr_assert_eq(attr(d1, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
  ERR(cuDeviceSetMemPool(0, (CUmemoryPool)&cur), CUDA_ERROR_INVALID_VALUE);
  ERR(cuDeviceSetMemPool(3, mine), CUDA_ERROR_INVALID_DEVICE);
  ERR(cuDeviceGetDefaultMemPool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuDeviceGetDefaultMemPool(&cur, 2), CUDA_ERROR_INVALID_DEVICE); /* two devices by default */
}

Test(sim_pool, cuda13_pools_by_location) {
  sim_primary(0);
  CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1}, host = {CU_MEM_LOCATION_TYPE_HOST, 0};
  CUmemoryPool def1 = NULL, cur = NULL;
  OK(cuMemGetDefaultMemPool(&def1, &l1, CU_MEM_ALLOCATION_TYPE_PINNED));
  cr_assert_eq(def1, default_pool(1), "the same default pool as cuDeviceGetDefaultMemPool");
  OK(cuMemGetMemPool(&cur, &l1, CU_MEM_ALLOCATION_TYPE_PINNED));
  cr_assert_eq(cur, def1);
  CUmemoryPool mine = make_pool(1);
  OK(cuMemSetMemPool(&l1, CU_MEM_ALLOCATION_TYPE_PINNED, mine));
  OK(cuMemGetMemPool(&cur, &l1, CU_MEM_ALLOCATION_TYPE_PINNED));
  cr_assert_eq(cur, mine);
  OK(cuDeviceGetMemPool(&cur, 1));
  cr_assert_eq(cur, mine, "cuMemSetMemPool on a device's pinned memory is cuDeviceSetMemPool");
  CUcontext c1;
  OK(cuDevicePrimaryCtxRetain(&c1, 1));
  OK(cuCtxSetCurrent(c1));
  CUdeviceptr p;
  OK(cuMemAllocAsync(&p, MiB, NULL));
  cr_assert_eq(sim_block(p, SIMCUDA_ASYNC).pool, mine, "cuMemAllocAsync takes from the pool set current");
  ERR(cuMemSetMemPool(&(CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ALLOCATION_TYPE_PINNED, mine),
      CUDA_ERROR_INVALID_VALUE); /* a pool of another device */
  ERR(cuMemGetMemPool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_NOT_SUPPORTED);
  ERR(cuMemGetDefaultMemPool(&cur, &l1, CU_MEM_ALLOCATION_TYPE_MANAGED), CUDA_ERROR_NOT_SUPPORTED);
  ERR(cuMemGetDefaultMemPool(&cur, &l1, CU_MEM_ALLOCATION_TYPE_INVALID), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemGetDefaultMemPool(&cur, NULL, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemGetDefaultMemPool(NULL, &l1, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemGetMemPool(&cur, &(CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 2}, CU_MEM_ALLOCATION_TYPE_PINNED),
      CUDA_ERROR_INVALID_DEVICE);
  cr_assert_eq(sim_proc("cuMemSetMemPool", 13000, 0), (void *)cuMemSetMemPool);
}

Test(sim_pool, pool_of_another_device_cannot_be_current) {
  setenv("SIMCUDA_DEVICES", "2", 1);
  sim_primary(0);
  CUmemoryPool p1 = make_pool(1);
  ERR(cuDeviceSetMemPool(0, p1), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p;
  OK(cuMemAllocFromPoolAsync(&p, MiB, p1, NULL)); /* but it can be allocated from */
  cr_assert_eq(sim_block(p, SIMCUDA_ASYNC).device, 1);
  cr_assert_eq(sim_stats(1, NULL).pool_reserved_bytes, MiB);
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 0);
}

Test(sim_pool, freed_memory_stays_reserved_and_is_reused) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  CUdeviceptr p[4];
  for (int i = 0; i < 4; i++) OK(cuMemAllocAsync(&p[i], MiB, NULL));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MiB);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 4);
  for (int i = 0; i < 4; i++) OK(cuMemFreeAsync(p[i], NULL));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB, "freed memory stays in the pool");
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MiB, "in use until the stream reaches the frees");
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 0, "but no longer the program's");
  cr_assert_eq(s.pool_reserved_bytes, 4 * MiB);
  cr_assert_eq(s.used_bytes, 4 * MiB, "cached pool memory counts against capacity");
  size_t fr, total;
  OK(cuMemGetInfo(&fr, &total));
  cr_assert_eq(fr, total - 4 * MiB);
  CUdeviceptr q;
  OK(cuMemAllocAsync(&q, MiB, NULL)); /* same stream: the frees before it have run */
  cr_assert_eq(q, p[3], "the pool hands its freed memory out again, the last freed first");
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MiB);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MiB);
  ERR(cuMemFreeAsync(p[0], NULL), CUDA_ERROR_INVALID_VALUE); /* double free */
  ERR(cuMemFree(p[0]), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_pool, trim_releases_unused_memory) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  set_threshold(pool, UINT64_MAX); /* so that the synchronisation below keeps everything */
  CUdeviceptr p[4], keep;
  for (int i = 0; i < 4; i++) OK(cuMemAllocAsync(&p[i], 2 * MiB, NULL));
  OK(cuMemAllocAsync(&keep, MiB, NULL));
  for (int i = 0; i < 4; i++) OK(cuMemFreeAsync(p[i], NULL));
  OK(cuStreamSynchronize(NULL));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 9 * MiB);
  OK(cuMemPoolTrimTo(pool, 5 * MiB));
  uint64_t r = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  cr_assert_leq(r, 5 * MiB);
  cr_assert_geq(r, MiB);
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), MiB, "memory in use is never trimmed");
  cr_assert_eq(sim_stats(0, NULL).used_bytes, MiB);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 9 * MiB);
  ERR(cuMemPoolTrimTo((CUmemoryPool)&r, 0), CUDA_ERROR_INVALID_VALUE);
}

/* A stream-ordered free takes effect when the stream reaches it: until some synchronisation covers that stream,
 * a trim cannot return the memory. */
Test(sim_pool, frees_take_effect_at_the_stream_s_synchronisation) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  set_threshold(pool, UINT64_MAX);
  CUstream s1, s2, nb;
  OK(cuStreamCreate(&s1, 0));
  OK(cuStreamCreate(&s2, 0));
  OK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a, b, c;
  OK(cuMemAllocAsync(&a, 2 * MiB, s1));
  OK(cuMemAllocAsync(&b, 4 * MiB, s2));
  OK(cuMemAllocAsync(&c, 8 * MiB, nb));
  OK(cuMemFreeAsync(a, s1));
  OK(cuMemFreeAsync(b, s2));
  OK(cuMemFreeAsync(c, nb));
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 14 * MiB, "no free has run yet");
  OK(cuStreamSynchronize(s1));
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 12 * MiB, "s1's free ran, only s1's");
  OK(cuStreamSynchronize(NULL)); /* the legacy stream waits for blocking streams, not for nb */
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  OK(cuStreamDestroy(nb)); /* its free still runs, at the context's next synchronisation */
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB);
  OK(cuCtxSynchronize());
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);

  /* per-thread default stream; a context's destruction runs its streams' frees */
  typedef CUresult (*free_fn)(CUdeviceptr, CUstream);
  typedef CUresult (*sync_fn)(CUstream);
  free_fn f_pt = (free_fn)sim_proc("cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  sync_fn s_pt = (sync_fn)sim_proc("cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  OK(cuMemAllocAsync(&a, 2 * MiB, CU_STREAM_PER_THREAD));
  OK(f_pt(a, NULL)); /* _ptsz: stream 0 is the per-thread default stream */
  OK(cuStreamSynchronize(NULL));
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * MiB, "the legacy stream is another stream");
  OK(s_pt(NULL));
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CUcontext mine;
  OK(cuCtxCreate(&mine, NULL, 0, 0));
  OK(cuStreamCreate(&s1, 0));
  OK(cuMemAllocAsync(&a, 2 * MiB, s1));
  OK(cuMemFreeAsync(a, s1));
  OK(cuCtxDestroy(mine));
  OK(cuMemPoolTrimTo(pool, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  ERR(cuMemFreeAsync(a, NULL), CUDA_ERROR_INVALID_VALUE); /* freed already */
}

Test(sim_pool, release_at_synchronization_follows_the_threshold) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  CUstream s;
  OK(cuStreamCreate(&s, 0));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0, "default threshold is 0");
  CUdeviceptr p, q;
  OK(cuMemAllocAsync(&p, 8 * MiB, s));
  OK(cuMemFreeAsync(p, s));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB, "kept until a synchronization");
  OK(cuStreamSynchronize(s));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0, "threshold 0: released at sync");

  set_threshold(pool, UINT64_MAX); /* what PyTorch's cudaMallocAsync backend does */
  OK(cuMemAllocAsync(&p, 8 * MiB, s));
  OK(cuMemFreeAsync(p, s));
  OK(cuStreamSynchronize(s));
  OK(cuCtxSynchronize());
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * MiB, "threshold max: nothing released");

  set_threshold(pool, 3 * MiB);
  OK(cuMemAllocAsync(&p, 2 * MiB, s));
  OK(cuMemAllocAsync(&q, 2 * MiB, s));
  OK(cuMemFreeAsync(p, s));
  OK(cuMemFreeAsync(q, s));
  OK(cuCtxSynchronize());
  cr_assert_leq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * MiB, "released down to the threshold");
}

Test(sim_pool, other_synchronizations_release_too) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  CUdeviceptr p;
  OK(cuMemAllocAsync(&p, MiB, NULL));
  OK(cuMemFreeAsync(p, NULL));
  OK(cuStreamSynchronize(CU_STREAM_LEGACY));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  OK(cuMemAllocAsync(&p, MiB, NULL));
  OK(cuMemFreeAsync(p, NULL));
  CUresult (*sync_v2)(CUcontext) = sim_proc("cuCtxSynchronize", 13000, 0);
  OK(sync_v2(NULL));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  /* cuMemFree of a stream-ordered block synchronizes: the block goes back and is released */
  OK(cuMemAllocAsync(&p, MiB, NULL));
  OK(cuMemFree(p));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
}

Test(sim_pool, free_async_of_a_plain_block) {
  sim_primary(0);
  CUdeviceptr p;
  OK(cuMemAlloc(&p, MiB));
  OK(cuMemFreeAsync(p, NULL));
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.pool_reserved_bytes, 0, "a cuMemAlloc block does not join a pool");
  ERR(cuMemFreeAsync(p, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemFreeAsync(0, NULL), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_pool, attributes) {
  sim_primary(0);
  CUmemoryPool pool = make_pool(0);
  int flag = -1;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  cr_assert_eq(flag, 1);
  flag = 0;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  flag = -1;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
  cr_assert_eq(flag, 0);
  set_threshold(pool, 12345);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 12345);
  CUdeviceptr a, b;
  OK(cuMemAllocFromPoolAsync(&a, 4 * MiB, pool, NULL));
  OK(cuMemAllocFromPoolAsync(&b, 4 * MiB, pool, NULL));
  OK(cuMemFreeAsync(a, NULL));
  OK(cuStreamSynchronize(NULL));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 8 * MiB);
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MiB);
  cuuint64_t zero = 0, one = 1;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 4 * MiB, "a reset brings the mark to the current value");
  OK(cuMemPoolTrimTo(pool, 0));
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 4 * MiB);
  ERR(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &one), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &zero), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolSetAttribute(pool, (CUmemPool_attribute)99, &zero), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolGetAttribute(pool, (CUmemPool_attribute)99, &zero), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolGetAttribute(NULL, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_pool, create_and_destroy) {
  sim_primary(0);
  CUmemPoolProps props = {0};
  CUmemoryPool p = NULL;
  ERR(cuMemPoolCreate(&p, &props), CUDA_ERROR_INVALID_VALUE); /* allocType must be pinned */
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 2;
  ERR(cuMemPoolCreate(&p, &props), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolCreate(NULL, &props), CUDA_ERROR_INVALID_VALUE);
  cr_assert_null(p);
  CUmemoryPool pool = make_pool(0);
  OK(cuDeviceSetMemPool(0, pool));
  CUdeviceptr live, cached;
  OK(cuMemAllocAsync(&live, 2 * MiB, NULL));
  OK(cuMemAllocAsync(&cached, 4 * MiB, NULL));
  set_threshold(pool, UINT64_MAX);
  OK(cuMemFreeAsync(cached, NULL));
  OK(cuStreamSynchronize(NULL));
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 6 * MiB);
  OK(cuMemPoolDestroy(pool));
  CUmemoryPool cur;
  OK(cuDeviceGetMemPool(&cur, 0));
  cr_assert_eq(cur, default_pool(0), "the device falls back to its default pool");
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 2 * MiB, "cached memory released, live block kept");
  cr_assert_eq(sim_count_blocks(SIMCUDA_ASYNC, live), 1);
  CUdeviceptr q;
  ERR(cuMemAllocFromPoolAsync(&q, MiB, pool, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
  OK(cuMemFreeAsync(live, NULL)); /* freed after its pool: the memory goes back once the free ran */
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 2 * MiB);
  OK(cuStreamSynchronize(NULL));
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 0);
  ERR(cuMemPoolDestroy(default_pool(0)), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_pool, max_size_limits_a_pool) {
  sim_primary(0);
  CUmemPoolProps props = {0};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.maxSize = 8 * MiB;
  CUmemoryPool pool;
  OK(cuMemPoolCreate(&pool, &props));
  CUdeviceptr a, b, c = 0;
  OK(cuMemAllocFromPoolAsync(&a, 4 * MiB, pool, NULL));
  OK(cuMemAllocFromPoolAsync(&b, 4 * MiB, pool, NULL));
  ERR(cuMemAllocFromPoolAsync(&c, MiB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(c, 0);
}

Test(sim_pool, a_full_device_makes_the_pool_reuse_what_it_caches) {
  setenv("SIMCUDA_DEVICE_MEM", "64M", 1);
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  set_threshold(pool, UINT64_MAX);
  CUdeviceptr p[3], big, plain = 0;
  for (int i = 0; i < 3; i++) OK(cuMemAllocAsync(&p[i], 16 * MiB, NULL));
  for (int i = 0; i < 3; i++) OK(cuMemFreeAsync(p[i], NULL));
  ERR(cuMemAlloc(&plain, 32 * MiB), CUDA_ERROR_OUT_OF_MEMORY); /* the pool holds 48 of 64 MiB */
  cr_assert_eq(plain, 0);
  OK(cuMemAllocAsync(&big, 32 * MiB, NULL)); /* another size: the pool gives back its cache first */
  cr_assert_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 32 * MiB);
  CUdeviceptr more = 0;
  ERR(cuMemAllocAsync(&more, 48 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(more, 0);
}

Test(sim_pool, per_thread_variants_and_bad_arguments) {
  sim_primary(0);
  typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t, CUstream);
  typedef CUresult (*free_fn)(CUdeviceptr, CUstream);
  alloc_fn a_pt = (alloc_fn)sim_proc("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  free_fn f_pt = (free_fn)sim_proc("cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  CUdeviceptr p;
  OK(a_pt(&p, MiB, CU_STREAM_PER_THREAD));
  cr_assert_eq(simcuda_calls("cuMemAllocAsync_ptsz"), 1);
  cr_assert_eq(simcuda_calls("cuMemAllocAsync"), 0);
  OK(f_pt(p, CU_STREAM_PER_THREAD));
  cr_assert_eq(simcuda_calls("cuMemFreeAsync_ptsz"), 1);
  CUdeviceptr q = 0x77;
  ERR(cuMemAllocAsync(&q, MiB, (CUstream)&q), CUDA_ERROR_INVALID_HANDLE);
  ERR(cuMemAllocAsync(NULL, MiB, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAllocAsync(&q, 0, NULL), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAllocFromPoolAsync(&q, MiB, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(q, 0x77);
  OK(cuCtxSetCurrent(NULL));
  ERR(cuMemAllocAsync(&q, MiB, NULL), CUDA_ERROR_INVALID_CONTEXT);
}

Test(sim_pool, stats_match_the_pool_attributes) {
  sim_primary(0);
  CUmemoryPool pool = default_pool(0);
  CUdeviceptr a, b;
  OK(cuMemAllocAsync(&a, 1000, NULL));
  OK(cuMemAllocAsync(&b, 5 * MiB + 1, NULL));
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.live_bytes, 1000 + 5 * MiB + 1, "live bytes are the requested sizes");
  cr_assert_eq(s.pool_used_bytes, attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  cr_assert_eq(s.pool_reserved_bytes, attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  cr_assert_geq(s.pool_reserved_bytes, s.live_bytes);
  cr_assert_eq(s.used_bytes, s.pool_reserved_bytes);
  OK(cuMemFreeAsync(a, NULL));
  OK(cuMemFreeAsync(b, NULL));
  s = sim_stats(0, NULL);
  cr_assert_eq(s.live_bytes, 0);
  cr_assert_eq(s.pool_used_bytes, attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
  cr_assert_neq(s.pool_used_bytes, 0, "the frees have not run yet");
  OK(cuStreamSynchronize(NULL));
  s = sim_stats(0, NULL);
  cr_assert_eq(s.pool_used_bytes, 0);
  cr_assert_eq(s.pool_reserved_bytes, attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
}
