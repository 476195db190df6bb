/* state.c -- see state.h. */
#include "state.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic int gr_state_run; /* 0 not started, 1 running, -1 disabled, 2 starting */
GR_TLS gr_tls_t gr_tls;

static uint64_t g_start_realtime_ms;

uint32_t gr_state_tid(void) {
  if (GR_UNLIKELY(!gr_tls.tid))
    gr_tls.tid = (uint32_t)syscall(SYS_gettid) & 0x3fffff;
  return gr_tls.tid;
}

uint64_t gr_state_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t gr_state_start_time_ms(void) { return g_start_realtime_ms; }

void gr_state_set_start_time_ms(uint64_t ms) { g_start_realtime_ms = ms; }

void gr_state_tls_atfork_child(void) {
  gr_tls.tid = 0;
  gr_tls.last_ctx = NULL;
  gr_tls.cur_known = 0;
  gr_tls.hook_depth = 0;
  gr_tls.rt_depth = 0;
}
