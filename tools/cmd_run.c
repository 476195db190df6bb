/*
 * cmd_run.c -- `gpureclaim run [options] [--] CMD ARGS...`: CMD with libgpureclaim.so preloaded. Options become
 * GPURECLAIM_* variables, checked with the library's own parsers so that a typo fails here, loudly, rather
 * than as a warning inside the program.
 */
#include "command.h"
#include "common.h"
#include "options.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef GR_INSTALL_LIBDIR
#define GR_INSTALL_LIBDIR "lib"
#endif

/* path with its directory made canonical but its file name kept: the soname link (libgpureclaim.so.0) rather
 * than the file it points to, so programs started after an upgrade get the new library; absolute, so a child
 * that changes directory still finds it. */
static bool canonical_dir(const char *path, char *out, size_t len) {
  char dir[PATH_MAX], real[PATH_MAX];
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
  if (!*name || !realpath(dir, real))
    return false;
  if ((size_t)snprintf(out, len, "%s/%s", strcmp(real, "/") ? real : "", name) >= len)
    return false;
  return access(out, R_OK) == 0;
}

/* GPURECLAIM_LIBRARY, else next to the command: the installed layout (<prefix>/bin and <prefix>/<libdir>) or
 * the build tree's (tools/ and src/). */
static bool find_library(char *out, size_t len) {
  const char *env = getenv("GPURECLAIM_LIBRARY");
  if (env && *env)
    return canonical_dir(env, out, len);
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return false;
  self[n] = '\0';
  *strrchr(self, '/') = '\0';
  static const char *const rel[] = {"../" GR_INSTALL_LIBDIR "/libgpureclaim.so.0", "../lib/libgpureclaim.so.0",
                                    "../lib64/libgpureclaim.so.0", "../src/libgpureclaim.so.0"};
  for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
    char cand[PATH_MAX + 64];
    snprintf(cand, sizeof cand, "%s/%s", self, rel[i]);
    if (canonical_dir(cand, out, len))
      return true;
  }
  return false;
}

/* Whether the file name of an LD_PRELOAD entry (entry[0..n), a path or a bare name) starts with prefix. */
static bool base_starts(const char *entry, size_t n, const char *prefix) {
  const char *base = entry;
  for (size_t i = 0; i < n; i++)
    if (entry[i] == '/')
      base = entry + i + 1;
  size_t k = strlen(prefix);
  return (size_t)(entry + n - base) >= k && !strncmp(base, prefix, k);
}

static bool is_sanitizer_runtime(const char *entry, size_t n) {
  static const char *const names[] = {"libasan", "libtsan", "libubsan", "liblsan", "libhwasan", "libclang_rt."};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (base_starts(entry, n, names[i]))
      return true;
  return false;
}

/* Whether an LD_PRELOAD entry is a libgpureclaim (any path, any version). */
static bool is_gpureclaim(const char *entry, size_t n) { return base_starts(entry, n, "libgpureclaim.so"); }

/* The new LD_PRELOAD: gpureclaim first, except after sanitizer runtimes, which insist on being first; the
 * entries already there are kept in order, except any libgpureclaim: nested runs do not stack, and a copy
 * preloaded by hand (another build, another version) would be a second copy in one process. */
static char *preload_list(const char *old, const char *lib) {
  size_t cap = strlen(old) + strlen(lib) + 2, used = 0;
  char *out = malloc(cap);
  if (!out)
    return NULL;
  out[0] = '\0';
  bool placed = false;
  for (const char *p = old;; ) {
    while (*p == ':' || *p == ' ')
      p++;
    size_t n = strcspn(p, ": ");
    if (n && is_gpureclaim(p, n)) { /* dropped (see above): it must not decide where lib goes either */
      p += n;
      continue;
    }
    if (!placed && (!n || !is_sanitizer_runtime(p, n))) {
      used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ":" : "", lib);
      placed = true;
    }
    if (!n)
      break;
    if (!(n == strlen(lib) && !strncmp(p, lib, n)))
      used += (size_t)snprintf(out + used, cap - used, "%s%.*s", used ? ":" : "", (int)n, p);
    p += n;
  }
  return out;
}

/* What a refused value lacks, and for an existing run directory that is not private, how to fix it. */
static const char *with_fix(const char *var, const char *value, const char *expected, char *buf, size_t len) {
  struct stat st;
  if (strcmp(var, "GPURECLAIM_RUNDIR") != 0 || value[0] != '/' || lstat(value, &st) != 0)
    return expected;
  char fix[300];
  cmd_rundir_fix(value, &st, fix, sizeof fix);
  snprintf(buf, len, "%s; %s", expected, fix);
  return buf;
}

