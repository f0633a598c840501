/*
 * durable/checkpoint.c -- incremental checkpoints without stalling ticks.
 *
 * Taking one (tick thread, at the end of a completed tick T, right after
 * the view of T was published):
 *   1. capture: note, per chunk, the entity array and the column buffers
 *      of the view of T (VERSIONED columns: cur == pub now, and a buffer
 *      the view holds is never written again -- world/version.c); copy the
 *      SINGLE_VERSION columns (written in place, so they must be copied:
 *      the only stall, proportional to their bytes); TRANSIENT columns are
 *      not durable. Every noted buffer goes into a pin set: view
 *      reclamation (txn/view.c) defers freeing a pinned buffer until the
 *      checkpoint thread has read it. The job covers every record queued so
 *      far (all of them belong to ticks <= T).
 *   2. serialise (checkpoint thread): one SNAP_CHUNK record per chunk, one
 *      SNAP_SLOTS record per page of 1024 slots, one SNAP_TABLES record,
 *      one SNAP_KEYS record of the idempotency keys (copied at capture);
 *      a record whose payload hashes like the one snap already holds is
 *      skipped (incremental: only what changed since the last checkpoint
 *      is written); keys snap holds that no longer exist are deleted.
 *      Then the pin is released.
 *   3. record (writer thread, inside one LMDB write transaction with the
 *      batch it commits): the snap puts and deletes, meta "checkpoint"
 *      (tick, covered LSN), a CHECKPOINT marker in the WAL, and the
 *      deletion of every WAL record the checkpoint covers (unless
 *      wal_retain; in a stream's directory, only those the stream
 *      acknowledged: trim_upto). One transaction: a crash at any instant leaves either
 *      the old checkpoint with its WAL or the new one with the rest.
 * The content hash is core_digest64 over the raw payload; a
 * collision would skip a changed chunk, with probability 2^-64 per chunk.
 *
 * Failpoints (docs/testing.md): ckpt.after_capture (tick thread),
 * ckpt.after_serialize (checkpoint thread), ckpt.before_meta and
 * ckpt.before_wal_delete (writer, inside the write transaction: eio/enospc
 * make the meta put / the WAL deletion fail), ckpt.after_commit (writer,
 * the transaction committed, before the checkpoint is confirmed).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "durable/durable_internal.h"

/* ---- the stored-content map (key -> payload hash), under ckpt_mu --------------------- */

typedef struct ckpt_stored {
    uint64_t *keys;            /* 0 = empty */
    uint64_t *hashes;
    uint32_t cap, n;
} ckpt_stored;

static uint64_t key_code(const void *key, size_t klen)
{
    const unsigned char *k = key;
    uint64_t v = 0;
    for (size_t i = 1; i < klen; i++)
        v = v << 8 | k[i];
    return (uint64_t)k[0] << 56 | v;   /* 'T', 'K', 'S'+page, 'C'+table+chunk (table < 2^24) */
}

static void code_key(uint64_t code, unsigned char *out, size_t *klen)
{
    out[0] = (unsigned char)(code >> 56);
    if (out[0] == 'T' || out[0] == 'K') {
        *klen = 1;
    } else if (out[0] == 'S') {
        *klen = kw_snap_key_slots(out, (uint32_t)code);
    } else {
        *klen = kw_snap_key_chunk(out, (uint32_t)(code >> 32) & 0xffffff, (uint32_t)code);
    }
}

static uint64_t *stored_slot(ckpt_stored *m, uint64_t code)
{
    uint32_t mask = m->cap - 1;
    for (uint32_t i = (uint32_t)core_mix64(code) & mask;; i = (i + 1) & mask)
        if (!m->keys[i] || m->keys[i] == code)
            return &m->keys[i];
}

static int stored_put(ckpt_stored *m, uint64_t code, uint64_t hash)
{
    if ((m->n + 1) * 2 > m->cap) {
        ckpt_stored g = {.cap = m->cap ? m->cap * 2 : 1024};
        g.keys = calloc(g.cap, sizeof *g.keys);
        g.hashes = calloc(g.cap, sizeof *g.hashes);
        if (!g.keys || !g.hashes) {
            free(g.keys);
            free(g.hashes);
            return core_fail(KEEL_ENOMEM, "out of memory for the checkpoint map");
        }
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                uint64_t *s = stored_slot(&g, m->keys[i]);
                *s = m->keys[i];
                g.hashes[s - g.keys] = m->hashes[i];
                g.n++;
            }
        free(m->keys);
        free(m->hashes);
        *m = g;
    }
    uint64_t *s = stored_slot(m, code);
    if (!*s)
        m->n++;
    *s = code;
    m->hashes[s - m->keys] = hash;
    return KEEL_OK;
}

