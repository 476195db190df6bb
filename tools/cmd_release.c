/*
 * cmd_release.c -- `gpureclaim release PID...|--all`: asks each process to release, over its control socket,
 * or by its release signal (--signal, or when nothing listens on the socket) followed by a wait for its status
 * file's release count to grow. Prints what each gave back; exit status 1 if any did not answer in time.
 */
#include "command.h"
#include "ps.h"
#include "common.h"
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double seconds_since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The count a signalled release is awaited on, and its report: releases that served a release signal (a
 * library that writes them), else every release (older libraries: another client's release that ends first is
 * then taken for the signal's). */
static const char *signal_count_key(const jnode_t *status) {
  return jget(status, "signal_releases") ? "signal_releases" : "releases";
}
static const char *signal_report_key(const jnode_t *status) {
  return jget(status, "signal_releases") ? "last_signal_release" : "last_release";
}

/* Whether pid has a handler for sig (bit sig-1 of SigCgt in /proc/PID/status), or NULL with why not. A signal
 * nobody catches does what it does by default, and for the release signals that is to terminate: a process
 * that exec'd another program since gpureclaim wrote its status file (same pid, same start time; the socket
 * file is left behind, so the socket path falls back to the signal) would be killed. gpureclaim installs its
 * handler with sigaction when the process initialises CUDA (src/proc/signal.c), so a process running it catches
 * the signal. */
static bool catches(pid_t pid, int sig, const char **why) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  char *text = gr_read_file(path);
  if (!text) {
    *why = errno == ENOENT ? "the process exited" : "cannot read its /proc status to check that it catches its "
                                                    "release signal";
    return false;
  }
  const char *line = strstr(text, "\nSigCgt:");
  bool found = line != NULL, caught = false;
  if (found)
    caught = sig >= 1 && sig <= 64 && (strtoull(line + 8, NULL, 16) >> (sig - 1) & 1);
  free(text);
  if (!caught)
    *why = found ? "it does not catch its release signal: it no longer runs gpureclaim (exec?) or ignores the "
                   "signal; not sent"
                 : "cannot read its /proc status to check that it catches its release signal";
  return caught;
}

/* release_by_signal()'s *why when the process ended before its release was seen: exit status 3. */
static const char why_exited[] = "the process exited";
/* release_one()'s *why for a process asleep: its device memory is on the host, there is nothing to release on the
 * device; not a failure (a cron job releasing everything must not fail because idle sleep is on). */
static const char why_asleep[] = "asleep";

static bool is_asleep(const jnode_t *status) {
  const char *state = jstr(jget(status, "sleep"), "state", "awake");
  return strcmp(state, "awake") != 0;
}
static const char why_stale_socket[] = "nothing listens on its control socket any more: the process no longer runs "
                                       "the gpureclaim that wrote its status file (exec?); no signal sent";

/* Whether gpureclaim still catches the process's release signal, as far as can be told; *why says why not.
 * Asked (when explicit: --signal) over the control socket, which answers with the live state; else the status
 * file's word. A socket file nobody listens on means the gpureclaim that wrote the status file is gone from
 * the process (it exec'd): the signal would reach the new program. */
static bool gpureclaim_catches(const proc_t *p, const jnode_t *status, double timeout, bool explicit,
                               const char **why) {
  const jnode_t *said = status;
  jnode_t *ans = NULL;
  bool no_listener = true;
  if (explicit) {
    const char *ignored;
    ans = cmd_ask(p, "ping", timeout < 5 ? timeout : 5, &ignored, &no_listener);
    if (ans && jget(ans, "signal_caught"))
      said = ans;
  }
  if (no_listener && cmd_connect_check(p) == -ECONNREFUSED) {
    *why = why_stale_socket;
    return false;
  }
  bool caught = jbool(said, "signal_caught", true); /* absent: an older library, which does not say */
  if (ans) {
    jdelete(ans);
  }
  if (!caught)
    *why = "gpureclaim's handler for its release signal is not installed (the program installed its own, or "
           "ignores the signal): a signal would not reach gpureclaim; not sent (ask over its control socket, "
           "without --signal)";
  return caught;
}

/* Sends the process's release signal and waits for its status file to count one more release that served a
 * signal; returns the re-read status file (signal_report_key() names the report). */
