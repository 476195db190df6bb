/*
 * record.h -- a block's record, as the table stores it (gr_packed_t) and as the slow paths read it (gr_rec_t):
 * states, key spaces, packing. The block table is table.h. Internal.
 */
#ifndef GR_RECORD_H
#define GR_RECORD_H

#include <stdbool.h>
#include <stdint.h>

/* Record states. A slot holds EMPTY until first used, DELETED after its record left. */
enum {
  GR_ST_EMPTY = 0,
  GR_ST_BUSY = 1,       /* an insert is writing it */
  GR_ST_LIVE = 2,       /* owned by the program */
  GR_ST_ORPHAN = 3,     /* its scope ended: a release may free it */
  GR_ST_RELEASED = 4,   /* VMM handle released by the program, memory kept by mappings */
  GR_ST_RECLAIMING = 5, /* a release claimed it and is freeing it */
  GR_ST_RECLAIMED = 6,  /* a release freed it; kept so a late free of the address can be recognised */
  GR_ST_DELETED = 7
};
/* aux of an address record whose context's destroy is in the driver (track.c). */
#define GR_AUX_DETACHING 1
#define GR_STMASK(s) (1u << (s))
/* In a state mask: the record sought cannot be young (a scoped block's, a stale one's): look in the table only,
 * never in a log of young records, and never drain them (gr_table_insert_young). */
#define GR_NOT_YOUNG (1u << 31)
#define GR_PRESENT_MASK                                                                                    \
  (GR_STMASK(GR_ST_LIVE) | GR_STMASK(GR_ST_ORPHAN) | GR_STMASK(GR_ST_RELEASED) |                          \
   GR_STMASK(GR_ST_RECLAIMING) | GR_STMASK(GR_ST_RECLAIMED))

/* Key spaces: addresses of the different kinds may coincide (a mapping starts where its reservation does). */
enum { GR_KS_ADDR = 0, GR_KS_HANDLE = 1, GR_KS_MAPPING = 2, GR_KS_VA = 3 };

#define GR_DEVICE_NONE 0x7f
#define GR_SIZE_MAX ((UINT64_C(1) << 48) - 1)

/* Where a block was allocated: the code address of the allocating call, or (GPURECLAIM_BACKTRACE=1) the id of an
 * interned stack whose first frame is that address (stacks.c). A struct, so that the compiler refuses to read
 * either meaning as the other: the code address comes from gr_site_pc(), the frames from gr_site_frames(). */
typedef struct gr_site {
  uint64_t bits;
} gr_site_t;

/* One record, unpacked. Packed into a 32-byte slot and its site word (40 bytes): see table.c. */
typedef struct gr_rec {
  uint64_t key;     /* address, or VMM handle */
  uint64_t size;    /* bytes, < 2^48 */
  gr_site_t site;   /* where it was allocated; none for mappings */
  uint64_t map_handle; /* mappings only: the VMM handle mapped (stored where other records keep their site) */
  uint64_t time_ms; /* CLOCK_MONOTONIC milliseconds, < 2^40 (34 years of uptime) */
  uint32_t tid;     /* < 2^22 */
  uint16_t ctx_id;  /* registry ids, < 4096; 0 = none */
  uint16_t pool_id;
  uint16_t scope;   /* scope slot, 0 = none */
  uint8_t aux;      /* VMM handles: number of mappings; address records: GR_AUX_DETACHING or 0 */
  uint8_t state;    /* GR_ST_* */
  uint8_t kind;     /* gpureclaim_kind_t */
  uint8_t device;   /* ordinal, GR_DEVICE_NONE for none */
  uint8_t api;      /* which call made it (hooks.h: GR_API_*) */
} gr_rec_t;

static inline unsigned gr_kind_keyspace(unsigned kind) {
  switch (kind) {
  case 5: return GR_KS_HANDLE;  /* GPURECLAIM_KIND_VMM */
  case 6: return GR_KS_MAPPING; /* GPURECLAIM_KIND_VMM_MAPPING */
  case 7: return GR_KS_VA;      /* GPURECLAIM_KIND_VA */
  default: return GR_KS_ADDR;
  }
}

/* One record as a slot holds it (table.c, "Data structure"): what a hook builds (gr_track_alloc), the table
 * stores as is, and a free takes out as is (gr_track_take_pk), without a gr_rec_t filled, packed and unpacked
 * on the way. gr_rec_t is the unpacked view of the slow paths (gr_pk_pack, gr_pk_unpack). */
typedef struct gr_packed {
  uint64_t ctl; /* state (3 bits) | metadata: ctx id (12) << 16 | pool id (12) << 28 | scope (16) << 40 | aux << 56 */
  uint64_t key;
  uint64_t w1;  /* size (48) | kind (4) << 48 | device (7) << 52 | api (5) << 59 */
  uint64_t w2;  /* the site, or for a mapping the VMM handle it maps */
  uint64_t w3;  /* time in ms (40) << 24 | tag (2, the table's) << 22 | thread id (22) */
} gr_packed_t;

#define GR_PK_CTX_SHIFT 16
#define GR_PK_POOL_SHIFT 28
#define GR_PK_SCOPE_SHIFT 40
#define GR_PK_AUX_SHIFT 56
#define GR_PK_TIME_SHIFT 24
#define GR_PK_TID_MASK UINT64_C(0x3fffff)

