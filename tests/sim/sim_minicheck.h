/*
 * sim_minicheck.h -- the subset of Criterion's API the test suites use, on a minimal harness that runs each
 * test in a fresh process (forked, then re-executed, as Criterion does: constructors, the preloaded library and
 * the simulator all start anew). Used in ThreadSanitizer builds only: Criterion cannot start under TSan (its
 * sandbox maps an arena with MAP_FIXED at a random address that TSan rejects as non-application memory).
 * minicheck/criterion/criterion.h includes this, so a suite written for Criterion builds on it unchanged.
 *
 * Supported: Test(suite, name[, .init = f][, .fini = f][, .timeout = s]), TestSuite(suite[, .init][, .fini]),
 * cr_assert*, cr_skip_test. A .timeout is accepted and not enforced (CTest's TIMEOUT guards against a hang;
 * TSan makes tests several times slower than the figure was chosen for).
 */
#ifndef SIM_MINICHECK_H
#define SIM_MINICHECK_H

#include <stddef.h>
#include <string.h>

typedef void (*simck_fn)(void);
/* The first member absorbs the leading 0 of every initializer, so that options given by designators never
 * initialise a member twice. */
struct simck_opts {
  int unused_;
  simck_fn init, fini;
  double timeout;
  int signal; /* the test passes only when it ends by this signal (Criterion's .signal) */
};
void simck_register(const char *suite, const char *name, simck_fn fn, struct simck_opts o);
void simck_suite(const char *suite, struct simck_opts o);
void simck_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void simck_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Test(suite, name) and Test(suite, name, options...): the extra empty argument keeps __VA_ARGS__ non-empty. */
#define Test(...) SIMCK_TEST_(__VA_ARGS__, )
#define SIMCK_TEST_(suite, name, ...)                                                                         \
  static void suite##_##name##_impl(void);                                                                    \
  __attribute__((constructor)) static void suite##_##name##_reg(void) {                                       \
    simck_register(#suite, #name, suite##_##name##_impl, (struct simck_opts){0, __VA_ARGS__});                \
  }                                                                                                           \
  static void suite##_##name##_impl(void)

/* TestSuite(suite, options...); — it ends in a declaration, so the caller's semicolon closes it. */
#define TestSuite(...) SIMCK_SUITE_(__VA_ARGS__, )
#define SIMCK_SUITE_(suite, ...)                                                                              \
  __attribute__((constructor)) static void simck_suite_##suite(void) {                                        \
    simck_suite(#suite, (struct simck_opts){0, __VA_ARGS__});                                                 \
  }                                                                                                           \
  extern int simck_suite_decl_##suite

/* The message is optional; " " keeps the format non-empty when it is left out. */
#define cr_skip_test(...) simck_skip(" " __VA_ARGS__)
#define cr_assert(cond, ...) simck_check(!!(cond), __FILE__, __LINE__, #cond, " " __VA_ARGS__)
#define cr_assert_not(cond, ...) simck_check(!(cond), __FILE__, __LINE__, "!(" #cond ")", " " __VA_ARGS__)
#define cr_assert_fail(...) simck_check(0, __FILE__, __LINE__, "cr_assert_fail", " " __VA_ARGS__)
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
#define cr_assert_str_neq(a, b, ...)                                                                          \
  simck_check(strcmp((a), (b)) != 0, __FILE__, __LINE__, #a " differs from " #b, " " __VA_ARGS__)
#define cr_assert_str_empty(a, ...) simck_check(*(a) == '\0', __FILE__, __LINE__, #a " is empty", " " __VA_ARGS__)
#define cr_assert_str_not_empty(a, ...)                                                                       \
  simck_check(*(a) != '\0', __FILE__, __LINE__, #a " is not empty", " " __VA_ARGS__)

#endif
