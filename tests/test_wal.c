/*
 * test_wal -- libkeel_wal on its own: the KWR1 record (CRC32C, build,
 * check, seal, codecs, corruption), the payload layer (cursor, schema,
 * checkpoint meta, snap keys) and the LMDB store (open, append, iterate,
 * delete, map growth, injected failures, format versions).
 *
 * Expected bytes are computed here independently of the library where
 * possible: a bitwise CRC32C, a reseal helper that applies the documented
 * CRC rule (docs/wal-format.md), little/big-endian readers. Store tests
 * work in directories made with mkdtemp under one per-case root that the
 * case's teardown removes even when a test failed half-way.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel_test.h"
#include "keel_wal/wal.h"

/* ---- helpers ----------------------------------------------------------------------- */

static uint32_t ref_crc32c(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    crc = ~crc;
    while (n--) {
        crc ^= *b++;
        for (int k = 0; k < 8; k++)
            crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void wr16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static uint64_t rdbe64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}
static uint32_t rdbe32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Recompute a record's CRC by the documented rule: CRC32C over the stored
 * payload, continued over the 48 header bytes with the crc field zeroed. */
static void reseal(unsigned char *rec, size_t len)
{
    unsigned char h[KW_HEADER_SIZE];
    memcpy(h, rec, sizeof h);
    wr32(h + 40, 0);
    uint32_t crc = ref_crc32c(0, rec + KW_HEADER_SIZE, len - KW_HEADER_SIZE);
    wr32(rec + 40, ref_crc32c(crc, h, sizeof h));
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}
static void rnd_fill(void *p, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rnd();
}
/* Compressible: short runs of a few symbols. */
static void text_fill(void *p, size_t n)
{
    static const char words[] = "entity position velocity health mana trade gold ";
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)words[(i * 7 + i / 13) % (sizeof words - 1)];
}

static bool has(const char *hay, const char *needle)
{
    return hay && strstr(hay, needle) != NULL;
}

static kw_codec_ctx *codec(void)
{
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    ck_assert_ptr_nonnull(c);
    return c;
}

/* The library's portable CRC path, compiled from its own source under
 * another name: the library itself takes the SSE4.2 path on this CPU, and
 * nothing else reaches the slicing-by-8 tables from outside. */
uint32_t soft_crc32c_impl(uint32_t crc, const void *p, size_t n);
#define kw_crc32c soft_crc32c_impl
#pragma push_macro("__x86_64__")
#undef __x86_64__
#include "../wal/crc32c.c"
#pragma pop_macro("__x86_64__")
#undef kw_crc32c

/* ---- wal_record ---------------------------------------------------------------------- */

START_TEST(crc32c_known_answers)
{
    ck_assert_uint_eq(kw_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(kw_crc32c(0, "", 0), 0u);
    ck_assert_uint_eq(kw_crc32c(0, NULL, 0), 0u);
    ck_assert_uint_eq(kw_crc32c(0, "a", 1), 0xC1D04330u);
    /* RFC 3720 (iSCSI) B.4 test vectors */
    unsigned char b[32];
    memset(b, 0, sizeof b);
    ck_assert_uint_eq(kw_crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, sizeof b);
    ck_assert_uint_eq(kw_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)i;
    ck_assert_uint_eq(kw_crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)(31 - i);
    ck_assert_uint_eq(kw_crc32c(0, b, 32), 0x113FDB5Cu);
    /* the same answers from the portable path and the bitwise reference */
    ck_assert_uint_eq(soft_crc32c_impl(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(ref_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(soft_crc32c_impl(0, b, 32), 0x113FDB5Cu);
}
END_TEST

START_TEST(crc32c_paths_agree_on_every_length_and_alignment)
{
    enum { MAXLEN = 1100, BIG = 70000 };
    unsigned char *buf = malloc(BIG + 16);
    ck_assert_ptr_nonnull(buf);
    rnd_fill(buf, BIG + 16);
    for (size_t align = 0; align < 16; align++)
        for (size_t len = 0; len <= MAXLEN; len += len < 80 ? 1 : 37) {
            uint32_t want = ref_crc32c(0, buf + align, len);
            ck_assert_msg(kw_crc32c(0, buf + align, len) == want, "library path: len %zu align %zu", len, align);
            ck_assert_msg(soft_crc32c_impl(0, buf + align, len) == want, "portable path: len %zu align %zu", len,
                          align);
        }
    uint32_t want = ref_crc32c(0, buf + 3, BIG);
    ck_assert_uint_eq(kw_crc32c(0, buf + 3, BIG), want);
    ck_assert_uint_eq(soft_crc32c_impl(0, buf + 3, BIG), want);
    /* extending: crc(a ++ b) == crc(crc(a), b), for every split */
    for (size_t split = 0; split <= 300; split++) {
        uint32_t whole = ref_crc32c(0, buf + 1, 300);
        ck_assert_uint_eq(kw_crc32c(kw_crc32c(0, buf + 1, split), buf + 1 + split, 300 - split), whole);
        ck_assert_uint_eq(soft_crc32c_impl(soft_crc32c_impl(0, buf + 1, split), buf + 1 + split, 300 - split), whole);
    }
    free(buf);
}
END_TEST

START_TEST(kind_names_round_trip)
{
    static const struct { uint32_t kind; const char *name; } kinds[] = {
        {KW_KIND_TICK_CHUNK, "tick_chunk"},   {KW_KIND_TICK_COMMIT, "tick_commit"}, {KW_KIND_SIDE, "side"},
        {KW_KIND_LIFECYCLE, "lifecycle"},     {KW_KIND_SCHEMA, "schema"},           {KW_KIND_CHECKPOINT, "checkpoint"},
        {KW_KIND_SNAP_TABLES, "snap_tables"}, {KW_KIND_SNAP_SLOTS, "snap_slots"},   {KW_KIND_SNAP_CHUNK, "snap_chunk"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        ck_assert_str_eq(kw_kind_name(kinds[i].kind), kinds[i].name);
        ck_assert_uint_eq(kw_kind_parse(kinds[i].name), kinds[i].kind);
    }
    static const uint32_t unknown[] = {0, 7, 8, 15, 19, 255, 256, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        ck_assert_str_eq(kw_kind_name(unknown[i]), "?");
    ck_assert_uint_eq(kw_kind_parse("nope"), 0);
    ck_assert_uint_eq(kw_kind_parse("?"), 0);
    ck_assert_uint_eq(kw_kind_parse(""), 0);
    ck_assert_uint_eq(kw_kind_parse(NULL), 0);
    ck_assert_uint_eq(keel_wal_format_version(), KEEL_WAL_FORMAT_VERSION);
}
END_TEST

START_TEST(raw_record_round_trip_has_the_documented_header)
{
    kw_codec_ctx *c = codec();
    kw_buf out = {0};
    const char payload[] = "twenty bytes payload";
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_SIDE, 0x0102030405060708ull, 77, 5, payload, 20));
    ck_assert_uint_eq(out.len, KW_HEADER_SIZE + 20);
    const unsigned char *r = out.p;
    ck_assert(memcmp(r, "KWR1", 4) == 0);
    ck_assert_uint_eq(rd16(r + 4), KEEL_WAL_FORMAT_VERSION);
    ck_assert_uint_eq(r[6], KW_KIND_SIDE);
    ck_assert_uint_eq(r[7], KW_CODEC_RAW);
    ck_assert_uint_eq(rd64(r + 8), 0x0102030405060708ull);
    ck_assert_uint_eq(r[8], 0x08); /* little-endian */
    ck_assert_uint_eq(rd64(r + 16), 77);
    ck_assert_uint_eq(rd32(r + 24), 5);
    ck_assert_uint_eq(rd32(r + 28), 0);
    ck_assert_uint_eq(rd32(r + 32), 20);
    ck_assert_uint_eq(rd32(r + 36), 20);
    ck_assert_uint_eq(rd32(r + 44), 0);
    ck_assert(memcmp(r + KW_HEADER_SIZE, payload, 20) == 0);

    kw_header h;
    memset(&h, 0xAB, sizeof h);
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.version, KEEL_WAL_FORMAT_VERSION);
    ck_assert_uint_eq(h.kind, KW_KIND_SIDE);
    ck_assert_uint_eq(h.codec, KW_CODEC_RAW);
    ck_assert_uint_eq(h.lsn, 0x0102030405060708ull);
    ck_assert_uint_eq(h.tick, 77);
    ck_assert_uint_eq(h.flags, 5);
    ck_assert_uint_eq(h.dict_id, 0);
    ck_assert_uint_eq(h.raw_len, 20);
    ck_assert_uint_eq(h.stored_len, 20);
    ck_assert_uint_eq(h.crc, rd32(r + 40));
    ck_assert_ok(kw_record_check(out.p, out.len, NULL));
    const void *p = NULL;
    ck_assert_ok(kw_record_payload(c, out.p, &h, &p));
    ck_assert_ptr_eq(p, out.p + KW_HEADER_SIZE); /* raw: points into the record */

    /* an empty payload is a valid record too */
    out.len = 0;
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_COMMIT, 1, 2, 0, NULL, 0));
    ck_assert_uint_eq(out.len, KW_HEADER_SIZE);
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.raw_len, 0);
    ck_assert_ok(kw_record_payload(c, out.p, &h, &p));
    kw_buf_free(&out);
    ck_assert_ptr_null(out.p);
    kw_codec_destroy(c);
}
END_TEST

