/*
 * test_wal -- libkeel_wal on its own: the KWR1 record (CRC32C, build,
 * check, seal, codecs, corruption), the payload layer (cursor, schema,
 * checkpoint meta, snap keys, the snap payload decoders) and the LMDB store (open, append, iterate,
 * delete, map growth, injected failures, format versions), and the
 * regressions for what the fuzz targets of tests/fuzz found (wal_fuzz).
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include "keel_test.h"
#include "keel_wal/wal.h"
#include "test_util.h"
#include "../wal/planar.h" /* the planar transform alone: its accesses, in buffers of exact length */

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
        {KW_KIND_SNAP_KEYS, "snap_keys"},     {KW_KIND_EPOCH, "epoch"},             {KW_KIND_SIDES, "sides"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        ck_assert_str_eq(kw_kind_name(kinds[i].kind), kinds[i].name);
        ck_assert_uint_eq(kw_kind_parse(kinds[i].name), kinds[i].kind);
        uint32_t k = kinds[i].kind; /* the kinds the decoder walks */
        ck_assert(kw_kind_has_changes(k) == (k == KW_KIND_TICK_CHUNK || k == KW_KIND_LIFECYCLE ||
                                             k == KW_KIND_SIDE || k == KW_KIND_SIDES));
    }
    static const uint32_t unknown[] = {0, 9, 10, 15, 20, 255, 256, UINT32_MAX};
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

/* ---- the planar form (codec 2, docs/wal-format.md "Codecs") ---- */

/* A TICK_CHUNK payload of four groups: 12-byte floats for 3000 entities
 * three indices apart, one 4-byte value, a tag (size 0) and 333 values of
 * an odd size. */
static size_t tick_chunk_payload(unsigned char *out)
{
    static const uint32_t comps[] = {1, 3, 5, 7}, sizes[] = {12, 4, 0, 7}, ns[] = {3000, 1, 40, 333};
    unsigned char *p = out + 4;
    wr32(out, 4);
    for (uint32_t g = 0; g < 4; g++) {
        wr32(p, comps[g]);
        wr32(p + 4, sizes[g]);
        wr32(p + 8, ns[g]);
        p += 12;
        for (uint32_t i = 0; i < ns[g]; i++) {
            uint64_t e = KEEL_ENTITY_MAKE(i * 3 + g + 1, 1 + (i % 7 == 0));
            memcpy(p + (size_t)i * 8, &e, 8);
        }
        p += (size_t)ns[g] * 8;
        for (uint32_t i = 0; i < ns[g]; i++)
            for (uint32_t b = 0; b < sizes[g]; b++) {
                float f = (float)i * 0.25f + (float)b;
                p[(size_t)i * sizes[g] + b] = sizes[g] == 12 ? ((unsigned char *)&f)[b % 4] : (unsigned char)(i * 31 + b);
            }
        p += (size_t)ns[g] * sizes[g];
    }
    return (size_t)(p - out);
}

/* The planes of the document, computed here on their own: n handles at
 * in as 8 planes of their differences (returns the bytes written) ... */
static size_t ref_entity_planes(const unsigned char *in, unsigned char *out, uint32_t n)
{
    uint64_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t e = rd64(in + (size_t)i * 8), d = e - prev;
        prev = e;
        for (uint32_t b = 0; b < 8; b++)
            out[(size_t)b * n + i] = (unsigned char)(d >> (8 * b));
    }
    return (size_t)n * 8;
}

/* ... and n values of size bytes as `size` planes. */
static size_t ref_value_planes(const unsigned char *in, unsigned char *out, uint32_t n, uint32_t size)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t b = 0; b < size; b++)
            out[(size_t)b * n + i] = in[(size_t)i * size + b];
    return (size_t)n * size;
}

/* The planar form of a tick_chunk payload as the document states it. */
static void ref_planar(const unsigned char *in, size_t len, unsigned char *out)
{
    uint32_t ngroups = rd32(in);
    memcpy(out, in, 4);
    size_t off = 4;
    for (uint32_t g = 0; g < ngroups; g++) {
        uint32_t size = rd32(in + off + 4), n = rd32(in + off + 8);
        memcpy(out + off, in + off, 12);
        off += 12;
        off += ref_entity_planes(in + off, out + off, n);
        off += ref_value_planes(in + off, out + off, n, size);
    }
    ck_assert_uint_eq(off, len);
}

/* A payload of `kind` (len bytes) built by the default codec: codec 2, the
 * stored frame holding `planar` (the form computed by the test), the
 * payload back through two contexts (one twice: its scratch reused); built
 * by a plain context: codec 1, and larger. *out gets the planar record. */
static void check_planar_round_trip(uint32_t kind, uint64_t lsn, const unsigned char *payload, size_t len,
                                    const unsigned char *planar, kw_buf *out)
{
    kw_codec_ctx *c = codec(), *plain = NULL;
    ck_assert_ok(kw_codec_create(&(kw_codec_desc){.plain = true}, &plain));
    kw_buf b = {0};
    kw_header h, hp;
    const void *p;
    unsigned char *got = malloc(len);
    ck_assert_ok(kw_record_build(c, out, kind, lsn, 4, 0, payload, len));
    ck_assert_ok(kw_record_check(out->p, out->len, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_ZSTD_PLANAR);
    ck_assert_uint_eq(h.raw_len, len);
    ck_assert_uint_eq(ZSTD_decompress(got, len, out->p + KW_HEADER_SIZE, h.stored_len), len);
    ck_assert(memcmp(got, planar, len) == 0);
    ck_assert(memcmp(planar, payload, len) != 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_ok(kw_record_payload(i == 2 ? plain : c, out->p, &h, &p));
        ck_assert(memcmp(p, payload, len) == 0);
    }
    ck_assert_ok(kw_record_build(plain, &b, kind, lsn + 1, 4, 0, payload, len));
    ck_assert_ok(kw_record_check(b.p, b.len, &hp));
    ck_assert_uint_eq(hp.codec, KW_CODEC_ZSTD);
    ck_assert_uint_lt(h.stored_len, hp.stored_len);
    ck_assert_ok(kw_record_payload(c, b.p, &hp, &p));
    ck_assert(memcmp(p, payload, len) == 0);
    free(got);
    kw_buf_free(&b);
    kw_codec_destroy(c);
    kw_codec_destroy(plain);
}

START_TEST(planar_record_round_trip_and_documented_form)
{
    enum { CAP = 80000 };
    unsigned char *payload = malloc(CAP), *want = malloc(CAP);
    size_t len = tick_chunk_payload(payload);
    ck_assert_uint_lt(len, CAP);
    kw_codec_ctx *c = codec();
    kw_buf a = {0}, b = {0};
    kw_header hp;
    const void *p;
    ref_planar(payload, len, want);
    check_planar_round_trip(KW_KIND_TICK_CHUNK, 20, payload, len, want, &a);

    /* other kinds never take the planar codec, even with a group layout */
    b.len = 0;
    ck_assert_ok(kw_record_build(c, &b, KW_KIND_SIDE, 22, 4, 0, payload, len));
    ck_assert_ok(kw_record_check(b.p, b.len, &hp));
    ck_assert_uint_eq(hp.codec, KW_CODEC_ZSTD);

    /* not a group layout (one byte after the last group): plain zstd */
    b.len = 0;
    payload[len] = 0;
    ck_assert_ok(kw_record_build(c, &b, KW_KIND_TICK_CHUNK, 23, 4, 0, payload, len + 1));
    ck_assert_ok(kw_record_check(b.p, b.len, &hp));
    ck_assert_uint_eq(hp.codec, KW_CODEC_ZSTD);
    ck_assert_ok(kw_record_payload(c, b.p, &hp, &p));
    ck_assert(memcmp(p, payload, len + 1) == 0);

    ck_assert_str_eq(kw_codec_name(KW_CODEC_RAW), "raw");
    ck_assert_str_eq(kw_codec_name(KW_CODEC_ZSTD), "zstd");
    ck_assert_str_eq(kw_codec_name(KW_CODEC_ZSTD_PLANAR), "zstd-planar");
    ck_assert_str_eq(kw_codec_name(3), "?");
    kw_buf_free(&a);
    kw_buf_free(&b);
    kw_codec_destroy(c);
    free(payload);
    free(want);
}
END_TEST

/* A zstd-planar record with good's header whose stored frame holds
 * planar[0..len): kw_record_check accepts it (valid frame, valid CRC),
 * kw_record_payload refuses it with a sentence naming good's LSN and `why`. */
static void expect_planar_refused(kw_codec_ctx *c, const kw_buf *good, const unsigned char *planar, size_t len,
                                  unsigned char *rec, size_t cap, const char *why)
{
    size_t z = ZSTD_compress(rec + KW_HEADER_SIZE, cap - KW_HEADER_SIZE, planar, len, 1);
    ck_assert(!ZSTD_isError(z));
    memcpy(rec, good->p, KW_HEADER_SIZE);
    wr32(rec + 32, (uint32_t)len);
    wr32(rec + 36, (uint32_t)z);
    reseal(rec, KW_HEADER_SIZE + z);
    kw_header h;
    const void *p;
    ck_assert_ok(kw_record_check(rec, KW_HEADER_SIZE + z, &h));
    ck_assert_uint_eq(h.codec, KW_CODEC_ZSTD_PLANAR);
    ck_assert_rc(kw_record_payload(c, rec, &h, &p), KEEL_ECORRUPT);
    char lsn[32];
    snprintf(lsn, sizeof lsn, "LSN %llu", (unsigned long long)rd64(good->p + 8));
    ck_assert_msg(has(keel_last_error(), lsn) && has(keel_last_error(), "planar form") && has(keel_last_error(), why),
                  "want '%s': %s", why, keel_last_error());
}

/* A zstd-planar record with a valid frame and CRC whose planar form does
 * not parse: refused by kw_record_payload, naming the LSN, the group and
 * why, never read past; the codec on another kind is refused by
 * kw_record_check. */
START_TEST(planar_form_that_does_not_parse_is_corrupt)
{
    enum { CAP = 80000 };
    unsigned char *payload = malloc(CAP), *planar = malloc(CAP), *rec = malloc(CAP + KW_HEADER_SIZE + 1024);
    size_t len = tick_chunk_payload(payload), reccap = CAP + KW_HEADER_SIZE + 1024;
    kw_codec_ctx *c = codec();
    kw_buf good = {0};
    ck_assert_ok(kw_record_build(c, &good, KW_KIND_TICK_CHUNK, 30, 5, 0, payload, len));
    const struct {
        size_t at;     /* a u32 to change in the planar form (the first group's header is at 4) */
        uint32_t value;
        size_t len;    /* the planar form's length */
        const char *why;
    } lies[] = {
        {0, 5, len, "ends inside the header of group 4"},            /* one group more than there is */
        {0, 0xffffffffu, len, "ends inside the header of group 4"},  /* ever so many */
        {0, 3, len, "has bytes after its last group"},               /* one group fewer */
        {12, (uint32_t)((len - 16) / 20 + 1), len, "ends inside the rows of group 0"}, /* one row too many */
        {12, 0x80000000u, len, "ends inside the rows of group 0"},   /* n * (8 + size) over 32 bits */
        {8, 0xffffffffu, len, "ends inside the rows of group 0"},    /* 8 + size over 32 bits */
        {0, 1, 4 + 12, "ends inside the rows of group 0"},           /* a group header and nothing after it */
        {0, 1, 4 + 7, "ends inside the header of group 0"},          /* a group header cut off */
        {0, 0, 3, "is shorter than its 4-byte group count"},
        {0, 0, 0, "is shorter than its 4-byte group count"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        ref_planar(payload, len, planar);
        if (lies[i].len >= 4)
            wr32(planar + lies[i].at, lies[i].value);
        expect_planar_refused(c, &good, planar, lies[i].len, rec, reccap, lies[i].why);
    }
    /* one group of no rows, then stray bytes */
    ref_planar(payload, len, planar);
    wr32(planar, 1);
    wr32(planar + 12, 0);
    expect_planar_refused(c, &good, planar, 4 + 12 + 9, rec, reccap, "has bytes after its last group");
    /* the same frame, intact, reads back (the cases above differ only by their lie) */
    kw_header h;
    const void *p;
    ck_assert_ok(kw_record_check(good.p, good.len, &h));
    ck_assert_ok(kw_record_payload(c, good.p, &h, &p));
    ck_assert(memcmp(p, payload, len) == 0);
    /* codec 2 on a kind other than tick_chunk */
    static const uint8_t kinds[] = {KW_KIND_SIDE, KW_KIND_LIFECYCLE, KW_KIND_TICK_COMMIT, KW_KIND_SNAP_SLOTS};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        memcpy(rec, good.p, good.len);
        rec[6] = kinds[i];
        reseal(rec, good.len);
        ck_assert_rc(kw_record_check(rec, good.len, NULL), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), "zstd-planar") && has(keel_last_error(), kw_kind_name(kinds[i])), "%s",
                      keel_last_error());
    }
    kw_buf_free(&good);
    kw_codec_destroy(c);
    free(payload);
    free(planar);
    free(rec);
}
END_TEST

/* A SNAP_CHUNK payload: table 2, chunk 1, `count` rows of entities a few
 * indices apart, columns of 12 (floats), 4 and 3 bytes. */
static size_t snap_chunk_payload(unsigned char *out, uint32_t count)
{
    static const uint32_t comps[] = {1, 3, 9}, sizes[] = {12, 4, 3};
    wr32(out, 2), wr32(out + 4, 1), wr32(out + 8, count), wr32(out + 12, 3);
    unsigned char *p = out + 16;
    for (int c = 0; c < 3; c++, p += 8)
        wr32(p, comps[c]), wr32(p + 4, sizes[c]);
    for (uint32_t i = 0; i < count; i++, p += 8) {
        uint64_t e = KEEL_ENTITY_MAKE(i * 2 + 5 + (i % 9 == 0), 3);
        memcpy(p, &e, 8);
    }
    for (int c = 0; c < 3; c++)
        for (uint32_t i = 0; i < count; i++)
            for (uint32_t b = 0; b < sizes[c]; b++, p++) {
                float f = (float)i * 0.5f + 100.0f;
                *p = c == 0 ? ((unsigned char *)&f)[b % 4] : (unsigned char)(i >> (8 * b));
            }
    return (size_t)(p - out);
}

/* The planar form of a snap_chunk payload as the document states it. */
static void ref_snap_planar(const unsigned char *in, size_t len, unsigned char *out)
{
    uint32_t count = rd32(in + 8), ncols = rd32(in + 12);
    size_t off = 16 + (size_t)ncols * 8;
    memcpy(out, in, off);
    off += ref_entity_planes(in + off, out + off, count);
    for (uint32_t c = 0; c < ncols; c++)
        off += ref_value_planes(in + off, out + off, count, rd32(in + 16 + (size_t)c * 8 + 4));
    ck_assert_uint_eq(off, len);
}

/* The planar form is transposed by 16-row tiles where a tile's 16-byte
 * accesses stay inside the rows (docs/wal-format.md says nothing of
 * tiles: the form is the same). For every value size from 1 to 40 and
 * every row count up to 80 (each remainder of the tiles, for every size)
 * and 257: a one-group TICK_CHUNK and a one-column SNAP_CHUNK of
 * pseudo-random bytes encode to the documented form and decode back, each
 * into a buffer of exactly its length (so that a sanitizer sees an access
 * past the rows either way); and the record codec stores that form (a few
 * values per byte, so that zstd shrinks all but the smallest payloads, which
 * are stored raw) and reads the payload back. */
