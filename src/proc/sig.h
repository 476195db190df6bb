/* sig.h -- the release signal's handler (signal.c). Internal. */
#ifndef GR_SIG_H
#define GR_SIG_H

#include <stdbool.h>

int gr_sig_install(void);
/* The descriptor the handler writes to; the worker polls it. -1 when the signal is off. */
int gr_sig_fd(void);
/* Whether the program replaced gpureclaim's handler since the last check (said once, with a warning). */
bool gr_sig_check_replaced(void);
/* Whether gpureclaim's handler is the signal's action now (false: off, ignored, or the program's own since). */
bool gr_sig_caught(void);
void gr_sig_atfork_child(void);

#endif /* GR_SIG_H */
