/*
 * repl/nats.c -- the world's stream and lease bucket on NATS JetStream: the
 * connection, finding or creating them, reading messages by sequence or in
 * order, and publishing with an expected last sequence.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "core/core.h"
#include "repl_internal.h"

#define DEDUP_WINDOW_NS (120ll * 1000000000ll)

/* A NATS failure as a keel code: a JetStream API error is the server's
 * answer (KEEL_EIO), anything else means it did not answer. */
static int nats_fail(natsStatus s, jsErrCode jerr, const char *fmt, const char *what)
{
    char buf[1400];
    snprintf(buf, sizeof buf, fmt, what);
    if (jerr)
        return core_fail(KEEL_EIO, "%s: JetStream error %d (%s)", buf, (int)jerr, natsStatus_GetText(s));
    return core_fail(KEEL_EUNAVAILABLE, "%s: %s", buf, natsStatus_GetText(s));
}

/* A request NATS could not answer now (a server lost, a stream leader
 * being elected, a reconnect): reads retry those for RETRY_WINDOW_MS. */
#define RETRY_WINDOW_MS 30000
static bool transient(natsStatus s, jsErrCode jerr)
{
    return !jerr && (s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_NO_SERVER ||
                     s == NATS_CONNECTION_DISCONNECTED || s == NATS_NOT_YET_CONNECTED);
}

/* Wait before retrying a transient failure; false once the window passed. */
static bool retry_wait(int64_t *waited_ms)
{
    if (*waited_ms >= RETRY_WINDOW_MS)
        return false;
    nats_Sleep(200);
    *waited_ms += 200;
    return true;
}

static bool name_ok(const char *w)
{
    size_t n = w ? strlen(w) : 0;
    if (!n || n > KR_WORLD_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)w[i]) && w[i] != '-' && w[i] != '_')
            return false;
    return true;
}

bool kr_parse_address(const char *addr, char *urls, size_t ucap, char *world, size_t wcap)
{
    if (strncmp(addr, "nats://", 7))
        return false;
    const char *slash = strchr(addr + 7, '/');
    if (!slash || !name_ok(slash + 1) || (size_t)(slash - addr) >= ucap || strlen(slash + 1) >= wcap)
        return false;
    memcpy(urls, addr, (size_t)(slash - addr));
    urls[slash - addr] = 0;
    snprintf(world, wcap, "%s", slash + 1);
    return true;
}

/* Split "a,b,c" into at most KR_URLS_MAX servers (pointers into n->urls). */
static int split_urls(kr_node *n, const char *urls)
{
    if (!urls || !*urls || strlen(urls) >= sizeof n->urls)
        return core_fail(KEEL_EINVAL, "the NATS address '%s' is empty or too long", urls ? urls : "");
    snprintf(n->urls, sizeof n->urls, "%s", urls);
    for (char *save = NULL, *u = strtok_r(n->urls, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
        if (n->nservers == KR_URLS_MAX)
            return core_fail(KEEL_EINVAL, "more than %d NATS servers in '%s'", KR_URLS_MAX, urls);
        if (strncmp(u, "nats://", 7) || !u[7])
            return core_fail(KEEL_EINVAL, "the NATS server '%s' is not nats://HOST:PORT", u);
        n->servers[n->nservers++] = u;
    }
    return n->nservers ? KEEL_OK : core_fail(KEEL_EINVAL, "no NATS server in '%s'", urls);
}

/* A pipelined publish was refused or not acknowledged (a NATS thread). */
static void on_async_err(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    (void)js, (void)pae;
    kr_node *n = closure;
    pthread_mutex_lock(&n->err_mu);
    n->async_errors++;
    pthread_mutex_unlock(&n->err_mu);
}

static int open_conn(kr_node *n)
{
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, (const char **)n->servers, n->nservers);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, n->timeout_ms);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1); /* a lost node or a restart: reconnect for ever */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, 100);
    if (s == NATS_OK)
        s = natsOptions_SetNoRandomize(o, true);
    if (s == NATS_OK)
        s = natsConnection_Connect(&n->nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        return core_fail(KEEL_EUNAVAILABLE, "cannot connect to NATS at %s: %s", n->urls_given, natsStatus_GetText(s));
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = n->timeout_ms;
    jo.PublishAsync.ErrHandler = on_async_err;
    jo.PublishAsync.ErrHandlerClosure = n;
    jo.PublishAsync.MaxPending = 8192;
    s = natsConnection_JetStream(&n->js, n->nc, &jo);
    return s == NATS_OK ? KEEL_OK : nats_fail(s, 0, "NATS at %s offers no JetStream", n->urls_given);
}

/* Create a stream (or a KV bucket) with `want` replicas, or, when none was
 * asked for, with 3 and then 1 when the cluster is smaller. */
