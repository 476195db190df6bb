/*
 * peer.c -- peer reclaim: an out-of-memory in one process is relieved by the other gpureclaim processes of the
 * same user on the same GPU (GPURECLAIM_PEERS, GPURECLAIM_PEER_TIMEOUT; docs/LIBRARY.md, "Peer reclaim").
 *
 * Both sides, the serving of a request apart (give.c):
 *   - giving: the status file's "peer" object says, per GPU UUID this process holds memory on, what it holds and
 *     what each category could give (orphans, pools' unused memory, framework caches as last measured), whether
 *     it gives, whether a thread of it is handling an out-of-memory now, and when it last gave. The worker
 *     rewrites it when those figures change (gr_peer_tick); the "give" requests of the control socket are served
 *     by give.c (gr_peer_serve_give -> gr_release_give in release.c, trigger `peer`).
 *   - asking: an allocation whose own release-and-retry failed (hooks/driver.c, RETRIES) takes the GPU's lock
 *     in the run directory (one peer reclaim per GPU at a time; a thread that had to wait retries first), reads
 *     the other status files, and asks the peers on the same UUID in order (cheapest to give first, recent
 *     givers last) until the allocation's size is covered or the deadline passes; then the hook retries once.
 * Deadlock freedom: the asking thread only ever waits on sockets and a file lock, both bounded by the deadline;
 * its own worker still answers peers meanwhile, but gives no framework cache then (that needs the GIL, which
 * the asking thread may hold), and its status file says it is handling an out-of-memory, so peers skip it.
 */
#include "peer.h"
#include "registry.h"
#include "stats.h"
#include "release.h"
#include "report.h"
#include "json.h"
#include "gate.h"
#include "jsonread.h"
#include "options.h"
#include "state.h"
#include "wait.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_busy;                /* threads of this process in a peer reclaim now */
static _Atomic uint64_t g_fingerprint;    /* of the figures the status file shows (gr_peer_tick) */
static GR_TLS int t_in_peer;

bool gr_peer_busy(void) { return atomic_load_explicit(&g_busy, memory_order_acquire) > 0; }
bool gr_peer_busy_here(void) { return t_in_peer != 0; }

bool gr_peer_on(unsigned bit) {
  const gr_options_t *o = gr_opt();
  return o->status && (o->peers & bit);
}

/* ---- what this process holds, per GPU ---- */

static void ctx_dev(uint16_t id, CUcontext ctx, int device, void *arg) {
  (void)id, (void)ctx;
  if (device >= 0 && device < 64)
    *(uint64_t *)arg |= 1ull << device;
}

typedef struct held {
  int device;
  uint64_t held, pool_cached, orphan, framework;
} held_t;

/* The devices this process has a context on, with what it holds there. Returns how many. */
static int held_by_device(held_t *out, int max) {
  uint64_t mask = 0;
  if (atomic_load_explicit(&gr_core_state, memory_order_acquire) == 1)
    gr_reg_foreach_ctx(ctx_dev, &mask);
  int n = 0;
  for (int d = 0; d < GR_MAX_DEV && n < max; d++) {
    if (!((mask >> d) & 1))
      continue;
    gpureclaim_stats_t s = {.size = sizeof s};
    gr_stats_get(d, &s);
    held_t *h = &out[n++];
    h->device = d;
    h->pool_cached = s.pool_reserved_bytes > s.pool_used_bytes ? s.pool_reserved_bytes - s.pool_used_bytes : 0;
    h->held = s.live_bytes + h->pool_cached;
    h->orphan = s.orphan_bytes;
    h->framework = gr_report_framework_releasable(d);
  }
  return n;
}

