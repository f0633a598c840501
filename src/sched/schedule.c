/*
 * sched/schedule.c -- declaring systems and building the schedule.
 *
 * Build runs in fixed steps, so the same declarations always give the same
 * diagnostics (in this order) and plan:
 *   1. names: duplicates (in name order); then per system in index order:
 *      tracks unknown or reserved, descriptors: bodies,
 *      queries, access lists (reads_snapshot only of VERSIONED components);
 *   2. edges: explicit after/before, then access-derived ones (rules below);
 *   3. cycles: Kahn's algorithm; if nodes remain, one concrete cycle (and
 *      step 4 is skipped: with a cycle, "ordered" has no meaning);
 *   4. conflicts that need an ordering are checked against reachability;
 *   5. order: Kahn per track with the smallest registration index first;
 *      the hash is FNV-1a over that order and its edges.
 *
 * Access rules for two systems a, b of one track (writes include rewrites and
 * side_writes; a query term named in no access list counts as a plain read;
 * "phase-ordered" means same DAG, different phases: the lower phase first):
 *   - both write X (component or resource): phase-ordered, else they must
 *     be ordered by other edges (WRITE_CONFLICT);
 *   - one writes X, the other reads_fresh X: edge writer -> reader;
 *   - one writes X, the other reads_snapshot X: no edge, no conflict: the
 *     reader sees the tick-start version, which the writer's copy-on-write
 *     versions leave untouched, so the two may run at the same time;
 *   - one writes X, the other plainly reads X: phase-ordered, else must be
 *     ordered (READ_CONFLICT); a reader ordered before the writer gets the
 *     warning READ_BEFORE_WRITE (it sees the previous tick's value);
 *   - a produces event E that b consumes: edge a -> b;
 *   - either is exclusive: phase-ordered, else must be ordered
 *     (EXCLUSIVE_CONFLICT).
 * Systems of different tracks never conflict: tracks run one after another.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "sched/sched_internal.h"
#include "world/world_internal.h"

#define SCHED_DEFAULT_DAG "main"

/* ---- small helpers -------------------------------------------------------- */

static const char *const code_names[] = {
    [KEEL_SCHED_UNKNOWN_SYSTEM] = "SCHED_UNKNOWN_SYSTEM",
    [KEEL_SCHED_DUPLICATE_SYSTEM] = "SCHED_DUPLICATE_SYSTEM",
    [KEEL_SCHED_CYCLE] = "SCHED_CYCLE",
    [KEEL_SCHED_WRITE_CONFLICT] = "SCHED_WRITE_CONFLICT",
    [KEEL_SCHED_READ_CONFLICT] = "SCHED_READ_CONFLICT",
    [KEEL_SCHED_SNAPSHOT_NOT_VERSIONED] = "SCHED_SNAPSHOT_NOT_VERSIONED",
    [KEEL_SCHED_EXCLUSIVE_CONFLICT] = "SCHED_EXCLUSIVE_CONFLICT",
    [KEEL_SCHED_UNKNOWN_TRACK] = "SCHED_UNKNOWN_TRACK",
    [KEEL_SCHED_RESERVED_TRACK] = "SCHED_RESERVED_TRACK",
    [KEEL_SCHED_BAD_SYSTEM] = "SCHED_BAD_SYSTEM",
    [KEEL_SCHED_READ_BEFORE_WRITE] = "SCHED_READ_BEFORE_WRITE",
};

const char *keel_sched_code_name(keel_sched_code code)
{
    return code >= KEEL_SCHED_UNKNOWN_SYSTEM && code <= KEEL_SCHED_READ_BEFORE_WRITE ? code_names[code] : "SCHED_?";
}

static bool is_reserved_track(const char *name)
{
    return strncmp(name, "Engine-", 7) == 0;
}

/* Keep a copy of s owned by the schedule; NULL stays NULL. */
static int own_string(keel_schedule *s, const char *str, const char **out)
{
    if (!str) {
        *out = NULL;
        return KEEL_OK;
    }
    if (CORE_GROW(s->owned, s->owned_cap, s->nowned + 1, 64))
        return core_fail(KEEL_ENOMEM, "schedule: out of memory");
    char *copy = strdup(str);
    if (!copy)
        return core_fail(KEEL_ENOMEM, "schedule: out of memory");
    s->owned[s->nowned++] = copy;
    *out = copy;
    return KEEL_OK;
}

static void diag_add(keel_schedule *s, keel_sched_code code, uint32_t nnames, const char *const *names,
                     const char *fmt, ...) CORE_PRINTF(5, 6);

