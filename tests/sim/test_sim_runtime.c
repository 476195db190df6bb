/* test_sim_runtime.c -- the simulated runtime (libcudart.so.13): how it reaches the driver, lazy
 * initialization, sticky last errors, error mapping, and the calls built on the driver. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include "../common/threads.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-thread default stream variants (declared by cuda_runtime_api.h only for nvcc's
 * --default-stream per-thread builds, which rename the plain calls to them). */
extern cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
extern cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
extern cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);

#define RT_OK(call)                                                                                           \
  do {                                                                                                        \
    cudaError_t e_ = (call);                                                                                  \
    cr_assert_eq(e_, cudaSuccess, "%s -> %s", #call, cudaGetErrorName(e_));                                   \
  } while (0)
#define RT_ERR(call, want)                                                                                    \
  do {                                                                                                        \
    cudaError_t e_ = (call);                                                                                  \
    cr_assert_eq(e_, (want), "%s -> %s, expected %s", #call, cudaGetErrorName(e_), #want);                    \
  } while (0)

/* The requests the real CUDA 13.0 runtime makes, in order, from the repository's recording. */
typedef struct req {
  char name[128];
  int version;
  uint64_t flags;
} req_t;

typedef struct reqlist {
  req_t *v;
  size_t n, cap;
} reqlist_t;

static void push_req(reqlist_t *l, const char *s, int v, uint64_t f) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 512;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    cr_assert_not_null(l->v);
  }
  req_t *r = &l->v[l->n++];
  snprintf(r->name, sizeof r->name, "%s", s);
  r->version = v;
  r->flags = f;
}

static void log_req(const char *s, int v, uint64_t f, void *arg) { push_req(arg, s, v, f); }

static reqlist_t recorded_requests(void) {
  reqlist_t l = {0};
  FILE *f = fopen(SIM_REQUESTS, "r");
  cr_assert_not_null(f, "%s", SIM_REQUESTS);
  char line[256], name[128];
  int v;
  unsigned long long fl;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    cr_assert_eq(sscanf(line, "%127s %d %llu", name, &v, &fl), 3, "%s: %s", SIM_REQUESTS, line);
    push_req(&l, strcmp(name, "\"\"") == 0 ? "" : name, v, fl);
  }
  fclose(f);
  return l;
}

static size_t g_not_found;
static void count_not_found(const char *s, int v, uint64_t f, void *arg) {
  (void)arg;
  void *fn = NULL;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  if (cuGetProcAddress(s, &fn, v, f, &st) == CUDA_ERROR_NOT_FOUND && st != CU_GET_PROC_ADDRESS_SUCCESS)
    g_not_found++;
}

Test(sim_runtime, asks_cuGetProcAddress_exactly_what_the_real_runtime_asks) {
  cr_assert_eq(simcuda_procaddr_requests(NULL, NULL), 0);
  uint64_t allocs = simcuda_calls("cuMemAlloc_v2");
  void *p = NULL;
  RT_OK(cudaMalloc(&p, MiB));
  cr_assert_not_null(p);
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), allocs + 1, "cudaMalloc is one cuMemAlloc_v2 call");
  cr_assert_eq(simcuda_calls("cuGetProcAddress_v2"), simcuda_procaddr_requests(NULL, NULL),
               "every look-up went through cuGetProcAddress_v2");
  reqlist_t want = recorded_requests(), got = {0};
  cr_assert_gt(want.n, 400);
  simcuda_procaddr_requests(log_req, &got);
  for (size_t i = 0; i < want.n && i < got.n; i++)
    cr_assert(strcmp(want.v[i].name, got.v[i].name) == 0 && want.v[i].version == got.v[i].version &&
                  want.v[i].flags == got.v[i].flags,
              "request %zu: %s@%d flags %llu, the real runtime asks %s@%d flags %llu", i, got.v[i].name,
              got.v[i].version, (unsigned long long)got.v[i].flags, want.v[i].name, want.v[i].version,
              (unsigned long long)want.v[i].flags);
  cr_assert_eq(got.n, want.n, "%zu requests, the real runtime makes %zu", got.n, want.n);
  cr_assert_str_eq(got.v[0].name, "", "first an empty-name probe");
  /* Most of them name what the simulated driver lacks: answered CUDA_ERROR_NOT_FOUND, and tolerated. */
  uint64_t n = simcuda_procaddr_requests(NULL, NULL);
  simcuda_procaddr_requests(count_not_found, NULL);
  cr_assert_gt(g_not_found, 300, "%zu", g_not_found);
  RT_OK(cudaFree(p));
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), 1);
  free(want.v);
  free(got.v);
  cr_assert_eq(simcuda_calls("cuGetProcAddress_v2"), n + n, "resolved once, at init (then the test's own)");
}

