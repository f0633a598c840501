/*
 * wal/payload.c -- little-endian payload builders, the bounds-checked
 * cursor, the schema payload and the small fixed layouts of meta and snap
 * keys (docs/wal-format.md).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "keel/component.h"
#include "keel_wal/wal.h"

int kw_put_bytes(kw_buf *b, const void *p, size_t n)
{
    int rc = kw_buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return KEEL_OK;
}

int kw_put_u8(kw_buf *b, uint8_t v)
{
    return kw_put_bytes(b, &v, 1);
}

int kw_put_u32(kw_buf *b, uint32_t v)
{
    unsigned char p[4];
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
    return kw_put_bytes(b, p, 4);
}

int kw_put_u64(kw_buf *b, uint64_t v)
{
    unsigned char p[8];
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
    return kw_put_bytes(b, p, 8);
}

const void *kw_get_bytes(kw_cursor *c, size_t n)
{
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = true;
        return NULL;
    }
    const void *p = c->p;
    c->p += n;
    return p;
}

uint8_t kw_get_u8(kw_cursor *c)
{
    const unsigned char *p = kw_get_bytes(c, 1);
    return p ? p[0] : 0;
}

uint32_t kw_get_u32(kw_cursor *c)
{
    const unsigned char *p = kw_get_bytes(c, 4);
    return p ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24 : 0;
}

uint64_t kw_get_u64(kw_cursor *c)
{
    const unsigned char *p = kw_get_bytes(c, 8);
    uint64_t v = 0;
    for (int i = 7; p && i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ---- scalar types ------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t width;
} scalars[KEEL_TYPE_COUNT_] = {
    [KEEL_U8] = {"u8", 1},   [KEEL_U16] = {"u16", 2}, [KEEL_U32] = {"u32", 4}, [KEEL_U64] = {"u64", 8},
    [KEEL_I8] = {"i8", 1},   [KEEL_I16] = {"i16", 2}, [KEEL_I32] = {"i32", 4}, [KEEL_I64] = {"i64", 8},
    [KEEL_F32] = {"f32", 4}, [KEEL_F64] = {"f64", 8}, [KEEL_BOOL] = {"bool", 1},
    [KEEL_ENTITY] = {"entity", 8}, [KEEL_BYTES] = {"bytes", 1},
};

uint32_t kw_scalar_width(uint32_t type)
{
    return type > KEEL_TYPE_INVALID && type < KEEL_TYPE_COUNT_ ? scalars[type].width : 0;
}

const char *kw_scalar_name(uint32_t type)
{
    return type > KEEL_TYPE_INVALID && type < KEEL_TYPE_COUNT_ ? scalars[type].name : "?";
}

const char *kw_discipline_name(uint32_t discipline)
{
    static const char *const names[] = {[KEEL_VERSIONED] = "versioned", [KEEL_SINGLE_VERSION] = "single_version",
                                        [KEEL_TRANSIENT] = "transient"};
    return discipline <= KEEL_TRANSIENT ? names[discipline] : "?";
}

/* ---- schema -------------------------------------------------------------------
 * u32 ncomps; per component: u32 id, u32 size, u32 align, u32 discipline,
 * u8 name length, name bytes, u32 nfields; per field: u8 name length, name,
 * u32 type, u32 offset, u32 count. */

static int put_name(kw_buf *b, const char *s)
{
    size_t n = strlen(s);
    int rc = kw_put_u8(b, (uint8_t)n);
    return rc ? rc : kw_put_bytes(b, s, n);
}

int kw_schema_encode(const kw_schema *s, kw_buf *out)
{
    int rc = kw_put_u32(out, s->ncomps);
    for (uint32_t i = 0; !rc && i < s->ncomps; i++) {
        const kw_component *c = &s->comps[i];
        rc = kw_put_u32(out, c->id);
        rc = rc ? rc : kw_put_u32(out, c->size);
        rc = rc ? rc : kw_put_u32(out, c->align);
        rc = rc ? rc : kw_put_u32(out, c->discipline);
        rc = rc ? rc : put_name(out, c->name);
        rc = rc ? rc : kw_put_u32(out, c->nfields);
        for (uint32_t f = 0; !rc && f < c->nfields; f++) {
            rc = put_name(out, c->fields[f].name);
            rc = rc ? rc : kw_put_u32(out, c->fields[f].type);
            rc = rc ? rc : kw_put_u32(out, c->fields[f].offset);
            rc = rc ? rc : kw_put_u32(out, c->fields[f].count);
        }
    }
    return rc;
}

static bool get_name(kw_cursor *c, char *out)
{
    uint8_t n = kw_get_u8(c);
    const char *p = kw_get_bytes(c, n);
    if (!p || n > KW_NAME_MAX || memchr(p, 0, n))
        return false;
    memcpy(out, p, n);
    out[n] = 0;
    return true;
}

