/* Event lines and the status file (src/report/event.c, src/report/status.c), read back as JSON: a release's
 * report carries its figures and only the devices it names, peer_pid only for a peer's; an event line is
 * appended whole to GPURECLAIM_LOG, and one that cannot go there (a FIFO nobody reads) goes to stderr without
 * blocking; the status file counts releases and, once removed at exit, is not written again. Each test runs in
 * a process of its own, so options (read from the environment at first use) load afresh. */
#include "gpureclaim_internal.h"
#include "json.h"
#include "jsonread.h"
#include "report.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static gpureclaim_report_t sample(int trigger) {
  gpureclaim_report_t r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  r.seq = 7;
  r.trigger = trigger;
  r.what = GPURECLAIM_CACHED | GPURECLAIM_ORPHANED;
  r.orphaned_bytes = 3u << 20;
  r.orphaned_blocks = 3;
  r.peer_pid = 4242;
  r.ndevices = 2;
  r.devices[0].device = 0;
  r.devices[0].orphaned_bytes = 1u << 20;
  r.devices[1].device = 3;
  r.devices[1].orphaned_bytes = 2u << 20;
  r.devices[2].device = 5; /* beyond ndevices: not shown */
  return r;
}

static jnode_t *parse(const char *text) {
  const char *err = NULL;
  jnode_t *j = jparse_object(text, &err);
  cr_assert_not_null(j, "not a JSON object (%s): %s", err, text);
  return j;
}

static jnode_t *report_json(const gpureclaim_report_t *r) {
  jbuf_t b;
  jb_init(&b);
  gr_report_release_json(&b, r);
  jnode_t *j = parse(b.p);
  jb_free(&b);
  return j;
}

Test(event, a_report_shows_its_figures_and_only_its_devices) {
  gpureclaim_report_t r = sample(GPURECLAIM_TRIGGER_SIGNAL);
  jnode_t *j = report_json(&r);
  cr_assert_eq(jint(j, "seq", -1), 7);
  cr_assert_str_eq(jstr(j, "trigger", ""), "signal");
  cr_assert_str_eq(jstr(j, "what", ""), "cached,orphaned");
  cr_assert_eq(jint(j, "orphaned_bytes", -1), 3 << 20);
  cr_assert_eq(jint(j, "orphaned_blocks", -1), 3);
  cr_assert_null(jget(j, "peer_pid"), "peer_pid in a report a peer did not ask for");
  const jnode_t *d = jget(j, "devices");
  cr_assert(d && d->n == 2, "devices beyond ndevices were shown");
  cr_assert_eq(jint(&d->kids[1], "device", -1), 3);
  cr_assert_eq(jint(&d->kids[1], "orphaned_bytes", -1), 2 << 20);
  jdelete(j);
  r = sample(GPURECLAIM_TRIGGER_PEER);
  r.ndevices = 0;
  j = report_json(&r);
  cr_assert_str_eq(jstr(j, "trigger", ""), "peer");
  cr_assert_eq(jint(j, "peer_pid", -1), 4242);
  cr_assert_eq(jget(j, "devices")->n, 0);
  jdelete(j);
}

static char g_dir[64];

static void private_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/grevXXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}

Test(event, release_lines_are_appended_whole_to_the_log) {
  private_dir();
  char log[128];
  snprintf(log, sizeof log, "%s/events.log", g_dir);
  cr_assert_eq(setenv("GPURECLAIM_LOG", log, 1), 0);
  gpureclaim_report_t r = sample(GPURECLAIM_TRIGGER_API);
  gr_report_release(&r);
  r.seq = 8;
  gr_report_release(&r);
  FILE *f = fopen(log, "r");
  cr_assert_not_null(f, "no log written");
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    cr_assert_eq(line[strlen(line) - 1], '\n', "a line without its newline");
    jnode_t *j = parse(line);
    cr_assert_str_eq(jstr(j, "event", ""), "release");
    cr_assert_eq(jint(j, "pid", -1), getpid());
    cr_assert_eq(jint(jget(j, "report"), "seq", -1), 7 + n);
    jdelete(j);
    n++;
  }
  fclose(f);
  cr_assert_eq(n, 2);
  unlink(log);
  rmdir(g_dir);
}

