/*
 * scope.c -- scopes: blocks a program declares abandoned when the scope ends.
 *
 * A scope occupies one of 65,535 slots; records store the slot (16 bits), the API hands out a 64-bit id
 * (sequence << 16 | slot) so a stale or repeated id is recognised. A slot is held by the open scope and by
 * every live record tagged with it; it is reused only when the scope has ended and its last record left, so a
 * record can never be mistaken for a block of a later scope. Each thread keeps its own stack of open scopes,
 * by id: a scope ended from another thread leaves it lazily, and its slot may meanwhile be open again for
 * another scope, which must not claim this thread's blocks.
 */
#include "gpureclaim_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NSLOTS 65536 /* slot 0 means "no scope" */
#define MAX_NEST 32

enum { S_FREE = 0, S_OPEN = 1, S_ENDED = 2, S_OPENING = 3 };
/* Set in a slot's id when its scope ends; never in an id handed out (sequence numbers stay below 2^47). */
#define ID_ENDED (UINT64_C(1) << 63)

/* Where a test interleaves a concurrent end (tests/unit/test_scope.c); nothing in the library. */
#ifndef GR_SCOPE_END_RACE_POINT
#define GR_SCOPE_END_RACE_POINT(scope) ((void)0)
#endif

typedef struct slot {
  _Atomic uint64_t id;
  _Atomic uint32_t refs;
  _Atomic int state;
} scope_slot_t;

/* Mapped on the first scope_begin (1 MiB of zeroes the kernel provides lazily). */
static _Atomic(scope_slot_t *) g_slots_p;
#define g_slots (atomic_load_explicit(&g_slots_p, memory_order_acquire))
static _Atomic uint64_t g_seq;
static _Atomic uint32_t g_cursor;

static GR_TLS uint64_t t_stack[MAX_NEST]; /* ids, not slots: an ended scope's slot may be open again, for
                                           * another scope of another thread */
static GR_TLS unsigned t_depth;

static inline bool is_open(uint16_t s, uint64_t id) {
  return atomic_load_explicit(&g_slots[s].state, memory_order_acquire) == S_OPEN &&
         atomic_load_explicit(&g_slots[s].id, memory_order_relaxed) == id;
}

static void unref(uint16_t s) {
  if (!s || !g_slots)
    return;
  if (atomic_fetch_sub_explicit(&g_slots[s].refs, 1, memory_order_acq_rel) == 1 &&
      atomic_load_explicit(&g_slots[s].state, memory_order_acquire) == S_ENDED) {
    int ended = S_ENDED;
    atomic_compare_exchange_strong_explicit(&g_slots[s].state, &ended, S_FREE, memory_order_acq_rel,
                                            memory_order_relaxed);
  }
}

void gr_scope_unref(uint16_t slot) { unref(slot); }

uint64_t gr_scope_id(uint16_t slot) {
  return slot && g_slots ? atomic_load_explicit(&g_slots[slot].id, memory_order_relaxed) & ~ID_ENDED : 0;
}

static inline uint16_t slot_of(uint64_t id) { return (uint16_t)(id & 0xffff); }

/* Innermost scope of this thread that is still open (its slot open under its id), dropping ended ones from the
 * top. Returns its id, or 0. */
static uint64_t innermost(void) {
  while (t_depth) {
    uint64_t id = t_stack[t_depth - 1];
    if (is_open(slot_of(id), id))
      return id;
    t_depth--;
  }
  return 0;
}

uint16_t gr_scope_tag(void) {
  if (GR_LIKELY(t_depth == 0))
    return 0;
  uint64_t id = innermost();
  uint16_t s = slot_of(id);
  if (s) {
    atomic_fetch_add_explicit(&g_slots[s].refs, 1, memory_order_acq_rel);
    /* Ended between the check and the reference (its slot maybe reused since): the block is not part of it
     * (it stays live). */
    if (!is_open(s, id)) {
      unref(s);
      return 0;
    }
  }
  return s;
}

