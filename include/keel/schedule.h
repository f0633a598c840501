/*
 * keel/schedule.h -- the static schedule: Track -> DAG -> Phase -> System.
 *
 * A schedule is declared once (tracks, systems with their access), then
 * built: keel_schedule_build derives the ordering edges from the declared
 * access, validates them, and fixes a deterministic execution order. A built
 * schedule is installed on its runtime (keel_runtime_set_schedule) and run
 * every tick. docs/scheduling.md has the rules in full.
 *
 * Thread-safety: declare and build from one thread, before ticks run.
 */
#ifndef KEEL_SCHEDULE_H
#define KEEL_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "keel/component.h"
#include "keel/query.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_runtime keel_runtime; /* keel/runtime.h */
typedef struct keel_schedule keel_schedule;
typedef struct keel_ctx keel_ctx;

#define KEEL_TRACK_ENGINE_PRE "Engine-Pre"
#define KEEL_TRACK_PUBLIC "Public"
#define KEEL_TRACK_ENGINE_POST "Engine-Post"

#define KEEL_ACCESS_MAX 16   /* entries per access list */
#define KEEL_EDGE_MAX 16     /* entries per after/before list */

typedef enum keel_system_kind {
    KEEL_SYSTEM_CALLBACK = 0, /* one call of `run` */
    KEEL_SYSTEM_QUERY = 1,    /* `each_chunk` once per chunk of `query`; `parallel` spreads chunks over workers */
    KEEL_SYSTEM_PIPELINE = 2, /* `pipeline(index)` for index in [0, pipeline_count), over an atomic counter */
} keel_system_kind;

/* A callback system's body. Return 0 on success; a non-zero return (or
 * keel_txn_fail) fails the system: its commands are dropped and its
 * transitive successors are skipped this tick. */
typedef int (*keel_system_fn)(keel_ctx *ctx, void *user);
/* A query system's body, called once per chunk (it.count rows). */
typedef int (*keel_chunk_fn)(keel_ctx *ctx, const keel_iter *it, void *user);
/* A pipeline system's body, called once per index, on any worker, with no
 * transaction and no command buffer. */
typedef int (*keel_pipeline_fn)(uint32_t index, uint32_t count, void *user);

/* Declared access. Lists end at the first 0 / NULL. Components are ids;
 * resources and events are names chosen by the application. */
typedef struct keel_access {
    keel_component reads[KEEL_ACCESS_MAX];          /* sees whatever is current; must not overlap a writer.
                                                       A query term declared in no list counts as read. */
    keel_component reads_fresh[KEEL_ACCESS_MAX];    /* ordered after every writer of the component */
    keel_component reads_snapshot[KEEL_ACCESS_MAX]; /* the previous tick's value; VERSIONED only */
    keel_component writes[KEEL_ACCESS_MAX];
    /* Written, and a query system's body overwrites every row of every
     * chunk it visits: the iterator hands it a fresh, uninitialised version
     * of the column (it.columns[i]) beside the current values (it.prev[i]),
     * so nothing is copied first. Counts as a write everywhere. */
    keel_component rewrites[KEEL_ACCESS_MAX];
    keel_component side_writes[KEEL_ACCESS_MAX];    /* written through side transactions; counts as a write */
    const char *resources_read[KEEL_ACCESS_MAX];
    const char *resources_write[KEEL_ACCESS_MAX];
    const char *events_produce[KEEL_ACCESS_MAX];
    const char *events_consume[KEEL_ACCESS_MAX];
    bool exclusive;                                 /* runs alone: no other system of its track overlaps it */
} keel_access;

/* What the overload detector may shed (keel/runtime.h, docs/overload.md).
 * From SYSTEM_THROTTLING on: LOW systems are skipped (KEEL_SKIP_THROTTLED),
 * NORMAL ones run on one tick in `throttled_tick_divisor`; HIGH and
 * CRITICAL ones run every tick. From SCOPE_REDUCTION on, query systems with
 * an entity_budget honour it, except CRITICAL ones. A throttled system is
 * not a failure: its successors run. */
typedef enum keel_priority {
    KEEL_PRIORITY_LOW = -1,
    KEEL_PRIORITY_NORMAL = 0,
    KEEL_PRIORITY_HIGH = 1,
    KEEL_PRIORITY_CRITICAL = 2,
} keel_priority;

typedef struct keel_system_desc {
    const char *name;        /* required, unique in the schedule; 1 to KEEL_NAME_MAX (63) bytes of
                                UTF-8 without control characters, as for components */
    const char *track;       /* NULL = "Public"; a user track declared with keel_schedule_add_track */
    const char *dag;         /* NULL = "main"; phases order systems of one DAG only (access
                                rules and explicit edges still apply across the DAGs of a track) */
    uint32_t phase;          /* phase inside the DAG; lower phases first where access conflicts */
    keel_system_kind kind;
    keel_system_fn run;              /* CALLBACK */
    keel_chunk_fn each_chunk;        /* QUERY */
    keel_query_desc query;           /* QUERY */
    bool parallel;                   /* QUERY: split chunks into tasks across workers */
    uint32_t min_chunk_rows;         /* QUERY+parallel: rows per task at least; 0 = 64 */
    keel_pipeline_fn pipeline;       /* PIPELINE */
    uint32_t pipeline_count;         /* PIPELINE: number of indices */
    void *user;                      /* handed to the body */
    keel_access access;
    const char *after[KEEL_EDGE_MAX];  /* run after these systems (names; forward references fine) */
    const char *before[KEEL_EDGE_MAX]; /* run before these systems */
    keel_priority priority;            /* 0 = NORMAL; see keel_priority */
    /* QUERY: from SCOPE_REDUCTION on, visit at most this many rows per tick,
     * resuming next tick where this one stopped (a pass over the query's rows
     * spans several ticks; the rows left for later are reported as
     * `deferred` in the telemetry). A budget may end inside a chunk: the
     * iterator then covers part of it. 0 = no budget. */
    uint32_t entity_budget;
} keel_system_desc;

