/*
 * keel/runtime.h -- the runtime: a world, a worker pool and a tick loop.
 *
 * One tick: the systems of every track run in track order, each
 * system as soon as its predecessors completed; then the structural sync
 * point applies the commands the systems recorded (schedule order, FIFO
 * within a system); then tick-end work (telemetry). Systems run on workers
 * inside a system context (keel_ctx); a failing system is isolated: it is
 * rolled back, its transitive successors are skipped, the rest of the tick
 * runs.
 *
 * Thread-safety: one controlling thread creates the runtime, installs
 * schedules and calls step / run / start / stop / close; these are not safe
 * against each other from several threads. keel_runtime_stop may also be
 * called from any other thread to end a keel_runtime_run or the driver;
 * keel_runtime_tick is safe from any thread. keel_ctx_* are for the body
 * they were handed to.
 */
#ifndef KEEL_RUNTIME_H
#define KEEL_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

#include "keel/command.h"
#include "keel/durability.h"
#include "keel/replication.h"
#include "keel/schedule.h"
#include "keel/txn.h"
#include "keel/world.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The runtime: a world, a worker pool, a schedule and a tick loop, made by
 * keel_runtime_create. Other headers that take one repeat this typedef
 * (C11 allows the repetition), so each of them stands alone. */
typedef struct keel_runtime keel_runtime;

/* A runtime hook (on_first_tick). It runs with a context like a callback
 * system's; its commands are applied before the first tick's systems run.
 * If the hook fails, the step returns its code and the hook runs again on
 * the next step; if its commands fail to apply, they stay pending like a sync
 * point's (keel_runtime_sync_retry / _discard) and the hook does not rerun. */
typedef int (*keel_hook_fn)(keel_ctx *ctx, void *user);

/* Overload levels (docs/overload.md), in escalation order. The
 * detector moves one step at a time in both directions. */
typedef enum keel_overload_level {
    KEEL_OVERLOAD_NORMAL = 0,                /* everything runs every tick */
    KEEL_OVERLOAD_SYSTEM_THROTTLING = 1,     /* LOW-priority systems skipped, NORMAL ones every
                                                throttled_tick_divisor ticks */
    KEEL_OVERLOAD_SCOPE_REDUCTION = 2,       /* ... and query systems honour their entity_budget */
    KEEL_OVERLOAD_TICK_RATE_MODULATION = 3,  /* ... and the tick interval (and dt) is multiplied
                                                by 2, 3, 4 or 6 */
    KEEL_OVERLOAD_PLAYER_SHEDDING = 4,       /* ... and on_critical_overload was called on entry */
} keel_overload_level;

#define KEEL_OVERLOAD_LEVELS 5

/* "NORMAL", "SYSTEM_THROTTLING", "SCOPE_REDUCTION", "TICK_RATE_MODULATION",
 * "PLAYER_SHEDDING"; "?" for anything else. */
const char *keel_overload_level_name(keel_overload_level level);

/* Called once per entry into KEEL_OVERLOAD_PLAYER_SHEDDING, on the thread
 * that runs the ticks, right after the tick that escalated (`tick`). It may
 * read the runtime's counters and telemetry and call keel_submit; it must
 * not step, run, start, stop or close the runtime. Typical use: tell the
 * network layer to refuse or drop players. */
typedef void (*keel_overload_fn)(keel_runtime *rt, uint64_t tick, void *user);

/* The overload detector (docs/overload.md). It runs after every
 * tick the metronome runs (keel_runtime_run, keel_runtime_start) on a
 * throttled runtime (tick_rate_hz > 0): a tick that ran longer than
 * overrun_threshold x its budget is an overrun, one that ran at most
 * deescalation_ratio x its budget is calm, anything between is neither and
 * breaks both streaks. The budget is the tick's interval: 1 / tick_rate_hz
 * times the current tick multiplier. keel_runtime_step never feeds it (the
 * caller sets the pace), and an unthrottled runtime has no budget: the
 * level then stays where it is (NORMAL unless a metronome moved it).
 * Zero = the default, everywhere. */