Test(sim_runtime, cuda13_pools_by_location) {
  struct cudaMemLocation l1 = {cudaMemLocationTypeDevice, 1};
  cudaMemPool_t def = NULL, cur = NULL, mine = NULL;
  RT_OK(cudaMemGetDefaultMemPool(&def, &l1, cudaMemAllocationTypePinned));
  RT_OK(cudaDeviceGetDefaultMemPool(&cur, 1));
  cr_assert_eq(def, cur);
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location = l1;
  RT_OK(cudaMemPoolCreate(&mine, &props));
  RT_OK(cudaMemSetMemPool(&l1, cudaMemAllocationTypePinned, mine));
  RT_OK(cudaMemGetMemPool(&cur, &l1, cudaMemAllocationTypePinned));
  cr_assert_eq(cur, mine);
  cr_assert_eq(simcuda_calls("cuMemSetMemPool"), 1);
  struct cudaMemLocation host = {cudaMemLocationTypeHost, 0};
  RT_ERR(cudaMemGetMemPool(&cur, &host, cudaMemAllocationTypePinned), cudaErrorNotSupported);
}

Test(sim_runtime, lazy_initialization) {
  simcuda_stats_t s = sim_stats(0, NULL); /* works before cuInit */
  cr_assert_eq(s.contexts, 0);
  cr_assert_eq(simcuda_calls("cuInit"), 0);
  RT_OK(cudaFree(NULL)); /* the classic way to initialize */
  cr_assert_eq(simcuda_calls("cuInit"), 1);
  cr_assert_eq(simcuda_calls("cuMemFree_v2"), 0, "cudaFree(NULL) does not reach the driver's free");
  cr_assert_eq(sim_stats(0, NULL).contexts, 1);
  CUcontext cur = NULL;
  OK(cuCtxGetCurrent(&cur));
  cr_assert_not_null(cur, "the primary context is current on the calling thread");
  unsigned flags;
  int active = 0;
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  cr_assert_eq(active, 1);
  void *p;
  RT_OK(cudaMalloc(&p, 4096));
  cr_assert_eq(sim_block((uint64_t)(uintptr_t)p, SIMCUDA_DEVICE).ctx, cur);
}

static void *thread_alloc(void *arg) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, 4096);
  *(void **)arg = p;
  return (void *)(uintptr_t)e;
}

Test(sim_runtime, a_new_thread_gets_the_primary_context) {
  void *mine, *theirs = NULL, *res;
  RT_OK(cudaMalloc(&mine, 4096));
  res = gr_thread_run(thread_alloc, &theirs);
  cr_assert_eq((cudaError_t)(uintptr_t)res, cudaSuccess);
  cr_assert_eq(sim_block((uint64_t)(uintptr_t)theirs, SIMCUDA_DEVICE).ctx,
               sim_block((uint64_t)(uintptr_t)mine, SIMCUDA_DEVICE).ctx);
  cr_assert_eq(sim_stats(0, NULL).contexts, 1);
}

Test(sim_runtime, uses_a_context_made_current_through_the_driver) {
  OK(cuInit(0));
  CUcontext mine;
  OK(cuCtxCreate(&mine, NULL, 0, 0));
  void *p;
  RT_OK(cudaMalloc(&p, 4096));
  cr_assert_eq(sim_block((uint64_t)(uintptr_t)p, SIMCUDA_DEVICE).ctx, mine);
  cr_assert_eq(sim_stats(0, NULL).contexts, 1, "the runtime did not need the primary context");
}

static void *peek_other_thread(void *arg) {
  (void)arg;
  return (void *)(uintptr_t)cudaPeekAtLastError();
}

