/* test_sim_machine.c -- processes on one simulated machine share its GPUs' memory, as on a real machine.
 *
 * This process is one program on the machine (its own, sim_test_machine.c); sim_holder processes, driven over
 * pipes, are the others. */
#define _GNU_SOURCE
#include "sim_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct holder {
  pid_t pid;
  FILE *in, *out;
} holder_t;

/* Starts a sim_holder with extra environment entries ("NAME=value", NULL-terminated; "NAME=" alone unsets). */
static holder_t spawn(const char *const *env) {
  int to[2], from[2];
  cr_assert_eq(pipe(to), 0);
  cr_assert_eq(pipe(from), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[0]);
    close(to[1]);
    close(from[0]);
    close(from[1]);
    for (int i = 0; env && env[i]; i++) {
      char name[128];
      const char *eq = strchr(env[i], '=');
      snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
      if (eq[1]) setenv(name, eq + 1, 1);
      else unsetenv(name);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a holder left behind by a failed test ends with it */
    alarm(120);
    execl(SIM_HOLDER, "sim_holder", (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  holder_t h = {pid, fdopen(to[1], "w"), fdopen(from[0], "r")};
  cr_assert(h.in && h.out);
  setvbuf(h.in, NULL, _IOLBF, 0);
  return h;
}

/* Sends one command; returns its answer line (static buffer, no newline). */
static const char *cmd(holder_t *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *cmd(holder_t *h, const char *fmt, ...) {
  static char line[256];
  va_list ap;
  va_start(ap, fmt);
  vfprintf(h->in, fmt, ap);
  va_end(ap);
  fputc('\n', h->in);
  fflush(h->in);
  cr_assert(fgets(line, sizeof line, h->out) != NULL, "holder %d gave no answer", (int)h->pid);
  line[strcspn(line, "\n")] = '\0';
  return line;
}

#define HOK(h, ...) cr_assert_str_eq(cmd((h), __VA_ARGS__), "ok", "holder: %s", #__VA_ARGS__)

/* Ends a holder normally (exit) and reaps it. */
static void finish(holder_t *h) {
  fprintf(h->in, "exit\n");
  fclose(h->in);
  int st;
  cr_assert_eq(waitpid(h->pid, &st, 0), h->pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "holder status %#x", st);
  fclose(h->out);
}

/* cuMemGetInfo in dev's primary context; the current context is left as it was (device 0's at first). */
static uint64_t free_of(int dev) {
  CUcontext was = NULL;
  sim_primary(0);
  OK(cuCtxGetCurrent(&was));
  sim_primary(dev);
  size_t fr = 0, tot = 0;
  OK(cuMemGetInfo(&fr, &tot));
  OK(cuCtxSetCurrent(was));
  return fr;
}

static void uuid_text(int dev, char *buf, size_t len) {
  CUuuid u;
  OK(cuDeviceGetUuid_v2(&u, dev));
  unsigned char *x = (unsigned char *)u.bytes;
  snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", x[0], x[1], x[2],
           x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]);
}

#define CAP (1024 * MiB)

static void small_gpus(void) { setenv("SIMCUDA_DEVICE_MEM", "1G", 1); }

/* Plain allocations: another process's bytes lower this one's free memory and make an allocation fail exactly
 * where the sum passes the capacity; freeing them makes it succeed. */
Test(sim_machine, plain_allocations_are_shared, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "alloc 0 %llu", 600 * MiB);
  cr_assert_eq(free_of(0), CAP - 600 * MiB, "the other process's 600 MiB are not free here");
  cr_assert_eq(free_of(1), CAP, "nor on the other GPU");
  cr_assert_eq(sim_stats(0, NULL).gpu_processes, 2);
  CUdeviceptr p = 0, q = 0;
  ERR(cuMemAlloc(&p, CAP - 600 * MiB + 512), CUDA_ERROR_OUT_OF_MEMORY);
  cr_assert_eq(p, 0);
  OK(cuMemAlloc(&p, CAP - 600 * MiB)); /* exactly full */
  cr_assert_eq(free_of(0), 0);
  cr_assert_str_eq(cmd(&b, "alloc 0 512"), "err 2", "the device is full for the other one too");
  HOK(&b, "free");
  OK(cuMemAlloc(&q, 600 * MiB)); /* its memory is back */
  OK(cuMemFree(p));
  OK(cuMemFree(q));
  cr_assert_eq(free_of(0), CAP);
  finish(&b);
}

/* A stream-ordered pool's cache holds device memory: it counts for the others until the pool is trimmed. */
Test(sim_machine, a_pool_cache_is_held_until_trimmed, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "pool 0 %llu", 768 * MiB); /* allocated, freed, kept in the pool's cache */
  cr_assert_eq(free_of(0), CAP - 768 * MiB);
  CUdeviceptr p = 0;
  ERR(cuMemAlloc(&p, 512 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  ERR(cuMemAllocAsync(&p, 512 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
  HOK(&b, "trim 0");
  cr_assert_eq(free_of(0), CAP);
  OK(cuMemAlloc(&p, 512 * MiB));
  OK(cuMemFree(p));
  finish(&b);
}

/* VMM physical memory (cuMemCreate) counts as well, until released. */
Test(sim_machine, vmm_memory_is_shared, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "vmm 1 %llu", 1000 * MiB);
  cr_assert_eq(free_of(1), CAP - 1000 * MiB);
  cr_assert_eq(free_of(0), CAP);
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1}};
  CUmemGenericAllocationHandle h = 0;
  ERR(cuMemCreate(&h, 26 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuMemCreate(&h, 24 * MiB, &prop, 0));
  OK(cuMemRelease(h));
  HOK(&b, "unvmm");
  OK(cuMemCreate(&h, CAP, &prop, 0));
  OK(cuMemRelease(h));
  finish(&b);
}

/* The driver gives a process's memory back however it ends: kill -9 included (reclaimed by whoever looks next),
 * a normal exit at once (its slot is cleared, nothing left to reclaim). */
Test(sim_machine, a_killed_process_gives_its_memory_back, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "alloc 0 %llu", 900 * MiB);
  HOK(&b, "pool 1 %llu", 900 * MiB);
  cr_assert_eq(free_of(0), CAP - 900 * MiB);
  uint64_t before = sim_stats(0, NULL).gpu_reclaimed;
  cr_assert_eq(kill(b.pid, SIGKILL), 0);
  int st;
  cr_assert_eq(waitpid(b.pid, &st, 0), b.pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  CUdeviceptr p = 0;
  OK(cuMemAlloc(&p, CAP)); /* the dead process's slot is reclaimed on the way */
  cr_assert_eq(sim_stats(0, NULL).gpu_reclaimed, before + 1);
  cr_assert_eq(free_of(1), CAP);
  cr_assert_eq(sim_stats(1, NULL).gpu_processes, 1);
  OK(cuMemFree(p));
  fclose(b.in);
  fclose(b.out);

  holder_t c = spawn(NULL);
  HOK(&c, "init");
  HOK(&c, "alloc 0 %llu", 900 * MiB);
  cr_assert_eq(free_of(0), CAP - 900 * MiB);
  uint64_t reclaimed = sim_stats(0, NULL).gpu_reclaimed;
  finish(&c); /* exit() with the memory still held */
  cr_assert_eq(free_of(0), CAP);
  cr_assert_eq(sim_stats(0, NULL).gpu_reclaimed, reclaimed, "a normal exit left nothing to reclaim");
}

/* exec replaces the program: once the new one initialises CUDA, the old one's memory is back. */
Test(sim_machine, a_program_replaced_by_exec_gives_its_memory_back, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "alloc 0 %llu", 600 * MiB);
  cr_assert_eq(free_of(0), CAP - 600 * MiB);
  HOK(&b, "exec"); /* answered by the new program: the same process */
  HOK(&b, "init");
  cr_assert_eq(free_of(0), CAP);
  cr_assert_eq(sim_stats(0, NULL).gpu_processes, 2);
  HOK(&b, "alloc 0 %llu", CAP / 2);
  cr_assert_eq(free_of(0), CAP / 2);
  finish(&b);
  cr_assert_eq(free_of(0), CAP);
}

/* A pid reused by another process does not keep a dead process's memory: the slot records the start time. A
 * zombie (ended, not yet reaped) holds nothing either. */
Test(sim_machine, a_zombie_holds_nothing, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  HOK(&b, "alloc 0 %llu", 900 * MiB);
  cr_assert_eq(free_of(0), CAP - 900 * MiB);
  kill(b.pid, SIGKILL);
  /* not reaped yet: wait until it is a zombie */
  siginfo_t si;
  cr_assert_eq(waitid(P_PID, (id_t)b.pid, &si, WEXITED | WNOWAIT), 0);
  cr_assert_eq(free_of(0), CAP, "the zombie's memory is free");
  int st;
  waitpid(b.pid, &st, 0);
  fclose(b.in);
  fclose(b.out);
}

/* Two machines never share memory, nor UUIDs. */
Test(sim_machine, machines_do_not_interact, .init = small_gpus) {
  char other[4200];
  snprintf(other, sizeof other, "%s/other", getenv("SIMCUDA_MACHINE"));
  cr_assert_eq(mkdir(other, 0700), 0);
  char env[4300];
  snprintf(env, sizeof env, "SIMCUDA_MACHINE=%s", other);
  holder_t b = spawn((const char *const[]){env, NULL});
  HOK(&b, "init");
  HOK(&b, "alloc 0 %llu", 900 * MiB);
  cr_assert_eq(free_of(0), CAP);
  char u0[64], u1[64];
  uuid_text(0, u0, sizeof u0);
  uuid_text(1, u1, sizeof u1);
  const char *t = cmd(&b, "uuid 0");
  cr_assert(strncmp(t, "GPU-", 4) == 0, "%s", t);
  cr_assert_str_neq(t, u0);
  cr_assert_str_neq(t, u1);
  cr_assert_str_neq(cmd(&b, "uuid 1"), u1);
  /* and a process of this machine does share: */
  holder_t c = spawn(NULL);
  HOK(&c, "init");
  cr_assert_str_eq(cmd(&c, "uuid 0"), u0);
  cr_assert_str_eq(cmd(&c, "uuid 1"), u1);
  finish(&b);
  finish(&c);
}

/* CUDA_VISIBLE_DEVICES renumbers devices per process: ordinal 0 there is this process's device 1, and only the
 * UUID says so. */
Test(sim_machine, visible_devices_renumber_and_keep_the_uuid, .init = small_gpus) {
  char u0[64], u1[64];
  sim_primary(0);
  uuid_text(0, u0, sizeof u0);
  uuid_text(1, u1, sizeof u1);
  cr_assert_str_neq(u0, u1);
  holder_t b = spawn((const char *const[]){"CUDA_VISIBLE_DEVICES=1", NULL});
  HOK(&b, "init");
  cr_assert_str_eq(cmd(&b, "count"), "1");
  cr_assert_str_eq(cmd(&b, "uuid 0"), u1);
  HOK(&b, "alloc 0 %llu", 700 * MiB); /* its ordinal 0 */
  cr_assert_eq(free_of(1), CAP - 700 * MiB, "it is this process's device 1");
  cr_assert_eq(free_of(0), CAP);
  char env[128];
  snprintf(env, sizeof env, "CUDA_VISIBLE_DEVICES=%.12s,%s", u0, u1); /* a prefix, then the whole UUID */
  holder_t c = spawn((const char *const[]){env, NULL});
  HOK(&c, "init");
  cr_assert_str_eq(cmd(&c, "count"), "2");
  cr_assert_str_eq(cmd(&c, "uuid 0"), u0);
  cr_assert_str_eq(cmd(&c, "uuid 1"), u1);
  char line[64];
  snprintf(line, sizeof line, "%llu %llu", CAP - 700 * MiB, CAP);
  cr_assert_str_eq(cmd(&c, "info 1"), line);
  holder_t d = spawn((const char *const[]){"CUDA_VISIBLE_DEVICES=1,0", NULL});
  HOK(&d, "init");
  cr_assert_str_eq(cmd(&d, "uuid 0"), u1);
  cr_assert_str_eq(cmd(&d, "uuid 1"), u0);
  finish(&b);
  finish(&c);
  finish(&d);
}

/* The list as nvidia documents it: it ends at the first entry that names no device. */
Test(sim_machine, visible_devices_list_ends_at_an_invalid_entry) {
  setenv("SIMCUDA_DEVICES", "3", 1);
  setenv("CUDA_VISIBLE_DEVICES", "2,7,0", 1);
  OK(cuInit(0));
  int n = 0;
  OK(cuDeviceGetCount(&n));
  cr_assert_eq(n, 1);
  cr_assert_eq(sim_stats(-1, NULL).capacity_bytes, 80 * GiB);
}

Test(sim_machine, visible_devices_empty_means_none) {
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  ERR(cuInit(0), CUDA_ERROR_NO_DEVICE);
}

Test(sim_machine, visible_devices_duplicate_and_unknown_uuid_end_the_list) {
  setenv("SIMCUDA_DEVICES", "3", 1);
  setenv("CUDA_VISIBLE_DEVICES", "1,2,1,0", 1);
  OK(cuInit(0));
  int n = 0;
  OK(cuDeviceGetCount(&n));
  cr_assert_eq(n, 2);
  holder_t b = spawn((const char *const[]){"CUDA_VISIBLE_DEVICES=0,GPU-zzzz,1", NULL});
  HOK(&b, "init");
  cr_assert_str_eq(cmd(&b, "count"), "1");
  finish(&b);
}

/* The capacity is the GPU's: the first of the processes using it sets it; a later one with another setting is
 * told, and gets the GPU as it is. Once nobody uses it, the next process sets it again. */
Test(sim_machine, the_first_process_sets_the_capacity, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  setenv("SIMCUDA_DEVICE_MEM", "2G", 1);
  cr_assert_eq(free_of(0), CAP, "the GPU has what the first process asked for");
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  size_t total = 0;
  OK(cuDeviceTotalMem(&total, dev));
  cr_assert_eq(total, CAP);
  finish(&b);
  holder_t c = spawn((const char *const[]){"SIMCUDA_DEVICE_MEM=512M", NULL});
  HOK(&c, "init"); /* this process still uses the GPU: its 1 GiB stays */
  char line[64];
  snprintf(line, sizeof line, "%llu %llu", CAP, CAP);
  cr_assert_str_eq(cmd(&c, "info 0"), line);
  finish(&c);
}

Test(sim_machine, an_idle_gpu_takes_the_next_process_setting, .init = small_gpus) {
  holder_t b = spawn(NULL);
  HOK(&b, "init");
  finish(&b);
  holder_t c = spawn((const char *const[]){"SIMCUDA_DEVICE_MEM=512M", NULL});
  HOK(&c, "init");
  char line[64];
  snprintf(line, sizeof line, "%llu %llu", 512 * MiB, 512 * MiB);
  cr_assert_str_eq(cmd(&c, "info 0"), line);
  /* and this process, asking for 1 GiB while that one uses the GPU, gets its 512 MiB */
  cr_assert_eq(free_of(0), 512 * MiB);
  CUdevice dev;
  size_t total = 0;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDeviceTotalMem(&total, dev));
  cr_assert_eq(total, 512 * MiB);
  finish(&c);
}

