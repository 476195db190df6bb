/*
 * cmd_ps.c -- `gpureclaim ps` (a table, --json, or node_exporter's textfile format) and `gpureclaim top` (the
 * same table, refreshed). Live numbers come from each process's control socket (`stats`); a process that does
 * not answer is still listed, from its status file, marked as not answering.
 */
#include "command.h"
#include "gpureclaim_internal.h"
#include "outfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct row {
  proc_t p;
  jnode_t *stats;  /* the socket's answer, NULL if it did not answer */
  const char *why; /* ... and why not */
} row_t;

static uint64_t total(const row_t *r, const char *field) {
  int64_t v = jint(jget(r->stats, "total"), field, 0);
  return v > 0 ? (uint64_t)v : 0;
}

static uint64_t cached_of(const jnode_t *stats) {
  int64_t reserved = jint(stats, "pool_reserved_bytes", 0), used = jint(stats, "pool_used_bytes", 0);
  return reserved > used ? (uint64_t)(reserved - used) : 0;
}

static const jnode_t *devices(const row_t *r) {
  const jnode_t *d = jget(r->stats, "devices");
  return d && d->type == JN_ARR ? d : NULL;
}

static void devices_text(const row_t *r, char *buf, size_t len) {
  const jnode_t *d = devices(r);
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; d && i < d->n && used + 8 < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)jint(&d->kids[i], "device", -1));
  if (!buf[0])
    snprintf(buf, len, r->stats ? "-" : "?");
}

/* Asks one process for its stats (a thread of collect()). */
static void ask_stats(void *arg) {
  row_t *r = arg;
  r->stats = cmd_ask(&r->p, "stats", 2.0, &r->why, NULL);
  if (r->stats && !jbool(r->stats, "ok", false)) {
    r->why = "it refused the stats request";
    jfree(r->stats);
    free(r->stats);
    r->stats = NULL;
  }
}

static size_t collect(row_t **out) {
  proc_t *ps;
  size_t n = cmd_list(&ps);
  row_t *rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows) {
    for (size_t i = 0; i < n; i++)
      cmd_free(&ps[i]);
    n = 0;
  }
  for (size_t i = 0; i < n; i++) {
    rows[i].p = ps[i];
    rows[i].why = "";
  }
  cmd_each_at_once(rows, n, sizeof *rows, ask_stats); /* a silent process costs its 2 s once */
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

/* A number of the stats answer, or null when the process did not answer. */
static void json_num(FILE *f, const char *key, const row_t *r, uint64_t v) {
  if (r->stats)
    fprintf(f, ",\"%s\":%llu", key, (unsigned long long)v);
  else
    fprintf(f, ",\"%s\":null", key);
}

static void print_json(FILE *f, const row_t *rows, size_t n) {
  fputc('[', f);
  for (size_t i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    char prog[256];
    cmd_program_of(&r->p, prog, sizeof prog);
    fprintf(f, "%s{\"pid\":%d,\"command\":", i ? "," : "", (int)r->p.pid);
    cmd_json_str(f, cmd_command_of(&r->p, NULL, 0));
    fputs(",\"program\":", f);
    cmd_json_str(f, prog);
    fprintf(f, ",\"answered\":%s", r->stats ? "true" : "false");
    if (!r->stats) {
      fputs(",\"error\":", f);
      cmd_json_str(f, r->why);
    }
    fputs(",\"devices\":", f);
    if (r->stats) {
      const jnode_t *d = devices(r);
      fputc('[', f);
      for (size_t k = 0; d && k < d->n; k++)
        fprintf(f, "%s%lld", k ? "," : "", (long long)jint(&d->kids[k], "device", -1));
      fputc(']', f);
    } else {
      fputs("null", f);
    }
    json_num(f, "live_blocks", r, total(r, "live_blocks"));
    json_num(f, "live_bytes", r, total(r, "live_bytes"));
    json_num(f, "cached_bytes", r, cached_of(jget(r->stats, "total")));
    json_num(f, "pinned_bytes", r, total(r, "host_pinned_bytes"));
    json_num(f, "orphan_bytes", r, total(r, "orphan_bytes"));
    json_num(f, "released_bytes", r, total(r, "released_bytes"));
    fprintf(f, ",\"releases\":%lld,\"signal\":", (long long)jint(r->p.status, "releases", 0));
    cmd_json_str(f, jstr(r->p.status, "signal", "?"));
    fputs(",\"last_release\":", f);
    cmd_json_dump(f, jget(r->p.status, "last_release"));
    fputc('}', f);
  }
  fputs("]\n", f);
}

