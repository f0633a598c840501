/*
 * tools/keel-wal/state.c -- the world state rebuilt offline (state.h):
 * the model, the checkpoint loader and the WAL replay behind
 * `keel-wal replay` and `keel-wal diff`.
 *
 * Everything here mirrors src/durable/recover.c and the world code it
 * drives, without linking the runtime:
 *   - slots: a destroy bumps the generation (UINT32_MAX wraps to 1, 0 is
 *     never a generation); a spawn takes the lowest free slot, else a new
 *     one with generation 1 (world/entity.c), and must produce the logged
 *     handle;
 *   - commands: a null or stale target is ignored, an add of a component
 *     the entity has overwrites it, a remove of one it lacks is ignored
 *     (world/command.c); the log holds every command playback took up, the
 *     ignored ones too, so they must be ignored here the same way;
 *   - value rows (TICK_CHUNK, SIDE) need a live entity that has the
 *     component, as keel_set does; anything else is corruption;
 *   - the hash feeds core/hash.c's state-hash calls in keel_world_hash's
 *     order, so it is bit-identical.
 * The model keeps no storage layout (tables, rows, chunks): the hash and the
 * tools' output do not depend on it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "keel/component.h"
#include "state.h"

/* ---- the model ------------------------------------------------------------------ */

void kws_state_init(kws_state *s, const kw_schema *schema)
{
    memset(s, 0, sizeof *s);
    s->schema = schema;
    for (uint32_t i = 0; schema && i < schema->ncomps && i < 255; i++) {
        s->size[i + 1] = schema->comps[i].size;
        s->transient[i + 1] = schema->comps[i].discipline == KEEL_TRANSIENT;
    }
}

void kws_state_free(kws_state *s)
{
    for (uint32_t i = 0; s->ent && i < s->nslots; i++)
        free(s->ent[i]);
    free(s->ent);
    free(s->gen);
    free(s->free_bits);
    memset(s, 0, sizeof *s);
}

static size_t ent_alloc_size(uint32_t n, uint32_t bytes)
{
    return sizeof(kws_ent) + n + bytes;
}

int kws_state_clone(kws_state *dst, const kws_state *src)
{
    *dst = *src;
    dst->gen = NULL;
    dst->free_bits = NULL;
    dst->ent = NULL;
    size_t words = ((size_t)src->cap + 63) / 64;
    dst->gen = malloc((src->cap ? src->cap : 1) * sizeof *dst->gen);
    dst->ent = calloc(src->cap ? src->cap : 1, sizeof *dst->ent);
    dst->free_bits = malloc((words ? words : 1) * sizeof *dst->free_bits);
    if (!dst->gen || !dst->ent || !dst->free_bits)
        goto nomem;
    memcpy(dst->gen, src->gen, (size_t)src->nslots * sizeof *dst->gen);
    memcpy(dst->free_bits, src->free_bits, words * sizeof *dst->free_bits);
    for (uint32_t i = 0; i < src->nslots; i++) {
        const kws_ent *e = src->ent[i];
        if (!e)
            continue;
        size_t n = ent_alloc_size(e->n, e->bytes);
        if (!(dst->ent[i] = malloc(n)))
            goto nomem;
        memcpy(dst->ent[i], e, n);
    }
    return KEEL_OK;
nomem:
    dst->nslots = src->nslots; /* free what was copied */
    kws_state_free(dst);
    return KEEL_ENOMEM;
}

uint64_t kws_state_hash(const kws_state *s)
{
    core_hasher h;
    core_state_hash_begin(&h, s->nslots);
    for (uint32_t i = 0; i < s->nslots; i++) {
        const kws_ent *e = s->ent[i];
        core_state_hash_slot(&h, s->gen[i], e != NULL);
        if (!e)
            continue;
        const unsigned char *v = e->data + e->n;
        for (uint32_t k = 0; k < e->n; k++) {
            uint32_t id = e->data[k], size = s->size[id];
            if (!s->transient[id])
                core_state_hash_component(&h, id, v, size);
            v += size;
        }
        core_state_hash_entity_end(&h);
    }
    return core_hasher_final(&h);
}

static uint32_t ent_index(uint64_t e)
{
    return (uint32_t)e;
}

static uint32_t ent_gen(uint64_t e)
{
    return (uint32_t)(e >> 32);
}

const kws_ent *kws_state_get(const kws_state *s, uint64_t e)
{
    uint32_t i = ent_index(e);
    if (!e || i >= s->nslots || !s->ent[i] || s->gen[i] != ent_gen(e))
        return NULL;
    return s->ent[i];
}

/* Position of component id in ent (its index, or -1) and its value's offset. */
static int ent_find(const kws_state *s, const kws_ent *ent, uint32_t id, size_t *off)
{
    size_t o = ent->n;
    for (uint32_t k = 0; k < ent->n; k++) {
        if (ent->data[k] == id) {
            *off = o;
            return (int)k;
        }
        if (ent->data[k] > id)
            break;
        o += s->size[ent->data[k]];
    }
    *off = o; /* where a new value would go */
    return -1;
}

