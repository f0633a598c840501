/*
 * runtime/replication.c -- a replicated world (keel/replication.h): the
 * stream and lease of libkeel_repl tied to durable/'s seams.
 *
 *   open     Every role first brings its directory in step with the stream
 *            (kr_sync_store: what it holds beyond the stream is dropped,
 *            what the stream holds beyond it is copied). A primary then
 *            takes the lease in a new epoch (waiting while a live primary
 *            renews it), publishes its EPOCH record right after the
 *            stream's end and appends it locally; recovery then replays the
 *            directory as after a crash. A standby or follower opens its
 *            directory as a follower's (dur_open_desc.follow).
 *   primary  The writer's hook hands each commit's last LSN to the
 *            publisher; with SYNC the hook gates durability on the
 *            publisher's acknowledgements (dur_acknowledge). A refused
 *            publish or lost lease latches the runtime KEEL_EFENCED.
 *   replica  keel_replica_poll copies new records into the directory and
 *            applies them with dur_follow (recovery's replay), then
 *            publishes a read view. A standby whose primary's lease lapsed
 *            catches up with the stream's end, takes the lease, publishes
 *            its EPOCH record (refused: someone appended, catch up again),
 *            applies it (an unfinished unit before it is dropped) and
 *            becomes the primary in place: a promotion is a crash recovery
 *            that already happened.
 * Status fields are read by other threads (metrics, status lines) under mu.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "keel_repl/repl.h"
#include "runtime/runtime_internal.h"

#define POLL_BATCH 4096
#define EPOCH_TRIES 8
#define DRAIN_MS 5000
#define SCHEMA_WAIT_TIMEOUTS 30 /* a replica waits this many NATS timeouts for its primary (60 s by default) */
#define RETAIN_DEFAULT 100000

struct runtime_repl {
    keel_replication_desc desc; /* strings point into the buffers below */
    char nats[1024], world[KR_WORLD_MAX + 1], node_name[KR_NODE_MAX + 1];
    int32_t lease_ms;
    kr_node *node;
    kr_pub *pub;
    kr_keeper *keeper;         /* a primary's: renews the lease from its take to the close */
    int lost_early;            /* the keeper lost the lease before the publisher started (under mu) */
    kr_reader *reader;         /* a replica's: at the directory's next LSN */
    uint64_t received_tick;    /* a replica: the highest tick its polls copied into the directory */
    kr_boot *boot;             /* a replica's bootstrap whose directory copy may still run (repl_settle) */
    dur_boot boot_desc;        /* ... what recovery loads from it */
    uint64_t local_last;       /* the directory's last LSN */
    uint64_t epoch_lsn;        /* a primary: its EPOCH record */
    /* a standby's view of the lease */
    kr_lease seen;
    uint64_t seen_since_ns;
    pthread_mutex_t mu;        /* the status below */
    keel_repl_status st;
};

const char *keel_repl_mode_name(keel_repl_mode m)
{
    return m == KEEL_REPL_SYNC ? "sync" : m == KEEL_REPL_ASYNC ? "async" : "off";
}

const char *keel_repl_role_name(keel_repl_role r)
{
    return r == KEEL_ROLE_STANDBY ? "standby" : r == KEEL_ROLE_FOLLOWER ? "follower" : "primary";
}

static int copy_str(char *dst, size_t cap, const char *src, const char *what)
{
    if (strlen(src) >= cap)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication.%s is longer than %zu bytes", what, cap - 1);
    memcpy(dst, src, strlen(src) + 1);
    return KEEL_OK;
}

int repl_create(keel_runtime *rt, const keel_replication_desc *d)
{
    if (!d->nats)
        return KEEL_OK;
    if (!rt->data_dir)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication needs a data directory (durable.dir)");
    if (!d->world)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication.world is NULL");
    if (d->role < KEEL_ROLE_PRIMARY || d->role > KEEL_ROLE_FOLLOWER)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication.role %d is not a keel_repl_role", (int)d->role);
    if (d->mode < KEEL_REPL_OFF || d->mode > KEEL_REPL_SYNC)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication.mode %d is not a keel_repl_mode", (int)d->mode);
    if (d->lease_ms < 0 || d->replicas < 0 || d->replicas > 5 || d->timeout_ms < 0)
        return core_fail(KEEL_EINVAL, "keel_runtime_create: replication.lease_ms, timeout_ms must be >= 0 and "
                                      "replicas in [0, 5]");
    int bad = kr_check(d->nats, d->world);
    if (bad)
        return core_fail_prefix(bad, "keel_runtime_create: replication");
    struct runtime_repl *r = calloc(1, sizeof *r);
    if (!r)
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory");
    r->desc = *d;
    int rc = copy_str(r->nats, sizeof r->nats, d->nats, "nats");
    if (!rc)
        rc = copy_str(r->world, sizeof r->world, d->world, "world");
    if (!rc && d->node)
        rc = copy_str(r->node_name, sizeof r->node_name, d->node, "node");
    if (rc) {
        free(r);
        return rc;
    }
    r->desc.nats = r->nats;
    r->desc.world = r->world;
    r->desc.node = d->node ? r->node_name : NULL;
    r->lease_ms = d->lease_ms ? d->lease_ms : 5000;
    pthread_mutex_init(&r->mu, NULL);
    r->st.role = d->role;
    r->st.mode = d->role != KEEL_ROLE_PRIMARY ? KEEL_REPL_OFF : d->mode ? d->mode : KEEL_REPL_ASYNC;
    rt->repl = r;
    return KEEL_OK;
}

