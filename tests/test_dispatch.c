/*
 * test_dispatch.c -- running a built schedule on the worker pool (docs/scheduling.md,
 * keel/runtime.h, src/sched/dispatch.c):
 *
 *   dispatch_order        every edge (explicit and derived) holds at run time,
 *                         independent systems overlap, tracks run in order,
 *                         a large random DAG runs each system once per tick;
 *   dispatch_failure      failure isolation: FAILED / DEPENDENCY_FAILED, dropped
 *                         commands, the tick completes, the next tick recovers,
 *                         a failing chunk fails its whole parallel system;
 *   dispatch_parallel     parallel query systems visit every row once, match
 *                         the serial result bit for bit, honour min_chunk_rows;
 *                         pipeline systems call every index once; a worker
 *                         woken onto the stepping thread's CPU moves off it;
 *   dispatch_determinism  a random seeded schedule with structural churn gives
 *                         the same world, schedule hash and created handles on
 *                         1, 2, 4 and 8 workers;
 *   dispatch_sync         the sync point: schedule order, FIFO, chunk order,
 *                         invisibility within the tick, pending commands after
 *                         a failed playback (retry / discard), on_first_tick.
 *
 * Every suite starts worker threads, so everything shared between a system
 * body and the test thread is a C11 atomic (bodies never call ck_assert: they
 * count anomalies, which the test thread asserts on). No sleeps: where a test
 * needs two bodies to run at once it uses a rendezvous with a generous
 * deadline that only turns a hang into a failure.
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
#include "core/core.h"
#include "keel_test.h"
#include "test_util.h"
#include "world/world_internal.h" /* world_test_inject_failure */

static const int k_workers[] = {1, 2, 4};
#define NWORKERS ((int)(sizeof k_workers / sizeof k_workers[0]))

/* ---- small helpers ---------------------------------------------------------- */

#define mix64 core_mix64

static void atomic_min_u64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (v < cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

static void atomic_max_u64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

/* A little work so that bodies have a width in time. */
static void busy(uint32_t n)
{
    volatile uint32_t acc = 0;
    for (uint32_t i = 0; i < n; i++)
        acc += i;
    (void)acc;
}

/* ---- components --------------------------------------------------------------- */

typedef struct vec2 {
    float x, y;
} vec2;

static const keel_field f_u32[] = {{.name = "v", .type = KEEL_U32, .offset = 0, .count = 0}};
static const keel_field f_u64[] = {{.name = "v", .type = KEEL_U64, .offset = 0, .count = 0}};
static const keel_field f_vec2[] = {
    {.name = "x", .type = KEEL_F32, .offset = 0, .count = 0},
    {.name = "y", .type = KEEL_F32, .offset = 4, .count = 0},
};

/* Register a component and check it got the id the test expects. */
static keel_component reg(keel_world *w, const char *name, uint32_t size, const keel_field *fields, uint32_t nfields,
                          keel_component expect)
{
    keel_component c = tu_reg(w, name, size, KEEL_VERSIONED, fields, nfields);
    ck_assert_uint_eq(c, expect);
    return c;
}

static keel_component reg_u32(keel_world *w, const char *name, keel_component expect)
{
    return reg(w, name, sizeof(uint32_t), f_u32, 1, expect);
}

static keel_component reg_u64(keel_world *w, const char *name, keel_component expect)
{
    return reg(w, name, sizeof(uint64_t), f_u64, 1, expect);
}

static keel_component reg_vec2(keel_world *w, const char *name, keel_component expect)
{
    return reg(w, name, sizeof(vec2), f_vec2, 2, expect);
}

static keel_component reg_tag(keel_world *w, const char *name, keel_component expect)
{
    return reg(w, name, 0, NULL, 0, expect);
}

/* ---- runtime / schedule helpers ----------------------------------------------- */

/* A runtime with `workers` workers that only the test steps (no tick rate),
 * `chunk_rows` rows a chunk; hook runs before the first tick with hook_user
 * (typically the number of rows it spawns). */
static keel_runtime *hooked_rt(int workers, uint32_t chunk_rows, keel_hook_fn hook, uintptr_t hook_user)
{
    return tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = chunk_rows}, .workers = workers,
                                         .tick_rate_hz = -1, .on_first_tick = hook,
                                         .hook_user = (void *)hook_user});
}

static keel_tick_record tickrec(keel_runtime *rt, uint64_t tick)
{
    keel_tick_record r;
    memset(&r, 0, sizeof r);
    ck_assert_ok(keel_telemetry_tick(rt, tick, &r));
    ck_assert_uint_eq(r.tick, tick);
    return r;
}

/* (entity, u64 value of the query's first column) pairs, in iteration order. */
typedef struct ent_val {
    keel_entity e;
    uint64_t v;
} ent_val;

static uint32_t collect_u64(keel_query *q, ent_val *out, uint32_t cap)
{
    keel_iter it;
    uint32_t n = 0;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it)) {
        const uint64_t *col = KEEL_COLUMN(&it, const uint64_t, 0);
        for (uint32_t r = 0; r < it.count; r++, n++) {
            ck_assert_uint_lt(n, cap);
            out[n] = (ent_val){it.entities[r], col[r]};
        }
    }
    return n;
}

static int cmp_ent_val_by_index(const void *a, const void *b)
{
    uint32_t x = KEEL_ENTITY_INDEX(((const ent_val *)a)->e), y = KEEL_ENTITY_INDEX(((const ent_val *)b)->e);
    return (x > y) - (x < y);
}

/* ========================================================================== */
/* Probes: each body stamps a global sequence number on entry and exit.       */
/* ========================================================================== */

#define MAX_PROBES 256

static struct {
    _Atomic uint64_t seq;
    _Atomic uint64_t first[MAX_PROBES]; /* smallest entry stamp this tick */
    _Atomic uint64_t last[MAX_PROBES];  /* largest exit stamp this tick */
    _Atomic uint32_t calls[MAX_PROBES]; /* body calls this tick (chunks, indices) */
    _Atomic uint32_t total[MAX_PROBES]; /* body calls over the test */
    _Atomic uint32_t workers;           /* workers of the running runtime */
    _Atomic uint32_t fail_mask[MAX_PROBES]; /* 1: fail by return, 2: fail by keel_txn_fail */
    _Atomic uint32_t bad;               /* anomalies seen inside bodies */
} g_probe;

static void probe_reset(uint32_t workers)
{
    atomic_store(&g_probe.seq, 0);
    atomic_store(&g_probe.workers, workers);
    atomic_store(&g_probe.bad, 0);
    for (uint32_t i = 0; i < MAX_PROBES; i++) {
        atomic_store(&g_probe.total[i], 0);
        atomic_store(&g_probe.fail_mask[i], 0);
    }
}

/* No probe body counted an anomaly in g_probe.bad; then close rt. */
static void close_probed(keel_runtime *rt)
{
    ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
    keel_runtime_close(rt);
}

static void probe_tick_reset(void)
{
    for (uint32_t i = 0; i < MAX_PROBES; i++) {
        atomic_store(&g_probe.first[i], UINT64_MAX);
        atomic_store(&g_probe.last[i], 0);
        atomic_store(&g_probe.calls[i], 0);
    }
}

static void probe_enter(uint32_t id)
{
    uint64_t t = atomic_fetch_add(&g_probe.seq, 1) + 1;
    atomic_min_u64(&g_probe.first[id], t);
    atomic_fetch_add(&g_probe.calls[id], 1);
    atomic_fetch_add(&g_probe.total[id], 1);
}

static void probe_leave(uint32_t id)
{
    uint64_t t = atomic_fetch_add(&g_probe.seq, 1) + 1;
    atomic_max_u64(&g_probe.last[id], t);
}

static int probe_outcome(keel_ctx *ctx, uint32_t id)
{
    uint32_t f = atomic_load(&g_probe.fail_mask[id]);
    if (f == 1)
        return KEEL_ERANGE;
    if (f == 2 && ctx) {
        keel_txn_fail(ctx, KEEL_ECONFLICT);
        return 0;
    }
    return 0;
}

static int probe_cb(keel_ctx *ctx, void *user)
{
    uint32_t id = (uint32_t)(uintptr_t)user;
    probe_enter(id);
    if (keel_ctx_worker(ctx) >= atomic_load(&g_probe.workers) || keel_ctx_commands(ctx) == NULL)
        atomic_fetch_add(&g_probe.bad, 1);
    busy(200);
    probe_leave(id);
    return probe_outcome(ctx, id);
}

static int probe_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    uint32_t id = (uint32_t)(uintptr_t)user;
    probe_enter(id);
    if (keel_ctx_worker(ctx) >= atomic_load(&g_probe.workers) || it->count == 0 || keel_ctx_commands(ctx) == NULL)
        atomic_fetch_add(&g_probe.bad, 1);
    busy(50);
    probe_leave(id);
    return probe_outcome(ctx, id);
}

static int probe_pipe(uint32_t index, uint32_t count, void *user)
{
    uint32_t id = (uint32_t)(uintptr_t)user;
    probe_enter(id);
    if (index >= count)
        atomic_fetch_add(&g_probe.bad, 1);
    busy(50);
    probe_leave(id);
    return probe_outcome(NULL, id);
}

#define PROBE(i) ((void *)(uintptr_t)(i))

/* Assert end(pred) < start(succ) from the probes, and the same from the
 * telemetry clocks (end_ns(pred) <= start_ns(succ): the successor starts
 * after the predecessor was completed). */
static void check_edge(keel_runtime *rt, uint64_t tick, keel_system pred, keel_system succ, uint32_t ppred,
                       uint32_t psucc, const char *what)
{
    uint64_t e = atomic_load(&g_probe.last[ppred]), s = atomic_load(&g_probe.first[psucc]);
    ck_assert_msg(e != 0 && s != UINT64_MAX, "tick %llu edge %s: a body did not run", (unsigned long long)tick, what);
    ck_assert_msg(e < s, "tick %llu edge %s: predecessor ended at stamp %llu, successor started at %llu",
                  (unsigned long long)tick, what, (unsigned long long)e, (unsigned long long)s);
    keel_system_record a = tu_sysrec(rt, tick, pred), b = tu_sysrec(rt, tick, succ);
    ck_assert_msg(a.end_ns != 0 && b.start_ns != 0, "tick %llu edge %s: telemetry has no times",
                  (unsigned long long)tick, what);
    ck_assert_msg(a.end_ns <= b.start_ns, "tick %llu edge %s: telemetry end %llu > start %llu",
                  (unsigned long long)tick, what, (unsigned long long)a.end_ns, (unsigned long long)b.start_ns);
}

/* ========================================================================== */
/* dispatch_order                                                             */
/* ========================================================================== */

enum { O_P = 1, O_V = 2, O_C = 3 };

static int order_hook(keel_ctx *ctx, void *user)
{
    uint32_t n = (uint32_t)(uintptr_t)user;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = i;
        vec2 p = {(float)i, 0}, v = {1, 1};
        keel_init in[3] = {{O_P, &p}, {O_V, &v}, {O_C, &c}};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 3);
        if (rc)
            return rc;
    }
    return 0;
}

static void order_world(keel_runtime *rt)
{
    keel_world *w = keel_runtime_world(rt);
    reg_vec2(w, "pos", O_P);
    reg_vec2(w, "vel", O_V);
    reg_u32(w, "cnt", O_C);
}

/* Explicit and access-derived edges, with every system kind. */
START_TEST(test_order_edges)
{
    enum { JOIN, W_POS, FRESH_POS, PAR_Q, AFTER_PAR, SNAP_V, W_VEL, PIPE, PROD, CONS, PH1, PH0, FREE1, FREE2, SEQ_Q,
           EX, NSYS };
    static const char *const names[NSYS] = {"join", "w_pos", "fresh_pos", "par_q", "after_par", "snap_v", "w_vel",
                                            "pipe", "prod", "cons", "ph1", "ph0", "free1", "free2", "seq_q", "ex"};
    static const uint32_t edges[][2] = {
        {W_POS, FRESH_POS},  /* writes -> reads_fresh */
        {FRESH_POS, PAR_Q},  /* explicit after */
        {PAR_Q, AFTER_PAR},  /* writes -> reads_fresh (parallel query predecessor) */
        {AFTER_PAR, JOIN},   /* explicit after, forward reference (join registered first) */
        {SNAP_V, W_VEL},     /* explicit before (a snapshot reader alone needs no edge) */
        {W_VEL, PIPE},       /* explicit after */
        {PIPE, JOIN},        /* explicit before, forward reference */
        {PROD, CONS},        /* event produce -> consume */
        {PH0, PH1},          /* two writers of a resource, phase 0 before phase 1 */
        {FREE1, SEQ_Q},      /* explicit after on a non-parallel query system */
        {W_POS, SEQ_Q},      /* writes -> reads_fresh of a query term */
    };
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = hooked_rt(workers, 16, order_hook, 300);
        order_world(rt);
        keel_schedule *s = sched_new(rt);
        keel_system id[NSYS];
        for (uint32_t i = 0; i < NSYS; i++) {
            keel_system_desc d = {.name = names[i], .kind = KEEL_SYSTEM_CALLBACK, .run = probe_cb, .user = PROBE(i)};
            switch (i) {
            case JOIN: d.after[0] = "after_par"; break;
            case W_POS: d.access.writes[0] = O_P; break;
            case FRESH_POS: d.access.reads_fresh[0] = O_P; break;
            case PAR_Q:
                d.kind = KEEL_SYSTEM_QUERY;
                d.run = NULL;
                d.each_chunk = probe_chunk;
                d.query.with[0] = O_C;
                d.parallel = true;
                d.min_chunk_rows = 16;
                d.access.writes[0] = O_C;
                d.after[0] = "fresh_pos";
                break;
            case AFTER_PAR: d.access.reads_fresh[0] = O_C; break;
            case SNAP_V: d.access.reads_snapshot[0] = O_V; d.before[0] = "w_vel"; break;
            case W_VEL: d.access.writes[0] = O_V; break;
            case PIPE:
                d.kind = KEEL_SYSTEM_PIPELINE;
                d.run = NULL;
                d.pipeline = probe_pipe;
                d.pipeline_count = 37;
                d.after[0] = "w_vel";
                d.before[0] = "join";
                break;
            case PROD: d.access.events_produce[0] = "ev"; break;
            case CONS: d.access.events_consume[0] = "ev"; break;
            case PH1: d.access.resources_write[0] = "res"; d.phase = 1; break;
            case PH0: d.access.resources_write[0] = "res"; d.phase = 0; break;
            case SEQ_Q:
                d.kind = KEEL_SYSTEM_QUERY;
                d.run = NULL;
                d.each_chunk = probe_chunk;
                d.query.with[0] = O_P;
                d.access.reads_fresh[0] = O_P;
                d.after[0] = "free1";
                break;
            case EX: d.access.exclusive = true; d.phase = 9; break;
            default: break;
            }
            id[i] = add_sys(s, &d);
            ck_assert_uint_eq(id[i], i);
        }
        tu_install(rt, s);
        /* the execution order is a topological order of the expected edges */
        uint32_t pos[NSYS];
        for (uint32_t i = 0; i < NSYS; i++)
            pos[keel_schedule_order(s, i)] = i;
        for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
            ck_assert_uint_lt(pos[edges[e][0]], pos[edges[e][1]]);

        for (uint64_t tick = 1; tick <= 20; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(keel_runtime_tick(rt), tick);
            for (uint32_t i = 0; i < NSYS; i++) {
                keel_system_record r = tu_sysrec(rt, tick, id[i]);
                ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
                ck_assert_uint_lt(r.worker, (uint32_t)workers);
                ck_assert_uint_ne(r.start_ns, 0);
                ck_assert_uint_ge(r.end_ns, r.start_ns);
                uint32_t calls = atomic_load(&g_probe.calls[i]);
                if (i == PIPE) {
                    ck_assert_uint_eq(calls, 37);
                    ck_assert_uint_eq(r.tasks, 37);
                } else if (i == PAR_Q || i == SEQ_Q) {
                    ck_assert_uint_eq(calls, (300 + 15) / 16); /* 19 chunks of 16 rows */
                    ck_assert_uint_eq(r.rows, 300);
                    if (i == PAR_Q && workers > 1)
                        ck_assert_uint_gt(r.tasks, 1);
                } else {
                    ck_assert_uint_eq(calls, 1);
                }
                ck_assert_uint_lt(atomic_load(&g_probe.first[i]), atomic_load(&g_probe.last[i]));
            }
            char what[64];
            for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
                snprintf(what, sizeof what, "%s -> %s", names[edges[e][0]], names[edges[e][1]]);
                check_edge(rt, tick, id[edges[e][0]], id[edges[e][1]], edges[e][0], edges[e][1], what);
            }
            /* the exclusive system (highest phase) runs after every other one */
            for (uint32_t i = 0; i < NSYS; i++) {
                if (i == EX)
                    continue;
                snprintf(what, sizeof what, "%s -> ex (exclusive)", names[i]);
                check_edge(rt, tick, id[i], id[EX], i, EX, what);
            }
            keel_tick_record tr = tickrec(rt, tick);
            ck_assert_uint_eq(tr.systems_run, NSYS);
            ck_assert_uint_eq(tr.systems_failed, 0);
            ck_assert_uint_eq(tr.systems_skipped, 0);
            ck_assert_uint_eq(tr.entities, 300);
        }
        close_probed(rt);
    }
}
END_TEST

