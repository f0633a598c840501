/*
 * durable/writer.c -- the WAL writer thread: group commit, durability
 * modes, the durable LSN, waiters and the fatal latch.
 *
 * Protocol (all under d->mu unless said otherwise):
 *   producer: lsn range = next_lsn ..; seal records; append the item;
 *             signal `wake`. Producers are the tick thread (fence, hook,
 *             checkpoint) and side commits (which hold the runtime's
 *             side_lock); both run only while no other producer can, or
 *             under mu, so queue order is LSN order.
 *   writer:   take the whole queue; items that need no sync soon (DEFERRED)
 *             are held back until something needs a sync, a flush asks,
 *             or they are DUR_DEFER_MAX_BYTES / DUR_DEFER_MAX_NS old; then
 *             one LMDB write transaction appends every record (MDB_APPEND)
 *             and applies the checkpoint, if any, and commits with sync.
 *             Then durable_lsn = the last LSN written (release), waiters
 *             whose LSN is covered run, durable_cv is broadcast.
 *   failure:  the first failing commit latches `fatal`; nothing is
 *             acknowledged afterwards (waiters get KEEL_EFATAL, producers
 *             are refused); what LMDB holds is the last durable state.
 * Every commit is synced: an acknowledged IMMEDIATE commit is on disk, and
 * a GROUP tick is on disk one batch after it was queued.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "durable/durable_internal.h"

dur_item *dur_item_new(dur_item_kind kind, keel_durability mode)
{
    dur_item *it = calloc(1, sizeof *it);
    if (it) {
        it->kind = kind;
        it->mode = mode;
    }
    return it;
}

void dur_item_free(dur_item *it)
{
    if (!it)
        return;
    kw_buf_free(&it->recs);
    if (it->ckpt)
        ckpt_job_free(it->ckpt);
    free(it);
}

/* Walk the records of a buffer: *off starts at 0. */
static bool next_record(const kw_buf *b, size_t *off, unsigned char **rec, size_t *len)
{
    if (*off + KW_HEADER_SIZE > b->len)
        return false;
    *rec = b->p + *off;
    *len = kw_record_peek_len(*rec);
    *off += *len;
    return true;
}

/* ---- waiters --------------------------------------------------------------------------- */

/* Under mu: detach the waiters up to LSN `upto` and complete them outside
 * it, those at or below `durable` with 0, the others with rc. */
static void complete_waiters(dur_state *d, uint64_t durable, uint64_t upto, int rc)
{
    dur_waiter *done = NULL, **tail = &done;
    while (d->waiters && d->waiters->lsn <= upto) {
        *tail = d->waiters;
        d->waiters = d->waiters->next;
        tail = &(*tail)->next;
    }
    *tail = NULL;
    pthread_mutex_unlock(&d->mu);
    while (done) {
        dur_waiter *w = done;
        done = done->next;
        w->done(w->arg, w->lsn > durable ? rc : KEEL_OK);
        free(w);
    }
    pthread_mutex_lock(&d->mu);
}

/* Under mu: the waiters `durable` covers; once latched fatal, all. */
static void run_waiters(dur_state *d, uint64_t durable, int fatal)
{
    complete_waiters(d, durable, fatal ? UINT64_MAX : durable, KEEL_EFATAL);
}

void dur_stream_gone(dur_state *d)
{
    pthread_mutex_lock(&d->mu);
    complete_waiters(d, atomic_load(&d->durable_lsn), atomic_load(&d->local_lsn), KEEL_EUNAVAILABLE);
    pthread_mutex_unlock(&d->mu);
}

void dur_when_durable(dur_state *d, uint64_t lsn, void (*done)(void *arg, int rc), void *arg)
{
    dur_waiter *w = malloc(sizeof *w);
    pthread_mutex_lock(&d->mu);
    int fatal = atomic_load(&d->fatal);
    uint64_t durable = atomic_load(&d->durable_lsn);
    if (lsn <= durable || fatal || !w) {
        pthread_mutex_unlock(&d->mu);
        free(w);
        done(arg, lsn <= durable ? KEEL_OK : fatal ? KEEL_EFATAL : dur_wait(d, lsn, true));
        return;
    }
    *w = (dur_waiter){.lsn = lsn, .done = done, .arg = arg};
    dur_waiter **p = &d->waiters;
    while (*p && (*p)->lsn <= lsn)
        p = &(*p)->next;
    w->next = *p;
    *p = w;
    pthread_mutex_unlock(&d->mu);
}

