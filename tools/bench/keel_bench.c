/*
 * keel-bench -- the SPEC §10 benchmarks, each measured side by side with a
 * plain-C baseline in the same process run.
 *
 *   keel-bench [all|NAME...] [--json] [--entities N] [--rounds R]
 *
 * Method. The machines are noisy, so a figure is never compared with a number
 * from another run: after one untimed warm-up of each side, every round
 * measures the baseline and the subject alternately (baseline first in even
 * rounds, subject first in odd rounds), and the figure reports the MEDIAN
 * over the rounds of each side (CLOCK_MONOTONIC). ratio = value / baseline.
 * Freed memory stays resident in the heap between rounds (see
 * keep_heap_resident). Targets are reported, not enforced: the exit status
 * is 0 whatever the figures, 2 for bad arguments and 1 only when the library
 * itself fails.
 *
 * Figures:
 *  memory   peak RSS of a forked child that spawns N entities with pos+vel
 *           (MEMORY_BATCH spawns per apply) and runs MEMORY_TICKS ticks
 *           rewriting both, minus the child's RSS before it built the world,
 *           vs the raw component bytes N * 24 (target: ratio <= 2.5).
 *  iterate  one pass of pos += vel * dt over N entities through a query
 *           {pos, vel}, vs the same loop over two malloc'd arrays; ms per
 *           pass, ITERATE_PASSES alternating passes per round
 *           (target: ratio <= 1.3).
 *  spawn    recording N deferred spawns with 2 initial values plus the one
 *           keel_cmdbuf_apply that plays them back, vs appending two structs
 *           to two arrays grown by doubling; ns per entity (target <= 100).
 *  destroy  recording N destroys (shuffled order) plus the apply, vs a plain
 *           sparse-set swap-remove in the same order; ns per entity
 *           (target <= 50). destroy_seq: the same in creation order.
 *  systems  a tick of SYSTEMS_PER_TICK empty callback systems through
 *           keel_runtime_step, per system, on 1 worker (target <= 100 ns)
 *           and on 2 workers (target <= 300 ns), vs the same number of
 *           calls through a function-pointer table.
 *  parallel a tick of one parallel query system pos += vel * dt over N
 *           entities on 2 workers vs the same tick on 1 worker; ms per tick
 *           (target: ratio <= 1/1.7, a speed-up of at least 1.7).
 *  side     two-row transfers as side transactions from a query system, vs
 *           the same transfers on a plain array under a mutex.
 *
 * Durability figures (SPEC §8, §10). Each measurement opens a fresh runtime
 * on a fresh data directory (mkdtemp under $TMPDIR, default /tmp; removed
 * afterwards); sides alternate as above, figures are medians over rounds.
 * The demo-like workload: DEMO_ENTITIES entities with VERSIONED pos and vel
 * (12 bytes each, random-looking floats as keel-world's agents); on tick t
 * a parallel query system rewrites pos and vel of the rows whose
 * (entity index + t) % DEMO_TURN == 0 (10% of the durable rows), a
 * callback system destroys and spawns DEMO_CHURN entities; the population
 * is spawned by on_first_tick; 2 workers (-1 = online CPUs), unthrottled.
 *  wal        ticks/s with the WAL on (GROUP, checkpoints off, the final
 *             keel_uow_flush timed) vs durable.dir NULL (target: ratio >=
 *             0.8), at the default zstd level and at levels -1, -5 and 3;
 *             *_bytes: WAL bytes per changed value row, stored vs raw
 *             (telemetry wal_stored_bytes / wal_raw_bytes); wal_cpu: process
 *             CPU ms per tick, WAL on vs off.
 *  immediate  IMM_THREADS threads submit IMMEDIATE two-account transfers
 *             (keel_submit, keel_ticket_wait; IMM_WINDOW in flight each)
 *             while the main thread steps unthrottled; transfers/s vs the
 *             rate of one synced LMDB commit per 96-byte record
 *             (kw_store_write loop; target: ratio >= 20); p50/p99 latency,
 *             submit to wait return. immediate_w1: one transfer in flight per
 *             thread; immediate_1khz: the TickDriver at 1 kHz instead of the
 *             unthrottled loop.
 *  recovery   1M entities (1% of rows changing per tick: the same 20k rows
 *             per tick as wal), checkpoint after populating, then
 *             RECOVERY_TICKS ticks of WAL (built once); keel_runtime_recover
 *             seconds vs the checkpoint alone; raw WAL MB per CPU second,
 *             of the whole recovery and of the replay alone (recovery minus
 *             checkpoint-only CPU time; target >= 200 MB/s) vs reading + CRC
 *             + decompressing the same records with libkeel_wal alone. The
 *             recovered state hash is checked against the built one.
 *  checkpoint tick time p50/p99/max (keel_runtime_step wall time), ticks/s
 *             and process CPU per tick of the wal workload, WAL on,
 *             checkpoint_every_ticks CKPT_EVERY vs no checkpoints (SPEC §8:
 *             no stall; no number).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdarg.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "keel/keel.h"
#include "keel_wal/wal.h"

#define ITERATE_PASSES 10          /* alternating passes per side per round */
#define MEMORY_BATCH 65536u        /* spawns per command buffer apply in the memory child */
#define MEMORY_TICKS 10            /* ticks rewriting pos and vel before reading the peak */
#define SHUFFLE_SEED 0x6b65656c62656e63ull /* "keelbenc" */
#define SYSTEMS_PER_TICK 64u
#define SYSTEMS_TICKS 2000u        /* ticks per measurement of the systems figure */
#define PARALLEL_TICKS 5           /* ticks per measurement of the parallel figure */

typedef struct vec3 {
    float x, y, z;
} vec3;

/* Read once per pass, so the compiler cannot fold or hoist the work away. */
static volatile float g_dt = 1.0f / 60.0f;
/* Results are folded into this, so no measured loop is dead code. */
static volatile double g_sink;

/* ---- utilities ---------------------------------------------------------- */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "keel-bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "keel-bench: %s failed: %s: %s\n", what, keel_strerror(rc), keel_last_error());
        exit(1);
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n-1] (sorts v). */
static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* order[i] = i (shuffled = false) or a Fisher-Yates permutation of 0..n-1
 * driven by splitmix64 from SHUFFLE_SEED (the same in every round and run). */