/* A forked child is a new process for the driver: what it allocates is its own, and it gives it back when it
 * ends, without taking the parent's with it. */
Test(sim_machine, a_forked_child_has_its_own_share, .init = small_gpus) {
  sim_primary(0);
  CUdeviceptr p = 0;
  OK(cuMemAlloc(&p, 300 * MiB));
  int ready[2], done[2];
  cr_assert_eq(pipe(ready), 0);
  cr_assert_eq(pipe(done), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    CUdeviceptr q = 0;
    char c = cuMemAlloc(&q, 500 * MiB) == CUDA_SUCCESS ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(3);
    /* _exit, not exit: this is a copy of Criterion's worker, whose exit handlers would speak to the runner as the
     * worker (the runner then waited for ever, now and then: a 300 s timeout under ASan). Its share goes back as a
     * gone process's, and not the parent's; a normal end's return is the holders' (finish). */
    _exit(0);
  }
  char c = 0;
  cr_assert_eq(read(ready[0], &c, 1), 1);
  cr_assert_eq(c, 'y');
  cr_assert_eq(free_of(0), CAP - 800 * MiB, "the parent's 300 MiB and the child's 500 MiB");
  cr_assert_eq(sim_stats(0, NULL).gpu_processes, 2);
  cr_assert_eq(write(done[1], &c, 1), 1);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  cr_assert_eq(free_of(0), CAP - 300 * MiB);
  OK(cuMemFree(p));
  cr_assert_eq(free_of(0), CAP);
}