static void diag_add(keel_schedule *s, keel_sched_code code, uint32_t nnames, const char *const *names,
                     const char *fmt, ...)
{
    keel_sched_severity severity = code == KEEL_SCHED_READ_BEFORE_WRITE ? KEEL_SCHED_WARNING : KEEL_SCHED_ERROR;
    if (severity == KEEL_SCHED_ERROR)
        s->ok = false; /* first: an error whose diagnostic cannot be stored still fails the build */
    if (CORE_GROW(s->diags, s->diags_cap, s->ndiags + 1, 16)) {
        s->oom = true; /* the build then returns KEEL_ENOMEM */
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    keel_sched_diag *d = &s->diags[s->ndiags];
    memset(d, 0, sizeof *d);
    if (own_string(s, msg, &d->message)) {
        s->oom = true;
        return;
    }
    d->code = code;
    d->severity = severity;
    d->name_count = nnames < KEEL_SCHED_DIAG_NAMES ? nnames : KEEL_SCHED_DIAG_NAMES;
    for (uint32_t i = 0; i < d->name_count; i++)
        d->names[i] = names[i];
    s->ndiags++;
}

#define NAMES(...) (sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), (const char *[]){__VA_ARGS__}

/* ---- declaration ---------------------------------------------------------- */

int schedule_create(keel_runtime *rt, keel_world *w, keel_schedule **out)
{
    keel_schedule *s = calloc(1, sizeof *s);
    if (!s)
        return core_fail(KEEL_ENOMEM, "keel_schedule_create: out of memory");
    s->rt = rt;
    s->world = w;
    *out = s;
    return KEEL_OK;
}

void keel_schedule_destroy(keel_schedule *s)
{
    if (!s || s->installed)
        return;
    schedule_free(s);
}

void schedule_free(keel_schedule *s)
{
    for (uint32_t i = 0; i < s->nsys; i++)
        keel_query_destroy(s->sys[i].query);
    for (uint32_t i = 0; i < s->nowned; i++)
        free(s->owned[i]);
    free(s->owned);
    free(s->user_tracks);
    free(s->sys);
    free(s->diags);
    free(s->tracks);
    free(s->order);
    free(s->succ_off);
    free(s->succ);
    free(s->npred);
    free(s->roots);
    free(s);
}

int keel_schedule_add_track(keel_schedule *s, const char *name)
{
    if (!s)
        return core_fail(KEEL_EINVAL, "keel_schedule_add_track: schedule is NULL");
    int rc = core_name_check(name, KEEL_NAME_MAX, "keel_schedule_add_track: the track name");
    if (rc)
        return rc;
    if (s->built)
        return core_fail(KEEL_EBUSY, "keel_schedule_add_track: track '%s' added after the schedule was built", name);
    if (is_reserved_track(name) || !strcmp(name, KEEL_TRACK_PUBLIC))
        return core_fail(KEEL_EINVAL, "keel_schedule_add_track: track name '%s' is reserved", name);
    for (uint32_t i = 0; i < s->nuser_tracks; i++)
        if (!strcmp(s->user_tracks[i], name))
            return core_fail(KEEL_EEXIST, "keel_schedule_add_track: track '%s' is already declared", name);
    if (core_resize(&s->user_tracks, s->nuser_tracks, s->nuser_tracks + 1, sizeof *s->user_tracks, false))
        return core_fail(KEEL_ENOMEM, "keel_schedule_add_track: out of memory");
    const char *copy = NULL;
    rc = own_string(s, name, &copy);
    if (rc)
        return rc;
    s->user_tracks[s->nuser_tracks++] = (char *)copy;
    return KEEL_OK;
}

/* Copy a NULL-terminated name list of at most KEEL_ACCESS_MAX entries. */
static int own_list(keel_schedule *s, const char **list, uint32_t max)
{
    for (uint32_t i = 0; i < max && list[i]; i++) {
        int rc = own_string(s, list[i], &list[i]);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

static int own_desc_strings(keel_schedule *s, keel_system_desc *d)
{
    int rc = own_string(s, d->name, &d->name);
    if (!rc)
        rc = own_string(s, d->track, &d->track);
    if (!rc)
        rc = own_string(s, d->dag, &d->dag);
    const char **lists[] = {d->after, d->before, d->access.resources_read, d->access.resources_write,
                            d->access.events_produce, d->access.events_consume};
    for (size_t i = 0; !rc && i < sizeof lists / sizeof lists[0]; i++)
        rc = own_list(s, lists[i], KEEL_ACCESS_MAX);
    return rc;
}

int keel_schedule_add_system(keel_schedule *s, const keel_system_desc *desc, keel_system *out)
{
    if (!s || !desc)
        return core_fail(KEEL_EINVAL, "keel_schedule_add_system: schedule or desc is NULL");
    int rc = core_name_check(desc->name, KEEL_NAME_MAX, "keel_schedule_add_system: the system name");
    if (rc)
        return rc;
    if (s->built)
        return core_fail(KEEL_EBUSY, "keel_schedule_add_system: system '%s' added after the schedule was built",
                         desc->name);
    if (desc->track && (rc = core_name_check(desc->track, KEEL_NAME_MAX, "keel_schedule_add_system: system '%s''s "
                                             "track name", desc->name)))
        return rc;
    if (desc->dag && (rc = core_name_check(desc->dag, KEEL_NAME_MAX, "keel_schedule_add_system: system '%s''s dag "
                                           "name", desc->name)))
        return rc;
    if (CORE_GROW(s->sys, s->sys_cap, s->nsys + 1, 32))
        return core_fail(KEEL_ENOMEM, "keel_schedule_add_system: out of memory");
    sched_system *sys = &s->sys[s->nsys];
    memset(sys, 0, sizeof *sys);
    sys->d = *desc;
    rc = own_desc_strings(s, &sys->d);
    if (rc)
        return rc;
    if (out)
        *out = s->nsys;
    s->nsys++;
    return KEEL_OK;
}

/* ---- build: step 1, names, tracks and descriptors ------------------------- */

typedef struct build {
    keel_schedule *s;
    uint32_t n;
    uint32_t *by_name;        /* system indices sorted by name (first registration first) */
    /* access summaries: bitsets of `words` words per system and mode */
    uint32_t words;
    uint64_t *rd, *fresh, *snap, *wr, *prod, *cons;
    const char **keys;        /* interned resource/event names, ids offset past components */
    uint32_t nkeys, keys_cap;
    /* edges as an adjacency bit matrix (n x n), then CSR */
    uint64_t *adj;
    uint32_t adj_words;
    /* pairs that must be ordered: (a, b, code, key) */
    struct need { uint32_t a, b, key; keel_sched_code code; } *needs;
    uint32_t nneeds, needs_cap;
    uint64_t *reach;
} build;

static int cmp_name_ctx_sort(const void *x, const void *y, void *ctx)
{
    const keel_schedule *s = ctx;
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    int c = strcmp(s->sys[a].d.name, s->sys[b].d.name);
    return c ? c : (a > b) - (a < b);
}

static int64_t find_system(const build *b, const char *name)
{
    uint32_t lo = 0, hi = b->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int c = strcmp(b->s->sys[b->by_name[mid]].d.name, name);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < b->n && !strcmp(b->s->sys[b->by_name[lo]].d.name, name) ? (int64_t)b->by_name[lo] : -1;
}

static void check_names(build *b)
{
    keel_schedule *s = b->s;
    for (uint32_t i = 0; i < b->n; i++)
        b->by_name[i] = i;
    qsort_r(b->by_name, b->n, sizeof *b->by_name, cmp_name_ctx_sort, s);
    for (uint32_t i = 1; i < b->n; i++) {
        const char *name = s->sys[b->by_name[i]].d.name;
        if (!strcmp(name, s->sys[b->by_name[i - 1]].d.name))
            diag_add(s, KEEL_SCHED_DUPLICATE_SYSTEM, NAMES(name), "system name '%s' is declared twice (systems #%u and #%u)",
                     name, b->by_name[i - 1], b->by_name[i]);
    }
}

/* Tracks of the plan: Engine-Pre, Public, user tracks, Engine-Post. */
static int make_tracks(keel_schedule *s)
{
    s->ntracks = s->nuser_tracks + 3;
    s->tracks = calloc(s->ntracks, sizeof *s->tracks);
    if (!s->tracks)
        return core_fail(KEEL_ENOMEM, "keel_schedule_build: out of memory");
    s->tracks[0].name = KEEL_TRACK_ENGINE_PRE;
    s->tracks[1].name = KEEL_TRACK_PUBLIC;
    for (uint32_t i = 0; i < s->nuser_tracks; i++)
        s->tracks[2 + i].name = s->user_tracks[i];
    s->tracks[s->ntracks - 1].name = KEEL_TRACK_ENGINE_POST;
    return KEEL_OK;
}

static void resolve_track(keel_schedule *s, sched_system *sys)
{
    const char *t = sys->d.track ? sys->d.track : KEEL_TRACK_PUBLIC;
    sys->track = 1;
    for (uint32_t i = 0; i < s->ntracks; i++)
        if (!strcmp(s->tracks[i].name, t))
            sys->track = i;
    if (is_reserved_track(t))
        diag_add(s, KEEL_SCHED_RESERVED_TRACK, NAMES(sys->d.name, t),
                 "system '%s' is on track '%s': Engine- tracks are reserved for the engine", sys->d.name, t);
    else if (strcmp(s->tracks[sys->track].name, t))
        diag_add(s, KEEL_SCHED_UNKNOWN_TRACK, NAMES(sys->d.name, t), "system '%s' names track '%s', which is not declared",
                 sys->d.name, t);
}

/* DAG ids: systems of one track with the same DAG name share an id. */
static void resolve_dags(keel_schedule *s)
{
    for (uint32_t i = 0; i < s->nsys; i++) {
        sched_system *a = &s->sys[i];
        const char *da = a->d.dag ? a->d.dag : SCHED_DEFAULT_DAG;
        a->dag = i;
        for (uint32_t j = 0; j < i; j++) {
            const sched_system *b = &s->sys[j];
            if (b->track == a->track && !strcmp(da, b->d.dag ? b->d.dag : SCHED_DEFAULT_DAG)) {
                a->dag = b->dag;
                break;
            }
        }
    }
}

static void check_body(keel_schedule *s, sched_system *sys)
{
    const keel_system_desc *d = &sys->d;
    const char *missing = NULL;
    switch (d->kind) {
    case KEEL_SYSTEM_CALLBACK: missing = d->run ? NULL : "run"; break;
    case KEEL_SYSTEM_QUERY:    missing = d->each_chunk ? NULL : "each_chunk"; break;
    case KEEL_SYSTEM_PIPELINE: missing = d->pipeline ? NULL : "pipeline"; break;
    default:
        diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(d->name), "system '%s' has unknown kind %d", d->name, (int)d->kind);
        return;
    }
    if (missing) {
        diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(d->name), "system '%s' has no '%s' body for its kind", d->name, missing);
        return;
    }
    int rc = d->kind == KEEL_SYSTEM_QUERY ? keel_query_create(s->world, &d->query, &sys->query) : KEEL_OK;
    if (rc == KEEL_ENOMEM) /* not a bad query: the build says what happened */
        s->oom = true;
    else if (rc)
        diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(d->name), "system '%s' has a bad query: %s", d->name, keel_last_error());
    if (d->priority < KEEL_PRIORITY_LOW || d->priority > KEEL_PRIORITY_CRITICAL)
        diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(d->name), "system '%s' has unknown priority %d", d->name,
                 (int)d->priority);
    if (d->entity_budget && d->kind != KEEL_SYSTEM_QUERY)
        diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(d->name),
                 "system '%s' has an entity_budget but is not a query system (only queries visit rows)", d->name);
}

