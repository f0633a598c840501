/*
 * test_runtime.c -- the runtime (keel/runtime.h, keel/telemetry.h, docs/scheduling.md):
 *
 *   runtime_api        creation and its validation, defaults, NULL handling,
 *                      tick numbering, dt, schedule installation and
 *                      replacement, counters;
 *   runtime_driver     the absolute-deadline metronome through the injected
 *                      clock (runtime_test_set_clock), the wait strategy
 *                      (driver_wait_phase), the TickDriver thread;
 *   runtime_watchdog   a slow system is reported (log event + telemetry), a
 *                      fast one is not;
 *   runtime_telemetry  tick and system records, the ring, bad indices;
 *   runtime_trace      the Chrome trace export, checked with a strict JSON
 *                      parser written here.
 *
 * No sleeps as synchronisation and no wall-time assertions: the metronome is
 * driven by a fake clock; the threaded tests wait on condition variables that
 * systems or the log handler signal, each wait guarded by a generous timeout
 * that fails the test instead of hanging it. Assertions are made on the test
 * thread only; systems record what they see.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "runtime/runtime_internal.h"

#define WAIT_GUARD_S 60 /* a wait that takes this long is a failure, not a hang */

/* ---- fixture helpers ---------------------------------------------------------- */

typedef struct pos_t {
    int32_t x, y;
} pos_t;

static const keel_field pos_fields[] = {
    {.name = "x", .type = KEEL_I32, .offset = 0, .count = 0},
    {.name = "y", .type = KEEL_I32, .offset = 4, .count = 0},
};

static keel_component reg_pos(keel_runtime *rt)
{
    return tu_reg(keel_runtime_world(rt), "pos", sizeof(pos_t), KEEL_VERSIONED, pos_fields, 2);
}

/* A callback system, optionally ordered after one other system. */
static keel_system add_cb(keel_schedule *s, const char *name, keel_system_fn fn, void *user, const char *after)
{
    keel_system_desc d = {.name = name, .kind = KEEL_SYSTEM_CALLBACK, .run = fn, .user = user};
    d.after[0] = after;
    return add_sys(s, &d);
}

/* ---- systems used by several suites -------------------------------------------- */

static int sys_count(keel_ctx *ctx, void *user)
{
    (void)ctx;
    atomic_fetch_add((_Atomic uint64_t *)user, 1);
    return 0;
}

/* Spawns `n` pos entities per run. */
typedef struct spawn_arg {
    keel_component pos;
    uint32_t n;
} spawn_arg;

static int sys_spawn(keel_ctx *ctx, void *user)
{
    const spawn_arg *a = user;
    for (uint32_t i = 0; i < a->n; i++) {
        pos_t p = {(int32_t)i, (int32_t)keel_ctx_tick(ctx)};
        keel_init in[1] = {{a->pos, &p}};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* Records a spawn, then fails by returning an error: the spawn must vanish. */
static int sys_fail_return(keel_ctx *ctx, void *user)
{
    const spawn_arg *a = user;
    pos_t p = {-1, -1};
    keel_init in[1] = {{a->pos, &p}};
    (void)keel_cmd_spawn(keel_ctx_commands(ctx), in, 1);
    return KEEL_EIO;
}

/* Fails through keel_txn_fail with rc 0 (documented to mean KEEL_EINVAL). */
static int sys_fail_txn(keel_ctx *ctx, void *user)
{
    (void)user;
    keel_txn_fail(ctx, 0);
    return 0;
}

/* ---- a condition variable counter (waits are guarded) --------------------------- */

typedef struct signal_t {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t count;
} signal_t;

static void sig_init(signal_t *s)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &a);
    pthread_condattr_destroy(&a);
    s->count = 0;
}

static void sig_destroy(signal_t *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static void sig_bump(signal_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->count++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static uint64_t sig_count(signal_t *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t c = s->count;
    pthread_mutex_unlock(&s->mu);
    return c;
}

static struct timespec guard_deadline(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += WAIT_GUARD_S;
    return ts;
}

/* Wait until count >= n; false when the guard ran out. */
static bool sig_wait_at_least(signal_t *s, uint64_t n)
{
    struct timespec dl = guard_deadline();
    bool ok = true;
    pthread_mutex_lock(&s->mu);
    while (s->count < n) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) != 0 && s->count < n) {
            ok = false;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* =============================================================================
 * runtime_api
 * ============================================================================= */

START_TEST(test_create_bad_desc)
{
    struct {
        keel_runtime_desc d;
        const char *field;
    } cases[] = {
        {{.workers = -2}, "workers"},
        {{.workers = 65}, "workers"},
        {{.workers = INT32_MIN}, "workers"},
        {{.telemetry_capacity = 1000}, "telemetry_capacity"},
        {{.telemetry_capacity = 3}, "telemetry_capacity"},
        {{.watchdog_seconds = -1.0}, "watchdog_seconds"},
        {{.watchdog_seconds = -0.001}, "watchdog_seconds"},
        {{.tick_rate_hz = NAN}, "tick_rate_hz"},
        {{.tick_rate_hz = INFINITY}, "tick_rate_hz"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_runtime *rt = NULL;
        int rc = keel_runtime_create(&cases[i].d, &rt);
        ck_assert_msg(rc == KEEL_EINVAL, "case %zu (%s): got %s", i, cases[i].field, keel_strerror(rc));
        ck_assert_msg(rt == NULL, "case %zu: *out written on failure", i);
        ck_assert_msg(strstr(keel_last_error(), cases[i].field) != NULL, "case %zu: last error '%s' does not name '%s'",
                      i, keel_last_error(), cases[i].field);
    }
    /* a NULL out is refused as well */
    keel_runtime_desc ok = {.workers = 1};
    ck_assert_rc(keel_runtime_create(&ok, NULL), KEEL_EINVAL);
}
END_TEST

/* Durations that are not finite, or too long for 64-bit nanoseconds, are bad
 * desc fields too: they must be refused (or clamped), never converted to an
 * arbitrary watchdog period (a float-to-integer conversion out of range is
 * undefined behaviour; on x86 1e30 s turns into 0 ns: report everything). */
START_TEST(test_create_bad_watchdog_range)
{
    const double vals[] = {NAN, INFINITY, 1e30};
    char failures[512] = "";
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        keel_runtime *rt = NULL;
        keel_runtime_desc d = {.workers = 1, .watchdog_seconds = vals[i]};
        int rc = keel_runtime_create(&d, &rt);
        bool ok = rc == KEEL_EINVAL ? strstr(keel_last_error(), "watchdog_seconds") != NULL
                                    : rc == KEEL_OK && !isnan(vals[i]) && rt->watchdog_ns >= 1000000000000000000ull;
        if (!ok) {
            size_t n = strlen(failures);
            snprintf(failures + n, sizeof failures - n, " [watchdog_seconds=%g: %s, watchdog_ns=%llu]", vals[i],
                     keel_strerror(rc), rt ? (unsigned long long)rt->watchdog_ns : 0ull);
        }
        keel_runtime_close(rt);
    }
    ck_assert_msg(failures[0] == 0, "accepted without a sane period:%s", failures);
}
END_TEST

START_TEST(test_create_defaults)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t cpus = n < 1 ? 1 : n > 64 ? 64 : (uint32_t)n;

    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = -1});
    ck_assert_uint_eq(keel_runtime_workers(rt), cpus);
    ck_assert_ptr_nonnull(keel_runtime_world(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
    keel_runtime_close(rt);

    rt = tu_rt_new((keel_runtime_desc){.workers = 0});
    ck_assert_uint_eq(keel_runtime_workers(rt), cpus);
    keel_runtime_close(rt);

    /* a NULL desc is all defaults */
    rt = NULL;
    ck_assert_ok(keel_runtime_create(NULL, &rt));
    ck_assert_uint_eq(keel_runtime_workers(rt), cpus);
    keel_runtime_close(rt);

    rt = tu_rt_new((keel_runtime_desc){.workers = 3});
    ck_assert_uint_eq(keel_runtime_workers(rt), 3);
    keel_runtime_close(rt);

    /* boundaries that are valid */
    rt = tu_rt_new((keel_runtime_desc){.workers = 1, .telemetry_capacity = 1, .tick_rate_hz = 100000});
    ck_assert_uint_eq(keel_runtime_workers(rt), 1);
    keel_runtime_close(rt);
}
END_TEST

/* Default telemetry capacity is 1024: tick 1 survives 1024 ticks, not 1025. */
START_TEST(test_default_telemetry_capacity)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    keel_tick_record r;
    tu_step_n(rt, 1024);
    ck_assert_ok(keel_telemetry_tick(rt, 1, &r));
    ck_assert_uint_eq(r.tick, 1);
    ck_assert_ok(keel_telemetry_tick(rt, 1024, &r));
    ck_assert_uint_eq(r.tick, 1024);
    tu_step_n(rt, 1);
    ck_assert_rc(keel_telemetry_tick(rt, 1, &r), KEEL_ENOENT);
    ck_assert_ok(keel_telemetry_tick(rt, 2, &r));
    ck_assert_uint_eq(r.tick, 2);
    ck_assert_ok(keel_telemetry_tick(rt, 1025, &r));
    ck_assert_uint_eq(r.tick, 1025);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_step_without_schedule)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    ck_assert_rc(keel_runtime_step(rt), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "schedule"));
    ck_assert_rc(keel_runtime_run(rt, 3), KEEL_EINVAL);
    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.ticks, 0);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_null_args)
{
    ck_assert_rc(keel_runtime_step(NULL), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_run(NULL, 1), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_start(NULL), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_stop(NULL), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_sync_retry(NULL), KEEL_EINVAL);
    keel_runtime_sync_discard(NULL);
    keel_runtime_close(NULL);
    ck_assert_ptr_null(keel_runtime_world(NULL));
    ck_assert_uint_eq(keel_runtime_workers(NULL), 0);
    ck_assert_uint_eq(keel_runtime_tick(NULL), 0);

    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    ck_assert_ok(keel_schedule_build(s));
    ck_assert_rc(keel_runtime_set_schedule(NULL, s), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_set_schedule(rt, NULL), KEEL_EINVAL);
    ck_assert_ok(keel_runtime_set_schedule(rt, s));

    ck_assert_ptr_null(keel_ctx_world(NULL));
    ck_assert_uint_eq(keel_ctx_tick(NULL), 0);
    ck_assert(keel_ctx_dt(NULL) == 0.0f);
    ck_assert_uint_eq(keel_ctx_worker(NULL), 0);
    ck_assert_ptr_null(keel_ctx_system_name(NULL));
    ck_assert_ptr_null(keel_ctx_commands(NULL));
    keel_txn_fail(NULL, KEEL_EIO);

    keel_tick_record tr;
    keel_system_record sr;
    ck_assert_rc(keel_telemetry_tick(NULL, 1, &tr), KEEL_EINVAL);
    ck_assert_rc(keel_telemetry_tick(rt, 1, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_telemetry_system(NULL, 1, 0, &sr), KEEL_EINVAL);
    ck_assert_rc(keel_telemetry_system(rt, 1, 0, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_trace_export(NULL, "/tmp/x.json"), KEEL_EINVAL);
    ck_assert_rc(keel_trace_export(rt, NULL), KEEL_EINVAL);

    keel_runtime_stats st;
    memset(&st, 0xab, sizeof st);
    keel_runtime_stats_get(NULL, &st);
    ck_assert_uint_eq(st.ticks, 0);
    ck_assert_uint_eq(st.systems_run, 0);
    keel_runtime_stats_get(rt, NULL);

    /* nothing above disturbed the runtime */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    keel_runtime_close(rt);
}
END_TEST

/* What a system saw through its context. */
typedef struct ctx_seen {
    keel_runtime *rt;
    uint64_t ctx_tick[16];
    uint64_t rt_tick[16];
    float dt[16];
    uint32_t worker[16];
    bool world_ok[16], name_ok[16], cmds_ok[16];
    uint32_t n;
} ctx_seen;

static int sys_seen(keel_ctx *ctx, void *user)
{
    ctx_seen *c = user;
    if (c->n < 16) {
        c->ctx_tick[c->n] = keel_ctx_tick(ctx);
        c->rt_tick[c->n] = keel_runtime_tick(c->rt);
        c->dt[c->n] = keel_ctx_dt(ctx);
        c->worker[c->n] = keel_ctx_worker(ctx);
        c->world_ok[c->n] = keel_ctx_world(ctx) == keel_runtime_world(c->rt);
        const char *nm = keel_ctx_system_name(ctx);
        c->name_ok[c->n] = nm && strcmp(nm, "seen") == 0;
        c->cmds_ok[c->n] = keel_ctx_commands(ctx) != NULL;
    }
    c->n++;
    return 0;
}

static void check_tick_numbers(int32_t workers)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers});
    ctx_seen c = {.rt = rt};
    keel_schedule *s = sched_new(rt);
    add_cb(s, "seen", sys_seen, &c, NULL);
    tu_install(rt, s);
    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
    for (uint64_t t = 1; t <= 5; t++) {
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(keel_runtime_tick(rt), t);
    }
    ck_assert_uint_eq(c.n, 5);
    for (uint32_t i = 0; i < 5; i++) {
        ck_assert_uint_eq(c.ctx_tick[i], i + 1);          /* the first tick is 1 */
        ck_assert_uint_eq(c.rt_tick[i] + 1, c.ctx_tick[i]); /* completed ticks + 1 while running */
        ck_assert(c.world_ok[i]);
        ck_assert(c.name_ok[i]);
        ck_assert(c.cmds_ok[i]);
        ck_assert_uint_lt(c.worker[i], (uint32_t)workers);
    }
    keel_runtime_close(rt);
}

