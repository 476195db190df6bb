/*
 * wait.c -- waiting for memory on a shared GPU (GPURECLAIM_WAIT; docs/LIBRARY.md, "Waiting for memory").
 *
 * An allocation that still fails with out-of-memory after its own release and retry and after its peers were
 * asked (hooks/driver.c, RETRIES), or a wake that finds no room (sleep.c), waits for memory to come: a busy peer
 * going idle (and then sleeping, when it opted in), a peer exiting or freeing. Only while waiting can help:
 * another gpureclaim process of the same user has memory on the GPU (its status file says so). The bound is
 * GPURECLAIM_WAIT seconds for an allocation, GPURECLAIM_WAKE_TIMEOUT for a wake; then the program sees
 * CUDA_ERROR_OUT_OF_MEMORY as before.
 *
 * Fairness: the waiters of one GPU, across the user's processes, form one queue, the file gpu-<UUID>.wait of the
 * run directory: a fixed table of slots (pid, thread, ticket, when it joined, what it wants, whether it is within
 * its guarantee, when it last looked), read and written whole under an flock (which the kernel drops when its
 * holder dies). The head is the oldest ticket among the waiters within their guarantee (GPURECLAIM_GUARANTEE),
 * else the oldest ticket; only the head retries its allocation and asks the peers (every GR_WAIT_ASK_MS), the
 * others look again every few milliseconds. A slot whose process is gone is swept; one whose waiter has not
 * looked for longer than its own peer timeout and a second (a stopped process) is passed over, not removed.
 * A full table (GR_WAIT_SLOTS waiters on one GPU) turns the newcomer away: it fails as it would have.
 *
 * Deadlock freedom: a waiting thread holds no lock of gpureclaim's (it is not in a release, a peer reclaim or a
 * nested hook: gr_wait_begin refuses those), only the queue's flock for the microseconds of a read-modify-write;
 * its process's worker goes on answering peers (caches only while a thread of it handles an out-of-memory, as
 * before), and a waiting process never sleeps (gr_wait_active: it is not idle).
 */
#include "wait.h"
#include "limit.h"
#include "admit.h"
#include "capture.h"
#include "registry.h"
#include "report.h"
#include "stats.h"
#include "json.h"
#include "jsonread.h"
#include "options.h"
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define GR_WAIT_SLOTS 64
#define WAIT_MAGIC 0x47525754u /* "GRWT" */
#define WAIT_VERSION 1u
#define NAP_NS 5000000ull        /* a waiter not at the head looks again this often */
#define TRY_NS 20000000ull       /* the head retries at most this often */
#define PEER_CHECK_NS 1000000000ull

typedef struct qslot {
  int32_t pid, tid;
  uint64_t ticket; /* 0: free */
  uint64_t since_ms;
  uint64_t beat_ns;    /* CLOCK_MONOTONIC when it last looked */
  uint64_t stale_ns;   /* passed over once it has not looked for this long */
  uint64_t bytes;
  uint32_t within, why;
} qslot_t;

typedef struct qfile {
  uint32_t magic, version;
  uint64_t next_ticket;
  qslot_t s[GR_WAIT_SLOTS];
} qfile_t;

/* This process's waits, for the status file. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_active;
static struct {
  bool on;
  char uuid[48];
  uint64_t bytes, since_ms;
  int why;
} g_shown;

bool gr_wait_active(void) { return atomic_load_explicit(&g_active, memory_order_acquire) > 0; }

static uint64_t held_on(int device) {
  gpureclaim_stats_t s = {.size = sizeof s};
  if (gr_stats_get(device, &s) != 0)
    return 0;
  uint64_t cached = s.pool_reserved_bytes > s.pool_used_bytes ? s.pool_reserved_bytes - s.pool_used_bytes : 0;
  return s.live_bytes + cached;
}

bool gr_wait_within_guarantee(int device, uint64_t extra) {
  uint64_t g = gr_limit_guarantee_bytes(device), h = device >= 0 ? held_on(device) : 0;
  return g && h <= g && extra <= g - h;
}

/* Whether waiting can help: another live process of this user has memory on the GPU, by its status file, and
 * one of them is not waiting itself; or, when every such process waits (each for the others: nothing would
 * come), this waiter holds nothing there (it takes part in no cycle) or is the head of the queue (the others,
 * which hold memory, give up instead and go on, to free, sleep or exit). */
