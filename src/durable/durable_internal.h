/*
 * durable/durable_internal.h -- durability: the fence that turns
 * a tick's unit of work into WAL records (fence.c), the WAL writer thread
 * with group commit (writer.c), checkpoints (checkpoint.c) and recovery at
 * open (recover.c). docs/durability.md describes the protocols; the record
 * format is libkeel_wal's (docs/wal-format.md).
 *
 * The data's path: system transaction -> unit of work (txn/uow.c) -> fence
 * (records, compressed in parallel on the workers) -> writer queue (LSNs
 * handed out at enqueue, so queue order is LSN order) -> one LMDB write
 * transaction per batch, synced (the group commit) -> durable LSN published,
 * waiters woken -> recovery replays the same records.
 */
#ifndef KEEL_DURABLE_INTERNAL_H
#define KEEL_DURABLE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/core.h"
#include "core/hist.h"
#include "keel/durability.h"
#include "keel/txn.h"
#include "keel_wal/wal.h"
#include "txn/txn_internal.h"
#include "world/world_internal.h"

typedef struct ckpt_job ckpt_job;

/* What the writer commits: a run of sealed records (one tick's batch, the
 * hook's unit), side transactions queued together (DUR_SIDES, from
 * dur_enqueue_side: one record to be, which the writer builds, turning the
 * item into DUR_RECORDS), a checkpoint, or a flush request. */
typedef enum dur_item_kind { DUR_RECORDS, DUR_CHECKPOINT, DUR_FLUSH, DUR_SIDES } dur_item_kind;

typedef struct dur_item {
    struct dur_item *next;
    dur_item_kind kind;
    keel_durability mode;      /* resolved: IMMEDIATE, GROUP or DEFERRED */
    uint64_t first_lsn, last_lsn; /* the records' LSN range (0, 0 when none) */
    uint64_t tick;             /* a tick batch: the tick it completes (0 otherwise) */
    bool empty_tick;           /* only the TICK_COMMIT of a tick that changed nothing */
    kw_buf recs;               /* sealed records, back to back */
    ckpt_job *ckpt;            /* DUR_CHECKPOINT */
    uint64_t queued_ns;        /* when dur_enqueue queued it (the commit latency's start) */
    size_t queued;             /* bytes it added to queued_bytes */
    uint64_t side_tick;        /* DUR_SIDES: the transactions' tick (a record's header tick) */
    uint32_t nsides;           /* DUR_SIDES: transactions in recs (a SIDES payload, count not set) */
    bool pending;              /* its LSNs reserved, its records still being built (fence.c "Between
                                  ticks"; under mu): the writer takes nothing from it on */
} dur_item;

/* Something to run once an LSN is durable (a ticket's completion). */
typedef struct dur_waiter {
    struct dur_waiter *next;
    uint64_t lsn;
    void (*done)(void *arg, int rc);
    void *arg;
} dur_waiter;

typedef struct dur_pin dur_pin;

/* The seam replication plugs into (runtime/ installs it with dur_repl_set
 * before the first record is queued; zeroed: no replication). The writer
 * hands `staged` each batch's sealed records (LSNs first_lsn..last_lsn,
 * back to back in recs) before it commits them, so the stream
 * can take them while the disk syncs -- on its thread without d->mu (it may
 * send), while `repl_staging` says so -- and tells `committed` after each
 * LMDB commit, with d->mu held. Neither may call back into durable/; once
 * dur_repl_set (which waits out a `staged` call) replaced the hook, the old
 * one is never called again. With `gate` (sync replication) a record counts as
 * durable -- waiters, tickets, flush -- only once it is both committed and
 * acknowledged by the stream (dur_acknowledge), in whichever order. */
typedef struct dur_repl_hook {
    void *self;
    void (*staged)(void *self, uint64_t first_lsn, uint64_t last_lsn, const void *recs, size_t len);
    void (*committed)(void *self, uint64_t lsn);
    bool gate;
    size_t record_max;         /* the most bytes a record may have on the stream (its max_payload; 0: none) */
} dur_repl_hook;