static uint32_t *make_order(uint32_t n, bool shuffled)
{
    uint32_t *order = xmalloc((size_t)n * sizeof *order);
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    uint64_t state = SHUFFLE_SEED;
    for (uint32_t i = n; shuffled && i > 1; i--) {
        uint32_t j = (uint32_t)(splitmix64(&state) % i);
        uint32_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    return order;
}

/* Initial component values of entity number i (cheap: not what is measured). */
static vec3 init_pos(uint32_t i)
{
    return (vec3){ (float)(i & 1023), (float)(i >> 10), 1.0f };
}

static vec3 init_vel(uint32_t i)
{
    return (vec3){ 1.0f, (float)(i & 7) * 0.25f, -0.5f };
}

/* The measured work of the iterate figure, shared by both sides. */
static void integrate(vec3 *p, const vec3 *v, uint32_t n, float dt)
{
    for (uint32_t i = 0; i < n; i++) {
        p[i].x += v[i].x * dt;
        p[i].y += v[i].y * dt;
        p[i].z += v[i].z * dt;
    }
}

/* The same work as a rewriting system does it: read the tick-start version,
 * write the new one (no copy first). Bit-identical results to integrate(). */
static void integrate_into(vec3 *out, const vec3 *p, const vec3 *v, uint32_t n, float dt)
{
    for (uint32_t i = 0; i < n; i++) {
        out[i].x = p[i].x + v[i].x * dt;
        out[i].y = p[i].y + v[i].y * dt;
        out[i].z = p[i].z + v[i].z * dt;
    }
}

/* s plus the coordinates of p[0..n-1], added in row order. */
static double sum_pos(double s, const vec3 *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        s += (double)p[i].x + (double)p[i].y + (double)p[i].z;
    return s;
}

/* ---- configuration and reporting ---------------------------------------- */

typedef struct config {
    uint32_t entities;
    uint32_t rounds;
    bool json;
} config;

typedef struct figure {
    const char *name;
    double value;          /* median of the subject */
    double baseline;       /* median of the baseline */
    const char *unit;      /* of value and baseline */
    double target;         /* a bound ... */
    bool target_on_ratio;  /* ... on the ratio (true) or on the value */
    bool at_least;         /* the bound is a lower bound (ticks/s, speed-ups), else an upper bound */
    bool no_target;        /* SPEC §10 sets none: the figure is printed for the record */
} figure;

static double figure_ratio(const figure *f)
{
    return f->baseline > 0 ? f->value / f->baseline : NAN;
}

static bool figure_meets(const figure *f)
{
    double x = f->target_on_ratio ? figure_ratio(f) : f->value;
    return isfinite(x) && (f->at_least ? x >= f->target : x <= f->target);
}

static void report_json(const figure *f)
{
    double ratio = figure_ratio(f);
    printf("{\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":%.6g,", f->name, f->value,
           f->unit, f->baseline);
    if (isfinite(ratio))
        printf("\"ratio\":%.4g,", ratio);
    else
        printf("\"ratio\":null,");
    if (f->no_target)
        printf("\"target\":null,\"target_of\":null,\"bound\":null,\"meets\":null}\n");
    else
        printf("\"target\":%g,\"target_of\":\"%s\",\"bound\":\"%s\",\"meets\":%s}\n", f->target,
               f->target_on_ratio ? "ratio" : "value", f->at_least ? "min" : "max", figure_meets(f) ? "true" : "false");
}

static void report_text(const figure *f)
{
    char target[48];
    const char *op = f->at_least ? ">=" : "<=";
    if (f->no_target)
        snprintf(target, sizeof target, "-");
    else if (f->target_on_ratio)
        snprintf(target, sizeof target, "ratio %s %.2fx", op, f->target);
    else
        snprintf(target, sizeof target, "%s %g %s", op, f->target, f->unit);
    printf("%-16s %10.4g %-10s %10.4g %-10s %7.2fx   %-18s %s\n", f->name, f->value, f->unit,
           f->baseline, f->unit, figure_ratio(f), target, f->no_target ? "" : figure_meets(f) ? "ok" : "MISS");
}

static void report(const config *cfg, const figure *f)
{
    if (cfg->json)
        report_json(f);
    else
        report_text(f);
    fflush(stdout);
}

/* A comment line in text mode only (JSON mode prints figures and nothing else). */
static void note(const config *cfg, const char *fmt, ...)
{
    if (cfg->json)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* ---- side-by-side runner ------------------------------------------------ */

/* Keep memory a round freed resident for the next round (glibc: no mmap for
 * large blocks, no trimming of the heap top). On the Firecracker VMs these
 * benchmarks run on, the first touch of a fresh page costs ~15 us, so without
 * this every round would re-fault its storage and the spawn and destroy
 * figures would measure the VM's page faults rather than keel; a long-running
 * server reuses a warm heap the same way. Both sides get the same heap. */
static void keep_heap_resident(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
#endif
}

/* One measurement of one side: untimed setup, the timed part, untimed
 * teardown; returns the figure's quantity (ms per pass, ns per entity). */
typedef double (*measure_fn)(void *ctx);

/* After one untimed warm-up of each side, each round alternates `reps`
 * measurements of each side (baseline first in even rounds) and keeps each
 * side's mean; the figure gets the medians of those means over the rounds. */
static void run_pair(const config *cfg, uint32_t reps, measure_fn baseline, measure_fn subject, void *ctx,
                     figure *f)
{
    keep_heap_resident();
    baseline(ctx);
    subject(ctx);
    double *b = xmalloc(cfg->rounds * sizeof *b);
    double *s = xmalloc(cfg->rounds * sizeof *s);
    for (uint32_t r = 0; r < cfg->rounds; r++) {
        b[r] = s[r] = 0;
        for (uint32_t k = 0; k < reps; k++) {
            if (r % 2 == 0) {
                b[r] += baseline(ctx);
                s[r] += subject(ctx);
            } else {
                s[r] += subject(ctx);
                b[r] += baseline(ctx);
            }
        }
        b[r] /= reps;
        s[r] /= reps;
    }
    f->baseline = median(b, cfg->rounds);
    f->value = median(s, cfg->rounds);
    free(b);
    free(s);
}

/* ---- keel worlds -------------------------------------------------------- */

typedef struct bench_world {
    keel_world *w;
    keel_component pos, vel;
} bench_world;

static keel_component register_vec3(keel_world *w, const char *name)
{
    static const keel_field fields[3] = {
        { .name = "x", .type = KEEL_F32, .offset = 0 },
        { .name = "y", .type = KEEL_F32, .offset = 4 },
        { .name = "z", .type = KEEL_F32, .offset = 8 },
    };
    keel_component_desc desc = {
        .name = name, .size = sizeof(vec3), .fields = fields, .field_count = 3,
    };
    keel_component c;
    check(keel_component_register(w, &desc, &c), "keel_component_register");
    return c;
}

static void bw_open(bench_world *bw)
{
    check(keel_world_create(NULL, &bw->w), "keel_world_create");
    bw->pos = register_vec3(bw->w, "pos");
    bw->vel = register_vec3(bw->w, "vel");
}

static void bw_close(bench_world *bw)
{
    keel_world_destroy(bw->w);
    bw->w = NULL;
}

static keel_cmdbuf *cmdbuf_new(const bench_world *bw)
{
    keel_cmdbuf *cb;
    check(keel_cmdbuf_create(bw->w, &cb), "keel_cmdbuf_create");
    return cb;
}

/* Record spawns of entities first .. first+n-1 with pos and vel. */
static void record_spawns(keel_cmdbuf *cb, const bench_world *bw, uint32_t first, uint32_t n)
{
    for (uint32_t i = first; i < first + n; i++) {
        vec3 p = init_pos(i), v = init_vel(i);
        keel_init inits[2] = { { bw->pos, &p }, { bw->vel, &v } };
        check(keel_cmd_spawn(cb, inits, 2), "keel_cmd_spawn");
    }
}

/* Check the receipts and counters of cb's playback since its last reset. */
static void expect_result(const keel_cmdbuf *cb, uint32_t spawned, uint32_t destroyed)
{
    keel_cmd_result res = keel_cmdbuf_result(cb);
    if (res.created_count != spawned || res.destroyed != destroyed || res.pending != 0) {
        fprintf(stderr, "keel-bench: playback created %u (expected %u), destroyed %u (expected %u), "
                "%u pending\n", res.created_count, spawned, res.destroyed, destroyed, res.pending);
        exit(1);
    }
}

/* Spawn n entities with pos+vel, `batch` spawns per apply; their handles go
 * to handles[0..n-1] when handles is not NULL. */
static void populate(bench_world *bw, uint32_t n, uint32_t batch, keel_entity *handles)
{
    keel_cmdbuf *cb = cmdbuf_new(bw);
    for (uint32_t first = 0; first < n; first += batch) {
        uint32_t k = n - first < batch ? n - first : batch;
        record_spawns(cb, bw, first, k);
        check(keel_cmdbuf_apply(cb), "keel_cmdbuf_apply");
        expect_result(cb, k, 0);
        if (handles)
            memcpy(handles + first, keel_cmdbuf_result(cb).created, (size_t)k * sizeof *handles);
        check(keel_cmdbuf_reset(cb), "keel_cmdbuf_reset");
    }
    keel_cmdbuf_destroy(cb);
}

static keel_query *query_pos_vel(const bench_world *bw)
{
    keel_query_desc desc = { .with = { bw->pos, bw->vel } };
    keel_query *q;
    check(keel_query_create(bw->w, &desc, &q), "keel_query_create");
    return q;
}

static double query_sum_pos(const keel_query *q)
{
    double s = 0;
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        s = sum_pos(s, KEEL_COLUMN(&it, const vec3, 0), it.count);
    return s;
}

/* ---- iterate ------------------------------------------------------------ */

typedef struct iterate_ctx {
    uint32_t n;
    vec3 *pos, *vel;       /* baseline arrays */
    keel_runtime *rt;      /* subject: one committed VERSIONED query system per tick */
    keel_query *q;
} iterate_ctx;

static keel_runtime *integrate_runtime(int32_t workers, uint32_t n, bool both, bench_world *out);

static double iterate_plain(void *ctx)
{
    iterate_ctx *c = ctx;
    uint64_t t0 = now_ns();
    integrate(c->pos, c->vel, c->n, g_dt);
    return (double)(now_ns() - t0) / 1e6;
}

static double iterate_keel(void *ctx)
{
    iterate_ctx *c = ctx;
    uint64_t t0 = now_ns();
    check(keel_runtime_step(c->rt), "keel_runtime_step");
    return (double)(now_ns() - t0) / 1e6;
}

static void bench_iterate(const config *cfg)
{
    uint32_t n = cfg->entities;
    iterate_ctx c = { .n = n };
    c.pos = xmalloc((size_t)n * sizeof *c.pos);
    c.vel = xmalloc((size_t)n * sizeof *c.vel);
    for (uint32_t i = 0; i < n; i++) {
        c.pos[i] = init_pos(i);
        c.vel[i] = init_vel(i);
    }
    bench_world bw;
    c.rt = integrate_runtime(1, n, false, &bw);
    c.q = query_pos_vel(&bw);
    if (keel_query_count(c.q) != n) {
        fprintf(stderr, "keel-bench: query matches %u entities, expected %u\n", keel_query_count(c.q), n);
        exit(1);
    }

    figure f = { .name = "iterate", .unit = "ms/pass", .target = 1.5, .target_on_ratio = true };
    run_pair(cfg, ITERATE_PASSES, iterate_plain, iterate_keel, &c, &f);
    report(cfg, &f);
    note(cfg, "iterate: keel side = one keel_runtime_step: a VERSIONED query system `rewrites(pos)`, "
              "committed, view published; 1 worker");

    /* Both sides did the same passes over the same values: same sums. */
    double plain = sum_pos(0, c.pos, n), keel = query_sum_pos(c.q);
    g_sink = plain + keel;
    note(cfg, "iterate checksum: keel %.9g, plain %.9g", keel, plain);
    if (plain != keel)
        fprintf(stderr, "keel-bench: iterate checksums differ (keel %.9g, plain %.9g)\n", keel, plain);

    keel_query_destroy(c.q);
    keel_runtime_close(c.rt);
    free(c.pos);
    free(c.vel);
}

/* ---- spawn -------------------------------------------------------------- */

/* Baseline: two arrays grown by doubling; an entity is its index. */
typedef struct plain_arrays {
    vec3 *pos, *vel;
    uint32_t count, cap;
} plain_arrays;

static void plain_grow(plain_arrays *a)
{
    uint32_t cap = a->cap == 0 ? 16 : a->cap > UINT32_MAX / 2 ? UINT32_MAX : a->cap * 2;
    vec3 *pos = realloc(a->pos, (size_t)cap * sizeof *pos);
    vec3 *vel = pos ? realloc(a->vel, (size_t)cap * sizeof *vel) : NULL;
    if (!pos || !vel) {
        fprintf(stderr, "keel-bench: out of memory growing plain arrays to %u\n", cap);
        exit(1);
    }
    a->pos = pos;
    a->vel = vel;
    a->cap = cap;
}

static uint32_t plain_spawn(plain_arrays *a, vec3 p, vec3 v)
{
    if (a->count == a->cap)
        plain_grow(a);
    a->pos[a->count] = p;
    a->vel[a->count] = v;
    return a->count++;
}

static double spawn_plain(void *ctx)
{
    uint32_t n = *(const uint32_t *)ctx;
    plain_arrays a = { 0 };
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < n; i++)
        plain_spawn(&a, init_pos(i), init_vel(i));
    uint64_t t1 = now_ns();
    g_sink = a.pos[n - 1].x + a.vel[n / 2].y;
    free(a.pos);
    free(a.vel);
    return (double)(t1 - t0) / n;
}

static double spawn_keel(void *ctx)
{
    uint32_t n = *(const uint32_t *)ctx;
    bench_world bw;
    bw_open(&bw);
    keel_cmdbuf *cb = cmdbuf_new(&bw);
    uint64_t t0 = now_ns();
    record_spawns(cb, &bw, 0, n);
    check(keel_cmdbuf_apply(cb), "keel_cmdbuf_apply");
    uint64_t t1 = now_ns();
    expect_result(cb, n, 0);
    keel_cmdbuf_destroy(cb);
    bw_close(&bw);
    return (double)(t1 - t0) / n;
}

static void bench_spawn(const config *cfg)
{
    uint32_t n = cfg->entities;
    figure f = { .name = "spawn", .unit = "ns/entity", .target = 100 };
    run_pair(cfg, 1, spawn_plain, spawn_keel, &n, &f);
    report(cfg, &f);
}

/* ---- destroy ------------------------------------------------------------ */

/* Baseline: a sparse set (handle -> row, row -> handle) over two dense
 * arrays; destroy swap-removes the row, as an archetype table does. */
typedef struct sparse_store {
    vec3 *pos, *vel;
    uint32_t *row_of, *handle_of;
    uint32_t count;
} sparse_store;

#define SPARSE_DEAD UINT32_MAX

static void sparse_fill(sparse_store *s, uint32_t n)
{
    s->pos = xmalloc((size_t)n * sizeof *s->pos);
    s->vel = xmalloc((size_t)n * sizeof *s->vel);
    s->row_of = xmalloc((size_t)n * sizeof *s->row_of);
    s->handle_of = xmalloc((size_t)n * sizeof *s->handle_of);
    for (uint32_t i = 0; i < n; i++) {
        s->pos[i] = init_pos(i);
        s->vel[i] = init_vel(i);
        s->row_of[i] = s->handle_of[i] = i;
    }
    s->count = n;
}

static void sparse_free(sparse_store *s)
{
    free(s->pos);
    free(s->vel);
    free(s->row_of);
    free(s->handle_of);
}

static void sparse_destroy(sparse_store *s, uint32_t handle)
{
    uint32_t row = s->row_of[handle];
    if (row == SPARSE_DEAD)
        return;
    uint32_t last = --s->count, moved = s->handle_of[last];
    s->pos[row] = s->pos[last];
    s->vel[row] = s->vel[last];
    s->handle_of[row] = moved;
    s->row_of[moved] = row;
    s->row_of[handle] = SPARSE_DEAD;
}

typedef struct destroy_ctx {
    uint32_t n;
    const uint32_t *order;   /* destroy entity order[0], order[1], ... */
} destroy_ctx;

static double destroy_plain(void *ctx)
{
    const destroy_ctx *c = ctx;
    sparse_store s;
    sparse_fill(&s, c->n);
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < c->n; i++)
        sparse_destroy(&s, c->order[i]);
    uint64_t t1 = now_ns();
    g_sink = s.count;
    sparse_free(&s);
    return (double)(t1 - t0) / c->n;
}

