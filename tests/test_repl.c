/*
 * test_repl.c -- libkeel_repl against a real nats-server (one node on a
 * free loopback port, JetStream storage in the case's base directory,
 * started and stopped by the unchecked fixture, so a failing test never
 * leaves it running): the fencing publish, a pipeline that meets another
 * node's record and one that settles and sends again, the lease's
 * compare-and-set, a directory brought in step with the stream (its
 * unreplicated tail dropped), a published checkpoint copied into a
 * directory (and damaged ones refused), a follower's own checkpoints (and
 * the checkpoint's age while they fail), a
 * record on the stream that the disk never took, the refusals of bad
 * input that write nothing (another history among them), and a tick
 * record too big for a message (degraded, not published). repl_rejoin
 * starts its own server, stops it and starts it again: a primary's
 * checkpoints while the stream is down, and its rejoin with a checkpoint
 * of records the stream never got; a follower's status while its server is
 * gone (degraded, errors counted) and after it is back. The failover of whole keel-world
 * processes on a 3-node cluster is
 * check_failover.sh and keel-crash --mode failover.
 */
#include <check.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <nats/nats.h>
#include <unistd.h>

#include "core/failpoint.h"
#include "keel_repl/repl.h"
#include "keel_test.h"
#include "test_util.h"

static pid_t nats_pid;
static char nats_url[64];

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len));
    close(fd);
    return ntohs(a.sin_port);
}

/* A connection that creates world `world`'s stream, retried while the
 * server starts (JetStream answers a moment after the port opens). */
static kr_node *connect_world(const char *url, const char *world, const char *node)
{
    kr_node *n = NULL;
    uint64_t until = tu_now_ns() + 30000000000ull;
    int rc;
    while ((rc = kr_connect(&(kr_desc){.urls = url, .world = world, .node = node, .create = true}, &n)) ==
               KEEL_EUNAVAILABLE && tu_now_ns() < until)
        usleep(50000);
    ck_assert_msg(!rc, "kr_connect: %s", keel_last_error());
    return n;
}

/* Write the configuration of a one-node server on a free port with its
 * JetStream storage under `name` in the case's directory; its URL into
 * nats_url. */
static int nats_conf(const char *name, char *conf, size_t cap)
{
    char store[4096], file[4200];
    tu_path(store, sizeof store, name);
    snprintf(file, sizeof file, "%s.conf", name);
    tu_path(conf, cap, file);
    int port = free_port();
    char text[8192];
    int n = snprintf(text, sizeof text, "listen: 127.0.0.1:%d\njetstream { store_dir: \"%s\", max_mem: 64M }\n", port,
                     store);
    tu_write_file(conf, text, (size_t)n);
    snprintf(nats_url, sizeof nats_url, "nats://127.0.0.1:%d", port);
    return port;
}

/* Start nats-server on conf and return once its port accepts. One started
 * by a test itself (owned) is killed when the test's process ends, however
 * it ends; the fixture's is stopped by nats_teardown. */
static pid_t nats_start(const char *conf, int port, bool owned)
{
    pid_t parent = getpid(), pid = fork();
    ck_assert(pid >= 0);
    if (!pid) {
        if (owned && (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent))
            _exit(1);
        int null = open("/dev/null", 1);
        dup2(null, 1);
        dup2(null, 2);
        execlp("nats-server", "nats-server", "-c", conf, (char *)NULL);
        _exit(127); /* not installed: the first connect fails the test */
    }
    /* ready once its port accepts: the runner process starts no NATS client threads (the tests are
       forked from it), and each test's connect_world waits for JetStream itself */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    uint64_t until = tu_now_ns() + 30000000000ull;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        bool up = fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof a);
        if (fd >= 0)
            close(fd);
        if (up)
            break;
        ck_assert_msg(tu_now_ns() < until, "nats-server did not listen on %s within 30 s", nats_url);
        usleep(20000);
    }
    return pid;
}

static void nats_setup(void)
{
    char conf[4096];
    int port = nats_conf("js", conf, sizeof conf);
    nats_pid = nats_start(conf, port, false);
}

static void nats_teardown(void)
{
    if (nats_pid > 0) {
        kill(nats_pid, SIGTERM);
        kill(nats_pid, SIGCONT); /* a case that froze it and failed before it thawed it */
        waitpid(nats_pid, NULL, 0);
        nats_pid = 0;
    }
}

/* A sealed EPOCH record of lsn: a small valid WAL record. */
static void epoch_record(kw_buf *out, uint64_t lsn, uint64_t epoch, const char *node)
{
    kw_codec_ctx *c;
    kw_buf p = {0};
    ck_assert(!kw_codec_create(NULL, &c));
    ck_assert(!kw_epoch_encode(&p, epoch, node));
    out->len = 0;
    ck_assert(!kw_record_build(c, out, KW_KIND_EPOCH, lsn, 0, 0, p.p, p.len));
    kw_buf_free(&p);
    kw_codec_destroy(c);
}

/* EPOCH records of LSN 1..last, published by node `node`'s primary of epoch 1. */
static void publish_epochs(kr_node *n, uint64_t last, const char *node)
{
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= last; lsn++) {
        epoch_record(&rec, lsn, lsn, node);
        ck_assert_rc(kr_publish(n, 1, lsn, rec.p, rec.len), KEEL_OK);
    }
    kw_buf_free(&rec);
}

/* The bytes of a store's data.mdb, to show a refusal wrote nothing. */
static tu_digest mdb_digest(kw_store *s)
{
    char mdb[4200];
    snprintf(mdb, sizeof mdb, "%s/data.mdb", kw_store_dir(s));
    return tu_file_digest(mdb);
}

static void assert_same_digest(tu_digest a, tu_digest b)
{
    ck_assert(a.size == b.size && a.hash == b.hash);
}

static kw_store *store_in(const char *name)
{
    char dir[4096];
    tu_path(dir, sizeof dir, name);
    kw_store *s;
    ck_assert_msg(!kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_CREATE}, &s), "%s", keel_last_error());
    return s;
}

/* Mark a directory as stream's by name (NULL: remove the mark, as keel-wal
 * detach does), as an older keel did: a directory kept in step with it. */
static int fill_marked(kw_wtxn *t, void *arg)
{
    const char *stream = arg;
    return stream ? kw_put(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), stream, strlen(stream))
                  : kw_del(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED));
}

static void mark_as(kw_store *s, const char *stream)
{
    ck_assert_rc(kw_store_write(s, fill_marked, (void *)stream), KEEL_OK);
}

/* The first and last LSN of a store's WAL (0, 0: empty). */
static void wal_bounds(kw_store *s, uint64_t *first, uint64_t *last)
{
    kw_rtxn *r;
    ck_assert(!kw_read_begin(s, &r));
    int rc = kw_wal_bounds(r, first, last, NULL);
    kw_read_end(r);
    ck_assert(!rc || rc == KEEL_ENOENT);
    if (rc)
        *first = *last = 0;
}

static uint64_t wal_last(kw_store *s)
{
    uint64_t first, last;
    wal_bounds(s, &first, &last);
    return last;
}

/* The LSN the store's checkpoint covers (0: none). */
static uint64_t checkpoint_covers(kw_store *s)
{
    kw_rtxn *r;
    const void *v;
    size_t n;
    kw_checkpoint_meta m = {0};
    ck_assert(!kw_read_begin(s, &r));
    if (!kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &n))
        ck_assert(!kw_checkpoint_meta_decode(v, n, &m));
    kw_read_end(r);
    return m.lsn;
}

START_TEST(test_publish_fences)
{
    kr_node *n = connect_world(nats_url, "fence", "a");
    kw_buf r1 = {0}, r2 = {0}, got = {0};
    epoch_record(&r1, 1, 1, "a");
    epoch_record(&r2, 2, 1, "a");
    ck_assert_rc(kr_publish(n, 1, 1, r1.p, r1.len), KEEL_OK);
    /* a second primary of the new world, whose lease take raced the first's: its LSN 1 expects an empty
       stream, refused */
    ck_assert_rc(kr_publish(n, 2, 1, r2.p, r2.len), KEEL_EFENCED);
    ck_assert_rc(kr_publish(n, 1, 2, r2.p, r2.len), KEEL_OK);
    ck_assert_rc(kr_publish(n, 1, 2, r2.p, r2.len), KEEL_OK); /* the same id again: de-duplicated, not fenced */
    /* another primary's LSN 2, expecting the stream to end at 1: refused */
    ck_assert_rc(kr_publish(n, 2, 2, r1.p, r1.len), KEEL_EFENCED);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "fenced"));
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 1);
    ck_assert_uint_eq(last, 2);
    ck_assert_rc(kr_get(n, 2, &got), KEEL_OK);
    ck_assert(got.len == r2.len && !memcmp(got.p, r2.p, got.len));
    ck_assert_rc(kr_get(n, 3, &got), KEEL_ENOENT);
    kw_buf_free(&r1);
    kw_buf_free(&r2);
    kw_buf_free(&got);
    kr_close(n);
}
END_TEST

/* A pipeline's acknowledgements, as its handler tells them (a NATS thread). */
typedef struct acks {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t ok, failed;      /* how many of each */
    uint64_t highest;         /* the highest LSN stored */
} acks;

static void on_ack(void *arg, uint64_t lsn, bool ok)
{
    acks *a = arg;
    pthread_mutex_lock(&a->mu);
    if (ok) {
        a->ok++;
        if (lsn > a->highest)
            a->highest = lsn;
    } else {
        a->failed++;
    }
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Wait until `total` messages were answered. */
static void acks_wait(acks *a, uint64_t total)
{
    pthread_mutex_lock(&a->mu);
    while (a->ok + a->failed < total)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

/* Two nodes in the same epoch (both won a raced lease): the second's
 * publish of the same LSN is refused, not taken for a duplicate (message
 * ids carry the session); a pipeline whose next record meets another
 * node's stops there: none of its later records lines up behind it, and it
 * settles as fenced with the prefix it had. */
START_TEST(test_pipe_fences)
{
    kr_node *a = connect_world(nats_url, "batch", "a"), *b = connect_world(nats_url, "batch", "b");
    acks ak = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    ck_assert_rc(kr_pipe_open(b, on_ack, &ak), KEEL_OK);
    kr_pipe_close(b); /* a pipeline that never sent closes (libnats has no pending table yet) */
    ck_assert_rc(kr_pipe_open(a, on_ack, &ak), KEEL_OK);
    ck_assert_rc(kr_pipe_open(a, on_ack, &ak), KEEL_EINVAL); /* one per node */
    kw_buf rec[7] = {{0}};
    for (uint64_t lsn = 1; lsn <= 6; lsn++)
        epoch_record(&rec[lsn], lsn, 1, "a");
    for (uint64_t lsn = 1; lsn <= 3; lsn++) /* sent before any is acknowledged */
        ck_assert_rc(kr_pipe_send(a, 1, lsn, lsn > 1, rec[lsn].p, rec[lsn].len), KEEL_OK);
    acks_wait(&ak, 3);
    ck_assert_uint_eq(ak.ok, 3);
    ck_assert_uint_eq(ak.highest, 3);
    ck_assert_rc(kr_publish(b, 1, 3, rec[3].p, rec[3].len), KEEL_EFENCED); /* same epoch, same LSN, same bytes */
    ck_assert_rc(kr_publish(b, 1, 4, rec[4].p, rec[4].len), KEEL_OK);        /* b appends LSN 4 */
    for (uint64_t lsn = 4; lsn <= 6; lsn++)
        ck_assert_rc(kr_pipe_send(a, 1, lsn, true, rec[lsn].p, rec[lsn].len), KEEL_OK);
    acks_wait(&ak, 6);
    ck_assert_uint_eq(ak.ok, 3);
    ck_assert_uint_eq(ak.failed, 3); /* a's 4 expected a's 3 last, 5 and 6 a's 4 and 5: refused */
    uint64_t acked = 0, first, last;
    ck_assert_rc(kr_pipe_settle(a, 1, 3, 6, &acked), KEEL_EFENCED);
    ck_assert_uint_eq(acked, 3);
    ck_assert_rc(kr_bounds(a, &first, &last), KEEL_OK);
    ck_assert_uint_eq(last, 4);
    kr_pipe_close(a);
    for (int i = 1; i <= 6; i++)
        kw_buf_free(&rec[i]);
    kr_close(a);
    kr_close(b);
}
END_TEST

/* A pipeline that lost its records in flight (a settle that found the
 * stream holding a prefix) resends the rest, the first unchained, and a
 * record the stream took after all is a duplicate, acknowledged at its
 * sequence. */
START_TEST(test_pipe_resends_after_settle)
{
    kr_node *a = connect_world(nats_url, "resend", "a");
    acks ak = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    ck_assert_rc(kr_pipe_open(a, on_ack, &ak), KEEL_OK);
    kw_buf rec[5] = {{0}};
    uint64_t acked = 7;
    ck_assert_rc(kr_pipe_settle(a, 1, 0, 0, &acked), KEEL_OK); /* nothing sent yet: nothing to drop */
    ck_assert_uint_eq(acked, 0);
    for (uint64_t lsn = 1; lsn <= 4; lsn++)
        epoch_record(&rec[lsn], lsn, 1, "a");
    for (uint64_t lsn = 1; lsn <= 2; lsn++)
        ck_assert_rc(kr_pipe_send(a, 1, lsn, lsn > 1, rec[lsn].p, rec[lsn].len), KEEL_OK);
    acks_wait(&ak, 2);
    ck_assert_rc(kr_pipe_settle(a, 1, 0, 4, &acked), KEEL_EUNAVAILABLE); /* 3 and 4 were never sent */
    ck_assert_uint_eq(acked, 2);
    ck_assert_rc(kr_pipe_send(a, 1, 2, false, rec[2].p, rec[2].len), KEEL_OK); /* taken already: a duplicate */
    for (uint64_t lsn = 3; lsn <= 4; lsn++)
        ck_assert_rc(kr_pipe_send(a, 1, lsn, true, rec[lsn].p, rec[lsn].len), KEEL_OK);
    acks_wait(&ak, 5);
    ck_assert_uint_eq(ak.ok, 5);
    ck_assert_uint_eq(ak.highest, 4);
    ck_assert_rc(kr_pipe_settle(a, 1, 2, 4, &acked), KEEL_OK);
    ck_assert_uint_eq(acked, 4);
    for (int i = 1; i <= 4; i++)
        kw_buf_free(&rec[i]);
    kr_close(a); /* closes the pipeline */
}
END_TEST

/* A publisher's acked() hook that holds its call for `hold` until released:
 * the instant between the stream's acknowledgement and the durable layer
 * hearing of it. */
typedef struct held_ack {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t hold;           /* the LSN whose call waits */
    bool entered, released;
    uint64_t returned;       /* the highest LSN whose call returned */
} held_ack;

static void held_acked(void *self, uint64_t lsn)
{
    held_ack *h = self;
    pthread_mutex_lock(&h->mu);
    if (lsn >= h->hold) {
        h->entered = true;
        pthread_cond_broadcast(&h->cv);
        while (!h->released)
            pthread_cond_wait(&h->cv, &h->mu);
    }
    if (lsn > h->returned)
        h->returned = lsn;
    pthread_mutex_unlock(&h->mu);
}

static void held_failed(void *self, int rc)
{
    (void)self;
    ck_abort_msg("the publisher failed: %s", keel_strerror(rc));
}

/* A drain returns once acked() returned for what was committed, not when
 * the stream acknowledged it: the caller takes the hook away after a drain
 * (a clean close), and an acknowledgement told after that would leave a
 * sync ticket unanswered though the close reported the stream whole. */
START_TEST(test_drain_waits_for_acked)
{
    kr_node *n = connect_world(nats_url, "drain", "a");
    kw_store *s = store_in("drain");
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= 3; lsn++) {
        epoch_record(&rec, lsn, 1, "a");
        ck_assert_rc(kr_append_record(s, lsn, rec.p, rec.len), KEEL_OK);
    }
    kw_buf_free(&rec);
    held_ack h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .hold = 3};
    kr_pub *p;
    ck_assert_rc(kr_pub_start(&(kr_pub_desc){.node = n, .store = s, .epoch = 1, .retain = -1, .self = &h,
                                             .acked = held_acked, .failed = held_failed},
                              &p),
                 KEEL_OK);
    kr_pub_committed(p, 3);
    pthread_mutex_lock(&h.mu);
    while (!h.entered)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    kr_pub_stats ps;
    kr_pub_stats_get(p, &ps);
    ck_assert_uint_eq(ps.published, 3); /* the stream holds all three */
    ck_assert_rc(kr_pub_drain(p, 0), KEEL_EUNAVAILABLE); /* but acked() has not returned for 3 */
    ck_assert_ptr_nonnull(strstr(keel_last_error(), " of 3")); /* what was told: 0 or 2 */
    pthread_mutex_lock(&h.mu);
    h.released = true;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    ck_assert_rc(kr_pub_drain(p, 30000), KEEL_OK);
    pthread_mutex_lock(&h.mu);
    ck_assert_uint_eq(h.returned, 3);
    pthread_mutex_unlock(&h.mu);
    kr_pub_free(p);
    kw_store_close(s);
    kr_close(n);
}
END_TEST

START_TEST(test_lease_cas)
{
    kr_node *a = connect_world(nats_url, "lease", "a"), *b = connect_world(nats_url, "lease", "b");
    kr_lease la, lb;
    uint64_t ea, eb, reva, revb;
    ck_assert_rc(kr_lease_read(a, &la), KEEL_OK);
    ck_assert(!la.exists);
    ck_assert_rc(kr_lease_read(b, &lb), KEEL_OK); /* both saw it free: only one take wins */
    ck_assert_rc(kr_lease_take(a, &la, &ea, &reva), KEEL_OK);
    ck_assert_uint_eq(ea, 1);
    ck_assert_rc(kr_lease_take(b, &lb, &eb, &revb), KEEL_ECONFLICT);
    /* a take whose write landed but whose reply was lost, tried again: the lease holds a's epoch 1 */
    uint64_t e2 = 0, rev2 = 0;
    ck_assert_rc(kr_lease_take(a, &la, &e2, &rev2), KEEL_OK);
    ck_assert_uint_eq(e2, 1);
    ck_assert_uint_eq(rev2, reva);
    uint64_t stale = reva;
    ck_assert_rc(kr_lease_renew(a, ea, false, &reva), KEEL_OK);
    ck_assert_uint_gt(reva, stale);
    /* a renewal whose write landed but whose reply was lost (this node still has the old revision):
       the next one finds its own value and goes on from there, not fenced */
    ck_assert_rc(kr_lease_renew(a, ea, false, &stale), KEEL_OK);
    ck_assert_uint_eq(stale, reva);
    ck_assert_rc(kr_lease_read(b, &lb), KEEL_OK);
    ck_assert(lb.exists && !lb.released && lb.epoch == 1 && !strcmp(lb.node, "a") && lb.rev == reva);
    ck_assert_rc(kr_lease_renew(a, ea, true, &reva), KEEL_OK); /* a clean stop lets it go */
    ck_assert_rc(kr_lease_read(b, &lb), KEEL_OK);
    ck_assert(lb.released);
    ck_assert_rc(kr_lease_take(b, &lb, &eb, &revb), KEEL_OK);
    ck_assert_uint_eq(eb, 2);
    ck_assert_rc(kr_lease_renew(a, ea, false, &reva), KEEL_EFENCED); /* a's revision is gone */
    /* b's epoch record on the stream, then the lease's key lost (purged by hand): the next take is
       epoch 3, not 1 -- epochs only grow along the stream */
    kw_buf rec = {0};
    epoch_record(&rec, 1, 2, "b");
    ck_assert_rc(kr_publish(b, 2, 1, rec.p, rec.len), KEEL_OK);
    kw_buf_free(&rec);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_KeyValue(&kv, js, "KEEL_LEASE"), NATS_OK);
    ck_assert_int_eq(kvStore_Purge(kv, "lease", NULL), NATS_OK);
    ck_assert_rc(kr_lease_read(a, &la), KEEL_OK);
    ck_assert(!la.exists);
    ck_assert_rc(kr_lease_take(a, &la, &ea, &reva), KEEL_OK);
    ck_assert_uint_eq(ea, 3);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kr_close(a);
    kr_close(b);
}
END_TEST

/* A directory holding records the stream never got (LSN 3 and 4, another
 * node's) drops them and takes the stream's LSN 3. */
START_TEST(test_sync_drops_unreplicated_tail)
{
    kr_node *n = connect_world(nats_url, "sync", "a");
    publish_epochs(n, 3, "stream");
    kw_buf rec = {0};
    kw_store *s = store_in("dir");
    for (uint64_t lsn = 1; lsn <= 4; lsn++) {
        epoch_record(&rec, lsn, lsn, lsn <= 2 ? "stream" : "local");
        ck_assert_rc(kr_append_record(s, lsn, rec.p, rec.len), KEEL_OK);
    }
    kr_sync_info si;
    /* never kept in step with the stream: it loses nothing to it, nothing written */
    tu_digest before = mdb_digest(s);
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "never took from stream KEEL_sync"));
    assert_same_digest(mdb_digest(s), before);
    mark_as(s, "KEEL_sync");
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert_uint_eq(si.discarded, 2);
    ck_assert_uint_eq(si.appended, 1);
    ck_assert_uint_eq(si.local_last, 3);
    ck_assert_uint_eq(wal_last(s), 3);
    kw_buf got = {0};
    epoch_record(&rec, 3, 3, "stream");
    ck_assert_rc(kr_get(n, 3, &got), KEEL_OK);
    ck_assert(got.len == rec.len && !memcmp(got.p, rec.p, rec.len));
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error()); /* in step: nothing to do */
    ck_assert_uint_eq(si.discarded + si.appended, 0);
    kw_buf_free(&rec);
    kw_buf_free(&got);
    kw_store_close(s);
    kr_close(n);
}
END_TEST

static int fill_trim(kw_wtxn *t, void *arg)
{
    return kw_del_wal_upto(t, *(const uint64_t *)arg, NULL);
}

/* A directory holding LSN 1..6 -- 1..3 by `early`, 4..6 by "local" --
 * whose checkpoints deleted 1..3 (meta "trimmed" remembers LSN 3). */