void gr_peer_status_json(jbuf_t *b) {
  const gr_options_t *o = gr_opt();
  held_t h[GR_MAX_DEV];
  int n = held_by_device(h, GR_MAX_DEV);
  jb_key(b, "peer");
  jb_obj(b);
  jb_bool(b, "ask", (o->peers & GR_PEERS_ASK) != 0);
  jb_bool(b, "give", (o->peers & GR_PEERS_GIVE) != 0);
  jb_bool(b, "sleep", (o->peers & GR_PEERS_SLEEP) && gr_gate_enabled()); /* may be asked to sleep, when idle */
  jb_bool(b, "oom", gr_peer_busy());
  jb_u64(b, "last_gave_ms", gr_release_last_give_ms());
  jb_arr(b, "gpus");
  uint64_t fp = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    char uuid[64];
    jb_key(b, NULL);
    jb_obj(b);
    jb_str(b, "uuid", gr_report_gpu_uuid(h[i].device, uuid, sizeof uuid) ? uuid : NULL);
    jb_i64(b, "device", h[i].device);
    jb_u64(b, "held_bytes", h[i].held);
    jb_u64(b, "pool_cached_bytes", h[i].pool_cached);
    jb_u64(b, "orphan_bytes", h[i].orphan);
    jb_u64(b, "framework_bytes", h[i].framework);
    if (o->guarantee)
      jb_u64(b, "guarantee_bytes", o->guarantee);
    else
      jb_null(b, "guarantee_bytes");
    jb_obj_end(b);
    uint64_t v[] = {(uint64_t)h[i].device, h[i].held, h[i].pool_cached, h[i].orphan, h[i].framework};
    for (size_t k = 0; k < GR_ARRAY_LEN(v); k++)
      fp = (fp ^ v[k]) * 1099511628211ull;
  }
  jb_arr_end(b);
  jb_obj_end(b);
  gr_wait_status_json(b); /* the top-level "wait" */
  atomic_store_explicit(&g_fingerprint, fp, memory_order_relaxed);
}

void gr_peer_tick(void) {
  if (!gr_opt()->status)
    return;
  held_t h[GR_MAX_DEV];
  int n = held_by_device(h, GR_MAX_DEV);
  uint64_t fp = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    uint64_t v[] = {(uint64_t)h[i].device, h[i].held, h[i].pool_cached, h[i].orphan, h[i].framework};
    for (size_t k = 0; k < GR_ARRAY_LEN(v); k++)
      fp = (fp ^ v[k]) * 1099511628211ull;
  }
  if (fp != atomic_load_explicit(&g_fingerprint, memory_order_relaxed))
    gr_report_status_update();
}

/* ---- asking ---- */

bool gr_peer_begin(gr_peer_op_t *op, uint64_t bytes, int device) {
  if (t_in_peer || !gr_peer_on(GR_PEERS_ASK))
    return false;
  const char *dir = gr_report_rundir();
  if (!dir)
    return false;
  if (device < 0) {
    uint16_t cid;
    uint8_t dev;
    CUcontext ctx;
    if (!gr_reg_current(&cid, &dev, &ctx) || dev == GR_DEVICE_NONE)
      return false;
    device = dev;
  }
  memset(op, 0, sizeof *op);
  op->lock_fd = -1;
  op->device = device;
  op->bytes = bytes;
  if (!gr_report_gpu_uuid(device, op->uuid, sizeof op->uuid))
    return false;
  t_in_peer = 1;
  op->t0_ns = gr_mono_ns();
  op->above = !gr_wait_within_guarantee(op->device, bytes);
  clock_gettime(CLOCK_MONOTONIC, &op->deadline);
  unsigned ms = gr_opt()->peer_timeout_ms;
  op->deadline.tv_sec += ms / 1000;
  op->deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (op->deadline.tv_nsec >= 1000000000L) {
    op->deadline.tv_sec++;
    op->deadline.tv_nsec -= 1000000000L;
  }
  atomic_fetch_add_explicit(&g_busy, 1, memory_order_acq_rel);
  gr_report_status_update(); /* "oom": true, so that peers do not ask us meanwhile */
  char path[4200];
  snprintf(path, sizeof path, "%s/gpu-%s.lock", dir, op->uuid);
  op->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (op->lock_fd < 0)
    return true; /* no lock, no asking: the caller's retry alone */
  /* One peer reclaim per GPU at a time; the others wait for it (bounded), then retry their allocation first. */
  while (flock(op->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      close(op->lock_fd);
      op->lock_fd = -1;
      return true;
    }
    op->waited = true;
    if (gr_ms_until(&op->deadline) == 0) {
      close(op->lock_fd);
      op->lock_fd = -1;
      return true;
    }
    struct timespec nap = {0, 2 * 1000000L};
    nanosleep(&nap, NULL);
  }
  return true;
}

