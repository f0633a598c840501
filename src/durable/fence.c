/*
 * durable/fence.c -- the fence: a tick's unit of work becomes WAL records.
 *
 * Engine-Post, after the sync point (the tick's step 4), as a small DAG:
 *   prep      (tick thread) cut the captured groups (txn/uow.c: already in
 *             the TICK_CHUNK group layout, captured on the workers) into an
 *             even number of equal segments of at most about
 *             DUR_RECORD_TARGET bytes, in capture order;
 *   serialize (workers, parallel) each segment's group pieces are copied
 *             into a payload that becomes one TICK_CHUNK record, compressed
 *             with the worker's own zstd context and left unsealed (no LSN
 *             yet);
 *   finalize  (tick thread) LIFECYCLE records of the applied commands, the
 *             TICK_COMMIT marker, and one hand-off to the writer, which
 *             seals the records with consecutive LSNs.
 * Between ticks: a tick's unit with value rows, on two workers or more,
 * with GROUP or DEFERRED durability, is not serialised on the tick. The
 * tick thread cuts the segments, builds the LIFECYCLE records and the
 * marker, queues the unit's item with its LSNs reserved and marked pending
 * (dur_enqueue_reserved), and posts the serialisation to the workers; the
 * step returns. The worker that compresses the last segment seals the
 * TICK_CHUNK records with the first reserved LSNs, puts them before the
 * LIFECYCLE records and the marker, and completes the item
 * (dur_item_complete): the writer takes nothing from a pending item on, so
 * side records and checkpoints queued meanwhile, whose LSNs follow the
 * reserved ones, are written after the tick as before. The next step (and
 * anything else on the tick thread that uses the fence or the unit of
 * work: a hook's or a retry's unit, telemetry, close) joins first
 * (fence_join), helping with what is left.
 * A tick's records reach LMDB in one write transaction, so a tick is on
 * disk whole or not at all; the marker still closes the unit so readers
 * and recovery can check it. on_first_tick's changes form a unit of their
 * own (marker flagged HOOK), queued before any side transaction of the
 * tick can commit, because those may write the entities it spawned.
 *
 * Payloads (docs/wal-format.md): TICK_CHUNK = u32 ngroups, then per group
 * u32 component, u32 size, u32 n, n entity handles (u64), n values;
 * LIFECYCLE = u32 nops, then per op u8 kind, u64 entity and the kind's
 * operands; SIDE = u64 seq, u32 mode, u32 nwrites, then per write u64
 * entity, u32 component, u32 size, value, and with flag KEY a trailing u64
 * idempotency key. TRANSIENT values are logged as zeros: they are not
 * durable.
 *
 * Failpoints between the stages (docs/testing.md): fence.after_prep,
 * fence.after_compress, fence.before_enqueue; they fire for every unit (a
 * tick's, the hook's, a retried sync point's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "durable/durable_internal.h"

_Static_assert((int)WORLD_OP_SPAWN == (int)KW_OP_SPAWN && (int)WORLD_OP_DESTROY == (int)KW_OP_DESTROY &&
                   (int)WORLD_OP_ADD == (int)KW_OP_ADD && (int)WORLD_OP_REMOVE == (int)KW_OP_REMOVE,
               "the lifecycle log's op codes are the WAL's");

/* ---- value rows -> TICK_CHUNK payload ------------------------------------------------ */

/* A position in the unit of work's value rows: a group's index and a row
 * inside it. A segment is [from, to); a group cut by a segment boundary is
 * split into two groups (its first rows end one record, the rest start the
 * next). */
typedef struct fence_pos {
    uint32_t group;
    uint32_t row;
} fence_pos;

typedef struct fence_seg {
    fence_pos from, to;
    size_t raw;                /* the payload's length */
    kw_buf rec;                /* the unsealed record (kept across ticks: no allocation once warm) */
    int rc;
} fence_seg;

/* Rows of group g in the segment s. */
static void seg_piece(const fence_seg *s, const uow_group *g, uint32_t off, uint32_t *lo, uint32_t *hi)
{
    *lo = off == s->from.group ? s->from.row : 0;
    *hi = off == s->to.group ? s->to.row : g->n;
}

