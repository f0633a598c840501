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
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "core/core.h"
#include "repl_internal.h"

#define DEDUP_WINDOW_NS (120ll * 1000000000ll)

/* A NATS failure as a keel code: a JetStream API error is the server's
 * answer (KEEL_EIO), anything else means it did not answer; so does a
 * server without JetStream (the client reports that as error 10076), and
 * a cluster without the servers a stream's replicas need (10005). */
static int nats_fail(natsStatus s, jsErrCode jerr, const char *fmt, const char *what)
{
    char buf[1400];
    snprintf(buf, sizeof buf, fmt, what);
    if (jerr == JSNotEnabledErr || jerr == JSNotEnabledForAccountErr)
        return core_fail(KEEL_EUNAVAILABLE, "%s: no JetStream answered: the NATS server offers no JetStream (start "
                         "it with -js, or give its configuration a jetstream block; a server also turns it off when "
                         "its storage fails), or no stream takes the subject", buf);
    if (jerr == JSClusterNoPeersErr)
        return core_fail(KEEL_EUNAVAILABLE, "%s: the NATS cluster has too few servers up for the stream's replicas "
                         "(JetStream error 10005)", buf);
    if (jerr)
        return core_fail(KEEL_EIO, "%s: JetStream error %d (%s)", buf, (int)jerr, natsStatus_GetText(s));
    return core_fail(KEEL_EUNAVAILABLE, "%s: %s", buf, natsStatus_GetText(s));
}

/* A request NATS could not answer now (a server lost, a stream leader
 * being elected, a reconnect; JetStream saying its cluster is "temporarily
 * unavailable", or has no servers yet to place a stream's replicas on, as
 * while a cluster forms): requests retry those for RETRY_WINDOW_MS. */
#define RETRY_WINDOW_MS 30000
static bool transient(natsStatus s, jsErrCode jerr)
{
    if (jerr) /* no peers for a stream's placement: a cluster still forming, or a server away */
        return jerr == JSClusterNotAvailErr || jerr == JSClusterNoPeersErr;
    return s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_NO_SERVER || s == NATS_CONNECTION_DISCONNECTED ||
           s == NATS_NOT_YET_CONNECTED;
}

/* Wait before retrying a transient failure; false once RETRY_WINDOW_MS
 * passed since `since` (core_now_ns: the tries' own timeouts count too),
 * or once the node was abandoned. */
static bool retry_wait(const kr_node *n, uint64_t since)
{
    if (atomic_load(&n->abandoned) || core_now_ns() - since >= RETRY_WINDOW_MS * 1000000ull)
        return false;
    nats_Sleep(200);
    return true;
}

/* s = call, again while it fails transiently, for up to RETRY_WINDOW_MS
 * (jerr: the JetStream error the call sets, cleared between tries). */
#define KR_RETRY(n, s, jerr, call)                                                                        \
    for (uint64_t since_ = core_now_ns(); ((s) = (call)) != NATS_OK && transient((s), (jerr)) &&              \
                                      retry_wait((n), since_);)                                           \
    (jerr) = 0

void kr_abandon(kr_node *n)
{
    atomic_store(&n->abandoned, true);
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

/* A checkpoint's asynchronous publish was refused or not acknowledged (a NATS thread). */
static void on_async_err(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    (void)js, (void)pae;
    kr_node *n = closure;
    pthread_mutex_lock(&n->err_mu);
    n->async_errors++;
    pthread_mutex_unlock(&n->err_mu);
}

/* libnats' read and write buffers (its default: 32 KiB). At 1 MiB a replica
 * bootstrapping a 15 MB checkpoint spends about 10 ms less CPU reading it
 * (docs/performance.md, "Design measurements"). */
#define IO_BUF_SIZE (1 << 20)

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
    if (s == NATS_OK) /* a replica reads megabyte messages (a checkpoint): read in large gulps */
        s = natsOptions_SetIOBufSize(o, IO_BUF_SIZE);
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

/* The replicas of a stream or KV bucket made here: as asked, or 3 when
 * three or more servers were named (a cluster: never fewer, silently), else 1. */
static int64_t replicas_for(const kr_node *n)
{
    return n->replicas ? n->replicas : n->nservers >= 3 ? 3 : 1;
}

/* A stream's identity, in its description: "keel stream <name> id=<16 hex
 * digits>", drawn at random when a keel node makes it. The name alone cannot
 * tell a stream from one made again under that name after the first was
 * lost or deleted (kr_sync_store). 0: none given (made by hand). */
static uint64_t stream_id_of(const jsStreamInfo *si)
{
    const char *d = si && si->Config ? si->Config->Description : NULL;
    const char *at = d ? strstr(d, " id=") : NULL;
    uint64_t id = 0;
    for (int i = 0; at && i < 16; i++) {
        char c = at[4 + i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        id = id << 4 | (uint64_t)v;
    }
    return id;
}

static uint64_t random64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v && v)
        return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40) ^ 1;
}

