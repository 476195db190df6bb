/* table.c's log of young records (gr_table_insert_young): a record put there is taken back by its own thread
 * without touching the table, and every other reader finds it all the same, through a drain. Each test checks
 * that the record really went to the log (the table's record count, gr_epoch_live_sum, did not move) before it
 * checks what a reader sees. */
#include "table.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static gr_packed_t young_rec(uint64_t key, unsigned kind) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = key;
  r.size = 4096;
  r.kind = (uint8_t)kind;
  r.state = GR_ST_LIVE;
  r.device = 1;
  r.site.bits = 0x1234;
  r.time_ms = 42;
  r.tid = 7;
  r.ctx_id = 3;
  gr_packed_t p;
  gr_pk_pack(&r, &p);
  return p;
}

static uint64_t addr(uint64_t i) { return UINT64_C(0x300000000000) + i * 512; }

#define LIVE_MASK (GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN))
#define KIND_DEVICE 1 /* GPURECLAIM_KIND_DEVICE */
#define KIND_HOST 4   /* GPURECLAIM_KIND_HOST */

static int take(uint64_t key, gr_packed_t *out) { return gr_table_take_kind_pk(GR_KS_ADDR, key, LIVE_MASK, ~0u, out); }

static void init(void) {
  cr_assert_eq(gr_table_init(), 0);
  cr_assert_not_null(gr_epoch_self(), "no thread record: nothing would go to a log");
}

TestSuite(young, .init = init);

Test(young, a_record_is_taken_back_by_its_thread_without_reaching_the_table) {
  gr_packed_t p = young_rec(addr(1), KIND_DEVICE), out;
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(gr_epoch_live_sum(), 0, "the record went to the table, not to the thread's log");
  gr_rec_t seen;
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(1), LIVE_MASK, &seen), 0, "a lookup does not find a young record");
  cr_assert_eq(seen.size, 4096);
  cr_assert_eq(take(addr(1), &out), 0);
  cr_assert_eq(out.key, p.key);
  cr_assert_eq(out.w1, p.w1);
  cr_assert_eq(out.w2, p.w2);
  cr_assert_eq(gr_pk_state(&out), GR_ST_LIVE);
  cr_assert_eq(gr_pk_ctx(&out), 3);
  cr_assert_eq(take(addr(1), &out), -ENOENT, "a record taken from the log is still there");
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

/* A thread keeps thousands of blocks live and frees them itself, newest first or oldest first: every record
 * stays in its log (the table's count never moves), the log's memory is counted as the table's, and each
 * record comes back once. A log of the 16 newest sent every record past the 16th through the table. */
static void cycle(uint64_t base, uint64_t k, bool fifo) {
  gr_packed_t out;
  for (uint64_t i = 0; i < k; i++) {
    gr_packed_t p = young_rec(addr(base + i), KIND_DEVICE);
    p.w1 += i; /* the size tells the records apart */
    cr_assert_eq(gr_table_insert_young(&p), 0);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0, "%llu live: records went to the table", (unsigned long long)k);
  for (uint64_t j = 0; j < k; j++) {
    uint64_t i = fifo ? j : k - 1 - j;
    cr_assert_eq(take(addr(base + i), &out), 0, "record %llu of %llu lost", (unsigned long long)i,
                 (unsigned long long)k);
    cr_assert_eq(gr_pk_size(&out), 4096 + i);
  }
  cr_assert_eq(take(addr(base), &out), -ENOENT, "a record taken twice");
}

Test(young, a_thread_keeps_thousands_of_its_blocks_in_its_log) {
  size_t before = gr_table_bytes();
  for (int round = 0; round < 3; round++) {
    cycle(10000, 64, false);
    cycle(10000, 64, true);
    cycle(20000, 4096, false);
    cycle(20000, 4096, true);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0);
  cr_assert_geq(gr_table_bytes(), before + 4096 * sizeof(gr_packed_t), "the log's memory is not counted");
}

