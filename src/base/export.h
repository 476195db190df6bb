/* export.h -- which of the library's symbols are seen outside it. Internal. */
#ifndef GR_EXPORT_H
#define GR_EXPORT_H

/* What the library exports, one macro per kind (src/gpureclaim.map lists both, check_exports.cmake checks them):
 * the public functions of gpureclaim.h carry GPURECLAIM_API (that header's, on their declarations and
 * definitions), and the symbols that stand in for the driver's, the CUDA runtime's and libc's carry GR_INTERPOSE
 * (hooks/). Everything else is hidden (the version script's "local: *"). */
#define GR_INTERPOSE __attribute__((visibility("default")))
#define GR_HIDDEN __attribute__((visibility("hidden")))
/* Code that sanitizer runtimes reach before they are initialised: their start-up looks up real functions with
 * dlsym, which is gpureclaim's override. It must not be instrumented. */
#define GR_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

#endif /* GR_EXPORT_H */