START_TEST(zstd_record_round_trip)
{
    kw_codec_ctx *c = codec();
    enum { N = 8192 };
    unsigned char *text = malloc(N), *noise = malloc(N);
    text_fill(text, N);
    rnd_fill(noise, N);
    kw_buf out = {0};
    kw_header h;
    const void *p;

    /* compressible and long enough: zstd, smaller, decompresses to the bytes */
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 9, 3, 0, text, N));
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_ZSTD);
    ck_assert_uint_eq(h.raw_len, N);
    ck_assert_uint_lt(h.stored_len, N / 4);
    ck_assert_uint_eq(out.len, KW_HEADER_SIZE + h.stored_len);
    ck_assert_uint_eq(rd32(out.p + KW_HEADER_SIZE), 0xFD2FB528u); /* a zstd frame */
    ck_assert_ok(kw_record_payload(c, out.p, &h, &p));
    ck_assert(memcmp(p, text, N) == 0);

    /* incompressible: stored raw even though it is long */
    out.len = 0;
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 10, 3, 0, noise, N));
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_RAW);
    ck_assert_uint_eq(h.stored_len, N);
    ck_assert_ok(kw_record_payload(c, out.p, &h, &p));
    ck_assert(memcmp(p, noise, N) == 0);

    /* compressible but under the 128-byte default threshold: raw */
    out.len = 0;
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 11, 3, 0, text, 127));
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_RAW);

    /* records appended back to back in one buffer, each checkable */
    out.len = 0;
    for (uint64_t i = 0; i < 4; i++)
        ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 100 + i, 3, 0, i & 1 ? noise : text, 1000 + i));
    size_t off = 0;
    for (uint64_t i = 0; i < 4; i++) {
        size_t len = KW_HEADER_SIZE + rd32(out.p + off + 36);
        ck_assert_ok(kw_record_check(out.p + off, len, &h));
        ck_assert_uint_eq(h.lsn, 100 + i);
        ck_assert_ok(kw_record_payload(c, out.p + off, &h, &p));
        ck_assert(memcmp(p, i & 1 ? noise : text, 1000 + i) == 0);
        off += len;
    }
    ck_assert_uint_eq(off, out.len);

    /* a context with its own level and threshold */
    kw_codec_ctx *c2 = NULL;
    ck_assert_ok(kw_codec_create(&(kw_codec_desc){.level = 19, .min_compress = 16}, &c2));
    out.len = 0;
    ck_assert_ok(kw_record_build(c2, &out, KW_KIND_TICK_CHUNK, 12, 3, 0, text, 100));
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_ZSTD);
    ck_assert_ok(kw_record_payload(c, out.p, &h, &p)); /* any context reads it */
    ck_assert(memcmp(p, text, 100) == 0);
    kw_codec_destroy(c2);

    kw_buf_free(&out);
    free(text);
    free(noise);
    kw_codec_destroy(c);
}
END_TEST