/* The TICK_CHUNK payload of segment s: the captured groups are in the
 * payload's layout already, so each piece is a header and two bulk copies
 * (s->raw, reserved up front, is the payload's exact length). */
static int rows_payload(const txn_uow *u, const fence_seg *s, kw_buf *out)
{
    int rc = kw_tick_chunk_begin(out, s->raw);
    uint32_t ngroups = 0;
    for (uint32_t off = s->from.group; !rc && (off < s->to.group || (off == s->to.group && s->to.row)); off++) {
        uow_group g = uow_group_at(u, off);
        uint32_t lo, hi;
        seg_piece(s, &g, off, &lo, &hi);
        rc = kw_tick_chunk_group_put(out, g.component, g.size, hi - lo, g.entities + (size_t)lo * 8,
                                     g.values + (size_t)lo * g.size);
        ngroups++;
    }
    if (!rc)
        kw_tick_chunk_end(out, ngroups);
    return rc;
}

/* ---- parallel serialisation ----------------------------------------------------------- */

typedef struct fence_job {
    dur_state *d;
    uint64_t tick;
    uint32_t flags;
    fence_seg *segs;
} fence_job;

/* The unit posted to the workers (one at a time: the tick thread joins it
 * before it cuts the next). */
typedef struct fence_bg {
    fence_job job;
    uint32_t nseg;
    dur_item *item;            /* queued, pending until finish */
    kw_buf tail;               /* the unit's LIFECYCLE records and marker, sealed */
    uint64_t t0;               /* when the fence started (for fence_done.ns) */
    fence_done done;           /* written by finish, read after the join */
    _Atomic bool posted;       /* a join claims it: a second caller (a misuse: telemetry read off the
                                  stepping thread) must not run the pool's join too */
} fence_bg;

static void serialize_task(void *arg, uint32_t i, uint32_t worker)
{
    fence_job *j = arg;
    fence_seg *s = &j->segs[i];
    dur_state *d = j->d;
    kw_buf *payload = &d->fence_payload[worker % d->ncodec];
    s->rec.len = 0;
    s->rc = rows_payload(&d->txn->uow, s, payload);
    if (!s->rc)
        s->rc = kw_record_build_unsealed(d->codec[worker % d->ncodec], &s->rec, KW_KIND_TICK_CHUNK, j->tick, j->flags,
                                         payload->p, payload->len);
}

/* The next segment slot of d->segs (its record buffer kept), or NULL. */
static fence_seg *seg_slot(dur_state *d, uint32_t n)
{
    return CORE_GROW_ZEROED(d->segs, d->segs_cap, n + 1, 8) ? NULL : &d->segs[n];
}

/* The payload bytes per segment: DUR_RECORD_TARGET at most, and an even
 * number of equal segments when there is more than one, so that the
 * workers (2 on the machines keel is sized for) finish together instead of
 * one compressing a last segment alone while the tick thread waits. A
 * function of the captured rows only: the records are the same whatever
 * the worker count. */
static size_t seg_target(const txn_uow *u, uint32_t from, uint32_t to)
{
    size_t total = 0, row_max = 0;
    for (uint32_t off = from; off < to; off++) {
        uow_group g = uow_group_at(u, off);
        total += UOW_GROUP_HDR + (size_t)g.n * (8 + g.size);
        row_max = 8 + (size_t)g.size > row_max ? 8 + (size_t)g.size : row_max;
    }
    size_t n = (total + DUR_RECORD_TARGET - 1) / DUR_RECORD_TARGET;
    if (n <= 1)
        return DUR_RECORD_TARGET;
    n += n & 1;
    /* slack per segment: its u32 ngroups, the header of a group split at
     * its start, and the row that does not fit at its end -- so the cut
     * does not spill a few rows into one more segment */
    return (total + n - 1) / n + 4 + UOW_GROUP_HDR + row_max;
}

/* Cut the groups of rows [from, to) into segments (d->segs) of about
 * seg_target payload bytes, splitting a group where a segment fills (at
 * least one row per segment). */
