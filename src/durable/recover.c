/*
 * durable/recover.c -- opening a data directory: the schema check, loading
 * the last checkpoint, replaying the WAL after it, and starting the writer.
 *
 * Replay applies whole units only: the records of a tick (or of
 * on_first_tick) are collected until their TICK_COMMIT marker and then
 * applied in order -- value rows through the same write path as keel_set,
 * lifecycle commands through the same command playback as the sync point,
 * so storage ends up row for row as it was. A side transaction is a unit of
 * its own and is applied where it stands in LSN order, also when the tick
 * it ran in never reached the disk (it was acknowledged on its own). Every
 * record's CRC is checked and LSNs must be consecutive; the first invalid
 * record stops the open with KEEL_ECORRUPT naming its LSN, unless
 * truncate_bad_tail asks to drop it and everything after it (the unit it
 * belongs to included, so nothing half-applied remains).
 *
 * Failpoints (docs/testing.md): recover.before_replay (the checkpoint is
 * loaded), recover.mid_replay (after every applied unit: a tick's or the
 * hook's records at their marker, or one side transaction), and
 * recover.after_replay in keel_runtime_recover (durable.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "durable/durable_internal.h"

/* ---- schema ------------------------------------------------------------------------ */

/* Every mismatch message ends with what to do about it. */
#define SCHEMA_FIX "register the stored layout, or start a new data directory; the data directory was not changed"

/* Append "; <what>" (the first without "; ") to the sentence being built. */
static void diff_add(char *buf, size_t cap, size_t *len, const char *fmt, ...) CORE_PRINTF(4, 5);
static void diff_add(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap)
        return;
    if (*len)
        *len += (size_t)snprintf(buf + *len, cap - *len, "; ");
    if (*len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    *len += (size_t)vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
}

/* The first field whose name, type, offset or count differ, every
 * difference named ("field 'x': stored type f32, registered f64"). */
static void diff_fields(const keel_component_desc *reg, const kw_component *k, char *buf, size_t cap, size_t *len)
{
    uint32_t n = reg->field_count < k->nfields ? reg->field_count : k->nfields;
    for (uint32_t f = 0; f < n; f++) {
        const keel_field *a = &reg->fields[f];
        const kw_field *b = &k->fields[f];
        size_t before = *len;
        if (strcmp(a->name, b->name))
            diff_add(buf, cap, len, "field %u: stored '%s', registered '%s'", f, b->name, a->name);
        else if ((uint32_t)a->type != b->type)
            diff_add(buf, cap, len, "field '%s': stored type %s, registered %s", b->name, kw_scalar_name(b->type),
                     keel_type_name(a->type));
        else if (a->offset != b->offset)
            diff_add(buf, cap, len, "field '%s': stored at offset %u, registered at %u", b->name, b->offset,
                     a->offset);
        else if (a->count != b->count)
            diff_add(buf, cap, len, "field '%s': stored count %u, registered %u", b->name, b->count, a->count);
        if (*len != before)
            return;
    }
}

static int check_component(const keel_world *w, const kw_component *k)
{
    if (k->id > w->ncomps)
        return core_fail(KEEL_EINVAL, "component '%s' (id %u, %s) is stored in the data directory but not "
                                      "registered; register every stored component, in the stored order (new "
                                      "ones after them), or start a new data directory",
                         k->name, k->id, kw_discipline_name(k->discipline));
    const world_component *c = &w->comps[k->id];
    if (strcmp(c->name, k->name))
        return core_fail(KEEL_EINVAL, "component id %u is '%s' in the data directory but '%s' is registered with "
                                      "that id; register stored components in the stored order, new ones last, "
                                      "or start a new data directory",
                         k->id, k->name, c->name);
    const keel_component_desc *reg = &c->desc;
    char diff[768];
    size_t len = 0;
    diff[0] = 0;
    if ((uint32_t)reg->discipline != k->discipline)
        diff_add(diff, sizeof diff, &len, "stored discipline %s, registered %s", kw_discipline_name(k->discipline),
                 keel_discipline_name(reg->discipline));
    if (reg->size != k->size)
        diff_add(diff, sizeof diff, &len, "stored size %u bytes, registered %u", k->size, reg->size);
    if (reg->align != k->align)
        diff_add(diff, sizeof diff, &len, "stored alignment %u, registered %u", k->align, reg->align);
    if (reg->field_count != k->nfields)
        diff_add(diff, sizeof diff, &len, "stored %u fields, registered %u", k->nfields, reg->field_count);
    diff_fields(reg, k, diff, sizeof diff, &len);
    if (len)
        return core_fail(KEEL_EINVAL, "component '%s': %s; " SCHEMA_FIX, k->name, diff);
    return KEEL_OK;
}

/* 1 when the registered schema extends the stored record `val` (write
 * it; also when there is none: val NULL), 0 when equal, or an error. */
static int check_schema(const keel_world *w, const void *val, size_t len, kw_codec_ctx *c)
{
    if (!val)
        return 1;
    kw_header h;
    const void *payload;
    kw_schema s;
    int rc;
    if ((rc = kw_record_check(val, len, &h)) || (rc = kw_record_payload(c, val, &h, &payload)) ||
        (rc = kw_schema_decode(payload, h.raw_len, &s)))
        return rc == KEEL_ECORRUPT ? core_fail_prefix(rc, "the stored schema is unreadable") : rc;
    for (uint32_t i = 0; !rc && i < s.ncomps; i++)
        rc = check_component(w, &s.comps[i]);
    uint32_t stored = s.ncomps;
    kw_schema_free(&s);
    return rc ? rc : w->ncomps > stored;
}

/* check_schema on the directory's schema record. */
static int check_stored_schema(dur_state *d, kw_rtxn *r, kw_codec_ctx *c)
{
    const void *val;
    size_t len;
    int rc = kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &val, &len);
    if (rc && rc != KEEL_ENOENT)
        return rc;
    return check_schema(d->world, rc ? NULL : val, len, c);
}