START_TEST(test_tick_numbers_serial)
{
    check_tick_numbers(1);
}
END_TEST

START_TEST(test_tick_numbers_parallel)
{
    check_tick_numbers(2);
}
END_TEST

/* on_first_tick runs once, inside tick 1, named "on_first_tick". */
typedef struct hook_seen {
    uint32_t calls;
    uint64_t tick;
    char name[32];
} hook_seen;

static int hook_record(keel_ctx *ctx, void *user)
{
    hook_seen *h = user;
    h->calls++;
    h->tick = keel_ctx_tick(ctx);
    snprintf(h->name, sizeof h->name, "%s", keel_ctx_system_name(ctx) ? keel_ctx_system_name(ctx) : "(null)");
    return 0;
}

START_TEST(test_first_tick_hook_tick)
{
    hook_seen h = {0};
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .on_first_tick = hook_record, .hook_user = &h});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 3);
    ck_assert_uint_eq(h.calls, 1);
    ck_assert_uint_eq(h.tick, 1);
    ck_assert_str_eq(h.name, "on_first_tick");
    keel_runtime_close(rt);
}
END_TEST

static float dt_seen(double hz)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = hz});
    ctx_seen c = {.rt = rt};
    keel_schedule *s = sched_new(rt);
    add_cb(s, "seen", sys_seen, &c, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(c.n, 1);
    keel_runtime_close(rt);
    return c.dt[0];
}

START_TEST(test_ctx_dt)
{
    ck_assert(dt_seen(50.0) == (float)(1.0 / 50.0));
    ck_assert(dt_seen(30.0) == (float)(1.0 / 30.0));
    ck_assert(dt_seen(0) == (float)(1.0 / 60.0));  /* default rate 60 */
    ck_assert(dt_seen(-1.0) == 1.0f / 60.0f);      /* unthrottled: 1/60 */
}
END_TEST

START_TEST(test_stale_schedule)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    reg_pos(rt);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    keel_component c2 = 0;
    keel_component_desc tag = {.name = "tag", .size = 0};
    ck_assert_ok(keel_component_register(keel_runtime_world(rt), &tag, &c2));
    ck_assert_rc(keel_runtime_step(rt), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "stale"));
    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
    /* a schedule built now runs */
    keel_schedule *s2 = sched_new(rt);
    add_cb(s2, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s2);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_replace_schedule)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2});
    _Atomic uint64_t a = 0, b = 0, c = 0;
    keel_schedule *s1 = sched_new(rt);
    add_cb(s1, "a", sys_count, &a, NULL);
    tu_install(rt, s1);
    tu_step_n(rt, 2);
    ck_assert_uint_eq(atomic_load(&a), 2);

    /* refused replacements leave the installed schedule in place */
    keel_schedule *unbuilt = sched_new(rt);
    add_cb(unbuilt, "x", tu_sys_noop, NULL, NULL);
    ck_assert_rc(keel_runtime_set_schedule(rt, unbuilt), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not built"));
    keel_schedule_destroy(unbuilt);

    keel_schedule *bad = sched_new(rt);
    add_cb(bad, "dup", tu_sys_noop, NULL, NULL);
    add_cb(bad, "dup", tu_sys_noop, NULL, NULL);
    ck_assert_rc(keel_schedule_build(bad), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_set_schedule(rt, bad), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "errors"));
    keel_schedule_destroy(bad);

    keel_runtime *other = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_schedule *foreign = sched_new(other);
    add_cb(foreign, "f", tu_sys_noop, NULL, NULL);
    ck_assert_ok(keel_schedule_build(foreign));
    ck_assert_rc(keel_runtime_set_schedule(rt, foreign), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "another runtime"));
    keel_schedule_destroy(foreign);
    keel_runtime_close(other);

    tu_step_n(rt, 1);
    ck_assert_uint_eq(atomic_load(&a), 3);

    /* a real replacement: the old schedule is freed (ASan checks), the new runs */
    keel_schedule *s2 = sched_new(rt);
    add_cb(s2, "b", sys_count, &b, NULL);
    add_cb(s2, "c", sys_count, &c, "b");
    tu_install(rt, s2);
    tu_step_n(rt, 2);
    ck_assert_uint_eq(atomic_load(&a), 3);
    ck_assert_uint_eq(atomic_load(&b), 2);
    ck_assert_uint_eq(atomic_load(&c), 2);
    ck_assert_uint_eq(keel_runtime_tick(rt), 5); /* the tick count carries on */

    keel_system_record sr;
    ck_assert_ok(keel_telemetry_system(rt, 5, 1, &sr));
    ck_assert_uint_eq(sr.system, 1);
    ck_assert_int_eq(sr.skip, KEEL_SKIP_NONE);
    ck_assert_rc(keel_telemetry_system(rt, 5, 2, &sr), KEEL_EINVAL);

    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.ticks, 5);
    ck_assert_uint_eq(st.systems_run, 3 + 2 * 2);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_stats_counts)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2});
    keel_component pos = reg_pos(rt);
    spawn_arg two = {pos, 2}, one = {pos, 1};
    _Atomic uint64_t dep = 0;
    keel_schedule *s = sched_new(rt);
    add_cb(s, "spawn2", sys_spawn, &two, NULL);
    add_cb(s, "fail", sys_fail_return, &one, NULL);
    add_cb(s, "dependent", sys_count, &dep, "fail");
    add_cb(s, "dependent2", sys_count, &dep, "dependent");
    add_cb(s, "spawn1", sys_spawn, &one, NULL);
    tu_install(rt, s);

    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.ticks, 0);
    ck_assert_uint_eq(st.commands_applied, 0);

    tu_step_n(rt, 4);
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.ticks, 4);
    ck_assert_uint_eq(st.systems_run, 4 * 3);    /* spawn2, fail (ran and failed), spawn1 */
    ck_assert_uint_eq(st.systems_failed, 4 * 1);
    ck_assert_uint_eq(st.systems_skipped, 4 * 2); /* dependent, dependent2 */
    ck_assert_uint_eq(st.commands_applied, 4 * 3); /* the failed system's spawn vanished */
    ck_assert_uint_eq(st.watchdog_reports, 0);
    ck_assert_uint_eq(atomic_load(&dep), 0);
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(rt)), 12);
    /* transactions: the two successful systems commit, the failing one
     * aborts, the skipped ones have none; durability counters stay 0 */
    ck_assert_uint_eq(st.commits, 4 * 2);
    ck_assert_uint_eq(st.aborts, 4 * 1);
    ck_assert_uint_eq(st.conflicts, 0);
    ck_assert_uint_eq(st.wal_bytes, 0);
    keel_runtime_close(rt);
}
END_TEST

/* While the TickDriver runs, the caller may not tick or swap the schedule. */
static int sys_beat(keel_ctx *ctx, void *user);

START_TEST(test_busy_while_driver_runs)
{
    signal_t sig;
    sig_init(&sig);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = 1000});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "beat", sys_beat, &sig, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "driver"));
    ck_assert_rc(keel_runtime_run(rt, 2), KEEL_EBUSY);
    ck_assert(sig_wait_at_least(&sig, 1));
    ck_assert_rc(keel_runtime_stop(rt), 0);
    uint64_t t = keel_runtime_tick(rt);
    ck_assert_uint_eq(sig_count(&sig), t); /* the refused calls ran no tick */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), t + 1);
    keel_runtime_close(rt);
    sig_destroy(&sig);
}
END_TEST

static Suite *runtime_api(void)
{
    Suite *s = suite_create("runtime_api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_create_bad_desc);
    tcase_add_test(tc, test_create_bad_watchdog_range);
    tcase_add_test(tc, test_create_defaults);
    tcase_add_test(tc, test_default_telemetry_capacity);
    tcase_add_test(tc, test_step_without_schedule);
    tcase_add_test(tc, test_null_args);
    tcase_add_test(tc, test_tick_numbers_serial);
    tcase_add_test(tc, test_tick_numbers_parallel);
    tcase_add_test(tc, test_first_tick_hook_tick);
    tcase_add_test(tc, test_ctx_dt);
    tcase_add_test(tc, test_stale_schedule);
    tcase_add_test(tc, test_replace_schedule);
    tcase_add_test(tc, test_stats_counts);
    tcase_add_test(tc, test_busy_while_driver_runs);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * runtime_driver
 * ============================================================================= */

#define FC_MAX 64

/* The fake clock: wait_until records the deadline and jumps the clock to it
 * (plus `overshoot`, a late wake-up) unless it already passed. */
typedef struct fake_clock {
    _Atomic uint64_t now;
    uint64_t overshoot;
    uint32_t nwaits;
    uint64_t deadline[FC_MAX];
    uint64_t called_at[FC_MAX];
    /* per tick (0-based): fake duration, and the clock when its system ran */
    uint64_t duration[FC_MAX];
    uint64_t started_at[FC_MAX];
    uint32_t nticks;
    keel_runtime *stop_rt;     /* keel_runtime_stop(stop_rt) inside wait number stop_at (1-based), */
    uint32_t stop_at;
    uint32_t stop_in_tick;     /* or inside the system of tick stop_in_tick */
} fake_clock;

static uint64_t fake_now(void *user)
{
    return atomic_load(&((fake_clock *)user)->now);
}

static void fake_wait(uint64_t deadline, void *user)
{
    fake_clock *fc = user;
    uint64_t now = atomic_load(&fc->now);
    if (fc->nwaits < FC_MAX) {
        fc->deadline[fc->nwaits] = deadline;
        fc->called_at[fc->nwaits] = now;
    }
    fc->nwaits++;
    if (now < deadline)
        atomic_store(&fc->now, deadline + fc->overshoot);
    if (fc->stop_rt && fc->nwaits == fc->stop_at)
        ck_assert_ok(keel_runtime_stop(fc->stop_rt)); /* as another thread would, mid-wait */
}

/* The tick's work "takes" duration[k] of fake time. */
static int sys_fake_work(keel_ctx *ctx, void *user)
{
    fake_clock *fc = user;
    uint64_t k = keel_ctx_tick(ctx) - 1;
    uint64_t now = atomic_load(&fc->now);
    if (k < FC_MAX) {
        fc->started_at[k] = now;
        atomic_store(&fc->now, now + fc->duration[k]);
    }
    fc->nticks++;
    if (fc->stop_rt && fc->stop_in_tick == keel_ctx_tick(ctx))
        ck_assert_ok(keel_runtime_stop(fc->stop_rt)); /* as another thread would, mid-tick */
    return 0;
}

static keel_runtime *fake_rt(fake_clock *fc, double hz)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = hz});
    runtime_test_set_clock(rt, fake_now, fake_wait, fc);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "work", sys_fake_work, fc, NULL);
    tu_install(rt, s);
    return rt;
}

/* Run n ticks from fake time t0 and check every deadline and tick start
 * against the model: deadline k = t0 + k * interval (k >= 1), the tick
 * starts at max(deadline, end of the previous tick) (+ overshoot on a real wait). */