static void drop_keeper(struct runtime_repl *r, bool release);

void repl_free(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    if (!r)
        return;
    drop_keeper(r, false);
    kr_read_end(r->reader);
    kr_close(r->node);
    pthread_mutex_destroy(&r->mu);
    free(r);
    rt->repl = NULL;
}

bool repl_may_tick(const keel_runtime *rt)
{
    return !rt->repl || rt->repl->st.role == KEEL_ROLE_PRIMARY;
}

static void status_set(struct runtime_repl *r, void (*fn)(keel_repl_status *st, const void *arg), const void *arg)
{
    pthread_mutex_lock(&r->mu);
    fn(&r->st, arg);
    pthread_mutex_unlock(&r->mu);
}

/* ---- the lease ------------------------------------------------------------------ */

/* Has the lease lapsed, as this node has watched it? It lapsed when its
 * holder let it go, or when it stood still (the same revision, or absent)
 * for a lease time of watching. r->seen is what a take compares against.
 * Time the lease could not be read is no watching: its holder could not
 * renew it either, so the watch starts again once it can be read. */
static bool lease_lapsed(struct runtime_repl *r)
{
    kr_lease now;
    if (kr_lease_read(r->node, &now)) {
        r->seen_since_ns = 0;
        return false; /* out of reach: nobody can take it either */
    }
    uint64_t t = core_now_ns();
    if (!r->seen_since_ns || now.rev != r->seen.rev || now.exists != r->seen.exists)
        r->seen_since_ns = t;
    r->seen = now;
    return now.released || t - r->seen_since_ns >= (uint64_t)r->lease_ms * 1000000ull;
}

/* The keeper lost the lease (on its thread): the publisher is fenced, or
 * -- not started yet -- start_primary fences it. */
static void on_lease_lost(void *self, int rc)
{
    struct runtime_repl *r = self;
    pthread_mutex_lock(&r->mu);
    kr_pub *pub = r->pub; /* stays until repl_close, which stops the keeper first */
    if (!pub)
        r->lost_early = rc;
    pthread_mutex_unlock(&r->mu);
    if (pub)
        kr_pub_fence(pub);
}

/* From the take on, the keeper renews the lease (epoch, at rev). */
static int keep_lease(struct runtime_repl *r, uint64_t epoch, uint64_t rev)
{
    kr_keeper *k;
    kr_keeper_desc kd = {.node = r->node, .epoch = epoch, .rev = rev, .lease_ms = r->lease_ms, .self = r,
                         .lost = on_lease_lost};
    int rc = kr_keeper_start(&kd, &k);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->mu);
    r->keeper = k;
    r->lost_early = 0;
    pthread_mutex_unlock(&r->mu);
    return KEEL_OK;
}

/* Stop renewing; release: let the lease go (a clean close). The keeper's
 * errors stay in r->st.errors (a counter: it never goes down): what it had
 * counted moves there the moment the status stops reading it, what its
 * last renewal adds once its thread ended. */
static void drop_keeper(struct runtime_repl *r, bool release)
{
    kr_keeper_stats before = {0}, last = {0};
    pthread_mutex_lock(&r->mu);
    kr_keeper *k = r->keeper;
    if (k)
        kr_keeper_stats_get(k, &before);
    r->st.errors += before.errors;
    r->keeper = NULL;
    pthread_mutex_unlock(&r->mu);
    if (!k)
        return;
    kr_keeper_stop(k, release, &last);
    pthread_mutex_lock(&r->mu);
    r->st.errors += last.errors - before.errors;
    pthread_mutex_unlock(&r->mu);
}

/* A primary at open: wait until the lease lapses and take it (take false:
 * only wait, before the directory is brought in step with the stream, so
 * that a node refused for a live primary has written nothing). A holder
 * that keeps renewing for three lease times is a live primary: KEEL_EBUSY. */