static int replicas_to_try(const kr_node *n, int64_t out[2])
{
    if (n->replicas) {
        out[0] = n->replicas;
        return 1;
    }
    out[0] = n->nservers >= 3 ? 3 : 1;
    out[1] = 1;
    return out[0] == 1 ? 1 : 2;
}

int kr_ensure_stream(kr_node *n, const char *stream, const char *subject, bool create)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    int64_t waited = 0;
    while ((s = js_GetStreamInfo(&si, n->js, stream, NULL, &jerr)) != NATS_OK && transient(s, jerr) &&
           retry_wait(&waited))
        jerr = 0;
    if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        return KEEL_OK;
    }
    if (jerr != JSStreamNotFoundErr && s != NATS_NOT_FOUND)
        return nats_fail(s, jerr, "cannot look up stream %s", stream);
    if (!create)
        return core_fail(KEEL_ENOENT, "NATS at %s holds no stream %s: world '%s' was never replicated there",
                         n->urls_given, stream, n->world);
    const char *subjects[] = {subject};
    int64_t tries[2];
    int ntries = replicas_to_try(n, tries);
    for (int i = 0; i < ntries; i++) {
        jsStreamConfig c;
        jsStreamConfig_Init(&c);
        c.Name = stream;
        c.Subjects = subjects;
        c.SubjectsLen = 1;
        c.Storage = js_FileStorage;
        c.Replicas = tries[i];
        c.Duplicates = DEDUP_WINDOW_NS;
        jerr = 0;
        s = js_AddStream(&si, n->js, &c, NULL, &jerr);
        if (s == NATS_OK) {
            jsStreamInfo_Destroy(si);
            return KEEL_OK;
        }
        if (!jerr)
            break;
    }
    return nats_fail(s, jerr, "cannot create stream %s", stream);
}

int kr_ensure_bucket(kr_node *n, bool create)
{
    if (n->kv)
        return KEEL_OK;
    natsStatus s = js_KeyValue(&n->kv, n->js, KR_LEASE_BUCKET);
    if (s == NATS_NOT_FOUND && !create)
        return KEEL_ENOENT; /* no primary made it yet: the lease is open later (lease.c) */
    if (s == NATS_OK || !create)
        return s == NATS_OK ? KEEL_OK : nats_fail(s, 0, "cannot open the lease bucket %s", KR_LEASE_BUCKET);
    int64_t tries[2];
    int ntries = replicas_to_try(n, tries);
    for (int i = 0; i < ntries; i++) {
        kvConfig c;
        kvConfig_Init(&c);
        c.Bucket = KR_LEASE_BUCKET;
        c.History = 1;
        c.StorageType = js_FileStorage;
        c.Replicas = (int)tries[i];
        if ((s = js_CreateKeyValue(&n->kv, n->js, &c)) == NATS_OK)
            return KEEL_OK;
    }
    return nats_fail(s, 0, "cannot create the lease bucket %s", KR_LEASE_BUCKET);
}

int kr_connect(const kr_desc *d, kr_node **out)
{
    *out = NULL;
    if (!d || !name_ok(d->world))
        return core_fail(KEEL_EINVAL, "the world's name '%s' is not 1 to %u letters, digits, '-' or '_'",
                         d && d->world ? d->world : "", KR_WORLD_MAX);
    kr_node *n = calloc(1, sizeof *n);
    if (!n)
        return core_fail(KEEL_ENOMEM, "out of memory connecting to NATS");
    pthread_mutex_init(&n->err_mu, NULL);
    snprintf(n->urls_given, sizeof n->urls_given, "%s", d->urls ? d->urls : "");
    snprintf(n->world, sizeof n->world, "%s", d->world);
    snprintf(n->stream, sizeof n->stream, "KEEL_%s", d->world);
    snprintf(n->subject, sizeof n->subject, "keel.%s.wal", d->world);
    snprintf(n->ckpt_stream, sizeof n->ckpt_stream, "KEEL_%s_CKPT", d->world);
    snprintf(n->ckpt_subject, sizeof n->ckpt_subject, "keel.%s.ckpt", d->world);
    if (d->node && *d->node) {
        snprintf(n->node, sizeof n->node, "%s", d->node);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        snprintf(n->node, sizeof n->node, "%.48s:%d", host, (int)getpid());
    }
    n->timeout_ms = d->timeout_ms > 0 ? d->timeout_ms : 2000;
    n->replicas = d->replicas;
    int rc = split_urls(n, d->urls);
    if (!rc)
        rc = open_conn(n);
    if (!rc)
        rc = kr_ensure_stream(n, n->stream, n->subject, d->create);
    if (!rc && (rc = kr_ensure_stream(n, n->ckpt_stream, n->ckpt_subject, d->create)) == KEEL_ENOENT)
        rc = KEEL_OK; /* no checkpoint published yet: its primary makes the stream */
    if (!rc && (rc = kr_ensure_bucket(n, d->create)) == KEEL_ENOENT)
        rc = KEEL_OK;
    if (rc) {
        kr_close(n);
        return rc;
    }
    *out = n;
    return KEEL_OK;
}