static void check_metronome(double hz, const uint64_t *dur, uint32_t n, uint64_t overshoot)
{
    const uint64_t t0 = 5000000000ull;
    const uint64_t interval = (uint64_t)(1e9 / hz);
    fake_clock *fc = calloc(1, sizeof *fc);
    ck_assert_ptr_nonnull(fc);
    atomic_store(&fc->now, t0);
    fc->overshoot = overshoot;
    memcpy(fc->duration, dur, n * sizeof *dur);
    keel_runtime *rt = fake_rt(fc, hz);

    ck_assert_ok(keel_runtime_run(rt, n));
    ck_assert_uint_eq(keel_runtime_tick(rt), n);
    ck_assert_uint_eq(fc->nticks, n);

    /* tolerate a no-op wait for deadline 0 (= t0) before the first tick */
    uint32_t w = 0;
    if (fc->nwaits > 0 && fc->deadline[0] == t0)
        w = 1;
    ck_assert_uint_eq(fc->nwaits - w, n - 1);

    uint64_t t = t0;
    for (uint32_t k = 0; k < n; k++) {
        if (k > 0) {
            uint64_t want = t0 + k * interval;
            ck_assert_msg(fc->deadline[w] == want,
                          "wait %u: deadline %llu, want t0 + %u * %llu = %llu (previous tick started at %llu)", k,
                          (unsigned long long)fc->deadline[w], k, (unsigned long long)interval,
                          (unsigned long long)want, (unsigned long long)fc->started_at[k - 1]);
            ck_assert_uint_eq(fc->called_at[w], t);
            if (t < want)
                t = want + overshoot; /* a real wait; a passed deadline returns at once */
            w++;
        }
        ck_assert_msg(fc->started_at[k] == t, "tick %u started at %llu, want %llu", k + 1,
                      (unsigned long long)fc->started_at[k], (unsigned long long)t);
        t += dur[k];
    }
    keel_runtime_close(rt);
    free(fc);
}

#define MS 1000000ull

START_TEST(test_metronome_grid)
{
    /* 60 Hz; tick 2 overruns (30 ms), tick 6 overruns by more than two intervals */
    const uint64_t dur[] = {2 * MS, 30 * MS, 1 * MS, 5 * MS, 16 * MS, 40 * MS, 0, 3 * MS, 1 * MS, 1 * MS};
    check_metronome(60.0, dur, 10, 0);
}
END_TEST

START_TEST(test_metronome_overrun_catches_up)
{
    /* explicit view of one overrun at 60 Hz */
    const uint64_t t0 = 5000000000ull, I = (uint64_t)(1e9 / 60);
    ck_assert_uint_eq(I, 16666666);
    fake_clock *fc = calloc(1, sizeof *fc);
    atomic_store(&fc->now, t0);
    const uint64_t dur[] = {2 * MS, 30 * MS, 1 * MS, 1 * MS};
    memcpy(fc->duration, dur, sizeof dur);
    keel_runtime *rt = fake_rt(fc, 60.0);
    ck_assert_ok(keel_runtime_run(rt, 4));
    uint32_t w = fc->nwaits == 4 && fc->deadline[0] == t0 ? 1 : 0;
    ck_assert_uint_eq(fc->nwaits - w, 3);
    /* deadline 1: waited for, tick 2 starts exactly on it */
    ck_assert_uint_eq(fc->deadline[w + 0], t0 + 1 * I);
    ck_assert_uint_eq(fc->started_at[1], t0 + 1 * I);
    /* tick 2 ends at t0 + I + 30 ms, past deadline 2: the deadline stays on
     * the grid and the wait returns at once, tick 3 starts immediately */
    ck_assert_uint_eq(fc->deadline[w + 1], t0 + 2 * I);
    ck_assert_uint_gt(fc->called_at[w + 1], t0 + 2 * I);
    ck_assert_uint_eq(fc->started_at[2], t0 + I + 30 * MS);
    /* deadline 3 is t0 + 3I, not (start of tick 3) + I */
    ck_assert_uint_eq(fc->deadline[w + 2], t0 + 3 * I);
    ck_assert_uint_ne(fc->deadline[w + 2], fc->started_at[2] + I);
    ck_assert_uint_eq(fc->started_at[3], t0 + 3 * I);
    keel_runtime_close(rt);
    free(fc);
}
END_TEST

START_TEST(test_metronome_late_wakeups_do_not_drift)
{
    /* every wake-up is 3 ms late: deadlines must not accumulate the lateness */
    const uint64_t dur[] = {1 * MS, 1 * MS, 1 * MS, 1 * MS, 1 * MS, 1 * MS, 1 * MS, 1 * MS};
    check_metronome(60.0, dur, 8, 3 * MS);
}
END_TEST

START_TEST(test_metronome_other_rates)
{
    const uint64_t dur[] = {1 * MS, 9 * MS, 1 * MS, 0, 2 * MS, 1 * MS};
    check_metronome(144.0, dur, 6, 0); /* interval 6944444 */
    check_metronome(1000.0, dur, 6, 0);
    check_metronome(10.0, dur, 6, 0);
}
END_TEST

START_TEST(test_metronome_unthrottled_never_waits)
{
    fake_clock *fc = calloc(1, sizeof *fc);
    atomic_store(&fc->now, 1000);
    keel_runtime *rt = fake_rt(fc, -1.0);
    ck_assert_ok(keel_runtime_run(rt, 10));
    ck_assert_ok(keel_runtime_run(rt, 10)); /* back to back, still no waiting */
    ck_assert_uint_eq(fc->nwaits, 0);
    ck_assert_uint_eq(keel_runtime_tick(rt), 20);
    ck_assert_uint_eq(fc->nticks, 20);
    /* a run of 0 ticks runs nothing */
    ck_assert_ok(keel_runtime_run(rt, 0));
    ck_assert_uint_eq(keel_runtime_tick(rt), 20);
    keel_runtime_close(rt);
    free(fc);
}
END_TEST

START_TEST(test_metronome_second_run_restarts_grid)
{
    const uint64_t I = (uint64_t)(1e9 / 60);
    fake_clock *fc = calloc(1, sizeof *fc);
    atomic_store(&fc->now, 1000000000ull);
    keel_runtime *rt = fake_rt(fc, 60.0);
    ck_assert_ok(keel_runtime_run(rt, 3));
    uint64_t t1 = atomic_load(&fc->now) + 123 * MS; /* time passes between the runs */
    atomic_store(&fc->now, t1);
    uint32_t before = fc->nwaits;
    ck_assert_ok(keel_runtime_run(rt, 3));
    ck_assert_uint_eq(keel_runtime_tick(rt), 6);
    uint32_t w = before;
    if (fc->deadline[w] == t1)
        w++;
    ck_assert_uint_eq(fc->nwaits - w, 2);
    ck_assert_uint_eq(fc->deadline[w], t1 + I);
    ck_assert_uint_eq(fc->deadline[w + 1], t1 + 2 * I);
    keel_runtime_close(rt);
    free(fc);
}
END_TEST

/* Runs called back to back keep the rate: the second run's first tick
 * waits for the grid point the first run left (keel-world runs its ticks in
 * batches of rate / 10 + 1: at 10 Hz, batches of two must still run at 10 Hz). */
START_TEST(test_metronome_back_to_back_runs_share_the_grid)
{
    const uint64_t t0 = 1000000000ull, I = (uint64_t)(1e9 / 10);
    fake_clock *fc = calloc(1, sizeof *fc);
    atomic_store(&fc->now, t0);
    for (int k = 0; k < 6; k++)
        fc->duration[k] = 1 * MS;
    keel_runtime *rt = fake_rt(fc, 10.0);
    for (int run = 0; run < 3; run++)
        ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->nticks, 6);
    for (uint32_t k = 0; k < 6; k++)
        ck_assert_msg(fc->started_at[k] == t0 + k * I, "tick %u started at t0 + %llu, want t0 + %u * %llu", k + 1,
                      (unsigned long long)(fc->started_at[k] - t0), k, (unsigned long long)I);
    /* a step between runs does not move the grid either */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_ok(keel_runtime_run(rt, 1));
    ck_assert_uint_eq(fc->nticks, 8);
    ck_assert_uint_eq(fc->started_at[7], t0 + 6 * I);
    /* a clock that went back puts the grid point more than an interval
     * ahead: not waited for, the run starts a fresh grid at the call */
    uint64_t back = atomic_load(&fc->now) - 10 * I;
    atomic_store(&fc->now, back);
    uint32_t w = fc->nwaits;
    ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->started_at[8], back);
    ck_assert_uint_eq(fc->nwaits, w + 1);
    ck_assert_uint_eq(fc->deadline[w], back + I);
    keel_runtime_close(rt);
    free(fc);
}
END_TEST

/* A stop requested while the metronome waits for a tick ends the run
 * before that tick: not one more. */
START_TEST(test_metronome_stop_during_wait_runs_no_more_ticks)
{
    fake_clock *fc = calloc(1, sizeof *fc);
    atomic_store(&fc->now, 1000000000ull);
    keel_runtime *rt = fake_rt(fc, 60.0);
    fc->stop_rt = rt;
    fc->stop_at = 2; /* during the wait before tick 3 */
    ck_assert_ok(keel_runtime_run(rt, 5));
    ck_assert_uint_eq(fc->nwaits, 2);
    ck_assert_uint_eq(fc->nticks, 2);
    ck_assert_uint_eq(keel_runtime_tick(rt), 2);
    /* the stop ended that run only */
    fc->stop_rt = NULL;
    ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->nticks, 4);
    /* a stop while nothing runs ends the next run before its first tick, and only that one */
    ck_assert_ok(keel_runtime_stop(rt));
    ck_assert_ok(keel_runtime_run(rt, 3));
    ck_assert_uint_eq(fc->nticks, 4);
    ck_assert_ok(keel_runtime_run(rt, 3));
    ck_assert_uint_eq(fc->nticks, 7);
    /* a stop during a run's last tick comes too late for it: it ends the next */
    fc->stop_rt = rt;
    fc->stop_at = 0;
    fc->stop_in_tick = 9;
    ck_assert_ok(keel_runtime_run(rt, 2)); /* ticks 8 and 9 */
    ck_assert_uint_eq(fc->nticks, 9);
    ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->nticks, 9);
    /* during an earlier tick, it ends that run after the tick, and only that run */
    fc->stop_in_tick = 10;
    ck_assert_ok(keel_runtime_run(rt, 3));
    ck_assert_uint_eq(fc->nticks, 10);
    fc->stop_rt = NULL;
    ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->nticks, 12);
    keel_runtime_close(rt);
    free(fc);
}
END_TEST

static void *stop_from_another_thread(void *rt)
{
    ck_assert_ok(keel_runtime_stop(rt));
    return NULL;
}

/* keel_runtime_stop cuts the metronome's sleep short (real clock): a driver
 * whose next tick is 100 s away stops at once without running it, and so
 * does a run stopped from another thread -- whether the stop lands before
 * its wait or during it, it runs no tick. Without the cut this test could
 * not end within its 30 s timeout (it needs 200 s). */
START_TEST(test_stop_cuts_the_metronome_sleep_short)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = 0.01}); /* the lowest: 100 s */
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_start(rt));
    while (keel_runtime_tick(rt) < 1) /* the first tick runs at once */
        sched_yield();
    ck_assert_ok(keel_runtime_stop(rt)); /* the driver sleeps toward tick 2 */
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, stop_from_another_thread, rt), 0);
    ck_assert_ok(keel_runtime_run(rt, 5)); /* continues the grid: tick 2 is 100 s away */
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    keel_runtime_close(rt);
}
END_TEST

/* Low rates: 0.5 Hz is a 2 s interval (must be honoured); 1e-12 Hz is
 * 1e21 ns, beyond 64-bit nanoseconds: it must be refused, or at least not
 * turn into "no waiting at all" (today (uint64_t)1e21 is undefined and gives 0). */
static uint64_t first_deadline_at(double hz, uint64_t t0, int *create_rc)
{
    keel_runtime *rt = NULL;
    keel_runtime_desc d = {.workers = 1, .tick_rate_hz = hz};
    *create_rc = keel_runtime_create(&d, &rt);
    if (*create_rc)
        return 0;
    fake_clock *fc = calloc(1, sizeof *fc);
    ck_assert_ptr_nonnull(fc);
    atomic_store(&fc->now, t0);
    runtime_test_set_clock(rt, fake_now, fake_wait, fc);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "work", sys_fake_work, fc, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_run(rt, 2));
    ck_assert_uint_eq(fc->nticks, 2);
    uint64_t dl = fc->nwaits ? fc->deadline[fc->nwaits - 1] : 0;
    keel_runtime_close(rt);
    free(fc);
    return dl;
}

START_TEST(test_metronome_low_rates)
{
    const uint64_t t0 = 1000;
    int rc;
    uint64_t dl = first_deadline_at(0.5, t0, &rc);
    ck_assert_rc(rc, KEEL_OK);
    ck_assert_uint_eq(dl, t0 + 2000000000ull);

    dl = first_deadline_at(1e-12, t0, &rc);
    if (rc == KEEL_EINVAL) {
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "tick_rate_hz"));
    } else {
        ck_assert_rc(rc, KEEL_OK);
        ck_assert_msg(dl > t0 + 1000000000000000000ull,
                      "tick_rate_hz = 1e-12 accepted, but the second tick's deadline is t0 + %llu ns",
                      (unsigned long long)(dl - t0));
    }
}
END_TEST

