/* peer.h -- peer reclaim, the asking side and the status file's peer object (peer.c, give.c). Internal. */
#ifndef GR_PEER_H
#define GR_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* peer.c: peer reclaim (GPURECLAIM_PEERS), both sides. */
struct jbuf;
/* The status file's "peer" object. */
void gr_peer_status_json(struct jbuf *b);
/* The worker's periodic check: rewrites the status file when what this process holds changed. */
void gr_peer_tick(void);
/* give.c: serves a "give" request line (after "give ") from the process whose credentials are pid/uid; fills the
 * answer into b (an open object). */
void gr_peer_serve_give(const char *args, int pid, struct jbuf *b);
/* Whether a thread of this process is handling an out-of-memory with its peers now. */
bool gr_peer_busy(void);
/* Whether the calling thread is inside a peer reclaim (between gr_peer_begin and gr_peer_end). */
bool gr_peer_busy_here(void);
/* Whether GPURECLAIM_PEERS names this role (GR_PEERS_ASK, _GIVE, _SLEEP) and status files are on. */
bool gr_peer_on(unsigned bit);
/* The asking side, called by the hooks after their own retry failed (driver.c, RETRIES). */
#define GR_PEER_MAX 16 /* peers asked in one peer reclaim, at most */
typedef struct gr_peer_result {
  int pid;
  const char *error; /* NULL: it answered */
  uint64_t orphaned, pool, framework, releaser, all;
  uint64_t slept; /* what its sleep freed on the GPU (GPURECLAIM_PEERS sleep); 0 when not asked to sleep */
  double ms;
} gr_peer_result_t;
typedef struct gr_peer_op {
  int device;
  uint64_t bytes;
  char uuid[48];
  int lock_fd;
  bool waited;   /* another peer reclaim of this GPU ran meanwhile: retry first */
  bool asked;
  bool above;    /* this process is above its guarantee on the GPU, counting the request (GPURECLAIM_GUARANTEE) */
  uint64_t given;
  uint64_t t0_ns;
  struct timespec deadline;
  unsigned nresults;
  gr_peer_result_t results[GR_PEER_MAX]; /* what each peer gave, for the event line */
} gr_peer_op_t;
bool gr_peer_begin(gr_peer_op_t *op, uint64_t bytes, int device);
uint64_t gr_peer_ask(gr_peer_op_t *op);
void gr_peer_end(gr_peer_op_t *op, bool succeeded);
void gr_peer_atfork_child(void);

#endif /* GR_PEER_H */
