/*
 * tools/bench/bench_memory.c -- the in-memory figures of keel-bench, each
 * against a plain-C baseline in the same run: memory, iterate, parallel,
 * spawn, destroy, systems, side.
 */
#include <errno.h>
#include <pthread.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define ITERATE_PASSES 10          /* alternating passes per side per round */
#define MEMORY_BATCH 65536u        /* spawns per command buffer apply in the memory child */
#define MEMORY_WARM_ENTITIES 1024 /* the warm-up runtime's entities: keel's code pages resident before the base */
#define MEMORY_TICKS 10            /* ticks rewriting pos and vel before reading the peak */
#define SHUFFLE_SEED 0x6b65656c62656e63ull /* "keelbenc" */
#define SYSTEMS_PER_TICK 64u
#define SYSTEMS_TICKS 2000u        /* ticks per measurement of the systems figure */
#define PARALLEL_TICKS 5           /* ticks per measurement of the parallel figure */
#define PARALLEL_WARM 5            /* untimed ticks before them: see parallel_tick */

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


/* ---- keel worlds -------------------------------------------------------- */

typedef struct bench_world {
    keel_world *w;
    keel_component pos, vel;
} bench_world;

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
    vec3 *fused[2], *fused_vel; /* iterate_fused: plain C, double-buffered */
    uint32_t fused_turn;
} iterate_ctx;

static keel_runtime *integrate_runtime(int32_t workers, uint32_t n, bool both, bench_world *out);

static double iterate_plain(void *ctx)
{
    iterate_ctx *c = ctx;
    uint64_t t0 = now_ns();
    integrate(c->pos, c->vel, c->n, g_dt);
    return (double)(now_ns() - t0) / 1e6;
}

/* The floor of any double-buffered (copy-on-write) scheme, in plain C: read
 * the tick-start array, write the other one, swap. */
static double iterate_fused(void *ctx)
{
    iterate_ctx *c = ctx;
    vec3 *from = c->fused[c->fused_turn & 1], *to = c->fused[~c->fused_turn & 1];
    uint64_t t0 = now_ns();
    integrate_into(to, from, c->fused_vel, c->n, g_dt);
    double ms = (double)(now_ns() - t0) / 1e6;
    c->fused_turn++;
    return ms;
}

static double iterate_keel(void *ctx)
{
    iterate_ctx *c = ctx;
    uint64_t t0 = now_ns();
    check(keel_runtime_step(c->rt), "keel_runtime_step");
    return (double)(now_ns() - t0) / 1e6;
}

void bench_iterate(const config *cfg)
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

    figure f = { .name = "iterate", .unit = "ms/pass", .target = 1.25, .target_on_ratio = true };
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

    /* The same in-place loop against the fused pass in plain C over three
     * arrays, alternated the same way: what double-buffering alone costs on
     * this machine, whatever keel adds on top. */
    for (int k = 0; k < 2; k++) {
        c.fused[k] = xmalloc((size_t)n * sizeof(vec3));
        memcpy(c.fused[k], c.pos, (size_t)n * sizeof(vec3));
    }
    c.fused_vel = xmalloc((size_t)n * sizeof(vec3));
    memcpy(c.fused_vel, c.vel, (size_t)n * sizeof(vec3));
    figure ff = {.name = "iterate_fused", .unit = "ms/pass", .no_target = true};
    run_pair(cfg, ITERATE_PASSES, iterate_plain, iterate_fused, &c, &ff);
    report(cfg, &ff);
    note(cfg, "iterate_fused: the fused pass in plain C (read one array, write the other, three 1M-row "
              "arrays) against the in-place loop: the floor of any copy-on-write scheme here");
    for (int k = 0; k < 2; k++)
        free(c.fused[k]);
    free(c.fused_vel);

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

void bench_spawn(const config *cfg)
{
    uint32_t n = cfg->entities;
    figure f = { .name = "spawn", .unit = "ns/entity", .target = 60 };
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
    figure f = { .name = name, .unit = "ns/entity", .target = 40 };
    run_pair(cfg, 1, destroy_plain, destroy_keel, &c, &f);
    report(cfg, &f);
    free(order);
}

void bench_destroy(const config *cfg)
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
    uint64_t kept_kb;      /* RSS between ticks after them, the spares kept */
    uint64_t idle_kb;      /* the same after keel_runtime_release_memory: old versions reclaimed */
    uint64_t released;     /* the bytes it released */
} mem_report;

