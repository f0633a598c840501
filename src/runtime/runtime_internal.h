/*
 * runtime/runtime_internal.h -- the runtime's state: the world it owns, the
 * installed schedule, per-system tick state, the worker pool, the telemetry
 * ring. Shared by runtime/, sched/dispatch.c and (later) txn/.
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
#include <urcu/wfcqueue.h>

#include "runtime/overload.h"
#include "sched/sched_internal.h"
#include "txn/txn_internal.h"
#include "durable/durable_internal.h"
#include "world/world_internal.h"

#define RT_NONE UINT32_MAX
#define RT_MAX_WORKERS 64

/* The context handed to a system body: one per task run, on the stack of the
 * worker running it, carrying the task's share of the system transaction. */
struct keel_ctx {
    keel_runtime *rt;
    uint32_t sys;             /* RT_NONE in a hook */
    uint32_t task;
    uint32_t worker;
    const char *name;
    keel_cmdbuf *cmds;
    txn_part *part;           /* NULL in a pipeline system: no transaction */
    const sched_access *acc;  /* declared access; NULL: every component (on_first_tick) */
    int fail_rc;              /* set by keel_txn_fail */
};

/* Per-system state of the running tick. Fields written by several workers
 * are atomics; the rest are written by the one thread that owns the step
 * they belong to (see sched/dispatch.c for the protocol). Per-run fields
 * are reset when the system is made ready, readiness fields when it
 * completes, so starting a tick touches none of them. */
typedef struct rt_sys {
    /* hot: cache-line aligned, so workers finishing neighbouring systems
     * never share a line */
    alignas(64) _Atomic uint32_t preds_left; /* predecessors not yet completed */
    _Atomic uint32_t dep_failed;   /* a predecessor failed or was skipped */
    _Atomic uint32_t next_range;   /* next home range to hand to a ticket holder (dispatch.c) */
    _Atomic bool started;          /* a task of this run has claimed the telemetry start (dispatch.c) */
    _Atomic uint32_t tasks_done;
    _Atomic int fail_rc;           /* first failing task's code, 0 = none */
    _Atomic uint64_t rows;
    _Atomic uint64_t watchdog_tick; /* tick of the last run the watchdog reported */
    uint32_t ntasks;               /* set when the system becomes ready */
    uint32_t worker;               /* telemetry of this run */
    uint64_t start_ns, end_ns;
    keel_skip_reason skip;
    /* the task ranges of this run, one per ticket holder: (lo << 32 | hi),
     * workers entries (dispatch.c "Task ranges") */
    _Atomic uint64_t *ranges;
    uint32_t nranges;
    /* QUERY systems: the chunks of this tick, split into ntasks tasks */
    uint32_t nchunks, chunks_cap;
    world_chunk_ref *chunks;
    /* entity budget (overload SCOPE_REDUCTION): where the next tick resumes,
     * in rows of the query's iteration order, and the rows this tick left */
    uint64_t cursor;
    uint64_t deferred;
    /* cold, on a line of its own: one command buffer and one transaction
     * part per task (callback and query systems); read by the sync point and
     * the unit of work, written only when they grow */
    alignas(64) keel_cmdbuf **cmds;
    txn_part *parts;
    uint32_t ncmds;                /* also the number of parts */
    txn_vec changes;               /* chunk columns this run changed first (the unit of work's input) */
} rt_sys;

/* What each worker is running, for the watchdog. */
typedef struct rt_watch {
    alignas(64) _Atomic uint64_t since_ns; /* 0 = idle; one line per worker */
    _Atomic uint32_t sys;
    _Atomic uint64_t tick;
} rt_watch;

typedef struct rt_pool {
    uint32_t nthreads;             /* worker threads besides the caller */
    pthread_t *threads;
    /* Futex words (see dispatch.c): epoch wakes parked workers for a track,
     * work_seq wakes idle workers when tickets arrive or the track ends. */
    alignas(64) _Atomic uint32_t epoch;
    _Atomic uint32_t work_seq;
    _Atomic uint32_t sleepers;     /* workers asleep on work_seq */
    _Atomic uint32_t parked;       /* workers asleep on epoch */
    _Atomic uint32_t active;       /* workers inside a track's work loop */
    _Atomic bool track_live;
    _Atomic(struct rt_job *) job;  /* dispatch_for's job while one runs, else NULL */
    _Atomic bool quit;
    alignas(64) _Atomic uint32_t remaining; /* systems of the current track not completed */
    /* the ready queue: single-use slots, reset per track */
    alignas(64) _Atomic uint32_t head;
    alignas(64) _Atomic uint32_t tail;
    _Atomic uint32_t *tickets;
    uint32_t tickets_cap;
} rt_pool;

/* Per-worker scratch lists for completion (sized to the schedule) and the
 * worker's share of the tick's counters, summed by the stepping thread at
 * tick end. One cache line each. */
typedef struct rt_scratch {
    alignas(64) uint32_t *ready, *stack;
    uint32_t run, failed, skipped, throttled;
    uint32_t commits, aborts;      /* system transactions */
} rt_scratch;

