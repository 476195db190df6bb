/*
 * registry.c -- the contexts, pools and devices gpureclaim has seen, and which library a code address is in.
 *
 * Contexts and pools get small ids (1..4095) stored in each block record. Both registries are open-addressing
 * arrays of atomic handles that never empty a slot: an id, once given to a handle, stays with it while any
 * record names it, so a record can never name the wrong context (a handle the driver reuses after a destroy
 * gets its old id back, and its old blocks were dropped at the destroy). Lookups are lock-free; inserts take one
 * CAS. When every slot has been used (a process that made more than 4095 contexts or pools over its life), a new
 * handle gets the id of a dead one (destroyed, and its destroy committed) that no record in the table names any
 * more (reg_reuse, under a mutex, with a visit of the table: the cold path of such a process only). Without that,
 * later contexts would get id 0, a destroy of one could not drop its blocks' records, and a release could free
 * a block that another context was given at the same address. Only when 4095 contexts are alive at once does a
 * new one get id 0; a release never frees a block whose context it does not know (release.c, claimable).
 * The library cache is used by reports and scope ends only (never inside an allocation) and takes a mutex.
 */
#include "registry.h"
#include "owner.h"
#include "real.h"
#include "state.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define REG_CAP 4095

typedef struct reg {
  _Atomic(void *) handle[REG_CAP];
  _Atomic int device[REG_CAP]; /* ordinal + 1; 0 unknown */
  _Atomic int alive[REG_CAP];
  _Atomic int flags[REG_CAP];
  _Atomic uint64_t count;
} reg_t;

#define F_DEFAULT 1

static reg_t g_ctx, g_pool;
static _Atomic(void *) g_primary[GR_MAX_DEV];   /* CUcontext */
static _Atomic int g_dev_pool[GR_MAX_DEV];      /* pool id + 0; 0 unknown */
static _Atomic uint32_t g_ctx_gen;               /* moves on every context destroy and device reset */
static _Atomic bool g_cur_unseen;                /* a context switch gpureclaim did not see was found */

static inline size_t reg_home(const void *h) {
  uint64_t x = (uint64_t)(uintptr_t)h * UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)((x >> 32) % REG_CAP);
}

static uint16_t reg_find(reg_t *r, void *h) {
  if (!h)
    return 0;
  size_t i = reg_home(h);
  for (size_t n = 0; n < REG_CAP; n++, i = i + 1 == REG_CAP ? 0 : i + 1) {
    void *cur = atomic_load_explicit(&r->handle[i], memory_order_acquire);
    if (cur == h)
      return (uint16_t)(i + 1);
    if (!cur)
      return 0;
  }
  return 0;
}

static pthread_mutex_t g_reuse_mu = PTHREAD_MUTEX_INITIALIZER;

/* Slot i, which holds its handle: alive, with its device and flags added. */
static void set_live(reg_t *r, size_t i, int device, int flags) {
  if (device >= 0)
    atomic_store_explicit(&r->device[i], device + 1, memory_order_relaxed);
  if (flags)
    atomic_fetch_or_explicit(&r->flags[i], flags, memory_order_relaxed);
  if (!atomic_exchange_explicit(&r->alive[i], 1, memory_order_acq_rel))
    atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed);
}

/* Slot i holds h: makes it alive with its device and flags. A dead slot comes back to life under g_reuse_mu, so
 * that reg_reuse never gives it to another handle meanwhile; false when that happened (the caller looks again). */
static bool reg_live(reg_t *r, size_t i, void *h, int device, int flags) {
  bool dead = !atomic_load_explicit(&r->alive[i], memory_order_acquire);
  if (dead) {
    pthread_mutex_lock(&g_reuse_mu);
    if (atomic_load_explicit(&r->handle[i], memory_order_acquire) != h) {
      pthread_mutex_unlock(&g_reuse_mu);
      return false;
    }
  }
  set_live(r, i, device, flags);
  if (dead)
    pthread_mutex_unlock(&g_reuse_mu);
  return true;
}

typedef struct {
  bool pool;
  uint16_t id;
} names_t;

static int names_one(gr_ref_t *ref, const gr_rec_t *rec, void *arg) {
  (void)ref;
  const names_t *n = arg;
  return (n->pool ? rec->pool_id : rec->ctx_id) == n->id;
}

