/*
 * cmd_ps.c -- `gpureclaim ps`: your processes running gpureclaim, sorted (by device memory held, --sort), with
 * totals per GPU (the driver's used and total memory beside what gpureclaim's processes hold and could give
 * back), as a table, --json, --query FIELDS with --format csv, or node_exporter's textfile format. cmd_top.c
 * draws the same rows (ps.h). Live numbers come from each process's control socket (`stats`, which carries
 * framework caches and the GPUs' UUIDs and driver figures); a process that does not answer is still listed,
 * from its status file, marked as not answering.
 */
#include "ps.h"
#include "common.h"
#include "names.h"
#include "options.h"
#include "outfile.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* ---- reading the stats answer ---- */

static uint64_t u64(const jnode_t *o, const char *field) {
  int64_t v = jint(o, field, 0);
  return v > 0 ? (uint64_t)v : 0;
}

static const jnode_t *arr(const jnode_t *o, const char *key) {
  const jnode_t *a = jget(o, key);
  return a && a->type == JN_ARR ? a : NULL;
}

static uint64_t pool_cached(const jnode_t *s) {
  uint64_t reserved = u64(s, "pool_reserved_bytes"), used = u64(s, "pool_used_bytes");
  return reserved > used ? reserved - used : 0;
}

/* Whether device d is among those shown. */
static bool selected(const ps_filter_t *f, int d, const char *uuid) {
  if (!f || !f->n)
    return true;
  for (size_t i = 0; i < f->n; i++) {
    const char *s = f->sel[i];
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end) {
      if (v == d)
        return true;
      continue;
    }
    if (!uuid || !*uuid)
      continue;
    const char *u = uuid;
    if (strncasecmp(s, "GPU-", 4) != 0 && strncasecmp(u, "GPU-", 4) == 0)
      u += 4; /* a UUID given without its prefix */
    if (!strncasecmp(u, s, strlen(s)))
      return true;
  }
  return false;
}

bool ps_parse_filter(const char *s, ps_filter_t *f) {
  memset(f, 0, sizeof *f);
  while (*s) {
    size_t n = strcspn(s, ",");
    if (!n || n >= PS_UUID_LEN || f->n == PS_MAX_GPUS)
      return false;
    memcpy(f->sel[f->n], s, n);
    f->sel[f->n][n] = '\0';
    for (size_t i = 0; i < n; i++)
      if (!isalnum((unsigned char)s[i]) && s[i] != '-')
        return false;
    f->n++;
    s += n;
    if (*s == ',' && !*++s)
      return false;
  }
  return f->n > 0;
}

/* The UUID of device d from a process's `stats` gpus, else its status file's; "" if unknown. */
static const char *uuid_of(const ps_row_t *r, int d) {
  const jnode_t *srcs[2] = {arr(r->stats, "gpus"), arr(r->p.status, "gpus")};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; srcs[k] && i < srcs[k]->n; i++)
      if (jint(&srcs[k]->kids[i], "device", -1) == d)
        return jstr(&srcs[k]->kids[i], "uuid", "");
  return "";
}

/* A GPU is one UUID: processes number devices each their own way (CUDA_VISIBLE_DEVICES), so the ordinal only
 * names GPUs whose UUID is unknown (and the first ordinal seen is shown). */
static ps_gpu_t *gpu_of(ps_view_t *v, int d, const char *uuid) {
  for (size_t i = 0; i < v->ngpus; i++)
    if (uuid && *uuid && v->gpus[i].uuid[0] ? !strcmp(v->gpus[i].uuid, uuid) : v->gpus[i].device == d) {
      if (!v->gpus[i].uuid[0] && uuid && *uuid)
        snprintf(v->gpus[i].uuid, sizeof v->gpus[i].uuid, "%s", uuid);
      return &v->gpus[i];
    }
  if (v->ngpus == PS_MAX_GPUS)
    return NULL;
  ps_gpu_t *g = &v->gpus[v->ngpus++];
  memset(g, 0, sizeof *g);
  g->device = d;
  snprintf(g->uuid, sizeof g->uuid, "%s", uuid ? uuid : "");
  return g;
}

/* Sums a process's figures over the GPUs shown, and adds them to those GPUs' totals. false when it uses none
 * of them (answering processes only: one that does not answer is shown, as it may). */
