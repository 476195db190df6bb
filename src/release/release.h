/* release.h -- the release engine: releases, the out-of-memory release, a peer's give (release.c). Internal. */
#ifndef GR_RELEASE_H
#define GR_RELEASE_H

#include "gpureclaim.h"
#include "scope.h" /* gr_scope_key_t */

#include <time.h>

/* Runs (or joins) a release; trigger is a gpureclaim_trigger_t. Returns 0 or -errno. */
int gr_release_run(unsigned what, int trigger, gpureclaim_report_t *out);
/* What an out-of-memory failure may release on the allocating thread. Returns bytes given back. */
uint64_t gr_release_for_oom(void);
/* Frees the orphans of scope slot `slot` at once (GPURECLAIM_FREE_NOW): those under the n keys given, or with
 * keys NULL every orphan of the slot in the table. */
void gr_release_free_scope_now(uint16_t slot, const gr_scope_key_t *keys, size_t n, gpureclaim_report_t *rep);
void gr_release_atfork_child(void);
/* A give to a peer gave something now (gr_release_give, or a sleep a peer's request caused): the status file's
 * last_gave_ms, the time of the last such give (CLOCK_REALTIME ms, 0 never): peers ask a recent giver last. */
void gr_release_note_give(void);
uint64_t gr_release_last_give_ms(void);

/* A peer's request: gives up to want bytes on the devices in devmask (bit per ordinal), cheapest
 * first, within GPURECLAIM_ON_SIGNAL; framework caches only when framework_ok. Fills rep (trigger peer). */
void gr_release_give(uint64_t want, uint64_t devmask, int asker, bool framework_ok, const struct timespec *deadline,
                     gpureclaim_report_t *rep);

#endif /* GR_RELEASE_H */
