/*
 * tests/fuzz/fuzz_common.c -- invariants, payload walks and the change
 * encoder shared by fuzz_record and fuzz_reader (fuzz_common.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

void fz_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: fuzz invariant violated: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  keel_last_error(): %s\n", keel_last_error());
    abort();
}

/* Does s contain "LSN <lsn>" as a whole number (so LSN 1 is not found in
 * "LSN 12")? */
static bool names_lsn(const char *s, uint64_t lsn)
{
    char needle[32];
    int n = snprintf(needle, sizeof needle, "LSN %llu", (unsigned long long)lsn);
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        if (p[n] < '0' || p[n] > '9')
            return true;
    return false;
}

void fz_expect_corrupt(int rc, bool lsn_known, uint64_t lsn, const char *what)
{
    FZ_CHECK(rc == KEEL_ECORRUPT, "%s refused bad input with %s (%d), not KEEL_ECORRUPT", what, keel_strerror(rc), rc);
    FZ_CHECK(keel_last_error()[0], "%s returned KEEL_ECORRUPT without a sentence", what);
    FZ_CHECK(!lsn_known || names_lsn(keel_last_error(), lsn), "%s: the sentence does not name LSN %llu", what,
             (unsigned long long)lsn);
}

uint32_t fz_rd32(const void *p)
{
    const unsigned char *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

uint64_t fz_rd64(const void *p)
{
    return (uint64_t)fz_rd32(p) | (uint64_t)fz_rd32((const unsigned char *)p + 4) << 32;
}

#define FZ_WALK_MAX (16u << 20)

/* Width of one element of a keel_type (docs/wal-format.md), 0 if unknown. */
static uint32_t type_width(uint32_t type)
{
    static const uint8_t w[] = {0, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8, 1, 8, 1};
    return type < sizeof w ? w[type] : 0;
}

/* ---- the corpus generator's schema ------------------------------------------- */

static kw_field f_pos[] = {{"x", 9, 0, 1}, {"y", 9, 4, 1}};
static kw_field f_hp[] = {{"v", 7, 0, 1}};
static kw_field f_cache[] = {{"v", 4, 0, 1}};
static kw_field f_label[] = {{"text", 13, 0, 16}};
static kw_field f_wallet[] = {{"coins", 8, 0, 1}, {"ledger", 4, 8, 1}};
static kw_field f_owner[] = {{"who", 12, 0, 1}};
static kw_field f_bits[] = {{"a", 1, 0, 1}, {"b", 11, 1, 1}, {"c", 2, 2, 1}, {"d", 6, 4, 2}};
static kw_component corpus_comps[] = {
    {1, "pos", 8, 4, 0, 2, f_pos},       {2, "hp", 4, 4, 1, 1, f_hp},         {3, "cache", 8, 8, 2, 1, f_cache},
    {4, "label", 16, 1, 0, 1, f_label},  {5, "marked", 0, 1, 0, 0, NULL},     {6, "wallet", 16, 8, 0, 2, f_wallet},
    {7, "owner", 8, 8, 0, 1, f_owner},   {8, "bits", 8, 4, 1, 4, f_bits},
};
static const kw_schema corpus_schema = {sizeof corpus_comps / sizeof corpus_comps[0], corpus_comps};

const kw_schema *fz_corpus_schema(void)
{
    return &corpus_schema;
}

/* ---- schema ------------------------------------------------------------------- */

/* Read every field of a value the way a tool printing it would, from a copy
 * of exactly `size` bytes: a field the schema places outside the value is
 * an ASan report here. */
static void read_fields(const kw_component *k, const void *value, uint32_t size)
{
    if (!size)
        return;
    unsigned char *v = malloc(size);
    FZ_CHECK(v, "out of memory");
    memcpy(v, value, size);
    volatile unsigned sink = 0;
    for (uint32_t f = 0; f < k->nfields; f++) {
        const kw_field *fd = &k->fields[f];
        size_t bytes = (size_t)type_width(fd->type) * (fd->count ? fd->count : 1);
        for (size_t i = 0; i < bytes; i++)
            sink += v[fd->offset + i];
    }
    (void)sink;
    free(v);
}

void fz_check_schema(const kw_schema *s, const void *payload, size_t len)
{
    FZ_CHECK(s->ncomps <= 255, "a decoded schema has %u components", s->ncomps);
    for (uint32_t i = 0; i < s->ncomps; i++) {
        const kw_component *k = &s->comps[i];
        FZ_CHECK(k->id == i + 1 && kw_schema_get(s, i + 1) == k, "schema component %u has id %u", i + 1, k->id);
        FZ_CHECK(memchr(k->name, 0, sizeof k->name), "schema component %u: name not terminated", k->id);
        FZ_CHECK(k->nfields <= 64 && (k->nfields == 0 || k->fields), "component %u: %u fields", k->id, k->nfields);
        /* What a reader needs to walk a value by its schema (keel refuses
         * to register anything else, src/world/component.c). */
        FZ_CHECK(k->discipline <= 2, "component '%s' has discipline %u", k->name, k->discipline);
        FZ_CHECK(k->size || !k->nfields, "tag component '%s' has %u fields", k->name, k->nfields);
        for (uint32_t f = 0; f < k->nfields; f++) {
            const kw_field *fd = &k->fields[f];
            uint64_t end = fd->offset + (uint64_t)type_width(fd->type) * (fd->count ? fd->count : 1);
            FZ_CHECK(memchr(fd->name, 0, sizeof fd->name), "component '%s': field name not terminated", k->name);
            FZ_CHECK(type_width(fd->type), "component '%s' field '%s' has unknown type %u", k->name, fd->name,
                     fd->type);
            FZ_CHECK(end <= k->size, "component '%s' field '%s' ends at byte %llu, past the %u-byte value", k->name,
                     fd->name, (unsigned long long)end, k->size);
        }
    }
    FZ_CHECK(!kw_schema_get(s, 0) && !kw_schema_get(s, s->ncomps + 1), "kw_schema_get outside the ids");
    kw_buf b = {0};
    FZ_CHECK(kw_schema_encode(s, &b) == KEEL_OK, "kw_schema_encode failed on a decoded schema");
    FZ_CHECK(b.len == len && (!len || !memcmp(b.p, payload, len)),
             "schema round trip: %zu bytes decoded re-encode to %zu different bytes", len, b.len);
    kw_buf_free(&b);
}

/* ---- changes ------------------------------------------------------------------ */

typedef struct change_list {
    fz_change *v;
    size_t n, cap;
} change_list;

static void list_free(change_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].op == KW_OP_SPAWN)
            free((void *)l->v[i].comps); /* one block: comps, sizes, values */
    free(l->v);
}

