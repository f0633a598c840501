/*
 * wal/planar.c -- the planar forms of TICK_CHUNK and SNAP_CHUNK payloads,
 * which codec 2 (zstd-planar, docs/wal-format.md "Codecs") compresses
 * instead of the payloads themselves.
 *
 * Why: a TICK_CHUNK group's rows interleave an entity handle and a value,
 * and a SNAP_CHUNK stores each column's values row after row, so the bytes
 * zstd sees change meaning every few bytes; its matches are short and it
 * runs slowly. A planar form keeps the headers where they are and rewrites
 * the rows as byte planes: the entities as the differences of consecutive
 * handles (mod 2^64; rows come in chunk order, so the differences are small
 * and their high planes are zeros), then plane b of a column holding byte b
 * of every value (the sign and exponent bytes of floats, the high bytes of
 * counters, repeat). On the demo's TICK_CHUNK payloads at level -1 this
 * writes and reads about 1.8x faster and stores 1.3x fewer bytes than plain
 * zstd (keel-bench's codec_planar figures, docs/performance.md).
 *
 * A form has exactly the payload's length, and it is a bijection of the
 * rows once the headers are known, so decoding needs no more than a header
 * walk that checks every part against the bytes left: a planar form that
 * does not parse is refused, never read past.
 */
#include <string.h>

#include "keel_wal/wal.h"
#include "planar.h"

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4); /* little-endian host (record.c) */
    return v;
}

/* ---- tiles of 16 rows (SSE2, which every x86-64 has) ---------------------------
 *
 * A transpose a byte at a time costs about as much as zstd itself
 * (docs/performance.md, "Design measurements"). With SSE2, 16 rows of up
 * to 16 bytes are loaded a register per row, transposed in registers and
 * stored a register per plane (and back); the byte loops below take the
 * rows no whole tile covers and values of more than 16 bytes. */
#if defined(__SSE2__)
#include <emmintrin.h>
#define PLANAR_TILE 16u

/* A 16x16 byte matrix, a register per row, transposed in place. A round
 * interleaves the bytes of rows i and i + 8 into rows 2i and 2i + 1, which
 * moves the element at row r, column c (the 8-bit index rrrrcccc) to the
 * index rotated left by one bit; four rounds rotate it by four: (c, r). */
static inline void tile_transpose(__m128i x[16])
{
    for (int round = 0; round < 4; round++) {
        __m128i y[16];
        for (int i = 0; i < 8; i++) {
            y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
            y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
        }
        memcpy(x, y, sizeof y);
    }
}

/* 16 rows of size (<= 16) bytes at rows into `size` planes of 16 bytes at
 * planes, plane_stride apart. Reads 16 - size bytes past the last row. */
static inline void tile_to_planes(const unsigned char *rows, unsigned char *planes, size_t plane_stride,
                                  uint32_t size)
{
    __m128i x[16];
    for (uint32_t r = 0; r < 16; r++)
        x[r] = _mm_loadu_si128((const __m128i *)(const void *)(rows + (size_t)r * size));
    tile_transpose(x);
    for (uint32_t b = 0; b < size; b++)
        _mm_storeu_si128((__m128i *)(void *)(planes + b * plane_stride), x[b]);
}

/* The inverse: writes 16 - size bytes past the last row (each row's store
 * runs into the next row, which is stored after it). */
static inline void tile_to_rows(const unsigned char *planes, size_t plane_stride, unsigned char *rows,
                                uint32_t size)
{
    __m128i x[16];
    for (uint32_t b = 0; b < 16; b++)
        x[b] = b < size ? _mm_loadu_si128((const __m128i *)(const void *)(planes + b * plane_stride))
                        : _mm_setzero_si128();
    tile_transpose(x);
    for (uint32_t r = 0; r < 16; r++)
        _mm_storeu_si128((__m128i *)(void *)(rows + (size_t)r * size), x[r]);
}

/* The rows of n, from row 0, that whole tiles cover without a tile's
 * 16-byte access leaving the n rows of size bytes (0 when size > 16). */
