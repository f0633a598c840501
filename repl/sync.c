/*
 * repl/sync.c -- a data directory kept in step with the world's stream.
 *
 * The stream is the truth: what a directory holds beyond it never reached
 * a quorum (an async primary's tail, or a crash between the local commit
 * and the publish) and is dropped; what the stream holds beyond the
 * directory is appended byte for byte at the same LSNs. Divergence is only
 * ever a suffix (publishes are in LSN order with an expected last
 * sequence), and it starts where a new primary's epoch does on the stream:
 * the common prefix ends at the last LSN whose record is the same on both
 * sides below the first such start the directory lacks (agreement_limit),
 * found walking back from there.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "repl_internal.h"

/* ---- appending ---------------------------------------------------------------- */

typedef struct append_batch {
    kw_buf bytes;              /* the records back to back */
    size_t *off;               /* where each starts */
    uint32_t n, cap;
    uint64_t first;            /* LSN of the first */
    bool retained;             /* records the directory's checkpoint covers: the WAL alone takes them (the
                                  schema database holds the checkpoint's schema, not theirs) */
} append_batch;

/* Check a stream message as the WAL record of `lsn`. */
static int check_message(uint64_t lsn, const void *rec, size_t len, kw_header *h)
{
    int rc = kw_wal_check(lsn, lsn, rec, len, h, NULL);
    if (rc)
        return core_fail_prefix(KEEL_ECORRUPT, "stream message %" PRIu64 " is not the WAL record of LSN %" PRIu64
                                " (another format, or not a keel stream)", lsn, lsn);
    return KEEL_OK;
}

static int batch_push(append_batch *b, uint64_t lsn, const void *rec, size_t len, kw_header *h)
{
    int rc = check_message(lsn, rec, len, h);
    if (rc)
        return rc;
    if (!b->n)
        b->first = lsn;
    if (CORE_GROW(b->off, b->cap, b->n + 1, 64))
        return core_fail(KEEL_ENOMEM, "out of memory copying the stream");
    b->off[b->n++] = b->bytes.len;
    return kw_put_bytes(&b->bytes, rec, len);
}

