/*
 * control.c -- the control socket the gpureclaim command talks to (docs/PROTOCOL.md).
 *
 * A Unix stream socket in the private run directory, served by the worker thread one client at a time: one
 * request line in, one JSON object out. Only a peer with the same effective uid is answered (SO_PEERCRED), on
 * top of the directory's 0700 and the socket's 0600. A client silent for a second is dropped unanswered. A
 * release whose client hung up before it was served is not run (client_waiting()); `release-begun` first says
 * when it begins, so that a client that gives up can tell withdrawn from begun. Answers are sent with
 * MSG_NOSIGNAL: the worker blocks every signal, but a SIGPIPE left pending on it for a client that went away
 * serves nothing. A sleep is asked whether its client still waits twice: before it is served, and once more at
 * its last moment before the checkpoint (sleep_wanted), so that a client that hung up at any time before the sleep
 * began gets none.
 */
#include "control.h"
#include "release.h"
#include "sig.h"
#include "give.h"
#include "sleep.h"
#include "report.h"
#include "json.h"
#include "options.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_fd = -1;
static char g_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

int gr_control_fd(void) { return atomic_load_explicit(&g_fd, memory_order_acquire); }

int gr_control_open(void) {
  const char *dir = gr_report_rundir();
  if (!dir)
    return -ENOENT;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", dir, (int)getpid()) >= (int)sizeof sa.sun_path) {
    gr_warn("the run directory path is too long for a socket; the gpureclaim command will use the signal only");
    return -ENAMETOOLONG;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  unlink(sa.sun_path); /* a leftover of an earlier process with this pid */
  /* The kernel's largest backlog: the worker serves one client at a time, and a busy process (a peer reclaim of
   * many peers, `gpureclaim top` polling) must not look unreachable to the next connection. */
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(sa.sun_path, 0600) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    gr_warn("cannot open the control socket %s: %s", sa.sun_path, strerror(e));
    close(fd);
    unlink(sa.sun_path);
    return -e;
  }
  memcpy(g_path, sa.sun_path, sizeof g_path);
  atomic_store_explicit(&g_fd, fd, memory_order_release);
  gr_report_status_socket(g_path);
  return 0;
}

void gr_control_close(void) {
  int fd = atomic_exchange_explicit(&g_fd, -1, memory_order_acq_rel);
  if (fd >= 0) {
    gr_report_status_socket(NULL);
    close(fd);
    unlink(g_path);
  }
}

void gr_control_forget(void) {
  /* In a forked child: the socket is the parent's; close our copy, leave the file. */
  int fd = atomic_exchange_explicit(&g_fd, -1, memory_order_acq_rel);
  if (fd >= 0)
    close(fd); /* the status file's socket entry is the parent's too: gr_report_atfork_child clears it */
}

/* Whether the client still waits for the answer. A command whose --timeout passed (this process was stopped,
 * or busy in a long release) has closed its end and told its user the release did not happen: its request is
 * withdrawn, and running it later would free memory behind that user's back. For `release`, POLLHUP only: a
 * client that shut down its writing half after its line (socat, nc -U) still reads. For `release-begun`, whose
 * client withdraws by shutting down its writing half, that counts too (POLLRDHUP). */
static bool client_waiting(int fd, bool half_close_withdraws) {
  struct pollfd p = {fd, half_close_withdraws ? POLLRDHUP : 0, 0};
  return poll(&p, 1, 0) == 0 || !(p.revents & (POLLHUP | POLLERR | POLLRDHUP));
}

/* Writes all of b to the client, without raising SIGPIPE (a client that gave up gets nothing, and the worker,
 * which blocks every signal, keeps no pending SIGPIPE). */
