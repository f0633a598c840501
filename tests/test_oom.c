/*
 * test_oom.c -- out of memory at every allocation, in turn.
 *
 * A small world (workload O below: spawns, destroys, a tag, a rewriting
 * parallel query, direct writes, a keyed side transaction and a submitted
 * closure every tick) is run again and again, and each time the k-th
 * allocation of one phase fails (oom_shim.c: one-shot; on the stepping
 * thread, or on any thread in the two-worker sweep), for k = 1, 2, ...
 * until the phase completes without reaching its k-th allocation. Every
 * run must
 *   - return KEEL_OK or KEEL_ENOMEM from the call that met the failure
 *     (with a last error that says "out of memory" for ENOMEM; a durable
 *     runtime may latch fatal instead when a tick cannot be logged),
 *   - leave a world that passes check_world and runs three more ticks,
 *   - and, closed, free every block it allocated (the shim counts them).
 * Phases: setting up the runtime (create, registrations, queries, the
 * schedule); a schedule with an error; the first four ticks with one and
 * with two workers; a large command playback outside a tick; a data
 * directory opened, ticked and checkpointed (by hand and every tick), on
 * one worker and on two (where the fence serialises between ticks on a
 * worker); a recovery. docs/testing.md, "Out of memory, at every allocation in turn".
 *
 * Sanitizer builds own malloc: the program exits 77 there (CTest: skipped).
 */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "keel_test.h"
#include "oom_shim.h"
#include "test_util.h"

/* ---- workload O ------------------------------------------------------------------------------- */

typedef struct oworld {
    keel_runtime *rt;
    keel_component A, B, T, M; /* VERSIONED i64, SINGLE_VERSION i64, TRANSIENT i64, a tag */
    keel_query *qa, *qm;
    int64_t submitted;          /* what the closures added to B of the first entity */
} oworld;

