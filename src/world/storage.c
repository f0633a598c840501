/*
 * world/storage.c -- archetype tables and their chunks.
 *
 * Tables are found by component set through an open-addressed hash map and
 * are never freed before the world: a table id stays valid for the world's
 * life, which lets slots and queries refer to tables by id.
 *
 * Rows are dense. Appending takes row `count`; removing row r moves the last
 * row into r (swap-remove) and fixes the moved entity's slot. Chunks are
 * allocated as the table grows; when the table shrinks, at most one empty
 * chunk is kept at the end so a table oscillating around a chunk boundary
 * does not allocate on every spawn.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

#define MAP_EMPTY UINT32_MAX

static uint64_t compset_hash(const world_compset *s)
{
    return core_mix64(s->w[0] ^ core_mix64(s->w[1] ^ core_mix64(s->w[2] ^ core_mix64(s->w[3]))));
}

static uint32_t *map_find(const keel_world *w, const world_compset *set)
{
    uint32_t mask = w->table_map_cap - 1;
    for (uint32_t i = (uint32_t)compset_hash(set) & mask;; i = (i + 1) & mask) {
        uint32_t id = w->table_map[i];
        if (id == MAP_EMPTY || compset_eq(&w->tables[id]->set, set))
            return &w->table_map[i];
    }
}

/* Keep the map at most half full so probes stay short. */
static int map_reserve(keel_world *w)
{
    if ((w->ntables + 1) * 2 <= w->table_map_cap)
        return KEEL_OK;
    uint32_t cap = w->table_map_cap ? w->table_map_cap * 2 : 64;
    uint32_t *map = malloc((size_t)cap * sizeof *map);
    if (!map)
        return core_fail(KEEL_ENOMEM, "out of memory growing the archetype map");
    memset(map, 0xff, (size_t)cap * sizeof *map);
    uint32_t *old = w->table_map;
    w->table_map = map;
    w->table_map_cap = cap;
    for (uint32_t id = 0; id < w->ntables; id++)
        *map_find(w, &w->tables[id]->set) = id;
    free(old);
    return KEEL_OK;
}

static world_table *table_new(keel_world *w, const world_compset *set)
{
    world_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->set = *set;
    for (keel_component c = 1; c <= w->ncomps; c++)
        if (compset_has(set, c))
            t->ncols++;
    t->cols = calloc(t->ncols ? t->ncols : 1, sizeof *t->cols);
    if (!t->cols) {
        free(t);
        return NULL;
    }
    uint32_t col = 0;
    for (keel_component c = 1; c <= w->ncomps; c++) {
        if (!compset_has(set, c))
            continue;
        t->cols[col] = (world_column){c, w->comps[c].desc.size, w->comps[c].desc.align};
        t->col_of[c] = (uint8_t)(++col);
        t->versioned |= world_col_versioned(w, t, col - 1);
    }
    return t;
}

static void table_free(world_table *t);

/* Consecutive commands mostly name the same set (a batch of spawns of one
 * kind), so the last table found is compared first: four words instead of
 * the hash's chain of multiplies. */
int storage_table_get(keel_world *w, const world_compset *set, world_table **out)
{
    if (w->table_last < w->ntables && compset_eq(&w->tables[w->table_last]->set, set)) {
        *out = w->tables[w->table_last];
        return KEEL_OK;
    }
    if (w->table_map_cap) {
        uint32_t id = *map_find(w, set);
        if (id != MAP_EMPTY) {
            w->table_last = id;
            *out = w->tables[id];
            return KEEL_OK;
        }
    }
    int rc = map_reserve(w);
    if (rc)
        return rc;
    if (CORE_GROW(w->tables, w->tables_cap, w->ntables + 1, 16))
        return core_fail(KEEL_ENOMEM, "out of memory growing the table list");
    world_table *t = table_new(w, set);
    if (!t)
        return core_fail(KEEL_ENOMEM, "out of memory creating an archetype table");
    t->id = w->ntables;
    rc = query_on_new_table(w, t);
    if (rc) {
        table_free(t);
        return rc;
    }
    w->tables[w->ntables++] = t;
    *map_find(w, set) = t->id;
    w->table_last = t->id;
    *out = t;
    return KEEL_OK;
}

static void chunk_free(const world_table *t, world_chunk *ch);

/* Column buffers are cache-line aligned: a chunk's columns never share a
 * line, so workers writing different chunks never false-share. */
size_t storage_column_bytes(uint32_t rows, uint32_t size)
{
    return ((size_t)rows * size + 63) & ~(size_t)63;
}

void *storage_column_alloc(uint32_t rows, uint32_t size)
{
    return aligned_alloc(64, storage_column_bytes(rows, size));
}

static world_chunk *chunk_new(const world_table *t, uint32_t capacity)
{
    world_chunk *ch = calloc(1, sizeof *ch + t->ncols * sizeof(world_colver));
    if (!ch)
        return NULL;
    ch->capacity = capacity;
    ch->entities = malloc((size_t)capacity * sizeof(keel_entity));
    bool ok = ch->entities != NULL;
    for (uint32_t i = 0; ok && i < t->ncols; i++)
        if (t->cols[i].size)
            {
            void *buf = storage_column_alloc(capacity, t->cols[i].size);
            colver_set_cur(&ch->cols[i], buf);
            ok = buf != NULL;
        }
    if (!ok) {
        for (uint32_t i = 0; i < t->ncols; i++)
            free(colver_cur(&ch->cols[i]));
        free(ch->entities);
        free(ch);
        return NULL;
    }
    return ch;
}

