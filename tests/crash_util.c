/*
 * crash_util.c -- the crash-test workload, its children and its oracle
 * (described in crash_util.h), shared by test_durable_crash and test_powerloss.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/failpoint.h"
#include "crash_util.h"
#include "keel/keel.h"
#include "keel_test.h"
#include "world/world_internal.h"

/* ---- the workload ---------------------------------------------------------------------- */

typedef struct pos2 {
    uint64_t x, y;
} pos2;

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t crash_mix(uint64_t z)
{
    return mix(z);
}

static uint64_t rnd(uint64_t tick, uint64_t key)
{
    return mix(SEED ^ mix(tick ^ mix(key)));
}

static uint64_t cache_of(const pos2 *p)
{
    return mix(p->x * 31 + p->y) | 1;
}

static keel_entity acc_entity(uint32_t i)
{
    return KEEL_ENTITY_MAKE(i, 1);
}

_Static_assert(sizeof(msg) <= 4096, "a message must be written atomically (PIPE_BUF)");

static void send_msg(int fd, const msg *m)
{
    if (fd < 0)
        return;
    const char *p = (const char *)m;
    size_t left = sizeof *m;
    while (left) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(4); /* the parent is gone */
        p += n;
        left -= (size_t)n;
    }
}

static bool read_msg(int fd, msg *m)
{
    char *p = (char *)m;
    size_t got = 0;
    while (got < sizeof *m) {
        ssize_t n = read(fd, p + got, sizeof *m - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false; /* EOF (a partial message cannot happen: writes are atomic) */
        got += (size_t)n;
    }
    return true;
}

/* ---- the application ------------------------------------------------------------------- */

typedef struct app {
    keel_runtime *rt;
    keel_world *w;
    keel_component pos, hp, cache, born, marked, frozen, account, ledger;
    keel_query *q_born, *q_poscache, *q_statics;
    int out_fd;
    refdata *ref;
    _Atomic uint64_t mismatches;
    uint64_t skipped;          /* transfers skipped by the ledger (this tick) */
    bool async_bank;           /* the bank commits with keel_side_txn_commit_async */
    uint64_t dep_tick;         /* the submitted deposit's tick, and the balances it wrote */
    int64_t dep_ba, dep_bb;
    int bank_rc;               /* first error of a transfer */
    bool fatal_ok;             /* plan.fatal_ok: after a KEEL_EFATAL the bank tries its other transfers */
    uint32_t late_commits;     /* bank commits that returned 0 after one returned KEEL_EFATAL */
} app;

static refdata *g_ref;         /* the reference child writes here */

static int spawn_agent(app *a, keel_cmdbuf *cb, uint64_t tick, uint64_t k)
{
    uint64_t r = rnd(tick, 0xA6E470000ull + k);
    pos2 p = {r & 0xffff, (r >> 16) & 0xffff};
    uint64_t hp = (r >> 32) & 0xffffff, c = cache_of(&p);
    born2 b = {tick, mix(r)};
    keel_init in[] = {{a->pos, &p}, {a->hp, &hp}, {a->cache, &c}, {a->born, &b}};
    return keel_cmd_spawn(cb, in, 4);
}

static int spawn_static(app *a, keel_cmdbuf *cb, uint64_t tick, uint64_t k)
{
    born2 b = {tick, rnd(tick, 0x57A71C0000ull + k)};
    keel_init in[] = {{a->born, &b}, {a->frozen, NULL}};
    return keel_cmd_spawn(cb, in, 2);
}

/* on_first_tick: populate a new world; rebuild the TRANSIENT cache of a recovered one. */
static int populate(keel_ctx *ctx, void *user)
{
    app *a = user;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    int rc = 0;
    if (keel_world_count(a->w) == 0) {
        int64_t bal = INIT_BAL;
        uint64_t none = 0;
        for (uint32_t i = 0; !rc && i < NACC; i++)
            rc = keel_cmd_spawn(cb, (keel_init[]){{a->account, &bal}, {a->ledger, &none}}, 2);
        for (uint32_t i = 0; !rc && i < INIT_AGENTS; i++)
            rc = spawn_agent(a, cb, 0, i);
        for (uint32_t i = 0; !rc && i < INIT_STATICS; i++)
            rc = spawn_static(a, cb, 0, i);
        return rc;
    }
    uint32_t n = keel_query_count(a->q_poscache), got = 0;
    keel_entity *es = malloc(((size_t)n + 1) * sizeof *es);
    uint64_t *vs = malloc(((size_t)n + 1) * sizeof *vs);
    if (!es || !vs) {
        free(es);
        free(vs);
        return KEEL_ENOMEM;
    }
    keel_iter it;
    keel_txn_iter(ctx, a->q_poscache, &it);
    while (keel_txn_next(ctx, &it)) {
        const pos2 *p = KEEL_COLUMN(&it, pos2, 0);
        for (uint32_t i = 0; i < it.count && got < n; i++, got++) {
            es[got] = it.entities[i];
            vs[got] = cache_of(&p[i]);
        }
    }
    for (uint32_t i = 0; !rc && i < got; i++)
        rc = keel_txn_set(ctx, es[i], a->cache, &vs[i]);
    free(es);
    free(vs);
    return rc;
}

/* Transfer `slot` of tick t: id, accounts. Ids grow in commit order, so an
 * account's ledger (the id of the last transfer it took part in) tells
 * whether a transfer was applied. */
static uint64_t transfer_id(uint64_t t, uint32_t slot)
{
    return (t - 1) * SLOTS + slot + 1;
}

static void transfer_accounts(uint64_t t, uint32_t slot, uint32_t *ia, uint32_t *ib)
{
    uint64_t r = rnd(t, 0xBA4C000000ull + slot);
    *ia = (uint32_t)(r % NACC);
    *ib = (uint32_t)((r >> 8) % (NACC - 1));
    *ib += *ib >= *ia;
}

/* Buffer transfer `slot` of tick t in tx: 0 (balances written to *ba, *bb),
 * 1 when the ledgers show it was applied before a crash, or an error. */
static int transfer(app *a, keel_side_txn *tx, uint64_t t, uint32_t slot, int64_t *ba, int64_t *bb)
{
    uint64_t id = transfer_id(t, slot), la, lb;
    uint32_t ia, ib;
    transfer_accounts(t, slot, &ia, &ib);
    int rc;
    if ((rc = keel_side_get(tx, acc_entity(ia), a->account, ba)) || (rc = keel_side_get(tx, acc_entity(ib), a->account, bb)) ||
        (rc = keel_side_get(tx, acc_entity(ia), a->ledger, &la)) || (rc = keel_side_get(tx, acc_entity(ib), a->ledger, &lb)))
        return rc;
    if (la >= id || lb >= id)
        return 1;
    int64_t amount = 1 + (int64_t)(mix(id ^ (uint64_t)*ba) % 100); /* depends on the state */
    *ba -= amount;
    *bb += amount;
    if ((rc = keel_side_set(tx, acc_entity(ia), a->account, ba)) || (rc = keel_side_set(tx, acc_entity(ib), a->account, bb)) ||
        (rc = keel_side_set(tx, acc_entity(ia), a->ledger, &id)))
        return rc;
    return keel_side_set(tx, acc_entity(ib), a->ledger, &id);
}

static void acknowledge(app *a, uint64_t t, uint32_t slot, int64_t ba, int64_t bb)
{
    uint64_t id = transfer_id(t, slot);
    msg m = {.type = M_ACK, .tick = t, .id = id, .slot = slot, .bal_a = ba, .bal_b = bb};
    transfer_accounts(t, slot, &m.a, &m.b);
    send_msg(a->out_fd, &m);
    if (a->ref && id <= MAX_ID) {
        a->ref->acc[id][0] = m.a;
        a->ref->acc[id][1] = m.b;
        a->ref->bal[id][0] = ba;
        a->ref->bal[id][1] = bb;
    }
}

/* Slot 0 of every tick: a closure the controlling thread submits (keel_submit,
 * IMMEDIATE) before each step; it runs at Engine-Pre, before any system. */
static int deposit(keel_side_txn *tx, void *arg)
{
    app *a = arg;
    if (a->ref && a->dep_tick <= TMAX)
        a->ref->prefix[a->dep_tick][0] = keel_world_hash(a->w);
    return transfer(a, tx, a->dep_tick, 0, &a->dep_ba, &a->dep_bb);
}

/* Exclusive, first system of the tick: slots 1..TPT, each an IMMEDIATE side
 * transaction; committed and waited for one by one, or (async_bank) all
 * committed with keel_side_txn_commit_async, then their tickets waited for in
 * order. A transfer counts as acknowledged when the wait returned 0. */
static int bank(keel_ctx *ctx, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_ticket *tickets[TPT] = {0};
    int64_t bal[TPT][2];
    a->skipped = 0;
    if (a->ref && t <= TMAX)
        a->ref->prefix[t][1] = keel_world_hash(a->w);
    int rc = 0;
    /* the first error ends the run of transfers; with fatal_ok a KEEL_EFATAL
     * does not: every later commit must then fail the same way */
    for (uint32_t k = 0; k < TPT && (!rc || (a->fatal_ok && rc == KEEL_EFATAL)); k++) {
        keel_side_txn *tx = NULL;
        int r = keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx);
        if (!r)
            r = transfer(a, tx, t, k + 1, &bal[k][0], &bal[k][1]);
        if (r) {
            keel_side_txn_abort(tx);
            a->skipped += r == 1;
            rc = rc ? rc : r == 1 ? 0 : r;
            continue;
        }
        r = a->async_bank ? keel_side_txn_commit_async(tx, &tickets[k]) : keel_side_txn_commit(tx);
        if (!r && rc == KEEL_EFATAL)
            a->late_commits++;
        if (!r && !a->async_bank)
            acknowledge(a, t, k + 1, bal[k][0], bal[k][1]);
        if (!r && a->ref && t <= TMAX)
            a->ref->prefix[t][k + 2] = keel_world_hash(a->w);
        rc = rc ? rc : r;
    }
    for (uint32_t k = 0; k < TPT; k++) {
        if (!tickets[k])
            continue;
        int w = keel_ticket_wait(tickets[k], -1);
        keel_ticket_release(tickets[k]);
        if (!w)
            acknowledge(a, t, k + 1, bal[k][0], bal[k][1]);
        rc = rc ? rc : w;
    }
    if (rc && !a->bank_rc)
        a->bank_rc = rc;
    return rc;
}

