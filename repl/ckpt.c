/*
 * repl/ckpt.c -- checkpoints published beside the stream, so that a new
 * replica (or one whose directory ends before the stream's start) loads
 * the latest one and tails the stream from its LSN, and so that the stream
 * can be purged up to it.
 *
 * Stream KEEL_<world>_CKPT, subject keel.<world>.ckpt. One checkpoint is a
 * run of messages, each `u8 type | u32 klen | key | value`:
 *   BEGIN   key = the WAL stream's identity (u64; none when it has none),
 *           value = meta "checkpoint" (32 bytes: tick, covered LSN, count)
 *   SCHEMA  value = the schema record (as the schema database holds it);
 *           always the message after BEGIN
 *   ENTRIES no key; value = keys of the snap database in the order a
 *           checkpoint loads (kw_snap_iter: "T", the "S" pages, the "C"
 *           chunks, "K"), each `u32 klen | key | u32 vlen | value` as
 *           stored, as many as fit the server's max_payload (at most
 *           CK_PACK_MAX bytes; a larger key goes alone); one at least
 *   ENTRY   key, value = one key of the snap database (read, not sent)
 *   END     value = u64 sequence of its BEGIN, u64 messages after it
 * A checkpoint counts once its END is stored; the stream keeps the latest
 * (older ones are purged after a newer END). The primary's publisher
 * publishes each checkpoint its directory records, once the WAL stream holds
 * every record it covers. A loader takes only a checkpoint of the WAL
 * stream it reads (by identity): one a deleted stream of the name left is
 * not this stream's. Few large messages rather than one per key: a
 * replica's copy costs per message (delivery, metadata, a wakeup). In load
 * order, a new replica's recovery decodes each message as it arrives
 * (kr_boot), while the transfer goes on.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "repl_internal.h"

enum { CK_BEGIN = 1, CK_ENTRY = 2, CK_SCHEMA = 3, CK_END = 4, CK_ENTRIES = 5 };

/* ENTRIES messages stay this small even where max_payload allows more: a
 * replica holds every message of the checkpoint until its transaction
 * commits, and at this size a 1M-entity checkpoint is about 16 of them,
 * past the point where the cost per message shows. */
#define CK_PACK_MAX (1u << 20)
#define CK_KEY_MAX 511 /* LMDB's key size limit */

typedef struct ck_msgs {
    kw_buf bytes;
    size_t *off;
    uint32_t n, cap;
} ck_msgs;

static int msg_add(ck_msgs *m, uint8_t type, const void *key, size_t klen, const void *val, size_t vlen)
{
    if (CORE_GROW(m->off, m->cap, m->n + 1, 256))
        return core_fail(KEEL_ENOMEM, "out of memory copying a checkpoint for the stream");
    m->off[m->n++] = m->bytes.len;
    int rc = kw_put_u8(&m->bytes, type);
    if (!rc)
        rc = kw_put_u32(&m->bytes, (uint32_t)klen);
    if (!rc)
        rc = kw_put_bytes(&m->bytes, key, klen);
    return rc ? rc : kw_put_bytes(&m->bytes, val, vlen);
}

/* One snap key into the last ENTRIES message, or a new one when it would
 * grow past `limit` bytes. */
static int pack_entry(ck_msgs *m, size_t limit, const void *k, size_t kn, const void *v, size_t vn)
{
    size_t add = 8 + kn + vn, last = m->n ? m->off[m->n - 1] : 0;
    bool fits = m->n && m->bytes.p[last] == CK_ENTRIES && m->bytes.len - last + add <= limit;
    int rc = fits ? KEEL_OK : msg_add(m, CK_ENTRIES, NULL, 0, NULL, 0);
    if (!rc)
        rc = kw_put_u32(&m->bytes, (uint32_t)kn);
    if (!rc)
        rc = kw_put_bytes(&m->bytes, k, kn);
    if (!rc)
        rc = kw_put_u32(&m->bytes, (uint32_t)vn);
    return rc ? rc : kw_put_bytes(&m->bytes, v, vn);
}

