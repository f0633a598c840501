/*
 * txn/side.c -- side transactions: optimistic, row-versioned, committed on
 * their own (the economy's trades and purchases).
 *
 * Row versions. A side commit takes the next sequence number and stamps
 * every (entity, component) it writes with it in a hash map; a row never
 * written by a side transaction this tick has version 0. A read records the
 * row's version; commit re-reads every recorded version and refuses
 * (KEEL_ECONFLICT, nothing applied) when one moved. Side transactions live
 * inside one system run (closures: inside Engine-Pre), and the sync point
 * is the only place rows move, so versions only need to live for a tick:
 * the map is emptied at tick end by bumping its epoch.
 *
 * Everything a side transaction does to shared state -- reading a value and
 * its version, validating, applying -- happens under side_lock, which
 * makes commits serialisable in lock order. Applying writes into a VERSIONED
 * chunk the published view shares first replaces `cur` by a copy (readers
 * holding the old pointer read the unchanged tick-start version), then
 * writes the committed buffer and, when the enclosing system transaction
 * already has a private version of that chunk, the private version too, so
 * the system's commit does not undo it (each row is written under the chunk
 * column's colver_lock, which txn.c takes around creating a private
 * version, for that reason).
 *
 * Failpoints (docs/testing.md): side.before_enqueue (applied and visible,
 * its record not yet queued) and side.before_wait (queued, before the
 * committer waits or hands out its ticket), in every commit path.
 */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "txn/txn_internal.h"

/* ---- row versions --------------------------------------------------------------- */

typedef struct rowver_slot {
    keel_entity e;
    keel_component c;
    uint32_t epoch;     /* valid when equal to the map's epoch */
    uint64_t ver;
} rowver_slot;

struct txn_rowvers {
    rowver_slot *slots;
    uint32_t cap, n;    /* cap: power of two; n: valid entries */
    uint32_t epoch;
};

static uint32_t rowver_hash(keel_entity e, keel_component c)
{
    return (uint32_t)core_mix64(e * 0x9e3779b97f4a7c15ull ^ c);
}

static rowver_slot *rowver_find(const txn_rowvers *m, keel_entity e, keel_component c)
{
    uint32_t mask = m->cap - 1;
    for (uint32_t i = rowver_hash(e, c) & mask;; i = (i + 1) & mask) {
        rowver_slot *s = &m->slots[i];
        if (s->epoch != m->epoch || (s->e == e && s->c == c))
            return s;
    }
}

static uint64_t rowver_get(const txn_rowvers *m, keel_entity e, keel_component c)
{
    if (!m->n)
        return 0;
    const rowver_slot *s = rowver_find(m, e, c);
    return s->epoch == m->epoch ? s->ver : 0;
}

/* Room for `extra` more entries at most half full. */
static int rowver_reserve(txn_rowvers *m, uint32_t extra)
{
    if ((m->n + extra) * 2 <= m->cap)
        return KEEL_OK;
    uint32_t cap = m->cap ? m->cap : 256;
    while ((m->n + extra) * 2 > cap)
        cap *= 2;
    rowver_slot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return core_fail(KEEL_ENOMEM, "out of memory growing the side transactions' row versions");
    txn_rowvers old = *m;
    m->slots = slots;
    m->cap = cap;
    m->epoch = 1; /* calloc: every slot has epoch 0, i.e. empty */
    for (uint32_t i = 0; i < old.cap; i++) {
        if (old.slots[i].epoch != old.epoch)
            continue;
        rowver_slot *s = rowver_find(m, old.slots[i].e, old.slots[i].c);
        *s = old.slots[i];
        s->epoch = 1;
    }
    free(old.slots);
    return KEEL_OK;
}

static void rowver_set(txn_rowvers *m, keel_entity e, keel_component c, uint64_t ver)
{
    rowver_slot *s = rowver_find(m, e, c);
    if (s->epoch != m->epoch)
        m->n++;
    *s = (rowver_slot){e, c, m->epoch, ver};
}

int side_init(txn_state *ts)
{
    ts->rowvers = calloc(1, sizeof *ts->rowvers);
    if (!ts->rowvers)
        return core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory");
    ts->rowvers->epoch = 1;
    keys_init(&ts->keys, 0);
    return KEEL_OK;
}

