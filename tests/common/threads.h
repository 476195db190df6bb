/* Thread start-up for tests, shared by the Criterion tests and the plain programs: a thread that failed to
 * start, or to be joined, ends the program saying why, instead of a test that quietly ran without its second
 * thread and proved nothing. Header-only. */
#ifndef GR_TESTS_COMMON_THREADS_H
#define GR_TESTS_COMMON_THREADS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Starts fn(arg) on a new thread, or ends the program (exit 1) with where and why. */
#define gr_thread_start(fn, arg) gr_thread_start_at((fn), (arg), __FILE__, __LINE__)
/* Waits for t and returns what its function returned, or ends the program. */
#define gr_thread_join(t) gr_thread_join_at((t), __FILE__, __LINE__)
/* Runs fn(arg) on another thread and waits for it: "the same call, from a thread that is not this one". */
#define gr_thread_run(fn, arg) gr_thread_join(gr_thread_start((fn), (arg)))

static inline pthread_t gr_thread_start_at(void *(*fn)(void *), void *arg, const char *file, int line) {
  pthread_t t;
  int e = pthread_create(&t, NULL, fn, arg);
  if (e != 0) {
    fprintf(stderr, "%s:%d: pthread_create: %s\n", file, line, strerror(e));
    exit(1);
  }
  return t;
}

static inline void *gr_thread_join_at(pthread_t t, const char *file, int line) {
  void *ret = NULL;
  int e = pthread_join(t, &ret);
  if (e != 0) {
    fprintf(stderr, "%s:%d: pthread_join: %s\n", file, line, strerror(e));
    exit(1);
  }
  return ret;
}

#endif
