/*
 * young.c -- the threads' logs of young records: a per-thread log in front of the block table (table.c).
 *
 * Most blocks are freed by the thread that allocated them. An allocation's record therefore goes into a log in
 * its thread's record (gr_table_insert_young), with plain stores, and a free by the same thread takes it from
 * there: no compare-and-swap, no epoch section. The log is a small open-addressing table of the thread's own
 * (linear probing, deletion by moving later records back, so a miss stops at the first empty slot): 16 slots
 * in the thread record, then a mapping that doubles while three quarters of it are used, up to
 * YOUNG_MAX_SLOTS (GR_YOUNG_MAX records, 320 KiB); a full log of that size moves into the table. So a thread
 * that keeps K blocks live and frees them itself (K = 64, 1,024, 4,096: a training step's activations, a
 * server's requests) does it all in its log, at the cost of the one-block pair, where a log of the 16 newest
 * sent every record past the 16th through the table and made each free of one search the log first. The log
 * counts as table memory (gr_table_bytes).
 *
 * Everyone else sees the logs through a drain (gr_table_drain): gr_table_visit drains first, and a take or a
 * lookup of an address that finds nothing in the table drains and looks again (a block freed by another
 * thread while young, or a free of an address never tracked). Owner and drainer take turns on a log:
 *   owner:   op = 1; [fence]; if drain is raised: op = 0 and use the table instead; else read or write the
 *            log; op = 0 (release).
 *   drainer: (one at a time, g_drain_mu) drain = 1; gr_epoch_heavy_barrier(); wait until op == 0 (acquire);
 *            move the log's records into the table; n = 0; drain = 0 (release).
 * With asymmetric barriers (epoch.c) the owner's fence is a compiler fence and the drainer's barrier is
 * membarrier: either the owner's op = 1 is visible to the drainer, which then waits for the op to end, or the
 * owner's load sees drain raised. Without them both sides use sequentially consistent operations. An owner
 * never waits and a drainer waits only for log operations, which never wait: no cycle (the longest, an insert
 * that finds the largest log full, moves its 6,144 records into the table first). A drainer that is an owner
 * itself moves its own log directly (it is outside any log operation when it drains).
 * A reader that drains sees every record whose insert returned before the drain began; a record inserted
 * meanwhile is one the reader may or may not see, as with an insert into the table that races a visit. The
 * context-destroy protocol (track.c) relies on exactly that: its visit drains after the destroy's barrier, so
 * an allocation whose record the drain missed sees the destroy's sequence change after its insert.
 */
#include "table.h"
#include "table_young.h"
#include "common.h" /* GR_ASSERT */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>


_Static_assert(GR_YOUNG_MAX == YOUNG_MAX_SLOTS / 4 * 3, "table.h: GR_YOUNG_MAX");

static pthread_mutex_t g_drain_mu = PTHREAD_MUTEX_INITIALIZER;

/* Puts p into y's log, which has room. newest: p is the newest record of its key, so it goes before any other
 * of that key in probe order (a record of a block freed where no hook saw it), and a lookup finds it first, as
 * the first match in the table decides; a growth puts records back in their order instead. */
static void young_place(young_t *y, gr_packed_t p, bool newest) {
  gr_packed_t *s = y->slot;
  for (uint32_t i = young_home(y, p.key);; i = (i + 1) & y->mask) {
    if (s[i].ctl == 0) {
      s[i] = p;
      return;
    }
    if (newest && s[i].key == p.key) {
      gr_packed_t older = s[i];
      s[i] = p;
      p = older;
    }
  }
}

/* The first slot of y's log after an empty one: walking the slots from there meets each run in probe order. */
static uint32_t young_run_start(const young_t *y) {
  uint32_t e = 0;
  while (y->slot[e].ctl != 0) /* there is an empty slot: n < lim < slots */
    e++;
  return (e + 1) & y->mask;
}

/* Doubles y's log (by its owner, inside a log operation): false when it is as large as it gets or no memory. */
GR_TABLE_COLD static bool young_grow(young_t *y) {
  uint32_t slots = y->mask + 1;
  if (slots >= YOUNG_MAX_SLOTS)
    return false;
  size_t bytes = (size_t)slots * 2 * sizeof(gr_packed_t);
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED)
    return false;
  gr_table_count_bytes((ptrdiff_t)bytes);
  gr_packed_t *old = y->slot;
  uint32_t omask = y->mask, i = young_run_start(y);
  size_t omapped = y->mapped;
  y->slot = m; /* zeroes: every slot empty */
  y->mapped = bytes;
  y->mask = 2 * slots - 1;
  y->shift--;
  y->lim = 2 * slots / 4 * 3;
  for (uint32_t k = 0; k < slots; k++, i = (i + 1) & omask)
    if (old[i].ctl != 0)
      young_place(y, old[i], false);
  if (omapped) {
    munmap(old, omapped);
    gr_table_count_bytes(-(ptrdiff_t)omapped);
  }
  return true;
}