static int fill_append(kw_wtxn *t, void *arg)
{
    append_batch *b = arg;
    for (uint32_t i = 0; i < b->n; i++) {
        size_t end = i + 1 < b->n ? b->off[i + 1] : b->bytes.len;
        const unsigned char *rec = (const unsigned char *)b->bytes.p + b->off[i];
        size_t len = end - b->off[i];
        int rc = kw_put_wal(t, b->first + i, rec, len);
        if (!rc && !b->retained && kw_record_peek_kind(rec, len) == KW_KIND_SCHEMA) /* the primary stores its schema there too */
            rc = kw_put(t, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), rec, len);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

static void batch_free(append_batch *b)
{
    kw_buf_free(&b->bytes);
    free(b->off);
}

/* After a message, how long to wait for the next: for the messages the
 * stream already held when it was sent (on their way, however slowly they
 * come), until the call's deadline; not for a record published since (the
 * next call's: waiting for it would delay what has come). 0, taking only
 * what has been delivered, once nothing more was sent, the deadline passed,
 * or for a call that may not wait (deadline 0). */
static int64_t next_wait(const kr_reader *r, uint64_t deadline)
{
    uint64_t now;
    if (!deadline || !kr_read_more_sent(r) || (now = core_now_ns()) >= deadline)
        return 0;
    return (int64_t)((deadline - now + 999999) / 1000000);
}

static int append_from(kr_reader *r, kw_store *s, uint32_t max, int64_t timeout_ms, uint64_t *last,
                       uint64_t *last_tick, bool retained)
{
    append_batch b = {.retained = retained};
    kw_header h = {0};
    int rc = KEEL_OK, got = 0;
    uint64_t seq, deadline = timeout_ms > 0 ? core_now_ns() + (uint64_t)timeout_ms * 1000000u : 0;
    const void *data;
    size_t len;
    for (int64_t wait = timeout_ms; b.n < max && (got = kr_read_next(r, wait, &seq, &data, &len)) == 1;
         wait = next_wait(r, deadline))
        if ((rc = batch_push(&b, seq, data, len, &h)))
            break;
    if (!rc && got < 0)
        rc = got;
    if (!rc && b.n && !(rc = kw_store_write(s, fill_append, &b))) {
        *last = b.first + b.n - 1;
        if (last_tick)
            *last_tick = h.tick;
    }
    if (rc) /* the reader is past messages the directory did not take (a refused one, a failed write) */
        kr_read_rewind(r, *last + 1);
    batch_free(&b);
    return rc;
}

int kr_append_from(kr_reader *r, kw_store *s, uint32_t max, int64_t timeout_ms, uint64_t *last, uint64_t *last_tick)
{
    return append_from(r, s, max, timeout_ms, last, last_tick, false);
}

int kr_append_record(kw_store *s, uint64_t lsn, const void *rec, size_t len)
{
    append_batch b = {0};
    kw_header h;
    int rc = batch_push(&b, lsn, rec, len, &h);
    if (!rc)
        rc = kw_store_write(s, fill_append, &b);
    batch_free(&b);
    return rc;
}

/* ---- the common prefix ---------------------------------------------------------- */

/* Does the directory (read in r) hold the stream's message lsn as `msg`? */
typedef int (*kr_holds_fn)(kw_rtxn *r, uint64_t lsn, const kw_buf *msg);

/* 1 when the stream holds message lsn and `holds` finds it in the
 * directory, 0 when not, or an error. */
static int stream_record_held(kr_node *n, kw_store *s, uint64_t lsn, kw_buf *msg, kr_holds_fn holds)
{
    int rc = kr_get(n, lsn, msg);
    if (rc)
        return rc == KEEL_ENOENT ? 0 : rc;
    kw_rtxn *r;
    if ((rc = kw_read_begin(s, &r)))
        return rc;
    rc = holds(r, lsn, msg);
    kw_read_end(r);
    return rc;
}

/* The directory's WAL record at lsn is msg, byte for byte. */
static int wal_holds(kw_rtxn *r, uint64_t lsn, const kw_buf *msg)
{
    kw_walit *it;
    uint64_t at = 0;
    const void *rec = NULL;
    size_t len = 0;
    int rc = kw_wal_iter(r, lsn, &it);
    if (!rc) {
        rc = kw_wal_next(it, &at, &rec, &len);
        rc = rc == 1 ? (at == lsn && len == msg->len && !memcmp(rec, msg->p, len)) : rc;
        kw_wal_iter_end(it);
    }
    return rc;
}

/* The record a checkpoint last deleted from the front of the directory's
 * WAL (meta "trimmed") is LSN lsn and is msg (by its header, which holds
 * its payload's CRC). */
static int trimmed_holds(kw_rtxn *r, uint64_t lsn, const kw_buf *msg)
{
    uint64_t at;
    const void *header;
    int rc = kw_trimmed_get(r, &at, &header);
    if (rc)
        return rc == KEEL_ENOENT ? 0 : rc;
    return at == lsn && msg->len >= KW_HEADER_SIZE && !memcmp(header, msg->p, KW_HEADER_SIZE);
}

static int local_bounds(kw_store *s, uint64_t *first, uint64_t *last)
{
    kw_rtxn *r;
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    rc = kw_wal_bounds(r, first, last, NULL);
    kw_read_end(r);
    if (rc == KEEL_ENOENT)
        *first = *last = 0;
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

/* The epoch of an EPOCH record (rec, len) at lsn. */
static int epoch_of(kw_codec_ctx *c, uint64_t lsn, const void *rec, size_t len, uint64_t *epoch)
{
    kw_header h;
    const void *payload;
    kw_epoch e;
    int rc = kw_wal_check(lsn, lsn, rec, len, &h, NULL);
    if (!rc)
        rc = kw_record_payload(c, rec, &h, &payload);
    if (!rc)
        rc = kw_epoch_decode(payload, h.raw_len, &e);
    *epoch = rc ? 0 : e.epoch;
    return rc;
}

/* The epoch the directory's record at lsn was written in: that of the last
 * EPOCH record at or below it, in the WAL or deleted from its front (meta
 * "trimmed_epoch"); 0 when there is none (records copied from the stream,
 * a seed's, or a WAL an older keel trimmed). */
static int local_epoch(kw_store *s, uint64_t lsn, uint64_t *epoch)
{
    kw_rtxn *r;
    kw_walit *it = NULL;
    kw_codec_ctx *c = NULL;
    const void *rec = NULL, *last = NULL;
    size_t len = 0, last_len = 0;
    uint64_t at = 0, last_at = 0;
    *epoch = 0;
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    if (!(rc = kw_wal_iter(r, 1, &it))) /* one read of the headers' kind bytes; only EPOCH records decoded */
        while ((rc = kw_wal_next(it, &at, &rec, &len)) == 1 && at <= lsn)
            if (kw_record_peek_kind(rec, len) == KW_KIND_EPOCH)
                last = rec, last_len = len, last_at = at;
    kw_wal_iter_end(it);
    if (rc >= 0 && !last && !(rc = kw_trimmed_epoch_get(r, &last, &last_len)) && last_len >= KW_HEADER_SIZE) {
        kw_header h;
        last_at = kw_record_check(last, last_len, &h) ? 0 : h.lsn;
    }
    if (rc == KEEL_ENOENT || rc == 1)
        rc = KEEL_OK;
    if (!rc && last && last_at && !(rc = kw_codec_create(NULL, &c)))
        rc = epoch_of(c, last_at, last, last_len, epoch);
    kw_codec_destroy(c);
    kw_read_end(r);
    return rc;
}

/* Where the stream and the directory part, searched in (lo, hi], whose
 * ends the stream published in epochs elo <= ehi: 1 and *at, the first LSN
 * there at which the stream's epoch grows and the directory holds another
 * record; 0 when there is none; or an error. Epochs only grow along the
 * stream, so a bisection finds every LSN where one does; at each, the
 * stream holds a new primary's first record (its EPOCH), which the directory
 * holds too unless it went on without it. */
static int first_parting(kr_node *n, kw_store *s, uint64_t lo, uint64_t elo, uint64_t hi, uint64_t ehi,
                         kw_buf *msg, uint64_t *at)
{
    if (elo == ehi)
        return 0;
    if (hi == lo + 1) {
        int rc = stream_record_held(n, s, hi, msg, wal_holds);
        *at = hi;
        return rc < 0 ? rc : !rc;
    }
    uint64_t mid = lo + (hi - lo) / 2, emid;
    int rc = kr_get_epoch(n, mid, msg, &emid);
    if (!rc)
        rc = first_parting(n, s, lo, elo, mid, emid, msg, at);
    return rc ? rc : first_parting(n, s, mid, emid, hi, ehi, msg, at);
}

/* The highest LSN in [bottom, top] below which the directory and the
 * stream cannot part: records are not chained, so a record both hold
 * byte for byte (an idle tick's commit) says nothing of those below it.
 * They part only where a new primary's epoch begins on the stream: at the
 * first such LSN the directory lacks, or -- where the stream was purged
 * to bottom and holds nothing below to compare -- at or below bottom when
 * the directory's epoch there is another (*limit bottom - 1). A seed's
 * messages carry no epoch (KR_SEED_EPOCH: whatever EPOCH records of an
 * earlier stream they hold), nor do messages without an id: they, and a
 * message gone since the bounds were read (purged), bound nothing. */
static int agreement_limit(kr_node *n, kw_store *s, uint64_t sfirst, uint64_t bottom, uint64_t top,
                           kw_buf *msg, uint64_t *limit)
{
    uint64_t lo = sfirst < bottom ? bottom - 1 : bottom, elo, etop, elocal, at;
    int rc = kr_get_epoch(n, lo, msg, &elo);
    if (!rc)
        rc = kr_get_epoch(n, top, msg, &etop);
    *limit = top;
    if (!rc && lo == bottom && bottom > 1 && elo && !(rc = local_epoch(s, bottom, &elocal)) && elocal &&
        elocal != elo) {
        *limit = bottom - 1;
        return KEEL_OK;
    }
    if (!rc && (rc = first_parting(n, s, lo, elo, top, etop, msg, &at)) == 1)
        *limit = at - 1;
    return rc == KEEL_ENOENT || rc == 1 ? KEEL_OK : rc;
}

/* The last LSN the directory and the stream agree on: the highest record
 * both hold byte for byte, below where they part (agreement_limit). A
 * directory whose WAL starts after LSN 1 deleted the records before it at
 * checkpoints (a primary's, only records the stream acknowledged): when no
 * record both hold matches, they agree up to the directory's first LSN - 1
 * if the last record it deleted is the stream's. Otherwise the directory is
 * refused, also when it is marked as the stream's and the stream was
 * purged past where they part: nothing shows where they part, or that it
 * is the same world. */
static int common_prefix(kr_node *n, kw_store *s, uint64_t lfirst, uint64_t llast, uint64_t sfirst,
                         uint64_t slast, uint64_t *out)
{
    uint64_t top = llast < slast ? llast : slast;
    uint64_t bottom = lfirst > sfirst ? lfirst : sfirst;
    *out = 0;
    if (!llast)
        return KEEL_OK;
    kw_buf msg = {0};
    int rc = KEEL_OK;
    if (top >= bottom && slast)
        rc = agreement_limit(n, s, sfirst, bottom, top, &msg, &top);
    for (uint64_t lsn = top; !rc && lsn >= bottom && lsn; lsn--) {
        if ((rc = stream_record_held(n, s, lsn, &msg, wal_holds)) < 0)
            break;
        if (rc == 1) {
            *out = lsn;
            rc = KEEL_OK;
            break;
        }
    }
    if (!rc && !*out && slast && lfirst > 1 && lfirst - 1 <= slast &&
        (rc = stream_record_held(n, s, lfirst - 1, &msg, trimmed_holds)) == 1) {
        *out = lfirst - 1;
        rc = KEEL_OK;
    }
    kw_buf_free(&msg);
    if (rc < 0 || *out || !slast)
        return rc < 0 ? rc : KEEL_OK; /* an empty stream: everything local is beyond it */
    return core_fail(KEEL_ECORRUPT, "directory %s (LSN %" PRIu64 "..%" PRIu64 ") and stream %s (%" PRIu64 "..%" PRIu64
                     ") share no record: another world's directory, or a stream purged past it",
                     kw_store_dir(s), lfirst, llast, n->stream, sfirst, slast);
}

/* The stream starts right after the directory's last record (llast + 1
 * == sfirst), purged up to there: did they part before? They did when the
 * stream's first record is of another epoch than the directory's last --
 * an epoch began on the stream at or below llast that the directory went
 * on without -- or may have, when that record is a new primary's EPOCH
 * record (where the epoch before it ended is purged). Either way nothing
 * shows which of the directory's records the stream holds: *parted, and
 * the directory starts again from the published checkpoint, as one the
 * stream was purged past. A seed's messages and a directory without an
 * epoch bound nothing. */
static int parted_before(kr_node *n, kw_store *s, uint64_t sfirst, uint64_t llast, bool *parted)
{
    kw_buf msg = {0};
    uint64_t es = 0, el = 0;
    int rc = kr_get_epoch(n, sfirst, &msg, &es);
    kw_buf_free(&msg);
    if (rc == KEEL_ENOENT) /* purged since the bounds were read: the next sync sees the new start */
        rc = KEEL_OK, es = 0;
    if (!rc && es)
        rc = local_epoch(s, llast, &el);
    *parted = !rc && es && el && es != el;
    return rc;
}

/* ---- dropping the unreplicated suffix -------------------------------------------- */

typedef struct discard {
    uint64_t from, deleted;
    bool drop_checkpoint;
} discard;

static bool keep_none(const void *key, size_t klen, void *arg)
{
    (void)key, (void)klen, (void)arg;
    return false;
}

static int fill_discard(kw_wtxn *t, void *arg)
{
    discard *d = arg;
    int rc = kw_del_wal_from(t, d->from, &d->deleted);
    if (!rc && d->drop_checkpoint) /* it holds state of dropped records: recovery replays the WAL instead */
        rc = kw_del(t, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT));
    if (!rc && d->drop_checkpoint)
        rc = kw_del_prefix(t, KW_DB_SNAP, "", 0, keep_none, NULL);
    return rc;
}

/* The LSN the directory's checkpoint covers (*lsn 0: none). */
static int checkpoint_covered(kw_store *s, uint64_t *lsn)
{
    kw_rtxn *r;
    const void *v;
    size_t n;
    kw_checkpoint_meta m = {0};
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    rc = kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &n);
    if (!rc)
        rc = kw_checkpoint_meta_decode(v, n, &m);
    kw_read_end(r);
    *lsn = m.lsn;
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

/* A u64 meta value, little-endian as every meta value. */
static int put_meta_u64(kw_wtxn *t, const char *key, uint64_t value)
{
    unsigned char v[8];
    kw_buf b = {v, 0, sizeof v};
    int rc = kw_put_u64(&b, value);
    return rc ? rc : kw_put(t, KW_DB_META, key, strlen(key), v, sizeof v);
}

int kr_mark(kw_wtxn *t, const kr_node *n)
{
    int rc = kw_put(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), n->stream, strlen(n->stream));
    uint64_t id = kr_stream_id(n);
    if (rc)
        return rc;
    return id ? put_meta_u64(t, KW_META_STREAM_ID, id)
              : kw_del(t, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID));
}

