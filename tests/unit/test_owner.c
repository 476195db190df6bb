/* Who owns the blocks a library allocates (src/track/owner.c): by file name, then by Python package, never by a word
 * elsewhere in the path. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static void owner_is(const char *path, const char *want) {
  const char *got = gr_owner_of(path);
  cr_assert(want ? got && strcmp(got, want) == 0 : got == NULL, "%s: owner %s, expected %s", path ? path : "NULL",
            got ? got : "none", want ? want : "none");
}
#define OWNER owner_is

static const char *const venv = "/opt/torch/.venv/lib/python3.12/site-packages";

Test(owner, frameworks_by_file_name) {
  OWNER("/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so", "pytorch");
  OWNER("/usr/local/libtorch/lib/libtorch_cuda.so", "pytorch");
  OWNER("/build/tests/integration/fixtures/libc10_cuda_standin.so", "pytorch");
  OWNER("/x/jax_plugins/xla_cuda13/xla_cuda_plugin.so", "xla");
  OWNER("/usr/lib/libtensorflow_framework.so.2", "tensorflow");
}

Test(owner, python_packages_in_a_venv_named_after_another_framework) {
  /* The GPU machine's venv is /opt/torch/.venv: CuPy and JAX live under a path containing "torch". */
  char p[512];
  snprintf(p, sizeof p, "%s/cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so", venv);
  OWNER(p, "cupy");
  snprintf(p, sizeof p, "%s/cupy/cuda/memory.cpython-312-x86_64-linux-gnu.so", venv);
  OWNER(p, "cupy");
  snprintf(p, sizeof p, "%s/jaxlib/xla_extension.so", venv);
  OWNER(p, "xla");
  snprintf(p, sizeof p, "%s/jax_plugins/xla_cuda13/plugin.so", venv);
  OWNER(p, "xla");
  OWNER("/usr/lib/python3/dist-packages/torch/_C.cpython-311-x86_64-linux-gnu.so", "pytorch");
  /* The innermost site-packages counts (a venv inside another tree). */
  OWNER("/home/u/site-packages/torch/env/lib/python3.11/site-packages/numba/cuda/x.so", NULL);
}

Test(owner, cuda_library_workspaces) {
  char p[512];
  snprintf(p, sizeof p, "%s/nvidia/cu13/lib/libcublas.so.13", venv);
  OWNER(p, "cublas");
  snprintf(p, sizeof p, "%s/nvidia/cu13/lib/libcublasLt.so.13", venv);
  OWNER(p, "cublas");
  OWNER("/usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9", "cudnn");
  OWNER("/usr/lib/x86_64-linux-gnu/libnccl.so.2", "nccl");
  OWNER("/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libtorch_nvshmem.so", "pytorch");
}

Test(owner, the_programs_own_code_has_none) {
  OWNER("/opt/torch/bin/my_inference", NULL);       /* "torch" only in a directory name */
  OWNER("/home/me/cupy-experiments/a.out", NULL);   /* "cupy" only in a directory name */
  OWNER("/usr/local/cuda/lib64/libcudart.so.13", NULL);
  OWNER("/opt/torch/.venv/lib/python3.12/site-packages/mylib.cpython-312-x86_64-linux-gnu.so", NULL);
  OWNER("/opt/torch/.venv/lib/python3.12/site-packages/torchvision/_C.so", NULL); /* not "torch" */
  OWNER("python3", NULL);
  OWNER("", NULL);
  OWNER(NULL, NULL);
}
