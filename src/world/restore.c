/*
 * world/restore.c -- rebuilding a world from a checkpoint, and replaying
 * the WAL's value rows on it (durable/recover.c).
 *
 * A checkpoint stores the entity index (every slot's generation and whether
 * it is live), the archetype tables in id order, and each table's rows in
 * row order. Restoring recreates the tables in the same order (so table ids
 * and query iteration order match the original) and appends the rows in the
 * same order (so rows, chunks and, through them, every later swap-remove
 * match too). The allocator state is a function of the slots (entity.c),
 * so the restored world hands out exactly the handles the original would.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

int world_restore_begin(keel_world *w, uint32_t nslots, const uint32_t *gens)
{
    if (w->nslots || w->ntables || w->nlive)
        return core_fail(KEEL_EBUSY, "recovery needs an empty world: recover before spawning anything");
    for (uint32_t i = 0; i < nslots; i++) {
        int rc = entity_reserve(w);
        if (rc)
            return rc;
        keel_entity e = entity_alloc(w); /* index i: the index grows by one each time */
        (void)e;
    }
    /* entity_free bumps the generation: free a handle of gen - 1 so it lands on gen */
    for (uint32_t i = 0; i < nslots; i++)
        entity_free(w, KEEL_ENTITY_MAKE(i, gens[i] == 1 ? UINT32_MAX : gens[i] - 1));
    return KEEL_OK;
}

int world_restore_table(keel_world *w, const keel_component *comps, uint32_t n, uint32_t expect_id)
{
    world_compset set = {{0}};
    for (uint32_t i = 0; i < n; i++) {
        if (!world_component_valid(w, comps[i]))
            return core_fail(KEEL_ECORRUPT, "checkpoint table %u names unknown component %u", expect_id, comps[i]);
        compset_add(&set, comps[i]);
    }
    world_table *t;
    int rc = storage_table_get(w, &set, &t);
    if (rc)
        return rc;
    if (t->id != expect_id)
        return core_fail(KEEL_ECORRUPT, "checkpoint table %u repeats the component set of table %u", expect_id, t->id);
    return KEEL_OK;
}

/* Take entity e's free slot for a row of t appended at t->count. */
static int restore_slot(keel_world *w, world_table *t, keel_entity e)
{
    uint32_t idx = KEEL_ENTITY_INDEX(e);
    const world_slot *s = idx < w->nslots ? world_slot_at(w, idx) : NULL;
    if (!s || s->table != WORLD_NO_TABLE || world_slot_gen(w, s) != KEEL_ENTITY_GEN(e))
        return core_fail(KEEL_ECORRUPT, "checkpoint row of table %u names entity 0x%016llx, which is not a free slot "
                                        "of the right generation", t->id, (unsigned long long)e);
    int rc = storage_reserve_row(w, t);
    if (rc)
        return rc;
    /* take the slot out of the free set the way entity_alloc would */
    uint32_t word = idx >> 6;
    w->free_bits[word] &= ~(1ull << (idx & 63));
    if (!w->free_bits[word])
        w->free_summary[word >> 6] &= ~(1ull << (word & 63));
    w->nlive++;
    storage_push_row(w, t, e);
    return KEEL_OK;
}

/* Rows first..first+n-1 of t, column by column, in runs that end where a
 * chunk does (the reader's chunk size need not be the writer's). */
static void restore_values(keel_world *w, world_table *t, uint32_t first, uint32_t n, const void *const *values)
{
    for (uint32_t col = 0; col < t->ncols; col++) {
        uint32_t size = t->cols[col].size;
        for (uint32_t r = 0; size && r < n;) {
            uint32_t row = first + r, run = w->chunk_rows - (row & w->chunk_mask);
            run = run < n - r ? run : n - r;
            char *dst = world_cell(w, t, col, row);
            if (values[col])
                memcpy(dst, (const char *)values[col] + (size_t)r * size, (size_t)run * size);
            else
                memset(dst, 0, (size_t)run * size);
            r += run;
        }
    }
}

int world_restore_rows(keel_world *w, uint32_t table, uint32_t n, const unsigned char *entities,
                       const void *const *values)
{
    world_table *t = w->tables[table];
    uint32_t first = t->count, done = 0;
    int rc = KEEL_OK;
    for (; done < n && !rc; done += !rc) {
        keel_entity e;
        memcpy(&e, entities + (size_t)done * 8, 8);
        rc = restore_slot(w, t, e);
    }
    restore_values(w, t, first, done, values);
    return rc;
}

/* ---- replaying value rows ------------------------------------------------------- */

/* The rows of a group come in chunk order (the capture logs a chunk column
 * at a time), so the table, the column and the chunk's private buffer are
 * looked up once per chunk rather than once per row. A logged group's rows
 * lie far apart in a world larger than the cache: each row's slot is
 * fetched SLOT_AHEAD rows ahead (measured: recovery 0.40-0.46x the read
 * ceiling without, 0.46-0.57x with; fetching the cells ahead as well, through
 * those slots, gained nothing). */
#define SLOT_AHEAD 32

static void prefetch_slot(const keel_world *w, const unsigned char *entities, uint32_t i)
{
    keel_entity e;
    memcpy(&e, entities + (size_t)i * 8, 8);
    uint32_t idx = KEEL_ENTITY_INDEX(e);
    if (idx < w->nslots)
        __builtin_prefetch(world_slot_at(w, idx));
}

int world_replay_rows(keel_world *w, keel_component c, uint32_t size, uint32_t n, const unsigned char *entities,
                      const unsigned char *values)
{
    const world_table *t = NULL;
    uint32_t table = WORLD_NO_TABLE, chunk = UINT32_MAX, col = 0;
    char *base = NULL;
    w->mutations += n != 0; /* also when a later row fails: the rows before it are written */
    for (uint32_t i = 0; i < n; i++) {
        if (i + SLOT_AHEAD < n)
            prefetch_slot(w, entities, i + SLOT_AHEAD);
        keel_entity e;
        memcpy(&e, entities + (size_t)i * 8, 8);
        const world_slot *s = world_slot_of(w, e);
        if (!s)
            return core_fail(KEEL_ESTALE, "entity 0x%016llx is null, stale or foreign", (unsigned long long)e);
        if (s->table != table) {
            t = w->tables[s->table];
            if (!(col = t->col_of[c]))
                return core_fail(KEEL_ENOENT, "entity 0x%016llx has no component '%s'", (unsigned long long)e,
                                 w->comps[c].name);
            table = s->table;
            chunk = UINT32_MAX;
        }
        if (!size)
            continue;
        if (s->row >> w->chunk_shift != chunk) {
            chunk = s->row >> w->chunk_shift;
            world_chunk *ch = t->chunks[chunk];
            int rc = version_own_column(w, t, ch, col - 1); /* a value the published view shares is copied first */
            if (rc)
                return rc;
            base = colver_cur(&ch->cols[col - 1]);
        }
        world_cell_copy(base + (size_t)(s->row & w->chunk_mask) * size, values + (size_t)i * size, size);
    }
    return KEEL_OK;
}
