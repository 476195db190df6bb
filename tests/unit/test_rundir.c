/* The run directory: its default (src/base/options.c): $XDG_RUNTIME_DIR/gpureclaim only when XDG_RUNTIME_DIR
 * belongs to the effective user (a root process run with a user's environment must not make a root-owned
 * directory there), else /tmp/gpureclaim-<euid>; the library's refusal of one others can read or enter
 * (src/report/rundir.c); and the status file's temporary file, which must be new (O_EXCL). Each test runs in a
 * process of its own, so options and the run directory load afresh. */
#include "gpureclaim_internal.h"
#include "report.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

/* A private directory is used; one with any group or other permission bit is refused, whoever owns it. */
static void expect_rundir_used(mode_t mode, bool used) {
  char d[] = "/tmp/grrunXXXXXX";
  cr_assert_not_null(mkdtemp(d));
  cr_assert_eq(chmod(d, mode), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", d, 1), 0);
  const char *got = gr_report_rundir();
  if (used)
    cr_assert(got && !strcmp(got, d), "the private run directory %s was refused", d);
  else
    cr_assert_null(got, "a run directory with mode %04o was used", (unsigned)mode);
  rmdir(d);
}

Test(rundir, a_private_run_directory_is_used) { expect_rundir_used(0700, true); }
Test(rundir, a_run_directory_the_group_can_read_is_refused) { expect_rundir_used(0750, false); }
Test(rundir, a_run_directory_others_can_read_is_refused) { expect_rundir_used(0707, false); }
Test(rundir, a_run_directory_only_the_group_can_enter_is_refused) { expect_rundir_used(0710, false); }

/* Without XDG_RUNTIME_DIR the default is /tmp/gpureclaim-<euid>, a name another local user can create first, as a
 * directory of theirs or as a link: either is refused, mode 0700 or not, and nothing is written into it (README,
 * "Who can see what"). Shown on the same shapes in places of the test's (the library's rule is the same for any
 * run directory, the default included). */
Test(rundir, a_run_directory_another_user_owns_is_refused) {
  char d[] = "/tmp/grrunXXXXXX";
  const char *foreign = d;
  cr_assert_not_null(mkdtemp(d));
  if (geteuid() == 0) {
    cr_assert_eq(chown(d, 65534, 65534), 0); /* mode 0700, another user's */
  } else {
    struct stat st; /* root's own /root: mode 0700, another user's */
    cr_assert(stat("/root", &st) == 0 && st.st_uid == 0 && (st.st_mode & 0777) == 0700,
              "no directory of another user's to show this with (/root is not root's with mode 0700)");
    foreign = "/root";
  }
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", foreign, 1), 0);
  cr_assert_null(gr_report_rundir(), "%s, another user's, was used", foreign);
  cr_assert_eq(rmdir(d), 0, "something was made in the refused directory");
}

Test(rundir, a_link_in_place_of_the_run_directory_is_refused) {
  char d[] = "/tmp/grrunXXXXXX", link[64];
  cr_assert_not_null(mkdtemp(d)); /* private, the user's own: only the link is wrong */
  snprintf(link, sizeof link, "%s.link", d);
  cr_assert_eq(symlink(d, link), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", link, 1), 0);
  cr_assert_null(gr_report_rundir(), "the link %s was followed", link);
  unlink(link);
  cr_assert_eq(rmdir(d), 0, "something was made through the link");
}

/* The temporary name a status update writes to is opened only if new (O_EXCL): a name put there beforehand, a
 * hard link to another file of the user's, is passed over. Opened without O_EXCL, it would have been written
 * through, into that other file, which the rename then also put in place as the status file. */
Test(rundir, the_status_files_temporary_name_is_never_one_that_exists) {
  char d[] = "/tmp/grrunXXXXXX", victim[64], name[256], path[256];
  cr_assert_not_null(mkdtemp(d));
  cr_assert_eq(chmod(d, 0700), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", d, 1), 0);
  snprintf(victim, sizeof victim, "%s.victim", d);
  int fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "precious\n", 9), 9);
  close(fd);
  /* outfile.c's names: PATH.PID.TID.N.tmp, N counting from 0 in this fresh process. */
  int pid = (int)getpid();
  long tid = (long)syscall(SYS_gettid);
  for (int n = 0; n < 16; n++) {
    snprintf(name, sizeof name, "%s/%d.json.%d.%ld.%d.tmp", d, pid, pid, tid, n);
    cr_assert_eq(link(victim, name), 0, "%s", name);
  }
  cr_assert_eq(gr_report_status_update(), 0);
  char buf[64] = "";
  fd = open(victim, O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(read(fd, buf, sizeof buf - 1), 9);
  close(fd);
  cr_assert_str_eq(buf, "precious\n", "the status was written into a file that was already there");
  snprintf(path, sizeof path, "%s/%d.json", d, pid);
  struct stat st, vs;
  cr_assert_eq(stat(path, &st), 0, "no status file");
  cr_assert_eq(stat(victim, &vs), 0);
  cr_assert_neq(st.st_ino, vs.st_ino, "the status file is the planted file");
  for (int n = 0; n < 16; n++) {
    snprintf(name, sizeof name, "%s/%d.json.%d.%ld.%d.tmp", d, pid, pid, tid, n);
    unlink(name);
  }
  unlink(path);
  unlink(victim);
  rmdir(d);
}