static void stored_del(ckpt_stored *m, uint64_t code)
{
    /* rebuild without the key (deletions are rare: tables that shrank) */
    ckpt_stored g = {0};
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->keys[i] && m->keys[i] != code && stored_put(&g, m->keys[i], m->hashes[i]))
            return;
    free(m->keys);
    free(m->hashes);
    *m = g;
}

int ckpt_stored_note(dur_state *d, const void *key, size_t klen, uint64_t hash)
{
    if (!d->stored && !(d->stored = calloc(1, sizeof *d->stored)))
        return core_fail(KEEL_ENOMEM, "out of memory for the checkpoint map");
    return stored_put(d->stored, key_code(key, klen), hash);
}

/* ---- the pin ---------------------------------------------------------------------------- */

struct dur_pin {
    void **set;                /* open addressing, NULL = empty */
    uint32_t cap, n;
    void **deferred;
    uint32_t ndeferred, deferred_cap;
};

static bool pin_has(const dur_pin *p, const void *buf)
{
    uint32_t mask = p->cap - 1;
    for (uint32_t i = (uint32_t)core_mix64((uint64_t)(uintptr_t)buf) & mask;; i = (i + 1) & mask) {
        if (!p->set[i])
            return false;
        if (p->set[i] == buf)
            return true;
    }
}

static void pin_add(dur_pin *p, void *buf)
{
    uint32_t mask = p->cap - 1;
    for (uint32_t i = (uint32_t)core_mix64((uint64_t)(uintptr_t)buf) & mask;; i = (i + 1) & mask) {
        if (!p->set[i]) {
            p->set[i] = buf;
            p->n++;
            return;
        }
        if (p->set[i] == buf)
            return;
    }
}

bool dur_pin_active(dur_state *d)
{
    return d && atomic_load_explicit(&d->pin, memory_order_acquire);
}

bool dur_pin_hold(dur_state *d, void *buf)
{
    if (!d || !atomic_load_explicit(&d->pin, memory_order_acquire))
        return false;
    pthread_mutex_lock(&d->pin_mu);
    dur_pin *p = atomic_load_explicit(&d->pin, memory_order_relaxed);
    bool held = p && pin_has(p, buf);
    if (held) /* room for every pinned buffer was allocated at capture; each is retired once */
        p->deferred[p->ndeferred++] = buf;
    pthread_mutex_unlock(&d->pin_mu);
    return held;
}

static void pin_release(dur_state *d)
{
    pthread_mutex_lock(&d->pin_mu);
    dur_pin *p = atomic_load_explicit(&d->pin, memory_order_relaxed);
    atomic_store_explicit(&d->pin, NULL, memory_order_release);
    pthread_mutex_unlock(&d->pin_mu);
    if (!p)
        return;
    for (uint32_t i = 0; i < p->ndeferred; i++)
        free(p->deferred[i]);
    free(p->deferred);
    free(p->set);
    free(p);
}

/* ---- the job ------------------------------------------------------------------------------ */

typedef struct ckpt_src {
    uint32_t table, chunk, count, ncols;
    const keel_entity *ents;
    keel_component comp[8];    /* ncols <= 8 here; wider tables use `more` */
    uint32_t size[8];
    const void *vals[8];
    struct ckpt_src_more *more;
} ckpt_src;

typedef struct ckpt_src_more {
    keel_component comp[KEEL_MAX_COMPONENTS];
    uint32_t size[KEEL_MAX_COMPONENTS];
    const void *vals[KEEL_MAX_COMPONENTS];
} ckpt_src_more;

typedef struct ckpt_put {
    uint64_t code, hash;
    size_t off, len;           /* the record in job->out */
} ckpt_put;

struct ckpt_job {
    uint64_t tick, covered_lsn;
    uint32_t nslots;
    uint32_t npages;
    const world_slot **pages;
    /* a live slot's generation is in its row's entity array (world_internal.h):
     * ents[ents_first[table] + chunk] is that chunk's, pinned with the pages */
    const keel_entity **ents;
    uint32_t *ents_first;
    uint32_t chunk_shift, chunk_mask;
    kw_buf tables;             /* SNAP_TABLES payload, built at capture */
    txn_key *keys;             /* the idempotency keys remembered at the tick (SNAP_KEYS) */
    uint32_t nkeys;
    ckpt_src *srcs;
    uint32_t nsrcs;
    void **owned;              /* SINGLE_VERSION copies */
    uint32_t nowned;
    /* built by the checkpoint thread */
    kw_buf out;
    ckpt_put *puts;
    uint32_t nputs, puts_cap;
    uint64_t *dels;
    uint32_t ndels;
    uint32_t count;            /* this checkpoint's number */
    int rc;
    uint64_t start_ns;         /* when ckpt_maybe began the capture (the duration histogram's start) */
};

