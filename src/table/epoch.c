/*
 * epoch.c -- epoch-based reclamation of the memory the block table retires.
 *
 * What it protects
 *   Table operations read slots of a table generation that a concurrent migration may unlink. Every operation
 *   runs inside a critical section (gr_epoch_enter/exit, nestable); an unlinked generation is handed to
 *   gr_epoch_retire() and unmapped only when no critical section that could still reach it remains.
 *
 * Algorithm
 *   A global epoch E only grows. Each thread owns a record in a global, append-only list; its `announce` word
 *   is 0 outside a critical section and (e << 1 | 1) inside one, where e is the value of E it read on entry.
 *   E advances from e to e + 1 only when every record that is inside a critical section announces e.
 *   Memory retired while E was r is freed once E >= r + 2.
 *
 * Asymmetric fences
 *   Entering must order the announcement before the reader's loads of table memory (a store-load order, which
 *   normally costs a full fence on every operation). Where the kernel offers membarrier(2) with
 *   MEMBARRIER_CMD_PRIVATE_EXPEDITED, readers store the announcement with a compiler barrier only, and the
 *   rare reclaimer calls membarrier() before it reads the announcements: every running thread of the process
 *   then executes a full barrier, so either its announcement is visible to the scan, or its critical section
 *   began after that barrier and reads the new table root. Without membarrier (old kernels, seccomp, gVisor)
 *   and under ThreadSanitizer (which does not model it) readers use a sequentially consistent exchange.
 *   The table uses the same barrier (gr_epoch_heavy_barrier) for its one-CAS inserts: see table.c.
 *
 * Why that is safe
 *   A thread that can see a generation G loaded the table root before G was unlinked, hence entered before
 *   the retire, announcing some a <= r. While it stays inside, the advance from r + 1 to r + 2 is impossible
 *   (it announces a != r + 1), so G outlives it. A reclaimer that does not see the announcement is ordered
 *   (by the exchange, or by membarrier) before the reader's root load, which then sees the new root.
 *
 * Idle threads
 *   A thread outside a critical section announces nothing and never holds back reclamation: threads that
 *   went idle (or block forever in a driver call) do not need to check in.
 *
 * Progress
 *   enter/exit are wait-free (one exchange, one store). retire is lock-free (a Treiber push). Reclamation
 *   runs under a try-lock: one thread at a time, the others skip it, so no thread ever waits for another.
 *
 * Per-thread counters
 *   The record also carries the thread's counts of table records inserted and deleted, written only by its
 *   owner with plain (relaxed) stores, so the table knows its size without a shared counter on the hot path
 *   (and the table's periodic checks count on them: every 32nd insert or delete of a thread).
 *   Summing them costs a cache miss per thread, so each thread also flushes its changes in batches of 32 to
 *   one shared approximate count (off by at most 31 per thread), which the table reads for its load checks.
 *
 * Fast paths
 *   enter, exit and count_live are inline (table.h); the functions here are their rare slow paths.
 */
#include "epoch.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define GR_EPOCH_NO_MEMBARRIER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GR_EPOCH_NO_MEMBARRIER 1
#endif
#endif

typedef struct retired {
  struct retired *next;
  void *p;
  size_t bytes;
  void (*fn)(void *, size_t);
  uint64_t epoch;
} retired_t;

_Atomic uint64_t gr_epoch_global = 1;
static _Atomic(gr_thread_rec_t *) g_threads;
static _Atomic(retired_t *) g_retired;
static _Atomic size_t g_pending;
static _Atomic int g_reclaiming;
static _Atomic int64_t g_exited_live; /* live counts of threads that exited */

GR_TLS_IE gr_thread_rec_t *gr_epoch_t_rec;
static _Atomic int64_t g_live_approx; /* sum of the flushed batches */

/* 1 when readers may use a plain store (membarrier registered), 0 until decided or when unavailable. */
_Atomic int gr_epoch_asym;
static pthread_once_t g_asym_once = PTHREAD_ONCE_INIT;

static void decide_asym(void) {
#ifndef GR_EPOCH_NO_MEMBARRIER
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    atomic_store_explicit(&gr_epoch_asym, 1, memory_order_seq_cst);
#endif
}

/* A full fence that ThreadSanitizer models (it does not model atomic_thread_fence). */
static _Atomic uint64_t g_fence_word;
static void full_fence(void) { (void)atomic_fetch_add_explicit(&g_fence_word, 0, memory_order_seq_cst); }

/* The heavy side: makes every running thread's announcement visible and orders their later loads. */
static void heavy_barrier(void) {
  if (atomic_load_explicit(&gr_epoch_asym, memory_order_seq_cst) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
    /* Cannot happen once registered. If it did, readers and inserts switch to their fenced forms from now
     * on; those already in flight are only as safe as this fence makes them. */
    atomic_store_explicit(&gr_epoch_asym, 0, memory_order_seq_cst);
    full_fence();
  }
}

void gr_epoch_heavy_barrier(void) {
  if (atomic_load_explicit(&gr_epoch_asym, memory_order_seq_cst))
    heavy_barrier();
  else
    full_fence();
}

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

