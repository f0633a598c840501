/*
 * wworld.h -- the workload W: every kind of change the durable runtime
 * logs, run by test_durable (reopen, checkpoints, recovery, errors) and
 * test_walstate (keel-wal replay and diff against the runtime's states).
 * (tests/wworld.c; test_durable_crash's workload is another one, in
 * crash_util.)
 *
 * Components: pos {x, born} VERSIONED, hp SINGLE_VERSION, tmp TRANSIENT,
 * the tag flag, money VERSIONED (the bank's two accounts) and, with
 * `misc`, misc (one entity holding every field type). Systems:
 *   life   moves pos.x (every tick, or with move_every = 2 every other
 *          one by handle), adds to hp, writes tmp, destroys, tags and
 *          untags, all decided by handle and tick only (never by TRANSIENT
 *          values), so the durable state is a function of the history;
 *          spawns `life_spawns` entities per tick and, at tick 1, the two
 *          accounts;
 *   misc   (with `misc`) rewrites every field of the misc entity at tick 5;
 *   bank   one side transaction per tick between the accounts, the mode
 *          cycling IMMEDIATE, GROUP, DEFERRED (off with no_side).
 * on_first_tick rebuilds tmp (7 everywhere) and populates an empty world
 * with hook_spawn entities (and the misc entity). w_drive also submits one
 * transfer per tick through keel_submit. Bodies may run on workers: they
 * record what went wrong in `err`, the test thread asserts.
 */
#ifndef KEEL_TEST_WWORLD_H
#define KEEL_TEST_WWORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "keel/keel.h"

/* ---- what bodies saw go wrong ----------------------------------------------------------- */

typedef struct berr {
    uint32_t bad;
    char msg[320];
} berr;

void berr_note(berr *b, int line, const char *what, int rc);

#define B_CHECK(b, expr)                                \
    do {                                                \
        int b_rc_ = (expr);                             \
        if (b_rc_)                                      \
            berr_note((b), __LINE__, #expr, b_rc_);     \
    } while (0)

#define ck_assert_berr(b) ck_assert_msg((b)->bad == 0, "%u bad checks in the bodies, first: %s", (b)->bad, (b)->msg)

/* ---- components and small helpers ---------------------------------------------------------- */

typedef struct pos_t {
    int64_t x;
    int64_t born;              /* tick of the spawn */
} pos_t;

/* Every field type the JSON formatter of keel-wal knows. */
typedef struct misc_t {
    float f;
    uint16_t arr[3];
    uint8_t b;                 /* bool */
    uint8_t pad[5];
    uint64_t ref;              /* an entity */
    uint8_t raw[4];
    int32_t neg;
} misc_t;

extern const keel_field i64_fields[1];  /* {v: i64} */
extern const keel_field pos_fields[2];
extern const keel_field misc_fields[6];

/* Register an 8-byte {v: i64} component. */
keel_component reg_i64(keel_runtime *rt, const char *name, keel_discipline disc);
int cmp_entity(const void *a, const void *b);
/* Entities matching q (world read), sorted, at most max. */
uint32_t query_entities(const keel_query *q, keel_entity *out, uint32_t max);

typedef struct xfer {
    keel_entity from, to;
    int64_t amount;
    keel_component c;
} xfer;

/* A transfer of x->amount in a side transaction (closures and on_shutdown). */
int closure_xfer(keel_side_txn *tx, void *arg);

/* ---- the workload -------------------------------------------------------------------------- */

#define W_MAXT 64

typedef struct wworld {
    keel_runtime *rt;
    keel_component POS, HP, TMP, FLAG, MONEY, MISC;
    keel_query *q_pos, *q_money, *q_tmp, *q_misc;
    /* the flavour (set after w_new / w_reset, before w_open) */
    bool no_side;              /* no side transactions (bank off, no closures) */
    bool misc;                 /* the misc component, its system and entity */
    uint32_t move_every;       /* life moves pos when (index + tick) % move_every == 0 (0, 1: always) */
    uint32_t life_spawns;      /* entities life spawns per tick (w_reset: 3) */
    uint32_t hook_spawn;       /* on_first_tick spawns this many when the world is empty */
    int64_t hook_tmp;          /* ... with this tmp value */
    uint32_t hook_inject;      /* ... and the nth of its commands fails (once) */
    /* what the bodies saw */
    uint32_t sys_runs;
    uint32_t hook_calls, hook_rows, hook_nonzero, hook_sys_before;
    uint64_t hook_tick;
    berr err;
    uint32_t bank_commits[4];  /* by mode */
    xfer xf[W_MAXT + 1];       /* the closure of each tick */
    keel_durability xf_mode[W_MAXT + 1];
    /* on_shutdown (w_open with_shutdown): returns shutdown_ret when set,
     * else makes shutdown_xfer (nothing while its amount is 0) */
    uint32_t shutdown_calls;
    int shutdown_ret;
    xfer shutdown_xfer;
} wworld;

#define W_CHECK(w, expr) B_CHECK(&(w)->err, expr)

/* A zeroed W of the default flavour, on the heap (free it). */
wworld *w_new(bool no_side);
/* Forget what the bodies recorded and the flavour: the default again (a
 * reopened runtime starts counting afresh). */
void w_reset(wworld *w, bool no_side);
/* Create the runtime from base (hooks wired to w), register, install. */
void w_open(wworld *w, const keel_runtime_desc *base, bool with_shutdown);
/* Destroy the queries, close the runtime: keel_runtime_close's result. */
int w_close(wworld *w);
/* Tick t: queue this tick's closure (once the accounts exist), step, check
 * the bodies, wait for the ticket. */
void w_drive(wworld *w, uint64_t t);

#endif
