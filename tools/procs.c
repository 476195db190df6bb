/*
 * procs.c -- how the gpureclaim command finds processes (docs/PROTOCOL.md): status files in the user's private
 * run directory and in the directories of their control sockets (the client of those sockets is sock.c).
 * Nothing of another user is read or triggered: only our own run directory is looked at, and a pid given
 * explicitly is checked against /proc first.
 */
#include "command.h"
#include "common.h"
#include "options.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
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

/* ---- run directories ----
 * A process's run directory is the one its environment named when it started (GPURECLAIM_RUNDIR, else
 * $XDG_RUNTIME_DIR/gpureclaim when that is its user's, else /tmp/gpureclaim-UID): one started by cron, Slurm,
 * nohup, su or systemd has another XDG_RUNTIME_DIR (or none) than the user's shell, so another directory. ps
 * reads the command's own and every directory where a live process of this user has its control socket
 * (/proc/net/unix lists bound socket paths) that the library's default rule names (.../gpureclaim,
 * /tmp/gpureclaim-UID); with GPURECLAIM_RUNDIR set, that one only. A pid given is also looked for in the
 * directory its own environment names, and in that of its socket. */

#define MAX_DIRS 32
static char g_dirs[MAX_DIRS][4200];
static size_t g_ndirs;

size_t cmd_rundirs_count(void) { return g_ndirs; }
const char *cmd_rundirs_at(size_t i) { return i < g_ndirs ? g_dirs[i] : ""; }

static bool have_dir(char (*dirs)[4200], size_t n, const char *dir) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(dirs[i], dir))
      return true;
  return false;
}

/* Whether pid runs and is this user's. */
static bool ours(pid_t pid) {
  char path[64];
  struct stat st;
  snprintf(path, sizeof path, "/proc/%d", (int)pid);
  return stat(path, &st) == 0 && st.st_uid == geteuid();
}

/* Whether dir is a directory the library's default rule names: DIR/gpureclaim, or /tmp/gpureclaim-UID. */
static bool default_named(const char *dir) {
  const char *base = strrchr(dir, '/');
  char own[64];
  snprintf(own, sizeof own, "gpureclaim-%u", (unsigned)geteuid());
  return base && (!strcmp(base + 1, "gpureclaim") || !strcmp(base + 1, own));
}

/* Calls fn(dir, pid, arg) for each socket path in /proc/net/unix that names a run directory's control socket
 * (DIR/PID.sock); with ninodes > 0, only for the sockets of those inodes. One pass over the file. */
static void each_socket(const unsigned long *inodes, size_t ninodes, void (*fn)(const char *dir, pid_t pid, void *arg),
                        void *arg) {
  FILE *f = fopen("/proc/net/unix", "re");
  if (!f)
    return;
  char line[4600];
  while (fgets(line, sizeof line, f)) {
    /* Num RefCount Protocol Flags Type St Inode Path */
    char *save = NULL, *tok = strtok_r(line, " \n", &save);
    unsigned long ino = 0;
    for (int k = 0; tok && k < 6; k++) {
      tok = strtok_r(NULL, " \n", &save);
      if (k == 5 && tok)
        ino = strtoul(tok, NULL, 10);
    }
    char *path = tok ? strtok_r(NULL, "\n", &save) : NULL;
    bool wanted = ninodes == 0;
    for (size_t i = 0; i < ninodes && !wanted; i++)
      wanted = inodes[i] == ino;
    if (!path || path[0] != '/' || !wanted)
      continue;
    char *slash = strrchr(path, '/'), *end;
    long pid = strtol(slash + 1, &end, 10);
    if (pid <= 0 || strcmp(end, ".sock") != 0 || slash == path)
      continue;
    *slash = '\0';
    fn(path, (pid_t)pid, arg);
  }
  fclose(f);
}

