/* Whole-file writes of outfile.h (snapshots, leak reports, status files): a reader sees the old file or the new
 * one, never half of either; a failed write leaves the old content and no temporary file behind; a replaced
 * file keeps its permission bits; links are followed only where they belong to this user (or root); standard
 * descriptors are written at their offset; a FIFO without reader is an error, not a hang. */
#include "outfile.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[PATH_MAX];

static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/gr_test_outfile_XXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}

static void remove_dir(void) {
  DIR *d = opendir(g_dir);
  if (!d)
    return;
  struct dirent *e;
  char p[PATH_MAX + 256];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(g_dir);
}

TestSuite(outfile, .init = make_dir, .fini = remove_dir);

static const char *at(const char *name) {
  static char p[4][PATH_MAX + 256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", g_dir, name);
  return p[i];
}

/* The whole of path, in a static buffer. */
static const char *contents(const char *path) {
  static char buf[1 << 16];
  int fd = open(path, O_RDONLY);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  cr_assert_geq(n, 0);
  buf[n] = '\0';
  return buf;
}

static void put(const char *path, const char *s) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, s, strlen(s)), (ssize_t)strlen(s));
  close(fd);
}

/* The number of entries in the directory: a failed or finished write leaves no temporary file. */
static int entries(void) {
  DIR *d = opendir(g_dir);
  cr_assert_not_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

Test(outfile, a_new_file_gets_the_mode_less_the_umask) {
  mode_t old = umask(022);
  const char *p = at("new");
  cr_assert_eq(gr_out_write(p, "hello", 5, 0666), 0);
  umask(old);
  cr_assert_str_eq(contents(p), "hello");
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0644, "mode %o", st.st_mode & 07777);
  cr_assert_eq(entries(), 1);
}

/* Replacing is a rename: the old inode is untouched (a reader holding it open reads the old text whole), the
 * new one keeps the old file's permission bits, not the mode asked for. */
Test(outfile, a_replaced_file_is_renamed_into_place_and_keeps_its_permissions) {
  const char *p = at("f");
  put(p, "old content");
  cr_assert_eq(chmod(p, 0640), 0);
  int reader = open(p, O_RDONLY);
  cr_assert_geq(reader, 0);
  struct stat before, after;
  cr_assert_eq(stat(p, &before), 0);
  cr_assert_eq(gr_out_write(p, "new", 3, 0600), 0);
  cr_assert_eq(stat(p, &after), 0);
  cr_assert_neq(before.st_ino, after.st_ino, "the file was rewritten in place, not replaced");
  cr_assert_eq(after.st_mode & 07777, 0640, "mode %o", after.st_mode & 07777);
  cr_assert_str_eq(contents(p), "new");
  char old[32] = "";
  cr_assert_eq(read(reader, old, sizeof old - 1), 11);
  cr_assert_str_eq(old, "old content");
  close(reader);
  cr_assert_eq(entries(), 1);
}

/* A write that fails half-way (here: the file size limit, EFBIG) leaves the old file as it was and removes
 * its temporary file. */
Test(outfile, a_failed_write_leaves_the_old_content_and_no_temporary_file) {
  const char *p = at("keep");
  put(p, "old content");
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit rl = {4096, 4096};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  static char big[65536];
  memset(big, 'n', sizeof big);
  int rc = gr_out_write(p, big, sizeof big, 0600);
  cr_assert_eq(rc, -EFBIG, "rc %d", rc);
  cr_assert_str_eq(contents(p), "old content");
  cr_assert_eq(entries(), 1, "a temporary file was left behind");
}

/* A temporary name that cannot be made (the file's name is already as long as a name can be) fails the write
 * before anything is touched. */
Test(outfile, a_temporary_name_too_long_fails_and_leaves_the_old_file) {
  char name[NAME_MAX + 1];
  memset(name, 'n', NAME_MAX - 4);
  name[NAME_MAX - 4] = '\0';
  const char *p = at(name);
  put(p, "old");
  int rc = gr_out_write(p, "new", 3, 0600);
  cr_assert_eq(rc, -ENAMETOOLONG, "rc %d", rc);
  cr_assert_str_eq(contents(p), "old");
  cr_assert_eq(entries(), 1);
}

Test(outfile, a_directory_or_an_empty_path_is_refused) {
  cr_assert_eq(gr_out_write(g_dir, "x", 1, 0600), -EISDIR);
  cr_assert_eq(symlink(g_dir, at("dirlink")), 0);
  cr_assert_eq(gr_out_write(at("dirlink"), "x", 1, 0600), -EISDIR);
  cr_assert_eq(gr_out_write("", "x", 1, 0600), -EINVAL);
  cr_assert_eq(gr_out_write(NULL, "x", 1, 0600), -EINVAL);
  cr_assert_eq(gr_out_write(at("nodir/file"), "x", 1, 0600), -ENOENT);
}

/* A link of this user's is followed: its regular target is replaced and the link stays a link; a dangling link
 * creates its target. */
Test(outfile, an_own_link_is_followed_and_stays_a_link) {
  put(at("target"), "old");
  cr_assert_eq(symlink(at("target"), at("link")), 0);
  cr_assert_eq(gr_out_write(at("link"), "new", 3, 0600), 0);
  struct stat st;
  cr_assert_eq(lstat(at("link"), &st), 0);
  cr_assert(S_ISLNK(st.st_mode));
  cr_assert_str_eq(contents(at("target")), "new");
  cr_assert_eq(symlink(at("made"), at("dangling")), 0);
  cr_assert_eq(gr_out_write(at("dangling"), "made", 4, 0600), 0);
  cr_assert_str_eq(contents(at("made")), "made");
  cr_assert_eq(entries(), 4);
}

