/*
 * peer.c -- peer reclaim: an out-of-memory in one process is relieved by the other gpureclaim processes of the
 * same user on the same GPU (GPURECLAIM_PEERS, GPURECLAIM_PEER_TIMEOUT; docs/LIBRARY.md, "Peer reclaim").
 *
 * Both sides, the serving of a request apart (give.c):
 *   - giving: the status file's "peer" object says, per GPU UUID this process holds memory on, what it holds and
 *     what each category could give (orphans, pools' unused memory, framework caches as last measured), whether
 *     it gives, whether a thread of it is handling an out-of-memory now, and when it last gave. The worker
 *     rewrites it when those figures change (gr_peer_tick); the "give" requests of the control socket are served
 *     by give.c (gr_give_serve, give.h -> gr_release_give in release.c, trigger `peer`).
 *   - asking: an allocation whose own release-and-retry failed (hooks/driver.c, RETRIES) takes the GPU's lock
 *     in the run directory (one peer reclaim per GPU at a time; a thread that had to wait retries first; the
 *     lock is a lease that a stopped, gone or expired holder loses), reads the other status files (bounded:
 *     live processes' only, 64 KiB each, until the deadline), and asks the peers on the same UUID in order
 *     (cheapest to give first, recent givers last), then every other live one of the user, until the
 *     allocation's size is covered or the deadline passes, each request within an even share of what is left;
 *     a peer's answer counts as far as the driver's free memory confirms it. Then the hook retries once.
 * Deadlock freedom: the asking thread only ever waits on sockets and a file lock, both bounded by the deadline;
 * its own worker still answers peers meanwhile, but gives no framework cache then (that needs the GIL, which
 * the asking thread may hold), and its status file says it is handling an out-of-memory, so peers skip it.
 */
#include "peer.h"
#include "limit.h"
#include "registry.h"
#include "stats.h"
#include "release.h"
#include "report.h"
#include "json.h"
#include "gate.h"
#include "jsonread.h"
#include "options.h"
#include "state.h"
#include "real.h"
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
#include <sys/stat.h>
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
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) == 1)
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
    uint64_t limit = gr_limit_bytes(h[i].device); /* GPURECLAIM_LIMIT, null for none */
    if (limit)
      jb_u64(b, "limit_bytes", limit);
    else
      jb_null(b, "limit_bytes");
    uint64_t guarantee = gr_limit_guarantee_bytes(h[i].device); /* GPURECLAIM_GUARANTEE, null for none */
    if (guarantee)
      jb_u64(b, "guarantee_bytes", guarantee);
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

static void add_ms(struct timespec *t, uint64_t ms) {
  t->tv_sec += (time_t)(ms / 1000);
  t->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t->tv_nsec >= 1000000000L) {
    t->tv_sec++;
    t->tv_nsec -= 1000000000L;
  }
}

static uint64_t ts_ms(const struct timespec *t) { return (uint64_t)t->tv_sec * 1000 + (uint64_t)t->tv_nsec / 1000000; }

/* The GPU's lock is a lease: its holder writes "PID START EXPIRY_MS\n" into the lock file once it holds the flock
 * (START: its start time in clock ticks, /proc/PID/stat field 22, so that a reused pid is not taken for it;
 * EXPIRY_MS: CLOCK_MONOTONIC milliseconds, its own deadline plus LEASE_GRACE_MS). A waiter breaks the lock when the
 * holder is stopped (SIGSTOP, a debugger), gone, or past its expiry, seen so twice LEASE_NAP_MS apart: it puts a
 * fresh lock file, already locked and leased by itself, in the old one's place (rename), so that every later
 * asker takes the new one; the stopped holder, resumed, finishes on the old inode and closes it. A lock file
 * without a lease (nothing written yet) is never broken. */
#define LEASE_GRACE_MS 250
#define LEASE_NAP_MS 2

static uint64_t start_ticks(int pid, char *state) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  char *text = gr_read_file_max(path, 4096);
  uint64_t t = 0;
  *state = 0;
  if (text) {
    const char *p = strrchr(text, ')');
    if (p && p[1] == ' ')
      *state = p[2];
    t = gr_stat_start_ticks(text);
    free(text);
  }
  return t;
}