Test(sim_runtime, sticky_last_error) {
  setenv("SIMCUDA_DEVICE_MEM", "1G", 1);
  RT_OK(cudaGetLastError());
  void *p = (void *)0x1;
  RT_ERR(cudaMalloc(&p, 2 * GiB), cudaErrorMemoryAllocation);
  cr_assert_eq(p, (void *)0x1);
  RT_OK(cudaMalloc(&p, 4096)); /* a success does not clear it */
  RT_ERR(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  RT_ERR(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  void *res;
  res = gr_thread_run(peek_other_thread, NULL);
  cr_assert_eq((cudaError_t)(uintptr_t)res, cudaSuccess, "the last error is per thread");
  RT_ERR(cudaGetLastError(), cudaErrorMemoryAllocation);
  RT_OK(cudaGetLastError()); /* read and reset */
  RT_ERR(cudaFree((void *)0x1234), cudaErrorInvalidValue);
  RT_ERR(cudaGetLastError(), cudaErrorInvalidValue);
}

Test(sim_runtime, driver_errors_map_to_runtime_errors) {
  void *p;
  RT_OK(cudaFree(NULL));
  static const struct {
    CUresult cu;
    cudaError_t rt;
  } map[] = {
      {CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation}, {CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue},
      {CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported},     {CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized},
      {CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress}, {CUDA_ERROR_UNKNOWN, cudaErrorUnknown},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    cr_assert_eq(simcuda_inject("cuMemAlloc_v2", map[i].cu, 1), 0);
    RT_ERR(cudaMalloc(&p, 4096), map[i].rt);
  }
  RT_OK(cudaMalloc(&p, 4096));
}

Test(sim_runtime, free_null_and_zero_sizes) {
  RT_OK(cudaFree(NULL));
  void *p = (void *)0x1;
  uint64_t n = simcuda_calls("cuMemAlloc_v2");
  RT_OK(cudaMalloc(&p, 0));
  cr_assert_null(p);
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), n, "a zero-byte cudaMalloc does not reach the driver");
  RT_ERR(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
  RT_OK(cudaFreeHost(NULL));
  p = (void *)0x1;
  RT_OK(cudaMallocHost(&p, 0));
  cr_assert_null(p);
}

Test(sim_runtime, device_reset_frees_and_the_next_call_reinitializes) {
  void *p, *h;
  cudaStream_t s;
  RT_OK(cudaMalloc(&p, 8 * MiB));
  RT_OK(cudaMallocHost(&h, 4096));
  RT_OK(cudaStreamCreate(&s));
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 1);
  RT_OK(cudaDeviceReset());
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxReset"), 1, "through the 7000 ABI");
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxReset_v2"), 0);
  simcuda_stats_t st = sim_stats(0, NULL);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(st.host_blocks, 0);
  cr_assert_eq(st.contexts, 0);
  RT_ERR(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  RT_OK(cudaMalloc(&p, 8 * MiB)); /* re-initializes */
  st = sim_stats(0, NULL);
  cr_assert_eq(st.live_blocks, 1);
  cr_assert_eq(st.contexts, 1);
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxRetain"), 2);
  RT_OK(cudaDeviceReset());
  RT_OK(cudaDeviceReset()); /* nothing retained: still fine */
  /* the runtime released what it retained: the retain count is balanced */
  ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
}

Test(sim_runtime, stream_ordered_allocation) {
  cudaStream_t s;
  RT_OK(cudaStreamCreate(&s));
  cudaMemPool_t pool = NULL;
  RT_OK(cudaDeviceGetDefaultMemPool(&pool, 0));
  CUmemoryPool dpool;
  OK(cuDeviceGetDefaultMemPool(&dpool, 0));
  cr_assert_eq((void *)pool, (void *)dpool);
  void *p, *q;
  RT_OK(cudaMallocAsync(&p, 4 * MiB, s));
  RT_OK(cudaFreeAsync(p, s));
  cr_assert_eq(simcuda_calls("cuMemAllocAsync"), 1);
  cr_assert_eq(simcuda_calls("cuMemFreeAsync"), 1);
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 4 * MiB);
  RT_OK(cudaStreamSynchronize(s));
  cr_assert_eq(sim_stats(0, NULL).pool_reserved_bytes, 0, "threshold 0: released at synchronization");
  uint64_t max = UINT64_MAX, got = 0;
  RT_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &max));
  RT_OK(cudaMallocAsync_ptsz(&q, 4 * MiB, cudaStreamPerThread));
  cr_assert_eq(simcuda_calls("cuMemAllocAsync_ptsz"), 1);
  RT_OK(cudaFreeAsync_ptsz(q, cudaStreamPerThread));
  cr_assert_eq(simcuda_calls("cuMemFreeAsync_ptsz"), 1);
  RT_OK(cudaDeviceSynchronize());
  RT_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &got));
  cr_assert_eq(got, 4 * MiB);
  RT_OK(cudaMemPoolTrimTo(pool, 0));
  RT_OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &got));
  cr_assert_eq(got, 0);
  RT_OK(cudaStreamDestroy(s));
  RT_ERR(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
}

