/*
 * test_side.c -- side transactions (keel/txn.h, docs/transactions.md
 * "Side transactions", the Engine-Pre phase of docs/scheduling.md):
 *
 *   side_basic       keel_side_txn_begin / _get / _set / _commit / _abort
 *                    inside systems: argument and access checks, reading
 *                    one's own writes, optimistic validation (conflicts,
 *                    blind writes), survival of a committed side transaction
 *                    when its system fails, visibility to the rest of the
 *                    system and to successors, abort of a transaction left
 *                    open, the runtime counters, the unit of work's side
 *                    records, and side writes into a chunk the system itself
 *                    writes;
 *   side_concurrent  a parallel query system moving money between a few
 *                    accounts from many chunk tasks at once: money is
 *                    conserved, every committed transfer is applied exactly
 *                    once (no lost update), the commit-ordered after-images
 *                    replay to the final state; side writes into chunks that
 *                    other tasks are writing through their system
 *                    transaction are never undone by the system's commit;
 *   side_submit      keel_submit from other threads: tickets, order, results,
 *                    aborts, timeouts, fire-and-forget, close with closures
 *                    still queued, bad arguments, and producers feeding the
 *                    TickDriver.
 *
 * No sleeps as synchronisation and no timing assertions. Bodies that run on
 * workers record what they see (serial bodies into a probe, parallel ones
 * into atomics); the test thread asserts after the step returned.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "runtime/runtime_internal.h"

/* ---- fixture helpers ------------------------------------------------------------ */

static const keel_field i64_fields[] = {{.name = "v", .type = KEEL_I64, .offset = 0, .count = 0}};
static const keel_field u32_fields[] = {{.name = "id", .type = KEEL_U32, .offset = 0, .count = 0}};

static keel_component reg_i64(keel_runtime *rt, const char *name, keel_discipline d)
{
    return tu_reg(keel_runtime_world(rt), name, 8, d, i64_fields, 1);
}

static keel_component reg_u32(keel_runtime *rt, const char *name)
{
    return tu_reg(keel_runtime_world(rt), name, 4, KEEL_VERSIONED, u32_fields, 1);
}

/* Spawn one entity with n i64 components (applied at once, between steps). */
static keel_entity spawn_i64(keel_runtime *rt, const keel_component *cs, const int64_t *vals, uint32_t n)
{
    keel_world *w = keel_runtime_world(rt);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(w, &cb));
    keel_init in[8];
    ck_assert_uint_le(n, 8);
    for (uint32_t i = 0; i < n; i++)
        in[i] = (keel_init){cs[i], &vals[i]};
    ck_assert_ok(keel_cmd_spawn(cb, in, n));
    keel_entity e;
    tu_cmdbuf_apply_created(cb, 1, &e);
    ck_assert(keel_alive(w, e));
    return e;
}

static keel_entity spawn1(keel_runtime *rt, keel_component c, int64_t v)
{
    return spawn_i64(rt, &c, &v, 1);
}

/* A handle that was live once and is stale now. */
static keel_entity spawn_stale(keel_runtime *rt, keel_component c)
{
    keel_entity e = spawn1(rt, c, 0);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(keel_runtime_world(rt), &cb));
    ck_assert_ok(keel_cmd_destroy(cb, e));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmdbuf_destroy(cb);
    ck_assert(!keel_alive(keel_runtime_world(rt), e));
    return e;
}

static int64_t geti(keel_runtime *rt, keel_entity e, keel_component c)
{
    int64_t v = -999999;
    ck_assert_ok(keel_get(keel_runtime_world(rt), e, c, &v));
    return v;
}

static keel_system add_cb(keel_schedule *s, const char *name, keel_system_fn fn, void *user, keel_access acc)
{
    keel_system_desc d = {.name = name, .kind = KEEL_SYSTEM_CALLBACK, .run = fn, .user = user, .access = acc};
    return add_sys(s, &d);
}

/* ---- the probe: what serial bodies saw ------------------------------------------- */

typedef struct probe_t {
    uint32_t checks, bad;
    char msg[512];
} probe_t;

static probe_t g_probe;

static void probe_rc(int line, int got, int want)
{
    g_probe.checks++;
    if (got != want && g_probe.bad++ == 0)
        snprintf(g_probe.msg, sizeof g_probe.msg, "line %d: got %s (%d), want %s: %s", line, keel_strerror(got), got,
                 keel_strerror(want), keel_last_error());
}

static void probe_i64(int line, int64_t got, int64_t want)
{
    g_probe.checks++;
    if (got != want && g_probe.bad++ == 0)
        snprintf(g_probe.msg, sizeof g_probe.msg, "line %d: got %lld, want %lld", line, (long long)got,
                 (long long)want);
}

#define EXPECT_RC(got, want) probe_rc(__LINE__, (got), (want))
#define EXPECT_I64(got, want) probe_i64(__LINE__, (int64_t)(got), (int64_t)(want))

static void probe_reset(void)
{
    memset(&g_probe, 0, sizeof g_probe);
}

/* The probe saw at least `min_checks` checks and none failed. */
static void probe_assert(uint32_t min_checks)
{
    ck_assert_msg(g_probe.bad == 0, "%u bad checks, first: %s", g_probe.bad, g_probe.msg);
    ck_assert_msg(g_probe.checks >= min_checks, "only %u checks ran (want >= %u)", g_probe.checks, min_checks);
}

/* Side read / write of an i64 with the probe checking the status. */
static int64_t sget(keel_side_txn *tx, keel_entity e, keel_component c, int line)
{
    int64_t v = -777777;
    probe_rc(line, keel_side_get(tx, e, c, &v), KEEL_OK);
    return v;
}
#define SGET(tx, e, c) sget((tx), (e), (c), __LINE__)
#define SSET(tx, e, c, val)                                      \
    do {                                                          \
        int64_t sset_v_ = (val);                                  \
        probe_rc(__LINE__, keel_side_set((tx), (e), (c), &sset_v_), KEEL_OK); \
    } while (0)

static int64_t wget(keel_ctx *ctx, keel_entity e, keel_component c, int line)
{
    int64_t v = -777777;
    probe_rc(line, keel_get(keel_ctx_world(ctx), e, c, &v), KEEL_OK);
    return v;
}
#define WGET(ctx, e, c) wget((ctx), (e), (c), __LINE__)

static int64_t tget(keel_ctx *ctx, keel_entity e, keel_component c, int line)
{
    int64_t v = -777777;
    probe_rc(line, keel_txn_get(ctx, e, c, &v), KEEL_OK);
    return v;
}
#define TGET(ctx, e, c) tget((ctx), (e), (c), __LINE__)

/* ---- side_basic: arguments and access ------------------------------------------------ */

typedef struct basic_env {
    keel_component X, Y, R, U, T, Z, W; /* writes, side_writes, reads, undeclared, TRANSIENT writes,
                                           rewrites, SINGLE_VERSION side_writes */
    keel_entity e1, e2, stale;
    uint32_t runs;
    int hook_rc;
    bool hook_tx_null;
} basic_env;

static basic_env g_b;

static int hook_try_side(keel_ctx *ctx, void *user)
{
    (void)user;
    keel_side_txn *tx = NULL;
    g_b.hook_rc = keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx);
    g_b.hook_tx_null = tx == NULL;
    if (tx) /* must not happen: do not leak it */
        keel_side_txn_abort(tx);
    return 0;
}

static int sys_arg_checks(keel_ctx *ctx, void *user)
{
    (void)user;
    g_b.runs++;
    keel_side_txn *tx = NULL;
    /* bad modes and NULL out */
    EXPECT_RC(keel_side_txn_begin(ctx, (keel_durability)4, &tx), KEEL_EINVAL);
    EXPECT_RC(keel_side_txn_begin(ctx, (keel_durability)-1, &tx), KEEL_EINVAL);
    EXPECT_I64(tx == NULL, 1);
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, NULL), KEEL_EINVAL);
    EXPECT_RC(keel_side_txn_begin(NULL, KEEL_DURABLE_DEFAULT, &tx), KEEL_EINVAL);
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx), KEEL_OK);
    if (!tx)
        return 0;
    int64_t v = 5;
    /* writes only to writes / rewrites / side_writes, never TRANSIENT */
    EXPECT_RC(keel_side_set(tx, g_b.e1, g_b.R, &v), KEEL_EINVAL); /* declared reads only */
    EXPECT_RC(keel_side_set(tx, g_b.e1, g_b.U, &v), KEEL_EINVAL); /* undeclared */
    EXPECT_RC(keel_side_set(tx, g_b.e1, g_b.T, &v), KEEL_EINVAL); /* TRANSIENT, declared writes */
    EXPECT_RC(keel_side_set(tx, g_b.e1, 200, &v), KEEL_EINVAL);   /* not registered */
    EXPECT_RC(keel_side_set(tx, g_b.e1, 0, &v), KEEL_EINVAL);
    EXPECT_RC(keel_side_set(tx, g_b.e1, g_b.X, NULL), KEEL_EINVAL);
    EXPECT_RC(keel_side_set(NULL, g_b.e1, g_b.X, &v), KEEL_EINVAL);
    /* reads of any declared component, not of an undeclared one */
    EXPECT_RC(keel_side_get(tx, g_b.e1, g_b.U, &v), KEEL_EINVAL);
    EXPECT_RC(keel_side_get(tx, g_b.e1, 200, &v), KEEL_EINVAL);
    EXPECT_RC(keel_side_get(tx, g_b.e1, g_b.X, NULL), KEEL_EINVAL);
    EXPECT_RC(keel_side_get(NULL, g_b.e1, g_b.X, &v), KEEL_EINVAL);
    EXPECT_I64(SGET(tx, g_b.e1, g_b.R), 30);
    EXPECT_I64(SGET(tx, g_b.e1, g_b.T), 50); /* reading TRANSIENT is fine */
    /* stale, null and missing */
    EXPECT_RC(keel_side_get(tx, g_b.stale, g_b.X, &v), KEEL_ESTALE);
    EXPECT_RC(keel_side_set(tx, g_b.stale, g_b.X, &v), KEEL_ESTALE);
    EXPECT_RC(keel_side_get(tx, KEEL_ENTITY_NULL, g_b.Y, &v), KEEL_ESTALE);
    EXPECT_RC(keel_side_set(tx, KEEL_ENTITY_NULL, g_b.Y, &v), KEEL_ESTALE);
    EXPECT_RC(keel_side_get(tx, g_b.e2, g_b.Y, &v), KEEL_ENOENT); /* e2 has X only */
    EXPECT_RC(keel_side_set(tx, g_b.e2, g_b.Y, &v), KEEL_ENOENT);
    /* the system transaction may not write a side_writes-only component */
    v = 9;
    EXPECT_RC(keel_txn_set(ctx, g_b.e1, g_b.Y, &v), KEEL_EINVAL);
    /* the allowed writes: writes, side_writes, rewrites, a SINGLE_VERSION side_writes */
    SSET(tx, g_b.e1, g_b.X, 111);
    SSET(tx, g_b.e1, g_b.Y, 222);
    SSET(tx, g_b.e1, g_b.Z, 333);
    SSET(tx, g_b.e1, g_b.W, 444);
    SSET(tx, g_b.e2, g_b.X, 555);
    /* nothing applied before the commit, and the failed calls left no trace */
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.X), 10);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.Y), 20);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.R), 30);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.U), 40);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.Z), 60);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.W), 70);
    EXPECT_I64(WGET(ctx, g_b.e2, g_b.X), 80);
    EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.X), 111);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.Y), 222);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.Z), 333);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.W), 444);
    EXPECT_I64(WGET(ctx, g_b.e2, g_b.X), 555);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.R), 30);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.U), 40);
    EXPECT_I64(WGET(ctx, g_b.e1, g_b.T), 50);
    return 0;
}

