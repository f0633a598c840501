/*
 * repl/publish.c -- the publisher: one thread that copies the records a
 * store commits to the stream, in LSN order, and renews the lease.
 *
 * Protocol (under mu): the durability layer's writer raises `committed`
 * after each LMDB commit and signals `wake`; the thread reads the records
 * after `published` from the store (a read transaction: the writer is never
 * waited for), publishes each with the expected last sequence lsn - 1, and
 * raises `published` as the stream acknowledges them, telling acked(). A
 * failure to reach the stream is retried every RETRY_MS (`degraded` while it
 * lasts); a refused publish or a lost lease means another primary exists:
 * failed(KEEL_EFENCED) is told once and nothing more is published. The
 * lease is renewed every lease_ms / 3.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "core/core.h"
#include "repl_internal.h"

#define RETRY_MS 100
#define COPY_MAX 2048             /* records copied out of the store at a time (one pipelined batch) */
#define COPY_BYTES (4u << 20)

struct kr_pub {
    kr_pub_desc d;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* work for the thread */
    pthread_cond_t done;       /* `published` moved, or the thread stopped */
    uint64_t committed, published;
    uint64_t sent_records, sent_bytes; /* acknowledged by the stream, since the start (under mu) */
    uint64_t errors;
    bool degraded, fenced, quit, stopped;
    uint64_t renew_at_ns;
    kw_buf copy;               /* records on their way from the store to the stream (the thread's) */
    uint64_t ckpt_lsn;         /* the last checkpoint published (under mu) */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void deadline_in(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t at = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec + ns;
    *ts = (struct timespec){(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
}

/* Deposed: say so once; the thread publishes nothing more. */
static void fence(kr_pub *p)
{
    pthread_mutex_lock(&p->mu);
    bool first = !p->fenced;
    p->fenced = true;
    pthread_cond_broadcast(&p->done);
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

/* Copy up to COPY_MAX records after `published` (and up to upto) out of
 * the store: the read transaction stays short, as a growing map needs
 * (kw_read_begin). */
static int copy_committed(kr_pub *p, uint64_t upto, kw_buf *out, size_t *offs, uint32_t *n)
{
    kw_rtxn *r;
    int rc = kw_read_begin(p->d.store, &r);
    if (rc)
        return rc;
    kw_walit *it;
    uint64_t lsn, expect = p->published + 1;
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

/* Publish the committed records after `published`, a copied batch at a
 * time, pipelined: 0 when all went, or the first failure. */
static int publish_committed(kr_pub *p, uint64_t upto)
{
    size_t offs[COPY_MAX + 1], lens[COPY_MAX];
    const void *recs[COPY_MAX];
    uint32_t n = 0;
    int rc = KEEL_OK;
    while (!rc && p->published < upto) {
        if ((rc = copy_committed(p, upto, &p->copy, offs, &n)) || !n)
            break;
        for (uint32_t i = 0; i < n; i++) {
            recs[i] = (const char *)p->copy.p + offs[i];
            lens[i] = offs[i + 1] - offs[i];
        }
        uint64_t acked = p->published;
        rc = kr_publish_batch(p->d.node, p->d.epoch, p->published + 1, n, recs, lens, &acked);
        bool marker = false;
        for (uint32_t i = 0; i < n && p->published + 1 + i <= acked; i++)
            marker |= ((const unsigned char *)recs[i])[6] == KW_KIND_CHECKPOINT;
        if (acked > p->published) {
            uint64_t bytes = 0, k = acked - p->published;
            for (uint64_t i = 0; i < k; i++)
                bytes += lens[i];
            pthread_mutex_lock(&p->mu);
            p->sent_records += k;
            p->sent_bytes += bytes;
            p->published = acked;
            pthread_cond_broadcast(&p->done);
            pthread_mutex_unlock(&p->mu);
            p->d.acked(p->d.self, acked);
        }
        if (marker)
            publish_checkpoint(p);
    }
    return rc;
}

static int renew(kr_pub *p)
{
    int rc = kr_lease_renew(p->d.node, p->d.epoch, false, &p->d.lease_rev);
    p->renew_at_ns = now_ns() + (uint64_t)p->d.lease_ms * 1000000ull / (rc ? 10 : 3);
    return rc;
}

static void *pub_main(void *arg)
{
    kr_pub *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->fenced) {
        uint64_t now = now_ns();
        if (p->committed <= p->published && p->quit)
            break;
        if (p->committed <= p->published && now < p->renew_at_ns) {
            struct timespec ts;
            deadline_in(&ts, p->renew_at_ns - now);
            pthread_cond_timedwait(&p->wake, &p->mu, &ts);
            continue;
        }
        uint64_t upto = p->committed;
        pthread_mutex_unlock(&p->mu);
        int rc = now_ns() >= p->renew_at_ns ? renew(p) : KEEL_OK;
        if (!rc && upto > p->published)
            rc = publish_committed(p, upto);
        if (rc == KEEL_EFENCED) {
            fence(p);
        } else {
            note_error(p, rc != 0);
            if (rc) { /* the stream is out of reach: try again soon, or give up when told to stop */
                pthread_mutex_lock(&p->mu);
                if (p->quit) {
                    pthread_mutex_unlock(&p->mu);
                    break;
                }
                struct timespec ts;
                deadline_in(&ts, RETRY_MS * 1000000ull);
                pthread_cond_timedwait(&p->wake, &p->mu, &ts);
                pthread_mutex_unlock(&p->mu);
            }
        }
        pthread_mutex_lock(&p->mu);
    }
    if (p->fenced || p->quit) {
        p->stopped = true;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kr_pub_start(const kr_pub_desc *d, kr_pub **out)
{
    kr_pub *p = calloc(1, sizeof *p);
    if (!p)
        return core_fail(KEEL_ENOMEM, "out of memory for the publisher");
    p->d = *d;
    p->committed = p->published = d->published;
    p->renew_at_ns = now_ns() + (uint64_t)d->lease_ms * 1000000ull / 3;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &ca);
    pthread_cond_init(&p->done, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&p->thread, NULL, pub_main, p)) {
        free(p);
        return core_fail(KEEL_ENOMEM, "cannot start the publisher thread");
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

int kr_pub_drain(kr_pub *p, int64_t timeout_ms)
{
    struct timespec ts;
    deadline_in(&ts, (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000ull);
    pthread_mutex_lock(&p->mu);
    int w = 0;
    while (p->published < p->committed && !p->fenced && !p->stopped && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&p->done, &p->mu, &ts);
    int rc = p->fenced ? KEEL_EFENCED : p->published < p->committed ? KEEL_EUNAVAILABLE : KEEL_OK;
    uint64_t pub = p->published, com = p->committed;
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

void kr_pub_stop(kr_pub *p, bool release)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    if (release && !p->fenced && p->published >= p->committed)
        (void)kr_lease_renew(p->d.node, p->d.epoch, true, &p->d.lease_rev);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    kw_buf_free(&p->copy);
    free(p);
}
