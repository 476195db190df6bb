/*
 * gpureclaim -- run programs under gpureclaim, list them, release their GPU memory, inspect it.
 * How it reaches a process: docs/PROTOCOL.md. Options are parsed with the library's own parsers (options.c).
 */
#include "command.h"
#include "gpureclaim_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef GR_INSTALL_LIBDIR
#define GR_INSTALL_LIBDIR "lib"
#endif

static const char g_usage[] =
    "usage: gpureclaim COMMAND [options]\n"
    "\n"
    "  run [options] -- CMD ARGS...   run CMD with gpureclaim preloaded\n"
    "      --signal SIG (USR1, USR2, RTMIN+n, off)   --on-signal WHAT   --oom-retry N   --log PATH\n"
    "      --rundir DIR   --leak-report   --backtrace   --verbose[=N]   --no-status   --disable\n"
    "  ps [--json] [--prometheus FILE]            your processes running gpureclaim\n"
    "  release PID...|--all [--what WHAT] [--timeout S] [--signal] [--json]\n"
    "                                             give back cached/orphaned memory; print what came back\n"
    "  snapshot PID [--json] [--leaks]            live blocks by device, context, kind and library\n"
    "  top [--interval S] [--iterations N]        refreshing view of ps\n"
    "  --help, --version\n"
    "\n"
    "WHAT is a comma-separated list of cached, orphaned, all (default: the process's GPURECLAIM_ON_SIGNAL).\n"
    "release talks to the process's control socket; with --signal (or without a socket) it sends the\n"
    "process's release signal and waits for its status file to report the release.\n"
    "\n"
    "Exit status: 0 success; 1 a process did not answer or a release failed; 2 bad usage;\n"
    "3 no such process, another user's process, or a process not running gpureclaim.\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gpureclaim: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(see gpureclaim --help)\n");
  return EX_USAGE;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || v < 0 || v > 86400)
    return false;
  *out = v;
  return true;
}

/* ---------------------------------------------------------------------------------------------------------
 * run
 * ------------------------------------------------------------------------------------------------------- */

static bool find_library(char *out, size_t len) {
  const char *env = getenv("GPURECLAIM_LIBRARY");
  if (env && *env)
    return realpath(env, out) != NULL || (snprintf(out, len, "%s", env), access(env, R_OK) == 0);
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return false;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  *slash = '\0';
  const char *const rel[] = {"../" GR_INSTALL_LIBDIR "/libgpureclaim.so.0", "../lib/libgpureclaim.so.0",
                             "../lib64/libgpureclaim.so.0", "../src/libgpureclaim.so.0"};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof cand, "%s/%s", self, rel[i]);
    if (access(cand, R_OK) == 0 && realpath(cand, out))
      return true;
  }
  (void)len;
  return false;
}

static int set_opt(const char *var, const char *value, int (*check)(const char *, void *)) {
  char buf[16];
  if (check && check(value, buf) != 0)
    return usage_error("bad value for %s", var);
  setenv(var, value, 1);
  return EX_OK;
}

static int chk_signal(const char *v, void *out) { return gr_opt_parse_signal(v, out); }
static int chk_what(const char *v, void *out) { return gr_opt_parse_what(v, out); }
static int chk_retry(const char *v, void *out) {
  unsigned long long n;
  int rc = gr_opt_parse_uint(v, 16, &n);
  (void)out;
  return rc;
}
static int chk_abs(const char *v, void *out) {
  (void)out;
  return v[0] == '/' ? 0 : -1;
}