START_TEST(planar_form_of_every_size_and_row_count)
{
    enum { MAXN = 257, MAXS = 40, CAP = 16 + 8 + MAXN * (8 + MAXS) };
    unsigned char *payload = malloc(CAP), *want = malloc(CAP), *got = malloc(CAP);
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(&(kw_codec_desc){.min_compress = 1}, &c));
    kw_buf rec = {0};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    uint32_t stored_planar = 0;
    for (uint32_t size = 1; size <= MAXS; size++)
        for (uint32_t n = 0; n <= MAXN; n = n == 80 ? MAXN : n + 1)
            for (uint32_t kind = 0; kind < 2; kind++) {
                bool snap = kind == 1;
                const char *what = snap ? "snap_chunk" : "tick_chunk";
                size_t hdr = snap ? 24 : 16, len = hdr + (size_t)n * (8 + size);
                if (snap) /* table 1, chunk 0, n rows, one column: component 4 of size bytes */
                    wr32(payload, 1), wr32(payload + 4, 0), wr32(payload + 8, n), wr32(payload + 12, 1),
                        wr32(payload + 16, 4), wr32(payload + 20, size);
                else /* one group: component 4, size bytes, n rows */
                    wr32(payload, 1), wr32(payload + 4, 4), wr32(payload + 8, size), wr32(payload + 12, n);
                uint64_t e = KEEL_ENTITY_MAKE(size, 1);
                for (uint32_t i = 0; i < n; i++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    e += 1 + (x >> 58) + ((x & 0xff) == 0 ? (uint64_t)1 << 40 : 0); /* small steps, now and then a big one */
                    memcpy(payload + hdr + (size_t)i * 8, &e, 8);
                }
                for (size_t b = hdr + (size_t)n * 8; b < len; b++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    payload[b] = (unsigned char)(x >> 61) * 37;
                }
                if (snap)
                    ref_snap_planar(payload, len, want);
                else
                    ref_planar(payload, len, want);
                uint32_t k2 = snap ? KW_KIND_SNAP_CHUNK : KW_KIND_TICK_CHUNK, part;
                unsigned char *in = malloc(len), *out = malloc(len), *back = malloc(len);
                memcpy(in, payload, len);
                ck_assert(planar_encode(k2, in, len, out));
                ck_assert_msg(memcmp(out, want, len) == 0, "size %u, %u rows, %s: not the documented form", size,
                              n, what);
                ck_assert_ptr_null(planar_decode(k2, out, len, back, &part));
                ck_assert_msg(memcmp(back, payload, len) == 0, "size %u, %u rows, %s: decoded differs", size, n,
                              what);
                free(in);
                free(out);
                free(back);
                kw_header h;
                const void *read;
                rec.len = 0;
                ck_assert_ok(kw_record_build(c, &rec, k2, 1 + size, 4, 0, payload, len));
                ck_assert_ok(kw_record_check(rec.p, rec.len, &h));
                ck_assert_msg(h.codec == KW_CODEC_ZSTD_PLANAR || (h.codec == KW_CODEC_RAW && len < 256),
                              "size %u, %u rows: codec %u", size, n, h.codec);
                if (h.codec == KW_CODEC_ZSTD_PLANAR) {
                    ck_assert_uint_eq(ZSTD_decompress(got, CAP, rec.p + KW_HEADER_SIZE, h.stored_len), len);
                    ck_assert(memcmp(got, want, len) == 0);
                    stored_planar++;
                }
                ck_assert_ok(kw_record_payload(c, rec.p, &h, &read));
                ck_assert_msg(memcmp(read, payload, len) == 0, "size %u, %u rows, %s: read back differs", size, n,
                              what);
            }
    ck_assert_uint_ge(stored_planar, 40 * 2 * 60); /* the codec took the form, not only raw records */
    kw_buf_free(&rec);
    kw_codec_destroy(c);
    free(payload);
    free(want);
    free(got);
}
END_TEST

/* SNAP_CHUNK records take codec 2 too: the stored frame holds the
 * documented planar form, reads back through any context, is smaller than
 * plain zstd; a planar form that does not parse is refused, saying why. */
START_TEST(planar_snap_chunk_round_trip_and_refusals)
{
    enum { COUNT = 3000, CAP = 16 + 24 + COUNT * (8 + 19) + 64 };
    unsigned char *payload = malloc(CAP), *want = malloc(CAP), *lie = malloc(CAP), *rec = malloc(CAP + 1024);
    size_t len = snap_chunk_payload(payload, COUNT);
    ref_snap_planar(payload, len, want);
    kw_buf a = {0};
    check_planar_round_trip(KW_KIND_SNAP_CHUNK, 0, payload, len, want, &a);
    kw_codec_ctx *c = codec();
    const struct {
        size_t at;
        uint32_t value;
        size_t len;
        const char *why;
    } lies[] = {
        {8, COUNT + 1, len, "ends inside column 2"},                  /* one row more */
        {8, COUNT - 1, len, "has bytes after its last column"},        /* one row fewer */
        {8, 0xffffffffu, len, "ends inside its entities"},
        {12, 0x7fffffffu, len, "ends inside its column list"},
        {12, 2, len, "has bytes after its last column"},               /* a column fewer */
        {36, 0xfffffff0u, len, "ends inside column 2"},                /* column 2's size */
        {36, 1431656u, len, "ends inside column 2"},                   /* count x size wraps 32 bits to 704 */
        {0, 0, 15, "is shorter than its 16-byte chunk header"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        memcpy(lie, want, len);
        if (lies[i].len >= 16)
            wr32(lie + lies[i].at, lies[i].value);
        expect_planar_refused(c, &a, lie, lies[i].len, rec, CAP + 1024, lies[i].why);
    }
    kw_buf_free(&a);
    kw_codec_destroy(c);
    free(payload);
    free(want);
    free(lie);
    free(rec);
}
END_TEST

/* ---- out of memory for the planar scratch --------------------------------------- */

enum { OOM_ROWS = 3 << 20 }; /* a 60 MiB tick_chunk payload: one group of 12-byte values */

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) /* the test is skipped there */
/* The record in out (LSN 8) holds payload whole, with codec `want`: 0,
 * else a sentence on stderr and 1. */
static int oom_check(kw_codec_ctx *c, const kw_buf *out, const unsigned char *payload, size_t len, uint32_t want,
                     const char *when)
{
    kw_header h;
    const void *back = NULL;
    int rc = kw_record_check(out->p, out->len, &h);
    rc = rc ? rc : kw_record_payload(c, out->p, &h, &back);
    bool ok = !rc && h.codec == want && h.raw_len == len && !memcmp(back, payload, len);
    if (!ok)
        fprintf(stderr, "%s: %s (%s), codec %u, want %u\n", when, keel_strerror(rc), keel_last_error(),
                rc ? 0 : h.codec, want);
    return ok ? 0 : 1;
}

/* The child of planar_scratch_out_of_memory: exit status 0 when every check
 * holds, else the number of the first that failed (said on stderr). */
static int oom_child(void)
{
    size_t len = 4 + 12 + (size_t)OOM_ROWS * 20;
    unsigned char *payload = malloc(len), *p = payload + 16;
    kw_codec_ctx *c = NULL;
    if (!payload || kw_codec_create(NULL, &c))
        return 1;
    wr32(payload, 1);
    wr32(payload + 4, 1);
    wr32(payload + 8, 12);
    wr32(payload + 12, OOM_ROWS);
    for (uint32_t i = 0; i < OOM_ROWS; i++) {
        uint64_t e = KEEL_ENTITY_MAKE(i * 2 + 1, 1);
        memcpy(p + (size_t)i * 8, &e, 8);
        float v[3] = {(float)i * 0.5f, (float)(i % 1000), 1.0f};
        memcpy(p + (size_t)OOM_ROWS * 8 + (size_t)i * 12, v, 12);
    }
    struct rlimit old, lim;
    size_t vm = (size_t)tu_vm_size();
    if (!vm || getrlimit(RLIMIT_AS, &old))
        return 2;
    /* room for the record (header + zstd's bound, which the buffer's doubling
     * rounds up to 64 MiB) and about 12 MiB more (zstd's workspace), not for
     * a second payload-sized buffer: the planar scratch */
    lim = old;
    lim.rlim_cur = vm + KW_HEADER_SIZE + ZSTD_compressBound(len) + (16 << 20);
    if (setrlimit(RLIMIT_AS, &lim))
        return 3;
    char before[256];
    kw_codec_ctx *bad = NULL;
    kw_buf out = {0};
    (void)kw_codec_create(&(kw_codec_desc){.level = 1000}, &bad); /* a known last error */
    snprintf(before, sizeof before, "%s", keel_last_error());
    int rc = kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 8, 7, 0, payload, len);
    if (rc || strcmp(keel_last_error(), before)) {
        fprintf(stderr, "with the limit: %s; last error: %s\n", keel_strerror(rc), keel_last_error());
        return 4;
    }
    if (setrlimit(RLIMIT_AS, &old)) /* reading it back needs memory of its own */
        return 5;
    if (oom_check(c, &out, payload, len, KW_CODEC_ZSTD, "built with the limit"))
        return 6;
    out.len = 0;
    rc = kw_record_build(c, &out, KW_KIND_TICK_CHUNK, 8, 7, 0, payload, len); /* the context works on */
    if (rc || oom_check(c, &out, payload, len, KW_CODEC_ZSTD_PLANAR, "built without the limit"))
        return 7;
    kw_buf_free(&out);
    kw_codec_destroy(c);
    free(payload);
    return 0;
}
#endif

/* When the planar scratch cannot be allocated, a tick_chunk is compressed
 * as plain zstd instead (a form is an optimisation: it may cost bytes,
 * never the record), no error is set, and the same context takes the
 * planar form again once memory is back. The allocation is made to fail
 * by an address-space limit in a child process; the sanitizers reserve
 * terabytes of address space, so under them the test only says SKIPPED. */
START_TEST(planar_scratch_out_of_memory)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    fprintf(stderr, "planar_scratch_out_of_memory: SKIPPED under a sanitizer (RLIMIT_AS)\n");
#else
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(oom_child());
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: exit %d, signal %d",
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
#endif
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
    static const uint8_t kinds[] = {0, 9, 10, 15, 20, 21, 255};
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

/* kw_record_verify and kw_wal_check say why by code: recovery and the scan
 * steer by it, never by the sentence. */
START_TEST(record_faults_are_reported_by_code)
{
    kw_codec_ctx *c = codec();
    kw_buf r = {0};
    ck_assert_ok(kw_record_build(c, &r, KW_KIND_SIDE, 7, 3, 0, "payload bytes", 13));
    ck_assert_uint_eq(kw_record_peek_len(r.p), r.len);
    kw_header h;
    kw_fault f = KW_FAULT_GAP;
    ck_assert_ok(kw_record_verify(r.p, r.len, &h, &f));
    ck_assert_int_eq(f, KW_FAULT_NONE);
    ck_assert_uint_eq(h.lsn, 7);
    ck_assert_rc(kw_record_verify(r.p, 10, &h, &f), KEEL_ECORRUPT);
    ck_assert_int_eq(f, KW_FAULT_FRAME);
    unsigned char *bad = malloc(r.len);
    ck_assert_ptr_nonnull(bad);
    memcpy(bad, r.p, r.len);
    bad[0] = 'X';
    ck_assert_rc(kw_record_verify(bad, r.len, &h, &f), KEEL_ECORRUPT);
    ck_assert_int_eq(f, KW_FAULT_FRAME);
    memcpy(bad, r.p, r.len);
    wr16(bad + 4, 9); /* a version this build does not read, under a valid CRC */
    reseal(bad, r.len);
    ck_assert_rc(kw_record_verify(bad, r.len, &h, &f), KEEL_ECORRUPT);
    ck_assert_int_eq(f, KW_FAULT_HEADER);
    ck_assert_uint_eq(h.lsn, 7);
    memcpy(bad, r.p, r.len);
    bad[r.len - 1] ^= 0x40; /* a payload byte: the CRC fails */
    ck_assert_rc(kw_record_verify(bad, r.len, &h, &f), KEEL_ECORRUPT);
    ck_assert_int_eq(f, KW_FAULT_CRC);
    ck_assert(has(keel_last_error(), "LSN 7") && has(keel_last_error(), "CRC32C"));

    /* in a read of consecutive LSNs: the record stored under key 7 */
    ck_assert_ok(kw_wal_check(7, 7, r.p, r.len, &h, &f));
    ck_assert_int_eq(f, KW_FAULT_NONE);
    ck_assert_rc(kw_wal_check(7, 6, r.p, r.len, &h, &f), KEEL_ECORRUPT); /* 6 is missing */
    ck_assert_int_eq(f, KW_FAULT_GAP);
    ck_assert(has(keel_last_error(), "WAL record at LSN 7: LSNs are not consecutive"));
    ck_assert_rc(kw_wal_check(8, 8, r.p, r.len, &h, &f), KEEL_ECORRUPT); /* stored under another key */
    ck_assert_int_eq(f, KW_FAULT_KEY);
    ck_assert(has(keel_last_error(), "WAL record at LSN 8: the record's LSN differs from its key"));
    ck_assert_rc(kw_wal_check(7, 7, bad, r.len, &h, &f), KEEL_ECORRUPT);
    ck_assert_int_eq(f, KW_FAULT_CRC);
    ck_assert(has(keel_last_error(), "record at LSN 7 fails its CRC32C check"));
    ck_assert_rc(kw_wal_check(7, 7, "short", 5, NULL, &f), KEEL_ECORRUPT); /* no header: named by its key */
    ck_assert_int_eq(f, KW_FAULT_FRAME);
    ck_assert(has(keel_last_error(), "WAL record at LSN 7: record of 5 bytes is shorter"));
    free(bad);
    kw_buf_free(&r);
    kw_codec_destroy(c);
}
END_TEST

/* Defined with the store tests, whose fixture they are. */
static void root_setup(void);
static void root_teardown(void);

