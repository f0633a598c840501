/*
 * test_txn.c -- system transactions (docs/transactions.md, keel/txn.h, src/txn/txn.c,
 * src/txn/uow.c):
 *
 *   txn_api       keel_txn_get / keel_txn_set error paths, keel_set refused
 *                 inside a tick, schedule build rules for pipelines, rewrites
 *                 and undeclared query terms;
 *   txn_cow       copy-on-write: VERSIONED writes are published only when the
 *                 system succeeds, a failing system (error return,
 *                 keel_txn_fail, one failing chunk task) leaves no VERSIONED
 *                 write and no command behind, SINGLE_VERSION / TRANSIENT are
 *                 written in place, `rewrites` hands a fresh buffer beside
 *                 the current values, read-your-writes, keel_txn_iter in a
 *                 callback system, on_first_tick's transaction;
 *   txn_snapshot  reads_snapshot beside a concurrent writer sees the previous
 *                 tick, reads_fresh sees the current one, and the state hash
 *                 does not depend on the worker count;
 *   txn_uow       the unit of work's change set: exactly the changed rows,
 *                 SINGLE_VERSION chunks whole, TRANSIENT never, the lifecycle
 *                 log in playback order, worker-count independent order.
 *
 * Bodies never call ck_assert (they may run on worker threads): they record
 * what they saw (atomics where several tasks write), and the test thread
 * asserts after the step. No sleeps: the one place that orders two
 * concurrent bodies (the snapshot reader waits for the writer's private
 * version) uses a one-way wait whose generous deadline only turns a hang
 * into a failure.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "runtime/runtime_internal.h"

/* ---- helpers ---------------------------------------------------------------- */

static const keel_field f_u32[] = {{.name = "v", .type = KEEL_U32, .offset = 0, .count = 0}};

static keel_component reg_u32(keel_world *w, const char *name, keel_discipline d)
{
    return tu_reg(w, name, sizeof(uint32_t), d, f_u32, 1);
}

/* The first diagnostic with this code and severity ERROR, or NULL. */
static const keel_sched_diag *find_error(const keel_schedule *s, keel_sched_code code)
{
    for (uint32_t i = 0; i < keel_schedule_diag_count(s); i++) {
        const keel_sched_diag *d = keel_schedule_diag(s, i);
        if (d->code == code && d->severity == KEEL_SCHED_ERROR)
            return d;
    }
    return NULL;
}

static uint32_t count_errors(const keel_schedule *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < keel_schedule_diag_count(s); i++)
        n += keel_schedule_diag(s, i)->severity == KEEL_SCHED_ERROR;
    return n;
}

/* Spawn n entities (between steps) with up to 4 u32 components; component k
 * of entity i gets bases[k] + i. Handles go to out (may be NULL). */
static void spawn_rows(keel_runtime *rt, uint32_t n, const keel_component *cs, const uint32_t *bases, uint32_t nc,
                       keel_entity *out)
{
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(keel_runtime_world(rt), &cb));
    for (uint32_t i = 0; i < n; i++) {
        keel_init in[4];
        uint32_t vals[4];
        for (uint32_t k = 0; k < nc; k++) {
            vals[k] = bases[k] + i;
            in[k] = (keel_init){cs[k], &vals[k]};
        }
        ck_assert_ok(keel_cmd_spawn(cb, in, nc));
    }
    tu_cmdbuf_apply_created(cb, n, out);
}

static uint32_t get_u32(keel_runtime *rt, keel_entity e, keel_component c)
{
    uint32_t v = 0xdeadbeef;
    ck_assert_ok(keel_get(keel_runtime_world(rt), e, c, &v));
    return v;
}

/* A stepped runtime (16-row chunks) holding n entities of one versioned u32 component *c, named
 * name, entity i holding i; handles to ents. */
static keel_runtime *rt_with_rows(uint32_t workers, const char *name, keel_component *c, uint32_t n,
                                  keel_entity *ents)
{
    keel_runtime *rt =
        tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers, .tick_rate_hz = -1});
    *c = reg_u32(keel_runtime_world(rt), name, KEEL_VERSIONED);
    spawn_rows(rt, n, c, (uint32_t[]){0}, 1, ents);
    return rt;
}

/* Build s, which must fail with an error diagnostic `code` naming name_count names (case k of a
 * table); that diagnostic. */
static const keel_sched_diag *build_error(keel_schedule *s, keel_sched_code code, uint32_t name_count, int k)
{
    ck_assert_int_eq(keel_schedule_build(s), KEEL_EINVAL);
    const keel_sched_diag *d = find_error(s, code);
    ck_assert_msg(d != NULL, "case %d: no diagnostic with code %d", k, (int)code);
    ck_assert_uint_eq(d->name_count, name_count);
    return d;
}

/* ========================================================================== */
/* txn_api                                                                    */
/* ========================================================================== */

enum {
    R_GET_NULLCTX, R_SET_NULLCTX, R_GET_UNDECL, R_SET_UNDECL, R_SET_READONLY, R_SET_SIDE, R_GET_SIDE, R_GET_READ,
    R_GET_STALE, R_SET_STALE, R_GET_NULLENT, R_SET_NULLENT, R_GET_WRONGGEN, R_SET_PASTEND, R_GET_NOENT, R_SET_NOENT,
    R_GET_ID0, R_SET_ID0, R_GET_IDBIG, R_SET_IDBIG, R_GET_NULLOUT, R_SET_NULLVAL, R_SET_OK, R_GET_OWN, R_COUNT
};

typedef struct api_probe {
    keel_entity full, partial, dead;
    keel_component A, B, S, N;
    int rc[R_COUNT];
    uint32_t got_b, got_s, got_own;
    int ran;
} api_probe;

static int api_body(keel_ctx *ctx, void *user)
{
    api_probe *p = user;
    p->ran++;
    uint32_t v = 0, w = 12345, junk = 4242;
    int *rc = p->rc;
    rc[R_GET_NULLCTX] = keel_txn_get(NULL, p->full, p->A, &v);
    rc[R_SET_NULLCTX] = keel_txn_set(NULL, p->full, p->A, &junk);
    rc[R_GET_UNDECL] = keel_txn_get(ctx, p->full, p->N, &v);
    rc[R_SET_UNDECL] = keel_txn_set(ctx, p->full, p->N, &junk);
    rc[R_SET_READONLY] = keel_txn_set(ctx, p->full, p->B, &junk);
    rc[R_SET_SIDE] = keel_txn_set(ctx, p->full, p->S, &junk);
    rc[R_GET_SIDE] = keel_txn_get(ctx, p->full, p->S, &p->got_s);
    rc[R_GET_READ] = keel_txn_get(ctx, p->full, p->B, &p->got_b);
    rc[R_GET_STALE] = keel_txn_get(ctx, p->dead, p->A, &v);
    rc[R_SET_STALE] = keel_txn_set(ctx, p->dead, p->A, &junk);
    rc[R_GET_NULLENT] = keel_txn_get(ctx, KEEL_ENTITY_NULL, p->A, &v);
    rc[R_SET_NULLENT] = keel_txn_set(ctx, KEEL_ENTITY_NULL, p->A, &junk);
    /* a live slot with the wrong generation, and a slot never used */
    rc[R_GET_WRONGGEN] =
        keel_txn_get(ctx, KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(p->full), KEEL_ENTITY_GEN(p->full) + 7), p->A, &v);
    rc[R_SET_PASTEND] = keel_txn_set(ctx, KEEL_ENTITY_MAKE(100000, 1), p->A, &junk);
    rc[R_GET_NOENT] = keel_txn_get(ctx, p->partial, p->A, &v);
    rc[R_SET_NOENT] = keel_txn_set(ctx, p->partial, p->A, &junk);
    rc[R_GET_ID0] = keel_txn_get(ctx, p->full, 0, &v);
    rc[R_SET_ID0] = keel_txn_set(ctx, p->full, 0, &junk);
    rc[R_GET_IDBIG] = keel_txn_get(ctx, p->full, 200, &v);
    rc[R_SET_IDBIG] = keel_txn_set(ctx, p->full, 200, &junk);
    rc[R_GET_NULLOUT] = keel_txn_get(ctx, p->full, p->A, NULL);
    rc[R_SET_NULLVAL] = keel_txn_set(ctx, p->full, p->A, NULL);
    rc[R_SET_OK] = keel_txn_set(ctx, p->full, p->A, &w);
    rc[R_GET_OWN] = keel_txn_get(ctx, p->full, p->A, &p->got_own);
    return 0;
}

START_TEST(test_api_get_set_errors)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static api_probe p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < R_COUNT; i++)
        p.rc[i] = 999;
    p.A = reg_u32(w, "A", KEEL_VERSIONED);
    p.B = reg_u32(w, "B", KEEL_VERSIONED);
    p.S = reg_u32(w, "S", KEEL_VERSIONED);
    p.N = reg_u32(w, "N", KEEL_VERSIONED);
    keel_entity ents[3];
    spawn_rows(rt, 3, (keel_component[]){p.A, p.B, p.S, p.N}, (uint32_t[]){10, 20, 30, 40}, 4, ents);
    keel_entity partial;
    spawn_rows(rt, 1, (keel_component[]){p.B}, (uint32_t[]){77}, 1, &partial);
    p.full = ents[0];
    p.dead = ents[2];
    p.partial = partial;
    tu_destroy_now(keel_runtime_world(rt), p.dead);

    keel_schedule *s = sched_new(rt);
    keel_system sys = add_sys(s, &(keel_system_desc){
                                     .name = "api",
                                     .run = api_body,
                                     .user = &p,
                                     .access = {.reads = {p.B}, .writes = {p.A}, .side_writes = {p.S}},
                                 });
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(p.ran, 1);
    ck_assert_int_eq(tu_sysrec(rt, 1, sys).skip, KEEL_SKIP_NONE);

    const int *rc = p.rc;
    ck_assert_int_eq(rc[R_GET_NULLCTX], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_NULLCTX], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_GET_UNDECL], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_UNDECL], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_READONLY], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_SIDE], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_GET_SIDE], KEEL_OK); /* side_writes is an access list: reading is fine */
    ck_assert_uint_eq(p.got_s, 30);
    ck_assert_int_eq(rc[R_GET_READ], KEEL_OK);
    ck_assert_uint_eq(p.got_b, 20);
    ck_assert_int_eq(rc[R_GET_STALE], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_SET_STALE], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_GET_NULLENT], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_SET_NULLENT], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_GET_WRONGGEN], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_SET_PASTEND], KEEL_ESTALE);
    ck_assert_int_eq(rc[R_GET_NOENT], KEEL_ENOENT);
    ck_assert_int_eq(rc[R_SET_NOENT], KEEL_ENOENT);
    ck_assert_int_eq(rc[R_GET_ID0], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_ID0], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_GET_IDBIG], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_IDBIG], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_GET_NULLOUT], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_NULLVAL], KEEL_EINVAL);
    ck_assert_int_eq(rc[R_SET_OK], KEEL_OK);
    ck_assert_int_eq(rc[R_GET_OWN], KEEL_OK);
    ck_assert_uint_eq(p.got_own, 12345);

    /* the refused writes changed nothing; the accepted one committed */
    ck_assert_uint_eq(get_u32(rt, p.full, p.A), 12345);
    ck_assert_uint_eq(get_u32(rt, p.full, p.B), 20);
    ck_assert_uint_eq(get_u32(rt, p.full, p.S), 30);
    ck_assert_uint_eq(get_u32(rt, p.full, p.N), 40);
    ck_assert_uint_eq(get_u32(rt, ents[1], p.A), 11);
    ck_assert_uint_eq(get_u32(rt, p.partial, p.B), 77);
    ck_assert_int_eq(keel_has(w, p.partial, p.A), 0);
    ck_assert_uint_eq(keel_world_count(w), 3);
    keel_runtime_close(rt);
}
END_TEST

typedef struct busy_probe {
    keel_entity e;
    keel_component A;
    int set_rc, get_rc, txn_rc;
    uint32_t get_v, txn_v;
    int ran;
} busy_probe;

