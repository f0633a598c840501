/*
 * keel-world/world.c -- the demo world: agents that move over a bounded
 * plane, lose energy, get hungry, eat, die and are replaced; players and
 * merchants who trade coins and items. Every decision is a pure function of
 * (seed, tick, entity or trade number), so the same arguments end in the
 * same state hash on any number of workers, and after any crash.
 *
 * An agent acts on one tick in ten (its turn: (index + tick) % 10 == 0),
 * so about 10% of the durable rows change per tick: the demo-like
 * workload of docs/performance.md. The schedule (Public track):
 *   market      exclusive, first: TRADES_PER_TICK seeded trades, each an
 *               IMMEDIATE side transaction over two accounts (wallet,
 *               ledger, inventory), committed with commit_async
 *   settle      after market, beside the world: acknowledges ("done" for
 *               the player) each trade whose ticket has completed, i.e.
 *               that is on disk, in trade order; the others in a later
 *               tick (it does not hold a worker on the disk)
 *   phase 0  movement    parallel query {pos, vel, grid_cell}: on its turn an
 *                        agent moves ten ticks' worth, bouncing off the
 *                        edges, and files itself in its grid cell
 *            metabolism  parallel query {energy} without {hungry}: energy
 *                        -= 10 on its turn; death at 0; the `hungry` tag
 *                        below the hunger line
 *   phase 1  foraging    parallel query {energy, hungry, grid_cell}: the
 *                        same, plus a chance to eat that depends on the
 *                        fertility of the agent's grid cell
 *   phase 2  births      callback: spawns replace the tick's dead, plus noise
 *            census      LOW priority, every 30th tick: agents per grid cell
 *                        for the status line's busiest cell
 *
 * Overload (docs/overload.md): market and settle are CRITICAL, the world's
 * systems HIGH, so throttling never skips them and the world stays a pure
 * function of (seed, tick) on a loaded machine; only census, which writes
 * nothing durable, is LOW and the first to be skipped. World time is a fixed
 * 1/60 s per tick (TICK_SECONDS), not the modulated keel_ctx_dt.
 *
 * grid_cell is TRANSIENT: it is never logged, comes back as zeros after a
 * restart, and on_first_tick rebuilds it from pos. movement checks every
 * cell it reads against pos (grid_mismatches must stay 0) and foraging's
 * outcome depends on it, so a restart that did not rebuild it would diverge.
 *
 * Trades (k = 0..7 of tick T, id = T * TRADES_PER_TICK + k + 1) are a
 * transfer between two players, a player buying an item from a merchant, or
 * a player selling one to a merchant. A trade reads both accounts, decides
 * (funds, stock, a free slot), and writes both accounts with their ledgers
 * set to its id, also when it is refused. The ledger makes a trade
 * idempotent: after a crash, the tick that ran it may run again (its side
 * transactions were durable, the tick was not), and a trade whose id a
 * ledger already holds is skipped, so a restarted run ends with the
 * uninterrupted run's hash. Coins and items only move: total money and the
 * item count are constant and no item is in two inventories.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "world.h"

#define PLANE 1000.0f
#define HUNGER_LINE 200u
#define TURN 10u   /* an agent acts every TURN ticks */
#define GRID 16u   /* the plane is GRID x GRID cells */
/* World time per tick. Not keel_ctx_dt: that follows the tick rate and the
 * overload detector's tick-rate modulation, and the world must stay a pure
 * function of (seed, tick) whatever the rate or the machine's load. */
#define TICK_SECONDS (1.0f / 60.0f)

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

static uint32_t cell_of(const vec3 *p)
{
    uint32_t cx = (uint32_t)(p->x * GRID / PLANE), cy = (uint32_t)(p->y * GRID / PLANE);
    cx = cx < GRID ? cx : GRID - 1;
    cy = cy < GRID ? cy : GRID - 1;
    return cy * GRID + cx + 1; /* 0 is "no cell": what a restart leaves */
}

/* Food grows in a cell for 100 ticks out of 300, at a seeded phase. */
static bool fertile(const world_app *app, uint32_t cell, uint64_t tick)
{
    return (tick + chance(app, 0, cell) % 300) % 300 < 100;
}

