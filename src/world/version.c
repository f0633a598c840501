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
 *
 * Recycling. A column rewritten every tick would otherwise get a fresh
 * allocation per chunk per tick and free the old one at the next
 * publication: malloc churn, a heap that fragments, and first-touch page
 * faults on every new buffer (docs/performance.md). Instead each column
 * version keeps at most one `spare`, and a rewritten column alternates
 * between two buffers. The protocol (publisher = the thread that steps the
 * runtime, between ticks; txn/view.c):
 *
 *   1. publication makes cur the new pub; the old pub P is what the previous
 *      view held. If no checkpoint pin is active, P becomes the column's
 *      spare *tentatively* (an unused spare from before is freed: it was
 *      unreachable already), else P is retired as before.
 *   2. the publisher stores the new view, then loads the reader count
 *      (both seq_cst; the Dekker argument of view.c). Count 0: no reader
 *      holds the old view and every later one loads the new view, which
 *      does not contain P -- the spares stand. Count > 0: a reader may be
 *      reading P through the old view; version_revoke_spares moves every
 *      spare to the retired list, freed with the old view after an RCU
 *      grace period (recycling resumes at the next publication without
 *      readers).
 *   3. the next write to the column (a system's private version, a copy
 *      for a side transaction or the sync point) takes the spare with an
 *      atomic exchange, or allocates when there is none; a task that loses
 *      the race to install its private version gives its buffer back with
 *      a CAS (or frees it).
 *
 * Hence a spare is never cur, pub or priv, no view can reach it, and no
 * checkpoint pins it (pins are taken on published buffers after the
 * publication that made the spares, and step 1 skips recycling while a pin
 * is active): writing it breaks no reader. A spare lives one tick at most
 * unless used, and the chunk frees it when it grows or goes away, so
 * recycling keeps what the old scheme had at its peak, never more.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

/* The slow path of version_reserve_retire: grow the list. */
int version_grow_retired(keel_world *w, uint32_t n)
{
    if (CORE_GROW(w->retired, w->retired_cap, w->nretired + n, 64))
        return core_fail(KEEL_ENOMEM, "out of memory growing the list of retired versions");
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
    void *copy = version_new_buffer(v, ch->capacity, size);
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
        version_free_spare(v);
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

/* ---- recycling (see the top of this file) ------------------------------------ */

void *version_new_buffer(world_colver *v, uint32_t rows, uint32_t size)
{
    void *buf = atomic_exchange_explicit(&v->spare, NULL, memory_order_acquire);
    return buf ? buf : storage_column_alloc(rows, size);
}

void version_put_spare(world_colver *v, void *buf)
{
    void *none = NULL;
    if (!atomic_compare_exchange_strong_explicit(&v->spare, &none, buf, memory_order_release, memory_order_relaxed))
        free(buf);
}

void version_free_spare(world_colver *v)
{
    free(atomic_exchange_explicit(&v->spare, NULL, memory_order_relaxed));
}

/* Take every spare of the world: onto the retired list, or freed. Returns
 * the bytes taken. */
static uint64_t spares_take(keel_world *w, bool retire)
{
    uint64_t bytes = 0;
    for (uint32_t id = 0; id < w->ntables; id++) {
        const world_table *t = w->tables[id];
        for (uint32_t k = 0; k < t->nchunks; k++)
            for (uint32_t i = 0; i < t->ncols; i++) {
                void *buf = atomic_exchange_explicit(&t->chunks[k]->cols[i].spare, NULL, memory_order_relaxed);
                if (!buf)
                    continue;
                bytes += storage_column_bytes(t->chunks[k]->capacity, t->cols[i].size);
                if (retire) /* room was reserved by the publisher */
                    w->retired[w->nretired++] = buf;
                else
                    free(buf);
            }
    }
    return bytes;
}

void version_revoke_spares(keel_world *w)
{
    spares_take(w, true);
}

uint64_t version_release_spares(keel_world *w)
{
    return spares_take(w, false);
}
