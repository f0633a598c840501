/*
 * keel-world -- the demo world server, in its first form: a world of agents
 * that move over a bounded plane, lose energy, get hungry, die, and are
 * replaced, all driven by a seeded generator so the same arguments always
 * end in the same state hash.
 *
 * One step ("tick"):
 *   1. movement: pos += vel * dt over the query {pos, vel}, bouncing off the
 *      plane's edges;
 *   2. metabolism: energy -= 1 over {energy}; an agent at 0 is destroyed; an
 *      agent below the hunger line gets the `hungry` tag; a hungry agent that
 *      finds food (seeded chance) eats, gains energy and loses the tag;
 *   3. births: seeded spawns replace the dead, plus a little seeded noise;
 *   4. the sync point: the tick's command buffer is applied.
 * The systems record structural changes only; nothing moves under a query.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"

typedef struct vec3 {
    float x, y, z;
} vec3;

typedef struct options {
    uint64_t seed;
    uint32_t entities;
    uint64_t until_tick;
    int quiet;
} options;

typedef struct world_app {
    keel_world *w;
    keel_cmdbuf *cmds;
    keel_component pos, vel, energy, hungry;
    keel_query *movers, *eaters;
    uint64_t rng;
    uint32_t deaths;
} world_app;

#define PLANE 1000.0f
#define HUNGER_LINE 200u
#define DT (1.0f / 60.0f)

/* splitmix64: small, seedable, and the same on every platform. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_next(s) >> 40) / (float)(1u << 24);
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: keel-world [--seed S] [--entities N] [--until-tick N] [--quiet]\n"
            "  --seed S        seed of the world's generator (default 1)\n"
            "  --entities N    agents at the start (default 100000)\n"
            "  --until-tick N  ticks to run (default 600)\n"
            "  --quiet         no periodic status lines; the final line always prints\n"
            "The last line is `final tick=<N> hash=<16 hex digits>`.\n");
}

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v > max || s[0] == '-') {
        fprintf(stderr, "keel-world: %s needs a number in [0, %" PRIu64 "], got '%s'\n", flag, max, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.seed = 1, .entities = 100000, .until_tick = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(a, v, UINT64_MAX, &o->seed))
                return -1;
            i++;
        } else if (!strcmp(a, "--entities")) {
            if (parse_u64(a, v, 50000000, &n))
                return -1;
            o->entities = (uint32_t)n;
            i++;
        } else if (!strcmp(a, "--until-tick")) {
            if (parse_u64(a, v, UINT64_MAX, &o->until_tick))
                return -1;
            i++;
        } else {
            fprintf(stderr, "keel-world: unknown argument '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "keel-world: %s: %s: %s\n", what, keel_strerror(rc), keel_last_error());
    return rc;
}

static int register_components(world_app *app)
{
    static const keel_field vec_fields[] = {
        {.name = "x", .type = KEEL_F32, .offset = 0},
        {.name = "y", .type = KEEL_F32, .offset = 4},
        {.name = "z", .type = KEEL_F32, .offset = 8},
    };
    static const keel_field energy_fields[] = {{.name = "value", .type = KEEL_U32}};
    int rc = keel_component_register(app->w, &(keel_component_desc){.name = "pos", .size = sizeof(vec3),
                                                                    .fields = vec_fields, .field_count = 3}, &app->pos);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "vel", .size = sizeof(vec3),
                                                                    .fields = vec_fields, .field_count = 3}, &app->vel);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "energy", .size = 4,
                                                                    .discipline = KEEL_SINGLE_VERSION,
                                                                    .fields = energy_fields, .field_count = 1},
                                     &app->energy);
    if (!rc)
        rc = keel_component_register(app->w, &(keel_component_desc){.name = "hungry"}, &app->hungry);
    return check(rc, "registering components");
}

static int spawn_agent(world_app *app)
{
    uint64_t *r = &app->rng;
    vec3 p = {rng_float(r, 0, PLANE), rng_float(r, 0, PLANE), 0};
    vec3 v = {rng_float(r, -5, 5), rng_float(r, -5, 5), 0};
    uint32_t e = 300 + (uint32_t)(rng_next(r) % 900);
    keel_init init[] = {{app->pos, &p}, {app->vel, &v}, {app->energy, &e}};
    return keel_cmd_spawn(app->cmds, init, 3);
}

static float bounce(float *p, float v)
{
    if (*p < 0) {
        *p = -*p;
        return -v;
    }
    if (*p > PLANE) {
        *p = 2 * PLANE - *p;
        return -v;
    }
    return v;
}

static void movement(world_app *app)
{
    keel_iter it;
    keel_query_iter(app->movers, &it);
    while (keel_iter_next(&it)) {
        vec3 *p = KEEL_COLUMN(&it, vec3, 0), *v = KEEL_COLUMN(&it, vec3, 1);
        for (uint32_t i = 0; i < it.count; i++) {
            p[i].x += v[i].x * DT;
            p[i].y += v[i].y * DT;
            v[i].x = bounce(&p[i].x, v[i].x);
            v[i].y = bounce(&p[i].y, v[i].y);
        }
    }
}

/* Energy, hunger and death. Records commands; changes no membership. */
static int metabolism(world_app *app)
{
    keel_iter it;
    keel_query_iter(app->eaters, &it);
    int rc = 0;
    app->deaths = 0;
    while (!rc && keel_iter_next(&it)) {
        uint32_t *e = KEEL_COLUMN(&it, uint32_t, 0);
        for (uint32_t i = 0; !rc && i < it.count; i++) {
            keel_entity ent = it.entities[i];
            int hungry = keel_has(app->w, ent, app->hungry) == 1;
            if (--e[i] == 0) {
                rc = keel_cmd_destroy(app->cmds, ent);
                app->deaths++;
            } else if (hungry && rng_next(&app->rng) % 64 == 0) {
                e[i] += 400;
                rc = keel_cmd_remove(app->cmds, ent, app->hungry);
            } else if (!hungry && e[i] < HUNGER_LINE) {
                rc = keel_cmd_add(app->cmds, ent, app->hungry, NULL);
            }
        }
    }
    return check(rc, "recording metabolism commands");
}

