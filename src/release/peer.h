/* peer.h -- peer reclaim, the asking side and the status file's peer object (peer.c; the serving side: give.h).
 * Internal. */
#ifndef GR_PEER_H
#define GR_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* peer.c: peer reclaim (GPURECLAIM_PEERS). */
struct jbuf;
/* The status file's "peer" object. */
void gr_peer_status_json(struct jbuf *b);
/* The worker's periodic check: rewrites the status file when what this process holds changed. */
void gr_peer_tick(void);
/* Whether a thread of this process is handling an out-of-memory with its peers now. */
bool gr_peer_busy(void);
/* Whether the calling thread is inside a peer reclaim (between gr_peer_begin and gr_peer_end). */
bool gr_peer_busy_here(void);
/* Whether GPURECLAIM_PEERS names this role (GR_PEERS_ASK, _GIVE, _SLEEP) and status files are on. */
bool gr_peer_on(unsigned bit);
/* The asking side, called by the hooks after their own retry failed (driver.c, RETRIES). */
#define GR_PEER_MAX 16 /* peers asked in one peer reclaim, at most */
/* A status file larger than this is not read (a peer's is a few KiB): discovery stays bounded in bytes. */
#define GR_PEER_STATUS_MAX (64 * 1024)
typedef struct gr_peer_result {
  int pid;
  const char *error; /* NULL: it answered */
  uint64_t orphaned, pool, framework, releaser, all;
  uint64_t slept; /* what its sleep freed on the GPU (GPURECLAIM_PEERS sleep); 0 when not asked to sleep */
  uint64_t claimed; /* the answer's total_bytes, as sent (0 when refused) */
  uint64_t seen;    /* what the GPU's free memory grew by meanwhile (cuMemGetInfo), when known (seen_known) */
  bool seen_known;
  bool on_gpu;      /* it said it has the GPU (an unlisted peer's answer may say it has not) */
  bool listed;      /* its status file listed the GPU; false: asked because the advertised bytes fell short */
  bool sleep_asked;
  unsigned connect_tries; /* connects refused for a full backlog before it was reached (or the share ended) */
  double ms;
} gr_peer_result_t;
typedef struct gr_peer_op {
  int device;
  uint64_t bytes;
  char uuid[48];
  int lock_fd;
  bool waited;   /* another peer reclaim of this GPU ran meanwhile: retry first */
  bool asked;
  const char *broke; /* the GPU's lock was taken from a holder that could not keep it: why (NULL: it was not) */
  int broke_pid;
  /* discovery (the run directory's status files): files read, skipped as too large, not regular or links, and whether
   * the deadline cut the scan short */
  unsigned scanned, skipped;
  bool scan_cut;
  double scan_ms;
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
