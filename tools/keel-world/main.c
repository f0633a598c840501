/*
 * keel-world -- the demo world server: agents that move over a bounded
 * plane, lose energy, get hungry, eat, die and are replaced, all driven by a
 * seeded generator so the same arguments end in the same state hash on any
 * number of workers.
 *
 * An agent acts on one tick in ten (its turn: (index + tick) % 10 == 0),
 * so about 10% of the durable rows change per tick, as in SPEC §10's
 * demo-like workload. The schedule (Public track, DAG "world"):
 *   phase 0  movement    parallel query {pos, vel}: on its turn an agent
 *                        moves ten ticks' worth, bouncing off the edges
 *            metabolism  parallel query {energy} without {hungry}: energy
 *                        -= 10 on its turn; death at 0; the `hungry` tag
 *                        below the hunger line
 *   phase 1  foraging    parallel query {energy, hungry}: the same, plus a
 *                        seeded chance to eat (energy up, tag removed)
 *   phase 2  births      callback: spawns replace the tick's dead, plus noise
 * DAG "economy":
 *            market      callback: seeded trades between players, each an
 *                        IMMEDIATE side transaction over two VERSIONED
 *                        wallets (read both, check funds, write both) and
 *                        the players' ledgers (the id of the last trade
 *                        each took part in). The ledger makes a trade
 *                        idempotent: after a crash the tick that ran it
 *                        may run again (its side transactions were durable,
 *                        the tick was not), and a trade already applied is
 *                        recognised and skipped, so a restarted run ends
 *                        with the uninterrupted run's hash.
 * With --data (default ./keel-data) the world is durable: a restart
 * recovers it and continues to --until-tick.
 * metabolism and foraging write `energy` (phase order puts foraging after),
 * both produce the event "death" that births consumes. Randomness is a pure
 * function of (seed, tick, entity), so it does not depend on which worker
 * visits a row or in which order. Structural changes are recorded and
 * applied at the sync point.
 */
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"

typedef struct vec3 {
    float x, y, z;
} vec3;

typedef struct options {
    uint64_t seed;
    uint32_t entities;
    uint64_t until_tick;
    int32_t workers;
    double tick_rate;
    const char *trace;
    const char *data;
    bool memory;                /* --memory: no data directory */
    bool until_given;
    keel_durability durability;
    int64_t checkpoint_every;
    uint64_t live_trades;
    int quiet;
} options;

typedef struct world_app {
    keel_runtime *rt;
    keel_world *w;
    keel_component pos, vel, energy, hungry, wallet, ledger;
    keel_query *players;
    uint64_t seed;
    uint64_t trades, refused;
    uint64_t start_tick;        /* the tick the run started at (recovered) */   /* market: committed trades, trades refused for lack of funds */
    /* --live-trades: a "network" thread submitting trades with keel_submit */
    keel_entity who[64];
    uint32_t nwho;
    uint64_t live_rate;
    _Atomic bool live_stop;
    _Atomic uint64_t live_done, live_failed;
    _Atomic uint32_t deaths;    /* this tick's deaths, summed over tasks */
} world_app;

#define PLANE 1000.0f
#define HUNGER_LINE 200u
#define PLAYERS 64u
#define START_COINS 1000
#define TRADES_PER_TICK 8u
#define TURN 10u                /* an agent acts every TURN ticks */

/* splitmix64 finaliser: the same on every platform. */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A random word that depends only on (seed, tick, key). */
static uint64_t chance(const world_app *app, uint64_t tick, uint64_t key)
{
    return mix(app->seed ^ mix(tick ^ mix(key)));
}

