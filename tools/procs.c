/*
 * procs.c -- how the gpureclaim command finds and reaches processes (docs/PROTOCOL.md): status files in the
 * user's private run directory, the control socket, the signal. Nothing of another user is read or triggered:
 * only our own run directory is looked at, and a pid given explicitly is checked against /proc first.
 */
#include "command.h"
#include "common.h"
#include "options.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static bool g_rundir_refused;

static void (*g_note_sink)(const char *, void *);
static void *g_note_arg;

void cmd_set_note_sink(void (*sink)(const char *note, void *arg), void *arg) {
  g_note_sink = sink;
  g_note_arg = arg;
}

void cmd_note(const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (g_note_sink)
    g_note_sink(text, g_note_arg);
  else
    fprintf(stderr, "gpureclaim: %s\n", text);
}

bool cmd_rundir_refused(void) { return g_rundir_refused; }

void cmd_rundir_fix(const char *dir, const struct stat *st, char *buf, size_t len) {
  if (S_ISLNK(st->st_mode))
    snprintf(buf, len, "it is a symbolic link; name the directory itself");
  else if (!S_ISDIR(st->st_mode))
    snprintf(buf, len, "it is not a directory; remove it (rm %s) or set GPURECLAIM_RUNDIR to a directory of yours", dir);
  else if (st->st_uid != geteuid())
    snprintf(buf, len, "it belongs to uid %u; set GPURECLAIM_RUNDIR to a directory of yours (mode 0700)",
             (unsigned)st->st_uid);
  else
    snprintf(buf, len, "fix it with chmod 700 %s", dir);
}

const char *cmd_rundir(bool quiet) {
  const char *dir = gr_opt()->rundir;
  struct stat st;
  if (lstat(dir, &st) != 0) {
    if (!quiet && errno != ENOENT)
      cmd_note("cannot read %s: %s", dir, strerror(errno));
    return NULL; /* no process has used it yet */
  }
  /* The library's rule (docs/PROTOCOL.md): a directory someone else owns or can write could hold status files
   * and sockets planted to make us signal or trust the wrong process. */
  if (!gr_dir_is_private(&st)) {
    if (!g_rundir_refused) {
      char fix[300];
      cmd_rundir_fix(dir, &st, fix, sizeof fix);
      cmd_note("%s is not a directory private to you (owner uid %u, mode %04o; expected uid %u, mode 0700); "
               "refusing to use it: %s",
               dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid(), fix);
    }
    g_rundir_refused = true;
    return NULL;
  }
  return dir;
}

/* The whole of a regular file, or NULL (errno set; EINVAL: not a regular file). Never waits: a FIFO, device or
 * directory put in the run directory under a status file's name is refused, not opened for reading (a FIFO
 * nobody writes would hang ps, top and release for good), and a link is not followed. */

/* Whether pid is a zombie whose threads are all gone (an exited process its parent has not reaped). A main
 * thread that called pthread_exit() is a zombie too, while the process's other threads still run. */
static bool reaped_only(pid_t pid, const char *stat_text) {
  const char *p = strrchr(stat_text, ')');
  if (!p || p[1] != ' ' || p[2] != 'Z')
    return false;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  char *s = gr_read_file(path);
  const char *t = s ? strstr(s, "\nThreads:") : NULL;
  bool gone = !t || strtol(t + 9, NULL, 10) <= 1;
  free(s);
  return gone;
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks), 0 if unknown or the process has exited (a zombie);
 * *uid the owner. */
static uint64_t proc_start(pid_t pid, uid_t *uid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  struct stat st;
  if (stat(path, &st) != 0)
    return 0;
  if (uid)
    *uid = st.st_uid;
  char *s = gr_read_file(path);
  if (!s)
    return 0;
  if (reaped_only(pid, s)) {
    free(s);
    return 0;
  }
  uint64_t v = gr_stat_start_ticks(s);
  free(s);
  return v;
}

jnode_t *cmd_read_status(const proc_t *p) {
  char *text = gr_read_file(p->path);
  if (!text)
    return NULL;
  jnode_t *j = jparse(text, NULL);
  free(text);
  return j;
}

