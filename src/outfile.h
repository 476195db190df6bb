/*
 * outfile.h -- writing a whole file to a path a user named (snapshots, leak reports, Prometheus text) or to
 * gpureclaim's own run directory (status files). Shared by the library and the gpureclaim command.
 */
#ifndef GR_OUTFILE_H
#define GR_OUTFILE_H

#include <stddef.h>
#include <sys/types.h>

/* Writes len bytes of data to path. A path that does not exist or names a regular file is written to a
 * temporary name in the same directory and renamed into place, so a reader never sees half a file. Anything
 * else that exists there (a symbolic link, a device such as /dev/null or /dev/stdout, a FIFO) is opened and
 * written as a shell's `>` would: a link's target gets the content, and the link and the device stay what
 * they are. Returns 0 or a negative errno value (-EISDIR for a directory). */
int gr_out_write(const char *path, const void *data, size_t len, mode_t mode);

#endif /* GR_OUTFILE_H */