static int move_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx), bad = 0;
    pos2 *p = KEEL_COLUMN(it, pos2, 0);
    uint64_t *c = KEEL_COLUMN(it, uint64_t, 1);
    for (uint32_t i = 0; i < it->count; i++) {
        bad += c[i] != cache_of(&p[i]);
        if (rnd(t, it->entities[i]) % 4 == 0) {
            uint64_t cv = c[i];
            p[i].x += cv % 1000;
            p[i].y ^= (cv >> 10) & 0xffff;
            c[i] = cache_of(&p[i]);
        }
    }
    if (bad)
        atomic_fetch_add(&a->mismatches, bad);
    return 0;
}

static int health_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    uint64_t *hp = KEEL_COLUMN(it, uint64_t, 0);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++) {
        if (rnd(t, it->entities[i] ^ 0x4EA1ull) % 3)
            continue;
        hp[i] = mix(hp[i] ^ t) & 0xffffff;
        if (hp[i] % 97 == 0)
            rc = keel_cmd_destroy(keel_ctx_commands(ctx), it->entities[i]);
    }
    return rc;
}

static int tagger_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++)
        if (rnd(t, it->entities[i] ^ 0x7A6ull) % 29 == 0)
            rc = keel_cmd_add(keel_ctx_commands(ctx), it->entities[i], a->marked, NULL);
    return rc;
}

static int untagger_fn(keel_ctx *ctx, const keel_iter *it, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++)
        if (rnd(t, it->entities[i] ^ 0x07A60000ull) % 7 == 0)
            rc = keel_cmd_remove(keel_ctx_commands(ctx), it->entities[i], a->marked);
    return rc;
}

static int reaper(keel_ctx *ctx, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    int rc = 0;
    keel_iter it;
    keel_txn_iter(ctx, a->q_born, &it);
    while (!rc && keel_txn_next(ctx, &it))
        for (uint32_t i = 0; !rc && i < it.count; i++)
            if (rnd(t, it.entities[i] ^ 0xDEADull) % 211 == 0)
                rc = keel_cmd_destroy(keel_ctx_commands(ctx), it.entities[i]);
    return rc;
}

static int spawner(keel_ctx *ctx, void *user)
{
    app *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    /* the population swings (tables gain and lose whole chunks): 16 ticks of
     * 35..44 spawns, 16 ticks of 5..14 */
    uint32_t n = ((t / 16) % 2 ? 35u : 5u) + (uint32_t)(rnd(t, 0x5EEDull) % 10);
    int rc = 0;
    for (uint32_t k = 0; !rc && k < n; k++)
        rc = spawn_agent(a, keel_ctx_commands(ctx), t, k);
    return rc ? rc : spawn_static(a, keel_ctx_commands(ctx), t, 0);
}