int dur_schema_extends(const keel_world *w, const void *rec, size_t len)
{
    kw_codec_ctx *c;
    int rc = kw_codec_create(&(kw_codec_desc){.level = KW_CODEC_LEVEL_DEFAULT}, &c);
    if (rc)
        return rc;
    rc = check_schema(w, rec, len, c);
    kw_codec_destroy(c);
    return rc;
}

typedef struct schema_write {
    kw_buf rec;
    uint64_t lsn;
} schema_write;

static int fill_schema(kw_wtxn *t, void *arg)
{
    schema_write *s = arg;
    int rc = kw_put(t, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), s->rec.p, s->rec.len);
    return rc ? rc : kw_put_wal(t, s->lsn, s->rec.p, s->rec.len);
}

static int write_schema(dur_state *d, kw_codec_ctx *c, uint64_t lsn)
{
    kw_buf payload = {0};
    schema_write s = {.lsn = lsn};
    int rc = fence_schema_payload(d, &payload);
    if (!rc)
        rc = kw_record_build(c, &s.rec, KW_KIND_SCHEMA, lsn, 0, 0, payload.p, payload.len);
    if (!rc)
        rc = kw_store_write(d->store, fill_schema, &s);
    kw_buf_free(&payload);
    kw_buf_free(&s.rec);
    return rc;
}

/* ---- checkpoint -------------------------------------------------------------------- */

typedef struct loader {
    dur_state *d;
    kw_rtxn *r;
    kw_codec_ctx *c;
    keel_recovery *out;
    uint64_t unit_mutations;   /* the world's mutation count when replay_range last completed a unit */
    uint32_t *counts;          /* rows per table, as the checkpoint's table list says */
    uint32_t ntables, nlive;
    kw_snap_chunk chunk;       /* the chunk being loaded (too big for the stack frame) */
    dur_snap_src src;          /* the checkpoint's snap entries */
    int have;                  /* 1: `e` is the source's next entry; 0: none is left */
    struct snap_entry {
        const void *key, *val;
        size_t klen, vlen;
    } e;
} loader;

/* The source's next entry into l->e. */
static int snap_advance(loader *l)
{
    struct snap_entry *e = &l->e;
    l->have = l->src.next(l->src.self, &e->key, &e->klen, &e->val, &e->vlen);
    return l->have < 0 ? l->have : KEEL_OK;
}

/* Is the next entry one of kind `prefix` ('T', 'S', 'C', 'K')? */
static bool snap_at(const loader *l, char prefix)
{
    return l->have == 1 && l->e.klen && *(const char *)l->e.key == prefix;
}

/* Check and decode the next entry's value as the expected kind (the
 * payload stays in the codec's scratch until the next snap value). */
static int snap_payload(loader *l, uint32_t kind, const void **p, size_t *plen)
{
    const struct snap_entry *e = &l->e;
    int rc = kw_snap_payload(l->c, e->val, e->vlen, kind, p, plen);
    if (rc)
        return core_fail_prefix(rc, "checkpoint of tick %llu is unreadable (snap key '%c', %zu bytes)",
                                (unsigned long long)l->out->checkpoint_tick, e->klen ? *(const char *)e->key : '?',
                                e->klen);
    return ckpt_stored_note(l->d, e->key, e->klen, core_digest64(*p, *plen));
}

/* A decoder's KEEL_ECORRUPT, with the checkpoint named. */
static int snap_corrupt(loader *l, int rc)
{
    if (rc != KEEL_ECORRUPT)
        return rc;
    return core_fail_prefix(rc, "checkpoint of tick %llu", (unsigned long long)l->out->checkpoint_tick);
}

static int load_slots_and_tables(loader *l, const void *tables, size_t tlen, uint32_t *nslots_out);

static int load_tables(loader *l, uint32_t *nslots_out)
{
    const void *p;
    size_t plen;
    if (!snap_at(l, 'T'))
        return core_fail(KEEL_ECORRUPT, "checkpoint of tick %llu has no table list",
                         (unsigned long long)l->out->checkpoint_tick);
    int rc = snap_payload(l, KW_KIND_SNAP_TABLES, &p, &plen);
    if (rc)
        return rc;
    /* the payload lives in the codec's scratch, which the slot pages below
     * reuse: keep a copy for the table list */
    unsigned char *tables = malloc(plen ? plen : 1);
    if (!tables)
        return core_fail(KEEL_ENOMEM, "out of memory loading the checkpoint's table list");
    memcpy(tables, p, plen);
    rc = snap_advance(l);
    if (!rc)
        rc = load_slots_and_tables(l, tables, plen, nslots_out);
    free(tables);
    return rc;
}

/* Every "S" page into *gens (the caller frees it), grown as the pages
 * come: each page starts where the one before ended, and together they
 * cover the table list's nslots. So what is allocated follows what the
 * checkpoint holds, not what its table list claims: a list claiming 2^32
 * slots over a few pages is refused before the entity index is sized. */