static kw_store *trimmed_dir(const char *name, const char *early)
{
    kw_store *s = store_in(name);
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= 6; lsn++) {
        epoch_record(&rec, lsn, lsn, lsn <= 3 ? early : "local");
        ck_assert_rc(kr_append_record(s, lsn, rec.p, rec.len), KEEL_OK);
    }
    uint64_t upto = 3;
    ck_assert_rc(kw_store_write(s, fill_trim, &upto), KEEL_OK);
    kw_buf_free(&rec);
    return s;
}

/* A directory whose WAL starts after LSN 1 and shares no record with the
 * stream is the stream's up to its first LSN - 1 only if the record it
 * deleted last is the stream's: then its own tail goes and the stream's
 * comes; a directory of another history (the same LSNs, other records) is
 * refused, and so is one marked as another world's; nothing is written. */
START_TEST(test_another_history_refused)
{
    kr_node *n = connect_world(nats_url, "hist", "a");
    publish_epochs(n, 5, "stream");
    kw_store *ours = trimmed_dir("hist-ours", "stream");
    mark_as(ours, "KEEL_hist"); /* kept in step with it before */
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, ours, 0, &si), "%s", keel_last_error());
    ck_assert_uint_eq(si.discarded, 3);
    ck_assert_uint_eq(si.discarded_from, 4);
    ck_assert_uint_eq(si.local_last, 5);
    ck_assert_uint_eq(wal_last(ours), 5);
    kw_store *theirs = trimmed_dir("hist-theirs", "elsewhere");
    tu_digest before = mdb_digest(theirs);
    ck_assert_rc(kr_sync_store(n, theirs, 0, &si), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "share no record"));
    ck_assert_uint_eq(wal_last(theirs), 6);
    assert_same_digest(mdb_digest(theirs), before);
    kr_node *other = connect_world(nats_url, "other", "a");
    before = mdb_digest(ours);
    ck_assert_rc(kr_sync_store(other, ours, 0, &si), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "another stream"));
    assert_same_digest(mdb_digest(ours), before);
    kw_store_close(ours);
    kw_store_close(theirs);
    kr_close(other);
    kr_close(n);
}
END_TEST

/* A directory holding EPOCH records 1..last by node "local" (a world of its own). */
static kw_store *local_world(const char *name, uint64_t last)
{
    kw_store *s = store_in(name);
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= last; lsn++) {
        epoch_record(&rec, lsn, lsn, "local");
        ck_assert_rc(kr_append_record(s, lsn, rec.p, rec.len), KEEL_OK);
    }
    kw_buf_free(&rec);
    return s;
}

/* The directory's WAL records from..to are the stream's messages, byte for byte. */
static void assert_same_records(kr_node *n, kw_store *s, uint64_t from, uint64_t to)
{
    kw_buf got = {0};
    kw_rtxn *r;
    kw_walit *it;
    ck_assert(!kw_read_begin(s, &r) && !kw_wal_iter(r, from, &it));
    for (uint64_t lsn = from; lsn <= to; lsn++) {
        uint64_t at = 0;
        const void *p = NULL;
        size_t len = 0;
        ck_assert_rc(kr_get(n, lsn, &got), KEEL_OK);
        ck_assert_int_eq(kw_wal_next(it, &at, &p, &len), 1);
        ck_assert(at == lsn && len == got.len && !memcmp(p, got.p, len));
    }
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_buf_free(&got);
}

/* The stream holds the directory's records from..to, and nothing else. */
static void assert_stream_holds(kr_node *n, kw_store *s, uint64_t from, uint64_t to)
{
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, from);
    ck_assert_uint_eq(last, to);
    assert_same_records(n, s, from, to);
}

static bool meta_has(kw_store *s, const char *key)
{
    int has = kw_store_has(s, KW_DB_META, key, strlen(key));
    ck_assert_int_ge(has, 0);
    return has;
}

static int fill_seeding_mark(kw_wtxn *t, void *arg)
{
    (void)arg;
    unsigned char v[8] = {5};
    int rc = kw_put(t, KW_DB_META, KW_META_SEEDING, strlen(KW_META_SEEDING), v, sizeof v);
    return rc ? rc : kw_put(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), "KEEL_seed", 9);
}

/* A stream that never held a record does not take a world away from the
 * directory holding it: a primary's directory whose WAL starts at LSN 1 is
 * kept whole and seeds the stream (a seed cut short goes on from where the
 * stream stopped); a replica's is left alone (its primary publishes the
 * world); a primary's whose checkpoints deleted its first records is
 * refused with KEEL_ERANGE; nothing is written but by the seed. */
START_TEST(test_world_seeds_empty_stream)
{
    kr_node *n = connect_world(nats_url, "seed", "a"), *replica = NULL;
    ck_assert_rc(kr_connect(&(kr_desc){.urls = nats_url, .world = "seed", .node = "b"}, &replica), KEEL_OK);
    kw_store *s = local_world("seed-local", 5);
    tu_digest before = mdb_digest(s);
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(replica, s, 0, &si), "%s", keel_last_error()); /* left alone: its primary seeds */
    ck_assert(si.unstreamed && !si.seed);
    ck_assert_uint_eq(si.discarded + si.appended, 0);
    assert_same_digest(mdb_digest(s), before);

    kw_store *t = trimmed_dir("seed-trimmed", "local");
    before = mdb_digest(t);
    ck_assert_rc(kr_sync_store(n, t, 0, &si), KEEL_ERANGE);
    ck_assert_msg(strstr(keel_last_error(), "starts after LSN 3"), "%s", keel_last_error());
    assert_same_digest(mdb_digest(t), before);

    before = mdb_digest(s);
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert(si.seed && !si.bootstrapped);
    ck_assert_uint_eq(si.discarded + si.appended + si.stream_last, 0);
    ck_assert_uint_eq(si.local_last, 5);
    assert_same_digest(mdb_digest(s), before); /* left as it is: the seed writes */
    /* a seed cut short after LSN 2 (kr_seed_stream marks the directory first): the stream holds a prefix of
       the world, and the directory goes on from it */
    ck_assert_rc(kw_store_write(s, fill_seeding_mark, NULL), KEEL_OK);
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= 2; lsn++) {
        epoch_record(&rec, lsn, lsn, "local");
        ck_assert_rc(kr_publish(n, 1, lsn, rec.p, rec.len), KEEL_OK);
    }
    before = mdb_digest(s);
    ck_assert_rc(kr_sync_store(replica, s, 0, &si), KEEL_ERANGE); /* LSN 3..5 are the world's only copy */
    ck_assert_msg(strstr(keel_last_error(), "start the primary on it first"), "%s", keel_last_error());
    assert_same_digest(mdb_digest(s), before);
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert(si.seed);
    ck_assert_uint_eq(si.stream_last, 2);
    ck_assert_uint_eq(si.local_last, 5);
    ck_assert_uint_eq(si.discarded, 0);
    ck_assert_msg(!kr_seed_stream(n, s, 3, 5, NULL, NULL), "%s", keel_last_error());
    assert_stream_holds(n, s, 1, 5);
    ck_assert(!meta_has(s, KW_META_SEEDING) && meta_has(s, KW_META_REPLICATED));
    /* seeding again from LSN 1: the stream is asked once more and holds records, so nothing goes out */
    ck_assert_rc(kr_seed_stream(n, s, 1, 5, NULL, NULL), KEEL_EFENCED);
    ck_assert_msg(strstr(keel_last_error(), "holds records after all"), "%s", keel_last_error());
    assert_stream_holds(n, s, 1, 5);
    ck_assert(!meta_has(s, KW_META_SEEDING));
    /* past the directory's last record: KEEL_ECORRUPT naming it, nothing published */
    ck_assert_rc(kr_seed_stream(n, s, 6, 7, NULL, NULL), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "lacks WAL record 6"), "%s", keel_last_error());
    assert_stream_holds(n, s, 1, 5);
    ck_assert_rc(kw_store_write(s, fill_seeding_mark, NULL), KEEL_OK); /* a mark that outlived its seed */
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error()); /* in step: the mark goes */
    ck_assert(!si.seed && !meta_has(s, KW_META_SEEDING));
    ck_assert_uint_eq(si.discarded + si.appended, 0);
    ck_assert_uint_eq(si.local_last, 5);
    /* without the seeding mark, a tail beyond the stream is an unpublished one: dropped */
    epoch_record(&rec, 6, 6, "local");
    ck_assert_rc(kr_append_record(s, 6, rec.p, rec.len), KEEL_OK);
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert(!si.seed);
    ck_assert_uint_eq(si.discarded, 1);
    ck_assert_uint_eq(wal_last(s), 5);
    kw_buf_free(&rec);
    kw_store_close(s);
    kw_store_close(t);
    kr_close(replica);
    kr_close(n);
}
END_TEST

static int fill_checkpoint_meta(kw_wtxn *t, void *arg)
{
    unsigned char m[32];
    kw_checkpoint_meta_encode(&(kw_checkpoint_meta){.tick = 5, .lsn = *(const uint64_t *)arg}, m);
    return kw_put(t, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), m, sizeof m);
}

/* A trimmed directory whose checkpoint covers records an empty stream never
 * held cannot restart from it: KEEL_ERANGE, nothing written (not even the
 * mark that makes it the stream's). */
START_TEST(test_trimmed_checkpoint_against_empty_stream)
{
    kr_node *n = connect_world(nats_url, "void", "a");
    kw_store *s = trimmed_dir("void-dir", "local");
    uint64_t covered = 5;
    ck_assert_rc(kw_store_write(s, fill_checkpoint_meta, &covered), KEEL_OK);
    tu_digest before = mdb_digest(s);
    kr_sync_info si;
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ERANGE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "holds no record"));
    assert_same_digest(mdb_digest(s), before);
    kw_store_close(s);
    kr_close(n);
}
END_TEST

/* Messages that are no WAL records of their sequence are refused and
 * nothing reaches the directory; so is a stream purged past it. */
START_TEST(test_bad_streams_write_nothing)
{
    kr_node *n = connect_world(nats_url, "junk", "a");
    ck_assert_rc(kr_publish(n, 1, 1, "not a record", 12), KEEL_OK);
    kw_store *s = store_in("junk");
    kr_sync_info si;
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "stream message 1"));
    ck_assert_uint_eq(wal_last(s), 0);
    kw_store_close(s);
    kr_close(n);

    n = connect_world(nats_url, "purged", "a");
    publish_epochs(n, 4, "a");
    ck_assert_rc(kr_purge_before(n, 1), KEEL_OK); /* nothing is before 1 */
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 1);
    ck_assert_uint_eq(last, 4);
    ck_assert_rc(kr_purge_before(n, 3), KEEL_OK);
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 3);
    s = store_in("purged");
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ERANGE);
    ck_assert_uint_eq(wal_last(s), 0);
    kw_store_close(s);
    kr_close(n);

    /* a message deleted from inside the stream: a gap, not a stream that stopped delivering */
    n = connect_world(nats_url, "holed", "a");
    publish_epochs(n, 6, "a");
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_DeleteMsg(js, "KEEL_holed", 3, NULL, NULL), NATS_OK);
    s = store_in("holed");
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "gap") && strstr(keel_last_error(), "3 was expected"), "%s",
                  keel_last_error());
    ck_assert_uint_eq(wal_last(s), 0);
    kw_store_close(s);
    /* keel-wal finds the same problem: exit 1, naming it */
    char addr[128];
    snprintf(addr, sizeof addr, "%s/holed", nats_url);
    tu_run run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", addr, NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "gap"), "keel-wal verify: status %d, stderr %s", run.status,
                  run.err);
    tu_run_free(&run);
    kr_close(n);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);

    /* a stream purged of every record still ends where it did: a directory at its end goes on from there */
    n = connect_world(nats_url, "emptied", "a");
    publish_epochs(n, 4, "a");
    s = store_in("emptied");
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_OK);
    ck_assert_uint_eq(si.local_last, 4);
    ck_assert_rc(kr_purge_before(n, 5), KEEL_OK);
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 5);
    ck_assert_uint_eq(last, 4);
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_OK);
    ck_assert_uint_eq(si.local_last, 4);
    ck_assert_uint_eq(si.appended, 0);
    ck_assert_uint_eq(si.discarded, 0);
    ck_assert_uint_eq(wal_last(s), 4);
    kw_store_close(s);
    s = store_in("emptied-new"); /* one that lacks what was purged: no checkpoint to restart from */
    ck_assert_rc(kr_sync_store(n, s, 0, &si), KEEL_ERANGE);
    ck_assert_uint_eq(wal_last(s), 0);
    kw_store_close(s);
    kr_close(n);
}
END_TEST

/* A directory recording a checkpoint covering `lsn`: its meta, a schema
 * value and `n` snap keys of `size` bytes (the copy takes them as stored:
 * nothing here need decode). */
typedef struct ck_fill {
    uint64_t lsn;
    uint32_t n;
    size_t size;
} ck_fill;

static int fill_ckpt(kw_wtxn *t, void *arg)
{
    const ck_fill *f = arg;
    unsigned char meta[32], key[9];
    kw_checkpoint_meta_encode(&(kw_checkpoint_meta){.tick = 3, .lsn = f->lsn, .count = 1}, meta);
    int rc = kw_put(t, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), meta, sizeof meta);
    if (!rc)
        rc = kw_put(t, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), "schema", 6);
    unsigned char *val = malloc(f->size);
    for (uint32_t i = 0; !rc && i < f->n; i++) {
        for (size_t j = 0; j < f->size; j++)
            val[j] = (unsigned char)(i * 31 + j);
        rc = kw_put(t, KW_DB_SNAP, key, kw_snap_key_chunk(key, 0, i), val, f->size);
    }
    free(val);
    return rc;
}

/* The snap database's keys and values, hashed in order, and its key count. */
static uint64_t snap_digest(kw_store *s, uint32_t *keys)
{
    kw_rtxn *r;
    kw_walit *it;
    const void *k, *v;
    size_t kn, vn;
    uint64_t h = 1469598103934665603ull;
    *keys = 0;
    ck_assert(!kw_read_begin(s, &r));
    ck_assert(!kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it));
    while (kw_db_next(it, &k, &kn, &v, &vn) == 1) {
        for (size_t i = 0; i < kn + vn; i++)
            h = (h ^ (i < kn ? ((const unsigned char *)k)[i] : ((const unsigned char *)v)[i - kn])) * 1099511628211ull;
        ++*keys;
    }
    kw_wal_iter_end(it);
    kw_read_end(r);
    return h;
}

/* One checkpoint message `u8 type | u32 0 | value` published as is. */
static uint64_t publish_raw(jsCtx *js, const char *subject, uint8_t type, const void *val, size_t vlen)
{
    kw_buf b = {0};
    ck_assert(!kw_put_u8(&b, type) && !kw_put_u32(&b, 0) && !kw_put_bytes(&b, val, vlen));
    jsPubAck *pa = NULL;
    ck_assert_int_eq(js_Publish(&pa, js, subject, b.p, (int)b.len, NULL, NULL), NATS_OK);
    uint64_t seq = pa->Sequence;
    jsPubAck_Destroy(pa);
    kw_buf_free(&b);
    return seq;
}

/* A published checkpoint travels as a few ENTRIES messages of many keys
 * and lands in another directory as the first one stores it; damaged
 * ENTRIES messages, and a checkpoint without its schema record, are
 * refused with KEEL_ECORRUPT and leave that directory as it was. */
START_TEST(test_checkpoint_stream)
{
    kr_node *n = connect_world(nats_url, "ckp", "a");
    kw_store *src = store_in("ckp-src"), *dst = store_in("ckp-dst");
    ck_fill f = {.lsn = 7, .n = 40, .size = 100000}; /* 4 MB: several messages at the default 1 MB max_payload */
    ck_assert_rc(kw_store_write(src, fill_ckpt, &f), KEEL_OK);
    uint64_t published = 0, covered = 0;
    ck_assert_msg(!kr_ckpt_publish(n, src, f.lsn, -1, &published), "%s", keel_last_error());
    ck_assert_uint_eq(published, f.lsn);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    jsStreamInfo *si = NULL;
    ck_assert_int_eq(js_GetStreamInfo(&si, js, "KEEL_ckp_CKPT", NULL, NULL), NATS_OK);
    ck_assert_msg(si->State.Msgs >= 4 && si->State.Msgs <= 9, "%" PRIu64 " messages for 40 keys", si->State.Msgs);
    uint64_t msgs = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    /* a checkpoint no newer than the one published (a deposed primary's, late) is not sent over it */
    kw_store *older = store_in("ckp-older");
    ck_assert_rc(kw_store_write(older, fill_ckpt, &(ck_fill){.lsn = 5, .n = 4, .size = 1000}), KEEL_OK);
    ck_assert_msg(!kr_ckpt_publish(n, older, 100, -1, &published), "%s", keel_last_error());
    ck_assert_uint_eq(published, 0);
    ck_assert_int_eq(js_GetStreamInfo(&si, js, "KEEL_ckp_CKPT", NULL, NULL), NATS_OK);
    ck_assert_uint_eq(si->State.Msgs, msgs);
    jsStreamInfo_Destroy(si);
    kw_store_close(older);
    ck_assert_msg(!kr_ckpt_load(n, dst, &covered), "%s", keel_last_error());
    ck_assert_uint_eq(covered, f.lsn);
    uint32_t ks, kd;
    uint64_t want = snap_digest(src, &ks);
    ck_assert_uint_eq(snap_digest(dst, &kd), want);
    ck_assert_uint_eq(kd, 40);
    /* BEGIN, one damaged ENTRIES, END: each the latest checkpoint in turn */
    unsigned char meta[32];
    kw_checkpoint_meta_encode(&(kw_checkpoint_meta){.tick = 9, .lsn = 20, .count = 2}, meta);
    static const unsigned char overrun[] = {3, 0, 0, 0, 'C', 'x'},                 /* a key past the end */
                               nokey[] = {0, 0, 0, 0, 1, 0, 0, 0, 'v'},            /* an empty key */
                               trailing[] = {1, 0, 0, 0, 'C', 1, 0, 0, 0, 'v', 0}; /* a stray byte after */
    const struct { const void *p; size_t n; } bad[] = {{overrun, sizeof overrun}, {nokey, sizeof nokey},
                                                       {trailing, sizeof trailing}, {"", 0}};
    /* a publication that failed part-way (its BEGIN, SCHEMA and an ENTRIES message stored, no END; twice):
       the complete checkpoint before them is still the latest */
    kw_store *again = store_in("ckp-again");
    for (int k = 0; k < 2; k++) {
        publish_raw(js, "keel.ckp.ckpt", 1, meta, sizeof meta);
        publish_raw(js, "keel.ckp.ckpt", 3, "schema", 6);
        publish_raw(js, "keel.ckp.ckpt", 5, overrun, sizeof overrun);
    }
    ck_assert_msg(!kr_ckpt_load(n, again, &covered), "%s", keel_last_error());
    ck_assert_uint_eq(covered, f.lsn);
    ck_assert_uint_eq(snap_digest(again, &kd), want);
    kw_store_close(again);
    /* the last case: a checkpoint without the schema record that follows its BEGIN */
    for (size_t i = 0; i <= sizeof bad / sizeof *bad; i++) {
        bool schema = i < sizeof bad / sizeof *bad;
        uint64_t begin = publish_raw(js, "keel.ckp.ckpt", 1, meta, sizeof meta);
        if (schema)
            publish_raw(js, "keel.ckp.ckpt", 3, "schema", 6);
        publish_raw(js, "keel.ckp.ckpt", 5, schema ? bad[i].p : overrun, schema ? bad[i].n : sizeof overrun);
        unsigned char end[16];
        kw_buf e = {end, 0, sizeof end};
        ck_assert(!kw_put_u64(&e, begin) && !kw_put_u64(&e, schema ? 2 : 1));
        publish_raw(js, "keel.ckp.ckpt", 4, end, sizeof end);
        ck_assert_rc(kr_ckpt_load(n, dst, &covered), KEEL_ECORRUPT);
        ck_assert_msg(strstr(keel_last_error(), "KEEL_ckp_CKPT") &&
                          strstr(keel_last_error(), schema ? "damaged run" : "no checkpoint's schema"), "%s",
                      keel_last_error());
        ck_assert_uint_eq(covered, 0);
        ck_assert_uint_eq(snap_digest(dst, &kd), want); /* nothing of it written */
        ck_assert_uint_eq(kd, 40);
    }
    /* a purged stream whose published checkpoint holds a schema that is no schema record: keel-wal restore
       refuses it (exit 1, verify's problem on stderr) and DEST holds no data file */
    kr_node *g = connect_world(nats_url, "ckbad", "a");
    publish_epochs(g, 6, "a");
    kw_checkpoint_meta_encode(&(kw_checkpoint_meta){.tick = 3, .lsn = 4, .count = 1}, meta);
    uint64_t begin = publish_raw(js, "keel.ckbad.ckpt", 1, meta, sizeof meta);
    publish_raw(js, "keel.ckbad.ckpt", 3, "garbage", 7);
    static const unsigned char entry[] = {1, 0, 0, 0, 'T', 1, 0, 0, 0, 'v'};
    publish_raw(js, "keel.ckbad.ckpt", 5, entry, sizeof entry);
    unsigned char endv[16];
    kw_buf e = {endv, 0, sizeof endv};
    ck_assert(!kw_put_u64(&e, begin) && !kw_put_u64(&e, 2));
    publish_raw(js, "keel.ckbad.ckpt", 4, endv, sizeof endv);
    ck_assert_rc(kr_purge_before(g, 5), KEEL_OK);
    char addr[128], dest[4096], mdb[4200];
    snprintf(addr, sizeof addr, "%s/ckbad", nats_url);
    tu_path(dest, sizeof dest, "ckbad-restored");
    tu_run run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"restore", addr, dest, NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "schema") && strstr(run.err, "nothing restored"),
                  "keel-wal restore: status %d, stderr %s", run.status, run.err);
    tu_run_free(&run);
    snprintf(mdb, sizeof mdb, "%s/data.mdb", dest);
    ck_assert_int_ne(access(mdb, F_OK), 0);
    kr_close(g);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kw_store_close(src);
    kw_store_close(dst);
    kr_close(n);
}
END_TEST

