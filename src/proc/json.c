/* json.c -- see json.h. */
#include "json.h"
#include "state.h"

#include "outfile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jb_init(jbuf_t *b) { memset(b, 0, sizeof *b); }
void jb_free(jbuf_t *b) {
  free(b->p);
  jb_init(b);
}
bool jb_failed(const jbuf_t *b) { return b->failed; }

static bool reserve(jbuf_t *b, size_t n) {
  if (b->failed)
    return false;
  if (b->len + n + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + n + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->failed = true;
    return false;
  }
  b->p = p;
  b->cap = cap;
  return true;
}

void jb_raw(jbuf_t *b, const char *s, size_t n) {
  if (!reserve(b, n))
    return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void jb_printf(jbuf_t *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n < sizeof tmp) {
    jb_raw(b, tmp, (size_t)n);
    return;
  }
  if (!reserve(b, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

static void sep(jbuf_t *b) {
  if (b->comma)
    jb_raw(b, ",", 1);
  b->comma = true;
}

static void put_jb(void *ctx, const char *p, size_t n) { jb_raw(ctx, p, n); }
static void escaped(jbuf_t *b, const char *s) { gr_json_escape(s, put_jb, b); }

void jb_key(jbuf_t *b, const char *key) {
  sep(b);
  if (key) {
    escaped(b, key);
    jb_raw(b, ":", 1);
  }
}

void jb_obj(jbuf_t *b) {
  jb_raw(b, "{", 1);
  b->comma = false;
}
void jb_obj_end(jbuf_t *b) {
  jb_raw(b, "}", 1);
  b->comma = true;
}
void jb_arr(jbuf_t *b, const char *key) {
  jb_key(b, key);
  jb_raw(b, "[", 1);
  b->comma = false;
}
void jb_arr_end(jbuf_t *b) {
  jb_raw(b, "]", 1);
  b->comma = true;
}

void jb_str(jbuf_t *b, const char *key, const char *s) {
  jb_key(b, key);
  if (s)
    escaped(b, s);
  else
    jb_raw(b, "null", 4);
}
void jb_u64(jbuf_t *b, const char *key, uint64_t v) {
  jb_key(b, key);
  jb_printf(b, "%llu", (unsigned long long)v);
}
void jb_i64(jbuf_t *b, const char *key, int64_t v) {
  jb_key(b, key);
  jb_printf(b, "%lld", (long long)v);
}
void jb_f64(jbuf_t *b, const char *key, double v) {
  jb_key(b, key);
  jb_printf(b, "%.3f", v);
}
void jb_bool(jbuf_t *b, const char *key, bool v) {
  jb_key(b, key);
  jb_raw(b, v ? "true" : "false", v ? 4 : 5);
}
void jb_hex(jbuf_t *b, const char *key, uint64_t v) {
  jb_key(b, key);
  jb_printf(b, "\"0x%llx\"", (unsigned long long)v);
}
void jb_null(jbuf_t *b, const char *key) {
  jb_key(b, key);
  jb_raw(b, "null", 4);
}

int jb_write_fd(const jbuf_t *b, int fd) { return b->failed ? -ENOMEM : gr_out_write_fd(fd, b->p, b->len); }
