/*
 * runtime.c -- CUDA runtime allocation calls, where the runtime is a shared library: attribution only.
 *
 * The driver hooks are the ground truth and count every block once. These wrappers only remember, for the
 * duration of the call, which runtime call it is and who called it, so that the block the driver hook records
 * is attributed to, say, libc10_cuda.so's cudaMalloc rather than to libcudart.so. A program that links the
 * runtime statically never reaches them; its blocks are attributed to the binary by the driver hooks.
 *
 * The real function is the one the caller would have bound to: looked up in the caller's own scope first
 * (Python extensions load libcudart with RTLD_LOCAL, out of RTLD_NEXT's reach), then after gpureclaim in the
 * global scope. The answer is cached per call site.
 */
#include "export.h"
#include "real.h"
#include "names.h"
#include "state.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#define GR_RUNTIME_HOOKS(X)                                                                                  \
  X(cudaMalloc, GR_API_cudaMalloc, (void **devPtr, size_t size), (devPtr, size))                             \
  X(cudaFree, GR_API_NONE, (void *devPtr), (devPtr))                                                         \
  X(cudaMallocAsync, GR_API_cudaMallocAsync, (void **devPtr, size_t size, cudaStream_t hStream),             \
    (devPtr, size, hStream))                                                                                 \
  X(cudaMallocAsync_ptsz, GR_API_cudaMallocAsync, (void **devPtr, size_t size, cudaStream_t hStream),        \
    (devPtr, size, hStream))                                                                                 \
  X(cudaFreeAsync, GR_API_NONE, (void *devPtr, cudaStream_t hStream), (devPtr, hStream))                     \
  X(cudaFreeAsync_ptsz, GR_API_NONE, (void *devPtr, cudaStream_t hStream), (devPtr, hStream))                \
  X(cudaMallocFromPoolAsync, GR_API_cudaMallocFromPoolAsync,                                                 \
    (void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream), (ptr, size, memPool, stream))     \
  X(cudaMallocFromPoolAsync_ptsz, GR_API_cudaMallocFromPoolAsync,                                            \
    (void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream), (ptr, size, memPool, stream))     \
  X(cudaMallocManaged, GR_API_cudaMallocManaged, (void **devPtr, size_t size, unsigned int flags),           \
    (devPtr, size, flags))                                                                                   \
  X(cudaMallocPitch, GR_API_cudaMallocPitch, (void **devPtr, size_t *pitch, size_t width, size_t height),    \
    (devPtr, pitch, width, height))                                                                          \
  X(cudaMallocHost, GR_API_cudaMallocHost, (void **ptr, size_t size), (ptr, size))                           \
  X(cudaHostAlloc, GR_API_cudaHostAlloc, (void **pHost, size_t size, unsigned int flags), (pHost, size, flags)) \
  X(cudaFreeHost, GR_API_NONE, (void *ptr), (ptr))

#define RT_ENUM(name, api, params, args) RT_##name,
enum { GR_RUNTIME_HOOKS(RT_ENUM) RT_COUNT };
#undef RT_ENUM

/* gr_rt_<name> is exported only as name@libcudart.so.13 and name@libcudart.so.12, hidden versions
 * (gpureclaim.map says why). */
#define RT_DECL(name, api, params, args) GR_INTERPOSE cudaError_t CUDARTAPI gr_rt_##name params;
GR_RUNTIME_HOOKS(RT_DECL)
#undef RT_DECL

static const char *const g_names[RT_COUNT] = {
#define RT_NAME(name, api, params, args) #name,
    GR_RUNTIME_HOOKS(RT_NAME)
#undef RT_NAME
};
static void *const g_ours[RT_COUNT] = {
#define RT_OURS(name, api, params, args) (void *)gr_rt_##name,
    GR_RUNTIME_HOOKS(RT_OURS)
#undef RT_OURS
};

/* Per call site: written once (pc reserved, fn stored, pc published), never changed. */
#define SITES 64
typedef struct {
  _Atomic uintptr_t pc;
  _Atomic(void *) fn;
} site_t;
static site_t g_sites[RT_COUNT][SITES];
#define PC_BUSY ((uintptr_t)1)

static bool ours(int id, void *fn) { return fn == g_ours[id]; }

GR_COLD static void *resolve(int id, uintptr_t pc) {
  const gr_real_libc_t *r = gr_real_libc();
  const char *name = g_names[id];
  void *fn = gr_real_caller_sym((const void *)pc, name);
  if (!fn || ours(id, fn))
    fn = r->dlsym(RTLD_NEXT, name);
  static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (size_t i = 0; (!fn || ours(id, fn)) && i < GR_ARRAY_LEN(sonames); i++) {
    void *h = r->dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
    fn = h ? r->dlsym(h, name) : NULL;
  }
  return fn && !ours(id, fn) ? fn : NULL;
}

static inline void *rt_real(int id, uintptr_t pc) {
  site_t *s = &g_sites[id][(pc >> 2) % SITES];
  if (GR_LIKELY(atomic_load_explicit(&s->pc, memory_order_acquire) == pc))
    return atomic_load_explicit(&s->fn, memory_order_relaxed);
  void *fn = resolve(id, pc);
  uintptr_t expected = 0;
  if (fn && atomic_compare_exchange_strong_explicit(&s->pc, &expected, PC_BUSY, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
    atomic_store_explicit(&s->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&s->pc, pc, memory_order_release);
  }
  return fn;
}

#define RT_DEFINE(name, api, params, args)                                                                 \
  __asm__(".symver gr_rt_" #name ", " #name "@libcudart.so.13");                                          \
  __asm__(".symver gr_rt_" #name ", " #name "@libcudart.so.12");                                          \
  GR_INTERPOSE cudaError_t CUDARTAPI gr_rt_##name params {                                                 \
    uintptr_t ra = (uintptr_t)__builtin_return_address(0);                                                 \
    cudaError_t(CUDARTAPI * real) params = (cudaError_t(CUDARTAPI *) params)rt_real(RT_##name, ra);        \
    if (GR_UNLIKELY(!real)) {                                                                              \
      gr_warn_once(w_##name, "%s: no CUDA runtime library found for the caller", #name);                   \
      return cudaErrorInsufficientDriver;                                                                  \
    }                                                                                                      \
    if (gr_tls.rt_depth++ == 0) {                                                                          \
      gr_tls.rt_caller = ra;                                                                               \
      gr_tls.rt_api = (api);                                                                               \
    }                                                                                                      \
    cudaError_t rc = real args;                                                                            \
    gr_tls.rt_depth--;                                                                                     \
    return rc;                                                                                             \
  }
GR_RUNTIME_HOOKS(RT_DEFINE)
#undef RT_DEFINE
