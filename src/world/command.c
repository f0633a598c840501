/*
 * world/command.c -- deferred structural changes: recording and playback.
 *
 * Commands are packed back to back in one growing byte buffer, each record
 * 8-byte aligned:
 *     cmd_hdr | spawn: n component ids (u32, padded to 8) then n values,
 *                      each padded to 8 (zero-filled when given NULL)
 *             | add:   the value, padded to 8
 * `head` is the offset of the first command not yet applied. Playback
 * applies one command at a time in two steps: a prepare step that may fail
 * but changes nothing visible (it may grow capacity: slots, chunks, tables,
 * receipts), then a commit step that cannot fail. `head` moves past a
 * command only after its commit, which is the whole failure policy: a
 * failed command and everything after it stay queued.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "world/world_internal.h"

enum { CMD_SPAWN = 1, CMD_DESTROY, CMD_ADD, CMD_REMOVE };

/* 16 bytes: a spawn's record is written once and read once per entity, so
 * every byte of it is memory traffic of the spawn. */
typedef struct cmd_hdr {
    uint8_t op;
    uint8_t n;            /* spawn: number of initial values */
    uint16_t c;           /* add, remove: the component */
    uint32_t size;        /* bytes of the whole record, a multiple of 8 */
    keel_entity target;   /* destroy, add, remove */
} cmd_hdr;
_Static_assert(sizeof(cmd_hdr) == 16 && KEEL_MAX_COMPONENTS <= UINT8_MAX, "cmd_hdr's n and c hold component counts and ids");

struct keel_cmdbuf {
    keel_world *world;
    unsigned char *buf;
    size_t len, cap, head;
    uint32_t queued;          /* recorded, not yet applied */
    uint32_t applied;         /* applied (or ignored) since reset: names the failing one */
    bool failed;              /* counted in world->pending_cmdbufs */
    keel_entity *created;
    uint32_t created_cap;
    keel_cmd_result res;
};

#define ALIGN8(x) (((x) + 7u) & ~(size_t)7u)

static const char *op_name(uint8_t op)
{
    static const char *names[] = {"?", "spawn", "destroy", "add", "remove"};
    return op <= CMD_REMOVE ? names[op] : "?";
}

int keel_cmdbuf_create(keel_world *w, keel_cmdbuf **out)
{
    if (!w || !out)
        return core_fail(KEEL_EINVAL, "keel_cmdbuf_create: world or out is NULL");
    keel_cmdbuf *cb = calloc(1, sizeof *cb);
    if (!cb)
        return core_fail(KEEL_ENOMEM, "keel_cmdbuf_create: out of memory");
    cb->world = w;
    *out = cb;
    return KEEL_OK;
}

static void set_failed(keel_cmdbuf *cb, bool failed)
{
    if (cb->failed == failed)
        return;
    cb->failed = failed;
    if (failed)
        cb->world->pending_cmdbufs++;
    else
        cb->world->pending_cmdbufs--;
}

void keel_cmdbuf_destroy(keel_cmdbuf *cb)
{
    if (!cb)
        return;
    set_failed(cb, false);
    free(cb->buf);
    free(cb->created);
    free(cb);
}

/* ---- recording ---------------------------------------------------------- */

/* Room for a record of `size` bytes; returns its header or NULL. */
static cmd_hdr *record_alloc(keel_cmdbuf *cb, size_t size, const char *fn)
{
    if (cb->failed) {
        core_fail(KEEL_EBUSY, "%s: the buffer holds commands whose playback failed; retry or discard them first", fn);
        return NULL;
    }
    if (CORE_GROW(cb->buf, cb->cap, cb->len + size, 4096)) {
        core_fail(KEEL_ENOMEM, "%s: out of memory growing the command buffer to %zu bytes", fn,
                  core_grow_cap(cb->cap, cb->len + size, 4096));
        return NULL;
    }
    cmd_hdr *h = (cmd_hdr *)(cb->buf + cb->len);
    memset(h, 0, sizeof *h);
    h->size = (uint32_t)size;
    return h;
}

static void record_commit(keel_cmdbuf *cb, cmd_hdr *h)
{
    cb->len += h->size;
    cb->queued++;
}

/* The error code of a record_alloc that returned NULL. */
static int record_error(const keel_cmdbuf *cb)
{
    return cb->failed ? KEEL_EBUSY : KEEL_ENOMEM;
}