#define DUR_SPANS 1024                  /* writer commits kept for the trace */

typedef struct dur_state {
    keel_world *world;
    txn_state *txn;            /* whose unit of work the fence logs */
    core_pool pool;            /* the fence's parallel serialisation */
    char *dir;                 /* the data directory */
    keel_durable_desc desc;    /* as configured (dir: this dir) */
    kw_store *store;
    keel_durability mode;      /* the runtime's mode for ticks */
    kw_codec_ctx **codec;      /* one per worker (fence tasks) */
    kw_codec_ctx *side_codec;  /* side records (the writer thread's) */
    kw_buf side_payload;       /* scratch for side records (under side_lock) */
    kw_buf side_build;         /* the writer's scratch for the side records it builds */
    uint32_t ncodec;
    kw_buf *fence_payload;     /* one per worker: the fence's payload scratch */
    struct fence_seg *segs;    /* the fence's segments (tick thread; buffers kept across ticks) */
    uint32_t segs_cap;
    struct fence_bg *fence_bg; /* the unit the workers serialise between ticks (fence.c) */

    /* ---- the writer queue (mu) ---------------------------------------------------------
     * Producers (the tick thread, side commits under side_lock) take mu,
     * hand out LSNs from next_lsn, seal their records and append: queue
     * order is LSN order, which MDB_APPEND needs. The writer takes the queue
     * at once, up to its first pending item (a tick's unit whose records the
     * workers still build, its LSNs reserved: fence.c). DEFERRED items are held by the writer until something
     * needs a sync (an IMMEDIATE or GROUP item, a flush, a checkpoint), or
     * DUR_DEFER_MAX_BYTES / DUR_DEFER_MAX_NS pass. */
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* the writer waits for work */
    pthread_cond_t durable_cv; /* waiters wait for the durable LSN */
    dur_item *head, *tail;
    size_t queued_bytes;
    uint64_t next_lsn;
    uint64_t covered_lsn;      /* the last checkpoint captured covers up to here: no coalescing */
    dur_waiter *waiters;       /* sorted by LSN */
    bool quit;
    /* published by the writer (also read without mu) */
    _Atomic uint64_t durable_lsn;
    _Atomic uint64_t durable_tick;
    _Atomic uint64_t tick_lsn;     /* the last tick's TICK_COMMIT marker (fence_tick; 0 before the first) */
    _Atomic int fatal;         /* 0, or the KEEL_E* code that latched the runtime */
    _Atomic uint64_t local_lsn;    /* committed to LMDB (durable_lsn trails it while the hook gates) */
    uint64_t local_tick;           /* the tick local_lsn completes (under mu) */
    uint64_t stream_lsn;           /* the stream acknowledged up to here (dur_acknowledge; under mu) */
    uint64_t stream_deadline;      /* CLOCK_MONOTONIC ns after which a gated untimed wait stops waiting
                                      for the stream (dur_stream_deadline; 0: never; under mu) */
    bool trim_to_stream;       /* checkpoints delete no WAL record beyond stream_unit_lsn: a stream's
                                  directory not opened as a replica, or since its promotion (under
                                  mu; never cleared) */
    uint64_t stream_unit_lsn;  /* the last commit's end the stream acknowledged: a unit boundary (mu) */
    uint64_t *ends;            /* with trim_to_stream, the ends of commits the stream has not
                                  acknowledged yet, oldest first: a ring of DUR_ENDS (mu) */
    uint32_t ends_head, ends_n;
    dur_repl_hook repl;
    bool repl_staging;         /* the writer is in repl.staged, outside mu (dur_repl_set waits; durable_cv) */
    /* a follower (dur_open_desc.follow): records replicated into the
     * directory are applied up to here; an unfinished unit after it waits
     * for the rest of its records */
    uint64_t applied_lsn;
    bool follow;
    uint64_t stop_tick;
    pthread_t thread;
    bool thread_running;

    /* the writer's last commits, for the trace (under mu) */
    struct dur_span {
        uint64_t start_ns, ns, bytes, last_lsn;
    } spans[DUR_SPANS];
    uint64_t nspans;           /* commits recorded so far (index = nspans % DUR_SPANS) */

    /* counters (writer thread; read racily for telemetry) */
    _Atomic uint64_t fsyncs, wal_bytes, wal_raw_bytes;
    _Atomic uint64_t wal_records; /* records committed (wal_bytes: their stored bytes) */
    /* histograms for the metrics exposition (runtime/metrics.c reads them while
     * they fill; dur_metrics_init gives them their buckets) */
    core_hist commit_hist;     /* ns from an item's hand-off (dur_enqueue) until its records are durable */
    core_hist fsync_hist;      /* ns of the LMDB commit: page writes, fdatasync, the meta page's sync */
    core_hist group_hist;      /* records per synced commit (the group commit's size) */
    core_hist ckpt_hist;       /* ns from a checkpoint's capture until the writer recorded it */
    uint64_t bytes_since_ckpt;

    /* ---- checkpoints (checkpoint.c) ---- */
    int64_t ckpt_every_ticks;
    int64_t ckpt_every_bytes;
    double ckpt_every_seconds;
    bool wal_retain;           /* checkpoints keep the WAL they cover */
    uint64_t last_ckpt_tick;       /* the last attempt's tick and time: the pacing counts from them, so a */
    uint64_t last_ckpt_ns;         /* failed attempt is tried again an interval later, not at every tick */
    _Atomic uint64_t ckpt_recorded_tick; /* the tick of the last checkpoint recorded (or loaded at
                                            recovery): the checkpoint's age counts from it */
    _Atomic uint32_t ckpt_count;   /* checkpoints recorded in the directory (meta) */
    _Atomic uint64_t ckpt_taken;   /* checkpoints this runtime committed */
    pthread_t ckpt_thread;
    bool ckpt_thread_running;
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cv;
    ckpt_job *ckpt_next;       /* handed to the checkpoint thread */
    bool ckpt_busy;            /* a job is being written */
    int ckpt_rc;               /* the first checkpoint that failed (its code), 0 while none did;
                                  running out of memory is not a failure: see ckpt_last_rc */
    _Atomic int ckpt_last_rc;  /* the last job's outcome: 0, or why it was not recorded (KEEL_ENOMEM:
                                  abandoned, the next tick tries again); atomic for ckpt_maybe */
    bool ckpt_quit;
    _Atomic uint64_t step_seq; /* odd while a step or a sync point retry runs: checkpoints serialise between */
    struct ckpt_stored *stored; /* content hashes of what snap holds (checkpoint thread) */
    /* buffers of an in-flight checkpoint are not freed by view reclamation */
    pthread_mutex_t pin_mu;
    _Atomic(dur_pin *) pin;

    int zstd_level;

    /* the fence (tick thread) */
    uint32_t fence_rows_from;  /* the hook's unit was logged up to this group of the unit of work */
    size_t fence_life_from;    /* ... and up to here in its lifecycle log */
    uint64_t fence_raw_bytes, fence_stored_bytes; /* of the last unit */
} dur_state;

