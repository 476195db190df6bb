/*
 * stress_scope -- scopes ended by other threads while their threads allocate, free and reuse addresses.
 *
 * Standalone (no Criterion) so that it runs under ThreadSanitizer too. Usage: stress_scope [threads] [seconds]
 *
 * Each worker draws addresses from its own small pool, so freed addresses come back at once (as the driver
 * hands them out), alternately inside a scope of its own and outside any scope. An ender thread ends the
 * workers' open scopes at random moments; a worker ends its scope itself too (one of the two wins). The safety
 * property: a block allocated outside any scope, or in a scope that is still open, is never an orphan, whatever
 * the earlier blocks at its address were. Orphans are freed by their workers, as a release would.
 */
#include "check.h"
#include "gpureclaim_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_WORKERS 16
#define POOL 96 /* addresses per worker */

static _Atomic int g_stop;
static _Atomic uint64_t g_open[MAX_WORKERS]; /* each worker's open scope, 0 for none */
static _Atomic uint64_t g_ended_by_other, g_orphans_seen, g_allocs;
static unsigned g_workers;

typedef struct {
  bool held;
  uint64_t scope; /* scope id it was allocated in (0 none) */
} held_t;

static void alloc_at(uint64_t key) {
  gr_rec_t r;
  gr_track_fill(&r, GPURECLAIM_KIND_DEVICE, key, 4096, 0, (uintptr_t)&alloc_at);
  gr_track_insert(&r);
  atomic_fetch_add_explicit(&g_allocs, 1, memory_order_relaxed);
}

static void free_at(uint64_t key) {
  gr_rec_t r;
  CHECK(gr_track_take(GR_KS_ADDR, key, 1u << GPURECLAIM_KIND_DEVICE, &r) == 1, "%#llx tracked",
        (unsigned long long)key);
  if (r.state == GR_ST_ORPHAN)
    atomic_fetch_add_explicit(&g_orphans_seen, 1, memory_order_relaxed);
  gr_track_freed(&r);
}

static void *worker(void *arg) {
  unsigned w = (unsigned)(uintptr_t)arg;
  uint64_t seed = gr_rng_stream(w);
  uint64_t base = UINT64_C(0x500000000000) + (uint64_t)w * 0x100000000;
  held_t held[POOL];
  memset(held, 0, sizeof held);
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    bool scoped = gr_rng(&seed) & 1;
    uint64_t s = 0;
    if (scoped) {
      s = gpureclaim_scope_begin();
      CHECK(s != 0, "scope_begin");
      atomic_store_explicit(&g_open[w], s, memory_order_release);
    }
    for (int op = 0; op < 64; op++) {
      unsigned k = (unsigned)(gr_rng(&seed) % POOL);
      if (held[k].held) {
        free_at(base + k * 0x1000);
        held[k].held = false;
      } else {
        uint64_t cur = gpureclaim_scope_current(); /* what the block will carry: 0 once another thread ended s */
        alloc_at(base + k * 0x1000);
        held[k] = (held_t){true, cur};
      }
    }
    /* Blocks outside any scope, and blocks of a scope still open, are live whatever their addresses held. */
    for (unsigned k = 0; k < POOL; k++) {
      if (!held[k].held)
        continue;
      gr_rec_t r;
      CHECK(gr_table_lookup(GR_KS_ADDR, base + k * 0x1000, GR_PRESENT_MASK, &r) == 0, "held block tracked");
      /* Open after the lookup (an ended scope never opens again): open during it. */
      bool open = held[k].scope != 0 && gpureclaim_scope_current() == held[k].scope;
      if (held[k].scope == 0 || open)
        CHECK(r.state == GR_ST_LIVE, "block %u (scope %#llx) is %u", k, (unsigned long long)held[k].scope,
              r.state);
      else
        CHECK(r.state == GR_ST_LIVE || r.state == GR_ST_ORPHAN, "state %u", r.state);
    }
    if (scoped) {
      atomic_store_explicit(&g_open[w], 0, memory_order_release);
      int rc = gpureclaim_scope_end(s, 0);
      CHECK(rc == 0 || rc == -ENOENT, "scope_end %d", rc);
      if (rc == -ENOENT)
        atomic_fetch_add_explicit(&g_ended_by_other, 1, memory_order_relaxed);
      for (unsigned k = 0; k < POOL; k++) /* the scope's blocks are orphans now: free them, as a release would */
        if (held[k].held && held[k].scope == s) {
          free_at(base + k * 0x1000);
          held[k].held = false;
        }
    }
  }
  for (unsigned k = 0; k < POOL; k++)
    if (held[k].held)
      free_at(base + k * 0x1000);
  return NULL;
}

static void *ender(void *arg) {
  (void)arg;
  uint64_t seed = gr_rng_stream(MAX_WORKERS);
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
    uint64_t s = atomic_load_explicit(&g_open[gr_rng(&seed) % g_workers], memory_order_acquire);
    if (s) {
      int rc = gpureclaim_scope_end(s, 0);
      CHECK(rc == 0 || rc == -ENOENT, "scope_end %d", rc);
    }
    for (volatile int i = 0; i < (int)(gr_rng(&seed) % 2000); i++)
      ;
  }
  return NULL;
}

int main(int argc, char **argv) {
  g_workers = argc > 1 ? (unsigned)atoi(argv[1]) : 4;
  double seconds = argc > 2 ? atof(argv[2]) : 2;
  CHECK(g_workers >= 1 && g_workers <= MAX_WORKERS, "1 to %d workers", MAX_WORKERS);
  CHECK(gr_table_init() == 0, "table");
  atomic_store(&gr_state_run, 1); /* as once CUDA started: ends act on the table */
  pthread_t t[MAX_WORKERS + 1];
  for (unsigned i = 0; i < g_workers; i++)
    t[i] = gr_thread_start(worker, (void *)(uintptr_t)i);
  t[g_workers] = gr_thread_start(ender, NULL);
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
  /* Until the ender has won at least once (ctest's timeout guards a hang). */
  struct timespec tick = {0, 10000000};
  while (!atomic_load(&g_ended_by_other))
    nanosleep(&tick, NULL);
  atomic_store(&g_stop, 1);
  for (unsigned i = 0; i <= g_workers; i++)
    gr_thread_join(t[i]);
  CHECK(gr_table_check() == 0, "table invariants");
  gpureclaim_stats_t st = {.size = sizeof st};
  CHECK(gr_stats_get(-1, &st) == 0 && st.live_blocks == 0 && st.orphan_blocks == 0, "every block freed");
  printf("stress_scope: %u workers, %llu allocations, %llu orphans freed, %llu scopes ended by another thread\n",
         g_workers, (unsigned long long)g_allocs, (unsigned long long)g_orphans_seen,
         (unsigned long long)g_ended_by_other);
  CHECK(g_orphans_seen > 0, "the run made orphans");
  return 0;
}
