/*
 * txn/txn_internal.h -- the transaction layer: system transactions (txn.c),
 * side transactions and row versions (side.c), submitted closures and
 * tickets (submit.c), the per-tick unit of work (uow.c) and published read
 * views (view.c). docs/transactions.md describes the isolation rules.
 */
#ifndef KEEL_TXN_INTERNAL_H
#define KEEL_TXN_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "keel/txn.h"
#include "keel/view.h"
#include "keel_wal/wal.h"
#include "world/world_internal.h"
#include <urcu/wfcqueue.h>

typedef struct keel_runtime keel_runtime;
typedef struct txn_state txn_state;

/* A system's component access as sets, for the transaction layer's checks
 * (computed by the schedule build, sched/schedule.c). */
typedef struct txn_access {
    world_compset read;       /* reads, reads_fresh, reads_snapshot, and query terms declared nowhere */
    world_compset snapshot;   /* reads_snapshot */
    world_compset write;      /* writes and rewrites */
    world_compset rewrite;    /* rewrites */
    world_compset side;       /* side_writes */
} txn_access;

/* A chunk column: (table id, chunk index, column index). */
typedef struct txn_touch {
    uint32_t table, chunk, col;
    uint32_t worker;           /* the worker whose task wrote it: the capture's home for it (uow.c) */
} txn_touch;

typedef struct txn_vec {
    txn_touch *v;
    uint32_t n, cap;
} txn_vec;

int txn_vec_reserve(txn_vec *v, uint32_t extra);
static inline void txn_vec_push(txn_vec *v, txn_touch t)
{
    v->v[v->n++] = t; /* after txn_vec_reserve */
}

/* One task's share of a system transaction. The tasks of a parallel query
 * system share the chunk columns' `priv` pointers (first CAS wins); each
 * part lists the private versions it installed and the SINGLE_VERSION chunk
 * columns it marked dirty first, so commit and abort need no lock. */
typedef struct txn_part {
    txn_vec priv;
    txn_vec dirty;
    keel_side_txn *open;       /* side transactions opened in this task, not yet ended */
} txn_part;

void txn_part_fini(txn_part *p);

#define TXN_NO_SYSTEM UINT32_MAX

/* The context handed to a system body: one per task run, on the stack of the
 * worker running it, carrying the task's share of the system transaction.
 * `rt` is opaque below runtime/: only keel_ctx_* (runtime/) look inside. */
struct keel_ctx {
    keel_runtime *rt;
    txn_state *txn;
    uint32_t sys;             /* TXN_NO_SYSTEM in a hook */
    uint32_t task;
    uint32_t worker;
    const char *name;
    keel_cmdbuf *cmds;
    txn_part *part;           /* NULL in a pipeline system: no transaction */
    const txn_access *acc;    /* declared access; NULL: every component (on_first_tick) */
    int fail_rc;              /* set by keel_txn_fail */
};

/* ---- txn.c ------------------------------------------------------------------ */

/* Point it's columns at what the running system may see and write for the
 * chunk `ref` (snapshot, committed, private or rewrite versions). */
int txn_iter_chunk(keel_ctx *ctx, const keel_query *q, const keel_component *terms, world_chunk_ref ref,
                   keel_iter *it);
/* End a system transaction: commit (publish every private version, list the
 * changed chunk columns in *changes) or abort (free them; SINGLE_VERSION
 * dirt is listed all the same: in-place writes are not rolled back). Commit
 * fails only with KEEL_ENOMEM before changing anything; the caller aborts. */
int txn_commit(keel_world *w, txn_part *parts, uint32_t nparts, txn_vec *changes);
void txn_abort(keel_world *w, txn_part *parts, uint32_t nparts, txn_vec *changes);
/* Abort the side transactions a task left open. */
void txn_close_sides(txn_part *p);

/* ---- side.c ----------------------------------------------------------------- */

typedef struct txn_rowvers txn_rowvers;
int side_init(txn_state *ts);
void side_fini(txn_state *ts);
/* Begin a side transaction with access to every component (closures). */
int side_begin_full(txn_state *ts, keel_durability mode, keel_side_txn **out);
/* Tick end: row versions of this tick are no longer needed. */
void side_tick_end(txn_state *ts);
/* What a commit logged and what its committer waits for. */
typedef struct side_result {
    uint64_t lsn;              /* its record's LSN; 0 when nothing was logged */
    uint64_t wait_lsn;         /* what IMMEDIATE waits for: lsn, or for a read-only commit the last
                                  LSN handed out when it committed; 0 without a log */
    keel_durability mode;      /* resolved */
} side_result;
/* Commit without waiting for durability. */
int side_commit(keel_side_txn *tx, side_result *out);
txn_state *side_state(const keel_side_txn *tx);
/* Wait until the commit logged at `lsn` is durable per mode (IMMEDIATE:
 * synced; others: at once). 0, or KEEL_EFATAL. */