static float unit_float(uint64_t r)
{
    return (float)(r >> 40) / (float)(1u << 24);
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: keel-world [--data DIR | --memory] [--seed S] [--entities N] [--until-tick N]\n"
            "                  [--workers N] [--tick-rate HZ] [--durability MODE]\n"
            "                  [--checkpoint-every N] [--trace FILE] [--quiet]\n"
            "  --data DIR      data directory (default ./keel-data): the world is recovered\n"
            "                  from it at start and written to it as it runs\n"
            "  --memory        no data directory: the world lives in memory only\n"
            "  --seed S        seed of the world's generator (default 1)\n"
            "  --entities N    agents of a new world (default 100000)\n"
            "  --until-tick N  run until the world's tick counter reaches N (absolute, so a\n"
            "                  restarted run stops at the same tick); default: 600 more ticks\n"
            "  --durability M  immediate|group|deferred: when a tick counts as durable\n"
            "                  (default group; trades are always immediate)\n"
            "  --checkpoint-every N  checkpoint every N ticks (default 600)\n"
            "  --workers N     threads running systems, -1 = one per CPU (default -1)\n"
            "  --tick-rate HZ  ticks per second, 0 = as fast as they run (default 60)\n"
            "  --trace FILE    write a Chrome trace-event JSON of the last ticks at exit\n"

            "  --live-trades R a network-like thread also submits R trades/s (keel_submit,\n"
            "                  IMMEDIATE); the run is then no longer a function of the seed\n"
            "  --quiet         no periodic status lines; the recovery and final lines always print\n"
            "A restart prints `recovered tick=<T> in <ms> ms`; the last line is\n"
            "`final tick=<N> hash=<16 hex digits>`.\n");
}

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v > max || s[0] == '-') {
        fprintf(stderr, "keel-world: %s needs a number in [0, %" PRIu64 "], got '%s'\n", flag, max, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.seed = 1, .entities = 100000, .until_tick = 600, .workers = -1, .tick_rate = 60,
                   .data = "keel-data", .checkpoint_every = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "--memory")) {
            o->memory = true;
        } else if (!strcmp(a, "--durability")) {
            static const char *const modes[] = {"immediate", "group", "deferred"};
            o->durability = KEEL_DURABLE_DEFAULT;
            for (int m = 0; m < 3; m++)
                if (v && !strcmp(v, modes[m]))
                    o->durability = (keel_durability)(m + 1);
            if (!o->durability) {
                fprintf(stderr, "keel-world: --durability needs immediate, group or deferred, got '%s'\n", v ? v : "");
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--checkpoint-every")) {
            if (parse_u64(a, v, INT64_MAX, &n))
                return -1;
            o->checkpoint_every = n ? (int64_t)n : -1;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(a, v, UINT64_MAX, &o->seed))
                return -1;
            i++;
        } else if (!strcmp(a, "--live-trades")) {
            if (parse_u64(a, v, 1000000, &o->live_trades))
                return -1;
            i++;
        } else if (!strcmp(a, "--entities")) {
            if (parse_u64(a, v, 50000000, &n))
                return -1;
            o->entities = (uint32_t)n;
            i++;
        } else if (!strcmp(a, "--until-tick")) {
            if (parse_u64(a, v, UINT64_MAX, &o->until_tick))
                return -1;
            o->until_given = true;
            i++;
        } else if (!strcmp(a, "--workers")) {
            if (v && !strcmp(v, "-1")) {
                o->workers = -1;
            } else {
                if (parse_u64(a, v, 64, &n) || n == 0) {
                    fprintf(stderr, "keel-world: --workers needs -1 or a number in [1, 64]\n");
                    return -1;
                }
                o->workers = (int32_t)n;
            }
            i++;
        } else if (!strcmp(a, "--tick-rate")) {
            if (parse_u64(a, v, 100000, &n))
                return -1;
            o->tick_rate = (double)n;
            i++;
        } else if (!strcmp(a, "--data") || !strcmp(a, "--trace")) {
            if (!v || !*v) {
                fprintf(stderr, "keel-world: %s needs a path\n", a);
                return -1;
            }
            *(a[2] == 'd' ? &o->data : &o->trace) = v;
            i++;
        } else {
            fprintf(stderr, "keel-world: unknown argument '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "keel-world: %s: %s: %s\n", what, keel_strerror(rc), keel_last_error());
    return rc;
}

static int register_components(world_app *app)
{
    static const keel_field vec_fields[] = {
        {.name = "x", .type = KEEL_F32, .offset = 0},
        {.name = "y", .type = KEEL_F32, .offset = 4},
        {.name = "z", .type = KEEL_F32, .offset = 8},
    };
    static const keel_field energy_fields[] = {{.name = "value", .type = KEEL_U32}};
    int rc = keel_component_register(app->w, &(keel_component_desc){.name = "pos", .size = sizeof(vec3),
                                                                    .fields = vec_fields, .field_count = 3}, &app->pos);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "vel", .size = sizeof(vec3),
                                                                    .fields = vec_fields, .field_count = 3}, &app->vel);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "energy", .size = 4,
                                                                    .fields = energy_fields, .field_count = 1},
                                     &app->energy);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "hungry"}, &app->hungry);
    static const keel_field wallet_fields[] = {{.name = "coins", .type = KEEL_I64}};
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "wallet", .size = 8,
                                                                    .fields = wallet_fields, .field_count = 1},
                                     &app->wallet);
    static const keel_field ledger_fields[] = {{.name = "last_trade", .type = KEEL_U64}};
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "ledger", .size = 8,
                                                                    .fields = ledger_fields, .field_count = 1},
                                     &app->ledger);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->wallet}}, &app->players);
    return check(rc, "registering components");
}

