/*
 * report.c -- what gpureclaim writes: release reports (JSON lines to GPURECLAIM_LOG, when set), the per-process
 * status file, snapshots and leak reports. Formats: docs/PROTOCOL.md.
 *
 * Files go to a private run directory (mode 0700, owned by the user); one that exists with other owners or
 * wider permissions is refused with one warning. Regular files are written to a temporary name and renamed,
 * so a reader never sees half a file; a device, FIFO or link a user names is written into (outfile.c), but in
 * the run directory a status file is always replaced: a link or FIFO put in its place is never written through.
 * Nothing here runs inside an allocation.
 */
#include "gpureclaim_internal.h"
#include "json.h"
#include "outfile.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the run directory ---- */

static pthread_once_t g_rundir_once = PTHREAD_ONCE_INIT;
static const char *g_rundir; /* NULL when unusable */

static void open_rundir(void) {
  const char *dir = gr_opt()->rundir;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    gr_warn("cannot create the run directory %s: %s; no status file (gpureclaim ps will not list this process)",
            dir, strerror(errno));
    return;
  }
  struct stat st;
  if (lstat(dir, &st) != 0 || !gr_dir_is_private(&st)) {
    gr_warn("the run directory %s is not a directory private to this user (mode 0700); refusing to use it", dir);
    return;
  }
  g_rundir = dir;
}

const char *gr_report_rundir(void) {
  pthread_once(&g_rundir_once, open_rundir);
  return g_rundir;
}

/* Writes b to path: outfile.c replaces a regular file through a temporary name, writes into anything else. */
static int write_file(const char *path, const jbuf_t *b, mode_t mode) {
  if (b->failed)
    return -ENOMEM;
  return gr_out_write(path, b->p, b->len, mode);
}

/* ---- pieces ---- */

void gr_report_report_json(jbuf_t *b, const gpureclaim_report_t *r) {
  char what[64];
  jb_obj(b);
  jb_u64(b, "seq", r->seq);
  jb_str(b, "trigger", gr_trigger_name(r->trigger));
  jb_str(b, "what", gr_opt_what_name(r->what, what, sizeof what));
  jb_u64(b, "cached_bytes", r->cached_bytes);
  jb_u64(b, "pool_bytes", r->pool_bytes);
  jb_u64(b, "framework_bytes", r->framework_bytes);
  jb_u64(b, "releaser_bytes", r->releaser_bytes);
  jb_u64(b, "orphaned_bytes", r->orphaned_bytes);
  jb_u64(b, "orphaned_blocks", r->orphaned_blocks);
  jb_u64(b, "all_bytes", r->all_bytes);
  jb_u64(b, "all_blocks", r->all_blocks);
  jb_u64(b, "failed_blocks", r->failed_blocks);
  jb_f64(b, "ms", (double)r->duration_ns / 1e6);
  if (r->trigger == GPURECLAIM_TRIGGER_PEER)
    jb_i64(b, "peer_pid", r->peer_pid); /* the process that asked */
  jb_arr(b, "devices");
  for (int i = 0; i < r->ndevices && i < GPURECLAIM_MAX_DEVICES; i++) {
    const gpureclaim_device_report_t *d = &r->devices[i];
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d->device);
    jb_u64(b, "pool_bytes", d->pool_bytes);
    jb_u64(b, "orphaned_bytes", d->orphaned_bytes);
    jb_u64(b, "orphaned_blocks", d->orphaned_blocks);
    jb_u64(b, "all_bytes", d->all_bytes);
    jb_u64(b, "all_blocks", d->all_blocks);
    jb_u64(b, "free_before", d->free_before);
    jb_u64(b, "free_after", d->free_after);
    jb_u64(b, "total", d->total);
    jb_obj_end(b);
  }
  jb_arr_end(b);
  jb_obj_end(b);
}

static void stats_fields(jbuf_t *b, const gpureclaim_stats_t *s) {
#define F(name) jb_u64(b, #name, s->name)
  F(live_blocks); F(live_bytes); F(peak_bytes); F(total_allocs); F(total_frees); F(pool_reserved_bytes);
  F(pool_used_bytes); F(host_pinned_blocks); F(host_pinned_bytes); F(va_reserved_bytes); F(vmm_mapped_bytes);
  F(orphan_blocks); F(orphan_bytes); F(ctx_destroyed_blocks); F(ctx_destroyed_bytes); F(untracked_frees);
  F(late_frees); F(untracked_routes); F(releases); F(released_bytes); F(oom_retries); F(oom_retry_successes);
  F(table_bytes); F(contexts); F(pools); F(peer_reclaims); F(peer_reclaim_successes); F(peer_received_bytes);
  F(peer_gives); F(peer_given_bytes);
#undef F
}