static int fill_mark(kw_wtxn *t, void *arg)
{
    return kr_mark(t, arg);
}

/* The directory's mark: whose it is. */
typedef struct dir_mark {
    bool unmarked;             /* no stream's yet */
    uint64_t id;               /* the identity of the stream it was marked with (0: none known) */
} dir_mark;

/* Is the directory marked as the stream's? One marked as another stream's
 * is refused. */
static int check_mark(kr_node *n, kw_store *s, dir_mark *m)
{
    kw_rtxn *r;
    const void *v;
    size_t len;
    *m = (dir_mark){0};
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    rc = kw_get(r, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), &v, &len);
    bool other = !rc && (len != strlen(n->stream) || memcmp(v, n->stream, len));
    m->unmarked = rc == KEEL_ENOENT;
    bool damaged = false;
    if (!rc && !kw_get(r, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID), &v, &len)) {
        kw_cursor c = kw_cursor_make(v, len);
        m->id = kw_get_u64(&c);
        damaged = c.bad || len != 8;
    }
    kw_read_end(r);
    if (other)
        return core_fail(KEEL_ECORRUPT, "directory %s belongs to another stream than %s: nothing written",
                         kw_store_dir(s), n->stream);
    if (damaged)
        return core_fail(KEEL_ECORRUPT, "directory %s: its meta stream_id is damaged (%zu bytes, not 8): nothing "
                         "written", kw_store_dir(s), len);
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

