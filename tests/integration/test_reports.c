/* What gpureclaim writes: snapshots, leak reports (API, at exit, with backtraces), the status file, the
 * control socket. JSON is checked by parsing it back with python3's json module. */
#include "harness.h"

#include "../common/threads.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <linux/capability.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice); /* cuda.h maps cuCtxCreate to a later version */

static CUcontext g_ctx;
static void init(void) { g_ctx = h_cuda_start(0); }
TestSuite(reports, .init = init);

/* Runs a python3 snippet on a file; returns its exit status. The checker runs without the test's preload
 * (gpureclaim, and in sanitizer builds the sanitizer runtimes, whose leak check would fail CPython's exit). */
static int py(const char *code, const char *path) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD python3 -c '%s' '%s'", code, path);
  return WEXITSTATUS(system(cmd));
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s: %s", path, strerror(errno));
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(reports, snapshot_json) {
  CUdeviceptr a, b;
  void *h;
  OK(cuMemAlloc(&a, 1 << 20));
  OK(cuMemAlloc(&b, 3000));
  OK(cuMemHostAlloc(&h, 4096, 0));
  char path[] = "/tmp/gr_snapshot_XXXXXX";
  close(mkstemp(path));
  cr_assert_eq(gpureclaim_snapshot(path), 0);
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1]));"
                  "bl=d[\"blocks\"]; assert len(bl)==3, bl;"
                  "assert sorted(x[\"bytes\"] for x in bl)==[3000,4096,1048576];"
                  "assert {x[\"kind\"] for x in bl}=={\"device\",\"host\"};"
                  "assert d[\"total\"][\"live_blocks\"]==2 and d[\"total\"][\"live_bytes\"]==1048576+3000;"
                  "c=[x for x in d[\"contexts\"] if x[\"blocks\"]]; assert len(c)==1 and c[0][\"bytes\"]==1048576+3000, c;"
                  "assert all(x[\"library\"] and x[\"api\"] for x in bl);"
                  "assert d[\"devices\"][0][\"device\"]==0",
                  path),
               0);
  unlink(path);
  cr_assert_eq(gpureclaim_snapshot(""), -EINVAL);
  cr_assert_eq(gpureclaim_snapshot("/nonexistent-dir/x.json"), -EIO);
}

/* A device the test owns, in its directory: as root a node of the null device, made there with mknod (the
 * machine's /dev/null is never the target: a writer that renamed over it would break every program on the
 * machine); otherwise the slave side of a pseudo-terminal this test opened, whose master reads what came. */
static void device_in(const char *dir) {
  char node[4300];
  struct stat st;
  snprintf(node, sizeof node, "%s/null", dir);
  if (mknod(node, S_IFCHR | 0600, makedev(1, 3)) == 0) {
    cr_assert_eq(gpureclaim_snapshot(node), 0);
    cr_assert_eq(lstat(node, &st), 0);
    cr_assert(S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3), "the device node was replaced");
    cr_assert_eq(unlink(node), 0);
    return;
  }
  cr_assert_eq(errno, EPERM, "mknod %s: %s", node, strerror(errno));
  int m = posix_openpt(O_RDWR | O_NOCTTY);
  cr_assert_geq(m, 0, "posix_openpt: %s", strerror(errno));
  cr_assert(grantpt(m) == 0 && unlockpt(m) == 0);
  char slave[128];
  cr_assert_eq(ptsname_r(m, slave, sizeof slave), 0);
  struct termios raw; /* what is written arrives as written */
  int s = open(slave, O_RDWR | O_NOCTTY);
  cr_assert_geq(s, 0);
  cr_assert_eq(tcgetattr(s, &raw), 0);
  cfmakeraw(&raw);
  cr_assert_eq(tcsetattr(s, TCSANOW, &raw), 0);
  cr_assert_eq(gpureclaim_snapshot(slave), 0);
  cr_assert_eq(lstat(slave, &st), 0);
  cr_assert(S_ISCHR(st.st_mode), "the pseudo-terminal was replaced");
  char got[64] = "";
  struct pollfd p = {m, POLLIN, 0};
  cr_assert_eq(poll(&p, 1, 30000), 1, "nothing was written into the device"); /* a hang guard */
  cr_assert_gt(read(m, got, sizeof got - 1), 0);
  cr_assert_eq(got[0], '{', "the snapshot's first byte: %s", got);
  close(s);
  close(m);
}

/* A path that is not a regular file is written into, never replaced: renaming over /dev/null (as root, which
 * CI is) left a regular file full of JSON where every program expects the null device. Everything here lives in
 * a directory of the test's own, inside its run directory. */
