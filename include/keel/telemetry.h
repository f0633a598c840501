/*
 * keel/telemetry.h -- what each tick did: the telemetry ring, counters, and
 * the Chrome trace-event export.
 *
 * The ring keeps the last `telemetry_capacity` ticks: one tick record and one
 * record per system. Records are written by the tick's thread at tick end;
 * read them between ticks (from the thread that steps, or after stop). A
 * read first waits for the last tick's WAL records when the workers still
 * build them (docs/durability.md, "Between ticks"): its record then holds
 * their stored bytes and the fence's whole time.
 */
#ifndef KEEL_TELEMETRY_H
#define KEEL_TELEMETRY_H

#include <stdint.h>

#include "keel/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum keel_skip_reason {
    KEEL_SKIP_NONE = 0,           /* ran */
    KEEL_SKIP_FAILED = 1,         /* ran and failed (error return, keel_txn_fail) */
    KEEL_SKIP_DEPENDENCY_FAILED,  /* not run: a transitive predecessor failed */
    KEEL_SKIP_THROTTLED,          /* not run: shed by overload throttling (not a failure:
                                     its successors run) */
} keel_skip_reason;

const char *keel_skip_reason_name(keel_skip_reason r);

typedef struct keel_tick_record {
    uint64_t tick;
    uint64_t start_ns;            /* CLOCK_MONOTONIC at tick start */
    uint64_t target_ns;           /* the tick budget: multiplier x 1e9 / tick_rate_hz (0 when unthrottled) */
    uint64_t actual_ns;           /* duration of the tick */
    double overrun;               /* actual / target (0 when unthrottled) */
    uint32_t overload_level;      /* keel_overload_level the tick ran at (the detector's verdict on
                                     this tick shows in the next tick's record) */
    uint32_t multiplier;          /* tick-rate multiplier the tick ran at: 1, 2, 3, 4 or 6 */
    uint32_t entities;            /* live entities at tick end */
    uint32_t systems_run, systems_failed, systems_skipped;
    uint32_t watchdog_reports;    /* systems that outran the watchdog this tick */
    uint64_t wal_raw_bytes, wal_stored_bytes; /* the tick's WAL records: payload bytes, and bytes as
                                     stored (headers, zstd); 0 without a data directory */
    uint64_t fence_ns;            /* duration of the fence (serialize, compress, hand-off), from the sync
                                     point's end: with GROUP or DEFERRED durability mostly after the
                                     step returned (docs/durability.md, "Between ticks") */
    uint64_t durable_lag;         /* ticks completed but not yet durable at the tick's end */
    uint32_t side_txns;           /* side transactions committed in the tick (closures included) */
    uint64_t sync_start_ns;       /* CLOCK_MONOTONIC when the structural sync point started */
    uint64_t sync_ns;             /* duration of the structural sync point (the fence follows it) */
    uint32_t systems_throttled;   /* of systems_skipped: shed by overload throttling */
    uint32_t checkpoint;          /* 1 when a checkpoint was in progress (captured, being written or
                                     waiting to be recorded) during the tick's step */
    uint64_t deferred_rows;       /* rows entity budgets left for later ticks (sum over systems) */
} keel_tick_record;

typedef struct keel_system_record {
    keel_system system;
    uint32_t worker;              /* worker that started it (a parallel system's first task claimed) */
    uint64_t start_ns, end_ns;    /* CLOCK_MONOTONIC, extrapolated from the tick's start (docs/scheduling.md);
                                     0 when not run */
    uint64_t rows;                /* rows a query system visited */
    uint32_t tasks;               /* tasks run: chunk tasks (query), indices (pipeline), 1 (callback);
                                     0 when skipped */
    keel_skip_reason skip;
    uint8_t watchdog;             /* 1 when it outran the watchdog */
    uint64_t deferred;            /* rows of its query its entity budget left for later ticks */
} keel_system_record;

/* The record of tick `tick` if still in the ring. Errors: KEEL_ENOENT (not
 * run yet or overwritten), KEEL_EINVAL. */
int keel_telemetry_tick(const keel_runtime *rt, uint64_t tick, keel_tick_record *out);
/* The record of system `sys` (registration index) in tick `tick`. */
int keel_telemetry_system(const keel_runtime *rt, uint64_t tick, keel_system sys, keel_system_record *out);

typedef struct keel_runtime_stats {
    uint64_t ticks;
    uint64_t systems_run;         /* systems not skipped, failed ones included */
    uint64_t systems_failed, systems_skipped;
    uint64_t commands_applied;    /* commands taken at sync points, ignored ones included
                                     (on_first_tick's are not counted) */
    uint64_t watchdog_reports;
    uint64_t commits;             /* system and side transactions committed */
    uint64_t conflicts;           /* side transactions refused with KEEL_ECONFLICT */
    uint64_t aborts;              /* system transactions rolled back, side transactions aborted */
    /* Durability (0 without a data directory): */
    uint64_t wal_bytes;           /* record bytes committed to the WAL by this runtime (stored, compressed) */
    uint64_t fsyncs;              /* synced LMDB commits (one per group commit) */
    uint64_t checkpoints;         /* checkpoints this runtime recorded */
    uint64_t checkpoint_age_ticks;/* ticks since the last checkpoint recorded (or loaded at
                                     recovery); failed attempts do not reset it */
    uint64_t recovery_ns;         /* time keel_runtime_recover took */
    /* Overload (docs/overload.md): */
    uint32_t overload_level;      /* the level the next tick runs at (keel_overload_level) */
    uint32_t multiplier;          /* the tick multiplier the next tick runs at */
    uint64_t overload_escalations;   /* steps up: levels, and multipliers inside TICK_RATE_MODULATION */
    uint64_t overload_deescalations; /* steps down, counted the same way */
    uint64_t critical_overloads;  /* entries into PLAYER_SHEDDING (= on_critical_overload calls) */
    uint64_t ticks_at_level[KEEL_OVERLOAD_LEVELS]; /* ticks run at each level */
    uint64_t systems_throttled;   /* system runs shed by throttling (also in systems_skipped) */
    uint64_t rows_deferred;       /* sum over ticks of the rows entity budgets deferred */
} keel_runtime_stats;

void keel_runtime_stats_get(const keel_runtime *rt, keel_runtime_stats *out);

/* Write the ring as Chrome trace-event JSON (loads in Perfetto and
 * chrome://tracing): one track per worker with one slice per system run,
 * a driver track with one slice per tick, per sync point and per fence,
 * a WAL writer track with one slice per synced commit, and an "overload"
 * counter track (level and multiplier per tick). System names are written
 * as given, escaped for JSON: they are UTF-8, as keel_schedule_add_system
 * requires.
 * Errors: KEEL_EINVAL, KEEL_EIO (the last error names the file). */
int keel_trace_export(const keel_runtime *rt, const char *path);

#ifdef __cplusplus
}
#endif
#endif
