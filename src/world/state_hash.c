/*
 * world/state_hash.c -- keel_world_hash, the canonical hash of the durable
 * state (what it covers is specified in keel/world.h).
 *
 * Canonical order is slot index order, not storage order, so the hash does
 * not depend on which archetype, chunk or row holds an entity. A table's
 * columns are in component id order, so walking them visits an entity's
 * components in id order. The feed itself (seed, words, terminators) is
 * core/hash.c's, shared with keel-wal replay, which rebuilds the same hash
 * offline from a data directory.
 */
#include "world/world_internal.h"

uint64_t keel_world_hash(const keel_world *w)
{
    if (!w)
        return core_state_hash_none();
    core_hasher h;
    core_state_hash_begin(&h, w->nslots);
    for (uint32_t i = 0; i < w->nslots; i++) {
        const world_slot *s = world_slot_at(w, i);
        bool live = s->table != WORLD_NO_TABLE;
        core_state_hash_slot(&h, world_slot_gen(w, s), live);
        if (!live)
            continue;
        const world_table *t = w->tables[s->table];
        for (uint32_t col = 0; col < t->ncols; col++) {
            keel_component c = t->cols[col].c;
            if (w->comps[c].desc.discipline == KEEL_TRANSIENT)
                continue;
            uint32_t size = t->cols[col].size;
            core_state_hash_component(&h, c, size ? world_cell(w, t, col, s->row) : NULL, size);
        }
        core_state_hash_entity_end(&h);
    }
    return core_hasher_final(&h);
}
