/* Every GPURECLAIM_* option given random and malformed values: the program runs on, tracking as before, and a
 * malformed value gets one clear warning naming the variable and the value. */
#include "../common/rng.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct {
  int status;
  char out[4096], err[16384];
} run_t;

static void slurp(int fd, char *buf, size_t len) {
  size_t n = 0;
  ssize_t r;
  while (n < len - 1 && (r = read(fd, buf + n, len - 1 - n)) > 0)
    n += (size_t)r;
  buf[n] = '\0';
}

/* Runs opt_probe with one extra variable (NULL value: unset). */
static void run_probe(const char *name, const char *value, run_t *r) {
  int out[2], err[2];
  cr_assert_eq(pipe(out), 0);
  cr_assert_eq(pipe(err), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    if (chdir(getenv("OPT_PROBE_DIR")) != 0)
      _exit(90);
    if (value)
      setenv(name, value, 1);
    execl(getenv("OPT_PROBE"), "opt_probe", (char *)NULL);
    _exit(91);
  }
  close(out[1]);
  close(err[1]);
  slurp(out[0], r->out, sizeof r->out);
  slurp(err[0], r->err, sizeof r->err);
  close(out[0]);
  close(err[0]);
  waitpid(pid, &r->status, 0);
}

static const char *const g_options[] = {"GPURECLAIM_DISABLE", "GPURECLAIM_SIGNAL", "GPURECLAIM_ON_SIGNAL",
                                        "GPURECLAIM_OOM_RETRY", "GPURECLAIM_LOG", "GPURECLAIM_RUNDIR",
                                        "GPURECLAIM_LEAK_REPORT", "GPURECLAIM_BACKTRACE", "GPURECLAIM_PYTHON",
                                        "GPURECLAIM_STATUS", "GPURECLAIM_VERBOSE", "GPURECLAIM_PEERS",
                                        "GPURECLAIM_PEER_TIMEOUT", "GPURECLAIM_SLEEP", "GPURECLAIM_WAKE_TIMEOUT",
                                        "GPURECLAIM_SLEEP_IDLE", "GPURECLAIM_SLEEP_MIN_AWAKE", "GPURECLAIM_WAIT",
                                        "GPURECLAIM_GUARANTEE"};

static const char *const g_malformed[] = {"", "maybe", "2x", "-1", "99999999999999999999999", "1,", ",",
                                          "cached,,all", "RTMIN+999", "USR3", "SIG", "yes please", "\t",
                                          "relative/dir", "on\n", "0x10", "3", "17", "ask,", "give,,ask", "0.0001",
                                          "61", "60.001", "1.", ".5", "ask give"};

/* Whether a value is valid for an option (mirrors the documented syntax). */
static bool valid(const char *opt, const char *v) {
  static const char *const bools[] = {"1", "0", "yes", "no", "on", "off", "true", "false"};
  if (!strcmp(opt, "GPURECLAIM_LOG")) /* a path of up to 4095 bytes, or stderr */
    return v[0] != '\0' && strlen(v) < 4096;
  if (!strcmp(opt, "GPURECLAIM_RUNDIR")) /* an absolute path of up to 4095 bytes */
    return v[0] == '/' && strlen(v) < 4096;
  if (!strcmp(opt, "GPURECLAIM_SIGNAL"))
    return !strcasecmp(v, "off") || !strcasecmp(v, "USR1") || !strcasecmp(v, "USR2") || !strcasecmp(v, "0");
  if (!strcmp(opt, "GPURECLAIM_ON_SIGNAL"))
    return !strcmp(v, "cached") || !strcmp(v, "orphaned") || !strcmp(v, "all");
  if (!strcmp(opt, "GPURECLAIM_OOM_RETRY"))
    return strspn(v, "0123456789") == strlen(v) && *v && strlen(v) < 3 && atoi(v) <= 16;
  if (!strcmp(opt, "GPURECLAIM_PEERS")) { /* ask, give, comma-separated (any case), or off/none/0 */
    if (!strcasecmp(v, "off") || !strcasecmp(v, "none") || !strcmp(v, "0"))
      return true;
    char buf[64];
    if (!*v || strlen(v) >= sizeof buf)
      return false;
    strcpy(buf, v);
    if (buf[strlen(buf) - 1] == ',' || buf[0] == ',' || strstr(buf, ",,"))
      return false;
    for (char *w = strtok(buf, ","); w; w = strtok(NULL, ","))
      if (strcasecmp(w, "ask") && strcasecmp(w, "give"))
        return false;
    return true;
  }
  if (!strcmp(opt, "GPURECLAIM_PEER_TIMEOUT")) { /* seconds, 0.001 to 60, at most 3 decimals */
    const char *dot = strchr(v, '.');
    size_t ip = dot ? (size_t)(dot - v) : strlen(v), fp = dot ? strlen(dot + 1) : 0;
    if (ip == 0 || ip > 7 || strspn(v, "0123456789") != ip || (dot && (fp == 0 || fp > 3 || strspn(dot + 1, "0123456789") != fp)))
      return false;
    double s = atof(v);
    return s >= 0.001 && s <= 60.0;
  }
  if (!strcmp(opt, "GPURECLAIM_VERBOSE"))
    return !strcmp(v, "0") || !strcmp(v, "1") || !strcmp(v, "2");
  if (!strcmp(opt, "GPURECLAIM_GUARANTEE")) { /* a size or a fraction of the device, as GPURECLAIM_LIMIT */
    size_t w = strspn(v, "0123456789"), f = 0;
    const char *p = v + w;
    if (w == 0 || w > 20)
      return false;
    if (*p == '.') {
      f = strspn(p + 1, "0123456789");
      if (f == 0 || f > 6)
        return false;
      p += 1 + f;
    }
    long double x = strtold(v, NULL);
    if (x > (long double)(ULLONG_MAX / 1000000))
      return false;
    if (*p == '\0')
      return f ? x > 0 && x <= 1 : x >= 1; /* a fraction, or whole bytes */
    if (*p == '%')
      return p[1] == '\0' && f <= 4 && x > 0 && x <= 100;
    const char *u = strchr("kmgt", tolower((unsigned char)*p));
    if (!u || !*u)
      return false;
    p++;
    if (*p && strcmp(p, "iB") && strcmp(p, "ib") && strcmp(p, "B") && strcmp(p, "b"))
      return false;
    long double b = x * (long double)(1ull << (10 * (u - "kmgt" + 1)));
    return b >= 1 && b <= (long double)UINT64_MAX;
  }
  if (!strcmp(opt, "GPURECLAIM_WAKE_TIMEOUT") || !strcmp(opt, "GPURECLAIM_SLEEP_IDLE") ||
      !strcmp(opt, "GPURECLAIM_SLEEP_MIN_AWAKE") || !strcmp(opt, "GPURECLAIM_WAIT")) { /* whole seconds */
    const char *d = v + strspn(v, "0");                                                   /* leading zeros */
    return *v && strspn(v, "0123456789") == strlen(v) && strlen(d) < 9 &&
           atol(d) <= (!strcmp(opt, "GPURECLAIM_SLEEP_IDLE") ? 30 * 86400 : 86400);
  }
  if (!strcmp(opt, "GPURECLAIM_SLEEP") && !strcasecmp(v, "auto"))
    return true;
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
    if (!strcasecmp(v, bools[i]))
      return true;
  return false;
}

