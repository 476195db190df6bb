/*
 * sim_machine.c -- the simulated machine: the GPUs that several processes share (part of libcuda.so.1).
 *
 * A real GPU's memory is one pool for every process on it: what one process holds, another cannot allocate,
 * and the driver gives a process's memory back when the process ends, however it ends. The simulator does the
 * same through one small file per GPU, in the machine's directory (SIMCUDA_MACHINE), named after the GPU's UUID:
 *
 *   header: magic, layout version, UUID, capacity, bytes used (the sum of the slots), a process-shared robust
 *           mutex;
 *   slots:  one per process using the GPU: pid, start time (field 22 of /proc/PID/stat), bytes it holds.
 *
 * A process claims a slot when it initialises (cuInit). Then it changes only its own slot and the sum, with
 * atomics and no lock (the hot path: one compare-and-swap on the sum and a plain store to the slot per
 * allocation, a store and one atomic subtraction per free): admission is a compare-and-swap on the sum, so it is exact: an allocation fails with
 * CUDA_ERROR_OUT_OF_MEMORY exactly when the bytes of every live process plus the request exceed the capacity.
 * A process that ends normally clears its slot (a destructor); one that dies (kill -9) leaves it, and whoever
 * next finds the GPU full, asks for its free memory or needs a slot reclaims it, under the mutex: a slot is dead
 * when its pid is gone, is a zombie, or is a process with another start time (the pid was reused). Every update
 * is ordered so that a process killed half-way leaves the sum too high, never too low (an allocation takes the
 * sum before its slot, a free gives its slot back before the sum, a reclaim empties the slot before the sum):
 * the GPU may look fuller than it is, never emptier, and the first process to find itself alone on the GPU
 * recomputes the sum from its own slot. The mutex is robust: a process that dies holding it leaves it to the
 * next locker (EOWNERDEAD), which goes on.
 *
 * The file is created under a temporary name (O_EXCL), initialised, and published with link(), which fails if
 * another process published first: nobody ever maps a half-initialised file. Files are 0600 in a 0700 directory
 * owned by the user; anything else is refused.
 *
 * Everything here is called with the simulator's lock held (so the process-local fields need no atomics of
 * their own), except the exit-time destructor.
 */
#define _GNU_SOURCE
#include "sim_internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIMM_MAGIC 0x53494d4355444131ULL /* "SIMCUDA1" */
#define SIMM_VERSION 1u
#define SIMM_SLOTS 512

typedef struct simm_slot {
  _Atomic int32_t pid; /* 0: free */
  int32_t pad;
  _Atomic uint64_t start; /* the owner's start time, clock ticks after boot */
  _Atomic uint64_t used;  /* bytes the owner holds on this GPU */
  uint64_t spare;
} simm_slot_t;

typedef struct simm_file {
  uint64_t magic;
  uint32_t version, nslots;
  uint64_t file_size;
  unsigned char uuid[16];
  pthread_mutex_t mu; /* process-shared, robust */
  _Atomic uint64_t capacity;
  _Atomic uint64_t used; /* sum of the slots' used, changed under mu */
  _Atomic uint64_t reclaimed; /* dead processes' slots reclaimed so far (for tests) */
  char pad[64];
  simm_slot_t slot[SIMM_SLOTS];
} simm_file_t;

struct simgpu {
  simm_file_t *f;
  int slot;         /* this process's slot, when slot_ok */
  int slot_ok;      /* 0 in a forked child until it claims its own */
  pid_t owner;      /* the pid that claimed it */
  uint64_t mine;    /* bytes this process holds (what its slot says, once claimed) */
  uint64_t want;    /* the capacity this process asked for */
  char name[48];    /* GPU-xxxxxxxx-... */
};

static simgpu_t g_gpus[SIMM_MAX_GPUS];
static int g_ngpus;

/* ------------------------------------------------------------------------------------- environment */