/* A checkpoint covering LSN 5 written into src and published, the stream
 * (to LSN last) purged up to it: it starts at 6. */
static void publish_ckpt_at5(kr_node *n, kw_store *src, uint64_t last)
{
    ck_fill f = {.lsn = 5, .n = 3, .size = 1000};
    uint64_t published = 0, first, end;
    ck_assert_rc(kw_store_write(src, fill_ckpt, &f), KEEL_OK);
    ck_assert_msg(!kr_ckpt_publish(n, src, last, 0, &published), "%s", keel_last_error());
    ck_assert_uint_eq(published, 5);
    ck_assert_rc(kr_bounds(n, &first, &end), KEEL_OK);
    ck_assert_uint_eq(first, 6);
    ck_assert_uint_eq(end, last);
}

/* A directory whose own records 4..6 never reached the stream, while the
 * stream went on to 8 and was purged up to its published checkpoint
 * (covering 5): the point where they part is gone from the stream, so they
 * share no record -- refused, nothing written, also when the directory is
 * marked as the stream's (nothing shows where they part). */
START_TEST(test_purged_divergence_refused)
{
    kr_node *n = connect_world(nats_url, "gone", "a");
    publish_epochs(n, 3, "stream");
    kw_store *ours = store_in("gone-ours"), *unmarked = store_in("gone-unmarked"), *src = store_in("gone-src");
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, ours, 0, &si), "%s", keel_last_error()); /* marks it */
    ck_assert_uint_eq(si.appended, 3);
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= 8; lsn++) {
        epoch_record(&rec, lsn, lsn, lsn <= 3 || lsn > 6 ? "stream" : "local");
        if (lsn > 3 && lsn <= 6)
            ck_assert_rc(kr_append_record(ours, lsn, rec.p, rec.len), KEEL_OK);
        if (lsn <= 6)
            ck_assert_rc(kr_append_record(unmarked, lsn, rec.p, rec.len), KEEL_OK);
        epoch_record(&rec, lsn, lsn, "stream");
        if (lsn > 3)
            ck_assert_rc(kr_publish(n, 1, lsn, rec.p, rec.len), KEEL_OK);
    }
    uint64_t first, last;
    publish_ckpt_at5(n, src, 8);
    kw_store *const dirs[] = {unmarked, ours};
    for (int i = 0; i < 2; i++) {
        tu_digest before = mdb_digest(dirs[i]);
        ck_assert_rc(kr_sync_store(n, dirs[i], 0, &si), KEEL_ECORRUPT);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "share no record"));
        assert_same_digest(mdb_digest(dirs[i]), before);
        wal_bounds(dirs[i], &first, &last);
        ck_assert_uint_eq(first, 1);
        ck_assert_uint_eq(last, 6);
    }
    kw_buf_free(&rec);
    kw_store_close(ours);
    kw_store_close(unmarked);
    kw_store_close(src);
    kr_close(n);
}
END_TEST

/* A sealed TICK_COMMIT record of lsn closing an empty unit of tick `tick`
 * with `nlive` live entities: what an idle tick writes. */
static void commit_record(kw_buf *out, uint64_t lsn, uint64_t tick, uint32_t nlive)
{
    kw_codec_ctx *c;
    unsigned char p[16] = {0};
    memcpy(p + 4, &nlive, 4);
    memcpy(p + 8, &nlive, 4);
    ck_assert(!kw_codec_create(NULL, &c));
    out->len = 0;
    ck_assert(!kw_record_build(c, out, KW_KIND_TICK_COMMIT, lsn, tick, 0, p, sizeof p));
    kw_codec_destroy(c);
}

/* A history of records: an EPOCH record (epoch > 0, by `node`) or an idle
 * tick's commit (epoch 0) at each LSN from 1. */
typedef struct hist_rec {
    uint64_t epoch;            /* an EPOCH record of it; 0: a commit */
    const char *node;
    uint64_t tick;
    uint32_t nlive;
} hist_rec;

static void hist_record(kw_buf *out, uint64_t lsn, const hist_rec *h)
{
    if (h->epoch)
        epoch_record(out, lsn, h->epoch, h->node);
    else
        commit_record(out, lsn, h->tick, h->nlive);
}

/* Publish hist[0..n) as LSN 1..n, each in the epoch of the last EPOCH
 * record at or before it, as primaries publish. */
static void publish_history(kr_node *node, const hist_rec *hist, uint64_t n)
{
    kw_buf rec = {0};
    uint64_t epoch = 1;
    for (uint64_t i = 0; i < n; i++) {
        epoch = hist[i].epoch ? hist[i].epoch : epoch;
        hist_record(&rec, i + 1, &hist[i]);
        ck_assert_rc(kr_publish(node, epoch, i + 1, rec.p, rec.len), KEEL_OK);
    }
    kw_buf_free(&rec);
}

static kw_store *history_dir(const char *name, const hist_rec *hist, uint64_t n)
{
    kw_store *s = store_in(name);
    kw_buf rec = {0};
    for (uint64_t i = 0; i < n; i++) {
        hist_record(&rec, i + 1, &hist[i]);
        ck_assert_rc(kr_append_record(s, i + 1, rec.p, rec.len), KEEL_OK);
    }
    kw_buf_free(&rec);
    return s;
}

/* The stream purged up to right after a directory's last record (LSN 5;
 * it starts at 6). A deposed primary's directory, whose ticks 3 and 4
 * (LSN 4, 5) never reached the stream while a new primary's EPOCH record
 * took LSN 4 there, parted from it below its start: it starts again from
 * the published checkpoint, its records dropped. A copy of the stream's
 * records to LSN 5 (the epoch of its last record is the stream's at 6) is
 * the stream's prefix: kept, and continued. */
START_TEST(test_rejoin_purged_to_directory_end)
{
    kr_node *n = connect_world(nats_url, "edge", "a");
    const hist_rec stream[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 5}, {2, "m", 0, 0},
                               {0, NULL, 3, 5}, {0, NULL, 4, 5}, {0, NULL, 5, 5}};
    const hist_rec deposed[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 5}, {0, NULL, 3, 6}, {0, NULL, 4, 6}};
    publish_history(n, stream, 7);
    kw_store *old = history_dir("edge-old", deposed, 5), *copy = history_dir("edge-copy", stream, 5);
    kw_store *src = store_in("edge-src");
    mark_as(old, "KEEL_edge");
    mark_as(copy, "KEEL_edge");
    uint64_t first, last;
    publish_ckpt_at5(n, src, 7);
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, old, 0, &si), "%s", keel_last_error());
    ck_assert(si.bootstrapped);
    ck_assert_uint_eq(si.discarded_from, 1);
    ck_assert_uint_eq(si.discarded, 5);
    ck_assert_uint_eq(si.appended, 2);
    ck_assert_uint_eq(si.local_last, 7);
    ck_assert_uint_eq(checkpoint_covers(old), 5);
    uint32_t keys_src, keys_old;
    ck_assert_uint_eq(snap_digest(old, &keys_old), snap_digest(src, &keys_src));
    ck_assert_uint_eq(keys_old, keys_src);
    assert_stream_holds(n, old, 6, 7);
    wal_bounds(old, &first, &last);
    ck_assert_uint_eq(first, 6);
    ck_assert_uint_eq(last, 7);
    ck_assert_msg(!kr_sync_store(n, copy, 0, &si), "%s", keel_last_error());
    ck_assert(!si.bootstrapped);
    ck_assert_uint_eq(si.discarded, 0);
    ck_assert_uint_eq(si.appended, 2);
    ck_assert_uint_eq(si.local_last, 7);
    assert_stream_holds(n, copy, 6, 7);
    wal_bounds(copy, &first, &last);
    ck_assert_uint_eq(first, 1);
    kw_store_close(old);
    kw_store_close(copy);
    kw_store_close(src);
    kr_close(n);
}
END_TEST

/* A node that went on without the stream (an unpublished record at LSN 4,
 * while a new primary's EPOCH record took LSN 4 on the stream) can hold a
 * later record byte for byte the same as the stream's (the same idle tick,
 * one LSN on): its records part at 4 all the same. They are dropped from
 * 4, and the stream's taken. */
START_TEST(test_rejoin_same_record_after_parting)
{
    kr_node *n = connect_world(nats_url, "parting", "a");
    const hist_rec stream[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 5}, {2, "m", 0, 0}, {0, NULL, 3, 5}};
    const hist_rec local[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 5}, {0, NULL, 3, 6}, {0, NULL, 3, 5}};
    publish_history(n, stream, 5);
    kw_store *s = history_dir("parting", local, 5);
    mark_as(s, "KEEL_parting"); /* kept in step with it until they parted */
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert_uint_eq(si.discarded_from, 4);
    ck_assert_uint_eq(si.discarded, 2);
    ck_assert_uint_eq(si.appended, 2);
    ck_assert_uint_eq(si.local_last, 5);
    kw_buf want = {0}, got = {0};
    kw_rtxn *r;
    ck_assert(!kw_read_begin(s, &r));
    for (uint64_t lsn = 1; lsn <= 5; lsn++) {
        kw_walit *it;
        uint64_t at;
        const void *rec;
        size_t len;
        ck_assert_rc(kr_get(n, lsn, &want), KEEL_OK);
        ck_assert(!kw_wal_iter(r, lsn, &it));
        ck_assert_int_eq(kw_wal_next(it, &at, &rec, &len), 1);
        ck_assert_uint_eq(at, lsn);
        ck_assert(len == want.len && !memcmp(rec, want.p, len));
        kw_wal_iter_end(it);
    }
    kw_read_end(r);
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error()); /* in step now */
    ck_assert_uint_eq(si.discarded + si.appended, 0);
    kw_buf_free(&want);
    kw_buf_free(&got);
    kw_store_close(s);
    kr_close(n);
}
END_TEST

/* The trimmed EPOCH record of a directory (meta "trimmed_epoch"): its LSN
 * and epoch; 0, 0 when none. */
static void trimmed_epoch(kw_store *s, uint64_t *lsn, uint64_t *epoch)
{
    kw_rtxn *r;
    const void *rec;
    size_t len;
    kw_header h;
    kw_epoch e;
    *lsn = *epoch = 0;
    ck_assert(!kw_read_begin(s, &r));
    int rc = kw_trimmed_epoch_get(r, &rec, &len);
    if (!rc) {
        ck_assert_rc(kw_record_check(rec, len, &h), KEEL_OK);
        ck_assert_uint_eq(h.kind, KW_KIND_EPOCH);
        ck_assert(h.codec == KW_CODEC_RAW && h.raw_len + KW_HEADER_SIZE <= len);
        ck_assert_rc(kw_epoch_decode((const unsigned char *)rec + KW_HEADER_SIZE, h.raw_len, &e), KEEL_OK);
        *lsn = h.lsn;
        *epoch = e.epoch;
    } else {
        ck_assert_rc(rc, KEEL_ENOENT);
    }
    kw_read_end(r);
}

/* Where the stream was purged past the point a directory left it, the
 * directory's epoch there decides, also once its checkpoints deleted its
 * EPOCH record (meta "trimmed_epoch" keeps it): a node whose records part
 * from the stream's below its start is refused, though a later record is
 * byte for byte the stream's; a directory of the same epoch is taken. */
START_TEST(test_rejoin_purged_epoch)
{
    kr_node *n = connect_world(nats_url, "pepoch", "a");
    const hist_rec stream[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {2, "m", 0, 0}, {0, NULL, 2, 5},
                               {0, NULL, 3, 5}, {0, NULL, 4, 5}};
    const hist_rec local[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 6}, {0, NULL, 3, 6},
                              {0, NULL, 3, 5}, {0, NULL, 4, 6}};
    publish_history(n, stream, 6);
    ck_assert_rc(kr_purge_before(n, 5), KEEL_OK);
    uint64_t first, last, at, epoch;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 5);
    kw_store *old = history_dir("pepoch-old", local, 6), *copy = history_dir("pepoch-copy", stream, 6);
    trimmed_epoch(old, &at, &epoch);
    ck_assert_uint_eq(at + epoch, 0); /* nothing trimmed yet */
    uint64_t upto = 2;
    ck_assert_rc(kw_store_write(old, fill_trim, &upto), KEEL_OK); /* its EPOCH record goes */
    trimmed_epoch(old, &at, &epoch);
    ck_assert_uint_eq(at, 1);
    ck_assert_uint_eq(epoch, 1);
    upto = 4;
    ck_assert_rc(kw_store_write(copy, fill_trim, &upto), KEEL_OK);
    trimmed_epoch(copy, &at, &epoch);
    ck_assert_uint_eq(at, 3);
    ck_assert_uint_eq(epoch, 2);
    kr_sync_info si;
    tu_digest before = mdb_digest(old);
    ck_assert_rc(kr_sync_store(n, old, 0, &si), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "share no record"));
    assert_same_digest(mdb_digest(old), before);
    ck_assert_msg(!kr_sync_store(n, copy, 0, &si), "%s", keel_last_error());
    ck_assert_uint_eq(si.discarded + si.appended, 0);
    ck_assert_uint_eq(si.local_last, 6);
    upto = 5; /* a later trim without an EPOCH record keeps the last one's */
    ck_assert_rc(kw_store_write(copy, fill_trim, &upto), KEEL_OK);
    trimmed_epoch(copy, &at, &epoch);
    ck_assert_uint_eq(at, 3);
    ck_assert_uint_eq(epoch, 2);
    kw_store_close(old);
    kw_store_close(copy);
    kr_close(n);
}
END_TEST

/* A world whose WAL holds EPOCH records of an earlier stream (published
 * again after that stream was lost) seeded into a new one: the seed's
 * messages carry no epoch of theirs (KR_SEED_EPOCH), so a directory that
 * copied it is taken back after a purge into the seeded records, though
 * the epoch of its last EPOCH record there (1) is not the seeding
 * primary's (3). */
START_TEST(test_rejoin_purged_seed)
{
    kr_node *n = connect_world(nats_url, "reseed", "a");
    const hist_rec world[] = {{1, "p", 0, 0}, {0, NULL, 1, 5}, {0, NULL, 2, 5}, {0, NULL, 3, 5}, {0, NULL, 4, 5}};
    kw_store *p = history_dir("reseed-p", world, 5), *f = store_in("reseed-f");
    ck_assert_msg(!kr_seed_stream(n, p, 1, 5, NULL, NULL), "%s", keel_last_error());
    kw_buf rec = {0}, got = {0};
    epoch_record(&rec, 6, 3, "p");
    ck_assert_rc(kr_publish(n, 3, 6, rec.p, rec.len), KEEL_OK); /* the seeding primary's EPOCH record */
    ck_assert_rc(kr_append_record(p, 6, rec.p, rec.len), KEEL_OK);
    uint64_t epoch = 9;
    ck_assert_rc(kr_get_epoch(n, 3, &got, &epoch), KEEL_OK);
    ck_assert_uint_eq(epoch, KR_SEED_EPOCH);
    ck_assert_rc(kr_get_epoch(n, 6, &got, &epoch), KEEL_OK);
    ck_assert_uint_eq(epoch, 3);
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, f, 0, &si), "%s", keel_last_error());
    ck_assert_uint_eq(si.appended, 6);
    ck_assert_rc(kr_purge_before(n, 4), KEEL_OK);
    kw_store *const dirs[] = {f, p};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(!kr_sync_store(n, dirs[i], 0, &si), "%s", keel_last_error());
        ck_assert_uint_eq(si.discarded + si.appended, 0);
        ck_assert_uint_eq(si.local_last, 6);
    }
    kw_buf_free(&rec);
    kw_buf_free(&got);
    kw_store_close(p);
    kw_store_close(f);
    kr_close(n);
}
END_TEST

/* A store's meta value as a u64 (0: absent). */
static uint64_t meta_u64(kw_store *s, const char *key)
{
    kw_rtxn *r;
    const void *v;
    size_t len;
    uint64_t out = 0;
    ck_assert_rc(kw_read_begin(s, &r), KEEL_OK);
    if (!kw_get(r, KW_DB_META, key, strlen(key), &v, &len)) {
        kw_cursor c = kw_cursor_make(v, len);
        out = kw_get_u64(&c);
        ck_assert(!c.bad && len == 8);
    }
    kw_read_end(r);
    return out;
}

static int fill_no_stream_id(kw_wtxn *t, void *arg)
{
    (void)arg;
    return kw_del(t, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID));
}

static int fill_short_stream_id(kw_wtxn *t, void *arg)
{
    (void)arg;
    return kw_put(t, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID), "abc", 3);
}

/* What NATS tells of a stream: the identity in its description ("... id=<16 hex>", 0: none) and its
 * message count; with `delete`, the stream is deleted instead. */
static uint64_t stream_identity(const char *stream, bool delete, uint64_t *msgs)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    uint64_t id = 0;
    if (delete) {
        ck_assert_int_eq(js_DeleteStream(js, stream, NULL, NULL), NATS_OK);
    } else {
        jsStreamInfo *si = NULL;
        ck_assert_int_eq(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
        const char *d = si->Config->Description, *at = d ? strstr(d, " id=") : NULL;
        if (at)
            ck_assert_msg(sscanf(at, " id=%16" SCNx64, &id) == 1, "description %s", d);
        if (msgs)
            *msgs = si->State.Msgs;
        jsStreamInfo_Destroy(si);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return id;
}

/* A stream made again under a world's name, after the first was deleted,
 * is another stream (its own identity; the old world's checkpoint is none
 * of its own).
 * Taken: a directory whose records the new stream holds too (the world
 * published again) and one holding only a checkpoint whose last deleted
 * record the new stream holds, their marks now naming the new identity;
 * an empty directory; and one marked by name alone, trusted by its name.
 * Refused, nothing written: a directory marked with the old identity that
 * shares no record with the new stream (which starts right after it, or
 * was purged past it), also by a node that read the old identity before
 * the stream was made again; an unmarked directory holding a world of its
 * own; and one with records after the prefix the new stream holds. A
 * reader of the old stream is refused when it reads again. */
START_TEST(test_stream_made_again)
{
    kr_node *n = connect_world(nats_url, "again", "a");
    publish_epochs(n, 5, "old");
    kw_store *behind = store_in("again-behind"), *at_end = store_in("again-end"), *same = store_in("again-same"),
             *local = store_in("again-local"), *fresh = store_in("again-fresh"), *src = store_in("again-src"),
             *ckonly = store_in("again-ckonly"), *tail = store_in("again-tail");
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, behind, 3, &si), "%s", keel_last_error());
    kw_store *const whole[] = {at_end, same, ckonly, tail};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(!kr_sync_store(n, whole[i], 0, &si), "%s", keel_last_error());
    uint64_t old_id = stream_identity("KEEL_again", false, NULL), five = 5, published = 0;
    tu_digest before;
    ck_assert_uint_ne(old_id, 0);
    ck_assert_uint_eq(meta_u64(behind, KW_META_STREAM_ID), old_id);
    ck_assert_rc(kw_store_write(ckonly, fill_checkpoint_meta, &five), KEEL_OK);
    ck_assert_rc(kw_store_write(ckonly, fill_trim, &five), KEEL_OK); /* a checkpoint and no WAL left */
    kw_buf rec = {0};
    epoch_record(&rec, 6, 6, "tail");
    ck_assert_rc(kr_append_record(tail, 6, rec.p, rec.len), KEEL_OK);
    for (uint64_t lsn = 1; lsn <= 4; lsn++) {
        epoch_record(&rec, lsn, lsn, "local");
        ck_assert_rc(kr_append_record(local, lsn, rec.p, rec.len), KEEL_OK);
    }
    ck_fill f = {.lsn = 5, .n = 3, .size = 1000};
    ck_assert_rc(kw_store_write(src, fill_ckpt, &f), KEEL_OK);
    ck_assert_msg(!kr_ckpt_publish(n, src, 5, -1, &published), "%s", keel_last_error()); /* the old world's */
    kr_node *stale = NULL; /* reads the old identity, then keeps its connection */
    ck_assert_msg(!kr_connect(&(kr_desc){.urls = nats_url, .world = "again", .node = "s"}, &stale), "%s",
                  keel_last_error());
    kr_reader *reader = NULL;
    ck_assert_rc(kr_read_begin(stale, 1, &reader), KEEL_OK);
    kr_close(n);
    stream_identity("KEEL_again", true, NULL);
    n = connect_world(nats_url, "again", "b"); /* made again */
    uint64_t new_id = stream_identity("KEEL_again", false, NULL);
    ck_assert(new_id && new_id != old_id);
    ck_assert_rc(kr_read_restart(reader, 1), KEEL_ECORRUPT); /* a reader does not go on in the new one */
    ck_assert_msg(strstr(keel_last_error(), "made again while it was read"), "%s", keel_last_error());
    uint64_t seq;
    const void *data;
    size_t len;
    ck_assert_rc(kr_read_next(reader, 100, &seq, &data, &len), KEEL_ECORRUPT); /* ... nor reads on */
    kr_read_end(reader);
    uint64_t covered = 0; /* the old world's checkpoint is no checkpoint of the new stream */
    before = mdb_digest(fresh);
    ck_assert_rc(kr_ckpt_load(n, fresh, &covered), KEEL_ENOENT);
    ck_assert_msg(strstr(keel_last_error(), "holds no checkpoint of stream KEEL_again"), "%s", keel_last_error());
    assert_same_digest(mdb_digest(fresh), before);
    publish_epochs(n, 5, "old"); /* the world published again, then more of it */
    for (uint64_t lsn = 6; lsn <= 8; lsn++) {
        epoch_record(&rec, lsn, lsn, "new");
        ck_assert_rc(kr_publish(n, 1, lsn, rec.p, rec.len), KEEL_OK);
    }
    kw_store *const taken[] = {same, ckonly};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(!kr_sync_store(n, taken[i], 0, &si), "%s", keel_last_error());
        ck_assert_uint_eq(si.appended, 3);
        ck_assert_uint_eq(meta_u64(taken[i], KW_META_STREAM_ID), new_id);
    }
    before = mdb_digest(tail);
    ck_assert_rc(kr_sync_store(n, tail, 0, &si), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "made again"), "%s", keel_last_error());
    assert_same_digest(mdb_digest(tail), before);
    uint64_t first, last;
    ck_assert_rc(kw_store_write(src, fill_ckpt, &f), KEEL_OK);
    ck_assert_msg(!kr_ckpt_publish(n, src, 8, 0, &published), "%s", keel_last_error()); /* purges 1..5 */
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 6);
    kw_store *const refused[] = {at_end, behind, local};
    kr_node *const by[] = {stale, n, n};
    const char *const why[] = {"is another", "is another", "never took"};
    for (int i = 0; i < 3; i++) {
        before = mdb_digest(refused[i]);
        ck_assert_rc(kr_sync_store(by[i], refused[i], 0, &si), KEEL_ECORRUPT);
        ck_assert_msg(strstr(keel_last_error(), why[i]) && strstr(keel_last_error(), "nothing written"), "%s",
                      keel_last_error());
        assert_same_digest(mdb_digest(refused[i]), before);
    }
    ck_assert_msg(!kr_sync_store(n, fresh, 0, &si), "%s", keel_last_error());
    ck_assert(si.bootstrapped);
    ck_assert_uint_eq(meta_u64(fresh, KW_META_STREAM_ID), new_id);
    ck_assert_rc(kw_store_write(behind, fill_no_stream_id, NULL), KEEL_OK);
    ck_assert_msg(!kr_sync_store(n, behind, 0, &si), "%s", keel_last_error());
    ck_assert(si.bootstrapped);
    wal_bounds(behind, &first, &last);
    ck_assert_uint_eq(last, 8);
    ck_assert_uint_eq(meta_u64(behind, KW_META_STREAM_ID), new_id);
    kw_buf_free(&rec);
    kw_store *const all[] = {behind, at_end, same, local, fresh, src, ckonly, tail};
    for (int i = 0; i < 8; i++)
        kw_store_close(all[i]);
    kr_close(stale);
    kr_close(n);
}
END_TEST