/* Mark the components of a 0-terminated list in a bitset; report bad ids. */
static void mark_components(build *b, uint32_t sys, const keel_component *list, uint64_t *set, const char *what)
{
    keel_schedule *s = b->s;
    for (uint32_t i = 0; i < KEEL_ACCESS_MAX && list[i]; i++) {
        keel_component c = list[i];
        if (!world_component_valid(s->world, c)) {
            diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(s->sys[sys].d.name),
                     "system '%s': %s[%u] = %u is not a registered component", s->sys[sys].d.name, what, i, c);
            continue;
        }
        set[c >> 6] |= 1ull << (c & 63);
    }
}

/* Id of a resource or event name: interned after the component ids. */
static int64_t key_id(build *b, const char *name)
{
    for (uint32_t i = 0; i < b->nkeys; i++)
        if (!strcmp(b->keys[i], name))
            return KEEL_MAX_COMPONENTS + 1 + i;
    if (CORE_GROW(b->keys, b->keys_cap, b->nkeys + 1, 32)) {
        b->s->oom = true;
        return -1;
    }
    b->keys[b->nkeys++] = name;
    return KEEL_MAX_COMPONENTS + b->nkeys;
}

/* Name of a key: a component name or an interned resource/event name. */
static const char *key_name(const build *b, uint32_t key)
{
    return key <= KEEL_MAX_COMPONENTS ? b->s->world->comps[key].name : b->keys[key - KEEL_MAX_COMPONENTS - 1];
}