bool kr_connected(kr_node *n)
{
    return n && n->nc && natsConnection_Status(n->nc) == NATS_CONN_STATUS_CONNECTED;
}

uint64_t kr_stream_id(const kr_node *n)
{
    return atomic_load_explicit(&((kr_node *)n)->stream_id, memory_order_relaxed);
}

/* What a stream's info says of it: the WAL stream's identity and bounds are kept. */
static void saw_stream(kr_node *n, const char *stream, const jsStreamInfo *si)
{
    if (strcmp(stream, n->stream))
        return;
    atomic_store_explicit(&n->stream_id, stream_id_of(si), memory_order_relaxed);
    atomic_store_explicit(&n->seen_first, si->State.FirstSeq, memory_order_relaxed);
    atomic_store_explicit(&n->seen_last, si->State.LastSeq, memory_order_relaxed);
}

int kr_ensure_stream(kr_node *n, const char *stream, const char *subject, bool create)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    KR_RETRY(n, s, jerr, js_GetStreamInfo(&si, n->js, stream, NULL, &jerr));
    if (s == NATS_OK) {
        saw_stream(n, stream, si);
        jsStreamInfo_Destroy(si);
        return KEEL_OK;
    }
    if (jerr != JSStreamNotFoundErr && s != NATS_NOT_FOUND)
        return nats_fail(s, jerr, "cannot look up stream %s", stream);
    if (!create)
        return core_fail(KEEL_ENOENT, "NATS at %s holds no stream %s: world '%s' was never replicated there",
                         n->urls_given, stream, n->world);
    const char *subjects[] = {subject};
    char desc[KR_WORLD_MAX + 64];
    snprintf(desc, sizeof desc, "keel stream %s id=%016" PRIx64, stream, random64());
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    c.Name = stream;
    c.Description = desc;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    c.Replicas = replicas_for(n);
    c.Duplicates = DEDUP_WINDOW_NS;
    jerr = 0; /* a try that timed out may have made it: the same config again is accepted */
    KR_RETRY(n, s, jerr, js_AddStream(&si, n->js, &c, NULL, &jerr));
    if (s != NATS_OK && jerr == JSStreamNameExistErr) /* another node made it meanwhile: its identity holds */
        KR_RETRY(n, s, jerr, js_GetStreamInfo(&si, n->js, stream, NULL, &jerr));
    if (s == NATS_OK) {
        saw_stream(n, stream, si);
        jsStreamInfo_Destroy(si);
        return KEEL_OK;
    }
    return nats_fail(s, jerr, "cannot create stream %s", stream);
}