void dur_latch_fatal(dur_state *d, int rc)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&d->fatal, &expected, rc ? rc : KEEL_EIO))
        return;
    core_log(KEEL_LOG_ERROR, "wal", "fatal", "code=%s dir=%s durable_lsn=%llu", keel_strerror(rc), kw_store_dir(d->store),
             (unsigned long long)atomic_load(&d->durable_lsn));
    pthread_mutex_lock(&d->mu);
    run_waiters(d, atomic_load(&d->durable_lsn), rc);
    pthread_cond_broadcast(&d->durable_cv);
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->mu);
}

int dur_wait(dur_state *d, uint64_t lsn, bool flush)
{
    return dur_wait_timed(d, lsn, flush, -1);
}

int dur_wait_timed(dur_state *d, uint64_t lsn, bool flush, int64_t timeout_ns)
{
    if (d && flush && atomic_load(&d->fatal)) /* a flush vouches for every tick: none after the latch */
        return core_fail(KEEL_EFATAL, "the runtime latched fatal (%s): nothing more is made durable",
                         keel_strerror(atomic_load(&d->fatal)));
    if (!d || atomic_load_explicit(&d->durable_lsn, memory_order_acquire) >= lsn)
        return KEEL_OK;
    if (flush && dur_sync_request(d, lsn)) /* held DEFERRED records must go out now */
        return KEEL_EFATAL;
    /* durable_cv runs on CLOCK_MONOTONIC (recover.c) */
    struct timespec deadline = timeout_ns >= 0 ? core_timespec_at(core_now_ns() + (uint64_t)timeout_ns)
                                               : (struct timespec){0};
    bool timed_out = false;
    pthread_mutex_lock(&d->mu);
    while (atomic_load(&d->durable_lsn) < lsn && !atomic_load(&d->fatal) && !timed_out) {
        /* on the local disk, and the stream has until stream_deadline (a close's) */
        bool bounded = timeout_ns < 0 && d->stream_deadline && d->repl.gate && atomic_load(&d->local_lsn) >= lsn;
        struct timespec stream_by = core_timespec_at(d->stream_deadline);
        if (timeout_ns < 0 && !bounded)
            pthread_cond_wait(&d->durable_cv, &d->mu);
        else
            timed_out = pthread_cond_timedwait(&d->durable_cv, &d->mu, bounded ? &stream_by : &deadline) ==
                        ETIMEDOUT;
    }
    bool durable = atomic_load(&d->durable_lsn) >= lsn, gated = d->repl.gate;
    pthread_mutex_unlock(&d->mu);
    if (durable)
        return KEEL_OK;
    if (!atomic_load(&d->fatal) && gated && atomic_load(&d->local_lsn) >= lsn)
        return core_fail(KEEL_EUNAVAILABLE, "LSN %llu is on the local disk but the replication stream has not "
                         "acknowledged it (acknowledged up to %llu)", (unsigned long long)lsn,
                         (unsigned long long)atomic_load(&d->durable_lsn));
    if (!atomic_load(&d->fatal))
        return core_fail(KEEL_ETIMEDOUT, "LSN %llu is not durable yet (durable up to %llu)", (unsigned long long)lsn,
                         (unsigned long long)atomic_load(&d->durable_lsn));
    return core_fail(KEEL_EFATAL, "LSN %llu cannot be made durable: the runtime latched fatal (%s)",
                     (unsigned long long)lsn, keel_strerror(atomic_load(&d->fatal)));
}

void dur_stream_deadline(dur_state *d, uint64_t deadline_ns)
{
    pthread_mutex_lock(&d->mu);
    d->stream_deadline = deadline_ns;
    pthread_cond_broadcast(&d->durable_cv); /* waiters already on the local disk wait for it from now */
    pthread_mutex_unlock(&d->mu);
}

void dur_promote(dur_state *d)
{
    pthread_mutex_lock(&d->mu);
    d->follow = false;
    d->trim_to_stream = true; /* its records from here on may not be on the stream yet */
    pthread_mutex_unlock(&d->mu);
}