static const keel_field f_pos[] = {{.name = "x", .type = KEEL_U64, .offset = 0}, {.name = "y", .type = KEEL_U64, .offset = 8}};
static const keel_field f_u64[] = {{.name = "v", .type = KEEL_U64, .offset = 0}};
static const keel_field f_i64[] = {{.name = "v", .type = KEEL_I64, .offset = 0}};
static const keel_field f_born[] = {{.name = "tick", .type = KEEL_U64, .offset = 0},
                                    {.name = "salt", .type = KEEL_U64, .offset = 8}};

/* Create the runtime, register, build and install the schedule. */
static int app_open(app *a, const plan *p)
{
    keel_runtime_desc d = {
        .world = {.chunk_rows = CHUNK_ROWS},
        .workers = p->workers,
        .tick_rate_hz = -1,
        .durability = p->mode,
        .durable = {.dir = p->dir, .checkpoint_every_ticks = p->ckpt_every, .map_size = p->map_size,
                    .wal_retain = p->wal_retain},
        .on_first_tick = populate,
        .hook_user = a,
    };
    int rc = keel_runtime_create(&d, &a->rt);
    if (rc)
        return rc;
    a->w = keel_runtime_world(a->rt);
    const keel_component_desc comps[] = {
        {.name = "pos", .size = 16, .fields = f_pos, .field_count = 2},
        {.name = "hp", .size = 8, .discipline = KEEL_SINGLE_VERSION, .fields = f_u64, .field_count = 1},
        {.name = "cache", .size = 8, .discipline = KEEL_TRANSIENT, .fields = f_u64, .field_count = 1},
        {.name = "born", .size = 16, .fields = f_born, .field_count = 2},
        {.name = "marked"},
        {.name = "frozen"},
        {.name = "account", .size = 8, .fields = f_i64, .field_count = 1},
        {.name = "ledger", .size = 8, .fields = f_u64, .field_count = 1},
    };
    keel_component *ids[] = {&a->pos, &a->hp, &a->cache, &a->born, &a->marked, &a->frozen, &a->account, &a->ledger};
    for (size_t i = 0; !rc && i < sizeof comps / sizeof comps[0]; i++)
        rc = keel_component_register(a->w, &comps[i], ids[i]);
    if (!rc)
        rc = keel_query_create(a->w, &(keel_query_desc){.with = {a->born}}, &a->q_born);
    if (!rc)
        rc = keel_query_create(a->w, &(keel_query_desc){.with = {a->pos, a->cache}}, &a->q_poscache);
    if (!rc)
        rc = keel_query_create(a->w, &(keel_query_desc){.with = {a->born, a->frozen}}, &a->q_statics);
    keel_schedule *s = NULL;
    if (!rc)
        rc = keel_schedule_create(a->rt, &s);
    if (rc)
        return rc;
    keel_system_desc sys[] = {
        {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = bank, .user = a,
         .access = {.side_writes = {a->account, a->ledger}, .exclusive = true},
         .before = {"move", "health", "tagger", "untagger", "reaper", "spawner"}},
        {.name = "move", .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = move_fn, .user = a, .parallel = true,
         .query = {.with = {a->pos, a->cache}}, .access = {.writes = {a->pos, a->cache}}},
        {.name = "health", .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = health_fn, .user = a, .parallel = true,
         .query = {.with = {a->hp}}, .access = {.writes = {a->hp}}},
        {.name = "tagger", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = tagger_fn, .user = a, .parallel = true,
         .query = {.with = {a->pos}, .without = {a->marked}}, .access = {.reads = {a->pos}}},
        {.name = "untagger", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = untagger_fn, .user = a,
         .parallel = true, .query = {.with = {a->pos, a->marked}}, .access = {.reads = {a->pos, a->marked}}},
        {.name = "reaper", .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = reaper, .user = a,
         .access = {.reads = {a->born}}},
        {.name = "spawner", .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = spawner, .user = a},
    };
    for (size_t i = 0; !rc && i < sizeof sys / sizeof sys[0]; i++)
        rc = keel_schedule_add_system(s, &sys[i], NULL);
    if (!rc)
        rc = keel_schedule_build(s);
    if (!rc)
        rc = keel_runtime_set_schedule(a->rt, s);
    else
        keel_schedule_destroy(s);
    return rc;
}

static void app_close(app *a)
{
    keel_query_destroy(a->q_born);
    keel_query_destroy(a->q_poscache);
    keel_query_destroy(a->q_statics);
    keel_runtime_close(a->rt);
}

/* ---- the child ------------------------------------------------------------------------------ */

static _Noreturn void child_fail(int fd, const char *what, int rc)
{
    msg m = {.type = M_FAIL, .rc = rc};
    snprintf(m.text, sizeof m.text, "%s: %s: %s", what, keel_strerror(rc), keel_last_error());
    send_msg(fd, &m);
    if (g_ref && !g_ref->err[0])
        snprintf(g_ref->err, sizeof g_ref->err, "%s", m.text);
    _exit(3);
}

static _Noreturn void hold(int out_fd, int hold_fd, uint64_t tick)
{
    msg m = {.type = M_HOLD, .tick = tick};
    send_msg(out_fd, &m);
    char c;
    while (read(hold_fd, &c, 1) != 0) /* the parent never writes: it kills us; EOF = it is gone */
        if (errno != EINTR)
            break;
    _exit(5);
}

static void probe_report(const app *a, const plan *p, msg *m)
{
    for (int k = 0; k < 2; k++) {
        keel_entity e = p->probe[k];
        if (!e)
            continue;
        m->probe_alive[k] = keel_alive(a->w, e);
        uint32_t idx = KEEL_ENTITY_INDEX(e);
        m->probe_gen[k] = idx < a->w->nslots ? world_slot_gen(a->w, world_slot_at(a->w, idx)) : 0;
        if (k == 1 && m->probe_alive[k])
            keel_get(a->w, e, a->born, &m->probe_born);
    }
}