static void list_push(change_list *l, const fz_change *c)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        FZ_CHECK(l->v, "out of memory");
    }
    l->v[l->n++] = *c;
}

/* A value pointer a decoder returned must lie inside the payload. */
static void check_value(const unsigned char *lo, size_t len, const void *value, uint32_t size, uint64_t lsn)
{
    if (!size)
        return;
    const unsigned char *v = value;
    FZ_CHECK(v && v >= lo && (size_t)(v - lo) <= len && size <= len - (size_t)(v - lo),
             "LSN %llu: a %u-byte value outside the %zu-byte payload", (unsigned long long)lsn, size, len);
    volatile unsigned sink = 0;
    for (uint32_t i = 0; i < size; i++)
        sink += v[i];
    (void)sink;
}

static void check_schema_size(const kw_schema *s, uint32_t comp, uint32_t size, const void *value, uint64_t lsn)
{
    const kw_component *k = kw_schema_get(s, comp);
    FZ_CHECK(k && k->size == size, "LSN %llu: component %u of %u bytes passed the schema check", (unsigned long long)lsn,
             comp, size);
    read_fields(k, value, size);
}

/* Check one decoded change and keep a copy in l (spawn lists are copied:
 * the decoder reuses its arrays). */
static void take_change(change_list *l, uint32_t kind, const kw_change *ch, const unsigned char *payload, size_t len,
                        const kw_schema *schema, uint64_t lsn)
{
    fz_change c = {.op = ch->op, .entity = ch->entity, .component = ch->component, .size = ch->size,
                   .value = ch->value};
    bool lifecycle = kind == KW_KIND_LIFECYCLE;
    FZ_CHECK(lifecycle ? ch->op >= KW_OP_SPAWN && ch->op <= KW_OP_REMOVE : ch->op == KW_OP_SET,
             "LSN %llu: a %s record yields op %u", (unsigned long long)lsn, kw_kind_name(kind), ch->op);
    if (ch->op == KW_OP_SET || ch->op == KW_OP_ADD || ch->op == KW_OP_REMOVE)
        FZ_CHECK(ch->component, "LSN %llu: a change of component 0 was accepted", (unsigned long long)lsn);
    if (ch->op == KW_OP_SET || ch->op == KW_OP_ADD) {
        check_value(payload, len, ch->value, ch->size, lsn);
        FZ_CHECK(ch->op != KW_OP_ADD || ch->size || !ch->value, "LSN %llu: a tag add with a value",
                 (unsigned long long)lsn);
        if (schema)
            check_schema_size(schema, ch->component, ch->size, ch->value, lsn);
    }
    if (ch->op == KW_OP_SPAWN) {
        FZ_CHECK(ch->n <= 255 && (!ch->n || (ch->comps && ch->sizes && ch->values)), "LSN %llu: spawn of %u",
                 (unsigned long long)lsn, ch->n);
        /* one block (freed by list_free through comps): n comps, n sizes, n values */
        size_t n = ch->n ? ch->n : 1;
        uint32_t *comps = malloc(n * (2 * sizeof(uint32_t) + sizeof(void *)) + sizeof(void *));
        FZ_CHECK(comps, "out of memory");
        uint32_t *sizes = comps + n;
        const void **values = (const void **)(sizes + n); /* 8n bytes in: aligned */
        for (uint32_t i = 0; i < ch->n; i++) {
            FZ_CHECK(ch->comps[i], "LSN %llu: a spawn with component 0", (unsigned long long)lsn);
            check_value(payload, len, ch->values[i], ch->sizes[i], lsn);
            if (schema)
                check_schema_size(schema, ch->comps[i], ch->sizes[i], ch->values[i], lsn);
            comps[i] = ch->comps[i];
            sizes[i] = ch->sizes[i];
            values[i] = ch->values[i];
        }
        c.comps = comps;
        c.sizes = sizes;
        c.values = values;
        c.n = ch->n;
    }
    list_push(l, &c);
}

