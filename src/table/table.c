/*
 * table.c -- the lock-free block table. The threads' logs of young records in front of it are young.c
 * (table_young.h: what the two ask of each other); a record's layout is record.h.
 *
 * Data structure
 *   An open-addressing hash table with linear probing whose slots hold the records themselves, 40 bytes each in
 *   two parts: a 32-byte slot of the words a probe and a take look at, two to a cache line (32-byte aligned, so
 *   none straddles two lines), and the site word in a parallel array (slot_w2()), read only with a record
 *   found:
 *     ctl   state (3 bits) | PENDING | MOVED | slot generation (11) | ctx id (12) | pool id (12) | scope (16) |
 *           aux (8)                             -- or, once MOVED: MOVED | FWD | DONE | INPROG | fwd index
 *     key   the block's address (or VMM handle)
 *     w1    size (48) | kind (4) | device (7) | api (5)
 *     w3    allocation time in ms (40) | tag (2) | thread id (22)
 *     w2    (the parallel array) allocation site (gr_site_t: a code address or a stack id); for mappings the
 *           VMM handle instead
 *   The table is one "generation": an mmap()ed array of cap slots, then cap site words, cap any integer; the
 *   home slot of a key is fastrange(key * mult, cap), mult the generation's multiplier (see hash_in()). A
 *   generation is replaced by a new one (growth, or a settle to the size its records need) through a
 *   cooperative migration; old generations are unmapped through epoch.c.
 *
 * Deletion without tombstones
 *   A delete makes its slot free for good (DELETED is a free state, like EMPTY), so a changing set of keys
 *   never fills a generation with tombstones and the table migrates only when the number of records calls for
 *   another size. Probes therefore cannot stop at a free slot. Instead each generation keeps max_disp, the
 *   largest distance from its home at which any record was ever placed in it (monotonic; raised before the
 *   record is published), and a lookup probes at most max_disp + 1 slots. Inserts take the first free slot.
 *
 * Publishing a record (single writer per slot)
 *   insert: one CAS ctl EMPTY|DELETED -> the record's final ctl (state, metadata, slot generation + 1), then
 *   release stores of key, w1, w2 and, last, w3, whose tag bits are the low bits of the slot generation. A
 *   reader takes a seqlock-style consistent copy: load ctl (acquire), load w3 (acquire) and the other words,
 *   reload ctl. Equal ctl values mean one occupant; a w3 tag that differs from ctl's slot generation means the
 *   insert is still writing (the words are the previous occupant's), and the record is treated as not there
 *   yet. That is safe because every delete has read the record's w3 first, so a reader can only ever see the
 *   previous occupant's tag, never an older one that might match. The payload of an occupant never changes
 *   afterwards; only ctl's state/scope/aux do, by CAS, so a record has exactly one owner of each transition:
 *   a free and a concurrent release race on one CAS and only one of them frees the block.
 *   Where membarrier is missing (and under ThreadSanitizer, which does not model it) the insert instead claims
 *   the slot as BUSY and publishes with a second CAS; migration copies always do (BUSY, then PENDING).
 *
 * Invariants (checked by gr_table_check() and the tests)
 *   I1  Every record of a generation lies at most max_disp slots past its home slot, and max_disp covered it
 *       before it was published; so a lookup that happens after an insert finds the record within the bound.
 *   I2  A present record's payload is immutable; ctl changes by CAS only; the slot generation changes exactly
 *       when a new occupant takes the slot.
 *   I3  At most one present record per (key space, key) is LIVE, ORPHAN or RELEASED: the driver never hands out
 *       an address that is live, and a record leaves (CAS to DELETED) before the real free is called.
 *   I4  A migrating slot is frozen (MOVED) exactly once; a frozen slot with FWD points to the copy of its
 *       record in the next generation; DONE is set once that copy is published; the generation is finished
 *       when every slot is DONE, and only then does the root move to the next generation.
 *   I5  The number of records equals inserts minus deletes (sum of the per-thread counters of epoch.c).
 *
 * Sizing (check_size: every 32nd table insert of a thread, every insert that probed 24 slots, and every
 * YOUNG_PERIOD-th young insert of a thread check)
 *   Growth: a generation more than 75% live (epoch.c's approximate count, confirmed with the exact sum; so the
 *   load may pass 75% by up to 62 records per inserting thread) is replaced by one twice as large, with the
 *   same multiplier. (Linear probing with inserts into the first free slot degrades fast past 75%: a churn at a
 *   constant 78% load cost 120 ns per insert+take, at 66% 25 ns.) A million records take 11 migrations.
 *   Settling: a generation keeps a window, as many inserts (g_inserts: into the table or a young log) as it has
 *   slots, and the most records it was seen holding meanwhile (its peak, noted at the checks). When a window
 *   ends and the generation maps more than SETTLE_BYTES per record of that peak, it is replaced by one sized for
 *   the peak at 68% load (61 bytes a record), hashing with the next multiplier, if that saves an eighth at
 *   least; else the next window begins.
 *   A delete never migrates. So memory follows what the program holds over a window, not what it holds at one
 *   moment: right after growing, a table maps up to 107 bytes a record (37.5% load) until a window has passed;
 *   an oscillation 0 -> K -> 0 settles once, to its peak, and then never migrates (a cycle has K inserts, and
 *   a generation at most 75% full at K has more slots than that: every window sees a peak); a program that
 *   frees a million blocks pays no migration on the way down, and the generation shrinks once it allocates
 *   again for a window.
 *   Cost: a growth is paid by the inserts that filled the half of the generation it doubled, a settle by the
 *   window's inserts (at least as many as the slots it scans): amortized, every migration costs a constant per
 *   insert, whatever the pattern of inserts and deletes. Every record is counted when sizing, in whatever
 *   state: tombstones, records a release claimed, and the records in the threads' young logs, which a drain
 *   moves in.
 *
 * Migration (it does not stop other threads)
 *   A thread that decided a generation G needs another maps the generation N and links it as G->next. From
 *   then on inserts go to N, and every operation that sees G->next first helps: it claims a chunk of G's slots
 *   and migrates each:
 *     empty/deleted/busy slot:  CAS ctl -> MOVED|DONE (an insert that owned a busy slot sees its publish CAS
 *                               fail and inserts into N itself);
 *     unwritten record:         the helper runs epoch.c's asymmetric barrier once (membarrier: every thread's
 *                               earlier stores become visible, every thread's later loads see G->next) and
 *                               looks again; a record still unwritten is frozen MOVED|DONE|INPROG. Its
 *                               inserter, which reloads t->next after writing w3, sees the migration, and
 *                               either moves its record itself or, finding INPROG, inserts it into N;
 *     present record:           reserve a slot j in N holding a PENDING copy, CAS G's ctl -> MOVED|FWD|j
 *                               (a concurrent change of the record makes the CAS fail: the copy is updated and
 *                               the CAS retried), publish the copy (clear PENDING), set DONE.
 *   Anyone meeting MOVED|FWD follows it (publishing the copy if needed), so a record is visible at every moment
 *   in exactly one place. Lookups probe G, then N for records inserted there directly (each within its own
 *   bound; a copy raises N's bound before its source forwards to it). A PENDING slot is invisible
 *   to probes of N until its source confirms it. The thread whose DONE completes the count moves the root to N
 *   and retires G; so does a sweep that saw every slot DONE, since the thread holding the count's last
 *   increment may be preempted. Operations never wait for one another: a stalled helper's slots can be
 *   migrated by anyone, and the full scan that finishes a migration is done by whoever needs the next one.
 *
 * Memory ordering
 *   Payload stores are release and payload loads acquire, so a reader that sees the tag of a new occupant also
 *   sees its other words. The root and G->next are read with acquire (root: seq_cst, see epoch.c). The
 *   one-CAS insert relies on the barrier above for its store (w3) -> load (t->next) order: either the store
 *   was visible before the helper's barrier returned, or the load came after the barrier and sees G->next.
 *
 * Progress: lookup, update and take are lock-free; insert is lock-free (it may help a migration first). No
 * helper waits for an insert in progress: it freezes the slot and the inserter redoes its own work.
 * Cost: an insert is one CAS, a take one CAS; there is no shared counter (record counts are per thread).
 * Memory: 40 bytes a slot (32 + the site word); settled, at 66% load at the peak of a window, 61 bytes per
 * record once the table is past its minimum size (1024 slots); between a growth and the end of the next window
 * up to 107; during a migration the old generation too (the thread that ends it frees the old one on its next
 * operation): up to 160 bytes per record at the peak of a growth.
 */
