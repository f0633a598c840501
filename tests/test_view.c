/*
 * test_view.c -- read views (keel/view.h, docs/transactions.md "Read views
 * and reclamation", src/txn/view.c, the copy-on-write rules of
 * src/world/version.c):
 *
 *   view_basic       before the first tick; a view after every step matches
 *                    the live world (tick, count, every value); error codes;
 *                    a view held across steps keeps its own tick while the
 *                    sync point moves rows, frees chunks and reuses slots;
 *                    views nest; changes made between steps (keel_set,
 *                    keel_cmdbuf_apply) are published at the next step start;
 *                    an idle tick still advances the view's tick.
 *   view_concurrent  reader threads check an invariant the systems keep only
 *                    at tick boundaries (a + b == K, broken between two
 *                    systems of each tick) while the main thread or the
 *                    TickDriver runs hundreds of ticks with structural churn;
 *                    a reader holding a view does not block ticks and finds
 *                    its view unchanged after them.
 *   view_recycle     world/version.c's recycling of rewritten columns: without
 *                    readers a column alternates between two buffers (no
 *                    third appears: memory does not grow); a held view's
 *                    buffers are never recycled and its values stay intact
 *                    across many ticks of rewrites; readers coming and going
 *                    never see a value change under their view;
 *                    keel_runtime_release_memory frees the spares (their
 *                    bytes reported), nothing a view or the world uses, and
 *                    refuses inside a tick or while the driver runs.
 *   view_iter        keel_view_iter / keel_view_next: an empty view; after every
 *                    step the iteration visits the live world's chunks in
 *                    keel_query_iter's order with keel_view_get's values,
 *                    `without` terms splitting the rows by membership; a held
 *                    view iterates unchanged across churn and skips a table
 *                    created after it; non-VERSIONED data terms, NULLs and a
 *                    query of another world yield nothing with a sentence
 *                    (tags and `without` terms of any discipline are fine);
 *                    reader threads iterating views while ticks churn, or
 *                    while a system rewrites every column every tick (its
 *                    buffers recycled), see every row's invariant, values
 *                    equal to keel_view_get's and the view's count, every time.
 *
 * The simulation ("sim"): every entity has VERSIONED a, b (a + b == K),
 * self (its own handle, filled in by the `fixup` system on the tick after
 * the spawn: 0 before) and born (the tick of its spawn). Per tick:
 *   fixup    writes self of the new entities and appends their handles to
 *            a registry (so readers know every handle ever live);
 *   move     (parallel query) a -= d: the sum is broken from here ...
 *   restore  (reads_fresh a) b = K - a through keel_txn_set: ... to here;
 *   churn    destroys some entities, toggles the VERSIONED component t
 *            (value: the tick it was added) on others, spawns new ones,
 *            some with the tag `tag` (destroys are recorded before the
 *            spawns, so slots are reused in the same sync point).
 *
 * System bodies never call ck_assert: they count anomalies in an atomic the
 * test thread checks. Reader threads do the same. No sleeps: threads meet
 * through atomics, each wait guarded by a generous deadline that turns a
 * hang into a failure (never a timing assertion).
 */
#include <pthread.h>
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
#include "world/world_internal.h" /* chunk counts, to check the scenario frees chunks */

#define K_SUM 1000000ll
#define REG_CAP (1u << 17)
#define GUARD_NS (60ull * 1000000000ull) /* a wait this long is a failure, not a hang */

/* ---- the simulation ------------------------------------------------------------ */

typedef struct sim {
    keel_runtime *rt;
    keel_world *w;
    keel_component a, b, self, born, t, tag, sv, tr;
    keel_component late;  /* VERSIONED, on no sim entity: tests spawn with it between steps (a new table) */
    keel_component svtag; /* a SINGLE_VERSION tag, likewise */
    keel_query *q_self; /* with self: fixup, churn */
    keel_query *q_a;    /* with a: restore, the test's walks of the live world */

    /* every handle ever live, appended by fixup (one writer at a time) */
    keel_entity *reg;
    _Atomic uint32_t nreg;
    _Atomic uint64_t reg_through; /* every handle live at a tick <= this is in reg */

    _Atomic uint32_t sys_bad; /* anomalies seen by system bodies */

    /* churn parameters: changed by the test thread between steps only */
    uint32_t spawn_first;  /* spawned on tick 1 */
    uint32_t spawn_base;   /* later ticks: spawn_base + (hash % spawn_var) */
    uint32_t spawn_var;
    uint32_t destroy_mod;  /* destroy 1 in destroy_mod entities per tick; 0 = none */
    uint32_t toggle_mod;   /* add/remove t on 1 in toggle_mod; 0 = none */
} sim;

static const keel_field i64_field[] = {{.name = "v", .type = KEEL_I64, .offset = 0, .count = 0}};
static const keel_field i32_field[] = {{.name = "v", .type = KEEL_I32, .offset = 0, .count = 0}};
static const keel_field ent_field[] = {{.name = "e", .type = KEEL_ENTITY, .offset = 0, .count = 0}};

static keel_component reg_comp(keel_world *w, const char *name, uint32_t size, keel_discipline d,
                               const keel_field *f)
{
    return tu_reg(w, name, size, d, size ? f : NULL, size ? 1 : 0);
}

static int64_t move_amount(keel_entity e, uint64_t tick)
{
    return (int64_t)(core_mix64(e * 0x9e3779b97f4a7c15ull ^ (tick << 20)) % 97) + 1;
}

/* fixup: self = own handle for the entities spawned since the last tick;
 * register them. */
static int sys_fixup(keel_ctx *ctx, void *user)
{
    sim *s = user;
    keel_iter it;
    keel_txn_iter(ctx, s->q_self, &it);
    uint32_t n = atomic_load_explicit(&s->nreg, memory_order_relaxed);
    while (keel_txn_next(ctx, &it)) {
        keel_entity *self = KEEL_COLUMN(&it, keel_entity, 0);
        for (uint32_t r = 0; r < it.count; r++) {
            if (self[r] == it.entities[r])
                continue;
            if (self[r] != KEEL_ENTITY_NULL || n >= REG_CAP) {
                atomic_fetch_add(&s->sys_bad, 1);
                continue;
            }
            self[r] = it.entities[r];
            s->reg[n++] = it.entities[r];
            atomic_store_explicit(&s->nreg, n, memory_order_release);
        }
    }
    atomic_store_explicit(&s->reg_through, keel_ctx_tick(ctx) - 1, memory_order_release);
    return 0;
}

/* move: a -= d, per chunk (parallel). */
static int sys_move(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    int64_t *a = KEEL_COLUMN(it, int64_t, 0);
    for (uint32_t r = 0; r < it->count; r++)
        a[r] -= move_amount(it->entities[r], keel_ctx_tick(ctx));
    return 0;
}

/* restore: b = K - a (a read fresh, after move). */
static int sys_restore(keel_ctx *ctx, void *user)
{
    sim *s = user;
    keel_iter it;
    keel_txn_iter(ctx, s->q_a, &it);
    while (keel_txn_next(ctx, &it)) {
        const int64_t *a = KEEL_COLUMN(&it, int64_t, 0);
        for (uint32_t r = 0; r < it.count; r++) {
            int64_t b_old = 0;
            /* the sum is broken right now: b + the fresh a is off by the amount moved */
            if (keel_txn_get(ctx, it.entities[r], s->b, &b_old) ||
                a[r] + b_old != K_SUM - move_amount(it.entities[r], keel_ctx_tick(ctx)))
                atomic_fetch_add(&s->sys_bad, 1);
            int64_t b = K_SUM - a[r];
            if (keel_txn_set(ctx, it.entities[r], s->b, &b))
                atomic_fetch_add(&s->sys_bad, 1);
        }
    }
    return 0;
}

static int spawn_one(const sim *s, keel_cmdbuf *cb, uint64_t tick, uint64_t h)
{
    int64_t a = (int64_t)(h % 1000) - 500, b = K_SUM - a, born = (int64_t)tick;
    keel_entity self = KEEL_ENTITY_NULL;
    keel_init in[5] = {{s->a, &a}, {s->b, &b}, {s->self, &self}, {s->born, &born}, {s->tag, NULL}};
    return keel_cmd_spawn(cb, in, (h >> 12) % 5 == 0 ? 5 : 4);
}

/* churn: destroy, toggle t, then spawn. */
static int sys_churn(keel_ctx *ctx, void *user)
{
    sim *s = user;
    uint64_t tick = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    keel_iter it;
    keel_txn_iter(ctx, s->q_self, &it);
    int rc = 0;
    while (!rc && keel_txn_next(ctx, &it)) {
        for (uint32_t r = 0; r < it.count && !rc; r++) {
            keel_entity e = it.entities[r];
            uint64_t h = core_mix64(e * 0xd1b54a32d192ed03ull + tick);
            if (s->destroy_mod && h % s->destroy_mod == 0) {
                rc = keel_cmd_destroy(cb, e);
            } else if (s->toggle_mod && (h >> 16) % s->toggle_mod == 0) {
                int has = keel_has(keel_ctx_world(ctx), e, s->t);
                int64_t tv = (int64_t)tick;
                rc = has == 1 ? keel_cmd_remove(cb, e, s->t) : keel_cmd_add(cb, e, s->t, &tv);
            }
        }
    }
    uint64_t hs = core_mix64(tick * 0x2545f4914f6cdd1dull);
    uint32_t n = tick == 1 ? s->spawn_first : s->spawn_base + (s->spawn_var ? (uint32_t)(hs % s->spawn_var) : 0);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = spawn_one(s, cb, tick, core_mix64(hs + i + 1));
    if (rc)
        atomic_fetch_add(&s->sys_bad, 1);
    return rc;
}

/* A runtime with the sim's components, queries and (unless extra_only)
 * systems. `extra` (may be NULL) is added first, ordered before the others. */
static void sim_init(sim *s, int32_t workers, bool systems, const keel_system_desc *extra)
{
    memset(s, 0, sizeof *s);
    keel_runtime_desc d = {.workers = workers, .tick_rate_hz = -1, .world = {.chunk_rows = 32}};
    ck_assert_ok(keel_runtime_create(&d, &s->rt));
    s->w = keel_runtime_world(s->rt);
    s->a = reg_comp(s->w, "a", 8, KEEL_VERSIONED, i64_field);
    s->b = reg_comp(s->w, "b", 8, KEEL_VERSIONED, i64_field);
    s->self = reg_comp(s->w, "self", 8, KEEL_VERSIONED, ent_field);
    s->born = reg_comp(s->w, "born", 8, KEEL_VERSIONED, i64_field);
    s->t = reg_comp(s->w, "t", 8, KEEL_VERSIONED, i64_field);
    s->tag = reg_comp(s->w, "tag", 0, KEEL_VERSIONED, NULL);
    s->sv = reg_comp(s->w, "sv", 4, KEEL_SINGLE_VERSION, i32_field);
    s->tr = reg_comp(s->w, "tr", 4, KEEL_TRANSIENT, i32_field);
    s->late = reg_comp(s->w, "late", 8, KEEL_VERSIONED, i64_field);
    s->svtag = reg_comp(s->w, "svtag", 0, KEEL_SINGLE_VERSION, NULL);
    ck_assert_ok(keel_query_create(s->w, &(keel_query_desc){.with = {s->self}}, &s->q_self));
    ck_assert_ok(keel_query_create(s->w, &(keel_query_desc){.with = {s->a}}, &s->q_a));
    s->reg = calloc(REG_CAP, sizeof *s->reg);
    ck_assert_ptr_nonnull(s->reg);
    s->spawn_first = 60;
    s->spawn_base = 10;
    s->spawn_var = 9;
    s->destroy_mod = 4;
    s->toggle_mod = 5;

    keel_schedule *sc = sched_new(s->rt);
    if (extra)
        add_sys(sc, extra);
    if (systems) {
        keel_system_desc fix = {.name = "fixup", .run = sys_fixup, .user = s};
        fix.access.writes[0] = s->self;
        add_sys(sc, &fix);
        keel_system_desc mv = {.name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = sys_move, .user = s,
                               .query = {.with = {s->a}}, .parallel = true, .min_chunk_rows = 16};
        mv.access.writes[0] = s->a;
        add_sys(sc, &mv);
        keel_system_desc rs = {.name = "restore", .run = sys_restore, .user = s};
        rs.access.reads_fresh[0] = s->a;
        rs.access.writes[0] = s->b;
        add_sys(sc, &rs);
        keel_system_desc ch = {.name = "churn", .run = sys_churn, .user = s};
        ch.access.reads_fresh[0] = s->self;
        add_sys(sc, &ch);
    }
    tu_install(s->rt, sc);
}

