/* Unit tests of the counters behind gpureclaim_stats() (src/track/stats.c): live bytes are exact, and the peak is
 * exact in one thread and within the bound stats.c states (4 MiB of pending frees per other thread) otherwise. */
#include "gpureclaim_internal.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#define MiB (UINT64_C(1) << 20)

static gr_rec_t block(uint64_t size, uint8_t device) {
  gr_rec_t r;
  memset(&r, 0, sizeof r);
  r.kind = GPURECLAIM_KIND_DEVICE;
  r.state = GR_ST_LIVE;
  r.size = size;
  r.device = device;
  return r;
}

static gpureclaim_stats_t get(int device) {
  gpureclaim_stats_t s = {.size = sizeof s};
  cr_assert_eq(gr_stats_get(device, &s), 0);
  return s;
}

static void reset(void) { gr_stats_atfork_child(); } /* empties every counter, as in a forked child */

TestSuite(stats, .init = reset);

Test(stats, one_thread_has_exact_live_bytes_and_peak) {
  gr_rec_t a = block(10 * MiB, 0), b = block(20 * MiB, 0), c = block(5 * MiB, 0);
  gr_stats_alloc(&a);
  gr_stats_alloc(&b);
  cr_assert_eq(get(0).live_bytes, 30 * MiB);
  gr_stats_free(&a);
  cr_assert_eq(get(0).live_bytes, 20 * MiB, "a pending free is counted at once");
  gr_stats_alloc(&c);
  gpureclaim_stats_t s = get(-1);
  cr_assert_eq(s.live_bytes, 25 * MiB);
  cr_assert_eq(s.peak_bytes, 30 * MiB);
  cr_assert_eq(s.live_blocks, 2);
  /* Small pairs stay pending (no shared update) and never move the peak. */
  for (int i = 0; i < 100000; i++) {
    gr_rec_t p = block(512 + (uint64_t)(i % 7) * 4096, 0);
    gr_stats_alloc(&p);
    gr_stats_free(&p);
  }
  s = get(-1);
  cr_assert_eq(s.live_bytes, 25 * MiB);
  cr_assert_eq(s.peak_bytes, 30 * MiB);
  /* A new high is seen exactly, however the pending frees stood. */
  gr_rec_t d = block(7 * MiB + 3, 0);
  gr_stats_alloc(&d);
  cr_assert_eq(get(-1).peak_bytes, 32 * MiB + 3);
  gr_stats_free(&d);
  gr_stats_free(&b);
  gr_stats_free(&c);
  s = get(-1);
  cr_assert_eq(s.live_bytes, 0);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.peak_bytes, 32 * MiB + 3);
}

Test(stats, devices_are_counted_apart) {
  gr_rec_t a = block(3 * MiB, 0), b = block(4 * MiB, 1);
  gr_stats_alloc(&a);
  gr_stats_alloc(&b);
  cr_assert_eq(get(0).live_bytes, 3 * MiB);
  cr_assert_eq(get(1).live_bytes, 4 * MiB);
  cr_assert_eq(get(-1).live_bytes, 7 * MiB);
  cr_assert_eq(get(-1).peak_bytes, 7 * MiB);
  gr_stats_free(&a);
  cr_assert_eq(get(0).live_bytes, 0);
  cr_assert_eq(get(1).peak_bytes, 4 * MiB);
  gr_stats_free(&b);
}

/* Pinned host memory has no device: it counts in the process's host figures and in no device's. A device block
 * counted from its packed record (the hooks' path) lands on its own device. A device ordinal the registry never
 * hands out (a VMM handle's, past GR_MAX_DEV) counts in the process totals and in no device's figures. */