int kr_ensure_bucket(kr_node *n, bool create)
{
    if (n->kv)
        return KEEL_OK;
    natsStatus s;
    jsErrCode none = 0;
    KR_RETRY(n, s, none, js_KeyValue(&n->kv, n->js, KR_LEASE_BUCKET));
    if (s == NATS_NOT_FOUND && !create)
        return KEEL_ENOENT; /* no primary made it yet: the lease is open later (lease.c) */
    if (s == NATS_OK || !create)
        return s == NATS_OK ? KEEL_OK : nats_fail(s, 0, "cannot open the lease bucket %s", KR_LEASE_BUCKET);
    kvConfig c;
    kvConfig_Init(&c);
    c.Bucket = KR_LEASE_BUCKET;
    c.History = 1;
    c.StorageType = js_FileStorage;
    c.Replicas = (int)replicas_for(n);
    KR_RETRY(n, s, none, js_CreateKeyValue(&n->kv, n->js, &c));
    if (s == NATS_OK)
        return KEEL_OK;
    return nats_fail(s, 0, "cannot create the lease bucket %s", KR_LEASE_BUCKET);
}

static int world_check(const char *world)
{
    return name_ok(world) ? KEEL_OK
                          : core_fail(KEEL_EINVAL, "the world's name '%s' is not 1 to %u letters, digits, '-' or '_'",
                                      world ? world : "", KR_WORLD_MAX);
}

int kr_check(const char *urls, const char *world)
{
    int rc = world_check(world);
    kr_node *n = rc ? NULL : calloc(1, sizeof *n); /* split_urls' buffers */
    if (!rc && !n)
        return core_fail(KEEL_ENOMEM, "out of memory checking the NATS address");
    rc = rc ? rc : split_urls(n, urls);
    free(n);
    return rc;
}

int kr_connect(const kr_desc *d, kr_node **out)
{
    *out = NULL;
    int bad = world_check(d ? d->world : NULL);
    if (bad)
        return bad;
    kr_node *n = calloc(1, sizeof *n);
    if (!n)
        return core_fail(KEEL_ENOMEM, "out of memory connecting to NATS");
    pthread_mutex_init(&n->err_mu, NULL);
    pthread_mutex_init(&n->pipe_mu, NULL);
    pthread_cond_init(&n->pipe_done, NULL);
    snprintf(n->urls_given, sizeof n->urls_given, "%s", d->urls ? d->urls : "");
    snprintf(n->world, sizeof n->world, "%s", d->world);
    n->primary = d->create;
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
    n->session = random64();
    n->timeout_ms = d->timeout_ms > 0 ? d->timeout_ms : 2000;
    n->replicas = d->replicas;
    int rc = split_urls(n, d->urls);
    if (!rc)
        rc = open_conn(n);
    if (!rc && !(d->create && d->later))
        rc = d->create ? kr_make_world(n) : kr_ensure_stream(n, n->stream, n->subject, false);
    if (rc) {
        kr_close(n);
        return rc;
    }
    *out = n;
    return KEEL_OK;
}

/* A primary makes the checkpoint stream and the lease bucket too; any other
 * node looks them up when it first uses them (a round trip each, while a
 * replica bootstraps). */
int kr_make_world(kr_node *n)
{
    int rc = kr_ensure_stream(n, n->stream, n->subject, true);
    if (!rc)
        rc = kr_ensure_stream(n, n->ckpt_stream, n->ckpt_subject, true);
    return rc ? rc : kr_ensure_bucket(n, true);
}

void kr_close(kr_node *n)
{
    if (!n)
        return;
    kr_pipe_close(n);
    kvStore_Destroy(n->kv);
    jsCtx_Destroy(n->js);
    natsConnection_Destroy(n->nc);
    pthread_mutex_destroy(&n->err_mu);
    pthread_mutex_destroy(&n->pipe_mu);
    pthread_cond_destroy(&n->pipe_done);
    free(n);
}

const char *kr_world(const kr_node *n)
{
    return n->world;
}

size_t kr_max_payload(kr_node *n)
{
    int64_t m = natsConnection_GetMaxPayload(n->nc);
    return m > 0 ? (size_t)m : 0;
}

int64_t kr_timeout_ms(const kr_node *n)
{
    return n->timeout_ms;
}

const char *kr_node_id(const kr_node *n)
{
    return n->node;
}

/* A stream's bounds: first and last sequence (0, 0 when empty). */
typedef struct kr_stream_state {
    uint64_t first, last;
} kr_stream_state;