int64_t world_start_money(void)
{
    return (int64_t)PLAYERS * PLAYER_COINS + (int64_t)MERCHANTS * MERCHANT_COINS;
}

uint32_t world_start_items(void)
{
    return MERCHANTS * ITEMS_PER_MERCHANT;
}

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "keel-world: %s: %s: %s\n", what, keel_strerror(rc), keel_last_error());
    return rc;
}

/* ---- components -------------------------------------------------------- */

static int reg(world_app *app, const keel_component_desc *d, keel_component *out)
{
    (void)app;
    return keel_component_register(app->w, d, out);
}

int world_register(world_app *app)
{
    static const keel_field vec_fields[] = {
        {.name = "x", .type = KEEL_F32, .offset = 0},
        {.name = "y", .type = KEEL_F32, .offset = 4},
        {.name = "z", .type = KEEL_F32, .offset = 8},
    };
    static const keel_field energy_fields[] = {{.name = "value", .type = KEEL_U32}};
    static const keel_field wallet_fields[] = {{.name = "coins", .type = KEEL_I64}};
    static const keel_field ledger_fields[] = {{.name = "last_trade", .type = KEEL_U64}};
    static const keel_field inv_fields[] = {{.name = "item", .type = KEEL_U32, .count = INV_SLOTS}};
    static const keel_field cell_fields[] = {{.name = "cell", .type = KEEL_U32}};
    int rc = reg(app, &(keel_component_desc){.name = "pos", .size = sizeof(vec3), .fields = vec_fields,
                                             .field_count = 3}, &app->pos);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "vel", .size = sizeof(vec3), .fields = vec_fields,
                                             .field_count = 3}, &app->vel);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "energy", .size = 4, .fields = energy_fields,
                                             .field_count = 1}, &app->energy);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "hungry"}, &app->hungry);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "wallet", .size = 8, .fields = wallet_fields,
                                             .field_count = 1}, &app->wallet);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "ledger", .size = 8, .fields = ledger_fields,
                                             .field_count = 1}, &app->ledger);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "inventory", .size = 4 * INV_SLOTS, .fields = inv_fields,
                                             .field_count = 1}, &app->inventory);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "merchant"}, &app->merchant);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = "grid_cell", .size = 4, .fields = cell_fields,
                                             .field_count = 1, .discipline = KEEL_TRANSIENT}, &app->grid_cell);
    /* Last, the world's parameters as the name of a tag no entity carries: the schema holds them, and every
     * node of a replicated world must register the stored schema, so a standby, a read replica or a primary
     * on an empty directory given other ones is refused at open, naming both, instead of mixing two worlds
     * (a local directory checks them against world.params before that). */
    char params[KEEL_NAME_MAX + 1];
    keel_component params_tag;
    snprintf(params, sizeof params, "world seed=%" PRIu64 " entities=%u", app->seed, app->initial_entities);
    if (!rc)
        rc = reg(app, &(keel_component_desc){.name = params}, &params_tag);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->wallet}, .without = {app->merchant}},
                               &app->players);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->wallet, app->merchant}}, &app->merchants);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->pos, app->grid_cell}}, &app->agents);
    return check(rc, "registering components");
}

/* ---- the agents -------------------------------------------------------- */

/* Record the spawn of agent number `key` of tick `tick`. */
static int spawn_agent(const world_app *app, keel_cmdbuf *cmds, uint64_t tick, uint64_t key)
{
    uint64_t r = chance(app, tick, key ^ 0x5bd1e995ull);
    vec3 p = {unit_float(r) * PLANE, unit_float(mix(r)) * PLANE, 0};
    vec3 v = {unit_float(mix(r + 1)) * 10 - 5, unit_float(mix(r + 2)) * 10 - 5, 0};
    uint32_t e = 300 + (uint32_t)(mix(r + 3) % 900), cell = cell_of(&p);
    keel_init init[] = {{app->pos, &p}, {app->vel, &v}, {app->energy, &e}, {app->grid_cell, &cell}};
    return keel_cmd_spawn(cmds, init, 4);
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
    world_app *app = user;
    float dt = TICK_SECONDS * TURN;
    uint64_t tick = keel_ctx_tick(ctx), stale = 0;
    vec3 *p = KEEL_COLUMN(it, vec3, 0), *v = KEEL_COLUMN(it, vec3, 1);
    uint32_t *cell = KEEL_COLUMN(it, uint32_t, 2);
    for (uint32_t i = 0; i < it->count; i++) {
        if (!my_turn(it->entities[i], tick))
            continue;
        stale += cell[i] != cell_of(&p[i]);
        p[i].x += v[i].x * dt;
        p[i].y += v[i].y * dt;
        v[i].x = bounce(&p[i].x, v[i].x);
        v[i].y = bounce(&p[i].y, v[i].y);
        cell[i] = cell_of(&p[i]);
    }
    if (stale)
        atomic_fetch_add(&app->grid_mismatches, stale);
    return 0;
}

