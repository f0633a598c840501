/*
 * wal/decode.c -- the logical payloads of TICK_CHUNK, SIDE and LIFECYCLE
 * records, one change at a time (docs/wal-format.md has the layouts).
 * Recovery and the tools decode through this one place.
 */
#include <string.h>

#include "core/core.h"
#include "keel_wal/wal.h"

static int bad(const kw_decoder *d, const char *what)
{
    return core_fail(KEEL_ECORRUPT, "WAL record at LSN %llu: %s", (unsigned long long)d->lsn, what);
}

static int check_size(const kw_decoder *d, uint32_t comp, uint32_t size)
{
    if (!comp)
        return bad(d, "a change names component 0");
    if (!d->schema)
        return KEEL_OK;
    const kw_component *c = kw_schema_get(d->schema, comp);
    if (!c)
        return core_fail(KEEL_ECORRUPT, "WAL record at LSN %llu: component %u is not in the stored schema",
                         (unsigned long long)d->lsn, comp);
    if (c->size != size)
        return core_fail(KEEL_ECORRUPT, "WAL record at LSN %llu: a value of component '%s' has %u bytes, the schema "
                                        "says %u", (unsigned long long)d->lsn, c->name, size, c->size);
    return KEEL_OK;
}

static int decode_begin(kw_decoder *d, uint32_t kind, uint32_t flags, uint64_t lsn, const void *payload, size_t len,
                        const kw_schema *schema)
{
    memset(d, 0, offsetof(kw_decoder, comps));
    d->cur = kw_cursor_make(payload, len);
    d->lsn = lsn;
    if (kind == KW_KIND_SIDE && (flags & KW_FLAG_KEY)) { /* the trailing key (encode.c, kw_side_end) */
        if (len < 24)
            return bad(d, "the payload is too short for its header and key");
        kw_cursor k = kw_cursor_make((const unsigned char *)payload + len - 8, 8);
        d->side_key = kw_get_u64(&k);
        if (!d->side_key)
            return bad(d, "a side transaction's idempotency key is 0");
        d->cur.end -= 8;
    }
    d->kind = kind;
    d->lsn = lsn;
    d->schema = schema;
    if (kind == KW_KIND_SIDE) {
        d->side_seq = kw_get_u64(&d->cur);
        d->side_mode = kw_get_u32(&d->cur);
    } else if (kind != KW_KIND_TICK_CHUNK && kind != KW_KIND_LIFECYCLE) {
        return core_fail(KEEL_EINVAL, "kw_decode_begin: a %s record holds no changes", kw_kind_name(kind));
    }
    d->left = kw_get_u32(&d->cur);
    return d->cur.bad ? bad(d, "the payload is too short for its header") : KEEL_OK;
}

int kw_decode_begin(kw_decoder *d, uint32_t kind, uint64_t lsn, const void *payload, size_t len,
                    const kw_schema *schema)
{
    return decode_begin(d, kind, 0, lsn, payload, len, schema);
}

int kw_decode_record(kw_decoder *d, const kw_header *h, const void *payload, const kw_schema *schema)
{
    return decode_begin(d, h->kind, h->flags, h->lsn, payload, h->raw_len, schema);
}

/* ---- SIDE and SIDES: a record's side transactions ------------------------------------ */

static int sides_bad(const kw_side_iter *it, const char *what)
{
    return core_fail(KEEL_ECORRUPT, "sides record at LSN %llu: %s", (unsigned long long)it->h.lsn, what);
}

int kw_side_iter_begin(kw_side_iter *it, const kw_header *h, const void *payload)
{
    *it = (kw_side_iter){.h = *h, .cur = kw_cursor_make(payload, h->raw_len), .single = h->kind == KW_KIND_SIDE};
    if (it->single) {
        it->left = 1;
        return KEEL_OK;
    }
    if (h->kind != KW_KIND_SIDES)
        return core_fail(KEEL_EINVAL, "kw_side_iter_begin: LSN %llu is a %s record, not side or sides",
                         (unsigned long long)h->lsn, kw_kind_name(h->kind));
    if (h->flags)
        return sides_bad(it, "its header has flags (a transaction's are in the payload)");
    it->left = kw_get_u32(&it->cur);
    if (it->cur.bad || !it->left)
        return sides_bad(it, it->cur.bad ? "the payload is too short for its count" : "it holds no transaction");
    return KEEL_OK;
}

int kw_side_iter_next(kw_side_iter *it, kw_header *txn, const void **payload)
{
    if (!it->left)
        return kw_cursor_done(&it->cur) || it->single ? 0 : sides_bad(it, "trailing bytes after the last transaction");
    it->left--;
    *txn = it->h;
    if (it->single) {
        *payload = it->cur.p;
        return 1;
    }
    txn->kind = KW_KIND_SIDE;
    txn->flags = kw_get_u32(&it->cur);
    txn->raw_len = kw_get_u32(&it->cur);
    *payload = kw_get_bytes(&it->cur, txn->raw_len);
    if (it->cur.bad)
        return sides_bad(it, "a transaction runs past the payload");
    if (txn->flags & ~KW_FLAG_KEY)
        return sides_bad(it, "a transaction has flags other than KEY");
    txn->stored_len = txn->raw_len;
    txn->codec = KW_CODEC_RAW;
    return 1;
}

