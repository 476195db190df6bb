/* The JSON reader of jsonread.h, which the command and the library use on status files and control-socket
 * answers that another process wrote (and may have left half-written): malformed input is refused with a
 * reason and nothing leaked, nesting is bounded, integers are exact, \u escapes become UTF-8, and the typed
 * accessors fall back on absent or mistyped members. */
#include "common.h"
#include "jsonread.h"

#include <criterion/criterion.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each of these is malformed; jparse must say so (NULL and a reason), never take a prefix. Under ASan (CI) a
 * leak of the partly built tree fails the test too (Criterion's workers end without LeakSanitizer's exit check,
 * so the test asks for one). */
Test(jsonread, malformed_input_gives_null_and_a_reason) {
  static const char *const bad[] = {
      "", " ", "{", "[", "}", "]", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[1 2]", "{\"a\" 1}", "{a:1}",
      "\"abc", "\"a\nb\"", "\"\\x\"", "\"\\u12g4\"", "\"\\u12", "tru", "nul", "-", "+1", "x", "{} {}", "[] x",
      "{\"a\":[1,{\"b\":}]}", "{\"a\":[1,2,x]}", "[{\"a\":\"b\"},[\"c\",", "{\"a\":{\"b\":{\"c\":\"unterminated"};
  for (size_t i = 0; i < GR_ARRAY_LEN(bad); i++) {
    const char *err = NULL;
    jnode_t *j = jparse(bad[i], &err);
    cr_assert_null(j, "'%s' was taken", bad[i]);
    cr_assert_not_null(err, "'%s' gave no reason", bad[i]);
    cr_assert_gt(strlen(err), 0);
  }
  cr_assert_null(jparse("{", NULL), "a NULL err is allowed");
#if defined(__SANITIZE_ADDRESS__)
  cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "a refused document leaked what had been read of it");
#endif
}

Test(jsonread, the_reasons_name_what_was_wrong) {
  const char *err;
  cr_assert_null(jparse("[] x", &err));
  cr_assert_str_eq(err, "trailing data");
  cr_assert_null(jparse("\"\\q\"", &err));
  cr_assert_str_eq(err, "bad escape");
  cr_assert_null(jparse("\"\\uzzzz\"", &err));
  cr_assert_str_eq(err, "bad \\u escape");
  cr_assert_null(jparse("@", &err));
  cr_assert_str_eq(err, "unexpected character");
  cr_assert_null(jparse("{\"a\" 1}", &err));
  cr_assert_str_eq(err, "expected ':'");
}

/* A depth of 64 is read; one more is refused rather than recursing without bound (a file of a million '['
 * must not overflow the stack). */
Test(jsonread, nesting_is_bounded) {
  char s[2 * 70000 + 1];
  for (int depth = 63; depth <= 65; depth++) {
    memset(s, '[', (size_t)depth);
    memset(s + depth, ']', (size_t)depth);
    s[2 * depth] = '\0';
    const char *err = NULL;
    jnode_t *j = jparse(s, &err);
    if (depth <= 64) {
      cr_assert_not_null(j, "depth %d: %s", depth, err);
      const jnode_t *n = j;
      for (int d = 1; d < depth; d++) {
        cr_assert_eq(n->type, JN_ARR);
        cr_assert_eq(n->n, 1, "depth %d level %d", depth, d);
        n = &n->kids[0];
      }
      cr_assert_eq(n->type, JN_ARR);
      cr_assert_eq(n->n, 0);
      jdelete(j);
    } else {
      cr_assert_null(j, "depth %d was taken", depth);
      cr_assert_str_eq(err, "nested too deeply");
    }
  }
  memset(s, '[', 70000);
  memset(s + 70000, ']', 70000);
  s[140000] = '\0';
  const char *err = NULL;
  cr_assert_null(jparse(s, &err));
  cr_assert_str_eq(err, "nested too deeply");
}

