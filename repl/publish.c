/*
 * repl/publish.c -- the publisher: sends the records a store commits to the
 * stream, in LSN order, with a window of them in flight. One thread of its
 * own, helped by the WAL writer's (the lease is the keeper's, lease.c).
 *
 * Protocol (under mu unless said):
 * - The writer stages each batch's sealed records before its LMDB commit
 *   (kr_pub_staged: a chunk appended to `stage`) and raises `committed`
 *   after it (kr_pub_committed); both signal `wake`.
 * - Sending is one sender's at a time, the holder of `sending`: the writer
 *   (with writer_sends), for the chunk it just staged when that chunk is
 *   next in line (sent+1) and the window has room, else the thread, which takes the records after
 *   `sent` from the stage or, when the stage does not hold them, from the
 *   store (a short read transaction: the writer is never waited for). Each
 *   goes to the pipeline (kr_pipe_send) without waiting for the
 *   acknowledgements of those before: up to KR_PIPE_MAX records and
 *   PIPE_BYTES in flight.
 * - The pipeline's handler (a NATS thread) raises `stream_acked` or sets
 *   `pipe_failed`, and signals `wake`; the thread raises `published` to it
 *   (never past `sent`), frees the chunks below it and tells acked()
 *   (without mu); `told` follows once acked() returned. A drain waits for
 *   `told`, not `published`: the caller may take the hook away once it
 *   returns, and an acknowledgement told after that would move no ticket.
 *   `published` may pass `committed`: the stream can take a record before
 *   the disk does.
 * - On a failure, or when nothing was acknowledged for STALL_MS while
 *   records are in flight, the thread settles (holding `sending`): the
 *   stream says how far it holds this node's records, `published` and
 *   `sent` become that, and sending resumes after it, from the chunks still
 *   staged or the store; retried every RETRY_MS, `degraded` while it fails.
 * - A refused publish, or a lost lease (kr_pub_fence), means another
 *   primary exists: failed(KEEL_EFENCED) is told once and nothing more is
 *   published.
 * - A checkpoint is published once its marker is both acknowledged and
 *   committed (it is read from the store).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "repl_internal.h"

#define RETRY_MS 100
#define STALL_MS 5000            /* records in flight and no acknowledgement: settle */
#define COPY_MAX 2048             /* records copied out of the store at a time */
#define COPY_BYTES (4u << 20)

#define PIPE_BYTES (32u << 20) /* record bytes in flight at most */
#define STAGE_MAX (64u << 20)  /* staged bytes at most: beyond, the records are read from the store */

/* Records the writer staged: LSNs first..last, back to back. */
typedef struct pub_chunk {
    struct pub_chunk *next;
    uint64_t first, last;
    size_t len;
    unsigned char recs[];
} pub_chunk;

struct kr_pub {
    kr_pub_desc d;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* work for the thread: a commit, an acknowledgement, a stop */
    pthread_cond_t done;       /* `published` moved, or the thread stopped */
    uint64_t committed, published;
    uint64_t told;             /* acked() returned for records up to it (<= published) */
    pub_chunk *stage, *stage_tail; /* in LSN order; appended by the writer, freed by the thread */
    size_t stage_bytes;
    uint64_t staged;           /* the last LSN staged */
    uint64_t stream_acked;     /* the highest LSN acknowledged as this node's (the handler's) */
    bool pipe_failed;          /* the handler heard a refusal or a timeout: settle */
    uint64_t sent_records, sent_bytes; /* handed to the stream, since the start (under mu) */
    uint64_t errors;
    bool degraded, fenced, quit, stopped;
    bool joined;               /* kr_pub_stop ran (the caller's) */
    /* Sending (and settling) is one thread's at a time, in LSN order: the
       one that set `sending` (under mu) -- the thread, or the writer
       sending the chunk it stages when it is next in line. The holder
       reads and writes what follows without mu, but what the other side
       reads: that under mu. The thread frees chunks only when no one
       sends, so a sender's chunk stays. */
    bool sending;
    uint64_t sent;             /* the last LSN handed to the pipeline (published <= sent) */
    uint64_t unchained;        /* the first LSN sent since the start or a settle: expects a sequence only */
    uint64_t inflight_bytes;
    uint32_t sizes[KR_PIPE_MAX]; /* the size of each record in flight, at lsn % KR_PIPE_MAX */
    uint64_t marker_lsn;       /* a checkpoint marker sent whose checkpoint is not published yet (0: none) */
    uint64_t progress_ns;      /* when the pipeline last moved: a stall is measured from it */
    kw_buf copy;               /* records on their way from the store to the stream */
    uint64_t ckpt_lsn;         /* the last checkpoint published (under mu) */
};