static void add_found_dir(const char *dir, pid_t pid, void *arg) {
  (void)arg;
  struct stat st;
  if (g_ndirs == MAX_DIRS || !default_named(dir) || have_dir(g_dirs, g_ndirs, dir) || !ours(pid) ||
      lstat(dir, &st) != 0 || !gr_dir_is_private(&st))
    return;
  snprintf(g_dirs[g_ndirs++], sizeof g_dirs[0], "%s", dir);
}

/* Fills g_dirs: the command's own run directory first (even when it does not exist yet), then the others. */
static void find_dirs(void) {
  g_ndirs = 0;
  snprintf(g_dirs[g_ndirs++], sizeof g_dirs[0], "%s", gr_opt()->rundir);
  if (!getenv("GPURECLAIM_RUNDIR"))
    each_socket(NULL, 0, add_found_dir, NULL);
}

/* The value of name in pid's environment as it started (/proc/PID/environ), in buf; NULL when absent. */
static const char *proc_env(pid_t pid, const char *name, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *env = malloc(cap);
  ssize_t r;
  while (env && (r = read(fd, env + n, cap - n - 1)) > 0) {
    n += (size_t)r;
    if (n + 1 == cap) {
      char *t = realloc(env, cap *= 2);
      if (!t) {
        free(env);
        env = NULL;
      }
      env = t;
    }
  }
  close(fd);
  if (!env)
    return NULL;
  env[n] = '\0';
  const char *found = NULL;
  size_t nl = strlen(name);
  for (size_t i = 0; i < n; i += strlen(env + i) + 1)
    if (!strncmp(env + i, name, nl) && env[i + nl] == '=') {
      snprintf(buf, len, "%s", env + i + nl + 1);
      found = buf;
      break;
    }
  free(env);
  return found;
}