START_TEST(codec_create_refuses_bad_levels_and_oversized_payloads)
{
    kw_codec_ctx *c = (kw_codec_ctx *)0x1;
    ck_assert_rc(kw_codec_create(&(kw_codec_desc){.level = 1000}, &c), KEEL_EINVAL);
    ck_assert(has(keel_last_error(), "1000"));
    ck_assert_ptr_eq(c, (kw_codec_ctx *)0x1);
    ck_assert_rc(kw_codec_create(&(kw_codec_desc){.level = -1000000000}, &c), KEEL_EINVAL);
    kw_codec_destroy(NULL);
    c = codec();
    kw_buf out = {0};
    unsigned char small[8] = {0};
    /* the length is refused before the payload is read */
    ck_assert_rc(kw_record_build(c, &out, KW_KIND_SIDE, 1, 1, 0, small, 0x80000000u), KEEL_ERANGE);
    ck_assert_uint_eq(out.len, 0);
    kw_buf_free(&out);
    kw_codec_destroy(c);
}
END_TEST

START_TEST(crc_is_payload_then_zeroed_header)
{
    kw_codec_ctx *c = codec();
    unsigned char text[600];
    text_fill(text, sizeof text);
    for (int z = 0; z < 2; z++) {
        kw_buf out = {0};
        ck_assert_ok(kw_record_build(c, &out, KW_KIND_LIFECYCLE, 4242, 17, 1, text, z ? sizeof text : 40));
        ck_assert_uint_eq(out.p[7], z ? KW_CODEC_ZSTD : KW_CODEC_RAW);
        uint32_t stored = rd32(out.p + 40);
        unsigned char copy[KW_HEADER_SIZE];
        memcpy(copy, out.p, sizeof copy);
        wr32(copy + 40, 0);
        uint32_t want = ref_crc32c(ref_crc32c(0, out.p + KW_HEADER_SIZE, out.len - KW_HEADER_SIZE), copy, sizeof copy);
        ck_assert_uint_eq(stored, want);
        /* the same as one CRC over payload ++ zeroed header */
        unsigned char *cat = malloc(out.len);
        memcpy(cat, out.p + KW_HEADER_SIZE, out.len - KW_HEADER_SIZE);
        memcpy(cat + out.len - KW_HEADER_SIZE, copy, KW_HEADER_SIZE);
        ck_assert_uint_eq(ref_crc32c(0, cat, out.len), stored);
        free(cat);
        kw_buf_free(&out);
    }
    kw_codec_destroy(c);
}
END_TEST

START_TEST(unsealed_then_sealed_equals_direct_build)
{
    kw_codec_ctx *c = codec();
    unsigned char text[3000], noise[300];
    text_fill(text, sizeof text);
    rnd_fill(noise, sizeof noise);
    const struct { const void *p; size_t n; } cases[] = {{text, sizeof text}, {noise, sizeof noise}, {text, 10}, {NULL, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kw_buf direct = {0}, unsealed = {0};
        ck_assert_ok(kw_record_build(c, &direct, KW_KIND_TICK_CHUNK, 987654321, 55, 0, cases[i].p, cases[i].n));
        ck_assert_ok(kw_record_build_unsealed(c, &unsealed, KW_KIND_TICK_CHUNK, 55, 0, cases[i].p, cases[i].n));
        ck_assert_uint_eq(direct.len, unsealed.len);
        /* unsealed: LSN 0, the crc field holds the payload's CRC, and it does not check */
        ck_assert_uint_eq(rd64(unsealed.p + 8), 0);
        ck_assert_uint_eq(rd32(unsealed.p + 40), ref_crc32c(0, unsealed.p + KW_HEADER_SIZE, unsealed.len - KW_HEADER_SIZE));
        ck_assert_rc(kw_record_check(unsealed.p, unsealed.len, NULL), KEEL_ECORRUPT);
        kw_record_seal(unsealed.p, 987654321);
        ck_assert_msg(memcmp(direct.p, unsealed.p, direct.len) == 0, "case %zu: sealed differs from direct", i);
        ck_assert_ok(kw_record_check(unsealed.p, unsealed.len, NULL));
        kw_buf_free(&direct);
        kw_buf_free(&unsealed);
    }
    /* the writer's pattern: several unsealed records in one buffer, sealed in order */
    kw_buf batch = {0}, want = {0};
    for (uint64_t i = 0; i < 5; i++) {
        ck_assert_ok(kw_record_build_unsealed(c, &batch, KW_KIND_TICK_CHUNK, 8, 0, text, 200 * (i + 1)));
        ck_assert_ok(kw_record_build(c, &want, KW_KIND_TICK_CHUNK, 40 + i, 8, 0, text, 200 * (i + 1)));
    }
    ck_assert_ok(kw_record_build_unsealed(c, &batch, KW_KIND_TICK_COMMIT, 8, 0, noise, 16));
    ck_assert_ok(kw_record_build(c, &want, KW_KIND_TICK_COMMIT, 45, 8, 0, noise, 16));
    size_t off = 0;
    for (uint64_t lsn = 40; off < batch.len; lsn++) {
        size_t len = KW_HEADER_SIZE + rd32(batch.p + off + 36);
        kw_record_seal(batch.p + off, lsn);
        off += len;
    }
    ck_assert_uint_eq(batch.len, want.len);
    ck_assert(memcmp(batch.p, want.p, want.len) == 0);
    kw_buf_free(&batch);
    kw_buf_free(&want);
    kw_codec_destroy(c);
}
END_TEST

/* Every single-byte change (all 255 of them at every offset) is refused,
 * and the sentence names the LSN whenever the header is recognisable (the
 * magic intact); a changed LSN field is named as read. */
static void corrupt_every_byte(const unsigned char *good, size_t len, uint64_t lsn)
{
    unsigned char *r = malloc(len);
    char want[64];
    for (size_t at = 0; at < len; at++)
        for (unsigned x = 1; x < 256; x++) {
            memcpy(r, good, len);
            r[at] ^= (unsigned char)x;
            kw_header h;
            int rc = kw_record_check(r, len, &h);
            ck_assert_msg(rc == KEEL_ECORRUPT, "byte %zu ^ 0x%02x: kw_record_check returned %s", at, x,
                          keel_strerror(rc));
            if (at < 4) {
                ck_assert_msg(has(keel_last_error(), "magic"), "byte %zu: %s", at, keel_last_error());
                continue;
            }
            snprintf(want, sizeof want, "LSN %llu", (unsigned long long)(at >= 8 && at < 16 ? rd64(r + 8) : lsn));
            ck_assert_msg(has(keel_last_error(), want), "byte %zu ^ 0x%02x: '%s' does not name %s", at, x,
                          keel_last_error(), want);
        }
    free(r);
}

START_TEST(every_single_byte_corruption_is_detected)
{
    kw_codec_ctx *c = codec();
    unsigned char text[400], small[24];
    text_fill(text, sizeof text);
    rnd_fill(small, sizeof small);
    kw_buf raw = {0}, z = {0};
    ck_assert_ok(kw_record_build(c, &raw, KW_KIND_SIDE, 0x1122334455ull, 9, 0, small, sizeof small));
    ck_assert_ok(kw_record_build(c, &z, KW_KIND_TICK_CHUNK, 0x1122334455ull, 9, 0, text, sizeof text));
    ck_assert_uint_eq(z.p[7], KW_CODEC_ZSTD);
    corrupt_every_byte(raw.p, raw.len, 0x1122334455ull);
    corrupt_every_byte(z.p, z.len, 0x1122334455ull);
    kw_buf_free(&raw);
    kw_buf_free(&z);
    kw_codec_destroy(c);
}
END_TEST

START_TEST(truncated_and_overlong_records_are_refused)
{
    kw_codec_ctx *c = codec();
    unsigned char text[300];
    text_fill(text, sizeof text);
    kw_buf out = {0};
    ck_assert_ok(kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 31337, 1, 0, text, sizeof text));
    /* every prefix: a copy of exactly that length, so a read past it is an ASan error */
    for (size_t len = 0; len < out.len; len++) {
        unsigned char *r = malloc(len ? len : 1);
        memcpy(r, out.p, len);
        ck_assert_msg(kw_record_check(r, len, NULL) == KEEL_ECORRUPT, "a %zu-byte prefix was accepted", len);
        if (len < KW_HEADER_SIZE)
            ck_assert_msg(has(keel_last_error(), "header"), "%zu bytes: %s", len, keel_last_error());
        else
            ck_assert_msg(has(keel_last_error(), "LSN 31337"), "%zu bytes: %s", len, keel_last_error());
        free(r);
    }
    ck_assert_rc(kw_record_check(NULL, 0, NULL), KEEL_ECORRUPT);
    ck_assert_rc(kw_record_check(NULL, 100, NULL), KEEL_ECORRUPT);
    /* trailing bytes after the payload */
    ck_assert_ok(kw_buf_reserve(&out, 1));
    out.p[out.len] = 0;
    ck_assert_rc(kw_record_check(out.p, out.len + 1, NULL), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "LSN 31337"));
    ck_assert_ok(kw_record_check(out.p, out.len, NULL));
    kw_buf_free(&out);
    kw_codec_destroy(c);
}
END_TEST