static int cmd_run(int argc, char **argv) {
  int i = 0, rc = EX_OK;
  for (; i < argc && strcmp(argv[i], "--") != 0 && rc == EX_OK; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = true;
    if (!strcmp(a, "--signal") && v)
      rc = set_opt("GPURECLAIM_SIGNAL", v, chk_signal);
    else if (!strcmp(a, "--on-signal") && v)
      rc = set_opt("GPURECLAIM_ON_SIGNAL", v, chk_what);
    else if (!strcmp(a, "--oom-retry") && v)
      rc = set_opt("GPURECLAIM_OOM_RETRY", v, chk_retry);
    else if (!strcmp(a, "--log") && v)
      rc = set_opt("GPURECLAIM_LOG", v, NULL);
    else if (!strcmp(a, "--rundir") && v)
      rc = set_opt("GPURECLAIM_RUNDIR", v, chk_abs);
    else {
      takes = false;
      if (!strcmp(a, "--leak-report"))
        setenv("GPURECLAIM_LEAK_REPORT", "1", 1);
      else if (!strcmp(a, "--backtrace"))
        setenv("GPURECLAIM_BACKTRACE", "1", 1);
      else if (!strcmp(a, "--verbose"))
        setenv("GPURECLAIM_VERBOSE", "1", 1);
      else if (!strncmp(a, "--verbose=", 10) && (a[10] == '0' || a[10] == '1' || a[10] == '2') && !a[11])
        setenv("GPURECLAIM_VERBOSE", a + 10, 1);
      else if (!strcmp(a, "--no-status"))
        setenv("GPURECLAIM_STATUS", "0", 1);
      else if (!strcmp(a, "--disable"))
        setenv("GPURECLAIM_DISABLE", "1", 1);
      else
        return usage_error("run: unknown option or missing value: %s", a);
    }
    if (takes)
      i++;
  }
  if (rc != EX_OK)
    return rc;
  if (i >= argc - 1)
    return usage_error("run: give the program after --%s", "");
  char lib[PATH_MAX];
  if (!find_library(lib, sizeof lib)) {
    fprintf(stderr, "gpureclaim: cannot find libgpureclaim.so.0 next to this command (set GPURECLAIM_LIBRARY)\n");
    return EX_FAILED;
  }
  const char *old = getenv("LD_PRELOAD");
  size_t len = strlen(lib) + (old ? strlen(old) + 2 : 1);
  char *pre = malloc(len);
  if (!pre)
    return EX_FAILED;
  snprintf(pre, len, old && *old ? "%s:%s" : "%s", lib, old ? old : "");
  setenv("LD_PRELOAD", pre, 1);
  execvp(argv[i + 1], &argv[i + 1]);
  fprintf(stderr, "gpureclaim: cannot run %s: %s\n", argv[i + 1], strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

/* ---------------------------------------------------------------------------------------------------------
 * ps and top
 * ------------------------------------------------------------------------------------------------------- */

typedef struct row {
  proc_t p;
  jnode_t *stats; /* the socket's answer, NULL if it did not answer */
} row_t;

/* The command line with the program's directory left out (columns are narrow; --json keeps it whole). */
static const char *command_of(const proc_t *p) {
  const char *c = jstr(p->status, "cmdline", "");
  if (!*c)
    c = jstr(p->status, "exe", "?");
  if (cmd_json_out())
    return c;
  const char *end = strchr(c, ' '), *slash = NULL;
  for (const char *q = c; *q && (!end || q < end); q++)
    if (*q == '/')
      slash = q;
  return slash ? slash + 1 : c;
}

static uint64_t total(const row_t *r, const char *field) {
  return (uint64_t)jint(jget(r->stats, "total"), field, 0);
}

static void devices_of(const row_t *r, char *buf, size_t len) {
  const jnode_t *d = jget(r->stats, "devices");
  buf[0] = '\0';
  size_t used = 0;
  for (size_t i = 0; d && d->type == JN_ARR && i < d->n && used + 8 < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)jint(&d->kids[i], "device", -1));
  if (!buf[0])
    snprintf(buf, len, "-");
}

static size_t collect(row_t **out) {
  proc_t *ps;
  size_t n = cmd_list(&ps);
  row_t *rows = calloc(n ? n : 1, sizeof *rows);
  for (size_t i = 0; i < n; i++) {
    const char *why;
    rows[i].p = ps[i];
    rows[i].stats = cmd_ask(&ps[i], "stats", 2.0, &why);
  }
  free(ps);
  *out = rows;
  return n;
}

static void free_rows(row_t *rows, size_t n) {
  for (size_t i = 0; i < n; i++) {
    cmd_free(&rows[i].p);
    if (rows[i].stats) {
      jfree(rows[i].stats);
      free(rows[i].stats);
    }
  }
  free(rows);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

static void print_ps(FILE *f, row_t *rows, size_t n) {
  char b1[32], b2[32], b3[32], devs[64];
  if (cmd_json_out()) {
    fprintf(f, "[");
    for (size_t i = 0; i < n; i++) {
      row_t *r = &rows[i];
      devices_of(r, devs, sizeof devs);
      fprintf(f, "%s{\"pid\":%d,\"command\":", i ? "," : "", (int)r->p.pid);
      json_str(f, command_of(&r->p));
      fprintf(f, ",\"answered\":%s,\"devices\":[%s],\"live_blocks\":%llu,\"live_bytes\":%llu,\"cached_bytes\":%llu,"
                 "\"pinned_bytes\":%llu,\"releases\":%lld,\"released_bytes\":%llu}",
              r->stats ? "true" : "false", strcmp(devs, "-") ? devs : "", (unsigned long long)total(r, "live_blocks"),
              (unsigned long long)total(r, "live_bytes"),
              (unsigned long long)(total(r, "pool_reserved_bytes") - total(r, "pool_used_bytes")),
              (unsigned long long)total(r, "host_pinned_bytes"), (long long)jint(r->p.status, "releases", 0),
              (unsigned long long)total(r, "released_bytes"));
    }
    fprintf(f, "]\n");
    return;
  }
  fprintf(f, "%7s  %-28s %-7s %10s %10s %10s %8s  %s\n", "PID", "COMMAND", "DEVICES", "LIVE", "CACHED", "PINNED",
          "RELEASES", "LAST RELEASE");
  for (size_t i = 0; i < n; i++) {
    row_t *r = &rows[i];
    devices_of(r, devs, sizeof devs);
    char last[96] = "-";
    const jnode_t *lr = jget(r->p.status, "last_release");
    if (lr && lr->type == JN_OBJ)
      snprintf(last, sizeof last, "%s gave %s",
               jstr(lr, "trigger", "?"),
               cmd_bytes((uint64_t)(jint(lr, "cached_bytes", 0) + jint(lr, "orphaned_bytes", 0) + jint(lr, "all_bytes", 0)),
                         b1, sizeof b1));
    if (!r->stats) {
      fprintf(f, "%7d  %-28.28s %-7s %10s %10s %10s %8lld  %s\n", (int)r->p.pid, command_of(&r->p), "?", "?", "?",
              "?", (long long)jint(r->p.status, "releases", 0), "(not answering)");
      continue;
    }
    fprintf(f, "%7d  %-28.28s %-7s %10s %10s %10s %8lld  %s\n", (int)r->p.pid, command_of(&r->p), devs,
            cmd_bytes(total(r, "live_bytes"), b1, sizeof b1),
            cmd_bytes(total(r, "pool_reserved_bytes") - total(r, "pool_used_bytes"), b2, sizeof b2),
            cmd_bytes(total(r, "host_pinned_bytes"), b3, sizeof b3), (long long)jint(r->p.status, "releases", 0), last);
  }
  if (!n)
    fprintf(f, "(no process of yours is running gpureclaim)\n");
}

static void prom_label(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      fprintf(f, "\\%c", *s);
    else if (*s == '\n')
      fputs("\\n", f);
    else
      fputc(*s, f);
  }
}

static int write_prometheus(const char *path, row_t *rows, size_t n) {
  static const struct {
    const char *name, *field, *help, *type;
  } m[] = {
      {"gpureclaim_live_bytes", "live_bytes", "Device memory in live blocks.", "gauge"},
      {"gpureclaim_live_blocks", "live_blocks", "Live device blocks.", "gauge"},
      {"gpureclaim_peak_bytes", "peak_bytes", "Highest live device memory.", "gauge"},
      {"gpureclaim_pool_reserved_bytes", "pool_reserved_bytes", "Memory held by stream-ordered pools.", "gauge"},
      {"gpureclaim_pool_used_bytes", "pool_used_bytes", "Pool memory handed out.", "gauge"},
      {"gpureclaim_host_pinned_bytes", "host_pinned_bytes", "Pinned host memory.", "gauge"},
      {"gpureclaim_orphan_bytes", "orphan_bytes", "Memory of ended scopes awaiting a release.", "gauge"},
      {"gpureclaim_releases_total", "releases", "Releases run.", "counter"},
      {"gpureclaim_released_bytes_total", "released_bytes", "Bytes given back by releases.", "counter"},
  };
  char tmp[PATH_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    fprintf(stderr, "gpureclaim: cannot write %s: %s\n", tmp, strerror(errno));
    return EX_FAILED;
  }
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m[k].name, m[k].help, m[k].name, m[k].type);
    for (size_t i = 0; i < n; i++) {
      if (!rows[i].stats)
        continue;
      const char *cmd = command_of(&rows[i].p);
      const jnode_t *d = jget(rows[i].stats, "devices");
      for (size_t j = 0; d && d->type == JN_ARR && j < d->n; j++) {
        fprintf(f, "%s{pid=\"%d\",device=\"%lld\",command=\"", m[k].name, (int)rows[i].p.pid,
                (long long)jint(&d->kids[j], "device", -1));
        prom_label(f, cmd);
        fprintf(f, "\"} %lld\n", (long long)jint(&d->kids[j], m[k].field, 0));
      }
    }
  }
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "gpureclaim: cannot write %s: %s\n", path, strerror(errno));
    unlink(tmp);
    return EX_FAILED;
  }
  return EX_OK;
}

