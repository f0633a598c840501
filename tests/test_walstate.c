/*
 * test_walstate.c -- `keel-wal replay` and `keel-wal diff` against data
 * directories the runtime produced (tools/keel-wal/state.c, replay.c,
 * diff.c; docs/tools.md):
 *
 *   walstate_replay  a workload with every kind of change (spawns, destroys
 *                    that free slots for reuse with a bumped generation,
 *                    add/remove of a tag moving entities between archetypes,
 *                    VERSIONED, SINGLE_VERSION and TRANSIENT values, side
 *                    transactions in a system, through keel_submit and in
 *                    on_shutdown, on_first_tick's unit), run with wal_retain
 *                    and explicit checkpoints over two sessions: replay's
 *                    hash equals keel_world_hash recorded by the runtime at
 *                    every tick (from the checkpoint, from LSN 1, beside the
 *                    live runtime); without wal_retain: replay from the
 *                    checkpoint on, ticks before it refused with the
 *                    reason; a tick beyond the last refused; --entity JSON
 *                    holds exactly the values that were set;
 *   walstate_diff    created / destroyed / changed sets and field-level old
 *                    -> new values equal what the runtime held at the two
 *                    ticks (text and JSON lines, compared line for line);
 *   walstate_errors  a flipped byte in a record, and a record with a valid
 *                    CRC whose spawn does not produce the logged handle:
 *                    exit 1 with KEEL_ECORRUPT naming the LSN (a tick
 *                    before the damage still replays); a checkpoint whose
 *                    table list claims slots its pages lack: exit 1 naming
 *                    the shortfall, nothing of the claim allocated; usage
 *                    errors exit 2;
 *                    --help.
 *
 * The runtime (linked here, running the workload W of wworld.h) produces
 * the directories and the expected values; keel-wal runs as a child
 * process (fork + exec of KEEL_WAL_BIN, stdout and stderr through pipes:
 * test_util.h), as a user would run it. Every test works in its own
 * directory under a mkdtemp base the unchecked fixture removes.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "keel_wal/wal.h"
#include "test_util.h"
#include "wworld.h"

#ifndef KEEL_WAL_BIN
#error "KEEL_WAL_BIN (the keel-wal binary) must be defined by the build"
#endif

/* ---- running keel-wal ------------------------------------------------------------------ */

/* keel-wal with the arguments (a NULL ends them), stdout and stderr captured. */
#define kwal(...) tu_run_argv(KEEL_WAL_BIN, (const char *const[]){__VA_ARGS__})

#define ck_assert_exit(r, code)                                                                              \
    ck_assert_msg((r).status == (code), "keel-wal exited %d, expected %d; stdout:\n%s\nstderr:\n%s", (r).status, \
                  (code), (r).out, (r).err)

static bool contains(const char *hay, const char *needle)
{
    return hay && strstr(hay, needle) != NULL;
}

#define ck_assert_contains(hay, needle) \
    ck_assert_msg(contains((hay), (needle)), "expected \"%s\" in:\n%s", (needle), (hay))

/* keel-wal args... (NULL-terminated) exits with `code` and, when err_has is
 * given, says it on stderr; nothing on stdout when it fails. */
static void kwal_expect_argv(int code, const char *err_has, const char *const *args)
{
    tu_run r = tu_run_argv(KEEL_WAL_BIN, args);
    ck_assert_exit(r, code);
    if (err_has)
        ck_assert_contains(r.err, err_has);
    if (code == 2)
        ck_assert_str_eq(r.out, "");
    tu_run_free(&r);
}

#define kwal_expect(code, err_has, ...) kwal_expect_argv((code), (err_has), (const char *const[]){__VA_ARGS__})

/* A suite of one test case holding `tests` (the base directory fixture set). */
static Suite *suite_of(const char *name, const TTest *const *tests, size_t n)
{
    return tu_suite(name, tests, n, 300);
}

#define ck_assert_names_lsn(msg, lsn) \
    ck_assert_msg(tu_names_lsn((msg), (lsn)), "expected LSN %" PRIu64 " named in:\n%s", (uint64_t)(lsn), (msg))

/* `keel-wal replay DIR --to-tick t [extra]`: the hash it printed. */
static uint64_t replay_hash(const char *dir, uint64_t t, const char *extra)
{
    char tick[32];
    snprintf(tick, sizeof tick, "%" PRIu64, t);
    tu_run r = kwal("replay", dir, "--to-tick", tick, extra, NULL); /* extra NULL ends the list early */
    ck_assert_exit(r, 0);
    char want[64];
    snprintf(want, sizeof want, "tick=%" PRIu64 " hash=", t);
    ck_assert_msg(!strncmp(r.out, want, strlen(want)) && strlen(r.out) == strlen(want) + 17,
                  "replay printed '%s'", r.out);
    uint64_t h = strtoull(r.out + strlen(want), NULL, 16);
    tu_run_free(&r);
    return h;
}

