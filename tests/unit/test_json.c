/* The JSON writer of json.h (jbuf): commas at every nesting level, keys and strings escaped, numbers exact,
 * addresses as hex strings, a buffer that grows without limit, and a failed buffer that ignores appends and
 * refuses to be written. What it writes is read back with jsonread.h, the reader the command uses. */
#include "common.h"
#include "json.h"
#include "jsonread.h"
#include "../common/rng.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The buffer's text, which must be NUL-terminated and len long. */
static const char *text(const jbuf_t *b) {
  cr_assert_not_null(b->p);
  cr_assert_eq(strlen(b->p), b->len, "len %zu but the text is %zu bytes", b->len, strlen(b->p));
  return b->p;
}

Test(json, commas_separate_values_at_every_level_and_never_trail) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_u64(&b, "a", 1);
  jb_arr(&b, "list");
  jb_u64(&b, NULL, 2);
  jb_key(&b, NULL); /* jb_obj writes only the brace: a nested object's comma and key come from jb_key */
  jb_obj(&b);
  jb_obj_end(&b);
  jb_arr(&b, NULL);
  jb_arr_end(&b);
  jb_key(&b, NULL);
  jb_obj(&b);
  jb_bool(&b, "t", true);
  jb_bool(&b, "f", false);
  jb_obj_end(&b);
  jb_arr_end(&b);
  jb_null(&b, "n");
  jb_key(&b, "raw");
  jb_raw(&b, "[]", 2);
  jb_obj_end(&b);
  cr_assert_str_eq(text(&b), "{\"a\":1,\"list\":[2,{},[],{\"t\":true,\"f\":false}],\"n\":null,\"raw\":[]}");
  cr_assert_not(jb_failed(&b));
  jb_free(&b);
  cr_assert_null(b.p);
  cr_assert_eq(b.len, 0);
}

Test(json, keys_and_strings_are_escaped_and_null_strings_are_null) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "k\"e\\y", "a\"b\\c\nd\te\x01");
  jb_str(&b, "none", NULL);
  jb_str(&b, "bad", "x\xff");
  jb_obj_end(&b);
  cr_assert_str_eq(text(&b), "{\"k\\\"e\\\\y\":\"a\\\"b\\\\c\\nd\\te\\u0001\",\"none\":null,\"bad\":\"x\\ufffd\"}");
  const char *err = NULL;
  jnode_t *j = jparse_object(b.p, &err);
  cr_assert_not_null(j, "%s", err);
  cr_assert_str_eq(jstr(j, "k\"e\\y", "?"), "a\"b\\c\nd\te\x01");
  cr_assert_eq(jget(j, "none")->type, JN_NULL);
  cr_assert_str_eq(jstr(j, "bad", "?"), "x\xef\xbf\xbd");
  jdelete(j);
  jb_free(&b);
}

Test(json, integers_keep_every_digit_and_addresses_are_hex_strings) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_u64(&b, "u", UINT64_MAX);
  jb_i64(&b, "min", INT64_MIN);
  jb_i64(&b, "max", INT64_MAX);
  jb_i64(&b, "neg", -1);
  jb_hex(&b, "addr", UINT64_C(0x7f00deadbeef0010));
  jb_hex(&b, "zero", 0);
  jb_f64(&b, "f", 2.5);
  jb_f64(&b, "g", -0.0004);
  jb_obj_end(&b);
  cr_assert_str_eq(text(&b), "{\"u\":18446744073709551615,\"min\":-9223372036854775808,\"max\":9223372036854775807,"
                             "\"neg\":-1,\"addr\":\"0x7f00deadbeef0010\",\"zero\":\"0x0\",\"f\":2.500,\"g\":-0.000}");
  const char *err = NULL;
  jnode_t *j = jparse_object(b.p, &err);
  cr_assert_not_null(j, "%s", err);
  cr_assert_eq(jint(j, "min", 0), INT64_MIN);
  cr_assert_eq(jint(j, "max", 0), INT64_MAX);
  cr_assert_eq(jhex(j, "addr", 0), UINT64_C(0x7f00deadbeef0010));
  cr_assert_eq(jhex(j, "zero", 1), 0);
  jdelete(j);
  jb_free(&b);
}

