/*
 * world/world_internal.h -- the world's internal interface: layout of the
 * entity index, archetype tables and chunks, and the entry points other
 * subsystems (commands, queries, the state hash, later the transaction layer,
 * the fence and recovery) use. docs/architecture.md describes the design.
 */
#ifndef KEEL_WORLD_INTERNAL_H
#define KEEL_WORLD_INTERNAL_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "keel/command.h"
#include "keel/query.h"
#include "keel/world.h"

/* ---- component sets ----------------------------------------------------- */

/* A set of component ids as a 256-bit mask (bit 0 unused). */
typedef struct world_compset {
    uint64_t w[4];
} world_compset;

static inline bool compset_has(const world_compset *s, keel_component c)
{
    return (s->w[c >> 6] >> (c & 63)) & 1u;
}
static inline void compset_add(world_compset *s, keel_component c)
{
    s->w[c >> 6] |= 1ull << (c & 63);
}
static inline void compset_del(world_compset *s, keel_component c)
{
    s->w[c >> 6] &= ~(1ull << (c & 63));
}
static inline bool compset_eq(const world_compset *a, const world_compset *b)
{
    return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] && a->w[3] == b->w[3];
}
/* True when every member of sub is in s. */
static inline bool compset_contains(const world_compset *s, const world_compset *sub)
{
    for (int i = 0; i < 4; i++)
        if ((s->w[i] & sub->w[i]) != sub->w[i])
            return false;
    return true;
}
static inline bool compset_disjoint(const world_compset *a, const world_compset *b)
{
    for (int i = 0; i < 4; i++)
        if (a->w[i] & b->w[i])
            return false;
    return true;
}

/* ---- component registry ------------------------------------------------- */

typedef struct world_component {
    keel_component_desc desc;   /* name and fields point into owned copies */
    keel_field *fields;
    char name[KEEL_NAME_MAX + 1];
    char (*field_names)[KEEL_NAME_MAX + 1];
} world_component;

/* ---- storage ------------------------------------------------------------
 * An archetype table holds every entity with exactly one component set. Its
 * rows are dense (0..count-1) and cut into chunks of world->chunk_rows rows:
 * row r lives in chunk r >> chunk_shift at offset r & chunk_mask. A chunk
 * owns one entity array and one separately allocated buffer per column, so a
 * single column of a single chunk can be replaced by a new version with one
 * pointer store. Chunks are the unit of parallel iteration, versioning,
 * dirty tracking and checkpointing. A table's first chunk starts small and
 * doubles until it holds chunk_rows rows, so a table of a few entities does
 * not pay for a full chunk; every later chunk is allocated full.
 *
 * Versions (docs/transactions.md). Each VERSIONED column of a chunk
 * has up to three buffers:
 *   cur  -- the committed value, what the next writer or fresh reader sees;
 *   pub  -- the version in the last published view (the tick-start value,
 *           what snapshot readers and read views see). pub == cur means the
 *           buffer is shared with the view and must not be written: a writer
 *           copies it first (copy-on-write). NULL: never published.
 *   priv -- the private version of the system transaction now writing the
 *           component (at most one: writers of a component are ordered), or
 *           NULL. Tasks of one parallel system install it with a CAS.
 *   spare -- a retired buffer of this column that no view, reader or
 *           checkpoint can reach any more (tentatively so between a
 *           publication and its reader-count check, when no one takes it:
 *           version.c), kept as the target of the next
 *           write (version.c "Recycling"), or NULL. It is never cur, pub or
 *           priv; whoever takes it swaps it out atomically.
 * The entity array follows the same rule (entities / pub_entities), and
 * pub_count is the row count the view holds: rows at or past it are not in
 * the view, so appending there needs no copy. SINGLE_VERSION and TRANSIENT
 * columns are written in place and never published (pub stays NULL). */
typedef struct world_colver {
    _Atomic(void *) cur;      /* atomic: a side transaction may replace it while tasks of its system read it;
                                 a system's commit replaces it under colver_lock (txn/txn.c) */
    void *pub;
    _Atomic(void *) priv;
    _Atomic(void *) spare;    /* atomic: tasks of one system, or a side transaction, may race to take it */
    _Atomic uint8_t changed;  /* in this tick's change set (txn/uow.c) */
    _Atomic uint8_t busy;     /* colver_lock: a private version being made, or a side write applied */
} world_colver;