static inline uint64_t gr_pk_meta(unsigned ctx_id, unsigned pool_id, unsigned scope, unsigned aux) {
  return ((uint64_t)(ctx_id & 0xfff) << GR_PK_CTX_SHIFT) | ((uint64_t)(pool_id & 0xfff) << GR_PK_POOL_SHIFT) |
         ((uint64_t)(scope & 0xffff) << GR_PK_SCOPE_SHIFT) | ((uint64_t)(aux & 0xff) << GR_PK_AUX_SHIFT);
}
static inline uint64_t gr_pk_w1(uint64_t size, unsigned kind, unsigned device, unsigned api) {
  return (size & GR_SIZE_MAX) | ((uint64_t)(kind & 0xf) << 48) | ((uint64_t)(device & 0x7f) << 52) |
         ((uint64_t)(api & 0x1f) << 59);
}
static inline uint64_t gr_pk_w3(uint64_t time_ms, uint32_t tid) {
  return ((time_ms & ((UINT64_C(1) << 40) - 1)) << GR_PK_TIME_SHIFT) | (tid & GR_PK_TID_MASK);
}
/* Each field's width, as the masks above write it: a value that outgrows its field must fail the build, not
 * spill into its neighbour. (The ranges the fields must hold are asserted beside their limits:
 * registry.h, scope.c.) */
_Static_assert(GR_ST_DELETED < 8, "a state fits ctl's low 3 bits");
_Static_assert(GR_PK_CTX_SHIFT >= 3 && GR_PK_CTX_SHIFT + 12 <= GR_PK_POOL_SHIFT, "ctl: the 12-bit context id");
_Static_assert(GR_PK_POOL_SHIFT + 12 <= GR_PK_SCOPE_SHIFT, "ctl: the 12-bit pool id");
_Static_assert(GR_PK_SCOPE_SHIFT + 16 <= GR_PK_AUX_SHIFT, "ctl: the 16-bit scope slot");
_Static_assert(GR_PK_AUX_SHIFT + 8 <= 64, "ctl: the 8-bit aux");
_Static_assert(GR_SIZE_MAX == (UINT64_C(1) << 48) - 1, "w1: the size's 48 bits, then kind (4), device (7), api (5)");
_Static_assert(48 + 4 + 7 + 5 == 64 && GR_DEVICE_NONE <= 0x7f, "w1: the fields fill the word, none-device fits");
_Static_assert(GR_PK_TID_MASK == (UINT64_C(1) << 22) - 1 && GR_PK_TIME_SHIFT + 40 == 64,
               "w3: time (40), tag (2), tid (22)");

static inline unsigned gr_pk_state(const gr_packed_t *p) { return (unsigned)(p->ctl & 7); }
static inline unsigned gr_pk_ctx(const gr_packed_t *p) { return (unsigned)(p->ctl >> GR_PK_CTX_SHIFT) & 0xfff; }
static inline unsigned gr_pk_scope(const gr_packed_t *p) { return (unsigned)(p->ctl >> GR_PK_SCOPE_SHIFT) & 0xffff; }
static inline unsigned gr_pk_aux(const gr_packed_t *p) { return (unsigned)(p->ctl >> GR_PK_AUX_SHIFT) & 0xff; }
static inline uint64_t gr_pk_size(const gr_packed_t *p) { return p->w1 & GR_SIZE_MAX; }
static inline unsigned gr_pk_kind(const gr_packed_t *p) { return (unsigned)(p->w1 >> 48) & 0xf; }
static inline unsigned gr_pk_device(const gr_packed_t *p) { return (unsigned)(p->w1 >> 52) & 0x7f; }

static inline void gr_pk_pack(const gr_rec_t *r, gr_packed_t *p) {
  p->ctl = gr_pk_meta(r->ctx_id, r->pool_id, r->scope, r->aux) | (r->state & 7u);
  p->key = r->key;
  p->w1 = gr_pk_w1(r->size, r->kind, r->device, r->api);
  p->w2 = gr_kind_keyspace(r->kind) == GR_KS_MAPPING ? r->map_handle : r->site.bits;
  p->w3 = gr_pk_w3(r->time_ms, r->tid);
}

static inline void gr_pk_unpack(const gr_packed_t *p, gr_rec_t *r) {
  r->key = p->key;
  r->state = (uint8_t)gr_pk_state(p);
  r->ctx_id = (uint16_t)gr_pk_ctx(p);
  r->pool_id = (uint16_t)((p->ctl >> GR_PK_POOL_SHIFT) & 0xfff);
  r->scope = (uint16_t)gr_pk_scope(p);
  r->aux = (uint8_t)gr_pk_aux(p);
  r->size = gr_pk_size(p);
  r->kind = (uint8_t)gr_pk_kind(p);
  r->device = (uint8_t)gr_pk_device(p);
  r->api = (uint8_t)(p->w1 >> 59);
  bool mapping = gr_kind_keyspace(r->kind) == GR_KS_MAPPING;
  r->map_handle = mapping ? p->w2 : 0;
  r->site.bits = mapping ? 0 : p->w2;
  r->time_ms = p->w3 >> GR_PK_TIME_SHIFT;
  r->tid = (uint32_t)(p->w3 & GR_PK_TID_MASK);
}

#endif /* GR_RECORD_H */