static bool figures(ps_view_t *v, ps_row_t *r, const ps_filter_t *f) {
  r->pinned = u64(jget(r->stats, "total"), "host_pinned_bytes");
  if (!r->stats) {
    snprintf(r->gpus, sizeof r->gpus, "?");
    return true;
  }
  int used[PS_MAX_GPUS];
  size_t nused = 0;
  /* The GPUs it uses: blocks or pools there, a context there, or a framework cache there. */
  const jnode_t *lists[3] = {arr(r->stats, "devices"), arr(r->stats, "gpus"), arr(r->stats, "frameworks")};
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; lists[k] && i < lists[k]->n; i++) {
      int d = (int)jint(&lists[k]->kids[i], "device", -1);
      bool seen = d < 0;
      for (size_t j = 0; j < nused && !seen; j++)
        seen = used[j] == d;
      if (!seen && nused < PS_MAX_GPUS && selected(f, d, uuid_of(r, d)))
        used[nused++] = d;
    }
  for (size_t i = 1; i < nused; i++) /* in order */
    for (size_t j = i; j > 0 && used[j - 1] > used[j]; j--) {
      int t = used[j];
      used[j] = used[j - 1];
      used[j - 1] = t;
    }
  size_t gl = 0, ul = 0;
  r->gpus[0] = r->uuids[0] = '\0';
  for (size_t i = 0; i < nused; i++) {
    int d = used[i];
    const char *uuid = uuid_of(r, d);
    gl += (size_t)snprintf(r->gpus + gl, gl < sizeof r->gpus ? sizeof r->gpus - gl : 0, "%s%d", i ? "," : "", d);
    ul += (size_t)snprintf(r->uuids + ul, ul < sizeof r->uuids ? sizeof r->uuids - ul : 0, "%s%s", i ? "," : "",
                           *uuid ? uuid : "?");
    uint64_t live = 0, pc = 0, orphan = 0, fr = 0, fa = 0, frel = 0;
    const jnode_t *devs = arr(r->stats, "devices"), *fws = arr(r->stats, "frameworks"), *gpus = arr(r->stats, "gpus");
    for (size_t k = 0; devs && k < devs->n; k++)
      if (jint(&devs->kids[k], "device", -1) == d) {
        live += u64(&devs->kids[k], "live_bytes");
        pc += pool_cached(&devs->kids[k]);
        orphan += u64(&devs->kids[k], "orphan_bytes");
      }
    for (size_t k = 0; fws && k < fws->n; k++)
      if (jint(&fws->kids[k], "device", -1) == d) {
        fr += u64(&fws->kids[k], "reserved_bytes");
        fa += u64(&fws->kids[k], "allocated_bytes");
        frel += u64(&fws->kids[k], "releasable_bytes");
      }
    r->live += live;
    r->pool_cached += pc;
    r->orphan += orphan;
    r->fw_reserved += fr;
    r->fw_allocated += fa;
    r->fw_releasable += frel;
    ps_gpu_t *g = gpu_of(v, d, uuid);
    if (!g)
      continue;
    g->procs++;
    g->held += live + pc;
    g->cached += pc + frel;
    g->orphan += orphan;
    g->releasable += pc + frel + orphan;
    for (size_t k = 0; gpus && k < gpus->n; k++)
      if (jint(&gpus->kids[k], "device", -1) == d && jget(&gpus->kids[k], "total_bytes")) {
        uint64_t fb = u64(&gpus->kids[k], "free_bytes"), tb = u64(&gpus->kids[k], "total_bytes");
        /* Each process read them at its own moment: the most used is the latest enough. */
        if (!g->have_mem || tb - fb > g->total - g->free) {
          g->free = fb;
          g->total = tb;
          g->have_mem = true;
        }
      }
  }
  if (!nused)
    snprintf(r->gpus, sizeof r->gpus, "-");
  r->held = r->live + r->pool_cached;
  r->cached = r->pool_cached + r->fw_releasable;
  r->releasable = r->cached + r->orphan;
  return nused > 0 || !f || !f->n;
}

/* ---- collecting and sorting ---- */

static void ask_stats(void *arg) {
  ps_row_t *r = arg;
  r->stats = cmd_ask(&r->p, "stats", 2.0, &r->why, NULL);
  if (r->stats && !jbool(r->stats, "ok", false)) {
    r->why = "it refused the stats request";
    jdelete(r->stats);
    r->stats = NULL;
  }
}

static void free_row(ps_row_t *r) {
  cmd_free(&r->p);
  jdelete(r->stats);
  r->stats = NULL;
}

enum { K_HELD, K_CACHED, K_RELEASABLE, K_ORPHAN, K_LIVE, K_PINNED, K_PID, K_COMMAND, K_GPU, K_RELEASES, K_N };
static const char *const g_sort_names[K_N] = {"held", "cached", "releasable", "orphan", "live",
                                              "pinned", "pid", "command", "gpu", "releases"};

int ps_sort_key(const char *name) {
  for (int k = 0; k < K_N; k++)
    if (!strcmp(name, g_sort_names[k]))
      return k;
  return -1;
}
const char *ps_sort_name(int key) { return key >= 0 && key < K_N ? g_sort_names[key] : "?"; }
int ps_sort_count(void) { return K_N; }

static int g_key; /* qsort has no argument */

static uint64_t sort_num(const ps_row_t *r, int key) {
  switch (key) {
  case K_HELD: return r->held;
  case K_CACHED: return r->cached;
  case K_RELEASABLE: return r->releasable;
  case K_ORPHAN: return r->orphan;
  case K_LIVE: return r->live;
  case K_PINNED: return r->pinned;
  case K_RELEASES: return u64(r->p.status, "releases");
  default: return 0;
  }
}

static int by_key(const void *a, const void *b) {
  const ps_row_t *x = a, *y = b;
  int c = 0;
  if (g_key == K_COMMAND) {
    c = strcmp(jstr(x->p.status, "cmdline", ""), jstr(y->p.status, "cmdline", ""));
  } else if (g_key == K_GPU) {
    c = strcmp(x->gpus, y->gpus);
  } else if (g_key != K_PID) {
    /* Largest first; a process that did not answer (numbers unknown) last. */
    if (!x->stats != !y->stats && g_key != K_RELEASES)
      return x->stats ? -1 : 1;
    uint64_t u = sort_num(x, g_key), v = sort_num(y, g_key);
    c = u > v ? -1 : u < v ? 1 : 0;
  }
  return c ? c : x->p.pid < y->p.pid ? -1 : x->p.pid > y->p.pid;
}

static int by_device(const void *a, const void *b) {
  const ps_gpu_t *x = a, *y = b;
  return x->device - y->device;
}

/* Adds the GPUs r reports to v->known: those it uses (as figures() finds them) and those its status file says
 * it can see, used or not. */
