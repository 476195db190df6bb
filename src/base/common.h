/*
 * common.h -- what the library and the command share, and nothing of CUDA: compiler attributes, text for
 * people and JSON for programs, clocks, logging, and the contracts both sides of the run directory must read
 * the same way (which directory is private, which process a status file belongs to). Built once, as the static
 * library gpureclaim_common, into libgpureclaim.so and the gpureclaim command.
 */
#ifndef GPURECLAIM_COMMON_H
#define GPURECLAIM_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ---- compiler attributes ---- */
#define GR_LIKELY(x) __builtin_expect(!!(x), 1)
#define GR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GR_NOINLINE __attribute__((noinline))
#define GR_COLD __attribute__((noinline, cold))
#define GR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* Internal invariants, checked in the debug build (GPURECLAIM_DEBUG=ON, which CI's sanitizer build uses): a
 * broken one prints what and where, then aborts. Free in a normal build: the condition is not evaluated. */
#ifdef GR_DEBUG
#define GR_ASSERT(c) (GR_LIKELY(c) ? (void)0 : gr_assert_fail(#c, __FILE__, __LINE__))
#else
#define GR_ASSERT(c) ((void)0)
#endif
void gr_assert_fail(const char *what, const char *file, int line) __attribute__((noreturn, cold));

/* ---- logging: one line each on stderr, "gpureclaim[pid]: ...", a single write(2), never allocates (log.c) ---- */
void gr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define gr_warn(...) gr_log(0, __VA_ARGS__)
#define gr_info(...) gr_log(1, __VA_ARGS__)
#define gr_debug(...) gr_log(2, __VA_ARGS__)
/* Warns once per flag (a static _Atomic int owned by the caller). */
#define gr_warn_once(flag, ...)                                                                            \
  do {                                                                                                     \
    static _Atomic int flag;                                                                               \
    if (!atomic_exchange_explicit(&flag, 1, memory_order_relaxed))                                         \
      gr_log(0, __VA_ARGS__);                                                                              \
  } while (0)

/* ---- text ---- */
/* v bytes for people, in binary units ("512 B", "1.5 GiB"), in buf; returns buf. */
const char *gr_log_bytes(uint64_t v, char *buf, size_t len);
/* "s" unless n is 1, for "%llu block%s". */
static inline const char *gr_plural(unsigned long long n) { return n == 1 ? "" : "s"; }
/* Length (1-4) of the well-formed UTF-8 sequence at p (NUL-terminated), or 0 where p starts none (a stray
 * byte, an overlong form, a surrogate, past U+10FFFF). Command lines and paths are bytes: what gpureclaim
 * writes as JSON or shows to people goes through this. */
static inline size_t gr_utf8_len(const unsigned char *p) {
  unsigned c = p[0];
  if (c < 0x80)
    return 1;
  size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0) || (c == 0xf0 && p[1] < 0x90) ||
      (c == 0xf4 && p[1] >= 0x90))
    return 0; /* overlong, surrogate, or beyond U+10FFFF */
  return n;
}
/* s as a JSON string, quotes included, handed to put(ctx, bytes, n) piece by piece: '"' and '\\' escaped, \n and
 * \t as such, other C0 controls as \u00XX, a byte that is not UTF-8 as \ufffd (JSON is UTF-8). */
void gr_json_escape(const char *s, void (*put)(void *ctx, const char *p, size_t n), void *ctx);

/* ---- clocks ---- */
/* Milliseconds from now to a CLOCK_MONOTONIC deadline, for poll(): 0 once it has passed, else rounded up (a
 * poll never wakes before the deadline and spins), at most a day. */
static inline int gr_ms_until(const struct timespec *deadline) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t ns = (int64_t)(deadline->tv_sec - now.tv_sec) * 1000000000 + (deadline->tv_nsec - now.tv_nsec);
  return ns <= 0 ? 0 : ns >= INT64_C(86400) * 1000000000 ? 86400000 : (int)((ns + 999999) / 1000000);
}
/* CLOCK_MONOTONIC in nanoseconds: durations in reports and events. */
static inline uint64_t gr_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
/* The wall clock (CLOCK_REALTIME) in milliseconds since the epoch: the unit of every time in status files and
 * reports. */
uint64_t gr_wall_ms(void);

/* ---- the run directory's contracts ---- */
/* Whether st (from lstat, never following a link) is a directory private to this user: owned by the effective
 * uid, no group or other bits. Anything else could hold status files and sockets planted to make the command
 * signal or trust the wrong process, so the library and the command both refuse it. */
static inline bool gr_dir_is_private(const struct stat *st) {
  return S_ISDIR(st->st_mode) && st->st_uid == geteuid() && !(st->st_mode & 077);
}
/* The whole of a regular file, NUL-terminated, malloc'd; NULL when it cannot be read or is not a regular file.
 * Opened without following a link and without blocking: a FIFO or a device named like a status file in the run
 * directory must not hang its reader (errno EINVAL for anything but a regular file). */
char *gr_read_file(const char *path);
/* The same, refused (NULL, errno EFBIG) when the file holds more than max bytes, before any is read. */
char *gr_read_file_max(const char *path, size_t max);
/* The start time of a process (field 22 of its /proc/PID/stat, clock ticks since boot) from that file's text;
 * 0 where the text has no such field. With the pid it names one process for good: pids are reused, start
 * times of one pid never. */
uint64_t gr_stat_start_ticks(const char *stat_text);

#endif