Test(reports, snapshot_into_devices_links_and_fifos) {
  CUdeviceptr a;
  OK(cuMemAlloc(&a, 4096));
  struct stat st;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/gr_outXXXXXX", getenv("GPURECLAIM_RUNDIR"));
  cr_assert_not_null(mkdtemp(dir));
  device_in(dir);
  char target[4300], link[4300], fifo[4300];
  snprintf(target, sizeof target, "%s/target.json", dir);
  snprintf(link, sizeof link, "%s/link.json", dir);
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  cr_assert_eq(symlink("target.json", link), 0); /* dangling: writing through it creates the target */
  cr_assert_eq(gpureclaim_snapshot(link), 0);
  cr_assert_eq(lstat(link, &st), 0);
  cr_assert(S_ISLNK(st.st_mode), "the link was replaced");
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1])); assert len(d[\"blocks\"])==1", target), 0);
  cr_assert_eq(chmod(target, 0600), 0); /* private: replacing it must not make it readable by others */
  struct stat before;
  cr_assert_eq(stat(target, &before), 0);
  cr_assert_eq(gpureclaim_snapshot(link), 0, "a link to an existing file");
  cr_assert_eq(lstat(link, &st), 0);
  cr_assert(S_ISLNK(st.st_mode));
  cr_assert_eq(stat(target, &st), 0);
  cr_assert_neq(st.st_ino, before.st_ino, "the target was rewritten in place, not replaced atomically");
  cr_assert_eq(st.st_mode & 07777, 0600, "the replaced file's permissions changed to %o", st.st_mode & 07777);

  /* A link someone else owns (possible as root only) is not followed: in a directory others can write to,
   * it could aim the snapshot at any file. */
  if (geteuid() == 0) {
    char other[4300], victim[4300];
    snprintf(other, sizeof other, "%s/other.json", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    FILE *v = fopen(victim, "w");
    cr_assert_not_null(v);
    fputs("precious\n", v);
    fclose(v);
    cr_assert_eq(symlink(victim, other), 0);
    cr_assert_eq(lchown(other, 65534, 65534), 0);
    cr_assert_eq(gpureclaim_snapshot(other), -EIO);
    cr_assert_str_eq(slurp(victim), "precious\n", "a foreign link was followed");
    unlink(other);
    unlink(victim);
  }

  /* A FIFO: a reader gets the whole document. The reader is this test, its end opened before the snapshot (a
   * reader started as a process of its own could come after the 2 s the snapshot waits, on a loaded machine,
   * and then wait forever); the document of one block fits in the pipe's buffer. */
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(rfd, 0);
  cr_assert_eq(gpureclaim_snapshot(fifo), 0);
  static char doc[65536];
  size_t got = 0;
  ssize_t r;
  while (got < sizeof doc && (r = read(rfd, doc + got, sizeof doc - got)) > 0)
    got += (size_t)r;
  close(rfd);
  char copy[4300];
  snprintf(copy, sizeof copy, "%s/from_fifo.json", dir);
  FILE *c = fopen(copy, "w");
  cr_assert_not_null(c);
  cr_assert_eq(fwrite(doc, 1, got, c), got);
  fclose(c);
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1])); assert len(d[\"blocks\"])==1", copy), 0,
               "the reader of the FIFO did not get the whole snapshot (%zu bytes)", got);
  unlink(copy);
  cr_assert_eq(lstat(fifo, &st), 0);
  cr_assert(S_ISFIFO(st.st_mode));
  /* Nobody reads it: an error after a short wait for a reader, not a hang. */
  time_t t0 = time(NULL);
  cr_assert_eq(gpureclaim_snapshot(fifo), -EIO);
  cr_assert_lt(time(NULL) - t0, 30);

  cr_assert_eq(gpureclaim_snapshot(dir), -EIO, "a directory is not written");
  cr_assert_eq(lstat(dir, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  unlink(target);
  unlink(link);
  unlink(fifo);
  cr_assert_eq(rmdir(dir), 0, "temporary files were left in %s", dir);
  OK(cuMemFree(a));
}

/* ---- two writers of one file at once ---- */

/* A reader, as `gpureclaim ps` or a user's script reads: every time it finds the file, the file is whole, and
 * its count of releases never goes back (an older file renamed into place after a newer one). */
typedef struct {
  const char *path;
  atomic_bool stop;
  atomic_int reads, torn, backwards;
} reader_t;

static void *read_whole(void *arg) {
  reader_t *r = arg;
  static char buf[1 << 20];
  unsigned long last = 0;
  while (!atomic_load(&r->stop)) {
    sched_yield(); /* the writers (and other tests running) first */
    int fd = open(r->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    size_t n = 0;
    ssize_t got;
    while (n < sizeof buf - 1 && (got = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
      n += (size_t)got;
    close(fd);
    buf[n] = '\0';
    atomic_fetch_add(&r->reads, 1);
    if (n < 2 || buf[n - 2] != '}' || buf[n - 1] != '\n') {
      atomic_fetch_add(&r->torn, 1);
      continue;
    }
    const char *rel = strstr(buf, "\"releases\":"); /* the status file's own, or the snapshot's total */
    unsigned long releases = rel ? strtoul(rel + 11, NULL, 10) : 0;
    if (releases < last)
      atomic_fetch_add(&r->backwards, 1);
    last = releases;
  }
  return NULL;
}

/* Runs writers a and b at once while r reads the file they write, until both are done. */
static void race(reader_t *r, void *(*a)(void *), void *(*b)(void *)) {
  pthread_t ta, tb, rd;
  rd = gr_thread_start(read_whole, r);
  ta = gr_thread_start(a, NULL);
  tb = gr_thread_start(b, NULL);
  gr_thread_join(ta);
  gr_thread_join(tb);
  atomic_store(&r->stop, true);
  gr_thread_join(rd);
}

/* Files in dir whose name starts with prefix (temporary files left behind). */
static int count_prefixed(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += !strncmp(e->d_name, prefix, strlen(prefix));
  closedir(d);
  return n;
}

#define SNAPSHOTS 200
static char g_snap_path[256];
static atomic_int g_snap_failed, g_snap_rc;

static void *snapshot_many(void *arg) {
  (void)arg;
  for (int i = 0; i < SNAPSHOTS; i++) {
    int rc = gpureclaim_snapshot(g_snap_path);
    if (rc != 0 && atomic_fetch_add(&g_snap_failed, 1) == 0)
      atomic_store(&g_snap_rc, rc);
  }
  return NULL;
}

/* Two threads snapshot one path at once (every function of the API may be called concurrently): each call
 * succeeds and a reader only ever finds whole files. Both writes used one temporary name: one renamed the
 * other's half-written file into place, and the other's rename then failed (-EIO). */
Test(reports, snapshot_one_path_from_two_threads) {
  CUdeviceptr p[200];
  for (int i = 0; i < 200; i++)
    OK(cuMemAlloc(&p[i], 4096)); /* a snapshot of some size: a write takes a while */
  char dir[] = "/tmp/gr_snapraceXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  snprintf(g_snap_path, sizeof g_snap_path, "%s/snap.json", dir);
  cr_assert_eq(gpureclaim_snapshot(g_snap_path), 0);
  reader_t r = {.path = g_snap_path};
  race(&r, snapshot_many, snapshot_many);
  cr_assert_eq(atomic_load(&g_snap_failed), 0, "%d of %d snapshots failed (the first: %d)",
               atomic_load(&g_snap_failed), 2 * SNAPSHOTS, atomic_load(&g_snap_rc));
  cr_assert_eq(atomic_load(&r.torn), 0, "%d of %d reads found half a file", atomic_load(&r.torn),
               atomic_load(&r.reads));
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1])); assert len(d[\"blocks\"])==200", g_snap_path),
               0);
  cr_assert_eq(count_prefixed(dir, "snap.json."), 0, "temporary files were left in %s", dir);
  unlink(g_snap_path);
  cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
  for (int i = 0; i < 200; i++)
    OK(cuMemFree(p[i]));
}

/* One device's statistics: its own contexts and pools; process-wide counts under -1 only (the header). */
Test(reports, stats_of_one_device) {
  CUcontext c2, popped;
  OK(cuCtxCreate_v2(&c2, 0, 0));
  OK(cuCtxPopCurrent(&popped));
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, 0));
  CUdeviceptr p;
  OK(cuMemAllocAsync(&p, 4096, NULL));
  OK(cuMemFreeAsync(p, NULL));
  gpureclaim_report_t rep = {.size = sizeof rep};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &rep), 0);
  gpureclaim_stats_t all = {.size = sizeof all}, d0 = {.size = sizeof d0}, d1 = {.size = sizeof d1};
  cr_assert_eq(gpureclaim_stats(-1, &all), 0);
  cr_assert_eq(gpureclaim_stats(0, &d0), 0);
  cr_assert_eq(gpureclaim_stats(1, &d1), 0);
  cr_assert_geq(all.contexts, 2);
  cr_assert_eq(d0.contexts, all.contexts, "the simulator has one device: every context is device 0's");
  cr_assert_geq(all.pools, 1);
  cr_assert_eq(d0.pools, all.pools);
  cr_assert_eq(d1.contexts + d1.pools + d1.live_blocks, 0, "device 1 was never used");
  cr_assert_geq(all.releases, 1);
  cr_assert_eq(d0.releases + d0.released_bytes + d0.table_bytes + d0.untracked_routes, 0, "process-wide: -1 only");
  cr_assert_gt(all.table_bytes, 0);
  cr_assert_eq(gpureclaim_stats(63, &d1), 0);
  cr_assert_eq(gpureclaim_stats(64, &d1), -EINVAL);
  cr_assert_eq(gpureclaim_stats(-2, &d1), -EINVAL);
  OK(cuCtxDestroy(c2));
}

