/*
 * outfile.c -- see outfile.h. Renaming over a path replaces whatever the name pointed at: done to /dev/null by a
 * process running as root, it leaves a regular file where every program expects the null device. So only
 * regular files (and new names) are replaced; everything else is written through.
 */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const char *p, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* In place, following links, as `>` does. */
static int write_through(const char *path, const void *data, size_t len, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    return -errno;
  int rc = write_all(fd, data, len);
  if (close(fd) != 0 && rc == 0 && errno != EINTR)
    rc = -errno;
  return rc;
}

static int write_replacing(const char *path, const void *data, size_t len, mode_t mode) {
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid()) >= sizeof tmp)
    return -ENAMETOOLONG;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return -errno;
  int rc = write_all(fd, data, len);
  if (close(fd) != 0 && rc == 0)
    rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0)
    rc = -errno;
  if (rc != 0)
    unlink(tmp);
  return rc;
}

int gr_out_write(const char *path, const void *data, size_t len, mode_t mode) {
  if (!path || !*path)
    return -EINVAL;
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno != ENOENT)
      return -errno;
    return write_replacing(path, data, len, mode); /* a new file */
  }
  if (S_ISDIR(st.st_mode))
    return -EISDIR;
  if (S_ISREG(st.st_mode))
    return write_replacing(path, data, len, mode);
  return write_through(path, data, len, mode);
}