/* GR_YOUNG_MAX records fill a log; the next insert moves them all into the table, and they are still found. */
Test(young, a_full_log_moves_into_the_table) {
  for (uint64_t i = 0; i < GR_YOUNG_MAX; i++) {
    gr_packed_t p = young_rec(addr(i), KIND_DEVICE);
    cr_assert_eq(gr_table_insert_young(&p), 0);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0, "a log that is not full yet moved into the table");
  gr_packed_t p = young_rec(addr(GR_YOUNG_MAX), KIND_DEVICE), out;
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(gr_epoch_live_sum(), GR_YOUNG_MAX, "the full log did not move into the table");
  for (uint64_t i = GR_YOUNG_MAX + 1; i-- > 0;)
    cr_assert_eq(take(addr(i), &out), 0, "record %llu lost", (unsigned long long)i);
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

/* Takes in a random order from a log that grew, of pseudo-random addresses (an arithmetic progression spreads
 * so evenly that its records never share a run of slots): records move back over the slots freed before them,
 * and each one is found, once. */
static uint64_t xorshift(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

Test(young, takes_in_any_order_from_a_grown_log_find_each_record_once) {
  enum { N = 3000 };
  static uint64_t key[N], order[N];
  uint64_t x = 88172645463325252ull;
  for (uint64_t i = 0; i < N; i++) {
    key[i] = UINT64_C(0x300000000000) + (xorshift(&x) & UINT64_C(0xffffffffe00)); /* distinct: checked below */
    for (uint64_t j = 0; j < i; j++)
      cr_assert_neq(key[j], key[i]);
    gr_packed_t p = young_rec(key[i], KIND_DEVICE);
    p.w1 += i;
    cr_assert_eq(gr_table_insert_young(&p), 0);
    order[i] = i;
  }
  for (uint64_t i = N - 1; i > 0; i--) {
    uint64_t j = xorshift(&x) % (i + 1), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  cr_assert_eq(gr_epoch_live_sum(), 0);
  gr_packed_t out;
  for (uint64_t k = 0; k < N; k++) {
    uint64_t i = order[k];
    cr_assert_eq(take(key[i], &out), 0, "record %llu lost after %llu takes", (unsigned long long)i,
                 (unsigned long long)k);
    cr_assert_eq(gr_pk_size(&out), 4096 + i);
    /* Found in the log: a take that misses there drains the log into the table, and finds it there. */
    cr_assert_eq(gr_epoch_live_sum(), 0, "take %llu missed the log", (unsigned long long)k);
  }
  for (uint64_t i = 0; i < N; i++)
    cr_assert_eq(take(key[i], &out), -ENOENT, "record %llu taken twice", (unsigned long long)i);
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

/* Two records of one address in a log (the first block was freed where no hook saw it, and the driver handed the
 * address out again): a free takes the newest, as the first match in the table decides, and the older one is
 * still there, before and after the log grows. */
Test(young, the_newest_record_of_an_address_is_found_first) {
  gr_packed_t older = young_rec(addr(900), KIND_DEVICE), newer = older, out;
  newer.w1 += 1;
  cr_assert_eq(gr_table_insert_young(&older), 0);
  cr_assert_eq(gr_table_insert_young(&newer), 0);
  for (uint64_t i = 0; i < 500; i++) { /* the log grows past its 16 slots meanwhile */
    gr_packed_t p = young_rec(addr(1000 + i), KIND_DEVICE);
    cr_assert_eq(gr_table_insert_young(&p), 0);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0);
  cr_assert_eq(take(addr(900), &out), 0);
  cr_assert_eq(gr_pk_size(&out), 4097, "the older record was found first");
  cr_assert_eq(take(addr(900), &out), 0, "the older record was lost");
  cr_assert_eq(gr_pk_size(&out), 4096);
  for (uint64_t i = 0; i < 500; i++)
    cr_assert_eq(take(addr(1000 + i), &out), 0);
}

/* A free usually takes the newest record; these take older ones, the oldest and the last one left, each of which
 * must come back whole and once, with the others still in the log. */
Test(young, takes_of_older_records_give_each_record_once) {
  const uint64_t order[] = {2, 0, 4, 3, 1};
  for (uint64_t i = 0; i < 5; i++) {
    gr_packed_t p = young_rec(addr(100 + i), KIND_DEVICE);
    p.w1 += i; /* the size tells the records apart */
    cr_assert_eq(gr_table_insert_young(&p), 0);
  }
  gr_packed_t out;
  for (int k = 0; k < 5; k++) {
    uint64_t i = order[k];
    cr_assert_eq(take(addr(100 + i), &out), 0, "record %llu lost after %d takes", (unsigned long long)i, k);
    cr_assert_eq(out.key, addr(100 + i));
    cr_assert_eq(gr_pk_size(&out), 4096 + i, "record %llu came back with another record's size",
                 (unsigned long long)i);
    cr_assert_eq(take(addr(100 + i), &out), -ENOENT, "record %llu taken twice", (unsigned long long)i);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0, "the records left the log for the table");
}

/* A young record is live: a take of orphans only (a state the logs are searched for) finds nothing, and the
 * record stays to be freed. */
Test(young, a_take_of_orphans_does_not_take_a_live_young_record) {
  gr_packed_t p = young_rec(addr(3), KIND_DEVICE), out;
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(gr_table_take_kind_pk(GR_KS_ADDR, addr(3), GR_STMASK(GR_ST_ORPHAN), ~0u, &out), -ENOENT,
               "a take of orphans took a live young record");
  cr_assert_eq(take(addr(3), &out), 0, "the live record was lost");
}

Test(young, a_take_of_another_kind_leaves_the_record) {
  gr_packed_t p = young_rec(addr(2), KIND_DEVICE), out;
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(gr_table_take_kind_pk(GR_KS_ADDR, addr(2), LIVE_MASK, 1u << KIND_HOST, &out), -ENOENT,
               "a free of another kind took the record");
  cr_assert_eq(gr_table_take_kind_pk(GR_KS_ADDR, addr(2), LIVE_MASK, 1u << KIND_DEVICE, &out), 0);
}

/* Another thread holds young records while the test thread reads. */
static pthread_barrier_t g_bar;
static uint64_t g_first, g_count;
static _Atomic int g_after_rc = 99;

static void *holder(void *arg) {
  bool exit_early = arg != NULL;
  cr_assert_not_null(gr_epoch_self());
  for (uint64_t i = 0; i < g_count; i++) {
    gr_packed_t p = young_rec(addr(g_first + i), KIND_DEVICE);
    cr_assert_eq(gr_table_insert_young(&p), 0);
  }
  cr_assert_eq(gr_epoch_live_sum(), 0, "the holder's records went to the table");
  if (exit_early)
    return NULL;
  pthread_barrier_wait(&g_bar); /* inserted */
  pthread_barrier_wait(&g_bar); /* the test thread has read */
  gr_packed_t out;
  atomic_store(&g_after_rc, take(addr(g_first), &out));
  return NULL;
}

/* Starts fn on a thread of its own and waits until it has inserted (its first barrier). */
static pthread_t start(void *(*fn)(void *)) {
  pthread_t t;
  pthread_barrier_init(&g_bar, NULL, 2);
  cr_assert_eq(pthread_create(&t, NULL, fn, NULL), 0);
  pthread_barrier_wait(&g_bar);
  return t;
}

/* Lets a thread from start() go on past its second barrier, and waits for its end. */
static void finish(pthread_t t) {
  pthread_barrier_wait(&g_bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&g_bar);
}

Test(young, another_threads_free_finds_a_young_record) {
  g_first = 100, g_count = 1;
  pthread_t t = start(holder);
  gr_packed_t out;
  cr_assert_eq(take(addr(100), &out), 0, "a free by another thread missed a young record");
  finish(t);
  cr_assert_eq(atomic_load(&g_after_rc), -ENOENT, "the record was taken twice: once from the log, once drained");
}

/* A producer whose young blocks a consumer frees would make every free drain (an asymmetric barrier each):
 * after one such drain, the producer's next inserts go straight to the table. */
static _Atomic int64_t g_live_after;

static void *producer(void *arg) {
  (void)arg;
  cr_assert_not_null(gr_epoch_self());
  gr_packed_t p = young_rec(addr(600), KIND_DEVICE);
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(gr_epoch_live_sum(), 0);
  pthread_barrier_wait(&g_bar); /* inserted */
  pthread_barrier_wait(&g_bar); /* the consumer took it */
  gr_packed_t q = young_rec(addr(601), KIND_DEVICE);
  cr_assert_eq(gr_table_insert_young(&q), 0);
  atomic_store(&g_live_after, gr_epoch_live_sum());
  return NULL;
}

Test(young, a_thread_whose_young_block_another_thread_freed_inserts_into_the_table_for_a_while) {
  pthread_t t = start(producer);
  gr_packed_t out;
  cr_assert_eq(take(addr(600), &out), 0);
  finish(t);
  cr_assert_eq(atomic_load(&g_live_after), 1, "the producer's next record went to its log again (%lld in the table)",
               (long long)atomic_load(&g_live_after));
  cr_assert_eq(take(addr(601), &out), 0);
}

static int count(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  if (r->state == GR_ST_LIVE)
    ++*(int *)arg;
  return 0;
}

Test(young, a_visit_sees_the_young_records_of_every_thread) {
  g_first = 200, g_count = 3;
  pthread_t t = start(holder);
  gr_packed_t mine = young_rec(addr(300), KIND_DEVICE);
  cr_assert_eq(gr_table_insert_young(&mine), 0);
  int n = 0;
  gr_table_visit(count, &n);
  cr_assert_eq(n, 4, "a visit saw %d of the 4 young records (3 of another thread, 1 of its own)", n);
  cr_assert_eq(gr_epoch_live_sum(), 4, "the visit did not drain the logs into the table");
  finish(t);
  cr_assert_eq(atomic_load(&g_after_rc), 0, "the drained record is gone for its own thread");
}

/* A free's checks for tombstones (RECLAIMING, RECLAIMED) and the allocation's check for stale records
 * (GR_NOT_YOUNG), which run on every allocation while tombstones exist, must not drain the logs each time. */
Test(young, lookups_that_cannot_find_a_young_record_leave_the_logs_alone) {
  g_first = 350, g_count = 2;
  pthread_t t = start(holder);
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(999), GR_STMASK(GR_ST_RECLAIMING), NULL), -ENOENT);
  cr_assert_eq(gr_table_take(GR_KS_ADDR, addr(999), GR_STMASK(GR_ST_RECLAIMED), NULL), -ENOENT);
  cr_assert_eq(gr_table_take(GR_KS_ADDR, addr(351), GR_STMASK(GR_ST_LIVE) | GR_NOT_YOUNG, NULL), -ENOENT,
               "a table-only take found a young record");
  cr_assert_eq(gr_epoch_live_sum(), 0, "a lookup that cannot find a young record drained the logs");
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(999), GR_STMASK(GR_ST_LIVE), NULL), -ENOENT);
  cr_assert_eq(gr_epoch_live_sum(), 2, "a lookup of a live record that found nothing did not drain the logs");
  finish(t);
}