typedef struct cand {
  int pid;
  char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
  uint64_t cheap, fw, last_gave_ms;
  uint64_t idle_since_ms; /* 0: not idle (it works, or says nothing) */
  bool above;             /* it holds more than its guarantee on the GPU (no guarantee: anything) */
  bool sleep; /* it may be asked to sleep (GPURECLAIM_PEERS sleep on its side) */
} cand_t;

/* Who gives first (issue 31, "who gives, in order"): the peers above their guarantee before those within it;
 * then, for caches and orphans, the cheapest to give first (recent givers last); for sleeping
 * (by_idle), the least recently used first. Never live memory of a peer that did not opt in to sleep. */
static int by_cost(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->above != y->above)
    return x->above ? -1 : 1;
  uint64_t now = gr_wall_ms();
  bool rx = x->last_gave_ms && now - x->last_gave_ms < 10000, ry = y->last_gave_ms && now - y->last_gave_ms < 10000;
  if (rx != ry)
    return rx - ry; /* gave recently: asked last */
  if (x->cheap != y->cheap)
    return x->cheap > y->cheap ? -1 : 1;
  if (x->fw != y->fw)
    return x->fw > y->fw ? -1 : 1;
  return x->pid - y->pid;
}


/* The order of the second round, asking idle peers that opted in to sleep: above their guarantee first, then
 * the idle ones, least recently used (idle longest) first; those that work last (they would refuse). */
static int by_idle(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->above != y->above)
    return x->above ? -1 : 1;
  if ((x->idle_since_ms != 0) != (y->idle_since_ms != 0))
    return x->idle_since_ms ? -1 : 1;
  if (x->idle_since_ms != y->idle_since_ms)
    return x->idle_since_ms < y->idle_since_ms ? -1 : 1;
  return x->pid - y->pid;
}

/* The peers that may give on op's GPU, best first. */
static size_t find_peers(const gr_peer_op_t *op, const char *dir, cand_t *out, size_t max) {
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  size_t n = 0;
  struct dirent *e;
  int self = (int)getpid();
  while (n < max && (e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || pid == self || strcmp(end, ".json") != 0)
      continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *text = gr_read_file(path);
    const char *err;
    jnode_t *st = text ? jparse(text, &err) : NULL;
    free(text);
    if (!st)
      continue;
    const jnode_t *peer = jget(st, "peer"), *gpus = jget(peer, "gpus");
    const char *sock = jstr(st, "socket", NULL);
    if (jint(st, "pid", 0) == pid && jint(st, "uid", -1) == (int64_t)geteuid() && peer && jbool(peer, "give", false) &&
        !jbool(peer, "oom", false) && gpus && gpus->type == JN_ARR && sock && strlen(sock) < sizeof out->sock &&
        !strncmp(sock, dir, strlen(dir)) && kill((pid_t)pid, 0) == 0) {
      for (size_t i = 0; i < gpus->n; i++) {
        const jnode_t *g = &gpus->kids[i];
        const char *u = jstr(g, "uuid", NULL);
        if (!u || strcmp(u, op->uuid) != 0)
          continue;
        cand_t *c = &out[n++];
        c->pid = (int)pid;
        snprintf(c->sock, sizeof c->sock, "%s", sock);
        c->cheap = (uint64_t)jint(g, "pool_cached_bytes", 0) + (uint64_t)jint(g, "orphan_bytes", 0);
        c->fw = (uint64_t)jint(g, "framework_bytes", 0);
        c->last_gave_ms = (uint64_t)jint(peer, "last_gave_ms", 0);
        c->sleep = jbool(peer, "sleep", false);
        int64_t idle = jint(jget(st, "sleep"), "idle_since_ms", 0); /* least recently used sleeps first */
        c->idle_since_ms = idle > 0 ? (uint64_t)idle : 0;
        int64_t held = jint(g, "held_bytes", 0), guar = jint(g, "guarantee_bytes", 0);
        c->above = held > (guar > 0 ? guar : 0);
        break;
      }
    }
    jdelete(st);
  }
  closedir(d);
  if (n > 1)
    qsort(out, n, sizeof *out, by_cost);
  return n;
}