/* The directory holds a world up to end_local and no WAL record the stream
 * holds too (the stream starts right after it, or was purged past it, or
 * the directory holds only a checkpoint). It is the stream's when marked as
 * this stream's -- by its identity: the name alone would also fit a stream
 * made again under it, whose records would replace or continue another
 * world -- or when its checkpoint's last deleted record (meta "trimmed") is
 * the stream's record at end_local. */
static int check_unproven(kr_node *n, kw_store *s, const dir_mark *m, uint64_t llast, uint64_t end_local,
                          uint64_t sfirst, uint64_t slast)
{
    uint64_t id = kr_stream_id(n);
    if (!m->unmarked && (!m->id || m->id == id))
        return KEEL_OK;
    if (!llast && sfirst && sfirst <= end_local && end_local <= slast) {
        kw_buf msg = {0};
        int rc = stream_record_held(n, s, end_local, &msg, trimmed_holds);
        kw_buf_free(&msg);
        if (rc)
            return rc < 0 ? rc : KEEL_OK;
    }
    if (m->unmarked)
        return core_fail(KEEL_ECORRUPT, "directory %s holds a world (to LSN %" PRIu64 ") it never took from stream "
                         "%s, and they share no record: another world's directory; nothing written",
                         kw_store_dir(s), end_local, n->stream);
    char now[32] = "none";
    if (id)
        snprintf(now, sizeof now, "%016" PRIx64, id);
    return core_fail(KEEL_ECORRUPT, "directory %s was kept in step with stream %s identity %016" PRIx64 ", and the "
                     "stream of that name now is another (identity %s) that shares no record with it: nothing "
                     "written (keel-wal detach makes it a world of its own)", kw_store_dir(s), n->stream, m->id,
                     now);
}

/* Replace the directory's checkpoint and WAL with the stream's published
 * checkpoint (*keep: the LSN it covers), or, when none is published and the
 * stream still starts at LSN 1, with nothing (*keep = 0): the records are
 * then all copied from the stream. */