static int send_all(int fd, const jbuf_t *b) {
  if (b->failed)
    return -ENOMEM;
  for (size_t off = 0; off < b->len;) {
    ssize_t n = send(fd, b->p + off, b->len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return n < 0 ? -errno : -EIO;
    off += (size_t)n;
  }
  return 0;
}

/* A progress line of a sleep, sent as it goes (a client that left gets nothing; the sleep goes on). */
static void sleep_progress(const char *phase, uint64_t done, uint64_t total, void *arg) {
  jbuf_t p;
  jb_init(&p);
  jb_obj(&p);
  jb_bool(&p, "ok", true);
  jb_str(&p, "progress", phase);
  jb_u64(&p, "done_bytes", done);
  jb_u64(&p, "total_bytes", total);
  jb_obj_end(&p);
  jb_raw(&p, "\n", 1);
  send_all(*(int *)arg, &p);
  jb_free(&p);
}

/* Whether the client of a sleep still waits, asked again at the sleep's last moment before its checkpoint: a client
 * that hung up while the sleep's release, synchronisation or lock took their time (one that sent its line and
 * closed at once, or a command whose --timeout passed) gets no sleep, whenever it hung up before that moment. */
static bool sleep_wanted(void *arg) { return client_waiting(*(int *)arg, false); }

/* Answers one request line; NULL for a line longer than the protocol allows. pid: the client's (SO_PEERCRED). */
static void answer(int fd, const char *line, int pid) {
  size_t verb;
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  if (!line) {
    jb_bool(&b, "ok", false);
    jb_str(&b, "error", "request line longer than 255 bytes");
  } else if (strcmp(line, "ping") == 0) {
    jb_bool(&b, "ok", true);
    jb_i64(&b, "pid", getpid());
    jb_str(&b, "version", GPURECLAIM_VERSION_STRING);
    jb_bool(&b, "signal_caught", gr_sig_caught());
  } else if (strcmp(line, "stats") == 0) {
    jb_bool(&b, "ok", true);
    jb_i64(&b, "pid", getpid());
    gr_report_stats_json(&b);
  } else if ((verb = 7, strncmp(line, "release", 7) == 0 && (line[7] == ' ' || line[7] == '\0')) ||
             (verb = 13, strncmp(line, "release-begun", 13) == 0 && (line[13] == ' ' || line[13] == '\0'))) {
    unsigned what = gr_opt()->on_signal;
    const char *arg = line[verb] ? line + verb + 1 : "";
    bool announce = verb == 13;
    gpureclaim_report_t rep = {.size = sizeof rep};
    bool bad = *arg && gr_opt_parse_what(arg, &what) != 0;
    if (!client_waiting(fd, announce)) {
      gr_info("a release request was withdrawn: the gpureclaim command stopped waiting before it was served");
      jb_free(&b);
      return;
    }
    /* release-begun: a first line says the release begins, so that a client that gives up afterwards knows
     * it will still happen (a release cannot be stopped once begun). If it cannot be sent, the client is gone
     * and was told the request was withdrawn: not begun. */
    bool asleep = gr_sleep_state_now(NULL) != GPURECLAIM_STATE_AWAKE;
    if (announce && !bad && !asleep) {
      jbuf_t first;
      jb_init(&first);
      jb_obj(&first);
      jb_bool(&first, "ok", true);
      jb_bool(&first, "begun", true);
      jb_obj_end(&first);
      jb_raw(&first, "\n", 1);
      int sent = send_all(fd, &first);
      jb_free(&first);
      if (sent != 0) {
        gr_info("a release request was withdrawn: the gpureclaim command stopped waiting before it was served");
        jb_free(&b);
        return;
      }
    }
    int rc = bad ? -EINVAL : asleep ? -EAGAIN : gr_release_run(what, GPURECLAIM_TRIGGER_COMMAND, &rep);
    jb_bool(&b, "ok", rc == 0);
    if (rc == 0) {
      jb_key(&b, "report");
      gr_report_release_json(&b, &rep);
    } else {
      jb_str(&b, "error", rc == -EINVAL   ? "bad release categories (expected cached, orphaned, all)"
                          : rc == -EAGAIN ? "the process sleeps: its device memory is on the host, nothing to release"
                          : rc == -EBUSY  ? "a CUDA graph is being captured: the driver forbids the frees and "
                                            "synchronizations a release makes until the capture ends; ask again then"
                                          : strerror(-rc));
    }
  } else if (strncmp(line, "give ", 5) == 0 || strcmp(line, "give") == 0) {
    /* A peer ran out of memory on a GPU we use (give.c). Not run for a client that already hung up. */
    if (!client_waiting(fd, false)) {
      jb_free(&b);
      return;
    }
    gr_give_serve(line[4] ? line + 5 : "", pid, &b);
  } else if (strncmp(line, "sleep", 5) == 0 && (line[5] == ' ' || line[5] == '\0')) {
    unsigned long long ms = 0;
    if (line[5] && gr_opt_parse_uint(line + 6, 86400000ULL, &ms) != 0) {
      jb_bool(&b, "ok", false);
      jb_str(&b, "error", "bad timeout (expected milliseconds)");
    } else if (!client_waiting(fd, false)) {
      /* The client gave up before this request was served (the process was stopped, or busy serving another
       * client): a sleep nobody waits for any more is not begun. */
      jb_free(&b);
      return;
    } else {
      gpureclaim_sleep_report_t rep = {.size = sizeof rep};
      int rc = gr_sleep_run_progress(GPURECLAIM_TRIGGER_COMMAND, (unsigned)ms, &rep, sleep_progress,
                                     sleep_wanted, &fd);
      jb_bool(&b, "ok", rc == 0 || rc == -EALREADY);
      jb_bool(&b, "already", rc == -EALREADY);
      jb_key(&b, "report");
      gr_sleep_report_json(&b, &rep);
      if (rc != 0)
        jb_str(&b, "error", rep.reason[0] ? rep.reason : strerror(-rc));
    }
  } else if (strcmp(line, "wake") == 0) {
    uint64_t host = 0;
    bool was_awake = gr_sleep_state_now(&host) == GPURECLAIM_STATE_AWAKE;
    if (!was_awake)
      sleep_progress("restoring", 0, host, &fd);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = gr_sleep_wake(GPURECLAIM_TRIGGER_COMMAND);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0 && host)
      sleep_progress("restored", host, host, &fd);
    jb_bool(&b, "ok", rc == 0);
    jb_bool(&b, "already", was_awake && rc == 0);
    jb_u64(&b, "bytes", host);
    jb_f64(&b, "ms", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    if (rc != 0)
      jb_str(&b, "error", rc == -ENOMEM ? "no room on the device within GPURECLAIM_WAKE_TIMEOUT: the process "
                                          "stays asleep" : "the driver refused the restore: the process stays asleep");
  } else if (strcmp(line, "snapshot") == 0) {
    jb_bool(&b, "ok", true);
    jb_key(&b, "snapshot");
    gr_report_snapshot_json(&b);
  } else if (strcmp(line, "leaks") == 0) {
    jb_bool(&b, "ok", true);
    jb_key(&b, "leaks");
    gr_report_leaks(&b, true);
  } else {
    jb_bool(&b, "ok", false);
    char msg[320];
    snprintf(msg, sizeof msg, "unknown request: %.255s", line);
    jb_str(&b, "error", msg);
  }
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  send_all(fd, &b);
  jb_free(&b);
}

/* Reads the request line, one deadline for the whole of it (a client sending a byte now and then gets no more
 * time than a silent one). Returns 1 with the line (without its newline; a line the client ended by closing
 * counts), 0 when nothing complete came in time or the client left mid-line, -1 when it is longer than
 * cap - 2 bytes (the newline takes a byte of line too). */
static int read_line(int fd, char *line, size_t cap, size_t *len, const struct timespec *deadline) {
  size_t n = 0;
  for (;;) {
    if (n == cap - 1)
      return -1;
    struct pollfd p = {fd, POLLIN, 0};
    int left = gr_ms_until(deadline);
    int pr = left ? poll(&p, 1, left) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      return 0;
    ssize_t r = read(fd, line + n, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return 0;
    if (r == 0 || line[n] == '\n') {
      *len = n;
      return r > 0 || n > 0;
    }
    n++;
  }
}

/* Reads what is left of an over-long line until its end or the deadline: closing with unread bytes would
 * reset the connection before the client read its answer. */
static void drain(int fd, const struct timespec *deadline) {
  char buf[512];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int left = gr_ms_until(deadline);
    if (!left || poll(&p, 1, left) <= 0)
      return;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0 || memchr(buf, '\n', (size_t)r))
      return;
  }
}

