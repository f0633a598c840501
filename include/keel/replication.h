/*
 * keel/replication.h -- a world replicated through NATS JetStream: a
 * primary publishes its WAL to a stream, standbys and read replicas
 * (followers) keep their own data directories in step with it, and a
 * standby takes over when the primary's lease lapses. docs/replication.md
 * has the protocol, the exact meaning of an acknowledgement in each mode
 * and the failure matrix.
 */
#ifndef KEEL_REPLICATION_H
#define KEEL_REPLICATION_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_runtime keel_runtime;

/* What an acknowledgement (an IMMEDIATE commit, a durable ticket, a flush,
 * close) waits for. OFF: no replication. ASYNC: the local disk, as without
 * replication; the stream follows. SYNC: the local disk and the stream's
 * acknowledgement (the record is on a quorum of its replicas). */
typedef enum keel_repl_mode {
    KEEL_REPL_OFF = 0,
    KEEL_REPL_ASYNC = 1,
    KEEL_REPL_SYNC = 2,
} keel_repl_mode;

/* PRIMARY runs the world and publishes it. STANDBY follows and promotes
 * itself to PRIMARY when the lease lapses. FOLLOWER follows and never
 * promotes (a read replica). */
typedef enum keel_repl_role {
    KEEL_ROLE_PRIMARY = 0,
    KEEL_ROLE_STANDBY = 1,
    KEEL_ROLE_FOLLOWER = 2,
} keel_repl_role;

/* Zero = no replication. A replicated runtime needs a data directory
 * (keel_durable_desc.dir); its checkpoints delete the WAL they cover, but a
 * primary's only what the stream acknowledged. keel_runtime_create checks
 * the syntax of `nats` and `world` (KEEL_EINVAL); keel_runtime_recover
 * connects. */
typedef struct keel_replication_desc {
    const char *nats;          /* "nats://HOST:PORT[,nats://HOST:PORT...]"; NULL: not replicated */
    const char *world;         /* the world's name (stream KEEL_<world>): letters, digits, '-', '_' */
    keel_repl_role role;
    keel_repl_mode mode;       /* a primary's (OFF with nats set: ASYNC); a standby's once promoted
                                  (OFF: SYNC) */
    int32_t lease_ms;          /* the lease time: a primary silent this long is deposed; 0 = 5000 */
    int32_t replicas;          /* stream replicas when it is created; 0 = 3 with 3 or more servers given, else 1 */
    int32_t timeout_ms;        /* one NATS request's deadline; 0 = 2000. A replica's open waits 30 of them
                                  for its primary to publish the schema or the world */
    const char *node;          /* this node's name in the lease; NULL = host:pid */
    uint64_t stop_tick;        /* a standby or follower applies no tick after this one, also when it
                                  opens its directory; a standby there never promotes (0 = no bound) */
    int64_t retain_records;    /* a primary publishes each checkpoint beside the stream and purges the
                                  stream's records before it but this many; 0 = 100000; < 0 = never purge */
} keel_replication_desc;

typedef struct keel_repl_status {
    keel_repl_role role;
    keel_repl_mode mode;
    uint64_t epoch;            /* the epoch this node took (a primary), or the highest one of the records
                                  a replica read from the stream (0 before any) */
    uint64_t stream_lsn;       /* the stream's last LSN as last seen */
    uint64_t applied_lsn;      /* a follower: the last LSN applied to its world */
    uint64_t published_lsn;    /* a primary: the last LSN the stream acknowledged */
    uint64_t lag_records;      /* follower: stream - applied; primary: committed - published */
    uint64_t lag_ticks;        /* follower: the highest tick its polls copied minus the tick applied;
                                  primary: 0 */
    uint64_t lag_bytes;        /* lag_records times the mean record size (a replica: the mean of what
                                  it read; a primary: the mean of what it published) -- an estimate */
    double mean_record_bytes;  /* that mean (0 until known) */
    uint64_t discarded;        /* records dropped at open: this directory held them, the stream did not */
    uint64_t checkpoint_lsn;   /* a primary: the covered LSN of the last checkpoint it published */
    bool bootstrapped;         /* at open the directory restarted from the stream (its published
                                  checkpoint, or LSN 1 when none is) */
    uint64_t errors;           /* publishes, lease renewals and replica polls that failed for want of
                                  the stream and were retried; never goes down */
    bool degraded;             /* the stream is out of reach: a primary's publishes or renewals fail
                                  (SYNC acknowledges nothing meanwhile), or a replica's last poll
                                  found it out of reach; a poll that gets through clears it */
    bool fenced;               /* another primary took over: this runtime latched KEEL_EFENCED */
} keel_repl_status;

/* A standby or a follower: copy what the stream holds beyond the
 * directory, up to 4096 records a call (waiting up to timeout_ms in all: for
 * the first record, then for those the stream held when the last one read
 * was sent; 0: taking only what has arrived), apply it
 * through recovery's replay (up to the descriptor's stop_tick), and
 * publish a read view of it. A standby whose primary's lease lapsed
 * promotes itself here, once it has applied everything the stream holds:
 * *promoted (may be NULL) is then true and the runtime ticks as a primary
 * from keel_runtime_tick(rt). Errors: KEEL_EINVAL (a primary, or no
 * replication), KEEL_ECORRUPT (the stream is no WAL of this world),
 * KEEL_EUNAVAILABLE (NATS unreachable: polling again retries). */
int keel_replica_poll(keel_runtime *rt, int32_t timeout_ms, bool *promoted);
/* The replication's state (zeros when not replicated). */
void keel_repl_status_get(keel_runtime *rt, keel_repl_status *out);
/* "off", "async", "sync"; "primary", "standby", "follower". */
const char *keel_repl_mode_name(keel_repl_mode m);
const char *keel_repl_role_name(keel_repl_role r);

#ifdef __cplusplus
}
#endif

#endif