/* Two independent systems run at the same time when there are workers for
 * both: each waits (rendezvous) until the other has started. */
typedef struct rdv {
    _Atomic uint32_t arrived;
    _Atomic uint32_t met;
    _Atomic uint32_t timeouts;
} rdv;

static int rendezvous_cb(keel_ctx *ctx, void *user)
{
    (void)ctx;
    rdv *r = user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    atomic_fetch_add(&r->arrived, 1);
    /* both systems of this tick: arrived reaches 2 * tick */
    if (tu_wait_at_least(&r->arrived, 2 * tick))
        atomic_fetch_add(&r->met, 1);
    else
        atomic_fetch_add(&r->timeouts, 1);
    return 0;
}

START_TEST(test_order_independent_overlap)
{
    for (int wi = 1; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        static rdv r;
        atomic_store(&r.arrived, 0);
        atomic_store(&r.met, 0);
        atomic_store(&r.timeouts, 0);
        keel_system a = add_sys(s, &(keel_system_desc){.name = "a", .run = rendezvous_cb, .user = &r});
        keel_system b = add_sys(s, &(keel_system_desc){.name = "b", .run = rendezvous_cb, .user = &r});
        tu_install(rt, s);
        for (uint64_t tick = 1; tick <= 5; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&r.timeouts), 0);
            ck_assert_uint_eq(atomic_load(&r.met), 2 * tick);
            keel_system_record ra = tu_sysrec(rt, tick, a), rb = tu_sysrec(rt, tick, b);
            /* they ran at the same time, so on different workers */
            ck_assert_uint_ne(ra.worker, rb.worker);
            ck_assert_uint_lt(ra.worker, (uint32_t)workers);
            ck_assert_uint_lt(rb.worker, (uint32_t)workers);
        }
        keel_runtime_close(rt);
    }
}
END_TEST

/* A lone ready successor runs inline on the worker that completed its
 * predecessor, without a hand-off: in a pure chain every system runs on
 * the worker that ran the chain's root, and keel_ctx_worker agrees with the
 * telemetry. */
static _Atomic uint32_t g_chain_worker[32];

static int chain_cb(keel_ctx *ctx, void *user)
{
    uint32_t id = (uint32_t)(uintptr_t)user;
    atomic_store(&g_chain_worker[id], keel_ctx_worker(ctx));
    return probe_cb(ctx, user);
}

START_TEST(test_order_chain_inline)
{
    enum { N = 24 };
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        for (uint32_t i = 0; i < N; i++) {
            char name[16], prev[16];
            snprintf(name, sizeof name, "c%02u", i);
            snprintf(prev, sizeof prev, "c%02u", i ? i - 1 : 0);
            ck_assert_uint_eq(add_sys(s, &(keel_system_desc){.name = name, .run = chain_cb, .user = PROBE(i), .after = {i ? prev : NULL}}), i);
        }
        tu_install(rt, s);
        for (uint64_t tick = 1; tick <= 10; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            uint32_t w0 = tu_sysrec(rt, tick, 0).worker;
            for (uint32_t i = 0; i < N; i++) {
                keel_system_record r = tu_sysrec(rt, tick, i);
                ck_assert_uint_eq(r.worker, atomic_load(&g_chain_worker[i]));
                ck_assert_msg(r.worker == w0, "workers %d tick %llu: chain system c%02u ran on worker %u, root on %u",
                              workers, (unsigned long long)tick, i, r.worker, w0);
                if (i)
                    ck_assert_uint_lt(atomic_load(&g_probe.last[i - 1]), atomic_load(&g_probe.first[i]));
            }
        }
        close_probed(rt);
    }
}
END_TEST

/* Schedules with nothing (or nothing in some tracks) to run. */
START_TEST(test_order_empty_tracks)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);

        /* no system at all */
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        tu_install(rt, s);
        ck_assert_uint_eq(keel_schedule_system_count(s), 0);
        for (uint64_t tick = 1; tick <= 5; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(keel_runtime_tick(rt), tick);
            keel_tick_record tr = tickrec(rt, tick);
            ck_assert_uint_eq(tr.systems_run, 0);
            ck_assert_uint_eq(tr.systems_skipped, 0);
        }
        keel_runtime_close(rt);

        /* user tracks only, Public and T2 empty, T1/T3 used */
        rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        s = sched_new(rt);
        ck_assert_ok(keel_schedule_add_track(s, "T1"));
        ck_assert_ok(keel_schedule_add_track(s, "T2"));
        ck_assert_ok(keel_schedule_add_track(s, "T3"));
        ck_assert_ok(keel_schedule_add_track(s, "T4")); /* declared, never used */
        keel_system t3 = add_sys(s, &(keel_system_desc){.name = "t3", .track = "T3", .run = probe_cb, .user = PROBE(0)});
        keel_system t1 = add_sys(s, &(keel_system_desc){.name = "t1", .track = "T1", .run = probe_cb, .user = PROBE(1)});
        tu_install(rt, s);
        ck_assert_uint_eq(keel_schedule_order(s, 0), t1);
        ck_assert_uint_eq(keel_schedule_order(s, 1), t3);
        for (uint64_t tick = 1; tick <= 5; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&g_probe.calls[0]), 1);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 1);
            check_edge(rt, tick, t1, t3, 1, 0, "T1 -> T3");
        }
        keel_runtime_close(rt);

        /* Public used, declared user tracks empty */
        rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        s = sched_new(rt);
        ck_assert_ok(keel_schedule_add_track(s, "U1"));
        keel_system p = add_sys(s, &(keel_system_desc){.name = "p", .run = probe_cb, .user = PROBE(2)});
        tu_install(rt, s);
        for (uint64_t tick = 1; tick <= 3; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_int_eq(tu_sysrec(rt, tick, p).skip, KEEL_SKIP_NONE);
        }
        ck_assert_uint_eq(atomic_load(&g_probe.total[2]), 3);
        close_probed(rt);
    }
}
END_TEST

/* User tracks run after Public, in declaration order, whatever the
 * registration order: every system of a track ends before any system of the
 * next track starts. */
START_TEST(test_order_user_tracks)
{
    enum { PER = 5 };
    static const char *const tracks[3] = {NULL, "T1", "T2"};
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        ck_assert_ok(keel_schedule_add_track(s, "T1"));
        ck_assert_ok(keel_schedule_add_track(s, "T2"));
        /* registration interleaves tracks, latest track first */
        keel_system id[3][PER];
        uint32_t probe_of[3][PER];
        uint32_t next = 0;
        for (uint32_t k = 0; k < PER; k++) {
            for (int t = 2; t >= 0; t--) {
                char name[32];
                snprintf(name, sizeof name, "tr%d_%u", t, k);
                keel_system_desc d = {.name = name, .track = tracks[t], .run = probe_cb, .user = PROBE(next)};
                if (t == 2 && k == 0)
                    d.after[0] = "tr0_3"; /* across tracks: already ordered by the tracks */
                probe_of[t][k] = next++;
                id[t][k] = add_sys(s, &d);
            }
        }
        tu_install(rt, s);
        /* order: Public's systems first, then T1's, then T2's */
        for (uint32_t i = 0; i < 3 * PER; i++) {
            const char *n = keel_schedule_system_name(s, keel_schedule_order(s, i));
            ck_assert_int_eq(n[2] - '0', (int)(i / PER));
        }
        for (uint64_t tick = 1; tick <= 10; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            for (int t = 0; t < 2; t++) {
                uint64_t max_end = 0, min_start = UINT64_MAX;
                for (uint32_t k = 0; k < PER; k++) {
                    ck_assert_uint_eq(atomic_load(&g_probe.calls[probe_of[t][k]]), 1);
                    ck_assert_uint_eq(atomic_load(&g_probe.calls[probe_of[t + 1][k]]), 1);
                    uint64_t e = atomic_load(&g_probe.last[probe_of[t][k]]);
                    uint64_t st = atomic_load(&g_probe.first[probe_of[t + 1][k]]);
                    max_end = e > max_end ? e : max_end;
                    min_start = st < min_start ? st : min_start;
                }
                ck_assert_msg(max_end < min_start, "tick %llu: track %d still ran (stamp %llu) when track %d started (%llu)",
                              (unsigned long long)tick, t, (unsigned long long)max_end, t + 1,
                              (unsigned long long)min_start);
                for (uint32_t k = 0; k < PER; k++)
                    for (uint32_t j = 0; j < PER; j++)
                        ck_assert_uint_le(tu_sysrec(rt, tick, id[t][k]).end_ns, tu_sysrec(rt, tick, id[t + 1][j]).start_ns);
            }
        }
        close_probed(rt);
    }
}
END_TEST

/* A random seeded DAG. Systems get `after` edges to earlier systems and
 * `before` edges to later ones (so registration order is topological);
 * kinds mix callbacks, (parallel) queries and pipelines (some of 0 indices).
 * Every body runs exactly its expected number of times per tick, and every
 * non-empty system ends before any of its transitive successors starts. */
#define RDAG_N 200
#define RDAG_WORDS ((RDAG_N + 63) / 64)

typedef struct rdag {
    uint32_t n;
    keel_system_kind kind[RDAG_N];
    bool parallel[RDAG_N];
    uint32_t pipe_count[RDAG_N];
    uint32_t nafter[RDAG_N], after[RDAG_N][4];
    uint32_t nbefore[RDAG_N], before[RDAG_N][KEEL_EDGE_MAX];
    uint64_t anc[RDAG_N][RDAG_WORDS]; /* transitive predecessors */
} rdag;

static void rdag_make(rdag *g, uint32_t n, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->n = n;
    uint64_t r = seed;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = tu_rng_below(&r, 10);
        g->kind[i] = k < 6 ? KEEL_SYSTEM_CALLBACK : k < 8 ? KEEL_SYSTEM_QUERY : KEEL_SYSTEM_PIPELINE;
        g->parallel[i] = g->kind[i] == KEEL_SYSTEM_QUERY && tu_rng_below(&r, 2);
        g->pipe_count[i] = tu_rng_below(&r, 6); /* 0 .. 5 */
        uint32_t np = i ? tu_rng_below(&r, 4) : 0;
        for (uint32_t e = 0; e < np; e++) {
            uint32_t j = tu_rng_below(&r, i);
            bool dup = false;
            for (uint32_t x = 0; x < g->nafter[i]; x++)
                dup |= g->after[i][x] == j;
            if (!dup)
                g->after[i][g->nafter[i]++] = j;
        }
        if (i + 1 < n && tu_rng_below(&r, 4) == 0) {
            uint32_t j = i + 1 + tu_rng_below(&r, n - i - 1);
            if (g->nbefore[i] < KEEL_EDGE_MAX)
                g->before[i][g->nbefore[i]++] = j;
        }
    }
    /* ancestors, in registration order (= a topological order) */
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t x = 0; x < g->nafter[i]; x++) {
            uint32_t j = g->after[i][x];
            g->anc[i][j / 64] |= 1ull << (j % 64);
            for (uint32_t w = 0; w < RDAG_WORDS; w++)
                g->anc[i][w] |= g->anc[j][w];
        }
        /* before edges from earlier systems into i */
        for (uint32_t j = 0; j < i; j++)
            for (uint32_t x = 0; x < g->nbefore[j]; x++)
                if (g->before[j][x] == i) {
                    g->anc[i][j / 64] |= 1ull << (j % 64);
                    for (uint32_t w = 0; w < RDAG_WORDS; w++)
                        g->anc[i][w] |= g->anc[j][w];
                }
    }
}

static void rdag_add(keel_schedule *s, const rdag *g, keel_component qc, keel_system_fn cb, keel_chunk_fn chunk,
                     keel_pipeline_fn pipe, uint32_t min_rows)
{
    for (uint32_t i = 0; i < g->n; i++) {
        char name[16], an[4][16], bn[KEEL_EDGE_MAX][16];
        snprintf(name, sizeof name, "s%03u", i);
        keel_system_desc d = {.name = name, .kind = g->kind[i], .user = PROBE(i)};
        switch (g->kind[i]) {
        case KEEL_SYSTEM_CALLBACK: d.run = cb; break;
        case KEEL_SYSTEM_QUERY:
            d.each_chunk = chunk;
            d.query.with[0] = qc;
            d.parallel = g->parallel[i];
            d.min_chunk_rows = min_rows;
            break;
        default:
            d.pipeline = pipe;
            d.pipeline_count = g->pipe_count[i];
            break;
        }
        for (uint32_t x = 0; x < g->nafter[i]; x++) {
            snprintf(an[x], sizeof an[x], "s%03u", g->after[i][x]);
            d.after[x] = an[x];
        }
        for (uint32_t x = 0; x < g->nbefore[i]; x++) {
            snprintf(bn[x], sizeof bn[x], "s%03u", g->before[i][x]);
            d.before[x] = bn[x];
        }
        ck_assert_uint_eq(add_sys(s, &d), i);
    }
}

static uint32_t rdag_expected_calls(const rdag *g, uint32_t i, uint32_t nchunks)
{
    switch (g->kind[i]) {
    case KEEL_SYSTEM_CALLBACK: return 1;
    case KEEL_SYSTEM_QUERY: return nchunks;
    default: return g->pipe_count[i];
    }
}

START_TEST(test_order_random_dag)
{
    static rdag g;
    for (uint64_t seed = 1; seed <= 2; seed++) {
        rdag_make(&g, RDAG_N, seed * 7919);
        for (int wi = 0; wi < NWORKERS; wi++) {
            int workers = k_workers[wi];
            probe_reset((uint32_t)workers);
            keel_runtime *rt = hooked_rt(workers, 16, order_hook, 100);
            order_world(rt);
            keel_schedule *s = sched_new(rt);
            rdag_add(s, &g, O_C, probe_cb, probe_chunk, probe_pipe, 16);
            tu_install(rt, s);
            const uint32_t nchunks = (100 + 15) / 16;
            for (uint64_t tick = 1; tick <= 25; tick++) {
                probe_tick_reset();
                ck_assert_ok(keel_runtime_step(rt));
                keel_tick_record tr = tickrec(rt, tick);
                ck_assert_uint_eq(tr.systems_run, RDAG_N);
                ck_assert_uint_eq(tr.systems_failed + tr.systems_skipped, 0);
                for (uint32_t i = 0; i < RDAG_N; i++) {
                    uint32_t want = rdag_expected_calls(&g, i, nchunks);
                    ck_assert_msg(atomic_load(&g_probe.calls[i]) == want, "seed %llu workers %d tick %llu: s%03u ran %u times, expected %u",
                                  (unsigned long long)seed, workers, (unsigned long long)tick, i,
                                  atomic_load(&g_probe.calls[i]), want);
                    ck_assert_int_eq(tu_sysrec(rt, tick, i).skip, KEEL_SKIP_NONE);
                }
                for (uint32_t i = 0; i < RDAG_N; i++) {
                    if (!rdag_expected_calls(&g, i, nchunks))
                        continue;
                    uint64_t st = atomic_load(&g_probe.first[i]);
                    for (uint32_t j = 0; j < i; j++) {
                        if (!((g.anc[i][j / 64] >> (j % 64)) & 1) || !rdag_expected_calls(&g, j, nchunks))
                            continue;
                        uint64_t e = atomic_load(&g_probe.last[j]);
                        ck_assert_msg(e < st, "seed %llu workers %d tick %llu: s%03u (end %llu) -> s%03u (start %llu)",
                                      (unsigned long long)seed, workers, (unsigned long long)tick, j,
                                      (unsigned long long)e, i, (unsigned long long)st);
                    }
                }
            }
            close_probed(rt);
        }
    }
}
END_TEST