static void device_stats(jbuf_t *b) {
  jb_arr(b, "devices");
  for (int d = 0; d < GR_MAX_DEV; d++) {
    gpureclaim_stats_t s = {.size = sizeof s};
    if (gr_stats_get(d, &s) != 0 || (!s.total_allocs && !s.pool_reserved_bytes && !s.live_blocks))
      continue;
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d);
    stats_fields(b, &s);
    jb_obj_end(b);
  }
  jb_arr_end(b);
}

static void pool_json(uint16_t id, CUmemoryPool pool, int device, void *arg) {
  (void)id;
  jbuf_t *b = arg;
  cuuint64_t reserved = 0, used = 0;
  if (gr_drv.cuMemPoolGetAttribute && !gr_sleep_driver_off()) { /* asleep: the driver cannot be asked */
    gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    gr_drv.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
  }
  jb_key(b, NULL);
  jb_obj(b);
  jb_hex(b, "pool", (uint64_t)(uintptr_t)pool);
  jb_i64(b, "device", device);
  jb_u64(b, "reserved_bytes", reserved);
  jb_u64(b, "used_bytes", used);
  jb_obj_end(b);
}

/* ---- GPUs: ordinal, UUID as nvidia-smi writes it, and the driver's memory figures ---- */

typedef CUresult (*uuid_fn_t)(CUuuid *, CUdevice);
static uuid_fn_t g_uuid_fn;
static pthread_once_t g_uuid_once = PTHREAD_ONCE_INIT;

