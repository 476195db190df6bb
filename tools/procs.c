/*
 * procs.c -- how the gpureclaim command finds and reaches processes (docs/PROTOCOL.md): status files in the
 * user's private run directory, the control socket, the signal. Nothing of another user is read or triggered:
 * only our own run directory is looked at, and a pid given explicitly is checked against /proc first.
 */
#include "command.h"
#include "gpureclaim_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

const char *cmd_rundir(bool quiet) {
  const char *dir = gr_opt()->rundir;
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (!quiet && errno != ENOENT)
      fprintf(stderr, "gpureclaim: cannot read %s: %s\n", dir, strerror(errno));
    return NULL; /* no process has used it yet */
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    fprintf(stderr, "gpureclaim: %s is not a directory private to you (mode 0700); refusing to use it\n", dir);
    return NULL;
  }
  return dir;
}

static char *read_all(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
    n += (size_t)r;
    if (n + 1 == cap) {
      char *t = realloc(buf, cap *= 2);
      if (!t) {
        free(buf);
        buf = NULL;
      } else {
        buf = t;
      }
    }
  }
  close(fd);
  if (buf)
    buf[n] = '\0';
  return buf;
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks), 0 if unknown; *uid the owner. */
static uint64_t proc_start(pid_t pid, uid_t *uid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  struct stat st;
  if (stat(path, &st) != 0)
    return 0;
  if (uid)
    *uid = st.st_uid;
  char *s = read_all(path);
  if (!s)
    return 0;
  const char *p = strrchr(s, ')');
  for (int field = 2; field < 22 && p; field++)
    p = strchr(p + 1, ' ');
  uint64_t v = p ? strtoull(p + 1, NULL, 10) : 0;
  free(s);
  return v;
}

jnode_t *cmd_read_status(const proc_t *p) {
  char *text = read_all(p->path);
  if (!text)
    return NULL;
  jnode_t *j = jparse(text, NULL);
  free(text);
  return j;
}

static void remove_stale(const char *dir, pid_t pid, const char *why) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)pid);
  unlink(path);
  snprintf(path, sizeof path, "%s/%d.sock", dir, (int)pid);
  unlink(path);
  fprintf(stderr, "gpureclaim: removed the stale status file of pid %d (%s)\n", (int)pid, why);
}

/* Loads pid's status file from dir; 0, or -1 when absent or stale (removed). */
static int load(const char *dir, pid_t pid, proc_t *out) {
  memset(out, 0, sizeof *out);
  out->pid = pid;
  snprintf(out->path, sizeof out->path, "%s/%d.json", dir, (int)pid);
  struct stat st;
  if (lstat(out->path, &st) != 0)
    return -1;
  out->status = cmd_read_status(out);
  uint64_t ticks = proc_start(pid, NULL);
  if (!ticks) {
    remove_stale(dir, pid, "the process is gone");
    cmd_free(out);
    return -1;
  }
  if (out->status && jint(out->status, "start_ticks", 0) && (uint64_t)jint(out->status, "start_ticks", 0) != ticks) {
    remove_stale(dir, pid, "the pid now belongs to another program");
    cmd_free(out);
    return -1;
  }
  if (!out->status) { /* being rewritten right now: one retry */
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    out->status = cmd_read_status(out);
  }
  return out->status ? 0 : -1;
}

size_t cmd_list(proc_t **out) {
  *out = NULL;
  const char *dir = cmd_rundir(true);
  if (!dir)
    return 0;
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  size_t n = 0, cap = 0;
  proc_t *v = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || strcmp(end, ".json") != 0)
      continue;
    if (n == cap) {
      proc_t *t = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
      if (!t)
        break;
      v = t;
    }
    if (load(dir, (pid_t)pid, &v[n]) == 0)
      n++;
  }
  closedir(d);
  *out = v;
  return n;
}

int cmd_find(pid_t pid, proc_t *out) {
  uid_t uid = 0;
  if (pid <= 0 || !proc_start(pid, &uid)) {
    fprintf(stderr, "gpureclaim: no such process: %d\n", (int)pid);
    return EX_NOPROC;
  }
  if (uid != geteuid()) {
    struct passwd *pw = getpwuid(uid);
    fprintf(stderr, "gpureclaim: process %d belongs to user %s: refused\n", (int)pid,
            pw ? pw->pw_name : "another user");
    return EX_NOPROC;
  }
  const char *dir = cmd_rundir(false);
  if (!dir || load(dir, pid, out) != 0) {
    fprintf(stderr,
            "gpureclaim: process %d is not running gpureclaim (no status file in %s: started without it, "
            "not yet using CUDA, or with GPURECLAIM_STATUS=0)\n",
            (int)pid, gr_opt()->rundir);
    return EX_NOPROC;
  }
  return EX_OK;
}

void cmd_free(proc_t *p) {
  if (p->status) {
    jfree(p->status);
    free(p->status);
  }
  p->status = NULL;
}

jnode_t *cmd_ask(const proc_t *p, const char *request, double timeout, const char **why) {
  const char *sock = jstr(p->status, "socket", NULL);
  if (!sock) {
    *why = "the process has no control socket";
    return NULL;
  }
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(sock) >= sizeof sa.sun_path) {
    *why = "socket path too long";
    return NULL;
  }
  strcpy(sa.sun_path, sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = strerror(errno);
    return NULL;
  }
  struct timeval tv = {(time_t)timeout, (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char line[300];
  snprintf(line, sizeof line, "%s\n", request);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || write(fd, line, strlen(line)) < 0) {
    *why = strerror(errno);
    close(fd);
    return NULL;
  }
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
    n += (size_t)r;
    if (n + 1 == cap) {
      char *t = realloc(buf, cap *= 2);
      if (!t) {
        free(buf);
        buf = NULL;
      } else {
        buf = t;
      }
    }
  }
  int e = errno;
  close(fd);
  if (!buf || n == 0) {
    *why = n == 0 && (e == EAGAIN || e == EWOULDBLOCK) ? "timed out" : "no answer";
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  jnode_t *j = jparse(buf, why);
  free(buf);
  return j;
}

/* ---- formatting ---- */

static bool g_json;
bool cmd_json_out(void) { return g_json; }
void cmd_set_json(bool on) { g_json = on; }

const char *cmd_bytes(uint64_t v, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double x = (double)v;
  int i = 0;
  while (x >= 1024 && i < 5) {
    x /= 1024;
    i++;
  }
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", x, u[i]);
  return buf;
}