static void lease_write(int fd, const gr_peer_op_t *op) {
  char state;
  uint64_t st = start_ticks((int)getpid(), &state);
  char line[80];
  int n = snprintf(line, sizeof line, "%d %llu %llu\n", (int)getpid(), (unsigned long long)st,
                   (unsigned long long)(ts_ms(&op->deadline) + LEASE_GRACE_MS));
  if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)n, 0) != n)
    (void)ftruncate(fd, 0); /* a lease half written is none */
}

/* Why the lease in fd no longer holds (NULL: it holds, or there is none), with its holder's pid. */
static const char *lease_broken(int fd, int *pid_out, char *text, size_t cap) {
  ssize_t n = pread(fd, text, cap - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  int pid = 0;
  unsigned long long start = 0, expiry = 0;
  if (n <= 0 || sscanf(text, "%d %llu %llu", &pid, &start, &expiry) != 3 || pid <= 0)
    return NULL;
  *pid_out = pid;
  char state;
  uint64_t now_start = start_ticks(pid, &state);
  if (!now_start || now_start != start || state == 'Z' || state == 'X')
    return "its holder is gone";
  if (state == 'T' || state == 't')
    return "its holder is stopped";
  if (gr_mono_ns() / 1000000 > expiry)
    return "its holder's lease expired";
  return NULL;
}

/* Takes the lock of fd's file for this process: a fresh file, locked and leased, renamed over the one at path
 * (still fd's inode, else another waiter broke it first: then nothing is done). Returns the new fd, or -1. */
static int lease_take(gr_peer_op_t *op, const char *path, int fd) {
  static _Atomic unsigned seq; /* two threads of this process may break the same lock */
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.%d.%u", path, (int)getpid(), atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed));
  int nfd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (nfd < 0)
    return -1;
  struct stat was, now;
  if (flock(nfd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &was) != 0 || stat(path, &now) != 0 ||
      was.st_ino != now.st_ino || was.st_dev != now.st_dev) {
    unlink(tmp);
    close(nfd);
    return -1;
  }
  lease_write(nfd, op);
  if (rename(tmp, path) != 0) {
    unlink(tmp);
    close(nfd);
    return -1;
  }
  return nfd;
}

/* Whether fd (locked) is still the file at path: a waiter that broke the lock put another in its place. */
static bool still_at(int fd, const char *path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

bool gr_peer_begin(gr_peer_op_t *op, uint64_t bytes, int device) {
  if (t_in_peer || !gr_peer_on(GR_PEERS_ASK))
    return false;
  const char *dir = gr_report_rundir();
  if (!dir)
    return false;
  if (device < 0 && (device = gr_reg_here_device()) < 0)
    return false;
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
  add_ms(&op->deadline, gr_opt()->peer_timeout_ms);
  atomic_fetch_add_explicit(&g_busy, 1, memory_order_acq_rel);
  gr_report_status_update(); /* "oom": true, so that peers do not ask us meanwhile */
  char path[4200];
  snprintf(path, sizeof path, "%s/gpu-%s.lock", dir, op->uuid);
  /* One peer reclaim per GPU at a time; the others wait for it (bounded), then retry their allocation first. */
  char seen[2][96];
  while (gr_ms_until(&op->deadline) > 0) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
      return true; /* no lock, no asking: the caller's retry alone */
    seen[0][0] = '\0';
    for (;;) {
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        if (still_at(fd, path)) {
          lease_write(fd, op);
          op->lock_fd = fd;
          return true;
        }
        break; /* the lock was broken and replaced while we waited: the new file is the lock now */
      }
      if (errno != EWOULDBLOCK && errno != EINTR) {
        close(fd);
        return true;
      }
      op->waited = true;
      if (gr_ms_until(&op->deadline) == 0)
        break;
      int pid = 0;
      const char *why = lease_broken(fd, &pid, seen[1], sizeof seen[1]);
      if (!why) {
        seen[0][0] = '\0';
      } else if (strcmp(seen[0], seen[1]) != 0) {
        memcpy(seen[0], seen[1], sizeof seen[0]); /* seen once: broken when seen so again after a nap */
      } else {
        int nfd = still_at(fd, path) ? lease_take(op, path, fd) : -1;
        if (nfd >= 0) {
          close(fd);
          op->lock_fd = nfd;
          op->broke = why;
          op->broke_pid = pid;
          gr_info("peer reclaim on %s: took the GPU's lock from pid %d (%s)", op->uuid, pid, why);
          return true;
        }
        break; /* another waiter broke it first: its new file is the lock now */
      }
      struct timespec nap = {0, LEASE_NAP_MS * 1000000L};
      nanosleep(&nap, NULL);
    }
    close(fd);
  }
  return true; /* the deadline passed while another held the lock: the caller's retry alone */
}

