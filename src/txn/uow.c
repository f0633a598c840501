/*
 * txn/uow.c -- the unit of work: one tick's change set.
 *
 * The fence (the durability layer) serialises what this collects:
 *   value rows  -- after the user tracks, before the sync point: for each
 *                  chunk column a committed system transaction changed
 *                  first (hook, then systems in execution order, so the
 *                  order does not depend on the worker count), the rows
 *                  whose bytes differ from the tick-start version
 *                  (VERSIONED), or every row (SINGLE_VERSION: no older
 *                  version to compare with). Values cannot change at the
 *                  sync point, so these are the tick's final values of
 *                  every entity that survives it.
 *   lifecycle   -- the commands the sync point applied, in order
 *                  (world_lifecycle_log, recorded by command playback).
 *   side records -- each side transaction's after-images, in commit order.
 * Value rows are stored as groups, one per captured chunk column, already
 * in the TICK_CHUNK payload's group layout (docs/wal-format.md: u32
 * component, u32 size, u32 n, n entity handles, n values), so the fence
 * serialises a segment with a few bulk copies instead of a walk per row.
 * Side records are {seq u64, tick u64, mode u32, nwrites u32} followed by
 * nwrites row records {entity u64, component u32, size u32, value padded
 * to 8}.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/runtime_internal.h"

typedef struct row_hdr {
    keel_entity entity;
    keel_component component;
    uint32_t size;
} row_hdr;

typedef struct side_hdr {
    uint64_t seq;
    uint64_t tick;
    uint32_t mode;
    uint32_t nwrites;
} side_hdr;

#define PAD8(x) (((size_t)(x) + 7u) & ~(size_t)7u)

static int buf_reserve(unsigned char **buf, size_t *cap, size_t len, size_t n)
{
    if (len + n <= *cap)
        return KEEL_OK;
    size_t c = *cap ? *cap * 2 : 65536;
    while (c < len + n)
        c *= 2;
    unsigned char *p = realloc(*buf, c);
    if (!p)
        return core_fail(KEEL_ENOMEM, "out of memory growing the unit of work");
    *buf = p;
    *cap = c;
    return KEEL_OK;
}

static void put_row(unsigned char *dst, keel_entity e, keel_component c, uint32_t size, const void *value)
{
    row_hdr h = {e, c, size};
    memcpy(dst, &h, sizeof h);
    memcpy(dst + sizeof h, value, size);
    memset(dst + sizeof h + size, 0, PAD8(size) - size);
}

/* ---- value rows ------------------------------------------------------------------- */

/* Row comparison inlined for the common value sizes: a memcmp call per
 * 12-byte row costs more than the comparison itself. */
static inline bool row_equal(const unsigned char *a, const unsigned char *b, uint32_t size)
{
    uint64_t x, y;
    uint32_t p, q;
    switch (size) {
    case 4:
        memcpy(&p, a, 4), memcpy(&q, b, 4);
        return p == q;
    case 8:
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        return x == y;
    case 12:
        memcpy(&x, a, 8), memcpy(&y, b, 8), memcpy(&p, a + 8, 4), memcpy(&q, b + 8, 4);
        return x == y && p == q;
    case 16: {
        uint64_t x2, y2;
        memcpy(&x, a, 8), memcpy(&y, b, 8), memcpy(&x2, a + 8, 8), memcpy(&y2, b + 8, 8);
        return x == y && x2 == y2;
    }
    default:
        return !memcmp(a, b, size);
    }
}

/* Pass 1 of a chunk column's capture: the indices of the rows to log
 * (VERSIONED: those whose bytes differ from the tick-start version). */
static uint32_t changed_rows(const unsigned char *old, const unsigned char *now, uint32_t size, uint32_t count,
                             uint32_t *idx)
{
    uint32_t n = 0;
    if (!old) {
        for (uint32_t r = 0; r < count; r++)
            idx[r] = r;
        return count;
    }
    switch (size) { /* the common sizes get a loop the compiler unrolls */
    case 12:
        for (uint32_t r = 0; r < count; r++) {
            idx[n] = r;
            n += !row_equal(old + (size_t)r * 12, now + (size_t)r * 12, 12);
        }
        return n;
    case 8:
        for (uint32_t r = 0; r < count; r++) {
            idx[n] = r;
            n += !row_equal(old + (size_t)r * 8, now + (size_t)r * 8, 8);
        }
        return n;
    case 4:
        for (uint32_t r = 0; r < count; r++) {
            idx[n] = r;
            n += !row_equal(old + (size_t)r * 4, now + (size_t)r * 4, 4);
        }
        return n;
    default:
        for (uint32_t r = 0; r < count; r++) {
            idx[n] = r;
            n += !row_equal(old + (size_t)r * size, now + (size_t)r * size, size);
        }
        return n;
    }
}

static void put_u32le(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4); /* the WAL is little-endian, and so is the host (keel_wal/record.c) */
}

/* One chunk column: its changed rows become one group in the TICK_CHUNK
 * layout (docs/wal-format.md): u32 component, u32 size, u32 n, n entities,
 * n values. The fence then copies whole runs of groups into payloads. */