static void basic_setup(keel_runtime *rt)
{
    memset(&g_b, 0, sizeof g_b);
    probe_reset();
    g_b.X = reg_i64(rt, "x", KEEL_VERSIONED);
    g_b.Y = reg_i64(rt, "y", KEEL_VERSIONED);
    g_b.R = reg_i64(rt, "r", KEEL_VERSIONED);
    g_b.U = reg_i64(rt, "u", KEEL_VERSIONED);
    g_b.T = reg_i64(rt, "t", KEEL_TRANSIENT);
    g_b.Z = reg_i64(rt, "z", KEEL_VERSIONED);
    g_b.W = reg_i64(rt, "w", KEEL_SINGLE_VERSION);
    keel_component cs[] = {g_b.X, g_b.Y, g_b.R, g_b.U, g_b.T, g_b.Z, g_b.W};
    int64_t vals[] = {10, 20, 30, 40, 50, 60, 70};
    g_b.e1 = spawn_i64(rt, cs, vals, 7);
    g_b.e2 = spawn1(rt, g_b.X, 80);
    g_b.stale = spawn_stale(rt, g_b.X);
}

/* A runtime with `workers` workers and 16-row chunks that only the test
 * steps (no tick rate). */
static keel_runtime *stepped_rt(int workers)
{
    return tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers, .tick_rate_hz = -1});
}

START_TEST(test_side_args_and_access)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 1, .tick_rate_hz = -1,
                                                     .on_first_tick = hook_try_side});
    basic_setup(rt);
    g_b.hook_rc = 12345;
    keel_schedule *s = sched_new(rt);
    keel_access a = {.reads = {g_b.R}, .writes = {g_b.X, g_b.T}, .rewrites = {g_b.Z}, .side_writes = {g_b.Y, g_b.W}};
    add_cb(s, "checks", sys_arg_checks, NULL, a);
    tu_install(rt, s);
    /* NULL context outside any system */
    keel_side_txn *tx = NULL;
    ck_assert_rc(keel_side_txn_begin(NULL, KEEL_DURABLE_DEFAULT, &tx), KEEL_EINVAL);
    ck_assert_ptr_null(tx);
    ck_assert_rc(keel_side_txn_commit(NULL), KEEL_EINVAL);
    keel_side_txn_abort(NULL); /* ignored */
    ck_assert_ok(keel_runtime_step(rt));
    /* on_first_tick has a transaction but no system: refused */
    ck_assert_rc(g_b.hook_rc, KEEL_EINVAL);
    ck_assert(g_b.hook_tx_null);
    ck_assert_uint_eq(g_b.runs, 1);
    probe_assert(50);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.X), 111);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.Y), 222);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.Z), 333);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.W), 444);
    ck_assert_int_eq(geti(rt, g_b.e2, g_b.X), 555);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.R), 30);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.U), 40);
    ck_assert_int_eq(geti(rt, g_b.e1, g_b.T), 50);
    keel_runtime_close(rt);
}
END_TEST

/* ---- side_basic: own writes, visibility to the system and its successors -------------- */

static struct {
    keel_component X, Y;
    keel_entity e;
    int mode;          /* 0 succeed, 1 fail by return, 2 fail by keel_txn_fail */
    uint32_t writer_runs, reader_runs;
    int64_t reader_x, reader_y;
} g_v;

static int sys_side_writer(keel_ctx *ctx, void *user)
{
    (void)user;
    g_v.writer_runs++;
    int64_t t = (int64_t)keel_ctx_tick(ctx);
    int64_t y0 = 100 * (t - 1); /* what the previous tick committed */
    int64_t x0 = WGET(ctx, g_v.e, g_v.X);
    /* the system's own VERSIONED write */
    int64_t xv = g_v.mode ? 7777 : 10 * t;
    EXPECT_RC(keel_txn_set(ctx, g_v.e, g_v.X, &xv), KEEL_OK);
    keel_side_txn *tx = NULL;
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx), KEEL_OK);
    if (!tx)
        return 0;
    EXPECT_I64(SGET(tx, g_v.e, g_v.Y), y0);
    SSET(tx, g_v.e, g_v.Y, 1);
    EXPECT_I64(SGET(tx, g_v.e, g_v.Y), 1); /* its own buffered write */
    SSET(tx, g_v.e, g_v.Y, 100 * t);        /* overwrite it */
    EXPECT_I64(SGET(tx, g_v.e, g_v.Y), 100 * t);
    /* a side transaction reads committed values, not the system's private write */
    EXPECT_I64(SGET(tx, g_v.e, g_v.X), x0);
    /* nothing visible yet */
    EXPECT_I64(WGET(ctx, g_v.e, g_v.Y), y0);
    EXPECT_I64(TGET(ctx, g_v.e, g_v.Y), y0);
    EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
    /* visible to the rest of its own system at once */
    EXPECT_I64(TGET(ctx, g_v.e, g_v.Y), 100 * t);
    EXPECT_I64(WGET(ctx, g_v.e, g_v.Y), 100 * t);
    EXPECT_I64(TGET(ctx, g_v.e, g_v.X), xv); /* and the system still sees its own write */
    if (g_v.mode == 1)
        return KEEL_EIO;
    if (g_v.mode == 2)
        keel_txn_fail(ctx, KEEL_EIO);
    return 0;
}

static int sys_side_reader(keel_ctx *ctx, void *user)
{
    (void)user;
    g_v.reader_runs++;
    g_v.reader_x = TGET(ctx, g_v.e, g_v.X);
    g_v.reader_y = TGET(ctx, g_v.e, g_v.Y);
    return 0;
}

START_TEST(test_side_visibility_and_failure)
{
    static const int workers[] = {1, 2};
    for (int wi = 0; wi < 2; wi++) {
        memset(&g_v, 0, sizeof g_v);
        probe_reset();
        keel_runtime *rt = stepped_rt(workers[wi]);
        g_v.X = reg_i64(rt, "x", KEEL_VERSIONED);
        g_v.Y = reg_i64(rt, "y", KEEL_VERSIONED);
        keel_component cs[] = {g_v.X, g_v.Y};
        int64_t vals[] = {0, 0};
        g_v.e = spawn_i64(rt, cs, vals, 2);
        keel_schedule *s = sched_new(rt);
        keel_system reader = add_cb(s, "reader", sys_side_reader, NULL,
                                    (keel_access){.reads_fresh = {g_v.X, g_v.Y}}); /* registered first */
        keel_system writer =
            add_cb(s, "writer", sys_side_writer, NULL, (keel_access){.writes = {g_v.X}, .side_writes = {g_v.Y}});
        tu_install(rt, s);

        /* tick 1: success; the successor sees the system's and the side transaction's writes */
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(g_v.writer_runs, 1);
        ck_assert_uint_eq(g_v.reader_runs, 1);
        ck_assert_int_eq(g_v.reader_x, 10);
        ck_assert_int_eq(g_v.reader_y, 100);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.X), 10);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.Y), 100);

        /* tick 2: the system fails after its side commit (error return) */
        g_v.mode = 1;
        keel_runtime_stats before = tu_stats(rt);
        ck_assert_ok(keel_runtime_step(rt));
        keel_runtime_stats after = tu_stats(rt);
        ck_assert_uint_eq(g_v.writer_runs, 2);
        ck_assert_uint_eq(g_v.reader_runs, 1); /* skipped */
        ck_assert_int_eq(geti(rt, g_v.e, g_v.X), 10);  /* the system's write vanished */
        ck_assert_int_eq(geti(rt, g_v.e, g_v.Y), 200); /* the side commit stayed */
        keel_system_record sr;
        ck_assert_ok(keel_telemetry_system(rt, 2, writer, &sr));
        ck_assert_int_eq(sr.skip, KEEL_SKIP_FAILED);
        ck_assert_ok(keel_telemetry_system(rt, 2, reader, &sr));
        ck_assert_int_eq(sr.skip, KEEL_SKIP_DEPENDENCY_FAILED);
        keel_tick_record tr;
        ck_assert_ok(keel_telemetry_tick(rt, 2, &tr));
        ck_assert_uint_eq(tr.side_txns, 1);
        ck_assert_uint_eq(after.commits - before.commits, 1); /* the side commit, not the system */
        ck_assert_uint_eq(after.aborts - before.aborts, 1);   /* the system's rollback */
        ck_assert_uint_eq(after.conflicts - before.conflicts, 0);

        /* tick 3: fails through keel_txn_fail after the side commit */
        g_v.mode = 2;
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(g_v.writer_runs, 3);
        ck_assert_uint_eq(g_v.reader_runs, 1);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.X), 10);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.Y), 300);
        ck_assert_ok(keel_telemetry_system(rt, 3, writer, &sr));
        ck_assert_int_eq(sr.skip, KEEL_SKIP_FAILED);

        /* tick 4: success again */
        g_v.mode = 0;
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(g_v.reader_runs, 2);
        ck_assert_int_eq(g_v.reader_x, 40);
        ck_assert_int_eq(g_v.reader_y, 400);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.X), 40);
        ck_assert_int_eq(geti(rt, g_v.e, g_v.Y), 400);
        probe_assert(4 * 12);
        keel_runtime_close(rt);
    }
}
END_TEST

/* ---- side_basic: validation -------------------------------------------------------- */

static struct {
    keel_component B;
    keel_entity x, y;
    uint32_t runs;
} g_c;

static keel_side_txn *begin_tx(keel_ctx *ctx, int line)
{
    keel_side_txn *tx = NULL;
    probe_rc(line, keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx), KEEL_OK);
    return tx;
}
#define BEGIN(ctx) begin_tx((ctx), __LINE__)

