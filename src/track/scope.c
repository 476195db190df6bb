/*
 * scope.c -- scopes: blocks a program declares abandoned when the scope ends.
 *
 * A scope occupies one of 65,535 slots; records store the slot (16 bits), the API hands out a 64-bit id
 * (sequence << 16 | slot) so a stale or repeated id is recognised. A slot is held by the open scope and by
 * every live record tagged with it; it is reused only when the scope has ended and its last record left, so a
 * record can never be mistaken for a block of a later scope. Each thread keeps its own stack of open scopes,
 * by id: a scope ended from another thread leaves it lazily, and its slot may meanwhile be open again for
 * another scope, which must not claim this thread's blocks.
 *
 * Ending a scope costs what the scope tagged, not what the table holds: each slot keeps a list of the keys of
 * its records, appended once a record is in the table (gr_scope_note(), from track.c, for records with a scope
 * only, so an allocation outside any scope does nothing more), and the end orphans, of the records found under
 * those keys, those still LIVE and still carrying the slot. The check is on the record, not the key: the driver
 * hands a freed address out again at once, and the block then at that address may be another scope's or no
 * scope's. A list is guarded by a spin lock in its slot (held for one append, a compaction, or the end taking
 * the list); the end takes the list and closes it, so that a record noted after that (allocated while another
 * thread ended the scope) is not part of the ended scope: it stays live. When the list fills, it is first rid of
 * keys whose record left or no longer carries the slot, and of duplicates (addresses the scope freed and got
 * back); it doubles only when that leaves it more than half full, so it stays below four times the most blocks
 * the scope held at once (64 keys at least). A record put back after a refused free is noted again, as a
 * compaction may have dropped its key while it was out of the table. When memory runs out for a list, the
 * scope is marked and its end falls back to a scan of the whole table: a key whose record may still be the
 * scope's is never dropped.
 */
#include "scope.h"
#include "registry.h"
#include "stats.h"
#include "stacks.h"
#include "state.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NSLOTS 65536 /* slot 0 means "no scope" */
_Static_assert(NSLOTS <= 1 << 16, "a scope slot fits a record's 16 bits (table.h)");
#define MAX_NEST 32

enum { S_FREE = 0, S_OPEN = 1, S_ENDED = 2, S_OPENING = 3 };
/* Set in a slot's id when its scope ends; never in an id handed out (sequence numbers stay below 2^47). */
#define ID_ENDED (UINT64_C(1) << 63)

/* Where a test interleaves a concurrent end, and fails the growth of a key list (tests/unit/test_scope.c);
 * nothing in the library. */
#ifndef GR_SCOPE_END_RACE_POINT
#define GR_SCOPE_END_RACE_POINT(scope) ((void)0)
#endif
#ifndef GR_SCOPE_REALLOC
#define GR_SCOPE_REALLOC realloc
#endif

typedef gr_scope_key_t tagged_t;

typedef struct slot {
  _Atomic uint64_t id;
  _Atomic uint32_t refs;
  _Atomic int state;
  /* The keys of the records noted for this slot's scope; under `lock`. */
  _Atomic uint32_t lock;
  uint32_t n, cap;
  uint8_t closed;   /* the scope ended: tagged blocks are no longer its */
  uint8_t overflow; /* a key could not be kept: the end scans the table */
  tagged_t *keys;
} scope_slot_t;
_Static_assert(sizeof(scope_slot_t) == 40, "65,536 slots map 2.5 MiB");

/* Mapped on the first scope_begin (2.5 MiB of zeroes the kernel provides lazily). */
static _Atomic(scope_slot_t *) g_slots_p;
#define g_slots (atomic_load_explicit(&g_slots_p, memory_order_acquire))
static _Atomic uint64_t g_seq;
static _Atomic uint32_t g_cursor;

static GR_TLS uint64_t t_stack[MAX_NEST]; /* ids, not slots: an ended scope's slot may be open again, for
                                           * another scope of another thread */

static inline bool is_open(uint16_t s, uint64_t id) {
  return atomic_load_explicit(&g_slots[s].state, memory_order_acquire) == S_OPEN &&
         atomic_load_explicit(&g_slots[s].id, memory_order_relaxed) == id;
}

