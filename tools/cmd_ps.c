/*
 * cmd_ps.c -- `gpureclaim ps`: its options, and the loop that collects the view (ps_view.c) and prints it as a
 * table (ps_view.c) or in a format for programs (ps_format.c).
 */
#include "ps.h"
#include "common.h"
#include "names.h"
#include "options.h"
#include "outfile.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the command ---- */

enum { O_PROMETHEUS = 256, O_LABEL };
/* --query's help names every field of ps_fields, in order: made from that list (ps_query_help()). */
static char g_query_help[1024] = "only these fields, comma-separated, in this order";
static cmd_opt_t g_opts[] = {
    {'i', 'i', "gpu", CMD_ARG, "GPUS", "only these GPUs: indices as nvidia-smi numbers them, or UUIDs (a unique\n"
                                      "prefix does), comma-separated, as nvidia-smi -i takes them; each process's\n"
                                      "figures are then those GPUs' only. An ambiguous prefix, or a GPU none of\n"
                                      "your running processes can see, is an error (exit 2)"},
    {'S', 'S', "sort", CMD_ARG, "FIELD", "held (default), cached, releasable, orphan, live, pinned, releases\n"
                                        "(largest first), pid, command, gpu"},
    {'j', 'j', "json", CMD_NOARG, NULL, "one JSON array, one object per process (docs/PROTOCOL.md)"},
    {'q', 'q', "query", CMD_ARG, "FIELDS", g_query_help},
    {'f', 'f', "format", CMD_ARG, "FMT", "table (default), csv (a header line, then bytes as integers) or json;\n"
                                        "with noheader and nounits (bytes as integers) as nvidia-smi takes them:\n"
                                        "csv,noheader,nounits (any order, any case)"},
    {O_PROMETHEUS, 0, "prometheus", CMD_ARG, "FILE", "node_exporter's textfile format to FILE (atomically; - for\n"
                                                    "standard output)"},
    {O_LABEL, 0, "label", CMD_ARG, "NAME=VALUE", "a label every Prometheus sample gets (pod=..., job=...);\n"
                                                "repeat for more"},
    {'l', 'l', "loop", CMD_ARG, "S", "again every S seconds until ^C, as nvidia-smi -l: a CSV header once,\n"
                                    "JSON one object (or array) per line, the Prometheus file rewritten"},
    {0}};

const cmd_spec_t cmd_ps_spec = {
    .name = "ps",
    .usage = "ps [options] [PID...]",
    .summary = "your processes running gpureclaim: device memory held, cached (pools and framework caches),\n"
               "      orphaned, pinned host memory, releases; with a table of their GPUs",
    .text = "Your processes running gpureclaim (those given, or all), largest first, with totals per GPU.\n",
    .opts = g_opts,
    .tail = "GPU table: USED and TOTAL as the driver reports them (nvidia-smi's figures); HELD: what gpureclaim tracks\n"
            "in its processes there (live blocks and pools' unused memory); RELEASABLE: what they could give back\n"
            "(cached and orphaned); OTHER: USED - HELD (contexts' own memory, memory gpureclaim does not see, other\n"
            "processes). Processes: HELD; CACHED: pools' unused memory and framework caches' releasable part (PyTorch:\n"
            "reserved - allocated - non-releasable, as torch.cuda.memory_summary() splits it); ORPHAN: memory of ended\n"
            "scopes; PINNED: pinned host memory; REL: releases so far.\n",
};

/* Options shared by ps and top (ps.h); the rest are each command's. */
typedef struct ps_opts {
  ps_filter_t filter;
  int sort;
  int fmt;
  bool header, units; /* --format's noheader and nounits */
  double loop;        /* --loop S: again every S seconds (0: once) */
  int query[PS_QUERY_MAX];
  size_t nquery;
  const char *prom;
} ps_opts_t;