static int capture_chunk(txn_uow *u, const keel_world *w, txn_touch tc)
{
    const world_table *t = w->tables[tc.table];
    const world_chunk *ch = t->chunks[tc.chunk];
    const world_colver *v = &ch->cols[tc.col];
    uint32_t size = t->cols[tc.col].size;
    keel_component c = t->cols[tc.col].c;
    const unsigned char *now = colver_cur(v);
    const unsigned char *old = w->comps[c].desc.discipline == KEEL_VERSIONED ? v->pub : NULL;
    if (ch->count > u->idx_cap) {
        uint32_t *p = realloc(u->idx, (size_t)ch->count * sizeof *p);
        if (!p)
            return core_fail(KEEL_ENOMEM, "out of memory capturing the unit of work");
        u->idx = p;
        u->idx_cap = ch->count;
    }
    uint32_t n = changed_rows(old, now, size, ch->count, u->idx);
    if (!n)
        return KEEL_OK;
    if (buf_reserve(&u->rows, &u->rows_cap, u->rows_len, UOW_GROUP_HDR + (size_t)n * (8 + size)))
        return KEEL_ENOMEM;
    unsigned char *g = u->rows + u->rows_len;
    put_u32le(g, c);
    put_u32le(g + 4, size);
    put_u32le(g + 8, n);
    unsigned char *ents = g + UOW_GROUP_HDR, *vals = ents + (size_t)n * 8;
    const uint32_t *idx = u->idx;
    for (uint32_t i = 0; i < n; i++)
        memcpy(ents + (size_t)i * 8, &ch->entities[idx[i]], 8);
    if (size == 12)
        for (uint32_t i = 0; i < n; i++)
            memcpy(vals + (size_t)i * 12, now + (size_t)idx[i] * 12, 12);
    else
        for (uint32_t i = 0; i < n; i++)
            memcpy(vals + (size_t)i * size, now + (size_t)idx[i] * size, size);
    u->rows_len += UOW_GROUP_HDR + (size_t)n * (8 + size);
    u->nrows += n;
    return KEEL_OK;
}

static void capture_list(txn_uow *u, const keel_world *w, const txn_vec *changes)
{
    for (uint32_t i = 0; i < changes->n && !u->oom; i++) {
        const world_table *t = w->tables[changes->v[i].table];
        if (w->comps[t->cols[changes->v[i].col].c].desc.discipline == KEEL_TRANSIENT)
            continue;
        if (capture_chunk(u, w, changes->v[i]))
            u->oom = true;
    }
}

void uow_capture_changes(keel_runtime *rt, const txn_vec *changes)
{
    if (rt->uow.capture)
        capture_list(&rt->uow, rt->world, changes);
}

void uow_capture(keel_runtime *rt)
{
    txn_uow *u = &rt->uow;
    if (!u->capture)
        return;
    const keel_schedule *sc = rt->sched;
    for (uint32_t p = 0; p < sc->nsys; p++)
        capture_list(u, rt->world, &rt->st[sc->order[p]].changes);
    if (u->oom)
        core_log(KEEL_LOG_ERROR, "txn", "uow_capture_oom", "tick=%llu",
                 (unsigned long long)atomic_load_explicit(&rt->running_tick, memory_order_relaxed));
}

void uow_reset(txn_uow *u)
{
    u->rows_len = 0;
    u->hook_rows_end = 0;
    u->nrows = 0;
    u->lifecycle.len = 0;
    u->lifecycle.count = 0;
    u->side_len = 0;
    u->nside = 0;
    u->oom = false;
}

void uow_fini(txn_uow *u)
{
    free(u->rows);
    free(u->idx);
    free(u->lifecycle.buf);
    free(u->side);
    *u = (txn_uow){0};
}

bool uow_next_row(const txn_uow *u, size_t *off, uow_row *out)
{
    size_t g = *off & UOW_OFF_MASK, i = *off >> UOW_ROW_SHIFT;
    if (g >= u->rows_len)
        return false;
    uow_group h = uow_group_at(u, g);
    *out = (uow_row){0, h.component, h.size, h.values + i * h.size};
    memcpy(&out->entity, h.entities + i * 8, 8);
    *off = i + 1 < h.n ? g | (i + 1) << UOW_ROW_SHIFT : h.end;
    return true;
}

/* ---- side records ------------------------------------------------------------------ */

int uow_side_reserve(txn_uow *u, uint32_t nwrites, uint32_t value_bytes)
{
    size_t n = sizeof(side_hdr) + (size_t)nwrites * sizeof(row_hdr) + PAD8(value_bytes);
    return buf_reserve(&u->side, &u->side_cap, u->side_len, n);
}

void uow_side_begin(txn_uow *u, uint64_t seq, uint64_t tick, keel_durability mode, uint32_t nwrites)
{
    side_hdr h = {seq, tick, (uint32_t)mode, nwrites};
    memcpy(u->side + u->side_len, &h, sizeof h);
    u->side_len += sizeof h;
    u->nside++;
}

void uow_side_write(txn_uow *u, keel_entity e, keel_component c, uint32_t size, const void *value)
{
    put_row(u->side + u->side_len, e, c, size, value);
    u->side_len += sizeof(row_hdr) + PAD8(size);
}

bool uow_next_side(const txn_uow *u, size_t *off, uow_side *out, size_t *writes_off)
{
    if (*off >= u->side_len)
        return false;
    side_hdr h;
    memcpy(&h, u->side + *off, sizeof h);
    *out = (uow_side){h.seq, h.tick, (keel_durability)h.mode, h.nwrites};
    *off += sizeof h;
    *writes_off = *off;
    for (uint32_t i = 0; i < h.nwrites; i++) {
        row_hdr r;
        memcpy(&r, u->side + *off, sizeof r);
        *off += sizeof r + PAD8(r.size);
    }
    return true;
}

bool uow_next_side_row(const txn_uow *u, size_t *off, uow_row *out)
{
    if (*off >= u->side_len)
        return false;
    row_hdr h;
    memcpy(&h, u->side + *off, sizeof h);
    *out = (uow_row){h.entity, h.component, h.size, u->side + *off + sizeof h};
    *off += sizeof h + PAD8(h.size);
    return true;
}