static void note_known(ps_view_t *v, const ps_row_t *r) {
  const jnode_t *lists[4] = {arr(r->stats, "devices"), arr(r->stats, "gpus"), arr(r->stats, "frameworks"),
                             arr(r->p.status, "gpus")};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; lists[k] && i < lists[k]->n; i++) {
      int d = (int)jint(&lists[k]->kids[i], "device", -1);
      if (d < 0)
        continue;
      const char *u = uuid_of(r, d);
      bool seen = false;
      for (size_t j = 0; j < v->nknown && !seen; j++)
        seen = v->known[j].device == d && !strcmp(v->known[j].uuid, u);
      if (!seen && v->nknown < PS_MAX_GPUS) {
        v->known[v->nknown].device = d;
        snprintf(v->known[v->nknown].uuid, sizeof v->known[v->nknown].uuid, "%s", u);
        v->nknown++;
      }
    }
}

int ps_check_filter(const ps_view_t *v, const ps_filter_t *f, const char *cmd) {
  for (size_t i = 0; f && i < f->n; i++) {
    ps_filter_t one = {1, {{0}}};
    memcpy(one.sel[0], f->sel[i], sizeof one.sel[0]);
    const char *uuids[PS_MAX_GPUS];
    size_t nu = 0;
    bool any = false;
    for (size_t j = 0; j < v->nknown; j++) {
      if (!selected(&one, v->known[j].device, v->known[j].uuid))
        continue;
      any = true;
      bool dup = false;
      for (size_t k = 0; k < nu && !dup; k++)
        dup = !strcmp(uuids[k], v->known[j].uuid);
      if (!dup && v->known[j].uuid[0])
        uuids[nu++] = v->known[j].uuid;
    }
    char *end;
    (void)strtol(one.sel[0], &end, 10);
    bool ordinal = *one.sel[0] && !*end;
    if (!ordinal && nu > 1) {
      fprintf(stderr, "gpureclaim: %s: GPU %s is ambiguous: it begins", cmd, one.sel[0]);
      for (size_t k = 0; k < nu; k++)
        fprintf(stderr, "%s %s", k ? (k + 1 == nu ? " and" : ",") : "", uuids[k]);
      fprintf(stderr, " (give more of the UUID)\n");
      return EX_USAGE;
    }
    if (!any && v->nknown) { /* (with no process of yours at all, nothing says which GPUs exist: none is used) */
      fprintf(stderr, "gpureclaim: %s: no GPU %s: no process of yours running gpureclaim can see it\n", cmd, one.sel[0]);
      return EX_USAGE;
    }
  }
  return EX_OK;
}

void ps_collect(ps_view_t *v, const ps_filter_t *f, int sort_key) {
  memset(v, 0, sizeof *v);
  proc_t *ps;
  size_t n = cmd_list(&ps);
  v->rows = calloc(n ? n : 1, sizeof *v->rows);
  if (!v->rows) {
    for (size_t i = 0; i < n; i++)
      cmd_free(&ps[i]);
    free(ps);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    v->rows[i].p = ps[i];
    v->rows[i].why = "";
  }
  free(ps);
  cmd_each_at_once(v->rows, n, sizeof *v->rows, ask_stats); /* a silent process costs its 2 s once */
  for (size_t i = 0; i < n; i++)
    note_known(v, &v->rows[i]);
  for (size_t i = 0; i < n; i++) {
    if (figures(v, &v->rows[i], f))
      v->rows[v->n++] = v->rows[i];
    else
      free_row(&v->rows[i]);
  }
  g_key = sort_key >= 0 && sort_key < K_N ? sort_key : K_HELD;
  if (v->n)
    qsort(v->rows, v->n, sizeof *v->rows, by_key);
  if (v->ngpus)
    qsort(v->gpus, v->ngpus, sizeof *v->gpus, by_device);
}

void ps_free(ps_view_t *v) {
  for (size_t i = 0; i < v->n; i++)
    free_row(&v->rows[i]);
  free(v->rows);
  v->rows = NULL;
  v->n = 0;
}

/* ---- the table ---- */

static const char *b(uint64_t v, char *buf, size_t len) { return cmd_bytes(v, buf, len); }

/* Cuts a line to width columns (0: no limit), at a character's start (a command line may be UTF-8). Each
 * character takes at least one byte, so the line never takes more columns than bytes: it never wraps. */
static void cut(char *buf, size_t len, int width) {
  if (width <= 0 || (size_t)width >= len || strlen(buf) <= (size_t)width)
    return;
  size_t w = (size_t)width;
  while (w > 0 && ((unsigned char)buf[w] & 0xc0) == 0x80)
    w--;
  while (w > 0 && buf[w - 1] == ' ')
    w--;
  buf[w] = '\0';
}

/* The UUID in full when the line has room for it, else its first 8 digits (still a unique prefix for -i in
 * practice, as nvidia-smi's -i takes one). */
static int uuid_width(int width) { return width == 0 || width >= 100 ? 40 : 12; }

void ps_gpu_header(char *buf, size_t len, int width) {
  snprintf(buf, len, "GPU %-*s %10s %10s %10s %10s %10s", uuid_width(width), "UUID", "USED", "TOTAL", "HELD",
           "RELEASABLE", "OTHER");
  cut(buf, len, width);
}

void ps_gpu_line(const ps_gpu_t *g, char *buf, size_t len, int width) {
  char b1[32] = "?", b2[32] = "?", b3[32], b4[32], b5[32] = "?";
  if (g->have_mem) {
    uint64_t used = g->total > g->free ? g->total - g->free : 0;
    b(used, b1, sizeof b1);
    b(g->total, b2, sizeof b2);
    b(used > g->held ? used - g->held : 0, b5, sizeof b5);
  }
  snprintf(buf, len, "%3d %-*.*s %10s %10s %10s %10s %10s", g->device, uuid_width(width), uuid_width(width),
           g->uuid[0] ? g->uuid : "?", b1, b2, b(g->held, b3, sizeof b3), b(g->releasable, b4, sizeof b4), b5);
  cut(buf, len, width);
}

