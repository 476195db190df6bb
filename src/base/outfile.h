/*
 * outfile.h -- writing a whole file to a path a user named (snapshots, leak reports, Prometheus text) or to
 * gpureclaim's own run directory (status files). Shared by the library and the gpureclaim command.
 */
#ifndef GR_OUTFILE_H
#define GR_OUTFILE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Writes len bytes of data to path:
 * - /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: written to that descriptor, at its offset (so a
 *   shell's >> keeps what it had);
 * - a new path, or a regular file: written to a temporary name in the same directory, flushed to disk and
 *   renamed into place, so a reader never sees half a file; a replaced file keeps its permission bits, a new
 *   one gets mode (less the umask);
 * - a symbolic link: followed; its target is then treated as above (a regular target is replaced, the link
 *   stays);
 * - a device (/dev/null) or FIFO: written into; a FIFO that gets no reader within 2 s is an error (ENXIO),
 *   not a hang.
 * A link, device or FIFO owned by another user (root excepted) is refused (EACCES): in a directory others
 * can write to, it could send the content to a file or reader of their choosing. A directory gives EISDIR.
 * Returns 0 or a negative errno value. */
int gr_out_write(const char *path, const void *data, size_t len, mode_t mode);
/* The first half of replacing a regular file (or creating a new one) at path: writes data, flushed to disk, to
 * a new temporary file in the same directory, with the permission bits path has (or mode, less the umask, for
 * a new path or a link, which is then replaced and not followed), and names it in tmp (tmplen bytes; GR_OUT_TEMP_MAX is enough for any path). The caller renames
 * it to path, or unlinks it: for a writer that must decide, after writing, whether its file is still the one
 * to put in place. On failure nothing is left behind. Returns 0 or a negative errno value. */
#define GR_OUT_TEMP_MAX (PATH_MAX + 64)
int gr_out_write_temp(const char *path, const void *data, size_t len, mode_t mode, char *tmp, size_t tmplen);
/* The same, flushed to disk only when sync: a file that describes a live process (a status file) is worthless
 * after a crash, and a reader needs only the rename to see it whole. */
int gr_out_write_temp_ex(const char *path, const void *data, size_t len, mode_t mode, char *tmp, size_t tmplen,
                         bool sync);
/* open(path, flags, mode) that never waits for a FIFO's reader (ENXIO instead), then lets writes wait as usual;
 * O_CLOEXEC and O_NOCTTY are added. Returns the descriptor, or -1 with errno set. */
int gr_out_open_nowait(const char *path, int flags, mode_t mode);
/* Writes all len bytes to fd (retrying short writes and EINTR). Returns 0 or a negative errno value. */
int gr_out_write_fd(int fd, const void *data, size_t len);

#endif /* GR_OUTFILE_H */