__attribute__((noinline)) static void leaky(CUdeviceptr *p) {
  OK(cuMemAlloc(p, 2 << 20));
  __asm__ volatile("" ::: "memory");
}

Test(reports, leak_report_text_and_json) {
  CUdeviceptr p1, p2, q;
  leaky(&p1);
  leaky(&p2);
  OK(cuMemAlloc(&q, 5000));
  char path[] = "/tmp/gr_leaks_XXXXXX";
  close(mkstemp(path));
  cr_assert_eq(gpureclaim_leak_report(path, 0), 0);
  char *t = slurp(path);
  cr_assert_not_null(strstr(t, "3 blocks"), "%s", t);
  cr_assert_not_null(strstr(t, "were never freed"));
  cr_assert_not_null(strstr(t, "Device 0: 3 blocks"));
  cr_assert_not_null(strstr(t, "2 blocks, 4.0 MiB (device)"), "the two leaky() blocks group together:\n%s", t);
  cr_assert_eq(gpureclaim_leak_report(path, 1), 0);
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1]));"
                  "assert d[\"blocks\"]==3 and d[\"bytes\"]==4*1048576+5000;"
                  "g=d[\"groups\"]; assert g[0][\"bytes\"]>=g[-1][\"bytes\"] and g[0][\"blocks\"]==2, g;"
                  "assert g[0][\"frames\"] and g[0][\"library\"];"
                  "assert len(g[0][\"locations\"]) == len(g[0][\"frames\"]), g[0];"
                  "assert g[0][\"locations\"][0].startswith(\"test_reports+0x\"), g[0]",
                  path),
               0);
  unlink(path);
}