static void (*_Atomic g_on_exit)(gr_thread_rec_t *r);

void gr_epoch_on_exit(void (*fn)(gr_thread_rec_t *r)) { atomic_store_explicit(&g_on_exit, fn, memory_order_release); }

gr_thread_rec_t *gr_epoch_first(void) { return atomic_load_explicit(&g_threads, memory_order_acquire); }

static void thread_exit(void *arg) {
  gr_thread_rec_t *r = arg;
  if (!r)
    return;
  void (*fn)(gr_thread_rec_t *) = atomic_load_explicit(&g_on_exit, memory_order_acquire);
  if (fn)
    fn(r);
  gr_epoch_count_flush(r); /* its counts stay in the record, summed as before, for the next thread */
  atomic_store_explicit(&r->announce, 0, memory_order_release);
  atomic_store_explicit(&r->track_op, 0, memory_order_release);
  r->depth = 0;
  if (gr_epoch_t_rec == r)
    gr_epoch_t_rec = NULL;
  atomic_store_explicit(&r->owned, 0, memory_order_release);
}

static void make_key(void) { (void)pthread_key_create(&g_key, thread_exit); }

__attribute__((noinline, cold)) static gr_thread_rec_t *register_thread(void) {
  gr_thread_rec_t *r;
  for (r = atomic_load_explicit(&g_threads, memory_order_acquire); r; r = r->next) {
    int expected = 0;
    if (atomic_load_explicit(&r->owned, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_strong_explicit(&r->owned, &expected, 1, memory_order_acq_rel,
                                                memory_order_relaxed))
      break;
  }
  if (!r) {
    /* A cache line each: the owner writes its record on every operation. */
    r = aligned_alloc(64, sizeof *r);
    if (!r)
      return NULL;
    memset(r, 0, sizeof *r);
    atomic_init(&r->owned, 1);
    gr_thread_rec_t *head = atomic_load_explicit(&g_threads, memory_order_relaxed);
    do {
      r->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&g_threads, &head, r, memory_order_release,
                                                    memory_order_relaxed));
  }
  r->depth = 0;
  gr_epoch_t_rec = r;
  pthread_once(&g_asym_once, decide_asym);
  pthread_once(&g_key_once, make_key);
  (void)pthread_setspecific(g_key, r);
  return r;
}

gr_thread_rec_t *gr_epoch_self(void) {
  gr_thread_rec_t *r = gr_epoch_t_rec;
  return __builtin_expect(r != NULL, 1) ? r : register_thread();
}

/* A thread that could not register (memory ran out) still works: while inside a critical section it is
 * counted in g_anon_inside, and any such thread blocks every epoch advance. Conservative, never unsafe. */
static _Atomic unsigned g_anon_inside;
static GR_TLS_IE unsigned t_anon_depth;

void gr_epoch_enter_slow(void) {
  gr_thread_rec_t *r = gr_epoch_self();
  if (__builtin_expect(r == NULL, 0)) {
    if (t_anon_depth++ == 0)
      atomic_fetch_add_explicit(&g_anon_inside, 1, memory_order_seq_cst);
    return;
  }
  gr_epoch_enter();
}

void gr_epoch_exit_slow(void) {
  if (t_anon_depth && --t_anon_depth == 0)
    atomic_fetch_sub_explicit(&g_anon_inside, 1, memory_order_release);
}

void gr_epoch_retire(void *p, size_t bytes, void (*fn)(void *p, size_t bytes)) {
  retired_t *n = malloc(sizeof *n);
  if (!n)
    return; /* leaking is the only safe choice left */
  n->p = p;
  n->bytes = bytes;
  n->fn = fn;
  n->epoch = atomic_load_explicit(&gr_epoch_global, memory_order_seq_cst);
  retired_t *head = atomic_load_explicit(&g_retired, memory_order_relaxed);
  do {
    n->next = head;
  } while (!atomic_compare_exchange_weak_explicit(&g_retired, &head, n, memory_order_release,
                                                  memory_order_relaxed));
  atomic_fetch_add_explicit(&g_pending, 1, memory_order_relaxed);
}

size_t gr_epoch_pending(void) { return atomic_load_explicit(&g_pending, memory_order_relaxed); }

static bool try_advance(void) {
  heavy_barrier();
  uint64_t e = atomic_load_explicit(&gr_epoch_global, memory_order_seq_cst);
  uint64_t want = (e << 1) | 1;
  for (gr_thread_rec_t *r = atomic_load_explicit(&g_threads, memory_order_acquire); r; r = r->next) {
    uint64_t a = atomic_load_explicit(&r->announce, memory_order_seq_cst);
    if ((a & 1) && a != want)
      return false;
  }
  if (atomic_load_explicit(&g_anon_inside, memory_order_seq_cst))
    return false;
  /* Only the holder of the reclaim try-lock advances, so a plain increment is enough. */
  atomic_store_explicit(&gr_epoch_global, e + 1, memory_order_seq_cst);
  return true;
}