static double destroy_keel(void *ctx)
{
    const destroy_ctx *c = ctx;
    keel_entity *handles = xmalloc((size_t)c->n * sizeof *handles);
    keel_entity *victims = xmalloc((size_t)c->n * sizeof *victims);
    bench_world bw;
    bw_open(&bw);
    populate(&bw, c->n, c->n, handles);   /* as the spawn figure: one buffer */
    for (uint32_t i = 0; i < c->n; i++)   /* read in order when timed, as the baseline's */
        victims[i] = handles[c->order[i]];
    keel_cmdbuf *cb = cmdbuf_new(&bw);
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < c->n; i++)
        check(keel_cmd_destroy(cb, victims[i]), "keel_cmd_destroy");
    check(keel_cmdbuf_apply(cb), "keel_cmdbuf_apply");
    uint64_t t1 = now_ns();
    expect_result(cb, 0, c->n);
    if (keel_world_count(bw.w) != 0) {
        fprintf(stderr, "keel-bench: %u entities alive after destroying all\n", keel_world_count(bw.w));
        exit(1);
    }
    keel_cmdbuf_destroy(cb);
    bw_close(&bw);
    free(handles);
    free(victims);
    return (double)(t1 - t0) / c->n;
}

static void destroy_figure(const config *cfg, const char *name, bool shuffled)
{
    uint32_t *order = make_order(cfg->entities, shuffled);
    destroy_ctx c = { .n = cfg->entities, .order = order };
    figure f = { .name = name, .unit = "ns/entity", .target = 50 };
    run_pair(cfg, 1, destroy_plain, destroy_keel, &c, &f);
    report(cfg, &f);
    free(order);
}

static void bench_destroy(const config *cfg)
{
    destroy_figure(cfg, "destroy", true);        /* splitmix64-shuffled order */
    destroy_figure(cfg, "destroy_seq", false);   /* creation order */
}

/* ---- memory ------------------------------------------------------------- */

/* A "Vm...:" line of /proc/self/status in kB, 0 when unavailable. */
static uint64_t proc_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    size_t len = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0 && sscanf(line + len, "%llu", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static uint64_t peak_rss_kb(void)
{
    uint64_t kb = proc_status_kb("VmHWM:");
    if (kb == 0) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0)
            kb = (uint64_t)ru.ru_maxrss;   /* kB on Linux */
    }
    return kb;
}

/* Reset the peak RSS to the current RSS (Linux >= 4.0), so that a peak the
 * child inherited from the parent through fork does not count. */
static void reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

typedef struct mem_report {
    uint64_t base_kb;      /* RSS before the world was built */
    uint64_t peak_kb;      /* peak RSS after the build and MEMORY_TICKS ticks */
} mem_report;

/* Runs in the child: build the world, rewrite both components a few times,
 * report the RSS figures through fd. Never returns. */
static void memory_child(uint32_t n, int fd)
{
    mem_report r;
    reset_peak_rss();
    r.base_kb = proc_status_kb("VmRSS:");
    bench_world bw;
    keel_runtime *rt = integrate_runtime(1, n, true, &bw);
    for (int t = 0; t < MEMORY_TICKS; t++)
        check(keel_runtime_step(rt), "keel_runtime_step");
    r.peak_kb = peak_rss_kb();
    ssize_t w = write(fd, &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
}

static bool memory_measure(uint32_t n, mem_report *r)
{
    int fds[2];
    fflush(NULL);   /* the child must not flush a copy of our buffers */
    if (pipe(fds) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        close(fds[0]);
        memory_child(n, fds[1]);
    }
    close(fds[1]);
    ssize_t got;
    do
        got = read(fds[0], r, sizeof *r);
    while (got < 0 && errno == EINTR);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return got == (ssize_t)sizeof *r && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void bench_memory(const config *cfg)
{
    mem_report r;
    if (!memory_measure(cfg->entities, &r)) {
        fprintf(stderr, "keel-bench: memory: the measuring child failed\n");
        exit(1);
    }
    uint64_t grown_kb = r.peak_kb > r.base_kb ? r.peak_kb - r.base_kb : 0;
    figure f = {
        .name = "memory", .unit = "MB", .target = 2.5, .target_on_ratio = true,
        .value = (double)grown_kb * 1024 / 1e6,
        .baseline = (double)cfg->entities * 2 * sizeof(vec3) / 1e6,
    };
    report(cfg, &f);
    note(cfg, "memory: child peak RSS %.1f MB minus its RSS before building %.1f MB",
         (double)r.peak_kb * 1024 / 1e6, (double)r.base_kb * 1024 / 1e6);
}

/* ---- systems -------------------------------------------------------------- */

static int empty_system(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 0;
}

typedef int (*plain_fn)(keel_ctx *, void *);
static plain_fn volatile plain_table[SYSTEMS_PER_TICK];

/* A runtime of `workers` workers with SYSTEMS_PER_TICK independent empty systems. */
static keel_runtime *systems_runtime(int32_t workers)
{
    keel_runtime *rt;
    check(keel_runtime_create(&(keel_runtime_desc){.workers = workers, .tick_rate_hz = -1}, &rt),
          "keel_runtime_create");
    keel_schedule *s;
    check(keel_schedule_create(rt, &s), "keel_schedule_create");
    for (uint32_t i = 0; i < SYSTEMS_PER_TICK; i++) {
        char name[32];
        snprintf(name, sizeof name, "empty%u", i);
        keel_system_desc d = {.name = name, .kind = KEEL_SYSTEM_CALLBACK, .run = empty_system};
        check(keel_schedule_add_system(s, &d, NULL), "keel_schedule_add_system");
    }
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(rt, s), "keel_runtime_set_schedule");
    return rt;
}

static double systems_plain(void *ctx)
{
    (void)ctx;
    uint64_t t0 = now_ns();
    for (uint32_t t = 0; t < SYSTEMS_TICKS; t++)
        for (uint32_t i = 0; i < SYSTEMS_PER_TICK; i++)
            plain_table[i](NULL, NULL);
    return (double)(now_ns() - t0) / ((double)SYSTEMS_TICKS * SYSTEMS_PER_TICK);
}

static double systems_keel(void *ctx)
{
    keel_runtime *rt = ctx;
    uint64_t t0 = now_ns();
    for (uint32_t t = 0; t < SYSTEMS_TICKS; t++)
        check(keel_runtime_step(rt), "keel_runtime_step");
    return (double)(now_ns() - t0) / ((double)SYSTEMS_TICKS * SYSTEMS_PER_TICK);
}

static void bench_systems(const config *cfg)
{
    for (uint32_t i = 0; i < SYSTEMS_PER_TICK; i++)
        plain_table[i] = empty_system;
    static const struct { const char *name; int32_t workers; double target; } runs[] = {
        {"systems_1w", 1, 100},
        {"systems_2w", 2, 300},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        keel_runtime *rt = systems_runtime(runs[r].workers);
        figure f = {.name = runs[r].name, .unit = "ns/system", .target = runs[r].target};
        run_pair(cfg, 1, systems_plain, systems_keel, rt, &f);
        report(cfg, &f);
        keel_runtime_close(rt);
    }
    note(cfg, "systems: %u independent empty callback systems per tick; baseline: the same number of calls "
              "through a function-pointer table", SYSTEMS_PER_TICK);
}

/* ---- parallel ------------------------------------------------------------- */

/* pos(new) = pos(tick start) + vel * dt, through `rewrites(pos)`. */
static int integrate_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    integrate_into(KEEL_COLUMN(it, vec3, 0), it->prev[0], KEEL_COLUMN(it, const vec3, 1), it->count, g_dt);
    return 0;
}

/* The memory figure's system: rewrites both components every tick. */
static int integrate_both_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    vec3 *p = KEEL_COLUMN(it, vec3, 0), *v = KEEL_COLUMN(it, vec3, 1);
    const vec3 *p0 = it->prev[0], *v0 = it->prev[1];
    integrate_into(p, p0, v0, it->count, g_dt);
    for (uint32_t i = 0; i < it->count; i++)
        v[i] = (vec3){ v0[i].x * 0.999f, v0[i].y * 0.999f, v0[i].z * 0.999f };
    return 0;
}

/* A runtime of `workers` workers whose world holds n entities with pos+vel
 * and whose one parallel query system integrates them: rewrites pos (reads
 * vel), or rewrites both. *out names the world and components. */
