/*
 * stacks.c -- short backtraces per allocation, for leak reports (GPURECLAIM_BACKTRACE=1).
 *
 * Stacks are interned: a record's site (gr_site_t) holds a 64-bit stack id (bit 63 set, which no user-space
 * code address has) instead of the code address, and the depot maps ids to frames, the code address first.
 * Only this file reads a site's bits: everyone else asks gr_site_pc() or gr_site_frames(). Distinct stacks are few (a program's allocation sites),
 * so the depot only grows with the program's code paths. Capturing unwinds the stack (microseconds), so this
 * is a debugging mode; the depot takes a mutex, which is fine at that cost. Frames inside gpureclaim, and
 * inside the CUDA runtime when a runtime call is being attributed, are dropped.
 */
#include "stacks.h"
#include "state.h"

#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TAG (UINT64_C(1) << 63)
#define BUCKETS 4096

typedef struct stack {
  struct stack *next;
  uint64_t hash;
  uint64_t id;
  int n;
  uintptr_t f[GR_STACK_MAX];
} stack_t_;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static stack_t_ *g_buckets[BUCKETS];
static stack_t_ **g_by_id;
static size_t g_count, g_cap;
static uintptr_t g_self_lo, g_self_hi;

static int find_self(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  (void)arg;
  uintptr_t me = (uintptr_t)&find_self;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
    if (ph->p_type == PT_LOAD && me >= lo && me < hi) {
      g_self_lo = lo;
      g_self_hi = hi;
      return 1;
    }
  }
  return 0;
}

/* Whether a frame's address is in gpureclaim's own code (find_self must have run). */
static bool in_self(const void *frame) { return (uintptr_t)frame >= g_self_lo && (uintptr_t)frame < g_self_hi; }

gr_site_t gr_stack_capture(uintptr_t pc) {
  void *raw[GR_STACK_MAX + 12];
  int n = backtrace(raw, (int)GR_ARRAY_LEN(raw));
  pthread_mutex_lock(&g_lock);
  if (!g_self_hi)
    dl_iterate_phdr(find_self, NULL);
  uintptr_t f[GR_STACK_MAX];
  int k = 0, i = 0;
  /* Under a sanitizer backtrace() is its interceptor, whose frame comes before gpureclaim's: it goes too. */
  while (i < n && !in_self(raw[i]))
    i++;
  if (i == n)
    i = 0;
  while (i < n && in_self(raw[i]))
    i++;
  if (gr_tls.rt_depth) { /* start at the runtime call's caller */
    int j = i;
    while (j < n && (uintptr_t)raw[j] != pc)
      j++;
    if (j < n)
      i = j;
  }
  for (; i < n && k < GR_STACK_MAX; i++)
    f[k++] = (uintptr_t)raw[i];
  if (k == 0 || f[0] != pc) { /* keep the attributed caller first, whatever the unwinder saw */
    memmove(f + 1, f, (size_t)(k < GR_STACK_MAX ? k : GR_STACK_MAX - 1) * sizeof f[0]);
    f[0] = pc;
    k = k < GR_STACK_MAX ? k + 1 : GR_STACK_MAX;
  }
  uint64_t h = 1469598103934665603u;
  for (int j = 0; j < k; j++)
    h = (h ^ f[j]) * 1099511628211u;
  uint64_t id = 0;
  for (stack_t_ *s = g_buckets[h % BUCKETS]; s; s = s->next)
    if (s->hash == h && s->n == k && memcmp(s->f, f, (size_t)k * sizeof f[0]) == 0) {
      id = s->id;
      break;
    }
  if (!id) {
    stack_t_ *s = malloc(sizeof *s);
    if (g_count == g_cap) {
      size_t cap = g_cap ? g_cap * 2 : 256;
      stack_t_ **p = realloc(g_by_id, cap * sizeof *p);
      if (p) {
        g_by_id = p;
        g_cap = cap;
      }
    }
    if (!s || g_count == g_cap) {
      free(s);
      pthread_mutex_unlock(&g_lock);
      return gr_site_at(pc);
    }
    s->hash = h;
    s->n = k;
    memcpy(s->f, f, (size_t)k * sizeof f[0]);
    s->next = g_buckets[h % BUCKETS];
    g_buckets[h % BUCKETS] = s;
    g_by_id[g_count] = s;
    id = s->id = ++g_count;
  }
  pthread_mutex_unlock(&g_lock);
  return (gr_site_t){TAG | id};
}

static const stack_t_ *lookup(gr_site_t site) {
  if (!(site.bits & TAG))
    return NULL;
  size_t id = (size_t)(site.bits & ~TAG);
  pthread_mutex_lock(&g_lock);
  const stack_t_ *s = id && id <= g_count ? g_by_id[id - 1] : NULL;
  pthread_mutex_unlock(&g_lock);
  return s;
}

uintptr_t gr_site_pc(gr_site_t site) {
  if (GR_LIKELY(!(site.bits & TAG)))
    return (uintptr_t)site.bits;
  const stack_t_ *s = lookup(site);
  return s && s->n ? s->f[0] : 0;
}

int gr_site_frames(gr_site_t site, uintptr_t *frames, int max) {
  if (max <= 0)
    return 0;
  const stack_t_ *s = lookup(site);
  if (!s) {
    frames[0] = gr_site_pc(site);
    return 1;
  }
  int n = s->n < max ? s->n : max;
  memcpy(frames, s->f, (size_t)n * sizeof frames[0]);
  return n;
}
