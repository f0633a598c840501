/*
 * tools/keel-wal/state.h -- the world state rebuilt offline from a data
 * directory, for `keel-wal replay` and `keel-wal diff`.
 *
 * The model keeps exactly what keel_world_hash covers and nothing about
 * storage placement: per entity slot its generation and, when live, the
 * entity's components (ids in order, values by the stored schema's sizes).
 * Building it replicates recovery (src/durable/recover.c): the checkpoint,
 * then the WAL in LSN order -- value rows and lifecycle commands in whole
 * units closed by their TICK_COMMIT, side transactions where they stand --
 * with the same consistency checks (consecutive LSNs, the commit marker's
 * record count and entity counts, spawns producing the logged handles), so
 * a directory recovery refuses is refused here too, naming the LSN.
 *
 * "The state at tick N" is the world right after tick N completed: every
 * record up to the first one that belongs to a later tick (a unit of tick
 * > N, on_first_tick's included, or a side transaction that ran during a
 * later tick). Side transactions that committed after tick N's unit while
 * no later tick ran (on_shutdown's) are part of it; so is what recovery
 * would load for a directory whose last completed tick is N.
 */
#ifndef KEEL_TOOLS_STATE_H
#define KEEL_TOOLS_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "kwt.h"

/* One live entity: its component ids in increasing order, then their
 * values back to back in the same order (sizes from the schema). */
typedef struct kws_ent {
    uint32_t n;               /* components */
    uint32_t bytes;           /* value bytes */
    unsigned char data[];     /* n ids (u8), then the values */
} kws_ent;

typedef struct kws_state {
    const kw_schema *schema;  /* the stored schema (ids, sizes, disciplines) */
    uint32_t size[256];       /* per component id: value bytes (from the schema) */
    bool transient[256];      /* per component id: TRANSIENT (left out of the hash) */
    uint32_t nslots, cap;     /* slots ever used; allocated */
    uint32_t nlive;
    uint32_t *gen;            /* per slot: the live entity's generation, or the next occupant's */
    kws_ent **ent;            /* per slot: NULL = free */
    uint64_t *free_bits;      /* bit i = slot i < nslots is free (the allocator's lowest-free rule) */
    uint32_t free_hint;       /* no free slot in words below it */
} kws_state;

void kws_state_init(kws_state *s, const kw_schema *schema);
void kws_state_free(kws_state *s);
/* A deep copy (dst is initialised by the call). KEEL_ENOMEM. */
int kws_state_clone(kws_state *dst, const kws_state *src);
/* keel_world_hash of the state: bit-identical to the runtime's. */
uint64_t kws_state_hash(const kws_state *s);
/* The live entity e, NULL when e is not live (null, stale, never used). */
const kws_ent *kws_state_get(const kws_state *s, uint64_t e);
/* The value of component `id` in ent (NULL when ent lacks it). */
const unsigned char *kws_ent_value(const kws_state *s, const kws_ent *ent, uint32_t id);
static inline uint32_t kws_ent_id(const kws_ent *ent, uint32_t i)
{
    return ent->data[i];
}

/* ---- building the state at a tick --------------------------------------- */

/* Where the replay stands and how it got there (for messages and --json). */
typedef struct kws_info {
    bool from_checkpoint;     /* the checkpoint was loaded */
    uint64_t checkpoint_tick; /* the directory's checkpoint (0: none) */
    uint64_t checkpoint_lsn;
    uint64_t first_lsn, last_lsn; /* the WAL's bounds (0 when empty) */
    uint64_t start_lsn;       /* the first LSN the replay read */
    uint64_t lsn;             /* the last LSN applied (or covered by the checkpoint) */
    uint64_t records;         /* WAL records read */
    uint64_t units, sides;    /* tick units and side transactions applied */
    uint64_t last_tick;       /* the last completed tick seen so far */
} kws_info;

typedef struct kws_replay kws_replay;

/* Prepare a replay of d that will be asked for ticks >= first_tick:
 * loads the checkpoint when its tick <= first_tick (unless no_checkpoint),
 * else starts from the empty world at LSN 1. From here a damaged data file
 * is a finding (exit 1), not a bad argument. Returns 0; or KWT_EXIT_PROBLEM
 * after printing why (the WAL no longer reaches back to first_tick, a
 * corrupt checkpoint or record naming the LSN, no schema), or
 * KWT_EXIT_USAGE (the directory cannot be read). */
int kws_replay_open(kwt_dir *d, uint64_t first_tick, bool no_checkpoint, kws_replay **out);
/* Apply records until the state is the one at the end of `tick` (>= the
 * last one asked). 0, or KWT_EXIT_PROBLEM after printing why (tick beyond
 * the last completed tick, a corrupt record naming its LSN). */
int kws_replay_to(kws_replay *r, uint64_t tick);
kws_state *kws_replay_state(kws_replay *r);
const kws_info *kws_replay_info(const kws_replay *r);
void kws_replay_close(kws_replay *r);

/* ---- the arguments replay and diff share --------------------------------- */

typedef struct kws_args {
    const char *dir;
    bool json, no_checkpoint;
} kws_args;

/* A word the command has no option of its own for: --json, --no-checkpoint,
 * or the data directory (one only; "-" is a name); any other word starting
 * with '-' is an unknown option. 0, or KWT_EXIT_USAGE after the usage
 * error. kws_need_dir ends the loop: the usage error when no directory was
 * given. */
int kws_arg(const char *cmd, const char *arg, kws_args *a);
int kws_need_dir(const char *cmd, const kws_args *a);

#endif
