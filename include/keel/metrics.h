/*
 * keel/metrics.h -- the runtime's figures in the Prometheus text exposition
 * format (version 0.0.4): tick durations, overload, systems, transactions,
 * the WAL writer's commits and syncs, checkpoints, recovery, durable lag.
 * docs/operations.md ("Monitor") lists every metric, its type and unit.
 *
 * Thread-safety: call it from any thread, also while the runtime ticks on
 * another (keel_runtime_start, keel_runtime_run, keel_runtime_step) and
 * while side transactions commit: it reads atomics, fixed-bucket histograms
 * and a copy of the plain counters that each tick publishes at its end.
 * A tick never waits for it: while a scrape holds the copy the tick skips
 * one publication, so the plain counters may then be one tick old. It waits
 * for, and must not overlap, keel_runtime_set_schedule; it must not overlap
 * keel_runtime_close. Families of the data directory (keel_wal_*,
 * keel_durable_*, keel_checkpoint*, keel_recovery_seconds) appear once the
 * directory is open (keel_runtime_recover or the first step).
 */
#ifndef KEEL_METRICS_H
#define KEEL_METRICS_H

#include <stddef.h>

#include "keel/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The HTTP Content-Type of the exposition. */
#define KEEL_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Receives the exposition in pieces, in order (len > 0, not NUL-terminated).
 * A nonzero return ends the write, and keel_metrics_write returns it. */
typedef int (*keel_metrics_sink)(void *user, const char *data, size_t len);

/* Write the exposition of rt to sink, a piece of at most a few KiB at a
 * time. The sink runs while rt's metrics lock is held (see above): keep it
 * quick, and never call into rt from it. Errors: KEEL_EINVAL (rt or sink
 * NULL); a sink's nonzero code as it returned it. */
int keel_metrics_write(const keel_runtime *rt, keel_metrics_sink sink, void *user);

/* The exposition into buf (cap bytes), NUL-terminated; *len receives its
 * length without the NUL -- also when it does not fit, which returns
 * KEEL_ENOSPC with buf holding a NUL-terminated prefix. The figures move
 * between calls: retry with room to spare (2 x *len). Errors: KEEL_EINVAL
 * (rt or len NULL, buf NULL with cap > 0), KEEL_ENOSPC. */
int keel_metrics_text(const keel_runtime *rt, char *buf, size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