/* Every slot used and h in none: gives h the id of a dead handle that no record names (see the top). Holding
 * g_reuse_mu, no dead slot comes back to life and no other handle takes one; a record cannot come to name a
 * dead id meanwhile (its context is destroyed, or its pool, and a thread that kept its id asks again: g_ctx_gen).
 * The id's destroy sequence stays (track.c, g_destroyed): an allocation in the new context that read the sequence
 * before the dead context's destroy drops its record as that destroy's, so the rare mistake leaves a block
 * untracked, never a record for a freed one. 0 when none is free. */
GR_COLD static uint16_t reg_reuse(reg_t *r, void *h, int device, int flags) {
  uint16_t id = 0;
  pthread_mutex_lock(&g_reuse_mu);
  for (size_t i = 0; i < REG_CAP && !id; i++) {
    void *cur = atomic_load_explicit(&r->handle[i], memory_order_acquire);
    if (cur == h) { /* another thread gave h its id meanwhile: make it alive here, still holding the mutex */
      set_live(r, i, device, flags);
      pthread_mutex_unlock(&g_reuse_mu);
      return (uint16_t)(i + 1);
    }
  }
  for (size_t i = 0; i < REG_CAP && !id; i++) {
    if (atomic_load_explicit(&r->alive[i], memory_order_acquire))
      continue;
    names_t n = {r == &g_pool, (uint16_t)(i + 1)};
    if (gr_table_visit(names_one, &n))
      continue; /* a record still names it */
    atomic_store_explicit(&r->device[i], device >= 0 ? device + 1 : 0, memory_order_relaxed);
    atomic_store_explicit(&r->flags[i], flags, memory_order_relaxed);
    atomic_store_explicit(&r->handle[i], h, memory_order_release);
    atomic_store_explicit(&r->alive[i], 1, memory_order_release);
    atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed);
    id = (uint16_t)(i + 1);
  }
  pthread_mutex_unlock(&g_reuse_mu);
  return id;
}

static uint16_t reg_add(reg_t *r, void *h, int device, int flags) {
  if (!h)
    return 0;
again:;
  size_t i = reg_home(h);
  for (size_t n = 0; n < REG_CAP; n++, i = i + 1 == REG_CAP ? 0 : i + 1) {
    void *cur = atomic_load_explicit(&r->handle[i], memory_order_acquire);
    if (!cur) {
      void *expected = NULL;
      if (atomic_compare_exchange_strong_explicit(&r->handle[i], &expected, h, memory_order_acq_rel,
                                                  memory_order_acquire))
        cur = h;
      else
        cur = expected;
    }
    if (cur != h)
      continue;
    if (!reg_live(r, i, h, device, flags))
      goto again; /* given to another handle meanwhile */
    return (uint16_t)(i + 1);
  }
  uint16_t id = reg_reuse(r, h, device, flags);
  if (!id)
    gr_warn_once(w_full, "more than %d contexts or pools alive at once; further ones are not attributed", REG_CAP);
  return id;
}

static void reg_dead(reg_t *r, uint16_t id) {
  if (id && atomic_exchange_explicit(&r->alive[id - 1], 0, memory_order_acq_rel))
    atomic_fetch_sub_explicit(&r->count, 1, memory_order_relaxed);
}

static int reg_device(reg_t *r, uint16_t id) {
  return id ? atomic_load_explicit(&r->device[id - 1], memory_order_relaxed) - 1 : -1;
}

/* ---- contexts ---- */