typedef struct keel_overload_desc {
    bool disabled;                   /* true: no detector; the level stays NORMAL */
    double overrun_threshold;        /* > 0; 0 = 1.2 */
    double deescalation_ratio;       /* in (0, overrun_threshold); 0 = 0.6 */
    uint32_t escalation_ticks;       /* consecutive overruns for one step up; 0 = 5 */
    uint32_t deescalation_ticks;     /* consecutive calm ticks for one step down; 0 = 20 */
    uint32_t throttled_tick_divisor; /* from SYSTEM_THROTTLING on, a NORMAL-priority system runs on
                                        one tick in this many (staggered by registration index:
                                        (tick + index) % divisor == 0); 0 = 2; 1 = every tick */
    double min_tick_rate_hz;         /* floor of tick-rate modulation: multipliers above
                                        tick_rate_hz / min_tick_rate_hz are not used; in
                                        (0, 100000]; 0 = 10 */
    keel_overload_fn on_critical_overload; /* NULL: none */
    void *user;                      /* handed to on_critical_overload */
} keel_overload_desc;

typedef struct keel_runtime_desc {
    keel_world_desc world;        /* the world the runtime creates and owns */
    int32_t workers;              /* threads running systems, the caller included: -1 or 0 = online
                                     CPUs; 1 = serial on the caller, no worker threads; at most 64 */
    double tick_rate_hz;          /* TickDriver rate in [0.01, 100000]; 0 = 60; negative = unthrottled */
    uint32_t telemetry_capacity;  /* ticks kept in the telemetry ring, a power of two; 0 = 1024 */
    double watchdog_seconds;      /* a system running longer is reported; 0 = 30; at most 1e6 */
    keel_durability durability;   /* default mode of ticks and side transactions; 0 = GROUP */
    keel_durable_desc durable;    /* the data directory (keel/durability.h); dir NULL = in memory */
    keel_hook_fn on_first_tick;   /* runs once, before the first tick's systems, in a transaction
                                     that may read and write every component */
    void *hook_user;
    keel_overload_desc overload;  /* the overload detector; zero = the defaults of
                                     docs/overload.md, enabled */
    keel_replication_desc replication; /* keel/replication.h; zero = not replicated */
} keel_runtime_desc;

/* Errors: KEEL_EINVAL (bad desc field: the last error names it), KEEL_ENOMEM. */
int keel_runtime_create(const keel_runtime_desc *desc, keel_runtime **out);
/* Stop the driver if running, run on_shutdown (keel_durable_desc), make
 * everything committed durable, join the workers, free everything (the
 * world, the installed schedule's runtime state). The runtime is gone
 * whatever the result; end every read view first, and let no other thread
 * call into it (keel_submit included) once the close has begun. Returns 0
 * (NULL is ignored: 0), or
 *   KEEL_EFATAL  the runtime had latched fatal, or the final flush failed:
 *                commits after the last durable LSN are lost; the last
 *                error names the cause (KEEL_EIO ...), the directory, that
 *                LSN and the tick a reopen recovers;
 *   KEEL_EUNAVAILABLE  a sync replication primary whose stream did not
 *                acknowledge everything by 5 s after the close began (its
 *                quorum lost; the local disk is waited for, and
 *                on_shutdown's commit waits no longer): the rest is on the
 *                local disk only, never acknowledged; the last error names
 *                the LSNs;
 *   on_shutdown's failure: its own non-zero return, or its commit's code
 *                (KEEL_ECONFLICT, KEEL_ENOMEM): its writes are not applied.
 * A data directory that never opened (keel_runtime_recover failed) is not
 * an error of close: nothing was committed to it. */
int keel_runtime_close(keel_runtime *rt);

/* The world the runtime owns: register components on it before the first tick. */
keel_world *keel_runtime_world(keel_runtime *rt);
/* Number of threads that run systems (the caller included). */
uint32_t keel_runtime_workers(const keel_runtime *rt);

/* Install a built schedule; on success the runtime owns it (and frees the
 * one it replaces; the telemetry ring starts empty). Errors: KEEL_EINVAL (NULL, not built, built with
 * errors), KEEL_EBUSY (the driver is running), and "foreign" (made for
 * another runtime) is KEEL_EINVAL too, with a sentence saying so. */
int keel_runtime_set_schedule(keel_runtime *rt, keel_schedule *s);