/* The leak report leak_probe (or leak_probe_nopie) prints at exit. */
static const char *probe_leaks(const char *var) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=detect_leaks=0 GPURECLAIM_LEAK_REPORT=1 GPURECLAIM_BACKTRACE=1 %s 2>&1",
           getenv(var));
  FILE *f = popen(cmd, "r");
  static char out[1 << 16];
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  cr_assert_eq(WEXITSTATUS(pclose(f)), 0, "%s", out);
  return out;
}

/* Frame #0's address and the offset its location gives in module `module`. */
static void frame0(const char *out, const char *module, unsigned long *addr, unsigned long *off) {
  const char *f = strstr(out, "    #0 0x");
  cr_assert_not_null(f, "%s", out);
  *addr = strtoul(f + 7, NULL, 16);
  char at[128];
  snprintf(at, sizeof at, "(%s+0x", module);
  const char *o = strstr(f, at);
  cr_assert_not_null(o, "%s", out);
  *off = strtoul(o + strlen(at), NULL, 16);
}

Test(reports, leak_frames_give_the_offset_addr2line_takes) {
  unsigned long addr, off;
  frame0(probe_leaks("LEAK_PROBE_NOPIE"), "leak_probe_nopie", &addr, &off);
  cr_assert_eq(off, addr, "linked at a fixed address: the offset is the address (%#lx, %#lx)", addr, off);
  frame0(probe_leaks("LEAK_PROBE"), "leak_probe", &addr, &off);
  cr_assert_lt(off, addr, "position-independent: the offset from its load address");
  cr_assert_lt(off, 1ul << 24, "within the program's file");
}