size_t gr_epoch_reclaim(void) {
  if (!atomic_load_explicit(&g_retired, memory_order_relaxed))
    return 0;
  int busy = 0;
  if (!atomic_compare_exchange_strong_explicit(&g_reclaiming, &busy, 1, memory_order_acquire,
                                               memory_order_relaxed))
    return 0;
  /* Two advances may be needed before anything retired at the current epoch can go. */
  if (try_advance())
    (void)try_advance();
  uint64_t e = atomic_load_explicit(&gr_epoch_global, memory_order_seq_cst);
  retired_t *list = atomic_exchange_explicit(&g_retired, NULL, memory_order_acquire);
  size_t freed = 0;
  while (list) {
    retired_t *n = list;
    list = n->next;
    if (n->epoch + 2 <= e) {
      n->fn(n->p, n->bytes);
      free(n);
      freed++;
    } else {
      retired_t *head = atomic_load_explicit(&g_retired, memory_order_relaxed);
      do {
        n->next = head;
      } while (!atomic_compare_exchange_weak_explicit(&g_retired, &head, n, memory_order_release,
                                                      memory_order_relaxed));
    }
  }
  atomic_fetch_sub_explicit(&g_pending, freed, memory_order_relaxed);
  atomic_store_explicit(&g_reclaiming, 0, memory_order_release);
  return freed;
}

void gr_epoch_count_flush(gr_thread_rec_t *r) {
  int64_t live = (int64_t)(atomic_load_explicit(&r->ins, memory_order_relaxed) -
                           atomic_load_explicit(&r->del, memory_order_relaxed));
  atomic_fetch_add_explicit(&g_live_approx, live - r->flushed, memory_order_relaxed);
  r->flushed = live;
}

void gr_epoch_count_live_slow(int64_t d) {
  gr_thread_rec_t *r = gr_epoch_self();
  if (r) {
    (void)gr_epoch_count_op(d > 0 ? &r->ins : &r->del, r);
    return;
  }
  atomic_fetch_add_explicit(&g_exited_live, d, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_live_approx, d, memory_order_relaxed);
}

/* Tracked inserts of threads without a record (track.c): counted, and treated as older than any destroy. */
static _Atomic int64_t g_anon_track_ops;

void gr_epoch_track_op_anon(int d) { atomic_fetch_add_explicit(&g_anon_track_ops, d, memory_order_seq_cst); }

bool gr_epoch_track_op_before(uint64_t seq) {
  if (atomic_load_explicit(&g_anon_track_ops, memory_order_seq_cst) > 0)
    return true;
  for (gr_thread_rec_t *r = atomic_load_explicit(&g_threads, memory_order_acquire); r; r = r->next) {
    uint64_t v = atomic_load_explicit(&r->track_op, memory_order_seq_cst);
    if (v && v - 1 < seq)
      return true;
  }
  return false;
}

int64_t gr_epoch_live_approx(void) {
  int64_t v = atomic_load_explicit(&g_live_approx, memory_order_relaxed);
  return v < 0 ? 0 : v;
}

int64_t gr_epoch_live_sum(void) {
  int64_t s = atomic_load_explicit(&g_exited_live, memory_order_relaxed);
  for (gr_thread_rec_t *r = atomic_load_explicit(&g_threads, memory_order_acquire); r; r = r->next)
    s += (int64_t)(atomic_load_explicit(&r->ins, memory_order_relaxed) -
                   atomic_load_explicit(&r->del, memory_order_relaxed));
  return s < 0 ? 0 : s;
}

void gr_epoch_atfork_child(void) {
  /* The other threads are gone: their records may be marked inside a critical section forever. */
  for (gr_thread_rec_t *r = atomic_load_explicit(&g_threads, memory_order_relaxed); r; r = r->next) {
    if (r == gr_epoch_t_rec)
      continue;
    atomic_store_explicit(&r->announce, 0, memory_order_relaxed);
    atomic_store_explicit(&r->track_op, 0, memory_order_relaxed);
    atomic_store_explicit(&r->owned, 0, memory_order_relaxed);
  }
  /* The table is emptied in the child: no record is live. */
  for (gr_thread_rec_t *r = atomic_load_explicit(&g_threads, memory_order_relaxed); r; r = r->next) {
    atomic_store_explicit(&r->ins, 0, memory_order_relaxed);
    atomic_store_explicit(&r->del, 0, memory_order_relaxed);
    r->flushed = 0;
  }
  if (gr_epoch_t_rec) {
    if (!gr_epoch_t_rec->depth)
      atomic_store_explicit(&gr_epoch_t_rec->announce, 0, memory_order_relaxed);
  }
  atomic_store_explicit(&g_exited_live, 0, memory_order_relaxed);
  atomic_store_explicit(&g_live_approx, 0, memory_order_relaxed);
  atomic_store_explicit(&g_anon_track_ops, 0, memory_order_relaxed);
  atomic_store_explicit(&g_anon_inside, t_anon_depth ? 1u : 0u, memory_order_relaxed);
  /* A new process: its own membarrier registration. */
  atomic_store_explicit(&gr_epoch_asym, 0, memory_order_seq_cst);
  decide_asym();
  atomic_store_explicit(&g_reclaiming, 0, memory_order_relaxed);
}