static int sys_conflicts(keel_ctx *ctx, void *user)
{
    (void)user;
    g_c.runs++;
    keel_entity x = g_c.x, y = g_c.y;
    keel_component B = g_c.B;
    /* A reads x; B reads and writes x and commits; A writes x and y: conflict,
     * nothing of A applied */
    keel_side_txn *a = BEGIN(ctx), *b = BEGIN(ctx);
    if (!a || !b)
        return 0;
    EXPECT_I64(SGET(a, x, B), 100);
    EXPECT_I64(SGET(b, x, B), 100);
    SSET(b, x, B, 150);
    EXPECT_RC(keel_side_txn_commit(b), KEEL_OK);
    SSET(a, x, B, 90);
    SSET(a, y, B, 1000);
    EXPECT_RC(keel_side_txn_commit(a), KEEL_ECONFLICT);
    EXPECT_I64(WGET(ctx, x, B), 150);
    EXPECT_I64(WGET(ctx, y, B), 200);

    /* a read-only transaction whose read moved conflicts too */
    keel_side_txn *c = BEGIN(ctx), *d = BEGIN(ctx);
    EXPECT_I64(SGET(c, x, B), 150);
    EXPECT_I64(SGET(d, x, B), 150);
    SSET(d, x, B, 160);
    EXPECT_RC(keel_side_txn_commit(d), KEEL_OK);
    EXPECT_RC(keel_side_txn_commit(c), KEEL_ECONFLICT);

    /* a change to a row it did not read does not conflict */
    keel_side_txn *e = BEGIN(ctx), *f = BEGIN(ctx);
    EXPECT_I64(SGET(e, y, B), 200);
    EXPECT_I64(SGET(f, x, B), 160);
    SSET(f, x, B, 170);
    EXPECT_RC(keel_side_txn_commit(f), KEEL_OK);
    SSET(e, y, B, 210);
    EXPECT_RC(keel_side_txn_commit(e), KEEL_OK);
    EXPECT_I64(WGET(ctx, x, B), 170);
    EXPECT_I64(WGET(ctx, y, B), 210);

    /* a blind write never conflicts, even when the row moved meanwhile */
    keel_side_txn *g = BEGIN(ctx);
    SSET(g, x, B, 7);
    keel_side_txn *h = BEGIN(ctx);
    EXPECT_I64(SGET(h, x, B), 170);
    SSET(h, x, B, 180);
    EXPECT_RC(keel_side_txn_commit(h), KEEL_OK);
    EXPECT_I64(WGET(ctx, x, B), 180);
    EXPECT_RC(keel_side_txn_commit(g), KEEL_OK);
    EXPECT_I64(WGET(ctx, x, B), 7);

    /* reading one's own blind write records no read either */
    keel_side_txn *i = BEGIN(ctx);
    SSET(i, y, B, 300);
    EXPECT_I64(SGET(i, y, B), 300);
    keel_side_txn *j = BEGIN(ctx);
    EXPECT_I64(SGET(j, y, B), 210);
    SSET(j, y, B, 220);
    EXPECT_RC(keel_side_txn_commit(j), KEEL_OK);
    EXPECT_RC(keel_side_txn_commit(i), KEEL_OK);
    EXPECT_I64(WGET(ctx, y, B), 300);

    /* an explicit abort applies nothing */
    keel_side_txn *k = BEGIN(ctx);
    EXPECT_I64(SGET(k, x, B), 7);
    SSET(k, x, B, 12345);
    keel_side_txn_abort(k);
    EXPECT_I64(WGET(ctx, x, B), 7);
    /* 8 side commits, 2 conflicts, 1 abort */
    return 0;
}

START_TEST(test_side_conflict_and_blind_write)
{
    memset(&g_c, 0, sizeof g_c);
    probe_reset();
    keel_runtime *rt = stepped_rt(2);
    g_c.B = reg_i64(rt, "balance", KEEL_VERSIONED);
    g_c.x = spawn1(rt, g_c.B, 100);
    g_c.y = spawn1(rt, g_c.B, 200);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "conflicts", sys_conflicts, NULL, (keel_access){.side_writes = {g_c.B}});
    tu_install(rt, s);
    keel_runtime_stats before = tu_stats(rt);
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_stats after = tu_stats(rt);
    ck_assert_uint_eq(g_c.runs, 1);
    probe_assert(40);
    ck_assert_int_eq(geti(rt, g_c.x, g_c.B), 7);
    ck_assert_int_eq(geti(rt, g_c.y, g_c.B), 300);
    ck_assert_uint_eq(after.conflicts - before.conflicts, 2);
    ck_assert_uint_eq(after.commits - before.commits, 8 + 1); /* side commits + the system's */
    ck_assert_uint_eq(after.aborts - before.aborts, 1);
    keel_tick_record tr;
    ck_assert_ok(keel_telemetry_tick(rt, 1, &tr));
    ck_assert_uint_eq(tr.side_txns, 8);
    /* row versions are per tick: the next tick starts clean and the same
     * pattern yields the same outcome */
    keel_world *w = keel_runtime_world(rt);
    int64_t v = 100;
    ck_assert_ok(keel_set(w, g_c.x, g_c.B, &v));
    v = 200;
    ck_assert_ok(keel_set(w, g_c.y, g_c.B, &v));
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_stats after2 = tu_stats(rt);
    probe_assert(80);
    ck_assert_uint_eq(after2.conflicts - after.conflicts, 2);
    ck_assert_int_eq(geti(rt, g_c.x, g_c.B), 7);
    ck_assert_int_eq(geti(rt, g_c.y, g_c.B), 300);
    keel_runtime_close(rt);
}
END_TEST

/* ---- side_basic: a transaction left open is aborted ------------------------------------ */

static struct {
    keel_component Y;
    keel_entity a, b;
    int mode;  /* 0: leave open; 1: leave open and fail; 2: commit one, leave one open */
    uint32_t runs;
} g_lo;

static int sys_left_open(keel_ctx *ctx, void *user)
{
    (void)user;
    g_lo.runs++;
    keel_side_txn *tx = BEGIN(ctx);
    if (!tx)
        return 0;
    if (g_lo.mode == 2) {
        keel_side_txn *done = BEGIN(ctx);
        if (done) {
            SSET(done, g_lo.b, g_lo.Y, 42);
            EXPECT_RC(keel_side_txn_commit(done), KEEL_OK);
        }
    }
    EXPECT_I64(SGET(tx, g_lo.a, g_lo.Y), 1);
    SSET(tx, g_lo.a, g_lo.Y, 555);
    return g_lo.mode == 1 ? KEEL_EIO : 0; /* tx never ended */
}

/* Counts the side_txn_left_open warnings naming the system. */
static _Atomic uint32_t g_left_open_logs, g_other_logs;

static void log_left_open(const keel_log_event *ev, void *user)
{
    (void)user;
    if (ev->level == KEEL_LOG_WARN && !strcmp(ev->subsystem, "txn") && !strcmp(ev->event, "side_txn_left_open") &&
        strstr(ev->fields, "system=leaves_open"))
        atomic_fetch_add(&g_left_open_logs, 1);
    else
        atomic_fetch_add(&g_other_logs, 1);
}

static void log_quiet(const keel_log_event *ev, void *user)
{
    (void)ev;
    (void)user;
}

START_TEST(test_side_left_open_aborted)
{
    memset(&g_lo, 0, sizeof g_lo);
    probe_reset();
    atomic_store(&g_left_open_logs, 0);
    atomic_store(&g_other_logs, 0);
    keel_log_set(log_left_open, NULL, KEEL_LOG_DEBUG);
    keel_runtime *rt = stepped_rt(1);
    g_lo.Y = reg_i64(rt, "y", KEEL_VERSIONED);
    g_lo.a = spawn1(rt, g_lo.Y, 1);
    g_lo.b = spawn1(rt, g_lo.Y, 2);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "leaves_open", sys_left_open, NULL, (keel_access){.side_writes = {g_lo.Y}});
    tu_install(rt, s);
    for (int mode = 0; mode < 3; mode++) {
        g_lo.mode = mode;
        keel_runtime_stats before = tu_stats(rt);
        ck_assert_ok(keel_runtime_step(rt));
        keel_runtime_stats after = tu_stats(rt);
        ck_assert_uint_eq(g_lo.runs, (uint32_t)mode + 1);
        ck_assert_int_eq(geti(rt, g_lo.a, g_lo.Y), 1); /* the open transaction applied nothing */
        ck_assert_int_eq(geti(rt, g_lo.b, g_lo.Y), mode == 2 ? 42 : 2);
        keel_tick_record tr;
        ck_assert_ok(keel_telemetry_tick(rt, (uint64_t)mode + 1, &tr));
        ck_assert_uint_eq(tr.side_txns, mode == 2 ? 1 : 0);
        ck_assert_uint_eq(rt->txn.uow.nside, mode == 2 ? 1 : 0);
        /* the left-open side transaction counts as aborted (plus the
         * system's rollback when it failed) */
        ck_assert_msg(after.aborts - before.aborts == (mode == 1 ? 2u : 1u),
                      "mode %d: aborts grew by %llu", mode, (unsigned long long)(after.aborts - before.aborts));
        ck_assert_uint_eq(after.commits - before.commits, (mode == 1 ? 0u : 1u) + (mode == 2 ? 1u : 0u));
        ck_assert_uint_eq(atomic_load(&g_left_open_logs), (uint32_t)mode + 1); /* one warning each */
    }
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
    ck_assert_uint_eq(atomic_load(&g_other_logs), 0);
    probe_assert(3 * 3);
    keel_runtime_close(rt);
}
END_TEST

/* ---- side_basic: the unit of work's side records ----------------------------------------- */

typedef struct side_rec {
    uint64_t seq, tick;
    keel_durability mode;
    uint32_t n;
    keel_entity e[4];
    keel_component c[4];
    uint32_t size[4];
    int64_t v[4];
} side_rec;

/* Decode the unit of work's side records (at most max). */
static uint32_t read_side_records(const keel_runtime *rt, side_rec *out, uint32_t max)
{
    const txn_uow *u = &rt->txn.uow;
    size_t off = 0, woff = 0;
    uow_side sd;
    uint32_t n = 0;
    while (uow_next_side(u, &off, &sd, &woff)) {
        ck_assert_uint_lt(n, max);
        side_rec *r = &out[n++];
        memset(r, 0, sizeof *r);
        r->seq = sd.seq;
        r->tick = sd.tick;
        r->mode = sd.mode;
        r->n = sd.nwrites;
        ck_assert_uint_le(sd.nwrites, 4);
        for (uint32_t i = 0; i < sd.nwrites; i++) {
            uow_row row;
            ck_assert(uow_next_side_row(u, &woff, &row));
            r->e[i] = row.entity;
            r->c[i] = row.component;
            r->size[i] = row.size;
            if (row.size == 8)
                memcpy(&r->v[i], row.value, 8);
        }
        ck_assert_uint_eq(woff, off); /* the rows end where the next record starts */
    }
    ck_assert_uint_eq(n, u->nside);
    return n;
}

static struct {
    keel_component B, C;
    keel_entity x, y;
    uint32_t runs;
} g_u;