#include "table.h"
#include "table_young.h"
#include "common.h" /* GR_ASSERT */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct slot {
  _Atomic uint64_t ctl;
  _Atomic uint64_t key;
  _Atomic uint64_t w1;
  _Atomic uint64_t w3;
} slot_t; /* w2: slot_w2() */

typedef struct gen {
  /* Read by every operation, written once (next) or rarely (max_disp): one cache line. */
  uint64_t cap;
  uint64_t mult;     /* this generation's hash multiplier (hash_in) */
  uint64_t grow_at;  /* live records that call for a larger generation */
  size_t bytes;      /* mapped size */
  _Atomic(struct gen *) next;
  _Atomic uint64_t max_disp; /* largest distance from its home slot of any record placed here */
  uint64_t seq;              /* the how-manieth generation this is (a visit resumes in the one it began) */
  /* Written while the generation is migrated, and by the size checks: a line of their own. */
  _Alignas(64) _Atomic uint64_t cursor; /* next chunk to migrate */
  _Atomic uint64_t done;                /* slots whose migration is finished */
  _Atomic uint64_t win_start;           /* g_inserts when this generation's current window began */
  _Atomic uint64_t win_peak;            /* most records it was seen holding in that window */
  _Alignas(64) slot_t slots[];          /* cap of them, then cap site words (slot_w2) */
} gen_t;

/* The site word (w2) of slot s of generation g: in the array after the slots, at the same index. */
static inline _Atomic uint64_t *slot_w2(gen_t *g, const slot_t *s) {
  return (_Atomic uint64_t *)(void *)&g->slots[g->cap] + (s - g->slots);
}

/* ---- ctl encoding ---- */
#define ST_MASK UINT64_C(7)
#define F_PENDING (UINT64_C(1) << 3)
#define F_MOVED (UINT64_C(1) << 4)
#define F_FWD (UINT64_C(1) << 5)
#define F_DONE (UINT64_C(1) << 6)
#define F_INPROG (UINT64_C(1) << 7) /* frozen while its insert was writing it: the inserter inserts again */
/* A forward names the slot generation of the occupant it froze and of its copy, so that a forward whose copy
 * was deleted and whose slot was reused by another record is recognised as leading nowhere. */
#define FWD_SRC_SHIFT 8
#define FWD_DST_SHIFT 19
#define FWD_IDX_SHIFT 30
#define SGEN_SHIFT 5
#define SGEN_MASK UINT64_C(0x7ff)
/* w3: time (40 bits) | tag (2) | thread id (22). The other fields' places: gr_packed_t (table.h). */
#define W3_TID_MASK GR_PK_TID_MASK
#define W3_TAG_SHIFT 22
#define W3_TAG_MASK UINT64_C(3)
#define W3_TIME_SHIFT GR_PK_TIME_SHIFT
#define META_MASK (~((SGEN_MASK << SGEN_SHIFT) | ST_MASK | F_PENDING | F_MOVED))


#define MIN_CAP 1024u
/* An insert that probed this far checks the load at once (else every 32nd insert of a thread does). */
#define LONG_PROBE 24u
#define CHUNK 128u
/* The sizing policy ("Sizing" above). Loads in 1/1000 of the slots. */
#define GROW_PERMILLE 750u    /* a generation this full is replaced by one twice as large */
#define GROWN_PERMILLE 500u   /* ... or larger, should it be fuller than that (a drain of many young records) */
#define SETTLE_PERMILLE 680u  /* a generation sized for a window's peak (a settle, a shrink, a compaction) */
#define SETTLE_BYTES 64u      /* a window whose peak got less than this per record from the generation settles */

static _Atomic(gen_t *) g_root;
static _Atomic size_t g_bytes;
static _Atomic size_t g_bytes_peak; /* high-water mark of g_bytes since the last gr_table_bytes_peak(true) */
static _Atomic uint64_t g_migrations;
static _Atomic uint64_t g_gen_seq;  /* generations made so far, never decremented: gen_t.seq */
/* Inserts so far, give or take: a thread adds its table inserts 32 at a time and its young ones YOUNG_PERIOD at
 * a time. The size windows are counted in them. */
static _Atomic uint64_t g_inserts;
static GR_TLS_IE unsigned t_ops;     /* operations of this thread: reclamation every 64th */

static inline unsigned ctl_state(uint64_t c) { return (unsigned)(c & ST_MASK); }
static inline uint32_t ctl_sgen(uint64_t c) { return (uint32_t)((c >> SGEN_SHIFT) & SGEN_MASK); }
static inline uint64_t ctl_with(uint64_t meta, unsigned st, uint32_t sgen) {
  return (meta & META_MASK) | ((uint64_t)(sgen & SGEN_MASK) << SGEN_SHIFT) | st;
}
static inline bool st_present(unsigned st) { return (GR_PRESENT_MASK >> st) & 1; }

/* Which state a record may move to from each state, by gr_table_update() and gr_table_cas() (the table's own
 * moves: an insert makes a free slot BUSY, LIVE or ORPHAN; a take makes a present record DELETED). A record is
 * owned by the program (LIVE, ORPHAN once its scope ended) until it is freed (DELETED), a release claims it
 * (RECLAIMING) and then frees it (RECLAIMED, a tombstone kept for a late free, or DELETED) or gives it back
 * (LIVE or ORPHAN, when the driver refused), or its VMM handle is released while mapped (RELEASED, then
 * DELETED at its last unmap, or back when the driver refused the release). A state may also stay as it is
 * while the scope or aux changes. Nothing moves out of EMPTY, BUSY or DELETED this way. Checked in the debug
 * build (GR_DEBUG); a move outside this table is a bug in the caller's edit. */
static const uint8_t k_moves[8] = {
    [GR_ST_LIVE] = GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN) | GR_STMASK(GR_ST_RELEASED) |
                   GR_STMASK(GR_ST_RECLAIMING) | GR_STMASK(GR_ST_DELETED),
    [GR_ST_ORPHAN] = GR_STMASK(GR_ST_ORPHAN) | GR_STMASK(GR_ST_RELEASED) | GR_STMASK(GR_ST_RECLAIMING) |
                     GR_STMASK(GR_ST_DELETED),
    [GR_ST_RELEASED] = GR_STMASK(GR_ST_RELEASED) | GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN) |
                       GR_STMASK(GR_ST_DELETED),
    [GR_ST_RECLAIMING] = GR_STMASK(GR_ST_RECLAIMING) | GR_STMASK(GR_ST_RECLAIMED) | GR_STMASK(GR_ST_DELETED) |
                         GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN),
    [GR_ST_RECLAIMED] = GR_STMASK(GR_ST_RECLAIMED) | GR_STMASK(GR_ST_DELETED),
};
static inline bool legal_move(unsigned from, unsigned to) { return (k_moves[from & 7] >> (to & 7)) & 1; }
static inline uint64_t fwd_ctl(uint32_t src, uint32_t dst, uint64_t j) {
  return F_MOVED | F_FWD | ((uint64_t)(src & SGEN_MASK) << FWD_SRC_SHIFT) |
         ((uint64_t)(dst & SGEN_MASK) << FWD_DST_SHIFT) | (j << FWD_IDX_SHIFT);
}
static inline uint32_t fwd_src(uint64_t c) { return (uint32_t)((c >> FWD_SRC_SHIFT) & SGEN_MASK); }
static inline uint32_t fwd_dst(uint64_t c) { return (uint32_t)((c >> FWD_DST_SHIFT) & SGEN_MASK); }
static inline uint64_t fwd_idx(uint64_t c) { return c >> FWD_IDX_SHIFT; }