static void sim_close(sim *s)
{
    ck_assert_uint_eq(atomic_load(&s->sys_bad), 0);
    keel_query_destroy(s->q_self);
    keel_query_destroy(s->q_a);
    keel_runtime_close(s->rt);
    free(s->reg);
}

/* The live world's handles (walk of q_a: every sim entity has a). */
static uint32_t live_handles(sim *s, keel_entity *out, uint32_t cap)
{
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(s->q_a, &it);
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++) {
            ck_assert_uint_lt(n, cap);
            out[n++] = it.entities[r];
        }
    ck_assert_uint_eq(n, keel_world_count(s->w));
    return n;
}

static uint32_t total_chunks(const keel_world *w)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->ntables; i++)
        n += w->tables[i]->nchunks;
    return n;
}

static bool contains(const keel_entity *v, uint32_t n, keel_entity e)
{
    for (uint32_t i = 0; i < n; i++)
        if (v[i] == e)
            return true;
    return false;
}

/* What a view (or the world) says about one entity. */
typedef struct ent_state {
    bool alive;
    int rc_a, rc_b, rc_self, rc_born, rc_t, rc_tag;
    int64_t a, b, born, t;
    keel_entity self;
} ent_state;

static ent_state view_state(const sim *s, const keel_view *v, keel_entity e)
{
    ent_state st;
    memset(&st, 0, sizeof st);
    st.alive = keel_view_alive(v, e);
    st.rc_a = keel_view_get(v, e, s->a, &st.a);
    st.rc_b = keel_view_get(v, e, s->b, &st.b);
    st.rc_self = keel_view_get(v, e, s->self, &st.self);
    st.rc_born = keel_view_get(v, e, s->born, &st.born);
    st.rc_t = keel_view_get(v, e, s->t, &st.t);
    st.rc_tag = keel_view_get(v, e, s->tag, NULL);
    return st;
}

static ent_state world_state(const sim *s, keel_entity e)
{
    ent_state st;
    memset(&st, 0, sizeof st);
    st.alive = keel_alive(s->w, e);
    st.rc_a = keel_get(s->w, e, s->a, &st.a);
    st.rc_b = keel_get(s->w, e, s->b, &st.b);
    st.rc_self = keel_get(s->w, e, s->self, &st.self);
    st.rc_born = keel_get(s->w, e, s->born, &st.born);
    st.rc_t = keel_get(s->w, e, s->t, &st.t);
    st.rc_tag = keel_get(s->w, e, s->tag, NULL);
    return st;
}

static void assert_same_state(keel_entity e, const ent_state *x, const ent_state *y)
{
    ck_assert_msg(x->alive == y->alive, "entity 0x%llx: alive %d vs %d", (unsigned long long)e, x->alive, y->alive);
    ck_assert_int_eq(x->rc_a, y->rc_a);
    ck_assert_int_eq(x->rc_b, y->rc_b);
    ck_assert_int_eq(x->rc_self, y->rc_self);
    ck_assert_int_eq(x->rc_born, y->rc_born);
    ck_assert_int_eq(x->rc_t, y->rc_t);
    ck_assert_int_eq(x->rc_tag, y->rc_tag);
    if (!x->alive)
        return;
    ck_assert_int_eq(x->a, y->a);
    ck_assert_int_eq(x->b, y->b);
    ck_assert_uint_eq(x->self, y->self);
    ck_assert_int_eq(x->born, y->born);
    if (x->rc_t == KEEL_OK)
        ck_assert_int_eq(x->t, y->t);
}

/* The view matches the live world: tick, count, every live entity's
 * values, and every registered handle's liveness. */
static void assert_view_matches_world(sim *s, const keel_view *v)
{
    ck_assert_uint_eq(keel_view_tick(v), keel_runtime_tick(s->rt));
    ck_assert_uint_eq(keel_view_count(v), keel_world_count(s->w));
    keel_iter it;
    keel_query_iter(s->q_a, &it);
    uint32_t seen = 0;
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++, seen++) {
            keel_entity e = it.entities[r];
            ent_state vs = view_state(s, v, e), ws = world_state(s, e);
            ck_assert(vs.alive);
            ck_assert_int_eq(vs.rc_a, KEEL_OK);
            ck_assert_int_eq(vs.a + vs.b, K_SUM);
            assert_same_state(e, &vs, &ws);
        }
    ck_assert_uint_eq(seen, keel_view_count(v));
    uint32_t n = atomic_load(&s->nreg);
    for (uint32_t i = 0; i < n; i++)
        ck_assert(keel_view_alive(v, s->reg[i]) == keel_alive(s->w, s->reg[i]));
}

/* =============================================================================
 * view_basic
 * ============================================================================= */

START_TEST(test_before_first_tick)
{
    sim s;
    sim_init(&s, 1, true, NULL);
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(keel_view_tick(v), 0);
    ck_assert_uint_eq(keel_view_count(v), 0);
    ck_assert(!keel_view_alive(v, KEEL_ENTITY_MAKE(0, 1)));
    int64_t x = 7;
    ck_assert_rc(keel_view_get(v, KEEL_ENTITY_MAKE(0, 1), s.a, &x), KEEL_ESTALE);
    ck_assert_int_eq(x, 7);
    keel_view_end(v);

    /* entities made between steps are not in a view until a step publishes them */
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(s.w, &cb));
    for (int i = 0; i < 3; i++)
        ck_assert_ok(spawn_one(&s, cb, 0, (uint64_t)i * 77));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmd_result res = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(res.created_count, 3);
    ck_assert_uint_eq(keel_world_count(s.w), 3);
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_uint_eq(keel_view_tick(v), 0);
    ck_assert_uint_eq(keel_view_count(v), 0);
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert(!keel_view_alive(v, res.created[i]));
        ck_assert_rc(keel_view_get(v, res.created[i], s.a, &x), KEEL_ESTALE);
    }
    keel_view_end(v);

    s.spawn_first = 5;
    tu_step_n(s.rt, 1);
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_uint_eq(keel_view_tick(v), 1);
    uint32_t survivors = 0;
    for (uint32_t i = 0; i < 3; i++)
        survivors += keel_alive(s.w, res.created[i]);
    ck_assert_uint_eq(keel_view_count(v), survivors + 5); /* tick 1 spawned 5 */
    ck_assert_uint_eq(keel_view_count(v), keel_world_count(s.w));
    for (uint32_t i = 0; i < 3; i++) {
        keel_entity e = res.created[i];
        if (!keel_alive(s.w, e)) /* churn may destroy it on tick 1 */
            continue;
        ent_state vs = view_state(&s, v, e);
        ck_assert(vs.alive);
        ck_assert_uint_eq(vs.self, e); /* fixup ran on tick 1 */
        ck_assert_int_eq(vs.born, 0);
    }
    assert_view_matches_world(&s, v);
    keel_view_end(v);
    keel_cmdbuf_destroy(cb);
    sim_close(&s);
}
END_TEST

/* After every step a new view shows exactly the live world. */
static void run_tracks_world(int32_t workers)
{
    sim s;
    sim_init(&s, workers, true, NULL);
    uint32_t max_count = 0, min_count = UINT32_MAX;
    for (int i = 0; i < 25; i++) {
        if (i == 12) { /* shrink: the sync point frees chunks */
            s.destroy_mod = 2;
            s.spawn_base = 1;
            s.spawn_var = 2;
        }
        tu_step_n(s.rt, 1);
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(s.rt, &v));
        assert_view_matches_world(&s, v);
        uint32_t c = keel_view_count(v);
        max_count = c > max_count ? c : max_count;
        min_count = c < min_count ? c : min_count;
        keel_view_end(v);
    }
    ck_assert_uint_gt(max_count, 2 * min_count + 10); /* the population really moved */
    sim_close(&s);
}

START_TEST(test_tracks_world_serial)
{
    run_tracks_world(1);
}
END_TEST

START_TEST(test_tracks_world_parallel)
{
    run_tracks_world(2);
}
END_TEST

START_TEST(test_errors)
{
    sim s;
    sim_init(&s, 2, true, NULL);
    tu_step_n(s.rt, 3);
    /* one entity with SINGLE_VERSION and TRANSIENT components, made between steps */
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(s.w, &cb));
    int64_t a = 5, b = K_SUM - 5, born = 3;
    int32_t sv = 11, tr = 12;
    keel_entity zero = KEEL_ENTITY_NULL;
    keel_init in[6] = {{s.a, &a}, {s.b, &b}, {s.self, &zero}, {s.born, &born}, {s.sv, &sv}, {s.tr, &tr}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 6));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_entity special = keel_cmdbuf_result(cb).created[0];
    s.destroy_mod = 0; /* keep `special` (ticks 1-3 destroyed some entities) */
    tu_step_n(s.rt, 5);
    ck_assert(keel_alive(s.w, special));

    /* a destroyed handle, an entity with t and one without */
    keel_entity dead = KEEL_ENTITY_NULL, with_t = KEEL_ENTITY_NULL, without_t = KEEL_ENTITY_NULL,
                without_tag = KEEL_ENTITY_NULL, with_tag = KEEL_ENTITY_NULL;
    uint32_t n = atomic_load(&s.nreg);
    for (uint32_t i = 0; i < n; i++) {
        keel_entity e = s.reg[i];
        if (!keel_alive(s.w, e)) {
            dead = dead ? dead : e;
            continue;
        }
        if (keel_has(s.w, e, s.t) == 1)
            with_t = with_t ? with_t : e;
        else
            without_t = without_t ? without_t : e;
        if (keel_has(s.w, e, s.tag) == 1)
            with_tag = with_tag ? with_tag : e;
        else
            without_tag = without_tag ? without_tag : e;
    }
    ck_assert_uint_ne(dead, 0);
    ck_assert_uint_ne(with_t, 0);
    ck_assert_uint_ne(without_t, 0);
    ck_assert_uint_ne(with_tag, 0);
    ck_assert_uint_ne(without_tag, 0);

    const keel_view *v = NULL;
    ck_assert_rc(keel_view_begin(NULL, &v), KEEL_EINVAL);
    ck_assert_rc(keel_view_begin(s.rt, NULL), KEEL_EINVAL);
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_uint_eq(keel_view_tick(v), 8);
    int64_t x = 0;
    int32_t y = 0;
    /* stale handles */
    ck_assert(!keel_view_alive(v, dead));
    ck_assert_rc(keel_view_get(v, dead, s.a, &x), KEEL_ESTALE);
    ck_assert_rc(keel_view_get(v, KEEL_ENTITY_NULL, s.a, &x), KEEL_ESTALE);
    ck_assert(!keel_view_alive(v, KEEL_ENTITY_NULL));
    ck_assert_rc(keel_view_get(v, KEEL_ENTITY_MAKE(1000000, 1), s.a, &x), KEEL_ESTALE);
    ck_assert(!keel_view_alive(v, KEEL_ENTITY_MAKE(1000000, 1)));
    keel_entity wrong_gen = KEEL_ENTITY_MAKE(KEEL_ENTITY_INDEX(special), KEEL_ENTITY_GEN(special) + 1);
    ck_assert(!keel_view_alive(v, wrong_gen));
    ck_assert_rc(keel_view_get(v, wrong_gen, s.a, &x), KEEL_ESTALE);
    /* SINGLE_VERSION and TRANSIENT are not part of a view */
    ck_assert_rc(keel_get(s.w, special, s.sv, &y), KEEL_OK);
    ck_assert_int_eq(y, 11);
    ck_assert_rc(keel_view_get(v, special, s.sv, &y), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, special, s.tr, &y), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, with_t, s.sv, &y), KEEL_EINVAL);
    /* unregistered ids */
    ck_assert_rc(keel_view_get(v, special, 0, &x), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, special, keel_component_count(s.w) + 1, &x), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, special, 200, &x), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, special, 100000, &x), KEEL_EINVAL);
    /* missing components */
    ck_assert_rc(keel_view_get(v, without_t, s.t, &x), KEEL_ENOENT);
    ck_assert_rc(keel_view_get(v, special, s.t, &x), KEEL_ENOENT);
    ck_assert_rc(keel_view_get(v, without_tag, s.tag, NULL), KEEL_ENOENT);
    ck_assert_rc(keel_view_get(v, with_tag, s.tag, NULL), KEEL_OK); /* tags need no out */
    ck_assert_rc(keel_view_get(v, with_t, s.t, &x), KEEL_OK);
    int64_t wt = 0;
    ck_assert_ok(keel_get(s.w, with_t, s.t, &wt));
    ck_assert_int_eq(x, wt);
    ck_assert_int_le(x, 8);
    /* the special entity's VERSIONED values are there */
    ck_assert_ok(keel_view_get(v, special, s.born, &x));
    ck_assert_int_eq(x, 3);
    keel_entity self = 0;
    ck_assert_ok(keel_view_get(v, special, s.self, &self));
    ck_assert_uint_eq(self, special);
    /* NULL arguments */
    ck_assert_rc(keel_view_get(NULL, special, s.a, &x), KEEL_EINVAL);
    ck_assert_rc(keel_view_get(v, special, s.a, NULL), KEEL_EINVAL);
    ck_assert_uint_eq(keel_view_tick(NULL), 0);
    ck_assert_uint_eq(keel_view_count(NULL), 0);
    ck_assert(!keel_view_alive(NULL, special));
    keel_view_end(NULL); /* ignored */
    ck_assert(keel_view_alive(v, special)); /* v still open */
    keel_view_end(v);
    keel_cmdbuf_destroy(cb);
    sim_close(&s);
}
END_TEST

