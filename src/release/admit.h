/*
 * admit.h -- release admission (admit.c): whether one of gpureclaim's own releases may call the driver now.
 * Internal.
 *
 * A release calls cuCtxSynchronize, cuMemFree and cuMemPoolTrimTo: never while the process sleeps or is going to
 * (the gates' flag, gate.h), and never while a CUDA graph is being captured (capture.h).
 */
#ifndef GR_ADMIT_H
#define GR_ADMIT_H

#include <stdbool.h>

/* Before a release calls the driver: 0, go on and call gr_admit_release_end() after; -EAGAIN, the process sleeps
 * or is going to; -EBUSY, a CUDA graph is being captured. */
int gr_admit_release_begin(void);
void gr_admit_release_end(void);
/* Whether the calling thread holds an admission now: it runs a release (its releasers included). A call that
 * waits for a release, or for a sleep (which runs one), would wait for itself. */
bool gr_admit_held(void);
/* Around every cuStreamBeginCapture* hook: enter waits for the releases running now (a release and a capture
 * never overlap); leave once capture.c knows the capture (or the begin failed). */
void gr_admit_capture_enter(void);
void gr_admit_capture_leave(void);
/* A sleep closes the gates: raises their flag (GR_GATE_SLEEP) and waits for the releases admitted before. */
void gr_admit_close(void);
/* A forked child: no release runs in it. */
void gr_admit_atfork_child(void);

#endif /* GR_ADMIT_H */