/* Store a value of sz bytes (zeros when value is NULL) padded with zeros
 * to 8 bytes at val; returns the end of the padded value. */
static unsigned char *record_value(unsigned char *val, const void *value, uint32_t sz)
{
    if (sz % 8) /* the padding: zero the last word, then the value covers its start */
        memset(val + ALIGN8(sz) - 8, 0, 8);
    if (sz && value)
        world_cell_copy(val, value, sz);
    else
        memset(val, 0, sz);
    return val + ALIGN8(sz);
}

int keel_cmd_spawn(keel_cmdbuf *cb, const keel_init *inits, uint32_t n)
{
    if (!cb)
        return core_fail(KEEL_EINVAL, "keel_cmd_spawn: buffer is NULL");
    if (n && !inits)
        return core_fail(KEEL_EINVAL, "keel_cmd_spawn: %u initial values but inits is NULL", n);
    if (n > KEEL_MAX_COMPONENTS)
        return core_fail(KEEL_EINVAL, "keel_cmd_spawn: %u initial values, at most %d", n, KEEL_MAX_COMPONENTS);
    const keel_world *w = cb->world;
    world_compset seen = {{0}};
    size_t size = sizeof(cmd_hdr) + ALIGN8((size_t)n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        keel_component c = inits[i].c;
        if (!world_component_valid(w, c))
            return core_fail(KEEL_EINVAL, "keel_cmd_spawn: inits[%u] names unregistered component id %u", i, c);
        if (compset_has(&seen, c))
            return core_fail(KEEL_EINVAL, "keel_cmd_spawn: component '%s' is given twice", w->comps[c].name);
        compset_add(&seen, c);
        size += ALIGN8(w->comps[c].desc.size);
    }
    cmd_hdr *h = record_alloc(cb, size, "keel_cmd_spawn");
    if (!h)
        return record_error(cb);
    h->op = CMD_SPAWN;
    h->n = (uint8_t)n;
    uint32_t *ids = (uint32_t *)(h + 1);
    unsigned char *val = (unsigned char *)h + sizeof(cmd_hdr) + ALIGN8((size_t)n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = inits[i].c;
        val = record_value(val, inits[i].value, w->comps[inits[i].c].desc.size);
    }
    record_commit(cb, h);
    return KEEL_OK;
}

int keel_cmd_destroy(keel_cmdbuf *cb, keel_entity e)
{
    if (!cb)
        return core_fail(KEEL_EINVAL, "keel_cmd_destroy: buffer is NULL");
    cmd_hdr *h = record_alloc(cb, sizeof(cmd_hdr), "keel_cmd_destroy");
    if (!h)
        return record_error(cb);
    h->op = CMD_DESTROY;
    h->target = e;
    record_commit(cb, h);
    return KEEL_OK;
}

static int record_component_op(keel_cmdbuf *cb, uint8_t op, keel_entity e, keel_component c, const void *value,
                               const char *fn)
{
    if (!cb)
        return core_fail(KEEL_EINVAL, "%s: buffer is NULL", fn);
    if (!world_component_valid(cb->world, c))
        return core_fail(KEEL_EINVAL, "%s: component id %u is not registered", fn, c);
    uint32_t sz = op == CMD_ADD ? cb->world->comps[c].desc.size : 0;
    cmd_hdr *h = record_alloc(cb, sizeof(cmd_hdr) + ALIGN8(sz), fn);
    if (!h)
        return record_error(cb);
    h->op = op;
    h->target = e;
    h->c = (uint16_t)c;
    record_value((unsigned char *)(h + 1), value, sz);
    record_commit(cb, h);
    return KEEL_OK;
}

int keel_cmd_add(keel_cmdbuf *cb, keel_entity e, keel_component c, const void *value)
{
    return record_component_op(cb, CMD_ADD, e, c, value, "keel_cmd_add");
}

int keel_cmd_remove(keel_cmdbuf *cb, keel_entity e, keel_component c)
{
    return record_component_op(cb, CMD_REMOVE, e, c, NULL, "keel_cmd_remove");
}

/* ---- playback ----------------------------------------------------------- */

static void copy_row(keel_world *w, world_table *dst, uint32_t dst_row, const world_table *src, uint32_t src_row)
{
    for (uint32_t i = 0; i < dst->ncols; i++) {
        uint32_t scol = src->col_of[dst->cols[i].c];
        if (scol && dst->cols[i].size)
            world_cell_copy(world_cell(w, dst, i, dst_row), world_cell(w, src, scol - 1, src_row), dst->cols[i].size);
    }
}

