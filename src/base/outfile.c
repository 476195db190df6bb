/*
 * outfile.c -- see outfile.h. Renaming over a path replaces whatever the name pointed at: done to /dev/null by a
 * process running as root, it leaves a regular file where every program expects the null device; done to a
 * symbolic link, it replaces the link and never writes its target. So only regular files (and new names) are
 * replaced, links are followed to their target, and devices and FIFOs are written into.
 */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int gr_out_write_fd(int fd, const void *data, size_t len) {
  const char *p = data;
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

int gr_out_open_nowait(const char *path, int flags, mode_t mode) {
  int fd = open(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
  if (fd >= 0) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
      (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* a reader exists: let writes wait for it */
  }
  return fd;
}

/* A device or FIFO: opened without truncation. A FIFO nobody reads gets 2 seconds for a reader to come, then
 * ENXIO: never a hang (a cron job writing its metrics, a signal-driven snapshot). */
static int write_into(const char *path, const void *data, size_t len) {
  int fd;
  for (int tries = 0; (fd = gr_out_open_nowait(path, O_WRONLY, 0)) < 0; tries++) {
    if (errno != ENXIO || tries == 200)
      return -errno;
    struct timespec nap = {0, 10 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  int rc = gr_out_write_fd(fd, data, len);
  close(fd);
  return rc;
}

/* Creates a temporary file next to path, named in tmp; returns its descriptor or a negative errno value. The
 * name is new to every call (process, thread and a counter): two writes of one path at once, from two threads
 * or two processes, each rename their own whole file into place; with one shared name, one renamed the other's
 * half-written file, and the other's rename then failed. O_EXCL: a name that exists (left by a process that
 * died, or put there by someone else, FIFO included) is never opened, only passed over. */
static int create_temp(const char *path, char *tmp, size_t len, mode_t mode) {
  static _Atomic unsigned counter;
  for (int tries = 0;; tries++) {
    unsigned n = atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
    if ((size_t)snprintf(tmp, len, "%s.%d.%ld.%u.tmp", path, (int)getpid(), (long)syscall(SYS_gettid), n) >= len)
      return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd >= 0 || errno != EEXIST || tries == 100)
      return fd >= 0 ? fd : -errno;
  }
}

int gr_out_write_temp(const char *path, const void *data, size_t len, mode_t mode, char *tmp, size_t tmplen) {
  return gr_out_write_temp_ex(path, data, len, mode, tmp, tmplen, true);
}

int gr_out_write_temp_ex(const char *path, const void *data, size_t len, mode_t mode, char *tmp, size_t tmplen,
                         bool sync) {
  struct stat old;
  /* A replaced regular file keeps its permissions; a link at path is replaced, not followed (callers that
   * follow links pass the target). */
  bool keep = lstat(path, &old) == 0 && S_ISREG(old.st_mode);
  int fd = create_temp(path, tmp, tmplen, keep ? (old.st_mode & 0600) : mode);
  if (fd < 0)
    return fd;
  int rc = keep && fchmod(fd, old.st_mode & 07777) != 0 ? -errno : 0;
  if (rc == 0)
    rc = gr_out_write_fd(fd, data, len);
  if (rc == 0 && sync && fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
    rc = -errno;
  if (close(fd) != 0 && rc == 0)
    rc = -errno;
  if (rc != 0)
    unlink(tmp);
  return rc;
}

static int write_replacing(const char *path, const void *data, size_t len, mode_t mode) {
  char tmp[GR_OUT_TEMP_MAX];
  int rc = gr_out_write_temp(path, data, len, mode, tmp, sizeof tmp);
  if (rc == 0 && rename(tmp, path) != 0) {
    rc = -errno;
    unlink(tmp);
  }
  return rc;
}

/* /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: the descriptor, or -1. */
static int std_fd(const char *path) {
  if (!strcmp(path, "/dev/stdout"))
    return 1;
  if (!strcmp(path, "/dev/stderr"))
    return 2;
  const char *n = !strncmp(path, "/dev/fd/", 8) ? path + 8 : !strncmp(path, "/proc/self/fd/", 14) ? path + 14 : NULL;
  if (!n || *n < '0' || *n > '9')
    return -1;
  char *end;
  long v = strtol(n, &end, 10);
  return *end || v > INT_MAX ? -1 : (int)v;
}

static bool trusted_owner(const struct stat *st) { return st->st_uid == geteuid() || st->st_uid == 0; }

int gr_out_write(const char *path, const void *data, size_t len, mode_t mode) {
  if (!path || !*path)
    return -EINVAL;
  int fd = std_fd(path);
  if (fd >= 0)
    return fcntl(fd, F_GETFD) < 0 ? -EBADF : gr_out_write_fd(fd, data, len);
  struct stat st;
  if (lstat(path, &st) != 0)
    return errno == ENOENT ? write_replacing(path, data, len, mode) : -errno; /* a new file */
  if (S_ISREG(st.st_mode))
    return write_replacing(path, data, len, mode);
  if (S_ISDIR(st.st_mode))
    return -EISDIR;
  if (!trusted_owner(&st))
    return -EACCES;
  if (!S_ISLNK(st.st_mode))
    return write_into(path, data, len);
  /* A link (of ours): its target, wherever the links lead. */
  char *target = realpath(path, NULL);
  if (!target) {
    if (errno != ENOENT)
      return -errno;
    /* Dangling: the target is created where the link says, as a shell's > would; it is new, so nobody can
     * be reading half of it. */
    int nfd = gr_out_open_nowait(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (nfd < 0)
      return -errno; /* ENXIO: a FIFO without reader got there since realpath(); an error, not a hang */
    int rc = gr_out_write_fd(nfd, data, len);
    if (close(nfd) != 0 && rc == 0)
      rc = -errno;
    return rc;
  }
  int rc;
  if (stat(target, &st) != 0)
    rc = -errno;
  else if (S_ISREG(st.st_mode))
    rc = write_replacing(target, data, len, mode);
  else if (S_ISDIR(st.st_mode))
    rc = -EISDIR;
  else if (!trusted_owner(&st))
    rc = -EACCES;
  else
    rc = write_into(target, data, len);
  free(target);
  return rc;
}
