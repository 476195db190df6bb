/*
 * worker.c -- gpureclaim's one thread: what happens on SIGUSR1 and on the control socket.
 *
 * The signal handler (signal.c) only writes to an eventfd; this thread polls it and the control socket
 * (control.c), runs the release the signal asks for (GPURECLAIM_ON_SIGNAL, release.c) or puts the process to
 * sleep (GPURECLAIM_ON_SIGNAL=sleep, sleep.c), serves one client at a time, every 2 s checks whether the program
 * replaced gpureclaim's handler, runs the idle watch (GPURECLAIM_SLEEP_IDLE), and advances the allocation-time
 * tick while the process allocates (tick.c). It starts with CUDA (core.c), blocks every signal, and ends when
 * the process forks (the child starts its own when it uses CUDA) or exits.
 */
#include "worker.h"
#include "release.h"
#include "sig.h"
#include "peer.h"
#include "sleep.h"
#include "control.h"
#include "report.h"
#include "tick.h"
#include "options.h"
#include "state.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

static _Atomic int g_worker_up;

static void *worker(void *arg) {
  (void)arg;
  prctl(PR_SET_NAME, "gpureclaim", 0, 0, 0);
  bool ticking = true;
  unsigned idle = 0;
  uint64_t last_check = gr_state_now_ms();
  gr_tick_want();
  for (;;) {
    struct pollfd fds[3] = {{.fd = gr_sig_fd(), .events = POLLIN},
                            {.fd = gr_control_fd(), .events = POLLIN},
                            {.fd = gr_tick_fd(), .events = POLLIN}};
    /* The periodic work: every 0.5 s when peers may ask (the status file then follows what this process
     * holds), else 2 s; sooner when an idle sleep comes due (GPURECLAIM_SLEEP_IDLE: gr_sleep_idle_tick). While
     * the allocation-time tick runs, the thread wakes every GR_TICK_MS and does the periodic work when due. */
    int tick = gr_sleep_idle_tick(), every = gr_opt()->status && gr_opt()->peers ? 500 : 2000;
    int period = tick < every ? tick : every;
    ticking = gr_tick_step(ticking, &idle);
    int n = poll(fds, 3, ticking && GR_TICK_MS < period ? GR_TICK_MS : period);
    if (!atomic_load_explicit(&g_worker_up, memory_order_acquire))
      break; /* the process forked or is exiting */
    if (n > 0 && (fds[2].revents & POLLIN)) { /* an allocation found the tick stopped */
      gr_tick_resume();
      ticking = true;
      idle = 0;
    }
    uint64_t now = gr_state_now_ms();
    if (n == 0 && ticking && now - last_check < (uint64_t)(period > 0 ? period : 0))
      continue; /* a tick: the periodic work is not due yet */
    last_check = now;
    if (n > 0 && (fds[0].revents & POLLIN)) {
      uint64_t count;
      while (read(fds[0].fd, &count, sizeof count) > 0) /* coalesce a storm into one release */
        ;
      if (gr_opt()->on_signal_sleep)
        gr_sleep_run(GPURECLAIM_TRIGGER_SIGNAL, 0, NULL);
      else if (gr_sleep_state_now(NULL) == GPURECLAIM_STATE_AWAKE)
        gr_release_run(gr_opt()->on_signal, GPURECLAIM_TRIGGER_SIGNAL, NULL);
      else
        gr_info("release signal ignored: the process sleeps, its device memory is on the host");
    }
    if (n > 0 && (fds[1].revents & POLLIN))
      gr_control_serve_one();
    /* The status file says so ("signal_caught": false): the command then sends no signal that gpureclaim would
     * never see, and does not wait for a release that never comes. */
    if (gr_sig_check_replaced() && gr_opt()->status)
      gr_report_status_update();
    gr_peer_tick();
  }
  return NULL;
}

int gr_worker_start(void) {
  if (atomic_exchange_explicit(&g_worker_up, 1, memory_order_acq_rel))
    return 0;
  gr_tick_open();
  if (gr_opt()->status)
    gr_control_open();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the worker inherits a mask that blocks every signal */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t th;
  int rc = pthread_create(&th, &attr, worker, NULL);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    atomic_store_explicit(&g_worker_up, 0, memory_order_release);
    return -rc;
  }
  return 0;
}

void gr_worker_stop(void) { atomic_store_explicit(&g_worker_up, 0, memory_order_release); }

void gr_worker_atfork_child(void) {
  atomic_store_explicit(&g_worker_up, 0, memory_order_relaxed);
  gr_tick_atfork_child();
}
