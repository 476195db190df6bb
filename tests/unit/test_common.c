/* The non-text contracts of common.h that the library and the command share: gr_read_file reads a regular file
 * whole and refuses anything else without blocking (a FIFO planted in the run directory must not hang a
 * reader), the clocks, the run directory's privacy test, and byte counts for people. (UTF-8, JSON strings and
 * /proc/PID/stat are in test_text.c.) */
#include "common.h"
#include "../common/rng.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[PATH_MAX];
static char g_path[4][PATH_MAX + 64];

static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/gr_test_common_XXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}

static const char *at(int i, const char *name) {
  snprintf(g_path[i], sizeof g_path[i], "%s/%s", g_dir, name);
  return g_path[i];
}

static void remove_dir(void) {
  static const char *const names[] = {"f", "fifo", "link", "sub", "empty"};
  for (size_t i = 0; i < GR_ARRAY_LEN(names); i++)
    if (unlink(at(0, names[i])) != 0)
      rmdir(at(0, names[i]));
  rmdir(g_dir);
}

TestSuite(read_file, .init = make_dir, .fini = remove_dir);

static void put(const char *path, const char *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, data, n), (ssize_t)n);
  close(fd);
}

/* Sizes around the reader's first buffer (4096, one byte kept for the NUL) and its doublings, and a few
 * megabytes of random bytes: each comes back whole, NUL-terminated. */
Test(read_file, reads_a_regular_file_whole_at_every_size) {
  static const size_t sizes[] = {0, 1, 4094, 4095, 4096, 4097, 8191, 8192, 65537, 3 << 20};
  uint64_t s = gr_rng_stream(1);
  for (size_t k = 0; k < GR_ARRAY_LEN(sizes); k++) {
    size_t n = sizes[k];
    char *data = malloc(n + 1);
    cr_assert_not_null(data);
    for (size_t i = 0; i < n; i++)
      data[i] = (char)(1 + gr_rng_below(&s, 255)); /* no NUL: strlen must see the whole file */
    put(at(0, "f"), data, n);
    char *got = gr_read_file(at(0, "f"));
    cr_assert_not_null(got, "%zu bytes: %s", n, strerror(errno));
    cr_assert_eq(strlen(got), n, "%zu bytes read as %zu", n, strlen(got));
    cr_assert_eq(memcmp(got, data, n), 0, "%zu bytes differ", n);
    free(got);
    free(data);
  }
}

/* A FIFO without a writer would block an open(O_RDONLY) forever: refused at once with EINVAL. */
Test(read_file, refuses_a_fifo_without_blocking, .timeout = 10) {
  cr_assert_eq(mkfifo(at(0, "fifo"), 0600), 0);
  errno = 0;
  cr_assert_null(gr_read_file(at(0, "fifo")));
  cr_assert_eq(errno, EINVAL, "errno %d", errno);
}

/* gr_read_file_max: a file over the cap is refused before a byte is read (EFBIG), whatever its size (a sparse
 * 512 MiB one here: the peer asker's cap keeps a planted file from costing it seconds); at the cap, it is read. */
Test(read_file, max_refuses_a_file_over_the_cap_unread) {
  put(at(0, "f"), "0123456789", 10);
  char *got = gr_read_file_max(at(0, "f"), 10);
  cr_assert_not_null(got);
  cr_assert_str_eq(got, "0123456789");
  free(got);
  errno = 0;
  cr_assert_null(gr_read_file_max(at(0, "f"), 9));
  cr_assert_eq(errno, EFBIG, "errno %d", errno);
  cr_assert_eq(truncate(at(0, "f"), 512l << 20), 0);
  errno = 0;
  cr_assert_null(gr_read_file_max(at(0, "f"), 64 << 10));
  cr_assert_eq(errno, EFBIG, "errno %d", errno);
}

/* A link is not followed, even to a regular file of this user's (status files are never links). */
Test(read_file, refuses_a_symlink_even_to_a_regular_file) {
  put(at(0, "f"), "status", 6);
  cr_assert_eq(symlink(at(0, "f"), at(1, "link")), 0);
  errno = 0;
  cr_assert_null(gr_read_file(at(1, "link")));
  cr_assert_eq(errno, ELOOP, "errno %d", errno);
  char *got = gr_read_file(at(0, "f"));
  cr_assert_not_null(got);
  cr_assert_str_eq(got, "status");
  free(got);
}

Test(read_file, refuses_directories_devices_and_missing_files) {
  cr_assert_eq(mkdir(at(0, "sub"), 0700), 0);
  errno = 0;
  cr_assert_null(gr_read_file(at(0, "sub")));
  cr_assert_eq(errno, EINVAL);
  errno = 0;
  cr_assert_null(gr_read_file("/dev/null"));
  cr_assert_eq(errno, EINVAL);
  errno = 0;
  cr_assert_null(gr_read_file(at(0, "missing")));
  cr_assert_eq(errno, ENOENT);
}

/* A descriptor is not left open by any of these paths (the library reads peers' status files all day). */
Test(read_file, leaves_no_descriptor_open) {
  put(at(0, "f"), "x", 1);
  cr_assert_eq(mkfifo(at(1, "fifo"), 0600), 0);
  int before = dup(0);
  cr_assert_geq(before, 0);
  close(before);
  for (int i = 0; i < 100; i++) {
    free(gr_read_file(at(0, "f")));
    cr_assert_null(gr_read_file(at(1, "fifo")));
    cr_assert_null(gr_read_file("/dev/null"));
  }
  int after = dup(0);
  cr_assert_eq(after, before, "descriptors leaked: the lowest free one moved from %d to %d", before, after);
  close(after);
}