static bool others_on_gpu(const char *dir, const char *uuid, int device, bool head) {
  DIR *d = opendir(dir);
  if (!d)
    return false;
  bool found = false, stuck = false; /* another holder that does not wait / one that waits */
  struct dirent *e;
  int self = (int)getpid();
  while (!found && (e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || pid == self || strcmp(end, ".json") != 0 || kill((pid_t)pid, 0) != 0)
      continue;
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 256 * 1024 || st.st_uid != geteuid())
      continue;
    char *text = gr_read_file(path);
    const char *err;
    jnode_t *js = text ? jparse(text, &err) : NULL;
    free(text);
    const jnode_t *gpus = jget(jget(js, "peer"), "gpus"), *wait = jget(js, "wait");
    bool waits = wait && wait->type == JN_OBJ;
    if (js && jint(js, "pid", 0) == pid && gpus && gpus->type == JN_ARR)
      for (size_t i = 0; i < gpus->n; i++) {
        const char *u = jstr(&gpus->kids[i], "uuid", NULL);
        if (u && !strcmp(u, uuid) && jint(&gpus->kids[i], "held_bytes", 0) > 0) {
          found |= !waits;
          stuck |= waits;
        }
      }
    jdelete(js);
  }
  closedir(d);
  return found || (stuck && (head || device < 0 || held_on(device) == 0));
}

/* ---- the queue file ---- */

static bool q_lock_read(int fd, qfile_t *q) {
  while (flock(fd, LOCK_EX) != 0)
    if (errno != EINTR)
      return false;
  ssize_t n = pread(fd, q, sizeof *q, 0);
  if (n != (ssize_t)sizeof *q || q->magic != WAIT_MAGIC || q->version != WAIT_VERSION) {
    memset(q, 0, sizeof *q); /* new, or not ours: started over */
    q->magic = WAIT_MAGIC;
    q->version = WAIT_VERSION;
  }
  return true;
}

static void q_write_unlock(int fd, const qfile_t *q) {
  if (pwrite(fd, q, sizeof *q, 0) != (ssize_t)sizeof *q)
    gr_debug("wait: could not write the queue file: %s", strerror(errno));
  flock(fd, LOCK_UN);
}

/* Removes the slots of processes that are gone. */
static void q_sweep(qfile_t *q) {
  for (int i = 0; i < GR_WAIT_SLOTS; i++)
    if (q->s[i].ticket && (q->s[i].pid <= 0 || (kill(q->s[i].pid, 0) != 0 && errno == ESRCH)))
      memset(&q->s[i], 0, sizeof q->s[i]);
}

/* The head: the oldest ticket within its guarantee, else the oldest; -1 for none. Slots that stopped looking
 * are passed over. */
static int q_head(const qfile_t *q, uint64_t now_ns) {
  int best = -1;
  for (int i = 0; i < GR_WAIT_SLOTS; i++) {
    const qslot_t *s = &q->s[i];
    if (!s->ticket || (now_ns > s->beat_ns && now_ns - s->beat_ns > s->stale_ns))
      continue;
    if (best < 0 || s->within > q->s[best].within ||
        (s->within == q->s[best].within && s->ticket < q->s[best].ticket))
      best = i;
  }
  return best;
}

static void show(const gr_wait_t *w) {
  pthread_mutex_lock(&g_mu);
  if (!g_shown.on) {
    g_shown.on = true;
    snprintf(g_shown.uuid, sizeof g_shown.uuid, "%s", w->uuid);
    g_shown.bytes = w->bytes;
    g_shown.since_ms = w->since_ms;
    g_shown.why = w->why;
  }
  pthread_mutex_unlock(&g_mu);
}

void gr_wait_status_json(jbuf_t *b) {
  pthread_mutex_lock(&g_mu);
  if (!g_shown.on) {
    jb_null(b, "wait");
  } else {
    jb_key(b, "wait");
    jb_obj(b);
    jb_str(b, "uuid", g_shown.uuid);
    jb_u64(b, "bytes", g_shown.bytes);
    jb_u64(b, "since_ms", g_shown.since_ms);
    jb_str(b, "for", g_shown.why == GR_WAIT_WAKE ? "wake" : "alloc");
    jb_obj_end(b);
  }
  pthread_mutex_unlock(&g_mu);
}

