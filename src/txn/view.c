/*
 * txn/view.c -- published read views for readers outside the tick.
 *
 * At the end of every tick that changed something, the stepping thread
 * publishes the live world as an immutable view: one block holding, per
 * table, its row count and per chunk the row count, entity array and
 * column pointers, plus the slot page pointers. The view shares every
 * buffer with the live world; world/version.c guarantees the live world
 * never writes a shared buffer again (it copies first) and keeps the
 * replaced ones on world->retired.
 *
 * RCU protocol (liburcu, bulletproof flavour "urcu-bp": reader threads need
 * no registration, which suits network/admin threads the runtime does not
 * own; its read side costs a little more than urcu-memb, irrelevant at one
 * section per request):
 *   reader:    rcu_read_lock; v = load(ts->view, acquire); ... read v ...;
 *              rcu_read_unlock
 *   publisher: build the new view; store(ts->view, new, release);
 *              call_rcu(old): after a grace period -- when every reader
 *              that could have loaded `old` has unlocked -- free old and
 *              the buffers retired while it was current (they are
 *              reachable from old only).
 * Shortcut: readers also count themselves in ts->readers (incremented
 * before they load the view, decremented after they unlock). The publisher
 * loads the count after storing the new view; all four accesses are
 * seq_cst, so a count of 0 proves that every later reader loads the new
 * view (Dekker): the old one is freed at once instead of after a grace
 * period. This keeps a server without readers at two versions of a
 * rewritten column instead of three (the call_rcu thread lags a tick),
 * and it is the proof world/version.c's recycling needs: with a count of
 * 0 the buffers only the old view held become spares, the next writes'
 * targets (with readers they retire with the old view, as before).
 * The view pointer is a C11 atomic rather than rcu_assign_pointer so that
 * ThreadSanitizer sees the publication; the grace period itself is
 * invisible to TSan (liburcu is not instrumented), so keel_view_end
 * releases, and the reclaim callback acquires, a token under TSan.
 */
#include <stdlib.h>
#include <string.h>

/* library calls, not the _LGPL_SOURCE inlines: those read the reader
 * structure at an alignment UBSan rejects */
#include <urcu-bp.h>

#include "core/core.h"
#include "txn/txn_internal.h"

typedef struct view_chunk {
    uint32_t count;
    const keel_entity *entities;
    void *const *cols;
} view_chunk;

typedef struct view_table {
    const world_table *t;      /* immutable metadata (set, columns); tables live as long as the world */
    uint32_t count, nchunks;
    const view_chunk *chunks;
} view_table;

struct keel_view {
    struct rcu_head rcu;
    txn_state *ts;
    const keel_world *w;
    uint64_t tick;
    uint32_t nslots, nlive, ntables;
    world_slot *const *pages;
    const view_table *tables;
    void **garbage;            /* retired while this view was current: freed with it */
    uint32_t ngarbage;
};

static char tsan_grace_token;

static size_t view_bytes(const keel_world *w)
{
    size_t n = sizeof(keel_view) + (size_t)w->npages * sizeof(world_slot *) + (size_t)w->ntables * sizeof(view_table);
    for (uint32_t i = 0; i < w->ntables; i++) {
        const world_table *t = w->tables[i];
        n += (size_t)t->nchunks * (sizeof(view_chunk) + (size_t)t->ncols * sizeof(void *));
    }
    return n;
}

static uint32_t retire_bound(const keel_world *w)
{
    uint32_t n = w->npages;
    for (uint32_t i = 0; i < w->ntables; i++)
        n += w->tables[i]->nchunks * (w->tables[i]->ncols + 1);
    return n;
}

/* Make the chunk's published state its live state (retiring what the view
 * held and the live chunk no longer uses) and describe it in vc. With
 * `recycle`, a replaced column buffer becomes the column's spare instead
 * of retiring (world/version.c "Recycling" step 1; view_publish revokes
 * the spares when it finds readers). */
