/* sim_util.c -- hash map, free-extent manager and predecessor bitmap used by the simulated driver. */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------------------------------------ map */

static inline size_t map_slot(uint64_t k, size_t mask) {
  /* Keys are 512-aligned addresses or pointers: mix the bits so low zero bits don't cluster slots. */
  k ^= k >> 31;
  k *= 0x9e3779b97f4a7c15ULL;
  k ^= k >> 29;
  return (size_t)k & mask;
}

void *simmap_get(const simmap_t *m, uint64_t key) {
  if (m->cap == 0) return NULL;
  size_t mask = m->cap - 1;
  for (size_t i = map_slot(key, mask);; i = (i + 1) & mask) {
    if (m->keys[i] == key) return m->vals[i];
    if (m->keys[i] == 0) return NULL;
  }
}

static int map_grow(simmap_t *m, size_t want) {
  size_t ncap = m->cap ? m->cap : 64;
  while (ncap / 2 < want) ncap *= 2;
  if (ncap == m->cap) return 0;
  uint64_t *nk = calloc(ncap, sizeof *nk);
  void **nv = calloc(ncap, sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return -1;
  }
  size_t mask = ncap - 1;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = map_slot(m->keys[i], mask);
    while (nk[j]) j = (j + 1) & mask;
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return 0;
}

int simmap_put(simmap_t *m, uint64_t key, void *val) {
  if ((m->n + 1) * 2 > m->cap && map_grow(m, m->n + 1) != 0) return -1;
  size_t mask = m->cap - 1;
  size_t i = map_slot(key, mask);
  while (m->keys[i] && m->keys[i] != key) i = (i + 1) & mask;
  if (!m->keys[i]) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return 0;
}

void *simmap_del(simmap_t *m, uint64_t key) {
  if (m->cap == 0) return NULL;
  size_t mask = m->cap - 1;
  size_t i = map_slot(key, mask);
  while (m->keys[i] != key) {
    if (!m->keys[i]) return NULL;
    i = (i + 1) & mask;
  }
  void *val = m->vals[i];
  /* Backward-shift deletion keeps probe chains intact without tombstones. */
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->keys[j]) break;
    size_t home = map_slot(m->keys[j], mask);
    /* Move j into the hole at i unless j's home lies cyclically in (i, j]. */
    int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    m->keys[i] = m->keys[j];
    m->vals[i] = m->vals[j];
    i = j;
  }
  m->keys[i] = 0;
  m->vals[i] = NULL;
  m->n--;
  return val;
}

