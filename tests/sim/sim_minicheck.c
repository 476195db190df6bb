/* sim_minicheck.c -- registry and main() of the minimal test harness (see sim_minicheck.h). */
#define _GNU_SOURCE
#include "sim_minicheck.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIMCK_MAX 256

static struct {
  const char *suite, *name;
  simck_fn fn;
} tests[SIMCK_MAX];
static int ntests;

void simck_register(const char *suite, const char *name, simck_fn fn) {
  if (ntests == SIMCK_MAX) {
    fprintf(stderr, "minicheck: more than %d tests\n", SIMCK_MAX);
    abort();
  }
  tests[ntests].suite = suite;
  tests[ntests].name = name;
  tests[ntests].fn = fn;
  ntests++;
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

/* Runs every test (or those whose "suite::name" contains argv[1]) in a forked child; extra arguments such
 * as Criterion's "--jobs 2" are ignored. */
int main(int argc, char **argv) {
  const char *filter = argc > 1 && argv[1][0] != '-' ? argv[1] : NULL;
  int run = 0, failed = 0;
  for (int i = 0; i < ntests; i++) {
    char id[256];
    snprintf(id, sizeof id, "%s::%s", tests[i].suite, tests[i].name);
    if (filter && !strstr(id, filter)) continue;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      tests[i].fn();
      exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    run++;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      printf("[PASS] %s\n", id);
    } else {
      failed++;
      if (WIFSIGNALED(st)) printf("[FAIL] %s: killed by signal %d\n", id, WTERMSIG(st));
      else printf("[FAIL] %s: exit status %d\n", id, WEXITSTATUS(st));
    }
  }
  printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d\n", run, run - failed, failed);
  return failed ? 1 : (run ? 0 : 3);
}
