/* command.h -- shared by the gpureclaim command's files. */
#ifndef GR_COMMAND_H
#define GR_COMMAND_H

#include "jsonread.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

/* Exit statuses (documented in --help). */
enum { EX_OK = 0, EX_FAILED = 1, EX_USAGE = 2, EX_NOPROC = 3 };
/* Returned by a subcommand that printed its --help (cmd_help()): main exits 0. */
enum { EX_HELP = -1 };

/* A process running gpureclaim, as its status file describes it. */
typedef struct proc {
  pid_t pid;
  jnode_t *status;  /* the parsed status file */
  uid_t foreign_uid; /* the owner a refused status file claims */
  char path[4200];
  char error[2048];  /* why cmd_find() did not find it (also printed to stderr) */
} proc_t;

/* Notes on what the command did on the way (a stale status file removed, a file ignored, a directory refused):
 * on standard error, or, while top owns the terminal, handed to the sink it set (a line written to a terminal
 * that ncurses draws on scrolls it, and every later redraw lands on the wrong row). */
__attribute__((format(printf, 1, 2))) void cmd_note(const char *fmt, ...);
void cmd_set_note_sink(void (*sink)(const char *note, void *arg), void *arg); /* NULL: standard error again */

/* The run directory the library uses (same rules); NULL when absent, or with a message if unsafe. */
const char *cmd_rundir(bool quiet);
/* What to do about a run directory that is not private (chmod 700 DIR, ...), in buf. */
struct stat;
void cmd_rundir_fix(const char *dir, const struct stat *st, char *buf, size_t len);
/* Whether cmd_rundir() refused the directory (someone else's, or open to others). */
bool cmd_rundir_refused(void);
/* Every live process of this user with a status file, in every run directory it reads (cmd_rundirs_at()); stale
 * files are removed and status files claiming another user are ignored (both noted: cmd_note()). */
size_t cmd_list(proc_t **out);
/* One process by pid. Returns 0, EX_FAILED when the run directory is refused (cmd_rundir() printed why), or
 * EX_NOPROC after printing why (unknown pid, another user's process or status file, no gpureclaim, an invalid
 * status file). */
int cmd_find(pid_t pid, proc_t *out);
/* cmd_find() printing nothing, and without looking for children that run gpureclaim. */
int cmd_find_quiet(pid_t pid, proc_t *out);
/* The processes under pid (children, theirs, ...), at most max, parents before children. */
size_t cmd_descendants(pid_t pid, pid_t *out, size_t max);
/* The run directories the last cmd_list() read: [0] the command's own (it may not exist), then those where
 * processes of this user started elsewhere have their control sockets. */
size_t cmd_rundirs_count(void);
const char *cmd_rundirs_at(size_t i);
void cmd_free(proc_t *p);
/* Whether pid's main thread is exiting (PF_EXITING in /proc/PID/stat), or pid is gone. A process whose sockets the
 * kernel closed as it exits is exiting, though not a zombie yet: its sockets close before its threads are. */
bool cmd_exiting(pid_t pid);
/* Whether the process of p's status file still runs: its pid has its start time, and is not a zombie. */
bool cmd_alive(const proc_t *p);
/* sock.c: the control socket's client. A deadline timeout seconds from now (CLOCK_MONOTONIC). */
struct timespec cmd_deadline_in(double timeout);
/* Connects to p's control socket (the connect bounded by timeout): the socket, or -1 with *why, and
 * *no_listener set when nobody listens there at all (no socket named, no socket file, or nobody accepting). */
int cmd_sock_connect(const proc_t *p, double timeout, const char **why, bool *no_listener);
/* Sends a request line: 0, or -1 with *why (never SIGPIPE). */
int cmd_sock_send(int fd, const char *line, const char **why);
/* cmd_sock_connect, then the request (up to 298 bytes) and its newline: the socket, or -1 as those two. */
int cmd_sock_request(const proc_t *p, const char *request, double timeout, const char **why, bool *no_listener);
/* Reads from fd into *buf (of *cap bytes, grown as needed, kept NUL-terminated) until the peer closes (1), the
 * deadline passes (0), or an error (-1; errno ENOMEM when *buf could not grow). With stop_at_line, returns 2
 * as soon as a whole line is there. */
int cmd_sock_read(int fd, char **buf, size_t *n, size_t *cap, const struct timespec *deadline, bool stop_at_line);
/* Connects to p's control socket and hangs up at once: 0 when something listens, 1 when the status file names
 * no socket, else the negative errno (-ECONNREFUSED: the socket file is there but nobody listens, so the
 * gpureclaim that wrote the status file no longer runs in the process: it exec'd; -ENOENT: the file is gone). */
int cmd_connect_check(const proc_t *p);
/* Sends one request over the process's control socket and returns the parsed answer (a JSON object), or NULL
 * with the reason in *why. timeout bounds the whole exchange, in seconds. *no_listener (may be NULL) tells
 * whether nobody listens there at all (no socket, or the process closed it), as opposed to no answer. */
jnode_t *cmd_ask(const proc_t *p, const char *request, double timeout, const char **why, bool *no_listener);
/* cmd_ask()'s *why when the timeout passed (the connection is closed then: the process drops a release request
 * whose asker hung up). */
extern const char cmd_why_timed_out[];
/* procs.c again. Calls fn(item) for each of n items of `stride` bytes, up to 32 at a time in threads of their
 * own (here when a thread cannot be started), and returns when every call has. For asking several processes at
 * once: one that does not answer then costs its timeout once, not once per process. */