/* Add to s the test case `name` of the n tests; rooted: each in a fresh directory under the root. */
static void add_case(Suite *s, const char *name, bool rooted, const TTest *const *tests, size_t n)
{
    TCase *tc = tcase_create(name);
    if (rooted)
        tcase_add_unchecked_fixture(tc, root_setup, root_teardown);
    for (size_t i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
}

/* add_case over the tests listed. */
#define ADD_CASE(s, name, rooted, ...)                                                                   \
    add_case((s), (name), (rooted), (const TTest *const[]){__VA_ARGS__},                              \
             sizeof((const TTest *const[]){__VA_ARGS__}) / sizeof(const TTest *))

static Suite *record_suite(void)
{
    Suite *s = suite_create("wal_record");
    ADD_CASE(s, "crc32c", false, crc32c_known_answers, crc32c_paths_agree_on_every_length_and_alignment);
    ADD_CASE(s, "record", false, kind_names_round_trip, raw_record_round_trip_has_the_documented_header,
             zstd_record_round_trip, planar_record_round_trip_and_documented_form,
             planar_snap_chunk_round_trip_and_refusals, planar_form_of_every_size_and_row_count,
             planar_scratch_out_of_memory,
             codec_create_refuses_bad_levels_and_oversized_payloads, crc_is_payload_then_zeroed_header,
             unsealed_then_sealed_equals_direct_build);
    ADD_CASE(s, "corruption", false, every_single_byte_corruption_is_detected,
             truncated_and_overlong_records_are_refused,
             wrong_version_kind_codec_are_refused_with_a_valid_crc,
             corrupt_zstd_payload_with_valid_crc_is_refused, planar_form_that_does_not_parse_is_corrupt,
             raw_length_over_the_record_limit_is_refused, record_faults_are_reported_by_code);
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
    static kw_field pos[3], hp[1];
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

/* ---- snap payloads (wal/snap.c) ---------------------------------------------------- */

/* A SNAP_TABLES payload: two tables ({1,3} with 5 rows, {2} with 0). */
static void tables_payload(kw_buf *b)
{
    b->len = 0;
    ck_assert_ok(kw_put_u32(b, 2));
    ck_assert_ok(kw_put_u32(b, 1030)); /* nslots */
    ck_assert_ok(kw_put_u32(b, 5));    /* nlive */
    ck_assert_ok(kw_put_u32(b, 5));
    ck_assert_ok(kw_put_u32(b, 2));
    ck_assert_ok(kw_put_u32(b, 1));
    ck_assert_ok(kw_put_u32(b, 3));
    ck_assert_ok(kw_put_u32(b, 0));
    ck_assert_ok(kw_put_u32(b, 1));
    ck_assert_ok(kw_put_u32(b, 2));
}

START_TEST(snap_tables_decode_and_refuse_bad_lengths)
{
    kw_buf b = {0};
    tables_payload(&b);
    kw_snap_tables t;
    kw_snap_table tb;
    ck_assert_ok(kw_snap_tables_begin(&t, b.p, b.len));
    ck_assert_uint_eq(t.ntables, 2);
    ck_assert_uint_eq(t.nslots, 1030);
    ck_assert_uint_eq(t.nlive, 5);
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), 1);
    ck_assert_uint_eq(tb.rows, 5);
    ck_assert_uint_eq(tb.ncols, 2);
    ck_assert_uint_eq(tb.comps[0], 1);
    ck_assert_uint_eq(tb.comps[1], 3);
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), 1);
    ck_assert_uint_eq(tb.rows, 0);
    ck_assert_uint_eq(tb.ncols, 1);
    ck_assert_uint_eq(tb.comps[0], 2);
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), 0);
    /* every truncation and one extra byte are corrupt, never a crash */
    for (size_t n = 0; n < b.len; n++) {
        int rc = kw_snap_tables_begin(&t, b.p, n);
        while (rc == KEEL_OK && (rc = kw_snap_tables_next(&t, &tb)) == 1)
            rc = KEEL_OK;
        ck_assert_msg(rc == KEEL_ECORRUPT, "%zu of %zu bytes decoded (%d)", n, b.len, rc);
    }
    ck_assert_ok(kw_put_u8(&b, 0));
    ck_assert_ok(kw_snap_tables_begin(&t, b.p, b.len));
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), 1);
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), 1);
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "after its 2 tables"));
    /* a table count the payload cannot hold is refused before anyone allocates by it */
    unsigned char hdr[12] = {0};
    wr32(hdr, 0xffffffffu);
    ck_assert_int_eq(kw_snap_tables_begin(&t, hdr, sizeof hdr), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "4294967295 tables"));
    /* more than 255 columns */
    b.len = 0;
    kw_put_u32(&b, 1), kw_put_u32(&b, 0), kw_put_u32(&b, 0), kw_put_u32(&b, 0), kw_put_u32(&b, 256);
    for (int i = 0; i < 256; i++)
        kw_put_u32(&b, 1);
    ck_assert_ok(kw_snap_tables_begin(&t, b.p, b.len));
    ck_assert_int_eq(kw_snap_tables_next(&t, &tb), KEEL_ECORRUPT);
    kw_buf_free(&b);
}
END_TEST

START_TEST(snap_slots_decode_and_refuse_bad_lengths)
{
    kw_buf b = {0};
    kw_put_u32(&b, 2048);
    kw_put_u32(&b, 3);
    kw_put_u32(&b, 1), kw_put_u32(&b, 0x01020304u), kw_put_u32(&b, UINT32_MAX);
    kw_put_u8(&b, 1), kw_put_u8(&b, 0), kw_put_u8(&b, 1);
    kw_snap_slots s;
    ck_assert_ok(kw_snap_slots_decode(b.p, b.len, &s));
    ck_assert_uint_eq(s.first, 2048);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(kw_snap_slot_gen(&s, 0), 1);
    ck_assert_uint_eq(kw_snap_slot_gen(&s, 1), 0x01020304u);
    ck_assert_uint_eq(kw_snap_slot_gen(&s, 2), UINT32_MAX);
    ck_assert_uint_eq(s.live[0], 1);
    ck_assert_uint_eq(s.live[1], 0);
    for (size_t n = 0; n < b.len; n++)
        ck_assert_int_eq(kw_snap_slots_decode(b.p, n, &s), KEEL_ECORRUPT);
    kw_put_u8(&b, 0);
    ck_assert_int_eq(kw_snap_slots_decode(b.p, b.len, &s), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "wrong length"));
    unsigned char hdr[8];
    wr32(hdr, 100), wr32(hdr + 4, 0); /* not the first slot of a page */
    ck_assert_int_eq(kw_snap_slots_decode(hdr, 8, &s), KEEL_ECORRUPT);
    wr32(hdr, 0), wr32(hdr + 4, KW_SNAP_PAGE_SLOTS + 1);
    ck_assert_int_eq(kw_snap_slots_decode(hdr, 8, &s), KEEL_ECORRUPT);
    wr32(hdr + 4, 0);
    ck_assert_ok(kw_snap_slots_decode(hdr, 8, &s));
    kw_buf_free(&b);
}
END_TEST

/* A SNAP_CHUNK payload: table 3, chunk 1, two rows, columns 2 (8 bytes) and 5 (2 bytes). */
static void chunk_payload(kw_buf *b)
{
    b->len = 0;
    kw_put_u32(b, 3), kw_put_u32(b, 1), kw_put_u32(b, 2), kw_put_u32(b, 2);
    kw_put_u32(b, 2), kw_put_u32(b, 8), kw_put_u32(b, 5), kw_put_u32(b, 2);
    kw_put_u64(b, 0x0000000200000007ull), kw_put_u64(b, 0x0000000100000009ull);
    kw_put_u64(b, 111), kw_put_u64(b, 222);
    kw_put_u8(b, 0xa1), kw_put_u8(b, 0xa2), kw_put_u8(b, 0xb1), kw_put_u8(b, 0xb2);
}

START_TEST(snap_chunk_decode_and_refuse_bad_lengths)
{
    kw_buf b = {0};
    chunk_payload(&b);
    kw_snap_chunk *c = malloc(sizeof *c);
    ck_assert_ptr_nonnull(c);
    ck_assert_ok(kw_snap_chunk_decode(b.p, b.len, c));
    ck_assert_uint_eq(c->table, 3);
    ck_assert_uint_eq(c->chunk, 1);
    ck_assert_uint_eq(c->count, 2);
    ck_assert_uint_eq(c->ncols, 2);
    ck_assert_uint_eq(c->comps[1], 5);
    ck_assert_uint_eq(c->sizes[1], 2);
    ck_assert_uint_eq(kw_snap_chunk_entity(c, 0), 0x0000000200000007ull);
    ck_assert_uint_eq(kw_snap_chunk_entity(c, 1), 0x0000000100000009ull);
    ck_assert_uint_eq(rd64(c->vals[0] + 8), 222);
    ck_assert_uint_eq(c->vals[1][2], 0xb1);
    for (size_t n = 0; n < b.len; n++)
        ck_assert_int_eq(kw_snap_chunk_decode(b.p, n, c), KEEL_ECORRUPT);
    kw_put_u8(&b, 0);
    ck_assert_int_eq(kw_snap_chunk_decode(b.p, b.len, c), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "chunk 1 of table 3 has the wrong length"));
    /* sizes that overflow the payload, and too many columns */
    chunk_payload(&b);
    wr32(b.p + 20, 0xffffffffu);
    ck_assert_int_eq(kw_snap_chunk_decode(b.p, b.len, c), KEEL_ECORRUPT);
    chunk_payload(&b);
    wr32(b.p + 12, 256);
    ck_assert_int_eq(kw_snap_chunk_decode(b.p, b.len, c), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "bad header"));
    free(c);
    kw_buf_free(&b);
}
END_TEST

START_TEST(snap_payload_checks_the_record_and_its_kind)
{
    kw_codec_ctx *cc = codec();
    kw_buf b = {0}, rec = {0};
    kw_snap_chunk *c = malloc(sizeof *c);
    ck_assert_ptr_nonnull(c);
    /* a big chunk goes through zstd, as its planar form; the decoder reads it decompressed */
    b.len = 0;
    kw_put_u32(&b, 0), kw_put_u32(&b, 0), kw_put_u32(&b, 500), kw_put_u32(&b, 1);
    kw_put_u32(&b, 1), kw_put_u32(&b, 8);
    for (uint32_t i = 0; i < 500; i++)
        kw_put_u64(&b, (uint64_t)1 << 32 | i);
    for (uint32_t i = 0; i < 500; i++)
        kw_put_u64(&b, 7);
    ck_assert_ok(kw_record_build(cc, &rec, KW_KIND_SNAP_CHUNK, 0, 9, 0, b.p, b.len));
    ck_assert_uint_eq(rec.p[7], KW_CODEC_ZSTD_PLANAR);
    const void *p;
    size_t plen;
    ck_assert_ok(kw_snap_payload(cc, rec.p, rec.len, KW_KIND_SNAP_CHUNK, &p, &plen));
    ck_assert_uint_eq(plen, b.len);
    ck_assert_ok(kw_snap_chunk_decode(p, plen, c));
    ck_assert_uint_eq(kw_snap_chunk_entity(c, 499), (uint64_t)1 << 32 | 499);
    ck_assert_int_eq(kw_snap_payload(cc, rec.p, rec.len, KW_KIND_SNAP_SLOTS, &p, &plen), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), "snap record is a snap_chunk, expected snap_slots"));
    rec.p[60] ^= 1;
    ck_assert_int_eq(kw_snap_payload(cc, rec.p, rec.len, KW_KIND_SNAP_CHUNK, &p, &plen), KEEL_ECORRUPT);
    free(c);
    kw_buf_free(&b);
    kw_buf_free(&rec);
    kw_codec_destroy(cc);
}
END_TEST

START_TEST(snap_random_damage_never_crashes)
{
    kw_buf b = {0};
    kw_snap_chunk *c = malloc(sizeof *c);
    ck_assert_ptr_nonnull(c);
    for (int round = 0; round < 3000; round++) {
        int which = round % 3;
        if (which == 0)
            tables_payload(&b);
        else if (which == 1)
            chunk_payload(&b);
        else {
            b.len = 0;
            kw_put_u32(&b, 0), kw_put_u32(&b, 2), kw_put_u32(&b, 1), kw_put_u32(&b, 2);
            kw_put_u8(&b, 1), kw_put_u8(&b, 1);
        }
        size_t n = b.len;
        b.p[rnd() % n] = (unsigned char)rnd();
        if (rnd() % 4 == 0)
            n = rnd() % n;
        kw_snap_tables t;
        kw_snap_table tb;
        kw_snap_slots sl;
        int rc;
        switch (which) {
        case 0:
            rc = kw_snap_tables_begin(&t, b.p, n);
            while (rc == KEEL_OK && (rc = kw_snap_tables_next(&t, &tb)) == 1) {
                ck_assert_uint_le(tb.ncols, KW_SNAP_MAX_COLS);
                rc = KEEL_OK;
            }
            ck_assert(rc == KEEL_OK || rc == KEEL_ECORRUPT);
            break;
        case 1:
            rc = kw_snap_chunk_decode(b.p, n, c);
            ck_assert(rc == KEEL_OK || rc == KEEL_ECORRUPT);
            break;
        default:
            rc = kw_snap_slots_decode(b.p, n, &sl);
            ck_assert(rc == KEEL_OK || rc == KEEL_ECORRUPT);
            break;
        }
    }
    free(c);
    kw_buf_free(&b);
}
END_TEST

/* ---- encoders (wal/encode.c): documented bytes, and back through the decoders ------- */

START_TEST(group_header_is_three_little_endian_u32)
{
    unsigned char p[KW_GROUP_HDR];
    kw_group_header_put(p, 7, 12, 0x01020304u);
    ck_assert_uint_eq(rd32(p), 7);
    ck_assert_uint_eq(rd32(p + 4), 12);
    ck_assert_uint_eq(rd32(p + 8), 0x01020304u);
    uint32_t c, s, n;
    kw_group_header_get(p, &c, &s, &n);
    ck_assert_uint_eq(c, 7);
    ck_assert_uint_eq(s, 12);
    ck_assert_uint_eq(n, 0x01020304u);
}
END_TEST

START_TEST(tick_chunk_encoder_writes_the_documented_groups)
{
    const uint64_t ents[3] = {0x0000000100000002ull, 0x0000000300000004ull, 0x0000000500000006ull};
    const uint32_t vals[3] = {0xaabbccddu, 0x11223344u, 0x55667788u};
    kw_buf b = {0}, want = {0};
    ck_assert_ok(kw_tick_chunk_begin(&b, 0));
    ck_assert_ok(kw_tick_chunk_group_put(&b, 2, 4, 2, ents, vals));
    ck_assert_ok(kw_tick_chunk_group_put(&b, 9, 0, 1, ents + 2, NULL)); /* a tag */
    kw_tick_chunk_end(&b, 2);
    kw_put_u32(&want, 2);
    kw_put_u32(&want, 2), kw_put_u32(&want, 4), kw_put_u32(&want, 2);
    kw_put_u64(&want, ents[0]), kw_put_u64(&want, ents[1]);
    kw_put_u32(&want, vals[0]), kw_put_u32(&want, vals[1]);
    kw_put_u32(&want, 9), kw_put_u32(&want, 0), kw_put_u32(&want, 1);
    kw_put_u64(&want, ents[2]);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);
    kw_decoder d;
    kw_change ch;
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_TICK_CHUNK, 1, b.p, b.len, NULL));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
        ck_assert_uint_eq(ch.entity, ents[i]);
        ck_assert_uint_eq(ch.component, i < 2 ? 2 : 9);
        if (i < 2)
            ck_assert_uint_eq(rd32(ch.value), vals[i]);
    }
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    /* begin empties the buffer: a second payload does not follow the first */
    ck_assert_ok(kw_tick_chunk_begin(&b, 1000));
    kw_tick_chunk_end(&b, 0);
    ck_assert_uint_eq(b.len, 4);
    ck_assert_uint_eq(rd32(b.p), 0);
    kw_buf_free(&b);
    kw_buf_free(&want);
}
END_TEST

/* kw_decode_group yields what kw_decode_next yields, a group at a time:
 * the rows a kw_decode_next call left in its group, then whole groups; a
 * group cut short is corrupt; other kinds have no groups. */
START_TEST(decode_group_yields_the_rows_a_group_at_a_time)
{
    const uint64_t ents[3] = {0x0000000100000002ull, 0x0000000300000004ull, 0x0000000500000006ull};
    const uint32_t vals[3] = {0xaabbccddu, 0x11223344u, 0x55667788u};
    kw_buf b = {0};
    ck_assert_ok(kw_tick_chunk_begin(&b, 0));
    ck_assert_ok(kw_tick_chunk_group_put(&b, 2, 4, 3, ents, vals));
    ck_assert_ok(kw_tick_chunk_group_put(&b, 9, 0, 1, ents + 2, NULL));
    kw_tick_chunk_end(&b, 2);
    kw_decoder d;
    kw_group g;
    kw_change ch;
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_TICK_CHUNK, 1, b.p, b.len, NULL));
    ck_assert_int_eq(kw_decode_group(&d, &g), 1);
    ck_assert_uint_eq(g.component, 2);
    ck_assert_uint_eq(g.size, 4);
    ck_assert_uint_eq(g.n, 3);
    ck_assert(memcmp(g.entities, ents, sizeof ents) == 0);
    ck_assert(memcmp(g.values, vals, sizeof vals) == 0);
    ck_assert_int_eq(kw_decode_group(&d, &g), 1);
    ck_assert_uint_eq(g.component, 9);
    ck_assert_uint_eq(g.size, 0);
    ck_assert_uint_eq(g.n, 1);
    ck_assert(memcmp(g.entities, ents + 2, 8) == 0);
    ck_assert_int_eq(kw_decode_group(&d, &g), 0);
    /* mixed: one row, then the rest of its group, then the next */
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_TICK_CHUNK, 1, b.p, b.len, NULL));
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.entity, ents[0]);
    ck_assert_int_eq(kw_decode_group(&d, &g), 1);
    ck_assert_uint_eq(g.n, 2);
    ck_assert(memcmp(g.entities, ents + 1, 16) == 0);
    ck_assert_uint_eq(rd32(g.values), vals[1]);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.component, 9);
    ck_assert_int_eq(kw_decode_group(&d, &g), 0);
    /* a payload cut inside its first group's values */
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_TICK_CHUNK, 77, b.p, 4 + KW_GROUP_HDR + 3 * 8 + 5, NULL));
    ck_assert_int_eq(kw_decode_group(&d, &g), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "LSN 77"), "%s", keel_last_error());
    /* a SIDE record holds writes, not groups */
    ck_assert_ok(kw_side_begin(&b, 1, 0, 0));
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_SIDE, 5, b.p, b.len, NULL));
    ck_assert_int_eq(kw_decode_group(&d, &g), KEEL_EINVAL);
    kw_buf_free(&b);
}
END_TEST