static jnode_t *release_by_signal(const proc_t *p, double timeout, bool explicit, const char **why) {
  int sig = 0;
  const char *name = jstr(p->status, "signal", "USR1");
  if (gr_opt_parse_signal(name, &sig) != 0 || sig == 0) {
    if (!explicit)
      *why = "its release signal is off (GPURECLAIM_SIGNAL=off) and nothing listens on its control socket";
    else if (jstr(p->status, "socket", NULL))
      *why = "its release signal is off (GPURECLAIM_SIGNAL=off): ask over its control socket (without --signal)";
    else
      *why = "its release signal is off (GPURECLAIM_SIGNAL=off) and it has no control socket";
    return NULL;
  }
  /* Counted from the status file as read now, just before the signal: an earlier release is not taken for ours. */
  jnode_t *now = cmd_read_status(p);
  const jnode_t *base = now ? now : p->status;
  const char *count = signal_count_key(base), *report = signal_report_key(base);
  int64_t before = jint(base, count, 0);
  bool ours = gpureclaim_catches(p, base, timeout, explicit, why);
  if (now) {
    jdelete(now);
  }
  if (!ours || !catches(p->pid, sig, why))
    return NULL;
  if (kill(p->pid, sig) != 0) {
    *why = strerror(errno);
    return NULL;
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    jnode_t *s = cmd_read_status(p);
    if (s && jint(s, count, 0) > before && jget(s, report) && jget(s, report)->type == JN_OBJ)
      return s;
    if (s) {
      jdelete(s);
    }
    if (!cmd_alive(p)) { /* gone, or a zombie: kill(pid, 0) still succeeds on one */
      *why = why_exited;
      return NULL;
    }
    if (seconds_since(&t0) > timeout) {
      *why = "timed out waiting for its status file to report the release (a signal cannot be withdrawn: the "
             "process releases when it gets to it)";
      return NULL;
    }
    struct timespec nap = {0, 10000000};
    nanosleep(&nap, NULL);
  }
}

/* Whether buf starts with the line the process sends when it begins a release ({"ok":true,"begun":true}); if so
 * it is removed from buf. */
static bool take_begun_line(char *buf, size_t *n) {
  char *nl = memchr(buf, '\n', *n);
  if (!nl)
    return false;
  *nl = '\0';
  const char *err = NULL;
  jnode_t *j = jparse(buf, &err);
  bool begun = j && j->type == JN_OBJ && jbool(j, "begun", false);
  if (j) {
    jdelete(j);
  }
  if (!begun) {
    *nl = '\n';
    return false;
  }
  size_t rest = *n - (size_t)(nl + 1 - buf);
  memmove(buf, nl + 1, rest);
  *n = rest;
  buf[rest] = '\0';
  return true;
}

/* How a release asked over the socket ended when it did not answer in time. */
static const char why_begun[] = "timed out; the release had begun when the wait ended, and a release cannot be "
                                "stopped once begun: the process finishes it (gpureclaim ps shows it as its last "
                                "release once it ends)";
static const char why_withdrawn[] = "timed out before the process took the request up (it is busy or stopped); "
                                    "the request is withdrawn: the process will not run it";
static const char why_unknown_verb[] = "(an older library)";

/* Asks for a release with `release-begun` (docs/PROTOCOL.md): the process says when it begins, so that a wait
 * that times out can say truthfully whether the release was withdrawn or will still happen. At the timeout the
 * command shuts down its writing half (which withdraws a request not yet begun) and reads on for up to a
 * second: the process's "begun" line, or its closing without one. *begun is set as soon as the release begins
 * (for the progress line). Returns the answer, or NULL with *why; *why is why_unknown_verb when the process's
 * library predates release-begun (ask with cmd_ask() and "release" then). */
