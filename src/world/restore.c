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
    return entity_restore(w, nslots, gens);
}

int world_restore_fits(const keel_world *w, uint32_t nslots)
{
    return entity_slots_fit(w, nslots);
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

/* A group is replayed in two passes: the handles resolved to their rows
 * (checking each names a live entity), then the values written. A logged
 * group's rows lie far apart in a world larger than the cache, and each
 * row waits for up to three lines from memory: its slot, then the
 * entity-array entry the slot names (the generation check), then its cell.
 * So both passes go in blocks of REPLAY_BLOCK rows, one step over the whole
 * block at a time: every slot of the block is requested, then every entry,
 * then every cell, and the misses of a block are in flight together rather
 * than one row's after another's. The rows come in chunk order (the capture
 * logs a chunk column at a time), so the table, the column and the chunk's
 * buffers are looked up once per chunk rather than once per row.
 *
 * The resolved rows stay in the memo for the next group: the capture logs
 * the columns a transaction wrote in a chunk one after another, so a system
 * that writes several components of the same entities logs the same handles
 * for each, and the next group skips the first pass. */
#define REPLAY_BLOCK 64

/* The end of the block of rows that starts at row b of n. */
static uint32_t block_end(uint32_t b, uint32_t n)
{
    return n - b < REPLAY_BLOCK ? n : b + REPLAY_BLOCK;
}

static keel_entity entity_of(const unsigned char *entities, uint32_t i)
{
    keel_entity e;
    memcpy(&e, entities + (size_t)i * 8, 8);
    return e;
}

/* The last chunk whose entity array a resolve looked at. */
typedef struct held_chunk {
    uint32_t table, chunk;
    const keel_entity *entities;
} held_chunk;

/* The entity-array entry of live slot s's row. */
static const keel_entity *held_entry(const keel_world *w, held_chunk *h, world_slot s)
{
    uint32_t chunk = s.row >> w->chunk_shift;
    if (s.table != h->table || chunk != h->chunk)
        *h = (held_chunk){s.table, chunk, w->tables[s.table]->chunks[chunk]->entities};
    return &h->entities[s.row & w->chunk_mask];
}

/* Pass 1: the rows of the n handles into m->at; m remembers the handles
 * only once every one of them resolved. */
static int replay_resolve(const keel_world *w, world_replay_memo *m, uint32_t n, const unsigned char *entities)
{
    m->entities = NULL;
    if (CORE_GROW(m->at, m->cap, n, 256))
        return core_fail(KEEL_ENOMEM, "out of memory replaying %u value rows", n);
    held_chunk h = {WORLD_NO_TABLE, UINT32_MAX, NULL};
    for (uint32_t b = 0; b < n; b += REPLAY_BLOCK) {
        uint32_t end = block_end(b, n);
        for (uint32_t i = b; i < end; i++) {
            uint32_t idx = KEEL_ENTITY_INDEX(entity_of(entities, i));
            if (idx < w->nslots)
                __builtin_prefetch(world_slot_at(w, idx));
        }
        for (uint32_t i = b; i < end; i++) {
            uint32_t idx = KEEL_ENTITY_INDEX(entity_of(entities, i));
            world_slot s = idx < w->nslots ? *world_slot_at(w, idx) : (world_slot){WORLD_NO_TABLE, 0};
            if (s.table != WORLD_NO_TABLE)
                __builtin_prefetch(held_entry(w, &h, s));
            m->at[i] = s;
        }
        for (uint32_t i = b; i < end; i++) { /* world_slot_of, the slots read */
            keel_entity e = entity_of(entities, i);
            if (m->at[i].table == WORLD_NO_TABLE || *held_entry(w, &h, m->at[i]) != e)
                return core_fail(KEEL_ESTALE, "entity 0x%016llx is null, stale or foreign", (unsigned long long)e);
        }
    }
    m->entities = entities;
    m->n = n;
    return KEEL_OK;
}

/* Pass 2: the values into the rows m resolved. */
static int replay_write(keel_world *w, const world_replay_memo *m, keel_component c, uint32_t size,
                        const unsigned char *values)
{
    const world_table *t = NULL;
    uint32_t table = WORLD_NO_TABLE, chunk = UINT32_MAX, col = 0;
    char *base = NULL, *cell[REPLAY_BLOCK];
    for (uint32_t b = 0; b < m->n; b += REPLAY_BLOCK) {
        uint32_t end = block_end(b, m->n);
        for (uint32_t i = b; i < end; i++) {
            world_slot at = m->at[i];
            if (at.table != table) {
                t = w->tables[at.table];
                if (!(col = t->col_of[c]))
                    return core_fail(KEEL_ENOENT, "entity 0x%016llx has no component '%s'",
                                     (unsigned long long)entity_of(m->entities, i), w->comps[c].name);
                table = at.table;
                chunk = UINT32_MAX;
            }
            if (!size) /* a tag: nothing to write, but every entity must have it */
                continue;
            if (at.row >> w->chunk_shift != chunk) {
                chunk = at.row >> w->chunk_shift;
                world_chunk *ch = t->chunks[chunk];
                int rc = version_own_column(w, t, ch, col - 1); /* a value the published view shares is copied first */
                if (rc)
                    return rc;
                base = colver_cur(&ch->cols[col - 1]);
            }
            cell[i - b] = base + (size_t)(at.row & w->chunk_mask) * size;
            __builtin_prefetch(cell[i - b], 1);
        }
        for (uint32_t i = b; size && i < end; i++)
            world_cell_copy(cell[i - b], values + (size_t)i * size, size);
    }
    return KEEL_OK;
}

int world_replay_rows(keel_world *w, world_replay_memo *memo, keel_component c, uint32_t size, uint32_t n,
                      const unsigned char *entities, const unsigned char *values)
{
    if (!n)
        return KEEL_OK;
    w->mutations++; /* also when a later row fails: the rows before it may be written */
    bool same = memo->entities && memo->n == n && memcmp(memo->entities, entities, (size_t)n * 8) == 0;
    int rc = same ? KEEL_OK : replay_resolve(w, memo, n, entities);
    return rc ? rc : replay_write(w, memo, c, size, values);
}

void world_replay_memo_free(world_replay_memo *memo)
{
    free(memo->at);
    *memo = (world_replay_memo){0};
}