/* Multiplicative hashing: home() takes the high bits of key * mult, the generation's multiplier. Device
 * addresses come in arithmetic progressions (a driver hands out aligned chunks in order), which a multiplier
 * spreads almost evenly over the slots (the three-distance theorem), so probe runs, and the probe bound, stay
 * shorter than with a hash that looks random (whose runs at 66% load reach 50-100 slots among 100,000 keys);
 * other keys fare as with any multiplicative hash. How evenly depends on the stride: each multiplier has
 * strides that it spreads badly. 2^64/phi (Fibonacci hashing, the only multiplier until issue 28) averages 57
 * slots of displacement at 75% load for 1M keys 64 KiB apart. These eight were drawn as random odd numbers and
 * kept for their worst case: at 75% load, 1,000 to 300,000 keys, strides 2^4 to 2^30 and 3, 5 and 7 times 2^4 to
 * 2^24, each averages at most 3 slots of displacement anywhere (16 of 22,095 draws did); of those, these had
 * the best worst case over a wider set (strides 2^3 to 2^36 and 3, 5, 7, 9 and 11 times 2^4 to 2^26, up to 1.5M
 * keys, loads 37.5 to 75%, generations of a power of two slots, which growth makes, and of other sizes): 9 to
 * 15 slots, where phi's is 77.
 * A generation that does not double its predecessor takes the next multiplier: records that survive in one part
 * of the old generation (a release frees in slot order, and keeps its first 65,536 as tombstones) then spread
 * over the whole new one instead of crowding the part of it that their old order maps to (the release of 130,000
 * orphans, which took 2 s: probes of 66,000 slots in a generation sized for 80,000 records). A growth keeps the
 * multiplier: each run of old slots lands on twice as many new ones, in order. The key space goes into the top
 * bits. */
static const uint64_t k_mult[] = {
    UINT64_C(0x7b6ef656223da07d), UINT64_C(0xd92b2a0248a146af), UINT64_C(0xb4c4dbebb5b8e915),
    UINT64_C(0x7470ab30ab10993f), UINT64_C(0x5115dce9f8b83e81), UINT64_C(0x0e3c5840f57134e7),
    UINT64_C(0x1ec7ab94945b3d4f), UINT64_C(0xb9c1b98c28d11f57)};
#define NMULT (sizeof k_mult / sizeof k_mult[0])
static inline uint64_t hash_in(const gen_t *g, unsigned ks, uint64_t key) {
  return (key ^ ((uint64_t)ks << 61)) * g->mult;
}
static inline uint64_t home(const gen_t *g, uint64_t h) {
  return (uint64_t)(((unsigned __int128)h * g->cap) >> 64);
}
static inline uint64_t nexti(const gen_t *g, uint64_t i) { return i + 1 == g->cap ? 0 : i + 1; }

/* Raises g's probe bound to cover a record placed d slots past its home; called before it is published. */
static inline void note_disp(gen_t *g, uint64_t d) {
  uint64_t m = atomic_load_explicit(&g->max_disp, memory_order_relaxed);
  while (GR_TABLE_UNLIKELY(d > m) &&
         !atomic_compare_exchange_weak_explicit(&g->max_disp, &m, d, memory_order_release, memory_order_relaxed))
    ;
}
/* Slots a lookup in g probes from a home slot: every record of g lies within max_disp of its home. */
static inline uint64_t probe_len(gen_t *g) {
  uint64_t m = atomic_load_explicit(&g->max_disp, memory_order_acquire) + 1;
  return m < g->cap ? m : g->cap;
}

/* ---- packing ---- */
_Static_assert(sizeof(slot_t) == 32 && offsetof(gen_t, slots) % 32 == 0,
               "a slot is four words, 32-byte aligned: never across two cache lines");
_Static_assert(sizeof(gr_site_t) == sizeof(uint64_t), "a site fills w2");
static inline uint64_t meta_of(const gr_rec_t *r) { return gr_pk_meta(r->ctx_id, r->pool_id, r->scope, r->aux); }
static inline void unpack(uint64_t c, uint64_t key, uint64_t w1, uint64_t w2, uint64_t w3, gr_rec_t *r) {
  gr_packed_t p = {c, key, w1, w2, w3};
  gr_pk_unpack(&p, r);
}
static inline unsigned rec_ks(uint64_t w1) { return gr_kind_keyspace((unsigned)((w1 >> 48) & 0xf)); }

/* Whether w3 was written by the occupant of slot generation ctl_sgen(c) (see "Publishing a record"). */
static inline bool tag_ok(uint64_t w3, uint64_t c) {
  return ((w3 >> W3_TAG_SHIFT) & W3_TAG_MASK) == (ctl_sgen(c) & W3_TAG_MASK);
}

enum { READ_OK = 1, READ_CHANGED = 0, READ_UNWRITTEN = -1 };

/* Consistent copy of the occupant described by c: READ_OK; READ_CHANGED if the slot changed meanwhile;
 * READ_UNWRITTEN while its insert is still writing it (then it is not there yet for anyone but its inserter). */
static int read_slot(gen_t *g, slot_t *s, uint64_t c, gr_rec_t *out, uint64_t *w1out) {
  uint64_t w3 = atomic_load_explicit(&s->w3, memory_order_acquire); /* written last */
  uint64_t key = atomic_load_explicit(&s->key, memory_order_acquire);
  uint64_t w1 = atomic_load_explicit(&s->w1, memory_order_acquire);
  uint64_t w2 = out ? atomic_load_explicit(slot_w2(g, s), memory_order_acquire) : 0;
  if (atomic_load_explicit(&s->ctl, memory_order_acquire) != c)
    return READ_CHANGED;
  if (!tag_ok(w3, c))
    return READ_UNWRITTEN;
  if (out)
    unpack(c, key, w1, w2, w3, out);
  if (w1out)
    *w1out = w1;
  return READ_OK;
}

/* Writes an occupant's payload, w3 last and tagged with the occupant's slot generation. */
static inline void write_payload(gen_t *g, slot_t *s, uint64_t key, uint64_t w1, uint64_t w2, uint64_t w3,
                                 uint32_t sgen) {
  atomic_store_explicit(&s->key, key, memory_order_release);
  atomic_store_explicit(&s->w1, w1, memory_order_release);
  atomic_store_explicit(slot_w2(g, s), w2, memory_order_release);
  atomic_store_explicit(&s->w3, (w3 & ~(W3_TAG_MASK << W3_TAG_SHIFT)) | ((uint64_t)(sgen & W3_TAG_MASK) << W3_TAG_SHIFT),
                        memory_order_release);
}

/* ---- generations ---- */

/* One retired minimum-size generation is kept for reuse: small tables that churn through ever-new addresses
 * migrate often, and a fresh mapping costs page faults plus, when unmapped, TLB shootdowns on every CPU.
 * It is dropped as soon as the table grows past the minimum, so large tables hold no spare memory. */
static _Atomic(gen_t *) g_spare;

static size_t gen_bytes(uint64_t cap) { return sizeof(gen_t) + cap * (sizeof(slot_t) + sizeof(uint64_t)); }


static void unmap_now(gen_t *g) {
  size_t bytes = g->bytes;
  munmap(g, bytes);
  gr_table_count_bytes(-(ptrdiff_t)bytes);
}

static void unmap_gen(void *p, size_t bytes) {
  gen_t *g = p;
  (void)bytes;
  gen_t *root = atomic_load_explicit(&g_root, memory_order_acquire);
  gen_t *expected = NULL;
  if (g->cap == MIN_CAP && root && root->cap == MIN_CAP &&
      atomic_compare_exchange_strong_explicit(&g_spare, &expected, g, memory_order_acq_rel, memory_order_relaxed))
    return;
  unmap_now(g);
}

/* Counts bytes mapped (negative: unmapped) for the table, its peak included. */
void gr_table_count_bytes(ptrdiff_t bytes) {
  size_t now = atomic_fetch_add_explicit(&g_bytes, (size_t)bytes, memory_order_relaxed) + (size_t)bytes;
  size_t pk = atomic_load_explicit(&g_bytes_peak, memory_order_relaxed);
  while (bytes > 0 && now > pk &&
         !atomic_compare_exchange_weak_explicit(&g_bytes_peak, &pk, now, memory_order_relaxed, memory_order_relaxed))
    ;
}