static jnode_t *ask_release(const proc_t *p, const char *what, double timeout, const char **why, bool *no_listener,
                            _Atomic int *begun) {
  struct timespec deadline = cmd_deadline_in(timeout);
  char request[160];
  snprintf(request, sizeof request, what ? "release-begun %s" : "release-begun", what ? what : "");
  int fd = cmd_sock_request(p, request, timeout, why, no_listener);
  if (fd < 0)
    return NULL;
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    close(fd);
    *why = "out of memory";
    return NULL;
  }
  buf[0] = '\0';
  int r;
  for (;;) { /* the "begun" line first (or the whole answer, from a request it refused) */
    r = cmd_sock_read(fd, &buf, &n, &cap, &deadline, !atomic_load(begun));
    if (r == 2 && take_begun_line(buf, &n)) {
      atomic_store(begun, 1);
      continue;
    }
    if (r == 2) /* a line that is not "begun": the answer; read it to its end */
      r = cmd_sock_read(fd, &buf, &n, &cap, &deadline, false);
    break;
  }
  if (r == 0) { /* timed out: withdraw, then see whether the process had begun */
    shutdown(fd, SHUT_WR);
    struct timespec grace = cmd_deadline_in(1);
    while (!atomic_load(begun) && cmd_sock_read(fd, &buf, &n, &cap, &grace, true) == 2 && take_begun_line(buf, &n))
      atomic_store(begun, 1);
  }
  close(fd);
  if (r <= 0 || n == 0) {
    *why = r == 0 ? (atomic_load(begun) ? why_begun : why_withdrawn)
                  : r < 0 ? "cannot read its answer" : "it closed the connection without answering";
    free(buf);
    return NULL;
  }
  const char *perr = NULL;
  jnode_t *j = jparse_object(buf, &perr);
  free(buf);
  if (!j) {
    *why = "its answer is not a JSON object";
    return NULL;
  }
  const char *err = jstr(j, "error", "");
  if (!jbool(j, "ok", false) && !strncmp(err, "unknown request: release-begun", 30)) {
    jdelete(j);
    *why = why_unknown_verb;
    return NULL;
  }
  return j;
}

static void print_report(const proc_t *p, const jnode_t *rep) {
  char b[8][32], cmdline[256];
  int64_t cached = jint(rep, "cached_bytes", 0), orph = jint(rep, "orphaned_bytes", 0), all = jint(rep, "all_bytes", 0);
  const jnode_t *ms = jget(rep, "ms");
  long long orph_n = (long long)jint(rep, "orphaned_blocks", 0), all_n = (long long)jint(rep, "all_blocks", 0),
            failed_n = (long long)jint(rep, "failed_blocks", 0);
  printf("%d (%s): released %s in %.2f ms (cached %s: pools %s, frameworks %s, releasers %s; orphaned %s in "
         "%lld block%s",
         (int)p->pid, cmd_command_of(p, cmdline, sizeof cmdline), cmd_bytes((uint64_t)(cached + orph + all), b[0], 32),
         ms && ms->type == JN_NUM ? ms->num : 0.0, cmd_bytes((uint64_t)cached, b[1], 32),
         cmd_bytes((uint64_t)jint(rep, "pool_bytes", 0), b[2], 32),
         cmd_bytes((uint64_t)jint(rep, "framework_bytes", 0), b[3], 32),
         cmd_bytes((uint64_t)jint(rep, "releaser_bytes", 0), b[4], 32), cmd_bytes((uint64_t)orph, b[5], 32), orph_n,
         gr_plural(orph_n));
  if (all)
    printf("; all %s in %lld block%s", cmd_bytes((uint64_t)all, b[6], 32), all_n, gr_plural(all_n));
  if (failed_n)
    printf("; %lld block%s the driver refused to free", failed_n, gr_plural(failed_n));
  printf(")\n");
  const jnode_t *d = jget(rep, "devices");
  for (size_t i = 0; d && d->type == JN_ARR && i < d->n; i++)
    printf("    device %lld: free %s -> %s of %s\n", (long long)jint(&d->kids[i], "device", -1),
           cmd_bytes((uint64_t)jint(&d->kids[i], "free_before", 0), b[0], 32),
           cmd_bytes((uint64_t)jint(&d->kids[i], "free_after", 0), b[1], 32),
           cmd_bytes((uint64_t)jint(&d->kids[i], "total", 0), b[2], 32));
}

typedef struct request {
  const char *what; /* --what as given, NULL for the process's own default */
  unsigned what_flags;
  double timeout;
  bool by_signal;
} request_t;

