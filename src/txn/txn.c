/*
 * txn/txn.c -- system transactions: copy-on-write versions of VERSIONED
 * chunk columns, commit and rollback, and what a system body sees.
 *
 * Protocol for a VERSIONED chunk column (world_colver in world_internal.h):
 *
 *   first write in a transaction: a buffer, the column's spare or a new
 *     allocation (world/version.c "Recycling"); then, under the chunk
 *     column's own lock (colver_lock), a copy of `cur` into it (not for a
 *     column the system `rewrites`) and priv = buffer, unless priv is set
 *     already. The tasks of one parallel system may race to the same chunk
 *     column through keel_txn_set; the later one gives its buffer back as
 *     the spare (or frees it) and uses the first one's. Only the system now
 *     writing the component can have a priv: the schedule orders every two
 *     writers of a component. A side transaction committing into the same
 *     chunk takes the same lock for each row it writes (side.c), so it
 *     either precedes the copy (and is copied) or sees the priv (and writes
 *     into it too): no side write is lost when the system commits. The lock
 *     is the chunk column's, not side_lock: tasks copying different chunk
 *     columns never wait for each other.
 *   commit (on the worker that completes the system, after every task has
 *     finished -- the tasks_done counter orders their writes before it):
 *     cur = priv, priv = NULL, under the column's lock; the old cur is
 *     then freed unless the published view holds it (old == pub), in which
 *     case publication retires it.
 *   abort: free priv, priv = NULL. Nothing else was touched.
 *
 * Readers never take a lock: a snapshot reader reads `pub`, which no one
 * writes during a tick; a fresh or plain reader is ordered after (or
 * before) every writer by the schedule, so it reads a `cur` nobody changes
 * under it. The exception is a side transaction of a system that reads a
 * component's snapshot while its writer runs: keel_side_get reads `cur`
 * under the column's lock, which the commit's swap takes, so the version it
 * reads is not freed under it (side.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "keel/runtime.h"
#include "txn/txn_internal.h"

int txn_vec_reserve(txn_vec *v, uint32_t extra)
{
    if (CORE_GROW(v->v, v->cap, v->n + extra, 16))
        return core_fail(KEEL_ENOMEM, "out of memory growing a transaction's chunk list");
    return KEEL_OK;
}

int txn_state_init(txn_state *ts, keel_world *w, keel_durability mode)
{
    *ts = (txn_state){.world = w, .durability = mode};
    core_mutex_init_adaptive(&ts->side_lock); /* usually held ~100 ns per side transaction step */
    submit_init(ts);
    int rc = view_init(ts);
    return rc ? rc : side_init(ts);
}

void txn_state_fini(txn_state *ts)
{
    submit_fini(ts);
    uow_fini(&ts->uow);
    side_fini(ts);
    view_fini(ts);
    pthread_mutex_destroy(&ts->side_lock);
}

void keel_txn_fail(keel_ctx *ctx, int rc)
{
    if (ctx && !ctx->fail_rc)
        ctx->fail_rc = rc ? rc : KEEL_EINVAL;
}

void txn_part_fini(txn_part *p)
{
    free(p->priv.v);
    free(p->dirty.v);
    *p = (txn_part){0};
}

static world_colver *touch_colver(keel_world *w, txn_touch t)
{
    return &w->tables[t.table]->chunks[t.chunk]->cols[t.col];
}

/* ---- writing ------------------------------------------------------------------ */

/* The private version of a VERSIONED chunk column for this transaction,
 * created on first use; NULL on ENOMEM (the last error says so). */