/* A generation of cap slots hashing with mult, its window starting now with `records` in it. */
static gen_t *new_gen(uint64_t cap, uint64_t mult, uint64_t records) {
  if (cap < MIN_CAP)
    cap = MIN_CAP;
  gen_t *spare = atomic_exchange_explicit(&g_spare, NULL, memory_order_acq_rel);
  gen_t *g = NULL;
  if (spare && cap == MIN_CAP) {
    g = spare;
    memset(g, 0, g->bytes); /* every slot EMPTY, counters 0 */
    g->bytes = gen_bytes(MIN_CAP);
  } else {
    if (spare)
      unmap_now(spare);
    size_t bytes = gen_bytes(cap);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return NULL;
    g = p; /* mmap gives zeroes: every slot EMPTY, counters 0 */
    g->bytes = bytes;
    gr_table_count_bytes((ptrdiff_t)bytes);
  }
  g->cap = cap;
  g->mult = mult;
  g->grow_at = cap * GROW_PERMILLE / 1000;
  g->seq = atomic_fetch_add_explicit(&g_gen_seq, 1, memory_order_relaxed) + 1;
  atomic_store_explicit(&g->win_start, atomic_load_explicit(&g_inserts, memory_order_relaxed), memory_order_relaxed);
  atomic_store_explicit(&g->win_peak, records, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_migrations, 1, memory_order_relaxed);
  return g;
}

/* The multiplier of a generation that follows g without doubling it ("Multiplicative hashing" above). */
static uint64_t next_mult(const gen_t *g) {
  size_t i = 0;
  while (i < NMULT && k_mult[i] != g->mult)
    i++;
  return k_mult[(i + 1) % NMULT];
}

static inline gen_t *load_root(void) { return atomic_load_explicit(&g_root, memory_order_seq_cst); }

int gr_table_init(void) {
  if (load_root())
    return 0;
  gen_t *g = new_gen(MIN_CAP, k_mult[0], 0);
  if (!g)
    return -ENOMEM;
  gen_t *expected = NULL;
  if (!atomic_compare_exchange_strong_explicit(&g_root, &expected, g, memory_order_seq_cst,
                                               memory_order_seq_cst)) {
    atomic_fetch_sub_explicit(&g_migrations, 1, memory_order_relaxed);
    unmap_now(g);
  }
  return 0;
}

/* ---- migration ---- */
static void finish_migration(gen_t *g);
static slot_t *chase(gen_t **g, slot_t *s, uint64_t *cp, uint32_t sg);

/* Reserves a slot in n for a PENDING copy of a record; returns its index (and its slot generation in *sg),
 * or n->cap when n is full or is itself being migrated (then this copy is not needed any more). */
static uint64_t reserve_copy(gen_t *n, unsigned ks, uint64_t key, uint64_t meta, unsigned st, uint64_t w1,
                             uint64_t w2, uint64_t w3, uint32_t *sg) {
  uint64_t i = home(n, hash_in(n, ks, key));
  for (uint64_t probes = 0; probes < n->cap; probes++, i = nexti(n, i)) {
    slot_t *s = &n->slots[i];
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    unsigned cst = ctl_state(c);
    if (c & F_MOVED)
      return n->cap;
    if ((c & F_PENDING) || (cst != GR_ST_EMPTY && cst != GR_ST_DELETED))
      continue;
    uint64_t busy = ctl_with(0, GR_ST_BUSY, ctl_sgen(c) + 1);
    if (!atomic_compare_exchange_strong_explicit(&s->ctl, &c, busy, memory_order_acq_rel,
                                                 memory_order_relaxed)) {
      if (c & F_MOVED)
        return n->cap;
      continue; /* taken meanwhile: probe on */
    }
    write_payload(n, s, key, w1, w2, w3, ctl_sgen(busy));
    note_disp(n, probes);
    uint64_t pending = ctl_with(meta, st, ctl_sgen(busy)) | F_PENDING;
    if (!atomic_compare_exchange_strong_explicit(&s->ctl, &busy, pending, memory_order_acq_rel,
                                                 memory_order_relaxed))
      return n->cap; /* frozen while busy: n's own migration has begun, so ours is over */
    *sg = ctl_sgen(busy);
    return i;
  }
  return n->cap;
}

static void cancel_copy(gen_t *n, uint64_t j) {
  slot_t *s = &n->slots[j];
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  if ((c & F_PENDING) && !(c & F_MOVED))
    atomic_compare_exchange_strong_explicit(&s->ctl, &c, ctl_with(0, GR_ST_DELETED, ctl_sgen(c)),
                                            memory_order_acq_rel, memory_order_relaxed);
}

static void count_done(gen_t *g, uint64_t k) {
  if (atomic_fetch_add_explicit(&g->done, k, memory_order_acq_rel) + k == g->cap)
    finish_migration(g);
}

/* Second half of moving a record: publish the copy, mark the source DONE. Idempotent. */
static void complete_fwd(gen_t *g, slot_t *s, uint64_t c) {
  gen_t *fg = g;
  uint64_t cc = c;
  (void)chase(&fg, s, &cc, fwd_src(c));
  if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, c | F_DONE, memory_order_acq_rel,
                                              memory_order_relaxed))
    count_done(g, 1);
}

/* Migrates slot i of g into n. Returns whether the slot is DONE: false only when n had no room for its copy.
 * *fenced tells whether this helper has already made every thread's stores visible since it saw g->next. */
static bool migrate_slot(gen_t *g, gen_t *n, uint64_t i, bool *fenced) {
  slot_t *s = &g->slots[i];
  for (;;) {
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (c & F_MOVED) {
      if ((c & F_FWD) && !(c & F_DONE))
        complete_fwd(g, s, c);
      return true;
    }
    unsigned st = ctl_state(c);
    if (!st_present(st) || (c & F_PENDING)) {
      if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, F_MOVED | F_DONE, memory_order_acq_rel,
                                                  memory_order_relaxed)) {
        count_done(g, 1);
        return true;
      }
      continue;
    }
    uint64_t w3 = atomic_load_explicit(&s->w3, memory_order_acquire);
    uint64_t key = atomic_load_explicit(&s->key, memory_order_acquire);
    uint64_t w1 = atomic_load_explicit(&s->w1, memory_order_acquire);
    uint64_t w2 = atomic_load_explicit(slot_w2(g, s), memory_order_acquire);
    if (atomic_load_explicit(&s->ctl, memory_order_acquire) != c)
      continue;
    if (!tag_ok(w3, c)) {
      /* An insert claimed the slot and has not written it yet, as far as this thread can see. Once every
       * thread's stores are visible (asymmetric barrier), a payload still unwritten belongs to an insert that
       * will see g->next afterwards: freeze the slot; that insert puts its record into n itself. */
      if (!*fenced) {
        gr_epoch_heavy_barrier();
        *fenced = true;
        continue;
      }
      if (atomic_compare_exchange_strong_explicit(&s->ctl, &c,
                                                  F_MOVED | F_DONE | F_INPROG | ((uint64_t)ctl_sgen(c) << FWD_SRC_SHIFT),
                                                  memory_order_acq_rel, memory_order_relaxed)) {
        count_done(g, 1);
        return true;
      }
      continue;
    }
    uint32_t occupant = ctl_sgen(c), dsg = 0;
    uint64_t j = reserve_copy(n, rec_ks(w1), key, c, st, w1, w2, w3, &dsg);
    if (j == n->cap)
      return false; /* n full, or migrating (then g is done already): left for a later sweep */
    slot_t *d = &n->slots[j];
    uint64_t fwd = fwd_ctl(occupant, dsg, j);
    for (;;) {
      if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, fwd, memory_order_acq_rel,
                                                  memory_order_acquire)) {
        complete_fwd(g, s, fwd);
        return true;
      }
      /* The source changed. Same occupant with a new state or scope: mirror it in the copy, which nobody
       * else can see or touch until the source points at it, and try again. Otherwise start over. */
      if ((c & (F_MOVED | F_PENDING)) || !st_present(ctl_state(c)) || ctl_sgen(c) != occupant)
        break;
      uint64_t dc = atomic_load_explicit(&d->ctl, memory_order_acquire);
      if (!(dc & F_PENDING) || (dc & F_MOVED) ||
          !atomic_compare_exchange_strong_explicit(&d->ctl, &dc, ctl_with(c, ctl_state(c), dsg) | F_PENDING,
                                                   memory_order_acq_rel, memory_order_relaxed))
        break;
    }
    cancel_copy(n, j);
  }
}

/* Claims chunks until none are left. */
static void help_migrate(gen_t *g) {
  gen_t *n = atomic_load_explicit(&g->next, memory_order_acquire);
  bool fenced = false;
  for (;;) {
    uint64_t start = atomic_fetch_add_explicit(&g->cursor, CHUNK, memory_order_relaxed);
    if (start >= g->cap)
      return;
    uint64_t end = start + CHUNK < g->cap ? start + CHUNK : g->cap;
    for (uint64_t i = start; i < end; i++)
      migrate_slot(g, n, i, &fenced);
  }
}