static Suite *dispatch_order(void)
{
    const TTest *const t[] = {test_order_edges, test_order_independent_overlap, test_order_chain_inline,
                              test_order_empty_tracks, test_order_user_tracks, test_order_random_dag};
    return tu_case_suite("dispatch_order", "order", t, sizeof t / sizeof t[0]);
}

/* ========================================================================== */
/* dispatch_failure                                                           */
/* ========================================================================== */

enum { F_ORIGIN = 1, F_DEP = 2, F_ID = 3, F_TAGGED = 4 };

static void failure_world(keel_runtime *rt)
{
    keel_world *w = keel_runtime_world(rt);
    reg_u64(w, "origin", F_ORIGIN);
    reg_u32(w, "dep", F_DEP);
    reg_u32(w, "id", F_ID);
    reg_tag(w, "tagged", F_TAGGED);
}

/* origin = probe id << 32 | tick */
static uint64_t origin_of(uint32_t id, uint64_t tick)
{
    return ((uint64_t)id << 32) | (tick & 0xffffffffu);
}

/* A callback that records a spawn of {origin}, then fails per fail_mask. */
static int spawn_then_maybe_fail(keel_ctx *ctx, void *user)
{
    uint32_t id = (uint32_t)(uintptr_t)user;
    probe_enter(id);
    uint64_t o = origin_of(id, keel_ctx_tick(ctx));
    keel_init in[1] = {{F_ORIGIN, &o}};
    if (keel_cmd_spawn(keel_ctx_commands(ctx), in, 1))
        atomic_fetch_add(&g_probe.bad, 1);
    probe_leave(id);
    return probe_outcome(ctx, id);
}

static int spawn_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)it;
    return spawn_then_maybe_fail(ctx, user);
}

static int dep_hook(keel_ctx *ctx, void *user)
{
    uint32_t n = (uint32_t)(uintptr_t)user;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = i;
        keel_init in[2] = {{F_DEP, &v}, {F_ID, &v}};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 2);
        if (rc)
            return rc;
    }
    return 0;
}

/* Count the entities whose origin names probe id (any tick). */
static uint32_t count_origin(keel_query *q, uint32_t id, uint64_t tick)
{
    ent_val v[4096];
    uint32_t n = collect_u64(q, v, 4096), c = 0;
    for (uint32_t i = 0; i < n; i++)
        c += (v[i].v >> 32) == id && (tick == 0 || (v[i].v & 0xffffffffu) == tick);
    return c;
}

START_TEST(test_failure_isolation)
{
    enum { ROOT, FAIL, S1, S2, S3, U1, U2, U3, S4, S5, NSYS };
    static const char *const names[NSYS] = {"root", "fail", "s1", "s2", "s3", "u1", "u2", "u3", "s4", "s5"};
    static const bool dependent[NSYS] = {[S1] = true, [S2] = true, [S3] = true, [S4] = true, [S5] = true};
    for (int mode = 1; mode <= 2; mode++) {
        for (int wi = 0; wi < NWORKERS; wi++) {
            int workers = k_workers[wi];
            probe_reset((uint32_t)workers);
            keel_runtime *rt = hooked_rt(workers, 16, dep_hook, 50);
            failure_world(rt);
            keel_schedule *s = sched_new(rt);
            for (uint32_t i = 0; i < NSYS; i++) {
                keel_system_desc d = {.name = names[i], .run = spawn_then_maybe_fail, .user = PROBE(i)};
                switch (i) {
                case FAIL: d.after[0] = "root"; d.access.writes[0] = F_DEP; break;
                case S1: d.after[0] = "fail"; break;
                case S2: d.access.reads_fresh[0] = F_DEP; d.after[0] = "s1"; break; /* derived edge fail -> s2 */
                case S3: d.after[0] = "s2"; d.after[1] = "u1"; break;             /* u1 runs, s2 does not */
                case U2: d.after[0] = "root"; break;
                case U3: d.after[0] = "u1"; break;
                case S4: d.kind = KEEL_SYSTEM_PIPELINE; d.run = NULL; d.pipeline = probe_pipe; d.pipeline_count = 8; d.after[0] = "s1"; break;
                case S5:
                    d.kind = KEEL_SYSTEM_QUERY;
                    d.run = NULL;
                    d.each_chunk = spawn_chunk;
                    d.query.with[0] = F_DEP;
                    d.parallel = true;
                    d.min_chunk_rows = 16;
                    d.access.reads[0] = F_DEP;
                    d.after[0] = "s2";
                    break;
                default: break;
                }
                ck_assert_uint_eq(add_sys(s, &d), i);
            }
            tu_install(rt, s);
            keel_query *q = tu_query_new(keel_runtime_world(rt), F_ORIGIN, 0);
            uint64_t failed_total = 0, skipped_total = 0;
            for (uint64_t tick = 1; tick <= 4; tick++) {
                bool failing = tick != 2; /* ticks 1, 3, 4 fail; tick 2 recovers */
                atomic_store(&g_probe.fail_mask[FAIL], failing ? (uint32_t)mode : 0);
                probe_tick_reset();
                ck_assert_ok(keel_runtime_step(rt)); /* a failing system is not an error of the tick */
                ck_assert_uint_eq(keel_runtime_tick(rt), tick);
                for (uint32_t i = 0; i < NSYS; i++) {
                    keel_system_record r = tu_sysrec(rt, tick, i);
                    keel_skip_reason want = !failing ? KEEL_SKIP_NONE
                                            : i == FAIL ? KEEL_SKIP_FAILED
                                            : dependent[i] ? KEEL_SKIP_DEPENDENCY_FAILED
                                                           : KEEL_SKIP_NONE;
                    ck_assert_msg(r.skip == want, "mode %d workers %d tick %llu: %s has skip %s, expected %s", mode,
                                  workers, (unsigned long long)tick, names[i], keel_skip_reason_name(r.skip),
                                  keel_skip_reason_name(want));
                    uint32_t calls = atomic_load(&g_probe.calls[i]);
                    if (want == KEEL_SKIP_DEPENDENCY_FAILED) {
                        ck_assert_msg(calls == 0, "%s body ran although a predecessor failed", names[i]);
                        ck_assert_uint_eq(r.start_ns, 0);
                        ck_assert_uint_eq(r.end_ns, 0);
                    } else {
                        ck_assert_uint_gt(calls, 0);
                        ck_assert_uint_ne(r.start_ns, 0);
                        ck_assert_uint_ge(r.end_ns, r.start_ns);
                    }
                }
                keel_tick_record tr = tickrec(rt, tick);
                ck_assert_uint_eq(tr.systems_failed, failing ? 1 : 0);
                ck_assert_uint_eq(tr.systems_skipped, failing ? 5 : 0);
                ck_assert_uint_eq(tr.systems_run, failing ? NSYS - 5 : NSYS);
                failed_total += failing ? 1 : 0;
                skipped_total += failing ? 5 : 0;
                /* commands: the failing system's spawn is dropped, the others' are applied */
                ck_assert_uint_eq(count_origin(q, FAIL, tick), failing ? 0 : 1);
                for (uint32_t i = 0; i < NSYS; i++) {
                    if (i == FAIL || i == S4)
                        continue;
                    uint32_t want = failing && dependent[i] ? 0 : i == S5 ? 4 /* 50 rows: 4 chunks */ : 1;
                    ck_assert_msg(count_origin(q, i, tick) == want, "tick %llu: %s spawned %u, expected %u",
                                  (unsigned long long)tick, names[i], count_origin(q, i, tick), want);
                }
            }
            ck_assert_uint_eq(count_origin(q, FAIL, 0), 1); /* only tick 2's */
            keel_runtime_stats st;
            keel_runtime_stats_get(rt, &st);
            ck_assert_uint_eq(st.ticks, 4);
            ck_assert_uint_eq(st.systems_failed, failed_total);
            ck_assert_uint_eq(st.systems_skipped, skipped_total);
            ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
            keel_query_destroy(q);
            keel_runtime_close(rt);
        }
    }
}
END_TEST

/* A random DAG where a random set of systems fails each tick: the expected
 * skip reasons follow from the DAG (a failing system that is itself behind a
 * failure is DEPENDENCY_FAILED and does not run). Each running system
 * spawns one entity; exactly the successful systems' spawns appear, in
 * schedule order. */
START_TEST(test_failure_random_dag)
{
    static rdag g;
    enum { N = 120 };
    rdag_make(&g, N, 4242);
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = hooked_rt(workers, 16, dep_hook, 40);
        failure_world(rt);
        keel_schedule *s = sched_new(rt);
        rdag_add(s, &g, F_DEP, spawn_then_maybe_fail, spawn_chunk, probe_pipe, 16);
        tu_install(rt, s);
        uint32_t order_pos[N];
        for (uint32_t i = 0; i < N; i++)
            order_pos[keel_schedule_order(s, i)] = i;
        keel_query *q = tu_query_new(keel_runtime_world(rt), F_ORIGIN, 0);
        const uint32_t nchunks = (40 + 15) / 16;
        uint64_t r = 99;
        static ent_val v[20000];
        for (uint64_t tick = 1; tick <= 6; tick++) {
            keel_skip_reason want[N];
            bool fails[N];
            for (uint32_t i = 0; i < N; i++) {
                fails[i] = tu_rng_below(&r, 12) == 0 && rdag_expected_calls(&g, i, nchunks) > 0;
                atomic_store(&g_probe.fail_mask[i], fails[i] ? 1 + tu_rng_below(&r, 2) : 0);
                if (g.kind[i] == KEEL_SYSTEM_PIPELINE && fails[i])
                    atomic_store(&g_probe.fail_mask[i], 1); /* no ctx: fail by return */
            }
            uint32_t nfail = 0, nskip = 0;
            for (uint32_t i = 0; i < N; i++) { /* registration order is topological */
                bool dep = false;
                for (uint32_t j = 0; j < i; j++) {
                    bool direct = false;
                    for (uint32_t x = 0; x < g.nafter[i]; x++)
                        direct |= g.after[i][x] == j;
                    for (uint32_t x = 0; x < g.nbefore[j]; x++)
                        direct |= g.before[j][x] == i;
                    if (direct && want[j] != KEEL_SKIP_NONE)
                        dep = true;
                }
                want[i] = dep ? KEEL_SKIP_DEPENDENCY_FAILED : fails[i] ? KEEL_SKIP_FAILED : KEEL_SKIP_NONE;
                nfail += want[i] == KEEL_SKIP_FAILED;
                nskip += want[i] == KEEL_SKIP_DEPENDENCY_FAILED;
            }
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            for (uint32_t i = 0; i < N; i++) {
                keel_system_record rec = tu_sysrec(rt, tick, i);
                ck_assert_msg(rec.skip == want[i], "workers %d tick %llu: s%03u skip %s, expected %s", workers,
                              (unsigned long long)tick, i, keel_skip_reason_name(rec.skip),
                              keel_skip_reason_name(want[i]));
                uint32_t calls = atomic_load(&g_probe.calls[i]);
                if (want[i] == KEEL_SKIP_DEPENDENCY_FAILED)
                    ck_assert_uint_eq(calls, 0);
                else if (g.kind[i] != KEEL_SYSTEM_PIPELINE && !fails[i])
                    ck_assert_uint_eq(calls, rdag_expected_calls(&g, i, nchunks));
            }
            keel_tick_record tr = tickrec(rt, tick);
            ck_assert_uint_eq(tr.systems_failed, nfail);
            ck_assert_uint_eq(tr.systems_skipped, nskip);
            ck_assert_uint_eq(tr.systems_run, N - nskip);
            /* the spawns of this tick: exactly those of the systems that succeeded */
            uint32_t n = collect_u64(q, v, 20000), m = 0;
            for (uint32_t k = 0; k < n; k++)
                if ((v[k].v & 0xffffffffu) == tick)
                    v[m++] = v[k];
            qsort(v, m, sizeof v[0], cmp_ent_val_by_index);
            uint32_t expect = 0;
            for (uint32_t i = 0; i < N; i++)
                if (want[i] == KEEL_SKIP_NONE && g.kind[i] != KEEL_SYSTEM_PIPELINE)
                    expect += g.kind[i] == KEEL_SYSTEM_QUERY ? nchunks : 1;
            ck_assert_uint_eq(m, expect);
            for (uint32_t k = 0; k < m; k++) {
                uint32_t sys = (uint32_t)(v[k].v >> 32);
                ck_assert_msg(want[sys] == KEEL_SKIP_NONE, "tick %llu: commands of s%03u (skip %s) were applied",
                              (unsigned long long)tick, sys, keel_skip_reason_name(want[sys]));
                /* no destroys: new slots in sync order = schedule order */
                if (k)
                    ck_assert_uint_le(order_pos[v[k - 1].v >> 32], order_pos[sys]);
            }
        }
        ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
        keel_query_destroy(q);
        keel_runtime_close(rt);
    }
}
END_TEST

/* One failing chunk fails its whole parallel query system: every task's
 * commands are dropped, its successors are skipped; next tick all applies. */
static _Atomic uint32_t g_fail_id = UINT32_MAX;
static _Atomic uint32_t g_fail_how = 1;
static _Atomic uint32_t g_par_chunks;

static int tag_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    atomic_fetch_add(&g_par_chunks, 1);
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    bool fail = false;
    for (uint32_t r = 0; r < it->count; r++) {
        if (keel_cmd_add(cb, it->entities[r], F_TAGGED, NULL))
            atomic_fetch_add(&g_probe.bad, 1);
        fail |= ids[r] == atomic_load(&g_fail_id);
    }
    uint64_t o = origin_of(1000 + ids[0], keel_ctx_tick(ctx));
    keel_init in[1] = {{F_ORIGIN, &o}};
    if (keel_cmd_spawn(cb, in, 1))
        atomic_fetch_add(&g_probe.bad, 1);
    if (fail) {
        if (atomic_load(&g_fail_how) == 1)
            return KEEL_EIO;
        keel_txn_fail(ctx, 0); /* 0: fails with KEEL_EINVAL */
    }
    return 0;
}