static int load_slots(loader *l, uint32_t nslots, uint32_t **gens)
{
    uint32_t have = 0, cap = 0;
    int rc = KEEL_OK;
    for (; !rc && snap_at(l, 'S'); rc = snap_advance(l)) {
        const void *p;
        size_t plen;
        kw_snap_slots s;
        if ((rc = snap_payload(l, KW_KIND_SNAP_SLOTS, &p, &plen)) ||
            (rc = snap_corrupt(l, kw_snap_slots_decode(p, plen, &s))))
            return rc;
        if (s.first != have || (uint64_t)s.first + s.n > nslots)
            return snap_corrupt(l, core_fail(KEEL_ECORRUPT, "slot page at %u (+%u) does not follow slot %u of %u",
                                             s.first, s.n, have, nslots));
        if (have + s.n > cap) { /* doubling, within nslots: at most twice what the pages hold */
            uint64_t want = cap ? 2 * (uint64_t)cap : KW_SNAP_PAGE_SLOTS;
            want = want < nslots ? want : nslots;
            want = want > have + s.n ? want : have + s.n;
            uint32_t *g = realloc(*gens, (size_t)want * sizeof *g);
            if (!g)
                return core_fail(KEEL_ENOMEM, "out of memory loading the checkpoint's slot page at %u", s.first);
            *gens = g;
            cap = (uint32_t)want;
        }
        for (uint32_t i = 0; i < s.n; i++)
            (*gens)[have + i] = kw_snap_slot_gen(&s, i);
        have += s.n;
    }
    if (!rc && have != nslots)
        rc = snap_corrupt(l, core_fail(KEEL_ECORRUPT, "slot pages cover %u of its %u slots", have, nslots));
    return rc;
}

static int load_slots_and_tables(loader *l, const void *tables, size_t tlen, uint32_t *nslots_out)
{
    kw_snap_tables tl;
    int rc = snap_corrupt(l, kw_snap_tables_begin(&tl, tables, tlen));
    if (rc)
        return rc;
    uint32_t ntables = tl.ntables, nslots = tl.nslots;
    l->nlive = tl.nlive; /* checked after the rows are in */
    if (!(l->counts = calloc(ntables + 1, sizeof *l->counts)))
        return core_fail(KEEL_ENOMEM, "out of memory loading the checkpoint's %u tables", ntables);
    l->ntables = ntables;
    /* the slots first: rows need their generations (a count over the world's cap is refused before
       anything the size of it is allocated) */
    if ((rc = world_restore_fits(l->d->world, nslots)))
        return rc;
    uint32_t *gens = NULL;
    rc = load_slots(l, nslots, &gens);
    if (!rc)
        rc = world_restore_begin(l->d->world, nslots, gens);
    free(gens);
    kw_snap_table t;
    for (uint32_t id = 0; !rc && (rc = snap_corrupt(l, kw_snap_tables_next(&tl, &t))) == 1; id++) {
        l->counts[id] = t.rows;
        if (t.ncols > KEEL_MAX_COMPONENTS)
            return core_fail(KEEL_ECORRUPT, "checkpoint table list is malformed at table %u", id);
        rc = world_restore_table(l->d->world, t.comps, t.ncols, id);
    }
    *nslots_out = nslots;
    return rc;
}

static int load_chunk(loader *l, const void *p, size_t plen)
{
    keel_world *w = l->d->world;
    kw_snap_chunk *k = &l->chunk;
    int rc = snap_corrupt(l, kw_snap_chunk_decode(p, plen, k));
    if (rc)
        return rc;
    if (k->table >= w->ntables || k->ncols > KEEL_MAX_COMPONENTS)
        return core_fail(KEEL_ECORRUPT, "checkpoint chunk %u of table %u has a bad header", k->chunk, k->table);
    const world_table *t = w->tables[k->table];
    uint32_t col_of[KEEL_MAX_COMPONENTS];
    for (uint32_t i = 0; i < k->ncols; i++) {
        keel_component comp = k->comps[i];
        col_of[i] = comp <= KEEL_MAX_COMPONENTS ? t->col_of[comp] : 0;
        if (!col_of[i] || t->cols[col_of[i] - 1].size != k->sizes[i])
            return core_fail(KEEL_ECORRUPT, "checkpoint chunk %u of table %u names a column the table lacks", k->chunk,
                             k->table);
    }
    const void *cols[KEEL_MAX_COMPONENTS + 1] = {0};
    for (uint32_t i = 0; i < k->ncols; i++)
        cols[col_of[i] - 1] = k->vals[i];
    return world_restore_rows(w, k->table, k->count, k->ents, cols);
}

static int remember_key(dur_state *d, uint64_t key, uint64_t tick, uint64_t lsn);

/* The idempotency keys the checkpoint remembers ("K"; absent: none, also
 * in a directory written before keys existed). */
static int load_keys(loader *l)
{
    if (!snap_at(l, 'K'))
        return KEEL_OK;
    const void *p;
    size_t plen;
    kw_snap_keys k;
    int rc;
    if ((rc = snap_payload(l, KW_KIND_SNAP_KEYS, &p, &plen)) ||
        (rc = snap_corrupt(l, kw_snap_keys_decode(p, plen, &k))))
        return rc;
    for (uint32_t i = 0; !rc && i < k.n; i++) {
        uint64_t key, tick;
        kw_snap_keys_get(&k, i, &key, &tick);
        rc = remember_key(l->d, key, tick, 0);
    }
    return rc ? rc : snap_advance(l);
}

/* The checkpoint whose meta value is `meta` (NULL: none) from l->src:
 * the table list, the slot pages, the chunks, the keys, nothing else. */
static int load_checkpoint(loader *l, const void *meta, size_t mlen, kw_checkpoint_meta *m)
{
    *m = (kw_checkpoint_meta){0};
    if (!meta)
        return KEEL_OK;
    int rc = kw_checkpoint_meta_decode(meta, mlen, m);
    if (rc)
        return rc;
    l->out->checkpoint_tick = m->tick;
    l->out->tick = m->tick; /* ticks replayed after it raise it */
    uint32_t nslots;
    if ((rc = snap_advance(l)) || (rc = load_tables(l, &nslots)))
        return rc;
    for (; !rc && snap_at(l, 'C'); rc = rc ? rc : snap_advance(l)) {
        const void *p;
        size_t plen;
        rc = snap_payload(l, KW_KIND_SNAP_CHUNK, &p, &plen);
        if (!rc)
            rc = load_chunk(l, p, plen);
    }
    const keel_world *w = l->d->world;
    for (uint32_t t = 0; !rc && t < l->ntables; t++)
        if (w->tables[t]->count != l->counts[t])
            rc = core_fail(KEEL_ECORRUPT, "checkpoint of tick %llu: table %u has %u rows, its chunks hold %u",
                           (unsigned long long)m->tick, t, l->counts[t], w->tables[t]->count);
    if (!rc && w->nlive != l->nlive)
        rc = core_fail(KEEL_ECORRUPT, "checkpoint of tick %llu: %u live entities listed, %u loaded",
                       (unsigned long long)m->tick, l->nlive, w->nlive);
    if (!rc)
        rc = load_keys(l);
    if (!rc && l->have)
        rc = core_fail(KEEL_ECORRUPT, "checkpoint of tick %llu holds a snap entry of unknown kind '%c' or out of "
                       "order", (unsigned long long)m->tick, l->e.klen ? *(const char *)l->e.key : '?');
    return rc;
}

