/*
 * capture.c -- the streams capturing a graph now (cuStreamBeginCapture* to cuStreamEndCapture), noted by the
 * hooks (hooks/driver.c). A few at most in practice; past GR_CAPTURE_MAX the count alone is kept (g_capture_lost),
 * and a capture is taken to be running until the set is empty again. A stream destroyed while it captures ends
 * its capture in the driver without an EndCapture: the driver is asked whether a noted stream still captures
 * before it counts, and one that no longer does is dropped.
 */
#include "capture.h"
#include "real.h"

#include <pthread.h>

#define GR_CAPTURE_MAX 64
static pthread_mutex_t g_cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  CUstream s;
  bool ptsz;
} g_cap[GR_CAPTURE_MAX];
static int g_ncap, g_capture_lost;

void gr_capture_note(CUstream s, bool ptsz, bool begin) {
  pthread_mutex_lock(&g_cap_mu);
  int i = 0;
  while (i < g_ncap && !(g_cap[i].s == s && g_cap[i].ptsz == ptsz))
    i++;
  if (begin && i == g_ncap) {
    if (g_ncap < GR_CAPTURE_MAX)
      g_cap[g_ncap].s = s, g_cap[g_ncap].ptsz = ptsz, g_ncap++;
    else
      g_capture_lost++;
  } else if (!begin && i < g_ncap) {
    g_cap[i] = g_cap[--g_ncap];
  } else if (!begin && g_capture_lost > 0) {
    g_capture_lost--;
  }
  pthread_mutex_unlock(&g_cap_mu);
}

bool gr_capture_running(CUstream *out) {
  typedef CUresult (*is_fn)(CUstream, CUstreamCaptureStatus *);
  is_fn is = (is_fn)gr_real_driver("cuStreamIsCapturing"), is_pt = (is_fn)gr_real_driver("cuStreamIsCapturing_ptsz");
  pthread_mutex_lock(&g_cap_mu);
  for (int i = 0; i < g_ncap;) {
    is_fn f = g_cap[i].ptsz && is_pt ? is_pt : is;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (f && f(g_cap[i].s, &st) != CUDA_SUCCESS)
      st = CU_STREAM_CAPTURE_STATUS_NONE; /* no such stream any more */
    if (st == CU_STREAM_CAPTURE_STATUS_NONE) {
      g_cap[i] = g_cap[--g_ncap];
      continue;
    }
    if (out)
      *out = g_cap[i].s;
    pthread_mutex_unlock(&g_cap_mu);
    return true;
  }
  bool lost = g_capture_lost > 0;
  pthread_mutex_unlock(&g_cap_mu);
  if (out)
    *out = NULL;
  return lost;
}

void gr_capture_atfork_child(void) {
  pthread_mutex_init(&g_cap_mu, NULL);
  g_ncap = 0, g_capture_lost = 0;
}