void ckpt_job_free(ckpt_job *j)
{
    if (!j)
        return;
    for (uint32_t i = 0; i < j->nowned; i++)
        free(j->owned[i]);
    for (uint32_t i = 0; i < j->nsrcs; i++)
        free(j->srcs[i].more);
    free(j->owned);
    free(j->srcs);
    free(j->pages);
    free(j->ents);
    free(j->ents_first);
    kw_buf_free(&j->tables);
    free(j->keys);
    kw_buf_free(&j->out);
    free(j->puts);
    free(j->dels);
    free(j);
}

static keel_component *src_comp(ckpt_src *s) { return s->more ? s->more->comp : s->comp; }
static uint32_t *src_size(ckpt_src *s) { return s->more ? s->more->size : s->size; }
static const void **src_vals(ckpt_src *s) { return s->more ? s->more->vals : s->vals; }

static int capture_chunk(keel_world *w, const world_table *t, uint32_t k, ckpt_job *j, dur_pin *pin)
{
    world_chunk *ch = t->chunks[k];
    ckpt_src *s = &j->srcs[j->nsrcs++];
    *s = (ckpt_src){.table = t->id, .chunk = k, .count = ch->count, .ents = ch->entities};
    if (t->ncols > 8 && !(s->more = calloc(1, sizeof *s->more)))
        return KEEL_ENOMEM;
    pin_add(pin, ch->entities);
    for (uint32_t col = 0; col < t->ncols; col++) {
        keel_component c = t->cols[col].c;
        keel_discipline disc = w->comps[c].desc.discipline;
        uint32_t size = t->cols[col].size;
        if (!size || disc == KEEL_TRANSIENT)
            continue;
        const void *buf = colver_cur(&ch->cols[col]);
        if (disc == KEEL_SINGLE_VERSION) {
            void *copy = malloc((size_t)ch->count * size + 1);
            if (!copy)
                return KEEL_ENOMEM;
            memcpy(copy, buf, (size_t)ch->count * size);
            j->owned[j->nowned++] = copy;
            buf = copy;
        } else {
            pin_add(pin, (void *)buf);
        }
        uint32_t i = s->ncols++;
        src_comp(s)[i] = c;
        src_size(s)[i] = size;
        src_vals(s)[i] = buf;
    }
    return KEEL_OK;
}

static int tables_payload(const keel_world *w, kw_buf *b)
{
    int rc = kw_snap_tables_put_header(b, w->ntables, w->nslots, w->nlive);
    for (uint32_t id = 0; !rc && id < w->ntables; id++) {
        const world_table *t = w->tables[id];
        keel_component comps[KEEL_MAX_COMPONENTS];
        for (uint32_t i = 0; i < t->ncols; i++)
            comps[i] = t->cols[i].c;
        rc = kw_snap_tables_put_table(b, t->count, t->ncols, comps);
    }
    return rc;
}

