/* scope.h -- scopes: blocks tagged by the scope open on their thread (scope.c). Internal. */
#ifndef GR_SCOPE_H
#define GR_SCOPE_H

#include "state.h"
#include "table.h"

/* Scope slot (1..65535) of the calling thread's innermost open scope, 0 for none; takes a reference. Inline:
 * every allocation asks, and a thread with no open scope (the usual case) needs one load to answer. */
uint16_t gr_scope_tag_slow(void);
static inline uint16_t gr_scope_tag(void) { return GR_LIKELY(gr_tls.scope_depth == 0) ? 0 : gr_scope_tag_slow(); }
/* Lists record r, just inserted into the table with a scope, for that scope's end. */
void gr_scope_note(const gr_rec_t *r);
/* Drops the reference a record of scope slot s held. */
void gr_scope_unref(uint16_t slot);
uint64_t gr_scope_id(uint16_t slot);
void gr_scope_atfork_child(void);
/* A key a scope listed for its end: where one of its records may be. */
typedef struct gr_scope_key {
  uint64_t key;
  uint32_t ks; /* GR_KS_ADDR or GR_KS_HANDLE */
} gr_scope_key_t;
/* gpureclaim_scope_end (release.c) in two steps. end: the scope's live blocks become orphans (0, or -ENOENT when the
 * scope is not open); ended says which (slot, the keys it listed, or scan: every record of the slot in the
 * table) and how many. finish: gives back the keys and the scope's own reference, after a FREE_NOW release. */
typedef struct gr_scope_ended {
  uint16_t slot;
  gr_scope_key_t *keys;
  uint32_t n;
  bool scan;
  uint64_t orphans;
} gr_scope_ended_t;
int gr_scope_end(uint64_t scope, gr_scope_ended_t *ended);
void gr_scope_end_finish(gr_scope_ended_t *ended);

#endif /* GR_SCOPE_H */