static int cmd_ps(int argc, char **argv) {
  const char *prom = NULL;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--json"))
      cmd_set_json(true);
    else if (!strcmp(argv[i], "--prometheus") && i + 1 < argc)
      prom = argv[++i];
    else
      return usage_error("ps: unknown option %s", argv[i]);
  }
  row_t *rows;
  size_t n = collect(&rows);
  int rc = prom ? write_prometheus(prom, rows, n) : EX_OK;
  if (!prom)
    print_ps(stdout, rows, n);
  free_rows(rows, n);
  return rc;
}

static int cmd_top(int argc, char **argv) {
  double interval = 2;
  long iterations = -1;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
      if (!parse_double(argv[++i], &interval) || interval < 0.1)
        return usage_error("top: bad interval %s", argv[i]);
    } else if (!strcmp(argv[i], "--iterations") && i + 1 < argc) {
      char *end;
      iterations = strtol(argv[++i], &end, 10);
      if (*end || iterations < 1)
        return usage_error("top: bad iterations %s", argv[i]);
    } else {
      return usage_error("top: unknown option %s", argv[i]);
    }
  }
  for (long it = 0; iterations < 0 || it < iterations; it++) {
    if (it)
      nanosleep(&(struct timespec){(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)}, NULL);
    row_t *rows;
    size_t n = collect(&rows);
    time_t now = time(NULL);
    char ts[64];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
    printf("\033[H\033[2Jgpureclaim top - %s - %zu process%s (every %.1fs, ^C quits)\n\n", ts, n, n == 1 ? "" : "es",
           interval);
    print_ps(stdout, rows, n);
    fflush(stdout);
    free_rows(rows, n);
  }
  return EX_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * release
 * ------------------------------------------------------------------------------------------------------- */

