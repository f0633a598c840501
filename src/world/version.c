/*
 * world/version.c -- copy-on-write of the buffers a published view shares.
 *
 * The runtime publishes a read view at the end of every tick (txn/view.c):
 * from then on the view shares the live world's VERSIONED column buffers,
 * entity arrays and slot pages (pub == cur). Whoever writes the live world
 * afterwards -- a system transaction, a side transaction, the sync point,
 * keel_set between ticks -- first makes the buffer it writes private here.
 * The rule that keeps views and snapshot readers safe without locks:
 *
 *   a buffer the published view holds is never written; it is replaced.
 *
 * The one exception is appending past the view's row count (pub_count): the
 * view never reads those rows, so a spawn into the last chunk copies
 * nothing. A replaced buffer stays reachable from the chunk's pub field
 * until the next publication, which hands it to the old view's garbage list
 * (freed after an RCU grace period). A buffer the view never held is freed
 * at once. A world that never published (no runtime) never copies.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

/* The slow path of version_reserve_retire: grow the list. */
int version_grow_retired(keel_world *w, uint32_t n)
{
    uint32_t cap = w->retired_cap ? w->retired_cap * 2 : 64;
    while (cap < w->nretired + n)
        cap *= 2;
    void **r = realloc(w->retired, (size_t)cap * sizeof *r);
    if (!r)
        return core_fail(KEEL_ENOMEM, "out of memory growing the list of retired versions");
    w->retired = r;
    w->retired_cap = cap;
    return KEEL_OK;
}

void version_drop(keel_world *w, void *buf, const void *pub)
{
    if (!buf)
        return;
    if (buf != pub) {
        free(buf);
        return;
    }
    /* room was reserved by the caller's reserve step */
    w->retired[w->nretired++] = buf;
}

int version_own_column(keel_world *w, const world_table *t, world_chunk *ch, uint32_t col)
{
    world_colver *v = &ch->cols[col];
    if (!v->pub || colver_cur(v) != v->pub)
        return KEEL_OK;
    uint32_t size = t->cols[col].size;
    void *copy = storage_column_alloc(ch->capacity, size);
    if (!copy)
        return core_fail(KEEL_ENOMEM, "out of memory copying a chunk of component '%s' (%u rows)",
                         w->comps[t->cols[col].c].name, ch->capacity);
    memcpy(copy, v->pub, (size_t)ch->count * size);
    colver_set_cur(v, copy);
    return KEEL_OK;
}

int version_own_chunk(keel_world *w, const world_table *t, world_chunk *ch)
{
    if (ch->pub_entities && ch->entities == ch->pub_entities) {
        keel_entity *copy = malloc((size_t)ch->capacity * sizeof *copy);
        if (!copy)
            return core_fail(KEEL_ENOMEM, "out of memory copying a chunk's entity array (%u rows)", ch->capacity);
        memcpy(copy, ch->entities, (size_t)ch->count * sizeof *copy);
        ch->entities = copy;
    }
    if (!t->versioned)
        return KEEL_OK;
    for (uint32_t i = 0; i < t->ncols; i++) {
        int rc = version_own_column(w, t, ch, i);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

void version_free_chunk(keel_world *w, const world_table *t, world_chunk *ch)
{
    for (uint32_t i = 0; i < t->ncols; i++) {
        world_colver *v = &ch->cols[i];
        if (colver_cur(v) != v->pub)
            free(colver_cur(v));
        version_drop(w, v->pub, v->pub);
        free(atomic_load_explicit(&v->priv, memory_order_relaxed)); /* NULL outside a transaction */
    }
    if (ch->entities != ch->pub_entities)
        free(ch->entities);
    version_drop(w, ch->pub_entities, ch->pub_entities);
    free(ch);
}
