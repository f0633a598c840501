/*
 * test_command.c -- deferred structural changes (keel/command.h, docs/world.md):
 * recording and its validation, FIFO playback, ignored commands, the failure
 * policy (applied prefix stays, failed command and suffix stay pending, retry
 * and discard) and receipts/counters.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "world/world_internal.h"

/* ---- fixture: a world with four component types ------------------------- */

typedef struct pos_t {
    int32_t x, y;
} pos_t;

typedef struct vel_t {
    int32_t dx, dy;
} vel_t;

static const keel_field pos_fields[] = {
    {.name = "x", .type = KEEL_I32, .offset = 0, .count = 0},
    {.name = "y", .type = KEEL_I32, .offset = 4, .count = 0},
};
static const keel_field vel_fields[] = {
    {.name = "dx", .type = KEEL_I32, .offset = 0, .count = 0},
    {.name = "dy", .type = KEEL_I32, .offset = 4, .count = 0},
};
static const keel_field hp_fields[] = {
    {.name = "hp", .type = KEEL_U64, .offset = 0, .count = 0},
};

enum { POS = 1, VEL = 2, HP = 3, TAG = 4, NCOMPS = 4 };

static keel_world *make_world_max(uint32_t max_entities)
{
    keel_world *w = tu_world_new((keel_world_desc){.chunk_rows = 16, .max_entities = max_entities});

    keel_component c = 0;
    keel_component_desc pos = {.name = "pos", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(w, &pos, &c));
    ck_assert_uint_eq(c, POS);
    keel_component_desc vel = {.name = "vel", .size = sizeof(vel_t), .fields = vel_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(w, &vel, &c));
    ck_assert_uint_eq(c, VEL);
    keel_component_desc hp = {.name = "hp", .size = sizeof(uint64_t), .fields = hp_fields, .field_count = 1};
    ck_assert_ok(keel_component_register(w, &hp, &c));
    ck_assert_uint_eq(c, HP);
    keel_component_desc tag = {.name = "tag", .size = 0};
    ck_assert_ok(keel_component_register(w, &tag, &c));
    ck_assert_uint_eq(c, TAG);
    ck_assert_uint_eq(keel_component_count(w), NCOMPS);
    return w;
}

static keel_world *make_world(void)
{
    return make_world_max(0);
}

/* keel_cmdbuf_apply(cb) that must succeed; its result. */
static keel_cmd_result apply_ok(keel_cmdbuf *cb)
{
    ck_assert_ok(keel_cmdbuf_apply(cb));
    return keel_cmdbuf_result(cb);
}

/* The buffer before its world: destroying it updates the world's pending count. */
static void destroy_buf_and_world(keel_cmdbuf *cb, keel_world *w)
{
    keel_cmdbuf_destroy(cb);
    keel_world_destroy(w);
}

/* Record a spawn with a pos value (and optionally a vel / hp). */
static void rec_spawn_pos(keel_cmdbuf *cb, int32_t x, int32_t y)
{
    pos_t p = {x, y};
    keel_init in[1] = {{POS, &p}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 1));
}

static void rec_spawn_pos_hp(keel_cmdbuf *cb, int32_t x, int32_t y, uint64_t hp)
{
    pos_t p = {x, y};
    keel_init in[2] = {{POS, &p}, {HP, &hp}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 2));
}

/* Spawn one entity with pos (x, y) through a temporary buffer; return it. */
static keel_entity spawn_pos(keel_world *w, int32_t x, int32_t y)
{
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, x, y);
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_ptr_nonnull(r.created);
    keel_entity e = r.created[0];
    keel_cmdbuf_destroy(cb);
    ck_assert(keel_alive(w, e));
    return e;
}

static pos_t get_pos(keel_world *w, keel_entity e)
{
    pos_t p = {-1, -1};
    ck_assert_ok(keel_get(w, e, POS, &p));
    return p;
}

static void assert_pos(keel_world *w, keel_entity e, int32_t x, int32_t y)
{
    pos_t p = get_pos(w, e);
    ck_assert_int_eq(p.x, x);
    ck_assert_int_eq(p.y, y);
}

static void assert_vel(keel_world *w, keel_entity e, int32_t dx, int32_t dy)
{
    vel_t v = {-1, -1};
    ck_assert_ok(keel_get(w, e, VEL, &v));
    ck_assert_int_eq(v.dx, dx);
    ck_assert_int_eq(v.dy, dy);
}

static void assert_hp(keel_world *w, keel_entity e, uint64_t hp)
{
    uint64_t v = 0xdeadbeef;
    ck_assert_ok(keel_get(w, e, HP, &v));
    ck_assert_uint_eq(v, hp);
}

static uint32_t query_count(keel_world *w, keel_component with1, keel_component with2, keel_component without1)
{
    keel_query_desc d;
    memset(&d, 0, sizeof d);
    d.with[0] = with1;
    d.with[1] = with2;
    d.without[0] = without1;
    keel_query *q = NULL;
    ck_assert_ok(keel_query_create(w, &d, &q));
    uint32_t n = keel_query_count(q);
    keel_query_destroy(q);
    return n;
}

static void assert_counters(keel_cmd_result r, uint32_t spawned, uint32_t destroyed, uint32_t added,
                            uint32_t removed, uint32_t ign_null, uint32_t ign_stale, uint32_t ign_absent,
                            uint32_t pending)
{
    ck_assert_uint_eq(r.spawned, spawned);
    ck_assert_uint_eq(r.destroyed, destroyed);
    ck_assert_uint_eq(r.added, added);
    ck_assert_uint_eq(r.removed, removed);
    ck_assert_uint_eq(r.ignored_null, ign_null);
    ck_assert_uint_eq(r.ignored_stale, ign_stale);
    ck_assert_uint_eq(r.ignored_absent, ign_absent);
    ck_assert_uint_eq(r.pending, pending);
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i]) {
            char a = p[i], b = needle[i];
            if (a >= 'A' && a <= 'Z')
                a = (char)(a - 'A' + 'a');
            if (b >= 'A' && b <= 'Z')
                b = (char)(b - 'A' + 'a');
            if (a != b)
                break;
            i++;
        }
        if (i == n)
            return true;
    }
    return false;
}

/* ======================================================================== */
/* cmd_record                                                                */
/* ======================================================================== */

