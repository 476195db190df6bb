/*
 * options.c -- the parsers and the table of GPURECLAIM_* options, made from options.h's list.
 *
 * Every option has a name, a default and a parser (by its kind). Values are read once, on first use, straight
 * from environ (no getenv, no allocation: this can run inside a preloaded library's early calls). A malformed
 * value gets one warning naming the variable and the value, and the default is used: a typo never crashes a
 * program.
 */
#include "options.h"
#include "names.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

extern char **environ;

static const char *env_get(const char *name) {
  size_t n = strlen(name);
  for (char **e = environ; e && *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
      return *e + n + 1;
  return NULL;
}

static bool streq_ci(const char *a, const char *b) {
  for (; *a && *b; a++, b++) {
    char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a;
    char y = *b >= 'A' && *b <= 'Z' ? (char)(*b + 32) : *b;
    if (x != y)
      return false;
  }
  return *a == *b;
}

int gr_opt_parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"1", "yes", "on", "true"}, *const no[] = {"0", "no", "off", "false"};
  for (size_t i = 0; i < 4; i++) {
    if (streq_ci(s, yes[i])) {
      *out = true;
      return 0;
    }
    if (streq_ci(s, no[i])) {
      *out = false;
      return 0;
    }
  }
  return -EINVAL;
}

int gr_opt_parse_uint(const char *s, unsigned long long max, unsigned long long *out) {
  if (!s || !*s)
    return -EINVAL;
  unsigned long long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -EINVAL;
    if ((unsigned long long)(*p - '0') > max || v > (max - (unsigned long long)(*p - '0')) / 10)
      return -EINVAL;
    v = v * 10 + (unsigned long long)(*p - '0');
  }
  *out = v;
  return 0;
}

int gr_opt_parse_signal(const char *s, int *out) {
  if (streq_ci(s, "off") || streq_ci(s, "none") || streq_ci(s, "0")) {
    *out = 0;
    return 0;
  }
  if ((s[0] == 'S' || s[0] == 's') && (s[1] == 'I' || s[1] == 'i') && (s[2] == 'G' || s[2] == 'g'))
    s += 3;
  if (streq_ci(s, "USR1")) {
    *out = SIGUSR1;
    return 0;
  }
  if (streq_ci(s, "USR2")) {
    *out = SIGUSR2;
    return 0;
  }
  if (strncasecmp(s, "RTMIN", 5) == 0) {
    unsigned long long n = 0;
    if (s[5] == '\0')
      n = 0;
    else if (s[5] != '+' || gr_opt_parse_uint(s + 6, 1000, &n) != 0)
      return -EINVAL;
    if (SIGRTMIN + (int)n > SIGRTMAX)
      return -EINVAL;
    *out = SIGRTMIN + (int)n;
    return 0;
  }
  return -EINVAL;
}

const char *gr_opt_signal_name(int sig, char *buf, size_t len) {
  if (sig == 0)
    snprintf(buf, len, "off");
  else if (sig == SIGUSR1)
    snprintf(buf, len, "USR1");
  else if (sig == SIGUSR2)
    snprintf(buf, len, "USR2");
  else if (sig >= SIGRTMIN && sig <= SIGRTMAX)
    snprintf(buf, len, sig == SIGRTMIN ? "RTMIN" : "RTMIN+%d", sig - SIGRTMIN);
  else
    snprintf(buf, len, "%d", sig);
  return buf;
}

/* A comma-separated list of words (any case, each at most 15 characters, no empty one, no trailing comma), each
 * naming bits in words[]: their union in *out. */
typedef struct {
  const char *word;
  unsigned bits;
} word_t;
static int parse_words(const char *s, const word_t *words, size_t nwords, unsigned *out) {
  unsigned v = 0;
  const char *p = s;
  if (!*p)
    return -EINVAL;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p), i = 0;
    char word[16];
    if (n == 0 || n >= sizeof word)
      return -EINVAL;
    memcpy(word, p, n);
    word[n] = '\0';
    while (i < nwords && !streq_ci(word, words[i].word))
      i++;
    if (i == nwords)
      return -EINVAL;
    v |= words[i].bits;
    p += n;
    if (*p == ',')
      p++;
    if (end && !*p)
      return -EINVAL; /* trailing comma */
  }
  *out = v;
  return 0;
}

