/* The registry of contexts, pools and devices (src/track/registry.c), through its declarations only: a handle gets one
 * small id for life (dead and alive again, it keeps it, until a full registry gives a dead id no record names to
 * a new handle), the counts follow the live ones, the registry refuses the 4096th live handle instead of sharing
 * an id, a device's cached pool goes with its pool, the current context is
 * asked of the driver (here a stand-in for the few driver calls it makes) and cached per thread, and a code
 * address names its library. The handles are made-up values: the registry never dereferences them. */
#include "gpureclaim_internal.h"
#include "../common/threads.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CAP 4095 /* ids 1..4095 */

static CUcontext ctx_n(unsigned i) { return (CUcontext)(uintptr_t)(0x7f0000001000u + (uintptr_t)i * 0x40); }
static CUmemoryPool pool_n(unsigned i) { return (CUmemoryPool)(uintptr_t)(0x7e0000002000u + (uintptr_t)i * 0x40); }

Test(registry, a_context_keeps_its_id_through_death_and_return) {
  CUcontext c = ctx_n(1);
  cr_assert_eq(gr_reg_ctx_find(c), 0, "known before it was added");
  uint16_t id = gr_reg_ctx(c, 2);
  cr_assert(id >= 1 && id <= CAP, "id %u", id);
  cr_assert_eq(gr_reg_ctx_find(c), id);
  cr_assert_eq(gr_reg_ctx_handle(id), c);
  cr_assert_eq(gr_reg_ctx_device(id), 2);
  cr_assert(gr_reg_ctx_alive(id));
  cr_assert_eq(gr_reg_ctx_count(), 1);
  cr_assert_eq(gr_reg_ctx(c, 2), id, "added twice, two ids");
  cr_assert_eq(gr_reg_ctx_count(), 1, "added twice, counted twice");

  gr_reg_ctx_destroyed(id);
  cr_assert_not(gr_reg_ctx_alive(id));
  cr_assert_eq(gr_reg_ctx_count(), 0);
  gr_reg_ctx_destroyed(id);
  cr_assert_eq(gr_reg_ctx_count(), 0, "a second destroy counted again");
  cr_assert_eq(gr_reg_ctx_find(c), id, "a dead context's id was given up");

  cr_assert_eq(gr_reg_ctx(c, 3), id, "the driver's reused handle got a new id");
  cr_assert(gr_reg_ctx_alive(id));
  cr_assert_eq(gr_reg_ctx_device(id), 3);
  cr_assert_eq(gr_reg_ctx_count(), 1);
}

Test(registry, nothing_is_registered_for_null_or_id_0) {
  cr_assert_eq(gr_reg_ctx(NULL, 0), 0);
  cr_assert_eq(gr_reg_ctx_find(NULL), 0);
  cr_assert_eq(gr_reg_pool(NULL, 0, true), 0);
  cr_assert_eq(gr_reg_ctx_count() + gr_reg_pool_count(), 0);
  cr_assert_null(gr_reg_ctx_handle(0));
  cr_assert_null(gr_reg_pool_handle(0));
  cr_assert_eq(gr_reg_ctx_device(0), -1);
  cr_assert_not(gr_reg_ctx_alive(0));
  gr_reg_ctx_destroyed(0); /* no-op */
  cr_assert_eq(gr_reg_ctx_count(), 0);
}

/* Without a driver to ask, a context added without its device has none (-1), until it is added with one. */
Test(registry, a_device_unknown_to_the_caller_and_the_driver_is_minus_1) {
  uint16_t id = gr_reg_ctx(ctx_n(5), -1);
  cr_assert_neq(id, 0);
  cr_assert_eq(gr_reg_ctx_device(id), -1);
  cr_assert_eq(gr_reg_ctx(ctx_n(5), 4), id);
  cr_assert_eq(gr_reg_ctx_device(id), 4);
  cr_assert_eq(gr_reg_ctx(ctx_n(5), -1), id);
  cr_assert_eq(gr_reg_ctx_device(id), 4, "adding without a device forgot the known one");
}

/* Every handle of a full registry has its own id (none shared, whatever the probing did); one more is refused
 * with 0, the id that attributes to nobody. */