void dur_repl_set(dur_state *d, dur_repl_hook hook)
{
    pthread_mutex_lock(&d->mu);
    while (d->repl_staging) /* the old hook's self must outlive a staged call */
        pthread_cond_wait(&d->durable_cv, &d->mu);
    d->repl = hook;
    d->trim_to_stream |= hook.staged != NULL;
    pthread_mutex_unlock(&d->mu);
}

/* Under d->mu, with the hook gating: a record is durable once it is both
 * committed here and acknowledged by the stream. */
static void gate_advance(dur_state *d)
{
    uint64_t local = atomic_load(&d->local_lsn), lsn = d->stream_lsn < local ? d->stream_lsn : local;
    if (lsn <= atomic_load(&d->durable_lsn))
        return;
    atomic_store_explicit(&d->durable_lsn, lsn, memory_order_release);
    if (lsn == local && d->local_tick)
        atomic_store_explicit(&d->durable_tick, d->local_tick, memory_order_release);
    run_waiters(d, lsn, 0);
    pthread_cond_broadcast(&d->durable_cv);
}

/* Under d->mu, with trim_to_stream: the end of a commit (every commit ends
 * at a unit boundary). Checkpoints delete the WAL up to the last end the
 * stream acknowledged, so a trimmed WAL starts with a whole unit. A full
 * ring takes no more ends until acknowledgements free it: the bound only
 * lags (while the stream is DUR_ENDS commits behind). */
static void ends_push(dur_state *d, uint64_t lsn)
{
    if (lsn <= d->stream_lsn) { /* acknowledged before it was committed (sync sends first) */
        d->stream_unit_lsn = lsn;
        return;
    }
    if (!d->ends && !(d->ends = malloc(DUR_ENDS * sizeof *d->ends)))
        return; /* out of memory: the bound only lags */
    if (d->ends_n < DUR_ENDS)
        d->ends[(d->ends_head + d->ends_n++) % DUR_ENDS] = lsn;
}

static void ends_acknowledged(dur_state *d)
{
    while (d->ends_n && d->ends[d->ends_head] <= d->stream_lsn) {
        d->stream_unit_lsn = d->ends[d->ends_head];
        d->ends_head = (d->ends_head + 1) % DUR_ENDS;
        d->ends_n--;
    }
}

void dur_acknowledge(dur_state *d, uint64_t lsn)
{
    pthread_mutex_lock(&d->mu);
    if (lsn > d->stream_lsn)
        d->stream_lsn = lsn;
    ends_acknowledged(d);
    if (d->repl.gate)
        gate_advance(d);
    pthread_mutex_unlock(&d->mu);
}

uint32_t dur_spans(dur_state *d, struct dur_span *out, uint32_t cap)
{
    pthread_mutex_lock(&d->mu);
    uint64_t n = d->nspans < DUR_SPANS ? d->nspans : DUR_SPANS;
    if (n > cap)
        n = cap;
    for (uint64_t i = 0; i < n; i++)
        out[i] = d->spans[(d->nspans - n + i) % DUR_SPANS];
    pthread_mutex_unlock(&d->mu);
    return (uint32_t)n;
}

uint64_t dur_cover(dur_state *d)
{
    pthread_mutex_lock(&d->mu);
    uint64_t lsn = d->covered_lsn = d->next_lsn - 1;
    pthread_mutex_unlock(&d->mu);
    return lsn;
}

uint64_t dur_last_lsn(dur_state *d)
{
    pthread_mutex_lock(&d->mu);
    uint64_t lsn = d->next_lsn - 1;
    pthread_mutex_unlock(&d->mu);
    return lsn;
}

int dur_sync_request(dur_state *d, uint64_t lsn)
{
    if (atomic_load_explicit(&d->durable_lsn, memory_order_acquire) >= lsn)
        return KEEL_OK;
    dur_item *f = dur_item_new(DUR_FLUSH, KEEL_DURABLE_IMMEDIATE);
    return f && dur_enqueue(d, f, NULL) ? KEEL_EFATAL : KEEL_OK; /* enqueue fails only once latched fatal */
}

/* ---- producers ------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Lock d->mu for a producer, once the writer is not too far behind (back-
 * pressure: a slow disk slows the producers instead of growing memory
 * without bound). false, with d->mu released, when the WAL takes no more
 * records: latched fatal, or a replica (*follow). */
