/*
 * tests/fuzz/fuzz_reader.c -- libFuzzer target: the reader API of
 * libkeel_wal over a real LMDB store.
 *
 * The input is a list of entries, each `u8 tag, u32 length (LE), length
 * bytes` (a length past the end is cut to the end):
 *
 *   tag & 7 = 0  a WAL value, appended with kw_put_wal. Its LSN is the
 *                record header's (bytes 8..15) when tag bit 3 is set and
 *                that LSN is above the last one, else the last + 1 + gap
 *                with gap = (tag >> 4) & 3;
 *   1 .. 4       a key and value for meta, schema, snap, dict: the bytes
 *                are `u8 key length (1..64), key, value`;
 *   5            the same for the wal database, written with kw_put after
 *                the appends (keys of any length: a damaged directory);
 *   6            the value of meta "checkpoint";
 *   7            the value of schema "components".
 *
 * tests/fuzz/make_corpus.c writes real data directories in this form
 * (tests/fuzz/corpus/reader). Each input is written in one kw_store_write
 * into an emptied store (one directory per process, on tmpfs when
 * /dev/shm is there, or under $KEEL_FUZZ_TMP; the write first deletes
 * every key with kw_del_prefix; a new store starts with a map of 8 pages,
 * so growing it is exercised too). One input in 32 (chosen by the
 * input), and every input that overwrites the format version, is then
 * read through the directory opened read-only (the writer closed first:
 * one LMDB environment per directory and process); the others through the
 * writer's environment, which keeps the target fast. Every reader call
 * is checked against a model of what was written: kw_wal_bounds,
 * kw_wal_iter from several LSNs, kw_scan_begin/next over ranges of LSNs,
 * ticks and kinds, kw_db_iter over every database and snap prefix,
 * kw_get, and every record found is decoded (fz_decode_record) against
 * the stored schema when it decodes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"

#define MAX_ENTRIES 512

typedef struct entry {
    uint32_t db;                   /* kw_db */
    bool append;                   /* kw_put_wal (else kw_put) */
    uint64_t lsn;                  /* append: the key */
    unsigned char kb[8];           /* append: the key, big-endian */
    const unsigned char *key, *val;
    size_t klen, vlen;
} entry;

static struct {
    char dir[512];
    kw_store *writer;              /* open across inputs, closed for a read-only open */
    kw_codec_ctx *codec;
    entry e[MAX_ENTRIES + 1];      /* + meta "format", written by the create */
    size_t n;
    uint32_t *order[KW_DB_COUNT_]; /* per db: the model, indices into e in LMDB key order */
    size_t count[KW_DB_COUNT_];
    uint64_t rng;
} g;

static void remove_store(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/data.mdb", g.dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/lock.mdb", g.dir);
    unlink(path);
}

static void cleanup(void)
{
    kw_store_close(g.writer);
    remove_store();
    rmdir(g.dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *base = getenv("KEEL_FUZZ_TMP");
    struct stat st;
    if (!base || !*base)
        base = !stat("/dev/shm", &st) && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK) ? "/dev/shm"
               : getenv("TMPDIR")                                                            ? getenv("TMPDIR")
                                                                                             : "/tmp";
    snprintf(g.dir, sizeof g.dir, "%s/keel-fuzz-reader-XXXXXX", base);
    FZ_CHECK(mkdtemp(g.dir), "cannot make a directory under %s: %s", base, strerror(errno));
    atexit(cleanup);
    FZ_CHECK(kw_codec_create(NULL, &g.codec) == KEEL_OK, "kw_codec_create failed");
    for (int i = 0; i < KW_DB_COUNT_; i++) {
        g.order[i] = malloc((MAX_ENTRIES + 1) * sizeof *g.order[i]);
        FZ_CHECK(g.order[i], "out of memory");
    }
    return 0;
}

static uint64_t rnd(void)
{
    g.rng ^= g.rng << 13;
    g.rng ^= g.rng >> 7;
    g.rng ^= g.rng << 17;
    return g.rng;
}