START_TEST(record_create_args)
{
    keel_cmdbuf *cb = (keel_cmdbuf *)0x1;
    ck_assert_rc(keel_cmdbuf_create(NULL, &cb), KEEL_EINVAL);
    keel_cmdbuf_destroy(NULL); /* ignored */

    keel_world *w = make_world();
    cb = tu_cmdbuf_new(w);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 0);
    ck_assert_uint_eq(keel_world_pending(w), 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_unknown_component)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 2);
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    pos_t p = {5, 6};

    /* one valid command first, so "unchanged" means 1 */
    rec_spawn_pos(cb, 7, 8);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 1);

    keel_init bad0[1] = {{0, &p}};
    ck_assert_rc(keel_cmd_spawn(cb, bad0, 1), KEEL_EINVAL);
    keel_init bad_hi[1] = {{NCOMPS + 1, &p}};
    ck_assert_rc(keel_cmd_spawn(cb, bad_hi, 1), KEEL_EINVAL);
    keel_init bad_max[1] = {{KEEL_MAX_COMPONENTS + 1, &p}};
    ck_assert_rc(keel_cmd_spawn(cb, bad_max, 1), KEEL_EINVAL);
    /* a bad id after a good one: the whole spawn is refused */
    keel_init bad_second[2] = {{POS, &p}, {NCOMPS + 1, NULL}};
    ck_assert_rc(keel_cmd_spawn(cb, bad_second, 2), KEEL_EINVAL);

    ck_assert_rc(keel_cmd_add(cb, a, 0, &p), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_add(cb, a, NCOMPS + 1, &p), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_add(cb, KEEL_ENTITY_NULL, NCOMPS + 1, &p), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_remove(cb, a, 0), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_remove(cb, a, NCOMPS + 1), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_remove(cb, a, KEEL_MAX_COMPONENTS + 1), KEEL_EINVAL);
    ck_assert_str_ne(keel_last_error(), "");

    keel_cmd_result r = keel_cmdbuf_result(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, 1);
    ck_assert_uint_eq(keel_world_count(w), 1);
    ck_assert_uint_eq(keel_world_hash(w), h0);

    /* applying creates only the one valid spawn; a is untouched */
    r = apply_ok(cb);
    assert_counters(r, 1, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(keel_world_count(w), 2);
    assert_pos(w, r.created[0], 7, 8);
    assert_pos(w, a, 1, 2);
    ck_assert_int_eq(keel_has(w, a, VEL), 0);
    ck_assert_int_eq(keel_has(w, a, HP), 0);
    ck_assert_int_eq(keel_has(w, a, TAG), 0);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_repeated_component)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    pos_t p = {1, 1}, q = {2, 2};
    uint64_t hp = 9;

    keel_init rep[2] = {{POS, &p}, {POS, &q}};
    ck_assert_rc(keel_cmd_spawn(cb, rep, 2), KEEL_EINVAL);
    keel_init rep3[3] = {{POS, &p}, {HP, &hp}, {POS, &q}};
    ck_assert_rc(keel_cmd_spawn(cb, rep3, 3), KEEL_EINVAL);
    keel_init reptag[2] = {{TAG, NULL}, {TAG, NULL}};
    ck_assert_rc(keel_cmd_spawn(cb, reptag, 2), KEEL_EINVAL);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 0);

    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 0);
    ck_assert_uint_eq(keel_world_count(w), 0);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_null_inits)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);

    ck_assert_rc(keel_cmd_spawn(cb, NULL, 1), KEEL_EINVAL);
    ck_assert_rc(keel_cmd_spawn(cb, NULL, 3), KEEL_EINVAL);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 0);

    /* more inits than there can be components */
    static keel_init many[KEEL_MAX_COMPONENTS + 1];
    for (uint32_t i = 0; i < KEEL_MAX_COMPONENTS + 1; i++) {
        many[i].c = (keel_component)(i % NCOMPS) + 1;
        many[i].value = NULL;
    }
    ck_assert_rc(keel_cmd_spawn(cb, many, KEEL_MAX_COMPONENTS + 1), KEEL_EINVAL);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 0);

    /* NULL inits with n == 0 is fine: an entity without components */
    ck_assert_ok(keel_cmd_spawn(cb, NULL, 0));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 1);
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(r.spawned, 1);
    ck_assert_uint_eq(keel_world_count(w), 1);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_does_not_touch_world)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 2);
    keel_entity b = spawn_pos(w, 3, 4);
    uint32_t n0 = keel_world_count(w);
    uint64_t h0 = keel_world_hash(w);
    uint32_t qpos = query_count(w, POS, 0, 0);

    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, 5, 6);
    rec_spawn_pos_hp(cb, 7, 8, 9);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    vel_t v = {1, 1};
    ck_assert_ok(keel_cmd_add(cb, b, VEL, &v));
    ck_assert_ok(keel_cmd_remove(cb, b, POS));
    ck_assert_ok(keel_cmd_add(cb, b, TAG, NULL));

    /* nothing visible yet */
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 6);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, 0);
    ck_assert_uint_eq(keel_world_count(w), n0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    ck_assert(keel_alive(w, a));
    assert_pos(w, a, 1, 2);
    assert_pos(w, b, 3, 4);
    ck_assert_int_eq(keel_has(w, b, VEL), 0);
    ck_assert_int_eq(keel_has(w, b, TAG), 0);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), qpos);
    ck_assert_uint_eq(keel_world_pending(w), 0);

    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_world_count(w), n0 + 1);
    ck_assert_uint_ne(keel_world_hash(w), h0);
    ck_assert(!keel_alive(w, a));
    ck_assert_int_eq(keel_has(w, b, POS), 0);
    ck_assert_int_eq(keel_has(w, b, VEL), 1);
    ck_assert_int_eq(keel_has(w, b, TAG), 1);
    assert_vel(w, b, 1, 1);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_values_copied)
{
    /* values are copied at record time: changing the caller's memory before
     * playback does not change what is applied */
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 0, 0);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);

    pos_t p = {11, 12};
    uint64_t hp = 13;
    keel_init in[2] = {{POS, &p}, {HP, &hp}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 2));
    vel_t v = {21, 22};
    ck_assert_ok(keel_cmd_add(cb, a, VEL, &v));
    p.x = p.y = -99;
    hp = 999;
    v.dx = v.dy = -99;
    in[0].c = VEL; /* the init array is copied too */

    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 1);
    assert_pos(w, r.created[0], 11, 12);
    assert_hp(w, r.created[0], 13);
    ck_assert_int_eq(keel_has(w, r.created[0], VEL), 0);
    assert_vel(w, a, 21, 22);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_spawn_empty_and_zero_fill)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    keel_init none[1] = {{POS, NULL}};
    ck_assert_ok(keel_cmd_spawn(cb, none, 0)); /* n == 0: inits not read */
    keel_init zf[3] = {{POS, NULL}, {HP, NULL}, {TAG, NULL}};
    ck_assert_ok(keel_cmd_spawn(cb, zf, 3));
    int junk = 77;
    keel_init tagval[1] = {{TAG, &junk}}; /* value of a tag is ignored */
    ck_assert_ok(keel_cmd_spawn(cb, tagval, 1));
    ck_assert_ok(keel_cmdbuf_apply(cb));

    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.created_count, 3);
    ck_assert_uint_eq(r.spawned, 3);
    keel_entity e0 = r.created[0], e1 = r.created[1], e2 = r.created[2];
    ck_assert(keel_alive(w, e0));
    for (keel_component c = 1; c <= NCOMPS; c++)
        ck_assert_int_eq(keel_has(w, e0, c), 0);
    pos_t p;
    ck_assert_rc(keel_get(w, e0, POS, &p), KEEL_ENOENT);

    assert_pos(w, e1, 0, 0);
    assert_hp(w, e1, 0);
    ck_assert_int_eq(keel_has(w, e1, TAG), 1);
    ck_assert_int_eq(keel_has(w, e1, VEL), 0);

    ck_assert_int_eq(keel_has(w, e2, TAG), 1);
    ck_assert_int_eq(keel_has(w, e2, POS), 0);
    ck_assert_uint_eq(keel_world_count(w), 3);

    /* the component-less entity is a real entity: it can be destroyed */
    tu_destroy_now(w, e0);
    ck_assert_uint_eq(keel_world_count(w), 2);

    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(record_discard_unapplied)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, 2, 2);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 2);
    keel_cmdbuf_discard(cb);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 0);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    assert_counters(keel_cmdbuf_result(cb), 0, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    ck_assert(keel_alive(w, a));
    keel_cmdbuf_discard(cb); /* on an empty buffer: no-op */
    ck_assert_uint_eq(keel_world_pending(w), 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

/* A buffer is idle (the sync point skips it) exactly while it has neither a
 * queued command nor an applied one since its last reset: its result is
 * then all zeros. */
START_TEST(record_idle_until_used_and_after_reset)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert(cmdbuf_idle(cb));
    rec_spawn_pos(cb, 1, 1);
    ck_assert(!cmdbuf_idle(cb)); /* queued */
    keel_cmdbuf_discard(cb);
    ck_assert(cmdbuf_idle(cb));
    rec_spawn_pos(cb, 2, 2);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert(!cmdbuf_idle(cb)); /* applied: its result counts a spawn until the reset */
    ck_assert_uint_eq(keel_cmdbuf_result(cb).spawned, 1);
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert(cmdbuf_idle(cb));
    assert_counters(keel_cmdbuf_result(cb), 0, 0, 0, 0, 0, 0, 0, 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

/* ======================================================================== */
/* cmd_playback                                                              */
/* ======================================================================== */

START_TEST(playback_fifo_receipts)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    for (int32_t i = 0; i < 5; i++)
        rec_spawn_pos_hp(cb, i, 100 + i, (uint64_t)(1000 + i));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 5, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 5);
    for (uint32_t i = 0; i < 5; i++) {
        /* fresh world: lowest free index first, generation 1 */
        ck_assert_uint_eq(r.created[i], KEEL_ENTITY_MAKE(i, 1));
        ck_assert(keel_alive(w, r.created[i]));
        assert_pos(w, r.created[i], (int32_t)i, 100 + (int32_t)i);
        assert_hp(w, r.created[i], 1000 + i);
    }
    ck_assert_uint_eq(keel_world_count(w), 5);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_fifo_order_matters)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_entity b = spawn_pos(w, 2, 2);
    keel_entity c = spawn_pos(w, 3, 3);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    uint64_t h1 = 1, h2 = 2, h3 = 3;
    /* a: add then remove -> lacks HP */
    ck_assert_ok(keel_cmd_add(cb, a, HP, &h1));
    ck_assert_ok(keel_cmd_remove(cb, a, HP));
    /* b: remove (absent, ignored) then add -> has HP */
    ck_assert_ok(keel_cmd_remove(cb, b, HP));
    ck_assert_ok(keel_cmd_add(cb, b, HP, &h2));
    /* c: add 1, add 3 -> last one wins */
    ck_assert_ok(keel_cmd_add(cb, c, HP, &h1));
    ck_assert_ok(keel_cmd_add(cb, c, HP, &h3));
    ck_assert_ok(keel_cmdbuf_apply(cb));

    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.removed, 1);
    ck_assert_uint_eq(r.ignored_absent, 1);
    ck_assert_uint_eq(r.ignored_null, 0);
    ck_assert_uint_eq(r.ignored_stale, 0);
    ck_assert_uint_eq(r.pending, 0);
    ck_assert_int_eq(keel_has(w, a, HP), 0);
    assert_hp(w, b, 2);
    assert_hp(w, c, 3);
    assert_pos(w, a, 1, 1);
    assert_pos(w, b, 2, 2);
    assert_pos(w, c, 3, 3);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_add_remove_moves)
{
    keel_world *w = make_world();
    keel_entity e[6];
    for (int32_t i = 0; i < 6; i++)
        e[i] = spawn_pos(w, i, -i);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), 6);
    ck_assert_uint_eq(query_count(w, POS, VEL, 0), 0);

    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    /* add vel to e1, e3 (moving rows out of the middle of the pos table) */
    vel_t v1 = {10, 11}, v3 = {30, 31};
    ck_assert_ok(keel_cmd_add(cb, e[1], VEL, &v1));
    ck_assert_ok(keel_cmd_add(cb, e[3], VEL, &v3));
    ck_assert_ok(keel_cmd_add(cb, e[0], TAG, NULL));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 3, 0, 0, 0, 0, 0);

    ck_assert_uint_eq(query_count(w, POS, VEL, 0), 2);
    ck_assert_uint_eq(query_count(w, POS, 0, VEL), 4);
    ck_assert_uint_eq(query_count(w, TAG, 0, 0), 1);
    for (int32_t i = 0; i < 6; i++)
        assert_pos(w, e[i], i, -i); /* values kept, also of rows swapped into holes */
    assert_vel(w, e[1], 10, 11);
    assert_vel(w, e[3], 30, 31);
    ck_assert_int_eq(keel_has(w, e[0], TAG), 1);
    ck_assert_int_eq(keel_has(w, e[2], VEL), 0);

    /* remove pos from e1: keeps vel; remove vel from e3: keeps pos */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_ok(keel_cmd_remove(cb, e[1], POS));
    ck_assert_ok(keel_cmd_remove(cb, e[3], VEL));
    ck_assert_ok(keel_cmd_remove(cb, e[0], TAG));
    r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 3, 0, 0, 0, 0);

    ck_assert_int_eq(keel_has(w, e[1], POS), 0);
    assert_vel(w, e[1], 10, 11);
    ck_assert_int_eq(keel_has(w, e[3], VEL), 0);
    assert_pos(w, e[3], 3, -3);
    ck_assert_int_eq(keel_has(w, e[0], TAG), 0);
    ck_assert_uint_eq(query_count(w, POS, VEL, 0), 0);
    ck_assert_uint_eq(query_count(w, VEL, 0, 0), 1);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), 5);
    for (int32_t i = 0; i < 6; i++) {
        ck_assert(keel_alive(w, e[i]));
        if (i != 1)
            assert_pos(w, e[i], i, -i);
    }

    /* removing the last component leaves a live component-less entity */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_ok(keel_cmd_remove(cb, e[1], VEL));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert(keel_alive(w, e[1]));
    for (keel_component c = 1; c <= NCOMPS; c++)
        ck_assert_int_eq(keel_has(w, e[1], c), 0);
    ck_assert_uint_eq(keel_world_count(w), 6);

    destroy_buf_and_world(cb, w);
}
END_TEST

