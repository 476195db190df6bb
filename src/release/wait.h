/* wait.h -- waiting for memory on a shared GPU (wait.c; GPURECLAIM_WAIT, GPURECLAIM_GUARANTEE). Internal. */
#ifndef GR_WAIT_H
#define GR_WAIT_H

#include <stdbool.h>
#include <stdint.h>

struct jbuf;

enum { GR_WAIT_ALLOC = 0, GR_WAIT_WAKE = 1 };

/* One wait, on the caller's stack. */
typedef struct gr_wait {
  int device, why;      /* GR_WAIT_ALLOC or GR_WAIT_WAKE */
  uint64_t bytes;
  char uuid[48];
  bool within;          /* within this process's guarantee: served before those above theirs */
  int fd;               /* the GPU's queue file */
  int slot;
  uint64_t ticket;
  uint64_t t0_ns, deadline_ns, since_ms;
  uint64_t last_try_ns, last_ask_ns, last_peer_check_ns;
  unsigned tries, asks;
  bool last;            /* no other process is left on the GPU: one last try, then the wait ends */
  bool head_once;       /* it reached the head of the queue at least once */
} gr_wait_t;

/* Whether an allocation that failed with out-of-memory after its own release and the peers' answer may wait
 * (GPURECLAIM_WAIT > 0, for an allocation; a wake waits its GPURECLAIM_WAKE_TIMEOUT; not inside a release, a
 * graph capture or a nested hook (nor, the caller checks, a peer reclaim: gr_peer_busy_here); and another
 * gpureclaim process of this user has memory on the GPU), and if so joins the GPU's queue. An allocation past
 * the process's own GPURECLAIM_LIMIT never comes here: it is refused before the driver call (ALLOC_BODY), since
 * nothing another process does can help it. bound_ms: how long
 * at most (0: GPURECLAIM_WAIT). device -1: the current context's. uuid: the GPU's, NULL to ask the driver (a
 * sleeping process cannot: its wake passes the one it noted). false: no wait (w is then unused). */
bool gr_wait_begin(gr_wait_t *w, uint64_t bytes, int device, const char *uuid, int why, uint64_t bound_ms);
/* Blocks until it is this waiter's turn to try (the head of the queue: waiters within their guarantee first,
 * then first come, first served), at most ~20 ms after its previous try; false once the bound has passed or
 * no other process of the user is left on the GPU (after one last try). */
bool gr_wait_turn(gr_wait_t *w);
/* Whether this turn should ask the peers again (at most every GR_WAIT_ASK_MS). */
bool gr_wait_ask_due(gr_wait_t *w);
/* Leaves the queue; logs the "wait" event (served or not). */
void gr_wait_end(gr_wait_t *w, bool served);
/* Whether another process waits in the GPU's queue now (a wake that finds room then queues behind it). */
bool gr_wait_queue_busy(const char *uuid);
/* Whether a thread of this process waits for memory now (such a process is not idle: it is not put to sleep). */
bool gr_wait_active(void);
/* The status file's top-level "wait": null, or {uuid, bytes, since_ms, for} of the oldest wait under way. */
void gr_wait_status_json(struct jbuf *b);
/* Whether this process holds no more than its guarantee on device (GPURECLAIM_GUARANTEE; none: false unless it
 * holds nothing), counting extra bytes more. */
bool gr_wait_within_guarantee(int device, uint64_t extra);
void gr_wait_atfork_child(void);

#define GR_WAIT_ASK_MS 500u

#endif /* GR_WAIT_H */
