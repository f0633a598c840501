/*
 * keel-world/world.h -- the demo world: its components, systems, economy and
 * the report protocol keel-crash reads. main.c holds the command line, the
 * run loop and the status line.
 */
#ifndef KEEL_WORLD_DEMO_H
#define KEEL_WORLD_DEMO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "keel/keel.h"

#define PLAYERS 64u
#define MERCHANTS 8u
#define INV_SLOTS 8u
#define ITEMS_PER_MERCHANT 6u /* items 1..MERCHANTS*ITEMS_PER_MERCHANT start in the merchants' stock */
#define PLAYER_COINS 1000
#define MERCHANT_COINS 5000
#define TRADES_PER_TICK 8u

typedef struct vec3 {
    float x, y, z;
} vec3;

/* What a trade writes to one account (wallet, ledger, inventory). */
typedef struct account {
    int64_t coins;
    uint64_t ledger;
    uint32_t items[INV_SLOTS]; /* item ids, 0 = an empty slot */
} account;

/* Trades in flight (committed, not yet acknowledged) at most: `settle`
 * waits for the disk only when this many ticks' trades are still pending. */
#define PENDING_TICKS 8u
#define PENDING_CAP (PENDING_TICKS * TRADES_PER_TICK)

/* A committed trade, acknowledged by `settle` once its ticket completes. */
typedef struct pending_trade {
    keel_ticket *ticket;
    uint64_t id, tick;
    keel_entity a, b;
    account after_a, after_b;
} pending_trade;

typedef struct world_app {
    keel_runtime *rt;
    keel_world *w;
    keel_component pos, vel, energy, hungry, wallet, ledger, inventory, merchant, grid_cell;
    keel_query *players, *merchants, *agents;
    uint64_t seed;
    uint32_t initial_entities;
    uint64_t start_tick;         /* the tick the run started at (recovered) */
    _Atomic uint64_t trades;     /* committed trades that moved coins or items */
    _Atomic uint64_t refused;    /* trades refused (funds, stock, space) */
    _Atomic uint32_t deaths;     /* this tick's deaths, summed over tasks */
    _Atomic uint64_t grid_mismatches; /* TRANSIENT grid cells found stale: must stay 0 */
    _Atomic uint64_t busiest_cell;    /* census: cell << 32 | agents in it */
    keel_entity accounts[PLAYERS + MERCHANTS]; /* players, then merchants, as the market last saw them */
    uint32_t naccounts;
    pending_trade pending[PENDING_CAP]; /* a ring, oldest at pending_head, in trade order */
    uint32_t pending_head, npending;
    int report_fd;               /* --report-fd, -1 = none */
    bool report_prefix;          /* --report-prefix: hash after every trade commit */
    /* --live-trades: a "network" thread submitting trades with keel_submit */
    keel_entity who[PLAYERS];
    uint32_t nwho;
    uint64_t live_rate;
    _Atomic bool live_stop;
    _Atomic uint64_t live_done, live_failed;
} world_app;

/* Register the components and queries and add the systems to s (built). */
int world_register(world_app *app);
int world_add_systems(world_app *app, keel_schedule *s);

/* The runtime hooks: on_first_tick populates a new world or rebuilds the
 * TRANSIENT grid of a recovered one; on_shutdown checks the economy. */
int world_first_tick(keel_ctx *ctx, void *user);
int world_shutdown(keel_side_txn *tx, void *arg);

/* Acknowledge every trade still in flight, in trade order, waiting for
 * each to be on disk (wait = true: the runtime must be open and healthy);
 * wait = false releases them unacknowledged (an error path). Call before
 * keel_runtime_close. */
void world_settle_all(world_app *app, bool wait);

/* The --live-trades thread. */
void *world_live_thread(void *arg);

/* The economy as seen by a read view of the last completed tick. */
typedef struct economy {
    int64_t money;     /* coins over every account */
    uint32_t items;    /* items held */
    uint32_t dups;     /* item ids held more than once */
} economy;
int world_economy(world_app *app, economy *out);
int64_t world_start_money(void);
uint32_t world_start_items(void);

/* Report protocol (docs/demo.md, keel-crash): one line per write(2). */
void report_line(const world_app *app, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int report_state(world_app *app);

/* world.params (params.c): the parameters a data directory's world was
 * created with. params_read: 1 read, 0 no record, -1 unreadable (printed);
 * params_write: 0, or -1 (printed). */
typedef struct world_params {
    uint64_t seed;
    uint32_t entities;
} world_params;
int params_read(const char *dir, world_params *p);
int params_write(const char *dir, const world_params *p);

#endif
