/*
 * gate.c -- hands out gates (gate.h, gate.S): every driver entry point the program gets through
 * cuGetProcAddress or dlsym(libcuda) goes through one, so that the first call of any thread while the process
 * sleeps wakes it before the call goes on (sleep.c), and a sleep knows which calls are past their gate.
 * The gates call no module: the slow path is the function core.c's constructor handed over (gr_gate_set_slow).
 *
 * Gates are handed out once per distinct real function (a small hash table under a mutex: this runs at symbol
 * lookup, never per call) and never taken back: a program may keep the pointer for good. When all GR_GATE_MAX
 * are in use, further entry points are handed out ungated (warned about once; calls through them are not seen).
 * GPURECLAIM_SLEEP=0 installs none; auto installs them when the driver has the checkpoint API.
 *
 * Thread records (gate.h): chunks of 64, the first static, the others mmap'ed (never malloc: a record is taken on
 * a thread's first call, where an allocation failure must not fail the call), never freed; a thread takes a free
 * record on its first call and gives it back at its end (a pthread key's destructor). A thread that cannot get
 * one (no memory for a chunk) shares a spare record whose count means nothing, and sleeps are refused from then
 * on (gr_gate_quiesce: -ENOMEM) rather than taken with a call that cannot be counted.
 * The flag's raising reaches every thread's next read of it through membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED),
 * registered when gates are first decided on: a sleep's one system call orders, on every thread that runs, the
 * gate's mark before its read of the flag, so the gates themselves need no fence. Where the kernel lacks it (or a
 * seccomp filter forbids it, or under ThreadSanitizer), gr_gate_fence is set: gate.S fences between mark and read,
 * and gr_gate_enter makes the mark a seq_cst read-modify-write and the read seq_cst, against the sleep's seq_cst
 * store of the flag (admit.c) and seq_cst reads of the marks. Either way: a gate that read the flag down has its
 * mark seen by the sleep that raised it, which waits for it; a gate that read it up waits at the gate.
 * Invariants: only its thread writes a record's count; a call's count is up from before its read of the flag to
 * after its return; the slow path is entered and left with its own call uncounted.
 */
#include "export.h"
#include "real.h"
#include "gate.h"
#include "options.h"

#include <errno.h>
#include <stddef.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic unsigned char gr_gate_flag;
GR_HIDDEN void *gr_gate_target[GR_GATE_MAX];
extern char gr_gate_stubs[], gr_gate_stubs_end[];
GR_HIDDEN void *gr_gate_slow(unsigned idx);

#define HASH_CAP (2 * GR_GATE_MAX) /* power of two, at most half full */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_keys[HASH_CAP];
static unsigned short g_idx[HASH_CAP];
static _Atomic unsigned g_n;
static _Atomic int g_enabled = -2; /* -2 not decided yet, else 0/1 */

GR_HIDDEN __thread gr_gate_rec_t *gr_gate_tls __attribute__((tls_model("initial-exec")));
_Atomic unsigned char gr_gate_fence = 1; /* until membarrier is known to work: fence */
static _Atomic int g_membarrier;           /* registered: a sleep's side is one membarrier call */
static _Atomic int g_force_fence;          /* tests: as without membarrier */

static int membarrier_cmd(int cmd) { return (int)syscall(SYS_membarrier, cmd, 0, 0); }

/* ThreadSanitizer models neither membarrier nor atomic_thread_fence: under it the gates always take their fenced
 * form, whose order is that of seq_cst operations alone, which it models. */
#if defined(__SANITIZE_THREAD__)
#define GATE_NO_MEMBARRIER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GATE_NO_MEMBARRIER 1
#endif
#endif
#ifndef GATE_NO_MEMBARRIER
#define GATE_NO_MEMBARRIER 0
#endif