int txn_durable_wait(txn_state *ts, uint64_t lsn, keel_durability mode);

/* ---- keys.c ----------------------------------------------------------------- */

/* The idempotency keys committed during the last `window` ticks: a key
 * committed at tick t is remembered while the committing tick is below
 * t + window. Under side_lock. */
#define TXN_KEYS_DEFAULT_WINDOW 216000u /* 1 h at 60 Hz */

typedef struct txn_key {
    uint64_t key;
    uint64_t tick;             /* the tick it committed in */
    uint64_t lsn;              /* the record that holds it; 0: read from disk or a stream (durable), no log, or a
                                  failed log_side (which latched fatal first: no retry gets this far) */
} txn_key;

typedef struct txn_keys {
    txn_key *map;              /* open addressing, key 0 = empty */
    uint32_t map_cap, map_n;
    txn_key *ring;             /* commit order (a power-of-two ring), for expiry */
    uint32_t ring_cap, ring_head, ring_n;
    uint64_t window;
} txn_keys;

/* window 0: TXN_KEYS_DEFAULT_WINDOW. */
void keys_init(txn_keys *k, uint64_t window);
void keys_fini(txn_keys *k);
/* Forget the keys that are no longer remembered at tick `now`. */
void keys_expire(txn_keys *k, uint64_t now);
/* The key's entry when it is remembered at tick now, else NULL. */
const txn_key *keys_find(const txn_keys *k, uint64_t key, uint64_t now);
/* Room for `extra` more keys (then keys_add cannot fail). */
int keys_reserve(txn_keys *k, uint32_t extra);
void keys_add(txn_keys *k, uint64_t key, uint64_t tick, uint64_t lsn);
uint32_t keys_count(const txn_keys *k);
/* A copy of the keys remembered at `now`, in commit order (*out NULL when
 * none; the caller frees it). */
int keys_snapshot(const txn_keys *k, uint64_t now, txn_key **out, uint32_t *n);

/* ---- submit.c --------------------------------------------------------------- */

int submit_init(txn_state *ts);
/* keel_submit's body (runtime/ holds the public entry point). */
int submit_enqueue(txn_state *ts, keel_submit_fn fn, void *arg, keel_durability mode, keel_ticket **out);
/* Engine-Pre: run every closure queued so far, in order. */
void submit_run(txn_state *ts);
/* The runtime latched fatal: complete every queued closure, unrun, with
 * rc (the stepping thread only). */
void submit_refuse(txn_state *ts, int rc);
/* At close: complete what never ran with KEEL_EBUSY. */
void submit_fini(txn_state *ts);

/* ---- uow.c ------------------------------------------------------------------ */

/* One changed value captured by the unit of work. */
typedef struct uow_row {
    keel_entity entity;
    keel_component component;
    uint32_t size;
    const void *value;
} uow_row;

/* One side transaction's after-image, as it will go to the WAL. */
typedef struct uow_side {
    uint64_t seq;
    uint64_t tick;
    keel_durability mode;
    uint32_t nwrites;
    uint64_t key;              /* its idempotency key, 0 = none */
} uow_side;

/* The unit of work of one tick: the changes the fence turns into
 * WAL records. With `capture` on (the durability layer turns it on; tests
 * do), it holds after the user tracks every changed durable value (VERSIONED:
 * rows whose bytes differ from the tick-start version, and the rows side
 * transactions wrote this tick in the chunk columns it logs; SINGLE_VERSION:
 * every row of a dirty chunk), after the sync point every lifecycle command
 * applied, and at any time the side transactions committed this tick. */
/* A worker's capture buffer: the groups it captured this tick, back to
 * back, and its scratch of changed row indices. */
typedef struct uow_wbuf {
    unsigned char *p;
    size_t len, cap;
    uint32_t *idx, *merged;    /* a chunk column's rows to log; merged: idx with the side-written ones */
    uint32_t idx_cap, merged_cap;
} uow_wbuf;

/* A row of a chunk column: (table, chunk, column, row in the chunk). */
typedef struct uow_cell {
    uint32_t table, chunk, col, row;
} uow_cell;

/* Where a captured group is: wbuf[buf].p + off, n rows. */
typedef struct uow_ref {
    uint32_t buf;
    uint32_t n;
    size_t off;
} uow_ref;
#define UOW_REF_OOM UINT32_MAX