typedef struct cand {
  int pid;
  char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
  uint64_t cheap, fw, last_gave_ms;
  uint64_t idle_since_ms; /* 0: not idle (it works, or says nothing) */
  bool above;             /* it holds more than its guarantee on the GPU (no guarantee: anything) */
  bool sleep;             /* it may be asked to sleep (GPURECLAIM_PEERS sleep on its side) */
  bool listed;            /* its status file lists the GPU */
  bool on_gpu;            /* its answer said it has the GPU */
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

/* The peers that may give on op's GPU, best first: those whose status file lists the GPU, sorted (by_cost), then
 * every other live gpureclaim process of the user that gives (its status file may not list the GPU yet: a
 * context or orphans younger than its last status update), asked only when the first are not enough. Bounded:
 * a file of a process that is gone is not opened, one larger than GR_PEER_STATUS_MAX or not a regular file is not
 * read, and the scan ends at the deadline. Returns how many; *nlisted: how many of them are listed. */
static size_t find_peers(gr_peer_op_t *op, const char *dir, cand_t *out, size_t max, size_t *nlisted) {
  uint64_t t0 = gr_mono_ns();
  *nlisted = 0;
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  size_t n = 0, nu = 0, half = max / 2;
  cand_t unlisted[GR_PEER_MAX];
  struct dirent *e;
  int self = (int)getpid();
  while ((n < half || nu < GR_ARRAY_LEN(unlisted)) && (e = readdir(d))) {
    if (gr_ms_until(&op->deadline) == 0) {
      op->scan_cut = true;
      break;
    }
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || pid > 0x7fffffff || pid == self || strcmp(end, ".json") != 0)
      continue;
    if (kill((pid_t)pid, 0) != 0)
      continue; /* a stale file: its process is gone (or another user's) */
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *text = gr_read_file_max(path, GR_PEER_STATUS_MAX);
    if (!text) {
      op->skipped += errno == EFBIG || errno == EINVAL || errno == ELOOP; /* too large, not regular, a link */
      continue;
    }
    op->scanned++;
    const char *err;
    jnode_t *st = jparse(text, &err);
    free(text);
    if (!st)
      continue;
    const jnode_t *peer = jget(st, "peer"), *gpus = jget(peer, "gpus");
    const char *sock = jstr(st, "socket", NULL);
    if (jint(st, "pid", 0) == pid && jint(st, "uid", -1) == (int64_t)geteuid() && peer && jbool(peer, "give", false) &&
        !jbool(peer, "oom", false) && sock && strlen(sock) < sizeof out->sock && !strncmp(sock, dir, strlen(dir))) {
      const jnode_t *g = NULL;
      for (size_t i = 0; gpus && gpus->type == JN_ARR && i < gpus->n && !g; i++) {
        const char *u = jstr(&gpus->kids[i], "uuid", NULL);
        if (u && !strcmp(u, op->uuid))
          g = &gpus->kids[i];
      }
      cand_t *c = g ? (n < half ? &out[n++] : NULL) : (nu < GR_ARRAY_LEN(unlisted) ? &unlisted[nu++] : NULL);
      if (c) {
        memset(c, 0, sizeof *c);
        c->pid = (int)pid;
        snprintf(c->sock, sizeof c->sock, "%s", sock);
        int64_t pc = jint(g, "pool_cached_bytes", 0), ob = jint(g, "orphan_bytes", 0);
        int64_t fw = jint(g, "framework_bytes", 0);
        c->cheap = (uint64_t)(pc > 0 ? pc : 0) + (uint64_t)(ob > 0 ? ob : 0);
        c->fw = (uint64_t)(fw > 0 ? fw : 0);
        c->last_gave_ms = (uint64_t)jint(peer, "last_gave_ms", 0);
        c->sleep = jbool(peer, "sleep", false);
        c->listed = g != NULL;
        c->on_gpu = g != NULL;
        int64_t idle = jint(jget(st, "sleep"), "idle_since_ms", 0); /* least recently used sleeps first */
        c->idle_since_ms = idle > 0 ? (uint64_t)idle : 0;
        int64_t held = jint(g, "held_bytes", 0), guar = jint(g, "guarantee_bytes", 0);
        c->above = held > (guar > 0 ? guar : 0);
      }
    }
    jdelete(st);
  }
  closedir(d);
  if (n > 1)
    qsort(out, n, sizeof *out, by_cost);
  *nlisted = n;
  for (size_t i = 0; i < nu && n < max; i++)
    out[n++] = unlisted[i];
  op->scan_ms = (double)(gr_mono_ns() - t0) / 1e6;
  return n;
}