/* Sets var to value after the library's own parser for var accepted it, and then check (if any). */
static int set_checked_by(const char *var, const char *value, int (*check)(const char *), const char *check_expected) {
  const char *expected = "";
  char fixed[600];
  if (gr_opt_check(var, value, &expected) != 0 ||
      (check && check(value) != 0 && (expected = with_fix(var, value, check_expected, fixed, sizeof fixed)))) {
    fprintf(stderr, "gpureclaim: run: bad value for %s: %s (expected %s)\n(see gpureclaim run --help)\n", var, value,
            expected);
    return EX_USAGE;
  }
  setenv(var, value, 1);
  return EX_OK;
}

/* 0 when the directory path would be created in (its parent; "." for a bare name) is a directory this user
 * can create files in, else -1. */
static int parent_dir_writable(const char *path) {
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", path);
  size_t n = strlen(parent);
  while (n > 1 && parent[n - 1] == '/')
    parent[--n] = '\0';
  char *slash = strrchr(parent, '/');
  if (!slash)
    snprintf(parent, sizeof parent, ".");
  else if (slash == parent)
    slash[1] = '\0';
  else
    *slash = '\0';
  struct stat st;
  return stat(parent, &st) == 0 && S_ISDIR(st.st_mode) && access(parent, W_OK | X_OK) == 0 ? 0 : -1;
}

/* The run directory as the library will judge it (report/rundir.c): absolute; if it exists, a directory of this user
 * open to nobody else; if not, one the library can create (its parent exists). Otherwise the program would
 * run with only a warning, and never appear in `gpureclaim ps`. */
static int chk_rundir(const char *v) {
  if (v[0] != '/')
    return -1;
  struct stat st;
  if (lstat(v, &st) == 0)
    return gr_dir_is_private(&st) ? 0 : -1;
  return errno == ENOENT ? parent_dir_writable(v) : -1;
}

/* The default run directory (GPURECLAIM_RUNDIR unset: $XDG_RUNTIME_DIR/gpureclaim or /tmp/gpureclaim-UID, as
 * gr_opt() resolves it with the program's environment) is judged as an explicit one is: the library would
 * refuse one open to others, with only a warning, and the program would never appear in `gpureclaim ps`. One
 * that does not exist yet is the library's to create; one the program never uses (no status file, or
 * gpureclaim disabled) is not checked. */
static int chk_default_rundir(void) {
  const char *env = getenv("GPURECLAIM_RUNDIR");
  if (env) /* checked as given (chk_environment(), or the option) */
    return EX_OK;
  const gr_options_t *o = gr_opt();
  struct stat st;
  if (o->disable || !o->status || lstat(o->rundir, &st) != 0 || chk_rundir(o->rundir) == 0)
    return EX_OK;
  char fix[300];
  cmd_rundir_fix(o->rundir, &st, fix, sizeof fix);
  fprintf(stderr, "gpureclaim: run: bad run directory %s (the default; GPURECLAIM_RUNDIR is not set): expected an "
                  "existing directory of yours with mode 0700 (owner uid %u, mode %04o); %s\n",
          o->rundir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), fix);
  return EX_USAGE;
}

/* Whether path starts with an ELF header: LD_PRELOAD of anything else fails in the dynamic loader with a
 * message that is easy to miss, and CMD would run without gpureclaim. */