static void print_report(const proc_t *p, const jnode_t *rep) {
  char b[6][32];
  uint64_t cached = (uint64_t)jint(rep, "cached_bytes", 0), orph = (uint64_t)jint(rep, "orphaned_bytes", 0),
           all = (uint64_t)jint(rep, "all_bytes", 0);
  const jnode_t *ms = jget(rep, "ms");
  printf("%d (%.40s): released %s in %.2f ms (cached %s: pools %s, frameworks %s; orphaned %s in %lld blocks",
         (int)p->pid, command_of(p), cmd_bytes(cached + orph + all, b[0], 32), ms && ms->type == JN_NUM ? ms->num : 0.0,
         cmd_bytes(cached, b[1], 32), cmd_bytes((uint64_t)jint(rep, "pool_bytes", 0), b[2], 32),
         cmd_bytes((uint64_t)jint(rep, "framework_bytes", 0), b[3], 32), cmd_bytes(orph, b[4], 32),
         (long long)jint(rep, "orphaned_blocks", 0));
  if (all)
    printf("; all %s", cmd_bytes(all, b[5], 32));
  printf(")\n");
  const jnode_t *d = jget(rep, "devices");
  for (size_t i = 0; d && d->type == JN_ARR && i < d->n; i++)
    printf("    device %lld: free %s -> %s of %s\n", (long long)jint(&d->kids[i], "device", -1),
           cmd_bytes((uint64_t)jint(&d->kids[i], "free_before", 0), b[0], 32),
           cmd_bytes((uint64_t)jint(&d->kids[i], "free_after", 0), b[1], 32),
           cmd_bytes((uint64_t)jint(&d->kids[i], "total", 0), b[2], 32));
}