Test(stats, blocks_of_no_device_and_of_unregistered_ordinals_count_in_the_process_totals_only) {
  gr_rec_t h = block(2 * MiB, GR_DEVICE_NONE);
  h.kind = GPURECLAIM_KIND_HOST;
  gr_stats_alloc(&h);
  gr_rec_t d = block(5 * MiB, 1), far = block(6 * MiB, 100);
  gr_packed_t p;
  gr_pk_pack(&d, &p);
  gr_stats_alloc_pk(&p);
  gr_stats_alloc(&far);
  gpureclaim_stats_t all = get(-1);
  cr_assert_eq(all.host_pinned_blocks, 1);
  cr_assert_eq(all.host_pinned_bytes, 2 * MiB);
  cr_assert_eq(all.live_bytes, 11 * MiB, "device 1's block and the far ordinal's, not the host block");
  cr_assert_eq(all.live_blocks, 2);
  cr_assert_eq(get(1).live_bytes, 5 * MiB, "the packed record's block is not on its device");
  for (int dev = 0; dev < GR_MAX_DEV; dev++)
    if (dev != 1)
      cr_assert_eq(get(dev).live_bytes + get(dev).live_blocks, 0, "device %d counts another device's block", dev);
  gr_stats_free_pk(&p);
  gr_stats_free(&far);
  gr_stats_free(&h);
  all = get(-1);
  cr_assert_eq(all.host_pinned_blocks, 0);
  cr_assert_eq(all.live_bytes, 0);
  cr_assert_eq(all.live_blocks, 0);
  cr_assert_eq(all.total_allocs, 3);
  cr_assert_eq(all.total_frees, 3);
}

/* Threads that free blocks other threads allocated, and allocate and free their own. */
enum { THREADS = 4, PER = 2000 };
static gr_rec_t g_blocks[THREADS][PER];
static pthread_barrier_t g_bar;

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  for (int i = 0; i < PER; i++) {
    g_blocks[t][i] = block((uint64_t)(i % 13 + 1) * 64 * 1024, 0);
    gr_stats_alloc(&g_blocks[t][i]);
  }
  pthread_barrier_wait(&g_bar); /* allocated */
  pthread_barrier_wait(&g_bar); /* the main thread has looked */
  /* Free the next thread's blocks, then churn. */
  int o = (t + 1) % THREADS;
  for (int i = 0; i < PER; i++)
    gr_stats_free(&g_blocks[o][i]);
  for (int i = 0; i < 50000; i++) {
    gr_rec_t p = block((uint64_t)(i % 5 + 1) * 8192, 0);
    gr_stats_alloc(&p);
    gr_stats_free(&p);
  }
  pthread_barrier_wait(&g_bar); /* all done, threads still alive: their pending changes count */
  pthread_barrier_wait(&g_bar); /* the main thread has looked */
  return NULL;
}

Test(stats, threads_keep_live_bytes_exact_and_the_peak_within_its_bound) {
  uint64_t total = 0;
  for (int i = 0; i < PER; i++)
    total += (uint64_t)(i % 13 + 1) * 64 * 1024;
  total *= THREADS;
  pthread_t th[THREADS];
  pthread_barrier_init(&g_bar, NULL, THREADS + 1);
  for (int t = 0; t < THREADS; t++)
    pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
  pthread_barrier_wait(&g_bar);
  gpureclaim_stats_t s = get(-1);
  cr_assert_eq(s.live_bytes, total, "every block allocated: live %lu of %lu", (unsigned long)s.live_bytes, (unsigned long)total);
  cr_assert_eq(s.peak_bytes, total, "nothing freed yet: the peak is exact");
  pthread_barrier_wait(&g_bar);
  pthread_barrier_wait(&g_bar);
  s = get(-1);
  cr_assert_eq(s.live_bytes, 0, "live %lu with the threads alive", (unsigned long)s.live_bytes);
  cr_assert_eq(s.live_blocks, 0);
  /* The true peak is total plus at most one churn block per thread (5 * 8192 each). */
  cr_assert_geq(s.peak_bytes, total);
  cr_assert_leq(s.peak_bytes, total + THREADS * 5 * 8192 + (THREADS - 1) * 4 * MiB, "peak %lu, bound exceeded",
                (unsigned long)s.peak_bytes);
  pthread_barrier_wait(&g_bar);
  for (int t = 0; t < THREADS; t++)
    pthread_join(th[t], NULL);
  s = get(-1);
  cr_assert_eq(s.live_bytes, 0, "after the threads exited");
  cr_assert_eq(s.total_allocs, (uint64_t)THREADS * (PER + 50000));
  cr_assert_eq(s.total_frees, (uint64_t)THREADS * (PER + 50000));
  pthread_barrier_destroy(&g_bar);
}