void gr_control_serve_one(void) {
  int lfd = gr_control_fd();
  if (lfd < 0)
    return;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
    /* Another user (root can reach the socket): refused unanswered, and logged. */
    jbuf_t ev;
    jb_init(&ev);
    jb_obj(&ev);
    jb_str(&ev, "event", "refused");
    jb_i64(&ev, "pid", getpid());
    jb_i64(&ev, "client_pid", len == sizeof cred ? cred.pid : -1);
    jb_i64(&ev, "client_uid", len == sizeof cred ? (int64_t)cred.uid : -1);
    jb_obj_end(&ev);
    jb_raw(&ev, "\n", 1);
    gr_report_event(&ev);
    jb_free(&ev);
    gr_warn_once(w_refused, "refused a control-socket client of another user (uid %d, pid %d)",
                 len == sizeof cred ? (int)cred.uid : -1, len == sizeof cred ? (int)cred.pid : -1);
    close(fd);
    return;
  }
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  /* The worker serves releases by signal too: a client that does not send its line within a second (the
   * command writes it as soon as it is connected) is dropped unanswered. */
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += 1;
  char line[257]; /* 255 bytes, the newline read after them, and the terminating NUL */
  size_t n = 0;
  int got = read_line(fd, line, sizeof line, &n, &deadline);
  if (got < 0) {
    answer(fd, NULL, cred.pid);
    drain(fd, &deadline);
  } else if (got > 0) {
    while (n && line[n - 1] == '\r')
      n--;
    line[n] = '\0';
    answer(fd, line, cred.pid);
  }
  close(fd);
}