/* "80G", "512M", "1073741824", "1.5G" -> bytes (binary units); 0 when unparsable. */
uint64_t simm_parse_bytes(const char *s) {
  if (!s || !*s) return 0;
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return 0;
  while (*end == ' ') end++;
  double mul = 1;
  switch (toupper((unsigned char)*end)) {
  case 'K': mul = 1024.0; end++; break;
  case 'M': mul = 1024.0 * 1024; end++; break;
  case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
  case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
  default: break;
  }
  if (toupper((unsigned char)*end) == 'I') end++;
  if (toupper((unsigned char)*end) == 'B') end++;
  if (*end) return 0;
  double b = v * mul;
  if (b >= 18446744073709551615.0) return UINT64_MAX;
  return (uint64_t)b;
}

/* Two devices unless told otherwise: code that assumes one device, or records everything on device 0, must not
 * pass by accident. */
#define SIM_DEFAULT_DEVICES 2

int simm_env_devices(void) {
  const char *s = getenv("SIMCUDA_DEVICES");
  if (!s || !*s) return SIM_DEFAULT_DEVICES;
  char *end;
  long n = strtol(s, &end, 10);
  if (*end || n < 0) {
    fprintf(stderr, "simcuda: ignoring SIMCUDA_DEVICES=%s (want 0..%d)\n", s, SIMM_MAX_GPUS);
    return SIM_DEFAULT_DEVICES;
  }
  if (n > SIMM_MAX_GPUS) {
    fprintf(stderr, "simcuda: SIMCUDA_DEVICES=%s capped at %d\n", s, SIMM_MAX_GPUS);
    return SIMM_MAX_GPUS;
  }
  return (int)n;
}

uint64_t simm_env_capacity(void) {
  const char *s = getenv("SIMCUDA_DEVICE_MEM");
  uint64_t def = 80ULL << 30;
  if (!s || !*s) return def;
  uint64_t v = simm_parse_bytes(s);
  if (!v) {
    fprintf(stderr, "simcuda: ignoring SIMCUDA_DEVICE_MEM=%s\n", s);
    return def;
  }
  return v;
}

/* ------------------------------------------------------------------------------------- identity */

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void simm_uuid(uint64_t machine_dev, uint64_t machine_ino, int phys, unsigned char out[16]) {
  uint64_t a = mix64(machine_dev ^ mix64(machine_ino) ^ mix64(0x51cc0da0ULL + (uint64_t)phys));
  uint64_t b = mix64(a ^ machine_ino);
  for (int i = 0; i < 8; i++) {
    out[i] = (unsigned char)(a >> (8 * i));
    out[8 + i] = (unsigned char)(b >> (8 * i));
  }
  out[6] = (unsigned char)((out[6] & 0x0f) | 0x40); /* version 4 */
  out[8] = (unsigned char)((out[8] & 0x3f) | 0x80); /* RFC 4122 variant */
}

void simm_uuid_string(const unsigned char u[16], char *buf, size_t len) {
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
           u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* State (field 3) and start time (field 22) of /proc/PID/stat; -1 when there is no such process. */
static int proc_stat(pid_t pid, char *state, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!p || p[1] != ' ') return -1;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (!p) return -1;
    p++;
  }
  *start = strtoull(p, NULL, 10);
  return 0;
}

static uint64_t self_start(void) {
  char st;
  uint64_t start = 0;
  if (proc_stat(getpid(), &st, &start) != 0) return 0;
  return start;
}

/* Is the process that claimed slot s still the one running under its pid? */
static int slot_alive(const simm_slot_t *s) {
  pid_t pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char st;
  uint64_t start;
  if (proc_stat(pid, &st, &start) != 0) return access("/proc/self/stat", F_OK) != 0; /* no /proc: trust kill */
  if (st == 'Z' || st == 'X') return 0; /* ended, not yet reaped: its memory is already back */
  return start == atomic_load_explicit(&s->start, memory_order_relaxed);
}

/* ------------------------------------------------------------------------------------- the file */

/* The sum from the slots; only when no other process can be changing them. */
static void repair_locked(simm_file_t *f) {
  uint64_t sum = 0;
  for (int i = 0; i < SIMM_SLOTS; i++)
    if (atomic_load_explicit(&f->slot[i].pid, memory_order_relaxed) != 0)
      sum += atomic_load_explicit(&f->slot[i].used, memory_order_relaxed);
  atomic_store_explicit(&f->used, sum, memory_order_relaxed);
}