/* Whether pid now runs another program than the one whose status file says `recorded` (its exe): the process
 * exec'd since it wrote the file, keeping its pid and start time, and the gpureclaim that wrote it is gone.
 * Only a clear difference counts, as the files of a live gpureclaim process would be removed: not when either
 * path is unknown, when the recorded one lost bytes to JSON (U+FFFD), or when the process is in another mount
 * namespace (a container sees other paths); a binary replaced since it started reads "PATH (deleted)". */
static bool exec_since(pid_t pid, const char *recorded) {
  static const char deleted[] = " (deleted)";
  char path[64], self_ns[64] = "", ns[64] = "", exe[4200];
  if (!*recorded || strstr(recorded, "\xef\xbf\xbd"))
    return false;
  snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
  ssize_t a = readlink("/proc/self/ns/mnt", self_ns, sizeof self_ns - 1), b = readlink(path, ns, sizeof ns - 1);
  if (a <= 0 || b <= 0 || a != b || memcmp(self_ns, ns, (size_t)a) != 0)
    return false;
  snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
  ssize_t n = readlink(path, exe, sizeof exe - 1);
  if (n <= 0)
    return false;
  exe[n] = '\0';
  size_t dl = sizeof deleted - 1, rl = strlen(recorded), el = (size_t)n;
  if (rl > dl && !strcmp(recorded + rl - dl, deleted))
    rl -= dl;
  if (el > dl && !strcmp(exe + el - dl, deleted))
    el -= dl;
  return rl != el || memcmp(recorded, exe, rl) != 0;
}

/* The address of pid's AT_RANDOM bytes, from /proc/<pid>/auxv (readable for our own processes); 0 if unknown. */
static uint64_t auxv_random(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/auxv", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  unsigned long av[2 * 64];
  ssize_t n = read(fd, av, sizeof av);
  close(fd);
  for (ssize_t i = 0; n > 0 && (i + 2) * (ssize_t)sizeof av[0] <= n && av[i] != AT_NULL; i += 2)
    if (av[i] == AT_RANDOM)
      return av[i + 1];
  return 0;
}

/* Whether pid exec'd since its status file was written: exec keeps the pid and the start time, and when the
 * new image is the same binary its exe is the same too; but every exec places the AT_RANDOM bytes anew
 * (address-space randomisation), and the library records where (exec_id). Unknown (no field, an older
 * library, or auxv unreadable): false. */
static bool exec_id_changed(pid_t pid, const jnode_t *status) {
  const jnode_t *id = jget(status, "exec_id");
  if (!id || id->type != JN_NUM || id->num <= 0)
    return false;
  uint64_t now = auxv_random(pid);
  return now && (double)now != id->num;
}

static void remove_stale(const char *dir, pid_t pid, const char *why) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)pid);
  unlink(path);
  snprintf(path, sizeof path, "%s/%d.sock", dir, (int)pid);
  unlink(path);
  cmd_note("removed the stale status file of pid %d (%s)", (int)pid, why);
}

/* Loads pid's status file from dir: LOAD_OK, or why not (stale files are removed on the way). */
enum { LOAD_OK = 0, LOAD_ABSENT, LOAD_STALE, LOAD_UNREADABLE, LOAD_FOREIGN, LOAD_NOT_REGULAR };