/* Deposed: say so once; the thread publishes nothing more. */
static void fence(kr_pub *p)
{
    pthread_mutex_lock(&p->mu);
    bool first = !p->fenced;
    p->fenced = true;
    pthread_cond_broadcast(&p->done);
    pthread_cond_signal(&p->wake); /* told from another thread (the keeper's): the thread ends */
    pthread_mutex_unlock(&p->mu);
    if (first) {
        core_log(KEEL_LOG_ERROR, "repl", "fenced", "world=%s epoch=%llu", kr_world(p->d.node),
                 (unsigned long long)p->d.epoch);
        p->d.failed(p->d.self, KEEL_EFENCED);
    }
}

static void note_error(kr_pub *p, bool failed)
{
    pthread_mutex_lock(&p->mu);
    p->degraded = failed;
    if (failed)
        p->errors++;
    pthread_mutex_unlock(&p->mu);
}

/* Copy up to COPY_MAX records after `sent` (and up to upto) out of the
 * store: the read transaction stays short, as a growing map needs
 * (kw_read_begin). */
static int copy_committed(kr_pub *p, uint64_t upto, kw_buf *out, size_t *offs, uint32_t *n)
{
    kw_rtxn *r;
    int rc = kw_read_begin(p->d.store, &r);
    if (rc)
        return rc;
    kw_walit *it;
    uint64_t lsn, expect = p->sent + 1;
    const void *rec;
    size_t len;
    out->len = 0;
    *n = 0;
    if (!(rc = kw_wal_iter(r, expect, &it))) {
        while (*n < COPY_MAX && out->len < COPY_BYTES && (rc = kw_wal_next(it, &lsn, &rec, &len)) == 1 &&
               lsn <= upto) {
            if (lsn != expect++) {
                rc = core_fail(KEEL_ECORRUPT, "the WAL skips from LSN %llu to %llu: it cannot be replicated",
                               (unsigned long long)expect - 2, (unsigned long long)lsn);
                break;
            }
            offs[(*n)++] = out->len;
            if ((rc = kw_put_bytes(out, rec, len)))
                break;
        }
        if (rc == 1 || (rc == 0 && *n))
            rc = KEEL_OK;
        kw_wal_iter_end(it);
    }
    kw_read_end(r);
    offs[*n] = out->len;
    return rc;
}

/* A checkpoint marker reached the stream: publish the checkpoint beside it
 * (a failure is counted and logged; the next checkpoint tries again). */
static void publish_checkpoint(kr_pub *p)
{
    uint64_t lsn = 0;
    int rc = kr_ckpt_publish(p->d.node, p->d.store, p->published, p->d.retain, &lsn);
    pthread_mutex_lock(&p->mu);
    if (rc)
        p->errors++;
    else if (lsn)
        p->ckpt_lsn = lsn;
    pthread_mutex_unlock(&p->mu);
    if (rc)
        core_log(KEEL_LOG_WARN, "repl", "checkpoint_not_published", "world=%s cause=\"%s\"", kr_world(p->d.node),
                 keel_last_error());
}

/* The pipeline's handler (a NATS thread): see the protocol above. */
static void on_ack(void *arg, uint64_t lsn, bool ok)
{
    kr_pub *p = arg;
    pthread_mutex_lock(&p->mu);
    if (!ok)
        p->pipe_failed = true;
    else if (lsn > p->stream_acked)
        p->stream_acked = lsn;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

/* Under mu (or alone): free the staged chunks that end at or before lsn
 * (never one a sender reads: see `sending`). */
static void stage_drop(kr_pub *p, uint64_t lsn)
{
    while (p->stage && p->stage->last <= lsn) {
        pub_chunk *c = p->stage;
        p->stage = c->next;
        if (!p->stage)
            p->stage_tail = NULL;
        p->stage_bytes -= c->len;
        free(c);
    }
}

/* Under mu: `published` moves to lsn (acknowledged, or found by a settle). */
static void raise_published(kr_pub *p, uint64_t lsn)
{
    for (uint64_t l = p->published + 1; l <= lsn && l <= p->sent; l++)
        p->inflight_bytes -= p->sizes[l % KR_PIPE_MAX];
    p->published = lsn;
    stage_drop(p, lsn);
    if (p->stream_acked < lsn)
        p->stream_acked = lsn;
    p->progress_ns = core_now_ns();
    pthread_cond_broadcast(&p->done);
}

/* Without mu: tell acked() that the stream holds records up to lsn, then
 * let a drain see it. */
static void tell_acked(kr_pub *p, uint64_t lsn)
{
    p->d.acked(p->d.self, lsn);
    pthread_mutex_lock(&p->mu);
    if (lsn > p->told)
        p->told = lsn;
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mu);
}

