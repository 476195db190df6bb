/*
 * core.c -- gpureclaim's life in a process.
 *
 * Nothing happens until the process initialises CUDA: the constructor only hands the modules below this one what
 * they need of those above (two function pointers), reads GPURECLAIM_DISABLE, notes the current directory when
 * GPURECLAIM_LOG is a relative path, and checks the link order (one symbol lookup; a warning if libcuda would
 * hide gpureclaim's driver entry points), and
 * until the first cuInit (or the first allocation) seen through a hook, gpureclaim starts no thread, installs
 * no handler, writes no file and allocates nothing (LD_PRELOAD reaches every child process a program starts).
 * Then gr_core_start_slow() maps the table, installs the signal handler, starts the worker thread and writes
 * the status file. After fork() the child starts over: empty table, no worker, no files, until it uses CUDA.
 */
#include "real.h"
#include "registry.h"
#include "stats.h"
#include "limit.h"
#include "track.h"
#include "scope.h"
#include "release.h"
#include "worker.h"
#include "sig.h"
#include "peer.h"
#include "wait.h"
#include "sleep.h"
#include "control.h"
#include "core.h"
#include "gate.h"
#include "admit.h"
#include "capture.h"
#include "report.h"
#include "options.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static GR_TLS int t_starting;
static _Atomic int g_once_registered;
static _Atomic int g_exiting;

/* Whether another object than this library provides `name` first in the process's global scope (one symbol
 * lookup: no allocation, no file). *theirs and *mine name the two objects. */
static bool defined_first_elsewhere(const char *name, Dl_info *theirs, Dl_info *mine) {
  const gr_real_libc_t *r = gr_real_libc();
  void *first = r->dlsym ? r->dlsym(RTLD_DEFAULT, name) : NULL;
  return first && dladdr((void *)&defined_first_elsewhere, mine) && dladdr(first, theirs) &&
         theirs->dli_fbase != mine->dli_fbase;
}

static const char *object_name(const Dl_info *info) {
  return info->dli_fname && info->dli_fname[0] ? info->dli_fname : "the program itself";
}

/* A program linked with -lcuda before -lgpureclaim binds its calls to the driver's exported names to libcuda:
 * gpureclaim would see none of them, and the program would run untracked without a word. The warning names
 * the library that comes first. */
static void check_link_order(void) {
  Dl_info mine, theirs;
  if (!defined_first_elsewhere("cuMemAlloc_v2", &theirs, &mine))
    return;
  const char *who = object_name(&theirs), *base = strrchr(who, '/');
  if (!strncmp(base ? base + 1 : who, "libcuda.so", 10))
    gr_warn("%s comes before libgpureclaim in this program's link order, so the program's direct calls to the "
            "CUDA driver (cuMemAlloc, cuMemFree, ...) bypass gpureclaim and are not tracked: link -lgpureclaim "
            "before -lcuda, or preload libgpureclaim.so",
            who);
  else /* another interposer, or a program defining the names: it may pass the calls on (RTLD_NEXT) */
    gr_warn("%s defines the CUDA driver's entry points and comes before libgpureclaim: the program's direct calls "
            "to the driver (cuMemAlloc, cuMemFree, ...) reach it first, and gpureclaim tracks them only if it "
            "passes them on with dlsym(RTLD_NEXT)",
            who);
}

/* Two copies of gpureclaim in one process (one preloaded by hand, another by `gpureclaim run` or linked): the
 * first copy's definitions serve the whole process, and its dlsym() resolves the driver through the second
 * copy's dlsym, which would hand back the first copy's own hooks (endless recursion). The copy that comes
 * second finds the first one's gpureclaim_version ahead of its own, and passes every call through, silently:
 * LD_PRELOAD reaches every program (/bin/true too), and a program that never uses CUDA is not concerned. The
 * first copy says it once, when the process starts using CUDA (second_copy_check()). */
static bool another_copy_first(void) {
  Dl_info mine, theirs;
  return defined_first_elsewhere("gpureclaim_version", &theirs, &mine);
}

typedef struct {
  void *my_base;
  char name[512];
} copy_search_t;

/* dl_iterate_phdr: a loaded object other than this one whose file name is a libgpureclaim (one loaded with
 * RTLD_LOCAL, which no symbol lookup from here finds). */
static int find_copy(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  copy_search_t *s = arg;
  const char *name = info->dlpi_name, *base = name ? strrchr(name, '/') : NULL;
  base = base ? base + 1 : name;
  if (!base || strncmp(base, "libgpureclaim.so", 16) != 0 || (void *)info->dlpi_addr == s->my_base)
    return 0;
  snprintf(s->name, sizeof s->name, "%s", name);
  return 1;
}

/* Run by the copy that tracks, as it starts: another copy after it in the global scope (RTLD_NEXT), or loaded
 * on its own, passes every call through; said once per process, where CUDA is used. */
static void second_copy_check(void) {
  Dl_info mine, theirs;
  if (!dladdr((void *)&second_copy_check, &mine))
    return;
  copy_search_t s = {mine.dli_fbase, ""};
  const gr_real_libc_t *r = gr_real_libc();
  void *next = r->dlsym ? r->dlsym(RTLD_NEXT, "gpureclaim_version") : NULL;
  if (next && dladdr(next, &theirs) && theirs.dli_fbase != mine.dli_fbase)
    snprintf(s.name, sizeof s.name, "%s", object_name(&theirs));
  else
    dl_iterate_phdr(find_copy, &s);
  if (s.name[0])
    gr_warn("two copies of libgpureclaim in this process: %s comes first and tracks everything; the other (%s) "
            "passes every call through",
            object_name(&mine), s.name);
}