/* ---- the input -> entries -> model ------------------------------------------- */

static void be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint64_t rdbe64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void add(uint32_t db, const void *key, size_t klen, const void *val, size_t vlen)
{
    g.e[g.n++] = (entry){.db = db, .key = key, .klen = klen, .val = val, .vlen = vlen};
}

static void parse(const uint8_t *data, size_t size)
{
    static const unsigned char format[4] = {1, 0, 0, 0};
    g.n = 0;
    add(KW_DB_META, KW_META_FORMAT, strlen(KW_META_FORMAT), format, 4); /* what the create writes */
    uint64_t last = 0;
    for (size_t i = 0; i + 5 <= size && g.n < MAX_ENTRIES;) {
        uint8_t tag = data[i];
        size_t len = fz_rd32(data + i + 1);
        i += 5;
        len = len < size - i ? len : size - i;
        const unsigned char *b = data + i;
        i += len;
        uint32_t kind = tag & 7;
        if (kind == 0) {
            uint64_t lsn = last + 1 + ((tag >> 4) & 3);
            if (tag & 8 && len >= 16 && fz_rd64(b + 8) > last)
                lsn = fz_rd64(b + 8);
            if (lsn <= last)
                continue; /* past UINT64_MAX */
            entry *e = &g.e[g.n++];
            *e = (entry){.db = KW_DB_WAL, .append = true, .lsn = lsn, .key = e->kb, .klen = 8, .val = b, .vlen = len};
            be64(e->kb, lsn);
            last = lsn;
        } else if (kind <= 5) {
            if (len < 2)
                continue;
            size_t klen = 1 + (b[0] - 1u) % 64;
            klen = klen < len - 1 ? klen : len - 1;
            static const uint32_t dbs[] = {0, KW_DB_META, KW_DB_SCHEMA, KW_DB_SNAP, KW_DB_DICT, KW_DB_WAL};
            add(dbs[kind], b + 1, klen, b + 1 + klen, len - 1 - klen);
        } else if (kind == 6) {
            add(KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), b, len);
        } else {
            add(KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), b, len);
        }
    }
}

/* LMDB's default key order: memcmp, the shorter first on a tie. */
static int keycmp(const void *a, size_t al, const void *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

/* The writes in the order kw_store_write makes them: appends, other
 * databases, raw wal keys last (an append must stay above every key). */
static bool written_before(const entry *a, const entry *b)
{
    bool ra = a->db == KW_DB_WAL && !a->append, rb = b->db == KW_DB_WAL && !b->append;
    return ra != rb ? rb : a < b;
}

static int by_key_then_write(const void *x, const void *y)
{
    const entry *a = &g.e[*(const uint32_t *)x], *b = &g.e[*(const uint32_t *)y];
    int c = keycmp(a->key, a->klen, b->key, b->klen);
    return c ? c : a == b ? 0 : written_before(a, b) ? -1 : 1;
}

/* Per database, the entries that survive (the last write of each key) in
 * key order. */
static void build_model(void)
{
    for (int db = 0; db < KW_DB_COUNT_; db++) {
        size_t n = 0;
        for (size_t i = 0; i < g.n; i++)
            if (g.e[i].db == (uint32_t)db)
                g.order[db][n++] = (uint32_t)i;
        qsort(g.order[db], n, sizeof *g.order[db], by_key_then_write);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            const entry *a = &g.e[g.order[db][i]];
            if (i + 1 < n && !keycmp(a->key, a->klen, g.e[g.order[db][i + 1]].key, g.e[g.order[db][i + 1]].klen))
                continue; /* overwritten by the next */
            g.order[db][m++] = g.order[db][i];
        }
        g.count[db] = m;
    }
}

/* ---- writing ----------------------------------------------------------------- */

static int put_entry(kw_wtxn *t, const entry *e)
{
    if (e->append)
        return kw_put_wal(t, e->lsn, e->val, e->vlen);
    return kw_put(t, e->db, e->key, e->klen, e->val, e->vlen);
}