static void msgs_free(ck_msgs *m)
{
    kw_buf_free(&m->bytes);
    free(m->off);
}

/* The largest ENTRIES message this connection may publish. */
static size_t pack_limit(kr_node *n)
{
    int64_t max = natsConnection_GetMaxPayload(n->nc);
    return max > 0 && (uint64_t)max < CK_PACK_MAX ? (size_t)max : CK_PACK_MAX;
}

/* The checkpoint the directory records now, as messages (BEGIN, SCHEMA,
 * ENTRIES...), if it covers no LSN beyond `upto`. *meta_lsn 0: none to send. */
static int copy_checkpoint(kw_store *s, uint64_t upto, size_t limit, uint64_t id, ck_msgs *m,
                           kw_checkpoint_meta *meta)
{
    unsigned char key[8];
    kw_buf kb = {key, 0, sizeof key};
    if (id)
        (void)kw_put_u64(&kb, id); /* fits: cannot fail */
    kw_rtxn *r;
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    const void *v, *k;
    size_t vn, kn;
    *meta = (kw_checkpoint_meta){0};
    rc = kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &vn);
    if (!rc && !(rc = kw_checkpoint_meta_decode(v, vn, meta)) && meta->lsn <= upto) {
        rc = msg_add(m, CK_BEGIN, key, kb.len, v, vn);
        if (!rc && !(rc = kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &v, &vn)))
            rc = msg_add(m, CK_SCHEMA, NULL, 0, v, vn);
        kw_walit *it;
        if (!rc && !(rc = kw_snap_iter(r, &it))) {
            while ((rc = kw_db_next(it, &k, &kn, &v, &vn)) == 1)
                if ((rc = pack_entry(m, limit, k, kn, v, vn)))
                    break;
            kw_wal_iter_end(it);
        }
    } else if (!rc) {
        meta->lsn = 0; /* a newer checkpoint than the stream holds records for: its own marker sends it */
    }
    kw_read_end(r);
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

/* The covered LSN of the latest published checkpoint (0: none) and the
 * checkpoint stream's last sequence before it was looked up. */
static int published_state(kr_node *n, uint64_t *covered, uint64_t *last);