START_TEST(test_failure_parallel_chunk)
{
    enum { N = 2000 };
    static const uint32_t fail_ids[] = {1234, 0, N - 1};
    for (int wi = 0; wi < NWORKERS; wi++) {
        for (size_t f = 0; f < sizeof fail_ids / sizeof fail_ids[0]; f++) {
            int workers = k_workers[wi];
            probe_reset((uint32_t)workers);
            keel_runtime *rt = hooked_rt(workers, 16, dep_hook, N);
            failure_world(rt);
            keel_schedule *s = sched_new(rt);
            keel_system par = add_sys(s, &(keel_system_desc){.name = "par",
                                                             .kind = KEEL_SYSTEM_QUERY,
                                                             .each_chunk = tag_chunk,
                                                             .query = {.with = {F_ID}},
                                                             .parallel = true,
                                                             .min_chunk_rows = 16,
                                                             .access = {.reads = {F_ID}}});
            keel_system after = add_sys(s, &(keel_system_desc){.name = "after_par", .run = probe_cb, .user = PROBE(1), .after = {"par"}});
            keel_system other = add_sys(s, &(keel_system_desc){.name = "other", .run = spawn_then_maybe_fail, .user = PROBE(2)});
            tu_install(rt, s);
            keel_world *w = keel_runtime_world(rt);
            keel_query *tagged = tu_query_new(w, F_ID, F_TAGGED);
            keel_query *orig = tu_query_new(w, F_ORIGIN, 0);

            /* tick 1: the chunk holding fail_ids[f] fails */
            atomic_store(&g_fail_id, fail_ids[f]);
            atomic_store(&g_fail_how, (uint32_t)(f % 2) + 1);
            atomic_store(&g_par_chunks, 0);
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            keel_system_record r = tu_sysrec(rt, 1, par);
            ck_assert_int_eq(r.skip, KEEL_SKIP_FAILED);
            if (workers > 1)
                ck_assert_uint_gt(r.tasks, 1);
            ck_assert_int_eq(tu_sysrec(rt, 1, after).skip, KEEL_SKIP_DEPENDENCY_FAILED);
            ck_assert_int_eq(tu_sysrec(rt, 1, other).skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 0);
            ck_assert_uint_gt(atomic_load(&g_par_chunks), 0);
            ck_assert_uint_eq(keel_query_count(tagged), 0);  /* no task's adds applied */
            ck_assert_uint_eq(keel_world_count(w), N + 1); /* no task's spawns; other's spawn applied */
            ck_assert_uint_eq(count_origin(orig, 2, 1), 1);

            /* tick 2: nothing fails: every row tagged, one spawn per chunk */
            atomic_store(&g_fail_id, UINT32_MAX);
            atomic_store(&g_par_chunks, 0);
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            r = tu_sysrec(rt, 2, par);
            ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(r.rows, N);
            ck_assert_uint_eq(atomic_load(&g_par_chunks), N / 16 + (N % 16 != 0));
            ck_assert_int_eq(tu_sysrec(rt, 2, after).skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 1);
            ck_assert_uint_eq(keel_query_count(tagged), N);
            ck_assert_uint_eq(keel_world_count(w), N + 2 + N / 16 + (N % 16 != 0));
            ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
            keel_query_destroy(tagged);
            keel_query_destroy(orig);
            keel_runtime_close(rt);
        }
    }
}
END_TEST

/* A pipeline index that fails fails the pipeline system. */
static int pipe_fail_at_5(uint32_t index, uint32_t count, void *user)
{
    (void)count;
    (void)user;
    atomic_fetch_add(&g_probe.calls[0], 1);
    return index == 5 ? KEEL_EIO : 0;
}

START_TEST(test_failure_pipeline)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        keel_system p = add_sys(s, &(keel_system_desc){.name = "p", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = pipe_fail_at_5, .pipeline_count = 64});
        keel_system a = add_sys(s, &(keel_system_desc){.name = "a", .run = probe_cb, .user = PROBE(1), .after = {"p"}});
        keel_system b = add_sys(s, &(keel_system_desc){.name = "b", .run = probe_cb, .user = PROBE(2)});
        tu_install(rt, s);
        probe_tick_reset();
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_int_eq(tu_sysrec(rt, 1, p).skip, KEEL_SKIP_FAILED);
        ck_assert_int_eq(tu_sysrec(rt, 1, a).skip, KEEL_SKIP_DEPENDENCY_FAILED);
        ck_assert_int_eq(tu_sysrec(rt, 1, b).skip, KEEL_SKIP_NONE);
        ck_assert_uint_ge(atomic_load(&g_probe.calls[0]), 1);
        ck_assert_uint_le(atomic_load(&g_probe.calls[0]), 64);
        ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 0);
        ck_assert_uint_eq(atomic_load(&g_probe.calls[2]), 1);
        keel_runtime_close(rt);
    }
}
END_TEST

static Suite *dispatch_failure(void)
{
    const TTest *const t[] = {test_failure_isolation, test_failure_random_dag, test_failure_parallel_chunk,
                              test_failure_pipeline};
    return tu_case_suite("dispatch_failure", "failure", t, sizeof t / sizeof t[0]);
}

/* ========================================================================== */
/* dispatch_parallel                                                          */
/* ========================================================================== */

enum { P_ID = 1, P_POS = 2, P_VEL = 3 };
#define P_N 100000u
#define P_CHUNK 64u
#define P_NCHUNKS ((P_N + P_CHUNK - 1) / P_CHUNK)

static void par_world(keel_runtime *rt)
{
    keel_world *w = keel_runtime_world(rt);
    reg_u32(w, "id", P_ID);
    reg_vec2(w, "pos", P_POS);
    reg_vec2(w, "vel", P_VEL);
}

static vec2 pos0(uint32_t i)
{
    return (vec2){(float)i * 0.5f, -(float)i};
}

static vec2 vel0(uint32_t i)
{
    return (vec2){(float)(int)(i % 7) - 3.0f + 0.25f, (float)(i % 11) * 0.125f + 0.1f};
}

static int par_hook(keel_ctx *ctx, void *user)
{
    uint32_t n = (uint32_t)(uintptr_t)user;
    for (uint32_t i = 0; i < n; i++) {
        vec2 p = pos0(i), v = vel0(i);
        keel_init in[3] = {{P_ID, &i}, {P_POS, &p}, {P_VEL, &v}};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 3);
        if (rc)
            return rc;
    }
    return 0;
}

static _Atomic uint32_t g_visits[3][P_N];
static _Atomic uint64_t g_rows_seen[3];
static _Atomic uint32_t g_par_bad;

static int visit_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    uint32_t k = (uint32_t)(uintptr_t)user;
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    if (!it->count || it->count > P_CHUNK || keel_ctx_worker(ctx) >= atomic_load(&g_probe.workers))
        atomic_fetch_add(&g_par_bad, 1);
    for (uint32_t r = 0; r < it->count; r++) {
        if (ids[r] >= P_N) {
            atomic_fetch_add(&g_par_bad, 1);
            continue;
        }
        atomic_fetch_add_explicit(&g_visits[k][ids[r]], 1, memory_order_relaxed);
    }
    atomic_fetch_add(&g_rows_seen[k], it->count);
    return 0;
}

static void visits_reset(void)
{
    for (uint32_t k = 0; k < 3; k++) {
        for (uint32_t i = 0; i < P_N; i++)
            atomic_store_explicit(&g_visits[k][i], 0, memory_order_relaxed);
        atomic_store(&g_rows_seen[k], 0);
    }
    atomic_store(&g_par_bad, 0);
}

/* A runtime of `workers` over the P_N-entity parallel world (populated by
 * its first tick), probes and visit counters reset; *s receives a schedule
 * to add systems to. */
static keel_runtime *par_runtime(int workers, keel_schedule **s)
{
    probe_reset((uint32_t)workers);
    visits_reset();
    keel_runtime *rt = hooked_rt(workers, P_CHUNK, par_hook, P_N);
    par_world(rt);
    *s = sched_new(rt);
    return rt;
}

/* A parallel query system over P_ID that only reads it. */
static keel_system add_par_reader(keel_schedule *s, const char *name, keel_chunk_fn fn, uint32_t min_chunk_rows,
                                  uint32_t user)
{
    return add_sys(s, &(keel_system_desc){.name = name,
                                          .kind = KEEL_SYSTEM_QUERY,
                                          .each_chunk = fn,
                                          .query = {.with = {P_ID}},
                                          .parallel = true,
                                          .min_chunk_rows = min_chunk_rows,
                                          .user = (void *)(uintptr_t)user,
                                          .access = {.reads = {P_ID}}});
}

static void assert_visits(uint32_t k, uint32_t times, int workers)
{
    for (uint32_t i = 0; i < P_N; i++) {
        uint32_t v = atomic_load_explicit(&g_visits[k][i], memory_order_relaxed);
        if (v != times) /* (ck_assert only on a mismatch: 10^5 checks are slow under TSan) */
            ck_abort_msg("workers %d system %u: entity id %u visited %u times, expected %u", workers, k, i, v, times);
    }
    ck_assert_uint_eq(atomic_load(&g_rows_seen[k]), (uint64_t)P_N * times);
}

START_TEST(test_parallel_visit_once)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        keel_schedule *s;
        keel_runtime *rt = par_runtime(workers, &s);
        keel_system sys = add_par_reader(s, "visit", visit_chunk, 0, 0);
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 3; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            assert_visits(0, tick, workers);
            keel_system_record r = tu_sysrec(rt, tick, sys);
            ck_assert_int_eq(r.skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(r.rows, P_N);
            ck_assert_uint_ge(r.tasks, 1);
            ck_assert_uint_le(r.tasks, P_NCHUNKS);
            if (workers > 1)
                ck_assert_uint_gt(r.tasks, 1);
            ck_assert_uint_lt(r.worker, (uint32_t)workers);
            ck_assert_uint_eq(tickrec(rt, tick).entities, P_N);
        }
        ck_assert_uint_eq(atomic_load(&g_par_bad), 0);
        keel_runtime_close(rt);
    }
}
END_TEST

/* pos += vel * dt, written in place, chunk-parallel: bit-identical to the
 * serial run and to a plain loop. */
static int move_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    float dt = keel_ctx_dt(ctx);
    vec2 *p = KEEL_COLUMN(it, vec2, 0);
    const vec2 *v = KEEL_COLUMN(it, const vec2, 1);
    for (uint32_t r = 0; r < it->count; r++) {
        p[r].x = p[r].x + v[r].x * dt;
        p[r].y = p[r].y + v[r].y * dt;
    }
    return 0;
}

START_TEST(test_parallel_integrate_matches_serial)
{
    enum { TICKS = 10 };
    uint64_t hash[NWORKERS], hash0[NWORKERS];
    static vec2 expect[P_N];
    const float dt = 1.0f / 60.0f; /* keel_ctx_dt when unthrottled */
    for (uint32_t i = 0; i < P_N; i++) {
        vec2 p = pos0(i), v = vel0(i);
        for (int t = 0; t < TICKS; t++) {
            p.x = p.x + v.x * dt;
            p.y = p.y + v.y * dt;
        }
        expect[i] = p;
    }
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        keel_runtime *rt = hooked_rt(workers, P_CHUNK, par_hook, P_N);
        par_world(rt);
        keel_schedule *s = sched_new(rt);
        keel_system sys = add_sys(s, &(keel_system_desc){.name = "move",
                                                         .kind = KEEL_SYSTEM_QUERY,
                                                         .each_chunk = move_chunk,
                                                         .query = {.with = {P_POS, P_VEL}},
                                                         .parallel = true,
                                                         .access = {.writes = {P_POS}, .reads = {P_VEL}}});
        tu_install(rt, s);
        keel_world *w = keel_runtime_world(rt);
        hash0[wi] = keel_world_hash(w); /* empty world before the first tick */
        for (int t = 1; t <= TICKS; t++) {
            ck_assert_ok(keel_runtime_step(rt));
            keel_system_record r = tu_sysrec(rt, (uint64_t)t, sys);
            ck_assert_uint_eq(r.rows, P_N);
            if (workers > 1)
                ck_assert_uint_gt(r.tasks, 1);
        }
        hash[wi] = keel_world_hash(w);
        ck_assert_uint_ne(hash[wi], hash0[wi]);
        /* every value equals the plain loop's, bit for bit */
        keel_query *q = tu_query_new(w, P_ID, P_POS);
        keel_iter it;
        uint32_t seen = 0;
        keel_query_iter(q, &it);
        while (keel_iter_next(&it)) {
            const uint32_t *ids = KEEL_COLUMN(&it, const uint32_t, 0);
            const vec2 *p = KEEL_COLUMN(&it, const vec2, 1);
            for (uint32_t r = 0; r < it.count; r++, seen++)
                if (memcmp(&p[r], &expect[ids[r]], sizeof(vec2)) != 0)
                    ck_abort_msg("workers %d: entity id %u has pos (%a, %a), expected (%a, %a)", workers, ids[r],
                                 (double)p[r].x, (double)p[r].y, (double)expect[ids[r]].x, (double)expect[ids[r]].y);
        }
        ck_assert_uint_eq(seen, P_N);
        keel_query_destroy(q);
        keel_runtime_close(rt);
    }
    for (int wi = 1; wi < NWORKERS; wi++)
        ck_assert_msg(hash[wi] == hash[0], "world hash on %d workers %016llx != serial %016llx", k_workers[wi],
                      (unsigned long long)hash[wi], (unsigned long long)hash[0]);
}
END_TEST

/* A ticket holder stuck in the first task of its home range does not strand
 * the rest of that range: the other holders take those tasks (dispatch.c
 * "Task ranges"). Tick 1 learns the task count T; in tick 2 the chunk that
 * holds id 0 (task 0's first) waits until every row outside task 0 has been
 * visited -- which needs task 1, in task 0's range, to be taken by another
 * thread. A dispatcher that left it to the stuck holder would trip the
 * rendezvous guard and fail the test. */
static _Atomic uint32_t g_block_task0_rows; /* rows of task 0 in the blocking tick, 0 = do not block */
static _Atomic uint32_t g_block_others;     /* rows visited outside task 0 */
static _Atomic uint32_t g_block_failed;

static int block_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    uint32_t task0 = atomic_load(&g_block_task0_rows);
    for (uint32_t r = 0; r < it->count; r++)
        atomic_fetch_add(&g_visits[0][ids[r]], 1);
    if (!task0)
        return 0;
    if (ids[0] >= task0)
        atomic_fetch_add(&g_block_others, it->count);
    else if (ids[0] == 0 && !tu_wait_at_least(&g_block_others, P_N - task0))
        atomic_store(&g_block_failed, 1);
    return 0;
}

START_TEST(test_parallel_stuck_holder)
{
    for (int wi = 1; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        atomic_store(&g_block_task0_rows, 0);
        atomic_store(&g_block_others, 0);
        atomic_store(&g_block_failed, 0);
        keel_schedule *s;
        keel_runtime *rt = par_runtime(workers, &s);
        keel_system sys = add_par_reader(s, "block", block_chunk, 0, 0);
        tu_install(rt, s);
        ck_assert_ok(keel_runtime_step(rt));
        uint32_t tasks = tu_sysrec(rt, 1, sys).tasks;
        ck_assert_uint_ge(tasks, 2);
        /* task 0 owns chunks [0, P_NCHUNKS / tasks): ids are spawned in row order */
        atomic_store(&g_block_task0_rows, (uint32_t)(P_NCHUNKS / tasks) * P_CHUNK);
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(atomic_load(&g_block_failed), 0);
        ck_assert_uint_eq(tu_sysrec(rt, 2, sys).tasks, tasks);
        ck_assert_uint_eq(tu_sysrec(rt, 2, sys).rows, P_N);
        for (uint32_t i = 0; i < P_N; i++)
            if (atomic_load(&g_visits[0][i]) != 2)
                ck_abort_msg("workers %d: id %u visited %u times, expected 2", workers, i, atomic_load(&g_visits[0][i]));
        keel_runtime_close(rt);
    }
}
END_TEST

/* Each worker's home range is its own index's, every tick (dispatch.c "Task
 * ranges"): worker w starts the tick at the first task of range w, so it
 * streams the same rows as the tick before. Every chunk waits until all
 * workers have started one, so no worker drains its home and steals before
 * the others claimed their first task; the first chunk each worker visits
 * is then its home range's first. Homes dealt by arrival order would give
 * range 0 to whichever worker came first: with 2 workers often worker 0,
 * with 4 on fewer CPUs a different order from tick to tick, which fails.
 * The claim order itself is checked deterministically in test_core. */
#define HOME_TICKS 5
static _Atomic uint32_t g_home_first[8]; /* first id each worker visited this tick, UINT32_MAX = none */
static _Atomic uint32_t g_home_started;  /* workers that have visited a chunk this tick */
static _Atomic uint32_t g_home_workers;  /* 0 = do not wait */
static _Atomic uint32_t g_home_failed;

static int home_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint32_t w = keel_ctx_worker(ctx), none = UINT32_MAX, workers = atomic_load(&g_home_workers);
    const uint32_t *ids = KEEL_COLUMN(it, const uint32_t, 0);
    if (!workers)
        return 0;
    if (w >= 8) {
        atomic_store(&g_home_failed, 1);
        return 0;
    }
    if (atomic_compare_exchange_strong(&g_home_first[w], &none, ids[0]))
        atomic_fetch_add(&g_home_started, 1);
    if (!tu_wait_at_least(&g_home_started, workers))
        atomic_store(&g_home_failed, 1);
    return 0;
}

