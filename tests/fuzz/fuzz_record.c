/*
 * tests/fuzz/fuzz_record.c -- libFuzzer target: the record layer of
 * libkeel_wal on arbitrary bytes.
 *
 * The input is one candidate record (the seed corpus holds real WAL and
 * snap records, tests/fuzz/corpus/record). Each input goes through:
 *
 *   1. kw_record_check as it is, compared with an independent reading of
 *      the header rules of docs/wal-format.md; an accepted record is
 *      decompressed and decoded by its kind (fz_decode_record);
 *   2. the same bytes with the magic, the stored length (and the raw length
 *      of a raw record) and the CRC repaired, so that mutated payloads get
 *      past the CRC and reach the codecs and decoders;
 *   3. the whole input as a payload of every kind: kw_decode_begin/next
 *      (TICK_CHUNK, SIDE, LIFECYCLE, with and without a schema),
 *      kw_decode_commit, kw_schema_decode, kw_checkpoint_meta_decode;
 *   4. round trips from fields derived from the input: a record built with
 *      kw_record_build around the input, and a change record encoded from
 *      the input read as a list of changes, must check and decode back to
 *      the same fields.
 *
 * Invariants (fuzz_common.h): no crash, no sanitizer report, no leak; bad
 * input is KEEL_ECORRUPT with a sentence naming the LSN when the function
 * knows it; accepted records decode within their payload.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

static kw_codec_ctx *codec_default; /* stores payloads under 128 bytes raw */
static kw_codec_ctx *codec_eager;   /* compresses from 1 byte on, at another level */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    FZ_CHECK(kw_codec_create(NULL, &codec_default) == KEEL_OK, "kw_codec_create failed");
    FZ_CHECK(kw_codec_create(&(kw_codec_desc){.level = 3, .min_compress = 1}, &codec_eager) == KEEL_OK,
             "kw_codec_create failed");
    return 0;
}

