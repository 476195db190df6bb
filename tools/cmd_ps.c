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

/* Whether GPUs are numbered as nvidia-smi numbers them (NVML answers), for this run of the command. */
static bool g_nvml;

/* The number a GPU is shown by: nvidia-smi's; without NVML, the process's own ordinal d. -1: unknown. */
static int gpu_number(int d, const char *uuid) { return g_nvml ? cmd_nvml_index(uuid) : d; }

/* Whether device d (a process's ordinal, its GPU's UUID uuid) is among those shown. An index is nvidia-smi's
 * (each process's own ordinal only without NVML); a UUID or a prefix of one names a GPU whatever the process. */
static bool selected(const ps_filter_t *f, int d, const char *uuid) {
  if (!f || !f->n)
    return true;
  for (size_t i = 0; i < f->n; i++) {
    const char *s = f->sel[i];
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end) {
      if (v == gpu_number(d, uuid))
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

/* The UUID of device d from a process's `stats` gpus, else its status file's (`gpus`, then `peer`); "" if
 * unknown. */
static const char *uuid_of(const ps_row_t *r, int d) {
  const jnode_t *srcs[3] = {arr(r->stats, "gpus"), arr(r->p.status, "gpus"), arr(jget(r->p.status, "peer"), "gpus")};
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; srcs[k] && i < srcs[k]->n; i++)
      if (jint(&srcs[k]->kids[i], "device", -1) == d && jstr(&srcs[k]->kids[i], "uuid", NULL))
        return jstr(&srcs[k]->kids[i], "uuid", "");
  return "";
}

/* A GPU is one UUID: processes number devices each their own way (CUDA_VISIBLE_DEVICES), so an ordinal only
 * names GPUs whose UUID is unknown (and the first ordinal seen is kept). */
static ps_gpu_t *gpu_of(ps_view_t *v, int d, const char *uuid) {
  for (size_t i = 0; i < v->ngpus; i++)
    if (uuid && *uuid && v->gpus[i].uuid[0] ? !strcmp(v->gpus[i].uuid, uuid) : v->gpus[i].device == d) {
      if (!v->gpus[i].uuid[0] && uuid && *uuid)
        snprintf(v->gpus[i].uuid, sizeof v->gpus[i].uuid, "%s", uuid);
      if (v->gpus[i].device < 0)
        v->gpus[i].device = d;
      return &v->gpus[i];
    }
  if (v->ngpus == PS_MAX_GPUS)
    return NULL;
  ps_gpu_t *g = &v->gpus[v->ngpus++];
  memset(g, 0, sizeof *g);
  g->device = d;
  g->index = g_nvml ? cmd_nvml_index(uuid) : -1;
  snprintf(g->uuid, sizeof g->uuid, "%s", uuid ? uuid : "");
  return g;
}

/* The sleep state from the status file ("awake", "sleeping", "waking"; "awake" for a library without sleep). */
static const char *sleep_state(const ps_row_t *r) {
  return jstr(jget(r->p.status, "sleep"), "state", gr_sleep_state_name(GPURECLAIM_STATE_AWAKE));
}
static uint64_t sleep_host(const ps_row_t *r) { return u64(jget(r->p.status, "sleep"), "host_bytes"); }

/* One GPU's figures of a process. */
typedef struct dev_figs {
  uint64_t live, pool_cached, orphan, fw_reserved, fw_allocated, fw_releasable;
} dev_figs_t;

/* Process r's figures on its device d: from its stats answer, else (stale) from its status file's `peer`. */
static dev_figs_t dev_figures(const ps_row_t *r, int d) {
  dev_figs_t x = {0};
  if (r->stats) {
    const jnode_t *devs = arr(r->stats, "devices"), *fws = arr(r->stats, "frameworks");
    for (size_t k = 0; devs && k < devs->n; k++)
      if (jint(&devs->kids[k], "device", -1) == d) {
        x.live += u64(&devs->kids[k], "live_bytes");
        x.pool_cached += pool_cached(&devs->kids[k]);
        x.orphan += u64(&devs->kids[k], "orphan_bytes");
      }
    for (size_t k = 0; fws && k < fws->n; k++)
      if (jint(&fws->kids[k], "device", -1) == d) {
        x.fw_reserved += u64(&fws->kids[k], "reserved_bytes");
        x.fw_allocated += u64(&fws->kids[k], "allocated_bytes");
        x.fw_releasable += u64(&fws->kids[k], "releasable_bytes");
      }
  } else {
    const jnode_t *pg = arr(jget(r->p.status, "peer"), "gpus");
    for (size_t k = 0; pg && k < pg->n; k++)
      if (jint(&pg->kids[k], "device", -1) == d) {
        uint64_t held = u64(&pg->kids[k], "held_bytes"), pc = u64(&pg->kids[k], "pool_cached_bytes");
        x.live += held > pc ? held - pc : 0;
        x.pool_cached += pc;
        x.orphan += u64(&pg->kids[k], "orphan_bytes");
        x.fw_releasable += u64(&pg->kids[k], "framework_bytes");
      }
  }
  return x;
}

/* Limits, guarantees and a wait for memory, from the status file (whether it answers or not): its `peer` rows'
 * limit_bytes and guarantee_bytes (null: none) on the GPUs shown, and its `wait` (null: not waiting). */
static void sharing(ps_row_t *r, const jnode_t *peer_gpus, const ps_filter_t *f) {
  for (size_t k = 0; peer_gpus && k < peer_gpus->n; k++) {
    const jnode_t *g = &peer_gpus->kids[k], *l = jget(g, "limit_bytes"), *gu = jget(g, "guarantee_bytes");
    int d = (int)jint(g, "device", -1);
    if (!selected(f, d, jstr(g, "uuid", "")))
      continue;
    if (l && l->type == JN_NUM) {
      r->has_limit = true;
      r->limit += u64(g, "limit_bytes");
    }
    if (gu && gu->type == JN_NUM) {
      r->has_guarantee = true;
      r->guarantee += u64(g, "guarantee_bytes");
    }
  }
  const jnode_t *w = jget(r->p.status, "wait");
  int wd = -1; /* its own ordinal of the GPU it waits on, when its rows have that UUID */
  for (size_t k = 0; w && peer_gpus && k < peer_gpus->n; k++)
    if (!strcmp(jstr(&peer_gpus->kids[k], "uuid", ""), jstr(w, "uuid", "?")))
      wd = (int)jint(&peer_gpus->kids[k], "device", -1);
  if (w && w->type == JN_OBJ && selected(f, wd, jstr(w, "uuid", ""))) {
    r->waiting = true;
    r->wait_bytes = u64(w, "bytes");
    r->wait_since_ms = jint(w, "since_ms", 0);
    snprintf(r->wait_for, sizeof r->wait_for, "%s", jstr(w, "for", "?"));
    snprintf(r->wait_uuid, sizeof r->wait_uuid, "%s", jstr(w, "uuid", ""));
    cmd_printable(r->wait_for);
    cmd_printable(r->wait_uuid);
  }
}

/* Sums a process's figures over the GPUs shown, and adds them to those GPUs' totals. false when it uses none
 * of them (one whose GPUs are unknown is shown, as it may). A sleeping process keeps nothing on its GPUs: its
 * memory is counted on the host. */
static bool figures(ps_view_t *v, ps_row_t *r, const ps_filter_t *f) {
  r->asleep = strcmp(sleep_state(r), gr_sleep_state_name(GPURECLAIM_STATE_AWAKE)) != 0;
  r->host = sleep_host(r);
  r->pinned = u64(jget(r->stats, "total"), "host_pinned_bytes");
  /* Not answering: its status file's last figures, when it has them (`peer`, rewritten as they change). */
  const jnode_t *peer_gpus = arr(jget(r->p.status, "peer"), "gpus");
  sharing(r, peer_gpus, f);
  r->stale = !r->stats && peer_gpus;
  if (r->stale)
    r->figures_ms = jint(r->p.status, "updated_ms", 0);
  if (!r->stats && !r->stale) {
    snprintf(r->gpus, sizeof r->gpus, "?");
    snprintf(r->ordinals, sizeof r->ordinals, "?");
    return true;
  }
  int used[PS_MAX_GPUS];
  size_t nused = 0;
  /* The GPUs it uses: blocks or pools there, a context there, or a framework cache there. */
  const jnode_t *lists[4] = {arr(r->stats, "devices"), arr(r->stats, "gpus"), arr(r->stats, "frameworks"),
                             r->stats ? NULL : peer_gpus};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; lists[k] && i < lists[k]->n; i++) {
      int d = (int)jint(&lists[k]->kids[i], "device", -1);
      bool seen = d < 0;
      for (size_t j = 0; j < nused && !seen; j++)
        seen = used[j] == d;
      if (!seen && nused < PS_MAX_GPUS && selected(f, d, uuid_of(r, d)))
        used[nused++] = d;
    }
  /* In the order of the numbers shown (nvidia-smi's, or its own ordinals). */
  for (size_t i = 1; i < nused; i++)
    for (size_t j = i; j > 0; j--) {
      int a = gpu_number(used[j - 1], uuid_of(r, used[j - 1])), b = gpu_number(used[j], uuid_of(r, used[j]));
      if ((unsigned)a <= (unsigned)b) /* unknown (-1) last */
        break;
      int t = used[j];
      used[j] = used[j - 1];
      used[j - 1] = t;
    }
  size_t gl = 0, ol = 0, ul = 0;
  r->gpus[0] = r->ordinals[0] = r->uuids[0] = '\0';
  for (size_t i = 0; i < nused; i++) {
    int d = used[i];
    const char *uuid = uuid_of(r, d);
    int num = gpu_number(d, uuid);
    char nb[16] = "?";
    if (num >= 0)
      snprintf(nb, sizeof nb, "%d", num);
    gl += (size_t)snprintf(r->gpus + gl, gl < sizeof r->gpus ? sizeof r->gpus - gl : 0, "%s%s", i ? "," : "", nb);
    ol += (size_t)snprintf(r->ordinals + ol, ol < sizeof r->ordinals ? sizeof r->ordinals - ol : 0, "%s%d",
                           i ? "," : "", d);
    ul += (size_t)snprintf(r->uuids + ul, ul < sizeof r->uuids ? sizeof r->uuids - ul : 0, "%s%s", i ? "," : "",
                           *uuid ? uuid : "?");
    dev_figs_t x = dev_figures(r, d);
    if (r->asleep) /* on the host: nothing of it on the device, nothing a release could give there */
      x = (dev_figs_t){0};
    r->live += x.live;
    r->pool_cached += x.pool_cached;
    r->orphan += x.orphan;
    r->fw_reserved += x.fw_reserved;
    r->fw_allocated += x.fw_allocated;
    r->fw_releasable += x.fw_releasable;
    ps_gpu_t *g = gpu_of(v, d, uuid);
    if (!g)
      continue;
    g->procs++;
    g->held += x.live + x.pool_cached;
    g->cached += x.pool_cached + x.fw_releasable;
    g->orphan += x.orphan;
    g->releasable += x.pool_cached + x.fw_releasable + x.orphan;
    const jnode_t *gpus = arr(r->stats, "gpus");
    for (size_t k = 0; !v->nvml && gpus && k < gpus->n; k++) /* NVML's figures, else the processes' */
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
  if (!nused) {
    snprintf(r->gpus, sizeof r->gpus, "-");
    snprintf(r->ordinals, sizeof r->ordinals, "-");
  }
  r->held = r->live + r->pool_cached;
  r->cached = r->pool_cached + r->fw_releasable;
  r->releasable = r->cached + r->orphan;
  return nused > 0 || !f || !f->n;
}

/* ---- collecting and sorting ---- */

/* Whether pid is stopped (SIGSTOP, ^Z, a debugger): it would answer nothing until it continues, and asking it
 * would cost ps its 2 s (top: each frame). */
static bool stopped(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  char *buf = gr_read_file(path);
  if (!buf)
    return false;
  const char *p = strrchr(buf, ')');
  bool st = p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
  free(buf);
  return st;
}

static void ask_stats(void *arg) {
  ps_row_t *r = arg;
  if ((r->stopped = stopped(r->p.pid))) {
    r->why = "it is stopped (SIGSTOP, ^Z or a debugger): it answers once it continues";
    return;
  }
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

static int by_number(const void *a, const void *b) {
  const ps_gpu_t *x = a, *y = b;
  if (x->index != y->index) /* nvidia-smi's order; GPUs NVML does not know last */
    return (unsigned)x->index < (unsigned)y->index ? -1 : 1;
  return x->device - y->device;
}

/* Adds the GPUs r reports to v->known: those it uses (as figures() finds them) and those its status file says
 * it can see, used or not. */
static void note_known(ps_view_t *v, const ps_row_t *r) {
  const jnode_t *lists[5] = {arr(r->stats, "devices"), arr(r->stats, "gpus"), arr(r->stats, "frameworks"),
                             arr(r->p.status, "gpus"), arr(jget(r->p.status, "peer"), "gpus")};
  for (int k = 0; k < 5; k++)
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
  const cmd_gpu_t *mg = NULL;
  size_t nm = v->nvml ? cmd_nvml_gpus(&mg, NULL) : 0;
  for (size_t i = 0; f && i < f->n; i++) {
    ps_filter_t one = {1, {{0}}, 0, {0}};
    memcpy(one.sel[0], f->sel[i], sizeof one.sel[0]);
    char *end;
    (void)strtol(one.sel[0], &end, 10);
    bool number = *one.sel[0] && !*end;
    const char *uuids[2 * PS_MAX_GPUS];
    size_t nu = 0;
    bool any = false;
    /* The candidates: the machine's GPUs (NVML), and the GPUs the processes report. */
    for (size_t j = 0; j < nm + v->nknown; j++) {
      const char *u = j < nm ? mg[j].uuid : v->known[j - nm].uuid;
      int d = j < nm ? -1 : v->known[j - nm].device;
      if (j >= nm && v->nvml && number)
        continue; /* an index is nvidia-smi's: the machine's list says which exist */
      if (!selected(&one, d, u))
        continue;
      any = true;
      bool dup = false;
      for (size_t k = 0; k < nu && !dup; k++)
        dup = !strcmp(uuids[k], u);
      if (!dup && u[0])
        uuids[nu++] = u;
    }
    if (!number && nu > 1) {
      fprintf(stderr, "gpureclaim: %s: GPU %s is ambiguous: it begins", cmd, one.sel[0]);
      for (size_t k = 0; k < nu; k++)
        fprintf(stderr, "%s %s", k ? (k + 1 == nu ? " and" : ",") : "", uuids[k]);
      fprintf(stderr, " (give more of the UUID)\n");
      return EX_USAGE;
    }
    if (!any && v->nvml) {
      fprintf(stderr, "gpureclaim: %s: no GPU %s on this machine: its GPUs are ", cmd, one.sel[0]);
      if (!nm)
        fprintf(stderr, "none (NVML lists no GPU)");
      else if (number)
        fprintf(stderr, "%d to %d", mg[0].index, mg[nm - 1].index);
      for (size_t k = 0; !number && k < nm; k++)
        fprintf(stderr, "%s%s", k ? ", " : "", mg[k].uuid);
      fprintf(stderr, ", as nvidia-smi -L lists them\n");
      return EX_USAGE;
    }
    if (!any && v->nknown) { /* (with no process of yours at all, nothing says which GPUs exist: none is used) */
      fprintf(stderr, "gpureclaim: %s: no GPU %s: no process of yours running gpureclaim can see it\n", cmd, one.sel[0]);
      return EX_USAGE;
    }
  }
  return EX_OK;
}

/* Whether pid is among those given (none given: every one). */
static bool pid_wanted(const ps_filter_t *f, pid_t pid) {
  if (!f || !f->npids)
    return true;
  for (size_t i = 0; i < f->npids; i++)
    if (f->pids[i] == pid)
      return true;
  return false;
}

void ps_collect(ps_view_t *v, const ps_filter_t *f, int sort_key) {
  memset(v, 0, sizeof *v);
  v->nvml = g_nvml = cmd_nvml_ok(&v->nvml_why);
  cmd_nvml_refresh();
  v->time_ms = (int64_t)gr_wall_ms();
  if (gethostname(v->host, sizeof v->host) != 0)
    v->host[0] = '\0';
  v->host[sizeof v->host - 1] = '\0';
  /* With NVML, the GPU table has every GPU of the machine (those selected), in nvidia-smi's order, as
   * nvidia-smi's does: one no process of yours uses shows its USED all as OTHER. */
  const cmd_gpu_t *mg;
  size_t nm = cmd_nvml_gpus(&mg, NULL);
  for (size_t i = 0; i < nm && v->ngpus < PS_MAX_GPUS; i++) {
    if (!selected(f, -1, mg[i].uuid))
      continue;
    ps_gpu_t *g = &v->gpus[v->ngpus++];
    memset(g, 0, sizeof *g);
    g->index = mg[i].index;
    g->device = -1;
    snprintf(g->uuid, sizeof g->uuid, "%s", mg[i].uuid);
    g->have_mem = mg[i].have_mem;
    g->free = mg[i].free;
    g->total = mg[i].total;
  }
  proc_t *ps;
  size_t n = cmd_list(&ps);
  v->rows = calloc(n ? n : 1, sizeof *v->rows);
  if (!v->rows) {
    for (size_t i = 0; i < n; i++)
      cmd_free(&ps[i]);
    free(ps);
    return;
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    if (!pid_wanted(f, ps[i].pid)) {
      cmd_free(&ps[i]);
      continue;
    }
    v->rows[kept].p = ps[i];
    v->rows[kept++].why = "";
  }
  free(ps);
  /* A pid given that no directory read has (its own run directory is elsewhere, and GPURECLAIM_RUNDIR names
   * one): looked for where its environment and its socket say, as release PID does. */
  for (size_t i = 0; f && i < f->npids; i++) {
    bool have = false;
    for (size_t k = 0; k < kept && !have; k++)
      have = v->rows[k].p.pid == f->pids[i];
    ps_row_t *more = have ? NULL : realloc(v->rows, (kept + 1) * sizeof *v->rows);
    if (!more)
      continue;
    v->rows = more;
    memset(&v->rows[kept], 0, sizeof v->rows[kept]);
    if (cmd_find_quiet(f->pids[i], &v->rows[kept].p) == EX_OK)
      v->rows[kept++].why = "";
    else
      cmd_free(&v->rows[kept].p);
  }
  n = kept;
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
    qsort(v->gpus, v->ngpus, sizeof *v->gpus, by_number);
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

/* A GPU's number as shown: nvidia-smi's index; "?" for a GPU NVML does not know, "-" without NVML (the UUID
 * names it; the processes' ordinals disagree under CUDA_VISIBLE_DEVICES). */
static const char *gpu_label(const ps_gpu_t *g, char *buf, size_t len) {
  if (g->index >= 0)
    snprintf(buf, len, "%d", g->index);
  else
    snprintf(buf, len, "%s", g_nvml ? "?" : "-");
  return buf;
}

void ps_gpu_line(const ps_gpu_t *g, char *buf, size_t len, int width) {
  char b1[32] = "?", b2[32] = "?", b3[32], b4[32], b5[32] = "?", num[16];
  if (g->have_mem) {
    uint64_t used = g->total > g->free ? g->total - g->free : 0;
    b(used, b1, sizeof b1);
    b(g->total, b2, sizeof b2);
    b(used > g->held ? used - g->held : 0, b5, sizeof b5);
  }
  snprintf(buf, len, "%3s %-*.*s %10s %10s %10s %10s %10s", gpu_label(g, num, sizeof num), uuid_width(width),
           uuid_width(width), g->uuid[0] ? g->uuid : "?", b1, b2, b(g->held, b3, sizeof b3),
           b(g->releasable, b4, sizeof b4), b5);
  cut(buf, len, width);
}

#define ROW_FMT "%7s %-5.5s %10s %10s %10s %10s %4s %-8s %10s %s"
/* Below 100 columns PINNED and HOST make way for COMMAND (which began past column 80 with them); STATE stays,
 * before the command, where a cut never hides it. */
#define ROW_FMT_NARROW "%7s %-5.5s %10s %10s %10s %4s %-8s %s"
/* Below 70 columns ORPHAN and REL go too. */
#define ROW_FMT_TINY "%7s %-5.5s %10s %10s %-8s %s"
static bool narrow(int width) { return width > 0 && width < 100; }
static bool tiny(int width) { return width > 0 && width < 70; }

/* What the process is doing, in STATE: its sleep state (awake, sleeping, waking), waiting (for memory: its
 * status file's `wait`), or, not answering, stopped (SIGSTOP, ^Z, a debugger) or silent. */
static const char *row_state(const ps_row_t *r) {
  if (r->stopped)
    return "stopped";
  if (r->waiting)
    return "waiting";
  if (!r->stats && !r->asleep)
    return "silent";
  return sleep_state(r);
}

void ps_row_header(char *buf, size_t len, int width) {
  if (tiny(width))
    snprintf(buf, len, ROW_FMT_TINY, "PID", "GPU", "HELD", "CACHED", "STATE", "COMMAND");
  else if (narrow(width))
    snprintf(buf, len, ROW_FMT_NARROW, "PID", "GPU", "HELD", "CACHED", "ORPHAN", "REL", "STATE", "COMMAND");
  else
    snprintf(buf, len, ROW_FMT, "PID", "GPU", "HELD", "CACHED", "ORPHAN", "PINNED", "REL", "STATE", "HOST",
             "COMMAND");
  cut(buf, len, width);
}

void ps_row_line(const ps_row_t *r, char *buf, size_t len, int width) {
  char pid[16], b1[32] = "?", b2[32] = "?", b3[32] = "?", b4[32] = "?", rel[24], cmdline[512], host[32] = "-";
  if (r->host)
    b(r->host, host, sizeof host);
  snprintf(pid, sizeof pid, "%d", (int)r->p.pid);
  snprintf(rel, sizeof rel, "%lld", (long long)jint(r->p.status, "releases", 0));
  if (r->stats || r->stale) { /* stale: the status file's last figures (STATE says why they are not live) */
    b(r->held, b1, sizeof b1);
    b(r->cached, b2, sizeof b2);
    b(r->orphan, b3, sizeof b3);
  }
  if (r->stats)
    b(r->pinned, b4, sizeof b4);
  cmd_command_of(&r->p, cmdline, sizeof cmdline);
  if (!r->stats) {
    size_t l = strlen(cmdline);
    l += (size_t)snprintf(cmdline + l, sizeof cmdline - l, " [not answering: %s", r->why);
    if (r->stale && l < sizeof cmdline) {
      long long age = r->figures_ms > 0 ? ((long long)gr_wall_ms() - r->figures_ms) / 1000 : -1;
      if (age >= 0)
        l += (size_t)snprintf(cmdline + l, sizeof cmdline - l, "; figures of its status file, %lld s old", age);
      else
        l += (size_t)snprintf(cmdline + l, sizeof cmdline - l, "; figures of its status file");
    }
    if (l < sizeof cmdline)
      snprintf(cmdline + l, sizeof cmdline - l, "]");
  }
  if (tiny(width))
    snprintf(buf, len, ROW_FMT_TINY, pid, r->gpus, b1, b2, row_state(r), cmdline);
  else if (narrow(width))
    snprintf(buf, len, ROW_FMT_NARROW, pid, r->gpus, b1, b2, b3, rel, row_state(r), cmdline);
  else
    snprintf(buf, len, ROW_FMT, pid, r->gpus, b1, b2, b3, b4, rel, row_state(r), host, cmdline);
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
    /* The GPU as the tables number it, and as the process numbers it when that differs (its cuda:N). */
    int num = gpu_number(d, uuid_of(r, d));
    char gpu[48];
    if (num < 0)
      snprintf(gpu, sizeof gpu, "its cuda:%d", d);
    else if (num != d)
      snprintf(gpu, sizeof gpu, "%d (its cuda:%d)", num, d);
    else
      snprintf(gpu, sizeof gpu, "%d", num);
    snprintf(head, sizeof head, "%8s%s on GPU %s: %s reserved = %s in use", "", name, gpu, b(res, b1, sizeof b1),
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

/* "GPU 0" as the tables number it, for the GPU of a status file's row (device d, uuid). */
static void gpu_words(int d, const char *uuid, char *buf, size_t len) {
  int num = gpu_number(d, uuid);
  if (num >= 0)
    snprintf(buf, len, "GPU %d", num);
  else if (d >= 0)
    snprintf(buf, len, "its cuda:%d", d);
  else
    snprintf(buf, len, "GPU %s", uuid && *uuid ? uuid : "?");
}

static void put_cut(FILE *f, char *line, size_t len, int width) {
  cut(line, len, width);
  fprintf(f, "%s\n", line);
}

void ps_print_sharing(FILE *f, const ps_row_t *r, const ps_filter_t *flt, int width) {
  const jnode_t *pg = arr(jget(r->p.status, "peer"), "gpus");
  char line[400], gpu[PS_UUID_LEN + 16], b1[32], b2[32], b3[32];
  for (size_t k = 0; pg && k < pg->n; k++) {
    const jnode_t *g = &pg->kids[k], *l = jget(g, "limit_bytes"), *gu = jget(g, "guarantee_bytes");
    int d = (int)jint(g, "device", -1);
    char uuid[PS_UUID_LEN];
    snprintf(uuid, sizeof uuid, "%s", jstr(g, "uuid", ""));
    cmd_printable(uuid);
    bool lim = l && l->type == JN_NUM, gua = gu && gu->type == JN_NUM;
    if ((!lim && !gua) || !selected(flt, d, uuid))
      continue;
    gpu_words(d, uuid, gpu, sizeof gpu);
    size_t n = (size_t)snprintf(line, sizeof line, "%8son %s:", "", gpu);
    if (lim)
      n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, " limit %s (holds %s)",
                            b(u64(g, "limit_bytes"), b1, sizeof b1), b(u64(g, "held_bytes"), b2, sizeof b2));
    if (gua)
      snprintf(line + n, n < sizeof line ? sizeof line - n : 0, "%s guarantee %s", lim ? "," : "",
               b(u64(g, "guarantee_bytes"), b3, sizeof b3));
    put_cut(f, line, sizeof line, width);
  }
  if (r->waiting) {
    int64_t age = r->wait_since_ms > 0 ? (int64_t)gr_wall_ms() - r->wait_since_ms : -1;
    char since[48] = "";
    if (age >= 0)
      snprintf(since, sizeof since, " %.1f s", (double)age / 1000);
    gpu_words(-1, r->wait_uuid, gpu, sizeof gpu);
    for (size_t i = 0; pg && i < pg->n; i++) /* its own ordinal for that UUID, when its rows have it */
      if (!strcmp(jstr(&pg->kids[i], "uuid", ""), r->wait_uuid))
        gpu_words((int)jint(&pg->kids[i], "device", -1), r->wait_uuid, gpu, sizeof gpu);
    snprintf(line, sizeof line, "%8swaiting%s for %s on %s (%s)", "", since, b(r->wait_bytes, b1, sizeof b1), gpu,
             !strcmp(r->wait_for, "wake") ? "to wake up" : !strcmp(r->wait_for, "alloc") ? "an allocation" : r->wait_for);
    put_cut(f, line, sizeof line, width);
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
    ps_print_sharing(f, &v->rows[i], flt, width);
  }
  if (!v->n) {
    /* Where it looked: a job started elsewhere has another run directory (docs/COMMAND.md, "Where processes are found"). */
    struct stat st;
    const char *own = cmd_rundirs_at(0);
    fprintf(f, "(no process of yours is running gpureclaim%s; looked in %s%s)\n",
            flt && flt->n ? " on the GPUs selected" : "", own,
            lstat(own, &st) != 0 ? ", which does not exist yet" : "");
  } else if (footnote && v->ngpus) {
    fprintf(f, "\n%s", g_footnote);
  }
  for (size_t i = 0; footnote && v->n && cmd_rundirs_count() > 1 && i < cmd_rundirs_count(); i++)
    fprintf(f, "%s%s%s\n", i ? "  " : "Run directories read: ", cmd_rundirs_at(i),
            i ? (i + 1 < cmd_rundirs_count() ? "," : " (processes started elsewhere)") : " (yours),");
  if (footnote && v->n && !v->nvml)
    fprintf(f, "GPU numbers are each process's own CUDA ordinals (CUDA_VISIBLE_DEVICES\n"
               "renumbers them): NVML cannot be loaded, ps --json says why. A UUID names\n"
               "one GPU whatever the process.\n");
  bool stale = false;
  for (size_t i = 0; i < v->n; i++)
    stale |= v->rows[i].stale;
  if (footnote && stale)
    fprintf(f, "A stopped or silent process shows its status file's last figures.\n");
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
    {"cuda_device", "CUDA DEVICE", F_STR, true},
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
    {"limit", "LIMIT", F_BYTES, false},
    {"guarantee", "GUARANTEE", F_BYTES, false},
    {"waiting", "WAITING", F_BYTES, false},
    {"host", "HOST", F_BYTES, false},
    {"error", "ERROR", F_STR, false},
    {"timestamp", "TIMESTAMP", F_STR, false},
    {"hostname", "HOSTNAME", F_STR, false},
};
#define NFIELDS (sizeof g_fields / sizeof g_fields[0])

static int field_index(const char *name, size_t n) {
  for (size_t i = 0; i < NFIELDS; i++)
    if (strlen(g_fields[i].name) == n && !strncmp(g_fields[i].name, name, n))
      return (int)i;
  return -1;
}

/* A field's value: *num for numbers, bytes and booleans, else the string. */
static const char *field_value(const ps_view_t *v, const ps_row_t *r, int i, uint64_t *num, char *buf, size_t len) {
  *num = 0;
  const char *name = g_fields[i].name;
  if (!strcmp(name, "pid")) *num = (uint64_t)r->p.pid;
  else if (!strcmp(name, "command")) return cmd_command_of(&r->p, NULL, 0); /* as recorded */
  else if (!strcmp(name, "program")) { cmd_program_of(&r->p, buf, len); return buf; }
  else if (!strcmp(name, "answered")) *num = r->stats != NULL;
  else if (!strcmp(name, "gpu")) return r->gpus;
  else if (!strcmp(name, "gpu_uuid")) return r->uuids;
  else if (!strcmp(name, "cuda_device")) return r->ordinals;
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
  else if (!strcmp(name, "limit")) *num = r->limit;
  else if (!strcmp(name, "guarantee")) *num = r->guarantee;
  else if (!strcmp(name, "waiting")) *num = r->waiting ? r->wait_bytes : 0;
  else if (!strcmp(name, "host")) *num = r->host;
  else if (!strcmp(name, "error")) return r->stats ? "" : r->why;
  else if (!strcmp(name, "timestamp")) return cmd_iso_time(v->time_ms, buf, len);
  else if (!strcmp(name, "hostname")) return v->host;
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

static void print_query(FILE *f, const ps_view_t *v, const int *q, size_t nq, int fmt, bool header, bool units) {
  char buf[512], num[32];
  if (fmt == OUT_JSON)
    fputc('[', f);
  if (fmt == OUT_CSV && header) {
    for (size_t k = 0; k < nq; k++)
      fprintf(f, "%s%s", k ? "," : "", g_fields[q[k]].name);
    fputc('\n', f);
  }
  if (fmt == OUT_TABLE && header) {
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
      const char *s = field_value(v, r, q[k], &n, buf, sizeof buf);
      bool unknown = fd->from_stats && !r->stats;
      /* no limit, no guarantee: null, empty, or "-" in a table */
      bool none = (!strcmp(fd->name, "limit") && !r->has_limit) || (!strcmp(fd->name, "guarantee") && !r->has_guarantee);
      if (none && fmt != OUT_JSON) {
        if (k)
          fputs(fmt == OUT_CSV ? "," : " ", f);
        fputs(fmt == OUT_CSV ? "" : "         -", f);
        continue;
      }
      unknown = unknown || none;
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
      } else if (fd->type == F_BYTES && fmt == OUT_TABLE && units) {
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

/* ---- --json: one object, the GPU table and the processes (docs/PROTOCOL.md) ---- */

/* A number of the stats answer, or null when the process did not answer. */
static void json_num(FILE *f, const char *key, const ps_row_t *r, uint64_t v) {
  if (r->stats)
    fprintf(f, ",\"%s\":%llu", key, (unsigned long long)v);
  else
    fprintf(f, ",\"%s\":null", key);
}

/* A comma-separated list as a JSON array ("-": empty); numbers as numbers, "?" as null. */
static void json_list_of(FILE *f, const char *list, bool strings) {
  fputc('[', f);
  if (strcmp(list, "-"))
    for (const char *p = list; *p;) {
      size_t n = strcspn(p, ",");
      char item[PS_UUID_LEN];
      snprintf(item, sizeof item, "%.*s", (int)n, p);
      if (p != list)
        fputc(',', f);
      if (!strcmp(item, "?"))
        fputs("null", f);
      else if (strings)
        cmd_json_str(f, item);
      else
        fputs(item, f);
      p += n + (p[n] == ',');
    }
  fputc(']', f);
}

static void json_list(FILE *f, const char *key, const ps_row_t *r, const char *list, bool strings) {
  fprintf(f, ",\"%s\":", key);
  if (!r->stats)
    fputs("null", f);
  else
    json_list_of(f, list, strings);
}

static void json_rundir(FILE *f, const ps_row_t *r) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", r->p.path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = '\0';
  cmd_json_str(f, dir);
}

static void json_process(FILE *f, const ps_row_t *r, const ps_filter_t *flt) {
  char prog[256];
  cmd_program_of(&r->p, prog, sizeof prog);
  fprintf(f, "{\"pid\":%d,\"command\":", (int)r->p.pid);
  cmd_json_str(f, cmd_command_of(&r->p, NULL, 0));
  fputs(",\"program\":", f);
  cmd_json_str(f, prog);
  fputs(",\"rundir\":", f);
  json_rundir(f, r);
  fprintf(f, ",\"answered\":%s,\"stopped\":%s", r->stats ? "true" : "false", r->stopped ? "true" : "false");
  if (!r->stats) {
    fputs(",\"error\":", f);
    cmd_json_str(f, r->why);
  }
  json_list(f, "gpus", r, r->gpus, false);
  json_list(f, "devices", r, r->ordinals, false);
  json_list(f, "gpu_uuids", r, r->uuids, true);
  json_num(f, "live_blocks", r, r->asleep ? 0 : u64(jget(r->stats, "total"), "live_blocks"));
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
      int num = gpu_number(d, uuid_of(r, d));
      fprintf(f, "%s{\"framework\":", shown++ ? "," : "");
      cmd_json_str(f, jstr(x, "framework", "?"));
      fprintf(f, ",\"device\":%d,\"gpu\":", d);
      if (num >= 0)
        fprintf(f, "%d", num);
      else
        fputs("null", f);
      fprintf(f, ",\"reserved_bytes\":%llu,\"in_use_bytes\":%llu,\"releasable_bytes\":%llu,"
                 "\"non_releasable_bytes\":%llu}",
              (unsigned long long)res, (unsigned long long)al, (unsigned long long)rel,
              (unsigned long long)(res > al + rel ? res - al - rel : 0));
    }
    fputc(']', f);
  }
  /* Not answering: what its status file last said (`peer`), and when. */
  if (r->stale) {
    fprintf(f, ",\"last_known\":{\"time_ms\":%lld,\"gpus\":", (long long)r->figures_ms);
    json_list_of(f, r->gpus, false);
    fputs(",\"devices\":", f);
    json_list_of(f, r->ordinals, false);
    fputs(",\"gpu_uuids\":", f);
    json_list_of(f, r->uuids, true);
    fprintf(f, ",\"held_bytes\":%llu,\"pool_cached_bytes\":%llu,\"orphan_bytes\":%llu,\"framework_releasable_bytes\":%llu}",
            (unsigned long long)r->held, (unsigned long long)r->pool_cached, (unsigned long long)r->orphan,
            (unsigned long long)r->fw_releasable);
  }
  fputs(",\"state\":", f);
  cmd_json_str(f, sleep_state(r));
  fprintf(f, ",\"host_bytes\":%llu", (unsigned long long)r->host);
  /* Sharing a GPU: from the status file, whether it answered or not. */
  if (r->has_limit)
    fprintf(f, ",\"limit_bytes\":%llu", (unsigned long long)r->limit);
  else
    fputs(",\"limit_bytes\":null", f);
  if (r->has_guarantee)
    fprintf(f, ",\"guarantee_bytes\":%llu", (unsigned long long)r->guarantee);
  else
    fputs(",\"guarantee_bytes\":null", f);
  if (r->waiting) {
    fputs(",\"wait\":{\"uuid\":", f);
    cmd_json_str(f, r->wait_uuid);
    fprintf(f, ",\"bytes\":%llu,\"since_ms\":%lld,\"for\":", (unsigned long long)r->wait_bytes,
            (long long)r->wait_since_ms);
    cmd_json_str(f, r->wait_for);
    fputc('}', f);
  } else {
    fputs(",\"wait\":null", f);
  }
  fprintf(f, ",\"releases\":%lld,\"signal\":", (long long)jint(r->p.status, "releases", 0));
  cmd_json_str(f, jstr(r->p.status, "signal", "?"));
  fputs(",\"last_release\":", f);
  cmd_json_dump(f, jget(r->p.status, "last_release"));
  fputc('}', f);
}

void ps_print_json(FILE *f, const ps_view_t *v, const ps_filter_t *flt) {
  char when[64];
  fputs("{\"host\":", f);
  cmd_json_str(f, v->host);
  fprintf(f, ",\"time_ms\":%lld,\"time\":\"%s\",\"gpu_numbering\":\"%s\",\"nvml_error\":", (long long)v->time_ms,
          cmd_iso_time(v->time_ms, when, sizeof when), v->nvml ? "nvidia-smi" : "cuda_ordinals");
  if (v->nvml)
    fputs("null", f);
  else
    cmd_json_str(f, v->nvml_why ? v->nvml_why : "");
  fputs(",\"rundirs\":[", f);
  for (size_t i = 0; i < cmd_rundirs_count(); i++) {
    if (i)
      fputc(',', f);
    cmd_json_str(f, cmd_rundirs_at(i));
  }
  fputs("],\"gpus\":[", f);
  for (size_t i = 0; i < v->ngpus; i++) {
    const ps_gpu_t *g = &v->gpus[i];
    fputs(i ? ",{\"index\":" : "{\"index\":", f);
    if (g->index >= 0)
      fprintf(f, "%d", g->index);
    else
      fputs("null", f);
    fputs(",\"uuid\":", f);
    if (g->uuid[0])
      cmd_json_str(f, g->uuid);
    else
      fputs("null", f);
    uint64_t used = g->total > g->free ? g->total - g->free : 0;
    if (g->have_mem)
      fprintf(f, ",\"used_bytes\":%llu,\"total_bytes\":%llu,\"other_bytes\":%llu", (unsigned long long)used,
              (unsigned long long)g->total, (unsigned long long)(used > g->held ? used - g->held : 0));
    else
      fputs(",\"used_bytes\":null,\"total_bytes\":null,\"other_bytes\":null", f);
    fprintf(f, ",\"held_bytes\":%llu,\"cached_bytes\":%llu,\"orphan_bytes\":%llu,\"releasable_bytes\":%llu,"
               "\"processes\":%u}",
            (unsigned long long)g->held, (unsigned long long)g->cached, (unsigned long long)g->orphan,
            (unsigned long long)g->releasable, g->procs);
  }
  fputs("],\"processes\":[", f);
  for (size_t i = 0; i < v->n; i++) {
    if (i)
      fputc(',', f);
    json_process(f, &v->rows[i], flt);
  }
  fputs("]}\n", f);
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

/* Labels every sample gets (ps --label NAME=VALUE: which pod, job or host the file is about). */
#define MAX_LABELS 16
static const char *g_label_names[MAX_LABELS], *g_label_values[MAX_LABELS];
static size_t g_nlabels;

/* pid, then for a per-device sample the process's own ordinal (device), nvidia-smi's number (gpu) and the
 * UUID (uuid), as DCGM's exporter labels its series, then the program's name and the --label labels. */
static void prom_labels(FILE *f, const ps_row_t *r, long long device) {
  char prog[256];
  cmd_program_of(&r->p, prog, sizeof prog);
  fprintf(f, "{pid=\"%d\",", (int)r->p.pid);
  if (device >= 0) {
    const char *uuid = uuid_of(r, (int)device);
    int num = g_nvml ? cmd_nvml_index(uuid) : -1;
    fprintf(f, "device=\"%lld\",", device);
    if (num >= 0)
      fprintf(f, "gpu=\"%d\",", num);
    if (*uuid) {
      fputs("uuid=\"", f);
      prom_escaped(f, uuid);
      fputs("\",", f);
    }
  }
  fputs("command=\"", f);
  prom_escaped(f, prog); /* the program's name only: whole command lines would make unbounded label values */
  fputc('"', f);
  for (size_t i = 0; i < g_nlabels; i++) {
    fprintf(f, ",%s=\"", g_label_names[i]);
    prom_escaped(f, g_label_values[i]);
    fputc('"', f);
  }
  fputc('}', f);
}

/* Parses --label NAME=VALUE: a Prometheus label name of our own (not pid, device, gpu, uuid or command, and not
 * beginning with __), any value. */
static int add_label(char *arg) {
  char *eq = strchr(arg, '=');
  static const char *const taken[] = {"pid", "device", "gpu", "uuid", "command"};
  if (!eq || eq == arg)
    return cmd_usage_error("ps: bad --label %s (NAME=VALUE)", arg);
  *eq = '\0';
  bool ok = (isalpha((unsigned char)arg[0]) || arg[0] == '_') && strncmp(arg, "__", 2) != 0;
  for (const char *c = arg; ok && *c; c++)
    ok = isalnum((unsigned char)*c) || *c == '_';
  for (size_t i = 0; ok && i < sizeof taken / sizeof taken[0]; i++)
    ok = strcmp(arg, taken[i]) != 0;
  for (size_t i = 0; ok && i < g_nlabels; i++)
    ok = strcmp(arg, g_label_names[i]) != 0;
  if (!ok) {
    *eq = '=';
    return cmd_usage_error("ps: bad --label %s (a name of letters, digits and _, not pid, device, gpu, uuid or "
                           "command, not beginning with __, given once)", arg);
  }
  if (g_nlabels == MAX_LABELS)
    return cmd_usage_error("ps: at most 16 --label%s", "");
  g_label_names[g_nlabels] = arg;
  g_label_values[g_nlabels++] = eq + 1;
  return EX_OK;
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
  /* Sharing a GPU, from the status files of the processes that answer (as every sample but gpureclaim_up): per
   * GPU with one, the limit and the guarantee; per process, whether it waits for memory and for how much. */
  static const struct {
    const char *name, *field, *help;
  } share[] = {
      {"gpureclaim_limit_bytes", "limit_bytes", "The process's limit on the GPU (GPURECLAIM_LIMIT)."},
      {"gpureclaim_guarantee_bytes", "guarantee_bytes", "The process's guarantee on the GPU (GPURECLAIM_GUARANTEE)."},
  };
  for (size_t k = 0; k < sizeof share / sizeof share[0]; k++) {
    bool declared = false; /* a family only where some process has one (every family declared has samples) */
    for (size_t i = 0; i < n; i++) {
      const jnode_t *pg = rows[i].stats ? arr(jget(rows[i].p.status, "peer"), "gpus") : NULL;
      for (size_t j = 0; pg && j < pg->n; j++) {
        const jnode_t *x = &pg->kids[j], *val = jget(x, share[k].field);
        int dn = (int)jint(x, "device", -1);
        if (!val || val->type != JN_NUM || !selected(flt, dn, uuid_of(&rows[i], dn)))
          continue;
        if (!declared)
          fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", share[k].name, share[k].help, share[k].name);
        declared = true;
        fputs(share[k].name, f);
        prom_labels(f, &rows[i], dn);
        fprintf(f, " %llu\n", (unsigned long long)u64(x, share[k].field));
      }
    }
  }
  fputs("# HELP gpureclaim_waiting Whether the process waits for memory (an allocation or a wake).\n"
        "# TYPE gpureclaim_waiting gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_waiting", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %d\n", rows[i].waiting ? 1 : 0);
  }
  fputs("# HELP gpureclaim_waiting_bytes The memory the process waits for (0 when not waiting).\n"
        "# TYPE gpureclaim_waiting_bytes gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_waiting_bytes", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %llu\n", (unsigned long long)(rows[i].waiting ? rows[i].wait_bytes : 0));
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

enum { O_PROMETHEUS = 256, O_LABEL };
/* --query's help names every field of g_fields, in order: made from that list (ps_query_help()). */
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
  int query[NFIELDS * 2];
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
    int i = field_index(s, m);
    if (i < 0 || o->nquery == sizeof o->query / sizeof o->query[0]) {
      const char *names[NFIELDS];
      for (size_t k = 0; k < NFIELDS; k++)
        names[k] = g_fields[k].name;
      char word[64];
      snprintf(word, sizeof word, "%.*s", (int)(m < 60 ? m : 60), s);
      const char *near = cmd_nearest(word, names, NFIELDS);
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
  for (size_t i = 0; i < NFIELDS && n < sizeof g_query_help; i++) {
    size_t w = strlen(g_fields[i].name) + 2;
    if (col + w > 75) {
      n += (size_t)snprintf(g_query_help + n, sizeof g_query_help - n, "\n%s%s", g_fields[i].name,
                            i + 1 < NFIELDS ? "," : "");
      col = w - 1;
    } else {
      n += (size_t)snprintf(g_query_help + n, sizeof g_query_help - n, " %s%s", g_fields[i].name,
                            i + 1 < NFIELDS ? "," : "");
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
    rc = write_prometheus(o->prom, &v, &o->filter);
  else if (o->nquery)
    print_query(stdout, &v, o->query, o->nquery, o->fmt, o->header && first, o->units);
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
      if (add_label(optarg) != EX_OK)
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
  if (g_nlabels && !o.prom)
    return cmd_usage_error("ps: --label labels the Prometheus samples: give --prometheus FILE too%s", "");
  if (o.fmt == OUT_CSV && !o.nquery) /* every field, in the help's order */
    for (size_t i = 0; i < NFIELDS; i++)
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