/* Record the spawn of agent number `key` of tick `tick`. */
static int spawn_agent(const world_app *app, keel_cmdbuf *cmds, uint64_t tick, uint64_t key)
{
    uint64_t r = chance(app, tick, key ^ 0x5bd1e995ull);
    vec3 p = {unit_float(r) * PLANE, unit_float(mix(r)) * PLANE, 0};
    vec3 v = {unit_float(mix(r + 1)) * 10 - 5, unit_float(mix(r + 2)) * 10 - 5, 0};
    uint32_t e = 300 + (uint32_t)(mix(r + 3) % 900);
    keel_init init[] = {{app->pos, &p}, {app->vel, &v}, {app->energy, &e}};
    return keel_cmd_spawn(cmds, init, 3);
}

static float bounce(float *p, float v)
{
    if (*p < 0) {
        *p = -*p;
        return -v;
    }
    if (*p > PLANE) {
        *p = 2 * PLANE - *p;
        return -v;
    }
    return v;
}

/* An agent's turn comes every TURN ticks, staggered by its slot index. */
static bool my_turn(keel_entity e, uint64_t tick)
{
    return (KEEL_ENTITY_INDEX(e) + tick) % TURN == 0;
}

static int movement(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    float dt = keel_ctx_dt(ctx) * TURN;
    uint64_t tick = keel_ctx_tick(ctx);
    vec3 *p = KEEL_COLUMN(it, vec3, 0), *v = KEEL_COLUMN(it, vec3, 1);
    for (uint32_t i = 0; i < it->count; i++) {
        if (!my_turn(it->entities[i], tick))
            continue;
        p[i].x += v[i].x * dt;
        p[i].y += v[i].y * dt;
        v[i].x = bounce(&p[i].x, v[i].x);
        v[i].y = bounce(&p[i].y, v[i].y);
    }
    return 0;
}

/* Energy, hunger and death for one chunk. Well-fed agents (metabolism)
 * become hungry below the hunger line; hungry ones (foraging) may eat. */
static int live(keel_ctx *ctx, const keel_iter *it, world_app *app, bool hungry)
{
    keel_cmdbuf *cmds = keel_ctx_commands(ctx);
    uint64_t tick = keel_ctx_tick(ctx);
    uint32_t *e = KEEL_COLUMN(it, uint32_t, 0), deaths = 0;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < it->count; i++) {
        keel_entity agent = it->entities[i];
        if (!my_turn(agent, tick))
            continue;
        e[i] = e[i] > TURN ? e[i] - TURN : 0;
        if (e[i] == 0) {
            rc = keel_cmd_destroy(cmds, agent);
            deaths++;
        } else if (!hungry && e[i] < HUNGER_LINE) {
            rc = keel_cmd_add(cmds, agent, app->hungry, NULL);
        } else if (hungry && chance(app, tick, agent) % 8 == 0) {
            e[i] += 400;
            rc = keel_cmd_remove(cmds, agent, app->hungry);
        }
    }
    atomic_fetch_add(&app->deaths, deaths);
    return rc;
}

static int metabolism(keel_ctx *ctx, const keel_iter *it, void *user)
{
    return live(ctx, it, user, false);
}

static int foraging(keel_ctx *ctx, const keel_iter *it, void *user)
{
    return live(ctx, it, user, true);
}

static int births(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    uint64_t tick = keel_ctx_tick(ctx);
    uint32_t n = atomic_exchange(&app->deaths, 0) + (uint32_t)(chance(app, tick, 0) % 5);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = spawn_agent(app, keel_ctx_commands(ctx), tick, i);
    return rc;
}

/* One trade, number `id` (increasing over the run): `buyer` pays `price`
 * to `seller` if it can, atomically. A trade whose id a ledger already
 * holds was decided before a crash: skip it (see the top comment). A
 * refusal is recorded in the ledgers too: re-run after a crash, the trade
 * would otherwise be judged against balances that later trades of the
 * same tick (already durable) changed. */