Test(young, the_young_records_of_a_thread_that_exited_are_still_found) {
  g_first = 400, g_count = 2;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, holder, (void *)1), 0);
  pthread_join(t, NULL);
  gr_rec_t r;
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(401), LIVE_MASK, &r), 0, "an exited thread's young record is lost");
  gr_packed_t out;
  cr_assert_eq(take(addr(400), &out), 0);
}

Test(young, a_forked_child_starts_with_empty_logs) {
  gr_packed_t p = young_rec(addr(500), KIND_DEVICE);
  cr_assert_eq(gr_table_insert_young(&p), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    gr_table_atfork_child();
    int rc = gr_table_init() == 0 && gr_table_lookup(GR_KS_ADDR, addr(500), LIVE_MASK, NULL) == -ENOENT ? 0 : 1;
    _exit(rc);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child still had the parent's young record");
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(500), LIVE_MASK, NULL), 0, "the parent lost its young record");
}

/* The owner allocates and frees while another thread drains and visits: every free finds its record (in the
 * log, or drained into the table), and none is found twice. Run under ThreadSanitizer too. */
#define RACE_N 20000
static _Atomic int g_stop, g_missed;

static void *owner(void *arg) {
  (void)arg;
  cr_assert_not_null(gr_epoch_self());
  gr_packed_t out;
  for (uint64_t i = 0; i < RACE_N; i++) {
    gr_packed_t p = young_rec(addr(1000 + i), KIND_DEVICE);
    if (gr_table_insert_young(&p) != 0)
      atomic_fetch_add(&g_missed, 1);
    if (i % 5 == 4) /* some live a while: freed after the next ones */
      for (uint64_t j = i - 4; j <= i; j++)
        if (take(addr(1000 + j), &out) != 0 || out.key != addr(1000 + j))
          atomic_fetch_add(&g_missed, 1);
  }
  atomic_store(&g_stop, 1);
  return NULL;
}