static int load(const char *dir, pid_t pid, proc_t *out) {
  memset(out, 0, sizeof *out);
  out->pid = pid;
  snprintf(out->path, sizeof out->path, "%s/%d.json", dir, (int)pid);
  struct stat st;
  if (lstat(out->path, &st) != 0)
    return LOAD_ABSENT;
  out->status = S_ISREG(st.st_mode) ? cmd_read_status(out) : NULL; /* nothing else is even opened */
  uint64_t ticks = proc_start(pid, NULL);
  if (!ticks) {
    remove_stale(dir, pid, "the process is gone");
    cmd_free(out);
    return LOAD_STALE;
  }
  /* start_ticks names the process the file was written by: a file without it could be about any process that
   * has the pid now, and is never acted on (below). */
  if (out->status && jint(out->status, "start_ticks", 0) && (uint64_t)jint(out->status, "start_ticks", 0) != ticks) {
    remove_stale(dir, pid, "the pid now belongs to another program");
    cmd_free(out);
    return LOAD_STALE;
  }
  if (!S_ISREG(st.st_mode)) {
    cmd_free(out);
    return LOAD_NOT_REGULAR;
  }
  if (!out->status) { /* being rewritten right now: one retry */
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    out->status = cmd_read_status(out);
  }
  if (!out->status || !S_ISREG(st.st_mode) || jint(out->status, "pid", -1) != pid ||
      jint(out->status, "start_ticks", 0) <= 0 || jint(out->status, "uid", -1) < 0) {
    cmd_free(out);
    return LOAD_UNREADABLE;
  }
  /* A file in our private directory that claims another user's process is never acted on. */
  int64_t uid = jint(out->status, "uid", -1);
  if (st.st_uid != geteuid() || (uid >= 0 && (uid_t)uid != geteuid())) {
    out->foreign_uid = uid >= 0 ? (uid_t)uid : st.st_uid;
    cmd_free(out);
    return LOAD_FOREIGN;
  }
  /* Same pid, same start time, another program: exec keeps both, and the new program may not run gpureclaim
   * at all (its release signal would then kill it). */
  if (exec_since(pid, jstr(out->status, "exe", ""))) {
    remove_stale(dir, pid, "the process now runs another program (exec)");
    cmd_free(out);
    return LOAD_STALE;
  }
  if (exec_id_changed(pid, out->status)) {
    remove_stale(dir, pid, "the process exec'd since it wrote it");
    cmd_free(out);
    return LOAD_STALE;
  }
  return LOAD_OK;
}

/* The system's boot time (CLOCK_REALTIME seconds), from /proc/stat; 0 if unknown. */
static long long boot_time(void) {
  char *s = gr_read_file("/proc/stat");
  const char *b = s ? strstr(s, "\nbtime ") : NULL;
  long long v = b ? strtoll(b + 7, NULL, 10) : 0;
  free(s);
  return v;
}

/* Whether the writer of a temporary file last modified at mtime is gone: the pid runs nothing, or a process
 * that started after the file was written (the pid was reused). */
static bool writer_gone(pid_t pid, time_t mtime) {
  uint64_t ticks = proc_start(pid, NULL);
  if (!ticks)
    return true;
  long long boot = boot_time(), hz = sysconf(_SC_CLK_TCK);
  /* Two seconds of slack: btime is rounded, and the start time counts in clock ticks. */
  return boot > 0 && hz > 0 && boot + (long long)(ticks / (uint64_t)hz) > (long long)mtime + 2;
}

/* A temporary status file (outfile.c names them PATH.PID.TID.N.tmp, here "<pid>.json.<pid>.<tid>.<n>.tmp") that
 * a process left when it was killed mid-write: removed once its writer is gone. */
static void remove_stale_temp(const char *dir, const char *name) {
  char *end;
  long owner = strtol(name, &end, 10), tid, n;
  if (owner <= 0 || strncmp(end, ".json.", 6) != 0)
    return;
  long writer = strtol(end + 6, &end, 10);
  if (writer <= 0 || *end != '.' || (tid = strtol(end + 1, &end, 10)) <= 0 || *end != '.' ||
      (n = strtol(end + 1, &end, 10)) < 0 || strcmp(end, ".tmp") != 0)
    return;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct stat st;
  if (lstat(path, &st) != 0 || !writer_gone((pid_t)writer, st.st_mtime))
    return;
  if (unlink(path) == 0)
    cmd_note("removed %s, a temporary file of pid %ld, which is gone", path, writer);
}

