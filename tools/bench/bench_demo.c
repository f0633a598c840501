/*
 * tools/bench/bench_demo.c -- the synthetic demo-like workload and the
 * figures measured on it: wal (ticks/s with the WAL on vs off, bytes per
 * changed row, compression), fence (the fence's time per tick vs the whole
 * WAL-off tick) and checkpoint (tick times with and without checkpoints,
 * and with and without a checkpoint in progress).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define CKPT_EVERY 20              /* checkpoint_every_ticks of the checkpoint figure */
#define CKPT_TICKS 400u            /* timed ticks per measurement of the checkpoint figure */

/* ---- the workload ------------------------------------------------------------ */

/* The demo-like workload (docs/performance.md): n entities with
 * VERSIONED pos and vel; on tick t a parallel query system rewrites pos
 * and vel of the rows whose (entity index + t) % turn == 0 (pos += vel *
 * dt, vel turned by a small angle: both values change), and a callback
 * system destroys `churn` entities and spawns `churn` new ones. The first
 * tick's on_first_tick hook spawns the population, so the same code runs
 * with and without a data directory (with one, durable state changes only
 * inside ticks). */

/* Seeded from the entity number: positions on a 1000 x 1000 plane and
 * velocities in [-5, 5), as keel-world's agents (full float mantissas, so
 * zstd sees realistic values, not a few repeated patterns). */
static float demo_unit(uint64_t *state)
{
    return (float)(splitmix64(state) >> 40) / (float)(1u << 24);
}

static vec3 demo_pos(uint32_t i)
{
    uint64_t st = 0x706f73ull ^ ((uint64_t)i << 20);
    float x = demo_unit(&st) * 1000, y = demo_unit(&st) * 1000;
    return (vec3){ x, y, 0 };
}

static vec3 demo_vel(uint32_t i)
{
    uint64_t st = 0x76656cull ^ ((uint64_t)i << 20);
    float x = demo_unit(&st) * 10 - 5, y = demo_unit(&st) * 10 - 5;
    return (vec3){ x, y, 0 };
}

static int demo_populate(keel_ctx *ctx, void *user)
{
    demo *d = user;
    if (keel_world_count(keel_ctx_world(ctx)))
        return 0; /* recovered */
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    for (uint32_t i = 0; i < d->n; i++) {
        vec3 p = demo_pos(i), v = demo_vel(i);
        int rc = keel_cmd_spawn(cb, (keel_init[]){ { d->pos, &p }, { d->vel, &v } }, 2);
        if (rc)
            return rc;
    }
    return 0;
}

static int demo_move(keel_ctx *ctx, const keel_iter *it, void *user)
{
    demo *d = user;
    uint64_t tick = keel_ctx_tick(ctx), n = 0;
    float dt = keel_ctx_dt(ctx) * (float)d->turn, c = 0.99995f, s = 0.0099998f; /* 0.01 rad */
    vec3 *p = KEEL_COLUMN(it, vec3, 0), *v = KEEL_COLUMN(it, vec3, 1);
    for (uint32_t i = 0; i < it->count; i++) {
        if ((KEEL_ENTITY_INDEX(it->entities[i]) + tick) % d->turn)
            continue;
        p[i].x += v[i].x * dt;
        p[i].y += v[i].y * dt;
        p[i].z += v[i].z * dt;
        v[i] = (vec3){ v[i].x * c - v[i].y * s, v[i].x * s + v[i].y * c, v[i].z };
        n++;
    }
    atomic_fetch_add_explicit(&d->changed, 2 * n, memory_order_relaxed);
    return 0;
}

static int demo_churn(keel_ctx *ctx, void *user)
{
    demo *d = user;
    uint64_t tick = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    keel_iter it;
    keel_txn_iter(ctx, d->all, &it);
    if (keel_txn_next(ctx, &it) && it.count > d->churn) {
        uint32_t first = (uint32_t)((tick * 7919u) % (it.count - d->churn));
        for (uint32_t k = 0; k < d->churn; k++) {
            int rc = keel_cmd_destroy(cb, it.entities[first + k]);
            if (rc)
                return rc;
        }
    }
    for (uint32_t k = 0; k < d->churn; k++) {
        uint32_t i = (uint32_t)(tick * d->churn + k);
        vec3 p = demo_pos(i), v = demo_vel(i);
        int rc = keel_cmd_spawn(cb, (keel_init[]){ { d->pos, &p }, { d->vel, &v } }, 2);
        if (rc)
            return rc;
    }
    return 0;
}

