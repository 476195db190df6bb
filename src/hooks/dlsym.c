/*
 * dlsym.c -- the dlsym override: route 2 (dlsym(handle, "cu...")), and the way to the cuGetProcAddress route.
 *
 * Only cu[A-Z]* names are touched. Every other lookup, and every lookup with RTLD_NEXT, is a tail call to
 * libc's dlsym: glibc resolves RTLD_NEXT and RTLD_DEFAULT relative to the caller's object, found from the
 * return address, which a tail call leaves as it was. For a cu name, RTLD_DEFAULT is emulated: the global
 * scope, then the caller's own local scope. A per-thread guard makes re-entry (a malloc interposer that calls
 * dlsym from inside libc's dlsym) go straight to libc.
 */
#include "export.h"
#include "real.h"
#include "hooks.h"
#include "stats.h"
#include "gate.h"
#include "state.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

GR_NO_SANITIZE static inline bool is_driver_name(const char *s) {
  return s && s[0] == 'c' && s[1] == 'u' && s[2] >= 'A' && s[2] <= 'Z';
}

/* A lookup returned fn; give the caller what it should get. */
static void *route(const char *symbol, void *fn) {
  if (!fn)
    return NULL;
  int id = gr_hook_export_id(fn);
  if (id >= 0 || gr_hook_is_getproc_export(fn)) {
    /* Our own definition came back (RTLD_DEFAULT, or a handle whose scope includes gpureclaim). Without
     * gpureclaim the lookup would have found the driver's, or nothing: stay invisible to probes. */
    void *cuda = gr_real_libc()->dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return cuda && (id < 0 || gr_hook_export_real(id)) ? fn : NULL;
  }
  void *ours = gr_hook_getproc_for(symbol, fn);
  if (ours)
    return ours;
  void *export_fn = gr_hook_export_for(symbol);
  if (!export_fn)
    return gr_gate_wrap(fn); /* not an entry point gpureclaim wraps: behind a gate (sleep.c) */
  if (gr_hook_export_real(gr_hook_export_id(export_fn)) == fn)
    return export_fn;
  atomic_fetch_add_explicit(&gr_untracked_routes, 1, memory_order_relaxed);
  gr_warn_once(w_other, "dlsym(\"%s\") found a driver function outside the process's libcuda.so.1; "
                        "calls through it are not tracked", symbol);
  return fn;
}

GR_NOINLINE static void *dlsym_driver(void *handle, const char *symbol, void *caller) {
  const gr_real_libc_t *r = gr_real_libc();
  gr_tls.in_dlsym++;
  void *fn = r->dlsym(handle, symbol);
  if (!fn && handle == RTLD_DEFAULT)
    fn = gr_real_caller_sym(caller, symbol);
  fn = route(symbol, fn);
  gr_tls.in_dlsym--;
  return fn;
}

/* Exported as dlsym for unversioned references and, with hidden versions, for references to libc's
 * (gpureclaim.map says why). */
GR_INTERPOSE GR_NO_SANITIZE void *gr_dlsym_hook(void *handle, const char *symbol) {
  if (GR_LIKELY(!is_driver_name(symbol)) || handle == RTLD_NEXT || gr_tls.in_dlsym || gr_state_disabled())
    return gr_real_libc()->dlsym(handle, symbol); /* a tail call: the caller stays libc's caller */
  return dlsym_driver(handle, symbol, __builtin_return_address(0));
}
__asm__(".symver gr_dlsym_hook, dlsym@@GPURECLAIM_0");
__asm__(".symver gr_dlsym_hook, dlsym@GLIBC_2.34");
#if defined(__x86_64__)
__asm__(".symver gr_dlsym_hook, dlsym@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver gr_dlsym_hook, dlsym@GLIBC_2.17");
#endif