Test(reports, leak_report_at_exit_names_the_caller) {
  const char *out = probe_leaks("LEAK_PROBE");
  cr_assert_not_null(strstr(out, "3 blocks (6.0 MiB) were never freed"), "%s", out);
  cr_assert_not_null(strstr(out, "load_model"), "the backtrace names the function:\n%s", out);
  cr_assert_not_null(strstr(out, "leak_probe"), "and the binary:\n%s", out);
  cr_assert_not_null(strstr(out, " in load_model+0x"), "%s", out);
  cr_assert_not_null(strstr(out, "(leak_probe+0x"), "frames give module+offset, for addr2line:\n%s", out);
}

Test(reports, status_file_and_run_directory) {
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 100));
  const char *dir = getenv("GPURECLAIM_RUNDIR");
  struct stat st;
  cr_assert_eq(stat(dir, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700, "the run directory is private");
  char path[4200];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  cr_assert_eq(st.st_mode & 0777, 0600);
  cr_assert_eq(py("import json,sys,os; d=json.load(open(sys.argv[1]));"
                  "assert d[\"pid\"]==int(os.path.basename(sys.argv[1])[:-5]);"
                  "assert d[\"signal\"]==\"USR1\" and d[\"releases\"]==0 and d[\"last_release\"] is None;"
                  "assert d[\"socket\"].endswith(\".sock\") and d[\"start_ticks\"]>0",
                  path),
               0);
  gpureclaim_report_t r = {.size = sizeof r};
  cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, &r), 0);
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1]));"
                  "assert d[\"releases\"]==1 and d[\"last_release\"][\"trigger\"]==\"api\"",
                  path),
               0);
}

#define STATUS_RELEASES 500
static atomic_int g_status_errors; /* counted on the threads, asserted on the test's own */

static void *release_many(void *arg) {
  (void)arg;
  for (int i = 0; i < STATUS_RELEASES; i++)
    if (gpureclaim_release(GPURECLAIM_CACHED, NULL) != 0)
      atomic_fetch_add(&g_status_errors, 1);
  return NULL;
}

static void *end_scopes(void *arg) {
  (void)arg;
  if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
    atomic_fetch_add(&g_status_errors, 1);
  for (int i = 0; i < STATUS_RELEASES; i++) {
    uint64_t s = gpureclaim_scope_begin();
    CUdeviceptr p;
    if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS || gpureclaim_scope_end(s, GPURECLAIM_FREE_NOW) != 0)
      atomic_fetch_add(&g_status_errors, 1);
  }
  return NULL;
}

/* Releases on two threads at once (gpureclaim_release, and scope ends that free at once) each rewrite the
 * status file: a reader only ever finds it whole, and once both are done it shows every release, not an
 * older status renamed into place after a newer one. */
Test(reports, status_file_from_two_threads) {
  const char *dir = getenv("GPURECLAIM_RUNDIR");
  char path[4200], prefix[64];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  snprintf(prefix, sizeof prefix, "%d.json.", (int)getpid());
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 100)); /* the library starts: the status file exists */
  reader_t r = {.path = path};
  race(&r, release_many, end_scopes);
  cr_assert_eq(atomic_load(&g_status_errors), 0);
  cr_assert_eq(atomic_load(&r.torn), 0, "%d of %d reads found half a status file", atomic_load(&r.torn),
               atomic_load(&r.reads));
  cr_assert_eq(atomic_load(&r.backwards), 0, "%d of %d reads found an older status after a newer one",
               atomic_load(&r.backwards), atomic_load(&r.reads));
  char code[512];
  snprintf(code, sizeof code,
           "import json,sys; d=json.load(open(sys.argv[1]));"
           "assert d[\"releases\"]==%d, d[\"releases\"]; assert d[\"last_release\"][\"seq\"]",
           2 * STATUS_RELEASES);
  cr_assert_eq(py(code, path), 0, "the status file does not show every release");
  cr_assert_eq(count_prefixed(dir, prefix), 0, "temporary files were left in %s", dir);
  OK(cuMemFree(p));
}

/* GPURECLAIM_LOG names a FIFO nobody reads: releases go on, their reports to stderr. Opening it blocked until
 * a reader came, which was never: an allocation that ran out of memory (its retry releases on the allocating
 * thread) and gpureclaim_release() hung. The probe runs in a child that an alarm ends if it hangs. */