/* Build the job of the completed tick from the live (just published) world. */
static int capture(dur_state *d, uint64_t tick, ckpt_job **out)
{
    keel_world *w = d->world;
    uint32_t nchunks = 0, nbufs = w->npages;
    for (uint32_t id = 0; id < w->ntables; id++) {
        nchunks += w->tables[id]->nchunks;
        nbufs += w->tables[id]->nchunks * (w->tables[id]->ncols + 1);
    }
    ckpt_job *j = calloc(1, sizeof *j);
    dur_pin *pin = calloc(1, sizeof *pin);
    uint32_t cap = 16;
    while (cap < nbufs * 2 + 2)
        cap *= 2;
    if (j) {
        j->srcs = calloc(nchunks + 1, sizeof *j->srcs);
        j->owned = calloc(nbufs + 1, sizeof *j->owned);
        j->pages = calloc(w->npages + 1, sizeof *j->pages);
        j->ents = calloc(nchunks + 1, sizeof *j->ents);
        j->ents_first = calloc(w->ntables + 1, sizeof *j->ents_first);
    }
    if (pin)
        pin->set = calloc(cap, sizeof *pin->set), pin->cap = cap;
    int rc = !j || !pin || !j->srcs || !j->owned || !j->pages || !j->ents || !j->ents_first || !pin->set
                 ? KEEL_ENOMEM
                 : tables_payload(w, &j->tables);
    for (uint32_t id = 0, first = 0; !rc && id < w->ntables; first += w->tables[id++]->nchunks) {
        j->ents_first[id] = first;
        for (uint32_t k = 0; !rc && k < w->tables[id]->nchunks; k++) {
            j->ents[first + k] = w->tables[id]->chunks[k]->entities; /* pinned below when a row lives there */
            if (w->tables[id]->chunks[k]->count)
                rc = capture_chunk(w, w->tables[id], k, j, pin);
        }
    }
    if (rc) {
        ckpt_job_free(j);
        if (pin)
            free(pin->set);
        free(pin);
        return core_fail(KEEL_ENOMEM, "out of memory taking a checkpoint of tick %llu", (unsigned long long)tick);
    }
    if (!(pin->deferred = malloc((pin->n + w->npages + 1) * sizeof *pin->deferred))) {
        ckpt_job_free(j);
        free(pin->set);
        free(pin);
        return core_fail(KEEL_ENOMEM, "out of memory taking a checkpoint of tick %llu", (unsigned long long)tick);
    }
    pin->deferred_cap = pin->n + w->npages + 1;
    /* the keys of every side commit up to now, i.e. of every record the
     * job covers (no side transaction commits between ticks) */
    txn_state *ts = d->txn;
    pthread_mutex_lock(&ts->side_lock);
    keys_expire(&ts->keys, tick);
    rc = keys_snapshot(&ts->keys, tick, &j->keys, &j->nkeys);
    pthread_mutex_unlock(&ts->side_lock);
    if (rc) {
        ckpt_job_free(j);
        free(pin->deferred);
        free(pin->set);
        free(pin);
        return core_fail(KEEL_ENOMEM, "out of memory taking a checkpoint of tick %llu", (unsigned long long)tick);
    }
    j->tick = tick;
    j->nslots = w->nslots;
    j->chunk_shift = w->chunk_shift;
    j->chunk_mask = w->chunk_mask;
    j->npages = (w->nslots + WORLD_PAGE_SLOTS - 1) / WORLD_PAGE_SLOTS;
    for (uint32_t p = 0; p < j->npages; p++) {
        j->pages[p] = w->pages[p];
        pin_add(pin, w->pages[p]);
    }
    atomic_store_explicit(&d->pin, pin, memory_order_release);
    *out = j;
    return KEEL_OK;
}

/* ---- pacing: serialising between steps ------------------------------------------------------
 *
 * With as many busy threads as cores, a checkpoint thread that serialises
 * while a step runs takes a core from the step's workers; woken by the
 * capture from inside the step, it also preempted the stepping thread itself
 * for a scheduler time slice (3-5 ms of the 60 Hz ticks that started a
 * checkpoint, on 2 vCPUs: docs/performance.md, "checkpoint"). So the runtime
 * marks its steps and sync point retries (step_seq odd while one runs), and
 * before each record it serialises the checkpoint thread naps while the step
 * it saw runs: until that step has ended (the count moved) or for at most
 * CKPT_YIELD_MAX_NS, then serialises for CKPT_BURST_NS before it looks
 * again. Between steps (a paced loop) it never waits; steps back to back (an
 * unthrottled loop) leave it a burst per step, a step that never ends one
 * per CKPT_YIELD_MAX_NS. This is pacing only: nothing depends on it for
 * correctness (relaxed atomics), and no step wakes the checkpoint thread for
 * it (it naps). */
#define CKPT_NAP_NS 1000000L          /* 1 ms */
#define CKPT_YIELD_MAX_NS 10000000ull /* 10 ms */
#define CKPT_BURST_NS 500000ull       /* 0.5 ms */

void ckpt_step_edge(dur_state *d)
{
    atomic_fetch_add_explicit(&d->step_seq, 1, memory_order_relaxed);
}

/* Before a record: wait for the running step unless within a burst
 * (*burst_end: when the current one ends, 0 = none yet). */
static void yield_to_step(dur_state *d, uint64_t *burst_end)
{
    uint64_t seen = atomic_load_explicit(&d->step_seq, memory_order_relaxed);
    if (seen % 2 == 0 || core_now_ns() < *burst_end)
        return;
    for (uint64_t napped = 0; napped < CKPT_YIELD_MAX_NS; napped += CKPT_NAP_NS) {
        nanosleep(&(struct timespec){0, CKPT_NAP_NS}, NULL);
        if (atomic_load_explicit(&d->step_seq, memory_order_relaxed) != seen)
            break;
    }
    *burst_end = core_now_ns() + CKPT_BURST_NS;
}

/* ---- serialising (checkpoint thread) ------------------------------------------------------ */