/* ---- the workload: W (wworld.h) ---------------------------------------------------------- */

#define MAXT W_MAXT

/* W in this file's flavour: the misc entity, 20 entities from
 * on_first_tick (tmp 3), two spawns per tick, pos moved every other tick
 * by handle, on_shutdown (a transfer once shutdown_xfer is set). Open the
 * runtime on dir (retain: wal_retain), no automatic checkpoints, recover. */
static void wl_open(wworld *w, const char *dir, bool retain)
{
    w_reset(w, false);
    w->misc = true;
    w->hook_spawn = 20;
    w->hook_tmp = 3;
    w->life_spawns = 2;
    w->move_every = 2;
    keel_runtime_desc d = {.world = {.chunk_rows = 16}, .workers = 1, .tick_rate_hz = -1};
    d.durable.dir = dir;
    d.durable.wal_retain = retain;
    d.durable.checkpoint_every_ticks = -1;
    d.durable.checkpoint_every_bytes = -1;
    d.durable.checkpoint_every_seconds = -1;
    w_open(w, &d, true);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
}

static uint64_t wl_hash(wworld *w)
{
    return keel_world_hash(keel_runtime_world(w->rt));
}

/* Some slot was reused: a live entity has generation >= 2. */
static bool wl_reused_slot(wworld *w)
{
    keel_entity e[4096];
    uint32_t n = query_entities(w->q_pos, e, 4096);
    for (uint32_t i = 0; i < n; i++)
        if (KEEL_ENTITY_GEN(e[i]) >= 2)
            return true;
    return false;
}

/* ---- walstate_replay ------------------------------------------------------------------- */

/* Two sessions with wal_retain, checkpoints at 7, 14, 21, 28 and 38: the
 * replay hash at every tick is the one the runtime reported. Session one
 * ends with on_shutdown's side transaction: it belongs to tick 30 (the
 * state the second session recovers), so tick 30 replays to the hash the
 * second session started from. */
START_TEST(replay_hash_equals_the_runtime_hash_at_every_tick)
{
    char dir[256];
    tu_path(dir, sizeof dir, "retain");
    wworld w = {0};
    uint64_t hash[MAXT + 1] = {0};
    wl_open(&w, dir, true);
    hash[0] = wl_hash(&w);
    for (uint64_t t = 1; t <= 30; t++) {
        w_drive(&w, t);
        hash[t] = wl_hash(&w);
        if (t % 7 == 0)
            ck_assert_ok(keel_checkpoint(w.rt));
    }
    ck_assert(wl_reused_slot(&w));
    keel_entity acc[4];
    ck_assert_uint_eq(query_entities(w.q_money, acc, 4), 2);
    w.shutdown_xfer = (xfer){acc[1], acc[0], 333, w.MONEY};
    w_close(&w);

    wworld w2 = {0};
    wl_open(&w2, dir, true);
    ck_assert_uint_eq(keel_runtime_tick(w2.rt), 30);
    uint64_t recovered30 = wl_hash(&w2);
    ck_assert_uint_ne(recovered30, hash[30]); /* on_shutdown moved money */
    for (uint64_t t = 31; t <= 45; t++) {
        w_drive(&w2, t);
        hash[t] = wl_hash(&w2);
        if (t == 38)
            ck_assert_ok(keel_checkpoint(w2.rt));
    }
    /* beside the live runtime (a read-only reader of its LMDB environment) */
    ck_assert_ok(keel_flush(w2.rt));
    ck_assert_uint_eq(replay_hash(dir, 45, NULL), hash[45]);
    w_close(&w2);

    for (uint64_t t = 0; t <= 45; t++) {
        uint64_t want = t == 30 ? recovered30 : hash[t];
        uint64_t got = replay_hash(dir, t, NULL);
        ck_assert_msg(got == want, "tick %" PRIu64 ": replay %016" PRIx64 ", runtime %016" PRIx64, t, got, want);
    }
    /* the checkpoint (tick 38) against the whole WAL: the same states */
    static const uint64_t audit[] = {38, 41, 45};
    for (size_t i = 0; i < sizeof audit / sizeof audit[0]; i++)
        ck_assert_uint_eq(replay_hash(dir, audit[i], "--no-checkpoint"), hash[audit[i]]);
    tu_run r = kwal("replay", dir, "--to-tick", "40", "--json", NULL);
    ck_assert_exit(r, 0);
    char want[200];
    snprintf(want, sizeof want, "{\"tick\":40,\"hash\":\"%016" PRIx64 "\",", hash[40]);
    ck_assert_msg(!strncmp(r.out, want, strlen(want)), "json: %s", r.out);
    ck_assert_contains(r.out, "\"from_checkpoint\":true,\"checkpoint_tick\":38,");
    tu_run_free(&r);
    r = kwal("replay", dir, "--to-tick", "46", NULL);
    ck_assert_exit(r, 1);
    ck_assert_contains(r.err, "tick 46 is beyond the last completed tick 45");
    ck_assert_str_eq(r.out, "");
    tu_run_free(&r);
}
END_TEST