static int dir_next(void *self, const void **key, size_t *klen, const void **val, size_t *vlen)
{
    return kw_db_next(self, key, klen, val, vlen);
}

/* load_checkpoint on the directory's checkpoint. */
static int load_stored_checkpoint(loader *l, kw_checkpoint_meta *m)
{
    const void *val;
    size_t vlen;
    int rc = kw_get(l->r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &val, &vlen);
    if (rc == KEEL_ENOENT)
        return load_checkpoint(l, NULL, 0, m);
    kw_walit *it = NULL;
    if (!rc && !(rc = kw_snap_iter(l->r, &it))) {
        l->src = (dur_snap_src){it, dir_next};
        rc = load_checkpoint(l, val, vlen, m);
    }
    kw_wal_iter_end(it);
    return rc;
}

/* ---- replay ------------------------------------------------------------------------ */

typedef struct unit_rec {
    const void *rec;
    size_t len;
    kw_header h;
} unit_rec;

typedef struct replay {
    loader *l;
    unit_rec *recs;
    uint32_t n, cap;
    uint64_t unit_first;       /* LSN of the unit's first record */
    uint64_t stop_tick;        /* a follower's bound: stop after this tick's unit (0: none) */
    bool stopped;              /* ... and it was applied */
    keel_cmdbuf *cmds;
    kw_decoder dec;
    world_replay_memo memo;    /* the rows of the record's last group */
} replay;

static int corrupt(uint64_t lsn, const char *fmt, const char *detail)
{
    char buf[400];
    snprintf(buf, sizeof buf, fmt, detail);
    return core_fail(KEEL_ECORRUPT, "WAL record at LSN %llu: %s", (unsigned long long)lsn, buf);
}

/* A change that does not apply: the log is wrong (KEEL_ECORRUPT, `what`
 * says what, the callee's sentence why), unless memory ran out (KEEL_ENOMEM,
 * naming the record: it is fine and the next open replays it -- never
 * reported as corruption, which an operator might answer with
 * truncate_bad_tail; what is unused then). */
static int not_applied(uint64_t lsn, int rc, const char *what)
{
    if (rc == KEEL_ENOMEM)
        return core_fail_prefix(KEEL_ENOMEM, "WAL record at LSN %llu: out of memory applying it",
                                (unsigned long long)lsn);
    /* the world's cap (max_entities) is no damage: the same records apply under a larger one */
    return core_fail_prefix(rc == KEEL_ENOSPC ? KEEL_ENOSPC : KEEL_ECORRUPT, "WAL record at LSN %llu: %s",
                            (unsigned long long)lsn, what);
}

static bool fits(const keel_world *w, uint32_t comp, uint32_t size)
{
    return world_component_valid(w, comp) && w->comps[comp].desc.size == size;
}

/* Queue one lifecycle command of the record in the replay's buffer:
 * KEEL_ECORRUPT, with no sentence, when it names a component that is not
 * registered or gives it the wrong size (the keel_cmd_* calls never return
 * that code). */
static int queue_command(replay *p, const kw_change *ch, keel_entity *expect, uint32_t *nspawn)
{
    keel_world *w = p->l->d->world;
    switch (ch->op) {
    case KW_OP_SPAWN: {
        keel_init inits[256];
        for (uint32_t k = 0; k < ch->n; k++) {
            if (!fits(w, ch->comps[k], ch->sizes[k]))
                return KEEL_ECORRUPT;
            inits[k] = (keel_init){ch->comps[k], ch->values[k]};
        }
        expect[(*nspawn)++] = ch->entity;
        return keel_cmd_spawn(p->cmds, inits, ch->n);
    }
    case KW_OP_DESTROY:
        return keel_cmd_destroy(p->cmds, ch->entity);
    case KW_OP_ADD:
        return fits(w, ch->component, ch->size) ? keel_cmd_add(p->cmds, ch->entity, ch->component, ch->value)
                                                : KEEL_ECORRUPT;
    case KW_OP_REMOVE:
        return world_component_valid(w, ch->component) ? keel_cmd_remove(p->cmds, ch->entity, ch->component)
                                                        : KEEL_ECORRUPT;
    default:
        return KEEL_ECORRUPT;
    }
}

/* A TICK_CHUNK's row groups, each written in one pass. */
static int apply_groups(replay *p, const kw_header *h)
{
    keel_world *w = p->l->d->world;
    kw_group g;
    int rc;
    p->memo.entities = NULL; /* it points into the last record */
    while ((rc = kw_decode_group(&p->dec, &g)) == 1) {
        if (!fits(w, g.component, g.size))
            return corrupt(h->lsn, "%s", "a change names an unknown component or has the wrong size");
        if ((rc = world_replay_rows(w, &p->memo, g.component, g.size, g.n, g.entities, g.values)))
            return not_applied(h->lsn, rc, "a value row does not apply");
    }
    return rc;
}

/* Value rows are written as keel_set writes them (a TICK_CHUNK's a group
 * at a time); the commands of a LIFECYCLE record through command playback, and
 * the handles its spawns create must be the logged ones. */