/* A stream made by hand has no identity, and keel gives it none (its
 * config is not keel's to rewrite): a primary's connection leaves its
 * description as it is, and a directory synced from it is marked by the
 * stream's name alone; a damaged identity in a directory is refused. */
START_TEST(test_stream_without_identity)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    const char *subjects[] = {"keel.bare.wal"};
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    c.Name = "KEEL_bare";
    c.Description = "made by hand";
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    ck_assert_int_eq(js_AddStream(NULL, js, &c, NULL, NULL), NATS_OK);
    kr_node *primary = connect_world(nats_url, "bare", "p");
    jsStreamInfo *si = NULL;
    ck_assert_int_eq(js_GetStreamInfo(&si, js, "KEEL_bare", NULL, NULL), NATS_OK);
    ck_assert_str_eq(si->Config->Description, "made by hand");
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    kw_store *s = store_in("bare");
    publish_epochs(primary, 2, "p");
    kr_sync_info info;
    ck_assert_msg(!kr_sync_store(primary, s, 0, &info), "%s", keel_last_error());
    ck_assert_uint_eq(info.appended, 2);
    ck_assert(meta_has(s, KW_META_REPLICATED) && !meta_has(s, KW_META_STREAM_ID));
    ck_assert_rc(kw_store_write(s, fill_short_stream_id, NULL), KEEL_OK); /* damaged: refused, nothing written */
    tu_digest before = mdb_digest(s);
    ck_assert_rc(kr_sync_store(primary, s, 0, &info), KEEL_ECORRUPT);
    ck_assert_msg(strstr(keel_last_error(), "stream_id is damaged (3 bytes"), "%s", keel_last_error());
    assert_same_digest(mdb_digest(s), before);
    kw_store_close(s);
    kr_close(primary);
}
END_TEST

START_TEST(test_connect_errors)
{
    kr_node *n = NULL;
    ck_assert_rc(kr_connect(&(kr_desc){.urls = "nats://127.0.0.1:1", .world = "w"}, &n), KEEL_EUNAVAILABLE);
    ck_assert_ptr_null(n);
    ck_assert_rc(kr_connect(&(kr_desc){.urls = nats_url, .world = "a b"}, &n), KEEL_EINVAL);
    ck_assert_rc(kr_connect(&(kr_desc){.urls = "http://x:1", .world = "w"}, &n), KEEL_EINVAL);
    ck_assert_rc(kr_connect(&(kr_desc){.urls = nats_url, .world = "never"}, &n), KEEL_ENOENT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "KEEL_never"));
    char urls[64], world[64];
    ck_assert(kr_parse_address("nats://h:4222/w-1", urls, sizeof urls, world, sizeof world));
    ck_assert_str_eq(urls, "nats://h:4222");
    ck_assert_str_eq(world, "w-1");
    ck_assert(!kr_parse_address("/var/lib/keel", urls, sizeof urls, world, sizeof world));
    ck_assert(!kr_parse_address("nats://h:4222/", urls, sizeof urls, world, sizeof world));
}
END_TEST

/* A transaction that writes nothing but its key (*(uint64_t *)arg): a record. */
static int keyed_noop(keel_side_txn *tx, void *arg)
{
    return keel_side_txn_set_key(tx, *(const uint64_t *)arg);
}

/* A sync primary made with the library: it takes epoch 1, publishes every
 * record it commits (a flush returns once the stream holds them), and its
 * metrics say so; a second primary on another directory of the same world
 * waits for the lease and is refused while the first one renews it; a
 * GROUP ticket waited for after the close is durable, on the stream. */
static const keel_field v_fields[] = {{.name = "v", .type = KEEL_BYTES, .offset = 0, .count = 4}};

START_TEST(test_primary_runtime_publishes)
{
    char dir[4096], dir2[4096];
    tu_path(dir, sizeof dir, "primary");
    tu_path(dir2, sizeof dir2, "second");
    keel_runtime_desc d = {.workers = 1, .durable.dir = dir,
                           .replication = {.nats = nats_url, .world = "rt", .mode = KEEL_REPL_SYNC, .lease_ms = 300,
                                           .node = "one"}};
    keel_runtime *rt = tu_rt_new(d);
    tu_reg(keel_runtime_world(rt), "v", 4, KEEL_VERSIONED, v_fields, 1);
    keel_schedule *s;
    ck_assert_rc(keel_schedule_create(rt, &s), KEEL_OK);
    ck_assert_rc(keel_schedule_add_system(s, &(keel_system_desc){.name = "noop", .kind = KEEL_SYSTEM_CALLBACK,
                                                                 .run = tu_sys_noop}, NULL), KEEL_OK);
    tu_install(rt, s);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, 20);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    kr_node *n = connect_world(nats_url, "rt", "probe");
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(first, 1);
    ck_assert_uint_eq(last, keel_durable_lsn(rt)); /* sync: durable means on the stream */
    keel_repl_status st;
    keel_repl_status_get(rt, &st);
    ck_assert(st.role == KEEL_ROLE_PRIMARY && st.mode == KEEL_REPL_SYNC && st.epoch == 1 && !st.fenced);
    ck_assert_uint_eq(st.published_lsn, last);
    char text[65536];
    size_t len;
    ck_assert_rc(keel_metrics_text(rt, text, sizeof text, &len), KEEL_OK);
    ck_assert_ptr_nonnull(strstr(text, "keel_repl_role{role=\"primary\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(text, "keel_repl_epoch 1\n"));
    ck_assert_ptr_nonnull(strstr(text, "keel_repl_fenced 0\n"));
    /* a second primary of world rt while the first one renews its lease */
    d.durable.dir = dir2;
    d.replication.node = "two";
    keel_runtime *rt2 = tu_rt_new(d);
    tu_reg(keel_runtime_world(rt2), "v", 4, KEEL_VERSIONED, v_fields, 1);
    ck_assert_rc(keel_runtime_recover(rt2, NULL), KEEL_EBUSY);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "one holds its lease"));
    keel_runtime_close(rt2);
    kw_store *s2; /* refused before its directory took anything of the stream: no record, no mark */
    ck_assert(!kw_store_open(dir2, &(kw_store_desc){.flags = KW_OPEN_CREATE}, &s2));
    ck_assert_uint_eq(wal_last(s2), 0);
    ck_assert_int_eq(kw_store_has(s2, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED)), 0);
    kw_store_close(s2);
    keel_ticket *tk = NULL;
    uint64_t key = 79;
    ck_assert_rc(keel_submit(rt, keyed_noop, &key, KEEL_DURABLE_GROUP, &tk), KEEL_OK);
    tu_step_n(rt, 1);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
    ck_assert_msg(keel_ticket_wait_durable(tk, -1) == KEEL_OK, "%s", keel_last_error());
    uint64_t tk_lsn = keel_ticket_lsn(tk);
    keel_ticket_release(tk);
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_gt(tk_lsn, 0);
    ck_assert_uint_ge(last, tk_lsn);
    kr_lease l;
    ck_assert_rc(kr_lease_read(n, &l), KEEL_OK);
    ck_assert(l.exists && l.released && l.epoch == 1); /* a clean close lets the lease go */
    kr_close(n);
}
END_TEST

/* A world that changes every tick: one entity spawned with v = the tick. */
static int spawn_sys(keel_ctx *ctx, void *user)
{
    keel_component *v = user;
    uint32_t t = (uint32_t)keel_ctx_tick(ctx);
    keel_init in = {*v, &t};
    return keel_cmd_spawn(keel_ctx_commands(ctx), &in, 1) ? -1 : 0;
}

/* Two spawns a tick (test_replica_unit_fails_midway's primary). */
static int spawn_two_sys(keel_ctx *ctx, void *user)
{
    return spawn_sys(ctx, user) || spawn_sys(ctx, user) ? -1 : 0;
}

/* A runtime with component "v" (and "w" when `w`) whose one system, `run`,
 * spawns entities of v. */
static keel_runtime *spawner_rt(keel_runtime_desc d, keel_component *v, bool w, keel_system_fn run)
{
    keel_runtime *rt = tu_rt_new(d);
    *v = tu_reg(keel_runtime_world(rt), "v", 4, KEEL_VERSIONED, v_fields, 1);
    if (w)
        tu_reg(keel_runtime_world(rt), "w", 4, KEEL_VERSIONED, v_fields, 1);
    keel_schedule *s;
    ck_assert_rc(keel_schedule_create(rt, &s), KEEL_OK);
    ck_assert_rc(keel_schedule_add_system(s, &(keel_system_desc){.name = "spawn", .kind = KEEL_SYSTEM_CALLBACK,
                                                                 .run = run, .user = v}, NULL), KEEL_OK);
    tu_install(rt, s);
    return rt;
}

/* spawning_rt, with a second component "w" registered when `w`. */
static keel_runtime *spawning_rt_w(keel_runtime_desc d, keel_component *v, bool w)
{
    return spawner_rt(d, v, w, spawn_sys);
}

static keel_runtime *spawning_rt(keel_runtime_desc d, keel_component *v)
{
    return spawning_rt_w(d, v, false);
}

/* A world of `ticks` ticks run without replication in the directory `name`
 * (its path into dir): its hash. */
static uint64_t run_local_world(const char *name, char *dir, size_t cap, uint32_t ticks)
{
    tu_path(dir, cap, name);
    keel_component v;
    keel_runtime *rt = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dir}, &v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, ticks);
    uint64_t hash = keel_world_hash(keel_runtime_world(rt));
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
    return hash;
}

/* A read replica of world `name` in the directory "<name>-replica" (its
 * path into dir). */
static keel_runtime_desc replica_desc(const char *name, char *dir, size_t cap)
{
    char sub[64];
    snprintf(sub, sizeof sub, "%s-replica", name);
    tu_path(dir, cap, sub);
    return (keel_runtime_desc){.workers = 1, .durable.dir = dir,
                               .replication = {.nats = nats_url, .world = name, .role = KEEL_ROLE_FOLLOWER}};
}

static keel_runtime_desc sync_primary_desc(const char *dir, const char *world)
{
    return (keel_runtime_desc){.workers = 1, .durable.dir = dir,
                               .replication = {.nats = nats_url, .world = world, .mode = KEEL_REPL_SYNC,
                                               .lease_ms = 300}};
}

/* *v must outlive the runtime: its spawning system reads it every tick. */
static keel_runtime *sync_primary_rt(const char *dir, const char *world, keel_component *v)
{
    return spawning_rt(sync_primary_desc(dir, world), v);
}

/* A sync primary of world `world` in dir, recovered, `ticks` ticks in and
 * flushed (the stream holds them). */
static keel_runtime *sync_primary_at(const char *dir, const char *world, keel_component *v, uint32_t ticks)
{
    keel_runtime *rt = sync_primary_rt(dir, world, v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, ticks);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    return rt;
}

/* The local directory `dir` opens (without replication) at tick and hash. */
static void assert_opens_at(const char *dir, uint64_t tick, uint64_t hash)
{
    keel_component v;
    keel_runtime *rt = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dir}, &v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(rt), tick);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), hash);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
}

/* A new read replica of `world` (replica_desc: its directory into dir),
 * polled until it applied tick `tick`, where its world hashes to `hash`. */
static keel_runtime *replica_at(const char *world, char *dir, size_t cap, keel_component *v, uint64_t tick,
                                uint64_t hash)
{
    keel_runtime *f = spawning_rt(replica_desc(world, dir, cap), v);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    for (int i = 0; i < 300 && keel_runtime_tick(f) < tick; i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), tick);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), hash);
    return f;
}

/* A standby of `world` (lease 300 ms; stop_tick 0: none), its directory
 * "<world>-standby" in dir, recovered. *v must outlive the runtime. */
static keel_runtime *standby_at(const char *world, uint64_t stop_tick, char *dir, size_t cap, keel_component *v)
{
    char sub[64];
    snprintf(sub, sizeof sub, "%s-standby", world);
    tu_path(dir, cap, sub);
    keel_runtime_desc d = {.workers = 1, .durable.dir = dir,
                           .replication = {.nats = nats_url, .world = world, .role = KEEL_ROLE_STANDBY,
                                           .lease_ms = 300, .stop_tick = stop_tick}};
    keel_runtime *rt = spawning_rt(d, v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    return rt;
}

/* A runtime of d (spawning_rt) recovered and three ticks in. */
static keel_runtime *three_ticks_in(keel_runtime_desc d, keel_component *v)
{
    keel_runtime *rt = spawning_rt(d, v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, 3);
    return rt;
}

typedef struct opener {
    keel_runtime *rt;
    atomic_int done;
    int rc;
} opener;

static void *open_main(void *arg)
{
    opener *o = arg;
    o->rc = keel_runtime_recover(o->rt, NULL);
    atomic_store(&o->done, 1);
    return NULL;
}

/* A primary renews its lease from the moment it takes it, whatever else
 * it does: here its recovery, held 3 s by a failpoint (5 lease times; the
 * publisher does not exist yet). A watcher sees the lease's revision move
 * in the new epoch while the open has not returned; the node then opens as
 * the primary, not fenced. */
START_TEST(test_lease_renewed_while_recovering)
{
    if (!keel_failpoints_compiled())
        return; /* a build without failpoints cannot hold a recovery on purpose */
    char dir[4096];
    tu_path(dir, sizeof dir, "busy");
    keel_runtime_desc d = sync_primary_desc(dir, "busy");
    d.replication.lease_ms = 600;
    keel_component v;
    ck_assert_rc(keel_runtime_close(three_ticks_in(d, &v)), KEEL_OK); /* epoch 1, released */
    ck_assert_rc(keel_failpoints_set("recover.before_replay=delay:3000"), KEEL_OK);
    opener o = {.rt = spawning_rt(d, &v)};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, open_main, &o), 0);
    kr_node *w = connect_world(nats_url, "busy", "watch");
    uint64_t revs = 0, last_rev = 0;
    for (int i = 0; i < 3000 && revs < 3; i++) {
        bool opening = !atomic_load(&o.done); /* before the read: the read is inside the open */
        kr_lease l;
        ck_assert_rc(kr_lease_read(w, &l), KEEL_OK);
        if (!opening)
            break;
        if (l.exists && l.epoch == 2 && !l.released && l.rev != last_rev) {
            last_rev = l.rev;
            revs++;
        }
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
    }
    ck_assert_msg(revs >= 3, "the lease moved %" PRIu64 " times in epoch 2 while the primary recovered", revs);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    ck_assert_msg(o.rc == KEEL_OK, "%s", keel_strerror(o.rc));
    tu_step_n(o.rt, 2);
    ck_assert_rc(keel_flush(o.rt), KEEL_OK);
    keel_repl_status st;
    keel_repl_status_get(o.rt, &st);
    ck_assert(st.role == KEEL_ROLE_PRIMARY && st.epoch == 2 && !st.fenced);
    ck_assert_rc(keel_runtime_close(o.rt), KEEL_OK);
    kr_close(w);
}
END_TEST

/* A closure that writes nothing but logs a record: its key. */
static int count_shutdown(keel_side_txn *tx, void *arg)
{
    (void)tx;
    ++*(int *)arg;
    return 0;
}

/* A sync primary closed while its stream is out of reach (the nats-server
 * frozen) does not wait for it forever -- neither in its on_shutdown's
 * IMMEDIATE transaction (which waits for the last LSN, here writing
 * nothing) nor in its final flush: the close returns KEEL_EUNAVAILABLE
 * naming what the stream did not acknowledge, after the local disk took
 * everything (meanwhile an IMMEDIATE ticket stays pending, and a timed
 * keel_wait_durable on its LSN ends KEEL_EUNAVAILABLE, not KEEL_ETIMEDOUT;
 * after the close that ticket and a GROUP ticket's durable wait end
 * KEEL_EUNAVAILABLE too, not KEEL_EFATAL: nothing latched); reopened once
 * NATS is back, the node goes on from what the stream holds. */
START_TEST(test_sync_close_without_stream)
{
    char dir[4096];
    int shutdowns = 0;
    tu_path(dir, sizeof dir, "frozen");
    keel_runtime_desc d = sync_primary_desc(dir, "frozen");
    d.replication.timeout_ms = 500;
    d.durable.on_shutdown = count_shutdown;
    d.durable.shutdown_arg = &shutdowns;
    keel_component v;
    keel_runtime *rt = three_ticks_in(d, &v);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    uint64_t acked = keel_durable_lsn(rt);
    tu_stop_process(nats_pid); /* not one acknowledgement after this */
    keel_ticket *tk = NULL, *group = NULL;
    uint64_t key = 77, group_key = 78;
    ck_assert_rc(keel_submit(rt, keyed_noop, &key, KEEL_DURABLE_IMMEDIATE, &tk), KEEL_OK);
    ck_assert_rc(keel_submit(rt, keyed_noop, &group_key, KEEL_DURABLE_GROUP, &group), KEEL_OK);
    tu_step_n(rt, 1);
    /* its record reaches the local disk, never the frozen stream: the ticket stays pending (KEEL_ETIMEDOUT),
       and a timed keel_wait_durable on its LSN ends KEEL_EUNAVAILABLE (before the local disk has it,
       KEEL_ETIMEDOUT) */
    int pending = keel_ticket_wait(tk, 0), waited = KEEL_ETIMEDOUT;
    uint64_t lsn = keel_ticket_lsn(tk);
    for (int i = 0; i < 300 && lsn && waited == KEEL_ETIMEDOUT; i++)
        waited = keel_wait_durable(rt, lsn, 100 * 1000000ll);
    char why[512];
    snprintf(why, sizeof why, "%s", keel_last_error());
    int durable = keel_ticket_wait_durable(tk, 0), group_done = keel_ticket_wait(group, 0);
    uint64_t group_lsn = keel_ticket_lsn(group);
    int closed = keel_runtime_close(rt);
    char close_why[1024], imm_why[512], group_why[512];
    snprintf(close_why, sizeof close_why, "%s", keel_last_error());
    int imm_after = keel_ticket_wait(tk, -1);
    snprintf(imm_why, sizeof imm_why, "%s", keel_last_error());
    int group_after = keel_ticket_wait_durable(group, -1);
    snprintf(group_why, sizeof group_why, "%s", keel_last_error());
    int group_again = keel_ticket_wait(group, -1);
    keel_ticket_release(tk);
    keel_ticket_release(group);
    ck_assert_int_eq(kill(nats_pid, SIGCONT), 0); /* before any assertion: the next cases need the server */
    ck_assert_rc(pending, KEEL_ETIMEDOUT);
    ck_assert_uint_gt(lsn, acked);
    ck_assert_msg(waited == KEEL_EUNAVAILABLE && strstr(why, "on the local disk but the replication stream"), "%s: %s",
                  keel_strerror(waited), why);
    ck_assert_rc(durable, KEEL_ETIMEDOUT);
    ck_assert_rc(group_done, KEEL_OK); /* committed; its record is GROUP's to make durable */
    ck_assert_uint_gt(group_lsn, acked);
    ck_assert_rc(closed, KEEL_EUNAVAILABLE);
    char lsn_text[64];
    snprintf(lsn_text, sizeof lsn_text, "LSN %" PRIu64 " is on the local disk only", lsn);
    ck_assert_msg(imm_after == KEEL_EUNAVAILABLE && strstr(imm_why, lsn_text), "%s: %s", keel_strerror(imm_after),
                  imm_why);
    snprintf(lsn_text, sizeof lsn_text, "LSN %" PRIu64 " is on the local disk only", group_lsn);
    ck_assert_msg(group_after == KEEL_EUNAVAILABLE && strstr(group_why, lsn_text), "%s: %s",
                  keel_strerror(group_after), group_why);
    ck_assert_rc(group_again, KEEL_OK); /* its commit's result stands */
    ck_assert_int_eq(shutdowns, 1);
    char want[64];
    snprintf(want, sizeof want, "acknowledged LSN %" PRIu64 " of ", acked);
    ck_assert_msg(strstr(close_why, want) && strstr(close_why, dir), "%s", close_why);
    rt = spawning_rt(d, &v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    uint64_t tick = keel_runtime_tick(rt); /* 4 when the frozen server had taken the last tick's records */
    ck_assert_msg(tick == 3 || tick == 4, "reopened at tick %" PRIu64, tick);
    tu_step_n(rt, 2);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    ck_assert_uint_eq(keel_runtime_tick(rt), tick + 2);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
}
END_TEST

/* A sync primary of `world` (directory world-primary) one tick in, flushed,
 * and a replica of it, opened. *pv and *fv are what their spawning systems
 * read every tick: the caller's, alive as long as the runtimes. */
static void primary_with_replica(const char *world, keel_runtime **p, keel_component *pv, keel_runtime **f,
                                 keel_component *fv)
{
    char pdir[4096], fdir[4096], name[128];
    snprintf(name, sizeof name, "%s-primary", world);
    tu_path(pdir, sizeof pdir, name);
    *p = sync_primary_rt(pdir, world, pv);
    ck_assert_msg(!keel_runtime_recover(*p, NULL), "%s", keel_last_error());
    tu_step_n(*p, 1);
    ck_assert_rc(keel_flush(*p), KEEL_OK);
    *f = spawning_rt(replica_desc(world, fdir, sizeof fdir), fv);
    ck_assert_msg(!keel_runtime_recover(*f, NULL), "%s", keel_last_error());
}

/* A local world replicated from then on: its primary keeps it (the tick
 * and the hash go on, nothing discarded), publishes its WAL to the new
 * stream before its EPOCH record, and a new replica bootstraps from the
 * stream to the primary's state; so does one whose lease was held before
 * (a stream made again: the world's lease bucket kept). */
START_TEST(test_local_world_replicated)
{
    char dir[4096], fdir[4096];
    uint64_t local = run_local_world("was-local", dir, sizeof dir, 5);
    kw_store *s = store_in("was-local");
    uint64_t local_last = wal_last(s);
    kw_store_close(s);
    keel_component pv;
    keel_runtime *p = sync_primary_rt(dir, "was-local", &pv);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(p), 5);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(p)), local);
    keel_repl_status st;
    keel_repl_status_get(p, &st);
    ck_assert_uint_eq(st.discarded, 0);
    ck_assert_uint_eq(st.epoch, 1);
    ck_assert_uint_eq(st.stream_lsn, local_last + 1); /* the world's records, then this primary's EPOCH */
    tu_step_n(p, 3);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    uint64_t want = keel_world_hash(keel_runtime_world(p));

    keel_component fv;
    keel_runtime *f = spawning_rt(replica_desc("was-local", fdir, sizeof fdir), &fv);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    for (int i = 0; i < 200 && keel_runtime_tick(f) < 8; i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), 8);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);

    kr_node *x = connect_world(nats_url, "was-held", "x");
    kr_lease seen;
    uint64_t epoch, rev;
    ck_assert_rc(kr_lease_read(x, &seen), KEEL_OK);
    ck_assert_rc(kr_lease_take(x, &seen, &epoch, &rev), KEEL_OK);
    ck_assert_rc(kr_lease_renew(x, epoch, true, &rev), KEEL_OK); /* held once, let go */
    kr_close(x);
    local = run_local_world("was-held", dir, sizeof dir, 2);
    p = sync_primary_rt(dir, "was-held", &pv);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(p), 2);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(p)), local);
    keel_repl_status_get(p, &st);
    ck_assert_uint_eq(st.epoch, 2);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A read replica opened on a directory holding a world its stream never
 * held waits for the primary to publish it, 30 of its NATS timeouts (100 ms
 * here), and is then refused with KEEL_ERANGE; data.mdb is unchanged. */
