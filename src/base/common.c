/* common.c -- the shared pieces of common.h that are not inline: byte counts for people, JSON strings, the
 * wall clock, a process's start time. In the library and the command alike. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *gr_log_bytes(uint64_t v, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double x = (double)v;
  size_t i = 0;
  while (x >= 1024 && i + 1 < GR_ARRAY_LEN(u)) {
    x /= 1024;
    i++;
  }
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", x, u[i]);
  return buf;
}

void gr_json_escape(const char *s, void (*put)(void *ctx, const char *p, size_t n), void *ctx) {
  put(ctx, "\"", 1);
  const unsigned char *run = (const unsigned char *)s, *p = run;
  while (*p) {
    char e[8];
    const char *out = NULL;
    size_t n = 0, step = 1;
    if (*p == '"' || *p == '\\') {
      e[0] = '\\', e[1] = (char)*p, out = e, n = 2;
    } else if (*p == '\n') {
      out = "\\n", n = 2;
    } else if (*p == '\t') {
      out = "\\t", n = 2;
    } else if (*p < 0x20) {
      snprintf(e, sizeof e, "\\u%04x", *p);
      out = e, n = 6;
    } else if ((step = gr_utf8_len(p)) == 0) {
      out = "\\ufffd", n = 6, step = 1;
    }
    if (out) { /* what came before as it is, then the escape */
      if (p > run)
        put(ctx, (const char *)run, (size_t)(p - run));
      put(ctx, out, n);
      run = p + step;
    }
    p += step;
  }
  if (p > run)
    put(ctx, (const char *)run, (size_t)(p - run));
  put(ctx, "\"", 1);
}

uint64_t gr_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t gr_stat_start_ticks(const char *stat_text) {
  /* The command name (field 2) is in parentheses and may hold spaces and ')': the fields resume after the
   * last ')'. Field 3 follows ") "; the start time is field 22. */
  const char *p = strrchr(stat_text, ')');
  for (int field = 2; field < 22 && p; field++)
    p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

char *gr_read_file(const char *path) { return gr_read_file_max(path, SIZE_MAX); }

char *gr_read_file_max(const char *path, size_t max) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return NULL;
  }
  if (max != SIZE_MAX && (uint64_t)st.st_size > max) {
    close(fd);
    errno = EFBIG;
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
    n += (size_t)r;
    if (max != SIZE_MAX && n > max) { /* it grew while read */
      free(buf);
      close(fd);
      errno = EFBIG;
      return NULL;
    }
    if (n + 1 == cap) {
      char *t = realloc(buf, cap *= 2);
      if (!t) {
        free(buf);
        buf = NULL;
      } else {
        buf = t;
      }
    }
  }
  close(fd);
  if (buf)
    buf[n] = '\0';
  return buf;
}
