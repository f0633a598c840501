/*
 * reader.c -- a reader thread looking at a running world through read views.
 *
 * The main thread runs ticks; one system moves every entity (pos += vel) and
 * counts its moves, so on every row pos == moves * vel. Meanwhile a reader
 * thread -- think of a network or admin thread -- opens a read view (the
 * last completed tick, consistent across components), iterates a query over
 * it chunk by chunk, checks that invariant on every row, and closes the view.
 * The reader never blocks a tick and never sees half of one.
 *
 * Build: a C11 compiler, keel's headers, libkeel, libkeel_wal and libkeel_base,
 * then lmdb, liburcu-bp and libzstd, and -pthread. Runs in memory: it writes
 * no file. Prints one line; exits 0 when every view was consistent.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "keel/keel.h"

typedef struct { float x, y; } pos_t;
typedef struct { float dx, dy; } vel_t;

typedef struct app {
    keel_runtime *rt;
    keel_query *q;                 /* with pos, vel, moves */
    atomic_bool stop;
    atomic_ulong views;            /* views the reader checked */
    unsigned long rows, broken;    /* read after the join */
} app;

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_) {                                                                             \
            fprintf(stderr, "%s: %s: %s\n", #call, keel_strerror(rc_), keel_last_error());    \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* The system: one call per chunk of its query, inside the tick's transaction. */
static int move(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx, (void)user;
    pos_t *p = KEEL_COLUMN(it, pos_t, 0);
    const vel_t *v = KEEL_COLUMN(it, vel_t, 1);
    uint32_t *moves = KEEL_COLUMN(it, uint32_t, 2);
    for (uint32_t i = 0; i < it->count; i++) {
        p[i].x += v[i].dx;
        p[i].y += v[i].dy;
        moves[i]++;
    }
    return 0;
}

/* The reader: a view per look, never held longer than needed. */
static void *reader(void *arg)
{
    app *a = arg;
    while (!atomic_load(&a->stop)) {
        const keel_view *view;
        if (keel_view_begin(a->rt, &view))
            break;
        uint32_t rows = 0;
        keel_iter it;
        keel_view_iter(view, a->q, &it);
        while (keel_view_next(view, &it)) {
            const pos_t *p = KEEL_COLUMN(&it, pos_t, 0);
            const vel_t *v = KEEL_COLUMN(&it, vel_t, 1);
            const uint32_t *moves = KEEL_COLUMN(&it, uint32_t, 2);
            for (uint32_t i = 0; i < it.count; i++)
                if (p[i].x != (float)moves[i] * v[i].dx || p[i].y != (float)moves[i] * v[i].dy)
                    a->broken++;
            rows += it.count;
        }
        if (rows != keel_view_count(view)) /* every live entity has pos, vel and moves */
            a->broken++;
        keel_view_end(view);
        a->rows += rows;
        atomic_fetch_add(&a->views, 1);
    }
    return NULL;
}

int main(void)
{
    app a = {0};
    CHECK(keel_runtime_create(&(keel_runtime_desc){.workers = 2, .tick_rate_hz = -1}, &a.rt));
    keel_world *w = keel_runtime_world(a.rt);
    /* VERSIONED (the default discipline): only those are part of a read view */
    keel_field xy[] = {{.name = "x", .type = KEEL_F32, .offset = 0}, {.name = "y", .type = KEEL_F32, .offset = 4}};
    keel_field n[] = {{.name = "n", .type = KEEL_U32, .offset = 0}};
    keel_component pos, vel, moves;
    CHECK(keel_component_register(w, &(keel_component_desc){.name = "pos", .size = 8, .fields = xy, .field_count = 2},
                                  &pos));
    CHECK(keel_component_register(w, &(keel_component_desc){.name = "vel", .size = 8, .fields = xy, .field_count = 2},
                                  &vel));
    CHECK(keel_component_register(w, &(keel_component_desc){.name = "moves", .size = 4, .fields = n, .field_count = 1},
                                  &moves));
    CHECK(keel_query_create(w, &(keel_query_desc){.with = {pos, vel, moves}}, &a.q));

    keel_schedule *s;
    CHECK(keel_schedule_create(a.rt, &s));
    keel_system_desc sys = {.name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = move, .parallel = true,
                            .query = {.with = {pos, vel, moves}},
                            .access = {.reads = {vel}, .writes = {pos, moves}}};
    CHECK(keel_schedule_add_system(s, &sys, NULL));
    CHECK(keel_schedule_build(s));
    CHECK(keel_runtime_set_schedule(a.rt, s));

    /* 10000 entities, spawned before the first tick (in memory: no logging needed) */
    keel_cmdbuf *cb;
    CHECK(keel_cmdbuf_create(w, &cb));
    for (int i = 0; i < 10000; i++) {
        pos_t p0 = {0, 0};
        vel_t v0 = {(float)(i % 7) - 3, (float)(i % 5) - 2};
        uint32_t m0 = 0;
        CHECK(keel_cmd_spawn(cb, (keel_init[]){{pos, &p0}, {vel, &v0}, {moves, &m0}}, 3));
    }
    CHECK(keel_cmdbuf_apply(cb));
    keel_cmdbuf_destroy(cb);

    CHECK(keel_runtime_step(a.rt)); /* tick 1 publishes the entities: from now on every view holds them */
    pthread_t th;
    if (pthread_create(&th, NULL, reader, &a))
        return 1;
    /* at least 200 ticks, and on until the reader has looked 20 times */
    while (keel_runtime_tick(a.rt) < 200 || (atomic_load(&a.views) < 20 && keel_runtime_tick(a.rt) < 1000000))
        CHECK(keel_runtime_step(a.rt));
    atomic_store(&a.stop, true);
    pthread_join(th, NULL);

    printf("%llu ticks; the reader checked %lu views, %lu rows: %lu broken\n",
           (unsigned long long)keel_runtime_tick(a.rt), atomic_load(&a.views), a.rows, a.broken);
    keel_query_destroy(a.q);
    CHECK(keel_runtime_close(a.rt)); /* ends the runtime; every view was ended */
    return a.broken ? 1 : 0;
}
