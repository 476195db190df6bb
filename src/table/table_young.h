/*
 * table_young.h -- what the block table (table.c) and the threads' logs of young records in front of it (young.c)
 * ask of each other; no other file includes it. The logs' own interface is table.h's (gr_table_insert_young[_v],
 * gr_table_drain, GR_YOUNG_MAX): to the rest of the library they are part of the table. A log's layout and its
 * owner's lookup (young_find) are here, inlined into the table's take and lookup on the free's hot path, as they
 * were when both lived in table.c (an out-of-line definition in young.c, inlined at link time, cost the free
 * path a register move). Internal.
 */
#ifndef GR_TABLE_YOUNG_H
#define GR_TABLE_YOUNG_H

#include "epoch.h"
#include "record.h"
#include "common.h" /* GR_ASSERT */

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GR_TABLE_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GR_TABLE_LIKELY(x) __builtin_expect(!!(x), 1)
#define GR_TABLE_COLD __attribute__((noinline, cold))

/* table.c: bytes mapped for the table, its young logs included (gr_table_bytes; +bytes mapped, -bytes unmapped). */
void gr_table_count_bytes(ptrdiff_t bytes);
/* table.c: n young inserts of the calling thread since its last call, for the table's size windows (check_size). */
void gr_table_young_inserts(unsigned n);

/* young.c: moves every log's records into the table; with cool, each other thread whose log held records sends
 * its next inserts straight to the table. Returns the number moved. */
size_t gr_young_drain(bool cool);
/* young.c: records in the logs now (a count without the logs' consent: for sizing only). */
uint64_t gr_young_total(void);
/* young.c: in the child after fork(): every log empty. */
void gr_young_atfork_child(void);

/* ---- a log, as its owner reads it: inlined into the table's take and lookup (table.c) ---- */

#define YOUNG_INLINE 16      /* slots in the thread record, where a log begins */
#define YOUNG_MAX_SLOTS 8192 /* slots a log grows to at most */
#define YOUNG_PERIOD 1024    /* young inserts of a thread between two of its size checks of the table */
/* Inserts that bypass a log after a free by another thread had to drain it (see gr_young_drain()). */
#define YOUNG_COOL 1024
/* The log's hash: the high bits of key * this multiplier, one of the table's (hash_in): the one that spreads
 * arithmetic progressions best over a log's sizes (12 to 6,144 keys in 16 to 8,192 slots, the strides of
 * hash_in's wider set: at most 6 slots of displacement on average, against 35 for the table's first). */
#define YOUNG_MULT UINT64_C(0x5115dce9f8b83e81)

typedef struct young {
  _Atomic uint32_t op;        /* 1 while the owner is inside a log operation */
  _Atomic uint32_t drain;     /* raised by a drainer */
  _Atomic uint32_t n;         /* records in the log */
  _Atomic uint32_t cool;      /* inserts left that go straight to the table */
  _Atomic uint32_t countdown; /* inserts left before the next one takes young_insert_slow (0 at first) */
  /* The slots (empty: ctl 0; a young record is LIVE), written by whoever holds the log: */
  uint32_t lim;      /* records they may hold: three quarters of them */
  uint32_t mask;     /* slots - 1 */
  uint32_t shift;    /* 64 - log2(slots) */
  gr_packed_t *slot; /* NULL before the first insert, then inl, or a mapping of `mapped` bytes */
  size_t mapped;
  gr_packed_t inl[YOUNG_INLINE];
} young_t;

_Static_assert(sizeof(young_t) <= GR_THREAD_YOUNG_BYTES, "epoch.h: GR_THREAD_YOUNG_BYTES");
_Static_assert((YOUNG_MAX_SLOTS & (YOUNG_MAX_SLOTS - 1)) == 0 && (YOUNG_INLINE & (YOUNG_INLINE - 1)) == 0,
               "a log's slots are a power of two");

static inline young_t *young_of(gr_thread_rec_t *r) { return (young_t *)(void *)r->young; }

/* Begins a log operation of the owner: false when a drainer holds the log (then use the table). asym:
 * gr_epoch_asym as the operation read it. */