/* Integers beyond a double's 53 bits are kept exactly; fractions and out-of-range numbers are not integers,
 * and keep a clamped integer view. */
Test(jsonread, integers_are_exact_and_other_numbers_are_clamped) {
  const char *err = NULL;
  jnode_t *j = jparse("{\"big\": 9007199254740993, \"min\": -9223372036854775808, \"max\": 9223372036854775807,"
                      " \"frac\": 2.75, \"exp\": 1e3, \"huge\": 1e300, \"tiny\": -1e300, \"over\": 9223372036854775808,"
                      " \"neg\": -0}",
                      &err);
  cr_assert_not_null(j, "%s", err);
  cr_assert_eq(jint(j, "big", 0), INT64_C(9007199254740993));
  cr_assert(jget(j, "big")->is_int);
  cr_assert_eq(jint(j, "min", 0), INT64_MIN);
  cr_assert_eq(jint(j, "max", 0), INT64_MAX);
  const jnode_t *f = jget(j, "frac");
  cr_assert_not(f->is_int);
  cr_assert(f->num == 2.75, "%g", f->num);
  cr_assert_eq(f->i, 2);
  cr_assert_not(jget(j, "exp")->is_int);
  cr_assert_eq(jint(j, "exp", 0), 1000);
  cr_assert_eq(jint(j, "huge", 0), INT64_MAX);
  cr_assert_eq(jint(j, "tiny", 0), INT64_MIN);
  cr_assert_not(jget(j, "over")->is_int, "2^63 does not fit an int64");
  cr_assert_eq(jint(j, "over", 0), INT64_MAX);
  cr_assert_eq(jint(j, "neg", 1), 0);
  jdelete(j);
}

/* \u escapes become UTF-8: one, two and three bytes, a surrogate pair four; a lone or reversed surrogate
 * becomes U+FFFD (it has no UTF-8); the other short escapes are their characters. */
Test(jsonread, u_escapes_become_utf8) {
  static const struct {
    const char *json, *want;
  } cases[] = {
      {"\"\\u0041\"", "A"},
      {"\"\\u00e9\"", "\xc3\xa9"},
      {"\"\\u20AC\"", "\xe2\x82\xac"},
      {"\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80"},
      {"\"\\ud83d\"", "\xef\xbf\xbd"},
      {"\"\\ude00\\ud83d\"", "\xef\xbf\xbd\xef\xbf\xbd"},
      {"\"\\ud83dx\"", "\xef\xbf\xbdx"},
      {"\"\\ud83d\\u0041\"", "\xef\xbf\xbd" "A"},
      {"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t"},
      {"\"caf\xc3\xa9\"", "caf\xc3\xa9"},
  };
  for (size_t i = 0; i < GR_ARRAY_LEN(cases); i++) {
    const char *err = NULL;
    jnode_t *j = jparse(cases[i].json, &err);
    cr_assert_not_null(j, "%s: %s", cases[i].json, err);
    cr_assert_eq(j->type, JN_STR);
    cr_assert_str_eq(j->s, cases[i].want, "%s", cases[i].json);
    jdelete(j);
  }
  /* \u0000 would end a C string early: it is read, and the string ends there. */
  jnode_t *j = jparse("\"a\\u0000b\"", NULL);
  cr_assert_not_null(j);
  cr_assert_str_eq(j->s, "a");
  jdelete(j);
}

/* A string longer than the reader's first 32-byte allocation grows without losing bytes. */
Test(jsonread, long_strings_are_read_whole) {
  enum { N = 10000 };
  char *json = malloc(N * 6 + 3);
  cr_assert_not_null(json);
  char *p = json;
  *p++ = '"';
  for (int i = 0; i < N; i++)
    p += sprintf(p, i % 2 ? "\\u00e9" : "%c", 'a' + i % 26);
  *p++ = '"';
  *p = '\0';
  jnode_t *j = jparse(json, NULL);
  cr_assert_not_null(j);
  cr_assert_eq(strlen(j->s), N / 2 + N);
  for (int i = 0, k = 0; i < N; i++)
    if (i % 2) {
      cr_assert_eq(memcmp(j->s + k, "\xc3\xa9", 2), 0, "at %d", i);
      k += 2;
    } else {
      cr_assert_eq(j->s[k++], 'a' + i % 26, "at %d", i);
    }
  jdelete(j);
  free(json);
}

