/*
 * ps_view.c -- the view `gpureclaim ps` and `gpureclaim top` share (ps.h): your processes running gpureclaim,
 * each asked for its figures over its control socket (`stats`, which carries framework caches and the GPUs'
 * UUIDs and driver figures; a process that does not answer is still listed, from its status file, marked as not
 * answering), sorted (by device memory held, --sort), with totals per GPU (the driver's used and total memory
 * beside what gpureclaim's processes hold and could give back); and the table's lines for people. The formats for
 * programs are ps_format.c's, the command's options cmd_ps.c's.
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

uint64_t ps_u64(const jnode_t *o, const char *field) {
  int64_t v = jint(o, field, 0);
  return v > 0 ? (uint64_t)v : 0;
}

const jnode_t *ps_arr(const jnode_t *o, const char *key) {
  const jnode_t *a = jget(o, key);
  return a && a->type == JN_ARR ? a : NULL;
}

uint64_t ps_pool_cached(const jnode_t *s) {
  uint64_t reserved = ps_u64(s, "pool_reserved_bytes"), used = ps_u64(s, "pool_used_bytes");
  return reserved > used ? reserved - used : 0;
}

/* Whether GPUs are numbered as nvidia-smi numbers them (NVML answers), for this run of the command. */
static bool g_nvml;
bool ps_nvml(void) { return g_nvml; }

/* The number a GPU is shown by: nvidia-smi's; without NVML, the process's own ordinal d. -1: unknown. */
int ps_gpu_number(int d, const char *uuid) { return g_nvml ? cmd_nvml_index(uuid) : d; }

/* Whether device d (a process's ordinal, its GPU's UUID uuid) is among those shown. An index is nvidia-smi's
 * (each process's own ordinal only without NVML); a UUID or a prefix of one names a GPU whatever the process. */
