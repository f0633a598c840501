/*
 * keel/durability.h -- the data directory: write-ahead log, checkpoints and
 * recovery (docs/durability.md has the protocols and guarantees).
 *
 * A runtime created with `durable.dir` set keeps its durable state in that
 * directory (one LMDB environment). Every tick's committed changes go to
 * the WAL at the tick's end (the fence); side transactions go to the WAL at
 * their commit; a WAL writer thread commits what is queued in one synced
 * LMDB transaction per batch (group commit). Checkpoints write the state of
 * a completed tick and drop the WAL records they cover. Opening the
 * directory again recovers: the last checkpoint, then every later record in
 * LSN order, so the runtime continues where the last durable tick left it,
 * with the same entity handles and the same state hash.
 *
 * With a data directory, durable state changes only inside ticks (systems,
 * on_first_tick, side transactions, submitted closures): keel_set and
 * command buffers applied by hand between ticks are refused with KEEL_EBUSY,
 * because nothing would log them.
 */
#ifndef KEEL_DURABILITY_H
#define KEEL_DURABILITY_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_runtime keel_runtime;   /* keel/runtime.h */
typedef struct keel_side_txn keel_side_txn; /* keel/txn.h */

/* When a commit counts as durable (docs/durability.md). Without a
 * data directory every mode completes at commit. */
typedef enum keel_durability {
    KEEL_DURABLE_DEFAULT = 0,   /* the runtime's mode (GROUP unless configured) */
    KEEL_DURABLE_IMMEDIATE = 1, /* return only after the record is synced to disk */
    KEEL_DURABLE_GROUP = 2,     /* synced by the WAL writer within a bounded window */
    KEEL_DURABLE_DEFERRED = 3,  /* synced at flush, checkpoint or shutdown */
} keel_durability;

/* Part of keel_runtime_desc. Zero = default everywhere; dir NULL = no
 * durability (the world lives in memory only). */
typedef struct keel_durable_desc {
    const char *dir;               /* data directory; created when missing */
    uint64_t map_size;             /* initial LMDB map in bytes; 0 = 64 MiB; grows (doubling) when full */
    uint64_t map_max;              /* the map never grows past this; 0 = 1 TiB (then KEEL_ENOSPC, fatal) */
    int32_t zstd_level;            /* 0 = -1, libkeel_wal's default (KW_CODEC_LEVEL_DEFAULT: a fast level,
                                      measured 9 % less CPU than level 1 for 1 % more bytes,
                                      docs/performance.md); in [-131072, 22] */
    int64_t checkpoint_every_ticks;/* 0 = 3600 ticks; < 0 = never by tick count */
    int64_t checkpoint_every_bytes;/* of WAL written since the last checkpoint; 0 = 64 MiB; < 0 = never */
    double checkpoint_every_seconds;/* 0 = 300 s; < 0 = never by time */
    bool wal_retain;               /* keep WAL records after checkpoints (audit, time travel) */
    bool truncate_bad_tail;        /* recovery: drop an invalid record and everything after it,
                                      instead of refusing to open (KEEL_ECORRUPT) */
    uint64_t idempotency_window_ticks; /* how long side transactions' idempotency keys are remembered,
                                      in ticks (keel_side_txn_set_key); 0 = 216000 (1 h at 60 Hz); also
                                      without a data directory */
    /* run by keel_runtime_close in an IMMEDIATE side transaction with access to every
     * durable component; also without a data directory; its failure is close's result.
     * A keel_submit_fn (keel/txn.h), spelled out: txn.h includes this header. */
    int (*on_shutdown)(keel_side_txn *tx, void *arg);
    void *shutdown_arg;
} keel_durable_desc;