static bool enqueue_lock(dur_state *d, bool *follow)
{
    pthread_mutex_lock(&d->mu);
    while (d->queued_bytes > DUR_QUEUE_MAX_BYTES && !atomic_load(&d->fatal))
        pthread_cond_wait(&d->durable_cv, &d->mu);
    *follow = d->follow;
    if (!atomic_load(&d->fatal) && !*follow)
        return true;
    pthread_mutex_unlock(&d->mu);
    return false;
}

static int enqueue_refused(dur_state *d, bool follow)
{
    if (follow)
        return core_fail(KEEL_EBUSY, "a replica's WAL takes its primary's records only: commit on the primary");
    return core_fail(KEEL_EFATAL, "the WAL cannot take more records: the runtime latched fatal (%s)",
                     keel_strerror(atomic_load(&d->fatal)));
}

/* Under d->mu: item joins the queue, the writer is told. */
static void queue_append(dur_state *d, dur_item *item, size_t bytes)
{
    item->queued = bytes;
    d->queued_bytes += bytes;
    item->queued_ns = now_ns();
    item->next = NULL;
    if (d->tail)
        d->tail->next = item;
    else
        d->head = item;
    d->tail = item;
    pthread_cond_signal(&d->wake);
}

int dur_enqueue(dur_state *d, dur_item *item, uint64_t *last_lsn)
{
    bool follow;
    if (!enqueue_lock(d, &follow)) {
        if (item->kind == DUR_CHECKPOINT) { /* the checkpoint ends here */
            ckpt_committed(d, item->ckpt, KEEL_EFATAL);
            item->ckpt = NULL;
        }
        dur_item_free(item);
        return enqueue_refused(d, follow);
    }
    size_t off = 0, len;
    unsigned char *rec;
    dur_item *t = d->tail;
    if (item->empty_tick && t && t->empty_tick && t->mode == item->mode && t->recs.len == item->recs.len &&
        t->last_lsn > d->covered_lsn) {
        /* idle ticks coalesce: the queued marker of an idle tick the writer
         * has not taken yet becomes this tick's (same LSN; a marker says
         * "every tick up to here is complete", and idle ticks add nothing).
         * Not a marker a checkpoint already covers: it names its tick. */
        memcpy(t->recs.p, item->recs.p, item->recs.len);
        kw_record_seal(t->recs.p, t->last_lsn);
        t->tick = item->tick;
        if (last_lsn)
            *last_lsn = t->last_lsn;
        pthread_mutex_unlock(&d->mu);
        dur_item_free(item);
        return KEEL_OK;
    }
    while (next_record(&item->recs, &off, &rec, &len)) {
        uint64_t lsn = d->next_lsn++;
        kw_record_seal(rec, lsn);
        if (!item->first_lsn)
            item->first_lsn = lsn;
        item->last_lsn = lsn;
    }
    if (last_lsn)
        *last_lsn = item->last_lsn;
    queue_append(d, item, item->recs.len);
    pthread_mutex_unlock(&d->mu);
    return KEEL_OK;
}

int dur_enqueue_reserved(dur_state *d, dur_item *item, uint32_t nfirst, kw_buf *tail, uint64_t bytes,
                         uint64_t *last_lsn)
{
    bool follow;
    if (!enqueue_lock(d, &follow)) {
        dur_item_free(item);
        return enqueue_refused(d, follow);
    }
    item->first_lsn = d->next_lsn;
    d->next_lsn += nfirst;
    size_t off = 0, len;
    unsigned char *rec;
    item->last_lsn = d->next_lsn - 1;
    while (next_record(tail, &off, &rec, &len)) {
        item->last_lsn = d->next_lsn++;
        kw_record_seal(rec, item->last_lsn);
    }
    item->pending = true;
    *last_lsn = item->last_lsn;
    queue_append(d, item, (size_t)bytes);
    pthread_mutex_unlock(&d->mu);
    return KEEL_OK;
}

void dur_item_complete(dur_state *d, dur_item *item)
{
    pthread_mutex_lock(&d->mu);
    /* the estimate was the raw bytes (and a latch may have zeroed the count meanwhile) */
    d->queued_bytes = (d->queued_bytes > item->queued ? d->queued_bytes - item->queued : 0) + item->recs.len;
    item->queued = item->recs.len;
    item->pending = false;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
}

/* Under d->mu: the most payload bytes a side record may hold -- the WAL's
 * limit, or what one message of the replication stream takes (a record is
 * its header and at most its payload's bytes: what does not shrink is
 * stored raw). */
