/*
 * world/entity.c -- the entity slot allocator.
 *
 * Invariants:
 *  - slots 0 .. nslots-1 are every index ever handed out; a free slot has
 *    table == WORLD_NO_TABLE and, in `row`, the generation its next
 *    occupant gets (a live slot's generation is in its entity array).
 *  - free_bits bit i is set exactly when slot i < nslots is free;
 *    free_summary bit j is set exactly when free_bits[j] != 0.
 *  - every summary word below free_hint is zero.
 * A new entity takes the lowest free index, else index nslots. Allocation is
 * thus a function of the slot states alone: a world rebuilt from stored
 * (generation, live) pairs hands out exactly the handles the original would.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

/* Make slot nslots (the next new index) exist: add a page when it starts
 * one. The page-pointer arrays grow together; pub_pages is NULL-filled. */
static int grow_slots(keel_world *w)
{
    uint32_t p = w->nslots >> WORLD_PAGE_SHIFT;
    if (p < w->npages)
        return KEEL_OK;
    if (w->npages == w->pages_cap) {
        uint32_t cap = w->pages_cap; /* both arrays take the new capacity once both grew */
        if (CORE_GROW(w->pages, cap, w->npages + 1, 16) ||
            core_resize(&w->pub_pages, w->pages_cap, cap, sizeof *w->pub_pages, true))
            return core_fail(KEEL_ENOMEM, "out of memory growing the entity index");
        w->pages_cap = cap;
    }
    world_slot *page = malloc(WORLD_PAGE_SLOTS * sizeof *page);
    if (!page)
        return core_fail(KEEL_ENOMEM, "out of memory growing the entity index by %u slots", WORLD_PAGE_SLOTS);
    w->pages[w->npages++] = page;
    return KEEL_OK;
}

/* The slow path of entity_own_slot: page p is shared with the view. */
int entity_copy_page(keel_world *w, uint32_t p)
{
    world_slot *copy = malloc(WORLD_PAGE_SLOTS * sizeof *copy);
    if (!copy)
        return core_fail(KEEL_ENOMEM, "out of memory copying a page of the entity index");
    memcpy(copy, w->pages[p], WORLD_PAGE_SLOTS * sizeof *copy);
    w->pages[p] = copy; /* the shared page stays as pub_pages[p] until the next publication */
    return KEEL_OK;
}

/* Make the bitmaps cover index nslots (the next new slot). */
static int grow_free_bits(keel_world *w)
{
    uint32_t need_words = (w->nslots >> 6) + 1;
    if (need_words <= w->free_words_cap)
        return KEEL_OK;
    uint32_t cap = w->free_words_cap; /* the summary has a bit per word: cap / 64 words */
    if (CORE_GROW_ZEROED(w->free_bits, cap, need_words, 64))
        return core_fail(KEEL_ENOMEM, "out of memory growing the free-slot bitmap");
    if (core_resize(&w->free_summary, w->free_words_cap / 64, cap / 64, sizeof *w->free_summary, true))
        return core_fail(KEEL_ENOMEM, "out of memory growing the free-slot summary");
    w->free_words_cap = cap;
    return KEEL_OK;
}

/* Lowest free index, or UINT32_MAX when no slot below nslots is free.
 * Moves free_hint up past the zero summary words it skipped. */
static uint32_t lowest_free(keel_world *w)
{
    uint32_t nsum = w->free_words_cap / 64;
    for (uint32_t j = w->free_hint; j < nsum; j++) {
        if (w->free_summary[j]) {
            w->free_hint = j;
            uint32_t word = j * 64 + (uint32_t)__builtin_ctzll(w->free_summary[j]);
            return word * 64 + (uint32_t)__builtin_ctzll(w->free_bits[word]);
        }
    }
    w->free_hint = nsum;
    return UINT32_MAX;
}