typedef struct rt_telemetry {
    uint32_t capacity, mask;
    keel_tick_record *ticks;
    keel_system_record *systems;   /* capacity x nsys */
    uint32_t nsys;
} rt_telemetry;

struct keel_runtime {
    keel_world *world;
    uint32_t workers;
    double tick_rate_hz;           /* < 0: unthrottled */
    uint64_t interval_ns;          /* 1e9 / tick_rate_hz, the budget at 1x; 0 when unthrottled */
    uint64_t next_deadline_ns;     /* the metronome's next grid point after the last run (driver.c) */
    float base_dt;                 /* 1 / tick_rate_hz (1/60 unthrottled) */
    float dt;                      /* of the running tick: base_dt x tick_mult */
    uint64_t watchdog_ns;
    keel_hook_fn on_first_tick;
    void *hook_user;
    bool first_tick_done;

    keel_schedule *sched;
    rt_sys *st;                    /* per system */
    rt_watch watch[RT_MAX_WORKERS];
    rt_pool pool;
    rt_scratch *scratch;           /* one per worker */

    _Atomic uint64_t tick;         /* ticks completed */
    _Atomic uint64_t running_tick; /* the tick being run (tick + 1 while running) */

    /* on_first_tick's commands, pending when their playback failed */
    keel_cmdbuf *hook_cmds;
    bool hook_pending;
    /* sync point: where a failed playback stopped (order position, task) */
    bool sync_pending;
    uint32_t sync_pos, sync_task;

    rt_telemetry tel;
    keel_runtime_stats stats;

    /* transactions (txn/) */
    keel_durability durability;    /* the runtime's default mode */
    txn_part hook_part;            /* on_first_tick's transaction */
    txn_vec hook_changes;
    txn_uow uow;
    /* Side transactions serialise their reads, validation and commits (and a
     * system transaction's creation of a private version, which must not
     * race a side commit to the same chunk) on side_lock. */
    pthread_mutex_t side_lock;
    txn_rowvers *rowvers;
    uint64_t side_seq;             /* sequence of the last side commit (under side_lock) */
    uint64_t side_commits_tick;    /* side commits this tick (under side_lock) */
    /* keel_submit's queue (lock-free, multi-producer; drained at Engine-Pre) */
    struct cds_wfcq_head submit_head;
    struct cds_wfcq_tail submit_tail;
    /* the published read view (txn/view.c) */
    _Atomic(keel_view *) view;
    _Atomic uint32_t readers;      /* views open now (see view.c) */
    uint64_t pub_mutations;        /* world->mutations when the view was published */

    /* durability (durable/): NULL without a data directory */
    struct dur_state *dur;
    keel_durable_desc durable_desc;
    char *data_dir;
    bool recovered;                /* keel_runtime_recover ran */
    int recover_rc;
    char recover_error[512];       /* the failed recovery's sentence, repeated on later calls */
    keel_recovery recovery;
    uint32_t fence_rows_from;  /* the hook's unit was logged up to this group of the unit of work */
    size_t fence_life_from;    /* ... and up to here in its lifecycle log */
    uint64_t fence_raw_bytes, fence_stored_bytes, fence_ns; /* of the last tick */
    uint64_t sync_end_ns;          /* the last sync point's end (the fence starts there) */
    bool tick_ckpt;                /* a checkpoint was in progress when the running tick started */

    /* overload (runtime/overload.c; fed by driver.c). ovl is the driver's:
     * it changes only between ticks, and tick_level / tick_mult copy it at
     * each tick's start for the systems (dispatch reads them). */
    bool ovl_enabled;              /* configured on and the runtime is throttled */
    ovl_state ovl;
    uint32_t ovl_divisor;          /* throttled_tick_divisor */
    keel_overload_fn on_critical;
    void *critical_user;
    _Atomic uint32_t ovl_pub;      /* level | multiplier << 8, for keel_runtime_overload */
    keel_overload_level tick_level;
    uint32_t tick_mult;
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

uint64_t rt_now_ns(void);

/* runtime.c: one tick (keel_runtime_step without the driver check). */
int runtime_step(keel_runtime *rt);

/* sched/dispatch.c */
int dispatch_init(keel_runtime *rt);
void dispatch_fini(keel_runtime *rt);
/* Size per-schedule dispatch state (ready queue) once a schedule is installed. */
int dispatch_prepare(keel_runtime *rt);
/* Reset system s's tick state (at install, and by its completer each tick). */
void dispatch_reset_system(keel_runtime *rt, uint32_t s);
/* Run every system of track t to completion (or skip). */
void dispatch_track(keel_runtime *rt, const sched_track *t);
/* Run fn(arg, i, worker) for every i in [0, n) on the pool; returns when all ran. */
void dispatch_for(keel_runtime *rt, uint32_t n, void (*fn)(void *arg, uint32_t i, uint32_t worker), void *arg);

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
void telemetry_fini(keel_runtime *rt);

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
