/*
 * keel_repl/repl.h -- libkeel_repl: a world's WAL on a NATS JetStream
 * stream (docs/replication.md). It knows the stream, the lease and the
 * records' bytes (libkeel_wal), never the runtime: the runtime's replication
 * (src/runtime/replication.c) drives it through the durability layer's
 * seams, and keel-wal reads a stream with it alone.
 *
 *   stream   KEEL_<world>, subject keel.<world>.wal, file storage; message
 *            N is the WAL record of LSN N, byte for byte (seq == LSN), with
 *            the message id "<epoch>:<lsn>".
 *   lease    KV bucket KEEL_LEASE, key <world>: "epoch=E node=N state=held|released",
 *            taken and renewed by revision compare-and-set.
 *
 * Every publish expects the stream's last sequence to be lsn - 1, so only
 * one primary can ever append: a deposed primary's publish is refused
 * (KEEL_EFENCED). Errors are KEEL_E* codes with a keel_last_error() sentence;
 * NATS that cannot be reached or does not answer in time is
 * KEEL_EUNAVAILABLE.
 */
#ifndef KEEL_REPL_H
#define KEEL_REPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/error.h"
#include "keel_wal/wal.h"

#define KR_WORLD_MAX 64u          /* a world's name: letters, digits, '-' and '_' */
#define KR_SEED_EPOCH 0           /* the epoch in a seed's message ids (kr_seed_stream) */
#define KR_NODE_MAX KW_EPOCH_NODE_MAX

typedef struct kr_node kr_node;

typedef struct kr_desc {
    const char *urls;         /* "nats://h:p[,nats://h:p...]" */
    const char *world;        /* the world's name */
    const char *node;         /* this node's id in the lease and epoch records; NULL: host:pid */
    int32_t replicas;         /* the stream's and the bucket's replicas when they are created; 0: 3, or 1 when
                                 the cluster has fewer servers */
    int32_t timeout_ms;       /* one request's deadline; 0: 2000 */
    bool create;              /* create the stream and the lease bucket when missing (a primary) */
    bool later;               /* with create: only connect; kr_make_world finds or creates them */
} kr_desc;

/* Connect and find (or create) the world's stream and lease bucket.
 * Errors: KEEL_EINVAL (a bad name or URL), KEEL_EUNAVAILABLE (no server
 * answers), KEEL_ENOENT (no stream for the world and !create). */
int kr_connect(const kr_desc *d, kr_node **out);
/* What kr_connect checks before it connects: the world's name and the
 * servers' syntax. KEEL_OK, KEEL_EINVAL naming the culprit, or
 * KEEL_ENOMEM. */
int kr_check(const char *urls, const char *world);
/* A primary connected with `later`: find or create the world's streams and
 * lease bucket now (once it holds its directory: a node refused for a
 * directory another process holds creates nothing). */
int kr_make_world(kr_node *n);
void kr_close(kr_node *n);
/* From now on a read that fails for want of a server fails at once
 * instead of retrying for up to 30 s (a node being stopped). */
void kr_abandon(kr_node *n);
const char *kr_world(const kr_node *n);
/* The most bytes one message may have on the node's servers (max_payload). */
size_t kr_max_payload(kr_node *n);
/* Whether the node's connection to a NATS server is up now. While it is
 * not, the client reconnects in the background, and a reader's wait only
 * times out with nothing delivered. */
bool kr_connected(kr_node *n);
const char *kr_node_id(const kr_node *n);
/* One request's deadline, as kr_desc.timeout_ms gave it or its default. */
int64_t kr_timeout_ms(const kr_node *n);
/* "nats://h:p/WORLD" -> urls ("nats://h:p") and world; false when the path
 * is not a stream address. */
bool kr_parse_address(const char *addr, char *urls, size_t ucap, char *world, size_t wcap);

/* The stream's bounds: first and last sequence (0, 0 when it never held a
 * message; last + 1, last when every message was purged). */
int kr_bounds(kr_node *n, uint64_t *first, uint64_t *last);
/* One message by sequence into out (KEEL_ENOENT: not stored). */
int kr_get(kr_node *n, uint64_t seq, kw_buf *out);
/* The same, and the epoch its publisher wrote it in (from its message id;
 * 0 when it has none). */
int kr_get_epoch(kr_node *n, uint64_t seq, kw_buf *out, uint64_t *epoch);

/* Reading in order from a sequence on: kr_read_next gives 1 and the
 * message (valid until the next call), 0 when none came within
 * timeout_ms (0: only a message already delivered, no wait) or the
 * consumer was made again (read again), or an error.
 * A message the consumer skipped is read again; one the stream no longer
 * holds (purged) is KEEL_ECORRUPT. */