/* Energy, hunger and death for one chunk. Well-fed agents (metabolism)
 * become hungry below the hunger line; hungry ones (foraging) may eat,
 * more likely in a fertile cell. */
static int live(keel_ctx *ctx, const keel_iter *it, world_app *app, bool hungry)
{
    keel_cmdbuf *cmds = keel_ctx_commands(ctx);
    uint64_t tick = keel_ctx_tick(ctx);
    uint32_t *e = KEEL_COLUMN(it, uint32_t, 0), deaths = 0;
    const uint32_t *cell = hungry ? KEEL_COLUMN(it, uint32_t, 2) : NULL;
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
        } else if (hungry && chance(app, tick, agent) % (fertile(app, cell[i], tick) ? 4 : 16) == 0) {
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

/* ---- the economy ------------------------------------------------------- */

typedef enum trade_kind { TRADE_TRANSFER, TRADE_BUY, TRADE_SELL } trade_kind;

static int load_account(keel_side_txn *tx, const world_app *app, keel_entity e, account *a)
{
    int rc = keel_side_get(tx, e, app->wallet, &a->coins);
    if (!rc)
        rc = keel_side_get(tx, e, app->ledger, &a->ledger);
    if (!rc)
        rc = keel_side_get(tx, e, app->inventory, a->items);
    return rc;
}

static int store_account(keel_side_txn *tx, const world_app *app, keel_entity e, const account *a)
{
    int rc = keel_side_set(tx, e, app->wallet, &a->coins);
    if (!rc)
        rc = keel_side_set(tx, e, app->ledger, &a->ledger);
    if (!rc)
        rc = keel_side_set(tx, e, app->inventory, a->items);
    return rc;
}

/* The first slot at or after `from` (cyclically) holding an item (want !=
 * 0) or free (want == 0); INV_SLOTS when there is none. */
static uint32_t find_slot(const account *a, uint32_t from, bool want_item)
{
    for (uint32_t k = 0; k < INV_SLOTS; k++) {
        uint32_t s = (from + k) % INV_SLOTS;
        if ((a->items[s] != 0) == want_item)
            return s;
    }
    return INV_SLOTS;
}

static int64_t item_price(uint32_t item)
{
    return 20 + (int64_t)(item * 7u % 80u);
}

/* Move an item (the first from slot `from` on) from `seller` to `buyer`,
 * who pays `pct` percent of its price; false (nothing changes) when there
 * is no item, or the buyer lacks the coins or a free slot. */
static bool sell_item(account *seller, account *buyer, uint32_t from, int64_t pct)
{
    uint32_t s = find_slot(seller, from, true), d = find_slot(buyer, 0, false);
    if (s == INV_SLOTS || d == INV_SLOTS)
        return false;
    int64_t price = item_price(seller->items[s]) * pct / 100;
    if (buyer->coins < price)
        return false;
    buyer->coins -= price;
    seller->coins += price;
    buyer->items[d] = seller->items[s];
    seller->items[s] = 0;
    return true;
}

/* Decide trade `kind` between accounts a (a player) and b (r: its random
 * word). A merchant sells at the price and buys back at 80% of it. */
static bool decide(trade_kind kind, account *a, account *b, uint64_t r)
{
    uint32_t from = (uint32_t)(r >> 8) % INV_SLOTS;
    if (kind == TRADE_BUY)
        return sell_item(b, a, from, 100);
    if (kind == TRADE_SELL)
        return sell_item(a, b, from, 80);
    int64_t price = (int64_t)(1 + (r >> 40) % 200);
    if (a->coins < price)
        return false;
    a->coins -= price;
    b->coins += price;
    return true;
}

/* One trade, number `id`: an IMMEDIATE side transaction over accounts a
 * and b, committed now and queued for `settle`. A trade whose id a ledger
 * already holds was decided before a crash: skip it (see the top comment).
 * A refusal is recorded in the ledgers too: re-run after a crash, the trade
 * would otherwise be judged against balances that later trades of the
 * same tick (already durable) changed. Returns 1 when skipped. */
static int trade(keel_ctx *ctx, world_app *app, uint64_t id, trade_kind kind, keel_entity ea, keel_entity eb,
                 uint64_t r)
{
    keel_side_txn *tx = NULL;
    account a, b;
    if (app->npending == PENDING_CAP)
        return KEEL_EBUSY; /* cannot happen: settle leaves room for a tick's trades */
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx);
    if (rc)
        return rc;
    if ((rc = load_account(tx, app, ea, &a)) || (rc = load_account(tx, app, eb, &b)) || a.ledger >= id ||
        b.ledger >= id) {
        keel_side_txn_abort(tx);
        return rc ? rc : 1;
    }
    bool done = decide(kind, &a, &b, r);
    a.ledger = b.ledger = id;
    if ((rc = store_account(tx, app, ea, &a)) || (rc = store_account(tx, app, eb, &b))) {
        keel_side_txn_abort(tx);
        return rc;
    }
    pending_trade *p = &app->pending[(app->pending_head + app->npending) % PENDING_CAP];
    *p = (pending_trade){.id = id, .tick = keel_ctx_tick(ctx), .a = ea, .b = eb, .after_a = a, .after_b = b};
    /* committed now; durable (IMMEDIATE) when the ticket completes, which
     * settle notices in this tick or a later one; the tick's trades share
     * one sync */
    rc = keel_side_txn_commit_async(tx, &p->ticket);
    if (!rc) {
        app->npending++;
        atomic_fetch_add(done ? &app->trades : &app->refused, 1);
    }
    return rc;
}

