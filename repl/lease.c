/*
 * repl/lease.c -- the primary's lease: key <world> of the KV bucket
 * KEEL_LEASE, value "epoch=E node=N state=held|released".
 *
 * Every change is a compare-and-set on the revision the writer read, so of
 * two nodes racing for the lease exactly one wins. The lease never expires
 * by itself: a standby decides that it lapsed when its revision has not
 * moved for the lease time by the standby's own clock (the holder renews
 * three times per lease time), and then takes it by compare-and-set on that
 * very revision -- a holder that renewed in between makes the take fail.
 * A lease nobody holds yet (no key, no bucket) lapses the same way: after a
 * lease time of watching it absent, so a standby started beside a primary
 * that is still opening does not take the world from it.
 * The stream's expected-last-sequence publishes, not the lease, are what
 * keep a deposed primary from appending (repl/nats.c).
 *
 * The holder renews on a thread of its own, the keeper, from the take to
 * the stop: nothing else a primary does (recovering, seeding, publishing a
 * checkpoint, settling a pipeline against a slow stream) delays a renewal.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "repl_internal.h"

static void lease_parse(const char *v, int len, kr_lease *out)
{
    char buf[256], node[KR_NODE_MAX + 1] = "", state[16] = "";
    snprintf(buf, sizeof buf, "%.*s", len, v);
    unsigned long long e = 0;
    if (sscanf(buf, "epoch=%llu node=%64s state=%15s", &e, node, state) == 3) {
        out->epoch = e;
        snprintf(out->node, sizeof out->node, "%s", node);
        out->released = !strcmp(state, "released");
    }
}

int kr_lease_read(kr_node *n, kr_lease *out)
{
    *out = (kr_lease){0};
    int rc = kr_ensure_bucket(n, false);
    if (rc)
        return rc == KEEL_ENOENT ? KEEL_OK : rc; /* no bucket: nobody ever held the lease */
    kvEntry *e = NULL;
    natsStatus s = kvStore_Get(&e, n->kv, n->world);
    if (s == NATS_NOT_FOUND)
        return KEEL_OK;
    if (s != NATS_OK)
        return core_fail(KEEL_EUNAVAILABLE, "cannot read the lease of world '%s': %s", n->world,
                         natsStatus_GetText(s));
    out->exists = true;
    out->rev = kvEntry_Revision(e);
    lease_parse(kvEntry_Value(e), kvEntry_ValueLen(e), out);
    kvEntry_Destroy(e);
    return KEEL_OK;
}

static int lease_value(const kr_node *n, uint64_t epoch, bool released, char *buf, size_t cap)
{
    return snprintf(buf, cap, "epoch=%" PRIu64 " node=%s state=%s", epoch, n->node, released ? "released" : "held");
}

/* After a failed compare-and-set of this node's (epoch, released) at
 * revision rev. NATS may have applied the write and lost only its reply (a
 * timeout while the bucket's leader changed), or this is the retry of such
 * a write: the lease then holds exactly that value at a later revision,
 * which is success (*now_rev that revision). Otherwise the lease moved
 * (`moved`: KEEL_ECONFLICT for a take, KEEL_EFENCED for a holder) or NATS
 * did not answer (KEEL_EUNAVAILABLE). */
static int cas_failed(kr_node *n, uint64_t rev, uint64_t epoch, bool released, natsStatus s, int moved,
                      uint64_t *now_rev)
{
    kr_lease now;
    if (kr_lease_read(n, &now) == KEEL_OK && (!now.exists || now.rev != rev)) {
        if (now.exists && now.epoch == epoch && now.released == released && !strcmp(now.node, n->node)) {
            *now_rev = now.rev;
            return KEEL_OK;
        }
        return core_fail(moved, "the lease of world '%s' moved on: now epoch %" PRIu64 " held by %s", n->world,
                         now.epoch, now.exists ? now.node : "nobody");
    }
    return core_fail(KEEL_EUNAVAILABLE, "cannot write the lease of world '%s': %s", n->world, natsStatus_GetText(s));
}

/* The epoch of the stream's last record (0: none, or a seed's): epochs only
 * grow along the stream, also when the lease's key was lost since (its
 * bucket purged or made again) and the lease starts again from nothing. */