static int apply_changes(replay *p, const kw_header *h, const void *payload)
{
    keel_world *w = p->l->d->world;
    kw_decoder *d = &p->dec;
    int rc = kw_decode_record(d, h, payload, NULL);
    if (rc || h->kind == KW_KIND_TICK_CHUNK)
        return rc ? rc : apply_groups(p, h);
    keel_entity *expect = NULL;
    uint32_t nspawn = 0;
    if (h->kind == KW_KIND_LIFECYCLE && !(expect = malloc(((size_t)d->left + 1) * sizeof *expect)))
        return core_fail(KEEL_ENOMEM, "out of memory replaying LSN %llu", (unsigned long long)h->lsn);
    kw_change ch;
    while ((rc = kw_decode_next(d, &ch)) == 1) {
        bool unknown = false;
        if (h->kind == KW_KIND_LIFECYCLE) {
            rc = queue_command(p, &ch, expect, &nspawn);
            unknown = rc == KEEL_ECORRUPT;
            if (rc == KEEL_ENOMEM)
                rc = not_applied(h->lsn, rc, NULL);
        } else if ((unknown = !fits(w, ch.component, ch.size))) {
            rc = KEEL_ECORRUPT;
        } else if ((rc = keel_set(w, ch.entity, ch.component, ch.value))) {
            rc = not_applied(h->lsn, rc, "a value row does not apply");
        }
        if (unknown)
            rc = corrupt(h->lsn, "%s", "a change names an unknown component or has the wrong size");
        if (rc)
            break;
    }
    if (!rc && h->kind == KW_KIND_LIFECYCLE) {
        if ((rc = keel_cmdbuf_apply(p->cmds)))
            rc = not_applied(h->lsn, rc, "its commands do not apply");
        keel_cmd_result res = keel_cmdbuf_result(p->cmds);
        for (uint32_t i = 0; !rc && i < nspawn; i++)
            if (i >= res.created_count || res.created[i] != expect[i])
                rc = corrupt(h->lsn, "%s", "a spawn created a different entity handle than the one logged");
    }
    if (h->kind == KW_KIND_LIFECYCLE) {
        keel_cmdbuf_discard(p->cmds);
        keel_cmdbuf_reset(p->cmds);
    }
    free(expect);
    return rc;
}

/* A keyed side transaction's key, remembered again (at recovery no commit
 * runs: the side lock is not needed). lsn 0: from the checkpoint. */
static int remember_key(dur_state *d, uint64_t key, uint64_t tick, uint64_t lsn)
{
    int rc = keys_reserve(&d->txn->keys, 1);
    if (rc)
        return lsn ? not_applied(lsn, KEEL_ENOMEM, NULL) /* keys_reserve fails only so */
                   : core_fail(KEEL_ENOMEM, "out of memory loading the checkpoint's idempotency keys");
    keys_add(&d->txn->keys, key, tick, 0); /* its record is on disk: a retry's "already" waits for nothing */
    return KEEL_OK;
}

/* The payload of a checked record; out of memory names the record too. */
static int payload_of(replay *p, const unit_rec *u, const void **payload)
{
    int rc = kw_record_payload(p->l->c, u->rec, &u->h, payload);
    return rc == KEEL_ENOMEM ? not_applied(u->h.lsn, rc, NULL) : rc;
}

/* One part of a record (kw_each_part): a SIDES record's transactions each
 * as a SIDE record of its own, with its key remembered. */
static int apply_part(void *arg, const kw_header *h, const void *payload)
{
    replay *p = arg;
    if (h->kind == KW_KIND_SIDE)
        p->l->out->side_txns++;
    int rc = apply_changes(p, h, payload);
    if (!rc && h->kind == KW_KIND_SIDE && p->dec.side_key)
        rc = remember_key(p->l->d, p->dec.side_key, h->tick, h->lsn);
    return rc;
}

static int apply_record(replay *p, const unit_rec *u)
{
    const void *payload;
    int rc = payload_of(p, u, &payload);
    if (rc)
        return rc;
    p->l->out->raw_bytes += u->h.raw_len;
    return kw_each_part(&u->h, payload, apply_part, p);
}

/* A TICK_COMMIT closes the unit: check it, apply the unit. */
static int close_unit(replay *p, const unit_rec *marker)
{
    const void *payload;
    int rc = payload_of(p, marker, &payload);
    if (rc)
        return rc;
    kw_commit_info ci;
    if (kw_decode_commit(payload, marker->h.raw_len, &ci) || ci.nrecords != p->n)
        return corrupt(marker->h.lsn, "%s", "the tick's commit marker does not match the records before it");
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->recs[i].h.tick != marker->h.tick)
            return corrupt(p->recs[i].h.lsn, "%s", "a record of the unit belongs to another tick");
        if ((rc = apply_record(p, &p->recs[i])))
            return rc;
    }
    keel_world *w = p->l->d->world;
    if (w->nlive != ci.nlive || w->nslots != ci.nslots)
        return corrupt(marker->h.lsn, "%s", "the replayed tick does not end with the logged entity counts");
    if (!(marker->h.flags & KW_FLAG_HOOK))
        p->l->out->tick = marker->h.tick;
    p->stopped = p->stop_tick && !(marker->h.flags & KW_FLAG_HOOK) && marker->h.tick >= p->stop_tick;
    p->n = 0;
    (void)KEEL_FAILPOINT(RECOVER_MID_REPLAY);
    return KEEL_OK;
}