static int add_put(dur_state *d, ckpt_job *j, kw_codec_ctx *c, uint64_t code, const kw_buf *payload, uint32_t kind)
{
    uint64_t hash = core_digest64(payload->p, payload->len);
    pthread_mutex_lock(&d->ckpt_mu);
    bool same = false;
    if (d->stored && d->stored->cap) {
        uint64_t *s = stored_slot(d->stored, code);
        same = *s == code && d->stored->hashes[s - d->stored->keys] == hash;
    }
    pthread_mutex_unlock(&d->ckpt_mu);
    if (CORE_GROW(j->puts, j->puts_cap, j->nputs + 1, 256))
        return KEEL_ENOMEM;
    ckpt_put *p = &j->puts[j->nputs++];
    *p = (ckpt_put){.code = code, .hash = hash, .off = j->out.len, .len = 0};
    if (same)
        return KEEL_OK; /* listed (so it is not deleted), not rewritten */
    int rc = kw_record_build(c, &j->out, kind, 0, j->tick, 0, payload->p, payload->len);
    p->len = j->out.len - p->off;
    return rc;
}

static int chunk_payload(ckpt_src *s, kw_buf *b)
{
    return kw_snap_chunk_encode(b, s->table, s->chunk, s->count, s->ncols, src_comp(s), src_size(s), s->ents,
                                src_vals(s));
}

_Static_assert(WORLD_PAGE_SLOTS == KW_SNAP_PAGE_SLOTS, "a SNAP_SLOTS page is a page of the entity index");

static int slots_payload(const ckpt_job *j, uint32_t p, kw_buf *b)
{
    uint32_t first = p * WORLD_PAGE_SLOTS, n = j->nslots - first < WORLD_PAGE_SLOTS ? j->nslots - first : WORLD_PAGE_SLOTS;
    uint32_t gens[WORLD_PAGE_SLOTS];
    uint8_t live[WORLD_PAGE_SLOTS];
    for (uint32_t i = 0; i < n; i++) {
        const world_slot *s = &j->pages[p][i];
        live[i] = s->table != WORLD_NO_TABLE;
        gens[i] = live[i] ? KEEL_ENTITY_GEN(j->ents[j->ents_first[s->table] + (s->row >> j->chunk_shift)]
                                                   [s->row & j->chunk_mask])
                          : s->row; /* free: the next occupant's generation */
    }
    return kw_snap_slots_encode(b, first, n, gens, live);
}

static int keys_payload(const ckpt_job *j, kw_buf *b)
{
    uint64_t *keys = malloc((size_t)j->nkeys * 2 * sizeof *keys);
    if (!keys)
        return KEEL_ENOMEM;
    uint64_t *ticks = keys + j->nkeys;
    for (uint32_t i = 0; i < j->nkeys; i++) {
        keys[i] = j->keys[i].key;
        ticks[i] = j->keys[i].tick;
    }
    int rc = kw_snap_keys_encode(b, j->nkeys, keys, ticks);
    free(keys);
    return rc;
}

static bool listed(const ckpt_job *j, uint64_t code)
{
    /* puts are in key order per kind: a linear scan is fine for the rare deletes */
    for (uint32_t i = 0; i < j->nputs; i++)
        if (j->puts[i].code == code)
            return true;
    return false;
}

static int serialize(dur_state *d, ckpt_job *j, kw_codec_ctx *c)
{
    kw_buf b = {0};
    uint64_t burst_end = 0;
    yield_to_step(d, &burst_end); /* woken by the capture, inside the step that took it */
    int rc = add_put(d, j, c, key_code("T", 1), &j->tables, KW_KIND_SNAP_TABLES);
    for (uint32_t p = 0; !rc && p < j->npages; p++) {
        unsigned char key[5];
        size_t kl = kw_snap_key_slots(key, p);
        yield_to_step(d, &burst_end);
        rc = slots_payload(j, p, &b);
        rc = rc ? rc : add_put(d, j, c, key_code(key, kl), &b, KW_KIND_SNAP_SLOTS);
    }
    for (uint32_t i = 0; !rc && i < j->nsrcs; i++) {
        unsigned char key[9];
        size_t kl = kw_snap_key_chunk(key, j->srcs[i].table, j->srcs[i].chunk);
        yield_to_step(d, &burst_end);
        rc = chunk_payload(&j->srcs[i], &b);
        rc = rc ? rc : add_put(d, j, c, key_code(key, kl), &b, KW_KIND_SNAP_CHUNK);
    }
    if (!rc && j->nkeys) { /* none: "K" is not listed, so a stored one is deleted below */
        yield_to_step(d, &burst_end);
        rc = keys_payload(j, &b);
    }
    if (!rc && j->nkeys)
        rc = add_put(d, j, c, key_code(KW_SNAP_KEYS_KEY, 1), &b, KW_KIND_SNAP_KEYS);
    kw_buf_free(&b);
    pin_release(d); /* everything the job points at has been read */
    for (uint32_t i = 0; i < j->nowned; i++)
        free(j->owned[i]);
    j->nowned = 0;
    if (rc)
        return rc;
    /* keys snap holds that this checkpoint does not: delete them */
    pthread_mutex_lock(&d->ckpt_mu);
    uint32_t n = 0;
    for (uint32_t i = 0; d->stored && i < d->stored->cap; i++)
        n += d->stored->keys[i] && !listed(j, d->stored->keys[i]);
    j->dels = calloc(n + 1, sizeof *j->dels);
    for (uint32_t i = 0; j->dels && d->stored && i < d->stored->cap; i++)
        if (d->stored->keys[i] && !listed(j, d->stored->keys[i]))
            j->dels[j->ndels++] = d->stored->keys[i];
    pthread_mutex_unlock(&d->ckpt_mu);
    return j->dels ? KEEL_OK : KEEL_ENOMEM;
}