START_TEST(lifecycle_encoder_writes_the_documented_ops)
{
    kw_buf b = {0}, want = {0};
    const kw_value spawn[3] = {{1, 4, "abcd"}, {2, 3, NULL}, {3, 0, NULL}}; /* a value, zeros, a tag */
    ck_assert_ok(kw_lifecycle_begin(&b));
    ck_assert_ok(kw_lifecycle_put_op(&b, KW_OP_SPAWN, 0x0000000100000007ull, 3, spawn));
    ck_assert_ok(kw_lifecycle_put_op(&b, KW_OP_ADD, 8, 1, &(kw_value){4, 2, "xy"}));
    ck_assert_ok(kw_lifecycle_put_op(&b, KW_OP_REMOVE, 9, 1, &(kw_value){.component = 5}));
    ck_assert_ok(kw_lifecycle_put_op(&b, KW_OP_DESTROY, 10, 0, NULL));
    kw_lifecycle_end(&b, 4);
    kw_put_u32(&want, 4);
    kw_put_u8(&want, 1), kw_put_u64(&want, 0x0000000100000007ull), kw_put_u32(&want, 3);
    kw_put_u32(&want, 1), kw_put_u32(&want, 4), kw_put_bytes(&want, "abcd", 4);
    kw_put_u32(&want, 2), kw_put_u32(&want, 3), kw_put_bytes(&want, "\0\0\0", 3);
    kw_put_u32(&want, 3), kw_put_u32(&want, 0);
    kw_put_u8(&want, 3), kw_put_u64(&want, 8), kw_put_u32(&want, 4), kw_put_u32(&want, 2), kw_put_bytes(&want, "xy", 2);
    kw_put_u8(&want, 4), kw_put_u64(&want, 9), kw_put_u32(&want, 5);
    kw_put_u8(&want, 2), kw_put_u64(&want, 10);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);
    kw_decoder d;
    kw_change ch;
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_LIFECYCLE, 1, b.p, b.len, NULL));
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.op, KW_OP_SPAWN);
    ck_assert_uint_eq(ch.n, 3);
    ck_assert_uint_eq(ch.sizes[1], 3);
    ck_assert(memcmp(ch.values[1], "\0\0\0", 3) == 0);
    ck_assert_ptr_null(ch.values[2]);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.op, KW_OP_ADD);
    ck_assert(memcmp(ch.value, "xy", 2) == 0);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.op, KW_OP_REMOVE);
    ck_assert_uint_eq(ch.component, 5);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.op, KW_OP_DESTROY);
    ck_assert_uint_eq(ch.entity, 10);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    kw_buf_free(&b);
    kw_buf_free(&want);
}
END_TEST

START_TEST(side_encoder_writes_the_documented_writes)
{
    kw_buf b = {0}, want = {0};
    ck_assert_ok(kw_side_begin(&b, 0x1122334455667788ull, 2, 2));
    ck_assert_ok(kw_side_put_write(&b, 5, 1, 4, "abcd"));
    ck_assert_ok(kw_side_put_write(&b, 6, 3, 0, NULL));
    kw_put_u64(&want, 0x1122334455667788ull), kw_put_u32(&want, 2), kw_put_u32(&want, 2);
    kw_put_u64(&want, 5), kw_put_u32(&want, 1), kw_put_u32(&want, 4), kw_put_bytes(&want, "abcd", 4);
    kw_put_u64(&want, 6), kw_put_u32(&want, 3), kw_put_u32(&want, 0);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);
    kw_decoder d;
    kw_change ch;
    ck_assert_ok(kw_decode_begin(&d, KW_KIND_SIDE, 1, b.p, b.len, NULL));
    ck_assert_uint_eq(d.side_seq, 0x1122334455667788ull);
    ck_assert_uint_eq(d.side_mode, 2);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.entity, 5);
    ck_assert(memcmp(ch.value, "abcd", 4) == 0);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.component, 3);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    kw_buf_free(&b);
    kw_buf_free(&want);
}
END_TEST

/* A SIDES payload: u32 count, then per transaction u32 flags, u32 length
 * and its SIDE payload; kw_side_iter yields each as the header and payload
 * of a SIDE record of its own, and a SIDE record as itself. */
START_TEST(sides_encoder_writes_the_documented_transactions)
{
    kw_buf one = {0}, two = {0}, b = {0}, want = {0};
    uint32_t f1 = 0, f2 = 0;
    ck_assert_ok(kw_side_begin(&one, 7, 1, 1));
    ck_assert_ok(kw_side_put_write(&one, 5, 1, 4, "abcd"));
    ck_assert_ok(kw_side_end(&one, 0, &f1));
    ck_assert_ok(kw_side_begin(&two, 8, 1, 0));
    ck_assert_ok(kw_side_end(&two, 0x99, &f2));
    ck_assert_uint_eq(f1, 0);
    ck_assert_uint_eq(f2, KW_FLAG_KEY);
    ck_assert_ok(kw_sides_begin(&b));
    ck_assert_ok(kw_sides_put(&b, f1, one.p, one.len));
    ck_assert_ok(kw_sides_put(&b, f2, two.p, two.len));
    kw_sides_end(&b, 2);
    kw_put_u32(&want, 2);
    kw_put_u32(&want, 0), kw_put_u32(&want, (uint32_t)one.len), kw_put_bytes(&want, one.p, one.len);
    kw_put_u32(&want, KW_FLAG_KEY), kw_put_u32(&want, (uint32_t)two.len), kw_put_bytes(&want, two.p, two.len);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);

    kw_header h = {.kind = KW_KIND_SIDES, .lsn = 40, .tick = 9, .raw_len = (uint32_t)b.len,
                   .stored_len = (uint32_t)b.len};
    kw_side_iter it;
    kw_header txn;
    const void *p;
    kw_decoder d;
    kw_change ch;
    ck_assert_ok(kw_side_iter_begin(&it, &h, b.p));
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 1);
    ck_assert_uint_eq(txn.kind, KW_KIND_SIDE);
    ck_assert_uint_eq(txn.lsn, 40);
    ck_assert_uint_eq(txn.tick, 9);
    ck_assert_uint_eq(txn.flags, 0);
    ck_assert_uint_eq(txn.raw_len, one.len);
    ck_assert_ok(kw_decode_record(&d, &txn, p, NULL));
    ck_assert_uint_eq(d.side_seq, 7);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert(ch.entity == 5 && memcmp(ch.value, "abcd", 4) == 0);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 1);
    ck_assert_uint_eq(txn.flags, KW_FLAG_KEY);
    ck_assert_ok(kw_decode_record(&d, &txn, p, NULL));
    ck_assert_uint_eq(d.side_seq, 8);
    ck_assert_uint_eq(d.side_key, 0x99);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 0);
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 0);

    /* a SIDE record is its own one transaction */
    kw_header single = {.kind = KW_KIND_SIDE, .lsn = 41, .flags = KW_FLAG_KEY, .raw_len = (uint32_t)two.len};
    ck_assert_ok(kw_side_iter_begin(&it, &single, two.p));
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 1);
    ck_assert(txn.kind == KW_KIND_SIDE && txn.flags == KW_FLAG_KEY && txn.raw_len == two.len && p == two.p);
    ck_assert_int_eq(kw_side_iter_next(&it, &txn, &p), 0);
    kw_header chunk = {.kind = KW_KIND_TICK_CHUNK, .lsn = 42};
    ck_assert_rc(kw_side_iter_begin(&it, &chunk, b.p), KEEL_EINVAL);
    kw_buf_free(&one);
    kw_buf_free(&two);
    kw_buf_free(&b);
    kw_buf_free(&want);
}
END_TEST

/* The count of the transactions kw_side_iter_next yields before its answer. */
static int sides_walk(const kw_buf *b, uint32_t *yielded)
{
    kw_header h = {.kind = KW_KIND_SIDES, .lsn = 77, .raw_len = (uint32_t)b->len};
    kw_side_iter it;
    kw_header txn;
    const void *p;
    int rc = kw_side_iter_begin(&it, &h, b->p);
    *yielded = 0;
    while (!rc && (rc = kw_side_iter_next(&it, &txn, &p)) == 1) {
        ck_assert((const unsigned char *)p + txn.raw_len <= b->p + b->len);
        (*yielded)++;
        rc = KEEL_OK;
    }
    return rc;
}

START_TEST(damaged_sides_are_corrupt_naming_the_lsn)
{
    kw_buf side = {0}, b = {0};
    uint32_t flags = 0, n;
    ck_assert_ok(kw_side_begin(&side, 1, 1, 0));
    ck_assert_ok(kw_side_end(&side, 0, &flags));
    struct {
        const char *what;
        uint32_t count, flags, len_extra;
        size_t trailing, cut;
    } cases[] = {
        {"no transaction", 0, 0, 0, 0, 0},
        {"runs past", 2, 0, 0, 0, 0},              /* counts two, holds one */
        {"runs past", 1, 0, 1, 0, 0},              /* a length one past the payload */
        {"flags other than KEY", 1, 4, 0, 0, 0},
        {"trailing bytes", 1, 0, 0, 3, 0},
        {"runs past", 1, 0, 0, 0, 6},              /* cut inside the length field */
        {"too short for its count", 1, 0, 0, 0, 26}, /* 2 of its 28 bytes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_ok(kw_sides_begin(&b));
        if (cases[i].count)
            ck_assert_ok(kw_sides_put(&b, cases[i].flags, side.p, side.len));
        kw_sides_end(&b, cases[i].count);
        if (cases[i].len_extra)
            b.p[8] += (unsigned char)cases[i].len_extra;
        for (size_t k = 0; k < cases[i].trailing; k++)
            ck_assert_ok(kw_put_u8(&b, 0));
        b.len -= cases[i].cut < b.len ? cases[i].cut : b.len;
        ck_assert_rc(sides_walk(&b, &n), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), cases[i].what) && has(keel_last_error(), "LSN 77"), "case %zu: %s", i,
                      keel_last_error());
    }
    /* the whole well-formed payload walks; under header flags it does not */
    ck_assert_ok(kw_sides_begin(&b));
    ck_assert_ok(kw_sides_put(&b, flags, side.p, side.len));
    kw_sides_end(&b, 1);
    ck_assert_ok(sides_walk(&b, &n));
    ck_assert_uint_eq(n, 1);
    kw_side_iter it;
    kw_header h = {.kind = KW_KIND_SIDES, .lsn = 78, .flags = KW_FLAG_KEY, .raw_len = (uint32_t)b.len};
    ck_assert_rc(kw_side_iter_begin(&it, &h, b.p), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "header has flags") && has(keel_last_error(), "LSN 78"), "%s",
                  keel_last_error());
    kw_buf_free(&side);
    kw_buf_free(&b);
}
END_TEST

START_TEST(commit_and_checkpoint_markers_are_16_bytes)
{
    unsigned char m[KW_COMMIT_SIZE];
    kw_commit_encode(&(kw_commit_info){3, 0x10203040u, 0x50607080u}, m);
    ck_assert_uint_eq(rd32(m), 3);
    ck_assert_uint_eq(rd32(m + 4), 0x10203040u);
    ck_assert_uint_eq(rd32(m + 8), 0x50607080u);
    ck_assert_uint_eq(rd32(m + 12), 0);
    kw_commit_info ci;
    ck_assert_ok(kw_decode_commit(m, sizeof m, &ci));
    ck_assert_uint_eq(ci.nrecords, 3);
    ck_assert_uint_eq(ci.nlive, 0x10203040u);
    ck_assert_uint_eq(ci.nslots, 0x50607080u);
    unsigned char k[KW_CHECKPOINT_MARKER_SIZE];
    kw_checkpoint_marker_encode(0x0102030405060708ull, 42, k);
    ck_assert_uint_eq(rd64(k), 0x0102030405060708ull);
    ck_assert_uint_eq(rd64(k + 8), 42);
    uint64_t lsn, tick;
    ck_assert_ok(kw_checkpoint_marker_decode(k, sizeof k, &lsn, &tick));
    ck_assert_uint_eq(lsn, 0x0102030405060708ull);
    ck_assert_uint_eq(tick, 42);
    ck_assert_rc(kw_checkpoint_marker_decode(k, 15, &lsn, &tick), KEEL_ECORRUPT);
    unsigned char k17[17] = {0};
    ck_assert_rc(kw_checkpoint_marker_decode(k17, 17, &lsn, &tick), KEEL_ECORRUPT);
}
END_TEST

START_TEST(snap_encoders_write_what_the_decoders_read)
{
    /* the same bytes as the hand-built payloads the decoder tests use */
    kw_buf b = {0}, want = {0};
    static const uint32_t t0[2] = {1, 3}, t1[1] = {2};
    ck_assert_ok(kw_snap_tables_put_header(&b, 2, 1030, 5));
    ck_assert_ok(kw_snap_tables_put_table(&b, 5, 2, t0));
    ck_assert_ok(kw_snap_tables_put_table(&b, 0, 1, t1));
    tables_payload(&want);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);

    static const uint32_t comps[2] = {2, 5}, sizes[2] = {8, 2};
    const uint64_t ents[2] = {0x0000000200000007ull, 0x0000000100000009ull}, v0[2] = {111, 222};
    const unsigned char v1[4] = {0xa1, 0xa2, 0xb1, 0xb2};
    const void *const vals[2] = {v0, v1};
    ck_assert_ok(kw_snap_chunk_encode(&b, 3, 1, 2, 2, comps, sizes, ents, vals));
    chunk_payload(&want);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert(memcmp(b.p, want.p, want.len) == 0);

    static const uint32_t gens[3] = {1, 0x00010002u, 7};
    static const uint8_t live[3] = {1, 0, 5};
    ck_assert_ok(kw_snap_slots_encode(&b, 2048, 3, gens, live));
    ck_assert_uint_eq(b.len, 8 + 3 * 4 + 3);
    ck_assert_uint_eq(rd32(b.p), 2048);
    ck_assert_uint_eq(rd32(b.p + 8 + 4), 0x00010002u);
    kw_snap_slots s;
    ck_assert_ok(kw_snap_slots_decode(b.p, b.len, &s));
    ck_assert_uint_eq(s.first, 2048);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(kw_snap_slot_gen(&s, 1), 0x00010002u);
    ck_assert_uint_eq(s.live[0], 1);
    ck_assert_uint_eq(s.live[1], 0);
    ck_assert_uint_eq(s.live[2], 1); /* non-zero is live, stored as 1 */
    kw_buf_free(&b);
    kw_buf_free(&want);
}
END_TEST