static int sys_uow(keel_ctx *ctx, void *user)
{
    (void)user;
    g_u.runs++;
    int64_t t = (int64_t)keel_ctx_tick(ctx);
    if (t == 3)
        return 0; /* no side transaction this tick */
    keel_side_txn *tx = NULL;
    /* 1: IMMEDIATE, x and y */
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx), KEEL_OK);
    if (!tx)
        return 0;
    int64_t x0 = SGET(tx, g_u.x, g_u.B);
    SSET(tx, g_u.x, g_u.B, 1000 * t + 1);
    SSET(tx, g_u.y, g_u.C, 1000 * t + 2);
    EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
    /* read-only, IMMEDIATE: validated and committed, not recorded */
    keel_side_txn *ro = NULL;
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &ro), KEEL_OK);
    if (!ro)
        return 0;
    EXPECT_I64(SGET(ro, g_u.x, g_u.B), 1000 * t + 1);
    EXPECT_I64(SGET(ro, g_u.y, g_u.C), 1000 * t + 2);
    EXPECT_RC(keel_side_txn_commit(ro), KEEL_OK);
    /* conflicting: not recorded; a read-only one is validated too */
    keel_side_txn *a = BEGIN(ctx), *b = BEGIN(ctx), *r = BEGIN(ctx);
    EXPECT_I64(SGET(a, g_u.x, g_u.B), 1000 * t + 1);
    EXPECT_I64(SGET(b, g_u.x, g_u.B), 1000 * t + 1);
    EXPECT_I64(SGET(r, g_u.x, g_u.B), 1000 * t + 1);
    SSET(b, g_u.x, g_u.B, 1000 * t + 3); /* 2: DEFAULT (the runtime's: DEFERRED) */
    SSET(a, g_u.y, g_u.B, -1);
    EXPECT_RC(keel_side_txn_commit(b), KEEL_OK);
    EXPECT_RC(keel_side_txn_commit(a), KEEL_ECONFLICT);
    EXPECT_RC(keel_side_txn_commit(r), KEEL_ECONFLICT);
    /* aborted: not recorded */
    keel_side_txn *c = BEGIN(ctx);
    SSET(c, g_u.x, g_u.B, -2);
    keel_side_txn_abort(c);
    /* left open: not recorded */
    keel_side_txn *o = BEGIN(ctx);
    SSET(o, g_u.y, g_u.C, -3);
    /* 3: GROUP, a blind write of y then x */
    keel_side_txn *d = NULL;
    EXPECT_RC(keel_side_txn_begin(ctx, KEEL_DURABLE_GROUP, &d), KEEL_OK);
    if (!d)
        return 0;
    SSET(d, g_u.y, g_u.B, 1000 * t + 4);
    SSET(d, g_u.x, g_u.B, 1000 * t + 5);
    SSET(d, g_u.y, g_u.B, 1000 * t + 6); /* overwrites its own write: one after-image */
    EXPECT_RC(keel_side_txn_commit(d), KEEL_OK);
    (void)x0;
    return 0;
}

START_TEST(test_side_uow_records)
{
    memset(&g_u, 0, sizeof g_u);
    probe_reset();
    keel_log_set(log_quiet, NULL, KEEL_LOG_WARN); /* the system leaves one transaction open on purpose */
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = -1,
                                                     .durability = KEEL_DURABLE_DEFERRED});
    g_u.B = reg_i64(rt, "b", KEEL_VERSIONED);
    g_u.C = reg_i64(rt, "c", KEEL_SINGLE_VERSION);
    keel_component cs[] = {g_u.B, g_u.C};
    int64_t vals[] = {5, 6};
    g_u.x = spawn_i64(rt, cs, vals, 2);
    g_u.y = spawn_i64(rt, cs, vals, 2);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "uow", sys_uow, NULL, (keel_access){.side_writes = {g_u.B, g_u.C}});
    tu_install(rt, s);
    uint64_t last_seq = 0;
    for (int64_t t = 1; t <= 4; t++) {
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(keel_runtime_tick(rt), (uint64_t)t);
        side_rec r[8];
        uint32_t n = read_side_records(rt, r, 8);
        if (t == 3) {
            ck_assert_uint_eq(n, 0); /* the previous tick's records are gone */
            ck_assert_uint_eq(rt->txn.uow.side_len, 0);
            continue;
        }
        ck_assert_uint_eq(n, 3);
        for (uint32_t i = 0; i < n; i++) {
            ck_assert_uint_gt(r[i].seq, last_seq);
            last_seq = r[i].seq;
            ck_assert_uint_eq(r[i].tick, (uint64_t)t);
            for (uint32_t k = 0; k < r[i].n; k++)
                ck_assert_uint_eq(r[i].size[k], 8);
        }
        ck_assert_int_eq(r[0].mode, KEEL_DURABLE_IMMEDIATE);
        ck_assert_uint_eq(r[0].n, 2);
        ck_assert(r[0].e[0] == g_u.x && r[0].c[0] == g_u.B);
        ck_assert_int_eq(r[0].v[0], 1000 * t + 1);
        ck_assert(r[0].e[1] == g_u.y && r[0].c[1] == g_u.C);
        ck_assert_int_eq(r[0].v[1], 1000 * t + 2);
        ck_assert_uint_eq(r[1].seq, r[0].seq + 1); /* the read-only commit between them took no number */
        ck_assert_int_eq(r[1].mode, KEEL_DURABLE_DEFERRED); /* DEFAULT resolved to the runtime's mode */
        ck_assert_uint_eq(r[1].n, 1);
        ck_assert(r[1].e[0] == g_u.x && r[1].c[0] == g_u.B);
        ck_assert_int_eq(r[1].v[0], 1000 * t + 3);
        ck_assert_int_eq(r[2].mode, KEEL_DURABLE_GROUP);
        ck_assert_uint_eq(r[2].n, 2);
        ck_assert(r[2].e[0] == g_u.y && r[2].c[0] == g_u.B);
        ck_assert_int_eq(r[2].v[0], 1000 * t + 6);
        ck_assert(r[2].e[1] == g_u.x && r[2].c[1] == g_u.B);
        ck_assert_int_eq(r[2].v[1], 1000 * t + 5);
        /* the world agrees with the last after-images */
        ck_assert_int_eq(geti(rt, g_u.x, g_u.B), 1000 * t + 5);
        ck_assert_int_eq(geti(rt, g_u.y, g_u.B), 1000 * t + 6);
        ck_assert_int_eq(geti(rt, g_u.y, g_u.C), 1000 * t + 2);
        ck_assert_int_eq(geti(rt, g_u.x, g_u.C), 6);
    }
    ck_assert_uint_eq(g_u.runs, 4);
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
    probe_assert(3 * 15);
    keel_runtime_close(rt);
}
END_TEST

/* ---- side_basic: a side write into a chunk the system writes ---------------------------------- */

static struct {
    keel_component X;
    keel_entity e[4];
    keel_query *q;
    uint32_t runs;
} g_m;

static int sys_mixed(keel_ctx *ctx, void *user)
{
    (void)user;
    g_m.runs++;
    uint64_t t = keel_ctx_tick(ctx);
    keel_component X = g_m.X;
    int64_t v;
    keel_side_txn *tx;
    switch (t) {
    case 1: /* the system's private version first, then the side commit */
        v = 100;
        EXPECT_RC(keel_txn_set(ctx, g_m.e[0], X, &v), KEEL_OK);
        tx = BEGIN(ctx);
        if (!tx)
            return 0;
        EXPECT_I64(SGET(tx, g_m.e[1], X), 2);
        SSET(tx, g_m.e[1], X, 200);
        EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
        EXPECT_I64(TGET(ctx, g_m.e[1], X), 200); /* seen through the private version */
        EXPECT_I64(TGET(ctx, g_m.e[0], X), 100);
        return 0;
    case 2: /* the side commit first, then the system's private version */
        tx = BEGIN(ctx);
        if (!tx)
            return 0;
        SSET(tx, g_m.e[2], X, 300);
        EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
        v = 400;
        EXPECT_RC(keel_txn_set(ctx, g_m.e[3], X, &v), KEEL_OK);
        EXPECT_I64(TGET(ctx, g_m.e[2], X), 300);
        return 0;
    case 3: /* the system fails: its write vanishes, the side write stays */
        v = 111;
        EXPECT_RC(keel_txn_set(ctx, g_m.e[0], X, &v), KEEL_OK);
        tx = BEGIN(ctx);
        if (!tx)
            return 0;
        SSET(tx, g_m.e[1], X, 222);
        EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
        return KEEL_EIO;
    case 4: { /* the private version made by iteration, written through the column */
        keel_iter it;
        uint32_t rows = 0;
        keel_txn_iter(ctx, g_m.q, &it);
        while (keel_txn_next(ctx, &it)) {
            int64_t *col = KEEL_COLUMN(&it, int64_t, 0);
            for (uint32_t r = 0; r < it.count; r++, rows++)
                if (it.entities[r] == g_m.e[0])
                    col[r] = 1000;
            tx = BEGIN(ctx);
            if (!tx)
                return 0;
            SSET(tx, g_m.e[3], X, 4000);
            EXPECT_RC(keel_side_txn_commit(tx), KEEL_OK);
            for (uint32_t r = 0; r < it.count; r++)
                if (it.entities[r] == g_m.e[3])
                    EXPECT_I64(col[r], 4000); /* the column is the private version: updated too */
        }
        EXPECT_I64(rows, 4);
        return 0;
    }
    default:
        return 0;
    }
}

START_TEST(test_side_same_chunk_as_system_write)
{
    static const int workers[] = {1, 2};
    for (int wi = 0; wi < 2; wi++) {
        memset(&g_m, 0, sizeof g_m);
        probe_reset();
        keel_runtime *rt = stepped_rt(workers[wi]);
        g_m.X = reg_i64(rt, "x", KEEL_VERSIONED);
        for (int i = 0; i < 4; i++)
            g_m.e[i] = spawn1(rt, g_m.X, i + 1);
        /* one chunk holds all four rows */
        keel_world *w = keel_runtime_world(rt);
        for (int i = 0; i < 4; i++) {
            const world_slot *sl = world_slot_of(w, g_m.e[i]);
            ck_assert_ptr_nonnull(sl);
            ck_assert_uint_eq(sl->table, world_slot_of(w, g_m.e[0])->table);
            ck_assert_uint_eq(sl->row >> w->chunk_shift, 0);
        }
        ck_assert_ok(keel_query_create(w, &(keel_query_desc){.with = {g_m.X}}, &g_m.q));
        keel_schedule *s = sched_new(rt);
        add_cb(s, "mixed", sys_mixed, NULL, (keel_access){.writes = {g_m.X}});
        tu_install(rt, s);

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(geti(rt, g_m.e[0], g_m.X), 100);
        ck_assert_int_eq(geti(rt, g_m.e[1], g_m.X), 200);
        ck_assert_int_eq(geti(rt, g_m.e[2], g_m.X), 3);
        ck_assert_int_eq(geti(rt, g_m.e[3], g_m.X), 4);

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(geti(rt, g_m.e[0], g_m.X), 100);
        ck_assert_int_eq(geti(rt, g_m.e[1], g_m.X), 200);
        ck_assert_int_eq(geti(rt, g_m.e[2], g_m.X), 300);
        ck_assert_int_eq(geti(rt, g_m.e[3], g_m.X), 400);

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(geti(rt, g_m.e[0], g_m.X), 100); /* rolled back */
        ck_assert_int_eq(geti(rt, g_m.e[1], g_m.X), 222); /* kept */
        ck_assert_int_eq(geti(rt, g_m.e[2], g_m.X), 300);
        ck_assert_int_eq(geti(rt, g_m.e[3], g_m.X), 400);

        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(geti(rt, g_m.e[0], g_m.X), 1000);
        ck_assert_int_eq(geti(rt, g_m.e[1], g_m.X), 222);
        ck_assert_int_eq(geti(rt, g_m.e[2], g_m.X), 300);
        ck_assert_int_eq(geti(rt, g_m.e[3], g_m.X), 4000);
        ck_assert_uint_eq(g_m.runs, 4);
        probe_assert(15);
        keel_query_destroy(g_m.q);
        keel_runtime_close(rt);
    }
}
END_TEST

