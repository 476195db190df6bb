/*
 * status.c -- the per-process status file, <run directory>/<pid>.json (docs/PROTOCOL.md): who this process is,
 * its control socket, its last releases, its sleep state and what peers may ask of it. Always a new file
 * renamed into place: a reader never sees half a file, and whatever else is at the path in the private
 * directory (a link, a FIFO) is replaced, never written through. Nothing here runs inside an allocation.
 */
#include "sig.h"
#include "json.h"
#include "outfile.h"
#include "report.h"
#include "options.h"
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>

/* ---- the status file ---- */

static void read_file(const char *path, char *buf, size_t len, size_t *got) {
  *got = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  ssize_t n;
  while (*got < len - 1 && (n = read(fd, buf + *got, len - 1 - *got)) > 0)
    *got += (size_t)n;
  close(fd);
  buf[*got] = '\0';
}

static uint64_t start_ticks(void) {
  char buf[1024];
  size_t n;
  read_file("/proc/self/stat", buf, sizeof buf, &n);
  (void)n;
  return gr_stat_start_ticks(buf);
}

static _Atomic uint64_t g_status_releases;
static gpureclaim_report_t g_last_report;
static bool g_have_last;
/* Releases that served a release signal, and the last of them: `gpureclaim release --signal` waits for this
 * count to grow and shows that report, not whatever release (of another client) happened to end first. */
static uint64_t g_signal_releases;
static gpureclaim_report_t g_last_signal_report;
static pthread_mutex_t g_status_lock = PTHREAD_MUTEX_INITIALIZER;
/* Under g_status_lock: the state each status file shows is numbered when it is read, and a file is renamed into
 * place only if its number is above that of the file there. Two updates at once (a release on one thread, a
 * scope end on another) otherwise could rename theirs in either order and leave the older status in place. */
static uint64_t g_status_numbered, g_status_placed;
/* Under g_status_lock: set at exit, after which no status file is written; and the updates between their check
 * of it and their rename. Exit waits for those, then removes the file: a release on another thread while the
 * process exits re-created the status file after its removal, or left its temporary file half-written. */
static bool g_status_closed;
/* The control socket's path while it is open ("" otherwise), as its opener hands it over. */
static char g_status_socket[4200];

void gr_report_status_socket(const char *path) {
  pthread_mutex_lock(&g_status_lock);
  snprintf(g_status_socket, sizeof g_status_socket, "%s", path ? path : "");
  pthread_mutex_unlock(&g_status_lock);
}

/* Under g_status_lock: what the status file shows of the modules above this one ("sleep", "peer"), as core.c's
 * constructor hands it over; NULL: left out. */
static gr_report_part_fn g_part_sleep, g_part_peer;

void gr_report_status_parts(gr_report_part_fn sleep_json, gr_report_part_fn peer_json) {
  pthread_mutex_lock(&g_status_lock);
  g_part_sleep = sleep_json;
  g_part_peer = peer_json;
  pthread_mutex_unlock(&g_status_lock);
}

void gr_report_status_sleep_json(jbuf_t *b) {
  pthread_mutex_lock(&g_status_lock);
  gr_report_part_fn sleep_json = g_part_sleep;
  pthread_mutex_unlock(&g_status_lock);
  if (sleep_json)
    sleep_json(b);
}

static unsigned g_status_writers;
static pthread_cond_t g_status_done = PTHREAD_COND_INITIALIZER;