#define ROW_FMT "%7s %-5.5s %10s %10s %10s %10s %4s %-8s %10s %s"
/* Below 100 columns STATE and HOST make way for COMMAND (which began past column 80 with them); a process
 * that is not awake says so after its command instead. */
#define ROW_FMT_NARROW "%7s %-5.5s %10s %10s %10s %10s %4s %s"
static bool narrow(int width) { return width > 0 && width < 100; }

/* The sleep state from the status file ("awake", "sleeping", "waking"; "awake" for a library without sleep). */
static const char *sleep_state(const ps_row_t *r) {
  return jstr(jget(r->p.status, "sleep"), "state", gr_sleep_state_name(GPURECLAIM_STATE_AWAKE));
}
static uint64_t sleep_host(const ps_row_t *r) { return u64(jget(r->p.status, "sleep"), "host_bytes"); }

void ps_row_header(char *buf, size_t len, int width) {
  if (narrow(width))
    snprintf(buf, len, ROW_FMT_NARROW, "PID", "GPU", "HELD", "CACHED", "ORPHAN", "PINNED", "REL", "COMMAND");
  else
    snprintf(buf, len, ROW_FMT, "PID", "GPU", "HELD", "CACHED", "ORPHAN", "PINNED", "REL", "STATE", "HOST",
             "COMMAND");
  cut(buf, len, width);
}

void ps_row_line(const ps_row_t *r, char *buf, size_t len, int width) {
  char pid[16], b1[32] = "?", b2[32] = "?", b3[32] = "?", b4[32] = "?", rel[24], cmdline[512], host[32] = "-";
  if (sleep_host(r))
    b(sleep_host(r), host, sizeof host);
  snprintf(pid, sizeof pid, "%d", (int)r->p.pid);
  snprintf(rel, sizeof rel, "%lld", (long long)jint(r->p.status, "releases", 0));
  if (r->stats) {
    b(r->held, b1, sizeof b1);
    b(r->cached, b2, sizeof b2);
    b(r->orphan, b3, sizeof b3);
    b(r->pinned, b4, sizeof b4);
  }
  cmd_command_of(&r->p, cmdline, sizeof cmdline);
  if (!r->stats) {
    size_t l = strlen(cmdline);
    snprintf(cmdline + l, sizeof cmdline - l, " [not answering: %s]", r->why);
  }
  if (narrow(width)) {
    size_t l = strlen(cmdline);
    if (strcmp(sleep_state(r), gr_sleep_state_name(GPURECLAIM_STATE_AWAKE)))
      snprintf(cmdline + l, sizeof cmdline - l, " [%s, %s on host]", sleep_state(r), host);
    snprintf(buf, len, ROW_FMT_NARROW, pid, r->gpus, b1, b2, b3, b4, rel, cmdline);
  } else {
    snprintf(buf, len, ROW_FMT, pid, r->gpus, b1, b2, b3, b4, rel, sleep_state(r), host, cmdline);
  }
  cut(buf, len, width);
}

/* Under the table: why these numbers are not nvidia-smi's. */
static const char g_footnote[] =
    "USED and TOTAL are the driver's figures, as nvidia-smi shows them; HELD is what\n"
    "gpureclaim tracks in its processes; OTHER = USED - HELD, what it does not see:\n"
    "each CUDA context's own memory (hundreds of MiB per process and GPU), memory of\n"
    "routes it does not intercept, and processes not started under gpureclaim.\n"
    "CACHED includes framework caches (PyTorch's releasable part).\n";

void ps_print_frameworks(FILE *f, const ps_row_t *r, const ps_filter_t *flt, int width) {
  const jnode_t *fws = arr(r->stats, "frameworks");
  for (size_t k = 0; fws && k < fws->n; k++) {
    const jnode_t *x = &fws->kids[k];
    int d = (int)jint(x, "device", -1);
    if (!selected(flt, d, uuid_of(r, d)))
      continue;
    uint64_t res = u64(x, "reserved_bytes"), al = u64(x, "allocated_bytes"), rel = u64(x, "releasable_bytes");
    uint64_t kept = res > al + rel ? res - al - rel : 0;
    char b1[32], b2[32], b3[32], b4[32], name[64], head[160], tail[160], line[400];
    snprintf(name, sizeof name, "%s", jstr(x, "framework", "?"));
    cmd_printable(name);
    snprintf(head, sizeof head, "%8s%s on GPU %d: %s reserved = %s in use", "", name, d, b(res, b1, sizeof b1),
             b(al, b2, sizeof b2));
    snprintf(tail, sizeof tail, "+ %s releasable + %s non-releasable", b(rel, b3, sizeof b3), b(kept, b4, sizeof b4));
    snprintf(line, sizeof line, "%s %s", head, tail);
    if (width > 0 && strlen(line) > (size_t)width) /* two lines rather than one cut short */
      snprintf(line, sizeof line, "%s\n%10s%s", head, "", tail);
    for (char *l = line, *nl; l; l = nl) {
      nl = strchr(l, '\n');
      if (nl)
        *nl++ = '\0';
      cut(l, sizeof line - (size_t)(l - line), width);
      fprintf(f, "%s\n", l);
    }
  }
}

static int term_width(void) {
  struct winsize ws;
  if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0)
    return 0;
  return ws.ws_col;
}