/* The GPU's free memory as the driver shows it (the real entry point, in a context of ours on that device).
 * False when it cannot be known (no context there; asleep or waking: the driver is not called then). */
static bool gpu_free(int device, uint64_t *free_out) {
  if (!gr_drv.cuMemGetInfo || !gr_drv.cuCtxGetCurrent || gr_gate_driver_off())
    return false;
  CUcontext ctx = gr_reg_ctx_on_device(device), cur = NULL;
  if (!ctx)
    return false;
  bool pushed = false;
  if (gr_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != ctx) {
    gr_reg_switched();
    pushed = gr_drv.cuCtxPushCurrent && gr_drv.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
    if (!pushed)
      return false;
  }
  size_t f = 0, t = 0;
  bool ok = gr_drv.cuMemGetInfo(&f, &t) == CUDA_SUCCESS;
  if (pushed)
    gr_drv.cuCtxPopCurrent(&cur);
  *free_out = f;
  return ok;
}

/* A connection to c's control socket, retried while its backlog is full (a busy process, not an unreachable one)
 * until `until`. Returns the fd, or -1 with r->error. */
static int connect_peer(const cand_t *c, const struct timespec *until, gr_peer_result_t *r) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", c->sock);
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      r->error = "socket";
      return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
      return fd;
    int e = errno;
    close(fd);
    if (e != EAGAIN && e != EINTR) {
      r->error = "cannot connect";
      return -1;
    }
    r->connect_tries++;
    if (gr_ms_until(until) == 0) {
      r->error = "busy (its socket's backlog stayed full for its share of the deadline)";
      return -1;
    }
    struct timespec nap = {0, 2 * 1000000L};
    nanosleep(&nap, NULL);
  }
}

/* The answer's total_bytes as a count of bytes: false when it is not one (absent, negative, not an integer, more
 * than 2^62), which a peer speaking docs/PROTOCOL.md never sends. */
static bool answer_bytes(const jnode_t *g, uint64_t *out) {
  const jnode_t *t = jget(g, "total_bytes");
  if (!t || t->type != JN_NUM || !t->is_int || t->i < 0 || (uint64_t)t->i > (1ull << 62))
    return false;
  *out = (uint64_t)t->i;
  return true;
}

static uint64_t field_bytes(const jnode_t *g, const char *key) {
  int64_t v = jint(g, key, 0);
  return v > 0 ? (uint64_t)v : 0;
}