START_TEST(test_wait_phase)
{
    const uint64_t d = 10000000000ull;
    ck_assert_int_eq(driver_wait_phase(d, d), RT_WAIT_DONE);
    ck_assert_int_eq(driver_wait_phase(d + 1, d), RT_WAIT_DONE);
    ck_assert_int_eq(driver_wait_phase(d + 5000000000ull, d), RT_WAIT_DONE);
    ck_assert_int_eq(driver_wait_phase(UINT64_MAX, d), RT_WAIT_DONE);
    ck_assert_int_eq(driver_wait_phase(0, d), RT_WAIT_SLEEP);
    ck_assert_int_eq(driver_wait_phase(d - RT_SLEEP_SLACK_NS - 1, d), RT_WAIT_SLEEP);
    ck_assert_int_eq(driver_wait_phase(d - RT_SLEEP_SLACK_NS, d), RT_WAIT_YIELD);
    ck_assert_int_eq(driver_wait_phase(d - RT_SLEEP_SLACK_NS + 1, d), RT_WAIT_YIELD);
    ck_assert_int_eq(driver_wait_phase(d - RT_SPIN_NS - 1, d), RT_WAIT_YIELD);
    ck_assert_int_eq(driver_wait_phase(d - RT_SPIN_NS, d), RT_WAIT_SPIN);
    ck_assert_int_eq(driver_wait_phase(d - 1, d), RT_WAIT_SPIN);
    ck_assert_int_eq(driver_wait_phase(0, 1), RT_WAIT_SPIN);
    ck_assert_int_eq(driver_wait_phase(0, 0), RT_WAIT_DONE);
    /* the documented constants: spin the last 50 µs, sleep until 1 ms before */
    ck_assert_uint_eq(RT_SPIN_NS, 50000);
    ck_assert_uint_lt(RT_SPIN_NS, RT_SLEEP_SLACK_NS);
}
END_TEST

/* A system that signals every tick it runs (and counts them). */
static int sys_beat(keel_ctx *ctx, void *user)
{
    (void)ctx;
    sig_bump(user);
    return 0;
}

START_TEST(test_start_stop)
{
    signal_t sig;
    sig_init(&sig);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .tick_rate_hz = 1000});
    ck_assert_rc(keel_runtime_start(rt), KEEL_EINVAL); /* no schedule */
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "schedule"));
    ck_assert_rc(keel_runtime_stop(rt), 0);           /* not running */

    keel_schedule *s = sched_new(rt);
    add_cb(s, "beat", sys_beat, &sig, NULL);
    tu_install(rt, s);
    keel_schedule *other = sched_new(rt); /* built before the driver runs */
    add_cb(other, "other", tu_sys_noop, NULL, NULL);
    ck_assert_ok(keel_schedule_build(other));

    ck_assert_ok(keel_runtime_start(rt));
    ck_assert_rc(keel_runtime_start(rt), KEEL_EBUSY);
    ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
    ck_assert_rc(keel_runtime_run(rt, 1), KEEL_EBUSY);
    ck_assert_rc(keel_runtime_set_schedule(rt, other), KEEL_EBUSY);
    ck_assert_msg(sig_wait_at_least(&sig, 3), "the driver did not run 3 ticks within %d s", WAIT_GUARD_S);
    ck_assert_rc(keel_runtime_stop(rt), 0);

    uint64_t t = keel_runtime_tick(rt);
    ck_assert_uint_ge(t, 3);
    ck_assert_uint_eq(sig_count(&sig), t); /* one run per tick, none after stop returned */
    ck_assert_rc(keel_runtime_stop(rt), 0); /* stopping again: not running */
    ck_assert_uint_eq(keel_runtime_tick(rt), t);
    ck_assert_uint_eq(sig_count(&sig), t);
    keel_tick_record r;
    ck_assert_ok(keel_telemetry_tick(rt, t, &r));
    ck_assert_uint_eq(r.tick, t);
    ck_assert_uint_eq(r.target_ns, 1000000);

    /* after stop, stepping and replacing the schedule are allowed again */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), t + 1);
    ck_assert_uint_eq(sig_count(&sig), t + 1);

    /* restart */
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert(sig_wait_at_least(&sig, t + 3));
    ck_assert_rc(keel_runtime_stop(rt), 0);
    ck_assert_uint_ge(keel_runtime_tick(rt), t + 3);
    ck_assert_uint_eq(sig_count(&sig), keel_runtime_tick(rt));

    ck_assert_ok(keel_runtime_set_schedule(rt, other));
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_close(rt);
    sig_destroy(&sig);
}
END_TEST

START_TEST(test_close_while_running)
{
    signal_t sig;
    sig_init(&sig);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .tick_rate_hz = 1000});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "beat", sys_beat, &sig, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert(sig_wait_at_least(&sig, 1));
    ck_assert_int_eq(tu_threads_named("keel-driver"), 1);
    ck_assert_int_eq(tu_threads_named("keel-worker-1"), 1);
    keel_runtime_close(rt); /* stops the driver and joins everything */
    ck_assert(tu_threads_gone("keel-driver") && tu_threads_gone("keel-worker-1") && tu_threads_gone("keel-watchdog"));
    sig_destroy(&sig);
}
END_TEST

/* Spawns 3 entities on tick 1 (the world holds 2): the sync point fails. */
typedef struct flood_arg {
    keel_component pos;
    signal_t sig;
} flood_arg;

static int sys_flood_once(keel_ctx *ctx, void *user)
{
    flood_arg *a = user;
    int rc = 0;
    if (keel_ctx_tick(ctx) == 1) {
        for (int i = 0; i < 3 && !rc; i++) {
            pos_t p = {i, i};
            keel_init in[1] = {{a->pos, &p}};
            rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 1);
        }
    }
    sig_bump(&a->sig);
    return rc;
}

static keel_runtime *flood_rt(flood_arg *a, double hz)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = hz, .world = {.max_entities = 2}});
    a->pos = reg_pos(rt);
    sig_init(&a->sig);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "flood", sys_flood_once, a, NULL);
    tu_install(rt, s);
    return rt;
}

START_TEST(test_stop_returns_driver_error)
{
    flood_arg a;
    keel_runtime *rt = flood_rt(&a, 1000);
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert(sig_wait_at_least(&a.sig, 1));
    /* the driver stopped itself on the failed sync point of tick 1 */
    ck_assert_rc(keel_runtime_stop(rt), KEEL_ENOSPC);
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    ck_assert_uint_eq(sig_count(&a.sig), 1);
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(rt)), 2); /* the applied prefix stays */
    ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);                 /* pending commands */
    keel_runtime_sync_discard(rt);
    /* a restarted driver starts with status 0 */
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert(sig_wait_at_least(&a.sig, 3));
    ck_assert_rc(keel_runtime_stop(rt), 0);
    keel_runtime_close(rt);
    sig_destroy(&a.sig);
}
END_TEST

START_TEST(test_run_returns_step_error)
{
    flood_arg a;
    keel_runtime *rt = flood_rt(&a, -1);
    ck_assert_rc(keel_runtime_run(rt, 5), KEEL_ENOSPC);
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    ck_assert_rc(keel_runtime_run(rt, 5), KEEL_EBUSY);
    ck_assert_uint_eq(keel_runtime_tick(rt), 1);
    keel_runtime_sync_discard(rt);
    ck_assert_ok(keel_runtime_run(rt, 5));
    ck_assert_uint_eq(keel_runtime_tick(rt), 6);
    keel_runtime_close(rt);
    sig_destroy(&a.sig);
}
END_TEST

/* keel_runtime_run "until `ticks` more ticks ran or keel_runtime_stop was
 * called from another thread": a helper thread stops a run(UINT64_MAX). The
 * system notes the first tick that sees the stop returned; a tick after that
 * one means the stop was ignored, and the system then floods the world (2
 * entities max) so that run() ends with KEEL_ENOSPC instead of hanging. */
typedef struct stopper {
    keel_runtime *rt;
    keel_component pos;
    signal_t sig;
    _Atomic bool stop_returned;
    _Atomic int stop_rc;
    _Atomic bool helper_timed_out;
    uint64_t seen_at;
    uint64_t flooded_at;
} stopper;

static void *stopper_main(void *arg)
{
    stopper *st = arg;
    if (!sig_wait_at_least(&st->sig, 3))
        atomic_store(&st->helper_timed_out, true);
    atomic_store(&st->stop_rc, keel_runtime_stop(st->rt));
    atomic_store(&st->stop_returned, true);
    return NULL;
}

static int sys_stoppable(keel_ctx *ctx, void *user)
{
    stopper *st = user;
    uint64_t t = keel_ctx_tick(ctx);
    sig_bump(&st->sig);
    bool flood = t > 50000000; /* guard */
    if (atomic_load(&st->stop_returned)) {
        if (!st->seen_at)
            st->seen_at = t;
        else
            flood = true;
    }
    if (flood) {
        st->flooded_at = t;
        for (int i = 0; i < 3; i++) {
            pos_t p = {i, i};
            keel_init in[1] = {{st->pos, &p}};
            (void)keel_cmd_spawn(keel_ctx_commands(ctx), in, 1);
        }
    }
    return 0;
}

START_TEST(test_stop_ends_run_from_other_thread)
{
    stopper *st = calloc(1, sizeof *st);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .world = {.max_entities = 2}});
    st->rt = rt;
    st->pos = reg_pos(rt);
    sig_init(&st->sig);
    keel_schedule *s = sched_new(rt);
    add_cb(s, "stoppable", sys_stoppable, st, NULL);
    tu_install(rt, s);
    pthread_t helper;
    ck_assert_int_eq(pthread_create(&helper, NULL, stopper_main, st), 0);
    int rc = keel_runtime_run(rt, UINT64_MAX);
    pthread_join(helper, NULL);
    ck_assert(!atomic_load(&st->helper_timed_out));
    ck_assert_rc(atomic_load(&st->stop_rc), 0);
    ck_assert_msg(rc == 0 && st->flooded_at == 0,
                  "keel_runtime_run went on after keel_runtime_stop returned on another thread: it ran tick %llu "
                  "after the stop was seen at tick %llu (run returned %s)",
                  (unsigned long long)st->flooded_at, (unsigned long long)st->seen_at, keel_strerror(rc));
    ck_assert_uint_ge(keel_runtime_tick(rt), 3);
    keel_runtime_close(rt);
    sig_destroy(&st->sig);
    free(st);
}
END_TEST

static Suite *runtime_driver(void)
{
    Suite *s = suite_create("runtime_driver");
    TCase *tc = tcase_create("metronome");
    tcase_add_test(tc, test_metronome_grid);
    tcase_add_test(tc, test_metronome_overrun_catches_up);
    tcase_add_test(tc, test_metronome_late_wakeups_do_not_drift);
    tcase_add_test(tc, test_metronome_other_rates);
    tcase_add_test(tc, test_metronome_unthrottled_never_waits);
    tcase_add_test(tc, test_metronome_second_run_restarts_grid);
    tcase_add_test(tc, test_metronome_back_to_back_runs_share_the_grid);
    tcase_add_test(tc, test_metronome_stop_during_wait_runs_no_more_ticks);
    tcase_add_test(tc, test_metronome_low_rates);
    tcase_add_test(tc, test_wait_phase);
    suite_add_tcase(s, tc);
    tc = tcase_create("stop");
    tcase_set_timeout(tc, 30); /* the sleep it cuts short is 100 s */
    tcase_add_test(tc, test_stop_cuts_the_metronome_sleep_short);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("thread");
    tcase_add_test(tt, test_start_stop);
    tcase_add_test(tt, test_close_while_running);
    tcase_add_test(tt, test_stop_returns_driver_error);
    tcase_add_test(tt, test_run_returns_step_error);
    tcase_add_test(tt, test_stop_ends_run_from_other_thread);
    suite_add_tcase(s, tt);
    return s;
}

/* =============================================================================
 * runtime_watchdog
 * ============================================================================= */

/* The value of key in "k1=v1 k2=v2 ..." into out; false when absent. */
static bool field_value(const char *fields, const char *key, char *out, size_t outlen)
{
    size_t klen = strlen(key);
    const char *p = fields;
    while (p && *p) {
        while (*p == ' ')
            p++;
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t vlen = len - klen - 1;
            if (vlen >= outlen)
                vlen = outlen - 1;
            memcpy(out, p + klen + 1, vlen);
            out[vlen] = 0;
            return true;
        }
        p = end;
    }
    return false;
}

