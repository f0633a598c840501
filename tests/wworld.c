/*
 * wworld.c -- the workload W (wworld.h) shared by test_durable and
 * test_walstate.
 */
#include "wworld.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel_test.h"
#include "test_util.h"
#include "world/world_internal.h"

void berr_note(berr *b, int line, const char *what, int rc)
{
    if (b->bad++ == 0)
        snprintf(b->msg, sizeof b->msg, "line %d: %s: %s (%s)", line, what, keel_strerror(rc), keel_last_error());
}

const keel_field i64_fields[1] = {{.name = "v", .type = KEEL_I64, .offset = 0, .count = 0}};

const keel_field pos_fields[2] = {
    {.name = "x", .type = KEEL_I64, .offset = 0, .count = 0},
    {.name = "born", .type = KEEL_I64, .offset = 8, .count = 0},
};

const keel_field misc_fields[6] = {
    {.name = "f", .type = KEEL_F32, .offset = 0},
    {.name = "arr", .type = KEEL_U16, .offset = 4, .count = 3},
    {.name = "b", .type = KEEL_BOOL, .offset = 10},
    {.name = "ref", .type = KEEL_ENTITY, .offset = 16},
    {.name = "raw", .type = KEEL_BYTES, .offset = 24, .count = 4},
    {.name = "neg", .type = KEEL_I32, .offset = 28},
};

keel_component reg_i64(keel_runtime *rt, const char *name, keel_discipline disc)
{
    keel_component c = 0;
    keel_component_desc cd = {.name = name, .size = 8, .discipline = disc, .fields = i64_fields, .field_count = 1};
    ck_assert_ok(keel_component_register(keel_runtime_world(rt), &cd, &c));
    return c;
}

int cmp_entity(const void *a, const void *b)
{
    keel_entity x = *(const keel_entity *)a, y = *(const keel_entity *)b;
    return x < y ? -1 : x > y;
}

uint32_t query_entities(const keel_query *q, keel_entity *out, uint32_t max)
{
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++)
            if (n < max)
                out[n++] = it.entities[r];
    qsort(out, n, sizeof *out, cmp_entity);
    return n;
}

int closure_xfer(keel_side_txn *tx, void *arg)
{
    xfer *x = arg;
    int64_t a = 0, b = 0;
    int rc = keel_side_get(tx, x->from, x->c, &a);
    rc = rc ? rc : keel_side_get(tx, x->to, x->c, &b);
    if (rc)
        return rc;
    a -= x->amount;
    b += x->amount;
    rc = keel_side_set(tx, x->from, x->c, &a);
    return rc ? rc : keel_side_set(tx, x->to, x->c, &b);
}

/* ---- the bodies ---------------------------------------------------------------------------- */

/* on_first_tick: rebuild the TRANSIENT column (tmp = 7 everywhere); an
 * empty world gets its population. */
static int w_hook(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->hook_calls++;
    w->hook_tick = keel_ctx_tick(ctx);
    w->hook_sys_before = w->sys_runs;
    keel_iter it;
    keel_txn_iter(ctx, w->q_tmp, &it);
    while (keel_txn_next(ctx, &it)) {
        int64_t *v = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            w->hook_nonzero += v[r] != 0;
            v[r] = 7;
            w->hook_rows++;
        }
    }
    keel_world *wd = keel_ctx_world(ctx);
    if (!w->hook_spawn || keel_world_count(wd) != 0)
        return 0;
    if (w->hook_inject) /* counts the command playback that follows the hook */
        world_test_inject_failure(wd, w->hook_inject, KEEL_ENOMEM);
    w->hook_inject = 0;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    for (uint32_t i = 0; i < w->hook_spawn; i++) {
        pos_t p = {50 + (int64_t)i, 0};
        int64_t hp = (int64_t)i, tmp = w->hook_tmp;
        keel_init in[4] = {{w->POS, &p}, {w->HP, &hp}, {w->TMP, &tmp}, {w->FLAG, NULL}};
        W_CHECK(w, keel_cmd_spawn(cb, in, i % 2 ? 4 : 3));
    }
    if (w->misc) {
        misc_t m = {.f = 1.5f, .arr = {1, 2, 3}, .raw = {0xab, 0, 0, 0}, .neg = -1};
        keel_init in[1] = {{w->MISC, &m}};
        W_CHECK(w, keel_cmd_spawn(cb, in, 1));
    }
    return 0;
}