START_TEST(test_replica_waits_for_unstreamed_world)
{
    char dir[4096], mdb[4200];
    run_local_world("unstreamed", dir, sizeof dir, 3);
    kr_close(connect_world(nats_url, "unstreamed", "x")); /* the world's stream, empty */
    snprintf(mdb, sizeof mdb, "%s/data.mdb", dir);
    tu_digest before = tu_file_digest(mdb);
    keel_component v;
    keel_runtime *f = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dir,
                                                      .replication = {.nats = nats_url, .world = "unstreamed",
                                                                      .role = KEEL_ROLE_FOLLOWER,
                                                                      .timeout_ms = 100}},
                                  &v);
    ck_assert_rc(keel_runtime_recover(f, NULL), KEEL_ERANGE);
    ck_assert_msg(strstr(keel_last_error(), "start its primary on it first"), "%s", keel_last_error());
    keel_runtime_close(f);
    assert_same_digest(tu_file_digest(mdb), before);
}
END_TEST

/* A follower checkpoints the state it applied at its own interval: the
 * directory's meta names a tick it reached, the WAL it covers is deleted, and a
 * reopen starts from the checkpoint and ends on the primary's state. */
START_TEST(test_follower_checkpoints)
{
    char pdir[4096], fdir[4096];
    tu_path(pdir, sizeof pdir, "ckpt-primary");
    tu_path(fdir, sizeof fdir, "ckpt-follower");
    keel_component pv, fv;
    keel_runtime *p = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = pdir,
                                                      .replication = {.nats = nats_url, .world = "fck",
                                                                      .mode = KEEL_REPL_SYNC, .lease_ms = 300}},
                                  &pv);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 10);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    keel_runtime_desc fd = {.workers = 1, .durable = {.dir = fdir, .checkpoint_every_ticks = 7},
                            .replication = {.nats = nats_url, .world = "fck", .role = KEEL_ROLE_FOLLOWER}};
    keel_runtime *f = spawning_rt(fd, &fv);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), 10); /* the open copied and applied the stream */
    for (uint64_t t = 11; t <= 30; t++) { /* a tick at a time, each followed to the end */
        tu_step_n(p, 1);
        ck_assert_rc(keel_flush(p), KEEL_OK);
        for (int i = 0; i < 200 && keel_runtime_tick(f) < t; i++)
            ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
        ck_assert_uint_eq(keel_runtime_tick(f), t);
    }
    uint64_t want = keel_world_hash(keel_runtime_world(p));
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    /* what the follower left on disk: checkpoints at ticks 11, 18, 25 */
    kw_store *st = store_in("ckpt-follower");
    kw_rtxn *r;
    const void *v;
    size_t n;
    kw_checkpoint_meta m = {0};
    ck_assert(!kw_read_begin(st, &r));
    ck_assert_rc(kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &n), KEEL_OK);
    ck_assert(!kw_checkpoint_meta_decode(v, n, &m));
    uint64_t first = 0, last = 0;
    int brc = kw_wal_bounds(r, &first, &last, NULL);
    kw_read_end(r);
    kw_store_close(st);
    ck_assert_msg(m.tick == 25 && m.lsn > 1, "checkpoint tick %" PRIu64 " lsn %" PRIu64, m.tick, m.lsn);
    ck_assert_msg(brc == KEEL_OK && first == m.lsn + 1 && last > m.lsn, "the WAL holds %" PRIu64 "..%" PRIu64 " (%d), "
                  "the checkpoint covers %" PRIu64, first, last, brc, m.lsn); /* what it covers is deleted */
    /* reopened: from the checkpoint, the same state */
    f = spawning_rt(fd, &fv);
    keel_recovery rec;
    ck_assert_msg(!keel_runtime_recover(f, &rec), "%s", keel_last_error());
    ck_assert_uint_eq(rec.checkpoint_tick, m.tick);
    ck_assert_uint_eq(keel_runtime_tick(f), 30);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
}
END_TEST

/* The value of the sample `name` (no labels) in rt's exposition. */
static uint64_t metric_u64(keel_runtime *rt, const char *name)
{
    static char text[65536];
    size_t len;
    ck_assert_rc(keel_metrics_text(rt, text, sizeof text, &len), KEEL_OK);
    char line[128];
    snprintf(line, sizeof line, "\n%s ", name);
    const char *at = strstr(text, line);
    ck_assert_msg(at, "no sample %s", name);
    return strtoull(at + strlen(line), NULL, 10);
}

/* Step the primary one tick and poll the replica until it applied it. */
static void follow_one_tick(keel_runtime *p, keel_runtime *f)
{
    tu_step_n(p, 1);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    uint64_t t = keel_runtime_tick(p);
    for (int i = 0; i < 200 && keel_runtime_tick(f) < t; i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), t);
}

/* A follower's checkpoints that fail (ckpt.before_meta=eio: the disk
 * refuses the write) are tried again at the interval, and the checkpoint's
 * age (keel_runtime_stats, keel_checkpoint_age_ticks) keeps counting from
 * the last one recorded until one is recorded again. */
START_TEST(test_failed_checkpoints_age)
{
    if (!keel_failpoints_compiled())
        return; /* a build without failpoints cannot fail a checkpoint on purpose */
    char pdir[4096], fdir[4096];
    tu_path(pdir, sizeof pdir, "age-primary");
    tu_path(fdir, sizeof fdir, "age-follower");
    keel_component pv, fv;
    keel_runtime *p = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = pdir,
                                                      .replication = {.nats = nats_url, .world = "fage",
                                                                      .mode = KEEL_REPL_SYNC, .lease_ms = 300}},
                                  &pv);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 10);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    keel_runtime_desc fd = {.workers = 1, .durable = {.dir = fdir, .checkpoint_every_ticks = 5},
                            .replication = {.nats = nats_url, .world = "fage", .role = KEEL_ROLE_FOLLOWER}};
    keel_runtime *f = spawning_rt(fd, &fv);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    follow_one_tick(p, f); /* tick 11: the first checkpoint, recorded */
    ck_assert_uint_eq(tu_stats(f).checkpoints, 1);
    ck_assert_uint_eq(tu_stats(f).checkpoint_age_ticks, 0);
    /* the primary takes no checkpoint before tick 3600: the failpoint hits the follower's only */
    ck_assert_rc(keel_failpoints_set("ckpt.before_meta=eio"), KEEL_OK);
    for (uint64_t t = 12; t <= 26; t++) { /* attempts at 16, 21 and 26 fail */
        follow_one_tick(p, f);
        keel_runtime_stats st = tu_stats(f);
        ck_assert_uint_eq(st.checkpoints, 1);
        ck_assert_uint_eq(st.checkpoint_age_ticks, t - 11);
        ck_assert_uint_eq(metric_u64(f, "keel_checkpoint_age_ticks"), t - 11);
    }
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    for (uint64_t t = 27; t <= 30; t++) { /* the pacing counts from the last attempt: none before 31 */
        follow_one_tick(p, f);
        ck_assert_uint_eq(tu_stats(f).checkpoint_age_ticks, t - 11);
    }
    follow_one_tick(p, f); /* tick 31: recorded */
    ck_assert_uint_eq(tu_stats(f).checkpoints, 2);
    ck_assert_uint_eq(tu_stats(f).checkpoint_age_ticks, 0);
    ck_assert_uint_eq(metric_u64(f, "keel_checkpoint_age_ticks"), 0);
    follow_one_tick(p, f);
    ck_assert_uint_eq(metric_u64(f, "keel_checkpoint_age_ticks"), 1);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A replica's lag comes from the messages it reads (each says how many
 * follow it in the stream): a poll that copies part of what the stream
 * holds reports the stream's end and the records left, then none once it
 * applied them all. A poll waits for every record the stream held when
 * the last one it read was sent, however slowly they are delivered: the
 * first copies its whole batch of 4 096 (the stream holds more). */
START_TEST(test_replica_lag_from_messages)
{
    keel_component pv, fv;
    keel_runtime *p, *f;
    primary_with_replica("rlag", &p, &pv, &f, &fv);
    keel_repl_status st;
    keel_repl_status_get(f, &st);
    uint64_t opened = st.applied_lsn;
    ck_assert_uint_eq(opened, keel_durable_lsn(p));
    ck_assert_uint_eq(st.lag_records, 0);
    /* two records a tick (the spawn, the marker): more than one poll copies */
    tu_step_n(p, 2200);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    uint64_t end = keel_durable_lsn(p);
    ck_assert_uint_gt(end, opened + 4096);
    ck_assert_msg(!keel_replica_poll(f, 30000, NULL), "%s", keel_last_error());
    keel_repl_status_get(f, &st);
    ck_assert_msg(st.applied_lsn >= opened + 4095 && st.applied_lsn <= opened + 4096, /* whole units of 2 */
                  "one poll applied %" PRIu64 " records of the 4096 it copies", st.applied_lsn - opened);
    ck_assert_uint_eq(st.stream_lsn, end);
    ck_assert_uint_eq(st.lag_records, end - st.applied_lsn);
    ck_assert(st.mean_record_bytes > 0);
    ck_assert_uint_eq(st.lag_bytes, (uint64_t)((double)st.lag_records * st.mean_record_bytes + 0.5));
    ck_assert_uint_gt(st.lag_ticks + st.lag_records, 0);
    for (int i = 0; i < 100 && st.applied_lsn < end; i++) {
        ck_assert_msg(!keel_replica_poll(f, 1000, NULL), "%s", keel_last_error());
        keel_repl_status_get(f, &st);
    }
    ck_assert_uint_eq(st.applied_lsn, end);
    ck_assert_uint_eq(st.stream_lsn, end);
    ck_assert_uint_eq(st.lag_records + st.lag_bytes + st.lag_ticks, 0);
    ck_assert_uint_eq(keel_runtime_tick(f), keel_runtime_tick(p));
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), keel_world_hash(keel_runtime_world(p)));
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A poll with timeout 0 waits for nothing: on a replica with nothing new
 * it applies nothing, and polled again it applies what the consumer has
 * been delivered since (which arrives on the consumer's own time: hence the
 * loop, bounded only to fail rather than hang). */
START_TEST(test_replica_poll_without_wait)
{
    keel_component pv, fv;
    keel_runtime *p, *f;
    primary_with_replica("rnowait", &p, &pv, &f, &fv);
    uint64_t opened = keel_runtime_tick(f);
    ck_assert_uint_eq(opened, keel_runtime_tick(p));
    ck_assert_rc(keel_replica_poll(f, 0, NULL), KEEL_OK);
    ck_assert_uint_eq(keel_runtime_tick(f), opened);
    tu_step_n(p, 3);
    ck_assert_rc(keel_flush(p), KEEL_OK); /* sync: the stream holds the three ticks */
    uint64_t until = tu_now_ns() + 30000000000ull;
    while (keel_runtime_tick(f) < keel_runtime_tick(p) && tu_now_ns() < until) {
        ck_assert_msg(!keel_replica_poll(f, 0, NULL), "%s", keel_last_error());
        sched_yield(); /* the servers delivering share these cores */
    }
    ck_assert_uint_eq(keel_runtime_tick(f), opened + 3);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), keel_world_hash(keel_runtime_world(p)));
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A side transaction bigger than one message of the stream: refused at
 * commit (the stream could never take its record), nothing applied or
 * logged; one that fits is replicated. */
#define BLOB 60000u
#define BLOBS 20u
typedef struct blobs {
    keel_component c;
    keel_entity e[BLOBS];
    uint32_t n;               /* entities the closure writes */
    unsigned char value[BLOB];
} blobs;

static int blob_spawn(keel_ctx *ctx, void *user)
{
    blobs *b = user;
    for (uint32_t i = 0; i < BLOBS && keel_ctx_tick(ctx) == 1; i++)
        if (keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){b->c, b->value}, 1))
            return -1;
    return 0;
}

static int blob_write(keel_side_txn *tx, void *arg)
{
    blobs *b = arg;
    int rc = 0;
    for (uint32_t i = 0; i < b->n && !rc; i++)
        rc = keel_side_set(tx, b->e[i], b->c, b->value);
    return rc;
}

START_TEST(test_side_over_max_payload_refused)
{
    static const keel_field blob_field[] = {{.name = "b", .type = KEEL_BYTES, .offset = 0, .count = BLOB}};
    static blobs b;
    memset(&b, 0, sizeof b);
    char dir[4096];
    tu_path(dir, sizeof dir, "big");
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .durable.dir = dir,
                                                     .replication = {.nats = nats_url, .world = "big",
                                                                     .mode = KEEL_REPL_SYNC, .lease_ms = 300}});
    b.c = tu_reg(keel_runtime_world(rt), "blob", BLOB, KEEL_VERSIONED, blob_field, 1);
    keel_schedule *s;
    ck_assert_rc(keel_schedule_create(rt, &s), KEEL_OK);
    ck_assert_rc(keel_schedule_add_system(s, &(keel_system_desc){.name = "spawn", .kind = KEEL_SYSTEM_CALLBACK,
                                                                 .run = blob_spawn, .user = &b}, NULL), KEEL_OK);
    tu_install(rt, s);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, 1);
    keel_query *q = tu_query_new(keel_runtime_world(rt), b.c, 0);
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        for (uint32_t i = 0; i < it.count && b.n < BLOBS; i++)
            b.e[b.n++] = it.entities[i];
    keel_query_destroy(q);
    ck_assert_uint_eq(b.n, BLOBS);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    uint64_t lsn = keel_durable_lsn(rt), hash = keel_world_hash(keel_runtime_world(rt));
    uint64_t rng = 42; /* 1.2 MB of writes that do not compress: over the server's 1 MiB max_payload */
    for (size_t i = 0; i < sizeof b.value; i++)
        b.value[i] = (unsigned char)tu_rng_next(&rng);
    keel_ticket *tk;
    ck_assert_rc(keel_submit(rt, blob_write, &b, KEEL_DURABLE_IMMEDIATE, &tk), KEEL_OK);
    tu_step_n(rt, 1);
    ck_assert_rc(keel_ticket_wait(tk, -1), KEEL_EINVAL);
    keel_ticket_release(tk);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), hash); /* nothing applied */
    kr_node *n = connect_world(nats_url, "big", "probe");
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(last, keel_durable_lsn(rt)); /* the stream has everything logged... */
    ck_assert_uint_le(keel_durable_lsn(rt), lsn + 1); /* ... and that is at most the second tick's marker */
    b.n = BLOBS / 2; /* 600 kB: one message */
    ck_assert_rc(keel_submit(rt, blob_write, &b, KEEL_DURABLE_IMMEDIATE, &tk), KEEL_OK);
    tu_step_n(rt, 1);
    ck_assert_rc(keel_ticket_wait(tk, -1), KEEL_OK);
    uint64_t logged = keel_ticket_lsn(tk);
    keel_ticket_release(tk);
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_gt(logged, lsn);
    ck_assert_uint_ge(last, logged); /* sync: acknowledged means on the stream */
    kw_buf rec = {0};
    ck_assert_rc(kr_get(n, logged, &rec), KEEL_OK);
    ck_assert_uint_gt(rec.len, BLOB); /* the transaction, one message */
    kw_buf_free(&rec);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
    kr_close(n);
}
END_TEST

/* The writer hands a batch to the stream before its LMDB commit, so a
 * crash or a failed commit can leave the stream holding a record the disk
 * lacks. It was acknowledged to no one (sync: the disk did not take it;
 * async: neither); a node restarting on the directory takes it from the
 * stream, whole: the world continues from that tick. */
START_TEST(test_stream_ahead_of_disk)
{
    if (!keel_failpoints_compiled())
        return; /* a build without failpoints cannot fail a commit on purpose */
    char dir[4096];
    tu_path(dir, sizeof dir, "ahead");
    keel_component v;
    keel_runtime_desc d = {.workers = 1, .durable.dir = dir,
                           .replication = {.nats = nats_url, .world = "ahead", .mode = KEEL_REPL_SYNC,
                                           .lease_ms = 300, .node = "one"}};
    keel_runtime *rt = spawning_rt(d, &v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, 5);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    uint64_t durable = keel_durable_lsn(rt);
    kr_node *n = connect_world(nats_url, "ahead", "probe");
    kr_reader *r;
    ck_assert_rc(kr_read_begin(n, durable + 1, &r), KEEL_OK);
    ck_assert_rc(keel_failpoints_set("wal.before_commit=eio"), KEEL_OK);
    tu_step_n(rt, 1); /* tick 6: its commit fails, the runtime latches fatal */
    ck_assert_rc(keel_flush(rt), KEEL_EFATAL);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    uint64_t want = keel_world_hash(keel_runtime_world(rt)); /* tick 6, as the tick left it */
    uint64_t seq = 0;
    const void *data;
    size_t len;
    int got = 0;
    for (int i = 0; i < 50 && got == 0; i++) /* the stream has tick 6's record: the writer sent it first */
        got = kr_read_next(r, 100, &seq, &data, &len);
    ck_assert_int_eq(got, 1);
    ck_assert_uint_eq(seq, durable + 1);
    kr_read_end(r);
    ck_assert_rc(keel_runtime_close(rt), KEEL_EFATAL);
    kw_store *st = store_in("ahead");
    ck_assert_uint_eq(wal_last(st), durable); /* the disk did not take it */
    kw_store_close(st);
    rt = spawning_rt(d, &v);
    keel_recovery rec;
    ck_assert_msg(!keel_runtime_recover(rt, &rec), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(rt), 6); /* taken from the stream */
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), want);
    keel_repl_status rs;
    keel_repl_status_get(rt, &rs);
    ck_assert(rs.role == KEEL_ROLE_PRIMARY && rs.epoch == 2);
    tu_step_n(rt, 2);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
    kr_close(n);
}
END_TEST

/* Wait (up to 30 s) until the primary's status satisfies `done`. */
static void wait_status(keel_runtime *rt, bool (*done)(const keel_repl_status *, uint64_t), uint64_t arg,
                        const char *what)
{
    uint64_t until = tu_now_ns() + 30000000000ull;
    keel_repl_status st;
    for (keel_repl_status_get(rt, &st); !done(&st, arg); keel_repl_status_get(rt, &st)) {
        ck_assert_msg(tu_now_ns() < until, "the primary did not %s within 30 s", what);
        usleep(10000);
    }
}

static bool published_to(const keel_repl_status *st, uint64_t lsn)
{
    return st->published_lsn >= lsn;
}

static bool checkpoint_published(const keel_repl_status *st, uint64_t lsn)
{
    return st->checkpoint_lsn >= lsn && st->checkpoint_lsn;
}

static void wal_bounds_of(const char *name, uint64_t *first, uint64_t *last, uint64_t *ckpt_lsn)
{
    kw_store *s = store_in(name);
    wal_bounds(s, first, last);
    *ckpt_lsn = checkpoint_covers(s);
    kw_store_close(s);
}

/* A world "name" of 10 ticks in pdir whose stream keeps nothing before its
 * published checkpoint of tick 5 (a fresh replica must start from it):
 * the primary's hash at tick 10 into *want, its hash at 5 into *at5. */
