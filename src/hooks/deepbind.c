/*
 * deepbind.c -- route 5: libraries loaded with RTLD_DEEPBIND.
 *
 * Such a library looks symbols up in itself and its own dependencies before the global scope, so its calls
 * to dlsym and dlopen bind to libc's (past gpureclaim's preloaded overrides) and its cu* calls to libcuda's.
 * gpureclaim's dlopen override lets every other dlopen through as a tail call: glibc finds the caller from the
 * return address and searches the caller's RPATH/RUNPATH, which must stay so. For RTLD_DEEPBIND it loads the
 * library itself, searching the caller's paths first (RTLD_DI_SERINFO) so that relative names resolve as they
 * would have, and then points the GOT entries of dlsym, dlopen and the hooked driver names in every object the
 * load brought in at gpureclaim's definitions. Other relocations are left alone.
 */
#include "export.h"
#include "real.h"
#include "hooks.h"
#include "state.h"

#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

GR_INTERPOSE void *gr_dlopen_hook(const char *file, int mode);

#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

typedef struct {
  uintptr_t *bases;
  size_t n, cap;
} objset_t;

static int collect(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  objset_t *s = arg;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    uintptr_t *p = realloc(s->bases, cap * sizeof *p);
    if (!p)
      return 1;
    s->bases = p;
    s->cap = cap;
  }
  s->bases[s->n++] = (uintptr_t)info->dlpi_phdr; /* unique per loaded object */
  return 0;
}

static bool seen(const objset_t *s, uintptr_t key) {
  for (size_t i = 0; i < s->n; i++)
    if (s->bases[i] == key)
      return true;
  return false;
}

/* What a GOT entry for this name should hold, or NULL to leave it. */
static void *replacement(const char *name) {
  if (strcmp(name, "dlsym") == 0)
    return (void *)gr_dlsym_hook;
  if (strcmp(name, "dlopen") == 0)
    return (void *)gr_dlopen_hook;
  if (name[0] != 'c' || name[1] != 'u')
    return NULL;
  if (strcmp(name, "cuGetProcAddress") == 0 || strcmp(name, "cuGetProcAddress_v2") == 0)
    return gr_hook_getproc_for(name, gr_real_driver(name));
  return gr_hook_export_for(name);
}

#ifdef R_JUMP_SLOT
static void patch_slot(uintptr_t addr, void *target, uintptr_t relro_lo, uintptr_t relro_hi) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t start = addr & ~(uintptr_t)(page - 1);
  bool relro = addr >= relro_lo && addr < relro_hi;
  if (relro && mprotect((void *)start, (size_t)page, PROT_READ | PROT_WRITE) != 0)
    return;
  __atomic_store_n((void **)addr, target, __ATOMIC_RELEASE);
  if (relro)
    mprotect((void *)start, (size_t)page, PROT_READ);
}

static void patch_relocs(uintptr_t base, const ElfW(Rela) * rel, size_t bytes, const ElfW(Sym) * symtab,
                         const char *strtab, uintptr_t relro_lo, uintptr_t relro_hi, unsigned *patched) {
  for (size_t i = 0; rel && i < bytes / sizeof *rel; i++) {
    unsigned type = (unsigned)ELF64_R_TYPE(rel[i].r_info);
    if (type != R_JUMP_SLOT && type != R_GLOB_DAT)
      continue;
    const char *name = strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name;
    void *target = replacement(name);
    if (target) {
      patch_slot(base + rel[i].r_offset, target, relro_lo, relro_hi);
      (*patched)++;
    }
  }
}

/* glibc relocates the dynamic section's address entries in place on most targets, not on all. */
static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) p) { return p < base ? base + p : p; }

