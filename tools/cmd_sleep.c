/*
 * cmd_sleep.c -- `gpureclaim sleep PID [--timeout S] [--json]` and `gpureclaim wake PID [--timeout S] [--json]`:
 * put a process to sleep (all of its device memory goes to host memory; the process carries on unchanged when
 * it is needed again) or wake it now. Over the process's control socket (docs/PROTOCOL.md: `sleep MS`, `wake`);
 * the answer's progress lines are shown on a terminal (standard error) as bytes moved of the total.
 */
#include "command.h"
#include "common.h"
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const cmd_opt_t g_sleep_opts[] = {
    {'t', 't', "timeout", CMD_ARG, "S", "how long to wait for threads inside CUDA calls before refusing, and for the\n"
                                       "process to begin (a stopped or busy process: the sleep is then not begun)\n"
                                       "(default 10)"},
    {'j', 'j', "json", CMD_NOARG, NULL, "the report as JSON"},
    {0}};

const cmd_spec_t cmd_sleep_spec = {
    .name = "sleep",
    .usage = "sleep [options] PID",
    .summary = "all of its device memory to host memory (cached and orphaned released first); its next CUDA\n"
               "      call wakes it",
    .text = "Gives back all of the process's device memory, live memory included: a release of cached and orphaned\n"
            "memory first, then the rest moves to host memory (the driver's checkpoint API, driver 570 or later).\n"
            "The process carries on unchanged: its next CUDA call wakes it (or gpureclaim wake PID).\n",
    .opts = g_sleep_opts,
    .tail = "",
};

static const cmd_opt_t g_wake_opts[] = {
    {'t', 't', "timeout", CMD_ARG, "S", "how long to wait for the answer (default 60)"},
    {'j', 'j', "json", CMD_NOARG, NULL, "the answer as JSON"},
    {0}};

const cmd_spec_t cmd_wake_spec = {
    .name = "wake",
    .usage = "wake [options] PID",
    .summary = "wake a sleeping process now (it waits for room on the device, up to its GPURECLAIM_WAKE_TIMEOUT,\n"
               "      or its GPURECLAIM_WAIT when longer)",
    .text = "Wakes a sleeping process now: its device memory comes back once the device has room (the process waits\n"
            "in the GPU's queue of waiters up to its GPURECLAIM_WAKE_TIMEOUT, or its GPURECLAIM_WAIT when that is\n"
            "longer, and stays asleep and intact without room).\n",
    .opts = g_wake_opts,
    .tail = "",
};

static double jnum(const jnode_t *o, const char *key, double dflt) {
  const jnode_t *v = jget(o, key);
  return v && v->type == JN_NUM ? v->num : dflt;
}

/* One request; progress lines shown as they come (on a terminal), the last line parsed and returned. */
static jnode_t *exchange(const proc_t *p, const char *request, double timeout, double more, const char **why) {
  bool no_listener;
  int fd = cmd_sock_request(p, request, timeout, why, &no_listener);
  if (fd < 0)
    return NULL;
  /* The process answers at once with the first progress line (a sleep's release begins): until then the wait is
   * timeout + 1 s; each line after that gives it `more` seconds again (a sleep's copy to host memory may take
   * long, and reports its progress as it goes). A stopped or hung process is given up on after the first. */
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += (time_t)timeout + 1;
  bool tty = isatty(STDERR_FILENO), shown = false;
  char buf[65536];
  size_t n = 0;
  jnode_t *last = NULL;
  *why = cmd_why_timed_out;
  for (;;) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int wait = gr_ms_until(&deadline);
    int pr = wait ? poll(&pfd, 1, wait) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      break;
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      *why = last ? NULL : "it closed the connection without answering";
      break;
    }
    n += (size_t)r;
    buf[n] = '\0';
    char *nl;
    while ((nl = strchr(buf, '\n'))) {
      *nl = '\0';
      const char *perr = NULL;
      jnode_t *j = jparse_object(buf, &perr);
      size_t used = (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, n - used + 1);
      n -= used;
      if (!j)
        continue;
      const char *phase = jstr(j, "progress", NULL);
      if (more > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += (time_t)more;
      }
      if (phase) {
        if (tty) {
          char d[32], t[32];
          fprintf(stderr, "\r%-10s %s of %s   ", phase, cmd_bytes((uint64_t)jint(j, "done_bytes", 0), d, sizeof d),
                  cmd_bytes((uint64_t)jint(j, "total_bytes", 0), t, sizeof t));
          shown = true;
        }
        jdelete(j);
        continue;
      }
      if (last) {
        jdelete(last);
      }
      last = j;
    }
    if (n == sizeof buf - 1)
      break;
  }
  if (shown)
    fputc('\n', stderr);
  close(fd);
  if (last && *why == cmd_why_timed_out)
    *why = NULL;
  return last;
}