int gr_opt_parse_what(const char *s, unsigned *out) {
#define WORD_(bits, name) {name, bits},
  static const word_t w[] = {GR_WHATS(WORD_) GR_WHAT_ALIASES(WORD_)};
#undef WORD_
  return parse_words(s, w, GR_ARRAY_LEN(w), out);
}

int gr_opt_parse_peers(const char *s, unsigned *out) {
  if (streq_ci(s, "off") || streq_ci(s, "none") || streq_ci(s, "0")) {
    *out = 0;
    return 0;
  }
  static const word_t w[] = {{"ask", GR_PEERS_ASK}, {"give", GR_PEERS_GIVE}, {"sleep", GR_PEERS_SLEEP}};
  return parse_words(s, w, GR_ARRAY_LEN(w), out);
}

int gr_opt_parse_seconds_ms(const char *s, unsigned *out) {
  unsigned long long whole = 0, frac = 0;
  const char *dot = strchr(s, '.');
  char ip[8];
  size_t n = dot ? (size_t)(dot - s) : strlen(s);
  if (n == 0 || n >= sizeof ip)
    return -EINVAL;
  memcpy(ip, s, n);
  ip[n] = '\0';
  if (gr_opt_parse_uint(ip, 60, &whole) != 0)
    return -EINVAL;
  if (dot) {
    size_t f = strlen(dot + 1);
    if (f == 0 || f > 3 || gr_opt_parse_uint(dot + 1, 999, &frac) != 0)
      return -EINVAL;
    for (; f < 3; f++)
      frac *= 10;
  }
  unsigned long long ms = whole * 1000 + frac;
  if (ms == 0 || ms > 60000)
    return -EINVAL;
  *out = (unsigned)ms;
  return 0;
}

int gr_opt_parse_size(const char *s, uint64_t *out) {
  char num[24];
  size_t n = strspn(s, "0123456789");
  if (n == 0 || n >= sizeof num)
    return -EINVAL;
  memcpy(num, s, n);
  num[n] = '\0';
  const char *suf = s + n;
  unsigned shift = 0;
  if (*suf) {
    static const char units[] = "KMGT";
    const char *u = strchr(units, suf[0] >= 'a' && suf[0] <= 'z' ? suf[0] - 32 : suf[0]);
    if (!u || !*u)
      return -EINVAL;
    shift = 10u * (unsigned)(u - units + 1);
    suf++;
    if (!streq_ci(suf, "") && !streq_ci(suf, "ib") && !streq_ci(suf, "b"))
      return -EINVAL;
  }
  unsigned long long v;
  if (gr_opt_parse_uint(num, (1ull << 60) >> shift, &v) != 0)
    return -EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

const char *gr_opt_what_name(unsigned what, char *buf, size_t len) {
  size_t n = 0;
  if (len)
    buf[0] = '\0';
#define NAME_(bits, name)         \
  if ((what & (bits)) && n < len) \
    n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "," : "", name);
  GR_WHATS(NAME_)
#undef NAME_
  return buf;
}

/* ---- the table ---- */

/* The parsers by kind (options.h): value v into *dst, 0 or -EINVAL (*dst then as it was, or half-written: the
 * caller parses into a copy). bound: the largest whole number (uint, level); o: the whole set, for the members
 * a kind writes besides its own (log_stderr, on_signal_sleep). */
