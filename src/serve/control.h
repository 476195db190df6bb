/* control.h -- the control socket (control.c). Internal. */
#ifndef GR_CONTROL_H
#define GR_CONTROL_H

int gr_control_open(void);
/* In a forked child: close the parent's socket without removing it. */
void gr_control_forget(void);
int gr_control_fd(void);
void gr_control_serve_one(void);
void gr_control_close(void);

#endif /* GR_CONTROL_H */