void ps_print_table(FILE *f, const ps_view_t *v, const ps_filter_t *flt, bool footnote) {
  char line[1024];
  int width = term_width();
  if (v->ngpus) {
    ps_gpu_header(line, sizeof line, width);
    fprintf(f, "%s\n", line);
    for (size_t i = 0; i < v->ngpus; i++) {
      ps_gpu_line(&v->gpus[i], line, sizeof line, width);
      fprintf(f, "%s\n", line);
    }
    fputc('\n', f);
  }
  ps_row_header(line, sizeof line, width);
  fprintf(f, "%s\n", line);
  for (size_t i = 0; i < v->n; i++) {
    ps_row_line(&v->rows[i], line, sizeof line, width);
    fprintf(f, "%s\n", line);
    ps_print_frameworks(f, &v->rows[i], flt, width);
  }
  if (!v->n)
    fprintf(f, "(no process of yours is running gpureclaim%s)\n", flt && flt->n ? " on the GPUs selected" : "");
  else if (footnote && v->ngpus)
    fprintf(f, "\n%s", g_footnote);
}

/* ---- --query fields: table, CSV, JSON ---- */

enum { F_NUM, F_BYTES, F_STR, F_BOOL };

typedef struct field {
  const char *name, *header;
  int type;
  bool from_stats; /* unknown (null, empty, ?) when the process did not answer */
} field_t;

static const field_t g_fields[] = {
    {"pid", "PID", F_NUM, false},
    {"command", "COMMAND", F_STR, false},
    {"program", "PROGRAM", F_STR, false},
    {"answered", "ANSWERED", F_BOOL, false},
    {"gpu", "GPU", F_STR, true},
    {"gpu_uuid", "GPU UUID", F_STR, true},
    {"held", "HELD", F_BYTES, true},
    {"live", "LIVE", F_BYTES, true},
    {"cached", "CACHED", F_BYTES, true},
    {"pool_cached", "POOL CACHED", F_BYTES, true},
    {"framework_reserved", "FW RESERVED", F_BYTES, true},
    {"framework_in_use", "FW IN USE", F_BYTES, true},
    {"framework_releasable", "FW RELEASABLE", F_BYTES, true},
    {"orphan", "ORPHAN", F_BYTES, true},
    {"releasable", "RELEASABLE", F_BYTES, true},
    {"pinned", "PINNED", F_BYTES, true},
    {"releases", "RELEASES", F_NUM, false},
    {"released", "RELEASED", F_BYTES, true},
    {"last_release", "LAST RELEASE", F_BYTES, false},
    {"signal", "SIGNAL", F_STR, false},
    {"state", "STATE", F_STR, false},
    {"host", "HOST", F_BYTES, false},
    {"error", "ERROR", F_STR, false},
};
#define NFIELDS (sizeof g_fields / sizeof g_fields[0])

static int field_index(const char *name, size_t n) {
  for (size_t i = 0; i < NFIELDS; i++)
    if (strlen(g_fields[i].name) == n && !strncmp(g_fields[i].name, name, n))
      return (int)i;
  return -1;
}

/* A field's value: *num for numbers, bytes and booleans, else the string. */
static const char *field_value(const ps_row_t *r, int i, uint64_t *num, char *buf, size_t len) {
  *num = 0;
  const char *name = g_fields[i].name;
  if (!strcmp(name, "pid")) *num = (uint64_t)r->p.pid;
  else if (!strcmp(name, "command")) return cmd_command_of(&r->p, NULL, 0); /* as recorded */
  else if (!strcmp(name, "program")) { cmd_program_of(&r->p, buf, len); return buf; }
  else if (!strcmp(name, "answered")) *num = r->stats != NULL;
  else if (!strcmp(name, "gpu")) return r->gpus;
  else if (!strcmp(name, "gpu_uuid")) return r->uuids;
  else if (!strcmp(name, "held")) *num = r->held;
  else if (!strcmp(name, "live")) *num = r->live;
  else if (!strcmp(name, "cached")) *num = r->cached;
  else if (!strcmp(name, "pool_cached")) *num = r->pool_cached;
  else if (!strcmp(name, "framework_reserved")) *num = r->fw_reserved;
  else if (!strcmp(name, "framework_in_use")) *num = r->fw_allocated;
  else if (!strcmp(name, "framework_releasable")) *num = r->fw_releasable;
  else if (!strcmp(name, "orphan")) *num = r->orphan;
  else if (!strcmp(name, "releasable")) *num = r->releasable;
  else if (!strcmp(name, "pinned")) *num = r->pinned;
  else if (!strcmp(name, "releases")) *num = u64(r->p.status, "releases");
  else if (!strcmp(name, "released")) *num = u64(jget(r->stats, "total"), "released_bytes");
  else if (!strcmp(name, "last_release")) {
    const jnode_t *lr = jget(r->p.status, "last_release");
    *num = u64(lr, "cached_bytes") + u64(lr, "orphaned_bytes") + u64(lr, "all_bytes");
  } else if (!strcmp(name, "signal")) return jstr(r->p.status, "signal", "?");
  else if (!strcmp(name, "state")) return sleep_state(r);
  else if (!strcmp(name, "host")) *num = sleep_host(r);
  else if (!strcmp(name, "error")) return r->stats ? "" : r->why;
  return NULL;
}