int kr_ckpt_publish(kr_node *n, kw_store *s, uint64_t upto, int64_t retain, uint64_t *published_lsn)
{
    ck_msgs m = {0};
    kw_checkpoint_meta meta;
    uint64_t covered = 0, last = 0;
    *published_lsn = 0;
    int rc = kr_ensure_stream(n, n->ckpt_stream, n->ckpt_subject, true);
    if (!rc)
        rc = copy_checkpoint(s, upto, pack_limit(n), kr_stream_id(n), &m, &meta);
    /* none, or one without a schema (nothing a replica could load), or one no newer than the one published
       (a deposed primary's, late: the newer one stays the latest) */
    if (!rc && meta.lsn && m.n >= 2)
        rc = published_state(n, &covered, &last);
    if (rc || !meta.lsn || m.n < 2 || covered >= meta.lsn) {
        msgs_free(&m);
        return rc;
    }
    /* the BEGIN expects the stream as it was looked at: another publication since refuses it */
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.ExpectLastSeq = last;
    jsPubAck *pa = NULL;
    natsStatus st = kr_publish_expecting(n, n->ckpt_subject, m.bytes.p, m.off[1] - m.off[0], &po, &pa, NULL);
    uint64_t begin = st == NATS_OK ? pa->Sequence : 0;
    jsPubAck_Destroy(pa);
    pthread_mutex_lock(&n->err_mu);
    n->async_errors = 0;
    pthread_mutex_unlock(&n->err_mu);
    /* each message after the BEGIN expects the one before it at the stream's end: a message of another
       publication between them (a deposed primary's, late) makes the rest refused, and this publication
       fails whole instead of an older checkpoint's END following a newer one's */
    jsPubOptions chain;
    jsPubOptions_Init(&chain);
    bool pipelined = false; /* libnats has a pending table to drop only after an asynchronous publish */
    for (uint32_t i = 1; i < m.n && st == NATS_OK; i++) {
        size_t end = i + 1 < m.n ? m.off[i + 1] : m.bytes.len;
        chain.ExpectLastSeq = begin + i - 1;
        st = js_PublishAsync(n->js, n->ckpt_subject, (const char *)m.bytes.p + m.off[i], (int)(end - m.off[i]),
                             &chain);
        pipelined |= st == NATS_OK;
    }
    unsigned char tail[16];
    kw_buf t = {tail, 0, sizeof tail};
    kw_put_u64(&t, begin);
    kw_put_u64(&t, m.n - 1);
    ck_msgs endmsg = {0};
    chain.ExpectLastSeq = begin + m.n - 1;
    if (st == NATS_OK && !(rc = msg_add(&endmsg, CK_END, NULL, 0, tail, sizeof tail)))
        st = js_PublishAsync(n->js, n->ckpt_subject, endmsg.bytes.p, (int)endmsg.bytes.len, &chain);
    jsPubOptions wait;
    jsPubOptions_Init(&wait);
    wait.MaxWait = n->timeout_ms * 4;
    natsStatus done = st == NATS_OK ? js_PublishAsyncComplete(n->js, &wait) : st;
    pthread_mutex_lock(&n->err_mu);
    uint32_t errors = n->async_errors;
    pthread_mutex_unlock(&n->err_mu);
    msgs_free(&endmsg);
    msgs_free(&m);
    if (pipelined && (st != NATS_OK || done != NATS_OK || errors))
        kr_drop_pending(n);
    if (!rc && (st != NATS_OK || done != NATS_OK || errors))
        rc = core_fail(KEEL_EUNAVAILABLE, "the checkpoint of tick %" PRIu64 " was not published to stream %s: %s",
                       meta.tick, n->ckpt_stream, natsStatus_GetText(st != NATS_OK ? st : done));
    if (rc)
        return rc;
    *published_lsn = meta.lsn;
    /* the latest checkpoint is all a new replica needs: older ones, and the WAL records before it (but
       `retain` of them), go */
    rc = kr_purge_stream_before(n, n->ckpt_stream, begin);
    if (!rc && retain >= 0 && meta.lsn + 1 > (uint64_t)retain + 1)
        rc = kr_purge_stream_before(n, n->stream, meta.lsn + 1 - (uint64_t)retain);
    return rc;
}

/* ---- loading ----------------------------------------------------------------- */

typedef struct ck_parsed {
    uint8_t type;
    const void *key, *val;
    size_t klen, vlen;
} ck_parsed;

static bool parse(const void *data, size_t len, ck_parsed *out)
{
    kw_cursor c = kw_cursor_make(data, len);
    out->type = kw_get_u8(&c);
    uint32_t kl = kw_get_u32(&c);
    out->key = kw_get_bytes(&c, kl);
    out->klen = kl;
    out->val = c.p;
    out->vlen = c.bad ? 0 : (size_t)(c.end - c.p);
    return !c.bad && out->type >= CK_BEGIN && out->type <= CK_ENTRIES;
}

/* Is msg a checkpoint's END? Then its BEGIN's and its own sequences. */
static bool end_of(natsMsg *msg, uint64_t *begin, uint64_t *end)
{
    ck_parsed p;
    if (!parse(natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg), &p) || p.type != CK_END)
        return false;
    kw_cursor c = kw_cursor_make(p.val, p.vlen);
    *begin = kw_get_u64(&c);
    *end = *begin + kw_get_u64(&c) + 1; /* BEGIN, then SCHEMA and the entries, then END */
    return !c.bad;
}

/* The latest complete checkpoint: the sequences of its BEGIN and its END
 * (0, 0: none). The stream's last message is its END, unless a publication
 * failed part-way since: nothing is purged then, so the complete one before
 * it is still there, and still the latest; the walk back to its END reads
 * the messages of the failed ones (each failed publication stops short of
 * its END; the next successful one purges them). */