/* Without wal_retain the checkpoint deleted the WAL before it: ticks from
 * the checkpoint on replay, earlier ones are refused with the reason. */
START_TEST(without_retain_replay_starts_at_the_checkpoint)
{
    char dir[256];
    tu_path(dir, sizeof dir, "noretain");
    wworld w = {0};
    uint64_t hash[MAXT + 1] = {0};
    wl_open(&w, dir, false);
    for (uint64_t t = 1; t <= 25; t++) {
        w_drive(&w, t);
        hash[t] = wl_hash(&w);
        if (t == 10 || t == 20)
            ck_assert_ok(keel_checkpoint(w.rt));
    }
    w_close(&w);
    for (uint64_t t = 20; t <= 25; t++)
        ck_assert_uint_eq(replay_hash(dir, t, NULL), hash[t]);
    static const char *const before[] = {"19", "10", "0"};
    for (size_t i = 0; i < 3; i++) {
        tu_run r = kwal("replay", dir, "--to-tick", before[i], NULL);
        ck_assert_exit(r, 1);
        char want[80];
        snprintf(want, sizeof want, "tick %s is no longer reachable", before[i]);
        ck_assert_contains(r.err, want);
        ck_assert_contains(r.err, "before the checkpoint of tick 20");
        ck_assert_contains(r.err, "wal_retain");
        ck_assert_contains(r.err, "The earliest tick replay can rebuild is 20");
        ck_assert_str_eq(r.out, "");
        tu_run_free(&r);
    }
    kwal_expect(1, "--no-checkpoint needs the WAL from LSN 1", "replay", dir, "--to-tick", "22", "--no-checkpoint",
                NULL);
    kwal_expect(1, "tick 15 is no longer reachable", "diff", dir, "--from-tick", "15", "--to-tick", "22", NULL);
}
END_TEST

/* --entity: the values set, by field name, in the schema's formats. */
START_TEST(entity_json_holds_the_values_that_were_set)
{
    char dir[256];
    tu_path(dir, sizeof dir, "entity");
    wworld w = {0};
    wl_open(&w, dir, true);
    keel_entity mx = 0, a[4];
    for (uint64_t t = 1; t <= 8; t++) {
        w_drive(&w, t);
        if (t == 1) {
            ck_assert_uint_eq(query_entities(w.q_misc, a, 4), 1);
            mx = a[0];
        }
        if (t == 6)
            ck_assert_ok(keel_checkpoint(w.rt));
    }
    keel_world *wd = keel_runtime_world(w.rt);
    /* a pos entity at tick 8, its values read from the runtime */
    keel_entity pe[4096];
    uint32_t np = query_entities(w.q_pos, pe, 4096);
    ck_assert_uint_gt(np, 3);
    keel_entity e = pe[np / 2];
    pos_t p;
    int64_t hp;
    ck_assert_ok(keel_get(wd, e, w.POS, &p));
    ck_assert_ok(keel_get(wd, e, w.HP, &hp));
    int has_flag = keel_has(wd, e, w.FLAG);
    w_close(&w);

    char eh[32], want[512];
    snprintf(eh, sizeof eh, "%016" PRIx64, e);
    tu_run r = kwal("replay", dir, "--to-tick", "8", "--entity", eh, NULL);
    ck_assert_exit(r, 0);
    snprintf(want, sizeof want,
             "{\"tick\":8,\"entity\":\"%s\",\"live\":true,\"generation\":%u,\"components\":{\"pos\":{\"x\":%" PRId64
             ",\"born\":%" PRId64 "},\"hp\":{\"v\":%" PRId64 "}%s},\"transient\":[\"tmp\"]}\n",
             eh, KEEL_ENTITY_GEN(e), p.x, p.born, hp, has_flag == 1 ? ",\"flag\":{}" : "");
    ck_assert_str_eq(r.out, want);
    tu_run_free(&r);

    /* the misc entity before (tick 4: the spawn's values) and after tick 5's write;
     * INDEX:GEN and 0x forms name the same entity */
    char ig[32], hx[32], me[32];
    snprintf(ig, sizeof ig, "%u:%u", KEEL_ENTITY_INDEX(mx), KEEL_ENTITY_GEN(mx));
    snprintf(hx, sizeof hx, "0x%" PRIx64, mx);
    snprintf(me, sizeof me, "%016" PRIx64, mx);
    r = kwal("replay", dir, "--to-tick", "4", "--entity", ig, NULL);
    ck_assert_exit(r, 0);
    snprintf(want, sizeof want,
             "{\"tick\":4,\"entity\":\"%s\",\"live\":true,\"generation\":%u,\"components\":{\"misc\":{\"f\":1.5,"
             "\"arr\":[1,2,3],\"b\":false,\"ref\":\"0000000000000000\",\"raw\":\"ab000000\",\"neg\":-1}},"
             "\"transient\":[]}\n",
             me, KEEL_ENTITY_GEN(mx));
    ck_assert_str_eq(r.out, want);
    tu_run_free(&r);
    r = kwal("replay", dir, "--to-tick", "7", "--entity", hx, NULL); /* from the checkpoint of tick 6 */
    ck_assert_exit(r, 0);
    snprintf(want, sizeof want,
             "{\"tick\":7,\"entity\":\"%s\",\"live\":true,\"generation\":%u,\"components\":{\"misc\":{\"f\":2.25,"
             "\"arr\":[7,8,65535],\"b\":true,\"ref\":\"%s\",\"raw\":\"dead0001\",\"neg\":-42}},\"transient\":[]}\n",
             me, KEEL_ENTITY_GEN(mx), me);
    ck_assert_str_eq(r.out, want);
    tu_run_free(&r);

    /* not live: a generation the slot never had, and a slot never used */
    char stale[32];
    snprintf(stale, sizeof stale, "%u:%u", KEEL_ENTITY_INDEX(mx), KEEL_ENTITY_GEN(mx) + 5);
    r = kwal("replay", dir, "--to-tick", "8", "--entity", stale, NULL);
    ck_assert_exit(r, 1);
    ck_assert_contains(r.out, "\"live\":false}");
    ck_assert_contains(r.err, "is not live at tick 8");
    tu_run_free(&r);
    kwal_expect(1, "slot 900000 was never used", "replay", dir, "--to-tick", "8", "--entity", "900000:1", NULL);
    kwal_expect(2, NULL, "replay", dir, "--to-tick", "8", "--entity", "bogus", NULL);
}
END_TEST