/* Spawns of alternating component sets in one buffer, and moves between
 * them: playback compares a command's set with the table the last command
 * found before it hashes, so every entity must land in its own set's table,
 * with its own values, whatever the set before it. */
START_TEST(playback_alternating_sets)
{
    keel_world *w = make_world();
    keel_entity old = spawn_pos(w, -1, -1);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    for (int32_t i = 0; i < 12; i++) {
        if (i % 3 == 0) {
            rec_spawn_pos(cb, i, 10 * i);
        } else if (i % 3 == 1) {
            rec_spawn_pos_hp(cb, i, 10 * i, (uint64_t)(100 + i));
        } else {
            pos_t p = {i, 10 * i};
            vel_t v = {i, -i};
            keel_init in[2] = {{VEL, &v}, {POS, &p}}; /* the set, not the order, names the table */
            ck_assert_ok(keel_cmd_spawn(cb, in, 2));
        }
        if (i == 4) { /* a move between spawns: the pos table, then pos+hp */
            uint64_t hp = 7;
            ck_assert_ok(keel_cmd_add(cb, old, HP, &hp));
        }
    }
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 12);
    for (int32_t i = 0; i < 12; i++) {
        keel_entity e = r.created[i];
        assert_pos(w, e, i, 10 * i);
        ck_assert_int_eq(keel_has(w, e, HP), i % 3 == 1);
        ck_assert_int_eq(keel_has(w, e, VEL), i % 3 == 2);
        if (i % 3 == 1)
            assert_hp(w, e, (uint64_t)(100 + i));
        if (i % 3 == 2)
            assert_vel(w, e, i, -i);
    }
    assert_pos(w, old, -1, -1);
    assert_hp(w, old, 7);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), 13);
    ck_assert_uint_eq(query_count(w, POS, HP, 0), 5);
    ck_assert_uint_eq(query_count(w, POS, VEL, 0), 4);
    ck_assert_uint_eq(query_count(w, POS, 0, HP), 8);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_add_overwrites)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 2);
    keel_entity b = spawn_pos(w, 3, 4);
    uint32_t npos = query_count(w, POS, 0, 0);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    pos_t np = {50, 60};
    ck_assert_ok(keel_cmd_add(cb, a, POS, &np));
    ck_assert_ok(keel_cmd_add(cb, b, POS, NULL)); /* NULL = zero-filled */
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.ignored_absent, 0);
    ck_assert_uint_eq(r.ignored_stale, 0);
    ck_assert_uint_eq(r.ignored_null, 0);
    ck_assert_uint_eq(r.removed, 0);
    ck_assert_uint_eq(r.pending, 0);
    assert_pos(w, a, 50, 60);
    assert_pos(w, b, 0, 0);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), npos);
    ck_assert_int_eq(keel_has(w, a, VEL), 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_destroy_then_spawn_reuses)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_entity other = spawn_pos(w, 2, 2);
    ck_assert_uint_eq(KEEL_ENTITY_INDEX(a), 0);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    rec_spawn_pos(cb, 9, 9);
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 1, 1, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 1);
    keel_entity b = r.created[0];
    ck_assert_uint_eq(KEEL_ENTITY_INDEX(b), KEEL_ENTITY_INDEX(a));
    ck_assert_uint_eq(KEEL_ENTITY_GEN(b), KEEL_ENTITY_GEN(a) + 1);
    ck_assert(!keel_alive(w, a));
    ck_assert(keel_alive(w, b));
    assert_pos(w, b, 9, 9);
    assert_pos(w, other, 2, 2);
    ck_assert_rc(keel_get(w, a, POS, &(pos_t){0, 0}), KEEL_ESTALE);
    ck_assert_uint_eq(keel_world_count(w), 2);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_spawn_then_destroy_no_reuse)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, 9, 9);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 1, 1, 0, 0, 0, 0, 0, 0);
    keel_entity b = r.created[0];
    ck_assert_uint_ne(KEEL_ENTITY_INDEX(b), KEEL_ENTITY_INDEX(a));
    ck_assert_uint_eq(b, KEEL_ENTITY_MAKE(1, 1));
    ck_assert(!keel_alive(w, a));
    ck_assert(keel_alive(w, b));
    assert_pos(w, b, 9, 9);
    ck_assert_uint_eq(keel_world_count(w), 1);

    /* a later spawn does take the freed slot, with the next generation */
    keel_entity c = spawn_pos(w, 3, 3);
    ck_assert_uint_eq(c, KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(a), KEEL_ENTITY_GEN(a) + 1));
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_empty_noop)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 4, 4);
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    ck_assert_uint_eq(keel_world_count(w), 1);
    ck_assert_uint_eq(keel_world_pending(w), 0);
    assert_pos(w, a, 4, 4);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(playback_destroy_clears)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos_hp(cb, 1, 1, 1);
    rec_spawn_pos_hp(cb, 2, 2, 2);
    rec_spawn_pos_hp(cb, 3, 3, 3);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_entity e[3];
    memcpy(e, keel_cmdbuf_result(cb).created, sizeof e);
    uint64_t h3 = keel_world_hash(w);
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_ok(keel_cmd_destroy(cb, e[0]));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_ne(keel_world_hash(w), h3);
    ck_assert(!keel_alive(w, e[0]));
    ck_assert_rc(keel_has(w, e[0], POS), KEEL_ESTALE);
    ck_assert_uint_eq(query_count(w, POS, HP, 0), 2);
    assert_pos(w, e[1], 2, 2);
    assert_pos(w, e[2], 3, 3);
    assert_hp(w, e[1], 2);
    assert_hp(w, e[2], 3);
    destroy_buf_and_world(cb, w);
}
END_TEST

#define MANY 10000u

START_TEST(playback_many)
{
    keel_world *w = make_world();
    uint64_t h_empty = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    for (uint32_t i = 0; i < MANY; i++)
        rec_spawn_pos_hp(cb, (int32_t)i, -(int32_t)i, i * 3u);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, MANY);
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, MANY, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, MANY);
    ck_assert_uint_eq(keel_world_count(w), MANY);
    ck_assert_uint_eq(query_count(w, POS, HP, 0), MANY);

    static keel_entity ents[MANY];
    memcpy(ents, r.created, sizeof ents);
    for (uint32_t i = 0; i < MANY; i++) {
        ck_assert_uint_eq(ents[i], KEEL_ENTITY_MAKE(i, 1));
        pos_t p = get_pos(w, ents[i]);
        ck_assert_int_eq(p.x, (int32_t)i);
        ck_assert_int_eq(p.y, -(int32_t)i);
        assert_hp(w, ents[i], i * 3u);
    }
    uint64_t h_full = keel_world_hash(w);
    ck_assert_uint_ne(h_full, h_empty);

    /* destroy every other one, then the rest (in reverse) */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    for (uint32_t i = 0; i < MANY; i += 2)
        ck_assert_ok(keel_cmd_destroy(cb, ents[i]));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_world_count(w), MANY / 2);
    for (uint32_t i = 1; i < MANY; i += 2) {
        pos_t p = get_pos(w, ents[i]);
        ck_assert_int_eq(p.x, (int32_t)i);
        ck_assert(!keel_alive(w, ents[i - 1]));
    }
    for (uint32_t i = MANY; i-- > 0;)
        if (i & 1)
            ck_assert_ok(keel_cmd_destroy(cb, ents[i]));
    r = apply_ok(cb);
    assert_counters(r, 0, MANY, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(keel_world_count(w), 0);
    ck_assert_uint_eq(query_count(w, POS, 0, 0), 0);

    /* spawn them again: every slot reused with generation 2, lowest first */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    for (uint32_t i = 0; i < MANY; i++)
        rec_spawn_pos_hp(cb, (int32_t)i, -(int32_t)i, i * 3u);
    r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, MANY);
    for (uint32_t i = 0; i < MANY; i++)
        ck_assert_uint_eq(r.created[i], KEEL_ENTITY_MAKE(i, 2));
    ck_assert_uint_eq(keel_world_count(w), MANY);
    ck_assert_uint_ne(keel_world_hash(w), h_full); /* generations differ */
    assert_pos(w, r.created[MANY - 1], (int32_t)MANY - 1, -(int32_t)(MANY - 1));
    destroy_buf_and_world(cb, w);
}
END_TEST

/* ---- batched playback equals one command at a time ----------------------
 * Playback prefetches what the next commands will touch in batches
 * (command.c); that must never change what it does. One world applies a
 * long mixed buffer (shuffled destroys, adds, removes, spawns into freed
 * slots, stale and null targets) in one apply, the other the same commands
 * one per apply, where no batch ever spans two commands. Receipts, counters,
 * every slot, every table's row order and values, and the handles later
 * spawns get (the free-slot order) must be identical. */

#define EQ_ENTITIES 3000u
#define EQ_COMMANDS 9000u

static uint64_t eq_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Record command number i of the mixed workload, drawn from *rng, into cb;
 * ents holds the handles the populate step created (in both worlds). */