/* ---- Column-major reservation --------------------------------------------
 * A full-size chunk's buffers come from a reserve filled STORAGE_RESERVE
 * chunks at a time, column by column, so that one column's buffers of
 * neighbouring chunks are neighbours in memory. Why: a pass over a column
 * streams its chunks' buffers in order, and when every chunk's buffers are
 * allocated together (pos, vel, pos, vel, ...) each stream jumps over the
 * other columns at every chunk; on the machine of docs/performance.md that
 * made a fused 1M-row pass 1.59-1.64x the in-place loop against 1.46-1.54x
 * with the columns apart. Reserved buffers are plain heap blocks, freed
 * with free() like any other; unused ones are never written, so they cost
 * address space, not memory. A reserve holds as many chunks as the table
 * already has, at most STORAGE_RESERVE, so a small table reserves little. */
#define STORAGE_RESERVE 16u

/* Free the reserved buffers not handed out yet (the slot array stays). */
static void reserve_release(world_table *t)
{
    for (uint32_t i = 0; t->reserve && i <= t->ncols; i++)
        for (uint32_t k = t->reserve_next; k < t->reserve_len; k++)
            free(t->reserve[i * STORAGE_RESERVE + k]);
    t->reserve_next = t->reserve_len = 0;
}

/* Fill the reserve for the next chunks of `rows` rows. All or nothing. */
static bool reserve_fill(world_table *t, uint32_t rows)
{
    size_t slots = (size_t)(t->ncols + 1) * STORAGE_RESERVE;
    if (!t->reserve && !(t->reserve = malloc(slots * sizeof *t->reserve)))
        return false;
    memset(t->reserve, 0, slots * sizeof *t->reserve); /* handed-out buffers are the chunks' now */
    t->reserve_len = t->nchunks < STORAGE_RESERVE ? (t->nchunks ? t->nchunks : 1) : STORAGE_RESERVE;
    t->reserve_next = 0;
    bool ok = true;
    for (uint32_t i = 0; ok && i <= t->ncols; i++) {
        uint32_t size = i < t->ncols ? t->cols[i].size : (uint32_t)sizeof(keel_entity);
        for (uint32_t k = 0; ok && size && k < t->reserve_len; k++)
            ok = (t->reserve[i * STORAGE_RESERVE + k] = storage_column_alloc(rows, size)) != NULL;
    }
    if (!ok)
        reserve_release(t); /* the slots not reached are NULL */
    return ok;
}

/* A full-size chunk from the reserve; NULL when it cannot be filled. */
static world_chunk *chunk_take(world_table *t, uint32_t rows)
{
    if (t->reserve_next == t->reserve_len && !reserve_fill(t, rows))
        return NULL;
    world_chunk *ch = calloc(1, sizeof *ch + t->ncols * sizeof(world_colver));
    if (!ch)
        return NULL;
    uint32_t k = t->reserve_next++;
    ch->capacity = rows;
    ch->entities = t->reserve[t->ncols * STORAGE_RESERVE + k];
    for (uint32_t i = 0; i < t->ncols; i++)
        colver_set_cur(&ch->cols[i], t->reserve[i * STORAGE_RESERVE + k]);
    return ch;
}

/* Double the capacity of a table's only chunk (at most chunk_rows). All or
 * nothing: the new buffers replace the old ones only when every one of them
 * could be allocated. A replaced buffer the view holds stays as the chunk's
 * pub until the next publication retires it. */
static int chunk_grow(const keel_world *w, const world_table *t, world_chunk *ch)
{
    uint32_t cap = ch->capacity * 2 < w->chunk_rows ? ch->capacity * 2 : w->chunk_rows;
    world_chunk *bigger = chunk_new(t, cap);
    if (!bigger)
        return core_fail(KEEL_ENOMEM, "out of memory growing a chunk to %u rows", cap);
    memcpy(bigger->entities, ch->entities, (size_t)ch->count * sizeof(keel_entity));
    for (uint32_t i = 0; i < t->ncols; i++) {
        world_colver *v = &ch->cols[i];
        if (!t->cols[i].size)
            continue;
        memcpy(colver_cur(&bigger->cols[i]), colver_cur(v), (size_t)ch->count * t->cols[i].size);
        version_free_spare(v); /* sized for the old capacity */
        if (colver_cur(v) != v->pub)
            free(colver_cur(v));
        colver_set_cur(v, colver_cur(&bigger->cols[i]));
    }
    if (ch->entities != ch->pub_entities)
        free(ch->entities);
    ch->entities = bigger->entities;
    ch->capacity = cap;
    free(bigger);
    return KEEL_OK;
}

