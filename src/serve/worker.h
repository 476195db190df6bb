/* worker.h -- the thread that serves the signal, the control socket and the tick (worker.c). Internal. */
#ifndef GR_WORKER_H
#define GR_WORKER_H

int gr_worker_start(void);
void gr_worker_stop(void);
void gr_worker_atfork_child(void);

#endif /* GR_WORKER_H */
