/* The control socket's request handling (src/serve/control.c, docs/PROTOCOL.md), served in this thread: the client's
 * bytes are all sent before gr_control_serve_one runs, and the answer (one short JSON object) fits the socket's
 * buffer, so nothing waits on the other side. Known requests answer as the protocol says; unknown, malformed
 * and over-long ones get {"ok": false, "error": ...}; a client that sends nothing or leaves is dropped without
 * harm. Each test runs in a process of its own with a private run directory. */
#include "gpureclaim_internal.h"
#include "jsonread.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char g_dir[64];

static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/grctlXXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
  cr_assert_eq(chmod(g_dir, 0700), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", g_dir, 1), 0);
  cr_assert_eq(gr_control_open(), 0);
  cr_assert_geq(gr_control_fd(), 0);
}

static void teardown(void) {
  char sock[128];
  snprintf(sock, sizeof sock, "%s/%d.sock", g_dir, (int)getpid());
  gr_control_close();
  cr_assert_neq(access(sock, F_OK), 0, "the socket file stayed after close");
  rmdir(g_dir);
}

TestSuite(control, .init = setup, .fini = teardown);

/* Connects, sends len bytes of req (then shuts down the writing half when close_after), serves one client and
 * returns what came back (malloc'd, "" for nothing). */
static char *exchange(const char *req, size_t len, bool close_after) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", g_dir, (int)getpid());
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(c, 0);
  cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
  if (len)
    cr_assert_eq(send(c, req, len, MSG_NOSIGNAL), (ssize_t)len);
  if (close_after)
    shutdown(c, SHUT_WR);
  gr_control_serve_one();
  size_t cap = 65536, n = 0;
  char *out = malloc(cap);
  cr_assert_not_null(out);
  ssize_t r;
  while (n < cap - 1 && (r = recv(c, out + n, cap - 1 - n, 0)) > 0)
    n += (size_t)r;
  out[n] = '\0';
  close(c);
  return out;
}

static jnode_t *answer_to(const char *line) {
  char *out = exchange(line, strlen(line), false);
  size_t n = strlen(out);
  cr_assert(n && out[n - 1] == '\n', "no answer line to %s: [%s]", line, out);
  const char *err = NULL;
  jnode_t *j = jparse_object(out, &err);
  cr_assert_not_null(j, "the answer is not a JSON object (%s): %s", err, out);
  free(out);
  return j;
}

static void expect_error(const char *line, const char *error_start) {
  jnode_t *j = answer_to(line);
  cr_assert_eq(jbool(j, "ok", true), false, "%s was accepted", line);
  const char *e = jstr(j, "error", "");
  cr_assert(!strncmp(e, error_start, strlen(error_start)), "error for [%.40s]: %s", line, e);
  jdelete(j);
}

Test(control, ping_answers_pid_and_version) {
  jnode_t *j = answer_to("ping\n");
  cr_assert(jbool(j, "ok", false));
  cr_assert_eq(jint(j, "pid", -1), getpid());
  cr_assert_str_eq(jstr(j, "version", ""), GPURECLAIM_VERSION_STRING);
  cr_assert_eq(jget(j, "signal_caught")->type, JN_BOOL);
  jdelete(j);
}

Test(control, a_carriage_return_before_the_newline_is_ignored) {
  jnode_t *j = answer_to("ping\r\n");
  cr_assert(jbool(j, "ok", false), "ping\\r\\n was not taken for ping");
  jdelete(j);
}

Test(control, a_line_the_client_ends_by_closing_is_answered) {
  char *out = exchange("ping", 4, true);
  cr_assert(strstr(out, "\"ok\":true") || strstr(out, "\"ok\": true"), "[%s]", out);
  free(out);
}

Test(control, an_unknown_request_is_named_in_the_error) {
  expect_error("frobnicate now\n", "unknown request: frobnicate now");
  expect_error("\n", "unknown request: ");
  expect_error("pingpong\n", "unknown request: pingpong");
  expect_error("releasex\n", "unknown request: releasex");
}

Test(control, bad_arguments_are_refused_without_running_anything) {
  expect_error("release everything\n", "bad release categories");
  expect_error("release-begun nothing\n", "bad release categories");
  expect_error("sleep soon\n", "bad timeout");
  expect_error("sleep 99999999999\n", "bad timeout");
  gpureclaim_stats_t s = {.size = sizeof s};
  cr_assert_eq(gr_stats_get(-1, &s), 0);
  cr_assert_eq(s.releases, 0, "a refused release ran");
}

/* The protocol allows 255 bytes before the newline: 255 are served, 256 refused. */
static char *line_of(size_t n, char fill) {
  char *l = malloc(n + 2);
  cr_assert_not_null(l);
  memset(l, fill, n);
  l[n] = '\n';
  l[n + 1] = '\0';
  return l;
}

Test(control, a_line_of_255_bytes_is_served) {
  char *l = line_of(255, 'x');
  expect_error(l, "unknown request: xxxx");
  free(l);
}

Test(control, a_longer_line_is_refused_and_the_next_client_is_served) {
  char *l = line_of(256, 'y');
  expect_error(l, "request line longer than 255 bytes");
  free(l);
  l = line_of(4000, 'z');
  expect_error(l, "request line longer than 255 bytes");
  free(l);
  jnode_t *j = answer_to("ping\n");
  cr_assert(jbool(j, "ok", false), "the socket no longer serves after an over-long line");
  jdelete(j);
}

/* Dropped unanswered: a client that sends nothing (after the 1 s deadline) or leaves at once. */
Test(control, a_silent_or_departed_client_gets_no_answer) {
  char *out = exchange("", 0, false);
  cr_assert_str_eq(out, "", "a silent client was answered: %s", out);
  free(out);
  out = exchange("", 0, true);
  cr_assert_str_eq(out, "", "a client that left was answered: %s", out);
  free(out);
  jnode_t *j = answer_to("ping\n");
  cr_assert(jbool(j, "ok", false));
  jdelete(j);
}

Test(control, leaks_and_stats_answer_their_objects) {
  jnode_t *j = answer_to("leaks\n");
  cr_assert(jbool(j, "ok", false));
  cr_assert_eq(jint(jget(j, "leaks"), "blocks", -1), 0);
  jdelete(j);
  j = answer_to("stats\n");
  cr_assert(jbool(j, "ok", false));
  cr_assert_not_null(jget(j, "total"));
  cr_assert_eq(jget(j, "devices")->type, JN_ARR);
  jdelete(j);
}