static keel_runtime *integrate_runtime(int32_t workers, uint32_t n, bool both, bench_world *out)
{
    keel_runtime *rt;
    check(keel_runtime_create(&(keel_runtime_desc){.workers = workers, .tick_rate_hz = -1}, &rt),
          "keel_runtime_create");
    bench_world bw = {.w = keel_runtime_world(rt)};
    bw.pos = register_vec3(bw.w, "pos");
    bw.vel = register_vec3(bw.w, "vel");
    populate(&bw, n, MEMORY_BATCH, NULL);
    keel_schedule *s;
    check(keel_schedule_create(rt, &s), "keel_schedule_create");
    keel_system_desc d = {
        .name = "integrate", .kind = KEEL_SYSTEM_QUERY, .each_chunk = both ? integrate_both_chunk : integrate_chunk,
        .parallel = true, .query = {.with = {bw.pos, bw.vel}},
        .access = both ? (keel_access){.rewrites = {bw.pos, bw.vel}} : (keel_access){.rewrites = {bw.pos}, .reads = {bw.vel}},
    };
    check(keel_schedule_add_system(s, &d, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(rt, s), "keel_runtime_set_schedule");
    if (out)
        *out = bw;
    return rt;
}

static keel_runtime *parallel_runtime(int32_t workers, uint32_t n)
{
    return integrate_runtime(workers, n, false, NULL);
}

typedef struct parallel_ctx {
    keel_runtime *one, *two;
} parallel_ctx;

static double parallel_tick(keel_runtime *rt)
{
    uint64_t t0 = now_ns();
    for (int t = 0; t < PARALLEL_TICKS; t++)
        check(keel_runtime_step(rt), "keel_runtime_step");
    return (double)(now_ns() - t0) / 1e6 / PARALLEL_TICKS;
}

static double parallel_one(void *ctx)
{
    return parallel_tick(((parallel_ctx *)ctx)->one);
}

static double parallel_two(void *ctx)
{
    return parallel_tick(((parallel_ctx *)ctx)->two);
}

static void bench_parallel(const config *cfg)
{
    parallel_ctx c = {parallel_runtime(1, cfg->entities), parallel_runtime(2, cfg->entities)};
    figure f = {.name = "parallel_2w", .unit = "ms/tick", .target = 1 / 1.7, .target_on_ratio = true};
    run_pair(cfg, 1, parallel_one, parallel_two, &c, &f);
    report(cfg, &f);
    note(cfg, "parallel: speed-up of 2 workers over 1: %.2fx (target >= 1.70x)", f.baseline / f.value);
    if (keel_world_hash(keel_runtime_world(c.one)) != keel_world_hash(keel_runtime_world(c.two)))
        fprintf(stderr, "keel-bench: parallel: 1 and 2 workers ended in different states\n");
    keel_runtime_close(c.one);
    keel_runtime_close(c.two);
}

/* ---- side transactions ----------------------------------------------------- */

#define SIDE_ACCOUNTS 64u
#define SIDE_TRADERS 16384u        /* transfers per tick (one per trader row) */

typedef struct side_bench {
    keel_runtime *rt;
    keel_component coins, trader;
    keel_entity acct[SIDE_ACCOUNTS];
    uint32_t naccounts;            /* accounts the transfers pick from */
    _Atomic uint64_t done, conflicts;
} side_bench;

/* One transfer per trader row, between two accounts picked from its handle. */
static int transfer_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    side_bench *b = user;
    uint64_t done = 0, conflicts = 0;
    for (uint32_t i = 0; i < it->count; i++) {
        uint64_t r = it->entities[i] * 0x9e3779b97f4a7c15ull;
        keel_entity from = b->acct[(r >> 20) % b->naccounts], to = b->acct[(r >> 40) % b->naccounts];
        if (from == to)
            continue;
        keel_side_txn *tx = NULL;
        int64_t x, y;
        check(keel_side_txn_begin(ctx, KEEL_DURABLE_DEFERRED, &tx), "keel_side_txn_begin");
        check(keel_side_get(tx, from, b->coins, &x), "keel_side_get");
        check(keel_side_get(tx, to, b->coins, &y), "keel_side_get");
        x -= 1;
        y += 1;
        check(keel_side_set(tx, from, b->coins, &x), "keel_side_set");
        check(keel_side_set(tx, to, b->coins, &y), "keel_side_set");
        int rc = keel_side_txn_commit(tx);
        done += rc == 0;
        conflicts += rc == KEEL_ECONFLICT;
    }
    atomic_fetch_add(&b->done, done);
    atomic_fetch_add(&b->conflicts, conflicts);
    return 0;
}

static void side_open(side_bench *b, int32_t workers, uint32_t accounts)
{
    memset(b, 0, sizeof *b);
    b->naccounts = accounts;
    check(keel_runtime_create(&(keel_runtime_desc){.workers = workers, .tick_rate_hz = -1}, &b->rt),
          "keel_runtime_create");
    keel_world *w = keel_runtime_world(b->rt);
    static const keel_field f[] = {{.name = "coins", .type = KEEL_I64}};
    check(keel_component_register(w, &(keel_component_desc){.name = "coins", .size = 8, .fields = f, .field_count = 1},
                                  &b->coins), "register");
    check(keel_component_register(w, &(keel_component_desc){.name = "trader"}, &b->trader), "register");
    keel_cmdbuf *cb;
    check(keel_cmdbuf_create(w, &cb), "keel_cmdbuf_create");
    int64_t start = 1000000;
    for (uint32_t i = 0; i < SIDE_ACCOUNTS; i++)
        check(keel_cmd_spawn(cb, (keel_init[]){{b->coins, &start}}, 1), "keel_cmd_spawn");
    for (uint32_t i = 0; i < SIDE_TRADERS; i++)
        check(keel_cmd_spawn(cb, (keel_init[]){{b->trader, NULL}}, 1), "keel_cmd_spawn");
    check(keel_cmdbuf_apply(cb), "keel_cmdbuf_apply");
    memcpy(b->acct, keel_cmdbuf_result(cb).created, sizeof b->acct);
    keel_cmdbuf_destroy(cb);
    keel_schedule *s;
    check(keel_schedule_create(b->rt, &s), "keel_schedule_create");
    keel_system_desc d = {.name = "transfers", .kind = KEEL_SYSTEM_QUERY, .each_chunk = transfer_chunk, .user = b,
                          .parallel = workers > 1, .min_chunk_rows = 256, .query = {.with = {b->trader}},
                          .access = {.side_writes = {b->coins}}};
    check(keel_schedule_add_system(s, &d, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(b->rt, s), "keel_runtime_set_schedule");
}

static pthread_mutex_t plain_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t plain_accounts[SIDE_ACCOUNTS];

/* Baseline: the same transfers on a plain array under one mutex. */
static double side_plain(void *ctx)
{
    side_bench *b = ctx;
    uint64_t t0 = now_ns(), n = 0;
    for (uint32_t i = 0; i < SIDE_TRADERS; i++) {
        uint64_t r = (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        uint32_t from = (uint32_t)((r >> 20) % b->naccounts), to = (uint32_t)((r >> 40) % b->naccounts);
        if (from == to)
            continue;
        pthread_mutex_lock(&plain_lock);
        plain_accounts[from] -= 1;
        plain_accounts[to] += 1;
        pthread_mutex_unlock(&plain_lock);
        n++;
    }
    return (double)(now_ns() - t0) / (double)n;
}

static double side_keel(void *ctx)
{
    side_bench *b = ctx;
    atomic_store(&b->done, 0);
    uint64_t t0 = now_ns();
    check(keel_runtime_step(b->rt), "keel_runtime_step");
    uint64_t ns = now_ns() - t0;
    return (double)ns / (double)(atomic_load(&b->done) ? atomic_load(&b->done) : 1);
}

static void bench_side(const config *cfg)
{
    static const struct { const char *name; int32_t workers; uint32_t accounts; } runs[] = {
        {"side_1w", 1, SIDE_ACCOUNTS},
        {"side_2w_contended", 2, 8},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        side_bench *b = xmalloc(sizeof *b);
        side_open(b, runs[r].workers, runs[r].accounts);
        figure f = {.name = runs[r].name, .unit = "ns/commit", .target = 1000};
        run_pair(cfg, 1, side_plain, side_keel, b, &f);
        report(cfg, &f);
        keel_runtime_stats st;
        keel_runtime_stats_get(b->rt, &st);
        note(cfg, "%s: %u accounts, %u transfers per tick; %llu commits, %llu conflicts in all", runs[r].name,
             runs[r].accounts, SIDE_TRADERS, (unsigned long long)st.commits, (unsigned long long)st.conflicts);
        keel_runtime_close(b->rt);
        free(b);
    }
    note(cfg, "side: two-row transfers as side transactions (read both, write both, commit; no WAL yet); "
              "baseline: the same transfers on a plain array under one mutex; target: keel's own budget, SPEC "
              "§10 sets none before durability");
}

/* ---- durability: shared pieces -------------------------------------------- */

#define DEMO_ENTITIES 100000u      /* the demo-like workload of SPEC §10 */
#define DEMO_TURN 10u              /* a row changes when (index + tick) % turn == 0 */
#define DEMO_CHURN 5u              /* spawns and destroys per tick (each) */
#define WAL_WARM_TICKS 20u         /* untimed ticks after the populating first tick */
#define WAL_TICKS 400u             /* timed ticks per measurement of the wal figures */
#define IMM_THREADS 8u
#define IMM_ACCOUNTS 1024u
#define IMM_WINDOW 64u             /* transfers in flight per submitting thread (headline figure) */
#define IMM_SECONDS 1.0            /* submitting time per measurement */
#define IMM_RECORD 96u             /* payload bytes of the baseline's one record per commit */
#define IMM_BASE_SECONDS 0.5       /* baseline commit loop per measurement */
#define RECOVERY_ENTITIES 1000000u
#define RECOVERY_TURN 100u         /* 1M entities, 1%: the same 20k changed rows per tick as the wal figure */
#define RECOVERY_TICKS 1000u
#define RECOVERY_OFF_TICKS 100u    /* ticks timed with the WAL off, for the record */
#define CKPT_EVERY 20              /* checkpoint_every_ticks of the checkpoint figure */
#define CKPT_TICKS 400u            /* timed ticks per measurement of the checkpoint figure */

static double process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Nearest-rank percentile p in [0, 1] of v[0..n-1] (sorts v). */
static double percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double rank = p * (double)n;   /* ceil without libm: the tools are not linked with -lm */
    size_t k = (size_t)rank;
    k += (double)k < rank;
    return v[k ? (k > n ? n : k) - 1 : 0];
}

/* A fresh directory under $TMPDIR (default /tmp) for a data directory. */
static char *make_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/keel-bench-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(path)) {
        fprintf(stderr, "keel-bench: mkdtemp %s: %s\n", path, strerror(errno));
        exit(1);
    }
    char *dir = xmalloc(strlen(path) + 1);
    strcpy(dir, path);
    return dir;
}