/* The reference's bookkeeping after tick t. */
static void reference_tick(app *a, uint64_t t, const keel_entity *before, uint32_t nbefore)
{
    refdata *r = a->ref;
    r->hash[t] = keel_world_hash(a->w);
    uint32_t n = keel_world_count(a->w);
    if (t == 1 || n < r->min_entities)
        r->min_entities = n;
    if (n > r->max_entities)
        r->max_entities = n;
    if (t == PROBE_DESTROY_TICK)
        for (uint32_t i = 0; i < nbefore && !r->probe[0]; i++)
            if (!keel_alive(a->w, before[i]))
                r->probe[0] = before[i];
    if (t == PROBE_STATIC_TICK) {
        keel_iter it;
        keel_query_iter(a->q_statics, &it);
        while (!r->probe[1] && keel_iter_next(&it)) {
            const born2 *b = KEEL_COLUMN(&it, born2, 0);
            for (uint32_t i = 0; i < it.count && !r->probe[1]; i++)
                if (b[i].tick == t) {
                    r->probe[1] = it.entities[i];
                    r->probe_born = b[i];
                }
        }
    }
    for (int k = 0; k < 2; k++) {
        if (!r->probe[k])
            continue;
        r->probe_alive[k][t] = keel_alive(a->w, r->probe[k]);
        r->probe_gen[k][t] = world_slot_gen(a->w, world_slot_at(a->w, KEEL_ENTITY_INDEX(r->probe[k])));
    }
}

/* The failpoint observer: every point that acts is reported before it acts
 * (a crash's report is on the pipe before the SIGKILL). */
static void fp_observe(const char *name, const char *action, uint64_t hit, void *arg)
{
    msg m = {.type = M_FIRED, .aux = hit};
    snprintf(m.fp, sizeof m.fp, "%s", name);
    snprintf(m.fp_action, sizeof m.fp_action, "%s", action);
    send_msg(*(const int *)arg, &m);
}

static int noop_closure(keel_side_txn *tx, void *arg)
{
    (void)tx;
    (void)arg;
    return 0;
}

/* plan.fatal_ok: `where` failed with rc (KEEL_EFATAL, or the open's own
 * code). Probe what a latched runtime still does (opened: recovery had
 * succeeded), report, close, exit without M_DONE: nothing was drained. */
static _Noreturn void fatal_report(app *a, const char *where, int rc, keel_ticket *dep, bool opened)
{
    msg m = {.type = M_FATAL, .rc = rc, .tick = keel_runtime_tick(a->rt), .late_commits = a->late_commits,
             .bank_rc = a->bank_rc};
    snprintf(m.text, sizeof m.text, "%s", where);
    if (dep) { /* the step failed: the deposit's ticket completes all the same (0 only when durable) */
        m.dep_rc = keel_ticket_wait(dep, -1);
        keel_ticket_release(dep);
        if (!m.dep_rc)
            acknowledge(a, a->dep_tick, 0, a->dep_ba, a->dep_bb);
    }
    if (opened) {
        m.probe_rc[PROBE_STEP] = keel_runtime_step(a->rt);
        m.probe_rc[PROBE_FLUSH] = keel_flush(a->rt);
        m.probe_rc[PROBE_CHECKPOINT] = keel_checkpoint(a->rt);
        keel_ticket *t = NULL;
        m.probe_rc[PROBE_SUBMIT] = keel_submit(a->rt, noop_closure, NULL, KEEL_DURABLE_IMMEDIATE, &t);
        if (!m.probe_rc[PROBE_SUBMIT]) { /* queued: it must never complete with 0 */
            m.probe_rc[PROBE_SUBMIT] = keel_ticket_wait(t, 0);
            keel_ticket_release(t);
        }
    }
    m.fatal = keel_runtime_fatal(a->rt);
    m.last_lsn = keel_durable_lsn(a->rt);
    send_msg(a->out_fd, &m);
    app_close(a);
    exit(0);
}

static _Noreturn void child_main(const plan *p, int out_fd, int hold_fd)
{
    static int fp_fd;
    fp_fd = out_fd;
    app a = {.out_fd = out_fd, .ref = p->reference ? g_ref : NULL, .async_bank = p->async_bank,
             .fatal_ok = p->fatal_ok};
    core_fp_set_observer(fp_observe, &fp_fd);
    int rc = keel_failpoints_set(p->failpoints ? p->failpoints : "");
    if (rc)
        child_fail(out_fd, "keel_failpoints_set", rc);
    if ((rc = app_open(&a, p)))
        child_fail(out_fd, "setting the runtime up", rc);
    msg m = {.type = M_STARTED}; /* a kill on this lands in (or right before) recovery */
    send_msg(out_fd, &m);
    keel_recovery info = {0};
    if (p->dir && (rc = keel_runtime_recover(a.rt, &info))) {
        if (p->fatal_ok)
            fatal_report(&a, "keel_runtime_recover", rc, NULL, false);
        child_fail(out_fd, "keel_runtime_recover", rc);
    }
    m = (msg){.type = M_RECOVERED, .tick = keel_runtime_tick(a.rt), .hash = keel_world_hash(a.w),
              .aux = info.checkpoint_tick, .aux2 = info.tick, .fresh = info.fresh, .last_lsn = info.last_lsn};
    for (uint32_t i = 0; i < NACC; i++) {
        keel_get(a.w, acc_entity(i), a.ledger, &m.ledger[i]);
        keel_get(a.w, acc_entity(i), a.account, &m.bal[i]);
    }
    probe_report(&a, p, &m);
    send_msg(out_fd, &m);
    if (p->reference)
        g_ref->hash[0] = m.hash;
    if (p->hold_after_recover)
        hold(out_fd, hold_fd, m.tick);
    keel_entity *before = NULL;
    uint32_t nbefore = 0;
    while (keel_runtime_tick(a.rt) < p->until) {
        uint64_t t = keel_runtime_tick(a.rt) + 1;
        if (p->reference && t == PROBE_DESTROY_TICK) { /* everything alive before the probe tick */
            before = malloc(((size_t)keel_world_count(a.w) + 1) * sizeof *before);
            keel_iter it;
            keel_query_iter(a.q_born, &it);
            while (before && keel_iter_next(&it))
                for (uint32_t i = 0; i < it.count; i++)
                    before[nbefore++] = it.entities[i];
        }
        atomic_store(&a.mismatches, 0);
        keel_ticket *dep = NULL;
        a.dep_tick = t;
        if ((rc = keel_submit(a.rt, deposit, &a, KEEL_DURABLE_IMMEDIATE, &dep))) {
            if (p->fatal_ok && rc == KEEL_EFATAL)
                fatal_report(&a, "keel_submit", rc, NULL, true);
            child_fail(out_fd, "keel_submit", rc);
        }
        if ((rc = keel_runtime_step(a.rt))) {
            if (p->fatal_ok && rc == KEEL_EFATAL)
                fatal_report(&a, "keel_runtime_step", rc, dep, true);
            child_fail(out_fd, "keel_runtime_step", rc);
        }
        if (keel_runtime_tick(a.rt) != t)
            child_fail(out_fd, "keel_runtime_step did not advance the tick by one", KEEL_EINVAL);
        rc = keel_ticket_wait(dep, -1); /* 0: durable; 1: skipped (applied before a crash) */
        keel_ticket_release(dep);
        if (rc == 0)
            acknowledge(&a, t, 0, a.dep_ba, a.dep_bb);
        else if (p->fatal_ok && rc == KEEL_EFATAL)
            fatal_report(&a, "the deposit's ticket", rc, NULL, true);
        else if (rc != 1 || p->reference)
            child_fail(out_fd, "the submitted deposit", rc);
        else
            a.skipped++;
        if (p->fatal_ok && a.bank_rc == KEEL_EFATAL)
            fatal_report(&a, "a bank transfer", a.bank_rc, NULL, true);
        m = (msg){.type = M_TICK, .tick = t, .hash = keel_world_hash(a.w), .aux = atomic_load(&a.mismatches),
                  .aux2 = a.skipped, .rc = a.bank_rc};
        send_msg(out_fd, &m);
        if (p->reference) {
            reference_tick(&a, t, before, nbefore);
            if (m.aux || a.bank_rc || a.skipped) {
                snprintf(g_ref->err, sizeof g_ref->err, "reference tick %" PRIu64 ": %" PRIu64
                         " transient mismatches, bank rc %d, %" PRIu64 " transfers skipped", t, m.aux, a.bank_rc,
                         a.skipped);
                _exit(3);
            }
        }
        if (t == p->flush_at) {
            m = (msg){.type = M_FLUSHED, .tick = t, .rc = keel_flush(a.rt)};
            if (p->fatal_ok && m.rc == KEEL_EFATAL)
                fatal_report(&a, "keel_flush", m.rc, NULL, true);
            send_msg(out_fd, &m);
        }
        if (t == p->checkpoint_at) {
            m = (msg){.type = M_CKPT, .tick = t, .rc = keel_checkpoint(a.rt)};
            if (p->fatal_ok && m.rc == KEEL_EFATAL)
                fatal_report(&a, "keel_checkpoint", m.rc, NULL, true);
            send_msg(out_fd, &m);
        }
    }
    free(before);
    /* fatal_ok: a failure in the last batches must not pass for a clean close */
    if (p->fatal_ok && (rc = keel_flush(a.rt)) == KEEL_EFATAL)
        fatal_report(&a, "keel_flush at the end", rc, NULL, true);
    if (p->hold_at_end)
        hold(out_fd, hold_fd, keel_runtime_tick(a.rt));
    app_close(&a);
    if (p->reference)
        g_ref->ok = !g_ref->err[0];
    m = (msg){.type = M_DONE};
    send_msg(out_fd, &m);
    exit(0); /* not _exit: in a sanitizer build this child's leak check runs and fails its exit status */
}