static int parse_yesno(const char *v, bool *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  return gr_opt_parse_bool(v, dst);
}
static int parse_uint(const char *v, unsigned *dst, unsigned long long bound, gr_options_t *o) {
  unsigned long long n;
  (void)o;
  int rc = gr_opt_parse_uint(v, bound, &n);
  if (rc == 0)
    *dst = (unsigned)n;
  return rc;
}
static int parse_level(const char *v, int *dst, unsigned long long bound, gr_options_t *o) {
  unsigned long long n;
  (void)o;
  int rc = gr_opt_parse_uint(v, bound, &n);
  if (rc == 0)
    *dst = (int)n;
  return rc;
}
static int parse_signal(const char *v, int *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  return gr_opt_parse_signal(v, dst);
}
static int parse_what(const char *v, unsigned *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound;
  if (streq_ci(v, "sleep")) {
    o->on_signal_sleep = true;
    return 0;
  }
  o->on_signal_sleep = false;
  return gr_opt_parse_what(v, dst);
}
static int parse_autobool(const char *v, int *dst, unsigned long long bound, gr_options_t *o) {
  bool b;
  (void)bound, (void)o;
  if (streq_ci(v, "auto")) {
    *dst = -1;
    return 0;
  }
  if (gr_opt_parse_bool(v, &b) != 0)
    return -EINVAL;
  *dst = b ? 1 : 0;
  return 0;
}
static int p_path(const char *v, char *dst, size_t len) {
  size_t n = strlen(v);
  if (n == 0 || n >= len)
    return -EINVAL;
  memcpy(dst, v, n + 1);
  return 0;
}
bool gr_opt_log_is_stderr(const char *s) { return streq_ci(s, "stderr") || !strcmp(s, "-"); }

/* The directory the process started in, for a relative GPURECLAIM_LOG: options are read when the process first
 * uses CUDA, and by then it may have changed directory; the log would then land wherever it happened to be. */
static char g_start_dir[4096];

void gr_opt_note_start_dir(void) {
  const char *v = env_get("GPURECLAIM_LOG");
  if (v && *v && v[0] != '/' && !gr_opt_log_is_stderr(v) && !getcwd(g_start_dir, sizeof g_start_dir))
    g_start_dir[0] = '\0';
}

static int parse_log(const char *v, gr_opt_path_t *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound;
  if (gr_opt_log_is_stderr(v)) {
    (*dst)[0] = '\0';
    o->log_stderr = true;
    return 0;
  }
  o->log_stderr = false;
  if (v[0] == '/' || !*v)
    return p_path(v, *dst, sizeof *dst);
  char cwd[4096];
  const char *dir = g_start_dir[0] ? g_start_dir : getcwd(cwd, sizeof cwd);
  if (!dir)
    return -EINVAL; /* no directory to resolve it in: a warning, and stderr */
  int n = snprintf(*dst, sizeof *dst, "%s/%s", strcmp(dir, "/") ? dir : "", v);
  return n > 0 && (size_t)n < sizeof *dst ? 0 : -EINVAL;
}
static int parse_dir(const char *v, gr_opt_path_t *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  if (v[0] != '/')
    return -EINVAL; /* relative run directories would depend on each process's cwd */
  return p_path(v, *dst, sizeof *dst);
}
static int parse_peers(const char *v, unsigned *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  return gr_opt_parse_peers(v, dst);
}
static int parse_seconds(const char *v, unsigned *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  return gr_opt_parse_seconds_ms(v, dst);
}

static int parse_size(const char *v, uint64_t *dst, unsigned long long bound, gr_options_t *o) {
  (void)bound, (void)o;
  return gr_opt_parse_size(v, dst);
}

/* One parser per option, and the table. */
typedef int (*parse_fn)(const char *value, gr_options_t *o);
#define PARSER_(ID, field, kind, bound, ...) \
  static int p_##ID(const char *v, gr_options_t *o) { return parse_##kind(v, &o->field, bound, o); }
GR_OPTIONS(PARSER_)
#undef PARSER_

static const struct {
  const char *name;
  const char *def;      /* the default, as written (NULL: none, or computed) */
  const char *expected; /* for the warning */
  parse_fn parse;
} g_table[] = {
#define ROW_(ID, field, kind, bound, def, expected, run) {"GPURECLAIM_" #ID, def, expected, p_##ID},
    GR_OPTIONS(ROW_)
#undef ROW_
};

const char *gr_opt_default(const char *name) {
  for (size_t i = 0; i < GR_ARRAY_LEN(g_table); i++)
    if (!strcmp(g_table[i].name, name))
      return g_table[i].def;
  return NULL;
}