/* Prints a JSON value back (for --json output). */
static void dump(FILE *f, const jnode_t *n) {
  switch (n->type) {
  case JN_NULL: fputs("null", f); break;
  case JN_BOOL: fputs(n->b ? "true" : "false", f); break;
  case JN_NUM:
    if ((double)n->i == n->num)
      fprintf(f, "%lld", (long long)n->i);
    else
      fprintf(f, "%.3f", n->num);
    break;
  case JN_STR: json_str(f, n->s); break;
  case JN_ARR:
  case JN_OBJ:
    fputc(n->type == JN_ARR ? '[' : '{', f);
    for (size_t i = 0; i < n->n; i++) {
      if (i)
        fputc(',', f);
      if (n->type == JN_OBJ) {
        json_str(f, n->keys[i]);
        fputc(':', f);
      }
      dump(f, &n->kids[i]);
    }
    fputc(n->type == JN_ARR ? ']' : '}', f);
    break;
  }
}

/* Releases through the signal: send it, wait for the status file's release count to grow. */
static jnode_t *release_by_signal(const proc_t *p, double timeout, const char **why) {
  int sig = 0;
  const char *name = jstr(p->status, "signal", "USR1");
  if (gr_opt_parse_signal(name, &sig) != 0 || sig == 0) {
    *why = "the process has its release signal off";
    return NULL;
  }
  int64_t before = jint(p->status, "releases", 0);
  if (kill(p->pid, sig) != 0) {
    *why = strerror(errno);
    return NULL;
  }
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    jnode_t *s = cmd_read_status(p);
    if (s && jint(s, "releases", 0) > before)
      return s;
    if (s) {
      jfree(s);
      free(s);
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 > timeout) {
      *why = "timed out waiting for the release";
      return NULL;
    }
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
}

static int cmd_release(int argc, char **argv) {
  const char *what = NULL;
  double timeout = 30;
  bool all = false, by_signal = false;
  pid_t *pids = calloc((size_t)argc + 1, sizeof *pids);
  size_t npids = 0;
  for (int i = 0; i < argc; i++) {
    unsigned w;
    if (!strcmp(argv[i], "--what") && i + 1 < argc) {
      what = argv[++i];
      if (gr_opt_parse_what(what, &w) != 0) {
        free(pids);
        return usage_error("release: bad --what %s (expected cached, orphaned, all, comma-separated)", what);
      }
    } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
      if (!parse_double(argv[++i], &timeout)) {
        free(pids);
        return usage_error("release: bad timeout %s", argv[i]);
      }
    } else if (!strcmp(argv[i], "--all")) {
      all = true;
    } else if (!strcmp(argv[i], "--signal")) {
      by_signal = true;
    } else if (!strcmp(argv[i], "--json")) {
      cmd_set_json(true);
    } else {
      char *end;
      long v = strtol(argv[i], &end, 10);
      if (*end || v <= 0 || v > INT_MAX) {
        free(pids);
        return usage_error("release: not a pid: %s", argv[i]);
      }
      pids[npids++] = (pid_t)v;
    }
  }
  if (!all && !npids) {
    free(pids);
    return usage_error("release: give pids or --all%s", "");
  }
  if (by_signal && what) {
    free(pids);
    return usage_error("release: --what needs the control socket; with --signal the process's GPURECLAIM_ON_SIGNAL "
                       "applies%s", "");
  }
  proc_t *procs = NULL;
  size_t n = 0;
  int rc = EX_OK;
  if (all) {
    n = cmd_list(&procs);
    if (!n && !cmd_json_out())
      printf("(no process of yours is running gpureclaim)\n");
  } else {
    procs = calloc(npids, sizeof *procs);
    for (size_t i = 0; i < npids; i++) {
      int r = cmd_find(pids[i], &procs[n]);
      if (r == EX_OK)
        n++;
      else
        rc = r;
    }
  }
  if (cmd_json_out())
    printf("[");
  for (size_t i = 0; i < n; i++) {
    proc_t *p = &procs[i];
    const char *why = "";
    jnode_t *ans = NULL;
    const jnode_t *rep = NULL;
    bool socket_ok = !by_signal && jstr(p->status, "socket", NULL);
    if (socket_ok) {
      char req[128];
      snprintf(req, sizeof req, what ? "release %s" : "release", what ? what : "");
      ans = cmd_ask(p, req, timeout, &why);
      if (ans && !jbool(ans, "ok", false))
        why = jstr(ans, "error", "refused");
      else if (ans)
        rep = jget(ans, "report");
    } else {
      ans = release_by_signal(p, timeout, &why);
      if (ans)
        rep = jget(ans, "last_release");
    }
    if (cmd_json_out()) {
      printf("%s{\"pid\":%d,\"ok\":%s", i ? "," : "", (int)p->pid, rep ? "true" : "false");
      if (rep) {
        printf(",\"report\":");
        dump(stdout, rep);
      } else {
        printf(",\"error\":");
        json_str(stdout, why);
      }
      printf("}");
    } else if (rep) {
      print_report(p, rep);
    } else {
      fprintf(stderr, "gpureclaim: %d did not answer: %s\n", (int)p->pid, why);
    }
    if (!rep && rc == EX_OK)
      rc = EX_FAILED;
    if (ans) {
      jfree(ans);
      free(ans);
    }
    cmd_free(p);
  }
  if (cmd_json_out())
    printf("]\n");
  free(procs);
  free(pids);
  return rc;
}