static void eq_record(keel_cmdbuf *cb, uint64_t *rng, const keel_entity *ents, uint32_t i)
{
    uint64_t r = eq_next(rng);
    keel_entity e = ents[(r >> 8) % EQ_ENTITIES];
    switch (r % 16) {
    case 0: { /* spawn: takes the lowest free slot */
        rec_spawn_pos(cb, (int32_t)i, 7);
        break;
    }
    case 1: {
        uint64_t hp = i;
        ck_assert_ok(keel_cmd_add(cb, e, HP, &hp));
        break;
    }
    case 2:
        ck_assert_ok(keel_cmd_remove(cb, e, VEL));
        break;
    case 3:
        ck_assert_ok(keel_cmd_add(cb, e, TAG, NULL));
        break;
    case 4:
        ck_assert_ok(keel_cmd_destroy(cb, KEEL_ENTITY_NULL));
        break;
    default: /* destroys, often of an entity already destroyed (stale) */
        ck_assert_ok(keel_cmd_destroy(cb, e));
        break;
    }
}

static void eq_populate(keel_world *w, keel_entity *ents)
{
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    for (uint32_t i = 0; i < EQ_ENTITIES; i++) {
        pos_t p = {(int32_t)i, -(int32_t)i};
        vel_t v = {(int32_t)(i % 5), 1};
        uint64_t hp = i * 3u;
        keel_init in[3] = {{POS, &p}, {VEL, &v}, {HP, &hp}};
        ck_assert_ok(keel_cmd_spawn(cb, in, i % 3 == 0 ? 3 : 2)); /* two tables */
    }
    ck_assert_ok(keel_cmdbuf_apply(cb));
    memcpy(ents, keel_cmdbuf_result(cb).created, EQ_ENTITIES * sizeof *ents);
    keel_cmdbuf_destroy(cb);
}

/* Two applies' receipts are equal: handles created, and every counter. */
static void eq_assert_same_result(const keel_cmd_result *ra, const keel_cmd_result *rb)
{
    ck_assert_uint_eq(ra->created_count, rb->created_count);
    ck_assert_int_eq(memcmp(ra->created, rb->created, ra->created_count * sizeof *ra->created), 0);
    ck_assert_uint_eq(ra->spawned, rb->spawned);
    ck_assert_uint_eq(ra->destroyed, rb->destroyed);
    ck_assert_uint_eq(ra->added, rb->added);
    ck_assert_uint_eq(ra->removed, rb->removed);
    ck_assert_uint_eq(ra->ignored_null, rb->ignored_null);
    ck_assert_uint_eq(ra->ignored_stale, rb->ignored_stale);
    ck_assert_uint_eq(ra->ignored_absent, rb->ignored_absent);
}

static void eq_assert_same_layout(const keel_world *a, const keel_world *b)
{
    ck_assert_uint_eq(a->nslots, b->nslots);
    ck_assert_uint_eq(a->nlive, b->nlive);
    for (uint32_t i = 0; i < a->nslots; i++) {
        const world_slot *sa = world_slot_at(a, i), *sb = world_slot_at(b, i);
        ck_assert_uint_eq(world_slot_gen(a, sa), world_slot_gen(b, sb));
        ck_assert_uint_eq(sa->table, sb->table);
        ck_assert_uint_eq(sa->row, sb->row); /* a free slot's row is its next generation */
    }
    ck_assert_uint_eq(a->ntables, b->ntables);
    for (uint32_t id = 0; id < a->ntables; id++) {
        const world_table *ta = a->tables[id], *tb = b->tables[id];
        ck_assert(compset_eq(&ta->set, &tb->set));
        ck_assert_uint_eq(ta->count, tb->count);
        for (uint32_t row = 0; row < ta->count; row++) {
            const world_chunk *ca = ta->chunks[row >> a->chunk_shift], *cbk = tb->chunks[row >> b->chunk_shift];
            ck_assert_uint_eq(ca->entities[row & a->chunk_mask], cbk->entities[row & b->chunk_mask]);
            for (uint32_t c = 0; c < ta->ncols; c++)
                if (ta->cols[c].size)
                    ck_assert_int_eq(memcmp(world_cell(a, ta, c, row), world_cell(b, tb, c, row), ta->cols[c].size), 0);
        }
    }
    ck_assert_uint_eq(keel_world_hash(a), keel_world_hash(b));
}

/* The free-slot order: EQ_ENTITIES later spawns get the same handles and
 * layout in both worlds. Then both worlds and their buffers are destroyed. */
static void eq_assert_same_free_order_and_close(keel_world *wa, keel_cmdbuf *ca, keel_world *wb, keel_cmdbuf *cbb)
{
    ck_assert_ok(keel_cmdbuf_reset(ca));
    ck_assert_ok(keel_cmdbuf_reset(cbb));
    for (uint32_t i = 0; i < EQ_ENTITIES; i++) {
        rec_spawn_pos(ca, 1, 2);
        rec_spawn_pos(cbb, 1, 2);
    }
    ck_assert_ok(keel_cmdbuf_apply(ca));
    ck_assert_ok(keel_cmdbuf_apply(cbb));
    ck_assert_int_eq(memcmp(keel_cmdbuf_result(ca).created, keel_cmdbuf_result(cbb).created,
                            EQ_ENTITIES * sizeof(keel_entity)), 0);
    eq_assert_same_layout(wa, wb);
    keel_cmdbuf_destroy(ca);
    destroy_buf_and_world(cbb, wa);
    keel_world_destroy(wb);
}

START_TEST(playback_batched_equals_one_by_one)
{
    keel_world *wa = make_world(), *wb = make_world();
    static keel_entity ents_a[EQ_ENTITIES], ents_b[EQ_ENTITIES];
    eq_populate(wa, ents_a);
    eq_populate(wb, ents_b);
    ck_assert_int_eq(memcmp(ents_a, ents_b, sizeof ents_a), 0);

    keel_cmdbuf *ca = tu_cmdbuf_new(wa), *cbb = tu_cmdbuf_new(wb);
    uint64_t rng_a = 0x9e3779b97f4a7c15ull, rng_b = rng_a;
    for (uint32_t i = 0; i < EQ_COMMANDS; i++)
        eq_record(ca, &rng_a, ents_a, i);
    ck_assert_ok(keel_cmdbuf_apply(ca)); /* batched: all at once */
    for (uint32_t i = 0; i < EQ_COMMANDS; i++) {
        eq_record(cbb, &rng_b, ents_b, i);
        ck_assert_ok(keel_cmdbuf_apply(cbb)); /* one at a time */
    }

    keel_cmd_result ra = keel_cmdbuf_result(ca), rb = keel_cmdbuf_result(cbb);
    eq_assert_same_result(&ra, &rb);
    ck_assert_uint_gt(ra.destroyed, EQ_ENTITIES / 2); /* the workload did destroy in bulk */
    ck_assert_uint_gt(ra.ignored_stale, 0);
    eq_assert_same_layout(wa, wb);

    eq_assert_same_free_order_and_close(wa, ca, wb, cbb);
}
END_TEST

/* Runs of destroys (world/command.c, "batched destroy": a run of at least
 * 16 consecutive destroys is replayed on slots and entity arrays, its cells
 * copied at the end). Segments of each kind, between a few adds, removes and
 * spawns: shuffled runs spanning many chunks of both tables, with repeats
 * (stale destroys, and destroys of entities moved earlier in the run), null
 * targets; a run that empties the three-component table; runs longer than
 * the table they hit. Applied at once in one world, one command per apply
 * in the other, with a lifecycle log attached to both: everything, the log
 * bytes included, must be identical. */
/* After each recorded command: apply it at once when `each` (one by one). */
static void runs_next(keel_cmdbuf *cb, bool each)
{
    if (each)
        ck_assert_ok(keel_cmdbuf_apply(cb));
}

static void runs_record(keel_cmdbuf *cb, uint64_t *rng, const keel_entity *ents, uint32_t seg, bool each)
{
    if (seg == 5) { /* empty the three-component table (i % 3 == 0), in a shuffled order */
        for (uint32_t k = 0; k < EQ_ENTITIES / 3; k++) {
            uint32_t j = (uint32_t)((eq_next(rng) >> 8) % (EQ_ENTITIES / 3));
            ck_assert_ok(keel_cmd_destroy(cb, ents[3 * j]));
            runs_next(cb, each);
        }
        for (uint32_t j = 0; j < EQ_ENTITIES / 3; j++) {
            ck_assert_ok(keel_cmd_destroy(cb, ents[3 * j]));
            runs_next(cb, each);
        }
        return;
    }
    uint32_t len = 16 + (uint32_t)(eq_next(rng) % 400);
    for (uint32_t k = 0; k < len; k++) {
        uint64_t r = eq_next(rng);
        keel_entity e = r % 29 == 0 ? KEEL_ENTITY_NULL : ents[(r >> 8) % EQ_ENTITIES];
        ck_assert_ok(keel_cmd_destroy(cb, e));
        runs_next(cb, each);
    }
    for (uint32_t k = 0; k < 6; k++) { /* a few mixed commands between runs */
        eq_record(cb, rng, ents, seg * 100 + k);
        runs_next(cb, each);
    }
    rec_spawn_pos(cb, (int32_t)seg, 1);
    runs_next(cb, each);
}

