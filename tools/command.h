/* command.h -- shared by the gpureclaim command's files. */
#ifndef GR_COMMAND_H
#define GR_COMMAND_H

#include "jsonread.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit statuses (documented in --help). */
enum { EX_OK = 0, EX_FAILED = 1, EX_USAGE = 2, EX_NOPROC = 3 };

/* A process running gpureclaim, as its status file describes it. */
typedef struct proc {
  pid_t pid;
  jnode_t *status; /* the parsed status file */
  char path[4200];
} proc_t;

/* The run directory the library uses (same rules); NULL with a message if unusable. */
const char *cmd_rundir(bool quiet);
/* Every live process of this user with a status file; stale files are removed (noted on stderr). */
size_t cmd_list(proc_t **out);
/* One process by pid. Returns 0, or EX_NOPROC after printing why (unknown pid, another user's, no gpureclaim). */
int cmd_find(pid_t pid, proc_t *out);
void cmd_free(proc_t *p);
/* Sends one request over the process's control socket; returns the parsed answer or NULL (errno-style reason
 * in *why). timeout in seconds. */
jnode_t *cmd_ask(const proc_t *p, const char *request, double timeout, const char **why);
/* Re-reads a process's status file. */
jnode_t *cmd_read_status(const proc_t *p);

/* Formatting. */
const char *cmd_bytes(uint64_t v, char *buf, size_t len); /* 1.5 GiB */
bool cmd_json_out(void);                                 /* --json given */
void cmd_set_json(bool on);

#endif
