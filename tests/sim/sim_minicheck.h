/*
 * sim_minicheck.h -- the subset of Criterion's API the simulator's suites use, on a minimal harness that
 * runs each test in its own forked process (like Criterion, so every test starts with a pristine simulator).
 * Used in ThreadSanitizer builds only: Criterion cannot start under TSan (its sandbox maps an arena with
 * MAP_FIXED at a random address that TSan rejects as non-application memory).
 */
#ifndef SIM_MINICHECK_H
#define SIM_MINICHECK_H

#include <string.h>

typedef void (*simck_fn)(void);
void simck_register(const char *suite, const char *name, simck_fn fn);
void simck_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define Test(suite, name)                                                                                     \
  static void suite##_##name##_impl(void);                                                                    \
  __attribute__((constructor)) static void suite##_##name##_reg(void) {                                       \
    simck_register(#suite, #name, suite##_##name##_impl);                                                     \
  }                                                                                                           \
  static void suite##_##name##_impl(void)

/* The message is optional; " " keeps the format non-empty when it is left out. */
#define cr_assert(cond, ...) simck_check(!!(cond), __FILE__, __LINE__, #cond, " " __VA_ARGS__)
#define cr_assert_eq(a, b, ...) simck_check((a) == (b), __FILE__, __LINE__, #a " == " #b, " " __VA_ARGS__)
#define cr_assert_neq(a, b, ...) simck_check((a) != (b), __FILE__, __LINE__, #a " != " #b, " " __VA_ARGS__)
#define cr_assert_lt(a, b, ...) simck_check((a) < (b), __FILE__, __LINE__, #a " < " #b, " " __VA_ARGS__)
#define cr_assert_gt(a, b, ...) simck_check((a) > (b), __FILE__, __LINE__, #a " > " #b, " " __VA_ARGS__)
#define cr_assert_leq(a, b, ...) simck_check((a) <= (b), __FILE__, __LINE__, #a " <= " #b, " " __VA_ARGS__)
#define cr_assert_geq(a, b, ...) simck_check((a) >= (b), __FILE__, __LINE__, #a " >= " #b, " " __VA_ARGS__)
#define cr_assert_null(p, ...) simck_check((p) == NULL, __FILE__, __LINE__, #p " == NULL", " " __VA_ARGS__)
#define cr_assert_not_null(p, ...) simck_check((p) != NULL, __FILE__, __LINE__, #p " != NULL", " " __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...)                                                                           \
  simck_check(strcmp((a), (b)) == 0, __FILE__, __LINE__, #a " equals " #b, " " __VA_ARGS__)

#endif