static int stream_state(kr_node *n, const char *stream, kr_stream_state *out)
{
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s;
    KR_RETRY(n, s, jerr, js_GetStreamInfo(&si, n->js, stream, NULL, &jerr));
    if (s != NATS_OK)
        return nats_fail(s, jerr, "cannot read the state of stream %s", stream);
    /* a stream purged of every message still ends where it did: its first is the next sequence */
    uint64_t last = si->State.LastSeq;
    *out = (kr_stream_state){.first = si->State.Msgs ? si->State.FirstSeq : last ? last + 1 : 0, .last = last};
    saw_stream(n, stream, si);
    jsStreamInfo_Destroy(si);
    return KEEL_OK;
}

int kr_bounds(kr_node *n, uint64_t *first, uint64_t *last)
{
    return kr_stream_bounds(n, n->stream, first, last);
}

int kr_stream_bounds(kr_node *n, const char *stream, uint64_t *first, uint64_t *last)
{
    kr_stream_state st = {0};
    int rc = stream_state(n, stream, &st);
    if (!rc) {
        *first = st.first;
        *last = st.last;
    }
    return rc;
}

int kr_msg_at(kr_node *n, const char *stream, uint64_t seq, natsMsg **m)
{
    jsErrCode jerr = 0;
    natsStatus s;
    *m = NULL;
    KR_RETRY(n, s, jerr, js_GetMsg(m, n->js, stream, seq, NULL, &jerr));
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return core_fail(KEEL_ENOENT, "stream %s holds no message %" PRIu64, stream, seq);
    if (s != NATS_OK)
        return nats_fail(s, jerr, "cannot read a message of stream %s", stream);
    return KEEL_OK;
}

/* The WAL stream's message at seq: *m to destroy. */
static int get_msg(kr_node *n, uint64_t seq, natsMsg **m)
{
    return kr_msg_at(n, n->stream, seq, m);
}

int kr_last_msg(kr_node *n, const char *stream, const char *subject, natsMsg **m)
{
    jsErrCode jerr = 0;
    natsStatus s;
    *m = NULL;
    KR_RETRY(n, s, jerr, js_GetLastMsg(m, n->js, stream, subject, NULL, &jerr));
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr || jerr == JSStreamNotFoundErr)
        return KEEL_ENOENT;
    if (s != NATS_OK)
        return nats_fail(s, jerr, "cannot read stream %s", stream);
    return KEEL_OK;
}

/* The epoch and LSN in a message's id ("<epoch>:<lsn>:<session>",
 * msg_id; "<epoch>:<lsn>" from a keel before sessions); both 0 when it has
 * none. */
static void parse_id(natsMsg *m, uint64_t *epoch, uint64_t *lsn)
{
    const char *id = NULL;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || !id ||
        sscanf(id, "%" SCNu64 ":%" SCNu64, epoch, lsn) != 2)
        *epoch = *lsn = 0;
}

