/* sim_minicheck.c -- registry and main() of the minimal test harness (see sim_minicheck.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sim_minicheck.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIMCK_MAX 256
#define SIMCK_SKIP 77 /* a test's exit status when it skipped itself */
#define SIMCK_ONE "SIMCK_ONE" /* names the test a re-executed child runs */

static struct {
  const char *suite, *name;
  simck_fn fn;
  struct simck_opts o;
} tests[SIMCK_MAX];
static int ntests;
static struct {
  const char *name;
  struct simck_opts o;
} suites[SIMCK_MAX];
static int nsuites;
static char current[256]; /* "suite::name" of the test this process runs */

void simck_register(const char *suite, const char *name, simck_fn fn, struct simck_opts o) {
  if (ntests == SIMCK_MAX) {
    fprintf(stderr, "minicheck: more than %d tests\n", SIMCK_MAX);
    abort();
  }
  tests[ntests].suite = suite;
  tests[ntests].name = name;
  tests[ntests].fn = fn;
  tests[ntests].o = o;
  ntests++;
}

void simck_suite(const char *suite, struct simck_opts o) {
  if (nsuites == SIMCK_MAX)
    abort();
  suites[nsuites].name = suite;
  suites[nsuites].o = o;
  nsuites++;
}

void simck_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
  if (ok) return;
  va_list ap;
  fprintf(stderr, "%s:%d: assertion failed: %s:", file, line, expr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1); /* exit, not _exit: ThreadSanitizer reports at exit */
}

void simck_skip(const char *fmt, ...) {
  va_list ap;
  fflush(NULL);
  printf("[SKIP] %s:", current);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  exit(SIMCK_SKIP);
}

/* In a re-executed child: the suite's and the test's .init, the test, their .fini. */
static int run_one(int i) {
  snprintf(current, sizeof current, "%s::%s", tests[i].suite, tests[i].name);
  const struct simck_opts *so = NULL;
  for (int s = 0; s < nsuites; s++)
    if (!strcmp(suites[s].name, tests[i].suite))
      so = &suites[s].o;
  if (so && so->init) so->init();
  if (tests[i].o.init) tests[i].o.init();
  tests[i].fn();
  if (tests[i].o.fini) tests[i].o.fini();
  if (so && so->fini) so->fini();
  return 0;
}

/* Whether argv[a] names tests: neither an option nor the value of Criterion's "--jobs N" (options are ignored). */
static int is_filter(char **argv, int a) { return argv[a][0] != '-' && (a < 2 || strcmp(argv[a - 1], "--jobs")); }

/* Runs every test (or those whose "suite::name" contains one of the filter arguments) in a child process that
 * re-executes this program. */
int main(int argc, char **argv) {
  const char *one = getenv(SIMCK_ONE);
  if (one) {
    int i = atoi(one);
    unsetenv(SIMCK_ONE); /* not for the test's own children */
    if (i < 0 || i >= ntests) return 2;
    run_one(i);
    exit(0);
  }
  int run = 0, failed = 0, skipped = 0, filters = 0;
  for (int a = 1; a < argc; a++) filters += is_filter(argv, a);
  for (int i = 0; i < ntests; i++) {
    char id[256];
    snprintf(id, sizeof id, "%s::%s", tests[i].suite, tests[i].name);
    int match = !filters;
    for (int a = 1; a < argc; a++) match |= is_filter(argv, a) && strstr(id, argv[a]) != NULL;
    if (!match) continue;
    fflush(NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      char n[16];
      snprintf(n, sizeof n, "%d", i);
      setenv(SIMCK_ONE, n, 1);
      execv("/proc/self/exe", argv);
      perror("minicheck: exec /proc/self/exe");
      _exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (WIFEXITED(st) && WEXITSTATUS(st) == SIMCK_SKIP) {
      skipped++; /* the child printed "[SKIP] id: reason" */
      continue;
    }
    run++;
    int want = tests[i].o.signal;
    if (want ? WIFSIGNALED(st) && WTERMSIG(st) == want : WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      printf("[PASS] %s: (%.2fs)\n", id, secs);
    } else {
      failed++;
      if (WIFSIGNALED(st)) printf("[FAIL] %s: killed by signal %d\n", id, WTERMSIG(st));
      else printf("[FAIL] %s: exit status %d\n", id, WEXITSTATUS(st));
    }
  }
  printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Skipped: %d\n", run, run - failed, failed,
         skipped);
  return failed ? 1 : (run + skipped ? 0 : 3);
}