/* jb_printf formats into a 256-byte stack buffer first; longer text takes a second path that formats in place. */
Test(json, printf_longer_than_its_stack_buffer_is_written_whole) {
  char big[1000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  jbuf_t b;
  jb_init(&b);
  jb_printf(&b, "<%s>", big);
  jb_printf(&b, "%d", 42);
  cr_assert_eq(b.len, 1001 + 2);
  cr_assert_eq(b.p[0], '<');
  cr_assert_eq(b.p[1000], '>');
  cr_assert_str_eq(text(&b) + 1001, "42");
  cr_assert_eq(strspn(b.p + 1, "x"), 999);
  jb_free(&b);
}

/* Past the first 4096 bytes the buffer doubles; what was written before the growth stays in place. A document of
 * a few hundred kilobytes (a leak report) must come back from the reader as it was written, member for member. */
Test(json, the_buffer_grows_past_many_doublings_and_keeps_what_it_had) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_arr(&b, "blocks");
  enum { N = 20000 };
  for (int i = 0; i < N; i++) {
    jb_key(&b, NULL);
    jb_obj(&b);
    jb_hex(&b, "ptr", (uint64_t)i * 4096);
    jb_u64(&b, "bytes", (uint64_t)i);
    jb_obj_end(&b);
  }
  jb_arr_end(&b);
  jb_obj_end(&b);
  cr_assert_not(jb_failed(&b));
  cr_assert_gt(b.cap, 256 * 1024, "the test must outgrow several doublings (cap %zu)", b.cap);
  cr_assert_lt(b.len, b.cap);
  const char *err = NULL;
  jnode_t *j = jparse_object(text(&b), &err);
  cr_assert_not_null(j, "%s", err);
  const jnode_t *a = jget(j, "blocks");
  cr_assert_eq(a->type, JN_ARR);
  cr_assert_eq(a->n, N);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(jhex(&a->kids[i], "ptr", 1), (uint64_t)i * 4096, "block %d", i);
    cr_assert_eq(jint(&a->kids[i], "bytes", -1), i, "block %d", i);
  }
  jdelete(j);
  jb_free(&b);
}

/* Random strings of well-formed UTF-8 and control characters survive writer and reader unchanged. */
Test(json, random_strings_come_back_from_the_reader_unchanged) {
  static const char *const pieces[] = {"a", "\"", "\\", "\n", "\t", "\r", "\x01", "\x1f", "/", " ",
                                       "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "}", "]", ",", ":"};
  uint64_t s = gr_rng_stream(0);
  for (int round = 0; round < 500; round++) {
    char str[256] = "";
    size_t n = gr_rng_below(&s, 30);
    for (size_t i = 0; i < n; i++)
      strcat(str, pieces[gr_rng_below(&s, GR_ARRAY_LEN(pieces))]);
    jbuf_t b;
    jb_init(&b);
    jb_obj(&b);
    jb_str(&b, str, str);
    jb_obj_end(&b);
    const char *err = NULL;
    jnode_t *j = jparse_object(text(&b), &err);
    cr_assert_not_null(j, "round %d: %s in %s", round, err, b.p);
    cr_assert_eq(j->n, 1);
    cr_assert_str_eq(j->keys[0], str, "round %d", round);
    cr_assert_str_eq(jstr(j, str, "?"), str, "round %d", round);
    jdelete(j);
    jb_free(&b);
  }
}

/* Out of memory marks the buffer failed (the struct's flag, set here as reserve() sets it): nothing more is
 * appended, and writing it out is refused rather than writing a truncated document. */
Test(json, a_failed_buffer_ignores_appends_and_is_not_written) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_u64(&b, "a", 1);
  size_t len = b.len;
  b.failed = true;
  jb_u64(&b, "b", 2);
  jb_str(&b, "c", "d");
  jb_printf(&b, "%0300d", 3);
  jb_obj_end(&b);
  cr_assert(jb_failed(&b));
  cr_assert_eq(b.len, len);
  cr_assert_str_eq(b.p, "{\"a\":1");
  int p[2];
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(jb_write_fd(&b, p[1]), -ENOMEM);
  cr_assert_eq(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
  char c;
  cr_assert_eq(read(p[0], &c, 1), -1, "a failed buffer wrote something");
  close(p[0]);
  close(p[1]);
  jb_free(&b);
  cr_assert_not(jb_failed(&b), "jb_free leaves a buffer to use again");
}

Test(json, write_fd_writes_the_whole_document) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "k", "v");
  jb_obj_end(&b);
  char path[] = "/tmp/gr_test_json_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  cr_assert_eq(jb_write_fd(&b, fd), 0);
  char got[64] = "";
  cr_assert_eq(pread(fd, got, sizeof got - 1, 0), (ssize_t)b.len);
  cr_assert_str_eq(got, "{\"k\":\"v\"}");
  close(fd);
  jb_free(&b);
}

/* jb_obj writes no separator of its own (json.h): an object value follows a key, or jb_key(NULL) in an array. */
Test(json, an_object_in_an_array_follows_a_null_key) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_u64(&b, "a", 1);
  jb_arr(&b, "l");
  jb_i64(&b, NULL, -2);
  jb_key(&b, NULL);
  jb_obj(&b);
  jb_bool(&b, "t", true);
  jb_bool(&b, "f", false);
  jb_obj_end(&b);
  jb_null(&b, NULL);
  jb_arr_end(&b);
  jb_hex(&b, "p", 0xdeadbeefULL);
  jb_f64(&b, "x", 1.5);
  jb_obj_end(&b);
  cr_assert(!jb_failed(&b));
  cr_assert_str_eq(text(&b), "{\"a\":1,\"l\":[-2,{\"t\":true,\"f\":false},null],\"p\":\"0xdeadbeef\",\"x\":1.500}");
  jb_free(&b);
}