static _Atomic uint64_t g_drains;

static void *drainer(void *arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    atomic_fetch_add(&g_drains, 1);
    gr_table_drain();
    int n = 0;
    gr_table_visit(count, &n);
  }
  return NULL;
}

Test(young, drains_racing_the_owner_lose_nothing, .timeout = 120) {
  pthread_t a, b;
  cr_assert_eq(pthread_create(&a, NULL, owner, NULL), 0);
  cr_assert_eq(pthread_create(&b, NULL, drainer, NULL), 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  cr_assert_eq(atomic_load(&g_missed), 0, "%d frees missed their record", atomic_load(&g_missed));
  cr_assert_eq(gr_epoch_live_sum(), 0, "records left in the table");
  gr_packed_t out;
  for (uint64_t i = 0; i < RACE_N; i++)
    cr_assert_eq(take(addr(1000 + i), &out), -ENOENT, "record %llu found twice", (unsigned long long)i);
}

/* The same with thousands of records live in the owner's log: it grows (a mapping replaces the thread record's
 * slots, then a larger one), fills and moves into the table, while another thread drains and visits; the owner
 * frees newest first and oldest first. Every free finds its record once. Run under ThreadSanitizer too. */
static _Atomic int g_grown; /* rounds whose log held more than its 16 inline slots can (12) */

static void *grower(void *arg) {
  (void)arg;
  cr_assert_not_null(gr_epoch_self());
  gr_packed_t out;
  static const uint64_t live[] = {40, 700, 3000, GR_YOUNG_MAX + 500};
  uint64_t base = 50000;
  while (atomic_load(&g_drains) == 0) /* the drainer is running */
    sched_yield();
  for (int round = 0; round < 24; round++) {
    uint64_t k = live[round % 4];
    for (uint64_t i = 0; i < k; i++) {
      gr_packed_t p = young_rec(addr(base + i), KIND_DEVICE);
      if (gr_table_insert_young(&p) != 0)
        atomic_fetch_add(&g_missed, 1);
    }
    if ((uint64_t)gr_epoch_live_sum() + 12 < k) /* the rest in the log, which grew for them */
      atomic_fetch_add(&g_grown, 1);
    for (uint64_t j = 0; j < k; j++) {
      uint64_t i = round & 1 ? j : k - 1 - j;
      if (take(addr(base + i), &out) != 0 || out.key != addr(base + i))
        atomic_fetch_add(&g_missed, 1);
    }
    base += k;
  }
  atomic_store(&g_stop, 1);
  return NULL;
}

Test(young, drains_racing_a_growing_log_lose_nothing, .timeout = 120) {
  pthread_t a, b;
  cr_assert_eq(pthread_create(&a, NULL, grower, NULL), 0);
  cr_assert_eq(pthread_create(&b, NULL, drainer, NULL), 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  cr_assert_eq(atomic_load(&g_missed), 0, "%d frees missed their record", atomic_load(&g_missed));
  cr_assert_eq(gr_epoch_live_sum(), 0, "records left in the table");
  cr_assert_gt(atomic_load(&g_drains), 1, "the drainer never ran beside the owner");
  cr_assert_gt(atomic_load(&g_grown), 0, "the owner's log never grew: the drains kept it empty");
  cr_assert_eq(gr_table_check(), 0);
}

/* A thread that starts after another exited may get the exited thread's record, and with it its log: it takes
 * those records back from there, once, and a later reader does not find them again. */
static _Atomic int g_reuser_rc[3] = {99, 99, 99};

static void *reuser(void *arg) {
  (void)arg;
  cr_assert_not_null(gr_epoch_self());
  gr_packed_t out;
  atomic_store(&g_reuser_rc[0], take(addr(700), &out));
  atomic_store(&g_reuser_rc[1], take(addr(701), &out));
  atomic_store(&g_reuser_rc[2], take(addr(700), &out));
  return NULL;
}

Test(young, a_thread_that_reuses_an_exited_threads_record_takes_its_young_records_once) {
  g_first = 700, g_count = 2;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, holder, (void *)1), 0);
  pthread_join(t, NULL);
  cr_assert_eq(pthread_create(&t, NULL, reuser, NULL), 0);
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&g_reuser_rc[0]), 0, "the exited thread's young record was lost");
  cr_assert_eq(atomic_load(&g_reuser_rc[1]), 0, "the exited thread's young record was lost");
  cr_assert_eq(atomic_load(&g_reuser_rc[2]), -ENOENT, "a young record was taken twice");
  gr_packed_t out;
  cr_assert_eq(take(addr(700), &out), -ENOENT, "a taken young record is still found by another thread");
  cr_assert_eq(take(addr(701), &out), -ENOENT, "a taken young record is still found by another thread");
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

