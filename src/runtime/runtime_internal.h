/*
 * runtime/runtime_internal.h -- the runtime's state: the world it owns, the
 * transaction layer's state, the executor (schedule, worker pool, per-system
 * tick state), the durability state, the telemetry ring, the overload
 * detector and the driver. Only runtime/ includes it: the layers below see
 * their own states (txn_state, sched_exec, dur_state) and nothing of this.
 */
#ifndef KEEL_RUNTIME_INTERNAL_H
#define KEEL_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "keel/runtime.h"
#include "keel/telemetry.h"

#include "core/hist.h"
#include "durable/durable_internal.h"
#include "runtime/overload.h"
#include "sched/sched_internal.h"
#include "txn/txn_internal.h"
#include "world/world_internal.h"

typedef struct rt_telemetry {
    uint32_t capacity, mask;
    keel_tick_record *ticks;
    keel_system_record *systems;   /* capacity x nsys */
    uint32_t nsys;
} rt_telemetry;

/* What keel_metrics_write reads (runtime/metrics.c). A scrape runs on any
 * thread while the runtime ticks: the tick thread publishes a copy of its
 * plain counters under `mu` at the end of each step, with a trylock, so a
 * scrape holding `mu` makes it skip one publication and never wait; every
 * other figure is an atomic or a fixed-bucket histogram. */
typedef struct rt_metrics {
    pthread_mutex_t mu;            /* the fields below marked (mu); a scrape holds it while it writes */
    keel_runtime_stats pub;        /* rt->stats and the recovery time at the last publication (mu) */
    uint32_t pub_entities;         /* live entities at the last tick's end (mu) */
    uint64_t pub_skipped;          /* grid ticks the tick multiplier left out, summed (mu) */
    struct dur_state *dur;         /* rt->dur once recovered, NULL before it closes (mu) */
    _Atomic uint64_t *sys_ns;      /* per system (tel.nsys): time run, ns; one writer, the tick thread (a
                                      scrape reads); the array is replaced under mu */
    uint64_t skipped;              /* pub_skipped's source (tick thread) */
    core_hist tick_hist;           /* tick durations, ns (tick thread observes) */
} rt_metrics;

struct keel_runtime {
    keel_world *world;
    txn_state txn;                 /* transactions, the unit of work, views (txn/) */
    sched_exec ex;                 /* the schedule, the worker pool, per-system tick state (sched/) */
    double tick_rate_hz;           /* < 0: unthrottled */
    uint64_t interval_ns;          /* 1e9 / tick_rate_hz, the budget at 1x; 0 when unthrottled */
    uint64_t next_deadline_ns;     /* the metronome's next grid point after the last run (driver.c) */
    float base_dt;                 /* 1 / tick_rate_hz (1/60 unthrottled) */
    float dt;                      /* of the running tick: base_dt x tick_mult */
    uint64_t watchdog_ns;
    keel_hook_fn on_first_tick;
    void *hook_user;
    bool first_tick_done;

    _Atomic uint64_t tick;         /* ticks completed (txn.running_tick: tick + 1 while running) */

    /* on_first_tick's commands, pending when their playback failed */
    keel_cmdbuf *hook_cmds;
    bool hook_pending;
    /* sync point: where a failed playback stopped (order position, task) */
    bool sync_pending;
    uint32_t sync_pos, sync_task;

    rt_telemetry tel;
    keel_runtime_stats stats;
    rt_metrics met;

    txn_part hook_part;            /* on_first_tick's transaction */
    txn_vec hook_changes;

    /* durability (durable/): NULL without a data directory */
    struct dur_state *dur;
    keel_durable_desc durable_desc;
    char *data_dir;
    bool recovered;                /* keel_runtime_recover ran */
    int recover_rc;
    char recover_error[512];       /* the failed recovery's sentence, repeated on later calls */
    keel_recovery recovery;
    uint64_t fence_ns;             /* the last tick's fence */
    uint64_t sync_end_ns;          /* the last sync point's end (the fence starts there) */
    bool tick_ckpt;                /* a checkpoint was in progress when the running tick started */
    struct runtime_repl *repl;     /* replication (runtime/replication.c); NULL: not replicated */

    /* overload (runtime/overload.c; fed by driver.c). ovl is the driver's:
     * it changes only between ticks, and tick_level / tick_mult copy it at
     * each tick's start for the systems (dispatch reads them). */
    bool ovl_enabled;              /* configured on and the runtime is throttled */
    ovl_state ovl;
    keel_overload_fn on_critical;
    void *critical_user;
    _Atomic uint32_t ovl_pub;      /* level | multiplier << 8, for keel_runtime_overload */
    uint32_t tick_mult;            /* of the running tick (its level: ex.tick_level) */
    uint64_t last_actual_ns, last_target_ns; /* the last tick, as the detector sees it */
    uint64_t (*tick_cost)(void *user, uint64_t tick, uint64_t measured_ns); /* test seam */
    void *tick_cost_user;

    /* TickDriver */
    pthread_t driver;
    _Atomic bool driver_running;
    _Atomic bool stop_requested;
    pthread_mutex_t stop_lock;     /* with stop_cond: the metronome's sleep, which a stop cuts short (driver.c) */
    pthread_cond_t stop_cond;      /* CLOCK_MONOTONIC */
    int driver_status;
    uint64_t (*clock_ns)(void *user);     /* injectable for tests */
    void (*wait_until)(uint64_t deadline_ns, void *user);
    void *clock_user;

    /* watchdog thread */
    pthread_t watchdog;
    bool watchdog_running;
    pthread_mutex_t watchdog_lock;
    pthread_cond_t watchdog_cond;
    bool watchdog_quit;
};


/* runtime.c: one tick (keel_runtime_step without the driver check). */
int runtime_step(keel_runtime *rt);

