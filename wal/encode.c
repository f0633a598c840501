/*
 * wal/encode.c -- the payload encoders of the logical records (TICK_CHUNK,
 * LIFECYCLE, TICK_COMMIT, SIDE, CHECKPOINT) and of the snap records
 * (SNAP_TABLES, SNAP_SLOTS, SNAP_CHUNK); docs/wal-format.md §4 has the
 * layouts, decode.c and snap.c read them back. Callers hand over plain
 * values: no byte of a layout is written outside wal/.
 */
#include <string.h>

#include "core/core.h"
#include "keel_wal/wal.h"

/* ---- TICK_CHUNK ------------------------------------------------------------------ */

int kw_tick_chunk_begin(kw_buf *out, size_t len_hint)
{
    out->len = 0;
    int rc = kw_buf_reserve(out, len_hint > 4 ? len_hint : 4);
    return rc ? rc : kw_put_u32(out, 0);
}

int kw_tick_chunk_group_put(kw_buf *out, uint32_t component, uint32_t size, uint32_t n, const void *entities,
                            const void *values)
{
    size_t ents = (size_t)n * 8, vals = (size_t)n * size;
    int rc = kw_buf_reserve(out, KW_GROUP_HDR + ents + vals);
    if (rc)
        return rc;
    unsigned char *p = out->p + out->len;
    kw_group_header_put(p, component, size, n);
    memcpy(p + KW_GROUP_HDR, entities, ents);
    if (vals) /* a tag's group has no values (values may be NULL) */
        memcpy(p + KW_GROUP_HDR + ents, values, vals);
    out->len += KW_GROUP_HDR + ents + vals;
    return KEEL_OK;
}

/* A payload's leading u32 count, filled in once the items are in. */
static void patch_count(kw_buf *out, uint32_t n)
{
    for (int i = 0; i < 4; i++)
        out->p[i] = (unsigned char)(n >> (8 * i));
}

void kw_tick_chunk_end(kw_buf *out, uint32_t ngroups)
{
    patch_count(out, ngroups);
}

/* ---- LIFECYCLE ------------------------------------------------------------------- */

int kw_lifecycle_begin(kw_buf *out)
{
    out->len = 0;
    return kw_put_u32(out, 0);
}

/* u32 component, u32 size, size bytes (zeros for a NULL value). */
static int put_value(kw_buf *out, const kw_value *v)
{
    int rc = kw_put_u32(out, v->component);
    rc = rc ? rc : kw_put_u32(out, v->size);
    if (rc || !v->size)
        return rc;
    if (v->value)
        return kw_put_bytes(out, v->value, v->size);
    rc = kw_buf_reserve(out, v->size);
    if (!rc) {
        memset(out->p + out->len, 0, v->size);
        out->len += v->size;
    }
    return rc;
}

int kw_lifecycle_put_op(kw_buf *out, uint32_t op, uint64_t entity, uint32_t n, const kw_value *values)
{
    int rc = kw_put_u8(out, (uint8_t)op);
    rc = rc ? rc : kw_put_u64(out, entity);
    if (rc)
        return rc;
    switch (op) {
    case KW_OP_SPAWN:
        rc = kw_put_u32(out, n);
        for (uint32_t i = 0; !rc && i < n; i++)
            rc = put_value(out, &values[i]);
        return rc;
    case KW_OP_ADD:
        return put_value(out, &values[0]);
    case KW_OP_REMOVE:
        return kw_put_u32(out, values[0].component);
    default:
        return KEEL_OK;
    }
}

void kw_lifecycle_end(kw_buf *out, uint32_t nops)
{
    patch_count(out, nops);
}

/* ---- EPOCH ------------------------------------------------------------------------- */

int kw_epoch_encode(kw_buf *out, uint64_t epoch, const char *node)
{
    size_t n = node ? strlen(node) : 0;
    if (n > KW_EPOCH_NODE_MAX)
        n = KW_EPOCH_NODE_MAX;
    out->len = 0;
    int rc = kw_put_u64(out, epoch);
    if (!rc)
        rc = kw_put_u32(out, (uint32_t)n);
    return rc ? rc : kw_put_bytes(out, node, n);
}

/* ---- TICK_COMMIT, CHECKPOINT ------------------------------------------------------- */

void kw_commit_encode(const kw_commit_info *ci, unsigned char out[KW_COMMIT_SIZE])
{
    kw_buf b = {out, 0, KW_COMMIT_SIZE};
    kw_put_u32(&b, ci->nrecords);
    kw_put_u32(&b, ci->nlive);
    kw_put_u32(&b, ci->nslots);
    kw_put_u32(&b, 0);
}

void kw_checkpoint_marker_encode(uint64_t covered_lsn, uint64_t tick, unsigned char out[KW_CHECKPOINT_MARKER_SIZE])
{
    kw_buf b = {out, 0, KW_CHECKPOINT_MARKER_SIZE};
    kw_put_u64(&b, covered_lsn);
    kw_put_u64(&b, tick);
}

int kw_epoch_decode(const void *payload, size_t len, kw_epoch *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    out->epoch = kw_get_u64(&c);
    uint32_t n = kw_get_u32(&c);
    const void *node = n <= KW_EPOCH_NODE_MAX ? kw_get_bytes(&c, n) : NULL;
    if (c.bad || !node || !kw_cursor_done(&c) || !out->epoch || memchr(node, 0, n))
        return core_fail(KEEL_ECORRUPT, "an epoch record is malformed (%zu bytes)", len);
    memcpy(out->node, node, n);
    out->node[n] = 0;
    return KEEL_OK;
}