static void check(const char *opt, const char *v) {
  run_t r;
  run_probe(opt, v, &r);
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s=\"%s\": the program failed (status %d)\n%s", opt, v,
            r.status, r.err);
  bool disabled = !strcmp(opt, "GPURECLAIM_DISABLE") && valid(opt, v) &&
                  (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "on") || !strcasecmp(v, "true"));
  if (disabled)
    cr_assert_not_null(strstr(r.out, "enabled=0"), "%s=%s: %s", opt, v, r.out);
  else
    cr_assert_not_null(strstr(r.out, "enabled=1 live_blocks=1 rc=0"), "%s=\"%s\": %s\n%s", opt, v, r.out, r.err);
  char want[64];
  snprintf(want, sizeof want, "%s=\"", opt);
  bool warned = strstr(r.err, want) && strstr(r.err, "is not valid");
  if (!valid(opt, v)) {
    cr_assert(warned, "%s=\"%s\" (malformed) was not warned about:\n%s", opt, v, r.err);
    const char *first = strstr(r.err, want);
    cr_assert_null(strstr(first + 1, want), "%s warned more than once", opt);
  } else {
    cr_assert(!warned, "%s=\"%s\" is valid but was warned about:\n%s", opt, v, r.err);
  }
}

Test(options, malformed_values, .timeout = 300) {
  for (size_t o = 0; o < sizeof g_options / sizeof g_options[0]; o++)
    for (size_t v = 0; v < sizeof g_malformed / sizeof g_malformed[0]; v++)
      check(g_options[o], g_malformed[v]);
}

Test(options, random_values, .timeout = 300) {
  uint64_t s = gr_rng_stream(0);
  char v[6000];
  for (int round = 0; round < 6; round++)
    for (size_t o = 0; o < sizeof g_options / sizeof g_options[0]; o++) {
      size_t n = (size_t)(round == 5 ? 5000 : gr_rng_below(&s, 24));
      for (size_t i = 0; i < n; i++)
        v[i] = (char)(32 + gr_rng_below(&s, 95));
      v[n] = '\0';
      check(g_options[o], v);
    }
}

Test(options, documented_values_work) {
  check("GPURECLAIM_SIGNAL", "USR2");
  check("GPURECLAIM_ON_SIGNAL", "all");
  check("GPURECLAIM_OOM_RETRY", "0");
  check("GPURECLAIM_VERBOSE", "2");
  check("GPURECLAIM_DISABLE", "yes");
  check("GPURECLAIM_LEAK_REPORT", "off");
  check("GPURECLAIM_PEERS", "ask");
  check("GPURECLAIM_PEERS", "give,ask");
  check("GPURECLAIM_PEERS", "off");
  check("GPURECLAIM_PEER_TIMEOUT", "0.5");
  check("GPURECLAIM_PEER_TIMEOUT", "60");
}
