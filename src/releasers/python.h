/* python.h -- framework caches through CPython (releasers/python.c). Internal. */
#ifndef GR_RELEASERS_PYTHON_H
#define GR_RELEASERS_PYTHON_H

#include <stdint.h>

/* Framework caches through CPython; bytes given back. Never called from inside an allocation. */
uint64_t gr_py_release(void);
/* If the calling thread holds Python's GIL, gives it up and returns its thread state (else NULL). */
void *gr_py_save_if_held(void);
void gr_py_restore(void *state);
/* What framework caches hold (reserved, in use, releasable), read through CPython without changing them;
 * fills up to max entries and returns how many. 0 without Python or with GPURECLAIM_PYTHON=0. Takes the GIL:
 * never called from inside an allocation. */
typedef struct gr_py_cache {
  char name[40]; /* "pytorch", "cupy", or the module defining __gpureclaim_memory__ */
  int device;
  uint64_t reserved, allocated, releasable;
} gr_py_cache_t;
int gr_py_caches(gr_py_cache_t *out, int max);

#endif /* GR_RELEASERS_PYTHON_H */