/* ---- the parent: children ------------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    int rfd;        /* messages */
    int hold_wfd;   /* never written: the child's hold blocks on it */
} child;

/* The plan's fields as one argument of the exec'd child (dir apart). */
#define PLAN_FMT "%d %" SCNd64 " %" SCNd32 " %" SCNu64 " %d %d %" SCNu64 " %" SCNu64 " %" SCNu64 " %d %d %" SCNu64 " %" SCNu64 " %d"

/* In the forked child: exec the test binary as a crash child with the plan's
 * extra environment (an LD_PRELOAD library is loaded only at exec). The
 * failpoints travel in KEEL_FAILPOINTS (set, or unset: none). */
static _Noreturn void child_exec(const plan *p, int out_fd, int hold_fd)
{
    for (const char *const *e = p->exec_env; *e; e++)
        if (putenv((char *)*e))
            _exit(126);
    if (p->failpoints ? setenv("KEEL_FAILPOINTS", p->failpoints, 1) : unsetenv("KEEL_FAILPOINTS"))
        _exit(126);
    char fields[512], fds[64];
    snprintf(fields, sizeof fields, PLAN_FMT, (int)p->mode, p->ckpt_every, p->workers, p->map_size, (int)p->async_bank,
             (int)p->wal_retain, p->until, p->flush_at, p->checkpoint_at, (int)p->hold_after_recover,
             (int)p->hold_at_end, p->probe[0], p->probe[1], (int)p->fatal_ok);
    snprintf(fds, sizeof fds, "%d %d", out_fd, hold_fd);
    char *argv[] = {"crash-child", CRASH_CHILD_ARG, (char *)(p->dir ? p->dir : ""), fields, fds, NULL};
    execv("/proc/self/exe", argv);
    fprintf(stderr, "crash child: exec /proc/self/exe: %s\n", strerror(errno));
    _exit(127);
}

_Noreturn void crash_child_exec(int argc, char **argv)
{
    plan p = {0};
    int mode = 0, async_bank = 0, wal_retain = 0, hold_rec = 0, hold_end = 0, fatal_ok = 0, out_fd = -1,
        hold_fd = -1;
    if (argc != 5 || sscanf(argv[3], PLAN_FMT, &mode, &p.ckpt_every, &p.workers, &p.map_size, &async_bank, &wal_retain,
                            &p.until, &p.flush_at, &p.checkpoint_at, &hold_rec, &hold_end, &p.probe[0],
                            &p.probe[1], &fatal_ok) != 14 ||
        sscanf(argv[4], "%d %d", &out_fd, &hold_fd) != 2) {
        fprintf(stderr, "crash child: bad arguments\n");
        _exit(2);
    }
    p.dir = argv[2][0] ? argv[2] : NULL;
    p.mode = (keel_durability)mode;
    p.async_bank = async_bank;
    p.wal_retain = wal_retain;
    p.hold_after_recover = hold_rec;
    p.hold_at_end = hold_end;
    p.fatal_ok = fatal_ok;
    p.failpoints = getenv("KEEL_FAILPOINTS"); /* child_exec set it (or removed it) */
    child_main(&p, out_fd, hold_fd);
}

pid_t fork_child(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    return pid;
}

static child child_start(const plan *p)
{
    int mp[2], hp[2];
    ck_assert_int_eq(pipe(mp), 0);
    ck_assert_int_eq(pipe(hp), 0);
    pid_t pid = fork_child();
    if (pid == 0) {
        close(mp[0]);
        close(hp[1]);
        signal(SIGPIPE, SIG_IGN);
        if (p->exec_env)
            child_exec(p, mp[1], hp[0]);
        child_main(p, mp[1], hp[0]);
    }
    close(mp[1]);
    close(hp[0]);
    return (child){pid, mp[0], hp[1]};
}

