/* Prints the public structs' sizes and a few offsets, for checking python/gpureclaim/'s ctypes mirrors. */
#include "gpureclaim.h"

#include <stddef.h>
#include <stdio.h>

int main(void) {
  printf("stats %zu %zu\n", sizeof(gpureclaim_stats_t), offsetof(gpureclaim_stats_t, pools));
  printf("report %zu %zu %zu\n", sizeof(gpureclaim_report_t), offsetof(gpureclaim_report_t, ndevices),
         offsetof(gpureclaim_report_t, devices));
  printf("device_report %zu\n", sizeof(gpureclaim_device_report_t));
  printf("block %zu %zu\n", sizeof(gpureclaim_block_t), offsetof(gpureclaim_block_t, handle));
  return 0;
}