static Suite *replay_suite(void)
{
    const TTest *t[] = {replay_hash_equals_the_runtime_hash_at_every_tick,
                        without_retain_replay_starts_at_the_checkpoint, entity_json_holds_the_values_that_were_set};
    return suite_of("walstate_replay", t, sizeof t / sizeof t[0]);
}

/* ---- walstate_diff --------------------------------------------------------------------- */

/* The durable content of one live entity, read from the runtime. */
typedef struct snap_ent {
    keel_entity e;
    bool has_pos, has_hp, has_flag, has_money, has_misc;
    pos_t pos;
    int64_t hp, money;
    misc_t misc;
} snap_ent;

typedef struct wsnap {
    snap_ent *v;
    uint32_t n;
} wsnap;

static int cmp_index(const void *a, const void *b)
{
    uint32_t x = KEEL_ENTITY_INDEX(((const snap_ent *)a)->e), y = KEEL_ENTITY_INDEX(((const snap_ent *)b)->e);
    return x < y ? -1 : x > y;
}

static wsnap take_snap(wworld *w)
{
    keel_world *wd = keel_runtime_world(w->rt);
    keel_entity *e = malloc(8192 * sizeof *e);
    ck_assert_ptr_nonnull(e);
    uint32_t n = query_entities(w->q_pos, e, 4096);
    n += query_entities(w->q_money, e + n, 16);
    n += query_entities(w->q_misc, e + n, 16);
    ck_assert_uint_eq(n, keel_world_count(wd));
    wsnap s = {calloc(n, sizeof *s.v), n};
    ck_assert_ptr_nonnull(s.v);
    for (uint32_t i = 0; i < n; i++) {
        snap_ent *x = &s.v[i];
        x->e = e[i];
        x->has_pos = keel_get(wd, e[i], w->POS, &x->pos) == 0;
        x->has_hp = keel_get(wd, e[i], w->HP, &x->hp) == 0;
        x->has_flag = keel_has(wd, e[i], w->FLAG) == 1;
        x->has_money = keel_get(wd, e[i], w->MONEY, &x->money) == 0;
        x->has_misc = keel_get(wd, e[i], w->MISC, &x->misc) == 0;
    }
    qsort(s.v, n, sizeof *s.v, cmp_index);
    free(e);
    return s;
}

/* A growable string. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        ck_assert_int_ge(n, 0);
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
}

/* One field of a misc value, as the schema formats it (JSON). */
static void misc_field(sbuf *b, const misc_t *m, int f)
{
    switch (f) {
    case 0: sb_printf(b, "%.9g", (double)m->f); break;
    case 1: sb_printf(b, "[%u,%u,%u]", m->arr[0], m->arr[1], m->arr[2]); break;
    case 2: sb_printf(b, "%s", m->b ? "true" : "false"); break;
    case 3: sb_printf(b, "\"%016" PRIx64 "\"", m->ref); break;
    case 4: sb_printf(b, "\"%02x%02x%02x%02x\"", m->raw[0], m->raw[1], m->raw[2], m->raw[3]); break;
    default: sb_printf(b, "%d", m->neg); break;
    }
}

