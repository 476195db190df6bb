/*
 * table.h -- the lock-free block table (internal), built on the epoch-based reclamation of epoch.h.
 *
 * The table maps (key space, key) to one record per live block (record.h). See table.c for the algorithm and
 * its invariants, young.c for the threads' logs of young records in front of it, epoch.c for how retired memory
 * is reclaimed.
 */
#ifndef GR_TABLE_H
#define GR_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "epoch.h"
#include "record.h"

/* ---- the table (table.c) ---- */

/* A position in the table, valid inside one epoch critical section. Forwarding across migrations is
 * followed by the functions that take it. */
typedef struct gr_ref {
  void *gen;
  uint64_t idx;
  uint32_t slotgen;
} gr_ref_t;

int gr_table_init(void);
/* Inserts a record (state LIVE or ORPHAN). Returns 0, or -ENOMEM when no memory could be mapped for growth. */
int gr_table_insert(const gr_rec_t *r);
/* The same with the record as a slot holds it (its state in ctl: LIVE or ORPHAN). */
int gr_table_insert_pk(const gr_packed_t *p);
/* The same with p's key space given (gr_kind_keyspace of its kind): on the hot path a constant the compiler
 * folds, where one read from p after a fence would have to be decoded again. */
int gr_table_insert_ks(const gr_packed_t *p, unsigned ks);
/* Inserts an address record (GR_KS_ADDR, state LIVE or ORPHAN) that is likely to be freed soon by the thread
 * that allocated it: into the thread's log of young records, touching no shared word. A take by the same
 * thread finds it there; every other reader first drains the logs into the table (gr_table_visit, and a take
 * or lookup that found nothing). 0, or -ENOMEM as gr_table_insert_ks. */
int gr_table_insert_young(const gr_packed_t *p);
/* The same with the calling thread's record given (gr_epoch_t_rec, read once by the caller; NULL: the table),
 * the record by value (the hot path builds it in registers and it goes straight into the log) and asym, the
 * caller's reading of gr_epoch_asym, which it uses for every step of its insert (track.c, op_begin). */
int gr_table_insert_young_v(gr_thread_rec_t *me, gr_packed_t p, bool asym);
/* Records a thread's log of young records holds at most; an insert that finds it full moves them into the table. */
#define GR_YOUNG_MAX 6144
/* Moves every thread's young records into the table (gr_table_visit does it first). Returns the number moved. */
size_t gr_table_drain(void);

/* Edits one record: called with a copy of the first record with this key space and key whose state is in
 * state_mask; returns true after changing rec's state, aux or scope to apply the change (atomically, against
 * the version it was shown), false to leave the record alone. On a conflicting concurrent change it is
 * called again with the new version. */
typedef bool (*gr_edit_fn)(gr_rec_t *rec, void *arg);
/* Returns 0 after a change (before: the record as it was), -ENOENT when no record matched or fn declined. */
int gr_table_update(unsigned ks, uint64_t key, unsigned state_mask, gr_edit_fn fn, void *arg, gr_rec_t *before);
/* update() that moves the record to DELETED. */
int gr_table_take(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out);
/* take() of the first matching record only when its kind is in kind_mask (-ENOENT if it is of another kind). */
int gr_table_take_kind(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_rec_t *out);
/* The same, the record given as the slot held it (ctl: its state before the take and its metadata). */
int gr_table_take_kind_pk(unsigned ks, uint64_t key, unsigned state_mask, unsigned kind_mask, gr_packed_t *out);
/* Copies the first record with that key whose state is in state_mask. 0 or -ENOENT. Takes and lookups of an
 * address whose state mask admits LIVE or ORPHAN (and not GR_NOT_YOUNG) look in the logs of young records too:
 * the caller's own first, the others by draining them when the table has no match. update() looks in the table
 * only: its callers' records come from a visit (which drained the logs) or are scoped (never young). */
int gr_table_lookup(unsigned ks, uint64_t key, unsigned state_mask, gr_rec_t *out);

/* Iteration. fn sees a consistent copy of every record present when the iteration started and still present
 * when reached (each exactly once), and may be shown records added meanwhile. It may call gr_table_cas() with
 * the ref. Return 0 to go on, non-zero to stop (returned by gr_table_visit). Runs inside a critical section. */
typedef int (*gr_visit_fn)(gr_ref_t *ref, const gr_rec_t *rec, void *arg);
int gr_table_visit(gr_visit_fn fn, void *arg);
/* Where a visit stopped, for the next to go on from there: zeroed before the first. */
typedef struct gr_visit_pos {
  uint64_t seq; /* the generation the visit was in */
  uint64_t idx; /* the slot it stopped at */
} gr_visit_pos_t;
/* gr_table_visit that begins where the last visit with *pos stopped (at the record whose callback stopped it, or
 * past the end), while the table is in the same generation; from the beginning otherwise, as after a
 * migration. A release's rounds use it, so that N records cost one pass over the table, not N / round ones. */
int gr_table_visit_from(gr_visit_pos_t *pos, gr_visit_fn fn, void *arg);

/* Moves the record at ref from *expect (state, scope, aux as last read) to desired's state, scope and aux.
 * Returns 0; -EAGAIN when the record changed (then *expect holds its new version); -ENOENT when the record
 * left. Must be called inside the critical section in which ref was obtained (or gr_epoch_enter()ed
 * around both). */
int gr_table_cas(gr_ref_t *ref, gr_rec_t *expect, const gr_rec_t *desired);

/* Bytes of table memory mapped now (live generations and retired ones not yet reclaimed). */
size_t gr_table_bytes(void);
/* Most bytes of table memory mapped at once since the last call with reset (then it restarts from now): the
 * peak while a migration holds two generations (bench_table). */
size_t gr_table_bytes_peak(bool reset);
/* Slots in the current generation. */
uint64_t gr_table_capacity(void);
/* Number of generations created so far (tests). */
uint64_t gr_table_migrations(void);
/* Slots a lookup in the current generation probes at most: its largest displacement + 1 (tests). */
uint64_t gr_table_probe_bound(void);
/* Forces a migration to a table sized for the records present (tests, and after a large release). */
void gr_table_compact(void);
/* Checks the table's invariants, single-threaded (tests): returns 0 or a negative line number. */
int gr_table_check(void);
/* In the child after fork(): empties the table. */
void gr_table_atfork_child(void);

#endif /* GR_TABLE_H */
