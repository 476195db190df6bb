/*
 * help.c -- the subcommands' options, each written once (command.h's cmd_spec_t): getopt_long's tables, each
 * subcommand's --help, `gpureclaim --help`, and the usage errors that name the subcommand, the option, and what
 * was maybe meant. tests/cli/test_cli_docs.py checks the manual, README's table of commands and the shell
 * completions against the --help this prints.
 */
#include "command.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_STATUSES                                                                                          \
  "Exit status:\n"                                                                                              \
  "  0  success (a process asleep has nothing on the device to release: success too)\n"                        \
  "  1  a process did not answer in time or refused the request, the run directory was refused,\n"             \
  "     a file or standard output could not be written, or run could not find the library\n"                    \
  "  2  bad usage (GPURECLAIM_RUNDIR not an absolute path included)\n"                                           \
  "  3  no such process, another user's process, or a process not running gpureclaim\n"                         \
  "     (release: also a process that exited before its release was seen)\n"                                    \
  "  run: the exit status of CMD; 126 when it cannot be executed, 127 when it is not found\n"

/* The subcommand being run, for "(see gpureclaim CMD --help)". */
static const char *g_sub;

static const cmd_opt_t g_help_opt = {'h', 'h', "help", CMD_NOARG, NULL, "this help"};

int cmd_usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "gpureclaim: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(see gpureclaim%s%s --help)\n", g_sub ? " " : "", g_sub ? g_sub : "");
  return EX_USAGE;
}

static size_t nopts(const cmd_spec_t *spec) {
  size_t n = 0;
  while (spec->opts && spec->opts[n].longopt)
    n++;
  return n;
}

/* The i-th option of spec, -h/--help last. */
static const cmd_opt_t *opt_at(const cmd_spec_t *spec, size_t i) { return i < nopts(spec) ? &spec->opts[i] : &g_help_opt; }

/* "-i, --gpu GPUS", "    --json", "-v, --verbose[=N]" */
static void opt_name(const cmd_opt_t *o, char *buf, size_t len) {
  snprintf(buf, len, "%c%c%c --%s%s%s%s", o->shortopt ? '-' : ' ', o->shortopt ? o->shortopt : ' ',
           o->shortopt ? ',' : ' ', o->longopt, o->has_arg == CMD_ARG ? " " : o->has_arg == CMD_OPTARG ? "[=" : "",
           o->has_arg != CMD_NOARG && o->arg ? o->arg : "", o->has_arg == CMD_OPTARG ? "]" : "");
}

int cmd_help(const cmd_spec_t *spec) {
  const char *u = spec->usage;
  for (int first = 1; *u; first = 0) {
    size_t n = strcspn(u, "\n");
    printf("%sgpureclaim %.*s\n", first ? "usage: " : "       ", (int)n, u);
    u += n + (u[n] == '\n');
  }
  if (spec->text && *spec->text)
    printf("%s", spec->text);
  putchar('\n');
  for (size_t i = 0; i <= nopts(spec); i++) {
    const cmd_opt_t *o = opt_at(spec, i);
    char name[96];
    opt_name(o, name, sizeof name);
    const char *h = o->help;
    size_t n = strcspn(h, "\n");
    if (strlen(name) <= 22)
      printf("  %-22s %.*s\n", name, (int)n, h);
    else
      printf("  %s\n  %-22s %.*s\n", name, "", (int)n, h);
    for (h += n; *h; h += n) {
      h++;
      n = strcspn(h, "\n");
      printf("  %-22s %.*s\n", "", (int)n, h);
    }
  }
  if (spec->tail && *spec->tail)
    printf("\n%s", spec->tail);
  fputs("\n" EXIT_STATUSES, stdout);
  return EX_HELP;
}

/* The specs in the order of `gpureclaim --help`. */
static const cmd_spec_t *spec_at(size_t i) {
  const cmd_spec_t *all[] = {cmd_run_spec(), &cmd_ps_spec,    &cmd_top_spec,  &cmd_release_spec,
                             &cmd_snapshot_spec, &cmd_sleep_spec, &cmd_wake_spec};
  return i < sizeof all / sizeof all[0] ? all[i] : NULL;
}

void cmd_print_usage(FILE *f) {
  fputs("usage: gpureclaim COMMAND [options]       (gpureclaim COMMAND --help: that command's options)\n\n", f);
  for (size_t s = 0; spec_at(s); s++) {
    const cmd_spec_t *spec = spec_at(s);
    fprintf(f, "  %.*s\n      %s\n", (int)strcspn(spec->usage, "\n"), spec->usage, spec->summary);
    /* Every option, short and long, wrapped at 110 columns. */
    char line[256] = "     ";
    for (size_t i = 0; i < nopts(spec); i++) {
      const cmd_opt_t *o = &spec->opts[i];
      char item[96];
      snprintf(item, sizeof item, " %s%s%s--%s%s%s%s%s", o->shortopt ? "-" : "", o->shortopt ? (char[2]){o->shortopt, 0} : "",
               o->shortopt ? "/" : "", o->longopt, o->has_arg == CMD_ARG ? " " : o->has_arg == CMD_OPTARG ? "[=" : "",
               o->has_arg != CMD_NOARG && o->arg ? o->arg : "", o->has_arg == CMD_OPTARG ? "]" : "",
               i + 1 < nopts(spec) ? "," : "");
      if (strlen(line) + strlen(item) > 110) {
        fprintf(f, "%s\n", line);
        snprintf(line, sizeof line, "     ");
      }
      strncat(line, item, sizeof line - strlen(line) - 1);
    }
    if (nopts(spec))
      fprintf(f, "%s\n", line);
  }
  fputs("  help COMMAND, COMMAND --help     that command's options;   --help, --version\n"
        "\n"
        "Processes are found through status files in run directories: GPURECLAIM_RUNDIR (an absolute path: that\n"
        "one only), else $XDG_RUNTIME_DIR/gpureclaim (when that directory is yours), else /tmp/gpureclaim-UID, and\n"
        "the run directory of every process of yours running gpureclaim that was started elsewhere (cron, Slurm,\n"
        "nohup, su, systemd). A directory must be yours with mode 0700, else it is refused. Only your own\n"
        "processes are ever read or signalled. GPUs are numbered as nvidia-smi numbers them (through NVML).\n"
        "Memory is shown in KiB/MiB/GiB (1024).\n"
        "\n" EXIT_STATUSES,
        f);
}