/* Up to `max` entities of query q, in storage order (players and merchants
 * never move between tables, so the order is a function of the seed). */
static uint32_t collect(keel_ctx *ctx, const keel_query *q, keel_entity *out, uint32_t max)
{
    uint32_t n = 0;
    keel_iter it;
    keel_txn_iter(ctx, q, &it);
    while (keel_txn_next(ctx, &it))
        for (uint32_t i = 0; i < it.count && n < max; i++)
            out[n++] = it.entities[i];
    return n;
}

static void report_prefix(const world_app *app, uint64_t tick, uint32_t j)
{
    if (app->report_prefix)
        report_line(app, "prefix t=%" PRIu64 " j=%u hash=%016" PRIx64, tick, j, keel_world_hash(app->w));
}

/* The market: exclusive and first in the tick, so while it runs the world
 * holds exactly the previous tick plus the trades committed so far (what
 * --report-prefix hashes for keel-crash's oracle). */
static int market(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    keel_entity pl[PLAYERS], me[MERCHANTS];
    uint32_t np = collect(ctx, app->players, pl, PLAYERS), nm = collect(ctx, app->merchants, me, MERCHANTS);
    memcpy(app->accounts, pl, np * sizeof *pl);
    memcpy(app->accounts + np, me, nm * sizeof *me);
    app->naccounts = np + nm;
    uint64_t tick = keel_ctx_tick(ctx);
    int rc = 0;
    report_prefix(app, tick, 0); /* settle left room for this tick's trades */
    for (uint32_t k = 0, j = 0; !rc && np >= 2 && nm >= 1 && k < TRADES_PER_TICK; k++) {
        uint64_t r = chance(app, tick, 0x7472616465ull + k);
        trade_kind kind = (trade_kind)(r % 3);
        uint32_t i = (uint32_t)((r >> 16) % np), o = (uint32_t)((r >> 32) % (np - 1));
        keel_entity a = pl[i], b = kind == TRADE_TRANSFER ? pl[o + (o >= i)] : me[(r >> 48) % nm];
        rc = trade(ctx, app, tick * TRADES_PER_TICK + k + 1, kind, a, b, r);
        if (rc == 1) {
            rc = 0;
            continue;
        }
        if (!rc)
            report_prefix(app, tick, ++j);
    }
    return rc;
}

