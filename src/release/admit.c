/*
 * admit.c -- release admission: a release is admitted while the gates' flag is not GR_GATE_SLEEP and no graph is
 * being captured.
 *
 * A release calls cuCtxSynchronize, cuMemFree and cuMemPoolTrimTo, which the driver forbids while a capture
 * restricts the calling thread (any global-mode capture, a thread-local one of that thread): the call would fail
 * and invalidate the program's capture, so that its cuStreamEndCapture fails. A release and a capture therefore
 * never overlap: a release is refused while any capture runs (a relaxed one too: gpureclaim does not tell the
 * modes apart), and a capture that begins while a release runs waits in its cuStreamBeginCapture hook until the
 * release ends. g_cap_starting counts the BeginCapture hooks between that wait and the moment capture.c knows the
 * capture, so that a release admitted meanwhile cannot miss it.
 * A sleep raises the flag under the same mutex (gr_admit_close) and waits for the releases admitted before it:
 * none calls the driver while the process sleeps.
 */
#include "admit.h"
#include "capture.h"
#include "gate.h"
#include "python.h"
#include "state.h"

#include <errno.h>
#include <pthread.h>

static pthread_mutex_t g_rel_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_rel_cv = PTHREAD_COND_INITIALIZER;
static unsigned g_rel_active;   /* releases calling the driver now, under g_rel_mu */
static unsigned g_cap_starting; /* cuStreamBeginCapture hooks past their wait, not yet done, under g_rel_mu */
static GR_TLS unsigned t_held;  /* admissions the calling thread holds */

int gr_admit_release_begin(void) {
  pthread_mutex_lock(&g_rel_mu);
  int rc = 0;
  if (atomic_load(&gr_gate_flag) == GR_GATE_SLEEP)
    rc = -EAGAIN;
  else if (g_cap_starting || gr_capture_running(NULL))
    rc = -EBUSY;
  else
    g_rel_active++;
  pthread_mutex_unlock(&g_rel_mu);
  if (rc == 0)
    t_held++;
  return rc;
}

void gr_admit_release_end(void) {
  t_held--;
  pthread_mutex_lock(&g_rel_mu);
  if (--g_rel_active == 0)
    pthread_cond_broadcast(&g_rel_cv);
  pthread_mutex_unlock(&g_rel_mu);
}

bool gr_admit_held(void) { return t_held != 0; }

void gr_admit_capture_enter(void) {
  pthread_mutex_lock(&g_rel_mu);
  void *gil = NULL;
  if (g_rel_active && !t_held) {
    /* The running release may need Python's GIL (framework caches): a capturing thread that holds it gives
     * it up while it waits. */
    pthread_mutex_unlock(&g_rel_mu);
    gil = gr_py_save_if_held();
    pthread_mutex_lock(&g_rel_mu);
    while (g_rel_active)
      pthread_cond_wait(&g_rel_cv, &g_rel_mu);
  }
  g_cap_starting++;
  pthread_mutex_unlock(&g_rel_mu);
  if (gil)
    gr_py_restore(gil);
}

void gr_admit_capture_leave(void) {
  pthread_mutex_lock(&g_rel_mu);
  g_cap_starting--;
  pthread_mutex_unlock(&g_rel_mu);
}

void gr_admit_close(void) {
  pthread_mutex_lock(&g_rel_mu);
  atomic_store(&gr_gate_flag, GR_GATE_SLEEP);
  while (g_rel_active)
    pthread_cond_wait(&g_rel_cv, &g_rel_mu);
  pthread_mutex_unlock(&g_rel_mu);
}

void gr_admit_atfork_child(void) {
  pthread_mutex_init(&g_rel_mu, NULL);
  pthread_cond_init(&g_rel_cv, NULL);
  g_rel_active = 0;
  g_cap_starting = 0;
  t_held = 0;
}
