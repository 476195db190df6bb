/* The GPUs as reports show them (src/report/gpus.c), on the simulated driver (tests/sim/): every visible GPU
 * by ordinal with its UUID written as nvidia-smi writes it (the driver's 16 bytes, 8-4-4-4-12), none with
 * memory figures while this process has no context on it, and no driver: none at all. */
#include "gpureclaim_internal.h"
#include "json.h"
#include "jsonread.h"
#include "report.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static jnode_t *gpus(bool memory) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  gr_report_gpus_json(&b, memory);
  jb_obj_end(&b);
  const char *err = NULL;
  jnode_t *j = jparse_object(b.p, &err);
  cr_assert_not_null(j, "not a JSON object (%s): %s", err, b.p);
  jb_free(&b);
  return j;
}

Test(gpus, without_a_driver_no_gpu_is_listed) {
  /* gr_drv is not resolved in this process */
  jnode_t *j = gpus(false);
  cr_assert_eq(jget(j, "gpus")->n, 0);
  jdelete(j);
}

Test(gpus, every_visible_gpu_is_listed_with_its_uuid) {
  cr_assert_eq(gr_real_resolve_drv(), 0, "the simulated driver did not load");
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))gr_real_driver("cuInit");
  CUresult (*get_uuid)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))gr_real_driver("cuDeviceGetUuid_v2");
  cr_assert(init && get_uuid);
  cr_assert_eq(init(0), CUDA_SUCCESS);
  int count = 0;
  cr_assert_eq(gr_drv.cuDeviceGetCount(&count), CUDA_SUCCESS);
  cr_assert_gt(count, 0, "the simulated machine has no GPU");
  jnode_t *j = gpus(false);
  const jnode_t *g = jget(j, "gpus");
  cr_assert_eq((int)g->n, count);
  for (int d = 0; d < count; d++) {
    CUdevice dev;
    CUuuid u;
    cr_assert_eq(gr_drv.cuDeviceGet(&dev, d), CUDA_SUCCESS);
    cr_assert_eq(get_uuid(&u, dev), CUDA_SUCCESS);
    const unsigned char *x = (const unsigned char *)u.bytes;
    char want[64];
    snprintf(want, sizeof want, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1],
             x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
    cr_assert_eq(jint(&g->kids[d], "device", -1), d);
    cr_assert_str_eq(jstr(&g->kids[d], "uuid", ""), want);
    cr_assert_null(jget(&g->kids[d], "free_bytes"), "memory figures were not asked for");
    char buf[64];
    cr_assert(gr_report_gpu_uuid(d, buf, sizeof buf));
    cr_assert_str_eq(buf, want);
  }
  cr_assert_not(gr_report_gpu_uuid(count, (char[64]){0}, 64), "a UUID for an ordinal past the last GPU");
  jdelete(j);
  /* with memory: only GPUs this process has a context on (none is registered here) */
  j = gpus(true);
  cr_assert_eq(jget(j, "gpus")->n, 0);
  jdelete(j);
}