static int lease_at_open(struct runtime_repl *r, bool take, uint64_t *epoch, uint64_t *rev)
{
    uint64_t start = core_now_ns(), patience = 3ull * (uint64_t)r->lease_ms * 1000000ull;
    for (;;) {
        /* a lease nobody ever held is free: only a live primary holds one */
        if (lease_lapsed(r) || !r->seen.exists) {
            if (!take)
                return KEEL_OK;
            int rc = kr_lease_take(r->node, &r->seen, epoch, rev);
            if (rc != KEEL_ECONFLICT)
                return rc;
            r->seen_since_ns = 0;
        }
        if (core_now_ns() - start > patience)
            return core_fail(KEEL_EBUSY, "world '%s' has a live primary: %s holds its lease (epoch %" PRIu64
                             ") and renews it; start this node as --standby, or stop that one",
                             r->world, r->seen.node, r->seen.epoch);
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
}

/* Did another node publish an EPOCH record among the directory's LSNs
 * [from, to]? Then it became the primary first. */
static bool epoch_among(kw_store *store, uint64_t from, uint64_t to)
{
    kw_rtxn *t;
    kw_scan *sc = NULL;
    kw_record rec;
    if (from > to || kw_read_begin(store, &t))
        return false;
    bool found = !kw_scan_begin(t, &(kw_range){.from_lsn = from, .to_lsn = to, .kinds = 1u << KW_KIND_EPOCH}, &sc) &&
                 kw_scan_next(sc, &rec) == 1;
    kw_scan_end(sc);
    kw_read_end(t);
    return found;
}

/* A replica's directory holds a world its stream never held: KEEL_ERANGE. */
static int unstreamed(struct runtime_repl *r, kw_store *store, const kr_sync_info *si)
{
    return core_fail(KEEL_ERANGE, "world '%s': the stream holds no record, and directory %s holds a world (up to LSN %"
                     PRIu64 "): start its primary on it first, which publishes it; nothing written", r->world,
                     kw_store_dir(store), si->local_last);
}

/* kr_seed_stream's progress: a seed stops once the keeper lost the lease
 * (a standby took over a half-published world). */
static int seed_check(void *arg)
{
    return kr_keeper_check(arg);
}

/* The stream lacks the world this primary's directory holds (it never held
 * a record, or a seed was cut short): publish it, logged as repl/seeded. */
static int seed(struct runtime_repl *r, kw_store *store, const kr_sync_info *si)
{
    int rc = kr_seed_stream(r->node, store, si->stream_last + 1, si->local_last, seed_check, r->keeper);
    if (!rc)
        core_log(KEEL_LOG_INFO, "repl", "seeded", "world=%s from_lsn=%" PRIu64 " records=%" PRIu64, r->world,
                 si->stream_last + 1, si->local_last - si->stream_last);
    return rc;
}

/* Publish this primary's EPOCH record right after the stream's end and
 * append it to the directory (store): the record of LSN *lsn. A refused
 * publish means the stream moved on: catch up and try again -- unless what
 * a catch-up took from the stream is another node's EPOCH record: that
 * node won, and this one yields
 * (KEEL_ECONFLICT, *lsn the directory's last LSN). The lease alone cannot
 * decide it: JetStream 2.9's compare-and-set on a clustered KV key is a
 * check before the Raft proposal, so two nodes racing for a lapsed lease
 * may both win it; the stream's expected-last-sequence is serialised by
 * its leader. */
static int begin_epoch(struct runtime_repl *r, kw_store *store, uint64_t epoch, uint64_t *lsn)
{
    kw_codec_ctx *c = NULL;
    kw_buf payload = {0}, rec = {0};
    int rc = kw_codec_create(&(kw_codec_desc){0}, &c);
    if (!rc)
        rc = kw_epoch_encode(&payload, epoch, kr_node_id(r->node));
    for (int i = 0; !rc; i++) {
        kr_sync_info si;
        if ((rc = kr_sync_store(r->node, store, 0, &si)) || (si.unstreamed && (rc = unstreamed(r, store, &si))) ||
            (si.seed && (rc = seed(r, store, &si))))
            break;
        /* what this catch-up took from the stream (a seed's records are the directory's own) */
        if (si.appended && epoch_among(store, si.local_last - si.appended + 1, si.local_last)) {
            *lsn = si.local_last;
            rc = core_fail(KEEL_ECONFLICT, "world '%s': another node published its epoch record first",
                           r->world);
            break;
        }
        *lsn = si.local_last + 1;
        rec.len = 0;
        if ((rc = kw_record_build(c, &rec, KW_KIND_EPOCH, *lsn, 0, 0, payload.p, payload.len)) ||
            (rc = kr_keeper_check(r->keeper))) /* lost during a long catch-up: another node's world now */
            break;
        rc = kr_publish(r->node, epoch, *lsn, rec.p, rec.len);
        if (rc != KEEL_EFENCED || i + 1 == EPOCH_TRIES)
            break;
        rc = KEEL_OK; /* the stream moved on: catch up and try again */
    }
    if (!rc)
        rc = kr_append_record(store, *lsn, rec.p, rec.len);
    kw_buf_free(&payload);
    kw_buf_free(&rec);
    kw_codec_destroy(c);
    return rc;
}

/* ---- open and close --------------------------------------------------------------- */

static void st_opened(keel_repl_status *st, const void *arg)
{
    const kr_sync_info *si = arg;
    st->discarded = si->discarded;
    st->bootstrapped = si->bootstrapped;
    st->stream_lsn = si->stream_last;
    st->applied_lsn = si->local_last;
}

static void st_epoch(keel_repl_status *st, const void *arg)
{
    st->epoch = *(const uint64_t *)arg;
}

/* Bring the directory in step with the stream. A replica started before its
 * primary published the schema waits for it (SCHEMA_WAIT_TIMEOUTS): the
 * schema comes with the primary's records, never from the replica. So does
 * one whose directory holds a world the stream never held (its primary
 * publishes it first); after that, it is refused. */
static int sync_until_schema(struct runtime_repl *r, kw_store *store, bool primary, kr_sync_info *si)
{
    uint64_t deadline = core_now_ns() + SCHEMA_WAIT_TIMEOUTS * (uint64_t)kr_timeout_ms(r->node) * 1000000ull;
    for (;;) {
        int rc = kr_sync_store(r->node, store, 0, si);
        bool schema = kw_store_has(store, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY)) == 1;
        bool late = core_now_ns() > deadline;
        if (!rc && si->unstreamed && late)
            return unstreamed(r, store, si);
        if (rc || primary || (schema && !si->unstreamed) || late)
            return rc;
        nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
    }
}

