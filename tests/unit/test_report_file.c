/* gpureclaim_snapshot() and gpureclaim_leak_report() to a path the program names (src/report/file.c): a file
 * that reads back as one JSON object with no temporary file left, an empty path refused (-EINVAL), and a path
 * that cannot be written an error (-EIO) with nothing left behind. */
#include "gpureclaim_internal.h"
#include "jsonread.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/grfileXXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
  cr_assert_eq(gr_table_init(), 0);
  atomic_store(&gr_state_run, 1);
}

TestSuite(file, .init = setup);

static jnode_t *read_json(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s was not written", path);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  const char *err = NULL;
  jnode_t *j = jparse_object(buf, &err);
  cr_assert_not_null(j, "%s is not one JSON object (%s)", path, err);
  return j;
}

static int entries(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

Test(file, a_snapshot_and_a_leak_report_read_back_as_json) {
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, 0x7f0000100000ull, 1 << 20, 0, 0x1000);
  r.device = 0;
  gr_track_insert(&r);
  char path[128];
  snprintf(path, sizeof path, "%s/snap.json", g_dir);
  cr_assert_eq(gpureclaim_snapshot(path), 0);
  jnode_t *j = read_json(path);
  cr_assert_eq(jget(j, "blocks")->n, 1);
  jdelete(j);
  unlink(path);
  snprintf(path, sizeof path, "%s/leaks.json", g_dir);
  cr_assert_eq(gpureclaim_leak_report(path, 1), 0);
  j = read_json(path);
  cr_assert_eq(jint(j, "blocks", -1), 1);
  cr_assert_eq(jint(j, "bytes", -1), 1 << 20);
  jdelete(j);
  unlink(path);
  cr_assert_eq(entries(g_dir), 0, "a temporary file was left behind");
  rmdir(g_dir);
}

Test(file, an_empty_path_is_refused) {
  cr_assert_eq(gpureclaim_snapshot(NULL), -EINVAL);
  cr_assert_eq(gpureclaim_snapshot(""), -EINVAL);
  cr_assert_eq(gpureclaim_leak_report("", 0), -EINVAL);
  rmdir(g_dir);
}

/* Paths no process can write, root included: under a regular file, and in a directory that does not exist. */
Test(file, an_unwritable_path_is_an_error_and_nothing_is_left) {
  char plain[128], path[160];
  snprintf(plain, sizeof plain, "%s/plain", g_dir);
  FILE *f = fopen(plain, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(path, sizeof path, "%s/snap.json", plain);
  cr_assert_eq(gpureclaim_snapshot(path), -EIO);
  cr_assert_eq(gpureclaim_leak_report(path, 0), -EIO);
  snprintf(path, sizeof path, "%s/missing/snap.json", g_dir);
  cr_assert_eq(gpureclaim_snapshot(path), -EIO);
  cr_assert_eq(gpureclaim_leak_report(path, 1), -EIO);
  struct stat st;
  cr_assert_eq(stat(plain, &st), 0);
  cr_assert_eq(st.st_size, 0, "the regular file in the way was written");
  cr_assert_eq(entries(g_dir), 1, "something besides the file in the way was left in the directory");
  unlink(plain);
  rmdir(g_dir);
}