typedef uint32_t keel_system;  /* index in registration order */

/* Diagnostics of keel_schedule_build. Codes are stable. */
typedef enum keel_sched_code {
    KEEL_SCHED_UNKNOWN_SYSTEM = 1,     /* after/before names a system that does not exist */
    KEEL_SCHED_DUPLICATE_SYSTEM,       /* two systems with one name */
    KEEL_SCHED_CYCLE,                  /* the ordering has a cycle; names = the cycle, first repeated last */
    KEEL_SCHED_WRITE_CONFLICT,         /* two writers of one component/resource without ordering */
    KEEL_SCHED_READ_CONFLICT,          /* a plain reader beside a writer without ordering */
    KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, /* reads_snapshot of a SINGLE_VERSION or TRANSIENT component */
    KEEL_SCHED_EXCLUSIVE_CONFLICT,     /* an exclusive system could overlap another system */
    KEEL_SCHED_UNKNOWN_TRACK,          /* system names a track that was not declared */
    KEEL_SCHED_RESERVED_TRACK,         /* a user track named Engine-..., or a system on an Engine- track */
    KEEL_SCHED_BAD_SYSTEM,             /* malformed descriptor (missing body, bad query ...) */
    KEEL_SCHED_READ_BEFORE_WRITE,      /* warning: a reader ordered before a writer sees the previous tick */
} keel_sched_code;

typedef enum keel_sched_severity {
    KEEL_SCHED_ERROR = 0,
    KEEL_SCHED_WARNING = 1,
} keel_sched_severity;

#define KEEL_SCHED_DIAG_NAMES 8

typedef struct keel_sched_diag {
    keel_sched_code code;
    keel_sched_severity severity;
    uint32_t name_count;
    const char *names[KEEL_SCHED_DIAG_NAMES]; /* systems (and the component/resource/track last, where one is involved) */
    const char *message;                       /* one sentence, e.g. "cycle: a -> b -> c -> a" */
} keel_sched_diag;

/* Stable name of a diagnostic code: "SCHED_CYCLE", ... */
const char *keel_sched_code_name(keel_sched_code code);

/* A new, empty schedule for rt. Errors: KEEL_EINVAL, KEEL_ENOMEM. */
int keel_schedule_create(keel_runtime *rt, keel_schedule **out);
/* NULL is ignored, and so is a schedule installed with
 * keel_runtime_set_schedule: the runtime owns it from then on and frees it in
 * keel_runtime_close (or when another schedule replaces it). A schedule never
 * installed must be destroyed before its runtime is closed. */
void keel_schedule_destroy(keel_schedule *s);

/* Declare a user track; tracks run in declaration order between Public and
 * Engine-Post. Its name follows the rules of system names. Errors:
 * KEEL_EINVAL (bad name: empty, longer than KEEL_NAME_MAX bytes, not UTF-8
 * or holding a control character; names starting "Engine-" are reserved), KEEL_EEXIST, KEEL_EBUSY (schedule already built). */
int keel_schedule_add_track(keel_schedule *s, const char *name);

/* Declare a system; *out (may be NULL) receives its index. The descriptor and
 * its strings are copied. Most checks happen at build, so that one build
 * reports every problem; this fails only on what cannot be stored:
 * KEEL_EINVAL (NULL desc; name, track or dag name empty, longer than
 * KEEL_NAME_MAX bytes, not valid UTF-8 or holding a control character: the
 * last error says which, and the offending byte's offset), KEEL_EBUSY (already built), KEEL_ENOMEM. */
int keel_schedule_add_system(keel_schedule *s, const keel_system_desc *desc, keel_system *out);

/* Derive edges, validate, and fix the order. Returns 0 when no error was
 * found (warnings allowed), KEEL_EINVAL otherwise (keel_last_error names the
 * first error), or KEEL_ENOMEM when memory ran out on the way (the
 * diagnostics may then be incomplete). Either way the diagnostics are
 * listed by keel_schedule_diag_count / keel_schedule_diag, in a
 * deterministic order. Building twice is KEEL_EBUSY: after a failed build,
 * destroy the schedule and make a new one. */
int keel_schedule_build(keel_schedule *s);

uint32_t keel_schedule_diag_count(const keel_schedule *s);
/* The i-th diagnostic, or NULL past the end. Valid while s lives. */
const keel_sched_diag *keel_schedule_diag(const keel_schedule *s, uint32_t i);

/* 64-bit FNV-1a over the execution order: for every track in order, the
 * track name and a NUL; then for each of its systems in order, the name and
 * a NUL, the execution-order positions of its successors as u32 little
 * endian ascending, and ff ff ff ff (docs/scheduling.md). 0 before a
 * successful build. */
uint64_t keel_schedule_hash(const keel_schedule *s);

/* Number of systems, and a system's name / position in execution order. */
uint32_t keel_schedule_system_count(const keel_schedule *s);
const char *keel_schedule_system_name(const keel_schedule *s, keel_system sys);
/* Execution order: the i-th system to be considered (tracks in order, Kahn
 * order with the smallest registration index first inside a track). */
keel_system keel_schedule_order(const keel_schedule *s, uint32_t i);

#ifdef __cplusplus
}
#endif
#endif