static int patch_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  objset_t *before = ((objset_t **)arg)[0];
  unsigned *patched = ((unsigned **)arg)[1];
  if (seen(before, (uintptr_t)info->dlpi_phdr))
    return 0;
  uintptr_t base = info->dlpi_addr, relro_lo = 0, relro_hi = 0;
  const ElfW(Dyn) *dyn = NULL;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
    else if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
      relro_lo = base + info->dlpi_phdr[i].p_vaddr;
      relro_hi = relro_lo + info->dlpi_phdr[i].p_memsz;
    }
  }
  if (!dyn)
    return 0;
  const ElfW(Sym) *symtab = NULL;
  const char *strtab = NULL;
  const ElfW(Rela) *jmprel = NULL, *rela = NULL;
  size_t jmpsz = 0, relasz = 0;
  for (; dyn->d_tag != DT_NULL; dyn++) {
    switch (dyn->d_tag) {
    case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_addr(base, dyn->d_un.d_ptr); break;
    case DT_STRTAB: strtab = (const char *)dyn_addr(base, dyn->d_un.d_ptr); break;
    case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_addr(base, dyn->d_un.d_ptr); break;
    case DT_PLTRELSZ: jmpsz = dyn->d_un.d_val; break;
    case DT_RELA: rela = (const ElfW(Rela) *)dyn_addr(base, dyn->d_un.d_ptr); break;
    case DT_RELASZ: relasz = dyn->d_un.d_val; break;
    default: break;
    }
  }
  if (!symtab || !strtab)
    return 0;
  patch_relocs(base, jmprel, jmpsz, symtab, strtab, relro_lo, relro_hi, patched);
  patch_relocs(base, rela, relasz, symtab, strtab, relro_lo, relro_hi, patched);
  return 0;
}
#endif

/* Loads a relative name the way the caller would have: its search path first. */
static void *load_as(const char *file, int mode, void *caller) {
  const gr_real_libc_t *r = gr_real_libc();
  Dl_info info;
  struct link_map *lm = NULL;
  if (file && !strchr(file, '/') && dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm) {
    Dl_serinfo probe;
    if (dlinfo(lm, RTLD_DI_SERINFOSIZE, &probe) == 0 && probe.dls_size > 0) {
      Dl_serinfo *si = malloc(probe.dls_size);
      if (si) {
        memcpy(si, &probe, sizeof probe);
        if (dlinfo(lm, RTLD_DI_SERINFO, si) == 0) {
          for (unsigned i = 0; i < si->dls_cnt; i++) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", si->dls_serpath[i].dls_name, file) >= (int)sizeof path)
              continue;
            if (access(path, R_OK) == 0) {
              free(si);
              return r->dlopen(path, mode);
            }
          }
        }
        free(si);
      }
    }
  }
  return r->dlopen(file, mode);
}

GR_NOINLINE static void *dlopen_deepbind(const char *file, int mode, void *caller) {
  objset_t before = {0};
  dl_iterate_phdr(collect, &before);
  void *h = load_as(file, mode, caller);
#ifdef R_JUMP_SLOT
  if (h) {
    unsigned patched = 0;
    void *args[2] = {&before, &patched};
    dl_iterate_phdr(patch_object, args);
    gr_info("RTLD_DEEPBIND load of %s: %u references redirected to gpureclaim", file ? file : "(main)", patched);
  }
#endif
  free(before.bases);
  return h;
}

/* Exported as dlopen, with libc's versions hidden, like dlsym (gpureclaim.map). */
GR_INTERPOSE GR_NO_SANITIZE void *gr_dlopen_hook(const char *file, int mode) {
  if (GR_LIKELY(!(mode & RTLD_DEEPBIND)) || gr_state_disabled())
    return gr_real_libc()->dlopen(file, mode); /* a tail call: glibc still sees the caller */
  return dlopen_deepbind(file, mode, __builtin_return_address(0));
}
__asm__(".symver gr_dlopen_hook, dlopen@@GPURECLAIM_0");
__asm__(".symver gr_dlopen_hook, dlopen@GLIBC_2.34");
#if defined(__x86_64__)
__asm__(".symver gr_dlopen_hook, dlopen@GLIBC_2.2.5");
#elif defined(__aarch64__)
__asm__(".symver gr_dlopen_hook, dlopen@GLIBC_2.17");
#endif
