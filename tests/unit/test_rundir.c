/* The default run directory (src/options.c): $XDG_RUNTIME_DIR/gpureclaim only when XDG_RUNTIME_DIR belongs to
 * the effective user (a root process run with a user's environment must not make a root-owned directory
 * there), else /tmp/gpureclaim-<euid>. Each test runs in a process of its own, so options load afresh. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void expect_rundir(const char *xdg, const char *want) {
  cr_assert_eq(setenv("XDG_RUNTIME_DIR", xdg, 1), 0);
  unsetenv("GPURECLAIM_RUNDIR");
  cr_assert_str_eq(gr_opt()->rundir, want);
}

Test(rundir, the_users_own_xdg_runtime_dir) {
  char d[] = "/tmp/grxdgXXXXXX", want[64];
  cr_assert_not_null(mkdtemp(d));
  snprintf(want, sizeof want, "%s/gpureclaim", d);
  expect_rundir(d, want);
  rmdir(d);
}

Test(rundir, an_xdg_runtime_dir_of_another_user_is_not_used) {
  char d[] = "/tmp/grxdgXXXXXX", want[64];
  const char *other = "/"; /* root's: another user's unless the test runs as root */
  if (geteuid() == 0) {
    cr_assert_not_null(mkdtemp(d));
    cr_assert_eq(chown(d, 65534, 65534), 0);
    other = d;
  }
  snprintf(want, sizeof want, "/tmp/gpureclaim-%u", (unsigned)geteuid());
  expect_rundir(other, want);
  if (other == d)
    rmdir(d);
}