/* A sync primary's world whose stream was purged to its published
 * checkpoint of tick 5 but `retain` records, *at5 its hash then; then
 * ticks 6..10 (*want). `reopened`: the primary closed after tick 5 and
 * opened again (a new epoch) before the checkpoint, which so covers the
 * EPOCH record after tick 5's commit. */
static void purged_world_retaining(const char *name, int64_t retain, bool reopened, char *pdir, size_t cap,
                                   uint64_t *at5, uint64_t *want)
{
    tu_path(pdir, cap, name);
    keel_component v;
    keel_runtime_desc d = {.workers = 1, .durable.dir = pdir,
                           .replication = {.nats = nats_url, .world = name, .mode = KEEL_REPL_SYNC, .lease_ms = 300,
                                           .retain_records = retain}};
    keel_runtime *p = spawning_rt(d, &v);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 5);
    if (reopened) {
        ck_assert_rc(keel_runtime_close(p), KEEL_OK);
        p = spawning_rt(d, &v);
        ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    }
    ck_assert_rc(keel_checkpoint(p), KEEL_OK);
    wait_status(p, checkpoint_published, 1, "publish its checkpoint");
    *at5 = keel_world_hash(keel_runtime_world(p));
    tu_step_n(p, 5);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    *want = keel_world_hash(keel_runtime_world(p));
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}

static void purged_world(const char *name, char *pdir, size_t cap, uint64_t *at5, uint64_t *want)
{
    purged_world_retaining(name, 1, false, pdir, cap, at5, want);
}

/* Apply the stream up to tick t. */
static void follow_to(keel_runtime *f, uint64_t t)
{
    for (int i = 0; i < 200 && keel_runtime_tick(f) < t; i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), t);
}

/* A fresh replica of a purged stream loads the published checkpoint as
 * the stream delivers it: recovered, it holds the state of the
 * checkpoint's tick; its directory takes the checkpoint in the background
 * (the first poll waits for it) and then the records after it. Reopened,
 * the directory recovers on its own to the same state. */
START_TEST(test_stream_bootstrap)
{
    char pdir[4096], fdir[4096];
    uint64_t at5, want;
    purged_world("sboot", pdir, sizeof pdir, &at5, &want);
    keel_runtime_desc fd = replica_desc("sboot", fdir, sizeof fdir);
    fd.workers = 2;
    keel_component v;
    keel_runtime *f = spawning_rt(fd, &v);
    keel_recovery rec;
    ck_assert_msg(!keel_runtime_recover(f, &rec), "%s", keel_last_error());
    keel_repl_status st;
    keel_repl_status_get(f, &st);
    ck_assert(st.bootstrapped);
    ck_assert_uint_eq(rec.checkpoint_tick, 5);
    ck_assert_uint_eq(keel_runtime_tick(f), 5);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), at5);
    follow_to(f, 10);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    uint64_t first, last, covered;
    wal_bounds_of("sboot-replica", &first, &last, &covered);
    ck_assert_msg(covered && first == covered + 1 && last > covered,
                  "checkpoint at %" PRIu64 ", WAL %" PRIu64 "..%" PRIu64, covered, first, last);
    f = spawning_rt(fd, &v);
    ck_assert_msg(!keel_runtime_recover(f, &rec), "%s", keel_last_error());
    keel_repl_status_get(f, &st);
    ck_assert(!st.bootstrapped);
    ck_assert_uint_eq(rec.checkpoint_tick, 5);
    ck_assert_uint_eq(keel_runtime_tick(f), 10);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
}
END_TEST

/* The directory's copy of a bootstrap checkpoint fails (its commit: EIO):
 * the loaded replica's next poll says so, the runtime latches fatal,
 * nothing reached the directory; opened again, it bootstraps again. */
START_TEST(test_stream_bootstrap_copy_fails)
{
    if (!keel_failpoints_compiled())
        return; /* a build without failpoints cannot fail a commit on purpose */
    char pdir[4096], fdir[4096];
    uint64_t at5, want;
    purged_world("sbfail", pdir, sizeof pdir, &at5, &want);
    keel_runtime_desc fd = replica_desc("sbfail", fdir, sizeof fdir);
    keel_component v;
    keel_runtime *f = spawning_rt(fd, &v);
    ck_assert_rc(keel_failpoints_set("wal.before_commit=eio"), KEEL_OK);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), at5); /* loaded; the copy runs on */
    ck_assert_rc(keel_replica_poll(f, 0, NULL), KEEL_EIO);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    ck_assert_msg(strstr(keel_last_error(), "did not take its bootstrap checkpoint") &&
                      strstr(keel_last_error(), "sbfail-replica"), "%s", keel_last_error());
    ck_assert_rc(keel_runtime_fatal(f), KEEL_EIO);
    ck_assert_rc(keel_replica_poll(f, 0, NULL), KEEL_EFATAL);
    ck_assert_rc(keel_runtime_close(f), KEEL_EFATAL);
    uint64_t first, last, covered;
    wal_bounds_of("sbfail-replica", &first, &last, &covered);
    ck_assert_uint_eq(covered, 0);
    ck_assert_uint_eq(last, 0);
    /* closed before any poll: the close reports it */
    f = spawning_rt(fd, &v);
    ck_assert_rc(keel_failpoints_set("wal.before_commit=eio"), KEEL_OK);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    ck_assert_rc(keel_runtime_close(f), KEEL_EFATAL);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    ck_assert_msg(strstr(keel_last_error(), "did not take its bootstrap checkpoint"), "%s", keel_last_error());
    wal_bounds_of("sbfail-replica", &first, &last, &covered);
    ck_assert_uint_eq(covered, 0);
    ck_assert_uint_eq(last, 0);
    f = spawning_rt(fd, &v);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), at5);
    follow_to(f, 10);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
}
END_TEST

/* A published checkpoint in load order that the replica cannot load as
 * it arrives -- a damaged run of entries; a table list that is no record --
 * fails its recovery with KEEL_ECORRUPT, the directory left empty. */
START_TEST(test_stream_bootstrap_refused)
{
    char pdir[4096], fdir[4096];
    uint64_t at5, want;
    purged_world("sbbad", pdir, sizeof pdir, &at5, &want);
    kw_store *ps = store_in("sbbad");
    kw_rtxn *r;
    const void *meta, *schema;
    size_t mlen, slen;
    ck_assert(!kw_read_begin(ps, &r));
    ck_assert_rc(kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &meta, &mlen), KEEL_OK);
    ck_assert_rc(kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &schema, &slen), KEEL_OK);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    static const unsigned char damaged[] = {3, 0, 0, 0, 'C', 'x'},                        /* a key past the end */
                               junk_tables[] = {1, 0, 0, 0, 'T', 1, 0, 0, 0, 'v'};        /* no record */
    const struct { const void *p; size_t n; const char *says; } bad[] = {
        {damaged, sizeof damaged, "damaged run"}, {junk_tables, sizeof junk_tables, "is unreadable"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t begin = publish_raw(js, "keel.sbbad.ckpt", 1, meta, mlen);
        publish_raw(js, "keel.sbbad.ckpt", 3, schema, slen);
        publish_raw(js, "keel.sbbad.ckpt", 5, bad[i].p, bad[i].n);
        unsigned char end[16];
        kw_buf e = {end, 0, sizeof end};
        ck_assert(!kw_put_u64(&e, begin) && !kw_put_u64(&e, 2));
        publish_raw(js, "keel.sbbad.ckpt", 4, end, sizeof end);
        char name[64];
        snprintf(name, sizeof name, "sbbad-replica%zu", i);
        tu_path(fdir, sizeof fdir, name);
        keel_runtime_desc fd = {.workers = 1, .durable.dir = fdir,
                                .replication = {.nats = nats_url, .world = "sbbad", .role = KEEL_ROLE_FOLLOWER}};
        keel_component v;
        keel_runtime *f = spawning_rt(fd, &v);
        ck_assert_rc(keel_runtime_recover(f, NULL), KEEL_ECORRUPT);
        ck_assert_msg(strstr(keel_last_error(), bad[i].says), "%s", keel_last_error());
        keel_runtime_close(f);
        uint64_t first, last, covered;
        wal_bounds_of(name, &first, &last, &covered);
        ck_assert_uint_eq(covered, 0);
        ck_assert_uint_eq(last, 0);
    }
    kw_read_end(r);
    kw_store_close(ps);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}
END_TEST

/* Publish the checkpoint of directory `dir` as an older publisher did: the
 * snap keys in plain key order ("C" first), BEGIN without an identity. */
static void publish_in_key_order(jsCtx *js, const char *subject, const char *dir)
{
    kw_store *st = store_in(dir);
    kw_rtxn *r;
    const void *meta, *schema, *k, *v;
    size_t mlen, slen, kn, vn;
    ck_assert(!kw_read_begin(st, &r));
    ck_assert_rc(kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &meta, &mlen), KEEL_OK);
    ck_assert_rc(kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &schema, &slen), KEEL_OK);
    uint64_t begin = publish_raw(js, subject, 1, meta, mlen), msgs = 1;
    publish_raw(js, subject, 3, schema, slen);
    kw_walit *it;
    ck_assert_rc(kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it), KEEL_OK);
    kw_buf run = {0};
    int more;
    while ((more = kw_db_next(it, &k, &kn, &v, &vn)) >= 0) {
        if (run.len && (more == 0 || run.len + 8 + kn + vn > 900000)) {
            publish_raw(js, subject, 5, run.p, run.len);
            msgs++;
            run.len = 0;
        }
        if (more == 0)
            break;
        ck_assert(!kw_put_u32(&run, (uint32_t)kn) && !kw_put_bytes(&run, k, kn) && !kw_put_u32(&run, (uint32_t)vn) &&
                  !kw_put_bytes(&run, v, vn));
    }
    ck_assert_int_eq(more, 0);
    kw_wal_iter_end(it);
    kw_buf_free(&run);
    kw_read_end(r);
    kw_store_close(st);
    unsigned char end[16];
    kw_buf e = {end, 0, sizeof end};
    ck_assert(!kw_put_u64(&e, begin) && !kw_put_u64(&e, msgs));
    publish_raw(js, subject, 4, end, sizeof end);
}

/* A new replica that cannot load the published checkpoint as it arrives
 * takes it into its directory first (as one that holds something does),
 * to the same state: one in plain key order (an older publisher's), and
 * one whose schema a component registered since extends (its record
 * follows on the stream). A WAL stream purged past the checkpoint is
 * refused with KEEL_ERANGE. */
START_TEST(test_stream_bootstrap_declined)
{
    char pdir[4096], fdir[4096];
    uint64_t at5, want;
    purged_world("sbold", pdir, sizeof pdir, &at5, &want);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    publish_in_key_order(js, "keel.sbold.ckpt", "sbold");
    keel_component v;
    keel_runtime *f = spawning_rt(replica_desc("sbold", fdir, sizeof fdir), &v);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    keel_repl_status st;
    keel_repl_status_get(f, &st);
    ck_assert(st.bootstrapped);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want); /* taken in step: the records after it too */
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    /* the primary again with one more component: a schema record after the checkpoint */
    keel_runtime_desc pd = {.workers = 1, .durable.dir = pdir,
                            .replication = {.nats = nats_url, .world = "sbold", .mode = KEEL_REPL_SYNC,
                                            .lease_ms = 300, .retain_records = 1}};
    keel_runtime *p = spawning_rt_w(pd, &v, true);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 3);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    want = keel_world_hash(keel_runtime_world(p));
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    keel_runtime_desc fd = replica_desc("sbold", fdir, sizeof fdir);
    snprintf(fdir + strlen(fdir), sizeof fdir - strlen(fdir), "2");
    f = spawning_rt_w(fd, &v, true);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    keel_repl_status_get(f, &st);
    ck_assert(st.bootstrapped);
    ck_assert_uint_eq(keel_runtime_tick(f), 13);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), want);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    /* the WAL stream purged by hand past the checkpoint's covered LSN */
    kr_node *n = connect_world(nats_url, "sbold", "probe");
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    kr_close(n);
    jsOptions po;
    jsOptions_Init(&po);
    po.Stream.Purge.Sequence = last; /* keeps only the last record */
    ck_assert_int_eq(js_PurgeStream(js, "KEEL_sbold", &po, NULL), NATS_OK);
    fd = replica_desc("sbold", fdir, sizeof fdir);
    snprintf(fdir + strlen(fdir), sizeof fdir - strlen(fdir), "3");
    f = spawning_rt_w(fd, &v, true);
    ck_assert_rc(keel_runtime_recover(f, NULL), KEEL_ERANGE);
    ck_assert_msg(strstr(keel_last_error(), "KEEL_sbold starts at"), "%s", keel_last_error());
    keel_runtime_close(f);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}
END_TEST

static bool degraded(const keel_repl_status *st, uint64_t errors)
{
    return st->degraded && st->errors >= errors;
}

/* A tick record over the server's max_payload (a changed row of a
 * component over 1 MiB: records are not split over messages) cannot be
 * published: the async primary runs on, its publisher retries and reports
 * `degraded`, nothing from that record on reaches the stream, and its
 * close returns. */
#define HUGE_ROW (1200u * 1000u)
static unsigned char huge_value[HUGE_ROW];

static int huge_spawn(keel_ctx *ctx, void *user)
{
    const keel_component *c = user;
    if (keel_ctx_tick(ctx) != 3)
        return 0;
    return keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){*c, huge_value}, 1) ? -1 : 0;
}

START_TEST(test_tick_record_over_max_payload_degrades)
{
    static const keel_field f[] = {{.name = "b", .type = KEEL_BYTES, .offset = 0, .count = HUGE_ROW}};
    uint64_t rng = 7; /* does not compress */
    for (size_t i = 0; i < sizeof huge_value; i++)
        huge_value[i] = (unsigned char)tu_rng_next(&rng);
    char dir[4096];
    tu_path(dir, sizeof dir, "huge");
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .durable.dir = dir,
                                                     .replication = {.nats = nats_url, .world = "huge",
                                                                     .mode = KEEL_REPL_ASYNC, .lease_ms = 300}});
    keel_component c = tu_reg(keel_runtime_world(rt), "huge", HUGE_ROW, KEEL_VERSIONED, f, 1);
    keel_schedule *s;
    ck_assert_rc(keel_schedule_create(rt, &s), KEEL_OK);
    ck_assert_rc(keel_schedule_add_system(s, &(keel_system_desc){.name = "spawn", .kind = KEEL_SYSTEM_CALLBACK,
                                                                 .run = huge_spawn, .user = &c}, NULL), KEEL_OK);
    tu_install(rt, s);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    tu_step_n(rt, 2);
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    uint64_t before = keel_durable_lsn(rt);
    wait_status(rt, published_to, before, "publish its first ticks");
    tu_step_n(rt, 2); /* tick 3 spawns the 1.2 MB row */
    ck_assert_rc(keel_flush(rt), KEEL_OK);
    wait_status(rt, degraded, 2, "report degraded after two failed sends");
    tu_step_n(rt, 1);
    ck_assert_uint_eq(keel_runtime_tick(rt), 5); /* it runs on */
    keel_repl_status st;
    keel_repl_status_get(rt, &st);
    ck_assert(st.published_lsn >= before && st.published_lsn < keel_durable_lsn(rt));
    kr_node *n = connect_world(nats_url, "huge", "probe");
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    ck_assert_uint_eq(last, st.published_lsn); /* the huge record and what follows it: not on the stream */
    kr_close(n);
    keel_runtime_close(rt); /* returns once its drain gives up */
}
END_TEST

/* An async primary checkpoints while the stream is down: its checkpoints
 * delete only the WAL records the stream acknowledged (the ones after stay
 * for the publisher); it reopens once NATS is back, its directory holding a
 * checkpoint of records the stream never got and no WAL before it: it drops
 * them and restarts from the stream -- from the published checkpoint, or,
 * when none was published, from LSN 1 -- and ends on the state the stream
 * holds. */
static void rejoin_case(bool publish_first)
{
    char conf[4096], dir[4096], name[32];
    snprintf(name, sizeof name, "trim-%d", publish_first);
    tu_path(dir, sizeof dir, name);
    int port = nats_conf(publish_first ? "js-published" : "js-none", conf, sizeof conf);
    pid_t nats = nats_start(conf, port, true);
    keel_component v;
    keel_runtime_desc d = {.workers = 1, .durable.dir = dir,
                           .replication = {.nats = nats_url, .world = name, .mode = KEEL_REPL_ASYNC,
                                           .lease_ms = 300, .node = "one"}};
    keel_runtime *p = spawning_rt(d, &v);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 5);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    wait_status(p, published_to, keel_durable_lsn(p), "publish its first ticks");
    if (publish_first) { /* taken with everything on the stream: it deletes the WAL it covers */
        ck_assert_rc(keel_checkpoint(p), KEEL_OK);
        wait_status(p, checkpoint_published, 1, "publish its checkpoint");
    }
    tu_step_n(p, 5);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    uint64_t on_stream = keel_durable_lsn(p), want = keel_world_hash(keel_runtime_world(p));
    wait_status(p, published_to, on_stream, "publish tick 10");
    /* the stream goes away; ten more ticks and a checkpoint stay on this disk */
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
    tu_step_n(p, 10);
    ck_assert_rc(keel_checkpoint(p), KEEL_OK);
    keel_runtime_close(p);
    uint64_t first, last, covered;
    wal_bounds_of(name, &first, &last, &covered);
    ck_assert_msg(covered > on_stream && first == on_stream + 1 && last >= covered,
                  "checkpoint at %" PRIu64 ", WAL %" PRIu64 "..%" PRIu64 ", the stream holds up to %" PRIu64, covered,
                  first, last, on_stream);
    /* NATS back: the reopened primary restarts from the stream at tick 10 */
    nats = nats_start(conf, port, true);
    p = spawning_rt(d, &v);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    keel_repl_status st;
    keel_repl_status_get(p, &st);
    ck_assert_uint_eq(st.discarded, last - on_stream);
    ck_assert(st.bootstrapped && st.epoch == 2);
    ck_assert_uint_eq(keel_runtime_tick(p), 10);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(p)), want);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
}

START_TEST(test_rejoin_trimmed_directory)
{
    rejoin_case(false);
    rejoin_case(true);
}
END_TEST

/* A follower whose polls cannot reach the stream (its nats-server gone)
 * reports it: degraded, and an error counted per failed poll, in
 * keel_repl_status and the metrics; a poll that gets through once the
 * server is back clears degraded, and the count stays. */
START_TEST(test_replica_degraded_while_stream_away)
{
    char conf[4096], pdir[4096], fdir[4096];
    tu_path(pdir, sizeof pdir, "away-primary");
    tu_path(fdir, sizeof fdir, "away-follower");
    int port = nats_conf("js-away", conf, sizeof conf);
    pid_t nats = nats_start(conf, port, true);
    keel_component v;
    keel_runtime *p = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = pdir,
                                                      .replication = {.nats = nats_url, .world = "away",
                                                                      .mode = KEEL_REPL_SYNC, .lease_ms = 300}},
                                  &v);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 5);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    keel_runtime *f = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = fdir,
                                                      .replication = {.nats = nats_url, .world = "away",
                                                                      .role = KEEL_ROLE_FOLLOWER}},
                                  &v);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    ck_assert_rc(keel_replica_poll(f, 0, NULL), KEEL_OK);
    keel_repl_status st;
    keel_repl_status_get(f, &st);
    ck_assert(!st.degraded && st.errors == 0);
    ck_assert_uint_eq(metric_u64(f, "keel_repl_degraded"), 0);
    /* the server goes: once the client noticed, every poll counts an error (returning KEEL_EUNAVAILABLE, or 0
       with nothing copied while the client reconnects in the background) */
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
    int rc = KEEL_OK;
    for (int i = 0; i < 600 && !st.degraded; i++) {
        rc = keel_replica_poll(f, 100, NULL);
        ck_assert_msg(rc == KEEL_OK || rc == KEEL_EUNAVAILABLE, "%s: %s", keel_strerror(rc), keel_last_error());
        keel_repl_status_get(f, &st);
    }
    ck_assert(st.degraded);
    ck_assert_uint_eq(st.errors, 1);
    ck_assert_uint_eq(metric_u64(f, "keel_repl_degraded"), 1);
    ck_assert_uint_eq(metric_u64(f, "keel_repl_errors_total"), 1);
    rc = keel_replica_poll(f, 0, NULL);
    ck_assert_msg(rc == KEEL_OK || rc == KEEL_EUNAVAILABLE, "%s: %s", keel_strerror(rc), keel_last_error());
    keel_repl_status_get(f, &st);
    ck_assert(st.degraded);
    ck_assert_uint_eq(st.errors, 2);
    ck_assert_uint_eq(keel_runtime_tick(f), 5);
    /* back: the first poll that gets through clears degraded; the errors stay counted */
    nats = nats_start(conf, port, true);
    uint64_t failed = 2;
    for (int i = 0; i < 600 && st.degraded; i++) {
        rc = keel_replica_poll(f, 100, NULL);
        ck_assert_msg(rc == KEEL_OK || rc == KEEL_EUNAVAILABLE, "%s: %s", keel_strerror(rc), keel_last_error());
        keel_repl_status_get(f, &st);
        failed += st.degraded;
        ck_assert_uint_eq(st.errors, failed);
    }
    ck_assert_msg(rc == KEEL_OK, "%s: %s", keel_strerror(rc), keel_last_error());
    ck_assert(!st.degraded);
    ck_assert_uint_eq(st.errors, failed);
    ck_assert_uint_eq(metric_u64(f, "keel_repl_degraded"), 0);
    ck_assert_uint_eq(metric_u64(f, "keel_repl_errors_total"), failed);
    ck_assert_uint_eq(keel_runtime_tick(f), 5);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
}
END_TEST