static int items_text(const account *a, char *buf, size_t cap)
{
    size_t n = 0;
    for (uint32_t s = 0; s < INV_SLOTS; s++)
        if (a->items[s] && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%u", n ? "," : "", a->items[s]);
    if (!n)
        snprintf(buf, cap, "-");
    return 0;
}

/* Acknowledge the oldest trade in flight, whose ticket returned w. */
static int ack_oldest(world_app *app, int w)
{
    pending_trade *p = &app->pending[app->pending_head];
    keel_ticket_release(p->ticket);
    p->ticket = NULL;
    if (!w && app->report_fd >= 0) {
        char ia[8 * 12], ib[8 * 12];
        items_text(&p->after_a, ia, sizeof ia);
        items_text(&p->after_b, ib, sizeof ib);
        report_line(app,
                    "ack id=%" PRIu64 " t=%" PRIu64 " a=%016" PRIx64 " b=%016" PRIx64 " a_coins=%" PRId64
                    " b_coins=%" PRId64 " a_items=%s b_items=%s",
                    p->id, p->tick, (uint64_t)p->a, (uint64_t)p->b, p->after_a.coins, p->after_b.coins, ia, ib);
    }
    app->pending_head = (app->pending_head + 1) % PENDING_CAP;
    app->npending--;
    return w;
}

/* settle: the players hear "done" here, once their trade is on disk. It
 * acknowledges, oldest first, every trade whose ticket has completed and
 * stops at the first that has not (the rest wait for a later tick): a
 * server tick must not hold a worker while the disk syncs. Only when
 * PENDING_TICKS ticks of trades are still in flight does it wait for the
 * oldest, so that the next market has room. Acknowledgements stay in trade
 * order; which tick sends them depends on the disk, not on the world, whose
 * state is the same either way. */
static int settle(keel_ctx *ctx, void *user)
{
    (void)ctx;
    world_app *app = user;
    int rc = 0;
    while (app->npending) {
        bool room = app->npending <= PENDING_CAP - TRADES_PER_TICK;
        int w = keel_ticket_wait(app->pending[app->pending_head].ticket, room ? 0 : -1);
        if (w == KEEL_ETIMEDOUT)
            break;
        w = ack_oldest(app, w);
        rc = rc ? rc : w;
    }
    return rc;
}

void world_settle_all(world_app *app, bool wait)
{
    while (app->npending)
        ack_oldest(app, wait ? keel_ticket_wait(app->pending[app->pending_head].ticket, -1) : KEEL_EBUSY);
}

/* census (LOW priority: the first thing overload throttling skips): every
 * 30th tick, agents per grid cell, for the status line's busiest cell. It
 * writes nothing durable, so skipping it cannot change the world. */
static int census(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    if (keel_ctx_tick(ctx) % 30)
        return 0;
    uint32_t count[GRID * GRID + 1] = {0}, best = 0;
    keel_iter it;
    keel_txn_iter(ctx, app->agents, &it);
    while (keel_txn_next(ctx, &it)) {
        const uint32_t *cell = KEEL_COLUMN(&it, uint32_t, 1);
        for (uint32_t i = 0; i < it.count; i++)
            count[cell[i] <= GRID * GRID ? cell[i] : 0]++;
    }
    for (uint32_t c = 1; c <= GRID * GRID; c++)
        best = count[c] > count[best] ? c : best;
    atomic_store(&app->busiest_cell, (uint64_t)best << 32 | count[best]);
    return 0;
}

int world_add_systems(world_app *app, keel_schedule *s)
{
    keel_system_desc sys[] = {
        {.name = "market", .kind = KEEL_SYSTEM_CALLBACK, .run = market, .user = app, .priority = KEEL_PRIORITY_CRITICAL,
         .access = {.side_writes = {app->wallet, app->ledger, app->inventory}, .exclusive = true},
         .before = {"movement", "metabolism", "foraging", "births", "settle"}},
        {.name = "settle", .kind = KEEL_SYSTEM_CALLBACK, .run = settle, .user = app, .after = {"market"},
         .priority = KEEL_PRIORITY_CRITICAL},
        {.name = "census", .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = census, .user = app,
         .priority = KEEL_PRIORITY_LOW, .access = {.reads = {app->pos, app->grid_cell}}},
        {.name = "movement", .priority = KEEL_PRIORITY_HIGH, .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = movement,
         .query = {.with = {app->pos, app->vel, app->grid_cell}}, .parallel = true, .user = app,
         .access = {.writes = {app->pos, app->vel, app->grid_cell}}},
        {.name = "metabolism", .priority = KEEL_PRIORITY_HIGH, .phase = 0, .kind = KEEL_SYSTEM_QUERY, .each_chunk = metabolism,
         .query = {.with = {app->energy}, .without = {app->hungry}}, .parallel = true, .user = app,
         .access = {.writes = {app->energy}, .events_produce = {"death"}}},
        {.name = "foraging", .priority = KEEL_PRIORITY_HIGH, .phase = 1, .kind = KEEL_SYSTEM_QUERY, .each_chunk = foraging,
         .query = {.with = {app->energy, app->hungry, app->grid_cell}}, .parallel = true, .user = app,
         .access = {.writes = {app->energy}, .reads = {app->grid_cell}, .events_produce = {"death"}}},
        {.name = "births", .priority = KEEL_PRIORITY_HIGH, .phase = 2, .kind = KEEL_SYSTEM_CALLBACK, .run = births, .user = app,
         .access = {.events_consume = {"death"}}},
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

/* ---- hooks ------------------------------------------------------------- */

static int populate(world_app *app, keel_cmdbuf *cb)
{
    int rc = 0;
    for (uint32_t i = 0; !rc && i < app->initial_entities; i++)
        rc = spawn_agent(app, cb, 0, i);
    uint64_t none = 0;
    uint32_t empty[INV_SLOTS] = {0};
    int64_t coins = PLAYER_COINS;
    for (uint32_t i = 0; !rc && i < PLAYERS; i++)
        rc = keel_cmd_spawn(cb, (keel_init[]){{app->wallet, &coins}, {app->ledger, &none}, {app->inventory, empty}},
                            3);
    coins = MERCHANT_COINS;
    for (uint32_t m = 0; !rc && m < MERCHANTS; m++) {
        uint32_t stock[INV_SLOTS] = {0};
        for (uint32_t k = 0; k < ITEMS_PER_MERCHANT; k++)
            stock[k] = m * ITEMS_PER_MERCHANT + k + 1;
        rc = keel_cmd_spawn(cb, (keel_init[]){{app->wallet, &coins}, {app->ledger, &none}, {app->inventory, stock},
                                              {app->merchant, NULL}}, 4);
    }
    return rc;
}

/* Rebuild the TRANSIENT grid of a recovered world from pos. */
static int rebuild_grid(keel_ctx *ctx, world_app *app)
{
    uint32_t n = keel_query_count(app->agents), got = 0;
    keel_entity *es = malloc(((size_t)n + 1) * sizeof *es);
    uint32_t *cells = malloc(((size_t)n + 1) * sizeof *cells);
    int rc = es && cells ? 0 : KEEL_ENOMEM;
    keel_iter it;
    keel_txn_iter(ctx, app->agents, &it);
    while (!rc && keel_txn_next(ctx, &it)) {
        const vec3 *p = KEEL_COLUMN(&it, vec3, 0);
        for (uint32_t i = 0; i < it.count && got < n; i++, got++) {
            es[got] = it.entities[i];
            cells[got] = cell_of(&p[i]);
        }
    }
    for (uint32_t i = 0; !rc && i < got; i++)
        rc = keel_txn_set(ctx, es[i], app->grid_cell, &cells[i]);
    free(es);
    free(cells);
    return rc;
}

int world_first_tick(keel_ctx *ctx, void *user)
{
    world_app *app = user;
    if (keel_world_count(keel_ctx_world(ctx)) == 0)
        return populate(app, keel_ctx_commands(ctx));
    return rebuild_grid(ctx, app);
}

/* on_shutdown (keel_runtime_close, an IMMEDIATE side transaction): read
 * every account once more and say whether the economy still balances. It
 * writes nothing: a clean stop must end in the state a kill would. */
int world_shutdown(keel_side_txn *tx, void *arg)
{
    world_app *app = arg;
    int64_t money = 0;
    if (!app->naccounts)
        return 0; /* no tick ran in this process: nothing was traded */
    for (uint32_t i = 0; i < app->naccounts; i++) {
        int64_t c = 0;
        int rc = keel_side_get(tx, app->accounts[i], app->wallet, &c);
        if (rc)
            return rc;
        money += c;
    }
    if (money != world_start_money())
        fprintf(stderr, "keel-world: on_shutdown: %" PRId64 " coins, expected %" PRId64 "\n", money,
                world_start_money());
    return 0;
}

/* ---- live trades (--live-trades) -------------------------------------- */

/* A trade submitted from the network thread: runs at the next tick start
 * in its own side transaction; it moves coins only. */
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
void *world_live_thread(void *arg)
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

/* ---- the economy seen from outside, and the report protocol ----------- */

static int read_account(const keel_view *v, const world_app *app, keel_entity e, account *a)
{
    int rc = keel_view_get(v, e, app->wallet, &a->coins);
    if (!rc)
        rc = keel_view_get(v, e, app->ledger, &a->ledger);
    if (!rc)
        rc = keel_view_get(v, e, app->inventory, a->items);
    return rc;
}

/* Walk every account through a read view of the last completed tick (as a
 * network thread would), summing the economy; `each` (may be NULL) sees
 * every account. Items are counted in a bitmap of ids to find duplicates. */
static int walk_accounts(world_app *app, economy *out,
                         void (*each)(world_app *, keel_entity, bool merchant, const account *))
{
    enum { MAX_ITEM = MERCHANTS * ITEMS_PER_MERCHANT };
    uint8_t seen[MAX_ITEM + 1] = {0};
    const keel_view *v;
    int rc = keel_view_begin(app->rt, &v);
    if (rc)
        return rc;
    *out = (economy){0};
    const keel_query *qs[2] = {app->players, app->merchants};
    for (int q = 0; !rc && q < 2; q++) {
        keel_iter it;
        keel_query_iter(qs[q], &it);
        while (!rc && keel_iter_next(&it))
            for (uint32_t i = 0; !rc && i < it.count; i++) {
                account a;
                if ((rc = read_account(v, app, it.entities[i], &a)))
                    break;
                out->money += a.coins;
                for (uint32_t s = 0; s < INV_SLOTS; s++) {
                    uint32_t id = a.items[s];
                    if (!id)
                        continue;
                    out->items++;
                    if (id > MAX_ITEM || seen[id]++)
                        out->dups++;
                }
                if (each)
                    each(app, it.entities[i], q == 1, &a);
            }
    }
    keel_view_end(v);
    return rc;
}

int world_economy(world_app *app, economy *out)
{
    return walk_accounts(app, out, NULL);
}

void report_line(const world_app *app, const char *fmt, ...)
{
    if (app->report_fd < 0)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    /* one write(2) per line: below PIPE_BUF, so lines from several threads
     * never interleave; a reader gone away is not our failure */
    ssize_t w = write(app->report_fd, buf, (size_t)n);
    (void)w;
}

static void report_account(world_app *app, keel_entity e, bool merchant, const account *a)
{
    char items[8 * 12];
    items_text(a, items, sizeof items);
    report_line(app, "acct e=%016" PRIx64 " kind=%s coins=%" PRId64 " ledger=%" PRIu64 " items=%s", (uint64_t)e,
                merchant ? "merchant" : "player", a->coins, a->ledger, items);
}

/* Every account, then the economy's totals (the `acct` and `state-end`
 * lines of the report protocol). */
int report_state(world_app *app)
{
    if (app->report_fd < 0)
        return 0;
    economy ec;
    int rc = walk_accounts(app, &ec, report_account);
    if (!rc)
        report_line(app, "state-end money=%" PRId64 " items=%u dups=%u", ec.money, ec.items, ec.dups);
    return rc;
}