static void intern_all(build *b)
{
    for (uint32_t i = 0; i < b->n; i++) {
        const keel_access *a = &b->s->sys[i].d.access;
        const char *const *lists[] = {a->resources_read, a->resources_write, a->events_produce, a->events_consume};
        for (size_t l = 0; l < 4; l++)
            for (uint32_t k = 0; k < KEEL_ACCESS_MAX && lists[l][k]; k++)
                key_id(b, lists[l][k]);
    }
}

static void mark_keys(build *b, const char *const *list, uint64_t *set)
{
    for (uint32_t k = 0; k < KEEL_ACCESS_MAX && list[k]; k++) {
        int64_t id = key_id(b, list[k]);
        if (id >= 0)
            set[id >> 6] |= 1ull << (id & 63);
    }
}

#define ROW(base, i) ((base) + (size_t)(i) * b->words)

static void list_to_set(const keel_world *w, const keel_component *list, world_compset *set)
{
    for (uint32_t k = 0; k < KEEL_ACCESS_MAX && list[k]; k++)
        if (world_component_valid(w, list[k]))
            compset_add(set, list[k]);
}

/* The access sets the transaction layer checks against; a query term that
 * no list names is a plain read (for ordering too). */
static void summarise_components(build *b, uint32_t i)
{
    sched_system *sys = &b->s->sys[i];
    const keel_access *a = &sys->d.access;
    const keel_world *w = b->s->world;
    txn_access *acc = &sys->acc;
    *acc = (txn_access){0};
    list_to_set(w, a->reads, &acc->read);
    list_to_set(w, a->reads_fresh, &acc->read);
    list_to_set(w, a->reads_snapshot, &acc->snapshot);
    list_to_set(w, a->writes, &acc->write);
    list_to_set(w, a->rewrites, &acc->rewrite);
    list_to_set(w, a->rewrites, &acc->write);
    list_to_set(w, a->side_writes, &acc->side);
    for (int k = 0; k < 4; k++)
        acc->read.w[k] |= acc->snapshot.w[k];
    if (sys->d.kind == KEEL_SYSTEM_PIPELINE) {
        /* no transaction: nothing to version a write into, no snapshot */
        for (keel_component c = 1; c <= w->ncomps; c++) {
            bool vw = compset_has(&acc->write, c) && w->comps[c].desc.discipline == KEEL_VERSIONED;
            if (vw || compset_has(&acc->snapshot, c) || compset_has(&acc->side, c))
                diag_add(b->s, KEEL_SCHED_BAD_SYSTEM, NAMES(sys->d.name, w->comps[c].name),
                         "pipeline system '%s' %s component '%s', but pipelines run without a transaction", sys->d.name,
                         vw ? "writes VERSIONED" : compset_has(&acc->side, c) ? "side_writes" : "reads_snapshot of",
                         w->comps[c].name);
        }
    }
    if (sys->d.kind != KEEL_SYSTEM_QUERY)
        return;
    for (uint32_t k = 0; k < KEEL_QUERY_MAX_TERMS && sys->d.query.with[k]; k++) {
        keel_component c = sys->d.query.with[k];
        if (!world_component_valid(w, c) || compset_has(&acc->read, c) || compset_has(&acc->write, c) ||
            compset_has(&acc->side, c))
            continue;
        compset_add(&acc->read, c);
        ROW(b->rd, i)[c >> 6] |= 1ull << (c & 63);
    }
}