static int restart_from_stream(kr_node *n, kw_store *s, uint64_t sfirst, uint64_t end_local, uint64_t *keep)
{
    int rc = kr_ckpt_load(n, s, keep);
    if (rc == KEEL_ENOENT && sfirst == 1) {
        discard d = {.from = 1, .drop_checkpoint = true};
        *keep = 0;
        return kw_store_write(s, fill_discard, &d);
    }
    if (rc == KEEL_ENOENT && !sfirst)
        return core_fail(KEEL_ERANGE, "stream %s holds no record, and the checkpoint of directory %s covers records "
                         "it never held: start from an empty directory", n->stream, kw_store_dir(s));
    if (rc == KEEL_ENOENT)
        return core_fail(KEEL_ERANGE, "stream %s starts at %" PRIu64 ", after directory %s ends (%" PRIu64 "), and "
                         "no checkpoint is published to restart from", n->stream, sfirst, kw_store_dir(s), end_local);
    return rc;
}

/* ---- a world the stream never held ------------------------------------------------ */

typedef struct seed_mark {
    kr_node *n;
    uint64_t last;             /* the directory's last LSN, to be published */
} seed_mark;

static int fill_seeding(kw_wtxn *t, void *arg)
{
    const seed_mark *m = arg;
    int rc = put_meta_u64(t, KW_META_SEEDING, m->last);
    return rc ? rc : kr_mark(t, m->n);
}

/* The stream never held a record, and the directory holds a world up to
 * end_local -- its only copy (a local world now replicated, or one whose
 * stream was made again). Dropping it, as a directory's records beyond the
 * stream are dropped, would lose the world. A primary keeps it for
 * kr_seed_stream, which publishes it (nothing is written here: the caller
 * decides, holding the lease): only from a WAL that starts at LSN 1, since
 * a stream's sequences start at 1 (JetStream 2.9 can purge an empty stream
 * forward, but then checks an expected last sequence against the old
 * count). Any other node's is left alone: its primary publishes the world. */
static int unstreamed_world(kr_node *n, kw_store *s, uint64_t lfirst, uint64_t llast, uint64_t end_local)
{
    if (!n->primary)
        return KEEL_OK;
    if (lfirst != 1)
        return core_fail(KEEL_ERANGE, "stream %s holds no record, and directory %s holds a world whose WAL starts "
                         "after LSN %" PRIu64 " (checkpoints deleted the records before it): a stream starts at LSN "
                         "1, so it cannot be replicated from this directory; nothing written", n->stream,
                         kw_store_dir(s), llast ? lfirst - 1 : end_local);
    return KEEL_OK;
}

typedef struct seed_acks {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t acked, failed;
} seed_acks;