static void unref(uint16_t s) {
  if (!s || !g_slots)
    return;
  uint32_t was = atomic_fetch_sub_explicit(&g_slots[s].refs, 1, memory_order_acq_rel);
  GR_ASSERT(was > 0); /* every record of a scope holds one reference, and gives it back once */
  if (was == 1 && atomic_load_explicit(&g_slots[s].state, memory_order_acquire) == S_ENDED) {
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
  while (gr_tls.scope_depth) {
    uint64_t id = t_stack[gr_tls.scope_depth - 1];
    if (is_open(slot_of(id), id))
      return id;
    gr_tls.scope_depth--;
  }
  return 0;
}

/* ---- key lists ---- */

static void lock_slot(scope_slot_t *sl) {
  while (atomic_exchange_explicit(&sl->lock, 1, memory_order_acquire))
    sched_yield(); /* held for one append, a compaction, or an end taking the list */
}
static void unlock_slot(scope_slot_t *sl) { atomic_store_explicit(&sl->lock, 0, memory_order_release); }

static int by_key(const void *a, const void *b) {
  const tagged_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return (x->ks > y->ks) - (x->ks < y->ks);
}

/* Whether a record under k may still be a block of slot s (present in any state, carrying s). */
static bool still_tagged(uint16_t s, const tagged_t *k) {
  gr_rec_t r;
  /* GR_NOT_YOUNG: a scoped block's record never goes to a log of young records (track.c). */
  return (gr_table_lookup(k->ks, k->key,
                          GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN) | GR_STMASK(GR_ST_RELEASED) | GR_NOT_YOUNG,
                          &r) == 0 &&
          r.scope == s) ||
         (gr_table_lookup(k->ks, k->key, GR_STMASK(GR_ST_RECLAIMING), &r) == 0 && r.scope == s);
}

/* Makes room for one more key in a full list (lock held): drops keys no longer the scope's, and duplicates;
 * doubles when that leaves it more than half full. False when memory ran out. */
static bool make_room(uint16_t s, scope_slot_t *sl) {
  if (sl->cap) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < sl->n; i++)
      if (still_tagged(s, &sl->keys[i]))
        sl->keys[k++] = sl->keys[i];
    if (k > 1) {
      qsort(sl->keys, k, sizeof *sl->keys, by_key);
      uint32_t u = 1;
      for (uint32_t i = 1; i < k; i++)
        if (by_key(&sl->keys[i], &sl->keys[u - 1]) != 0)
          sl->keys[u++] = sl->keys[i];
      k = u;
    }
    sl->n = k;
    if (k <= sl->cap / 2)
      return true;
  }
  uint32_t cap = sl->cap ? sl->cap * 2 : 64;
  tagged_t *p = cap > sl->cap ? GR_SCOPE_REALLOC(sl->keys, (size_t)cap * sizeof *p) : NULL;
  if (!p)
    return false;
  sl->keys = p;
  sl->cap = cap;
  return true;
}

/* Lists (ks, key) for the end of the scope in slot s. */
static void note(uint16_t s, unsigned ks, uint64_t key) {
  scope_slot_t *sl = &g_slots[s];
  lock_slot(sl);
  if (!sl->closed && !sl->overflow) {
    if (sl->n < sl->cap || make_room(s, sl)) {
      sl->keys[sl->n++] = (tagged_t){key, ks};
    } else {
      gr_warn_once(w_list, "no memory to list a scope's blocks: its end scans every block instead");
      sl->overflow = 1;
      free(sl->keys);
      sl->keys = NULL;
      sl->n = sl->cap = 0;
    }
  }
  unlock_slot(sl);
}