static void write_value(keel_world *w, world_table *t, uint32_t row, keel_component c, const void *value)
{
    uint32_t col = t->col_of[c] - 1;
    if (t->cols[col].size)
        world_cell_copy(world_cell(w, t, col, row), value, t->cols[col].size);
}

static int reserve_receipt(keel_cmdbuf *cb)
{
    if (CORE_GROW(cb->created, cb->created_cap, cb->res.created_count + 1, 64))
        return core_fail(KEEL_ENOMEM, "out of memory growing the creation receipts");
    return KEEL_OK;
}

static int apply_spawn(keel_cmdbuf *cb, const cmd_hdr *h)
{
    keel_world *w = cb->world;
    const uint32_t *ids = (const uint32_t *)(h + 1);
    world_compset set = {{0}};
    for (uint32_t i = 0; i < h->n; i++)
        compset_add(&set, ids[i]);
    world_table *t;
    int rc = storage_table_get(w, &set, &t);
    if (!rc)
        rc = entity_reserve(w);
    if (!rc)
        rc = storage_reserve_row(w, t);
    if (!rc)
        rc = reserve_receipt(cb);
    if (rc)
        return rc;

    keel_entity e = entity_alloc(w);
    uint32_t row = storage_push_row(w, t, e);
    const unsigned char *val = (const unsigned char *)(h + 1) + ALIGN8((size_t)h->n * sizeof(uint32_t));
    for (uint32_t i = 0; i < h->n; i++) {
        write_value(w, t, row, ids[i], val);
        val += ALIGN8(w->comps[ids[i]].desc.size);
    }
    cb->created[cb->res.created_count++] = e;
    cb->res.spawned++;
    return KEEL_OK;
}

/* The live slot of a command's target, or NULL after counting why not. */
static const world_slot *target_slot(keel_cmdbuf *cb, const cmd_hdr *h)
{
    const world_slot *s = world_slot_of(cb->world, h->target);
    if (s)
        return s;
    if (h->target == KEEL_ENTITY_NULL) {
        cb->res.ignored_null++;
    } else {
        cb->res.ignored_stale++;
        core_log(KEEL_LOG_DEBUG, "cmd", "ignored_stale", "op=%s entity=0x%016llx", op_name(h->op),
                 (unsigned long long)h->target);
    }
    return NULL;
}

static int apply_destroy(keel_cmdbuf *cb, const cmd_hdr *h)
{
    const world_slot *s = target_slot(cb, h);
    if (!s)
        return KEEL_OK;
    keel_world *w = cb->world;
    world_table *t = w->tables[s->table];
    int rc = entity_own_slot(w, KEEL_ENTITY_INDEX(h->target));
    if (!rc)
        rc = storage_reserve_remove(w, t, s->row);
    if (rc)
        return rc;
    storage_remove_row(w, t, s->row);
    entity_free(w, h->target);
    cb->res.destroyed++;
    return KEEL_OK;
}

/* Move the entity of slot s to the table with component set `set`. */
static int move_entity(keel_world *w, const world_slot *s, keel_entity e, const world_compset *set,
                       world_table **dst_out, uint32_t *row_out)
{
    world_table *src = w->tables[s->table], *dst;
    int rc = storage_table_get(w, set, &dst);
    if (!rc)
        rc = storage_reserve_row(w, dst);
    if (!rc)
        rc = storage_reserve_remove(w, src, s->row);
    if (!rc)
        rc = entity_own_slot(w, KEEL_ENTITY_INDEX(e));
    if (rc)
        return rc;
    uint32_t src_row = s->row;
    uint32_t dst_row = storage_push_row(w, dst, e); /* repoints the slot */
    copy_row(w, dst, dst_row, src, src_row);
    storage_remove_row(w, src, src_row);
    *dst_out = dst;
    *row_out = dst_row;
    return KEEL_OK;
}