static int latest(kr_node *n, uint64_t *begin, uint64_t *end)
{
    *begin = *end = 0;
    natsMsg *msg;
    int rc = kr_last_msg(n, n->ckpt_stream, n->ckpt_subject, &msg);
    if (rc)
        return rc == KEEL_ENOENT ? KEEL_OK : rc;
    uint64_t first, last, seq = natsMsg_GetSequence(msg);
    bool found = end_of(msg, begin, end);
    natsMsg_Destroy(msg);
    if (found || (rc = kr_stream_bounds(n, n->ckpt_stream, &first, &last)))
        return rc;
    while (!found && seq > first && seq-- > 1) {
        if ((rc = kr_msg_at(n, n->ckpt_stream, seq, &msg)) == KEEL_ENOENT)
            continue; /* purged since, or deleted */
        if (rc)
            return rc;
        found = end_of(msg, begin, end);
        natsMsg_Destroy(msg);
    }
    if (!found || *begin < first) /* none complete, or its BEGIN purged since */
        *begin = *end = 0;
    return KEEL_OK;
}

/* One entry of an ENTRIES run (1), the run's end (0), or KEEL_ECORRUPT. */
static int run_next(kw_cursor *c, const void **k, size_t *kn, const void **v, size_t *vn)
{
    if (c->p >= c->end)
        return 0;
    uint32_t kl = kw_get_u32(c);
    *k = kw_get_bytes(c, kl);
    uint32_t vl = kw_get_u32(c);
    *v = kw_get_bytes(c, vl);
    *kn = kl;
    *vn = vl;
    return c->bad || !kl || kl > CK_KEY_MAX ? KEEL_ECORRUPT : 1;
}

/* A published checkpoint being loaded (kr_boot_*). The caller's thread
 * fetches its messages in order (kr_boot_next gives their snap entries one
 * by one) and keeps them; once its verdict is KEEL_OK, a thread of the
 * kr_boot's own (copy_main) writes them all into one write transaction and
 * commits it, in the background, while the caller goes on. The thread
 * starts after the last message was fetched and only reads the kr_boot;
 * kr_boot_settle joins it before anything is freed. */
struct kr_boot {
    kr_node *n;
    kw_store *s;
    kr_reader *r;                  /* closed by kr_boot_end */
    uint64_t begin, end;           /* the sequences of its BEGIN and END */
    kw_checkpoint_meta meta;
    ck_parsed head, schema;        /* its BEGIN and SCHEMA messages */
    ck_parsed entry;               /* an ENTRY message fetched, not yet given (type 0: none) */
    kw_cursor run;                 /* kr_boot_next: the rest of the ENTRIES message it reads */
    natsMsg **msgs;                /* begin .. begin + got - 1 */
    uint32_t got, cap;
    bool ended, copying;           /* kr_boot_end ran; ... and started copy_main */
    pthread_t thread;
    int copied;                    /* the copy's result, and its sentence */
    char why[512];
};

static int corrupt(const kr_boot *b, uint64_t seq, const char *what)
{
    return core_fail(KEEL_ECORRUPT, "stream %s: message %" PRIu64 " %s", b->n->ckpt_stream, seq, what);
}

/* Is a BEGIN's key (8 bytes) the identity of the node's WAL stream? */
static bool of_stream(const kr_node *n, const void *key)
{
    kw_cursor c = kw_cursor_make(key, 8);
    return kw_get_u64(&c) == kr_stream_id(n);
}

/* A BEGIN message's checkpoint meta, if it is one of the node's stream. */
static int begin_meta(kr_node *n, uint64_t seq, const ck_parsed *p, kw_checkpoint_meta *meta)
{
    if (p->klen == 8 && kr_stream_id(n) && !of_stream(n, p->key))
        return core_fail(KEEL_ENOENT, "stream %s holds no checkpoint of stream %s: its latest is of a stream of "
                         "that name deleted before", n->ckpt_stream, n->stream);
    if (kw_checkpoint_meta_decode(p->val, p->vlen, meta))
        return core_fail_prefix(KEEL_ECORRUPT, "stream %s: the checkpoint at %" PRIu64, n->ckpt_stream, seq);
    return KEEL_OK;
}