static bool misc_field_eq(const misc_t *a, const misc_t *b, int f)
{
    const keel_field *fl = &misc_fields[f];
    size_t w = f == 1 ? 6 : f == 2 ? 1 : f == 3 ? 8 : 4;
    return !memcmp((const char *)a + fl->offset, (const char *)b + fl->offset, w);
}

/* The components of an entity as diff prints them for created/destroyed. */
static void expect_components(sbuf *b, const snap_ent *x, bool json)
{
    const char *sep = json ? "" : " ";
    const char *kv = json ? "\"%s\":" : "%s=";
    bool first = true;
#define COMP(name)                                   \
    do {                                             \
        sb_printf(b, "%s", first || !json ? sep : ",");  \
        sb_printf(b, kv, name);                      \
        first = false;                               \
    } while (0)
    if (x->has_pos) {
        COMP("pos");
        sb_printf(b, "{\"x\":%" PRId64 ",\"born\":%" PRId64 "}", x->pos.x, x->pos.born);
    }
    if (x->has_hp) {
        COMP("hp");
        sb_printf(b, "{\"v\":%" PRId64 "}", x->hp);
    }
    if (x->has_flag) {
        COMP("flag");
        sb_printf(b, "{}");
    }
    if (x->has_money) {
        COMP("money");
        sb_printf(b, "{\"v\":%" PRId64 "}", x->money);
    }
    if (x->has_misc) {
        COMP("misc");
        for (int f = 0; f < 6; f++) {
            sb_printf(b, "%s\"%s\":", f ? "," : "{", misc_fields[f].name);
            misc_field(b, &x->misc, f);
        }
        sb_printf(b, "}");
    }
#undef COMP
}

static void expect_whole(sbuf *b, const char *op, const snap_ent *x, bool json)
{
    if (json) {
        sb_printf(b, "{\"op\":\"%s\",\"entity\":\"%016" PRIx64 "\",\"components\":{", op, x->e);
        expect_components(b, x, true);
        sb_printf(b, "}}\n");
    } else {
        sb_printf(b, "%-9s %016" PRIx64, op, x->e);
        expect_components(b, x, false);
        sb_printf(b, "\n");
    }
}

static void expect_field(sbuf *b, keel_entity e, const char *comp, const char *field, int64_t o, int64_t n, bool json)
{
    if (json)
        sb_printf(b, "{\"op\":\"changed\",\"entity\":\"%016" PRIx64 "\",\"component\":\"%s\",\"field\":\"%s\",\"old\":%"
                  PRId64 ",\"new\":%" PRId64 "}\n", e, comp, field, o, n);
    else
        sb_printf(b, "changed   %016" PRIx64 " %s.%s: %" PRId64 " -> %" PRId64 "\n", e, comp, field, o, n);
}

/* What diff prints for the surviving entity (0 lines when unchanged). */
static bool expect_changed(sbuf *b, const snap_ent *a, const snap_ent *x, bool json)
{
    size_t before = b->len;
    if (a->has_pos && x->has_pos) {
        if (a->pos.x != x->pos.x)
            expect_field(b, x->e, "pos", "x", a->pos.x, x->pos.x, json);
        if (a->pos.born != x->pos.born)
            expect_field(b, x->e, "pos", "born", a->pos.born, x->pos.born, json);
    }
    if (a->has_hp && x->has_hp && a->hp != x->hp)
        expect_field(b, x->e, "hp", "v", a->hp, x->hp, json);
    if (a->has_flag != x->has_flag) {
        if (json)
            sb_printf(b, "{\"op\":\"%s\",\"entity\":\"%016" PRIx64 "\",\"component\":\"flag\",\"%s\":{}}\n",
                      x->has_flag ? "added" : "removed", x->e, x->has_flag ? "value" : "old");
        else
            sb_printf(b, "changed   %016" PRIx64 " flag: %s\n", x->e, x->has_flag ? "added {}" : "removed (was {})");
    }
    if (a->has_money && x->has_money && a->money != x->money)
        expect_field(b, x->e, "money", "v", a->money, x->money, json);
    for (int f = 0; a->has_misc && x->has_misc && f < 6; f++) {
        if (misc_field_eq(&a->misc, &x->misc, f))
            continue;
        if (json)
            sb_printf(b, "{\"op\":\"changed\",\"entity\":\"%016" PRIx64 "\",\"component\":\"misc\",\"field\":\"%s\","
                      "\"old\":", x->e, misc_fields[f].name);
        else
            sb_printf(b, "changed   %016" PRIx64 " misc.%s: ", x->e, misc_fields[f].name);
        misc_field(b, &a->misc, f);
        sb_printf(b, json ? ",\"new\":" : " -> ");
        misc_field(b, &x->misc, f);
        sb_printf(b, json ? "}\n" : "\n");
    }
    ck_assert(a->has_pos == x->has_pos && a->has_hp == x->has_hp && a->has_money == x->has_money &&
              a->has_misc == x->has_misc);
    return b->len != before;
}