/* Under mu: the staged chunk holding lsn, or NULL. */
static const pub_chunk *stage_find(const kr_pub *p, uint64_t lsn)
{
    for (const pub_chunk *c = p->stage; c && c->first <= lsn; c = c->next)
        if (lsn <= c->last)
            return c;
    return NULL;
}

/* Hand one record, the one after `sent`, to the pipeline. */
static int send_one(kr_pub *p, const unsigned char *rec, size_t len)
{
    uint64_t lsn = p->sent + 1;
    int rc = kr_pipe_send(p->d.node, p->d.epoch, lsn, lsn != p->unchained, rec, len);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    if (kw_record_peek_kind(rec, len) == KW_KIND_CHECKPOINT)
        p->marker_lsn = lsn;
    p->sizes[lsn % KR_PIPE_MAX] = (uint32_t)len;
    p->sent = lsn;
    p->inflight_bytes += len;
    p->sent_records++;
    p->sent_bytes += len;
    pthread_mutex_unlock(&p->mu);
    return KEEL_OK;
}

/* Hand the records of chunk c after `sent` to the pipeline, while the
 * window has room (the rest go later). */
static int send_chunk(kr_pub *p, const pub_chunk *c)
{
    int rc = KEEL_OK;
    size_t off = 0;
    for (uint64_t lsn = c->first; !rc && lsn <= c->last && off + KW_HEADER_SIZE <= c->len &&
                                  p->sent - p->published < KR_PIPE_MAX && p->inflight_bytes < PIPE_BYTES;
         lsn++) {
        size_t len = kw_record_peek_len(c->recs + off);
        if (lsn > p->sent)
            rc = send_one(p, c->recs + off, len);
        off += len;
    }
    return rc;
}

/* Hand the records after `sent` to the pipeline: those of the staged chunk
 * holding the next, else the committed ones up to upto from the store: 0,
 * or the first failure. */
static int send_more(kr_pub *p, uint64_t upto)
{
    pthread_mutex_lock(&p->mu);
    const pub_chunk *c = stage_find(p, p->sent + 1);
    pthread_mutex_unlock(&p->mu);
    if (c)
        return send_chunk(p, c);
    size_t offs[COPY_MAX + 1];
    uint32_t n = 0;
    int rc = copy_committed(p, upto, &p->copy, offs, &n);
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = send_one(p, (const unsigned char *)p->copy.p + offs[i], offs[i + 1] - offs[i]);
    return rc;
}

/* Under mu: is there room in the window for k more records? */
static bool window_room(const kr_pub *p, uint64_t k)
{
    return p->sent - p->published + k <= KR_PIPE_MAX && p->inflight_bytes < PIPE_BYTES;
}

/* Under mu: take the right to send (or settle); false when another has it. */
static bool send_begin(kr_pub *p)
{
    if (p->sending)
        return false;
    p->sending = true;
    if (p->sent == p->published)
        p->progress_ns = core_now_ns(); /* a stall counts from the first record in flight */
    return true;
}