/* A view held open across steps keeps showing its own tick. */
START_TEST(test_held_view_keeps_tick)
{
    enum { CAP = 4096 };
    sim s;
    sim_init(&s, 2, true, NULL);
    s.spawn_first = 120;
    tu_step_n(s.rt, 4);
    const uint64_t T = 4;
    keel_entity *held = malloc(CAP * sizeof *held), *later = malloc(CAP * sizeof *later);
    ent_state *snap = malloc(CAP * sizeof *snap);
    ck_assert_ptr_nonnull(held);
    ck_assert_ptr_nonnull(later);
    ck_assert_ptr_nonnull(snap);
    uint32_t nheld = live_handles(&s, held, CAP);
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_uint_eq(keel_view_tick(v), T);
    ck_assert_uint_eq(keel_view_count(v), nheld);
    for (uint32_t i = 0; i < nheld; i++) {
        snap[i] = view_state(&s, v, held[i]);
        ent_state ws = world_state(&s, held[i]);
        assert_same_state(held[i], &snap[i], &ws);
    }
    uint32_t chunks_before = total_chunks(s.w);

    /* heavy churn while the view is held: shrink, then grow again */
    s.destroy_mod = 2;
    s.spawn_base = 2;
    s.spawn_var = 3;
    tu_step_n(s.rt, 4);
    uint32_t chunks_low = total_chunks(s.w);
    s.destroy_mod = 5;
    s.spawn_base = 30;
    tu_step_n(s.rt, 3);
    ck_assert_uint_eq(keel_runtime_tick(s.rt), T + 7);
    ck_assert_uint_lt(chunks_low, chunks_before); /* the sync point freed chunks */

    /* the view is unchanged */
    ck_assert_uint_eq(keel_view_tick(v), T);
    ck_assert_uint_eq(keel_view_count(v), nheld);
    uint32_t destroyed = 0, survivors = 0;
    for (uint32_t i = 0; i < nheld; i++) {
        ent_state vs = view_state(&s, v, held[i]);
        assert_same_state(held[i], &snap[i], &vs);
        ck_assert(vs.alive);
        ck_assert_int_eq(vs.a + vs.b, K_SUM);
        if (!keel_alive(s.w, held[i])) {
            destroyed++;
            continue;
        }
        survivors++;
        int64_t a = 0;
        ck_assert_ok(keel_get(s.w, held[i], s.a, &a));
        ck_assert_int_ne(a, vs.a); /* the live world moved on: move ran 7 times */
    }
    ck_assert_uint_gt(destroyed, 0);
    ck_assert_uint_gt(survivors, 0);
    /* entities spawned later, some in reused slots, are not in the view */
    uint32_t nlater = live_handles(&s, later, CAP), fresh = 0, reused = 0;
    for (uint32_t i = 0; i < nlater; i++) {
        if (contains(held, nheld, later[i]))
            continue;
        fresh++;
        ck_assert(!keel_view_alive(v, later[i]));
        int64_t x = 0;
        ck_assert_rc(keel_view_get(v, later[i], s.a, &x), KEEL_ESTALE);
        for (uint32_t k = 0; k < nheld; k++)
            if (KEEL_ENTITY_INDEX(held[k]) == KEEL_ENTITY_INDEX(later[i])) {
                reused++;
                ck_assert(keel_view_alive(v, held[k])); /* the slot's old occupant, in the view */
            }
    }
    ck_assert_uint_gt(fresh, 0);
    ck_assert_uint_gt(reused, 0);
    ck_assert_uint_ne(keel_world_count(s.w), nheld);

    /* a new view shows the live world */
    const keel_view *v2 = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v2));
    ck_assert_ptr_ne(v2, v);
    assert_view_matches_world(&s, v2);
    keel_view_end(v2);
    keel_view_end(v);
    free(held);
    free(later);
    free(snap);
    sim_close(&s);
}
END_TEST

/* Views nest, also across steps, and end in any order. */
START_TEST(test_views_nest)
{
    sim s;
    sim_init(&s, 2, true, NULL);
    tu_step_n(s.rt, 2);
    keel_entity e[8];
    uint32_t ne = 0;
    for (uint32_t i = 0; i < atomic_load(&s.nreg) && ne < 8; i++)
        if (keel_alive(s.w, s.reg[i]))
            e[ne++] = s.reg[i];
    ck_assert_uint_eq(ne, 8);
    s.destroy_mod = 0; /* keep e[] alive */

    const keel_view *v1 = NULL, *v1b = NULL, *v2 = NULL, *v3 = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v1));
    ck_assert_ok(keel_view_begin(s.rt, &v1b)); /* nested, same tick */
    ck_assert_ptr_eq(v1, v1b);
    ck_assert_uint_eq(keel_view_tick(v1b), 2);
    tu_step_n(s.rt, 1);
    ck_assert_ok(keel_view_begin(s.rt, &v2));
    ck_assert_uint_eq(keel_view_tick(v2), 3);
    tu_step_n(s.rt, 1);
    ck_assert_ok(keel_view_begin(s.rt, &v3));
    ck_assert_uint_eq(keel_view_tick(v3), 4);
    assert_view_matches_world(&s, v3);
    tu_step_n(s.rt, 1);

    ent_state st1[8], st2[8];
    for (uint32_t i = 0; i < ne; i++) {
        st1[i] = view_state(&s, v1, e[i]);
        st2[i] = view_state(&s, v2, e[i]);
        ent_state st3 = view_state(&s, v3, e[i]);
        ck_assert(st1[i].alive && st2[i].alive && st3.alive);
        /* one move per tick between them */
        ck_assert_int_eq(st2[i].a, st1[i].a - move_amount(e[i], 3));
        ck_assert_int_eq(st3.a, st2[i].a - move_amount(e[i], 4));
        ck_assert_int_eq(st3.a + st3.b, K_SUM);
    }
    keel_view_end(v1b); /* out of order */
    keel_view_end(v3);
    ck_assert_uint_eq(keel_view_tick(v1), 2);
    ck_assert_uint_eq(keel_view_tick(v2), 3);
    tu_step_n(s.rt, 2); /* reclaims run; v1 and v2 are still open */
    for (uint32_t i = 0; i < ne; i++) {
        ent_state a1 = view_state(&s, v1, e[i]), a2 = view_state(&s, v2, e[i]);
        assert_same_state(e[i], &st1[i], &a1);
        assert_same_state(e[i], &st2[i], &a2);
    }
    keel_view_end(v1);
    keel_view_end(v2);
    sim_close(&s);
}
END_TEST

/* A system that opens a view in the middle of a tick. */
typedef struct probe {
    sim *s;
    keel_entity changed, spawned, destroyed;
    _Atomic uint32_t runs;
    uint64_t tick;
    uint32_t count;
    int64_t a;
    bool spawned_alive, destroyed_alive;
    int rc_spawned;
} probe;

static int sys_probe(keel_ctx *ctx, void *user)
{
    (void)ctx;
    probe *p = user;
    const keel_view *v = NULL;
    if (!p->changed || keel_view_begin(p->s->rt, &v))
        return 0;
    p->tick = keel_view_tick(v);
    p->count = keel_view_count(v);
    p->a = -1;
    (void)keel_view_get(v, p->changed, p->s->a, &p->a);
    p->spawned_alive = keel_view_alive(v, p->spawned);
    int64_t x = 0;
    p->rc_spawned = keel_view_get(v, p->spawned, p->s->a, &x);
    p->destroyed_alive = keel_view_alive(v, p->destroyed);
    keel_view_end(v);
    atomic_fetch_add(&p->runs, 1);
    return 0;
}

/* keel_set and keel_cmdbuf_apply between steps: invisible to views until
 * the next step starts; published (with the old tick number) before its
 * systems run. */
START_TEST(test_between_steps_published_at_next_step)
{
    sim s;
    probe p = {.s = &s};
    keel_system_desc pd = {.name = "probe", .run = sys_probe, .user = &p};
    pd.before[0] = "fixup";
    pd.before[1] = "move";
    pd.before[2] = "restore";
    pd.before[3] = "churn";
    sim_init(&s, 2, true, &pd);
    tu_step_n(s.rt, 3);
    s.destroy_mod = 0;
    s.toggle_mod = 0;
    s.spawn_base = 0;
    s.spawn_var = 0;
    tu_step_n(s.rt, 1); /* tick 4: no structural change from now on */
    keel_entity live[256];
    uint32_t n = live_handles(&s, live, 256);
    ck_assert_uint_ge(n, 2);
    keel_entity changed = live[0], destroyed = live[n - 1];

    const keel_view *v_old = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v_old));
    ck_assert_uint_eq(keel_view_tick(v_old), 4);
    ent_state old_changed = view_state(&s, v_old, changed);

    int64_t a = 777, b = K_SUM - 777;
    ck_assert_ok(keel_set(s.w, changed, s.a, &a));
    ck_assert_ok(keel_set(s.w, changed, s.b, &b));
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(s.w, &cb));
    ck_assert_ok(keel_cmd_destroy(cb, destroyed));
    ck_assert_ok(spawn_one(&s, cb, 4, 12345));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_entity spawned = keel_cmdbuf_result(cb).created[0];
    ck_assert_uint_eq(KEEL_ENTITY_INDEX(spawned), KEEL_ENTITY_INDEX(destroyed)); /* slot reused */
    ck_assert(!keel_alive(s.w, destroyed));

    /* not published yet: a view opened now is the tick-4 view */
    const keel_view *v_mid = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v_mid));
    ck_assert_uint_eq(keel_view_tick(v_mid), 4);
    ck_assert_uint_eq(keel_view_count(v_mid), n);
    ent_state mid = view_state(&s, v_mid, changed);
    assert_same_state(changed, &old_changed, &mid);
    ck_assert(!keel_view_alive(v_mid, spawned));
    ck_assert(keel_view_alive(v_mid, destroyed));
    keel_view_end(v_mid);

    /* step 5: the probe runs first and sees the between-step state as tick 4 */
    p.changed = changed;
    p.spawned = spawned;
    p.destroyed = destroyed;
    tu_step_n(s.rt, 1);
    ck_assert_uint_eq(atomic_load(&p.runs), 1);
    ck_assert_uint_eq(p.tick, 4);
    ck_assert_uint_eq(p.count, n);
    ck_assert_int_eq(p.a, 777);
    ck_assert(p.spawned_alive);
    ck_assert_int_eq(p.rc_spawned, KEEL_OK);
    ck_assert(!p.destroyed_alive);

    /* after the step: tick 5 with the changes (and tick 5's systems) */
    const keel_view *v_new = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v_new));
    assert_view_matches_world(&s, v_new);
    ck_assert_uint_eq(keel_view_tick(v_new), 5);
    ent_state now = view_state(&s, v_new, changed);
    ck_assert_int_eq(now.a, 777 - move_amount(changed, 5));
    ck_assert_int_eq(now.a + now.b, K_SUM);
    ent_state sp = view_state(&s, v_new, spawned);
    ck_assert(sp.alive);
    ck_assert_uint_eq(sp.self, spawned);
    ck_assert(!keel_view_alive(v_new, destroyed));
    keel_view_end(v_new);

    /* the view held since tick 4 is unchanged */
    ent_state held = view_state(&s, v_old, changed);
    assert_same_state(changed, &old_changed, &held);
    ck_assert(!keel_view_alive(v_old, spawned));
    ck_assert(keel_view_alive(v_old, destroyed));
    ck_assert_uint_eq(keel_view_tick(v_old), 4);
    keel_view_end(v_old);
    keel_cmdbuf_destroy(cb);
    sim_close(&s);
}
END_TEST

