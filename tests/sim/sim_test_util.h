/* sim_test_util.h -- helpers shared by the simulator's Criterion suites. */
#ifndef SIM_TEST_UTIL_H
#define SIM_TEST_UTIL_H

#include "simcuda.h"

#ifdef SIM_MINICHECK
#include "sim_minicheck.h"
#else
#include <criterion/criterion.h>
#endif
#include <stdint.h>

#define OK(call)                                                                                              \
  do {                                                                                                        \
    CUresult r_ = (call);                                                                                     \
    cr_assert_eq(r_, CUDA_SUCCESS, "%s -> %d, expected CUDA_SUCCESS", #call, (int)r_);                        \
  } while (0)

#define ERR(call, want)                                                                                       \
  do {                                                                                                        \
    CUresult r_ = (call);                                                                                     \
    cr_assert_eq(r_, (want), "%s -> %d, expected %s (%d)", #call, (int)r_, #want, (int)(want));               \
  } while (0)

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

/* cuInit, retain device dev's primary context and make it current; returns it. */
CUcontext sim_primary(int dev);
/* simcuda_stats, asserting success. */
simcuda_stats_t sim_stats(int dev, CUcontext ctx);
/* How many live blocks of kind `kind` (0: any) the simulator reports at `address` (0: any address). */
int sim_count_blocks(int kind, uint64_t address);
/* The block at `address` (kind 0: any); asserts it exists. */
simcuda_block_t sim_block(uint64_t address, int kind);
/* Resolves a base name through cuGetProcAddress_v2; asserts success. */
void *sim_proc(const char *symbol, int version, uint64_t flags);
/* The driver's own definition of an exported name (dlsym on libcuda.so.1's handle). */
void *sim_dlsym(const char *name);

#endif