/* A reader walks a value field by field through the stored schema (the
 * tools print values that way): a field of an unknown type, or one that
 * ends past the value, would send it outside the value's bytes. The
 * runtime never registers such a field (src/world/component.c). */
static bool field_fits(const kw_field *f, uint32_t size)
{
    uint32_t width = kw_scalar_width(f->type);
    return width && (uint64_t)f->offset + (uint64_t)width * (f->count ? f->count : 1) <= size;
}

void kw_schema_free(kw_schema *s)
{
    for (uint32_t i = 0; s && s->comps && i < s->ncomps; i++)
        free(s->comps[i].fields);
    if (s) {
        free(s->comps);
        *s = (kw_schema){0};
    }
}

int kw_schema_decode(const void *payload, size_t len, kw_schema *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    kw_schema s = {0};
    uint32_t n = kw_get_u32(&c);
    if (c.bad || n > 255)
        return core_fail(KEEL_ECORRUPT, "schema payload: bad component count %u", n);
    s.comps = calloc(n ? n : 1, sizeof *s.comps);
    if (!s.comps)
        return core_fail(KEEL_ENOMEM, "out of memory decoding the schema");
    for (uint32_t i = 0; i < n; i++, s.ncomps++) {
        kw_component *k = &s.comps[i];
        k->id = kw_get_u32(&c);
        k->size = kw_get_u32(&c);
        k->align = kw_get_u32(&c);
        k->discipline = kw_get_u32(&c);
        bool named = get_name(&c, k->name);
        k->nfields = kw_get_u32(&c);
        if (c.bad || !named || k->id != i + 1 || k->nfields > 64) {
            kw_schema_free(&s);
            return core_fail(KEEL_ECORRUPT, "schema payload: component %u is malformed", i + 1);
        }
        if (k->discipline > KEEL_TRANSIENT || (!k->size && k->nfields)) {
            int rc = core_fail(KEEL_ECORRUPT, "schema payload: component '%s' has discipline %u and %u fields for %u "
                               "bytes", k->name, k->discipline, k->nfields, k->size);
            kw_schema_free(&s);
            return rc;
        }
        k->fields = calloc(k->nfields ? k->nfields : 1, sizeof *k->fields);
        if (!k->fields) {
            kw_schema_free(&s);
            return core_fail(KEEL_ENOMEM, "out of memory decoding the schema");
        }
        for (uint32_t f = 0; f < k->nfields; f++) {
            bool ok = get_name(&c, k->fields[f].name);
            k->fields[f].type = kw_get_u32(&c);
            k->fields[f].offset = kw_get_u32(&c);
            k->fields[f].count = kw_get_u32(&c);
            if (!ok || c.bad || !field_fits(&k->fields[f], k->size)) {
                int rc = core_fail(KEEL_ECORRUPT, "schema payload: field %u of component '%s' is malformed or lies "
                                   "outside the %u-byte value", f, k->name, k->size);
                s.ncomps++;
                kw_schema_free(&s);
                return rc;
            }
        }
    }
    if (!kw_cursor_done(&c)) {
        kw_schema_free(&s);
        return core_fail(KEEL_ECORRUPT, "schema payload: %zu trailing bytes", (size_t)(c.end - c.p));
    }
    *out = s;
    return KEEL_OK;
}

const kw_component *kw_schema_get(const kw_schema *s, uint32_t id)
{
    return s && id >= 1 && id <= s->ncomps ? &s->comps[id - 1] : NULL;
}

/* ---- meta and snap keys ---------------------------------------------------- */

void kw_checkpoint_meta_encode(const kw_checkpoint_meta *m, unsigned char out[32])
{
    kw_buf b = {out, 0, 32};
    kw_put_u64(&b, m->tick);
    kw_put_u64(&b, m->lsn);
    kw_put_u64(&b, m->created_ns);
    kw_put_u32(&b, m->count);
    kw_put_u32(&b, 0);
}

int kw_checkpoint_meta_decode(const void *p, size_t n, kw_checkpoint_meta *out)
{
    kw_cursor c = kw_cursor_make(p, n);
    out->tick = kw_get_u64(&c);
    out->lsn = kw_get_u64(&c);
    out->created_ns = kw_get_u64(&c);
    out->count = kw_get_u32(&c);
    kw_get_u32(&c);
    if (c.bad || !kw_cursor_done(&c))
        return core_fail(KEEL_ECORRUPT, "meta 'checkpoint' is %zu bytes, not 32", n);
    return KEEL_OK;
}

static void be32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

size_t kw_snap_key_slots(unsigned char out[5], uint32_t page)
{
    out[0] = 'S';
    be32(out + 1, page);
    return 5;
}

size_t kw_snap_key_chunk(unsigned char out[9], uint32_t table, uint32_t chunk)
{
    out[0] = 'C';
    be32(out + 1, table);
    be32(out + 5, chunk);
    return 9;
}