static void publish_chunk(keel_world *w, const world_table *t, world_chunk *ch, view_chunk *vc, void **cols,
                          bool recycle)
{
    bool shared = false; /* a buffer stays shared with views published before */
    recycle = recycle && ch->pub_capacity == ch->capacity; /* a grown chunk's old buffers are too small */
    for (uint32_t i = 0; i < t->ncols; i++) {
        world_colver *v = &ch->cols[i];
        atomic_store_explicit(&v->changed, 0, memory_order_relaxed);
        cols[i] = NULL;
        if (!world_col_versioned(w, t, i))
            continue;
        version_free_spare(v); /* unused for a tick: give the memory back */
        void *cur = colver_cur(v);
        if (v->pub && v->pub != cur) {
            if (recycle)
                atomic_store_explicit(&v->spare, v->pub, memory_order_release);
            else
                version_drop(w, v->pub, v->pub);
        } else if (v->pub) {
            shared = true;
        }
        v->pub = cur;
        cols[i] = cur;
    }
    ch->pub_capacity = ch->capacity;
    if (ch->pub_entities && ch->pub_entities != ch->entities)
        version_drop(w, ch->pub_entities, ch->pub_entities);
    else if (ch->pub_entities)
        shared = true;
    ch->pub_entities = ch->entities;
    /* rows at or past pub_count are written in place (appends): it must
     * cover every view still sharing one of these buffers, not only this one */
    ch->pub_count = shared && ch->pub_count > ch->count ? ch->pub_count : ch->count;
    *vc = (view_chunk){ch->count, ch->entities, cols};
}

static keel_view *build_view(keel_world *w, uint64_t tick, unsigned char *mem, bool recycle)
{
    keel_view *v = (keel_view *)mem;
    unsigned char *p = mem + sizeof *v;
    *v = (keel_view){.ts = NULL, .w = w, .tick = tick, .nslots = w->nslots, .nlive = w->nlive, .ntables = w->ntables};
    world_slot **pages = (world_slot **)p;
    p += (size_t)w->npages * sizeof *pages;
    for (uint32_t i = 0; i < w->npages; i++) {
        if (w->pub_pages[i] && w->pub_pages[i] != w->pages[i])
            version_drop(w, w->pub_pages[i], w->pub_pages[i]);
        pages[i] = w->pub_pages[i] = w->pages[i];
    }
    v->pages = pages;
    view_table *tables = (view_table *)p;
    p += (size_t)w->ntables * sizeof *tables;
    for (uint32_t id = 0; id < w->ntables; id++) {
        world_table *t = w->tables[id];
        view_chunk *chunks = (view_chunk *)p;
        p += (size_t)t->nchunks * sizeof *chunks;
        for (uint32_t k = 0; k < t->nchunks; k++) {
            void **cols = (void **)p;
            p += (size_t)t->ncols * sizeof *cols;
            publish_chunk(w, t, t->chunks[k], &chunks[k], cols, recycle);
        }
        tables[id] = (view_table){t, t->count, t->nchunks, chunks};
    }
    v->tables = tables;
    return v;
}

static bool view_pinned(const txn_state *ts, void *buf)
{
    return ts && ts->log.ops && ts->log.ops->pin_hold(ts->log.self, buf);
}

static void view_free(keel_view *v)
{
    for (uint32_t i = 0; i < v->ngarbage; i++)
        if (!view_pinned(v->ts, v->garbage[i])) /* a running checkpoint may still read it */
            free(v->garbage[i]);
    free(v->garbage);
    free(v);
}

/* urcu_bp_barrier returns once every queued view_reclaim has run: what a
 * reclaim read (the view, the transaction state it consults) may be freed
 * after the barrier. TSan cannot see liburcu's hand-off, hence the token. */
static char tsan_barrier_token;

static void view_reclaim(struct rcu_head *head)
{
    CORE_TSAN_ACQUIRE(&tsan_grace_token);
    view_free(caa_container_of(head, keel_view, rcu));
    CORE_TSAN_RELEASE(&tsan_barrier_token);
}

static void view_barrier(void)
{
    urcu_bp_barrier();
    CORE_TSAN_ACQUIRE(&tsan_barrier_token);
}