const unsigned char *kws_ent_value(const kws_state *s, const kws_ent *ent, uint32_t id)
{
    size_t off;
    return ent_find(s, ent, id, &off) < 0 ? NULL : ent->data + off;
}

/* Room for slot index `idx` (and the free bitmap's word for it). */
static int state_reserve(kws_state *s, uint32_t idx)
{
    if (idx < s->cap)
        return KEEL_OK;
    uint64_t cap = s->cap ? s->cap : 1024;
    while (cap <= idx)
        cap *= 2;
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    size_t ow = ((size_t)s->cap + 63) / 64, nw = ((size_t)cap + 63) / 64;
    uint32_t *gen = realloc(s->gen, cap * sizeof *gen);
    if (gen)
        s->gen = gen;
    kws_ent **ent = realloc(s->ent, cap * sizeof *ent);
    if (ent)
        s->ent = ent;
    uint64_t *bits = realloc(s->free_bits, nw * sizeof *bits);
    if (bits)
        s->free_bits = bits;
    if (!gen || !ent || !bits)
        return KEEL_ENOMEM;
    memset(s->ent + s->cap, 0, (cap - s->cap) * sizeof *ent);
    memset(s->free_bits + ow, 0, (nw - ow) * sizeof *bits);
    s->cap = (uint32_t)cap;
    return KEEL_OK;
}

static void mark_free(kws_state *s, uint32_t i, bool free_)
{
    uint64_t bit = 1ull << (i & 63);
    if (free_) {
        s->free_bits[i >> 6] |= bit;
        if ((i >> 6) < s->free_hint)
            s->free_hint = i >> 6;
    } else {
        s->free_bits[i >> 6] &= ~bit;
    }
}

/* The slot the runtime's allocator would hand out next: the lowest free
 * index, else a new one (world/entity.c). */
static uint32_t next_slot(kws_state *s)
{
    if (s->nlive < s->nslots) {
        uint32_t words = (s->nslots + 63) / 64;
        for (uint32_t w = s->free_hint; w < words; w++) {
            if (s->free_bits[w]) {
                s->free_hint = w;
                return w * 64 + (uint32_t)__builtin_ctzll(s->free_bits[w]);
            }
        }
    }
    return s->nslots;
}

/* A new entity record with the given components (ids need not be sorted;
 * a NULL value is zeros). */
static kws_ent *ent_make(const kws_state *s, uint32_t n, const uint32_t *ids, const void *const *values)
{
    uint32_t order[256], bytes = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t j = k; /* insertion sort by id: n is small */
        while (j && ids[order[j - 1]] > ids[k]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
        bytes += s->size[ids[k]];
    }
    kws_ent *e = malloc(ent_alloc_size(n, bytes));
    if (!e)
        return NULL;
    e->n = n;
    e->bytes = bytes;
    unsigned char *v = e->data + n;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = ids[order[k]], size = s->size[id];
        e->data[k] = (unsigned char)id;
        if (size && values && values[order[k]])
            memcpy(v, values[order[k]], size);
        else
            memset(v, 0, size);
        v += size;
    }
    return e;
}

/* ent with component id inserted (its value, or zeros), ent freed. */
static kws_ent *ent_insert(const kws_state *s, kws_ent *ent, uint32_t id, const void *value)
{
    size_t off;
    ent_find(s, ent, id, &off); /* absent: off is where its value goes */
    uint32_t size = s->size[id], k = 0;
    while (k < ent->n && ent->data[k] < id)
        k++;
    kws_ent *e = malloc(ent_alloc_size(ent->n + 1, ent->bytes + size));
    if (!e)
        return NULL;
    e->n = ent->n + 1;
    e->bytes = ent->bytes + size;
    memcpy(e->data, ent->data, k);
    e->data[k] = (unsigned char)id;
    memcpy(e->data + k + 1, ent->data + k, ent->n - k);
    size_t before = off - ent->n; /* value bytes before the new one */
    memcpy(e->data + e->n, ent->data + ent->n, before);
    if (size && value)
        memcpy(e->data + e->n + before, value, size);
    else
        memset(e->data + e->n + before, 0, size);
    memcpy(e->data + e->n + before + size, ent->data + ent->n + before, ent->bytes - before);
    free(ent);
    return e;
}

/* ent without the component at position k (value at off), ent freed. */
static kws_ent *ent_delete(const kws_state *s, kws_ent *ent, uint32_t k, size_t off)
{
    uint32_t size = s->size[ent->data[k]];
    kws_ent *e = malloc(ent_alloc_size(ent->n - 1, ent->bytes - size));
    if (!e)
        return NULL;
    e->n = ent->n - 1;
    e->bytes = ent->bytes - size;
    memcpy(e->data, ent->data, k);
    memcpy(e->data + k, ent->data + k + 1, ent->n - k - 1);
    size_t before = off - ent->n;
    memcpy(e->data + e->n, ent->data + ent->n, before);
    memcpy(e->data + e->n + before, ent->data + off + size, ent->bytes - before - size);
    free(ent);
    return e;
}

