/*
 * ps_format.c -- what `gpureclaim ps` prints for programs: --query FIELDS (a table, CSV or JSON), --json (one
 * object: the GPU table and the processes, docs/PROTOCOL.md) and node_exporter's textfile format (--prometheus),
 * each made from the view that ps_view.c collects (ps.h).
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

/* ---- --query fields: table, CSV, JSON ---- */

const ps_field_t ps_fields[] = {
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
const size_t ps_nfields = sizeof ps_fields / sizeof ps_fields[0];

int ps_field_index(const char *name, size_t n) {
  for (size_t i = 0; i < ps_nfields; i++)
    if (strlen(ps_fields[i].name) == n && !strncmp(ps_fields[i].name, name, n))
      return (int)i;
  return -1;
}

/* A field's value: *num for numbers, bytes and booleans, else the string. */
static const char *field_value(const ps_view_t *v, const ps_row_t *r, int i, uint64_t *num, char *buf, size_t len) {
  *num = 0;
  const char *name = ps_fields[i].name;
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
  else if (!strcmp(name, "releases")) *num = ps_u64(r->p.status, "releases");
  else if (!strcmp(name, "released")) *num = ps_u64(jget(r->stats, "total"), "released_bytes");
  else if (!strcmp(name, "last_release")) {
    const jnode_t *lr = jget(r->p.status, "last_release");
    *num = ps_u64(lr, "cached_bytes") + ps_u64(lr, "orphaned_bytes") + ps_u64(lr, "all_bytes");
  } else if (!strcmp(name, "signal")) return jstr(r->p.status, "signal", "?");
  else if (!strcmp(name, "state")) return ps_sleep_state(r);
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


void ps_print_query(FILE *f, const ps_view_t *v, const int *q, size_t nq, int fmt, bool header, bool units) {
  char buf[512], num[32];
  if (fmt == OUT_JSON)
    fputc('[', f);
  if (fmt == OUT_CSV && header) {
    for (size_t k = 0; k < nq; k++)
      fprintf(f, "%s%s", k ? "," : "", ps_fields[q[k]].name);
    fputc('\n', f);
  }
  if (fmt == OUT_TABLE && header) {
    for (size_t k = 0; k < nq; k++)
      fprintf(f, "%s%*s", k ? " " : "", ps_fields[q[k]].type == F_STR ? -12 : 10, ps_fields[q[k]].header);
    fputc('\n', f);
  }
  for (size_t i = 0; i < v->n; i++) {
    const ps_row_t *r = &v->rows[i];
    if (fmt == OUT_JSON)
      fputs(i ? ",{" : "{", f);
    for (size_t k = 0; k < nq; k++) {
      const ps_field_t *fd = &ps_fields[q[k]];
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
        fprintf(f, "%10s", cmd_bytes(n, num, sizeof num));
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
  json_num(f, "live_blocks", r, r->asleep ? 0 : ps_u64(jget(r->stats, "total"), "live_blocks"));
  json_num(f, "live_bytes", r, r->live);
  json_num(f, "held_bytes", r, r->held);
  json_num(f, "cached_bytes", r, r->cached);
  json_num(f, "pool_cached_bytes", r, r->pool_cached);
  json_num(f, "orphan_bytes", r, r->orphan);
  json_num(f, "releasable_bytes", r, r->releasable);
  json_num(f, "pinned_bytes", r, r->pinned);
  json_num(f, "released_bytes", r, ps_u64(jget(r->stats, "total"), "released_bytes"));
  fputs(",\"frameworks\":", f);
  if (!r->stats) {
    fputs("null", f);
  } else {
    const jnode_t *fws = ps_arr(r->stats, "frameworks");
    size_t shown = 0;
    fputc('[', f);
    for (size_t k = 0; fws && k < fws->n; k++) {
      const jnode_t *x = &fws->kids[k];
      int d = (int)jint(x, "device", -1);
      if (!ps_selected(flt, d, ps_uuid_of(r, d)))
        continue;
      uint64_t res = ps_u64(x, "reserved_bytes"), al = ps_u64(x, "allocated_bytes"), rel = ps_u64(x, "releasable_bytes");
      int num = ps_gpu_number(d, ps_uuid_of(r, d));
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
  cmd_json_str(f, ps_sleep_state(r));
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
    const char *uuid = ps_uuid_of(r, (int)device);
    int num = ps_nvml() ? cmd_nvml_index(uuid) : -1;
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
int ps_add_label(char *arg) {
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
  uint64_t c = ps_pool_cached(dev);
  const jnode_t *fws = ps_arr(r->stats, "frameworks");
  for (size_t k = 0; fws && k < fws->n; k++)
    if (jint(&fws->kids[k], "device", -1) == jint(dev, "device", -2))
      c += ps_u64(&fws->kids[k], "releasable_bytes");
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
      const jnode_t *d = ps_arr(rows[i].stats, "devices");
      for (size_t j = 0; d && j < d->n; j++) {
        const jnode_t *x = &d->kids[j];
        int dn = (int)jint(x, "device", -1);
        if (!ps_selected(flt, dn, ps_uuid_of(&rows[i], dn)))
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
      fprintf(f, " %llu\n", (unsigned long long)ps_u64(jget(rows[i].stats, "total"), proc[k].field));
    }
  }
  fputs("# HELP gpureclaim_sleeping Whether the process sleeps (its device memory is on the host).\n"
        "# TYPE gpureclaim_sleeping gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_sleeping", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %d\n", strcmp(ps_sleep_state(&rows[i]), gr_sleep_state_name(GPURECLAIM_STATE_SLEEPING)) == 0);
  }
  fputs("# HELP gpureclaim_sleep_host_bytes Device memory the sleeping process holds in host memory.\n"
        "# TYPE gpureclaim_sleep_host_bytes gauge\n", f);
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].stats)
      continue;
    fputs("gpureclaim_sleep_host_bytes", f);
    prom_labels(f, &rows[i], -1);
    fprintf(f, " %llu\n", (unsigned long long)ps_sleep_host(&rows[i]));
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
      const jnode_t *pg = rows[i].stats ? ps_arr(jget(rows[i].p.status, "peer"), "gpus") : NULL;
      for (size_t j = 0; pg && j < pg->n; j++) {
        const jnode_t *x = &pg->kids[j], *val = jget(x, share[k].field);
        int dn = (int)jint(x, "device", -1);
        if (!val || val->type != JN_NUM || !ps_selected(flt, dn, ps_uuid_of(&rows[i], dn)))
          continue;
        if (!declared)
          fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", share[k].name, share[k].help, share[k].name);
        declared = true;
        fputs(share[k].name, f);
        prom_labels(f, &rows[i], dn);
        fprintf(f, " %llu\n", (unsigned long long)ps_u64(x, share[k].field));
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
int ps_write_prometheus(const char *path, const ps_view_t *v, const ps_filter_t *flt) {
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



size_t ps_label_count(void) { return g_nlabels; }