static void on_seed_ack(void *arg, uint64_t lsn, bool ok)
{
    seed_acks *a = arg;
    (void)lsn;
    pthread_mutex_lock(&a->mu);
    *(ok ? &a->acked : &a->failed) += 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static int fill_seeded(kw_wtxn *t, void *arg)
{
    (void)arg;
    return kw_del(t, KW_DB_META, KW_META_SEEDING, strlen(KW_META_SEEDING));
}

#define SEED_WINDOW 1024    /* records in flight at most: acknowledgements come while more are sent */
#define SEED_SLICE_MS 100   /* progress (the lease's renewal) runs at least this often while waiting */
/* A backstop: each publish fails on its own once the node's timeout passes
 * unanswered (kr_pipe_send), so this fires only if a publish is never
 * resolved at all: no acknowledgement for this many timeouts (30 s by
 * default) means the stream is out of reach. */
#define SEED_STALL_TIMEOUTS 15

typedef struct seed_run {
    seed_acks a;
    int (*progress)(void *arg);
    void *arg;
    uint64_t stall_ns;         /* SEED_STALL_TIMEOUTS of the node's timeout */
    const kr_node *n;
} seed_run;

/* Wait until at most `inflight` sent records are unresolved: 1; 0 when one
 * failed; or an error (progress's, which runs every SEED_SLICE_MS while it
 * waits, or KEEL_EUNAVAILABLE after sr->stall_ns without an
 * acknowledgement). */
static int seed_wait(seed_run *sr, uint64_t sent, uint64_t inflight)
{
    seed_acks *a = &sr->a;
    uint64_t seen = UINT64_MAX, since = core_now_ns();
    pthread_mutex_lock(&a->mu);
    while (!a->failed && sent - a->acked > inflight) {
        if (a->acked != seen)
            seen = a->acked, since = core_now_ns();
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + SEED_SLICE_MS * 1000000ull;
        ts = (struct timespec){(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
        if (pthread_cond_timedwait(&a->cv, &a->mu, &ts) != ETIMEDOUT)
            continue;
        pthread_mutex_unlock(&a->mu);
        int rc = sr->progress ? sr->progress(sr->arg) : KEEL_OK;
        if (!rc && core_now_ns() - since > sr->stall_ns)
            rc = core_fail(KEEL_EUNAVAILABLE, "stream %s acknowledged none of the records published for %" PRIu64
                           " ms", sr->n->stream, sr->stall_ns / 1000000u);
        if (rc)
            return rc;
        pthread_mutex_lock(&a->mu);
    }
    int ok = !a->failed;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

/* A seed from LSN 1 expects an empty stream, which a publish cannot say
 * (an expected last sequence of 0 means none): ask once more, for its
 * bounds and for its message 1. */
static int still_empty(kr_node *n)
{
    uint64_t first, last;
    kw_buf msg = {0};
    int rc = kr_bounds(n, &first, &last);
    if (!rc && !last && (rc = kr_get(n, 1, &msg)) == KEEL_ENOENT)
        rc = KEEL_OK;
    else if (!rc)
        rc = core_fail(KEEL_EFENCED, "stream %s holds records after all: nothing published", n->stream);
    kw_buf_free(&msg);
    return rc;
}

int kr_seed_stream(kr_node *n, kw_store *s, uint64_t from, uint64_t last, int (*progress)(void *arg),
                   void *arg)
{
    seed_run sr = {.a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER},
                   .progress = progress, .arg = arg,
                   .stall_ns = (uint64_t)n->timeout_ms * SEED_STALL_TIMEOUTS * 1000000ull, .n = n};
    int rc = from == 1 ? still_empty(n) : KEEL_OK;
    if (!rc) /* cut short, the next open goes on from the stream's end */
        rc = kw_store_write(s, fill_seeding, &(seed_mark){n, last});
    if (!rc)
        rc = kr_pipe_open(n, on_seed_ack, &sr.a);
    if (rc)
        return rc;
    kw_rtxn *r = NULL;
    kw_walit *it = NULL;
    uint64_t lsn = from - 1, sent = 0;
    int ok = 1;
    if (!(rc = kw_read_begin(s, &r)))
        rc = kw_wal_iter(r, from, &it);
    while (!rc && ok == 1 && lsn < last) {
        uint64_t at = 0;
        const void *rec;
        size_t len;
        int got = kw_wal_next(it, &at, &rec, &len);
        if (got != 1 || at != lsn + 1) {
            rc = got < 0 ? got : core_fail(KEEL_ECORRUPT, "directory %s lacks WAL record %" PRIu64 " to publish",
                                           kw_store_dir(s), lsn + 1);
            break;
        }
        if ((ok = seed_wait(&sr, sent, SEED_WINDOW - 1)) != 1)
            break;
        if (progress && (rc = progress(arg))) /* cheap: it acts on its own clock */
            break;
        /* the first follows the stream's end; each other this node's record before it */
        if ((rc = kr_pipe_send(n, KR_SEED_EPOCH, at, at > from, rec, len)))
            break;
        lsn = at;
        sent++;
    }
    kw_wal_iter_end(it);
    kw_read_end(r);
    if (!rc && ok == 1)
        ok = seed_wait(&sr, sent, 0);
    if (!rc && ok < 0)
        rc = ok;
    uint64_t acked = from - 1;
    if (!rc && (!ok || lsn < last))
        rc = kr_pipe_settle(n, KR_SEED_EPOCH, from - 1, last, &acked);
    kr_pipe_close(n);
    if (!rc)
        rc = kw_store_write(s, fill_seeded, NULL);
    pthread_mutex_destroy(&sr.a.mu);
    pthread_cond_destroy(&sr.a.cv);
    return rc;
}

#define STALL_MS 30000

/* A read that brought nothing new: the consumer made again at last + 1,
 * until the stream has delivered nothing for STALL_MS. */
static int stall(kr_node *n, kr_reader *r, int64_t timeout_ms, int64_t *stalled, uint64_t last, uint64_t end)
{
    *stalled += timeout_ms > 0 ? timeout_ms : 1;
    return *stalled < STALL_MS ? kr_read_restart(r, last + 1)
                               : core_fail(KEEL_EUNAVAILABLE, "stream %s stopped delivering at %" PRIu64 " of %"
                                           PRIu64, n->stream, last, end);
}

static int copy_to(kr_node *n, kr_reader *r, kw_store *s, uint64_t end, int64_t timeout_ms, uint64_t *last,
                   uint64_t *last_tick, bool retained)
{
    int64_t stalled = 0;
    int rc = KEEL_OK;
    while (!rc && *last < end) {
        uint64_t before = *last;
        uint32_t want = end - *last < 4096 ? (uint32_t)(end - *last) : 4096;
        rc = append_from(r, s, want, timeout_ms, last, last_tick, retained);
        if (rc || *last != before)
            stalled = 0;
        else
            rc = stall(n, r, timeout_ms, &stalled, *last, end);
    }
    return rc;
}

int kr_copy_to(kr_node *n, kr_reader *r, kw_store *s, uint64_t end, int64_t timeout_ms, uint64_t *last,
               uint64_t *last_tick)
{
    return copy_to(n, r, s, end, timeout_ms, last, last_tick, false);
}

int kr_sync_boots(kr_node *n, kw_store *s, bool *boots, uint64_t *stream_last)
{
    /* the stream as kr_connect saw it: purged past LSN 1 then, so it is now (also when purged to empty:
       JetStream's first sequence is then the next one; the published checkpoint covers all before it) */
    uint64_t sfirst = atomic_load_explicit(&n->seen_first, memory_order_relaxed), lfirst, llast, covered;
    *stream_last = atomic_load_explicit(&n->seen_last, memory_order_relaxed);
    *boots = false;
    dir_mark mark;
    int rc = check_mark(n, s, &mark); /* another stream's directory, or a damaged mark: refused */
    if (!rc)
        rc = local_bounds(s, &lfirst, &llast);
    if (!rc)
        rc = checkpoint_covered(s, &covered);
    *boots = !rc && !n->primary && !llast && !covered && sfirst > 1;
    return rc;
}

/* The directory's last LSN: its WAL's, or, when a checkpoint deleted the
 * whole WAL (a bootstrapped directory, a replica's checkpoint), the
 * checkpoint's covered LSN, which the next record continues. */
static uint64_t local_end(uint64_t wal_last, uint64_t covered)
{
    return wal_last ? wal_last : covered;
}

/* The tick the WAL record at lsn names (0 when there is none). */
static int record_tick(kw_store *s, uint64_t lsn, uint64_t *tick)
{
    kw_rtxn *r;
    kw_walit *it = NULL;
    const void *rec;
    size_t len;
    uint64_t at;
    kw_header h;
    *tick = 0;
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    if (!(rc = kw_wal_iter(r, lsn, &it)) && (rc = kw_wal_next(it, &at, &rec, &len)) == 1) {
        rc = KEEL_OK;
        if (at == lsn && !kw_record_check(rec, len, &h))
            *tick = h.tick;
    }
    kw_wal_iter_end(it);
    kw_read_end(r);
    return rc == KEEL_ENOENT ? KEEL_OK : rc;
}

int kr_local_end(kw_store *s, kr_local *out)
{
    uint64_t first, wal_last, covered = 0;
    *out = (kr_local){0};
    int rc = local_bounds(s, &first, &wal_last);
    if (!rc)
        rc = checkpoint_covered(s, &covered);
    if (!rc)
        out->last = local_end(wal_last, covered);
    if (!rc && wal_last)
        rc = record_tick(s, wal_last, &out->tick);
    return rc ? rc : local_epoch(s, out->last, &out->epoch);
}

int kr_sync_store(kr_node *n, kw_store *s, uint64_t upto, kr_sync_info *out)
{
    *out = (kr_sync_info){0};
    uint64_t sfirst, slast, lfirst, llast, keep;
    dir_mark mark;
    int rc = kr_bounds(n, &sfirst, &slast);
    if (!rc)
        rc = check_mark(n, s, &mark);
    if (!rc)
        rc = local_bounds(s, &lfirst, &llast);
    if (rc)
        return rc;
    uint64_t covered, end_local;
    if ((rc = checkpoint_covered(s, &covered)))
        return rc;
    end_local = local_end(llast, covered);
    if (!slast && end_local) { /* the stream never held a record: a world of its own, kept or refused */
        if ((rc = unstreamed_world(n, s, lfirst, llast, end_local)))
            return rc;
        *out = (kr_sync_info){.local_last = llast, .seed = n->primary, .unstreamed = !n->primary};
        return KEEL_OK;
    }
    bool restart = sfirst > 1 && end_local + 1 < sfirst;
    if (!restart && llast && llast + 1 == sfirst && (rc = parted_before(n, s, sfirst, llast, &restart)))
        return rc;
    if (restart) {
        /* the stream was purged past this directory, or past where they part: start again from its
           published checkpoint */
        if ((end_local && (rc = check_unproven(n, s, &mark, llast, end_local, sfirst, slast))) ||
            (rc = restart_from_stream(n, s, sfirst, end_local, &keep)))
            return rc;
        out->discarded = llast ? llast - lfirst + 1 : 0;
        out->discarded_from = lfirst;
        out->checkpoint_dropped = true;
        out->bootstrapped = true;
    } else if (!llast || llast + 1 == sfirst) {
        if (end_local && (rc = check_unproven(n, s, &mark, llast, end_local, sfirst, slast)))
            return rc;
        keep = end_local; /* nothing to compare: the stream continues the directory */
    } else if ((rc = common_prefix(n, s, lfirst, llast, sfirst, slast, &keep))) {
        return rc;
    } else if (keep < llast && mark.unmarked) {
        /* a directory never kept in step with the stream loses nothing to it: a record both hold byte for
           byte (the same program's schema, a tick's marker of the same counts) does not make it the
           stream's world */
        return core_fail(KEEL_ECORRUPT, "directory %s holds a world (to LSN %" PRIu64 ") it never took from stream %s, "
                         "which holds other records after LSN %" PRIu64 ": another world's directory; nothing "
                         "written (start this node from an empty directory)", kw_store_dir(s), llast, n->stream,
                         keep);
    } else if (keep < llast && mark.id && mark.id != kr_stream_id(n)) {
        /* records of another stream of the name: a stream made again holds a prefix of them, never
           what they are to be dropped for */
        return core_fail(KEEL_ECORRUPT, "directory %s holds records after LSN %" PRIu64 " that stream %s, made again "
                         "since the directory was kept in step with it, does not: nothing written (keel-wal detach "
                         "makes it a world of its own)", kw_store_dir(s), keep, n->stream);
    }
    int seeding = kw_store_has(s, KW_DB_META, KW_META_SEEDING, strlen(KW_META_SEEDING));
    if (seeding < 0)
        return seeding;
    if (seeding && !out->bootstrapped && keep == slast && slast < llast) {
        /* a seed cut short: the stream holds a prefix of this world and nothing else; the rest is no
           unpublished tail but the world's only copy */
        if (!n->primary)
            return core_fail(KEEL_ERANGE, "directory %s holds a world its primary was publishing to stream %s (LSN %"
                             PRIu64 " of %" PRIu64 " there): start the primary on it first; nothing written",
                             kw_store_dir(s), n->stream, slast, llast);
        *out = (kr_sync_info){.stream_last = slast, .local_last = llast, .seed = true};
        return KEEL_OK;
    }
    /* a seed that ended, or a world another primary went on with: the mark goes */
    if (seeding && (rc = kw_store_write(s, fill_seeded, NULL)))
        return rc;
    out->stream_last = slast;
    if (llast && keep < llast && !out->bootstrapped) {
        discard d = {.from = keep + 1, .drop_checkpoint = covered > keep};
        if ((d.drop_checkpoint && lfirst > 1) || (sfirst && keep + 1 < sfirst)) {
            /* the checkpoint holds dropped state and the WAL before it is deleted (or what is kept ends
               before the stream starts): start again from the stream */
            out->discarded = llast - keep;
            out->discarded_from = keep + 1;
            if ((rc = restart_from_stream(n, s, sfirst, keep, &keep)))
                return rc;
            out->checkpoint_dropped = true;
            out->bootstrapped = true;
        } else {
            if ((rc = kw_store_write(s, fill_discard, &d)))
                return rc;
            out->discarded = d.deleted;
            out->discarded_from = keep + 1;
            out->checkpoint_dropped = d.drop_checkpoint;
        }
    }
    out->local_last = keep;
    if (sfirst && keep + 1 < sfirst)
        return core_fail(KEEL_ERANGE, "stream %s starts at %" PRIu64 ", after directory %s ends (%" PRIu64 ")",
                         n->stream, sfirst, kw_store_dir(s), keep);
    /* the directory is this stream's from here on (an identity it lacked, or a stream made again that
       shares its records, is recorded) */
    if ((mark.unmarked || mark.id != kr_stream_id(n)) && (rc = kw_store_write(s, fill_mark, n)))
        return rc;
    uint64_t end = upto && upto < slast ? upto : slast;
    if (keep >= end)
        return KEEL_OK;
    kr_reader *r;
    if ((rc = kr_read_begin(n, keep + 1, &r)))
        return rc;
    uint64_t last = keep;
    rc = kr_copy_to(n, r, s, end, n->timeout_ms, &last, NULL);
    kr_read_end(r);
    out->appended = last - keep;
    out->local_last = last;
    return rc;
}

/* ---- a whole copy ----------------------------------------------------------------- */

/* Reads the stream on from *at + 1 through its first tick commit at or
 * before `covered` (a purge cuts where it likes, a WAL starts with a whole
 * unit): 1 with *at that commit's LSN, 0 when there is none (*at =
 * covered). */
static int skip_partial_unit(kr_node *n, kr_reader *r, uint64_t covered, uint64_t *at)
{
    int64_t stalled = 0;
    while (*at < covered) {
        uint64_t seq;
        const void *data;
        size_t len;
        int got = kr_read_next(r, n->timeout_ms, &seq, &data, &len), rc;
        if (got < 0)
            return got;
        if (!got && (rc = stall(n, r, n->timeout_ms, &stalled, *at, covered)))
            return rc;
        if (!got)
            continue;
        stalled = 0;
        *at = seq;
        if (kw_record_peek_kind(data, len) == KW_KIND_TICK_COMMIT)
            return 1;
    }
    return 0;
}

/* A directory just started from the published checkpoint (covering LSN
 * `covered`; its WAL empty) takes the records the stream retains up to
 * that LSN, from the first whole unit, as a directory whose checkpoints
 * keep the WAL they cover (wal_retain). One reader goes through them.
 * A purge that takes them while they are read leaves the directory
 * without them; a gap inside them is the stream's damage. */
static int copy_retained(kr_node *n, kw_store *s, uint64_t covered)
{
    uint64_t first, last;
    int rc = kr_bounds(n, &first, &last);
    if (rc || !first || first > covered)
        return rc;
    kr_reader *r;
    if ((rc = kr_read_begin(n, first, &r)))
        return rc;
    uint64_t at = first - 1;
    bool copying = (rc = skip_partial_unit(n, r, covered, &at)) == 1;
    if (copying)
        rc = copy_to(n, r, s, covered, n->timeout_ms, &at, NULL, true);
    kr_read_end(r);
    if (rc == KEEL_ECORRUPT) { /* purged past the next one meanwhile: none of them, not a part */
        int brc = kr_bounds(n, &first, &last);
        if (brc)
            return brc;
        if (first > at + 1)
            rc = copying ? kw_store_write(s, fill_discard, &(discard){.from = 1}) : KEEL_OK;
    }
    return rc;
}

int kr_sync_whole(kr_node *n, kw_store *s, kr_sync_info *out)
{
    bool boots;
    uint64_t slast;
    int rc = kr_sync_boots(n, s, &boots, &slast);
    if (!rc && boots && !(rc = kr_sync_store(n, s, 1, out)) && out->bootstrapped)
        rc = copy_retained(n, s, out->local_last);
    return rc ? rc : kr_sync_store(n, s, 0, out);
}