static void *private_column(keel_ctx *ctx, const world_table *t, uint32_t chunk, uint32_t col, bool rewrite)
{
    world_chunk *ch = t->chunks[chunk];
    world_colver *v = &ch->cols[col];
    void *p = atomic_load_explicit(&v->priv, memory_order_acquire);
    if (p)
        return p;
    txn_state *ts = ctx->txn;
    if (txn_vec_reserve(&ctx->part->priv, 1))
        return NULL;
    uint32_t size = t->cols[col].size;
    void *copy = version_new_buffer(v, ch->capacity, size); /* the spare, if any: version.c */
    if (!copy) {
        core_fail(KEEL_ENOMEM, "system '%s': out of memory copying a chunk of '%s'", ctx->name,
                  ts->world->comps[t->cols[col].c].name);
        return NULL;
    }
    colver_lock(v);
    void *other = atomic_load_explicit(&v->priv, memory_order_acquire);
    if (!other) {
        if (!rewrite)
            memcpy(copy, colver_cur(v), (size_t)ch->count * size);
        atomic_store_explicit(&v->priv, copy, memory_order_release);
    }
    colver_unlock(v);
    if (other) { /* another task of this system made it first */
        version_put_spare(v, copy);
        return other;
    }
    txn_vec_push(&ctx->part->priv, (txn_touch){t->id, chunk, col, ctx->worker});
    return copy;
}

/* A SINGLE_VERSION chunk column written in place joins the change set once. */
static int mark_dirty(keel_ctx *ctx, const world_table *t, uint32_t chunk, uint32_t col)
{
    world_colver *v = &t->chunks[chunk]->cols[col];
    if (atomic_load_explicit(&v->changed, memory_order_relaxed))
        return KEEL_OK;
    int rc = txn_vec_reserve(&ctx->part->dirty, 1);
    if (rc)
        return rc;
    if (!atomic_exchange_explicit(&v->changed, 1, memory_order_relaxed))
        txn_vec_push(&ctx->part->dirty, (txn_touch){t->id, chunk, col, ctx->worker});
    return KEEL_OK;
}

static keel_discipline discipline_of(const keel_world *w, keel_component c)
{
    return w->comps[c].desc.discipline;
}

static bool writes_component(const keel_ctx *ctx, keel_component c)
{
    return !ctx->acc || compset_has(&ctx->acc->write, c);
}

/* ---- iteration ---------------------------------------------------------------- */

/* Narrow an iterator over a whole chunk to the rows [first, first + rows)
 * of a budgeted visit (docs/overload.md). */
static void iter_narrow(keel_iter *it, const world_table *t, const keel_component *terms, world_chunk_ref ref)
{
    it->entities += ref.first;
    it->count = ref.rows;
    for (uint32_t i = 0; i < KEEL_QUERY_MAX_TERMS && terms[i]; i++) {
        size_t off = (size_t)ref.first * t->cols[t->col_of[terms[i]] - 1].size;
        if (!off || !it->columns[i])
            continue;
        it->columns[i] = (char *)it->columns[i] + off;
        it->prev[i] = (const char *)it->prev[i] + off;
    }
}

int txn_iter_chunk(keel_ctx *ctx, const keel_query *q, const keel_component *terms, world_chunk_ref ref,
                   keel_iter *it)
{
    query_iter_chunk(q, ref, it);
    keel_world *w = ctx->txn->world;
    const world_table *t = w->tables[ref.table];
    const txn_access *acc = ctx->acc;
    /* a visit of part of a chunk leaves rows the body does not write: a
     * `rewrites` column then gets a copy, not a fresh buffer, so they keep
     * their values (prev still holds the current values) */
    bool part = ref.first || ref.rows < it->count;
    for (uint32_t i = 0; i < KEEL_QUERY_MAX_TERMS && terms[i]; i++) {
        keel_component c = terms[i];
        uint32_t col = t->col_of[c] - 1;
        if (!t->cols[col].size)
            continue;
        world_colver *v = &t->chunks[ref.chunk]->cols[col];
        keel_discipline d = discipline_of(w, c);
        if (!acc || compset_has(&acc->write, c)) { /* on_first_tick (no acc) may write anything */
            if (d == KEEL_VERSIONED) {
                bool rewrite = acc && compset_has(&acc->rewrite, c);
                void *own = atomic_load_explicit(&v->priv, memory_order_acquire);
                it->prev[i] = own ? own : colver_cur(v);
                void *p = private_column(ctx, t, ref.chunk, col, rewrite && !part);
                if (!p)
                    return KEEL_ENOMEM;
                it->columns[i] = p;
                if (!rewrite)
                    it->prev[i] = p;
            } else if (d == KEEL_SINGLE_VERSION) {
                int rc = mark_dirty(ctx, t, ref.chunk, col);
                if (rc)
                    return rc;
            }
        } else if (acc && compset_has(&acc->snapshot, c) && v->pub) {
            it->columns[i] = v->pub;
            it->prev[i] = v->pub;
        }
    }
    if (part)
        iter_narrow(it, t, terms, ref);
    return KEEL_OK;
}

