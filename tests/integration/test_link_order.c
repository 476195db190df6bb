/* A program linked with -lcuda before -lgpureclaim calls libcuda's cuMemAlloc directly, so gpureclaim cannot
 * see its blocks: the library says so on stderr when the program starts, once, and otherwise stays silent. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  char out[4096];
  int status;
} run_t;

/* LD_PRELOAD of the given libraries, after the sanitizer runtime in sanitizer builds (it must come first). */
static const char *preload(const char *libs) {
  static char buf[8192];
  snprintf(buf, sizeof buf, "%s%s%s", SAN_PRELOAD, SAN_PRELOAD[0] ? ":" : "", libs);
  return buf;
}

/* Runs prog with stdout and stderr into one buffer. */
static run_t run(const char *prog, const char *disable, const char *preload) {
  run_t r = {.status = -1};
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    dup2(fd[1], 1);
    dup2(fd[1], 2);
    close(fd[0]);
    if (preload)
      setenv("LD_PRELOAD", preload, 1);
    else
      unsetenv("LD_PRELOAD");
    if (disable)
      setenv("GPURECLAIM_DISABLE", disable, 1);
    execl(prog, prog, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t k;
  while (n < sizeof r.out - 1 && (k = read(fd[0], r.out + n, sizeof r.out - 1 - n)) > 0)
    n += (size_t)k;
  r.out[n] = 0;
  close(fd[0]);
  waitpid(pid, &r.status, 0);
  return r;
}

static size_t count(const char *hay, const char *needle) {
  size_t c = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
    c++;
  return c;
}

#define WARNING "comes before libgpureclaim in this program's link order"

Test(link_order, wrong_order_is_reported_once) {
  run_t r = run(LINK_ORDER_WRONG, NULL, NULL);
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.out);
  cr_assert_eq(count(r.out, WARNING), 1, "one warning expected:\n%s", r.out);
  cr_assert(strstr(r.out, "libcuda.so.1 " WARNING), "the warning names the library that comes first:\n%s", r.out);
  cr_assert(strstr(r.out, "link -lgpureclaim before -lcuda"), "%s", r.out);
  /* What the warning says is true: the block went past gpureclaim. */
  cr_assert(strstr(r.out, "stats 0 tracked 0\n"), "%s", r.out);
}

Test(link_order, right_order_is_silent) {
  run_t r = run(LINK_ORDER_RIGHT, NULL, NULL);
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.out);
  cr_assert_str_eq(r.out, "stats 0 tracked 1\n");
}

Test(link_order, disabled_is_silent) {
  run_t r = run(LINK_ORDER_WRONG, "1", NULL);
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.out);
  cr_assert_eq(count(r.out, WARNING), 0, "GPURECLAIM_DISABLE=1 is a pure pass-through:\n%s", r.out);
}

Test(link_order, preloading_fixes_the_order) {
  run_t r = run(LINK_ORDER_WRONG, NULL, preload(GR_LIB));
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.out);
  cr_assert_str_eq(r.out, "stats 0 tracked 1\n");
}

/* Another interposer ahead of gpureclaim may pass the calls on: the warning says that much, no more. Its
 * stand-in fails every driver call, so the program itself exits 2. */
Test(link_order, another_interposer_first) {
  run_t r = run(LINK_ORDER_RIGHT, NULL, preload(SIM_PRELOAD ":" GR_LIB));
  cr_assert_eq(count(r.out, "libsimpreload.so defines the CUDA driver's entry points and comes before libgpureclaim"),
               1, "%s", r.out);
  cr_assert(strstr(r.out, "passes them on with dlsym(RTLD_NEXT)"), "%s", r.out);
  cr_assert_eq(count(r.out, WARNING), 0, "%s", r.out);
}

/* Two copies of gpureclaim preloaded (another build preloaded by hand, say): the first serves the process, the
 * second passes every call through and says so. Before, each copy's dlsym resolved the driver through the
 * other's, and the first cuInit recursed until the stack overflowed. */
Test(link_order, a_second_copy_passes_through) {
  char dir[] = "/tmp/gr_link_order_XXXXXX", copy[256], cmd[1024], both[600];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(copy, sizeof copy, "%s/libgpureclaim.so.0", dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", GR_LIB, copy);
  cr_assert_eq(system(cmd), 0);
  snprintf(both, sizeof both, "%s:%s", GR_LIB, copy);
  run_t r = run(LINK_ORDER_RIGHT, NULL, preload(both));
  unlink(copy);
  rmdir(dir);
  cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.out);
  cr_assert_eq(count(r.out, "two copies of libgpureclaim in this process"), 1, "%s", r.out);
  cr_assert(strstr(r.out, "stats 0 tracked 1\n"), "the first copy tracks:\n%s", r.out);
  cr_assert_eq(count(r.out, WARNING), 0, "%s", r.out);
  cr_assert_eq(count(r.out, "defines the CUDA driver's entry points"), 0, "%s", r.out);
}