static bool is_elf(const char *path) {
  /* Without blocking, and regular files only: a FIFO named here would otherwise wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  unsigned char m[4] = {0};
  bool ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read(fd, m, 4) == 4 && m[0] == 0x7f &&
            m[1] == 'E' && m[2] == 'L' && m[3] == 'F';
  if (fd >= 0)
    close(fd);
  return ok;
}

/* A log file the library can append to: an existing writable file, or a new one in a writable directory.
 * (stderr, and the empty value, mean standard error.) The library would otherwise only warn, at its first
 * release, and write to standard error. */
static int chk_log(const char *v) {
  if (!*v || gr_opt_log_is_stderr(v))
    return 0;
  struct stat st;
  if (stat(v, &st) == 0)
    return !S_ISDIR(st.st_mode) && access(v, W_OK) == 0 ? 0 : -1; /* a file, or a device such as /dev/null */
  return parent_dir_writable(v);
}

/* run's options, one per GR_OPTIONS row that has one (options.h). */
typedef struct {
  const char *var; /* GPURECLAIM_<ID> */
  char shortopt;   /* 0: none */
  const char *longopt;
  int how;         /* GR_RUN_VALUE, GR_RUN_FLAG, GR_RUN_OPTIONAL (GR_RUN_NONE: no option) */
  const char *set; /* the value FLAG sets, and OPTIONAL without one */
  const char *meta, *help;
} run_opt_t;
#define RUN_TUPLE_(shortopt, longopt, how, set, meta, help) shortopt, longopt, how, set, meta, help
#define RUN_ROW_(ID, field, kind, bound, def, expected, run) {"GPURECLAIM_" #ID, RUN_TUPLE_ run},
static const run_opt_t g_opts[] = {GR_OPTIONS(RUN_ROW_)};
#undef RUN_ROW_
#undef RUN_TUPLE_

/* What run checks beyond the library's own parser, by variable. */
static const struct {
  const char *var;
  int (*check)(const char *);
  const char *expected;
} g_checks[] = {{"GPURECLAIM_LOG", chk_log, "stderr, or a file you can write (in an existing directory)"},
                {"GPURECLAIM_RUNDIR", chk_rundir,
                 "an existing directory of yours with mode 0700, or a new one in an existing directory"}};

/* Sets var to value after the library's own parser and run's check of var (if any) accepted it. */
static int set_checked(const char *var, const char *value) {
  for (size_t k = 0; k < GR_ARRAY_LEN(g_checks); k++)
    if (!strcmp(var, g_checks[k].var))
      return set_checked_by(var, value, g_checks[k].check, g_checks[k].expected);
  return set_checked_by(var, value, NULL, NULL);
}

/* GPURECLAIM_* variables already in the environment reach the program too: every one the library reads is
 * checked as its option is, so that `GPURECLAIM_RUNDIR=/tmp gpureclaim run CMD` is refused as
 * `run --rundir /tmp CMD` is; and any other GPURECLAIM_ name but the command's own is refused as a
 * misspelling (GPURECLAIM_LEAK_REPORTS=1), which the library would ignore without a word. */
static int chk_environment(void) {
  for (char **e = environ; *e; e++) {
    const char *eq = strchr(*e, '=');
    char var[64];
    if (strncmp(*e, "GPURECLAIM_", 11) != 0)
      continue;
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    snprintf(var, sizeof var, "%.*s", (int)len, *e);
    const char *v = eq ? eq + 1 : "", *expected = "";
    char fixed[600];
    /* A name too long for var is no library variable: gr_opt_check() then says so as for any unknown one. */
    int rc = len < sizeof var ? gr_opt_check(var, v, &expected) : -ENOENT;
    if (rc == -ENOENT) {
      if (!strcmp(var, "GPURECLAIM_LIBRARY")) /* the command's own (find_library) */
        continue;
      /* The names either reads, for "did you mean". */
      const char *names[GR_ARRAY_LEN(g_opts) + 1];
      size_t nn = 0;
      for (size_t k = 0; k < GR_ARRAY_LEN(g_opts); k++)
        names[nn++] = g_opts[k].var;
      names[nn++] = "GPURECLAIM_LIBRARY";
      const char *near = len < sizeof var ? cmd_nearest(var, names, nn) : NULL;
      fprintf(stderr, "gpureclaim: run: unknown variable in the environment: %.*s (%s%s%sgpureclaim would ignore it; "
                      "gpureclaim run --help lists every variable)\n",
              (int)len, *e, near ? "did you mean " : "misspelt? ", near ? near : "", near ? "? " : "");
      return EX_USAGE;
    }
    for (size_t k = 0; rc == 0 && k < GR_ARRAY_LEN(g_checks); k++)
      if (!strcmp(var, g_checks[k].var) && g_checks[k].check(v) != 0) {
        expected = with_fix(var, v, g_checks[k].expected, fixed, sizeof fixed);
        rc = -EINVAL;
      }
    if (rc != 0) {
      fprintf(stderr, "gpureclaim: run: bad value in the environment: %s=%s (expected %s)\n", var, v, expected);
      return EX_USAGE;
    }
  }
  return EX_OK;
}

/* A relative GPURECLAIM_LOG is resolved by the library from the directory each process starts in: the program
 * starts here, but the programs it starts may start elsewhere. Made absolute here, where the user typed it. */
static void absolute_log(void) {
  const char *v = getenv("GPURECLAIM_LOG");
  char cwd[PATH_MAX], abs[2 * PATH_MAX + 2];
  if (!v || !*v || v[0] == '/' || gr_opt_log_is_stderr(v) || !getcwd(cwd, sizeof cwd))
    return;
  snprintf(abs, sizeof abs, "%s/%s", cwd, v);
  setenv("GPURECLAIM_LOG", abs, 1);
}

/* Whether the CUDA driver can be loaded here, as the program would load it (same environment): without it
 * a CUDA program fails in ways that do not say why (a framework's MemoryError, "no CUDA-capable device").
 * One line, before CMD starts, saying what to do: the simulator of a build tree when there is one next to
 * the command (tools/../sim), else the driver or LD_LIBRARY_PATH. CMD still runs: it may not need CUDA. */
static void check_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    return;
  }
  const char *err = dlerror();
  char self[PATH_MAX], sim[PATH_MAX + 32], real[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  bool have_sim = false;
  if (n > 0) {
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(sim, sizeof sim, "%s/../sim", self);
    char lib[PATH_MAX + 64];
    snprintf(lib, sizeof lib, "%s/libcuda.so.1", sim);
    have_sim = access(lib, R_OK) == 0 && realpath(sim, real);
  }
  if (have_sim)
    fprintf(stderr, "gpureclaim: run: no CUDA driver can be loaded (%s), so the program will find no GPU; without "
                    "an NVIDIA GPU, run it on gpureclaim's simulator: export LD_LIBRARY_PATH=%s\n",
            err ? err : "libcuda.so.1 not found", real);
  else
    fprintf(stderr, "gpureclaim: run: no CUDA driver can be loaded (%s), so the program will find no GPU: install "
                    "the NVIDIA driver, or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH\n",
            err ? err : "libcuda.so.1 not found");
}