static int busy_body(keel_ctx *ctx, void *user)
{
    busy_probe *p = user;
    p->ran++;
    uint32_t v = 999;
    p->set_rc = keel_set(keel_ctx_world(ctx), p->e, p->A, &v);
    p->get_rc = keel_get(keel_ctx_world(ctx), p->e, p->A, &p->get_v);
    p->txn_rc = keel_txn_get(ctx, p->e, p->A, &p->txn_v);
    return 0;
}

START_TEST(test_api_direct_set_busy)
{
    for (int workers = 1; workers <= 2; workers++) {
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_world *w = keel_runtime_world(rt);
        static busy_probe p;
        memset(&p, 0, sizeof p);
        p.A = reg_u32(w, "A", KEEL_VERSIONED);
        spawn_rows(rt, 1, &p.A, (uint32_t[]){5}, 1, &p.e);
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "busy", .run = busy_body, .user = &p, .access = {.writes = {p.A}}});
        tu_install(rt, s);

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(p.ran, 1);
        ck_assert_int_eq(p.set_rc, KEEL_EBUSY);
        ck_assert_int_eq(p.get_rc, KEEL_OK);
        ck_assert_uint_eq(p.get_v, 5);
        ck_assert_int_eq(p.txn_rc, KEEL_OK);
        ck_assert_uint_eq(p.txn_v, 5);
        ck_assert_uint_eq(get_u32(rt, p.e, p.A), 5); /* the refused keel_set wrote nothing */

        /* between steps the controlling thread may write directly */
        ck_assert_ok(keel_set(w, p.e, p.A, &(uint32_t){42}));
        ck_assert_uint_eq(get_u32(rt, p.e, p.A), 42);
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(p.ran, 2);
        ck_assert_int_eq(p.set_rc, KEEL_EBUSY);
        ck_assert_uint_eq(p.get_v, 42);
        ck_assert_uint_eq(p.txn_v, 42);
        ck_assert_uint_eq(get_u32(rt, p.e, p.A), 42);
        keel_runtime_close(rt);
    }
}
END_TEST

static _Atomic uint32_t g_pipe_calls;

static int pipe_body(uint32_t index, uint32_t count, void *user)
{
    (void)user;
    if (index < count)
        atomic_fetch_add(&g_pipe_calls, 1);
    return 0;
}

START_TEST(test_api_pipeline_build_rules)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    keel_component V = reg_u32(w, "Vers", KEEL_VERSIONED);
    keel_component SV = reg_u32(w, "Single", KEEL_SINGLE_VERSION);
    spawn_rows(rt, 4, (keel_component[]){V, SV}, (uint32_t[]){0, 0}, 2, NULL);

    keel_access bad[3] = {
        {.writes = {V}},
        {.reads_snapshot = {V}},
        {.side_writes = {V}},
    };
    for (int k = 0; k < 3; k++) {
        keel_schedule *s = sched_new(rt);
        /* a callback beside it with the same access builds fine: only the pipeline is wrong */
        add_sys(s, &(keel_system_desc){.name = "pipe",
                                       .kind = KEEL_SYSTEM_PIPELINE,
                                       .pipeline = pipe_body,
                                       .pipeline_count = 4,
                                       .access = bad[k]});
        const keel_sched_diag *d = build_error(s, KEEL_SCHED_BAD_SYSTEM, 2, k);
        ck_assert_str_eq(d->names[0], "pipe");
        ck_assert_str_eq(d->names[1], "Vers");
        ck_assert_ptr_nonnull(strstr(d->message, "pipe"));
        /* a schedule built with errors cannot be installed */
        ck_assert_int_eq(keel_runtime_set_schedule(rt, s), KEEL_EINVAL);
        keel_schedule_destroy(s);

        /* the same access on a callback system is fine */
        s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "cb", .run = tu_sys_noop, .access = bad[k]});
        ck_assert_ok(keel_schedule_build(s));
        ck_assert_ptr_null(find_error(s, KEEL_SCHED_BAD_SYSTEM));
        keel_schedule_destroy(s);
    }

    /* writing a SINGLE_VERSION component (and reading a VERSIONED one) from a
     * pipeline is allowed */
    keel_schedule *s = sched_new(rt);
    keel_system pipe = add_sys(s, &(keel_system_desc){.name = "pipe",
                                                      .kind = KEEL_SYSTEM_PIPELINE,
                                                      .pipeline = pipe_body,
                                                      .pipeline_count = 5,
                                                      .access = {.reads = {V}, .writes = {SV}}});
    ck_assert_ok(keel_schedule_build(s));
    ck_assert_uint_eq(count_errors(s), 0);
    ck_assert_ok(keel_runtime_set_schedule(rt, s));
    atomic_store(&g_pipe_calls, 0);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(atomic_load(&g_pipe_calls), 5);
    keel_system_record r = tu_sysrec(rt, 1, pipe);
    ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
    ck_assert_uint_eq(r.tasks, 5);
    keel_runtime_close(rt);
}
END_TEST

typedef struct rw_probe {
    keel_entity e;
    keel_component A;
    int rc1, rc2, get_rc;
    uint32_t seen;
} rw_probe;

static int rw_first(keel_ctx *ctx, void *user)
{
    rw_probe *p = user;
    p->rc1 = keel_txn_set(ctx, p->e, p->A, &(uint32_t){1});
    return 0;
}

static int rw_second(keel_ctx *ctx, void *user)
{
    rw_probe *p = user;
    p->get_rc = keel_txn_get(ctx, p->e, p->A, &p->seen);
    uint32_t v = p->seen + 1;
    p->rc2 = keel_txn_set(ctx, p->e, p->A, &v);
    return 0;
}

START_TEST(test_api_rewrites_conflict)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static rw_probe p;
    memset(&p, 0, sizeof p);
    p.A = reg_u32(w, "Acomp", KEEL_VERSIONED);
    spawn_rows(rt, 1, &p.A, (uint32_t[]){50}, 1, &p.e);

    /* two unordered rewriters; then a rewriter beside a plain writer */
    for (int k = 0; k < 2; k++) {
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "r1", .run = rw_first, .user = &p, .access = {.rewrites = {p.A}}});
        keel_access a2 = k == 0 ? (keel_access){.rewrites = {p.A}} : (keel_access){.writes = {p.A}};
        add_sys(s, &(keel_system_desc){.name = "r2", .run = rw_second, .user = &p, .access = a2});
        const keel_sched_diag *d = build_error(s, KEEL_SCHED_WRITE_CONFLICT, 3, k);
        ck_assert_str_eq(d->names[0], "r1");
        ck_assert_str_eq(d->names[1], "r2");
        ck_assert_str_eq(d->names[2], "Acomp");
        keel_schedule_destroy(s);
    }

    /* an explicit edge resolves it */
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "r1", .run = rw_first, .user = &p, .access = {.rewrites = {p.A}}});
    add_sys(s, &(keel_system_desc){.name = "r2", .run = tu_sys_noop, .after = {"r1"}, .access = {.rewrites = {p.A}}});
    ck_assert_ok(keel_schedule_build(s));
    ck_assert_uint_eq(count_errors(s), 0);
    keel_schedule_destroy(s);

    /* so does a phase; the lower phase runs first (registered last here) */
    s = sched_new(rt);
    add_sys(s, &(keel_system_desc){
                   .name = "r2", .phase = 1, .run = rw_second, .user = &p, .access = {.rewrites = {p.A}}});
    add_sys(s, &(keel_system_desc){.name = "r1", .phase = 0, .run = rw_first, .user = &p, .access = {.rewrites = {p.A}}});
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(p.rc1, KEEL_OK);
    ck_assert_int_eq(p.get_rc, KEEL_OK);
    ck_assert_int_eq(p.rc2, KEEL_OK);
    ck_assert_uint_eq(p.seen, 1); /* r1's commit, not the tick-start 50 */
    ck_assert_uint_eq(get_u32(rt, p.e, p.A), 2);
    keel_runtime_close(rt);
}
END_TEST

typedef struct undecl_probe {
    keel_component A;
    uint32_t expect;
    _Atomic uint32_t rows, bad, set_einval, get_ok;
} undecl_probe;

static int undecl_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    undecl_probe *p = user;
    const uint32_t *col = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++) {
        atomic_fetch_add(&p->rows, 1);
        if (col[r] != p->expect)
            atomic_fetch_add(&p->bad, 1);
        uint32_t v = 0;
        if (keel_txn_get(ctx, it->entities[r], p->A, &v) == KEEL_OK && v == p->expect)
            atomic_fetch_add(&p->get_ok, 1);
        if (keel_txn_set(ctx, it->entities[r], p->A, &(uint32_t){7}) == KEEL_EINVAL)
            atomic_fetch_add(&p->set_einval, 1);
    }
    return 0;
}

typedef struct setall_probe {
    keel_component c;
    keel_entity *ents;
    uint32_t n;
    uint32_t value;
    int bad;
} setall_probe;

static int setall_body(keel_ctx *ctx, void *user)
{
    setall_probe *p = user;
    for (uint32_t i = 0; i < p->n; i++)
        if (keel_txn_set(ctx, p->ents[i], p->c, &p->value))
            p->bad++;
    return 0;
}

START_TEST(test_api_query_term_is_read)
{
    static undecl_probe p;
    memset(&p, 0, sizeof p);
    keel_entity ents[40];
    keel_runtime *rt = rt_with_rows(2, "Acomp", &p.A, 40, ents);
    static setall_probe sp;
    sp = (setall_probe){.c = p.A, .ents = ents, .n = 40, .value = 31};

    /* a query term in no access list is a plain read: beside an unordered writer in the same phase */
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "w", .run = setall_body, .user = &sp, .access = {.writes = {p.A}}});
    add_sys(s, &(keel_system_desc){
                   .name = "q", .kind = KEEL_SYSTEM_QUERY, .each_chunk = undecl_chunk, .user = &p, .query = {.with = {p.A}}});
    const keel_sched_diag *d = build_error(s, KEEL_SCHED_READ_CONFLICT, 3, 0);
    ck_assert_str_eq(d->names[0], "w");
    ck_assert_str_eq(d->names[1], "q");
    ck_assert_str_eq(d->names[2], "Acomp");
    ck_assert_uint_eq(count_errors(s), 1);
    keel_schedule_destroy(s);

    /* declared as reads_snapshot, the same pair builds (no edge, no conflict) */
    s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "w", .run = setall_body, .user = &sp, .access = {.writes = {p.A}}});
    add_sys(s, &(keel_system_desc){.name = "q",
                                   .kind = KEEL_SYSTEM_QUERY,
                                   .each_chunk = undecl_chunk,
                                   .user = &p,
                                   .query = {.with = {p.A}},
                                   .access = {.reads_snapshot = {p.A}}});
    ck_assert_ok(keel_schedule_build(s));
    keel_schedule_destroy(s);

    /* in a later phase it is ordered after the writer; at run time the
     * undeclared term reads (txn_get works) but cannot be written */
    s = sched_new(rt);
    keel_system ws =
        add_sys(s, &(keel_system_desc){.name = "w", .run = setall_body, .user = &sp, .access = {.writes = {p.A}}});
    keel_system qs = add_sys(s, &(keel_system_desc){.name = "q",
                                                    .phase = 1,
                                                    .kind = KEEL_SYSTEM_QUERY,
                                                    .each_chunk = undecl_chunk,
                                                    .parallel = true,
                                                    .min_chunk_rows = 16,
                                                    .user = &p,
                                                    .query = {.with = {p.A}}});
    tu_install(rt, s);
    p.expect = 31;
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(tu_sysrec(rt, 1, ws).skip, KEEL_SKIP_NONE);
    ck_assert_int_eq(tu_sysrec(rt, 1, qs).skip, KEEL_SKIP_NONE);
    ck_assert_int_eq(sp.bad, 0);
    ck_assert_uint_eq(atomic_load(&p.rows), 40);
    ck_assert_uint_eq(atomic_load(&p.bad), 0);
    ck_assert_uint_eq(atomic_load(&p.get_ok), 40);
    ck_assert_uint_eq(atomic_load(&p.set_einval), 40);
    for (uint32_t i = 0; i < 40; i++)
        ck_assert_uint_eq(get_u32(rt, ents[i], p.A), 31);
    keel_runtime_close(rt);
}
END_TEST