/* Give it back; a failure to hand a record over is settled by the thread. */
static void send_end(kr_pub *p, int rc)
{
    pthread_mutex_lock(&p->mu);
    p->sending = false;
    if (rc)
        p->pipe_failed = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

/* After a failure or a stall, holding `sending`: the stream says how far
 * it holds this node's records; sending resumes after them. */
static int resettle(kr_pub *p)
{
    pthread_mutex_lock(&p->mu); /* `sending` is the thread's: pub_step took it */
    p->pipe_failed = false; /* a failure told after this is settled again: harmless */
    uint64_t before = p->published, last = p->sent;
    pthread_mutex_unlock(&p->mu);
    uint64_t acked = before;
    int rc = kr_pipe_settle(p->d.node, p->d.epoch, before, last, &acked);
    core_log(KEEL_LOG_INFO, "repl", "resettled", "world=%s epoch=%llu acknowledged=%llu found=%llu sent=%llu code=%s",
             kr_world(p->d.node), (unsigned long long)p->d.epoch, (unsigned long long)before,
             (unsigned long long)acked, (unsigned long long)last, keel_strerror(rc));
    pthread_mutex_lock(&p->mu);
    if (acked > p->published)
        raise_published(p, acked);
    if (rc != KEEL_EFENCED) { /* resend what the stream does not hold, the first by sequence */
        p->sent = p->published;
        p->inflight_bytes = 0;
        p->unchained = p->sent + 1;
        if (p->marker_lsn > p->sent)
            p->marker_lsn = 0; /* sent again, and marked again */
    }
    p->sending = false;
    uint64_t now = p->published;
    pthread_mutex_unlock(&p->mu);
    if (acked > before)
        tell_acked(p, now);
    return rc;
}

/* Under mu, released while working: one step of the thread's loop; false
 * when it is to stop. */
static bool pub_step(kr_pub *p)
{
    uint64_t now = core_now_ns(), stall_ns = (uint64_t)STALL_MS * 1000000ull;
    /* stopping: what is in flight is settled now, not after a stall (nothing else wakes the thread) */
    bool stalled = p->sent > p->published && (p->quit || now - p->progress_ns > stall_ns);
    uint64_t ack = p->stream_acked < p->sent ? p->stream_acked : p->sent;
    int rc = KEEL_OK;
    if (p->sending) { /* the writer sends what it staged: wait for it (it signals) */
        pthread_cond_wait(&p->wake, &p->mu);
        return true;
    } else if (ack > p->published) { /* acknowledgements came: tell them */
        raise_published(p, ack);
        uint64_t lsn = p->published;
        pthread_mutex_unlock(&p->mu);
        tell_acked(p, lsn);
    } else if (p->pipe_failed || stalled) {
        p->sending = true; /* before mu goes: the writer must not send while the stream is read */
        pthread_mutex_unlock(&p->mu);
        rc = resettle(p);
    } else if (p->marker_lsn && p->marker_lsn <= p->published && p->marker_lsn <= p->committed) {
        /* the checkpoint is read from the store: its marker committed there too (before a stop: a
           clean close publishes its last checkpoint) */
        p->marker_lsn = 0;
        pthread_mutex_unlock(&p->mu);
        publish_checkpoint(p);
    } else if (p->quit && p->published >= p->committed) {
        return false;
    } else if ((p->committed > p->sent || stage_find(p, p->sent + 1)) && window_room(p, COPY_MAX) &&
               send_begin(p)) {
        uint64_t upto = p->committed;
        pthread_mutex_unlock(&p->mu);
        rc = send_more(p, upto);
        send_end(p, rc); /* a refusal: what went is settled, the rest sent again (after RETRY_MS, below) */
    } else if (p->sent > p->published) { /* records in flight: wake up to settle if they stall */
        struct timespec ts = core_timespec_at(p->progress_ns + stall_ns + 1); /* past: returns at once */
        pthread_cond_timedwait(&p->wake, &p->mu, &ts);
        return true;
    } else {
        pthread_cond_wait(&p->wake, &p->mu);
        return true;
    }
    if (rc == KEEL_EFENCED) {
        fence(p);
    } else {
        note_error(p, rc != 0);
        if (rc) { /* the stream is out of reach: try again soon, or give up when told to stop */
            pthread_mutex_lock(&p->mu);
            if (p->quit)
                return false;
            struct timespec ts = core_timespec_at(core_now_ns() + RETRY_MS * 1000000ull);
            pthread_cond_timedwait(&p->wake, &p->mu, &ts);
            pthread_mutex_unlock(&p->mu);
        }
    }
    pthread_mutex_lock(&p->mu);
    return true;
}

static void *pub_main(void *arg)
{
    kr_pub *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->fenced && pub_step(p))
        ;
    p->stopped = true;
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kr_pub_start(const kr_pub_desc *d, kr_pub **out)
{
    kr_pub *p = calloc(1, sizeof *p);
    if (!p)
        return core_fail(KEEL_ENOMEM, "out of memory for the publisher");
    p->d = *d;
    p->committed = p->published = p->told = p->stream_acked = p->sent = d->published;
    p->unchained = d->published + 1;
    p->progress_ns = core_now_ns();
    pthread_mutex_init(&p->mu, NULL);
    core_cond_init_monotonic(&p->wake);
    core_cond_init_monotonic(&p->done);
    int rc = kr_pipe_open(d->node, on_ack, p);
    if (!rc && pthread_create(&p->thread, NULL, pub_main, p)) {
        kr_pipe_close(d->node);
        rc = core_fail(KEEL_ENOMEM, "cannot start the publisher thread");
    }
    if (rc) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->wake);
        pthread_cond_destroy(&p->done);
        free(p);
        return rc;
    }
    *out = p;
    return KEEL_OK;
}

