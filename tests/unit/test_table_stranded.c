/* Migrations into a generation that cannot take everything its predecessor holds (table.c, "Migration" and
 * "Sizing"). A settle or a compaction sizes the next generation from a count of the records; records inserted
 * into the old generation after that count and before the new one is linked (while it is being mapped, or while
 * the thread that counted is preempted) are migrated too, and may not fit. The old generation's migration can
 * then never finish, and nothing may wait for it. table.c is compiled in here, with mmap() wrapped so that a test
 * can act while a generation is being mapped: what other threads' inserts do in that window, done
 * deterministically. */
#include <sys/mman.h>
void *test_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);
#define mmap test_mmap
#include "../../src/table/table.c"
#include "../../src/table/young.c"
#undef mmap

#include <criterion/criterion.h>

static void (*g_on_mmap)(void); /* runs once, at the next mapping of the table's */

void *test_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
  void (*fn)(void) = g_on_mmap;
  g_on_mmap = NULL;
  void *p = mmap(a, n, prot, flags, fd, off);
  if (fn)
    fn();
  return p;
}

static uint64_t addr(uint64_t i) { return UINT64_C(0x200000000000) + i * 512; }

static int insert(uint64_t i) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.key = addr(i);
  r.size = 4096 + i;
  r.kind = 1; /* GPURECLAIM_KIND_DEVICE */
  r.state = GR_ST_LIVE;
  r.device = 0;
  r.ctx_id = 3;
  return gr_table_insert(&r);
}

static void found(uint64_t i) {
  gr_rec_t out;
  cr_assert_eq(gr_table_lookup(GR_KS_ADDR, addr(i), GR_STMASK(GR_ST_LIVE), &out), 0, "record %llu lost",
               (unsigned long long)i);
  cr_assert_eq(out.size, 4096 + i, "record %llu came back with another's size", (unsigned long long)i);
}

static void take(uint64_t i) {
  gr_rec_t out;
  cr_assert_eq(gr_table_take(GR_KS_ADDR, addr(i), GR_STMASK(GR_ST_LIVE), &out), 0, "record %llu lost",
               (unsigned long long)i);
  cr_assert_eq(out.size, 4096 + i);
}

static void init(void) {
  cr_assert_eq(gr_table_init(), 0);
  cr_assert_not_null(gr_epoch_self());
}

TestSuite(migration, .init = init, .timeout = 60);

/* A migration stuck for want of room (its next generation full, records of the old one left to move): an insert
 * that finds the next generation full gives up (-ENOMEM, the block goes untracked) instead of trying again for
 * ever, every record is still found, and once frees make room the migration finishes. Before, the insert spun
 * (own_root() failing counted as "the table moved on"), and a drain that met it held every other drain. */
Test(migration, an_insert_into_a_full_generation_whose_predecessor_cannot_finish_returns) {
  enum { N = 3000 };
  for (uint64_t i = 0; i < N; i++)
    cr_assert_eq(insert(i), 0);
  gr_epoch_enter();
  gen_t *g = load_root();
  gen_t *n = new_gen(MIN_CAP, next_mult(g), 0), *expected = NULL; /* a generation too small for g's records */
  cr_assert_not_null(n);
  cr_assert(atomic_compare_exchange_strong(&g->next, &expected, n));
  help_migrate(g);
  gr_epoch_exit();
  cr_assert_lt(atomic_load(&g->done), g->cap, "the migration finished: this test needs one that cannot");
  cr_assert_eq(insert(N), -ENOMEM, "an insert into the full generation");
  for (uint64_t i = 0; i < N; i++)
    found(i);
  for (uint64_t i = 0; i < N - 500; i++) /* frees make room */
    take(i);
  cr_assert_eq(insert(N), 0, "an insert after the frees made room");
  gr_table_compact();
  cr_assert_eq(gr_table_check(), 0);
  for (uint64_t i = N - 500; i <= N; i++)
    found(i);
}

/* A compaction counts 1,000 records and maps a generation for them; meanwhile (here: while it is mapped) 4,000
 * more go into the old generation. The new one must not be linked to take them all: the compaction is dropped or
 * sized for them, and the table goes on taking inserts. Before, it was linked, filled up with the old
 * generation's records, and the migration could never finish: every insert after it failed (or, since issue 28,
 * spun for ever). */
static void insert_more(void) {
  gen_t *g = load_root();
  for (uint64_t i = 20000; i < 24000; i++)
    cr_assert_eq(insert(i), 0);
  cr_assert(load_root() == g && !atomic_load(&g->next), "the inserts migrated the table themselves");
}

Test(migration, records_inserted_while_a_smaller_generation_is_mapped_do_not_strand_the_migration) {
  for (uint64_t i = 0; i < 20000; i++)
    cr_assert_eq(insert(i), 0);
  for (uint64_t i = 1000; i < 20000; i++)
    take(i);
  uint64_t cap = gr_table_capacity();
  g_on_mmap = insert_more;
  gr_table_compact();
  cr_assert_null(g_on_mmap, "the compaction mapped nothing");
  for (uint64_t i = 0; i < 1000; i++)
    found(i);
  for (uint64_t i = 20000; i < 24000; i++)
    found(i);
  cr_assert_eq(insert(30000), 0, "an insert after the compaction");
  gr_table_compact(); /* (nothing inserted meanwhile now) */
  cr_assert_eq(gr_table_check(), 0);
  cr_assert_lt(gr_table_capacity(), cap, "the table never shrank");
  found(30000);
}