/* ========================================================================== */
/* txn_cow                                                                    */
/* ========================================================================== */

/* A world of n entities with P = i (entity index i, in spawn order). */
#define COW_N 200

typedef struct cow_probe {
    keel_component P;
    keel_entity ents[COW_N];
    uint32_t n;
    _Atomic uint32_t bad;      /* a value differed from what it should be */
    _Atomic uint32_t checked;  /* values checked */
    _Atomic uint32_t runs;
} cow_probe;

/* callback: P = tick*1000 + i through keel_txn_set; the committed value
 * (keel_get) stays the old one until the system commits */
static int cow_set_body(keel_ctx *ctx, void *user)
{
    cow_probe *p = user;
    atomic_fetch_add(&p->runs, 1);
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t before = 0, v = tick * 1000 + i;
        keel_get(keel_ctx_world(ctx), p->ents[i], p->P, &before);
        if (keel_txn_set(ctx, p->ents[i], p->P, &v))
            atomic_fetch_add(&p->bad, 1);
        uint32_t committed = 0, own = 0;
        keel_get(keel_ctx_world(ctx), p->ents[i], p->P, &committed);
        keel_txn_get(ctx, p->ents[i], p->P, &own);
        if (committed != before || own != v)
            atomic_fetch_add(&p->bad, 1);
        atomic_fetch_add(&p->checked, 1);
    }
    return 0;
}

/* reader: every P == tick*1000 + i + add */
static void cow_check_all(keel_ctx *ctx, cow_probe *p, uint32_t add)
{
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t a = 0, b = 0;
        keel_txn_get(ctx, p->ents[i], p->P, &a);
        keel_get(keel_ctx_world(ctx), p->ents[i], p->P, &b);
        if (a != tick * 1000 + i + add || b != a)
            atomic_fetch_add(&p->bad, 1);
        atomic_fetch_add(&p->checked, 1);
    }
}

static cow_probe g_cow;

static int cow_check0(keel_ctx *ctx, void *user)
{
    cow_check_all(ctx, user, 0);
    return 0;
}

static int cow_check1(keel_ctx *ctx, void *user)
{
    cow_check_all(ctx, user, 1);
    return 0;
}

/* query system: P += 1 through the iterator's columns (a private version:
 * the committed value is unchanged while the system runs) */
static int cow_inc_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    cow_probe *p = user;
    uint32_t *col = it->columns[0];
    if (col != it->prev[0])
        atomic_fetch_add(&p->bad, 1);
    for (uint32_t r = 0; r < it->count; r++) {
        uint32_t before = col[r];
        col[r] = before + 1;
        uint32_t committed = 0, own = 0;
        keel_get(keel_ctx_world(ctx), it->entities[r], p->P, &committed);
        keel_txn_get(ctx, it->entities[r], p->P, &own);
        if (committed != before || own != before + 1)
            atomic_fetch_add(&p->bad, 1);
        atomic_fetch_add(&p->checked, 1);
    }
    return 0;
}

START_TEST(test_cow_visible_on_success)
{
    for (int workers = 1; workers <= 2; workers++) {
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                         .tick_rate_hz = -1});
        keel_world *w = keel_runtime_world(rt);
        cow_probe *p = &g_cow;
        memset(p, 0, sizeof *p);
        p->n = COW_N;
        p->P = reg_u32(w, "P", KEEL_VERSIONED);
        spawn_rows(rt, COW_N, &p->P, (uint32_t[]){0}, 1, p->ents);

        keel_schedule *s = sched_new(rt);
        keel_system set = add_sys(s, &(keel_system_desc){.name = "set", .run = cow_set_body, .user = p,
                                                         .access = {.writes = {p->P}}});
        keel_system chk0 = add_sys(s, &(keel_system_desc){.name = "check0", .run = cow_check0, .user = p,
                                                          .after = {"set"}, .before = {"inc"},
                                                          .access = {.reads = {p->P}}});
        keel_system inc = add_sys(s, &(keel_system_desc){.name = "inc",
                                                         .kind = KEEL_SYSTEM_QUERY,
                                                         .each_chunk = cow_inc_chunk,
                                                         .parallel = true,
                                                         .min_chunk_rows = 16,
                                                         .user = p,
                                                         .query = {.with = {p->P}},
                                                         .access = {.writes = {p->P}}});
        keel_system chk1 = add_sys(s, &(keel_system_desc){.name = "check1", .run = cow_check1, .user = p,
                                                          .access = {.reads_fresh = {p->P}}});
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 3; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&p->bad), 0);
            ck_assert_uint_eq(atomic_load(&p->checked), tick * 4 * COW_N);
            ck_assert_int_eq(tu_sysrec(rt, tick, set).skip, KEEL_SKIP_NONE);
            ck_assert_int_eq(tu_sysrec(rt, tick, chk0).skip, KEEL_SKIP_NONE);
            ck_assert_int_eq(tu_sysrec(rt, tick, inc).skip, KEEL_SKIP_NONE);
            ck_assert_int_eq(tu_sysrec(rt, tick, chk1).skip, KEEL_SKIP_NONE);
            if (workers == 2)
                ck_assert_uint_gt(tu_sysrec(rt, tick, inc).tasks, 1);
            for (uint32_t i = 0; i < COW_N; i++)
                ck_assert_uint_eq(get_u32(rt, p->ents[i], p->P), tick * 1000 + i + 1);
        }
        keel_runtime_close(rt);
    }
}
END_TEST

/* Failing writers: a callback (keel_txn_set + commands) and a parallel
 * query system (iterator + one spawn per chunk) of another component. */
typedef struct fail_probe {
    keel_component P, Q, M;
    keel_entity ents[COW_N];
    _Atomic uint32_t fail_mode;
    _Atomic uint32_t cb_runs, q_chunks, after_runs, bad;
} fail_probe;

static int fail_outcome(keel_ctx *ctx, _Atomic uint32_t *mode)
{
    uint32_t f = atomic_load(mode);
    if (f == 1)
        return KEEL_EIO;
    if (f == 2)
        keel_txn_fail(ctx, 0); /* rc 0 fails the system with KEEL_EINVAL */
    return 0;
}

static int fail_cb(keel_ctx *ctx, void *user)
{
    fail_probe *p = user;
    atomic_fetch_add(&p->cb_runs, 1);
    for (uint32_t i = 0; i < COW_N; i++)
        if (keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){5000 + i}))
            atomic_fetch_add(&p->bad, 1);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    if (keel_cmd_spawn(cb, &(keel_init){p->P, &(uint32_t){9}}, 1) || keel_cmd_destroy(cb, p->ents[0]) ||
        keel_cmd_add(cb, p->ents[1], p->M, &(uint32_t){3}))
        atomic_fetch_add(&p->bad, 1);
    return fail_outcome(ctx, &p->fail_mode);
}

static int fail_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    fail_probe *p = user;
    atomic_fetch_add(&p->q_chunks, 1);
    uint32_t *col = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++)
        col[r] += 100;
    if (keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){p->Q, &(uint32_t){1}}, 1))
        atomic_fetch_add(&p->bad, 1);
    /* fail in one chunk only: the one holding entity index 100 */
    bool here = false;
    for (uint32_t r = 0; r < it->count; r++)
        here |= KEEL_ENTITY_INDEX(it->entities[r]) == 100;
    return here ? fail_outcome(ctx, &p->fail_mode) : 0;
}

static int fail_after(keel_ctx *ctx, void *user)
{
    (void)ctx;
    fail_probe *p = user;
    atomic_fetch_add(&p->after_runs, 1);
    return 0;
}

START_TEST(test_cow_rollback_on_failure)
{
    for (uint32_t mode = 1; mode <= 2; mode++) {
        for (int workers = 1; workers <= 2; workers++) {
            keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                             .tick_rate_hz = -1});
            keel_world *w = keel_runtime_world(rt);
            static fail_probe p;
            memset(&p, 0, sizeof p);
            p.P = reg_u32(w, "P", KEEL_VERSIONED);
            p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
            p.M = reg_u32(w, "M", KEEL_VERSIONED);
            spawn_rows(rt, COW_N, (keel_component[]){p.P, p.Q}, (uint32_t[]){0, 10000}, 2, p.ents);

            keel_schedule *s = sched_new(rt);
            keel_system cbs = add_sys(s, &(keel_system_desc){.name = "cbw", .run = fail_cb, .user = &p,
                                                             .access = {.writes = {p.P}}});
            keel_system qs = add_sys(s, &(keel_system_desc){.name = "qw",
                                                            .kind = KEEL_SYSTEM_QUERY,
                                                            .each_chunk = fail_chunk,
                                                            .parallel = true,
                                                            .min_chunk_rows = 16,
                                                            .user = &p,
                                                            .query = {.with = {p.Q}},
                                                            .access = {.writes = {p.Q}}});
            keel_system after = add_sys(s, &(keel_system_desc){.name = "after", .run = fail_after, .user = &p,
                                                               .access = {.reads_fresh = {p.P, p.Q}}});
            tu_install(rt, s);
            uint64_t h0 = keel_world_hash(w);

            atomic_store(&p.fail_mode, mode);
            ck_assert_ok(keel_runtime_step(rt)); /* a failing system is not an error of the tick */
            ck_assert_uint_eq(atomic_load(&p.bad), 0);
            ck_assert_uint_eq(atomic_load(&p.cb_runs), 1);
            ck_assert_uint_ge(atomic_load(&p.q_chunks), 1);
            ck_assert_int_eq(tu_sysrec(rt, 1, cbs).skip, KEEL_SKIP_FAILED);
            ck_assert_int_eq(tu_sysrec(rt, 1, qs).skip, KEEL_SKIP_FAILED);
            ck_assert_int_eq(tu_sysrec(rt, 1, after).skip, KEEL_SKIP_DEPENDENCY_FAILED);
            ck_assert_uint_eq(atomic_load(&p.after_runs), 0);
            /* every VERSIONED value unchanged, every command dropped */
            for (uint32_t i = 0; i < COW_N; i++) {
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.P), i);
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.Q), 10000 + i);
            }
            ck_assert_uint_eq(keel_world_count(w), COW_N);
            ck_assert(keel_alive(w, p.ents[0]));
            ck_assert_int_eq(keel_has(w, p.ents[1], p.M), 0);
            ck_assert_uint_eq(keel_world_hash(w), h0);
            ck_assert_uint_eq(keel_runtime_tick(rt), 1);

            /* the next tick succeeds and publishes */
            atomic_store(&p.fail_mode, 0);
            uint32_t chunks_before = atomic_load(&p.q_chunks);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&p.bad), 0);
            ck_assert_uint_eq(atomic_load(&p.q_chunks) - chunks_before, (COW_N + 15) / 16);
            ck_assert_int_eq(tu_sysrec(rt, 2, cbs).skip, KEEL_SKIP_NONE);
            ck_assert_int_eq(tu_sysrec(rt, 2, qs).skip, KEEL_SKIP_NONE);
            ck_assert_int_eq(tu_sysrec(rt, 2, after).skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(atomic_load(&p.after_runs), 1);
            ck_assert(!keel_alive(w, p.ents[0]));
            for (uint32_t i = 1; i < COW_N; i++) {
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.P), 5000 + i);
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.Q), 10100 + i);
            }
            ck_assert_uint_eq(get_u32(rt, p.ents[1], p.M), 3);
            /* - destroyed ents[0] + 1 spawn (callback) + one spawn per chunk */
            ck_assert_uint_eq(keel_world_count(w), COW_N - 1 + 1 + (COW_N + 15) / 16);
            keel_runtime_close(rt);
        }
    }
}
END_TEST

#define PAR_N 4000
#define PAR_FAIL_INDEX 2100

typedef struct par_probe {
    keel_component P;
    keel_entity ents[PAR_N];
    _Atomic uint32_t fail;
    _Atomic uint32_t chunks, failed_chunks, bad;
} par_probe;

