/*
 * sock.c -- the command's client of a process's control socket (docs/PROTOCOL.md): one connect with a deadline,
 * one send of a request line (cmd_sock_request: both), one read loop. cmd_ask() (one request, one answer) is
 * built on them here; release's release-begun exchange (cmd_release.c) and sleep's and wake's progress lines
 * (cmd_sleep.c) use the same pieces.
 */
#include "command.h"
#include "common.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct timespec cmd_deadline_in(double timeout) {
  struct timespec d;
  clock_gettime(CLOCK_MONOTONIC, &d);
  d.tv_sec += (time_t)timeout;
  d.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
  if (d.tv_nsec >= 1000000000L) {
    d.tv_sec++;
    d.tv_nsec -= 1000000000L;
  }
  return d;
}

int cmd_sock_connect(const proc_t *p, double timeout, const char **why, bool *no_listener) {
  *no_listener = false;
  const char *sock = jstr(p->status, "socket", NULL);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (!sock) {
    *why = "the process has no control socket";
    *no_listener = true;
    return -1;
  }
  if (strlen(sock) >= sizeof sa.sun_path) {
    *why = "socket path too long";
    return -1;
  }
  strcpy(sa.sun_path, sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = strerror(errno);
    return -1;
  }
  struct timeval tv = {(time_t)timeout, (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds a connect to a full backlog */
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    *why = e == EAGAIN || e == EINPROGRESS ? "timed out connecting to its control socket" : strerror(e);
    *no_listener = e == ENOENT || e == ECONNREFUSED;
    close(fd);
    return -1;
  }
  return fd;
}

int cmd_sock_send(int fd, const char *line, const char **why) {
  if (send(fd, line, strlen(line), MSG_NOSIGNAL) < 0) {
    *why = strerror(errno);
    return -1;
  }
  return 0;
}

int cmd_sock_request(const proc_t *p, const char *request, double timeout, const char **why, bool *no_listener) {
  int fd = cmd_sock_connect(p, timeout, why, no_listener);
  if (fd < 0)
    return -1;
  char line[300];
  snprintf(line, sizeof line, "%s\n", request);
  if (cmd_sock_send(fd, line, why) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int cmd_sock_read(int fd, char **buf, size_t *n, size_t *cap, const struct timespec *deadline, bool stop_at_line) {
  for (;;) {
    if (stop_at_line && memchr(*buf, '\n', *n))
      return 2;
    struct pollfd pfd = {fd, POLLIN, 0};
    int wait = gr_ms_until(deadline);
    int pr = wait ? poll(&pfd, 1, wait) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0)
      return 0;
    if (*n + 1 >= *cap) {
      char *t = realloc(*buf, *cap * 2);
      if (!t)
        return -1;
      *buf = t;
      *cap *= 2;
    }
    ssize_t r = pr < 0 ? -1 : read(fd, *buf + *n, *cap - *n - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0)
      return 1;
    *n += (size_t)r;
    (*buf)[*n] = '\0';
  }
}

int cmd_connect_check(const proc_t *p) {
  const char *sock = jstr(p->status, "socket", NULL);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (!sock || strlen(sock) >= sizeof sa.sun_path)
    return 1;
  strcpy(sa.sun_path, sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : -errno;
  close(fd); /* the server reads end of file at once, and drops the connection */
  return rc;
}

const char cmd_why_timed_out[] = "timed out waiting for its answer";

jnode_t *cmd_ask(const proc_t *p, const char *request, double timeout, const char **why, bool *no_listener) {
  bool none = false;
  /* The whole exchange, connect included, shares one deadline: a process that stopped serving (stopped with
   * SIGSTOP, stuck in a release) must not hold the command longer than --timeout. */
  struct timespec deadline = cmd_deadline_in(timeout);
  int fd = cmd_sock_request(p, request, timeout, why, &none);
  if (no_listener)
    *no_listener = none;
  if (fd < 0)
    return NULL;
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  int r = buf ? (buf[0] = '\0', cmd_sock_read(fd, &buf, &n, &cap, &deadline, false)) : -1;
  close(fd);
  if (!buf || (r < 0 && errno == ENOMEM)) {
    *why = "out of memory";
    free(buf);
    return NULL;
  }
  if (r == 0 || n == 0) {
    *why = r == 0 ? cmd_why_timed_out : "it closed the connection without answering";
    free(buf);
    return NULL;
  }
  const char *perr = NULL;
  jnode_t *j = jparse_object(buf, &perr);
  free(buf);
  if (!j)
    *why = "its answer is not a JSON object";
  return j;
}