static int lock_file(simm_file_t *f) {
  int rc = pthread_mutex_lock(&f->mu);
  if (rc == EOWNERDEAD) { /* its owner died inside: what it left is at worst a sum too high (see above) */
    pthread_mutex_consistent(&f->mu);
    rc = 0;
  }
  return rc;
}

static void unlock_file(simm_file_t *f) { pthread_mutex_unlock(&f->mu); }

/* Empties a slot whose owner no longer changes it (dead, or this process at exit): the slot first, then the sum. */
static void free_slot_locked(simm_file_t *f, int i) {
  simm_slot_t *s = &f->slot[i];
  uint64_t u = atomic_exchange_explicit(&s->used, 0, memory_order_acq_rel);
  atomic_fetch_sub_explicit(&f->used, u, memory_order_acq_rel);
  atomic_store_explicit(&s->start, 0, memory_order_relaxed);
  atomic_store_explicit(&s->pid, 0, memory_order_release);
}

/* Reclaims the slots of dead processes (every slot but `keep`); returns how many live ones remain besides it. Alone
 * on the GPU (nobody else can be half-way through an update), it sets the sum to what `keep` holds: whatever a
 * process killed half-way left too high is gone. */
static int sweep_locked(simm_file_t *f, int keep) {
  int live = 0;
  for (int i = 0; i < SIMM_SLOTS; i++) {
    if (i == keep || atomic_load_explicit(&f->slot[i].pid, memory_order_relaxed) == 0) continue;
    if (slot_alive(&f->slot[i])) {
      live++;
    } else {
      free_slot_locked(f, i);
      atomic_fetch_add_explicit(&f->reclaimed, 1, memory_order_relaxed);
    }
  }
  if (live == 0) repair_locked(f);
  return live;
}

static int init_file(simm_file_t *f, const unsigned char uuid[16], uint64_t capacity) {
  memset(f, 0, sizeof *f);
  pthread_mutexattr_t a;
  if (pthread_mutexattr_init(&a) != 0) return -1;
  int rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(&f->mu, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0) return -1;
  memcpy(f->uuid, uuid, 16);
  f->nslots = SIMM_SLOTS;
  f->file_size = sizeof *f;
  atomic_store_explicit(&f->capacity, capacity, memory_order_relaxed);
  f->version = SIMM_VERSION;
  f->magic = SIMM_MAGIC;
  return 0;
}

static int file_ok(const simm_file_t *f, const unsigned char uuid[16]) {
  return f->magic == SIMM_MAGIC && f->version == SIMM_VERSION && f->nslots == SIMM_SLOTS &&
         f->file_size == sizeof *f && memcmp(f->uuid, uuid, 16) == 0;
}

