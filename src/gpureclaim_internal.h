/*
 * gpureclaim_internal.h -- every internal header at once, for tests and benchmarks. Not installed. No file of the
 * library includes it: each includes the headers of the modules it uses (docs/ARCHITECTURE.md, file map).
 *
 * What the command shares with the library is in common.h and options.h (no CUDA).
 * Module prefixes: gr_opt_ (options.c), gr_log_ (log.c), gr_real_ (real.h), gr_hook_ (hooks/hooks.h), gr_reg_
 * (registry.h), gr_owner_ (owner.h), gr_stats_ (stats.h), gr_table_/gr_epoch_ (table.h, epoch.h), gr_track_
 * (track.h), gr_scope_ (scope.h), gr_release_ (release.h), gr_worker_ (worker.h), gr_sig_ (sig.h), gr_py_
 * (releasers/python.h), gr_peer_ (peer.h), gr_give_ (give.h), gr_sleep_ (sleep.h), gr_report_ (report/report.h),
 * gr_control_ (control.h), gr_core_ (core.h: start-up, fork, exit), gr_state_ (state.h: what every module reads
 * of the process), gr_tick_ (tick.h), gr_gate_ (gate.h), gr_admit_ (admit.h), gr_capture_ (capture.h).
 */
#ifndef GPURECLAIM_INTERNAL_H
#define GPURECLAIM_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "common.h"
#include "gpureclaim.h"
#include "names.h"
#include "options.h"
#include "state.h"
#include "table.h"

#include <cuda.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>


#include "export.h"
#include "real.h"
#include "hooks.h"
#include "registry.h"
#include "owner.h"
#include "stats.h"
#include "track.h"
#include "stacks.h"
#include "scope.h"
#include "release.h"
#include "worker.h"
#include "sig.h"
#include "python.h"
#include "peer.h"
#include "give.h"
#include "sleep.h"
#include "capture.h"
#include "admit.h"
#include "control.h"

#endif /* GPURECLAIM_INTERNAL_H */