/* Releases one process; returns the answer to free and points *rep at the report inside it, or NULL with *why. */
static jnode_t *release_one(const proc_t *p, const request_t *rq, const jnode_t **rep, const char **why,
                            const char **via, _Atomic int *begun) {
  *rep = NULL;
  *via = "socket";
  jnode_t *now = cmd_read_status(p);
  bool asleep = is_asleep(now ? now : p->status);
  if (now) {
    jdelete(now);
  }
  if (asleep) {
    *why = why_asleep;
    return NULL;
  }
  if (!rq->by_signal) {
    bool no_listener = false;
    jnode_t *ans = ask_release(p, rq->what, rq->timeout, why, &no_listener, begun);
    if (!ans && *why == why_unknown_verb) { /* an older library: it does not say when it begins */
      char line[160];
      snprintf(line, sizeof line, rq->what ? "release %s" : "release", rq->what ? rq->what : "");
      ans = cmd_ask(p, line, rq->timeout, why, &no_listener);
      if (!ans && *why == cmd_why_timed_out)
        *why = "timed out waiting for its answer; the request is withdrawn unless the process had already begun "
               "the release, which then finishes (its library is too old to say which)";
    }
    if (ans) {
      if (jbool(ans, "ok", false) && (*rep = jget(ans, "report")) && (*rep)->type == JN_OBJ)
        return ans;
      *rep = NULL;
      *why = jstr(ans, "error", "it answered without a report");
      if (!strncmp(*why, "the process sleeps", 18)) /* it went to sleep meanwhile */
        *why = why_asleep;
      return ans;
    }
    if (!cmd_alive(p) || cmd_exiting(p->pid)) { /* it exited meanwhile: exit status 3, as by signal */
      *why = why_exited;
      return NULL;
    }
    if (!no_listener)
      return NULL;
    if (cmd_connect_check(p) == -ECONNREFUSED) {
      *why = why_stale_socket;
      return NULL;
    }
    if (!cmd_json_out())
      fprintf(stderr, "gpureclaim: %d: nothing listens on its control socket (%s); using its release signal\n",
              (int)p->pid, *why);
  }
  *via = "signal";
  unsigned on_signal = 0;
  const char *on = jstr(p->status, "on_signal", gr_opt_default("GPURECLAIM_ON_SIGNAL"));
  if (!strcmp(on, "sleep")) { /* GPURECLAIM_ON_SIGNAL=sleep: its signal would put it to sleep, not release */
    *why = "its signal puts it to sleep (GPURECLAIM_ON_SIGNAL=sleep), a release needs its control socket";
    return NULL;
  }
  if (rq->what && (gr_opt_parse_what(on, &on_signal) != 0 || on_signal != rq->what_flags)) {
    *why = "its signal releases what its GPURECLAIM_ON_SIGNAL says, not --what (that needs its control socket)";
    return NULL;
  }
  jnode_t *st = release_by_signal(p, rq->timeout, rq->by_signal, why);
  if (st)
    *rep = jget(st, signal_report_key(st));
  return st;
}

/* One process's release, done in a thread of its own (cmd_each_at_once) and printed afterwards, in order. */
typedef struct job {
  proc_t *p;
  const request_t *rq;
  bool skip; /* a pid given that was not found */
  jnode_t *ans;
  const jnode_t *rep;
  const char *why, *via;
  _Atomic int begun; /* the process said it began the release */
  _Atomic int done;
} job_t;

static void release_job(void *arg) {
  job_t *j = arg;
  j->why = j->via = "";
  if (!j->skip)
    j->ans = release_one(j->p, j->rq, &j->rep, &j->why, &j->via, &j->begun);
  atomic_store(&j->done, 1);
}

/* The progress line on a terminal: once the wait passes a second, standard error shows how long it has waited
 * and for how many processes, on one line redrawn in place, erased when the wait ends. */
typedef struct ticker {
  job_t *jobs;
  size_t n;
  double timeout;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stop;
} ticker_t;