static int trade(keel_ctx *ctx, world_app *app, uint64_t id, keel_entity buyer, keel_entity seller, int64_t price,
                 keel_ticket **done)
{
    keel_side_txn *tx = NULL;
    int64_t a, b;
    uint64_t la, lb;
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx);
    if (rc)
        return rc;
    if ((rc = keel_side_get(tx, buyer, app->wallet, &a)) || (rc = keel_side_get(tx, seller, app->wallet, &b)) ||
        (rc = keel_side_get(tx, buyer, app->ledger, &la)) || (rc = keel_side_get(tx, seller, app->ledger, &lb)) ||
        la >= id || lb >= id) {
        keel_side_txn_abort(tx);
        return rc;
    }
    bool pay = a >= price;
    app->refused += !pay;
    a -= pay ? price : 0;
    b += pay ? price : 0;
    if ((rc = keel_side_set(tx, buyer, app->wallet, &a)) || (rc = keel_side_set(tx, seller, app->wallet, &b)) ||
        (rc = keel_side_set(tx, buyer, app->ledger, &id)) || (rc = keel_side_set(tx, seller, app->ledger, &id))) {
        keel_side_txn_abort(tx);
        return rc;
    }
    /* committed now; durable (IMMEDIATE) when the ticket completes: the
     * market waits for all its tickets at once, so one sync covers them */
    rc = keel_side_txn_commit_async(tx, done);
    app->trades += !rc && pay;
    return rc;
}

/* The market: trades between players, generated from (seed, tick). Player
 * rows do not move (players are never destroyed), so their order, and with
 * it every trade, is a function of the seed. */
static int market(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    keel_entity who[PLAYERS];
    uint32_t n = 0;
    keel_iter it;
    keel_txn_iter(ctx, app->players, &it);
    while (keel_txn_next(ctx, &it))
        for (uint32_t i = 0; i < it.count && n < PLAYERS; i++)
            who[n++] = it.entities[i];
    uint64_t tick = keel_ctx_tick(ctx);
    int rc = 0;
    keel_ticket *done[TRADES_PER_TICK] = {0};
    for (uint32_t k = 0; !rc && n >= 2 && k < TRADES_PER_TICK; k++) {
        uint64_t r = chance(app, tick, 0x7472616465ull + k);
        uint32_t i = (uint32_t)(r % n), j = (uint32_t)((r >> 20) % (n - 1));
        j += j >= i; /* two different players */
        rc = trade(ctx, app, tick * TRADES_PER_TICK + k + 1, who[i], who[j], (int64_t)(1 + (r >> 40) % 200), &done[k]);
    }
    /* the players hear "done" here: every trade of the tick is on disk */
    for (uint32_t k = 0; k < TRADES_PER_TICK; k++) {
        int w = done[k] ? keel_ticket_wait(done[k], -1) : 0;
        keel_ticket_release(done[k]);
        rc = rc ? rc : w;
    }
    return rc;
}

/* A trade submitted from the network thread: runs at the next tick start
 * in its own side transaction. */
typedef struct live_trade {
    world_app *app;
    keel_entity buyer, seller;
    int64_t price;
} live_trade;

static int live_trade_fn(keel_side_txn *tx, void *arg)
{
    const live_trade *t = arg;
    int64_t a, b;
    int rc = keel_side_get(tx, t->buyer, t->app->wallet, &a);
    if (!rc)
        rc = keel_side_get(tx, t->seller, t->app->wallet, &b);
    if (rc || a < t->price)
        return rc ? rc : 1; /* 1: refused, insufficient funds (nothing applied) */
    a -= t->price;
    b += t->price;
    rc = keel_side_set(tx, t->buyer, t->app->wallet, &a);
    return rc ? rc : keel_side_set(tx, t->seller, t->app->wallet, &b);
}

/* Submit batches of trades, wait for each batch's tickets (the player hears
 * "done" only once the trade is durable per IMMEDIATE), pace to the rate. */
