/* Epoch-based reclamation (src/table/epoch.c), apart from the table that uses it: what is retired is freed only once
 * no critical section that could still see it remains, and then without further waiting; the epoch only grows;
 * thread records are reused, not leaked; the per-thread insert and delete counts survive their threads; the
 * exit hook sees every registered thread once. (test_table.c covers a reader holding a retired item back, idle
 * threads not doing so, and nested sections.) */
#include "table.h"
#include "../common/rng.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

static _Atomic int g_freed;
static void *_Atomic g_freed_p;
static _Atomic size_t g_freed_bytes;

static void note_free(void *p, size_t bytes) {
  atomic_store(&g_freed_p, p);
  atomic_store(&g_freed_bytes, bytes);
  atomic_fetch_add(&g_freed, 1);
  free(p);
}

static size_t thread_records(void) {
  size_t n = 0;
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next)
    n++;
  return n;
}

/* With nobody inside, one reclaim advances the epoch twice and frees the item, with its own pointer and size;
 * without anything retired, reclaim does not touch the epoch. */
Test(epoch, with_no_reader_one_reclaim_frees_with_the_retired_pointer_and_size) {
  gr_epoch_enter(); /* registers this thread */
  gr_epoch_exit();
  uint64_t e0 = atomic_load(&gr_epoch_global);
  cr_assert_eq(gr_epoch_reclaim(), 0);
  cr_assert_eq(atomic_load(&gr_epoch_global), e0, "the epoch moved with nothing retired");
  void *p = malloc(24);
  gr_epoch_retire(p, 24, note_free);
  cr_assert_eq(gr_epoch_pending(), 1);
  cr_assert_eq(gr_epoch_reclaim(), 1);
  cr_assert_eq(atomic_load(&g_freed), 1);
  cr_assert_eq(atomic_load(&g_freed_p), p);
  cr_assert_eq(atomic_load(&g_freed_bytes), 24);
  cr_assert_eq(gr_epoch_pending(), 0);
  cr_assert_eq(atomic_load(&gr_epoch_global), e0 + 2);
}

/* This thread inside a critical section holds back what it could see: nothing is freed and the epoch stops
 * one step ahead of the announcement, however often reclaim runs; after the exit, it goes. */
Test(epoch, the_reclaimers_own_critical_section_holds_back_what_it_retired) {
  gr_epoch_enter();
  uint64_t e0 = atomic_load(&gr_epoch_global);
  gr_epoch_retire(malloc(8), 8, note_free);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(gr_epoch_reclaim(), 0, "freed while its retirer was inside");
  cr_assert_leq(atomic_load(&gr_epoch_global), e0 + 1);
  cr_assert_eq(gr_epoch_pending(), 1);
  gr_epoch_exit();
  size_t freed = 0;
  for (int i = 0; i < 3 && !freed; i++)
    freed = gr_epoch_reclaim();
  cr_assert_eq(freed, 1);
}

static void *enter_and_exit(void *arg) {
  (void)arg;
  gr_epoch_enter();
  gr_epoch_exit();
  return NULL;
}

/* A thread that exits gives its record back: a hundred threads one after another use one record between them,
 * not a hundred (records are never freed, so a leak here grows without bound in a program that spawns
 * threads). */
Test(epoch, records_of_exited_threads_are_reused) {
  gr_thread_run(enter_and_exit, NULL);
  size_t n0 = thread_records();
  for (int i = 0; i < 100; i++)
    gr_thread_run(enter_and_exit, NULL);
  cr_assert_eq(thread_records(), n0, "%zu records for 1 thread at a time", thread_records());
  pthread_t t[8];
  for (int i = 0; i < 8; i++)
    t[i] = gr_thread_start(enter_and_exit, NULL);
  for (int i = 0; i < 8; i++)
    gr_thread_join(t[i]);
  cr_assert_leq(thread_records(), n0 + 8);
}

static void *insert_n(void *arg) {
  for (intptr_t i = 0; i < (intptr_t)arg; i++)
    gr_epoch_count_ins();
  return NULL;
}
static void *delete_n(void *arg) {
  for (intptr_t i = 0; i < (intptr_t)arg; i++)
    gr_epoch_count_del();
  return NULL;
}

/* The live count (inserts less deletes of all threads) is exact after the threads that counted have exited,
 * including inserts of one thread deleted by another; the shared approximation is off by at most 31 per
 * thread record. */
