/*
 * json.h -- a small JSON writer into a growing buffer (reports, status files, snapshots, the control socket).
 * Out of memory makes the buffer "failed": further appends are ignored and jb_failed() says so.
 */
#ifndef GR_JSON_H
#define GR_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct jbuf {
  char *p;
  size_t len, cap;
  bool failed;
  bool comma; /* a value was written at this level: the next one needs a comma */
} jbuf_t;

void jb_init(jbuf_t *b);
void jb_free(jbuf_t *b);
bool jb_failed(const jbuf_t *b);
void jb_raw(jbuf_t *b, const char *s, size_t n);
void jb_printf(jbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Structure: begin/end objects and arrays; keys; values with automatic commas. jb_obj writes only the brace:
 * where it is a value, put jb_key(b, key) before it (jb_key(b, NULL) in an array), which writes the comma. */
void jb_obj(jbuf_t *b);
void jb_obj_end(jbuf_t *b);
void jb_arr(jbuf_t *b, const char *key);
void jb_arr_end(jbuf_t *b);
void jb_key(jbuf_t *b, const char *key);       /* then one value */
void jb_str(jbuf_t *b, const char *key, const char *s); /* NULL s writes null */
void jb_u64(jbuf_t *b, const char *key, uint64_t v);
void jb_i64(jbuf_t *b, const char *key, int64_t v);
void jb_f64(jbuf_t *b, const char *key, double v);
void jb_bool(jbuf_t *b, const char *key, bool v);
void jb_hex(jbuf_t *b, const char *key, uint64_t v);  /* "0x..." (addresses do not fit a double) */
void jb_null(jbuf_t *b, const char *key);
/* Writes the buffer to fd completely; 0 or -errno. */
int jb_write_fd(const jbuf_t *b, int fd);

#endif
