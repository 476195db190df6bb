/* jsonread.c -- see jsonread.h. A recursive-descent parser over a NUL-terminated buffer. */
#include "jsonread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *p;
  const char *err;
  int depth;
} P;

static void ws(P *p) {
  while (*p->p == ' ' || *p->p == '\t' || *p->p == '\n' || *p->p == '\r')
    p->p++;
}

static bool value(P *p, jnode_t *out);

static bool fail(P *p, const char *why) {
  if (!p->err)
    p->err = why;
  return false;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Four hex digits of a \\u escape at p->p; -1 if they are not. */
static long hex4(P *p) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p->p[i]);
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  p->p += 4;
  return v;
}

/* UTF-8 of code point v into out; returns its length. */
static size_t utf8(unsigned long v, unsigned char out[4]) {
  if (v < 0x80)
    return out[0] = (unsigned char)v, 1;
  if (v < 0x800)
    return out[0] = (unsigned char)(0xc0 | v >> 6), out[1] = (unsigned char)(0x80 | (v & 0x3f)), 2;
  if (v < 0x10000) {
    out[0] = (unsigned char)(0xe0 | v >> 12);
    out[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
    out[2] = (unsigned char)(0x80 | (v & 0x3f));
    return 3;
  }
  out[0] = (unsigned char)(0xf0 | v >> 18);
  out[1] = (unsigned char)(0x80 | ((v >> 12) & 0x3f));
  out[2] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
  out[3] = (unsigned char)(0x80 | (v & 0x3f));
  return 4;
}

static char *string(P *p) {
  if (*p->p != '"')
    return fail(p, "expected a string"), NULL;
  p->p++;
  size_t cap = 32, n = 0;
  char *s = malloc(cap);
  if (!s)
    return fail(p, "out of memory"), NULL;
  while (*p->p != '"') {
    unsigned char c = (unsigned char)*p->p++;
    unsigned char bytes[4] = {c};
    size_t nb = 1;
    if (!c || c < 0x20) {
      free(s);
      return fail(p, "unterminated string"), NULL;
    }
    if (c == '\\') {
      char e = *p->p++;
      switch (e) {
      case '"': case '\\': case '/': bytes[0] = (unsigned char)e; break;
      case 'n': bytes[0] = '\n'; break;
      case 't': bytes[0] = '\t'; break;
      case 'r': bytes[0] = '\r'; break;
      case 'b': bytes[0] = '\b'; break;
      case 'f': bytes[0] = '\f'; break;
      case 'u': {
        long v = hex4(p);
        if (v < 0) {
          free(s);
          return fail(p, "bad \\u escape"), NULL;
        }
        if (v >= 0xd800 && v <= 0xdbff && p->p[0] == '\\' && p->p[1] == 'u') { /* a surrogate pair */
          const char *at = p->p;
          p->p += 2;
          long lo = hex4(p);
          if (lo >= 0xdc00 && lo <= 0xdfff)
            v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
          else
            p->p = at;
        }
        if (v >= 0xd800 && v <= 0xdfff)
          v = 0xfffd; /* a lone surrogate */
        nb = utf8((unsigned long)v, bytes);
        break;
      }
      default:
        free(s);
        return fail(p, "bad escape"), NULL;
      }
    }
    if (n + nb + 1 > cap) {
      char *t = realloc(s, cap *= 2);
      if (!t) {
        free(s);
        return fail(p, "out of memory"), NULL;
      }
      s = t;
    }
    memcpy(s + n, bytes, nb);
    n += nb;
  }
  p->p++;
  s[n] = '\0';
  return s;
}

static bool push(jnode_t *parent, jnode_t *kid, char *key) {
  jnode_t *k = realloc(parent->kids, (parent->n + 1) * sizeof *k);
  if (!k)
    return false;
  parent->kids = k;
  if (parent->type == JN_OBJ) {
    char **keys = realloc(parent->keys, (parent->n + 1) * sizeof *keys);
    if (!keys)
      return false;
    parent->keys = keys;
    keys[parent->n] = key;
  }
  parent->kids[parent->n++] = *kid;
  return true;
}

static bool value(P *p, jnode_t *out) {
  memset(out, 0, sizeof *out);
  if (++p->depth > 64)
    return fail(p, "nested too deeply");
  ws(p);
  char c = *p->p;
  bool ok = true;
  if (c == '{' || c == '[') {
    out->type = c == '{' ? JN_OBJ : JN_ARR;
    p->p++;
    ws(p);
    if (*p->p == (c == '{' ? '}' : ']')) {
      p->p++;
    } else {
      for (;;) {
        char *key = NULL;
        ws(p);
        if (out->type == JN_OBJ) {
          if (!(key = string(p)))
            return false;
          ws(p);
          if (*p->p++ != ':') {
            free(key);
            return fail(p, "expected ':'");
          }
        }
        jnode_t kid;
        if (!value(p, &kid) || !push(out, &kid, key)) {
          free(key);
          jfree(&kid); /* a value that failed half-way holds what it had read so far */
          return fail(p, "bad member");
        }
        ws(p);
        if (*p->p == ',') {
          p->p++;
          continue;
        }
        if (*p->p++ != (out->type == JN_OBJ ? '}' : ']'))
          return fail(p, "expected ',' or a closing bracket");
        break;
      }
    }
  } else if (c == '"') {
    out->type = JN_STR;
    ok = (out->s = string(p)) != NULL;
  } else if (!strncmp(p->p, "true", 4) || !strncmp(p->p, "false", 5)) {
    out->type = JN_BOOL;
    out->b = c == 't';
    p->p += out->b ? 4 : 5;
  } else if (!strncmp(p->p, "null", 4)) {
    out->type = JN_NULL;
    p->p += 4;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    out->type = JN_NUM;
    char *end;
    out->num = strtod(p->p, &end);
    if (end == p->p)
      return fail(p, "bad number");
    char *iend;
    errno = 0;
    long long v = strtoll(p->p, &iend, 10);
    out->is_int = iend == end && errno == 0;
    /* A fraction or an out-of-range number keeps a clamped integer view (a cast out of range is undefined). */
    out->i = out->is_int ? (int64_t)v
             : out->num >= 9.2e18 ? INT64_MAX
             : out->num <= -9.2e18 ? INT64_MIN
             : out->num == out->num ? (int64_t)out->num : 0;
    p->p = end;
  } else {
    return fail(p, "unexpected character");
  }
  p->depth--;
  return ok;
}

jnode_t *jparse(const char *text, const char **err) {
  P p = {text, NULL, 0};
  jnode_t *n = calloc(1, sizeof *n);
  if (!n || !value(&p, n)) {
    if (err)
      *err = p.err ? p.err : "out of memory";
    jdelete(n);
    return NULL;
  }
  ws(&p);
  if (*p.p) {
    if (err)
      *err = "trailing data";
    jdelete(n);
    return NULL;
  }
  return n;
}

jnode_t *jparse_object(const char *text, const char **err) {
  jnode_t *n = jparse(text, err);
  if (n && n->type != JN_OBJ) {
    if (err)
      *err = "not a JSON object";
    jdelete(n);
    return NULL;
  }
  return n;
}

void jdelete(jnode_t *root) {
  jfree(root);
  free(root);
}

void jfree(jnode_t *n) {
  if (!n)
    return;
  for (size_t i = 0; i < n->n; i++) {
    jfree(&n->kids[i]);
    if (n->keys)
      free(n->keys[i]);
  }
  free(n->kids);
  free(n->keys);
  free(n->s);
  memset(n, 0, sizeof *n);
}

const jnode_t *jget(const jnode_t *o, const char *key) {
  if (!o || o->type != JN_OBJ)
    return NULL;
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->keys[i], key))
      return &o->kids[i];
  return NULL;
}

int64_t jint(const jnode_t *o, const char *key, int64_t dflt) {
  const jnode_t *v = jget(o, key);
  return v && v->type == JN_NUM ? v->i : dflt;
}

const char *jstr(const jnode_t *o, const char *key, const char *dflt) {
  const jnode_t *v = jget(o, key);
  return v && v->type == JN_STR ? v->s : dflt;
}

bool jbool(const jnode_t *o, const char *key, bool dflt) {
  const jnode_t *v = jget(o, key);
  return v && v->type == JN_BOOL ? v->b : dflt;
}

uint64_t jhex(const jnode_t *o, const char *key, uint64_t dflt) {
  const char *s = jstr(o, key, NULL);
  return s ? strtoull(s, NULL, 16) : dflt;
}