uint16_t gr_scope_tag_slow(void) {
  if (gr_tls.scope_depth == 0)
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

void gr_scope_note(const gr_rec_t *r) {
  scope_slot_t *slots = g_slots;
  /* The record may have been freed meanwhile and its slot be another scope's now: then the key is that
   * scope's to look up, and its end finds the record not carrying it (or gone). */
  if (r->scope && slots)
    note(r->scope, gr_kind_keyspace(r->kind), r->key);
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

GPURECLAIM_API uint64_t gpureclaim_scope_begin(void) {
  if (gr_state_disabled() || !map_slots())
    return 0;
  if (gr_tls.scope_depth == MAX_NEST) {
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
    scope_slot_t *sl = &g_slots[s];
    lock_slot(sl); /* a late note for the slot's last scope may be under way (it finds the list closed) */
    free(sl->keys); /* NULL: the last end took the list */
    sl->keys = NULL;
    sl->n = sl->cap = 0;
    sl->closed = sl->overflow = 0;
    unlock_slot(sl);
    /* The open scope's own reference. An add, not a store: a thread tagging a block may hold a passing
     * reference to this slot (gr_scope_tag() takes it before it checks the id) and drops it later. */
    atomic_fetch_add_explicit(&g_slots[s].refs, 1, memory_order_acq_rel);
    /* Open only now, with the new id in place: a thread still holding an earlier scope's id for this slot
     * sees it open only together with the new id, so never as its own. */
    atomic_store_explicit(&g_slots[s].state, S_OPEN, memory_order_release);
    t_stack[gr_tls.scope_depth++] = id;
    return id;
  }
  gr_warn_once(w_full, "65,535 scopes hold live blocks at once; gpureclaim_scope_begin() returns 0");
  return 0;
}

GPURECLAIM_API uint64_t gpureclaim_scope_current(void) { return innermost(); }

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

/* The record r of the ending scope becomes an orphan unless a framework's allocator made it. */
static bool orphan_edit(gr_rec_t *r, void *arg) {
  end_t *e = arg;
  if (r->scope != e->slot || r->state != GR_ST_LIVE || r->kind == GPURECLAIM_KIND_VMM_MAPPING ||
      r->kind == GPURECLAIM_KIND_VA)
    return false;
  /* Blocks a framework's allocator made are the framework's: never orphans. */
  if (owner_cached(e, gr_site_pc(r->site)))
    return false;
  r->state = GR_ST_ORPHAN;
  return true;
}

static int orphan_one(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  end_t *e = arg;
  gr_rec_t expect = *r, want = *r;
  if (!orphan_edit(&want, e))
    return 0;
  int rc;
  while ((rc = gr_table_cas(ref, &expect, &want)) == -EAGAIN) {
    want = expect;
    if (!orphan_edit(&want, e))
      return 0;
  }
  if (rc == 0) {
    gr_stats_orphaned(&expect, +1);
    e->orphans++;
  }
  return 0;
}

/* Orphans the scope's blocks: those under the keys it listed, or with no list every record of the table. */
static void orphan_all(end_t *e, const tagged_t *keys, uint32_t n, bool scan) {
  if (scan) {
    gr_table_visit(orphan_one, e);
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    gr_rec_t before;
    /* A key listed twice (the scope freed the address and got it back) finds an orphan the second time. */
    if (gr_table_update(keys[i].ks, keys[i].key, GR_STMASK(GR_ST_LIVE), orphan_edit, e, &before) == 0) {
      gr_stats_orphaned(&before, +1);
      e->orphans++;
    }
  }
}

int gr_scope_end(uint64_t scope, gr_scope_ended_t *out) {
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
  for (unsigned i = gr_tls.scope_depth; i-- > 0;)
    if (t_stack[i] == scope) {
      memmove(&t_stack[i], &t_stack[i + 1], (gr_tls.scope_depth - i - 1) * sizeof t_stack[0]);
      gr_tls.scope_depth--;
      break;
    }
  /* Take the list and close it: what is tagged from now on raced with the end and stays live. */
  scope_slot_t *sl = &g_slots[s];
  lock_slot(sl);
  tagged_t *keys = sl->keys;
  uint32_t n = sl->n;
  bool scan = sl->overflow;
  sl->keys = NULL;
  sl->n = sl->cap = 0;
  sl->closed = 1;
  unlock_slot(sl);
  uint64_t orphans = 0;
  if ((n || scan) && atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1) {
    end_t *e = calloc(1, sizeof *e);
    if (e) {
      e->slot = s;
      orphan_all(e, keys, n, scan);
      orphans = e->orphans;
      free(e);
    }
  }
  *out = (gr_scope_ended_t){s, keys, n, scan, orphans};
  return 0;
}

void gr_scope_end_finish(gr_scope_ended_t *ended) {
  free(ended->keys);
  unref(ended->slot); /* the scope's own reference */
}

void gr_scope_atfork_child(void) {
  /* Blocks and scopes of the parent are not the child's. */
  scope_slot_t *p = atomic_exchange_explicit(&g_slots_p, NULL, memory_order_acq_rel);
  if (p) {
    /* A list whose lock a thread of the parent held may be half-way through a realloc: left alone. */
    for (uint32_t s = 1; s < NSLOTS; s++)
      if (p[s].keys && !atomic_load_explicit(&p[s].lock, memory_order_relaxed))
        free(p[s].keys);
    munmap(p, NSLOTS * sizeof(scope_slot_t));
  }
  gr_tls.scope_depth = 0;
}