static int w_life(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->sys_runs++;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    keel_iter it;
    keel_txn_iter(ctx, w->q_pos, &it);
    while (keel_txn_next(ctx, &it)) {
        pos_t *p = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            keel_entity e = it.entities[r];
            uint64_t idx = KEEL_ENTITY_INDEX(e);
            if (w->move_every < 2 || (idx + t) % w->move_every == 0)
                p[r].x += (int64_t)idx + 1;
            if ((idx + t) % 3 == 0) { /* SINGLE_VERSION, in place */
                int64_t hp = 0;
                W_CHECK(w, keel_txn_get(ctx, e, w->HP, &hp));
                hp += (int64_t)t;
                W_CHECK(w, keel_txn_set(ctx, e, w->HP, &hp));
            }
            if ((idx + t) % 4 == 0) { /* TRANSIENT: never durable */
                int64_t v = 1000 + (int64_t)t;
                W_CHECK(w, keel_txn_set(ctx, e, w->TMP, &v));
            }
            if ((idx * 7 + t) % 11 == 0)
                W_CHECK(w, keel_cmd_destroy(cb, e));
            else if ((idx + t) % 5 == 0)
                W_CHECK(w, keel_cmd_add(cb, e, w->FLAG, NULL));
            else if ((idx + t) % 5 == 2)
                W_CHECK(w, keel_cmd_remove(cb, e, w->FLAG));
        }
    }
    for (uint32_t k = 0; k < w->life_spawns; k++) {
        pos_t p = {(int64_t)t * 100 + k, (int64_t)t};
        int64_t hp = (int64_t)t, tmp = 5;
        keel_init in[4] = {{w->POS, &p}, {w->HP, &hp}, {w->TMP, &tmp}, {w->FLAG, NULL}};
        W_CHECK(w, keel_cmd_spawn(cb, in, k == 1 ? 4 : 3));
    }
    if (t == 1) { /* the bank's two accounts */
        int64_t m = 1000;
        keel_init in[1] = {{w->MONEY, &m}};
        W_CHECK(w, keel_cmd_spawn(cb, in, 1));
        W_CHECK(w, keel_cmd_spawn(cb, in, 1));
    }
    return 0;
}

/* misc: the misc entity gets every field rewritten at tick 5. */
static int w_misc(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    if (keel_ctx_tick(ctx) != 5)
        return 0;
    keel_iter it;
    keel_txn_iter(ctx, w->q_misc, &it);
    while (keel_txn_next(ctx, &it)) {
        misc_t *m = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            misc_t v = {.f = 2.25f, .arr = {7, 8, 65535}, .b = 1, .ref = it.entities[r],
                        .raw = {0xde, 0xad, 0x00, 0x01}, .neg = -42};
            m[r] = v;
        }
    }
    return 0;
}

static int w_bank(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->sys_runs++;
    keel_entity a[8];
    if (w->no_side || query_entities(w->q_money, a, 8) < 2)
        return 0;
    uint64_t t = keel_ctx_tick(ctx);
    keel_durability mode = (keel_durability)(1 + t % 3);
    keel_entity from = a[t % 2], to = a[1 - t % 2];
    int64_t amount = (int64_t)(t % 7) + 1, fv = 0, tv = 0;
    keel_side_txn *tx = NULL;
    W_CHECK(w, keel_side_txn_begin(ctx, mode, &tx));
    if (!tx)
        return 0;
    W_CHECK(w, keel_side_get(tx, from, w->MONEY, &fv));
    W_CHECK(w, keel_side_get(tx, to, w->MONEY, &tv));
    fv -= amount;
    tv += amount;
    W_CHECK(w, keel_side_set(tx, from, w->MONEY, &fv));
    W_CHECK(w, keel_side_set(tx, to, w->MONEY, &tv));
    int rc = keel_side_txn_commit(tx);
    if (rc)
        berr_note(&w->err, __LINE__, "keel_side_txn_commit", rc);
    else
        w->bank_commits[mode]++;
    return 0;
}

static int w_shutdown(keel_side_txn *tx, void *arg)
{
    wworld *w = arg;
    w->shutdown_calls++;
    if (w->shutdown_ret)
        return w->shutdown_ret;
    return w->shutdown_xfer.amount ? closure_xfer(tx, &w->shutdown_xfer) : 0;
}

