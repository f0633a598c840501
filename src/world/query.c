/*
 * world/query.c -- cached queries.
 *
 * A query keeps the ids of the tables that match it, in table creation
 * order. The world tells every live query about each new table
 * (query_on_new_table) before the table becomes visible, so the cache is
 * never stale and iteration never tests tables that cannot match.
 */
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

struct keel_query {
    keel_world *world;
    world_compset with, without;
    keel_component terms[KEEL_QUERY_MAX_TERMS]; /* 0-terminated when nterms < max */
    uint32_t nterms;
    uint32_t *tables;
    uint32_t ntables, tables_cap;
};

bool query_matches_table(const keel_query *q, const world_table *t)
{
    return compset_contains(&t->set, &q->with) && compset_disjoint(&t->set, &q->without);
}

static int query_reserve(keel_query *q)
{
    if (CORE_GROW(q->tables, q->tables_cap, q->ntables + 1, 8))
        return core_fail(KEEL_ENOMEM, "out of memory growing a query's table list");
    return KEEL_OK;
}

int query_on_new_table(keel_world *w, world_table *t)
{
    /* Reserve in every matching query first, so the table is added to all
     * of them or to none. */
    for (uint32_t i = 0; i < w->nqueries; i++) {
        if (query_matches_table(w->queries[i], t)) {
            int rc = query_reserve(w->queries[i]);
            if (rc)
                return rc;
        }
    }
    for (uint32_t i = 0; i < w->nqueries; i++) {
        keel_query *q = w->queries[i];
        if (query_matches_table(q, t))
            q->tables[q->ntables++] = t->id;
    }
    return KEEL_OK;
}

/* Parse one 0-terminated term list into set (and terms, when given). */
static int parse_terms(const keel_world *w, const keel_component *list, const char *what, world_compset *set,
                       keel_component *terms, uint32_t *n)
{
    uint32_t i = 0;
    for (; i < KEEL_QUERY_MAX_TERMS && list[i]; i++) {
        keel_component c = list[i];
        if (!world_component_valid(w, c))
            return core_fail(KEEL_EINVAL, "keel_query_create: %s[%u] = %u is not a registered component", what, i, c);
        if (compset_has(set, c))
            return core_fail(KEEL_EINVAL, "keel_query_create: component '%s' appears twice in %s", w->comps[c].name,
                             what);
        compset_add(set, c);
        if (terms)
            terms[i] = c;
    }
    if (n)
        *n = i;
    return KEEL_OK;
}

int keel_query_create(keel_world *w, const keel_query_desc *desc, keel_query **out)
{
    if (!w || !desc || !out)
        return core_fail(KEEL_EINVAL, "keel_query_create: world, desc or out is NULL");
    keel_query tmp = {.world = w};
    int rc = parse_terms(w, desc->with, "with", &tmp.with, tmp.terms, &tmp.nterms);
    if (!rc)
        rc = parse_terms(w, desc->without, "without", &tmp.without, NULL, NULL);
    if (rc)
        return rc;
    if (!tmp.nterms)
        return core_fail(KEEL_EINVAL, "keel_query_create: a query needs at least one 'with' term");
    if (!compset_disjoint(&tmp.with, &tmp.without))
        return core_fail(KEEL_EINVAL, "keel_query_create: a component is both in 'with' and in 'without'");

    keel_query *q = malloc(sizeof *q);
    if (!q)
        return core_fail(KEEL_ENOMEM, "keel_query_create: out of memory");
    *q = tmp;
    if (CORE_GROW(w->queries, w->queries_cap, w->nqueries + 1, 8)) {
        free(q);
        return core_fail(KEEL_ENOMEM, "keel_query_create: out of memory");
    }
    for (uint32_t id = 0; id < w->ntables; id++) {
        if (!query_matches_table(q, w->tables[id]))
            continue;
        if (query_reserve(q)) {
            free(q->tables);
            free(q);
            return KEEL_ENOMEM;
        }
        q->tables[q->ntables++] = id;
    }
    w->queries[w->nqueries++] = q;
    *out = q;
    return KEEL_OK;
}

void keel_query_destroy(keel_query *q)
{
    if (!q)
        return;
    keel_world *w = q->world;
    for (uint32_t i = 0; i < w->nqueries; i++) {
        if (w->queries[i] == q) {
            memmove(&w->queries[i], &w->queries[i + 1], (w->nqueries - i - 1) * sizeof *w->queries);
            w->nqueries--;
            break;
        }
    }
    free(q->tables);
    free(q);
}

uint32_t keel_query_count(const keel_query *q)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < q->ntables; i++)
        n += q->world->tables[q->tables[i]]->count;
    return n;
}

void keel_query_iter(const keel_query *q, keel_iter *it)
{
    memset(it, 0, sizeof *it);
    it->query_ = q;
}

bool keel_iter_next(keel_iter *it)
{
    const keel_query *q = it->query_;
    const keel_world *w = q->world;
    for (; it->table_pos_ < q->ntables; it->table_pos_++, it->chunk_ = 0) {
        const world_table *t = w->tables[q->tables[it->table_pos_]];
        while (it->chunk_ < t->nchunks) {
            const world_chunk *ch = t->chunks[it->chunk_++];
            if (!ch->count)
                continue;
            it->count = ch->count;
            it->entities = ch->entities;
            for (uint32_t i = 0; i < q->nterms; i++)
                it->prev[i] = it->columns[i] = colver_cur(&ch->cols[t->col_of[q->terms[i]] - 1]);
            return true;
        }
    }
    it->count = 0;
    return false;
}

world_chunk_ref query_iter_ref(const keel_iter *it)
{
    const keel_query *q = it->query_;
    uint32_t table = q->tables[it->table_pos_];
    return (world_chunk_ref){table, it->chunk_ - 1, it->count, 0};
}

const keel_component *query_terms(const keel_query *q)
{
    return q->terms;
}

const keel_world *query_world(const keel_query *q)
{
    return q->world;
}

uint32_t query_chunk_refs(const keel_query *q, world_chunk_ref *out, uint32_t cap)
{
    const keel_world *w = q->world;
    uint32_t n = 0;
    for (uint32_t i = 0; i < q->ntables; i++) {
        const world_table *t = w->tables[q->tables[i]];
        for (uint32_t c = 0; c < t->nchunks && t->chunks[c]->count; c++, n++)
            if (n < cap)
                out[n] = (world_chunk_ref){q->tables[i], c, t->chunks[c]->count, 0};
    }
    return n;
}

void query_iter_chunk(const keel_query *q, world_chunk_ref ref, keel_iter *it)
{
    const world_table *t = q->world->tables[ref.table];
    const world_chunk *ch = t->chunks[ref.chunk];
    it->query_ = q;
    it->count = ch->count;
    it->entities = ch->entities;
    for (uint32_t i = 0; i < q->nterms; i++)
        it->prev[i] = it->columns[i] = colver_cur(&ch->cols[t->col_of[q->terms[i]] - 1]);
}