/* A link that another user owns could aim the content anywhere that user chooses: refused, target untouched.
 * Making one needs root (lchown to another uid). */
Test(outfile, a_link_owned_by_another_user_is_refused) {
  put(at("victim"), "precious");
  cr_assert_eq(symlink(at("victim"), at("planted")), 0);
  if (lchown(at("planted"), 65534, 65534) != 0) {
    fprintf(stderr, "skipped: cannot give a link to another user here (%s)\n", strerror(errno));
    cr_skip_test("needs root to make a link owned by another user");
  }
  if (geteuid() == 65534)
    cr_skip_test("runs as uid 65534");
  cr_assert_eq(gr_out_write(at("planted"), "evil", 4, 0600), -EACCES);
  cr_assert_str_eq(contents(at("victim")), "precious");
}

/* /dev/fd/N and /proc/self/fd/N are written at the descriptor's offset (a shell's >> keeps what it had); a
 * closed descriptor is EBADF. */
Test(outfile, descriptor_paths_are_written_at_their_offset) {
  const char *p = at("fd");
  put(p, "one,");
  int fd = open(p, O_WRONLY | O_APPEND);
  cr_assert_geq(fd, 0);
  char path[64];
  snprintf(path, sizeof path, "/dev/fd/%d", fd);
  cr_assert_eq(gr_out_write(path, "two,", 4, 0600), 0);
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  cr_assert_eq(gr_out_write(path, "three", 5, 0600), 0);
  close(fd);
  cr_assert_str_eq(contents(p), "one,two,three");
  cr_assert_eq(gr_out_write(path, "x", 1, 0600), -EBADF);
}

/* A FIFO nobody reads is an error after a bounded wait, never a hang; one with a reader is written into. */
Test(outfile, a_fifo_without_reader_is_enxio_and_with_one_is_written, .timeout = 30) {
  const char *p = at("fifo");
  cr_assert_eq(mkfifo(p, 0600), 0);
  cr_assert_eq(gr_out_write(p, "x", 1, 0600), -ENXIO);
  int r = open(p, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(r, 0);
  cr_assert_eq(gr_out_write(p, "fifo!", 5, 0600), 0);
  char got[8] = "";
  cr_assert_eq(read(r, got, sizeof got - 1), 5);
  cr_assert_str_eq(got, "fifo!");
  close(r);
  struct stat st;
  cr_assert_eq(lstat(p, &st), 0);
  cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced");
}

/* The two-step form: the temporary file holds the data, flushed or not, with path's permission bits (or mode
 * for a new path), and path itself is untouched until the caller renames. */
Test(outfile, write_temp_leaves_path_alone_until_the_caller_renames) {
  const char *p = at("status");
  put(p, "old");
  cr_assert_eq(chmod(p, 0604), 0);
  char tmp[GR_OUT_TEMP_MAX];
  for (int sync = 0; sync < 2; sync++) {
    cr_assert_eq(gr_out_write_temp_ex(p, "new", 3, 0600, tmp, sizeof tmp, sync), 0);
    cr_assert_eq(strncmp(tmp, p, strlen(p)), 0, "the temporary %s is not next to %s", tmp, p);
    cr_assert_str_eq(contents(p), "old");
    cr_assert_str_eq(contents(tmp), "new");
    struct stat st;
    cr_assert_eq(stat(tmp, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0604, "mode %o", st.st_mode & 07777);
    cr_assert_eq(unlink(tmp), 0);
  }
  char tmp2[GR_OUT_TEMP_MAX];
  cr_assert_eq(gr_out_write_temp(p, "a", 1, 0600, tmp, sizeof tmp), 0);
  cr_assert_eq(gr_out_write_temp(p, "b", 1, 0600, tmp2, sizeof tmp2), 0);
  cr_assert_str_neq(tmp, tmp2, "two writers of one path share a temporary name");
  cr_assert_eq(rename(tmp2, p), 0);
  cr_assert_eq(unlink(tmp), 0);
  cr_assert_str_eq(contents(p), "b");
  cr_assert_eq(gr_out_write_temp(p, "a", 1, 0600, tmp, 8), -ENAMETOOLONG);
  cr_assert_eq(entries(), 1);
}

/* A link at path is replaced by the two-step form, not followed (callers that follow links pass the target). */
Test(outfile, write_temp_replaces_a_link_rather_than_following_it) {
  put(at("t"), "target");
  cr_assert_eq(symlink(at("t"), at("l")), 0);
  char tmp[GR_OUT_TEMP_MAX];
  mode_t old = umask(077);
  cr_assert_eq(gr_out_write_temp(at("l"), "new", 3, 0644, tmp, sizeof tmp), 0);
  umask(old);
  struct stat st;
  cr_assert_eq(stat(tmp, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0600, "a link's bits must not be taken (mode %o)", st.st_mode & 07777);
  cr_assert_eq(rename(tmp, at("l")), 0);
  cr_assert_eq(lstat(at("l"), &st), 0);
  cr_assert(S_ISREG(st.st_mode));
  cr_assert_str_eq(contents(at("t")), "target");
}

Test(outfile, write_fd_writes_everything_and_reports_errors) {
  static char big[1 << 20];
  for (size_t i = 0; i < sizeof big; i++)
    big[i] = (char)('a' + i % 26);
  const char *p = at("big");
  cr_assert_eq(gr_out_write(p, big, sizeof big, 0600), 0);
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  cr_assert_eq(st.st_size, (off_t)sizeof big);
  int fd = open(p, O_RDONLY);
  cr_assert_eq(gr_out_write_fd(fd, "x", 1), -EBADF);
  close(fd);
  cr_assert_eq(gr_out_write_fd(-1, "x", 1), -EBADF);
}