/* ---------------------------------------------------------------------------------------------------------
 * snapshot
 * ------------------------------------------------------------------------------------------------------- */

typedef struct group {
  int64_t device;
  uint64_t context;
  const char *kind, *library;
  uint64_t blocks, bytes;
} group_t;

static int by_bytes(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static void print_snapshot(const jnode_t *snap) {
  const jnode_t *blocks = jget(snap, "blocks");
  size_t nb = blocks && blocks->type == JN_ARR ? blocks->n : 0;
  group_t *g = calloc(nb ? nb : 1, sizeof *g);
  size_t ng = 0;
  for (size_t i = 0; i < nb; i++) {
    const jnode_t *b = &blocks->kids[i];
    group_t key = {jint(b, "device", -1), jhex(b, "context", 0), jstr(b, "kind", "?"), jstr(b, "library", "?"), 0, 0};
    size_t k = 0;
    while (k < ng && !(g[k].device == key.device && g[k].context == key.context && !strcmp(g[k].kind, key.kind) &&
                       !strcmp(g[k].library, key.library)))
      k++;
    if (k == ng)
      g[ng++] = key;
    g[k].blocks++;
    g[k].bytes += (uint64_t)jint(b, "bytes", 0);
  }
  qsort(g, ng, sizeof *g, by_bytes);
  const jnode_t *t = jget(snap, "total");
  char b1[32], b2[32], b3[32], b4[32];
  printf("pid %lld: %lld live blocks, %s live (peak %s), pools hold %s, %s pinned host memory\n",
         (long long)jint(snap, "pid", 0), (long long)jint(t, "live_blocks", 0),
         cmd_bytes((uint64_t)jint(t, "live_bytes", 0), b1, 32), cmd_bytes((uint64_t)jint(t, "peak_bytes", 0), b2, 32),
         cmd_bytes((uint64_t)jint(t, "pool_reserved_bytes", 0), b3, 32),
         cmd_bytes((uint64_t)jint(t, "host_pinned_bytes", 0), b4, 32));
  printf("\n%-6s %-16s %-12s %-32s %8s %12s\n", "DEVICE", "CONTEXT", "KIND", "LIBRARY", "BLOCKS", "BYTES");
  for (size_t i = 0; i < ng; i++) {
    char dev[16], ctx[24];
    snprintf(dev, sizeof dev, g[i].device < 0 ? "host" : "%lld", (long long)g[i].device);
    snprintf(ctx, sizeof ctx, g[i].context ? "0x%llx" : "-", (unsigned long long)g[i].context);
    printf("%-6s %-16s %-12s %-32.32s %8llu %12s\n", dev, ctx, g[i].kind, g[i].library,
           (unsigned long long)g[i].blocks, cmd_bytes(g[i].bytes, b1, 32));
  }
  if (!ng)
    printf("(no live blocks)\n");
  free(g);
}

static void print_leaks(const jnode_t *l) {
  char b[32];
  printf("=================================================================\n");
  printf("gpureclaim: pid %lld: %lld blocks (%s) were never freed\n", (long long)jint(l, "pid", 0),
         (long long)jint(l, "blocks", 0), cmd_bytes((uint64_t)jint(l, "bytes", 0), b, 32));
  const jnode_t *d = jget(l, "devices");
  for (size_t i = 0; d && d->type == JN_ARR && i < d->n; i++) {
    int64_t dev = jint(&d->kids[i], "device", -1);
    if (dev < 0)
      printf("Host (pinned): ");
    else
      printf("Device %lld: ", (long long)dev);
    printf("%lld blocks, %s\n", (long long)jint(&d->kids[i], "blocks", 0),
           cmd_bytes((uint64_t)jint(&d->kids[i], "bytes", 0), b, 32));
  }
  const jnode_t *g = jget(l, "groups");
  for (size_t i = 0; g && g->type == JN_ARR && i < g->n; i++) {
    const jnode_t *x = &g->kids[i];
    const char *sym = jstr(x, "symbol", NULL);
    printf("\n%lld block(s), %s (%s) allocated by %s at %s%s%s%s\n", (long long)jint(x, "blocks", 0),
           cmd_bytes((uint64_t)jint(x, "bytes", 0), b, 32), jstr(x, "kind", "?"), jstr(x, "library", "?"),
           jstr(x, "caller", "?"), sym ? " (" : "", sym ? sym : "", sym ? ")" : "");
    const jnode_t *fr = jget(x, "frames");
    for (size_t k = 0; fr && fr->type == JN_ARR && k < fr->n; k++)
      printf("    #%zu %s\n", k, fr->kids[k].type == JN_STR ? fr->kids[k].s : "?");
  }
}

static int cmd_snapshot(int argc, char **argv) {
  bool leaks = false;
  pid_t pid = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--json"))
      cmd_set_json(true);
    else if (!strcmp(argv[i], "--leaks"))
      leaks = true;
    else {
      char *end;
      long v = strtol(argv[i], &end, 10);
      if (*end || v <= 0 || v > INT_MAX || pid)
        return usage_error("snapshot: expected one pid, got %s", argv[i]);
      pid = (pid_t)v;
    }
  }
  if (!pid)
    return usage_error("snapshot: give a pid%s", "");
  proc_t p;
  int rc = cmd_find(pid, &p);
  if (rc != EX_OK)
    return rc;
  const char *why = "";
  jnode_t *ans = cmd_ask(&p, leaks ? "leaks" : "snapshot", 30, &why);
  const jnode_t *body = ans && jbool(ans, "ok", false) ? jget(ans, leaks ? "leaks" : "snapshot") : NULL;
  if (!body) {
    fprintf(stderr, "gpureclaim: %d did not answer: %s\n", (int)pid, ans ? jstr(ans, "error", "refused") : why);
    rc = EX_FAILED;
  } else if (cmd_json_out()) {
    dump(stdout, body);
    putchar('\n');
  } else if (leaks) {
    print_leaks(body);
  } else {
    print_snapshot(body);
  }
  if (ans) {
    jfree(ans);
    free(ans);
  }
  cmd_free(&p);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(g_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? EX_USAGE : EX_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("gpureclaim %s\n", GPURECLAIM_VERSION_STRING);
    return EX_OK;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "run"))
    return cmd_run(argc - 2, argv + 2);
  if (!strcmp(cmd, "ps"))
    return cmd_ps(argc - 2, argv + 2);
  if (!strcmp(cmd, "release"))
    return cmd_release(argc - 2, argv + 2);
  if (!strcmp(cmd, "snapshot"))
    return cmd_snapshot(argc - 2, argv + 2);
  if (!strcmp(cmd, "top"))
    return cmd_top(argc - 2, argv + 2);
  return usage_error("unknown command: %s", cmd);
}