void side_fini(txn_state *ts)
{
    keys_fini(&ts->keys);
    if (ts->rowvers)
        free(ts->rowvers->slots);
    free(ts->rowvers);
    ts->rowvers = NULL;
}

void side_tick_end(txn_state *ts)
{
    txn_rowvers *m = ts->rowvers;
    if (!m->n)
        return;
    m->n = 0;
    if (++m->epoch == 0) { /* wrapped: clear for real */
        memset(m->slots, 0, (size_t)m->cap * sizeof *m->slots);
        m->epoch = 1;
    }
}

/* ---- the transaction object ----------------------------------------------------- */

#define SIDE_INLINE 8
#define SIDE_INLINE_BYTES 256

typedef struct side_read {
    keel_entity e;
    keel_component c;
    uint64_t ver;
} side_read;

typedef struct side_write {
    keel_entity e;
    keel_component c;
    uint32_t off;       /* value offset in vals */
} side_write;

struct keel_side_txn {
    txn_state *ts;
    txn_part *part;             /* the task it was opened in (NULL: a closure) */
    keel_side_txn *next_open;
    const txn_access *acc;    /* NULL: every component */
    const char *name;           /* the system, for messages */
    keel_durability mode;
    uint64_t key;               /* idempotency key, 0 = none */
    side_read *reads;
    side_write *writes;
    unsigned char *vals;
    uint32_t nreads, reads_cap, nwrites, writes_cap, vlen, vcap;
    side_read reads_inline[SIDE_INLINE];
    side_write writes_inline[SIDE_INLINE];
    alignas(8) unsigned char vals_inline[SIDE_INLINE_BYTES];
};

static int side_new(txn_state *ts, keel_durability mode, keel_side_txn **out)
{
    if (mode < KEEL_DURABLE_DEFAULT || mode > KEEL_DURABLE_DEFERRED)
        return core_fail(KEEL_EINVAL, "side transaction: durability mode %d is not a keel_durability", (int)mode);
    keel_side_txn *tx = malloc(sizeof *tx);
    if (!tx)
        return core_fail(KEEL_ENOMEM, "side transaction: out of memory");
    memset(tx, 0, offsetof(keel_side_txn, reads_inline));
    tx->ts = ts;
    tx->mode = mode ? mode : ts->durability;
    tx->reads = tx->reads_inline;
    tx->writes = tx->writes_inline;
    tx->vals = tx->vals_inline;
    tx->reads_cap = tx->writes_cap = SIDE_INLINE;
    tx->vcap = SIDE_INLINE_BYTES;
    *out = tx;
    return KEEL_OK;
}

static void side_free(keel_side_txn *tx)
{
    if (tx->part) { /* unlink from the task's open list */
        keel_side_txn **pp = &tx->part->open;
        while (*pp && *pp != tx)
            pp = &(*pp)->next_open;
        if (*pp)
            *pp = tx->next_open;
    }
    if (tx->reads != tx->reads_inline)
        free(tx->reads);
    if (tx->writes != tx->writes_inline)
        free(tx->writes);
    if (tx->vals != tx->vals_inline)
        free(tx->vals);
    free(tx);
}

/* Grow one of the transaction's arrays (inline storage first). */
static int grow(void **arr, void *inline_arr, uint32_t *cap, size_t elem, uint32_t need)
{
    if (need <= *cap)
        return KEEL_OK;
    uint32_t cap2 = *cap * 2;
    while (cap2 < need)
        cap2 *= 2;
    void *p = *arr == inline_arr ? malloc((size_t)cap2 * elem) : realloc(*arr, (size_t)cap2 * elem);
    if (!p)
        return core_fail(KEEL_ENOMEM, "side transaction: out of memory");
    if (*arr == inline_arr)
        memcpy(p, inline_arr, (size_t)*cap * elem);
    *arr = p;
    *cap = cap2;
    return KEEL_OK;
}