static int replay_one(replay *p, uint64_t lsn, uint64_t expect, const void *rec, size_t len)
{
    unit_rec u = {.rec = rec, .len = len};
    int rc = kw_wal_check(lsn, expect, rec, len, &u.h, NULL);
    if (rc)
        return rc;
    p->l->out->records++;
    switch (u.h.kind) {
    case KW_KIND_TICK_CHUNK:
    case KW_KIND_LIFECYCLE:
        if (CORE_GROW(p->recs, p->cap, p->n + 1, 64))
            return core_fail(KEEL_ENOMEM, "out of memory replaying the WAL");
        if (!p->n)
            p->unit_first = lsn;
        p->recs[p->n++] = u;
        return KEEL_OK;
    case KW_KIND_TICK_COMMIT:
        return close_unit(p, &u);
    case KW_KIND_SIDE:
    case KW_KIND_SIDES:
        if (p->n)
            return corrupt(lsn, "%s", "a side transaction inside an unfinished tick unit");
        if ((rc = apply_record(p, &u)))
            return rc;
        (void)KEEL_FAILPOINT(RECOVER_MID_REPLAY);
        return KEEL_OK;
    case KW_KIND_EPOCH: /* a deposed primary's unfinished unit was never committed */
        p->n = 0;
        return KEEL_OK;
    default: /* schema, checkpoint markers: nothing to apply */
        return KEEL_OK;
    }
}

typedef struct truncation {
    uint64_t from, deleted;
} truncation;

static int fill_truncate(kw_wtxn *t, void *arg)
{
    truncation *tr = arg;
    return kw_del_wal_from(t, tr->from, &tr->deleted);
}

/* Does every change of a record (a part: kw_each_part) decode? KEEL_OK or
 * KEEL_ECORRUPT. */
static int decodable(void *arg, const kw_header *h, const void *payload)
{
    (void)arg;
    kw_decoder d;
    kw_change ch;
    int rc = kw_decode_record(&d, h, payload, NULL);
    while (rc == KEEL_OK && (rc = kw_decode_next(&d, &ch)) == 1)
        rc = KEEL_OK;
    return rc;
}

/* Is the record at lsn well-formed: the one expected, checked,
 * decompressed, every change decodable, a marker that matches its unit?
 * (unit: records of the open
 * unit before it). KEEL_OK when it is, KEEL_ECORRUPT when it is not, or
 * another code when it cannot tell (out of memory decompressing it): that
 * is never a reason to truncate. The truncation pass runs this over the
 * tail before anything is applied, so a truncated tail never leaves a
 * half-applied unit in memory. */
static int record_validity(loader *l, uint64_t lsn, uint64_t expect, const void *rec, size_t len, uint32_t unit,
                           kw_header *h)
{
    const void *p;
    int rc = kw_wal_check(lsn, expect, rec, len, h, NULL);
    if (!rc)
        rc = kw_record_payload(l->c, rec, h, &p);
    if (rc)
        return rc;
    if (h->kind == KW_KIND_TICK_COMMIT) {
        kw_commit_info ci;
        return !kw_decode_commit(p, h->raw_len, &ci) && ci.nrecords == unit ? KEEL_OK : KEEL_ECORRUPT;
    }
    if ((h->kind == KW_KIND_SIDE || h->kind == KW_KIND_SIDES) && unit)
        return KEEL_ECORRUPT;
    return kw_kind_has_changes(h->kind) ? kw_each_part(h, p, decodable, NULL) : KEEL_OK;
}

/* The LSN where the valid prefix ends: the first invalid record's unit
 * start, or 0 when every record is valid. */
static int find_bad_tail(loader *l, uint64_t after, uint64_t *bad)
{
    kw_walit *it;
    int rc = kw_wal_iter(l->r, after + 1, &it);
    if (rc)
        return rc;
    uint64_t lsn, expect = after + 1, unit_first = 0;
    uint32_t unit = 0;
    const void *rec;
    size_t len;
    kw_header h;
    *bad = 0;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        int v = record_validity(l, lsn, expect, rec, len, unit, &h);
        if (v == KEEL_ECORRUPT) {
            *bad = unit ? unit_first : lsn;
            break;
        }
        if (v) { /* cannot tell (out of memory): the open fails, nothing is truncated */
            rc = v;
            break;
        }
        if (h.kind == KW_KIND_TICK_CHUNK || h.kind == KW_KIND_LIFECYCLE)
            unit_first = unit++ ? unit_first : lsn;
        else if (h.kind == KW_KIND_TICK_COMMIT || h.kind == KW_KIND_EPOCH)
            unit = 0;
        expect = lsn + 1;
    }
    if (!rc && !*bad && unit)
        *bad = unit_first; /* a unit without its marker at the end */
    kw_wal_iter_end(it);
    return rc < 0 ? rc : KEEL_OK;
}

/* How far replay_range goes. */
typedef struct replay_bound {
    uint64_t stop;             /* up to, not including, this LSN (0: to the end) */
    uint64_t stop_tick;        /* ... or until this tick's unit is applied (0: none) */
    bool open_tail;            /* an unfinished unit at the end waits (a follower), it is no bad tail */
} replay_bound;

/* Replay every record after `after` within the bound; *last_lsn: the last
 * record applied (an open unit's records are not). */
static int replay_range(loader *l, uint64_t after, replay_bound bound, uint64_t *last_lsn)
{
    uint64_t stop = bound.stop;
    replay p = {.l = l, .stop_tick = bound.stop_tick};
    int rc = keel_cmdbuf_create(l->d->world, &p.cmds);
    if (rc)
        return rc;
    kw_walit *it;
    if ((rc = kw_wal_iter(l->r, after + 1, &it))) {
        keel_cmdbuf_destroy(p.cmds);
        return rc;
    }
    uint64_t lsn = 0, expect = after + 1;
    const void *rec;
    size_t len;
    while (!p.stopped && (rc = kw_wal_next(it, &lsn, &rec, &len)) == 1 && (!stop || lsn < stop)) {
        rc = replay_one(&p, lsn, expect, rec, len);
        if (rc)
            break;
        if (!p.n) {
            *last_lsn = lsn;
            l->unit_mutations = l->d->world->mutations;
        }
        expect = lsn + 1;
    }
    if (rc == 1)
        rc = KEEL_OK; /* stopped at `stop` */
    if (!rc && p.n && !bound.open_tail) /* records without their marker at the end */
        rc = corrupt(p.unit_first, "%s", "the unit starting here has no commit marker (a truncated tail)");
    kw_wal_iter_end(it);
    keel_cmdbuf_destroy(p.cmds);
    world_replay_memo_free(&p.memo);
    free(p.recs);
    return rc;
}