void keel_txn_iter(keel_ctx *ctx, const keel_query *q, keel_iter *it)
{
    (void)ctx;
    keel_query_iter(q, it);
}

bool keel_txn_next(keel_ctx *ctx, keel_iter *it)
{
    if (!keel_iter_next(it))
        return false;
    if (!ctx || !ctx->part) /* no transaction: plain iteration */
        return true;
    const keel_query *q = it->query_;
    int rc = txn_iter_chunk(ctx, q, query_terms(q), query_iter_ref(it), it);
    if (rc) {
        keel_txn_fail(ctx, rc);
        return false;
    }
    return true;
}

/* ---- single values ------------------------------------------------------------ */

/* Resolve (e, c) for a transactional access; *row is the table row. */
static int txn_locate(keel_ctx *ctx, keel_entity e, keel_component c, const void *buf, const char *fn,
                      world_table **t, uint32_t *row, uint32_t *col)
{
    if (!ctx || !ctx->part)
        return core_fail(KEEL_EINVAL, "%s: no transaction here (NULL context or a pipeline system)", fn);
    keel_world *w = ctx->txn->world;
    if (!world_component_valid(w, c))
        return core_fail(KEEL_EINVAL, "%s: system '%s': component id %u is not registered", fn, ctx->name, c);
    if (ctx->acc && !compset_has(&ctx->acc->read, c) && !compset_has(&ctx->acc->write, c) &&
        !compset_has(&ctx->acc->side, c))
        return core_fail(KEEL_EINVAL, "%s: system '%s' does not declare component '%s' in its access", fn, ctx->name,
                         w->comps[c].name);
    if (!buf && w->comps[c].desc.size)
        return core_fail(KEEL_EINVAL, "%s: value buffer is NULL", fn);
    const world_slot *s = world_slot_of(w, e);
    if (!s)
        return core_fail(KEEL_ESTALE, "%s: system '%s': entity 0x%016llx is null, stale or foreign", fn, ctx->name,
                         (unsigned long long)e);
    *t = w->tables[s->table];
    *row = s->row;
    if (!(*t)->col_of[c])
        return core_fail(KEEL_ENOENT, "%s: system '%s': entity 0x%016llx has no component '%s'", fn, ctx->name,
                         (unsigned long long)e, w->comps[c].name);
    *col = (*t)->col_of[c] - 1;
    return KEEL_OK;
}

int keel_txn_get(keel_ctx *ctx, keel_entity e, keel_component c, void *out)
{
    world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = txn_locate(ctx, e, c, out, "keel_txn_get", &t, &row, &col);
    if (rc)
        return rc;
    uint32_t size = t->cols[col].size;
    if (!size)
        return KEEL_OK;
    keel_world *w = ctx->txn->world;
    const world_colver *v = &t->chunks[row >> w->chunk_shift]->cols[col];
    const void *base = colver_cur(v);
    void *own = atomic_load_explicit(&((world_colver *)v)->priv, memory_order_acquire);
    if (own && writes_component(ctx, c))
        base = own;
    else if (ctx->acc && compset_has(&ctx->acc->snapshot, c) && v->pub)
        base = v->pub;
    memcpy(out, (const char *)base + (size_t)(row & w->chunk_mask) * size, size);
    return KEEL_OK;
}