static int fill(kw_wtxn *t, void *arg)
{
    (void)arg;
    int rc = KEEL_OK;
    for (size_t i = 1; !rc && i < g.n; i++) /* e[0]: the format, written by the create */
        if (!(g.e[i].db == KW_DB_WAL && !g.e[i].append))
            rc = put_entry(t, &g.e[i]);
    for (size_t i = 1; !rc && i < g.n; i++)
        if (g.e[i].db == KW_DB_WAL && !g.e[i].append)
            rc = put_entry(t, &g.e[i]);
    return rc;
}

/* The writer stays open across inputs (an LMDB environment costs a few MB
 * of allocations, which ASan makes slow); each write empties every
 * database first, then puts the format version back as a create would. */
static int clear_and_fill(kw_wtxn *t, void *arg)
{
    int rc = KEEL_OK;
    for (int db = 0; !rc && db < KW_DB_COUNT_; db++)
        rc = kw_del_prefix(t, db, "", 0, NULL, NULL);
    if (!rc)
        rc = put_entry(t, &g.e[0]);
    return rc ? rc : fill(t, arg);
}

/* A fresh store with a map of 8 pages: the first inputs that need more
 * take kw_store_write's MDB_MAP_FULL path (abort, grow, fill again). */
static void open_writer(void)
{
    remove_store();
    kw_store_desc d = {.flags = KW_OPEN_CREATE, .map_size = 32 << 10, .map_max = 1u << 30};
    FZ_CHECK(kw_store_open(g.dir, &d, &g.writer) == KEEL_OK, "cannot create a store in %s", g.dir);
}

static void write_store(void)
{
    if (!g.writer)
        open_writer();
    int rc = kw_store_write(g.writer, clear_and_fill, NULL);
    FZ_CHECK(rc == KEEL_OK, "writing %zu entries failed: %s", g.n, keel_strerror(rc));
}

/* ---- reading ------------------------------------------------------------------- */

static const entry *model(int db, size_t i)
{
    return &g.e[g.order[db][i]];
}

/* First model index of db whose key is >= key. */
static size_t lower_bound(int db, const void *key, size_t klen)
{
    size_t i = 0;
    while (i < g.count[db] && keycmp(model(db, i)->key, model(db, i)->klen, key, klen) < 0)
        i++;
    return i;
}

static void check_bounds(kw_rtxn *r)
{
    uint64_t first = 0, last = 0, count = 0;
    int rc = kw_wal_bounds(r, &first, &last, &count);
    size_t n = g.count[KW_DB_WAL];
    if (!n) {
        FZ_CHECK(rc == KEEL_ENOENT && count == 0, "kw_wal_bounds of an empty WAL: %s, count %llu", keel_strerror(rc),
                 (unsigned long long)count);
        return;
    }
    FZ_CHECK(count == n, "kw_wal_bounds counts %llu records, the WAL holds %zu", (unsigned long long)count, n);
    const entry *a = model(KW_DB_WAL, 0), *b = model(KW_DB_WAL, n - 1);
    if (a->klen != 8 || b->klen != 8) {
        /* the first or last key is no LSN: there is no bound to give */
        fz_expect_corrupt(rc, false, 0, "kw_wal_bounds with a key that is not 8 bytes");
        return;
    }
    FZ_CHECK(rc == KEEL_OK && first == rdbe64(a->key) && last == rdbe64(b->key),
             "kw_wal_bounds: %s, first %llu last %llu; expected %llu .. %llu", keel_strerror(rc),
             (unsigned long long)first, (unsigned long long)last, (unsigned long long)rdbe64(a->key),
             (unsigned long long)rdbe64(b->key));
}