typedef struct kr_reader kr_reader;
int kr_read_begin(kr_node *n, uint64_t from, kr_reader **out);
int kr_read_next(kr_reader *r, int64_t timeout_ms, uint64_t *seq, const void **data, size_t *len);
/* Read again from `from` on, with a new consumer. */
int kr_read_restart(kr_reader *r, uint64_t from);
/* The same without waiting for the server: the consumer is made at the
 * next kr_read_next (whose error it then is, and which tries again). */
void kr_read_rewind(kr_reader *r, uint64_t from);
/* Whether the stream held messages after the last one delivered, when it
 * was sent: they are on their way (a later publish is not). */
bool kr_read_more_sent(const kr_reader *r);
/* What the messages read so far say, without asking the server: the
 * stream's last sequence when the last one was delivered (its sequence plus
 * the messages pending after it; 0 before any), their mean size (0 before
 * any) and the highest epoch their ids name (0 before any, and for a seed's
 * messages). */
void kr_read_seen(const kr_reader *r, uint64_t *stream_last, double *mean_bytes, uint64_t *epoch);
void kr_read_end(kr_reader *r);

/* Publish the record of `lsn`, expecting the stream to end at lsn - 1.
 * Errors: KEEL_EFENCED (the stream moved on: another primary appended),
 * KEEL_EUNAVAILABLE (no acknowledgement in time; publishing the same lsn
 * again is safe: the message id de-duplicates). */
int kr_publish(kr_node *n, uint64_t epoch, uint64_t lsn, const void *rec, size_t len);
/* The WAL pipeline: records go out as the store commits them, without
 * waiting for the acknowledgements of those before. Each expects the
 * stream to end at lsn - 1; all but the first after kr_pipe_open or a
 * settle also expect this node's message id of lsn - 1 (`chained`), so a
 * record never lines up behind another primary's, and an acknowledged LSN
 * means the stream holds this node's records up to it. The first must
 * follow an LSN the stream holds as this node's (or the stream's end when
 * none is). Acknowledgements arrive on a NATS thread: fn(arg, lsn, true)
 * for a record stored at its LSN, fn(arg, lsn, false) for a refusal or a
 * timeout (the stream's answer comes from kr_pipe_settle). One pipeline
 * per node; fn is never called once kr_pipe_close returns. */
#define KR_PIPE_MAX 4096 /* records in flight at most (the publisher's window) */
typedef void (*kr_ack_fn)(void *arg, uint64_t lsn, bool ok);
int kr_pipe_open(kr_node *n, kr_ack_fn fn, void *arg);
int kr_pipe_send(kr_node *n, uint64_t epoch, uint64_t lsn, bool chained, const void *rec, size_t len);
/* After a failure: forget the records still in flight and find how far
 * the stream holds this node's records, from `before` (this node's,
 * acknowledged) up to `last` (the last sent) into *acked. KEEL_EFENCED
 * when another primary's record follows them, KEEL_EUNAVAILABLE when the
 * stream holds only a prefix (send the rest again, the first unchained). */
int kr_pipe_settle(kr_node *n, uint64_t epoch, uint64_t before, uint64_t last, uint64_t *acked);
void kr_pipe_close(kr_node *n);
/* Drop the stream's messages before seq (retention). */
int kr_purge_before(kr_node *n, uint64_t seq);

/* ---- the lease ---------------------------------------------------------------- */

typedef struct kr_lease {
    bool exists;
    bool released;            /* its last holder let it go (a clean stop) */
    uint64_t epoch;           /* the last epoch taken */
    uint64_t rev;             /* the KV revision it was read at */
    char node[KR_NODE_MAX + 1];
} kr_lease;

/* The lease as it stands now. */
int kr_lease_read(kr_node *n, kr_lease *out);
/* Take the lease read as `seen` (compare-and-set on its revision; created
 * when it did not exist) for epoch seen->epoch + 1. *rev: the lease's new
 * revision. KEEL_ECONFLICT when it changed since it was read. */
int kr_lease_take(kr_node *n, const kr_lease *seen, uint64_t *epoch, uint64_t *rev);
/* Renew (held) or let go (released) the lease this node holds at *rev.
 * KEEL_EFENCED when another node took it. */
int kr_lease_renew(kr_node *n, uint64_t epoch, bool released, uint64_t *rev);

