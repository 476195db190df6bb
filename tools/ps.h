/* ps.h -- what `gpureclaim ps` and `gpureclaim top` share (ps_view.c collects, sorts and makes the table's lines,
 * ps_format.c writes the formats for programs, cmd_ps.c is the command; cmd_top.c draws the same rows on a
 * terminal). */
#ifndef GR_PS_H
#define GR_PS_H

#include "command.h"

#define PS_MAX_GPUS 64
#define PS_UUID_LEN 96
#define PS_MAX_PIDS 256

/* One process, with its figures summed over the GPUs shown (all, or those -i/--gpu selects). */
typedef struct ps_row {
  proc_t p;
  jnode_t *stats;  /* the socket's `stats` answer, NULL if it did not answer */
  const char *why; /* ... and why not */
  bool stopped;    /* stopped (SIGSTOP, ^Z, a debugger): not asked, it cannot answer until it continues */
  bool stale;      /* not answering, its figures are its status file's last ones (`peer`) */
  bool asleep;     /* sleeping or waking: its device memory is on the host (host bytes), none on the GPUs */
  char gpus[96];   /* the GPUs shown that it uses, as nvidia-smi numbers them ("0,1"; "-" none, "?" unknown) */
  char ordinals[96]; /* the same GPUs by its own CUDA ordinals (CUDA_VISIBLE_DEVICES renumbers) */
  char uuids[PS_MAX_GPUS * 4];
  uint64_t live, held, pool_cached, orphan, pinned;
  uint64_t fw_reserved, fw_allocated, fw_releasable; /* framework caches (PyTorch, CuPy, ...) */
  uint64_t cached;     /* pool_cached + fw_releasable: what a release of cached memory gives back */
  uint64_t releasable; /* cached + orphan: what `release` (cached,orphaned) gives back */
  uint64_t host;       /* asleep: the device memory it keeps in host memory */
  int64_t figures_ms;  /* stale: when the status file was written (CLOCK_REALTIME ms) */
  /* Sharing a GPU (the status file's `peer` rows and `wait`, on the GPUs shown): */
  bool has_limit, has_guarantee;
  uint64_t limit, guarantee; /* GPURECLAIM_LIMIT and GPURECLAIM_GUARANTEE, summed over the GPUs that have one */
  bool waiting;              /* it waits for memory (`wait`) on a GPU shown */
  uint64_t wait_bytes;       /* ... for this much */
  int64_t wait_since_ms;     /* ... since then (CLOCK_REALTIME ms) */
  char wait_for[8];          /* ... for an allocation ("alloc") or a wake ("wake") */
  char wait_uuid[PS_UUID_LEN];
} ps_row_t;

/* One GPU: the driver's figures (NVML's, as nvidia-smi shows them; else those of a process that uses it) and
 * the sums of the processes shown. */
typedef struct ps_gpu {
  int index;  /* nvidia-smi's number; -1 when NVML does not know it */
  int device; /* the ordinal some process gives it (the only number without NVML) */
  char uuid[PS_UUID_LEN];
  bool have_mem;
  uint64_t free, total;
  uint64_t held, cached, orphan, releasable;
  unsigned procs;
} ps_gpu_t;

typedef struct ps_view {
  ps_row_t *rows;
  size_t n;
  ps_gpu_t gpus[PS_MAX_GPUS];
  size_t ngpus;
  /* Every GPU an answering process reports, selected or not (what -i/--gpu is checked against without NVML):
   * its ordinal in some process and its UUID ("" when unknown). */
  struct {
    int device;
    char uuid[PS_UUID_LEN];
  } known[PS_MAX_GPUS];
  size_t nknown;
  bool nvml;            /* GPUs numbered as nvidia-smi numbers them */
  const char *nvml_why; /* ... else why not */
  int64_t time_ms;      /* when it was collected (CLOCK_REALTIME) */
  char host[256];       /* the machine's name */
} ps_view_t;

/* -i/--gpu: indices (nvidia-smi's) and UUIDs (a unique prefix does, with or without "GPU-"), comma-separated. */
typedef struct ps_filter {
  size_t n;
  char sel[PS_MAX_GPUS][PS_UUID_LEN];
  size_t npids; /* ps PID...: only these processes */
  pid_t pids[PS_MAX_PIDS];
} ps_filter_t;

