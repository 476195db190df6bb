/* test_sim_vmm.c -- virtual memory management: handles, reservations, mappings, access, lifecycle. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <stdlib.h>
#include <string.h>

#define GRAN (2 * MiB)

static CUmemAllocationProp prop_for(int dev) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

static CUmemGenericAllocationHandle create(size_t bytes) {
  CUmemAllocationProp p = prop_for(0);
  CUmemGenericAllocationHandle h = 0;
  OK(cuMemCreate(&h, bytes, &p, 0));
  cr_assert_neq(h, 0);
  return h;
}

static void grant(CUdeviceptr va, size_t size, CUmemAccess_flags f) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = f;
  OK(cuMemSetAccess(va, size, &d, 1));
}

Test(sim_vmm, granularity) {
  OK(cuInit(0));
  CUmemAllocationProp p = prop_for(0);
  size_t g = 0;
  OK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  cr_assert_eq(g, GRAN);
  OK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  cr_assert_eq(g, GRAN);
  ERR(cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_VALUE);
  p.location.id = 3;
  ERR(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_DEVICE);
  p = prop_for(0);
  p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
  ERR(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_vmm, create_counts_against_capacity) {
  setenv("SIMCUDA_DEVICE_MEM", "64M", 1);
  OK(cuInit(0));
  CUmemAllocationProp p = prop_for(0);
  CUmemGenericAllocationHandle h = 0, h2 = 0;
  ERR(cuMemCreate(&h, GRAN + 4096, &p, 0), CUDA_ERROR_INVALID_VALUE); /* not a multiple of the granularity */
  ERR(cuMemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemCreate(&h, GRAN, &p, 1), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemCreate(&h, GRAN, NULL, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(h, 0);
  OK(cuMemCreate(&h, 48 * MiB, &p, 0));
  OK(cuMemCreate(&h2, 16 * MiB, &p, 0));
  cr_assert_neq(h, h2);
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.vmm_handles, 2);
  cr_assert_eq(s.vmm_phys_bytes, 64 * MiB);
  cr_assert_eq(s.used_bytes, 64 * MiB);
  CUmemGenericAllocationHandle h3 = 0;
  ERR(cuMemCreate(&h3, GRAN, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(h3, 0);
  simcuda_block_t b = sim_block(h, SIMCUDA_VMM);
  cr_assert_eq(b.bytes, 48 * MiB);
  cr_assert_eq(b.released, 0);
  cr_assert_null(b.ctx);
  OK(cuMemRelease(h2));
  cr_assert_eq(sim_stats(0, NULL).vmm_phys_bytes, 48 * MiB, "released and unmapped: freed at once");
  ERR(cuMemRelease(h2), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
}

Test(sim_vmm, reservations_are_address_space_only) {
  OK(cuInit(0));
  CUdeviceptr va = 0, vb = 0;
  OK(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0));
  cr_assert_eq(va % GRAN, 0);
  OK(cuMemAddressReserve(&vb, 32 * MiB, 32 * MiB, 0, 0));
  cr_assert_eq(vb % (32 * MiB), 0, "requested alignment honoured");
  cr_assert(vb >= va + 64 * MiB || vb + 32 * MiB <= va);
  simcuda_stats_t all = sim_stats(-1, NULL);
  cr_assert_eq(all.va_reserved_bytes, 96 * MiB);
  cr_assert_eq(all.used_bytes, 0, "address space is not memory");
  cr_assert_eq(sim_stats(0, NULL).va_reserved_bytes, 0);
  cr_assert_eq(sim_block(va, SIMCUDA_VA).bytes, 64 * MiB);
  CUdeviceptr bad = 0;
  ERR(cuMemAddressReserve(&bad, 3 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAddressReserve(&bad, GRAN, 3 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemAddressReserve(NULL, GRAN, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(bad, 0);
  ERR(cuMemAddressFree(va, 32 * MiB), CUDA_ERROR_INVALID_VALUE); /* size must match */
  OK(cuMemAddressFree(va, 64 * MiB));
  ERR(cuMemAddressFree(va, 64 * MiB), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr again = 0;
  OK(cuMemAddressReserve(&again, 64 * MiB, 0, va, 0)); /* a free fixed address is honoured */
  cr_assert_eq(again, va);
  cr_assert_eq(sim_stats(-1, NULL).va_reserved_bytes, 96 * MiB);
}

Test(sim_vmm, lifecycle_create_map_release_unmap) {
  sim_primary(0);
  CUmemGenericAllocationHandle h = create(4 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 4 * MiB, 0, h, 0));
  cr_assert_eq(sim_stats(0, NULL).vmm_mappings, 1);
  cr_assert_eq(sim_block(va, SIMCUDA_VMM_MAPPING).bytes, 4 * MiB);
  OK(cuMemRelease(h)); /* the mapping keeps the memory alive */
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.vmm_phys_bytes, 4 * MiB);
  cr_assert_eq(s.vmm_handles, 1);
  cr_assert_eq(sim_block(h, SIMCUDA_VMM).released, 1);
  grant(va, 4 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  OK(cuMemsetD8(va, 0x3c, 4 * MiB));
  cr_assert_eq(((unsigned char *)(uintptr_t)va)[4 * MiB - 1], 0x3c);
  OK(cuMemUnmap(va, 4 * MiB)); /* released and no longer mapped: freed */
  s = sim_stats(0, NULL);
  cr_assert_eq(s.vmm_phys_bytes, 0);
  cr_assert_eq(s.vmm_handles, 0);
  cr_assert_eq(s.vmm_mappings, 0);
  cr_assert_eq(s.used_bytes, 0);
  ERR(cuMemsetD8(va, 0, 1), CUDA_ERROR_INVALID_VALUE);
  OK(cuMemAddressFree(va, 8 * MiB));
}

Test(sim_vmm, map_rules) {
  sim_primary(0);
  CUmemGenericAllocationHandle h = create(4 * MiB), h2 = create(2 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
  ERR(cuMemMap(va + 6 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* runs past the reservation */
  ERR(cuMemMap(va + 4096, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);    /* unaligned */
  ERR(cuMemMap(va, 8 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);           /* larger than the handle */
  ERR(cuMemMap(va, 2 * MiB, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE);        /* offset must be 0 */
  ERR(cuMemMap(va, 2 * MiB, 0, 0x1234, 0), CUDA_ERROR_INVALID_VALUE);      /* unknown handle */
  ERR(cuMemMap(0x10000000, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);   /* not reserved */
  OK(cuMemMap(va, 4 * MiB, 0, h, 0));
  ERR(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* overlaps */
  OK(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h2, 0));
  ERR(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE); /* still mapped */
  OK(cuMemRelease(h2));
  CUmemGenericAllocationHandle gone = h2;
  ERR(cuMemMap(va + 6 * MiB, 2 * MiB, 0, gone, 0), CUDA_ERROR_INVALID_VALUE); /* released handle */
  cr_assert_eq(sim_stats(0, NULL).vmm_mappings, 2);
}

Test(sim_vmm, access_is_granted_by_set_access) {
  sim_primary(0);
  CUmemGenericAllocationHandle h = create(2 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ERR(cuMemSetAccess(va, 2 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE); /* not mapped */
  OK(cuMemMap(va, 2 * MiB, 0, h, 0));
  ERR(cuMemsetD8(va, 1, 16), CUDA_ERROR_INVALID_VALUE); /* mapped but not accessible yet */
  ERR(cuMemSetAccess(va, 4 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE); /* half unmapped */
  ERR(cuMemSetAccess(va, 2 * MiB, &d, 0), CUDA_ERROR_INVALID_VALUE);
  d.location.id = 5;
  ERR(cuMemSetAccess(va, 2 * MiB, &d, 1), CUDA_ERROR_INVALID_DEVICE);
  d.location.id = 0;
  d.flags = (CUmemAccess_flags)2;
  ERR(cuMemSetAccess(va, 2 * MiB, &d, 1), CUDA_ERROR_INVALID_VALUE);
  grant(va, 2 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READ);
  unsigned char x = 1;
  OK(cuMemcpyDtoH(&x, va + 100, 1));
  cr_assert_eq(x, 0);
  ERR(cuMemsetD8(va, 1, 16), CUDA_ERROR_INVALID_VALUE); /* read-only */
  grant(va, 2 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  OK(cuMemsetD8(va, 9, 16));
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(cuMemGetAddressRange(&base, &size, va + 1000));
  cr_assert_eq(base, va);
  cr_assert_eq(size, 2 * MiB);
}

Test(sim_vmm, unmap_covers_whole_adjacent_mappings) {
  sim_primary(0);
  CUmemGenericAllocationHandle a = create(2 * MiB), b = create(4 * MiB), c = create(2 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 2 * MiB, 0, a, 0));
  OK(cuMemMap(va + 2 * MiB, 4 * MiB, 0, b, 0));
  OK(cuMemMap(va + 8 * MiB, 2 * MiB, 0, c, 0));
  grant(va, 6 * MiB, CU_MEM_ACCESS_FLAGS_PROT_READWRITE); /* spans two adjacent mappings */
  OK(cuMemsetD8(va + 2 * MiB - 8, 1, 16));                /* a copy across them works */
  ERR(cuMemUnmap(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);  /* cuts b in half */
  ERR(cuMemUnmap(va, 10 * MiB), CUDA_ERROR_INVALID_VALUE); /* includes a hole */
  ERR(cuMemUnmap(va + 2 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(sim_stats(0, NULL).vmm_mappings, 3);
  OK(cuMemUnmap(va, 6 * MiB)); /* a and b together */
  cr_assert_eq(sim_stats(0, NULL).vmm_mappings, 1);
  OK(cuMemRelease(a));
  OK(cuMemRelease(b));
  OK(cuMemRelease(c));
  cr_assert_eq(sim_stats(0, NULL).vmm_phys_bytes, 2 * MiB, "c is still mapped");
  OK(cuMemUnmap(va + 8 * MiB, 2 * MiB));
  cr_assert_eq(sim_stats(0, NULL).vmm_phys_bytes, 0);
  cr_assert_eq(sim_count_blocks(SIMCUDA_VMM, 0), 0);
}

Test(sim_vmm, one_handle_mapped_twice) {
  sim_primary(0);
  CUmemGenericAllocationHandle h = create(2 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 2 * MiB, 0, h, 0));
  OK(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h, 0));
  OK(cuMemRelease(h));
  OK(cuMemUnmap(va, 2 * MiB));
  cr_assert_eq(sim_stats(0, NULL).vmm_phys_bytes, 2 * MiB, "one mapping left keeps it alive");
  OK(cuMemUnmap(va + 4 * MiB, 2 * MiB));
  cr_assert_eq(sim_stats(0, NULL).vmm_phys_bytes, 0);
}

Test(sim_vmm, vmm_memory_is_not_owned_by_a_context) {
  CUcontext c = sim_primary(0);
  CUmemGenericAllocationHandle h = create(2 * MiB);
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 2 * MiB, 0, h, 0));
  OK(cuDevicePrimaryCtxReset(0));
  simcuda_stats_t s = sim_stats(0, NULL);
  cr_assert_eq(s.vmm_phys_bytes, 2 * MiB, "a context reset leaves VMM memory alone");
  cr_assert_eq(s.vmm_mappings, 1);
  cr_assert_eq(sim_stats(0, c).live_blocks, 0);
}

/* cuMemGetAllocationPropertiesFromHandle answers for a handle the program holds, and fails once it released
 * it (gpureclaim asks it whether a handle value is live again). */
Test(sim_vmm, properties_of_a_held_handle_only) {
  OK(cuInit(0));
  CUmemAllocationProp p = prop_for(0), got;
  CUmemGenericAllocationHandle h;
  OK(cuMemCreate(&h, GRAN, &p, 0));
  OK(cuMemGetAllocationPropertiesFromHandle(&got, h));
  cr_assert_eq(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  cr_assert_eq(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  cr_assert_eq(got.location.id, 0);
  ERR(cuMemGetAllocationPropertiesFromHandle(NULL, h), CUDA_ERROR_INVALID_VALUE);
  ERR(cuMemGetAllocationPropertiesFromHandle(&got, h + 1), CUDA_ERROR_INVALID_VALUE);
  OK(cuMemRelease(h));
  ERR(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
}

/* The real driver hands the value of a handle whose memory is gone out again (most recently freed first):
 * a handle value alone never tells one allocation from an earlier one. */
Test(sim_vmm, freed_handle_values_are_reused) {
  OK(cuInit(0));
  CUmemAllocationProp p0 = prop_for(0), p1 = prop_for(1);
  CUmemGenericAllocationHandle a, b, c, d, e;
  OK(cuMemCreate(&a, GRAN, &p0, 0));
  OK(cuMemCreate(&b, GRAN, &p0, 0));
  cr_assert_neq(a, b);
  OK(cuMemRelease(a));
  OK(cuMemCreate(&c, 2 * GRAN, &p1, 0)); /* another size, another device: the value comes back all the same */
  cr_assert_eq(c, a);
  CUmemAllocationProp got;
  OK(cuMemGetAllocationPropertiesFromHandle(&got, c));
  cr_assert_eq(got.location.id, 1, "the reused value names the new allocation");
  cr_assert_eq(sim_block(c, SIMCUDA_VMM).bytes, 2 * GRAN);
  /* a released handle kept alive by a mapping is not reused until the mapping goes */
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  OK(cuMemMap(va, GRAN, 0, b, 0));
  OK(cuMemRelease(b));
  OK(cuMemCreate(&d, GRAN, &p0, 0));
  cr_assert_neq(d, b);
  OK(cuMemUnmap(va, GRAN));
  OK(cuMemCreate(&e, GRAN, &p0, 0));
  cr_assert_eq(e, b);
}

Test(sim_vmm, mapped_bytes_are_counted) {
  sim_primary(0);
  CUmemAllocationProp p1 = prop_for(1);
  CUmemGenericAllocationHandle h0 = create(4 * MiB), h1;
  OK(cuMemCreate(&h1, 2 * MiB, &p1, 0));
  CUdeviceptr va;
  OK(cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0));
  OK(cuMemMap(va, 4 * MiB, 0, h0, 0));
  OK(cuMemMap(va + 4 * MiB, 2 * MiB, 0, h0, 0)); /* part of a handle */
  OK(cuMemMap(va + 8 * MiB, 2 * MiB, 0, h1, 0));
  cr_assert_eq(sim_stats(0, NULL).vmm_mapped_bytes, 6 * MiB);
  cr_assert_eq(sim_stats(1, NULL).vmm_mapped_bytes, 2 * MiB);
  cr_assert_eq(sim_stats(-1, NULL).vmm_mapped_bytes, 8 * MiB);
  OK(cuMemUnmap(va, 6 * MiB));
  cr_assert_eq(sim_stats(-1, NULL).vmm_mapped_bytes, 2 * MiB);
  OK(cuMemUnmap(va + 8 * MiB, 2 * MiB));
  cr_assert_eq(sim_stats(-1, NULL).vmm_mapped_bytes, 0);
}