int keel_side_txn_begin(keel_ctx *ctx, keel_durability mode, keel_side_txn **out)
{
    if (!ctx || !out)
        return core_fail(KEEL_EINVAL, "keel_side_txn_begin: context or out is NULL");
    if (!ctx->part || !ctx->acc)
        return core_fail(KEEL_EINVAL, "keel_side_txn_begin: '%s' runs without a system transaction", ctx->name);
    keel_side_txn *tx = NULL;
    int rc = side_new(ctx->txn, mode, &tx);
    if (rc)
        return rc;
    tx->part = ctx->part;
    tx->acc = ctx->acc;
    tx->name = ctx->name;
    tx->next_open = ctx->part->open;
    ctx->part->open = tx;
    *out = tx;
    return KEEL_OK;
}

int side_begin_full(txn_state *ts, keel_durability mode, keel_side_txn **out)
{
    int rc = side_new(ts, mode, out);
    if (!rc)
        (*out)->name = "submitted closure";
    return rc;
}

void txn_close_sides(txn_part *p)
{
    while (p->open) {
        core_log(KEEL_LOG_WARN, "txn", "side_txn_left_open", "system=%s", p->open->name);
        keel_side_txn_abort(p->open); /* counts it in counts.aborts and unlinks it */
    }
}

/* ---- reads and writes ------------------------------------------------------------ */

/* Locate e's component c for a side transaction. write: the component must
 * be writable by it. */
static int side_locate(keel_side_txn *tx, keel_entity e, keel_component c, const void *buf, bool write,
                       const char *fn, world_table **t, uint32_t *row, uint32_t *col)
{
    if (!tx)
        return core_fail(KEEL_EINVAL, "%s: transaction is NULL", fn);
    keel_world *w = tx->ts->world;
    if (!world_component_valid(w, c))
        return core_fail(KEEL_EINVAL, "%s: component id %u is not registered", fn, c);
    const char *cname = w->comps[c].name;
    if (write) {
        if (tx->acc && !compset_has(&tx->acc->write, c) && !compset_has(&tx->acc->side, c))
            return core_fail(KEEL_EINVAL, "%s: system '%s' declares neither writes('%s') nor side_writes('%s')", fn,
                             tx->name, cname, cname);
        if (w->comps[c].desc.discipline == KEEL_TRANSIENT)
            return core_fail(KEEL_EINVAL, "%s: component '%s' is TRANSIENT: side transactions write durable state",
                             fn, cname);
    } else if (tx->acc && !compset_has(&tx->acc->read, c) && !compset_has(&tx->acc->write, c) &&
               !compset_has(&tx->acc->side, c)) {
        return core_fail(KEEL_EINVAL, "%s: system '%s' does not declare component '%s' in its access", fn, tx->name,
                         cname);
    }
    if (!buf && w->comps[c].desc.size)
        return core_fail(KEEL_EINVAL, "%s: value buffer is NULL", fn);
    const world_slot *s = world_slot_of(w, e);
    if (!s)
        return core_fail(KEEL_ESTALE, "%s: entity 0x%016llx is null, stale or foreign", fn, (unsigned long long)e);
    *t = w->tables[s->table];
    *row = s->row;
    if (!(*t)->col_of[c])
        return core_fail(KEEL_ENOENT, "%s: entity 0x%016llx has no component '%s'", fn, (unsigned long long)e, cname);
    *col = (*t)->col_of[c] - 1;
    return KEEL_OK;
}

static const side_write *own_write(const keel_side_txn *tx, keel_entity e, keel_component c)
{
    for (uint32_t i = tx->nwrites; i-- > 0;)
        if (tx->writes[i].e == e && tx->writes[i].c == c)
            return &tx->writes[i];
    return NULL;
}