/* A tick that changes nothing still completes: the view shows its number. */
START_TEST(test_idle_tick_advances_view_tick)
{
    sim s;
    keel_system_desc nd = {.name = "noop", .run = tu_sys_noop};
    sim_init(&s, 1, false, &nd);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(s.w, &cb));
    ck_assert_ok(spawn_one(&s, cb, 0, 1));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    for (uint64_t t = 1; t <= 3; t++) {
        tu_step_n(s.rt, 1);
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(s.rt, &v));
        ck_assert_uint_eq(keel_view_count(v), 1);
        ck_assert_msg(keel_view_tick(v) == t, "after step %llu the view shows tick %llu", (unsigned long long)t,
                      (unsigned long long)keel_view_tick(v));
        keel_view_end(v);
    }
    keel_cmdbuf_destroy(cb);
    sim_close(&s);
}
END_TEST

/* ---- batched destroy under a published view ---------------------------------
 * Playback replays a long run of destroys on slots and entity arrays only
 * and copies cells at the end (world/command.c, "batched destroy"); a chunk
 * or slot page the view shares ends the run so the one-by-one path copies
 * it first. Two runtimes hold the same published view; one applies three
 * buffers at once (a lone destroy that owns chunk 0 and the slot page, a run
 * that starts in chunk 0 and reaches shared chunks, a run over chunks the
 * second buffer made private), the other applies the same destroys one per
 * apply. The worlds must be identical and the held view unchanged. */
enum { BD_N = 600, BD_RUN2 = 120, BD_RUN3 = 250 };

typedef struct bd_world {
    keel_runtime *rt;
    keel_world *w;
    keel_component a, sv;
    keel_entity e[BD_N];
} bd_world;

static void bd_init(bd_world *b)
{
    memset(b, 0, sizeof *b);
    keel_runtime_desc d = {.workers = 1, .tick_rate_hz = -1, .world = {.chunk_rows = 16}};
    ck_assert_ok(keel_runtime_create(&d, &b->rt));
    b->w = keel_runtime_world(b->rt);
    b->a = reg_comp(b->w, "a", 8, KEEL_VERSIONED, i64_field);
    b->sv = reg_comp(b->w, "sv", 4, KEEL_SINGLE_VERSION, i32_field);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(b->w, &cb));
    for (uint32_t i = 0; i < BD_N; i++) {
        int64_t a = (int64_t)i * 11;
        int32_t sv = (int32_t)i;
        ck_assert_ok(keel_cmd_spawn(cb, (keel_init[]){{b->a, &a}, {b->sv, &sv}}, i % 3 == 0 ? 2 : 1));
    }
    ck_assert_ok(keel_cmdbuf_apply(cb));
    memcpy(b->e, keel_cmdbuf_result(cb).created, sizeof b->e);
    keel_cmdbuf_destroy(cb);
    keel_schedule *sc = sched_new(b->rt);
    keel_system_desc nd = {.name = "noop", .run = tu_sys_noop};
    add_sys(sc, &nd);
    tu_install(b->rt, sc);
    ck_assert_ok(keel_runtime_step(b->rt)); /* publishes: the view shares every chunk */
}

/* Destroy targets[0..n) in one apply, or one command per apply. */
static void bd_destroy(bd_world *b, const uint32_t *targets, uint32_t n, bool at_once)
{
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(b->w, &cb));
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_ok(keel_cmd_destroy(cb, b->e[targets[i]]));
        if (!at_once)
            ck_assert_ok(keel_cmdbuf_apply(cb));
    }
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmdbuf_destroy(cb);
}

static void bd_assert_same(const bd_world *x, const bd_world *y)
{
    ck_assert_uint_eq(keel_world_hash(x->w), keel_world_hash(y->w));
    ck_assert_uint_eq(x->w->nslots, y->w->nslots);
    for (uint32_t i = 0; i < x->w->nslots; i++) {
        const world_slot *sx = world_slot_at(x->w, i), *sy = world_slot_at(y->w, i);
        ck_assert_uint_eq(world_slot_gen(x->w, sx), world_slot_gen(y->w, sy));
        ck_assert_uint_eq(sx->table, sy->table);
        ck_assert_uint_eq(sx->row, sy->row); /* a free slot's row is its next generation */
    }
    for (uint32_t i = 0; i < BD_N; i++) {
        int64_t ax = -1, ay = -2;
        int32_t vx = -1, vy = -2;
        ck_assert_int_eq(keel_get(x->w, x->e[i], x->a, &ax), keel_get(y->w, y->e[i], y->a, &ay));
        int rc = keel_get(x->w, x->e[i], x->sv, &vx);
        ck_assert_int_eq(rc, keel_get(y->w, y->e[i], y->sv, &vy));
        if (keel_alive(x->w, x->e[i])) {
            ck_assert_int_eq(ax, (int64_t)i * 11);
            ck_assert_int_eq(ax, ay);
        }
        if (rc == KEEL_OK) {
            ck_assert_int_eq(vx, (int32_t)i);
            ck_assert_int_eq(vx, vy);
        }
    }
}

/* Every entity is alive in v with its spawn values. */
static void bd_assert_view(const bd_world *b, const keel_view *v)
{
    ck_assert_uint_eq(keel_view_count(v), BD_N);
    for (uint32_t i = 0; i < BD_N; i++) {
        int64_t a = -1;
        ck_assert(keel_view_alive(v, b->e[i]));
        ck_assert_ok(keel_view_get(v, b->e[i], b->a, &a));
        ck_assert_int_eq(a, (int64_t)i * 11);
    }
}

START_TEST(test_batched_destroy_under_view)
{
    static bd_world x, y; /* x: at once, y: one by one */
    bd_init(&x);
    bd_init(&y);
    ck_assert_uint_eq(keel_world_hash(x.w), keel_world_hash(y.w));
    const world_table *t = x.w->tables[x.w->ntables - 1];
    ck_assert_uint_gt(t->nchunks, 4);
    ck_assert_ptr_eq(t->chunks[0]->entities, t->chunks[0]->pub_entities); /* shared with the view */

    const keel_view *vx = NULL, *vy = NULL;
    ck_assert_ok(keel_view_begin(x.rt, &vx));
    ck_assert_ok(keel_view_begin(y.rt, &vy));

    /* the table of `a` alone holds the entities with i % 3 != 0: e[1], e[2],
     * e[4], ... in rows 0, 1, 2, ...; destroying e[1] owns its chunk 0 */
    uint32_t first[1] = {1};
    bd_destroy(&x, first, 1, true);
    bd_destroy(&y, first, 1, false);
    bd_assert_same(&x, &y);

    /* run 2: rows 1..15 of that table (chunk 0, private now), then shuffled
     * targets anywhere (shared chunks: the run stops, the rest goes one by one) */
    uint32_t run2[BD_RUN2], n = 0;
    for (uint32_t i = 2; n < 15; i++)
        if (i % 3 != 0)
            run2[n++] = i;
    uint64_t rng = 0x2545f4914f6cdd1dull;
    while (n < BD_RUN2) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        run2[n++] = (uint32_t)(rng % BD_N); /* repeats: stale destroys */
    }
    bd_destroy(&x, run2, BD_RUN2, true);
    bd_destroy(&y, run2, BD_RUN2, false);
    bd_assert_same(&x, &y);
    bd_assert_view(&x, vx);

    /* run 3: shuffled, over chunks partly made private above */
    uint32_t run3[BD_RUN3];
    for (uint32_t i = 0; i < BD_RUN3; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        run3[i] = (uint32_t)(rng % BD_N);
    }
    bd_destroy(&x, run3, BD_RUN3, true);
    bd_destroy(&y, run3, BD_RUN3, false);
    bd_assert_same(&x, &y);
    bd_assert_view(&x, vx);
    bd_assert_view(&y, vy);
    keel_view_end(vx);
    keel_view_end(vy);

    /* the next publication takes the new state; the retired buffers go */
    ck_assert_ok(keel_runtime_step(x.rt));
    ck_assert_ok(keel_runtime_step(y.rt));
    bd_assert_same(&x, &y);
    ck_assert_ok(keel_view_begin(x.rt, &vx));
    ck_assert_uint_eq(keel_view_count(vx), keel_world_count(x.w));
    keel_view_end(vx);
    keel_runtime_close(x.rt);
    keel_runtime_close(y.rt);
}
END_TEST

static Suite *view_basic(void)
{
    Suite *s = suite_create("view_basic");
    TCase *tc = tcase_create("basic");
    tcase_add_test(tc, test_before_first_tick);
    tcase_add_test(tc, test_tracks_world_serial);
    tcase_add_test(tc, test_tracks_world_parallel);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_held_view_keeps_tick);
    tcase_add_test(tc, test_views_nest);
    tcase_add_test(tc, test_between_steps_published_at_next_step);
    tcase_add_test(tc, test_idle_tick_advances_view_tick);
    tcase_add_test(tc, test_batched_destroy_under_view);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * view_concurrent
 * ============================================================================= */

typedef struct reader {
    sim *s;
    _Atomic bool *stop;
    pthread_t thread;
    _Atomic uint64_t checked;    /* views with entities whose count was checked against the registry */
    _Atomic uint64_t ticks_seen; /* distinct ticks among its views, in order */
    /* read by the test thread after join */
    uint64_t views, entities, bad_rc, bad_sum, bad_self, bad_born, bad_t, bad_count, bad_tick, bad_dead;
    uint64_t first_tick, last_tick;
} reader;

static void *reader_main(void *arg)
{
    reader *r = arg;
    sim *s = r->s;
    uint64_t last = 0;
    r->first_tick = UINT64_MAX;
    while (!atomic_load(r->stop)) {
        const keel_view *v = NULL;
        if (keel_view_begin(s->rt, &v) || !v) {
            r->bad_rc++;
            break;
        }
        uint64_t tk = keel_view_tick(v);
        if (tk < last)
            r->bad_tick++;
        if (tk != last)
            atomic_fetch_add(&r->ticks_seen, 1);
        last = tk;
        r->first_tick = tk < r->first_tick ? tk : r->first_tick;
        uint32_t count = keel_view_count(v);
        /* the registry lags a tick behind: wait (holding the view) until it
         * covers this view's tick */
        bool registered = true;
        while (atomic_load_explicit(&s->reg_through, memory_order_acquire) < tk) {
            if (atomic_load(r->stop)) {
                registered = false;
                break;
            }
            sched_yield();
        }
        uint32_t n = atomic_load_explicit(&s->nreg, memory_order_acquire), alive = 0;
        for (uint32_t i = 0; i < n; i++) {
            keel_entity e = s->reg[i];
            int64_t a = 0, b = 0, born = 0, t = 0;
            keel_entity self = 0;
            if (!keel_view_alive(v, e)) {
                if (i % 8 == 0 && keel_view_get(v, e, s->a, &a) != KEEL_ESTALE)
                    r->bad_dead++;
                continue;
            }
            alive++;
            if (keel_view_get(v, e, s->a, &a) || keel_view_get(v, e, s->b, &b) ||
                keel_view_get(v, e, s->self, &self) || keel_view_get(v, e, s->born, &born)) {
                r->bad_rc++;
                continue;
            }
            if (a + b != K_SUM)
                r->bad_sum++;
            if (born < 0 || (uint64_t)born > tk)
                r->bad_born++;
            if (!(self == e || (self == KEEL_ENTITY_NULL && (uint64_t)born == tk)))
                r->bad_self++;
            int rc = keel_view_get(v, e, s->t, &t);
            if (rc == KEEL_OK) {
                if (t < born || (uint64_t)t > tk)
                    r->bad_t++;
            } else if (rc != KEEL_ENOENT) {
                r->bad_rc++;
            }
            int32_t sv = 0;
            if (i % 16 == 0 && keel_view_get(v, e, s->sv, &sv) != KEEL_EINVAL)
                r->bad_rc++;
        }
        r->entities += alive;
        if (registered) {
            if (alive != count)
                r->bad_count++;
            /* only a view with entities counts as a check: a reader that ran
             * only while the world was still empty has checked nothing */
            if (alive)
                atomic_fetch_add(&r->checked, 1);
        }
        keel_view_end(v);
        r->views++;
    }
    r->last_tick = last;
    return NULL;
}