typedef struct wd_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const char *want;      /* the system the test waits for */
    uint32_t reports;      /* sched/watchdog naming `want` */
    uint32_t other_watchdog;
    uint32_t other_events;
    keel_log_level level;
    char fields[256];
    char other[256];
    bool block;            /* the slow system blocks until reported */
    bool timed_out;
} wd_log;

static void wd_handler(const keel_log_event *ev, void *user)
{
    wd_log *l = user;
    pthread_mutex_lock(&l->mu);
    char sys[64];
    if (strcmp(ev->subsystem, "sched") == 0 && strcmp(ev->event, "watchdog") == 0) {
        if (l->want && field_value(ev->fields, "system", sys, sizeof sys) && strcmp(sys, l->want) == 0) {
            l->reports++;
            l->level = ev->level;
            snprintf(l->fields, sizeof l->fields, "%s", ev->fields);
        } else {
            l->other_watchdog++;
        }
    } else {
        l->other_events++;
        snprintf(l->other, sizeof l->other, "%s/%s %s", ev->subsystem, ev->event, ev->fields);
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void wd_init(wd_log *l, const char *want)
{
    memset(l, 0, sizeof *l);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, &a);
    pthread_condattr_destroy(&a);
    l->want = want;
}

static void wd_destroy(wd_log *l)
{
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

/* Blocks (while l->block) until the log handler saw the watchdog report. */
static int sys_slow(keel_ctx *ctx, void *user)
{
    (void)ctx;
    wd_log *l = user;
    struct timespec dl = guard_deadline();
    pthread_mutex_lock(&l->mu);
    while (l->block && l->reports == 0) {
        if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) != 0 && l->reports == 0) {
            l->timed_out = true;
            break;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return 0;
}

START_TEST(test_watchdog_reports_slow_system)
{
    wd_log l;
    wd_init(&l, "slow_system");
    l.block = true;
    keel_log_set(wd_handler, &l, KEEL_LOG_DEBUG);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .watchdog_seconds = 0.05});
    keel_schedule *s = sched_new(rt);
    keel_system fast = add_cb(s, "fast_system", tu_sys_noop, NULL, NULL);
    keel_system slow = add_cb(s, "slow_system", sys_slow, &l, NULL);
    tu_install(rt, s);

    ck_assert_ok(keel_runtime_step(rt));
    pthread_mutex_lock(&l.mu);
    bool timed_out = l.timed_out;
    uint32_t reports = l.reports, other_wd = l.other_watchdog;
    keel_log_level level = l.level;
    char fields[256];
    snprintf(fields, sizeof fields, "%s", l.fields);
    l.block = false;
    pthread_mutex_unlock(&l.mu);
    ck_assert_msg(!timed_out, "no sched/watchdog report for slow_system within %d s", WAIT_GUARD_S);
    ck_assert_uint_eq(reports, 1);
    ck_assert_uint_eq(other_wd, 0);
    ck_assert_int_eq(level, KEEL_LOG_WARN);

    char v[64];
    ck_assert_msg(field_value(fields, "system", v, sizeof v), "fields: %s", fields);
    ck_assert_str_eq(v, "slow_system");
    ck_assert_ptr_nonnull(strstr(fields, "system=slow_system"));
    ck_assert_msg(field_value(fields, "tick", v, sizeof v), "fields: %s", fields);
    ck_assert_str_eq(v, "1");
    ck_assert_msg(field_value(fields, "worker", v, sizeof v), "fields: %s", fields);
    ck_assert_int_lt(atoi(v), 2);
    /* reported only once it ran past the threshold: running_ms >= 50 */
    ck_assert_msg(field_value(fields, "running_ms", v, sizeof v), "fields: %s", fields);
    ck_assert_int_ge(atoi(v), 50);

    keel_tick_record tr;
    ck_assert_ok(keel_telemetry_tick(rt, 1, &tr));
    ck_assert_uint_eq(tr.watchdog_reports, 1);
    keel_system_record sr;
    ck_assert_ok(keel_telemetry_system(rt, 1, slow, &sr));
    ck_assert_uint_eq(sr.watchdog, 1);
    ck_assert_int_eq(sr.skip, KEEL_SKIP_NONE);
    ck_assert_ok(keel_telemetry_system(rt, 1, fast, &sr));
    ck_assert_uint_eq(sr.watchdog, 0);
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.watchdog_reports, 1);

    /* the next tick is fast: the flag does not carry over */
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_ok(keel_telemetry_tick(rt, 2, &tr));
    ck_assert_uint_eq(tr.watchdog_reports, 0);
    ck_assert_ok(keel_telemetry_system(rt, 2, slow, &sr));
    ck_assert_uint_eq(sr.watchdog, 0);
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.watchdog_reports, 1);
    /* tick 1's record is unchanged */
    ck_assert_ok(keel_telemetry_tick(rt, 1, &tr));
    ck_assert_uint_eq(tr.watchdog_reports, 1);

    keel_runtime_close(rt);
    pthread_mutex_lock(&l.mu);
    reports = l.reports;
    pthread_mutex_unlock(&l.mu);
    ck_assert_uint_eq(reports, 1);
    wd_destroy(&l);
}
END_TEST

/* Serial mode: the watched worker is the caller (worker 0). */
START_TEST(test_watchdog_serial)
{
    wd_log l;
    wd_init(&l, "slow_serial");
    l.block = true;
    keel_log_set(wd_handler, &l, KEEL_LOG_DEBUG);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .watchdog_seconds = 0.05});
    keel_schedule *s = sched_new(rt);
    keel_system slow = add_cb(s, "slow_serial", sys_slow, &l, NULL);
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_step(rt));
    pthread_mutex_lock(&l.mu);
    bool timed_out = l.timed_out;
    uint32_t reports = l.reports;
    char fields[256];
    snprintf(fields, sizeof fields, "%s", l.fields);
    pthread_mutex_unlock(&l.mu);
    ck_assert_msg(!timed_out, "no sched/watchdog report within %d s", WAIT_GUARD_S);
    ck_assert_uint_eq(reports, 1);
    char v[64];
    ck_assert(field_value(fields, "worker", v, sizeof v));
    ck_assert_str_eq(v, "0");
    keel_system_record sr;
    ck_assert_ok(keel_telemetry_system(rt, 1, slow, &sr));
    ck_assert_uint_eq(sr.watchdog, 1);
    keel_runtime_close(rt);
    wd_destroy(&l);
}
END_TEST

START_TEST(test_watchdog_fast_not_reported)
{
    wd_log l;
    wd_init(&l, "anything");
    keel_log_set(wd_handler, &l, KEEL_LOG_DEBUG);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2}); /* watchdog 30 s */
    _Atomic uint64_t n = 0;
    keel_schedule *s = sched_new(rt);
    add_cb(s, "f1", sys_count, &n, NULL);
    add_cb(s, "f2", sys_count, &n, NULL);
    add_cb(s, "f3", sys_count, &n, "f1");
    tu_install(rt, s);
    tu_step_n(rt, 20);
    ck_assert_uint_eq(atomic_load(&n), 60);
    for (uint64_t t = 1; t <= 20; t++) {
        keel_tick_record tr;
        ck_assert_ok(keel_telemetry_tick(rt, t, &tr));
        ck_assert_uint_eq(tr.watchdog_reports, 0);
        for (keel_system i = 0; i < 3; i++) {
            keel_system_record sr;
            ck_assert_ok(keel_telemetry_system(rt, t, i, &sr));
            ck_assert_uint_eq(sr.watchdog, 0);
        }
    }
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.watchdog_reports, 0);
    keel_runtime_close(rt);
    pthread_mutex_lock(&l.mu);
    uint32_t wd = l.reports + l.other_watchdog, other = l.other_events;
    char other_text[256];
    snprintf(other_text, sizeof other_text, "%s", l.other);
    pthread_mutex_unlock(&l.mu);
    ck_assert_uint_eq(wd, 0);
    /* the success path logs nothing at all */
    ck_assert_msg(other == 0, "%u events on the success path, last: %s", other, other_text);
    wd_destroy(&l);
}
END_TEST

/* Regression: the watchdog once computed "now - since" with a `now` read
 * before a task started, which wrapped to ~1.8e13 ms and reported tasks that
 * had just begun. With a 1 ms watchdog and many short systems on 2 workers,
 * any report must carry a plausible duration (a genuine preemption of a few
 * ms is allowed; the bound only excludes the wrap). */
typedef struct wrap_log {
    pthread_mutex_t lock;
    uint32_t reports;
    unsigned long long max_ms;
} wrap_log;

static void wrap_handler(const keel_log_event *ev, void *user)
{
    wrap_log *l = user;
    char ms[32];
    if (strcmp(ev->event, "watchdog") || !field_value(ev->fields, "running_ms", ms, sizeof ms))
        return;
    pthread_mutex_lock(&l->lock);
    l->reports++;
    unsigned long long v = strtoull(ms, NULL, 10);
    if (v > l->max_ms)
        l->max_ms = v;
    pthread_mutex_unlock(&l->lock);
}

static int wrap_spin(keel_ctx *ctx, void *user)
{
    (void)ctx;
    volatile uint32_t x = 0;
    for (uint32_t i = 0; i < 2000; i++)
        x += i;
    (void)user;
    return 0;
}

START_TEST(test_watchdog_no_wrapped_reports)
{
    wrap_log l = {.lock = PTHREAD_MUTEX_INITIALIZER};
    keel_log_set(wrap_handler, &l, KEEL_LOG_DEBUG);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .tick_rate_hz = -1, .watchdog_seconds = 0.001});
    keel_schedule *s = sched_new(rt);
    for (int i = 0; i < 32; i++) {
        char name[16];
        snprintf(name, sizeof name, "spin%d", i);
        add_sys(s, &(keel_system_desc){.name = name, .run = wrap_spin});
    }
    tu_install(rt, s);
    for (int t = 0; t < 3000; t++)
        ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_close(rt);
    keel_log_set(NULL, NULL, KEEL_LOG_INFO);
    ck_assert_msg(l.max_ms < 3600ull * 1000, "a watchdog report claims %llu ms (of %u reports)", l.max_ms, l.reports);
}
END_TEST