/* A fresh replica of a purged stream: recovery loads the published
 * checkpoint as the stream delivers it, while a thread copies it into the
 * directory (kr_boot), whose commit repl_settle awaits before the directory
 * is written again. */
static int boot_begin(struct runtime_repl *r, const keel_world *w, kw_store *store, uint64_t stream_last,
                      dur_open_desc *o, kr_sync_info *si)
{
    int rc = kr_boot_begin(r->node, store, &r->boot);
    if (rc)
        return rc;
    kr_boot_view v;
    kr_boot_info(r->boot, &v);
    /* components registered since the checkpoint come with a schema record after it: copy it first */
    if ((rc = dur_schema_extends(w, v.schema, v.schema_len))) {
        (void)kr_boot_settle(r->boot);
        r->boot = NULL;
        return rc == 1 ? KEEL_ENOENT : rc;
    }
    r->boot_desc = (dur_boot){.meta = v.meta, .meta_len = v.meta_len, .schema = v.schema, .schema_len = v.schema_len,
                              .src = {r->boot, kr_boot_next}};
    o->boot = &r->boot_desc;
    *si = (kr_sync_info){.local_last = v.covered, .stream_last = stream_last, .bootstrapped = true};
    return KEEL_OK;
}

void repl_loaded(keel_runtime *rt, int rc)
{
    struct runtime_repl *r = rt->repl;
    if (r && rc) /* a primary whose recovery failed renews its lease no more (a lapse hands the world on) */
        drop_keeper(r, false);
    if (!r || !r->boot)
        return;
    kr_boot_end(r->boot, rc);
    if (rc) { /* nothing written; the store closes next */
        (void)kr_boot_settle(r->boot);
        r->boot = NULL;
    }
}

int repl_settle(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    if (!r || !r->boot)
        return KEEL_OK;
    int rc = kr_boot_settle(r->boot);
    r->boot = NULL;
    if (rc) {
        rc = core_fail_prefix(rc, "the replica's directory %s did not take its bootstrap checkpoint", rt->data_dir);
        dur_latch_fatal(rt->dur, rc);
    }
    return rc;
}