int gr_opt_check(const char *name, const char *value, const char **expected) {
  for (size_t i = 0; i < GR_ARRAY_LEN(g_table); i++)
    if (!strcmp(g_table[i].name, name)) {
      gr_options_t trial;
      memset(&trial, 0, sizeof trial);
      *expected = g_table[i].expected;
      return g_table[i].parse(value, &trial) == 0 ? 0 : -EINVAL;
    }
  *expected = "a GPURECLAIM_* variable";
  return -ENOENT;
}

static void defaults(gr_options_t *o) {
  memset(o, 0, sizeof *o);
  for (size_t i = 0; i < GR_ARRAY_LEN(g_table); i++)
    if (g_table[i].def && g_table[i].parse(g_table[i].def, o) != 0)
      GR_ASSERT(!"a default its own parser refuses"); /* tests/unit/test_options.c parses each */
  /* XDG_RUNTIME_DIR only when it is this (effective) user's: a root process run with a user's environment
   * (sudo -E) would otherwise make a root-owned run directory inside the user's, which the user's processes
   * and commands then refuse, and cannot remove. Ownership is checked against the effective uid, as the run
   * directory's is, and the fallback is named by it. */
  const char *xdg = env_get("XDG_RUNTIME_DIR");
  struct stat st;
  if (xdg && xdg[0] == '/' && strlen(xdg) + sizeof "/gpureclaim" < sizeof o->rundir && stat(xdg, &st) == 0 &&
      st.st_uid == geteuid())
    snprintf(o->rundir, sizeof o->rundir, "%s/gpureclaim", xdg);
  else
    snprintf(o->rundir, sizeof o->rundir, "/tmp/gpureclaim-%u", (unsigned)geteuid());
}

gr_options_t gr_opt_values;
_Atomic int gr_opt_loaded; /* 0 no, 1 loading, 2 loaded */

static void load(void) {
  bool rundir_refused = false;
  gr_options_t o;
  defaults(&o);
  for (size_t i = 0; i < GR_ARRAY_LEN(g_table); i++) {
    const char *v = env_get(g_table[i].name);
    if (!v)
      continue;
    gr_options_t trial = o;
    if (g_table[i].parse(v, &trial) == 0)
      o = trial;
    else if (g_table[i].parse == p_RUNDIR)
      rundir_refused = true; /* below, once GPURECLAIM_STATUS is read too */
    else
      gr_warn("%s=\"%.200s\" is not valid (expected %s); using the default", g_table[i].name, v,
              g_table[i].expected);
  }
  /* A run directory given but refused is not replaced by the default: the user meant another directory (one
   * per job, say), and the default one may hold other jobs' files. No status file and no socket, then. */
  if (rundir_refused) {
    gr_warn("GPURECLAIM_RUNDIR=\"%.200s\" is not valid (expected an absolute directory path); refusing it: no "
            "status file and no control socket (the default directory is not used instead), so the gpureclaim "
            "command cannot list this process; its release signal still works",
            env_get("GPURECLAIM_RUNDIR"));
    o.rundir[0] = '\0';
    o.status = false;
  }
  gr_opt_values = o;
  atomic_store_explicit(&gr_opt_backtrace_hot, o.backtrace ? 2 : 1, memory_order_relaxed);
}

_Atomic unsigned char gr_opt_backtrace_hot;

const gr_options_t *gr_opt_load(void) {
  int expected = 0;
  if (atomic_compare_exchange_strong_explicit(&gr_opt_loaded, &expected, 1, memory_order_acq_rel,
                                              memory_order_acquire)) {
    load();
    atomic_store_explicit(&gr_opt_loaded, 2, memory_order_release);
  } else {
    while (atomic_load_explicit(&gr_opt_loaded, memory_order_acquire) != 2)
      sched_yield(); /* another thread parses (microseconds, once per process) */
  }
  return &gr_opt_values;
}

bool gr_opt_disabled_early(void) {
  const char *v = env_get("GPURECLAIM_DISABLE");
  bool b = false;
  return v && gr_opt_parse_bool(v, &b) == 0 && b;
}

void gr_opt_reload(void) {
  load();
  atomic_store_explicit(&gr_opt_loaded, 2, memory_order_release);
}