int keel_side_get(keel_side_txn *tx, keel_entity e, keel_component c, void *out)
{
    world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = side_locate(tx, e, c, out, false, "keel_side_get", &t, &row, &col);
    if (rc)
        return rc;
    uint32_t size = t->cols[col].size;
    const side_write *mine = own_write(tx, e, c);
    if (mine) {
        memcpy(out, tx->vals + mine->off, size);
        return KEEL_OK;
    }
    if ((rc = grow((void **)&tx->reads, tx->reads_inline, &tx->reads_cap, sizeof *tx->reads, tx->nreads + 1)))
        return rc;
    txn_state *ts = tx->ts;
    pthread_mutex_lock(&ts->side_lock);
    if (size) { /* the column's lock: a writer of the component may commit now (a snapshot reader's side read) */
        world_colver *v = &t->chunks[row >> ts->world->chunk_shift]->cols[col];
        colver_lock(v);
        memcpy(out, world_cell(ts->world, t, col, row), size);
        colver_unlock(v);
    }
    tx->reads[tx->nreads++] = (side_read){e, c, rowver_get(ts->rowvers, e, c)};
    pthread_mutex_unlock(&ts->side_lock);
    return KEEL_OK;
}

int keel_side_set(keel_side_txn *tx, keel_entity e, keel_component c, const void *value)
{
    world_table *t = NULL;
    uint32_t row = 0, col = 0;
    int rc = side_locate(tx, e, c, value, true, "keel_side_set", &t, &row, &col);
    if (rc)
        return rc;
    uint32_t size = t->cols[col].size;
    const side_write *mine = own_write(tx, e, c);
    if (mine) {
        memcpy(tx->vals + mine->off, value, size);
        return KEEL_OK;
    }
    uint32_t padded = (size + 7u) & ~7u;
    if ((rc = grow((void **)&tx->writes, tx->writes_inline, &tx->writes_cap, sizeof *tx->writes, tx->nwrites + 1)) ||
        (rc = grow((void **)&tx->vals, tx->vals_inline, &tx->vcap, 1, tx->vlen + padded)))
        return rc;
    memcpy(tx->vals + tx->vlen, value, size);
    tx->writes[tx->nwrites++] = (side_write){e, c, tx->vlen};
    tx->vlen += padded;
    return KEEL_OK;
}

int keel_side_txn_set_key(keel_side_txn *tx, uint64_t key)
{
    if (!tx)
        return core_fail(KEEL_EINVAL, "keel_side_txn_set_key: transaction is NULL");
    tx->key = key;
    return KEEL_OK;
}

void keel_side_txn_abort(keel_side_txn *tx)
{
    if (!tx)
        return;
    pthread_mutex_lock(&tx->ts->side_lock);
    tx->ts->counts.aborts++;
    pthread_mutex_unlock(&tx->ts->side_lock);
    side_free(tx);
}

/* ---- commit ----------------------------------------------------------------------- */

/* Under side_lock: the first read whose row moved, or -1. */
static int64_t first_conflict(const keel_side_txn *tx)
{
    for (uint32_t i = 0; i < tx->nreads; i++)
        if (rowver_get(tx->ts->rowvers, tx->reads[i].e, tx->reads[i].c) != tx->reads[i].ver)
            return i;
    return -1;
}

/* Under side_lock: make every write applicable without failure (copies of
 * shared chunks, room for row versions, for the key and for the
 * after-image record). */
static int prepare_apply(keel_side_txn *tx)
{
    txn_state *ts = tx->ts;
    keel_world *w = ts->world;
    for (uint32_t i = 0; i < tx->nwrites; i++) {
        const world_slot *s = world_slot_of(w, tx->writes[i].e);
        if (!s)
            return core_fail(KEEL_ECONFLICT, "side transaction: entity 0x%016llx was destroyed before the commit",
                             (unsigned long long)tx->writes[i].e);
        world_table *t = w->tables[s->table];
        int rc = version_own_column(w, t, t->chunks[s->row >> w->chunk_shift], t->col_of[tx->writes[i].c] - 1);
        if (rc)
            return rc;
    }
    int rc = rowver_reserve(ts->rowvers, tx->nwrites);
    if (!rc && tx->key)
        rc = keys_reserve(&ts->keys, 1);
    return rc ? rc : uow_side_reserve(&ts->uow, tx->nwrites, tx->vlen);
}