/* ---- the writer's part ---------------------------------------------------------------------- */

/* The last WAL record a checkpoint covering `covered` deletes (0: none).
 * A stream's directory opened as anything but a replica (or promoted
 * since) deletes none the stream has not acknowledged -- none at all when
 * opened without replication, which knows nothing of the stream: the
 * publisher may still read those records from it, and a rejoin drops them.
 * So every record a stream's directory deleted was on the stream, and a
 * rejoin may take the directory's first LSN - 1 as a point both share once
 * the stream's record there is the one deleted last (meta "trimmed"). The
 * bound is the end of a commit (stream_unit_lsn), so the WAL left starts
 * with a whole unit, as after any checkpoint. */
static uint64_t trim_upto(dur_state *d, uint64_t covered)
{
    if (d->wal_retain)
        return 0;
    pthread_mutex_lock(&d->mu);
    uint64_t upto = d->trim_to_stream && d->stream_unit_lsn < covered ? d->stream_unit_lsn : covered;
    pthread_mutex_unlock(&d->mu);
    return upto;
}

int ckpt_write(dur_state *d, kw_wtxn *txn, ckpt_job *j)
{
    int rc = KEEL_OK;
    for (uint32_t i = 0; !rc && i < j->nputs; i++) {
        if (!j->puts[i].len)
            continue;
        unsigned char key[9];
        size_t kl;
        code_key(j->puts[i].code, key, &kl);
        rc = kw_put(txn, KW_DB_SNAP, key, kl, j->out.p + j->puts[i].off, j->puts[i].len);
    }
    for (uint32_t i = 0; !rc && i < j->ndels; i++) {
        unsigned char key[9];
        size_t kl;
        code_key(j->dels[i], key, &kl);
        rc = kw_del(txn, KW_DB_SNAP, key, kl);
    }
    if (!rc)
        rc = KEEL_FAILPOINT(CKPT_BEFORE_META); /* the snapshot data is written, the meta not yet */
    if (!rc) {
        unsigned char m[32];
        kw_checkpoint_meta meta = {.tick = j->tick, .lsn = j->covered_lsn, .count = j->count};
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        meta.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        kw_checkpoint_meta_encode(&meta, m);
        rc = kw_put(txn, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), m, sizeof m);
    }
    uint64_t upto = rc ? 0 : trim_upto(d, j->covered_lsn);
    if (upto)
        rc = KEEL_FAILPOINT(CKPT_BEFORE_WAL_DELETE);
    if (!rc && upto)
        rc = kw_del_wal_upto(txn, upto, NULL);
    return rc;
}

/* The end of job j: recorded (rc 0) or not. A job abandoned for lack of
 * memory (KEEL_ENOMEM, from the checkpoint thread) is no failure of the
 * directory: the WAL still holds everything it would have covered, so
 * nothing latches, its number is free again, and only the keel_checkpoint
 * that waits for it learns the code (ckpt_last_rc). */
void ckpt_committed(dur_state *d, ckpt_job *j, int rc)
{
    if (!rc)
        (void)KEEL_FAILPOINT(CKPT_AFTER_COMMIT);
    pthread_mutex_lock(&d->ckpt_mu);
    atomic_store_explicit(&d->ckpt_last_rc, rc, memory_order_relaxed);
    if (rc) {
        uint32_t mine = j->count;
        atomic_compare_exchange_strong(&d->ckpt_count, &mine, j->count - 1);
    }
    if (!rc) {
        if (!d->stored)
            d->stored = calloc(1, sizeof *d->stored);
        for (uint32_t i = 0; d->stored && i < j->ndels; i++)
            stored_del(d->stored, j->dels[i]);
        for (uint32_t i = 0; d->stored && i < j->nputs; i++)
            stored_put(d->stored, j->puts[i].code, j->puts[i].hash);
        d->ckpt_count = j->count;
        atomic_fetch_add(&d->ckpt_taken, 1);
        atomic_store(&d->ckpt_recorded_tick, j->tick);
        core_hist_observe(&d->ckpt_hist, core_now_ns() - j->start_ns);
    } else if (!d->ckpt_rc && rc != KEEL_ENOMEM) {
        d->ckpt_rc = rc;
    }
    d->ckpt_busy = false;
    pthread_cond_broadcast(&d->ckpt_cv);
    pthread_mutex_unlock(&d->ckpt_mu);
    ckpt_job_free(j);
}

