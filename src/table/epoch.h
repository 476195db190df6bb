/*
 * epoch.h -- epoch-based reclamation and the per-thread record (internal): memory the table retires is freed
 * once no thread can still read it; the same per-thread record carries the counts the table and the
 * statistics sum. See epoch.c for the protocol and its invariants. The table (table.h) is built on this; nothing
 * here knows the table.
 */
#ifndef GR_EPOCH_H
#define GR_EPOCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Thread-locals of a library loaded at start-up (preloaded or linked): the initial-exec model avoids a call
 * to __tls_get_addr on every access. */
#define GR_TLS_IE __thread __attribute__((tls_model("initial-exec")))
/* On the definition of a function of an allocation's or a free's hot path: inlined into its callers in other
 * files too, where the build links with link-time optimisation (the sanitizer builds compile separately and
 * call it). */
#define GR_HOT_INLINE inline __attribute__((always_inline))

/* A thread's registration: its announced epoch and the per-thread counters the table sums. Records are never
 * freed; a thread that exits gives its record back for the next new thread. */
/* Room for stats.c's per-thread counters in each thread record (stats.c checks that they fit). */
#define GR_THREAD_STATS_BYTES 16384
/* Room for young.c's log of the thread's young records (young.c checks that it fits). */
#define GR_THREAD_YOUNG_BYTES 704

typedef struct gr_thread_rec {
  _Atomic uint64_t announce;  /* 0 outside a critical section, epoch << 1 | 1 inside */
  /* Records this thread inserted and deleted (live records: their difference), written by the owner only with
   * plain stores; they stay with the record when its thread exits, for the next thread that takes it. */
  _Atomic uint64_t ins, del;
  int64_t flushed;            /* owner only: ins - del as last added to the shared approximation */
  unsigned depth;             /* owner only: critical-section nesting */
  _Atomic int owned;
  /* 0, or 1 + the context-destroy sequence an insert of an address record read before its driver call, while
   * the thread is inside gr_track_insert_ctx/gr_track_restore_ctx (track.c). Written by the owner only. */
  _Atomic uint64_t track_op;
  struct gr_thread_rec *next; /* immutable once the record is published */
  /* stats.c's counters of this thread (its shard_t), written by the owner only; they stay here when the thread
   * exits, summed as before, and the next thread that takes the record goes on from them. One record per thread
   * for both. */
  _Alignas(64) unsigned char stats[GR_THREAD_STATS_BYTES];
  /* young.c's log of records this thread inserted and has not freed yet (gr_table_insert_young): written by the
   * owner, or by a thread draining it into the table (young.c says how they take turns). It stays with the
   * record when its thread exits: its records are still live, found by the next drain. */
  _Alignas(64) unsigned char young[GR_THREAD_YOUNG_BYTES];
} __attribute__((aligned(64))) gr_thread_rec_t;

extern GR_TLS_IE gr_thread_rec_t *gr_epoch_t_rec;
extern _Atomic uint64_t gr_epoch_global;
extern _Atomic int gr_epoch_asym;
void gr_epoch_enter_slow(void);
void gr_epoch_exit_slow(void);
void gr_epoch_count_live_slow(int64_t d);
/* Makes every thread's earlier stores visible to the caller's later loads, and orders every thread's later
 * loads after the caller's earlier stores: membarrier() where the kernel has it (see epoch.c), else a fence. */
void gr_epoch_heavy_barrier(void);
/* Whether a thread is inside a tracked insert whose sequence (track_op - 1) is below seq, or one that could not
 * publish its sequence (no thread record) is inside one. */
bool gr_epoch_track_op_before(uint64_t seq);
/* Every thread record ever registered (append-only list, never freed): `for (r = first; r; r = r->next)`. */
gr_thread_rec_t *gr_epoch_first(void);
/* Called with its record when a registered thread exits, before the record can be reused (set once, by stats.c). */
void gr_epoch_on_exit(void (*fn)(gr_thread_rec_t *r));
void gr_epoch_track_op_anon(int d);

/* Enters a critical section (nestable): memory retired from now on is not freed before the matching exit. */
static inline void gr_epoch_enter(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  if (__builtin_expect(r == NULL, 0)) {
    gr_epoch_enter_slow();
    return;
  }
  if (r->depth++ == 0) {
    uint64_t e = atomic_load_explicit(&gr_epoch_global, memory_order_relaxed);
    if (__builtin_expect(atomic_load_explicit(&gr_epoch_asym, memory_order_relaxed), 1)) {
      atomic_store_explicit(&r->announce, (e << 1) | 1, memory_order_relaxed);
      atomic_signal_fence(memory_order_seq_cst); /* the reclaimer's membarrier supplies the hardware fence */
    } else {
      atomic_exchange_explicit(&r->announce, (e << 1) | 1, memory_order_seq_cst);
    }
  }
}

static inline void gr_epoch_exit(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  if (__builtin_expect(r == NULL || r->depth == 0, 0)) { /* entered before this thread could register */
    gr_epoch_exit_slow();
    return;
  }
  if (--r->depth == 0)
    atomic_store_explicit(&r->announce, 0, memory_order_release);
}
/* Frees fn(p, bytes) once no critical section that may still see p remains. */
void gr_epoch_retire(void *p, size_t bytes, void (*fn)(void *p, size_t bytes));
/* Tries to advance the epoch and free what can be freed; never waits. Returns the number of items freed. */
size_t gr_epoch_reclaim(void);
/* Items retired and not yet freed. */
size_t gr_epoch_pending(void);
/* The calling thread's record (registering it on first use); NULL when memory ran out. */
gr_thread_rec_t *gr_epoch_self(void);
void gr_epoch_count_flush(gr_thread_rec_t *r);
/* Counts a record the calling thread inserted (deleted): single writer, no atomic read-modify-write; every
 * 32nd insert or delete of a thread adds its change to the shared approximation. Returns the thread's count of
 * inserts (deletes) so far, for the table's checks every 32nd (1 for a thread without a record). */
static inline uint64_t gr_epoch_count_op(_Atomic uint64_t *c, gr_thread_rec_t *r) {
  uint64_t n = atomic_load_explicit(c, memory_order_relaxed) + 1;
  atomic_store_explicit(c, n, memory_order_relaxed);
  if (__builtin_expect((n & 31) == 0, 0))
    gr_epoch_count_flush(r);
  return n;
}
static inline uint64_t gr_epoch_count_ins(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  if (__builtin_expect(r != NULL, 1))
    return gr_epoch_count_op(&r->ins, r);
  gr_epoch_count_live_slow(1);
  return 1;
}
static inline uint64_t gr_epoch_count_del(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  if (__builtin_expect(r != NULL, 1))
    return gr_epoch_count_op(&r->del, r);
  gr_epoch_count_live_slow(-1);
  return 1;
}
static inline void gr_epoch_count_live(int64_t d) {
  if (d > 0)
    (void)gr_epoch_count_ins();
  else
    (void)gr_epoch_count_del();
}
/* The number of records give or take 31 per thread: one load. */
int64_t gr_epoch_live_approx(void);
/* Sum of every thread's live-record counter: the number of records in the table, give or take the
 * operations in flight. */
int64_t gr_epoch_live_sum(void);
/* In the child after fork(): only the calling thread exists; forget every other thread's registration. */
void gr_epoch_atfork_child(void);

#endif