/* Levenshtein distance, at most 64 characters a word (longer: INT_MAX). */
static int distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64)
    return INT_MAX;
  int row[65];
  for (size_t j = 0; j <= lb; j++)
    row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[lb];
}

const char *cmd_nearest(const char *word, const char *const *cands, size_t n) {
  const char *best = NULL;
  size_t wl = strlen(word), prefixed = 0;
  for (size_t i = 0; i < n && wl >= 2; i++) /* a prefix of exactly one candidate: "rel" */
    if (!strncmp(cands[i], word, wl)) {
      best = cands[i];
      prefixed++;
    }
  if (prefixed == 1)
    return best;
  best = NULL;
  int bd = INT_MAX;
  for (size_t i = 0; i < n; i++) {
    int d = distance(word, cands[i]);
    if (d < bd) {
      bd = d;
      best = cands[i];
    }
  }
  /* Close enough to be a typo: one edit for short words, about one in four for longer ones. */
  int allowed = wl <= 4 ? 1 : (int)(wl + 3) / 4;
  return bd <= allowed ? best : NULL;
}

/* What an unknown option was maybe meant as: a long option of spec whose name is close, or for an unknown
 * short option -X, the long option of spec that starts with X (ps -s: -S/--sort). */
static void meant(const cmd_spec_t *spec, const char *arg, int shortopt, char *buf, size_t len) {
  buf[0] = '\0';
  const cmd_opt_t *hit = NULL;
  size_t n = nopts(spec), found = 0;
  if (shortopt) {
    for (size_t i = 0; i < n; i++)
      if (spec->opts[i].longopt[0] == shortopt) {
        hit = &spec->opts[i];
        found++;
      }
    if (found != 1)
      hit = NULL;
  } else {
    const char *names[64];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 64; i++)
      names[k++] = spec->opts[i].longopt;
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    const char *near = cmd_nearest(word, names, k);
    for (size_t i = 0; near && i < n; i++)
      if (spec->opts[i].longopt == near)
        hit = &spec->opts[i];
  }
  if (hit)
    snprintf(buf, len, " (did you mean %s%s%s--%s?)", hit->shortopt ? "-" : "", hit->shortopt ? (char[2]){hit->shortopt, 0} : "",
             hit->shortopt ? " or " : "", hit->longopt);
}

int cmd_getopt(int argc, char **argv, const cmd_spec_t *spec) {
  g_sub = spec->name;
  struct option longs[66];
  char shorts[3 * 66 + 4];
  size_t nl = 0, ns = 0;
  if (spec->in_order)
    shorts[ns++] = '+';
  shorts[ns++] = ':';
  for (size_t i = 0; i <= nopts(spec) && nl < 65; i++) {
    const cmd_opt_t *o = opt_at(spec, i);
    int has = o->has_arg == CMD_ARG ? required_argument : o->has_arg == CMD_OPTARG ? optional_argument : no_argument;
    longs[nl++] = (struct option){o->longopt, has, NULL, o->val};
    if (o->shortopt) { /* a short option's optional value would be glued to it (-v2): it takes none */
      shorts[ns++] = o->shortopt;
      if (o->has_arg == CMD_ARG)
        shorts[ns++] = ':';
    }
  }
  longs[nl] = (struct option){NULL, 0, NULL, 0};
  shorts[ns] = '\0';
  opterr = 0; /* the messages are ours: they name the subcommand, and the exit status is 2 */
  int c = getopt_long(argc, argv, shorts, longs, NULL);
  if (c != '?' && c != ':')
    return c;
  /* optopt: the short option, or the long option's val; 0 for a long option not known (or ambiguous). */
  const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
  bool is_long = arg[0] == '-' && arg[1] == '-';
  char name[64], hint[128] = "";
  if (optopt && !is_long) { /* a short option, maybe in a cluster (-jx) */
    snprintf(name, sizeof name, "-%c", optopt);
  } else {
    size_t n = strcspn(arg, "=");
    snprintf(name, sizeof name, "%.*s", (int)(n < 60 ? n : 60), arg);
  }
  char msg[300];
  if (c == ':') {
    snprintf(msg, sizeof msg, "%s: %s needs a value", spec->name, name);
  } else if (optopt && strchr(arg, '=') && is_long) {
    snprintf(msg, sizeof msg, "%s: %s takes no value", spec->name, name);
  } else {
    meant(spec, arg, is_long ? 0 : optopt, hint, sizeof hint);
    snprintf(msg, sizeof msg, "%s: unknown option: %s%s", spec->name, name, hint);
  }
  cmd_usage_error("%s", msg);
  return -2;
}