/* A FIFO nobody reads: the open does not wait, and the line goes to stderr. */
Test(event, a_fifo_nobody_reads_does_not_block_and_the_line_goes_to_stderr) {
  private_dir();
  char fifo[128], err[128];
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  snprintf(err, sizeof err, "%s/stderr", g_dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(setenv("GPURECLAIM_LOG", fifo, 1), 0);
  int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600), saved = dup(STDERR_FILENO);
  cr_assert(fd >= 0 && saved >= 0);
  dup2(fd, STDERR_FILENO);
  gpureclaim_report_t r = sample(GPURECLAIM_TRIGGER_API);
  gr_report_release(&r);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(fd);
  FILE *f = fopen(err, "r");
  cr_assert_not_null(f);
  char buf[8192];
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  buf[got] = '\0';
  fclose(f);
  cr_assert(strstr(buf, "{\"event\":\"release\"") || strstr(buf, "\"event\": \"release\""),
            "the release line did not reach stderr: %s", buf);
  unlink(fifo);
  unlink(err);
  rmdir(g_dir);
}

static jnode_t *status_file(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/%d.json", g_dir, (int)getpid());
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "no status file at %s", path);
  static char buf[65536];
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  buf[got] = '\0';
  fclose(f);
  return parse(buf);
}

Test(event, the_status_file_counts_releases_and_is_not_rewritten_after_its_removal) {
  private_dir();
  cr_assert_eq(chmod(g_dir, 0700), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", g_dir, 1), 0);
  cr_assert_eq(gr_report_status_update(), 0);
  jnode_t *j = status_file();
  cr_assert_eq(jint(j, "pid", -1), getpid());
  cr_assert_eq(jint(j, "uid", -1), (int64_t)geteuid());
  cr_assert_eq(jint(j, "releases", -1), 0);
  cr_assert_eq(jget(j, "last_release")->type, JN_NULL);
  cr_assert_eq(jget(j, "socket")->type, JN_NULL);
  cr_assert_neq(jint(j, "start_ticks", 0), 0);
  jdelete(j);
  gr_report_status_socket("/some/\"odd\"\\path\n.sock");
  gpureclaim_report_t r = sample(GPURECLAIM_TRIGGER_API);
  gr_report_status_release(&r, false);
  r.seq = 9;
  gr_report_status_release(&r, true);
  j = status_file();
  cr_assert_eq(jint(j, "releases", -1), 2);
  cr_assert_eq(jint(jget(j, "last_release"), "seq", -1), 9);
  cr_assert_eq(jint(j, "signal_releases", -1), 1);
  cr_assert_eq(jint(jget(j, "last_signal_release"), "seq", -1), 9);
  cr_assert_str_eq(jstr(j, "socket", ""), "/some/\"odd\"\\path\n.sock", "the socket path did not survive escaping");
  jdelete(j);
  gr_report_status_remove();
  char path[128];
  snprintf(path, sizeof path, "%s/%d.json", g_dir, (int)getpid());
  cr_assert_neq(access(path, F_OK), 0, "the status file is still there after its removal");
  cr_assert_eq(gr_report_status_update(), -ESHUTDOWN);
  cr_assert_neq(access(path, F_OK), 0, "an update after the removal wrote the status file again");
  rmdir(g_dir);
}

/* An unusable run directory: an error, and nothing written. */
Test(event, no_status_file_in_a_run_directory_others_can_read) {
  private_dir();
  cr_assert_eq(chmod(g_dir, 0755), 0);
  cr_assert_eq(setenv("GPURECLAIM_RUNDIR", g_dir, 1), 0);
  cr_assert_eq(gr_report_status_update(), -ENOENT);
  cr_assert_eq(rmdir(g_dir), 0, "something was written into the refused directory");
}