/* A thread's counts stay in its record when it exits, and the next thread to take the record goes on from them:
 * a block of an exited thread freed elsewhere, and a new thread's pairs, leave every figure exact. */
static gr_rec_t g_left;
static void *alloc_one_and_exit(void *arg) {
  (void)arg;
  g_left = block(3 * MiB, 0);
  gr_stats_alloc(&g_left);
  return NULL;
}
static void *churn_and_exit(void *arg) {
  (void)arg;
  for (int i = 0; i < 1000; i++) {
    gr_rec_t p = block((uint64_t)(i % 3 + 1) * 4096, 0);
    gr_stats_alloc(&p);
    gr_stats_free(&p);
  }
  return NULL;
}

Test(stats, an_exited_threads_counts_stay_and_its_record_goes_on_counting) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_one_and_exit, NULL), 0);
  pthread_join(t, NULL);
  gpureclaim_stats_t s = get(-1);
  cr_assert_eq(s.live_bytes, 3 * MiB, "the exited thread's block is not counted");
  cr_assert_eq(s.live_blocks, 1);
  gr_stats_free(&g_left);
  cr_assert_eq(get(-1).live_bytes, 0);
  cr_assert_eq(pthread_create(&t, NULL, churn_and_exit, NULL), 0); /* takes the exited thread's record */
  pthread_join(t, NULL);
  s = get(-1);
  cr_assert_eq(s.live_bytes, 0);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.total_allocs, 1001);
  cr_assert_eq(s.total_frees, 1001);
  /* The true peak is 3 MiB; the main thread's free of it is still pending (within the bound stats.c states). */
  cr_assert_geq(s.peak_bytes, 3 * MiB);
  cr_assert_leq(s.peak_bytes, 3 * MiB + 4 * MiB);
}

/* The bound itself: frees pending in one thread can make the peak read high by at most 4 MiB. Thread A
 * allocates and frees 100 blocks of 1 MiB; then thread B allocates 100 MiB. The true peak is 100 MiB. */
static gr_rec_t g_mib[100];
static void *alloc_and_free_100(void *arg) {
  (void)arg;
  for (int i = 0; i < 100; i++) {
    g_mib[i] = block(MiB, 0);
    gr_stats_alloc(&g_mib[i]);
  }
  for (int i = 0; i < 100; i++)
    gr_stats_free(&g_mib[i]);
  pthread_barrier_wait(&g_bar); /* done */
  pthread_barrier_wait(&g_bar); /* stay alive, pending frees unflushed */
  return NULL;
}

Test(stats, pending_frees_raise_the_peak_by_at_most_4_mib_per_thread) {
  pthread_t a;
  pthread_barrier_init(&g_bar, NULL, 2);
  pthread_create(&a, NULL, alloc_and_free_100, NULL);
  pthread_barrier_wait(&g_bar);
  gr_rec_t big = block(100 * MiB, 0);
  gr_stats_alloc(&big);
  gpureclaim_stats_t s = get(-1);
  cr_assert_eq(s.live_bytes, 100 * MiB);
  cr_assert_geq(s.peak_bytes, 100 * MiB);
  cr_assert_leq(s.peak_bytes, 104 * MiB, "peak %lu MiB for a true peak of 100 MiB", (unsigned long)(s.peak_bytes / MiB));
  pthread_barrier_wait(&g_bar);
  pthread_join(a, NULL);
  gr_stats_free(&big);
  cr_assert_eq(get(-1).live_bytes, 0);
  pthread_barrier_destroy(&g_bar);
}