static int births(world_app *app)
{
    uint32_t n = app->deaths + (uint32_t)(rng_next(&app->rng) % 5);
    int rc = 0;
    for (uint32_t i = 0; !rc && i < n; i++)
        rc = spawn_agent(app);
    return check(rc, "recording births");
}

static int step(world_app *app)
{
    movement(app);
    if (metabolism(app) || births(app))
        return -1;
    return check(keel_cmdbuf_apply(app->cmds), "applying the tick's commands") ||
           check(keel_cmdbuf_reset(app->cmds), "resetting the command buffer");
}

static int setup(world_app *app, const options *o)
{
    app->rng = o->seed;
    if (check(keel_world_create(NULL, &app->w), "creating the world") || register_components(app))
        return -1;
    keel_world_freeze(app->w);
    int rc = keel_cmdbuf_create(app->w, &app->cmds);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->pos, app->vel}}, &app->movers);
    if (!rc)
        rc = keel_query_create(app->w, &(keel_query_desc){.with = {app->energy}}, &app->eaters);
    for (uint32_t i = 0; !rc && i < o->entities; i++)
        rc = spawn_agent(app);
    if (!rc)
        rc = keel_cmdbuf_apply(app->cmds);
    if (!rc)
        rc = keel_cmdbuf_reset(app->cmds);
    return check(rc, "building the initial world");
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    world_app app = {0};
    int status = setup(&app, &o) ? 1 : 0;
    uint64_t tick = 0;
    double t0 = now_ms();
    while (!status && tick < o.until_tick) {
        if (step(&app)) {
            status = 1;
            break;
        }
        tick++;
        if (!o.quiet && tick % 100 == 0)
            printf("tick=%" PRIu64 " entities=%u ms/tick=%.3f\n", tick, keel_world_count(app.w),
                   (now_ms() - t0) / (double)tick);
    }
    if (!status)
        printf("final tick=%" PRIu64 " hash=%016" PRIx64 "\n", tick, keel_world_hash(app.w));
    keel_query_destroy(app.movers);
    keel_query_destroy(app.eaters);
    keel_cmdbuf_destroy(app.cmds);
    keel_world_destroy(app.w);
    return status;
}