#define DUR_DEFER_MAX_BYTES (8u << 20)
#define DUR_DEFER_MAX_NS 1000000000ull
#define DUR_QUEUE_MAX_BYTES (256u << 20) /* a producer waits while more than this is queued */
#define DUR_ENDS 4096                   /* commit ends remembered for the stream (beyond: none taken) */
#define DUR_RECORD_TARGET (64u << 10)    /* fence records aim at this many raw bytes */
#define DUR_SIDES_SCRATCH_MAX (1u << 20) /* the writer keeps a side-record scratch up to this size */
#define DUR_HASH_LOG 10                  /* zstd hashLog of the fence's and side records' codecs ... */
#define DUR_SMALL_HASH_MAX_LEVEL 3       /* ... at levels up to this one (measured: docs/performance.md) */

/* ---- writer.c ------------------------------------------------------------------------ */

int dur_writer_start(dur_state *d);
/* Give the histograms above their buckets (at the state's creation). */
void dur_metrics_init(dur_state *d);
/* Drain the queue (every held record committed) and stop the writer. */
void dur_writer_stop(dur_state *d);
/* Seal the records in item->recs with consecutive LSNs and queue the item
 * (the writer owns it afterwards); *last_lsn (may be NULL) receives the
 * last LSN handed out. Errors: KEEL_EFATAL (item freed). */