/* Moves y's records into the table (by its owner inside a log operation, or by a drainer that holds it), each
 * run of slots in probe order. A record the table has no memory for stays in the log. Returns the number
 * moved. */
static size_t young_move(young_t *y) {
  uint32_t n = atomic_load_explicit(&y->n, memory_order_relaxed), moved = 0;
  if (n == 0)
    return 0;
  gr_packed_t *s = y->slot;
  uint32_t start = young_run_start(y), k = 0, i = start;
  gr_epoch_enter(); /* one section for all the inserts (each one's own then only counts its depth) */
  for (; k <= y->mask && moved < n; k++, i = (i + 1) & y->mask) {
    if (s[i].ctl == 0)
      continue;
    if (gr_table_insert_ks(&s[i], GR_KS_ADDR) != 0)
      break;
    s[i].ctl |= GR_ST_DELETED; /* marked moved: a young record is LIVE (state 2, now 7), never 0 (empty) */
    moved++;
  }
  gr_epoch_exit();
  if (moved == n) { /* the usual case: every record moved, every slot empties */
    for (uint32_t j = 0, m = 0; m < moved; j++)
      if (s[j].ctl != 0)
        s[j].ctl = 0, m++;
  } else { /* the table ran out of memory: the records moved leave one by one, the others stay reachable */
    for (uint32_t j = start, left = moved; left > 0;) {
      if (gr_pk_state(&s[j]) == GR_ST_DELETED) {
        young_del(y, j); /* a later record of the run may take slot j: it is looked at next */
        left--;
      } else {
        j = (j + 1) & y->mask;
      }
    }
  }
  /* Release: a reader that sees the smaller count (gr_table_drain's first look) sees the records in the table. */
  atomic_store_explicit(&y->n, n - moved, memory_order_release);
  return moved;
}

/* The table's insert of a record held by value: its own copy escapes, not the caller's, which can then stay in
 * registers. The young path below stores it straight into the log: no copy through the stack, where a struct
 * copy's 16-byte loads straddling the hook's 8-byte stores could not be forwarded (perf once found that stall
 * taking a fifth of the allocation hook's time). */
GR_COLD static int insert_ks_copy(gr_packed_t p) { return gr_table_insert_ks(&p, GR_KS_ADDR); }

/* An insert into y's log that the straight path leaves (inside a log operation): the log is full (it grows, or
 * moves into the table), or p meets an older record of its key. False when p must go to the table after all. */
GR_TABLE_COLD static bool young_put(young_t *y, gr_packed_t p) {
  if (atomic_load_explicit(&y->n, memory_order_relaxed) >= y->lim && !young_grow(y)) {
    young_move(y);
    if (atomic_load_explicit(&y->n, memory_order_relaxed) >= y->lim)
      return false; /* the table has no room: as a direct insert would fail */
  }
  young_place(y, p, true);
  atomic_store_explicit(&y->n, atomic_load_explicit(&y->n, memory_order_relaxed) + 1, memory_order_relaxed);
  return true;
}

/* The insert whose countdown ran out: one of a cool-down (straight to the table, see drain()), or the end of a
 * period of YOUNG_PERIOD (the size check), or the thread's first (the log is set up). */
GR_TABLE_COLD static int young_insert_slow(young_t *y, gr_packed_t p, bool asym) {
  uint32_t cool = atomic_load_explicit(&y->cool, memory_order_relaxed);
  if (cool != 0) {
    atomic_store_explicit(&y->cool, cool - 1, memory_order_relaxed); /* a heuristic: a lost update is harmless */
    return insert_ks_copy(p);
  }
  atomic_store_explicit(&y->countdown, YOUNG_PERIOD, memory_order_relaxed);
  if (y->slot)
    gr_table_young_inserts(YOUNG_PERIOD);
  if (!young_enter(y, asym))
    return insert_ks_copy(p);
  if (!y->slot) {
    y->slot = y->inl;
    y->mask = YOUNG_INLINE - 1;
    y->shift = 64 - 4;
    y->lim = YOUNG_INLINE / 4 * 3;
  }
  bool placed = young_put(y, p);
  young_exit(y);
  return placed ? 0 : insert_ks_copy(p);
}

GR_HOT_INLINE int gr_table_insert_young(const gr_packed_t *p) {
  return gr_table_insert_young_v(gr_epoch_t_rec, *p, atomic_load_explicit(&gr_epoch_asym, memory_order_relaxed) != 0);
}