static int run(int argc, char **argv, bool sleeping) {
  const cmd_spec_t *spec = sleeping ? &cmd_sleep_spec : &cmd_wake_spec;
  double timeout = sleeping ? 10 : 60;
  bool json = false;
  optind = 1;
  int c;
  while ((c = cmd_getopt(argc, argv, spec)) != -1) {
    if (c == -2)
      return EX_USAGE;
    if (c == 'h')
      return cmd_help(spec);
    if (c == 'j')
      json = true;
    if (c == 't' && (!cmd_parse_seconds(optarg, &timeout) || timeout <= 0)) /* as release and snapshot have it */
      return cmd_usage_error(sleeping ? "sleep: bad timeout %s (seconds, more than 0 and at most 86400)"
                                      : "wake: bad timeout %s (seconds, more than 0 and at most 86400)", optarg);
  }
  if (optind != argc - 1)
    return cmd_usage_error("%s", sleeping ? "sleep takes one PID" : "wake takes one PID");
  pid_t pid;
  if (!cmd_parse_pid(argv[optind], &pid))
    return cmd_usage_error("not a process id: %s", argv[optind]);
  proc_t p;
  int rc = cmd_find(pid, &p);
  if (rc)
    return rc;
  char req[64];
  if (sleeping)
    snprintf(req, sizeof req, "sleep %llu", (unsigned long long)(timeout * 1000));
  const char *why = NULL;
  /* A sleep also runs a release and copies the memory: the answer may take well past the lock's timeout. */
  jnode_t *a = exchange(&p, sleeping ? req : "wake", timeout, sleeping ? timeout + 600 : 0, &why);
  rc = EX_FAILED;
  if (!a) {
    fprintf(stderr, "gpureclaim: %s %d: %s\n", sleeping ? "sleep" : "wake", (int)pid, why ? why : "no answer");
  } else {
    bool ok = jbool(a, "ok", false);
    rc = ok ? EX_OK : EX_FAILED;
    const jnode_t *r = jget(a, "report");
    if (json) {
      cmd_json_dump(stdout, a);
      fputc('\n', stdout);
    } else if (sleeping && ok && jbool(a, "already", false)) {
      char m[32];
      printf("%d: already asleep (%s on the host)\n", (int)pid,
             cmd_bytes((uint64_t)jint(r, "moved_bytes", 0), m, sizeof m));
    } else if (sleeping && r && ok) {
      char m[32], rel[32], fr[32];
      printf("%d: asleep: %s moved to host memory in %.0f ms (%s released first; the device gained %s)\n", (int)pid,
             cmd_bytes((uint64_t)jint(r, "moved_bytes", 0), m, sizeof m), jnum(r, "ms", 0),
             cmd_bytes((uint64_t)jint(r, "released_bytes", 0), rel, sizeof rel),
             cmd_bytes((uint64_t)jint(r, "device_freed_bytes", 0), fr, sizeof fr));
      if (jstr(r, "reason", NULL))
        printf("%d: %s\n", (int)pid, jstr(r, "reason", ""));
    } else if (sleeping) {
      char rel[32], left[32];
      fprintf(stderr, "gpureclaim: sleep %d: not asleep: %s\n", (int)pid, jstr(a, "error", "refused"));
      if (r)
        printf("%d: awake: %s released, %s left on the device\n", (int)pid,
               cmd_bytes((uint64_t)jint(r, "released_bytes", 0), rel, sizeof rel),
               cmd_bytes((uint64_t)jint(r, "left_bytes", 0), left, sizeof left));
    } else if (ok && jbool(a, "already", false)) {
      printf("%d: already awake\n", (int)pid);
    } else if (ok) {
      char b[32];
      printf("%d: awake: %s back on the device in %.0f ms\n", (int)pid,
             cmd_bytes((uint64_t)jint(a, "bytes", 0), b, sizeof b), jnum(a, "ms", 0));
    } else {
      fprintf(stderr, "gpureclaim: wake %d: %s\n", (int)pid, jstr(a, "error", "refused"));
    }
    jdelete(a);
  }
  cmd_free(&p);
  return rc;
}

int cmd_sleep(int argc, char **argv) { return run(argc, argv, true); }
int cmd_wake(int argc, char **argv) { return run(argc, argv, false); }
