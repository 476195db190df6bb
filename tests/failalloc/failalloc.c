/*
 * failalloc.c -- failure injection for the library's own memory: linked into libgpureclaim_failalloc.so (the
 * library's sources, built again with -Wl,--wrap for malloc, calloc, realloc, aligned_alloc and mmap), every
 * call gpureclaim itself makes to one of them asks the test program first. The program decides by defining
 *   int gr_failalloc_fail(int what, size_t bytes);   (what: one of FA_* below; nonzero: fail this call)
 * and exporting it; without it nothing fails. --wrap reaches only the library's direct calls, never libc's
 * internal ones nor a sanitizer's, so the test fails exactly what gpureclaim asked for, in any build.
 */
#include "failalloc.h"

#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>

extern int gr_failalloc_fail(int what, size_t bytes) __attribute__((weak, visibility("default")));

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void *__real_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);

static int fail(int what, size_t bytes) {
  if (gr_failalloc_fail && gr_failalloc_fail(what, bytes)) {
    errno = ENOMEM;
    return 1;
  }
  return 0;
}

void *__wrap_malloc(size_t n) { return fail(FA_MALLOC, n) ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return fail(FA_CALLOC, k * n) ? NULL : __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { return fail(FA_REALLOC, n) ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return fail(FA_ALIGNED, n) ? NULL : __real_aligned_alloc(a, n); }
void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
  /* Only anonymous maps are the library's memory; a file it maps is not what this injects. */
  if ((flags & MAP_ANONYMOUS) && fail(FA_MMAP, n))
    return MAP_FAILED;
  return __real_mmap(a, n, prot, flags, fd, off);
}