static int apply_add(keel_cmdbuf *cb, const cmd_hdr *h)
{
    const world_slot *s = target_slot(cb, h);
    if (!s)
        return KEEL_OK;
    keel_world *w = cb->world;
    world_table *t = w->tables[s->table];
    uint32_t row = s->row;
    if (t->col_of[h->c]) {
        /* overwriting a value in place: its column must be writable */
        int rc = version_own_column(w, t, t->chunks[row >> w->chunk_shift], t->col_of[h->c] - 1);
        if (rc)
            return rc;
    } else {
        world_compset set = t->set;
        compset_add(&set, h->c);
        int rc = move_entity(w, s, h->target, &set, &t, &row);
        if (rc)
            return rc;
    }
    write_value(w, t, row, h->c, h + 1);
    cb->res.added++;
    return KEEL_OK;
}

static int apply_remove(keel_cmdbuf *cb, const cmd_hdr *h)
{
    const world_slot *s = target_slot(cb, h);
    if (!s)
        return KEEL_OK;
    keel_world *w = cb->world;
    world_table *t = w->tables[s->table];
    if (!t->col_of[h->c]) {
        cb->res.ignored_absent++;
        return KEEL_OK;
    }
    world_compset set = t->set;
    compset_del(&set, h->c);
    uint32_t row;
    int rc = move_entity(w, s, h->target, &set, &t, &row);
    if (rc)
        return rc;
    cb->res.removed++;
    return KEEL_OK;
}

static int apply_one(keel_cmdbuf *cb, const cmd_hdr *h)
{
    keel_world *w = cb->world;
    if (CORE_UNLIKELY(w->inject_countdown) && --w->inject_countdown == 0)
        return core_fail(w->inject_rc, "injected failure (test hook)");
    switch (h->op) {
    case CMD_SPAWN:   return apply_spawn(cb, h);
    case CMD_DESTROY: return apply_destroy(cb, h);
    case CMD_ADD:     return apply_add(cb, h);
    default:          return apply_remove(cb, h);
    }
}

/* ---- batched destroy: state of a run (see "batched destroy" below) ------ */

/* Per table touched by a run. Bit r - base of `moved` set: the entity now
 * at row r >= base moved there during the run, and src[r - base] is the row
 * its cells are in (see "batched destroy"); rows below base are recorded in
 * the run's fill list instead. */
typedef struct run_table {
    uint64_t *moved;
    uint32_t *src;              /* valid where `moved` has the bit */
    uint32_t base;
    uint32_t nchunks;           /* chunks before the run: those past t->nchunks are freed at the end */
} run_table;

typedef struct run_fill {
    uint32_t table, row, src;
} run_fill;

typedef struct destroy_run {
    run_table *tabs;            /* indexed by table id (w->ntables when the run started) */
    uint32_t ntabs;
    run_fill *fills;
    uint32_t nfills, fills_cap;
    uint32_t retire;            /* retired-list entries the deferred chunk frees need */
} destroy_run;

/* ---- prefetching --------------------------------------------------------
 * Playback of destroys (and adds, removes) that hit rows in random order is
 * bound by cache and TLB misses, each depending on the one before: the
 * target's slot, then its row (entity array, one cell per column), the slot
 * of the table's last entity, which swap-remove moves into the freed row,
 * and the word of the free-slot bitmap. The code of one command is too long
 * for the CPU to overlap the misses of consecutive commands by itself. So
 * playback prefetches in batches of PF_BATCH commands: on reaching a batch
 * it prefetches every target's slot and bitmap word in one short loop,
 * then, in a second loop, reads those slots (the first waits for its miss,
 * the rest have arrived meanwhile) and prefetches the rows they name. A
 * batch's misses are then in flight together instead of one after another.
 * (Measured and not kept: a rolling prefetch k commands ahead, and a
 * pipeline prefetching the next batch while this one applies; both were
 * slower here, docs/performance.md.)
 *
 * These are hints and nothing else: the addresses are formed from the
 * current state with every index bounds-checked, so they are always safe to
 * read, and a command applied in between can only make a hint useless (the
 * row moved), never change what playback does. The order of effects is
 * untouched; tests/test_command.c (playback_batched_equals_one_by_one)
 * checks it against playback one command per apply. Prefetching a NULL
 * column (a tag has no buffer) is harmless: prefetches never fault. */
#define PF_BATCH 32u
/* A batch whose targets all lie within this many slots is left alone: its
 * slots share cache lines and pages, and entities created together have
 * adjacent rows, so the accesses are near-sequential and the hardware
 * prefetcher covers them better than the instructions spent here would
 * (destroying in creation order is the common bulk case). */
