/* What the plain test programs (tests/stress/, which run under ThreadSanitizer without Criterion) share:
 * a check that ends the program with where and why, and (from rng.h and threads.h, which the Criterion tests
 * use too) a seeded random generator and thread start-up that fails loudly. Header-only: each program is one
 * translation unit. */
#ifndef GR_TESTS_COMMON_CHECK_H
#define GR_TESTS_COMMON_CHECK_H

#include "rng.h"
#include "threads.h"

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

#endif
