/*
 * state.h -- what every module reads of the process (state.c): whether gpureclaim runs, the calling thread's
 * hook state and id, the coarse clock. core.c starts and stops what gr_state_run says; the names keep its
 * prefix. Nothing here calls another module.
 */
#ifndef GPURECLAIM_STATE_H
#define GPURECLAIM_STATE_H

#include "common.h"

#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define GR_TLS __thread __attribute__((tls_model("initial-exec")))

/* 0 before CUDA init, 1 running, -1 disabled, 2 being started by one thread (core.c). */
extern _Atomic int gr_state_run;
static inline bool gr_state_disabled(void) { return atomic_load_explicit(&gr_state_run, memory_order_relaxed) < 0; }

/* Per-thread hook state. */
typedef struct gr_tls {
  unsigned hook_depth; /* > 0 while inside an intercepted allocation or free */
  unsigned rt_depth;   /* > 0 while inside an intercepted runtime call */
  uintptr_t rt_caller; /* return address of the outermost runtime call */
  unsigned rt_api;     /* GR_API_cuda* of that call */
  unsigned in_dlsym;   /* recursion guard of the dlsym override */
  uint32_t tid;        /* cached gettid(), 0 until known */
  CUcontext last_ctx;  /* one-entry cache: context -> registry id, device */
  uint16_t last_ctx_id;
  uint8_t last_device;
  uint8_t cur_known;   /* registry.c: last_ctx is the thread's current context (no switch seen since asked) */
  uint8_t cur_sample;  /* registry.c: allocations until the driver is asked all the same */
  uint32_t cur_gen;    /* registry.c: the context generation cur_known holds for */
  unsigned scope_depth; /* scope.c: scopes this thread has open (gr_scope_tag's fast path reads it inline) */
} gr_tls_t;
extern GR_TLS gr_tls_t gr_tls;

uint32_t gr_state_tid(void);
/* CLOCK_MONOTONIC_COARSE in ms. */
uint64_t gr_state_now_ms(void);
/* Process start time (ms, CLOCK_REALTIME) for status files: when gpureclaim started in it (core.c sets it). */
uint64_t gr_state_start_time_ms(void);
void gr_state_set_start_time_ms(uint64_t ms);
/* A forked child: the calling (only) thread's state starts over. */
void gr_state_tls_atfork_child(void);

#endif /* GPURECLAIM_STATE_H */