/* A free the driver refused puts the record back into the table (gr_track_restore): the next free of the block,
 * by its thread or another, finds it there, once. */
Test(young, a_young_record_taken_and_put_back_is_found_once) {
  gr_packed_t p = young_rec(addr(800), KIND_DEVICE), out;
  cr_assert_eq(gr_table_insert_young(&p), 0);
  cr_assert_eq(take(addr(800), &out), 0);
  cr_assert_eq(gr_table_insert_pk(&out), 0); /* the driver refused the free */
  cr_assert_eq(take(addr(800), &out), 0, "the record put back is lost");
  cr_assert_eq(take(addr(800), &out), -ENOENT, "the record put back is found twice");
  cr_assert_eq(gr_epoch_live_sum(), 0);
}

/* Producers allocate; each frees most of its blocks itself and hands the others to a consumer, which frees
 * them while the producers go on inserting (their logs filling, moving into the table, being drained by the
 * consumer's misses and by a visitor). Every free finds its record exactly once and nothing stays behind.
 * Run under ThreadSanitizer too. */
#define HAND_N 21000 /* a multiple of 3: every block is freed */
#define HAND_PRODUCERS 2
#define HAND_Q 1024
static _Atomic uint64_t g_q[HAND_Q];
static _Atomic uint64_t g_q_head, g_q_tail;
static pthread_mutex_t g_q_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_hand_missed, g_producers_done, g_consumer_done;