static void *live_thread(void *arg)
{
    world_app *app = arg;
    enum { BATCH = 64 };
    live_trade t[BATCH];
    keel_ticket *tk[BATCH];
    uint64_t k = 0;
    double per_batch_ns = 1e9 * BATCH / (double)app->live_rate;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!atomic_load(&app->live_stop)) {
        uint32_t n = 0;
        for (; n < BATCH; n++, k++) {
            uint64_t r = mix(k ^ 0x6c697665ull);
            uint32_t i = (uint32_t)(r % app->nwho), j = (uint32_t)((r >> 20) % (app->nwho - 1));
            j += j >= i;
            t[n] = (live_trade){app, app->who[i], app->who[j], (int64_t)(1 + (r >> 40) % 100)};
            if (keel_submit(app->rt, live_trade_fn, &t[n], KEEL_DURABLE_IMMEDIATE, &tk[n]))
                break;
        }
        for (uint32_t q = 0; q < n; q++) {
            int rc = keel_ticket_wait(tk[q], -1);
            atomic_fetch_add(rc == 0 ? &app->live_done : &app->live_failed, 1);
            keel_ticket_release(tk[q]);
        }
        uint64_t ns = (uint64_t)next.tv_nsec + (uint64_t)per_batch_ns;
        next.tv_sec += (time_t)(ns / 1000000000u);
        next.tv_nsec = (long)(ns % 1000000000u);
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    return NULL;
}

static int add_systems(world_app *app, keel_schedule *s)
{
    keel_system_desc sys[] = {
        {.name = "movement", .dag = "world", .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = movement,
         .query = {.with = {app->pos, app->vel}}, .parallel = true, .user = app,
         .access = {.writes = {app->pos, app->vel}}},
        {.name = "metabolism", .dag = "world", .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = metabolism,
         .query = {.with = {app->energy}, .without = {app->hungry}}, .parallel = true, .user = app,
         .access = {.writes = {app->energy}, .events_produce = {"death"}}},
        {.name = "foraging", .dag = "world", .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = foraging,
         .query = {.with = {app->energy, app->hungry}}, .parallel = true, .user = app,
         .access = {.writes = {app->energy}, .events_produce = {"death"}}},
        {.name = "births", .dag = "world", .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = births, .user = app,
         .access = {.events_consume = {"death"}}},
        {.name = "market", .dag = "economy", .kind = KEEL_SYSTEM_CALLBACK, .run = market, .user = app,
         .access = {.side_writes = {app->wallet, app->ledger}}},
    };
    int rc = 0;
    for (size_t i = 0; !rc && i < sizeof sys / sizeof sys[0]; i++)
        rc = keel_schedule_add_system(s, &sys[i], NULL);
    if (!rc && (rc = keel_schedule_build(s)))
        for (uint32_t i = 0; i < keel_schedule_diag_count(s); i++)
            fprintf(stderr, "keel-world: schedule: %s: %s\n", keel_sched_code_name(keel_schedule_diag(s, i)->code),
                    keel_schedule_diag(s, i)->message);
    return check(rc, "building the schedule");
}

/* The initial population, spawned by the on_first_tick hook. */
static uint32_t initial_entities;

static int populate(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    int rc = 0;
    if (keel_world_count(keel_ctx_world(ctx)))
        return 0; /* a recovered world: nothing to create */
    for (uint32_t i = 0; !rc && i < initial_entities; i++)
        rc = spawn_agent(app, keel_ctx_commands(ctx), 0, i);
    int64_t coins = START_COINS;
    uint64_t none = 0;
    for (uint32_t i = 0; !rc && i < PLAYERS; i++)
        rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{app->wallet, &coins}, {app->ledger, &none}}, 2);
    return rc;
}