/* Remove a data directory (LMDB keeps flat files in it) and free the name. */
static void remove_tmpdir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[1024];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0)
                fprintf(stderr, "keel-bench: cannot remove %s: %s\n", path, strerror(errno));
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        fprintf(stderr, "keel-bench: cannot remove %s: %s\n", dir, strerror(errno));
    free(dir);
}

/* Copy the flat files of data directory `from` into `to` (the copy of a
 * closed directory is a valid directory). */
static void copy_tmpdir(const char *from, const char *to)
{
    DIR *d = opendir(from);
    if (!d) {
        fprintf(stderr, "keel-bench: opendir %s: %s\n", from, strerror(errno));
        exit(1);
    }
    struct dirent *e;
    static char buf[1 << 20];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
        if (!in || !out) {
            fprintf(stderr, "keel-bench: cannot copy %s to %s: %s\n", a, b, strerror(errno));
            exit(1);
        }
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, n, out) != n) {
                fprintf(stderr, "keel-bench: cannot write %s: %s\n", b, strerror(errno));
                exit(1);
            }
        fclose(in);
        if (fclose(out) != 0) {
            fprintf(stderr, "keel-bench: cannot write %s: %s\n", b, strerror(errno));
            exit(1);
        }
    }
    closedir(d);
}

/* The demo-like workload (SPEC §10): n entities with VERSIONED pos and vel;
 * on tick t a parallel query system rewrites pos and vel of the rows whose
 * (entity index + t) % turn == 0 (pos += vel * dt, vel turned by a small
 * angle: both values change), and a callback system destroys `churn`
 * entities and spawns `churn` new ones. The first tick's on_first_tick
 * hook spawns the population, so the same code runs with and without a
 * data directory (with one, durable state changes only inside ticks). */
typedef struct demo {
    keel_runtime *rt;
    keel_component pos, vel;
    keel_query *all;
    uint32_t n, turn, churn;
    _Atomic uint64_t changed;  /* value rows the systems changed (pos and vel count one each) */
} demo;

typedef struct demo_opts {
    uint32_t n, turn, churn;
    const char *dir;           /* NULL: WAL off */
    int32_t zstd_level;
    int64_t ckpt_ticks;        /* checkpoint_every_ticks; byte and time triggers are off */
    uint32_t telemetry;        /* ring capacity, a power of two */
    bool schedule;             /* false: components only (a runtime to recover into) */
} demo_opts;

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

static void demo_open(demo *d, const demo_opts *o)
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

static void demo_close(demo *d)
{
    keel_query_destroy(d->all); /* before the world it belongs to; no tick runs in between */
    keel_runtime_close(d->rt);
    d->rt = NULL;
    d->all = NULL;
}

static void step(keel_runtime *rt)
{
    check(keel_runtime_step(rt), "keel_runtime_step");
}