/* The keeper: a thread renewing the lease a node took (epoch, at rev)
 * every lease_ms / 3 until it is stopped or the lease is lost; lost(self,
 * KEEL_EFENCED) is called once, on the keeper's thread, when another node
 * took it. */
typedef struct kr_keeper kr_keeper;
typedef struct kr_keeper_desc {
    kr_node *node;
    uint64_t epoch, rev;
    int32_t lease_ms;
    void *self;
    void (*lost)(void *self, int rc);
} kr_keeper_desc;

typedef struct kr_keeper_stats {
    uint64_t errors;          /* renewals that failed (NATS out of reach) and were retried */
    bool failing;             /* the last renewal failed */
    bool lost;                /* another node took the lease */
} kr_keeper_stats;

int kr_keeper_start(const kr_keeper_desc *d, kr_keeper **out);
void kr_keeper_stats_get(kr_keeper *k, kr_keeper_stats *out);
/* KEEL_EFENCED once the lease is lost, else 0 (also for NULL). */
int kr_keeper_check(kr_keeper *k);
/* Renew no more (the node was fenced otherwise); kr_keeper_stop still
 * follows. Callable from any thread. */
void kr_keeper_halt(kr_keeper *k);
/* Stop renewing (NULL: nothing); release: let the lease go (a clean stop).
 * *last (may be NULL) receives the keeper's final figures, its thread
 * ended: nothing is counted after them. */
void kr_keeper_stop(kr_keeper *k, bool release, kr_keeper_stats *last);

/* ---- a directory kept in step with the stream ------------------------------- */

typedef struct kr_sync_info {
    uint64_t stream_last;     /* the stream's last sequence when the sync ran */
    uint64_t local_last;      /* the directory's last LSN afterwards */
    uint64_t discarded;       /* records the directory held beyond the stream, now dropped */
    uint64_t discarded_from;  /* ... the first of them */
    uint64_t appended;        /* records copied from the stream */
    bool checkpoint_dropped;  /* the checkpoint covered a dropped record: it went with them */
    bool bootstrapped;        /* the directory restarted from the stream (its published checkpoint,
                                 or LSN 1 when none is): purged past it, or its checkpoint dropped */
    bool seed;                /* a primary's directory holds the world the stream lacks: the stream
                                 never held a record (stream_last 0), or holds a prefix of these
                                 records and the directory is marked as being seeded (a seed cut
                                 short); nothing was written: kr_seed_stream publishes
                                 stream_last + 1 .. local_last before anything else */
    bool unstreamed;          /* the same for a directory that is not a primary's: nothing was done
                                 (its primary publishes the world: wait for it, or refuse) */
} kr_sync_info;

/* Bring the WAL of `s` (open, writable) in step with the stream: drop what
 * it holds beyond the stream (records that never reached it), or, when the
 * stream was purged past the directory's end, replace it with the latest
 * published checkpoint; then append what the stream holds beyond it, up to
 * `upto` (0: its end). SCHEMA records also go to the schema database, as
 * the primary stored them. A stream that never held a record does not
 * drop a directory holding a world (its only copy, e.g. a local world now
 * replicated): a primary's (kr_desc.create) whose WAL starts at LSN 1 is
 * left as it is (out->seed), any other node's too (out->unstreamed), and a
 * primary's whose WAL starts later is refused with KEEL_ERANGE, nothing
 * written. Where the directory and the stream hold no WAL record to
 * compare, the directory's mark decides: marked with the stream's identity
 * (or by its name alone), it is the stream's; unmarked, or marked with
 * another identity of the name (a stream made again), it is refused; the
 * directory is marked (meta "replicated", "stream_id") once it is the
 * stream's. Errors: KEEL_ECORRUPT (a message is
 * no WAL record of its sequence, the directory and the stream share no
 * record, or it is another stream's), KEEL_ERANGE (it must restart and no checkpoint is published; a
 * world the stream never held that cannot be seeded), the stream's and the
 * store's. */
int kr_sync_store(kr_node *n, kw_store *s, uint64_t upto, kr_sync_info *out);
/* kr_sync_store (upto 0) for a copy of everything the stream holds: an
 * empty directory s of a stream purged past LSN 1 (no primary's) also
 * takes, after the published checkpoint, the records the stream retains
 * before the LSN it covers, into its WAL alone (a copy whose checkpoint
 * keeps them; a purge that takes them while they are read leaves them
 * out). keel-wal reads streams so. */
int kr_sync_whole(kr_node *n, kw_store *s, kr_sync_info *out);
/* Where a directory ends: its last LSN (that of its WAL, or the
 * checkpoint's covered LSN when the WAL is empty; 0 for an empty
 * directory), the tick its last WAL record names (0: the WAL is empty) and
 * the epoch of its last EPOCH record (0: none is known). */