static uint32_t cut_segments(dur_state *d, const txn_uow *u, uint32_t from, uint32_t to)
{
    uint32_t n = 0;
    fence_pos start = {from, 0};
    size_t raw = 4, target = seg_target(u, from, to);
    for (uint32_t off = from; off < to; off++) {
        uow_group g = uow_group_at(u, off);
        size_t row_bytes = 8 + (size_t)g.size;
        for (uint32_t r = 0; r < g.n;) {
            size_t room = raw < target ? target - raw : 0;
            size_t fit = room > UOW_GROUP_HDR ? (room - UOW_GROUP_HDR) / row_bytes : 0;
            uint32_t take = fit >= g.n - r ? g.n - r : fit ? (uint32_t)fit : raw > 4 ? 0 : 1;
            if (take) {
                raw += UOW_GROUP_HDR + take * row_bytes;
                r += take;
            }
            if (r < g.n || raw >= target) { /* full: close it here */
                fence_seg *s = seg_slot(d, n++);
                if (!s)
                    return UINT32_MAX;
                s->from = start;
                s->to = start = r < g.n ? (fence_pos){off, r} : (fence_pos){off + 1, 0};
                s->raw = raw;
                raw = 4;
            }
        }
    }
    if (raw > 4) {
        fence_seg *s = seg_slot(d, n++);
        if (!s)
            return UINT32_MAX;
        s->from = start;
        s->to = (fence_pos){to, 0};
        s->raw = raw;
    }
    return n;
}

/* ---- lifecycle -> LIFECYCLE payloads ---------------------------------------------------- */

/* A command's value as logged: TRANSIENT values are not durable (zeros). */
static kw_value put_value(const keel_world *w, keel_component c, const void *value)
{
    const keel_component_desc *d = &w->comps[c].desc;
    return (kw_value){c, d->size, d->discipline == KEEL_TRANSIENT ? NULL : value};
}

static int op_payload(kw_buf *out, const keel_world *w, const world_lifecycle_op *op)
{
    kw_value v[KEEL_MAX_COMPONENTS];
    uint32_t n = 0;
    switch (op->kind) {
    case WORLD_OP_SPAWN: {
        const unsigned char *val = op->values;
        for (; n < op->n; n++) {
            v[n] = put_value(w, op->ids[n], val);
            val += (w->comps[op->ids[n]].desc.size + 7u) & ~7u;
        }
        break;
    }
    case WORLD_OP_ADD:
        v[n++] = put_value(w, op->component, op->values);
        break;
    case WORLD_OP_REMOVE:
        v[n++] = (kw_value){.component = op->component};
        break;
    default:
        break;
    }
    return kw_lifecycle_put_op(out, op->kind, op->entity, n, v);
}

/* Append LIFECYCLE records for the log from offset `from` to out. */
static int lifecycle_records(dur_state *d, kw_codec_ctx *c, size_t from, uint64_t tick, uint32_t flags,
                             kw_buf *scratch, kw_buf *out, uint32_t *nrec, uint64_t *raw)
{
    const world_lifecycle_log *log = &d->txn->uow.lifecycle;
    size_t off = from;
    world_lifecycle_op op;
    int rc = KEEL_OK;
    bool more = world_lifecycle_next(log, &off, &op);
    while (!rc && more) {
        uint32_t nops = 0;
        rc = kw_lifecycle_begin(scratch);
        while (!rc && more && scratch->len < DUR_RECORD_TARGET) {
            rc = op_payload(scratch, d->world, &op);
            nops++;
            more = world_lifecycle_next(log, &off, &op);
        }
        if (rc)
            break;
        kw_lifecycle_end(scratch, nops);
        rc = kw_record_build_unsealed(c, out, KW_KIND_LIFECYCLE, tick, flags, scratch->p, scratch->len);
        (*nrec)++;
        *raw += scratch->len;
    }
    return rc;
}

static int commit_marker(dur_state *d, kw_codec_ctx *c, uint64_t tick, uint32_t flags, uint32_t nrec, kw_buf *out)
{
    unsigned char p[KW_COMMIT_SIZE];
    kw_commit_encode(&(kw_commit_info){nrec, d->world->nlive, d->world->nslots}, p);
    return kw_record_build_unsealed(c, out, KW_KIND_TICK_COMMIT, tick, flags, p, sizeof p);
}