static void check_wal_iter(kw_rtxn *r, uint64_t from)
{
    kw_walit *it;
    FZ_CHECK(kw_wal_iter(r, from, &it) == KEEL_OK, "kw_wal_iter failed");
    unsigned char kb[8];
    be64(kb, from);
    for (size_t i = lower_bound(KW_DB_WAL, kb, 8);; i++) {
        uint64_t lsn = 0;
        const void *rec = NULL;
        size_t len = 0;
        int rc = kw_wal_next(it, &lsn, &rec, &len);
        if (i == g.count[KW_DB_WAL]) {
            FZ_CHECK(rc == 0, "kw_wal_next past the last key returns %d", rc);
            break;
        }
        const entry *e = model(KW_DB_WAL, i);
        if (e->klen != 8) {
            fz_expect_corrupt(rc, false, 0, "kw_wal_next on a key that is not 8 bytes");
            continue;
        }
        FZ_CHECK(rc == 1 && lsn == rdbe64(e->key) && len == e->vlen && (!len || !memcmp(rec, e->val, len)),
                 "kw_wal_next from %llu: %d, LSN %llu (%zu bytes); expected LSN %llu (%zu bytes)",
                 (unsigned long long)from, rc, (unsigned long long)lsn, len, (unsigned long long)rdbe64(e->key),
                 e->vlen);
    }
    kw_wal_iter_end(it);
}

static bool same_header(const kw_header *a, const kw_header *b)
{
    return a->version == b->version && a->kind == b->kind && a->codec == b->codec && a->lsn == b->lsn &&
           a->tick == b->tick && a->flags == b->flags && a->dict_id == b->dict_id && a->raw_len == b->raw_len &&
           a->stored_len == b->stored_len && a->crc == b->crc;
}

/* What kw_scan_next must say about model entry e: 1 (returned), 0 (past
 * to_lsn: the end), 2 (filtered out) or KEEL_ECORRUPT. */
static int expected(const entry *e, const kw_range *g_, kw_header *h)
{
    if (e->klen != 8)
        return KEEL_ECORRUPT;
    uint64_t lsn = rdbe64(e->key);
    if (g_->to_lsn && lsn > g_->to_lsn)
        return 0;
    if (kw_record_check(e->val, e->vlen, h) || h->lsn != lsn)
        return KEEL_ECORRUPT;
    if (h->tick < g_->from_tick || (g_->to_tick && h->tick > g_->to_tick))
        return 2;
    if (g_->kinds && !(h->kind < 32 && (g_->kinds >> h->kind) & 1))
        return 2;
    return 1;
}

static void check_scan(kw_rtxn *r, const kw_range *range, const kw_schema *schema, bool decode)
{
    kw_scan *sc;
    FZ_CHECK(kw_scan_begin(r, range, &sc) == KEEL_OK, "kw_scan_begin failed");
    unsigned char kb[8];
    be64(kb, range->from_lsn);
    size_t i = lower_bound(KW_DB_WAL, kb, 8);
    for (;;) {
        kw_header h;
        int want = 0;
        while (i < g.count[KW_DB_WAL] && (want = expected(model(KW_DB_WAL, i), range, &h)) == 2)
            i++;
        if (i == g.count[KW_DB_WAL])
            want = 0;
        kw_record out = {0};
        int rc = kw_scan_next(sc, &out);
        if (want == 0) {
            FZ_CHECK(rc == 0, "kw_scan_next [%llu, %llu] returns %d past its end", (unsigned long long)range->from_lsn,
                     (unsigned long long)range->to_lsn, rc);
            break;
        }
        const entry *e = model(KW_DB_WAL, i++);
        if (want == KEEL_ECORRUPT) {
            bool lsn_known = e->klen == 8;
            fz_expect_corrupt(rc, lsn_known, lsn_known ? rdbe64(e->key) : 0, "kw_scan_next on an invalid record");
            FZ_CHECK(!lsn_known || out.lsn == rdbe64(e->key), "kw_scan_next names LSN %llu for LSN %llu",
                     (unsigned long long)out.lsn, (unsigned long long)rdbe64(e->key));
            continue;
        }
        FZ_CHECK(rc == 1 && out.lsn == h.lsn && out.len == e->vlen && !memcmp(out.rec, e->val, e->vlen) &&
                     same_header(&out.h, &h),
                 "kw_scan_next returns %d at LSN %llu, the model expects LSN %llu", rc, (unsigned long long)out.lsn,
                 (unsigned long long)h.lsn);
        if (decode)
            fz_decode_record(g.codec, out.rec, &out.h, schema);
    }
    kw_scan_end(sc);
}