void demo_open(demo *d, const demo_opts *o)
{
    memset(d, 0, sizeof *d);
    d->n = o->n;
    d->turn = o->turn;
    d->churn = o->churn;
    keel_runtime_desc desc = {
        .workers = -1, .tick_rate_hz = -1, .telemetry_capacity = o->telemetry,
        .on_first_tick = demo_populate, .hook_user = d,
        .durable = { .dir = o->dir, .zstd_level = o->zstd_level, .checkpoint_every_ticks = o->ckpt_ticks,
                     .checkpoint_every_bytes = -1, .checkpoint_every_seconds = -1 },
        .replication = o->repl,
    };
    check(keel_runtime_create(&desc, &d->rt), "keel_runtime_create");
    keel_world *w = keel_runtime_world(d->rt);
    d->pos = register_vec3(w, "pos");
    d->vel = register_vec3(w, "vel");
    if (!o->schedule)
        return;
    check(keel_query_create(w, &(keel_query_desc){ .with = { d->pos } }, &d->all), "keel_query_create");
    keel_schedule *s;
    check(keel_schedule_create(d->rt, &s), "keel_schedule_create");
    keel_system_desc move = {
        .name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = demo_move, .user = d, .parallel = true,
        .query = { .with = { d->pos, d->vel } }, .access = { .writes = { d->pos, d->vel } },
    };
    keel_system_desc churn = {
        .name = "churn", .kind = KEEL_SYSTEM_CALLBACK, .run = demo_churn, .user = d,
        .access = { .reads = { d->pos } }, .after = { "move" },
    };
    check(keel_schedule_add_system(s, &move, NULL), "keel_schedule_add_system");
    check(keel_schedule_add_system(s, &churn, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(d->rt, s), "keel_runtime_set_schedule");
}

void demo_close(demo *d)
{
    keel_query_destroy(d->all); /* before the world it belongs to; no tick runs in between */
    keel_runtime_close(d->rt);
    d->rt = NULL;
    d->all = NULL;
}

void step(keel_runtime *rt)
{
    check(keel_runtime_step(rt), "keel_runtime_step");
}

/* ---- wal ------------------------------------------------------------------ */

/* Warm rt up (WAL_WARM_TICKS untimed ticks after the populating first one),
 * then time WAL_TICKS ticks and the flush that makes them durable. */
void wal_time_ticks(keel_runtime *rt, wal_sample *r)
{
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(rt);
    check(keel_flush(rt), "keel_flush");
    uint64_t first = keel_runtime_tick(rt) + 1;
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(rt, &s0);
    double c0 = process_cpu_s();
    uint64_t t0 = now_ns();
    for (uint32_t t = 0; t < WAL_TICKS; t++)
        step(rt);
    check(keel_flush(rt), "keel_flush");   /* every timed tick is on disk */
    uint64_t t1 = now_ns();
    double c1 = process_cpu_s();
    keel_runtime_stats_get(rt, &s1);
    *r = (wal_sample){ .tps = WAL_TICKS / ((double)(t1 - t0) / 1e9), .fsyncs = (double)(s1.fsyncs - s0.fsyncs),
                       .cpu_ms = (c1 - c0) * 1e3 / WAL_TICKS };
    for (uint64_t t = first; t < first + WAL_TICKS; t++) {
        keel_tick_record rec;
        check(keel_telemetry_tick(rt, t, &rec), "keel_telemetry_tick");
        r->raw += (double)rec.wal_raw_bytes;
        r->stored += (double)rec.wal_stored_bytes;
        r->fence_ms += (double)rec.fence_ns / 1e6 / WAL_TICKS;
        if ((double)rec.durable_lag > r->max_lag)
            r->max_lag = (double)rec.durable_lag;
    }
}

/* One measurement of the demo workload, WAL off (level WAL_OFF) or on in
 * GROUP mode at a zstd level, in a fresh runtime and directory. */
static wal_sample wal_measure(int32_t level)
{
    char *dir = level == WAL_OFF ? NULL : make_tmpdir("wal");
    demo d;
    demo_open(&d, &(demo_opts){ .n = DEMO_ENTITIES, .turn = DEMO_TURN, .churn = DEMO_CHURN, .dir = dir,
                                .zstd_level = level == WAL_OFF ? 0 : level, .ckpt_ticks = -1,
                                .telemetry = pow2_at_least(WAL_TICKS + WAL_WARM_TICKS + 2), .schedule = true });
    wal_sample r;
    atomic_store(&d.changed, 0);
    wal_time_ticks(d.rt, &r);
    r.rows = (double)atomic_load(&d.changed);
    if (keel_world_count(keel_runtime_world(d.rt)) != DEMO_ENTITIES) {
        fprintf(stderr, "keel-bench: wal: %u entities alive, expected %u\n",
                keel_world_count(keel_runtime_world(d.rt)), DEMO_ENTITIES);
        exit(1);
    }
    demo_close(&d);
    if (dir)
        remove_tmpdir(dir);
    return r;
}

static const struct wal_config {
    const char *name, *bytes_name;
    int32_t level;                 /* WAL_OFF, or a zstd level (0 = the default, -1) */
} WAL_CONFIGS[] = {
    { "wal_off", NULL, WAL_OFF },
    { "wal_min", "wal_bytes", 0 }, /* the default level, -1 */
    { "wal_zstd1", "wal_zstd1_bytes", 1 },
    { "wal_zstd-5", "wal_zstd-5_bytes", -5 },
    { "wal_zstd3", "wal_zstd3_bytes", 3 },
};
#define NWAL (sizeof WAL_CONFIGS / sizeof WAL_CONFIGS[0])
#define NWAL_FENCE 2u              /* the fence benchmark alone: WAL off and the default level */

enum { WAL_TPS, WAL_STORED, WAL_RAW, WAL_FENCE, WAL_TICKS_PER_FSYNC, WAL_LAG, WAL_CPU, WAL_NMETRICS };

/* Medians over the rounds of each metric of the first n configurations;
 * the configurations alternate inside each round (WAL off first in even
 * rounds, last in odd ones). */
static void wal_rounds(const config *cfg, size_t n, double med[NWAL][WAL_NMETRICS])
{
    keep_heap_resident();
    uint32_t R = cfg->rounds;
    double *v[NWAL][WAL_NMETRICS];
    for (size_t c = 0; c < n; c++)
        for (int k = 0; k < WAL_NMETRICS; k++)
            v[c][k] = xmalloc(R * sizeof(double));
    for (size_t c = 0; c < n; c++) /* untimed warm-up of each side */
        (void)wal_measure(WAL_CONFIGS[c].level);
    for (uint32_t r = 0; r < R; r++)
        for (size_t k = 0; k < n; k++) {
            size_t c = r % 2 == 0 ? k : n - 1 - k;
            wal_sample s = wal_measure(WAL_CONFIGS[c].level);
            v[c][WAL_TPS][r] = s.tps;
            v[c][WAL_STORED][r] = s.rows > 0 ? s.stored / s.rows : 0;
            v[c][WAL_RAW][r] = s.rows > 0 ? s.raw / s.rows : 0;
            v[c][WAL_FENCE][r] = s.fence_ms;
            v[c][WAL_TICKS_PER_FSYNC][r] = s.fsyncs > 0 ? WAL_TICKS / s.fsyncs : 0;
            v[c][WAL_LAG][r] = s.max_lag;
            v[c][WAL_CPU][r] = s.cpu_ms;
        }
    for (size_t c = 0; c < n; c++)
        for (int k = 0; k < WAL_NMETRICS; k++) {
            med[c][k] = median(v[c][k], R);
            free(v[c][k]);
        }
}

/* The figures of configuration c against WAL off (configuration 0). */
static void wal_report_config(const config *cfg, double med[NWAL][WAL_NMETRICS], size_t c)
{
    /* The durability target belongs to the demo (bench_world.c's wal figure):
     * this workload does almost no work per tick, so its ratio is the
     * WAL's own cost per changed row, printed for the record
     * (docs/performance.md). */
    figure f = { .name = WAL_CONFIGS[c].name, .unit = "ticks/s", .value = med[c][WAL_TPS],
                 .baseline = med[0][WAL_TPS], .no_target = true };
    report(cfg, &f);
    figure b = { .name = WAL_CONFIGS[c].bytes_name, .unit = "B/row", .value = med[c][WAL_STORED],
                 .baseline = med[c][WAL_RAW], .no_target = true };
    report(cfg, &b);
    note(cfg, "%s: zstd level %d: compression %.2fx (raw/stored), fence %.3f ms/tick, CPU %.2f ms/tick "
              "(WAL off %.2f), %.1f ticks per fsync, durable lag up to %.0f ticks", WAL_CONFIGS[c].name,
         WAL_CONFIGS[c].level ? WAL_CONFIGS[c].level : -1,
         med[c][WAL_STORED] > 0 ? med[c][WAL_RAW] / med[c][WAL_STORED] : 0, med[c][WAL_FENCE], med[c][WAL_CPU],
         med[0][WAL_CPU], med[c][WAL_TICKS_PER_FSYNC], med[c][WAL_LAG]);
}

/* The default level's compression, CPU and fence figures. */
static void wal_report_default(const config *cfg, double med[NWAL][WAL_NMETRICS])
{
    figure z = { .name = "wal_compression", .unit = "x", .baseline = 1, .no_target = true,
                 .value = med[1][WAL_STORED] > 0 ? med[1][WAL_RAW] / med[1][WAL_STORED] : 0 };
    report(cfg, &z);
    figure cpu = { .name = "wal_min_cpu", .unit = "ms/tick", .value = med[1][WAL_CPU], .baseline = med[0][WAL_CPU],
                   .no_target = true };
    report(cfg, &cpu);
    figure fence = { .name = "fence_min", .unit = "ms/tick", .value = med[1][WAL_FENCE],
                     .baseline = med[0][WAL_TPS] > 0 ? 1e3 / med[0][WAL_TPS] : 0, .no_target = true };
    report(cfg, &fence);
    note(cfg, "wal_min: the synthetic workload: %u entities, VERSIONED pos+vel (12 B each), rows with (index + tick) %% %u == 0 rewritten "
              "(both components: %u%% of the durable rows), %u spawns + %u destroys per tick; %u workers, "
              "unthrottled keel_runtime_step, %u timed ticks per measurement after %u untimed, a fresh runtime "
              "(and a fresh directory under $TMPDIR or /tmp) per measurement, checkpoints off",
         DEMO_ENTITIES, DEMO_TURN, 100 / DEMO_TURN, DEMO_CHURN, DEMO_CHURN, (unsigned)sysconf(_SC_NPROCESSORS_ONLN),
         WAL_TICKS, WAL_WARM_TICKS);
    note(cfg, "wal_min: value = ticks/s with the WAL on (GROUP; the final keel_flush is timed), baseline = "
              "ticks/s with durable.dir NULL; *_bytes: WAL bytes per changed value row, stored (zstd, 48-byte "
              "record headers and lifecycle/commit records included) vs raw payload; wal_compression = raw / "
              "stored; wal_cpu: process CPU time per tick (all threads), default level vs WAL off; fence: the "
              "fence's wall time per tick (telemetry fence_ns: serialise, compress, hand-off), baseline = the "
              "whole WAL-off tick (1 / its ticks/s)");
}

void bench_wal(const config *cfg)
{
    bench_wal_world(cfg);
    double med[NWAL][WAL_NMETRICS];
    wal_rounds(cfg, NWAL, med);
    for (size_t c = 1; c < NWAL; c++)
        wal_report_config(cfg, med, c);
    wal_report_default(cfg, med);
}

/* The demo, and the synthetic workload at the default level against WAL off
 * only (bench_wal reports the same figures and more). */
void bench_fence(const config *cfg)
{
    bench_wal_world(cfg);
    double med[NWAL][WAL_NMETRICS];
    wal_rounds(cfg, NWAL_FENCE, med);
    wal_report_config(cfg, med, 1);
    wal_report_default(cfg, med);
}

/* ---- checkpoint ----------------------------------------------------------------- */

typedef struct ckpt_sample {
    double p50, p99, max, tps, cpu_ms;
    double busy_p50, busy_p99;     /* ticks with a checkpoint in progress (telemetry `checkpoint`) */
    double idle_p50, idle_p99;     /* ... and the others of the same run */
    uint32_t busy;                 /* ticks with a checkpoint in progress */
    uint64_t checkpoints;
} ckpt_sample;

/* Split the tick times ms[k] (tick first + k) by the telemetry's
 * checkpoint-in-progress flag and take p50 / p99 of each part. */
static void ckpt_split(keel_runtime *rt, uint64_t first, const double *ms, ckpt_sample *s)
{
    double *busy = xmalloc(CKPT_TICKS * sizeof *busy), *idle = xmalloc(CKPT_TICKS * sizeof *idle);
    uint32_t nb = 0, ni = 0;
    for (uint32_t k = 0; k < CKPT_TICKS; k++) {
        keel_tick_record rec;
        check(keel_telemetry_tick(rt, first + k, &rec), "keel_telemetry_tick");
        if (rec.checkpoint)
            busy[nb++] = ms[k];
        else
            idle[ni++] = ms[k];
    }
    s->busy = nb;
    s->busy_p50 = percentile(busy, nb, 0.50);
    s->busy_p99 = percentile(busy, nb, 0.99);
    s->idle_p50 = percentile(idle, ni, 0.50);
    s->idle_p99 = percentile(idle, ni, 0.99);
    free(busy);
    free(idle);
}

static ckpt_sample ckpt_measure(int64_t every)
{
    char *dir = make_tmpdir("ckpt");
    demo d;
    demo_open(&d, &(demo_opts){ .n = DEMO_ENTITIES, .turn = DEMO_TURN, .churn = DEMO_CHURN, .dir = dir,
                                .ckpt_ticks = every, .telemetry = 1024, .schedule = true });
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    check(keel_flush(d.rt), "keel_flush");
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(d.rt, &s0);
    double *ms = xmalloc(CKPT_TICKS * sizeof *ms);
    uint64_t first = keel_runtime_tick(d.rt) + 1;
    double c0 = process_cpu_s();
    uint64_t t0 = now_ns(), t = t0;
    for (uint32_t k = 0; k < CKPT_TICKS; k++) {
        step(d.rt);
        uint64_t t2 = now_ns();
        ms[k] = (double)(t2 - t) / 1e6;
        t = t2;
    }
    double c1 = process_cpu_s();
    keel_runtime_stats_get(d.rt, &s1);
    ckpt_sample s = { .tps = CKPT_TICKS / ((double)(t - t0) / 1e9), .checkpoints = s1.checkpoints - s0.checkpoints,
                      .cpu_ms = (c1 - c0) * 1e3 / CKPT_TICKS };
    ckpt_split(d.rt, first, ms, &s);
    s.max = percentile(ms, CKPT_TICKS, 1.0);
    s.p50 = percentile(ms, CKPT_TICKS, 0.50);
    s.p99 = percentile(ms, CKPT_TICKS, 0.99);
    free(ms);
    demo_close(&d);
    remove_tmpdir(dir);
    return s;
}

enum { CK_P50, CK_P99, CK_MAX, CK_TPS, CK_CPU, CK_BUSY50, CK_BUSY99, CK_IDLE50, CK_IDLE99, CK_N };

void bench_checkpoint(const config *cfg)
{
    keep_heap_resident();
    static const char *const names[CK_TPS + 2] = { "ckpt_tick_p50", "ckpt_tick_p99", "ckpt_tick_max", "ckpt_tps",
                                                   "ckpt_cpu" };
    static const char *const units[CK_TPS + 2] = { "ms", "ms", "ms", "ticks/s", "ms/tick" };
    uint32_t R = cfg->rounds;
    double *v[2][CK_N];
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < CK_N; k++)
            v[c][k] = xmalloc(R * sizeof(double));
    uint64_t checkpoints = 0, busy = 0;
    (void)ckpt_measure(-1);
    (void)ckpt_measure(CKPT_EVERY);
    for (uint32_t r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) {
            int c = r % 2 == 0 ? k : 1 - k;
            ckpt_sample s = ckpt_measure(c ? CKPT_EVERY : -1);
            const double m[CK_N] = { s.p50, s.p99, s.max, s.tps, s.cpu_ms, s.busy_p50, s.busy_p99, s.idle_p50,
                                     s.idle_p99 };
            for (int i = 0; i < CK_N; i++)
                v[c][i][r] = m[i];
            if (c) {
                checkpoints += s.checkpoints;
                busy += s.busy;
            }
        }
    double med[2][CK_N];
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < CK_N; k++) {
            med[c][k] = median(v[c][k], R);
            free(v[c][k]);
        }
    for (int k = 0; k <= CK_CPU; k++) {
        figure f = { .name = names[k], .unit = units[k], .value = med[1][k], .baseline = med[0][k], .no_target = true };
        report(cfg, &f);
    }
    /* jitter: inside the checkpointing run, ticks during a checkpoint against the others */
    figure j50 = { .name = "ckpt_jitter_p50", .unit = "ms", .value = med[1][CK_BUSY50], .baseline = med[1][CK_IDLE50],
                   .no_target = true };
    figure j99 = { .name = "ckpt_jitter_p99", .unit = "ms", .value = med[1][CK_BUSY99], .baseline = med[1][CK_IDLE99],
                   .no_target = true };
    report(cfg, &j50);
    report(cfg, &j99);
    note(cfg, "checkpoint: the wal_min figure's workload, WAL on (GROUP), %u timed ticks per measurement: tick time = "
              "keel_runtime_step wall time; ckpt_cpu = process CPU per tick; value = checkpoint_every_ticks %d "
              "(%.1f checkpoints per measurement), baseline = no checkpoints; the runtime promises no stall and sets "
              "no number", CKPT_TICKS, CKPT_EVERY, (double)checkpoints / R);
    note(cfg, "checkpoint jitter: in the checkpointing run, tick times of the ticks during which a checkpoint was "
              "in progress (captured, being written or waiting to be recorded: telemetry `checkpoint`; %.0f of %u "
              "ticks per measurement) vs the other ticks of the same run", (double)busy / R, CKPT_TICKS);
}