static int par_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    par_probe *p = user;
    atomic_fetch_add(&p->chunks, 1);
    uint32_t *col = it->columns[0];
    bool here = false;
    for (uint32_t r = 0; r < it->count; r++) {
        col[r] += 1;
        here |= KEEL_ENTITY_INDEX(it->entities[r]) == PAR_FAIL_INDEX;
    }
    if (keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){p->P, &(uint32_t){0}}, 1))
        atomic_fetch_add(&p->bad, 1);
    if (here && atomic_load(&p->fail)) {
        atomic_fetch_add(&p->failed_chunks, 1);
        return KEEL_EIO;
    }
    return 0;
}

START_TEST(test_cow_parallel_one_task_fails)
{
    static par_probe p;
    memset(&p, 0, sizeof p);
    keel_runtime *rt = rt_with_rows(2, "P", &p.P, PAR_N, p.ents);
    keel_world *w = keel_runtime_world(rt);
    for (uint32_t i = 0; i < PAR_N; i++)
        ck_assert_uint_eq(KEEL_ENTITY_INDEX(p.ents[i]), i);
    keel_schedule *s = sched_new(rt);
    keel_system qs = add_sys(s, &(keel_system_desc){.name = "par",
                                                    .kind = KEEL_SYSTEM_QUERY,
                                                    .each_chunk = par_chunk,
                                                    .parallel = true,
                                                    .min_chunk_rows = 16,
                                                    .user = &p,
                                                    .query = {.with = {p.P}},
                                                    .access = {.writes = {p.P}}});
    tu_install(rt, s);
    const uint32_t nchunks = PAR_N / 16;
    uint64_t h0 = keel_world_hash(w);

    atomic_store(&p.fail, 1);
    ck_assert_ok(keel_runtime_step(rt));
    keel_system_record r = tu_sysrec(rt, 1, qs);
    ck_assert_int_eq(r.skip, KEEL_SKIP_FAILED);
    ck_assert_uint_gt(r.tasks, 1); /* many chunk tasks, exactly one of which failed */
    ck_assert_uint_eq(atomic_load(&p.failed_chunks), 1);
    /* only the failing task stopped early: the others wrote all their chunks */
    uint32_t per_task = (nchunks + r.tasks - 1) / r.tasks;
    ck_assert_uint_ge(atomic_load(&p.chunks), nchunks - per_task + 1);
    ck_assert_uint_le(atomic_load(&p.chunks), nchunks);
    ck_assert_uint_eq(atomic_load(&p.bad), 0);
    /* no write left in any chunk, no command applied */
    for (uint32_t i = 0; i < PAR_N; i++)
        ck_assert_msg(get_u32(rt, p.ents[i], p.P) == i, "row %u: %u", i, get_u32(rt, p.ents[i], p.P));
    ck_assert_uint_eq(keel_world_count(w), PAR_N);
    ck_assert_uint_eq(keel_world_hash(w), h0);

    /* without the failure every row is written exactly once and committed */
    atomic_store(&p.fail, 0);
    atomic_store(&p.chunks, 0);
    ck_assert_ok(keel_runtime_step(rt));
    r = tu_sysrec(rt, 2, qs);
    ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
    ck_assert_uint_eq(atomic_load(&p.chunks), nchunks);
    for (uint32_t i = 0; i < PAR_N; i++)
        ck_assert_uint_eq(get_u32(rt, p.ents[i], p.P), i + 1);
    ck_assert_uint_eq(keel_world_count(w), PAR_N + nchunks);
    keel_runtime_close(rt);
}
END_TEST

typedef struct sv_probe {
    keel_component V, S, T;
    keel_entity ents[64];
    uint32_t n;
    int bad;
    uint32_t seen_S_committed, seen_V_committed;
} sv_probe;

static int sv_body(keel_ctx *ctx, void *user)
{
    sv_probe *p = user;
    for (uint32_t i = 0; i < p->n; i++) {
        uint32_t v = 700 + i;
        if (keel_txn_set(ctx, p->ents[i], p->V, &v) || keel_txn_set(ctx, p->ents[i], p->S, &v) ||
            keel_txn_set(ctx, p->ents[i], p->T, &v))
            p->bad++;
    }
    /* in place: the world shows S and T at once, V only after commit */
    keel_get(keel_ctx_world(ctx), p->ents[3], p->S, &p->seen_S_committed);
    keel_get(keel_ctx_world(ctx), p->ents[3], p->V, &p->seen_V_committed);
    return KEEL_EIO;
}

typedef struct sv_qprobe {
    _Atomic uint32_t rows, bad;
} sv_qprobe;

/* query system over (S, V): in-place S, private V, then fail */
static int sv_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    sv_qprobe *p = user;
    uint32_t *s = it->columns[0], *v = it->columns[1];
    for (uint32_t r = 0; r < it->count; r++) {
        s[r] += 1;
        v[r] += 1;
        atomic_fetch_add(&p->rows, 1);
    }
    return KEEL_EIO;
}

/* The parallel query system running sv_chunk over (S, V) in phase `phase`. */
static keel_system add_svq(keel_schedule *s, uint32_t phase, sv_qprobe *qp, keel_component S, keel_component V)
{
    return add_sys(s, &(keel_system_desc){.name = "svq",
                                          .phase = phase,
                                          .kind = KEEL_SYSTEM_QUERY,
                                          .each_chunk = sv_chunk,
                                          .parallel = true,
                                          .min_chunk_rows = 16,
                                          .user = qp,
                                          .query = {.with = {S, V}},
                                          .access = {.writes = {S, V}}});
}

START_TEST(test_cow_single_version_in_place)
{
    for (int workers = 1; workers <= 2; workers++) {
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                         .tick_rate_hz = -1});
        keel_world *w = keel_runtime_world(rt);
        static sv_probe p;
        memset(&p, 0, sizeof p);
        static sv_qprobe qp;
        memset(&qp, 0, sizeof qp);
        p.n = 50;
        p.V = reg_u32(w, "V", KEEL_VERSIONED);
        p.S = reg_u32(w, "S", KEEL_SINGLE_VERSION);
        p.T = reg_u32(w, "T", KEEL_TRANSIENT);
        spawn_rows(rt, p.n, (keel_component[]){p.V, p.S, p.T}, (uint32_t[]){0, 100, 200}, 3, p.ents);
        keel_schedule *s = sched_new(rt);
        keel_system cb = add_sys(s, &(keel_system_desc){.name = "svfail", .run = sv_body, .user = &p,
                                                        .access = {.writes = {p.V, p.S, p.T}}});
        keel_system qs = add_svq(s, 1, &qp, p.S, p.V);
        tu_install(rt, s);
        uint64_t h0 = keel_world_hash(w);
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(p.bad, 0);
        ck_assert_int_eq(tu_sysrec(rt, 1, cb).skip, KEEL_SKIP_FAILED);
        /* phase 1 after a failed phase-0 writer of S and V: skipped */
        ck_assert_int_eq(tu_sysrec(rt, 1, qs).skip, KEEL_SKIP_DEPENDENCY_FAILED);
        ck_assert_uint_eq(p.seen_S_committed, 703);
        ck_assert_uint_eq(p.seen_V_committed, 3);
        for (uint32_t i = 0; i < p.n; i++) {
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.V), i);       /* rolled back */
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.S), 700 + i); /* in place: stays (documented) */
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.T), 700 + i); /* in place: stays */
        }
        ck_assert_uint_ne(keel_world_hash(w), h0); /* S is durable state */

        /* the query variant on its own: drop the callback's schedule */
        s = sched_new(rt);
        qs = add_svq(s, 0, &qp, p.S, p.V);
        tu_install(rt, s);
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(tu_sysrec(rt, 2, qs).skip, KEEL_SKIP_FAILED);
        uint32_t rows = atomic_load(&qp.rows);
        ck_assert_uint_ge(rows, 1);
        ck_assert_uint_le(rows, p.n);
        uint32_t bumped = 0;
        for (uint32_t i = 0; i < p.n; i++) {
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.V), i);
            uint32_t sv = get_u32(rt, p.ents[i], p.S);
            ck_assert(sv == 700 + i || sv == 701 + i);
            bumped += sv == 701 + i;
        }
        ck_assert_uint_eq(bumped, rows); /* every row the failing tasks visited kept its S write */
        keel_runtime_close(rt);
    }
}
END_TEST

#define RW_N 300

typedef struct rwq_probe {
    keel_component P, Q;
    _Atomic uint32_t fail;
    _Atomic uint32_t rows, bad, same_ptr, fresh_ptr;
} rwq_probe;

/* with = {P (rewrites), Q (writes)}: P = prev + 1, Q += 2 */
static int rwq_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    rwq_probe *p = user;
    uint32_t *nw = it->columns[0];
    const uint32_t *prev = it->prev[0];
    if ((const void *)nw != (const void *)prev && nw && prev)
        atomic_fetch_add(&p->fresh_ptr, 1);
    if (it->columns[1] == it->prev[1])
        atomic_fetch_add(&p->same_ptr, 1);
    uint32_t *q = it->columns[1];
    for (uint32_t r = 0; r < it->count; r++) {
        /* prev holds the committed values */
        uint32_t committed = 0;
        keel_get(keel_ctx_world(ctx), it->entities[r], p->P, &committed);
        if (prev[r] != committed)
            atomic_fetch_add(&p->bad, 1);
        nw[r] = prev[r] + 1;
        q[r] += 2;
        uint32_t own = 0;
        if (keel_txn_get(ctx, it->entities[r], p->P, &own) || own != prev[r] + 1)
            atomic_fetch_add(&p->bad, 1);
        atomic_fetch_add(&p->rows, 1);
    }
    if (atomic_load(&p->fail) && KEEL_ENTITY_INDEX(it->entities[it->count - 1]) == RW_N - 1)
        return KEEL_EIO; /* the last chunk fails */
    return 0;
}

START_TEST(test_cow_rewrites)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static rwq_probe p;
    memset(&p, 0, sizeof p);
    p.P = reg_u32(w, "P", KEEL_VERSIONED);
    p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
    keel_entity *ents = malloc(RW_N * sizeof *ents);
    ck_assert_ptr_nonnull(ents);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(w, &cb));
    for (uint32_t i = 0; i < RW_N; i++)
        ck_assert_ok(keel_cmd_spawn(cb, (keel_init[]){{p.P, &(uint32_t){3 * i}}, {p.Q, &(uint32_t){i}}}, 2));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    memcpy(ents, keel_cmdbuf_result(cb).created, RW_N * sizeof *ents);
    keel_cmdbuf_destroy(cb);

    keel_schedule *s = sched_new(rt);
    keel_system rs = add_sys(s, &(keel_system_desc){.name = "rw",
                                                    .kind = KEEL_SYSTEM_QUERY,
                                                    .each_chunk = rwq_chunk,
                                                    .parallel = true,
                                                    .min_chunk_rows = 16,
                                                    .user = &p,
                                                    .query = {.with = {p.P, p.Q}},
                                                    .access = {.rewrites = {p.P}, .writes = {p.Q}}});
    tu_install(rt, s);
    const uint32_t nchunks = (RW_N + 15) / 16;
    for (uint32_t tick = 1; tick <= 3; tick++) {
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(tu_sysrec(rt, tick, rs).skip, KEEL_SKIP_NONE);
        ck_assert_uint_eq(atomic_load(&p.rows), tick * RW_N);
        ck_assert_uint_eq(atomic_load(&p.bad), 0);
        ck_assert_uint_eq(atomic_load(&p.fresh_ptr), tick * nchunks); /* columns[0] is a new buffer */
        ck_assert_uint_eq(atomic_load(&p.same_ptr), tick * nchunks);  /* a plain writer's is not */
        for (uint32_t i = 0; i < RW_N; i++) {
            ck_assert_uint_eq(get_u32(rt, ents[i], p.P), 3 * i + tick);
            ck_assert_uint_eq(get_u32(rt, ents[i], p.Q), i + 2 * tick);
        }
    }
    /* a failing rewriter leaves the committed values, not its fresh buffers */
    atomic_store(&p.fail, 1);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(tu_sysrec(rt, 4, rs).skip, KEEL_SKIP_FAILED);
    ck_assert_uint_eq(atomic_load(&p.bad), 0);
    for (uint32_t i = 0; i < RW_N; i++) {
        ck_assert_uint_eq(get_u32(rt, ents[i], p.P), 3 * i + 3);
        ck_assert_uint_eq(get_u32(rt, ents[i], p.Q), i + 6);
    }
    free(ents);
    keel_runtime_close(rt);
}
END_TEST