static void summarise_access(build *b, uint32_t i)
{
    keel_schedule *s = b->s;
    const keel_access *a = &s->sys[i].d.access;
    mark_components(b, i, a->reads, ROW(b->rd, i), "reads");
    mark_components(b, i, a->reads_fresh, ROW(b->fresh, i), "reads_fresh");
    mark_components(b, i, a->reads_snapshot, ROW(b->snap, i), "reads_snapshot");
    mark_components(b, i, a->writes, ROW(b->wr, i), "writes");
    mark_components(b, i, a->rewrites, ROW(b->wr, i), "rewrites");
    mark_components(b, i, a->side_writes, ROW(b->wr, i), "side_writes");
    summarise_components(b, i);
    mark_keys(b, a->resources_read, ROW(b->rd, i));
    mark_keys(b, a->resources_write, ROW(b->wr, i));
    mark_keys(b, a->events_produce, ROW(b->prod, i));
    mark_keys(b, a->events_consume, ROW(b->cons, i));
    for (uint32_t k = 0; k < KEEL_ACCESS_MAX && a->reads_snapshot[k]; k++) {
        keel_component c = a->reads_snapshot[k];
        if (world_component_valid(s->world, c) && s->world->comps[c].desc.discipline != KEEL_VERSIONED)
            diag_add(s, KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, NAMES(s->sys[i].d.name, s->world->comps[c].name),
                     "system '%s' reads_snapshot component '%s', which is not VERSIONED", s->sys[i].d.name,
                     s->world->comps[c].name);
    }
}

/* ---- build: step 2, edges ------------------------------------------------- */

static void edge(build *b, uint32_t from, uint32_t to)
{
    b->adj[(size_t)from * b->adj_words + (to >> 6)] |= 1ull << (to & 63);
}

static bool has_edge(const build *b, uint32_t from, uint32_t to)
{
    return (b->adj[(size_t)from * b->adj_words + (to >> 6)] >> (to & 63)) & 1u;
}

/* Lowest key set in both rows, or -1. */
static int64_t common_key(const build *b, const uint64_t *x, const uint64_t *y)
{
    for (uint32_t w = 0; w < b->words; w++)
        if (x[w] & y[w])
            return (int64_t)w * 64 + __builtin_ctzll(x[w] & y[w]);
    return -1;
}

static void explicit_edges(build *b, uint32_t i)
{
    keel_schedule *s = b->s;
    const sched_system *sys = &s->sys[i];
    for (int dir = 0; dir < 2; dir++) {
        const char *const *list = dir ? sys->d.before : sys->d.after;
        for (uint32_t k = 0; k < KEEL_EDGE_MAX && list[k]; k++) {
            int64_t j = find_system(b, list[k]);
            if (j < 0) {
                diag_add(s, KEEL_SCHED_UNKNOWN_SYSTEM, NAMES(sys->d.name, list[k]), "system '%s' is %s '%s', which does not exist",
                         sys->d.name, dir ? "before" : "after", list[k]);
                continue;
            }
            uint32_t from = dir ? i : (uint32_t)j, to = dir ? (uint32_t)j : i;
            uint32_t tf = s->sys[from].track, tt = s->sys[to].track;
            if (tf < tt)
                continue; /* already ordered by the tracks */
            if (tf > tt) {
                diag_add(s, KEEL_SCHED_BAD_SYSTEM, NAMES(s->sys[from].d.name, s->sys[to].d.name),
                         "'%s' must run before '%s', but its track '%s' runs after track '%s'", s->sys[from].d.name,
                         s->sys[to].d.name, s->tracks[tf].name, s->tracks[tt].name);
                continue;
            }
            edge(b, from, to);
        }
    }
}

static void need(build *b, uint32_t x, uint32_t y, uint32_t key, keel_sched_code code)
{
    if (CORE_GROW(b->needs, b->needs_cap, b->nneeds + 1, 64)) {
        b->s->oom = true;
        return;
    }
    b->needs[b->nneeds++] = (struct need){x, y, key, code};
}

/* Lowest key that `writer` writes and `reader` plainly reads without also
 * writing it (that case is a write conflict), or -1. */
static int64_t read_key(const build *b, uint32_t writer, uint32_t reader)
{
    const uint64_t *w = ROW(b->wr, writer), *r = ROW(b->rd, reader), *rw = ROW(b->wr, reader);
    for (uint32_t i = 0; i < b->words; i++) {
        uint64_t m = w[i] & r[i] & ~rw[i];
        if (m)
            return (int64_t)i * 64 + __builtin_ctzll(m);
    }
    return -1;
}

/* Derive the edges and ordering needs between systems x < y of one track. */
static void derive_pair(build *b, uint32_t x, uint32_t y)
{
    const sched_system *sx = &b->s->sys[x], *sy = &b->s->sys[y];
    bool phased = sx->dag == sy->dag && sx->d.phase != sy->d.phase;
    uint32_t lo = sx->d.phase < sy->d.phase ? x : y, hi = lo == x ? y : x;

    /* writer before reads_fresh reader (a reads_snapshot reader needs no
     * edge: it reads the tick-start version, which the writer never touches) */
    if (common_key(b, ROW(b->wr, x), ROW(b->fresh, y)) >= 0)
        edge(b, x, y);
    if (common_key(b, ROW(b->wr, y), ROW(b->fresh, x)) >= 0)
        edge(b, y, x);
    /* producer before consumer */
    if (common_key(b, ROW(b->prod, x), ROW(b->cons, y)) >= 0)
        edge(b, x, y);
    if (common_key(b, ROW(b->prod, y), ROW(b->cons, x)) >= 0)
        edge(b, y, x);

    struct { int64_t key; keel_sched_code code; } c[4] = {
        {common_key(b, ROW(b->wr, x), ROW(b->wr, y)), KEEL_SCHED_WRITE_CONFLICT},
        {read_key(b, x, y), KEEL_SCHED_READ_CONFLICT}, /* x writes, y only reads */
        {read_key(b, y, x), KEEL_SCHED_READ_CONFLICT}, /* y writes, x only reads */
        {sx->d.access.exclusive || sy->d.access.exclusive ? 0 : -1, KEEL_SCHED_EXCLUSIVE_CONFLICT},
    };
    for (int i = 0; i < 4; i++) {
        if (c[i].key < 0)
            continue;
        if (phased)
            edge(b, lo, hi);
        need(b, x, y, (uint32_t)c[i].key, c[i].code);
    }
}