static void move_root(gen_t *g);

/* Makes sure g's migration is complete: helps with chunks, then sweeps for slots a stalled helper left. A
 * sweep that found every slot DONE finishes the migration itself: the done counter may still lag, held by a
 * thread preempted between marking a slot DONE and counting it, and nobody may have to wait for that thread
 * (inserts meanwhile fill the next generation, and could find no room at all). */
static void complete_migration(gen_t *g) {
  help_migrate(g);
  if (atomic_load_explicit(&g->done, memory_order_acquire) == g->cap) {
    finish_migration(g);
    return;
  }
  gen_t *n = atomic_load_explicit(&g->next, memory_order_acquire);
  bool all_done = true, fenced = false;
  for (uint64_t i = 0; i < g->cap; i++)
    all_done &= migrate_slot(g, n, i, &fenced);
  if (all_done)
    move_root(g);
}

static void finish_migration(gen_t *g) {
  if (atomic_load_explicit(&g->done, memory_order_acquire) == g->cap)
    move_root(g);
}

/* Every slot of g is DONE: its successor becomes the root (once, whoever sees it first), and g is retired. */
static void move_root(gen_t *g) {
  gen_t *n = atomic_load_explicit(&g->next, memory_order_acquire);
  gen_t *expected = g;
  if (atomic_compare_exchange_strong_explicit(&g_root, &expected, n, memory_order_seq_cst,
                                              memory_order_seq_cst)) {
    gr_epoch_retire(g, g->bytes, unmap_gen);
    t_ops |= 63; /* this thread's next maybe_reclaim() tries to free g at once: two generations of memory
                  * would otherwise stay mapped for up to 64 more operations */
  }
}

/* ---- sizing ---- */

/* Slots for `records` records at a load of permille/1000, with headroom for the inserts made while the migration
 * runs. */
static uint64_t cap_for(uint64_t records, unsigned permille) {
  uint64_t cap = (records + records / 32 + 32) * 1000 / permille + 1;
  return cap < MIN_CAP ? MIN_CAP : cap;
}


/* Records a generation must carry: those in the table (tombstones, claimed and released records included: the
 * per-thread counts count every record until it is DELETED) and those in the threads' young logs, which the
 * next drain moves into it. */
static uint64_t records_to_carry(void) {
  int64_t live = gr_epoch_live_sum();
  return (live > 0 ? (uint64_t)live : 0) + gr_young_total();
}

/* Starts a migration of g (the root) to a generation of cap slots hashing with mult, unless one runs; returns
 * after helping: false when no memory could be mapped for it (then the table keeps working at a higher load), or
 * when a generation no larger than g would not have room for what g holds now (then g goes on as it is). */
static bool start_migration(gen_t *g, uint64_t cap, uint64_t mult, uint64_t records) {
  gen_t *n = atomic_load_explicit(&g->next, memory_order_acquire);
  if (!n) {
    gen_t *fresh = new_gen(cap, mult, records);
    if (!fresh)
      return false;
    /* The next generation must take every record g holds, or g's migration can never finish (a full generation
     * is not migrated on while its predecessor still has records for it). A generation no larger than g was
     * sized from a count taken before it was mapped: records inserted into g meanwhile (or while the counting
     * thread was preempted: a drain moves thousands at once) are not in it. Counted again, they must leave it
     * short of its growth load, the inserts of the migration still to come; else g, which holds them all, stays
     * (a settle tries again after the next window). A larger generation has room for all of g's slots. */
    if (fresh->cap <= g->cap && records_to_carry() >= fresh->grow_at) {
      atomic_fetch_sub_explicit(&g_migrations, 1, memory_order_relaxed);
      unmap_now(fresh);
      return false;
    }
    gen_t *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(&g->next, &expected, fresh, memory_order_acq_rel,
                                                 memory_order_acquire)) {
      atomic_fetch_sub_explicit(&g_migrations, 1, memory_order_relaxed);
      unmap_now(fresh);
    } else {
#ifdef MADV_POPULATE_WRITE
      /* Its pages faulted in by one call, for less than a fault each costs (a table growing to a million records:
       * 170 ns per insert, against 235): after it is linked, so that inserts move on to it at once (mapped
       * populated, a generation took long enough to map for eight inserting threads to fill the old one), and
       * by the one thread whose generation won (threads racing to grow each map one; the others unmap theirs).
       * A kernel without it (before 5.14) refuses, and the pages fault in as they are written. */
      (void)madvise(fresh, fresh->bytes, MADV_POPULATE_WRITE);
#endif
    }
  }
  help_migrate(g);
  return true;
}

/* Makes t (root or root's successor) the root, finishing the migration into it first. False when the table has
 * moved on past t meanwhile (then t needs nothing any more), or when the migration into t cannot finish (*stuck):
 * t is full and its predecessor still holds records for it, until frees make room. */
static bool own_root(gen_t *t, bool *stuck) {
  *stuck = false;
  gen_t *root = load_root();
  if (root == t)
    return true;
  if (atomic_load_explicit(&root->next, memory_order_acquire) != t)
    return false; /* already moved on */
  complete_migration(root);
  gen_t *now = load_root();
  *stuck = now == root;
  return now == t;
}

/* Grows t, which is full or past its growth load: twice as many slots, the same multiplier. False when no memory
 * could be mapped for them, or when t is its predecessor's full successor and that migration cannot finish. */
static bool need_migration(gen_t *t) {
  bool stuck;
  if (!own_root(t, &stuck))
    return !stuck; /* the table moved on past t; or, stuck, no room can be had for now: as when none can be mapped
                    * (an insert that tried again for ever would never return, a drain that met it held every
                    * other drain) */
  uint64_t records = records_to_carry(), cap = cap_for(records, GROWN_PERMILLE);
  return start_migration(t, cap > 2 * t->cap ? cap : 2 * t->cap, t->mult, records);
}

/* Replaces t by a generation sized for `records` at SETTLE_PERMILLE, hashing with the next multiplier. */
static void settle_gen(gen_t *t, uint64_t records) {
  bool stuck;
  if (own_root(t, &stuck))
    start_migration(t, cap_for(records, SETTLE_PERMILLE), next_mult(t), records);
}

static inline void note_peak(gen_t *g, uint64_t records) {
  uint64_t p = atomic_load_explicit(&g->win_peak, memory_order_relaxed);
  while (records > p &&
         !atomic_compare_exchange_weak_explicit(&g->win_peak, &p, records, memory_order_relaxed, memory_order_relaxed))
    ;
}

/* The size check, every 32nd insert of a thread into the table (counted: 32), after an insert that probed
 * LONG_PROBE slots (counted: 0) and every YOUNG_PERIOD-th young insert of a thread (counted: YOUNG_PERIOD).
 * Growth: a generation past its growth load is replaced by one twice as large. The load comes from epoch.c's
 * approximate count (one load); a long probe, the sign of a full table, sums the exact per-thread counts. (A long
 * probe alone is no reason to rebuild: records of one key, left by frees that took a route gpureclaim does not
 * see, cluster again in any generation.) Otherwise the count is noted as a candidate for the window's peak, and
 * a window that is over (as many inserts as the generation has slots since it began) either settles the
 * generation or begins the next window. */
static void check_size(gen_t *t, uint64_t probes, uint64_t counted) {
  if (counted)
    atomic_fetch_add_explicit(&g_inserts, counted, memory_order_relaxed);
  if (atomic_load_explicit(&t->next, memory_order_acquire))
    return;
  /* The approximation can read high for good (a thread that freed more than it allocated keeps a negative
   * batch): growth always confirms with the exact sum, or it would rebuild a generation of the same size
   * over and over. */
  int64_t approx = gr_epoch_live_approx();
  uint64_t la = approx > 0 ? (uint64_t)approx : 0;
  if ((probes >= LONG_PROBE || la + 1 >= t->grow_at) && (uint64_t)gr_epoch_live_sum() + 1 >= t->grow_at) {
    need_migration(t);
    return;
  }
  note_peak(t, la);
  uint64_t now = atomic_load_explicit(&g_inserts, memory_order_relaxed);
  uint64_t start = atomic_load_explicit(&t->win_start, memory_order_relaxed);
  if (now - start < t->cap ||
      !atomic_compare_exchange_strong_explicit(&t->win_start, &start, now, memory_order_relaxed,
                                               memory_order_relaxed))
    return; /* the window goes on, or another thread ends it */
  uint64_t records = records_to_carry(), peak = atomic_load_explicit(&t->win_peak, memory_order_relaxed);
  peak = peak > records ? peak : records;
  /* Settled when the window's peak had more than SETTLE_BYTES per record; only for a gain of an eighth at
   * least (a table at its minimum size, or one barely past the bound, is left alone). */
  if (t->bytes > (uint64_t)SETTLE_BYTES * peak && gen_bytes(cap_for(peak, SETTLE_PERMILLE)) <= t->bytes / 8 * 7)
    settle_gen(t, peak);
  else
    atomic_store_explicit(&t->win_peak, records, memory_order_relaxed); /* the next window starts from now */
}