int view_publish(txn_state *ts, uint64_t tick)
{
    keel_world *w = ts->world;
    unsigned char *mem = malloc(view_bytes(w));
    if (!mem || version_reserve_retire(w, retire_bound(w))) {
        free(mem);
        return core_fail(KEEL_ENOMEM, "out of memory publishing the view of tick %llu", (unsigned long long)tick);
    }
    /* no recycling while a checkpoint pins published buffers: a pinned
     * one must be freed by the pin's owner, and only once no view holds it */
    bool recycle = !(ts->log.ops && ts->log.ops->pin_active(ts->log.self));
    keel_view *view = build_view(w, tick, mem, recycle);
    view->ts = ts;
    keel_view *old = atomic_load_explicit(&ts->view, memory_order_relaxed);
    atomic_store(&ts->view, view);
    ts->pub_mutations = w->mutations;
    bool alone = atomic_load(&ts->readers) == 0;
    if (!alone && recycle)
        version_revoke_spares(w); /* a reader may be reading them through old */
    /* everything retired so far was reachable from the old view only */
    old->garbage = w->retired;
    old->ngarbage = w->nretired;
    w->retired = NULL;
    w->nretired = w->retired_cap = 0;
    if (alone)
        view_free(old);
    else {
        CORE_TSAN_RELEASE(&tsan_grace_token); /* orders the publisher's writes before view_reclaim */
        urcu_bp_call_rcu(&old->rcu, view_reclaim);
    }
    return KEEL_OK;
}

int view_init(txn_state *ts)
{
    keel_view *v = calloc(1, sizeof *v);
    if (!v)
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory");
    v->w = ts->world;
    v->ts = ts;
    atomic_store_explicit(&ts->view, v, memory_order_release);
    return KEEL_OK;
}

void view_quiesce(void)
{
    view_barrier(); /* every queued view_reclaim has run */
}

void view_fini(txn_state *ts)
{
    /* readers are gone (documented); wait for queued reclaims, free the last */
    view_barrier();
    keel_view *v = atomic_load_explicit(&ts->view, memory_order_relaxed);
    if (v)
        view_free(v);
    atomic_store_explicit(&ts->view, NULL, memory_order_relaxed);
}

/* ---- the reader's side ------------------------------------------------------------- */

int view_begin(txn_state *ts, const keel_view **out)
{
    atomic_fetch_add(&ts->readers, 1);
    urcu_bp_read_lock();
    *out = atomic_load(&ts->view);
    return KEEL_OK;
}

void keel_view_end(const keel_view *v)
{
    if (!v)
        return;
    txn_state *ts = v->ts; /* v may be freed once unlocked */
    CORE_TSAN_RELEASE(&tsan_grace_token);
    urcu_bp_read_unlock();
    atomic_fetch_sub(&ts->readers, 1);
}

uint64_t keel_view_tick(const keel_view *v)
{
    return v ? v->tick : 0;
}

uint32_t keel_view_count(const keel_view *v)
{
    return v ? v->nlive : 0;
}

static const world_slot *view_slot(const keel_view *v, keel_entity e)
{
    uint32_t idx = KEEL_ENTITY_INDEX(e);
    if (idx >= v->nslots)
        return NULL;
    const world_slot *s = &v->pages[idx >> WORLD_PAGE_SHIFT][idx & (WORLD_PAGE_SLOTS - 1)];
    if (s->table == WORLD_NO_TABLE)
        return NULL;
    const keel_world *w = v->w; /* the generation is in the view's entity array (world_internal.h) */
    const view_chunk *vc = &v->tables[s->table].chunks[s->row >> w->chunk_shift];
    return vc->entities[s->row & w->chunk_mask] == e ? s : NULL;
}

/* A component whose values a view does not hold (SINGLE_VERSION and
 * TRANSIENT are written in place, never published). */
static int not_in_view(const keel_world *w, keel_component c, const char *fn)
{
    return core_fail(KEEL_EINVAL,
                     "%s: component '%s' is %s: a read view holds the values of versioned components only; "
                     "read it inside a system, or register it KEEL_VERSIONED",
                     fn, w->comps[c].name, keel_discipline_name(w->comps[c].desc.discipline));
}

bool keel_view_alive(const keel_view *v, keel_entity e)
{
    return v && view_slot(v, e) != NULL;
}