/* Device of a context that may not be current: push it, ask, pop. */
GR_COLD static int ctx_device_slow(CUcontext ctx) {
  CUcontext cur = NULL, popped = NULL;
  CUdevice dev = -1;
  if (!gr_drv.cuCtxGetDevice || !gr_drv.cuCtxGetCurrent)
    return -1;
  gr_drv.cuCtxGetCurrent(&cur);
  if (cur == ctx)
    return gr_drv.cuCtxGetDevice(&dev) == CUDA_SUCCESS ? dev : -1;
  if (!gr_drv.cuCtxPushCurrent || gr_drv.cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
    return -1;
  if (gr_drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
    dev = -1;
  gr_drv.cuCtxPopCurrent(&popped);
  return dev;
}

uint16_t gr_reg_ctx(CUcontext ctx, int device) {
  uint16_t id = reg_add(&g_ctx, ctx, device, 0);
  if (id && reg_device(&g_ctx, id) < 0) {
    int d = ctx_device_slow(ctx);
    if (d >= 0)
      atomic_store_explicit(&g_ctx.device[id - 1], d + 1, memory_order_relaxed);
  }
  return id;
}

uint16_t gr_reg_ctx_find(CUcontext ctx) { return reg_find(&g_ctx, ctx); }
CUcontext gr_reg_ctx_handle(uint16_t id) {
  return id ? atomic_load_explicit(&g_ctx.handle[id - 1], memory_order_acquire) : NULL;
}
int gr_reg_ctx_device(uint16_t id) { return reg_device(&g_ctx, id); }
bool gr_reg_ctx_alive(uint16_t id) { return id && atomic_load_explicit(&g_ctx.alive[id - 1], memory_order_acquire); }
void gr_reg_ctx_destroyed(uint16_t id) {
  reg_dead(&g_ctx, id);
  atomic_fetch_add_explicit(&g_ctx_gen, 1, memory_order_release);
}
uint64_t gr_reg_ctx_count(void) { return atomic_load_explicit(&g_ctx.count, memory_order_relaxed); }

/* ---- the calling thread's current context ----
 *
 * An allocation needs the context it was made in. Asking the driver (cuCtxGetCurrent) on every allocation costs
 * a call; instead each thread keeps the answer (gr_tls.last_ctx, its id and device) and trusts it until:
 *   - the thread makes a call that may change its current context, through any route gpureclaim hooks
 *     (cuCtxSetCurrent, cuCtxPushCurrent, cuCtxPopCurrent, cuCtxCreate, cuCtxDestroy, cuCtxDetach,
 *     cuGLCtxCreate, cuVDPAUCtxCreate, the primary context's release and reset: hooks/driver.c), or gpureclaim
 *     pushes or pops one itself: gr_reg_switched(). Each such hook first checks the kept answer against the
 *     driver's (gr_reg_switch_begin: one question per switch);
 *   - any thread destroys a context or resets a device (g_ctx_gen moves: a handle may come back for another
 *     context on another device);
 *   - every CUR_SAMPLE-th allocation on the thread, which asks the driver all the same. If the answer differs
 *     from what the thread kept, the program switched contexts by a route gpureclaim does not see: gpureclaim
 *     says so once and asks the driver on every allocation from then on (the block in hand gets the driver's
 *     answer; up to CUR_SAMPLE - 1 blocks before it may carry the previous context). */
#define CUR_SAMPLE 64

/* The thread's current context is not the one it kept, with no switch seen in between: the program switched by a
 * route gpureclaim does not intercept. Said once; no thread trusts its kept answer from now on. */
GR_COLD static void unseen_switch(CUcontext kept, CUcontext now) {
  if (!atomic_exchange_explicit(&g_cur_unseen, true, memory_order_relaxed))
    gr_warn("the current context changed by a route gpureclaim does not intercept (%p -> %p); gpureclaim asks "
            "the driver for it on every allocation from now on",
            (void *)kept, (void *)now);
}

void gr_reg_switch_begin(void) {
  CUcontext ctx = NULL;
  if (gr_tls.cur_known && gr_drv.cuCtxGetCurrent && gr_drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS &&
      ctx != gr_tls.last_ctx)
    unseen_switch(gr_tls.last_ctx, ctx);
}

/* Whether the thread's kept id is still ctx's: alive, and not given to another handle since (reg_reuse). */
static inline bool kept_id_holds(CUcontext ctx) {
  return gr_reg_ctx_alive(gr_tls.last_ctx_id) && gr_reg_ctx_handle(gr_tls.last_ctx_id) == ctx;
}

GR_COLD static bool current_slow(uint16_t *ctx_id, uint8_t *device, CUcontext *out) {
  CUcontext ctx = NULL;
  uint32_t gen = atomic_load_explicit(&g_ctx_gen, memory_order_acquire);
  /* known: no switch seen since the thread's answer. A destroy or reset elsewhere (gen moved) never changes this
   * thread's current handle (a destroyed context stays current, dangling), so a different answer is an unseen
   * switch either way; only the id and device of the same handle need asking again then. */
  bool known = gr_tls.cur_known, kept = known && gr_tls.cur_gen == gen;
  gr_tls.cur_known = 0;
  if (!gr_drv.cuCtxGetCurrent || gr_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
    return false;
  *out = ctx;
  if (GR_LIKELY(kept && ctx == gr_tls.last_ctx)) { /* the 1-in-CUR_SAMPLE check: confirmed */
    *ctx_id = gr_tls.last_ctx_id;
    *device = gr_tls.last_device;
    gr_tls.cur_sample = CUR_SAMPLE;
    gr_tls.cur_known = !atomic_load_explicit(&g_cur_unseen, memory_order_relaxed);
    return true;
  }
  if (GR_UNLIKELY(known && ctx != gr_tls.last_ctx))
    unseen_switch(gr_tls.last_ctx, ctx);
  uint16_t id = 0;
  if (ctx == gr_tls.last_ctx && kept_id_holds(ctx))
    id = gr_tls.last_ctx_id;
  else
    id = reg_find(&g_ctx, ctx);
  if (!id || !gr_reg_ctx_alive(id) || reg_device(&g_ctx, id) < 0) {
    CUdevice dev = -1;
    if (gr_drv.cuCtxGetDevice)
      gr_drv.cuCtxGetDevice(&dev);
    id = reg_add(&g_ctx, ctx, dev, 0);
  }
  int d = reg_device(&g_ctx, id);
  *ctx_id = id;
  *device = d >= 0 && d < GR_MAX_DEV ? (uint8_t)d : GR_DEVICE_NONE;
  gr_tls.last_ctx = ctx;
  gr_tls.last_ctx_id = id;
  gr_tls.last_device = *device;
  gr_tls.cur_gen = gen;
  gr_tls.cur_sample = CUR_SAMPLE;
  gr_tls.cur_known = id && !atomic_load_explicit(&g_cur_unseen, memory_order_relaxed);
  return true;
}

static inline bool current_kept(void) {
  return GR_LIKELY(gr_tls.cur_known) && GR_LIKELY(--gr_tls.cur_sample != 0) &&
         GR_LIKELY(gr_tls.cur_gen == atomic_load_explicit(&g_ctx_gen, memory_order_relaxed));
}

GR_HOT_INLINE bool gr_reg_current(uint16_t *ctx_id, uint8_t *device, CUcontext *out) {
  if (current_kept()) {
    *out = gr_tls.last_ctx;
    *ctx_id = gr_tls.last_ctx_id;
    *device = gr_tls.last_device;
    return true;
  }
  return current_slow(ctx_id, device, out);
}

GR_COLD static gr_where_t where_slow(void) {
  gr_where_t w = {0, GR_DEVICE_NONE, false};
  CUcontext ctx;
  w.ok = current_slow(&w.ctx_id, &w.device, &ctx);
  return w;
}

GR_HOT_INLINE gr_where_t gr_reg_here(void) {
  if (current_kept())
    return (gr_where_t){gr_tls.last_ctx_id, gr_tls.last_device, true};
  return where_slow();
}

int gr_reg_here_device(void) {
  gr_where_t w = gr_reg_here();
  return w.device == GR_DEVICE_NONE ? -1 : (int)w.device;
}

/* A stream's own context (cuStreamGetCtx), no stream or a special handle: the current one. */
static gr_where_t stream_where(CUstream s) {
  CUcontext ctx = NULL;
  if (!gr_drv.cuStreamGetCtx || gr_drv.cuStreamGetCtx(s, &ctx) != CUDA_SUCCESS || !ctx)
    return gr_reg_here();
  if (ctx == gr_tls.last_ctx && kept_id_holds(ctx))
    return (gr_where_t){gr_tls.last_ctx_id, gr_tls.last_device, true};
  uint16_t id = gr_reg_ctx(ctx, -1);
  int d = reg_device(&g_ctx, id);
  return (gr_where_t){id, d >= 0 && d < GR_MAX_DEV ? (uint8_t)d : GR_DEVICE_NONE, true};
}

GR_HOT_INLINE gr_where_t gr_reg_stream_where(CUstream s) {
  if (GR_LIKELY((uintptr_t)s <= (uintptr_t)CU_STREAM_PER_THREAD)) /* NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2) */
    return gr_reg_here();
  return stream_where(s);
}

bool gr_reg_stream(CUstream s, uint16_t *ctx_id, uint8_t *device) {
  gr_where_t w = gr_reg_stream_where(s);
  *ctx_id = w.ctx_id;
  *device = w.device;
  return w.ok;
}

void gr_reg_foreach_ctx(void (*fn)(uint16_t id, CUcontext ctx, int device, void *arg), void *arg) {
  for (uint16_t i = 0; i < REG_CAP; i++)
    if (atomic_load_explicit(&g_ctx.alive[i], memory_order_acquire))
      fn((uint16_t)(i + 1), atomic_load_explicit(&g_ctx.handle[i], memory_order_acquire),
         reg_device(&g_ctx, (uint16_t)(i + 1)), arg);
}

void gr_reg_primary(int device, CUcontext ctx) {
  if (device < 0 || device >= GR_MAX_DEV)
    return;
  atomic_store_explicit(&g_primary[device], ctx, memory_order_release);
  gr_reg_ctx(ctx, device);
}

uint16_t gr_reg_primary_id(int device) {
  if (device < 0 || device >= GR_MAX_DEV)
    return 0;
  return reg_find(&g_ctx, atomic_load_explicit(&g_primary[device], memory_order_acquire));
}

void gr_reg_device_reset(int device) {
  if (device < 0 || device >= GR_MAX_DEV)
    return;
  uint16_t id = gr_reg_primary_id(device);
  if (id)
    gr_reg_ctx_destroyed(id);
  atomic_fetch_add_explicit(&g_ctx_gen, 1, memory_order_release);
  atomic_store_explicit(&g_dev_pool[device], 0, memory_order_relaxed);
}

/* ---- pools ---- */

uint16_t gr_reg_pool(CUmemoryPool pool, int device, bool is_default) {
  uint16_t id = reg_find(&g_pool, pool);
  if (id && atomic_load_explicit(&g_pool.alive[id - 1], memory_order_acquire) && device < 0 && !is_default)
    return id;
  return reg_add(&g_pool, pool, device, is_default ? F_DEFAULT : 0);
}

CUmemoryPool gr_reg_pool_handle(uint16_t id) {
  return id ? atomic_load_explicit(&g_pool.handle[id - 1], memory_order_acquire) : NULL;
}
int gr_reg_pool_device(uint16_t id) { return reg_device(&g_pool, id); }

int gr_reg_async_device(CUmemoryPool pool, CUstream s) {
  if (pool) {
    int d = gr_reg_pool_device(gr_reg_pool(pool, -1, false));
    if (d >= 0)
      return d;
  }
  gr_where_t w = gr_reg_stream_where(s);
  return w.ok && w.device != GR_DEVICE_NONE ? w.device : -1;
}
void gr_reg_pool_destroyed(CUmemoryPool pool) {
  uint16_t id = reg_find(&g_pool, pool);
  reg_dead(&g_pool, id);
  for (int d = 0; d < GR_MAX_DEV; d++) {
    int expected = id;
    atomic_compare_exchange_strong_explicit(&g_dev_pool[d], &expected, 0, memory_order_relaxed,
                                            memory_order_relaxed);
  }
}
uint64_t gr_reg_pool_count(void) { return atomic_load_explicit(&g_pool.count, memory_order_relaxed); }

GR_COLD static uint16_t device_pool_slow(int device) {
  int id;
  CUmemoryPool pool = NULL;
  if (!gr_drv.cuDeviceGetMemPool || gr_drv.cuDeviceGetMemPool(&pool, device) != CUDA_SUCCESS || !pool)
    return 0;
  id = gr_reg_pool(pool, device, false);
  atomic_store_explicit(&g_dev_pool[device], id, memory_order_relaxed);
  return (uint16_t)id;
}

/* Inlined into the stream-ordered allocation hooks: one load once the device's pool is known. */
GR_HOT_INLINE uint16_t gr_reg_device_pool(int device) {
  if (GR_UNLIKELY(device < 0 || device >= GR_MAX_DEV))
    return 0;
  int id = atomic_load_explicit(&g_dev_pool[device], memory_order_relaxed);
  return GR_LIKELY(id) ? (uint16_t)id : device_pool_slow(device);
}

void gr_reg_device_set_pool(int device, CUmemoryPool pool) {
  if (device < 0 || device >= GR_MAX_DEV)
    return;
  atomic_store_explicit(&g_dev_pool[device], gr_reg_pool(pool, device, false), memory_order_relaxed);
}

void gr_reg_foreach_pool(void (*fn)(uint16_t id, CUmemoryPool pool, int device, void *arg), void *arg) {
  for (uint16_t i = 0; i < REG_CAP; i++)
    if (atomic_load_explicit(&g_pool.alive[i], memory_order_acquire))
      fn((uint16_t)(i + 1), atomic_load_explicit(&g_pool.handle[i], memory_order_acquire),
         reg_device(&g_pool, (uint16_t)(i + 1)), arg);
}

/* ---- libraries ---- */

typedef struct lib {
  void *base;
  char *path;
  const char *name;
  const char *owner;
} lib_t;

static pthread_mutex_t g_lib_lock = PTHREAD_MUTEX_INITIALIZER;
static lib_t g_libs[512];
static size_t g_nlibs;

gr_lib_t gr_reg_library(uintptr_t pc) {
  gr_lib_t out = {"?", "?", NULL};
  Dl_info info;
  struct link_map *lm = NULL;
  if (!pc || !dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP) || !info.dli_fbase)
    return out;
  pthread_mutex_lock(&g_lib_lock);
  for (size_t i = 0; i < g_nlibs; i++)
    if (g_libs[i].base == info.dli_fbase) {
      out = (gr_lib_t){g_libs[i].name, g_libs[i].path, g_libs[i].owner};
      pthread_mutex_unlock(&g_lib_lock);
      return out;
    }
  /* For the main program dladdr gives argv[0], which programs may change: ask the kernel instead. */
  char exe[4096];
  const char *path = info.dli_fname && *info.dli_fname ? info.dli_fname : "(main program)";
  if (lm && lm->l_name && !lm->l_name[0]) {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      path = exe;
    }
  }
  if (g_nlibs < GR_ARRAY_LEN(g_libs)) {
    char *copy = strdup(path);
    if (copy) {
      const char *slash = strrchr(copy, '/');
      lib_t *l = &g_libs[g_nlibs++];
      l->base = info.dli_fbase;
      l->path = copy;
      l->name = slash ? slash + 1 : copy;
      l->owner = gr_owner_of(copy);
      out = (gr_lib_t){l->name, l->path, l->owner};
    }
  }
  pthread_mutex_unlock(&g_lib_lock);
  return out;
}

void gr_reg_atfork_child(void) {
  /* Contexts and pools do not survive into a child: CUDA must be initialised again there. */
  memset(&g_ctx, 0, sizeof g_ctx);
  memset(&g_pool, 0, sizeof g_pool);
  memset(g_primary, 0, sizeof g_primary);
  memset(g_dev_pool, 0, sizeof g_dev_pool);
  pthread_mutex_init(&g_lib_lock, NULL);
  pthread_mutex_init(&g_reuse_mu, NULL);
  gr_tls.last_ctx = NULL;
  gr_tls.cur_known = 0;
  atomic_store_explicit(&g_cur_unseen, false, memory_order_relaxed);
}

typedef struct {
  int device;
  CUcontext found;
} ctx_find_t;

static void ctx_find(uint16_t id, CUcontext ctx, int device, void *arg) {
  (void)id;
  ctx_find_t *f = arg;
  if (!f->found && device == f->device)
    f->found = ctx;
}

bool gr_reg_ctx_known_on_device(int device) {
  if (device < 0)
    return false;
  ctx_find_t f = {device, NULL};
  gr_reg_foreach_ctx(ctx_find, &f);
  return f.found != NULL;
}

CUcontext gr_reg_ctx_on_device(int device) {
  if (device < 0)
    return NULL;
  unsigned flags = 0;
  int active = 0;
  uint16_t id = gr_reg_primary_id(device);
  if (id && gr_reg_ctx_alive(id) && gr_drv.cuDevicePrimaryCtxGetState &&
      gr_drv.cuDevicePrimaryCtxGetState(device, &flags, &active) == CUDA_SUCCESS && active)
    return gr_reg_ctx_handle(id);
  ctx_find_t f = {device, NULL};
  gr_reg_foreach_ctx(ctx_find, &f);
  return f.found;
}