/* One request to one peer, within `until` (its share of the deadline, which the request carries: the peer gives
 * nothing after it). Fills r; returns the bytes it counts as given: what the peer says, or what the GPU's free
 * memory grew by meanwhile when the driver shows clearly less (a peer's word is checked, not trusted). */
static uint64_t ask_one(gr_peer_op_t *op, cand_t *c, uint64_t want, bool sleep, const struct timespec *until,
                        gr_peer_result_t *r) {
  memset(r, 0, sizeof *r);
  r->pid = c->pid;
  r->listed = c->listed;
  r->sleep_asked = sleep;
  uint64_t t0 = gr_mono_ns();
  uint64_t free0 = 0;
  bool known = gpu_free(op->device, &free0);
  char line[256];
  /* above=1: the asker is above its guarantee (GPURECLAIM_GUARANTEE), and a peer within its own refuses to sleep
   * for it (give.c) */
  int len = snprintf(line, sizeof line, "give bytes=%llu uuid=%s deadline_ms=%llu pid=%d%s%s\n",
                     (unsigned long long)want, op->uuid, (unsigned long long)ts_ms(until), (int)getpid(),
                     sleep ? " sleep=1" : "", sleep && op->above ? " above=1" : "");
  char buf[16384];
  size_t got = 0;
  uint64_t given = 0;
  int fd = connect_peer(c, until, r);
  if (fd < 0) {
    /* r->error says why */
  } else if (send(fd, line, (size_t)len, MSG_NOSIGNAL) != len) {
    r->error = "cannot send";
  } else {
    for (;;) {
      struct pollfd p = {fd, POLLIN, 0};
      int left = gr_ms_until(until);
      int pr = left ? poll(&p, 1, left) : 0;
      if (pr < 0 && errno == EINTR)
        continue;
      if (pr <= 0) {
        r->error = "no answer within its share of the deadline";
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
  if (fd >= 0)
    close(fd);
  if (!r->error) {
    const char *err;
    jnode_t *a = jparse(buf, &err);
    const jnode_t *g = jget(a, "given");
    uint64_t claimed = 0;
    if (!a || !jbool(a, "ok", false) || !g) {
      r->error = "refused";
    } else if (!answer_bytes(g, &claimed)) {
      r->error = "implausible answer (total_bytes is not a count of bytes): not counted";
    } else {
      r->on_gpu = jbool(a, "on_gpu", true);
      r->orphaned = field_bytes(g, "orphaned_bytes");
      r->pool = field_bytes(g, "pool_bytes");
      r->framework = field_bytes(g, "framework_bytes");
      r->releaser = field_bytes(g, "releaser_bytes");
      r->all = field_bytes(g, "all_bytes");
      r->slept = field_bytes(g, "slept_bytes");
      r->claimed = claimed;
      given = claimed;
    }
    jdelete(a);
  }
  uint64_t free1 = 0;
  if (known && gpu_free(op->device, &free1)) {
    r->seen_known = true;
    r->seen = free1 > free0 ? free1 - free0 : 0;
    /* (a slack for the driver's own rounding: pages of 2 MiB, its bookkeeping) */
    if (r->claimed > r->seen + (2u << 20) + r->claimed / 32) {
      char cl[32], se[32];
      gr_info("peer reclaim on %s: pid %d says it gave %s, the GPU's free memory grew by %s meanwhile: %s counted",
              op->uuid, c->pid, gr_log_bytes(r->claimed, cl, sizeof cl), gr_log_bytes(r->seen, se, sizeof se), se);
      given = r->seen;
    }
  }
  c->on_gpu = c->on_gpu || r->on_gpu;
  r->ms = (double)(gr_mono_ns() - t0) / 1e6;
  return given;
}

/* The end of the next peer's share: what is left of the deadline, split evenly between the asks still to make
 * (one that does not answer cannot take the time of those after it; one that answers early leaves its rest to
 * them). */
static struct timespec share(const gr_peer_op_t *op, size_t asks_left) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  uint64_t left = (uint64_t)gr_ms_until(&op->deadline);
  add_ms(&t, asks_left > 1 ? left / asks_left : left);
  return t;
}

uint64_t gr_peer_ask(gr_peer_op_t *op) {
  if (op->lock_fd < 0)
    return 0;
  const char *dir = gr_report_rundir();
  cand_t c[2 * GR_PEER_MAX];
  size_t nlisted = 0;
  size_t n = dir ? find_peers(op, dir, c, GR_ARRAY_LEN(c), &nlisted) : 0;
  op->asked = true;
  size_t sleepers = 0;
  for (size_t i = 0; i < nlisted; i++)
    sleepers += c[i].sleep;
  for (size_t i = 0; i < n && op->given < op->bytes && gr_ms_until(&op->deadline) > 0; i++) {
    gr_peer_result_t *r = &op->results[op->nresults < GR_PEER_MAX ? op->nresults : GR_PEER_MAX - 1];
    struct timespec until = share(op, n - i + sleepers);
    op->given += ask_one(op, &c[i], op->bytes - op->given, false, &until, r);
    if (op->nresults < GR_PEER_MAX)
      op->nresults++;
  }
  /* Still short after every cache: the peers that opted in are asked to sleep if idle (they decide), above
   * their guarantee first, least recently used first (by_idle); each is asked once more for caches too, which
   * costs it nothing when they are gone. An unlisted peer only when its answer said it has the GPU. */
  if (n > 1)
    qsort(c, n, sizeof *c, by_idle);
  size_t left = 0;
  for (size_t i = 0; i < n; i++)
    left += c[i].sleep && c[i].on_gpu;
  for (size_t i = 0; i < n && op->given < op->bytes && gr_ms_until(&op->deadline) > 0; i++) {
    if (!c[i].sleep || !c[i].on_gpu)
      continue;
    gr_peer_result_t *r = &op->results[op->nresults < GR_PEER_MAX ? op->nresults : GR_PEER_MAX - 1];
    struct timespec until = share(op, left--);
    op->given += ask_one(op, &c[i], op->bytes - op->given, true, &until, r);
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
    if (op->broke) {
      jb_key(&b, "lock_taken");
      jb_obj(&b);
      jb_i64(&b, "from_pid", op->broke_pid);
      jb_str(&b, "why", op->broke);
      jb_obj_end(&b);
    }
    jb_key(&b, "discovery");
    jb_obj(&b);
    jb_u64(&b, "read", op->scanned);
    jb_u64(&b, "skipped", op->skipped);
    jb_bool(&b, "cut_by_deadline", op->scan_cut);
    jb_f64(&b, "ms", op->scan_ms);
    jb_obj_end(&b);
    jb_arr(&b, "peers");
    for (unsigned i = 0; i < op->nresults; i++) {
      const gr_peer_result_t *r = &op->results[i];
      jb_key(&b, NULL);
      jb_obj(&b);
      jb_i64(&b, "pid", r->pid);
      jb_f64(&b, "ms", r->ms);
      jb_bool(&b, "listed", r->listed);
      jb_bool(&b, "sleep", r->sleep_asked);
      if (r->connect_tries)
        jb_u64(&b, "busy_retries", r->connect_tries);
      if (r->seen_known)
        jb_u64(&b, "seen_freed_bytes", r->seen);
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
        jb_u64(&b, "total_bytes", r->claimed);
        jb_obj_end(&b);
        jb_bool(&b, "on_gpu", r->on_gpu);
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
  if (op->lock_fd >= 0) {
    /* The lease goes first: the next holder's file shows none until it writes its own, so that no waiter takes
     * our finished lease (a holder that is gone) for its. */
    if (ftruncate(op->lock_fd, 0) != 0)
      gr_debug("peer reclaim: cannot clear the lease of the GPU's lock: %s", strerror(errno));
    close(op->lock_fd); /* releases the GPU's lock */
  }
  t_in_peer = 0;
}

void gr_peer_atfork_child(void) {
  atomic_store_explicit(&g_busy, 0, memory_order_relaxed);
  atomic_store_explicit(&g_fingerprint, 0, memory_order_relaxed);
  t_in_peer = 0;
}