/* Read-your-writes through keel_txn_get. */
typedef struct ryw_probe {
    keel_component P;
    keel_entity a, b; /* b in another chunk than a */
    int rc;
    uint32_t own1, own2, committed, other, other_committed;
} ryw_probe;

static int ryw_body(keel_ctx *ctx, void *user)
{
    ryw_probe *p = user;
    keel_world *w = keel_ctx_world(ctx);
    p->rc |= keel_txn_set(ctx, p->a, p->P, &(uint32_t){50});
    p->rc |= keel_txn_get(ctx, p->a, p->P, &p->own1);
    p->rc |= keel_txn_set(ctx, p->a, p->P, &(uint32_t){51});
    p->rc |= keel_txn_get(ctx, p->a, p->P, &p->own2);
    p->rc |= keel_get(w, p->a, p->P, &p->committed);
    p->rc |= keel_txn_get(ctx, p->b, p->P, &p->other);
    p->rc |= keel_get(w, p->b, p->P, &p->other_committed);
    return 0;
}

START_TEST(test_cow_read_your_writes)
{
    static ryw_probe p;
    memset(&p, 0, sizeof p);
    keel_entity ents[40];
    keel_runtime *rt = rt_with_rows(1, "P", &p.P, 40, ents);
    p.a = ents[2];
    p.b = ents[35];
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "ryw", .run = ryw_body, .user = &p, .access = {.writes = {p.P}}});
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(p.rc, 0);
    ck_assert_uint_eq(p.own1, 50);
    ck_assert_uint_eq(p.own2, 51);
    ck_assert_uint_eq(p.committed, 2); /* not visible outside the transaction yet */
    ck_assert_uint_eq(p.other, 35);
    ck_assert_uint_eq(p.other_committed, 35);
    ck_assert_uint_eq(get_u32(rt, p.a, p.P), 51);
    ck_assert_uint_eq(get_u32(rt, p.b, p.P), 35);
    keel_runtime_close(rt);
}
END_TEST

/* keel_txn_iter / keel_txn_next in a callback system. */
typedef struct ti_probe {
    keel_component P, Q;
    keel_query *q;
    _Atomic uint32_t fail;
    uint32_t rows, chunks, bad;
} ti_probe;

static int ti_body(keel_ctx *ctx, void *user)
{
    ti_probe *p = user;
    keel_iter it;
    keel_txn_iter(ctx, p->q, &it);
    while (keel_txn_next(ctx, &it)) {
        p->chunks++;
        uint32_t *pc = it.columns[0];
        const uint32_t *qc = it.columns[1];
        if (it.columns[0] != it.prev[0])
            p->bad++;
        for (uint32_t r = 0; r < it.count; r++) {
            uint32_t before = pc[r];
            pc[r] = before + qc[r];
            uint32_t committed = 0, own = 0;
            keel_get(keel_ctx_world(ctx), it.entities[r], p->P, &committed);
            keel_txn_get(ctx, it.entities[r], p->P, &own);
            if (committed != before || own != before + qc[r])
                p->bad++;
            p->rows++;
        }
    }
    return atomic_load(&p->fail) ? KEEL_EIO : 0;
}

START_TEST(test_cow_txn_iter_callback)
{
    for (int workers = 1; workers <= 2; workers++) {
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                         .tick_rate_hz = -1});
        keel_world *w = keel_runtime_world(rt);
        static ti_probe p;
        memset(&p, 0, sizeof p);
        p.P = reg_u32(w, "P", KEEL_VERSIONED);
        p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
        keel_entity ents[100];
        spawn_rows(rt, 100, (keel_component[]){p.P, p.Q}, (uint32_t[]){0, 1}, 2, ents); /* P = i, Q = i + 1 */
        p.q = tu_query_new(w, p.P, p.Q);
        keel_schedule *s = sched_new(rt);
        keel_system ts = add_sys(s, &(keel_system_desc){.name = "iter", .run = ti_body, .user = &p,
                                                        .access = {.writes = {p.P}, .reads = {p.Q}}});
        tu_install(rt, s);
        /* tick 1 commits, tick 2 fails, tick 3 commits */
        uint32_t expect_mult[4] = {0, 1, 1, 2};
        for (uint32_t tick = 1; tick <= 3; tick++) {
            atomic_store(&p.fail, tick == 2);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_int_eq(tu_sysrec(rt, tick, ts).skip, tick == 2 ? KEEL_SKIP_FAILED : KEEL_SKIP_NONE);
            ck_assert_uint_eq(p.rows, tick * 100);
            ck_assert_uint_eq(p.chunks, tick * 7);
            ck_assert_uint_eq(p.bad, 0);
            for (uint32_t i = 0; i < 100; i++) {
                ck_assert_uint_eq(get_u32(rt, ents[i], p.P), i + expect_mult[tick] * (i + 1));
                ck_assert_uint_eq(get_u32(rt, ents[i], p.Q), i + 1);
            }
        }
        keel_query_destroy(p.q);
        keel_runtime_close(rt);
    }
}
END_TEST

/* on_first_tick: a transaction; its writes and commands are visible to the
 * first tick's systems; a failing hook rolls back and runs again. */
typedef struct hook_probe {
    keel_component P, Q;
    keel_entity ents[50];
    keel_query *q;
    uint32_t fail_mode; /* on the first attempt: 1 return, 2 keel_txn_fail */
    uint32_t attempts;
    int hook_bad;
    uint32_t sys_runs, sys_bad, sys_count;
} hook_probe;

static int hook_fn(keel_ctx *ctx, void *user)
{
    hook_probe *p = user;
    p->attempts++;
    for (uint32_t i = 0; i < 50; i++)
        if (keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){500 + i}))
            p->hook_bad++;
    keel_iter it;
    keel_txn_iter(ctx, p->q, &it);
    while (keel_txn_next(ctx, &it)) {
        uint32_t *qc = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++)
            qc[r] = 900 + KEEL_ENTITY_INDEX(it.entities[r]);
    }
    if (keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{p->P, &(uint32_t){7777}}, {p->Q, &(uint32_t){8888}}}, 2))
        p->hook_bad++;
    if (p->attempts == 1 && p->fail_mode == 1)
        return KEEL_EIO;
    if (p->attempts == 1 && p->fail_mode == 2)
        keel_txn_fail(ctx, KEEL_ECONFLICT);
    return 0;
}

static int hook_reader(keel_ctx *ctx, void *user)
{
    hook_probe *p = user;
    p->sys_runs++;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    for (uint32_t i = 0; i < 50; i++) {
        uint32_t a = 0, b = 0;
        keel_txn_get(ctx, p->ents[i], p->P, &a);
        keel_txn_get(ctx, p->ents[i], p->Q, &b);
        if (a != 500 + i || b != 900 + i)
            p->sys_bad++;
    }
    p->sys_count = keel_query_count(p->q);
    return 0;
}

START_TEST(test_cow_first_tick_hook)
{
    for (uint32_t mode = 0; mode <= 2; mode++) {
        static hook_probe p;
        memset(&p, 0, sizeof p);
        p.fail_mode = mode;
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = -1,
                                                         .on_first_tick = hook_fn, .hook_user = &p});
        keel_world *w = keel_runtime_world(rt);
        p.P = reg_u32(w, "P", KEEL_VERSIONED);
        p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
        spawn_rows(rt, 50, (keel_component[]){p.P, p.Q}, (uint32_t[]){0, 0}, 2, p.ents);
        p.q = tu_query_new(w, p.Q, 0);
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "reader", .run = hook_reader, .user = &p,
                                       .access = {.reads = {p.P, p.Q}}});
        tu_install(rt, s);
        uint64_t h0 = keel_world_hash(w);

        if (mode) {
            ck_assert_int_eq(keel_runtime_step(rt), mode == 1 ? KEEL_EIO : KEEL_ECONFLICT);
            ck_assert_uint_eq(p.attempts, 1);
            ck_assert_uint_eq(p.sys_runs, 0); /* no system ran */
            ck_assert_uint_eq(keel_runtime_tick(rt), 0);
            for (uint32_t i = 0; i < 50; i++) {
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.P), i);
                ck_assert_uint_eq(get_u32(rt, p.ents[i], p.Q), i);
            }
            ck_assert_uint_eq(keel_world_count(w), 50); /* its spawn was dropped */
            ck_assert_uint_eq(keel_world_hash(w), h0);
        }
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(p.attempts, (mode ? 2u : 1u));
        ck_assert_int_eq(p.hook_bad, 0);
        ck_assert_uint_eq(keel_runtime_tick(rt), 1);
        ck_assert_uint_eq(p.sys_runs, 1);
        ck_assert_uint_eq(p.sys_bad, 0);
        ck_assert_uint_eq(p.sys_count, 51); /* the hook's spawn is applied before the systems */
        ck_assert_uint_eq(keel_world_count(w), 51);
        for (uint32_t i = 0; i < 50; i++) {
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.P), 500 + i);
            ck_assert_uint_eq(get_u32(rt, p.ents[i], p.Q), 900 + i);
        }
        /* it runs once */
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(p.attempts, (mode ? 2u : 1u));
        ck_assert_uint_eq(p.sys_runs, 2);
        keel_query_destroy(p.q);
        keel_runtime_close(rt);
    }
}
END_TEST

/* ========================================================================== */
/* txn_snapshot                                                               */
/* ========================================================================== */

#define SNAP_N 512
#define SNAP_TICKS 200

typedef struct snap_probe {
    keel_component C;
    keel_entity ents[SNAP_N];
    keel_query *q;
    _Atomic uint64_t written;
    _Atomic uint32_t timeouts;
    _Atomic uint32_t w_bad, r_bad, r_rows, r_gets, qr_bad, qr_rows, f_bad, f_rows;
} snap_probe;

/* On even ticks the snapshot reader waits until the writer has filled its
 * private version (it may have committed too) before it reads. The wait is
 * one way: the writer never waits, and a worker that claimed both runs the
 * writer (registered first, queued first) before the reader. */
static bool snap_wait_tick(uint64_t tick)
{
    return tick % 2 == 0;
}

/* writer: every row = tick (callback over keel_txn_iter) */
static int snap_writer(keel_ctx *ctx, void *user)
{
    snap_probe *p = user;
    uint64_t tick = keel_ctx_tick(ctx);
    keel_iter it;
    keel_txn_iter(ctx, p->q, &it);
    uint32_t rows = 0;
    while (keel_txn_next(ctx, &it)) {
        uint32_t *c = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++)
            c[r] = (uint32_t)tick;
        rows += it.count;
    }
    if (rows != SNAP_N)
        atomic_fetch_add(&p->w_bad, 1);
    atomic_store(&p->written, tick);
    return 0;
}

/* snapshot reader, beside the writer: sees the previous tick's values */
static int snap_reader(keel_ctx *ctx, void *user)
{
    snap_probe *p = user;
    uint64_t tick = keel_ctx_tick(ctx);
    if (snap_wait_tick(tick) && !tu_wait_at_least(&p->written, tick))
        atomic_fetch_add(&p->timeouts, 1);
    uint32_t expect = (uint32_t)(tick - 1);
    keel_iter it;
    keel_txn_iter(ctx, p->q, &it);
    while (keel_txn_next(ctx, &it)) {
        const uint32_t *c = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            if (c[r] != expect)
                atomic_fetch_add(&p->r_bad, 1);
            atomic_fetch_add(&p->r_rows, 1);
        }
    }
    for (uint32_t i = 0; i < SNAP_N; i += 7) {
        uint32_t v = 0;
        if (keel_txn_get(ctx, p->ents[i], p->C, &v) || v != expect)
            atomic_fetch_add(&p->r_bad, 1);
        atomic_fetch_add(&p->r_gets, 1);
    }
    return 0;
}