static void assert_reader_clean(const reader *r, uint64_t final_tick)
{
    ck_assert_msg(r->bad_rc + r->bad_sum + r->bad_self + r->bad_born + r->bad_t + r->bad_count + r->bad_tick +
                          r->bad_dead ==
                      0,
                  "reader saw anomalies: rc %llu sum %llu self %llu born %llu t %llu count %llu tick %llu dead %llu",
                  (unsigned long long)r->bad_rc, (unsigned long long)r->bad_sum, (unsigned long long)r->bad_self,
                  (unsigned long long)r->bad_born, (unsigned long long)r->bad_t, (unsigned long long)r->bad_count,
                  (unsigned long long)r->bad_tick, (unsigned long long)r->bad_dead);
    ck_assert_uint_gt(r->views, 0);
    ck_assert_uint_gt(atomic_load(&r->checked), 0);
    ck_assert_uint_gt(r->entities, 0);
    ck_assert_uint_le(r->last_tick, final_tick);
}

#define NREADERS 3
#define MIN_TICKS 300
#define MIN_CHECKS 25

/* Every reader has checked MIN_CHECKS views with entities and seen the
 * tick move: the test steps until then, so neither depends on how the
 * threads happen to be scheduled (only the guard does). */
static bool readers_done(reader *rd, int n)
{
    for (int i = 0; i < n; i++)
        if (atomic_load(&rd[i].checked) < MIN_CHECKS || atomic_load(&rd[i].ticks_seen) < 2)
            return false;
    return true;
}

/* Readers against stepping (driver == false) or the TickDriver. */
static void run_concurrent(int32_t workers, bool driver)
{
    sim s;
    sim_init(&s, workers, true, NULL);
    _Atomic bool stop = false;
    reader rd[NREADERS];
    memset(rd, 0, sizeof rd);
    for (int i = 0; i < NREADERS; i++) {
        rd[i].s = &s;
        rd[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&rd[i].thread, NULL, reader_main, &rd[i]), 0);
    }
    uint64_t deadline = tu_now_ns() + GUARD_NS;
    bool timed_out = false;
    if (driver) {
        ck_assert_ok(keel_runtime_start(s.rt));
        while (keel_runtime_tick(s.rt) < MIN_TICKS || !readers_done(rd, NREADERS)) {
            if (tu_now_ns() > deadline) {
                timed_out = true;
                break;
            }
            sched_yield();
        }
        ck_assert_int_eq(keel_runtime_stop(s.rt), 0);
    } else {
        while (keel_runtime_tick(s.rt) < MIN_TICKS || !readers_done(rd, NREADERS)) {
            if (tu_now_ns() > deadline) {
                timed_out = true;
                break;
            }
            int rc = keel_runtime_step(s.rt);
            if (rc) {
                atomic_store(&stop, true);
                ck_assert_ok(rc);
            }
        }
    }
    atomic_store(&stop, true);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(rd[i].thread, NULL);
    ck_assert_msg(!timed_out, "readers did not complete %d checks and see the tick move within the guard",
                  MIN_CHECKS);
    uint64_t final_tick = keel_runtime_tick(s.rt);
    ck_assert_uint_ge(final_tick, MIN_TICKS);
    uint64_t seen = 0;
    for (int i = 0; i < NREADERS; i++) {
        assert_reader_clean(&rd[i], final_tick);
        seen += atomic_load(&rd[i].ticks_seen);
    }
    ck_assert_uint_gt(seen, NREADERS); /* the readers saw the ticks move */
    ck_assert_uint_gt(atomic_load(&s.nreg), 2 * MIN_TICKS); /* churn really happened */
    /* the final state: a view equals the world */
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    assert_view_matches_world(&s, v);
    keel_view_end(v);
    sim_close(&s);
}

START_TEST(test_readers_while_stepping_serial)
{
    run_concurrent(1, false);
}
END_TEST

START_TEST(test_readers_while_stepping_parallel)
{
    run_concurrent(2, false);
}
END_TEST

START_TEST(test_readers_with_driver)
{
    run_concurrent(2, true);
}
END_TEST

/* A reader thread holds one view while the main thread completes steps. */
typedef struct holder {
    sim *s;
    const keel_entity *held; /* live at the view's tick (set before the thread starts) */
    uint32_t nheld;
    const keel_entity *later; /* live after the steps (set before phase 2) */
    uint32_t nlater;
    _Atomic int phase;        /* 1: reader holds the view; 2: main stepped; 3: reader done */
    /* results, read after join */
    bool guard_failed;
    uint64_t tick0, tick1;
    uint32_t count0, count1, mismatches, later_visible, later_fresh, sum_bad;
} holder;

static bool wait_phase(_Atomic int *phase, int want)
{
    uint64_t deadline = tu_now_ns() + GUARD_NS;
    while (atomic_load(phase) < want) {
        if (tu_now_ns() > deadline)
            return false;
        sched_yield();
    }
    return true;
}

static bool same_state(const ent_state *x, const ent_state *y)
{
    return x->alive == y->alive && x->rc_a == y->rc_a && x->rc_b == y->rc_b && x->rc_self == y->rc_self &&
           x->rc_born == y->rc_born && x->rc_t == y->rc_t && x->rc_tag == y->rc_tag && x->a == y->a &&
           x->b == y->b && x->self == y->self && x->born == y->born && (x->rc_t || x->t == y->t);
}

static void *holder_main(void *arg)
{
    holder *h = arg;
    ent_state *snap = calloc(h->nheld ? h->nheld : 1, sizeof *snap);
    const keel_view *v = NULL;
    if (!snap || keel_view_begin(h->s->rt, &v)) {
        h->mismatches++;
        atomic_store(&h->phase, 3);
        free(snap);
        return NULL;
    }
    h->tick0 = keel_view_tick(v);
    h->count0 = keel_view_count(v);
    for (uint32_t i = 0; i < h->nheld; i++) {
        snap[i] = view_state(h->s, v, h->held[i]);
        if (!snap[i].alive || snap[i].a + snap[i].b != K_SUM)
            h->sum_bad++;
    }
    atomic_store(&h->phase, 1);
    if (!wait_phase(&h->phase, 2))
        h->guard_failed = true;
    h->tick1 = keel_view_tick(v);
    h->count1 = keel_view_count(v);
    for (uint32_t i = 0; i < h->nheld; i++) {
        ent_state now = view_state(h->s, v, h->held[i]);
        if (!same_state(&snap[i], &now))
            h->mismatches++;
    }
    for (uint32_t i = 0; i < h->nlater; i++) {
        if (contains(h->held, h->nheld, h->later[i]))
            continue;
        h->later_fresh++;
        if (keel_view_alive(v, h->later[i]))
            h->later_visible++;
    }
    keel_view_end(v);
    free(snap);
    atomic_store(&h->phase, 3);
    return NULL;
}

START_TEST(test_held_view_does_not_block_ticks)
{
    enum { CAP = 4096, HOLD_STEPS = 8 };
    sim s;
    sim_init(&s, 2, true, NULL);
    s.spawn_first = 150;
    tu_step_n(s.rt, 3);
    keel_entity *held = malloc(CAP * sizeof *held), *later = malloc(CAP * sizeof *later);
    ck_assert_ptr_nonnull(held);
    ck_assert_ptr_nonnull(later);
    holder h = {.s = &s, .held = held};
    h.nheld = live_handles(&s, held, CAP);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, holder_main, &h), 0);
    bool holding = wait_phase(&h.phase, 1);
    if (!holding)
        atomic_store(&h.phase, 2);
    ck_assert_msg(holding, "the reader did not open its view");
    uint32_t chunks_before = total_chunks(s.w);
    s.destroy_mod = 2; /* shrink while the view is held */
    s.spawn_base = 3;
    s.spawn_var = 2;
    for (int i = 0; i < HOLD_STEPS; i++) {
        int rc = keel_runtime_step(s.rt); /* completes although a reader holds a view */
        if (rc)
            atomic_store(&h.phase, 2);
        ck_assert_ok(rc);
        /* the main thread's own views see the new ticks meanwhile */
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(s.rt, &v));
        ck_assert_uint_eq(keel_view_tick(v), 3 + (uint64_t)i + 1);
        keel_view_end(v);
    }
    uint32_t chunks_after = total_chunks(s.w);
    h.nlater = live_handles(&s, later, CAP);
    h.later = later;
    ck_assert_int_eq(atomic_load(&h.phase), 1); /* still holding: the steps did not wait for it */
    atomic_store(&h.phase, 2);
    pthread_join(th, NULL);
    ck_assert_int_eq(atomic_load(&h.phase), 3);
    ck_assert(!h.guard_failed);
    ck_assert_uint_eq(h.tick0, 3);
    ck_assert_uint_eq(h.tick1, 3);
    ck_assert_uint_eq(h.count0, h.nheld);
    ck_assert_uint_eq(h.count1, h.nheld);
    ck_assert_uint_eq(h.sum_bad, 0);
    ck_assert_uint_eq(h.mismatches, 0);
    ck_assert_uint_gt(h.later_fresh, 0);
    ck_assert_uint_eq(h.later_visible, 0);
    ck_assert_uint_lt(chunks_after, chunks_before);
    uint32_t gone = 0;
    for (uint32_t i = 0; i < h.nheld; i++)
        gone += !keel_alive(s.w, held[i]);
    ck_assert_uint_gt(gone, h.nheld / 2);
    ck_assert_uint_eq(keel_runtime_tick(s.rt), 3 + HOLD_STEPS);
    free(held);
    free(later);
    sim_close(&s);
}
END_TEST

static Suite *view_concurrent(void)
{
    Suite *s = suite_create("view_concurrent");
    TCase *tc = tcase_create("concurrent");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_readers_while_stepping_serial);
    tcase_add_test(tc, test_readers_while_stepping_parallel);
    tcase_add_test(tc, test_readers_with_driver);
    tcase_add_test(tc, test_held_view_does_not_block_ticks);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- recycling (world/version.c "Recycling") ------------------------------------ */

/* The recycling world: RC_N entities with VERSIONED a, b (a + b == K, a ==
 * a0 + tick for an entity whose a was a0 at tick 0), chunks of 32 rows,
 * one parallel query system that `rewrites` both every tick. */
enum { RC_N = 300, RC_MAXCOLS = 64 };

typedef struct rc_world {
    keel_runtime *rt;
    keel_world *w;
    keel_component a, b;
    keel_entity e[RC_N];
    int64_t a0[RC_N];
} rc_world;

static int sys_rewrite(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    int64_t *a = KEEL_COLUMN(it, int64_t, 0), *b = KEEL_COLUMN(it, int64_t, 1);
    const int64_t *a0 = it->prev[0], *b0 = it->prev[1];
    for (uint32_t r = 0; r < it->count; r++) {
        a[r] = a0[r] + 1;
        b[r] = b0[r] - 1;
    }
    return 0;
}