START_TEST(scalar_table_names_and_widths)
{
    static const struct {
        uint32_t type, width;
        const char *name;
    } want[] = {{1, 1, "u8"},  {2, 2, "u16"},  {3, 4, "u32"},   {4, 8, "u64"},     {5, 1, "i8"},
                {6, 2, "i16"}, {7, 4, "i32"},  {8, 8, "i64"},   {9, 4, "f32"},     {10, 8, "f64"},
                {11, 1, "bool"}, {12, 8, "entity"}, {13, 1, "bytes"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ck_assert_uint_eq(kw_scalar_width(want[i].type), want[i].width);
        ck_assert_str_eq(kw_scalar_name(want[i].type), want[i].name);
    }
    ck_assert_uint_eq(kw_scalar_width(0), 0);
    ck_assert_uint_eq(kw_scalar_width(14), 0);
    ck_assert_str_eq(kw_scalar_name(0), "?");
    ck_assert_str_eq(kw_scalar_name(14), "?");
}
END_TEST

static Suite *payload_suite(void)
{
    Suite *s = suite_create("wal_payload");
    ADD_CASE(s, "cursor", false, builders_write_little_endian, cursor_reads_in_bounds_and_flags_overruns);
    ADD_CASE(s, "schema", false, schema_round_trip, schema_truncated_or_padded_is_corrupt,
             schema_malformed_payloads_are_corrupt, schema_random_damage_never_crashes);
    ADD_CASE(s, "keys", false, checkpoint_meta_layout_and_round_trip,
             snap_keys_are_big_endian_and_sort_numerically);
    ADD_CASE(s, "snap", false, snap_tables_decode_and_refuse_bad_lengths,
             snap_slots_decode_and_refuse_bad_lengths, snap_chunk_decode_and_refuse_bad_lengths,
             snap_payload_checks_the_record_and_its_kind, snap_random_damage_never_crashes);
    ADD_CASE(s, "encoders", false, group_header_is_three_little_endian_u32,
             tick_chunk_encoder_writes_the_documented_groups, decode_group_yields_the_rows_a_group_at_a_time,
             lifecycle_encoder_writes_the_documented_ops,
             side_encoder_writes_the_documented_writes, sides_encoder_writes_the_documented_transactions,
             damaged_sides_are_corrupt_naming_the_lsn, commit_and_checkpoint_markers_are_16_bytes,
             snap_encoders_write_what_the_decoders_read, scalar_table_names_and_widths);
    return s;
}

/* ---- wal_store -------------------------------------------------------------------------- */

static char tmp_root[128];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_tree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Per test case (unchecked: runs in the runner process, so it also cleans
 * up after a test that failed half-way in its forked child). */
static void root_setup(void)
{
    snprintf(tmp_root, sizeof tmp_root, "/tmp/keel-test-wal.XXXXXX");
    if (!mkdtemp(tmp_root))
        tmp_root[0] = 0;
}

static void root_teardown(void)
{
    if (tmp_root[0])
        rm_tree(tmp_root);
}

static void new_dir(char out[256])
{
    ck_assert_msg(tmp_root[0], "no temporary root directory");
    snprintf(out, 256, "%s/d.XXXXXX", tmp_root);
    ck_assert_ptr_nonnull(mkdtemp(out));
}

static bool file_exists(const char *dir, const char *name)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static kw_store *open_store(const char *dir, uint32_t flags, uint64_t map_size, uint64_t map_max)
{
    kw_store *s = NULL;
    ck_assert_ok(kw_store_open(dir, &(kw_store_desc){.flags = flags, .map_size = map_size, .map_max = map_max}, &s));
    ck_assert_ptr_nonnull(s);
    return s;
}

/* A record for lsn whose payload says so (or `extra` random bytes). */
static void make_rec(kw_codec_ctx *c, kw_buf *out, uint64_t lsn, size_t extra)
{
    out->len = 0;
    char text[64];
    int n = snprintf(text, sizeof text, "record %llu", (unsigned long long)lsn);
    if (!extra) {
        ck_assert_ok(kw_record_build(c, out, KW_KIND_SIDE, lsn, lsn / 2, 0, text, (size_t)n));
        return;
    }
    unsigned char *p = malloc(extra);
    uint64_t save = rng_state;
    rng_state = 0x1234567ull * (lsn + 1);
    rnd_fill(p, extra);
    rng_state = save;
    memcpy(p, text, (size_t)n);
    ck_assert_ok(kw_record_build(c, out, KW_KIND_TICK_CHUNK, lsn, lsn / 2, 0, p, extra));
    free(p);
}

typedef struct wal_put {
    uint64_t lsn;
    const void *rec;
    size_t len;
} wal_put;

typedef struct wal_fill {
    const wal_put *puts;
    size_t n;
    int calls;
    int then;                  /* returned after the puts */
    int put_rc;                /* the first kw_put_wal error */
    char put_err[256];
} wal_fill;

static int fill_wal(kw_wtxn *t, void *arg)
{
    wal_fill *f = arg;
    f->calls++;
    for (size_t i = 0; i < f->n; i++) {
        int rc = kw_put_wal(t, f->puts[i].lsn, f->puts[i].rec, f->puts[i].len);
        if (rc) {
            f->put_rc = rc;
            snprintf(f->put_err, sizeof f->put_err, "%s", keel_last_error());
            return rc;
        }
    }
    return f->then;
}

/* Append records for lsns (payload `extra` bytes; 0 = short text). */
static int append(kw_store *s, kw_codec_ctx *c, const uint64_t *lsns, size_t n, size_t extra, int *calls)
{
    kw_buf *recs = calloc(n, sizeof *recs);
    wal_put *puts = calloc(n, sizeof *puts);
    for (size_t i = 0; i < n; i++) {
        make_rec(c, &recs[i], lsns[i], extra);
        puts[i] = (wal_put){lsns[i], recs[i].p, recs[i].len};
    }
    wal_fill f = {.puts = puts, .n = n};
    int rc = kw_store_write(s, fill_wal, &f);
    if (calls)
        *calls = f.calls;
    for (size_t i = 0; i < n; i++)
        kw_buf_free(&recs[i]);
    free(recs);
    free(puts);
    return rc;
}

/* The WAL's LSNs in iteration order from `from`; every value must be a
 * valid record whose header LSN is its key. Returns the count. */
static size_t wal_lsns(kw_store *s, uint64_t from, uint64_t *out, size_t max)
{
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it;
    ck_assert_ok(kw_wal_iter(r, from, &it));
    size_t n = 0;
    uint64_t lsn;
    const void *rec;
    size_t len;
    int rc;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(rec, len, &h));
        ck_assert_uint_eq(h.lsn, lsn);
        ck_assert_uint_lt(n, max);
        out[n++] = lsn;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(kw_wal_next(it, &lsn, &rec, &len), 0); /* stays at the end */
    kw_wal_iter_end(it);
    kw_read_end(r);
    return n;
}

static int bounds(kw_store *s, uint64_t *first, uint64_t *last, uint64_t *count)
{
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    *first = *last = *count = 0xdead;
    int rc = kw_wal_bounds(r, first, last, count);
    kw_read_end(r);
    return rc;
}

START_TEST(create_opens_a_fresh_directory)
{
    char base[256], dir[300];
    new_dir(base);
    snprintf(dir, sizeof dir, "%s/data", base); /* does not exist yet */
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    ck_assert_str_eq(kw_store_dir(s), dir);
    ck_assert(file_exists(dir, "data.mdb"));
    ck_assert(file_exists(dir, "lock.mdb"));
    ck_assert_uint_eq(kw_store_map_size(s), 64ull << 20);
    char p[400];
    struct stat st;
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_uint_gt(kw_store_file_size(s), 0);
    ck_assert_uint_eq(kw_store_file_size(s), (uint64_t)st.st_size);

    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    const void *v;
    size_t vlen;
    ck_assert_ok(kw_get(r, KW_DB_META, KW_META_FORMAT, 6, &v, &vlen));
    ck_assert_uint_eq(vlen, 4);
    ck_assert_uint_eq(rd32(v), KEEL_WAL_FORMAT_VERSION);
    ck_assert_rc(kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &v, &vlen), KEEL_ENOENT);
    ck_assert_rc(kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &v, &vlen), KEEL_ENOENT);
    for (int db = 0; db < KW_DB_COUNT_; db++) {
        kw_walit *it;
        ck_assert_ok(kw_db_iter(r, (kw_db)db, "", 0, &it));
        const void *k;
        size_t klen;
        int n = 0;
        while (kw_db_next(it, &k, &klen, &v, &vlen) == 1)
            n++;
        kw_wal_iter_end(it);
        ck_assert_int_eq(n, db == KW_DB_META ? 1 : 0);
    }
    uint64_t first = 1, last = 1, count = 1;
    ck_assert_rc(kw_wal_bounds(r, &first, &last, &count), KEEL_ENOENT);
    ck_assert_uint_eq(count, 0);
    kw_read_end(r);
    kw_store_close(s);
    kw_store_close(NULL);

    /* standard LMDB sees the five named databases in the main database */
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_set_maxdbs(env, 8), 0);
    ck_assert_int_eq(mdb_env_open(env, dir, MDB_RDONLY, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    static const char *const names[] = {"meta", "schema", "wal", "snap", "dict"};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(mdb_dbi_open(txn, names[i], 0, &dbi) == 0, "no '%s' database", names[i]);
    MDB_stat ms;
    ck_assert_int_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    ck_assert_int_eq(mdb_stat(txn, dbi, &ms), 0);
    ck_assert_uint_eq(ms.ms_entries, 5);
    mdb_txn_abort(txn);
    mdb_env_close(env);

    /* and it opens again without CREATE */
    s = open_store(dir, 0, 0, 0);
    kw_store_close(s);
    rm_tree(base);
}
END_TEST

/* A new data.mdb appears whole or not at all: it is built as data.mdb.new,
 * committed, synced and renamed (a power cut before LMDB's first commit of a
 * new file could leave a data.mdb it refuses, MDB_INVALID, for ever). What a
 * crashed creation left behind is discarded by the next creation, and is no
 * keel directory to an open without CREATE. */
static void write_file(const char *dir, const char *name, size_t len, unsigned char byte)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    ck_assert_int_ge(fd, 0);
    unsigned char buf[4096];
    memset(buf, byte, sizeof buf);
    for (size_t done = 0; done < len; done += sizeof buf)
        ck_assert_int_eq(write(fd, buf, sizeof buf), (ssize_t)sizeof buf);
    close(fd);
}

START_TEST(creation_is_atomic_and_discards_a_crashed_creation)
{
    char dir[256];
    new_dir(dir);
    /* a creation that crashed: half a staging file and its lock, no data.mdb */
    write_file(dir, "data.mdb.new", 8192, 0);
    write_file(dir, "data.mdb.new-lock", 4096, 0xa5);
    kw_store *s = (kw_store *)0x1;
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert(has(keel_last_error(), "no data.mdb"));
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s), KEEL_ENOENT);
    ck_assert(file_exists(dir, "data.mdb.new")); /* only a creation discards it */
    s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    ck_assert(file_exists(dir, "data.mdb") && file_exists(dir, "lock.mdb"));
    ck_assert(!file_exists(dir, "data.mdb.new") && !file_exists(dir, "data.mdb.new-lock"));
    kw_store_close(s);
    /* what was published is a whole keel directory: it opens without CREATE,
     * read-only too, and a second CREATE open changes nothing */
    s = open_store(dir, 0, 0, 0);
    kw_store_close(s);
    s = open_store(dir, KW_OPEN_READONLY, 0, 0);
    kw_store_close(s);
    struct stat before, after;
    char p[300];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    ck_assert_int_eq(stat(p, &before), 0);
    s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kw_store_close(s);
    ck_assert_int_eq(stat(p, &after), 0);
    ck_assert_uint_eq(before.st_ino, after.st_ino); /* not created again */
    ck_assert(!file_exists(dir, "data.mdb.new"));
    rm_tree(dir);
}
END_TEST

START_TEST(missing_directory_without_create_is_enoent)
{
    char base[256], dir[300];
    new_dir(base);
    snprintf(dir, sizeof dir, "%s/nope", base);
    kw_store *s = (kw_store *)0x1;
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert(has(keel_last_error(), dir));
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s), KEEL_ENOENT);
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY | KW_OPEN_CREATE}, &s), KEEL_ENOENT);
    ck_assert_ptr_eq(s, (kw_store *)0x1);
    struct stat st;
    ck_assert_int_ne(stat(dir, &st), 0); /* nothing was created */
    /* a regular file is not a data directory */
    snprintf(dir, sizeof dir, "%s/file", base);
    FILE *f = fopen(dir, "w");
    ck_assert_ptr_nonnull(f);
    fputs("x", f);
    fclose(f);
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_CREATE}, &s), KEEL_ENOENT);
    /* no name, no out */
    ck_assert_rc(kw_store_open(NULL, NULL, &s), KEEL_EINVAL);
    ck_assert_rc(kw_store_open("", NULL, &s), KEEL_EINVAL);
    ck_assert_rc(kw_store_open(base, NULL, NULL), KEEL_EINVAL);
    ck_assert_ptr_eq(s, (kw_store *)0x1);
    rm_tree(base);
}
END_TEST

START_TEST(directory_without_keel_data_is_refused)
{
    char dir[256];
    new_dir(dir);
    kw_store *s = NULL;
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert(has(keel_last_error(), "data.mdb"));
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s), KEEL_ENOENT);
    ck_assert(!file_exists(dir, "data.mdb")); /* and none was made */
    ck_assert(!file_exists(dir, "lock.mdb"));

    /* an LMDB environment without keel's databases */
    MDB_env *env;
    MDB_txn *txn;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_open(env, dir, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert(has(keel_last_error(), "not a keel data directory"));
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s), KEEL_ENOENT);
    rm_tree(dir);

    /* a data.mdb that is not LMDB at all */
    new_dir(dir);
    char p[300];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    ck_assert_int_ge(fd, 0);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    ck_assert_int_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ECORRUPT);
    ck_assert(has(keel_last_error(), dir));
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s), KEEL_ECORRUPT);
    ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_CREATE}, &s), KEEL_ECORRUPT);
    rm_tree(dir);
}
END_TEST

/* ---- a read-only handle in another process beside a live writer --------------------- */

enum { BIG_RECS = 40, BIG_LEN = 100 << 10 };

static void send_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_line(int fd, const char *fmt, ...)
{
    char msg[512] = {0};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ssize_t n = write(fd, msg, sizeof msg);
    (void)n;
}

static bool recv_line(int fd, char msg[512])
{
    size_t got = 0;
    while (got < 512) {
        ssize_t n = read(fd, msg + got, 512 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < 512)
        snprintf(msg, 512, "(the reader process ended without a report)");
    msg[511] = 0;
    return got == 512;
}

/* Count and check the WAL seen by r: LSNs 1..n, every record valid. */
static int child_check_wal(kw_rtxn *r, uint64_t n, char *err, size_t errlen)
{
    uint64_t first = 0, last = 0, count = 0;
    int rc = kw_wal_bounds(r, &first, &last, &count);
    if (rc || first != 1 || last != n || count != n) {
        snprintf(err, errlen, "bounds rc %s first %llu last %llu count %llu, expected 1..%llu: %s", keel_strerror(rc),
                 (unsigned long long)first, (unsigned long long)last, (unsigned long long)count,
                 (unsigned long long)n, rc ? keel_last_error() : "");
        return 1;
    }
    kw_walit *it;
    if ((rc = kw_wal_iter(r, 1, &it))) {
        snprintf(err, errlen, "kw_wal_iter: %s", keel_last_error());
        return 1;
    }
    uint64_t lsn, want = 1;
    const void *rec;
    size_t len;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        kw_header h;
        if (lsn != want || kw_record_check(rec, len, &h) || h.lsn != lsn) {
            snprintf(err, errlen, "record %llu (expected %llu) is wrong: %s", (unsigned long long)lsn,
                     (unsigned long long)want, keel_last_error());
            kw_wal_iter_end(it);
            return 1;
        }
        want++;
    }
    kw_wal_iter_end(it);
    if (rc || want != n + 1) {
        snprintf(err, errlen, "iteration ended at %llu rc %s", (unsigned long long)want, keel_strerror(rc));
        return 1;
    }
    return 0;
}