Test(sim_runtime, created_pools) {
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool, cur;
  RT_OK(cudaMemPoolCreate(&pool, &props));
  RT_OK(cudaDeviceSetMemPool(0, pool));
  RT_OK(cudaDeviceGetMemPool(&cur, 0));
  cr_assert_eq(cur, pool);
  void *p;
  RT_OK(cudaMallocFromPoolAsync(&p, MiB, pool, 0));
  cr_assert_eq((void *)sim_block((uint64_t)(uintptr_t)p, SIMCUDA_ASYNC).pool, (void *)pool);
  RT_OK(cudaFreeAsync(p, 0));
  RT_OK(cudaMemPoolDestroy(pool));
  RT_ERR(cudaMemPoolDestroy(pool), cudaErrorInvalidValue);
  props.allocType = cudaMemAllocationTypeInvalid;
  RT_ERR(cudaMemPoolCreate(&pool, &props), cudaErrorInvalidValue);
}

Test(sim_runtime, other_allocations) {
  size_t fr0, total, fr1;
  RT_OK(cudaMemGetInfo(&fr0, &total));
  cr_assert_eq(total, 80 * GiB);
  void *m, *pp, *h, *h2;
  size_t pitch = 0;
  RT_OK(cudaMallocManaged(&m, 3 * MiB, cudaMemAttachGlobal));
  RT_OK(cudaMallocPitch(&pp, &pitch, 700, 10));
  cr_assert_geq(pitch, 700);
  RT_OK(cudaMemGetInfo(&fr1, &total));
  cr_assert_eq(fr0 - fr1, 3 * MiB + pitch * 10);
  cr_assert_eq(sim_count_blocks(SIMCUDA_MANAGED, (uint64_t)(uintptr_t)m), 1);
  cr_assert_eq(sim_count_blocks(SIMCUDA_PITCH, (uint64_t)(uintptr_t)pp), 1);
  RT_OK(cudaMallocHost(&h, 5000));
  RT_OK(cudaHostAlloc(&h2, 5000, cudaHostAllocPortable));
  cr_assert_eq(simcuda_calls("cuMemHostAlloc"), 2);
  cr_assert_eq(sim_stats(0, NULL).host_blocks, 2);
  RT_OK(cudaFreeHost(h));
  RT_OK(cudaFreeHost(h2));
  RT_ERR(cudaFreeHost(h2), cudaErrorInvalidValue);
  RT_OK(cudaFree(m));
  RT_OK(cudaFree(pp));
  RT_ERR(cudaMallocManaged(&m, 16, 7), cudaErrorInvalidValue);
}