static Suite *runtime_watchdog(void)
{
    Suite *s = suite_create("runtime_watchdog");
    TCase *tc = tcase_create("watchdog");
    tcase_add_test(tc, test_watchdog_reports_slow_system);
    tcase_add_test(tc, test_watchdog_serial);
    tcase_add_test(tc, test_watchdog_fast_not_reported);
    tcase_add_test(tc, test_watchdog_no_wrapped_reports);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * runtime_telemetry
 * ============================================================================= */

typedef struct tel_fix {
    keel_runtime *rt;
    keel_component pos;
    spawn_arg hook_spawn, tick_spawn, fail_spawn;
    _Atomic uint64_t dep_runs;
    _Atomic uint64_t query_rows;
    _Atomic uint64_t pipe_calls;
    keel_system spawner, failer, dependent, dep2, txnfail, query, pipe, independent;
} tel_fix;

static int hook_spawn(keel_ctx *ctx, void *user)
{
    return sys_spawn(ctx, user);
}

static int chunk_rows(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    atomic_fetch_add((_Atomic uint64_t *)user, it->count);
    return 0;
}

static int pipe_body(uint32_t index, uint32_t count, void *user)
{
    (void)index;
    (void)count;
    atomic_fetch_add((_Atomic uint64_t *)user, 1);
    return 0;
}

/* 50 entities from on_first_tick; per tick: spawner +3, failer (records a
 * spawn, fails), dependent and dep2 (skipped), txnfail (keel_txn_fail), a
 * query over pos, a pipeline of 5, an independent no-op. */
static void tel_setup(tel_fix *f, int32_t workers, double hz, bool parallel_query)
{
    memset(f, 0, sizeof *f);
    keel_runtime_desc d = {.workers = workers,
                           .tick_rate_hz = hz,
                           .world = {.chunk_rows = 16},
                           .on_first_tick = hook_spawn,
                           .hook_user = &f->hook_spawn};
    f->rt = tu_rt_new(d);
    f->pos = reg_pos(f->rt);
    f->hook_spawn = (spawn_arg){f->pos, 50};
    f->tick_spawn = (spawn_arg){f->pos, 3};
    f->fail_spawn = (spawn_arg){f->pos, 1};
    keel_schedule *s = sched_new(f->rt);
    f->spawner = add_cb(s, "spawner", sys_spawn, &f->tick_spawn, NULL);
    f->failer = add_cb(s, "failer", sys_fail_return, &f->fail_spawn, NULL);
    f->dependent = add_cb(s, "dependent", sys_count, &f->dep_runs, "failer");
    f->dep2 = add_cb(s, "dep2", sys_count, &f->dep_runs, "dependent");
    f->txnfail = add_cb(s, "txnfail", sys_fail_txn, NULL, NULL);
    keel_system_desc q = {.name = "query_pos",
                          .kind = KEEL_SYSTEM_QUERY,
                          .each_chunk = chunk_rows,
                          .user = &f->query_rows,
                          .parallel = parallel_query,
                          .min_chunk_rows = 16};
    q.query.with[0] = f->pos;
    q.access.reads[0] = f->pos;
    f->query = add_sys(s, &q);
    keel_system_desc p = {.name = "pipe", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = pipe_body,
                          .pipeline_count = 5, .user = &f->pipe_calls};
    f->pipe = add_sys(s, &p);
    f->independent = add_cb(s, "independent", tu_sys_noop, NULL, NULL);
    tu_install(f->rt, s);
}

START_TEST(test_tick_records)
{
    tel_fix f;
    tel_setup(&f, 1, 0, false);
    keel_tick_record r;
    ck_assert_rc(keel_telemetry_tick(f.rt, 1, &r), KEEL_ENOENT); /* not run yet */
    ck_assert_rc(keel_telemetry_tick(f.rt, 0, &r), KEEL_ENOENT);
    tu_step_n(f.rt, 3);
    uint64_t prev_start = 0;
    for (uint64_t t = 1; t <= 3; t++) {
        memset(&r, 0xee, sizeof r);
        ck_assert_ok(keel_telemetry_tick(f.rt, t, &r));
        ck_assert_uint_eq(r.tick, t);
        ck_assert_uint_eq(r.entities, 50 + 3 * t); /* the failer's spawns never land */
        ck_assert_uint_eq(r.systems_run, 6);       /* spawner, failer, txnfail, query, pipe, independent */
        ck_assert_uint_eq(r.systems_failed, 2);
        ck_assert_uint_eq(r.systems_skipped, 2);
        ck_assert_uint_eq(r.multiplier, 1);
        ck_assert_uint_eq(r.overload_level, 0);
        ck_assert_uint_eq(r.target_ns, 16666666);
        ck_assert_uint_gt(r.actual_ns, 0);
        ck_assert_uint_le(r.sync_ns, r.actual_ns);
        ck_assert(r.overrun == (double)r.actual_ns / (double)r.target_ns);
        ck_assert_uint_eq(r.watchdog_reports, 0);
        ck_assert_uint_eq(r.wal_raw_bytes, 0);
        ck_assert_uint_eq(r.wal_stored_bytes, 0);
        ck_assert_uint_eq(r.fence_ns, 0);
        ck_assert_uint_eq(r.durable_lag, 0);
        ck_assert_uint_eq(r.side_txns, 0);
        ck_assert_uint_gt(r.start_ns, prev_start); /* ticks follow each other */
        prev_start = r.start_ns;
    }
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(f.rt)), 59);
    ck_assert_uint_eq(atomic_load(&f.dep_runs), 0);
    ck_assert_rc(keel_telemetry_tick(f.rt, 4, &r), KEEL_ENOENT);
    keel_runtime_close(f.rt);
}
END_TEST

START_TEST(test_tick_records_unthrottled)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 2);
    keel_tick_record r;
    ck_assert_ok(keel_telemetry_tick(rt, 2, &r));
    ck_assert_uint_eq(r.target_ns, 0);
    ck_assert(r.overrun == 0.0);
    ck_assert_uint_eq(r.multiplier, 1);
    ck_assert_uint_eq(r.systems_run, 1);
    ck_assert_uint_eq(r.entities, 0);
    keel_runtime_close(rt);

    rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = 200});
    s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 1);
    ck_assert_ok(keel_telemetry_tick(rt, 1, &r));
    ck_assert_uint_eq(r.target_ns, 5000000);
    keel_runtime_close(rt);
}
END_TEST

static void check_system_records(tel_fix *f, uint64_t t, uint64_t query_rows, bool parallel)
{
    keel_system_record r;
    const struct {
        keel_system sys;
        keel_skip_reason skip;
        const char *name;
    } want[] = {
        {f->spawner, KEEL_SKIP_NONE, "NONE"},
        {f->failer, KEEL_SKIP_FAILED, "FAILED"},
        {f->dependent, KEEL_SKIP_DEPENDENCY_FAILED, "DEPENDENCY_FAILED"},
        {f->dep2, KEEL_SKIP_DEPENDENCY_FAILED, "DEPENDENCY_FAILED"},
        {f->txnfail, KEEL_SKIP_FAILED, "FAILED"},
        {f->query, KEEL_SKIP_NONE, "NONE"},
        {f->pipe, KEEL_SKIP_NONE, "NONE"},
        {f->independent, KEEL_SKIP_NONE, "NONE"},
    };
    uint32_t workers = keel_runtime_workers(f->rt);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        memset(&r, 0xee, sizeof r);
        ck_assert_ok(keel_telemetry_system(f->rt, t, want[i].sys, &r));
        ck_assert_uint_eq(r.system, want[i].sys);
        ck_assert_msg(r.skip == want[i].skip, "tick %llu system %u: skip %s, want %s", (unsigned long long)t,
                      want[i].sys, keel_skip_reason_name(r.skip), want[i].name);
        ck_assert_str_eq(keel_skip_reason_name(r.skip), want[i].name);
        ck_assert_uint_eq(r.watchdog, 0);
        if (want[i].skip == KEEL_SKIP_DEPENDENCY_FAILED) {
            ck_assert_uint_eq(r.start_ns, 0); /* 0 when not run */
            ck_assert_uint_eq(r.end_ns, 0);
            ck_assert_uint_eq(r.rows, 0);
        } else {
            ck_assert_uint_gt(r.start_ns, 0);
            ck_assert_uint_ge(r.end_ns, r.start_ns);
            ck_assert_uint_lt(r.worker, workers);
        }
    }
    ck_assert_ok(keel_telemetry_system(f->rt, t, f->query, &r));
    ck_assert_uint_eq(r.rows, query_rows);
    if (parallel) {
        /* 4 chunks of 16 rows at most, at least 16 rows per task: 2..3 tasks on 2 workers */
        ck_assert_uint_ge(r.tasks, 2);
        ck_assert_uint_le(r.tasks, query_rows / 16);
    } else {
        ck_assert_uint_eq(r.tasks, 1);
    }
    ck_assert_ok(keel_telemetry_system(f->rt, t, f->pipe, &r));
    ck_assert_uint_eq(r.tasks, 5);
    ck_assert_uint_eq(r.rows, 0);
    ck_assert_ok(keel_telemetry_system(f->rt, t, f->spawner, &r));
    ck_assert_uint_eq(r.tasks, 1);
    ck_assert_uint_eq(r.rows, 0);
    /* the record's times lie within the tick's */
    keel_tick_record tr;
    ck_assert_ok(keel_telemetry_tick(f->rt, t, &tr));
    ck_assert_uint_ge(r.start_ns, tr.start_ns);
    ck_assert_uint_le(r.end_ns, tr.start_ns + tr.actual_ns);
}

START_TEST(test_system_records_serial)
{
    tel_fix f;
    tel_setup(&f, 1, 0, false);
    tu_step_n(f.rt, 2);
    check_system_records(&f, 1, 50, false); /* tick 1 sees the hook's 50 */
    check_system_records(&f, 2, 53, false); /* tick 2 also the spawner's 3 */
    ck_assert_uint_eq(atomic_load(&f.query_rows), 103);
    ck_assert_uint_eq(atomic_load(&f.pipe_calls), 10);
    keel_system_record r;
    ck_assert_ok(keel_telemetry_system(f.rt, 1, f.spawner, &r));
    ck_assert_uint_eq(r.worker, 0);
    keel_runtime_close(f.rt);
}
END_TEST

START_TEST(test_system_records_parallel)
{
    tel_fix f;
    tel_setup(&f, 2, 0, true);
    tu_step_n(f.rt, 3);
    check_system_records(&f, 1, 50, true);
    check_system_records(&f, 2, 53, true);
    check_system_records(&f, 3, 56, true);
    ck_assert_uint_eq(atomic_load(&f.query_rows), 50 + 53 + 56);
    ck_assert_uint_eq(atomic_load(&f.pipe_calls), 15);
    keel_tick_record tr;
    ck_assert_ok(keel_telemetry_tick(f.rt, 3, &tr));
    ck_assert_uint_eq(tr.entities, 59);
    ck_assert_uint_eq(tr.systems_run, 6);
    ck_assert_uint_eq(tr.systems_failed, 2);
    ck_assert_uint_eq(tr.systems_skipped, 2);
    keel_runtime_close(f.rt);
}
END_TEST

START_TEST(test_skip_reason_names)
{
    ck_assert_str_eq(keel_skip_reason_name(KEEL_SKIP_NONE), "NONE");
    ck_assert_str_eq(keel_skip_reason_name(KEEL_SKIP_FAILED), "FAILED");
    ck_assert_str_eq(keel_skip_reason_name(KEEL_SKIP_DEPENDENCY_FAILED), "DEPENDENCY_FAILED");
    ck_assert_str_eq(keel_skip_reason_name(KEEL_SKIP_THROTTLED), "THROTTLED");
    ck_assert_ptr_nonnull(keel_skip_reason_name((keel_skip_reason)99));
    ck_assert_str_eq(keel_skip_reason_name((keel_skip_reason)99), "?");
}
END_TEST

START_TEST(test_ring_overwrite)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .telemetry_capacity = 4});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    keel_tick_record r;
    keel_system_record sr;
    tu_step_n(rt, 4);
    for (uint64_t t = 1; t <= 4; t++) {
        ck_assert_ok(keel_telemetry_tick(rt, t, &r));
        ck_assert_uint_eq(r.tick, t);
    }
    tu_step_n(rt, 1);
    ck_assert_rc(keel_telemetry_tick(rt, 1, &r), KEEL_ENOENT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "tick 1 is not in the ring"));
    ck_assert_rc(keel_telemetry_system(rt, 1, 0, &sr), KEEL_ENOENT);
    for (uint64_t t = 2; t <= 5; t++) {
        ck_assert_ok(keel_telemetry_tick(rt, t, &r));
        ck_assert_uint_eq(r.tick, t);
        ck_assert_ok(keel_telemetry_system(rt, t, 0, &sr));
        ck_assert_int_eq(sr.skip, KEEL_SKIP_NONE);
    }
    ck_assert_rc(keel_telemetry_tick(rt, 6, &r), KEEL_ENOENT);
    ck_assert_rc(keel_telemetry_tick(rt, 9, &r), KEEL_ENOENT); /* 9 & 3 == 5 & 3 */
    ck_assert_rc(keel_telemetry_tick(rt, UINT64_MAX, &r), KEEL_ENOENT);
    keel_runtime_close(rt);

    /* capacity 1 keeps only the last tick */
    rt = tu_rt_new((keel_runtime_desc){.workers = 1, .telemetry_capacity = 1});
    s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 3);
    ck_assert_ok(keel_telemetry_tick(rt, 3, &r));
    ck_assert_uint_eq(r.tick, 3);
    ck_assert_rc(keel_telemetry_tick(rt, 2, &r), KEEL_ENOENT);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_system_bad_index)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_system_record sr;
    ck_assert_rc(keel_telemetry_system(rt, 1, 0, &sr), KEEL_EINVAL); /* no schedule: no system 0 */
    keel_schedule *s = sched_new(rt);
    add_cb(s, "a", tu_sys_noop, NULL, NULL);
    add_cb(s, "b", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 1);
    ck_assert_ok(keel_telemetry_system(rt, 1, 1, &sr));
    ck_assert_uint_eq(sr.system, 1);
    ck_assert_rc(keel_telemetry_system(rt, 1, 2, &sr), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "system 2 does not exist"));
    ck_assert_rc(keel_telemetry_system(rt, 1, UINT32_MAX, &sr), KEEL_EINVAL);
    keel_runtime_close(rt);
}
END_TEST