/* Opens and maps an existing file; NULL with errno (ENOENT: none yet; EPROTO: not ours or another layout). */
static simm_file_t *map_existing(int dirfd, const char *name, const unsigned char uuid[16]) {
  int fd = openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    close(fd);
    errno = EPERM;
    return NULL;
  }
  if ((uint64_t)st.st_size != sizeof(simm_file_t)) {
    close(fd);
    errno = EPROTO;
    return NULL;
  }
  void *p = mmap(NULL, sizeof(simm_file_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return NULL;
  if (!file_ok(p, uuid)) {
    munmap(p, sizeof(simm_file_t));
    errno = EPROTO;
    return NULL;
  }
  return p;
}

/* Creates the file under a private name and publishes it; 0, or -1 with errno (EEXIST: someone else won). */
static int create_file(int dirfd, const char *name, const unsigned char uuid[16], uint64_t capacity) {
  char tmp[96];
  snprintf(tmp, sizeof tmp, ".%s.%d.tmp", name, (int)getpid());
  unlinkat(dirfd, tmp, 0); /* left by an earlier process with this pid that died here */
  int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  int rc = -1;
  void *p = MAP_FAILED;
  if (fchmod(fd, 0600) == 0 && ftruncate(fd, sizeof(simm_file_t)) == 0)
    p = mmap(NULL, sizeof(simm_file_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    if (init_file(p, uuid, capacity) == 0) rc = linkat(dirfd, tmp, dirfd, name, 0);
    int e = errno;
    munmap(p, sizeof(simm_file_t));
    errno = e;
  }
  int e = errno;
  close(fd);
  unlinkat(dirfd, tmp, 0);
  errno = e;
  return rc;
}

static simm_file_t *open_file(int dirfd, const char *name, const unsigned char uuid[16], uint64_t capacity) {
  for (int tries = 0; tries < 100; tries++) {
    simm_file_t *f = map_existing(dirfd, name, uuid);
    if (f) return f;
    if (errno == EPROTO) {
      /* Another layout (an older simulator) or a truncated file: replace it. Whoever still maps the old one keeps
       * its own accounting, as a process of another machine would. */
      fprintf(stderr, "simcuda: replacing %s (not a GPU file of this simulator)\n", name);
      unlinkat(dirfd, name, 0);
      continue;
    }
    if (errno != ENOENT) return NULL;
    if (create_file(dirfd, name, uuid, capacity) != 0 && errno != EEXIST) return NULL;
  }
  errno = EAGAIN;
  return NULL;
}

/* Claims a free (or dead) slot for this process with what it already holds. Caller holds the file's lock. */
static int claim_locked(simgpu_t *g) {
  simm_file_t *f = g->f;
  pid_t me = getpid();
  /* A slot under this pid is this process's before it called exec: that program is gone, and so is its memory. */
  for (int i = 0; i < SIMM_SLOTS; i++)
    if (atomic_load_explicit(&f->slot[i].pid, memory_order_relaxed) == me) {
      free_slot_locked(f, i);
      atomic_fetch_add_explicit(&f->reclaimed, 1, memory_order_relaxed);
    }
  int free_i = -1;
  for (int pass = 0; pass < 2 && free_i < 0; pass++) {
    if (pass) sweep_locked(f, -1);
    for (int i = 0; i < SIMM_SLOTS; i++)
      if (atomic_load_explicit(&f->slot[i].pid, memory_order_relaxed) == 0) {
        free_i = i;
        break;
      }
  }
  if (free_i < 0) return -1;
  simm_slot_t *s = &f->slot[free_i];
  atomic_store_explicit(&s->start, self_start(), memory_order_relaxed);
  atomic_store_explicit(&s->used, g->mine, memory_order_relaxed);
  atomic_store_explicit(&s->pid, me, memory_order_release);
  atomic_fetch_add_explicit(&f->used, g->mine, memory_order_relaxed);
  g->slot = free_i;
  g->owner = me;
  g->slot_ok = 1;
  return 0;
}

/* A forked child is a new process for the driver: it takes a slot of its own the first time it uses the GPU. */
static int ensure_slot(simgpu_t *g) {
  if (__builtin_expect(g->slot_ok, 1)) return 0;
  if (lock_file(g->f) != 0) return -1;
  int rc = claim_locked(g);
  unlock_file(g->f);
  return rc;
}

/* ------------------------------------------------------------------------------------- interface */

int simm_open_machine(uint64_t *dev, uint64_t *ino, char *err, size_t errlen) {
  char path[4096];
  const char *m = getenv("SIMCUDA_MACHINE");
  if (m && *m) {
    snprintf(path, sizeof path, "%s", m);
  } else {
    const char *x = getenv("XDG_RUNTIME_DIR");
    struct stat xs;
    if (x && *x == '/' && stat(x, &xs) == 0 && S_ISDIR(xs.st_mode) && xs.st_uid == geteuid())
      snprintf(path, sizeof path, "%s/simcuda", x);
    else if (stat("/dev/shm", &xs) == 0 && S_ISDIR(xs.st_mode))
      snprintf(path, sizeof path, "/dev/shm/simcuda-%u", (unsigned)geteuid());
    else
      snprintf(path, sizeof path, "/tmp/simcuda-%u", (unsigned)geteuid());
  }
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "cannot create the machine directory %s: %s", path, strerror(errno));
    return -1;
  }
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, errlen, "cannot open the machine directory %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    snprintf(err, errlen, "refusing the machine directory %s: owner %u mode %03o (want owner %u, mode 0700)", path,
             (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
    close(fd);
    return -1;
  }
  *dev = (uint64_t)st.st_dev;
  *ino = (uint64_t)st.st_ino;
  return fd;
}