int gr_report_status_update(void) {
  const gr_options_t *o = gr_opt();
  const char *dir = o->status ? gr_report_rundir() : NULL;
  if (!dir)
    return -ENOENT;
  char path[4200], exe[4096] = "", cmd[4096];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  size_t got;
  read_file("/proc/self/cmdline", cmd, sizeof cmd, &got);
  for (size_t i = 0; got && i < got - 1; i++)
    if (cmd[i] == '\0')
      cmd[i] = ' ';
  char sig[16], what[64];
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_i64(&b, "pid", getpid());
  jb_u64(&b, "uid", geteuid());
  jb_str(&b, "version", GPURECLAIM_VERSION_STRING);
  jb_str(&b, "exe", exe);
  jb_str(&b, "cmdline", cmd);
  jb_u64(&b, "start_ticks", start_ticks());
  jb_u64(&b, "started_ms", gr_state_start_time_ms());
  jb_str(&b, "signal", gr_opt_signal_name(o->signal, sig, sizeof sig));
  jb_str(&b, "on_signal", o->on_signal_sleep ? "sleep" : gr_opt_what_name(o->on_signal, what, sizeof what));
  jb_bool(&b, "signal_caught", gr_sig_caught());
  /* Where this image's AT_RANDOM bytes are: a new address at every exec (address-space randomisation), which
   * keeps the pid and start time; the command reads it back from /proc/PID/auxv. */
  jb_u64(&b, "exec_id", (uint64_t)getauxval(AT_RANDOM));
  gr_report_gpus_json(&b, false); /* ordinals and UUIDs of the GPUs it has contexts on, as of this update */
  /* What changes is read under the lock, in the order the number gives (appending to memory only). */
  pthread_mutex_lock(&g_status_lock);
  if (g_status_closed) {
    pthread_mutex_unlock(&g_status_lock);
    jb_free(&b);
    return -ESHUTDOWN;
  }
  g_status_writers++;
  uint64_t number = ++g_status_numbered;
  jb_u64(&b, "updated_ms", gr_wall_ms());
  if (g_status_socket[0])
    jb_str(&b, "socket", g_status_socket);
  else
    jb_null(&b, "socket");
  jb_u64(&b, "releases", atomic_load_explicit(&g_status_releases, memory_order_relaxed));
  if (g_have_last) {
    jb_key(&b, "last_release");
    gr_report_release_json(&b, &g_last_report);
  } else {
    jb_null(&b, "last_release");
  }
  if (g_part_sleep)
    g_part_sleep(&b);
  gr_report_part_fn peer_json = g_part_peer;
  jb_u64(&b, "signal_releases", g_signal_releases);
  if (g_signal_releases) {
    jb_key(&b, "last_signal_release");
    gr_report_release_json(&b, &g_last_signal_report);
  } else {
    jb_null(&b, "last_signal_release");
  }
  pthread_mutex_unlock(&g_status_lock);
  if (peer_json)
    peer_json(&b); /* "peer": per GPU UUID held and givable, whether it asks and gives */
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  int rc;
  if (b.failed) {
    rc = -ENOMEM;
  } else {
    /* Always a new file renamed into place: whatever else is at the path in our private directory (a link, a
     * FIFO) is replaced, never written through. Written outside the lock; only the rename, which
     * does not wait on a reader, inside it. */
    char tmp[GR_OUT_TEMP_MAX];
    /* Not flushed to disk: it describes this process while it runs (the worker rewrites it within half a second
     * of a change, a peer reclaim twice); readers need only the rename. */
    rc = gr_out_write_temp_ex(path, b.p, b.len, 0600, tmp, sizeof tmp, false);
    if (rc == 0) {
      pthread_mutex_lock(&g_status_lock);
      bool newest = number > g_status_placed;
      if (newest && rename(tmp, path) == 0)
        g_status_placed = number;
      else if (newest)
        rc = -errno;
      pthread_mutex_unlock(&g_status_lock);
      if (!newest || rc != 0)
        unlink(tmp); /* a newer status is in place already, or the rename failed */
    }
  }
  pthread_mutex_lock(&g_status_lock);
  if (--g_status_writers == 0)
    pthread_cond_broadcast(&g_status_done);
  pthread_mutex_unlock(&g_status_lock);
  jb_free(&b);
  return rc;
}

void gr_report_atfork_child(void) {
  pthread_mutex_init(&g_status_lock, NULL);
  pthread_cond_init(&g_status_done, NULL);
  g_status_closed = false;
  g_status_writers = 0;
  g_status_socket[0] = '\0'; /* the parent's socket; the child's worker opens its own */
  atomic_store_explicit(&g_status_releases, 0, memory_order_relaxed);
  g_have_last = false;
  g_signal_releases = 0;
}

void gr_report_status_remove(void) {
  pthread_mutex_lock(&g_status_lock);
  g_status_closed = true;
  /* Updates under way finish first (a write and a rename); bounded, should one be stuck in a dead filesystem. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  while (g_status_writers && pthread_cond_timedwait(&g_status_done, &g_status_lock, &until) == 0)
    ;
  const char *dir = gr_report_rundir_opened();
  if (dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    unlink(path);
  }
  pthread_mutex_unlock(&g_status_lock);
}

void gr_report_status_release(const gpureclaim_report_t *r, bool served_signal) {
  pthread_mutex_lock(&g_status_lock);
  g_last_report = *r;
  g_have_last = true;
  atomic_fetch_add_explicit(&g_status_releases, 1, memory_order_relaxed);
  if (served_signal) {
    g_last_signal_report = *r;
    g_signal_releases++;
  }
  pthread_mutex_unlock(&g_status_lock);
  if (gr_opt()->status)
    gr_report_status_update();
}