/* Run exactly one tick on the calling thread (with the worker pool).
 * Returns 0, or:
 *   KEEL_EINVAL  no schedule installed, or the schedule is stale: the
 *                component registry changed since it was built;
 *   KEEL_EBUSY   commands of an earlier tick are still pending (see
 *                keel_runtime_sync_retry / _discard), or the driver runs;
 *   an error of the sync point (e.g. KEEL_ENOSPC): the tick's systems ran,
 *                playback stopped at a failing command, which stays pending;
 *                the tick still counts (keel_runtime_tick advances, its
 *                telemetry is recorded);
 *   the error of on_first_tick or of its commands (see keel_hook_fn).
 * A failing *system* is not an error of the tick: see the telemetry.
 * Between steps the controlling thread may use the world directly (apply
 * command buffers of its own, keel_set), e.g. to make room before a retry. */
int keel_runtime_step(keel_runtime *rt);

/* Retry the pending commands of the last sync point (same order; 0 when
 * nothing is pending), or drop them. */
int keel_runtime_sync_retry(keel_runtime *rt);
void keel_runtime_sync_discard(keel_runtime *rt);

/* Run ticks on the calling thread at tick_rate_hz until `ticks` more ticks
 * ran or keel_runtime_stop was called from another thread (a stop during
 * the wait for a tick ends the run at once, before that tick). The first tick runs at
 * once and the metronome's grid starts at the call -- unless the previous
 * run's next grid point is still ahead: then the first tick waits for it,
 * so that runs called back to back keep the rate (run(2); run(2) paces like
 * run(4)). keel_runtime_step between runs does not move the grid; the
 * TickDriver (keel_runtime_start) continues it the same way. Returns 0 or
 * the first keel_runtime_step error. */
int keel_runtime_run(keel_runtime *rt, uint64_t ticks);

/* Start a TickDriver thread that runs ticks at tick_rate_hz on an absolute
 * deadline metronome (deadline k = start + k * interval), sleeping, then
 * yielding, then spinning the last ~50 µs. Errors: KEEL_EBUSY (running),
 * KEEL_EINVAL (no schedule). keel_runtime_stop ends it after the current tick
 * (a driver waiting for its next tick ends at once, without running it) and
 * returns the driver's status (0, or the step error that
 * stopped it). Called while neither the driver nor a keel_runtime_run runs
 * (or too late for a run's last tick), it makes the next keel_runtime_run
 * return before its first tick; keel_runtime_start discards it. */
int keel_runtime_start(keel_runtime *rt);
int keel_runtime_stop(keel_runtime *rt);

/* Ticks completed so far. Thread-safe. */
uint64_t keel_runtime_tick(const keel_runtime *rt);

/* The overload level the next tick runs at, and its tick multiplier
 * (*multiplier: 1, 2, 3, 4 or 6; may be NULL). Thread-safe. */
keel_overload_level keel_runtime_overload(const keel_runtime *rt, uint32_t *multiplier);

/* Give back the memory the runtime keeps between ticks for speed: each
 * rewritten column's spare buffer, which the next tick's rewrite of that
 * column would reuse (docs/transactions.md, "Recycling"). Afterwards the
 * world holds one version of every column; the next tick that rewrites a
 * column allocates its buffer again. Call between steps, on the thread
 * that steps. *released (may be NULL) gets the bytes freed. Errors:
 * KEEL_EINVAL (NULL), KEEL_EBUSY (the driver is running, or called inside
 * a tick). */
int keel_runtime_release_memory(keel_runtime *rt, uint64_t *released);

/* ---- inside a system ---------------------------------------------------- */

keel_world *keel_ctx_world(keel_ctx *ctx);
/* The running tick's number (the first tick is 1). */
uint64_t keel_ctx_tick(const keel_ctx *ctx);
/* Seconds per tick at the current rate: multiplier / tick_rate_hz, where the
 * multiplier is 1 unless tick-rate modulation is on (keel/runtime.h,
 * keel_overload_desc); 1/60 when unthrottled. */
float keel_ctx_dt(const keel_ctx *ctx);
/* Index of the worker running the body (0 = the thread that called step). */
uint32_t keel_ctx_worker(const keel_ctx *ctx);
/* The running system's name ("on_first_tick" in the hook). */
const char *keel_ctx_system_name(const keel_ctx *ctx);
/* Command buffer of this system run (this chunk task, for a parallel query
 * system). Structural changes recorded here are applied at the sync point.
 * Never NULL inside a callback or query system. */
keel_cmdbuf *keel_ctx_commands(keel_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
