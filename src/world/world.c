/*
 * world/world.c -- world lifetime and single-value access.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

#define WORLD_DEFAULT_CHUNK_ROWS 8192u
#define WORLD_MAX_ENTITIES (UINT32_MAX - 1u)

int keel_world_create(const keel_world_desc *desc, keel_world **out)
{
    if (!out)
        return core_fail(KEEL_EINVAL, "keel_world_create: out is NULL");
    keel_world_desc d = desc ? *desc : (keel_world_desc){0};
    uint32_t rows = d.chunk_rows ? d.chunk_rows : WORLD_DEFAULT_CHUNK_ROWS;
    if (rows < 16 || rows > 65536 || (rows & (rows - 1)))
        return core_fail(KEEL_EINVAL, "keel_world_create: chunk_rows %u is not a power of two in [16, 65536]", rows);
    keel_world *w = calloc(1, sizeof *w);
    if (!w)
        return core_fail(KEEL_ENOMEM, "keel_world_create: out of memory");
    w->chunk_rows = rows;
    w->chunk_shift = (uint32_t)__builtin_ctz(rows);
    w->chunk_mask = rows - 1;
    w->max_entities = d.max_entities && d.max_entities < WORLD_MAX_ENTITIES ? d.max_entities : WORLD_MAX_ENTITIES;
    *out = w;
    return KEEL_OK;
}

void keel_world_destroy(keel_world *w)
{
    if (!w)
        return;
    storage_fini(w);
    entity_index_fini(w);
    component_fini(w);
    free(w->queries);
    free(w);
}

uint32_t keel_world_pending(const keel_world *w)
{
    return w ? w->pending_cmdbufs : 0;
}

void world_test_inject_failure(keel_world *w, uint32_t nth, int rc)
{
    w->inject_countdown = nth;
    w->inject_rc = rc;
}

/* Resolve (e, c) to the table and row holding the value; the column index
 * + 1 goes to *col (0: the entity lacks c, which is not an error here). */
static int resolve(const keel_world *w, keel_entity e, keel_component c, const char *fn, const world_table **t,
                   uint32_t *row, uint32_t *col)
{
    if (!w)
        return core_fail(KEEL_EINVAL, "%s: world is NULL", fn);
    if (!world_component_valid(w, c))
        return core_fail(KEEL_EINVAL, "%s: component id %u is not registered", fn, c);
    const world_slot *s = world_slot_of(w, e);
    if (!s)
        return core_fail(KEEL_ESTALE, "%s: entity 0x%016llx is null, stale or foreign", fn, (unsigned long long)e);
    *t = w->tables[s->table];
    *row = s->row;
    *col = (*t)->col_of[c];
    return KEEL_OK;
}

/* The cell holding e's value of c, or fail naming the culprit. */
static int locate(const keel_world *w, keel_entity e, keel_component c, const char *fn, void **cell)
{
    const world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = resolve(w, e, c, fn, &t, &row, &col);
    if (rc)
        return rc;
    if (!col)
        return core_fail(KEEL_ENOENT, "%s: entity 0x%016llx has no component '%s'", fn, (unsigned long long)e,
                         w->comps[c].name);
    *cell = t->cols[col - 1].size ? world_cell(w, t, col - 1, row) : NULL;
    return KEEL_OK;
}

int keel_has(const keel_world *w, keel_entity e, keel_component c)
{
    const world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = resolve(w, e, c, "keel_has", &t, &row, &col);
    return rc ? rc : col != 0;
}

int keel_get(const keel_world *w, keel_entity e, keel_component c, void *out)
{
    void *cell = NULL;
    int rc = locate(w, e, c, "keel_get", &cell);
    if (rc)
        return rc;
    uint32_t size = w->comps[c].desc.size;
    if (size && !out)
        return core_fail(KEEL_EINVAL, "keel_get: out is NULL for component '%s'", w->comps[c].name);
    if (size)
        memcpy(out, cell, size);
    return KEEL_OK;
}

int keel_set(keel_world *w, keel_entity e, keel_component c, const void *value)
{
    const world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = resolve(w, e, c, "keel_set", &t, &row, &col);
    if (rc)
        return rc;
    if (w->in_tick)
        return core_fail(KEEL_EBUSY, "keel_set: systems are running; write component '%s' through the system's "
                                     "transaction (keel_txn_set)", w->comps[c].name);
    if (w->log_required && !w->restoring)
        return core_fail(KEEL_EBUSY, "keel_set: the world has a data directory and nothing would log this write; "
                                     "write component '%s' inside a tick (a system, a hook or a side transaction)",
                         w->comps[c].name);
    if (!col)
        return core_fail(KEEL_ENOENT, "keel_set: entity 0x%016llx has no component '%s'", (unsigned long long)e,
                         w->comps[c].name);
    uint32_t size = w->comps[c].desc.size;
    if (size && !value)
        return core_fail(KEEL_EINVAL, "keel_set: value is NULL for component '%s'", w->comps[c].name);
    if (!size)
        return KEEL_OK;
    /* a value the published view shares is copied first (world/version.c) */
    rc = version_own_column(w, t, t->chunks[row >> w->chunk_shift], col - 1);
    if (rc)
        return rc;
    memcpy(world_cell(w, t, col - 1, row), value, size);
    w->mutations++;
    return KEEL_OK;
}