static uint32_t tiled_rows(uint32_t n, uint32_t size)
{
    if (!size || size > 16 || n < PLANAR_TILE)
        return 0;
    uint32_t spill = 15 / size; /* rows a 16-byte access at a row may reach past it: ceil((16 - size) / size) */
    uint32_t tiles = n - spill >= PLANAR_TILE ? (n - spill) / PLANAR_TILE : 0;
    return tiles * PLANAR_TILE;
}
#endif

/* Entities: planes of the differences of consecutive handles. */
static void entities_to_planes(const unsigned char *in, unsigned char *out, uint32_t n)
{
    uint64_t prev = 0;
    uint32_t i = 0;
#if defined(__SSE2__)
    uint64_t diff[PLANAR_TILE + 2] = {0}; /* a tile's differences, and the 8 bytes its last load reads past them */
    for (; n - i >= PLANAR_TILE; i += PLANAR_TILE) {
        for (uint32_t r = 0; r < PLANAR_TILE; r++) {
            uint64_t e;
            memcpy(&e, in + (size_t)(i + r) * 8, 8);
            diff[r] = e - prev;
            prev = e;
        }
        tile_to_planes((const unsigned char *)diff, out + i, n, 8);
    }
#endif
    for (; i < n; i++) {
        uint64_t e;
        memcpy(&e, in + (size_t)i * 8, 8);
        uint64_t d = e - prev;
        prev = e;
        for (uint32_t b = 0; b < 8; b++)
            out[(size_t)b * n + i] = (unsigned char)(d >> (8 * b));
    }
}

static void planes_to_entities(const unsigned char *in, unsigned char *out, uint32_t n)
{
    uint64_t prev = 0;
    uint32_t i = 0;
#if defined(__SSE2__)
    uint64_t diff[PLANAR_TILE + 2]; /* a tile's differences, and the 8 bytes its last store writes past them */
    for (; n - i >= PLANAR_TILE; i += PLANAR_TILE) {
        tile_to_rows(in + i, n, (unsigned char *)diff, 8);
        for (uint32_t r = 0; r < PLANAR_TILE; r++) {
            prev += diff[r];
            memcpy(out + (size_t)(i + r) * 8, &prev, 8);
        }
    }
#endif
    for (; i < n; i++) {
        uint64_t d = 0;
        for (uint32_t b = 0; b < 8; b++)
            d |= (uint64_t)in[(size_t)b * n + i] << (8 * b);
        prev += d;
        memcpy(out + (size_t)i * 8, &prev, 8);
    }
}

/* Values: a transpose of n rows of size bytes, by tiles where they fit and
 * a byte at a time for the rest. Inlined into a switch on the common sizes
 * so that each gets loops with constant bounds. */
static inline void transpose(const unsigned char *in, unsigned char *out, uint32_t n, uint32_t size, bool to_planes)
{
    uint32_t i = 0;
#if defined(__SSE2__)
    for (uint32_t tiled = tiled_rows(n, size); i < tiled; i += PLANAR_TILE)
        if (to_planes)
            tile_to_planes(in + (size_t)i * size, out + i, n, size);
        else
            tile_to_rows(in + i, n, out + (size_t)i * size, size);
#endif
    for (; i < n; i++)
        for (uint32_t b = 0; b < size; b++) {
            size_t row = (size_t)i * size + b, plane = (size_t)b * n + i;
            if (to_planes)
                out[plane] = in[row];
            else
                out[row] = in[plane];
        }
}

static void values(const unsigned char *in, unsigned char *out, uint32_t n, uint32_t size, bool to_planes)
{
    switch (size) {
    case 4: transpose(in, out, n, 4, to_planes); break;
    case 8: transpose(in, out, n, 8, to_planes); break;
    case 12: transpose(in, out, n, 12, to_planes); break;
    case 16: transpose(in, out, n, 16, to_planes); break;
    default: transpose(in, out, n, size, to_planes); break;
    }
}