int repl_before_open(keel_runtime *rt, dur_open_desc *o)
{
    struct runtime_repl *r = rt->repl;
    if (!r)
        return KEEL_OK;
    bool primary = r->st.role == KEEL_ROLE_PRIMARY;
    /* NATS answers before anything is made, here or there. A primary makes its streams once it holds its
       directory when that holds a world (another node may be running on it), and before it makes a new
       one otherwise (a stream NATS cannot place leaves no directory behind) */
    char mdb[4200];
    snprintf(mdb, sizeof mdb, "%s/data.mdb", rt->data_dir);
    bool held_first = access(mdb, F_OK) == 0;
    kr_desc kd = {.urls = r->nats, .world = r->world, .node = r->desc.node, .replicas = r->desc.replicas,
                  .timeout_ms = r->desc.timeout_ms, .create = primary, .later = held_first};
    int rc = r->node ? KEEL_OK : kr_connect(&kd, &r->node);
    if (rc)
        return rc;
    kw_store *store;
    kw_store_desc sd = {.flags = KW_OPEN_CREATE | KW_OPEN_OWN, .map_size = rt->durable_desc.map_size,
                        .map_max = rt->durable_desc.map_max};
    if ((rc = kw_store_open(rt->data_dir, &sd, &store)))
        return rc;
    kr_sync_info si = {0};
    bool boots = false;
    uint64_t stream_last = 0;
    if (primary && held_first)
        rc = kr_make_world(r->node);
    if (primary && !rc)
        rc = lease_at_open(r, false, NULL, NULL);
    if (!primary)
        rc = kr_sync_boots(r->node, store, &boots, &stream_last);
    if (!rc && boots && (rc = boot_begin(r, rt->world, store, stream_last, o, &si)) == KEEL_ENOENT) {
        boots = false; /* none to load as it arrives: kr_sync_store takes the directory in step */
        rc = KEEL_OK;
    }
    if (!rc && !boots)
        rc = sync_until_schema(r, store, primary, &si);
    if (!rc && si.discarded)
        core_log(KEEL_LOG_WARN, "repl", "discarded", "records=%" PRIu64 " from_lsn=%" PRIu64 " checkpoint_dropped=%d "
                 "stream_last=%" PRIu64, si.discarded, si.discarded_from, si.checkpoint_dropped ? 1 : 0, si.stream_last);
    if (!rc)
        status_set(r, st_opened, &si);
    r->local_last = si.local_last;
    kr_local end;
    if (!rc && !primary && !boots && !(rc = kr_local_end(store, &end))) { /* the tick and epoch it reaches */
        r->received_tick = end.tick;
        status_set(r, st_epoch, &end.epoch);
    }
    if (!rc && primary) {
        uint64_t epoch = 0, rev = 0;
        drop_keeper(r, false); /* an open tried before */
        rc = lease_at_open(r, true, &epoch, &rev);
        if (!rc)
            rc = keep_lease(r, epoch, rev);
        if (!rc && (rc = begin_epoch(r, store, epoch, &r->epoch_lsn)) == KEEL_ECONFLICT)
            rc = core_fail(KEEL_EBUSY, "world '%s' has a live primary: another node published its epoch record "
                           "while this one opened; start this node as --standby", r->world);
        if (rc)
            drop_keeper(r, false);
        if (!rc) {
            r->seen.epoch = epoch;
            r->local_last = r->epoch_lsn;
            status_set(r, st_epoch, &epoch);
        }
    }
    if (rc) {
        kw_store_forget(store); /* a directory this open made: nothing of it stays */
        kw_store_close(store);
    } else {
        o->store = store; /* the directory stays owned until the durable layer holds it */
    }
    o->follow = !primary;
    o->replicated = true;
    o->stop_tick = primary ? 0 : r->desc.stop_tick;
    return rc;
}

static void on_staged(void *self, uint64_t first_lsn, uint64_t last_lsn, const void *recs, size_t len)
{
    kr_pub_staged(self, first_lsn, last_lsn, recs, len);
}

static void on_committed(void *self, uint64_t lsn)
{
    kr_pub_committed(self, lsn);
}

static void on_acked(void *self, uint64_t lsn)
{
    keel_runtime *rt = self;
    dur_acknowledge(rt->dur, lsn); /* async: a no-op, the writer made those records durable already */
}

static void on_failed(void *self, int rc)
{
    keel_runtime *rt = self;
    struct runtime_repl *r = rt->repl;
    if (rc == KEEL_EFENCED) { /* another primary appended: the lease is no longer this node's to hold */
        pthread_mutex_lock(&r->mu);
        if (r->keeper)
            kr_keeper_halt(r->keeper);
        pthread_mutex_unlock(&r->mu);
    }
    dur_latch_fatal(rt->dur, rc);
}

/* A primary from here on: the writer's hook and the publisher. */
static int start_primary(keel_runtime *rt, keel_repl_mode mode)
{
    struct runtime_repl *r = rt->repl;
    dur_state *d = rt->dur;
    kr_pub_desc pd = {.node = r->node, .store = d->store, .epoch = r->seen.epoch,
                      .published = r->epoch_lsn, .self = rt, .acked = on_acked,
                      .writer_sends = mode == KEEL_REPL_SYNC,
                      .failed = on_failed,
                      .retain = r->desc.retain_records ? r->desc.retain_records : RETAIN_DEFAULT};
    kr_pub *pub;
    int rc = kr_pub_start(&pd, &pub);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->mu);
    r->pub = pub;
    bool lost = r->lost_early;
    pthread_mutex_unlock(&r->mu);
    if (lost) /* the lease went while the node recovered */
        kr_pub_fence(pub);
    /* before the next record is queued */
    dur_repl_set(d, (dur_repl_hook){.self = pub, .staged = on_staged, .committed = on_committed,
                                    .record_max = kr_max_payload(r->node), .gate = mode == KEEL_REPL_SYNC});
    kr_pub_committed(pub, atomic_load(&d->local_lsn)); /* a schema record recovery wrote */
    return KEEL_OK;
}

int repl_after_open(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    if (!r)
        return KEEL_OK;
    int rc = r->st.role == KEEL_ROLE_PRIMARY ? start_primary(rt, r->st.mode) : KEEL_OK; /* a replica reads from its first poll */
    if (rc)
        drop_keeper(r, false);
    return rc;
}