/* runtime/durability.c: close the data directory (the transaction layer
 * stops logging first). */
void runtime_close_data_dir(keel_runtime *rt);

/* runtime/watchdog.c */
int watchdog_start(keel_runtime *rt);
void watchdog_stop(keel_runtime *rt);

/* runtime/telemetry.c */
int telemetry_init(keel_runtime *rt, uint32_t capacity);
int telemetry_size(keel_runtime *rt, uint32_t nsys);
/* Record the tick (adds the systems' watchdog reports to it). */
void telemetry_record(keel_runtime *rt, keel_tick_record *tick);
/* Set the checkpoint flag of a recorded tick (a checkpoint it started). */
void telemetry_mark_checkpoint(keel_runtime *rt, uint64_t tick);
/* Wait for the tick's unit the workers serialise between ticks
 * (fence_join), then complete its tick's record: the stored bytes and the
 * fence's whole time. The stepping thread, before a step, a retry, a
 * telemetry read or closing the data directory. */
void runtime_fence_join(keel_runtime *rt);
void telemetry_fini(keel_runtime *rt);

/* runtime/replication.c: the world's WAL on a NATS JetStream stream
 * (libkeel_repl) tied to durable/'s seams. repl_create copies the
 * descriptor (keel_runtime_create); repl_before_open brings the directory
 * in step with the stream and, for a primary, takes the lease and appends
 * its EPOCH record (before dur_open, which it tells whether it opens a
 * follower's directory); repl_after_open starts a primary's publisher;
 * repl_close stops it (clean: lets the lease go once everything is
 * published) before dur_close, after repl_closing. */
int repl_create(keel_runtime *rt, const keel_replication_desc *d);
int repl_before_open(keel_runtime *rt, dur_open_desc *o);
int repl_after_open(keel_runtime *rt);
/* repl_close's view of the stream: in, whether it already missed the
 * close's deadline (do not wait for it again); out, how far it holds the
 * primary's records, of those the directory holds. */
typedef struct repl_close_info {
    bool stream_behind;
    uint64_t published, committed;
} repl_close_info;
/* KEEL_OK, or KEEL_EUNAVAILABLE: a sync primary's stream does not hold
 * every record the directory does; KEEL_EFENCED: another primary
 * appended. info may be NULL. */
int repl_close(keel_runtime *rt, bool clean, repl_close_info *info);
/* A replica's bootstrap (repl_before_open loads the stream's checkpoint as
 * it arrives): repl_loaded gives recovery's result to the directory's copy
 * of it (KEEL_OK: commit, in the background); repl_settle waits for that
 * commit -- called before anything writes the directory (a poll, a
 * checkpoint, closing) -- and latches the runtime fatal if it failed. */
void repl_loaded(keel_runtime *rt, int rc);
int repl_settle(keel_runtime *rt);
void repl_free(keel_runtime *rt);
/* False on a standby or follower: it applies its primary's ticks. */
bool repl_may_tick(const keel_runtime *rt);
/* A close begins: a sync primary's untimed waits wait for its stream
 * DRAIN_MS from now at most (dur_stream_deadline): a stream out of reach
 * must not hold a close for ever. */
void repl_closing(keel_runtime *rt);

/* runtime/metrics.c */
void metrics_init(keel_runtime *rt);
void metrics_fini(keel_runtime *rt);
/* Publish the plain counters for a scrape: at a step's end (wait false:
 * skipped while a scrape holds the lock) and after opening the data
 * directory (wait true). */
void metrics_publish(keel_runtime *rt, bool wait);
/* The data directory closes: a scrape no longer reads it. */
void metrics_forget_dur(keel_runtime *rt);
/* The schedule changes (keel_runtime_set_schedule, with metrics_lock held):
 * per-system counters for nsys systems, zeroed. */
int metrics_size(keel_runtime *rt, uint32_t nsys);
void metrics_lock(keel_runtime *rt);
void metrics_unlock(keel_runtime *rt);
/* The counters as keel_runtime_stats_get reports them, from base (rt->stats,
 * or the published copy) and the live atomics of the durability state d
 * (may be NULL). */
void stats_compose(const keel_runtime *rt, const keel_runtime_stats *base, const struct dur_state *d,
                   keel_runtime_stats *out);

/* runtime/driver.c: the wait strategy of the metronome, exposed for tests. */
typedef enum rt_wait_phase { RT_WAIT_DONE, RT_WAIT_SLEEP, RT_WAIT_YIELD, RT_WAIT_SPIN } rt_wait_phase;
rt_wait_phase driver_wait_phase(uint64_t now_ns, uint64_t deadline_ns);
#define RT_SPIN_NS 50000ull        /* spin the last 50 µs */
#define RT_SLEEP_SLACK_NS 1000000ull /* sleep until 1 ms before the deadline, then yield */

/* runtime/driver.c: feed the last tick to the overload detector and act on
 * its verdict (stats, log, on_critical_overload). */
void overload_after_tick(keel_runtime *rt);
/* Publish rt->ovl for keel_runtime_overload. */
void overload_publish(keel_runtime *rt);

/* Test hook: the tick's measured duration becomes cost(user, tick,
 * measured_ns) -- in its telemetry record and for the overload detector --
 * so tests drive the detector without timing anything. NULL restores. */
void runtime_test_set_tick_cost(keel_runtime *rt, uint64_t (*cost)(void *user, uint64_t tick, uint64_t measured_ns),
                                void *user);

/* Test hook: replace the metronome's clock and wait (NULL restores them). */
void runtime_test_set_clock(keel_runtime *rt, uint64_t (*clock_ns)(void *user),
                            void (*wait_until)(uint64_t deadline_ns, void *user), void *user);

#endif