simgpu_t *simm_attach(int dirfd, const unsigned char uuid[16], uint64_t capacity, char *err, size_t errlen) {
  if (g_ngpus == SIMM_MAX_GPUS) {
    snprintf(err, errlen, "too many GPUs attached");
    return NULL;
  }
  simgpu_t *g = &g_gpus[g_ngpus];
  memset(g, 0, sizeof *g);
  simm_uuid_string(uuid, g->name, sizeof g->name);
  g->want = capacity;
  g->f = open_file(dirfd, g->name, uuid, capacity);
  if (!g->f) {
    snprintf(err, errlen, "cannot open %s in the machine directory: %s", g->name, strerror(errno));
    return NULL;
  }
  if (lock_file(g->f) != 0) {
    snprintf(err, errlen, "cannot lock %s", g->name);
    munmap(g->f, sizeof(simm_file_t));
    return NULL;
  }
  int others = sweep_locked(g->f, -1);
  uint64_t cap = atomic_load_explicit(&g->f->capacity, memory_order_relaxed);
  if (others == 0) {
    /* Nobody else uses the GPU: this process sets its capacity, whatever an earlier one had. */
    atomic_store_explicit(&g->f->capacity, capacity, memory_order_relaxed);
  } else if (cap != capacity) {
    fprintf(stderr,
            "simcuda: %s has %llu bytes, as the first of the processes using it set; this process's setting (%llu) "
            "is ignored\n",
            g->name, (unsigned long long)cap, (unsigned long long)capacity);
  }
  int rc = claim_locked(g);
  unlock_file(g->f);
  if (rc != 0) {
    snprintf(err, errlen, "%s: every one of its %d process slots is taken", g->name, SIMM_SLOTS);
    munmap(g->f, sizeof(simm_file_t));
    return NULL;
  }
  g_ngpus++;
  return g;
}

/* A slot changes only by its owner's hand while the owner lives (a reclaim or the owner's exit empties it, when the
 * owner makes no more changes): a load and a store, no locked instruction. */
static inline void slot_add(simm_slot_t *s, uint64_t n) {
  atomic_store_explicit(&s->used, atomic_load_explicit(&s->used, memory_order_relaxed) + n, memory_order_release);
}

/* The sum first (exact admission by compare-and-swap), then the slot. */
static int try_take(simm_file_t *f, uint64_t n) {
  uint64_t cap = atomic_load_explicit(&f->capacity, memory_order_relaxed);
  uint64_t u = atomic_load_explicit(&f->used, memory_order_relaxed);
  do {
    if (n > cap || u > cap - n) return -1;
  } while (!atomic_compare_exchange_weak_explicit(&f->used, &u, u + n, memory_order_acq_rel, memory_order_relaxed));
  return 0;
}

int simm_take(simgpu_t *g, uint64_t n) {
  if (ensure_slot(g) != 0) return -1;
  simm_file_t *f = g->f;
  if (try_take(f, n) != 0) {
    /* Full: first give dead processes' memory back, then look again. */
    if (lock_file(f) != 0) return -1;
    sweep_locked(f, g->slot);
    unlock_file(f);
    if (try_take(f, n) != 0) return -1;
  }
  slot_add(&f->slot[g->slot], n);
  g->mine += n;
  return 0;
}

/* The slot first, then the sum. */
void simm_give(simgpu_t *g, uint64_t n) {
  if (n > g->mine) n = g->mine; /* never below what this process took itself (a forked child's inheritance) */
  if (n == 0 || ensure_slot(g) != 0) return;
  simm_file_t *f = g->f;
  slot_add(&f->slot[g->slot], -n);
  atomic_fetch_sub_explicit(&f->used, n, memory_order_acq_rel);
  g->mine -= n;
}