void kr_pub_committed(kr_pub *p, uint64_t lsn)
{
    pthread_mutex_lock(&p->mu);
    if (lsn > p->committed)
        p->committed = lsn;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

/* Under mu: a copy of the records first..last at the stage's end; NULL
 * when they are not staged (behind what is, over STAGE_MAX, out of
 * memory: then they are read from the store once committed). */
static const pub_chunk *stage_append(kr_pub *p, uint64_t first, uint64_t last, const void *recs, size_t len)
{
    if (first <= p->published || first <= p->staged || p->stage_bytes + len > STAGE_MAX)
        return NULL;
    pub_chunk *c = malloc(sizeof *c + len);
    if (!c)
        return NULL;
    *c = (pub_chunk){.first = first, .last = last, .len = len};
    memcpy(c->recs, recs, len);
    if (p->stage_tail)
        p->stage_tail->next = c;
    else
        p->stage = c;
    p->stage_tail = c;
    p->stage_bytes += len;
    p->staged = last;
    return c;
}

void kr_pub_staged(kr_pub *p, uint64_t first_lsn, uint64_t last_lsn, const void *recs, size_t len)
{
    pthread_mutex_lock(&p->mu);
    const pub_chunk *c = stage_append(p, first_lsn, last_lsn, recs, len);
    /* next in line and nothing in the way: sent now, from the writer's thread (no wake-up between) */
    if (c && p->d.writer_sends && p->sent + 1 == c->first && !p->pipe_failed && !p->fenced && !p->quit &&
        window_room(p, 1) && send_begin(p)) {
        pthread_mutex_unlock(&p->mu);
        send_end(p, send_chunk(p, c));
        return;
    }
    if (c)
        pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

int kr_pub_drain(kr_pub *p, int64_t timeout_ms)
{
    struct timespec ts = core_timespec_at(core_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull);
    pthread_mutex_lock(&p->mu);
    int w = 0;
    while (p->told < p->committed && !p->fenced && !p->stopped && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&p->done, &p->mu, &ts);
    int rc = p->fenced ? KEEL_EFENCED : p->told < p->committed ? KEEL_EUNAVAILABLE : KEEL_OK;
    uint64_t pub = p->told, com = p->committed;
    pthread_mutex_unlock(&p->mu);
    if (rc == KEEL_EFENCED)
        return core_fail(rc, "fenced: another primary took world '%s' over", kr_world(p->d.node));
    if (rc)
        return core_fail(rc, "the stream of world '%s' acknowledged LSN %llu of %llu", kr_world(p->d.node),
                         (unsigned long long)pub, (unsigned long long)com);
    return KEEL_OK;
}

void kr_pub_stats_get(kr_pub *p, kr_pub_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = (kr_pub_stats){.published = p->published, .committed = p->committed, .errors = p->errors,
                          .degraded = p->degraded, .fenced = p->fenced, .checkpoint_lsn = p->ckpt_lsn};
    uint64_t lag = p->committed > p->published ? p->committed - p->published : 0;
    if (p->sent_records) /* estimated: the records not yet read from the store have no size yet */
        out->lag_bytes = (uint64_t)((double)lag * (double)p->sent_bytes / (double)p->sent_records + 0.5);
    pthread_mutex_unlock(&p->mu);
}

void kr_pub_fence(kr_pub *p)
{
    fence(p);
}

void kr_pub_stop(kr_pub *p)
{
    if (!p || p->joined)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    p->joined = true;
    pthread_mutex_lock(&p->mu);
    while (p->sending) /* the writer sending what it staged (a fenced thread ends without waiting for it) */
        pthread_cond_wait(&p->wake, &p->mu);
    pthread_mutex_unlock(&p->mu);
    kr_pipe_close(p->d.node); /* on_ack is never called again */
}

void kr_pub_free(kr_pub *p)
{
    if (!p)
        return;
    kr_pub_stop(p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    kw_buf_free(&p->copy);
    stage_drop(p, UINT64_MAX);
    free(p);
}