/* The checkpoint stream's message at seq, parsed into p when it is of
 * `type` (`what` names it), else KEEL_ECORRUPT; *msg (NULL on entry) to
 * destroy in any case. */
static int part_at(kr_node *n, uint64_t seq, uint8_t type, const char *what, natsMsg **msg, ck_parsed *p)
{
    int rc = kr_msg_at(n, n->ckpt_stream, seq, msg);
    if (!rc && (!parse(natsMsg_GetData(*msg), (size_t)natsMsg_GetDataLength(*msg), p) || p->type != type))
        rc = core_fail(KEEL_ECORRUPT, "stream %s: message %" PRIu64 " is no checkpoint's %s", n->ckpt_stream, seq,
                       what);
    return rc;
}

static int published_state(kr_node *n, uint64_t *covered, uint64_t *last)
{
    uint64_t first, begin, end;
    natsMsg *msg = NULL;
    ck_parsed p;
    kw_checkpoint_meta meta;
    *covered = 0;
    int rc = kr_stream_bounds(n, n->ckpt_stream, &first, last);
    if (!rc)
        rc = latest(n, &begin, &end);
    /* one a deleted stream of the name left behind, or one without a readable meta, does not count */
    if (!rc && begin && !(rc = part_at(n, begin, CK_BEGIN, "BEGIN", &msg, &p)) && !begin_meta(n, begin, &p, &meta))
        *covered = meta.lsn;
    natsMsg_Destroy(msg);
    return rc == KEEL_ENOENT || rc == KEEL_ECORRUPT ? KEEL_OK : rc; /* purged since: none to compare with */
}

/* An ENTRIES run into the snap database; nothing of a malformed one counts
 * (the caller's transaction is aborted). */
static int put_entries(kw_wtxn *t, const kr_boot *b, uint64_t seq, const void *val, size_t vlen)
{
    kw_cursor c = kw_cursor_make(val, vlen);
    const void *k, *v;
    size_t kn, vn;
    int rc;
    while ((rc = run_next(&c, &k, &kn, &v, &vn)) == 1)
        if ((rc = kw_put(t, KW_DB_SNAP, k, kn, v, vn)))
            return rc;
    return rc || !vlen ? corrupt(b, seq, "holds a damaged run of checkpoint entries") : KEEL_OK;
}

/* Message seq of the checkpoint into the transaction. */
static int apply(kw_wtxn *t, const kr_boot *b, uint64_t seq, const void *data, size_t len)
{
    ck_parsed p;
    kw_checkpoint_meta meta;
    int rc;
    if (!parse(data, len, &p) || (seq == b->begin) != (p.type == CK_BEGIN) || p.type == CK_END ||
        (p.type == CK_ENTRIES && p.klen))
        return corrupt(b, seq, "is no part of a checkpoint");
    switch (p.type) {
    case CK_BEGIN:
        if ((rc = begin_meta(b->n, seq, &p, &meta)))
            return rc;
        return kw_put(t, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), p.val, p.vlen);
    case CK_SCHEMA:
        return kw_put(t, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), p.val, p.vlen);
    case CK_ENTRY:
        if (!p.klen || p.klen > CK_KEY_MAX)
            return corrupt(b, seq, "holds a checkpoint entry without a valid key");
        return kw_put(t, KW_DB_SNAP, p.key, p.klen, p.val, p.vlen);
    default:
        return put_entries(t, b, seq, p.val, p.vlen);
    }
}

static bool keep_none(const void *key, size_t klen, void *arg)
{
    (void)key, (void)klen, (void)arg;
    return false;
}