/* spawner: two entities a tick; destroy the first of the iteration; tag the second. */
static int sys_spawner(keel_ctx *ctx, void *user)
{
    oworld *o = user;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    int64_t t = (int64_t)keel_ctx_tick(ctx);
    for (int i = 0; i < 2; i++) {
        int64_t a = t * 10 + i, b = t, tr = 7;
        keel_init inits[] = {{o->A, &a}, {o->B, &b}, {o->T, &tr}};
        int rc = keel_cmd_spawn(cb, inits, 3);
        if (rc)
            return rc;
    }
    keel_iter it;
    keel_txn_iter(ctx, o->qa, &it);
    uint32_t seen = 0;
    while (seen < 2 && keel_txn_next(ctx, &it)) {
        for (uint32_t r = 0; r < it.count && seen < 2; r++, seen++) {
            int rc = seen == 0 ? keel_cmd_destroy(cb, it.entities[r]) : keel_cmd_add(cb, it.entities[r], o->M, NULL);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* mover: A += 1 through a rewritten column (parallel query). */
static int sys_mover(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    int64_t *a = KEEL_COLUMN(it, int64_t, 0);
    const int64_t *a0 = it->prev[0];
    for (uint32_t r = 0; r < it->count; r++)
        a[r] = a0[r] + 1;
    return 0;
}

/* setter: B := A for every third entity, through keel_txn_set. */
static int sys_setter(keel_ctx *ctx, void *user)
{
    oworld *o = user;
    keel_iter it;
    uint32_t k = 0;
    keel_txn_iter(ctx, o->qa, &it);
    while (keel_txn_next(ctx, &it)) {
        for (uint32_t r = 0; r < it.count; r++, k++) {
            int64_t a;
            int rc = k % 3 ? 0 : keel_txn_get(ctx, it.entities[r], o->A, &a);
            rc = rc || k % 3 ? rc : keel_txn_set(ctx, it.entities[r], o->B, &a);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* sider: a side transaction moves 1 from B of the first entity to B of the
 * second, keyed by its tick (so the key set grows, is checkpointed and
 * recovered; a tick that runs again after a recovery finds its key: done). */
static int sys_sider(keel_ctx *ctx, void *user)
{
    oworld *o = user;
    keel_iter it;
    keel_query_iter(o->qa, &it);
    if (!keel_iter_next(&it) || it.count < 2)
        return 0;
    keel_entity x = it.entities[0], y = it.entities[1];
    keel_side_txn *tx;
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_GROUP, &tx);
    if (rc)
        return rc;
    int64_t bx, by;
    rc = keel_side_get(tx, x, o->B, &bx);
    rc = rc ? rc : keel_side_get(tx, y, o->B, &by);
    bx -= 1, by += 1;
    rc = rc ? rc : keel_side_set(tx, x, o->B, &bx);
    rc = rc ? rc : keel_side_set(tx, y, o->B, &by);
    rc = rc ? rc : keel_side_txn_set_key(tx, keel_ctx_tick(ctx));
    if (rc) {
        keel_side_txn_abort(tx);
        return rc;
    }
    rc = keel_side_txn_commit(tx);
    return rc == KEEL_EALREADY ? 0 : rc;
}

static int closure_add(keel_side_txn *tx, void *arg)
{
    oworld *o = arg;
    keel_iter it;
    keel_query_iter(o->qa, &it);
    if (!keel_iter_next(&it))
        return 0;
    int64_t b;
    int rc = keel_side_get(tx, it.entities[0], o->B, &b);
    b += 100;
    return rc ? rc : keel_side_set(tx, it.entities[0], o->B, &b);
}

/* The recovery sweep's second pass opens with truncate_bad_tail. */
static bool g_truncate_bad_tail;

/* Close what o holds (any part may be missing). */
static void o_close(oworld *o)
{
    if (o->qa)
        keel_query_destroy(o->qa);
    if (o->qm)
        keel_query_destroy(o->qm);
    if (o->rt)
        keel_runtime_close(o->rt);
    memset(o, 0, sizeof *o);
}

static const keel_field i64_field[] = {{.name = "v", .type = KEEL_I64}};

/* An i64 component (size 8) or a tag (size 0). */
static int reg(keel_world *w, const char *name, uint32_t size, keel_discipline d, keel_component *out)
{
    keel_component_desc cd = {.name = name, .size = size, .discipline = d, .fields = size ? i64_field : NULL,
                              .field_count = size ? 1 : 0};
    return keel_component_register(w, &cd, out);
}

/* Set workload O up, with the data directory dir (NULL: none; no
 * checkpoint but the ones asked for); the first error is returned (o holds
 * what was made). */
static int o_setup_full(oworld *o, const char *dir, int32_t workers, int64_t checkpoint_every_ticks)
{
    memset(o, 0, sizeof *o);
    keel_runtime_desc rd = {.workers = workers, .tick_rate_hz = -1};
    rd.durable.dir = dir;
    rd.durable.truncate_bad_tail = g_truncate_bad_tail;
    rd.durable.checkpoint_every_ticks = checkpoint_every_ticks;
    rd.durable.checkpoint_every_bytes = -1;
    rd.durable.checkpoint_every_seconds = -1;
    int rc = keel_runtime_create(&rd, &o->rt);
    if (rc)
        return rc;
    keel_world *w = keel_runtime_world(o->rt);
    rc = reg(w, "a", 8, KEEL_VERSIONED, &o->A);
    rc = rc ? rc : reg(w, "b", 8, KEEL_SINGLE_VERSION, &o->B);
    rc = rc ? rc : reg(w, "t", 8, KEEL_TRANSIENT, &o->T);
    rc = rc ? rc : reg(w, "m", 0, KEEL_VERSIONED, &o->M);
    rc = rc ? rc : keel_query_create(w, &(keel_query_desc){.with = {o->A}}, &o->qa);
    rc = rc ? rc : keel_query_create(w, &(keel_query_desc){.with = {o->M}}, &o->qm);
    keel_schedule *s = NULL;
    rc = rc ? rc : keel_schedule_create(o->rt, &s);
    if (rc)
        return rc;
    keel_system_desc d[] = {
        {.name = "spawner", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_spawner, .user = o,
         .access = {.reads = {o->A}}},
        {.name = "mover", .kind = KEEL_SYSTEM_QUERY, .each_chunk = sys_mover, .parallel = true,
         .query = {.with = {o->A}}, .access = {.rewrites = {o->A}}, .after = {"spawner"}},
        {.name = "setter", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_setter, .user = o,
         .access = {.reads = {o->A}, .writes = {o->B}}, .after = {"mover"}},
        {.name = "sider", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_sider, .user = o,
         .access = {.side_writes = {o->B}}, .after = {"setter"}},
    };
    for (size_t i = 0; !rc && i < sizeof d / sizeof d[0]; i++)
        rc = keel_schedule_add_system(s, &d[i], NULL);
    rc = rc ? rc : keel_schedule_build(s);
    rc = rc ? rc : keel_runtime_set_schedule(o->rt, s);
    if (rc)
        keel_schedule_destroy(s); /* the runtime owns it only once installed */
    return rc;
}

static int o_setup_dir(oworld *o, const char *dir)
{
    return o_setup_full(o, dir, 1, -1);
}

static int o_setup(oworld *o)
{
    return o_setup_dir(o, NULL);
}

/* One tick with a submitted closure. */
static int o_step(oworld *o)
{
    int rc = keel_submit(o->rt, closure_add, o, KEEL_DURABLE_GROUP, NULL);
    return rc ? rc : keel_runtime_step(o->rt);
}

/* The world is whole: every entity of the A query is alive, readable
 * through keel_get with the column's value, and counted once; the tag
 * query holds live entities; the hash can be computed. */
static void check_world(const oworld *o)
{
    const keel_world *w = keel_runtime_world(o->rt);
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(o->qa, &it);
    while (keel_iter_next(&it)) {
        const int64_t *a = KEEL_COLUMN(&it, const int64_t, 0);
        for (uint32_t r = 0; r < it.count; r++, n++) {
            int64_t v = 0, b = 0;
            ck_assert(keel_alive(w, it.entities[r]));
            ck_assert_ok(keel_get(w, it.entities[r], o->A, &v));
            ck_assert_int_eq(v, a[r]);
            ck_assert_ok(keel_get(w, it.entities[r], o->B, &b));
        }
    }
    ck_assert_uint_eq(n, keel_query_count(o->qa));
    ck_assert_uint_eq(n, keel_world_count(w));
    keel_query_iter(o->qm, &it);
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++)
            ck_assert(keel_alive(w, it.entities[r]));
    (void)keel_world_hash(w);
}

/* The code a call that met the injected failure may return. */
static void expect_ok_or_enomem(int rc, const char *what, long k)
{
    ck_assert_msg(rc == KEEL_OK || rc == KEEL_ENOMEM, "%s with allocation %ld failing: %s (%s)", what, k,
                  keel_strerror(rc), keel_last_error());
    if (rc == KEEL_ENOMEM)
        ck_assert_msg(strstr(keel_last_error(), "memory") != NULL, "%s, allocation %ld: ENOMEM saying '%s'", what, k,
                      keel_last_error());
}

/* Whole unarmed cycles, without and with a data directory, so that what
 * the process keeps for good (liburcu's registry, Check's buffers, the
 * libraries' one-time state) exists before the first count. */
static long settle(void)
{
    char dir[256];
    tu_path(dir, sizeof dir, "settle");
    for (int i = 0; i < 3; i++) {
        oworld o;
        /* the last run on two workers: glibc keeps an exited thread's stack
         * for reuse with its thread-local blocks allocated, so the most
         * threads ever alive at once hold blocks for the process's life */
        ck_assert_ok(o_setup_full(&o, i ? dir : NULL, i == 2 ? 2 : 1, -1));
        if (i)
            ck_assert_ok(keel_runtime_recover(o.rt, NULL));
        for (int t = 0; t < 3; t++)
            ck_assert_ok(o_step(&o));
        /* a view held across a tick: liburcu-bp registers this thread as a
         * reader, and the old view goes to call_rcu, whose thread and queue
         * liburcu makes once per process */
        const keel_view *v;
        ck_assert_ok(keel_view_begin(o.rt, &v));
        ck_assert_ok(o_step(&o));
        keel_view_end(v);
        if (i)
            ck_assert_ok(keel_checkpoint(o.rt));
        o_close(&o);
    }
    tu_rmtree(dir);
    return oom_live();
}

/* Every block allocated since the baseline was freed. liburcu's
 * rcu_barrier (keel_runtime_close waits in it for the view reclaims) wakes
 * its caller before the call_rcu thread frees its own two bookkeeping
 * blocks, so the count may reach the baseline a moment after the close
 * returns: it is polled, with a deadline that only turns a real leak into
 * a failure instead of a hang. The baseline itself may have been read
 * before those two frees (settle), so a count below it passes. */
static void expect_no_leak(long base, const char *what, long k)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long live;
    while ((live = oom_live()) > base) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= 60)
            break;
        sched_yield();
    }
    ck_assert_msg(live <= base, "%s, allocation %ld failing: %ld blocks not freed after the close", what, k,
                  live - base);
}

/* ---- the sweeps ------------------------------------------------------------------------------ */

/* A sweep ends after this many runs in a row never reached their k-th
 * allocation. One would do where the count of allocations is the same in
 * every run; with two workers, or every thread counted, it varies from run
 * to run, and a sweep that stopped at the first short run would rarely
 * reach the last allocations (a checkpoint's, after the ticks). */
#define SWEEP_QUIET 8

START_TEST(test_oom_setup)
{
    long base = settle(), k;
    for (k = 1;; k++) {
        oworld o;
        oom_arm(k);
        int rc = o_setup(&o);
        bool fired = oom_disarm();
        expect_ok_or_enomem(rc, "setup", k);
        if (!rc) { /* a failure absorbed on the way, or none: it must run */
            for (int t = 0; t < 3; t++)
                ck_assert_ok(o_step(&o));
            check_world(&o);
        }
        o_close(&o);
        expect_no_leak(base, "setup", k);
        if (!fired)
            break;
    }
    fprintf(stderr, "test_oom_setup: %ld allocations failed in turn\n", k - 1);
    ck_assert_int_gt(k, 20); /* the sweep reached the allocations of the whole setup */
}
END_TEST

/* The first four ticks (the first makes the tables, chunks, row versions,
 * the view; the later ones recycle, the last two under a read view that
 * pins the previous versions) with the k-th allocation failing: of the
 * stepping thread with one worker; of any thread with two (the order
 * between the threads varies, so each run fails some allocation of the
 * tick's, a task's planning and its command buffers included). A tick
 * whose sync point met it returns KEEL_ENOMEM with its commands pending:
 * retried, they apply. */
static void sweep_ticks(int32_t workers)
{
    long base = settle(), k, nfired = 0, quiet = 0;
    for (k = 1;; k++) {
        oworld o;
        ck_assert_ok(o_setup_full(&o, NULL, workers, -1));
        if (workers == 1)
            oom_arm(k);
        else
            oom_arm_all(k);
        long left = oom_pause();
        for (int t = 1; t <= 4; t++) {
            /* ticks 3 and 4 run under a read view that pins the previous
             * versions: the tick copies instead of recycling them */
            const keel_view *v = NULL;
            keel_entity e0 = 0;
            int64_t a0 = 0;
            if (t >= 3) { /* e0: an entity of the view (a retried sync point's spawns are not in it yet) */
                keel_iter it;
                ck_assert_ok(keel_view_begin(o.rt, &v));
                keel_query_iter(o.qa, &it);
                while (!e0 && keel_iter_next(&it))
                    for (uint32_t r = 0; r < it.count && !e0; r++)
                        e0 = keel_view_alive(v, it.entities[r]) ? it.entities[r] : 0;
                ck_assert(e0 != 0);
                ck_assert_ok(keel_view_get(v, e0, o.A, &a0));
            }
            oom_resume(left);
            int rc = o_step(&o);
            left = oom_pause(); /* Check's assertions allocate */
            expect_ok_or_enomem(rc, "ticks 1-4", k);
            if (v) {
                int64_t a = -1;
                ck_assert_ok(keel_view_get(v, e0, o.A, &a));
                ck_assert_int_eq(a, a0); /* the view did not move */
                keel_view_end(v);
            }
            check_world(&o);
            if (rc) /* the sync point's playback stopped: its commands are pending (keel/runtime.h) */
                ck_assert_ok(keel_runtime_sync_retry(o.rt));
        }
        bool fired = oom_disarm();
        for (int t = 0; t < 3; t++)
            ck_assert_ok(o_step(&o));
        check_world(&o);
        o_close(&o);
        expect_no_leak(base, "ticks 1-4", k);
        if (fired)
            nfired++, quiet = 0;
        else if (++quiet == SWEEP_QUIET)
            break;
    }
    fprintf(stderr, "sweep_ticks(%d workers): %ld allocations failed in turn\n", workers, nfired);
    ck_assert_int_gt(nfired, 20);
}

START_TEST(test_oom_tick)
{
    sweep_ticks(1);
}
END_TEST

START_TEST(test_oom_tick_two_workers)
{
    sweep_ticks(2);
}
END_TEST

/* Build a two-system schedule with the k-th allocation failing, for k = 1,
 * 2, ... With `warning`, its only diagnostic is a warning (a reader ordered
 * before the writer): a build that ran out of memory -- possibly losing
 * the warning -- returns KEEL_ENOMEM and cannot be installed; one that did
 * not installs and runs. Without, it has an error (a system without a
 * body): it never builds, also when the allocation that would store the
 * diagnostic fails -- KEEL_EINVAL naming the system, or KEEL_ENOMEM. */
static void sweep_build(bool warning)
{
    long base = settle(), k;
    for (k = 1;; k++) {
        keel_runtime *rt;
        keel_schedule *s;
        keel_component A;
        ck_assert_ok(keel_runtime_create(&(keel_runtime_desc){.workers = 1, .tick_rate_hz = -1}, &rt));
        ck_assert_ok(reg(keel_runtime_world(rt), "a", 8, KEEL_VERSIONED, &A));
        ck_assert_ok(keel_schedule_create(rt, &s));
        keel_system_desc first = {.name = "reader", .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop,
                                  .access = {.reads = {A}}};
        keel_system_desc second = {.name = "writer", .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop,
                                   .access = {.writes = {A}}, .after = {"reader"}};
        if (!warning)
            second = (keel_system_desc){.name = "bad", .kind = KEEL_SYSTEM_CALLBACK};
        ck_assert_ok(keel_schedule_add_system(s, &first, NULL));
        ck_assert_ok(keel_schedule_add_system(s, &second, NULL));
        oom_arm(k);
        int rc = keel_schedule_build(s);
        bool fired = oom_disarm();
        if (warning) {
            expect_ok_or_enomem(rc, "a build with a warning", k);
        } else {
            ck_assert_msg(rc == KEEL_EINVAL || rc == KEEL_ENOMEM, "allocation %ld failing: the build returned %s", k,
                          keel_strerror(rc));
            ck_assert_ptr_nonnull(strstr(keel_last_error(), rc == KEEL_ENOMEM ? "out of memory" : "'bad'"));
        }
        if (rc) {
            ck_assert_rc(keel_runtime_set_schedule(rt, s), KEEL_EINVAL);
            keel_schedule_destroy(s);
        } else {
            ck_assert_uint_eq(keel_schedule_diag_count(s), 1);
            ck_assert_ok(keel_runtime_set_schedule(rt, s));
            ck_assert_ok(keel_runtime_step(rt));
        }
        keel_runtime_close(rt);
        expect_no_leak(base, "schedule build", k);
        if (!fired)
            break;
    }
    fprintf(stderr, "sweep_build(%s): %ld allocations failed in turn\n", warning ? "a warning" : "an error", k - 1);
    ck_assert_int_gt(k, 3);
}

START_TEST(test_oom_bad_schedule)
{
    sweep_build(false);
}
END_TEST

START_TEST(test_oom_warning_schedule)
{
    sweep_build(true);
}
END_TEST

/* Playback of 300 spawns, then 150 destroys, outside a tick: a failure
 * leaves the buffer pending (docs/world.md), and applying it again
 * finishes the job. */
START_TEST(test_oom_playback)
{
    long base = settle(), k;
    for (k = 1;; k++) {
        oworld o;
        ck_assert_ok(o_setup(&o));
        keel_world *w = keel_runtime_world(o.rt);
        keel_cmdbuf *cb;
        ck_assert_ok(keel_cmdbuf_create(w, &cb));
        for (int64_t i = 0; i < 300; i++) {
            keel_init inits[] = {{o.A, &i}, {o.B, &i}};
            ck_assert_ok(keel_cmd_spawn(cb, inits, 2));
        }
        oom_arm(k);
        int rc = keel_cmdbuf_apply(cb);
        bool fired = oom_disarm();
        expect_ok_or_enomem(rc, "spawn playback", k);
        if (rc)
            ck_assert_ok(keel_cmdbuf_apply(cb)); /* the rest */
        keel_cmd_result res = keel_cmdbuf_result(cb);
        ck_assert_uint_eq(res.pending, 0);
        ck_assert_uint_eq(keel_world_count(w), 300);
        keel_entity *e = malloc(300 * sizeof *e);
        ck_assert_ptr_nonnull(e);
        memcpy(e, res.created, 300 * sizeof *e);
        ck_assert_ok(keel_cmdbuf_reset(cb));
        for (int i = 0; i < 300; i += 2)
            ck_assert_ok(keel_cmd_destroy(cb, e[i]));
        oom_arm(k);
        rc = keel_cmdbuf_apply(cb);
        fired = oom_disarm() || fired;
        expect_ok_or_enomem(rc, "destroy playback", k);
        if (rc)
            ck_assert_ok(keel_cmdbuf_apply(cb));
        ck_assert_uint_eq(keel_world_count(w), 150);
        for (int i = 0; i < 300; i++) {
            int64_t v = -1;
            ck_assert(keel_alive(w, e[i]) == (i % 2 == 1));
            if (i % 2) {
                ck_assert_ok(keel_get(w, e[i], o.B, &v));
                ck_assert_int_eq(v, i);
            }
        }
        free(e);
        keel_cmdbuf_destroy(cb);
        check_world(&o);
        for (int t = 0; t < 3; t++)
            ck_assert_ok(o_step(&o));
        check_world(&o);
        o_close(&o);
        expect_no_leak(base, "playback", k);
        if (!fired)
            break;
    }
    fprintf(stderr, "test_oom_playback: %ld allocations failed in turn\n", k - 1);
    ck_assert_int_gt(k, 3);
}
END_TEST

/* ---- with a data directory ------------------------------------------------------------------ */

/* Open a fresh directory, recover, run four ticks and take a checkpoint
 * with the k-th allocation of the stepping thread failing. Each call
 * returns 0, KEEL_ENOMEM, or KEEL_EFATAL once the runtime latched fatal (a
 * tick that cannot be logged latches it: docs/durability.md); a failed
 * open leaves nothing to close but the runtime. Closed and reopened
 * without the failure, the directory recovers: to the state before the
 * close when nothing failed fatally, else to a consistent earlier tick,
 * and runs on. checkpoint_every_ticks: the periodic checkpoints (-1: none). */
/* "ckpt failed ... code=KEEL_ENOMEM" events seen by the logger (main): a
 * checkpoint that ran out of memory on its own thread must be skipped, not
 * latch the runtime (ckpt_committed). */
static atomic_long ckpt_oom_failures;
/* "wal fence_failed" events: a unit serialised between ticks that ran out
 * of memory on its worker */
static atomic_long fence_oom_failures;

static void sweep_durable(int64_t checkpoint_every_ticks, bool all_threads, int32_t workers)
{
    long base = settle(), k, nfatal = 0, nopen = 0, nenomem = 0, nfired = 0, quiet = 0;
    char dir[256];
    for (k = 1;; k++) {
        oworld o;
        snprintf(dir, sizeof dir, "%s/dur-%d-%d-%ld", tu_base(), (int)all_threads, (int)workers, k);
        ck_assert_ok(o_setup_full(&o, dir, workers, checkpoint_every_ticks));
        if (all_threads)
            oom_arm_all(k);
        else
            oom_arm(k);
        int rc = keel_runtime_recover(o.rt, NULL);
        long left = oom_pause();
        expect_ok_or_enomem(rc, "recover", k);
        bool opened = rc == KEEL_OK, fatal = false;
        for (int t = 1; opened && t <= 5; t++) {
            oom_resume(left);
            rc = t <= 4 ? o_step(&o) : keel_checkpoint(o.rt);
            left = oom_pause();
            if (!fatal && keel_runtime_fatal(o.rt) && t <= 4) /* a periodic checkpoint is skipped, never fatal */
                ck_assert_msg(!strstr(keel_last_error(), "checkpoint"), "allocation %ld: tick %d latched fatal: %s",
                              k, t, keel_last_error());
            bool latched_now = !fatal && keel_runtime_fatal(o.rt) != 0;
            fatal = fatal || latched_now;
            if (fatal) {
                /* with every thread armed, the WAL writer can fail an allocation while a tick runs and
                   latch just after the step returned: the step itself succeeded (a checkpoint waits for
                   the writer's commit, so keel_checkpoint may not return 0 beside a latch) */
                ck_assert_msg(rc == KEEL_EFATAL || rc == KEEL_ENOMEM ||
                                  (all_threads && latched_now && t <= 4 && rc == KEEL_OK),
                              "allocation %ld: %s after the latch", k, keel_strerror(rc));
                ck_assert_int_eq(keel_runtime_fatal(o.rt), KEEL_ENOMEM);
                continue;
            }
            expect_ok_or_enomem(rc, "a durable tick", k);
            check_world(&o);
            if (rc && t <= 4)
                ck_assert_ok(keel_runtime_sync_retry(o.rt));
        }
        bool fired = oom_disarm();
        nopen += !opened;
        nfatal += fatal;
        nenomem += opened && !fatal && rc == KEEL_ENOMEM;
        if (opened && !fatal && rc == KEEL_ENOMEM) /* the checkpoint was not taken: asked again, it is */
            ck_assert_ok(keel_checkpoint(o.rt));
        uint64_t hash = 0, tick = 0;
        if (opened && !fatal) {
            ck_assert_ok(o_step(&o));
            ck_assert_ok(keel_flush(o.rt));
            hash = keel_world_hash(keel_runtime_world(o.rt));
        }
        tick = opened ? keel_runtime_tick(o.rt) : 0;
        o_close(&o);
        expect_no_leak(base, "durable", k);

        keel_recovery info;
        ck_assert_ok(o_setup_dir(&o, dir));
        ck_assert_ok(keel_runtime_recover(o.rt, &info));
        check_world(&o);
        if (opened && !fatal) {
            ck_assert_uint_eq(info.tick, tick);
            ck_assert_uint_eq(keel_world_hash(keel_runtime_world(o.rt)), hash);
        } else {
            ck_assert_uint_le(info.tick, tick);
        }
        for (int t = 0; t < 3; t++)
            ck_assert_ok(o_step(&o));
        check_world(&o);
        o_close(&o);
        tu_rmtree(dir);
        expect_no_leak(base, "durable, reopened", k);
        if (fired)
            nfired++, quiet = 0;
        else if (++quiet == SWEEP_QUIET)
            break;
    }
    fprintf(stderr, "sweep_durable(checkpoint every %lld ticks, %s, %d workers): %ld allocations failed in turn: "
                    "%ld opens refused, %ld runtimes latched fatal, %ld ENOMEM from keel_checkpoint, %ld units failed "
                    "on a worker\n",
            (long long)checkpoint_every_ticks, all_threads ? "every thread" : "the stepping thread", (int)workers,
            nfired, nopen, nfatal, nenomem, atomic_exchange(&fence_oom_failures, 0));
    long ckpt_oom = atomic_load(&ckpt_oom_failures);
    ck_assert_msg(ckpt_oom == 0, "%ld checkpoints that ran out of memory latched the runtime", ckpt_oom);
    ck_assert_int_gt(nfired, 50);
}

START_TEST(test_oom_durable)
{
    sweep_durable(-1, false, 1);
}
END_TEST

/* The same with a periodic checkpoint at every tick: one that cannot be
 * captured is skipped (the runtime does not latch fatal for it). */
START_TEST(test_oom_durable_periodic_checkpoints)
{
    sweep_durable(1, false, 1);
}
END_TEST

/* The same counting every thread's allocations: the WAL writer's and the
 * checkpoint thread's fail too (which allocation a given k hits varies
 * with the threads' interleaving). A checkpoint thread that runs out
 * abandons its job without latching; the writer's failures latch. */
START_TEST(test_oom_durable_every_thread)
{
    sweep_durable(1, true, 1);
}
END_TEST

/* The same on two workers: the fence serialises a tick's unit between
 * ticks on a worker (docs/durability.md, "Between ticks"), so its
 * allocations fail there, and on the stepping thread while it posts. */
START_TEST(test_oom_durable_two_workers)
{
    sweep_durable(-1, false, 2);
}
END_TEST

START_TEST(test_oom_durable_two_workers_every_thread)
{
    sweep_durable(1, true, 2);
}
END_TEST

/* Copy the file from to the file to. */
static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    ck_assert_ptr_nonnull(in);
    ck_assert_ptr_nonnull(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    ck_assert_int_eq(fclose(in), 0);
    ck_assert_int_eq(fclose(out), 0);
}

/* Recovery (a checkpoint, then WAL records to replay) with the k-th
 * allocation failing: KEEL_OK with the reference state, or KEEL_ENOMEM and
 * a directory that the next open recovers to the same state. With
 * truncate_bad_tail, running out of memory while validating the tail must
 * not be taken for a bad record: nothing may be truncated. */
static void sweep_recovery(bool truncate_bad_tail)
{
    char ref[256], dir[256], path[300], from[300];
    snprintf(ref, sizeof ref, "%s/ref-%d", tu_base(), (int)truncate_bad_tail);
    g_truncate_bad_tail = truncate_bad_tail;
    oworld o;
    ck_assert_ok(o_setup_dir(&o, ref));
    ck_assert_ok(keel_runtime_recover(o.rt, NULL));
    for (int t = 1; t <= 6; t++) {
        ck_assert_ok(o_step(&o));
        if (t == 3)
            ck_assert_ok(keel_checkpoint(o.rt));
    }
    ck_assert_ok(keel_flush(o.rt));
    uint64_t hash = keel_world_hash(keel_runtime_world(o.rt)), tick = keel_runtime_tick(o.rt);
    o_close(&o);
    snprintf(from, sizeof from, "%s/data.mdb", ref);
    long base = settle(), k;
    for (k = 1;; k++) {
        snprintf(dir, sizeof dir, "%s/rec-%d-%ld", tu_base(), (int)truncate_bad_tail, k);
        ck_assert_int_eq(mkdir(dir, 0755), 0);
        snprintf(path, sizeof path, "%s/data.mdb", dir);
        copy_file(from, path);
        ck_assert_ok(o_setup_dir(&o, dir));
        keel_recovery info;
        oom_arm(k);
        int rc = keel_runtime_recover(o.rt, &info);
        bool fired = oom_disarm();
        expect_ok_or_enomem(rc, "recovery", k);
        if (!rc) {
            check_world(&o);
            ck_assert_uint_eq(info.truncated, 0);
            ck_assert_uint_eq(info.tick, tick);
            ck_assert_uint_eq(keel_world_hash(keel_runtime_world(o.rt)), hash);
        }
        o_close(&o);
        expect_no_leak(base, "recovery", k);
        ck_assert_ok(o_setup_dir(&o, dir));
        ck_assert_ok(keel_runtime_recover(o.rt, &info));
        ck_assert_uint_eq(info.tick, tick);
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(o.rt)), hash);
        o_close(&o);
        tu_rmtree(dir);
        if (!fired)
            break;
    }
    g_truncate_bad_tail = false;
    fprintf(stderr, "sweep_recovery(truncate_bad_tail %d): %ld allocations failed in turn\n", (int)truncate_bad_tail,
            k - 1);
    ck_assert_int_gt(k, 20);
}