int fz_decode_changes(uint32_t kind, uint64_t lsn, const void *payload, size_t len, const kw_schema *schema,
                      kw_buf *canon)
{
    kw_decoder d;
    int rc = kw_decode_begin(&d, kind, lsn, payload, len, schema);
    if (rc) {
        fz_expect_corrupt(rc, true, lsn, "kw_decode_begin");
        return rc;
    }
    change_list l = {0};
    kw_change ch;
    while ((rc = kw_decode_next(&d, &ch)) == 1) {
        take_change(&l, kind, &ch, payload, len, schema, lsn);
        /* every change consumes at least 8 bytes (an entity): no endless
         * stream from a short payload */
        FZ_CHECK(l.n <= len / 8, "LSN %llu: %zu changes from %zu bytes", (unsigned long long)lsn, l.n, len);
    }
    if (rc) {
        FZ_CHECK(rc < 0, "kw_decode_next returned %d", rc);
        fz_expect_corrupt(rc, true, lsn, "kw_decode_next");
    } else {
        FZ_CHECK(kw_decode_next(&d, &ch) == 0, "kw_decode_next after the end is not the end again");
        if (canon)
            fz_encode(canon, kind, d.side_seq, d.side_mode, l.v, l.n);
    }
    list_free(&l);
    return rc;
}