/* The runtime's refusals, before anything connects. */
START_TEST(test_runtime_refusals)
{
    keel_runtime *rt = NULL;
    keel_runtime_desc d = {.replication = {.nats = "nats://127.0.0.1:1", .world = "w"}};
    ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_EINVAL); /* no data directory */
    char dir[4096];
    tu_path(dir, sizeof dir, "rt");
    d.durable.dir = dir;
    d.replication.world = NULL;
    ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_EINVAL);
    /* the world's name and the servers' syntax, before anything connects or opens */
    const struct { const char *nats, *world, *culprit; } bad[] = {
        {"nats://127.0.0.1:1", "two words", "the world's name 'two words'"},
        {"nats://127.0.0.1:1", "", "the world's name ''"},
        {"http://127.0.0.1:1", "w", "'http://127.0.0.1:1' is not nats://HOST:PORT"},
        {"nats://127.0.0.1:1,nats://", "w", "'nats://' is not nats://HOST:PORT"},
        {"", "w", "is empty or too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        d.replication.nats = bad[i].nats;
        d.replication.world = bad[i].world;
        rt = NULL;
        ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_EINVAL);
        ck_assert_ptr_null(rt);
        ck_assert_msg(strstr(keel_last_error(), bad[i].culprit), "%s", keel_last_error());
    }
    ck_assert_int_ne(access(dir, F_OK), 0);
    d.replication.nats = "nats://127.0.0.1:1";
    rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    ck_assert_rc(keel_replica_poll(rt, 0, NULL), KEEL_EINVAL);
    keel_repl_status st;
    keel_repl_status_get(rt, &st);
    ck_assert_uint_eq(st.epoch + st.stream_lsn, 0);
    keel_runtime_close(rt);
    /* a replica that cannot reach NATS opens nothing */
    d.replication = (keel_replication_desc){.nats = "nats://127.0.0.1:1", .world = "w", .role = KEEL_ROLE_FOLLOWER};
    ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_OK);
    ck_assert_rc(keel_runtime_recover(rt, NULL), KEEL_EUNAVAILABLE);
    keel_runtime_close(rt);
    ck_assert_str_eq(keel_repl_role_name(KEEL_ROLE_STANDBY), "standby");
    ck_assert_str_eq(keel_repl_mode_name(KEEL_REPL_SYNC), "sync");
}
END_TEST

/* wal/unreplicated_stream_dir events seen. */
typedef struct warn_log {
    int unreplicated;
} warn_log;

static void on_log(const keel_log_event *ev, void *user)
{
    warn_log *w = user;
    if (!strcmp(ev->subsystem, "wal") && !strcmp(ev->event, "unreplicated_stream_dir"))
        w->unreplicated++;
}

/* Mark the directory `name` as stream's (NULL: remove the mark, as keel-wal
 * detach does), then open it without replication, run 3 ticks and take a
 * checkpoint: *first is its WAL's first LSN afterwards, *covered what the
 * checkpoint covers, *warned how often the open logged
 * wal/unreplicated_stream_dir. */
static void checkpoint_marked(const char *name, const char *stream, uint64_t *first, uint64_t *covered, int *warned)
{
    kw_store *s = store_in(name);
    ck_assert_rc(kw_store_write(s, fill_marked, (void *)stream), KEEL_OK);
    kw_store_close(s);
    char dir[4096];
    tu_path(dir, sizeof dir, name);
    warn_log w = {0};
    keel_log_set(on_log, &w, KEEL_LOG_WARN);
    keel_component v;
    keel_runtime *rt = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dir}, &v);
    ck_assert_msg(!keel_runtime_recover(rt, NULL), "%s", keel_last_error());
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
    tu_step_n(rt, 3);
    ck_assert_rc(keel_checkpoint(rt), KEEL_OK);
    ck_assert_rc(keel_runtime_close(rt), KEEL_OK);
    uint64_t last;
    s = store_in(name);
    wal_bounds(s, first, &last);
    *covered = checkpoint_covers(s);
    kw_store_close(s);
    ck_assert_uint_gt(last, *covered);
    *warned = w.unreplicated;
}

/* A replicated world's directory (marked as its stream's) opened without
 * replication cannot know what the stream acknowledged: its checkpoints
 * keep the whole WAL, and the open logs wal/unreplicated_stream_dir.
 * Detached (the mark removed), its checkpoints delete the WAL they cover. */
START_TEST(test_marked_directory_without_replication)
{
    uint64_t first, covered;
    int warned;
    checkpoint_marked("marked", NULL, &first, &covered, &warned); /* a local world: 3 ticks, a checkpoint */
    ck_assert_uint_eq(first, covered + 1);
    ck_assert_int_eq(warned, 0);
    uint64_t local_covered = covered;
    checkpoint_marked("marked", "KEEL_elsewhere", &first, &covered, &warned);
    ck_assert_uint_gt(covered, local_covered);
    ck_assert_uint_eq(first, local_covered + 1); /* nothing deleted at this checkpoint */
    ck_assert_int_eq(warned, 1);
    checkpoint_marked("marked", NULL, &first, &covered, &warned);
    ck_assert_uint_eq(first, covered + 1);
    ck_assert_int_eq(warned, 0);
}
END_TEST

/* Freezes a nats-server (SIGSTOP) on its first call: a seed's progress. */
typedef struct seed_freeze {
    pid_t nats;
    uint32_t calls;
} seed_freeze;

static int freeze_once(void *arg)
{
    seed_freeze *f = arg;
    if (!f->calls++)
        tu_stop_process(f->nats);
    return KEEL_OK;
}

static bool stream_has(kr_node *n, uint64_t want)
{
    uint64_t first, last;
    ck_assert_rc(kr_bounds(n, &first, &last), KEEL_OK);
    return last >= want;
}

/* A seed whose stream stops answering (its server frozen before the first
 * record goes out) stops with KEEL_EUNAVAILABLE -- its publishes time out
 * (the node's timeout, 1 s here), and the stream's state, asked for to see
 * what it took, cannot be read -- its progress (a primary's lease renewal)
 * running every 100 ms while it waited for them; the
 * seeding mark stays, so once the server is back the next sync finds the
 * seed ended. */
START_TEST(test_seed_stalls)
{
    char conf[4096];
    int port = nats_conf("js-stall", conf, sizeof conf);
    pid_t nats = nats_start(conf, port, true);
    kr_node *n = NULL;
    uint64_t until = tu_now_ns() + 30000000000ull;
    int rc;
    while ((rc = kr_connect(&(kr_desc){.urls = nats_url, .world = "stall", .node = "a", .create = true,
                                       .timeout_ms = 1000}, &n)) == KEEL_EUNAVAILABLE && tu_now_ns() < until)
        usleep(50000);
    ck_assert_msg(!rc, "kr_connect: %s", keel_last_error());
    kw_store *s = local_world("stall-local", 5);
    kr_sync_info si;
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert(si.seed);
    seed_freeze f = {.nats = nats};
    ck_assert_rc(kr_seed_stream(n, s, 1, 5, freeze_once, &f), KEEL_EUNAVAILABLE);
    ck_assert_msg(strstr(keel_last_error(), "KEEL_stall"), "%s", keel_last_error());
    ck_assert_uint_gt(f.calls, 5); /* once before each record, and while it waited */
    ck_assert(meta_has(s, KW_META_SEEDING));
    ck_assert_int_eq(kill(nats, SIGCONT), 0);
    until = tu_now_ns() + 30000000000ull; /* the records sent before it froze are stored once it runs */
    while (!stream_has(n, 5)) {
        ck_assert_msg(tu_now_ns() < until, "the stream did not take the records within 30 s");
        usleep(10000);
    }
    ck_assert_msg(!kr_sync_store(n, s, 0, &si), "%s", keel_last_error());
    ck_assert(!si.seed && !meta_has(s, KW_META_SEEDING));
    assert_stream_holds(n, s, 1, 5);
    kw_store_close(s);
    kr_close(n);
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
}
END_TEST

/* A NATS server without JetStream is refused with KEEL_EUNAVAILABLE saying
 * so (not retried as if it were down), by the library, whether it may
 * create the stream or not, and by a replica's runtime. */
START_TEST(test_server_without_jetstream)
{
    char conf[4096], dir[4096], text[64];
    tu_path(conf, sizeof conf, "plain.conf");
    int port = free_port();
    int len = snprintf(text, sizeof text, "listen: 127.0.0.1:%d\n", port);
    tu_write_file(conf, text, (size_t)len);
    snprintf(nats_url, sizeof nats_url, "nats://127.0.0.1:%d", port);
    pid_t nats = nats_start(conf, port, true);
    for (int create = 0; create < 2; create++) {
        kr_node *n = NULL;
        ck_assert_rc(kr_connect(&(kr_desc){.urls = nats_url, .world = "w", .create = create}, &n), KEEL_EUNAVAILABLE);
        ck_assert_ptr_null(n);
        ck_assert_msg(strstr(keel_last_error(), "offers no JetStream"), "%s", keel_last_error());
    }
    tu_path(dir, sizeof dir, "plain-dir");
    keel_runtime *rt = NULL;
    keel_runtime_desc d = {.durable.dir = dir,
                           .replication = {.nats = nats_url, .world = "w", .role = KEEL_ROLE_FOLLOWER}};
    ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_OK);
    ck_assert_rc(keel_runtime_recover(rt, NULL), KEEL_EUNAVAILABLE);
    ck_assert_msg(strstr(keel_last_error(), "offers no JetStream"), "%s", keel_last_error());
    keel_runtime_close(rt);
    kill(nats, SIGTERM);
    ck_assert_int_eq(waitpid(nats, NULL, 0), nats);
}
END_TEST

/* A replica whose poll applies some units and then fails: the units before
 * the failing one stay applied (its tick says so) and the next poll starts
 * after them; a unit that failed after changing the world latches the
 * runtime (it can be neither undone nor replayed on top of itself). The
 * failure: the replica's world holds at most 5 entities, the primary spawns
 * two a tick, so tick 3's second spawn is refused (KEEL_ENOSPC) after its
 * first was applied. */
START_TEST(test_replica_unit_fails_midway)
{
    char pdir[4096], fdir[4096];
    tu_path(pdir, sizeof pdir, "midway-primary");
    keel_component pv, fv;
    keel_runtime *p = spawner_rt(sync_primary_desc(pdir, "midway"), &pv, false, spawn_two_sys);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    keel_runtime_desc fd = replica_desc("midway", fdir, sizeof fdir);
    fd.world.max_entities = 5;
    keel_runtime *f = spawning_rt(fd, &fv);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    tu_step_n(p, 3);
    ck_assert_rc(keel_flush(p), KEEL_OK); /* sync: the stream holds the three ticks */
    int rc = KEEL_OK;
    for (int i = 0; i < 300 && rc == KEEL_OK; i++)
        rc = keel_replica_poll(f, 100, NULL);
    ck_assert_msg(rc == KEEL_ENOSPC, "%s: %s", keel_strerror(rc), keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), 2); /* ticks 1 and 2 applied */
    ck_assert_rc(keel_runtime_fatal(f), KEEL_ENOSPC); /* tick 3's first spawn was applied */
    ck_assert_rc(keel_replica_poll(f, 0, NULL), KEEL_EFATAL);
    ck_assert_uint_eq(keel_runtime_tick(f), 2);
    ck_assert_rc(keel_runtime_close(f), KEEL_EFATAL);
    /* reopened with room for the world, the replica replays its directory and follows on to the primary */
    fd.world.max_entities = 0;
    f = spawning_rt(fd, &fv);
    ck_assert_msg(!keel_runtime_recover(f, NULL), "%s", keel_last_error());
    for (int i = 0; i < 300 && keel_runtime_tick(f) < 3; i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), 3);
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(f)), 6);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), keel_world_hash(keel_runtime_world(p)));
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A poll whose copy into the directory fails (its commit: EIO, once)
 * writes nothing and returns the error; the next polls read those
 * messages again (the reader was rewound to the directory's next LSN) and
 * follow on to the primary's tick and hash, with no hole in the WAL. */
START_TEST(test_replica_copy_fails_once)
{
    if (!keel_failpoints_compiled())
        return; /* a build without failpoints cannot fail a commit on purpose */
    keel_component pv, fv;
    keel_runtime *p, *f;
    primary_with_replica("copyfail", &p, &pv, &f, &fv);
    uint64_t opened = keel_runtime_tick(f);
    tu_step_n(p, 3);
    ck_assert_rc(keel_flush(p), KEEL_OK); /* sync: the stream holds the three ticks; the primary's writer idles */
    ck_assert_rc(keel_failpoints_set("wal.before_commit=eio@1"), KEEL_OK);
    int rc = KEEL_OK;
    for (int i = 0; i < 300 && rc == KEEL_OK && keel_runtime_tick(f) == opened; i++)
        rc = keel_replica_poll(f, 100, NULL);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    ck_assert_msg(rc == KEEL_EIO, "%s: %s", keel_strerror(rc), keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), opened);
    ck_assert_rc(keel_runtime_fatal(f), KEEL_OK); /* nothing was applied: nothing to latch */
    for (int i = 0; i < 300 && keel_runtime_tick(f) < keel_runtime_tick(p); i++)
        ck_assert_msg(!keel_replica_poll(f, 100, NULL), "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(f), keel_runtime_tick(p));
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(f)), keel_world_hash(keel_runtime_world(p)));
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A primary started on a directory another runtime holds is refused
 * (KEEL_EBUSY, the directory lock) before it makes anything on NATS: no
 * stream of its world exists afterwards. A read replica refused on a new
 * directory (a stream of junk) leaves no directory behind. */
START_TEST(test_held_directory_makes_nothing)
{
    kr_node *junk = connect_world(nats_url, "junkrt", "a");
    ck_assert_rc(kr_publish(junk, 1, 1, "not a record", 12), KEEL_OK);
    kr_close(junk);
    char rdir[4096];
    keel_component rv;
    keel_runtime *rt = spawning_rt(replica_desc("junkrt", rdir, sizeof rdir), &rv);
    ck_assert_rc(keel_runtime_recover(rt, NULL), KEEL_ECORRUPT);
    keel_runtime_close(rt);
    ck_assert_int_ne(access(rdir, F_OK), 0);

    char dir[4096];
    keel_component v, v2;
    tu_path(dir, sizeof dir, "held");
    keel_runtime *holder = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dir}, &v);
    ck_assert_msg(!keel_runtime_recover(holder, NULL), "%s", keel_last_error());
    tu_step_n(holder, 1);
    keel_runtime *p = sync_primary_rt(dir, "heldworld", &v2);
    ck_assert_rc(keel_runtime_recover(p, NULL), KEEL_EBUSY);
    keel_runtime_close(p);
    kr_node *n = NULL;
    ck_assert_rc(kr_connect(&(kr_desc){.urls = nats_url, .world = "heldworld", .node = "look"}, &n), KEEL_ENOENT);
    /* the refused open removed nothing of the holder's: it goes on, and its world reopens at its tick */
    tu_step_n(holder, 2);
    ck_assert_rc(keel_flush(holder), KEEL_OK);
    uint64_t hash = keel_world_hash(keel_runtime_world(holder));
    ck_assert_rc(keel_runtime_close(holder), KEEL_OK);
    assert_opens_at(dir, 3, hash);
}
END_TEST

/* keel-wal restore --to-tick T of a stream whose schema grew after T: DEST
 * stores the schema of tick T (the last schema record it keeps), passes
 * verify, and opens with the components registered at T. */
START_TEST(test_restore_to_tick_keeps_its_schema)
{
    char pdir[4096], dest[4096], addr[128];
    keel_component pv, pv2;
    tu_path(pdir, sizeof pdir, "rs-primary");
    keel_runtime *p = sync_primary_at(pdir, "rschema", &pv, 3);
    uint64_t hash3 = keel_world_hash(keel_runtime_world(p));
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    p = spawning_rt_w(sync_primary_desc(pdir, "rschema"), &pv2, true); /* "w" grows the schema after tick 3 */
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 2);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    snprintf(addr, sizeof addr, "%s/rschema", nats_url);
    tu_path(dest, sizeof dest, "rs-restored");
    tu_run run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"restore", addr, dest, "--to-tick", "3", NULL});
    ck_assert_msg(run.status == 0, "keel-wal restore: status %d, stderr %s", run.status, run.err);
    tu_run_free(&run);
    run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", dest, NULL});
    ck_assert_msg(run.status == 0, "keel-wal verify: status %d, stdout %s", run.status, run.out);
    tu_run_free(&run);
    assert_opens_at(dest, 3, hash3);
}
END_TEST

/* keel-wal tail -f -n `lines` on `what` (a stream's name, or a directory's
 * path when it holds a '/') with TMPDIR=tmp, stdout on a pipe, stderr to
 * errpath (NULL: /dev/null), SIGHUP ignored when asked: its pid; the pipe's
 * read end into *out. */
typedef struct tail_env {
    const char *tmp;
    bool ignore_hup;
} tail_env;

static void tail_child(void *arg)
{
    const tail_env *e = arg;
    if (setenv("TMPDIR", e->tmp, 1))
        _exit(126);
    if (e->ignore_hup)
        signal(SIGHUP, SIG_IGN); /* as nohup leaves it across exec */
}

static pid_t spawn_tail_f(const char *what, const char *lines, const char *tmp, const char *errpath, bool ignore_hup,
                          FILE **out)
{
    char addr[4200];
    if (strchr(what, '/'))
        snprintf(addr, sizeof addr, "%s", what);
    else
        snprintf(addr, sizeof addr, "%s/%s", nats_url, what);
    tail_env env = {tmp, ignore_hup};
    return tu_spawn_reader(KEEL_WAL_BIN, (const char *const[]){"tail", addr, "-f", "-n", lines, "--interval", "20", NULL},
                           errpath, tail_child, &env, out);
}

/* keel-wal restore of "name" into a fresh directory; --to-tick when tick
 * is given (non-NULL): its exit status, stderr into err (when not NULL),
 * the new directory's path into dest. */
static int restore_into(const char *name, const char *tick, char *dest, size_t cap, char *err, size_t errcap)
{
    static unsigned made;
    char addr[128], leaf[160];
    snprintf(addr, sizeof addr, "%s/%s", nats_url, name);
    snprintf(leaf, sizeof leaf, "%s-restored-%u", name, made++);
    tu_path(dest, cap, leaf);
    tu_run run = tu_run_argv(KEEL_WAL_BIN, tick ? (const char *const[]){"restore", addr, dest, "--to-tick", tick, NULL}
                                                : (const char *const[]){"restore", addr, dest, NULL});
    int status = run.status;
    if (err)
        snprintf(err, errcap, "%s", run.err);
    tu_run_free(&run);
    return status;
}

static bool has_data_file(const char *dir)
{
    char mdb[4200];
    snprintf(mdb, sizeof mdb, "%s/data.mdb", dir);
    return access(mdb, F_OK) == 0;
}

/* keel-wal restore of a stream purged up to its published checkpoint of
 * tick 5: --to-tick 5 restores the checkpoint alone (no record of tick 5
 * is left on the stream), also one published in plain key order, a tick
 * before it is refused naming the earliest tick the stream can give, a
 * tick after its end is refused naming its last; the whole stream restores
 * to tick 10. A refusal writes nothing. Once the schema grew after the
 * checkpoint, ticks 5 and 10 still get the checkpoint's schema. keel-wal
 * replay of tick 3 on the stream names the checkpoint where a copy of the
 * stream starts; tail -f on the checkpoint-only restore reports no gap. */