int keel_txn_set(keel_ctx *ctx, keel_entity e, keel_component c, const void *value)
{
    world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = txn_locate(ctx, e, c, value, "keel_txn_set", &t, &row, &col);
    if (rc)
        return rc;
    keel_world *w = ctx->txn->world;
    if (!writes_component(ctx, c))
        return core_fail(KEEL_EINVAL, "keel_txn_set: system '%s' does not declare writes('%s')%s", ctx->name,
                         w->comps[c].name,
                         compset_has(&ctx->acc->side, c) ? "; it is side_writes: write it in a side transaction" : "");
    uint32_t size = t->cols[col].size;
    if (!size)
        return KEEL_OK;
    uint32_t chunk = row >> w->chunk_shift;
    void *base;
    keel_discipline d = discipline_of(w, c);
    if (d == KEEL_VERSIONED) {
        base = private_column(ctx, t, chunk, col, false);
        if (!base)
            return KEEL_ENOMEM;
    } else {
        if (d == KEEL_SINGLE_VERSION && (rc = mark_dirty(ctx, t, chunk, col)))
            return rc;
        base = colver_cur(&t->chunks[chunk]->cols[col]);
    }
    memcpy((char *)base + (size_t)(row & w->chunk_mask) * size, value, size);
    return KEEL_OK;
}

/* ---- commit and abort ------------------------------------------------------------ */

int txn_commit(keel_world *w, txn_part *parts, uint32_t nparts, txn_vec *changes)
{
    uint32_t need = 0;
    for (uint32_t k = 0; k < nparts; k++)
        need += parts[k].priv.n + parts[k].dirty.n;
    int rc = txn_vec_reserve(changes, need);
    if (rc)
        return rc;
    for (uint32_t k = 0; k < nparts; k++) {
        txn_part *p = &parts[k];
        for (uint32_t i = 0; i < p->priv.n; i++) {
            world_colver *v = touch_colver(w, p->priv.v[i]);
            /* under the column's lock: a side transaction of a system that reads this component's
               snapshot may be reading `cur` now (side.c, keel_side_get); it finishes before the swap */
            colver_lock(v);
            void *old = colver_cur(v);
            colver_set_cur(v, atomic_exchange_explicit(&v->priv, NULL, memory_order_acq_rel));
            colver_unlock(v);
            if (old != v->pub)
                free(old); /* a version of this tick that no reader can reach any more */
            if (!atomic_exchange_explicit(&v->changed, 1, memory_order_relaxed))
                txn_vec_push(changes, p->priv.v[i]);
        }
        for (uint32_t i = 0; i < p->dirty.n; i++)
            txn_vec_push(changes, p->dirty.v[i]);
        p->priv.n = p->dirty.n = 0;
    }
    return KEEL_OK;
}

void txn_abort(keel_world *w, txn_part *parts, uint32_t nparts, txn_vec *changes)
{
    for (uint32_t k = 0; k < nparts; k++) {
        txn_part *p = &parts[k];
        for (uint32_t i = 0; i < p->priv.n; i++)
            free(atomic_exchange_explicit(&touch_colver(w, p->priv.v[i])->priv, NULL, memory_order_acq_rel));
        /* in-place writes stay: their chunks stay in the change set (best
         * effort: without memory for the list they are logged with the next
         * change to the same chunk, or at the next checkpoint) */
        if (!txn_vec_reserve(changes, p->dirty.n))
            for (uint32_t i = 0; i < p->dirty.n; i++)
                txn_vec_push(changes, p->dirty.v[i]);
        p->priv.n = p->dirty.n = 0;
    }
}
