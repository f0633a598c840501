/*
 * txn/uow.c -- the unit of work: one tick's change set.
 *
 * The fence (the durability layer) serialises what this collects:
 *   value rows  -- after the user tracks, before the sync point: for each
 *                  chunk column a committed system transaction changed
 *                  first (hook, then systems in execution order, so the
 *                  order does not depend on the worker count), the rows
 *                  whose bytes differ from the tick-start version and
 *                  those side transactions wrote this tick (VERSIONED:
 *                  "rows side transactions wrote" below), or every row
 *                  (SINGLE_VERSION: no older version to compare with).
 *                  Values cannot change at the
 *                  sync point, so these are the tick's final values of
 *                  every entity that survives it.
 *   lifecycle   -- the commands the sync point applied, in order
 *                  (world_lifecycle_log, recorded by command playback).
 *   side records -- each side transaction's after-images, in commit order.
 * Value rows are stored as groups, one per captured chunk column, already
 * in the TICK_CHUNK payload's group layout (docs/wal-format.md: u32
 * component, u32 size, u32 n, n entity handles, n values), so the fence
 * serialises a segment with a few bulk copies instead of a walk per row.
 * Side records are {seq u64, tick u64, mode u32, nwrites u32} followed by
 * nwrites row records {entity u64, component u32, size u32, value padded
 * to 8}.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "txn/txn_internal.h"

typedef struct row_hdr {
    keel_entity entity;
    keel_component component;
    uint32_t size;
} row_hdr;

typedef struct side_hdr {
    uint64_t seq;
    uint64_t tick;
    uint32_t mode;
    uint32_t nwrites;
    uint64_t key;
} side_hdr;

#define PAD8(x) (((size_t)(x) + 7u) & ~(size_t)7u)

static int buf_reserve(unsigned char **buf, size_t *cap, size_t len, size_t n)
{
    if (CORE_GROW(*buf, *cap, len + n, 65536))
        return core_fail(KEEL_ENOMEM, "out of memory growing the unit of work");
    return KEEL_OK;
}

static void put_row(unsigned char *dst, keel_entity e, keel_component c, uint32_t size, const void *value)
{
    row_hdr h = {e, c, size};
    memcpy(dst, &h, sizeof h);
    memcpy(dst + sizeof h, value, size);
    memset(dst + sizeof h + size, 0, PAD8(size) - size);
}

/* ---- value rows ------------------------------------------------------------------- */

/* Nonzero when bytes [0, n) of a and b differ, n a multiple of 4: the
 * words' XORs ORed together, no branch per word. Inlined with a constant n,
 * it is a few loads; a memcmp call per 12-byte row costs more than that. */
static inline uint64_t bytes_differ(const unsigned char *a, const unsigned char *b, size_t n)
{
    uint64_t x = 0, p, q;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&p, a + i, 8), memcpy(&q, b + i, 8);
        x |= p ^ q;
    }
    if (i < n) {
        uint32_t p4, q4;
        memcpy(&p4, a + i, 4), memcpy(&q4, b + i, 4);
        x |= p4 ^ q4;
    }
    return x;
}

/* The changed rows of a column of size-byte rows (size a multiple of 4),
 * four rows at a time first: when a tick changes a tenth of the rows or
 * fewer, most blocks of four are unchanged and cost one test instead of
 * four compares and four index stores (docs/performance.md, "Design
 * measurements"). */