/* The system that rewrites a and b of every entity each tick. */
static keel_system_desc rc_rewrite(const rc_world *r)
{
    return (keel_system_desc){.name = "rewrite", .kind = KEEL_SYSTEM_QUERY, .each_chunk = sys_rewrite,
                              .query = {.with = {r->a, r->b}}, .parallel = true, .min_chunk_rows = 16,
                              .access = {.rewrites = {r->a, r->b}}};
}

static void rc_init(rc_world *r, int32_t workers)
{
    memset(r, 0, sizeof *r);
    keel_runtime_desc d = {.workers = workers, .tick_rate_hz = -1, .world = {.chunk_rows = 32}};
    ck_assert_ok(keel_runtime_create(&d, &r->rt));
    r->w = keel_runtime_world(r->rt);
    r->a = reg_comp(r->w, "a", 8, KEEL_VERSIONED, i64_field);
    r->b = reg_comp(r->w, "b", 8, KEEL_VERSIONED, i64_field);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(r->w, &cb));
    for (uint32_t i = 0; i < RC_N; i++) {
        int64_t a = (int64_t)i * 7 - 1000, b = K_SUM - a;
        ck_assert_ok(keel_cmd_spawn(cb, (keel_init[]){{r->a, &a}, {r->b, &b}}, 2));
    }
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).created_count, RC_N);
    memcpy(r->e, keel_cmdbuf_result(cb).created, sizeof r->e);
    keel_cmdbuf_destroy(cb);
    for (uint32_t i = 0; i < RC_N; i++)
        r->a0[i] = (int64_t)i * 7 - 1000;
    keel_schedule *sc = sched_new(r->rt);
    keel_system_desc rw = rc_rewrite(r);
    add_sys(sc, &rw);
    tu_install(r->rt, sc);
}

/* The column versions of the table holding a and b, in chunk order. */
static uint32_t rc_colvers(const rc_world *r, world_colver **out)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < r->w->ntables; id++) {
        const world_table *t = r->w->tables[id];
        if (!t->col_of[r->a] || !t->col_of[r->b])
            continue;
        for (uint32_t k = 0; k < t->nchunks; k++)
            for (uint32_t c = 0; c < t->ncols; c++) {
                ck_assert_uint_lt(n, RC_MAXCOLS);
                out[n++] = &t->chunks[k]->cols[c];
            }
    }
    return n;
}

static void *rc_spare(world_colver *v)
{
    return atomic_load_explicit(&v->spare, memory_order_relaxed);
}

/* The recycling world on two workers after three ticks (each column has
 * its spare); its column versions into cv, their count returned. */
static uint32_t rc_three_ticks(rc_world *r, world_colver **cv)
{
    rc_init(r, 2);
    uint32_t n = rc_colvers(r, cv);
    for (int i = 0; i < 3; i++)
        ck_assert_ok(keel_runtime_step(r->rt));
    return n;
}

/* Every entity's a and b, through the view v, are the values of tick `tick`. */
static uint32_t rc_view_bad(const rc_world *r, const keel_view *v, uint64_t tick)
{
    uint32_t bad = 0;
    for (uint32_t i = 0; i < RC_N; i++) {
        int64_t a = 0, b = 0;
        if (keel_view_get(v, r->e[i], r->a, &a) || keel_view_get(v, r->e[i], r->b, &b) ||
            a != r->a0[i] + (int64_t)tick || a + b != K_SUM)
            bad++;
    }
    return bad;
}

/* Without readers a rewritten column alternates between two buffers: the
 * spare after a publication is the buffer of the tick before, the next
 * tick writes it; no new buffer appears after the first tick, so memory
 * does not grow; every value is right. */
static void run_recycle_alternates(int32_t workers)
{
    enum { TICKS = 40 };
    rc_world r;
    rc_init(&r, workers);
    world_colver *cv[RC_MAXCOLS];
    uint32_t n = rc_colvers(&r, cv);
    ck_assert_uint_eq(n, 2 * ((RC_N + 31) / 32));
    ck_assert_ok(keel_runtime_step(r.rt));
    void *prev[RC_MAXCOLS], *pool[2 * RC_MAXCOLS];
    for (uint32_t i = 0; i < n; i++) {
        prev[i] = colver_cur(cv[i]);
        ck_assert_ptr_eq(cv[i]->pub, prev[i]);
        ck_assert_ptr_nonnull(rc_spare(cv[i])); /* the populated buffer, unreachable now */
        pool[2 * i] = prev[i];
        pool[2 * i + 1] = rc_spare(cv[i]);
    }
    for (uint64_t t = 2; t <= TICKS; t++) {
        ck_assert_ok(keel_runtime_step(r.rt));
        for (uint32_t i = 0; i < n; i++) {
            void *cur = colver_cur(cv[i]);
            ck_assert_ptr_eq(cv[i]->pub, cur);
            ck_assert_ptr_eq(rc_spare(cv[i]), prev[i]); /* last tick's, recycled */
            ck_assert_ptr_ne(cur, prev[i]);
            ck_assert(cur == pool[2 * i] || cur == pool[2 * i + 1]); /* no third buffer */
            ck_assert_ptr_null(atomic_load(&cv[i]->priv));
            prev[i] = cur;
        }
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(r.rt, &v));
        ck_assert_uint_eq(keel_view_tick(v), t);
        ck_assert_uint_eq(rc_view_bad(&r, v, t), 0);
        keel_view_end(v);
    }
    for (uint32_t i = 0; i < RC_N; i++) {
        int64_t a = 0;
        ck_assert_ok(keel_get(r.w, r.e[i], r.a, &a));
        ck_assert_int_eq(a, r.a0[i] + TICKS);
    }
    keel_runtime_close(r.rt);
}

START_TEST(test_recycle_alternates_serial)
{
    run_recycle_alternates(1);
}
END_TEST

START_TEST(test_recycle_alternates_parallel)
{
    run_recycle_alternates(2);
}
END_TEST

/* A view held across many ticks of rewrites: no buffer it holds ever
 * becomes a spare or a new version, and its values stay those of its
 * tick; once it is released, recycling resumes. */
START_TEST(test_recycle_skips_held_view)
{
    enum { HOLD = 25 };
    rc_world r;
    world_colver *cv[RC_MAXCOLS];
    uint32_t n = rc_three_ticks(&r, cv);
    const keel_view *held = NULL;
    ck_assert_ok(keel_view_begin(r.rt, &held));
    ck_assert_uint_eq(keel_view_tick(held), 3);
    void *in_view[RC_MAXCOLS];
    for (uint32_t i = 0; i < n; i++)
        in_view[i] = cv[i]->pub;
    for (uint32_t s = 0; s < HOLD; s++) {
        ck_assert_ok(keel_runtime_step(r.rt));
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++) {
                ck_assert_ptr_ne(rc_spare(cv[i]), in_view[j]);
                ck_assert_ptr_ne(colver_cur(cv[i]), in_view[j]);
            }
        ck_assert_uint_eq(rc_view_bad(&r, held, 3), 0);
    }
    ck_assert_uint_eq(keel_view_tick(held), 3);
    keel_view_end(held);
    ck_assert_ok(keel_runtime_step(r.rt));
    for (uint32_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(rc_spare(cv[i]));
    keel_runtime_close(r.rt);
}
END_TEST

/* keel_runtime_release_memory frees every spare, and nothing else: the
 * bytes it reports are the spares', a second call finds none, the values
 * and a held view are intact, and the next ticks recycle again. */
START_TEST(test_release_memory_frees_spares)
{
    rc_world r;
    world_colver *cv[RC_MAXCOLS];
    uint32_t n = rc_three_ticks(&r, cv);
    void *cur[RC_MAXCOLS];
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_ptr_nonnull(rc_spare(cv[i]));
        cur[i] = colver_cur(cv[i]);
    }
    const keel_view *held = NULL;
    ck_assert_ok(keel_view_begin(r.rt, &held));
    uint64_t bytes = 1;
    ck_assert_ok(keel_runtime_release_memory(r.rt, &bytes));
    ck_assert_uint_eq(bytes, (uint64_t)n * 32 * sizeof(int64_t)); /* chunks of 32 rows, 8-byte a and b */
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_ptr_null(rc_spare(cv[i]));
        ck_assert_ptr_eq(colver_cur(cv[i]), cur[i]);
        ck_assert_ptr_eq(cv[i]->pub, cur[i]);
    }
    ck_assert_uint_eq(rc_view_bad(&r, held, 3), 0);
    keel_view_end(held);
    ck_assert_ok(keel_runtime_release_memory(r.rt, &bytes));
    ck_assert_uint_eq(bytes, 0);
    ck_assert_ok(keel_runtime_release_memory(r.rt, NULL));
    for (uint64_t t = 4; t <= 6; t++) {
        ck_assert_ok(keel_runtime_step(r.rt));
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(r.rt, &v));
        ck_assert_uint_eq(rc_view_bad(&r, v, t), 0);
        keel_view_end(v);
    }
    for (uint32_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(rc_spare(cv[i])); /* recycling resumed */
    for (uint32_t i = 0; i < RC_N; i++) {
        int64_t a = 0;
        ck_assert_ok(keel_get(r.w, r.e[i], r.a, &a));
        ck_assert_int_eq(a, r.a0[i] + 6);
    }
    keel_runtime_close(r.rt);
}
END_TEST

typedef struct release_probe {
    keel_runtime *rt;
    _Atomic int rc;
    _Atomic uint64_t bytes;
} release_probe;

static int sys_release(keel_ctx *ctx, void *user)
{
    (void)ctx;
    release_probe *p = user;
    uint64_t bytes = 7;
    atomic_store(&p->rc, keel_runtime_release_memory(p->rt, &bytes));
    atomic_store(&p->bytes, bytes);
    return 0;
}

static int hook_fails(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 5;
}

/* Refusals: a NULL runtime, a call from inside a tick, a running driver;
 * each leaves *released 0 and frees nothing. */