static uint32_t pow2_at_least(uint32_t n)
{
    uint32_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* ---- wal ------------------------------------------------------------------ */

#define WAL_OFF INT32_MIN

typedef struct wal_sample {
    double tps;                /* timed ticks / seconds (the last flush included) */
    double raw, stored;        /* fence bytes of the timed ticks (telemetry) */
    double rows;               /* value rows changed in the timed ticks */
    double fence_ms;           /* mean fence duration per tick */
    double fsyncs;             /* synced LMDB commits during the timed ticks */
    double max_lag;            /* largest durable lag seen at a tick end, in ticks */
    double cpu_ms;             /* process CPU time per timed tick (all threads) */
} wal_sample;

/* One measurement of the demo workload, WAL off (level WAL_OFF) or on in
 * GROUP mode at a zstd level, in a fresh runtime and directory. */
static wal_sample wal_measure(int32_t level)
{
    char *dir = level == WAL_OFF ? NULL : make_tmpdir("wal");
    demo d;
    demo_open(&d, &(demo_opts){ .n = DEMO_ENTITIES, .turn = DEMO_TURN, .churn = DEMO_CHURN, .dir = dir,
                                .zstd_level = level == WAL_OFF ? 0 : level, .ckpt_ticks = -1,
                                .telemetry = pow2_at_least(WAL_TICKS + WAL_WARM_TICKS + 2), .schedule = true });
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    check(keel_uow_flush(d.rt), "keel_uow_flush");
    uint64_t first = keel_runtime_tick(d.rt) + 1;
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(d.rt, &s0);
    atomic_store(&d.changed, 0);
    double c0 = process_cpu_s();
    uint64_t t0 = now_ns();
    for (uint32_t t = 0; t < WAL_TICKS; t++)
        step(d.rt);
    check(keel_uow_flush(d.rt), "keel_uow_flush");   /* every timed tick is on disk */
    uint64_t t1 = now_ns();
    double c1 = process_cpu_s();
    keel_runtime_stats_get(d.rt, &s1);
    wal_sample r = { .tps = WAL_TICKS / ((double)(t1 - t0) / 1e9), .rows = (double)atomic_load(&d.changed),
                     .fsyncs = (double)(s1.fsyncs - s0.fsyncs), .cpu_ms = (c1 - c0) * 1e3 / WAL_TICKS };
    for (uint64_t t = first; t < first + WAL_TICKS; t++) {
        keel_tick_record rec;
        check(keel_telemetry_tick(d.rt, t, &rec), "keel_telemetry_tick");
        r.raw += (double)rec.wal_raw_bytes;
        r.stored += (double)rec.wal_stored_bytes;
        r.fence_ms += (double)rec.fence_ns / 1e6 / WAL_TICKS;
        if ((double)rec.durable_lag > r.max_lag)
            r.max_lag = (double)rec.durable_lag;
    }
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
    int32_t level;
} WAL_CONFIGS[] = {
    { "wal_off", NULL, WAL_OFF },
    { "wal", "wal_bytes", 0 },                 /* the default level (1) */
    { "wal_zstd-1", "wal_zstd-1_bytes", -1 },
    { "wal_zstd-5", "wal_zstd-5_bytes", -5 },
    { "wal_zstd3", "wal_zstd3_bytes", 3 },
};
#define NWAL (sizeof WAL_CONFIGS / sizeof WAL_CONFIGS[0])

enum { WAL_TPS, WAL_STORED, WAL_RAW, WAL_FENCE, WAL_TICKS_PER_FSYNC, WAL_LAG, WAL_CPU, WAL_NMETRICS };

static void bench_wal(const config *cfg)
{
    keep_heap_resident();
    uint32_t R = cfg->rounds;
    double *v[NWAL][WAL_NMETRICS];
    for (size_t c = 0; c < NWAL; c++)
        for (int k = 0; k < WAL_NMETRICS; k++)
            v[c][k] = xmalloc(R * sizeof(double));
    for (size_t c = 0; c < NWAL; c++) /* untimed warm-up of each side */
        (void)wal_measure(WAL_CONFIGS[c].level);
    for (uint32_t r = 0; r < R; r++)
        for (size_t k = 0; k < NWAL; k++) {
            size_t c = r % 2 == 0 ? k : NWAL - 1 - k; /* WAL off first in even rounds, last in odd ones */
            wal_sample s = wal_measure(WAL_CONFIGS[c].level);
            v[c][WAL_TPS][r] = s.tps;
            v[c][WAL_STORED][r] = s.rows > 0 ? s.stored / s.rows : 0;
            v[c][WAL_RAW][r] = s.rows > 0 ? s.raw / s.rows : 0;
            v[c][WAL_FENCE][r] = s.fence_ms;
            v[c][WAL_TICKS_PER_FSYNC][r] = s.fsyncs > 0 ? WAL_TICKS / s.fsyncs : 0;
            v[c][WAL_LAG][r] = s.max_lag;
            v[c][WAL_CPU][r] = s.cpu_ms;
        }
    double med[NWAL][WAL_NMETRICS];
    for (size_t c = 0; c < NWAL; c++)
        for (int k = 0; k < WAL_NMETRICS; k++) {
            med[c][k] = median(v[c][k], R);
            free(v[c][k]);
        }
    for (size_t c = 1; c < NWAL; c++) {
        figure f = { .name = WAL_CONFIGS[c].name, .unit = "ticks/s", .value = med[c][WAL_TPS],
                     .baseline = med[0][WAL_TPS], .target = 0.8, .target_on_ratio = true, .at_least = true };
        report(cfg, &f);
        figure b = { .name = WAL_CONFIGS[c].bytes_name, .unit = "B/row", .value = med[c][WAL_STORED],
                     .baseline = med[c][WAL_RAW], .no_target = true };
        report(cfg, &b);
        note(cfg, "%s: zstd level %d: compression %.2fx (raw/stored), fence %.3f ms/tick, CPU %.2f ms/tick "
                  "(WAL off %.2f), %.1f ticks per fsync, durable lag up to %.0f ticks", WAL_CONFIGS[c].name,
             WAL_CONFIGS[c].level ? WAL_CONFIGS[c].level : 1,
             med[c][WAL_STORED] > 0 ? med[c][WAL_RAW] / med[c][WAL_STORED] : 0, med[c][WAL_FENCE], med[c][WAL_CPU],
             med[0][WAL_CPU], med[c][WAL_TICKS_PER_FSYNC], med[c][WAL_LAG]);
    }
    figure cpu = { .name = "wal_cpu", .unit = "ms/tick", .value = med[1][WAL_CPU], .baseline = med[0][WAL_CPU],
                   .no_target = true };
    report(cfg, &cpu);
    note(cfg, "wal: %u entities, VERSIONED pos+vel (12 B each), rows with (index + tick) %% %u == 0 rewritten "
              "(both components: %u%% of the durable rows), %u spawns + %u destroys per tick; %u workers, "
              "unthrottled keel_runtime_step, %u timed ticks per measurement after %u untimed, a fresh runtime "
              "(and a fresh directory under $TMPDIR or /tmp) per measurement, checkpoints off",
         DEMO_ENTITIES, DEMO_TURN, 100 / DEMO_TURN, DEMO_CHURN, DEMO_CHURN, (unsigned)sysconf(_SC_NPROCESSORS_ONLN),
         WAL_TICKS, WAL_WARM_TICKS);
    note(cfg, "wal: value = ticks/s with the WAL on (GROUP; the final keel_uow_flush is timed), baseline = "
              "ticks/s with durable.dir NULL; *_bytes: WAL bytes per changed value row, stored (zstd, 48-byte "
              "record headers and lifecycle/commit records included) vs raw payload; wal_cpu: process CPU time "
              "per tick (all threads), default level vs WAL off");
}

/* ---- immediate -------------------------------------------------------------- */

typedef struct imm_run imm_run;

typedef struct imm_transfer {
    imm_run *run;
    keel_entity from, to;
} imm_transfer;

typedef struct imm_thread {
    imm_run *run;
    uint32_t id;
    double *lat;               /* ms, one per completed transfer */
    size_t nlat, cap;
    uint64_t failed;
    pthread_t th;
} imm_thread;

struct imm_run {
    keel_runtime *rt;
    keel_component coins;
    keel_entity acct[IMM_ACCOUNTS];
    uint32_t window;
    _Atomic bool stop;
    _Atomic uint32_t running;
    imm_thread th[IMM_THREADS];
};

static int imm_accounts(keel_ctx *ctx, void *user)
{
    imm_run *r = user;
    int64_t coins = 1000000;
    for (uint32_t i = 0; i < IMM_ACCOUNTS; i++) {
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){ { r->coins, &coins } }, 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int imm_idle(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 0;
}

static int imm_transfer_fn(keel_side_txn *tx, void *arg)
{
    const imm_transfer *t = arg;
    int64_t a, b;
    int rc = keel_side_get(tx, t->from, t->run->coins, &a);
    if (!rc)
        rc = keel_side_get(tx, t->to, t->run->coins, &b);
    if (rc)
        return rc;
    a -= 1;
    b += 1;
    rc = keel_side_set(tx, t->from, t->run->coins, &a);
    return rc ? rc : keel_side_set(tx, t->to, t->run->coins, &b);
}

static void imm_record(imm_thread *t, double ms)
{
    if (t->nlat == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
        if (!t->lat) {
            fprintf(stderr, "keel-bench: out of memory\n");
            exit(1);
        }
    }
    t->lat[t->nlat++] = ms;
}

/* A submitting thread: keeps `window` transfers in flight (submit until
 * the window is full, then wait for the oldest ticket), until told to stop;
 * then drains. Latency = submit to the return of keel_ticket_wait. */
static void *imm_thread_main(void *arg)
{
    imm_thread *t = arg;
    imm_run *r = t->run;
    uint32_t W = r->window;
    imm_transfer *tr = xmalloc(W * sizeof *tr);
    keel_ticket **tk = xmalloc(W * sizeof *tk);
    uint64_t *sub = xmalloc(W * sizeof *sub);
    uint64_t rng = 0x696d6d6564696174ull ^ ((uint64_t)t->id << 32);
    uint32_t head = 0, inflight = 0;
    for (;;) {
        while (!atomic_load_explicit(&r->stop, memory_order_relaxed) && inflight < W) {
            uint32_t slot = (head + inflight) % W;
            uint64_t x = splitmix64(&rng);
            uint32_t i = (uint32_t)(x % IMM_ACCOUNTS), j = (uint32_t)((x >> 32) % (IMM_ACCOUNTS - 1));
            j += j >= i;
            tr[slot] = (imm_transfer){ r, r->acct[i], r->acct[j] };
            sub[slot] = now_ns();
            check(keel_submit(r->rt, imm_transfer_fn, &tr[slot], KEEL_DURABLE_IMMEDIATE, &tk[slot]), "keel_submit");
            inflight++;
        }
        if (!inflight)
            break;
        int rc = keel_ticket_wait(tk[head], -1);
        uint64_t done = now_ns();
        keel_ticket_release(tk[head]);
        if (rc == 0)
            imm_record(t, (double)(done - sub[head]) / 1e6);
        else
            t->failed++;
        head = (head + 1) % W;
        inflight--;
    }
    free(tr);
    free(tk);
    free(sub);
    atomic_fetch_sub(&r->running, 1);
    return NULL;
}

typedef struct imm_sample {
    double tps, p50, p99, fsyncs_per_s;
    double ticks_per_s, wal_mb_per_s;  /* of the stepping loop, the WAL writer */
    uint64_t failed;
} imm_sample;

/* IMM_THREADS threads submit IMMEDIATE transfers (window in flight each)
 * for IMM_SECONDS while this thread steps the runtime unthrottled. */
static imm_sample imm_measure(uint32_t window, double rate_hz)
{
    char *dir = make_tmpdir("imm");
    imm_run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "keel-bench: out of memory\n");
        exit(1);
    }
    r->window = window;
    keel_runtime_desc desc = {
        .workers = 1, .tick_rate_hz = rate_hz, .on_first_tick = imm_accounts, .hook_user = r,
        .durable = { .dir = dir, .checkpoint_every_ticks = -1 },
    };
    check(keel_runtime_create(&desc, &r->rt), "keel_runtime_create");
    keel_world *w = keel_runtime_world(r->rt);
    static const keel_field f[] = { { .name = "coins", .type = KEEL_I64 } };
    check(keel_component_register(w, &(keel_component_desc){ .name = "coins", .size = 8, .fields = f,
                                                             .field_count = 1 }, &r->coins), "register");
    keel_schedule *s;
    check(keel_schedule_create(r->rt, &s), "keel_schedule_create");
    keel_system_desc idle = { .name = "idle", .kind = KEEL_SYSTEM_CALLBACK, .run = imm_idle };
    check(keel_schedule_add_system(s, &idle, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(r->rt, s), "keel_runtime_set_schedule");
    step(r->rt);
    check(keel_uow_flush(r->rt), "keel_uow_flush");
    keel_query *q;
    check(keel_query_create(w, &(keel_query_desc){ .with = { r->coins } }, &q), "keel_query_create");
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        for (uint32_t i = 0; i < it.count && n < IMM_ACCOUNTS; i++)
            r->acct[n++] = it.entities[i];
    keel_query_destroy(q);
    if (n != IMM_ACCOUNTS) {
        fprintf(stderr, "keel-bench: immediate: %u accounts, expected %u\n", n, IMM_ACCOUNTS);
        exit(1);
    }
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(r->rt, &s0);
    atomic_store(&r->running, IMM_THREADS);
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        r->th[i] = (imm_thread){ .run = r, .id = i };
        if (pthread_create(&r->th[i].th, NULL, imm_thread_main, &r->th[i])) {
            fprintf(stderr, "keel-bench: pthread_create failed\n");
            exit(1);
        }
    }
    uint64_t stop_at = t0 + (uint64_t)(IMM_SECONDS * 1e9);
    if (rate_hz > 0) { /* the TickDriver at rate_hz instead of an unthrottled loop */
        check(keel_runtime_start(r->rt), "keel_runtime_start");
        struct timespec ts = { (time_t)IMM_SECONDS, (long)((IMM_SECONDS - (double)(time_t)IMM_SECONDS) * 1e9) };
        nanosleep(&ts, NULL);
        atomic_store(&r->stop, true);
        while (atomic_load(&r->running)) {
            struct timespec ms = { 0, 1000000 };
            nanosleep(&ms, NULL);
        }
        check(keel_runtime_stop(r->rt), "keel_runtime_stop");
    }
    while (atomic_load(&r->running)) {
        step(r->rt);
        if (!atomic_load_explicit(&r->stop, memory_order_relaxed) && now_ns() >= stop_at)
            atomic_store(&r->stop, true);
    }
    uint64_t t1 = now_ns();
    keel_runtime_stats_get(r->rt, &s1);
    double secs = (double)(t1 - t0) / 1e9;
    imm_sample out = { .fsyncs_per_s = (double)(s1.fsyncs - s0.fsyncs) / secs,
                       .ticks_per_s = (double)(s1.ticks - s0.ticks) / secs,
                       .wal_mb_per_s = (double)(s1.wal_bytes - s0.wal_bytes) / 1e6 / secs };
    size_t total = 0;
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        pthread_join(r->th[i].th, NULL);
        total += r->th[i].nlat;
        out.failed += r->th[i].failed;
    }
    double *all = xmalloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        memcpy(all + k, r->th[i].lat, r->th[i].nlat * sizeof *all);
        k += r->th[i].nlat;
        free(r->th[i].lat);
    }
    out.tps = (double)total / ((double)(t1 - t0) / 1e9);
    out.p50 = percentile(all, total, 0.50);
    out.p99 = percentile(all, total, 0.99);
    free(all);
    keel_runtime_close(r->rt);
    free(r);
    remove_tmpdir(dir);
    return out;
}

typedef struct fsync_base {
    kw_codec_ctx *codec;
    kw_buf rec;
    uint64_t lsn;
} fsync_base;

static int fsync_fill(kw_wtxn *txn, void *arg)
{
    fsync_base *b = arg;
    return kw_put_wal(txn, b->lsn, b->rec.p, b->rec.len);
}

/* Baseline: one synced LMDB commit per record (one IMM_RECORD-byte
 * SIDE-like record per kw_store_write) into a directory of its own, for
 * IMM_BASE_SECONDS; commits/s and per-commit latency percentiles. */
static imm_sample fsync_measure(void)
{
    char *dir = make_tmpdir("fsync");
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_CREATE }, &st), "kw_store_open");
    fsync_base b = { .lsn = 0 };
    check(kw_codec_create(&(kw_codec_desc){ 0 }, &b.codec), "kw_codec_create");
    unsigned char payload[IMM_RECORD];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (unsigned char)(i * 37u);
    size_t cap = 1024, n = 0;
    double *lat = xmalloc(cap * sizeof *lat);
    uint64_t t0 = now_ns(), stop_at = t0 + (uint64_t)(IMM_BASE_SECONDS * 1e9), t = t0;
    while (t < stop_at) {
        b.rec.len = 0;
        b.lsn++;
        check(kw_record_build(b.codec, &b.rec, KW_KIND_SIDE, b.lsn, 0, 0, payload, sizeof payload), "kw_record_build");
        check(kw_store_write(st, fsync_fill, &b), "kw_store_write");
        uint64_t t2 = now_ns();
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof *lat);
            if (!lat)
                exit(1);
        }
        lat[n++] = (double)(t2 - t) / 1e6;
        t = t2;
    }
    imm_sample out = { .tps = (double)n / ((double)(t - t0) / 1e9), .fsyncs_per_s = (double)n / ((double)(t - t0) / 1e9) };
    out.p50 = percentile(lat, n, 0.50);
    out.p99 = percentile(lat, n, 0.99);
    free(lat);
    kw_buf_free(&b.rec);
    kw_codec_destroy(b.codec);
    kw_store_close(st);
    remove_tmpdir(dir);
    return out;
}