static int setup(world_app *app, keel_schedule **sched, const options *o)
{
    app->seed = o->seed;
    initial_entities = o->entities;
    keel_runtime_desc desc = {
        .workers = o->workers,
        .tick_rate_hz = o->tick_rate > 0 ? o->tick_rate : -1,
        .on_first_tick = populate,
        .hook_user = app,
        .durability = o->durability,
        .durable = {.dir = o->memory ? NULL : o->data, .checkpoint_every_ticks = o->checkpoint_every},
    };
    if (check(keel_runtime_create(&desc, &app->rt), "creating the runtime"))
        return -1;
    app->w = keel_runtime_world(app->rt);
    if (register_components(app) || check(keel_schedule_create(app->rt, sched), "creating the schedule") ||
        add_systems(app, *sched))
        return -1;
    if (check(keel_runtime_set_schedule(app->rt, *sched), "installing the schedule"))
        return -1;
    if (o->memory)
        return 0;
    keel_recovery r;
    if (check(keel_runtime_recover(app->rt, &r), "opening the data directory"))
        return -1;
    if (!r.fresh) /* printed under --quiet too: scripts look for it */
        printf("recovered tick=%" PRIu64 " in %.1f ms (checkpoint tick %" PRIu64 ", %" PRIu64 " WAL records, "
               "%" PRIu64 " side transactions)\n",
               r.tick, (double)r.ns / 1e6, r.checkpoint_tick, r.records, r.side_txns);
    fflush(stdout);
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Total coins, read through a read view of the last completed tick (as a
 * network thread would): constant, since trades only move coins. */
static int64_t money(const world_app *app)
{
    const keel_view *v;
    if (keel_read_begin(app->rt, &v))
        return -1;
    int64_t sum = 0;
    keel_iter it;
    keel_query_iter(app->players, &it);
    while (keel_iter_next(&it))
        for (uint32_t i = 0; i < it.count; i++) {
            int64_t c = 0;
            if (!keel_view_get(v, it.entities[i], app->wallet, &c))
                sum += c;
        }
    keel_read_end(v);
    return sum;
}

static void status_line(const world_app *app, uint64_t tick, double t0)
{
    keel_tick_record rec;
    if (keel_telemetry_tick(app->rt, tick, &rec))
        return;
    keel_runtime_stats st;
    keel_runtime_stats_get(app->rt, &st);
    printf("tick=%" PRIu64 " tps=%.1f entities=%u tick_ms=%.3f sync_ms=%.3f workers=%u trades=%" PRIu64
           " money=%" PRId64 " wal_mb=%.1f wal_ratio=%.2f durable_lag=%" PRIu64 "\n",
           tick, (double)(tick - app->start_tick) * 1e3 / (now_ms() - t0), rec.entities, (double)rec.actual_ns / 1e6,
           (double)rec.sync_ns / 1e6, keel_runtime_workers(app->rt), app->trades, money(app),
           (double)st.wal_bytes / 1e6, rec.wal_stored_bytes ? (double)rec.wal_raw_bytes / (double)rec.wal_stored_bytes : 0,
           rec.durable_lag);
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    world_app app = {0};
    keel_schedule *sched = NULL;
    int status = setup(&app, &sched, &o) ? 1 : 0;
    if (!status && !o.until_given)
        o.until_tick = keel_runtime_tick(app.rt) + 600;
    app.start_tick = status ? 0 : keel_runtime_tick(app.rt);
    double t0 = now_ms();
    uint64_t status_every = o.tick_rate > 0 ? (uint64_t)o.tick_rate : 100;
    pthread_t live;
    bool live_on = false;
    if (!status && o.live_trades) {
        /* the players exist after the first tick */
        status = check(keel_runtime_step(app.rt), "running the first tick") ? 1 : 0;
        keel_iter it;
        keel_query_iter(app.players, &it);
        while (!status && keel_iter_next(&it))
            for (uint32_t i = 0; i < it.count && app.nwho < PLAYERS; i++)
                app.who[app.nwho++] = it.entities[i];
        app.live_rate = o.live_trades;
        live_on = !status && app.nwho >= 2 && pthread_create(&live, NULL, live_thread, &app) == 0;
    }
    while (!status && keel_runtime_tick(app.rt) < o.until_tick) {
        uint64_t left = o.until_tick - keel_runtime_tick(app.rt);
        status = check(keel_runtime_run(app.rt, left < status_every ? left : status_every), "running ticks") ? 1 : 0;
        if (!status && !o.quiet)
            status_line(&app, keel_runtime_tick(app.rt), t0);
    }
    if (live_on) {
        atomic_store(&app.live_stop, true);
        /* the thread may wait on the tickets of its last batch: tick until it ends */
        while (pthread_tryjoin_np(live, NULL) != 0)
            if (keel_runtime_step(app.rt) && !status)
                status = check(-1, "running ticks while the trade thread finishes") ? 1 : 0;
        if (!o.quiet)
            printf("live trades: %" PRIu64 " done, %" PRIu64 " refused or failed\n", atomic_load(&app.live_done),
                   atomic_load(&app.live_failed));
    }
    if (!status && money(&app) != (int64_t)PLAYERS * START_COINS) {
        fprintf(stderr, "keel-world: economy broken: %" PRId64 " coins, expected %" PRId64 "\n", money(&app),
                (int64_t)PLAYERS * START_COINS);
        status = 1;
    }
    if (!status && o.trace)
        status = check(keel_trace_export(app.rt, o.trace), "writing the trace") ? 1 : 0;
    if (!status)
        printf("final tick=%" PRIu64 " hash=%016" PRIx64 "\n", keel_runtime_tick(app.rt), keel_world_hash(app.w));
    keel_schedule_destroy(sched); /* a no-op once installed: the runtime owns it */
    keel_query_destroy(app.players);
    keel_runtime_close(app.rt);
    return status;
}