/* World teardown: no view remains, free every version. */
static void chunk_free(const world_table *t, world_chunk *ch)
{
    for (uint32_t i = 0; i < t->ncols; i++) {
        version_free_spare(&ch->cols[i]);
        if (ch->cols[i].pub != colver_cur(&ch->cols[i]))
            free(ch->cols[i].pub);
        free(colver_cur(&ch->cols[i]));
        free(atomic_load_explicit(&ch->cols[i].priv, memory_order_relaxed));
    }
    if (ch->pub_entities != ch->entities)
        free(ch->pub_entities);
    free(ch->entities);
    free(ch);
}

#define CHUNK_FIRST_ROWS 16u

static int reserve_room(keel_world *w, world_table *t)
{
    if (t->nchunks) {
        world_chunk *last = t->chunks[t->nchunks - 1];
        /* rows are dense: only the last chunk can have room */
        if (t->count < (t->nchunks - 1) * w->chunk_rows + last->capacity)
            return KEEL_OK;
        if (last->capacity < w->chunk_rows)
            return chunk_grow(w, t, last); /* only a table's first chunk is ever small */
    }
    if (CORE_GROW(t->chunks, t->chunk_cap, t->nchunks + 1, 4))
        return core_fail(KEEL_ENOMEM, "out of memory growing a table's chunk list");
    uint32_t rows = t->nchunks ? w->chunk_rows : (CHUNK_FIRST_ROWS < w->chunk_rows ? CHUNK_FIRST_ROWS : w->chunk_rows);
    world_chunk *ch = t->nchunks ? chunk_take(t, rows) : NULL;
    if (!ch)
        ch = chunk_new(t, rows); /* a table's first chunk, or no memory for a whole reserve */
    if (!ch)
        return core_fail(KEEL_ENOMEM, "out of memory allocating a chunk of %u rows", rows);
    t->chunks[t->nchunks++] = ch;
    return KEEL_OK;
}

int storage_reserve_row(keel_world *w, world_table *t)
{
    int rc = reserve_room(w, t);
    if (rc)
        return rc;
    /* the new row lands at row `count`: a copy is needed only below the
     * view's row count (rows freed earlier in this sync point) */
    world_chunk *ch = t->chunks[t->count >> w->chunk_shift];
    if ((t->count & w->chunk_mask) < ch->pub_count)
        return version_own_chunk(w, t, ch);
    return KEEL_OK;
}

int storage_reserve_remove(keel_world *w, world_table *t, uint32_t row)
{
    /* removing may free a trailing chunk, whose published buffers retire */
    int rc = version_reserve_retire(w, t->ncols * 2 + 2);
    uint32_t last = t->count - 1;
    if (rc || row == last)
        return rc;
    world_chunk *dst = t->chunks[row >> w->chunk_shift];
    if ((row & w->chunk_mask) < dst->pub_count && (rc = version_own_chunk(w, t, dst)))
        return rc;
    const world_chunk *src = t->chunks[last >> w->chunk_shift];
    return entity_own_slot(w, KEEL_ENTITY_INDEX(src->entities[last & w->chunk_mask]));
}

uint32_t storage_push_row(keel_world *w, world_table *t, keel_entity e)
{
    uint32_t row = t->count++;
    world_chunk *ch = t->chunks[row >> w->chunk_shift];
    ch->entities[ch->count++] = e;
    world_slot *s = entity_slot_w(w, KEEL_ENTITY_INDEX(e));
    s->table = t->id;
    s->row = row;
    return row;
}

void storage_remove_row(keel_world *w, world_table *t, uint32_t row)
{
    uint32_t last = t->count - 1;
    world_chunk *dst = t->chunks[row >> w->chunk_shift];
    world_chunk *src = t->chunks[last >> w->chunk_shift];
    if (row != last) {
        size_t to = row & w->chunk_mask, from = last & w->chunk_mask;
        for (uint32_t i = 0; i < t->ncols; i++) {
            size_t size = t->cols[i].size;
            if (size)
                world_cell_copy((char *)colver_cur(&dst->cols[i]) + to * size,
                          (const char *)colver_cur(&src->cols[i]) + from * size, (uint32_t)size);
        }
        keel_entity moved = src->entities[from];
        dst->entities[to] = moved;
        entity_slot_w(w, KEEL_ENTITY_INDEX(moved))->row = row;
    }
    src->count--;
    t->count--;
    /* Free trailing empty chunks beyond the one kept as a spare. */
    while (t->nchunks >= 2 && t->chunks[t->nchunks - 2]->count == 0) {
        version_free_chunk(w, t, t->chunks[t->nchunks - 1]);
        t->nchunks--;
    }
}

static void table_free(world_table *t)
{
    reserve_release(t);
    free(t->reserve);
    for (uint32_t i = 0; i < t->nchunks; i++)
        chunk_free(t, t->chunks[i]);
    free(t->chunks);
    free(t->cols);
    free(t);
}

void storage_fini(keel_world *w)
{
    for (uint32_t id = 0; id < w->ntables; id++)
        table_free(w->tables[id]);
    for (uint32_t i = 0; i < w->nretired; i++)
        free(w->retired[i]);
    free(w->retired);
    free(w->tables);
    free(w->table_map);
}