/* Once gates are decided on, before any is handed out: the gates fence only where membarrier is missing. */
static void decide_fence(int enabled) {
  int mb = 0;
  if (enabled && !atomic_load(&g_force_fence) && !GATE_NO_MEMBARRIER) {
    int cmds = membarrier_cmd(MEMBARRIER_CMD_QUERY);
    mb = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
         membarrier_cmd(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }
  atomic_store(&g_membarrier, mb);
  /* Without gates no sleep ever waits for the marks: no fence either. */
  atomic_store_explicit(&gr_gate_fence, enabled && !mb, memory_order_release);
}

bool gr_gate_enabled(void) {
  int e = atomic_load_explicit(&g_enabled, memory_order_acquire);
  if (GR_LIKELY(e >= 0))
    return e;
  int want = gr_opt()->sleep;
  if (want < 0) /* auto: only where a sleep can work */
    want = gr_real_driver("cuCheckpointProcessLock") != NULL;
  want = want != 0;
  if (want && gr_gate_stubs_end - gr_gate_stubs != (ptrdiff_t)GR_GATE_MAX * GR_GATE_STUB) {
    gr_warn("gate.S's stubs are not %d bytes each (a build for another CPU?): no gates, no sleep", GR_GATE_STUB);
    want = 0;
  }
  decide_fence(want);
  atomic_store_explicit(&g_enabled, want, memory_order_release);
  return want;
}

void gr_gate_force_fence(int on) {
  atomic_store(&g_force_fence, on);
  int e = atomic_load(&g_enabled);
  if (e >= 0)
    decide_fence(e);
}

/* ---- thread records ---- */

_Static_assert(offsetof(gr_gate_rec_t, inflight) == GR_GATE_REC_INFLIGHT, "gate.S reads the counter there");
_Static_assert(sizeof(gr_gate_rec_t) == 64, "one record per cache line");

#define CHUNK 64
typedef struct chunk {
  gr_gate_rec_t rec[CHUNK];
  struct chunk *_Atomic next;
} chunk_t;
static chunk_t g_first;
static gr_gate_rec_t g_spare;     /* for threads that could get no record */
static _Atomic int g_spare_used;
static pthread_mutex_t g_rec_mu = PTHREAD_MUTEX_INITIALIZER; /* appending chunks */
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static bool g_key_ok;

#define FOREACH_REC(r)                                                                                        \
  for (chunk_t *c_ = &g_first; c_; c_ = atomic_load_explicit(&c_->next, memory_order_acquire))                \
    for (gr_gate_rec_t *r = c_->rec; r < c_->rec + CHUNK; r++)

static void rec_release(void *p) {
  gr_gate_rec_t *r = p;
  if (gr_gate_tls == r)
    gr_gate_tls = NULL;
  if (r == &g_spare)
    return;
  /* A thread ends with no call of its own in flight (one that ended inside a call will not return to it). */
  atomic_store_explicit(&r->inflight, 0, memory_order_relaxed);
  atomic_store_explicit(&r->tid, 0, memory_order_relaxed);
  atomic_store_explicit(&r->used, 0, memory_order_release);
}

static void key_create(void) { g_key_ok = pthread_key_create(&g_key, rec_release) == 0; }

static gr_gate_rec_t *rec_claim(void) {
  FOREACH_REC(r) {
    int free_ = 0;
    if (!atomic_load_explicit(&r->used, memory_order_relaxed) &&
        atomic_compare_exchange_strong(&r->used, &free_, 1))
      return r;
  }
  pthread_mutex_lock(&g_rec_mu);
  chunk_t *last = &g_first;
  while (atomic_load_explicit(&last->next, memory_order_acquire))
    last = atomic_load_explicit(&last->next, memory_order_acquire);
  gr_gate_rec_t *r = NULL;
  chunk_t *n = mmap(NULL, sizeof *n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (n != MAP_FAILED) {
    atomic_store_explicit(&n->rec[0].used, 1, memory_order_relaxed);
    r = &n->rec[0];
    atomic_store_explicit(&last->next, n, memory_order_release);
  }
  pthread_mutex_unlock(&g_rec_mu);
  return r;
}

/* The calling thread's record, taken on its first call. */
static gr_gate_rec_t *rec_get(void) {
  gr_gate_rec_t *r = gr_gate_tls;
  if (GR_LIKELY(r != NULL))
    return r;
  pthread_once(&g_key_once, key_create);
  r = rec_claim();
  if (!r) {
    r = &g_spare;
    atomic_store(&g_spare_used, 1);
    gr_warn_once(w_spare, "no memory for a thread's record of its CUDA calls: sleeps are refused from now on, "
                          "since a call of that thread could not be told from none");
  } else {
    atomic_store_explicit(&r->inflight, 0, memory_order_relaxed);
    atomic_store_explicit(&r->tid, (int)syscall(SYS_gettid), memory_order_relaxed);
  }
  gr_gate_tls = r;
  if (g_key_ok)
    pthread_setspecific(g_key, r); /* fails only without memory: the record then stays taken */
  return r;
}

long gr_gate_inflight(void) {
  long n = 0;
  FOREACH_REC(r)
    n += atomic_load_explicit(&r->inflight, memory_order_relaxed);
  return n;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int gr_gate_quiesce(unsigned timeout_ms, int *tid) {
  /* The flag is up: every thread's next read of it sees it, or its mark is visible below. */
  if (atomic_load(&g_membarrier)) {
    if (membarrier_cmd(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0)
      return -ENOTSUP; /* registered, so not expected: the gates do not fence, and nothing else orders them */
  }
  /* Without membarrier the flag's seq_cst store (admit.c) and the seq_cst loads below order against the gates'
   * seq_cst marks and reads: a gate that read the flag down has its mark seen here. */
  if (atomic_load(&g_spare_used))
    return -ENOMEM;
  gr_gate_rec_t *self = gr_gate_tls;
  uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000u;
  long nap_ns = 20000;
  for (;;) {
    int busy = 0;
    FOREACH_REC(r) {
      if (r != self && atomic_load_explicit(&r->inflight, memory_order_seq_cst) != 0) {
        busy = atomic_load_explicit(&r->tid, memory_order_relaxed);
        busy = busy ? busy : -1;
        break;
      }
    }
    if (!busy)
      return 0;
    if (mono_ns() >= deadline) {
      if (tid)
        *tid = busy;
      return -EBUSY;
    }
    nanosleep(&(struct timespec){0, nap_ns}, NULL);
    nap_ns = nap_ns < 1000000 ? nap_ns * 2 : 1000000;
  }
}

void gr_gate_atfork_child(void) {
  gr_gate_rec_t *self = gr_gate_tls;
  FOREACH_REC(r) {
    if (r == self)
      continue;
    atomic_store(&r->inflight, 0);
    atomic_store(&r->tid, 0);
    atomic_store(&r->used, 0);
  }
  if (self && self != &g_spare)
    atomic_store(&self->tid, (int)syscall(SYS_gettid));
  pthread_mutex_init(&g_rec_mu, NULL);
  /* The child is a new process to membarrier: registered again (one thread: the mode may change here). */
  int e = atomic_load(&g_enabled);
  if (e >= 0)
    decide_fence(e);
}

unsigned gr_gate_count(void) { return atomic_load_explicit(&g_n, memory_order_relaxed); }

void *gr_gate_wrap(void *real) {
  if (!real || !gr_gate_enabled())
    return real;
  uintptr_t h = ((uintptr_t)real >> 4) * UINT64_C(0x9e3779b97f4a7c15);
  size_t i = (size_t)(h >> 32) & (HASH_CAP - 1);
  void *gate = real;
  pthread_mutex_lock(&g_mu);
  while (g_keys[i] && g_keys[i] != real)
    i = (i + 1) & (HASH_CAP - 1);
  if (g_keys[i]) {
    gate = gr_gate_stubs + (size_t)g_idx[i] * GR_GATE_STUB;
  } else {
    unsigned n = atomic_load_explicit(&g_n, memory_order_relaxed);
    if (n < GR_GATE_MAX) {
      /* The target is in place before the gate's address is published (the mutex and the caller's own
       * hand-over order it for every thread that later gets the pointer). */
      __atomic_store_n(&gr_gate_target[n], real, __ATOMIC_RELEASE);
      g_keys[i] = real;
      g_idx[i] = (unsigned short)n;
      atomic_store_explicit(&g_n, n + 1, memory_order_relaxed);
      gate = gr_gate_stubs + (size_t)n * GR_GATE_STUB;
    }
  }
  pthread_mutex_unlock(&g_mu);
  if (gate == real)
    gr_warn_once(w_full, "all %d gates are in use: further driver entry points are handed out without one, and "
                         "a call through them while the process sleeps is not seen (it blocks in the driver "
                         "until a wake)", GR_GATE_MAX);
  return gate;
}

static _Atomic(gr_gate_slow_fn) g_slow;

void gr_gate_set_slow(gr_gate_slow_fn fn) { atomic_store_explicit(&g_slow, fn, memory_order_release); }

CUresult gr_gate_check_slow(void) {
  gr_gate_slow_fn fn = atomic_load_explicit(&g_slow, memory_order_acquire);
  return fn ? fn() : CUDA_SUCCESS;
}

/* Entered unmarked: waits (the slow function: a wake) until the flag is down with the thread marked, and
 * returns CUDA_SUCCESS marked; or the error, unmarked. Without a slow function the call goes on marked. */
CUresult gr_gate_enter_slow(void) {
  gr_gate_rec_t *r = rec_get();
  for (;;) {
    gr_gate_slow_fn fn = atomic_load_explicit(&g_slow, memory_order_acquire);
    if (atomic_load_explicit(&gr_gate_flag, memory_order_acquire) != GR_GATE_AWAKE && fn) {
      CUresult rc = fn();
      if (rc != CUDA_SUCCESS)
        return rc;
    }
    atomic_fetch_add_explicit(&r->inflight, 1, memory_order_seq_cst); /* the fenced form, with or without */
    if (atomic_load_explicit(&gr_gate_flag, memory_order_seq_cst) == GR_GATE_AWAKE || !fn)
      return CUDA_SUCCESS;
    atomic_store_explicit(&r->inflight, atomic_load_explicit(&r->inflight, memory_order_relaxed) - 1,
                          memory_order_release);
  }
}

bool gr_gate_driver_begin(void) {
  gr_gate_rec_t *r = rec_get();
  atomic_fetch_add_explicit(&r->inflight, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&gr_gate_flag, memory_order_seq_cst) != GR_GATE_SLEEP)
    return true;
  atomic_fetch_sub_explicit(&r->inflight, 1, memory_order_release);
  return false;
}

/* Called by a gate, unmarked, whose flag was set or whose thread had no record; the argument registers are
 * saved. The target to call, the thread marked in flight; NULL: return CUDA_ERROR_OUT_OF_MEMORY, unmarked. */
void *gr_gate_slow(unsigned idx) {
  void *target = __atomic_load_n(&gr_gate_target[idx], __ATOMIC_ACQUIRE);
  return gr_gate_enter_slow() == CUDA_SUCCESS ? target : NULL;
}