Test(reports, log_fifo_without_reader_blocks_no_release) {
  char dir[] = "/tmp/gr_logfifoXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char fifo[256];
  snprintf(fifo, sizeof fifo, "%s/log", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  int out[2];
  cr_assert_eq(pipe(out), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(out[0]);
    setenv("GPURECLAIM_LOG", fifo, 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    alarm(60); /* kept across exec: a hang ends in SIGALRM */
    execl(getenv("LOG_PROBE"), "log_probe", (char *)NULL);
    _exit(91);
  }
  close(out[1]);
  static char text[1 << 16];
  size_t n = 0;
  ssize_t got;
  while (n < sizeof text - 1 && (got = read(out[0], text + n, sizeof text - 1 - n)) > 0)
    n += (size_t)got;
  text[n] = '\0';
  close(out[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(!WIFSIGNALED(status), "the probe ended by signal %d (%d: it hung on the FIFO):\n%s", WTERMSIG(status),
            SIGALRM, text);
  cr_assert_eq(WEXITSTATUS(status), 0, "%s", text);
  cr_assert_not_null(strstr(text, "oom=2 release=0"), "%s", text); /* CUDA_ERROR_OUT_OF_MEMORY after the retry */
  cr_assert_not_null(strstr(text, "\"trigger\":\"oom\""), "the reports go to stderr:\n%s", text);
  cr_assert_not_null(strstr(text, "\"trigger\":\"api\""), "%s", text);
  cr_assert_not_null(strstr(text, "GPURECLAIM_LOG"), "one warning names the variable:\n%s", text);
  unlink(fifo);
  cr_assert_eq(rmdir(dir), 0);
}

static int ask(const char *request, char *out, size_t len) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int n0 = snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  cr_assert_lt(n0, (int)sizeof sa.sun_path, "socket path too long");
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    return -errno;
  if (write(fd, request, strlen(request)) < 0)
    return -errno;
  size_t n = 0;
  ssize_t r;
  while (n < len - 1 && (r = read(fd, out + n, len - 1 - n)) > 0)
    n += (size_t)r;
  out[n] = '\0';
  close(fd);
  return 0;
}

Test(reports, control_socket) {
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 12345));
  static char out[1 << 20];
  char tmp[] = "/tmp/gr_ctl_XXXXXX";
  int fd = mkstemp(tmp);
  cr_assert_eq(ask("ping\n", out, sizeof out), 0);
  cr_assert_not_null(strstr(out, "\"ok\":true"), "%s", out);
  cr_assert_eq(ask("stats\n", out, sizeof out), 0);
  cr_assert_eq(write(fd, out, strlen(out)), (ssize_t)strlen(out));
  cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1]));"
                  "assert d[\"ok\"] and d[\"total\"][\"live_bytes\"]==12345 and d[\"devices\"][0][\"device\"]==0",
                  tmp),
               0);
  cr_assert_eq(ask("release cached\n", out, sizeof out), 0);
  cr_assert_not_null(strstr(out, "\"trigger\":\"command\""), "%s", out);
  cr_assert_eq(ask("release nonsense\n", out, sizeof out), 0);
  cr_assert_not_null(strstr(out, "\"ok\":false"), "%s", out);
  cr_assert_eq(ask("snapshot\n", out, sizeof out), 0);
  cr_assert_not_null(strstr(out, "\"bytes\":12345"), "%s", out);
  cr_assert_eq(ask("bogus\n", out, sizeof out), 0);
  cr_assert_not_null(strstr(out, "unknown request"), "%s", out);
  close(fd);
  unlink(tmp);
}

/* Runs log_probe with args in a child, GPURECLAIM_RUNDIR=rundir and extra "NAME=value" settings (NULL-ended),
 * in directory cwd (NULL: this one); its stdout and stderr in out. Returns the wait status. An alarm ends a
 * hang. */