/* ---- the encoder -------------------------------------------------------------- */

static void put(kw_buf *b, const void *p, size_t n)
{
    FZ_CHECK(kw_put_bytes(b, p, n) == KEEL_OK, "out of memory");
}
static void put32(kw_buf *b, uint32_t v)
{
    unsigned char p[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(b, p, 4);
}
static void put64(kw_buf *b, uint64_t v)
{
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}

static void encode_groups(kw_buf *out, const fz_change *c, size_t n)
{
    uint32_t ngroups = 0;
    for (size_t i = 0; i < n; i++)
        ngroups += !i || c[i].component != c[i - 1].component || c[i].size != c[i - 1].size;
    put32(out, ngroups);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && c[j].component == c[i].component && c[j].size == c[i].size; j++)
            ;
        put32(out, c[i].component);
        put32(out, c[i].size);
        put32(out, (uint32_t)(j - i));
        for (size_t k = i; k < j; k++)
            put64(out, c[k].entity);
        for (size_t k = i; k < j; k++)
            put(out, c[k].value, c[k].size);
    }
}

void fz_encode(kw_buf *out, uint32_t kind, uint64_t seq, uint32_t mode, const fz_change *c, size_t n)
{
    if (kind == KW_KIND_TICK_CHUNK) {
        encode_groups(out, c, n);
        return;
    }
    if (kind == KW_KIND_SIDE) {
        put64(out, seq);
        put32(out, mode);
    }
    put32(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        if (kind == KW_KIND_SIDE) {
            put64(out, c[i].entity);
            put32(out, c[i].component);
            put32(out, c[i].size);
            put(out, c[i].value, c[i].size);
            continue;
        }
        unsigned char op = (unsigned char)c[i].op;
        put(out, &op, 1);
        put64(out, c[i].entity);
        if (c[i].op == KW_OP_SPAWN) {
            put32(out, c[i].n);
            for (uint32_t k = 0; k < c[i].n; k++) {
                put32(out, c[i].comps[k]);
                put32(out, c[i].sizes[k]);
                put(out, c[i].values[k], c[i].sizes[k]);
            }
        } else if (c[i].op == KW_OP_ADD) {
            put32(out, c[i].component);
            put32(out, c[i].size);
            put(out, c[i].value, c[i].size);
        } else if (c[i].op == KW_OP_REMOVE) {
            put32(out, c[i].component);
        }
    }
}

/* ---- records ------------------------------------------------------------------ */