/* A replica's consumer of the stream, at the directory's next LSN: made
 * when it first follows (a round trip to the stream's leader that its
 * recovery does not wait for). */
static int reader_ready(struct runtime_repl *r)
{
    return r->reader ? KEEL_OK : kr_read_begin(r->node, r->local_last + 1, &r->reader);
}

void repl_closing(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    if (r && r->pub && rt->dur && r->st.mode == KEEL_REPL_SYNC)
        dur_stream_deadline(rt->dur, core_now_ns() + DRAIN_MS * 1000000ull);
}

int repl_close(keel_runtime *rt, bool clean, repl_close_info *info)
{
    (void)repl_settle(rt);
    struct runtime_repl *r = rt->repl;
    if (!r)
        return KEEL_OK;
    if (!r->pub) {
        drop_keeper(r, false);
        return KEEL_OK;
    }
    kr_pub *pub = r->pub;
    bool drained = false;
    if (clean && !dur_fatal(rt->dur)) {
        (void)ckpt_wait(rt->dur); /* the last checkpoint's marker committed: the publisher sends it too */
        /* a stream that missed the close's deadline is asked once more, not waited for */
        drained = !kr_pub_drain(pub, info && info->stream_behind ? 0 : DRAIN_MS);
    }
    if (!drained) /* no stream to wait for: what the publisher asks it ends at its next timeout */
        kr_abandon(r->node);
    pthread_mutex_lock(&r->mu);
    r->pub = NULL;
    pthread_mutex_unlock(&r->mu);
    /* stopped with the hook still on: an acknowledgement that comes while it stops moves its tickets */
    kr_pub_stop(pub); /* its last checkpoint published first */
    dur_repl_set(rt->dur, (dur_repl_hook){0}); /* the writer, still running, no longer tells pub */
    kr_pub_stats ps;
    kr_pub_stats_get(pub, &ps);
    bool all = !ps.fenced && ps.published >= ps.committed;
    if (!all && !ps.fenced && r->st.mode == KEEL_REPL_SYNC)
        dur_stream_gone(rt->dur); /* tickets still waiting: on the local disk only, as the close says */
    if (info) {
        info->published = ps.published;
        info->committed = ps.committed;
    }
    /* the lease goes only when the stream holds everything; pub is freed after the keeper stopped (its
       lost() may still be fencing it) */
    drop_keeper(r, clean && !dur_fatal(rt->dur) && all);
    kr_pub_free(pub);
    /* async acknowledges on the local disk: a stream behind is no failure of its close */
    return ps.fenced ? KEEL_EFENCED : all || r->st.mode != KEEL_REPL_SYNC ? KEEL_OK : KEEL_EUNAVAILABLE;
}

/* ---- following -------------------------------------------------------------------- */

typedef struct applied {
    uint64_t lsn, tick, stream, last_tick, epoch;
    double mean_bytes; /* the mean size of the messages read; 0 before any */
} applied;

static void st_applied(keel_repl_status *st, const void *arg)
{
    const applied *a = arg;
    st->applied_lsn = a->lsn;
    st->stream_lsn = a->stream > st->stream_lsn ? a->stream : st->stream_lsn;
    st->lag_records = st->stream_lsn > a->lsn ? st->stream_lsn - a->lsn : 0;
    st->lag_ticks = a->last_tick > a->tick ? a->last_tick - a->tick : 0;
    st->epoch = a->epoch > st->epoch ? a->epoch : st->epoch;
    if (a->mean_bytes > 0)
        st->mean_record_bytes = a->mean_bytes;
    st->lag_bytes = (uint64_t)((double)st->lag_records * st->mean_record_bytes + 0.5);
}

/* Replay the directory up to lsn; the world at its tick is what views
 * show (readers never see a state older than what was applied). */
static int apply_to(keel_runtime *rt, uint64_t lsn, uint64_t *tick)
{
    *tick = atomic_load(&rt->tick);
    int rc = dur_follow(rt->dur, lsn, tick);
    atomic_store(&rt->tick, *tick); /* on failure too: the units before the failing one are applied */
    atomic_store_explicit(&rt->txn.running_tick, *tick, memory_order_relaxed);
    if (!rc && rt->world->mutations != rt->txn.pub_mutations)
        rc = view_publish(&rt->txn, *tick);
    return rc;
}

/* Apply what the directory holds beyond the applied LSN; publish it.
 * last_tick: the tick of the last record just copied (0: none; an EPOCH or
 * a SCHEMA record names none, a checkpoint marker an older one). */