static inline uint32_t changed_rows_words(const unsigned char *old, const unsigned char *now, uint32_t size,
                                          uint32_t count, uint32_t *idx)
{
    uint32_t n = 0, r = 0;
    for (; r + 4 <= count; r += 4) {
        const unsigned char *a = old + (size_t)r * size, *b = now + (size_t)r * size;
        if (!bytes_differ(a, b, 4 * (size_t)size))
            continue;
        for (uint32_t k = 0; k < 4; k++) {
            idx[n] = r + k;
            n += bytes_differ(a + (size_t)k * size, b + (size_t)k * size, size) != 0;
        }
    }
    for (; r < count; r++) {
        idx[n] = r;
        n += bytes_differ(old + (size_t)r * size, now + (size_t)r * size, size) != 0;
    }
    return n;
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* changed_rows_words for 12-byte rows (pos, vel: the common case) in SSE2:
 * four rows are three 16-byte compares of 32-bit words, whose 12 "equal"
 * bits fold into one bit per row (words 3j..3j+2 are row j's), then the
 * changed rows' indices are stored without a branch per row. */
static uint32_t changed_rows12(const unsigned char *old, const unsigned char *now, uint32_t count, uint32_t *idx)
{
    uint32_t n = 0, r = 0;
    for (; r + 4 <= count; r += 4, old += 48, now += 48) {
        unsigned eq = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(
                          _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)old), _mm_loadu_si128((const __m128i *)now)))) |
                      (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(
                          _mm_loadu_si128((const __m128i *)(old + 16)), _mm_loadu_si128((const __m128i *)(now + 16)))))
                          << 4 |
                      (unsigned)_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(
                          _mm_loadu_si128((const __m128i *)(old + 32)), _mm_loadu_si128((const __m128i *)(now + 32)))))
                          << 8;
        unsigned ne = eq ^ 0xfffu;
        if (!ne)
            continue;
        unsigned t = ne | ne >> 1 | ne >> 2; /* bit 3j: row j differs */
        for (uint32_t j = 0; j < 4; j++) {
            idx[n] = r + j;
            n += (t >> (3 * j)) & 1;
        }
    }
    for (; r < count; r++, old += 12, now += 12) {
        idx[n] = r;
        n += bytes_differ(old, now, 12) != 0;
    }
    return n;
}
#endif

/* Pass 1 of a chunk column's capture: the indices of the rows to log
 * (VERSIONED: those whose bytes differ from the tick-start version). */
static uint32_t changed_rows(const unsigned char *old, const unsigned char *now, uint32_t size, uint32_t count,
                             uint32_t *idx)
{
    uint32_t n = 0;
    if (!old) {
        for (uint32_t r = 0; r < count; r++)
            idx[r] = r;
        return count;
    }
    switch (size) { /* the common sizes get loops with constant bounds */
    case 4: return changed_rows_words(old, now, 4, count, idx);
    case 8: return changed_rows_words(old, now, 8, count, idx);
#if defined(__SSE2__)
    case 12: return changed_rows12(old, now, count, idx);
#else
    case 12: return changed_rows_words(old, now, 12, count, idx);
#endif
    case 16: return changed_rows_words(old, now, 16, count, idx);
    default:
        for (uint32_t r = 0; r < count; r++) {
            idx[n] = r;
            n += memcmp(old + (size_t)r * size, now + (size_t)r * size, size) != 0;
        }
        return n;
    }
}

static int uow_grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
    return core_grow(p, cap, need, elem, 16, false);
}

/* ---- rows side transactions wrote ----------------------------------------------------
 *
 * A side transaction's SIDE record precedes the tick's records in the log,
 * and a system after it may set a row it wrote back to the row's tick-start
 * value: comparing with the tick-start version would then log nothing, and
 * recovery would keep the side transaction's value. So a chunk column the
 * capture logs always logs the rows side transactions wrote this tick,
 * changed or not (their values now are the state after the tick either
 * way). Rows move only at the sync point, after the capture, so a side
 * write's row is still where it was written. */