int dur_enqueue(dur_state *d, dur_item *item, uint64_t *last_lsn);
/* Queue one side transaction's SIDE payload (flags: its record's). It joins
 * the side transactions queued last when the writer has not taken them yet
 * and they share its mode and tick: one record (SIDES), one LSN, *lsn. */
/* KEEL_EINVAL when a side payload of `bytes` could never be logged (over
 * the WAL's record limit, or over what one message of the replication
 * stream takes). */
int dur_side_fits(dur_state *d, size_t bytes);
int dur_enqueue_side(dur_state *d, keel_durability mode, uint64_t tick, uint32_t flags, const kw_buf *side,
                     uint64_t *lsn);
dur_item *dur_item_new(dur_item_kind kind, keel_durability mode);
void dur_item_free(dur_item *it);
/* Wait until lsn is durable; `flush` forces held DEFERRED records out
 * (keel_flush, close) -- an IMMEDIATE or GROUP record needs no flush.
 * 0, or KEEL_EFATAL. */
int dur_wait(dur_state *d, uint64_t lsn, bool flush);
/* dur_wait for at most timeout_ns (< 0: for ever): KEEL_ETIMEDOUT after it. */
int dur_wait_timed(dur_state *d, uint64_t lsn, bool flush, int64_t timeout_ns);
/* Run done(arg, rc) once lsn is durable (at once when it is): rc 0, or
 * KEEL_EFATAL when the runtime latched before. */
void dur_when_durable(dur_state *d, uint64_t lsn, void (*done)(void *arg, int rc), void *arg);
/* Latch the fatal state (first code wins), wake every waiter. */
void dur_latch_fatal(dur_state *d, int rc);
static inline int dur_fatal(const dur_state *d)
{
    return d ? atomic_load_explicit(&((dur_state *)d)->fatal, memory_order_acquire) : 0;
}
/* Copy up to cap of the writer's most recent commits (oldest first). */
uint32_t dur_spans(dur_state *d, struct dur_span *out, uint32_t cap);
/* Sync replication's acknowledgement: records up to lsn are on the stream
 * (never beyond what LMDB holds); waiters wake. */
void dur_acknowledge(dur_state *d, uint64_t lsn);
/* A follower's directory becomes a primary's: records may be queued again. */
void dur_promote(dur_state *d);
/* From now on an untimed wait for a record the hook gates (sync
 * replication) waits for the local disk, then for the stream until
 * deadline_ns (CLOCK_MONOTONIC) at most: KEEL_EUNAVAILABLE past it. A
 * close's, so that a stream out of reach cannot hold it for ever. */
void dur_stream_deadline(dur_state *d, uint64_t deadline_ns);
/* The stream acknowledges nothing more (a sync primary's close): the
 * waiters of records on the local disk complete with KEEL_EUNAVAILABLE, as
 * a timed wait for them says; nothing latched, the records are on disk. */
void dur_stream_gone(dur_state *d);
/* Install (or, zeroed, remove) the replication hook; on return the writer
 * calls only the new one. */
void dur_repl_set(dur_state *d, dur_repl_hook hook);
/* The last LSN handed out. */
uint64_t dur_last_lsn(dur_state *d);
/* Ask the writer to sync everything up to lsn now (held DEFERRED records
 * included) unless it is durable already: dur_wait's flush, and a read-only
 * IMMEDIATE side transaction, which waits for the last LSN handed out at
 * its commit. Call it outside the side lock (the queue may push back).
 * Without memory for the request the held records still go out with the
 * writer's next sync. 0, or KEEL_EFATAL once the runtime latched. */