void kr_close(kr_node *n)
{
    if (!n)
        return;
    kvStore_Destroy(n->kv);
    jsCtx_Destroy(n->js);
    natsConnection_Destroy(n->nc);
    pthread_mutex_destroy(&n->err_mu);
    free(n);
}

const char *kr_world(const kr_node *n)
{
    return n->world;
}

const char *kr_node_id(const kr_node *n)
{
    return n->node;
}

int kr_bounds(kr_node *n, uint64_t *first, uint64_t *last)
{
    return kr_stream_bounds(n, n->stream, first, last);
}

int kr_stream_bounds(kr_node *n, const char *stream, uint64_t *first, uint64_t *last)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    int64_t waited = 0;
    while ((s = js_GetStreamInfo(&si, n->js, stream, NULL, &jerr)) != NATS_OK && transient(s, jerr) &&
           retry_wait(&waited))
        jerr = 0;
    if (s != NATS_OK)
        return nats_fail(s, jerr, "cannot read the bounds of stream %s", stream);
    *first = si->State.Msgs ? si->State.FirstSeq : 0;
    *last = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    return KEEL_OK;
}

int kr_get(kr_node *n, uint64_t seq, kw_buf *out)
{
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    int64_t waited = 0;
    while ((s = js_GetMsg(&m, n->js, n->stream, seq, NULL, &jerr)) != NATS_OK && transient(s, jerr) &&
           retry_wait(&waited))
        jerr = 0;
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return core_fail(KEEL_ENOENT, "stream %s holds no message %" PRIu64, n->stream, seq);
    if (s != NATS_OK)
        return nats_fail(s, jerr, "cannot read a message of stream %s", n->stream);
    out->len = 0;
    int rc = kw_put_bytes(out, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
    return rc;
}

int kr_publish(kr_node *n, uint64_t epoch, uint64_t lsn, const void *rec, size_t len)
{
    char id[48];
    snprintf(id, sizeof id, "%" PRIu64 ":%" PRIu64, epoch, lsn);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id;
    po.ExpectStream = n->stream;
    po.ExpectLastSeq = lsn - 1; /* 0 (the first record) sets no expectation */
    po.MaxWait = n->timeout_ms;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Publish(&pa, n->js, n->subject, rec, (int)len, &po, &jerr);
    if (s == NATS_OK) {
        bool right = pa->Sequence == lsn;
        jsPubAck_Destroy(pa);
        if (right)
            return KEEL_OK;
        return core_fail(KEEL_EFENCED, "stream %s stored LSN %" PRIu64 " at another sequence: it was appended to by "
                                       "another primary", n->stream, lsn);
    }
    if (jerr == JSStreamWrongLastSequenceErr)
        return core_fail(KEEL_EFENCED, "fenced: stream %s refused LSN %" PRIu64 " of epoch %" PRIu64
                                       " (another primary appended after LSN %" PRIu64 ")",
                         n->stream, lsn, epoch, lsn - 1);
    return nats_fail(s, jerr, "stream %s did not acknowledge a record", n->stream);
}

/* After a pipelined batch met errors: how far the stream holds *our*
 * records. The stream's record at min(its end, the batch's end) is ours or
 * another primary's (seq == LSN, and every publish expects its
 * predecessor): ours -- everything up to it is ours; another's -- fenced. */
static int settle_batch(kr_node *n, uint64_t epoch, uint64_t before, uint64_t last, const void *const *recs,
                        const size_t *lens, uint64_t *acked)
{
    uint64_t first, end;
    kw_buf got = {0};
    int rc = kr_bounds(n, &first, &end);
    uint64_t k = end < last ? end : last;
    if (!rc && k > before && !(rc = kr_get(n, k, &got))) {
        size_t i = (size_t)(k - before - 1);
        if (got.len == lens[i] && !memcmp(got.p, recs[i], got.len))
            *acked = k;
        else
            rc = core_fail(KEEL_EFENCED, "fenced: stream %s holds another primary's record at LSN %" PRIu64
                                         " (this node's epoch %" PRIu64 ")", n->stream, k, epoch);
    }
    kw_buf_free(&got);
    if (!rc && *acked < last)
        rc = core_fail(KEEL_EUNAVAILABLE, "stream %s acknowledged LSN %" PRIu64 " of %" PRIu64, n->stream, *acked,
                       last);
    return rc;
}

int kr_publish_batch(kr_node *n, uint64_t epoch, uint64_t first_lsn, uint32_t count, const void *const *recs,
                     const size_t *lens, uint64_t *acked)
{
    *acked = first_lsn - 1;
    pthread_mutex_lock(&n->err_mu);
    n->async_errors = 0;
    pthread_mutex_unlock(&n->err_mu);
    natsStatus s = NATS_OK;
    for (uint32_t i = 0; i < count && s == NATS_OK; i++) {
        uint64_t lsn = first_lsn + i;
        char id[48];
        snprintf(id, sizeof id, "%" PRIu64 ":%" PRIu64, epoch, lsn);
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MsgId = id;
        po.ExpectStream = n->stream;
        po.ExpectLastSeq = lsn - 1;
        s = js_PublishAsync(n->js, n->subject, recs[i], (int)lens[i], &po);
    }
    jsPubOptions wait;
    jsPubOptions_Init(&wait);
    wait.MaxWait = n->timeout_ms;
    natsStatus done = js_PublishAsyncComplete(n->js, &wait);
    pthread_mutex_lock(&n->err_mu);
    uint32_t errors = n->async_errors;
    pthread_mutex_unlock(&n->err_mu);
    if (s == NATS_OK && done == NATS_OK && !errors) {
        *acked = first_lsn + count - 1;
        return KEEL_OK;
    }
    return settle_batch(n, epoch, first_lsn - 1, first_lsn + count - 1, recs, lens, acked);
}

int kr_purge_before(kr_node *n, uint64_t seq)
{
    return kr_purge_stream_before(n, n->stream, seq);
}

int kr_purge_stream_before(kr_node *n, const char *stream, uint64_t seq)
{
    if (seq <= 1)
        return KEEL_OK; /* nothing comes before 1 -- and a purge request with sequence 1 empties the stream */
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Purge.Sequence = seq;
    jsErrCode jerr = 0;
    natsStatus s = js_PurgeStream(n->js, stream, &o, &jerr);
    return s == NATS_OK ? KEEL_OK : nats_fail(s, jerr, "cannot purge stream %s", stream);
}

/* ---- reading in order ---------------------------------------------------------- */

struct kr_reader {
    kr_node *n;
    const char *stream;
    natsSubscription *sub;
    natsMsg *msg;
    uint64_t next;
};

int kr_read_begin(kr_node *n, uint64_t from, kr_reader **out)
{
    return kr_read_begin_on(n, n->stream, n->subject, from, out);
}

int kr_read_begin_on(kr_node *n, const char *stream, const char *subject, uint64_t from, kr_reader **out)
{
    kr_reader *r = calloc(1, sizeof *r);
    if (!r)
        return core_fail(KEEL_ENOMEM, "out of memory reading stream %s", stream);
    r->n = n;
    r->stream = stream;
    r->next = from ? from : 1;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverByStartSequence;
    so.Config.OptStartSeq = r->next;
    jsErrCode jerr = 0;
    natsStatus s;
    int64_t waited = 0;
    while ((s = js_SubscribeSync(&r->sub, n->js, subject, NULL, &so, &jerr)) != NATS_OK && transient(s, jerr) &&
           retry_wait(&waited))
        jerr = 0;
    if (s != NATS_OK) {
        free(r);
        return nats_fail(s, jerr, "cannot read stream %s", stream);
    }
    *out = r;
    return KEEL_OK;
}

int kr_read_next(kr_reader *r, int64_t timeout_ms, uint64_t *seq, const void **data, size_t *len)
{
    natsMsg_Destroy(r->msg);
    r->msg = NULL;
    natsStatus s = natsSubscription_NextMsg(&r->msg, r->sub, timeout_ms > 0 ? timeout_ms : 1);
    if (s == NATS_TIMEOUT)
        return 0;
    if (s != NATS_OK)
        return nats_fail(s, 0, "reading stream %s failed", r->stream);
    jsMsgMetaData *md = NULL;
    if ((s = natsMsg_GetMetaData(&md, r->msg)) != NATS_OK)
        return nats_fail(s, 0, "a message of stream %s has no metadata", r->stream);
    uint64_t got = md->Sequence.Stream;
    jsMsgMetaData_Destroy(md);
    if (got != r->next)
        return core_fail(KEEL_ECORRUPT, "stream %s has a gap: message %" PRIu64 " came where %" PRIu64
                                        " was expected (purged, or not a keel stream)",
                         r->stream, got, r->next);
    r->next++;
    *seq = got;
    *data = natsMsg_GetData(r->msg);
    *len = (size_t)natsMsg_GetDataLength(r->msg);
    return 1;
}

void kr_read_end(kr_reader *r)
{
    if (!r)
        return;
    natsMsg_Destroy(r->msg);
    natsSubscription_Unsubscribe(r->sub);
    natsSubscription_Destroy(r->sub);
    free(r);
}