/* The reference run, in a child (the test process itself never starts keel threads
 * before it forks). */
refdata *reference_run(void)
{
    refdata *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(r, MAP_FAILED);
    memset(r, 0, sizeof *r);
    g_ref = r;
    plan p = {.reference = true, .workers = 1, .until = TMAX};
    child c = child_start(&p);
    msg m;
    while (read_msg(c.rfd, &m))
        ;
    int status = 0;
    ck_assert_int_eq(waitpid(c.pid, &status, 0), c.pid);
    close(c.rfd);
    close(c.hold_wfd);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0 && r->ok,
                  "reference run failed (exit %d, signal %d): %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0, r->err[0] ? r->err : "(see its output)");
    /* sanity of the reference itself */
    for (uint32_t t = 2; t <= TMAX; t++)
        ck_assert_msg(r->prefix[t][0] == r->hash[t - 1], "reference: hash inside tick %u before any transfer differs "
                      "from the hash after tick %u", t, t - 1);
    for (uint32_t id = 1; id <= MAX_ID; id++)
        ck_assert_msg(r->acc[id][0] != r->acc[id][1], "reference: transfer %u was not acknowledged", id);
    for (uint32_t i = 0; i < 2; i++)
        ck_assert_msg(r->probe[i] != 0, "reference: probe %u not found", i);
    ck_assert_msg(!r->probe_alive[0][PROBE_DESTROY_TICK], "reference: probe 0 alive after its tick");
    ck_assert_msg(r->min_entities > 1000 && r->max_entities < 6000 && r->max_entities - r->min_entities > 300,
                  "reference: population %" PRIu64 "..%" PRIu64 " outside the designed range", r->min_entities,
                  r->max_entities);
    if (getenv("KEEL_CRASH_VERBOSE"))
        fprintf(stderr, "reference: %u ticks, population %" PRIu64 "..%" PRIu64 "\n", TMAX, r->min_entities,
                r->max_entities);
    return r;
}

/* ---- the parent: the oracle --------------------------------------------------------------- */

void ofail(oracle *o, const char *fmt, ...)
{
    if (o->failed)
        return;
    o->failed = true;
    int n = snprintf(o->fail, sizeof o->fail, "[%s] ", o->scenario ? o->scenario : "?");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->fail + n, sizeof o->fail - (size_t)n, fmt, ap);
    va_end(ap);
}

void oracle_init(oracle *o, const refdata *ref, const char *scenario)
{
    memset(o, 0, sizeof *o);
    o->ref = ref;
    o->slack = 1;
    o->scenario = scenario;
}

static void verify_recovered(oracle *o, const msg *m)
{
    const refdata *ref = o->ref;
    uint64_t R = m->tick;
    o->recoveries++;
    if (m->aux2 != R)
        ofail(o, "keel_recovery.tick %" PRIu64 " differs from keel_runtime_tick %" PRIu64 " after recovery", m->aux2, R);
    if (R > TMAX) {
        ofail(o, "recovered tick %" PRIu64 " is past anything that ran", R);
        return;
    }
    if (R > o->max_ran + o->slack)
        ofail(o, "recovered tick %" PRIu64 ", but the last tick that ran was %" PRIu64 "%s: recovery went past what "
              "ran", R, o->max_ran, o->slack ? " (+1 unreported)" : "");
    if (R < o->min_durable)
        ofail(o, "recovered tick %" PRIu64 " (checkpoint tick %" PRIu64 "), but tick %" PRIu64 " was durable "
              "(an IMMEDIATE step, keel_flush, keel_checkpoint or a clean close returned): lost ticks",
              R, m->aux, o->min_durable);
    /* the state: reference tick R, or R plus the first j transfers of tick R+1 */
    int j = -1;
    if (m->hash == ref->hash[R])
        j = 0;
    else if (R + 1 <= TMAX)
        for (int jj = 0; jj <= (int)SLOTS && j < 0; jj++)
            if (m->hash == ref->prefix[R + 1][jj])
                j = jj;
    if (j < 0) {
        char near[160] = "";
        for (uint32_t t = 0; t <= TMAX && !near[0]; t++)
            for (uint32_t jj = 0; jj <= SLOTS && !near[0]; jj++)
                if ((jj == 0 && ref->hash[t] == m->hash) || (t > 0 && jj > 0 && ref->prefix[t][jj] == m->hash))
                    snprintf(near, sizeof near, "; it is the reference state of tick %u%s", jj ? t - 1 : t,
                             jj ? " plus transfers of the next tick" : "");
        ofail(o, "recovered tick %" PRIu64 " (checkpoint tick %" PRIu64 ") holds state %016" PRIx64 ", which is no "
              "reference state of that tick (reference %016" PRIx64 ")%s", R, m->aux, m->hash, ref->hash[R], near);
        j = 0;
    }
    o->prefix_recoveries += j > 0;
    o->last_j = j;
    o->ckpt_recoveries += m->aux > 0;
    /* every acknowledged transfer is there */
    for (uint64_t id = 1; id <= MAX_ID && !o->failed; id++) {
        const ack_rec *k = &o->acks[id];
        if (!k->acked)
            continue;
        uint64_t t = (id - 1) / SLOTS + 1, kk = (id - 1) % SLOTS;
        if (!(t <= R || (t == R + 1 && kk < (uint64_t)j)))
            ofail(o, "acknowledged transfer %" PRIu64 " (tick %" PRIu64 ") is lost: recovered tick %" PRIu64
                  " with %d transfers of tick %" PRIu64, id, t, R, j, R + 1);
        if (m->ledger[k->a] < id || m->ledger[k->b] < id)
            ofail(o, "acknowledged transfer %" PRIu64 " is not in the ledgers: account %u ledger %" PRIu64
                  ", account %u ledger %" PRIu64 " (recovered tick %" PRIu64 ")", id, k->a, m->ledger[k->a], k->b,
                  m->ledger[k->b], R);
        if ((m->ledger[k->a] == id && m->bal[k->a] != k->bal_a) || (m->ledger[k->b] == id && m->bal[k->b] != k->bal_b))
            ofail(o, "acknowledged transfer %" PRIu64 ": balances %" PRId64 "/%" PRId64 " recovered, %" PRId64
                  "/%" PRId64 " acknowledged", id, m->bal[k->a], m->bal[k->b], k->bal_a, k->bal_b);
    }
    if (R > o->max_ran)
        o->max_ran = R;
    o->last_recovered = R;
    o->last_rec = *m;
}

