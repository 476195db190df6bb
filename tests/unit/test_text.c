/* gr_utf8_len: which byte sequences gpureclaim passes into JSON and tables as UTF-8, and which it replaces. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>

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
