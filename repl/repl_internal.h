/*
 * repl/repl_internal.h -- what the files of libkeel_repl share: a node's
 * connection, its stream's and bucket's names.
 */
#ifndef KEEL_REPL_INTERNAL_H
#define KEEL_REPL_INTERNAL_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include "keel_repl/repl.h"

#define KR_URLS_MAX 16
#define KR_LEASE_BUCKET "KEEL_LEASE"

struct kr_node {
    natsConnection *nc;
    jsCtx *js;
    kvStore *kv;
    char urls[1024];           /* the servers, split in place */
    char urls_given[1024];     /* as given, for sentences */
    char *servers[KR_URLS_MAX];
    int nservers;
    char world[KR_WORLD_MAX + 1];
    char stream[KR_WORLD_MAX + 8];
    char subject[KR_WORLD_MAX + 16];
    char ckpt_stream[KR_WORLD_MAX + 16];  /* KEEL_<world>_CKPT: published checkpoints (ckpt.c) */
    char ckpt_subject[KR_WORLD_MAX + 16];
    char node[KR_NODE_MAX + 1];
    uint64_t session;          /* random per connection: in every message id this node publishes */
    /* the stream's identity (nats.c, stream_id_of; 0: it has none), read
       again with every state of the stream: atomic, since the publisher's
       thread reads the state too */
    _Atomic uint64_t stream_id;
    /* ... and its first and last sequence in that state (the first only
       grows: a stream is purged from its start) */
    _Atomic uint64_t seen_first, seen_last;
    int64_t timeout_ms;
    int32_t replicas;
    bool primary;              /* kr_desc.create: a primary's node (kr_sync_store seeds an empty stream) */
    _Atomic bool abandoned;    /* kr_abandon: reads no longer retry transient failures */
    /* asynchronous publishes' failures, counted by the error handler (a NATS thread) */
    pthread_mutex_t err_mu;
    uint32_t async_errors;
    /* the WAL pipeline (kr_pipe_*): its own context, whose acknowledgement
       handler (a NATS thread) tells pipe_fn; under pipe_mu */
    jsCtx *pipe;
    pthread_mutex_t pipe_mu;
    pthread_cond_t pipe_done;  /* a message was resolved */
    kr_ack_fn pipe_fn;
    void *pipe_arg;
    uint64_t pipe_sent, pipe_resolved; /* messages handed to the context; acknowledged, failed or dropped */
};

/* nats.c, shared with ckpt.c. Look up (with create make) a stream. */
int kr_ensure_stream(kr_node *n, const char *stream, const char *subject, bool create);
/* The WAL stream's identity as last read (0: it has none). */
uint64_t kr_stream_id(const kr_node *n);
/* Open (or with create make) the lease bucket: KEEL_ENOENT when it does not exist yet. */
int kr_ensure_bucket(kr_node *n, bool create);
int kr_read_begin_on(kr_node *n, const char *stream, const char *subject, uint64_t from, kr_reader **out);
/* The last message of `subject` in `stream`, retried while NATS cannot
 * answer now (a leader being elected): *m to destroy. KEEL_ENOENT (no
 * sentence): none, or no such stream. */
int kr_last_msg(kr_node *n, const char *stream, const char *subject, natsMsg **m);
/* The message at seq of `stream`, retried as kr_last_msg: *m to destroy.
 * KEEL_ENOENT: none there (purged or deleted). */
int kr_msg_at(kr_node *n, const char *stream, uint64_t seq, natsMsg **m);
/* A synchronous publish of data to subject with po; po->ExpectLastSeq 0
 * expects an empty stream (a header the client omits for 0). */
natsStatus kr_publish_expecting(kr_node *n, const char *subject, const void *data, size_t len, jsPubOptions *po,
                                jsPubAck **pa, jsErrCode *jerr);
/* The message kr_read_next gave last, now the caller's (natsMsg_Destroy):
 * its data stays valid past the next read. */
natsMsg *kr_read_take(kr_reader *r);
int kr_stream_bounds(kr_node *n, const char *stream, uint64_t *first, uint64_t *last);
int kr_purge_stream_before(kr_node *n, const char *stream, uint64_t seq);
/* sync.c, shared with ckpt.c: mark the directory as the node's stream's
 * (its name and identity), in the caller's transaction. */
int kr_mark(kw_wtxn *t, const kr_node *n);
/* Forget the asynchronous publishes still waiting for an acknowledgement,
 * after a batch that did not complete: the next one waits for its own. */
void kr_drop_pending(kr_node *n);

#endif