/* a snapshot query system, free-running beside both */
static int snap_qreader(keel_ctx *ctx, const keel_iter *it, void *user)
{
    snap_probe *p = user;
    uint32_t expect = (uint32_t)(keel_ctx_tick(ctx) - 1);
    const uint32_t *c = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++) {
        if (c[r] != expect)
            atomic_fetch_add(&p->qr_bad, 1);
        atomic_fetch_add(&p->qr_rows, 1);
    }
    return 0;
}

/* reads_fresh: ordered after the writer, sees this tick's value */
static int snap_fresh(keel_ctx *ctx, const keel_iter *it, void *user)
{
    snap_probe *p = user;
    uint32_t expect = (uint32_t)keel_ctx_tick(ctx);
    const uint32_t *c = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++) {
        uint32_t v = 0;
        if (c[r] != expect || keel_txn_get(ctx, it->entities[r], p->C, &v) || v != expect)
            atomic_fetch_add(&p->f_bad, 1);
        atomic_fetch_add(&p->f_rows, 1);
    }
    return 0;
}

static bool has_succ(const keel_schedule *sc, keel_system from, keel_system to)
{
    for (uint32_t k = sc->succ_off[from]; k < sc->succ_off[from + 1]; k++)
        if (sc->succ[k] == to)
            return true;
    return false;
}

START_TEST(test_snapshot_concurrent_writer)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 64}, .workers = 2, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static snap_probe p;
    memset(&p, 0, sizeof p);
    p.C = reg_u32(w, "C", KEEL_VERSIONED);
    spawn_rows(rt, SNAP_N, &p.C, (uint32_t[]){0}, 1, p.ents);
    for (uint32_t i = 0; i < SNAP_N; i++) /* start at 0: tick t's snapshot is then t - 1 for every t */
        ck_assert_ok(keel_set(w, p.ents[i], p.C, &(uint32_t){0}));
    p.q = tu_query_new(w, p.C, 0);

    keel_schedule *s = sched_new(rt);
    keel_system ws = add_sys(s, &(keel_system_desc){.name = "writer", .run = snap_writer, .user = &p,
                                                    .access = {.writes = {p.C}}});
    keel_system rs = add_sys(s, &(keel_system_desc){.name = "snap", .run = snap_reader, .user = &p,
                                                    .access = {.reads_snapshot = {p.C}}});
    keel_system qs = add_sys(s, &(keel_system_desc){.name = "snapq",
                                                    .kind = KEEL_SYSTEM_QUERY,
                                                    .each_chunk = snap_qreader,
                                                    .parallel = true,
                                                    .min_chunk_rows = 64,
                                                    .user = &p,
                                                    .query = {.with = {p.C}},
                                                    .access = {.reads_snapshot = {p.C}}});
    keel_system fs = add_sys(s, &(keel_system_desc){.name = "fresh",
                                                    .kind = KEEL_SYSTEM_QUERY,
                                                    .each_chunk = snap_fresh,
                                                    .user = &p,
                                                    .query = {.with = {p.C}},
                                                    .access = {.reads_fresh = {p.C}}});
    tu_install(rt, s);
    /* same phase, no edge between the writer and the snapshot readers; the
     * fresh reader is ordered after the writer */
    const keel_schedule *sc = rt->ex.sched;
    ck_assert(!has_succ(sc, ws, rs) && !has_succ(sc, rs, ws));
    ck_assert(!has_succ(sc, ws, qs) && !has_succ(sc, qs, ws));
    ck_assert(has_succ(sc, ws, fs));

    for (uint64_t tick = 1; tick <= SNAP_TICKS; tick++) {
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(atomic_load(&p.timeouts), 0);
    }
    ck_assert_uint_eq(atomic_load(&p.w_bad), 0);
    ck_assert_uint_eq(atomic_load(&p.r_bad), 0);
    ck_assert_uint_eq(atomic_load(&p.qr_bad), 0);
    ck_assert_uint_eq(atomic_load(&p.f_bad), 0);
    ck_assert_uint_eq(atomic_load(&p.r_rows), SNAP_TICKS * SNAP_N);
    ck_assert_uint_eq(atomic_load(&p.r_gets), SNAP_TICKS * ((SNAP_N + 6) / 7));
    ck_assert_uint_eq(atomic_load(&p.qr_rows), SNAP_TICKS * SNAP_N);
    ck_assert_uint_eq(atomic_load(&p.f_rows), SNAP_TICKS * SNAP_N);
    for (uint32_t t = 1; t <= 4; t++) {
        ck_assert_int_eq(tu_sysrec(rt, SNAP_TICKS - t, ws).skip, KEEL_SKIP_NONE);
        ck_assert_int_eq(tu_sysrec(rt, SNAP_TICKS - t, rs).skip, KEEL_SKIP_NONE);
    }
    for (uint32_t i = 0; i < SNAP_N; i++)
        ck_assert_uint_eq(get_u32(rt, p.ents[i], p.C), SNAP_TICKS);
    keel_query_destroy(p.q);
    keel_runtime_close(rt);
}
END_TEST

/* C = idx + tick (writer); D = snapshot(C) * 3 + tick (a reads_snapshot(C)
 * system beside it, writing D); one spawn every 10 ticks. */
typedef struct hash_probe {
    keel_component C, D;
    _Atomic uint32_t bad;
} hash_probe;

static int hash_wc(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    uint32_t *c = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++)
        c[r] = KEEL_ENTITY_INDEX(it->entities[r]) + tick;
    return 0;
}

static int hash_wd(keel_ctx *ctx, const keel_iter *it, void *user)
{
    hash_probe *p = user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    const uint32_t *c = it->columns[0];
    uint32_t *d = it->columns[1];
    for (uint32_t r = 0; r < it->count; r++) {
        uint32_t idx = KEEL_ENTITY_INDEX(it->entities[r]);
        /* the previous tick's C; 0 for a row spawned at the end of the previous tick */
        bool just_spawned = idx >= 1000 && c[r] == 0;
        if (!just_spawned && c[r] != idx + tick - 1)
            atomic_fetch_add(&p->bad, 1);
        d[r] = c[r] * 3 + tick;
    }
    if (tick % 10 == 0 && KEEL_ENTITY_INDEX(it->entities[0]) == 0)
        if (keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{p->C, NULL}, {p->D, NULL}}, 2))
            atomic_fetch_add(&p->bad, 1);
    return 0;
}

static uint64_t run_hash_world(int workers, uint32_t ticks, uint32_t *bad)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 64}, .workers = workers,
                                                     .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static hash_probe p;
    memset(&p, 0, sizeof p);
    p.C = reg_u32(w, "C", KEEL_VERSIONED);
    p.D = reg_u32(w, "D", KEEL_VERSIONED);
    keel_entity ents[1000];
    spawn_rows(rt, 1000, (keel_component[]){p.C, p.D}, (uint32_t[]){0, 0}, 2, ents);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "wc",
                                   .kind = KEEL_SYSTEM_QUERY,
                                   .each_chunk = hash_wc,
                                   .parallel = true,
                                   .min_chunk_rows = 64,
                                   .user = &p,
                                   .query = {.with = {p.C}},
                                   .access = {.writes = {p.C}}});
    add_sys(s, &(keel_system_desc){.name = "wd",
                                   .kind = KEEL_SYSTEM_QUERY,
                                   .each_chunk = hash_wd,
                                   .parallel = true,
                                   .min_chunk_rows = 64,
                                   .user = &p,
                                   .query = {.with = {p.C, p.D}},
                                   .access = {.reads_snapshot = {p.C}, .writes = {p.D}}});
    tu_install(rt, s);
    for (uint32_t t = 0; t < ticks; t++)
        ck_assert_ok(keel_runtime_step(rt));
    for (uint32_t i = 0; i < 1000; i++) {
        ck_assert_uint_eq(get_u32(rt, ents[i], p.C), i + ticks);
        ck_assert_uint_eq(get_u32(rt, ents[i], p.D), (i + ticks - 1) * 3 + ticks);
    }
    ck_assert_uint_eq(keel_world_count(w), 1000 + ticks / 10);
    *bad = atomic_load(&p.bad);
    uint64_t h = keel_world_hash(w);
    keel_runtime_close(rt);
    return h;
}

START_TEST(test_snapshot_hash_workers)
{
    uint32_t bad1 = 99, bad2 = 99;
    uint64_t h1 = run_hash_world(1, 50, &bad1);
    uint64_t h2 = run_hash_world(2, 50, &bad2);
    ck_assert_uint_eq(bad1, 0);
    ck_assert_uint_eq(bad2, 0);
    ck_assert_uint_eq(h1, h2);
    ck_assert_uint_ne(h1, 0);
    /* and it is a function of the history: one tick more differs */
    uint64_t h3 = run_hash_world(2, 51, &bad2);
    ck_assert_uint_ne(h3, h1);
}
END_TEST

/* ========================================================================== */
/* txn_uow                                                                    */
/* ========================================================================== */

typedef struct cap_row {
    keel_entity e;
    keel_component c;
    uint32_t size;
    uint32_t v;
} cap_row;

/* The captured value rows of the last step. */
static uint32_t captured(keel_runtime *rt, cap_row *out, uint32_t cap)
{
    size_t off = 0;
    uow_row r;
    uint32_t n = 0;
    while (uow_next_row(&rt->txn.uow, &off, &r)) {
        ck_assert_uint_lt(n, cap);
        out[n] = (cap_row){r.entity, r.component, r.size, 0};
        if (r.size == sizeof(uint32_t))
            memcpy(&out[n].v, r.value, sizeof(uint32_t));
        n++;
    }
    ck_assert_uint_eq(n, rt->txn.uow.nrows);
    ck_assert(!rt->txn.uow.oom);
    return n;
}

#define UOW_N 100

typedef struct uow_probe {
    keel_component P, Q, R;
    keel_entity ents[UOW_N];
    _Atomic uint32_t bad; /* pw and qfail run at the same time */
} uow_probe;

/* P: rows i%5==0 -> 1000+i (changed on tick 1, identical after), i%5==1 ->
 * rewritten with identical bytes, i%5==2 -> changed then changed back */
static int uow_pw(keel_ctx *ctx, void *user)
{
    uow_probe *p = user;
    for (uint32_t i = 0; i < UOW_N; i++) {
        int rc = 0;
        if (i % 5 == 0)
            rc = keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){1000 + i});
        else if (i % 5 == 1)
            rc = keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){i});
        else if (i % 5 == 2) {
            rc = keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){123456});
            rc |= keel_txn_set(ctx, p->ents[i], p->P, &(uint32_t){i});
        }
        if (rc)
            atomic_fetch_add(&p->bad, 1);
    }
    return 0;
}

/* Q: every row changed, then the system fails */
static int uow_qfail(keel_ctx *ctx, void *user)
{
    uow_probe *p = user;
    for (uint32_t i = 0; i < UOW_N; i++)
        if (keel_txn_set(ctx, p->ents[i], p->Q, &(uint32_t){7 + i * 2}))
            atomic_fetch_add(&p->bad, 1);
    return KEEL_EIO;
}

/* R rewritten: prev for every row except i%10==0 (+1) */
static int uow_rw(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    uint32_t *nw = it->columns[0];
    const uint32_t *prev = it->prev[0];
    for (uint32_t r = 0; r < it->count; r++)
        nw[r] = prev[r] + (KEEL_ENTITY_INDEX(it->entities[r]) % 10 == 0 && keel_ctx_tick(ctx) == 1);
    return 0;
}