#define PF_DENSE_SPAN (4u * PF_BATCH)

/* Prefetch the row a slot names (entity and the first byte of every cell),
 * and the slot of the entity `back` rows from the end of its table: the one
 * the destroy `back` commands from now moves, when the commands in between
 * are destroys in that table. */
static void pf_row(const keel_world *w, const world_slot *s, uint32_t back, const destroy_run *run)
{
    if (s->table >= w->ntables)
        return;
    const world_table *t = w->tables[s->table];
    if (s->row >= t->count)
        return;
    const world_chunk *ch = t->chunks[s->row >> w->chunk_shift];
    size_t off = s->row & w->chunk_mask;
    __builtin_prefetch(&ch->entities[off], 1, 3);
    for (uint32_t i = 0; !run && i < t->ncols; i++) /* a batched destroy touches no cell */
        __builtin_prefetch((const char *)colver_cur(&ch->cols[i]) + off * t->cols[i].size, 1, 3);
    if (back < t->count) {
        uint32_t last = t->count - 1 - back;
        uint32_t moved = KEEL_ENTITY_INDEX(t->chunks[last >> w->chunk_shift]->entities[last & w->chunk_mask]);
        if (moved < w->nslots)
            __builtin_prefetch(world_slot_at(w, moved), 1, 3);
    }
}

/* Prefetch for up to PF_BATCH commands from offset `off`; returns the
 * offset past them. `run`: the commands are a batched destroy run. */
static size_t pf_batch(const keel_cmdbuf *cb, size_t off, const destroy_run *run)
{
    const keel_world *w = cb->world;
    uint32_t idx[PF_BATCH], n = 0, lo = UINT32_MAX, hi = 0;
    for (uint32_t i = 0; i < PF_BATCH && off < cb->len; i++) {
        const cmd_hdr *h = (const cmd_hdr *)(cb->buf + off);
        uint32_t e = KEEL_ENTITY_INDEX(h->target);
        if (h->op != CMD_SPAWN && e < w->nslots) {
            idx[n++] = e;
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
        }
        off += h->size;
    }
    if (n == 0 || hi - lo < PF_DENSE_SPAN)
        return off; /* no targets, or clustered: the hardware prefetcher has them */
    for (uint32_t i = 0; i < n; i++) {
        __builtin_prefetch(world_slot_at(w, idx[i]), 1, 3);
        __builtin_prefetch(&w->free_bits[idx[i] >> 6], 1, 3);
    }
    for (uint32_t i = 0; i < n; i++)
        pf_row(w, world_slot_at(w, idx[i]), i, run);
    return off;
}

/* ---- the lifecycle log -------------------------------------------------
 * When the world has a log attached (the unit of work attaches one for the
 * sync point), every command that playback takes up is copied into it in
 * its recorded format, a spawn's `target` replaced by the created handle.
 * Replaying the log on the state it started from reproduces the same
 * handles, since allocation is a function of the slots. */
static int log_reserve(world_lifecycle_log *log, size_t n)
{
    if (CORE_GROW(log->buf, log->cap, log->len + n, 4096))
        return core_fail(KEEL_ENOMEM, "out of memory growing the lifecycle log");
    return KEEL_OK;
}

static void log_append(world_lifecycle_log *log, const cmd_hdr *h, keel_entity created)
{
    cmd_hdr *copy = (cmd_hdr *)(log->buf + log->len);
    memcpy(copy, h, h->size);
    if (h->op == CMD_SPAWN) {
        copy->target = created;
        if (h->n & 1) /* the id list's padding, never written by recording: the WAL gets fixed bytes */
            ((uint32_t *)(copy + 1))[h->n] = 0;
    }
    log->len += h->size;
    log->count++;
}

bool world_lifecycle_next(const world_lifecycle_log *log, size_t *off, world_lifecycle_op *op)
{
    if (*off >= log->len)
        return false;
    const cmd_hdr *h = (const cmd_hdr *)(log->buf + *off);
    *op = (world_lifecycle_op){.kind = h->op, .entity = h->target, .component = h->c, .n = h->n};
    if (h->op == CMD_SPAWN) {
        op->ids = (const uint32_t *)(h + 1);
        op->values = (const unsigned char *)(h + 1) + ALIGN8((size_t)h->n * sizeof(uint32_t));
    } else if (h->op == CMD_ADD) {
        op->values = (const unsigned char *)(h + 1);
    }
    *off += h->size;
    return true;
}