START_TEST(test_release_memory_refusals)
{
    uint64_t bytes = 5;
    ck_assert_rc(keel_runtime_release_memory(NULL, &bytes), KEEL_EINVAL);
    ck_assert_uint_eq(bytes, 0);
    rc_world r;
    rc_init(&r, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_ok(keel_runtime_step(r.rt));
    release_probe p = {.rt = r.rt, .rc = -1, .bytes = 7};
    keel_schedule *sc = sched_new(r.rt);
    keel_system_desc rw = rc_rewrite(&r);
    add_sys(sc, &rw);
    keel_system_desc rel = {.name = "release", .run = sys_release, .user = &p};
    add_sys(sc, &rel);
    tu_install(r.rt, sc);
    ck_assert_ok(keel_runtime_step(r.rt));
    ck_assert_int_eq(atomic_load(&p.rc), KEEL_EBUSY);
    ck_assert_uint_eq(atomic_load(&p.bytes), 0);
    world_colver *cv[RC_MAXCOLS];
    uint32_t n = rc_colvers(&r, cv);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(rc_spare(cv[i]));
    ck_assert_ok(keel_runtime_start(r.rt));
    bytes = 5;
    ck_assert_rc(keel_runtime_release_memory(r.rt, &bytes), KEEL_EBUSY);
    ck_assert_uint_eq(bytes, 0);
    ck_assert_ok(keel_runtime_stop(r.rt));
    ck_assert_ok(keel_runtime_release_memory(r.rt, &bytes));
    ck_assert_uint_eq(bytes, (uint64_t)n * 32 * sizeof(int64_t));
    keel_runtime_close(r.rt);

    /* a failed on_first_tick leaves no tick running: release is not refused */
    keel_runtime *h = NULL;
    ck_assert_ok(keel_runtime_create(
        &(keel_runtime_desc){.workers = 2, .tick_rate_hz = -1, .on_first_tick = hook_fails}, &h));
    keel_schedule *hs = sched_new(h);
    keel_system_desc noop = {.name = "noop", .run = tu_sys_noop};
    add_sys(hs, &noop);
    tu_install(h, hs);
    ck_assert_int_eq(keel_runtime_step(h), 5);
    ck_assert_uint_eq(keel_runtime_tick(h), 0);
    bytes = 5;
    ck_assert_ok(keel_runtime_release_memory(h, &bytes));
    ck_assert_uint_eq(bytes, 0);
    keel_runtime_close(h);
}
END_TEST

typedef struct rc_reader {
    const rc_world *r;
    const keel_query *q; /* with a, b: read the views by iterating it; NULL: by keel_view_get */
    _Atomic bool *stop;
    _Atomic uint32_t views;
    uint32_t bad, ticks_seen;
} rc_reader;

static uint32_t rc_get_bad(const rc_world *r, const keel_view *v, const keel_query *q, uint64_t tick)
{
    (void)q;
    return rc_view_bad(r, v, tick);
}

/* Iterating q (with a, b) over v: every row is one of the RC_N entities
 * (entity i has index i), its a and b are the values of tick `tick` and
 * equal keel_view_get's, and the rows are all RC_N. */
static uint32_t rc_iter_bad(const rc_world *r, const keel_view *v, const keel_query *q, uint64_t tick)
{
    uint32_t bad = 0, rows = 0;
    keel_iter it;
    keel_view_iter(v, q, &it);
    while (keel_view_next(v, &it)) {
        const int64_t *a = KEEL_COLUMN(&it, int64_t, 0), *b = KEEL_COLUMN(&it, int64_t, 1);
        for (uint32_t k = 0; k < it.count; k++, rows++) {
            uint32_t i = KEEL_ENTITY_INDEX(it.entities[k]);
            int64_t ga = 0, gb = 0;
            if (i >= RC_N || r->e[i] != it.entities[k] || a[k] != r->a0[i] + (int64_t)tick || a[k] + b[k] != K_SUM ||
                keel_view_get(v, it.entities[k], r->a, &ga) || keel_view_get(v, it.entities[k], r->b, &gb) ||
                ga != a[k] || gb != b[k])
                bad++;
        }
    }
    return bad + (rows != RC_N);
}

static void *rc_reader_main(void *arg)
{
    rc_reader *rd = arg;
    uint64_t last = 0;
    while (!atomic_load(rd->stop)) {
        const keel_view *v = NULL;
        if (keel_view_begin(rd->r->rt, &v)) {
            rd->bad++;
            break;
        }
        uint64_t t = keel_view_tick(v);
        uint32_t (*bad)(const rc_world *, const keel_view *, const keel_query *, uint64_t) =
            rd->q ? rc_iter_bad : rc_get_bad;
        rd->bad += bad(rd->r, v, rd->q, t);
        rd->bad += bad(rd->r, v, rd->q, t); /* twice: a write under the view shows as a change */
        keel_view_end(v);
        uint32_t views = atomic_fetch_add(&rd->views, 1) + 1;
        rd->ticks_seen += t != last;
        last = t;
        for (uint32_t i = 0; i < views % 4; i++)
            sched_yield(); /* leave ticks without readers, so both publication paths run */
    }
    return NULL;
}

/* Readers come and go while the runtime rewrites every tick on two
 * workers: a view is never written under its reader (values match its
 * tick, twice), whichever path each publication took. The readers read
 * through keel_view_get, or (iterate) by iterating a query over each view. */
static void run_recycle_readers(bool iterate)
{
    enum { TICKS = 400, READERS = 2 };
    rc_world r;
    rc_init(&r, 2);
    keel_query *q = iterate ? tu_query_new(r.w, r.a, r.b) : NULL;
    ck_assert_ok(keel_runtime_step(r.rt)); /* the view of tick 0 is empty */
    _Atomic bool stop = false;
    rc_reader rd[READERS];
    pthread_t th[READERS];
    for (int i = 0; i < READERS; i++) {
        rd[i] = (rc_reader){.r = &r, .q = q, .stop = &stop};
        ck_assert_int_eq(pthread_create(&th[i], NULL, rc_reader_main, &rd[i]), 0);
    }
    /* at least TICKS more ticks, and on until every reader has opened a
     * few views (the deadline turns a stuck reader into a failure below) */
    int rc = KEEL_OK;
    uint64_t deadline = tu_now_ns() + GUARD_NS, ticks = 1;
    for (bool more = true; more && !rc;) {
        rc = keel_runtime_step(r.rt);
        ticks++;
        more = ticks <= TICKS;
        for (int i = 0; i < READERS; i++)
            more = more || atomic_load(&rd[i].views) < 20;
        more = more && tu_now_ns() < deadline;
    }
    atomic_store(&stop, true);
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    ck_assert_ok(rc);
    for (int i = 0; i < READERS; i++) {
        ck_assert_uint_eq(rd[i].bad, 0);
        ck_assert_uint_ge(atomic_load(&rd[i].views), 20);
    }
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(r.rt, &v));
    ck_assert_uint_eq(rc_view_bad(&r, v, ticks), 0);
    keel_view_end(v);
    keel_query_destroy(q);
    keel_runtime_close(r.rt);
}

START_TEST(test_recycle_readers_concurrent)
{
    run_recycle_readers(false);
}
END_TEST

static Suite *view_recycle(void)
{
    Suite *s = suite_create("view_recycle");
    TCase *tc = tcase_create("recycle");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_recycle_alternates_serial);
    tcase_add_test(tc, test_recycle_alternates_parallel);
    tcase_add_test(tc, test_recycle_skips_held_view);
    tcase_add_test(tc, test_recycle_readers_concurrent);
    tcase_add_test(tc, test_release_memory_frees_spares);
    tcase_add_test(tc, test_release_memory_refusals);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * view_iter: keel_view_iter / keel_view_next
 * ============================================================================= */

/* One row as an iteration over a view saw it. */
typedef struct iter_row {
    keel_entity e;
    int64_t a, b, born;
    keel_entity self;
} iter_row;

/* Iterate q (with = {a, b, self, born}, or a prefix of it) over v into rows
 * (cap), checking every value against keel_view_get and the sim's
 * invariants; returns the row count. chunks (may be NULL) receives the
 * chunk count. */
static uint32_t iter_collect(const sim *s, const keel_view *v, const keel_query *q, uint32_t nterms, iter_row *rows,
                             uint32_t cap, uint32_t *chunks)
{
    keel_component terms[4] = {s->a, s->b, s->self, s->born};
    uint32_t n = 0, nch = 0;
    keel_iter it;
    keel_view_iter(v, q, &it);
    while (keel_view_next(v, &it)) {
        nch++;
        ck_assert_uint_ge(it.count, 1);
        for (uint32_t r = 0; r < it.count; r++) {
            ck_assert_uint_lt(n, cap);
            iter_row *row = &rows[n++];
            memset(row, 0, sizeof *row);
            row->e = it.entities[r];
            ck_assert(keel_view_alive(v, row->e));
            for (uint32_t i = 0; i < nterms; i++) {
                ck_assert_ptr_eq(it.columns[i], it.prev[i]);
                int64_t got = 0, col = ((const int64_t *)it.columns[i])[r];
                ck_assert_ok(keel_view_get(v, row->e, terms[i], &got));
                ck_assert_int_eq(col, got);
                if (i == 0)
                    row->a = col;
                else if (i == 1)
                    row->b = col;
                else if (i == 2)
                    row->self = (keel_entity)col;
                else
                    row->born = col;
            }
            if (nterms >= 2)
                ck_assert_int_eq(row->a + row->b, K_SUM);
        }
    }
    ck_assert_uint_eq(it.count, 0);
    ck_assert(!keel_view_next(v, &it)); /* stays at the end */
    if (chunks)
        *chunks = nch;
    return n;
}

static keel_query *query4(sim *s, const keel_component *without)
{
    keel_query_desc d = {.with = {s->a, s->b, s->self, s->born}};
    for (uint32_t i = 0; without && without[i]; i++)
        d.without[i] = without[i];
    keel_query *q = NULL;
    ck_assert_ok(keel_query_create(s->w, &d, &q));
    return q;
}

/* Before the first tick the view is empty: nothing is visited, no error.
 * Entities made between steps appear only once a step published them. */
START_TEST(test_iter_empty_view)
{
    sim s;
    sim_init(&s, 1, true, NULL);
    keel_query *q = query4(&s, NULL);
    iter_row rows[8];
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    core_fail(KEEL_EIO, "marker");
    ck_assert_uint_eq(iter_collect(&s, v, q, 4, rows, 8, NULL), 0);
    ck_assert_str_eq(keel_last_error(), "marker"); /* an empty view is no error */
    keel_view_end(v);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    ck_assert_ok(spawn_one(&s, cb, 0, 5));
    tu_cmdbuf_apply_created(cb, 1, NULL);
    ck_assert_ok(keel_view_begin(s.rt, &v));
    ck_assert_uint_eq(iter_collect(&s, v, q, 4, rows, 8, NULL), 0);
    keel_view_end(v);
    keel_query_destroy(q);
    sim_close(&s);
}
END_TEST

/* After every step the iteration over a new view visits exactly the live
 * world's chunks, in keel_query_iter's order, with the values keel_view_get
 * gives; `without` terms split the rows as membership says. */
static void run_iter_tracks_world(int32_t workers)
{
    enum { CAP = 8192 };
    sim s;
    sim_init(&s, workers, true, NULL);
    keel_query *all = query4(&s, NULL), *untagged = query4(&s, (keel_component[]){s.tag, 0});
    keel_query *tagged = NULL;
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.a, s.tag}}, &tagged));
    iter_row *rows = malloc(CAP * sizeof *rows), *rows2 = malloc(CAP * sizeof *rows2);
    ck_assert_ptr_nonnull(rows);
    ck_assert_ptr_nonnull(rows2);
    uint32_t max_chunks = 0;
    bool seen_tagged = false, seen_untagged = false;
    for (int i = 0; i < 20; i++) {
        if (i == 10) { /* shrink: the sync point frees chunks */
            s.destroy_mod = 2;
            s.spawn_base = 1;
            s.spawn_var = 2;
        }
        tu_step_n(s.rt, 1);
        const keel_view *v = NULL;
        ck_assert_ok(keel_view_begin(s.rt, &v));
        uint64_t tk = keel_view_tick(v);
        uint32_t chunks = 0, n = iter_collect(&s, v, all, 4, rows, CAP, &chunks);
        ck_assert_uint_eq(n, keel_view_count(v));
        max_chunks = chunks > max_chunks ? chunks : max_chunks;
        for (uint32_t r = 0; r < n; r++) {
            ck_assert_int_le(rows[r].born, (int64_t)tk);
            ck_assert(rows[r].self == rows[r].e || (rows[r].self == KEEL_ENTITY_NULL && rows[r].born == (int64_t)tk));
        }
        /* the live world right after the step is the view: same chunks, same order */
        keel_iter it;
        keel_query_iter(all, &it);
        uint32_t k = 0;
        while (keel_iter_next(&it))
            for (uint32_t r = 0; r < it.count; r++, k++) {
                ck_assert_uint_lt(k, n);
                ck_assert_uint_eq(it.entities[r], rows[k].e);
            }
        ck_assert_uint_eq(k, n);
        /* without tag + with tag = everything; membership as keel_view_get says */
        uint32_t nu = iter_collect(&s, v, untagged, 4, rows2, CAP, NULL);
        for (uint32_t r = 0; r < nu; r++)
            ck_assert_rc(keel_view_get(v, rows2[r].e, s.tag, NULL), KEEL_ENOENT);
        uint32_t nt = 0;
        keel_view_iter(v, tagged, &it);
        while (keel_view_next(v, &it))
            for (uint32_t r = 0; r < it.count; r++, nt++) {
                ck_assert_ptr_null(it.columns[1]); /* a tag has no column */
                ck_assert_ok(keel_view_get(v, it.entities[r], s.tag, NULL));
            }
        ck_assert_uint_eq(nu + nt, n);
        seen_tagged = seen_tagged || nt > 0;
        seen_untagged = seen_untagged || nu > 0;
        keel_view_end(v);
    }
    ck_assert(seen_tagged && seen_untagged);
    ck_assert_uint_gt(max_chunks, 4); /* several tables and chunks were walked */
    free(rows);
    free(rows2);
    keel_query_destroy(all);
    keel_query_destroy(untagged);
    keel_query_destroy(tagged);
    sim_close(&s);
}

START_TEST(test_iter_tracks_world_serial)
{
    run_iter_tracks_world(1);
}
END_TEST

START_TEST(test_iter_tracks_world_parallel)
{
    run_iter_tracks_world(2);
}
END_TEST