static int fill_copy(kw_wtxn *t, void *arg)
{
    const kr_boot *b = arg;
    int rc = kw_del_wal_from(t, 1, NULL);
    if (!rc) /* with the checkpoint: a directory that holds it is the stream's, also after a crash here */
        rc = kr_mark(t, b->n);
    if (!rc)
        rc = kw_del_prefix(t, KW_DB_SNAP, "", 0, keep_none, NULL);
    for (uint32_t i = 0; !rc && i < b->got; i++)
        rc = apply(t, b, b->begin + i, natsMsg_GetData(b->msgs[i]), (size_t)natsMsg_GetDataLength(b->msgs[i]));
    return rc;
}

/* Write the checkpoint into the directory: b->copied, and b->why. */
static void copy(kr_boot *b)
{
    b->copied = b->begin + b->got == b->end
                    ? kw_store_write(b->s, fill_copy, b)
                    : core_fail(KEEL_EINVAL, "stream %s: the checkpoint at %" PRIu64 " was loaded before all its "
                                "messages came", b->n->ckpt_stream, b->begin);
    if (b->copied)
        snprintf(b->why, sizeof b->why, "%s", keel_last_error());
}

static void *copy_main(void *arg)
{
    copy(arg);
    return NULL;
}

/* After a failed read: was the checkpoint purged for a newer one while it
 * was read? Then say so (KEEL_EUNAVAILABLE: the newer one loads next time),
 * rather than the gap it left. */
static bool purged_meanwhile(const kr_boot *b, int rc)
{
    char why[512];
    snprintf(why, sizeof why, "%s", keel_last_error());
    uint64_t begin, end;
    if (latest(b->n, &begin, &end) || !begin || begin == b->begin) {
        core_fail(rc, "%s", why); /* the read's own error stands */
        return false;
    }
    core_fail(KEEL_EUNAVAILABLE, "stream %s: the checkpoint at %" PRIu64 " was purged while it was read, a newer "
              "one published (at %" PRIu64 "): start again to load that one", b->n->ckpt_stream, b->begin, begin);
    return true;
}

/* The checkpoint's next message from the stream, kept in b->msgs. */
static int boot_fetch(kr_boot *b, ck_parsed *p)
{
    uint64_t want = b->begin + b->got, seq;
    const void *data;
    size_t len;
    int got = 0;
    for (int tries = 0; !got && tries < 3; tries++) /* 0 also follows a consumer made again */
        got = kr_read_next(b->r, b->n->timeout_ms, &seq, &data, &len);
    if (got < 0)
        return purged_meanwhile(b, got) ? KEEL_EUNAVAILABLE : got;
    if (!got)
        return core_fail(KEEL_EUNAVAILABLE, "stream %s stopped delivering the checkpoint at %" PRIu64,
                         b->n->ckpt_stream, want);
    if (!parse(data, len, p) || (want == b->begin) != (p->type == CK_BEGIN) || p->type == CK_END ||
        (p->type == CK_ENTRIES && p->klen))
        return corrupt(b, want, "is no part of a checkpoint");
    if (CORE_GROW(b->msgs, b->cap, b->got + 1, 64))
        return core_fail(KEEL_ENOMEM, "out of memory copying a checkpoint from stream %s", b->n->ckpt_stream);
    b->msgs[b->got++] = kr_read_take(b->r);
    return KEEL_OK;
}

/* The checkpoint's next message, fetched and checked: an ENTRY into
 * b->entry, an ENTRIES run into b->run. */
static int next_entries(kr_boot *b)
{
    ck_parsed p;
    int rc = boot_fetch(b, &p);
    uint64_t seq = b->begin + b->got - 1;
    if (rc)
        return rc;
    if (p.type == CK_ENTRY && (!p.klen || p.klen > CK_KEY_MAX))
        return corrupt(b, seq, "holds a checkpoint entry without a valid key");
    if (p.type == CK_ENTRY) {
        b->entry = p;
        return KEEL_OK;
    }
    if (p.type != CK_ENTRIES)
        return corrupt(b, seq, "is out of its place in a checkpoint");
    if (!p.vlen) /* a run holds one entry at least */
        return corrupt(b, seq, "holds a damaged run of checkpoint entries");
    b->run = kw_cursor_make(p.val, p.vlen);
    return KEEL_OK;
}