static const char *user_name(uid_t uid, char *buf, size_t len) {
  struct passwd *pw = getpwuid(uid);
  if (pw)
    snprintf(buf, len, "%s", pw->pw_name);
  else
    snprintf(buf, len, "uid %u", (unsigned)uid);
  return buf;
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
    if (pid > 0 && !strncmp(end, ".json.", 6)) {
      remove_stale_temp(dir, e->d_name);
      continue;
    }
    if (pid <= 0 || strcmp(end, ".json") != 0)
      continue;
    if (n == cap) {
      proc_t *t = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
      if (!t)
        break;
      v = t;
    }
    int r = load(dir, (pid_t)pid, &v[n]);
    if (r == LOAD_OK) {
      n++;
    } else if (r == LOAD_FOREIGN) {
      char who[64];
      cmd_note("ignoring the status file of pid %ld: it belongs to %s, not you", pid,
              user_name(v[n].foreign_uid, who, sizeof who));
    } else if (r == LOAD_UNREADABLE) {
      cmd_note("ignoring %s/%s: not a valid status file", dir, e->d_name);
    } else if (r == LOAD_NOT_REGULAR) {
      cmd_note("ignoring %s/%s: not a regular file (a FIFO, link, device or directory)", dir,
              e->d_name);
    }
  }
  closedir(d);
  *out = v;
  return n;
}

/* Records why pid was not found in out->error and prints it. */
__attribute__((format(printf, 2, 3))) static void not_found(proc_t *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->error, sizeof out->error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "gpureclaim: %s\n", out->error);
}

int cmd_find(pid_t pid, proc_t *out) {
  uid_t uid = 0;
  char who[64];
  memset(out, 0, sizeof *out);
  out->pid = pid;
  if (pid <= 0 || !proc_start(pid, &uid)) {
    /* A process gone leaves its status file and socket when it was killed: removed here as ps removes them
     * (load() finds the pid running nothing). */
    const char *dir = pid > 0 ? cmd_rundir(false) : NULL;
    if (dir) {
      proc_t gone;
      load(dir, pid, &gone);
      cmd_free(&gone);
    }
    memset(out, 0, sizeof *out);
    out->pid = pid;
    not_found(out, "no such process: %d", (int)pid);
    return EX_NOPROC;
  }
  if (uid != geteuid()) {
    not_found(out, "process %d belongs to %s: refused", (int)pid, user_name(uid, who, sizeof who));
    return EX_NOPROC;
  }
  const char *dir = cmd_rundir(false);
  if (!dir && cmd_rundir_refused()) {
    /* cmd_rundir() said why. Not "not running gpureclaim" (exit 3): nobody can tell, and --help says a refused
     * run directory is exit 1, as ps and release --all have it. */
    snprintf(out->error, sizeof out->error, "the run directory %.300s is refused (not private to you)",
             gr_opt()->rundir);
    return EX_FAILED;
  }
  int r = dir ? load(dir, pid, out) : LOAD_ABSENT;
  if (r == LOAD_FOREIGN) {
    not_found(out, "the status file of process %d says it belongs to %s: refused", (int)pid,
              user_name(out->foreign_uid, who, sizeof who));
  } else if (r == LOAD_UNREADABLE) {
    not_found(out, "the status file of process %d (%.300s) is not a valid status file", (int)pid, out->path);
  } else if (r == LOAD_NOT_REGULAR) {
    not_found(out, "the status file of process %d (%.300s) is not a regular file (a FIFO, link, device or "
              "directory): refused", (int)pid, out->path);
  } else if (r != LOAD_OK) {
    not_found(out,
              "process %d is not running gpureclaim (no status file in %.200s: started without it, not yet using "
              "CUDA, or with GPURECLAIM_STATUS=0)",
              (int)pid, gr_opt()->rundir);
  }
  return r == LOAD_OK ? EX_OK : EX_NOPROC;
}

bool cmd_alive(const proc_t *p) {
  int64_t ticks = jint(p->status, "start_ticks", 0);
  return ticks > 0 && proc_start(p->pid, NULL) == (uint64_t)ticks;
}

