/*
 * sched/sched_internal.h -- the built schedule as the dispatcher sees it.
 *
 * After keel_schedule_build the schedule is a fixed plan: an execution order
 * (tracks in order, Kahn order inside a track), successor lists in CSR form
 * and predecessor counts. The dispatcher walks the plan every tick; nothing
 * in it changes after build.
 */
#ifndef KEEL_SCHED_INTERNAL_H
#define KEEL_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "keel/schedule.h"
#include "keel/telemetry.h"
#include "txn/txn_internal.h"
#include "world/world_internal.h"

#define SCHED_NONE UINT32_MAX
#define SCHED_MAX_WORKERS 64

typedef struct sched_system {
    keel_system_desc d;       /* strings point into owned copies */
    uint32_t track;           /* index into the plan's tracks (resolved at build) */
    uint32_t dag;             /* schedule-wide DAG id (resolved at build) */
    keel_query *query;        /* QUERY systems: created at build on the runtime's world */
    txn_access acc;
} sched_system;

typedef struct sched_track {
    const char *name;
    uint32_t first, count;    /* range of the execution order */
    uint32_t roots_first, roots_count; /* range of `roots`: systems without predecessors */
} sched_track;

struct keel_schedule {
    keel_runtime *rt;
    keel_world *world;
    bool built;               /* keel_schedule_build ran */
    bool ok;                  /* ... and found no error */
    bool oom;                 /* ... and ran out of memory (a diagnostic may be missing): KEEL_ENOMEM */
    bool installed;           /* owned by its runtime since keel_runtime_set_schedule */
    uint32_t registry_stamp;  /* component count at build: a change makes the schedule stale */

    char **user_tracks;
    uint32_t nuser_tracks;

    sched_system *sys;
    uint32_t nsys, sys_cap;

    char **owned;             /* every string the schedule copied */
    uint32_t nowned, owned_cap;

    keel_sched_diag *diags;
    uint32_t ndiags, diags_cap;

    /* The plan (valid when ok). */
    sched_track *tracks;      /* Engine-Pre, Public, user tracks ..., Engine-Post */
    uint32_t ntracks;
    uint32_t *order;          /* nsys system indices */
    uint32_t *succ_off;       /* nsys + 1 offsets into succ */
    uint32_t *succ;           /* successor system indices */
    uint32_t *npred;          /* predecessor count per system */
    uint32_t *roots;          /* per track, its systems without predecessors, in order */
    uint64_t hash;
};

/* keel_schedule_create's body: a schedule for runtime rt (opaque here),
 * whose systems query world w. */
int schedule_create(keel_runtime *rt, keel_world *w, keel_schedule **out);
/* Free a schedule whatever its state (the runtime frees the installed one). */
void schedule_free(keel_schedule *s);

/* ---- the executor (dispatch.c) ---------------------------------------------------- */

/* Per-system state of the running tick. Fields written by several workers
 * are atomics; the rest are written by the one thread that owns the step
 * they belong to (see sched/dispatch.c for the protocol). Per-run fields
 * are reset when the system is made ready, readiness fields when it
 * completes, so starting a tick touches none of them. */
typedef struct sched_run {
    /* hot: cache-line aligned, so workers finishing neighbouring systems
     * never share a line */
    alignas(64) _Atomic uint32_t preds_left; /* predecessors not yet completed */
    _Atomic uint32_t dep_failed;   /* a predecessor failed or was skipped */
    _Atomic bool started;          /* a task of this run has claimed the telemetry start (dispatch.c) */
    _Atomic uint32_t tasks_done;
    _Atomic int fail_rc;           /* first failing task's code, 0 = none */
    _Atomic uint64_t rows;
    _Atomic uint64_t watchdog_tick; /* tick of the last run the watchdog reported */
    uint32_t ntasks;               /* set when the system becomes ready */
    uint32_t worker;               /* telemetry of this run */
    uint64_t start_ns, end_ns;
    keel_skip_reason skip;
    /* the task ranges of this run, range w worker w's home: (lo << 32 | hi),
     * room for `workers` (dispatch.c "Task ranges", core/ranges.c) */
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
} sched_run;

