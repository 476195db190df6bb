/*
 * options.h -- the one list of GPURECLAIM_* options (GR_OPTIONS below), read once by the library (options.c);
 * the command checks values with the same parsers, so it accepts exactly what the library does, and makes its
 * `run` options from the same list. No CUDA.
 */
#ifndef GPURECLAIM_OPTIONS_H
#define GPURECLAIM_OPTIONS_H

#include "common.h"
#include "gpureclaim.h"

/*
 * The options, each written once:
 *
 *   X(ID, field, kind, bound, default, expected, run)
 *     ID        the variable is GPURECLAIM_<ID>
 *     field     its member of gr_options_t
 *     kind      its parser and the member's type (GR_OPT_T_<kind>, options.c's parse_<kind>): yesno (1/0/yes/no/
 *               on/off, any case), uint and level (a whole number from 0 to bound, into unsigned / int), signal,
 *               what (a list of cached, orphaned, all, or sleep), log (stderr or a path), dir (an absolute path),
 *               peers (a list of ask, give, sleep, or off), seconds (0.001 to 60 into milliseconds), autobool
 *               (auto, or yes/no as -1, 1, 0), size (bytes or a fraction of the device: gr_opt_parse_size)
 *     bound     the largest value of uint and level (else 0)
 *     default   the value as one would write it, parsed as the variable's (NULL: none, or computed: RUNDIR)
 *     expected  what the warning about a malformed value says the variable takes
 *     run       the command's `run` option: (short, long, how, set, metavar, help), GR_RUN_NO for none; how is
 *               GR_RUN_VALUE (takes a value), GR_RUN_FLAG (sets the variable to set) or GR_RUN_OPTIONAL (a value
 *               only after "=", else set); help is its lines of `run --help` ("\n" between them)
 *
 * The order is run --help's. What C cannot generate (docs/LIBRARY.md's table, gpureclaim(1) and (7), the shell
 * completions) tests/cli/test_names_docs.py checks against this list, as tests/cli/layout.c prints it.
 */
#define GR_OPT_YESNO "1/0/yes/no/on/off"
#define GR_OPT_SIZE_EXPECTED(unset)                                                                              \
  "a size (bytes, or K, M, G, T: 8G, 1.5GiB) or a fraction of the device in (0, 1] (0.5, 50%); unset: " unset
#define GR_OPTIONS(X)                                                                                             \
  X(SIGNAL, signal, signal, 0, "USR1", "USR1, USR2, RTMIN+n or off",                                              \
    ('s', "signal", GR_RUN_VALUE, NULL, "SIG", "release signal: USR1 (default), USR2, RTMIN+n, off"))             \
  X(ON_SIGNAL, on_signal, what, 0, "cached,orphaned", "a list of cached, orphaned, all, or sleep",                \
    ('w', "on-signal", GR_RUN_VALUE, NULL, "WHAT",                                                                \
     "what the signal releases: cached, orphaned, all\n(comma-separated; default cached,orphaned)"))              \
  X(OOM_RETRY, oom_retry, uint, 16, "1", "a number of retries from 0 to 16",                                      \
    (0, "oom-retry", GR_RUN_VALUE, NULL, "N", "retries of an allocation that ran out of memory (0..16)"))         \
  X(LOG, log, log, 0, NULL, "stderr or a file path (a relative one from the directory the program started in)",   \
    ('l', "log", GR_RUN_VALUE, NULL, "PATH",                                                                      \
     "release reports (JSON lines) appended to PATH\n(stderr or -: standard error; unset: no reports)"))          \
  X(RUNDIR, rundir, dir, 0, NULL, "an absolute directory path",                                                   \
    ('d', "rundir", GR_RUN_VALUE, NULL, "DIR",                                                                    \
     "private directory of status files and sockets\n(absolute, yours, mode 0700)"))                              \
  X(LEAK_REPORT, leak_report, yesno, 0, "0", GR_OPT_YESNO,                                                        \
    (0, "leak-report", GR_RUN_FLAG, "1", NULL, "blocks never freed, printed at exit"))                            \
  X(BACKTRACE, backtrace, yesno, 0, "0", GR_OPT_YESNO,                                                            \
    (0, "backtrace", GR_RUN_FLAG, "1", NULL, "a short backtrace per allocation for leak reports"))                \
  X(VERBOSE, verbose, level, 2, "0", "0, 1 or 2",                                                                 \
    ('v', "verbose", GR_RUN_OPTIONAL, "1", "N",                                                                   \
     "informational (1) or debugging (2) messages; N only\nafter \"=\" (--verbose=2)"))                             \
  X(PEERS, peers, peers, 0, "ask,give", "a list of ask, give, sleep, or off",                                     \
    (0, "peers", GR_RUN_VALUE, NULL, "WHAT",                                                                      \
     "peer reclaim: ask,give (default), ask, give, sleep, off\n(ask: an out-of-memory asks the other gpureclaim " \
     "processes on\nthe same GPU for memory; give: answer them)"))                                                \
  X(PEER_TIMEOUT, peer_timeout_ms, seconds, 0, "2", "seconds from 0.001 to 60 (at most 3 decimals)",              \
    (0, "peer-timeout", GR_RUN_VALUE, NULL, "S", "bound of one peer reclaim, seconds (default 2)"))               \
  X(STATUS, status, yesno, 0, "1", GR_OPT_YESNO,                                                                  \
    (0, "no-status", GR_RUN_FLAG, "0", NULL,                                                                      \
     "no status file or control socket (the signal works;\nno peer reclaim either way)"))                         \
  X(DISABLE, disable, yesno, 0, "0", GR_OPT_YESNO,                                                                \
    (0, "disable", GR_RUN_FLAG, "1", NULL, "load but interpose nothing"))                                         \
  X(PYTHON, python, yesno, 0, "1", GR_OPT_YESNO, GR_RUN_NO)                                                       \
  X(SLEEP, sleep, autobool, 0, "auto", "auto, 1/yes/on or 0/no/off", GR_RUN_NO)                                   \
  X(WAKE_TIMEOUT, wake_timeout, uint, 86400, "10", "seconds from 0 to 86400", GR_RUN_NO)                          \
  X(SLEEP_IDLE, sleep_idle, uint, 30 * 86400, "0", "seconds from 0 (off) to 2592000", GR_RUN_NO)                  \
  X(SLEEP_MIN_AWAKE, sleep_min_awake, uint, 86400, "2", "seconds from 0 to 86400", GR_RUN_NO)                     \
  X(WAIT, wait, uint, 86400, "30", "seconds from 0 (never wait) to 86400", GR_RUN_NO)                             \
  X(LIMIT, limit, size, 0, NULL, GR_OPT_SIZE_EXPECTED("no limit"), GR_RUN_NO)                                      \
  X(GUARANTEE, guarantee, size, 0, NULL, GR_OPT_SIZE_EXPECTED("no guarantee"), GR_RUN_NO)

