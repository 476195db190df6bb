/*
 * sim_test_machine.c -- linked into every Criterion suite (and its sim_minicheck build): one simulated machine
 * per test.
 *
 * Processes on one simulated machine share its GPUs' memory, as programs on one real GPU do (SIMCUDA_MACHINE;
 * tests/run_test.sh gives every CTest test a fresh one). A suite runs each test in a process of its own, two at a
 * time (--jobs 2): on one machine, a test's figures (free memory, the point where an allocation fails, the capacity
 * its process asked for) would depend on what the test beside it holds. So each test process takes a machine of
 * its own before main() runs: a directory inside the suite's, which every process the test starts inherits (and
 * so shares, as it would on a real machine).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_made[4096]; /* a machine made under TMPDIR (the suite run by hand): removed at exit */
static pid_t g_maker;

static void remove_made(void) {
  if (!g_made[0] || getpid() != g_maker) return;
  DIR *d = opendir(g_made);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (e->d_name[0] != '.' || (e->d_name[1] && (e->d_name[1] != '.' || e->d_name[2]))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", g_made, e->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(g_made);
}

__attribute__((constructor)) static void sim_test_machine(void) {
  /* Criterion's test workers carry BXFI_MAP, sim_minicheck's SIMCK_ONE; the runners carry neither. */
  if (!getenv("BXFI_MAP") && !getenv("SIMCK_ONE")) return;
  if (getenv("SIMCUDA_TEST_MACHINE")) return; /* started by a test: it shares that test's machine */
  const char *base = getenv("SIMCUDA_MACHINE");
  char path[4096];
  if (base && *base) {
    snprintf(path, sizeof path, "%s/test.%d", base, (int)getpid());
    if (mkdir(path, 0700) != 0) return; /* the simulator then says what is wrong with the suite's machine */
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/simcuda-test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(path)) return;
    snprintf(g_made, sizeof g_made, "%s", path);
    g_maker = getpid();
    atexit(remove_made);
  }
  setenv("SIMCUDA_MACHINE", path, 1);
  setenv("SIMCUDA_TEST_MACHINE", path, 1);
}