/* Default: the first invalid record refuses the open. truncate_bad_tail:
 * find the valid prefix first, replay only it, and report where to cut
 * (*cut = the first LSN to delete, *last_lsn = the end of the prefix; 0 =
 * nothing to cut); an inconsistency inside valid records still refuses the
 * open. */
static int replay_wal(loader *l, uint64_t after, uint64_t *last_lsn, uint64_t *cut)
{
    replay_bound all = {.open_tail = l->d->follow, .stop_tick = l->d->follow ? l->d->stop_tick : 0};
    if (!l->d->desc.truncate_bad_tail || l->d->follow)
        return replay_range(l, after, all, last_lsn);
    uint64_t bad;
    int rc = find_bad_tail(l, after, &bad);
    if (!rc)
        rc = replay_range(l, after, (replay_bound){.stop = bad}, last_lsn);
    if (rc || !bad)
        return rc;
    core_log(KEEL_LOG_WARN, "wal", "truncated", "from_lsn=%llu", (unsigned long long)bad);
    *last_lsn = bad - 1;
    *cut = bad; /* the caller truncates after the read transaction */
    return KEEL_OK;
}

/* ---- open / close -------------------------------------------------------------------- */

static int make_state(const dur_open_desc *o, dur_state **out)
{
    dur_state *d = calloc(1, sizeof *d);
    if (!d)
        return core_fail(KEEL_ENOMEM, "out of memory for the durability state");
    *out = d;
    d->world = o->world;
    d->txn = o->txn;
    d->pool = o->pool;
    d->desc = *o->desc;
    const keel_durable_desc *dd = &d->desc;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->wake, NULL);
    core_cond_init_monotonic(&d->durable_cv); /* dur_wait_timed's deadlines are CLOCK_MONOTONIC */
    pthread_mutex_init(&d->ckpt_mu, NULL);
    pthread_cond_init(&d->ckpt_cv, NULL);
    pthread_mutex_init(&d->pin_mu, NULL);
    dur_metrics_init(d);
    d->mode = o->mode;
    d->follow = o->follow;
    d->stop_tick = o->stop_tick;
    d->zstd_level = dd->zstd_level ? dd->zstd_level : KW_CODEC_LEVEL_DEFAULT;
    d->ckpt_every_ticks = dd->checkpoint_every_ticks ? dd->checkpoint_every_ticks : 3600;
    d->ckpt_every_bytes = dd->checkpoint_every_bytes ? dd->checkpoint_every_bytes : 64ll << 20;
    d->ckpt_every_seconds = dd->checkpoint_every_seconds ? dd->checkpoint_every_seconds : 300;
    d->wal_retain = dd->wal_retain;
    d->ncodec = o->pool.workers ? o->pool.workers : 1;
    d->dir = strdup(o->dir);
    d->desc.dir = d->dir;
    d->codec = calloc(d->ncodec, sizeof *d->codec);
    d->fence_payload = calloc(d->ncodec, sizeof *d->fence_payload);
    if (!d->codec || !d->fence_payload || !d->dir)
        return core_fail(KEEL_ENOMEM, "out of memory for codec contexts");
    /* fence and side records are at most about DUR_RECORD_TARGET bytes: at
     * the fast levels a 4 KiB hash table (hashLog 10) stays in L1 and
     * compresses ECS deltas ~15% faster at the same ratio than the level's
     * own (13) -- docs/performance.md, "Design measurements" */
    kw_codec_desc cd = {.level = d->zstd_level,
                        .hash_log = d->zstd_level <= DUR_SMALL_HASH_MAX_LEVEL ? DUR_HASH_LOG : 0};
    int rc = kw_codec_create(&cd, &d->side_codec);
    for (uint32_t i = 0; !rc && i < d->ncodec; i++)
        rc = kw_codec_create(&cd, &d->codec[i]);
    return rc;
}