Test(sim_runtime, copies_and_sets) {
  void *a, *b;
  RT_OK(cudaMalloc(&a, 4096));
  RT_OK(cudaMalloc(&b, 4096));
  char src[4096], dst[4096], tmp[16];
  for (int i = 0; i < 4096; i++) src[i] = (char)(i * 13);
  RT_OK(cudaMemcpy(a, src, sizeof src, cudaMemcpyHostToDevice));
  RT_OK(cudaMemcpy(b, a, sizeof src, cudaMemcpyDeviceToDevice));
  RT_OK(cudaMemset(a, 0x41, 100));
  RT_OK(cudaMemcpy(dst, b, sizeof dst, cudaMemcpyDeviceToHost));
  cr_assert_eq(memcmp(src, dst, sizeof src), 0);
  RT_OK(cudaMemcpy(tmp, a, sizeof tmp, cudaMemcpyDefault)); /* direction inferred from the pointers */
  for (int i = 0; i < 16; i++) cr_assert_eq(tmp[i], 0x41);
  RT_OK(cudaMemcpy_ptds(b, tmp, sizeof tmp, cudaMemcpyDefault));
  cr_assert_eq(simcuda_calls("cuMemcpyHtoD_v2_ptds"), 1);
  RT_OK(cudaMemcpy(dst, src, 16, cudaMemcpyDefault)); /* host to host */
  RT_ERR(cudaMemcpy(dst, a, 16, (enum cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
  RT_ERR(cudaMemcpy(dst, a, 8192, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  RT_ERR(cudaMemset((char *)a + 4000, 0, 200), cudaErrorInvalidValue);
}

Test(sim_runtime, devices) {
  setenv("SIMCUDA_DEVICES", "2", 1);
  int n = 0, d = -1;
  RT_OK(cudaGetDeviceCount(&n));
  cr_assert_eq(n, 2);
  RT_OK(cudaGetDevice(&d));
  cr_assert_eq(d, 0);
  RT_OK(cudaSetDevice(1));
  RT_OK(cudaGetDevice(&d));
  cr_assert_eq(d, 1);
  void *p;
  RT_OK(cudaMalloc(&p, MiB));
  cr_assert_eq(sim_stats(1, NULL).live_blocks, 1);
  cr_assert_eq(sim_stats(0, NULL).live_blocks, 0);
  RT_ERR(cudaSetDevice(2), cudaErrorInvalidDevice);
  RT_ERR(cudaGetDevice(NULL), cudaErrorInvalidValue);
  int v = 0;
  RT_OK(cudaDriverGetVersion(&v));
  cr_assert_eq(v, 13000);
  RT_OK(cudaRuntimeGetVersion(&v));
  cr_assert_eq(v, 13000);
}

Test(sim_runtime, no_device) {
  setenv("SIMCUDA_DEVICES", "0", 1);
  int n = 5;
  RT_ERR(cudaGetDeviceCount(&n), cudaErrorNoDevice);
  cr_assert_eq(n, 0);
  void *p;
  RT_ERR(cudaMalloc(&p, 16), cudaErrorNoDevice);
}

Test(sim_runtime, error_names_and_strings) {
  cr_assert_str_eq(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  cr_assert_str_eq(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  cr_assert_str_eq(cudaGetErrorName(cudaSuccess), "cudaSuccess");
  cr_assert_str_eq(cudaGetErrorName((cudaError_t)4242), "unrecognized error code");
}

/* What the real CUDA 13.0 runtime was seen to call, modelled (simcudart.c): its first call after start-up is
 * cuModuleGetLoadingMode, before any context or memory call. */
static uint64_t g_at_loading_mode[5];
static void note_loading_mode(void *arg) {
  (void)arg;
  static const char *const names[] = {"cuInit", "cuDeviceGetCount", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                                      "cuMemAlloc_v2"};
  for (int i = 0; i < 5; i++) g_at_loading_mode[i] = simcuda_calls(names[i]) + 1; /* 0: never called back */
}

Test(sim_runtime, the_first_call_after_start_up_is_cuModuleGetLoadingMode) {
  cr_assert_eq(simcuda_on_return("cuModuleGetLoadingMode", note_loading_mode, NULL), 0);
  void *p;
  RT_OK(cudaMalloc(&p, 4096));
  cr_assert_eq(simcuda_calls("cuModuleGetLoadingMode"), 1);
  cr_assert_eq(g_at_loading_mode[0], 1 + 1, "cuInit came before it");
  cr_assert_eq(g_at_loading_mode[1], 1 + 1, "and cuDeviceGetCount");
  cr_assert_eq(g_at_loading_mode[2], 0 + 1, "no context was retained before it");
  cr_assert_eq(g_at_loading_mode[3], 0 + 1, "none made current");
  cr_assert_eq(g_at_loading_mode[4], 0 + 1, "nothing allocated");
  RT_OK(cudaFree(p));
}

static void *many_calls(void *arg) {
  (void)arg;
  void *p = NULL;
  for (int i = 0; i < 20; i++) {
    if (cudaMalloc(&p, 4096) != cudaSuccess || cudaMemset(p, i, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess)
      return (void *)1;
  }
  return NULL;
}

/* Each thread's context is set once, at its first call (cuCtxSetCurrent once per thread); the primary context is
 * retained once by the runtime, whatever the number of threads; no call asks for the current context again. */
Test(sim_runtime, each_thread_sets_its_context_once) {
  cr_assert_null(many_calls(NULL));
  cr_assert_eq(simcuda_calls("cuCtxSetCurrent"), 1, "one thread, one cuCtxSetCurrent");
  cr_assert_eq(simcuda_calls("cuCtxGetCurrent"), 1, "asked once, at the thread's first call");
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxRetain"), 1);
  cr_assert_null(gr_thread_run(many_calls, NULL));
  cr_assert_eq(simcuda_calls("cuCtxSetCurrent"), 2, "a second thread sets its own, once");
  cr_assert_eq(simcuda_calls("cuCtxGetCurrent"), 2);
  cr_assert_eq(simcuda_calls("cuDevicePrimaryCtxRetain"), 1, "retained once by the runtime");
  cr_assert_eq(sim_stats(0, NULL).primary_retains, 1);
  cr_assert_eq(simcuda_calls("cuMemAlloc_v2"), 40);
}

static void add_seven(void **args) {
  unsigned char *p = *(unsigned char **)args[0];
  for (int i = 0; i < 16; i++) p[i] += 7;
}

/* Kernels are loaded through the library API, once each, and the CUkernel is what is launched. */
Test(sim_runtime, kernels_are_loaded_as_libraries_and_launched_as_CUkernels) {
  unsigned char host[16] = {0}, *dev;
  RT_OK(cudaMalloc((void **)&dev, sizeof host));
  RT_OK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice));
  void *args[] = {&dev};
  for (int i = 0; i < 3; i++)
    RT_OK(cudaLaunchKernel((const void *)add_seven, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, NULL));
  RT_OK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
  cr_assert_eq(host[0], 21, "the kernel ran three times");
  cr_assert_eq(host[15], 21);
  cr_assert_eq(simcuda_calls("cuLibraryLoadData"), 1, "loaded once");
  cr_assert_eq(simcuda_calls("cuLibraryGetKernel"), 1);
  cr_assert_eq(simcuda_calls("cuLaunchKernel"), 3);
}

/* The driver's side of it: an image of the simulator's, its kernels by name, a CUkernel launched where a
 * CUfunction is expected, and unloaded. */
Test(sim_runtime, the_driver_library_api) {
  sim_primary(0);
  CUmoduleLoadingMode mode;
  OK(cuModuleGetLoadingMode(&mode));
  cr_assert_eq(mode, CU_MODULE_LAZY_LOADING);
  simcuda_image_kernel_t ks[] = {{"add_seven", add_seven}, {"other", add_seven}};
  simcuda_image_t image = {SIMCUDA_IMAGE_MAGIC, 2, ks}, bad = {0, 2, ks};
  CUlibrary lib;
  ERR(cuLibraryLoadData(&lib, &bad, NULL, NULL, 0, NULL, NULL, 0), CUDA_ERROR_INVALID_IMAGE);
  OK(cuLibraryLoadData(&lib, &image, NULL, NULL, 0, NULL, NULL, 0));
  CUkernel k, k2;
  ERR(cuLibraryGetKernel(&k, lib, "nope"), CUDA_ERROR_NOT_FOUND);
  OK(cuLibraryGetKernel(&k, lib, "add_seven"));
  OK(cuLibraryGetKernel(&k2, lib, "other"));
  cr_assert_neq((void *)k, (void *)k2);
  CUfunction f;
  OK(cuKernelGetFunction(&f, k));
  CUdeviceptr d;
  unsigned char host[16] = {0};
  OK(cuMemAlloc(&d, 16));
  OK(cuMemcpyHtoD(d, host, 16));
  void *args[] = {&d};
  OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
  OK(cuLaunchKernel((CUfunction)k2, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
  OK(cuMemcpyDtoH(host, d, 16));
  cr_assert_eq(host[3], 14);
  OK(cuLibraryUnload(lib));
  ERR(cuKernelGetFunction(&f, k), CUDA_ERROR_INVALID_HANDLE);
  ERR(cuLibraryUnload(lib), CUDA_ERROR_INVALID_HANDLE);
}