/* The unit's LIFECYCLE records and its TICK_COMMIT marker, appended to out
 * after the unit's first *nrec records (*nrec counts them in, *raw adds
 * their payload bytes). */
static int unit_tail(dur_state *d, uint64_t tick, uint32_t flags, size_t life_from, kw_buf *out, uint32_t *nrec,
                     uint64_t *raw)
{
    kw_buf scratch = {0};
    int rc = lifecycle_records(d, d->codec[0], life_from, tick, flags, &scratch, out, nrec, raw);
    kw_buf_free(&scratch);
    return rc ? rc : commit_marker(d, d->codec[0], tick, flags, *nrec, out);
}

/* Move the unsealed records of segs into item->recs, in order (one
 * allocation: the lifecycle records and the marker usually fit in the
 * slack). */
static int gather(dur_item *item, fence_seg *segs, uint32_t n)
{
    size_t total = 4096;
    for (uint32_t i = 0; i < n; i++) {
        if (segs[i].rc)
            return segs[i].rc;
        total += segs[i].rec.len;
    }
    int rc = kw_buf_reserve(&item->recs, total);
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = kw_put_bytes(&item->recs, segs[i].rec.p, segs[i].rec.len);
    return rc;
}

void fence_fini(dur_state *d)
{
    if (d->fence_bg)
        kw_buf_free(&d->fence_bg->tail);
    free(d->fence_bg);
    d->fence_bg = NULL;
    for (uint32_t i = 0; i < d->segs_cap; i++)
        kw_buf_free(&d->segs[i].rec);
    free(d->segs);
    d->segs = NULL;
    d->segs_cap = 0;
    for (uint32_t i = 0; d->fence_payload && i < d->ncodec; i++)
        kw_buf_free(&d->fence_payload[i]);
    free(d->fence_payload);
    d->fence_payload = NULL;
}

/* ---- between ticks ----------------------------------------------------------------------- */

/* The last segment is done (on its worker): the records into the item in
 * LSN order, then the writer may take it. */
static void bg_finish(void *arg)
{
    fence_bg *bg = arg;
    dur_state *d = bg->job.d;
    dur_item *item = bg->item;
    (void)KEEL_FAILPOINT(FENCE_AFTER_COMPRESS);
    for (uint32_t i = 0; i < bg->nseg; i++)
        if (!bg->job.segs[i].rc)
            kw_record_seal(bg->job.segs[i].rec.p, item->first_lsn + i);
    int rc = gather(item, bg->job.segs, bg->nseg);
    if (!rc)
        rc = kw_put_bytes(&item->recs, bg->tail.p, bg->tail.len);
    if (rc) { /* before the writer can take it: it drops it, and nothing after it commits; the step that
                 posted it has returned, so the cause goes to the log and the next step reports the latch */
        core_log(KEEL_LOG_ERROR, "wal", "fence_failed", "tick=%llu code=%s cause=\"%s\"",
                 (unsigned long long)bg->job.tick, keel_strerror(rc), keel_last_error());
        if (rc != KEEL_EFATAL) /* EFATAL: latched already */
            dur_latch_fatal(d, rc);
    }
    bg->done.stored = item->recs.len;
    bg->done.ns = core_now_ns() - bg->t0;
    (void)KEEL_FAILPOINT(FENCE_BEFORE_ENQUEUE);
    dur_item_complete(d, item);
}

static bool can_post(const dur_state *d, uint32_t flags)
{
    return d->pool.post && d->pool.workers > 1 && d->mode != KEEL_DURABLE_IMMEDIATE && !(flags & KW_FLAG_HOOK);
}