/* A machine directory that others could write into is refused, as the run directory is. */
Test(sim_machine, a_shared_machine_directory_is_refused) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/open", getenv("SIMCUDA_MACHINE"));
  cr_assert_eq(mkdir(dir, 0700), 0);
  cr_assert_eq(chmod(dir, 0770), 0);
  setenv("SIMCUDA_MACHINE", dir, 1);
  ERR(cuInit(0), CUDA_ERROR_OPERATING_SYSTEM);
}

/* The GPU files are 0600, named after the UUIDs; nothing else is left in the directory. */
Test(sim_machine, gpu_files_are_private_and_named_after_the_uuid) {
  sim_primary(0);
  char u0[64], u1[64], path[4300];
  uuid_text(0, u0, sizeof u0);
  uuid_text(1, u1, sizeof u1);
  const char *m = getenv("SIMCUDA_MACHINE");
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", m, u0);
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  cr_assert_eq(st.st_mode & 0777, 0600);
  snprintf(path, sizeof path, "%s/%s", m, u1);
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  DIR *d = opendir(m);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
    else cr_assert(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."), "left behind: %s", e->d_name);
  closedir(d);
  cr_assert_eq(n, 2);
}

/* 16 processes start at once on a machine with no GPU file yet, and each takes 100 MiB of 1 GiB: exactly 10 fit,
 * whoever made the file, and every one agrees on what is left. */
Test(sim_machine, many_processes_start_at_once, .init = small_gpus) {
  enum { N = 16 };
  holder_t h[N];
  for (int i = 0; i < N; i++) h[i] = spawn(NULL);
  for (int i = 0; i < N; i++) fprintf(h[i].in, "init\nalloc 0 %llu\n", 100 * MiB); /* all at once */
  int ok = 0, oom = 0;
  for (int i = 0; i < N; i++) {
    char a[64], b[64];
    cr_assert(fgets(a, sizeof a, h[i].out) && fgets(b, sizeof b, h[i].out));
    cr_assert_str_eq(a, "ok\n", "holder %d: init: %s", i, a);
    ok += !strcmp(b, "ok\n");
    oom += !strcmp(b, "err 2\n");
  }
  cr_assert_eq(ok, 10);
  cr_assert_eq(oom, 6);
  cr_assert_eq(free_of(0), CAP - 1000 * MiB);
  cr_assert_eq(sim_stats(0, NULL).gpu_processes, N + 1);
  char line[64];
  snprintf(line, sizeof line, "%llu %llu", CAP - 1000 * MiB, CAP);
  for (int i = 0; i < N; i++) cr_assert_str_eq(cmd(&h[i], "info 0"), line);
  for (int i = 0; i < N; i++) finish(&h[i]);
  cr_assert_eq(free_of(0), CAP);
  cr_assert_eq(sim_stats(0, NULL).gpu_processes, 1);
}

/* With SIMCUDA_MACHINE unset, the machine is the user's own: $XDG_RUNTIME_DIR/simcuda, made 0700. */
Test(sim_machine, the_default_machine_is_private_to_the_user) {
  char xdg[4200], path[4400];
  snprintf(xdg, sizeof xdg, "%s/xdg", getenv("SIMCUDA_MACHINE"));
  cr_assert_eq(mkdir(xdg, 0700), 0);
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  unsetenv("SIMCUDA_MACHINE");
  sim_primary(0);
  char u0[64];
  uuid_text(0, u0, sizeof u0);
  struct stat st;
  snprintf(path, sizeof path, "%s/simcuda", xdg);
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0700);
  snprintf(path, sizeof path, "%s/simcuda/%s", xdg, u0);
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  cr_assert_eq(st.st_mode & 0777, 0600);
}