int kr_get_epoch(kr_node *n, uint64_t seq, kw_buf *out, uint64_t *epoch)
{
    natsMsg *m = NULL;
    int rc = get_msg(n, seq, &m);
    if (rc)
        return rc;
    out->len = 0;
    rc = kw_put_bytes(out, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
    uint64_t lsn;
    if (epoch)
        parse_id(m, epoch, &lsn);
    natsMsg_Destroy(m);
    return rc;
}

int kr_get(kr_node *n, uint64_t seq, kw_buf *out)
{
    return kr_get_epoch(n, seq, out, NULL);
}

/* A record's message id: "<epoch>:<lsn>:<session>". JetStream drops a
 * message whose id it saw within its duplicate window and acknowledges it
 * as stored, before it checks the expected last sequence: so a retry of
 * this node's own publish is harmless, and the session makes sure that no
 * other node's publish is ever taken for this one's (two nodes in the same
 * epoch at the same LSN -- a deterministic world writes the same bytes). */
static void msg_id(const kr_node *n, uint64_t epoch, uint64_t lsn, char *id, size_t cap)
{
    snprintf(id, cap, "%" PRIu64 ":%" PRIu64 ":%016" PRIx64, epoch, lsn, n->session);
}

/* The message id stored at seq ("" when it has none). */
static int stored_id(kr_node *n, uint64_t seq, char *id, size_t cap)
{
    natsMsg *m = NULL;
    int rc = get_msg(n, seq, &m);
    if (rc)
        return rc;
    const char *v = NULL;
    snprintf(id, cap, "%s", natsMsgHeader_Get(m, "Nats-Msg-Id", &v) == NATS_OK && v ? v : "");
    natsMsg_Destroy(m);
    return KEEL_OK;
}

natsStatus kr_publish_expecting(kr_node *n, const char *subject, const void *data, size_t len, jsPubOptions *po,
                                jsPubAck **pa, jsErrCode *jerr)
{
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subject, NULL, data, (int)len);
    /* the client sends no expectation of an empty stream (ExpectLastSeq 0): the header says it */
    if (s == NATS_OK && !po->ExpectLastSeq)
        s = natsMsgHeader_Set(m, "Nats-Expected-Last-Sequence", "0");
    if (s == NATS_OK)
        s = js_PublishMsg(pa, n->js, m, po, jerr);
    natsMsg_Destroy(m);
    return s;
}