/* Hand a unit of nseg segments (cut already; raw: the unit's payload bytes so far) to the workers. */
static int fence_post(dur_state *d, uint64_t tick, uint32_t nseg, size_t life_from, uint64_t raw, uint64_t t0,
                      uint64_t *lsn)
{
    fence_bg *bg = d->fence_bg;
    if (!bg && !(bg = d->fence_bg = calloc(1, sizeof *bg)))
        return core_fail(KEEL_ENOMEM, "out of memory in the fence");
    uint32_t nrec = nseg;
    bg->tail.len = 0;
    int rc = unit_tail(d, tick, 0, life_from, &bg->tail, &nrec, &raw);
    dur_item *item = rc ? NULL : dur_item_new(DUR_RECORDS, d->mode);
    if (!rc && !item)
        rc = core_fail(KEEL_ENOMEM, "out of memory in the fence");
    if (rc)
        return rc;
    item->tick = tick;
    bg->item = item;
    bg->nseg = nseg;
    bg->t0 = t0;
    bg->job = (fence_job){d, tick, 0, d->segs};
    bg->done = (fence_done){.tick = tick};
    atomic_fetch_add(&d->wal_raw_bytes, raw);
    d->fence_raw_bytes = raw;
    d->fence_stored_bytes = 0; /* known once the workers are done: fence_join */
    if ((rc = dur_enqueue_reserved(d, item, nseg, &bg->tail, raw, lsn)))
        return rc; /* latched fatal or a replica: the item is freed */
    atomic_store(&bg->posted, true);
    core_pool_post(&d->pool, nseg, serialize_task, bg_finish, bg);
    return KEEL_OK;
}

bool fence_posted(const dur_state *d)
{
    return d->fence_bg && atomic_load(&d->fence_bg->posted);
}

bool fence_join(dur_state *d, fence_done *out)
{
    fence_bg *bg = d->fence_bg;
    if (!bg || !atomic_exchange(&bg->posted, false))
        return false;
    core_pool_join(&d->pool);
    d->fence_stored_bytes = bg->done.stored;
    if (out)
        *out = bg->done;
    return true;
}

/* One unit: value rows [rows_from, rows_to), lifecycle from life_from. */
static int fence_unit(dur_state *d, uint64_t tick, uint32_t flags, uint32_t rows_from, uint32_t rows_to,
                      size_t life_from, bool parallel, uint64_t *lsn)
{
    if (d->txn->uow.oom)
        return core_fail(KEEL_ENOMEM, "tick %llu: the unit of work ran out of memory; its changes cannot be logged",
                         (unsigned long long)tick);
    uint64_t t0 = core_now_ns();
    uint32_t nseg = cut_segments(d, &d->txn->uow, rows_from, rows_to);
    if (nseg == UINT32_MAX)
        return core_fail(KEEL_ENOMEM, "out of memory in the fence");
    fence_seg *segs = d->segs;
    uint64_t raw = 0;
    for (uint32_t i = 0; i < nseg; i++)
        raw += segs[i].raw;
    (void)KEEL_FAILPOINT(FENCE_AFTER_PREP);
    if (parallel && nseg && can_post(d, flags))
        return fence_post(d, tick, nseg, life_from, raw, t0, lsn);
    fence_job job = {d, tick, flags, segs};
    if (parallel)
        core_pool_run(&d->pool, nseg, serialize_task, &job);
    else
        for (uint32_t i = 0; i < nseg; i++)
            serialize_task(&job, i, 0);
    (void)KEEL_FAILPOINT(FENCE_AFTER_COMPRESS);
    dur_item *item = dur_item_new(DUR_RECORDS, d->mode);
    uint32_t nrec = nseg;
    int rc = item ? gather(item, segs, nseg) : KEEL_ENOMEM;
    if (!rc)
        rc = unit_tail(d, tick, flags, life_from, &item->recs, &nrec, &raw);
    if (rc) {
        dur_item_free(item);
        return rc;
    }
    if (!(flags & KW_FLAG_HOOK))
        item->tick = tick;
    item->empty_tick = nrec == 0 && !(flags & KW_FLAG_HOOK);
    atomic_fetch_add(&d->wal_raw_bytes, raw);
    d->fence_raw_bytes = raw;
    d->fence_stored_bytes = item->recs.len;
    (void)KEEL_FAILPOINT(FENCE_BEFORE_ENQUEUE);
    return dur_enqueue(d, item, lsn); /* the unit's last LSN: its marker's */
}