static void verify_ack(oracle *o, const msg *m, uint64_t recovered)
{
    const refdata *ref = o->ref;
    uint64_t id = m->id;
    if (id < 1 || id > MAX_ID || m->tick != (id - 1) / SLOTS + 1 || m->slot != (id - 1) % SLOTS) {
        ofail(o, "acknowledgement with a bad id %" PRIu64 " at tick %" PRIu64, id, m->tick);
        return;
    }
    if (m->tick <= recovered)
        ofail(o, "transfer %" PRIu64 " of tick %" PRIu64 " committed again after recovering tick %" PRIu64,
              id, m->tick, recovered);
    if (ref->acc[id][0] != m->a || ref->acc[id][1] != m->b || ref->bal[id][0] != m->bal_a ||
        ref->bal[id][1] != m->bal_b)
        ofail(o, "transfer %" PRIu64 " wrote accounts %u/%u balances %" PRId64 "/%" PRId64 "; the reference %u/%u "
              "%" PRId64 "/%" PRId64, id, m->a, m->b, m->bal_a, m->bal_b, ref->acc[id][0], ref->acc[id][1],
              ref->bal[id][0], ref->bal[id][1]);
    if (o->acks[id].acked)
        ofail(o, "transfer %" PRIu64 " acknowledged twice (its first acknowledgement was lost)", id);
    o->acks[id] = (ack_rec){true, m->a, m->b, m->bal_a, m->bal_b};
    o->nacks++;
}

/* Read the child's messages to the end, check each, SIGKILL it when the
 * trigger fires (or when it holds, or on the first failure). */