/* Young inserts count towards the table's size windows (check_size), though their records are not in it: n of
 * them, from young.c. */
GR_TABLE_COLD void gr_table_young_inserts(unsigned n) {
  gr_epoch_enter();
  gen_t *g = load_root();
  if (g)
    check_size(g, 0, n);
  gr_epoch_exit();
}

/* ---- probing ---- */

/* From slot s of generation *g, whose ctl is *cp, follows forwards to the slot that holds the record that had
 * slot generation sg at s, publishing confirmed copies on the way. Returns NULL when that record is gone;
 * else the slot, with *g and *cp its generation and ctl. */
static slot_t *chase(gen_t **g, slot_t *s, uint64_t *cp, uint32_t sg) {
  uint64_t c = *cp;
  for (;;) {
    if (!(c & F_MOVED)) {
      if (ctl_sgen(c) != sg)
        return NULL;
      *cp = c;
      return s;
    }
    if (!(c & F_FWD) || fwd_src(c) != sg)
      return NULL;
    gen_t *n = atomic_load_explicit(&(*g)->next, memory_order_acquire);
    s = &n->slots[fwd_idx(c)];
    sg = fwd_dst(c);
    *g = n;
    c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    /* A confirmed copy changes only by being published, so this ends. */
    while ((c & F_PENDING) && !(c & F_MOVED) && ctl_sgen(c) == sg &&
           !atomic_compare_exchange_weak_explicit(&s->ctl, &c, c & ~F_PENDING, memory_order_acq_rel,
                                                  memory_order_acquire))
      ;
    if ((c & F_PENDING) && !(c & F_MOVED) && ctl_sgen(c) == sg)
      c &= ~F_PENDING;
  }
}

typedef enum { FIND_OK, FIND_NONE } find_t;

/* Finds the first record with (ks, key) and state in mask, starting at generation g. On success gp, ip
 * name its slot, and cp and rec its consistent contents. */
static find_t find(gen_t *g, unsigned ks, uint64_t key, unsigned mask, gen_t **gp, uint64_t *ip, uint64_t *cp,
                   gr_rec_t *rec) {
  for (; g; g = atomic_load_explicit(&g->next, memory_order_acquire)) {
    uint64_t i = home(g, hash_in(g, ks, key)), len = probe_len(g);
    for (uint64_t probes = 0; probes < len; probes++, i = nexti(g, i)) {
      slot_t *s = &g->slots[i];
      uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    again:
      if (c & F_MOVED) {
        if (!(c & F_FWD))
          continue;
        /* The source's payload stays intact after the freeze. */
        if (atomic_load_explicit(&s->key, memory_order_acquire) != key ||
            rec_ks(atomic_load_explicit(&s->w1, memory_order_acquire)) != ks)
          continue;
        gen_t *fg = g;
        uint64_t dc = c;
        slot_t *d = chase(&fg, s, &dc, fwd_src(c));
        if (!d || (dc & F_PENDING) || !((mask >> ctl_state(dc)) & 1))
          continue;
        int rd = read_slot(fg, d, dc, rec, NULL);
        if (rd == READ_UNWRITTEN)
          continue;
        if (rd == READ_CHANGED) {
          c = atomic_load_explicit(&s->ctl, memory_order_acquire);
          goto again;
        }
        *gp = fg;
        *ip = (uint64_t)(d - fg->slots);
        *cp = dc;
        return FIND_OK;
      }
      unsigned st = ctl_state(c);
      /* Free slots do not end the run (a delete frees its slot for good): the probe bound does. */
      if ((c & F_PENDING) || !((mask >> st) & 1) || atomic_load_explicit(&s->key, memory_order_acquire) != key)
        continue;
      uint64_t w1;
      int rd = read_slot(g, s, c, rec, &w1);
      if (rd == READ_UNWRITTEN)
        continue; /* an insert still writing: not there yet */
      if (rd == READ_CHANGED) {
        c = atomic_load_explicit(&s->ctl, memory_order_acquire);
        goto again;
      }
      if (rec->key != key || rec_ks(w1) != ks)
        continue;
      *gp = g;
      *ip = i;
      *cp = c;
      return FIND_OK;
    }
  }
  return FIND_NONE;
}

static inline void maybe_reclaim(void) {
  if (__builtin_expect((++t_ops & 63) == 0, 0) && gr_epoch_pending())
    gr_epoch_reclaim();
}

/* ---- public operations ---- */

/* An insert that published its record at slot i of t (slot generation sg) with one CAS and then saw that a
 * migration of t has begun: makes sure the record reaches t->next. Returns false when a helper froze the
 * slot before it could see the record (F_INPROG): the caller then inserts it again. */
static bool settle(gen_t *t, uint64_t i, uint32_t sg) {
  gen_t *n = atomic_load_explicit(&t->next, memory_order_acquire);
  slot_t *s = &t->slots[i];
  for (;;) {
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (c & F_MOVED)
      return !((c & F_INPROG) && fwd_src(c) == (sg & SGEN_MASK));
    if (ctl_sgen(c) != (sg & SGEN_MASK))
      return true; /* the record already left (a free raced with its insert) */
    /* Move it now, while this thread knows it is written: a helper that looked before the payload was
     * visible to it would freeze the slot as unwritten. */
    bool fenced = false; /* its own record is written as far as this thread sees; any other needs the barrier */
    if (!migrate_slot(t, n, i, &fenced))
      return true; /* no room in n yet: a later sweep moves it, and sees it written */
  }
}

int gr_table_insert(const gr_rec_t *r) {
  gr_packed_t p;
  gr_pk_pack(r, &p);
  return gr_table_insert_pk(&p);
}

GR_HOT_INLINE int gr_table_insert_pk(const gr_packed_t *r) {
  return gr_table_insert_ks(r, gr_kind_keyspace(gr_pk_kind(r)));
}