typedef struct kr_local {
    uint64_t last, tick, epoch;
} kr_local;
int kr_local_end(kw_store *s, kr_local *out);
/* Would kr_sync_store start a replica's directory s (not a primary's) from
 * the published checkpoint, holding nothing itself while the stream was
 * purged past LSN 1? Then *boots: kr_boot_begin loads it as it arrives.
 * *stream_last: the stream's last sequence when the node last read its
 * state (kr_connect does). */
int kr_sync_boots(kr_node *n, kw_store *s, bool *boots, uint64_t *stream_last);
/* Publish the directory's WAL records from..last to the stream (which ends
 * at from - 1; from 1: asked once more whether it is empty), pipelined, as
 * a seed's: epoch 0 in their message ids (they were written before any
 * epoch of the stream, whatever EPOCH records they hold), the directory
 * marked meanwhile as the
 * stream's and as being seeded (meta "seeding": cut short, the next
 * kr_sync_store goes on instead of dropping the rest). progress(arg) (may
 * be NULL) runs before each record and every 100 ms while acknowledgements
 * are awaited -- a primary checks its lease there -- and a non-zero
 * return stops the seed with that code. Errors: KEEL_EFENCED
 * (another primary appended, or the stream was not empty after all),
 * KEEL_EUNAVAILABLE (the stream took only a prefix, or stopped answering: a
 * publish unanswered for the node's timeout fails, and the stream's state
 * is then asked for; the next open resumes), KEEL_ECORRUPT (the directory lacks a
 * record). */
int kr_seed_stream(kr_node *n, kw_store *s, uint64_t from, uint64_t last, int (*progress)(void *arg),
                   void *arg);
/* Append stream messages from `r` (positioned at the directory's next LSN)
 * for at most timeout_ms, up to max records: the first to come, then those
 * the stream held when the last one read was sent, not one published since
 * (timeout 0: only what has been delivered); *last: the directory's last
 * LSN afterwards and *last_tick (may be NULL) the tick its record names
 * (both unchanged when none came). On failure nothing of the batch is in
 * the directory and `r` is rewound to *last + 1 (kr_read_rewind), so the
 * next call reads those messages again. */
int kr_append_from(kr_reader *r, kw_store *s, uint32_t max, int64_t timeout_ms, uint64_t *last, uint64_t *last_tick);
/* Append what `r` delivers until the directory's last LSN (*last) reaches
 * `end`. A wait of timeout_ms with nothing delivered restarts the consumer
 * where it was (one stalled across a NATS server's loss); after 30 s of
 * that, KEEL_EUNAVAILABLE. *last_tick (may be NULL) as kr_append_from. */
int kr_copy_to(kr_node *n, kr_reader *r, kw_store *s, uint64_t end, int64_t timeout_ms, uint64_t *last,
               uint64_t *last_tick);
/* Append one sealed record at its LSN (the directory's next) to s: a new
 * primary's EPOCH record, once the stream took it. */
int kr_append_record(kw_store *s, uint64_t lsn, const void *rec, size_t len);

/* ---- published checkpoints (ckpt.c) ------------------------------------------- */

/* Publish the checkpoint s records now, if the WAL stream holds every record
 * it covers (its covered LSN <= upto), then purge older checkpoints and the
 * WAL stream's records before covered + 1 - retain (retain < 0: never).
 * *published_lsn: its covered LSN, 0 when none was sent. */
int kr_ckpt_publish(kr_node *n, kw_store *s, uint64_t upto, int64_t retain, uint64_t *published_lsn);
/* Replace s's WAL, snapshot, schema and checkpoint with the latest published
 * checkpoint, marking s as the stream's in the same transaction; *covered:
 * its covered LSN (the stream continues after it).
 * One that a newer publication purges while it is copied is given up for
 * the newer one. KEEL_ENOENT when none is published. */
int kr_ckpt_load(kr_node *n, kw_store *s, uint64_t *covered);
/* The latest published checkpoint's meta and the schema record it was
 * published with (appended to *schema), read from its first two messages:
 * nothing else is fetched or written. KEEL_ENOENT when none is published,
 * KEEL_ECORRUPT when those messages are no BEGIN and SCHEMA. */