static Suite *side_basic(void)
{
    const TTest *const t[] = {test_side_args_and_access, test_side_visibility_and_failure,
                              test_side_conflict_and_blind_write, test_side_left_open_aborted, test_side_uow_records,
                              test_side_same_chunk_as_system_write};
    return tu_case_suite("side_basic", "basic", t, sizeof t / sizeof t[0]);
}

/* ---- side_concurrent: transfers from many chunk tasks ----------------------------------------- */

enum { NACC = 8, NTRADERS = 4096, CT_TICKS = 12, ACC_INIT = 10000 };

static struct {
    keel_component bal, tid;
    keel_entity acc[NACC];
    _Atomic int64_t credits[NACC], debits[NACC];
    _Atomic uint64_t ok, conflicts, insufficient, bad, chunks;
    _Atomic int first_bad;
} g_ct;

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void ct_bad(int rc)
{
    int none = 0;
    atomic_compare_exchange_strong(&g_ct.first_bad, &none, rc ? rc : 1);
    atomic_fetch_add(&g_ct.bad, 1);
}

static int transfer_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    atomic_fetch_add(&g_ct.chunks, 1);
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    uint64_t tick = keel_ctx_tick(ctx);
    for (uint32_t r = 0; r < it->count; r++) {
        uint64_t h = mix64(tick * 1000003u + ids[r]);
        uint32_t from = (uint32_t)(h % NACC);
        uint32_t to = (uint32_t)((h >> 8) % (NACC - 1));
        if (to >= from)
            to++;
        int64_t amt = 1 + (int64_t)((h >> 16) % 400);
        keel_side_txn *tx = NULL;
        int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx);
        if (rc) {
            ct_bad(rc);
            continue;
        }
        int64_t fb = -1, tb = -1;
        if ((rc = keel_side_get(tx, g_ct.acc[from], g_ct.bal, &fb)) ||
            (rc = keel_side_get(tx, g_ct.acc[to], g_ct.bal, &tb))) {
            keel_side_txn_abort(tx);
            ct_bad(rc);
            continue;
        }
        if (fb < 0 || tb < 0)
            ct_bad(0);
        if (fb < amt) {
            keel_side_txn_abort(tx);
            atomic_fetch_add(&g_ct.insufficient, 1);
            continue;
        }
        fb -= amt;
        tb += amt;
        if ((rc = keel_side_set(tx, g_ct.acc[from], g_ct.bal, &fb)) ||
            (rc = keel_side_set(tx, g_ct.acc[to], g_ct.bal, &tb))) {
            keel_side_txn_abort(tx);
            ct_bad(rc);
            continue;
        }
        rc = keel_side_txn_commit(tx);
        if (rc == KEEL_OK) {
            atomic_fetch_add(&g_ct.ok, 1);
            atomic_fetch_add(&g_ct.credits[to], amt);
            atomic_fetch_add(&g_ct.debits[from], amt);
        } else if (rc == KEEL_ECONFLICT) {
            atomic_fetch_add(&g_ct.conflicts, 1);
        } else {
            ct_bad(rc);
        }
    }
    return 0;
}

static void ct_reset(void)
{
    memset(g_ct.acc, 0, sizeof g_ct.acc);
    for (int i = 0; i < NACC; i++) {
        atomic_store(&g_ct.credits[i], 0);
        atomic_store(&g_ct.debits[i], 0);
    }
    atomic_store(&g_ct.ok, 0);
    atomic_store(&g_ct.conflicts, 0);
    atomic_store(&g_ct.insufficient, 0);
    atomic_store(&g_ct.bad, 0);
    atomic_store(&g_ct.chunks, 0);
    atomic_store(&g_ct.first_bad, 0);
}

/* Spawn n entities with a u32 id 0..n-1 (plus an i64 `extra` component of
 * value 0 when extra != 0); handles in out (may be NULL). */
static void spawn_traders(keel_runtime *rt, keel_component tid, keel_component extra, uint32_t n, keel_entity *out)
{
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(keel_runtime_world(rt), &cb));
    int64_t zero = 0;
    for (uint32_t i = 0; i < n; i++) {
        keel_init in[2] = {{tid, &i}, {extra, &zero}};
        ck_assert_ok(keel_cmd_spawn(cb, in, extra ? 2 : 1));
    }
    tu_cmdbuf_apply_created(cb, n, out);
}

START_TEST(test_side_concurrent_transfers)
{
    ct_reset();
    keel_runtime *rt = stepped_rt(2);
    g_ct.bal = reg_i64(rt, "balance", KEEL_VERSIONED);
    g_ct.tid = reg_u32(rt, "trader");
    for (int i = 0; i < NACC; i++)
        g_ct.acc[i] = spawn1(rt, g_ct.bal, ACC_INIT);
    spawn_traders(rt, g_ct.tid, 0, NTRADERS, NULL);
    keel_schedule *s = sched_new(rt);
    keel_system_desc d = {
        .name = "traders",
        .kind = KEEL_SYSTEM_QUERY,
        .each_chunk = transfer_chunk,
        .query = {.with = {g_ct.tid}},
        .parallel = true,
        .min_chunk_rows = 16,
        .access = {.side_writes = {g_ct.bal}},
    };
    keel_system sys = add_sys(s, &d);
    tu_install(rt, s);

    side_rec *recs = malloc(NTRADERS * sizeof *recs);
    ck_assert_ptr_nonnull(recs);
    uint64_t last_seq = 0, prev_ok = 0, prev_conf = 0, prev_insuf = 0;
    for (uint64_t t = 1; t <= CT_TICKS; t++) {
        int64_t start[NACC];
        for (int i = 0; i < NACC; i++)
            start[i] = geti(rt, g_ct.acc[i], g_ct.bal);
        keel_runtime_stats before = tu_stats(rt);
        ck_assert_ok(keel_runtime_step(rt));
        keel_runtime_stats after = tu_stats(rt);
        ck_assert_msg(atomic_load(&g_ct.bad) == 0, "%llu unexpected results, first %s",
                      (unsigned long long)atomic_load(&g_ct.bad), keel_strerror(atomic_load(&g_ct.first_bad)));
        uint64_t ok = atomic_load(&g_ct.ok), conf = atomic_load(&g_ct.conflicts);
        uint64_t insuf = atomic_load(&g_ct.insufficient);
        uint64_t tick_ok = ok - prev_ok;
        /* every row attempted one transfer */
        ck_assert_uint_eq(tick_ok + (conf - prev_conf) + (insuf - prev_insuf), NTRADERS);
        /* money is conserved; each balance is exactly what the committed transfers made it */
        int64_t total = 0;
        for (int i = 0; i < NACC; i++) {
            int64_t b = geti(rt, g_ct.acc[i], g_ct.bal);
            ck_assert_int_ge(b, 0);
            total += b;
            int64_t want = ACC_INIT + atomic_load(&g_ct.credits[i]) - atomic_load(&g_ct.debits[i]);
            ck_assert_msg(b == want, "tick %llu: account %d holds %lld, committed transfers say %lld",
                          (unsigned long long)t, i, (long long)b, (long long)want);
        }
        ck_assert_int_eq(total, (int64_t)NACC * ACC_INIT);
        /* counters */
        ck_assert_uint_eq(after.conflicts - before.conflicts, conf - prev_conf);
        ck_assert_uint_eq(after.commits - before.commits, tick_ok + 1); /* + the system transaction */
        ck_assert_uint_eq(after.aborts - before.aborts, insuf - prev_insuf);
        keel_tick_record tr;
        ck_assert_ok(keel_telemetry_tick(rt, t, &tr));
        ck_assert_uint_eq(tr.side_txns, tick_ok);
        keel_system_record sr;
        ck_assert_ok(keel_telemetry_system(rt, t, sys, &sr));
        ck_assert_uint_eq(sr.rows, NTRADERS);
        ck_assert_uint_gt(sr.tasks, 1);
        ck_assert_int_eq(sr.skip, KEEL_SKIP_NONE);
        /* the after-images, replayed in commit order from the tick-start
         * balances, conserve money after every record and end at the final
         * balances: commits were serialised and none was lost */
        uint32_t n = read_side_records(rt, recs, NTRADERS);
        ck_assert_uint_eq(n, tick_ok);
        int64_t bal[NACC];
        memcpy(bal, start, sizeof bal);
        for (uint32_t k = 0; k < n; k++) {
            ck_assert_uint_gt(recs[k].seq, last_seq);
            last_seq = recs[k].seq;
            ck_assert_uint_eq(recs[k].tick, t);
            ck_assert_uint_eq(recs[k].n, 2);
            for (uint32_t j = 0; j < 2; j++) {
                ck_assert_uint_eq(recs[k].c[j], g_ct.bal);
                int a = -1;
                for (int i = 0; i < NACC; i++)
                    if (g_ct.acc[i] == recs[k].e[j])
                        a = i;
                ck_assert_int_ge(a, 0);
                bal[a] = recs[k].v[j];
            }
            int64_t sum = 0;
            for (int i = 0; i < NACC; i++)
                sum += bal[i];
            ck_assert_int_eq(sum, (int64_t)NACC * ACC_INIT);
        }
        for (int i = 0; i < NACC; i++)
            ck_assert_int_eq(bal[i], geti(rt, g_ct.acc[i], g_ct.bal));
        prev_ok = ok;
        prev_conf = conf;
        prev_insuf = insuf;
    }
    ck_assert_uint_gt(atomic_load(&g_ct.ok), 0);
    ck_assert_uint_eq(atomic_load(&g_ct.chunks), (uint64_t)CT_TICKS * (NTRADERS / 16));
    free(recs);
    keel_runtime_close(rt);
}
END_TEST

/* ---- side_concurrent: side writes into chunks other tasks write ------------------------------- */

enum { SC_N = 4096, SC_TICKS = 10, SC_RETRIES = 100000 };

static struct {
    keel_component tid, score;
    keel_entity tr[SC_N];
    _Atomic uint64_t ok, conflicts, bad;
    _Atomic int first_bad;
} g_sc;

/* One side increment of score(e), retried on conflict. */
static void sc_increment(keel_ctx *ctx, keel_entity e)
{
    for (int attempt = 0; attempt < SC_RETRIES; attempt++) {
        keel_side_txn *tx = NULL;
        int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx);
        int64_t v = 0;
        if (!rc && (rc = keel_side_get(tx, e, g_sc.score, &v)) == 0) {
            v++;
            rc = keel_side_set(tx, e, g_sc.score, &v);
        }
        if (!rc)
            rc = keel_side_txn_commit(tx);
        else if (tx)
            keel_side_txn_abort(tx);
        if (rc == KEEL_OK) {
            atomic_fetch_add(&g_sc.ok, 1);
            return;
        }
        if (rc != KEEL_ECONFLICT)
            break;
        atomic_fetch_add(&g_sc.conflicts, 1);
    }
    int none = 0;
    atomic_compare_exchange_strong(&g_sc.first_bad, &none, 1);
    atomic_fetch_add(&g_sc.bad, 1);
}

