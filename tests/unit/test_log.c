/* gpureclaim's messages (log.c): one line each on stderr, "gpureclaim[pid]: ...", never longer than its
 * 1024-byte buffer and always ending in a newline; quiet below GPURECLAIM_VERBOSE except for warnings; errno
 * as the caller left it (a hook logs between a driver call and the caller's errno check). */
#include "common.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_pipe[2], g_saved_stderr = -1;

/* stderr into a pipe, for the test's duration. */
static void capture(void) {
  cr_assert_eq(pipe(g_pipe), 0);
  cr_assert_eq(fcntl(g_pipe[0], F_SETFL, O_NONBLOCK), 0);
  g_saved_stderr = dup(STDERR_FILENO);
  cr_assert_geq(dup2(g_pipe[1], STDERR_FILENO), 0);
}

/* What was written to stderr since capture() (or the last call), in a static buffer. */
static const char *captured(void) {
  static char buf[8192];
  ssize_t n = read(g_pipe[0], buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = '\0';
  return buf;
}

static void restore(void) {
  if (g_saved_stderr >= 0)
    dup2(g_saved_stderr, STDERR_FILENO);
}

TestSuite(log, .init = capture, .fini = restore);

Test(log, a_warning_is_one_line_with_the_pid) {
  gr_warn("block %d of %s", 7, "ctx");
  char want[64];
  snprintf(want, sizeof want, "gpureclaim[%d]: block 7 of ctx\n", (int)getpid());
  cr_assert_str_eq(captured(), want);
}

/* A message longer than the buffer is cut, still one line that starts with the prefix and ends in a newline,
 * within the 1024-byte buffer (1023 bytes: vsnprintf keeps a byte for its NUL). */
Test(log, a_long_message_is_cut_to_one_terminated_line) {
  static char big[3000];
  memset(big, 'x', sizeof big - 1);
  gr_warn("%s", big);
  const char *got = captured();
  cr_assert_eq(strlen(got), 1023, "%zu bytes", strlen(got));
  cr_assert_eq(strncmp(got, "gpureclaim[", 11), 0);
  cr_assert_eq(strchr(got, '\n'), got + 1022, "not one line ending in a newline");
  cr_assert_eq(strspn(strstr(got, "]: ") + 3, "x"), 1022 - (size_t)(strstr(got, "]: ") + 3 - got));
}

/* Even when the write itself fails (stderr here the pipe's read end: EBADF). */
Test(log, errno_is_kept) {
  errno = ENOSPC;
  gr_warn("x");
  cr_assert_eq(errno, ENOSPC);
  cr_assert_geq(dup2(g_pipe[0], STDERR_FILENO), 0);
  gr_warn("x");
  cr_assert_eq(errno, ENOSPC, "errno %d", errno);
  errno = 0;
  gr_info("y");
  cr_assert_eq(errno, 0);
}

/* Information and debugging lines are written only at their GPURECLAIM_VERBOSE level or above; warnings always.
 * (The options are read once, at the first call: each Criterion test is a process of its own.) */
Test(log, quiet_by_default) {
  unsetenv("GPURECLAIM_VERBOSE");
  gr_info("info");
  gr_debug("debug");
  cr_assert_str_eq(captured(), "");
  gr_warn("warn");
  cr_assert_not_null(strstr(captured(), "]: warn\n"));
}

Test(log, verbose_1_adds_information_not_debugging) {
  setenv("GPURECLAIM_VERBOSE", "1", 1);
  gr_info("info");
  gr_debug("debug");
  const char *got = captured();
  cr_assert_not_null(strstr(got, "]: info\n"), "%s", got);
  cr_assert_null(strstr(got, "debug"), "%s", got);
}

Test(log, verbose_2_adds_debugging) {
  setenv("GPURECLAIM_VERBOSE", "2", 1);
  gr_debug("debug");
  cr_assert_not_null(strstr(captured(), "]: debug\n"));
}