/* What recovery found. */
typedef struct keel_recovery {
    bool fresh;                    /* the directory was new or empty: nothing recovered */
    uint64_t tick;                 /* ticks completed, as recovered (0 when fresh) */
    uint64_t checkpoint_tick;      /* tick of the checkpoint loaded (0: none) */
    uint64_t last_lsn;             /* last LSN replayed or covered */
    uint64_t records;              /* WAL records replayed */
    uint64_t raw_bytes;            /* their payload bytes, uncompressed */
    uint64_t side_txns;            /* side transactions replayed (incl. those of a tick lost in the crash) */
    uint64_t truncated;            /* records dropped by truncate_bad_tail */
    uint64_t ns;                   /* time taken */
} keel_recovery;

/* Open the data directory and recover, after registering every component
 * and before the first tick. Idempotent (a second call reports the first
 * result). keel_runtime_step calls it when the application did not.
 * Errors: KEEL_EINVAL (no data directory configured; a stored component
 * whose id, size, alignment, discipline or fields differ from the
 * registered one -- nothing on disk is changed; the path names a file, not
 * a directory), KEEL_ECORRUPT (an invalid record: the last error names its
 * LSN and why; a data.mdb that is not LMDB; a newer format version; a
 * damaged data.mdb -- empty, truncated, a bad meta page -- refused before
 * anything maps or writes it), KEEL_EIO, KEEL_ENOSPC, KEEL_ENOMEM,
 * KEEL_EBUSY (another runtime, in this or another process, owns the
 * directory: the last error names its pid; or the tick driver runs:
 * keel_runtime_start opens the directory itself before it starts).
 * The runtime owns its directory from here until keel_runtime_close: an
 * exclusive lock on DIR/keel.lock, released by the kernel if the process
 * dies. Read-only readers (keel-wal) are unaffected. */
int keel_runtime_recover(keel_runtime *rt, keel_recovery *out);

/* Make everything so far durable: wait until every tick completed so far
 * and every side transaction committed so far is on disk (DEFERRED records
 * are forced out). 0 at once without a data directory. Errors: KEEL_EINVAL
 * (NULL), KEEL_EFATAL (latched fatal, before or while flushing:
 * keel_runtime_fatal names the cause; or the directory failed to open). */
int keel_flush(keel_runtime *rt);

/* Take a checkpoint of the last completed tick now and wait until it is
 * recorded. Between ticks, from the controlling thread. Errors: KEEL_EINVAL
 * (no data directory), KEEL_EFATAL, KEEL_ENOMEM. */
int keel_checkpoint(keel_runtime *rt);

/* 0 while healthy, else the KEEL_E* code (KEEL_EIO, KEEL_ENOSPC ...) that
 * latched the runtime into its fatal state: no commit is acknowledged any
 * more, ticks are refused with KEEL_EFATAL; close and reopen to recover. */
int keel_runtime_fatal(const keel_runtime *rt);

/* The last LSN known durable (0 without a data directory). Thread-safe. */
uint64_t keel_durable_lsn(const keel_runtime *rt);

/* Wait until every WAL record up to lsn is synced to disk: 0 at once when
 * it is, else it asks the WAL writer to sync now (held DEFERRED records
 * included; never waits for the next periodic sync) and waits. 0 at once
 * for lsn 0 or without a data directory. timeout_ns < 0 waits for ever.
 * LSNs come from keel_side_txn_commit_lsn, keel_ticket_lsn and
 * keel_runtime_tick_lsn. Errors: KEEL_EINVAL (rt NULL; lsn above the last
 * LSN handed out, or the directory is not open yet), KEEL_ETIMEDOUT,
 * KEEL_EFATAL (the runtime latched before lsn was durable). Thread-safe,
 * while the runtime is open. */
int keel_wait_durable(keel_runtime *rt, uint64_t lsn, int64_t timeout_ns);

/* The LSN of the last completed tick's commit marker: once it is durable,
 * so is that tick and everything before it. 0 without a data directory
 * and before the first tick of this run (the recovered state is durable).
 * keel_wait_durable(rt, keel_runtime_tick_lsn(rt), -1) waits for that
 * tick. Thread-safe. */
uint64_t keel_runtime_tick_lsn(const keel_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif
