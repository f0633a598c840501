/*
 * wal/record.c -- the KWR1 record: header layout, building (with zstd),
 * checking and payload access. docs/wal-format.md is the specification.
 *
 * Header (48 bytes, little-endian):
 *    0 magic "KWR1"   4 u16 version   6 u8 kind   7 u8 codec
 *    8 u64 lsn       16 u64 tick     24 u32 flags 28 u32 dict id
 *   32 u32 raw len   36 u32 stored len 40 u32 crc 44 u32 reserved (0)
 * The CRC32C runs over the stored payload first, then over the 48 header
 * bytes with the crc field zeroed. Payload first, so that a record can be
 * compressed before its LSN is known (parallel fence tasks) and sealed with
 * 48 bytes of work once LSNs are handed out in order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "core/core.h"
#include "keel_wal/wal.h"
#include "planar.h"

/* Values are stored in host order and the CRC's fast path reads words: the
 * format is little-endian, and so must the host be. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "libkeel_wal needs a little-endian host");

struct kw_codec_ctx {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    int level;
    uint32_t min_compress;
    bool plain;               /* TICK_CHUNK and SNAP_CHUNK payloads as they are (codec 1), not planar (codec 2) */
    kw_buf scratch;           /* decompressed payloads */
    kw_buf planar;            /* planar forms, on their way into or out of zstd */
};

uint32_t keel_wal_format_version(void)
{
    return KEEL_WAL_FORMAT_VERSION;
}

static const char *const kind_names[] = {
    [KW_KIND_TICK_CHUNK] = "tick_chunk", [KW_KIND_TICK_COMMIT] = "tick_commit", [KW_KIND_SIDE] = "side",
    [KW_KIND_LIFECYCLE] = "lifecycle",   [KW_KIND_SCHEMA] = "schema",           [KW_KIND_CHECKPOINT] = "checkpoint",
    [KW_KIND_EPOCH] = "epoch",           [KW_KIND_SIDES] = "sides",
    [KW_KIND_SNAP_TABLES] = "snap_tables", [KW_KIND_SNAP_SLOTS] = "snap_slots", [KW_KIND_SNAP_CHUNK] = "snap_chunk",
    [KW_KIND_SNAP_KEYS] = "snap_keys",
};
#define NKINDS (sizeof kind_names / sizeof kind_names[0])

const char *kw_kind_name(uint32_t kind)
{
    return kind < NKINDS && kind_names[kind] ? kind_names[kind] : "?";
}

const char *kw_codec_name(uint32_t codec)
{
    static const char *const names[] = {[KW_CODEC_RAW] = "raw", [KW_CODEC_ZSTD] = "zstd",
                                        [KW_CODEC_ZSTD_PLANAR] = "zstd-planar"};
    return codec < sizeof names / sizeof names[0] ? names[codec] : "?";
}

uint32_t kw_kind_parse(const char *name)
{
    for (uint32_t k = 1; name && k < NKINDS; k++)
        if (kind_names[k] && !strcmp(kind_names[k], name))
            return k;
    return 0;
}

/* ---- little-endian access ------------------------------------------------ */

static void le16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void le32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void le64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---- buffers --------------------------------------------------------------- */

/* Room for `extra` more bytes, the capacity doubling: 0, or the capacity
 * that could not be allocated (b unchanged). */
static size_t buf_grow(kw_buf *b, size_t extra)
{
    if (!CORE_GROW(b->p, b->cap, b->len + extra, 256))
        return 0;
    return core_grow_cap(b->cap, b->len + extra, 256);
}

int kw_buf_reserve(kw_buf *b, size_t extra)
{
    size_t failed = buf_grow(b, extra);
    return failed ? core_fail(KEEL_ENOMEM, "out of memory growing a WAL buffer to %zu bytes", failed) : KEEL_OK;
}

void kw_buf_free(kw_buf *b)
{
    free(b->p);
    *b = (kw_buf){0};
}

/* ---- codec contexts -------------------------------------------------------- */

int kw_codec_create(const kw_codec_desc *desc, kw_codec_ctx **out)
{
    kw_codec_desc d = desc ? *desc : (kw_codec_desc){0};
    if (d.level < ZSTD_minCLevel() || d.level > ZSTD_maxCLevel())
        return core_fail(KEEL_EINVAL, "zstd level %d is outside [%d, %d]", d.level, ZSTD_minCLevel(), ZSTD_maxCLevel());
    kw_codec_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return core_fail(KEEL_ENOMEM, "out of memory for a codec context");
    c->cctx = ZSTD_createCCtx();
    c->dctx = ZSTD_createDCtx();
    c->level = d.level ? d.level : KW_CODEC_LEVEL_DEFAULT;
    c->min_compress = d.min_compress ? d.min_compress : 128;
    c->plain = d.plain;
    if (!c->cctx || !c->dctx) {
        kw_codec_destroy(c);
        return core_fail(KEEL_ENOMEM, "out of memory for zstd contexts");
    }
    ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, c->level);
    ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1);
    if (d.hash_log && ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_hashLog, d.hash_log))) {
        kw_codec_destroy(c);
        return core_fail(KEEL_EINVAL, "zstd hashLog %d is out of range", d.hash_log);
    }
    *out = c;
    return KEEL_OK;
}

void kw_codec_destroy(kw_codec_ctx *c)
{
    if (!c)
        return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    kw_buf_free(&c->scratch);
    kw_buf_free(&c->planar);
    free(c);
}

/* ---- building ---------------------------------------------------------------- */

static void put_header(unsigned char *h, uint32_t kind, uint32_t codec, uint64_t lsn, uint64_t tick, uint32_t flags,
                       uint32_t raw_len, uint32_t stored_len)
{
    memcpy(h, KEEL_WAL_MAGIC, 4);
    le16(h + 4, (uint16_t)KEEL_WAL_FORMAT_VERSION);
    h[6] = (unsigned char)kind;
    h[7] = (unsigned char)codec;
    le64(h + 8, lsn);
    le64(h + 16, tick);
    le32(h + 24, flags);
    le32(h + 28, 0);
    le32(h + 32, raw_len);
    le32(h + 36, stored_len);
    le32(h + 40, 0);
    le32(h + 44, 0);
}

/* CRC of a record whose crc field holds the payload's CRC (or anything:
 * the field is zeroed for the header part). */
static uint32_t record_crc(const unsigned char *rec, uint32_t payload_crc)
{
    unsigned char h[KW_HEADER_SIZE];
    memcpy(h, rec, sizeof h);
    le32(h + 40, 0);
    return kw_crc32c(payload_crc, h, sizeof h);
}

/* The planar form of a payload of `kind` in c's scratch, or NULL: the kind
 * has none, c is plain, the payload is not the kind's layout, or the scratch
 * cannot grow. The caller then compresses the payload as it is (plain zstd),
 * as it stores it raw when zstd fails: the forms are optimisations, so a
 * failed allocation here costs bytes, never the record, and sets no error. */
static const void *planar_form(kw_codec_ctx *c, uint32_t kind, const void *payload, size_t len)
{
    if (!planar_kind(kind) || c->plain)
        return NULL;
    c->planar.len = 0;
    if (buf_grow(&c->planar, len))
        return NULL;
    return planar_encode(kind, payload, len, c->planar.p) ? c->planar.p : NULL;
}

int kw_record_build_unsealed(kw_codec_ctx *c, kw_buf *out, uint32_t kind, uint64_t tick, uint32_t flags,
                             const void *payload, size_t len)
{
    if (len > KW_RAW_MAX)
        return core_fail(KEEL_ERANGE, "WAL payload of %zu bytes is over the 2 GiB record limit", len);
    size_t bound = len >= c->min_compress ? ZSTD_compressBound(len) : len;
    int rc = kw_buf_reserve(out, KW_HEADER_SIZE + (bound > len ? bound : len));
    if (rc)
        return rc;
    unsigned char *rec = out->p + out->len, *body = rec + KW_HEADER_SIZE;
    uint32_t codec = KW_CODEC_RAW;
    size_t stored = len;
    if (len >= c->min_compress) {
        const void *src = planar_form(c, kind, payload, len);
        uint32_t zcodec = src ? KW_CODEC_ZSTD_PLANAR : KW_CODEC_ZSTD;
        size_t z = ZSTD_compress2(c->cctx, body, bound, src ? src : payload, len);
        if (!ZSTD_isError(z) && z < len) {
            codec = zcodec;
            stored = z;
        }
    }
    if (codec == KW_CODEC_RAW && len)
        memcpy(body, payload, len);
    put_header(rec, kind, codec, 0, tick, flags, (uint32_t)len, (uint32_t)stored);
    le32(rec + 40, kw_crc32c(0, body, stored)); /* the payload CRC, until sealed */
    out->len += KW_HEADER_SIZE + stored;
    return KEEL_OK;
}

void kw_record_seal(void *rec, uint64_t lsn)
{
    unsigned char *h = rec;
    le64(h + 8, lsn);
    le32(h + 40, record_crc(h, rd32(h + 40)));
}

size_t kw_record_peek_len(const void *rec)
{
    return KW_HEADER_SIZE + (size_t)rd32((const unsigned char *)rec + 36);
}

uint32_t kw_record_peek_kind(const void *rec, size_t len)
{
    return len > 6 ? ((const unsigned char *)rec)[6] : 0;
}

int kw_record_build(kw_codec_ctx *c, kw_buf *out, uint32_t kind, uint64_t lsn, uint64_t tick, uint32_t flags,
                    const void *payload, size_t len)
{
    size_t at = out->len;
    int rc = kw_record_build_unsealed(c, out, kind, tick, flags, payload, len);
    if (!rc)
        kw_record_seal(out->p + at, lsn);
    return rc;
}

/* ---- checking and reading ---------------------------------------------------- */

/* The header's fields, not yet checked (len >= KW_HEADER_SIZE). */
static kw_header read_header(const unsigned char *p)
{
    return (kw_header){
        .version = rd16(p + 4), .kind = p[6], .codec = p[7], .lsn = rd64(p + 8), .tick = rd64(p + 16),
        .flags = rd32(p + 24), .dict_id = rd32(p + 28), .raw_len = rd32(p + 32), .stored_len = rd32(p + 36),
        .crc = rd32(p + 40),
    };
}

/* The header's own consistency and its lengths against the record's:
 * 0, or KEEL_ECORRUPT with a sentence naming the header's LSN. */
static int header_fault(const unsigned char *p, size_t len, const kw_header *h)
{
    unsigned long long lsn = (unsigned long long)h->lsn;
    if (h->version != KEEL_WAL_FORMAT_VERSION)
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu has format version %u; this build reads version %u", lsn,
                         h->version, KEEL_WAL_FORMAT_VERSION);
    if (!strcmp(kw_kind_name(h->kind), "?"))
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu has unknown kind %u", lsn, h->kind);
    if (h->codec > KW_CODEC_ZSTD_PLANAR || h->dict_id || rd32(p + 44))
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu has unknown codec %u, dictionary %u or reserved bits", lsn,
                         h->codec, h->dict_id);
    if (h->codec == KW_CODEC_ZSTD_PLANAR && !planar_kind(h->kind))
        return core_fail(KEEL_ECORRUPT,
                         "%s record at LSN %llu has codec zstd-planar, which only tick_chunk and snap_chunk records use",
                         kw_kind_name(h->kind), lsn);
    if (h->raw_len > KW_RAW_MAX || h->stored_len > KW_RAW_MAX)
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu claims %u raw / %u stored bytes, over the 2 GiB limit", lsn,
                         h->raw_len, h->stored_len);
    if ((size_t)h->stored_len != len - KW_HEADER_SIZE)
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu claims %u payload bytes but holds %zu", lsn, h->stored_len,
                         len - KW_HEADER_SIZE);
    if (h->codec == KW_CODEC_RAW && h->raw_len != h->stored_len)
        return core_fail(KEEL_ECORRUPT, "raw record at LSN %llu has raw length %u != stored length %u", lsn,
                         h->raw_len, h->stored_len);
    return KEEL_OK;
}

static int refuse(kw_fault *fault, kw_fault why, int rc)
{
    if (fault)
        *fault = why;
    return rc;
}

int kw_record_verify(const void *rec, size_t len, kw_header *out, kw_fault *fault)
{
    const unsigned char *p = rec;
    if (!p || len < KW_HEADER_SIZE)
        return refuse(fault, KW_FAULT_FRAME, core_fail(KEEL_ECORRUPT, "record of %zu bytes is shorter than the "
                                                       "%u-byte header", len, KW_HEADER_SIZE));
    if (memcmp(p, KEEL_WAL_MAGIC, 4))
        return refuse(fault, KW_FAULT_FRAME, core_fail(KEEL_ECORRUPT, "record does not start with the magic KWR1"));
    kw_header h = read_header(p);
    if (out)
        *out = h;
    if (header_fault(p, len, &h))
        return refuse(fault, KW_FAULT_HEADER, KEEL_ECORRUPT);
    uint32_t crc = record_crc(p, kw_crc32c(0, p + KW_HEADER_SIZE, h.stored_len));
    if (crc != h.crc)
        return refuse(fault, KW_FAULT_CRC,
                      core_fail(KEEL_ECORRUPT, "record at LSN %llu fails its CRC32C check (stored 0x%08x, computed "
                                "0x%08x)", (unsigned long long)h.lsn, h.crc, crc));
    return refuse(fault, KW_FAULT_NONE, KEEL_OK);
}

int kw_record_check(const void *rec, size_t len, kw_header *out)
{
    return kw_record_verify(rec, len, out, NULL);
}

int kw_wal_check(uint64_t lsn, uint64_t expect, const void *rec, size_t len, kw_header *out, kw_fault *fault)
{
    kw_fault why = KW_FAULT_GAP;
    kw_header h;
    int rc = lsn != expect ? KEEL_ECORRUPT : kw_record_verify(rec, len, &h, &why);
    if (rc == KEEL_OK && h.lsn != lsn)
        why = KW_FAULT_KEY, rc = KEEL_ECORRUPT;
    if (out && why != KW_FAULT_GAP && why != KW_FAULT_FRAME)
        *out = h;
    if (fault)
        *fault = why;
    switch (why) {
    case KW_FAULT_NONE:
        return KEEL_OK;
    case KW_FAULT_GAP:
        return core_fail(rc, "WAL record at LSN %llu: LSNs are not consecutive (a record is missing before it)",
                         (unsigned long long)lsn);
    case KW_FAULT_KEY:
        return core_fail(rc, "WAL record at LSN %llu: the record's LSN differs from its key", (unsigned long long)lsn);
    case KW_FAULT_FRAME:
        return core_fail_prefix(rc, "WAL record at LSN %llu", (unsigned long long)lsn);
    default:
        return rc; /* the sentence names the header's LSN */
    }
}

int kw_record_payload(kw_codec_ctx *c, const void *rec, const kw_header *h, const void **payload)
{
    const unsigned char *body = (const unsigned char *)rec + KW_HEADER_SIZE;
    if (h->codec == KW_CODEC_RAW) {
        *payload = body;
        return KEEL_OK;
    }
    /* Refuse a header that claims more than its frame can hold before
     * allocating raw_len bytes: the frame must declare raw_len itself
     * (docs/wal-format.md), and no zstd frame expands more than 32768-fold
     * (a block of at least 4 bytes yields at most 128 KiB). A CRC is no
     * defence against a record crafted to pass it. */
    unsigned long long declared = ZSTD_getFrameContentSize(body, h->stored_len);
    if (declared != h->raw_len || h->raw_len > 32768ull * h->stored_len)
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu claims %u raw bytes; its %u-byte zstd frame %s",
                         (unsigned long long)h->lsn, h->raw_len, h->stored_len,
                         declared == ZSTD_CONTENTSIZE_ERROR     ? "is not a zstd frame"
                         : declared == ZSTD_CONTENTSIZE_UNKNOWN ? "does not declare its size"
                         : declared != h->raw_len               ? "declares another size"
                                                                : "cannot expand that far");
    bool planar = h->codec == KW_CODEC_ZSTD_PLANAR;
    kw_buf *into = planar ? &c->planar : &c->scratch;
    c->scratch.len = c->planar.len = 0;
    int rc = kw_buf_reserve(&c->scratch, h->raw_len ? h->raw_len : 1);
    if (!rc && planar)
        rc = kw_buf_reserve(&c->planar, h->raw_len ? h->raw_len : 1);
    if (rc)
        return rc;
    size_t n = ZSTD_decompressDCtx(c->dctx, into->p, h->raw_len, body, h->stored_len);
    if (ZSTD_isError(n) && ZSTD_getErrorCode(n) == ZSTD_error_memory_allocation) /* not the record's fault */
        return core_fail(KEEL_ENOMEM, "record at LSN %llu: out of memory decompressing it", (unsigned long long)h->lsn);
    if (ZSTD_isError(n) || n != h->raw_len)
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu does not decompress to its %u bytes (%s)",
                         (unsigned long long)h->lsn, h->raw_len, ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short");
    uint32_t part = 0;
    const char *why = planar ? planar_decode(h->kind, c->planar.p, h->raw_len, c->scratch.p, &part) : NULL;
    if (why) {
        char which[24] = "";
        if (part != UINT32_MAX) /* the reason ends "... of group" or "... column" */
            snprintf(which, sizeof which, " %u", part);
        return core_fail(KEEL_ECORRUPT, "record at LSN %llu: its %u-byte planar form %s%s",
                         (unsigned long long)h->lsn, h->raw_len, why, which);
    }
    *payload = c->scratch.p;
    return KEEL_OK;
}