/* The run directory pid's environment names, by the library's rule (options.c), in buf; NULL if unknown. */
static const char *env_rundir(pid_t pid, char *buf, size_t len) {
  char v[4096];
  if (proc_env(pid, "GPURECLAIM_RUNDIR", v, sizeof v))
    return v[0] == '/' ? (snprintf(buf, len, "%s", v), buf) : NULL;
  struct stat st;
  if (proc_env(pid, "XDG_RUNTIME_DIR", v, sizeof v) && v[0] == '/' && stat(v, &st) == 0 && st.st_uid == geteuid()) {
    snprintf(buf, len, "%s/gpureclaim", v);
    return buf;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  if (access(path, R_OK) != 0)
    return NULL;
  snprintf(buf, len, "/tmp/gpureclaim-%u", (unsigned)geteuid());
  return buf;
}

typedef struct {
  pid_t pid;
  char (*dirs)[4200];
  size_t *n;
} sock_dirs_t;

static void add_sock_dir(const char *dir, pid_t pid, void *arg) {
  sock_dirs_t *sd = arg;
  if (pid == sd->pid && *sd->n < 4 && !have_dir(sd->dirs, *sd->n, dir))
    snprintf(sd->dirs[(*sd->n)++], 4200, "%s", dir);
}

/* The run directories pid may have written its status file in, besides the command's own: the one its
 * environment names, and the directory of a control socket it holds open (its fds name the sockets' inodes). */
static size_t pid_dirs(pid_t pid, char (*dirs)[4200], size_t max) {
  size_t n = 0;
  char buf[4200];
  if (env_rundir(pid, buf, sizeof buf) && n < max)
    snprintf(dirs[n++], 4200, "%s", buf);
  char fdpath[64];
  snprintf(fdpath, sizeof fdpath, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(fdpath);
  struct dirent *e;
  unsigned long inodes[256];
  size_t ni = 0;
  while (d && (e = readdir(d)) && ni < 256) {
    char link[64 + sizeof e->d_name], target[64];
    snprintf(link, sizeof link, "%s/%s", fdpath, e->d_name);
    ssize_t l = readlink(link, target, sizeof target - 1);
    if (l <= 0)
      continue;
    target[l] = '\0';
    if (sscanf(target, "socket:[%lu]", &inodes[ni]) == 1)
      ni++;
  }
  if (ni && n < max) {
    sock_dirs_t sd = {pid, dirs, &n};
    each_socket(inodes, ni, add_sock_dir, &sd);
  }
  if (d)
    closedir(d);
  return n;
}

/* Adds the status files of dir to *v (n, cap); stale ones are removed, others' ignored (noted). */
static void list_dir(const char *dir, proc_t **v, size_t *n, size_t *cap) {
  DIR *d = opendir(dir);
  if (!d)
    return;
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
    bool dup = false; /* one process, one row: a pid listed from an earlier directory is not listed again */
    for (size_t i = 0; i < *n && !dup; i++)
      dup = (*v)[i].pid == (pid_t)pid;
    if (dup)
      continue;
    if (*n == *cap) {
      proc_t *t = realloc(*v, (*cap = *cap ? 2 * *cap : 16) * sizeof **v);
      if (!t)
        break;
      *v = t;
    }
    proc_t *p = &(*v)[*n];
    int r = load(dir, (pid_t)pid, p);
    if (r == LOAD_OK) {
      (*n)++;
    } else if (r == LOAD_FOREIGN) {
      char who[64];
      cmd_note("ignoring the status file of pid %ld: it belongs to %s, not you", pid,
               user_name(p->foreign_uid, who, sizeof who));
    } else if (r == LOAD_UNREADABLE) {
      cmd_note("ignoring %s/%s: not a valid status file", dir, e->d_name);
    } else if (r == LOAD_NOT_REGULAR) {
      cmd_note("ignoring %s/%s: not a regular file (a FIFO, link, device or directory)", dir, e->d_name);
    }
  }
  closedir(d);
}

size_t cmd_list(proc_t **out) {
  *out = NULL;
  find_dirs();
  const char *own = cmd_rundir(true);
  if (!own && cmd_rundir_refused())
    return 0;
  size_t n = 0, cap = 0;
  proc_t *v = NULL;
  for (size_t i = 0; i < g_ndirs; i++)
    if (i > 0 || own)
      list_dir(g_dirs[i], &v, &n, &cap);
  *out = v;
  return n;
}

size_t cmd_descendants(pid_t pid, pid_t *out, size_t max) {
  /* Every process's parent, from /proc/PID/stat (field 4), then the tree below pid, breadth first. */
  size_t cap = 1024, np = 0;
  pid_t(*pp)[2] = malloc(cap * sizeof *pp);
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (pp && d && (e = readdir(d))) {
    char *end;
    long p = strtol(e->d_name, &end, 10);
    if (p <= 0 || *end)
      continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", p);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
      continue;
    buf[r] = '\0';
    const char *q = strrchr(buf, ')');
    long ppid;
    if (!q || sscanf(q + 1, " %*c %ld", &ppid) != 1)
      continue;
    if (np == cap) {
      pid_t(*t)[2] = realloc(pp, (cap *= 2) * sizeof *pp);
      if (!t)
        break;
      pp = t;
    }
    pp[np][0] = (pid_t)p;
    pp[np++][1] = (pid_t)ppid;
  }
  if (d)
    closedir(d);
  size_t n = 0;
  for (size_t i = 0; pp && i < np && n < max; i++) /* its children, then theirs (out grows as it is read) */
    if (pp[i][1] == pid)
      out[n++] = pp[i][0];
  for (size_t k = 0; pp && k < n; k++)
    for (size_t i = 0; i < np && n < max; i++)
      if (pp[i][1] == out[k])
        out[n++] = pp[i][0];
  free(pp);
  return n;
}

/* Whether libgpureclaim is mapped in pid (preloaded or linked): 1 yes, 0 no, -1 unknown (maps unreadable). */
static int maps_gpureclaim(pid_t pid) {
  char path[64], line[4400];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f)
    return -1;
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, "/libgpureclaim.so") != NULL;
  fclose(f);
  return found;
}