/* kw_db_iter over db with prefix: exactly the model's keys with that
 * prefix, in order, with their last values. */
static void check_db_iter(kw_rtxn *r, int db, const void *prefix, size_t plen, const kw_schema *schema)
{
    kw_walit *it;
    FZ_CHECK(kw_db_iter(r, db, prefix, plen, &it) == KEEL_OK, "kw_db_iter failed");
    size_t i = plen ? lower_bound(db, prefix, plen) : 0;
    for (;; i++) {
        const void *key, *val;
        size_t klen, vlen;
        int rc = kw_db_next(it, &key, &klen, &val, &vlen);
        const entry *e = i < g.count[db] ? model(db, i) : NULL;
        if (!e || (plen && (e->klen < plen || memcmp(e->key, prefix, plen)))) {
            FZ_CHECK(rc == 0, "kw_db_next goes past the prefix (%d)", rc);
            break;
        }
        FZ_CHECK(rc == 1 && klen == e->klen && !memcmp(key, e->key, klen) && vlen == e->vlen &&
                     (!vlen || !memcmp(val, e->val, vlen)),
                 "kw_db_next in db %d gives another key or value than was written", db);
        kw_header h;
        if (db == KW_DB_SNAP && kw_record_check(val, vlen, &h) == KEEL_OK)
            fz_decode_record(g.codec, val, &h, schema);
    }
    kw_wal_iter_end(it);
}

/* kw_get of every model key of db, and of one absent key. */
static void check_gets(kw_rtxn *r, int db)
{
    for (size_t i = 0; i < g.count[db]; i++) {
        const entry *e = model(db, i);
        const void *val;
        size_t vlen;
        int rc = kw_get(r, db, e->key, e->klen, &val, &vlen);
        FZ_CHECK(rc == KEEL_OK && vlen == e->vlen && (!vlen || !memcmp(val, e->val, vlen)), "kw_get in db %d: %s", db,
                 keel_strerror(rc));
    }
    unsigned char absent[65];
    memset(absent, 0xff, sizeof absent); /* longer than any key written, and above them all */
    const void *val;
    size_t vlen;
    FZ_CHECK(kw_get(r, db, absent, sizeof absent, &val, &vlen) == KEEL_ENOENT, "kw_get of an absent key");
}

/* The stored schema, when it is a valid SCHEMA record that decodes. */
static bool load_schema(kw_rtxn *r, kw_schema *s)
{
    const void *val, *payload;
    size_t vlen;
    kw_header h;
    if (kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &val, &vlen) ||
        kw_record_check(val, vlen, &h) || h.kind != KW_KIND_SCHEMA)
        return false;
    fz_decode_record(g.codec, val, &h, NULL); /* walks and round-trips the schema */
    if (kw_record_payload(g.codec, val, &h, &payload) || kw_schema_decode(payload, h.raw_len, s))
        return false;
    fz_check_schema(s, payload, h.raw_len);
    return true;
}

static void check_checkpoint_meta(kw_rtxn *r)
{
    const void *val;
    size_t vlen;
    if (kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &val, &vlen))
        return;
    kw_checkpoint_meta m;
    int rc = kw_checkpoint_meta_decode(val, vlen, &m);
    if (vlen == 32)
        FZ_CHECK(rc == KEEL_OK && m.lsn == fz_rd64((const unsigned char *)val + 8), "meta 'checkpoint' decodes wrong");
    else
        fz_expect_corrupt(rc, false, 0, "kw_checkpoint_meta_decode");
}

/* A few LSNs worth starting from: 0, the keys around the model's ends and
 * middle, and random ones. */
static uint64_t pick_lsn(void)
{
    size_t n = g.count[KW_DB_WAL];
    uint64_t r = rnd();
    if (!n || r % 5 == 0)
        return r % 3 == 0 ? 0 : (r >> 8) % 64;
    const entry *e = model(KW_DB_WAL, (r >> 4) % n);
    uint64_t lsn = e->klen == 8 ? rdbe64(e->key) : 0;
    return lsn + (r >> 12) % 3 - 1;
}