START_TEST(test_oom_recovery)
{
    sweep_recovery(false);
}
END_TEST

START_TEST(test_oom_recovery_truncate_bad_tail)
{
    sweep_recovery(true);
}
END_TEST

static Suite *oom_suite(void)
{
    Suite *s = suite_create("oom_sweep");
    TCase *tc = tcase_create("sweep");
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_oom_setup);
    tcase_add_test(tc, test_oom_bad_schedule);
    tcase_add_test(tc, test_oom_warning_schedule);
    tcase_add_test(tc, test_oom_tick);
    tcase_add_test(tc, test_oom_tick_two_workers);
    tcase_add_test(tc, test_oom_playback);
    tcase_add_test(tc, test_oom_durable);
    tcase_add_test(tc, test_oom_durable_periodic_checkpoints);
    tcase_add_test(tc, test_oom_durable_every_thread);
    tcase_add_test(tc, test_oom_durable_two_workers);
    tcase_add_test(tc, test_oom_durable_two_workers_every_thread);
    tcase_add_test(tc, test_oom_recovery);
    tcase_add_test(tc, test_oom_recovery_truncate_bad_tail);
    suite_add_tcase(s, tc);
    return s;
}

/* The sweeps make the runtime log each failure it meets (thousands of
 * lines); the assertions say what matters. */
static void log_quiet(const keel_log_event *ev, void *user)
{
    (void)user;
    if (!strcmp(ev->subsystem, "ckpt") && !strcmp(ev->event, "failed") && strstr(ev->fields, "KEEL_ENOMEM"))
        atomic_fetch_add(&ckpt_oom_failures, 1);
    if (!strcmp(ev->subsystem, "wal") && !strcmp(ev->event, "fence_failed") && strstr(ev->fields, "KEEL_ENOMEM"))
        atomic_fetch_add(&fence_oom_failures, 1);
}

int main(void)
{
    keel_log_set(log_quiet, NULL, KEEL_LOG_ERROR);
    if (!oom_shim_active()) {
        fprintf(stderr, "test_oom: skipped: this build's sanitizer owns malloc\n");
        return 77;
    }
    keel_suite_fn suites[] = {oom_suite};
    return keel_test_run(suites, 1);
}