static int stream_epoch(kr_node *n, uint64_t *epoch)
{
    uint64_t first, last;
    kw_buf msg = {0};
    *epoch = 0;
    int rc = kr_bounds(n, &first, &last);
    if (!rc && first && first <= last)
        rc = kr_get_epoch(n, last, &msg, epoch);
    kw_buf_free(&msg);
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

int kr_lease_take(kr_node *n, const kr_lease *seen, uint64_t *epoch, uint64_t *rev)
{
    char v[160];
    uint64_t past;
    int rc = stream_epoch(n, &past);
    if (rc)
        return rc;
    uint64_t e = (seen->epoch > past ? seen->epoch : past) + 1;
    int len = lease_value(n, e, false, v, sizeof v);
    if ((rc = kr_ensure_bucket(n, true)))
        return rc;
    natsStatus s = seen->exists ? kvStore_Update(rev, n->kv, n->world, v, len, seen->rev)
                                : kvStore_Create(rev, n->kv, n->world, v, len);
    if (s != NATS_OK && (rc = cas_failed(n, seen->exists ? seen->rev : 0, e, false, s, KEEL_ECONFLICT, rev)))
        return rc;
    *epoch = e;
    return KEEL_OK;
}

int kr_lease_renew(kr_node *n, uint64_t epoch, bool released, uint64_t *rev)
{
    char v[160];
    int len = lease_value(n, epoch, released, v, sizeof v);
    uint64_t now = 0;
    int rc = kr_ensure_bucket(n, false);
    if (rc)
        return rc == KEEL_ENOENT ? core_fail(KEEL_EFENCED, "the lease bucket of world '%s' is gone", n->world) : rc;
    natsStatus s = kvStore_Update(&now, n->kv, n->world, v, len, *rev);
    if (s != NATS_OK && (rc = cas_failed(n, *rev, epoch, released, s, KEEL_EFENCED, &now)))
        return rc;
    *rev = now;
    return KEEL_OK;
}

/* ---- the keeper ------------------------------------------------------------------ */

/* Protocol (under mu): the thread renews every lease_ms / 3 (lease_ms / 10
 * after a failure), each renewal a compare-and-set on `rev`, which only the
 * thread touches while it runs. A lost lease sets `lost`, is told once
 * through d.lost (on the thread) and ends the thread. kr_keeper_stop sets
 * `quit`, signals `wake` and joins: after it, `rev` is the caller's. */
struct kr_keeper {
    kr_keeper_desc d;
    uint64_t rev;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool quit, lost, failing;
    uint64_t errors;
};

static void keeper_wait(kr_keeper *k, uint64_t ns)
{
    struct timespec ts = core_timespec_at(core_now_ns() + ns);
    while (!k->quit && pthread_cond_timedwait(&k->wake, &k->mu, &ts) != ETIMEDOUT)
        ;
}

static void *keeper_main(void *arg)
{
    kr_keeper *k = arg;
    uint64_t period = (uint64_t)k->d.lease_ms * 1000000ull;
    pthread_mutex_lock(&k->mu);
    for (int rc = KEEL_OK; !k->quit;) {
        keeper_wait(k, rc ? period / 10 : period / 3);
        if (k->quit)
            break;
        pthread_mutex_unlock(&k->mu);
        rc = kr_lease_renew(k->d.node, k->d.epoch, false, &k->rev);
        pthread_mutex_lock(&k->mu);
        k->failing = rc != KEEL_OK;
        k->errors += rc != KEEL_OK;
        if (rc == KEEL_EFENCED) {
            k->lost = true;
            pthread_mutex_unlock(&k->mu);
            k->d.lost(k->d.self, rc);
            return NULL;
        }
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

int kr_keeper_start(const kr_keeper_desc *d, kr_keeper **out)
{
    kr_keeper *k = calloc(1, sizeof *k);
    if (!k)
        return core_fail(KEEL_ENOMEM, "out of memory for the lease keeper");
    k->d = *d;
    k->rev = d->rev;
    pthread_mutex_init(&k->mu, NULL);
    core_cond_init_monotonic(&k->wake);
    if (pthread_create(&k->thread, NULL, keeper_main, k)) {
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->wake);
        free(k);
        return core_fail(KEEL_ENOMEM, "cannot start the lease keeper's thread");
    }
    *out = k;
    return KEEL_OK;
}

void kr_keeper_stats_get(kr_keeper *k, kr_keeper_stats *out)
{
    pthread_mutex_lock(&k->mu);
    *out = (kr_keeper_stats){.errors = k->errors, .failing = k->failing, .lost = k->lost};
    pthread_mutex_unlock(&k->mu);
}

int kr_keeper_check(kr_keeper *k)
{
    if (!k)
        return KEEL_OK;
    pthread_mutex_lock(&k->mu);
    bool lost = k->lost;
    pthread_mutex_unlock(&k->mu);
    return lost ? core_fail(KEEL_EFENCED, "fenced: the lease of world '%s' moved to another node",
                            kr_world(k->d.node))
                : KEEL_OK;
}

void kr_keeper_halt(kr_keeper *k)
{
    pthread_mutex_lock(&k->mu);
    k->quit = true;
    pthread_cond_signal(&k->wake);
    pthread_mutex_unlock(&k->mu);
}

void kr_keeper_stop(kr_keeper *k, bool release, kr_keeper_stats *last)
{
    if (!k)
        return;
    kr_keeper_halt(k);
    pthread_join(k->thread, NULL);
    if (last)
        kr_keeper_stats_get(k, last);
    if (release && !k->lost)
        (void)kr_lease_renew(k->d.node, k->d.epoch, true, &k->rev);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->wake);
    free(k);
}