/* Header fields a reader must refuse even when the CRC matches them. */
START_TEST(wrong_version_kind_codec_are_refused_with_a_valid_crc)
{
    kw_codec_ctx *c = codec();
    unsigned char text[32];
    text_fill(text, sizeof text);
    kw_buf good = {0};
    ck_assert_ok(kw_record_build(c, &good, KW_KIND_SIDE, 500, 2, 0, text, sizeof text));
    unsigned char *r = malloc(good.len);
    /* reseal reproduces the library's CRC: the helper follows the same rule */
    memcpy(r, good.p, good.len);
    reseal(r, good.len);
    ck_assert(memcmp(r, good.p, good.len) == 0);

    static const uint16_t versions[] = {0, 2, 3, 0xffff};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        memcpy(r, good.p, good.len);
        wr16(r + 4, versions[i]);
        reseal(r, good.len);
        ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
        char want[32];
        snprintf(want, sizeof want, "version %u", versions[i]);
        ck_assert_msg(has(keel_last_error(), want) && has(keel_last_error(), "LSN 500"), "%s", keel_last_error());
    }
    static const uint8_t kinds[] = {0, 7, 8, 15, 19, 20, 255};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        memcpy(r, good.p, good.len);
        r[6] = kinds[i];
        reseal(r, good.len);
        ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), "kind") && has(keel_last_error(), "LSN 500"), "%s", keel_last_error());
    }
    /* every known kind with a valid CRC is accepted */
    for (uint32_t k = 1; k < 32; k++) {
        memcpy(r, good.p, good.len);
        r[6] = (unsigned char)k;
        reseal(r, good.len);
        int rc = kw_record_check(r, good.len, NULL);
        ck_assert_int_eq(rc, strcmp(kw_kind_name(k), "?") ? KEEL_OK : KEEL_ECORRUPT);
    }
    static const uint8_t codecs[] = {2, 3, 128, 255};
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
        memcpy(r, good.p, good.len);
        r[7] = codecs[i];
        reseal(r, good.len);
        ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), "codec") && has(keel_last_error(), "LSN 500"), "%s", keel_last_error());
    }
    /* a dictionary id (none exist in format 1) and the reserved word */
    memcpy(r, good.p, good.len);
    wr32(r + 28, 1);
    reseal(r, good.len);
    ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "LSN 500"));
    memcpy(r, good.p, good.len);
    wr32(r + 44, 0x100);
    reseal(r, good.len);
    ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
    /* raw codec: raw length must equal stored length */
    memcpy(r, good.p, good.len);
    wr32(r + 32, sizeof text + 1);
    reseal(r, good.len);
    ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "LSN 500"));
    /* stored length that disagrees with the record's size */
    memcpy(r, good.p, good.len);
    wr32(r + 36, sizeof text - 1);
    reseal(r, good.len);
    ck_assert_rc(kw_record_check(r, good.len, NULL), KEEL_ECORRUPT);
    ck_assert_rc(kw_record_check(r, good.len - 1, NULL), KEEL_ECORRUPT); /* raw_len now differs */
    free(r);
    kw_buf_free(&good);
    kw_codec_destroy(c);
}
END_TEST

/* A zstd payload that passes the CRC (resealed) but is damaged: the codec
 * must refuse it or decode it to exactly raw_len bytes -- never crash. */