/* Check what the store holds against the model. */
static void read_checks(kw_store *s);

/* Read through a read-only open of the directory for one input in 32
 * (chosen by the input) and whenever the format version was overwritten,
 * else through the writer's environment. The read-only open needs the
 * writer closed (one environment per directory and process, an LMDB
 * rule); it is reopened before the input ends, so that an input's
 * allocations and frees balance (libFuzzer runs a slow leak check after
 * an input with more mallocs than frees). */
static void read_store(void)
{
    const entry *fmt = NULL;
    for (size_t i = 0; i < g.count[KW_DB_META]; i++)
        if (model(KW_DB_META, i)->klen == 6 && !memcmp(model(KW_DB_META, i)->key, KW_META_FORMAT, 6))
            fmt = model(KW_DB_META, i);
    bool format_ok = fmt && fmt->vlen == 4 && !memcmp(fmt->val, "\1\0\0\0", 4);
    if (format_ok && rnd() % 32) {
        read_checks(g.writer);
        return;
    }
    kw_store_close(g.writer);
    g.writer = NULL;
    kw_store *s;
    int rc = kw_store_open(g.dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s);
    if (!format_ok) {
        fz_expect_corrupt(rc, false, 0, "kw_store_open of a directory with a bad format version");
    } else {
        FZ_CHECK(rc == KEEL_OK, "kw_store_open read-only failed");
        read_checks(s);
        kw_store_close(s);
    }
    open_writer();
}

static void read_checks(kw_store *s)
{
    kw_rtxn *r;
    FZ_CHECK(kw_read_begin(s, &r) == KEEL_OK, "kw_read_begin failed");
    kw_schema schema;
    bool have_schema = load_schema(r, &schema);
    check_bounds(r);
    check_wal_iter(r, 0);
    check_wal_iter(r, pick_lsn());
    check_scan(r, &(kw_range){0}, have_schema ? &schema : NULL, true);
    for (int k = 0; k < 3; k++) {
        kw_range range = {.from_lsn = pick_lsn(), .to_lsn = pick_lsn()};
        uint64_t x = rnd();
        range.from_tick = x % 4 == 0 ? (x >> 8) % 8 : 0;
        range.to_tick = x % 3 == 0 ? (x >> 16) % 16 : 0;
        range.kinds = x % 2 ? (uint32_t)(x >> 32) : 0;
        check_scan(r, &range, NULL, false);
    }
    for (int db = 0; db < KW_DB_COUNT_; db++) {
        check_db_iter(r, db, NULL, 0, have_schema ? &schema : NULL);
        check_gets(r, db);
    }
    check_db_iter(r, KW_DB_SNAP, "T", 1, NULL);
    check_db_iter(r, KW_DB_SNAP, "S", 1, NULL);
    check_db_iter(r, KW_DB_SNAP, "C\0\0\0", 4, NULL);
    if (g.count[KW_DB_SNAP]) { /* a prefix cut from a real key */
        const entry *e = model(KW_DB_SNAP, rnd() % g.count[KW_DB_SNAP]);
        size_t plen = 1 + rnd() % (e->klen < 16 ? e->klen : 16);
        check_db_iter(r, KW_DB_SNAP, e->key, plen, NULL);
    }
    kw_walit *it;
    FZ_CHECK(kw_db_iter(r, KW_DB_SNAP, "0123456789abcdefg", 17, &it) == KEEL_EINVAL, "a 17-byte prefix is accepted");
    check_checkpoint_meta(r);
    if (have_schema)
        kw_schema_free(&schema);
    kw_read_end(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g.rng = 0x9E3779B97F4A7C15ull ^ size;
    for (size_t i = 0; i < size && i < 64; i++)
        g.rng = (g.rng ^ data[i]) * 0x100000001B3ull;
    g.rng |= 1;
    parse(data, size);
    build_model();
    write_store();
    read_store();
    return 0;
}