START_TEST(test_parallel_home_ranges)
{
    for (int wi = 1; wi < NWORKERS; wi++) {
        uint32_t workers = (uint32_t)k_workers[wi];
        atomic_store(&g_home_workers, 0);
        keel_schedule *s;
        keel_runtime *rt = par_runtime((int)workers, &s);
        keel_system sys = add_par_reader(s, "home", home_chunk, 0, 0);
        tu_install(rt, s);
        ck_assert_ok(keel_runtime_step(rt)); /* populates the world */
        for (uint64_t tick = 2; tick < 2 + HOME_TICKS; tick++) {
            for (uint32_t w = 0; w < 8; w++)
                atomic_store(&g_home_first[w], UINT32_MAX);
            atomic_store(&g_home_started, 0);
            atomic_store(&g_home_failed, 0);
            atomic_store(&g_home_workers, workers);
            ck_assert_ok(keel_runtime_step(rt));
            atomic_store(&g_home_workers, 0);
            ck_assert_uint_eq(atomic_load(&g_home_failed), 0);
            uint32_t tasks = tu_sysrec(rt, tick, sys).tasks;
            ck_assert_uint_ge(tasks, workers); /* one range per worker */
            for (uint32_t w = 0; w < workers; w++) {
                uint32_t task = (uint32_t)((uint64_t)tasks * w / workers); /* range w's first task */
                uint32_t chunk = (uint32_t)((uint64_t)task * P_NCHUNKS / tasks);
                ck_assert_msg(atomic_load(&g_home_first[w]) == chunk * P_CHUNK,
                              "workers %u tick %llu: worker %u started at id %u, not at its range's %u", workers,
                              (unsigned long long)tick, w, atomic_load(&g_home_first[w]), chunk * P_CHUNK);
            }
        }
        keel_runtime_close(rt);
    }
}
END_TEST

/* min_chunk_rows bounds the number of tasks: rows / min_chunk_rows at most
 * (and 1 when it exceeds the rows); every row is still visited once. */
START_TEST(test_parallel_min_chunk_rows)
{
    /* 40000: P_N / 40000 = 2 tasks, below the default workers x TASKS_PER_WORKER */
    static const uint32_t min_rows[3] = {0 /* default 64 */, 40000, 200000};
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        keel_schedule *s;
        keel_runtime *rt = par_runtime(workers, &s);
        keel_system sys[3];
        for (uint32_t k = 0; k < 3; k++) {
            char name[16];
            snprintf(name, sizeof name, "visit%u", k);
            sys[k] = add_par_reader(s, name, visit_chunk, min_rows[k], k);
        }
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 2; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            uint32_t tasks[3];
            for (uint32_t k = 0; k < 3; k++) {
                assert_visits(k, tick, workers);
                keel_system_record r = tu_sysrec(rt, tick, sys[k]);
                ck_assert_uint_eq(r.rows, P_N);
                tasks[k] = r.tasks;
                uint32_t m = min_rows[k] ? min_rows[k] : 64;
                ck_assert_uint_ge(tasks[k], 1);
                ck_assert_msg((uint64_t)tasks[k] * m <= P_N || tasks[k] == 1,
                              "workers %d: %u tasks of at least %u rows over %u rows", workers, tasks[k], m, P_N);
            }
            ck_assert_uint_eq(tasks[2], 1);
            if (workers > 1) {
                ck_assert_uint_gt(tasks[0], tasks[1]);
                ck_assert_uint_gt(tasks[1], 1);
            }
        }
        ck_assert_uint_eq(atomic_load(&g_par_bad), 0);
        keel_runtime_close(rt);
    }
}
END_TEST

/* The tasks of one parallel query system really run at the same time: the
 * first chunk to start waits until a chunk of another task started. */
static rdv g_chunk_rdv;

static int rendezvous_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)it;
    (void)user;
    uint32_t tick = (uint32_t)keel_ctx_tick(ctx);
    uint32_t n = atomic_fetch_add(&g_chunk_rdv.arrived, 1) + 1;
    /* 40 chunks a tick: the first of this tick waits for a second one */
    if (n == 40 * (tick - 1) + 1) {
        if (tu_wait_at_least(&g_chunk_rdv.arrived, n + 1))
            atomic_fetch_add(&g_chunk_rdv.met, 1);
        else
            atomic_fetch_add(&g_chunk_rdv.timeouts, 1);
    }
    return 0;
}

START_TEST(test_parallel_tasks_overlap)
{
    for (int wi = 1; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        atomic_store(&g_chunk_rdv.arrived, 0);
        atomic_store(&g_chunk_rdv.met, 0);
        atomic_store(&g_chunk_rdv.timeouts, 0);
        keel_runtime *rt = hooked_rt(workers, 16, par_hook, 40 * 16);
        par_world(rt);
        keel_schedule *s = sched_new(rt);
        keel_system sys = add_sys(s, &(keel_system_desc){.name = "rdv",
                                                         .kind = KEEL_SYSTEM_QUERY,
                                                         .each_chunk = rendezvous_chunk,
                                                         .query = {.with = {P_ID}},
                                                         .parallel = true,
                                                         .min_chunk_rows = 16});
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 5; tick++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&g_chunk_rdv.timeouts), 0);
            ck_assert_uint_eq(atomic_load(&g_chunk_rdv.met), tick);
            ck_assert_uint_eq(atomic_load(&g_chunk_rdv.arrived), 40 * tick);
            ck_assert_uint_gt(tu_sysrec(rt, tick, sys).tasks, 1);
        }
        keel_runtime_close(rt);
    }
}
END_TEST

/* Pipelines: every index in [0, count) exactly once per tick; count 0 is a
 * system that completes at once (its successors run); a count-0 root. */
static _Atomic uint32_t g_hits[4][1000];
static _Atomic uint32_t g_pipe_bad;

static int hit_pipe(uint32_t index, uint32_t count, void *user)
{
    uint32_t k = (uint32_t)(uintptr_t)user;
    static const uint32_t counts[4] = {1000, 0, 1, 0};
    if (count != counts[k] || index >= count) {
        atomic_fetch_add(&g_pipe_bad, 1);
        return 0;
    }
    atomic_fetch_add(&g_hits[k][index], 1);
    busy(20);
    return 0;
}

START_TEST(test_parallel_pipeline)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        for (uint32_t k = 0; k < 4; k++)
            for (uint32_t i = 0; i < 1000; i++)
                atomic_store(&g_hits[k][i], 0);
        atomic_store(&g_pipe_bad, 0);
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = workers, .tick_rate_hz = -1});
        keel_schedule *s = sched_new(rt);
        /* zero0 (root, 0 indices) -> zero1 (0 indices) -> one (1 index) -> cb ; big (1000) -> cb2 */
        keel_system zero0 = add_sys(s, &(keel_system_desc){.name = "zero0", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = hit_pipe, .pipeline_count = 0, .user = (void *)(uintptr_t)1});
        keel_system zero1 = add_sys(s, &(keel_system_desc){.name = "zero1", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = hit_pipe, .pipeline_count = 0, .user = (void *)(uintptr_t)3, .after = {"zero0"}});
        keel_system one = add_sys(s, &(keel_system_desc){.name = "one", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = hit_pipe, .pipeline_count = 1, .user = (void *)(uintptr_t)2, .after = {"zero1"}});
        keel_system cb = add_sys(s, &(keel_system_desc){.name = "cb", .run = probe_cb, .user = PROBE(0), .after = {"one"}});
        keel_system big = add_sys(s, &(keel_system_desc){.name = "big", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = hit_pipe, .pipeline_count = 1000, .user = (void *)(uintptr_t)0});
        keel_system cb2 = add_sys(s, &(keel_system_desc){.name = "cb2", .run = probe_cb, .user = PROBE(1), .after = {"big", "zero0"}});
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 4; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            for (uint32_t i = 0; i < 1000; i++)
                ck_assert_msg(atomic_load(&g_hits[0][i]) == tick, "workers %d: index %u called %u times in %u ticks",
                              workers, i, atomic_load(&g_hits[0][i]), tick);
            ck_assert_uint_eq(atomic_load(&g_hits[2][0]), tick);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[0]), 1);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 1);
            keel_system all[] = {zero0, zero1, one, cb, big, cb2};
            for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
                ck_assert_int_eq(tu_sysrec(rt, tick, all[k]).skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(tu_sysrec(rt, tick, big).tasks, 1000);
            ck_assert_uint_eq(tu_sysrec(rt, tick, one).tasks, 1);
            ck_assert_uint_eq(tu_sysrec(rt, tick, zero0).tasks, 0);
            ck_assert_uint_eq(tickrec(rt, tick).systems_run, 6);
        }
        ck_assert_uint_eq(atomic_load(&g_pipe_bad), 0);
        close_probed(rt);
    }
}
END_TEST

/* A parallel query with nothing to visit, or one chunk only. */
START_TEST(test_parallel_small_queries)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        probe_reset((uint32_t)workers);
        keel_runtime *rt = hooked_rt(workers, 64, par_hook, 10);
        par_world(rt);
        keel_world *w = keel_runtime_world(rt);
        keel_component none = reg_u32(w, "none", 4);
        keel_schedule *s = sched_new(rt);
        keel_system empty = add_sys(s, &(keel_system_desc){.name = "empty", .kind = KEEL_SYSTEM_QUERY, .each_chunk = probe_chunk, .user = PROBE(0), .query = {.with = {none}}, .parallel = true});
        keel_system single = add_sys(s, &(keel_system_desc){.name = "single", .kind = KEEL_SYSTEM_QUERY, .each_chunk = probe_chunk, .user = PROBE(1), .query = {.with = {P_ID}}, .parallel = true, .min_chunk_rows = 1});
        keel_system after = add_sys(s, &(keel_system_desc){.name = "after", .run = probe_cb, .user = PROBE(2), .after = {"empty", "single"}});
        tu_install(rt, s);
        for (uint32_t tick = 1; tick <= 3; tick++) {
            probe_tick_reset();
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&g_probe.calls[0]), 0);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[1]), 1);
            ck_assert_uint_eq(atomic_load(&g_probe.calls[2]), 1);
            keel_system_record re = tu_sysrec(rt, tick, empty), rs = tu_sysrec(rt, tick, single);
            ck_assert_int_eq(re.skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(re.rows, 0);
            ck_assert_int_eq(rs.skip, KEEL_SKIP_NONE);
            ck_assert_uint_eq(rs.rows, 10);
            ck_assert_uint_eq(rs.tasks, 1);
            ck_assert_int_eq(tu_sysrec(rt, tick, after).skip, KEEL_SKIP_NONE);
        }
        close_probed(rt);
    }
}
END_TEST

/* Worker placement (src/sched/dispatch.c, "Worker placement"): a worker
 * woken onto the stepping thread's CPU moves off it. The worker is made to
 * start there: the test thread pins itself to one CPU, A, before the
 * runtime starts its worker (which inherits that affinity), then gives the
 * worker back every CPU, as an operator's taskset -p would. Without the
 * placement the kernel may go on waking the worker on A, where it takes
 * turns with the stepping thread. */
static int g_place_cpu;                 /* A */
static _Atomic uint32_t g_w1_tasks, g_w1_on_a;

static int cpu_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)it, (void)user;
    if (keel_ctx_worker(ctx) == 1) {
        atomic_fetch_add(&g_w1_tasks, 1);
        if (sched_getcpu() == g_place_cpu)
            atomic_fetch_add(&g_w1_on_a, 1);
    }
    return 0;
}

/* One round: the worker started on A and then given every CPU; stepped
 * until it ran 8 tasks. The test thread's affinity is restored and the
 * runtime closed before anything is asserted. */
typedef struct place_round {
    uint32_t tasks, on_a;
    bool found, widened, mask_ok;
} place_round;

static place_round place_once(const cpu_set_t *all)
{
    place_round out = {0};
    cpu_set_t one;
    g_place_cpu = sched_getcpu();
    CPU_ZERO(&one);
    CPU_SET(g_place_cpu < 0 ? 0 : g_place_cpu, &one);
    if (g_place_cpu < 0 || sched_setaffinity(0, sizeof one, &one))
        return out;
    keel_schedule *s;
    keel_runtime *rt = par_runtime(2, &s);
    pid_t worker = tu_thread_id("keel-worker-1");
    out.found = worker > 0;
    out.widened = out.found && !sched_setaffinity(worker, sizeof *all, all);
    add_par_reader(s, "where", cpu_chunk, 0, 0);
    tu_install(rt, s);
    atomic_store(&g_w1_tasks, 0);
    atomic_store(&g_w1_on_a, 0);
    for (uint32_t tick = 0; out.widened && tick < 1000 && atomic_load(&g_w1_tasks) < 8; tick++)
        if (keel_runtime_step(rt))
            break;
    out.tasks = atomic_load(&g_w1_tasks);
    out.on_a = atomic_load(&g_w1_on_a);
    /* the worker's CPUs: all of them where the kernel woke it elsewhere by itself, else all but A */
    cpu_set_t now, but_a = *all;
    CPU_CLR(g_place_cpu, &but_a);
    out.mask_ok = out.found && !sched_getaffinity(worker, sizeof now, &now) &&
                  (CPU_EQUAL(&now, all) || CPU_EQUAL(&now, &but_a));
    keel_runtime_close(rt);
    sched_setaffinity(0, sizeof *all, all);
    return out;
}

START_TEST(test_parallel_worker_leaves_stepping_cpu)
{
    cpu_set_t all;
    ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
    /* five rounds: where the kernel itself wakes the worker off A now and then, a worker that never
       moved would still be caught */
    for (int round = 0; round < 5; round++) {
        place_round r = place_once(&all);
        ck_assert_msg(r.found && r.widened, "round %d: the worker thread was not found or not widened", round);
        ck_assert_uint_ge(r.tasks, 8);
        if (CPU_COUNT(&all) > 1) {
            ck_assert_msg(r.on_a == 0, "round %d: the worker ran %u of its %u tasks on the stepping thread's CPU",
                          round, r.on_a, r.tasks);
            ck_assert(r.mask_ok);
        } else { /* one CPU: nowhere to go, nothing changed */
            ck_assert_uint_eq(r.on_a, r.tasks);
        }
    }
}
END_TEST

static Suite *dispatch_parallel(void)
{
    const TTest *const t[] = {test_parallel_visit_once, test_parallel_integrate_matches_serial,
                              test_parallel_min_chunk_rows, test_parallel_stuck_holder, test_parallel_home_ranges,
                              test_parallel_tasks_overlap,
                              test_parallel_pipeline, test_parallel_small_queries,
                              test_parallel_worker_leaves_stepping_cpu};
    return tu_case_suite("dispatch_parallel", "parallel", t, sizeof t / sizeof t[0]);
}

/* ========================================================================== */
/* dispatch_determinism                                                       */
/* ========================================================================== */

enum { D_A = 1, D_ORIGIN = 5, D_MARK = 6 };
#define DET_COMPS 4
#define DET_NSYS 26
#define DET_INIT 600u
#define DET_TICKS 50
#define DET_CAP 2500u
#define DET_MAX_CREATED 40000u

typedef struct det_sys {
    keel_system_kind kind;
    bool parallel, exclusive;
    uint32_t phase, rank, pipe_count;
    uint8_t wr[DET_COMPS];
    uint8_t rd[DET_COMPS]; /* 0 none, 1 reads, 2 reads_fresh, 3 reads_snapshot */
    uint32_t nafter, after[KEEL_EDGE_MAX];
    uint32_t nbefore, before[KEEL_EDGE_MAX];
    int produce, consume; /* event index or -1 */
    uint64_t salt;
    /* per runtime */
    keel_component with[DET_COMPS];
    uint8_t with_wr[DET_COMPS];
    uint32_t nwith;
    keel_query *q; /* callback and pipeline systems iterate their own query */
} det_sys;

static det_sys g_det[DET_NSYS];
static _Atomic uint64_t g_det_tick;
static _Atomic uint32_t g_det_bad;