/* ---- batched destroy ------------------------------------------------------
 * Swap-remove copies a table's last row into the row a destroy frees: one
 * cell per column, each a random cache line when destroys come in random
 * order, and wasted when a later destroy of the same run removes the moved
 * entity again (destroying a whole table moves every entity about once,
 * and keeps none of the copies). So a run of at least RUN_MIN consecutive
 * destroys is replayed on slots and entity arrays only, the way one-by-one
 * playback would change them, and each moved row that survives the run has
 * its cells copied once at the end, from where they were when it started.
 *
 * Why the sources are still there at the end: no cell is written during the
 * run, so an entity's cells stay in the row it held when the run began (its
 * original row) however often it moves. An entity first moves when it is
 * its table's last row: its original row is then count - 1, and count only
 * shrinks, so the original row is at or past the table's final count, while
 * every row copied into is below it: sources and destinations never overlap
 * and the order of the copies does not matter. A moved entity that moves
 * again keeps its original row as source; one destroyed later in the run
 * leaves its row to the next entity moved there (whose source replaces the
 * entry) or past the final count (no copy). Trailing chunks the run empties
 * hold sources, so they are freed only after the copies, the ones one-by-one
 * playback would free, in the same order.
 *
 * Where the source of the entity now at row r is. For rows at or past
 * base = count - (destroys left in the run) when the run first touches the
 * table -- every row a later destroy moves from (the last) is there -- in
 * a side array of rows, with a bit per row (a bitmap a 64th of the entity
 * array's size) saying the entry is set. The entity arrays keep whole
 * handles throughout: they hold the generations (world_internal.h). The
 * array is written at random rows, but a store does not hold up the
 * destroy the way reading a source through the entity array did (measured:
 * keeping the source row in the moved entity's entry, the handle then read
 * from the source row's, took 15 % longer per shuffled destroy). Entries at
 * or past the final count are left: rows past a table's count are dead
 * storage, read by nobody, in one-by-one playback as well. For rows below
 * base (never a last row during the run) the run's fill list, copied in
 * order so the latest entry for a row wins.
 *
 * A command the batched path cannot take exactly as one-by-one playback
 * would -- a chunk or slot page the published view shares (copy-on-write),
 * out of memory -- ends the run before it changes anything; the copies and
 * frees are then done and the rest of the run is played one by one, which
 * keeps the failure policy. The effects on slots, generations, the
 * free-slot bitmap, row order, counters and the lifecycle log are those of
 * one-by-one playback, in its order; tests/test_command.c
 * (playback_batched_equals_one_by_one) checks it. */
#define RUN_MIN 16u
#define RUN_MAX (1u << 20)

/* Consecutive destroys from offset off (at most RUN_MAX); *end: past them. */
static uint32_t run_length(const keel_cmdbuf *cb, size_t off, size_t *end)
{
    uint32_t n = 0;
    while (off < cb->len && n < RUN_MAX) {
        const cmd_hdr *h = (const cmd_hdr *)(cb->buf + off);
        if (h->op != CMD_DESTROY)
            break;
        off += h->size;
        n++;
    }
    *end = off;
    return n;
}

/* True when version_own_chunk(ch) would copy nothing. */
static bool run_chunk_owned(const world_table *t, const world_chunk *ch)
{
    if (ch->pub_entities && ch->entities == ch->pub_entities)
        return false;
    for (uint32_t i = 0; t->versioned && i < t->ncols; i++)
        if (ch->cols[i].pub && colver_cur(&ch->cols[i]) == ch->cols[i].pub)
            return false;
    return true;
}

static bool run_slot_owned(const keel_world *w, uint32_t idx)
{
    uint32_t p = idx >> WORLD_PAGE_SHIFT;
    return w->pages[p] != w->pub_pages[p];
}

/* The run's state for table t, made on first touch (NULL: out of memory);
 * `left` destroys remain in the run, the current one included. */
static run_table *run_table_of(destroy_run *run, const world_table *t, uint32_t left)
{
    run_table *rt = &run->tabs[t->id];
    if (rt->moved)
        return rt;
    uint32_t span = left < t->count ? left : t->count;
    rt->moved = calloc(span / 64 + 1, sizeof *rt->moved);
    rt->src = malloc(((size_t)span + 1) * sizeof *rt->src);
    if (!rt->moved || !rt->src) {
        free(rt->moved);
        free(rt->src);
        *rt = (run_table){0};
        return NULL;
    }
    rt->base = t->count - span;
    rt->nchunks = t->nchunks;
    return rt;
}

