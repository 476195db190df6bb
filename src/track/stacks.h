/* stacks.h -- short backtraces per allocation, GPURECLAIM_BACKTRACE=1 (stacks.c). Internal. */
#ifndef GR_STACKS_H
#define GR_STACKS_H

#include "table.h"

#define GR_STACK_MAX 16
/* A record's site (gr_site_t, table.h) is a code address, or with backtraces on an interned stack: never read
 * its bits as either, ask these. */
static inline gr_site_t gr_site_at(uintptr_t pc) { return (gr_site_t){(uint64_t)pc}; }
static inline bool gr_site_same(gr_site_t a, gr_site_t b) { return a.bits == b.bits; }
/* With backtraces on, the interned stack of the calling allocation, whose first frame is pc; otherwise, or
 * when memory ran out, gr_site_at(pc). */
gr_site_t gr_stack_capture(uintptr_t pc);
/* The code address of the allocating call (0 for none). */
uintptr_t gr_site_pc(gr_site_t site);
/* The frames of a site, pc first (1 frame when it holds no stack). */
int gr_site_frames(gr_site_t site, uintptr_t *frames, int max);

#endif /* GR_STACKS_H */