int kr_publish(kr_node *n, uint64_t epoch, uint64_t lsn, const void *rec, size_t len)
{
    char id[64];
    msg_id(n, epoch, lsn, id, sizeof id);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id;
    po.ExpectStream = n->stream;
    po.ExpectLastSeq = lsn - 1;
    po.MaxWait = n->timeout_ms;
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    /* LSN 1 expects an empty stream: two primaries of a new world cannot both append one */
    natsStatus s = kr_publish_expecting(n, n->subject, rec, len, &po, &pa, &jerr);
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

/* Is the stream's message at seq this node's record of that LSN? */
static int ours_at(kr_node *n, uint64_t epoch, uint64_t seq, bool *ours)
{
    char want[64], got[64];
    int rc = stored_id(n, seq, got, sizeof got);
    msg_id(n, epoch, seq, want, sizeof want);
    *ours = !rc && !strcmp(got, want);
    return rc;
}

/* After a failure in the pipeline: how far the stream holds *this node's*
 * records. Every record sent but the first expected the stream's last
 * message id to be this node's record of the LSN before it, and the first
 * expected the sequence `before` (this node's, acknowledged): so if this
 * node's record stands at some position, all positions from `before` up to
 * it hold this node's records too -- they form a prefix, found with a
 * binary search over the message ids. A position past that prefix up to
 * the stream's end holds another primary's record: fenced. */
static int settle(kr_node *n, uint64_t epoch, uint64_t before, uint64_t last, uint64_t *acked)
{
    uint64_t first, end;
    *acked = before;
    int rc = kr_bounds(n, &first, &end);
    uint64_t k = end < last ? end : last, lo = before, hi = k; /* ours up to lo; beyond hi not ours */
    bool ours = false;
    while (!rc && lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if ((rc = ours_at(n, epoch, mid, &ours)))
            break;
        if (ours)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (rc)
        return rc;
    *acked = lo;
    if (lo < k) /* the stream holds a record at lo + 1, and it is not this node's */
        return core_fail(KEEL_EFENCED, "fenced: stream %s holds another primary's record at LSN %" PRIu64
                                       " (this node's epoch %" PRIu64 ")", n->stream, lo + 1, epoch);
    if (*acked < last)
        return core_fail(KEEL_EUNAVAILABLE, "stream %s acknowledged LSN %" PRIu64 " of %" PRIu64, n->stream, *acked,
                         last);
    return KEEL_OK;
}

/* Forget the publishes of js still waiting for an acknowledgement (a late
 * acknowledgement of a dropped one is discarded: settle reads what the
 * stream holds instead); how many were dropped. */
static uint64_t drop_pending(jsCtx *js)
{
    natsMsgList pending;
    if (js_PublishAsyncGetPendingList(&pending, js) != NATS_OK)
        return 0;
    uint64_t k = (uint64_t)pending.Count;
    natsMsgList_Destroy(&pending);
    return k;
}

void kr_drop_pending(kr_node *n)
{
    (void)drop_pending(n->js);
}

/* An acknowledgement of the pipeline (a NATS thread): the message's LSN is
 * in its id; stored means stored at that sequence. Every message the
 * context took is resolved once: here, or dropped (kr_pipe_settle,
 * kr_pipe_close), which kr_pipe_close waits for. */
static void on_pipe_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
    (void)js;
    kr_node *n = closure;
    uint64_t epoch, lsn;
    parse_id(msg, &epoch, &lsn);
    bool ok = pa && !pae && lsn && pa->Sequence == lsn;
    natsMsg_Destroy(msg);
    pthread_mutex_lock(&n->pipe_mu);
    if (n->pipe_fn)
        n->pipe_fn(n->pipe_arg, lsn, ok);
    n->pipe_resolved++;
    pthread_cond_broadcast(&n->pipe_done);
    pthread_mutex_unlock(&n->pipe_mu);
}

int kr_pipe_open(kr_node *n, kr_ack_fn fn, void *arg)
{
    if (n->pipe)
        return core_fail(KEEL_EINVAL, "world '%s' already has a WAL pipeline on this connection", n->world);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = n->timeout_ms;
    jo.PublishAsync.AckHandler = on_pipe_ack;
    jo.PublishAsync.AckHandlerClosure = n;
    jo.PublishAsync.MaxPending = KR_PIPE_MAX * 2; /* the publisher keeps fewer in flight: never stalls here */
    natsStatus s = natsConnection_JetStream(&n->pipe, n->nc, &jo);
    if (s != NATS_OK)
        return nats_fail(s, 0, "NATS at %s offers no JetStream", n->urls_given);
    pthread_mutex_lock(&n->pipe_mu);
    n->pipe_fn = fn;
    n->pipe_arg = arg;
    n->pipe_sent = n->pipe_resolved = 0; /* a new context: no pending table until it sends */
    pthread_mutex_unlock(&n->pipe_mu);
    return KEEL_OK;
}

int kr_pipe_send(kr_node *n, uint64_t epoch, uint64_t lsn, bool chained, const void *rec, size_t len)
{
    char id[64], prev[64];
    msg_id(n, epoch, lsn, id, sizeof id);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id;
    po.ExpectStream = n->stream;
    po.ExpectLastSeq = lsn - 1;
    po.MaxWait = n->timeout_ms; /* no acknowledgement in time: the handler hears a timeout */
    if (chained) { /* a sequence alone would let it line up behind another primary's record */
        msg_id(n, epoch, lsn - 1, prev, sizeof prev);
        po.ExpectLastMsgId = prev;
    }
    natsStatus s = js_PublishAsync(n->pipe, n->subject, rec, (int)len, &po);
    if (s != NATS_OK)
        return nats_fail(s, 0, "cannot publish to stream %s", n->stream);
    pthread_mutex_lock(&n->pipe_mu);
    n->pipe_sent++;
    pthread_mutex_unlock(&n->pipe_mu);
    return KEEL_OK;
}

/* Drop the pipeline's pending publishes; they resolve as dropped. Only
 * once one was made: libnats makes the table of pending publishes at the
 * first, and reading the pending list before that crashes (3.4). */
static void pipe_drop(kr_node *n)
{
    pthread_mutex_lock(&n->pipe_mu);
    bool any = n->pipe_sent > 0;
    pthread_mutex_unlock(&n->pipe_mu);
    uint64_t k = any ? drop_pending(n->pipe) : 0;
    pthread_mutex_lock(&n->pipe_mu);
    n->pipe_resolved += k;
    pthread_mutex_unlock(&n->pipe_mu);
}

int kr_pipe_settle(kr_node *n, uint64_t epoch, uint64_t before, uint64_t last, uint64_t *acked)
{
    pipe_drop(n);
    return settle(n, epoch, before, last, acked);
}

void kr_pipe_close(kr_node *n)
{
    if (!n->pipe)
        return;
    pthread_mutex_lock(&n->pipe_mu);
    n->pipe_fn = NULL;
    pthread_mutex_unlock(&n->pipe_mu);
    pipe_drop(n);
    /* a handler already running finishes before the context goes (bounded: a lost message must not hang a close) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(n->timeout_ms / 1000 + 1);
    pthread_mutex_lock(&n->pipe_mu);
    while (n->pipe_resolved < n->pipe_sent && pthread_cond_timedwait(&n->pipe_done, &n->pipe_mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&n->pipe_mu);
    jsCtx_Destroy(n->pipe);
    n->pipe = NULL;
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
    const char *stream, *subject;
    natsSubscription *sub;
    natsMsg *msg;
    uint64_t next;
    bool wal;                  /* reading the WAL stream, whose identity must not change under it */
    uint64_t id;               /* ... its identity when the reader began */
    bool begun;                /* subscribed once: a later subscription is made again */
    int failed;                /* a subscription made again failed (no consumer since): its code */
    bool rewound;              /* kr_read_rewind: the next read subscribes again at `next` */
    uint64_t seen_last;        /* the stream's last sequence as the last message delivered said */
    uint64_t nread, bytes_read; /* messages given and their bytes: their mean size */
    uint64_t epoch;            /* the highest epoch the ids of the WAL messages given name */
};

int kr_read_begin(kr_node *n, uint64_t from, kr_reader **out)
{
    return kr_read_begin_on(n, n->stream, n->subject, from, out);
}

/* Drop r's consumer, if any. */
static void drop_consumer(kr_reader *r)
{
    if (r->sub) {
        natsSubscription_Unsubscribe(r->sub);
        natsSubscription_Destroy(r->sub);
        r->sub = NULL;
    }
}

/* An ordered consumer from r->next on (a previous one is dropped). A
 * consumer made again reads the stream that has the name now: one deleted
 * and made again since the reader began is another stream, refused. */
static int subscribe(kr_reader *r)
{
    drop_consumer(r);
    if (r->begun && r->wal) {
        kr_stream_state st;
        int rc = stream_state(r->n, r->stream, &st);
        if (!rc && kr_stream_id(r->n) != r->id)
            rc = core_fail(KEEL_ECORRUPT, "stream %s was deleted and made again while it was read (identity "
                           "%016" PRIx64 ", now %016" PRIx64 "): another world's records; nothing more read",
                           r->stream, r->id, kr_stream_id(r->n));
        if (rc)
            return r->failed = rc;
    }
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = r->stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverByStartSequence;
    so.Config.OptStartSeq = r->next;
    jsErrCode jerr = 0;
    natsStatus s;
    KR_RETRY(r->n, s, jerr, js_SubscribeSync(&r->sub, r->n->js, r->subject, NULL, &so, &jerr));
    if (s != NATS_OK)
        return r->failed = nats_fail(s, jerr, "cannot read stream %s", r->stream);
    r->begun = true;
    r->failed = KEEL_OK;
    return KEEL_OK;
}

int kr_read_restart(kr_reader *r, uint64_t from)
{
    natsMsg_Destroy(r->msg);
    r->msg = NULL;
    r->next = from ? from : 1;
    r->rewound = false;
    return subscribe(r);
}

int kr_read_begin_on(kr_node *n, const char *stream, const char *subject, uint64_t from, kr_reader **out)
{
    kr_reader *r = calloc(1, sizeof *r);
    if (!r)
        return core_fail(KEEL_ENOMEM, "out of memory reading stream %s", stream);
    r->n = n;
    r->stream = stream;
    r->subject = subject;
    r->next = from ? from : 1;
    r->wal = !strcmp(stream, n->stream);
    r->id = kr_stream_id(n);
    int rc = subscribe(r);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return KEEL_OK;
}

/* A message other than r->next came. Before it: a redelivery, skipped.
 * After it while the stream still holds r->next: the consumer skipped
 * messages (an ordered consumer recreated across a server's loss), so it is
 * made again at r->next. After it and r->next is gone: purged. */
static int out_of_order(kr_reader *r, uint64_t got)
{
    if (got < r->next)
        return 0;
    uint64_t first, last;
    natsMsg *m = NULL;
    int rc = kr_stream_bounds(r->n, r->stream, &first, &last);
    if (!rc && first && first <= r->next && r->next <= last && (rc = kr_msg_at(r->n, r->stream, r->next, &m)) == 0) {
        natsMsg_Destroy(m);
        return subscribe(r);
    }
    if (rc && rc != KEEL_ENOENT)
        return rc;
    /* r->next is gone: purged before it, or deleted from inside the stream */
    return core_fail(KEEL_ECORRUPT, "stream %s has a gap: message %" PRIu64 " came where %" PRIu64
                                    " was expected (purged, deleted, or not a keel stream)", r->stream, got, r->next);
}

void kr_read_rewind(kr_reader *r, uint64_t from)
{
    natsMsg_Destroy(r->msg);
    r->msg = NULL;
    drop_consumer(r);
    r->next = from ? from : 1;
    r->rewound = true;
}

int kr_read_next(kr_reader *r, int64_t timeout_ms, uint64_t *seq, const void **data, size_t *len)
{
    natsMsg_Destroy(r->msg);
    r->msg = NULL;
    if (!r->sub && r->rewound) { /* a failure here leaves it rewound: the next read tries again */
        int rc = subscribe(r);
        if (rc)
            return rc;
        r->rewound = false;
    }
    if (!r->sub) /* a subscription made again failed (r->failed): no consumer until kr_read_restart makes one */
        return core_fail(r->failed, "stream %s: its reader has no consumer since a failure (%s)", r->stream,
                         keel_strerror(r->failed));
    int queued = 0, qbytes;
    if (timeout_ms <= 0 && natsSubscription_GetPending(r->sub, &queued, &qbytes) == NATS_OK && !queued)
        return 0; /* nothing delivered yet, and no wait wanted (a failure: NextMsg says which) */
    natsStatus s = natsSubscription_NextMsg(&r->msg, r->sub, timeout_ms > 0 ? timeout_ms : 1);
    if (s == NATS_TIMEOUT)
        return 0;
    if (s != NATS_OK)
        return nats_fail(s, 0, "reading stream %s failed", r->stream);
    jsMsgMetaData *md = NULL;
    if ((s = natsMsg_GetMetaData(&md, r->msg)) != NATS_OK)
        return nats_fail(s, 0, "a message of stream %s has no metadata", r->stream);
    /* the stream holds one subject, the reader's: what is pending after this message is the rest of it */
    uint64_t got = md->Sequence.Stream, last = got + md->NumPending;
    jsMsgMetaData_Destroy(md);
    if (got != r->next)
        return out_of_order(r, got); /* 0: nothing now, the caller reads again */
    r->next++;
    r->seen_last = last > r->seen_last ? last : r->seen_last;
    *seq = got;
    *data = natsMsg_GetData(r->msg);
    *len = (size_t)natsMsg_GetDataLength(r->msg);
    r->nread++;
    r->bytes_read += *len;
    if (r->wal) {
        uint64_t epoch, lsn;
        parse_id(r->msg, &epoch, &lsn);
        r->epoch = epoch > r->epoch ? epoch : r->epoch;
    }
    return 1;
}

bool kr_read_more_sent(const kr_reader *r)
{
    return r->seen_last >= r->next;
}

void kr_read_seen(const kr_reader *r, uint64_t *stream_last, double *mean_bytes, uint64_t *epoch)
{
    *stream_last = r->seen_last;
    *epoch = r->epoch;
    *mean_bytes = r->nread ? (double)r->bytes_read / (double)r->nread : 0;
}

natsMsg *kr_read_take(kr_reader *r)
{
    natsMsg *m = r->msg;
    r->msg = NULL;
    return m;
}

void kr_read_end(kr_reader *r)
{
    if (!r)
        return;
    natsMsg_Destroy(r->msg);
    drop_consumer(r);
    free(r);
}