/* ---- the replay --------------------------------------------------------------------- */

typedef struct unit_rec {
    const void *rec;
    kw_header h;
} unit_rec;

struct kws_replay {
    kwt_dir *d;
    kw_rtxn *r;
    kw_walit *it;
    kws_state st;
    kws_info info;
    uint64_t expect;           /* the next LSN */
    uint64_t target;           /* the tick asked last */
    bool peeked, at_end;
    uint64_t peek_lsn;         /* a record of a later tick, read but not applied */
    const void *peek_rec;
    size_t peek_len;
    unit_rec *unit;            /* the open unit's records (pointers into the map) */
    uint32_t nunit, unit_cap;
    kw_decoder dec;
    kwt_progress prog;
    char err[600];
};

/* Record why the replay stops; returns KWT_EXIT_PROBLEM. */
static int fail(kws_replay *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(kws_replay *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return KWT_EXIT_PROBLEM;
}

/* fail() for running out of memory: noted for main (kwt_note_out_of_memory). */
#define fail_oom(r, ...) (kwt_note_out_of_memory(), fail((r), __VA_ARGS__))

static int corrupt(kws_replay *r, uint64_t lsn, const char *why)
{
    return fail(r, "KEEL_ECORRUPT: WAL record at LSN %" PRIu64 ": %s", lsn, why);
}

/* A libkeel_wal error from decoding a record: libkeel_wal's sentences of
 * a damaged record name its LSN already. */
static int lib_error(kws_replay *r, int rc)
{
    return fail(r, "%s: %s", keel_strerror(rc), keel_last_error());
}

static bool comp_known(const kws_replay *r, uint32_t id)
{
    return id >= 1 && id <= r->d->schema.ncomps && id < 256;
}

static bool comp_ok(const kws_replay *r, uint32_t id, uint32_t size)
{
    return comp_known(r, id) && r->st.size[id] == size;
}

/* ---- lifecycle commands ----------------------------------------------------------- */

static int op_spawn(kws_replay *r, uint64_t lsn, const kw_change *ch)
{
    kws_state *s = &r->st;
    uint32_t idx = next_slot(s);
    uint32_t gen = idx < s->nslots ? s->gen[idx] : 1;
    if (ch->entity != ((uint64_t)gen << 32 | idx)) {
        char why[200];
        snprintf(why, sizeof why, "a spawn logged entity %016" PRIx64 " but the allocator hands out %016" PRIx64
                 " (a spawn created a different entity handle than the one logged)", ch->entity,
                 (uint64_t)gen << 32 | idx);
        return corrupt(r, lsn, why);
    }
    bool seen[256] = {false};
    for (uint32_t k = 0; k < ch->n; k++) {
        if (!comp_ok(r, ch->comps[k], ch->sizes[k]) || seen[ch->comps[k]])
            return corrupt(r, lsn, "a spawn names an unknown or repeated component, or a value of the wrong size");
        seen[ch->comps[k]] = true;
    }
    if (idx == UINT32_MAX)
        return fail(r, "LSN %" PRIu64 ": a spawn with every one of the 2^32 entity slots in use", lsn);
    if (state_reserve(s, idx))
        return fail_oom(r, "KEEL_ENOMEM: out of memory for %u entity slots", idx);
    kws_ent *e = ent_make(s, ch->n, ch->comps, ch->values);
    if (!e)
        return fail_oom(r, "KEEL_ENOMEM: out of memory replaying LSN %" PRIu64, lsn);
    if (idx == s->nslots) {
        s->nslots++;
        s->gen[idx] = 1;
    }
    mark_free(s, idx, false);
    s->ent[idx] = e;
    s->nlive++;
    return KEEL_OK;
}

static void op_destroy(kws_state *s, uint32_t idx)
{
    free(s->ent[idx]);
    s->ent[idx] = NULL;
    s->gen[idx] = s->gen[idx] == UINT32_MAX ? 1 : s->gen[idx] + 1; /* 0 is never a generation */
    mark_free(s, idx, true);
    s->nlive--;
}

static int apply_command(kws_replay *r, uint64_t lsn, const kw_change *ch)
{
    kws_state *s = &r->st;
    if (ch->op == KW_OP_SPAWN)
        return op_spawn(r, lsn, ch);
    if (ch->op == KW_OP_ADD && !comp_ok(r, ch->component, ch->size))
        return corrupt(r, lsn, "an add names an unknown component or has the wrong size");
    if (ch->op == KW_OP_REMOVE && !comp_known(r, ch->component))
        return corrupt(r, lsn, "a remove names an unknown component");
    if (!kws_state_get(s, ch->entity))
        return KEEL_OK; /* a null or stale target: playback ignored it (and logged it) */
    uint32_t idx = ent_index(ch->entity);
    size_t off;
    int at;
    switch (ch->op) {
    case KW_OP_DESTROY:
        op_destroy(s, idx);
        return KEEL_OK;
    case KW_OP_ADD:
        if ((at = ent_find(s, s->ent[idx], ch->component, &off)) >= 0) {
            if (ch->size)
                memcpy(s->ent[idx]->data + off, ch->value, ch->size); /* overwrites (world/command.c) */
            return KEEL_OK;
        }
        break;
    case KW_OP_REMOVE:
        if ((at = ent_find(s, s->ent[idx], ch->component, &off)) < 0)
            return KEEL_OK; /* absent: ignored */
        break;
    default:
        return corrupt(r, lsn, "an unknown lifecycle command");
    }
    kws_ent *e = ch->op == KW_OP_ADD ? ent_insert(s, s->ent[idx], ch->component, ch->value)
                                     : ent_delete(s, s->ent[idx], (uint32_t)at, off);
    if (!e)
        return fail_oom(r, "KEEL_ENOMEM: out of memory replaying LSN %" PRIu64, lsn);
    s->ent[idx] = e;
    return KEEL_OK;
}

/* A value row (TICK_CHUNK, SIDE): keel_set's rules. */
static int apply_set(kws_replay *r, uint64_t lsn, const kw_change *ch)
{
    kws_state *s = &r->st;
    char why[200];
    if (!kws_state_get(s, ch->entity)) {
        snprintf(why, sizeof why, "a value row does not apply: entity %016" PRIx64 " is not live", ch->entity);
        return corrupt(r, lsn, why);
    }
    size_t off;
    kws_ent *e = s->ent[ent_index(ch->entity)];
    if (ent_find(s, e, ch->component, &off) < 0) {
        snprintf(why, sizeof why, "a value row does not apply: entity %016" PRIx64 " lacks component %u",
                 ch->entity, ch->component);
        return corrupt(r, lsn, why);
    }
    if (ch->size)
        memcpy(e->data + off, ch->value, ch->size);
    return KEEL_OK;
}

/* One part of a record (kw_each_part); a side transaction is counted. */
static int apply_part(void *arg, const kw_header *h, const void *payload)
{
    kws_replay *r = arg;
    int rc = kw_decode_record(&r->dec, h, payload, &r->d->schema);
    if (rc)
        return lib_error(r, rc);
    r->info.sides += h->kind == KW_KIND_SIDE;
    kw_change ch;
    while ((rc = kw_decode_next(&r->dec, &ch)) == 1) {
        rc = h->kind == KW_KIND_LIFECYCLE ? apply_command(r, h->lsn, &ch) : apply_set(r, h->lsn, &ch);
        if (rc)
            return rc;
    }
    return rc ? lib_error(r, rc) : KEEL_OK;
}

static int apply_record(kws_replay *r, const void *rec, const kw_header *h)
{
    const void *payload;
    int rc = kw_record_payload(r->d->codec, rec, h, &payload);
    if (!rc)
        rc = kw_each_part(h, payload, apply_part, r);
    return rc < 0 ? lib_error(r, rc) : rc; /* a KEEL_E* code of libkeel_wal's, or apply_part's answer */
}

/* A TICK_COMMIT closes the open unit: check it against the records, apply them. */
static int close_unit(kws_replay *r, const void *rec, const kw_header *h)
{
    const void *payload;
    kw_commit_info ci;
    int rc = kw_record_payload(r->d->codec, rec, h, &payload);
    if (rc)
        return lib_error(r, rc);
    if (kw_decode_commit(payload, h->raw_len, &ci) || ci.nrecords != r->nunit)
        return corrupt(r, h->lsn, "the tick's commit marker does not match the records before it");
    for (uint32_t i = 0; i < r->nunit; i++)
        if ((rc = apply_record(r, r->unit[i].rec, &r->unit[i].h)))
            return rc;
    if (r->st.nlive != ci.nlive || r->st.nslots != ci.nslots) {
        char why[200];
        snprintf(why, sizeof why, "the replayed tick ends with %u live entities in %u slots, the marker says %u in %u",
                 r->st.nlive, r->st.nslots, ci.nlive, ci.nslots);
        return corrupt(r, h->lsn, why);
    }
    if (!(h->flags & KW_FLAG_HOOK) && h->tick > r->info.last_tick)
        r->info.last_tick = h->tick;
    r->info.units++;
    r->nunit = 0;
    return KEEL_OK;
}

static int unit_push(kws_replay *r, const void *rec, const kw_header *h)
{
    if (r->nunit && r->unit[0].h.tick != h->tick)
        return corrupt(r, h->lsn, "a record of the unit belongs to another tick");
    if (r->nunit == r->unit_cap) {
        uint32_t cap = r->unit_cap ? r->unit_cap * 2 : 64;
        unit_rec *u = realloc(r->unit, cap * sizeof *u);
        if (!u)
            return fail_oom(r, "KEEL_ENOMEM: out of memory replaying the WAL");
        r->unit = u;
        r->unit_cap = cap;
    }
    r->unit[r->nunit++] = (unit_rec){rec, *h};
    return KEEL_OK;
}

/* Does the record belong to a tick after the target? (Schema and
 * checkpoint markers belong to none: a CHECKPOINT names the tick it covers
 * and can follow later ticks.) */
static bool later_tick(const kw_header *h, uint64_t target)
{
    switch (h->kind) {
    case KW_KIND_TICK_CHUNK:
    case KW_KIND_LIFECYCLE:
    case KW_KIND_TICK_COMMIT:
    case KW_KIND_SIDE:
    case KW_KIND_SIDES:
        return h->tick > target;
    default:
        return false;
    }
}

/* step's answer for a record of a later tick (left for the next
 * kws_replay_to); distinct from every exit status. */
#define STEP_LATER (-1)

/* One record in LSN order: 0 applied or collected, STEP_LATER, or
 * KWT_EXIT_PROBLEM (r->err says why). */
static int step(kws_replay *r, uint64_t lsn, const void *rec, size_t len)
{
    kw_header h;
    if (kw_wal_check(lsn, r->expect, rec, len, &h, NULL))
        return lib_error(r, KEEL_ECORRUPT);
    if (later_tick(&h, r->target)) /* the open unit's records are of an earlier tick */
        return r->nunit ? corrupt(r, lsn, "a record of the unit belongs to another tick") : STEP_LATER;
    int rc = KEEL_OK;
    switch (h.kind) {
    case KW_KIND_TICK_CHUNK:
    case KW_KIND_LIFECYCLE:
        rc = unit_push(r, rec, &h);
        break;
    case KW_KIND_TICK_COMMIT:
        if (r->nunit && r->unit[0].h.tick != h.tick)
            return corrupt(r, r->unit[0].h.lsn, "a record of the unit belongs to another tick");
        rc = close_unit(r, rec, &h);
        break;
    case KW_KIND_SIDE:
    case KW_KIND_SIDES:
        if (r->nunit)
            return corrupt(r, lsn, "a side transaction inside an unfinished tick unit");
        rc = apply_record(r, rec, &h);
        break;
    case KW_KIND_EPOCH: /* a deposed primary's unfinished unit was never committed */
        r->nunit = 0;
        break;
    default: /* schema, checkpoint markers: nothing to apply */
        break;
    }
    if (rc)
        return rc;
    r->info.records++;
    r->info.lsn = lsn;
    r->expect = lsn + 1;
    return KEEL_OK;
}

static int advance(kws_replay *r, uint64_t tick)
{
    r->target = tick;
    kwt_progress_begin(&r->prog, "replay: LSN", r->info.last_lsn);
    int rc = KEEL_OK;
    while (!r->at_end) {
        uint64_t lsn;
        const void *rec;
        size_t len;
        if (r->peeked) {
            lsn = r->peek_lsn, rec = r->peek_rec, len = r->peek_len;
            r->peeked = false;
        } else if ((rc = kw_wal_next(r->it, &lsn, &rec, &len)) != 1) {
            if (rc < 0) {
                kwt_progress_end(&r->prog);
                return fail(r, "reading the WAL after LSN %" PRIu64 ": %s", r->info.lsn, keel_last_error());
            }
            r->at_end = true;
            break;
        }
        if ((rc = step(r, lsn, rec, len)) == STEP_LATER) {
            r->peeked = true;
            r->peek_lsn = lsn, r->peek_rec = rec, r->peek_len = len;
            kwt_progress_end(&r->prog);
            return KEEL_OK; /* a later tick follows: tick is complete */
        }
        if (rc) {
            kwt_progress_end(&r->prog);
            return rc;
        }
        kwt_progress_step(&r->prog, lsn);
    }
    kwt_progress_end(&r->prog);
    if (r->nunit)
        return corrupt(r, r->unit[0].h.lsn, "the unit starting here has no commit marker (a truncated tail)");
    if (tick > r->info.last_tick)
        return fail(r, "tick %" PRIu64 " is beyond the last completed tick %" PRIu64 " (the WAL ends at LSN %" PRIu64
                    ")", tick, r->info.last_tick, r->info.lsn);
    return KEEL_OK;
}

/* ---- the checkpoint ----------------------------------------------------------------- */

typedef struct ckpt_load {
    kws_replay *r;
    uint32_t ntables;
    uint32_t *rows;            /* per table: rows the table list says */
    uint32_t *loaded;          /* per table: rows its chunks held */
    uint64_t (*sets)[4];       /* per table: the component set */
    uint32_t nlive;            /* live entities the table list says */
    uint32_t nslots;           /* entity slots the table list says (the pages must cover them) */
    kw_snap_chunk chunk;
} ckpt_load;

static int ckpt_fail(ckpt_load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ckpt_fail(ckpt_load *l, const char *fmt, ...)
{
    char why[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return fail(l->r, "KEEL_ECORRUPT: the checkpoint of tick %" PRIu64 " is unreadable: %s",
                l->r->info.checkpoint_tick, why);
}

static int set_cmp(const void *a, const void *b)
{
    return memcmp(a, b, 4 * sizeof(uint64_t));
}

/* Two tables with one component set: restore would refuse it (world/restore.c). */
static bool sets_repeat(const ckpt_load *l)
{
    uint64_t(*copy)[4] = malloc(((size_t)l->ntables + 1) * sizeof *copy);
    if (!copy) { /* unchecked: the command must not end as if it had been */
        kwt_note_out_of_memory();
        return false;
    }
    memcpy(copy, l->sets, (size_t)l->ntables * sizeof *copy);
    qsort(copy, l->ntables, sizeof *copy, set_cmp);
    bool rep = false;
    for (uint32_t t = 1; t < l->ntables && !rep; t++)
        rep = !memcmp(copy[t - 1], copy[t], sizeof *copy);
    free(copy);
    return rep;
}

static int load_table_list(ckpt_load *l, const void *p, size_t plen)
{
    kws_replay *r = l->r;
    kw_snap_tables tl;
    kw_snap_table t;
    if (kw_snap_tables_begin(&tl, p, plen))
        return ckpt_fail(l, "%s", keel_last_error());
    l->ntables = tl.ntables;
    l->rows = calloc((size_t)tl.ntables + 1, sizeof *l->rows);
    l->loaded = calloc((size_t)tl.ntables + 1, sizeof *l->loaded);
    l->sets = calloc((size_t)tl.ntables + 1, sizeof *l->sets);
    if (!l->rows || !l->loaded || !l->sets)
        return fail_oom(r, "KEEL_ENOMEM: out of memory for %u checkpoint tables", tl.ntables);
    int rc;
    for (uint32_t id = 0; (rc = kw_snap_tables_next(&tl, &t)) == 1; id++) {
        l->rows[id] = t.rows;
        for (uint32_t i = 0; i < t.ncols; i++) {
            uint32_t c = t.comps[i];
            if (c < 1 || c > r->d->schema.ncomps || c > 255)
                return ckpt_fail(l, "table %u names unknown component %u", id, c);
            l->sets[id][c >> 6] |= 1ull << (c & 63);
        }
    }
    if (rc < 0)
        return ckpt_fail(l, "%s", keel_last_error());
    if (sets_repeat(l))
        return ckpt_fail(l, "two tables have the same component set");
    l->nslots = tl.nslots; /* the slots come with their pages (load_pages) */
    l->nlive = tl.nlive;   /* checked once the rows are in */
    return KEEL_OK;
}

static int load_pages(ckpt_load *l)
{
    kws_replay *r = l->r;
    kw_walit *it;
    const void *key, *val, *p;
    size_t klen, vlen, plen;
    int rc = kw_db_iter(r->r, KW_DB_SNAP, "S", 1, &it);
    while (!rc && (rc = kw_db_next(it, &key, &klen, &val, &vlen)) == 1) {
        kw_snap_slots sp;
        if (kw_snap_payload(r->d->codec, val, vlen, KW_KIND_SNAP_SLOTS, &p, &plen) ||
            kw_snap_slots_decode(p, plen, &sp)) {
            rc = ckpt_fail(l, "%s", keel_last_error());
            break;
        }
        /* each page starts where the one before ended, so the slots grow with the pages that hold
           them, not with what the table list claims */
        kws_state *s = &r->st;
        if (sp.first != s->nslots || (uint64_t)sp.first + sp.n > l->nslots) {
            rc = ckpt_fail(l, "slot page at %u (+%u) does not follow slot %u of %u", sp.first, sp.n, s->nslots,
                           l->nslots);
            break;
        }
        if (sp.n && state_reserve(s, sp.first + sp.n - 1)) {
            rc = fail_oom(r, "KEEL_ENOMEM: out of memory for %u entity slots", sp.first + sp.n);
            break;
        }
        for (uint32_t i = 0; i < sp.n; i++) { /* free until a chunk's row says otherwise */
            s->gen[sp.first + i] = kw_snap_slot_gen(&sp, i);
            mark_free(s, sp.first + i, true);
        }
        s->nslots += sp.n;
        rc = KEEL_OK;
    }
    kw_wal_iter_end(it);
    if (rc < 0)
        return fail(r, "reading the checkpoint: %s", keel_last_error());
    r->st.free_hint = 0;
    if (!rc && r->st.nslots != l->nslots)
        rc = ckpt_fail(l, "slot pages cover %u of its %u slots", r->st.nslots, l->nslots);
    return rc;
}

static int load_chunk(ckpt_load *l, const void *p, size_t plen)
{
    kws_replay *r = l->r;
    kws_state *s = &r->st;
    kw_snap_chunk *k = &l->chunk;
    if (kw_snap_chunk_decode(p, plen, k))
        return ckpt_fail(l, "%s", keel_last_error());
    if (k->table >= l->ntables)
        return ckpt_fail(l, "chunk %u names table %u of %u", k->chunk, k->table, l->ntables);
    const uint64_t *set = l->sets[k->table];
    const void *vals[256] = {NULL};
    for (uint32_t i = 0; i < k->ncols; i++) {
        uint32_t c = k->comps[i];
        if (c > 255 || !(set[c >> 6] >> (c & 63) & 1) || s->size[c] != k->sizes[i])
            return ckpt_fail(l, "chunk %u of table %u names a column the table lacks", k->chunk, k->table);
    }
    /* the table's components in id order; columns not stored (TRANSIENT, tags) load as zeros */
    uint32_t ids[256], n = 0;
    for (uint32_t c = 1; c < 256; c++)
        if (set[c >> 6] >> (c & 63) & 1)
            ids[n++] = c;
    for (uint32_t row = 0; row < k->count; row++) {
        uint64_t e = kw_snap_chunk_entity(k, row);
        uint32_t idx = ent_index(e);
        if (idx >= s->nslots || s->ent[idx] || s->gen[idx] != ent_gen(e))
            return ckpt_fail(l, "a row of table %u names entity %016" PRIx64 ", which is not a free slot of the "
                             "right generation", k->table, e);
        for (uint32_t j = 0; j < n; j++)
            vals[j] = NULL;
        for (uint32_t i = 0; i < k->ncols; i++)
            for (uint32_t j = 0; j < n; j++)
                if (ids[j] == k->comps[i])
                    vals[j] = k->vals[i] + (size_t)row * k->sizes[i];
        if (!(s->ent[idx] = ent_make(s, n, ids, vals)))
            return fail_oom(r, "KEEL_ENOMEM: out of memory loading the checkpoint");
        mark_free(s, idx, false);
        s->nlive++;
        l->loaded[k->table]++;
    }
    return KEEL_OK;
}

static int load_checkpoint(kws_replay *r)
{
    ckpt_load *l = calloc(1, sizeof *l);
    if (!l)
        return fail_oom(r, "KEEL_ENOMEM: out of memory loading the checkpoint");
    l->r = r;
    const void *val, *p;
    size_t vlen, plen;
    int rc = kw_get(r->r, KW_DB_SNAP, "T", 1, &val, &vlen);
    if (rc)
        rc = rc == KEEL_ENOENT ? ckpt_fail(l, "it has no table list (snap key \"T\")")
                               : fail(r, "reading the checkpoint: %s", keel_last_error());
    else if (kw_snap_payload(r->d->codec, val, vlen, KW_KIND_SNAP_TABLES, &p, &plen))
        rc = ckpt_fail(l, "%s", keel_last_error());
    else
        rc = load_table_list(l, p, plen);
    if (!rc)
        rc = load_pages(l);
    kw_walit *it = NULL;
    const void *key;
    size_t klen;
    if (!rc && (rc = kw_db_iter(r->r, KW_DB_SNAP, "C", 1, &it)))
        rc = fail(r, "reading the checkpoint: %s", keel_last_error());
    while (!rc && (rc = kw_db_next(it, &key, &klen, &val, &vlen)) == 1) {
        if (kw_snap_payload(r->d->codec, val, vlen, KW_KIND_SNAP_CHUNK, &p, &plen))
            rc = ckpt_fail(l, "%s", keel_last_error());
        else
            rc = load_chunk(l, p, plen);
    }
    if (rc < 0)
        rc = fail(r, "reading the checkpoint: %s", keel_last_error());
    kw_wal_iter_end(it);
    for (uint32_t t = 0; !rc && t < l->ntables; t++)
        if (l->rows[t] != l->loaded[t])
            rc = ckpt_fail(l, "table %u has %u rows, its chunks hold %u", t, l->rows[t], l->loaded[t]);
    if (!rc && r->st.nlive != l->nlive)
        rc = ckpt_fail(l, "%u live entities listed, %u loaded", l->nlive, r->st.nlive);
    free(l->rows);
    free(l->loaded);
    free(l->sets);
    free(l);
    return rc;
}

/* ---- opening ------------------------------------------------------------------------ */

/* Where the replay starts: the checkpoint or LSN 1; refuses when the WAL no
 * longer reaches back far enough. */
static int choose_start(kws_replay *r, uint64_t first_tick, bool no_checkpoint, bool *use_ckpt)
{
    const kwt_dir *d = r->d;
    kws_info *in = &r->info;
    *use_ckpt = d->has_checkpoint && d->checkpoint.tick <= first_tick && !no_checkpoint;
    if (*use_ckpt || in->first_lsn == 1 || (!in->first_lsn && !d->has_checkpoint))
        return KEEL_OK;
    if (!d->has_checkpoint)
        return fail(r, "the WAL starts at LSN %" PRIu64 ", not 1, and there is no checkpoint: records are missing",
                    in->first_lsn);
    /* a copy of a purged stream: its published checkpoint, the records the stream retains before it */
    if (d->stream && no_checkpoint)
        return fail(r, "--no-checkpoint needs the records from LSN 1, but the stream was purged to its published "
                    "checkpoint of tick %" PRIu64, d->checkpoint.tick);
    if (d->stream)
        return fail(r, "tick %" PRIu64 " is before the stream's published checkpoint of tick %" PRIu64 ", the oldest "
                    "state the purged stream keeps (no older state can be rebuilt from it). The earliest tick replay "
                    "can rebuild is %" PRIu64, first_tick, d->checkpoint.tick, d->checkpoint.tick);
    char starts[80];
    /* up to the checkpoint's LSN, or less where the stream had not acknowledged the rest (a replicated primary) */
    uint64_t deleted_to = in->first_lsn ? in->first_lsn - 1 : d->checkpoint.lsn;
    if (in->first_lsn)
        snprintf(starts, sizeof starts, "the WAL starts at LSN %" PRIu64, in->first_lsn);
    else
        snprintf(starts, sizeof starts, "the WAL is empty");
    if (no_checkpoint)
        return fail(r, "--no-checkpoint needs the WAL from LSN 1, but %s: the checkpoint of tick %" PRIu64
                    " deleted the records up to LSN %" PRIu64 " it covers (the runtime ran without wal_retain)",
                    starts, d->checkpoint.tick, deleted_to);
    return fail(r, "tick %" PRIu64 " is no longer reachable: it is before the checkpoint of tick %" PRIu64
                ", and %s: the checkpoint deleted the WAL records up to LSN %" PRIu64 " it covers (the runtime ran "
                "without wal_retain, which keeps them for time travel and audit). The earliest tick replay can "
                "rebuild is %" PRIu64, first_tick, d->checkpoint.tick, starts, deleted_to,
                d->checkpoint.tick);
}

static int replay_start(kws_replay *r, uint64_t first_tick, bool no_checkpoint)
{
    kwt_dir *d = r->d;
    if (!d->has_schema)
        return fail(r, "%s", d->schema_error[0] ? d->schema_error
                                                : "no schema is stored: no runtime has opened this directory yet");
    if (d->checkpoint_error[0])
        return fail(r, "KEEL_ECORRUPT: %s", d->checkpoint_error);
    kws_state_init(&r->st, &d->schema);
    if (kwt_read_begin(d, &r->r))
        return KWT_EXIT_USAGE;
    uint64_t count;
    int rc = kw_wal_bounds(r->r, &r->info.first_lsn, &r->info.last_lsn, &count);
    if (rc && rc != KEEL_ENOENT)
        return fail(r, "reading the WAL: %s", keel_last_error());
    r->info.checkpoint_tick = d->has_checkpoint ? d->checkpoint.tick : 0;
    r->info.checkpoint_lsn = d->has_checkpoint ? d->checkpoint.lsn : 0;
    bool use_ckpt;
    if ((rc = choose_start(r, first_tick, no_checkpoint, &use_ckpt)))
        return rc;
    r->expect = 1;
    if (use_ckpt) {
        if ((rc = load_checkpoint(r)))
            return rc;
        r->info.from_checkpoint = true;
        r->info.last_tick = d->checkpoint.tick;
        r->info.lsn = d->checkpoint.lsn;
        r->expect = d->checkpoint.lsn + 1;
    }
    r->info.start_lsn = r->expect;
    r->target = first_tick;
    if (kw_wal_iter(r->r, r->expect, &r->it))
        return fail(r, "reading the WAL: %s", keel_last_error());
    return KEEL_OK;
}

int kws_replay_open(kwt_dir *d, uint64_t first_tick, bool no_checkpoint, kws_replay **out)
{
    kwt_guard_set(d->path, KWT_EXIT_PROBLEM);
    kws_replay *r = calloc(1, sizeof *r);
    *out = NULL;
    if (!r) {
        kwt_err(d->path, "KEEL_ENOMEM: out of memory");
        return KWT_EXIT_USAGE;
    }
    r->d = d;
    int rc = replay_start(r, first_tick, no_checkpoint);
    if (rc) {
        if (r->err[0])
            kwt_err(d->path, "%s", r->err);
        kws_replay_close(r);
        return rc;
    }
    *out = r;
    return KEEL_OK;
}

int kws_replay_to(kws_replay *r, uint64_t tick)
{
    int rc = advance(r, tick);
    if (rc && r->err[0])
        kwt_err(r->d->path, "%s", r->err);
    return rc;
}

kws_state *kws_replay_state(kws_replay *r)
{
    return &r->st;
}

const kws_info *kws_replay_info(const kws_replay *r)
{
    return &r->info;
}

void kws_replay_close(kws_replay *r)
{
    if (!r)
        return;
    kw_wal_iter_end(r->it);
    if (r->r)
        kw_read_end(r->r);
    kws_state_free(&r->st);
    free(r->unit);
    free(r);
}

/* ---- the arguments replay and diff share ------------------------------------------------ */

int kws_arg(const char *cmd, const char *arg, kws_args *a)
{
    if (!strcmp(arg, "--json"))
        a->json = true;
    else if (!strcmp(arg, "--no-checkpoint"))
        a->no_checkpoint = true;
    else if (arg[0] == '-' && arg[1])
        return kwt_usage_error(cmd, "unknown option '%s'", arg);
    else if (a->dir)
        return kwt_usage_error(cmd, "one data directory only ('%s' and '%s')", a->dir, arg);
    else
        a->dir = arg;
    return KWT_EXIT_OK;
}

int kws_need_dir(const char *cmd, const kws_args *a)
{
    return a->dir ? KWT_EXIT_OK : kwt_usage_error(cmd, "no data directory given");
}
