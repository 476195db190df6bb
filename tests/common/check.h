/* What the plain test programs (tests/stress/, which run under ThreadSanitizer without Criterion) share:
 * a check that ends the program with where and why, a seeded random generator, and thread start-up that
 * fails loudly. Header-only: each program is one translation unit. */
#ifndef GR_TESTS_COMMON_CHECK_H
#define GR_TESTS_COMMON_CHECK_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Ends the program (exit 1) with "FILE:LINE: check failed: COND: message" when cond is false. */
#define CHECK(cond, ...)                                                                                   \
  do {                                                                                                     \
    if (!(cond)) {                                                                                         \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                            \
      fprintf(stderr, __VA_ARGS__);                                                                        \
      fputc('\n', stderr);                                                                                 \
      exit(1);                                                                                             \
    }                                                                                                      \
  } while (0)

/* xorshift64: the next number of the sequence *s (never 0 when *s is not 0). */
static inline uint64_t tc_rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A distinct, non-zero starting state for stream i (a thread, a round) of a program. TEST_SEED in the
 * environment, when set, changes every stream's (to rerun a failure under another schedule); the default is
 * fixed, so a run is reproducible as far as the threads' interleaving allows. */
static inline uint64_t tc_seed(uint64_t i) {
  const char *e = getenv("TEST_SEED"); /* read each time: threads call this at once, nothing is cached */
  uint64_t base = e && *e ? strtoull(e, NULL, 0) | 1 : 1;
  uint64_t s = (i + 1) * UINT64_C(0x9E3779B97F4A7C15) + base;
  return s ? s : 1;
}

/* Starts fn(arg) on a new thread, or ends the program saying why. */
static inline pthread_t tc_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  int e = pthread_create(&t, NULL, fn, arg);
  CHECK(e == 0, "pthread_create: error %d", e);
  return t;
}

#endif