static void derive_edges(build *b)
{
    for (uint32_t x = 0; x < b->n; x++)
        for (uint32_t y = x + 1; y < b->n; y++)
            if (b->s->sys[x].track == b->s->sys[y].track)
                derive_pair(b, x, y);
}

/* ---- build: step 3, cycles ------------------------------------------------ */

/* Kahn over the whole graph, using topo as its queue: returns how many
 * systems it ordered (topo[0..ret) is a topological order of them) and
 * leaves indeg[v] > 0 for the systems on or behind a cycle. */
static uint32_t kahn(const build *b, uint32_t *indeg, uint32_t *topo)
{
    uint32_t n = b->n, head = 0, tail = 0;
    for (uint32_t v = 0; v < n; v++)
        for (uint32_t u = 0; u < n; u++)
            indeg[v] += has_edge(b, u, v);
    for (uint32_t v = 0; v < n; v++)
        if (!indeg[v])
            topo[tail++] = v;
    while (head < tail) {
        uint32_t u = topo[head++];
        for (uint32_t v = 0; v < n; v++)
            if (has_edge(b, u, v) && --indeg[v] == 0)
                topo[tail++] = v;
    }
    return tail;
}

/* One concrete cycle among the unordered systems, chosen deterministically:
 * from the lowest such index, follow the lowest-index unordered predecessor
 * until a system repeats; the loop found is reported forwards, starting at
 * its lowest index. */
static void report_cycle(build *b, const uint32_t *indeg)
{
    keel_schedule *s = b->s;
    uint32_t n = b->n, start = 0;
    while (!indeg[start])
        start++;
    uint32_t *seen_at = malloc(n * sizeof *seen_at), *path = malloc((n + 1) * sizeof *path);
    if (!seen_at || !path) {
        free(seen_at);
        free(path);
        s->oom = true;
        diag_add(s, KEEL_SCHED_CYCLE, 0, NULL, "the ordering has a cycle");
        return;
    }
    memset(seen_at, 0xff, n * sizeof *seen_at);
    uint32_t len = 0, v = start;
    while (seen_at[v] == UINT32_MAX) {
        seen_at[v] = len;
        path[len++] = v;
        uint32_t p = 0;
        while (!(indeg[p] && has_edge(b, p, v)))
            p++;
        v = p;
    }
    /* path[seen_at[v] .. len) walks the cycle backwards */
    uint32_t first = seen_at[v], clen = len - first, min_pos = 0;
    for (uint32_t i = 1; i < clen; i++)
        if (path[first + i] < path[first + min_pos])
            min_pos = i;
    const char *names[KEEL_SCHED_DIAG_NAMES];
    char text[512];
    size_t used = (size_t)snprintf(text, sizeof text, "cycle: ");
    for (uint32_t i = 0; i <= clen; i++) {
        /* forwards = backwards reversed: element min_pos, min_pos-1, ... */
        uint32_t sys = path[first + (min_pos + clen - i % clen) % clen];
        if (i < KEEL_SCHED_DIAG_NAMES)
            names[i] = s->sys[sys].d.name;
        if (used < sizeof text)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%s", i ? " -> " : "", s->sys[sys].d.name);
    }
    diag_add(s, KEEL_SCHED_CYCLE, clen + 1, names, "%s", text);
    free(seen_at);
    free(path);
}

/* ---- build: step 4, orderings the rules need ------------------------------ */

static bool reaches(const build *b, uint32_t from, uint32_t to)
{
    return (b->reach[(size_t)from * b->adj_words + (to >> 6)] >> (to & 63)) & 1u;
}

/* reach[u] = successors of u and everything they reach, filled in reverse
 * topological order (topo = an order from Kahn). */
static void compute_reach(build *b, const uint32_t *topo)
{
    for (uint32_t i = b->n; i-- > 0;) {
        uint32_t u = topo[i];
        uint64_t *ru = &b->reach[(size_t)u * b->adj_words];
        for (uint32_t v = 0; v < b->n; v++) {
            if (!has_edge(b, u, v))
                continue;
            ru[v >> 6] |= 1ull << (v & 63);
            const uint64_t *rv = &b->reach[(size_t)v * b->adj_words];
            for (uint32_t w = 0; w < b->adj_words; w++)
                ru[w] |= rv[w];
        }
    }
}