static bool det_has_edge(uint32_t a, uint32_t b)
{
    for (uint32_t x = 0; x < g_det[b].nafter; x++)
        if (g_det[b].after[x] == a)
            return true;
    for (uint32_t x = 0; x < g_det[a].nbefore; x++)
        if (g_det[a].before[x] == b)
            return true;
    return false;
}

static void det_edge(uint32_t a, uint32_t b)
{
    ck_assert_uint_lt(g_det[a].rank, g_det[b].rank);
    if (det_has_edge(a, b))
        return;
    if (g_det[b].nafter < KEEL_EDGE_MAX)
        g_det[b].after[g_det[b].nafter++] = a;
    else if (g_det[a].nbefore < KEEL_EDGE_MAX)
        g_det[a].before[g_det[a].nbefore++] = b;
    else
        ck_abort_msg("determinism generator: too many edges");
}

static bool det_conflict(uint32_t a, uint32_t b)
{
    const det_sys *x = &g_det[a], *y = &g_det[b];
    if (x->exclusive || y->exclusive)
        return true;
    for (uint32_t c = 0; c < DET_COMPS; c++)
        if ((x->wr[c] && y->wr[c]) || (x->wr[c] && y->rd[c] == 1) || (x->rd[c] == 1 && y->wr[c]))
            return true;
    return false;
}

/* A random schedule whose every conflict is ordered; all edges (explicit,
 * phase, fresh, snapshot, event) go from lower to higher rank, where rank
 * sorts by (phase, index): acyclic by construction. */
static void det_generate(uint64_t seed)
{
    uint64_t r = seed;
    memset(g_det, 0, sizeof g_det);
    for (uint32_t i = 0; i < DET_NSYS; i++) {
        det_sys *d = &g_det[i];
        uint32_t k = tu_rng_below(&r, 4);
        d->kind = k == 3 ? KEEL_SYSTEM_PIPELINE : k == 0 ? KEEL_SYSTEM_CALLBACK : KEEL_SYSTEM_QUERY;
        d->parallel = k == 2;
        d->pipe_count = 1 + tu_rng_below(&r, 6);
        d->phase = tu_rng_below(&r, 3);
        d->salt = tu_rng_next(&r);
        d->produce = d->consume = -1;
        /* pipelines have no transaction: they may not write VERSIONED state */
        for (uint32_t c = 0; c < DET_COMPS; c++)
            d->wr[c] = tu_rng_below(&r, 3) == 0 && d->kind != KEEL_SYSTEM_PIPELINE;
    }
    /* the last system is exclusive, alone in the highest phase */
    det_sys *ex = &g_det[DET_NSYS - 1];
    ex->kind = KEEL_SYSTEM_CALLBACK;
    ex->parallel = false;
    ex->exclusive = true;
    ex->phase = 3;
    memset(ex->wr, 0, sizeof ex->wr);
    ex->rd[0] = 1;
    /* ranks */
    uint32_t order[DET_NSYS];
    for (uint32_t i = 0; i < DET_NSYS; i++)
        order[i] = i;
    for (uint32_t i = 1; i < DET_NSYS; i++)
        for (uint32_t j = i; j > 0 && g_det[order[j - 1]].phase > g_det[order[j]].phase; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (uint32_t i = 0; i < DET_NSYS; i++)
        g_det[order[i]].rank = i;
    /* reads: fresh only after every writer, snapshot only before every writer */
    for (uint32_t i = 0; i + 1 < DET_NSYS; i++) {
        det_sys *d = &g_det[i];
        for (uint32_t c = 0; c < DET_COMPS; c++) {
            if (d->wr[c] || tu_rng_below(&r, 2))
                continue;
            bool lower = true, higher = true;
            for (uint32_t j = 0; j < DET_NSYS; j++)
                if (j != i && g_det[j].wr[c]) {
                    lower &= g_det[j].rank < d->rank;
                    higher &= g_det[j].rank > d->rank;
                }
            uint8_t opts[3], n = 0;
            opts[n++] = 1;
            if (lower)
                opts[n++] = 2;
            if (higher && d->kind != KEEL_SYSTEM_PIPELINE) /* no snapshot without a transaction */
                opts[n++] = 3;
            d->rd[c] = opts[tu_rng_below(&r, n)];
        }
        bool any = false;
        for (uint32_t c = 0; c < DET_COMPS; c++)
            any |= d->wr[c] || d->rd[c];
        if (!any)
            d->rd[tu_rng_below(&r, DET_COMPS)] = 1;
    }
    /* conflicts in one phase need an explicit edge */
    for (uint32_t a = 0; a < DET_NSYS; a++)
        for (uint32_t b = 0; b < DET_NSYS; b++)
            if (g_det[a].rank < g_det[b].rank && g_det[a].phase == g_det[b].phase && det_conflict(a, b))
                det_edge(a, b);
    /* some extra explicit edges */
    for (uint32_t i = 0; i < DET_NSYS; i++)
        if (g_det[i].rank > 0 && tu_rng_below(&r, 3) == 0)
            det_edge(order[tu_rng_below(&r, g_det[i].rank)], i);
    /* two events */
    for (int e = 0; e < 2; e++) {
        uint32_t a = tu_rng_below(&r, DET_NSYS - 1), b = tu_rng_below(&r, DET_NSYS - 1);
        if (a == b || g_det[a].produce >= 0 || g_det[b].consume >= 0)
            continue;
        if (g_det[a].rank > g_det[b].rank) {
            uint32_t t = a;
            a = b;
            b = t;
            if (g_det[a].produce >= 0 || g_det[b].consume >= 0)
                continue;
        }
        g_det[a].produce = e;
        g_det[b].consume = e;
    }
}

static void det_row(const det_sys *d, keel_entity e, uint64_t tick, void *const *cols, uint32_t row, keel_cmdbuf *cb,
                    uint32_t live)
{
    uint64_t h = mix64(d->salt ^ (e * 0x9e3779b97f4a7c15ull) ^ (tick << 20));
    for (uint32_t k = 0; k < d->nwith; k++)
        h = mix64(h ^ ((const uint32_t *)cols[k])[row]);
    for (uint32_t k = 0; k < d->nwith; k++)
        if (d->with_wr[k])
            ((uint32_t *)cols[k])[row] = (uint32_t)mix64(h + k);
    if (!cb)
        return;
    uint32_t r = (uint32_t)(h % 1000);
    int rc = 0;
    if (r < 5) {
        rc = keel_cmd_destroy(cb, e);
    } else if (r < 10 && live < DET_CAP) {
        uint64_t o = mix64(h ^ 0x5151);
        uint32_t vals[DET_COMPS];
        keel_init in[2 + DET_COMPS];
        uint32_t n = 0;
        in[n++] = (keel_init){D_ORIGIN, &o};
        in[n++] = (keel_init){D_MARK, NULL};
        for (uint32_t c = 0; c < DET_COMPS; c++)
            if ((h >> (32 + c)) & 1) {
                vals[c] = (uint32_t)(h >> (c * 5));
                in[n++] = (keel_init){D_A + c, &vals[c]};
            }
        rc = keel_cmd_spawn(cb, in, n);
    } else if (r < 14) {
        uint32_t v = (uint32_t)(h >> 13);
        rc = keel_cmd_add(cb, e, D_A + (uint32_t)((h >> 40) % DET_COMPS), &v);
    } else if (r < 17) {
        rc = keel_cmd_remove(cb, e, D_A + (uint32_t)((h >> 44) % DET_COMPS));
    }
    if (rc)
        atomic_fetch_add(&g_det_bad, 1);
}

static void det_check_tick(keel_ctx *ctx)
{
    if (keel_ctx_tick(ctx) != atomic_load(&g_det_tick))
        atomic_fetch_add(&g_det_bad, 1);
}

static int det_cb(keel_ctx *ctx, void *user)
{
    const det_sys *d = user;
    det_check_tick(ctx);
    uint32_t live = keel_world_count(keel_ctx_world(ctx));
    keel_iter it;
    keel_txn_iter(ctx, d->q, &it);
    while (keel_txn_next(ctx, &it))
        for (uint32_t r = 0; r < it.count; r++)
            det_row(d, it.entities[r], keel_ctx_tick(ctx), it.columns, r, keel_ctx_commands(ctx), live);
    return 0;
}

static int det_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    const det_sys *d = user;
    det_check_tick(ctx);
    uint32_t live = keel_world_count(keel_ctx_world(ctx));
    for (uint32_t r = 0; r < it->count; r++)
        det_row(d, it->entities[r], keel_ctx_tick(ctx), it->columns, r, keel_ctx_commands(ctx), live);
    return 0;
}

/* index k of the pipeline owns the chunks j with j % count == k */
static int det_pipe(uint32_t index, uint32_t count, void *user)
{
    const det_sys *d = user;
    uint64_t tick = atomic_load(&g_det_tick);
    keel_iter it;
    uint32_t j = 0;
    keel_query_iter(d->q, &it);
    while (keel_iter_next(&it)) {
        if (j++ % count != index)
            continue;
        for (uint32_t r = 0; r < it.count; r++)
            det_row(d, it.entities[r], tick, it.columns, r, NULL, 0);
    }
    return 0;
}

static int det_hook(keel_ctx *ctx, void *user)
{
    (void)user;
    for (uint32_t i = 0; i < DET_INIT; i++) {
        uint64_t h = mix64(i + 777), o = i;
        uint32_t vals[DET_COMPS];
        keel_init in[2 + DET_COMPS];
        uint32_t n = 0;
        in[n++] = (keel_init){D_ORIGIN, &o};
        in[n++] = (keel_init){D_MARK, NULL};
        for (uint32_t c = 0; c < DET_COMPS; c++)
            if ((h >> (c * 2)) & 3) {
                vals[c] = (uint32_t)(h >> (16 + c * 8));
                in[n++] = (keel_init){D_A + c, &vals[c]};
            }
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, n);
        if (rc)
            return rc;
    }
    return 0;
}

static keel_schedule *det_install(keel_runtime *rt)
{
    keel_world *w = keel_runtime_world(rt);
    static const char *const cn[DET_COMPS] = {"ca", "cb", "cc", "cd"};
    for (uint32_t c = 0; c < DET_COMPS; c++)
        reg_u32(w, cn[c], D_A + c);
    reg_u64(w, "origin", D_ORIGIN);
    reg_tag(w, "mark", D_MARK);
    static const char *const events[2] = {"ev0", "ev1"};
    keel_schedule *s = sched_new(rt);
    for (uint32_t i = 0; i < DET_NSYS; i++) {
        det_sys *d = &g_det[i];
        char name[8], an[KEEL_EDGE_MAX][8], bn[KEEL_EDGE_MAX][8];
        snprintf(name, sizeof name, "d%02u", i);
        keel_system_desc sd = {.name = name, .kind = d->kind, .phase = d->phase, .user = d};
        d->nwith = 0;
        d->q = NULL;
        uint32_t nw = 0, nr = 0, nf = 0, ns = 0;
        for (uint32_t c = 0; c < DET_COMPS; c++) {
            if (!d->wr[c] && !d->rd[c])
                continue;
            d->with[d->nwith] = D_A + c;
            d->with_wr[d->nwith++] = d->wr[c];
            if (d->wr[c])
                sd.access.writes[nw++] = D_A + c;
            else if (d->rd[c] == 1)
                sd.access.reads[nr++] = D_A + c;
            else if (d->rd[c] == 2)
                sd.access.reads_fresh[nf++] = D_A + c;
            else
                sd.access.reads_snapshot[ns++] = D_A + c;
        }
        ck_assert_uint_gt(d->nwith, 0);
        sd.access.exclusive = d->exclusive;
        if (d->produce >= 0)
            sd.access.events_produce[0] = events[d->produce];
        if (d->consume >= 0)
            sd.access.events_consume[0] = events[d->consume];
        for (uint32_t x = 0; x < d->nafter; x++) {
            snprintf(an[x], sizeof an[x], "d%02u", d->after[x]);
            sd.after[x] = an[x];
        }
        for (uint32_t x = 0; x < d->nbefore; x++) {
            snprintf(bn[x], sizeof bn[x], "d%02u", d->before[x]);
            sd.before[x] = bn[x];
        }
        keel_query_desc qd = {{0}, {0}};
        for (uint32_t k = 0; k < d->nwith; k++)
            qd.with[k] = d->with[k];
        switch (d->kind) {
        case KEEL_SYSTEM_CALLBACK:
            sd.run = det_cb;
            ck_assert_ok(keel_query_create(w, &qd, &d->q));
            break;
        case KEEL_SYSTEM_QUERY:
            sd.each_chunk = det_chunk;
            sd.query = qd;
            sd.parallel = d->parallel;
            sd.min_chunk_rows = 16;
            break;
        default:
            sd.pipeline = det_pipe;
            sd.pipeline_count = d->pipe_count;
            ck_assert_ok(keel_query_create(w, &qd, &d->q));
            break;
        }
        ck_assert_uint_eq(add_sys(s, &sd), i);
    }
    tu_install(rt, s);
    return s;
}

/* Handles seen so far (open addressing). */
#define SEEN_CAP (1u << 17)
static keel_entity g_seen[SEEN_CAP];

static bool seen_insert(keel_entity e)
{
    uint32_t i = (uint32_t)mix64(e) & (SEEN_CAP - 1);
    while (g_seen[i]) {
        if (g_seen[i] == e)
            return false;
        i = (i + 1) & (SEEN_CAP - 1);
    }
    g_seen[i] = e;
    return true;
}

typedef struct det_run {
    uint64_t hash[DET_TICKS + 1];
    uint32_t live[DET_TICKS + 1];
    uint64_t schedule_hash;
    uint64_t commands_applied, systems_run;
    uint32_t ncreated;
    ent_val created[DET_MAX_CREATED]; /* (handle, origin) in creation tick, then handle index order */
    uint32_t created_at[DET_TICKS + 1]; /* ncreated after each tick */
} det_run;

static void det_run_one(int workers, det_run *out)
{
    memset(g_seen, 0, sizeof g_seen);
    memset(out, 0, sizeof *out);
    atomic_store(&g_det_bad, 0);
    keel_runtime *rt = hooked_rt(workers, 16, det_hook, 0);
    keel_schedule *s = det_install(rt);
    out->schedule_hash = keel_schedule_hash(s);
    ck_assert_uint_ne(out->schedule_hash, 0);
    keel_world *w = keel_runtime_world(rt);
    keel_query *q = tu_query_new(w, D_ORIGIN, 0);
    static ent_val all[DET_CAP * 4];
    for (uint32_t t = 1; t <= DET_TICKS; t++) {
        atomic_store(&g_det_tick, t);
        ck_assert_ok(keel_runtime_step(rt));
        keel_tick_record tr = tickrec(rt, t);
        ck_assert_uint_eq(tr.systems_run, DET_NSYS);
        ck_assert_uint_eq(tr.systems_failed + tr.systems_skipped, 0);
        out->hash[t] = keel_world_hash(w);
        out->live[t] = keel_world_count(w);
        uint32_t n = collect_u64(q, all, DET_CAP * 4), first = out->ncreated;
        ck_assert_uint_eq(n, out->live[t]); /* every entity keeps its origin */
        for (uint32_t i = 0; i < n; i++)
            if (seen_insert(all[i].e)) {
                ck_assert_uint_lt(out->ncreated, DET_MAX_CREATED);
                out->created[out->ncreated++] = all[i];
            }
        qsort(&out->created[first], out->ncreated - first, sizeof(ent_val), cmp_ent_val_by_index);
        out->created_at[t] = out->ncreated;
    }
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    out->commands_applied = st.commands_applied;
    out->systems_run = st.systems_run;
    ck_assert_uint_eq(atomic_load(&g_det_bad), 0);
    keel_query_destroy(q);
    for (uint32_t i = 0; i < DET_NSYS; i++)
        keel_query_destroy(g_det[i].q);
    keel_runtime_close(rt);
}

