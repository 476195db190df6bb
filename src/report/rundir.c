/*
 * rundir.c -- the private run directory this process's files go to (its status file, its control socket):
 * created with mode 0700; one that exists with other owners or wider permissions is refused with one warning
 * (the rule is gr_dir_is_private, common.c, which the command applies too).
 */
#include "options.h"

#include "report.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

static pthread_once_t g_rundir_once = PTHREAD_ONCE_INIT;
static const char *g_rundir; /* NULL when unusable */

static void open_rundir(void) {
  const char *dir = gr_opt()->rundir;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    gr_warn("cannot create the run directory %s: %s; no status file (gpureclaim ps will not list this process)", dir,
            strerror(errno));
    return;
  }
  struct stat st;
  if (lstat(dir, &st) != 0 || !gr_dir_is_private(&st)) {
    gr_warn("the run directory %s is not a directory private to this user (mode 0700); refusing to use it (if it "
            "is yours: chmod 700 %s)", dir, dir);
    return;
  }
  g_rundir = dir;
}

const char *gr_report_rundir(void) {
  pthread_once(&g_rundir_once, open_rundir);
  return g_rundir;
}

const char *gr_report_rundir_opened(void) { return g_rundir; }
