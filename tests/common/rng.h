/* A seeded random generator for tests, shared by the Criterion tests and the plain programs. Every stream
 * derives from one seed: a fixed default, or GR_TEST_SEED from the environment (decimal or 0x hex). The seed
 * in use is printed on stderr the first time a program asks for it, so a failure can be replayed with
 * GR_TEST_SEED=<that seed>. Header-only. */
#ifndef GR_TESTS_COMMON_RNG_H
#define GR_TESTS_COMMON_RNG_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define GR_TEST_SEED_DEFAULT UINT64_C(20261125)

/* The seed of this run: GR_TEST_SEED when set, else the default. Announced once per program. */
static inline uint64_t gr_test_seed(void) {
  static _Atomic int announced;
  const char *e = getenv("GR_TEST_SEED"); /* read each time: threads call this at once, nothing is cached */
  uint64_t seed = e && *e ? strtoull(e, NULL, 0) : GR_TEST_SEED_DEFAULT;
  if (!atomic_exchange_explicit(&announced, 1, memory_order_relaxed))
    fprintf(stderr, "random seed %llu (replay with GR_TEST_SEED=%llu)\n", (unsigned long long)seed,
            (unsigned long long)seed);
  return seed;
}

/* xorshift64: the next number of the sequence *s (never 0 when *s is not 0). */
static inline uint64_t gr_rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A distinct, non-zero starting state for stream i (a thread, a round, a test) of this run's seed. */
static inline uint64_t gr_rng_stream(uint64_t i) {
  uint64_t s = (i + 1) * UINT64_C(0x9E3779B97F4A7C15) + (gr_test_seed() | 1);
  s ^= s >> 31; /* mix, so that neighbouring streams do not start alike */
  return s ? s : 1;
}

/* A number in [0, n) (n > 0; the slight bias of a modulo does not matter to a test). */
static inline uint64_t gr_rng_below(uint64_t *s, uint64_t n) { return gr_rng(s) % n; }

#endif