/* What each worker is running, for the watchdog. */
typedef struct sched_watch {
    alignas(64) _Atomic uint64_t since_ns; /* 0 = idle; one line per worker */
    _Atomic uint32_t sys;
    _Atomic uint64_t tick;
} sched_watch;

/* A parallel-for on the pool (dispatch.c, "parallel-for"). */
typedef struct sched_job {
    void (*fn)(void *arg, uint32_t i, uint32_t worker);
    void (*finish)(void *arg);     /* a posted job's: called by whoever completes the last index */
    void *arg;
    uint32_t n;
    _Atomic uint32_t next, done;
    _Atomic bool finished;         /* a posted job's finish has returned */
} sched_job;

typedef struct sched_pool {
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
    _Atomic(struct sched_job *) job;  /* dispatch_for's job while one runs, else NULL */
    _Atomic bool quit;
    _Atomic int stepper_cpu;       /* the stepping thread's CPU at the last epoch bump (a hint) */
    alignas(64) _Atomic uint32_t remaining; /* systems of the current track not completed */
    /* the ready queue: single-use slots, reset per track */
    alignas(64) _Atomic uint32_t head;
    alignas(64) _Atomic uint32_t tail;
    _Atomic uint32_t *tickets;
    uint32_t tickets_cap;
} sched_pool;

/* Per-worker scratch lists for completion (sized to the schedule) and the
 * worker's share of the tick's counters, summed by the stepping thread at
 * tick end. One cache line each. */
typedef struct sched_scratch {
    alignas(64) uint32_t *ready, *stack;
    uint32_t run, failed, skipped, throttled;
    uint32_t commits, aborts;      /* system transactions */
} sched_scratch;

/* The executor: the worker pool and the per-system state of the running
 * tick. runtime/ embeds one and fills the fields above `st`. */
typedef struct sched_exec {
    keel_runtime *rt;              /* opaque here: handed to system bodies in their keel_ctx */
    txn_state *txn;
    keel_world *world;
    uint32_t workers;
    keel_overload_level tick_level; /* of the running tick (set before it starts) */
    uint32_t ovl_divisor;          /* throttled_tick_divisor */
    keel_schedule *sched;          /* the installed schedule */
    sched_run *st;                 /* per system */
    sched_watch watch[SCHED_MAX_WORKERS];
    sched_pool pool;
    sched_scratch *scratch;        /* one per worker */
    core_clock clock;              /* systems' start and end stamps; anchored by dispatch_anchor */
    sched_job posted;              /* dispatch_post's job */
    bool is_posted;                /* posted and not joined yet */
} sched_exec;

int dispatch_init(sched_exec *ex);
void dispatch_fini(sched_exec *ex);
/* Size per-schedule dispatch state (ready queue) once a schedule is installed. */
int dispatch_prepare(sched_exec *ex);
/* Reset system s's tick state (at install, and by its completer each tick). */
void dispatch_reset_system(sched_exec *ex, uint32_t s);
/* Anchor the clock that stamps systems to the real clock, before a tick's
 * tracks run (on the thread that dispatches them); returns CLOCK_MONOTONIC
 * now. */
uint64_t dispatch_anchor(sched_exec *ex);
/* Run every system of track t to completion (or skip). */
void dispatch_track(sched_exec *ex, const sched_track *t);
/* Run fn(arg, i, worker) for every i in [0, n) on the pool; returns when all ran. */
void dispatch_for(sched_exec *ex, uint32_t n, core_task_fn fn, void *arg);
/* Start the same on the workers and return; finish(arg) runs after the
 * last index. dispatch_join: the caller helps, then waits for finish. Only
 * the stepping thread, with no track or parallel-for in between. */
void dispatch_post(sched_exec *ex, uint32_t n, core_task_fn fn, void (*finish)(void *), void *arg);
void dispatch_join(sched_exec *ex);
/* The pool as the layers below runtime/ take it (core_pool). */
core_pool dispatch_pool(sched_exec *ex);

#endif
