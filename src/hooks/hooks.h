/* hooks.h -- interposition: the hooked entry points and their routes (hooks/). Internal. */
#ifndef GR_HOOKS_HOOKS_H
#define GR_HOOKS_HOOKS_H

#include "gpureclaim.h"
#include "table.h"

/* Calls that make blocks (record api field): GR_API_* and gr_api_name() in names.h. */

/* driver.c: one entry per hooked variant (hooks/hooklist.h). */
typedef struct gr_hook_info {
  const char *symbol; /* exported name of the variant */
  const char *base;   /* name asked of cuGetProcAddress */
  int version;        /* first version returning this variant */
  int ptsz;           /* per-thread default stream variant */
  void *export_fn;    /* gpureclaim's exported definition */
  void *pa_fn;        /* the wrapper cuGetProcAddress hands out */
} gr_hook_info_t;
extern const gr_hook_info_t gr_hooks[];
extern _Atomic(void *) gr_pa_real[];
int gr_hook_count(void);
/* Index of an exported hook function, -1 if fn is not one. */
int gr_hook_export_id(const void *fn);
/* The libcuda function the exported hook id calls (resolved on first use), NULL if the driver lacks it. */
void *gr_hook_export_real(int id);

/* dlsym.c, deepbind.c: the overrides of dlsym and dlopen. */
void *gr_dlsym_hook(void *handle, const char *symbol);
void *gr_dlopen_hook(const char *file, int mode);

/* procaddr.c: our exported getter for a dlsym of "cuGetProcAddress[_v2]" that found libcuda's, else NULL. */
void *gr_hook_getproc_for(const char *symbol, void *real);
bool gr_hook_is_getproc_export(const void *fn);
/* driver.c: the exported-route wrapper for an exported name, NULL if not hooked. */
void *gr_hook_export_for(const char *exported_name);

#endif /* GR_HOOKS_HOOKS_H */