typedef struct world_chunk {
    uint32_t count;             /* live rows in this chunk */
    uint32_t capacity;          /* rows allocated: chunk_rows, except a table's only chunk may be smaller */
    uint32_t pub_count;         /* rows in the published view */
    uint32_t pub_capacity;      /* capacity when last published: a pub buffer of another size is not recycled */
    keel_entity *entities;      /* capacity handles */
    keel_entity *pub_entities;  /* the published entity array (== entities when shared) */
    world_colver cols[];        /* table->ncols versions (all NULL for tags) */
} world_chunk;

typedef struct world_column {
    keel_component c;
    uint32_t size;
    uint32_t align;
} world_column;

typedef struct world_table {
    uint32_t id;                /* index in world->tables, creation order */
    world_compset set;
    uint32_t ncols;             /* components, in id order */
    world_column *cols;
    uint8_t col_of[KEEL_MAX_COMPONENTS + 1]; /* component id -> column index + 1, 0 = absent */
    uint32_t count;             /* rows */
    uint32_t nchunks;           /* allocated chunks (the last may be empty) */
    bool versioned;             /* some column is VERSIONED (and has data) */
    uint32_t chunk_cap;
    world_chunk **chunks;
    /* buffers allocated ahead for the next full-size chunks, column by
     * column (storage.c "Column-major reservation"): reserve[i * STORAGE_RESERVE
     * + k] is column i's buffer for the k-th reserved chunk (i == ncols: the
     * entity array), k < reserve_len; those below reserve_next were handed out */
    void **reserve;
    uint32_t reserve_next, reserve_len;
} world_table;

/* ---- entity index -------------------------------------------------------
 * One slot per index ever used. A live slot names its table and row; the
 * handle in that row of the table's entity array (the chunk's `entities`)
 * holds its generation, so a slot is 8 bytes and the index 16 per entity
 * with the entity array (docs/performance.md, "memory"). A free slot has
 * table == WORLD_NO_TABLE and `row` holds the generation its next occupant
 * will get. Free slots are found lowest-index-first through a two-level
 * bitmap, which makes allocation a pure function of the slots. Slots live
 * in pages of WORLD_PAGE_SLOTS so that a published view can share the pages
 * that did not change; a page shared with the view (pages[p] ==
 * pub_pages[p]) is copied before it is written, like a VERSIONED column.
 *
 * Invariant: the row a live slot names holds its entity's handle. Playback
 * writes the entity array and the slot in the same step, the batched
 * destroy included (its source rows live in a side array, command.c). */
#define WORLD_NO_TABLE UINT32_MAX
#define WORLD_PAGE_SHIFT 10u
#define WORLD_PAGE_SLOTS (1u << WORLD_PAGE_SHIFT)

typedef struct world_slot {
    uint32_t table;             /* WORLD_NO_TABLE: free */
    uint32_t row;               /* live: the row in its table; free: the next occupant's generation */
} world_slot;

typedef struct world_query_link world_query_link;
typedef struct world_lifecycle_log world_lifecycle_log;

struct keel_world {
    uint32_t chunk_rows, chunk_shift, chunk_mask;
    uint32_t max_entities;
    bool frozen;

    world_component comps[KEEL_MAX_COMPONENTS + 1]; /* [0] unused */
    uint32_t ncomps;

    world_slot **pages;           /* slot pages; npages * WORLD_PAGE_SLOTS >= nslots */
    world_slot **pub_pages;       /* the pages of the published view (NULL: never published) */
    uint32_t npages, pages_cap;
    uint32_t nslots;              /* indices ever used (high-water mark) */
    uint64_t *free_bits;          /* bit i set: slot i free (i < nslots) */
    uint64_t *free_summary;       /* bit j set: free_bits[j] != 0 */
    uint32_t free_words_cap;      /* capacity of free_bits in words (a multiple of 64) */
    uint32_t free_hint;           /* no summary word below this one is non-zero */
    uint32_t nlive;

    world_table **tables;
    uint32_t ntables, tables_cap;
    uint32_t *table_map;          /* open addressing: compset -> table id, UINT32_MAX empty */
    uint32_t table_map_cap;       /* power of two */
    uint32_t table_last;          /* the table storage_table_get found last: playback repeats a set */

    keel_query **queries;         /* live queries, told about new tables */
    uint32_t nqueries, queries_cap;

    uint32_t pending_cmdbufs;     /* buffers left pending by a failed playback */

    /* Versioning (world/version.c). retired:
     * buffers of the published view that the live world no longer uses,
     * freed with that view. mutations counts changes made outside a
     * transaction (keel_set, playback), so the runtime knows when the view
     * is behind. in_tick: systems are running; direct keel_set is refused. */
    bool in_tick;
    uint64_t mutations;
    void **retired;
    uint32_t nretired, retired_cap;
    world_lifecycle_log *lifecycle; /* when set, playback appends what it applied (txn/uow.c) */
    /* Durability (keel/durability.h): with a data directory, changes that
     * nothing would log (keel_set, command buffers applied by hand between
     * ticks) are refused; recovery sets `restoring` while it replays. */
    bool log_required;
    bool restoring;