static void csv_str(FILE *f, const char *s) {
  if (!s[strcspn(s, ",\"\n\r")]) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

enum { OUT_TABLE, OUT_CSV, OUT_JSON };

static void print_query(FILE *f, const ps_view_t *v, const int *q, size_t nq, int fmt, bool header) {
  char buf[512], num[32];
  if (fmt == OUT_JSON)
    fputc('[', f);
  if (fmt == OUT_CSV && header) {
    for (size_t k = 0; k < nq; k++)
      fprintf(f, "%s%s", k ? "," : "", g_fields[q[k]].name);
    fputc('\n', f);
  }
  if (fmt == OUT_TABLE) {
    for (size_t k = 0; k < nq; k++)
      fprintf(f, "%s%*s", k ? " " : "", g_fields[q[k]].type == F_STR ? -12 : 10, g_fields[q[k]].header);
    fputc('\n', f);
  }
  for (size_t i = 0; i < v->n; i++) {
    const ps_row_t *r = &v->rows[i];
    if (fmt == OUT_JSON)
      fputs(i ? ",{" : "{", f);
    for (size_t k = 0; k < nq; k++) {
      const field_t *fd = &g_fields[q[k]];
      uint64_t n;
      const char *s = field_value(r, q[k], &n, buf, sizeof buf);
      bool unknown = fd->from_stats && !r->stats;
      if (fmt == OUT_JSON) {
        fprintf(f, "%s\"%s\":", k ? "," : "", fd->name);
        if (unknown)
          fputs("null", f);
        else if (fd->type == F_STR)
          cmd_json_str(f, s ? s : "");
        else if (fd->type == F_BOOL)
          fputs(n ? "true" : "false", f);
        else
          fprintf(f, "%llu", (unsigned long long)n);
        continue;
      }
      if (k)
        fputs(fmt == OUT_CSV ? "," : " ", f);
      if (unknown) {
        fputs(fmt == OUT_CSV ? "" : "         ?", f);
        continue;
      }
      if (fd->type == F_STR && fmt == OUT_CSV) {
        csv_str(f, s ? s : ""); /* whole: a command line may be long */
      } else if (fd->type == F_STR) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", s ? s : "");
        fprintf(f, "%-12s", cmd_printable(tmp));
      } else if (fd->type == F_BOOL) {
        fprintf(f, fmt == OUT_CSV ? "%s" : "%10s", n ? "yes" : "no");
      } else if (fd->type == F_BYTES && fmt == OUT_TABLE) {
        fprintf(f, "%10s", b(n, num, sizeof num));
      } else {
        fprintf(f, fmt == OUT_CSV ? "%llu" : "%10llu", (unsigned long long)n);
      }
    }
    fputs(fmt == OUT_JSON ? "}" : "\n", f);
  }
  if (fmt == OUT_JSON)
    fputs("]\n", f);
}

/* ---- --json: one array of objects (docs/PROTOCOL.md) ---- */

/* A number of the stats answer, or null when the process did not answer. */
static void json_num(FILE *f, const char *key, const ps_row_t *r, uint64_t v) {
  if (r->stats)
    fprintf(f, ",\"%s\":%llu", key, (unsigned long long)v);
  else
    fprintf(f, ",\"%s\":null", key);
}

static void json_list(FILE *f, const char *key, const ps_row_t *r, const char *list, bool strings) {
  fprintf(f, ",\"%s\":", key);
  if (!r->stats) {
    fputs("null", f);
    return;
  }
  fputc('[', f);
  if (strcmp(list, "-"))
    for (const char *p = list; *p;) {
      size_t n = strcspn(p, ",");
      char item[PS_UUID_LEN];
      snprintf(item, sizeof item, "%.*s", (int)n, p);
      if (p != list)
        fputc(',', f);
      if (strings)
        cmd_json_str(f, item);
      else
        fputs(item, f);
      p += n + (p[n] == ',');
    }
  fputc(']', f);
}