/* The whole expected output of diff A -> B, in slot order. */
static char *expect_diff(const wsnap *a, const wsnap *b, uint64_t from, uint64_t to, bool json, uint32_t counts[3])
{
    sbuf body = {0}, out = {0};
    sb_printf(&body, "%s", "");
    counts[0] = counts[1] = counts[2] = 0;
    uint32_t i = 0, j = 0;
    while (i < a->n || j < b->n) {
        uint32_t ia = i < a->n ? KEEL_ENTITY_INDEX(a->v[i].e) : UINT32_MAX;
        uint32_t ib = j < b->n ? KEEL_ENTITY_INDEX(b->v[j].e) : UINT32_MAX;
        uint32_t idx = ia < ib ? ia : ib;
        const snap_ent *xa = ia == idx ? &a->v[i++] : NULL, *xb = ib == idx ? &b->v[j++] : NULL;
        if (xa && xb && xa->e == xb->e) {
            counts[2] += expect_changed(&body, xa, xb, json);
            continue;
        }
        if (xa) {
            counts[1]++;
            expect_whole(&body, "destroyed", xa, json);
        }
        if (xb) {
            counts[0]++;
            expect_whole(&body, "created", xb, json);
        }
    }
    if (json)
        sb_printf(&out, "{\"op\":\"summary\",\"from_tick\":%" PRIu64 ",\"to_tick\":%" PRIu64 ",\"created\":%u,"
                  "\"destroyed\":%u,\"changed\":%u}\n", from, to, counts[0], counts[1], counts[2]);
    else
        sb_printf(&out, "diff tick %" PRIu64 " -> %" PRIu64 ": %u created, %u destroyed, %u changed\n", from, to,
                  counts[0], counts[1], counts[2]);
    sb_printf(&out, "%s", body.p);
    free(body.p);
    return out.p;
}

/* Compare line by line, naming the first difference. */
static void ck_lines_eq(const char *got, const char *want)
{
    uint32_t line = 1;
    const char *g = got, *w = want;
    while (*g && *w && *g == *w) {
        line += *g == '\n';
        g++, w++;
    }
    if (!*g && !*w)
        return;
    const char *gl = g, *wl_ = w;
    while (gl > got && gl[-1] != '\n')
        gl--;
    while (wl_ > want && wl_[-1] != '\n')
        wl_--;
    ck_abort_msg("diff output differs at line %u:\n got: %.200s\nwant: %.200s", line, gl, wl_);
}

START_TEST(diff_sets_and_values_equal_the_runtime_states)
{
    char dir[256];
    tu_path(dir, sizeof dir, "diff");
    wworld w = {0};
    wl_open(&w, dir, true);
    wsnap at[MAXT + 1] = {{0}};
    for (uint64_t t = 1; t <= 24; t++) {
        w_drive(&w, t);
        if (t == 3 || t == 12 || t == 19 || t == 24)
            at[t] = take_snap(&w);
        if (t == 14)
            ck_assert_ok(keel_checkpoint(w.rt));
    }
    w_close(&w);
    /* 12 -> 19 crosses the checkpoint (wal_retain reaches back); 19 -> 24 after it; 3 -> 3 is empty */
    static const uint64_t pairs[][2] = {{12, 19}, {19, 24}, {3, 24}, {3, 3}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        uint64_t from = pairs[k][0], to = pairs[k][1];
        char fa[24], ta[24];
        snprintf(fa, sizeof fa, "%" PRIu64, from);
        snprintf(ta, sizeof ta, "%" PRIu64, to);
        for (int json = 0; json < 2; json++) {
            uint32_t counts[3];
            char *want = expect_diff(&at[from], &at[to], from, to, json, counts);
            if (from != to) /* the workload creates, destroys and changes in every window */
                ck_assert(counts[0] && counts[1] && counts[2]);
            tu_run r = json ? kwal("diff", dir, "--from-tick", fa, "--to-tick", ta, "--json", NULL)
                             : kwal("diff", dir, "--tick", fa, "--tick", ta, NULL);
            ck_assert_exit(r, 0);
            ck_lines_eq(r.out, want);
            free(want);
            tu_run_free(&r);
        }
    }
    for (uint64_t t = 0; t <= MAXT; t++)
        free(at[t].v);
    kwal_expect(2, "--from-tick 9 is after --to-tick 4", "diff", dir, "--from-tick", "9", "--to-tick", "4", NULL);
    kwal_expect(1, "tick 25 is beyond the last completed tick 24", "diff", dir, "--from-tick", "9", "--to-tick", "25",
                NULL);
    kwal_expect(2, NULL, "diff", dir, "--from-tick", "9", NULL);
}
END_TEST