/* ---- jitter at 60 Hz ---------------------------------------------------------- */

#define JITTER_TICKS 300u          /* ticks per measurement: 5 s at 60 Hz */
#define JITTER_HZ 60

/* The p99 tick time of the demo-like workload paced at 60 Hz (each tick
 * starts on an absolute 1/60 s grid; its time is keel_runtime_step's wall
 * time): WAL off over every tick, or WAL on (GROUP) with a checkpoint every
 * CKPT_EVERY ticks over the ticks during which a checkpoint was in progress
 * (telemetry `checkpoint`). NAN when no tick qualifies. */
static double jitter_measure(bool wal)
{
    char *dir = wal ? make_tmpdir("jitter") : NULL;
    demo d;
    demo_open(&d, &(demo_opts){ .n = DEMO_ENTITIES, .turn = DEMO_TURN, .churn = DEMO_CHURN, .dir = dir,
                                .ckpt_ticks = wal ? CKPT_EVERY : -1, .telemetry = 1024, .schedule = true });
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    check(keel_flush(d.rt), "keel_flush");
    double *ms = xmalloc(JITTER_TICKS * sizeof *ms);
    uint64_t first = keel_runtime_tick(d.rt) + 1;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (uint32_t k = 0; k < JITTER_TICKS; k++) {
        next.tv_nsec += 1000000000L / JITTER_HZ;
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
            ;
        uint64_t t0 = now_ns();
        step(d.rt);
        ms[k] = (double)(now_ns() - t0) / 1e6;
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < JITTER_TICKS; k++) {
        keel_tick_record rec;
        check(keel_telemetry_tick(d.rt, first + k, &rec), "keel_telemetry_tick");
        if (!wal || rec.checkpoint)
            ms[n++] = ms[k];
    }
    double p99 = n ? percentile(ms, n, 0.99) : NAN;
    free(ms);
    demo_close(&d);
    if (dir)
        remove_tmpdir(dir);
    return p99;
}

void bench_jitter(const config *cfg)
{
    keep_heap_resident();
    uint32_t R = cfg->rounds;
    double *v[2] = { xmalloc(R * sizeof(double)), xmalloc(R * sizeof(double)) };
    for (uint32_t r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) {
            int c = r % 2 == 0 ? k : 1 - k; /* WAL off first in even rounds */
            v[c][r] = jitter_measure(c == 1);
        }
    figure f = { .name = "jitter_p99", .unit = "ms", .value = median(v[1], R), .baseline = median(v[0], R),
                 .target = 1.5, .target_on_ratio = true };
    report(cfg, &f);
    note(cfg, "jitter_p99: the wal_min figure's workload paced at %d Hz, %u ticks per measurement: p99 of "
              "keel_runtime_step's wall time over the ticks with a checkpoint in progress, WAL on (GROUP) and a "
              "checkpoint every %d ticks (value), against the p99 over every tick with the WAL off (baseline)",
         JITTER_HZ, JITTER_TICKS, CKPT_EVERY);
    free(v[0]);
    free(v[1]);
}
