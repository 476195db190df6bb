/* sleep.h -- sleep and wake (sleep.c). Internal. */
#ifndef GR_SLEEP_H
#define GR_SLEEP_H

#include "gpureclaim.h"

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

struct jbuf;

/* sleep.c: sleep and wake (gpureclaim_sleep). timeout_ms: how long the lock waits for calls in flight. */
int gr_sleep_run(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out);
/* The same, telling progress (may be NULL) as it goes: phase "release", "moving" (done 0 of total), "moved";
 * and asking wanted (may be NULL) at the last moment before the checkpoint, once the process is locked, whether
 * whoever asked still waits for the sleep: if not, it is withdrawn (-ECANCELED; the release's memory stays given
 * back), so that a sleep whose client hung up at any time before it began is never run. */
typedef void (*gr_sleep_progress_fn)(const char *phase, uint64_t done, uint64_t total, void *arg);
typedef bool (*gr_sleep_wanted_fn)(void *arg);
int gr_sleep_run_progress(int trigger, unsigned timeout_ms, gpureclaim_sleep_report_t *out,
                          gr_sleep_progress_fn progress, gr_sleep_wanted_fn wanted, void *arg);
/* Wakes the process (trigger: gpureclaim_trigger_t). 0, -ENOMEM (no room in time), -EIO (restore refused). */
int gr_sleep_wake(int trigger);
int gr_sleep_state_now(uint64_t *host_bytes);
/* The slow path of the gates (gate.h, gr_gate_set_slow): a call while the process sleeps wakes it. */
CUresult gr_sleep_gate_slow(void);
/* "sleep": {state, host_bytes, ...} for the status file and the stats answer. */
void gr_sleep_json(struct jbuf *b);
void gr_sleep_report_json(struct jbuf *b, const gpureclaim_sleep_report_t *r);
/* The worker's tick: the idle watch (GPURECLAIM_SLEEP_IDLE). Returns the poll timeout it wants, in ms. */
/* Whether no thread made a CUDA call gpureclaim sees for a second or more (the idle probe armed and untouched):
 * a peer short of memory after every cache may then ask this process to sleep (GPURECLAIM_PEERS sleep). */
bool gr_sleep_idle_for_peer(void);
/* The wall-clock ms since which the process made no CUDA call gpureclaim sees (idle a second or more, awake,
 * no thread waiting for memory); 0 when it is not idle. The status file's "idle_since_ms". */
uint64_t gr_sleep_idle_since_wall_ms(void);
int gr_sleep_idle_tick(void);
void gr_sleep_atfork_child(void);
/* IPC (hooks/driver.c): exported = 1 once memory was exported (cuIpcGetMemHandle); opened +1/-1 per handle of
 * another process's memory opened and closed. A sleep is refused while either says memory is shared. */
void gr_sleep_note_ipc(int exported, int opened);

#endif /* GR_SLEEP_H */