/* ---- the checkpoint thread -------------------------------------------------------------------- */

static void *ckpt_main(void *arg)
{
    dur_state *d = arg;
    kw_codec_ctx *c = NULL;
    kw_codec_desc cd = {.level = d->zstd_level};
    pthread_mutex_lock(&d->ckpt_mu);
    for (;;) {
        while (!d->ckpt_next && !d->ckpt_quit)
            pthread_cond_wait(&d->ckpt_cv, &d->ckpt_mu);
        ckpt_job *j = d->ckpt_next;
        d->ckpt_next = NULL;
        if (!j)
            break;
        pthread_mutex_unlock(&d->ckpt_mu);
        int rc = c ? KEEL_OK : kw_codec_create(&cd, &c); /* made again if it could not be made before */
        rc = rc ? rc : serialize(d, j, c);
        if (!rc)
            (void)KEEL_FAILPOINT(CKPT_AFTER_SERIALIZE);
        if (!rc) {
            dur_item *it = dur_item_new(DUR_CHECKPOINT, KEEL_DURABLE_IMMEDIATE);
            unsigned char mp[KW_CHECKPOINT_MARKER_SIZE];
            kw_checkpoint_marker_encode(j->covered_lsn, j->tick, mp);
            rc = it ? kw_record_build_unsealed(c, &it->recs, KW_KIND_CHECKPOINT, j->tick, 0, mp, sizeof mp) : KEEL_ENOMEM;
            if (!rc) {
                it->ckpt = j;
                rc = dur_enqueue(d, it, NULL); /* the writer calls ckpt_committed */
                j = NULL;
            } else {
                dur_item_free(it);
            }
        } else {
            pin_release(d);
        }
        if (j) { /* could not hand it over; out of memory abandons the job without latching (ckpt_committed) */
            bool oom = rc == KEEL_ENOMEM;
            core_log(oom ? KEEL_LOG_WARN : KEEL_LOG_ERROR, "ckpt", oom ? "skipped" : "failed", "tick=%llu code=%s",
                     (unsigned long long)j->tick, keel_strerror(rc));
            if (!oom && rc != KEEL_EFATAL)
                dur_latch_fatal(d, rc);
            ckpt_committed(d, j, rc);
        }
        pthread_mutex_lock(&d->ckpt_mu);
    }
    pthread_mutex_unlock(&d->ckpt_mu);
    kw_codec_destroy(c);
    return NULL;
}

int ckpt_start(dur_state *d)
{
    if (pthread_create(&d->ckpt_thread, NULL, ckpt_main, d))
        return core_fail(KEEL_ENOMEM, "cannot start the checkpoint thread");
    core_thread_name(d->ckpt_thread, "keel-checkpoint");
    d->ckpt_thread_running = true;
    return KEEL_OK;
}

void ckpt_stop(dur_state *d)
{
    if (!d->ckpt_thread_running)
        return;
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_quit = true;
    pthread_cond_broadcast(&d->ckpt_cv);
    pthread_mutex_unlock(&d->ckpt_mu);
    pthread_join(d->ckpt_thread, NULL);
    d->ckpt_thread_running = false;
    if (d->ckpt_next) {
        ckpt_job_free(d->ckpt_next);
        d->ckpt_next = NULL;
        pin_release(d);
    }
}

void ckpt_fini(dur_state *d)
{
    if (d->stored) {
        free(d->stored->keys);
        free(d->stored->hashes);
        free(d->stored);
        d->stored = NULL;
    }
}

