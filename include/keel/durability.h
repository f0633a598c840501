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

#include "keel/schedule.h"
#include "keel/txn.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    keel_submit_fn on_shutdown;    /* run by keel_runtime_close in an IMMEDIATE side transaction
                                      with access to every durable component; also without a
                                      data directory */
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

/* Wait until every tick completed so far and every side transaction
 * committed so far is durable (forces DEFERRED records to disk).
 * 0 at once without a data directory. Errors: KEEL_EFATAL. */
int keel_uow_flush(keel_runtime *rt);

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

#ifdef __cplusplus
}
#endif
#endif