/* A view held across steps iterates to the same rows and values as when it
 * was opened, although the live world moved rows, freed chunks, reused
 * slots and created a table (an entity with `late`) meanwhile: tables
 * created after the view are not visited. */
START_TEST(test_iter_held_view)
{
    enum { CAP = 8192 };
    sim s;
    sim_init(&s, 2, true, NULL);
    s.spawn_first = 150;
    tu_step_n(s.rt, 4);
    keel_query *all = query4(&s, NULL), *q_late = NULL;
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.a, s.late}}, &q_late));
    iter_row *before = malloc(CAP * sizeof *before), *after = malloc(CAP * sizeof *after);
    ck_assert_ptr_nonnull(before);
    ck_assert_ptr_nonnull(after);
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    uint32_t n = iter_collect(&s, v, all, 4, before, CAP, NULL);
    ck_assert_uint_eq(n, keel_view_count(v));
    uint32_t tables = s.w->ntables;

    /* a new table between steps: an entity with `late` (without self: churn,
     * which walks `self`, leaves it alone), and heavy churn */
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    int64_t a = 1, b = K_SUM - 1, born = 4, lv = 9;
    keel_init in[4] = {{s.a, &a}, {s.b, &b}, {s.born, &born}, {s.late, &lv}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 4));
    keel_entity late_e = KEEL_ENTITY_NULL;
    tu_cmdbuf_apply_created(cb, 1, &late_e);
    ck_assert_uint_gt(s.w->ntables, tables);
    s.destroy_mod = 2;
    s.spawn_base = 30;
    tu_step_n(s.rt, 6);
    ck_assert_uint_eq(keel_query_count(q_late), 1);

    ck_assert_uint_eq(iter_collect(&s, v, all, 4, after, CAP, NULL), n);
    ck_assert_mem_eq(before, after, n * sizeof *before);
    keel_iter it;
    keel_view_iter(v, q_late, &it);
    ck_assert(!keel_view_next(v, &it)); /* the table came after the view */
    keel_view_end(v);

    ck_assert_ok(keel_view_begin(s.rt, &v));
    keel_view_iter(v, q_late, &it);
    ck_assert(keel_view_next(v, &it));
    ck_assert_uint_eq(it.count, 1);
    ck_assert_uint_eq(it.entities[0], late_e);
    ck_assert_int_eq(KEEL_COLUMN(&it, int64_t, 1)[0], 9);
    ck_assert(!keel_view_next(v, &it));
    ck_assert_uint_eq(iter_collect(&s, v, all, 4, after, CAP, NULL), keel_view_count(v) - 1); /* late_e lacks self */
    keel_view_end(v);
    free(before);
    free(after);
    keel_query_destroy(all);
    keel_query_destroy(q_late);
    sim_close(&s);
}
END_TEST

/* A `with` term with data that is not VERSIONED, a NULL view, query or
 * iterator, a query of another world: nothing is visited and the last error
 * says why. Tags and `without` terms of any discipline are fine. */
START_TEST(test_iter_refused)
{
    sim s;
    sim_init(&s, 1, true, NULL);
    tu_step_n(s.rt, 2);
    keel_cmdbuf *cb = tu_cmdbuf_new(s.w);
    int64_t a = 3, b = K_SUM - 3, born = 2;
    int32_t sv = 4;
    keel_entity zero = KEEL_ENTITY_NULL, special = KEEL_ENTITY_NULL;
    keel_init in[6] = {{s.a, &a}, {s.b, &b}, {s.self, &zero}, {s.born, &born}, {s.sv, &sv}, {s.svtag, NULL}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 6));
    tu_cmdbuf_apply_created(cb, 1, &special);
    s.destroy_mod = 0;
    tu_step_n(s.rt, 1);

    keel_query *q_sv = NULL, *q_tr = NULL, *q_svtag = NULL, *q_no_sv = NULL;
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.a, s.sv}}, &q_sv));
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.tr}}, &q_tr));
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.a, s.svtag}}, &q_svtag));
    ck_assert_ok(keel_query_create(s.w, &(keel_query_desc){.with = {s.a}, .without = {s.sv, s.tr}}, &q_no_sv));
    const keel_view *v = NULL;
    ck_assert_ok(keel_view_begin(s.rt, &v));
    keel_iter it;

    keel_view_iter(v, q_sv, &it);
    ck_assert(!keel_view_next(v, &it));
    ck_assert_uint_eq(it.count, 0);
    ck_assert_str_eq(keel_last_error(), "keel_view_iter: component 'sv' is single_version: a read view holds the "
                                        "values of versioned components only; read it inside a system, or register "
                                        "it KEEL_VERSIONED");
    keel_view_iter(v, q_tr, &it);
    ck_assert(!keel_view_next(v, &it));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "component 'tr' is transient"));

    /* a SINGLE_VERSION tag: membership only, which the view holds */
    keel_view_iter(v, q_svtag, &it);
    ck_assert(keel_view_next(v, &it));
    ck_assert_uint_eq(it.count, 1);
    ck_assert_uint_eq(it.entities[0], special);
    ck_assert_int_eq(KEEL_COLUMN(&it, int64_t, 0)[0], 3 - move_amount(special, 3));
    ck_assert(!keel_view_next(v, &it));
    /* without SINGLE_VERSION / TRANSIENT: everyone but special */
    uint32_t n = 0;
    keel_view_iter(v, q_no_sv, &it);
    while (keel_view_next(v, &it))
        for (uint32_t r = 0; r < it.count; r++, n++)
            ck_assert_uint_ne(it.entities[r], special);
    ck_assert_uint_eq(n, keel_view_count(v) - 1);

    /* NULL arguments */
    keel_view_iter(NULL, q_no_sv, &it);
    ck_assert(!keel_view_next(v, &it));
    ck_assert_str_eq(keel_last_error(), "keel_view_iter: view or query is NULL");
    keel_view_iter(v, NULL, &it);
    ck_assert(!keel_view_next(v, &it));
    keel_view_iter(v, q_no_sv, NULL);
    ck_assert_str_eq(keel_last_error(), "keel_view_iter: the iterator is NULL");
    ck_assert(!keel_view_next(v, NULL));
    keel_view_iter(v, q_no_sv, &it);
    ck_assert(!keel_view_next(NULL, &it));

    /* a query of another world */
    keel_world *other = tu_world_new((keel_world_desc){0});
    keel_component oa = reg_comp(other, "a", 8, KEEL_VERSIONED, i64_field);
    keel_query *q_other = tu_query_new(other, oa, 0);
    keel_view_iter(v, q_other, &it);
    ck_assert(!keel_view_next(v, &it));
    ck_assert_str_eq(keel_last_error(), "keel_view_iter: the query was made on another world than the view's");
    keel_query_destroy(q_other);
    keel_world_destroy(other);
    keel_view_end(v);

    keel_query_destroy(q_sv);
    keel_query_destroy(q_tr);
    keel_query_destroy(q_svtag);
    keel_query_destroy(q_no_sv);
    sim_close(&s);
}
END_TEST

/* Reader threads iterate views chunk by chunk while the main thread steps
 * (with structural churn): every row of every view keeps the systems'
 * invariant (a + b == K, broken inside each tick), its values equal
 * keel_view_get's, and the rows add up to the view's count. */
typedef struct iter_reader {
    sim *s;
    keel_query *q;
    _Atomic bool *stop;
    pthread_t thread;
    _Atomic uint64_t checked; /* views with rows, fully checked */
    uint64_t bad_sum, bad_get, bad_count, bad_self, bad_tick;
} iter_reader;

static void *iter_reader_main(void *arg)
{
    iter_reader *r = arg;
    const sim *s = r->s;
    uint64_t last = 0;
    while (!atomic_load(r->stop)) {
        const keel_view *v = NULL;
        if (keel_view_begin(s->rt, &v)) {
            r->bad_get++;
            break;
        }
        uint64_t tk = keel_view_tick(v);
        r->bad_tick += tk < last;
        last = tk;
        uint32_t rows = 0;
        keel_iter it;
        keel_view_iter(v, r->q, &it);
        while (keel_view_next(v, &it)) {
            const int64_t *a = KEEL_COLUMN(&it, int64_t, 0), *b = KEEL_COLUMN(&it, int64_t, 1);
            const keel_entity *self = KEEL_COLUMN(&it, keel_entity, 2);
            const int64_t *born = KEEL_COLUMN(&it, int64_t, 3);
            for (uint32_t k = 0; k < it.count; k++, rows++) {
                r->bad_sum += a[k] + b[k] != K_SUM;
                r->bad_self += !(self[k] == it.entities[k] ||
                                 (self[k] == KEEL_ENTITY_NULL && (uint64_t)born[k] == tk)) ||
                               (uint64_t)born[k] > tk;
                int64_t ga = 0, gb = 0;
                if (keel_view_get(v, it.entities[k], s->a, &ga) || keel_view_get(v, it.entities[k], s->b, &gb) ||
                    ga != a[k] || gb != b[k])
                    r->bad_get++;
            }
        }
        r->bad_count += rows != keel_view_count(v);
        keel_view_end(v);
        if (rows)
            atomic_fetch_add(&r->checked, 1);
    }
    return NULL;
}

static void run_iter_concurrent(int32_t workers)
{
    enum { READERS = 2, MIN_VIEWS = 25, MIN_STEPS = 150 };
    sim s;
    sim_init(&s, workers, true, NULL);
    _Atomic bool stop = false;
    iter_reader rd[READERS];
    memset(rd, 0, sizeof rd);
    for (int i = 0; i < READERS; i++) {
        rd[i].s = &s;
        rd[i].q = query4(&s, NULL);
        rd[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&rd[i].thread, NULL, iter_reader_main, &rd[i]), 0);
    }
    uint64_t deadline = tu_now_ns() + GUARD_NS;
    bool timed_out = false, done = false;
    int rc = 0;
    while (!rc && !done) {
        rc = keel_runtime_step(s.rt);
        done = keel_runtime_tick(s.rt) >= MIN_STEPS;
        for (int i = 0; i < READERS; i++)
            done = done && atomic_load(&rd[i].checked) >= MIN_VIEWS;
        if (!done && tu_now_ns() > deadline)
            timed_out = done = true;
    }
    atomic_store(&stop, true);
    for (int i = 0; i < READERS; i++)
        pthread_join(rd[i].thread, NULL);
    ck_assert_ok(rc);
    ck_assert_msg(!timed_out, "the readers did not check %d views each within the guard", MIN_VIEWS);
    for (int i = 0; i < READERS; i++) {
        iter_reader *r = &rd[i];
        ck_assert_msg(r->bad_sum + r->bad_get + r->bad_count + r->bad_self + r->bad_tick == 0,
                      "reader %d: sum %llu get %llu count %llu self %llu tick %llu", i,
                      (unsigned long long)r->bad_sum, (unsigned long long)r->bad_get,
                      (unsigned long long)r->bad_count, (unsigned long long)r->bad_self,
                      (unsigned long long)r->bad_tick);
        keel_query_destroy(r->q);
    }
    sim_close(&s);
}

START_TEST(test_iter_readers_serial)
{
    run_iter_concurrent(1);
}
END_TEST

START_TEST(test_iter_readers_parallel)
{
    run_iter_concurrent(2);
}
END_TEST

/* Reader threads iterating views of a world whose columns are rewritten
 * every tick, their buffers recycled (world/version.c): every row of every
 * view holds its tick's values. */
START_TEST(test_iter_readers_rewrites)
{
    run_recycle_readers(true);
}
END_TEST

static Suite *view_iter(void)
{
    Suite *s = suite_create("view_iter");
    TCase *tc = tcase_create("iter");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_iter_empty_view);
    tcase_add_test(tc, test_iter_tracks_world_serial);
    tcase_add_test(tc, test_iter_tracks_world_parallel);
    tcase_add_test(tc, test_iter_held_view);
    tcase_add_test(tc, test_iter_refused);
    tcase_add_test(tc, test_iter_readers_serial);
    tcase_add_test(tc, test_iter_readers_parallel);
    tcase_add_test(tc, test_iter_readers_rewrites);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(view_basic, view_concurrent, view_recycle, view_iter)