static bool map_slots(void) {
  if (atomic_load_explicit(&g_slots_p, memory_order_acquire))
    return true;
  void *p = mmap(NULL, NSLOTS * sizeof(scope_slot_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return false;
  scope_slot_t *expected = NULL;
  if (!atomic_compare_exchange_strong_explicit(&g_slots_p, &expected, p, memory_order_acq_rel, memory_order_acquire))
    munmap(p, NSLOTS * sizeof(scope_slot_t));
  return true;
}

GR_EXPORT uint64_t gpureclaim_scope_begin(void) {
  if (gr_core_disabled() || !map_slots())
    return 0;
  if (t_depth == MAX_NEST) {
    gr_warn_once(w_deep, "scopes nested deeper than %d on one thread; gpureclaim_scope_begin() returns 0", MAX_NEST);
    return 0;
  }
  uint32_t start = atomic_fetch_add_explicit(&g_cursor, 1, memory_order_relaxed);
  for (uint32_t n = 0; n < NSLOTS - 1; n++) {
    uint16_t s = (uint16_t)((start + n) % (NSLOTS - 1) + 1);
    int free_state = S_FREE;
    if (atomic_load_explicit(&g_slots[s].state, memory_order_relaxed) != S_FREE ||
        atomic_load_explicit(&g_slots[s].refs, memory_order_relaxed) != 0 ||
        !atomic_compare_exchange_strong_explicit(&g_slots[s].state, &free_state, S_OPENING, memory_order_acq_rel,
                                                 memory_order_relaxed))
      continue;
    uint64_t id = ((atomic_fetch_add_explicit(&g_seq, 1, memory_order_relaxed) + 1) << 16) | s;
    atomic_store_explicit(&g_slots[s].id, id, memory_order_relaxed);
    /* The open scope's own reference. An add, not a store: a thread tagging a block may hold a passing
     * reference to this slot (gr_scope_tag() takes it before it checks the id) and drops it later. */
    atomic_fetch_add_explicit(&g_slots[s].refs, 1, memory_order_acq_rel);
    /* Open only now, with the new id in place: a thread still holding an earlier scope's id for this slot
     * sees it open only together with the new id, so never as its own. */
    atomic_store_explicit(&g_slots[s].state, S_OPEN, memory_order_release);
    t_stack[t_depth++] = id;
    return id;
  }
  gr_warn_once(w_full, "65,535 scopes hold live blocks at once; gpureclaim_scope_begin() returns 0");
  return 0;
}

GR_EXPORT uint64_t gpureclaim_scope_current(void) { return innermost(); }

/* ---- ending ---- */

typedef struct {
  uint16_t slot;
  uintptr_t pcs[64];
  const char *owners[64];
  uint64_t orphans;
} end_t;

static const char *owner_cached(end_t *e, uintptr_t pc) {
  size_t h = (pc >> 4) % GR_ARRAY_LEN(e->pcs);
  if (e->pcs[h] == pc)
    return e->owners[h];
  const char *o = gr_reg_library(pc).owner;
  e->pcs[h] = pc;
  e->owners[h] = o;
  return o;
}

static int orphan_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  end_t *e = arg;
  if (r->scope != e->slot || r->state != GR_ST_LIVE || r->kind == GPURECLAIM_KIND_VMM_MAPPING ||
      r->kind == GPURECLAIM_KIND_VA)
    return 0;
  /* Blocks a framework's allocator made are the framework's: never orphans. */
  if (owner_cached(e, gr_site_pc(r->site)))
    return 0;
  gr_rec_t expect = *r, want = *r;
  want.state = GR_ST_ORPHAN;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN) {
    if (expect.state != GR_ST_LIVE)
      return 0;
    want = expect;
    want.state = GR_ST_ORPHAN;
  }
  if (rc == 0) {
    gr_stats_orphaned(&expect, +1);
    e->orphans++;
  }
  return 0;
}

GR_EXPORT int gpureclaim_scope_end(uint64_t scope, unsigned flags) {
  if (gr_core_disabled())
    return -ENOTSUP;
  if (scope == 0 || (flags & ~GPURECLAIM_FREE_NOW))
    return -EINVAL;
  uint16_t s = (uint16_t)(scope & 0xffff);
  if (s == 0 || (scope & ID_ENDED) || !g_slots || !is_open(s, scope))
    return -ENOENT;
  GR_SCOPE_END_RACE_POINT(scope);
  /* One compare-and-swap on the whole id: of two threads ending this scope at once only one wins, and a
   * thread that checked the scope open before another ended it cannot end a later scope that has taken the
   * slot meanwhile (its id differs). */
  uint64_t expect = scope;
  if (!atomic_compare_exchange_strong_explicit(&g_slots[s].id, &expect, scope | ID_ENDED, memory_order_acq_rel,
                                               memory_order_relaxed))
    return -ENOENT; /* ended concurrently */
  atomic_store_explicit(&g_slots[s].state, S_ENDED, memory_order_release);
  /* Leave this thread's stack if it is there (another thread's stack drops it lazily). */
  for (unsigned i = t_depth; i-- > 0;)
    if (t_stack[i] == scope) {
      memmove(&t_stack[i], &t_stack[i + 1], (t_depth - i - 1) * sizeof t_stack[0]);
      t_depth--;
      break;
    }
  if (atomic_load_explicit(&gr_core_state, memory_order_acquire) == 1) {
    end_t *e = calloc(1, sizeof *e);
    if (e) {
      e->slot = s;
      gr_table_visit(orphan_one, e);
      if ((flags & GPURECLAIM_FREE_NOW) && e->orphans)
        gr_rel_free_scope_now(s, NULL);
      free(e);
    }
  }
  unref(s); /* the scope's own reference */
  return 0;
}

void gr_scope_atfork_child(void) {
  /* Blocks and scopes of the parent are not the child's. */
  scope_slot_t *p = atomic_exchange_explicit(&g_slots_p, NULL, memory_order_acq_rel);
  if (p)
    munmap(p, NSLOTS * sizeof(scope_slot_t));
  t_depth = 0;
}