/* Even rows: +1 through the system transaction (the column is the task's
 * private version). Odd rows: +1 by side transactions from the row before
 * (same chunk, same task) and from a row half the table away (another
 * task's chunk, written concurrently). */
static int score_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    int64_t *score = KEEL_COLUMN(it, int64_t, 1);
    for (uint32_t r = 0; r < it->count; r++) {
        uint32_t i = ids[r];
        if (i % 2)
            continue;
        score[r] += 1;
        sc_increment(ctx, g_sc.tr[i + 1]);
        sc_increment(ctx, g_sc.tr[(i + SC_N / 2 + 1) % SC_N]);
    }
    return 0;
}

START_TEST(test_side_concurrent_same_chunks)
{
    memset(g_sc.tr, 0, sizeof g_sc.tr);
    atomic_store(&g_sc.ok, 0);
    atomic_store(&g_sc.conflicts, 0);
    atomic_store(&g_sc.bad, 0);
    atomic_store(&g_sc.first_bad, 0);
    keel_runtime *rt = stepped_rt(2);
    g_sc.tid = reg_u32(rt, "trader");
    g_sc.score = reg_i64(rt, "score", KEEL_VERSIONED);
    spawn_traders(rt, g_sc.tid, g_sc.score, SC_N, g_sc.tr);
    keel_schedule *s = sched_new(rt);
    keel_system_desc d = {
        .name = "score",
        .kind = KEEL_SYSTEM_QUERY,
        .each_chunk = score_chunk,
        .query = {.with = {g_sc.tid, g_sc.score}},
        .parallel = true,
        .min_chunk_rows = 16,
        .access = {.writes = {g_sc.score}},
    };
    keel_system sys = add_sys(s, &d);
    tu_install(rt, s);
    keel_world *w = keel_runtime_world(rt);
    for (int64_t t = 1; t <= SC_TICKS; t++) {
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(atomic_load(&g_sc.bad), 0);
        keel_system_record sr;
        ck_assert_ok(keel_telemetry_system(rt, (uint64_t)t, sys, &sr));
        ck_assert_int_eq(sr.skip, KEEL_SKIP_NONE);
        ck_assert_uint_gt(sr.tasks, 1);
        uint32_t wrong = 0, first = 0;
        int64_t first_v = 0;
        for (uint32_t i = 0; i < SC_N; i++) {
            int64_t v = -1;
            ck_assert_ok(keel_get(w, g_sc.tr[i], g_sc.score, &v));
            int64_t want = i % 2 ? 2 * t : t;
            if (v != want && wrong++ == 0) {
                first = i;
                first_v = v;
            }
        }
        ck_assert_msg(wrong == 0, "tick %lld: %u scores wrong, first trader %u = %lld (want %lld)", (long long)t,
                      wrong, first, (long long)first_v, (long long)(first % 2 ? 2 * t : t));
    }
    ck_assert_uint_eq(atomic_load(&g_sc.ok), (uint64_t)SC_TICKS * SC_N);
    keel_runtime_stats st = tu_stats(rt);
    ck_assert_uint_eq(st.conflicts, atomic_load(&g_sc.conflicts));
    keel_runtime_close(rt);
}
END_TEST

/* ---- side reads of a snapshot reader beside the component's writers -------------------------------- */

#define SR_N 256
#define SR_TICKS 60

static struct {
    keel_component v;
    keel_entity e[SR_N];
    _Atomic uint64_t w2_started; /* the tick whose second writer has started */
    _Atomic uint64_t reading;    /* the tick whose reader has read once */
    _Atomic uint32_t bad, read_w1;
} g_sr;

/* Writer k (1 or 2) sets every entity's v to tick * 10 + k. */
static int sr_write(keel_ctx *ctx, void *user)
{
    int64_t k = (int64_t)(uintptr_t)user, t = (int64_t)keel_ctx_tick(ctx), x = t * 10 + k;
    if (k == 2)
        atomic_store(&g_sr.w2_started, (uint64_t)t);
    for (uint32_t i = 0; i < SR_N; i++) {
        int rc = keel_txn_set(ctx, g_sr.e[i], g_sr.v, &x);
        if (rc)
            return rc;
    }
    /* the second commits while the reader reads (a rendezvous, bounded) */
    for (uint64_t until = tu_now_ns() + 5000000000ull; k == 2 && atomic_load(&g_sr.reading) < (uint64_t)t &&
                                                       tu_now_ns() < until;)
        sched_yield();
    return 0;
}

/* reads_snapshot(v), beside both writers: once the second has started
 * (the first committed its version), side reads of v see a committed value
 * of this tick -- the first writer's, whose buffer the second's commit
 * frees, or the second's -- never garbage. */
static int sr_read(keel_ctx *ctx, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx), until = tu_now_ns() + 60000000000ull;
    while (atomic_load(&g_sr.w2_started) < t && tu_now_ns() < until) /* a rendezvous, bounded */
        sched_yield();
    keel_side_txn *tx = NULL;
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_GROUP, &tx);
    for (uint32_t round = 0; !rc && round < 8; round++) {
        if (round == 1)
            atomic_store(&g_sr.reading, t);
        for (uint32_t i = 0; !rc && i < SR_N; i++) {
            int64_t x = -1;
            if ((rc = keel_side_get(tx, g_sr.e[i], g_sr.v, &x)))
                break;
            if (x == (int64_t)t * 10 + 1)
                atomic_fetch_add(&g_sr.read_w1, 1);
            else if (x != (int64_t)t * 10 + 2)
                atomic_fetch_add(&g_sr.bad, 1);
        }
    }
    if (tx)
        keel_side_txn_abort(tx);
    return rc;
}

/* A system that reads a component's snapshot may run beside its writers,
 * and its side transactions read the latest committed version (`cur`),
 * which a writer's commit replaces and frees: the read and the swap meet on
 * the chunk column's lock (txn/txn.c), so no read lands in a freed buffer
 * (under TSan in CI: a read unordered with that free is reported). */
START_TEST(test_side_reads_beside_writer_commits)
{
    memset(&g_sr, 0, sizeof g_sr);
    keel_runtime *rt = stepped_rt(2);
    g_sr.v = reg_i64(rt, "v", KEEL_VERSIONED);
    int64_t zero = 0;
    for (uint32_t i = 0; i < SR_N; i++)
        g_sr.e[i] = spawn_i64(rt, &g_sr.v, &zero, 1);
    keel_schedule *s = sched_new(rt);
    keel_system_desc w1 = {.name = "w1", .kind = KEEL_SYSTEM_CALLBACK, .run = sr_write, .user = (void *)(uintptr_t)1,
                           .access = {.writes = {g_sr.v}}};
    keel_system_desc w2 = w1;
    w2.name = "w2";
    w2.user = (void *)(uintptr_t)2;
    w2.phase = 1;
    add_sys(s, &w1);
    add_sys(s, &w2);
    add_cb(s, "reader", sr_read, NULL, (keel_access){.reads_snapshot = {g_sr.v}});
    tu_install(rt, s);
    for (int t = 1; t <= SR_TICKS; t++)
        ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(atomic_load(&g_sr.bad), 0);
    int64_t x = 0;
    ck_assert_ok(keel_get(keel_runtime_world(rt), g_sr.e[0], g_sr.v, &x));
    ck_assert_int_eq(x, SR_TICKS * 10 + 2);
    keel_runtime_close(rt);
}
END_TEST

static Suite *side_concurrent(void)
{
    Suite *s = suite_create("side_concurrent");
    TCase *tc = tcase_create("concurrent");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_side_concurrent_transfers);
    tcase_add_test(tc, test_side_concurrent_same_chunks);
    tcase_add_test(tc, test_side_reads_beside_writer_commits);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- side_submit ------------------------------------------------------------------------------ */

enum { SUB_THREADS = 4, SUB_PER = 40 };

typedef struct sub_arg {
    uint32_t thread, seq;
} sub_arg;

static struct {
    keel_runtime *rt;
    keel_component cnt, poison;
    keel_entity counter[SUB_THREADS];
    /* written by closures: on the stepping thread only */
    uint32_t log_thread[SUB_THREADS * SUB_PER], log_seq[SUB_THREADS * SUB_PER];
    uint32_t nlog;
    pthread_barrier_t submitted;
} g_sub;

static keel_durability sub_mode(uint32_t seq)
{
    return (keel_durability)(seq % 4); /* DEFAULT, IMMEDIATE, GROUP, DEFERRED */
}

static bool sub_aborts(uint32_t seq)
{
    return seq % 5 == 4;
}

/* Increment the thread's counter; every fifth also poisons it and aborts. */
static int closure_count(keel_side_txn *tx, void *arg)
{
    const sub_arg *a = arg;
    g_sub.log_thread[g_sub.nlog] = a->thread;
    g_sub.log_seq[g_sub.nlog] = a->seq;
    g_sub.nlog++;
    keel_entity e = g_sub.counter[a->thread];
    int64_t v;
    int rc = keel_side_get(tx, e, g_sub.cnt, &v);
    if (rc)
        return rc;
    v++;
    if ((rc = keel_side_set(tx, e, g_sub.cnt, &v)))
        return rc;
    if (sub_aborts(a->seq)) {
        int64_t p = 666;
        if ((rc = keel_side_set(tx, e, g_sub.poison, &p)))
            return rc;
        return 1000 + (int)a->seq;
    }
    return 0;
}

typedef struct producer {
    uint32_t id;
    sub_arg args[SUB_PER];
    keel_ticket *tickets[SUB_PER];
    int submit_rc[SUB_PER];
    int early, results[SUB_PER], again;
} producer;

static void *producer_order(void *p)
{
    producer *pr = p;
    for (uint32_t k = 0; k < SUB_PER; k++) {
        pr->args[k] = (sub_arg){pr->id, k};
        pr->tickets[k] = NULL;
        pr->submit_rc[k] = keel_submit(g_sub.rt, closure_count, &pr->args[k], sub_mode(k), &pr->tickets[k]);
    }
    /* no step can have run yet: the test thread steps after the barrier */
    pr->early = pr->tickets[SUB_PER - 1] ? keel_ticket_wait(pr->tickets[SUB_PER - 1], 0) : -100;
    pthread_barrier_wait(&g_sub.submitted);
    for (uint32_t k = 0; k < SUB_PER; k++)
        pr->results[k] = pr->tickets[k] ? keel_ticket_wait(pr->tickets[k], -1) : -100;
    pr->again = pr->tickets[SUB_PER - 1] ? keel_ticket_wait(pr->tickets[SUB_PER - 1], 0) : -100;
    for (uint32_t k = 0; k < SUB_PER; k++)
        keel_ticket_release(pr->tickets[k]);
    return NULL;
}