START_TEST(corrupt_zstd_payload_with_valid_crc_is_refused)
{
    kw_codec_ctx *c = codec();
    enum { N = 5000 };
    unsigned char *text = malloc(N);
    text_fill(text, N);
    for (size_t i = 0; i < N; i += 97)
        text[i] = (unsigned char)rnd();
    kw_buf good = {0};
    ck_assert_ok(kw_record_build(c, &good, KW_KIND_TICK_CHUNK, 600, 2, 0, text, N));
    kw_header h;
    ck_assert_ok(kw_record_check(good.p, good.len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_ZSTD);
    unsigned char *r = malloc(good.len);
    const void *p;

    /* frame magic destroyed */
    memcpy(r, good.p, good.len);
    r[KW_HEADER_SIZE] ^= 0xff;
    reseal(r, good.len);
    ck_assert_ok(kw_record_check(r, good.len, &h));
    ck_assert_rc(kw_record_payload(c, r, &h, &p), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "LSN 600"));

    /* raw length that the frame does not decode to: +1, -1, 0, and much larger */
    static const int64_t deltas[] = {1, -1, -(int64_t)N, 1 << 20};
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        memcpy(r, good.p, good.len);
        wr32(r + 32, (uint32_t)((int64_t)N + deltas[i]));
        reseal(r, good.len);
        ck_assert_ok(kw_record_check(r, good.len, &h));
        ck_assert_msg(kw_record_payload(c, r, &h, &p) == KEEL_ECORRUPT, "raw_len %u accepted", h.raw_len);
        ck_assert(has(keel_last_error(), "LSN 600"));
    }

    /* the frame truncated (the stored length shrinks with it) */
    for (size_t cut = 1; cut < h.stored_len; cut += 7) {
        size_t len = KW_HEADER_SIZE + cut;
        memcpy(r, good.p, len);
        wr32(r + 36, (uint32_t)cut);
        reseal(r, len);
        kw_header th;
        ck_assert_ok(kw_record_check(r, len, &th));
        ck_assert_msg(kw_record_payload(c, r, &th, &p) == KEEL_ECORRUPT, "frame cut to %zu accepted", cut);
    }

    /* every payload byte, several patterns: refused or exact length, no crash */
    size_t refused = 0, tried = 0;
    static const unsigned char xs[] = {0x01, 0x80, 0xff, 0x5a};
    for (size_t at = KW_HEADER_SIZE; at < good.len; at++)
        for (size_t k = 0; k < sizeof xs; k++) {
            memcpy(r, good.p, good.len);
            r[at] ^= xs[k];
            reseal(r, good.len);
            kw_header th;
            ck_assert_ok(kw_record_check(r, good.len, &th));
            int rc = kw_record_payload(c, r, &th, &p);
            ck_assert_msg(rc == KEEL_OK || rc == KEEL_ECORRUPT, "byte %zu: %s", at, keel_strerror(rc));
            tried++;
            refused += rc == KEEL_ECORRUPT;
        }
    ck_assert_uint_gt(refused, 0);
    ck_assert_uint_le(refused, tried);
    /* the context still works afterwards */
    ck_assert_ok(kw_record_check(good.p, good.len, &h));
    ck_assert_ok(kw_record_payload(c, good.p, &h, &p));
    ck_assert(memcmp(p, text, N) == 0);
    free(r);
    free(text);
    kw_buf_free(&good);
    kw_codec_destroy(c);
}
END_TEST

/* kw_record_build never produces a payload over 2 GiB (KEEL_ERANGE), so a
 * header claiming a larger raw length is not a record this format can
 * hold: kw_record_check must refuse it before kw_record_payload tries to
 * allocate up to 4 GiB for it. */
START_TEST(raw_length_over_the_record_limit_is_refused)
{
    kw_codec_ctx *c = codec();
    unsigned char text[512];
    text_fill(text, sizeof text);
    kw_buf good = {0};
    ck_assert_ok(kw_record_build(c, &good, KW_KIND_TICK_CHUNK, 700, 2, 0, text, sizeof text));
    ck_assert_uint_eq(good.p[7], KW_CODEC_ZSTD);
    static const uint32_t lens[] = {0x80000000u, 0xfffffff0u, 0xffffffffu};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        wr32(good.p + 32, lens[i]);
        reseal(good.p, good.len);
        kw_header h;
        ck_assert_msg(kw_record_check(good.p, good.len, &h) == KEEL_ECORRUPT,
                      "a record claiming a raw length of %u bytes passed kw_record_check", lens[i]);
    }
    kw_buf_free(&good);
    kw_codec_destroy(c);
}
END_TEST

