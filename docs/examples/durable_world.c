/*
 * durable_world.c -- a durable world in one file: two components, a system
 * and a data directory. It runs the world, closes it, opens the same
 * directory again and continues where the first run stopped.
 *
 *   cc durable_world.c $(pkg-config --cflags --libs keel) -o durable_world
 *   ./durable_world               # then: keel-wal info durable_world-XXXXXX
 *
 * on_first_tick runs after every open: it spawns the ships only when the
 * world is empty, i.e. on the first run; the second run recovers them from
 * the directory (checkpoint + write-ahead log) instead.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <keel/keel.h>

#define SHIPS 4
#define TICKS 30 /* per run */

typedef struct vec2 { float x, y; } vec2;

typedef struct app {
    keel_component pos, vel;
    uint32_t spawned; /* ships on_first_tick created in this run */
} app;

/* The hook: populate an empty world, leave a recovered one alone. */
static int first_tick(keel_ctx *ctx, void *user)
{
    app *a = user;
    if (keel_world_count(keel_ctx_world(ctx)) > 0)
        return 0;
    for (uint32_t i = 0; i < SHIPS; i++) {
        vec2 p = {0, (float)i}, v = {1.0f + (float)i, 0};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{a->pos, &p}, {a->vel, &v}}, 2);
        if (rc)
            return rc;
        a->spawned++;
    }
    return 0;
}

/* A query system: called per chunk of entities with pos and vel. Writes
 * go to the system's transaction and become visible when it succeeds. */
static int move(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx, (void)user;
    vec2 *p = KEEL_COLUMN(it, vec2, 0);
    const vec2 *v = KEEL_COLUMN(it, vec2, 1);
    for (uint32_t i = 0; i < it->count; i++)
        p[i].x += v[i].x, p[i].y += v[i].y;
    return 0;
}

/* One life of a server process: open dir, run TICKS ticks, close.
 * *hash: the state hash the previous run ended with, then this run's. */
static int run(const char *dir, int n, uint64_t *hash)
{
    app a = {0};
    keel_runtime *rt = NULL;
    keel_schedule *s = NULL;
    keel_query *q = NULL;
    keel_recovery r;
    int bad = 0;
    keel_runtime_desc d = {
        .durable = {.dir = dir},
        .tick_rate_hz = -1, /* as fast as ticks run; a server keeps the default 60 Hz */
        .on_first_tick = first_tick,
        .hook_user = &a,
    };
    /* Every open registers the same components in the same order: the
     * directory stores their ids and schemas and checks them. */
    keel_field xy[] = {{.name = "x", .type = KEEL_F32, .offset = 0}, {.name = "y", .type = KEEL_F32, .offset = 4}};
    keel_component_desc pos = {.name = "pos", .size = sizeof(vec2), .fields = xy, .field_count = 2};
    keel_component_desc vel = {.name = "vel", .size = sizeof(vec2), .fields = xy, .field_count = 2};
    keel_system_desc mover = {.name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = move};
    int rc = keel_runtime_create(&d, &rt);
    keel_world *w = rc ? NULL : keel_runtime_world(rt);
    if (rc || (rc = keel_component_register(w, &pos, &a.pos)) || (rc = keel_component_register(w, &vel, &a.vel)))
        goto out;
    mover.query = (keel_query_desc){.with = {a.pos, a.vel}};
    mover.access = (keel_access){.writes = {a.pos}, .reads = {a.vel}};
    if ((rc = keel_schedule_create(rt, &s)) || (rc = keel_schedule_add_system(s, &mover, NULL)) ||
        (rc = keel_schedule_build(s)) || (rc = keel_runtime_set_schedule(rt, s)))
        goto out;
    if ((rc = keel_runtime_recover(rt, &r))) /* optional: the first tick would call it */
        goto out;
    printf("run %d: %s at tick %" PRIu64 ", %u entities, hash %016" PRIx64 "\n", n,
           r.fresh ? "new world" : "recovered", r.tick, keel_world_count(w), keel_world_hash(w));
    bad = !r.fresh && keel_world_hash(w) != *hash;
    if ((rc = keel_runtime_run(rt, TICKS)))
        goto out;
    printf("run %d: on_first_tick spawned %u ships; now tick %" PRIu64 ", %u entities, hash %016" PRIx64 "\n", n,
           a.spawned, keel_runtime_tick(rt), keel_world_count(w), keel_world_hash(w));
    /* Between ticks the controlling thread may read the world. */
    if ((rc = keel_query_create(w, &(keel_query_desc){.with = {a.pos}}, &q)))
        goto out;
    keel_iter it;
    for (keel_query_iter(q, &it); keel_iter_next(&it);)
        for (uint32_t i = 0; i < it.count; i++)
            printf("  ship %016" PRIx64 " at x=%.0f\n", it.entities[i], (double)KEEL_COLUMN(&it, vec2, 0)[i].x);
    /* Run 1 populated the world; run 2 recovered it and its hook spawned nothing. */
    *hash = keel_world_hash(w);
    bad |= keel_world_count(w) != SHIPS || a.spawned != (r.fresh ? SHIPS : 0) || r.tick != (uint64_t)(n - 1) * TICKS;
    if (bad)
        fprintf(stderr, "durable_world: run %d did not continue the world as expected\n", n);
out:
    if (rc) /* the last error names the culprit: the component, the file, the system */
        fprintf(stderr, "durable_world: run %d: %s: %s\n", n, keel_strerror(rc), keel_last_error());
    keel_query_destroy(q);    /* each of these ignores NULL */
    keel_schedule_destroy(s); /* and an installed schedule: the runtime owns it */
    keel_runtime_close(rt);   /* everything acknowledged is on disk */
    return rc || bad;
}

int main(void)
{
    /* A new directory each time, in the current one: nothing else is touched. */
    char dir[] = "durable_world-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("durable_world: mkdtemp");
        return 1;
    }
    printf("keel %s, data directory %s\n", keel_version(), dir);
    uint64_t hash = 0;
    if (run(dir, 1, &hash) || run(dir, 2, &hash))
        return 1;
    printf("the second run continued the first; inspect it with: keel-wal info %s\n", dir);
    return 0;
}