START_TEST(playback_destroy_runs_equal_one_by_one)
{
    keel_world *wa = make_world(), *wb = make_world();
    static keel_entity ents_a[EQ_ENTITIES], ents_b[EQ_ENTITIES];
    eq_populate(wa, ents_a);
    eq_populate(wb, ents_b);
    world_lifecycle_log la = {0}, lb = {0};
    wa->lifecycle = &la;
    wb->lifecycle = &lb;

    keel_cmdbuf *ca = tu_cmdbuf_new(wa), *cbb = tu_cmdbuf_new(wb);
    uint64_t rng_a = 0x243f6a8885a308d3ull, rng_b = rng_a;
    for (uint32_t seg = 0; seg < 12; seg++)
        runs_record(ca, &rng_a, ents_a, seg, false);
    ck_assert_ok(keel_cmdbuf_apply(ca)); /* batched: all at once */
    for (uint32_t seg = 0; seg < 12; seg++)
        runs_record(cbb, &rng_b, ents_b, seg, true); /* one at a time */

    keel_cmd_result ra = keel_cmdbuf_result(ca), rb = keel_cmdbuf_result(cbb);
    eq_assert_same_result(&ra, &rb);
    ck_assert_uint_gt(ra.destroyed, EQ_ENTITIES / 2);
    ck_assert_uint_gt(ra.ignored_stale, 0);
    ck_assert_uint_gt(ra.ignored_null, 0);
    ck_assert_uint_eq(wa->mutations, wb->mutations);
    ck_assert_uint_eq(la.count, lb.count);
    ck_assert_uint_eq(la.len, lb.len);
    for (size_t k = 0; k < la.len; k++)
        ck_assert_msg(la.buf[k] == lb.buf[k], "lifecycle logs differ at byte %zu of %zu", k, la.len);
    uint32_t empty = 0;
    for (uint32_t id = 0; id < wa->ntables; id++) {
        empty += wa->tables[id]->count == 0;
        ck_assert_uint_eq(wa->tables[id]->nchunks, wb->tables[id]->nchunks); /* the same chunks freed */
    }
    ck_assert_uint_gt(empty, 0); /* segment 5 emptied a table */
    eq_assert_same_layout(wa, wb);
    wa->lifecycle = wb->lifecycle = NULL;
    free(la.buf);
    free(lb.buf);

    eq_assert_same_free_order_and_close(wa, ca, wb, cbb);
}
END_TEST

START_TEST(playback_hash_history_independent)
{
    /* an entity that moved out of a table and back hashes like one that never
     * moved; the buffer's path does not matter, only the resulting state */
    keel_world *w1 = make_world();
    keel_world *w2 = make_world();
    keel_entity a1 = spawn_pos(w1, 1, 2);
    keel_entity a2 = spawn_pos(w2, 1, 2);
    ck_assert_uint_eq(a1, a2);
    ck_assert_uint_eq(keel_world_hash(w1), keel_world_hash(w2));
    keel_cmdbuf *cb = tu_cmdbuf_new(w1);
    vel_t v = {5, 5};
    ck_assert_ok(keel_cmd_add(cb, a1, VEL, &v));
    ck_assert_ok(keel_cmd_add(cb, a1, TAG, NULL));
    ck_assert_ok(keel_cmd_remove(cb, a1, VEL));
    ck_assert_ok(keel_cmd_remove(cb, a1, TAG));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    assert_counters(keel_cmdbuf_result(cb), 0, 0, 2, 2, 0, 0, 0, 0);
    ck_assert_uint_eq(keel_world_hash(w1), keel_world_hash(w2));
    assert_pos(w1, a1, 1, 2);
    destroy_buf_and_world(cb, w1);
    keel_world_destroy(w2);
}
END_TEST

/* ======================================================================== */
/* cmd_ignored                                                               */
/* ======================================================================== */

START_TEST(ignored_double_destroy)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_entity b = spawn_pos(w, 2, 2);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    ck_assert_ok(keel_cmd_destroy(cb, a));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 1, 0, 0, 0, 1, 0, 0);
    ck_assert(!keel_alive(w, a));
    ck_assert(keel_alive(w, b));
    assert_pos(w, b, 2, 2);
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_double_destroy_occupant_safe)
{
    /* destroy A, spawn C (takes A's slot), destroy A again: C survives */
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    rec_spawn_pos(cb, 7, 7);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    pos_t p = {-5, -5};
    ck_assert_ok(keel_cmd_add(cb, a, POS, &p));
    ck_assert_ok(keel_cmd_remove(cb, a, POS));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 1, 1, 0, 0, 0, 3, 0, 0);
    ck_assert_uint_eq(r.created_count, 1);
    keel_entity c = r.created[0];
    ck_assert_uint_eq(KEEL_ENTITY_INDEX(c), KEEL_ENTITY_INDEX(a));
    ck_assert(keel_alive(w, c));
    assert_pos(w, c, 7, 7);
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_stale_after_reuse)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    tu_destroy_now(w, a);
    keel_entity c = spawn_pos(w, 3, 4);
    ck_assert_uint_eq(KEEL_ENTITY_INDEX(c), KEEL_ENTITY_INDEX(a));
    ck_assert_uint_ne(c, a);
    uint64_t h0 = keel_world_hash(w);

    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, a));
    vel_t v = {1, 1};
    ck_assert_ok(keel_cmd_add(cb, a, VEL, &v));  /* add to a stale entity */
    pos_t p = {8, 8};
    ck_assert_ok(keel_cmd_add(cb, a, POS, &p));  /* would overwrite c's value */
    ck_assert_ok(keel_cmd_remove(cb, a, POS));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 4, 0, 0);
    ck_assert(keel_alive(w, c));
    assert_pos(w, c, 3, 4);
    ck_assert_int_eq(keel_has(w, c, VEL), 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_null)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    pos_t p = {9, 9};
    ck_assert_ok(keel_cmd_destroy(cb, KEEL_ENTITY_NULL));
    ck_assert_ok(keel_cmd_add(cb, KEEL_ENTITY_NULL, POS, &p));
    ck_assert_ok(keel_cmd_add(cb, KEEL_ENTITY_NULL, TAG, NULL));
    ck_assert_ok(keel_cmd_remove(cb, KEEL_ENTITY_NULL, POS));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 4);
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 4, 0, 0, 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    assert_pos(w, a, 1, 1);
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_foreign)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_entity b = spawn_pos(w, 2, 2);
    ck_assert_uint_eq(b, KEEL_ENTITY_MAKE(1, 1));
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    keel_entity bad[4] = {
        KEEL_ENTITY_MAKE(123456, 1),                                     /* index beyond the slots */
        KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(a), KEEL_ENTITY_GEN(a) + 5),  /* generation from the future */
        KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(b), 0),                       /* generation 0 is never live */
        KEEL_ENTITY_MAKE(UINT32_MAX, 1),
    };
    pos_t p = {9, 9};
    for (int i = 0; i < 4; i++) {
        ck_assert_ok(keel_cmd_destroy(cb, bad[i]));
        ck_assert_ok(keel_cmd_add(cb, bad[i], POS, &p));
        ck_assert_ok(keel_cmd_remove(cb, bad[i], POS));
    }
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 12, 0, 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    ck_assert(keel_alive(w, a));
    ck_assert(keel_alive(w, b));
    assert_pos(w, a, 1, 1);
    assert_pos(w, b, 2, 2);
    ck_assert_uint_eq(keel_world_count(w), 2);
    /* the foreign index did not create slots: the next spawn takes index 2 */
    keel_entity c = spawn_pos(w, 3, 3);
    ck_assert_uint_eq(c, KEEL_ENTITY_MAKE(2, 1));
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_absent)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    uint64_t h0 = keel_world_hash(w);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_remove(cb, a, VEL));
    ck_assert_ok(keel_cmd_remove(cb, a, TAG));
    ck_assert_ok(keel_cmd_remove(cb, a, HP));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 3, 0);
    ck_assert_uint_eq(keel_world_hash(w), h0);
    assert_pos(w, a, 1, 1);

    /* remove from an entity destroyed earlier in the buffer is stale, not absent */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_ok(keel_cmd_destroy(cb, a));
    ck_assert_ok(keel_cmd_remove(cb, a, VEL));
    ck_assert_ok(keel_cmd_remove(cb, a, POS));
    r = apply_ok(cb);
    assert_counters(r, 0, 1, 0, 0, 0, 2, 0, 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(ignored_add_after_destroy_same_buffer)
{
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    keel_entity b = spawn_pos(w, 2, 2);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    vel_t v = {3, 3};
    ck_assert_ok(keel_cmd_destroy(cb, a));
    ck_assert_ok(keel_cmd_add(cb, a, VEL, &v));
    ck_assert_ok(keel_cmd_add(cb, b, VEL, &v));
    keel_cmd_result r = apply_ok(cb);
    assert_counters(r, 0, 1, 1, 0, 0, 1, 0, 0);
    ck_assert(!keel_alive(w, a));
    assert_vel(w, b, 3, 3);
    ck_assert_uint_eq(query_count(w, VEL, 0, 0), 1);
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

/* ======================================================================== */
/* cmd_failure                                                               */
/* ======================================================================== */

/* A fixed scenario: setup spawns E0..E3, then a buffer of NSCEN commands of
 * every kind. Every command is a real application (none is ignored), so the
 * injection hook's count of applications equals the command position. */
#define NSCEN 8

typedef struct scen {
    keel_world *w;
    keel_entity e[4];
} scen;

static void scen_setup(scen *s)
{
    s->w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(s->w);
    rec_spawn_pos(cb, 10, 10);
    rec_spawn_pos(cb, 11, 11);
    rec_spawn_pos(cb, 12, 12);
    uint64_t hp = 13;
    keel_init in[1] = {{HP, &hp}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 1));
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 4);
    memcpy(s->e, r.created, sizeof s->e);
    keel_cmdbuf_destroy(cb);
    vel_t v = {1, 1};
    cb = tu_cmdbuf_new(s->w);
    ck_assert_ok(keel_cmd_add(cb, s->e[1], VEL, &v));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmdbuf_destroy(cb);
}

static const char *const scen_kind[NSCEN] = {"spawn", "destroy", "add", "remove",
                                              "spawn", "add", "destroy", "spawn"};