int dur_sync_request(dur_state *d, uint64_t lsn);
/* Queue item pending: nfirst LSNs reserved for records still to be built,
 * then the sealed records of `tail` (not the item's yet) take the next
 * ones; *last_lsn = the tail's last. `bytes`: what it will hold, for the
 * back-pressure. Errors as dur_enqueue (the item is freed). */
int dur_enqueue_reserved(dur_state *d, dur_item *item, uint32_t nfirst, kw_buf *tail, uint64_t bytes,
                         uint64_t *last_lsn);
/* Its records are in: the writer may take it. */
void dur_item_complete(dur_state *d, dur_item *item);
/* The same, recorded as covered by a checkpoint being captured. */
uint64_t dur_cover(dur_state *d);

/* ---- fence.c ----------------------------------------------------------------------- */

/* Turn the tick's unit of work into records and queue them (after the sync
 * point). Parallel on the workers; with GROUP or DEFERRED durability and two
 * workers or more, the records are built after the step returns ("Between
 * ticks"). Errors: KEEL_EFATAL, KEEL_ENOMEM (the runtime latches: a tick
 * that cannot be logged must not be acknowledged). */
int fence_tick(dur_state *d, uint64_t tick);
/* What a unit built between ticks took: its tick, its stored bytes and the
 * fence's time from the sync point's end until the writer could take it. */
typedef struct fence_done {
    uint64_t tick, stored, ns;
} fence_done;
/* Wait until the unit fence_tick left to the workers is queued whole (the
 * tick thread, before anything else uses the fence, the pool or the unit of
 * work). true, with *out filled when not NULL, when there was one. */
bool fence_join(dur_state *d, fence_done *out);
/* A unit was posted and not joined yet. */
bool fence_posted(const dur_state *d);
/* A tick starts: nothing of its unit of work is logged yet. */
void fence_tick_start(dur_state *d);
/* on_first_tick's unit: its value rows and its commands, flagged HOOK. */
int fence_hook(dur_state *d, uint64_t tick);
/* The commands keel_runtime_sync_retry applied (lifecycle log from
 * life_from): a unit of their own for `tick` (HOOK: the hook's commands). */
int fence_retry(dur_state *d, uint64_t tick, bool hook, size_t life_from);
/* Encode and queue one side transaction (under side_lock, after it applied). */
int fence_side(dur_state *d, uint64_t seq, keel_durability mode, uint64_t tick, size_t side_off, uint64_t *lsn);
/* Free the fence's scratch (at close). */
void fence_fini(dur_state *d);
/* Serialise a SCHEMA payload of the world's components. */
int fence_schema_payload(dur_state *d, kw_buf *out);

/* ---- checkpoint.c ------------------------------------------------------------------ */

int ckpt_start(dur_state *d);
void ckpt_stop(dur_state *d);
void ckpt_fini(dur_state *d);
/* Tick end: take a checkpoint of the completed tick when one is due
 * (force: now). Never stalls for the writing; copies SINGLE_VERSION data. */
int ckpt_maybe(dur_state *d, uint64_t tick, bool force);
/* A step begins, or ends (runtime/, the stepping thread, once at each
 * edge): the checkpoint thread serialises between steps (checkpoint.c,
 * "pacing"). */
void ckpt_step_edge(dur_state *d);
/* Wait until every checkpoint taken so far is committed: 0, or
 * KEEL_EFATAL when one failed or the runtime latched. */
int ckpt_wait(dur_state *d);
/* True while a checkpoint is in progress: captured and not yet recorded
 * (telemetry's per-tick flag). */
bool ckpt_active(dur_state *d);
/* The writer's part, inside its write transaction (after it appended the
 * job's CHECKPOINT marker): snap puts and deletes, meta, covered WAL. */
int ckpt_write(dur_state *d, kw_wtxn *txn, ckpt_job *job);
/* After the writer committed (rc 0) or failed. */
void ckpt_committed(dur_state *d, ckpt_job *job, int rc);
void ckpt_job_free(ckpt_job *job);
/* View reclamation: true when buf belongs to an in-flight checkpoint (it
 * is then freed when the checkpoint has read it). */
