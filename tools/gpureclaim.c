/*
 * gpureclaim -- run programs under gpureclaim, list them, release their GPU memory, inspect it.
 *
 * One file per subcommand (cmd_run.c, cmd_ps.c for ps and top, cmd_release.c, cmd_snapshot.c); procs.c finds
 * and reaches processes as docs/PROTOCOL.md describes; output.c formats. Option values are checked with the
 * library's own parsers (src/options.c), so the command accepts exactly what the library does. Options are parsed
 * with getopt_long (cmd_getopt()), long and short as GNU tools take them; `gpureclaim CMD --help` prints CMD's.
 */
#include "command.h"
#include "gpureclaim.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_STATUSES                                                                                          \
  "Exit status:\n"                                                                                              \
  "  0  success\n"                                                                                              \
  "  1  a process did not answer in time or refused the request, the run directory was refused,\n"             \
  "     a file or standard output could not be written, or run could not find the library\n"                    \
  "  2  bad usage (GPURECLAIM_RUNDIR not an absolute path included)\n"                                           \
  "  3  no such process, another user's process, or a process not running gpureclaim\n"                         \
  "     (release: also a process that exited before its release by signal was seen)\n"                          \
  "  run: the exit status of CMD; 126 when it cannot be executed, 127 when it is not found\n"

static const char g_usage[] =
    "usage: gpureclaim COMMAND [options]       (gpureclaim COMMAND --help: that command's options)\n"
    "\n"
    "  run [options] [--] CMD ARGS...     run CMD with gpureclaim preloaded (prepended to LD_PRELOAD)\n"
    "      -s, --signal SIG      release signal: USR1 (default), USR2, RTMIN+n, off      GPURECLAIM_SIGNAL\n"
    "      -w, --on-signal WHAT  what the signal releases (default cached,orphaned)      GPURECLAIM_ON_SIGNAL\n"
    "          --oom-retry N     retries of an allocation that ran out of memory (0..16) GPURECLAIM_OOM_RETRY\n"
    "      -l, --log PATH        release reports (JSON lines) appended to PATH           GPURECLAIM_LOG\n"
    "      -d, --rundir DIR      private directory of status files and sockets           GPURECLAIM_RUNDIR\n"
    "          --leak-report     blocks never freed, printed at exit                     GPURECLAIM_LEAK_REPORT=1\n"
    "          --backtrace       a short backtrace per allocation for leak reports       GPURECLAIM_BACKTRACE=1\n"
    "      -v, --verbose[=N]     informational (1) or debugging (2) messages (N with =)  GPURECLAIM_VERBOSE\n"
    "          --no-status       no status file or control socket (the signal works)     GPURECLAIM_STATUS=0\n"
    "          --disable         load but interpose nothing                              GPURECLAIM_DISABLE=1\n"
    "      The library is found next to the command (../LIBDIR/libgpureclaim.so.0) or in GPURECLAIM_LIBRARY.\n"
    "  ps [--json] [--prometheus FILE]\n"
    "      your processes running gpureclaim: devices, live, cached (pools: reserved - used) and pinned memory,\n"
    "      releases; --prometheus writes node_exporter's textfile format to FILE (atomically; - for stdout)\n"
    "  release PID...|-a [-w WHAT] [-t S] [-s] [-j]    (--all --what --timeout --signal --json)\n"
    "      give back memory and print what each process gave back (bytes, milliseconds). WHAT: cached,\n"
    "      orphaned, all, comma-separated (default: the process's GPURECLAIM_ON_SIGNAL). Over the process's\n"
    "      control socket; with --signal, or when nothing listens there, by its release signal, waiting for\n"
    "      its status file to report the release (--what must then match its GPURECLAIM_ON_SIGNAL).\n"
    "      --timeout S: how long to wait for the processes, asked at once (default 30)\n"
    "  snapshot PID [-j] [-l] [-t S]     (--json --leaks --timeout)\n"
    "      live blocks grouped by device, context, kind and calling library, largest first;\n"
    "      --leaks: the leak report (blocks never freed, by library and caller); --timeout S: how long\n"
    "      to wait for the process's answer (default 30)\n"
    "  sleep PID [-t S] [-j]             (--timeout --json)\n"
    "      all of the process's device memory to host memory (a release of cached and orphaned memory first);\n"
    "      its next CUDA call wakes it; --timeout S: how long to wait for threads inside CUDA calls (default 10)\n"
    "  wake PID [-t S] [-j]\n"
    "      wake a sleeping process now (it waits for room on the device, up to its GPURECLAIM_WAKE_TIMEOUT)\n"
    "  top [--interval S] [--iterations N] [--json]\n"
    "      ps, refreshed every S seconds (default 2); --iterations 1 prints one frame\n"
    "  -h, --help, --version\n"
    "\n"
    "Processes are found through status files in the run directory: GPURECLAIM_RUNDIR (an absolute path),\n"
    "else $XDG_RUNTIME_DIR/gpureclaim (when that directory is yours), else /tmp/gpureclaim-UID. It must be\n"
    "yours with mode 0700, else it is refused. Only your own processes are ever read or signalled.\n"
    "Memory is shown in KiB/MiB/GiB (1024).\n"
    "\n"
    EXIT_STATUSES;