static void *tick(void *arg) {
  ticker_t *t = arg;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  bool shown = false;
  pthread_mutex_lock(&t->lock);
  while (!t->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&t->cond, &t->lock, &until);
    double waited = seconds_since(&t0);
    if (t->stop || waited < 1)
      continue;
    size_t left = 0, begun = 0;
    pid_t one = 0;
    for (size_t i = 0; i < t->n; i++)
      if (!t->jobs[i].skip && !atomic_load(&t->jobs[i].done)) {
        left++;
        begun += atomic_load(&t->jobs[i].begun) != 0;
        one = t->jobs[i].p->pid;
      }
    if (!left)
      continue;
    char who[64];
    if (left == 1)
      snprintf(who, sizeof who, "%d", (int)one);
    else
      snprintf(who, sizeof who, "%zu processes", left);
    char state[64];
    if (left == 1)
      snprintf(state, sizeof state, "%s", begun ? "its release has begun" : "it has not begun the release yet");
    else
      snprintf(state, sizeof state, "%zu of them have begun their release", begun);
    fprintf(stderr, "\rgpureclaim: waiting for %s: %.0f s of %.0f s (%s)\033[K", who,
            waited < t->timeout ? waited : t->timeout, t->timeout, state);
    fflush(stderr);
    shown = true;
  }
  pthread_mutex_unlock(&t->lock);
  if (shown) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
  return NULL;
}

/* --tree: each pid given, then the processes under it, those that run gpureclaim (a pid given that runs none
 * and has none under it stays, for cmd_find() to say why). 0, or -1 out of memory. */
static int expand_trees(pid_t **pids, size_t *npids) {
  size_t n = 0, cap = 64;
  pid_t *all = malloc(cap * sizeof *all);
  pid_t *kids = malloc(4096 * sizeof *kids);
  for (size_t i = 0; all && kids && i < *npids; i++) {
    size_t nk = cmd_descendants((*pids)[i], kids, 4096), before = n;
    for (size_t k = 0; k <= nk; k++) {
      pid_t x = k == 0 ? (*pids)[i] : kids[k - 1];
      bool dup = false;
      for (size_t j = 0; j < n && !dup; j++)
        dup = all[j] == x;
      proc_t t;
      if (dup || cmd_find_quiet(x, &t) != EX_OK)
        continue;
      cmd_free(&t);
      if (n == cap) {
        pid_t *more = realloc(all, (cap *= 2) * sizeof *all);
        if (!more)
          break;
        all = more;
      }
      all[n++] = x;
    }
    if (n == before && n < cap)
      all[n++] = (*pids)[i];
  }
  free(kids);
  if (!all)
    return -1;
  free(*pids);
  *pids = all;
  *npids = n;
  return 0;
}

static const cmd_opt_t g_opts[] = {
    {'a', 'a', "all", CMD_NOARG, NULL, "every process of yours running gpureclaim"},
    {'g', 'g', "gpu", CMD_ARG, "GPU", "every process of yours on that GPU: its index as nvidia-smi numbers it, or its\n"
                                     "UUID (a unique prefix does); an ambiguous prefix, or a GPU none of your\n"
                                     "processes can see, is an error (exit 2)"},
    {'w', 'w', "what", CMD_ARG, "WHAT", "cached, orphaned, all, comma-separated (default: the process's\n"
                                       "GPURECLAIM_ON_SIGNAL; by signal it must match that)"},
    {'t', 't', "timeout", CMD_ARG, "S", "how long to wait, in seconds (default 30), for the processes asked at once\n"
                                       "(32 at a time). A request the process has not begun when it passes is\n"
                                       "withdrawn; one it has begun cannot be, and the command says so (the process\n"
                                       "finishes it: see ps). On a terminal, a wait longer than a second shows its\n"
                                       "progress on standard error."},
    {'s', 's', "signal", CMD_NOARG, NULL, "by the release signal even when the control socket answers"},
    {'j', 'j', "json", CMD_NOARG, NULL, "one JSON array of results (the report formats of docs/PROTOCOL.md)"},
    {'T', 'T', "tree", CMD_NOARG, NULL, "each PID and every process under it (children, theirs, ...) that runs\n"
                                        "gpureclaim: a launcher's workers (torchrun, accelerate, a script)"},
    {0}};

const cmd_spec_t cmd_release_spec = {
    .name = "release",
    .usage = "release [options] PID...\nrelease [options] --tree PID...\nrelease [options] --all\n"
             "release [options] --gpu GPU",
    .summary = "give back memory (cached and orphaned by default) and print what came back",
    .text = "Asks each process to give back memory and prints what it gave back (bytes, milliseconds) and each\n"
            "device's free memory before and after. Over the process's control socket; with --signal, or when\n"
            "nothing listens there, by its release signal, waiting for its status file to report the release.\n",
    .opts = g_opts,
    .tail = "",
};

