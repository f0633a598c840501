/*
 * world/restore.c -- rebuilding a world from a checkpoint (durable/recover.c).
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
    for (uint32_t i = 0; i < nslots; i++) {
        world_slot *s = entity_slot_w(w, i);
        /* entity_free bumps the generation: store gen - 1 so it lands on gen */
        s->gen = gens[i] == 1 ? UINT32_MAX : gens[i] - 1;
        entity_free(w, i);
    }
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

int world_restore_row(keel_world *w, uint32_t table, keel_entity e, const void *const *values)
{
    uint32_t idx = KEEL_ENTITY_INDEX(e);
    if (table >= w->ntables || idx >= w->nslots || world_slot_at(w, idx)->table != WORLD_NO_TABLE ||
        world_slot_at(w, idx)->gen != KEEL_ENTITY_GEN(e))
        return core_fail(KEEL_ECORRUPT, "checkpoint row of table %u names entity 0x%016llx, which is not a free slot "
                                        "of the right generation", table, (unsigned long long)e);
    world_table *t = w->tables[table];
    int rc = storage_reserve_row(w, t);
    if (rc)
        return rc;
    /* take the slot out of the free set the way entity_alloc would */
    uint32_t word = idx >> 6;
    w->free_bits[word] &= ~(1ull << (idx & 63));
    if (!w->free_bits[word])
        w->free_summary[word >> 6] &= ~(1ull << (word & 63));
    w->nlive++;
    uint32_t row = storage_push_row(w, t, e);
    for (uint32_t col = 0; col < t->ncols; col++) {
        uint32_t size = t->cols[col].size;
        if (!size)
            continue;
        if (values[col])
            memcpy(world_cell(w, t, col, row), values[col], size);
        else
            memset(world_cell(w, t, col, row), 0, size);
    }
    return KEEL_OK;
}