static Suite *runtime_telemetry(void)
{
    Suite *s = suite_create("runtime_telemetry");
    TCase *tc = tcase_create("telemetry");
    tcase_add_test(tc, test_tick_records);
    tcase_add_test(tc, test_tick_records_unthrottled);
    tcase_add_test(tc, test_system_records_serial);
    tcase_add_test(tc, test_system_records_parallel);
    tcase_add_test(tc, test_skip_reason_names);
    tcase_add_test(tc, test_ring_overwrite);
    tcase_add_test(tc, test_system_bad_index);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * runtime_trace: a strict JSON parser (RFC 8259) and the export
 * ============================================================================= */

typedef enum jtype { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval jval;
struct jval {
    jtype t;
    double num;
    char *str;      /* J_STR: decoded UTF-8, NUL-terminated */
    size_t slen;    /* its length (may hold an escaped NUL) */
    jval *items;    /* J_ARR / J_OBJ */
    char **keys;    /* J_OBJ */
    size_t n, cap;
};

typedef struct jparser {
    const char *p, *end;
    int depth;
    char err[128];
} jparser;

static bool j_fail(jparser *ps, const char *what)
{
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "%s at offset %ld", what, (long)(ps->end - ps->p));
    return false;
}

static void j_free(jval *v)
{
    if (!v)
        return;
    free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        j_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void j_ws(jparser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static bool j_lit(jparser *ps, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0)
        return j_fail(ps, "bad literal");
    ps->p += n;
    return true;
}

typedef struct jbuf {
    char *b;
    size_t n, cap;
} jbuf;

static void jb_put(jbuf *b, char c)
{
    if (b->n + 2 > b->cap) {
        b->cap = b->cap ? b->cap * 2 : 32;
        b->b = realloc(b->b, b->cap);
        ck_assert_ptr_nonnull(b->b);
    }
    b->b[b->n++] = c;
    b->b[b->n] = 0;
}

static void jb_utf8(jbuf *b, uint32_t cp)
{
    if (cp < 0x80) {
        jb_put(b, (char)cp);
    } else if (cp < 0x800) {
        jb_put(b, (char)(0xc0 | (cp >> 6)));
        jb_put(b, (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        jb_put(b, (char)(0xe0 | (cp >> 12)));
        jb_put(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        jb_put(b, (char)(0x80 | (cp & 0x3f)));
    } else {
        jb_put(b, (char)(0xf0 | (cp >> 18)));
        jb_put(b, (char)(0x80 | ((cp >> 12) & 0x3f)));
        jb_put(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        jb_put(b, (char)(0x80 | (cp & 0x3f)));
    }
}

static bool j_hex4(jparser *ps, uint32_t *out)
{
    if (ps->end - ps->p < 4)
        return j_fail(ps, "short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return j_fail(ps, "bad hex digit");
    }
    *out = v;
    return true;
}

/* Raw UTF-8: one well-formed sequence starting at ps->p (lead byte >= 0x80). */
static bool j_utf8_seq(jparser *ps, jbuf *b)
{
    unsigned char c = (unsigned char)*ps->p;
    int n = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
    if (n < 0 || ps->end - ps->p <= n)
        return j_fail(ps, "bad UTF-8");
    for (int i = 1; i <= n; i++)
        if (((unsigned char)ps->p[i] & 0xc0) != 0x80)
            return j_fail(ps, "bad UTF-8 continuation");
    for (int i = 0; i <= n; i++)
        jb_put(b, *ps->p++);
    return true;
}

static bool j_string(jparser *ps, char **out, size_t *len)
{
    if (ps->p >= ps->end || *ps->p != '"')
        return j_fail(ps, "expected string");
    ps->p++;
    jbuf b = {0};
    jb_put(&b, 'x');
    b.n = 0;
    b.b[0] = 0;
    for (;;) {
        if (ps->p >= ps->end) {
            free(b.b);
            return j_fail(ps, "unterminated string");
        }
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            free(b.b);
            return j_fail(ps, "raw control character in string");
        }
        if (c >= 0x80) {
            if (!j_utf8_seq(ps, &b)) {
                free(b.b);
                return false;
            }
            continue;
        }
        ps->p++;
        if (c != '\\') {
            jb_put(&b, (char)c);
            continue;
        }
        if (ps->p >= ps->end) {
            free(b.b);
            return j_fail(ps, "dangling backslash");
        }
        char e = *ps->p++;
        uint32_t cp;
        switch (e) {
        case '"': jb_put(&b, '"'); break;
        case '\\': jb_put(&b, '\\'); break;
        case '/': jb_put(&b, '/'); break;
        case 'b': jb_put(&b, '\b'); break;
        case 'f': jb_put(&b, '\f'); break;
        case 'n': jb_put(&b, '\n'); break;
        case 'r': jb_put(&b, '\r'); break;
        case 't': jb_put(&b, '\t'); break;
        case 'u':
            if (!j_hex4(ps, &cp)) {
                free(b.b);
                return false;
            }
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                free(b.b);
                return j_fail(ps, "lone low surrogate");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    free(b.b);
                    return j_fail(ps, "lone high surrogate");
                }
                ps->p += 2;
                if (!j_hex4(ps, &lo) || lo < 0xdc00 || lo > 0xdfff) {
                    free(b.b);
                    return j_fail(ps, "bad surrogate pair");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            jb_utf8(&b, cp);
            break;
        default:
            free(b.b);
            return j_fail(ps, "bad escape");
        }
    }
    *out = b.b;
    *len = b.n;
    return true;
}

static bool j_digits(jparser *ps)
{
    const char *s = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
        ps->p++;
    return ps->p > s;
}

static bool j_number(jparser *ps, double *out)
{
    const char *s = ps->p;
    if (ps->p < ps->end && *ps->p == '-')
        ps->p++;
    if (ps->p < ps->end && *ps->p == '0')
        ps->p++;
    else if (!(ps->p < ps->end && *ps->p >= '1' && *ps->p <= '9') || !j_digits(ps))
        return j_fail(ps, "bad number");
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (!j_digits(ps))
            return j_fail(ps, "bad fraction");
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (!j_digits(ps))
            return j_fail(ps, "bad exponent");
    }
    char tmp[64];
    size_t n = (size_t)(ps->p - s);
    if (n >= sizeof tmp)
        return j_fail(ps, "number too long");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    *out = strtod(tmp, NULL);
    return true;
}

static bool j_value(jparser *ps, jval *out);

static jval *j_push(jval *v)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->items = realloc(v->items, v->cap * sizeof *v->items);
        ck_assert_ptr_nonnull(v->items);
        if (v->t == J_OBJ) {
            v->keys = realloc(v->keys, v->cap * sizeof *v->keys);
            ck_assert_ptr_nonnull(v->keys);
        }
    }
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    if (v->keys)
        v->keys[v->n] = NULL;
    return &v->items[v->n++];
}

static bool j_array(jparser *ps, jval *out)
{
    out->t = J_ARR;
    ps->p++; /* [ */
    j_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return true;
    }
    for (;;) {
        j_ws(ps);
        if (!j_value(ps, j_push(out)))
            return false;
        j_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return true;
        }
        return j_fail(ps, "expected , or ]");
    }
}

static bool j_object(jparser *ps, jval *out)
{
    out->t = J_OBJ;
    ps->p++; /* { */
    j_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return true;
    }
    for (;;) {
        j_ws(ps);
        char *key;
        size_t klen;
        if (!j_string(ps, &key, &klen))
            return false;
        for (size_t i = 0; i < out->n; i++)
            if (strcmp(out->keys[i], key) == 0) {
                free(key);
                return j_fail(ps, "duplicate key");
            }
        jval *v = j_push(out);
        out->keys[out->n - 1] = key;
        j_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':')
            return j_fail(ps, "expected :");
        ps->p++;
        j_ws(ps);
        if (!j_value(ps, v))
            return false;
        j_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return true;
        }
        return j_fail(ps, "expected , or }");
    }
}

static bool j_value(jparser *ps, jval *out)
{
    if (ps->p >= ps->end)
        return j_fail(ps, "unexpected end");
    if (++ps->depth > 64)
        return j_fail(ps, "nesting too deep");
    bool ok;
    switch (*ps->p) {
    case '{': ok = j_object(ps, out); break;
    case '[': ok = j_array(ps, out); break;
    case '"': out->t = J_STR; ok = j_string(ps, &out->str, &out->slen); break;
    case 't': out->t = J_TRUE; ok = j_lit(ps, "true"); break;
    case 'f': out->t = J_FALSE; ok = j_lit(ps, "false"); break;
    case 'n': out->t = J_NULL; ok = j_lit(ps, "null"); break;
    default: out->t = J_NUM; ok = j_number(ps, &out->num); break;
    }
    ps->depth--;
    return ok;
}

/* Parse text[0, len) as exactly one JSON value (whitespace around it only). */
static bool json_parse(const char *text, size_t len, jval *out, char *err, size_t errlen)
{
    jparser ps = {.p = text, .end = text + len};
    memset(out, 0, sizeof *out);
    j_ws(&ps);
    bool ok = j_value(&ps, out);
    if (ok) {
        j_ws(&ps);
        if (ps.p != ps.end)
            ok = j_fail(&ps, "trailing garbage");
    }
    if (!ok) {
        j_free(out);
        if (err)
            snprintf(err, errlen, "%s", ps.err);
    }
    return ok;
}

static bool json_ok(const char *text)
{
    jval v;
    bool ok = json_parse(text, strlen(text), &v, NULL, 0);
    if (ok)
        j_free(&v);
    return ok;
}

static const jval *j_get(const jval *obj, const char *key)
{
    if (!obj || obj->t != J_OBJ)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

static const char *j_str(const jval *obj, const char *key)
{
    const jval *v = j_get(obj, key);
    return v && v->t == J_STR ? v->str : NULL;
}

static bool j_num(const jval *obj, const char *key, double *out)
{
    const jval *v = j_get(obj, key);
    if (!v || v->t != J_NUM)
        return false;
    *out = v->num;
    return true;
}

START_TEST(test_json_parser_self_check)
{
    /* the parser must accept JSON and reject what is not, or the export checks prove nothing */
    ck_assert(json_ok("{}"));
    ck_assert(json_ok(" [1, -2.5e3, 0, 0.25, true, false, null, \"a\\\"b\\\\c\\u0041\\ud83d\\ude00\"] \n"));
    ck_assert(json_ok("{\"a\":{\"b\":[[]]}}"));
    ck_assert(!json_ok(""));
    ck_assert(!json_ok("{} x"));
    ck_assert(!json_ok("{}}"));
    ck_assert(!json_ok("[1,]"));
    ck_assert(!json_ok("{\"a\":1,}"));
    ck_assert(!json_ok("{\"a\" 1}"));
    ck_assert(!json_ok("{a:1}"));
    ck_assert(!json_ok("[01]"));
    ck_assert(!json_ok("[1.]"));
    ck_assert(!json_ok("[.5]"));
    ck_assert(!json_ok("[+1]"));
    ck_assert(!json_ok("[nan]"));
    ck_assert(!json_ok("[\"a\\qb\"]"));
    ck_assert(!json_ok("[\"a\tb\"]")); /* raw control character */
    ck_assert(!json_ok("[\"abc]"));
    ck_assert(!json_ok("[\"\\ud800\"]"));
    ck_assert(!json_ok("[\"\xff\"]"));
    ck_assert(!json_ok("{\"a\":1,\"a\":2}"));
    ck_assert(!json_ok("[tru]"));

    jval v;
    const char *t = "{\"k\":\"q\\\"b\\\\s\\u0001\\t\\u00e9\"}";
    ck_assert(json_parse(t, strlen(t), &v, NULL, 0));
    ck_assert_str_eq(j_str(&v, "k"), "q\"b\\s\x01\t\xc3\xa9");
    j_free(&v);
}
END_TEST

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    jbuf b = {0};
    int c;
    while ((c = fgetc(f)) != EOF)
        jb_put(&b, (char)c);
    fclose(f);
    if (!b.b) { /* empty file */
        jb_put(&b, 'x');
        b.n = 0;
        b.b[0] = 0;
    }
    *len = b.n;
    return b.b;
}

/* Read the exported file (and remove it, so a failing test leaves nothing
 * behind), parse it; *raw (optional) receives the text. */
static void trace_load(const char *path, jval *root, char **raw)
{
    size_t len;
    char *text = slurp(path, &len);
    unlink(path);
    char err[160] = "";
    bool ok = json_parse(text, len, root, err, sizeof err);
    if (!ok) {
        char head[2001];
        snprintf(head, sizeof head, "%s", text);
        free(text);
        ck_abort_msg("the trace is not valid JSON: %s\n---\n%s", err, head);
    }
    if (raw)
        *raw = text;
    else
        free(text);
    ck_assert_int_eq(root->t, J_OBJ);
}