static void apply_one(keel_side_txn *tx, const side_write *wr, uint64_t seq)
{
    keel_world *w = tx->ts->world;
    const world_slot *s = world_slot_of(w, wr->e);
    world_table *t = w->tables[s->table];
    uint32_t col = t->col_of[wr->c] - 1, size = t->cols[col].size;
    world_colver *v = &t->chunks[s->row >> w->chunk_shift]->cols[col];
    size_t off = (size_t)(s->row & w->chunk_mask) * size;
    colver_lock(v); /* against a system task making its private version now (txn.c) */
    memcpy((char *)colver_cur(v) + off, tx->vals + wr->off, size);
    void *priv = atomic_load_explicit(&v->priv, memory_order_acquire);
    if (priv)
        memcpy((char *)priv + off, tx->vals + wr->off, size);
    colver_unlock(v);
    rowver_set(tx->ts->rowvers, wr->e, wr->c, seq);
    uow_side_write(&tx->ts->uow, wr->e, wr->c, size, tx->vals + wr->off);
}

/* Under side_lock: KEEL_EALREADY when the transaction's key committed
 * within the window (*held: the commit that holds it). Checked before the
 * read set: a transaction that already committed applies nothing, whatever
 * it read. */
static int key_check(keel_side_txn *tx, uint64_t tick, txn_key *held)
{
    if (!tx->key)
        return KEEL_OK;
    keys_expire(&tx->ts->keys, tick);
    const txn_key *e = keys_find(&tx->ts->keys, tx->key, tick);
    if (e)
        *held = *e;
    return e ? KEEL_EALREADY : KEEL_OK;
}

/* Validate, apply and log; out tells the caller what was logged and what
 * to wait for per mode. A read-only transaction is validated like any
 * other -- its reads were a consistent snapshot if no stamp moved -- but
 * changes nothing, so it takes no sequence number and logs no record.
 * IMMEDIATE, it still waits for what a writing one would: everything
 * logged before its commit (so what it read from earlier side transactions
 * is on disk before it is acknowledged); out->wait_lsn is then the last
 * LSN handed out (read under side_lock, which every side commit holds
 * while it applies and logs), its sync requested after the lock is
 * released (docs/transactions.md, "Read-only side transactions"). A
 * transaction with an idempotency key always logs its record, writes or
 * not: the record is what makes the key durable. A key that committed
 * already (KEEL_EALREADY) is answered as that commit is acknowledged:
 * out->wait_lsn is the LSN of the record that holds the key (0 when it was
 * read from disk or a stream), so IMMEDIATE waits for that record (and
 * reports KEEL_EFATAL instead when it never becomes durable). */