static bool run_fill_room(destroy_run *run)
{
    return CORE_GROW(run->fills, run->fills_cap, run->nfills + 1, 256) == KEEL_OK;
}

/* Destroy h's target on slots and entity arrays only. False, with nothing
 * changed, when one-by-one playback would copy a shared buffer here or
 * memory runs out: the run ends before this command. */
static bool run_step(keel_cmdbuf *cb, destroy_run *run, const cmd_hdr *h, uint32_t left)
{
    keel_world *w = cb->world;
    const world_slot *s = world_slot_of(w, h->target);
    if (!s) {
        target_slot(cb, h); /* counts it as ignored */
        return true;
    }
    uint32_t idx = KEEL_ENTITY_INDEX(h->target);
    world_table *t = w->tables[s->table];
    uint32_t row = s->row, last = t->count - 1;
    world_chunk *dst = t->chunks[row >> w->chunk_shift];
    world_chunk *src = t->chunks[last >> w->chunk_shift];
    keel_entity moved = src->entities[last & w->chunk_mask];
    if (!run_slot_owned(w, idx))
        return false;
    if (row != last && (!run_slot_owned(w, KEEL_ENTITY_INDEX(moved)) ||
                        ((row & w->chunk_mask) < dst->pub_count && !run_chunk_owned(t, dst))))
        return false;
    /* room for the chunks freed so far and one more per column, as one-by-one reserves */
    if (version_reserve_retire(w, run->retire + t->ncols * 2 + 2))
        return false;
    run_table *rt = run_table_of(run, t, left);
    if (!rt || (row != last && row < rt->base && !run_fill_room(run)))
        return false;

    if (row != last) {
        uint32_t mi = KEEL_ENTITY_INDEX(moved), from = last, lb = last - rt->base;
        if ((rt->moved[lb >> 6] >> (lb & 63)) & 1) /* moved before: its cells are still where it began */
            from = rt->src[lb];
        entity_slot_w(w, mi)->row = row;
        dst->entities[row & w->chunk_mask] = moved;
        if (row >= rt->base) {
            uint32_t rb = row - rt->base;
            rt->moved[rb >> 6] |= 1ull << (rb & 63);
            rt->src[rb] = from;
        } else {
            run->fills[run->nfills++] = (run_fill){t->id, row, from};
        }
    }
    src->count--;
    t->count--;
    while (t->nchunks >= 2 && t->chunks[t->nchunks - 2]->count == 0) {
        t->nchunks--; /* freed by run_finish, after the copies */
        run->retire += t->ncols + 1;
    }
    entity_free(w, h->target);
    cb->res.destroyed++;
    return true;
}

static void run_copy_row(keel_world *w, const world_table *t, uint32_t to, uint32_t from)
{
    for (uint32_t i = 0; i < t->ncols; i++)
        if (t->cols[i].size)
            memcpy(world_cell(w, t, i, to), world_cell(w, t, i, from), t->cols[i].size);
}

/* The copies into surviving moved rows, then the deferred chunk frees. */
static void run_finish(keel_world *w, destroy_run *run)
{
    for (uint32_t i = 0; i < run->nfills; i++) {
        const run_fill *f = &run->fills[i];
        const world_table *t = w->tables[f->table];
        if (f->row < t->count)
            run_copy_row(w, t, f->row, f->src);
    }
    for (uint32_t id = 0; id < run->ntabs; id++) {
        run_table *rt = &run->tabs[id];
        if (!rt->moved)
            continue;
        world_table *t = w->tables[id];
        for (uint32_t r = rt->base; r < t->count; r++) {
            uint32_t rb = r - rt->base;
            if (!((rt->moved[rb >> 6] >> (rb & 63)) & 1))
                continue;
            run_copy_row(w, t, r, rt->src[rb]);
        }
        while (rt->nchunks > t->nchunks)
            version_free_chunk(w, t, t->chunks[--rt->nchunks]);
        free(rt->moved);
        free(rt->src);
    }
    free(run->tabs);
    free(run->fills);
}