static void check_needs(build *b)
{
    keel_schedule *s = b->s;
    for (uint32_t i = 0; i < b->nneeds; i++) {
        const struct need *nd = &b->needs[i];
        const char *x = s->sys[nd->a].d.name, *y = s->sys[nd->b].d.name, *k = key_name(b, nd->key);
        bool xy = reaches(b, nd->a, nd->b), yx = reaches(b, nd->b, nd->a);
        if (!xy && !yx) {
            switch (nd->code) {
            case KEEL_SCHED_WRITE_CONFLICT:
                diag_add(s, nd->code, NAMES(x, y, k), "systems '%s' and '%s' both write '%s' with no ordering between them", x, y, k);
                break;
            case KEEL_SCHED_READ_CONFLICT:
                diag_add(s, nd->code, NAMES(x, y, k), "systems '%s' and '%s' read and write '%s' with no ordering between them", x, y, k);
                break;
            default:
                diag_add(s, nd->code, NAMES(x, y), "system '%s' or '%s' is exclusive, but the two are not ordered", x, y);
            }
            continue;
        }
        if (nd->code != KEEL_SCHED_READ_CONFLICT)
            continue;
        /* the reader is the one that does not write the key */
        bool x_writes = (ROW(b->wr, nd->a)[nd->key >> 6] >> (nd->key & 63)) & 1u;
        uint32_t reader = x_writes ? nd->b : nd->a, writer = x_writes ? nd->a : nd->b;
        if (reaches(b, reader, writer))
            diag_add(s, KEEL_SCHED_READ_BEFORE_WRITE, NAMES(s->sys[reader].d.name, s->sys[writer].d.name, k),
                     "system '%s' reads '%s' before '%s' writes it: it sees the previous tick's value",
                     s->sys[reader].d.name, k, s->sys[writer].d.name);
    }
}

/* ---- build: step 5, order, plan and hash ---------------------------------- */