static Suite *record_suite(void)
{
    Suite *s = suite_create("wal_record");
    TCase *tc = tcase_create("crc32c");
    tcase_add_test(tc, crc32c_known_answers);
    tcase_add_test(tc, crc32c_paths_agree_on_every_length_and_alignment);
    suite_add_tcase(s, tc);
    tc = tcase_create("record");
    tcase_add_test(tc, kind_names_round_trip);
    tcase_add_test(tc, raw_record_round_trip_has_the_documented_header);
    tcase_add_test(tc, zstd_record_round_trip);
    tcase_add_test(tc, codec_create_refuses_bad_levels_and_oversized_payloads);
    tcase_add_test(tc, crc_is_payload_then_zeroed_header);
    tcase_add_test(tc, unsealed_then_sealed_equals_direct_build);
    suite_add_tcase(s, tc);
    tc = tcase_create("corruption");
    tcase_add_test(tc, every_single_byte_corruption_is_detected);
    tcase_add_test(tc, truncated_and_overlong_records_are_refused);
    tcase_add_test(tc, wrong_version_kind_codec_are_refused_with_a_valid_crc);
    tcase_add_test(tc, corrupt_zstd_payload_with_valid_crc_is_refused);
    tcase_add_test(tc, raw_length_over_the_record_limit_is_refused);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- wal_payload ----------------------------------------------------------------------- */

START_TEST(builders_write_little_endian)
{
    kw_buf b = {0};
    ck_assert_ok(kw_put_u8(&b, 0xA5));
    ck_assert_ok(kw_put_u32(&b, 0x11223344u));
    ck_assert_ok(kw_put_u64(&b, 0x0102030405060708ull));
    ck_assert_ok(kw_put_bytes(&b, "xyz", 3));
    ck_assert_ok(kw_put_bytes(&b, NULL, 0));
    static const unsigned char want[] = {0xA5, 0x44, 0x33, 0x22, 0x11, 8, 7, 6, 5, 4, 3, 2, 1, 'x', 'y', 'z'};
    ck_assert_uint_eq(b.len, sizeof want);
    ck_assert(memcmp(b.p, want, sizeof want) == 0);
    /* growth keeps what was written */
    unsigned char big[5000];
    rnd_fill(big, sizeof big);
    ck_assert_ok(kw_put_bytes(&b, big, sizeof big));
    ck_assert_uint_eq(b.len, sizeof want + sizeof big);
    ck_assert_uint_ge(b.cap, b.len);
    ck_assert(memcmp(b.p, want, sizeof want) == 0);
    ck_assert(memcmp(b.p + sizeof want, big, sizeof big) == 0);
    ck_assert_ok(kw_buf_reserve(&b, 0));
    kw_buf_free(&b);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_uint_eq(b.cap, 0);
    kw_buf_free(&b); /* twice is fine */
}
END_TEST

START_TEST(cursor_reads_in_bounds_and_flags_overruns)
{
    static const unsigned char p[] = {0xA5, 0x44, 0x33, 0x22, 0x11, 8, 7, 6, 5, 4, 3, 2, 1, 'x', 'y', 'z'};
    kw_cursor c = kw_cursor_make(p, sizeof p);
    ck_assert(!kw_cursor_done(&c));
    ck_assert_uint_eq(kw_get_u8(&c), 0xA5);
    ck_assert_uint_eq(kw_get_u32(&c), 0x11223344u);
    ck_assert_uint_eq(kw_get_u64(&c), 0x0102030405060708ull);
    const char *s = kw_get_bytes(&c, 3);
    ck_assert_ptr_eq(s, (const char *)p + 13);
    ck_assert(kw_cursor_done(&c));
    ck_assert(!c.bad);
    ck_assert_ptr_nonnull(kw_get_bytes(&c, 0)); /* zero bytes at the end: fine */
    ck_assert(!c.bad);
    ck_assert_uint_eq(kw_get_u8(&c), 0);
    ck_assert(c.bad);

    /* short reads of every width return zeros and set bad */
    for (size_t avail = 0; avail < 8; avail++) {
        static const unsigned char ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        kw_cursor k = kw_cursor_make(ones, avail);
        uint64_t v = kw_get_u64(&k);
        ck_assert_msg(k.bad, "u64 over %zu bytes did not set bad", avail);
        ck_assert_msg(v == 0, "u64 over %zu bytes returned 0x%llx, not 0", avail, (unsigned long long)v);
        if (avail < 4) {
            k = kw_cursor_make(ones, avail);
            ck_assert_uint_eq(kw_get_u32(&k), 0);
            ck_assert(k.bad);
        }
        k = kw_cursor_make(ones, avail);
        ck_assert_ptr_null(kw_get_bytes(&k, avail + 1));
        ck_assert(k.bad);
    }
    /* bad is sticky: later reads that would fit still fail */
    kw_cursor k = kw_cursor_make(p, sizeof p);
    ck_assert_ptr_null(kw_get_bytes(&k, sizeof p + 1));
    ck_assert(k.bad);
    ck_assert_uint_eq(kw_get_u8(&k), 0);
    ck_assert_uint_eq(kw_get_u32(&k), 0);
    ck_assert_ptr_null(kw_get_bytes(&k, 1));
    /* a huge length does not wrap around */
    k = kw_cursor_make(p, sizeof p);
    kw_get_u8(&k);
    ck_assert_ptr_null(kw_get_bytes(&k, SIZE_MAX));
    ck_assert(k.bad);
    /* an empty cursor is done */
    k = kw_cursor_make(p, 0);
    ck_assert(kw_cursor_done(&k));
}
END_TEST

static void sample_schema(kw_schema *s)
{
    static kw_field pos[3], hp[1], tagf[1];
    static kw_component comps[3];
    memset(pos, 0, sizeof pos);
    memset(comps, 0, sizeof comps);
    snprintf(pos[0].name, sizeof pos[0].name, "x");
    pos[0].type = 9, pos[0].offset = 0, pos[0].count = 1;
    snprintf(pos[1].name, sizeof pos[1].name, "y");
    pos[1].type = 9, pos[1].offset = 4, pos[1].count = 1;
    snprintf(pos[2].name, sizeof pos[2].name, "%s", "a_field_name_of_exactly_sixty_three_characters_long_for_limits_");
    pos[2].type = 13, pos[2].offset = 8, pos[2].count = 8;
    snprintf(hp[0].name, sizeof hp[0].name, "hp");
    hp[0].type = 3, hp[0].offset = 0, hp[0].count = 1;
    (void)tagf;
    comps[0] = (kw_component){.id = 1, .size = 16, .align = 4, .discipline = 0, .nfields = 3, .fields = pos};
    snprintf(comps[0].name, sizeof comps[0].name, "position");
    comps[1] = (kw_component){.id = 2, .size = 4, .align = 4, .discipline = 1, .nfields = 1, .fields = hp};
    snprintf(comps[1].name, sizeof comps[1].name, "health");
    comps[2] = (kw_component){.id = 3, .size = 0, .align = 1, .discipline = 2, .nfields = 0, .fields = NULL};
    snprintf(comps[2].name, sizeof comps[2].name, "tag");
    *s = (kw_schema){.ncomps = 3, .comps = comps};
}

START_TEST(schema_round_trip)
{
    kw_schema in, out;
    sample_schema(&in);
    ck_assert_uint_eq(strlen(in.comps[0].fields[2].name), 63);
    kw_buf b = {0};
    ck_assert_ok(kw_schema_encode(&in, &b));
    /* the documented layout, spot-checked */
    ck_assert_uint_eq(rd32(b.p), 3);                 /* ncomps */
    ck_assert_uint_eq(rd32(b.p + 4), 1);             /* id */
    ck_assert_uint_eq(rd32(b.p + 8), 16);            /* size */
    ck_assert_uint_eq(rd32(b.p + 12), 4);            /* align */
    ck_assert_uint_eq(rd32(b.p + 16), 0);            /* discipline */
    ck_assert_uint_eq(b.p[20], 8);                   /* name length */
    ck_assert(memcmp(b.p + 21, "position", 8) == 0); /* no terminator */
    ck_assert_uint_eq(rd32(b.p + 29), 3);            /* nfields */
    ck_assert_uint_eq(b.p[33], 1);
    ck_assert_uint_eq(b.p[34], 'x');
    ck_assert_uint_eq(rd32(b.p + 35), 9);            /* type */
    ck_assert_uint_eq(rd32(b.p + 39), 0);            /* offset */
    ck_assert_uint_eq(rd32(b.p + 43), 1);            /* count */

    memset(&out, 0x5A, sizeof out);
    ck_assert_ok(kw_schema_decode(b.p, b.len, &out));
    ck_assert_uint_eq(out.ncomps, 3);
    for (uint32_t i = 0; i < 3; i++) {
        const kw_component *a = &in.comps[i], *k = &out.comps[i];
        ck_assert_uint_eq(k->id, a->id);
        ck_assert_str_eq(k->name, a->name);
        ck_assert_uint_eq(k->size, a->size);
        ck_assert_uint_eq(k->align, a->align);
        ck_assert_uint_eq(k->discipline, a->discipline);
        ck_assert_uint_eq(k->nfields, a->nfields);
        for (uint32_t f = 0; f < a->nfields; f++) {
            ck_assert_str_eq(k->fields[f].name, a->fields[f].name);
            ck_assert_uint_eq(k->fields[f].type, a->fields[f].type);
            ck_assert_uint_eq(k->fields[f].offset, a->fields[f].offset);
            ck_assert_uint_eq(k->fields[f].count, a->fields[f].count);
        }
        ck_assert_ptr_eq(kw_schema_get(&out, i + 1), k);
    }
    ck_assert_ptr_null(kw_schema_get(&out, 0));
    ck_assert_ptr_null(kw_schema_get(&out, 4));
    ck_assert_ptr_null(kw_schema_get(NULL, 1));
    /* re-encoding the decoded schema gives the same bytes */
    kw_buf again = {0};
    ck_assert_ok(kw_schema_encode(&out, &again));
    ck_assert_uint_eq(again.len, b.len);
    ck_assert(memcmp(again.p, b.p, b.len) == 0);
    kw_schema_free(&out);
    ck_assert_ptr_null(out.comps);
    ck_assert_uint_eq(out.ncomps, 0);
    kw_schema_free(&out);
    kw_schema_free(NULL);

    /* an empty schema */
    kw_schema empty = {0};
    b.len = 0;
    ck_assert_ok(kw_schema_encode(&empty, &b));
    ck_assert_uint_eq(b.len, 4);
    ck_assert_ok(kw_schema_decode(b.p, b.len, &out));
    ck_assert_uint_eq(out.ncomps, 0);
    kw_schema_free(&out);
    kw_buf_free(&again);
    kw_buf_free(&b);
}
END_TEST

START_TEST(schema_truncated_or_padded_is_corrupt)
{
    kw_schema in, out;
    sample_schema(&in);
    kw_buf b = {0};
    ck_assert_ok(kw_schema_encode(&in, &b));
    for (size_t len = 0; len < b.len; len++) {
        unsigned char *p = malloc(len ? len : 1);
        memcpy(p, b.p, len);
        ck_assert_msg(kw_schema_decode(p, len, &out) == KEEL_ECORRUPT, "a %zu-byte prefix of %zu decoded", len, b.len);
        ck_assert(has(keel_last_error(), "schema payload"));
        free(p);
    }
    ck_assert_ok(kw_buf_reserve(&b, 1));
    b.p[b.len] = 0;
    ck_assert_rc(kw_schema_decode(b.p, b.len + 1, &out), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "trailing"));
    kw_buf_free(&b);
}
END_TEST