    /* Test hook (world_test_inject_failure): countdown to an injected failure. */
    uint32_t inject_countdown;
    int inject_rc;
};

/* ---- internal entry points ---------------------------------------------- */

static inline world_slot *world_slot_at(const keel_world *w, uint32_t idx)
{
    return &w->pages[idx >> WORLD_PAGE_SHIFT][idx & (WORLD_PAGE_SLOTS - 1)];
}

/* The handle stored in row `row` of table `table`. */
static inline keel_entity world_entity_at(const keel_world *w, uint32_t table, uint32_t row)
{
    const world_table *t = w->tables[table];
    return t->chunks[row >> w->chunk_shift]->entities[row & w->chunk_mask];
}

/* The generation of slot s: a live slot's entity's, a free slot's next. */
static inline uint32_t world_slot_gen(const keel_world *w, const world_slot *s)
{
    return s->table == WORLD_NO_TABLE ? s->row : KEEL_ENTITY_GEN(world_entity_at(w, s->table, s->row));
}

/* Slot of a live handle, or NULL for null/stale/foreign handles. Read-only:
 * a slot is written through entity_slot_w after entity_own_slot. The row
 * holds a handle of the slot's index, so comparing whole handles compares
 * generations. */
static inline const world_slot *world_slot_of(const keel_world *w, keel_entity e)
{
    uint32_t idx = KEEL_ENTITY_INDEX(e);
    if (idx >= w->nslots)
        return NULL;
    const world_slot *s = world_slot_at(w, idx);
    if (s->table == WORLD_NO_TABLE || world_entity_at(w, s->table, s->row) != e)
        return NULL;
    return s;
}

static inline bool world_component_valid(const keel_world *w, keel_component c)
{
    return c >= 1 && c <= w->ncomps;
}

/* The committed version of a chunk column. acquire: a side commit may have
 * just replaced it by a copy (colver_set_cur), whose bytes the reader must
 * see (free on x86, where every load is an acquire). */
static inline void *colver_cur(const world_colver *v)
{
    return atomic_load_explicit(&((world_colver *)v)->cur, memory_order_acquire);
}

static inline void colver_set_cur(world_colver *v, void *p)
{
    atomic_store_explicit(&v->cur, p, memory_order_release);
}

/* A chunk column's own short lock. It orders what may meet on one chunk
 * column during a tick: a system transaction making its private version
 * (copy `cur`, publish `priv`) or committing it (cur = priv, the old one
 * freed after), a side commit writing a row into `cur` and, when there is
 * one, into `priv`, and a side read of `cur` by a system that reads the
 * component's snapshot beside its writer (txn/txn.c, txn/side.c).
 * Held for one chunk column's copy at most, so it spins; it yields after a
 * while, in case the holder's thread was preempted. acquire/release: what
 * one holder wrote, the next one reads. */
static inline void colver_lock(world_colver *v)
{
    for (uint32_t spins = 0; atomic_exchange_explicit(&v->busy, 1, memory_order_acquire);)
        while (atomic_load_explicit(&v->busy, memory_order_relaxed)) {
            if (++spins % 4096 == 0)
                sched_yield();
            else
                core_cpu_relax();
        }
}

static inline void colver_unlock(world_colver *v)
{
    atomic_store_explicit(&v->busy, 0, memory_order_release);
}

/* Copy one cell. The common component sizes get a fixed-size copy the
 * compiler inlines: a call into the C library's memcpy costs more than the
 * copy itself, and swap-remove and replay make one per row. */
static inline void world_cell_copy(void *dst, const void *src, uint32_t size)
{
    switch (size) {
    case 4:  memcpy(dst, src, 4); break;
    case 8:  memcpy(dst, src, 8); break;
    case 12: memcpy(dst, src, 12); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, size); break;
    }
}

static inline void *world_cell(const keel_world *w, const world_table *t, uint32_t col, uint32_t row)
{
    const world_chunk *ch = t->chunks[row >> w->chunk_shift];
    return (char *)colver_cur(&ch->cols[col]) + (size_t)(row & w->chunk_mask) * t->cols[col].size;
}

static inline bool world_col_versioned(const keel_world *w, const world_table *t, uint32_t col)
{
    return t->cols[col].size && w->comps[t->cols[col].c].desc.discipline == KEEL_VERSIONED;
}

