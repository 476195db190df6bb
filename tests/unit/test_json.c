/* The JSON writer of json.h: commas between values at each level, keys and strings escaped, null for a NULL
 * string, hexadecimal addresses as strings, and a buffer that grows past its first allocation. */
#include "json.h"

#include <criterion/criterion.h>
#include <string.h>

static void expect(const jbuf_t *b, const char *want) {
  cr_assert(!jb_failed(b));
  cr_assert_eq(b->len, strlen(want), "got %.*s, want %s", (int)b->len, b->p, want);
  cr_assert(memcmp(b->p, want, b->len) == 0, "got %.*s, want %s", (int)b->len, b->p, want);
}

Test(json, commas_at_each_level) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_u64(&b, "a", 1);
  jb_arr(&b, "l");
  jb_i64(&b, NULL, -2);
  jb_key(&b, NULL); /* jb_obj writes no separator: an object value follows a key, or NULL in an array */
  jb_obj(&b);
  jb_bool(&b, "t", true);
  jb_bool(&b, "f", false);
  jb_obj_end(&b);
  jb_null(&b, NULL);
  jb_arr_end(&b);
  jb_hex(&b, "p", 0xdeadbeefULL);
  jb_f64(&b, "x", 1.5);
  jb_obj_end(&b);
  expect(&b, "{\"a\":1,\"l\":[-2,{\"t\":true,\"f\":false},null],\"p\":\"0xdeadbeef\",\"x\":1.500}");
  jb_free(&b);
}

Test(json, strings_and_keys_are_escaped) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "k\"", "a\\b\n\x01");
  jb_str(&b, "n", NULL);
  jb_obj_end(&b);
  expect(&b, "{\"k\\\"\":\"a\\\\b\\n\\u0001\",\"n\":null}");
  jb_free(&b);
}

Test(json, grows_past_the_first_allocation) {
  jbuf_t b;
  jb_init(&b);
  jb_arr(&b, NULL);
  for (int i = 0; i < 10000; i++)
    jb_u64(&b, NULL, 7);
  jb_arr_end(&b);
  cr_assert(!jb_failed(&b));
  cr_assert_eq(b.len, 2 + 10000 + 9999);
  cr_assert_eq(b.p[0], '[');
  cr_assert_eq(b.p[b.len - 1], ']');
  for (size_t i = 1; i + 1 < b.len; i++)
    cr_assert_eq(b.p[i], (i % 2) ? '7' : ',');
  jb_free(&b);
}