static int reader_process(const char *dir, int up, int down)
{
    char err[400];
    kw_store *s = NULL;
    kw_rtxn *t1 = NULL, *t2 = NULL;
    int rc = kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s);
    if (rc) {
        send_line(up, "read-only open: %s", keel_last_error());
        return 1;
    }
    if ((rc = kw_read_begin(s, &t1))) {
        send_line(up, "read begin: %s", keel_last_error());
        return 1;
    }
    if (child_check_wal(t1, 3, err, sizeof err)) {
        send_line(up, "before the writer grew: %s", err);
        return 1;
    }
    kw_read_end(t1);
    if ((rc = kw_read_begin(s, &t1))) { /* held across the writer's next commit */
        send_line(up, "read begin: %s", keel_last_error());
        return 1;
    }
    send_line(up, "ready");
    char go;
    if (read(down, &go, 1) != 1)
        return 1;
    /* the writer has committed LSNs 4..3+BIG_RECS and grown the map far past
     * what this process mapped: a new read transaction must see them */
    if ((rc = kw_read_begin(s, &t2))) {
        send_line(up, "read begin after the map grew: %s", keel_last_error());
        return 1;
    }
    if (child_check_wal(t2, 3 + BIG_RECS, err, sizeof err)) {
        send_line(up, "after the writer grew: %s", err);
        return 1;
    }
    /* the older transaction still reads its snapshot */
    if (child_check_wal(t1, 3, err, sizeof err)) {
        send_line(up, "the older read transaction lost its snapshot: %s", err);
        return 1;
    }
    kw_read_end(t1);
    kw_read_end(t2);
    kw_store_close(s);
    send_line(up, "done");
    return 0;
}

START_TEST(readonly_open_sees_a_live_writers_commits)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *w = open_store(dir, KW_OPEN_CREATE, 64 << 10, 0);
    static const uint64_t first3[] = {1, 2, 3};
    ck_assert_ok(append(w, c, first3, 3, 0, NULL));
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    /* LMDB: one environment per file per process, so the reader is a
     * process of its own (the way keel-wal reads beside a server) */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        _exit(reader_process(dir, up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    char msg[512];
    recv_line(up[0], msg);
    bool ready = !strcmp(msg, "ready");
    if (ready) {
        uint64_t lsns[BIG_RECS];
        for (int i = 0; i < BIG_RECS; i++)
            lsns[i] = 4 + (uint64_t)i;
        int calls = 0;
        ck_assert_ok(append(w, c, lsns, BIG_RECS, BIG_LEN, &calls));
        ck_assert_uint_gt(kw_store_map_size(w), (uint64_t)BIG_RECS * BIG_LEN);
        ck_assert_int_eq(write(down[1], "g", 1), 1);
        recv_line(up[0], msg);
    }
    close(down[1]);
    close(up[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0 && !strcmp(msg, "done"),
                  "the read-only process failed (status 0x%x): %s", status, msg);
    kw_store_close(w);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(readonly_store_refuses_writes)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    static const uint64_t one[] = {1};
    ck_assert_ok(append(s, c, one, 1, 0, NULL));
    kw_store_close(s);
    s = open_store(dir, KW_OPEN_READONLY, 0, 0);
    static const uint64_t two[] = {2};
    int calls = 0;
    ck_assert_rc(append(s, c, two, 1, 0, &calls), KEEL_EINVAL);
    ck_assert(has(keel_last_error(), "read-only"));
    ck_assert_int_eq(calls, 0);
    kw_store_close(s);
    s = open_store(dir, 0, 0, 0);
    uint64_t got[4];
    ck_assert_uint_eq(wal_lsns(s, 0, got, 4), 1);
    ck_assert_uint_eq(got[0], 1);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(put_wal_appends_in_order_and_refuses_non_increasing_lsns)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    /* big-endian keys: numeric order across byte boundaries */
    static const uint64_t lsns[] = {1, 2, 255, 256, 257, 65535, 65536, 1ull << 32, (1ull << 32) + 1, 1ull << 63};
    enum { N = sizeof lsns / sizeof lsns[0] };
    ck_assert_ok(append(s, c, lsns, N, 0, NULL));
    uint64_t got[N + 4];
    ck_assert_uint_eq(wal_lsns(s, 0, got, N + 4), N);
    for (size_t i = 0; i < N; i++)
        ck_assert_uint_eq(got[i], lsns[i]);
    /* the keys as stored: 8 bytes, big-endian */
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it;
    ck_assert_ok(kw_db_iter(r, KW_DB_WAL, "", 0, &it));
    const void *k, *v;
    size_t klen, vlen, i = 0;
    while (kw_db_next(it, &k, &klen, &v, &vlen) == 1) {
        ck_assert_uint_eq(klen, 8);
        ck_assert_uint_eq(rdbe64(k), lsns[i]);
        ck_assert_uint_eq(rd64((const unsigned char *)v + 8), lsns[i]); /* header LSN, little-endian */
        i++;
    }
    ck_assert_uint_eq(i, N);
    kw_wal_iter_end(it);
    kw_read_end(r);

    /* not above the last key: refused with an error naming the LSN; the
     * whole write is rolled back, the store stays usable */
    static const uint64_t again[] = {(1ull << 63) + 1, 1ull << 63};
    kw_buf r0 = {0}, r1 = {0};
    make_rec(c, &r0, again[0], 0);
    make_rec(c, &r1, again[1], 0);
    wal_put puts[] = {{again[0], r0.p, r0.len}, {again[1], r1.p, r1.len}};
    wal_fill f = {.puts = puts, .n = 2};
    ck_assert_rc(kw_store_write(s, fill_wal, &f), KEEL_EINVAL);
    ck_assert_int_eq(f.put_rc, KEEL_EINVAL);
    ck_assert_msg(has(f.put_err, "9223372036854775808"), "%s", f.put_err);
    ck_assert_uint_eq(wal_lsns(s, 0, got, N + 4), N); /* (1<<63)+1 was not committed either */
    wal_put smaller[] = {{3, r0.p, r0.len}};
    f = (wal_fill){.puts = smaller, .n = 1};
    ck_assert_rc(kw_store_write(s, fill_wal, &f), KEEL_EINVAL);
    ck_assert(has(f.put_err, "LSN 3"));
    ck_assert_uint_eq(wal_lsns(s, 0, got, N + 4), N);
    kw_buf_free(&r0);
    kw_buf_free(&r1);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

/* A refused append does not poison the transaction: the fill may go on. */
typedef struct retry_fill {
    const kw_buf *recs;
    int refused;
} retry_fill;

static int fill_refuse_then_continue(kw_wtxn *t, void *arg)
{
    retry_fill *f = arg;
    int rc = kw_put_wal(t, 10, f->recs[0].p, f->recs[0].len);
    if (rc)
        return rc;
    f->refused = kw_put_wal(t, 10, f->recs[0].p, f->recs[0].len);
    int r2 = kw_put_wal(t, 9, f->recs[0].p, f->recs[0].len);
    if (!f->refused || !r2)
        return KEEL_EINVAL;
    return kw_put_wal(t, 11, f->recs[1].p, f->recs[1].len);
}

START_TEST(refused_append_leaves_the_transaction_usable)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kw_buf recs[2] = {{0}};
    make_rec(c, &recs[0], 10, 0);
    make_rec(c, &recs[1], 11, 0);
    retry_fill f = {.recs = recs};
    ck_assert_ok(kw_store_write(s, fill_refuse_then_continue, &f));
    ck_assert_int_eq(f.refused, KEEL_EINVAL);
    uint64_t got[4];
    ck_assert_uint_eq(wal_lsns(s, 0, got, 4), 2);
    ck_assert_uint_eq(got[0], 10);
    ck_assert_uint_eq(got[1], 11);
    kw_buf_free(&recs[0]);
    kw_buf_free(&recs[1]);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(wal_iter_from_an_lsn_and_bounds)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    uint64_t first, last, count;
    ck_assert_rc(bounds(s, &first, &last, &count), KEEL_ENOENT);
    ck_assert_uint_eq(count, 0);
    uint64_t got[16];
    ck_assert_uint_eq(wal_lsns(s, 0, got, 16), 0);
    static const uint64_t lsns[] = {1, 2, 3, 4, 5, 8, 9, 10};
    ck_assert_ok(append(s, c, lsns, 8, 0, NULL));
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(first, 1);
    ck_assert_uint_eq(last, 10);
    ck_assert_uint_eq(count, 8);
    static const struct { uint64_t from; size_t n; uint64_t first; } cases[] = {
        {0, 8, 1}, {1, 8, 1}, {4, 5, 4}, {6, 3, 8}, {8, 3, 8}, {10, 1, 10}, {11, 0, 0}, {UINT64_MAX, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = wal_lsns(s, cases[i].from, got, 16);
        ck_assert_msg(n == cases[i].n, "from %llu: %zu records", (unsigned long long)cases[i].from, n);
        if (n)
            ck_assert_uint_eq(got[0], cases[i].first);
        for (size_t k = 1; k < n; k++)
            ck_assert_uint_gt(got[k], got[k - 1]);
    }
    /* the values are the records that were written */
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it;
    ck_assert_ok(kw_wal_iter(r, 9, &it));
    uint64_t lsn;
    const void *rec;
    size_t len;
    ck_assert_int_eq(kw_wal_next(it, &lsn, &rec, &len), 1);
    kw_buf want = {0};
    make_rec(c, &want, 9, 0);
    ck_assert_uint_eq(len, want.len);
    ck_assert(memcmp(rec, want.p, len) == 0);
    kw_wal_iter_end(it);
    kw_wal_iter_end(NULL);
    /* only first, only count */
    ck_assert_ok(kw_wal_bounds(r, &first, NULL, NULL));
    ck_assert_uint_eq(first, 1);
    ck_assert_ok(kw_wal_bounds(r, NULL, NULL, &count));
    ck_assert_uint_eq(count, 8);
    kw_read_end(r);
    kw_read_end(NULL);
    kw_buf_free(&want);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

typedef struct del_arg {
    int which;                 /* 0 upto, 1 from */
    uint64_t at, deleted;
} del_arg;

static int fill_del(kw_wtxn *t, void *arg)
{
    del_arg *d = arg;
    d->deleted = 0xdead;
    return d->which ? kw_del_wal_from(t, d->at, &d->deleted) : kw_del_wal_upto(t, d->at, &d->deleted);
}

static uint64_t del_wal(kw_store *s, int which, uint64_t at)
{
    del_arg d = {which, at, 0};
    ck_assert_ok(kw_store_write(s, fill_del, &d));
    return d.deleted;
}

START_TEST(del_wal_upto_and_from)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    ck_assert_uint_eq(del_wal(s, 0, 100), 0); /* empty WAL */
    ck_assert_uint_eq(del_wal(s, 1, 0), 0);
    uint64_t lsns[600];
    for (int i = 0; i < 600; i++)
        lsns[i] = 1001 + (uint64_t)i; /* enough records for several LMDB pages */
    ck_assert_ok(append(s, c, lsns, 600, 0, NULL));
    uint64_t first, last, count, got[600];
    ck_assert_uint_eq(del_wal(s, 0, 1000), 0);   /* below the first */
    ck_assert_uint_eq(del_wal(s, 0, 1100), 100); /* 1001..1100 */
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(first, 1101);
    ck_assert_uint_eq(last, 1600);
    ck_assert_uint_eq(count, 500);
    ck_assert_uint_eq(del_wal(s, 1, 1551), 50); /* 1551..1600 */
    ck_assert_uint_eq(del_wal(s, 1, 1551), 0);
    ck_assert_uint_eq(del_wal(s, 1, 5000), 0);
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(first, 1101);
    ck_assert_uint_eq(last, 1550);
    ck_assert_uint_eq(count, 450);
    ck_assert_uint_eq(wal_lsns(s, 0, got, 600), 450);
    for (size_t i = 0; i < 450; i++)
        ck_assert_uint_eq(got[i], 1101 + i);
    /* a truncated tail can be appended again from where it was cut */
    static const uint64_t again[] = {1551, 1552};
    ck_assert_ok(append(s, c, again, 2, 0, NULL));
    ck_assert_uint_eq(del_wal(s, 1, 1200), 353); /* 1200..1552 */
    ck_assert_uint_eq(del_wal(s, 0, UINT64_MAX), 99);
    ck_assert_rc(bounds(s, &first, &last, &count), KEEL_ENOENT);
    ck_assert_uint_eq(count, 0);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

/* ---- named databases: put, get, del, prefix iteration and deletion ---------------------- */

typedef struct kv {
    kw_db db;
    unsigned char key[16];
    size_t klen;
    size_t vlen;               /* value: vlen bytes derived from the key */
} kv;

static void kv_value(const kv *e, unsigned char *out)
{
    for (size_t i = 0; i < e->vlen; i++)
        out[i] = (unsigned char)(e->key[e->klen - 1] + e->key[e->klen > 1 ? e->klen - 2 : 0] * 7 + i);
}

typedef struct kv_fill {
    const kv *e;
    size_t n;
} kv_fill;

static int fill_kv(kw_wtxn *t, void *arg)
{
    kv_fill *f = arg;
    unsigned char v[512];
    for (size_t i = 0; i < f->n; i++) {
        kv_value(&f->e[i], v);
        int rc = kw_put(t, f->e[i].db, f->e[i].key, f->e[i].klen, v, f->e[i].vlen);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

/* The snap layout of a checkpoint: T, S+page, C+table+chunk, plus keys
 * just outside the prefixes ('B', 'D'). */
static size_t snap_keys(kv *e)
{
    size_t n = 0;
    e[n++] = (kv){KW_DB_SNAP, {'B', 1}, 2, 40};
    for (uint32_t t = 0; t < 3; t++)
        for (uint32_t k = 0; k < 600; k++) {
            e[n] = (kv){.db = KW_DB_SNAP, .vlen = 150};
            e[n].klen = kw_snap_key_chunk(e[n].key, t, k);
            n++;
        }
    e[n++] = (kv){KW_DB_SNAP, {'D'}, 1, 40};
    for (uint32_t p = 0; p < 5; p++) {
        e[n] = (kv){.db = KW_DB_SNAP, .vlen = 300};
        e[n].klen = kw_snap_key_slots(e[n].key, p);
        n++;
    }
    e[n++] = (kv){KW_DB_SNAP, {'T'}, 1, 64};
    return n;
}

/* A new store in the new directory dir holding snap_keys' keys; how many to *n. */
static kw_store *store_with_snap_keys(char dir[256], size_t *n)
{
    new_dir(dir);
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    static kv e[2000];
    *n = snap_keys(e);
    kv_fill f = {e, *n};
    ck_assert_ok(kw_store_write(s, fill_kv, &f));
    return s;
}

/* Keys of db under prefix, in iteration order; checks the values. */
static size_t list_keys(kw_store *s, kw_db db, const void *prefix, size_t plen, unsigned char (*keys)[16], size_t max)
{
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it;
    ck_assert_ok(kw_db_iter(r, db, prefix, plen, &it));
    const void *k, *v;
    size_t klen, vlen, n = 0;
    int rc;
    while ((rc = kw_db_next(it, &k, &klen, &v, &vlen)) == 1) {
        ck_assert_uint_le(klen, 16);
        ck_assert_uint_ge(klen, plen);
        ck_assert(memcmp(k, prefix, plen) == 0);
        kv e = {.db = db, .klen = klen, .vlen = vlen};
        memcpy(e.key, k, klen);
        unsigned char want[512];
        kv_value(&e, want);
        ck_assert(memcmp(v, want, vlen) == 0);
        ck_assert_uint_lt(n, max);
        memset(keys[n], 0, 16);
        memcpy(keys[n], k, klen);
        if (n)
            ck_assert_int_lt(memcmp(keys[n - 1], keys[n], 16), 0);
        n++;
    }
    ck_assert_int_eq(rc, 0);
    kw_wal_iter_end(it);
    kw_read_end(r);
    return n;
}

START_TEST(put_get_del_in_the_named_databases)
{
    char dir[256];
    new_dir(dir);
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kv e[KW_DB_COUNT_];
    for (int db = 0; db < KW_DB_COUNT_; db++)
        e[db] = (kv){(kw_db)db, {'k', (unsigned char)('0' + db)}, 2, 10 + (size_t)db};
    kv_fill f = {e, KW_DB_COUNT_};
    ck_assert_ok(kw_store_write(s, fill_kv, &f));
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    for (int db = 0; db < KW_DB_COUNT_; db++) {
        const void *v;
        size_t vlen;
        ck_assert_ok(kw_get(r, (kw_db)db, e[db].key, 2, &v, &vlen));
        unsigned char want[64];
        kv_value(&e[db], want);
        ck_assert_uint_eq(vlen, e[db].vlen);
        ck_assert(memcmp(v, want, vlen) == 0);
        /* databases are separate namespaces */
        ck_assert_rc(kw_get(r, (kw_db)db, e[(db + 1) % KW_DB_COUNT_].key, 2, &v, &vlen), KEEL_ENOENT);
    }
    kw_read_end(r);
    /* overwrite one, delete one, delete an absent key */
    e[KW_DB_SNAP].vlen = 3;
    f = (kv_fill){&e[KW_DB_SNAP], 1};
    ck_assert_ok(kw_store_write(s, fill_kv, &f));
    unsigned char keys[4][16];
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "k", 1, keys, 4), 1);
    kw_store_close(s);
    s = open_store(dir, 0, 0, 0);
    ck_assert_ok(kw_read_begin(s, &r));
    const void *v;
    size_t vlen;
    ck_assert_ok(kw_get(r, KW_DB_SNAP, e[KW_DB_SNAP].key, 2, &v, &vlen));
    ck_assert_uint_eq(vlen, 3);
    kw_read_end(r);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

typedef struct del_one {
    kw_db db;
    const void *key;
    size_t klen;
} del_one;

static int fill_del_one(kw_wtxn *t, void *arg)
{
    del_one *d = arg;
    int rc = kw_del(t, d->db, d->key, d->klen);
    return rc ? rc : kw_del(t, d->db, d->key, d->klen); /* again: absent is fine */
}

START_TEST(del_removes_a_key_and_ignores_absent_ones)
{
    char dir[256];
    new_dir(dir);
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kv e[2] = {{KW_DB_DICT, {'a'}, 1, 5}, {KW_DB_DICT, {'b'}, 1, 5}};
    kv_fill f = {e, 2};
    ck_assert_ok(kw_store_write(s, fill_kv, &f));
    del_one d = {KW_DB_DICT, "a", 1};
    ck_assert_ok(kw_store_write(s, fill_del_one, &d));
    d = (del_one){KW_DB_DICT, "zz", 2};
    ck_assert_ok(kw_store_write(s, fill_del_one, &d));
    unsigned char keys[4][16];
    ck_assert_uint_eq(list_keys(s, KW_DB_DICT, "", 0, keys, 4), 1);
    ck_assert_uint_eq(keys[0][0], 'b');
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

START_TEST(db_iter_lists_a_prefix_in_key_order)
{
    char dir[256];
    size_t n = 0;
    kw_store *s = store_with_snap_keys(dir, &n);
    static unsigned char keys[2000][16];
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "", 0, keys, 2000), n);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "C", 1, keys, 2000), 1800);
    for (size_t i = 0; i < 1800; i++) {
        ck_assert_uint_eq(rdbe32(keys[i] + 1), i / 600);
        ck_assert_uint_eq(rdbe32(keys[i] + 5), i % 600);
    }
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "S", 1, keys, 2000), 5);
    for (uint32_t p = 0; p < 5; p++)
        ck_assert_uint_eq(rdbe32(keys[p] + 1), p);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "T", 1, keys, 2000), 1);
    unsigned char t1[5] = {'C', 0, 0, 0, 1};
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, t1, 5, keys, 2000), 600);
    ck_assert_uint_eq(rdbe32(keys[0] + 1), 1);
    ck_assert_uint_eq(rdbe32(keys[599] + 5), 599);
    unsigned char chunk[9];
    kw_snap_key_chunk(chunk, 2, 17);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, chunk, 9, keys, 2000), 1);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "Z", 1, keys, 2000), 0); /* after every key */
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "A", 1, keys, 2000), 0); /* before every key */
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "C\xff", 2, keys, 2000), 0);
    ck_assert_uint_eq(list_keys(s, KW_DB_WAL, "C", 1, keys, 2000), 0);
    /* prefixes are at most 16 bytes */
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it = NULL;
    ck_assert_rc(kw_db_iter(r, KW_DB_SNAP, "0123456789abcdefg", 17, &it), KEEL_EINVAL);
    ck_assert_ptr_null(it);
    ck_assert_ok(kw_db_iter(r, KW_DB_SNAP, "0123456789abcdef", 16, &it));
    const void *k, *v;
    size_t klen, vlen;
    ck_assert_int_eq(kw_db_next(it, &k, &klen, &v, &vlen), 0);
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