/* Why pid, which runs and is ours, has no status file in any directory tried (dirs), in words. */
static void why_not_running(pid_t pid, char (*dirs)[4200], size_t ndirs, char *buf, size_t len) {
  char v[64];
  int mapped = maps_gpureclaim(pid);
  bool yes = false;
  if (mapped == 0) {
    snprintf(buf, len, "libgpureclaim is not loaded in it: start it with gpureclaim run");
  } else if (proc_env(pid, "GPURECLAIM_DISABLE", v, sizeof v) && !gr_opt_parse_bool(v, &yes) && yes) {
    snprintf(buf, len, "gpureclaim is disabled in it (GPURECLAIM_DISABLE=%s)", v);
  } else if (proc_env(pid, "GPURECLAIM_STATUS", v, sizeof v) && !gr_opt_parse_bool(v, &yes) && !yes) {
    snprintf(buf, len, "it runs with GPURECLAIM_STATUS=%s: no status file, no control socket (its release signal "
                       "still reaches it)", v);
  } else {
    size_t l = (size_t)snprintf(buf, len, "no status file in ");
    for (size_t i = 0; i < ndirs && l < len; i++)
      l += (size_t)snprintf(buf + l, len - l, "%s%.300s", i ? (i + 1 == ndirs ? " or " : ", ") : "", dirs[i]);
    if (l < len)
      snprintf(buf + l, len - l, mapped == 1 ? ": it has not initialised CUDA yet, or its run directory was refused "
                                               "(its standard error says so)"
                                             : ": started without it, not yet using CUDA, or with GPURECLAIM_STATUS=0");
  }
}

/* "; its child processes 1234 (python3 train.py) and 1235 run gpureclaim: gpureclaim release --tree PID ..."
 * when a descendant of pid has a status file (a launcher: torchrun, accelerate, a shell script). */
static void children_hint(pid_t pid, char *buf, size_t len) {
  buf[0] = '\0';
  pid_t kids[256];
  size_t nk = cmd_descendants(pid, kids, 256), shown = 0, l = 0;
  for (size_t i = 0; i < nk && shown < 4; i++) {
    proc_t c;
    if (cmd_find_quiet(kids[i], &c) != EX_OK)
      continue;
    char cmdline[64];
    cmd_program_of(&c, cmdline, sizeof cmdline);
    l += (size_t)snprintf(buf + l, l < len ? len - l : 0, "%s%d (%s)", shown ? ", " : "; its child process ",
                          (int)kids[i], cmdline);
    shown++;
    cmd_free(&c);
  }
  if (shown && l < len)
    snprintf(buf + l, len - l, " run%s gpureclaim: --tree acts on %d and every process under it",
             shown == 1 ? "s" : "", (int)pid);
}

/* cmd_find()'s search, printing nothing: 0, EX_FAILED (run directory refused), EX_NOPROC; out->error says why
 * (without the children hint). */