/* Build a one-component schema payload by hand, with knobs to break it. */
static void hand_schema(kw_buf *b, uint32_t ncomps, uint32_t id, uint32_t namelen, const char *name, uint32_t nfields,
                        uint32_t fnamelen, const char *fname)
{
    b->len = 0;
    kw_put_u32(b, ncomps);
    kw_put_u32(b, id);
    kw_put_u32(b, 8);
    kw_put_u32(b, 8);
    kw_put_u32(b, 0);
    kw_put_u8(b, (uint8_t)namelen);
    kw_put_bytes(b, name, namelen);
    kw_put_u32(b, nfields);
    for (uint32_t f = 0; f < nfields && f < 2; f++) {
        kw_put_u8(b, (uint8_t)fnamelen);
        kw_put_bytes(b, fname, fnamelen);
        kw_put_u32(b, 4);
        kw_put_u32(b, 0);
        kw_put_u32(b, 1);
    }
}

START_TEST(schema_malformed_payloads_are_corrupt)
{
    char longname[80];
    memset(longname, 'n', sizeof longname);
    kw_buf b = {0};
    kw_schema out;
    hand_schema(&b, 1, 1, 3, "pos", 1, 1, "x");
    ck_assert_ok(kw_schema_decode(b.p, b.len, &out)); /* the baseline is valid */
    ck_assert_str_eq(out.comps[0].name, "pos");
    kw_schema_free(&out);
    hand_schema(&b, 1, 1, 63, longname, 1, 63, longname);
    ck_assert_ok(kw_schema_decode(b.p, b.len, &out)); /* 63 is the longest name */
    kw_schema_free(&out);

    hand_schema(&b, 256, 1, 3, "pos", 1, 1, "x");
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "256"));
    hand_schema(&b, 0xffffffffu, 1, 3, "pos", 1, 1, "x");
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    hand_schema(&b, 1, 2, 3, "pos", 1, 1, "x"); /* ids must be 1, 2, ... */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "component 1"));
    hand_schema(&b, 1, 1, 64, longname, 1, 1, "x"); /* component name too long */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    hand_schema(&b, 1, 1, 0, "", 1, 1, "x");
    ck_assert_ok(kw_schema_decode(b.p, b.len, &out)); /* an empty name decodes; the runtime rejects it later */
    kw_schema_free(&out);
    hand_schema(&b, 1, 1, 3, "p\0s", 1, 1, "x"); /* NUL inside a name */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    hand_schema(&b, 1, 1, 3, "pos", 65, 1, "x"); /* more fields than a component can have */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    hand_schema(&b, 1, 1, 3, "pos", 1, 64, longname); /* field name too long */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "field 0"));
    ck_assert(has(keel_last_error(), "'pos'"));
    hand_schema(&b, 1, 1, 3, "pos", 2, 1, "\0"); /* NUL field name */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    hand_schema(&b, 2, 1, 3, "pos", 1, 1, "x"); /* promises a second component */
    ck_assert_rc(kw_schema_decode(b.p, b.len, &out), KEEL_ECORRUPT);
    ck_assert_rc(kw_schema_decode(NULL, 0, &out), KEEL_ECORRUPT);
    kw_buf_free(&b);
}
END_TEST