Test(registry, a_full_registry_refuses_the_next_handle) {
  static uint8_t used[CAP + 1];
  for (unsigned i = 0; i < CAP; i++) {
    uint16_t id = gr_reg_ctx(ctx_n(i), (int)(i % GR_MAX_DEV));
    cr_assert(id >= 1 && id <= CAP, "handle %u: id %u", i, id);
    cr_assert_not(used[id], "handle %u shares id %u", i, id);
    used[id] = 1;
  }
  cr_assert_eq(gr_reg_ctx_count(), CAP);
  cr_assert_eq(gr_reg_ctx(ctx_n(CAP), 0), 0, "a 4096th context got an id");
  cr_assert_eq(gr_reg_ctx_find(ctx_n(CAP)), 0);
  for (unsigned i = 0; i < CAP; i += 97) {
    uint16_t id = gr_reg_ctx_find(ctx_n(i));
    cr_assert_eq(gr_reg_ctx_handle(id), ctx_n(i));
    cr_assert_eq(gr_reg_ctx_device(id), (int)(i % GR_MAX_DEV));
  }
}

/* A full registry gives a new handle the id of a dead one, but only an id no record in the table names (a
 * record naming it would be attributed to the new handle, and a destroy of either would take the other's). */
static void table_init(void) { cr_assert_eq(gr_table_init(), 0); }

Test(registry, a_full_registry_gives_again_only_dead_ids_no_record_names, .init = table_init) {
  for (unsigned i = 0; i < CAP; i++)
    cr_assert_neq(gr_reg_ctx(ctx_n(i), 0), 0);
  uint16_t named = gr_reg_ctx_find(ctx_n(10)), free_id = gr_reg_ctx_find(ctx_n(20));
  gr_rec_t r = {.key = 0x7d0000000000u, .size = 4096, .ctx_id = named, .state = GR_ST_LIVE,
                .kind = GPURECLAIM_KIND_DEVICE, .device = 0};
  cr_assert_eq(gr_table_insert(&r), 0);
  gr_reg_ctx_destroyed(named);
  gr_reg_ctx_destroyed(free_id);
  uint16_t id = gr_reg_ctx(ctx_n(CAP), 1);
  cr_assert_eq(id, free_id, "the new handle got id %u, not the dead id %u that no record names", id, free_id);
  cr_assert_eq(gr_reg_ctx_handle(id), ctx_n(CAP));
  cr_assert_eq(gr_reg_ctx_device(id), 1, "the dead handle's device stayed");
  cr_assert(gr_reg_ctx_alive(id));
  cr_assert_eq(gr_reg_ctx_find(ctx_n(20)), 0, "the dead handle still finds the id it gave up");
  cr_assert_eq(gr_reg_ctx_count(), CAP - 1);
  cr_assert_eq(gr_reg_ctx(ctx_n(CAP + 1), 0), 0, "a dead id that a record names was given again");
  gr_rec_t out;
  cr_assert_eq(gr_table_take(GR_KS_ADDR, r.key, GR_STMASK(GR_ST_LIVE), &out), 0);
  cr_assert_eq(gr_reg_ctx(ctx_n(CAP + 1), 2), named, "once no record names it, the dead id is given again");
  cr_assert_eq(gr_reg_ctx(ctx_n(20), 0), 0, "the registry is full again: the old handle has no id now");
  /* pools the same way */
  for (unsigned i = 0; i < CAP; i++)
    cr_assert_neq(gr_reg_pool(pool_n(i), 0, false), 0);
  uint16_t pid = gr_reg_pool(pool_n(7), -1, false);
  gr_reg_pool_destroyed(pool_n(7));
  cr_assert_eq(gr_reg_pool(pool_n(CAP), 3, false), pid);
  cr_assert_eq(gr_reg_pool_handle(pid), pool_n(CAP));
  cr_assert_eq(gr_reg_pool_device(pid), 3);
}

typedef struct {
  uint16_t id;
} racer_t;

static void *register_new(void *arg) {
  racer_t *r = arg;
  r->id = gr_reg_ctx(ctx_n(CAP + 5), 0);
  return NULL;
}