static outcome pump(oracle *o, child *c, trigger tr, const plan *p)
{
    outcome out = {0};
    msg m;
    uint64_t prev = UINT64_MAX;
    bool crash_fired = false; /* a failpoint's crash reported itself: its SIGKILL is expected */
    while (read_msg(c->rfd, &m)) {
        bool fire = false;
        switch (m.type) {
        case M_STARTED:
            out.started = true;
            fire = tr.kind == TRIG_STARTED;
            break;
        case M_RECOVERED:
            out.recovered = true;
            out.rec = m;
            prev = m.tick;
            verify_recovered(o, &m);
            fire = tr.kind == TRIG_RECOVERED;
            break;
        case M_ACK:
            out.acks++;
            verify_ack(o, &m, out.recovered ? out.rec.tick : 0);
            fire = tr.kind == TRIG_ACKS && out.acks >= tr.n;
            break;
        case M_TICK:
            if (prev != UINT64_MAX && m.tick != prev + 1)
                ofail(o, "tick %" PRIu64 " reported after tick %" PRIu64, m.tick, prev);
            prev = m.tick;
            out.last_tick = m.tick;
            if (m.tick > TMAX)
                ofail(o, "tick %" PRIu64 " past the reference", m.tick);
            else if (m.hash != o->ref->hash[m.tick])
                ofail(o, "the run continued after recovering tick %" PRIu64 " diverges at tick %" PRIu64
                      ": hash %016" PRIx64 ", reference %016" PRIx64 " (checkpoint tick %" PRIu64 ")",
                      out.rec.tick, m.tick, m.hash, o->ref->hash[m.tick], out.rec.aux);
            if (m.aux)
                ofail(o, "tick %" PRIu64 ": %" PRIu64 " rows whose TRANSIENT cache disagrees with pos (on_first_tick "
                      "did not see or could not rebuild them)", m.tick, m.aux);
            if (m.rc)
                ofail(o, "tick %" PRIu64 ": a transfer failed: %s", m.tick, keel_strerror(m.rc));
            if (m.tick > o->max_ran)
                o->max_ran = m.tick;
            if (p->mode == KEEL_DURABLE_IMMEDIATE && m.tick > o->min_durable)
                o->min_durable = m.tick;
            fire = tr.kind == TRIG_TICK && m.tick >= tr.n;
            break;
        case M_FLUSHED:
        case M_CKPT:
            if (m.rc)
                ofail(o, "%s after tick %" PRIu64 " returned %s", m.type == M_CKPT ? "keel_checkpoint" : "keel_flush",
                      m.tick, keel_strerror(m.rc));
            else if (m.tick > o->min_durable)
                o->min_durable = m.tick;
            fire = m.type == M_CKPT && tr.kind == TRIG_CKPT;
            break;
        case M_HOLD:
            out.held = true;
            fire = true;
            break;
        case M_DONE:
            out.done = true;
            break;
        case M_FAIL:
            ofail(o, "a child failed: %s", m.text);
            break;
        case M_FIRED:
            if (!out.nfired++)
                out.first_fired = m;
            for (size_t i = 0; i < 64 && keel_failpoint_name(i); i++)
                if (!strcmp(keel_failpoint_name(i), m.fp))
                    out.fired_mask |= 1ull << i;
            crash_fired |= !strcmp(m.fp_action, "crash");
            break;
        case M_FATAL:
            out.fatal = true;
            out.fatal_msg = m;
            break;
        default:
            ofail(o, "unknown message %u", m.type);
            break;
        }
        if (!out.killed && (fire || o->failed)) {
            kill(c->pid, SIGKILL);
            out.killed = true;
            o->kills += fire;
        }
    }
    int status = 0;
    if (waitpid(c->pid, &status, 0) != c->pid)
        ofail(o, "waitpid: %s", strerror(errno));
    close(c->rfd);
    close(c->hold_wfd);
    out.status = status;
    out.died = !out.killed && (p->may_die || crash_fired) && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!out.killed && !out.died && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        ofail(o, "a child ended with status 0x%x (signal %d, exit %d) before it was killed", status,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    if (out.killed && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        ofail(o, "a child exited with %d", WEXITSTATUS(status));
    if (out.done)
        o->min_durable = out.last_tick > o->min_durable ? out.last_tick : o->min_durable; /* clean close drains */
    if (out.done && out.recovered && out.rec.tick > o->min_durable)
        o->min_durable = out.rec.tick;
    o->slack = out.held ? 0 : 1;
    if (getenv("KEEL_CRASH_VERBOSE"))
        fprintf(stderr, "[%s] trigger %d/%" PRIu64 ": recovered %s tick %" PRIu64 " +%d transfers (checkpoint %" PRIu64
                ") -> ran to %" PRIu64 ", %" PRIu64 " acks, %s%s%s%s%s\n", o->scenario, (int)tr.kind, tr.n,
                out.recovered ? "" : "(not reached)", out.rec.tick, o->last_j, out.rec.aux, out.last_tick, out.acks,
                out.killed ? "killed" : out.died ? "died by its own SIGKILL" : out.fatal ? "latched fatal in " : "exited",
                crash_fired ? " at " : "", crash_fired ? out.first_fired.fp : "", out.held ? " (held)" : "",
                out.fatal ? out.fatal_msg.text : "");
    return out;
}

/* Run one child with plan p to its end (or its trigger). */
outcome run_child(oracle *o, const plan *p, trigger tr)
{
    if (o->failed)
        return (outcome){0};
    child c = child_start(p);
    return pump(o, &c, tr, p);
}

/* ---- scaffolding ------------------------------------------------------------------------------ */

void tmpdir_make(tmpdir *d)
{
    snprintf(d->base, sizeof d->base, "/tmp/keel-crash-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->base));
    snprintf(d->data, sizeof d->data, "%s/data", d->base);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void tmpdir_remove(tmpdir *d)
{
    if (getenv("KEEL_CRASH_KEEP")) /* debugging: keep the directory for keel-wal */
        fprintf(stderr, "kept %s\n", d->data);
    else
        nftw(d->base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

uint64_t rng_next(uint64_t *s)
{
    *s = mix(*s);
    return *s >> 11;
}

uint64_t rng_seed(uint64_t salt)
{
    const char *e = getenv("KEEL_CRASH_SEED");
    return mix((e ? strtoull(e, NULL, 0) : 20240601u) ^ salt);
}

plan base_plan(const char *dir, keel_durability mode, int64_t ckpt_every, uint64_t until)
{
    return (plan){.dir = dir, .mode = mode, .ckpt_every = ckpt_every, .workers = 2, .until = until};
}

/* Rounds of children on one directory, each killed at a chosen point; every
 * child checks the previous crash on its way up (RECOVERED) and the run it
 * continues (TICK). */
void crash_rounds(oracle *o, const char *dir, keel_durability mode, int64_t ckpt_every, int rounds,
                         uint64_t end, uint64_t salt, const int *kinds, int nkinds)
{
    uint64_t rng = rng_seed(salt);
    for (int r = 0; r < rounds && !o->failed; r++) {
        uint64_t cur = o->max_ran;
        if (cur + 3 >= end)
            break;
        trigger tr = {TRIG_NONE, 0};
        uint64_t ckpt_at = 0;
        int kind = kinds[rng_next(&rng) % (uint64_t)nkinds];
        switch (kind) {
        case 0: /* after n acknowledged transfers */
            tr = (trigger){TRIG_ACKS, 1 + rng_next(&rng) % 24};
            break;
        case 1: { /* right after a tick that took a checkpoint */
            uint64_t every = ckpt_every > 0 ? (uint64_t)ckpt_every : 7;
            uint64_t t = cur + 1 + rng_next(&rng) % 10;
            t += (every - t % every) % every;
            tr = (trigger){TRIG_TICK, t};
            break;
        }
        case 2: /* after a random tick */
            tr = (trigger){TRIG_TICK, cur + 1 + rng_next(&rng) % 12};
            break;
        case 3: /* right after recovery, before any tick */
            tr = (trigger){TRIG_RECOVERED, 0};
            break;
        case 4: /* while recovering */
            tr = (trigger){TRIG_STARTED, 0};
            break;
        case 5: /* early: a few transfers into the first tick after the open */
            tr = (trigger){TRIG_ACKS, 1 + rng_next(&rng) % 3};
            break;
        case 6: /* right after keel_checkpoint returned (the next tick is running) */
        case 7: /* during keel_checkpoint: killed when the tick before the call is reported */
            ckpt_at = cur + 2 + rng_next(&rng) % 8;
            tr = (trigger){kind == 6 ? TRIG_CKPT : TRIG_TICK, ckpt_at};
            break;
        }
        if (tr.kind == TRIG_TICK && tr.n >= end)
            tr.n = end - 1;
        if (ckpt_at >= end)
            ckpt_at = end - 1;
        plan p = base_plan(dir, mode, ckpt_every, end);
        p.checkpoint_at = ckpt_at;
        p.workers = 1 + (int32_t)(r & 1);             /* the worker count changes across restarts */
        p.map_size = (r & 2) ? 256u << 10 : 0;       /* a small map: it grows (MDB_MAP_FULL) while running */
        p.async_bank = r % 3 == 2;                   /* acknowledgements by tickets of async commits */
        p.wal_retain = r % 5 == 4;                   /* checkpoints that keep the WAL they cover */
        run_child(o, &p, tr);
    }
}

/* Run to the end without a kill, then reopen: the end state, recovered exactly. */
void finish(oracle *o, const char *dir, keel_durability mode, int64_t ckpt_every, uint64_t end)
{
    plan p = base_plan(dir, mode, ckpt_every, end);
    outcome out = run_child(o, &p, (trigger){TRIG_NONE, 0});
    if (o->failed)
        return;
    uint64_t last = out.last_tick ? out.last_tick : out.rec.tick;
    if (!out.done || last != end)
        ofail(o, "the final run ended at tick %" PRIu64 " (done %d), expected %" PRIu64, last, out.done, end);
    out = run_child(o, &p, (trigger){TRIG_NONE, 0}); /* a clean reopen */
    if (!o->failed && (out.rec.tick != end || out.rec.hash != o->ref->hash[end] || out.last_tick))
        ofail(o, "reopening after a clean close at tick %" PRIu64 " recovered tick %" PRIu64 " hash %016" PRIx64
              " (reference %016" PRIx64 ")", end, out.rec.tick, out.rec.hash, o->ref->hash[end]);
}

void oracle_assert(oracle *o, tmpdir *d)
{
    tmpdir_remove(d);
    ck_assert_msg(!o->failed, "%s (kills %u, recoveries %u, of which %u mid-tick with durable transfers, %u from a "
                  "checkpoint; seed env KEEL_CRASH_SEED)", o->fail, o->kills, o->recoveries, o->prefix_recoveries,
                  o->ckpt_recoveries);
}

refdata *scenario_begin(tmpdir *d, oracle *o, const char *scenario)
{
    refdata *ref = reference_run();
    tmpdir_make(d);
    oracle_init(o, ref, scenario);
    return ref;
}

void scenario_end(oracle *o, tmpdir *d, refdata *ref)
{
    oracle_assert(o, d);
    munmap(ref, sizeof *ref);
}