int entity_reserve(keel_world *w)
{
    if (w->nlive >= w->max_entities)
        return core_fail(KEEL_ENOSPC, "the world holds its maximum of %u live entities", w->max_entities);
    if (w->nlive < w->nslots) /* a free slot exists below nslots */
        return entity_own_slot(w, lowest_free(w));
    int rc = grow_slots(w);
    if (!rc)
        rc = grow_free_bits(w);
    return rc ? rc : entity_own_slot(w, w->nslots);
}

keel_entity entity_alloc(keel_world *w)
{
    uint32_t idx = w->nlive < w->nslots ? lowest_free(w) : UINT32_MAX;
    if (idx != UINT32_MAX) {
        uint32_t word = idx >> 6;
        w->free_bits[word] &= ~(1ull << (idx & 63));
        if (!w->free_bits[word])
            w->free_summary[word >> 6] &= ~(1ull << (word & 63));
    } else {
        idx = w->nslots++;
        *entity_slot_w(w, idx) = (world_slot){.table = WORLD_NO_TABLE, .row = 1};
    }
    w->nlive++;
    return KEEL_ENTITY_MAKE(idx, world_slot_gen(w, world_slot_at(w, idx))); /* the slot is still free */
}

void entity_free(keel_world *w, keel_entity e)
{
    uint32_t idx = KEEL_ENTITY_INDEX(e), gen = KEEL_ENTITY_GEN(e);
    world_slot *s = entity_slot_w(w, idx);
    s->table = WORLD_NO_TABLE;
    s->row = gen == UINT32_MAX ? 1 : gen + 1; /* 0 is never a generation */
    uint32_t word = idx >> 6;
    w->free_bits[word] |= 1ull << (idx & 63);
    w->free_summary[word >> 6] |= 1ull << (word & 63);
    if ((word >> 6) < w->free_hint)
        w->free_hint = word >> 6;
    w->nlive--;
}

int entity_slots_fit(const keel_world *w, uint32_t n)
{
    return n > w->max_entities ? core_fail(KEEL_ENOSPC, "the world holds its maximum of %u live entities", w->max_entities)
                               : KEEL_OK;
}

int entity_restore(keel_world *w, uint32_t n, const uint32_t *gens)
{
    int rc = entity_slots_fit(w, n);
    if (rc || !n)
        return rc;
    /* one page at a time, as n allocations add them (64-bit: n may be within a page of 2^32) */
    for (uint64_t i = 0; !rc && i < n; i += WORLD_PAGE_SLOTS) {
        w->nslots = (uint32_t)i;
        rc = grow_slots(w);
    }
    w->nslots = n - 1;
    if (rc || (rc = grow_free_bits(w))) {
        w->nslots = 0; /* the pages stay, unused: the world frees them */
        return rc;
    }
    w->nslots = n;
    for (uint32_t i = 0; i < n; i++) /* the pages are new: no view shares them */
        *entity_slot_w(w, i) = (world_slot){.table = WORLD_NO_TABLE, .row = gens[i] ? gens[i] : 1};
    uint32_t full = n >> 6;
    for (uint32_t word = 0; word <= full && word < w->free_words_cap; word++) {
        w->free_bits[word] = word < full ? ~0ull : (1ull << (n & 63)) - 1;
        if (w->free_bits[word])
            w->free_summary[word >> 6] |= 1ull << (word & 63);
    }
    w->free_hint = 0;
    return KEEL_OK;
}

void entity_index_fini(keel_world *w)
{
    for (uint32_t p = 0; p < w->npages; p++) {
        if (w->pub_pages[p] != w->pages[p])
            free(w->pub_pages[p]);
        free(w->pages[p]);
    }
    free(w->pages);
    free(w->pub_pages);
    free(w->free_bits);
    free(w->free_summary);
}

bool keel_alive(const keel_world *w, keel_entity e)
{
    return w && world_slot_of(w, e) != NULL;
}

uint32_t keel_world_count(const keel_world *w)
{
    return w ? w->nlive : 0;
}