int kr_boot_next(void *self, const void **key, size_t *klen, const void **val, size_t *vlen)
{
    kr_boot *b = self;
    for (;;) {
        if (b->entry.type == CK_ENTRY) {
            *key = b->entry.key, *klen = b->entry.klen, *val = b->entry.val, *vlen = b->entry.vlen;
            b->entry.type = 0;
            return 1;
        }
        int rc = run_next(&b->run, key, klen, val, vlen);
        if (rc)
            return rc == 1 ? 1 : corrupt(b, b->begin + b->got - 1, "holds a damaged run of checkpoint entries");
        if (b->begin + b->got == b->end)
            return 0;
        if ((rc = next_entries(b)))
            return rc;
    }
}

static void boot_free(kr_boot *b)
{
    kr_read_end(b->r);
    for (uint32_t i = 0; i < b->got; i++)
        natsMsg_Destroy(b->msgs[i]);
    free(b->msgs);
    free(b);
}

/* The checkpoint whose messages are begin..end, its BEGIN and SCHEMA
 * fetched. */
static int boot_begin(kr_node *n, kw_store *s, uint64_t begin, uint64_t end, kr_boot **out)
{
    *out = NULL;
    kr_boot *b = calloc(1, sizeof *b);
    if (!b)
        return core_fail(KEEL_ENOMEM, "out of memory loading a checkpoint from stream %s", n->ckpt_stream);
    *b = (kr_boot){.n = n, .s = s, .begin = begin, .end = end};
    int rc = kr_read_begin_on(n, n->ckpt_stream, n->ckpt_subject, begin, &b->r);
    if (!rc && !(rc = boot_fetch(b, &b->head)))
        rc = begin_meta(b->n, begin, &b->head, &b->meta);
    if (!rc && !(rc = boot_fetch(b, &b->schema)) && b->schema.type != CK_SCHEMA)
        rc = corrupt(b, begin + 1, "is no checkpoint's schema (which follows its BEGIN)");
    if (rc) {
        boot_free(b);
        return rc;
    }
    *out = b;
    return KEEL_OK;
}

/* Does the checkpoint's first snap entry open the load order (its table
 * list)? Its first entries message is fetched for it (kr_boot_next reads
 * it next). A checkpoint sent in plain key order ("C" first) is one an
 * older publisher sent: kr_ckpt_load takes that. */
static int in_load_order(kr_boot *b, bool *yes)
{
    *yes = false;
    if (b->begin + b->got == b->end)
        return KEEL_OK;
    int rc = next_entries(b);
    if (rc)
        return rc;
    const void *k = b->entry.key, *v;
    size_t kn = b->entry.klen, vn;
    kw_cursor peek = b->run;
    if (b->entry.type != CK_ENTRY && run_next(&peek, &k, &kn, &v, &vn) != 1)
        return corrupt(b, b->begin + b->got - 1, "holds a damaged run of checkpoint entries");
    *yes = kn == 1 && *(const char *)k == 'T';
    return KEEL_OK;
}

int kr_boot_begin(kr_node *n, kw_store *s, kr_boot **out)
{
    *out = NULL;
    uint64_t begin, end;
    int rc = latest(n, &begin, &end);
    if (rc || !begin)
        return rc ? rc : core_fail(KEEL_ENOENT, "stream %s holds no complete checkpoint", n->ckpt_stream);
    kr_boot *b;
    bool ordered = false;
    if ((rc = boot_begin(n, s, begin, end, &b)) || (rc = in_load_order(b, &ordered))) {
        kr_boot_settle(b);
        return rc;
    }
    /* the stream continues right after the checkpoint, as kr_connect saw it (purged by hand past it: no) */
    uint64_t first = atomic_load_explicit(&n->seen_first, memory_order_relaxed);
    if (!ordered || b->meta.lsn + 1 < first) {
        kr_boot_settle(b);
        return core_fail(KEEL_ENOENT, "stream %s: the checkpoint at %" PRIu64 " cannot be loaded as it arrives (%s)",
                         n->ckpt_stream, begin, ordered ? "the WAL stream was purged past it" : "not in load order");
    }
    *out = b;
    return KEEL_OK;
}