/* entity.c: the slot allocator. */
int entity_reserve(keel_world *w);                  /* ensure one allocation can succeed (owns its page) */
keel_entity entity_alloc(keel_world *w);            /* after entity_reserve: cannot fail */
void entity_free(keel_world *w, keel_entity e);     /* frees e's slot, e's generation bumped; page owned */
/* Can the index hold n slots? KEEL_ENOSPC naming max_entities if not. */
int entity_slots_fit(const keel_world *w, uint32_t n);
/* An empty index given slots 0..n-1, every one free with gens[i] the
 * generation its next occupant gets (0 read as 1): what n allocations and
 * n frees leave, in one pass. KEEL_ENOSPC past max_entities, KEEL_ENOMEM. */
int entity_restore(keel_world *w, uint32_t n, const uint32_t *gens);
void entity_index_fini(keel_world *w);
/* Make the page of slot idx writable (copy it when the view shares it).
 * Inline: every destroy asks twice, and the page is nearly always owned. */
int entity_copy_page(keel_world *w, uint32_t page);
static inline int entity_own_slot(keel_world *w, uint32_t idx)
{
    uint32_t p = idx >> WORLD_PAGE_SHIFT;
    return w->pages[p] != w->pub_pages[p] ? KEEL_OK : entity_copy_page(w, p);
}
/* A slot for writing: its page must be owned (entity_own_slot). */
static inline world_slot *entity_slot_w(keel_world *w, uint32_t idx)
{
    return world_slot_at(w, idx);
}

/* storage.c: archetype tables. Every "reserve" step may fail and mutates
 * nothing visible; the "commit" step that follows cannot fail. */
int storage_table_get(keel_world *w, const world_compset *set, world_table **out);
/* Room for one more row, with the chunk it lands in writable. */
int storage_reserve_row(keel_world *w, world_table *t);
/* Make removing row `row` unable to fail: its chunk and the slot of the row
 * that will move into it are writable afterwards. */
int storage_reserve_remove(keel_world *w, world_table *t, uint32_t row);
/* Append a row for e (after storage_reserve_row); returns its row index.
 * Column values are left uninitialised: the caller fills every column. */
uint32_t storage_push_row(keel_world *w, world_table *t, keel_entity e);
/* Swap-remove row `row`, fixing the slot of the row moved into its place. */
void storage_remove_row(keel_world *w, world_table *t, uint32_t row);
void storage_fini(keel_world *w);

/* A cache-line aligned buffer for `rows` values of `size` bytes, of
 * storage_column_bytes(rows, size) bytes (rounded up to 64). */
void *storage_column_alloc(uint32_t rows, uint32_t size);
size_t storage_column_bytes(uint32_t rows, uint32_t size);

/* version.c: copy-on-write of shared buffers, retirement, publication. */
/* Make column col of chunk ch writable in place (copy it if the view shares
 * it). Only VERSIONED columns are ever shared; others return at once. */
int version_own_column(keel_world *w, const world_table *t, world_chunk *ch, uint32_t col);
/* Make every shared VERSIONED column and the entity array of ch writable. */
int version_own_chunk(keel_world *w, const world_table *t, world_chunk *ch);
/* A buffer the live world stopped using: freed now when the view does not
 * hold it, else with the view (never fails: the list is grown ahead). */
void version_drop(keel_world *w, void *buf, const void *pub);
int version_grow_retired(keel_world *w, uint32_t n);
static inline int version_reserve_retire(keel_world *w, uint32_t n)
{
    return w->nretired + n <= w->retired_cap ? KEEL_OK : version_grow_retired(w, n);
}
/* Free a chunk's buffers (retiring those the view holds). */
void version_free_chunk(keel_world *w, const world_table *t, world_chunk *ch);
/* Recycling (version.c): a buffer for a new version of column v -- its
 * spare when it has one, else a fresh allocation (NULL: out of memory). */
void *version_new_buffer(world_colver *v, uint32_t rows, uint32_t size);
/* Give back a buffer that nobody but the caller can reach: it becomes v's
 * spare, or is freed when v already has one. */
void version_put_spare(world_colver *v, void *buf);
/* Free v's spare, if any (single-threaded: the chunk is changing shape or
 * going away, or publication trims an unused spare). */
void version_free_spare(world_colver *v);
/* Publication found readers: move every spare to the retired list (room
 * reserved by the caller), since those buffers may still be in their view. */
void version_revoke_spares(keel_world *w);
/* Free every spare now (keel_runtime_release_memory, between ticks);
 * returns their bytes. */
uint64_t version_release_spares(keel_world *w);

/* component.c */
void component_fini(keel_world *w);

/* query.c: a new table may match live queries. */
int query_on_new_table(keel_world *w, world_table *t);