int ckpt_wait(dur_state *d)
{
    pthread_mutex_lock(&d->ckpt_mu);
    while ((d->ckpt_busy || d->ckpt_next) && !dur_fatal(d))
        pthread_cond_wait(&d->ckpt_cv, &d->ckpt_mu);
    /* the outcome of the checkpoints themselves, not only the latch: a
     * failed one is never reported as taken */
    int failed = d->ckpt_rc, last = atomic_load_explicit(&d->ckpt_last_rc, memory_order_relaxed);
    pthread_mutex_unlock(&d->ckpt_mu);
    if (failed || dur_fatal(d))
        return core_fail(KEEL_EFATAL, "the checkpoint was not recorded: the runtime latched fatal (%s)",
                         keel_strerror(dur_fatal(d) ? dur_fatal(d) : failed));
    if (last == KEEL_ENOMEM)
        return core_fail(KEEL_ENOMEM, "the checkpoint was not taken: out of memory writing it (nothing is lost: "
                                      "the WAL still holds every tick)");
    return KEEL_OK;
}

bool ckpt_active(dur_state *d)
{
    pthread_mutex_lock(&d->ckpt_mu);
    bool busy = d->ckpt_busy || d->ckpt_next;
    pthread_mutex_unlock(&d->ckpt_mu);
    return busy;
}

typedef struct job_write {
    dur_state *d;
    ckpt_job *j;
} job_write;

static int write_job(kw_wtxn *txn, void *arg)
{
    job_write *w = arg;
    return ckpt_write(w->d, txn, w->j);
}

/* A replica's checkpoint (d->follow), captured by ckpt_maybe. Its WAL is
 * the stream's, byte for byte, so no CHECKPOINT marker goes into it: the
 * snapshot and the meta of the state it applied (the tick, the applied
 * LSN) are written in one transaction, and the WAL they cover goes unless
 * retained. It runs in the caller's thread, between two polls: nothing
 * changes the world meanwhile, so the capture's pins are released before
 * anything could need them. A failure (a full disk) is the caller's to
 * report and costs nothing: the next one, an interval later, tries again. */
static int ckpt_replica(dur_state *d, ckpt_job *j)
{
    int rc = serialize(d, j, d->codec[0]); /* releases the pins */
    if (!rc)
        rc = kw_store_write(d->store, write_job, &(job_write){d, j});
    if (rc) {
        ckpt_job_free(j);
        return rc;
    }
    ckpt_committed(d, j, KEEL_OK);
    return KEEL_OK;
}

int ckpt_maybe(dur_state *d, uint64_t tick, bool force)
{
    uint64_t now = core_now_ns(), bytes = atomic_load(&d->wal_bytes);
    /* the last job was abandoned for lack of memory: periodic checkpoints try
     * again at once, and so may keel_checkpoint on the same tick */
    bool abandoned = atomic_load_explicit(&d->ckpt_last_rc, memory_order_relaxed) == KEEL_ENOMEM;
    bool periodic = d->ckpt_every_ticks > 0 || d->ckpt_every_bytes > 0 || d->ckpt_every_seconds > 0;
    bool due = force || (abandoned && periodic) ||
               (d->ckpt_every_ticks > 0 && tick - d->last_ckpt_tick >= (uint64_t)d->ckpt_every_ticks) ||
               (d->ckpt_every_bytes > 0 && bytes - d->bytes_since_ckpt >= (uint64_t)d->ckpt_every_bytes) ||
               (d->ckpt_every_seconds > 0 && (double)(now - d->last_ckpt_ns) / 1e9 >= d->ckpt_every_seconds);
    if (!due || (tick == d->last_ckpt_tick && !abandoned))
        return KEEL_OK;
    pthread_mutex_lock(&d->ckpt_mu);
    bool busy = d->ckpt_busy || d->ckpt_next;
    pthread_mutex_unlock(&d->ckpt_mu);
    if (busy && !force)
        return KEEL_OK; /* one at a time; the next tick asks again */
    int rc;
    if (busy && (rc = ckpt_wait(d)) && rc != KEEL_ENOMEM) /* the previous job's lack of memory is not ours */
        return KEEL_EFATAL;
    ckpt_job *j = NULL;
    rc = capture(d, tick, &j);
    if (rc)
        return rc;
    j->covered_lsn = d->follow ? d->applied_lsn : dur_cover(d);
    j->count = d->ckpt_count + 1;
    j->start_ns = now;
    (void)KEEL_FAILPOINT(CKPT_AFTER_CAPTURE);
    d->last_ckpt_tick = tick; /* also when the job fails: the next try is an interval later (the age
                                 counts from the last one recorded, ckpt_recorded_tick) */
    d->last_ckpt_ns = now;
    d->bytes_since_ckpt = bytes;
    if (d->follow)
        return ckpt_replica(d, j);
    pthread_mutex_lock(&d->ckpt_mu);
    d->ckpt_count = j->count; /* numbering; ckpt_committed confirms */
    d->ckpt_busy = true;
    d->ckpt_next = j;
    pthread_cond_broadcast(&d->ckpt_cv);
    pthread_mutex_unlock(&d->ckpt_mu);
    return KEEL_OK;
}