static const uint32_t kinds[] = {
    KW_KIND_TICK_CHUNK, KW_KIND_TICK_COMMIT, KW_KIND_SIDE,       KW_KIND_LIFECYCLE,  KW_KIND_SCHEMA,
    KW_KIND_CHECKPOINT, KW_KIND_EPOCH,       KW_KIND_SNAP_TABLES, KW_KIND_SNAP_SLOTS, KW_KIND_SNAP_CHUNK,
    KW_KIND_SNAP_KEYS,  KW_KIND_SIDES,
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static bool kind_known(uint32_t k)
{
    for (size_t i = 0; i < NKINDS; i++)
        if (kinds[i] == k)
            return true;
    return false;
}

/* The header rules of docs/wal-format.md §3, read independently of
 * record.c (the CRC itself comes from kw_crc32c, tested on its own). */
static bool header_valid(const unsigned char *p, size_t len)
{
    if (len < KW_HEADER_SIZE || memcmp(p, "KWR1", 4))
        return false;
    uint32_t raw = fz_rd32(p + 32), stored = fz_rd32(p + 36);
    if ((p[4] | p[5] << 8) != 1 || !kind_known(p[6]) || p[7] > 2 || (p[7] == 2 && p[6] != KW_KIND_TICK_CHUNK && p[6] != KW_KIND_SNAP_CHUNK) || fz_rd32(p + 28) || fz_rd32(p + 44))
        return false;
    if (raw > 0x7fffffffu || stored > 0x7fffffffu || stored != len - KW_HEADER_SIZE || (p[7] == 0 && raw != stored))
        return false;
    unsigned char h[KW_HEADER_SIZE];
    memcpy(h, p, sizeof h);
    memset(h + 40, 0, 4);
    return kw_crc32c(kw_crc32c(0, p + KW_HEADER_SIZE, stored), h, sizeof h) == fz_rd32(p + 40);
}

/* kw_record_check agrees with header_valid; an accepted record decodes. */
static void check_record(const unsigned char *p, size_t len)
{
    kw_header h;
    int rc = kw_record_check(p, len, &h);
    bool valid = header_valid(p, len);
    FZ_CHECK((rc == KEEL_OK) == valid, "kw_record_check says %s, the format page says %s", keel_strerror(rc),
             valid ? "valid" : "invalid");
    if (rc) {
        /* the LSN is known once the header is there and starts like one */
        bool readable = len >= KW_HEADER_SIZE && !memcmp(p, "KWR1", 4);
        fz_expect_corrupt(rc, readable, readable ? fz_rd64(p + 8) : 0, "kw_record_check");
        return;
    }
    FZ_CHECK(h.kind == p[6] && h.codec == p[7] && h.lsn == fz_rd64(p + 8) && h.tick == fz_rd64(p + 16) &&
                 h.flags == fz_rd32(p + 24) && h.raw_len == fz_rd32(p + 32) && h.crc == fz_rd32(p + 40),
             "kw_record_check fills a header that differs from the bytes");
    fz_decode_record(codec_default, p, &h, fz_corpus_schema());
}

/* Repair what a mutation most often breaks so the payload is decoded. */
static void check_repaired(const uint8_t *data, size_t size)
{
    if (size < KW_HEADER_SIZE)
        return;
    unsigned char *p = malloc(size);
    FZ_CHECK(p, "out of memory");
    memcpy(p, data, size);
    uint32_t stored = (uint32_t)(size - KW_HEADER_SIZE);
    memcpy(p, "KWR1", 4);
    for (int i = 0; i < 4; i++) {
        p[36 + i] = (unsigned char)(stored >> (8 * i));
        if (p[7] == 0)
            p[32 + i] = p[36 + i];
    }
    memset(p + 40, 0, 4);
    uint32_t crc = kw_crc32c(kw_crc32c(0, p + KW_HEADER_SIZE, stored), p, KW_HEADER_SIZE);
    for (int i = 0; i < 4; i++)
        p[40 + i] = (unsigned char)(crc >> (8 * i));
    check_record(p, size);
    free(p);
}

/* The whole input as the payload of every kind. */
static void decode_as_payload(const uint8_t *data, size_t size)
{
    static const uint32_t change_kinds[] = {KW_KIND_TICK_CHUNK, KW_KIND_SIDE, KW_KIND_LIFECYCLE};
    uint64_t lsn = size >= 8 ? fz_rd64(data) : size;
    for (size_t i = 0; i < 3; i++) {
        kw_buf canon = {0};
        if (fz_decode_changes(change_kinds[i], lsn, data, size, NULL, &canon) == KEEL_OK) {
            if (change_kinds[i] != KW_KIND_TICK_CHUNK)
                FZ_CHECK(canon.len == size && !memcmp(canon.p, data, size), "decoded %s changes re-encode differently",
                         kw_kind_name(change_kinds[i]));
            fz_decode_changes(change_kinds[i], lsn, data, size, fz_corpus_schema(), NULL);
        }
        kw_buf_free(&canon);
    }
    kw_decoder d;
    for (size_t i = 0; i < NKINDS; i++)
        if (kinds[i] != KW_KIND_TICK_CHUNK && kinds[i] != KW_KIND_SIDE && kinds[i] != KW_KIND_LIFECYCLE)
            FZ_CHECK(kw_decode_begin(&d, kinds[i], lsn, data, size, NULL) == KEEL_EINVAL,
                     "kw_decode_begin accepts a %s record", kw_kind_name(kinds[i]));
    fz_decode_commit(data, size);
    kw_schema s;
    int rc = kw_schema_decode(data, size, &s);
    if (rc == KEEL_OK) {
        fz_check_schema(&s, data, size);
        kw_schema_free(&s);
    } else {
        fz_expect_corrupt(rc, false, 0, "kw_schema_decode");
    }
    kw_checkpoint_meta m;
    rc = kw_checkpoint_meta_decode(data, size, &m);
    if (size != 32) {
        fz_expect_corrupt(rc, false, 0, "kw_checkpoint_meta_decode");
        return;
    }
    FZ_CHECK(rc == KEEL_OK && m.tick == fz_rd64(data) && m.lsn == fz_rd64(data + 8) &&
                 m.created_ns == fz_rd64(data + 16) && m.count == fz_rd32(data + 24),
             "a 32-byte checkpoint pointer decodes wrong");
    unsigned char back[32];
    kw_checkpoint_meta_encode(&m, back);
    FZ_CHECK(!memcmp(back, data, 28) && !fz_rd32(back + 28), "checkpoint pointer round trip");
}

/* Read the input as a list of changes: per change an op byte, an entity
 * (8 bytes), then for a value a component byte, a size byte and the
 * value; a spawn takes a count byte (mod 8) and that many values. Stops
 * where the input ends. */
static size_t changes_from_bytes(const uint8_t *p, size_t n, uint32_t kind, fz_change *out, size_t max,
                                 uint32_t (*spawn)[3][8], const void *(*vals)[8])
{
    size_t i = 0, k = 0;
    while (k < max && i + 9 <= n) {
        fz_change c = {.op = kind == KW_KIND_LIFECYCLE ? 1u + p[i] % 4 : KW_OP_SET, .entity = fz_rd64(p + i + 1)};
        i += 9;
        if (c.op == KW_OP_SPAWN) {
            if (i >= n)
                break;
            c.n = p[i++] % 8;
            for (uint32_t j = 0; j < c.n; j++) {
                if (i + 2 > n || i + 2 + p[i + 1] > n)
                    return k;
                spawn[k][0][j] = p[i] | 1u;
                spawn[k][1][j] = p[i + 1];
                vals[k][j] = p + i + 2;
                i += 2u + p[i + 1];
            }
            c.comps = spawn[k][0];
            c.sizes = spawn[k][1];
            c.values = vals[k];
        } else if (c.op != KW_OP_DESTROY) {
            if (i + 2 > n)
                break;
            c.component = p[i] | 1u;
            c.size = c.op == KW_OP_REMOVE ? 0 : p[i + 1];
            i += c.op == KW_OP_REMOVE ? 1 : 2;
            if (i + c.size > n)
                break;
            c.value = c.size ? p + i : NULL;
            i += c.size;
        }
        out[k++] = c;
    }
    return k;
}

/* Changes derived from the input -> encoder -> kw_record_build -> check ->
 * payload -> decoder -> encoder: the bytes must come back. */
static void round_trip_changes(const uint8_t *data, size_t size)
{
    enum { MAX = 64 };
    static fz_change ch[MAX];
    static uint32_t spawn[MAX][3][8];
    static const void *vals[MAX][8];
    if (!size)
        return;
    static const uint32_t change_kinds[] = {KW_KIND_TICK_CHUNK, KW_KIND_SIDE, KW_KIND_LIFECYCLE};
    uint32_t kind = change_kinds[data[0] % 3];
    size_t n = changes_from_bytes(data + 1, size - 1, kind, ch, MAX, spawn, vals);
    uint64_t seq = size >= 9 ? fz_rd64(data + 1) : 0, lsn = seq ^ 0x5a5a;
    kw_buf enc = {0}, rec = {0}, back = {0};
    fz_encode(&enc, kind, seq, (uint32_t)size, ch, n);
    kw_codec_ctx *c = data[0] & 8 ? codec_eager : codec_default;
    FZ_CHECK(kw_record_build(c, &rec, kind, lsn, size, 0, enc.p, enc.len) == KEEL_OK, "kw_record_build failed");
    kw_header h;
    FZ_CHECK(kw_record_check(rec.p, rec.len, &h) == KEEL_OK, "a built change record is refused");
    const void *payload;
    FZ_CHECK(kw_record_payload(c, rec.p, &h, &payload) == KEEL_OK, "a built change record does not decompress");
    unsigned char *copy = malloc(h.raw_len ? h.raw_len : 1);
    FZ_CHECK(copy, "out of memory");
    memcpy(copy, payload, h.raw_len);
    FZ_CHECK(fz_decode_changes(kind, lsn, copy, h.raw_len, NULL, &back) == KEEL_OK, "%zu encoded %s changes fail to decode",
             n, kw_kind_name(kind));
    FZ_CHECK(back.len == enc.len && !memcmp(back.p, enc.p, enc.len), "%zu %s changes do not decode to themselves", n,
             kw_kind_name(kind));
    free(copy);
    kw_buf_free(&enc);
    kw_buf_free(&rec);
    kw_buf_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_record(data, size);
    check_repaired(data, size);
    decode_as_payload(data, size);
    if (size) {
        const uint8_t *hdr = size >= KW_HEADER_SIZE ? data : NULL;
        uint32_t kind = kinds[(hdr ? hdr[6] : data[0]) % NKINDS];
        fz_round_trip_record(data[0] & 1 ? codec_eager : codec_default, kind, hdr ? fz_rd64(hdr + 8) : size,
                             hdr ? fz_rd64(hdr + 16) : 0, hdr ? fz_rd32(hdr + 24) : data[0], data, size);
    }
    round_trip_changes(data, size);
    return 0;
}