/* Record commands [from, to) of the scenario (0-based). */
static void scen_record(scen *s, keel_cmdbuf *cb, int from, int to)
{
    for (int i = from; i < to; i++) {
        switch (i) {
        case 0: rec_spawn_pos_hp(cb, 100, 101, 7); break;
        case 1: ck_assert_ok(keel_cmd_destroy(cb, s->e[0])); break;
        case 2: {
            uint64_t hp = 55;
            ck_assert_ok(keel_cmd_add(cb, s->e[1], HP, &hp));
            break;
        }
        case 3: ck_assert_ok(keel_cmd_remove(cb, s->e[1], VEL)); break;
        case 4: {
            vel_t v = {1, 2};
            keel_init in[1] = {{VEL, &v}};
            ck_assert_ok(keel_cmd_spawn(cb, in, 1));
            break;
        }
        case 5: ck_assert_ok(keel_cmd_add(cb, s->e[2], TAG, NULL)); break;
        case 6: ck_assert_ok(keel_cmd_destroy(cb, s->e[3])); break;
        case 7: ck_assert_ok(keel_cmd_spawn(cb, NULL, 0)); break;
        default: ck_abort();
        }
    }
}

/* counters after applying the first k commands of the scenario */
static void scen_expect(int k, uint32_t *sp, uint32_t *de, uint32_t *ad, uint32_t *re)
{
    static const int kind[NSCEN] = {0, 1, 2, 3, 0, 2, 1, 0};
    uint32_t c[4] = {0, 0, 0, 0};
    for (int i = 0; i < k; i++)
        c[kind[i]]++;
    *sp = c[0];
    *de = c[1];
    *ad = c[2];
    *re = c[3];
}

/* The reference: a fresh world with the scenario's first k commands applied. */
typedef struct scen_ref {
    uint64_t hash;
    uint32_t count;
    uint32_t created_count;
    keel_entity created[NSCEN];
} scen_ref;

static scen_ref scen_reference(int k)
{
    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, k);
    keel_cmd_result r = apply_ok(cb);
    scen_ref ref;
    memset(&ref, 0, sizeof ref);
    ref.hash = keel_world_hash(s.w);
    ref.count = keel_world_count(s.w);
    ref.created_count = r.created_count;
    if (r.created_count)
        memcpy(ref.created, r.created, r.created_count * sizeof(keel_entity));
    destroy_buf_and_world(cb, s.w);
    return ref;
}

static void assert_matches_ref(keel_world *w, keel_cmd_result r, const scen_ref *ref)
{
    ck_assert_uint_eq(keel_world_hash(w), ref->hash);
    ck_assert_uint_eq(keel_world_count(w), ref->count);
    ck_assert_uint_eq(r.created_count, ref->created_count);
    for (uint32_t i = 0; i < ref->created_count; i++) {
        ck_assert_uint_eq(r.created[i], ref->created[i]);
        ck_assert(keel_alive(w, r.created[i]));
    }
}

/* Loop test: _i = 1..NSCEN, the failing command. */
START_TEST(failure_at_k_retry)
{
    const int n = NSCEN, k = _i;
    scen_ref prefix = scen_reference(k - 1);
    scen_ref full = scen_reference(n);

    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, n);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, (uint32_t)n);

    world_test_inject_failure(s.w, (uint32_t)k, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    const char *err = keel_last_error();
    ck_assert_ptr_nonnull(err);
    ck_assert_str_ne(err, "");
    ck_assert_msg(contains_ci(err, scen_kind[k - 1]), "last error \"%s\" does not name the failed command kind %s",
                  err, scen_kind[k - 1]);

    keel_cmd_result r = keel_cmdbuf_result(cb);
    uint32_t sp, de, ad, re;
    scen_expect(k - 1, &sp, &de, &ad, &re);
    assert_counters(r, sp, de, ad, re, 0, 0, 0, (uint32_t)(n - k + 1));
    assert_matches_ref(s.w, r, &prefix);
    ck_assert_uint_eq(keel_world_pending(s.w), 1);

    /* retry applies exactly the pending commands */
    r = apply_ok(cb);
    scen_expect(n, &sp, &de, &ad, &re);
    assert_counters(r, sp, de, ad, re, 0, 0, 0, 0);
    assert_matches_ref(s.w, r, &full);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);

    /* values of the final state */
    ck_assert(!keel_alive(s.w, s.e[0]));
    ck_assert(!keel_alive(s.w, s.e[3]));
    assert_hp(s.w, s.e[1], 55);
    ck_assert_int_eq(keel_has(s.w, s.e[1], VEL), 0);
    assert_pos(s.w, s.e[1], 11, 11);
    ck_assert_int_eq(keel_has(s.w, s.e[2], TAG), 1);
    assert_pos(s.w, r.created[0], 100, 101);
    assert_hp(s.w, r.created[0], 7);
    assert_vel(s.w, r.created[1], 1, 2);

    /* a further apply is a no-op */
    uint64_t h = keel_world_hash(s.w);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_world_hash(s.w), h);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, 3);

    destroy_buf_and_world(cb, s.w);
}
END_TEST

/* Loop test: _i = 1..NSCEN, the failing command; discard instead of retry. */
START_TEST(failure_at_k_discard)
{
    const int n = NSCEN, k = _i;
    scen_ref prefix = scen_reference(k - 1);

    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, n);
    world_test_inject_failure(s.w, (uint32_t)k, KEEL_ENOSPC);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOSPC);
    ck_assert_uint_eq(keel_world_pending(s.w), 1);

    keel_cmdbuf_discard(cb);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    uint32_t sp, de, ad, re;
    scen_expect(k - 1, &sp, &de, &ad, &re);
    assert_counters(r, sp, de, ad, re, 0, 0, 0, 0);
    assert_matches_ref(s.w, r, &prefix);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);

    /* nothing left to apply */
    ck_assert_ok(keel_cmdbuf_apply(cb));
    assert_matches_ref(s.w, keel_cmdbuf_result(cb), &prefix);

    /* the buffer records again, and reset works */
    rec_spawn_pos(cb, 1, 2);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 1);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, prefix.created_count + 1);
    ck_assert_uint_eq(keel_world_count(s.w), prefix.count + 1);
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, 0);

    destroy_buf_and_world(cb, s.w);
}
END_TEST

START_TEST(failure_first_command_applies_nothing)
{
    scen s;
    scen_setup(&s);
    uint64_t h0 = keel_world_hash(s.w);
    uint32_t n0 = keel_world_count(s.w);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, NSCEN);
    world_test_inject_failure(s.w, 1, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, NSCEN);
    ck_assert_uint_eq(r.created_count, 0);
    ck_assert_uint_eq(keel_world_hash(s.w), h0);
    ck_assert_uint_eq(keel_world_count(s.w), n0);
    ck_assert(keel_alive(s.w, s.e[0]));
    ck_assert_uint_eq(keel_world_pending(s.w), 1);

    /* the slot the failed spawn would have taken is still the next one */
    r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 3);
    ck_assert_uint_eq(r.created[0], KEEL_ENTITY_MAKE(4, 1));
    ck_assert_uint_eq(keel_world_pending(s.w), 0);
    destroy_buf_and_world(cb, s.w);
}
END_TEST

START_TEST(failure_pending_refuses)
{
    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, 4);
    world_test_inject_failure(s.w, 3, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.pending, 2);
    ck_assert_uint_eq(r.created_count, 1);
    keel_entity first = r.created[0];
    uint64_t h = keel_world_hash(s.w);

    pos_t p = {1, 1};
    keel_init in[1] = {{POS, &p}};
    ck_assert_rc(keel_cmd_spawn(cb, in, 1), KEEL_EBUSY);
    ck_assert_rc(keel_cmd_spawn(cb, NULL, 0), KEEL_EBUSY);
    ck_assert_rc(keel_cmd_destroy(cb, s.e[2]), KEEL_EBUSY);
    ck_assert_rc(keel_cmd_add(cb, s.e[2], VEL, NULL), KEEL_EBUSY);
    ck_assert_rc(keel_cmd_remove(cb, s.e[2], POS), KEEL_EBUSY);
    ck_assert_rc(keel_cmdbuf_reset(cb), KEEL_EBUSY);

    /* nothing changed: same pending count, receipts, world */
    r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.pending, 2);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(r.created[0], first);
    ck_assert_uint_eq(r.spawned, 1);
    ck_assert_uint_eq(r.destroyed, 1);
    ck_assert_uint_eq(keel_world_hash(s.w), h);
    ck_assert_uint_eq(keel_world_pending(s.w), 1);

    /* other buffers still record and apply */
    keel_cmdbuf *cb2 = tu_cmdbuf_new(s.w);
    rec_spawn_pos(cb2, 3, 3);
    ck_assert_ok(keel_cmdbuf_apply(cb2));
    ck_assert_uint_eq(keel_world_pending(s.w), 1);

    /* retry: only the two pending commands */
    r = apply_ok(cb);
    assert_counters(r, 1, 1, 1, 1, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(r.created[0], first);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);
    assert_hp(s.w, s.e[1], 55);
    ck_assert_int_eq(keel_has(s.w, s.e[1], VEL), 0);

    /* now it records again */
    ck_assert_ok(keel_cmdbuf_reset(cb));
    rec_spawn_pos(cb, 4, 4);
    ck_assert_ok(keel_cmdbuf_apply(cb));

    keel_cmdbuf_destroy(cb2);
    destroy_buf_and_world(cb, s.w);
}
END_TEST

START_TEST(failure_retry_fails_again)
{
    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    scen_record(&s, cb, 0, NSCEN);
    world_test_inject_failure(s.w, 2, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, NSCEN - 1);
    /* the retry fails at its third command (scenario command 4) */
    world_test_inject_failure(s.w, 3, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    assert_counters(r, 1, 1, 1, 0, 0, 0, 0, NSCEN - 3);
    ck_assert_uint_eq(keel_world_pending(s.w), 1); /* counted once */
    scen_ref prefix = scen_reference(3);
    assert_matches_ref(s.w, r, &prefix);

    ck_assert_ok(keel_cmdbuf_apply(cb));
    scen_ref full = scen_reference(NSCEN);
    r = keel_cmdbuf_result(cb);
    assert_matches_ref(s.w, r, &full);
    assert_counters(r, 3, 2, 2, 1, 0, 0, 0, 0);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);
    destroy_buf_and_world(cb, s.w);
}
END_TEST