int kr_ckpt_head(kr_node *n, kw_checkpoint_meta *meta, kw_buf *schema);
/* The latest published checkpoint, loaded as it arrives (a replica's
 * bootstrap): kr_boot_begin fetches its BEGIN and SCHEMA and starts a
 * thread that copies every message fetched into one write transaction on
 * s, as kr_ckpt_load does; kr_boot_next (a dur_snap_src's next: self is
 * the kr_boot) fetches the rest and gives their snap entries in the order
 * they were published -- the order a checkpoint loads. kr_boot_end gives
 * the verdict: KEEL_OK (after kr_boot_next gave 0) lets the transaction
 * commit, in the background; anything else aborts it, nothing written.
 * kr_boot_settle waits for the thread and frees the kr_boot: KEEL_OK once
 * the directory holds the checkpoint, else the copy's error (a settle
 * without a verdict aborts). Nothing else may write s in between (LMDB's
 * writer lock makes it wait anyway). KEEL_ENOENT: none is published that
 * loads so (none at all; one sent in plain key order by an older publisher;
 * one the WAL stream, as kr_connect saw it, was purged past): kr_ckpt_load
 * and kr_sync_store take those. KEEL_EUNAVAILABLE from kr_boot_next: the
 * checkpoint was purged for a newer one while it was read. */
typedef struct kr_boot kr_boot;
typedef struct kr_boot_view {
    const void *meta, *schema;   /* meta "checkpoint" and the schema record, as a directory holds them */
    size_t meta_len, schema_len;
    uint64_t tick, covered;      /* the checkpoint's tick and covered LSN */
} kr_boot_view;
int kr_boot_begin(kr_node *n, kw_store *s, kr_boot **out);
void kr_boot_info(const kr_boot *b, kr_boot_view *out);
int kr_boot_next(void *self, const void **key, size_t *klen, const void **val, size_t *vlen);
void kr_boot_end(kr_boot *b, int verdict);
int kr_boot_settle(kr_boot *b);

/* ---- the publisher ------------------------------------------------------------ */

/* A thread that publishes the records an LMDB store commits, in LSN order,
 * and renews the lease; it owns `node` while it runs. */
typedef struct kr_pub kr_pub;
typedef struct kr_pub_desc {
    kr_node *node;
    kw_store *store;          /* where the records are read from */
    uint64_t epoch;
    uint64_t published;       /* the stream's last sequence: publishing starts after it */
    int64_t retain;           /* WAL records the stream keeps before its published checkpoint (< 0: all) */
    bool writer_sends;        /* kr_pub_staged may send on the caller's thread (sync: a commit waits for the
                                 stream anyway; async: the local disk never waits for the network) */
    void *self;
    void (*acked)(void *self, uint64_t lsn);    /* the stream holds records up to lsn */
    void (*failed)(void *self, int rc);         /* KEEL_EFENCED: deposed; nothing more is published */
} kr_pub_desc;

typedef struct kr_pub_stats {
    uint64_t published;       /* the last LSN the stream acknowledged */
    uint64_t committed;       /* the last LSN handed to the publisher */
    uint64_t errors;          /* publishes that failed and were retried */
    uint64_t checkpoint_lsn;  /* the covered LSN of the last checkpoint published (0: none) */
    uint64_t lag_bytes;       /* committed - published, times the mean size of the records published */
    bool degraded;            /* the last attempt failed: the stream is not keeping up */
    bool fenced;
} kr_pub_stats;

int kr_pub_start(const kr_pub_desc *d, kr_pub **out);
/* The store committed records up to lsn (the durability layer's hook). */
void kr_pub_committed(kr_pub *p, uint64_t lsn);
/* The records of LSNs first_lsn..last_lsn, back to back in recs, about to
 * be committed: copied, to be sent before they are -- with writer_sends on
 * the caller's thread when they are next in line, else by the thread. */
void kr_pub_staged(kr_pub *p, uint64_t first_lsn, uint64_t last_lsn, const void *recs, size_t len);
/* Wait until everything committed is published and acked() returned for
 * it, for at most timeout_ms: 0, KEEL_EUNAVAILABLE, KEEL_EFENCED. */
int kr_pub_drain(kr_pub *p, int64_t timeout_ms);
void kr_pub_stats_get(kr_pub *p, kr_pub_stats *out);
/* Another node took the lease: publish nothing more; failed(KEEL_EFENCED)
 * is told (once, on the caller's thread). */
void kr_pub_fence(kr_pub *p);
/* Stop the thread once what it has to do before a stop is done (a
 * pending checkpoint published); kr_pub_fence and kr_pub_stats_get still
 * work until kr_pub_free, which stops it first if need be. */
void kr_pub_stop(kr_pub *p);
void kr_pub_free(kr_pub *p);

#endif