/* One request to one peer, within the deadline. Fills r; returns the bytes given. */
static uint64_t ask_one(gr_peer_op_t *op, const cand_t *c, uint64_t want, bool sleep, gr_peer_result_t *r) {
  memset(r, 0, sizeof *r);
  r->pid = c->pid;
  uint64_t t0 = gr_mono_ns();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    r->error = "socket";
    return 0;
  }
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", c->sock);
  char line[256];
  /* above=1: the asker is above its guarantee (GPURECLAIM_GUARANTEE), and a peer within its own refuses to sleep
   * for it (give.c) */
  int len = snprintf(line, sizeof line, "give bytes=%llu uuid=%s deadline_ms=%llu pid=%d%s%s\n",
                     (unsigned long long)want, op->uuid,
                     (unsigned long long)op->deadline.tv_sec * 1000 + (unsigned long long)op->deadline.tv_nsec / 1000000,
                     (int)getpid(), sleep ? " sleep=1" : "", sleep && op->above ? " above=1" : "");
  char buf[16384];
  size_t got = 0;
  uint64_t given = 0;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    r->error = errno == EAGAIN ? "busy (its socket's backlog is full)" : "cannot connect";
  } else if (send(fd, line, (size_t)len, MSG_NOSIGNAL) != len) {
    r->error = "cannot send";
  } else {
    for (;;) {
      struct pollfd p = {fd, POLLIN, 0};
      int left = gr_ms_until(&op->deadline);
      int pr = left ? poll(&p, 1, left) : 0;
      if (pr < 0 && errno == EINTR)
        continue;
      if (pr <= 0) {
        r->error = "no answer before the deadline";
        break;
      }
      ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
      if (k < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (k <= 0) {
        r->error = "hung up";
        break;
      }
      got += (size_t)k;
      buf[got] = '\0';
      if (memchr(buf, '\n', got) || got == sizeof buf - 1)
        break;
    }
  }
  close(fd);
  if (!r->error) {
    const char *err;
    jnode_t *a = jparse(buf, &err);
    const jnode_t *g = jget(a, "given");
    if (!a || !jbool(a, "ok", false) || !g) {
      r->error = "refused";
    } else {
      r->orphaned = (uint64_t)jint(g, "orphaned_bytes", 0);
      r->pool = (uint64_t)jint(g, "pool_bytes", 0);
      r->framework = (uint64_t)jint(g, "framework_bytes", 0);
      r->releaser = (uint64_t)jint(g, "releaser_bytes", 0);
      r->all = (uint64_t)jint(g, "all_bytes", 0);
      r->slept = (uint64_t)jint(g, "slept_bytes", 0);
      given = (uint64_t)jint(g, "total_bytes", 0);
    }
    jdelete(a);
  }
  r->ms = (double)(gr_mono_ns() - t0) / 1e6;
  return given;
}

