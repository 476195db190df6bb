/*
 * worker.c -- gpureclaim's one thread: what happens on SIGUSR1 and on the control socket.
 *
 * The signal handler (signal.c) only writes to an eventfd; this thread polls it and the control socket
 * (control.c), runs the release the signal asks for (GPURECLAIM_ON_SIGNAL, release.c) or puts the process to
 * sleep (GPURECLAIM_ON_SIGNAL=sleep, sleep.c), serves one client at a time, every 2 s checks whether the program
 * replaced gpureclaim's handler, and runs the idle watch (GPURECLAIM_SLEEP_IDLE). It starts with CUDA (core.c),
 * blocks every signal, and ends when the process forks (the child starts its own when it uses CUDA) or exits.
 */
#include "gpureclaim_internal.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

static _Atomic int g_worker_up;

static void *worker(void *arg) {
  (void)arg;
  prctl(PR_SET_NAME, "gpureclaim", 0, 0, 0);
  for (;;) {
    struct pollfd fds[2] = {{.fd = gr_sig_fd(), .events = POLLIN}, {.fd = gr_ctl_fd(), .events = POLLIN}};
    /* Every 0.5 s when peers may ask (the status file then follows what this process holds), else 2 s; sooner
     * when an idle sleep comes due (GPURECLAIM_SLEEP_IDLE: gr_sleep_idle_tick). */
    int tick = gr_sleep_idle_tick(), every = gr_opt()->status && gr_opt()->peers ? 500 : 2000;
    int n = poll(fds, 2, tick < every ? tick : every);
    if (!atomic_load_explicit(&g_worker_up, memory_order_acquire))
      break; /* the process forked or is exiting */
    if (n > 0 && (fds[0].revents & POLLIN)) {
      uint64_t count;
      while (read(fds[0].fd, &count, sizeof count) > 0) /* coalesce a storm into one release */
        ;
      if (gr_opt()->on_signal_sleep)
        gr_sleep_run(GPURECLAIM_TRIGGER_SIGNAL, 0, NULL);
      else if (gr_sleep_state_now(NULL) == GPURECLAIM_STATE_AWAKE)
        gr_rel_run(gr_opt()->on_signal, GPURECLAIM_TRIGGER_SIGNAL, NULL);
      else
        gr_info("release signal ignored: the process sleeps, its device memory is on the host");
    }
    if (n > 0 && (fds[1].revents & POLLIN))
      gr_ctl_serve_one();
    gr_sig_check_replaced();
    gr_peer_tick();
  }
  return NULL;
}

int gr_worker_start(void) {
  if (atomic_exchange_explicit(&g_worker_up, 1, memory_order_acq_rel))
    return 0;
  if (gr_opt()->status)
    gr_ctl_open();
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
  /* The worker did not survive the fork. */
  atomic_store_explicit(&g_worker_up, 0, memory_order_relaxed);
}
