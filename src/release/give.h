/* give.h -- peer reclaim's serving side: a peer's "give" request (give.c). Internal. */
#ifndef GR_GIVE_H
#define GR_GIVE_H

struct jbuf;
/* Serves a "give" request line (after "give ") from the process whose credentials are pid/uid; fills the answer
 * into b (an open object). */
void gr_give_serve(const char *args, int pid, struct jbuf *b);

#endif /* GR_GIVE_H */