START_TEST(failure_destroy_pending_buffer)
{
    scen s;
    scen_setup(&s);
    keel_cmdbuf *cb1 = tu_cmdbuf_new(s.w);
    keel_cmdbuf *cb2 = tu_cmdbuf_new(s.w);
    rec_spawn_pos(cb1, 1, 1);
    rec_spawn_pos(cb1, 2, 2);
    rec_spawn_pos(cb2, 3, 3);
    rec_spawn_pos(cb2, 4, 4);

    world_test_inject_failure(s.w, 2, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb1), KEEL_ENOMEM);
    ck_assert_uint_eq(keel_world_pending(s.w), 1);
    world_test_inject_failure(s.w, 1, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb2), KEEL_ENOMEM);
    ck_assert_uint_eq(keel_world_pending(s.w), 2);
    ck_assert_uint_eq(keel_world_count(s.w), 5); /* 4 + cb1's prefix */

    keel_cmdbuf_destroy(cb1);
    ck_assert_uint_eq(keel_world_pending(s.w), 1);
    ck_assert_uint_eq(keel_world_count(s.w), 5); /* the applied prefix stays */
    keel_cmdbuf_discard(cb2);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);
    keel_cmdbuf_destroy(cb2);
    ck_assert_uint_eq(keel_world_pending(s.w), 0);

    /* destroying a buffer that is not pending does not underflow the count */
    keel_cmdbuf *cb3 = tu_cmdbuf_new(s.w);
    rec_spawn_pos(cb3, 5, 5);
    keel_cmdbuf_destroy(cb3); /* queued, never applied: not pending */
    ck_assert_uint_eq(keel_world_pending(s.w), 0);
    ck_assert_uint_eq(keel_world_count(s.w), 5);
    keel_world_destroy(s.w);
}
END_TEST

START_TEST(failure_natural_enospc)
{
    enum { N = 4 };
    keel_world *w = make_world_max(N);
    keel_cmdbuf *cb1 = tu_cmdbuf_new(w);
    for (int32_t i = 0; i < N + 1; i++)
        rec_spawn_pos(cb1, i, i);
    ck_assert_rc(keel_cmdbuf_apply(cb1), KEEL_ENOSPC);
    ck_assert_str_ne(keel_last_error(), "");
    keel_cmd_result r = keel_cmdbuf_result(cb1);
    assert_counters(r, N, 0, 0, 0, 0, 0, 0, 1);
    ck_assert_uint_eq(r.created_count, N);
    keel_entity e[N];
    memcpy(e, r.created, sizeof e);
    for (uint32_t i = 0; i < N; i++)
        ck_assert_uint_eq(e[i], KEEL_ENTITY_MAKE(i, 1));
    ck_assert_uint_eq(keel_world_count(w), N);
    ck_assert_uint_eq(keel_world_pending(w), 1);

    /* the failed spawn touched nothing: same hash as a world with N spawns */
    {
        keel_world *ref = make_world();
        keel_cmdbuf *rc = tu_cmdbuf_new(ref);
        for (int32_t i = 0; i < N; i++)
            rec_spawn_pos(rc, i, i);
        ck_assert_ok(keel_cmdbuf_apply(rc));
        ck_assert_uint_eq(keel_world_hash(w), keel_world_hash(ref));
        destroy_buf_and_world(rc, ref);
    }

    /* retry without room fails the same way, without duplicating anything */
    ck_assert_rc(keel_cmdbuf_apply(cb1), KEEL_ENOSPC);
    r = keel_cmdbuf_result(cb1);
    assert_counters(r, N, 0, 0, 0, 0, 0, 0, 1);
    ck_assert_uint_eq(r.created_count, N);
    ck_assert_uint_eq(keel_world_pending(w), 1);

    /* the pending buffer refuses new commands; free a slot with another one */
    ck_assert_rc(keel_cmd_destroy(cb1, e[1]), KEEL_EBUSY);
    keel_cmdbuf *cb2 = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb2, e[1]));
    ck_assert_ok(keel_cmdbuf_apply(cb2));
    ck_assert_uint_eq(keel_world_count(w), N - 1);
    ck_assert_uint_eq(keel_world_pending(w), 1);

    r = apply_ok(cb1);
    assert_counters(r, N + 1, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, N + 1);
    for (uint32_t i = 0; i < N; i++)
        ck_assert_uint_eq(r.created[i], e[i]);
    ck_assert_uint_eq(r.created[N], KEEL_ENTITY_MAKE(1, 2));
    assert_pos(w, r.created[N], N, N);
    ck_assert_uint_eq(keel_world_count(w), N);
    ck_assert_uint_eq(keel_world_pending(w), 0);

    keel_cmdbuf_destroy(cb2);
    destroy_buf_and_world(cb1, w);
}
END_TEST

START_TEST(failure_ignored_prefix_counted_once)
{
    /* ignored commands before the failure keep their counts and are not
     * counted again by the retry; the injected code is passed through */
    keel_world *w = make_world();
    keel_entity a = spawn_pos(w, 1, 1);
    tu_destroy_now(w, a);
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, KEEL_ENTITY_NULL));
    ck_assert_ok(keel_cmd_destroy(cb, a));
    rec_spawn_pos(cb, 2, 2);
    rec_spawn_pos(cb, 3, 3);
    /* Inject at the 2nd application. Whether the hook counts ignored
     * commands as applications is not specified: either the stale destroy
     * fails (1 ignored, 3 pending, nothing created) or the second spawn does
     * (2 ignored, 1 pending, 1 created). */
    world_test_inject_failure(w, 2, KEEL_ENOSPC);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOSPC);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(keel_world_pending(w), 1);
    ck_assert_uint_eq(r.ignored_null, 1);
    bool hook_counts_ignored = r.ignored_stale == 0;
    if (hook_counts_ignored) {
        assert_counters(r, 0, 0, 0, 0, 1, 0, 0, 3);
        ck_assert_uint_eq(r.created_count, 0);
        ck_assert_uint_eq(keel_world_count(w), 0);
    } else {
        assert_counters(r, 1, 0, 0, 0, 1, 1, 0, 1);
        ck_assert_uint_eq(r.created_count, 1);
        ck_assert_uint_eq(keel_world_count(w), 1);
    }
    r = apply_ok(cb);
    assert_counters(r, 2, 0, 0, 0, 1, 1, 0, 0);
    ck_assert_uint_eq(r.created_count, 2);
    assert_pos(w, r.created[0], 2, 2);
    assert_pos(w, r.created[1], 3, 3);
    ck_assert_uint_eq(keel_world_count(w), 2);
    destroy_buf_and_world(cb, w);
}
END_TEST

/* ======================================================================== */
/* cmd_receipts                                                              */
/* ======================================================================== */

START_TEST(receipts_accumulate_until_reset)
{
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, 0, 0);
    rec_spawn_pos(cb, 1, 1);
    rec_spawn_pos(cb, 2, 2);
    keel_cmd_result r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 3);
    keel_entity first3[3];
    memcpy(first3, r.created, sizeof first3);

    rec_spawn_pos(cb, 3, 3);
    rec_spawn_pos(cb, 4, 4);
    ck_assert_ok(keel_cmd_destroy(cb, first3[0]));
    r = apply_ok(cb);
    assert_counters(r, 5, 1, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 5);
    for (uint32_t i = 0; i < 3; i++)
        ck_assert_uint_eq(r.created[i], first3[i]);
    for (uint32_t i = 0; i < 5; i++) {
        ck_assert_uint_eq(r.created[i], KEEL_ENTITY_MAKE(i, 1));
        if (i > 0)
            assert_pos(w, r.created[i], (int32_t)i, (int32_t)i);
    }
    /* receipts are a record of what was created, even if since destroyed */
    ck_assert(!keel_alive(w, r.created[0]));

    /* an empty apply keeps everything */
    r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 5);
    ck_assert_uint_eq(r.spawned, 5);

    ck_assert_ok(keel_cmdbuf_reset(cb));
    r = keel_cmdbuf_result(cb);
    assert_counters(r, 0, 0, 0, 0, 0, 0, 0, 0);
    ck_assert_uint_eq(r.created_count, 0);
    ck_assert_uint_eq(keel_world_count(w), 4); /* reset does not touch the world */

    rec_spawn_pos(cb, 9, 9);
    r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(r.created[0], KEEL_ENTITY_MAKE(0, 2));
    assert_pos(w, r.created[0], 9, 9);
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_ok(keel_cmdbuf_reset(cb)); /* idempotent */
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(receipts_reset_refuses_queued)
{
    /* reset is refused while commands are queued (apply or discard first) */
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    rec_spawn_pos(cb, 1, 1);
    ck_assert_ok(keel_cmdbuf_apply(cb));
    rec_spawn_pos(cb, 2, 2);
    ck_assert_rc(keel_cmdbuf_reset(cb), KEEL_EBUSY);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.created_count, 1);
    ck_assert_uint_eq(r.pending, 1);
    keel_cmdbuf_discard(cb);
    ck_assert_ok(keel_cmdbuf_reset(cb));
    ck_assert_uint_eq(keel_world_count(w), 1);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(receipts_counters_exact)
{
    keel_world *w = make_world();
    keel_entity e[5];
    for (int32_t i = 0; i < 5; i++)
        e[i] = spawn_pos(w, i, i);
    tu_destroy_now(w, e[4]);

    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    uint64_t hp = 1;
    vel_t v = {2, 2};
    rec_spawn_pos(cb, 10, 10);                         /* spawned 1 (takes slot 4) */
    rec_spawn_pos_hp(cb, 11, 11, 11);                  /* spawned 2 */
    ck_assert_ok(keel_cmd_spawn(cb, NULL, 0));         /* spawned 3 */
    ck_assert_ok(keel_cmd_destroy(cb, e[0]));          /* destroyed 1 */
    ck_assert_ok(keel_cmd_destroy(cb, e[0]));          /* stale 1 */
    ck_assert_ok(keel_cmd_destroy(cb, e[4]));          /* stale 2 (slot reused by spawn 1) */
    ck_assert_ok(keel_cmd_add(cb, e[1], HP, &hp));     /* added 1 */
    ck_assert_ok(keel_cmd_add(cb, e[1], VEL, &v));     /* added 2 */
    ck_assert_ok(keel_cmd_add(cb, e[2], TAG, NULL));   /* added 3 */
    ck_assert_ok(keel_cmd_remove(cb, e[2], POS));      /* removed 1 */
    ck_assert_ok(keel_cmd_remove(cb, e[2], VEL));      /* absent 1 */
    ck_assert_ok(keel_cmd_remove(cb, e[3], HP));       /* absent 2 */
    ck_assert_ok(keel_cmd_remove(cb, e[0], POS));      /* stale 3 */
    ck_assert_ok(keel_cmd_add(cb, KEEL_ENTITY_NULL, HP, &hp)); /* null 1 */
    ck_assert_ok(keel_cmd_destroy(cb, KEEL_ENTITY_NULL));     /* null 2 */
    ck_assert_ok(keel_cmd_add(cb, KEEL_ENTITY_MAKE(99999, 3), HP, &hp)); /* stale 4 */
    ck_assert_ok(keel_cmd_destroy(cb, e[3]));          /* destroyed 2 */
    ck_assert_uint_eq(keel_cmdbuf_result(cb).pending, 17);
    ck_assert_ok(keel_cmdbuf_apply(cb));

    keel_cmd_result r = keel_cmdbuf_result(cb);
    assert_counters(r, 3, 2, 3, 1, 2, 4, 2, 0);
    ck_assert_uint_eq(r.created_count, 3);
    ck_assert_uint_eq(r.created[0], KEEL_ENTITY_MAKE(4, 2));
    ck_assert_uint_eq(r.created[1], KEEL_ENTITY_MAKE(5, 1));
    ck_assert_uint_eq(r.created[2], KEEL_ENTITY_MAKE(6, 1));
    assert_pos(w, r.created[0], 10, 10);
    assert_hp(w, r.created[1], 11);
    ck_assert_uint_eq(keel_world_count(w), 5); /* e1, e2, 3 new */
    assert_hp(w, e[1], 1);
    assert_vel(w, e[1], 2, 2);
    assert_pos(w, e[1], 1, 1);
    ck_assert_int_eq(keel_has(w, e[2], POS), 0);
    ck_assert_int_eq(keel_has(w, e[2], TAG), 1);
    ck_assert(!keel_alive(w, e[3]));

    /* a second round adds to the counters */
    ck_assert_ok(keel_cmd_destroy(cb, e[1]));
    ck_assert_ok(keel_cmd_remove(cb, e[2], TAG));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    assert_counters(keel_cmdbuf_result(cb), 3, 3, 3, 2, 2, 4, 2, 0);

    ck_assert_ok(keel_cmdbuf_reset(cb));
    assert_counters(keel_cmdbuf_result(cb), 0, 0, 0, 0, 0, 0, 0, 0);
    destroy_buf_and_world(cb, w);
}
END_TEST