/* Min-heap of system indices. */
static void heap_push(uint32_t *h, uint32_t *n, uint32_t v)
{
    uint32_t i = (*n)++;
    while (i && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint32_t heap_pop(uint32_t *h, uint32_t *n)
{
    uint32_t top = h[0], v = h[--*n], i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static int make_plan(build *b)
{
    keel_schedule *s = b->s;
    uint32_t n = b->n, nedges = 0;
    for (uint32_t u = 0; u < n; u++)
        for (uint32_t v = 0; v < n; v++)
            nedges += has_edge(b, u, v);
    s->order = malloc((n + 1) * sizeof *s->order);
    s->succ_off = calloc(n + 1, sizeof *s->succ_off);
    s->succ = malloc((nedges + 1) * sizeof *s->succ);
    s->npred = calloc(n + 1, sizeof *s->npred);
    s->roots = malloc((n + 1) * sizeof *s->roots);
    uint32_t *indeg = calloc(n + 1, sizeof *indeg), *heap = malloc((n + 1) * sizeof *heap);
    if (!s->order || !s->succ_off || !s->succ || !s->npred || !s->roots || !indeg || !heap) {
        free(indeg);
        free(heap);
        return core_fail(KEEL_ENOMEM, "keel_schedule_build: out of memory");
    }
    uint32_t e = 0;
    for (uint32_t u = 0; u < n; u++) {
        s->succ_off[u] = e;
        for (uint32_t v = 0; v < n; v++)
            if (has_edge(b, u, v)) {
                s->succ[e++] = v;
                s->npred[v]++;
            }
    }
    s->succ_off[n] = e;
    memcpy(indeg, s->npred, n * sizeof *indeg);
    uint32_t pos = 0;
    for (uint32_t t = 0; t < s->ntracks; t++) {
        uint32_t hn = 0;
        s->tracks[t].first = pos;
        for (uint32_t v = 0; v < n; v++)
            if (s->sys[v].track == t && !indeg[v])
                heap_push(heap, &hn, v);
        while (hn) {
            uint32_t u = heap_pop(heap, &hn);
            s->order[pos++] = u;
            for (uint32_t k = s->succ_off[u]; k < s->succ_off[u + 1]; k++)
                if (--indeg[s->succ[k]] == 0)
                    heap_push(heap, &hn, s->succ[k]);
        }
        s->tracks[t].count = pos - s->tracks[t].first;
    }
    uint32_t nroots = 0;
    for (uint32_t t = 0; t < s->ntracks; t++) {
        s->tracks[t].roots_first = nroots;
        for (uint32_t i = s->tracks[t].first; i < s->tracks[t].first + s->tracks[t].count; i++)
            if (!s->npred[s->order[i]])
                s->roots[nroots++] = s->order[i];
        s->tracks[t].roots_count = nroots - s->tracks[t].roots_first;
    }
    free(indeg);
    free(heap);
    return KEEL_OK;
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* FNV-1a over: per track, its name and a NUL; per system in order, its name
 * and a NUL, then the order positions of its successors (u32 little endian,
 * ascending), then 0xffffffff. */
static uint64_t plan_hash(const keel_schedule *s)
{
    uint64_t h = CORE_FNV1A64_INIT;
    uint32_t *pos_of = malloc((s->nsys + 1) * sizeof *pos_of);
    uint32_t *succ_pos = malloc((s->succ_off[s->nsys] + 1) * sizeof *succ_pos);
    if (!pos_of || !succ_pos) {
        free(pos_of);
        free(succ_pos);
        return 0;
    }
    for (uint32_t i = 0; i < s->nsys; i++)
        pos_of[s->order[i]] = i;
    for (uint32_t t = 0; t < s->ntracks; t++) {
        h = core_fnv1a64(h, s->tracks[t].name, strlen(s->tracks[t].name) + 1);
        for (uint32_t i = s->tracks[t].first; i < s->tracks[t].first + s->tracks[t].count; i++) {
            uint32_t u = s->order[i], cnt = s->succ_off[u + 1] - s->succ_off[u];
            h = core_fnv1a64(h, s->sys[u].d.name, strlen(s->sys[u].d.name) + 1);
            for (uint32_t k = 0; k < cnt; k++)
                succ_pos[k] = pos_of[s->succ[s->succ_off[u] + k]];
            qsort(succ_pos, cnt, sizeof *succ_pos, cmp_u32);
            for (uint32_t k = 0; k < cnt; k++) {
                uint32_t p = succ_pos[k];
                unsigned char le[4] = {(unsigned char)p, (unsigned char)(p >> 8), (unsigned char)(p >> 16),
                                       (unsigned char)(p >> 24)};
                h = core_fnv1a64(h, le, 4);
            }
            h = core_fnv1a64(h, "\xff\xff\xff\xff", 4);
        }
    }
    free(pos_of);
    free(succ_pos);
    return h;
}

/* ---- build: driver --------------------------------------------------------- */

static int build_alloc(build *b)
{
    uint32_t n = b->n ? b->n : 1;
    b->words = (KEEL_MAX_COMPONENTS + 1 + b->nkeys + 63) / 64;
    size_t bits = (size_t)n * b->words;
    b->adj_words = (n + 63) / 64;
    b->by_name = malloc(n * sizeof *b->by_name);
    uint64_t **sets[] = {&b->rd, &b->fresh, &b->snap, &b->wr, &b->prod, &b->cons};
    bool ok = b->by_name != NULL;
    for (size_t i = 0; i < 6; i++)
        ok = (*sets[i] = calloc(bits, sizeof(uint64_t))) && ok;
    b->adj = calloc((size_t)n * b->adj_words, sizeof(uint64_t));
    b->reach = calloc((size_t)n * b->adj_words, sizeof(uint64_t));
    return ok && b->adj && b->reach ? KEEL_OK : core_fail(KEEL_ENOMEM, "keel_schedule_build: out of memory");
}

static void build_free(build *b)
{
    free(b->by_name);
    free(b->rd);
    free(b->fresh);
    free(b->snap);
    free(b->wr);
    free(b->prod);
    free(b->cons);
    free(b->keys);
    free(b->adj);
    free(b->needs);
    free(b->reach);
}

/* Steps 3-5 once the edges are known. */
static int order_and_check(build *b)
{
    uint32_t n = b->n;
    uint32_t *indeg = calloc(n + 1, sizeof *indeg), *topo = malloc((n + 1) * sizeof *topo);
    if (!indeg || !topo) {
        free(indeg);
        free(topo);
        return core_fail(KEEL_ENOMEM, "keel_schedule_build: out of memory");
    }
    if (kahn(b, indeg, topo) < n) {
        report_cycle(b, indeg);
    } else {
        compute_reach(b, topo);
        check_needs(b);
    }
    free(indeg);
    free(topo);
    return b->s->ok && !b->s->oom ? make_plan(b) : KEEL_OK;
}

int keel_schedule_build(keel_schedule *s)
{
    if (!s)
        return core_fail(KEEL_EINVAL, "keel_schedule_build: schedule is NULL");
    if (s->built)
        return core_fail(KEEL_EBUSY, "keel_schedule_build: the schedule is already built");
    s->built = true;
    s->ok = true;
    s->registry_stamp = s->world->ncomps;
    build b = {.s = s, .n = s->nsys};
    intern_all(&b);
    int rc = make_tracks(s);
    if (!rc)
        rc = build_alloc(&b);
    if (!rc) {
        check_names(&b);
        for (uint32_t i = 0; i < b.n; i++) {
            resolve_track(s, &s->sys[i]);
            check_body(s, &s->sys[i]);
            summarise_access(&b, i);
        }
        resolve_dags(s);
        for (uint32_t i = 0; i < b.n; i++)
            explicit_edges(&b, i);
        derive_edges(&b);
        rc = order_and_check(&b);
    }
    build_free(&b);
    if (rc) {
        s->ok = false;
        return rc;
    }
    if (s->oom) { /* a lost warning leaves ok set: the schedule must not be installable */
        s->ok = false;
        return core_fail(KEEL_ENOMEM, "keel_schedule_build: out of memory (the diagnostics may be incomplete; "
                                      "destroy the schedule and build a new one)");
    }
    if (!s->ok) {
        for (uint32_t i = 0; i < s->ndiags; i++)
            if (s->diags[i].severity == KEEL_SCHED_ERROR)
                return core_fail(KEEL_EINVAL, "keel_schedule_build: %s: %s (%u diagnostics)",
                                 keel_sched_code_name(s->diags[i].code), s->diags[i].message, s->ndiags);
        return core_fail(KEEL_EINVAL, "keel_schedule_build: failed");
    }
    s->hash = plan_hash(s);
    return KEEL_OK;
}

/* ---- queries on a schedule ------------------------------------------------ */

uint32_t keel_schedule_diag_count(const keel_schedule *s)
{
    return s ? s->ndiags : 0;
}

const keel_sched_diag *keel_schedule_diag(const keel_schedule *s, uint32_t i)
{
    return s && i < s->ndiags ? &s->diags[i] : NULL;
}

uint64_t keel_schedule_hash(const keel_schedule *s)
{
    return s && s->ok ? s->hash : 0;
}

uint32_t keel_schedule_system_count(const keel_schedule *s)
{
    return s ? s->nsys : 0;
}

const char *keel_schedule_system_name(const keel_schedule *s, keel_system sys)
{
    return s && sys < s->nsys ? s->sys[sys].d.name : NULL;
}

keel_system keel_schedule_order(const keel_schedule *s, uint32_t i)
{
    return s && s->ok && i < s->nsys ? s->order[i] : UINT32_MAX;
}