static void print_table(FILE *f, const row_t *rows, size_t n) {
  char b1[32], b2[32], b3[32], devs[64], age[32], cmdline[256];
  uint64_t now = cmd_now_ms();
  fprintf(f, "%7s  %-28s %-7s %10s %10s %10s %8s  %s\n", "PID", "COMMAND", "DEVICES", "LIVE", "CACHED", "PINNED",
          "RELEASES", "LAST RELEASE");
  for (size_t i = 0; i < n; i++) {
    const row_t *r = &rows[i];
    devices_text(r, devs, sizeof devs);
    char last[128] = "-";
    const jnode_t *lr = jget(r->p.status, "last_release");
    if (lr && lr->type == JN_OBJ) {
      int64_t gave = jint(lr, "cached_bytes", 0) + jint(lr, "orphaned_bytes", 0) + jint(lr, "all_bytes", 0);
      snprintf(last, sizeof last, "%s (%s, %s)", cmd_bytes(gave > 0 ? (uint64_t)gave : 0, b1, sizeof b1),
               jstr(lr, "trigger", "?"),
               cmd_age((uint64_t)jint(r->p.status, "updated_ms", 0), now, age, sizeof age));
    }
    long long releases = (long long)jint(r->p.status, "releases", 0);
    if (!r->stats) {
      fprintf(f, "%7d  %-28.28s %-7s %10s %10s %10s %8lld  %s [not answering: %s]\n", (int)r->p.pid,
              cmd_command_of(&r->p, cmdline, sizeof cmdline), devs, "?", "?", "?", releases, last, r->why);
      continue;
    }
    fprintf(f, "%7d  %-28.28s %-7s %10s %10s %10s %8lld  %s\n", (int)r->p.pid, cmd_command_of(&r->p, cmdline, sizeof cmdline), devs,
            cmd_bytes(total(r, "live_bytes"), b1, sizeof b1), cmd_bytes(cached_of(jget(r->stats, "total")), b2, sizeof b2),
            cmd_bytes(total(r, "host_pinned_bytes"), b3, sizeof b3), releases, last);
  }
  if (!n)
    fprintf(f, "(no process of yours is running gpureclaim)\n");
}

/* ---- Prometheus text format, for node_exporter's textfile collector ---- */

/* Label values: UTF-8 with \\, " and newline escaped. A byte that is not UTF-8 becomes U+FFFD: the collector
 * rejects a whole file with one bad label, every process's metrics with it. */
static void prom_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    size_t n;
    if (*s == '\\' || *s == '"') {
      fprintf(f, "\\%c", *s);
    } else if (*s == '\n') {
      fputs("\\n", f);
    } else if ((n = gr_utf8_len((const unsigned char *)s)) != 0) {
      fwrite(s, 1, n, f);
      s += n - 1;
    } else {
      fputs("\xef\xbf\xbd", f);
    }
  }
}

static void prom_labels(FILE *f, const row_t *r, long long device) {
  char prog[256];
  cmd_program_of(&r->p, prog, sizeof prog);
  fprintf(f, "{pid=\"%d\",", (int)r->p.pid);
  if (device >= 0)
    fprintf(f, "device=\"%lld\",", device);
  fputs("command=\"", f);
  prom_escaped(f, prog); /* the program's name only: whole command lines would make unbounded label values */
  fputs("\"}", f);
}

static void prom_rows(FILE *f, const row_t *rows, size_t n) {
  /* Per device: what the process holds on each GPU. */
  static const struct {
    const char *name, *field, *help;
  } dev[] = {
      {"gpureclaim_live_bytes", "live_bytes", "Device memory in live blocks tracked by gpureclaim."},
      {"gpureclaim_live_blocks", "live_blocks", "Live device blocks tracked by gpureclaim."},
      {"gpureclaim_peak_bytes", "peak_bytes", "Highest live device memory seen."},
      {"gpureclaim_pool_reserved_bytes", "pool_reserved_bytes", "Memory held by stream-ordered pools."},
      {"gpureclaim_pool_used_bytes", "pool_used_bytes", "Pool memory handed out to the program."},
      {"gpureclaim_cached_bytes", NULL, "Pool memory held but not used (reserved - used): what a release can trim."},
      {"gpureclaim_orphan_bytes", "orphan_bytes", "Memory of ended scopes awaiting a release."},
  };
  for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++) {
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", dev[k].name, dev[k].help, dev[k].name);
    for (size_t i = 0; i < n; i++) {
      const jnode_t *d = devices(&rows[i]);
      for (size_t j = 0; d && j < d->n; j++) {
        const jnode_t *x = &d->kids[j];
        fputs(dev[k].name, f);
        prom_labels(f, &rows[i], (long long)jint(x, "device", -1));
        if (dev[k].field)
          fprintf(f, " %lld\n", (long long)jint(x, dev[k].field, 0));
        else
          fprintf(f, " %llu\n", (unsigned long long)cached_of(x));
      }
    }
  }
  /* Per process. */
  static const struct {
    const char *name, *field, *help, *type;
  } proc[] = {
      {"gpureclaim_host_pinned_bytes", "host_pinned_bytes", "Pinned host memory.", "gauge"},
      {"gpureclaim_releases_total", "releases", "Releases run.", "counter"},
      {"gpureclaim_released_bytes_total", "released_bytes", "Bytes given back by releases.", "counter"},
  };
  for (size_t k = 0; k < sizeof proc / sizeof proc[0]; k++) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", proc[k].name, proc[k].help, proc[k].name, proc[k].type);
    for (size_t i = 0; i < n; i++) {
      if (!rows[i].stats)
        continue;
      fputs(proc[k].name, f);
      prom_labels(f, &rows[i], -1);
      fprintf(f, " %llu\n", (unsigned long long)total(&rows[i], proc[k].field));
    }
  }
  fputs("# HELP gpureclaim_up Whether the process answered on its control socket.\n# TYPE gpureclaim_up gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    fputs("gpureclaim_up", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %d\n", rows[i].stats ? 1 : 0);
  }
}