GR_HOT_INLINE int gr_table_insert_young_v(gr_thread_rec_t *me, gr_packed_t p, bool asym) {
  if (GR_TABLE_UNLIKELY(!me))
    return insert_ks_copy(p);
  young_t *y = young_of(me);
  uint32_t cd = atomic_load_explicit(&y->countdown, memory_order_relaxed);
  if (GR_TABLE_UNLIKELY(cd == 0))
    return young_insert_slow(y, p, asym);
  atomic_store_explicit(&y->countdown, cd - 1, memory_order_relaxed);
  if (GR_TABLE_UNLIKELY(!young_enter(y, asym)))
    return insert_ks_copy(p);
  uint32_t n = atomic_load_explicit(&y->n, memory_order_relaxed);
  if (GR_TABLE_LIKELY(n < y->lim)) {
    gr_packed_t *s = y->slot;
    for (uint32_t i = young_home(y, p.key);; i = (i + 1) & y->mask) {
      if (GR_TABLE_LIKELY(s[i].ctl == 0)) {
        gr_packed_t *d = &s[i];
        d->ctl = p.ctl, d->key = p.key, d->w1 = p.w1, d->w2 = p.w2, d->w3 = p.w3;
        atomic_store_explicit(&y->n, n + 1, memory_order_relaxed);
        young_exit(y);
        return 0;
      }
      if (GR_TABLE_UNLIKELY(s[i].key == p.key))
        break;
    }
  }
  bool placed = young_put(y, p);
  young_exit(y);
  return placed ? 0 : insert_ks_copy(p);
}

/* Drains every log; with cool, each other thread whose log held records sends its next YOUNG_COOL inserts
 * straight to the table. A take or lookup that found nothing drains with cool: a thread whose blocks another
 * thread frees while they are young (a producer and its consumer) would otherwise make every such free pay a
 * drain (an asymmetric barrier, 30-45 us of the freeing thread's time on a 2-vCPU VM while the owner runs; see
 * bench_young); cooled, it pays one per YOUNG_COOL of the owner's allocations. */
size_t gr_table_drain(void) { return gr_young_drain(false); }

uint64_t gr_young_total(void) {
  uint64_t n = 0;
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next)
    n += atomic_load_explicit(&young_of(r)->n, memory_order_relaxed);
  return n;
}

size_t gr_young_drain(bool cool) {
  gr_thread_rec_t *self = gr_epoch_t_rec, *first = gr_epoch_first();
  bool any = false;
  for (gr_thread_rec_t *r = first; r && !any; r = r->next)
    any = atomic_load_explicit(&young_of(r)->n, memory_order_acquire) != 0;
  if (!any)
    return 0;
  int old;
  (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old); /* never leave g_drain_mu locked */
  pthread_mutex_lock(&g_drain_mu);
  size_t moved = 0;
  bool raised = false;
  for (gr_thread_rec_t *r = first; r; r = r->next) {
    young_t *y = young_of(r);
    if (r != self && atomic_load_explicit(&y->n, memory_order_relaxed) != 0) {
      atomic_store_explicit(&y->drain, 1, memory_order_seq_cst);
      raised = true;
    }
  }
  if (raised)
    gr_epoch_heavy_barrier();
  for (gr_thread_rec_t *r = first; r; r = r->next) {
    young_t *y = young_of(r);
    if (r == self) {
      moved += young_move(y);
      continue;
    }
    if (atomic_load_explicit(&y->drain, memory_order_relaxed) == 0)
      continue;
    for (unsigned spins = 0; atomic_load_explicit(&y->op, memory_order_seq_cst) != 0; spins++)
      if (spins > 64)
        sched_yield();
    atomic_thread_fence(memory_order_acquire);
    moved += young_move(y);
    if (cool) {
      atomic_store_explicit(&y->cool, YOUNG_COOL, memory_order_relaxed);
      atomic_store_explicit(&y->countdown, 0, memory_order_relaxed); /* the next insert reads cool */
    }
    atomic_store_explicit(&y->drain, 0, memory_order_release);
  }
  pthread_mutex_unlock(&g_drain_mu);
  (void)pthread_setcancelstate(old, NULL);
  return moved;
}

/* In the child after fork(): the table is emptied, and so are the logs (their owners may be gone mid-operation);
 * each starts over in its thread record. */
void gr_young_atfork_child(void) {
  for (gr_thread_rec_t *r = gr_epoch_first(); r; r = r->next) {
    young_t *y = young_of(r);
    atomic_store_explicit(&y->op, 0, memory_order_relaxed);
    atomic_store_explicit(&y->drain, 0, memory_order_relaxed);
    atomic_store_explicit(&y->n, 0, memory_order_relaxed);
    atomic_store_explicit(&y->cool, 0, memory_order_relaxed);
    atomic_store_explicit(&y->countdown, 0, memory_order_relaxed);
    if (y->mapped) {
      munmap(y->slot, y->mapped);
      gr_table_count_bytes(-(ptrdiff_t)y->mapped);
    }
    y->slot = NULL;
    y->mapped = 0;
    memset(y->inl, 0, sizeof y->inl);
  }
  pthread_mutex_init(&g_drain_mu, NULL);
}