START_TEST(test_determinism_random_schedule)
{
    static const int workers[] = {1, 2, 4, 8};
    static det_run runs[4];
    const uint64_t seed = 0x5eed0000ull + (uint64_t)_i;
    det_generate(seed);
    /* the generated schedule is the one described: every kind is present */
    uint32_t kinds[4] = {0};
    for (uint32_t i = 0; i < DET_NSYS; i++)
        kinds[g_det[i].kind == KEEL_SYSTEM_QUERY ? (g_det[i].parallel ? 2 : 1) : g_det[i].kind == KEEL_SYSTEM_PIPELINE ? 3 : 0]++;
    for (int k = 0; k < 4; k++)
        ck_assert_msg(kinds[k] > 0, "seed %llx: system kind %d missing", (unsigned long long)seed, k);
    for (int r = 0; r < 4; r++)
        det_run_one(workers[r], &runs[r]);
    /* the workload is not trivial: entities were created and destroyed */
    ck_assert_uint_gt(runs[0].ncreated, DET_INIT + 50);
    ck_assert_uint_gt(runs[0].ncreated - runs[0].live[DET_TICKS], 50);
    ck_assert_uint_ne(runs[0].hash[DET_TICKS], runs[0].hash[DET_TICKS - 1]);
    for (int r = 1; r < 4; r++) {
        ck_assert_msg(runs[r].schedule_hash == runs[0].schedule_hash, "schedule hash differs on %d workers",
                      workers[r]);
        for (uint32_t t = 1; t <= DET_TICKS; t++) {
            ck_assert_msg(runs[r].hash[t] == runs[0].hash[t],
                          "seed %llx: world hash after tick %u differs on %d workers (%016llx vs %016llx)",
                          (unsigned long long)seed, t, workers[r], (unsigned long long)runs[r].hash[t],
                          (unsigned long long)runs[0].hash[t]);
            ck_assert_uint_eq(runs[r].live[t], runs[0].live[t]);
            ck_assert_uint_eq(runs[r].created_at[t], runs[0].created_at[t]);
        }
        ck_assert_uint_eq(runs[r].ncreated, runs[0].ncreated);
        for (uint32_t i = 0; i < runs[0].ncreated; i++)
            ck_assert_msg(runs[r].created[i].e == runs[0].created[i].e && runs[r].created[i].v == runs[0].created[i].v,
                          "created entity #%u differs on %d workers: %016llx (origin %016llx) vs %016llx (origin %016llx)", i,
                          workers[r], (unsigned long long)runs[r].created[i].e, (unsigned long long)runs[r].created[i].v,
                          (unsigned long long)runs[0].created[i].e, (unsigned long long)runs[0].created[i].v);
        ck_assert_uint_eq(runs[r].commands_applied, runs[0].commands_applied);
        ck_assert_uint_eq(runs[r].systems_run, runs[0].systems_run);
    }
}
END_TEST

static Suite *dispatch_determinism(void)
{
    Suite *s = suite_create("dispatch_determinism");
    TCase *tc = tcase_create("determinism");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_determinism_random_schedule, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

/* ========================================================================== */
/* dispatch_sync                                                              */
/* ========================================================================== */

enum { S_ORIGIN = 1, S_P = 2, S_TAG = 3 };

static void sync_world(keel_runtime *rt)
{
    keel_world *w = keel_runtime_world(rt);
    reg_u64(w, "origin", S_ORIGIN);
    reg_u32(w, "p", S_P);
    reg_tag(w, "tag", S_TAG);
}

/* origin of a spawn: system, tick, sequence number */
static uint64_t sorigin(uint32_t sys, uint64_t tick, uint32_t k)
{
    return ((uint64_t)sys << 40) | ((tick & 0xfffff) << 20) | (k & 0xfffff);
}

#define SORIGIN_TICK(o) (((o) >> 20) & 0xfffff)

static _Atomic uint32_t g_spawn_on = 1;
static _Atomic uint32_t g_sync_bad;

typedef struct spawner {
    uint32_t sys; /* origin id */
    uint32_t n;   /* spawns per tick */
} spawner;

static int spawn_n(keel_ctx *ctx, void *user)
{
    const spawner *sp = user;
    if (!atomic_load(&g_spawn_on))
        return 0;
    for (uint32_t k = 0; k < sp->n; k++) {
        uint64_t o = sorigin(sp->sys, keel_ctx_tick(ctx), k);
        keel_init in[1] = {{S_ORIGIN, &o}};
        if (keel_cmd_spawn(keel_ctx_commands(ctx), in, 1))
            atomic_fetch_add(&g_sync_bad, 1);
    }
    return 0;
}

/* one spawn per chunk; its sequence number is the chunk's first p value */
static int spawn_per_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    const spawner *sp = user;
    const uint32_t *p = KEEL_COLUMN(it, const uint32_t, 0);
    for (uint32_t r = 1; r < it->count; r++)
        if (p[r] != p[0] + r) /* rows of one chunk are in spawn order */
            atomic_fetch_add(&g_sync_bad, 1);
    uint64_t o = sorigin(sp->sys, keel_ctx_tick(ctx), p[0]);
    keel_init in[1] = {{S_ORIGIN, &o}};
    if (keel_cmd_spawn(keel_ctx_commands(ctx), in, 1))
        atomic_fetch_add(&g_sync_bad, 1);
    return 0;
}

static int p_hook(keel_ctx *ctx, void *user)
{
    uint32_t n = (uint32_t)(uintptr_t)user;
    for (uint32_t i = 0; i < n; i++) {
        keel_init in[1] = {{S_P, &i}};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), in, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* The entities spawned in `tick`, in handle index order. */
static uint32_t spawned_in(keel_query *q, uint64_t tick, ent_val *out, uint32_t cap)
{
    static ent_val all[8192];
    uint32_t n = collect_u64(q, all, 8192), m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (SORIGIN_TICK(all[i].v) == tick) {
            ck_assert_uint_lt(m, cap);
            out[m++] = all[i];
        }
    qsort(out, m, sizeof *out, cmp_ent_val_by_index);
    return m;
}

/* Commands apply in schedule order (not registration order), FIFO within a
 * system, and in chunk order within a parallel system: with no destroys,
 * new entities take consecutive new slots in playback order. */
START_TEST(test_sync_schedule_order)
{
    enum { NP = 400 };
    static const spawner sb = {1, 1}, sa = {0, 3}, sc = {2, 1}, spar = {3, 0};
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        atomic_store(&g_spawn_on, 1);
        atomic_store(&g_sync_bad, 0);
        keel_runtime *rt = hooked_rt(workers, 16, p_hook, NP);
        sync_world(rt);
        keel_schedule *s = sched_new(rt);
        keel_system b = add_sys(s, &(keel_system_desc){.name = "B", .run = spawn_n, .user = (void *)&sb, .after = {"A"}});
        keel_system a = add_sys(s, &(keel_system_desc){.name = "A", .run = spawn_n, .user = (void *)&sa});
        keel_system c = add_sys(s, &(keel_system_desc){.name = "C", .run = spawn_n, .user = (void *)&sc});
        keel_system par = add_sys(s, &(keel_system_desc){.name = "par",
                                                         .kind = KEEL_SYSTEM_QUERY,
                                                         .each_chunk = spawn_per_chunk,
                                                         .query = {.with = {S_P}},
                                                         .parallel = true,
                                                         .min_chunk_rows = 16,
                                                         .user = (void *)&spar,
                                                         .access = {.reads = {S_P}},
                                                         .after = {"C"}});
        tu_install(rt, s);
        /* Kahn with the smallest registration index first: A, B, C, par */
        ck_assert_uint_eq(keel_schedule_order(s, 0), a);
        ck_assert_uint_eq(keel_schedule_order(s, 1), b);
        ck_assert_uint_eq(keel_schedule_order(s, 2), c);
        ck_assert_uint_eq(keel_schedule_order(s, 3), par);
        keel_query *q = tu_query_new(keel_runtime_world(rt), S_ORIGIN, 0);
        /* expected playback: A0 A1 A2 B0 C0 par(0) par(16) ... par(384) */
        uint64_t expect[5 + NP / 16];
        static ent_val got[64];
        for (uint64_t tick = 1; tick <= 5; tick++) {
            uint32_t ne = 0;
            for (uint32_t k = 0; k < 3; k++)
                expect[ne++] = sorigin(0, tick, k);
            expect[ne++] = sorigin(1, tick, 0);
            expect[ne++] = sorigin(2, tick, 0);
            for (uint32_t k = 0; k < NP; k += 16)
                expect[ne++] = sorigin(3, tick, k);
            ck_assert_ok(keel_runtime_step(rt));
            if (workers > 1)
                ck_assert_uint_gt(tu_sysrec(rt, tick, par).tasks, 1);
            uint32_t n = spawned_in(q, tick, got, 64);
            ck_assert_uint_eq(n, ne);
            for (uint32_t i = 0; i < n; i++) {
                ck_assert_msg(got[i].v == expect[i], "workers %d tick %llu: spawn #%u has origin %llx, expected %llx",
                              workers, (unsigned long long)tick, i, (unsigned long long)got[i].v,
                              (unsigned long long)expect[i]);
                if (i)
                    ck_assert_uint_eq(KEEL_ENTITY_INDEX(got[i].e), KEEL_ENTITY_INDEX(got[i - 1].e) + 1);
            }
        }
        ck_assert_uint_eq(atomic_load(&g_sync_bad), 0);
        keel_query_destroy(q);
        keel_runtime_close(rt);
    }
}
END_TEST

/* Destroy then spawn reuses the slot (new generation); spawn then destroy
 * cannot: the order of the systems decides. */
static _Atomic keel_entity g_victim;

static int destroy_victim(keel_ctx *ctx, void *user)
{
    (void)user;
    if (keel_cmd_destroy(keel_ctx_commands(ctx), atomic_load(&g_victim)))
        atomic_fetch_add(&g_sync_bad, 1);
    return 0;
}

START_TEST(test_sync_destroy_spawn_order)
{
    static const spawner sp = {7, 1};
    for (int wi = 0; wi < NWORKERS; wi++) {
        for (int destroy_first = 0; destroy_first <= 1; destroy_first++) {
            int workers = k_workers[wi];
            atomic_store(&g_spawn_on, 1);
            atomic_store(&g_sync_bad, 0);
            keel_runtime *rt = hooked_rt(workers, 16, p_hook, 3);
            sync_world(rt);
            keel_schedule *s = sched_new(rt);
            add_sys(s, &(keel_system_desc){.name = "kill", .run = destroy_victim, .after = {destroy_first ? NULL : "spawn"}});
            add_sys(s, &(keel_system_desc){.name = "spawn", .run = spawn_n, .user = (void *)&sp, .after = {destroy_first ? "kill" : NULL}});
            tu_install(rt, s);
            keel_world *w = keel_runtime_world(rt);
            keel_query *qp = tu_query_new(w, S_P, 0), *qo = tu_query_new(w, S_ORIGIN, 0);
            /* tick 1: the victim does not exist yet (null handle: ignored); the hook spawns 3 */
            atomic_store(&g_victim, KEEL_ENTITY_NULL);
            atomic_store(&g_spawn_on, 0);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(keel_world_count(w), 3);
            keel_iter it;
            keel_query_iter(qp, &it);
            ck_assert(keel_iter_next(&it));
            keel_entity victim = it.entities[0];
            for (uint32_t r = 1; r < it.count; r++)
                if (KEEL_ENTITY_INDEX(it.entities[r]) < KEEL_ENTITY_INDEX(victim))
                    victim = it.entities[r];
            atomic_store(&g_victim, victim);
            atomic_store(&g_spawn_on, 1);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert(!keel_alive(w, victim));
            ent_val got[4];
            ck_assert_uint_eq(spawned_in(qo, 2, got, 4), 1);
            if (destroy_first) {
                ck_assert_uint_eq(KEEL_ENTITY_INDEX(got[0].e), KEEL_ENTITY_INDEX(victim));
                ck_assert_uint_gt(KEEL_ENTITY_GEN(got[0].e), KEEL_ENTITY_GEN(victim));
            } else {
                ck_assert_uint_eq(KEEL_ENTITY_INDEX(got[0].e), 3); /* a new slot */
            }
            ck_assert_uint_eq(keel_world_count(w), 3);
            ck_assert_uint_eq(atomic_load(&g_sync_bad), 0);
            keel_query_destroy(qp);
            keel_query_destroy(qo);
            keel_runtime_close(rt);
        }
    }
}
END_TEST

/* Recorded commands are not visible to the systems of the same tick. */
static struct {
    _Atomic keel_entity target; /* gets TAG in tick 1 */
    _Atomic keel_entity victim; /* destroyed in tick 1 */
    _Atomic uint32_t count[8], world[8], has_tag[8], alive[8], seen_tick[8];
    keel_query *qp; /* iterated by the actor, counted by the observer */
} g_vis;

static int vis_actor(keel_ctx *ctx, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    uint32_t v = 100 + (uint32_t)t;
    keel_init in[1] = {{S_P, &v}};
    int rc = keel_cmd_spawn(cb, in, 1);
    if (t == 1) {
        keel_iter it;
        keel_query_iter(g_vis.qp, &it);
        while (keel_iter_next(&it)) {
            const uint32_t *p = KEEL_COLUMN(&it, const uint32_t, 0);
            for (uint32_t r = 0; r < it.count; r++) {
                if (p[r] == 0)
                    atomic_store(&g_vis.target, it.entities[r]);
                if (p[r] == 1)
                    atomic_store(&g_vis.victim, it.entities[r]);
            }
        }
        rc |= keel_cmd_add(cb, atomic_load(&g_vis.target), S_TAG, NULL);
        rc |= keel_cmd_destroy(cb, atomic_load(&g_vis.victim));
    }
    if (rc)
        atomic_fetch_add(&g_sync_bad, 1);
    return 0;
}

static int vis_observer(keel_ctx *ctx, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    if (t >= 8)
        return 0;
    keel_world *w = keel_ctx_world(ctx);
    atomic_store(&g_vis.count[t], keel_query_count(g_vis.qp));
    atomic_store(&g_vis.world[t], keel_world_count(w));
    atomic_store(&g_vis.has_tag[t], (uint32_t)keel_has(w, atomic_load(&g_vis.target), S_TAG));
    atomic_store(&g_vis.alive[t], keel_alive(w, atomic_load(&g_vis.victim)));
    atomic_fetch_add(&g_vis.seen_tick[t], 1);
    return 0;
}

START_TEST(test_sync_invisible_same_tick)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        atomic_store(&g_sync_bad, 0);
        memset(&g_vis, 0, sizeof g_vis);
        probe_reset((uint32_t)workers);
        keel_runtime *rt = hooked_rt(workers, 16, p_hook, 40);
        sync_world(rt);
        keel_world *w = keel_runtime_world(rt);
        g_vis.qp = tu_query_new(w, S_P, 0);
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "actor", .run = vis_actor, .access = {.reads = {S_P}}});
        add_sys(s, &(keel_system_desc){.name = "observer", .run = vis_observer, .after = {"actor"}});
        keel_system counter = add_sys(s, &(keel_system_desc){.name = "counter",
                                                             .kind = KEEL_SYSTEM_QUERY,
                                                             .each_chunk = probe_chunk,
                                                             .user = PROBE(0),
                                                             .query = {.with = {S_P}},
                                                             .parallel = true,
                                                             .min_chunk_rows = 16,
                                                             .after = {"actor"}});
        tu_install(rt, s);
        /* expected live entities with p seen by the systems of tick t:
         * 40 (hook), 40 (+1 spawn -1 destroy), 41, 42, 43 */
        static const uint32_t want[6] = {0, 40, 40, 41, 42, 43};
        for (uint64_t t = 1; t <= 5; t++) {
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&g_vis.seen_tick[t]), 1);
            ck_assert_uint_eq(atomic_load(&g_vis.count[t]), want[t]);
            ck_assert_uint_eq(atomic_load(&g_vis.world[t]), want[t]);
            ck_assert_uint_eq(tu_sysrec(rt, t, counter).rows, want[t]);
            /* the add and the destroy recorded in tick 1 show from tick 2 on */
            ck_assert_uint_eq(atomic_load(&g_vis.has_tag[t]), t == 1 ? 0 : 1);
            ck_assert_uint_eq(atomic_load(&g_vis.alive[t]), t == 1 ? 1 : 0);
            ck_assert_uint_eq(keel_world_count(w), want[t] + (t == 1 ? 0 : 1));
        }
        ck_assert_uint_ne(atomic_load(&g_vis.target), KEEL_ENTITY_NULL);
        ck_assert_uint_ne(atomic_load(&g_vis.victim), KEEL_ENTITY_NULL);
        ck_assert_int_eq(keel_has(w, atomic_load(&g_vis.target), S_TAG), 1);
        ck_assert(!keel_alive(w, atomic_load(&g_vis.victim)));
        ck_assert_uint_eq(atomic_load(&g_sync_bad), 0);
        ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
        keel_query_destroy(g_vis.qp);
        keel_runtime_close(rt);
    }
}
END_TEST