static const jval *trace_events(const jval *root)
{
    const jval *ev = j_get(root, "traceEvents");
    ck_assert_msg(ev != NULL && ev->t == J_ARR, "no traceEvents array");
    return ev;
}

/* Structural checks every event must pass; returns the number of "X" events. */
static size_t check_events(const jval *events, uint32_t workers)
{
    size_t x = 0;
    for (size_t i = 0; i < events->n; i++) {
        const jval *e = &events->items[i];
        ck_assert_int_eq(e->t, J_OBJ);
        const char *ph = j_str(e, "ph");
        ck_assert_msg(ph != NULL, "event %zu has no ph", i);
        double pid;
        ck_assert(j_num(e, "pid", &pid));
        ck_assert_ptr_nonnull(j_str(e, "name"));
        if (strcmp(ph, "X") == 0) {
            double tid, ts, dur, tick;
            ck_assert(j_num(e, "tid", &tid));
            ck_assert(j_num(e, "ts", &ts));
            ck_assert(j_num(e, "dur", &dur));
            ck_assert_msg(ts >= 0 && dur >= 0, "event %zu: ts %f dur %f", i, ts, dur);
            ck_assert(tid >= 0 && tid <= workers && tid == (double)(uint32_t)tid);
            const jval *args = j_get(e, "args");
            ck_assert(args && args->t == J_OBJ);
            ck_assert(j_num(args, "tick", &tick));
            ck_assert(tick >= 1);
            x++;
        } else if (strcmp(ph, "C") == 0) { /* the overload counter track: one sample per tick */
            double ts, level, mult;
            ck_assert_str_eq(j_str(e, "name"), "overload");
            ck_assert(j_num(e, "ts", &ts) && ts >= 0);
            const jval *args = j_get(e, "args");
            ck_assert(args && args->t == J_OBJ);
            ck_assert(j_num(args, "level", &level) && level >= 0 && level <= 4);
            ck_assert(j_num(args, "multiplier", &mult) && mult >= 1 && mult <= 6);
        } else {
            ck_assert_msg(strcmp(ph, "M") == 0, "unexpected phase %s", ph);
            const char *nm = j_str(e, "name");
            ck_assert(strcmp(nm, "process_name") == 0 || strcmp(nm, "thread_name") == 0);
            const jval *args = j_get(e, "args");
            ck_assert(args && j_str(args, "name"));
        }
    }
    return x;
}

/* Number of X events with this name, tick and tid (tid < 0: any; tid == -2: >= 1). */
static size_t count_x(const jval *events, const char *name, double tick, int tid)
{
    size_t n = 0;
    for (size_t i = 0; i < events->n; i++) {
        const jval *e = &events->items[i];
        const char *ph = j_str(e, "ph");
        double t, id;
        if (!ph || strcmp(ph, "X") != 0 || strcmp(j_str(e, "name"), name) != 0)
            continue;
        if (!j_num(j_get(e, "args"), "tick", &t) || t != tick || !j_num(e, "tid", &id))
            continue;
        if (tid == -2 ? id >= 1 : tid < 0 || id == (double)tid)
            n++;
    }
    return n;
}

static bool has_thread_name(const jval *events, double tid, const char *want_name)
{
    for (size_t i = 0; i < events->n; i++) {
        const jval *e = &events->items[i];
        double id;
        if (strcmp(j_str(e, "ph"), "M") != 0 || strcmp(j_str(e, "name"), "thread_name") != 0)
            continue;
        if (!j_num(e, "tid", &id) || id != tid)
            continue;
        const char *nm = j_str(j_get(e, "args"), "name");
        if (nm && (!want_name || strcmp(nm, want_name) == 0))
            return true;
    }
    return false;
}

typedef struct temp_path {
    char path[64];
} temp_path;

static temp_path temp_json(void)
{
    temp_path t;
    snprintf(t.path, sizeof t.path, "/tmp/keel-trace-XXXXXX");
    int fd = mkstemp(t.path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    return t;
}

/* A system that does a little work so its slice is not empty. */
static int sys_work(keel_ctx *ctx, void *user)
{
    (void)ctx;
    _Atomic uint64_t *acc = user;
    uint64_t x = 0;
    for (uint32_t i = 0; i < 1000; i++)
        x += i * 2654435761u;
    atomic_fetch_add(acc, x & 1);
    return 0;
}

#define WEIRD_NAME "we\"ird\\name"
#define UTF8_NAME "utf \xc3\xa9\xe6\x88\x98 \xf0\x9f\x8c\x8d" /* 2-, 3- and 4-byte characters */

START_TEST(test_trace_export)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2});
    _Atomic uint64_t acc = 0;
    const char *names[] = {"alpha", "beta", WEIRD_NAME, "gamma", UTF8_NAME};
    keel_schedule *s = sched_new(rt);
    add_cb(s, names[0], sys_work, &acc, NULL);
    add_cb(s, names[1], sys_work, &acc, NULL);
    add_cb(s, names[2], sys_work, &acc, NULL);
    add_cb(s, names[3], sys_work, &acc, names[0]);
    add_cb(s, names[4], sys_work, &acc, NULL);
    tu_install(rt, s);
    const uint64_t ticks = 4;
    tu_step_n(rt, ticks);

    temp_path tp = temp_json();
    ck_assert_ok(keel_trace_export(rt, tp.path));
    jval root;
    trace_load(tp.path, &root, NULL);
    const jval *ev = trace_events(&root);
    size_t x = check_events(ev, 2);
    ck_assert_uint_ge(x, ticks * (5 + 1));

    for (uint64_t t = 1; t <= ticks; t++) {
        /* driver track: one tick slice and one sync slice per tick, tid 0 */
        ck_assert_uint_eq(count_x(ev, "tick", (double)t, 0), 1);
        ck_assert_uint_eq(count_x(ev, "sync", (double)t, 0), 1);
        for (size_t i = 0; i < 5; i++)
            ck_assert_msg(count_x(ev, names[i], (double)t, -2) == 1, "tick %llu: no single slice for system '%s'",
                          (unsigned long long)t, names[i]);
    }
    ck_assert_uint_eq(count_x(ev, "tick", (double)(ticks + 1), -1), 0);
    /* thread metadata: the driver and each worker */
    ck_assert(has_thread_name(ev, 0, NULL));
    ck_assert(has_thread_name(ev, 1, NULL));
    ck_assert(has_thread_name(ev, 2, NULL));

    /* every system slice lies inside its tick's slice (µs with 3 decimals) */
    for (size_t i = 0; i < ev->n; i++) {
        const jval *e = &ev->items[i];
        double tid, ts, dur, tick;
        if (strcmp(j_str(e, "ph"), "X") != 0 || !j_num(e, "tid", &tid) || tid == 0)
            continue;
        ck_assert(j_num(e, "ts", &ts) && j_num(e, "dur", &dur) && j_num(j_get(e, "args"), "tick", &tick));
        for (size_t k = 0; k < ev->n; k++) {
            const jval *f = &ev->items[k];
            double ftick, fts, fdur;
            if (strcmp(j_str(f, "ph"), "X") != 0 || strcmp(j_str(f, "name"), "tick") != 0 ||
                !j_num(j_get(f, "args"), "tick", &ftick) || ftick != tick)
                continue;
            ck_assert(j_num(f, "ts", &fts) && j_num(f, "dur", &fdur));
            ck_assert_msg(ts >= fts - 0.002 && ts + dur <= fts + fdur + 0.002,
                          "slice %s [%f, +%f] outside tick %f [%f, +%f]", j_str(e, "name"), ts, dur, tick, fts, fdur);
        }
    }
    j_free(&root);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_trace_escaping)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    _Atomic uint64_t acc = 0;
    keel_schedule *s = sched_new(rt);
    add_cb(s, WEIRD_NAME, sys_work, &acc, NULL);
    add_cb(s, UTF8_NAME, sys_work, &acc, NULL);
    add_cb(s, "\\\\\"\"\\", sys_work, &acc, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 2);
    temp_path tp = temp_json();
    ck_assert_ok(keel_trace_export(rt, tp.path));
    jval root;
    char *text = NULL;
    trace_load(tp.path, &root, &text);
    const jval *ev = trace_events(&root);
    check_events(ev, 1);
    ck_assert_uint_eq(count_x(ev, WEIRD_NAME, 1, 1), 1);
    ck_assert_uint_eq(count_x(ev, WEIRD_NAME, 2, 1), 1);
    ck_assert_uint_eq(count_x(ev, UTF8_NAME, 1, 1), 1);
    ck_assert_uint_eq(count_x(ev, "\\\\\"\"\\", 2, 1), 1);
    ck_assert(has_thread_name(ev, 0, "driver"));
    ck_assert(has_thread_name(ev, 1, NULL));
    j_free(&root);

    /* the raw text holds the escapes themselves, and UTF-8 as it is (names cannot hold control characters) */
    ck_assert_ptr_nonnull(strstr(text, "\"we\\\"ird\\\\name\""));
    ck_assert_ptr_nonnull(strstr(text, "\"" UTF8_NAME "\""));
    free(text);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_trace_failed_and_skipped)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2});
    keel_component pos = reg_pos(rt);
    spawn_arg one = {pos, 1};
    _Atomic uint64_t n = 0;
    keel_schedule *s = sched_new(rt);
    add_cb(s, "ok", sys_count, &n, NULL);
    add_cb(s, "fails", sys_fail_return, &one, NULL);
    add_cb(s, "skipped", sys_count, &n, "fails");
    tu_install(rt, s);
    tu_step_n(rt, 2);
    temp_path tp = temp_json();
    ck_assert_ok(keel_trace_export(rt, tp.path));
    jval root;
    trace_load(tp.path, &root, NULL);
    const jval *ev = trace_events(&root);
    check_events(ev, 2);
    for (double t = 1; t <= 2; t++) {
        ck_assert_uint_eq(count_x(ev, "ok", t, -2), 1);
        ck_assert_uint_eq(count_x(ev, "fails", t, -2), 1); /* it ran */
        ck_assert_uint_eq(count_x(ev, "skipped", t, -1), 0);
    }
    j_free(&root);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_trace_wrapped_ring_and_empty)
{
    /* before any schedule: a valid trace with metadata only */
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 2, .telemetry_capacity = 4});
    temp_path tp = temp_json();
    ck_assert_ok(keel_trace_export(rt, tp.path));
    jval root;
    trace_load(tp.path, &root, NULL);
    const jval *ev = trace_events(&root);
    ck_assert_uint_eq(check_events(ev, 2), 0);
    ck_assert(has_thread_name(ev, 0, NULL));
    j_free(&root);

    keel_schedule *s = sched_new(rt);
    _Atomic uint64_t acc = 0;
    add_cb(s, "w", sys_work, &acc, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 7);
    ck_assert_ok(keel_trace_export(rt, tp.path)); /* overwrites the file */
    trace_load(tp.path, &root, NULL);
    ev = trace_events(&root);
    ck_assert_uint_eq(check_events(ev, 2), 4 * 3); /* ticks 4..7: tick, sync, w */
    for (double t = 1; t <= 3; t++)
        ck_assert_uint_eq(count_x(ev, "tick", t, -1), 0);
    for (double t = 4; t <= 7; t++) {
        ck_assert_uint_eq(count_x(ev, "tick", t, 0), 1);
        ck_assert_uint_eq(count_x(ev, "w", t, -2), 1);
    }
    j_free(&root);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_trace_unwritable)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_schedule *s = sched_new(rt);
    add_cb(s, "noop", tu_sys_noop, NULL, NULL);
    tu_install(rt, s);
    tu_step_n(rt, 1);
    const char *path = "/nonexistent-dir/x.json";
    ck_assert_rc(keel_trace_export(rt, path), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), path) != NULL, "last error '%s' does not name %s", keel_last_error(),
                  path);
    /* a directory is not writable as a file either */
    ck_assert_rc(keel_trace_export(rt, "/tmp"), KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "/tmp"));
    /* the runtime is unaffected */
    ck_assert_ok(keel_runtime_step(rt));
    keel_runtime_close(rt);
}
END_TEST

static Suite *runtime_trace(void)
{
    Suite *s = suite_create("runtime_trace");
    TCase *tc = tcase_create("trace");
    tcase_add_test(tc, test_json_parser_self_check);
    tcase_add_test(tc, test_trace_export);
    tcase_add_test(tc, test_trace_escaping);
    tcase_add_test(tc, test_trace_failed_and_skipped);
    tcase_add_test(tc, test_trace_wrapped_ring_and_empty);
    tcase_add_test(tc, test_trace_unwritable);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(runtime_api, runtime_driver, runtime_watchdog, runtime_telemetry, runtime_trace)