/* No prefix at all (NULL, length 0) lists every key. */
START_TEST(db_iter_with_a_null_prefix_lists_every_key)
{
    char dir[256];
    size_t n = 0;
    kw_store *s = store_with_snap_keys(dir, &n);
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it = NULL;
    ck_assert_ok(kw_db_iter(r, KW_DB_SNAP, NULL, 0, &it));
    const void *k, *v;
    size_t klen, vlen, m = 0;
    while (kw_db_next(it, &k, &klen, &v, &vlen) == 1)
        m++;
    ck_assert_uint_eq(m, n);
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

typedef struct prefix_del {
    const void *prefix;
    size_t plen;
    bool (*keep)(const void *key, size_t klen, void *arg);
    int calls;
} prefix_del;

static bool keep_some_chunks(const void *key, size_t klen, void *arg)
{
    prefix_del *d = arg;
    d->calls++;
    const unsigned char *k = key;
    return klen == 9 && (rdbe32(k + 1) == 1 || rdbe32(k + 5) % 3 == 0);
}

static int fill_del_prefix(kw_wtxn *t, void *arg)
{
    prefix_del *d = arg;
    return kw_del_prefix(t, KW_DB_SNAP, d->prefix, d->plen, d->keep, d);
}

START_TEST(del_prefix_keeps_what_keep_says)
{
    char dir[256];
    size_t n = 0;
    kw_store *s = store_with_snap_keys(dir, &n);
    static unsigned char keys[2000][16];

    prefix_del d = {"C", 1, keep_some_chunks, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    ck_assert_int_ge(d.calls, 1800); /* every key under the prefix was offered */
    size_t left = list_keys(s, KW_DB_SNAP, "C", 1, keys, 2000);
    ck_assert_uint_eq(left, 600 + 2 * 200);
    for (size_t i = 0; i < left; i++)
        ck_assert(rdbe32(keys[i] + 1) == 1 || rdbe32(keys[i] + 5) % 3 == 0);
    /* keys outside the prefix are untouched */
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "", 0, keys, 2000), n - 1800 + left);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "B", 1, keys, 2000), 1);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "D", 1, keys, 2000), 1);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "S", 1, keys, 2000), 5);

    /* no keep: everything under a longer prefix goes */
    unsigned char t1[5] = {'C', 0, 0, 0, 1};
    d = (prefix_del){t1, 5, NULL, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, t1, 5, keys, 2000), 0);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "C", 1, keys, 2000), 400);
    /* a prefix that matches nothing, and deleting the last keys of the db */
    d = (prefix_del){"Q", 1, NULL, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    d = (prefix_del){"T", 1, NULL, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "T", 1, keys, 2000), 0);
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "", 0, keys, 2000), 1 + 1 + 5 + 400);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

/* The empty prefix matches every key, as it does for kw_db_iter. */
START_TEST(del_prefix_with_the_empty_prefix_clears_the_database)
{
    char dir[256];
    size_t n = 0;
    kw_store *s = store_with_snap_keys(dir, &n);
    static unsigned char keys[2000][16];
    prefix_del d = {"", 0, keep_some_chunks, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "", 0, keys, 2000), 1000); /* the kept chunks */
    d = (prefix_del){"", 0, NULL, 0};
    ck_assert_ok(kw_store_write(s, fill_del_prefix, &d));
    ck_assert_uint_eq(list_keys(s, KW_DB_SNAP, "", 0, keys, 2000), 0);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

/* ---- write failures, map growth, format versions --------------------------------------- */

START_TEST(a_failing_fill_commits_nothing)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kw_buf r1 = {0};
    make_rec(c, &r1, 1, 0);
    wal_put puts[] = {{1, r1.p, r1.len}};
    wal_fill f = {.puts = puts, .n = 1, .then = KEEL_ECONFLICT};
    ck_assert_rc(kw_store_write(s, fill_wal, &f), KEEL_ECONFLICT);
    ck_assert_int_eq(f.calls, 1); /* not retried */
    uint64_t first, last, count;
    ck_assert_rc(bounds(s, &first, &last, &count), KEEL_ENOENT);
    f = (wal_fill){.puts = puts, .n = 1};
    ck_assert_ok(kw_store_write(s, fill_wal, &f));
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(count, 1);
    kw_buf_free(&r1);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(map_grows_when_a_write_does_not_fit)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 64 << 10, 0);
    ck_assert_uint_eq(kw_store_map_size(s), 64 << 10);
    uint64_t lsns[BIG_RECS];
    for (int i = 0; i < BIG_RECS; i++)
        lsns[i] = 1 + (uint64_t)i;
    int calls = 0;
    ck_assert_ok(append(s, c, lsns, BIG_RECS, BIG_LEN, &calls));
    ck_assert_int_gt(calls, 1); /* aborted, grown, filled again */
    uint64_t map = kw_store_map_size(s);
    ck_assert_uint_ge(map, (uint64_t)BIG_RECS * BIG_LEN);
    ck_assert_uint_eq(map % (64 << 10), 0);
    ck_assert_uint_ge(kw_store_file_size(s), (uint64_t)BIG_RECS * BIG_LEN);
    /* every record is there, whole */
    kw_rtxn *r;
    ck_assert_ok(kw_read_begin(s, &r));
    kw_walit *it;
    ck_assert_ok(kw_wal_iter(r, 0, &it));
    uint64_t lsn;
    const void *rec;
    size_t len;
    kw_buf want = {0};
    for (int i = 0; i < BIG_RECS; i++) {
        ck_assert_int_eq(kw_wal_next(it, &lsn, &rec, &len), 1);
        ck_assert_uint_eq(lsn, lsns[i]);
        make_rec(c, &want, lsn, BIG_LEN);
        ck_assert_uint_eq(len, want.len);
        ck_assert(memcmp(rec, want.p, len) == 0);
    }
    ck_assert_int_eq(kw_wal_next(it, &lsn, &rec, &len), 0);
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_store_close(s);
    /* reopened with the small size again: the file's larger map is kept */
    s = open_store(dir, 0, 64 << 10, 0);
    ck_assert_uint_ge(kw_store_map_size(s), (uint64_t)BIG_RECS * BIG_LEN);
    static const uint64_t next[] = {BIG_RECS + 1};
    ck_assert_ok(append(s, c, next, 1, 0, NULL));
    uint64_t first, last, count;
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(count, BIG_RECS + 1);
    kw_buf_free(&want);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(map_max_reached_is_enospc_and_commits_nothing)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 64 << 10, 256 << 10);
    uint64_t lsns[BIG_RECS];
    for (int i = 0; i < BIG_RECS; i++)
        lsns[i] = 1 + (uint64_t)i;
    int calls = 0;
    ck_assert_rc(append(s, c, lsns, BIG_RECS, BIG_LEN, &calls), KEEL_ENOSPC);
    ck_assert(has(keel_last_error(), "262144"));
    ck_assert(has(keel_last_error(), dir));
    ck_assert_int_ge(calls, 2);
    ck_assert_uint_eq(kw_store_map_size(s), 256 << 10);
    uint64_t first, last, count;
    ck_assert_rc(bounds(s, &first, &last, &count), KEEL_ENOENT);
    ck_assert_uint_eq(count, 0);
    /* the store still takes what fits */
    static const uint64_t one[] = {1};
    ck_assert_ok(append(s, c, one, 1, 0, NULL));
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(count, 1);
    kw_store_close(s);
    /* a map size above the maximum is clamped to it */
    s = open_store(dir, 0, 1 << 20, 256 << 10);
    ck_assert_uint_eq(kw_store_map_size(s), 256 << 10);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

START_TEST(injected_write_failure_commits_nothing)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    uint64_t first, last, count;
    kw_store_test_fail_write(s, 1, KEEL_EIO);
    static const uint64_t l1[] = {1}, l2[] = {2}, l3[] = {3}, l4[] = {4}, l5[] = {5};
    int calls = 0;
    ck_assert_rc(append(s, c, l1, 1, 0, &calls), KEEL_EIO);
    ck_assert_int_eq(calls, 1);
    ck_assert(has(keel_last_error(), "injected"));
    ck_assert(has(keel_last_error(), dir));
    ck_assert_rc(bounds(s, &first, &last, &count), KEEL_ENOENT);
    /* once only */
    ck_assert_ok(append(s, c, l1, 1, 0, NULL));
    /* the third write from now, with another code */
    kw_store_test_fail_write(s, 3, KEEL_ENOSPC);
    ck_assert_ok(append(s, c, l2, 1, 0, NULL));
    ck_assert_ok(append(s, c, l3, 1, 0, NULL));
    ck_assert_rc(append(s, c, l4, 1, 0, NULL), KEEL_ENOSPC);
    ck_assert_ok(bounds(s, &first, &last, &count));
    ck_assert_uint_eq(last, 3);
    ck_assert_uint_eq(count, 3);
    /* nth 0 disables a pending failure */
    kw_store_test_fail_write(s, 1, KEEL_EIO);
    kw_store_test_fail_write(s, 0, 0);
    ck_assert_ok(append(s, c, l4, 1, 0, NULL));
    ck_assert_ok(append(s, c, l5, 1, 0, NULL));
    kw_store_close(s);
    /* what was committed survives a reopen; what failed never appears */
    s = open_store(dir, 0, 0, 0);
    uint64_t got[8];
    ck_assert_uint_eq(wal_lsns(s, 0, got, 8), 5);
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(got[i], 1 + (uint64_t)i);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

typedef struct meta_put {
    const void *val;
    size_t vlen;
    bool del;
} meta_put;

static int fill_meta_format(kw_wtxn *t, void *arg)
{
    meta_put *m = arg;
    if (m->del)
        return kw_del(t, KW_DB_META, KW_META_FORMAT, strlen(KW_META_FORMAT));
    return kw_put(t, KW_DB_META, KW_META_FORMAT, strlen(KW_META_FORMAT), m->val, m->vlen);
}