/* run's spec, made once from g_opts: each option's help ends its first line with the variable it sets. */
static cmd_opt_t g_spec_opts[GR_ARRAY_LEN(g_opts) + 1];
static char g_spec_help[GR_ARRAY_LEN(g_opts)][400];
static char g_spec_tail[4096];
static cmd_spec_t g_spec = {
    .name = "run",
    .usage = "run [options] [--] CMD ARGS...",
    .summary = "run CMD with gpureclaim preloaded (prepended to LD_PRELOAD)",
    .text = "Runs CMD with libgpureclaim.so.0 prepended to LD_PRELOAD (after sanitizer runtimes; any other\n"
            "libgpureclaim there is dropped). Options set the GPURECLAIM_* variables; a bad value, given here or\n"
            "already in the environment, is refused before CMD starts. Options end at \"--\" or at CMD.\n",
    .opts = g_spec_opts,
    .tail = g_spec_tail,
    .in_order = true,
};

/* The option's val: its short letter, else 256 + its row. */
static int opt_val(size_t k) { return g_opts[k].shortopt ? g_opts[k].shortopt : 256 + (int)k; }

const cmd_spec_t *cmd_run_spec(void) {
  if (g_spec_opts[0].longopt)
    return &g_spec;
  size_t n = 0;
  for (size_t k = 0; k < GR_ARRAY_LEN(g_opts); k++) {
    const run_opt_t *o = &g_opts[k];
    if (o->how == GR_RUN_NONE)
      continue;
    char var[64];
    snprintf(var, sizeof var, "%s%s%s", o->var, o->how == GR_RUN_FLAG ? "=" : "", o->how == GR_RUN_FLAG ? o->set : "");
    size_t first = strcspn(o->help, "\n");
    snprintf(g_spec_help[n], sizeof g_spec_help[n], "%-55.*s %s%s", (int)first, o->help, var, o->help + first);
    g_spec_opts[n] = (cmd_opt_t){opt_val(k), o->shortopt, o->longopt,
                                 o->how == GR_RUN_VALUE ? CMD_ARG : o->how == GR_RUN_OPTIONAL ? CMD_OPTARG : CMD_NOARG,
                                 o->meta, g_spec_help[n]};
    n++;
  }
  /* Every variable either reads, the ones without an option too: the whole list in one place. */
  size_t t = (size_t)snprintf(g_spec_tail, sizeof g_spec_tail,
                              "Variables without an option of run (set them in the environment; gpureclaim(7) says more):\n");
#define RUN_HOW_(shortopt, longopt, how, set, meta, help) how
#define TAIL_ROW_(ID, field, kind, bound, def, expected, run)                                                          \
  if (RUN_HOW_ run == GR_RUN_NONE && t < sizeof g_spec_tail)                                                         \
    t += (size_t)snprintf(g_spec_tail + t, sizeof g_spec_tail - t, "  %-26s %s (default %s)\n", "GPURECLAIM_" #ID,      \
                          expected, def ? def : "none");
  GR_OPTIONS(TAIL_ROW_)
#undef TAIL_ROW_
#undef RUN_HOW_
  if (t < sizeof g_spec_tail)
    snprintf(g_spec_tail + t, sizeof g_spec_tail - t,
             "  %-26s the library run preloads (the command's own; default: the one installed beside it)\n"
             "\n"
             "The library is found next to the command (../LIBDIR/libgpureclaim.so.0, or src/ in a build tree), or\n"
             "set GPURECLAIM_LIBRARY. When no CUDA driver (libcuda.so.1) can be loaded, run says so before CMD\n"
             "starts. A GPURECLAIM_ variable that neither reads is refused as a misspelling.\n",
             "GPURECLAIM_LIBRARY");
  return &g_spec;
}