static int run_probe(const char *rundir, const char *cwd, const char *const *env, const char *arg, char *out,
                     size_t len) {
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    setenv("GPURECLAIM_RUNDIR", rundir, 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    for (; env && *env; env++)
      putenv((char *)*env);
    if (cwd && chdir(cwd) != 0)
      _exit(92);
    alarm(60); /* kept across exec */
    execl(getenv("LOG_PROBE"), "log_probe", arg, (char *)NULL);
    _exit(91);
  }
  close(pipefd[1]);
  size_t n = 0;
  ssize_t got;
  while (n < len - 1 && (got = read(pipefd[0], out + n, len - 1 - n)) > 0)
    n += (size_t)got;
  out[n] = '\0';
  close(pipefd[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* Removes the files a probe's run directory keeps after it ended (a peer reclaim's GPU lock stays, by design),
 * then the directory: the test's temporary directories are left behind otherwise. */
static void remove_rundir(const char *rundir) {
  DIR *d = opendir(rundir);
  if (!d)
    return;
  struct dirent *e;
  char path[4200];
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      snprintf(path, sizeof path, "%s/%s", rundir, e->d_name);
      unlink(path);
    }
  closedir(d);
  cr_assert_eq(rmdir(rundir), 0, "%s: %s", rundir, strerror(errno));
}

/* A process that exits while other threads release (each release rewrites the status file): exit removed
 * the status file, then a release re-created it, or the process ended with a temporary file half-written. */
Test(reports, exit_during_releases_leaves_nothing_in_the_run_directory) {
  char dir[] = "/tmp/gr_exitraceXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char rundir[300], log[320];
  snprintf(rundir, sizeof rundir, "%s/run", dir);
  snprintf(log, sizeof log, "GPURECLAIM_LOG=%s/log", dir);
  const char *const env[] = {log, NULL};
  static char out[1 << 16];
  for (int i = 0; i < 40; i++) {
    int status = run_probe(rundir, NULL, env, "exit-race", out, sizeof out);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe status %#x:\n%s", status, out);
    DIR *d = opendir(rundir);
    cr_assert_not_null(d, "the probe made no run directory:\n%s", out);
    struct dirent *e;
    while ((e = readdir(d)))
      cr_assert(e->d_name[0] == '.', "run %d left %s in the run directory", i, e->d_name);
    closedir(d);
  }
  cr_assert_eq(rmdir(rundir), 0);
  unlink(log + strlen("GPURECLAIM_LOG="));
  cr_assert_eq(rmdir(dir), 0);
}

/* The status file replaced by a link (or a FIFO) in the run directory: the next update replaces the name with
 * a new regular file. It wrote through the link, into its target. */
Test(reports, a_link_or_fifo_in_place_of_the_status_file_is_replaced_not_written_through) {
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 100));
  const char *dir = getenv("GPURECLAIM_RUNDIR");
  char path[4200], target[] = "/tmp/gr_status_targetXXXXXX";
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  int fd = mkstemp(target);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "precious\n", 9), 9);
  close(fd);
  struct stat st;
  for (int kind = 0; kind < 2; kind++) {
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(kind == 0 ? symlink(target, path) : mkfifo(path, 0600), 0);
    cr_assert_eq(gpureclaim_release(GPURECLAIM_CACHED, NULL), 0); /* rewrites the status file */
    cr_assert_eq(lstat(path, &st), 0);
    cr_assert(S_ISREG(st.st_mode), "the %s is still there", kind == 0 ? "link" : "FIFO");
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_str_eq(slurp(target), "precious\n", "the status was written through the link into its target");
    cr_assert_eq(py("import json,sys; d=json.load(open(sys.argv[1])); assert d[\"pid\"]>0", path), 0);
  }
  unlink(target);
  OK(cuMemFree(p));
}

/* A relative GPURECLAIM_LOG is the file in the directory the program started in: options are read when it
 * first uses CUDA, and the log went to whatever directory it had changed to by then. */
Test(reports, a_relative_log_is_taken_from_the_directory_the_program_started_in) {
  char dir[] = "/tmp/gr_rellogXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char start[300], later[300], chdir_to[320], in_start[320], in_later[320];
  snprintf(start, sizeof start, "%s/start", dir);
  snprintf(later, sizeof later, "%s/later", dir);
  cr_assert_eq(mkdir(start, 0700), 0);
  cr_assert_eq(mkdir(later, 0700), 0);
  snprintf(chdir_to, sizeof chdir_to, "LOG_PROBE_CHDIR=%s", later);
  snprintf(in_start, sizeof in_start, "%s/rel.log", start);
  snprintf(in_later, sizeof in_later, "%s/rel.log", later);
  const char *env[] = {"GPURECLAIM_LOG=rel.log", chdir_to, NULL};
  static char out[1 << 16];
  char rundir[320];
  snprintf(rundir, sizeof rundir, "%s/run", dir);
  int status = run_probe(rundir, start, env, NULL, out, sizeof out);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe status %#x:\n%s", status, out);
  cr_assert_not_null(strstr(out, "oom=2 release=0"), "%s", out);
  cr_assert_eq(access(in_later, F_OK), -1, "the log went to the directory the program had changed to");
  cr_assert_not_null(strstr(slurp(in_start), "\"trigger\":\"api\""), "no report in %s", in_start);
  unlink(in_start);
  rmdir(start);
  rmdir(later);
  remove_rundir(rundir);
  cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
}