enum { GR_RUN_NONE, GR_RUN_VALUE, GR_RUN_FLAG, GR_RUN_OPTIONAL };
#define GR_RUN_NO (0, NULL, GR_RUN_NONE, NULL, NULL, NULL)

/* The member types, by kind. */
typedef char gr_opt_path_t[4096];
/* A size (GPURECLAIM_LIMIT): bytes, or a fraction of the device in millionths; both 0: unset. */
typedef struct gr_opt_size {
  uint64_t bytes;
  uint32_t ppm; /* 1 to 1,000,000 for a fraction */
} gr_opt_size_t;
#define GR_OPT_T_yesno bool
#define GR_OPT_T_uint unsigned
#define GR_OPT_T_level int
#define GR_OPT_T_signal int    /* a signal number, 0 = off */
#define GR_OPT_T_what unsigned /* GPURECLAIM_CACHED | ... */
#define GR_OPT_T_log gr_opt_path_t
#define GR_OPT_T_dir gr_opt_path_t
#define GR_OPT_T_peers unsigned   /* GR_PEERS_ASK | ... */
#define GR_OPT_T_seconds unsigned /* milliseconds */
#define GR_OPT_T_autobool int     /* -1 auto, 0 off, 1 on */
#define GR_OPT_T_size gr_opt_size_t

#define GR_OPT_MEMBER_(ID, field, kind, ...) GR_OPT_T_##kind field;
typedef struct gr_options {
  GR_OPTIONS(GR_OPT_MEMBER_)
  bool log_stderr;      /* GPURECLAIM_LOG=stderr: release reports on stderr (unset: log is "", no reports written) */
  bool on_signal_sleep; /* GPURECLAIM_ON_SIGNAL=sleep: the signal puts the process to sleep */
} gr_options_t;
#undef GR_OPT_MEMBER_

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
/* GPURECLAIM_BACKTRACE for the allocation path, which reads it per block: 1 off, 2 on, 0 before the options are
 * loaded. One relaxed load instead of gr_opt()'s acquire check and then the field. */
extern _Atomic unsigned char gr_opt_backtrace_hot;
static inline bool gr_opt_backtrace(void) {
  unsigned char v = atomic_load_explicit(&gr_opt_backtrace_hot, memory_order_relaxed);
  return GR_UNLIKELY(v != 1) && (v == 2 || gr_opt()->backtrace);
}
/* Parsers shared with the command (tools/): return 0, or -EINVAL for a malformed value. */
int gr_opt_parse_bool(const char *s, bool *out);
int gr_opt_parse_signal(const char *s, int *out);
int gr_opt_parse_what(const char *s, unsigned *out);
/* GPURECLAIM_PEERS: a list of ask, give, sleep (any order; default ask,give), or "off". */
int gr_opt_parse_peers(const char *s, unsigned *out);
/* GPURECLAIM_PEER_TIMEOUT: seconds, 0.001 to 60, at most 3 decimals ("2", "0.5"); *out in milliseconds. */
int gr_opt_parse_seconds_ms(const char *s, unsigned *out);
int gr_opt_parse_uint(const char *s, unsigned long long max, unsigned long long *out);
/* GPURECLAIM_LIMIT and GPURECLAIM_GUARANTEE: a whole number of bytes ("8589934592"), a size with a binary unit
 * K, M, G or T (any case, "iB" or "B" after it allowed: "8G", "1.5GiB"), or a fraction of the device: a number
 * with a decimal point and no unit, above 0 and at most 1 ("0.5"), or a percentage above 0 and at most 100
 * ("50%"). 0 is refused. */
int gr_opt_parse_size(const char *s, gr_opt_size_t *out);
/* The bytes of size on a device of total bytes (a fraction rounded down; 0 for an unset size). */
uint64_t gr_opt_size_bytes(const gr_opt_size_t *size, uint64_t total);
/* Whether a GPURECLAIM_LOG value names standard error ("stderr" in any case, or "-") rather than a file. */
bool gr_opt_log_is_stderr(const char *s);
/* The default of variable name as written in GR_OPTIONS ("cached,orphaned"); NULL: none, computed, or no such
 * variable. */
const char *gr_opt_default(const char *name);
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