int cmd_connect_check(const proc_t *p) {
  const char *sock = jstr(p->status, "socket", NULL);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (!sock || strlen(sock) >= sizeof sa.sun_path)
    return 1;
  strcpy(sa.sun_path, sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -errno;
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : -errno;
  close(fd); /* the server reads end of file at once, and drops the connection */
  return rc;
}

void cmd_free(proc_t *p) {
  if (p->status) {
    jdelete(p->status);
  }
  p->status = NULL;
}

/* Seconds left until deadline (CLOCK_MONOTONIC), as a poll timeout in milliseconds; 0 once it passed. */
const char cmd_why_timed_out[] = "timed out waiting for its answer";

jnode_t *cmd_ask(const proc_t *p, const char *request, double timeout, const char **why, bool *no_listener) {
  if (no_listener)
    *no_listener = false;
  const char *sock = jstr(p->status, "socket", NULL);
  if (!sock) {
    *why = "the process has no control socket";
    if (no_listener)
      *no_listener = true;
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
  /* The whole exchange, connect included, shares one deadline: a process that stopped serving (stopped with
   * SIGSTOP, stuck in a release) must not hold the command longer than --timeout. */
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += (time_t)timeout;
  deadline.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  struct timeval tv = {(time_t)timeout, (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds a connect to a full backlog */
  char line[300];
  snprintf(line, sizeof line, "%s\n", request);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    *why = e == EAGAIN || e == EINPROGRESS ? "timed out connecting to its control socket" : strerror(e);
    if (no_listener)
      *no_listener = e == ENOENT || e == ECONNREFUSED;
    close(fd);
    return NULL;
  }
  if (write(fd, line, strlen(line)) < 0) {
    *why = strerror(errno);
    close(fd);
    return NULL;
  }
  size_t cap = 65536, n = 0;
  char *buf = malloc(cap);
  bool timed_out = false;
  while (buf) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int wait = gr_ms_until(&deadline);
    int pr = wait ? poll(&pfd, 1, wait) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr == 0) {
      timed_out = true;
      break;
    }
    ssize_t r = pr < 0 ? -1 : read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
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
  if (!buf) {
    *why = "out of memory";
    return NULL;
  }
  if (timed_out || n == 0) {
    *why = timed_out ? cmd_why_timed_out : "it closed the connection without answering";
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  const char *perr = NULL;
  jnode_t *j = jparse_object(buf, &perr);
  free(buf);
  if (!j)
    *why = "its answer is not a JSON object";
  return j;
}

const char *cmd_command_of(const proc_t *p, char *buf, size_t len) {
  const char *c = jstr(p->status, "cmdline", "");
  if (!*c)
    c = jstr(p->status, "exe", "?");
  if (cmd_json_out() || !len)
    return c;
  /* Columns are narrow: every path among the words keeps only its file name ("python3 train.py --steps 5"),
   * options keep their values whole. */
  size_t used = 0;
  buf[0] = '\0';
  for (const char *w = c; *w && used + 1 < len;) {
    size_t n = strcspn(w, " ");
    const char *start = w;
    if (*w != '-')
      for (size_t k = 0; k + 1 < n; k++)
        if (w[k] == '/')
          start = w + k + 1;
    used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? " " : "", (int)(n - (size_t)(start - w)),
                             start);
    w += n;
    while (*w == ' ')
      w++;
  }
  return cmd_printable(buf);
}

void cmd_program_of(const proc_t *p, char *buf, size_t len) {
  const char *c = jstr(p->status, "cmdline", "");
  if (!*c)
    c = jstr(p->status, "exe", "?");
  size_t n = strcspn(c, " ");
  const char *base = c;
  for (size_t i = 0; i < n; i++)
    if (c[i] == '/')
      base = c + i + 1;
  snprintf(buf, len, "%.*s", (int)(n - (size_t)(base - c)), base);
}

#define AT_ONCE 32

typedef struct {
  void (*fn)(void *item);
  void *item;
} call_t;

static void *call_one(void *arg) {
  call_t *c = arg;
  c->fn(c->item);
  return NULL;
}

void cmd_each_at_once(void *items, size_t n, size_t stride, void (*fn)(void *item)) {
  for (size_t first = 0; first < n; first += AT_ONCE) {
    pthread_t th[AT_ONCE];
    call_t calls[AT_ONCE];
    bool started[AT_ONCE] = {false};
    size_t end = first + AT_ONCE < n ? first + AT_ONCE : n;
    for (size_t i = first; i < end; i++) {
      calls[i - first] = (call_t){fn, (char *)items + i * stride};
      if (!(started[i - first] = pthread_create(&th[i - first], NULL, call_one, &calls[i - first]) == 0))
        fn(calls[i - first].item);
    }
    for (size_t i = first; i < end; i++)
      if (started[i - first])
        pthread_join(th[i - first], NULL);
  }
}