void fz_round_trip_record(kw_codec_ctx *c, uint32_t kind, uint64_t lsn, uint64_t tick, uint32_t flags,
                          const void *payload, size_t len)
{
    kw_buf a = {0}, u = {0};
    FZ_CHECK(kw_record_build(c, &a, kind, lsn, tick, flags, payload, len) == KEEL_OK, "kw_record_build failed");
    FZ_CHECK(kw_record_build_unsealed(c, &u, kind, tick, flags, payload, len) == KEEL_OK, "build_unsealed failed");
    kw_record_seal(u.p, lsn);
    FZ_CHECK(u.len == a.len && !memcmp(u.p, a.p, a.len), "build_unsealed + seal differs from kw_record_build");
    kw_header h;
    int rc = kw_record_check(a.p, a.len, &h);
    FZ_CHECK(rc == KEEL_OK, "a record built by kw_record_build is refused");
    FZ_CHECK(h.kind == kind && h.lsn == lsn && h.tick == tick && h.flags == flags && h.raw_len == len &&
                 h.version == KEEL_WAL_FORMAT_VERSION && h.dict_id == 0 && h.stored_len == a.len - KW_HEADER_SIZE,
             "a built record's header does not give back its fields");
    bool zstd_codec = h.codec == KW_CODEC_ZSTD || (h.codec == KW_CODEC_ZSTD_PLANAR && (kind == KW_KIND_TICK_CHUNK || kind == KW_KIND_SNAP_CHUNK));
    FZ_CHECK(h.codec == KW_CODEC_RAW ? h.stored_len == len : zstd_codec && h.stored_len < len,
             "codec %u stores %u of %zu bytes", h.codec, h.stored_len, len);
    const void *p;
    FZ_CHECK(kw_record_payload(c, a.p, &h, &p) == KEEL_OK, "the payload of a built record does not read back");
    FZ_CHECK(!len || !memcmp(p, payload, len), "a built record's payload reads back different");
    /* any one flipped bit is refused (a CRC32C finds every 1-bit error) */
    size_t bit = (size_t)((lsn ^ tick ^ len) % (a.len * 8));
    a.p[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    rc = kw_record_check(a.p, a.len, &h);
    fz_expect_corrupt(rc, bit >= 32, fz_rd64(a.p + 8), "kw_record_check of a record with a flipped bit");
    kw_buf_free(&a);
    kw_buf_free(&u);
}

/* ---- walking payloads ------------------------------------------------------- */

/* The layouts without a decoder in libkeel_wal (checkpoint marker, snap
 * records) are walked with the cursor, as recovery walks them. */
static void walk_snap(uint32_t kind, const void *payload, size_t len)
{
    kw_cursor c = kw_cursor_make(payload, len);
    if (kind == KW_KIND_SNAP_TABLES) {
        uint32_t ntables = kw_get_u32(&c);
        kw_get_u32(&c);
        kw_get_u32(&c);
        for (uint32_t t = 0; t < ntables && !c.bad; t++) {
            kw_get_u32(&c);
            uint32_t ncols = kw_get_u32(&c);
            kw_get_bytes(&c, (size_t)ncols * 4);
        }
    } else if (kind == KW_KIND_SNAP_SLOTS) {
        kw_get_u32(&c);
        uint32_t n = kw_get_u32(&c);
        kw_get_bytes(&c, (size_t)n * 4);
        kw_get_bytes(&c, n);
    } else if (kind == KW_KIND_SNAP_CHUNK) {
        kw_get_u32(&c);
        kw_get_u32(&c);
        uint32_t count = kw_get_u32(&c), ncols = kw_get_u32(&c);
        uint64_t row = 0;
        for (uint32_t i = 0; i < ncols && !c.bad; i++) {
            kw_get_u32(&c);
            row += kw_get_u32(&c);
        }
        kw_get_bytes(&c, (size_t)count * 8);
        if (row <= len)
            kw_get_bytes(&c, (size_t)count * row);
    } else if (kind == KW_KIND_CHECKPOINT) {
        kw_get_u64(&c);
        kw_get_u64(&c);
    }
    FZ_CHECK(c.p >= (const unsigned char *)payload && c.p <= c.end, "the cursor left its payload");
}

int fz_decode_commit(const void *payload, size_t len)
{
    const unsigned char *p = payload;
    kw_commit_info ci;
    int rc = kw_decode_commit(p, len, &ci);
    if (len != 16) {
        fz_expect_corrupt(rc, false, 0, "kw_decode_commit");
        return rc;
    }
    FZ_CHECK(rc == KEEL_OK && ci.nrecords == fz_rd32(p) && ci.nlive == fz_rd32(p + 4) && ci.nslots == fz_rd32(p + 8),
             "a 16-byte commit marker decodes wrong");
    return rc;
}

/* Decode a change record twice (without, then with the schema) and round
 * trip its canonical encoding through a built record. */
static int decode_change_record(kw_codec_ctx *c, const kw_header *h, const unsigned char *p, const kw_schema *schema)
{
    kw_buf canon = {0};
    int rc = fz_decode_changes(h->kind, h->lsn, p, h->raw_len, NULL, &canon);
    if (rc == KEEL_OK) {
        /* SIDE and LIFECYCLE encodings are canonical; a TICK_CHUNK may
         * group its rows differently (or hold empty groups) */
        if (h->kind != KW_KIND_TICK_CHUNK)
            FZ_CHECK(canon.len == h->raw_len && !memcmp(canon.p, p, canon.len),
                     "LSN %llu: the decoded changes re-encode to different bytes", (unsigned long long)h->lsn);
        fz_round_trip_record(c, h->kind, h->lsn, h->tick, h->flags, canon.p, canon.len);
        kw_buf again = {0};
        FZ_CHECK(fz_decode_changes(h->kind, h->lsn, canon.p, canon.len, NULL, &again) == KEEL_OK &&
                     again.len == canon.len && !memcmp(again.p, canon.p, canon.len),
                 "LSN %llu: re-encoded changes do not decode to the same changes", (unsigned long long)h->lsn);
        kw_buf_free(&again);
    }
    kw_buf_free(&canon);
    if (schema)
        fz_decode_changes(h->kind, h->lsn, p, h->raw_len, schema, NULL);
    return rc;
}

/* SIDES: every transaction is a SIDE payload (decoded as one); the
 * transactions re-encode to the same bytes; a malformed container is
 * KEEL_ECORRUPT naming the LSN. */
static int decode_sides_record(kw_codec_ctx *c, const kw_header *h, const unsigned char *p, const kw_schema *schema)
{
    kw_side_iter it;
    kw_header txn;
    const void *tp;
    kw_buf again = {0};
    uint32_t n = 0;
    FZ_CHECK(kw_sides_begin(&again) == KEEL_OK, "out of memory");
    int rc = kw_side_iter_begin(&it, h, p);
    while (rc == KEEL_OK && (rc = kw_side_iter_next(&it, &txn, &tp)) == 1) {
        const unsigned char *t = tp;
        FZ_CHECK(t >= p + 12 && t + txn.raw_len <= p + h->raw_len && txn.kind == KW_KIND_SIDE &&
                     !(txn.flags & ~KW_FLAG_KEY) && txn.lsn == h->lsn && txn.tick == h->tick,
                 "LSN %llu: a transaction outside its record or with a header of its own", (unsigned long long)h->lsn);
        FZ_CHECK(kw_sides_put(&again, txn.flags, t, txn.raw_len) == KEEL_OK, "out of memory");
        n++;
        decode_change_record(c, &txn, t, schema);
        rc = KEEL_OK;
    }
    if (rc == KEEL_OK) {
        kw_sides_end(&again, n);
        FZ_CHECK(n >= 1 && again.len == h->raw_len && !memcmp(again.p, p, again.len),
                 "LSN %llu: a SIDES record's transactions re-encode to different bytes", (unsigned long long)h->lsn);
        fz_round_trip_record(c, h->kind, h->lsn, h->tick, h->flags, p, h->raw_len);
    } else {
        fz_expect_corrupt(rc, true, h->lsn, "kw_side_iter_next");
    }
    kw_buf_free(&again);
    return rc;
}

/* SNAP_KEYS: what decodes re-encodes to the same bytes, with no key 0. */
static int decode_snap_keys(const unsigned char *p, size_t len)
{
    kw_snap_keys k;
    int rc = kw_snap_keys_decode(p, len, &k);
    if (rc) {
        fz_expect_corrupt(rc, false, 0, "kw_snap_keys_decode");
        return rc;
    }
    uint64_t *keys = malloc((k.n ? k.n : 1) * sizeof *keys), *ticks = malloc((k.n ? k.n : 1) * sizeof *ticks);
    FZ_CHECK(keys && ticks, "out of memory for %u keys", k.n);
    for (uint32_t i = 0; i < k.n; i++) {
        kw_snap_keys_get(&k, i, &keys[i], &ticks[i]);
        FZ_CHECK(keys[i] != 0, "kw_snap_keys_decode accepts key 0 (entry %u)", i);
    }
    kw_buf b = {0};
    FZ_CHECK(kw_snap_keys_encode(&b, k.n, keys, ticks) == KEEL_OK, "kw_snap_keys_encode failed");
    FZ_CHECK(b.len == len && !memcmp(b.p, p, len), "a decoded SNAP_KEYS payload re-encodes differently");
    kw_buf_free(&b);
    free(keys);
    free(ticks);
    return KEEL_OK;
}

/* An EPOCH payload: decoded, it encodes to the same bytes; malformed
 * (short, long, a node name over 64 bytes, epoch 0) it is KEEL_ECORRUPT. */
static int decode_epoch(const unsigned char *p, size_t len)
{
    kw_epoch e;
    int rc = kw_epoch_decode(p, len, &e);
    bool valid = len >= 12 && fz_rd32(p + 8) <= KW_EPOCH_NODE_MAX && len == 12 + (size_t)fz_rd32(p + 8) &&
                 fz_rd64(p) != 0 && !memchr(p + 12, 0, len - 12);
    if (!valid) {
        fz_expect_corrupt(rc, false, 0, "kw_epoch_decode");
        return rc;
    }
    FZ_CHECK(rc == KEEL_OK, "kw_epoch_decode refused a valid epoch payload");
    kw_buf b = {0};
    FZ_CHECK(kw_epoch_encode(&b, e.epoch, e.node) == KEEL_OK && b.len == len && !memcmp(b.p, p, len),
             "an epoch payload does not encode back to its bytes");
    kw_buf_free(&b);
    return rc;
}

int fz_decode_record(kw_codec_ctx *c, const void *rec, const kw_header *h, const kw_schema *schema)
{
    const void *payload;
    int rc = kw_record_payload(c, rec, h, &payload);
    if (rc) {
        FZ_CHECK(h->codec != KW_CODEC_RAW, "a raw payload was refused");
        fz_expect_corrupt(rc, true, h->lsn, "kw_record_payload");
        return rc;
    }
    /* A legitimate frame can expand 32768-fold (a 16 KiB input to 512 MiB of
     * RLE blocks): beyond FZ_WALK_MAX the payload is decompressed and
     * checked but not walked, which would only cost the run time and memory. */
    if (h->raw_len > FZ_WALK_MAX)
        return KEEL_OK;
    unsigned char *p = malloc(h->raw_len ? h->raw_len : 1); /* exactly the payload: overreads are reported */
    FZ_CHECK(p, "out of memory for %u bytes", h->raw_len);
    if (h->raw_len)
        memcpy(p, payload, h->raw_len);
    switch (h->kind) {
    case KW_KIND_TICK_CHUNK:
    case KW_KIND_SIDE:
    case KW_KIND_LIFECYCLE:
        rc = decode_change_record(c, h, p, schema);
        break;
    case KW_KIND_SIDES:
        rc = decode_sides_record(c, h, p, schema);
        break;
    case KW_KIND_TICK_COMMIT:
        rc = fz_decode_commit(p, h->raw_len);
        break;
    case KW_KIND_SCHEMA: {
        kw_schema s;
        rc = kw_schema_decode(p, h->raw_len, &s);
        if (rc == KEEL_OK) {
            fz_check_schema(&s, p, h->raw_len);
            kw_schema_free(&s);
        } else {
            fz_expect_corrupt(rc, false, 0, "kw_schema_decode");
        }
        break;
    }
    case KW_KIND_SNAP_KEYS:
        rc = decode_snap_keys(p, h->raw_len);
        break;
    case KW_KIND_EPOCH:
        rc = decode_epoch(p, h->raw_len);
        break;
    default:
        walk_snap(h->kind, p, h->raw_len);
        break;
    }
    free(p);
    return rc;
}
