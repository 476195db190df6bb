/* names.h: a value outside a list is named "?" (a report or snapshot of a newer or corrupt value never indexes past
 * a table); each list's names are distinct. The names themselves are checked against Python's and the GPU
 * tests' tables by tests/cli/test_names_docs.py. */
#include "names.h"

#include <criterion/criterion.h>
#include <string.h>

Test(names, values_outside_a_list_are_question_marks) {
  cr_assert_str_eq(gr_kind_name(0), "?");
  cr_assert_str_eq(gr_kind_name(GPURECLAIM_KIND_HOST + 1), "?");
  cr_assert_str_eq(gr_kind_name(-1), "?");
  cr_assert_str_eq(gr_block_state_name(0), "?");
  cr_assert_str_eq(gr_block_state_name(GPURECLAIM_BLOCK_RELEASED + 1), "?");
  cr_assert_str_eq(gr_trigger_name(0), "?");
  cr_assert_str_eq(gr_trigger_name(GPURECLAIM_TRIGGER_CALL + 1), "?");
  cr_assert_str_eq(gr_sleep_state_name(-1), "?");
  cr_assert_str_eq(gr_api_name(GR_API_NONE), "?");
  cr_assert_str_eq(gr_api_name(11), "?", "the gap between driver (..15) and runtime (16..) calls");
  cr_assert_str_eq(gr_api_name(GR_API_COUNT), "?");
}

Test(names, each_in_range) {
  cr_assert_str_eq(gr_kind_name(GPURECLAIM_KIND_VMM_MAPPING), "vmm_mapping");
  cr_assert_str_eq(gr_block_state_name(GPURECLAIM_BLOCK_ORPHAN), "orphan");
  cr_assert_str_eq(gr_trigger_name(GPURECLAIM_TRIGGER_PEER), "peer");
  cr_assert_str_eq(gr_trigger_name(GPURECLAIM_TRIGGER_IDLE), "idle");
  cr_assert_str_eq(gr_sleep_state_name(GPURECLAIM_STATE_SLEEPING), "sleeping");
  cr_assert_str_eq(gr_api_name(GR_API_cuMemAlloc), "cuMemAlloc_v2");
  cr_assert_str_eq(gr_api_name(GR_API_cudaHostAlloc), "cudaHostAlloc");
  cr_assert_eq(GR_API_cudaMalloc, 16);
}

/* Distinct names within each list (a copy-and-paste slip would give two values one name). */
#define DISTINCT_(list)                                               \
  do {                                                                \
    const char *names[] = {list(NAME_)};                              \
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)       \
      for (size_t j = i + 1; j < sizeof names / sizeof names[0]; j++) \
        cr_assert_str_neq(names[i], names[j], #list);                 \
  } while (0)
#define NAME_(value, name) name,
#define NAME3_(id, value, name) name,
Test(names, distinct) {
  DISTINCT_(GR_KINDS);
  DISTINCT_(GR_BLOCK_STATES);
  DISTINCT_(GR_TRIGGERS);
  DISTINCT_(GR_SLEEP_STATES);
  DISTINCT_(GR_WHATS);
  const char *apis[] = {GR_APIS(NAME3_)};
  for (size_t i = 0; i < sizeof apis / sizeof apis[0]; i++)
    for (size_t j = i + 1; j < sizeof apis / sizeof apis[0]; j++)
      cr_assert_str_neq(apis[i], apis[j]);
}