void ps_print_json(FILE *f, const ps_view_t *v, const ps_filter_t *flt) {
  fputc('[', f);
  for (size_t i = 0; i < v->n; i++) {
    const ps_row_t *r = &v->rows[i];
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
    json_list(f, "devices", r, r->gpus, false);
    json_list(f, "gpu_uuids", r, r->uuids, true);
    json_num(f, "live_blocks", r, u64(jget(r->stats, "total"), "live_blocks"));
    json_num(f, "live_bytes", r, r->live);
    json_num(f, "held_bytes", r, r->held);
    json_num(f, "cached_bytes", r, r->cached);
    json_num(f, "pool_cached_bytes", r, r->pool_cached);
    json_num(f, "orphan_bytes", r, r->orphan);
    json_num(f, "releasable_bytes", r, r->releasable);
    json_num(f, "pinned_bytes", r, r->pinned);
    json_num(f, "released_bytes", r, u64(jget(r->stats, "total"), "released_bytes"));
    fputs(",\"frameworks\":", f);
    if (!r->stats) {
      fputs("null", f);
    } else {
      const jnode_t *fws = arr(r->stats, "frameworks");
      size_t shown = 0;
      fputc('[', f);
      for (size_t k = 0; fws && k < fws->n; k++) {
        const jnode_t *x = &fws->kids[k];
        int d = (int)jint(x, "device", -1);
        if (!selected(flt, d, uuid_of(r, d)))
          continue;
        uint64_t res = u64(x, "reserved_bytes"), al = u64(x, "allocated_bytes"), rel = u64(x, "releasable_bytes");
        fprintf(f, "%s{\"framework\":", shown++ ? "," : "");
        cmd_json_str(f, jstr(x, "framework", "?"));
        fprintf(f, ",\"device\":%d,\"reserved_bytes\":%llu,\"in_use_bytes\":%llu,\"releasable_bytes\":%llu,"
                   "\"non_releasable_bytes\":%llu}",
                d, (unsigned long long)res, (unsigned long long)al, (unsigned long long)rel,
                (unsigned long long)(res > al + rel ? res - al - rel : 0));
      }
      fputc(']', f);
    }
    fputs(",\"state\":", f);
    cmd_json_str(f, sleep_state(r));
    fprintf(f, ",\"host_bytes\":%llu", (unsigned long long)sleep_host(r));
    fprintf(f, ",\"releases\":%lld,\"signal\":", (long long)jint(r->p.status, "releases", 0));
    cmd_json_str(f, jstr(r->p.status, "signal", "?"));
    fputs(",\"last_release\":", f);
    cmd_json_dump(f, jget(r->p.status, "last_release"));
    fputc('}', f);
  }
  fputs("]\n", f);
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

static void prom_labels(FILE *f, const ps_row_t *r, long long device) {
  char prog[256];
  cmd_program_of(&r->p, prog, sizeof prog);
  fprintf(f, "{pid=\"%d\",", (int)r->p.pid);
  if (device >= 0)
    fprintf(f, "device=\"%lld\",", device);
  fputs("command=\"", f);
  prom_escaped(f, prog); /* the program's name only: whole command lines would make unbounded label values */
  fputs("\"}", f);
}

/* What a release of cached memory gives back on one device: its pools' unused memory and its framework
 * caches' releasable part. */
static uint64_t dev_cached(const ps_row_t *r, const jnode_t *dev) {
  uint64_t c = pool_cached(dev);
  const jnode_t *fws = arr(r->stats, "frameworks");
  for (size_t k = 0; fws && k < fws->n; k++)
    if (jint(&fws->kids[k], "device", -1) == jint(dev, "device", -2))
      c += u64(&fws->kids[k], "releasable_bytes");
  return c;
}

static void prom_rows(FILE *f, const ps_row_t *rows, size_t n, const ps_filter_t *flt) {
  /* Per device: what the process holds on each GPU. */
  static const struct {
    const char *name, *field, *help;
  } dev[] = {
      {"gpureclaim_live_bytes", "live_bytes", "Device memory in live blocks tracked by gpureclaim."},
      {"gpureclaim_live_blocks", "live_blocks", "Live device blocks tracked by gpureclaim."},
      {"gpureclaim_peak_bytes", "peak_bytes", "Highest live device memory seen."},
      {"gpureclaim_pool_reserved_bytes", "pool_reserved_bytes", "Memory held by stream-ordered pools."},
      {"gpureclaim_pool_used_bytes", "pool_used_bytes", "Pool memory handed out to the program."},
      {"gpureclaim_cached_bytes", NULL, "What a release of cached memory can give back: pools' unused memory "
                                        "and framework caches' releasable part."},
      {"gpureclaim_orphan_bytes", "orphan_bytes", "Memory of ended scopes awaiting a release."},
  };
  for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++) {
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", dev[k].name, dev[k].help, dev[k].name);
    for (size_t i = 0; i < n; i++) {
      const jnode_t *d = arr(rows[i].stats, "devices");
      for (size_t j = 0; d && j < d->n; j++) {
        const jnode_t *x = &d->kids[j];
        int dn = (int)jint(x, "device", -1);
        if (!selected(flt, dn, uuid_of(&rows[i], dn)))
          continue;
        fputs(dev[k].name, f);
        prom_labels(f, &rows[i], dn);
        if (dev[k].field)
          fprintf(f, " %lld\n", (long long)jint(x, dev[k].field, 0));
        else
          fprintf(f, " %llu\n", (unsigned long long)dev_cached(&rows[i], x));
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
      {"gpureclaim_peer_reclaims_total", "peer_reclaims", "Peer reclaims run after an out-of-memory (peers asked).",
       "counter"},
      {"gpureclaim_peer_reclaim_successes_total", "peer_reclaim_successes",
       "Peer reclaims after which the allocation succeeded.", "counter"},
      {"gpureclaim_peer_received_bytes_total", "peer_received_bytes", "Bytes peers gave this process.", "counter"},
      {"gpureclaim_peer_gives_total", "peer_gives", "Peer reclaims this process served (it was asked).",
       "counter"},
      {"gpureclaim_peer_given_bytes_total", "peer_given_bytes", "Bytes this process gave its peers.", "counter"},
  };
  for (size_t k = 0; k < sizeof proc / sizeof proc[0]; k++) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", proc[k].name, proc[k].help, proc[k].name, proc[k].type);
    for (size_t i = 0; i < n; i++) {
      if (!rows[i].stats)
        continue;
      fputs(proc[k].name, f);
      prom_labels(f, &rows[i], -1);
      fprintf(f, " %llu\n", (unsigned long long)u64(jget(rows[i].stats, "total"), proc[k].field));
    }
  }
  fputs("# HELP gpureclaim_sleeping Whether the process sleeps (its device memory is on the host).\n"
        "# TYPE gpureclaim_sleeping gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_sleeping", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %d\n", strcmp(sleep_state(&rows[i]), gr_sleep_state_name(GPURECLAIM_STATE_SLEEPING)) == 0);
  }
  fputs("# HELP gpureclaim_sleep_host_bytes Device memory the sleeping process holds in host memory.\n"
        "# TYPE gpureclaim_sleep_host_bytes gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_sleep_host_bytes", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %llu\n", (unsigned long long)sleep_host(&rows[i]));
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
static int write_prometheus(const char *path, const ps_view_t *v, const ps_filter_t *flt) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    fprintf(stderr, "gpureclaim: out of memory\n");
    return EX_FAILED;
  }
  prom_rows(f, v->rows, v->n, flt);
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


/* ---- the command ---- */

enum { O_PROMETHEUS = 256 };
static const cmd_opt_t g_opts[] = {
    {'i', 'i', "gpu", CMD_ARG, "GPUS", "only these GPUs: indices as nvidia-smi numbers them, or UUIDs (a unique\n"
                                      "prefix does), comma-separated, as nvidia-smi -i takes them; each process's\n"
                                      "figures are then those GPUs' only. An ambiguous prefix, or a GPU none of\n"
                                      "your running processes can see, is an error (exit 2)"},
    {'S', 'S', "sort", CMD_ARG, "FIELD", "held (default), cached, releasable, orphan, live, pinned, releases\n"
                                        "(largest first), pid, command, gpu"},
    {'j', 'j', "json", CMD_NOARG, NULL, "one JSON array, one object per process (docs/PROTOCOL.md)"},
    {'q', 'q', "query", CMD_ARG, "FIELDS", "only these fields, comma-separated, in this order: pid, command, program,\n"
                                          "answered, gpu, gpu_uuid, held, live, cached, pool_cached,\n"
                                          "framework_reserved, framework_in_use, framework_releasable, orphan,\n"
                                          "releasable, pinned, releases, released, last_release, signal, state,\n"
                                          "host, error"},
    {'f', 'f', "format", CMD_ARG, "FMT", "table (default), csv (a header line, then bytes as integers),\n"
                                        "csv,noheader, or json"},
    {O_PROMETHEUS, 0, "prometheus", CMD_ARG, "FILE", "node_exporter's textfile format to FILE (atomically; - for\n"
                                                    "standard output)"},
    {0}};

const cmd_spec_t cmd_ps_spec = {
    .name = "ps",
    .usage = "ps [-i GPUS] [-S FIELD] [--json | --query FIELDS [--format table|csv|json] | --prometheus FILE]",
    .summary = "your processes running gpureclaim: device memory held, cached (pools and framework caches),\n"
               "      orphaned, pinned host memory, releases; with a table of their GPUs",
    .text = "Your processes running gpureclaim, largest first, with totals per GPU.\n",
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
  bool header;
  int query[NFIELDS * 2];
  size_t nquery;
  const char *prom;
} ps_opts_t;

static int parse_query(const char *s, ps_opts_t *o) {
  o->nquery = 0;
  while (*s) {
    size_t n = strcspn(s, ",");
    int i = field_index(s, n);
    if (i < 0 || o->nquery == sizeof o->query / sizeof o->query[0]) {
      fprintf(stderr, "gpureclaim: ps: unknown field in --query: %.*s (see gpureclaim ps --help)\n", (int)n, s);
      return -1;
    }
    o->query[o->nquery++] = i;
    s += n + (s[n] == ',');
  }
  if (!o->nquery)
    return cmd_usage_error("ps: --query needs fields%s", ""), -1;
  return 0;
}

int cmd_ps(int argc, char **argv) {
  ps_opts_t o = {.sort = ps_sort_key("held"), .fmt = OUT_TABLE, .header = true};
  bool json = false, fmt_given = false;
  optind = 1;
  int c;
  while ((c = cmd_getopt(argc, argv, &cmd_ps_spec)) != -1) {
    switch (c) {
    case 'i':
      if (!ps_parse_filter(optarg, &o.filter))
        return cmd_usage_error("ps: bad --gpu %s (ordinals or UUIDs, comma-separated)", optarg);
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
      if (!strcmp(optarg, "table")) o.fmt = OUT_TABLE;
      else if (!strcmp(optarg, "csv")) o.fmt = OUT_CSV;
      else if (!strcmp(optarg, "csv,noheader") || !strcmp(optarg, "noheader,csv")) o.fmt = OUT_CSV, o.header = false;
      else if (!strcmp(optarg, "json")) o.fmt = OUT_JSON;
      else return cmd_usage_error("ps: unknown --format %s (table, csv, csv,noheader or json)", optarg);
      break;
    case O_PROMETHEUS:
      if (!*optarg)
        return cmd_usage_error("ps: --prometheus needs a file (or - for standard output)%s", "");
      o.prom = optarg;
      break;
    case 'h':
      return cmd_help(&cmd_ps_spec);
    default:
      return EX_USAGE;
    }
  }
  if (optind < argc)
    return cmd_usage_error("ps: unexpected argument: %s", argv[optind]);
  if (json && fmt_given && o.fmt != OUT_JSON)
    return cmd_usage_error("ps: --json and --format %s are two formats: give one", o.fmt == OUT_CSV ? "csv" : "table");
  if (json)
    o.fmt = OUT_JSON;
  if (o.prom && json)
    return cmd_usage_error("ps: --json and --prometheus are two formats: give one%s", "");
  if (o.prom && (o.fmt != OUT_TABLE || o.nquery))
    return cmd_usage_error("ps: --prometheus is a format of its own: give no --json, --query or --format%s", "");
  if (o.fmt == OUT_CSV && !o.nquery) /* every field, in the help's order */
    for (size_t i = 0; i < NFIELDS; i++)
      o.query[o.nquery++] = (int)i;
  cmd_set_json(o.fmt == OUT_JSON);
  ps_view_t v;
  ps_collect(&v, &o.filter, o.sort);
  int rc = EX_OK;
  if (cmd_rundir_refused()) /* said why; an empty table would read as "nothing running" */
    rc = EX_FAILED;
  else if ((rc = ps_check_filter(&v, &o.filter, "ps")) != EX_OK)
    ;
  else if (o.prom)
    rc = write_prometheus(o.prom, &v, &o.filter);
  else if (o.nquery)
    print_query(stdout, &v, o.query, o.nquery, o.fmt, o.header);
  else if (o.fmt == OUT_JSON)
    ps_print_json(stdout, &v, &o.filter);
  else
    ps_print_table(stdout, &v, &o.filter, true);
  ps_free(&v);
  return rc;
}
