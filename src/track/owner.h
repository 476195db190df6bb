/* owner.h -- who owns the blocks a library allocates (owner.c). Internal. */
#ifndef GR_OWNER_H
#define GR_OWNER_H

/* Who owns the blocks the library at path allocates (never orphans): a framework ("pytorch", "cupy",
 * "xla", "tensorflow") or a CUDA library keeping workspaces ("cublas", "cudnn", "nccl", ...); NULL for the
 * program's own code. */
const char *gr_owner_of(const char *path);

#endif /* GR_OWNER_H */