static void hand(uint64_t key) {
  for (;;) {
    pthread_mutex_lock(&g_q_mu);
    uint64_t h = atomic_load(&g_q_head), t = atomic_load(&g_q_tail);
    if (t - h < HAND_Q) {
      atomic_store(&g_q[t % HAND_Q], key);
      atomic_store(&g_q_tail, t + 1);
      pthread_mutex_unlock(&g_q_mu);
      return;
    }
    pthread_mutex_unlock(&g_q_mu);
    sched_yield();
  }
}

static void *hand_producer(void *arg) {
  uint64_t base = 100000 + (uint64_t)(uintptr_t)arg * HAND_N;
  cr_assert_not_null(gr_epoch_self());
  gr_packed_t out;
  for (uint64_t i = 0; i < HAND_N; i++) {
    gr_packed_t p = young_rec(addr(base + i), KIND_DEVICE);
    if (gr_table_insert_young(&p) != 0)
      atomic_fetch_add(&g_hand_missed, 1);
    if (i % 3 == 0) {
      hand(addr(base + i));
    } else if (i % 3 == 2) { /* the two before it: one handed over, one freed here */
      if (take(addr(base + i - 1), &out) != 0 || out.key != addr(base + i - 1))
        atomic_fetch_add(&g_hand_missed, 1);
      if (take(addr(base + i), &out) != 0 || out.key != addr(base + i))
        atomic_fetch_add(&g_hand_missed, 1);
    }
  }
  atomic_fetch_add(&g_producers_done, 1);
  return NULL;
}

static void *hand_consumer(void *arg) {
  (void)arg;
  gr_packed_t out;
  for (;;) {
    pthread_mutex_lock(&g_q_mu);
    uint64_t h = atomic_load(&g_q_head), t = atomic_load(&g_q_tail), key = 0;
    if (h < t) {
      key = atomic_load(&g_q[h % HAND_Q]);
      atomic_store(&g_q_head, h + 1);
    }
    pthread_mutex_unlock(&g_q_mu);
    if (key) {
      if (take(key, &out) != 0 || out.key != key)
        atomic_fetch_add(&g_hand_missed, 1);
    } else if (atomic_load(&g_producers_done) == HAND_PRODUCERS) {
      break;
    } else {
      sched_yield();
    }
  }
  atomic_store(&g_consumer_done, 1);
  return NULL;
}

static void *hand_visitor(void *arg) {
  (void)arg;
  while (!atomic_load(&g_consumer_done)) {
    int n = 0;
    gr_table_visit(count, &n);
    usleep(200);
  }
  return NULL;
}

Test(young, handovers_to_a_consumer_racing_producers_and_visits_lose_nothing, .timeout = 240) {
  pthread_t p[HAND_PRODUCERS], c, v;
  cr_assert_eq(pthread_create(&c, NULL, hand_consumer, NULL), 0);
  cr_assert_eq(pthread_create(&v, NULL, hand_visitor, NULL), 0);
  for (uintptr_t i = 0; i < HAND_PRODUCERS; i++)
    cr_assert_eq(pthread_create(&p[i], NULL, hand_producer, (void *)i), 0);
  for (int i = 0; i < HAND_PRODUCERS; i++)
    pthread_join(p[i], NULL);
  pthread_join(c, NULL);
  pthread_join(v, NULL);
  cr_assert_eq(atomic_load(&g_hand_missed), 0, "%d frees missed their record", atomic_load(&g_hand_missed));
  int n = 0;
  gr_table_visit(count, &n);
  cr_assert_eq(n, 0, "%d records left behind (found twice, or never taken)", n);
  cr_assert_eq(gr_epoch_live_sum(), 0, "records left in the table");
}