int kw_each_part(const kw_header *h, const void *payload, kw_part_fn fn, void *arg)
{
    if (h->kind != KW_KIND_SIDES)
        return fn(arg, h, payload);
    kw_side_iter it;
    kw_header txn;
    const void *p;
    int rc = kw_side_iter_begin(&it, h, payload);
    while (!rc && (rc = kw_side_iter_next(&it, &txn, &p)) == 1)
        rc = fn(arg, &txn, p);
    return rc;
}

/* ---- changes ------------------------------------------------------------------------- */

static int end(kw_decoder *d)
{
    return kw_cursor_done(&d->cur) ? 0 : bad(d, "trailing bytes after the last change");
}

/* The next group's header, its rows left in d (group_left 0: the end). */
static int open_group(kw_decoder *d)
{
    while (!d->group_left) {
        if (!d->left)
            return end(d);
        d->left--;
        d->group_comp = kw_get_u32(&d->cur);
        d->group_size = kw_get_u32(&d->cur);
        d->group_left = kw_get_u32(&d->cur);
        d->group_ents = kw_get_bytes(&d->cur, (size_t)d->group_left * 8);
        d->group_vals = kw_get_bytes(&d->cur, (size_t)d->group_left * d->group_size);
        d->group_i = 0;
        if (d->cur.bad)
            return bad(d, "a row group runs past the payload");
        int rc = check_size(d, d->group_comp, d->group_size);
        if (rc)
            return rc;
    }
    return 1;
}

static int next_row(kw_decoder *d, kw_change *out)
{
    int rc = open_group(d);
    if (rc != 1)
        return rc;
    uint32_t i = d->group_i++;
    d->group_left--;
    *out = (kw_change){.op = KW_OP_SET, .component = d->group_comp, .size = d->group_size,
                       .value = d->group_vals + (size_t)i * d->group_size};
    memcpy(&out->entity, d->group_ents + (size_t)i * 8, 8);
    return 1;
}

int kw_decode_group(kw_decoder *d, kw_group *out)
{
    if (d->kind != KW_KIND_TICK_CHUNK)
        return core_fail(KEEL_EINVAL, "kw_decode_group: LSN %llu is no tick_chunk record", (unsigned long long)d->lsn);
    int rc = open_group(d);
    if (rc != 1)
        return rc;
    uint32_t i = d->group_i;
    *out = (kw_group){.component = d->group_comp, .size = d->group_size, .n = d->group_left,
                      .entities = d->group_ents + (size_t)i * 8, .values = d->group_vals + (size_t)i * d->group_size};
    d->group_i += d->group_left;
    d->group_left = 0;
    return 1;
}

static int next_side(kw_decoder *d, kw_change *out)
{
    if (!d->left)
        return end(d);
    d->left--;
    *out = (kw_change){.op = KW_OP_SET, .entity = kw_get_u64(&d->cur), .component = kw_get_u32(&d->cur)};
    out->size = kw_get_u32(&d->cur);
    out->value = kw_get_bytes(&d->cur, out->size);
    if (d->cur.bad)
        return bad(d, "a side write runs past the payload");
    int rc = check_size(d, out->component, out->size);
    return rc ? rc : 1;
}

static int comp_value(kw_decoder *d, uint32_t *comp, uint32_t *size, const void **value)
{
    *comp = kw_get_u32(&d->cur);
    *size = kw_get_u32(&d->cur);
    *value = *size ? kw_get_bytes(&d->cur, *size) : NULL;
    if (d->cur.bad)
        return bad(d, "a command's value runs past the payload");
    return check_size(d, *comp, *size);
}

static int next_op(kw_decoder *d, kw_change *out)
{
    if (!d->left)
        return end(d);
    d->left--;
    uint8_t op = kw_get_u8(&d->cur);
    *out = (kw_change){.op = op, .entity = kw_get_u64(&d->cur)};
    int rc = KEEL_OK;
    switch (op) {
    case KW_OP_SPAWN:
        out->n = kw_get_u32(&d->cur);
        if (out->n > 255)
            return bad(d, "a spawn with more than 255 components");
        for (uint32_t i = 0; !rc && i < out->n; i++)
            rc = comp_value(d, &d->comps[i], &d->sizes[i], &d->values[i]);
        out->comps = d->comps;
        out->sizes = d->sizes;
        out->values = d->values;
        break;
    case KW_OP_ADD:
        rc = comp_value(d, &out->component, &out->size, &out->value);
        break;
    case KW_OP_REMOVE:
        out->component = kw_get_u32(&d->cur);
        rc = out->component ? KEEL_OK : bad(d, "a remove of component 0");
        break;
    case KW_OP_DESTROY:
        break;
    default:
        return bad(d, "an unknown lifecycle command");
    }
    if (!rc && d->cur.bad)
        rc = bad(d, "a lifecycle command runs past the payload");
    return rc ? rc : 1;
}

int kw_decode_next(kw_decoder *d, kw_change *out)
{
    switch (d->kind) {
    case KW_KIND_TICK_CHUNK: return next_row(d, out);
    case KW_KIND_SIDE:       return next_side(d, out);
    default:                 return next_op(d, out);
    }
}

int kw_decode_commit(const void *payload, size_t len, kw_commit_info *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    out->nrecords = kw_get_u32(&c);
    out->nlive = kw_get_u32(&c);
    out->nslots = kw_get_u32(&c);
    kw_get_u32(&c);
    return c.bad || !kw_cursor_done(&c) ? core_fail(KEEL_ECORRUPT, "a tick commit marker is not 16 bytes") : KEEL_OK;
}