bool ps_selected(const ps_filter_t *f, int d, const char *uuid) {
  if (!f || !f->n)
    return true;
  for (size_t i = 0; i < f->n; i++) {
    const char *s = f->sel[i];
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end) {
      if (v == ps_gpu_number(d, uuid))
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
const char *ps_uuid_of(const ps_row_t *r, int d) {
  const jnode_t *srcs[3] = {ps_arr(r->stats, "gpus"), ps_arr(r->p.status, "gpus"), ps_arr(jget(r->p.status, "peer"), "gpus")};
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
const char *ps_sleep_state(const ps_row_t *r) {
  return jstr(jget(r->p.status, "sleep"), "state", gr_sleep_state_name(GPURECLAIM_STATE_AWAKE));
}
uint64_t ps_sleep_host(const ps_row_t *r) { return ps_u64(jget(r->p.status, "sleep"), "host_bytes"); }

/* One GPU's figures of a process. */
typedef struct dev_figs {
  uint64_t live, pool_cached, orphan, fw_reserved, fw_allocated, fw_releasable;
} dev_figs_t;

/* Process r's figures on its device d: from its stats answer, else (stale) from its status file's `peer`. */
static dev_figs_t dev_figures(const ps_row_t *r, int d) {
  dev_figs_t x = {0};
  if (r->stats) {
    const jnode_t *devs = ps_arr(r->stats, "devices"), *fws = ps_arr(r->stats, "frameworks");
    for (size_t k = 0; devs && k < devs->n; k++)
      if (jint(&devs->kids[k], "device", -1) == d) {
        x.live += ps_u64(&devs->kids[k], "live_bytes");
        x.pool_cached += ps_pool_cached(&devs->kids[k]);
        x.orphan += ps_u64(&devs->kids[k], "orphan_bytes");
      }
    for (size_t k = 0; fws && k < fws->n; k++)
      if (jint(&fws->kids[k], "device", -1) == d) {
        x.fw_reserved += ps_u64(&fws->kids[k], "reserved_bytes");
        x.fw_allocated += ps_u64(&fws->kids[k], "allocated_bytes");
        x.fw_releasable += ps_u64(&fws->kids[k], "releasable_bytes");
      }
  } else {
    const jnode_t *pg = ps_arr(jget(r->p.status, "peer"), "gpus");
    for (size_t k = 0; pg && k < pg->n; k++)
      if (jint(&pg->kids[k], "device", -1) == d) {
        uint64_t held = ps_u64(&pg->kids[k], "held_bytes"), pc = ps_u64(&pg->kids[k], "pool_cached_bytes");
        x.live += held > pc ? held - pc : 0;
        x.pool_cached += pc;
        x.orphan += ps_u64(&pg->kids[k], "orphan_bytes");
        x.fw_releasable += ps_u64(&pg->kids[k], "framework_bytes");
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
    if (!ps_selected(f, d, jstr(g, "uuid", "")))
      continue;
    if (l && l->type == JN_NUM) {
      r->has_limit = true;
      r->limit += ps_u64(g, "limit_bytes");
    }
    if (gu && gu->type == JN_NUM) {
      r->has_guarantee = true;
      r->guarantee += ps_u64(g, "guarantee_bytes");
    }
  }
  const jnode_t *w = jget(r->p.status, "wait");
  int wd = -1; /* its own ordinal of the GPU it waits on, when its rows have that UUID */
  for (size_t k = 0; w && peer_gpus && k < peer_gpus->n; k++)
    if (!strcmp(jstr(&peer_gpus->kids[k], "uuid", ""), jstr(w, "uuid", "?")))
      wd = (int)jint(&peer_gpus->kids[k], "device", -1);
  if (w && w->type == JN_OBJ && ps_selected(f, wd, jstr(w, "uuid", ""))) {
    r->waiting = true;
    r->wait_bytes = ps_u64(w, "bytes");
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
  r->asleep = strcmp(ps_sleep_state(r), gr_sleep_state_name(GPURECLAIM_STATE_AWAKE)) != 0;
  r->host = ps_sleep_host(r);
  r->pinned = ps_u64(jget(r->stats, "total"), "host_pinned_bytes");
  /* Not answering: its status file's last figures, when it has them (`peer`, rewritten as they change). */
  const jnode_t *peer_gpus = ps_arr(jget(r->p.status, "peer"), "gpus");
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
  const jnode_t *lists[4] = {ps_arr(r->stats, "devices"), ps_arr(r->stats, "gpus"), ps_arr(r->stats, "frameworks"),
                             r->stats ? NULL : peer_gpus};
  for (int k = 0; k < 4; k++)
    for (size_t i = 0; lists[k] && i < lists[k]->n; i++) {
      int d = (int)jint(&lists[k]->kids[i], "device", -1);
      bool seen = d < 0;
      for (size_t j = 0; j < nused && !seen; j++)
        seen = used[j] == d;
      if (!seen && nused < PS_MAX_GPUS && ps_selected(f, d, ps_uuid_of(r, d)))
        used[nused++] = d;
    }
  /* In the order of the numbers shown (nvidia-smi's, or its own ordinals). */
  for (size_t i = 1; i < nused; i++)
    for (size_t j = i; j > 0; j--) {
      int a = ps_gpu_number(used[j - 1], ps_uuid_of(r, used[j - 1])), b = ps_gpu_number(used[j], ps_uuid_of(r, used[j]));
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
    const char *uuid = ps_uuid_of(r, d);
    int num = ps_gpu_number(d, uuid);
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
    const jnode_t *gpus = ps_arr(r->stats, "gpus");
    for (size_t k = 0; !v->nvml && gpus && k < gpus->n; k++) /* NVML's figures, else the processes' */
      if (jint(&gpus->kids[k], "device", -1) == d && jget(&gpus->kids[k], "total_bytes")) {
        uint64_t fb = ps_u64(&gpus->kids[k], "free_bytes"), tb = ps_u64(&gpus->kids[k], "total_bytes");
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
  case K_RELEASES: return ps_u64(r->p.status, "releases");
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
  const jnode_t *lists[5] = {ps_arr(r->stats, "devices"), ps_arr(r->stats, "gpus"), ps_arr(r->stats, "frameworks"),
                             ps_arr(r->p.status, "gpus"), ps_arr(jget(r->p.status, "peer"), "gpus")};
  for (int k = 0; k < 5; k++)
    for (size_t i = 0; lists[k] && i < lists[k]->n; i++) {
      int d = (int)jint(&lists[k]->kids[i], "device", -1);
      if (d < 0)
        continue;
      const char *u = ps_uuid_of(r, d);
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
      if (!ps_selected(&one, d, u))
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
    if (!ps_selected(f, -1, mg[i].uuid))
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
  return ps_sleep_state(r);
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
  const jnode_t *fws = ps_arr(r->stats, "frameworks");
  for (size_t k = 0; fws && k < fws->n; k++) {
    const jnode_t *x = &fws->kids[k];
    int d = (int)jint(x, "device", -1);
    if (!ps_selected(flt, d, ps_uuid_of(r, d)))
      continue;
    uint64_t res = ps_u64(x, "reserved_bytes"), al = ps_u64(x, "allocated_bytes"), rel = ps_u64(x, "releasable_bytes");
    uint64_t kept = res > al + rel ? res - al - rel : 0;
    char b1[32], b2[32], b3[32], b4[32], name[64], head[160], tail[160], line[400];
    snprintf(name, sizeof name, "%s", jstr(x, "framework", "?"));
    cmd_printable(name);
    /* The GPU as the tables number it, and as the process numbers it when that differs (its cuda:N). */
    int num = ps_gpu_number(d, ps_uuid_of(r, d));
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
  int num = ps_gpu_number(d, uuid);
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
  const jnode_t *pg = ps_arr(jget(r->p.status, "peer"), "gpus");
  char line[400], gpu[PS_UUID_LEN + 16], b1[32], b2[32], b3[32];
  for (size_t k = 0; pg && k < pg->n; k++) {
    const jnode_t *g = &pg->kids[k], *l = jget(g, "limit_bytes"), *gu = jget(g, "guarantee_bytes");
    int d = (int)jint(g, "device", -1);
    char uuid[PS_UUID_LEN];
    snprintf(uuid, sizeof uuid, "%s", jstr(g, "uuid", ""));
    cmd_printable(uuid);
    bool lim = l && l->type == JN_NUM, gua = gu && gu->type == JN_NUM;
    if ((!lim && !gua) || !ps_selected(flt, d, uuid))
      continue;
    gpu_words(d, uuid, gpu, sizeof gpu);
    size_t n = (size_t)snprintf(line, sizeof line, "%8son %s:", "", gpu);
    if (lim)
      n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, " limit %s (holds %s)",
                            b(ps_u64(g, "limit_bytes"), b1, sizeof b1), b(ps_u64(g, "held_bytes"), b2, sizeof b2));
    if (gua)
      snprintf(line + n, n < sizeof line ? sizeof line - n : 0, "%s guarantee %s", lim ? "," : "",
               b(ps_u64(g, "guarantee_bytes"), b3, sizeof b3));
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