START_TEST(test_restore_purged_stream)
{
    char pdir[4096], dest[4096], err[4096];
    uint64_t at5, want;
    purged_world("rpurge", pdir, sizeof pdir, &at5, &want);
    ck_assert_msg(restore_into("rpurge", "5", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 5, at5);
    /* tail -f on it (a checkpoint, an empty WAL) goes on after the checkpoint without a word of a gap */
    char tmp[4096], errpath[4200], line[4096];
    tu_path(tmp, sizeof tmp, "rpurge-tmp");
    ck_assert_int_eq(mkdir(tmp, 0700), 0);
    snprintf(errpath, sizeof errpath, "%s/tail.err", tmp);
    FILE *out;
    pid_t pid = spawn_tail_f(dest, "0", tmp, errpath, false, &out);
    tu_wait_nanosleep(pid, "keel-wal tail -f"); /* between its polls, once it read where the WAL ends */
    keel_component dv;
    keel_runtime *d = spawning_rt((keel_runtime_desc){.workers = 1, .durable.dir = dest}, &dv);
    ck_assert_msg(!keel_runtime_recover(d, NULL), "%s", keel_last_error());
    tu_step_n(d, 1);
    ck_assert_rc(keel_flush(d), KEEL_OK);
    bool seen6 = false;
    while (!seen6 && fgets(line, sizeof line, out))
        seen6 = strstr(line, " tick=6 kind=tick_commit ") != NULL;
    ck_assert(seen6);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(tu_wait(pid), 0);
    fclose(out);
    ck_assert_rc(keel_runtime_close(d), KEEL_OK);
    FILE *ef = fopen(errpath, "r");
    ck_assert_ptr_nonnull(ef);
    size_t got = fread(line, 1, sizeof line - 1, ef);
    line[got] = 0;
    fclose(ef);
    ck_assert_msg(!strstr(line, "went before"), "%s", line);
    ck_assert_int_eq(restore_into("rpurge", "4", dest, sizeof dest, err, sizeof err), 2);
    ck_assert_msg(strstr(err, "tick 4 is before") && strstr(err, "checkpoint of tick 5"), "%s", err);
    ck_assert(!has_data_file(dest));
    ck_assert_int_eq(restore_into("rpurge", "11", dest, sizeof dest, err, sizeof err), 2);
    ck_assert_msg(strstr(err, "no commit of tick 11") && strstr(err, "ends at tick 10"), "%s", err);
    ck_assert(!has_data_file(dest));
    ck_assert_msg(restore_into("rpurge", NULL, dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 10, want);
    /* replay on the stream: a tick before its published checkpoint is gone with the purge, which it says */
    char addr[128];
    snprintf(addr, sizeof addr, "%s/rpurge", nats_url);
    tu_run run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"replay", addr, "--to-tick", "3", NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "tick 3 is before the stream's published checkpoint of tick 5, "
                                                     "the oldest state the purged stream keeps (no older state can be "
                                                     "rebuilt from it). The earliest tick replay can rebuild is 5"),
                  "status %d: %s", run.status, run.err);
    tu_run_free(&run);
    run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"replay", addr, "--to-tick", "5", NULL});
    ck_assert_msg(run.status == 0, "status %d: %s", run.status, run.err);
    tu_run_free(&run);
    /* the same checkpoint published again as an older publisher did (in plain key order) */
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    publish_in_key_order(js, "keel.rpurge.ckpt", "rpurge");
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    ck_assert_msg(restore_into("rpurge", "5", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 5, at5);
    /* the world's schema grows after the checkpoint ("w"): tick 5, and tick 10 (no schema record between
       the checkpoint and it), still get the checkpoint's schema */
    keel_runtime_desc pd = sync_primary_desc(pdir, "rpurge");
    pd.replication.retain_records = 1;
    keel_component v;
    keel_runtime *p = spawning_rt_w(pd, &v, true);
    ck_assert_msg(!keel_runtime_recover(p, NULL), "%s", keel_last_error());
    tu_step_n(p, 2);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    ck_assert_msg(restore_into("rpurge", "5", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 5, at5);
    ck_assert_msg(restore_into("rpurge", "10", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 10, want);
}
END_TEST

/* A copy of a stream purged to its published checkpoint holds the records
 * the stream retains before it, from their first whole unit (after the
 * first tick commit among them), byte for byte in its WAL: keel-wal verify
 * passes on the stream, restore keeps them (DEST opens at the last tick),
 * --to-tick at the checkpoint's tick opens there, and an earlier tick is
 * refused by restore and replay though its records are in the copy: no
 * state before the checkpoint's is kept. A message deleted from among
 * them, also the commit before their first whole unit, is a gap keel-wal
 * names. */
START_TEST(test_stream_copy_keeps_retained)
{
    char pdir[4096], dest[4096], err[4096];
    uint64_t at5, want;
    purged_world_retaining("rkeep", 12, false, pdir, sizeof pdir, &at5, &want);
    ck_assert_msg(restore_into("rkeep", NULL, dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    kr_node *n = connect_world(nats_url, "rkeep", "probe");
    uint64_t sfirst, slast, wfirst, wlast;
    ck_assert_rc(kr_bounds(n, &sfirst, &slast), KEEL_OK);
    kw_store *s;
    ck_assert_msg(!kw_store_open(dest, &(kw_store_desc){0}, &s), "%s", keel_last_error());
    wal_bounds(s, &wfirst, &wlast);
    uint64_t covered = checkpoint_covers(s);
    ck_assert_msg(sfirst > 1 && sfirst < wfirst && wfirst <= covered && wlast == slast,
                  "stream %" PRIu64 "..%" PRIu64 ", copy %" PRIu64 "..%" PRIu64 ", checkpoint covers %" PRIu64, sfirst,
                  slast, wfirst, wlast, covered);
    kw_buf msg = {0};
    for (uint64_t lsn = sfirst; lsn < wfirst; lsn++) { /* the first whole unit starts after the first commit */
        ck_assert_rc(kr_get(n, lsn, &msg), KEEL_OK);
        ck_assert_int_eq(kw_record_peek_kind(msg.p, msg.len) == KW_KIND_TICK_COMMIT, lsn + 1 == wfirst);
    }
    kw_buf_free(&msg);
    assert_same_records(n, s, wfirst, slast);
    kw_store_close(s);
    kr_close(n);
    assert_opens_at(dest, 10, want);
    char addr[128];
    snprintf(addr, sizeof addr, "%s/rkeep", nats_url);
    tu_run run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", addr, NULL});
    ck_assert_msg(run.status == 0, "verify: status %d: %s", run.status, run.err);
    tu_run_free(&run);
    ck_assert_int_eq(restore_into("rkeep", "4", dest, sizeof dest, err, sizeof err), 2);
    ck_assert_msg(strstr(err, "tick 4 is before") && strstr(err, "checkpoint of tick 5"), "%s", err);
    ck_assert(!has_data_file(dest));
    ck_assert_msg(restore_into("rkeep", "5", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 5, at5);
    run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"replay", addr, "--to-tick", "4", NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "tick 4 is before the stream's published checkpoint of tick 5"),
                  "status %d: %s", run.status, run.err);
    tu_run_free(&run);
    /* a message deleted from among the retained records: the stream's damage, which keel-wal names */
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_DeleteMsg(js, "KEEL_rkeep", covered, NULL, NULL), NATS_OK);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", addr, NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "gap"), "verify: status %d: %s", run.status, run.err);
    tu_run_free(&run);
    /* a checkpoint of tick 5 covering records after its commit (the reopened primary's EPOCH): restored at
       its tick, DEST holds them too */
    purged_world_retaining("rkeep2", 13, true, pdir, sizeof pdir, &at5, &want);
    ck_assert_msg(restore_into("rkeep2", "5", dest, sizeof dest, err, sizeof err) == 0, "%s", err);
    assert_opens_at(dest, 5, at5);
    /* the commit that ends the part of a unit they start with deleted: a gap as well, not a purge */
    n = connect_world(nats_url, "rkeep2", "probe");
    ck_assert_rc(kr_bounds(n, &sfirst, &slast), KEEL_OK);
    uint64_t commit = sfirst - 1;
    do
        ck_assert_rc(kr_get(n, ++commit, &msg), KEEL_OK);
    while (kw_record_peek_kind(msg.p, msg.len) != KW_KIND_TICK_COMMIT);
    kw_buf_free(&msg);
    kr_close(n);
    ck_assert_msg(commit > sfirst, "stream from %" PRIu64 ", first commit %" PRIu64, sfirst, commit);
    ck_assert_int_eq(natsConnection_ConnectTo(&nc, nats_url), NATS_OK);
    ck_assert_int_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    ck_assert_int_eq(js_DeleteMsg(js, "KEEL_rkeep2", commit, NULL, NULL), NATS_OK);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    snprintf(addr, sizeof addr, "%s/rkeep2", nats_url);
    run = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", addr, NULL});
    ck_assert_msg(run.status == 1 && strstr(run.err, "gap"), "verify: status %d: %s", run.status, run.err);
    tu_run_free(&run);
}
END_TEST

/* A world's streams made by a primary that died before its first record:
 * there is no world to restore (exit 2, nothing written). */
START_TEST(test_restore_empty_stream)
{
    kr_node *n = connect_world(nats_url, "rempty", "a");
    char dest[4096], err[4096];
    ck_assert_int_eq(restore_into("rempty", NULL, dest, sizeof dest, err, sizeof err), 2);
    ck_assert_msg(strstr(err, "no record and no published checkpoint"), "%s", err);
    ck_assert(!has_data_file(dest));
    kr_close(n);
}
END_TEST

/* keel-wal's private copy of a stream goes with the command, also when a
 * signal ends it: tail -f on a stream, once it printed the primary's next
 * tick, stops on SIGTERM with exit 0 and dies of SIGHUP (as without a
 * handler); with SIGHUP ignored (nohup) it lives on through one and stops
 * on SIGTERM. $TMPDIR is left empty each time. */
START_TEST(test_stream_copy_removed_on_signal)
{
    char pdir[4096], tmp[4096], line[4096];
    keel_component v;
    tu_path(pdir, sizeof pdir, "sig-primary");
    keel_runtime *p = sync_primary_at(pdir, "sigcopy", &v, 2);
    tu_path(tmp, sizeof tmp, "sig-tmp");
    ck_assert_int_eq(mkdir(tmp, 0700), 0);
    const struct { int sig; bool ignore_hup; } runs[] = {{SIGTERM, false}, {SIGHUP, false}, {SIGHUP, true}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        FILE *out;
        pid_t pid = spawn_tail_f("sigcopy", "1", tmp, NULL, runs[i].ignore_hup, &out);
        ck_assert_msg(fgets(line, sizeof line, out), "tail -f printed nothing"); /* the last record */
        tu_step_n(p, 1);
        ck_assert_rc(keel_flush(p), KEEL_OK);
        ck_assert_msg(fgets(line, sizeof line, out), "tail -f printed no new record"); /* while following */
        ck_assert_int_eq(tu_dir_entries(tmp), 1); /* its copy, while it follows */
        ck_assert_int_eq(kill(pid, runs[i].sig), 0);
        if (runs[i].ignore_hup) /* an ignored signal is dropped when sent: SIGTERM stops it */
            ck_assert_int_eq(kill(pid, SIGTERM), 0);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        fclose(out);
        if (runs[i].sig == SIGTERM || runs[i].ignore_hup) /* it printed while following: a clean stop */
            ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "run %zu: status 0x%x", i, status);
        else
            ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGHUP, "SIGHUP: status 0x%x", status);
        ck_assert_int_eq(tu_dir_entries(tmp), 0);
    }
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
}
END_TEST

/* A standby whose stop_tick keeps it from applying all the stream holds
 * does not take the world over when the lease goes: from there it would
 * continue an older tick than the stream's. It reports the ticks it holds
 * but may not apply, and the epoch of what it read; the stream stays
 * whole for a new replica. The standby recovers with the primary
 * `standby_from` ticks in: at its stop_tick already (2), or below it, when
 * the poll that sees the lease lapse is the one that takes it there. */
static void stop_tick_case(const char *world, uint32_t standby_from)
{
    char pdir[4096], sdir[4096], fdir[4096], sub[64];
    keel_component pv, sv, fv;
    snprintf(sub, sizeof sub, "%s-primary", world);
    tu_path(pdir, sizeof pdir, sub);
    keel_runtime *p = sync_primary_at(pdir, world, &pv, standby_from);
    keel_runtime *s = standby_at(world, 2, sdir, sizeof sdir, &sv);
    ck_assert_uint_eq(keel_runtime_tick(s), standby_from < 2 ? standby_from : 2);
    tu_step_n(p, 5 - standby_from);
    ck_assert_rc(keel_flush(p), KEEL_OK);
    uint64_t hash = keel_world_hash(keel_runtime_world(p));
    ck_assert_rc(keel_runtime_close(p), KEEL_OK); /* the lease released: lapsed at the next look */
    keel_repl_status st;
    for (int i = 0; i < 5; i++) {
        bool promoted = true;
        ck_assert_msg(!keel_replica_poll(s, 100, &promoted), "%s", keel_last_error());
        ck_assert(!promoted);
    }
    keel_repl_status_get(s, &st);
    ck_assert_int_eq(st.role, KEEL_ROLE_STANDBY);
    ck_assert_uint_eq(keel_runtime_tick(s), 2);
    ck_assert_uint_eq(st.lag_ticks, 3); /* ticks 3..5 copied, not applied */
    ck_assert_uint_gt(st.lag_records, 0);
    ck_assert_uint_eq(st.epoch, 1);
    ck_assert_rc(keel_runtime_close(s), KEEL_OK);
    keel_runtime *f = replica_at(world, fdir, sizeof fdir, &fv, 5, hash);
    keel_repl_status_get(f, &st);
    ck_assert_uint_eq(st.epoch, 1);
    ck_assert_uint_eq(st.lag_ticks, 0);
    ck_assert_rc(keel_runtime_close(f), KEEL_OK);
}

START_TEST(test_standby_at_stop_tick_stays_standby)
{
    stop_tick_case("stoptick", 5);
    stop_tick_case("stopreach", 1);
}
END_TEST

/* A deposed primary that still appends to the stream (its lease lapsed,
 * its stream still reachable), as the failpoint observer below plays it:
 * a record after the stream's last on every commit of the standby's. */
typedef struct rogue {
    kr_node *n;
    kw_codec_ctx *c;
    kw_buf rec;
    uint64_t published;
} rogue;

static rogue the_rogue;

static void rogue_append(rogue *g)
{
    uint64_t first, last;
    unsigned char mp[KW_CHECKPOINT_MARKER_SIZE];
    ck_assert_rc(kr_bounds(g->n, &first, &last), KEEL_OK);
    kw_checkpoint_marker_encode(1, 3, mp);
    g->rec.len = 0;
    ck_assert(!kw_record_build(g->c, &g->rec, KW_KIND_CHECKPOINT, last + 1, 3, 0, mp, sizeof mp));
    ck_assert_rc(kr_publish(g->n, 1, last + 1, g->rec.p, g->rec.len), KEEL_OK);
    g->published++;
}

static void rogue_observe(const char *name, const char *action, uint64_t hit, void *arg)
{
    (void)action;
    (void)hit;
    if (!strcmp(name, "wal.before_commit"))
        rogue_append(arg);
}

/* A promotion whose epoch record the stream refuses every time (the old
 * primary appends before each try) is no promotion: the poll returns 0,
 * the lease is let go, and the standby follows on from what its tries
 * copied; once the old primary is quiet, the next poll promotes it, and
 * the world it continues is the stream's. */
START_TEST(test_promotion_refused_follows_on)
{
    if (!keel_failpoints_compiled())
        return; /* the old primary's appends ride on a failpoint's observer */
    char pdir[4096], sdir[4096], fdir[4096];
    keel_component pv, sv, fv;
    tu_path(pdir, sizeof pdir, "rf-primary");
    keel_runtime *p = sync_primary_at(pdir, "refused", &pv, 3);
    keel_runtime *s = standby_at("refused", 0, sdir, sizeof sdir, &sv);
    for (int i = 0; i < 300 && keel_runtime_tick(s) < 3; i++)
        ck_assert_msg(!keel_replica_poll(s, 100, NULL), "%s", keel_last_error());
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    rogue *g = &the_rogue;
    *g = (rogue){.n = connect_world(nats_url, "refused", "old-primary")};
    ck_assert(!kw_codec_create(NULL, &g->c));
    rogue_append(g);
    core_fp_set_observer(rogue_observe, g);
    ck_assert_rc(keel_failpoints_set("wal.before_commit=delay:0"), KEEL_OK);
    bool promoted = true;
    int rc = keel_replica_poll(s, 100, &promoted);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    core_fp_set_observer(NULL, NULL);
    ck_assert_msg(rc == KEEL_OK, "%s: %s", keel_strerror(rc), keel_last_error());
    ck_assert(!promoted);
    ck_assert_uint_ge(g->published, 8); /* every try met a newer record */
    keel_repl_status st;
    keel_repl_status_get(s, &st);
    ck_assert_int_eq(st.role, KEEL_ROLE_STANDBY);
    for (int i = 0; i < 50 && !promoted; i++) /* the lease was let go: lapsed at once */
        ck_assert_msg(!keel_replica_poll(s, 100, &promoted), "%s", keel_last_error());
    ck_assert(promoted);
    keel_repl_status_get(s, &st);
    ck_assert_int_eq(st.role, KEEL_ROLE_PRIMARY);
    ck_assert_uint_eq(st.epoch, 3); /* its first take, epoch 2, has no epoch record */
    ck_assert_uint_eq(keel_runtime_tick(s), 3);
    tu_step_n(s, 2);
    ck_assert_rc(keel_flush(s), KEEL_OK);
    uint64_t hash = keel_world_hash(keel_runtime_world(s));
    ck_assert_rc(keel_runtime_close(s), KEEL_OK);
    ck_assert_rc(keel_runtime_close(replica_at("refused", fdir, sizeof fdir, &fv, 5, hash)), KEEL_OK);
    kw_buf_free(&g->rec);
    kw_codec_destroy(g->c);
    kr_close(g->n);
}
END_TEST

/* Another run's records of the same world, published one per commit of
 * the standby's (the observer of wal.before_commit, as the rogue above):
 * a dead primary's last publishes, still arriving while a standby takes
 * the world over. */
typedef struct feeder {
    kr_node *n;
    kw_buf recs[32];
    uint64_t first, count, fed;
} feeder;

static feeder the_feeder;

static void feed_observe(const char *name, const char *action, uint64_t hit, void *arg)
{
    (void)action;
    (void)hit;
    feeder *f = arg;
    if (!strcmp(name, "wal.before_commit") && f->fed < f->count) {
        ck_assert_rc(kr_publish(f->n, 1, f->first + f->fed, f->recs[f->fed].p, f->recs[f->fed].len), KEEL_OK);
        f->fed++;
    }
}

/* A standby whose promotion copies records its last apply did not take
 * (the stream moved on while it caught up: begin_epoch copies and tries
 * again) applies them as it becomes primary, and a read view begun then
 * shows the world it took over, not the state of that last apply. */
START_TEST(test_promoted_view_is_current)
{
    if (!keel_failpoints_compiled())
        return; /* the records arrive on a failpoint's observer */
    char pdir[4096], sdir[4096];
    keel_component pv, sv;
    tu_path(pdir, sizeof pdir, "pv-source");
    keel_runtime *p = sync_primary_at(pdir, "pvsrc", &pv, 5);
    uint64_t hash = keel_world_hash(keel_runtime_world(p));
    ck_assert_rc(keel_runtime_close(p), KEEL_OK);
    /* world pvdst: the source's records up to tick 3 published by an old primary holding the lease */
    kr_node *src = connect_world(nats_url, "pvsrc", "copier");
    feeder *f = &the_feeder;
    *f = (feeder){.n = connect_world(nats_url, "pvdst", "old")};
    kr_lease l;
    uint64_t epoch, rev, first, last;
    ck_assert_rc(kr_lease_read(f->n, &l), KEEL_OK);
    ck_assert_rc(kr_lease_take(f->n, &l, &epoch, &rev), KEEL_OK);
    ck_assert_uint_eq(epoch, 1);
    ck_assert_rc(kr_bounds(src, &first, &last), KEEL_OK);
    kw_buf rec = {0};
    for (uint64_t lsn = 1; lsn <= last; lsn++) {
        kw_header h;
        ck_assert_rc(kr_get(src, lsn, &rec), KEEL_OK);
        ck_assert_rc(kw_record_check(rec.p, rec.len, &h), KEEL_OK);
        if (h.tick < 4 && !f->first) {
            ck_assert_rc(kr_publish(f->n, 1, lsn, rec.p, rec.len), KEEL_OK);
            continue;
        }
        if (!f->first)
            f->first = lsn;
        ck_assert_uint_lt(f->count, 32);
        ck_assert(!kw_put_bytes(&f->recs[f->count++], rec.p, rec.len));
    }
    ck_assert_uint_ge(f->count, 3);
    keel_runtime *s = standby_at("pvdst", 0, sdir, sizeof sdir, &sv);
    ck_assert_uint_eq(keel_runtime_tick(s), 3);
    /* the first of the rest arrives, the old primary lets the lease go; every commit of the standby's
       from here on (its poll's copy, its catch-up, each try of its epoch record) meets one more */
    ck_assert_rc(kr_publish(f->n, 1, f->first, f->recs[0].p, f->recs[0].len), KEEL_OK);
    f->fed = 1;
    core_fp_set_observer(feed_observe, f);
    ck_assert_rc(keel_failpoints_set("wal.before_commit=delay:0"), KEEL_OK);
    ck_assert_rc(kr_lease_renew(f->n, epoch, true, &rev), KEEL_OK);
    bool promoted = false;
    int rc = KEEL_OK;
    for (int i = 0; i < 50 && !rc && !promoted; i++)
        rc = keel_replica_poll(s, 100, &promoted);
    ck_assert_rc(keel_failpoints_set(""), KEEL_OK);
    core_fp_set_observer(NULL, NULL);
    ck_assert_msg(rc == KEEL_OK && promoted, "%s: %s", keel_strerror(rc), keel_last_error());
    ck_assert_uint_eq(f->fed, f->count);
    ck_assert_uint_eq(keel_runtime_tick(s), 5);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(s)), hash);
    const keel_view *v;
    ck_assert_rc(keel_view_begin(s, &v), KEEL_OK);
    ck_assert_uint_eq(keel_view_tick(v), 5);
    ck_assert_uint_eq(keel_view_count(v), keel_world_count(keel_runtime_world(s)));
    keel_view_end(v);
    ck_assert_rc(keel_runtime_close(s), KEEL_OK);
    for (uint64_t i = 0; i < f->count; i++)
        kw_buf_free(&f->recs[i]);
    kw_buf_free(&rec);
    kr_close(f->n);
    kr_close(src);
}
END_TEST

int main(void)
{
    const TTest *const stream[] = {test_publish_fences, test_pipe_fences, test_pipe_resends_after_settle,
                                   test_drain_waits_for_acked,    test_lease_cas,                test_sync_drops_unreplicated_tail,
                                   test_bad_streams_write_nothing, test_checkpoint_stream,
                                   test_connect_errors,           test_primary_runtime_publishes,
                                   test_follower_checkpoints, test_failed_checkpoints_age, test_stream_ahead_of_disk,
                                   test_side_over_max_payload_refused, test_another_history_refused,
                                   test_tick_record_over_max_payload_degrades,
                                   test_trimmed_checkpoint_against_empty_stream,
                                   test_purged_divergence_refused, test_rejoin_purged_to_directory_end,
                                   test_rejoin_same_record_after_parting,
                                   test_rejoin_purged_epoch, test_rejoin_purged_seed, test_stream_made_again, test_stream_without_identity,
                                   test_world_seeds_empty_stream, test_local_world_replicated,
                                   test_replica_waits_for_unstreamed_world, test_stream_bootstrap,
                                   test_stream_bootstrap_copy_fails, test_stream_bootstrap_refused,
                                   test_stream_bootstrap_declined, test_replica_lag_from_messages,
                                   test_replica_poll_without_wait, test_replica_unit_fails_midway,
                                   test_replica_copy_fails_once, test_lease_renewed_while_recovering,
                                   test_sync_close_without_stream, test_standby_at_stop_tick_stays_standby,
                                   test_promotion_refused_follows_on, test_promoted_view_is_current,
                                   test_held_directory_makes_nothing,
                                   test_restore_to_tick_keeps_its_schema, test_restore_purged_stream,
                                   test_stream_copy_keeps_retained,
                                   test_restore_empty_stream, test_stream_copy_removed_on_signal};
    const TTest *const api[] = {test_runtime_refusals, test_server_without_jetstream, test_seed_stalls,
                                test_marked_directory_without_replication};
    const TTest *const rejoin[] = {test_rejoin_trimmed_directory, test_replica_degraded_while_stream_away};
    check_set_max_msg_size(KEEL_TEST_MAX_MSG);
    SRunner *sr = srunner_create(
        tu_suite_with("repl_stream", stream, sizeof stream / sizeof *stream, 120, nats_setup, nats_teardown));
    srunner_add_suite(sr, tu_suite("repl_api", api, sizeof api / sizeof *api, 60));
    srunner_add_suite(sr, tu_suite("repl_rejoin", rejoin, sizeof rejoin / sizeof *rejoin, 120));
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