/* --query FIELDS: names, comma-separated, spaces around them allowed ('pid, held', as nvidia-smi takes them). */
static int parse_query(const char *s, ps_opts_t *o) {
  o->nquery = 0;
  while (*s) {
    s += strspn(s, " \t");
    size_t n = strcspn(s, ","), m = n;
    while (m > 0 && (s[m - 1] == ' ' || s[m - 1] == '\t'))
      m--;
    int i = ps_field_index(s, m);
    if (i < 0 || o->nquery == sizeof o->query / sizeof o->query[0]) {
      const char *names[PS_QUERY_MAX];
      size_t nn = ps_nfields < PS_QUERY_MAX ? ps_nfields : PS_QUERY_MAX;
      for (size_t k = 0; k < nn; k++)
        names[k] = ps_fields[k].name;
      char word[64];
      snprintf(word, sizeof word, "%.*s", (int)(m < 60 ? m : 60), s);
      const char *near = cmd_nearest(word, names, nn);
      fprintf(stderr, "gpureclaim: ps: unknown field in --query: %s%s%s%s\n(see gpureclaim ps --help)\n", word,
              near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
      return -1;
    }
    o->query[o->nquery++] = i;
    s += n + (s[n] == ',');
  }
  if (!o->nquery)
    return cmd_usage_error("ps: --query needs fields%s", ""), -1;
  return 0;
}

/* --format: table, csv or json, with noheader and nounits, comma-separated, any order and case
 * ("csv,noheader,nounits", "CSV"), as nvidia-smi's --format takes them. */
static int parse_format(const char *s, ps_opts_t *o) {
  int fmt = -1;
  bool header = true, units = true;
  for (const char *p = s; *p;) {
    p += strspn(p, " ");
    size_t n = strcspn(p, ","), m = n;
    while (m > 0 && p[m - 1] == ' ')
      m--;
    int f = -2;
    if (m == 5 && !strncasecmp(p, "table", 5)) f = OUT_TABLE;
    else if (m == 3 && !strncasecmp(p, "csv", 3)) f = OUT_CSV;
    else if (m == 4 && !strncasecmp(p, "json", 4)) f = OUT_JSON;
    else if (m == 8 && !strncasecmp(p, "noheader", 8)) header = false, f = -1;
    else if (m == 7 && !strncasecmp(p, "nounits", 7)) units = false, f = -1;
    if (f == -2 || (f >= 0 && fmt >= 0 && f != fmt))
      return cmd_usage_error("ps: unknown --format %s (table, csv or json; with noheader, nounits: csv,noheader,nounits)",
                             s);
    if (f >= 0)
      fmt = f;
    p += n + (p[n] == ',');
  }
  o->fmt = fmt >= 0 ? fmt : OUT_TABLE;
  o->header = header;
  o->units = units;
  return EX_OK;
}

/* --query's help: "only these fields, ...: pid, command, ..." wrapped at 75 columns. */
static void ps_query_help(void) {
  size_t n = strlen(g_query_help), col = n;
  if (strchr(g_query_help, ':'))
    return; /* made already */
  n += (size_t)snprintf(g_query_help + n, sizeof g_query_help - n, ":");
  col++;
  for (size_t i = 0; i < ps_nfields && n < sizeof g_query_help; i++) {
    size_t w = strlen(ps_fields[i].name) + 2;
    if (col + w > 75) {
      n += (size_t)snprintf(g_query_help + n, sizeof g_query_help - n, "\n%s%s", ps_fields[i].name,
                            i + 1 < ps_nfields ? "," : "");
      col = w - 1;
    } else {
      n += (size_t)snprintf(g_query_help + n, sizeof g_query_help - n, " %s%s", ps_fields[i].name,
                            i + 1 < ps_nfields ? "," : "");
      col += w;
    }
  }
}

/* ^C and SIGTERM end ps --loop between two rounds (exit status 0, as they end nvidia-smi -l). */
static volatile sig_atomic_t g_stop;
static void on_stop(int sig) {
  (void)sig;
  g_stop = 1;
}

/* One round of ps: collect, check, print. */
static int ps_once(ps_opts_t *o, bool first, bool *found) {
  ps_view_t v;
  ps_collect(&v, &o->filter, o->sort);
  int rc = EX_OK;
  if (cmd_rundir_refused()) /* said why; an empty table would read as "nothing running" */
    rc = EX_FAILED;
  else if ((rc = ps_check_filter(&v, &o->filter, "ps")) != EX_OK)
    ;
  else if (o->prom)
    rc = ps_write_prometheus(o->prom, &v, &o->filter);
  else if (o->nquery)
    ps_print_query(stdout, &v, o->query, o->nquery, o->fmt, o->header && first, o->units);
  else if (o->fmt == OUT_JSON)
    ps_print_json(stdout, &v, &o->filter);
  else {
    if (o->loop > 0) {
      char when[64];
      printf("%sgpureclaim ps - %s\n\n", first ? "" : "\n", cmd_iso_time(v.time_ms, when, sizeof when));
    }
    ps_print_table(stdout, &v, &o->filter, first);
  }
  for (size_t i = 0; i < o->filter.npids; i++) /* the pids given that were found */
    for (size_t k = 0; k < v.n; k++)
      found[i] |= v.rows[k].p.pid == o->filter.pids[i];
  ps_free(&v);
  return rc;
}

int cmd_ps(int argc, char **argv) {
  ps_opts_t o = {.sort = ps_sort_key("held"), .fmt = OUT_TABLE, .header = true, .units = true};
  bool json = false, fmt_given = false;
  ps_query_help();
  optind = 1;
  int c;
  while ((c = cmd_getopt(argc, argv, &cmd_ps_spec)) != -1) {
    switch (c) {
    case 'i':
      if (!ps_parse_filter(optarg, &o.filter))
        return cmd_usage_error("ps: bad --gpu %s (indices or UUIDs, comma-separated)", optarg);
      break;
    case 'S':
      if ((o.sort = ps_sort_key(optarg)) < 0)
        return cmd_usage_error("ps: unknown --sort field %s", optarg);
      break;
    case 'j': json = true; break;
    case 'q':
      if (parse_query(optarg, &o) != 0)
        return EX_USAGE;
      break;
    case 'f':
      fmt_given = true;
      if (parse_format(optarg, &o) != EX_OK)
        return EX_USAGE;
      break;
    case O_PROMETHEUS:
      if (!*optarg)
        return cmd_usage_error("ps: --prometheus needs a file (or - for standard output)%s", "");
      o.prom = optarg;
      break;
    case O_LABEL:
      if (ps_add_label(optarg) != EX_OK)
        return EX_USAGE;
      break;
    case 'l':
      if (!cmd_parse_seconds(optarg, &o.loop) || o.loop < 0.1)
        return cmd_usage_error("ps: bad --loop %s (0.1 to 86400 seconds)", optarg);
      break;
    case 'h':
      return cmd_help(&cmd_ps_spec);
    default:
      return EX_USAGE;
    }
  }
  /* ps PID...: only those processes (nvidia-smi's habit, and procps' ps -p). */
  for (int i = optind; i < argc; i++)
    if (o.filter.npids == PS_MAX_PIDS || !cmd_parse_pid(argv[i], &o.filter.pids[o.filter.npids++]))
      return cmd_usage_error("ps: not a pid: %s", argv[i]);
  if (json && fmt_given && o.fmt != OUT_JSON)
    return cmd_usage_error("ps: --json and --format %s are two formats: give one", o.fmt == OUT_CSV ? "csv" : "table");
  if (json)
    o.fmt = OUT_JSON;
  if (o.prom && json)
    return cmd_usage_error("ps: --json and --prometheus are two formats: give one%s", "");
  if (o.prom && (fmt_given || o.nquery))
    return cmd_usage_error("ps: --prometheus is a format of its own: give no --json, --query or --format%s", "");
  if (ps_label_count() && !o.prom)
    return cmd_usage_error("ps: --label labels the Prometheus samples: give --prometheus FILE too%s", "");
  if (o.fmt == OUT_CSV && !o.nquery) /* every field, in the help's order */
    for (size_t i = 0; i < ps_nfields; i++)
      o.query[o.nquery++] = (int)i;
  cmd_set_json(o.fmt == OUT_JSON);
  bool found[PS_MAX_PIDS] = {false};
  int rc = ps_once(&o, true, found);
  if (o.loop > 0 && rc == EX_OK) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    while (rc == EX_OK && !g_stop) {
      errno = 0;
      if (fflush(stdout) != 0 || ferror(stdout))
        break; /* main() reports it (a reader gone: nothing) */
      struct timespec ts = {(time_t)o.loop, (long)((o.loop - (double)(time_t)o.loop) * 1e9)};
      while (!g_stop && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
      if (!g_stop)
        rc = ps_once(&o, false, found);
    }
  }
  /* A pid given that runs no gpureclaim: why (as release PID says it), exit status 3. */
  for (size_t i = 0; rc == EX_OK && i < o.filter.npids; i++)
    if (!found[i]) {
      proc_t p;
      if (cmd_find(o.filter.pids[i], &p) == EX_OK) /* it runs gpureclaim, on other GPUs than those selected */
        cmd_free(&p);
      else
        rc = EX_NOPROC;
    }
  return rc;
}