GR_HOT_INLINE int gr_table_insert_ks(const gr_packed_t *r, unsigned ks) {
  uint64_t w1 = r->w1, w3 = r->w3, meta = r->ctl;
  unsigned state = gr_pk_state(r);
  GR_ASSERT(state == GR_ST_LIVE || state == GR_ST_ORPHAN); /* a record enters the table owned */
  int rc = 0;
  unsigned full_rounds = 0;
  /* With asymmetric barriers (epoch.c) a record is claimed and published by one CAS; without, by two. */
  bool one_cas = atomic_load_explicit(&gr_epoch_asym, memory_order_relaxed) != 0;
  /* The load check runs on every 32nd insert of a thread (its insert count, epoch.c). */
  gr_thread_rec_t *me = gr_epoch_t_rec;
  uint64_t nth = GR_TABLE_UNLIKELY(!me) ? 1 : atomic_load_explicit(&me->ins, memory_order_relaxed) + 1;
  gr_epoch_enter();
  for (;;) {
    gen_t *g = load_root();
    if (!g) {
      rc = -ENOMEM;
      break;
    }
    gen_t *t = atomic_load_explicit(&g->next, memory_order_acquire);
    if (t)
      help_migrate(g);
    else
      t = g;
    uint64_t i = home(t, hash_in(t, ks, r->key));
    bool restart = false, placed = false;
    for (uint64_t probes = 0; probes < t->cap; probes++, i = nexti(t, i)) {
      slot_t *s = &t->slots[i];
      uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
      if (c & F_MOVED) {
        restart = true; /* t is being migrated: the root has moved on */
        break;
      }
      unsigned st = ctl_state(c);
      if ((c & F_PENDING) || (st != GR_ST_EMPTY && st != GR_ST_DELETED))
        continue;
      uint32_t sg = ctl_sgen(c) + 1;
      uint64_t live = ctl_with(meta, state, sg);
      uint64_t claim = one_cas ? live : ctl_with(0, GR_ST_BUSY, sg);
      if (!atomic_compare_exchange_strong_explicit(&s->ctl, &c, claim, memory_order_acq_rel,
                                                   memory_order_relaxed)) {
        if (c & F_MOVED) {
          restart = true;
          break;
        }
        continue;
      }
      note_disp(t, probes);
      write_payload(t, s, r->key, w1, r->w2, w3, sg);
      if (one_cas) {
        /* Published once w3 is visible. A migration that began meanwhile may have looked at the slot too
         * early; epoch.c's barrier in migrate_slot() makes this load see t->next if so. */
        atomic_signal_fence(memory_order_seq_cst);
        if (GR_TABLE_UNLIKELY(atomic_load_explicit(&t->next, memory_order_acquire) != NULL) && !settle(t, i, sg)) {
          restart = true; /* frozen unwritten: insert into the next generation */
          break;
        }
      } else if (!atomic_compare_exchange_strong_explicit(&s->ctl, &claim, live, memory_order_acq_rel,
                                                          memory_order_relaxed)) {
        restart = true; /* frozen while busy: the migration left it to us; insert into the next one */
        break;
      }
      placed = true;
      if (GR_TABLE_UNLIKELY(probes >= LONG_PROBE) || GR_TABLE_UNLIKELY((nth & 31) == 0))
        check_size(t, probes, (nth & 31) == 0 ? 32 : 0);
      break;
    }
    if (placed)
      break;
    /* A full generation: grow it, then retry. Only a generation that could not be mapped counts towards giving
     * up: another thread may be making the next one (and its inserts filled this one meanwhile). */
    if (!restart && !need_migration(t) && ++full_rounds > 3) {
      rc = -ENOMEM; /* full, and no memory could be mapped for a larger generation */
      break;
    }
  }
  gr_epoch_exit();
  /* Every 32nd insert of a thread: reclamation. */
  if (rc == 0 && GR_TABLE_UNLIKELY((gr_epoch_count_ins() & 31) == 0) && gr_epoch_pending())
    gr_epoch_reclaim();
  return rc;
}

int gr_table_update(unsigned ks, uint64_t key, unsigned state_mask, gr_edit_fn fn, void *arg, gr_rec_t *before) {
  int rc = -ENOENT;
  gr_epoch_enter();
  gen_t *root = load_root();
  if (root && atomic_load_explicit(&root->next, memory_order_acquire))
    help_migrate(root);
  for (;;) {
    gen_t *g;
    uint64_t i, c;
    gr_rec_t cur;
    if (!root || find(load_root(), ks, key, state_mask, &g, &i, &c, &cur) != FIND_OK)
      break;
    gr_rec_t want = cur;
    if (!fn(&want, arg))
      break;
    GR_ASSERT(legal_move(cur.state, want.state));
    uint64_t nc = ctl_with(meta_of(&want), want.state, ctl_sgen(c)) | (c & F_PENDING);
    slot_t *s = &g->slots[i];
    if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, nc, memory_order_acq_rel, memory_order_relaxed)) {
      if (before)
        *before = cur;
      if (want.state == GR_ST_DELETED && cur.state != GR_ST_DELETED)
        gr_epoch_count_live(-1);
      rc = 0;
      break;
    }
    /* Changed, moved or gone: look it up again. */
  }
  gr_epoch_exit();
  maybe_reclaim();
  return rc;
}

typedef struct {
  unsigned kinds;
} take_arg_t;

static bool edit_take(gr_rec_t *r, void *arg) {
  if (!((((take_arg_t *)arg)->kinds >> r->kind) & 1))
    return false;
  r->state = GR_ST_DELETED;
  return true;
}

/* The take of every free: one probe run of the root generation, a record unpacked only once it is taken.
 * Anything unusual (a migration under way, a frozen slot) goes to the general update(). It reads the slot
 * inline, as read_slot() does, on purpose: built on find() or read_slot() instead, a free cost 4 and 11 ns
 * more in bench_hooks. */
int gr_table_take_kind(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_rec_t *out) {
  gr_packed_t p;
  int rc = gr_table_take_kind_pk(ks, key, state_mask, kind_mask, out ? &p : NULL);
  if (rc == 0 && out)
    gr_pk_unpack(&p, out);
  return rc;
}

static int take_kind_pk(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_packed_t *out);

/* Whether a record sought by (ks, state_mask) may be in a log of young records. */
static inline bool may_be_young(unsigned ks, unsigned state_mask) {
  return ks == GR_KS_ADDR && !(state_mask & GR_NOT_YOUNG) &&
         (state_mask & (GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN)));
}

GR_HOT_INLINE int gr_table_take_kind_pk(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_packed_t *out) {
  bool young = may_be_young(ks, state_mask);
  if (young && young_find(key, state_mask, kind_mask, true, out) == 0)
    return 0;
  int rc = take_kind_pk(ks, key, state_mask, kind_mask, out);
  if (GR_TABLE_UNLIKELY(rc != 0) && young) {
    /* Young in another thread's log, or in the own one while a drainer held it: once the drain returns, it is
     * in the table (moved by this drain or by the one that held the log). */
    gr_young_drain(true);
    rc = take_kind_pk(ks, key, state_mask, kind_mask, out);
  }
  return rc;
}

static GR_HOT_INLINE int take_kind_pk(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_packed_t *out) {
  int rc = -ENOENT;
  gr_epoch_enter();
  gen_t *g = load_root();
  if (GR_TABLE_UNLIKELY(!g)) {
    gr_epoch_exit();
    return -ENOENT;
  }
  if (GR_TABLE_UNLIKELY(atomic_load_explicit(&g->next, memory_order_acquire) != NULL))
    goto general;
  uint64_t i = home(g, hash_in(g, ks, key)), len = probe_len(g);
  for (uint64_t probes = 0; probes < len; probes++, i = nexti(g, i)) {
    slot_t *s = &g->slots[i];
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  again:
    if (GR_TABLE_UNLIKELY(c & F_MOVED))
      goto general;
    if ((c & F_PENDING) || !((state_mask >> ctl_state(c)) & 1) ||
        atomic_load_explicit(&s->key, memory_order_acquire) != key)
      continue;
    uint64_t w3 = atomic_load_explicit(&s->w3, memory_order_acquire); /* written last: see read_slot() */
    uint64_t k2 = atomic_load_explicit(&s->key, memory_order_acquire);
    uint64_t w1 = atomic_load_explicit(&s->w1, memory_order_acquire);
    uint64_t w2 = atomic_load_explicit(slot_w2(g, s), memory_order_acquire);
    if (atomic_load_explicit(&s->ctl, memory_order_acquire) != c) {
      c = atomic_load_explicit(&s->ctl, memory_order_acquire);
      goto again; /* changed while read */
    }
    if (!tag_ok(w3, c) || k2 != key || rec_ks(w1) != ks)
      continue; /* still being written (not there yet), or another key */
    GR_ASSERT(st_present(ctl_state(c))); /* a take finds a present record, never a free slot */
    if (!((kind_mask >> ((w1 >> 48) & 0xf)) & 1))
      break; /* the first match is of another kind: declined, as update() with edit_take declines */
    /* The CAS names the occupant (slot generation) whose payload was read. */
    if (!atomic_compare_exchange_strong_explicit(&s->ctl, &c, ctl_with(c, GR_ST_DELETED, ctl_sgen(c)),
                                                 memory_order_acq_rel, memory_order_acquire))
      goto again;
    if (out)
      *out = (gr_packed_t){c, key, w1, w2, w3};
    rc = 0;
    break;
  }
  gr_epoch_exit();
  /* Every 32nd delete of a thread (its count, epoch.c): reclamation. (No size check: a delete never calls for
   * a migration; the window that lets a generation settle is counted in inserts.) */
  if (rc == 0 && GR_TABLE_UNLIKELY((gr_epoch_count_del() & 31) == 0) && gr_epoch_pending())
    gr_epoch_reclaim();
  return rc;
general:
  gr_epoch_exit();
  take_arg_t t = {kind_mask};
  gr_rec_t r;
  rc = gr_table_update(ks, key, state_mask, edit_take, &t, out ? &r : NULL);
  if (rc == 0 && out)
    gr_pk_pack(&r, out);
  return rc;
}