/* Runs in the child: build the world, rewrite both components a few times,
 * report the RSS figures through fd. Never returns. */
static void memory_child(uint32_t n, int fd)
{
    mem_report r;
    /* A small runtime first, run and closed: the base reading then holds
     * keel's code pages and the process's one-off allocations (the RCU
     * thread), so that the readings compare what the world adds. */
    keel_runtime *warm = integrate_runtime(1, MEMORY_WARM_ENTITIES, true, NULL);
    for (int t = 0; t < MEMORY_TICKS; t++)
        check(keel_runtime_step(warm), "keel_runtime_step");
    check(keel_runtime_close(warm), "keel_runtime_close");
    malloc_trim(0);
    reset_peak_rss();
    r.base_kb = proc_status_kb("VmRSS:");
    bench_world bw;
    keel_runtime *rt = integrate_runtime(1, n, true, &bw);
    for (int t = 0; t < MEMORY_TICKS; t++)
        check(keel_runtime_step(rt), "keel_runtime_step");
    r.peak_kb = peak_rss_kb();
    malloc_trim(0); /* what the heap holds freed is not the runtime's: give it back before reading */
    r.kept_kb = proc_status_kb("VmRSS:");
    check(keel_runtime_release_memory(rt, &r.released), "keel_runtime_release_memory");
    malloc_trim(0);
    r.idle_kb = proc_status_kb("VmRSS:");
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

void bench_memory(const config *cfg)
{
    mem_report r;
    if (!memory_measure(cfg->entities, &r)) {
        fprintf(stderr, "keel-bench: memory: the measuring child failed\n");
        exit(1);
    }
    double raw_mb = (double)cfg->entities * 2 * sizeof(vec3) / 1e6;
    uint64_t grown_kb = r.peak_kb > r.base_kb ? r.peak_kb - r.base_kb : 0;
    uint64_t idle_kb = r.idle_kb > r.base_kb ? r.idle_kb - r.base_kb : 0;
    uint64_t kept_kb = r.kept_kb > r.base_kb ? r.kept_kb - r.base_kb : 0;
    figure f = { .name = "memory", .unit = "MB", .target = 2.75, .target_on_ratio = true,
                 .value = (double)grown_kb * 1024 / 1e6, .baseline = raw_mb };
    report(cfg, &f);
    figure idle = { .name = "memory_idle", .unit = "MB", .target = 1.7, .target_on_ratio = true,
                    .value = (double)idle_kb * 1024 / 1e6, .baseline = raw_mb };
    report(cfg, &idle);
    note(cfg, "memory: child peak RSS %.1f MB minus its RSS before building %.1f MB (after a %u-entity runtime ran "
              "and closed), while a system rewrites both components every tick; memory_idle: its RSS between ticks "
              "after keel_runtime_release_memory (%.1f MB freed) and malloc_trim, %.1f MB, minus the same; with the "
              "spares kept %.1f MB (%.3gx); baseline: the raw component bytes",
         (double)r.peak_kb * 1024 / 1e6, (double)r.base_kb * 1024 / 1e6, MEMORY_WARM_ENTITIES, (double)r.released / 1e6,
         (double)r.idle_kb * 1024 / 1e6, (double)kept_kb * 1024 / 1e6, (double)kept_kb * 1024 / 1e6 / raw_mb);
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

void bench_systems(const config *cfg)
{
    for (uint32_t i = 0; i < SYSTEMS_PER_TICK; i++)
        plain_table[i] = empty_system;
    static const struct { const char *name; int32_t workers; double target; } runs[] = {
        {"systems_1w", 1, 60},
        {"systems_2w", 2, 150},
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

/* The two runtimes (and the two sides of parallel_fused) take turns, and
 * each is slow for its first 3-4 ticks after the other ran: its 36 MB come
 * back into the last-level cache over several passes (plain C's fused pass
 * shows the same ramp). Timing from the switch would measure that ramp,
 * and which side the median picks it for would follow the parity of the
 * round count; so each measurement first runs PARALLEL_WARM ticks untimed. */
static double parallel_tick(keel_runtime *rt)
{
    for (int t = 0; t < PARALLEL_WARM; t++)
        check(keel_runtime_step(rt), "keel_runtime_step");
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

/* parallel_fused: the fused pass in plain C on one thread against the same
 * pass split in two halves over two threads -- what this machine's memory
 * system gives two threads, whatever keel does. Like keel's two runtimes,
 * each side has its own arrays (side 0: one thread, side 1: two). The
 * helper thread spins on `gen` between passes: no wake-up cost, a best
 * case that keel's pool, which parks a worker after 50 us, does not get. */
typedef struct fused_side {
    vec3 *buf[2], *vel;
    uint32_t turn;
} fused_side;

typedef struct fused_pair {
    uint32_t n;
    fused_side side[2];
    _Atomic uint32_t gen, done;
    _Atomic bool quit;
} fused_pair;

static void fused_half(const fused_pair *fp, const fused_side *fs, uint32_t half, uint32_t halves)
{
    uint32_t lo = (uint32_t)((uint64_t)fp->n * half / halves), hi = (uint32_t)((uint64_t)fp->n * (half + 1) / halves);
    integrate_into(fs->buf[~fs->turn & 1] + lo, fs->buf[fs->turn & 1] + lo, fs->vel + lo, hi - lo, g_dt);
}

static void *fused_helper(void *arg)
{
    fused_pair *fp = arg;
    uint32_t seen = 0;
    while (!atomic_load(&fp->quit)) {
        uint32_t g = atomic_load(&fp->gen);
        if (g == seen) {
            bench_pause();
            continue;
        }
        seen = g;
        fused_half(fp, &fp->side[1], 1, 2);
        atomic_store(&fp->done, g);
    }
    return NULL;
}

static double fused_passes(fused_pair *fp, bool two)
{
    fused_side *fs = &fp->side[two];
    uint64_t t0 = 0;
    for (int t = -PARALLEL_WARM; t < PARALLEL_TICKS; t++, fs->turn++) { /* untimed first: see parallel_tick */
        if (t == 0)
            t0 = now_ns();
        if (!two) {
            fused_half(fp, fs, 0, 1);
            continue;
        }
        uint32_t g = atomic_fetch_add(&fp->gen, 1) + 1; /* the helper reads fs after this (seq_cst) */
        fused_half(fp, fs, 0, 2);
        while (atomic_load(&fp->done) != g)
            bench_pause();
    }
    return (double)(now_ns() - t0) / 1e6 / PARALLEL_TICKS;
}

static double fused_one(void *ctx)
{
    return fused_passes(ctx, false);
}

static double fused_two(void *ctx)
{
    return fused_passes(ctx, true);
}

static void bench_parallel_fused(const config *cfg)
{
    fused_pair fp = {.n = cfg->entities};
    for (int sd = 0; sd < 2; sd++) {
        fused_side *fs = &fp.side[sd];
        for (int k = 0; k < 2; k++)
            fs->buf[k] = xmalloc((size_t)fp.n * sizeof(vec3));
        fs->vel = xmalloc((size_t)fp.n * sizeof(vec3));
        for (uint32_t i = 0; i < fp.n; i++) {
            fs->buf[0][i] = fs->buf[1][i] = init_pos(i);
            fs->vel[i] = init_vel(i);
        }
    }
    pthread_t helper;
    if (pthread_create(&helper, NULL, fused_helper, &fp) != 0) {
        fprintf(stderr, "keel-bench: parallel_fused: cannot start a thread\n");
        exit(1);
    }
    figure f = {.name = "parallel_fused", .unit = "ms/tick", .no_target = true};
    run_pair(cfg, 1, fused_one, fused_two, &fp, &f);
    atomic_store(&fp.quit, true);
    pthread_join(helper, NULL);
    report(cfg, &f);
    note(cfg, "parallel_fused: the same fused pass in plain C, 1 thread vs 2 (halves, a spinning helper, "
              "own arrays per side): speed-up %.2fx", f.baseline / f.value);
    for (int sd = 0; sd < 2; sd++) {
        free(fp.side[sd].buf[0]);
        free(fp.side[sd].buf[1]);
        free(fp.side[sd].vel);
    }
}

void bench_parallel(const config *cfg)
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
    bench_parallel_fused(cfg);
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

void bench_side(const config *cfg)
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
    note(cfg, "side: two-row transfers as side transactions (read both, write both, commit; no data directory); "
              "baseline: the same transfers on a plain array under one mutex; target: keel's own budget, "
              "no product target (no durability involved)");
}