static void sub_setup(int32_t workers, double hz)
{
    memset(&g_sub, 0, sizeof g_sub);
    g_sub.rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers, .tick_rate_hz = hz});
    g_sub.cnt = reg_i64(g_sub.rt, "count", KEEL_VERSIONED);
    g_sub.poison = reg_i64(g_sub.rt, "poison", KEEL_SINGLE_VERSION);
    keel_component cs[] = {g_sub.cnt, g_sub.poison};
    int64_t vals[] = {0, 0};
    for (int i = 0; i < SUB_THREADS; i++)
        g_sub.counter[i] = spawn_i64(g_sub.rt, cs, vals, 2);
}

START_TEST(test_submit_order_and_results)
{
    sub_setup(2, -1);
    keel_runtime *rt = g_sub.rt;
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, (keel_access){0});
    tu_install(rt, s);
    ck_assert_int_eq(pthread_barrier_init(&g_sub.submitted, NULL, SUB_THREADS + 1), 0);
    static producer prods[SUB_THREADS];
    pthread_t th[SUB_THREADS];
    for (uint32_t i = 0; i < SUB_THREADS; i++) {
        memset(&prods[i], 0, sizeof prods[i]);
        prods[i].id = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, producer_order, &prods[i]), 0);
    }
    pthread_barrier_wait(&g_sub.submitted);
    ck_assert_uint_eq(g_sub.nlog, 0); /* nothing runs before a step */
    keel_runtime_stats before = tu_stats(rt);
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_stats after = tu_stats(rt);
    for (uint32_t i = 0; i < SUB_THREADS; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&g_sub.submitted);

    /* every closure ran in that one step, each thread's in submission order */
    ck_assert_uint_eq(g_sub.nlog, SUB_THREADS * SUB_PER);
    uint32_t next[SUB_THREADS] = {0};
    for (uint32_t k = 0; k < g_sub.nlog; k++) {
        uint32_t t = g_sub.log_thread[k];
        ck_assert_uint_lt(t, SUB_THREADS);
        ck_assert_uint_eq(g_sub.log_seq[k], next[t]);
        next[t]++;
    }
    uint32_t committed = 0;
    for (uint32_t i = 0; i < SUB_THREADS; i++) {
        producer *pr = &prods[i];
        ck_assert_uint_eq(next[i], SUB_PER);
        ck_assert_int_eq(pr->early, KEEL_ETIMEDOUT);
        for (uint32_t k = 0; k < SUB_PER; k++) {
            ck_assert_int_eq(pr->submit_rc[k], KEEL_OK);
            ck_assert_int_eq(pr->results[k], sub_aborts(k) ? 1000 + (int)k : KEEL_OK);
            committed += !sub_aborts(k);
        }
        ck_assert_int_eq(pr->again, sub_aborts(SUB_PER - 1) ? 1000 + (int)(SUB_PER - 1) : KEEL_OK);
        /* aborted closures applied nothing */
        ck_assert_int_eq(geti(rt, g_sub.counter[i], g_sub.cnt), SUB_PER - SUB_PER / 5);
        ck_assert_int_eq(geti(rt, g_sub.counter[i], g_sub.poison), 0);
    }
    ck_assert_uint_eq(after.commits - before.commits, committed + 1); /* + the noop system */
    ck_assert_uint_eq(after.aborts - before.aborts, SUB_THREADS * SUB_PER - committed);
    ck_assert_uint_eq(after.conflicts - before.conflicts, 0);
    keel_tick_record tr;
    ck_assert_ok(keel_telemetry_tick(rt, 1, &tr));
    ck_assert_uint_eq(tr.side_txns, committed);
    /* the unit of work holds one record per committed closure, in run order,
     * with the closure's mode (DEFAULT = the runtime's GROUP) */
    side_rec *recs = malloc(SUB_THREADS * SUB_PER * sizeof *recs);
    ck_assert_ptr_nonnull(recs);
    uint32_t n = read_side_records(rt, recs, SUB_THREADS * SUB_PER);
    ck_assert_uint_eq(n, committed);
    int64_t count[SUB_THREADS] = {0};
    uint32_t r = 0;
    for (uint32_t k = 0; k < g_sub.nlog; k++) {
        uint32_t t = g_sub.log_thread[k], seq = g_sub.log_seq[k];
        if (sub_aborts(seq))
            continue;
        ck_assert_uint_lt(r, n);
        keel_durability want = sub_mode(seq) == KEEL_DURABLE_DEFAULT ? KEEL_DURABLE_GROUP : sub_mode(seq);
        ck_assert_int_eq(recs[r].mode, want);
        ck_assert_uint_eq(recs[r].tick, 1);
        ck_assert_uint_eq(recs[r].n, 1);
        ck_assert(recs[r].e[0] == g_sub.counter[t]);
        ck_assert_uint_eq(recs[r].c[0], g_sub.cnt);
        ck_assert_int_eq(recs[r].v[0], ++count[t]);
        if (r)
            ck_assert_uint_gt(recs[r].seq, recs[r - 1].seq);
        r++;
    }
    free(recs);
    /* a second step runs nothing */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(g_sub.nlog, SUB_THREADS * SUB_PER);
    ck_assert_uint_eq(rt->txn.uow.nside, 0);
    keel_runtime_close(rt);
}
END_TEST

/* Closures submitted during a tick (from a system on a worker) run at the
 * start of the next one, before its systems. */
static struct {
    keel_component c;
    keel_entity e;
    _Atomic uint64_t ran_after_tick; /* keel_runtime_tick when the closure ran */
    _Atomic uint32_t ran;
    _Atomic int submit_rc;
    int64_t seen[4];
} g_dt;

static int closure_mark(keel_side_txn *tx, void *arg)
{
    (void)arg;
    atomic_store(&g_dt.ran_after_tick, keel_runtime_tick(g_sub.rt));
    atomic_fetch_add(&g_dt.ran, 1);
    int64_t v = 77;
    return keel_side_set(tx, g_dt.e, g_dt.c, &v);
}

static int sys_submitter(keel_ctx *ctx, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    int64_t v = -1;
    (void)keel_txn_get(ctx, g_dt.e, g_dt.c, &v);
    if (t < 4)
        g_dt.seen[t] = v;
    if (t == 1)
        atomic_store(&g_dt.submit_rc, keel_submit(g_sub.rt, closure_mark, NULL, KEEL_DURABLE_IMMEDIATE, NULL));
    return 0;
}

START_TEST(test_submit_during_tick_and_fire_and_forget)
{
    sub_setup(2, -1);
    memset(&g_dt, 0, sizeof g_dt);
    keel_runtime *rt = g_sub.rt;
    g_dt.c = g_sub.cnt;
    g_dt.e = g_sub.counter[0];
    keel_schedule *s = sched_new(rt);
    add_cb(s, "submitter", sys_submitter, NULL, (keel_access){.reads = {g_dt.c}});
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(atomic_load(&g_dt.submit_rc), KEEL_OK);
    ck_assert_uint_eq(atomic_load(&g_dt.ran), 0); /* queued for the next tick */
    ck_assert_int_eq(geti(rt, g_dt.e, g_dt.c), 0);
    ck_assert_uint_eq(rt->txn.uow.nside, 0);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(atomic_load(&g_dt.ran), 1);
    ck_assert_uint_eq(atomic_load(&g_dt.ran_after_tick), 1); /* ran inside step 2 */
    ck_assert_int_eq(geti(rt, g_dt.e, g_dt.c), 77);
    ck_assert_int_eq(g_dt.seen[1], 0);
    ck_assert_int_eq(g_dt.seen[2], 77); /* Engine-Pre ran before the tick's systems */
    side_rec r[2];
    ck_assert_uint_eq(read_side_records(rt, r, 2), 1);
    ck_assert_int_eq(r[0].mode, KEEL_DURABLE_IMMEDIATE);
    ck_assert_uint_eq(r[0].tick, 2);
    /* fire-and-forget from the test thread applies too */
    sub_arg a = {1, 0};
    ck_assert_ok(keel_submit(rt, closure_count, &a, KEEL_DURABLE_DEFERRED, NULL));
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_int_eq(geti(rt, g_sub.counter[1], g_sub.cnt), 1);
    ck_assert_uint_eq(g_sub.nlog, 1);
    ck_assert_uint_eq(atomic_load(&g_dt.ran), 1);
    keel_runtime_close(rt);
}
END_TEST

static int closure_ret(keel_side_txn *tx, void *arg)
{
    (void)tx;
    return (int)(intptr_t)arg;
}

static int closure_transient(keel_side_txn *tx, void *arg)
{
    const keel_component *t = arg;
    int64_t v = 1;
    return keel_side_set(tx, g_sub.counter[0], *t, &v);
}

static int closure_stale(keel_side_txn *tx, void *arg)
{
    const keel_entity *e = arg;
    int64_t v = 1;
    int rc = keel_side_set(tx, g_sub.counter[0], g_sub.cnt, &v); /* would apply, but the closure fails */
    if (rc)
        return rc;
    return keel_side_get(tx, *e, g_sub.cnt, &v);
}

START_TEST(test_submit_bad_args_and_errors)
{
    sub_setup(1, -1);
    keel_runtime *rt = g_sub.rt;
    keel_component tr = 0;
    /* registration is still open before the first step */
    tr = reg_i64(rt, "transient", KEEL_TRANSIENT);
    keel_entity stale = spawn_stale(rt, g_sub.cnt);
    {
        keel_world *w = keel_runtime_world(rt);
        keel_cmdbuf *cb = NULL;
        int64_t z = 0;
        ck_assert_ok(keel_cmdbuf_create(w, &cb));
        ck_assert_ok(keel_cmd_add(cb, g_sub.counter[0], tr, &z));
        ck_assert_ok(keel_cmdbuf_apply(cb));
        keel_cmdbuf_destroy(cb);
    }
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, (keel_access){0});
    tu_install(rt, s);
    keel_ticket *t = NULL;
    ck_assert_rc(keel_submit(NULL, closure_ret, NULL, KEEL_DURABLE_DEFAULT, &t), KEEL_EINVAL);
    ck_assert_rc(keel_submit(rt, NULL, NULL, KEEL_DURABLE_DEFAULT, &t), KEEL_EINVAL);
    ck_assert_rc(keel_submit(rt, closure_ret, NULL, (keel_durability)4, &t), KEEL_EINVAL);
    ck_assert_rc(keel_submit(rt, closure_ret, NULL, (keel_durability)-1, &t), KEEL_EINVAL);
    ck_assert_rc(keel_submit(rt, closure_ret, NULL, (keel_durability)4, NULL), KEEL_EINVAL);
    ck_assert_ptr_null(t);
    ck_assert_rc(keel_ticket_wait(NULL, 0), KEEL_EINVAL);
    ck_assert_rc(keel_ticket_wait(NULL, -1), KEEL_EINVAL);
    keel_ticket_release(NULL);
    /* nothing was queued by the refused calls */
    keel_runtime_stats before = tu_stats(rt);
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_stats after = tu_stats(rt);
    ck_assert_uint_eq(after.commits - before.commits, 1);
    ck_assert_uint_eq(after.aborts - before.aborts, 0);

    /* closures' errors come back through the ticket; nothing is applied */
    keel_ticket *tk[4] = {NULL};
    ck_assert_ok(keel_submit(rt, closure_ret, (void *)(intptr_t)KEEL_EIO, KEEL_DURABLE_DEFAULT, &tk[0]));
    ck_assert_ok(keel_submit(rt, closure_transient, &tr, KEEL_DURABLE_DEFAULT, &tk[1]));
    ck_assert_ok(keel_submit(rt, closure_stale, &stale, KEEL_DURABLE_DEFAULT, &tk[2]));
    ck_assert_ok(keel_submit(rt, closure_ret, (void *)(intptr_t)0, KEEL_DURABLE_DEFAULT, &tk[3]));
    for (int i = 0; i < 4; i++) {
        ck_assert_ptr_nonnull(tk[i]);
        ck_assert_rc(keel_ticket_wait(tk[i], 0), KEEL_ETIMEDOUT);
    }
    ck_assert_rc(keel_ticket_wait(tk[0], 1000), KEEL_ETIMEDOUT); /* a short timeout, still not run */
    before = tu_stats(rt);
    ck_assert_ok(keel_runtime_step(rt));
    after = tu_stats(rt);
    ck_assert_rc(keel_ticket_wait(tk[0], 0), KEEL_EIO);
    ck_assert_rc(keel_ticket_wait(tk[1], -1), KEEL_EINVAL);
    ck_assert_rc(keel_ticket_wait(tk[2], 0), KEEL_ESTALE);
    ck_assert_rc(keel_ticket_wait(tk[3], 0), KEEL_OK);
    ck_assert_rc(keel_ticket_wait(tk[2], 1000000), KEEL_ESTALE); /* again: the result stays */
    ck_assert_int_eq(geti(rt, g_sub.counter[0], g_sub.cnt), 0);
    ck_assert_uint_eq(after.commits - before.commits, 1 + 1); /* the empty closure + the system */
    ck_assert_uint_eq(after.aborts - before.aborts, 3);
    for (int i = 0; i < 4; i++)
        keel_ticket_release(tk[i]);
    keel_runtime_close(rt);
}
END_TEST

