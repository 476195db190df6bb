/*
 * signal.c -- the release signal (SIGUSR1 by default, GPURECLAIM_SIGNAL).
 *
 * Installed with sigaction when the process initialises CUDA, chained to the handler installed before (a JVM,
 * Python's faulthandler.register). The handler is async-signal-safe: it writes to an eventfd and calls the
 * previous handler; the worker thread, which blocks every signal, does the release. If the program later
 * installs its own handler for the signal, gpureclaim says so once and does not fight it (the command's
 * control socket still reaches the process). A previous action of SIG_DFL (terminate) is not chained: a
 * process under gpureclaim survives the signal. A program that ignores the signal (SIG_IGN) keeps ignoring it:
 * gpureclaim installs nothing and says so (the control socket still reaches it), because a handler would be
 * reset to the default action, termination, in every child it starts with posix_spawn() or system(), where
 * no atfork handler runs to give the child its SIG_IGN back.
 *
 * The handler acts only in the process that installed it. A child forked by the program inherits it, and a
 * signal can reach the child before its atfork handler gives the signal back: there, the eventfd is still the
 * parent's (a write would make the parent release, and the child would survive a signal that should end it).
 * So the handler compares the process's pid with the installer's and, in any other process, puts back the
 * action that was there before gpureclaim and lets the signal take it (the default: the child ends).
 */
#include "sig.h"
#include "options.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

static int g_sig;
static struct sigaction g_prev;
static _Atomic int g_fd = -1;
static _Atomic int g_installed;
static _Atomic int g_installer; /* the pid of the process that installed the handler */

static void handler(int sig, siginfo_t *info, void *uc);

static bool is_ours(const struct sigaction *sa) { return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == handler; }

/* Runs the action from before gpureclaim. SIG_DFL and SIG_IGN are values of sa_handler, which shares its storage
 * with sa_sigaction: they are told apart from a function whatever SA_SIGINFO says (a previous action may be
 * SIG_IGN with SA_SIGINFO set, and calling it would jump to address 1). With dfl_raise, SIG_DFL is carried out
 * (the signal is raised again: blocked while this handler runs, it is delivered with its default action as the
 * handler returns); else it does nothing, as chaining from a process that handles the signal. */
static void run_prev(int sig, siginfo_t *info, void *uc, bool dfl_raise) {
  if (g_prev.sa_handler == SIG_DFL) {
    if (dfl_raise)
      syscall(SYS_tgkill, (pid_t)syscall(SYS_getpid), (pid_t)syscall(SYS_gettid), sig);
  } else if (g_prev.sa_handler == SIG_IGN) {
    /* nothing */
  } else if (g_prev.sa_flags & SA_SIGINFO) {
    if (g_prev.sa_sigaction != handler) /* never itself: see gr_sig_install() */
      g_prev.sa_sigaction(sig, info, uc);
  } else {
    g_prev.sa_handler(sig);
  }
}

/* In a process that did not install the handler (a child before its atfork handler ran): the action from
 * before gpureclaim, as if gpureclaim had never been there. */
static void not_ours_to_handle(int sig, siginfo_t *info, void *uc) {
  sigaction(sig, &g_prev, NULL);
  run_prev(sig, info, uc, true);
}

static void handler(int sig, siginfo_t *info, void *uc) {
  int saved = errno;
  if ((int)syscall(SYS_getpid) != atomic_load_explicit(&g_installer, memory_order_relaxed)) {
    not_ours_to_handle(sig, info, uc);
    errno = saved;
    return;
  }
  int fd = atomic_load_explicit(&g_fd, memory_order_relaxed);
  if (fd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one); /* EAGAIN at a saturated counter is fine: a release is due */
    (void)w;
  }
  run_prev(sig, info, uc, false);
  errno = saved;
}

int gr_sig_install(void) {
  int sig = gr_opt()->signal;
  if (!sig || atomic_load_explicit(&g_installed, memory_order_acquire))
    return 0;
  struct sigaction cur;
  if (sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) { /* SA_SIGINFO or not: run_prev() */
    char name[16];
    gr_warn("the program ignores SIG%s, so gpureclaim installs no handler for it: releases by signal do not "
            "reach this process (the gpureclaim command still does, through its control socket; or choose "
            "another signal with GPURECLAIM_SIGNAL)",
            gr_opt_signal_name(sig, name, sizeof name));
    return 0;
  }
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0)
    return -errno;
  atomic_store_explicit(&g_fd, fd, memory_order_release);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  g_sig = sig;
  atomic_store_explicit(&g_installer, (int)getpid(), memory_order_relaxed);
  struct sigaction prev;
  if (sigaction(sig, &sa, &prev) != 0) {
    int e = errno;
    atomic_store_explicit(&g_fd, -1, memory_order_release);
    close(fd);
    return -e;
  }
  /* Our own handler already there: a child forked between a parent's sigaction() and the flag below, where
   * g_prev (inherited) still holds what came before it. Chaining to ourselves would recurse forever. */
  if (!is_ours(&prev))
    g_prev = prev;
  atomic_store_explicit(&g_installed, 1, memory_order_release);
  return 0;
}

int gr_sig_fd(void) { return atomic_load_explicit(&g_fd, memory_order_acquire); }

bool gr_sig_caught(void) {
  struct sigaction cur;
  return atomic_load_explicit(&g_installed, memory_order_acquire) && sigaction(g_sig, NULL, &cur) == 0 &&
         is_ours(&cur);
}

static _Atomic int g_replaced_noticed;

bool gr_sig_check_replaced(void) {
  if (!atomic_load_explicit(&g_installed, memory_order_acquire) || gr_sig_caught() ||
      atomic_exchange_explicit(&g_replaced_noticed, 1, memory_order_relaxed))
    return false;
  char name[16];
  gr_warn("the program installed its own SIG%s handler; gpureclaim leaves it alone: releases by signal no "
          "longer reach this process (the gpureclaim command still does, through its control socket; or "
          "choose another signal with GPURECLAIM_SIGNAL)",
          gr_opt_signal_name(g_sig, name, sizeof name));
  return true;
}

void gr_sig_atfork_child(void) {
  /* A child that never uses CUDA carries no gpureclaim handler: give the signal back to what was there. Whether
   * or not the flag was set: a fork between the parent's sigaction() and the flag hands down our handler too. */
  struct sigaction cur;
  atomic_store_explicit(&g_installed, 0, memory_order_release);
  atomic_store_explicit(&g_replaced_noticed, 0, memory_order_relaxed);
  if (g_sig && sigaction(g_sig, NULL, &cur) == 0 && is_ours(&cur))
    sigaction(g_sig, &g_prev, NULL); /* only ours: a handler the program installed since stays */
  int fd = atomic_exchange_explicit(&g_fd, -1, memory_order_acq_rel);
  if (fd >= 0)
    close(fd);
}
