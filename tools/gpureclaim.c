/*
 * gpureclaim -- run programs under gpureclaim, list them, release their GPU memory, inspect it.
 *
 * One file per subcommand (cmd_run.c, cmd_ps.c, cmd_top.c, cmd_release.c, cmd_snapshot.c, cmd_sleep.c for sleep
 * and wake; ps and top share the view of ps_view.c, ps's formats for programs are ps_format.c's); procs.c finds
 * processes and sock.c reaches them, as docs/PROTOCOL.md describes; nvml.c numbers GPUs as nvidia-smi does;
 * output.c formats. Each subcommand's options are one table (help.c makes getopt's tables and every help text
 * from it). Option values are checked with the library's own parsers (src/base/options.c), so the command accepts
 * exactly what the library does. Options are parsed with getopt_long (cmd_getopt()), long and short as GNU
 * tools take them; `gpureclaim CMD --help` prints CMD's.
 */
#include "command.h"
#include "gpureclaim.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cmd_print_usage(argc < 2 ? stderr : stdout);
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
  /* Each subcommand gets argv[0] = its name (for getopt_long, through cmd_getopt()). */
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"run", cmd_run},   {"ps", cmd_ps},     {"release", cmd_release}, {"snapshot", cmd_snapshot},
              {"top", cmd_top},   {"sleep", cmd_sleep}, {"wake", cmd_wake}};
  bool help = !strcmp(argv[1], "help"); /* gpureclaim help CMD */
  const char *name = help ? argv[2] : argv[1];
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    if (strcmp(name, cmds[i].name) != 0)
      continue;
    if (help) {
      char *hargv[] = {argv[2], "--help", NULL};
      return finish(cmds[i].fn(2, hargv) == EX_HELP ? EX_OK : EX_USAGE);
    }
    int rc = cmds[i].fn(argc - 1, argv + 1);
    return finish(rc == EX_HELP ? EX_OK : rc);
  }
  /* What was maybe meant: a subcommand (rel, relase), or --version (version, -V). */
  const char *names[] = {"run", "ps", "release", "snapshot", "top", "sleep", "wake", "help"};
  const char *near = cmd_nearest(name, names, sizeof names / sizeof names[0]);
  char hint[96] = "";
  if (!strcmp(name, "version") || !strcmp(name, "-V") || !strcmp(name, "-v"))
    snprintf(hint, sizeof hint, " (did you mean gpureclaim --version?)");
  else if (near)
    snprintf(hint, sizeof hint, " (did you mean gpureclaim %s?)", near);
  char msg[160];
  snprintf(msg, sizeof msg, "unknown command: %.60s%s", name, hint);
  return cmd_usage_error("%s", msg);
}