static Suite *diff_suite(void)
{
    const TTest *t[] = {diff_sets_and_values_equal_the_runtime_states};
    return suite_of("walstate_diff", t, 1);
}

/* ---- walstate_errors ------------------------------------------------------------------- */

/* The record at lsn (a copy), and its header. */
static void *record_copy(const char *dir, uint64_t lsn, size_t *len, kw_header *h)
{
    void *rec = tu_record_copy(dir, lsn, len);
    ck_assert_ok(kw_record_check(rec, *len, h));
    return rec;
}

/* The LSN of the first record of `kind` with tick >= tick (not on_first_tick's). */
static uint64_t find_record(const char *dir, uint32_t kind, uint64_t tick)
{
    tu_wal_reader w;
    tu_wal_open(&w, dir, 0);
    uint64_t lsn = 0, found = 0;
    const void *rec;
    size_t len;
    while (!found && kw_wal_next(w.it, &lsn, &rec, &len) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(rec, len, &h));
        if (h.kind == kind && h.tick >= tick && !(h.flags & KW_FLAG_HOOK))
            found = lsn;
    }
    tu_wal_close(&w);
    ck_assert_msg(found, "no %s record at tick >= %" PRIu64, kw_kind_name(kind), tick);
    return found;
}

/* Flip byte `at` of every copy of the record in data.mdb. */
static void flip_copies(const char *dir, const void *rec, size_t n, size_t at)
{
    char path[300];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    ck_assert_uint_gt(tu_flip_copies(path, rec, n, at), 0);
}

static void make_run(const char *dir, uint64_t ticks)
{
    wworld w = {0};
    wl_open(&w, dir, true);
    for (uint64_t t = 1; t <= ticks; t++)
        w_drive(&w, t);
    w_close(&w);
}

START_TEST(a_flipped_byte_is_corrupt_naming_the_lsn)
{
    char dir[256];
    tu_path(dir, sizeof dir, "flip");
    make_run(dir, 12);
    uint64_t lsn = find_record(dir, KW_KIND_SIDE, 8);
    size_t len;
    kw_header h;
    void *rec = record_copy(dir, lsn, &len, &h);
    ck_assert_uint_eq(h.tick, 8);
    uint64_t before = replay_hash(dir, 6, NULL);
    flip_copies(dir, rec, len, len - 3);
    free(rec);
    static const char *const ticks[] = {"8", "12"};
    for (int i = 0; i < 2; i++) {
        tu_run r = kwal("replay", dir, "--to-tick", ticks[i], NULL);
        ck_assert_exit(r, 1);
        ck_assert_contains(r.err, "KEEL_ECORRUPT");
        ck_assert_names_lsn(r.err, lsn);
        ck_assert_str_eq(r.out, "");
        tu_run_free(&r);
    }
    tu_run r = kwal("diff", dir, "--from-tick", "2", "--to-tick", "10", "--json", NULL);
    ck_assert_exit(r, 1);
    ck_assert_names_lsn(r.err, lsn);
    tu_run_free(&r);
    /* the state before the damaged record is still there; tick 7 is not:
     * replay reads on to the first record of a later tick, and the damaged
     * one may be it (its tick cannot be trusted) */
    ck_assert_uint_eq(replay_hash(dir, 6, NULL), before);
}
END_TEST

/* A LIFECYCLE record whose CRC is valid but whose first spawn names a
 * handle the allocator would not hand out: what recovery refuses, replay
 * refuses too, naming the LSN. */
START_TEST(a_valid_record_that_does_not_replay_is_corrupt)
{
    char dir[256];
    tu_path(dir, sizeof dir, "spawn");
    make_run(dir, 10);
    uint64_t lsn = find_record(dir, KW_KIND_LIFECYCLE, 6);
    size_t len;
    kw_header h;
    void *rec = record_copy(dir, lsn, &len, &h);
    kw_codec_desc cd = {.min_compress = UINT32_MAX}; /* rebuilt raw: the bytes below are the logical ones */
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(&cd, &c));
    const void *p;
    ck_assert_ok(kw_record_payload(c, rec, &h, &p));
    unsigned char *payload = malloc(h.raw_len);
    ck_assert_ptr_nonnull(payload);
    memcpy(payload, p, h.raw_len);
    /* find the first spawn (op 1) and bump its handle's generation */
    kw_decoder *d = malloc(sizeof *d);
    ck_assert_ptr_nonnull(d);
    ck_assert_ok(kw_decode_begin(d, KW_KIND_LIFECYCLE, lsn, payload, h.raw_len, NULL));
    kw_change ch;
    size_t at = 0;
    for (;;) {
        const unsigned char *op = d->cur.p;
        ck_assert_int_eq(kw_decode_next(d, &ch), 1);
        if (ch.op == KW_OP_SPAWN) {
            at = (size_t)(op - payload) + 1 + 4; /* the generation: high half of the handle after the op byte */
            break;
        }
    }
    free(d);
    payload[at] ^= 0x40;
    kw_buf out = {0};
    ck_assert_ok(kw_record_build(c, &out, h.kind, lsn, h.tick, h.flags, payload, h.raw_len));
    ck_assert_ok(kw_record_check(out.p, out.len, &h));
    free(rec);
    free(payload);
    kw_codec_destroy(c);
    tu_wal_put(dir, lsn, out.p, out.len);
    kw_buf_free(&out);
    tu_run r = kwal("replay", dir, "--to-tick", "10", NULL);
    ck_assert_exit(r, 1);
    ck_assert_contains(r.err, "KEEL_ECORRUPT");
    ck_assert_names_lsn(r.err, lsn);
    ck_assert_contains(r.err, "a spawn created a different entity handle than the one logged");
    tu_run_free(&r);
}
END_TEST