int keel_view_get(const keel_view *v, keel_entity e, keel_component c, void *out)
{
    if (!v)
        return core_fail(KEEL_EINVAL, "keel_view_get: view is NULL");
    const keel_world *w = v->w;
    if (!world_component_valid(w, c))
        return core_fail(KEEL_EINVAL, "keel_view_get: component id %u is not registered", c);
    if (w->comps[c].desc.discipline != KEEL_VERSIONED)
        return not_in_view(w, c, "keel_view_get");
    uint32_t size = w->comps[c].desc.size;
    if (size && !out)
        return core_fail(KEEL_EINVAL, "keel_view_get: out is NULL");
    const world_slot *s = view_slot(v, e);
    if (!s)
        return core_fail(KEEL_ESTALE, "keel_view_get: entity 0x%016llx is not live at tick %llu", (unsigned long long)e,
                         (unsigned long long)v->tick);
    const view_table *vt = &v->tables[s->table];
    uint32_t col = vt->t->col_of[c];
    if (!col)
        return core_fail(KEEL_ENOENT, "keel_view_get: entity 0x%016llx has no component '%s' at tick %llu",
                         (unsigned long long)e, w->comps[c].name, (unsigned long long)v->tick);
    if (size) {
        const view_chunk *vc = &vt->chunks[s->row >> w->chunk_shift];
        memcpy(out, (const char *)vc->cols[col - 1] + (size_t)(s->row & w->chunk_mask) * size, size);
    }
    return KEEL_OK;
}

/* ---- iterating a query over the view ------------------------------------------------
 * The view's tables in creation order -- the order of the query's table
 * list, so the order keel_query_iter gives -- filtered by the query's
 * terms (a table's component set never changes); chunks in row order,
 * empty ones skipped. Tables created after the view was published are not
 * in it. The query itself is only read (its terms, its world): its live
 * table list may grow under a tick meanwhile and is not used. */

/* 0 when q can be iterated over v, else why not (in the last error). Every
 * with-term with data must be VERSIONED; tags and `without` terms ask only
 * about membership, which the view holds for every component. */
static int view_iter_check(const keel_view *v, const keel_query *q)
{
    if (!v || !q)
        return core_fail(KEEL_EINVAL, "keel_view_iter: view or query is NULL");
    const keel_world *w = v->w;
    if (query_world(q) != w)
        return core_fail(KEEL_EINVAL, "keel_view_iter: the query was made on another world than the view's");
    const keel_component *terms = query_terms(q);
    for (uint32_t i = 0; i < KEEL_QUERY_MAX_TERMS && terms[i]; i++)
        if (w->comps[terms[i]].desc.size && w->comps[terms[i]].desc.discipline != KEEL_VERSIONED)
            return not_in_view(w, terms[i], "keel_view_iter");
    return KEEL_OK;
}

void keel_view_iter(const keel_view *v, const keel_query *q, keel_iter *it)
{
    if (!it) {
        core_fail(KEEL_EINVAL, "keel_view_iter: the iterator is NULL");
        return;
    }
    memset(it, 0, sizeof *it);
    it->query_ = q;
    if (view_iter_check(v, q))
        it->table_pos_ = UINT32_MAX; /* past every table: keel_view_next yields nothing */
}

bool keel_view_next(const keel_view *v, keel_iter *it)
{
    if (!it)
        return false;
    const keel_query *q = it->query_;
    if (v && q && query_world(q) == v->w) {
        const keel_component *terms = query_terms(q);
        for (; it->table_pos_ < v->ntables; it->table_pos_++, it->chunk_ = 0) {
            const view_table *vt = &v->tables[it->table_pos_];
            if (!query_matches_table(q, vt->t))
                continue;
            while (it->chunk_ < vt->nchunks) {
                const view_chunk *vc = &vt->chunks[it->chunk_++];
                if (!vc->count)
                    continue;
                it->count = vc->count;
                it->entities = vc->entities;
                for (uint32_t i = 0; i < KEEL_QUERY_MAX_TERMS && terms[i]; i++)
                    it->prev[i] = it->columns[i] = vc->cols[vt->t->col_of[terms[i]] - 1];
                return true;
            }
        }
    }
    it->count = 0;
    return false;
}
