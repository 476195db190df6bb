/*
 * options.h -- the one table of GPURECLAIM_* options (options.c), read once by the library; the command
 * checks values with the same parsers, so it accepts exactly what the library does. No CUDA.
 */
#ifndef GPURECLAIM_OPTIONS_H
#define GPURECLAIM_OPTIONS_H

#include "common.h"
#include "gpureclaim.h"

typedef struct gr_options {
  bool disable;          /* GPURECLAIM_DISABLE */
  int signal;            /* GPURECLAIM_SIGNAL: signal number, 0 = off */
  unsigned on_signal;    /* GPURECLAIM_ON_SIGNAL: GPURECLAIM_CACHED | ... */
  unsigned oom_retry;    /* GPURECLAIM_OOM_RETRY: retries after out-of-memory (0 = off) */
  char log[4096];        /* GPURECLAIM_LOG: a path appended to; "": none (see log_stderr) */
  bool log_stderr;       /* GPURECLAIM_LOG=stderr: release reports on stderr (unset: no reports written) */
  char rundir[4096];     /* GPURECLAIM_RUNDIR (resolved default) */
  bool leak_report;      /* GPURECLAIM_LEAK_REPORT */
  bool backtrace;        /* GPURECLAIM_BACKTRACE */
  bool python;           /* GPURECLAIM_PYTHON: framework caches through CPython (default on) */
  bool status;           /* GPURECLAIM_STATUS: status file and control socket (default on) */
  int verbose;           /* GPURECLAIM_VERBOSE: 0 warnings, 1 info, 2 debug */
  unsigned peers;        /* GPURECLAIM_PEERS: GR_PEERS_ASK | GR_PEERS_GIVE (default both) */
  unsigned peer_timeout_ms; /* GPURECLAIM_PEER_TIMEOUT: bound of one peer reclaim (default 2000) */
  bool on_signal_sleep;  /* GPURECLAIM_ON_SIGNAL=sleep: the signal puts the process to sleep */
  int sleep;             /* GPURECLAIM_SLEEP: -1 auto, 0 off, 1 on (gates installed) */
  unsigned wake_timeout; /* GPURECLAIM_WAKE_TIMEOUT: seconds a wake waits for room on the device */
  unsigned sleep_idle;   /* GPURECLAIM_SLEEP_IDLE: seconds without a CUDA call before sleeping, 0 off */
} gr_options_t;

#define GR_PEERS_ASK 0x1u
#define GR_PEERS_GIVE 0x2u
#define GR_PEERS_SLEEP 0x4u /* a peer short after every cache may ask this process, idle, to sleep */

/* The options, parsed on first call (bad values warned about once, defaults used). Safe from any thread.
 * Inline: the allocation path reads an option per block, from files of the library and of gpureclaim_common
 * alike, and link-time optimisation does not reach into the static library. */
extern gr_options_t gr_opt_values;
extern _Atomic int gr_opt_loaded; /* 2 once gr_opt_values is filled */
const gr_options_t *gr_opt_load(void);
static inline const gr_options_t *gr_opt(void) {
  if (GR_LIKELY(atomic_load_explicit(&gr_opt_loaded, memory_order_acquire) == 2))
    return &gr_opt_values;
  return gr_opt_load();
}
/* GPURECLAIM_DISABLE alone, read from environ without allocating (usable from the constructor). */
bool gr_opt_disabled_early(void);
/* Parsers shared with the command (tools/): return 0, or -EINVAL for a malformed value. */
int gr_opt_parse_bool(const char *s, bool *out);
int gr_opt_parse_signal(const char *s, int *out);
int gr_opt_parse_what(const char *s, unsigned *out);
/* GPURECLAIM_PEERS: a list of ask, give, sleep (any order; default ask,give), or "off". */
int gr_opt_parse_peers(const char *s, unsigned *out);
/* GPURECLAIM_PEER_TIMEOUT: seconds, 0.001 to 60, at most 3 decimals ("2", "0.5"); *out in milliseconds. */
int gr_opt_parse_seconds_ms(const char *s, unsigned *out);
int gr_opt_parse_uint(const char *s, unsigned long long max, unsigned long long *out);
/* Whether a GPURECLAIM_LOG value names standard error ("stderr" in any case, or "-") rather than a file. */
bool gr_opt_log_is_stderr(const char *s);
/* Parses value as variable name would be: 0, -EINVAL (malformed) or -ENOENT (no such variable); *expected is
 * what the variable takes, in words, as its warning says. */
int gr_opt_check(const char *name, const char *value, const char **expected);
/* Name of a signal as GPURECLAIM_SIGNAL writes it ("USR1", "RTMIN+3"), "off" for 0. */
const char *gr_opt_signal_name(int sig, char *buf, size_t len);
/* "cached,orphaned" for a mask. */
const char *gr_opt_what_name(unsigned what, char *buf, size_t len);
/* Re-reads the environment (tests only). */
void gr_opt_reload(void);
/* Called from the constructor: records the current directory if GPURECLAIM_LOG is a relative path, which is
 * then resolved from it (no allocation). */
void gr_opt_note_start_dir(void);

#endif