/* A non-empty chunk a query visits: the unit parallel systems split. */
typedef struct world_chunk_ref {
    uint32_t table;
    uint32_t chunk;
    uint32_t rows;              /* rows visited, from `first` */
    uint32_t first;             /* first row visited (0 but for an entity-budgeted visit) */
} world_chunk_ref;

/* Write up to cap of the query's non-empty chunks, in iteration order, to
 * out; returns how many there are (call again with more room if > cap). */
uint32_t query_chunk_refs(const keel_query *q, world_chunk_ref *out, uint32_t cap);
/* The chunk keel_iter_next last stopped at, and a query's with-terms. */
world_chunk_ref query_iter_ref(const keel_iter *it);
const keel_component *query_terms(const keel_query *q);
/* The world q was made on, and whether table t holds q's entities. Both
 * read only what never changes once the query and the table exist, so a
 * read view's iteration (txn/view.c) calls them beside a running tick. */
const keel_world *query_world(const keel_query *q);
bool query_matches_table(const keel_query *q, const world_table *t);
/* Point it at one chunk, as keel_iter_next would. */
void query_iter_chunk(const keel_query *q, world_chunk_ref ref, keel_iter *it);

/* command.c: the lifecycle log (see command.c). */
struct world_lifecycle_log {
    unsigned char *buf;
    size_t len, cap;
    uint32_t count;             /* commands logged */
};

enum { WORLD_OP_SPAWN = 1, WORLD_OP_DESTROY, WORLD_OP_ADD, WORLD_OP_REMOVE };

/* One logged command, decoded. spawn: entity = the created handle, n
 * components `ids` with their values (each padded to 8 bytes) at `values`;
 * add: `component` and its value at `values`; destroy/remove: the target. */
typedef struct world_lifecycle_op {
    uint32_t kind;
    keel_entity entity;
    keel_component component;
    uint32_t n;
    const uint32_t *ids;
    const unsigned char *values;
} world_lifecycle_op;

/* Decode the record at *off and advance; false at the end. */
bool world_lifecycle_next(const world_lifecycle_log *log, size_t *off, world_lifecycle_op *op);

/* restore.c: rebuilding from a checkpoint (empty world only). begin
 * creates nslots free slots with the given generations; tables are then
 * recreated in id order; rows appended in row order (values per column,
 * NULL = zeros). */
int world_restore_begin(keel_world *w, uint32_t nslots, const uint32_t *gens);
/* Asked before building the gens of nslots slots: KEEL_ENOSPC as begin would give it. */
int world_restore_fits(const keel_world *w, uint32_t nslots);
int world_restore_table(keel_world *w, const keel_component *comps, uint32_t n, uint32_t expect_id);
/* Append n rows to table (< ntables): entities packed as u64 little-endian
 * (unaligned), values per table column n packed values (NULL = zeros). On
 * an error the rows before the culprit are restored, values and all. */
int world_restore_rows(keel_world *w, uint32_t table, uint32_t n, const unsigned char *entities,
                       const void *const *values);
/* The rows the last replayed group resolved its handles to, for the next
 * group with the same handles (restore.c). Valid while no row moves: reset
 * it (entities = NULL) before each record's groups. Zero = empty. */
typedef struct world_replay_memo {
    const unsigned char *entities; /* the handles resolved (in the record), NULL: none */
    uint32_t n, cap;
    world_slot *at;                /* their tables and rows */
} world_replay_memo;

/* Replay of a logged row group, between ticks: the n packed values (size
 * bytes each, size = the component's) of component c written to the n
 * entities (u64 little-endian, unaligned), in order -- what n keel_set calls
 * do, in two passes over the group. KEEL_OK; or KEEL_ESTALE / KEEL_ENOENT (no
 * such live entity, or it has no c) / KEEL_ENOMEM with a sentence naming the
 * entity; rows before it may be written. */
int world_replay_rows(keel_world *w, world_replay_memo *memo, keel_component c, uint32_t size, uint32_t n,
                      const unsigned char *entities, const unsigned char *values);
void world_replay_memo_free(world_replay_memo *memo);

/* command.c: whether a buffer holds nothing since its last reset -- no
 * command queued, none applied, so its result is all zeros: the sync point
 * skips it without touching the rest of it. */
bool cmdbuf_idle(const keel_cmdbuf *cb);

/* Test hook: the nth command application from now (1 = the next) fails with
 * rc before it mutates anything; nth = 0 disables. Every command that
 * playback takes up counts, including those it then ignores (stale targets). */
void world_test_inject_failure(keel_world *w, uint32_t nth, int rc);

#endif
