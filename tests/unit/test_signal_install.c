/* The release signal's handler and fork() (src/proc/signal.c, compiled in here to reach its state), and a program
 * that ignores the signal. Found by an adversarial pass: a fork between the parent's sigaction() and its
 * "installed" flag gave a child that kept gpureclaim's handler and, once it used CUDA, chained that handler to
 * itself (endless recursion on the first signal). */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../src/proc/signal.c"

static volatile sig_atomic_t g_calls;
static void counting(int sig) {
  (void)sig;
  g_calls++;
}

static void set_action(void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
}

static bool current_is_ours(void) {
  struct sigaction cur;
  cr_assert_eq(sigaction(SIGUSR1, NULL, &cur), 0);
  return is_ours(&cur);
}

Test(signal_install, installs_and_chains_to_the_previous_handler) {
  set_action(counting);
  cr_assert_eq(gr_sig_install(), 0);
  cr_assert(current_is_ours());
  raise(SIGUSR1);
  cr_assert_eq(g_calls, 1);
}

Test(signal_install, a_child_forked_before_the_flag_was_set_gets_the_old_action_back) {
  set_action(counting);
  cr_assert_eq(gr_sig_install(), 0);
  atomic_store(&g_installed, 0); /* as inherited by a child forked between sigaction() and the flag */
  gr_sig_atfork_child();
  cr_assert_not(current_is_ours(), "the child still carries gpureclaim's handler");
  raise(SIGUSR1);
  cr_assert_eq(g_calls, 1);
}

Test(signal_install, installing_over_its_own_handler_never_chains_to_itself) {
  set_action(counting);
  cr_assert_eq(gr_sig_install(), 0);
  atomic_store(&g_installed, 0); /* that child, using CUDA: the handler is installed again */
  cr_assert_eq(gr_sig_install(), 0);
  raise(SIGUSR1); /* before the fix: the handler called itself until the stack ran out */
  cr_assert_eq(g_calls, 1, "the program's handler runs once");
}

Test(signal_install, a_program_that_ignores_the_signal_keeps_ignoring_it) {
  set_action(SIG_IGN);
  cr_assert_eq(gr_sig_install(), 0);
  struct sigaction cur;
  cr_assert_eq(sigaction(SIGUSR1, NULL, &cur), 0);
  cr_assert(!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN,
            "a handler would be reset to terminate in children started by posix_spawn");
  cr_assert_eq(atomic_load(&g_installed), 0);
}

/* A child forked by the program inherits the handler, and a signal can reach it before its atfork handler
 * runs (here no atfork handler is registered at all: every signal comes "before"). The handler wrote to the
 * parent's eventfd, so the parent released for nothing, and the child survived a signal that should end it. */
static void expect_no_release_requested(void) {
  uint64_t count = 0;
  cr_assert_lt(read(gr_sig_fd(), &count, sizeof count), 0, "the parent was asked for a release (%llu)",
               (unsigned long long)count);
  cr_assert_eq(errno, EAGAIN);
}

Test(signal_install, a_child_that_gets_the_signal_before_its_atfork_handler_dies_of_it) {
  cr_assert_eq(gr_sig_install(), 0);
  for (int i = 0; i < 20; i++) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      raise(SIGUSR1);
      _exit(0); /* survived */
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR1,
              "the child was not ended by the signal (status %#x)", status);
  }
  expect_no_release_requested();
  raise(SIGUSR1); /* the installer itself still asks for a release */
  uint64_t count = 0;
  cr_assert_eq(read(gr_sig_fd(), &count, sizeof count), (ssize_t)sizeof count);
  cr_assert_eq(count, 1);
}

Test(signal_install, such_a_child_runs_the_handler_from_before_gpureclaim) {
  set_action(counting);
  cr_assert_eq(gr_sig_install(), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    raise(SIGUSR1);
    raise(SIGUSR1);
    struct sigaction cur;
    sigaction(SIGUSR1, NULL, &cur);
    _exit(g_calls == 2 && !is_ours(&cur) ? 0 : 1);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child's own handler did not run for each signal, or gpureclaim's stayed (status %#x)", status);
  expect_no_release_requested();
}

/* ---- a previous action given with SA_SIGINFO whose handler is SIG_IGN or SIG_DFL ---- */

/* sa_handler and sa_sigaction share their storage: SIG_IGN/SIG_DFL with SA_SIGINFO set are still those values,
 * never a function to call. */
static void set_siginfo_action(void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
}

/* A forked child raises SIGUSR1 before any atfork handler could run; returns its wait status. */
static int child_raises(void) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    raise(SIGUSR1);
    _exit(0);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  return status;
}

Test(signal_install, ignored_with_the_siginfo_flag_is_still_ignored) {
  set_siginfo_action(SIG_IGN);
  cr_assert_eq(gr_sig_install(), 0);
  struct sigaction cur;
  cr_assert_eq(sigaction(SIGUSR1, NULL, &cur), 0);
  cr_assert_eq(cur.sa_handler, SIG_IGN, "gpureclaim installed a handler over SIG_IGN given with SA_SIGINFO");
  int status = child_raises();
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a child of a program ignoring the signal died (%#x)",
            status);
  cr_assert_eq(raise(SIGUSR1), 0); /* and the program itself survives it */
}

Test(signal_install, default_with_the_siginfo_flag_ends_a_child_as_the_default_does) {
  set_siginfo_action(SIG_DFL);
  cr_assert_eq(gr_sig_install(), 0);
  cr_assert(gr_sig_caught(), "installed over SIG_DFL");
  int status = child_raises();
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR1, "the child survived a default-action signal (%#x)",
            status);
  uint64_t n = 0;
  cr_assert_eq(read(gr_sig_fd(), &n, sizeof n), -1, "the parent was asked for a release by its child's signal");
}