bool gr_wait_begin(gr_wait_t *w, uint64_t bytes, int device, const char *uuid, int why, uint64_t bound_ms) {
  const gr_options_t *o = gr_opt();
  if ((!o->wait && why == GR_WAIT_ALLOC) || !o->status || gr_tls.hook_depth > 1 || gr_admit_held() ||
      gr_capture_running(NULL))
    return false;
  const char *dir = gr_report_rundir();
  if (!dir)
    return false;
  if (device < 0 && (device = gr_reg_here_device()) < 0)
    return false;
  memset(w, 0, sizeof *w);
  w->fd = -1;
  w->slot = -1;
  w->device = device;
  w->why = why;
  w->bytes = bytes;
  if (uuid)
    snprintf(w->uuid, sizeof w->uuid, "%s", uuid);
  if ((!uuid && !gr_report_gpu_uuid(device, w->uuid, sizeof w->uuid)) || !w->uuid[0] ||
      !others_on_gpu(dir, w->uuid, why == GR_WAIT_WAKE ? -1 : device, false))
    return false;
  w->within = gr_wait_within_guarantee(why == GR_WAIT_WAKE ? -1 : device, bytes);
  char path[4200];
  snprintf(path, sizeof path, "%s/gpu-%s.wait", dir, w->uuid);
  w->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  qfile_t q;
  if (w->fd < 0 || !q_lock_read(w->fd, &q)) {
    if (w->fd >= 0)
      close(w->fd);
    return false;
  }
  q_sweep(&q);
  uint64_t now = gr_mono_ns();
  for (int i = 0; i < GR_WAIT_SLOTS && w->slot < 0; i++)
    if (!q.s[i].ticket)
      w->slot = i;
  if (w->slot < 0) {
    flock(w->fd, LOCK_UN);
    close(w->fd);
    gr_info("wait: %d waiters on %s already, the most one GPU queues: not waiting", GR_WAIT_SLOTS, w->uuid);
    return false;
  }
  w->ticket = ++q.next_ticket;
  w->since_ms = gr_wall_ms();
  w->t0_ns = now;
  w->deadline_ns = now + (bound_ms ? bound_ms : (uint64_t)o->wait * 1000) * 1000000ull;
  w->last_peer_check_ns = now;
  qslot_t *s = &q.s[w->slot];
  s->pid = (int32_t)getpid();
  s->tid = (int32_t)syscall(SYS_gettid);
  s->ticket = w->ticket;
  s->since_ms = w->since_ms;
  s->beat_ns = now;
  s->stale_ns = ((uint64_t)o->peer_timeout_ms + 1000) * 1000000ull;
  s->bytes = bytes;
  s->within = w->within;
  s->why = (uint32_t)why;
  q_write_unlock(w->fd, &q);
  atomic_fetch_add_explicit(&g_active, 1, memory_order_acq_rel);
  show(w);
  gr_report_status_update();
  char bb[32];
  gr_info("waiting up to %.1f s for %s on %s (%s, ticket %llu%s)",
          (double)(w->deadline_ns - now) / 1e9, gr_log_bytes(bytes, bb, sizeof bb), w->uuid,
          why == GR_WAIT_WAKE ? "a wake" : "an allocation", (unsigned long long)w->ticket,
          w->within ? ", within its guarantee" : "");
  return true;
}