typedef struct txn_uow {
    bool capture;
    uow_ref *groups;           /* value rows: the captured groups, in capture order */
    uint32_t ngroups, groups_cap;
    uint32_t hook_rows_end;    /* groups before it are on_first_tick's (captured before its commands) */
    uint32_t nrows;
    uow_wbuf *wbuf;            /* one per worker (a worker appends only to its own) */
    uint32_t nwbuf, nwbuf_used;
    txn_touch *flat;           /* capture scratch: the durable touches, in order */
    uint32_t nflat, flat_cap;
    uint32_t *by_worker;       /* capture scratch: flat's indices grouped by the touches' workers */
    uint32_t by_worker_cap;
    _Atomic uint64_t *homes;   /* capture scratch: worker w's part of by_worker (core_range_*) */
    uint32_t *home_end;        /* capture scratch: where each worker's part ends */
    uint32_t nhomes, homes_cap, home_end_cap;
    const txn_vec **lists;     /* capture scratch: the systems' change lists, in order */
    uint32_t lists_cap;
    uow_cell *cells;           /* capture scratch: the rows side transactions wrote this tick, sorted */
    uint32_t ncells, cells_cap;
    world_lifecycle_log lifecycle;
    unsigned char *side;       /* side records, in commit order (under the side lock) */
    size_t side_len, side_cap;
    uint32_t nside;
    bool oom;                  /* a capture ran out of memory: the change set is incomplete */
} txn_uow;

/* Below this many rows in the touched chunks the capture runs on the
 * caller: waking the workers costs more than it saves. */
#define UOW_PARALLEL_ROWS 16384u

/* Room for the change lists of n systems (uow_capture's input, filled by
 * the caller in execution order); NULL when out of memory (or n is 0). */
const txn_vec **uow_lists(txn_uow *u, uint32_t n);
/* After the user tracks: capture the value changes of the committed system
 * transactions' lists (from uow_lists, in execution order; NULL with n > 0:
 * there was no memory for them), one task per chunk column on the pool when there
 * are enough rows. */
void uow_capture(txn_state *ts, const txn_vec **lists, uint32_t n);
/* Capture one list (on_first_tick's, before its commands are applied). */
void uow_capture_changes(txn_state *ts, const txn_vec *changes);
/* A new tick starts: forget the previous tick's change set. */
void uow_reset(txn_uow *u);
void uow_fini(txn_uow *u);
/* Side records (under side_lock): reserve room, then begin + one write
 * per row. */
int uow_side_reserve(txn_uow *u, uint32_t nwrites, uint32_t value_bytes);
void uow_side_begin(txn_uow *u, uint64_t seq, uint64_t tick, keel_durability mode, uint32_t nwrites, uint64_t key);
void uow_side_write(txn_uow *u, keel_entity e, keel_component c, uint32_t size, const void *value);
/* A captured group, in the TICK_CHUNK group layout (libkeel_wal's
 * KW_GROUP_HDR header, n u64 entities, n values). */
#define UOW_GROUP_HDR KW_GROUP_HDR
typedef struct uow_group {
    keel_component component;
    uint32_t size, n;
    const unsigned char *entities, *values;
} uow_group;

static inline uow_group uow_group_at(const txn_uow *u, uint32_t gi)
{
    const uow_ref *r = &u->groups[gi];
    const unsigned char *p = u->wbuf[r->buf].p + r->off;
    uow_group g;
    kw_group_header_get(p, &g.component, &g.size, &g.n);
    g.entities = p + UOW_GROUP_HDR;
    g.values = g.entities + (size_t)g.n * 8;
    return g;
}

/* Iterate the captured rows / side records: *off starts at 0. A value-row
 * cursor is a group's index, with the row's index inside the group in the
 * bits above UOW_ROW_SHIFT; after a group's last row it is the next group's
 * index (so a unit's end, ngroups or hook_rows_end, is reached exactly). */
#define UOW_ROW_SHIFT 40
#define UOW_OFF_MASK (((size_t)1 << UOW_ROW_SHIFT) - 1)
bool uow_next_row(const txn_uow *u, size_t *off, uow_row *out);
bool uow_next_side(const txn_uow *u, size_t *off, uow_side *out, size_t *writes_off);
bool uow_next_side_row(const txn_uow *u, size_t *off, uow_row *out);

/* ---- view.c ----------------------------------------------------------------- */

int view_init(txn_state *ts);
/* Publish the live world as the view of `tick`; the previous view is freed
 * after an RCU grace period together with the versions only it held.
 * Fails only with KEEL_ENOMEM, changing nothing. */