/* ---- the runtime ----------------------------------------------------------------------------- */

static void w_register(wworld *w)
{
    keel_world *wd = keel_runtime_world(w->rt);
    keel_component_desc pos = {.name = "pos", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(wd, &pos, &w->POS));
    w->HP = reg_i64(w->rt, "hp", KEEL_SINGLE_VERSION);
    w->TMP = reg_i64(w->rt, "tmp", KEEL_TRANSIENT);
    keel_component_desc flag = {.name = "flag"};
    ck_assert_ok(keel_component_register(wd, &flag, &w->FLAG));
    w->MONEY = reg_i64(w->rt, "money", KEEL_VERSIONED);
    keel_component_desc mi = {.name = "misc", .size = sizeof(misc_t), .fields = misc_fields, .field_count = 6};
    if (w->misc)
        ck_assert_ok(keel_component_register(wd, &mi, &w->MISC));
    keel_query_desc qp = {.with = {w->POS}}, qm = {.with = {w->MONEY}}, qt = {.with = {w->TMP}},
                    qx = {.with = {w->MISC}};
    ck_assert_ok(keel_query_create(wd, &qp, &w->q_pos));
    ck_assert_ok(keel_query_create(wd, &qm, &w->q_money));
    ck_assert_ok(keel_query_create(wd, &qt, &w->q_tmp));
    if (w->misc)
        ck_assert_ok(keel_query_create(wd, &qx, &w->q_misc));
}

static void w_install(wworld *w)
{
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc life = {.name = "life", .kind = KEEL_SYSTEM_CALLBACK, .run = w_life, .user = w,
                             .access = {.writes = {w->POS, w->HP, w->TMP}}};
    keel_system_desc misc = {.name = "misc", .kind = KEEL_SYSTEM_CALLBACK, .run = w_misc, .user = w,
                             .access = {.writes = {w->MISC}}};
    keel_system_desc bank = {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = w_bank, .user = w,
                             .access = {.side_writes = {w->MONEY}}, .after = {"life"}};
    add_sys(s, &life);
    if (w->misc)
        add_sys(s, &misc);
    add_sys(s, &bank);
    tu_install(w->rt, s);
}

wworld *w_new(bool no_side)
{
    wworld *w = malloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    w_reset(w, no_side);
    return w;
}

void w_reset(wworld *w, bool no_side)
{
    memset(w, 0, sizeof *w);
    w->no_side = no_side;
    w->life_spawns = 3;
}

void w_open(wworld *w, const keel_runtime_desc *base, bool with_shutdown)
{
    keel_runtime_desc d = *base;
    d.on_first_tick = w_hook;
    d.hook_user = w;
    if (with_shutdown) {
        d.durable.on_shutdown = w_shutdown;
        d.durable.shutdown_arg = w;
    }
    ck_assert_ok(keel_runtime_create(&d, &w->rt));
    ck_assert_ptr_nonnull(w->rt);
    w_register(w);
    w_install(w);
}

/* Queries belong to the world: destroyed before the runtime closes it. */
int w_close(wworld *w)
{
    keel_query_destroy(w->q_pos);
    keel_query_destroy(w->q_money);
    keel_query_destroy(w->q_tmp);
    keel_query_destroy(w->q_misc);
    w->q_pos = w->q_money = w->q_tmp = w->q_misc = NULL;
    int rc = keel_runtime_close(w->rt);
    w->rt = NULL;
    return rc;
}

void w_drive(wworld *w, uint64_t t)
{
    ck_assert_uint_le(t, W_MAXT);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), t - 1);
    keel_ticket *tk = NULL;
    keel_entity a[8];
    if (!w->no_side && query_entities(w->q_money, a, 8) >= 2) {
        w->xf[t] = (xfer){a[0], a[1], (int64_t)t, w->MONEY};
        w->xf_mode[t] = (keel_durability)(1 + (t + 1) % 3);
        ck_assert_ok(keel_submit(w->rt, closure_xfer, &w->xf[t], w->xf_mode[t], &tk));
    }
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_msg(w->err.bad == 0, "tick %llu: %u bad checks in the bodies, first: %s", (unsigned long long)t,
                  w->err.bad, w->err.msg);
    if (tk) {
        ck_assert_ok(keel_ticket_wait(tk, -1));
        keel_ticket_release(tk);
    }
}