void cmd_each_at_once(void *items, size_t n, size_t stride, void (*fn)(void *item));
/* Re-reads a process's status file. */
jnode_t *cmd_read_status(const proc_t *p);

/* nvml.c: the machine's GPUs as nvidia-smi numbers them (NVML, loaded by the command on first use). */
#define CMD_MAX_GPUS 64
typedef struct cmd_gpu {
  int index;     /* nvidia-smi's */
  char uuid[96]; /* "GPU-..." */
  bool have_mem;
  uint64_t free, total; /* the device's memory as NVML reports it (nvidia-smi's figures) */
} cmd_gpu_t;
/* Whether NVML answers; *why (may be NULL) says why not. */
bool cmd_nvml_ok(const char **why);
/* The machine's GPUs in nvidia-smi's order; 0 with *why when NVML cannot be loaded. */
size_t cmd_nvml_gpus(const cmd_gpu_t **out, const char **why);
/* nvidia-smi's index of the GPU with that UUID; -1 when NVML does not know it (or cannot be loaded). */
int cmd_nvml_index(const char *uuid);
/* Reads every GPU's memory figures again (top, each frame). */
void cmd_nvml_refresh(void);

/* output.c: numbers for people, JSON for programs. */
const char *cmd_bytes(uint64_t v, char *buf, size_t len);                   /* "1.5 GiB" */
bool cmd_json_out(void);                                                    /* --json given */
/* A CLOCK_REALTIME time in milliseconds as ISO 8601, local time with its offset: 2026-11-28T15:20:01.123+01:00. */
const char *cmd_iso_time(int64_t ms, char *buf, size_t len);
void cmd_set_json(bool on);
void cmd_json_str(FILE *f, const char *s);
void cmd_json_dump(FILE *f, const jnode_t *n); /* n == NULL: null */

/* ---- The subcommands' options, each written once (help.c) ----
 * A subcommand's options are one table of cmd_opt_t: its getopt_long tables, its --help, the option lists of
 * `gpureclaim --help` and the completions' and manual's checks (tests/cli/test_cli_docs.py) all come from it. */
enum { CMD_NOARG, CMD_ARG, CMD_OPTARG }; /* takes no value, a value, a value only after "=" */
typedef struct cmd_opt {
  int val;             /* what cmd_getopt() returns for it: its short letter, or a value from 256 */
  char shortopt;       /* 0: none */
  const char *longopt; /* without the dashes */
  int has_arg;         /* CMD_NOARG, CMD_ARG, CMD_OPTARG */
  const char *arg;     /* the value's name in the help (FIELD, S, ...) */
  const char *help;    /* its lines of --help, "\n" between them */
} cmd_opt_t;

typedef struct cmd_spec {
  const char *name;     /* "ps" */
  const char *usage;    /* what follows "usage: gpureclaim " (lines after the first begin with the name too) */
  const char *summary;  /* one line for `gpureclaim --help` */
  const char *text;     /* what it does, before the options ("" for nothing) */
  const cmd_opt_t *opts; /* ended by an entry whose longopt is NULL; -h/--help is added by help.c */
  const char *tail;     /* after the options ("" for nothing) */
  bool in_order;        /* options end at the first operand (run: the program's own options follow it) */
} cmd_spec_t;

/* The specs, in the order `gpureclaim --help` lists them. */
const cmd_spec_t *cmd_run_spec(void);
extern const cmd_spec_t cmd_ps_spec, cmd_top_spec, cmd_release_spec, cmd_snapshot_spec, cmd_sleep_spec,
    cmd_wake_spec;

/* Shared by the subcommands' argument parsers. */
int cmd_usage_error(const char *fmt, const char *arg); /* prints, returns EX_USAGE */
bool cmd_parse_seconds(const char *s, double *out);     /* 0..86400 */
/* getopt_long over a spec's options, for subcommands whose argv[0] is their name: returns the option's val, 'h'
 * for -h/--help, -1 after the last option (optind then indexes the first operand), or -2 after printing a
 * usage error that names the subcommand and the option (unknown, with what was maybe meant; missing its
 * value; given a value it does not take). Set optind = 1 before the first call. */
int cmd_getopt(int argc, char **argv, const cmd_spec_t *spec);
/* Prints a subcommand's --help (usage, text, options, tail), then the exit statuses, on stdout; returns
 * EX_HELP. */
int cmd_help(const cmd_spec_t *spec);
/* `gpureclaim --help`: every subcommand's usage, summary and options. */
void cmd_print_usage(FILE *f);
/* The candidate closest to word (a prefix of one, or a small edit distance), or NULL: "did you mean". */
const char *cmd_nearest(const char *word, const char *const *cands, size_t n);
bool cmd_parse_pid(const char *s, pid_t *out);
/* The command line to show for a process: paths shortened to file names ("python3 train.py --steps 5"), in
 * buf; with --json the whole command line as recorded. */
const char *cmd_command_of(const proc_t *p, char *buf, size_t len);
/* Makes s safe to show on a terminal, in place: control characters (an escape sequence could clear the
 * screen), C1 controls and bytes that are not UTF-8 become one '?' each (s may get shorter). Returns s. */
char *cmd_printable(char *s);
/* Just the program's file name ("python3"), for labels. */
void cmd_program_of(const proc_t *p, char *buf, size_t len);

/* The subcommands, each returning an exit status: run, release and snapshot get argv[0] = their name (for
 * getopt_long, through cmd_getopt()); ps and top get what follows their name. */
int cmd_run(int argc, char **argv);
int cmd_ps(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_release(int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_sleep(int argc, char **argv);
int cmd_wake(int argc, char **argv);

#endif
