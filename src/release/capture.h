/*
 * capture.h -- the CUDA graph captures under way, as the hooks saw them begin and end (capture.c). A capture
 * cannot be checkpointed (sleep.c refuses a sleep meanwhile), and the driver fails the frees and synchronizations
 * a release makes while one runs (admit.c refuses a release meanwhile). Internal.
 */
#ifndef GR_CAPTURE_H
#define GR_CAPTURE_H

#include <cuda.h>
#include <stdbool.h>

/* A stream capture began (begin) or ended on stream s (ptsz: through a per-thread-default-stream variant). */
void gr_capture_note(CUstream s, bool ptsz, bool begin);
/* Whether a stream is capturing a graph now, as far as gpureclaim saw it begin (the driver is asked whether it
 * still does); *s (may be NULL): one such stream, NULL when only their count is known. */
bool gr_capture_running(CUstream *s);
/* A forked child: the parent's captures are not the child's. */
void gr_capture_atfork_child(void);

#endif /* GR_CAPTURE_H */