/* Median over R samples of the double at byte offset `off` of each. */
static double imm_median(const imm_sample *v, uint32_t R, size_t off)
{
    double *x = xmalloc(R * sizeof *x);
    for (uint32_t r = 0; r < R; r++)
        memcpy(&x[r], (const char *)&v[r] + off, sizeof x[r]);
    double m = median(x, R);
    free(x);
    return m;
}

static void bench_immediate(const config *cfg)
{
    keep_heap_resident();
    static const struct { const char *name; uint32_t window; double rate; } runs[] = {
        { "immediate", IMM_WINDOW, -1 },       /* SPEC §10: unthrottled stepping */
        { "immediate_w1", 1, -1 },             /* one transfer in flight per thread */
        { "immediate_1khz", IMM_WINDOW, 1000 },/* the TickDriver at 1 kHz instead */
    };
    enum { NRUNS = sizeof runs / sizeof runs[0] };
    uint32_t R = cfg->rounds;
    imm_sample *b = xmalloc(R * sizeof *b), *s[NRUNS];
    for (int k = 0; k < NRUNS; k++)
        s[k] = xmalloc(R * sizeof *s[k]);
    (void)fsync_measure(); /* warm-up */
    (void)imm_measure(IMM_WINDOW, -1);
    for (uint32_t r = 0; r < R; r++) {
        if (r % 2 == 0)
            b[r] = fsync_measure();
        for (int k = 0; k < NRUNS; k++)
            s[k][r] = imm_measure(runs[k].window, runs[k].rate);
        if (r % 2 == 1)
            b[r] = fsync_measure();
    }
    double base = imm_median(b, R, offsetof(imm_sample, tps));
    double base50 = imm_median(b, R, offsetof(imm_sample, p50)), base99 = imm_median(b, R, offsetof(imm_sample, p99));
    uint64_t failed = 0;
    for (int k = 0; k < NRUNS; k++) {
        for (uint32_t r = 0; r < R; r++)
            failed += s[k][r].failed;
        figure f = { .name = runs[k].name, .unit = "commits/s", .value = imm_median(s[k], R, offsetof(imm_sample, tps)),
                     .baseline = base, .target = 20, .target_on_ratio = true, .at_least = true };
        report(cfg, &f);
        char n50[32], n99[32];
        snprintf(n50, sizeof n50, "%s_p50", runs[k].name);
        snprintf(n99, sizeof n99, "%s_p99", runs[k].name);
        figure l50 = { .name = n50, .unit = "ms", .value = imm_median(s[k], R, offsetof(imm_sample, p50)),
                       .baseline = base50, .no_target = true };
        figure l99 = { .name = n99, .unit = "ms", .value = imm_median(s[k], R, offsetof(imm_sample, p99)),
                       .baseline = base99, .no_target = true };
        report(cfg, &l50);
        report(cfg, &l99);
        double fs = imm_median(s[k], R, offsetof(imm_sample, fsyncs_per_s));
        note(cfg, "%s: %u threads x %u transfers in flight, %s; %.0f ticks/s, %.0f synced LMDB commits/s by the "
                  "WAL writer (%.1f transfers per commit), %.1f MB/s of WAL", runs[k].name, IMM_THREADS,
             runs[k].window, runs[k].rate > 0 ? "TickDriver at 1 kHz" : "unthrottled keel_runtime_step loop",
             imm_median(s[k], R, offsetof(imm_sample, ticks_per_s)), fs, fs > 0 ? f.value / fs : 0,
             imm_median(s[k], R, offsetof(imm_sample, wal_mb_per_s)));
        free(s[k]);
    }
    if (failed)
        fprintf(stderr, "keel-bench: immediate: %llu transfers failed\n", (unsigned long long)failed);
    note(cfg, "immediate: value = IMMEDIATE two-account transfers/s (keel_submit + keel_ticket_wait from %u "
              "threads for %.1f s, latency = submit to the return of the wait) while the main thread steps the "
              "runtime (1 worker, %u accounts, GROUP ticks, tick-count checkpoints off); baseline = one synced "
              "LMDB commit per %u-byte record (kw_store_write loop, a directory of its own, %.1f s): commits/s "
              "and per-commit latency", IMM_THREADS, IMM_SECONDS, IMM_ACCOUNTS, IMM_RECORD, IMM_BASE_SECONDS);
    free(b);
}

/* ---- recovery --------------------------------------------------------------- */

typedef struct rec_sample {
    double wall_s, cpu_s, raw_mb;
    uint64_t records, tick, checkpoint_tick, hash;
} rec_sample;

/* Recover `dir` into a fresh runtime (components registered, no schedule). */
static rec_sample recovery_measure(const char *dir)
{
    demo d;
    demo_open(&d, &(demo_opts){ .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .dir = dir, .ckpt_ticks = -1 });
    keel_recovery rec;
    double c0 = process_cpu_s();
    uint64_t t0 = now_ns();
    check(keel_runtime_recover(d.rt, &rec), "keel_runtime_recover");
    uint64_t t1 = now_ns();
    double c1 = process_cpu_s();
    rec_sample s = { .wall_s = (double)(t1 - t0) / 1e9, .cpu_s = c1 - c0, .raw_mb = (double)rec.raw_bytes / 1e6,
                     .records = rec.records, .tick = rec.tick, .checkpoint_tick = rec.checkpoint_tick, .hash = keel_world_hash(keel_runtime_world(d.rt)) };
    demo_close(&d);
    return s;
}

/* Read, CRC-check and decompress every WAL record of dir through
 * libkeel_wal alone: what any replay must at least do. MB/s of raw payload
 * per CPU second. */
static double wal_read_mbps(const char *dir)
{
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_READONLY }, &st), "kw_store_open");
    kw_codec_ctx *c;
    check(kw_codec_create(&(kw_codec_desc){ 0 }, &c), "kw_codec_create");
    kw_rtxn *r;
    check(kw_read_begin(st, &r), "kw_read_begin");
    kw_walit *it;
    check(kw_wal_iter(r, 0, &it), "kw_wal_iter");
    double c0 = process_cpu_s(), raw = 0, sum = 0;
    uint64_t lsn;
    const void *rec, *payload;
    size_t len;
    int rc;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        kw_header h;
        check(kw_record_check(rec, len, &h), "kw_record_check");
        check(kw_record_payload(c, rec, &h, &payload), "kw_record_payload");
        raw += h.raw_len;
        if (h.raw_len)
            sum += ((const unsigned char *)payload)[h.raw_len - 1];
    }
    double c1 = process_cpu_s();
    if (rc < 0)
        check(rc, "kw_wal_next");
    g_sink = sum;
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_codec_destroy(c);
    kw_store_close(st);
    return raw / 1e6 / (c1 - c0);
}

static void bench_recovery(const config *cfg)
{
    keep_heap_resident();
    demo_opts o = { .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .churn = DEMO_CHURN, .ckpt_ticks = -1,
                    .telemetry = 1024, .schedule = true };
    demo d;
    /* For the record: the same ticks without a data directory. */
    demo_open(&d, &o);
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    uint64_t m0 = now_ns();
    for (uint32_t t = 0; t < RECOVERY_OFF_TICKS; t++)
        step(d.rt);
    double off_ms = (double)(now_ns() - m0) / 1e6 / RECOVERY_OFF_TICKS;
    demo_close(&d);
    /* Build: populate 1M (the first tick's hook), checkpoint, close: dir
     * `ckpt`; a copy of it, `full`, then gets RECOVERY_TICKS ticks of WAL. */
    uint64_t b0 = now_ns();
    char *ckpt = make_tmpdir("rec-ckpt"), *full = make_tmpdir("rec-full");
    o.dir = ckpt;
    demo_open(&d, &o);
    step(d.rt);
    check(keel_checkpoint(d.rt), "keel_checkpoint");
    uint64_t ckpt_hash = keel_world_hash(keel_runtime_world(d.rt)), ckpt_tick = keel_runtime_tick(d.rt);
    demo_close(&d);
    copy_tmpdir(ckpt, full);
    uint64_t b1 = now_ns();
    o.dir = full;
    demo_open(&d, &o);
    for (uint32_t t = 0; t < RECOVERY_TICKS; t++)
        step(d.rt);
    check(keel_uow_flush(d.rt), "keel_uow_flush");
    uint64_t full_hash = keel_world_hash(keel_runtime_world(d.rt)), full_tick = keel_runtime_tick(d.rt);
    keel_runtime_stats bs;
    keel_runtime_stats_get(d.rt, &bs);
    demo_close(&d);
    uint64_t b2 = now_ns();
    note(cfg, "recovery: built in %.1f s: populate %u, checkpoint of tick %llu, copy: %.1f s; %u ticks with the WAL "
              "on: %.1f s (%.1f ms/tick, flush included; the same ticks with the WAL off: %.1f ms/tick); "
              "%.1f MB WAL stored", (double)(b2 - b0) / 1e9, RECOVERY_ENTITIES, (unsigned long long)ckpt_tick,
         (double)(b1 - b0) / 1e9, RECOVERY_TICKS, (double)(b2 - b1) / 1e9, (double)(b2 - b1) / 1e6 / RECOVERY_TICKS,
         off_ms, (double)bs.wal_bytes / 1e6);

    uint32_t R = cfg->rounds;
    double *bw = xmalloc(R * sizeof *bw), *sw = xmalloc(R * sizeof *sw), *sc = xmalloc(R * sizeof *sc);
    double *rp = xmalloc(R * sizeof *rp), *rd = xmalloc(R * sizeof *rd);
    rec_sample last = { 0 };
    (void)recovery_measure(ckpt); /* warm-up: the page cache holds both directories */
    (void)recovery_measure(full);
    for (uint32_t r = 0; r < R; r++) {
        rec_sample a, b;
        if (r % 2 == 0) {
            a = recovery_measure(ckpt);
            b = recovery_measure(full);
        } else {
            b = recovery_measure(full);
            a = recovery_measure(ckpt);
        }
        if (a.hash != ckpt_hash || b.hash != full_hash || b.tick != full_tick) {
            fprintf(stderr, "keel-bench: recovery: recovered state differs (tick %llu, expected %llu; "
                    "hashes %s/%s)\n", (unsigned long long)b.tick, (unsigned long long)full_tick,
                    a.hash == ckpt_hash ? "ok" : "DIFFER", b.hash == full_hash ? "ok" : "DIFFER");
            exit(1);
        }
        if (r == 0 && a.tick != ckpt_tick) /* not fatal for the figure: the state is the checkpoint's */
            fprintf(stderr, "keel-bench: recovery: the checkpoint-only directory (checkpoint of tick %llu, no WAL "
                    "after it) recovers to tick %llu\n", (unsigned long long)ckpt_tick, (unsigned long long)a.tick);
        bw[r] = a.wall_s;
        sw[r] = b.wall_s;
        sc[r] = b.raw_mb / b.cpu_s;
        rp[r] = b.cpu_s > a.cpu_s ? b.raw_mb / (b.cpu_s - a.cpu_s) : NAN;
        rd[r] = wal_read_mbps(full);
        last = b;
    }
    double read_rate = median(rd, R);
    figure t = { .name = "recovery", .unit = "s", .value = median(sw, R), .baseline = median(bw, R), .no_target = true };
    report(cfg, &t);
    figure m = { .name = "recovery_mbps", .unit = "MB/s", .value = median(sc, R), .baseline = read_rate,
                 .target = 200, .at_least = true };
    report(cfg, &m);
    figure p = { .name = "recovery_replay", .unit = "MB/s", .value = median(rp, R), .baseline = read_rate,
                 .target = 200, .at_least = true };
    report(cfg, &p);
    note(cfg, "recovery: %u entities + %u ticks (rows with (index + tick) %% %u == 0 of pos and vel, %u spawns + "
              "%u destroys per tick): checkpoint of tick %llu, then %.1f MB raw WAL in %llu records replayed "
              "to tick %llu", RECOVERY_ENTITIES, RECOVERY_TICKS, RECOVERY_TURN, DEMO_CHURN, DEMO_CHURN,
         (unsigned long long)last.checkpoint_tick, last.raw_mb, (unsigned long long)last.records,
         (unsigned long long)last.tick);
    note(cfg, "recovery: value = keel_runtime_recover seconds (checkpoint + WAL), baseline = the same "
              "checkpoint without the WAL; recovery_mbps = raw WAL MB per CPU second of the whole recovery "
              "(checkpoint load included); recovery_replay = raw WAL MB / (recovery - checkpoint-only) "
              "CPU seconds; their baseline: reading, CRC-checking and decompressing the same records with "
              "libkeel_wal alone, MB per CPU second; page cache warm");
    free(bw);
    free(sw);
    free(sc);
    free(rp);
    free(rd);
    remove_tmpdir(ckpt);
    remove_tmpdir(full);
}