/* "-" is standard output. A regular file (or a link's regular target) is written to a temporary name in the
 * same directory and renamed, so the collector never reads half a file (the temporary name does not end in
 * .prom, so the collector ignores it); outfile.h says what happens to anything else. */
static int write_prometheus(const char *path, const row_t *rows, size_t n) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    fprintf(stderr, "gpureclaim: out of memory\n");
    return EX_FAILED;
  }
  prom_rows(f, rows, n);
  bool ok = fclose(f) == 0 && text;
  int rc = 0;
  if (ok && !strcmp(path, "-"))
    ok = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0;
  else if (ok)
    rc = gr_out_write(path, text, len, 0644);
  free(text);
  if (!ok || rc != 0) {
    fprintf(stderr, "gpureclaim: cannot write %s: %s\n", path, strerror(rc ? -rc : errno ? errno : EIO));
    return EX_FAILED;
  }
  return EX_OK;
}

int cmd_ps(int argc, char **argv) {
  const char *prom = NULL;
  for (int i = 0; i < argc; i++) {
    int m;
    if (!strcmp(argv[i], "--json"))
      cmd_set_json(true);
    else if ((m = cmd_opt_value(argc, argv, &i, "ps", "--prometheus", &prom)) < 0)
      return EX_USAGE;
    else if (m == 0)
      return cmd_usage_error("ps: unknown option: %s", argv[i]);
    else if (!*prom)
      return cmd_usage_error("ps: --prometheus needs a file (or - for standard output)%s", "");
  }
  if (prom && cmd_json_out())
    return cmd_usage_error("ps: --json and --prometheus are two formats: give one%s", "");
  row_t *rows;
  size_t n = collect(&rows);
  int rc = EX_OK;
  if (cmd_rundir_refused()) /* said why; an empty table would read as "nothing running" */
    rc = EX_FAILED;
  else if (prom)
    rc = write_prometheus(prom, rows, n);
  else if (cmd_json_out())
    print_json(stdout, rows, n);
  else
    print_table(stdout, rows, n);
  free_rows(rows, n);
  return rc;
}

int cmd_top(int argc, char **argv) {
  double interval = 2;
  long iterations = -1;
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int m;
    if ((m = cmd_opt_value(argc, argv, &i, "top", "--interval", &v)) != 0) {
      if (m < 0)
        return EX_USAGE;
      if (!cmd_parse_seconds(v, &interval) || interval < 0.1)
        return cmd_usage_error("top: bad interval %s (0.1 to 86400 seconds)", v);
    } else if ((m = cmd_opt_value(argc, argv, &i, "top", "--iterations", &v)) != 0) {
      if (m < 0)
        return EX_USAGE;
      char *end;
      errno = 0;
      iterations = strtol(v, &end, 10);
      if (errno || end == v || *end || iterations < 1)
        return cmd_usage_error("top: bad iterations %s (a whole number, 1 or more)", v);
    } else if (!strcmp(argv[i], "--json")) {
      cmd_set_json(true);
    } else {
      return cmd_usage_error("top: unknown option: %s", argv[i]);
    }
  }
  /* Clearing only makes sense on a terminal; piped, the frames follow one another. */
  bool clear = isatty(STDOUT_FILENO) && !cmd_json_out();
  for (long it = 0; iterations < 0 || it < iterations; it++) {
    if (it) {
      struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    }
    row_t *rows;
    size_t n = collect(&rows);
    if (cmd_rundir_refused()) {
      free_rows(rows, n);
      return EX_FAILED;
    }
    if (cmd_json_out()) {
      print_json(stdout, rows, n); /* one array per line: JSON Lines */
    } else {
      time_t now = time(NULL);
      char ts[64];
      strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
      printf("%sgpureclaim top - %s - %zu process%s (every %.1fs, ^C quits)\n\n", clear ? "\033[H\033[2J" : "", ts,
             n, n == 1 ? "" : "es", interval);
      print_table(stdout, rows, n);
    }
    free_rows(rows, n);
    /* Output that cannot be written ends top, which would otherwise go on forever (`top > /dev/full`), with
     * the error as main() reports it for the other commands; a reader that went away (EPIPE) ends it without
     * one. What could not be written is discarded so that main() does not try, and report, it again. */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
      int e = errno ? errno : EIO;
      __fpurge(stdout);
      clearerr(stdout);
      if (e == EPIPE)
        return EX_OK;
      fprintf(stderr, "gpureclaim: cannot write the output: %s\n", strerror(e));
      return EX_FAILED;
    }
  }
  return EX_OK;
}