/* A checkpoint whose table list (under a valid CRC) claims more entity
 * slots than its slot pages hold -- one page more, or 2^32 - 256 --: replay
 * from it and verify exit 1 naming the shortfall, and replay sizes its
 * state by the pages, not the claim (outside the sanitizers the huge claim
 * runs under an address-space limit 2 GiB above this process's size, which
 * the child inherits: 48 GiB of slot state would break it). */
START_TEST(a_checkpoint_claiming_slots_it_lacks_is_corrupt)
{
    char dir[256];
    tu_path(dir, sizeof dir, "slots-claim");
    wworld w = {0};
    wl_open(&w, dir, false);
    for (uint64_t t = 1; t <= 6; t++) {
        w_drive(&w, t);
        if (t == 4)
            ck_assert_ok(keel_checkpoint(w.rt));
    }
    w_close(&w);
    uint64_t before = replay_hash(dir, 6, NULL);
    uint32_t held = tu_checkpoint_slots(dir, NULL), claims[2] = {held + 1024, UINT32_MAX - 256};
    for (int i = 0; i < 2; i++) {
        tu_checkpoint_slots(dir, &claims[i]);
        struct rlimit old;
        ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        if (i == 1)
            break;
#else
        struct rlimit lim = old;
        lim.rlim_cur = tu_vm_size() + (2ull << 30);
        ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
#endif
        tu_run r = kwal("replay", dir, "--to-tick", "6", NULL);
        ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
        ck_assert_exit(r, 1);
        char want[96];
        snprintf(want, sizeof want, "slot pages cover %u of its %u slots", held, claims[i]);
        ck_assert_contains(r.err, "KEEL_ECORRUPT");
        ck_assert_contains(r.err, want);
        ck_assert_str_eq(r.out, "");
        tu_run_free(&r);
        r = kwal("verify", dir, NULL);
        ck_assert_exit(r, 1);
        ck_assert_contains(r.out, "slot pages for");
        tu_run_free(&r);
    }
    tu_checkpoint_slots(dir, &held);
    ck_assert_uint_eq(replay_hash(dir, 6, NULL), before);
}
END_TEST

START_TEST(usage_errors_and_help)
{
    char dir[256];
    tu_path(dir, sizeof dir, "usage");
    make_run(dir, 2);
    tu_run r = kwal("replay", "--help", NULL);
    ck_assert_exit(r, 0);
    ck_assert_contains(r.out, "usage: keel-wal replay DIR --to-tick N");
    ck_assert_contains(r.out, "wal_retain");
    tu_run_free(&r);
    r = kwal("diff", "-h", NULL);
    ck_assert_exit(r, 0);
    ck_assert_contains(r.out, "usage: keel-wal diff DIR --from-tick A --to-tick B");
    tu_run_free(&r);
    kwal_expect(2, "--to-tick N is required", "replay", dir, NULL);
    kwal_expect(2, NULL, "replay", dir, "--to-tick", "-3", NULL);
    kwal_expect(2, "unknown option '--frobnicate'", "replay", dir, "--to-tick", "1", "--frobnicate", NULL);
    char missing[300];
    tu_path(missing, sizeof missing, "no-such-dir");
    kwal_expect(2, missing, "replay", missing, "--to-tick", "1", NULL);
    kwal_expect(2, NULL, "diff", missing, "--from-tick", "1", "--to-tick", "2", NULL);
}
END_TEST

static Suite *errors_suite(void)
{
    const TTest *t[] = {a_flipped_byte_is_corrupt_naming_the_lsn, a_valid_record_that_does_not_replay_is_corrupt,
                        a_checkpoint_claiming_slots_it_lacks_is_corrupt, usage_errors_and_help};
    return suite_of("walstate_errors", t, sizeof t / sizeof t[0]);
}

KEEL_TEST_MAIN(replay_suite, diff_suite, errors_suite)