START_TEST(test_uow_changed_rows_only)
{
    for (int workers = 1; workers <= 2; workers++) {
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                         .tick_rate_hz = -1});
        keel_world *w = keel_runtime_world(rt);
        static uow_probe p;
        memset(&p, 0, sizeof p);
        p.P = reg_u32(w, "P", KEEL_VERSIONED);
        p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
        p.R = reg_u32(w, "R", KEEL_VERSIONED);
        spawn_rows(rt, UOW_N, (keel_component[]){p.P, p.Q, p.R}, (uint32_t[]){0, 0, 0}, 3, p.ents);
        keel_schedule *s = sched_new(rt);
        /* registered first, runs after pw: rows follow the execution order (pw, rw, qfail) */
        add_sys(s, &(keel_system_desc){.name = "rw",
                                       .kind = KEEL_SYSTEM_QUERY,
                                       .each_chunk = uow_rw,
                                       .parallel = true,
                                       .min_chunk_rows = 16,
                                       .after = {"pw"},
                                       .query = {.with = {p.R}},
                                       .access = {.rewrites = {p.R}}});
        add_sys(s, &(keel_system_desc){.name = "pw", .run = uow_pw, .user = &p, .access = {.writes = {p.P}}});
        keel_system qf = add_sys(s, &(keel_system_desc){.name = "qfail", .run = uow_qfail, .user = &p,
                                                        .access = {.writes = {p.Q}}});
        tu_install(rt, s);
        rt->txn.uow.capture = true;

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(atomic_load(&p.bad), 0);
        ck_assert_int_eq(tu_sysrec(rt, 1, qf).skip, KEEL_SKIP_FAILED);
        static cap_row rows[4 * UOW_N];
        uint32_t n = captured(rt, rows, 4 * UOW_N);
        /* execution order (pw, rw; qfail failed), chunk order, row order */
        uint32_t k = 0;
        for (uint32_t i = 0; i < UOW_N; i += 5, k++) {
            ck_assert_uint_lt(k, n);
            ck_assert_uint_eq(rows[k].e, p.ents[i]);
            ck_assert_uint_eq(rows[k].c, p.P);
            ck_assert_uint_eq(rows[k].size, 4);
            ck_assert_uint_eq(rows[k].v, 1000 + i);
        }
        for (uint32_t i = 0; i < UOW_N; i += 10, k++) {
            ck_assert_uint_lt(k, n);
            ck_assert_uint_eq(rows[k].e, p.ents[i]);
            ck_assert_uint_eq(rows[k].c, p.R);
            ck_assert_uint_eq(rows[k].v, i + 1);
        }
        ck_assert_uint_eq(n, k); /* nothing else: no Q row, no identical-bytes row */
        ck_assert_uint_eq(n, UOW_N / 5 + UOW_N / 10);

        /* tick 2: the same writes are now identical bytes: nothing captured */
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(captured(rt, rows, 4 * UOW_N), 0);
        ck_assert_uint_eq(get_u32(rt, p.ents[5], p.P), 1005);
        ck_assert_uint_eq(get_u32(rt, p.ents[5], p.Q), 5);
        keel_runtime_close(rt);
    }
}
END_TEST

/* The capture's comparison for every value size it specialises (4, 8, 12,
 * 16: four rows at a time, then row by row) and two it does not (6, 20):
 * one changed byte, at a position that moves with the row (so every 4- and
 * 8-byte word of the specialised sizes holds one in some row), is found in
 * every position of a block of four and in the rows after the last whole
 * block; rows rewritten with identical bytes are not captured. */
#define DIFF_N 43 /* ten blocks of four rows, three after them (one chunk) */
#define DIFF_K 6

typedef struct diff_probe {
    keel_component c[DIFF_K];
    keel_entity ents[DIFF_N];
} diff_probe;

static const uint32_t diff_sizes[DIFF_K] = {4, 8, 12, 16, 6, 20};

static bool diff_changed(uint32_t k, uint32_t i)
{
    return (i * 7 + k) % 5 == 0 || i == DIFF_N - 1;
}

/* Entity i's value of component k; changed: byte i % size flipped. */
static void diff_value(uint32_t k, uint32_t i, bool changed, unsigned char *out)
{
    for (uint32_t b = 0; b < diff_sizes[k]; b++)
        out[b] = (unsigned char)(i * 31 + b * 7 + k);
    if (changed)
        out[i % diff_sizes[k]] ^= 0x80;
}

static int diff_write(keel_ctx *ctx, void *user)
{
    diff_probe *p = user;
    unsigned char v[32];
    for (uint32_t k = 0; k < DIFF_K; k++)
        for (uint32_t i = 0; i < DIFF_N; i++) {
            diff_value(k, i, diff_changed(k, i), v);
            int rc = keel_txn_set(ctx, p->ents[i], p->c[k], v);
            if (rc)
                return rc;
        }
    return 0;
}

START_TEST(test_uow_changed_rows_every_size)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 64}, .workers = 1, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static diff_probe p;
    keel_system_desc sys = {.name = "diff", .run = diff_write, .user = &p};
    for (uint32_t k = 0; k < DIFF_K; k++) {
        char name[8];
        snprintf(name, sizeof name, "D%u", k);
        keel_field f = {.name = "b", .type = KEEL_BYTES, .count = diff_sizes[k]};
        keel_component_desc d = {.name = name, .size = diff_sizes[k], .align = 4, .discipline = KEEL_VERSIONED,
                                 .fields = &f, .field_count = 1};
        if (diff_sizes[k] % 4)
            d.align = 2;
        ck_assert_ok(keel_component_register(w, &d, &p.c[k]));
        sys.access.writes[k] = p.c[k];
    }
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(w, &cb));
    static unsigned char vals[DIFF_N][DIFF_K][32];
    for (uint32_t i = 0; i < DIFF_N; i++) {
        keel_init in[DIFF_K];
        for (uint32_t k = 0; k < DIFF_K; k++) {
            diff_value(k, i, false, vals[i][k]);
            in[k] = (keel_init){p.c[k], vals[i][k]};
        }
        ck_assert_ok(keel_cmd_spawn(cb, in, DIFF_K));
    }
    ck_assert_ok(keel_cmdbuf_apply(cb));
    memcpy(p.ents, keel_cmdbuf_result(cb).created, sizeof p.ents);
    keel_cmdbuf_destroy(cb);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &sys);
    tu_install(rt, s);
    rt->txn.uow.capture = true;
    ck_assert_ok(keel_runtime_step(rt));

    /* in component order (registration), then row order */
    size_t off = 0;
    uow_row r;
    uint32_t n = 0;
    unsigned char want[32];
    for (uint32_t k = 0; k < DIFF_K; k++)
        for (uint32_t i = 0; i < DIFF_N; i++) {
            if (!diff_changed(k, i))
                continue;
            ck_assert_msg(uow_next_row(&rt->txn.uow, &off, &r), "size %u: row %u missing", diff_sizes[k], i);
            ck_assert_uint_eq(r.component, p.c[k]);
            ck_assert_uint_eq(r.size, diff_sizes[k]);
            ck_assert_msg(r.entity == p.ents[i], "size %u: row %u expected, another captured", diff_sizes[k], i);
            diff_value(k, i, true, want);
            ck_assert(memcmp(r.value, want, diff_sizes[k]) == 0);
            n++;
        }
    ck_assert(!uow_next_row(&rt->txn.uow, &off, &r)); /* nothing else */
    ck_assert_uint_eq(rt->txn.uow.nrows, n);
    keel_runtime_close(rt);
}
END_TEST

typedef struct svt_probe {
    keel_component S, T, V;
    keel_entity ents[40];
    int bad;
} svt_probe;

/* tick 1: S of entity 20 rewritten with its own value (chunk 1 dirty), every
 * T written; tick 2: nothing */
static int svt_write(keel_ctx *ctx, void *user)
{
    svt_probe *p = user;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    if (keel_txn_set(ctx, p->ents[20], p->S, &(uint32_t){100 + 20}))
        p->bad++;
    for (uint32_t i = 0; i < 40; i++)
        if (keel_txn_set(ctx, p->ents[i], p->T, &(uint32_t){999}))
            p->bad++;
    return 0;
}

/* tick 1: S of entity 35 (chunk 2) = 555, then fail: in place, so captured */
static int svt_fail(keel_ctx *ctx, void *user)
{
    svt_probe *p = user;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    if (keel_txn_set(ctx, p->ents[35], p->S, &(uint32_t){555}) ||
        keel_txn_set(ctx, p->ents[35], p->V, &(uint32_t){555}))
        p->bad++;
    return KEEL_EIO;
}

START_TEST(test_uow_single_version_and_transient)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 1, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static svt_probe p;
    memset(&p, 0, sizeof p);
    p.S = reg_u32(w, "S", KEEL_SINGLE_VERSION);
    p.T = reg_u32(w, "T", KEEL_TRANSIENT);
    p.V = reg_u32(w, "V", KEEL_VERSIONED);
    spawn_rows(rt, 40, (keel_component[]){p.S, p.T, p.V}, (uint32_t[]){100, 0, 0}, 3, p.ents);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "svt", .run = svt_write, .user = &p, .access = {.writes = {p.S, p.T}}});
    keel_system fs = add_sys(s, &(keel_system_desc){.name = "svtfail", .run = svt_fail, .user = &p,
                                                    .after = {"svt"}, .access = {.writes = {p.S, p.V}}});
    tu_install(rt, s);
    rt->txn.uow.capture = true;
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(p.bad, 0);
    ck_assert_int_eq(tu_sysrec(rt, 1, fs).skip, KEEL_SKIP_FAILED);
    static cap_row rows[200];
    uint32_t n = captured(rt, rows, 200);
    /* chunk 1 (rows 16..31) whole, then chunk 2 (rows 32..39) of the failed system */
    ck_assert_uint_eq(n, 16 + 8);
    for (uint32_t k = 0; k < 16; k++) {
        ck_assert_uint_eq(rows[k].e, p.ents[16 + k]);
        ck_assert_uint_eq(rows[k].c, p.S);
        ck_assert_uint_eq(rows[k].v, 100 + 16 + k);
    }
    for (uint32_t k = 0; k < 8; k++) {
        ck_assert_uint_eq(rows[16 + k].e, p.ents[32 + k]);
        ck_assert_uint_eq(rows[16 + k].c, p.S);
        ck_assert_uint_eq(rows[16 + k].v, 32 + k == 35 ? 555 : 100 + 32 + k);
    }
    ck_assert_uint_eq(get_u32(rt, p.ents[35], p.V), 35); /* VERSIONED rolled back */
    ck_assert_uint_eq(get_u32(rt, p.ents[7], p.T), 999);

    /* tick 2: nothing written, nothing captured (the dirty marks were reset) */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(captured(rt, rows, 200), 0);
    keel_runtime_close(rt);
}
END_TEST

typedef struct life_probe {
    keel_component P, Q;
    keel_entity e1, e2, e3;
    _Atomic int bad; /* "bad" runs beside "a" */
} life_probe;

static int life_a(keel_ctx *ctx, void *user)
{
    life_probe *p = user;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    atomic_fetch_or(&p->bad, keel_cmd_destroy(cb, p->e1) != 0);
    atomic_fetch_or(&p->bad, keel_cmd_spawn(cb, &(keel_init){p->P, &(uint32_t){5}}, 1) != 0);
    atomic_fetch_or(&p->bad, keel_cmd_add(cb, p->e2, p->Q, &(uint32_t){7}) != 0);
    atomic_fetch_or(&p->bad, keel_cmd_remove(cb, p->e3, p->P) != 0);
    return 0;
}

static int life_b(keel_ctx *ctx, void *user)
{
    life_probe *p = user;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    atomic_fetch_or(&p->bad, keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){p->P, &(uint32_t){6}}, 1) != 0);
    return 0;
}

static int life_bad(keel_ctx *ctx, void *user)
{
    life_probe *p = user;
    atomic_fetch_or(&p->bad, keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){p->P, &(uint32_t){66}}, 1) != 0);
    return KEEL_EIO;
}

/* The next op of the log, which must be a `kind` on e. */
static world_lifecycle_op next_op(const world_lifecycle_log *log, size_t *off, uint32_t kind, keel_entity e)
{
    world_lifecycle_op op;
    ck_assert(world_lifecycle_next(log, off, &op));
    ck_assert_uint_eq(op.kind, kind);
    ck_assert_uint_eq(op.entity, e);
    return op;
}

/* The first value an op carries, a u32. */
static uint32_t op_u32(const world_lifecycle_op *op)
{
    uint32_t v = 0;
    memcpy(&v, op->values, 4);
    return v;
}