/* Threads that register one new handle at once in a full registry with dead ids get one id between them. */
Test(registry, threads_registering_one_new_handle_in_a_full_registry_share_one_id) {
  for (unsigned i = 0; i < CAP; i++)
    cr_assert_neq(gr_reg_ctx(ctx_n(i), 0), 0);
  for (unsigned i = 0; i < 8; i++)
    gr_reg_ctx_destroyed(gr_reg_ctx_find(ctx_n(i * 100)));
  racer_t rs[4] = {{0}};
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    t[i] = gr_thread_start(register_new, &rs[i]);
  for (int i = 0; i < 4; i++)
    gr_thread_join(t[i]);
  cr_assert_neq(rs[0].id, 0);
  for (int i = 1; i < 4; i++)
    cr_assert_eq(rs[i].id, rs[0].id, "thread %d got id %u, thread 0 id %u", i, rs[i].id, rs[0].id);
  cr_assert_eq(gr_reg_ctx_count(), CAP - 7);
}

typedef struct {
  unsigned calls;
  uint16_t ids[8];
  int devices[8];
} visits_t;

static void visit(uint16_t id, CUcontext ctx, int device, void *arg) {
  visits_t *v = arg;
  cr_assert_eq(gr_reg_ctx_handle(id), ctx);
  if (v->calls < 8) {
    v->ids[v->calls] = id;
    v->devices[v->calls] = device;
  }
  v->calls++;
}

Test(registry, foreach_visits_the_live_contexts_only) {
  uint16_t a = gr_reg_ctx(ctx_n(1), 0), b = gr_reg_ctx(ctx_n(2), 1), c = gr_reg_ctx(ctx_n(3), 2);
  gr_reg_ctx_destroyed(b);
  visits_t v = {0};
  gr_reg_foreach_ctx(visit, &v);
  cr_assert_eq(v.calls, 2);
  for (unsigned i = 0; i < 2; i++) {
    cr_assert(v.ids[i] == a || v.ids[i] == c, "visited id %u", v.ids[i]);
    cr_assert_eq(v.devices[i], v.ids[i] == a ? 0 : 2);
  }
  cr_assert_neq(v.ids[0], v.ids[1]);
}

Test(registry, a_primary_context_and_its_reset) {
  CUcontext p = ctx_n(9);
  gr_reg_primary(3, p);
  uint16_t id = gr_reg_primary_id(3);
  cr_assert_neq(id, 0);
  cr_assert_eq(gr_reg_ctx_find(p), id);
  cr_assert_eq(gr_reg_ctx_device(id), 3);
  cr_assert_eq(gr_reg_primary_id(2), 0);
  cr_assert_eq(gr_reg_primary_id(-1), 0);
  cr_assert_eq(gr_reg_primary_id(GR_MAX_DEV), 0);
  gr_reg_primary(GR_MAX_DEV, ctx_n(10)); /* out of range: ignored */
  cr_assert_eq(gr_reg_ctx_find(ctx_n(10)), 0);

  uint16_t pool = gr_reg_pool(pool_n(1), 3, true);
  gr_reg_device_set_pool(3, pool_n(1));
  cr_assert_eq(gr_reg_device_pool(3), pool);
  gr_reg_device_reset(3);
  cr_assert_not(gr_reg_ctx_alive(id), "a reset left the primary context alive");
  cr_assert_eq(gr_reg_device_pool(3), 0, "a reset kept the device's cached pool (no driver to ask again)");
  cr_assert(gr_reg_ctx_alive(gr_reg_ctx(p, 3)));
}