/* The sort keys, by name ("held", "cached", ...); -1 for an unknown name. */
int ps_sort_key(const char *name);
const char *ps_sort_name(int key);
int ps_sort_count(void);
/* Parses a -i/--gpu value into f; false (nothing printed) when it is malformed. */
bool ps_parse_filter(const char *s, ps_filter_t *f);

/* Asks every process of this user for its stats (at once), keeps those on the selected GPUs (and those of the
 * pids given, if any), sorts. */
void ps_collect(ps_view_t *v, const ps_filter_t *f, int sort_key);
void ps_free(ps_view_t *v);
/* Whether each -i/--gpu selector names a GPU (of the machine, by NVML; else one some answering process
 * reports), a UUID prefix exactly one: EX_OK, or EX_USAGE after saying which selector is ambiguous (with its
 * candidates) or names no GPU. */
int ps_check_filter(const ps_view_t *v, const ps_filter_t *f, const char *cmd);

/* Table text, one line at most `width` columns (0: no limit), without the newline. */
void ps_gpu_header(char *buf, size_t len, int width);
void ps_gpu_line(const ps_gpu_t *g, char *buf, size_t len, int width);
void ps_row_header(char *buf, size_t len, int width);
void ps_row_line(const ps_row_t *r, char *buf, size_t len, int width);

/* The whole of ps's text output (GPU table, process table, frameworks' lines, with the footnote), as wide as
 * the terminal standard output is (no limit when it is not one); and --json's array. */
void ps_print_table(FILE *f, const ps_view_t *v, const ps_filter_t *flt, bool footnote);
/* A process's framework caches (PyTorch, CuPy, ...), one indented line each, cut to width columns (0: no
 * limit): reserved = in use + releasable + non-releasable (as torch.cuda.memory_summary() splits them). Nothing
 * when it has none. */
void ps_print_frameworks(FILE *f, const ps_row_t *r, const ps_filter_t *flt, int width);
/* Its limit and guarantee per GPU shown, and what it waits for, one indented line each (nothing when it has
 * none of them). */
void ps_print_sharing(FILE *f, const ps_row_t *r, const ps_filter_t *flt, int width);
void ps_print_json(FILE *f, const ps_view_t *v, const ps_filter_t *flt);

/* ---- shared by ps_view.c (the view), ps_format.c (the formats for programs) and cmd_ps.c ---- */

/* Reading a process's answers (ps_view.c): a member as an unsigned number (0 when absent), an array member (NULL
 * when absent), the pools' unused memory of a stats object, whether GPU d (UUID) is one the filter selects, a
 * row's UUID of its device d ("" when unknown), a GPU's number as nvidia-smi gives it (its NVML index when NVML
 * answered, else the process's ordinal), whether NVML numbers the GPUs, a row's sleep state and host bytes. */
uint64_t ps_u64(const jnode_t *o, const char *field);
const jnode_t *ps_arr(const jnode_t *o, const char *key);
uint64_t ps_pool_cached(const jnode_t *s);
bool ps_selected(const ps_filter_t *f, int d, const char *uuid);
const char *ps_uuid_of(const ps_row_t *r, int d);
int ps_gpu_number(int d, const char *uuid);
bool ps_nvml(void);
const char *ps_sleep_state(const ps_row_t *r);
uint64_t ps_sleep_host(const ps_row_t *r);

/* The formats (ps_format.c). */
enum { OUT_TABLE, OUT_CSV, OUT_JSON };
enum { F_NUM, F_BYTES, F_STR, F_BOOL };
typedef struct ps_field {
  const char *name, *header;
  int type;
  bool from_stats; /* unknown (null, empty, ?) when the process did not answer */
} ps_field_t;
extern const ps_field_t ps_fields[]; /* every --query field, in the help's order */
extern const size_t ps_nfields;
#define PS_QUERY_MAX 128 /* fields one --query may name (a field may come twice) */
/* The index of the field named by the n bytes at name, -1 for none. */
int ps_field_index(const char *name, size_t n);
/* The fields q[0..nq) of every row: fmt OUT_TABLE, OUT_CSV or OUT_JSON, as --format's header and units say. */
void ps_print_query(FILE *f, const ps_view_t *v, const int *q, size_t nq, int fmt, bool header, bool units);
/* --label NAME=VALUE (kept: arg must live on), 0 or an error already said; how many were given. */
int ps_add_label(char *arg);
size_t ps_label_count(void);
/* node_exporter's textfile format to path ("-": standard output), atomically; 0 or -1 (said why). */
int ps_write_prometheus(const char *path, const ps_view_t *v, const ps_filter_t *flt);

#endif