static int find(pid_t pid, proc_t *out, bool quiet) {
  uid_t uid = 0;
  char who[64];
  memset(out, 0, sizeof *out);
  out->pid = pid;
  if (pid <= 0 || !proc_start(pid, &uid)) {
    /* A process gone leaves its status file and socket when it was killed: removed here as ps removes them
     * (load() finds the pid running nothing). */
    const char *dir = pid > 0 && !quiet ? cmd_rundir(false) : NULL;
    if (dir) {
      proc_t gone;
      load(dir, pid, &gone);
      cmd_free(&gone);
    }
    memset(out, 0, sizeof *out);
    out->pid = pid;
    snprintf(out->error, sizeof out->error, "no such process: %d", (int)pid);
    return EX_NOPROC;
  }
  if (uid != geteuid()) {
    snprintf(out->error, sizeof out->error, "process %d belongs to %s: refused", (int)pid,
             user_name(uid, who, sizeof who));
    return EX_NOPROC;
  }
  const char *dir = cmd_rundir(quiet);
  if (!dir && cmd_rundir_refused()) {
    /* cmd_rundir() said why. Not "not running gpureclaim" (exit 3): nobody can tell, and --help says a refused
     * run directory is exit 1, as ps and release --all have it. */
    snprintf(out->error, sizeof out->error, "the run directory %.300s is refused (not private to you)",
             gr_opt()->rundir);
    return EX_FAILED;
  }
  /* The command's own run directory, then the process's own (another XDG_RUNTIME_DIR: cron, Slurm, nohup,
   * su, systemd), as its environment and its control socket name it. */
  char dirs[6][4200];
  size_t nd = 0;
  snprintf(dirs[nd++], sizeof dirs[0], "%s", gr_opt()->rundir);
  int r = dir ? load(dirs[0], pid, out) : LOAD_ABSENT;
  if (r == LOAD_ABSENT) { /* not in ours: where its environment and its socket say */
    char more[4][4200];
    size_t nm = pid_dirs(pid, more, 4);
    for (size_t i = 0; i < nm; i++) {
      struct stat st;
      if (!have_dir(dirs, nd, more[i]) && lstat(more[i], &st) == 0 && gr_dir_is_private(&st))
        memcpy(dirs[nd++], more[i], sizeof dirs[0]);
    }
    for (size_t i = 1; i < nd && r == LOAD_ABSENT; i++)
      r = load(dirs[i], pid, out);
  }
  if (r == LOAD_FOREIGN) {
    snprintf(out->error, sizeof out->error, "the status file of process %d says it belongs to %s: refused",
             (int)pid, user_name(out->foreign_uid, who, sizeof who));
  } else if (r == LOAD_UNREADABLE) {
    snprintf(out->error, sizeof out->error, "the status file of process %d (%.300s) is not a valid status file",
             (int)pid, out->path);
  } else if (r == LOAD_NOT_REGULAR) {
    snprintf(out->error, sizeof out->error, "the status file of process %d (%.300s) is not a regular file (a FIFO, "
             "link, device or directory): refused", (int)pid, out->path);
  } else if (r != LOAD_OK) {
    char why[1200];
    why_not_running(pid, dirs, nd, why, sizeof why);
    snprintf(out->error, sizeof out->error, "process %d is not running gpureclaim: %s", (int)pid, why);
  }
  return r == LOAD_OK ? EX_OK : EX_NOPROC;
}

int cmd_find_quiet(pid_t pid, proc_t *out) { return find(pid, out, true); }

int cmd_find(pid_t pid, proc_t *out) {
  int rc = find(pid, out, false);
  if (rc == EX_NOPROC && !strncmp(out->error, "process ", 8) && strstr(out->error, "is not running gpureclaim")) {
    char hint[600];
    children_hint(pid, hint, sizeof hint);
    size_t l = strlen(out->error);
    snprintf(out->error + l, sizeof out->error - l, "%s", hint);
  }
  if (rc != EX_OK && rc != EX_FAILED)
    fprintf(stderr, "gpureclaim: %s\n", out->error);
  return rc;
}

bool cmd_exiting(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return true; /* gone */
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return true;
  buf[n] = '\0';
  const char *q = strrchr(buf, ')');
  unsigned long flags = 0;
  /* after the command: state ppid pgrp session tty_nr tpgid flags */
  if (!q || sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
    return false;
  return (flags & 0x4) != 0; /* PF_EXITING */
}

bool cmd_alive(const proc_t *p) {
  int64_t ticks = jint(p->status, "start_ticks", 0);
  return ticks > 0 && proc_start(p->pid, NULL) == (uint64_t)ticks;
}

void cmd_free(proc_t *p) {
  if (p->status) {
    jdelete(p->status);
  }
  p->status = NULL;
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