Test(registry, pools_and_a_devices_current_pool) {
  uint16_t a = gr_reg_pool(pool_n(1), 0, true), b = gr_reg_pool(pool_n(2), 0, false);
  cr_assert(a && b && a != b);
  cr_assert_eq(gr_reg_pool_count(), 2);
  cr_assert_eq(gr_reg_pool_handle(a), pool_n(1));
  cr_assert_eq(gr_reg_pool_device(a), 0);
  cr_assert_eq(gr_reg_pool(pool_n(1), -1, false), a);
  cr_assert_eq(gr_reg_pool_device(a), 0, "looking a pool up forgot its device");
  cr_assert_eq(gr_reg_pool_count(), 2);

  cr_assert_eq(gr_reg_device_pool(0), 0, "a device's pool without a driver to ask");
  gr_reg_device_set_pool(0, pool_n(2));
  gr_reg_device_set_pool(1, pool_n(2));
  gr_reg_device_set_pool(2, pool_n(1));
  cr_assert_eq(gr_reg_device_pool(0), b);
  cr_assert_eq(gr_reg_device_pool(-1), 0);
  cr_assert_eq(gr_reg_device_pool(GR_MAX_DEV), 0);

  gr_reg_pool_destroyed(pool_n(2));
  cr_assert_eq(gr_reg_pool_count(), 1);
  cr_assert_eq(gr_reg_device_pool(0), 0, "device 0 still names a destroyed pool");
  cr_assert_eq(gr_reg_device_pool(1), 0, "device 1 still names a destroyed pool");
  cr_assert_eq(gr_reg_device_pool(2), a, "another device's pool went with it");
  cr_assert_eq(gr_reg_pool(pool_n(2), 1, false), b, "a pool handle back after its destroy got a new id");
  cr_assert_eq(gr_reg_pool_count(), 2);
}

/* ---- with a stand-in for the driver calls the registry makes ---- */

static _Thread_local CUcontext t_current;
static _Atomic unsigned g_get_device_calls, g_get_current_calls;
static CUresult fake_get_current(CUcontext *c) {
  atomic_fetch_add(&g_get_current_calls, 1);
  *c = t_current;
  return CUDA_SUCCESS;
}
/* Device of a made-up context: its number modulo 4 (ctx_n), 100 (past GR_MAX_DEV) for anything else. */
static CUresult fake_get_device(CUdevice *d) {
  atomic_fetch_add(&g_get_device_calls, 1);
  uintptr_t v = (uintptr_t)t_current;
  *d = v >= (uintptr_t)ctx_n(0) && v < (uintptr_t)ctx_n(1u << 20) ? (int)(((v - (uintptr_t)ctx_n(0)) / 0x40) % 4) : 100;
  return CUDA_SUCCESS;
}
static _Thread_local CUcontext t_pushed_over; /* a one-deep context stack */
static CUresult fake_push(CUcontext c) {
  t_pushed_over = t_current;
  t_current = c;
  return CUDA_SUCCESS;
}
static CUresult fake_pop(CUcontext *c) {
  *c = t_current;
  t_current = t_pushed_over;
  return CUDA_SUCCESS;
}
static int g_primary_active;
static CUresult fake_primary_state(CUdevice d, unsigned *flags, int *active) {
  (void)d;
  *flags = 0;
  *active = g_primary_active;
  return CUDA_SUCCESS;
}
static CUmemoryPool g_device_pool;
static CUresult fake_device_pool(CUmemoryPool *p, CUdevice d) {
  (void)d;
  *p = g_device_pool;
  return CUDA_SUCCESS;
}

static void fake_driver(void) {
  gr_drv.cuCtxGetCurrent = fake_get_current;
  gr_drv.cuCtxGetDevice = fake_get_device;
  gr_drv.cuCtxPushCurrent = fake_push;
  gr_drv.cuCtxPopCurrent = fake_pop;
  gr_drv.cuDevicePrimaryCtxGetState = fake_primary_state;
  gr_drv.cuDeviceGetMemPool = fake_device_pool;
}

Test(registry, the_current_context_is_asked_once_then_cached, .init = fake_driver) {
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = NULL;
  cr_assert_not(gr_reg_current(&id, &dev, &c), "a thread without a current context has one");
  t_current = ctx_n(6);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(c, ctx_n(6));
  cr_assert_eq(id, gr_reg_ctx_find(ctx_n(6)));
  cr_assert_eq(dev, 2);
  unsigned asked = atomic_load(&g_get_device_calls);
  cr_assert_eq(asked, 1);
  for (int i = 0; i < 10; i++) {
    uint16_t id2;
    uint8_t dev2;
    cr_assert(gr_reg_current(&id2, &dev2, &c));
    cr_assert(id2 == id && dev2 == dev);
  }
  cr_assert_eq(atomic_load(&g_get_device_calls), asked, "the device was asked again of a cached context");

  /* Destroyed, the same handle is registered again (same id) and asked again: the driver may reuse it. */
  gr_reg_ctx_destroyed(id);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(id, gr_reg_ctx_find(ctx_n(6)));
  cr_assert(gr_reg_ctx_alive(id), "the current context is dead in the registry");
  cr_assert_eq(atomic_load(&g_get_device_calls), asked + 1);

  /* A device past the registry's range is none, not a truncated ordinal; so is one the driver cannot tell. */
  t_current = (CUcontext)(uintptr_t)0x5000;
  gr_reg_switched(); /* what the hooked cuCtxSetCurrent does */
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(dev, GR_DEVICE_NONE, "device %u", dev);
  gr_drv.cuCtxGetDevice = NULL;
  t_current = (CUcontext)(uintptr_t)0x6000;
  gr_reg_switched();
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(dev, GR_DEVICE_NONE, "device %u", dev);
}