/* A log that cannot be written (a full disk) is said once, with the error, and the reports go to stderr; they
 * were dropped without a word. The full disk is a node of the full device in the test's own directory (made
 * with mknod, as root); without the right to make one, a file the size limit keeps empty (RLIMIT_FSIZE, the
 * limit and SIGXFSZ ignored inherited by the probe): "File too large" instead of "No space left on device". */
Test(reports, a_log_write_error_is_reported_and_the_report_kept) {
  char dir[] = "/tmp/gr_fulllogXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char rundir[320], full[320], setting[340], want[400];
  snprintf(rundir, sizeof rundir, "%s/run", dir);
  snprintf(full, sizeof full, "%s/full", dir);
  const char *why = strerror(ENOSPC);
  if (mknod(full, S_IFCHR | 0600, makedev(1, 7)) != 0) {
    cr_assert_eq(errno, EPERM, "mknod %s: %s", full, strerror(errno));
    struct rlimit lim = {0, 0};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    signal(SIGXFSZ, SIG_IGN);
    why = strerror(EFBIG);
  }
  snprintf(setting, sizeof setting, "GPURECLAIM_LOG=%s", full);
  const char *env[] = {setting, NULL};
  static char out[1 << 16];
  int status = run_probe(rundir, NULL, env, NULL, out, sizeof out);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "probe status %#x:\n%s", status, out);
  snprintf(want, sizeof want, "cannot write to %s: %s", setting, why);
  cr_assert_not_null(strstr(out, want), "no '%s' in:\n%s", want, out);
  const char *first = strstr(out, "cannot write to GPURECLAIM_LOG");
  cr_assert_null(strstr(first + 1, "cannot write to GPURECLAIM_LOG"), "warned more than once:\n%s", out);
  cr_assert_not_null(strstr(out, "\"trigger\":\"oom\""), "the reports go to stderr:\n%s", out);
  cr_assert_not_null(strstr(out, "\"trigger\":\"api\""), "%s", out);
  unlink(full);
  remove_rundir(rundir);
  cr_assert_eq(rmdir(dir), 0, "%s: %s", dir, strerror(errno));
}

/* Connects to this process's control socket from a child running as uid (with CAP_DAC_OVERRIDE kept, so that
 * neither the run directory's 0700 nor the socket's 0600 stop it: only the server's SO_PEERCRED check is left
 * to) and asks "ping". Returns the child's exit status: 0 answered, 1 closed without an answer, 2 could not
 * connect, 3 could not become uid with the capability, 4 other. */
static int ping_as(uid_t uid) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    alarm(30);
    if (uid != geteuid()) {
      struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
      struct __user_cap_data_struct data[2];
      if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 || setresuid(uid, uid, uid) != 0 ||
          syscall(SYS_capget, &hdr, data) != 0)
        _exit(3);
      data[0].effective |= 1u << CAP_DAC_OVERRIDE;
      if (syscall(SYS_capset, &hdr, data) != 0 || geteuid() != uid)
        _exit(3);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", getenv("GPURECLAIM_RUNDIR"), (int)getppid());
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
      _exit(2);
    signal(SIGPIPE, SIG_IGN);
    if (write(fd, "ping\n", 5) != 5)
      _exit(errno == EPIPE || errno == ECONNRESET ? 1 : 4); /* already closed by the server */
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf);
    _exit(n > 0 ? 0 : n == 0 || errno == ECONNRESET ? 1 : 4);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child ended by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WEXITSTATUS(status);
}

/* The control socket is the user's alone: mode 0600, and a peer of another uid gets no answer even where the
 * file permissions would let it connect (the server checks SO_PEERCRED). */
Test(reports, the_control_socket_answers_only_its_user) {
  CUdeviceptr p;
  OK(cuMemAlloc(&p, 100));
  char path[4200];
  snprintf(path, sizeof path, "%s/%d.sock", getenv("GPURECLAIM_RUNDIR"), (int)getpid());
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0, "%s", path);
  cr_assert(S_ISSOCK(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0600, "the control socket has mode %04o", st.st_mode & 0777);
  cr_assert_eq(ping_as(geteuid()), 0, "the user's own ping went unanswered: the test proves nothing");
  if (geteuid() != 0)
    cr_skip_test("the peer-uid check needs root, to connect as another uid past the file permissions");
  int rc = ping_as(65534);
  if (rc == 3)
    cr_skip_test("cannot become uid 65534 with CAP_DAC_OVERRIDE here (capabilities restricted)");
  cr_assert_eq(rc, 1, "a peer of uid 65534 %s", rc == 0 ? "got an answer" : "could not even connect");
  OK(cuMemFree(p));
}