START_TEST(schema_random_damage_never_crashes)
{
    kw_schema in, out;
    sample_schema(&in);
    kw_buf b = {0};
    ck_assert_ok(kw_schema_encode(&in, &b));
    unsigned char *p = malloc(b.len);
    for (size_t at = 0; at < b.len; at++)
        for (unsigned x = 1; x < 256; x += 3) {
            memcpy(p, b.p, b.len);
            p[at] ^= (unsigned char)x;
            int rc = kw_schema_decode(p, b.len, &out);
            ck_assert_msg(rc == KEEL_OK || rc == KEEL_ECORRUPT, "byte %zu: %s", at, keel_strerror(rc));
            if (rc == KEEL_OK) {
                for (uint32_t i = 0; i < out.ncomps; i++) {
                    ck_assert_uint_eq(out.comps[i].id, i + 1);
                    ck_assert_uint_le(strlen(out.comps[i].name), KW_NAME_MAX);
                    ck_assert_uint_le(out.comps[i].nfields, 64);
                }
                kw_schema_free(&out);
            }
        }
    free(p);
    kw_buf_free(&b);
}
END_TEST

START_TEST(checkpoint_meta_layout_and_round_trip)
{
    kw_checkpoint_meta m = {.tick = 0x1112131415161718ull, .lsn = 0x2122232425262728ull,
                            .created_ns = 0x3132333435363738ull, .count = 0x41424344u};
    unsigned char out[32];
    memset(out, 0xEE, sizeof out);
    kw_checkpoint_meta_encode(&m, out);
    static const unsigned char want[32] = {0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 0x28, 0x27, 0x26,
                                           0x25, 0x24, 0x23, 0x22, 0x21, 0x38, 0x37, 0x36, 0x35, 0x34, 0x33,
                                           0x32, 0x31, 0x44, 0x43, 0x42, 0x41, 0,    0,    0,    0};
    ck_assert(memcmp(out, want, 32) == 0);
    kw_checkpoint_meta back;
    memset(&back, 0, sizeof back);
    ck_assert_ok(kw_checkpoint_meta_decode(out, 32, &back));
    ck_assert_uint_eq(back.tick, m.tick);
    ck_assert_uint_eq(back.lsn, m.lsn);
    ck_assert_uint_eq(back.created_ns, m.created_ns);
    ck_assert_uint_eq(back.count, m.count);
    unsigned char big[40] = {0};
    memcpy(big, out, 32);
    static const size_t bad[] = {0, 1, 24, 28, 31, 33, 40};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(kw_checkpoint_meta_decode(big, bad[i], &back) == KEEL_ECORRUPT, "%zu bytes decoded", bad[i]);
        char w[32];
        snprintf(w, sizeof w, "%zu bytes", bad[i]);
        ck_assert(has(keel_last_error(), w));
    }
}
END_TEST

START_TEST(snap_keys_are_big_endian_and_sort_numerically)
{
    unsigned char k[9];
    ck_assert_uint_eq(kw_snap_key_slots(k, 0x01020304u), 5);
    static const unsigned char ws[5] = {'S', 1, 2, 3, 4};
    ck_assert(memcmp(k, ws, 5) == 0);
    ck_assert_uint_eq(kw_snap_key_chunk(k, 0x0A0B0C0Du, 0x01020304u), 9);
    static const unsigned char wc[9] = {'C', 0x0A, 0x0B, 0x0C, 0x0D, 1, 2, 3, 4};
    ck_assert(memcmp(k, wc, 9) == 0);
    /* memcmp order (LMDB's) is numeric order: table first, then chunk */
    static const uint32_t t[] = {0, 0, 0, 1, 1, 255, 256, 65536};
    static const uint32_t c[] = {0, 1, 256, 0, 0xffffffffu, 7, 0, 0};
    for (size_t i = 1; i < sizeof t / sizeof t[0]; i++) {
        unsigned char a[9], b[9];
        kw_snap_key_chunk(a, t[i - 1], c[i - 1]);
        kw_snap_key_chunk(b, t[i], c[i]);
        ck_assert_int_lt(memcmp(a, b, 9), 0);
        ck_assert_uint_eq(rdbe32(b + 1), t[i]);
        ck_assert_uint_eq(rdbe32(b + 5), c[i]);
    }
    unsigned char a[5], b[5];
    kw_snap_key_slots(a, 255);
    kw_snap_key_slots(b, 256);
    ck_assert_int_lt(memcmp(a, b, 5), 0);
    ck_assert_str_eq(KW_META_FORMAT, "format");
    ck_assert_str_eq(KW_META_CHECKPOINT, "checkpoint");
    ck_assert_str_eq(KW_SCHEMA_KEY, "components");
}
END_TEST

static Suite *payload_suite(void)
{
    Suite *s = suite_create("wal_payload");
    TCase *tc = tcase_create("cursor");
    tcase_add_test(tc, builders_write_little_endian);
    tcase_add_test(tc, cursor_reads_in_bounds_and_flags_overruns);
    suite_add_tcase(s, tc);
    tc = tcase_create("schema");
    tcase_add_test(tc, schema_round_trip);
    tcase_add_test(tc, schema_truncated_or_padded_is_corrupt);
    tcase_add_test(tc, schema_malformed_payloads_are_corrupt);
    tcase_add_test(tc, schema_random_damage_never_crashes);
    suite_add_tcase(s, tc);
    tc = tcase_create("keys");
    tcase_add_test(tc, checkpoint_meta_layout_and_round_trip);
    tcase_add_test(tc, snap_keys_are_big_endian_and_sort_numerically);
    suite_add_tcase(s, tc);
    return s;
}