static inline bool young_enter(young_t *y, bool asym) {
  if (GR_TABLE_LIKELY(asym)) {
    atomic_store_explicit(&y->op, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst); /* the drainer's membarrier supplies the hardware fence */
    if (GR_TABLE_UNLIKELY(atomic_load_explicit(&y->drain, memory_order_acquire) != 0)) {
      atomic_store_explicit(&y->op, 0, memory_order_release);
      return false;
    }
    return true;
  }
  atomic_exchange_explicit(&y->op, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&y->drain, memory_order_seq_cst) != 0) {
    atomic_store_explicit(&y->op, 0, memory_order_release);
    return false;
  }
  return true;
}

static inline void young_exit(young_t *y) { atomic_store_explicit(&y->op, 0, memory_order_release); }

static inline uint32_t young_home(const young_t *y, uint64_t key) {
  return (uint32_t)((key * YOUNG_MULT) >> y->shift);
}

/* Empties slot i of y's log, moving back the records after it in its run that may take its place, so that no
 * probe ever has to pass an empty slot. */
GR_TABLE_COLD static void young_del_run(young_t *y, uint32_t i) {
  gr_packed_t *s = y->slot;
  uint32_t mask = y->mask;
  for (uint32_t j = (i + 1) & mask; s[j].ctl != 0; j = (j + 1) & mask)
    if (((j - young_home(y, s[j].key)) & mask) >= ((j - i) & mask)) { /* its home is not after i */
      s[i] = s[j];
      i = j;
    }
  s[i].ctl = 0;
}

static inline void young_del(young_t *y, uint32_t i) {
  if (GR_TABLE_UNLIKELY(y->slot[(i + 1) & y->mask].ctl != 0))
    young_del_run(y, i);
  else
    y->slot[i].ctl = 0;
}

/* Copies a young record out word by word. Its allocation wrote it moments ago with 8-byte stores, which may still
 * be in the store buffer; the 16-byte loads a struct copy compiles to straddle two of them and cannot take their
 * values from there (the processor waits until the stores reach the cache). The empty asm keeps each word in a
 * general register, so the copy stays 8-byte loads. */
static inline void copy_out(gr_packed_t *d, const gr_packed_t *s) {
  uint64_t a = s->ctl, b = s->key, c = s->w1, e = s->w2, f = s->w3;
  __asm__("" : "+r"(a), "+r"(b), "+r"(c), "+r"(e), "+r"(f));
  d->ctl = a, d->key = b, d->w1 = c, d->w2 = e, d->w3 = f;
}

/* A take (take != 0) or lookup of key in the calling thread's own log: 0 with the record, -ENOENT when the log
 * has no record for key whose state and kind the masks accept. */
static GR_HOT_INLINE int young_find(uint64_t key, unsigned state_mask, unsigned kind_mask, bool take,
                                    gr_packed_t *out) {
  gr_thread_rec_t *me = gr_epoch_t_rec;
  if (GR_TABLE_UNLIKELY(!me))
    return -ENOENT;
  young_t *y = young_of(me);
  if (atomic_load_explicit(&y->n, memory_order_relaxed) == 0 ||
      !young_enter(y, atomic_load_explicit(&gr_epoch_asym, memory_order_relaxed) != 0))
    return -ENOENT;
  int rc = -ENOENT;
  /* A drain may have emptied the log since the look above: then the probe meets an empty slot at once (a log,
   * once set up, keeps its slots). */
  gr_packed_t *s = y->slot;
  /* The first record of key in probe order is its newest (young_place): it decides, as the first match in the
   * table does. */
  uint32_t i = young_home(y, key);
  for (;; i = (i + 1) & y->mask) {
    if (GR_TABLE_UNLIKELY(s[i].ctl == 0))
      goto out;
    if (GR_TABLE_LIKELY(s[i].key == key))
      break;
  }
  gr_packed_t *q = &s[i];
  /* A young record is LIVE: only its owner writes the log, and every state change (a release's claim or orphan
   * mark, a destroy's detach) is made in the table, after a drain. */
  GR_ASSERT(gr_pk_state(q) == GR_ST_LIVE);
  if (GR_TABLE_LIKELY(((state_mask >> GR_ST_LIVE) & 1) && ((kind_mask >> gr_pk_kind(q)) & 1))) {
    if (out)
      copy_out(out, q);
    if (take) {
      young_del(y, i);
      atomic_store_explicit(&y->n, atomic_load_explicit(&y->n, memory_order_relaxed) - 1, memory_order_relaxed);
    }
    rc = 0;
  }
out:
  young_exit(y);
  return rc;
}

#endif /* GR_TABLE_YOUNG_H */