static void resolve_uuid(void) {
  /* _v2 names a MIG instance by its own UUID; the first version, the GPU's. */
  *(void **)&g_uuid_fn = gr_real_driver("cuDeviceGetUuid_v2");
  if (!g_uuid_fn)
    *(void **)&g_uuid_fn = gr_real_driver("cuDeviceGetUuid");
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" of device ordinal d, as nvidia-smi -L shows it; false if unknown. */
static struct {
  _Atomic int known;
  CUuuid u;
} g_uuid_cache[GR_MAX_DEV]; /* a device's UUID never changes: asleep, the driver is not asked again */

bool gr_report_gpu_uuid(int d, char *buf, size_t len) {
  pthread_once(&g_uuid_once, resolve_uuid);
  CUdevice dev;
  CUuuid u;
  if (d >= 0 && d < GR_MAX_DEV && atomic_load_explicit(&g_uuid_cache[d].known, memory_order_acquire)) {
    u = g_uuid_cache[d].u;
  } else {
    if (gr_sleep_driver_off() || !g_uuid_fn || !gr_drv.cuDeviceGet || gr_drv.cuDeviceGet(&dev, d) != CUDA_SUCCESS ||
        g_uuid_fn(&u, dev) != CUDA_SUCCESS)
      return false;
    if (d >= 0 && d < GR_MAX_DEV && !atomic_load_explicit(&g_uuid_cache[d].known, memory_order_relaxed)) {
      g_uuid_cache[d].u = u; /* the same bytes whichever thread writes them first */
      atomic_store_explicit(&g_uuid_cache[d].known, 1, memory_order_release);
    }
  }
  const unsigned char *x = (const unsigned char *)u.bytes;
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1], x[2],
           x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
  return true;
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

/* A context of this process on device d (its primary one when active), NULL when it has none there. */
static CUcontext ctx_on(int d) {
  unsigned flags = 0;
  int active = 0;
  uint16_t id = gr_reg_primary_id(d);
  if (id && gr_reg_ctx_alive(id) && gr_drv.cuDevicePrimaryCtxGetState &&
      gr_drv.cuDevicePrimaryCtxGetState(d, &flags, &active) == CUDA_SUCCESS && active)
    return gr_reg_ctx_handle(id);
  ctx_find_t f = {d, NULL};
  gr_reg_foreach_ctx(ctx_find, &f);
  return f.found;
}

/* "gpus": ordinal and UUID of each GPU; with memory, of those this process has a context on, with
 * cuMemGetInfo's figures (the whole device's: every process's memory and every context's own included), else
 * of every GPU it can see (none before cuInit). */
static _Atomic int g_count_seen; /* the last device count read: asleep, the driver is not asked */

static void gpus_json(jbuf_t *b, bool memory) {
  int count = 0;
  bool off = gr_sleep_driver_off();
  if (off)
    count = atomic_load_explicit(&g_count_seen, memory_order_relaxed);
  else if (!gr_drv.cuDeviceGetCount || gr_drv.cuDeviceGetCount(&count) != CUDA_SUCCESS)
    count = 0;
  else
    atomic_store_explicit(&g_count_seen, count, memory_order_relaxed);
  memory = memory && !off;
  jb_arr(b, "gpus");
  for (int d = 0; d < count && d < GR_MAX_DEV; d++) {
    CUcontext ctx = memory && atomic_load_explicit(&gr_core_state, memory_order_acquire) == 1 ? ctx_on(d) : NULL;
    if (memory && !ctx)
      continue;
    char uuid[64];
    jb_key(b, NULL);
    jb_obj(b);
    jb_i64(b, "device", d);
    jb_str(b, "uuid", gr_report_gpu_uuid(d, uuid, sizeof uuid) ? uuid : NULL);
    if (memory) {
      size_t free_b = 0, total = 0;
      CUcontext cur = NULL;
      bool pushed = false;
      if (gr_drv.cuCtxPushCurrent && gr_drv.cuCtxGetCurrent && gr_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS &&
          cur != ctx)
        pushed = gr_drv.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
      if (gr_drv.cuMemGetInfo && gr_drv.cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS) {
        jb_u64(b, "free_bytes", free_b);
        jb_u64(b, "total_bytes", total);
      }
      if (pushed)
        gr_drv.cuCtxPopCurrent(&cur);
    }
    jb_obj_end(b);
  }
  jb_arr_end(b);
}

/* "frameworks": what framework caches hold, read through CPython (releasers/python.c). */
static void frameworks_json(jbuf_t *b) {
  gr_py_cache_t c[16];
  int n = gr_py_caches(c, (int)GR_ARRAY_LEN(c));
  gr_peer_note_frameworks(c, n); /* what the status file says a peer could give ("as last measured") */
  jb_arr(b, "frameworks");
  for (int i = 0; i < n; i++) {
    jb_key(b, NULL);
    jb_obj(b);
    jb_str(b, "framework", c[i].name);
    jb_i64(b, "device", c[i].device);
    jb_u64(b, "reserved_bytes", c[i].reserved);
    jb_u64(b, "allocated_bytes", c[i].allocated);
    jb_u64(b, "releasable_bytes", c[i].releasable);
    jb_obj_end(b);
  }
  jb_arr_end(b);
}

void gr_report_stats_json(jbuf_t *b) {
  gpureclaim_stats_t s = {.size = sizeof s};
  gr_stats_get(-1, &s);
  jb_key(b, "total");
  jb_obj(b);
  stats_fields(b, &s);
  jb_obj_end(b);
  device_stats(b);
  jb_arr(b, "pools");
  gr_reg_foreach_pool(pool_json, b);
  jb_arr_end(b);
  gpus_json(b, true);
  frameworks_json(b);
  gr_sleep_json(b);
}

/* ---- the status file ---- */

static void read_file(const char *path, char *buf, size_t len, size_t *got) {
  *got = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  ssize_t n;
  while (*got < len - 1 && (n = read(fd, buf + *got, len - 1 - *got)) > 0)
    *got += (size_t)n;
  close(fd);
  buf[*got] = '\0';
}

static uint64_t start_ticks(void) {
  char buf[1024];
  size_t n;
  read_file("/proc/self/stat", buf, sizeof buf, &n);
  (void)n;
  return gr_stat_start_ticks(buf);
}

static _Atomic uint64_t g_status_releases;
static gpureclaim_report_t g_last_report;
static bool g_have_last;
/* Releases that served a release signal, and the last of them: `gpureclaim release --signal` waits for this
 * count to grow and shows that report, not whatever release (of another client) happened to end first. */
static uint64_t g_signal_releases;
static gpureclaim_report_t g_last_signal_report;
static pthread_mutex_t g_status_lock = PTHREAD_MUTEX_INITIALIZER;
/* Under g_status_lock: the state each status file shows is numbered when it is read, and a file is renamed into
 * place only if its number is above that of the file there. Two updates at once (a release on one thread, a
 * scope end on another) otherwise could rename theirs in either order and leave the older status in place. */
static uint64_t g_status_numbered, g_status_placed;
/* Under g_status_lock: set at exit, after which no status file is written; and the updates between their check
 * of it and their rename. Exit waits for those, then removes the file: a release on another thread while the
 * process exits re-created the status file after its removal, or left its temporary file half-written. */
static bool g_status_closed;
/* The control socket's path while it is open ("" otherwise), as control.c hands it over. */
static char g_status_socket[4200];

void gr_report_status_socket(const char *path) {
  pthread_mutex_lock(&g_status_lock);
  snprintf(g_status_socket, sizeof g_status_socket, "%s", path ? path : "");
  pthread_mutex_unlock(&g_status_lock);
}

static unsigned g_status_writers;
static pthread_cond_t g_status_done = PTHREAD_COND_INITIALIZER;

int gr_report_status_update(void) {
  const gr_options_t *o = gr_opt();
  const char *dir = o->status ? gr_report_rundir() : NULL;
  if (!dir)
    return -ENOENT;
  char path[4200], exe[4096] = "", cmd[4096];
  snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  size_t got;
  read_file("/proc/self/cmdline", cmd, sizeof cmd, &got);
  for (size_t i = 0; got && i < got - 1; i++)
    if (cmd[i] == '\0')
      cmd[i] = ' ';
  char sig[16], what[64];
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_i64(&b, "pid", getpid());
  jb_u64(&b, "uid", geteuid());
  jb_str(&b, "version", GPURECLAIM_VERSION_STRING);
  jb_str(&b, "exe", exe);
  jb_str(&b, "cmdline", cmd);
  jb_u64(&b, "start_ticks", start_ticks());
  jb_u64(&b, "started_ms", gr_core_start_time_ms());
  jb_str(&b, "signal", gr_opt_signal_name(o->signal, sig, sizeof sig));
  jb_str(&b, "on_signal", o->on_signal_sleep ? "sleep" : gr_opt_what_name(o->on_signal, what, sizeof what));
  jb_bool(&b, "signal_caught", gr_sig_caught());
  /* Where this image's AT_RANDOM bytes are: a new address at every exec (address-space randomisation), which
   * keeps the pid and start time; the command reads it back from /proc/PID/auxv. */
  jb_u64(&b, "exec_id", (uint64_t)getauxval(AT_RANDOM));
  gpus_json(&b, false); /* ordinals and UUIDs of the GPUs it has contexts on, as of this update */
  /* What changes is read under the lock, in the order the number gives (appending to memory only). */
  pthread_mutex_lock(&g_status_lock);
  if (g_status_closed) {
    pthread_mutex_unlock(&g_status_lock);
    jb_free(&b);
    return -ESHUTDOWN;
  }
  g_status_writers++;
  uint64_t number = ++g_status_numbered;
  jb_u64(&b, "updated_ms", gr_wall_ms());
  if (g_status_socket[0])
    jb_str(&b, "socket", g_status_socket);
  else
    jb_null(&b, "socket");
  jb_u64(&b, "releases", atomic_load_explicit(&g_status_releases, memory_order_relaxed));
  if (g_have_last) {
    jb_key(&b, "last_release");
    gr_report_report_json(&b, &g_last_report);
  } else {
    jb_null(&b, "last_release");
  }
  gr_sleep_json(&b);
  jb_u64(&b, "signal_releases", g_signal_releases);
  if (g_signal_releases) {
    jb_key(&b, "last_signal_release");
    gr_report_report_json(&b, &g_last_signal_report);
  } else {
    jb_null(&b, "last_signal_release");
  }
  pthread_mutex_unlock(&g_status_lock);
  gr_peer_status_json(&b); /* "peer": per GPU UUID held and givable, whether it asks and gives */
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  int rc;
  if (b.failed) {
    rc = -ENOMEM;
  } else {
    /* Always a new file renamed into place: whatever else is at the path in our private directory (a link, a
     * FIFO) is replaced, never written through. Written outside the lock; only the rename, which
     * does not wait on a reader, inside it. */
    char tmp[GR_OUT_TEMP_MAX];
    /* Not flushed to disk: it describes this process while it runs (the worker rewrites it within half a second
     * of a change, a peer reclaim twice); readers need only the rename. */
    rc = gr_out_write_temp_ex(path, b.p, b.len, 0600, tmp, sizeof tmp, false);
    if (rc == 0) {
      pthread_mutex_lock(&g_status_lock);
      bool newest = number > g_status_placed;
      if (newest && rename(tmp, path) == 0)
        g_status_placed = number;
      else if (newest)
        rc = -errno;
      pthread_mutex_unlock(&g_status_lock);
      if (!newest || rc != 0)
        unlink(tmp); /* a newer status is in place already, or the rename failed */
    }
  }
  pthread_mutex_lock(&g_status_lock);
  if (--g_status_writers == 0)
    pthread_cond_broadcast(&g_status_done);
  pthread_mutex_unlock(&g_status_lock);
  jb_free(&b);
  return rc;
}

void gr_report_atfork_child(void) {
  pthread_mutex_init(&g_status_lock, NULL);
  pthread_cond_init(&g_status_done, NULL);
  g_status_closed = false;
  g_status_writers = 0;
  g_status_socket[0] = '\0'; /* the parent's socket; the child's worker opens its own */
  atomic_store_explicit(&g_status_releases, 0, memory_order_relaxed);
  g_have_last = false;
  g_signal_releases = 0;
}

void gr_report_status_remove(void) {
  pthread_mutex_lock(&g_status_lock);
  g_status_closed = true;
  /* Updates under way finish first (a write and a rename); bounded, should one be stuck in a dead filesystem. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  while (g_status_writers && pthread_cond_timedwait(&g_status_done, &g_status_lock, &until) == 0)
    ;
  const char *dir = g_rundir;
  if (dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    unlink(path);
  }
  pthread_mutex_unlock(&g_status_lock);
}

/* ---- release reports ---- */

/* Appends one JSON line (b, newline included) where events go (a release report, a peer reclaim, a sleep, a
 * wake): GPURECLAIM_LOG, or stderr when asked. */
void gr_report_event(const jbuf_t *b) {
  const char *log = gr_opt()->log;
  if (log[0]) {
    /* Not waiting: a FIFO nobody reads would block the open for good, and a release runs on an allocating
     * thread (OOM retry), in gpureclaim_release() and on the worker that serves the control socket. It fails
     * with ENXIO instead, and the report goes to stderr. */
    int fd = gr_out_open_nowait(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd >= 0) {
      int rc = jb_write_fd(b, fd); /* one write of a short line: appends stay whole */
      if (close(fd) != 0 && rc == 0 && errno != EINTR)
        rc = -errno;
      if (rc < 0) { /* a full disk, a quota, an I/O error: the report is not lost without a word */
        gr_warn_once(w_log_write, "cannot write to GPURECLAIM_LOG=%s: %s; reports that cannot be written there "
                                  "go to stderr", log, strerror(-rc));
        jb_write_fd(b, STDERR_FILENO);
      }
    } else {
      const char *why = errno == ENXIO ? "a FIFO nobody reads" : strerror(errno);
      gr_warn_once(w_log, "cannot open GPURECLAIM_LOG=%s: %s; reports go to stderr", log, why);
      jb_write_fd(b, STDERR_FILENO);
    }
  } else if (gr_opt()->log_stderr) { /* asked for: GPURECLAIM_LOG=stderr */
    jb_write_fd(b, STDERR_FILENO);
  } /* else quiet: nothing on the program's stderr unless asked */
}

void gr_report_release(const gpureclaim_report_t *r, bool served_signal) {
  jbuf_t b;
  jb_init(&b);
  jb_obj(&b);
  jb_str(&b, "event", "release");
  jb_i64(&b, "pid", getpid());
  jb_key(&b, "report");
  gr_report_report_json(&b, r);
  jb_obj_end(&b);
  jb_raw(&b, "\n", 1);
  gr_report_event(&b);
  gr_log_release(r);
  jb_free(&b);
  pthread_mutex_lock(&g_status_lock);
  g_last_report = *r;
  g_have_last = true;
  atomic_fetch_add_explicit(&g_status_releases, 1, memory_order_relaxed);
  if (served_signal) {
    g_last_signal_report = *r;
    g_signal_releases++;
  }
  pthread_mutex_unlock(&g_status_lock);
  if (gr_opt()->status)
    gr_report_status_update();
}

/* ---- snapshots ---- */

typedef struct {
  jbuf_t *b;
  uint64_t ctx_blocks[GR_MAX_CTX], ctx_bytes[GR_MAX_CTX];
} snap_t;

static void block_json(jbuf_t *b, const gpureclaim_block_t *x) {
  jb_key(b, NULL);
  jb_obj(b);
  jb_hex(b, "address", x->address);
  jb_u64(b, "bytes", x->bytes);
  jb_str(b, "kind", gr_kind_name(x->kind));
  jb_str(b, "state", gr_block_state_name(x->state));
  jb_i64(b, "device", x->device);
  if (x->context)
    jb_hex(b, "context", (uint64_t)(uintptr_t)x->context);
  else
    jb_null(b, "context");
  if (x->pool)
    jb_hex(b, "pool", (uint64_t)(uintptr_t)x->pool);
  else
    jb_null(b, "pool");
  jb_u64(b, "scope", x->scope);
  jb_u64(b, "thread", x->thread_id);
  jb_u64(b, "time_ms", x->alloc_time_ms);
  jb_hex(b, "caller", (uint64_t)(uintptr_t)x->caller);
  jb_str(b, "library", x->library);
  jb_str(b, "api", x->api);
  jb_str(b, "owner", x->owner);
  if (x->kind == GPURECLAIM_KIND_VMM_MAPPING)
    jb_hex(b, "handle", x->handle);
  jb_obj_end(b);
}

static int snap_block(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  if (r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN && r->state != GR_ST_RELEASED)
    return 0;
  snap_t *s = arg;
  gpureclaim_block_t x;
  gr_block_from_rec(r, &x);
  block_json(s->b, &x);
  if (r->ctx_id && r->ctx_id < GR_MAX_CTX && gr_kind_is_device_memory(r->kind)) {
    s->ctx_blocks[r->ctx_id]++;
    s->ctx_bytes[r->ctx_id] += r->size;
  }
  return 0;
}

int gr_report_snapshot_json(jbuf_t *b) {
  snap_t *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->b = b;
  jb_obj(b);
  jb_i64(b, "pid", getpid());
  jb_str(b, "version", GPURECLAIM_VERSION_STRING);
  jb_u64(b, "time_ms", gr_wall_ms());
  gr_report_stats_json(b);
  jb_arr(b, "blocks");
  if (atomic_load_explicit(&gr_core_state, memory_order_acquire) == 1)
    gr_table_visit(snap_block, s);
  jb_arr_end(b);
  jb_arr(b, "contexts");
  for (uint16_t id = 1; id < GR_MAX_CTX; id++) {
    if (!s->ctx_blocks[id] && !gr_reg_ctx_alive(id))
      continue;
    jb_key(b, NULL);
    jb_obj(b);
    jb_hex(b, "context", (uint64_t)(uintptr_t)gr_reg_ctx_handle(id));
    jb_i64(b, "device", gr_reg_ctx_device(id));
    jb_u64(b, "blocks", s->ctx_blocks[id]);
    jb_u64(b, "bytes", s->ctx_bytes[id]);
    jb_obj_end(b);
  }
  jb_arr_end(b);
  jb_obj_end(b);
  free(s);
  return jb_failed(b) ? -ENOMEM : 0;
}

/* ---- leak reports ---- */

typedef struct leak_group {
  gr_site_t site; /* as recorded: blocks of one stack (one call site without backtraces) form a group */
  uintptr_t pc;
  unsigned kind;
  uint64_t blocks, bytes;
} leak_group_t;

typedef struct {
  leak_group_t *g;
  size_t n, cap;
  uint64_t dev_blocks[GR_MAX_DEV + 1], dev_bytes[GR_MAX_DEV + 1];
  uint64_t blocks, bytes;
  bool nomem; /* a group could not be added: the report would miss blocks */
} leaks_t;

static int leak_block(gr_ref_t *ref, const gr_rec_t *r, void *arg) {
  (void)ref;
  leaks_t *l = arg;
  if ((r->state != GR_ST_LIVE && r->state != GR_ST_ORPHAN && r->state != GR_ST_RELEASED) ||
      r->kind == GPURECLAIM_KIND_VMM_MAPPING || r->kind == GPURECLAIM_KIND_VA)
    return 0;
  size_t i;
  for (i = 0; i < l->n; i++)
    if (gr_site_same(l->g[i].site, r->site) && l->g[i].kind == r->kind)
      break;
  if (i == l->n) {
    if (l->n == l->cap) {
      size_t cap = l->cap ? l->cap * 2 : 32;
      leak_group_t *p = realloc(l->g, cap * sizeof *p);
      if (!p) {
        l->nomem = true;
        return 1; /* stop: an incomplete report is not written */
      }
      l->g = p;
      l->cap = cap;
    }
    l->g[l->n++] = (leak_group_t){r->site, gr_site_pc(r->site), r->kind, 0, 0};
  }
  l->g[i].blocks++;
  l->g[i].bytes += r->size;
  int d = r->device < GR_MAX_DEV ? r->device : GR_MAX_DEV;
  l->dev_blocks[d]++;
  l->dev_bytes[d] += r->size;
  l->blocks++;
  l->bytes += r->size;
  return 0;
}

static int by_bytes(const void *a, const void *b) {
  const leak_group_t *x = a, *y = b;
  return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

static void symbolize(uintptr_t pc, char *buf, size_t len) {
  Dl_info info;
  if (pc && dladdr((void *)pc, &info) && info.dli_sname)
    snprintf(buf, len, "%s+0x%lx", info.dli_sname, (unsigned long)(pc - (uintptr_t)info.dli_saddr));
  else
    buf[0] = '\0';
}

/* "module+0xoffset" of pc (the module's file name and pc's offset from its load address): what addr2line -e
 * and LeakSanitizer's reports use, stable across runs of a position-independent program. */
static void locate(uintptr_t pc, char *buf, size_t len) {
  Dl_info info;
  struct link_map *lm = NULL;
  /* The offset is from the module's load bias (l_addr), not the address it is mapped at: 0 for a program
   * linked at a fixed address (-no-pie), whose file addresses are the absolute ones addr2line expects. */
  if (pc && dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP) && lm)
    snprintf(buf, len, "%s+0x%lx", gr_reg_library(pc).name, (unsigned long)(pc - (uintptr_t)lm->l_addr));
  else
    snprintf(buf, len, "?");
}

int gr_report_leaks(jbuf_t *b, bool json) {
  leaks_t *l = calloc(1, sizeof *l);
  if (!l)
    return -ENOMEM;
  if (atomic_load_explicit(&gr_core_state, memory_order_acquire) == 1)
    gr_table_visit(leak_block, l);
  if (l->nomem) {
    free(l->g);
    free(l);
    return -ENOMEM;
  }
  if (l->n) /* qsort of a NULL array is undefined even for no elements */
    qsort(l->g, l->n, sizeof *l->g, by_bytes);
  char sym[256], hb[32];
  if (json) {
    jb_obj(b);
    jb_i64(b, "pid", getpid());
    jb_u64(b, "blocks", l->blocks);
    jb_u64(b, "bytes", l->bytes);
    jb_arr(b, "devices");
    for (int d = 0; d <= GR_MAX_DEV; d++)
      if (l->dev_blocks[d]) {
        jb_key(b, NULL);
        jb_obj(b);
        jb_i64(b, "device", d == GR_MAX_DEV ? -1 : d);
        jb_u64(b, "blocks", l->dev_blocks[d]);
        jb_u64(b, "bytes", l->dev_bytes[d]);
        jb_obj_end(b);
      }
    jb_arr_end(b);
    jb_arr(b, "groups");
    for (size_t i = 0; i < l->n; i++) {
      leak_group_t *g = &l->g[i];
      jb_key(b, NULL);
      jb_obj(b);
      jb_str(b, "library", gr_reg_library(g->pc).name);
      jb_hex(b, "caller", g->pc);
      symbolize(g->pc, sym, sizeof sym);
      jb_str(b, "symbol", sym[0] ? sym : NULL);
      jb_str(b, "kind", gr_kind_name((int)g->kind));
      jb_u64(b, "blocks", g->blocks);
      jb_u64(b, "bytes", g->bytes);
      jb_arr(b, "frames");
      uintptr_t frames[GR_STACK_MAX];
      int nf = gr_site_frames(g->site, frames, GR_STACK_MAX);
      for (int f = 0; f < nf; f++)
        jb_hex(b, NULL, frames[f]);
      jb_arr_end(b);
      jb_arr(b, "locations");
      for (int f = 0; f < nf; f++) {
        locate(frames[f], sym, sizeof sym);
        jb_str(b, NULL, sym);
      }
      jb_arr_end(b);
      jb_obj_end(b);
    }
    jb_arr_end(b);
    jb_obj_end(b);
  } else {
    gr_log_bytes(l->bytes, hb, sizeof hb);
    jb_printf(b, "=================================================================\n");
    jb_printf(b, "gpureclaim[%d]: %llu block%s (%s) %s never freed\n", (int)getpid(), (unsigned long long)l->blocks,
              gr_plural(l->blocks), hb, l->blocks == 1 ? "was" : "were");
    for (int d = 0; d <= GR_MAX_DEV; d++)
      if (l->dev_blocks[d]) {
        gr_log_bytes(l->dev_bytes[d], hb, sizeof hb);
        if (d == GR_MAX_DEV)
          jb_printf(b, "Host (pinned): %llu block%s, %s\n", (unsigned long long)l->dev_blocks[d],
                    gr_plural(l->dev_blocks[d]), hb);
        else
          jb_printf(b, "Device %d: %llu block%s, %s\n", d, (unsigned long long)l->dev_blocks[d],
                    gr_plural(l->dev_blocks[d]), hb);
      }
    for (size_t i = 0; i < l->n; i++) {
      leak_group_t *g = &l->g[i];
      gr_lib_t lib = gr_reg_library(g->pc);
      gr_log_bytes(g->bytes, hb, sizeof hb);
      symbolize(g->pc, sym, sizeof sym);
      jb_printf(b, "\n%llu block%s, %s (%s) allocated by %s at %#lx%s%s%s\n", (unsigned long long)g->blocks,
                gr_plural(g->blocks), hb, gr_kind_name((int)g->kind), lib.name, (unsigned long)g->pc,
                sym[0] ? " (" : "", sym, sym[0] ? ")" : "");
      uintptr_t frames[GR_STACK_MAX];
      int nf = gr_site_frames(g->site, frames, GR_STACK_MAX);
      for (int f = 0; f < nf; f++) {
        char at[300];
        symbolize(frames[f], sym, sizeof sym);
        locate(frames[f], at, sizeof at);
        jb_printf(b, "    #%d %#lx in %s (%s)\n", f, (unsigned long)frames[f], sym[0] ? sym : "??", at);
      }
    }
    if (!l->n)
      jb_printf(b, "(every block was freed)\n");
  }
  free(l->g);
  free(l);
  return jb_failed(b) ? -ENOMEM : 0;
}

/* ---- to descriptors and files ---- */

int gr_report_leaks_fd(int fd, bool json) {
  jbuf_t b;
  jb_init(&b);
  int rc = gr_report_leaks(&b, json);
  if (rc == 0)
    rc = jb_write_fd(&b, fd);
  jb_free(&b);
  return rc;
}

static int to_path(const char *path, int std_fd, int (*fill)(jbuf_t *, bool), bool arg) {
  if (!path || !*path)
    return -EINVAL;
  if (gr_core_disabled())
    return -ENOTSUP;
  jbuf_t b;
  jb_init(&b);
  int rc = fill(&b, arg);
  if (rc == 0)
    rc = strcmp(path, "-") == 0 ? jb_write_fd(&b, std_fd) : write_file(path, &b, 0644);
  jb_free(&b);
  if (rc < 0 && rc != -ENOMEM)
    rc = -EIO; /* the header's promise: a file that could not be written */
  return rc;
}

static int fill_snapshot(jbuf_t *b, bool unused) {
  (void)unused;
  int rc = gr_report_snapshot_json(b);
  jb_raw(b, "\n", 1);
  return rc;
}

GR_EXPORT int gpureclaim_snapshot(const char *path) { return to_path(path, STDOUT_FILENO, fill_snapshot, false); }

GR_EXPORT int gpureclaim_leak_report(const char *path, int json) {
  return to_path(path, STDERR_FILENO, gr_report_leaks, json != 0);
}

/* ---- one line for people ---- */

void gr_log_release(const gpureclaim_report_t *r) {
  if (gr_opt()->verbose < 1)
    return;
  static const char *const by[] = {"?", "the API", "the signal", "an out-of-memory retry", "the gpureclaim command",
                                   "a scope's end", "a peer"};
  char total[32], cached[32], orphaned[32], peer[48] = "";
  if (r->trigger == GPURECLAIM_TRIGGER_PEER)
    snprintf(peer, sizeof peer, " (pid %d, out of memory on the same GPU)", r->peer_pid);
  uint64_t sum = r->cached_bytes + r->orphaned_bytes + r->all_bytes;
  gr_info("released %s in %.2f ms (cached %s, orphaned %s in %llu block%s), asked by %s%s",
          gr_log_bytes(sum, total, sizeof total), (double)r->duration_ns / 1e6,
          gr_log_bytes(r->cached_bytes, cached, sizeof cached), gr_log_bytes(r->orphaned_bytes, orphaned, sizeof orphaned),
          (unsigned long long)r->orphaned_blocks, gr_plural(r->orphaned_blocks),
          r->trigger >= 0 && (size_t)r->trigger < GR_ARRAY_LEN(by) ? by[r->trigger] : by[0], peer);
}