/* Apply up to n destroys from head as a batched run; may apply none. */
static void apply_destroy_run(keel_cmdbuf *cb, uint32_t n)
{
    keel_world *w = cb->world;
    destroy_run run = {.ntabs = w->ntables};
    run.tabs = calloc(w->ntables ? w->ntables : 1, sizeof *run.tabs);
    if (!run.tabs)
        return;
    size_t batch_end = cb->head;
    for (uint32_t left = n; left; left--) {
        if (cb->head >= batch_end)
            batch_end = pf_batch(cb, cb->head, &run);
        const cmd_hdr *h = (const cmd_hdr *)(cb->buf + cb->head);
        if (w->lifecycle && log_reserve(w->lifecycle, h->size))
            break;
        if (!run_step(cb, &run, h, left))
            break;
        if (w->lifecycle) /* the bookkeeping of keel_cmdbuf_apply */
            log_append(w->lifecycle, h, KEEL_ENTITY_NULL);
        w->mutations++;
        cb->head += h->size;
        cb->queued--;
        cb->applied++;
    }
    run_finish(w, &run);
}

int keel_cmdbuf_apply(keel_cmdbuf *cb)
{
    if (!cb)
        return core_fail(KEEL_EINVAL, "keel_cmdbuf_apply: buffer is NULL");
    keel_world *w = cb->world;
    if (w->log_required && !w->lifecycle && !w->restoring && cb->head < cb->len)
        return core_fail(KEEL_EBUSY, "keel_cmdbuf_apply: the world has a data directory and nothing would log these "
                                     "commands; record them in a system or hook (applied at the sync point)");
    size_t batch_end = cb->head; /* commands before it were prefetched */
    size_t plain_until = cb->head; /* commands before it are played one by one */
    while (cb->head < cb->len) {
        if (cb->head >= plain_until && ((const cmd_hdr *)(cb->buf + cb->head))->op == CMD_DESTROY &&
            !w->inject_countdown) {
            uint32_t n = run_length(cb, cb->head, &plain_until);
            if (n >= RUN_MIN) {
                /* what a run that ends early leaves goes one by one */
                apply_destroy_run(cb, n);
                batch_end = cb->head;
                continue;
            }
        }
        if (cb->head >= batch_end)
            batch_end = pf_batch(cb, cb->head, NULL);
        const cmd_hdr *h = (const cmd_hdr *)(cb->buf + cb->head);
        uint32_t spawned = cb->res.created_count;
        int rc = w->lifecycle ? log_reserve(w->lifecycle, h->size) : KEEL_OK;
        if (!rc)
            rc = apply_one(cb, h);
        if (rc) {
            set_failed(cb, true);
            return core_fail_prefix(rc, "keel_cmdbuf_apply: command #%u (%s) failed, it and %u after it stay queued",
                                    cb->applied + 1, op_name(h->op), cb->queued - 1);
        }
        if (w->lifecycle)
            log_append(w->lifecycle, h, cb->res.created_count > spawned ? cb->created[spawned] : KEEL_ENTITY_NULL);
        w->mutations++;
        cb->head += h->size;
        cb->queued--;
        cb->applied++;
    }
    cb->head = cb->len = 0; /* reuse the buffer's memory for the next round */
    set_failed(cb, false);
    return KEEL_OK;
}

void keel_cmdbuf_discard(keel_cmdbuf *cb)
{
    if (!cb)
        return;
    cb->head = cb->len = 0;
    cb->queued = 0;
    set_failed(cb, false);
}

int keel_cmdbuf_reset(keel_cmdbuf *cb)
{
    if (!cb)
        return core_fail(KEEL_EINVAL, "keel_cmdbuf_reset: buffer is NULL");
    if (cb->queued)
        return core_fail(KEEL_EBUSY, "keel_cmdbuf_reset: %u commands are still queued; apply or discard them first",
                         cb->queued);
    memset(&cb->res, 0, sizeof cb->res);
    cb->applied = 0;
    return KEEL_OK;
}

bool cmdbuf_idle(const keel_cmdbuf *cb)
{
    return cb->len == 0 && cb->applied == 0; /* every command applied counts in applied (res follows) */
}

keel_cmd_result keel_cmdbuf_result(const keel_cmdbuf *cb)
{
    if (!cb)
        return (keel_cmd_result){0};
    keel_cmd_result r = cb->res;
    r.created = cb->created;
    r.pending = cb->queued;
    return r;
}