void kr_boot_info(const kr_boot *b, kr_boot_view *out)
{
    *out = (kr_boot_view){.meta = b->head.val, .meta_len = b->head.vlen, .schema = b->schema.val,
                          .schema_len = b->schema.vlen, .tick = b->meta.tick, .covered = b->meta.lsn};
}

void kr_boot_end(kr_boot *b, int verdict)
{
    if (!b || b->ended)
        return;
    b->ended = true;
    kr_read_end(b->r);
    b->r = NULL;
    if (verdict)
        b->copied = verdict; /* nothing written */
    else if (!(b->copying = !pthread_create(&b->thread, NULL, copy_main, b)))
        copy(b); /* no thread to be had: copied here and now */
}

int kr_boot_settle(kr_boot *b)
{
    if (!b)
        return KEEL_OK;
    kr_boot_end(b, KEEL_EBUSY); /* no verdict given: nothing written */
    if (b->copying)
        pthread_join(b->thread, NULL);
    int rc = b->copied;
    if (rc && b->why[0])
        rc = core_fail(rc, "%s", b->why);
    boot_free(b);
    return rc;
}

int kr_ckpt_head(kr_node *n, kw_checkpoint_meta *meta, kw_buf *schema)
{
    uint64_t begin, end;
    natsMsg *msg = NULL;
    ck_parsed p;
    int rc = latest(n, &begin, &end);
    if (!rc && !begin)
        rc = core_fail(KEEL_ENOENT, "stream %s holds no complete checkpoint", n->ckpt_stream);
    if (!rc && !(rc = part_at(n, begin, CK_BEGIN, "BEGIN", &msg, &p)))
        rc = begin_meta(n, begin, &p, meta);
    natsMsg_Destroy(msg);
    msg = NULL;
    if (!rc && !(rc = part_at(n, begin + 1, CK_SCHEMA, "schema (which follows its BEGIN)", &msg, &p)))
        rc = kw_put_bytes(schema, p.val, p.vlen);
    natsMsg_Destroy(msg);
    return rc;
}

#define LOAD_TRIES 5

/* The checkpoint whose messages are begin..end into s, whole. */
static int load_one(kr_node *n, kw_store *s, uint64_t begin, uint64_t end, uint64_t *covered)
{
    kr_boot *b;
    int rc = boot_begin(n, s, begin, end, &b);
    if (rc)
        return rc;
    const void *k, *v;
    size_t kn, vn;
    while ((rc = kr_boot_next(b, &k, &kn, &v, &vn)) == 1)
        ;
    uint64_t lsn = b->meta.lsn;
    kr_boot_end(b, rc);
    int copied = kr_boot_settle(b);
    if (!rc && !copied)
        *covered = lsn;
    return rc ? rc : copied;
}

int kr_ckpt_load(kr_node *n, kw_store *s, uint64_t *covered)
{
    *covered = 0;
    uint64_t begin, end;
    int rc = latest(n, &begin, &end);
    if (rc || !begin)
        return rc ? rc : core_fail(KEEL_ENOENT, "stream %s holds no complete checkpoint", n->ckpt_stream);
    for (int i = 1;; i++) {
        if (!(rc = load_one(n, s, begin, end, covered)) || i == LOAD_TRIES)
            return rc;
        /* a newer checkpoint published meanwhile purges this one's messages: load that one instead */
        uint64_t b, e;
        if (latest(n, &b, &e) || b == begin || !b)
            return rc;
        begin = b;
        end = e;
    }
}