Test(clock, mono_ns_never_goes_back_and_tracks_clock_monotonic) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t ref = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  uint64_t prev = gr_mono_ns();
  cr_assert_geq(prev, ref);
  for (int i = 0; i < 100000; i++) {
    uint64_t now = gr_mono_ns();
    cr_assert_geq(now, prev, "went back from %llu to %llu", (unsigned long long)prev, (unsigned long long)now);
    prev = now;
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  cr_assert_leq(prev, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

Test(clock, wall_ms_is_clock_realtime_in_milliseconds) {
  struct timespec a, b;
  clock_gettime(CLOCK_REALTIME, &a);
  uint64_t ms = gr_wall_ms();
  clock_gettime(CLOCK_REALTIME, &b);
  cr_assert_geq(ms, (uint64_t)a.tv_sec * 1000 + (uint64_t)a.tv_nsec / 1000000);
  cr_assert_leq(ms, (uint64_t)b.tv_sec * 1000 + (uint64_t)b.tv_nsec / 1000000);
}

/* Whole milliseconds from now to d, rounded down (negative once d has passed): read after gr_ms_until, a
 * lower bound on what it may answer, whatever the scheduler did in between. */
static int64_t ms_left(const struct timespec *d) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t ns = (int64_t)(d->tv_sec - now.tv_sec) * 1000000000 + (d->tv_nsec - now.tv_nsec);
  return ns < 0 ? -1 : ns / 1000000;
}

/* Milliseconds to a deadline for poll(): 0 once passed, rounded up (never an early wake-up), at most a day. */
Test(clock, ms_until_rounds_up_and_is_bounded) {
  struct timespec now, d;
  clock_gettime(CLOCK_MONOTONIC, &now);
  d = now;
  d.tv_sec -= 1;
  cr_assert_eq(gr_ms_until(&d), 0);
  d = now;
  cr_assert_eq(gr_ms_until(&d), 0);
  d.tv_sec = now.tv_sec + 5;
  int ms = gr_ms_until(&d);
  cr_assert(ms >= ms_left(&d) && ms <= 5000, "ms %d", ms);
  d.tv_sec = now.tv_sec + 1000000;
  cr_assert_eq(gr_ms_until(&d), 86400000);
  /* A deadline a fraction of a millisecond away is 1, not 0: poll(0) would spin. */
  clock_gettime(CLOCK_MONOTONIC, &d);
  d.tv_nsec += 300000;
  if (d.tv_nsec >= 1000000000) {
    d.tv_sec++;
    d.tv_nsec -= 1000000000;
  }
  ms = gr_ms_until(&d);
  int64_t left = ms_left(&d);
  cr_assert(ms <= 1, "ms %d", ms);
  cr_assert(left < 0 || ms == 1, "ms %d with %lld ms left", ms, (long long)left);
}

/* Private: a directory, owned by the effective uid, no group or other bits. Anything else is refused. */
Test(run_dir, only_a_directory_of_this_user_with_no_group_or_other_bits_is_private) {
  struct stat st = {0};
  st.st_mode = S_IFDIR | 0700;
  st.st_uid = geteuid();
  cr_assert(gr_dir_is_private(&st));
  st.st_mode = S_IFDIR | 0500;
  cr_assert(gr_dir_is_private(&st));
  static const mode_t others[] = {0710, 0701, 0740, 0704, 0720, 0702, 0777, 0750};
  for (size_t i = 0; i < GR_ARRAY_LEN(others); i++) {
    st.st_mode = S_IFDIR | others[i];
    cr_assert_not(gr_dir_is_private(&st), "mode %o taken as private", others[i]);
  }
  st.st_mode = S_IFDIR | 0700;
  st.st_uid = geteuid() + 1;
  cr_assert_not(gr_dir_is_private(&st), "another user's directory taken as private");
  st.st_uid = geteuid();
  st.st_mode = S_IFLNK | 0700;
  cr_assert_not(gr_dir_is_private(&st), "a link taken as private");
  st.st_mode = S_IFREG | 0700;
  cr_assert_not(gr_dir_is_private(&st));
}

Test(text, log_bytes_uses_binary_units_with_one_decimal) {
  static const struct {
    uint64_t v;
    const char *want;
  } cases[] = {
      {0, "0 B"},
      {1, "1 B"},
      {1023, "1023 B"},
      {1024, "1.0 KiB"},
      {1536, "1.5 KiB"},
      {UINT64_C(1) << 20, "1.0 MiB"},
      {(UINT64_C(3) << 30) / 2, "1.5 GiB"},
      {UINT64_C(1) << 40, "1.0 TiB"},
      {UINT64_C(1) << 50, "1.0 PiB"},
      {UINT64_C(1) << 60, "1024.0 PiB"},
  };
  char buf[32];
  for (size_t i = 0; i < GR_ARRAY_LEN(cases); i++)
    cr_assert_str_eq(gr_log_bytes(cases[i].v, buf, sizeof buf), cases[i].want, "%llu",
                     (unsigned long long)cases[i].v);
  char tiny[4];
  cr_assert_eq(gr_log_bytes(1536, tiny, sizeof tiny), tiny);
  cr_assert_str_eq(tiny, "1.5", "a short buffer is truncated, still terminated");
  cr_assert_str_eq(gr_plural(1), "");
  cr_assert_str_eq(gr_plural(0), "s");
  cr_assert_str_eq(gr_plural(2), "s");
}