int side_commit(keel_side_txn *tx, side_result *out)
{
    *out = (side_result){0};
    if (!tx)
        return core_fail(KEEL_EINVAL, "keel_side_txn_commit: transaction is NULL");
    txn_state *ts = tx->ts;
    out->mode = tx->mode;
    pthread_mutex_lock(&ts->side_lock);
    uint64_t tick = atomic_load_explicit(&ts->running_tick, memory_order_relaxed);
    txn_key held = {0};
    int fatal = txn_log_fatal(&ts->log);
    int rc = fatal ? KEEL_EFATAL : key_check(tx, tick, &held);
    int64_t bad = rc ? -1 : first_conflict(tx);
    bool logs = tx->nwrites || tx->key;
    if (!rc && bad < 0 && logs && ts->log.ops) /* before anything is applied: a refusal changes nothing */
        rc = ts->log.ops->side_fits(ts->log.self, kw_side_size(tx->nwrites, tx->vlen, tx->key != 0));
    if (!rc)
        rc = bad >= 0 ? KEEL_ECONFLICT : prepare_apply(tx);
    bool read_only_wait = !rc && !logs && ts->log.ops && tx->mode == KEEL_DURABLE_IMMEDIATE;
    if (!rc && !logs) {
        ts->side_commits_tick++;
        ts->counts.commits++;
        if (read_only_wait) /* under the lock: every side commit it could have read is below */
            out->wait_lsn = ts->log.ops->last_lsn(ts->log.self);
    } else if (!rc) {
        uint64_t seq = ++ts->side_seq;
        size_t side_off = ts->uow.side_len;
        uow_side_begin(&ts->uow, seq, tick, tx->mode, tx->nwrites, tx->key);
        for (uint32_t i = 0; i < tx->nwrites; i++)
            apply_one(tx, &tx->writes[i], seq);
        ts->side_commits_tick++;
        ts->counts.commits++;
        /* applied: logging must follow (a failure here latches the runtime:
         * the commit is then never acknowledged) */
        if (ts->log.ops)
            (void)KEEL_FAILPOINT(SIDE_BEFORE_ENQUEUE);
        if (ts->log.ops && (rc = ts->log.ops->log_side(ts->log.self, seq, tx->mode, tick, side_off, &out->lsn)))
            ts->log.ops->latch_fatal(ts->log.self, rc == KEEL_EFATAL ? KEEL_EIO : rc), rc = KEEL_EFATAL;
        if (tx->key) /* with its record: what a retry's "already" waits for (a latch above refuses retries first) */
            keys_add(&ts->keys, tx->key, tick, out->lsn);
        out->wait_lsn = out->lsn;
    } else if (rc == KEEL_ECONFLICT) {
        ts->counts.conflicts++;
    } else if (rc == KEEL_EALREADY) {
        ts->counts.already++;
        /* the answer "already committed" waits for the key's record as a commit of this mode would for its own */
        if (ts->log.ops)
            out->wait_lsn = held.lsn;
    } else {
        ts->counts.aborts++;
    }
    pthread_mutex_unlock(&ts->side_lock);
    if (read_only_wait || (rc == KEEL_EALREADY && out->wait_lsn && tx->mode == KEEL_DURABLE_IMMEDIATE))
        (void)ts->log.ops->sync_request(ts->log.self, out->wait_lsn); /* a latch meanwhile: the wait reports it */
    if (rc == KEEL_EALREADY) {
        core_fail(KEEL_EALREADY, "side transaction in '%s': idempotency key %llu (0x%016llx) already committed at "
                                 "tick %llu; nothing applied", tx->name, (unsigned long long)tx->key,
                  (unsigned long long)tx->key, (unsigned long long)held.tick);
    } else if (bad >= 0) {
        const side_read *r = &tx->reads[bad];
        core_fail(KEEL_ECONFLICT, "side transaction in '%s': entity 0x%016llx component '%s' changed since it was read",
                  tx->name, (unsigned long long)r->e, ts->world->comps[r->c].name);
    } else if (rc == KEEL_EFATAL) {
        core_fail(KEEL_EFATAL, "side transaction in '%s': the runtime is in its fatal state (%s); nothing is "
                               "acknowledged any more", tx->name, keel_strerror(txn_log_fatal(&ts->log)));
    }
    bool logged = !rc && ts->log.ops && logs;
    side_free(tx);
    if (logged)
        (void)KEEL_FAILPOINT(SIDE_BEFORE_WAIT);
    return rc;
}

txn_state *side_state(const keel_side_txn *tx)
{
    return tx->ts;
}

int keel_side_txn_commit_lsn(keel_side_txn *tx, uint64_t *lsn)
{
    if (!lsn) {
        keel_side_txn_abort(tx);
        return core_fail(KEEL_EINVAL, "keel_side_txn_commit_lsn: lsn is NULL");
    }
    side_result r;
    txn_state *ts = tx ? tx->ts : NULL;
    int rc = side_commit(tx, &r);
    *lsn = rc == KEEL_EALREADY ? r.wait_lsn : rc ? 0 : r.lsn; /* EALREADY: the record that holds the key */
    if (rc && rc != KEEL_EALREADY)
        return rc;
    int durable = txn_durable_wait(ts, r.wait_lsn, r.mode); /* EALREADY: the key's commit, IMMEDIATE: synced */
    return durable ? durable : rc;
}

int keel_side_txn_commit(keel_side_txn *tx)
{
    uint64_t lsn;
    return keel_side_txn_commit_lsn(tx, &lsn);
}

int txn_durable_wait(txn_state *ts, uint64_t lsn, keel_durability mode)
{
    /* IMMEDIATE: synced before the acknowledgement, no exception. GROUP
     * and DEFERRED return at commit; the writer syncs them within its
     * window, or at flush / checkpoint / shutdown (docs/durability.md). */
    if (!ts->log.ops || !lsn || mode != KEEL_DURABLE_IMMEDIATE)
        return KEEL_OK;
    return ts->log.ops->wait_durable(ts->log.self, lsn, false, -1);
}