static int apply_local(keel_runtime *rt, uint64_t last_tick)
{
    struct runtime_repl *r = rt->repl;
    if (last_tick > r->received_tick)
        r->received_tick = last_tick;
    uint64_t tick;
    int rc = apply_to(rt, r->local_last, &tick);
    if (rc)
        return rc;
    /* the replica's own checkpoint, at the runtime's checkpoint interval: a reopen replays from it.
       A failed one (a full disk) costs nothing but the replay it would have saved */
    if (ckpt_maybe(rt->dur, tick, false))
        core_log(KEEL_LOG_WARN, "ckpt", "replica_failed", "tick=%" PRIu64 " cause=\"%s\"", tick, keel_last_error());
    /* the stream's end for the lag: what was copied, and what the messages read said of the stream (no
       request to the stream's leader here: under load one takes tens of milliseconds, a tick or two) */
    applied a = {.lsn = rt->dur->applied_lsn, .tick = tick, .stream = r->local_last, .last_tick = r->received_tick};
    if (r->reader) {
        uint64_t seen;
        kr_read_seen(r->reader, &seen, &a.mean_bytes, &a.epoch);
        a.stream = seen > a.stream ? seen : a.stream;
    }
    status_set(r, st_applied, &a);
    metrics_publish(rt, false);
    return KEEL_OK;
}

/* Copy what the stream holds, up to its end as it is now. */
static int catch_up(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    uint64_t first, end, tick = 0;
    int rc = kr_bounds(r->node, &first, &end);
    if (!rc)
        rc = reader_ready(r);
    if (!rc)
        rc = kr_copy_to(r->node, r->reader, rt->dur->store, end, 1000, &r->local_last, &tick);
    return rc ? rc : apply_local(rt, tick);
}

/* After a promotion that did not happen: the directory may hold more of
 * the stream than before (begin_epoch catches up), so the reader restarts
 * at the directory's end and what the directory holds is applied. */
static int follow_again(keel_runtime *rt)
{
    struct runtime_repl *r = rt->repl;
    r->seen_since_ns = 0; /* watch the lease again */
    kr_read_end(r->reader);
    r->reader = NULL;
    kr_local end;
    int rc = kr_local_end(rt->dur->store, &end);
    if (rc) /* the reader starts again where it was when the directory can be read */
        return rc;
    r->local_last = end.last;
    return apply_local(rt, end.tick);
}

static void st_promoted(keel_repl_status *st, const void *arg)
{
    const keel_repl_mode *mode = arg;
    st->role = KEEL_ROLE_PRIMARY;
    st->mode = *mode;
    st->lag_records = st->lag_ticks = st->lag_bytes = 0;
}

/* The promoted primary's epoch record applied and its publisher started. */
static int become_primary(keel_runtime *rt, uint64_t epoch, uint64_t lsn, keel_repl_mode mode)
{
    struct runtime_repl *r = rt->repl;
    dur_state *d = rt->dur;
    kr_read_end(r->reader);
    r->reader = NULL;
    r->local_last = r->epoch_lsn = lsn;
    uint64_t tick;
    /* begin_epoch's catch-ups may have copied records the last apply did not take */
    int rc = apply_to(rt, lsn, &tick);
    if (!rc) {
        r->seen.epoch = epoch;
        /* the publisher and (sync) the gate first: the writer takes no commit of this node's own before
           dur_promote, and every one after it goes through them */
        rc = start_primary(rt, mode);
    }
    if (rc)
        return rc;
    dur_promote(d);
    status_set(r, st_epoch, &epoch);
    status_set(r, st_promoted, &mode);
    core_log(KEEL_LOG_INFO, "repl", "promoted", "world=%s epoch=%" PRIu64 " tick=%" PRIu64 " lsn=%" PRIu64, r->world,
             epoch, tick, lsn);
    return KEEL_OK;
}

/* A standby at its stop_tick applies nothing more, so it does not take
 * the world over: a primary from there would go on from an older tick
 * than the stream's. Logged: its primary's lease lapsed. */
static bool held_at_stop(keel_runtime *rt)
{
    uint64_t stop = rt->dur->stop_tick, tick = atomic_load(&rt->tick);
    if (!stop || tick < stop)
        return false;
    core_log(KEEL_LOG_WARN, "repl", "not_promoted", "world=%s tick=%" PRIu64 " stop_tick=%" PRIu64, rt->repl->world,
             tick, stop);
    return true;
}

/* A standby whose primary's lease lapsed: everything in the stream first
 * (unless that takes it to its stop_tick: held_at_stop), then the lease,
 * the EPOCH record, and the primary's role. 0 with *promoted false
 * when it cannot take the world over now: another node was quicker, or the
 * stream kept moving (a deposed primary still publishing until its lease's
 * loss fences it); the next poll tries again. */