/* The subcommand being run, for "(see gpureclaim CMD --help)". */
static const char *g_sub;

int cmd_usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gpureclaim: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(see gpureclaim%s%s --help)\n", g_sub ? " " : "", g_sub ? g_sub : "");
  return EX_USAGE;
}

int cmd_help(const char *text) {
  fputs(text, stdout);
  fputs("\n" EXIT_STATUSES, stdout);
  return EX_HELP;
}

int cmd_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts) {
  opterr = 0; /* the messages are ours: they name the subcommand, and the exit status is 2 */
  int c = getopt_long(argc, argv, shortopts, longopts, NULL);
  if (c != '?' && c != ':')
    return c;
  /* optopt: the short option, or the long option's val; 0 for a long option not known (or ambiguous). */
  const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
  char name[64];
  if (optopt && (arg[0] != '-' || arg[1] != '-')) { /* a short option, maybe in a cluster (-jx) */
    snprintf(name, sizeof name, "-%c", optopt);
  } else {
    size_t n = strcspn(arg, "=");
    snprintf(name, sizeof name, "%.*s", (int)(n < 60 ? n : 60), arg);
  }
  char msg[160];
  if (c == ':')
    snprintf(msg, sizeof msg, "%s: %s needs a value", argv[0], name);
  else if (optopt && strchr(arg, '=') && arg[0] == '-' && arg[1] == '-')
    snprintf(msg, sizeof msg, "%s: %s takes no value", argv[0], name);
  else
    snprintf(msg, sizeof msg, "%s: unknown option: %s", argv[0], name);
  cmd_usage_error("%s", msg);
  return -2;
}

bool cmd_parse_seconds(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= 0 && v <= 86400))
    return false;
  *out = v;
  return true;
}

bool cmd_parse_pid(const char *s, pid_t *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v <= 0 || v > INT_MAX)
    return false;
  *out = (pid_t)v;
  return true;
}

/* Output that could not be written is a failure (exit 1), as a file that could not be written is: `ps --json >
 * /dev/full` must not exit 0 having printed nothing. A reader that went away (`| head`) is not: the output it
 * wanted was written. */
static int finish(int rc) {
  errno = 0; /* a write that failed earlier left its errno behind, maybe overwritten since: EIO then */
  if (fflush(stdout) == 0 && !ferror(stdout))
    return rc;
  if (errno != EPIPE) {
    fprintf(stderr, "gpureclaim: cannot write the output: %s\n", strerror(errno ? errno : EIO));
    if (rc == EX_OK)
      rc = 1;
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      (!strcmp(argv[1], "help") && argc == 2)) {
    fputs(g_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? EX_USAGE : finish(EX_OK);
  }
  if (!strcmp(argv[1], "--version")) {
    printf("gpureclaim %s\n", GPURECLAIM_VERSION_STRING);
    return finish(EX_OK);
  }
  /* A relative run directory would be a different directory for each process (each resolves it from its own
   * working directory): refused here, for every subcommand, as the library refuses it. */
  const char *rd = getenv("GPURECLAIM_RUNDIR");
  if (rd && rd[0] != '/' && strcmp(argv[1], "help") != 0) {
    fprintf(stderr, "gpureclaim: GPURECLAIM_RUNDIR=%s is not an absolute path: give the run directory as an "
                    "absolute path (or unset it for the default)\n", rd);
    return EX_USAGE;
  }
  /* own_options: the subcommand parses its own --help (argv[0] is its name, for getopt_long); the others get
   * the arguments after their name, and --help among them prints the general usage. */
  static const struct {
    const char *name;
    int (*fn)(int, char **);
    bool own_options;
  } cmds[] = {{"run", cmd_run, true},          {"ps", cmd_ps, true}, {"release", cmd_release, true},
              {"snapshot", cmd_snapshot, true}, {"top", cmd_top, true},   {"sleep", cmd_sleep, true},
              {"wake", cmd_wake, true}};
  bool help = !strcmp(argv[1], "help"); /* gpureclaim help CMD */
  const char *name = help ? argv[2] : argv[1];
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    if (strcmp(name, cmds[i].name) != 0)
      continue;
    g_sub = cmds[i].name;
    if (help) {
      char *hargv[] = {argv[2], "--help", NULL};
      if (cmds[i].own_options)
        return finish(cmds[i].fn(2, hargv) == EX_HELP ? EX_OK : EX_USAGE);
      fputs(g_usage, stdout);
      return finish(EX_OK);
    }
    if (cmds[i].own_options) {
      int rc = cmds[i].fn(argc - 1, argv + 1);
      return finish(rc == EX_HELP ? EX_OK : rc);
    }
    for (int a = 2; a < argc; a++)
      if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
        fputs(g_usage, stdout);
        return finish(EX_OK);
      }
    return finish(cmds[i].fn(argc - 2, argv + 2));
  }
  return cmd_usage_error("unknown command: %s", name);
}