int gr_table_take(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out) {
  return gr_table_take_kind(ks, key, state_mask, ~0u, out);
}

static int lookup(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out);

int gr_table_lookup(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out) {
  bool young = may_be_young(ks, state_mask);
  if (young) {
    gr_packed_t p;
    if (young_find(key, state_mask, ~0u, false, &p) == 0) {
      if (out)
        gr_pk_unpack(&p, out);
      return 0;
    }
  }
  int rc = lookup(ks, key, state_mask, out);
  if (rc != 0 && young) {
    gr_young_drain(true); /* as a take that found nothing */
    rc = lookup(ks, key, state_mask, out);
  }
  return rc;
}

static int lookup(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out) {
  gr_epoch_enter();
  gen_t *g;
  uint64_t i, c;
  gr_rec_t tmp;
  gen_t *root = load_root();
  int rc = root && find(root, ks, key, state_mask, &g, &i, &c, out ? out : &tmp) == FIND_OK ? 0 : -ENOENT;
  gr_epoch_exit();
  return rc;
}

/* Resolves ref to the slot holding its record now. */
static slot_t *resolve(gr_ref_t *ref, uint64_t *cp) {
  gen_t *g = ref->gen;
  slot_t *s = &g->slots[ref->idx];
  uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
  s = chase(&g, s, &c, ref->slotgen);
  if (!s)
    return NULL;
  ref->gen = g;
  ref->idx = (uint64_t)(s - g->slots);
  ref->slotgen = ctl_sgen(c);
  *cp = c;
  return s;
}

int gr_table_cas(gr_ref_t *ref, gr_rec_t *expect, const gr_rec_t *desired) {
  for (;;) {
    uint64_t c;
    slot_t *s = resolve(ref, &c);
    if (!s || !st_present(ctl_state(c)))
      return -ENOENT;
    gr_rec_t cur;
    int rd = read_slot(ref->gen, s, c, &cur, NULL);
    if (rd == READ_CHANGED)
      continue;
    if (rd == READ_UNWRITTEN)
      return -ENOENT;
    if (cur.key != expect->key || cur.kind != expect->kind)
      return -ENOENT;
    if (cur.state != expect->state || cur.scope != expect->scope || cur.aux != expect->aux ||
        (c & F_PENDING)) {
      if (c & F_PENDING)
        continue; /* not confirmed yet: look again */
      *expect = cur;
      return -EAGAIN;
    }
    gr_rec_t want = cur;
    want.state = desired->state;
    want.scope = desired->scope;
    want.aux = desired->aux;
    GR_ASSERT(legal_move(cur.state, want.state));
    uint64_t nc = ctl_with(meta_of(&want), want.state, ctl_sgen(c));
    if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, nc, memory_order_acq_rel, memory_order_relaxed)) {
      if (want.state == GR_ST_DELETED)
        gr_epoch_count_live(-1);
      return 0;
    }
  }
}

int gr_table_visit(gr_visit_fn fn, void *arg) { return gr_table_visit_from(NULL, fn, arg); }

int gr_table_visit_from(gr_visit_pos_t *pos, gr_visit_fn fn, void *arg) {
  int rc = 0;
  /* Every record whose insert returned before now is in the table, not in a log (the barrier first: a log's
   * count written before the visit began is then seen). */
  gr_epoch_heavy_barrier();
  gr_table_drain();
  gr_epoch_enter();
  gen_t *g = load_root();
  if (g && atomic_load_explicit(&g->next, memory_order_acquire)) {
    complete_migration(g);
    g = load_root();
  }
  uint64_t i = pos && g && pos->seq == g->seq ? pos->idx : 0;
  for (; g && i < g->cap; i++) {
    slot_t *s = &g->slots[i];
    gen_t *sg = g;
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if ((c & F_MOVED) && (c & F_FWD) && !(s = chase(&sg, s, &c, fwd_src(c))))
      continue; /* moved on, then left */
    if ((c & (F_MOVED | F_PENDING)) || !st_present(ctl_state(c)))
      continue;
    gr_rec_t r;
    int rd = read_slot(sg, s, c, &r, NULL);
    if (rd == READ_UNWRITTEN)
      continue; /* added meanwhile */
    if (rd == READ_CHANGED) {
      i--; /* changed while read: look again */
      continue;
    }
    gr_ref_t ref = {.gen = sg, .idx = (uint64_t)(s - sg->slots), .slotgen = ctl_sgen(c)};
    if ((rc = fn(&ref, &r, arg)) != 0)
      break; /* a resumed visit begins with this record */
  }
  if (pos && g)
    *pos = (gr_visit_pos_t){.seq = g->seq, .idx = i};
  gr_epoch_exit();
  maybe_reclaim();
  return rc;
}

size_t gr_table_bytes(void) { return atomic_load_explicit(&g_bytes, memory_order_relaxed); }

size_t gr_table_bytes_peak(bool reset) {
  if (!reset)
    return atomic_load_explicit(&g_bytes_peak, memory_order_relaxed);
  return atomic_exchange_explicit(&g_bytes_peak, atomic_load_explicit(&g_bytes, memory_order_relaxed),
                                  memory_order_relaxed);
}

uint64_t gr_table_capacity(void) {
  gr_epoch_enter();
  gen_t *g = load_root();
  uint64_t cap = g ? g->cap : 0;
  gr_epoch_exit();
  return cap;
}

uint64_t gr_table_migrations(void) { return atomic_load_explicit(&g_migrations, memory_order_relaxed); }

uint64_t gr_table_probe_bound(void) {
  gr_epoch_enter();
  gen_t *g = load_root();
  uint64_t n = g ? probe_len(g) : 0;
  gr_epoch_exit();
  return n;
}

void gr_table_compact(void) {
  gr_epoch_enter();
  gen_t *g = load_root();
  if (g) {
    if (atomic_load_explicit(&g->next, memory_order_acquire))
      complete_migration(g);
    g = load_root();
    uint64_t records = records_to_carry();
    if (start_migration(g, cap_for(records, SETTLE_PERMILLE), next_mult(g), records))
      complete_migration(g); /* (no memory for it: the table stays as it is) */
  }
  gr_epoch_exit();
  gr_epoch_reclaim();
}

int gr_table_check(void) {
  gen_t *g = load_root();
  if (!g)
    return 0;
  if (atomic_load_explicit(&g->next, memory_order_acquire))
    return -__LINE__; /* quiescent tables have no migration in progress */
  uint64_t present = 0, max_disp = atomic_load_explicit(&g->max_disp, memory_order_relaxed);
  for (uint64_t i = 0; i < g->cap; i++) {
    slot_t *s = &g->slots[i];
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_relaxed);
    if (c & (F_MOVED | F_PENDING))
      return -__LINE__; /* no migration runs, and a cancelled copy is left DELETED */
    unsigned st = ctl_state(c);
    if (st == GR_ST_BUSY)
      return -__LINE__;
    if (!st_present(st))
      continue;
    present++;
    gr_rec_t r;
    uint64_t w1;
    if (read_slot(g, s, c, &r, &w1) != READ_OK)
      return -__LINE__; /* quiescent: every record is written */
    /* I1: within the probe bound of its home slot. */
    uint64_t h = home(g, hash_in(g, rec_ks(w1), r.key));
    if ((i >= h ? i - h : i + g->cap - h) > max_disp)
      return -__LINE__;
  }
  /* I5: the per-thread counts add up to the records present. */
  if (present != (uint64_t)gr_epoch_live_sum())
    return -__LINE__;
  return 0;
}

void gr_table_atfork_child(void) {
  gr_young_atfork_child();
  /* Other threads are gone and cannot be inside the table: drop everything. */
  gen_t *g = load_root();
  atomic_store_explicit(&g_root, NULL, memory_order_seq_cst);
  while (g) {
    gen_t *n = atomic_load_explicit(&g->next, memory_order_relaxed);
    unmap_now(g);
    g = n;
  }
  gen_t *spare = atomic_exchange_explicit(&g_spare, NULL, memory_order_relaxed);
  if (spare)
    unmap_now(spare);
  atomic_store_explicit(&g_migrations, 0, memory_order_relaxed);
  /* Nothing is mapped again until the child initialises CUDA (gr_core_start_slow). */
}