Test(epoch, live_counts_outlive_their_threads) {
  cr_assert_eq(gr_epoch_live_sum(), 0);
  gr_thread_run(insert_n, (void *)1000);
  cr_assert_eq(gr_epoch_live_sum(), 1000);
  uint64_t s = gr_rng_stream(3);
  int64_t live = 1000;
  for (int round = 0; round < 20; round++) {
    intptr_t ins = (intptr_t)gr_rng_below(&s, 200), del = (intptr_t)gr_rng_below(&s, 200);
    pthread_t a = gr_thread_start(insert_n, (void *)ins), b = gr_thread_start(delete_n, (void *)del);
    gr_thread_join(a);
    gr_thread_join(b);
    live += ins - del;
    cr_assert_eq(gr_epoch_live_sum(), live, "round %d", round);
    int64_t approx = gr_epoch_live_approx(), slack = 31 * (int64_t)thread_records();
    cr_assert(approx >= live - slack && approx <= live + slack, "approximation %lld for %lld live (records %zu)",
              (long long)approx, (long long)live, thread_records());
  }
  gr_thread_run(delete_n, (void *)(intptr_t)live);
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

static _Atomic int g_exits;
static void count_exit(gr_thread_rec_t *r) {
  cr_assert_not_null(r);
  atomic_fetch_add(&g_exits, 1);
}

/* The exit hook (gr_epoch_on_exit, for a module that keeps per-thread state) runs once for each thread that
 * registered, and not for one that never entered. */
static void *do_nothing(void *arg) { return arg; }
Test(epoch, the_exit_hook_runs_once_per_registered_thread) {
  gr_epoch_on_exit(count_exit);
  for (int i = 0; i < 10; i++)
    gr_thread_run(enter_and_exit, NULL);
  gr_thread_run(do_nothing, NULL);
  cr_assert_eq(atomic_load(&g_exits), 10);
}

/* ---- readers and a retiring writer at once ---- */

enum { ALIVE = 0x600d, DEAD = 0xdead, READERS = 3, SWAPS = 3000 };
typedef struct obj {
  _Atomic int state;
} obj_t;
static obj_t *_Atomic g_cur;
static _Atomic int g_stop, g_seen_dead;
static _Atomic long g_reads;

/* Marks an object dead instead of freeing it at once (its memory is kept until the test ends) so that a reader
 * that could still see it is caught by a plain check, not by luck under a sanitizer. */
static obj_t *g_graveyard[SWAPS + 1];
static _Atomic int g_buried;
static void bury(void *p, size_t bytes) {
  (void)bytes;
  obj_t *o = p;
  atomic_store(&o->state, DEAD);
  g_graveyard[atomic_fetch_add(&g_buried, 1)] = o;
}

static void *reader(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    gr_epoch_enter();
    obj_t *o = atomic_load(&g_cur);
    for (int i = 0; i < 2000; i++) /* look again and again, for as long as a swap or two takes */
      if (atomic_load_explicit(&o->state, memory_order_relaxed) != ALIVE) {
        atomic_store(&g_seen_dead, 1);
        break;
      }
    gr_epoch_exit();
    atomic_fetch_add(&g_reads, 1);
  }
  return NULL;
}

/* No reader ever finds an object it loaded inside its critical section already reclaimed, while a writer
 * replaces and retires the object thousands of times and reclaims as it goes; and reclamation keeps up (the
 * backlog is freed once the readers stop). */
Test(epoch, a_reader_never_sees_reclaimed_memory_while_a_writer_retires, .timeout = 300) {
  obj_t *first = malloc(sizeof *first);
  atomic_init(&first->state, ALIVE);
  atomic_store(&g_cur, first);
  pthread_t t[READERS];
  for (int i = 0; i < READERS; i++)
    t[i] = gr_thread_start(reader, NULL);
  while (atomic_load(&g_reads) < READERS) /* the readers are under way before the first swap */
    sched_yield();
  size_t freed = 0;
  for (int i = 0; i < SWAPS; i++) {
    obj_t *o = malloc(sizeof *o);
    atomic_init(&o->state, ALIVE);
    obj_t *old = atomic_exchange(&g_cur, o);
    gr_epoch_retire(old, sizeof *old, bury);
    freed += gr_epoch_reclaim();
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < READERS; i++)
    gr_thread_join(t[i]);
  for (int i = 0; i < 3; i++)
    freed += gr_epoch_reclaim();
  cr_assert_not(atomic_load(&g_seen_dead), "a reader saw an object reclaimed under it");
  cr_assert_gt(atomic_load(&g_reads), 0, "the readers never read: the test proved nothing");
  cr_assert_eq(freed, SWAPS, "%zu of %d retired objects freed", freed, SWAPS);
  cr_assert_eq(gr_epoch_pending(), 0);
  for (int i = 0; i < atomic_load(&g_buried); i++)
    free(g_graveyard[i]);
  free(atomic_load(&g_cur));
}
