/*
 * cmd_snapshot.c -- `gpureclaim snapshot PID [--json] [--leaks] [--timeout S]`: the process's live blocks grouped by device,
 * context, kind and calling library, largest group first; or its leak report, laid out like LeakSanitizer's.
 */
#include "command.h"
#include "common.h"
#include "names.h"
#include "options.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct group {
  int64_t device;
  const char *context, *kind, *library;
  uint64_t blocks, bytes, orphans;
} group_t;

static int by_bytes(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static void print_snapshot(const jnode_t *snap) {
  const jnode_t *blocks = jget(snap, "blocks");
  size_t nb = blocks && blocks->type == JN_ARR ? blocks->n : 0;
  group_t *g = calloc(nb ? nb : 1, sizeof *g);
  if (!g)
    return;
  size_t ng = 0;
  for (size_t i = 0; i < nb; i++) {
    const jnode_t *b = &blocks->kids[i];
    group_t key = {jint(b, "device", -1), jstr(b, "context", "-"), jstr(b, "kind", "?"), jstr(b, "library", "?"),
                   0, 0, 0};
    size_t k = 0;
    while (k < ng && !(g[k].device == key.device && !strcmp(g[k].context, key.context) &&
                       !strcmp(g[k].kind, key.kind) && !strcmp(g[k].library, key.library)))
      k++;
    if (k == ng)
      g[ng++] = key;
    g[k].blocks++;
    g[k].bytes += (uint64_t)jint(b, "bytes", 0);
    g[k].orphans += !strcmp(jstr(b, "state", ""), gr_block_state_name(GPURECLAIM_BLOCK_ORPHAN));
  }
  qsort(g, ng, sizeof *g, by_bytes);
  const jnode_t *t = jget(snap, "total");
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  long long live_n = (long long)jint(t, "live_blocks", 0), orph_n = (long long)jint(t, "orphan_blocks", 0);
  printf("pid %lld: %lld live block%s, %s live (peak %s), %lld orphan%s (%s), pools hold %s, %s pinned host memory\n",
         (long long)jint(snap, "pid", 0), live_n, gr_plural(live_n),
         cmd_bytes((uint64_t)jint(t, "live_bytes", 0), b1, 32), cmd_bytes((uint64_t)jint(t, "peak_bytes", 0), b2, 32),
         orph_n, gr_plural(orph_n), cmd_bytes((uint64_t)jint(t, "orphan_bytes", 0), b3, 32),
         cmd_bytes((uint64_t)jint(t, "pool_reserved_bytes", 0), b4, 32),
         cmd_bytes((uint64_t)jint(t, "host_pinned_bytes", 0), b5, 32));
  printf("\n%-6s %-16s %-12s %-32s %8s %8s %12s\n", "DEVICE", "CONTEXT", "KIND", "LIBRARY", "BLOCKS", "ORPHANS",
         "BYTES");
  for (size_t i = 0; i < ng; i++) {
    char dev[24];
    snprintf(dev, sizeof dev, g[i].device < 0 ? "host" : "%lld", (long long)g[i].device);
    printf("%-6s %-16s %-12s %-32.32s %8llu %8llu %12s\n", dev, g[i].context, g[i].kind, g[i].library,
           (unsigned long long)g[i].blocks, (unsigned long long)g[i].orphans, cmd_bytes(g[i].bytes, b1, 32));
  }
  if (!ng)
    printf("(no live blocks)\n");
  free(g);
}

static void print_leaks(const jnode_t *l) {
  char b[32];
  printf("=================================================================\n");
  long long n = (long long)jint(l, "blocks", 0);
  printf("gpureclaim: pid %lld: %lld block%s (%s) %s never freed\n", (long long)jint(l, "pid", 0), n, gr_plural(n),
         cmd_bytes((uint64_t)jint(l, "bytes", 0), b, 32), n == 1 ? "was" : "were");
  const jnode_t *d = jget(l, "devices");
  for (size_t i = 0; d && d->type == JN_ARR && i < d->n; i++) {
    int64_t dev = jint(&d->kids[i], "device", -1);
    if (dev < 0)
      printf("Host (pinned): ");
    else
      printf("Device %lld: ", (long long)dev);
    long long dn = (long long)jint(&d->kids[i], "blocks", 0);
    printf("%lld block%s, %s\n", dn, gr_plural(dn), cmd_bytes((uint64_t)jint(&d->kids[i], "bytes", 0), b, 32));
  }
  const jnode_t *g = jget(l, "groups");
  for (size_t i = 0; g && g->type == JN_ARR && i < g->n; i++) {
    const jnode_t *x = &g->kids[i];
    const char *sym = jstr(x, "symbol", NULL);
    long long gn = (long long)jint(x, "blocks", 0);
    printf("\n%lld block%s, %s (%s) allocated by %s at %s%s%s%s\n", gn, gr_plural(gn),
           cmd_bytes((uint64_t)jint(x, "bytes", 0), b, 32), jstr(x, "kind", "?"), jstr(x, "library", "?"),
           jstr(x, "caller", "?"), sym ? " (" : "", sym ? sym : "", sym ? ")" : "");
    const jnode_t *fr = jget(x, "frames"), *at = jget(x, "locations");
    for (size_t k = 0; fr && fr->type == JN_ARR && k < fr->n; k++) {
      /* module+offset, for addr2line (libraries before 0.1.1 send frames only) */
      const char *loc = at && at->type == JN_ARR && k < at->n && at->kids[k].type == JN_STR ? at->kids[k].s : NULL;
      char where[300] = "";
      if (loc)
        snprintf(where, sizeof where, " (%s)", loc);
      printf("    #%zu %s%s\n", k, fr->kids[k].type == JN_STR ? fr->kids[k].s : "?", cmd_printable(where));
    }
  }
}

static const cmd_opt_t g_opts[] = {
    {'l', 'l', "leaks", CMD_NOARG, NULL, "the leak report instead: blocks never freed, by library and caller"},
    {'j', 'j', "json", CMD_NOARG, NULL, "the answer as JSON (the formats of docs/PROTOCOL.md)"},
    {'t', 't', "timeout", CMD_ARG, "S", "how long to wait for the answer, in seconds (default 30; a stopped process\n"
                                       "gives none)"},
    {0}};

const cmd_spec_t cmd_snapshot_spec = {
    .name = "snapshot",
    .usage = "snapshot [options] PID",
    .summary = "live blocks grouped by device, context, kind and calling library; --leaks: the leak report",
    .text = "The process's live blocks grouped by device, context, kind and calling library, largest first, with\n"
            "orphans counted; or its leak report. Asked over its control socket (docs/PROTOCOL.md).\n",
    .opts = g_opts,
    .tail = "",
};

int cmd_snapshot(int argc, char **argv) {
  bool leaks = false;
  pid_t pid = 0;
  double timeout = 30;
  optind = 1;
  int c;
  while ((c = cmd_getopt(argc, argv, &cmd_snapshot_spec)) != -1) {
    switch (c) {
    case 'j':
      cmd_set_json(true);
      break;
    case 'l':
      leaks = true;
      break;
    case 't':
      if (!cmd_parse_seconds(optarg, &timeout) || timeout <= 0)
        return cmd_usage_error("snapshot: bad timeout %s (seconds, more than 0 and at most 86400)", optarg);
      break;
    case 'h':
      return cmd_help(&cmd_snapshot_spec);
    default:
      return EX_USAGE;
    }
  }
  for (int i = optind; i < argc; i++) {
    if (pid)
      return cmd_usage_error("snapshot: one pid at a time (got %s too)", argv[i]);
    if (!cmd_parse_pid(argv[i], &pid))
      return cmd_usage_error("snapshot: not a pid: %s", argv[i]);
  }
  if (!pid)
    return cmd_usage_error("snapshot: give a pid%s", "");
  proc_t p;
  int rc = cmd_find(pid, &p);
  if (rc != EX_OK)
    return rc;
  const char *why = "";
  const char *key = leaks ? "leaks" : "snapshot";
  jnode_t *ans = cmd_ask(&p, key, timeout, &why, NULL);
  const jnode_t *body = ans && jbool(ans, "ok", false) ? jget(ans, key) : NULL;
  if (!body || body->type != JN_OBJ) {
    fprintf(stderr, "gpureclaim: %d did not answer: %s\n", (int)pid, ans ? jstr(ans, "error", "its answer holds no report") : why);
    rc = EX_FAILED;
  } else if (cmd_json_out()) {
    cmd_json_dump(stdout, body);
    putchar('\n');
  } else if (leaks) {
    print_leaks(body);
  } else {
    print_snapshot(body);
  }
  if (ans) {
    jdelete(ans);
  }
  cmd_free(&p);
  return rc;
}