uint64_t gr_peer_ask(gr_peer_op_t *op) {
  if (op->lock_fd < 0)
    return 0;
  const char *dir = gr_report_rundir();
  cand_t c[GR_PEER_MAX];
  size_t n = dir ? find_peers(op, dir, c, GR_ARRAY_LEN(c)) : 0;
  op->asked = true;
  for (size_t i = 0; i < n && op->given < op->bytes && gr_ms_until(&op->deadline) > 0; i++) {
    gr_peer_result_t *r = &op->results[op->nresults < GR_PEER_MAX ? op->nresults : GR_PEER_MAX - 1];
    op->given += ask_one(op, &c[i], op->bytes - op->given, false, r);
    if (op->nresults < GR_PEER_MAX)
      op->nresults++;
  }
  /* Still short after every cache: the peers that opted in are asked to sleep if idle (they decide), above
   * their guarantee first, least recently used first (by_idle); each is asked once more for caches too, which
   * costs it nothing when they are gone. */
  if (n > 1)
    qsort(c, n, sizeof *c, by_idle);
  for (size_t i = 0; i < n && op->given < op->bytes && gr_ms_until(&op->deadline) > 0; i++) {
    if (!c[i].sleep)
      continue;
    gr_peer_result_t *r = &op->results[op->nresults < GR_PEER_MAX ? op->nresults : GR_PEER_MAX - 1];
    op->given += ask_one(op, &c[i], op->bytes - op->given, true, r);
    if (op->nresults < GR_PEER_MAX)
      op->nresults++;
  }
  return op->given;
}

void gr_peer_end(gr_peer_op_t *op, bool succeeded) {
  atomic_fetch_sub_explicit(&g_busy, 1, memory_order_acq_rel);
  double ms = (double)(gr_mono_ns() - op->t0_ns) / 1e6;
  if (op->asked) {
    gr_stats_peer_ask(succeeded, op->given);
    jbuf_t b;
    jb_init(&b);
    jb_obj(&b);
    jb_str(&b, "event", "peer_reclaim");
    jb_i64(&b, "pid", getpid());
    jb_i64(&b, "device", op->device);
    jb_str(&b, "uuid", op->uuid);
    jb_u64(&b, "wanted_bytes", op->bytes);
    jb_u64(&b, "given_bytes", op->given);
    jb_f64(&b, "ms", ms);
    jb_bool(&b, "waited", op->waited);
    jb_bool(&b, "retry_succeeded", succeeded);
    jb_arr(&b, "peers");
    for (unsigned i = 0; i < op->nresults; i++) {
      const gr_peer_result_t *r = &op->results[i];
      jb_key(&b, NULL);
      jb_obj(&b);
      jb_i64(&b, "pid", r->pid);
      jb_f64(&b, "ms", r->ms);
      if (r->error) {
        jb_str(&b, "error", r->error);
      } else {
        jb_key(&b, "given");
        jb_obj(&b);
        jb_u64(&b, "orphaned_bytes", r->orphaned);
        jb_u64(&b, "pool_bytes", r->pool);
        jb_u64(&b, "framework_bytes", r->framework);
        jb_u64(&b, "releaser_bytes", r->releaser);
        jb_u64(&b, "all_bytes", r->all);
        jb_u64(&b, "slept_bytes", r->slept);
        jb_obj_end(&b);
      }
      jb_obj_end(&b);
    }
    jb_arr_end(&b);
    jb_obj_end(&b);
    jb_raw(&b, "\n", 1);
    gr_report_event(&b);
    jb_free(&b);
    char w[32], g[32];
    gr_info("peer reclaim on GPU %d (%s): wanted %s, %u peer%s gave %s in %.2f ms; the allocation %s", op->device,
            op->uuid, gr_log_bytes(op->bytes, w, sizeof w), op->nresults, gr_plural(op->nresults),
            gr_log_bytes(op->given, g, sizeof g), ms, succeeded ? "succeeded" : "still failed");
  }
  /* "oom": false again, and what we hold now, before the lock goes: the next peer reclaim of this GPU, which
   * may have waited for ours, then finds us askable. */
  gr_report_status_update();
  if (op->lock_fd >= 0)
    close(op->lock_fd); /* releases the GPU's lock */
  t_in_peer = 0;
}

void gr_peer_atfork_child(void) {
  atomic_store_explicit(&g_busy, 0, memory_order_relaxed);
  atomic_store_explicit(&g_fingerprint, 0, memory_order_relaxed);
  t_in_peer = 0;
}