/* ---- checkpoint ----------------------------------------------------------------- */

typedef struct ckpt_sample {
    double p50, p99, max, tps, cpu_ms;
    uint64_t checkpoints;
} ckpt_sample;

static ckpt_sample ckpt_measure(int64_t every)
{
    char *dir = make_tmpdir("ckpt");
    demo d;
    demo_open(&d, &(demo_opts){ .n = DEMO_ENTITIES, .turn = DEMO_TURN, .churn = DEMO_CHURN, .dir = dir,
                                .ckpt_ticks = every, .telemetry = 1024, .schedule = true });
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    check(keel_uow_flush(d.rt), "keel_uow_flush");
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(d.rt, &s0);
    double *ms = xmalloc(CKPT_TICKS * sizeof *ms);
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
    s.max = percentile(ms, CKPT_TICKS, 1.0);
    s.p50 = percentile(ms, CKPT_TICKS, 0.50);
    s.p99 = percentile(ms, CKPT_TICKS, 0.99);
    free(ms);
    demo_close(&d);
    remove_tmpdir(dir);
    return s;
}

static void bench_checkpoint(const config *cfg)
{
    keep_heap_resident();
    enum { CK_P50, CK_P99, CK_MAX, CK_TPS, CK_CPU, CK_N };
    static const char *const names[CK_N] = { "ckpt_tick_p50", "ckpt_tick_p99", "ckpt_tick_max", "ckpt_tps", "ckpt_cpu" };
    static const char *const units[CK_N] = { "ms", "ms", "ms", "ticks/s", "ms/tick" };
    uint32_t R = cfg->rounds;
    double *v[2][CK_N];
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < CK_N; k++)
            v[c][k] = xmalloc(R * sizeof(double));
    uint64_t checkpoints = 0;
    (void)ckpt_measure(-1);
    (void)ckpt_measure(CKPT_EVERY);
    for (uint32_t r = 0; r < R; r++)
        for (int k = 0; k < 2; k++) {
            int c = r % 2 == 0 ? k : 1 - k;
            ckpt_sample s = ckpt_measure(c ? CKPT_EVERY : -1);
            v[c][CK_P50][r] = s.p50;
            v[c][CK_P99][r] = s.p99;
            v[c][CK_MAX][r] = s.max;
            v[c][CK_TPS][r] = s.tps;
            v[c][CK_CPU][r] = s.cpu_ms;
            if (c)
                checkpoints += s.checkpoints;
        }
    for (int k = 0; k < CK_N; k++) {
        figure f = { .name = names[k], .unit = units[k], .value = median(v[1][k], R), .baseline = median(v[0][k], R),
                     .no_target = true };
        report(cfg, &f);
        free(v[0][k]);
        free(v[1][k]);
    }
    note(cfg, "checkpoint: the wal figure's workload, WAL on (GROUP), %u timed ticks per measurement: tick time = "
              "keel_runtime_step wall time; ckpt_cpu = process CPU per tick; value = checkpoint_every_ticks %d "
              "(%.1f checkpoints per measurement), baseline = no checkpoints; SPEC §8 asks for no stall and sets "
              "no number", CKPT_TICKS, CKPT_EVERY, (double)checkpoints / R);
}

/* ---- command line -------------------------------------------------------- */

typedef void (*bench_fn)(const config *cfg);

static const struct bench {
    const char *name;
    bench_fn run;
} BENCHES[] = {
    /* memory runs first: its child is forked before the parent has a large
     * heap whose freed but still resident pages the child could reuse
     * without growing its RSS. */
    { "memory", bench_memory },
    { "iterate", bench_iterate },
    { "spawn", bench_spawn },
    { "destroy", bench_destroy },
    { "systems", bench_systems },
    { "parallel", bench_parallel },
    { "side", bench_side },
    { "wal", bench_wal },
    { "immediate", bench_immediate },
    { "recovery", bench_recovery },
    { "checkpoint", bench_checkpoint },
};
#define NBENCHES (sizeof BENCHES / sizeof BENCHES[0])

static void usage(FILE *out)
{
    fprintf(out,
            "usage: keel-bench [all|NAME...] [--json] [--entities N] [--rounds R]\n"
            "  NAME          memory|iterate|spawn|destroy|systems|parallel|side|wal|immediate|\n"
            "                recovery|checkpoint (several may be named; default all)\n"
            "  --entities N  entities of the in-memory figures (default 1000000); the durability\n"
            "                figures use SPEC §10's sizes (100k, 1M for recovery)\n"
            "  --rounds R    rounds; figures are medians over rounds (default 7)\n"
            "  --json        one JSON object per line per figure\n"
            "Each figure is measured side by side with its baseline in this run. Data\n"
            "directories are made under $TMPDIR (default /tmp) and removed afterwards.\n");
}

static bool parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || *s == '\0' || *s == '-' || *end != '\0' || errno || v < min || v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Index in BENCHES, NBENCHES for "all", -1 when unknown. */
static int bench_index(const char *name)
{
    if (strcmp(name, "all") == 0)
        return (int)NBENCHES;
    for (size_t i = 0; i < NBENCHES; i++)
        if (strcmp(name, BENCHES[i].name) == 0)
            return (int)i;
    return -1;
}

/* 0: run; 1: --help was printed; -1: bad arguments (message printed).
 * selected[i]: run BENCHES[i] (all of them when no name is given). */
static int parse_args(int argc, char **argv, config *cfg, bool selected[NBENCHES])
{
    bool named = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int b;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--json") == 0) {
            cfg->json = true;
        } else if (strcmp(a, "--entities") == 0) {
            if (!parse_u32(i + 1 < argc ? argv[++i] : NULL, 1, UINT32_MAX - 1, &cfg->entities)) {
                fprintf(stderr, "keel-bench: --entities needs a number in [1, 4294967294]\n");
                return -1;
            }
        } else if (strcmp(a, "--rounds") == 0) {
            if (!parse_u32(i + 1 < argc ? argv[++i] : NULL, 1, 10000, &cfg->rounds)) {
                fprintf(stderr, "keel-bench: --rounds needs a number in [1, 10000]\n");
                return -1;
            }
        } else if (a[0] != '-' && (b = bench_index(a)) >= 0) {
            for (size_t k = 0; k < NBENCHES; k++)
                if (b == (int)NBENCHES || b == (int)k)
                    selected[k] = true;
            named = true;
        } else {
            fprintf(stderr, "keel-bench: unexpected argument '%s'\n", a);
            return -1;
        }
    }
    for (size_t k = 0; !named && k < NBENCHES; k++)
        selected[k] = true;
    return 0;
}

int main(int argc, char **argv)
{
    config cfg = { .entities = 1000000, .rounds = 7, .json = false };
    bool selected[NBENCHES] = { false };
    int rc = parse_args(argc, argv, &cfg, selected);
    if (rc != 0) {
        if (rc < 0)
            usage(stderr);
        return rc < 0 ? 2 : 0;
    }
    if (!cfg.json) {
        printf("# keel-bench");
        for (size_t i = 0; i < NBENCHES; i++)
            if (selected[i])
                printf(" %s", BENCHES[i].name);
        printf(": entities=%u rounds=%u; medians over rounds, baseline and keel alternated in each round\n",
               cfg.entities, cfg.rounds);
        printf("%-16s %10s %-10s %10s %-10s %8s   %s\n", "# figure", "value", "", "baseline", "",
               "ratio", "target");
    }
    /* in BENCHES order whatever the order of the names (memory first, see above) */
    for (size_t i = 0; i < NBENCHES; i++)
        if (selected[i])
            BENCHES[i].run(&cfg);
    return 0;
}