int kw_checkpoint_marker_decode(const void *payload, size_t len, uint64_t *covered_lsn, uint64_t *tick)
{
    kw_cursor c = kw_cursor_make(payload, len);
    *covered_lsn = kw_get_u64(&c);
    *tick = kw_get_u64(&c);
    return c.bad || !kw_cursor_done(&c) ? core_fail(KEEL_ECORRUPT, "a checkpoint marker is not 16 bytes") : KEEL_OK;
}

/* ---- SIDE ------------------------------------------------------------------------- */

int kw_side_begin(kw_buf *out, uint64_t seq, uint32_t mode, uint32_t nwrites)
{
    out->len = 0;
    int rc = kw_put_u64(out, seq);
    rc = rc ? rc : kw_put_u32(out, mode);
    return rc ? rc : kw_put_u32(out, nwrites);
}

int kw_side_put_write(kw_buf *out, uint64_t entity, uint32_t component, uint32_t size, const void *value)
{
    int rc = kw_put_u64(out, entity);
    rc = rc ? rc : kw_put_u32(out, component);
    rc = rc ? rc : kw_put_u32(out, size);
    return rc ? rc : kw_put_bytes(out, value, size);
}

int kw_side_end(kw_buf *out, uint64_t key, uint32_t *flags)
{
    /* the key goes last: a reader that ignores the flag finds trailing
     * bytes and refuses the record instead of misreading its writes */
    if (!key)
        return KEEL_OK;
    *flags |= KW_FLAG_KEY;
    return kw_put_u64(out, key);
}

int kw_sides_begin(kw_buf *out)
{
    out->len = 0;
    return kw_put_u32(out, 0); /* the count, set by kw_sides_end */
}

int kw_sides_put(kw_buf *out, uint32_t flags, const void *side, size_t len)
{
    if (len > UINT32_MAX)
        return core_fail(KEEL_EINVAL, "kw_sides_put: a side transaction of %zu bytes", len);
    int rc = kw_put_u32(out, flags);
    rc = rc ? rc : kw_put_u32(out, (uint32_t)len);
    return rc ? rc : kw_put_bytes(out, side, len);
}

void kw_sides_end(kw_buf *out, uint32_t count)
{
    unsigned char *p = out->p;
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(count >> (8 * i));
}

/* ---- snap ------------------------------------------------------------------------- */

int kw_snap_tables_put_header(kw_buf *out, uint32_t ntables, uint32_t nslots, uint32_t nlive)
{
    int rc = kw_put_u32(out, ntables);
    rc = rc ? rc : kw_put_u32(out, nslots);
    return rc ? rc : kw_put_u32(out, nlive);
}

int kw_snap_tables_put_table(kw_buf *out, uint32_t rows, uint32_t ncols, const uint32_t *comps)
{
    int rc = kw_put_u32(out, rows);
    rc = rc ? rc : kw_put_u32(out, ncols);
    for (uint32_t i = 0; !rc && i < ncols; i++)
        rc = kw_put_u32(out, comps[i]);
    return rc;
}

int kw_snap_slots_encode(kw_buf *out, uint32_t first, uint32_t n, const uint32_t *gens, const uint8_t *live)
{
    out->len = 0;
    int rc = kw_buf_reserve(out, 8 + (size_t)n * 5); /* then no put below grows: a page is 1024 slots */
    rc = rc ? rc : kw_put_u32(out, first);
    rc = rc ? rc : kw_put_u32(out, n);
    rc = rc ? rc : kw_put_bytes(out, gens, (size_t)n * 4); /* little-endian host (record.c) */
    if (rc)
        return rc;
    unsigned char *flags = out->p + out->len;
    for (uint32_t i = 0; i < n; i++)
        flags[i] = live[i] != 0;
    out->len += n;
    return KEEL_OK;
}

int kw_snap_chunk_encode(kw_buf *out, uint32_t table, uint32_t chunk, uint32_t count, uint32_t ncols,
                         const uint32_t *comps, const uint32_t *sizes, const void *entities,
                         const void *const *values)
{
    out->len = 0;
    int rc = kw_put_u32(out, table);
    rc = rc ? rc : kw_put_u32(out, chunk);
    rc = rc ? rc : kw_put_u32(out, count);
    rc = rc ? rc : kw_put_u32(out, ncols);
    for (uint32_t i = 0; !rc && i < ncols; i++) {
        rc = kw_put_u32(out, comps[i]);
        rc = rc ? rc : kw_put_u32(out, sizes[i]);
    }
    rc = rc ? rc : kw_put_bytes(out, entities, (size_t)count * 8);
    for (uint32_t i = 0; !rc && i < ncols; i++)
        rc = kw_put_bytes(out, values[i], (size_t)count * sizes[i]);
    return rc;
}

int kw_snap_keys_encode(kw_buf *out, uint32_t n, const uint64_t *keys, const uint64_t *ticks)
{
    out->len = 0;
    int rc = kw_buf_reserve(out, 4 + (size_t)n * 16);
    rc = rc ? rc : kw_put_u32(out, n);
    for (uint32_t i = 0; !rc && i < n; i++) {
        rc = kw_put_u64(out, keys[i]);
        rc = rc ? rc : kw_put_u64(out, ticks[i]);
    }
    return rc;
}