static size_t side_raw_max(const dur_state *d)
{
    size_t r = d->repl.record_max, m = r > KW_HEADER_SIZE ? r - KW_HEADER_SIZE : 0;
    return !r || m > KW_RAW_MAX ? KW_RAW_MAX : m;
}

/* Under d->mu: refuse a side payload of `bytes` that no record of max
 * payload bytes (side_raw_max) could hold (12: its count, flags and length
 * while it waits in a SIDES item). */
static int side_refused(const dur_state *d, size_t bytes, size_t max)
{
    if (bytes <= max && max - bytes >= 12)
        return KEEL_OK;
    if (d->repl.record_max)
        return core_fail(KEEL_EINVAL, "a side transaction of %zu bytes is over the %zu bytes one record may carry "
                         "to the replication stream (the NATS server's max_payload): nothing applied", bytes,
                         max > 12 ? max - 12 : 0);
    return core_fail(KEEL_EINVAL, "a side transaction of %zu bytes is over the WAL record limit of %u bytes: nothing "
                     "applied", bytes, (unsigned)KW_RAW_MAX);
}

int dur_side_fits(dur_state *d, size_t bytes)
{
    pthread_mutex_lock(&d->mu);
    int rc = side_refused(d, bytes, side_raw_max(d));
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* Side transactions committed while the writer is busy share one record:
 * a transaction joins the queue's last item when that item holds side
 * transactions of the same mode and tick, the writer has not taken it (the
 * writer takes the queue up to its first pending item, so the queue's tail never is) and
 * the record stays within DUR_RECORD_TARGET raw bytes (and one stream
 * message, side_raw_max). They share its LSN,
 * so they become durable together, which group commit made them anyway;
 * what they save is a record each: its header, its compression, its LMDB
 * put and, when replicated, its stream message. The writer builds the
 * record (sides_build) when it takes the item. */
int dur_enqueue_side(dur_state *d, keel_durability mode, uint64_t tick, uint32_t flags, const kw_buf *side,
                     uint64_t *lsn)
{
    bool follow;
    if (!enqueue_lock(d, &follow))
        return enqueue_refused(d, follow);
    size_t raw_max = side_raw_max(d);
    int refused = side_refused(d, side->len, raw_max); /* side_fits said yes unless the limit moved since: latches */
    if (refused) {
        pthread_mutex_unlock(&d->mu);
        return refused;
    }
    dur_item *t = d->tail;
    bool join = t && t->kind == DUR_SIDES && t->mode == mode && t->side_tick == tick &&
                t->last_lsn > d->covered_lsn && t->recs.len + 8 + side->len <= DUR_RECORD_TARGET &&
                t->recs.len + 8 + side->len <= raw_max;
    dur_item *it = join ? t : dur_item_new(DUR_SIDES, mode);
    size_t before = it ? it->recs.len : 0;
    int rc = !it ? KEEL_ENOMEM : join ? KEEL_OK : kw_sides_begin(&it->recs);
    if (!rc)
        rc = kw_sides_put(&it->recs, flags, side->p, side->len);
    if (rc) {
        if (join)
            t->recs.len = before; /* the queued transactions stay as they were */
        else
            dur_item_free(it);
        pthread_mutex_unlock(&d->mu);
        return core_fail(KEEL_ENOMEM, "out of memory logging a side transaction"); /* growing a buffer is all that can fail */
    }
    it->nsides++;
    if (join) {
        t->queued += t->recs.len - before;
        d->queued_bytes += t->recs.len - before;
    } else {
        it->side_tick = tick;
        it->first_lsn = it->last_lsn = d->next_lsn++;
        queue_append(d, it, it->recs.len);
    }
    if (lsn)
        *lsn = it->last_lsn;
    pthread_mutex_unlock(&d->mu);
    return KEEL_OK;
}

/* ---- the writer ------------------------------------------------------------------------ */

typedef struct batch {
    dur_item *head, **tail;
    size_t bytes;              /* the records' bytes */
    size_t queued;             /* what its items added to queued_bytes */
    uint64_t records;          /* records in the batch (a checkpoint's marker included) */
    uint64_t last_lsn, last_tick;
    uint64_t oldest_ns;
    uint64_t filled_ns;        /* the last fill's end: the LMDB commit (and its syncs) starts there */
    bool need_sync;
    dur_state *d;
} batch;

static int fill(kw_wtxn *txn, void *arg)
{
    batch *b = arg;
    for (dur_item *it = b->head; it; it = it->next) {
        size_t off = 0, len;
        unsigned char *rec;
        if (it->kind == DUR_CHECKPOINT) {
            /* the item's one record is the checkpoint marker */
            if (!next_record(&it->recs, &off, &rec, &len))
                return core_fail(KEEL_EINVAL, "checkpoint item without a marker record");
            int rc = kw_put_wal(txn, it->first_lsn, rec, len);
            if (!rc)
                rc = ckpt_write(b->d, txn, it->ckpt);
            if (rc)
                return rc;
            continue;
        }
        uint64_t lsn = it->first_lsn;
        while (next_record(&it->recs, &off, &rec, &len)) {
            int rc = kw_put_wal(txn, lsn++, rec, len);
            if (rc)
                return rc;
        }
    }
    b->filled_ns = now_ns(); /* a fill retried after the map grew sets it again */
    return KEEL_OK;
}

static void batch_add(batch *b, dur_item *it)
{
    it->next = NULL;
    *b->tail = it;
    b->tail = &it->next;
    if (!b->bytes && !b->need_sync)
        b->oldest_ns = now_ns();
    b->bytes += it->recs.len;
    b->queued += it->queued;
    if (it->last_lsn) {
        b->last_lsn = it->last_lsn;
        b->records += it->last_lsn - it->first_lsn + 1;
    }
    if (it->tick)
        b->last_tick = it->tick;
    if (it->mode != KEEL_DURABLE_DEFERRED || it->kind != DUR_RECORDS)
        b->need_sync = true;
}

/* Hand the batch's records to replication before they are committed: the
 * stream takes them while the disk syncs. A record the stream holds and
 * this disk does not (a crash, a failed commit) was acknowledged to no one;
 * a node restarting on this directory takes it from the stream. */
static void stage(dur_state *d, const batch *b)
{
    pthread_mutex_lock(&d->mu);
    dur_repl_hook h = d->repl;
    d->repl_staging = h.staged != NULL; /* h.self lives while it is set: dur_repl_set waits */
    pthread_mutex_unlock(&d->mu);
    if (!h.staged)
        return;
    for (const dur_item *it = b->head; it; it = it->next) /* producers are not held back meanwhile */
        if (it->last_lsn)
            h.staged(h.self, it->first_lsn, it->last_lsn, it->recs.p, it->recs.len);
    pthread_mutex_lock(&d->mu);
    d->repl_staging = false;
    pthread_cond_broadcast(&d->durable_cv);
    pthread_mutex_unlock(&d->mu);
}

static void batch_commit(dur_state *d, batch *b)
{
    /* a batch of flush requests only (their records went out before) needs no commit */
    bool work = b->last_lsn != 0;
    for (dur_item *it = b->head; it && !work; it = it->next)
        work = it->kind == DUR_CHECKPOINT;
    if (b->last_lsn)
        stage(d, b);
    uint64_t t0 = now_ns();
    int rc = work ? kw_store_write(d->store, fill, b) : KEEL_OK;
    uint64_t t1 = now_ns();
    if (!rc && work) {
        atomic_fetch_add(&d->fsyncs, 1);
        atomic_fetch_add(&d->wal_bytes, b->bytes);
        atomic_fetch_add(&d->wal_records, b->records);
        core_hist_observe(&d->fsync_hist, t1 - b->filled_ns);
        core_hist_observe(&d->group_hist, b->records);
    }
    if (rc) {
        /* latch before anyone learns of the failure: a checkpoint waiter
         * woken by ckpt_committed below must find the runtime fatal, or it
         * would report a checkpoint that never reached the disk as taken */
        char cause[384];
        snprintf(cause, sizeof cause, "%s", keel_last_error());
        core_log(KEEL_LOG_ERROR, "wal", "commit_failed", "cause=\"%s\"", cause);
        dur_latch_fatal(d, rc);
    }
    /* a recorded checkpoint is told after durable_lsn is published below:
       its waiter (keel_checkpoint) then finds what it covers durable */
    dur_item *ckpts = NULL, **ckpts_tail = &ckpts;
    for (dur_item *it = b->head; it;) {
        dur_item *next = it->next;
        if (!rc && it->last_lsn) /* durable at t1: published below, before anyone is told */
            core_hist_observe(&d->commit_hist, t1 - it->queued_ns);
        if (it->kind == DUR_CHECKPOINT && !rc) {
            it->next = NULL;
            *ckpts_tail = it;
            ckpts_tail = &it->next;
        } else {
            if (it->kind == DUR_CHECKPOINT)
                ckpt_committed(d, it->ckpt, rc), it->ckpt = NULL;
            dur_item_free(it);
        }
        it = next;
    }
    pthread_mutex_lock(&d->mu);
    d->queued_bytes -= b->queued < d->queued_bytes ? b->queued : d->queued_bytes;
    if (!rc && work)
        d->spans[d->nspans++ % DUR_SPANS] = (struct dur_span){t0, t1 - t0, b->bytes, b->last_lsn};
    uint64_t committed = !rc ? b->last_lsn : 0;
    if (!rc) {
        if (b->last_lsn)
            atomic_store_explicit(&d->local_lsn, b->last_lsn, memory_order_release);
        if (b->last_tick)
            d->local_tick = b->last_tick;
        if (d->repl.gate) {
            gate_advance(d);
            if (d->stream_deadline) /* bounded waiters wait for the local disk first */
                pthread_cond_broadcast(&d->durable_cv);
        } else {
            if (b->last_lsn)
                atomic_store_explicit(&d->durable_lsn, b->last_lsn, memory_order_release);
            if (b->last_tick)
                atomic_store_explicit(&d->durable_tick, b->last_tick, memory_order_release);
            run_waiters(d, atomic_load(&d->durable_lsn), 0);
            pthread_cond_broadcast(&d->durable_cv);
        }
    }
    if (committed && d->trim_to_stream)
        ends_push(d, committed);
    if (committed && d->repl.committed) /* under d->mu: dur_repl_set may free the old hook's self */
        d->repl.committed(d->repl.self, committed);
    pthread_mutex_unlock(&d->mu);
    for (dur_item *it = ckpts; it;) {
        dur_item *next = it->next;
        ckpt_committed(d, it->ckpt, KEEL_OK);
        it->ckpt = NULL;
        dur_item_free(it);
        it = next;
    }
    *b = (batch){.tail = &b->head, .d = d};
}

/* The record of a DUR_SIDES item (dur_enqueue_side), sealed with its LSN:
 * a SIDE record when it holds one transaction (the record it would have
 * had alone), else a SIDES record. The item becomes DUR_RECORDS. */
static int sides_build(dur_state *d, dur_item *it)
{
    kw_buf *out = &d->side_build;
    out->len = 0;
    int rc;
    if (it->nsides == 1) {
        kw_cursor c = kw_cursor_make(it->recs.p + 4, it->recs.len - 4); /* past the count */
        uint32_t flags = kw_get_u32(&c), len = kw_get_u32(&c);
        rc = kw_record_build_unsealed(d->side_codec, out, KW_KIND_SIDE, it->side_tick, flags, c.p, len);
    } else {
        kw_sides_end(&it->recs, it->nsides);
        rc = kw_record_build_unsealed(d->side_codec, out, KW_KIND_SIDES, it->side_tick, 0, it->recs.p, it->recs.len);
    }
    if (rc)
        return rc;
    kw_record_seal(out->p, it->first_lsn);
    kw_buf raw = it->recs; /* swapped: the scratch keeps the other buffer for the next build */
    it->recs = *out;
    *out = raw;
    if (out->cap > DUR_SIDES_SCRATCH_MAX) /* not for the runtime's life after one huge transaction */
        kw_buf_free(out);
    it->kind = DUR_RECORDS;
    return KEEL_OK;
}

/* Under d->mu: the queue has an item the writer may take (not pending). */
static bool queue_ready(const dur_state *d)
{
    return d->head && !d->head->pending;
}

/* Under d->mu: take the queue up to its first pending item. */
static dur_item *queue_take(dur_state *d)
{
    dur_item *list = d->head, *last = NULL;
    for (dur_item *it = d->head; it && !it->pending; it = it->next)
        last = it;
    if (!last)
        return NULL;
    d->head = last->next;
    if (!d->head)
        d->tail = NULL;
    last->next = NULL;
    return list;
}

static void *writer_main(void *arg)
{
    dur_state *d = arg;
    batch b = {.tail = &b.head, .d = d};
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!queue_ready(d) && !(d->quit && !d->head) && !atomic_load(&d->fatal)) {
            if (b.head) { /* held DEFERRED records: wake when they are due */
                uint64_t due = b.oldest_ns + DUR_DEFER_MAX_NS, now = now_ns();
                if (now >= due)
                    break;
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (due - now);
                ts = (struct timespec){(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
                pthread_cond_timedwait(&d->wake, &d->mu, &ts);
            } else {
                pthread_cond_wait(&d->wake, &d->mu);
            }
        }
        dur_item *list = queue_take(d);
        bool quit = d->quit;
        pthread_mutex_unlock(&d->mu);
        for (dur_item *it = list; it && !atomic_load(&d->fatal); it = it->next) {
            int rc = it->kind == DUR_SIDES ? sides_build(d, it) : KEEL_OK;
            if (rc)
                dur_latch_fatal(d, rc); /* what is queued is dropped below: nothing after it may commit */
        }
        if (atomic_load(&d->fatal)) { /* acknowledge nothing more: drop what is queued */
            while (list) {
                dur_item *next = list->next;
                if (list->kind == DUR_CHECKPOINT)
                    ckpt_committed(d, list->ckpt, KEEL_EFATAL), list->ckpt = NULL;
                dur_item_free(list);
                list = next;
            }
            for (dur_item *it = b.head; it;) {
                dur_item *next = it->next;
                dur_item_free(it);
                it = next;
            }
            b = (batch){.tail = &b.head, .d = d};
            pthread_mutex_lock(&d->mu);
            d->queued_bytes = 0;
            pthread_cond_broadcast(&d->durable_cv);
            if (quit && !d->head)
                break;
            while (!queue_ready(d) && !(d->quit && !d->head))
                pthread_cond_wait(&d->wake, &d->mu);
            continue;
        }
        while (list) {
            dur_item *next = list->next;
            batch_add(&b, list);
            list = next;
        }
        if (b.head && (b.need_sync || quit || b.bytes >= DUR_DEFER_MAX_BYTES ||
                       now_ns() >= b.oldest_ns + DUR_DEFER_MAX_NS))
            batch_commit(d, &b);
        pthread_mutex_lock(&d->mu);
        if (quit && !d->head && !b.head)
            break;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* The buckets (docs/operations.md "Monitor"): a synced commit takes from
 * tens of microseconds (a write cache) to tens of milliseconds (a disk that
 * really flushes); a GROUP tick's records wait for one batch, a DEFERRED
 * one up to DUR_DEFER_MAX_NS; at 60 Hz a group commit holds a tick's
 * records and the side transactions beside them. */
static const uint64_t fsync_bounds[] = {
    50000, 100000, 250000, 500000, 1000000, 2000000, 5000000, 10000000, 25000000, 50000000, 100000000,
    250000000, 1000000000,
};
static const uint64_t commit_bounds[] = {
    250000, 500000, 1000000, 2000000, 5000000, 10000000, 20000000, 50000000, 100000000, 250000000,
    500000000, 1000000000, 2500000000,
};
static const uint64_t group_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
static const uint64_t ckpt_bounds[] = {
    10000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000, 10000000000,
    30000000000, 60000000000, 300000000000,
};

#define NBOUNDS(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

void dur_metrics_init(dur_state *d)
{
    core_hist_init(&d->fsync_hist, fsync_bounds, NBOUNDS(fsync_bounds));
    core_hist_init(&d->commit_hist, commit_bounds, NBOUNDS(commit_bounds));
    core_hist_init(&d->group_hist, group_bounds, NBOUNDS(group_bounds));
    core_hist_init(&d->ckpt_hist, ckpt_bounds, NBOUNDS(ckpt_bounds));
}

int dur_writer_start(dur_state *d)
{
    if (pthread_create(&d->thread, NULL, writer_main, d))
        return core_fail(KEEL_ENOMEM, "cannot start the WAL writer thread");
    core_thread_name(d->thread, "keel-wal-writer");
    d->thread_running = true;
    return KEEL_OK;
}

void dur_writer_stop(dur_state *d)
{
    if (!d || !d->thread_running)
        return;
    pthread_mutex_lock(&d->mu);
    d->quit = true;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    d->thread_running = false;
}