static int cell_cmp(const void *a, const void *b)
{
    const uow_cell *x = a, *y = b;
    if (x->table != y->table)
        return x->table < y->table ? -1 : 1;
    if (x->chunk != y->chunk)
        return x->chunk < y->chunk ? -1 : 1;
    if (x->col != y->col)
        return x->col < y->col ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* The cells of this tick's side writes into u->cells, sorted. */
static int side_cells(txn_uow *u, const keel_world *w)
{
    size_t off = 0, woff;
    uow_side sd;
    uow_row r;
    u->ncells = 0;
    while (uow_next_side(u, &off, &sd, &woff))
        for (uint32_t i = 0; i < sd.nwrites && uow_next_side_row(u, &woff, &r); i++) {
            const world_slot *slot = world_slot_of(w, r.entity);
            const world_table *t = slot ? w->tables[slot->table] : NULL;
            if (!t || !r.size || !t->col_of[r.component])
                continue;
            if (uow_grow((void **)&u->cells, &u->cells_cap, u->ncells + 1, sizeof *u->cells))
                return KEEL_ENOMEM;
            u->cells[u->ncells++] = (uow_cell){slot->table, slot->row >> w->chunk_shift,
                                               t->col_of[r.component] - 1, slot->row & w->chunk_mask};
        }
    if (u->ncells > 1)
        qsort(u->cells, u->ncells, sizeof *u->cells, cell_cmp);
    return KEEL_OK;
}

/* The side-written rows of chunk column tc merged into wb->idx[0, n) (both
 * ascending; a row in both counts once): the new count, or UINT32_MAX when
 * out of memory. */
static uint32_t with_side_rows(uow_wbuf *wb, const txn_uow *u, txn_touch tc, uint32_t n)
{
    uow_cell key = {tc.table, tc.chunk, tc.col, 0};
    uint32_t lo = 0, hi = u->ncells;
    while (lo < hi) { /* the first cell of tc */
        uint32_t mid = lo + (hi - lo) / 2;
        if (cell_cmp(&u->cells[mid], &key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const uow_cell *c = u->cells + lo, *cend = c; /* tc's cells: [c, cend) */
    while (cend < u->cells + u->ncells && cend->table == tc.table && cend->chunk == tc.chunk && cend->col == tc.col)
        cend++;
    if (c == cend)
        return n;
    if (wb->merged_cap < wb->idx_cap) {
        uint32_t *p = realloc(wb->merged, (size_t)wb->idx_cap * sizeof *p);
        if (!p)
            return UINT32_MAX;
        wb->merged = p;
        wb->merged_cap = wb->idx_cap;
    }
    uint32_t m = 0, i = 0;
    while (i < n || c < cend) {
        uint32_t row = i < n && (c == cend || wb->idx[i] <= c->row) ? wb->idx[i++] : (c++)->row;
        if (!m || wb->merged[m - 1] != row) /* a row in both, or written twice: once */
            wb->merged[m++] = row;
    }
    uint32_t *t = wb->idx;
    wb->idx = wb->merged;
    wb->merged = t;
    uint32_t cap = wb->idx_cap;
    wb->idx_cap = wb->merged_cap;
    wb->merged_cap = cap;
    return m;
}

/* One chunk column: its changed rows become one group in the TICK_CHUNK
 * layout (docs/wal-format.md): u32 component, u32 size, u32 n, n entities,
 * n values, appended to the capturing worker's buffer wb. The fence then
 * copies whole runs of groups into payloads. Returns the group's reference
 * (n = 0: nothing changed; buf = UOW_REF_OOM: out of memory). */
static uow_ref capture_chunk(uow_wbuf *wb, uint32_t wi, const txn_uow *u, const keel_world *w, txn_touch tc)
{
    const world_table *t = w->tables[tc.table];
    const world_chunk *ch = t->chunks[tc.chunk];
    const world_colver *v = &ch->cols[tc.col];
    uint32_t size = t->cols[tc.col].size;
    keel_component c = t->cols[tc.col].c;
    const unsigned char *now = colver_cur(v);
    const unsigned char *old = w->comps[c].desc.discipline == KEEL_VERSIONED ? v->pub : NULL;
    uow_ref oom = {UOW_REF_OOM, 0, 0};
    if (ch->count > wb->idx_cap) {
        uint32_t *p = realloc(wb->idx, (size_t)ch->count * sizeof *p);
        if (!p)
            return oom;
        wb->idx = p;
        wb->idx_cap = ch->count;
    }
    uint32_t n = changed_rows(old, now, size, ch->count, wb->idx);
    if (old && u->ncells && (n = with_side_rows(wb, u, tc, n)) == UINT32_MAX)
        return oom;
    if (!n)
        return (uow_ref){wi, 0, 0};
    if (buf_reserve(&wb->p, &wb->cap, wb->len, UOW_GROUP_HDR + (size_t)n * (8 + size)))
        return oom;
    unsigned char *g = wb->p + wb->len;
    kw_group_header_put(g, c, size, n);
    unsigned char *ents = g + UOW_GROUP_HDR, *vals = ents + (size_t)n * 8;
    const uint32_t *idx = wb->idx;
    for (uint32_t i = 0; i < n; i++)
        memcpy(ents + (size_t)i * 8, &ch->entities[idx[i]], 8);
    if (size == 12)
        for (uint32_t i = 0; i < n; i++)
            memcpy(vals + (size_t)i * 12, now + (size_t)idx[i] * 12, 12);
    else
        for (uint32_t i = 0; i < n; i++)
            memcpy(vals + (size_t)i * size, now + (size_t)idx[i] * size, size);
    uow_ref r = {wi, n, wb->len};
    wb->len += UOW_GROUP_HDR + (size_t)n * (8 + size);
    return r;
}

/* The capture of a list of chunk columns (touches), one task each, on the
 * workers: task i writes its group into its worker's own buffer and its
 * reference into groups[base + i], so no two tasks share anything; the
 * references are then compacted in touch order on the caller. The groups'
 * content and order depend on the touches only, not on which worker
 * captured what, so the WAL is the same whatever the worker count. */
typedef struct capture_job {
    txn_uow *u;
    const keel_world *w;
    uint32_t base;
} capture_job;

static void capture_task(void *arg, uint32_t i, uint32_t worker)
{
    capture_job *j = arg;
    j->u->groups[j->base + i] = capture_chunk(&j->u->wbuf[worker], worker, j->u, j->w, j->u->flat[i]);
}

/* On the pool, a touch is captured by the worker whose task wrote it, while
 * the caches nearest that worker's CPU may still hold its rows: flat's
 * indices are grouped by the touches' workers (by_worker), worker w's group
 * is its home range (core/ranges.c), and a worker with an empty home steals.
 * The pool's index is then a ticket, not a touch: the pool makes exactly
 * nflat calls and every call claims exactly one touch (a claim fails only
 * once all nflat are claimed -- ranges only shrink during the job, so a
 * steal's scan that finds every range empty means all are -- by the other
 * nflat - 1 calls, at most one each: impossible); were it ever to fail, the
 * touch's slot keeps the UOW_REF_OOM capture_lists put there and the unit
 * is refused, not logged incomplete. Where a group lands still depends on
 * its touch's place in flat only, so the WAL is the same whoever captured
 * what. */
static void capture_home_task(void *arg, uint32_t ticket, uint32_t worker)
{
    capture_job *j = arg;
    txn_uow *u = j->u;
    uint32_t home = UINT32_MAX;
    (void)ticket;
    uint32_t k = core_range_claim(u->homes, u->nhomes, &home, worker);
    if (k != UINT32_MAX) /* always (see above) */
        capture_task(arg, u->by_worker[k], worker);
}

/* by_worker and the homes of capture_home_task for `workers` workers (their
 * room is made with flat's and wbuf's, in capture_lists). */
static void group_by_worker(txn_uow *u, uint32_t workers)
{
    uint32_t *end = u->home_end;
    memset(end, 0, (size_t)workers * sizeof *end);
    for (uint32_t i = 0; i < u->nflat; i++) /* counts, then each part's end */
        end[u->flat[i].worker % workers]++;
    for (uint32_t w = 1; w < workers; w++)
        end[w] += end[w - 1];
    for (uint32_t i = u->nflat; i-- > 0;) /* backwards: each part keeps flat's order */
        u->by_worker[--end[u->flat[i].worker % workers]] = i;
    for (uint32_t w = 0; w < workers; w++) /* end[w] is now part w's start */
        core_range_set(&u->homes[w], end[w], w + 1 < workers ? end[w + 1] : u->nflat);
    u->nhomes = workers;
}

/* Collect the durable touches of lists[0..nlists) into flat; *rows gets
 * the rows they hold (the work to do). */
static int flatten(txn_uow *u, const keel_world *w, const txn_vec *const *lists, uint32_t nlists, size_t *rows)
{
    u->nflat = 0;
    *rows = 0;
    for (uint32_t l = 0; l < nlists; l++) {
        const txn_vec *changes = lists[l];
        if (uow_grow((void **)&u->flat, &u->flat_cap, u->nflat + changes->n, sizeof *u->flat) ||
            uow_grow((void **)&u->by_worker, &u->by_worker_cap, u->nflat + changes->n, sizeof *u->by_worker))
            return KEEL_ENOMEM;
        for (uint32_t i = 0; i < changes->n; i++) {
            txn_touch tc = changes->v[i];
            const world_table *t = w->tables[tc.table];
            if (w->comps[t->cols[tc.col].c].desc.discipline == KEEL_TRANSIENT)
                continue;
            u->flat[u->nflat++] = tc;
            *rows += t->chunks[tc.chunk]->count;
        }
    }
    return KEEL_OK;
}

/* Capture the touches of lists, in order (parallel when there is enough). */
static void capture_lists(txn_state *ts, const txn_vec *const *lists, uint32_t nlists)
{
    txn_uow *u = &ts->uow;
    size_t rows;
    if (u->oom)
        return;
    uint32_t workers = ts->pool.workers ? ts->pool.workers : 1;
    if (uow_grow((void **)&u->wbuf, &u->nwbuf, workers, sizeof *u->wbuf) ||
        uow_grow((void **)&u->homes, &u->homes_cap, workers, sizeof *u->homes) ||
        uow_grow((void **)&u->home_end, &u->home_end_cap, workers, sizeof *u->home_end) ||
        flatten(u, ts->world, lists, nlists, &rows) || side_cells(u, ts->world) ||
        uow_grow((void **)&u->groups, &u->groups_cap, u->ngroups + u->nflat, sizeof *u->groups)) {
        u->oom = true;
        return;
    }
    for (uint32_t i = u->nwbuf_used; i < u->nwbuf; i++)
        u->wbuf[i] = (uow_wbuf){0};
    u->nwbuf_used = u->nwbuf;
    capture_job job = {u, ts->world, u->ngroups};
    if (rows >= UOW_PARALLEL_ROWS && workers > 1) {
        group_by_worker(u, workers);
        for (uint32_t i = 0; i < u->nflat; i++)
            u->groups[job.base + i] = (uow_ref){UOW_REF_OOM, 0, 0};
        core_pool_run(&ts->pool, u->nflat, capture_home_task, &job);
    } else
        for (uint32_t i = 0; i < u->nflat; i++)
            capture_task(&job, i, 0);
    for (uint32_t i = 0; i < u->nflat; i++) {
        uow_ref r = u->groups[job.base + i];
        if (r.buf == UOW_REF_OOM)
            u->oom = true;
        else if (r.n) {
            u->groups[u->ngroups++] = r;
            u->nrows += r.n;
        }
    }
}

void uow_capture_changes(txn_state *ts, const txn_vec *changes)
{
    if (ts->uow.capture)
        capture_lists(ts, &changes, 1);
}

const txn_vec **uow_lists(txn_uow *u, uint32_t n)
{
    return uow_grow((void **)&u->lists, &u->lists_cap, n, sizeof *u->lists) ? NULL : u->lists;
}

void uow_capture(txn_state *ts, const txn_vec **lists, uint32_t n)
{
    txn_uow *u = &ts->uow;
    if (!u->capture)
        return;
    if (!lists && n)
        u->oom = true;
    else
        capture_lists(ts, lists, n);
    if (u->oom)
        core_log(KEEL_LOG_ERROR, "txn", "uow_capture_oom", "tick=%llu",
                 (unsigned long long)atomic_load_explicit(&ts->running_tick, memory_order_relaxed));
}

void uow_reset(txn_uow *u)
{
    for (uint32_t i = 0; i < u->nwbuf_used; i++)
        u->wbuf[i].len = 0;
    u->ngroups = 0;
    u->hook_rows_end = 0;
    u->nrows = 0;
    u->lifecycle.len = 0;
    u->lifecycle.count = 0;
    u->side_len = 0;
    u->nside = 0;
    u->oom = false;
}

void uow_fini(txn_uow *u)
{
    for (uint32_t i = 0; i < u->nwbuf_used; i++) {
        free(u->wbuf[i].p);
        free(u->wbuf[i].idx);
        free(u->wbuf[i].merged);
    }
    free(u->wbuf);
    free(u->groups);
    free(u->flat);
    free(u->by_worker);
    free(u->homes);
    free(u->home_end);
    free(u->lists);
    free(u->cells);
    free(u->lifecycle.buf);
    free(u->side);
    *u = (txn_uow){0};
}

bool uow_next_row(const txn_uow *u, size_t *off, uow_row *out)
{
    size_t g = *off & UOW_OFF_MASK, i = *off >> UOW_ROW_SHIFT;
    if (g >= u->ngroups)
        return false;
    uow_group h = uow_group_at(u, (uint32_t)g);
    *out = (uow_row){0, h.component, h.size, h.values + i * h.size};
    memcpy(&out->entity, h.entities + i * 8, 8);
    *off = i + 1 < h.n ? g | (i + 1) << UOW_ROW_SHIFT : g + 1;
    return true;
}

/* ---- side records ------------------------------------------------------------------ */

int uow_side_reserve(txn_uow *u, uint32_t nwrites, uint32_t value_bytes)
{
    size_t n = sizeof(side_hdr) + (size_t)nwrites * sizeof(row_hdr) + PAD8(value_bytes);
    return buf_reserve(&u->side, &u->side_cap, u->side_len, n);
}

void uow_side_begin(txn_uow *u, uint64_t seq, uint64_t tick, keel_durability mode, uint32_t nwrites, uint64_t key)
{
    side_hdr h = {seq, tick, (uint32_t)mode, nwrites, key};
    memcpy(u->side + u->side_len, &h, sizeof h);
    u->side_len += sizeof h;
    u->nside++;
}

void uow_side_write(txn_uow *u, keel_entity e, keel_component c, uint32_t size, const void *value)
{
    put_row(u->side + u->side_len, e, c, size, value);
    u->side_len += sizeof(row_hdr) + PAD8(size);
}

bool uow_next_side(const txn_uow *u, size_t *off, uow_side *out, size_t *writes_off)
{
    if (*off >= u->side_len)
        return false;
    side_hdr h;
    memcpy(&h, u->side + *off, sizeof h);
    *out = (uow_side){h.seq, h.tick, (keel_durability)h.mode, h.nwrites, h.key};
    *off += sizeof h;
    *writes_off = *off;
    for (uint32_t i = 0; i < h.nwrites; i++) {
        row_hdr r;
        memcpy(&r, u->side + *off, sizeof r);
        *off += sizeof r + PAD8(r.size);
    }
    return true;
}

bool uow_next_side_row(const txn_uow *u, size_t *off, uow_row *out)
{
    if (*off >= u->side_len)
        return false;
    row_hdr h;
    memcpy(&h, u->side + *off, sizeof h);
    *out = (uow_row){h.entity, h.component, h.size, u->side + *off + sizeof h};
    *off += sizeof h + PAD8(h.size);
    return true;
}
