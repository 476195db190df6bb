/* ps.h -- what `gpureclaim ps` and `gpureclaim top` share (cmd_ps.c collects, sorts and formats; cmd_top.c
 * draws the same rows on a terminal). */
#ifndef GR_PS_H
#define GR_PS_H

#include "command.h"

#define PS_MAX_GPUS 64
#define PS_UUID_LEN 48

/* One process, with its figures summed over the GPUs shown (all, or those -i/--gpu selects). */
typedef struct ps_row {
  proc_t p;
  jnode_t *stats;  /* the socket's `stats` answer, NULL if it did not answer */
  const char *why; /* ... and why not */
  char gpus[96];   /* "0,1": the GPUs shown that it uses; "-" none, "?" unknown (not answering) */
  char uuids[PS_MAX_GPUS * 4];
  uint64_t live, held, pool_cached, orphan, pinned;
  uint64_t fw_reserved, fw_allocated, fw_releasable; /* framework caches (PyTorch, CuPy, ...) */
  uint64_t cached;     /* pool_cached + fw_releasable: what a release of cached memory gives back */
  uint64_t releasable; /* cached + orphan: what `release` (cached,orphaned) gives back */
} ps_row_t;

/* One GPU: the driver's figures (as nvidia-smi shows them, when a process that uses it answered) and the sums
 * of the processes shown. */
typedef struct ps_gpu {
  int device;
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
  /* Every GPU an answering process reports, selected or not (what -i/--gpu is checked against): its
   * ordinal in some process and its UUID ("" when unknown). */
  struct {
    int device;
    char uuid[PS_UUID_LEN];
  } known[PS_MAX_GPUS];
  size_t nknown;
} ps_view_t;

/* -i/--gpu: ordinals and UUIDs (a unique prefix does, with or without "GPU-"), comma-separated. */
typedef struct ps_filter {
  size_t n;
  char sel[PS_MAX_GPUS][PS_UUID_LEN];
} ps_filter_t;

/* The sort keys, by name ("held", "cached", ...); -1 for an unknown name. */
int ps_sort_key(const char *name);
const char *ps_sort_name(int key);
int ps_sort_count(void);
/* Parses a -i/--gpu value into f; false (nothing printed) when it is malformed. */
bool ps_parse_filter(const char *s, ps_filter_t *f);

/* Asks every process of this user for its stats (at once), keeps those on the selected GPUs, sorts. */
void ps_collect(ps_view_t *v, const ps_filter_t *f, int sort_key);
void ps_free(ps_view_t *v);
/* Whether each -i/--gpu selector names a GPU some answering process reports, a UUID prefix exactly one:
 * EX_OK, or EX_USAGE after saying which selector is ambiguous (with its candidates) or names no GPU. */
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
void ps_print_json(FILE *f, const ps_view_t *v, const ps_filter_t *flt);

#endif