__attribute__((constructor)) static void gr_core_ctor(void) {
  /* What the modules below this one are handed of those above them (nothing runs): the gates' slow path wakes
   * the process, and the status file and the stats answer show the sleep and peer objects. */
  gr_gate_set_slow(gr_sleep_gate_slow);
  gr_report_status_parts(gr_sleep_json, gr_peer_status_json);
  if (gr_opt_disabled_early() || another_copy_first()) {
    atomic_store_explicit(&gr_state_run, -1, memory_order_release);
    return;
  }
  gr_opt_note_start_dir();
  check_link_order();
}

static void atfork_child(void) {
  gr_state_tls_atfork_child();
  gr_gate_atfork_child(); /* the parent's other threads, in flight or not, do not live on */
  /* Registered as a start begins: a parent that had not got past it (0), or runs as a pass-through (-1), has
   * nothing to hand down. A parent half-started (2) is reset as a running one: the child starts over. */
  if (atomic_load_explicit(&gr_state_run, memory_order_relaxed) <= 0)
    return;
  gr_epoch_atfork_child();
  gr_table_atfork_child();
  gr_track_atfork_child();
  gr_stats_atfork_child();
  gr_limit_atfork_child();
  gr_reg_atfork_child();
  gr_scope_atfork_child();
  gr_release_atfork_child();
  gr_peer_atfork_child();
  gr_wait_atfork_child();
  gr_worker_atfork_child();
  gr_sig_atfork_child();
  gr_admit_atfork_child();
  gr_capture_atfork_child();
  gr_sleep_atfork_child();
  gr_control_forget();
  gr_report_atfork_child();
  atomic_store_explicit(&gr_state_run, 0, memory_order_release); /* start over on the child's first CUDA use */
}

static void core_exit(void) {
  if (atomic_exchange_explicit(&g_exiting, 1, memory_order_acq_rel))
    return;
  if (atomic_load_explicit(&gr_state_run, memory_order_acquire) != 1)
    return;
  gr_worker_stop();
  if (gr_opt()->leak_report)
    gr_report_leaks_fd(2, false);
  gr_control_close();
  gr_report_status_remove();
}

/* How long a CUDA call waits for another thread to start gpureclaim before it passes through untracked. The
 * start takes well under a millisecond; the bound only matters if the starting thread waits for a lock the
 * waiting one holds (the dynamic loader's, when a library constructor makes CUDA calls during a dlopen):
 * then the call goes on untracked after this long, instead of the two threads waiting for each other. */
#define START_WAIT_S 2

static bool wait_for_start(struct timespec *deadline) {
  if (deadline->tv_sec == 0 && deadline->tv_nsec == 0) {
    clock_gettime(CLOCK_MONOTONIC, deadline);
    deadline->tv_sec += START_WAIT_S;
    return true;
  }
  if (gr_ms_until(deadline) > 0) {
    sched_yield();
    return true;
  }
  gr_warn_once(w_start_wait, "a CUDA call waited %d s for another thread to start gpureclaim; it went on "
                             "untracked (its block, if any, is not in the table)", START_WAIT_S);
  return false;
}

bool gr_core_start_slow(void) {
  /* Registered before the state leaves 0: a fork() while another thread starts gpureclaim gives a child that
   * starts over (atfork_child resets a state of 2), never one stuck half-started. */
  if (!atomic_exchange_explicit(&g_once_registered, 1, memory_order_acq_rel)) {
    pthread_atfork(NULL, NULL, atfork_child);
    atexit(core_exit);
  }
  struct timespec deadline = {0, 0};
  for (;;) {
    int s = atomic_load_explicit(&gr_state_run, memory_order_acquire);
    if (s == 1)
      return true;
    if (s < 0 || t_starting)
      return false; /* disabled, or a CUDA call made while starting */
    if (s == 0) {
      int expected = 0;
      if (atomic_compare_exchange_strong_explicit(&gr_state_run, &expected, 2, memory_order_acq_rel,
                                                  memory_order_acquire))
        break;
      continue;
    }
    if (!wait_for_start(&deadline)) /* another thread is starting it (once per process) */
      return false;
  }
  t_starting = 1;
  const gr_options_t *o = gr_opt();
  if (o->disable || gr_real_resolve_drv() != 0 || gr_table_init() != 0) {
    if (!o->disable)
      gr_warn("cannot start (no usable libcuda.so.1, or no memory); running as a pass-through");
    atomic_store_explicit(&gr_state_run, -1, memory_order_release);
    t_starting = 0;
    return false;
  }
  gr_state_set_start_time_ms(gr_wall_ms());
  gr_limit_start(); /* before the first block is tracked: every block counts against a limit */
  atomic_store_explicit(&gr_state_run, 1, memory_order_release);
  if (o->signal && gr_sig_install() != 0)
    gr_warn("could not install the release signal handler");
  if (gr_worker_start() != 0)
    gr_warn("could not start the worker thread: signals and the gpureclaim command will not reach this process");
  if (o->status)
    gr_report_status_update();
  second_copy_check();
  char sig[32];
  gr_info("tracking CUDA allocations (release signal %s, run directory %s)",
          gr_opt_signal_name(o->signal, sig, sizeof sig), o->rundir);
  t_starting = 0;
  return true;
}