int cmd_run(int argc, char **argv) {
  const cmd_spec_t *spec = cmd_run_spec();
  const run_opt_t *bare = NULL; /* the last option, when it takes a value only after "=" and was given none */
  optind = 1;
  int c;
  /* In order: options end at the program (whose own options follow it). */
  while ((c = cmd_getopt(argc, argv, spec)) != -1) {
    if (c == -2)
      return EX_USAGE;
    if (c == 'h')
      return cmd_help(spec);
    size_t k = 0;
    while (k < GR_ARRAY_LEN(g_opts) && !(g_opts[k].how != GR_RUN_NONE && opt_val(k) == c))
      k++;
    if (k == GR_ARRAY_LEN(g_opts))
      return cmd_usage_error("run: unknown option: %s", argv[optind - 1]);
    const run_opt_t *o = &g_opts[k];
    bare = o->how == GR_RUN_OPTIONAL && !optarg ? o : NULL;
    int rc = EX_OK;
    if (o->how == GR_RUN_VALUE && !strcmp(optarg, "--")) /* the end of run's options, not a value */
      return cmd_usage_error("run: --%s needs a value", o->longopt);
    if (o->how == GR_RUN_FLAG || (o->how == GR_RUN_OPTIONAL && !optarg))
      setenv(o->var, o->set, 1);
    else
      rc = set_checked(o->var, optarg);
    if (rc != EX_OK)
      return rc;
  }
  int i = optind;
  if (i >= argc)
    return cmd_usage_error("run: give the program to run (gpureclaim run [options] -- CMD ARGS...)%s", "");
  /* `run --verbose 2 CMD` would run a program named 2: surely a level meant as --verbose=2. A program named so
   * runs after "--". */
  if (bare && strcmp(argv[i - 1], "--") != 0 && argv[i][0] && strspn(argv[i], "0123456789") == strlen(argv[i])) {
    fprintf(stderr, "gpureclaim: run: --%s takes its value after \"=\": give --%s=%s (as written, %s would be run "
                    "as the program; put -- before a program of that name)\n(see gpureclaim run --help)\n",
            bare->longopt, bare->longopt, argv[i], argv[i]);
    return EX_USAGE;
  }
  int env_rc = chk_environment();
  if (env_rc == EX_OK)
    env_rc = chk_default_rundir();
  if (env_rc != EX_OK)
    return env_rc;
  absolute_log();
  char lib[PATH_MAX];
  if (!find_library(lib, sizeof lib)) {
    const char *env = getenv("GPURECLAIM_LIBRARY");
    if (env && *env)
      fprintf(stderr, "gpureclaim: GPURECLAIM_LIBRARY=%s: cannot read it\n", env);
    else
      fprintf(stderr, "gpureclaim: cannot find libgpureclaim.so.0 next to this command (in ../%s); "
                      "set GPURECLAIM_LIBRARY\n", GR_INSTALL_LIBDIR);
    return EX_FAILED;
  }
  if (!is_elf(lib)) {
    fprintf(stderr, "gpureclaim: %s is not a shared library (no ELF header)%s\n", lib,
            getenv("GPURECLAIM_LIBRARY") && *getenv("GPURECLAIM_LIBRARY") ? " (from GPURECLAIM_LIBRARY)" : "");
    return EX_FAILED;
  }
  check_driver();
  const char *old = getenv("LD_PRELOAD");
  char *pre = preload_list(old ? old : "", lib);
  if (!pre)
    return EX_FAILED;
  setenv("LD_PRELOAD", pre, 1);
  free(pre);
  execvp(argv[i], &argv[i]);
  int e = errno;
  fprintf(stderr, "gpureclaim: cannot run %s: %s\n", argv[i], strerror(e));
  return e == ENOENT ? 127 : 126;
}