int cmd_release(int argc, char **argv) {
  request_t rq = {NULL, 0, 30, false};
  bool all = false, by_gpu = false, tree = false;
  ps_filter_t gpu;
  const char *gpu_arg = "";
  pid_t *pids = calloc((size_t)argc + 1, sizeof *pids);
  size_t npids = 0;
  int rc = EX_OK;
  optind = 1;
  int c;
  while (rc == EX_OK && (c = cmd_getopt(argc, argv, &cmd_release_spec)) != -1) {
    switch (c) {
    case 'w':
      rq.what = optarg;
      if (gr_opt_parse_what(rq.what, &rq.what_flags) != 0)
        rc = cmd_usage_error("release: bad --what %s (expected cached, orphaned, all, comma-separated)", rq.what);
      break;
    case 't':
      if (!cmd_parse_seconds(optarg, &rq.timeout) || rq.timeout <= 0)
        rc = cmd_usage_error("release: bad timeout %s (seconds, more than 0 and at most 86400)", optarg);
      break;
    case 'a':
      all = true;
      break;
    case 'g':
      if (!ps_parse_filter(optarg, &gpu))
        rc = cmd_usage_error("release: bad --gpu %s (a GPU's UUID or index)", optarg);
      by_gpu = true;
      gpu_arg = optarg;
      break;
    case 's':
      rq.by_signal = true;
      break;
    case 'T':
      tree = true;
      break;
    case 'j':
      cmd_set_json(true);
      break;
    case 'h':
      free(pids);
      return cmd_help(&cmd_release_spec);
    default:
      rc = EX_USAGE;
    }
  }
  for (int i = optind; i < argc && rc == EX_OK; i++)
    if (!pids || !cmd_parse_pid(argv[i], &pids[npids++]))
      rc = cmd_usage_error("release: not a pid: %s", argv[i]);
  if (rc == EX_OK && all && npids > 0)
    rc = cmd_usage_error("release: give pids or --all, not both%s", "");
  else if (rc == EX_OK && tree && (all || by_gpu))
    rc = cmd_usage_error("release: --tree takes pids, not --all or --gpu%s", "");
  else if (rc == EX_OK && by_gpu && (all || npids > 0))
    rc = cmd_usage_error("release: give pids, --all or --gpu, only one of them%s", "");
  else if (rc == EX_OK && !all && !by_gpu && !npids)
    rc = cmd_usage_error("release: give the pids to release, or --all or --gpu%s", "");
  if (rc == EX_OK && by_gpu) {
    /* The processes that use that GPU, as ps finds them (each asked for its stats at once). */
    ps_view_t v;
    ps_collect(&v, &gpu, 0);
    if (!cmd_rundir_refused() && (rc = ps_check_filter(&v, &gpu, "release")) != EX_OK) {
      ps_free(&v);
      free(pids);
      return rc;
    }
    pid_t *more = realloc(pids, (v.n + 1) * sizeof *pids);
    if (more)
      pids = more;
    for (size_t i = 0; more && i < v.n; i++) {
      if (!v.rows[i].stats) {
        fprintf(stderr, "gpureclaim: %d is not answering (%s): not released\n", (int)v.rows[i].p.pid, v.rows[i].why);
        continue;
      }
      pids[npids++] = v.rows[i].p.pid;
    }
    ps_free(&v);
    if (cmd_rundir_refused()) {
      free(pids);
      return EX_FAILED;
    }
    if (!npids) {
      if (cmd_json_out())
        printf("[]\n");
      else
        printf("(no process of yours is using GPU %s)\n", gpu_arg);
      free(pids);
      return EX_OK;
    }
  }
  if (rc != EX_OK) {
    free(pids);
    return rc;
  }
  proc_t *procs = NULL;
  size_t n = 0;
  bool *found = NULL; /* pids given: which were found (the others are reported, in order, as not released) */
  if (all) {
    n = cmd_list(&procs);
    if (cmd_rundir_refused())
      rc = EX_FAILED;
    else if (!n && !cmd_json_out())
      printf("(no process of yours is running gpureclaim)\n");
  } else {
    if (tree && expand_trees(&pids, &npids) != 0) {
      fprintf(stderr, "gpureclaim: out of memory\n");
      free(pids);
      return EX_FAILED;
    }
    procs = calloc(npids ? npids : 1, sizeof *procs);
    found = calloc(npids ? npids : 1, sizeof *found);
    if (!procs || !found) {
      fprintf(stderr, "gpureclaim: out of memory\n");
      free(procs);
      free(found);
      free(pids);
      return EX_FAILED;
    }
    for (size_t i = 0; i < npids; i++) {
      int r = cmd_find(pids[i], &procs[i]);
      found[i] = r == EX_OK;
      if (r != EX_OK && rc == EX_OK)
        rc = r;
    }
    n = npids;
  }
  /* Every process is asked at once: one that does not answer costs --timeout once, not once per process. */
  job_t *jobs = calloc(n ? n : 1, sizeof *jobs);
  if (!jobs) {
    fprintf(stderr, "gpureclaim: out of memory\n");
    n = 0;
    rc = EX_FAILED;
  }
  for (size_t i = 0; i < n; i++) {
    jobs[i] = (job_t){.p = &procs[i], .rq = &rq, .skip = found && !found[i]};
    atomic_init(&jobs[i].begun, 0);
    atomic_init(&jobs[i].done, 0);
  }
  ticker_t tk = {jobs, n, rq.timeout, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
  pthread_t tk_thread;
  bool ticking = n && isatty(STDERR_FILENO) && pthread_create(&tk_thread, NULL, tick, &tk) == 0;
  cmd_each_at_once(jobs, n, sizeof *jobs, release_job);
  if (ticking) {
    pthread_mutex_lock(&tk.lock);
    tk.stop = true;
    pthread_cond_signal(&tk.cond);
    pthread_mutex_unlock(&tk.lock);
    pthread_join(tk_thread, NULL);
  }
  if (cmd_json_out())
    printf("[");
  for (size_t i = 0; i < n; i++) {
    proc_t *p = &procs[i];
    job_t *j = &jobs[i];
    if (j->skip) { /* cmd_find() said why on stderr */
      if (cmd_json_out()) {
        printf("%s{\"pid\":%d,\"ok\":false,\"via\":null,\"error\":", i ? "," : "", (int)p->pid);
        cmd_json_str(stdout, p->error);
        printf("}");
      }
      continue;
    }
    if (j->why == why_asleep) { /* nothing on the device: not a failure */
      jnode_t *st = cmd_read_status(p);
      uint64_t host = (uint64_t)jint(jget(st ? st : p->status, "sleep"), "host_bytes", 0);
      if (st) {
        jdelete(st);
      }
      if (cmd_json_out()) {
        printf("%s{\"pid\":%d,\"ok\":true,\"via\":\"%s\",\"asleep\":true,\"host_bytes\":%llu,\"report\":null}",
               i ? "," : "", (int)p->pid, j->via, (unsigned long long)host);
      } else {
        char cmdline[256], hb[32];
        printf("%d (%s): asleep, nothing on the device to release (%s kept in host memory; gpureclaim wake %d or "
               "its next CUDA call brings it back)\n",
               (int)p->pid, cmd_command_of(p, cmdline, sizeof cmdline), cmd_bytes(host, hb, sizeof hb), (int)p->pid);
      }
    } else if (cmd_json_out()) {
      printf("%s{\"pid\":%d,\"ok\":%s,\"via\":\"%s\"", i ? "," : "", (int)p->pid, j->rep ? "true" : "false",
             j->via);
      if (j->rep) {
        printf(",\"report\":");
        cmd_json_dump(stdout, j->rep);
      } else {
        printf(",\"error\":");
        cmd_json_str(stdout, j->why);
      }
      printf("}");
    } else if (j->rep) {
      print_report(p, j->rep);
    } else {
      fprintf(stderr, "gpureclaim: %d did not release: %s\n", (int)p->pid, j->why);
    }
    if (!j->rep && j->why != why_asleep && rc == EX_OK)
      rc = j->why == why_exited ? EX_NOPROC : EX_FAILED;
    if (j->ans) {
      jdelete(j->ans);
    }
    cmd_free(p);
  }
  if (cmd_json_out())
    printf("]\n");
  free(jobs);
  free(procs);
  free(found);
  free(pids);
  return rc;
}
