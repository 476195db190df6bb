/* The text contracts of common.h, shared by the library and the command: which byte sequences pass into JSON and
 * tables as UTF-8 (gr_utf8_len), how a string becomes JSON (gr_json_escape), and how a process's start time is
 * read from /proc/PID/stat (gr_stat_start_ticks), and how the JSON the library writes is read back (jsonread.h). */
#include "common.h"
#include "jsonread.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static size_t len(const char *s) { return gr_utf8_len((const unsigned char *)s); }

Test(utf8, well_formed_sequences) {
  cr_assert_eq(len("a"), 1);
  cr_assert_eq(len("\x7f"), 1);
  cr_assert_eq(len("\xc3\xa9"), 2);         /* U+00E9 */
  cr_assert_eq(len("\xc2\x80"), 2);         /* U+0080: well-formed (the command shows C1 controls as ?) */
  cr_assert_eq(len("\xe2\x82\xac"), 3);     /* U+20AC */
  cr_assert_eq(len("\xef\xbf\xbd"), 3);     /* U+FFFD */
  cr_assert_eq(len("\xf0\x9f\x98\x80"), 4); /* U+1F600 */
  cr_assert_eq(len("\xf4\x8f\xbf\xbf"), 4); /* U+10FFFF */
}

Test(utf8, malformed_sequences) {
  cr_assert_eq(len("\x80"), 0, "a continuation byte alone");
  cr_assert_eq(len("\xff"), 0);
  cr_assert_eq(len("\xc3"), 0, "cut short by the end of the string");
  cr_assert_eq(len("\xc3(" ), 0, "cut short by another character");
  cr_assert_eq(len("\xc0\xaf"), 0, "overlong /");
  cr_assert_eq(len("\xe0\x80\xaf"), 0, "overlong /");
  cr_assert_eq(len("\xf0\x80\x80\xaf"), 0, "overlong /");
  cr_assert_eq(len("\xed\xa0\x80"), 0, "a surrogate");
  cr_assert_eq(len("\xf4\x90\x80\x80"), 0, "past U+10FFFF");
  cr_assert_eq(len("\xf5\x80\x80\x80"), 0);
}

typedef struct {
  char buf[256];
  size_t n, calls;
} sink_t;
static void put(void *ctx, const char *p, size_t n) {
  sink_t *k = ctx;
  cr_assert_lt(k->n + n, sizeof k->buf);
  memcpy(k->buf + k->n, p, n);
  k->n += n;
  k->buf[k->n] = '\0';
  k->calls++;
}
static const char *json(const char *s, sink_t *k) {
  memset(k, 0, sizeof *k);
  gr_json_escape(s, put, k);
  return k->buf;
}

Test(json, escapes_what_json_requires_and_passes_utf8_through) {
  sink_t k;
  cr_assert_str_eq(json("", &k), "\"\"");
  cr_assert_str_eq(json("plain text", &k), "\"plain text\"");
  cr_assert_eq(k.calls, 3, "a run without escapes is handed on in one piece");
  cr_assert_str_eq(json("a\"b\\c", &k), "\"a\\\"b\\\\c\"");
  cr_assert_str_eq(json("l1\nl2\tx", &k), "\"l1\\nl2\\tx\"");
  cr_assert_str_eq(json("\x01\x1f", &k), "\"\\u0001\\u001f\"");
  cr_assert_str_eq(json("caf\xc3\xa9 \xf0\x9f\x98\x80", &k), "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
}

Test(json, a_byte_that_is_not_utf8_becomes_u_fffd) {
  sink_t k;
  cr_assert_str_eq(json("a\xff" "b", &k), "\"a\\ufffdb\"");
  cr_assert_str_eq(json("\xc3(", &k), "\"\\ufffd(\"", "a sequence cut short: one replacement, then the rest");
  cr_assert_str_eq(json("\xed\xa0\x80", &k), "\"\\ufffd\\ufffd\\ufffd\"", "a surrogate, byte by byte");
}

Test(procstat, the_start_time_is_field_22_counted_after_the_last_parenthesis) {
  /* A command name may hold spaces and parentheses: "(a) b)" must not shift the fields. */
  const char *stat = "4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
  cr_assert_eq(gr_stat_start_ticks(stat), 987654);
  cr_assert_eq(gr_stat_start_ticks("4242 (x) S 1 2"), 0, "too few fields");
  cr_assert_eq(gr_stat_start_ticks("garbage"), 0, "no command name");
  char self[1024] = "";
  FILE *f = fopen("/proc/self/stat", "r");
  cr_assert_not_null(f);
  cr_assert_not_null(fgets(self, sizeof self, f));
  fclose(f);
  cr_assert_gt(gr_stat_start_ticks(self), 0, "this process's own start time: %s", self);
}

Test(jsonread, jparse_object_takes_an_object_and_refuses_every_other_value) {
  const char *err = NULL;
  jnode_t *j = jparse_object("{\"a\": [1, {\"b\": \"c\"}], \"d\": true}", &err);
  cr_assert_not_null(j, "%s", err ? err : "");
  cr_assert_eq(j->type, JN_OBJ);
  cr_assert(jbool(j, "d", false));
  jdelete(j); /* the whole tree, root included: ASan's leak check fails the test otherwise */
  const char *others[] = {"[1, 2]", "\"text\"", "42", "true", "null"};
  for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
    err = NULL;
    cr_assert_null(jparse_object(others[i], &err), "%s was taken as an object", others[i]);
    cr_assert_str_eq(err, "not a JSON object");
  }
  err = NULL;
  cr_assert_null(jparse_object("{\"a\": ", &err));
  cr_assert_not_null(err);
  cr_assert_str_neq(err, "not a JSON object", "a malformed text says what is malformed");
  jdelete(NULL);
}