/* The thread's answer is trusted until a switch gpureclaim sees (gr_reg_switched, what every hooked switch calls),
 * apart from one question in 64 allocations. */
Test(registry, the_current_context_is_asked_again_after_a_switch_only, .init = fake_driver) {
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(1);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(atomic_load(&g_get_current_calls), 1);
  for (int i = 0; i < 20; i++) {
    cr_assert(gr_reg_current(&id, &dev, &c));
    cr_assert(c == ctx_n(1) && dev == 1);
  }
  cr_assert_eq(atomic_load(&g_get_current_calls), 1, "the driver was asked with nothing changed");
  t_current = ctx_n(2);
  gr_reg_switched();
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(atomic_load(&g_get_current_calls), 2, "a switch gpureclaim saw was not followed by a question");
  cr_assert(c == ctx_n(2) && dev == 2 && id == gr_reg_ctx_find(ctx_n(2)), "the answer after the switch is stale");
  /* A thread left without a context keeps asking: nothing is cached from "none". */
  t_current = NULL;
  gr_reg_switched();
  cr_assert_not(gr_reg_current(&id, &dev, &c));
  cr_assert_not(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(atomic_load(&g_get_current_calls), 4);
}

static void *destroy_ctx_2(void *arg) {
  (void)arg;
  gr_reg_ctx_destroyed(gr_reg_ctx_find(ctx_n(2)));
  return NULL;
}

/* Another thread's destroy of a context (the handle may come back for another context, on another device) makes
 * every thread ask again. */
Test(registry, a_destroy_on_another_thread_makes_the_thread_ask_again, .init = fake_driver) {
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(2);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert(gr_reg_current(&id, &dev, &c));
  unsigned asked = atomic_load(&g_get_current_calls);
  cr_assert_eq(asked, 1);
  gr_thread_run(destroy_ctx_2, NULL);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(atomic_load(&g_get_current_calls), asked + 1, "a destroy elsewhere left the thread's answer trusted");
  cr_assert(gr_reg_ctx_alive(id), "the current context was not registered again after its handle's destroy");
}

/* What gpureclaim says on stderr (fd 2) between capture_begin and capture_end, into text. */
typedef struct {
  FILE *file;
  int saved;
} capture_t;
static capture_t capture_begin(void) {
  capture_t cap = {tmpfile(), -1};
  cr_assert_not_null(cap.file);
  fflush(stderr);
  cap.saved = dup(2);
  cr_assert_geq(cap.saved, 0);
  cr_assert_geq(dup2(fileno(cap.file), 2), 0);
  return cap;
}
static void capture_end(capture_t cap, char *text, size_t len) {
  fflush(stderr);
  dup2(cap.saved, 2);
  close(cap.saved);
  rewind(cap.file);
  size_t n = fread(text, 1, len - 1, cap.file);
  text[n] = 0;
  fclose(cap.file);
}

/* The thread keeps ctx 1, then its current context becomes ctx 2 with no switch gpureclaim sees, and it makes
 * `allocations` more. Returns how many of its questions found no context (none should); no Criterion assertion
 * inside, so other threads use it too. */
static int keep_1_then_switch_unseen_to_2(int allocations) {
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(1);
  int none = !gr_reg_current(&id, &dev, &c);
  t_current = ctx_n(2);
  for (int i = 0; i < allocations; i++)
    none += !gr_reg_current(&id, &dev, &c);
  return none;
}

/* The warning was given, and the thread asks the driver on each of its next five allocations, getting want. */
static void assert_found_and_cache_off(capture_t cap, CUcontext want) {
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  unsigned asked = atomic_load(&g_get_current_calls);
  for (int i = 0; i < 5; i++) {
    cr_assert(gr_reg_current(&id, &dev, &c));
    cr_assert_eq(c, want);
  }
  char text[4096];
  capture_end(cap, text, sizeof text);
  cr_assert(strstr(text, "changed by a route gpureclaim does not intercept") != NULL, "no warning: \"%s\"", text);
  cr_assert_null(strstr(strstr(text, "does not intercept") + 1, "does not intercept"), "said twice: \"%s\"", text);
  cr_assert_eq(atomic_load(&g_get_current_calls), asked + 5, "the cache stayed on after an unseen switch");
}

/* A switch by a route gpureclaim does not see (here: the stand-in driver's current context changes without
 * gr_reg_switched) is found within 64 allocations, said once on stderr, and from then on the driver is asked on
 * every allocation, switches seen or not. */
Test(registry, a_switch_gpureclaim_did_not_see_turns_the_cache_off, .init = fake_driver) {
  capture_t cap = capture_begin();
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(1);
  cr_assert(gr_reg_current(&id, &dev, &c));
  t_current = ctx_n(3); /* unseen */
  int stale = 0;
  while (gr_reg_current(&id, &dev, &c) && c == ctx_n(1))
    cr_assert_lt(++stale, 64, "the unseen switch was not found in 64 allocations");
  cr_assert(c == ctx_n(3) && dev == 3, "the allocation that found the switch did not get the driver's answer");
  gr_reg_switched(); /* a seen switch does not turn the cache back on */
  assert_found_and_cache_off(cap, ctx_n(3));
}

/* A destroy of the thread's own current context, on the thread, is no switch: it is asked again, without a
 * warning, and kept again afterwards. */
Test(registry, the_thread_s_own_context_destroyed_is_asked_again_without_a_warning, .init = fake_driver) {
  capture_t cap = capture_begin();
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(6);
  cr_assert(gr_reg_current(&id, &dev, &c));
  gr_reg_ctx_destroyed(id);
  cr_assert(gr_reg_current(&id, &dev, &c));
  unsigned asked = atomic_load(&g_get_current_calls);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq(atomic_load(&g_get_current_calls), asked, "the answer after the destroy was not kept");
  char text[4096];
  capture_end(cap, text, sizeof text);
  cr_assert_null(strstr(text, "does not intercept"), "a warning without a switch: \"%s\"", text);
}

static void *find_an_unseen_switch(void *arg) {
  (void)arg;
  return (void *)(intptr_t)keep_1_then_switch_unseen_to_2(64); /* its check comes within 64 allocations */
}

/* Once any thread found a switch gpureclaim did not see, every thread stops trusting its answer by its next
 * check: the route that switched unseen may be used by any thread. */
Test(registry, an_unseen_switch_found_by_one_thread_turns_the_cache_off_in_all, .init = fake_driver) {
  capture_t cap = capture_begin();
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  t_current = ctx_n(3);
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert_eq((intptr_t)gr_thread_run(find_an_unseen_switch, NULL), 0);
  for (int i = 0; i < 64; i++) /* this thread's next check comes within 64 allocations */
    cr_assert(gr_reg_current(&id, &dev, &c));
  assert_found_and_cache_off(cap, ctx_n(3));
}

Test(registry, a_stream_names_its_own_context_and_the_null_stream_the_current_one, .init = fake_driver) {
  uint16_t id;
  uint8_t dev;
  t_current = ctx_n(1);
  cr_assert(gr_reg_stream(NULL, &id, &dev));
  cr_assert_eq(id, gr_reg_ctx_find(ctx_n(1)));
  cr_assert_eq(dev, 1);
  cr_assert(gr_reg_stream(CU_STREAM_PER_THREAD, &id, &dev));
  cr_assert_eq(dev, 1);
  /* Without cuStreamGetCtx a stream is taken to be in the current context. */
  cr_assert(gr_reg_stream((CUstream)(uintptr_t)0x9000, &id, &dev));
  cr_assert_eq(id, gr_reg_ctx_find(ctx_n(1)));
}

/* A context not current: its device is asked by making it current for a moment, then the caller's is back.
 * The current one is asked directly. */
Test(registry, the_device_of_a_context_that_is_not_current, .init = fake_driver) {
  t_current = ctx_n(0);
  uint16_t id = gr_reg_ctx(ctx_n(3), -1);
  cr_assert_eq(gr_reg_ctx_device(id), 3);
  cr_assert_eq(t_current, ctx_n(0), "the caller's current context was not given back");
  id = gr_reg_ctx(ctx_n(0), -1);
  cr_assert_eq(gr_reg_ctx_device(id), 0);
  cr_assert_eq(t_current, ctx_n(0));
  cr_assert_eq(atomic_load(&g_get_device_calls), 2);
}

Test(registry, a_devices_pool_is_asked_once, .init = fake_driver) {
  g_device_pool = pool_n(4);
  uint16_t id = gr_reg_device_pool(1);
  cr_assert_neq(id, 0);
  cr_assert_eq(gr_reg_pool_handle(id), pool_n(4));
  cr_assert_eq(gr_reg_pool_device(id), 1);
  g_device_pool = pool_n(5);
  cr_assert_eq(gr_reg_device_pool(1), id, "the cached pool was not used");
  gr_reg_pool_destroyed(pool_n(4));
  uint16_t id5 = gr_reg_device_pool(1);
  cr_assert_eq(gr_reg_pool_handle(id5), pool_n(5), "a destroyed pool was not asked for again");
}

/* The primary context when the driver says it is active, else any live context on the device. */
Test(registry, a_context_on_a_device_is_the_active_primary_first, .init = fake_driver) {
  /* two contexts on device 5, the primary the one with the higher id, so that a plain scan finds the other */
  CUcontext a = ctx_n(20), b = ctx_n(21);
  uint16_t ia = gr_reg_ctx(a, 5), ib = gr_reg_ctx(b, 5);
  CUcontext lower = ia < ib ? a : b, higher = ia < ib ? b : a;
  gr_reg_primary(5, higher);
  g_primary_active = 1;
  cr_assert_eq(gr_reg_ctx_on_device(5), higher, "the active primary context was not preferred");
  g_primary_active = 0;
  cr_assert_eq(gr_reg_ctx_on_device(5), lower);
  gr_reg_ctx_destroyed(gr_reg_ctx_find(lower));
  cr_assert_eq(gr_reg_ctx_on_device(5), higher);
  g_primary_active = 1;
  gr_reg_ctx_destroyed(gr_reg_ctx_find(higher));
  cr_assert_null(gr_reg_ctx_on_device(5), "a destroyed context was handed out");
  cr_assert_null(gr_reg_ctx_on_device(6));
  cr_assert_null(gr_reg_ctx_on_device(-1));
}

/* Threads registering the same handles at once: one id per handle, each counted once. */
#define THREADS 4
#define HANDLES 500
static uint16_t g_ids[THREADS][HANDLES];
static void *register_all(void *arg) {
  uint16_t *ids = arg;
  for (unsigned i = 0; i < HANDLES; i++)
    ids[i] = gr_reg_ctx(ctx_n(i), (int)(i % 8));
  return NULL;
}

Test(registry, threads_adding_the_same_contexts_agree_on_their_ids) {
  pthread_t t[THREADS];
  for (int k = 0; k < THREADS; k++)
    t[k] = gr_thread_start(register_all, g_ids[k]);
  for (int k = 0; k < THREADS; k++)
    gr_thread_join(t[k]);
  cr_assert_eq(gr_reg_ctx_count(), HANDLES);
  for (unsigned i = 0; i < HANDLES; i++) {
    cr_assert_neq(g_ids[0][i], 0);
    cr_assert_eq(gr_reg_ctx_handle(g_ids[0][i]), ctx_n(i));
    for (int k = 1; k < THREADS; k++)
      cr_assert_eq(g_ids[k][i], g_ids[0][i], "handle %u: thread %d got id %u, thread 0 %u", i, k, g_ids[k][i],
                   g_ids[0][i]);
  }
}

/* An address names its object: libc's for libc's stdout stream (not a function, which a sanitizer may
 * intercept), this program's (as the kernel names it) for one of its functions; nothing for 0 or an unmapped
 * address. Asked again, the same cached strings. */
Test(registry, a_code_address_names_its_library) {
  gr_lib_t l = gr_reg_library((uintptr_t)stdout);
  cr_assert_not_null(strstr(l.name, "libc"), "stdout in %s", l.name);
  cr_assert_eq(strchr(l.name, '/'), NULL, "the name is not a basename: %s", l.name);
  cr_assert_eq(l.path[0], '/', "path %s", l.path);
  cr_assert_null(l.owner);
  cr_assert_eq(gr_reg_library((uintptr_t)stdout).name, l.name, "not cached");

  gr_lib_t me = gr_reg_library((uintptr_t)&visit);
  cr_assert_str_eq(me.name, "test_registry");
  cr_assert_neq(me.name, l.name);

  gr_lib_t none = gr_reg_library(0);
  cr_assert_str_eq(none.name, "?");
  cr_assert_str_eq(gr_reg_library(16).name, "?");
}

/* A child starts with no context or pool: CUDA must be initialised again there. */
Test(registry, a_fork_child_forgets_contexts_and_pools) {
  uint16_t id = gr_reg_ctx(ctx_n(1), 0);
  gr_reg_pool(pool_n(1), 0, true);
  gr_reg_device_set_pool(0, pool_n(1));
  gr_reg_primary(0, ctx_n(1));
  gr_reg_atfork_child();
  cr_assert_eq(gr_reg_ctx_count() + gr_reg_pool_count(), 0);
  cr_assert_not(gr_reg_ctx_alive(id));
  cr_assert_eq(gr_reg_ctx_find(ctx_n(1)), 0);
  cr_assert_eq(gr_reg_primary_id(0), 0);
  cr_assert_eq(gr_reg_device_pool(0), 0);
}

/* ---- an unseen switch is found even when the thread's check never comes with its answer intact ---- */

static void *destroy_ctx_9(void *arg) {
  (void)arg;
  gr_reg_ctx_destroyed(gr_reg_ctx(ctx_n(9), 1)); /* any context, anywhere: every thread asks again */
  return NULL;
}

/* A destroy on another thread, after an unseen switch and before this thread's 64th allocation: the question it
 * causes still compares with the kept answer (another thread's destroy never changes this thread's current
 * handle), so the switch is said and the cache goes. */
Test(registry, an_unseen_switch_then_a_destroy_elsewhere_is_still_found, .init = fake_driver) {
  capture_t cap = capture_begin();
  cr_assert_eq(keep_1_then_switch_unseen_to_2(10), 0);
  gr_thread_run(destroy_ctx_9, NULL);
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  cr_assert(gr_reg_current(&id, &dev, &c));
  cr_assert(c == ctx_n(2) && dev == 2, "the question after the destroy did not take the driver's answer");
  assert_found_and_cache_off(cap, ctx_n(2));
}

/* A seen switch after an unseen one: the hook checks the kept answer against the driver's before its call
 * (gr_reg_switch_begin), so the unseen one is found there. */
Test(registry, an_unseen_switch_then_a_seen_one_is_found_by_the_seen_one, .init = fake_driver) {
  capture_t cap = capture_begin();
  cr_assert_eq(keep_1_then_switch_unseen_to_2(10), 0);
  gr_reg_switch_begin(); /* what a hooked switch does around its call */
  t_current = ctx_n(3);
  gr_reg_switched();
  assert_found_and_cache_off(cap, ctx_n(3));
}

/* Seen switches alone never warn and keep the cache: the check before each agrees with the kept answer. */
Test(registry, seen_switches_alone_say_nothing, .init = fake_driver) {
  capture_t cap = capture_begin();
  uint16_t id;
  uint8_t dev;
  CUcontext c;
  for (unsigned k = 0; k < 50; k++) {
    gr_reg_switch_begin();
    t_current = ctx_n(1 + k % 3);
    gr_reg_switched();
    for (int i = 0; i < 3; i++) {
      cr_assert(gr_reg_current(&id, &dev, &c));
      cr_assert_eq(c, ctx_n(1 + k % 3));
    }
  }
  char text[4096];
  capture_end(cap, text, sizeof text);
  cr_assert_null(strstr(text, "does not intercept"), "a warning without an unseen switch: \"%s\"", text);
}