/* The accessors take what is there with the right type, and the fallback for anything else: absent, mistyped,
 * or asked of something that is not an object. */
Test(jsonread, accessors_fall_back_on_absent_or_mistyped_members) {
  const char *err = NULL;
  jnode_t *j = jparse(" {\"n\": 7, \"s\": \"x\", \"b\": false, \"h\": \"0x1f\", \"hx\": \"ff\", \"z\": null,"
                      " \"o\": {\"n\": 8}, \"a\": [1], \"n\": 9}\n",
                      &err);
  cr_assert_not_null(j, "%s", err);
  cr_assert_eq(jint(j, "n", -1), 7, "the first of two equal keys is the one read");
  cr_assert_eq(jint(j, "s", -1), -1);
  cr_assert_eq(jint(j, "missing", -1), -1);
  cr_assert_eq(jint(j, "b", -1), -1);
  cr_assert_str_eq(jstr(j, "s", "d"), "x");
  cr_assert_str_eq(jstr(j, "n", "d"), "d");
  cr_assert_str_eq(jstr(j, "z", "d"), "d");
  cr_assert_null(jstr(j, "missing", NULL));
  cr_assert_eq(jbool(j, "b", true), false);
  cr_assert_eq(jbool(j, "n", true), true);
  cr_assert_eq(jbool(j, "z", false), false);
  cr_assert_eq(jhex(j, "h", 0), 0x1f);
  cr_assert_eq(jhex(j, "hx", 0), 0xff, "the 0x is optional");
  cr_assert_eq(jhex(j, "n", 5), 5, "a number is not a hex string");
  cr_assert_eq(jhex(j, "missing", 5), 5);
  cr_assert_eq(jint(jget(j, "o"), "n", 0), 8);
  cr_assert_null(jget(jget(j, "a"), "n"), "an array has no members");
  cr_assert_null(jget(NULL, "n"));
  cr_assert_eq(jint(NULL, "n", 3), 3);
  cr_assert_eq(jint(jget(j, "a"), "n", 3), 3);
  cr_assert_eq(jget(j, "z")->type, JN_NULL);
  jdelete(j);
}

/* jfree empties a node the caller owns (here on the stack, a copy of a parsed tree's root) without freeing it;
 * jdelete(NULL) does nothing. */
Test(jsonread, jfree_empties_a_node_in_place_and_jdelete_takes_null) {
  jnode_t *j = jparse("{\"a\": [\"b\", {\"c\": \"d\"}], \"e\": \"f\"}", NULL);
  cr_assert_not_null(j);
  jnode_t copy = *j;
  free(j);
  cr_assert_eq(copy.n, 2);
  jfree(&copy);
  cr_assert_eq(copy.n, 0);
  cr_assert_null(copy.kids);
  cr_assert_null(copy.keys);
  jfree(&copy);
  jfree(NULL);
  jdelete(NULL);
}

/* Whitespace JSON allows (space, tab, newline, carriage return) is skipped everywhere; others are not. */
Test(jsonread, whitespace_is_skipped_between_tokens) {
  jnode_t *j = jparse("\r\n\t{ \"a\" :\t[ 1 ,\n2 ] , \"b\" : { } }\r\n", NULL);
  cr_assert_not_null(j);
  cr_assert_eq(jget(j, "a")->n, 2);
  cr_assert_eq(jget(j, "b")->type, JN_OBJ);
  jdelete(j);
  cr_assert_null(jparse("\v[]", NULL));
  cr_assert_null(jparse("[]\f", NULL));
}