int simm_would_exceed(const simgpu_t *g, uint64_t n) {
  uint64_t cap = atomic_load_explicit(&g->f->capacity, memory_order_relaxed);
  uint64_t u = atomic_load_explicit(&g->f->used, memory_order_relaxed);
  return n > cap || u > cap - n;
}

uint64_t simm_capacity(const simgpu_t *g) { return atomic_load_explicit(&g->f->capacity, memory_order_relaxed); }

void simm_set_capacity(simgpu_t *g, uint64_t bytes) { atomic_store_explicit(&g->f->capacity, bytes, memory_order_relaxed); }

void simm_info(simgpu_t *g, simm_info_t *out) {
  memset(out, 0, sizeof *out);
  if (ensure_slot(g) != 0 || lock_file(g->f) != 0) {
    out->capacity = simm_capacity(g);
    out->used = atomic_load_explicit(&g->f->used, memory_order_relaxed);
    out->mine = g->mine;
    return;
  }
  simm_file_t *f = g->f;
  out->processes = 1 + sweep_locked(f, g->slot);
  out->capacity = atomic_load_explicit(&f->capacity, memory_order_relaxed);
  out->used = atomic_load_explicit(&f->used, memory_order_relaxed);
  out->reclaimed = atomic_load_explicit(&f->reclaimed, memory_order_relaxed);
  out->mine = g->mine;
  unlock_file(f);
}

static int parse_uuid(const char *s, unsigned char out[16]) {
  static const int dash[] = {8, 13, 18, 23};
  if (strncmp(s, "GPU-", 4) != 0 || strlen(s) != 40) return -1;
  s += 4;
  for (int i = 0, k = 0, n = 0; i < 36; i++) {
    if (k < 4 && i == dash[k]) {
      if (s[i] != '-') return -1;
      k++;
      continue;
    }
    int c = s[i], v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return -1;
    if (n & 1) out[n / 2] = (unsigned char)(out[n / 2] | v);
    else out[n / 2] = (unsigned char)(v << 4);
    n++;
  }
  return 0;
}

int simm_peek(const char *uuid, uint64_t *capacity, uint64_t *used) {
  unsigned char u[16];
  if (!uuid || parse_uuid(uuid, u) != 0) {
    errno = EINVAL;
    return -1;
  }
  uint64_t dev, ino;
  char err[256];
  int dirfd = simm_open_machine(&dev, &ino, err, sizeof err);
  if (dirfd < 0) return -1;
  simm_file_t *f = map_existing(dirfd, uuid, u);
  int e = errno;
  close(dirfd);
  if (!f) {
    errno = e;
    return -1;
  }
  if (lock_file(f) == 0) {
    sweep_locked(f, -1);
    unlock_file(f);
  }
  *capacity = atomic_load_explicit(&f->capacity, memory_order_relaxed);
  *used = atomic_load_explicit(&f->used, memory_order_relaxed);
  munmap(f, sizeof *f);
  return 0;
}

/* The child holds nothing on the GPUs: what it inherited of the simulator's state is the parent's memory (the
 * real driver does not even let a child use it). What it frees of that gives nothing back (simm_give never goes
 * below what the process took itself). */
void simm_atfork_child(void) {
  for (int i = 0; i < g_ngpus; i++) {
    g_gpus[i].slot_ok = 0;
    g_gpus[i].mine = 0;
  }
}

/* A process that ends normally gives its memory back at once, as closing the device does (called by the
 * simulator's destructor). The lock wait is bounded: a process stuck holding it must not hang the exit (the slot
 * is then reclaimed as dead). */
void simm_fini(void) {
  pid_t me = getpid();
  for (int i = 0; i < g_ngpus; i++) {
    simgpu_t *g = &g_gpus[i];
    if (!g->slot_ok || g->owner != me) continue;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 2;
    int rc = pthread_mutex_timedlock(&g->f->mu, &dl);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&g->f->mu);
      rc = 0;
    }
    if (rc != 0) continue;
    free_slot_locked(g->f, g->slot);
    g->slot_ok = 0;
    unlock_file(g->f);
  }
}