START_TEST(newer_format_version_is_refused)
{
    char dir[256];
    new_dir(dir);
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    unsigned char v2[4];
    wr32(v2, KEEL_WAL_FORMAT_VERSION + 1);
    meta_put m = {v2, 4, false};
    ck_assert_ok(kw_store_write(s, fill_meta_format, &m));
    kw_store_close(s);
    char want[32];
    snprintf(want, sizeof want, "version %u", KEEL_WAL_FORMAT_VERSION + 1);
    static const uint32_t flags[] = {0, KW_OPEN_READONLY, KW_OPEN_CREATE};
    for (size_t i = 0; i < 3; i++) {
        s = (kw_store *)0x1;
        ck_assert_rc(kw_store_open(dir, &(kw_store_desc){.flags = flags[i]}, &s), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), want), "%s", keel_last_error());
        ck_assert(has(keel_last_error(), dir));
        ck_assert_ptr_eq(s, (kw_store *)0x1);
    }
    /* a version value of the wrong size is not this format either */
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_set_maxdbs(env, 8), 0);
    ck_assert_int_eq(mdb_env_open(env, dir, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val k = {6, "format"}, v = {2, "\x01\x00"};
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ECORRUPT);
    rm_tree(dir);

    /* no format key at all: not a keel directory (unless CREATE writes it) */
    new_dir(dir);
    s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    m = (meta_put){.del = true};
    ck_assert_ok(kw_store_write(s, fill_meta_format, &m));
    kw_store_close(s);
    ck_assert_rc(kw_store_open(dir, NULL, &s), KEEL_ENOENT);
    ck_assert(has(keel_last_error(), "format"));
    s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kw_store_close(s);
    s = open_store(dir, 0, 0, 0);
    kw_store_close(s);
    rm_tree(dir);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("wal_store");
    const TTest *open[] = {create_opens_a_fresh_directory,
                           creation_is_atomic_and_discards_a_crashed_creation,
                           missing_directory_without_create_is_enoent,
                           directory_without_keel_data_is_refused,
                           readonly_open_sees_a_live_writers_commits,
                           readonly_store_refuses_writes,
                           newer_format_version_is_refused};
    add_case(s, "open", true, open, sizeof open / sizeof open[0]);
    const TTest *wal[] = {put_wal_appends_in_order_and_refuses_non_increasing_lsns,
                          refused_append_leaves_the_transaction_usable, wal_iter_from_an_lsn_and_bounds,
                          del_wal_upto_and_from};
    add_case(s, "wal", true, wal, sizeof wal / sizeof wal[0]);
    const TTest *databases[] = {put_get_del_in_the_named_databases,
                                del_removes_a_key_and_ignores_absent_ones,
                                db_iter_lists_a_prefix_in_key_order,
                                db_iter_with_a_null_prefix_lists_every_key,
                                del_prefix_keeps_what_keep_says,
                                del_prefix_with_the_empty_prefix_clears_the_database};
    add_case(s, "databases", true, databases, sizeof databases / sizeof databases[0]);
    const TTest *writes[] = {a_failing_fill_commits_nothing, map_grows_when_a_write_does_not_fit,
                             map_max_reached_is_enospc_and_commits_nothing,
                             injected_write_failure_commits_nothing};
    add_case(s, "writes", true, writes, sizeof writes / sizeof writes[0]);
    return s;
}

/* ---- wal_fuzz: regressions for what the fuzz targets found (tests/fuzz) ---------------- */

/* A zstd record whose header claims more than its frame holds is refused
 * before the payload buffer is allocated. Found by fuzz_record: a
 * 440-byte input whose header claimed 1.7 GB made kw_record_payload
 * allocate 2 GiB before zstd refused the frame (libFuzzer: out-of-memory
 * (malloc(2147483648)); tests/fuzz/corpus/record/regress-zstd-claims-2gib). */
START_TEST(zstd_raw_length_is_checked_against_the_frame_before_allocating)
{
    kw_codec_ctx *c = codec();
    unsigned char payload[4096] = {0};
    kw_buf b = {0};
    ck_assert_ok(kw_record_build(c, &b, KW_KIND_TICK_CHUNK, 7, 1, 0, payload, sizeof payload));
    ck_assert_uint_eq(b.p[7], KW_CODEC_ZSTD);
    kw_header h;
    const void *p;
    static const uint32_t lies[] = {0x7fffffffu, 4095, 4097, 0};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        wr32(b.p + 32, lies[i]); /* raw_len, the CRC made valid again */
        reseal(b.p, b.len);
        ck_assert_ok(kw_record_check(b.p, b.len, &h));
        ck_assert_rc(kw_record_payload(c, b.p, &h, &p), KEEL_ECORRUPT);
        ck_assert_msg(has(keel_last_error(), "LSN 7") && has(keel_last_error(), "declares another size"), "%s",
                      keel_last_error());
    }
    wr32(b.p + 32, sizeof payload);
    reseal(b.p, b.len);
    ck_assert_ok(kw_record_check(b.p, b.len, &h));
    ck_assert_ok(kw_record_payload(c, b.p, &h, &p));
    ck_assert(memcmp(p, payload, sizeof payload) == 0);

    /* a frame that itself declares 2 GiB - 1 in 13 bytes: no zstd frame
     * expands that far (a block of >= 4 bytes yields <= 128 KiB) */
    static const unsigned char frame[] = {0x28, 0xb5, 0x2f, 0xfd, 0xa0, 0xff, 0xff, 0xff, 0x7f, 0x83, 0x00, 0x00, 0x41};
    unsigned char rec[KW_HEADER_SIZE + sizeof frame];
    kw_buf one = {0};
    ck_assert_ok(kw_record_build(c, &one, KW_KIND_SIDE, 8, 1, 0, "x", 1));
    memcpy(rec, one.p, KW_HEADER_SIZE);
    memcpy(rec + KW_HEADER_SIZE, frame, sizeof frame);
    rec[7] = KW_CODEC_ZSTD;
    wr32(rec + 32, 0x7fffffffu);
    wr32(rec + 36, sizeof frame);
    reseal(rec, sizeof rec);
    ck_assert_ok(kw_record_check(rec, sizeof rec, &h));
    ck_assert_rc(kw_record_payload(c, rec, &h, &p), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "LSN 8") && has(keel_last_error(), "cannot expand that far"), "%s",
                  keel_last_error());
    /* a frame without its content size */
    static const unsigned char nosize[] = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x48, 0x0b, 0x00, 0x00, 0x41};
    memcpy(rec + KW_HEADER_SIZE, nosize, sizeof nosize);
    wr32(rec + 32, 1);
    wr32(rec + 36, sizeof nosize);
    reseal(rec, KW_HEADER_SIZE + sizeof nosize);
    ck_assert_ok(kw_record_check(rec, KW_HEADER_SIZE + sizeof nosize, &h));
    ck_assert_rc(kw_record_payload(c, rec, &h, &p), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "does not declare its size"), "%s", keel_last_error());
    kw_buf_free(&one);
    kw_buf_free(&b);
    kw_codec_destroy(c);
}
END_TEST

/* A one-component schema payload: a component of `size` bytes and
 * `discipline` with one field (type, offset, count), or none. */
static void field_schema(kw_buf *b, uint32_t size, uint32_t discipline, bool field, uint32_t type, uint32_t offset,
                         uint32_t count)
{
    b->len = 0;
    ck_assert_ok(kw_put_u32(b, 1));
    ck_assert_ok(kw_put_u32(b, 1));
    ck_assert_ok(kw_put_u32(b, size));
    ck_assert_ok(kw_put_u32(b, 8));
    ck_assert_ok(kw_put_u32(b, discipline));
    ck_assert_ok(kw_put_u8(b, 1));
    ck_assert_ok(kw_put_bytes(b, "c", 1));
    ck_assert_ok(kw_put_u32(b, field));
    if (field) {
        ck_assert_ok(kw_put_u8(b, 1));
        ck_assert_ok(kw_put_bytes(b, "f", 1));
        ck_assert_ok(kw_put_u32(b, type));
        ck_assert_ok(kw_put_u32(b, offset));
        ck_assert_ok(kw_put_u32(b, count));
    }
}

/* A schema whose field lies outside its value (or has no known type) is
 * corrupt: a reader that walks values by the stored schema (the tools
 * print them so) would read past the value. Found by fuzz_record's
 * schema walk: a mutated schema record decoded with field 'x' of 'pos' at
 * byte 11534336 of an 8-byte value. */
START_TEST(schema_fields_must_lie_inside_their_value)
{
    static const struct {
        uint32_t size, discipline;
        bool field;
        uint32_t type, offset, count;
        bool ok;
    } cases[] = {
        {8, 0, true, 4, 0, 1, true},                      /* a u64 filling the value */
        {8, 0, true, 4, 0, 0, true},                      /* count 0 counts as 1 */
        {8, 2, true, 13, 0, 8, true},                     /* 8 bytes, TRANSIENT */
        {8, 1, true, 3, 4, 1, true},                      /* a u32 at the end */
        {0, 0, false, 0, 0, 0, true},                     /* a tag */
        {8, 0, true, 4, 1, 1, false},                     /* one byte past the end */
        {8, 0, true, 4, 0, 2, false},                     /* an array past the end */
        {8, 0, true, 13, 0, 9, false},                    /* bytes past the end */
        {8, 0, true, 1, 0xffffffffu, 0xffffffffu, false}, /* 32-bit overflow must not wrap */
        {8, 0, true, 12, 11534336, 1, false},             /* the fuzzer's field */
        {8, 0, true, 0, 0, 1, false},                     /* type 0 */
        {8, 0, true, 14, 0, 1, false},                    /* past the last type */
        {8, 3, true, 4, 0, 1, false},                     /* unknown discipline */
        {0, 0, true, 1, 0, 1, false},                     /* a tag with a field */
    };
    kw_buf b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        field_schema(&b, cases[i].size, cases[i].discipline, cases[i].field, cases[i].type, cases[i].offset,
                     cases[i].count);
        kw_schema out;
        int rc = kw_schema_decode(b.p, b.len, &out);
        ck_assert_msg(rc == (cases[i].ok ? KEEL_OK : KEEL_ECORRUPT), "case %zu: %s: %s", i, keel_strerror(rc),
                      keel_last_error());
        if (rc == KEEL_OK)
            kw_schema_free(&out);
        else
            ck_assert_msg(has(keel_last_error(), "component") && has(keel_last_error(), "'c'"), "case %zu: %s", i,
                          keel_last_error());
    }
    kw_buf_free(&b);
}
END_TEST

typedef struct raw_put {
    kw_db db;
    const void *key;
    size_t klen;
    uint64_t lsn;              /* db WAL and klen 0: kw_put_wal at lsn */
    const void *val;
    size_t vlen;
} raw_put;

typedef struct raw_fill {
    const raw_put *p;
    size_t n;
} raw_fill;

static int fill_raw(kw_wtxn *t, void *arg)
{
    const raw_fill *f = arg;
    int rc = KEEL_OK;
    for (size_t i = 0; !rc && i < f->n; i++)
        rc = f->p[i].klen ? kw_put(t, f->p[i].db, f->p[i].key, f->p[i].klen, f->p[i].val, f->p[i].vlen)
                          : kw_put_wal(t, f->p[i].lsn, f->p[i].val, f->p[i].vlen);
    return rc;
}

/* kw_scan_next refuses a record that fails its check with a sentence that
 * names the record's key LSN, whatever its header holds. Found by
 * replaying fuzz_reader's corpus: a record one byte short at LSN 6 whose
 * header said LSN 2 was reported as "record at LSN 2 claims 16 payload
 * bytes but holds 15"; a record too short for a header, or without the
 * magic, was reported without any LSN. */
START_TEST(scan_names_the_key_lsn_of_a_record_that_fails_its_check)
{
    char dir[256];
    new_dir(dir);
    kw_codec_ctx *c = codec();
    kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
    kw_buf r1 = {0}, r2 = {0}, r5 = {0};
    make_rec(c, &r1, 1, 0);
    make_rec(c, &r2, 2, 0);
    make_rec(c, &r5, 5, 0);
    unsigned char nomagic[256];
    memcpy(nomagic, r1.p, r1.len);
    memcpy(nomagic, "KWR2", 4);
    wr32(nomagic + 8, 4);
    reseal(nomagic, r1.len);
    raw_put puts[] = {
        {KW_DB_WAL, NULL, 0, 1, r1.p, r1.len},
        {KW_DB_WAL, NULL, 0, 2, "short", 5},           /* shorter than a header */
        {KW_DB_WAL, NULL, 0, 3, r2.p, r2.len - 1},     /* header LSN 2, one byte short */
        {KW_DB_WAL, NULL, 0, 4, nomagic, r1.len},      /* no magic */
        {KW_DB_WAL, NULL, 0, 5, r5.p, r5.len},
    };
    ck_assert_ok(kw_store_write(s, fill_raw, &(raw_fill){puts, 5}));
    kw_rtxn *r;
    kw_scan *sc;
    ck_assert_ok(kw_read_begin(s, &r));
    ck_assert_ok(kw_scan_begin(r, NULL, &sc));
    kw_record out;
    ck_assert_int_eq(kw_scan_next(sc, &out), 1);
    ck_assert_uint_eq(out.lsn, 1);
    static const char *const why[] = {"shorter than", "claims", "magic"};
    for (uint64_t lsn = 2; lsn <= 4; lsn++) {
        ck_assert_rc(kw_scan_next(sc, &out), KEEL_ECORRUPT);
        ck_assert_uint_eq(out.lsn, lsn);
        char want[32];
        snprintf(want, sizeof want, "LSN %llu", (unsigned long long)lsn);
        ck_assert_msg(has(keel_last_error(), want) && has(keel_last_error(), why[lsn - 2]), "LSN %llu: %s",
                      (unsigned long long)lsn, keel_last_error());
    }
    ck_assert_int_eq(kw_scan_next(sc, &out), 1);
    ck_assert_uint_eq(out.lsn, 5);
    ck_assert_int_eq(kw_scan_next(sc, &out), 0);
    kw_scan_end(sc);
    kw_read_end(r);
    kw_buf_free(&r1);
    kw_buf_free(&r2);
    kw_buf_free(&r5);
    kw_store_close(s);
    kw_codec_destroy(c);
    rm_tree(dir);
}
END_TEST

/* kw_wal_bounds reads an LSN only from an 8-byte key: a damaged WAL whose
 * first or last key is shorter was answered with LSN bytes read past the
 * key (found by fuzz_reader's model of the bounds). */
START_TEST(wal_bounds_refuses_a_first_or_last_key_that_is_no_lsn)
{
    kw_codec_ctx *c = codec();
    kw_buf rec = {0};
    make_rec(c, &rec, 1, 0);
    static const struct {
        const char *key;
        size_t klen;
        int rc;
    } cases[] = {
        {"\xff", 1, KEEL_ECORRUPT},                         /* sorts last */
        {"\0\0\0", 3, KEEL_ECORRUPT},                       /* sorts first */
        {"\0\0\0\0\0\0\0\1x", 9, KEEL_OK},                  /* between LSN 1 and 2: no bound */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[256];
        new_dir(dir);
        kw_store *s = open_store(dir, KW_OPEN_CREATE, 0, 0);
        raw_put puts[] = {
            {KW_DB_WAL, NULL, 0, 1, rec.p, rec.len},
            {KW_DB_WAL, NULL, 0, 2, rec.p, rec.len},
            {KW_DB_WAL, cases[i].key, cases[i].klen, 0, rec.p, rec.len},
        };
        ck_assert_ok(kw_store_write(s, fill_raw, &(raw_fill){puts, 3}));
        uint64_t first, last, count;
        ck_assert_rc(bounds(s, &first, &last, &count), cases[i].rc);
        ck_assert_uint_eq(count, 3);
        if (cases[i].rc == KEEL_OK) {
            ck_assert_uint_eq(first, 1);
            ck_assert_uint_eq(last, 2);
        } else {
            char want[40];
            snprintf(want, sizeof want, "a key of %zu bytes", cases[i].klen);
            ck_assert_msg(has(keel_last_error(), want), "%s", keel_last_error());
        }
        kw_store_close(s);
        rm_tree(dir);
    }
    kw_buf_free(&rec);
    kw_codec_destroy(c);
}
END_TEST

static Suite *fuzz_suite(void)
{
    Suite *s = suite_create("wal_fuzz");
    ADD_CASE(s, "decoders", false, zstd_raw_length_is_checked_against_the_frame_before_allocating,
             schema_fields_must_lie_inside_their_value);
    ADD_CASE(s, "readers", true, scan_names_the_key_lsn_of_a_record_that_fails_its_check,
             wal_bounds_refuses_a_first_or_last_key_that_is_no_lsn);
    return s;
}

KEEL_TEST_MAIN(record_suite, payload_suite, store_suite, fuzz_suite)