int view_publish(txn_state *ts, uint64_t tick);
/* keel_view_begin's body (runtime/ holds the public entry point). */
int view_begin(txn_state *ts, const keel_view **out);
void view_fini(txn_state *ts);
/* Wait until every view reclamation queued so far has run (before the
 * durability state they consult goes away). */
void view_quiesce(void);

/* ---- the transaction layer's state ---------------------------------------------- */

/* How txn/ logs and waits for durability: a narrow table that durable/
 * implements (durable/log.c) and runtime/ installs when a data directory
 * opens. Every function takes the implementation's `self`. */
typedef struct txn_log_ops {
    /* Encode and queue the side transaction whose after-image starts at
     * side_off in the unit of work (under side_lock); *lsn its LSN. */
    int (*log_side)(void *self, uint64_t seq, keel_durability mode, uint64_t tick, size_t side_off, uint64_t *lsn);
    /* Can a side transaction of this many payload bytes be logged at all?
     * KEEL_EINVAL (with the sentence) when its record would be over a limit:
     * asked before anything is applied, so a refusal changes nothing. */
    int (*side_fits)(void *self, size_t bytes);
    /* The last LSN handed out. */
    uint64_t (*last_lsn)(void *self);
    /* Ask for everything up to lsn to be synced now (outside side_lock). */
    int (*sync_request)(void *self, uint64_t lsn);
    /* Wait until lsn is durable (flush: force held DEFERRED records out);
     * timeout_ns < 0 waits for ever, else KEEL_ETIMEDOUT after it. */
    int (*wait_durable)(void *self, uint64_t lsn, bool flush, int64_t timeout_ns);
    /* Run done(arg, rc) once lsn is durable. */
    void (*when_durable)(void *self, uint64_t lsn, void (*done)(void *arg, int rc), void *arg);
    /* Latch the fatal state (first code wins); the latched code, or 0. */
    void (*latch_fatal)(void *self, int rc);
    int (*fatal)(void *self);
    /* View reclamation: true when buf is still read by an in-flight
     * checkpoint (which then frees it). */
    bool (*pin_hold)(void *self, void *buf);
    /* True while a checkpoint pins published buffers (no recycling). */
    bool (*pin_active)(void *self);
} txn_log_ops;

typedef struct txn_log {
    const txn_log_ops *ops;    /* NULL: no data directory, nothing is logged */
    void *self;
} txn_log;

static inline int txn_log_fatal(const txn_log *l)
{
    return l->ops ? l->ops->fatal(l->self) : 0;
}

/* Counters of the transactions this layer ends itself (side
 * transactions); system transactions are counted by their dispatcher.
 * Changed under side_lock; atomic so that a metrics scrape on another
 * thread reads them without taking it. */
typedef struct txn_counts {
    _Atomic uint64_t commits, aborts, conflicts;
    _Atomic uint64_t already;      /* refused with KEEL_EALREADY: the key committed before */
} txn_counts;

/* Everything the transaction layer owns; runtime/ embeds one. */
struct txn_state {
    keel_world *world;
    keel_durability durability;    /* the default mode */
    txn_log log;
    core_pool pool;                /* the unit of work's parallel capture */
    _Atomic uint64_t running_tick; /* the tick being run (set by the stepping thread) */
    /* Side transactions serialise their reads, validation and commits on
     * side_lock (a system transaction's private version and a side write
     * into the same chunk column meet on that column's colver_lock). */
    pthread_mutex_t side_lock;
    txn_rowvers *rowvers;
    txn_keys keys;                 /* idempotency keys (keys.c; under side_lock) */
    uint64_t side_seq;             /* sequence of the last side commit (under side_lock) */
    uint64_t side_commits_tick;    /* side commits this tick (under side_lock) */
    txn_counts counts;             /* changed under side_lock, read anywhere */
    /* keel_submit's queue (lock-free, multi-producer; drained at Engine-Pre) */
    struct cds_wfcq_head submit_head;
    struct cds_wfcq_tail submit_tail;
    /* the published read view (view.c) */
    _Atomic(keel_view *) view;
    _Atomic uint32_t readers;      /* views open now (see view.c) */
    uint64_t pub_mutations;        /* world->mutations when the view was published */
    txn_uow uow;
};

/* Set up / tear down a state over world w (side lock, row versions, the
 * submit queue, the view). */
int txn_state_init(txn_state *ts, keel_world *w, keel_durability mode);
void txn_state_fini(txn_state *ts);

#endif