bool dur_pin_hold(dur_state *d, void *buf);
/* A checkpoint pins published buffers now (the publisher's question only:
 * pins are taken on its thread, so the answer cannot turn true under it). */
bool dur_pin_active(dur_state *d);
/* Record what a loaded snap chunk holds (recovery), so the next checkpoint
 * skips it when unchanged. */
int ckpt_stored_note(dur_state *d, const void *key, size_t klen, uint64_t hash);

/* ---- recover.c --------------------------------------------------------------------- */

/* A checkpoint's snap entries one at a time, in the order kw_snap_iter
 * gives them ("T", the "S" pages, the "C" chunks, "K"): the directory's
 * own, or those a replica bootstraps from (runtime/replication.c). next
 * returns 1 with an entry (valid until the load ends), 0 after the last,
 * or a KEEL_E* error. */
typedef struct dur_snap_src {
    void *self;
    int (*next)(void *self, const void **key, size_t *klen, const void **val, size_t *vlen);
} dur_snap_src;

/* A checkpoint recovery loads from elsewhere than the directory
 * (dur_open_desc.boot): its meta "checkpoint" value and schema record as a
 * directory holds them, and its snap entries. Recovery then reads no
 * checkpoint, schema or WAL from the directory: the caller gives the
 * directory the same checkpoint and an empty WAL on its own, and nothing
 * writes the directory before that is done. */
typedef struct dur_boot {
    const void *meta, *schema;
    size_t meta_len, schema_len;
    dur_snap_src src;
} dur_boot;

/* What opening a data directory needs from the runtime. */
typedef struct dur_open_desc {
    const char *dir;
    const keel_durable_desc *desc;
    keel_durability mode;      /* the runtime's default (resolved) */
    keel_world *world;
    txn_state *txn;
    core_pool pool;            /* pool.workers: one codec context per worker */
    bool follow;               /* a replica's directory: an unfinished unit at the end of the WAL
                                  is not a bad tail but records whose unit has not arrived yet */
    uint64_t stop_tick;        /* a follower replays no tick after this one (0: no bound) */
    bool replicated;           /* the runtime replicates the directory (a directory marked as a stream's
                                  but opened without replication is logged: its checkpoints keep the WAL) */
    kw_store *store;           /* the directory's store, already open and owned (KW_OPEN_OWN), or NULL:
                                  dur_open takes it in every case, so the directory's lock is never let go
                                  between the caller's work on it (replication's catch-up) and recovery */
    const dur_boot *boot;      /* the checkpoint to load instead of the directory's (NULL: the directory's) */
} dur_open_desc;

/* Open the data directory, recover it into the world (checkpoint + WAL
 * replay), start the writer and checkpoint threads. *out is set as soon as
 * the state exists, also on failure: the caller closes it. */
int dur_open(const dur_open_desc *o, dur_state **out, keel_recovery *rec);
/* Does the world's registration extend the schema record `rec` (1), or
 * match it (0)? KEEL_EINVAL (a component registered otherwise, in a
 * sentence naming it) or KEEL_ECORRUPT (an unreadable record). */
int dur_schema_extends(const keel_world *w, const void *rec, size_t len);
void dur_close(dur_state *d);
/* A follower's directory grew: replication appended records up to
 * last_lsn. Adopt them (the next LSN, the durable LSN) and apply every
 * complete unit after the applied LSN through recovery's replay (a
 * follower: up to dur_open_desc.stop_tick). *tick: the last tick applied
 * (in: the one before). On failure the units before the failing one stay
 * applied (*tick and the applied LSN say so, and the next call starts
 * after them); a unit that failed after changing the world latches d
 * fatal with the code, since it can be neither undone nor applied again. */
int dur_follow(dur_state *d, uint64_t last_lsn, uint64_t *tick);

/* ---- log.c ------------------------------------------------------------------------- */

/* The transaction layer's logging interface, implemented on a dur_state
 * (self). */
extern const txn_log_ops dur_txn_log;

#endif
