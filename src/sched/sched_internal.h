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

#include <stdbool.h>
#include <stdint.h>

#include "keel/schedule.h"
#include "world/world_internal.h"

/* A system's component access as sets, for the transaction layer's checks
 * (computed at build). */
typedef struct sched_access {
    world_compset read;       /* reads, reads_fresh, reads_snapshot, and query terms declared nowhere */
    world_compset snapshot;   /* reads_snapshot */
    world_compset write;      /* writes and rewrites */
    world_compset rewrite;    /* rewrites */
    world_compset side;       /* side_writes */
} sched_access;

typedef struct sched_system {
    keel_system_desc d;       /* strings point into owned copies */
    uint32_t track;           /* index into the plan's tracks (resolved at build) */
    uint32_t dag;             /* schedule-wide DAG id (resolved at build) */
    keel_query *query;        /* QUERY systems: created at build on the runtime's world */
    sched_access acc;
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

/* Free a schedule whatever its state (the runtime frees the installed one). */
void schedule_free(keel_schedule *s);

#endif