/* keel_runtime_close completes the tickets of closures that never ran. */
static struct {
    _Atomic uint32_t ran;
} g_cl;

static int closure_flag(keel_side_txn *tx, void *arg)
{
    (void)tx;
    (void)arg;
    atomic_fetch_add(&g_cl.ran, 1);
    return 0;
}

typedef struct waiter {
    keel_ticket *t;
    int result;
} waiter;

static void *waiter_main(void *p)
{
    waiter *wt = p;
    wt->result = keel_ticket_wait(wt->t, -1);
    return NULL;
}

START_TEST(test_submit_close_completes_busy)
{
    atomic_store(&g_cl.ran, 0);
    keel_runtime *rt = stepped_rt(2);
    (void)reg_i64(rt, "c", KEEL_VERSIONED);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, (keel_access){0});
    tu_install(rt, s);
    keel_ticket *first = NULL;
    ck_assert_ok(keel_submit(rt, closure_flag, NULL, KEEL_DURABLE_DEFAULT, &first));
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(atomic_load(&g_cl.ran), 1);
    ck_assert_rc(keel_ticket_wait(first, 0), KEEL_OK);

    keel_ticket *t[3] = {NULL};
    for (int i = 0; i < 3; i++)
        ck_assert_ok(keel_submit(rt, closure_flag, NULL, (keel_durability)(i + 1), &t[i]));
    ck_assert_ok(keel_submit(rt, closure_flag, NULL, KEEL_DURABLE_DEFAULT, NULL)); /* fire-and-forget */
    ck_assert_rc(keel_ticket_wait(t[0], 0), KEEL_ETIMEDOUT);
    waiter wt = {.t = t[1], .result = 12345};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, waiter_main, &wt), 0);
    keel_runtime_close(rt);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_rc(wt.result, KEEL_EBUSY);
    ck_assert_uint_eq(atomic_load(&g_cl.ran), 1); /* none of them ran */
    /* the tickets outlive the runtime until released */
    ck_assert_rc(keel_ticket_wait(t[0], -1), KEEL_EBUSY);
    ck_assert_rc(keel_ticket_wait(t[1], 0), KEEL_EBUSY);
    ck_assert_rc(keel_ticket_wait(t[2], 0), KEEL_EBUSY);
    ck_assert_rc(keel_ticket_wait(first, 0), KEEL_OK);
    for (int i = 0; i < 3; i++)
        keel_ticket_release(t[i]);
    keel_ticket_release(first);
}
END_TEST

/* Producers submitting transfers while the TickDriver runs. */
enum { DR_ACC = 8, DR_INIT = 1000, DR_THREADS = 4, DR_PER = 300, DR_BATCH = 25 };

typedef struct xfer {
    uint32_t from, to;
    int64_t amt;
} xfer;

static struct {
    keel_runtime *rt;
    keel_component bal;
    keel_entity acc[DR_ACC];
    _Atomic uint64_t observed, violations;
} g_dr;

static int closure_transfer(keel_side_txn *tx, void *arg)
{
    const xfer *x = arg;
    int64_t fb, tb;
    int rc = keel_side_get(tx, g_dr.acc[x->from], g_dr.bal, &fb);
    if (!rc)
        rc = keel_side_get(tx, g_dr.acc[x->to], g_dr.bal, &tb);
    if (rc)
        return rc;
    if (fb < x->amt)
        return 1; /* insufficient funds: abort */
    fb -= x->amt;
    tb += x->amt;
    if ((rc = keel_side_set(tx, g_dr.acc[x->from], g_dr.bal, &fb)) ||
        (rc = keel_side_set(tx, g_dr.acc[x->to], g_dr.bal, &tb)))
        return rc;
    return 0;
}

/* Every tick, after Engine-Pre: the total is whole. */
static int sys_audit(keel_ctx *ctx, void *user)
{
    (void)user;
    int64_t total = 0;
    for (int i = 0; i < DR_ACC; i++) {
        int64_t v = 0;
        if (keel_txn_get(ctx, g_dr.acc[i], g_dr.bal, &v))
            atomic_fetch_add(&g_dr.violations, 1);
        total += v;
    }
    if (total != (int64_t)DR_ACC * DR_INIT)
        atomic_fetch_add(&g_dr.violations, 1);
    atomic_fetch_add(&g_dr.observed, 1);
    return 0;
}

typedef struct dr_producer {
    uint32_t id;
    xfer x[DR_PER];
    int64_t credits[DR_ACC], debits[DR_ACC];
    uint32_t ok, insufficient, other, submit_failed;
} dr_producer;

static void *producer_transfers(void *p)
{
    dr_producer *pr = p;
    for (uint32_t base = 0; base < DR_PER; base += DR_BATCH) {
        keel_ticket *t[DR_BATCH];
        for (uint32_t k = 0; k < DR_BATCH; k++) {
            uint64_t h = mix64(((uint64_t)pr->id << 32) | (base + k));
            xfer *x = &pr->x[base + k];
            x->from = (uint32_t)(h % DR_ACC);
            x->to = (uint32_t)((h >> 8) % (DR_ACC - 1));
            if (x->to >= x->from)
                x->to++;
            x->amt = 1 + (int64_t)((h >> 20) % 300);
            t[k] = NULL;
            if (keel_submit(g_dr.rt, closure_transfer, x, (keel_durability)(k % 4), &t[k]))
                pr->submit_failed++;
        }
        for (uint32_t k = 0; k < DR_BATCH; k++) {
            if (!t[k])
                continue;
            int rc = keel_ticket_wait(t[k], -1);
            const xfer *x = &pr->x[base + k];
            if (rc == 0) {
                pr->ok++;
                pr->credits[x->to] += x->amt;
                pr->debits[x->from] += x->amt;
            } else if (rc == 1) {
                pr->insufficient++;
            } else {
                pr->other++;
            }
            keel_ticket_release(t[k]);
        }
    }
    return NULL;
}

START_TEST(test_submit_with_driver)
{
    memset(&g_dr, 0, sizeof g_dr);
    g_dr.rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = 2000});
    keel_runtime *rt = g_dr.rt;
    g_dr.bal = reg_i64(rt, "balance", KEEL_VERSIONED);
    for (int i = 0; i < DR_ACC; i++)
        g_dr.acc[i] = spawn1(rt, g_dr.bal, DR_INIT);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "audit", sys_audit, NULL, (keel_access){.reads = {g_dr.bal}});
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_start(rt));
    static dr_producer prods[DR_THREADS];
    pthread_t th[DR_THREADS];
    for (uint32_t i = 0; i < DR_THREADS; i++) {
        memset(&prods[i], 0, sizeof prods[i]);
        prods[i].id = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, producer_transfers, &prods[i]), 0);
    }
    for (uint32_t i = 0; i < DR_THREADS; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    ck_assert_ok(keel_runtime_stop(rt));
    ck_assert_uint_ge(keel_runtime_tick(rt), (uint64_t)DR_PER / DR_BATCH); /* one batch per tick at most */

    int64_t credits[DR_ACC] = {0}, debits[DR_ACC] = {0};
    uint64_t ok = 0, insuf = 0;
    for (uint32_t i = 0; i < DR_THREADS; i++) {
        ck_assert_uint_eq(prods[i].submit_failed, 0);
        ck_assert_uint_eq(prods[i].other, 0);
        ck_assert_uint_eq(prods[i].ok + prods[i].insufficient, DR_PER);
        ok += prods[i].ok;
        insuf += prods[i].insufficient;
        for (int a = 0; a < DR_ACC; a++) {
            credits[a] += prods[i].credits[a];
            debits[a] += prods[i].debits[a];
        }
    }
    ck_assert_uint_gt(ok, 0);
    int64_t total = 0;
    for (int a = 0; a < DR_ACC; a++) {
        int64_t b = geti(rt, g_dr.acc[a], g_dr.bal);
        ck_assert_int_ge(b, 0);
        ck_assert_int_eq(b, DR_INIT + credits[a] - debits[a]);
        total += b;
    }
    ck_assert_int_eq(total, (int64_t)DR_ACC * DR_INIT);
    ck_assert_uint_eq(atomic_load(&g_dr.violations), 0);
    keel_runtime_stats st = tu_stats(rt);
    ck_assert_uint_gt(atomic_load(&g_dr.observed), 0);
    ck_assert_uint_eq(atomic_load(&g_dr.observed), st.systems_run);
    ck_assert_uint_eq(st.systems_failed, 0);
    ck_assert_uint_eq(st.conflicts, 0); /* closures run one after the other */
    ck_assert_uint_eq(st.commits, ok + st.systems_run); /* + one audit system per run */
    ck_assert_uint_eq(st.aborts, insuf);
    keel_runtime_close(rt);
}
END_TEST

static Suite *side_submit(void)
{
    Suite *s = suite_create("side_submit");
    TCase *tc = tcase_create("submit");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_submit_order_and_results);
    tcase_add_test(tc, test_submit_during_tick_and_fire_and_forget);
    tcase_add_test(tc, test_submit_bad_args_and_errors);
    tcase_add_test(tc, test_submit_close_completes_busy);
    tcase_add_test(tc, test_submit_with_driver);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(side_basic, side_concurrent, side_submit)
