/*
 * world/state_hash.c -- keel_world_hash, the canonical hash of the durable
 * state (what it covers is specified in keel/world.h).
 *
 * Canonical order is slot index order, not storage order, so the hash does
 * not depend on which archetype, chunk or row holds an entity. A table's
 * columns are in component id order, so walking them visits an entity's
 * components in id order.
 */
#include "world/world_internal.h"

#define STATE_HASH_SEED 0x6b65656c2d737431ull /* "keel-st1" */

uint64_t keel_world_hash(const keel_world *w)
{
    core_hasher h;
    core_hasher_init(&h, STATE_HASH_SEED);
    if (!w)
        return core_hasher_final(&h);
    core_hasher_u64(&h, w->nslots);
    for (uint32_t i = 0; i < w->nslots; i++) {
        const world_slot *s = world_slot_at(w, i);
        bool live = s->table != WORLD_NO_TABLE;
        core_hasher_u64(&h, (uint64_t)s->gen << 1 | live);
        if (!live)
            continue;
        const world_table *t = w->tables[s->table];
        for (uint32_t col = 0; col < t->ncols; col++) {
            keel_component c = t->cols[col].c;
            if (w->comps[c].desc.discipline == KEEL_TRANSIENT)
                continue;
            core_hasher_u64(&h, c);
            if (t->cols[col].size)
                core_hasher_bytes(&h, world_cell(w, t, col, s->row), t->cols[col].size);
        }
        core_hasher_u64(&h, 0); /* end of entity: (c, bytes) sequences cannot run into the next slot */
    }
    return core_hasher_final(&h);
}