START_TEST(receipts_across_failure)
{
    /* receipts of a failed apply's prefix, then of the retry, in command
     * order, each entity once */
    keel_world *w = make_world();
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    for (int32_t i = 0; i < 6; i++)
        rec_spawn_pos(cb, i, i);
    world_test_inject_failure(w, 4, KEEL_ENOMEM);
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_ENOMEM);
    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.created_count, 3);
    ck_assert_uint_eq(r.pending, 3);
    for (uint32_t i = 0; i < 3; i++)
        ck_assert_uint_eq(r.created[i], KEEL_ENTITY_MAKE(i, 1));
    ck_assert_uint_eq(keel_world_count(w), 3);
    r = apply_ok(cb);
    ck_assert_uint_eq(r.created_count, 6);
    ck_assert_uint_eq(r.spawned, 6);
    for (uint32_t i = 0; i < 6; i++) {
        ck_assert_uint_eq(r.created[i], KEEL_ENTITY_MAKE(i, 1));
        assert_pos(w, r.created[i], (int32_t)i, (int32_t)i);
    }
    ck_assert_uint_eq(keel_world_count(w), 6);
    destroy_buf_and_world(cb, w);
}
END_TEST

/* ======================================================================== */

static Suite *record_suite(void)
{
    const TTest *const t[] = {record_create_args, record_unknown_component, record_repeated_component,
                              record_null_inits, record_does_not_touch_world, record_values_copied,
                              record_spawn_empty_and_zero_fill, record_discard_unapplied,
                              record_idle_until_used_and_after_reset};
    return tu_case_suite("cmd_record", "record", t, sizeof t / sizeof t[0]);
}

static Suite *playback_suite(void)
{
    const TTest *const t[] = {playback_fifo_receipts, playback_fifo_order_matters, playback_add_remove_moves,
                              playback_alternating_sets, playback_add_overwrites, playback_destroy_then_spawn_reuses,
                              playback_spawn_then_destroy_no_reuse, playback_empty_noop, playback_destroy_clears,
                              playback_many, playback_batched_equals_one_by_one, playback_destroy_runs_equal_one_by_one,
                              playback_hash_history_independent};
    return tu_case_suite("cmd_playback", "playback", t, sizeof t / sizeof t[0]);
}

static Suite *ignored_suite(void)
{
    const TTest *const t[] = {ignored_double_destroy, ignored_double_destroy_occupant_safe, ignored_stale_after_reuse,
                              ignored_null, ignored_foreign, ignored_absent, ignored_add_after_destroy_same_buffer};
    return tu_case_suite("cmd_ignored", "ignored", t, sizeof t / sizeof t[0]);
}

/* storage.c allocates full-size chunks from a reserve of 16 at a time; when
 * there is no memory for a whole reserve, one chunk is allocated alone. In a
 * child under RLIMIT_AS that admits one more 8 MB chunk but not a reserve of
 * 16, the spawn that opens a table's second chunk still succeeds and every
 * value is intact. Skipped under sanitizers, whose shadow memory needs more
 * address space than any such limit. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif
enum { BLOB = 1024, BLOB_ROWS = 8192 };

static void blob_fill(unsigned char *b, uint32_t i)
{
    for (uint32_t k = 0; k < BLOB; k++)
        b[k] = (unsigned char)(i * 31u + k);
}

/* The child's body: exit status 0 = as expected, else the failed step. */
static int reserve_fallback_child(void)
{
    static const keel_field blob_fields[] = {{.name = "b", .type = KEEL_BYTES, .offset = 0, .count = BLOB}};
    keel_world *w = NULL;
    keel_component c = 0;
    keel_component_desc d = {.name = "blob", .size = BLOB, .fields = blob_fields, .field_count = 1};
    if (keel_world_create(&(keel_world_desc){.chunk_rows = BLOB_ROWS}, &w) || keel_component_register(w, &d, &c))
        return 2;
    keel_cmdbuf *cb = NULL;
    if (keel_cmdbuf_create(w, &cb))
        return 3;
    static unsigned char b[BLOB];
    for (uint32_t i = 0; i < BLOB_ROWS; i++) {
        blob_fill(b, i);
        if (keel_cmd_spawn(cb, &(keel_init){c, b}, 1))
            return 4;
    }
    if (keel_cmdbuf_apply(cb)) /* the first chunk, grown to 8192 rows: 8 MB */
        return 5;
    keel_entity first = keel_cmdbuf_result(cb).created[0];
    /* room for one more chunk (8 MB + its entity array), not for 16 */
    struct rlimit lim = {.rlim_cur = tu_vm_size() + 40u * 1024 * 1024, .rlim_max = RLIM_INFINITY};
    if (setrlimit(RLIMIT_AS, &lim))
        return 6;
    blob_fill(b, BLOB_ROWS);
    if (keel_cmd_spawn(cb, &(keel_init){c, b}, 1) || keel_cmdbuf_apply(cb))
        return 7;
    keel_entity last = keel_cmdbuf_result(cb).created[0];
    static unsigned char got[BLOB], want[BLOB];
    if (keel_world_count(w) != BLOB_ROWS + 1 || keel_get(w, last, c, got))
        return 8;
    blob_fill(want, BLOB_ROWS);
    if (memcmp(got, want, BLOB))
        return 9;
    blob_fill(want, 0);
    if (keel_get(w, first, c, got) || memcmp(got, want, BLOB))
        return 10;
    destroy_buf_and_world(cb, w);
    return 0;
}

START_TEST(failure_reserve_falls_back)
{
    if (UNDER_SANITIZER)
        return;
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(reserve_fallback_child());
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "the child died (status %d)", status);
    ck_assert_msg(WEXITSTATUS(status) == 0, "the child failed at step %d", WEXITSTATUS(status));
}
END_TEST

static Suite *failure_suite(void)
{
    Suite *s = suite_create("cmd_failure");
    TCase *tc = tcase_create("failure");
    tcase_add_loop_test(tc, failure_at_k_retry, 1, NSCEN + 1);
    tcase_add_loop_test(tc, failure_at_k_discard, 1, NSCEN + 1);
    tcase_add_test(tc, failure_first_command_applies_nothing);
    tcase_add_test(tc, failure_pending_refuses);
    tcase_add_test(tc, failure_retry_fails_again);
    tcase_add_test(tc, failure_destroy_pending_buffer);
    tcase_add_test(tc, failure_natural_enospc);
    tcase_add_test(tc, failure_ignored_prefix_counted_once);
    tcase_add_test(tc, failure_reserve_falls_back);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *receipts_suite(void)
{
    const TTest *const t[] = {receipts_accumulate_until_reset, receipts_reset_refuses_queued, receipts_counters_exact,
                              receipts_across_failure};
    return tu_case_suite("cmd_receipts", "receipts", t, sizeof t / sizeof t[0]);
}

KEEL_TEST_MAIN(record_suite, playback_suite, ignored_suite, failure_suite, receipts_suite)