/* The entity array of n rows, in either direction. */
static void entities(const unsigned char *ents, unsigned char *dents, uint32_t n, bool to_planes)
{
    if (to_planes)
        entities_to_planes(ents, dents, n);
    else
        planes_to_entities(ents, dents, n);
}

/* True when n rows of `row` bytes fit in the left bytes (divides, so no n
 * and row, however large, wrap). */
static bool fits(uint64_t left, uint32_t n, uint64_t row)
{
    return !n || left / n >= row;
}

/* TICK_CHUNK: walk the groups of src (either form: the headers are the
 * same), writing each group's rows into dst in the other form. NULL, or why
 * the bytes are not a group layout (*part: the group at fault, UINT32_MAX
 * when the reason names none). */
static const char *convert_groups(const unsigned char *src, size_t len, unsigned char *dst, bool to_planes,
                                  uint32_t *part)
{
    *part = UINT32_MAX;
    if (len < 4)
        return "is shorter than its 4-byte group count";
    uint32_t ngroups = rd32(src);
    memcpy(dst, src, 4);
    size_t off = 4;
    for (uint32_t g = 0; g < ngroups; g++) {
        *part = g;
        if (len - off < PLANAR_GROUP_HDR)
            return "ends inside the header of group";
        uint32_t size = rd32(src + off + 4), n = rd32(src + off + 8);
        memcpy(dst + off, src + off, PLANAR_GROUP_HDR);
        off += PLANAR_GROUP_HDR;
        if (!fits(len - off, n, 8 + (uint64_t)size))
            return "ends inside the rows of group";
        entities(src + off, dst + off, n, to_planes);
        off += (size_t)n * 8;
        values(src + off, dst + off, n, size, to_planes);
        off += (size_t)n * size;
    }
    *part = UINT32_MAX;
    return off == len ? NULL : "has bytes after its last group";
}

/* SNAP_CHUNK: the 16-byte chunk header and the column list stay, the
 * entity array and then each column become planes. */
static const char *convert_snap_chunk(const unsigned char *src, size_t len, unsigned char *dst, bool to_planes,
                                      uint32_t *part)
{
    *part = UINT32_MAX;
    if (len < PLANAR_SNAP_HDR)
        return "is shorter than its 16-byte chunk header";
    uint32_t count = rd32(src + 8), ncols = rd32(src + 12);
    if ((len - PLANAR_SNAP_HDR) / 8 < ncols)
        return "ends inside its column list";
    size_t off = PLANAR_SNAP_HDR + (size_t)ncols * 8;
    memcpy(dst, src, off);
    if (!fits(len - off, count, 8))
        return "ends inside its entities";
    entities(src + off, dst + off, count, to_planes);
    off += (size_t)count * 8;
    for (uint32_t c = 0; c < ncols; c++) {
        uint32_t size = rd32(src + PLANAR_SNAP_HDR + (size_t)c * 8 + 4);
        *part = c;
        if (!fits(len - off, count, size))
            return "ends inside column";
        values(src + off, dst + off, count, size, to_planes);
        off += (size_t)count * size;
    }
    *part = UINT32_MAX;
    return off == len ? NULL : "has bytes after its last column";
}

static const char *convert(uint32_t kind, const unsigned char *src, size_t len, unsigned char *dst, bool to_planes,
                           uint32_t *part)
{
    if (kind == KW_KIND_SNAP_CHUNK)
        return convert_snap_chunk(src, len, dst, to_planes, part);
    return convert_groups(src, len, dst, to_planes, part);
}

bool planar_kind(uint32_t kind)
{
    return kind == KW_KIND_TICK_CHUNK || kind == KW_KIND_SNAP_CHUNK;
}

bool planar_encode(uint32_t kind, const void *payload, size_t len, void *out)
{
    uint32_t part;
    return convert(kind, payload, len, out, true, &part) == NULL;
}

const char *planar_decode(uint32_t kind, const void *planar, size_t len, void *out, uint32_t *part)
{
    return convert(kind, planar, len, out, false, part);
}