static int promote(keel_runtime *rt, bool *promoted)
{
    struct runtime_repl *r = rt->repl;
    dur_state *d = rt->dur;
    int rc = catch_up(rt);
    if (rc || held_at_stop(rt)) /* this poll's records took it there */
        return rc;
    uint64_t epoch = 0, rev = 0, lsn = 0;
    rc = kr_lease_take(r->node, &r->seen, &epoch, &rev);
    if (rc == KEEL_ECONFLICT) {
        r->seen_since_ns = 0; /* someone renewed or took it: watch again */
        return KEEL_OK;
    }
    if (!rc)
        rc = keep_lease(r, epoch, rev);
    if (!rc) /* the directory is the store begin_epoch keeps in step; the reader must not run ahead of it */
        rc = begin_epoch(r, d->store, epoch, &lsn);
    if (rc) {
        /* no epoch record of this node's is in the stream: the lease goes at once (unless another node
           published first, or took it), so that a standby, this one too, takes over without waiting */
        drop_keeper(r, rc != KEEL_ECONFLICT);
        int frc = follow_again(rt);
        return frc ? frc : rc == KEEL_ECONFLICT || rc == KEEL_EFENCED ? KEEL_OK : rc;
    }
    /* a promoted standby's mode: sync unless asked otherwise */
    if ((rc = become_primary(rt, epoch, lsn, r->desc.mode ? r->desc.mode : KEEL_REPL_SYNC))) {
        drop_keeper(r, false); /* no primary after all: the lease lapses, and a standby (this one too) takes it */
        return rc;
    }
    *promoted = true;
    return KEEL_OK;
}

/* A replica's reach of the stream, in its status: a poll that found the
 * stream out of reach counts an error and marks the node degraded until a
 * poll gets through. Out of reach is KEEL_EUNAVAILABLE, or a poll that
 * ends with the connection down: the client reconnects in the background
 * and the poll's wait only timed out (it returns 0, nothing copied). Other
 * failures say nothing of the stream's reach. */
static void poll_reached(struct runtime_repl *r, int rc)
{
    if (rc && rc != KEEL_EUNAVAILABLE)
        return;
    bool away = rc == KEEL_EUNAVAILABLE || !kr_connected(r->node);
    pthread_mutex_lock(&r->mu);
    r->st.errors += away;
    r->st.degraded = away;
    pthread_mutex_unlock(&r->mu);
}

/* keel_replica_poll once the runtime is a replica that may poll. */
static int replica_poll(keel_runtime *rt, int32_t timeout_ms, bool *promoted)
{
    struct runtime_repl *r = rt->repl;
    /* at its stop_tick the poll waits as usual */
    bool lapsed = r->st.role == KEEL_ROLE_STANDBY && lease_lapsed(r) && !held_at_stop(rt);
    uint64_t tick = 0;
    int rc = reader_ready(r);
    if (!rc)
        rc = kr_append_from(r->reader, rt->dur->store, POLL_BATCH, lapsed ? 0 : timeout_ms, &r->local_last, &tick);
    if (!rc)
        rc = apply_local(rt, tick);
    if (!rc && lapsed)
        rc = promote(rt, promoted);
    return rc;
}

int keel_replica_poll(keel_runtime *rt, int32_t timeout_ms, bool *promoted)
{
    if (promoted)
        *promoted = false;
    if (!rt || !rt->repl)
        return core_fail(KEEL_EINVAL, "keel_replica_poll: %s", rt ? "the runtime is not replicated" : "runtime is NULL");
    int rc = keel_runtime_recover(rt, NULL);
    if (rc)
        return rc;
    struct runtime_repl *r = rt->repl;
    if (r->st.role == KEEL_ROLE_PRIMARY)
        return core_fail(KEEL_EINVAL, "keel_replica_poll: this runtime is world '%s''s primary: it ticks", r->world);
    if ((rc = repl_settle(rt)))
        return rc;
    if (dur_fatal(rt->dur)) /* e.g. its bootstrap never reached the directory: nothing more goes there */
        return core_fail(KEEL_EFATAL, "keel_replica_poll: the runtime latched fatal (%s)",
                         keel_strerror(dur_fatal(rt->dur)));
    bool p = false;
    rc = replica_poll(rt, timeout_ms, &p);
    poll_reached(r, rc);
    if (promoted)
        *promoted = p;
    return rc;
}

void keel_repl_status_get(keel_runtime *rt, keel_repl_status *out)
{
    *out = (keel_repl_status){0};
    struct runtime_repl *r = rt ? rt->repl : NULL;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    if (r->pub) {
        kr_pub_stats ps;
        kr_pub_stats_get(r->pub, &ps);
        out->published_lsn = ps.published;
        if (ps.published > out->stream_lsn)
            out->stream_lsn = ps.published;
        out->lag_records = ps.committed > ps.published ? ps.committed - ps.published : 0;
        out->lag_bytes = ps.lag_bytes;
        out->errors += ps.errors; /* st's own: dropped keepers' and failed polls' */
        out->degraded |= ps.degraded;
        out->fenced = ps.fenced;
        out->checkpoint_lsn = ps.checkpoint_lsn;
    }
    if (r->keeper) {
        kr_keeper_stats ks;
        kr_keeper_stats_get(r->keeper, &ks);
        out->errors += ks.errors;
        out->degraded |= ks.failing;
        out->fenced |= ks.lost;
    }
    pthread_mutex_unlock(&r->mu);
}