static void nap(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool gr_wait_turn(gr_wait_t *w) {
  if (w->last)
    return false; /* its one last try was made */
  qfile_t q;
  for (;;) {
    uint64_t now = gr_mono_ns();
    if (now >= w->deadline_ns)
      return false;
    if (now - w->last_peer_check_ns >= PEER_CHECK_NS) {
      w->last_peer_check_ns = now;
      const char *dir = gr_report_rundir();
      bool head = false;
      qfile_t h;
      if (q_lock_read(w->fd, &h)) {
        head = q_head(&h, now) == w->slot;
        flock(w->fd, LOCK_UN);
      }
      if (!dir || !others_on_gpu(dir, w->uuid, w->why == GR_WAIT_WAKE ? -1 : w->device, head)) {
        w->last = true; /* nobody left to free anything: one last try (the last one may just have exited) */
        return true;
      }
    }
    int head = -1;
    if (q_lock_read(w->fd, &q)) {
      q_sweep(&q);
      qslot_t *s = &q.s[w->slot];
      if (s->ticket != w->ticket) { /* swept by mistake (a reused slot cannot be: we hold it): back in, same turn */
        memset(s, 0, sizeof *s);
        s->pid = (int32_t)getpid();
        s->tid = (int32_t)syscall(SYS_gettid);
        s->ticket = w->ticket;
        s->since_ms = w->since_ms;
        s->stale_ns = ((uint64_t)gr_opt()->peer_timeout_ms + 1000) * 1000000ull;
        s->bytes = w->bytes;
        s->within = w->within;
        s->why = (uint32_t)w->why;
      }
      s->beat_ns = now;
      head = q_head(&q, now);
      q_write_unlock(w->fd, &q);
    }
    if (head == w->slot || head < 0) {
      if (w->tries && now - w->last_try_ns < TRY_NS) {
        nap(TRY_NS - (now - w->last_try_ns));
        continue; /* look again: a waiter within its guarantee may have come meanwhile */
      }
      w->head_once = true;
      gr_debug("wait: turn of ticket %llu (slot %d, head %d)", (unsigned long long)w->ticket, w->slot, head);
      w->tries++;
      w->last_try_ns = gr_mono_ns();
      return true;
    }
    nap(NAP_NS);
  }
}

bool gr_wait_ask_due(gr_wait_t *w) {
  uint64_t now = gr_mono_ns();
  if (w->asks && now - w->last_ask_ns < GR_WAIT_ASK_MS * 1000000ull)
    return false;
  w->asks++;
  w->last_ask_ns = now;
  return true;
}

void gr_wait_end(gr_wait_t *w, bool served) {
  qfile_t q;
  if (q_lock_read(w->fd, &q)) {
    if (q.s[w->slot].ticket == w->ticket)
      memset(&q.s[w->slot], 0, sizeof q.s[w->slot]);
    q_write_unlock(w->fd, &q);
  }
  close(w->fd);
  w->fd = -1;
  pthread_mutex_lock(&g_mu);
  if (g_shown.on && g_shown.since_ms == w->since_ms && !strcmp(g_shown.uuid, w->uuid) && g_shown.bytes == w->bytes)
    g_shown.on = false;
  pthread_mutex_unlock(&g_mu);
  atomic_fetch_sub_explicit(&g_active, 1, memory_order_acq_rel);
  double ms = (double)(gr_mono_ns() - w->t0_ns) / 1e6;
  const char *ended = served                             ? "served"
                      : gr_mono_ns() >= w->deadline_ns ? "timeout"
                                                       : "no other process on the GPU that could free memory";
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "event", "wait");
  jb_i64(&b, "pid", getpid());
  jb_i64(&b, "device", w->device);
  jb_str(&b, "uuid", w->uuid);
  jb_str(&b, "for", w->why == GR_WAIT_WAKE ? "wake" : "alloc");
  jb_u64(&b, "bytes", w->bytes);
  jb_u64(&b, "ticket", w->ticket);
  jb_bool(&b, "within_guarantee", w->within);
  jb_u64(&b, "since_ms", w->since_ms);
  jb_f64(&b, "ms", ms);
  jb_u64(&b, "tries", w->tries);
  jb_u64(&b, "asks", w->asks);
  jb_bool(&b, "served", served);
  jb_str(&b, "ended", ended);
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  gr_report_event(&b);
  jb_free(&b);
  gr_report_status_update();
  char bb[32];
  gr_info("wait for %s on %s ended after %.1f ms: %s", gr_log_bytes(w->bytes, bb, sizeof bb), w->uuid, ms, ended);
}

bool gr_wait_queue_busy(const char *uuid) {
  const char *dir = gr_report_rundir();
  if (!dir || !gr_opt()->status)
    return false;
  char path[4200];
  snprintf(path, sizeof path, "%s/gpu-%s.wait", dir, uuid);
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return false;
  qfile_t q;
  bool busy = false;
  if (q_lock_read(fd, &q)) {
    uint64_t now = gr_mono_ns();
    for (int i = 0; i < GR_WAIT_SLOTS && !busy; i++) {
      const qslot_t *s = &q.s[i];
      busy = s->ticket && s->pid != (int32_t)getpid() && !(now > s->beat_ns && now - s->beat_ns > s->stale_ns) &&
             !(kill(s->pid, 0) != 0 && errno == ESRCH);
    }
    flock(fd, LOCK_UN);
  }
  close(fd);
  return busy;
}

void gr_wait_atfork_child(void) {
  pthread_mutex_init(&g_mu, NULL);
  atomic_store_explicit(&g_active, 0, memory_order_relaxed);
  g_shown.on = false;
}