START_TEST(test_uow_lifecycle_log)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static life_probe p;
    memset(&p, 0, sizeof p);
    p.P = reg_u32(w, "P", KEEL_VERSIONED);
    p.Q = reg_u32(w, "Q", KEEL_VERSIONED);
    keel_entity ents[4];
    spawn_rows(rt, 4, &p.P, (uint32_t[]){10}, 1, ents);
    p.e1 = ents[1];
    p.e2 = ents[2];
    p.e3 = ents[3];
    keel_schedule *s = sched_new(rt);
    /* registered out of execution order: the log follows the schedule */
    add_sys(s, &(keel_system_desc){.name = "b", .run = life_b, .user = &p, .after = {"a"}});
    add_sys(s, &(keel_system_desc){.name = "bad", .run = life_bad, .user = &p});
    add_sys(s, &(keel_system_desc){.name = "a", .run = life_a, .user = &p});
    tu_install(rt, s);
    rt->txn.uow.capture = true;
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(atomic_load(&p.bad), 0);

    const world_lifecycle_log *log = &rt->txn.uow.lifecycle;
    ck_assert_uint_eq(log->count, 5);
    size_t off = 0;
    next_op(log, &off, WORLD_OP_DESTROY, p.e1);
    /* destroy then spawn reuses the slot with the next generation */
    keel_entity reused = KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(p.e1), KEEL_ENTITY_GEN(p.e1) + 1);
    world_lifecycle_op op = next_op(log, &off, WORLD_OP_SPAWN, reused);
    ck_assert_uint_eq(op.n, 1);
    ck_assert_uint_eq(op.ids[0], p.P);
    ck_assert_uint_eq(op_u32(&op), 5);

    op = next_op(log, &off, WORLD_OP_ADD, p.e2);
    ck_assert_uint_eq(op.component, p.Q);
    ck_assert_uint_eq(op_u32(&op), 7);

    op = next_op(log, &off, WORLD_OP_REMOVE, p.e3);
    ck_assert_uint_eq(op.component, p.P);

    keel_entity fresh = KEEL_ENTITY_MAKE(4, 1);
    op = next_op(log, &off, WORLD_OP_SPAWN, fresh);
    ck_assert_uint_eq(op_u32(&op), 6);
    ck_assert(!world_lifecycle_next(log, &off, &op)); /* the failed system's spawn is not there */

    /* the handles in the log are the live ones */
    ck_assert(keel_alive(w, reused));
    ck_assert(keel_alive(w, fresh));
    ck_assert(!keel_alive(w, p.e1));
    ck_assert_uint_eq(get_u32(rt, reused, p.P), 5);
    ck_assert_uint_eq(get_u32(rt, fresh, p.P), 6);
    ck_assert_uint_eq(get_u32(rt, p.e2, p.Q), 7);
    ck_assert_int_eq(keel_has(w, p.e3, p.P), 0);
    ck_assert_uint_eq(keel_world_count(w), 5);
    /* structural commands capture no value rows */
    static cap_row rows[16];
    ck_assert_uint_eq(captured(rt, rows, 16), 0);

    /* next tick: only the failing system records, nothing is logged */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(rt->txn.uow.lifecycle.count, 0);
    ck_assert_uint_eq(keel_world_count(w), 5);
    keel_runtime_close(rt);
}
END_TEST

/* on_first_tick's value rows come first (before its commands) */
typedef struct uhook_probe {
    keel_component P;
    keel_entity ents[20];
} uhook_probe;

static int uhook_fn(keel_ctx *ctx, void *user)
{
    uhook_probe *p = user;
    int rc = keel_txn_set(ctx, p->ents[3], p->P, &(uint32_t){333});
    if (!rc)
        rc = keel_cmd_spawn(keel_ctx_commands(ctx), &(keel_init){p->P, &(uint32_t){1}}, 1);
    return rc;
}

static int uhook_sys(keel_ctx *ctx, void *user)
{
    uhook_probe *p = user;
    return keel_txn_set(ctx, p->ents[17], p->P, &(uint32_t){1717});
}

START_TEST(test_uow_hook_rows_first)
{
    static uhook_probe p;
    memset(&p, 0, sizeof p);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 1, .tick_rate_hz = -1,
                                                     .on_first_tick = uhook_fn, .hook_user = &p});
    keel_world *w = keel_runtime_world(rt);
    p.P = reg_u32(w, "P", KEEL_VERSIONED);
    spawn_rows(rt, 20, &p.P, (uint32_t[]){0}, 1, p.ents);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "sys", .run = uhook_sys, .user = &p, .access = {.writes = {p.P}}});
    tu_install(rt, s);
    rt->txn.uow.capture = true;
    ck_assert_ok(keel_runtime_step(rt));
    cap_row rows[8];
    uint32_t n = captured(rt, rows, 8);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(rows[0].e, p.ents[3]);
    ck_assert_uint_eq(rows[0].v, 333);
    ck_assert_uint_eq(rows[1].e, p.ents[17]);
    ck_assert_uint_eq(rows[1].v, 1717);
    size_t off = 0;
    uow_row r;
    ck_assert(uow_next_row(&rt->txn.uow, &off, &r));
    ck_assert_uint_eq(off, rt->txn.uow.hook_rows_end);
    ck_assert_uint_eq(rt->txn.uow.lifecycle.count, 1); /* the hook's spawn */
    keel_runtime_close(rt);
}
END_TEST

#define PD_N 2000
#define PD_TICKS 5

typedef struct pd_probe {
    keel_component A, B, C, D;
    keel_entity ents[PD_N];
} pd_probe;

static int pd_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    uint32_t mod = (uint32_t)(uintptr_t)user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    uint32_t *c = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++) {
        uint32_t idx = KEEL_ENTITY_INDEX(it->entities[r]);
        if ((idx + tick) % mod == 0)
            c[r] = tick * 100000 + idx * mod;
    }
    return 0;
}

static int pd_cb(keel_ctx *ctx, void *user)
{
    pd_probe *p = user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    for (uint32_t i = 0; i < PD_N; i += 7)
        if (keel_txn_set(ctx, p->ents[i], p->D, &(uint32_t){tick}))
            return KEEL_EIO;
    return 0;
}

typedef struct pd_result {
    cap_row *rows;
    uint32_t n;
    uint32_t per_comp[PD_TICKS + 1][5];
    uint32_t max_tasks;
} pd_result;

static void run_pd(int workers, pd_result *res)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                     .tick_rate_hz = -1});
    keel_world *w = keel_runtime_world(rt);
    static pd_probe p;
    memset(&p, 0, sizeof p);
    p.A = reg_u32(w, "A", KEEL_VERSIONED);
    p.B = reg_u32(w, "B", KEEL_VERSIONED);
    p.C = reg_u32(w, "C", KEEL_VERSIONED);
    p.D = reg_u32(w, "D", KEEL_VERSIONED);
    spawn_rows(rt, PD_N, (keel_component[]){p.A, p.B, p.C, p.D}, (uint32_t[]){0, 0, 0, 0}, 4, p.ents);
    keel_schedule *s = sched_new(rt);
    keel_component comps[3] = {p.A, p.B, p.C};
    const char *names[3] = {"qa", "qb", "qc"};
    keel_system sys[3];
    for (int k = 0; k < 3; k++)
        sys[k] = add_sys(s, &(keel_system_desc){.name = names[k],
                                                .kind = KEEL_SYSTEM_QUERY,
                                                .each_chunk = pd_chunk,
                                                .parallel = true,
                                                .min_chunk_rows = 16,
                                                .user = (void *)(uintptr_t)(3 + k),
                                                .query = {.with = {comps[k]}},
                                                .access = {.writes = {comps[k]}}});
    add_sys(s, &(keel_system_desc){.name = "cd", .run = pd_cb, .user = &p, .access = {.writes = {p.D}}});
    tu_install(rt, s);
    rt->txn.uow.capture = true;
    res->rows = malloc(PD_TICKS * 4 * PD_N * sizeof *res->rows);
    ck_assert_ptr_nonnull(res->rows);
    res->n = 0;
    memset(res->per_comp, 0, sizeof res->per_comp);
    res->max_tasks = 0;
    for (uint32_t tick = 1; tick <= PD_TICKS; tick++) {
        ck_assert_ok(keel_runtime_step(rt));
        uint32_t n = captured(rt, res->rows + res->n, PD_TICKS * 4 * PD_N - res->n);
        for (uint32_t i = 0; i < n; i++) {
            ck_assert_uint_ge(res->rows[res->n + i].c, p.A);
            ck_assert_uint_le(res->rows[res->n + i].c, p.D);
            res->per_comp[tick][res->rows[res->n + i].c]++;
        }
        res->n += n;
        for (int k = 0; k < 3; k++) {
            keel_system_record r = tu_sysrec(rt, tick, sys[k]);
            ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
            if (r.tasks > res->max_tasks)
                res->max_tasks = r.tasks;
        }
    }
    keel_runtime_close(rt);
}

START_TEST(test_uow_parallel_deterministic)
{
    static pd_result r1, r2;
    run_pd(1, &r1);
    run_pd(2, &r2);
    ck_assert_uint_eq(r1.max_tasks, 1);
    ck_assert_uint_gt(r2.max_tasks, 1);
    /* every system's changes are there, with the expected counts */
    for (uint32_t tick = 1; tick <= PD_TICKS; tick++) {
        for (uint32_t k = 0; k < 3; k++) {
            uint32_t mod = 3 + k, expect = 0;
            for (uint32_t i = 0; i < PD_N; i++)
                expect += (i + tick) % mod == 0; /* each write differs from every earlier value */
            ck_assert_uint_eq(r2.per_comp[tick][1 + k], expect);
            ck_assert_uint_eq(r1.per_comp[tick][1 + k], expect);
        }
        ck_assert_uint_eq(r2.per_comp[tick][4], (PD_N + 6) / 7);
    }
    ck_assert_uint_eq(r1.n, r2.n);
    for (uint32_t i = 0; i < r1.n; i++) {
        ck_assert_msg(r1.rows[i].e == r2.rows[i].e && r1.rows[i].c == r2.rows[i].c && r1.rows[i].v == r2.rows[i].v,
                      "row %u differs", i);
        ck_assert_uint_eq(r1.rows[i].size, 4);
    }
    free(r1.rows);
    free(r2.rows);
}
END_TEST

/* ========================================================================== */

static Suite *suite_txn_api(void)
{
    Suite *s = suite_create("txn_api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_api_get_set_errors);
    tcase_add_test(tc, test_api_direct_set_busy);
    tcase_add_test(tc, test_api_pipeline_build_rules);
    tcase_add_test(tc, test_api_rewrites_conflict);
    tcase_add_test(tc, test_api_query_term_is_read);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *suite_txn_cow(void)
{
    Suite *s = suite_create("txn_cow");
    TCase *tc = tcase_create("cow");
    tcase_add_test(tc, test_cow_visible_on_success);
    tcase_add_test(tc, test_cow_rollback_on_failure);
    tcase_add_test(tc, test_cow_parallel_one_task_fails);
    tcase_add_test(tc, test_cow_single_version_in_place);
    tcase_add_test(tc, test_cow_rewrites);
    tcase_add_test(tc, test_cow_read_your_writes);
    tcase_add_test(tc, test_cow_txn_iter_callback);
    tcase_add_test(tc, test_cow_first_tick_hook);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *suite_txn_snapshot(void)
{
    Suite *s = suite_create("txn_snapshot");
    TCase *tc = tcase_create("snapshot");
    tcase_add_test(tc, test_snapshot_concurrent_writer);
    tcase_add_test(tc, test_snapshot_hash_workers);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *suite_txn_uow(void)
{
    Suite *s = suite_create("txn_uow");
    TCase *tc = tcase_create("uow");
    tcase_add_test(tc, test_uow_changed_rows_only);
    tcase_add_test(tc, test_uow_changed_rows_every_size);
    tcase_add_test(tc, test_uow_single_version_and_transient);
    tcase_add_test(tc, test_uow_lifecycle_log);
    tcase_add_test(tc, test_uow_hook_rows_first);
    tcase_add_test(tc, test_uow_parallel_deterministic);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(suite_txn_api, suite_txn_cow, suite_txn_snapshot, suite_txn_uow)