/* A failed playback at the sync point (no slot left) leaves the rest
 * pending: the step reports it, the next step is refused, retry applies only
 * what is pending, discard drops it. */
static _Atomic uint32_t g_sync_calls[2];

static int counted_spawn2(keel_ctx *ctx, void *user)
{
    const spawner *sp = user;
    atomic_fetch_add(&g_sync_calls[sp->sys], 1);
    return spawn_n(ctx, user);
}

typedef enum { PEND_DISCARD, PEND_FREE_ROOM } pend_way;

START_TEST(test_sync_failure_pending)
{
    static const spawner sa = {0, 2}, sb = {1, 2};
    for (int wi = 0; wi < NWORKERS; wi++) {
        for (int way = PEND_DISCARD; way <= PEND_FREE_ROOM; way++) {
            int workers = k_workers[wi];
            atomic_store(&g_spawn_on, 1);
            atomic_store(&g_sync_bad, 0);
            atomic_store(&g_sync_calls[0], 0);
            atomic_store(&g_sync_calls[1], 0);
            keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16, .max_entities = 10},
                                                             .workers = workers, .tick_rate_hz = -1});
            sync_world(rt);
            keel_schedule *s = sched_new(rt);
            add_sys(s, &(keel_system_desc){.name = "A", .run = counted_spawn2, .user = (void *)&sa});
            add_sys(s, &(keel_system_desc){.name = "B", .run = counted_spawn2, .user = (void *)&sb, .after = {"A"}});
            tu_install(rt, s);
            keel_world *w = keel_runtime_world(rt);
            keel_query *q = tu_query_new(w, S_ORIGIN, 0);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(keel_world_count(w), 8);

            /* tick 3: A's two spawns fill the world, B's first fails */
            ck_assert_rc(keel_runtime_step(rt), KEEL_ENOSPC);
            ck_assert_uint_eq(keel_world_count(w), 10);
            ck_assert_uint_eq(keel_world_pending(w), 1);
            ck_assert_uint_eq(atomic_load(&g_sync_calls[0]), 3);
            ck_assert_uint_eq(atomic_load(&g_sync_calls[1]), 3);
            ck_assert_uint_eq(keel_runtime_tick(rt), 3); /* the tick's systems ran */
            ck_assert_uint_eq(tickrec(rt, 3).systems_run, 2);
            ent_val got[16];
            ck_assert_uint_eq(spawned_in(q, 3, got, 16), 2);
            ck_assert_uint_eq(got[0].v, sorigin(0, 3, 0));
            ck_assert_uint_eq(got[1].v, sorigin(0, 3, 1));

            /* refused while pending; nothing runs */
            ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
            ck_assert_uint_eq(atomic_load(&g_sync_calls[0]), 3);
            ck_assert_uint_eq(keel_runtime_tick(rt), 3);
            /* retry with still no room: fails again, still pending */
            ck_assert_rc(keel_runtime_sync_retry(rt), KEEL_ENOSPC);
            ck_assert_uint_eq(keel_world_count(w), 10);
            ck_assert_uint_eq(keel_world_pending(w), 1);
            ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
            ck_assert_uint_eq(atomic_load(&g_sync_calls[1]), 3);
            /* no new schedule while commands are pending */
            keel_schedule *s2 = sched_new(rt);
            add_sys(s2, &(keel_system_desc){.name = "X", .run = counted_spawn2, .user = (void *)&sa});
            ck_assert_ok(keel_schedule_build(s2));
            ck_assert_rc(keel_runtime_set_schedule(rt, s2), KEEL_EBUSY);
            keel_schedule_destroy(s2);
            ck_assert_uint_eq(keel_world_pending(w), 1);

            if (way == PEND_DISCARD) {
                keel_runtime_sync_discard(rt);
                ck_assert_uint_eq(keel_world_pending(w), 0);
                ck_assert_ok(keel_runtime_sync_retry(rt)); /* nothing pending: a no-op */
                ck_assert_uint_eq(keel_world_count(w), 10);
                atomic_store(&g_spawn_on, 0);
                ck_assert_ok(keel_runtime_step(rt));
                ck_assert_uint_eq(keel_runtime_tick(rt), 4);
                ck_assert_uint_eq(atomic_load(&g_sync_calls[0]), 4);
                ck_assert_uint_eq(keel_world_count(w), 10);
                ck_assert_uint_eq(spawned_in(q, 3, got, 16), 2); /* B's tick-3 spawns never appear */
            } else {
                /* free two slots from outside the tick (lowest indices: A's
                 * first spawns of tick 1), then retry: B's two spawns take
                 * them, FIFO */
                ck_assert_uint_eq(spawned_in(q, 1, got, 16), 4);
                keel_entity freed[2] = {got[0].e, got[1].e};
                keel_cmdbuf *cb = NULL;
                ck_assert_ok(keel_cmdbuf_create(w, &cb));
                ck_assert_ok(keel_cmd_destroy(cb, freed[0]));
                ck_assert_ok(keel_cmd_destroy(cb, freed[1]));
                ck_assert_ok(keel_cmdbuf_apply(cb));
                keel_cmdbuf_destroy(cb);
                ck_assert_uint_eq(keel_world_count(w), 8);
                ck_assert_ok(keel_runtime_sync_retry(rt));
                ck_assert_uint_eq(keel_world_pending(w), 0);
                ck_assert_uint_eq(keel_world_count(w), 10);
                ck_assert_uint_eq(spawned_in(q, 3, got, 16), 4);
                ck_assert_uint_eq(got[0].v, sorigin(1, 3, 0)); /* slots 0, 1 reused in FIFO order */
                ck_assert_uint_eq(KEEL_ENTITY_INDEX(got[0].e), KEEL_ENTITY_INDEX(freed[0]));
                ck_assert_uint_gt(KEEL_ENTITY_GEN(got[0].e), KEEL_ENTITY_GEN(freed[0]));
                ck_assert_uint_eq(got[1].v, sorigin(1, 3, 1));
                ck_assert_uint_eq(KEEL_ENTITY_INDEX(got[1].e), KEEL_ENTITY_INDEX(freed[1]));
                atomic_store(&g_spawn_on, 0);
                ck_assert_ok(keel_runtime_step(rt));
                ck_assert_uint_eq(keel_runtime_tick(rt), 4);
                ck_assert_uint_eq(atomic_load(&g_sync_calls[1]), 4);
            }
            /* and again a full world: the next failure is reported the same way */
            atomic_store(&g_spawn_on, 1);
            ck_assert_rc(keel_runtime_step(rt), KEEL_ENOSPC);
            ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
            keel_runtime_sync_discard(rt);
            atomic_store(&g_spawn_on, 0);
            ck_assert_ok(keel_runtime_step(rt));
            ck_assert_uint_eq(atomic_load(&g_sync_bad), 0);
            keel_query_destroy(q);
            keel_runtime_close(rt);
        }
    }
}
END_TEST

/* A failure that goes away (injected out-of-memory on the 3rd command):
 * retry applies exactly the pending commands, in order. */
START_TEST(test_sync_retry_resumes_in_order)
{
    static const spawner sa = {0, 2}, sb = {1, 2};
    for (int wi = 0; wi < NWORKERS; wi++) {
        int workers = k_workers[wi];
        atomic_store(&g_spawn_on, 1);
        atomic_store(&g_sync_bad, 0);
        keel_runtime *rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = workers,
                                                         .tick_rate_hz = -1});
        sync_world(rt);
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "B", .run = spawn_n, .user = (void *)&sb, .after = {"A"}});
        add_sys(s, &(keel_system_desc){.name = "A", .run = spawn_n, .user = (void *)&sa});
        tu_install(rt, s);
        keel_world *w = keel_runtime_world(rt);
        keel_query *q = tu_query_new(w, S_ORIGIN, 0);
        ck_assert_ok(keel_runtime_step(rt));
        world_test_inject_failure(w, 3, KEEL_ENOMEM);
        ck_assert_rc(keel_runtime_step(rt), KEEL_ENOMEM);
        ck_assert_uint_eq(keel_world_count(w), 6);
        ck_assert_rc(keel_runtime_step(rt), KEEL_EBUSY);
        ck_assert_ok(keel_runtime_sync_retry(rt));
        ck_assert_uint_eq(keel_world_pending(w), 0);
        ck_assert_uint_eq(keel_world_count(w), 8);
        ent_val got[8];
        ck_assert_uint_eq(spawned_in(q, 2, got, 8), 4);
        ck_assert_uint_eq(got[0].v, sorigin(0, 2, 0));
        ck_assert_uint_eq(got[1].v, sorigin(0, 2, 1));
        ck_assert_uint_eq(got[2].v, sorigin(1, 2, 0));
        ck_assert_uint_eq(got[3].v, sorigin(1, 2, 1));
        ck_assert_ok(keel_runtime_step(rt));
        ck_assert_uint_eq(keel_world_count(w), 12);
        ck_assert_uint_eq(spawned_in(q, 3, got, 8), 4);
        ck_assert_uint_eq(got[0].v, sorigin(0, 3, 0));
        ck_assert_uint_eq(got[3].v, sorigin(1, 3, 1));
        ck_assert_uint_eq(atomic_load(&g_sync_bad), 0);
        keel_query_destroy(q);
        keel_runtime_close(rt);
    }
}
END_TEST

/* on_first_tick: once, before any system; its spawns are visible to the
 * first tick's systems; a failure returns its code, runs nothing, and the
 * hook runs again on the next step. */
static struct {
    _Atomic uint32_t calls;
    _Atomic uint32_t fail_times; /* fail the first n calls */
    _Atomic uint32_t how;        /* 1: return KEEL_EIO, 2: keel_txn_fail(KEEL_ECONFLICT) */
    _Atomic uint64_t stamp;      /* probe stamp of the last call */
    _Atomic uint32_t bad;
    _Atomic uint32_t seen[8];    /* entities with p seen by the system, per tick */
    _Atomic uint32_t ran[8];
    keel_query *qp;
} g_hook;

static int first_hook(keel_ctx *ctx, void *user)
{
    (void)user;
    uint32_t n = atomic_fetch_add(&g_hook.calls, 1) + 1;
    atomic_store(&g_hook.stamp, atomic_fetch_add(&g_probe.seq, 1) + 1);
    if (keel_ctx_tick(ctx) != 1 || keel_ctx_commands(ctx) == NULL || keel_ctx_world(ctx) == NULL ||
        strcmp(keel_ctx_system_name(ctx), "on_first_tick") != 0)
        atomic_fetch_add(&g_hook.bad, 1);
    for (uint32_t i = 0; i < 5; i++) {
        keel_init in[1] = {{S_P, &i}};
        if (keel_cmd_spawn(keel_ctx_commands(ctx), in, 1))
            atomic_fetch_add(&g_hook.bad, 1);
    }
    if (n <= atomic_load(&g_hook.fail_times)) {
        if (atomic_load(&g_hook.how) == 1)
            return KEEL_EIO;
        keel_txn_fail(ctx, KEEL_ECONFLICT);
    }
    return 0;
}

static int hook_observer(keel_ctx *ctx, void *user)
{
    uint64_t t = keel_ctx_tick(ctx);
    probe_cb(ctx, user);
    if (t < 8) {
        atomic_store(&g_hook.seen[t], keel_query_count(g_hook.qp));
        atomic_fetch_add(&g_hook.ran[t], 1);
    }
    return 0;
}

START_TEST(test_sync_first_tick_hook)
{
    for (int wi = 0; wi < NWORKERS; wi++) {
        for (uint32_t fails = 0; fails <= 2; fails++) {
            for (uint32_t how = 1; how <= (fails ? 2u : 1u); how++) {
                int workers = k_workers[wi];
                memset(&g_hook, 0, sizeof g_hook);
                atomic_store(&g_hook.fail_times, fails);
                atomic_store(&g_hook.how, how);
                probe_reset((uint32_t)workers);
                probe_tick_reset();
                keel_runtime *rt = hooked_rt(workers, 16, first_hook, 0);
                sync_world(rt);
                keel_world *w = keel_runtime_world(rt);
                g_hook.qp = tu_query_new(w, S_P, 0);
                keel_schedule *s = sched_new(rt);
                add_sys(s, &(keel_system_desc){.name = "obs0", .run = hook_observer, .user = PROBE(0)});
                add_sys(s, &(keel_system_desc){.name = "obs1", .run = probe_cb, .user = PROBE(1)});
                keel_system par = add_sys(s, &(keel_system_desc){.name = "par", .kind = KEEL_SYSTEM_QUERY, .each_chunk = probe_chunk, .user = PROBE(2), .query = {.with = {S_P}}, .parallel = true});
                tu_install(rt, s);
                for (uint32_t f = 1; f <= fails; f++) {
                    ck_assert_rc(keel_runtime_step(rt), how == 1 ? KEEL_EIO : KEEL_ECONFLICT);
                    ck_assert_uint_eq(atomic_load(&g_hook.calls), f);
                    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
                    ck_assert_uint_eq(keel_world_count(w), 0); /* the failed hook's spawns are dropped */
                    ck_assert_uint_eq(keel_world_pending(w), 0);
                    for (uint32_t p = 0; p < 3; p++)
                        ck_assert_uint_eq(atomic_load(&g_probe.total[p]), 0);
                }
                ck_assert_ok(keel_runtime_step(rt));
                ck_assert_uint_eq(atomic_load(&g_hook.calls), fails + 1);
                ck_assert_uint_eq(keel_runtime_tick(rt), 1);
                ck_assert_uint_eq(atomic_load(&g_hook.ran[1]), 1);
                ck_assert_uint_eq(atomic_load(&g_hook.seen[1]), 5); /* the hook's spawns, applied before tick 1 */
                ck_assert_uint_eq(tu_sysrec(rt, 1, par).rows, 5);
                uint64_t hs = atomic_load(&g_hook.stamp);
                for (uint32_t p = 0; p < 3; p++) {
                    ck_assert_uint_eq(atomic_load(&g_probe.total[p]), 1);
                    ck_assert_uint_lt(hs, atomic_load(&g_probe.first[p]));
                }
                for (uint64_t t = 2; t <= 4; t++) {
                    ck_assert_ok(keel_runtime_step(rt));
                    ck_assert_uint_eq(atomic_load(&g_hook.seen[t]), 5);
                }
                ck_assert_uint_eq(atomic_load(&g_hook.calls), fails + 1); /* exactly once after success */
                ck_assert_uint_eq(keel_world_count(w), 5);
                ck_assert_uint_eq(atomic_load(&g_hook.bad), 0);
                ck_assert_uint_eq(atomic_load(&g_probe.bad), 0);
                keel_query_destroy(g_hook.qp);
                keel_runtime_close(rt);
            }
        }
    }
}
END_TEST

static Suite *dispatch_sync(void)
{
    const TTest *const t[] = {test_sync_schedule_order, test_sync_destroy_spawn_order, test_sync_invisible_same_tick,
                              test_sync_failure_pending, test_sync_retry_resumes_in_order, test_sync_first_tick_hook};
    return tu_case_suite("dispatch_sync", "sync", t, sizeof t / sizeof t[0]);
}

KEEL_TEST_MAIN(dispatch_order, dispatch_failure, dispatch_parallel, dispatch_determinism, dispatch_sync)
