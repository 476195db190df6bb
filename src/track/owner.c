/*
 * owner.c -- who owns the blocks a library allocates, from the library's path.
 *
 * A framework's allocator keeps and reuses what it allocated, and CUDA's own libraries keep workspaces: such
 * blocks are never orphans, whatever scope was open when they were made (docs/ARCHITECTURE.md, "What may be released": freeing them
 * is a use-after-free). The owner is decided by the file name, then by the Python package the file is in (the
 * directory right under site-packages or dist-packages). Never by a word anywhere in the path: a virtual
 * environment at /opt/torch/.venv holds CuPy and JAX too.
 */
#include "owner.h"
#include "state.h"

#include <string.h>

typedef struct {
  const char *name, *owner;
} owner_rule_t;

/* File names, by prefix. */
static const owner_rule_t g_files[] = {
    {"libc10", "pytorch"},       {"libtorch", "pytorch"},       {"libcaffe2", "pytorch"},
    {"libcupy", "cupy"},         {"libxla", "xla"},             {"xla_", "xla"},
    {"libpjrt", "xla"},          {"pjrt_", "xla"},              {"libjax", "xla"},
    {"libtensorflow", "tensorflow"},
    /* CUDA libraries that allocate workspaces and handles of their own. */
    {"libcublas", "cublas"},     {"libcudnn", "cudnn"},         {"libnccl", "nccl"},
    {"libcufft", "cufft"},       {"libcusparse", "cusparse"},   {"libcusolver", "cusolver"},
    {"libcurand", "curand"},     {"libcutensor", "cutensor"},   {"libnvshmem", "nvshmem"},
};

/* Python packages, by the whole directory name. */
static const owner_rule_t g_packages[] = {
    {"torch", "pytorch"},   {"cupy", "cupy"},          {"cupy_backends", "cupy"},  {"jax", "xla"},
    {"jaxlib", "xla"},      {"jax_plugins", "xla"},    {"tensorflow", "tensorflow"},
};

static const char *package_of(const char *path, size_t *len) {
  static const char *const roots[] = {"/site-packages/", "/dist-packages/"};
  const char *best = NULL;
  for (size_t i = 0; i < GR_ARRAY_LEN(roots); i++)
    for (const char *p = strstr(path, roots[i]); p; p = strstr(p + 1, roots[i]))
      if (p > best)
        best = p + strlen(roots[i]);
  if (!best)
    return NULL;
  const char *end = strchr(best, '/');
  if (!end)
    return NULL; /* a module file directly in site-packages: no package */
  *len = (size_t)(end - best);
  return best;
}

const char *gr_owner_of(const char *path) {
  if (!path)
    return NULL;
  const char *slash = strrchr(path, '/');
  const char *file = slash ? slash + 1 : path;
  for (size_t i = 0; i < GR_ARRAY_LEN(g_files); i++)
    if (strncmp(file, g_files[i].name, strlen(g_files[i].name)) == 0)
      return g_files[i].owner;
  size_t len = 0;
  const char *pkg = package_of(path, &len);
  for (size_t i = 0; pkg && i < GR_ARRAY_LEN(g_packages); i++)
    if (strlen(g_packages[i].name) == len && memcmp(pkg, g_packages[i].name, len) == 0)
      return g_packages[i].owner;
  return NULL;
}