void fence_tick_start(dur_state *d)
{
    d->fence_rows_from = d->fence_life_from = 0;
}

int fence_hook(dur_state *d, uint64_t tick)
{
    int rc = fence_unit(d, tick, KW_FLAG_HOOK, 0, d->txn->uow.hook_rows_end, 0, false, NULL);
    d->fence_rows_from = d->txn->uow.ngroups;
    d->fence_life_from = d->txn->uow.lifecycle.len;
    return rc;
}

int fence_retry(dur_state *d, uint64_t tick, bool hook, size_t life_from)
{
    uint64_t lsn = 0;
    int rc = fence_unit(d, tick, hook ? KW_FLAG_HOOK : 0, d->txn->uow.ngroups, d->txn->uow.ngroups, life_from, false,
                        &lsn);
    if (!rc && !hook) /* the retried commands complete the tick: its last marker */
        atomic_store_explicit(&d->tick_lsn, lsn, memory_order_release);
    return rc;
}

int fence_tick(dur_state *d, uint64_t tick)
{
    uint64_t lsn = 0;
    int rc = fence_unit(d, tick, 0, d->fence_rows_from, d->txn->uow.ngroups, d->fence_life_from, true, &lsn);
    if (!rc)
        atomic_store_explicit(&d->tick_lsn, lsn, memory_order_release);
    d->fence_rows_from = d->fence_life_from = 0;
    return rc;
}

/* ---- side transactions -------------------------------------------------------------- */

int fence_side(dur_state *d, uint64_t seq, keel_durability mode, uint64_t tick, size_t side_off, uint64_t *lsn)
{
    const txn_uow *u = &d->txn->uow;
    uow_side s;
    size_t off = side_off, writes;
    if (!uow_next_side(u, &off, &s, &writes))
        return core_fail(KEEL_EINVAL, "side record missing from the unit of work");
    kw_buf *p = &d->side_payload;
    int rc = kw_side_begin(p, seq, (uint32_t)mode, s.nwrites);
    uow_row r;
    for (uint32_t i = 0; !rc && i < s.nwrites && uow_next_side_row(u, &writes, &r); i++)
        rc = kw_side_put_write(p, r.entity, r.component, r.size, r.value);
    uint32_t flags = 0;
    if (!rc)
        rc = kw_side_end(p, s.key, &flags);
    if (!rc)
        rc = dur_enqueue_side(d, mode, tick, flags, p, lsn);
    if (!rc)
        atomic_fetch_add(&d->wal_raw_bytes, p->len);
    return rc;
}

/* ---- schema ------------------------------------------------------------------------- */

int fence_schema_payload(dur_state *d, kw_buf *out)
{
    const keel_world *w = d->world;
    kw_schema s = {.ncomps = w->ncomps, .comps = calloc(w->ncomps ? w->ncomps : 1, sizeof(kw_component))};
    if (!s.comps)
        return core_fail(KEEL_ENOMEM, "out of memory encoding the schema");
    int rc = KEEL_OK;
    for (uint32_t i = 0; i < w->ncomps && !rc; i++) {
        const world_component *c = &w->comps[i + 1];
        kw_component *k = &s.comps[i];
        k->id = i + 1;
        snprintf(k->name, sizeof k->name, "%s", c->name);
        k->size = c->desc.size;
        k->align = c->desc.align;
        k->discipline = c->desc.discipline;
        k->nfields = c->desc.field_count;
        k->fields = calloc(k->nfields ? k->nfields : 1, sizeof *k->fields);
        if (!k->fields) {
            rc = core_fail(KEEL_ENOMEM, "out of memory encoding the schema");
            break;
        }
        for (uint32_t f = 0; f < k->nfields; f++) {
            snprintf(k->fields[f].name, sizeof k->fields[f].name, "%s", c->desc.fields[f].name);
            k->fields[f].type = c->desc.fields[f].type;
            k->fields[f].offset = c->desc.fields[f].offset;
            k->fields[f].count = c->desc.fields[f].count;
        }
    }
    if (!rc)
        rc = kw_schema_encode(&s, out);
    kw_schema_free(&s);
    return rc;
}
