/*
 * jsonread.h -- a small JSON reader for status files and control-socket answers, in gpureclaim_common: the
 * command reads them, and so does the library where it reads its peers' status files.
 * Integers are kept exactly (addresses and byte counts exceed a double's precision).
 */
#ifndef GR_JSONREAD_H
#define GR_JSONREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { JN_NULL, JN_BOOL, JN_NUM, JN_STR, JN_ARR, JN_OBJ } jtype_t;

typedef struct jnode {
  jtype_t type;
  bool b;
  double num;
  int64_t i;       /* exact when the number was an integer (is_int) */
  bool is_int;
  char *s;         /* JN_STR */
  struct jnode *kids;
  char **keys;     /* JN_OBJ */
  size_t n;
} jnode_t;

/* Parses text; NULL on malformed input (err set to a short reason). The tree it returns is freed with jdelete. */
jnode_t *jparse(const char *text, const char **err);
/* The same, for text that must be one JSON object: anything else is NULL (err "not a JSON object"). */
jnode_t *jparse_object(const char *text, const char **err);
/* Frees a tree jparse returned, root included (NULL: nothing). */
void jdelete(jnode_t *root);
/* Empties one node in place (its children, keys and string), for a node the caller owns otherwise. */
void jfree(jnode_t *n);
/* Member of an object (NULL if absent or not an object). */
const jnode_t *jget(const jnode_t *obj, const char *key);
/* Typed accessors with a fallback for absent or mistyped members. */
int64_t jint(const jnode_t *obj, const char *key, int64_t dflt);
const char *jstr(const jnode_t *obj, const char *key, const char *dflt);
bool jbool(const jnode_t *obj, const char *key, bool dflt);
/* A hexadecimal string member ("0x...") as a number; dflt if absent. */
uint64_t jhex(const jnode_t *obj, const char *key, uint64_t dflt);

#endif