static int recover(dur_state *d, const dur_boot *boot, keel_recovery *out)
{
    kw_store_desc sd = {.flags = KW_OPEN_CREATE | KW_OPEN_OWN, .map_size = d->desc.map_size,
                        .map_max = d->desc.map_max};
    int rc = d->store ? KEEL_OK : kw_store_open(d->dir, &sd, &d->store);
    if (rc == KEEL_ENOENT) /* created when missing: ENOENT means the path is no directory */
        return KEEL_EINVAL; /* with kw_store_open's sentence */
    if (rc)
        return rc;
    kw_rtxn *r;
    if ((rc = kw_read_begin(d->store, &r)))
        return rc;
    loader l = {.d = d, .r = r, .c = d->codec[0], .out = out};
    const void *v;
    size_t vn;
    /* a stream's directory: see trim_upto (checkpoint.c) */
    d->trim_to_stream = !d->follow && !kw_get(r, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), &v, &vn);
    int schema = boot ? check_schema(d->world, boot->schema, boot->schema_len, l.c) : check_stored_schema(d, r, l.c);
    kw_checkpoint_meta m = {0};
    uint64_t last = 0, first = 0, cut = 0;
    rc = schema < 0 ? schema : KEEL_OK;
    if (!rc) {
        d->world->restoring = true;
        if (boot) {
            l.src = boot->src;
            rc = load_checkpoint(&l, boot->meta, boot->meta_len, &m);
        } else {
            rc = load_stored_checkpoint(&l, &m);
        }
        last = m.lsn;
        if (!rc)
            (void)KEEL_FAILPOINT(RECOVER_BEFORE_REPLAY);
        if (!rc && !boot) /* a boot's directory holds no WAL after the checkpoint */
            rc = replay_wal(&l, m.lsn, &last, &cut);
        d->world->restoring = false;
        d->applied_lsn = last;
        uint64_t wal_last = 0;
        if (!rc && !boot && !cut && kw_wal_bounds(r, &first, &wal_last, NULL) == KEEL_OK && wal_last > last)
            last = wal_last; /* schema or checkpoint markers after the last unit (a follower: an open unit) */
    }
    kw_read_end(r);
    free(l.counts);
    if (!rc && cut) { /* truncate_bad_tail */
        truncation tr = {.from = cut};
        rc = kw_store_write(d->store, fill_truncate, &tr);
        out->truncated = tr.deleted;
    }
    if (rc)
        return rc;
    d->ckpt_count = m.count;
    d->last_ckpt_tick = m.tick;
    atomic_store(&d->ckpt_recorded_tick, m.tick);
    d->next_lsn = last + 1;
    atomic_store(&d->durable_lsn, last);
    atomic_store(&d->local_lsn, last);
    atomic_store(&d->durable_tick, out->tick);
    out->last_lsn = last;
    out->fresh = !m.count && !out->tick && !out->side_txns && !d->world->nlive;
    if (schema == 1 && d->follow) /* a replica's schema comes from its primary, with the records */
        return core_fail(KEEL_EINVAL, "the replica's directory %s holds no schema record yet (or an older one "
                         "than the registered components): its primary has not published one", d->dir);
    if (schema == 1) {
        rc = write_schema(d, l.c, d->next_lsn);
        if (!rc) {
            atomic_store(&d->durable_lsn, d->next_lsn);
            atomic_store(&d->local_lsn, d->next_lsn);
            d->next_lsn++;
        }
    }
    return rc;
}

int dur_open(const dur_open_desc *o, dur_state **dp, keel_recovery *out)
{
    uint64_t t0 = core_now_ns();
    *out = (keel_recovery){0};
    *dp = NULL;
    int rc = make_state(o, dp);
    dur_state *d = *dp;
    if (d)
        d->store = o->store; /* dur_close closes it */
    else
        kw_store_close(o->store);
    if (!rc)
        rc = recover(d, o->boot, out);
    if (!rc)
        rc = dur_writer_start(d);
    if (!rc)
        rc = ckpt_start(d);
    out->ns = core_now_ns() - t0;
    if (!rc && d->trim_to_stream && !o->replicated)
        core_log(KEEL_LOG_WARN, "wal", "unreplicated_stream_dir", "dir=%s wal=kept_whole hint=\"keel-wal detach\"",
                 d->dir);
    if (!rc) {
        d->world->log_required = true;
        d->txn->uow.capture = true;
        d->last_ckpt_ns = core_now_ns();
    }
    return rc;
}

void dur_close(dur_state *d)
{
    if (!d)
        return;
    ckpt_stop(d);
    dur_writer_stop(d);
    /* a waiter still registered can only be one the writer never reached */
    pthread_mutex_lock(&d->mu);
    for (dur_waiter *w = d->waiters; w;) {
        dur_waiter *next = w->next;
        w->done(w->arg, KEEL_EFATAL);
        free(w);
        w = next;
    }
    d->waiters = NULL;
    pthread_mutex_unlock(&d->mu);
    for (uint32_t i = 0; d->codec && i < d->ncodec; i++)
        kw_codec_destroy(d->codec[i]);
    free(d->codec);
    free(d->ends);
    kw_codec_destroy(d->side_codec);
    kw_buf_free(&d->side_payload);
    kw_buf_free(&d->side_build);
    fence_fini(d);
    ckpt_fini(d);
    kw_store_close(d->store);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->wake);
    pthread_cond_destroy(&d->durable_cv);
    pthread_mutex_destroy(&d->ckpt_mu);
    pthread_cond_destroy(&d->ckpt_cv);
    pthread_mutex_destroy(&d->pin_mu);
    free(d->dir);
    free(d);
}

/* ---- following ------------------------------------------------------------------------ */

int dur_follow(dur_state *d, uint64_t last_lsn, uint64_t *tick)
{
    pthread_mutex_lock(&d->mu);
    if (last_lsn >= d->next_lsn) {
        d->next_lsn = last_lsn + 1;
        atomic_store(&d->local_lsn, last_lsn);
        atomic_store_explicit(&d->durable_lsn, last_lsn, memory_order_release);
    }
    pthread_mutex_unlock(&d->mu);
    keel_recovery out = {.tick = *tick};
    if (d->follow && d->stop_tick && *tick >= d->stop_tick)
        return KEEL_OK; /* applied as far as it may go */
    kw_rtxn *r;
    int rc = kw_read_begin(d->store, &r);
    if (rc)
        return rc;
    loader l = {.d = d, .r = r, .c = d->codec[0], .out = &out, .unit_mutations = d->world->mutations};
    uint64_t applied = d->applied_lsn;
    d->world->restoring = true;
    rc = replay_range(&l, applied, (replay_bound){.stop_tick = d->follow ? d->stop_tick : 0, .open_tail = true}, &applied);
    d->world->restoring = false;
    kw_read_end(r);
    /* The units replay_range completed are the world's now, also when a later one failed: the next call
       starts after them. A failed unit that changed the world before it failed cannot be undone or
       replayed on top of itself: the runtime latches, and a reopen replays the directory from scratch. */
    d->applied_lsn = applied;
    *tick = out.tick;
    atomic_store_explicit(&d->durable_tick, out.tick, memory_order_release);
    if (rc && d->world->mutations != l.unit_mutations)
        dur_latch_fatal(d, rc);
    return rc;
}