void simmap_free(simmap_t *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* Ensures `extra` more inserts cannot fail, so multi-step updates never stop half-way. */
static int map_reserve(simmap_t *m, size_t extra) {
  if ((m->n + extra) * 2 > m->cap) return map_grow(m, m->n + extra);
  return 0;
}

/* ------------------------------------------------------------------------------------------ extents */

static inline int floor_log2(uint64_t v) { return 63 - __builtin_clzll(v); }

static void bin_unlink(simextmgr_t *m, simext_t *e) {
  if (e->prev) e->prev->next = e->next;
  else m->bins[e->bin] = e->next;
  if (e->next) e->next->prev = e->prev;
  if (!m->bins[e->bin]) m->nonempty &= ~(1ULL << e->bin);
  e->prev = e->next = NULL;
}

static void bin_link(simextmgr_t *m, simext_t *e) {
  e->bin = floor_log2(e->len);
  e->prev = NULL;
  e->next = m->bins[e->bin];
  if (e->next) e->next->prev = e;
  m->bins[e->bin] = e;
  m->nonempty |= 1ULL << e->bin;
}

static void rebin(simextmgr_t *m, simext_t *e) {
  if (floor_log2(e->len) == e->bin) return;
  bin_unlink(m, e);
  bin_link(m, e);
}

static int ext_reserve(simextmgr_t *m) {
  return map_reserve(&m->by_start, 1) || map_reserve(&m->by_end, 1) ? -1 : 0;
}

int simext_init(simextmgr_t *m, uint64_t start, uint64_t len) {
  memset(m, 0, sizeof *m);
  return simext_free(m, start, len);
}

/* Cuts [a, a+len) out of extent e, which contains it. Maps have room for one more entry each. */
static void carve(simextmgr_t *m, simext_t *e, uint64_t a, uint64_t len) {
  uint64_t end = e->start + e->len;
  uint64_t pre = a - e->start, post = end - (a + len);
  m->free_bytes -= len;
  if (pre == 0) {
    simmap_del(&m->by_start, e->start);
    if (post == 0) {
      simmap_del(&m->by_end, end);
      bin_unlink(m, e);
      free(e);
      return;
    }
    e->start = a + len;
    e->len = post;
    simmap_put(&m->by_start, e->start, e);
    rebin(m, e);
    return;
  }
  simmap_del(&m->by_end, end);
  e->len = pre;
  simmap_put(&m->by_end, a, e);
  rebin(m, e);
  if (post) {
    simext_t *t = calloc(1, sizeof *t);
    if (!t) return; /* the tail is lost to the window; never observed in practice */
    t->start = a + len;
    t->len = post;
    simmap_put(&m->by_start, t->start, t);
    simmap_put(&m->by_end, end, t);
    bin_link(m, t);
  }
}

uint64_t simext_alloc(simextmgr_t *m, uint64_t len, uint64_t align) {
  if (len == 0 || align == 0 || (align & (align - 1))) return 0;
  if (ext_reserve(m) != 0) return 0;
  uint64_t need = len + align - 1;
  if (need < len) return 0;
  int lo = floor_log2(len);
  int guaranteed = floor_log2(need) + ((need & (need - 1)) ? 1 : 0); /* every extent in these bins fits */
  for (int b = lo; b < guaranteed && b < 64; b++) {
    int scanned = 0;
    for (simext_t *e = m->bins[b]; e && scanned < 64; e = e->next, scanned++) {
      uint64_t a = (e->start + align - 1) & ~(align - 1);
      if (a >= e->start && a + len <= e->start + e->len) {
        carve(m, e, a, len);
        return a;
      }
    }
  }
  if (guaranteed >= 64) return 0;
  uint64_t mask = m->nonempty & (~0ULL << guaranteed);
  if (!mask) return 0;
  simext_t *e = m->bins[__builtin_ctzll(mask)];
  uint64_t a = (e->start + align - 1) & ~(align - 1);
  carve(m, e, a, len);
  return a;
}

int simext_alloc_at(simextmgr_t *m, uint64_t start, uint64_t len) {
  if (len == 0 || start + len < start) return -1;
  if (ext_reserve(m) != 0) return -1;
  for (int b = 0; b < 64; b++) {
    for (simext_t *e = m->bins[b]; e; e = e->next) {
      if (e->start <= start && start + len <= e->start + e->len) {
        carve(m, e, start, len);
        return 0;
      }
    }
  }
  return -1;
}

int simext_free(simextmgr_t *m, uint64_t start, uint64_t len) {
  if (len == 0) return 0;
  if (ext_reserve(m) != 0) return -1;
  simext_t *left = simmap_get(&m->by_end, start);
  simext_t *right = simmap_get(&m->by_start, start + len);
  m->free_bytes += len;
  if (left && right) {
    simmap_del(&m->by_start, right->start);
    simmap_del(&m->by_end, right->start + right->len);
    bin_unlink(m, right);
    simmap_del(&m->by_end, start);
    left->len += len + right->len;
    simmap_put(&m->by_end, left->start + left->len, left);
    free(right);
    rebin(m, left);
  } else if (left) {
    simmap_del(&m->by_end, start);
    left->len += len;
    simmap_put(&m->by_end, left->start + left->len, left);
    rebin(m, left);
  } else if (right) {
    simmap_del(&m->by_start, right->start);
    right->start = start;
    right->len += len;
    simmap_put(&m->by_start, start, right);
    rebin(m, right);
  } else {
    simext_t *e = calloc(1, sizeof *e);
    if (!e) {
      m->free_bytes -= len;
      return -1;
    }
    e->start = start;
    e->len = len;
    simmap_put(&m->by_start, start, e);
    simmap_put(&m->by_end, start + len, e);
    bin_link(m, e);
  }
  return 0;
}

/* -------------------------------------------------------------------------------------------- bits */

int simbits_init(simbits_t *b, uint64_t nbits) {
  memset(b, 0, sizeof *b);
  b->nbits = nbits;
  uint64_t n = nbits ? nbits : 1;
  int l = 0;
  size_t words;
  do {
    if (l == SIMBITS_MAXLVL) return -1;
    words = (size_t)((n + 63) / 64);
    void *p = mmap(NULL, words * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return -1;
    b->lvl[l] = p;
    b->words[l] = words;
    n = words;
    l++;
  } while (words > 1);
  b->nlvl = l;
  return 0;
}

void simbits_set(simbits_t *b, uint64_t i) {
  for (int l = 0; l < b->nlvl; l++) {
    uint64_t w = i >> 6, was = b->lvl[l][w];
    b->lvl[l][w] = was | (1ULL << (i & 63));
    if (was) return; /* the upper levels already know this word is non-empty */
    i = w;
  }
}

void simbits_clear(simbits_t *b, uint64_t i) {
  for (int l = 0; l < b->nlvl; l++) {
    uint64_t w = i >> 6;
    b->lvl[l][w] &= ~(1ULL << (i & 63));
    if (b->lvl[l][w]) return;
    i = w;
  }
}

static int64_t pred_at(const simbits_t *b, int l, uint64_t i) {
  if (l >= b->nlvl) return -1;
  uint64_t w = i >> 6;
  unsigned bit = (unsigned)(i & 63);
  uint64_t mask = bit == 63 ? ~0ULL : ((2ULL << bit) - 1);
  uint64_t word = b->lvl[l][w] & mask;
  if (word) return (int64_t)(w * 64 + (uint64_t)floor_log2(word));
  if (w == 0) return -1;
  int64_t j = pred_at(b, l + 1, w - 1); /* the nearest non-empty word below w */
  if (j < 0) return -1;
  return j * 64 + floor_log2(b->lvl[l][j]);
}

int64_t simbits_pred(const simbits_t *b, uint64_t i) {
  if (b->nlvl == 0) return -1;
  if (i >= b->nbits) i = b->nbits - 1;
  return pred_at(b, 0, i);
}
