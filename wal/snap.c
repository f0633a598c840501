/*
 * wal/snap.c -- decoding the checkpoint's snap records (SNAP_TABLES,
 * SNAP_SLOTS, SNAP_CHUNK, SNAP_KEYS; docs/wal-format.md §4).
 *
 * One decoder for every reader of a checkpoint: recovery (durable/recover.c)
 * loads the runtime's world through it, keel-wal replay its offline state.
 * The decoders check lengths exactly (a payload with bytes left over is
 * corrupt) and never read past the payload; what a value means for a world
 * (a column the table lacks, a row of a live slot) is the caller's check.
 */
#include <string.h>

#include "core/core.h"
#include "keel_wal/wal.h"

int kw_snap_payload(kw_codec_ctx *c, const void *rec, size_t len, uint32_t kind, const void **payload,
                    size_t *plen)
{
    kw_header h;
    int rc = kw_record_check(rec, len, &h);
    if (rc)
        return rc;
    if (h.kind != kind)
        return core_fail(KEEL_ECORRUPT, "snap record is a %s, expected %s", kw_kind_name(h.kind), kw_kind_name(kind));
    if ((rc = kw_record_payload(c, rec, &h, payload)))
        return rc;
    *plen = h.raw_len;
    return KEEL_OK;
}

/* ---- SNAP_TABLES ---------------------------------------------------------------------- */

int kw_snap_tables_begin(kw_snap_tables *t, const void *payload, size_t len)
{
    memset(t, 0, sizeof *t);
    t->cur = kw_cursor_make(payload, len);
    t->ntables = kw_get_u32(&t->cur);
    t->nslots = kw_get_u32(&t->cur);
    t->nlive = kw_get_u32(&t->cur);
    if (t->cur.bad)
        return core_fail(KEEL_ECORRUPT, "checkpoint table list is shorter than its header (%zu bytes)", len);
    /* each table takes 8 bytes at least: bound ntables before anyone allocates by it */
    if (t->ntables > (size_t)(t->cur.end - t->cur.p) / 8)
        return core_fail(KEEL_ECORRUPT, "checkpoint table list claims %u tables in %zu bytes", t->ntables, len);
    return KEEL_OK;
}

int kw_snap_tables_next(kw_snap_tables *t, kw_snap_table *out)
{
    if (t->next == t->ntables)
        return kw_cursor_done(&t->cur)
                   ? 0
                   : core_fail(KEEL_ECORRUPT, "checkpoint table list has bytes after its %u tables", t->ntables);
    out->rows = kw_get_u32(&t->cur);
    out->ncols = kw_get_u32(&t->cur);
    if (t->cur.bad || out->ncols > KW_SNAP_MAX_COLS)
        return core_fail(KEEL_ECORRUPT, "checkpoint table list is malformed at table %u", t->next);
    for (uint32_t i = 0; i < out->ncols; i++)
        out->comps[i] = kw_get_u32(&t->cur);
    if (t->cur.bad)
        return core_fail(KEEL_ECORRUPT, "checkpoint table list is short at table %u", t->next);
    t->next++;
    return 1;
}

/* ---- SNAP_SLOTS ----------------------------------------------------------------------- */

int kw_snap_slots_decode(const void *payload, size_t len, kw_snap_slots *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    out->first = kw_get_u32(&c);
    out->n = kw_get_u32(&c);
    if (c.bad || out->n > KW_SNAP_PAGE_SLOTS || (out->first & (KW_SNAP_PAGE_SLOTS - 1)))
        return core_fail(KEEL_ECORRUPT, "checkpoint slot page has a bad header (first %u, %u slots)", out->first,
                         out->n);
    out->gens = kw_get_bytes(&c, (size_t)out->n * 4);
    out->live = kw_get_bytes(&c, out->n);
    if (c.bad || !kw_cursor_done(&c))
        return core_fail(KEEL_ECORRUPT, "checkpoint slot page at %u has the wrong length (%zu bytes for %u slots)",
                         out->first, len, out->n);
    return KEEL_OK;
}

uint32_t kw_snap_slot_gen(const kw_snap_slots *s, uint32_t i)
{
    const unsigned char *p = s->gens + (size_t)i * 4;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- SNAP_CHUNK ----------------------------------------------------------------------- */

int kw_snap_chunk_decode(const void *payload, size_t len, kw_snap_chunk *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    out->table = kw_get_u32(&c);
    out->chunk = kw_get_u32(&c);
    out->count = kw_get_u32(&c);
    out->ncols = kw_get_u32(&c);
    if (c.bad || out->ncols > KW_SNAP_MAX_COLS)
        return core_fail(KEEL_ECORRUPT, "checkpoint chunk %u of table %u has a bad header", out->chunk, out->table);
    for (uint32_t i = 0; i < out->ncols; i++) {
        out->comps[i] = kw_get_u32(&c);
        out->sizes[i] = kw_get_u32(&c);
    }
    out->ents = kw_get_bytes(&c, (size_t)out->count * 8);
    for (uint32_t i = 0; i < out->ncols; i++)
        out->vals[i] = kw_get_bytes(&c, (size_t)out->count * out->sizes[i]);
    if (c.bad || !kw_cursor_done(&c))
        return core_fail(KEEL_ECORRUPT, "checkpoint chunk %u of table %u has the wrong length", out->chunk,
                         out->table);
    return KEEL_OK;
}

uint64_t kw_snap_chunk_entity(const kw_snap_chunk *c, uint32_t row)
{
    const unsigned char *p = c->ents + (size_t)row * 8;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ---- SNAP_KEYS ------------------------------------------------------------------------ */

static uint64_t le64_at(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int kw_snap_keys_decode(const void *payload, size_t len, kw_snap_keys *out)
{
    kw_cursor c = kw_cursor_make(payload, len);
    out->n = kw_get_u32(&c);
    out->p = kw_get_bytes(&c, (size_t)out->n * 16);
    if (c.bad || !kw_cursor_done(&c))
        return core_fail(KEEL_ECORRUPT, "checkpoint key set has the wrong length (%zu bytes for %u keys)", len, out->n);
    for (uint32_t i = 0; i < out->n; i++)
        if (!le64_at(out->p + (size_t)i * 16))
            return core_fail(KEEL_ECORRUPT, "checkpoint key set: key %u is 0", i);
    return KEEL_OK;
}

void kw_snap_keys_get(const kw_snap_keys *k, uint32_t i, uint64_t *key, uint64_t *tick)
{
    *key = le64_at(k->p + (size_t)i * 16);
    *tick = le64_at(k->p + (size_t)i * 16 + 8);
}
