/*
 * report.h -- what gpureclaim writes, one file per output (docs/ARCHITECTURE.md): event lines (event.c), the
 * status file (status.c), snapshots and the counters (snapshot.c), leak reports (leaks.c), both to paths the
 * program names (file.c), the GPUs as reports show them (gpus.c) and the run directory (rundir.c).
 * Nothing here runs inside an allocation.
 */
#ifndef GPURECLAIM_REPORT_H
#define GPURECLAIM_REPORT_H

#include "gpureclaim.h"

#include <stdbool.h>
#include <stddef.h>

struct jbuf;

/* rundir.c: the private run directory (created 0700 if needed); NULL if unusable. */
const char *gr_report_rundir(void);
/* The same if it was opened already, else NULL (never creates it). */
const char *gr_report_rundir_opened(void);

/* event.c: one JSON line (newline included) where events go: release reports, peer reclaims, sleeps, wakes
 * (GPURECLAIM_LOG or stderr; nowhere if unset). */
void gr_report_event(const struct jbuf *b);
/* A release's report as a JSON object. */
void gr_report_release_json(struct jbuf *b, const gpureclaim_report_t *r);
/* A release ended: its event line and its line for people (then gr_report_status_release). */
void gr_report_release(const gpureclaim_report_t *r);
/* One line for people about a release, at GPURECLAIM_VERBOSE=1 (the JSON report goes to GPURECLAIM_LOG). */
void gr_log_release(const gpureclaim_report_t *r);

/* status.c: the status file. update rewrites it (0 or -errno), remove deletes it at exit (no update after). */
int gr_report_status_update(void);
void gr_report_status_remove(void);
/* The control socket's path for the status file, NULL once it is closed (whoever opens the socket hands it). */
void gr_report_status_socket(const char *path);
/* What the status file shows of the modules above report/, handed over when the library is loaded (core.c):
 * the "sleep" object (sleep.c) and the "peer" object (peer.c). Until then they are left out. */
typedef void (*gr_report_part_fn)(struct jbuf *b);
void gr_report_status_parts(gr_report_part_fn sleep_json, gr_report_part_fn peer_json);
/* The "sleep" object so handed over, for the stats answer too. */
void gr_report_status_sleep_json(struct jbuf *b);
/* A release ended: the status file's releases and last_release (and their signal twins: served_signal, it
 * served a release signal), then the file is rewritten. */
void gr_report_status_release(const gpureclaim_report_t *r, bool served_signal);
void gr_report_atfork_child(void);

/* gpus.c: the UUID of device ordinal d as nvidia-smi -L writes it ("GPU-..."; cuDeviceGetUuid_v2: a MIG
 * instance's own; cached once read: asleep, the driver is not asked); false if unknown. */
bool gr_report_gpu_uuid(int d, char *buf, size_t len);
/* "gpus": ordinal and UUID of each GPU; with memory, of those this process has a context on, with the driver's
 * free and total bytes, else of every GPU it can see. */
void gr_report_gpus_json(struct jbuf *b, bool memory);

/* snapshot.c: the counters, pools, GPUs, framework caches and sleep state (the stats answer); the same with
 * every block (a snapshot). */
void gr_report_stats_json(struct jbuf *b);
int gr_report_snapshot_json(struct jbuf *b);
/* What the framework caches of device held that they could give back, as the last stats answer or snapshot
 * measured it (0 before one): the status file's "peer" object shows it. */
uint64_t gr_report_framework_releasable(int device);

/* leaks.c: the leak report, as JSON or as text, into b or onto descriptor fd. */
int gr_report_leaks(struct jbuf *b, bool json);
int gr_report_leaks_fd(int fd, bool json);

/* snapshot.c: the public view of a record (gpureclaim_block_t), its library resolved now (gpureclaim_blocks,
 * snapshots). */
struct gr_rec;
void gr_block_from_rec(const struct gr_rec *r, gpureclaim_block_t *b);

#endif /* GPURECLAIM_REPORT_H */
