/*
 * tests/test_schedule.c -- Check suites for the static schedule (docs/scheduling.md):
 * declaring tracks and systems, keel_schedule_build's derived edges and
 * diagnostics (codes, names, messages, order), cycle reports, the
 * deterministic Kahn order and the FNV-1a plan hash, and installation on a
 * runtime (foreign and stale schedules).
 *
 * Expected values come from the rules stated in docs/scheduling.md, include/keel/
 * schedule.h and the top comment of src/sched/schedule.c; where those leave
 * a choice open (which cycle is reported, tie-breaks), the expectation is
 * derived by hand from the documented algorithm and written next to the test.
 * Only the public API is used.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"

/* ======================================================================
 * Fixtures
 * ====================================================================== */

typedef struct vec3 {
    float x, y, z;
} vec3;

static const keel_field vec3_fields[] = {
    {.name = "x", .type = KEEL_F32, .offset = 0},
    {.name = "y", .type = KEEL_F32, .offset = 4},
    {.name = "z", .type = KEEL_F32, .offset = 8},
};
static const keel_field u32_fields[] = {{.name = "value", .type = KEEL_U32, .offset = 0}};

/* A runtime (serial: one worker), its world with the standard components,
 * and one fresh schedule. */
typedef struct fx {
    keel_runtime *rt;
    keel_world *w;
    keel_schedule *s;
    keel_component pos;     /* vec3, VERSIONED (id 1) */
    keel_component vel;     /* vec3, VERSIONED (id 2) */
    keel_component hp;      /* u32, SINGLE_VERSION (id 3) */
    keel_component scratch; /* u32, TRANSIENT (id 4) */
    keel_component tag;     /* tag, VERSIONED (id 5) */
} fx;

static void fx_open(fx *f)
{
    memset(f, 0, sizeof *f);
    f->rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    f->w = keel_runtime_world(f->rt);
    ck_assert_ptr_nonnull(f->w);
    f->pos = tu_reg(f->w, "pos", sizeof(vec3), KEEL_VERSIONED, vec3_fields, 3);
    f->vel = tu_reg(f->w, "vel", sizeof(vec3), KEEL_VERSIONED, vec3_fields, 3);
    f->hp = tu_reg(f->w, "hp", 4, KEEL_SINGLE_VERSION, u32_fields, 1);
    f->scratch = tu_reg(f->w, "scratch", 4, KEEL_TRANSIENT, u32_fields, 1);
    f->tag = tu_reg(f->w, "tag", 0, KEEL_VERSIONED, NULL, 0);
    ck_assert_uint_eq(f->pos, 1);
    ck_assert_uint_eq(f->tag, 5);
    ck_assert_ok(keel_schedule_create(f->rt, &f->s));
    ck_assert_ptr_nonnull(f->s);
}

/* Destroying an installed schedule is a no-op (the runtime owns it). */
static void fx_close(fx *f)
{
    keel_schedule_destroy(f->s);
    keel_runtime_close(f->rt);
    memset(f, 0, sizeof *f);
}

/* fx_open into a value, for a test with one fixture. */
static fx fx_new(void)
{
    fx f;
    fx_open(&f);
    return f;
}

static int count_body(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (*(int *)user)++;
    return 0;
}

static int chunk_body(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)it;
    (void)user;
    return 0;
}

static int pipe_body(uint32_t index, uint32_t count, void *user)
{
    (void)index;
    (void)count;
    (void)user;
    return 0;
}

/* Add a system; the desc gets the trivial callback tu_sys_noop unless it has one. */
static keel_system add(keel_schedule *s, keel_system_desc d)
{
    if (d.kind == KEEL_SYSTEM_CALLBACK && !d.run)
        d.run = tu_sys_noop;
    keel_system id = UINT32_MAX;
    ck_assert_ok(keel_schedule_add_system(s, &d, &id));
    return id;
}

/* Plain callback system with no access. */
static keel_system add_cb(keel_schedule *s, const char *name)
{
    return add(s, (keel_system_desc){.name = name});
}

/* ---- inspecting a build ---------------------------------------------------- */

/* The i-th diagnostic, asserted to exist. */
static const keel_sched_diag *diag_at(const keel_schedule *s, uint32_t i)
{
    const keel_sched_diag *d = keel_schedule_diag(s, i);
    ck_assert_msg(d != NULL, "diagnostic %u missing (count %u)", i, keel_schedule_diag_count(s));
    ck_assert_ptr_nonnull(d->message);
    return d;
}

static uint32_t count_code(const keel_schedule *s, keel_sched_code code)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < keel_schedule_diag_count(s); i++)
        n += diag_at(s, i)->code == code;
    return n;
}

/* Assert the diagnostic's code, severity and exact names (NULL-terminated). */
static void assert_diag(const keel_sched_diag *d, keel_sched_code code, keel_sched_severity sev, ...)
{
    ck_assert_msg(d->code == code, "code %s, expected %s (%s)", keel_sched_code_name(d->code),
                  keel_sched_code_name(code), d->message);
    ck_assert_int_eq(d->severity, sev);
    va_list ap;
    va_start(ap, sev);
    uint32_t n = 0;
    for (const char *name; (name = va_arg(ap, const char *)) != NULL; n++) {
        ck_assert_msg(n < d->name_count, "%s: name %u ('%s') missing, only %u names", d->message, n, name,
                      d->name_count);
        ck_assert_ptr_nonnull(d->names[n]);
        ck_assert_str_eq(d->names[n], name);
    }
    va_end(ap);
    ck_assert_msg(n == d->name_count, "%s: %u names, expected %u", d->message, d->name_count, n);
}

static void assert_contains(const char *hay, const char *needle)
{
    ck_assert_ptr_nonnull(hay);
    ck_assert_msg(strstr(hay, needle) != NULL, "'%s' does not contain '%s'", hay, needle);
}

/* Build, expecting failure; returns the diagnostic count. */
static uint32_t build_fails(keel_schedule *s)
{
    ck_assert_rc(keel_schedule_build(s), KEEL_EINVAL);
    ck_assert_uint_eq(keel_schedule_hash(s), 0);
    ck_assert_uint_eq(keel_schedule_order(s, 0), UINT32_MAX);
    uint32_t n = keel_schedule_diag_count(s);
    ck_assert_uint_ge(n, 1);
    return n;
}

/* Build, expecting success with no diagnostic at all. */
static void build_clean(keel_schedule *s)
{
    ck_assert_ok(keel_schedule_build(s));
    ck_assert_msg(keel_schedule_diag_count(s) == 0, "unexpected diagnostic: %s",
                  keel_schedule_diag(s, 0) ? keel_schedule_diag(s, 0)->message : "?");
    ck_assert_uint_ne(keel_schedule_hash(s), 0);
}

/* The execution order as "a,b,c". */
static const char *order_str(const keel_schedule *s)
{
    static char buf[8192];
    size_t used = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < keel_schedule_system_count(s); i++) {
        keel_system sys = keel_schedule_order(s, i);
        const char *name = keel_schedule_system_name(s, sys);
        ck_assert_ptr_nonnull(name);
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", i ? "," : "", name);
        ck_assert_uint_lt(used, sizeof buf);
    }
    return buf;
}

/* build_clean, then the execution order must be `want` ("a,b,c"). */
static void assert_built_order(keel_schedule *s, const char *want)
{
    build_clean(s);
    ck_assert_str_eq(order_str(s), want);
}

/* Position of system sys in the execution order; also checks the order is a
 * permutation of the systems. */
static uint32_t order_pos(const keel_schedule *s, keel_system sys)
{
    uint32_t n = keel_schedule_system_count(s), found = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++)
        if (keel_schedule_order(s, i) == sys) {
            ck_assert_uint_eq(found, UINT32_MAX);
            found = i;
        }
    ck_assert_msg(found != UINT32_MAX, "system %u not in the order", sys);
    return found;
}

/* Every system exactly once in the order. */
static void assert_permutation(const keel_schedule *s)
{
    uint32_t n = keel_schedule_system_count(s);
    unsigned char *seen = calloc(n + 1, 1);
    ck_assert_ptr_nonnull(seen);
    for (uint32_t i = 0; i < n; i++) {
        keel_system sys = keel_schedule_order(s, i);
        ck_assert_uint_lt(sys, n);
        ck_assert_uint_eq(seen[sys], 0);
        seen[sys] = 1;
    }
    ck_assert_uint_eq(keel_schedule_order(s, n), UINT32_MAX);
    free(seen);
}

/* ======================================================================
 * sched_build
 * ====================================================================== */

/* FNV-1a 64 of "Engine-Pre\0Public\0Engine-Post\0" (Python:
 *   h = 0xcbf29ce484222325
 *   for b in b"Engine-Pre\0Public\0Engine-Post\0": h = ((h ^ b) * 0x100000001b3) % 2**64
 * ) -- an empty schedule hashes its three built-in track names. */
#define EMPTY_SCHEDULE_HASH 0xfaa9c7ddd98b5181ull

START_TEST(test_empty_builds)
{
    fx f = fx_new();
    ck_assert_uint_eq(keel_schedule_hash(f.s), 0); /* 0 before a successful build */
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 0);
    build_clean(f.s);
    uint64_t h = keel_schedule_hash(f.s);
    ck_assert_uint_eq(h, EMPTY_SCHEDULE_HASH);
    ck_assert_uint_eq(keel_schedule_hash(f.s), h); /* stable */
    ck_assert_uint_eq(keel_schedule_order(f.s, 0), UINT32_MAX);
    ck_assert_ptr_null(keel_schedule_diag(f.s, 0));

    /* another runtime, another empty schedule: same hash */
    keel_runtime *rt2 = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_schedule *s2 = NULL;
    ck_assert_ok(keel_schedule_create(rt2, &s2));
    build_clean(s2);
    ck_assert_uint_eq(keel_schedule_hash(s2), h);
    keel_schedule_destroy(s2);
    keel_runtime_close(rt2);
    fx_close(&f);
}
END_TEST

START_TEST(test_null_arguments)
{
    fx f = fx_new();
    keel_schedule *s = NULL;
    ck_assert_rc(keel_schedule_create(NULL, &s), KEEL_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_rc(keel_schedule_create(f.rt, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_build(NULL), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(NULL, "T"), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_system(NULL, &(keel_system_desc){.name = "a", .run = tu_sys_noop}, NULL), KEEL_EINVAL);
    ck_assert_uint_eq(keel_schedule_diag_count(NULL), 0);
    ck_assert_ptr_null(keel_schedule_diag(NULL, 0));
    ck_assert_uint_eq(keel_schedule_hash(NULL), 0);
    ck_assert_uint_eq(keel_schedule_system_count(NULL), 0);
    ck_assert_ptr_null(keel_schedule_system_name(NULL, 0));
    ck_assert_uint_eq(keel_schedule_order(NULL, 0), UINT32_MAX);
    keel_schedule_destroy(NULL);
    fx_close(&f);
}
END_TEST

START_TEST(test_build_twice_ebusy)
{
    fx f = fx_new();
    add_cb(f.s, "a");
    add(f.s, (keel_system_desc){.name = "b", .after = {"a"}});
    build_clean(f.s);
    uint64_t h = keel_schedule_hash(f.s);
    ck_assert_rc(keel_schedule_build(f.s), KEEL_EBUSY);
    assert_contains(keel_last_error(), "already built");
    /* the first build's result is untouched */
    ck_assert_uint_eq(keel_schedule_hash(f.s), h);
    ck_assert_uint_eq(keel_schedule_diag_count(f.s), 0);
    ck_assert_str_eq(order_str(f.s), "a,b");

    /* a failed build cannot be retried either */
    keel_schedule *s2 = NULL;
    ck_assert_ok(keel_schedule_create(f.rt, &s2));
    add(s2, (keel_system_desc){.name = "x", .after = {"ghost"}});
    uint32_t n = build_fails(s2);
    ck_assert_rc(keel_schedule_build(s2), KEEL_EBUSY);
    ck_assert_uint_eq(keel_schedule_diag_count(s2), n);
    keel_schedule_destroy(s2);
    fx_close(&f);
}
END_TEST

START_TEST(test_add_after_build_ebusy)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add_cb(f.s, "a");
    build_clean(f.s);
    uint64_t h = keel_schedule_hash(f.s);
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "b", .run = tu_sys_noop}, NULL), KEEL_EBUSY);
    assert_contains(keel_last_error(), "'b'");
    ck_assert_rc(keel_schedule_add_track(f.s, "Later"), KEEL_EBUSY);
    assert_contains(keel_last_error(), "'Later'");
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 1);
    ck_assert_uint_eq(keel_schedule_hash(f.s), h);
    ck_assert_str_eq(order_str(f.s), "a");
    fx_close(&f);
}
END_TEST

START_TEST(test_add_system_invalid)
{
    fx f = fx_new();
    char name63[64], name64[65];
    memset(name63, 'n', 63);
    name63[63] = '\0';
    memset(name64, 'n', 64);
    name64[64] = '\0';

    keel_system id = 77;
    ck_assert_rc(keel_schedule_add_system(f.s, NULL, &id), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.run = tu_sys_noop}, &id), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "", .run = tu_sys_noop}, &id), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = name64, .run = tu_sys_noop}, &id), KEEL_EINVAL);
    assert_contains(keel_last_error(), "63");
    ck_assert_uint_eq(id, 77); /* untouched on error */
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 0);

    /* 63 bytes is the longest name; indices are registration order */
    ck_assert_ok(keel_schedule_add_system(f.s, &(keel_system_desc){.name = name63, .run = tu_sys_noop}, &id));
    ck_assert_uint_eq(id, 0);
    ck_assert_ok(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "b", .run = tu_sys_noop}, &id));
    ck_assert_uint_eq(id, 1);
    ck_assert_ok(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "c", .run = tu_sys_noop}, NULL));
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 3);
    ck_assert_str_eq(keel_schedule_system_name(f.s, 0), name63);
    ck_assert_str_eq(keel_schedule_system_name(f.s, 2), "c");
    ck_assert_ptr_null(keel_schedule_system_name(f.s, 3));
    build_clean(f.s);
    ck_assert_uint_eq(keel_schedule_order(f.s, 0), 0);
    fx_close(&f);
}
END_TEST

/* The descriptor and its strings are copied at add time. */
START_TEST(test_add_system_copies_strings)
{
    fx f = fx_new();
    char name[16], after[16], track[16], res[16];
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    strcpy(name, "first");
    add(f.s, (keel_system_desc){.name = name, .access.resources_write = {"gold"}});
    strcpy(name, "second");
    strcpy(after, "first");
    strcpy(track, "Public");
    strcpy(res, "gold");
    keel_system_desc d = {.name = name, .run = tu_sys_noop, .track = track, .after = {after}, .access.resources_write = {res}};
    ck_assert_ok(keel_schedule_add_system(f.s, &d, NULL));
    /* scribble over everything the schedule was handed */
    strcpy(name, "zzz");
    strcpy(after, "nope");
    strcpy(track, "Nowhere");
    strcpy(res, "silver");
    memset(&d, 0xab, sizeof d);
    ck_assert_str_eq(keel_schedule_system_name(f.s, 0), "first");
    ck_assert_str_eq(keel_schedule_system_name(f.s, 1), "second");
    /* still "after first" on track Public writing "gold": no error, ordered */
    assert_built_order(f.s, "first,second");
    fx_close(&f);
}
END_TEST

/* System, track and dag names are UTF-8 without control characters (they
 * go into metric labels and trace JSON): a refusal names the name's role
 * and the offending byte by offset, never printing the bytes themselves. */
START_TEST(test_names_utf8)
{
    fx f = fx_new();
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "bad\xff", .run = tu_sys_noop}, NULL),
                 KEEL_EINVAL);
    assert_contains(keel_last_error(), "the system name is not valid UTF-8 at byte 3 (0xff)");
    ck_assert_ptr_null(strchr(keel_last_error(), 0xff));
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "sur\xed\xb2\x80", .run = tu_sys_noop},
                                          NULL), KEEL_EINVAL);
    assert_contains(keel_last_error(), "byte 4");
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "line\nfeed", .run = tu_sys_noop}, NULL),
                 KEEL_EINVAL);
    assert_contains(keel_last_error(), "control character 0x0a at byte 4");
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "s", .track = "T\xc1\x81",
                                                                   .run = tu_sys_noop}, NULL), KEEL_EINVAL);
    assert_contains(keel_last_error(), "system 's''s track name is not valid UTF-8 at byte 1");
    ck_assert_rc(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "s", .dag = "d\x1b[0m",
                                                                   .run = tu_sys_noop}, NULL), KEEL_EINVAL);
    assert_contains(keel_last_error(), "system 's''s dag name holds control character 0x1b at byte 1");
    ck_assert_rc(keel_schedule_add_track(f.s, "Tr\xf4\x90\x80\x80"), KEEL_EINVAL);
    assert_contains(keel_last_error(), "the track name is not valid UTF-8 at byte 3");
    ck_assert_rc(keel_schedule_add_track(f.s, "Tr\x7f"), KEEL_EINVAL);
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 0);
    /* UTF-8 beyond ASCII is fine everywhere */
    ck_assert_ok(keel_schedule_add_track(f.s, "Sp\xc3\xa4t"));
    ck_assert_ok(keel_schedule_add_system(f.s, &(keel_system_desc){.name = "\xe6\x88\x98\xe9\x97\x98 \"q\" \\",
                                                                   .track = "Sp\xc3\xa4t", .dag = "\xf0\x9f\x8c\x8d",
                                                                   .run = tu_sys_noop}, NULL));
    build_clean(f.s);
    fx_close(&f);
}
END_TEST

START_TEST(test_add_track_invalid)
{
    fx f = fx_new();
    char name64[65];
    memset(name64, 't', 64);
    name64[64] = '\0';
    ck_assert_rc(keel_schedule_add_track(f.s, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(f.s, ""), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(f.s, name64), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(f.s, "Engine-X"), KEEL_EINVAL);
    assert_contains(keel_last_error(), "reserved");
    ck_assert_rc(keel_schedule_add_track(f.s, KEEL_TRACK_ENGINE_PRE), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(f.s, KEEL_TRACK_ENGINE_POST), KEEL_EINVAL);
    ck_assert_rc(keel_schedule_add_track(f.s, KEEL_TRACK_PUBLIC), KEEL_EINVAL);
    assert_contains(keel_last_error(), "reserved");
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    ck_assert_rc(keel_schedule_add_track(f.s, "Late"), KEEL_EEXIST);
    assert_contains(keel_last_error(), "'Late'");
    ck_assert_ok(keel_schedule_add_track(f.s, "Engine")); /* only the "Engine-" prefix is reserved */
    /* the failed declarations left no track behind: a system on Engine-X is reserved, on Late fine */
    add(f.s, (keel_system_desc){.name = "a", .track = "Late"});
    add(f.s, (keel_system_desc){.name = "b", .track = "Engine"});
    build_clean(f.s);
    /* Public (empty), then Late, then Engine, in declaration order */
    ck_assert_str_eq(order_str(f.s), "a,b");
    fx_close(&f);
}
END_TEST

START_TEST(test_failed_build)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .after = {"ghost"}});
    add_cb(f.s, "b");
    ck_assert_rc(keel_schedule_build(f.s), KEEL_EINVAL);
    const char *err = keel_last_error();
    assert_contains(err, "SCHED_UNKNOWN_SYSTEM");
    assert_contains(err, diag_at(f.s, 0)->message);
    ck_assert_uint_eq(keel_schedule_diag_count(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, "a", "ghost", NULL);
    ck_assert_ptr_null(keel_schedule_diag(f.s, 1));
    ck_assert_uint_eq(keel_schedule_hash(f.s), 0);
    ck_assert_uint_eq(keel_schedule_order(f.s, 0), UINT32_MAX);
    /* names are still readable */
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 2);
    ck_assert_str_eq(keel_schedule_system_name(f.s, 1), "b");

    ck_assert_rc(keel_runtime_set_schedule(f.rt, f.s), KEEL_EINVAL);
    assert_contains(keel_last_error(), "built with errors");
    /* not installed: nothing to step */
    ck_assert_rc(keel_runtime_step(f.rt), KEEL_EINVAL);
    assert_contains(keel_last_error(), "no schedule");
    fx_close(&f); /* still ours: fx_close destroys it */
}
END_TEST

/* keel_last_error names the first *error*, even when a warning precedes it. */
START_TEST(test_last_error_names_first_error)
{
    fx f = fx_new();
    /* pair (r, w): r reads pos and is explicitly before its writer -> warning;
     * pair (x, y): both write vel, unordered -> error. Needs are checked in
     * pair order, so the warning is diagnostic 0. */
    add(f.s, (keel_system_desc){.name = "r", .access.reads = {f.pos}, .before = {"w"}});
    add(f.s, (keel_system_desc){.name = "w", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "x", .access.writes = {f.vel}});
    add(f.s, (keel_system_desc){.name = "y", .access.writes = {f.vel}});
    ck_assert_rc(keel_schedule_build(f.s), KEEL_EINVAL);
    const char *err = keel_last_error();
    ck_assert_uint_eq(keel_schedule_diag_count(f.s), 2);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_BEFORE_WRITE, KEEL_SCHED_WARNING, "r", "w", "pos", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_WRITE_CONFLICT, KEEL_SCHED_ERROR, "x", "y", "vel", NULL);
    assert_contains(err, "SCHED_WRITE_CONFLICT");
    ck_assert_ptr_null(strstr(err, "READ_BEFORE_WRITE"));
    fx_close(&f);
}
END_TEST

START_TEST(test_set_schedule_refusals)
{
    fx f = fx_new();
    add_cb(f.s, "a");
    ck_assert_rc(keel_runtime_set_schedule(f.rt, f.s), KEEL_EINVAL);
    assert_contains(keel_last_error(), "not built");
    ck_assert_rc(keel_runtime_set_schedule(f.rt, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_runtime_set_schedule(NULL, f.s), KEEL_EINVAL);
    build_clean(f.s);
    ck_assert_ok(keel_runtime_set_schedule(f.rt, f.s));
    fx_close(&f); /* installed: the runtime frees it */
}
END_TEST

START_TEST(test_set_schedule_foreign)
{
    fx f = fx_new();
    keel_runtime *other = tu_rt_new((keel_runtime_desc){.workers = 1});
    add_cb(f.s, "a");
    build_clean(f.s);
    ck_assert_rc(keel_runtime_set_schedule(other, f.s), KEEL_EINVAL);
    assert_contains(keel_last_error(), "another runtime");
    ck_assert_rc(keel_runtime_step(other), KEEL_EINVAL); /* nothing was installed there */
    keel_runtime_close(other);
    /* the schedule is still usable on its own runtime */
    ck_assert_ok(keel_runtime_set_schedule(f.rt, f.s));
    ck_assert_ok(keel_runtime_step(f.rt));
    ck_assert_uint_eq(keel_runtime_tick(f.rt), 1);
    fx_close(&f);
}
END_TEST

START_TEST(test_stale_schedule)
{
    fx f = fx_new();
    int runs = 0;
    add(f.s, (keel_system_desc){.name = "count", .run = count_body, .user = &runs});
    build_clean(f.s);
    tu_reg(f.w, "late_component", 4, KEEL_VERSIONED, u32_fields, 1);
    ck_assert_ok(keel_runtime_set_schedule(f.rt, f.s)); /* installed: owned by the runtime now */
    ck_assert_rc(keel_runtime_step(f.rt), KEEL_EINVAL);
    assert_contains(keel_last_error(), "stale");
    ck_assert_int_eq(runs, 0);
    ck_assert_uint_eq(keel_runtime_tick(f.rt), 0);

    /* a schedule built against the new registry replaces it and runs */
    keel_schedule *s2 = NULL;
    ck_assert_ok(keel_schedule_create(f.rt, &s2));
    add(s2, (keel_system_desc){.name = "count", .run = count_body, .user = &runs});
    build_clean(s2);
    ck_assert_uint_eq(keel_schedule_hash(s2), keel_schedule_hash(f.s));
    ck_assert_ok(keel_runtime_set_schedule(f.rt, s2)); /* frees the stale one */
    f.s = s2;
    ck_assert_ok(keel_runtime_step(f.rt));
    ck_assert_int_eq(runs, 1);
    ck_assert_uint_eq(keel_runtime_tick(f.rt), 1);
    fx_close(&f);
}
END_TEST

START_TEST(test_code_names)
{
    static const struct {
        keel_sched_code code;
        const char *name;
    } names[] = {
        {KEEL_SCHED_UNKNOWN_SYSTEM, "SCHED_UNKNOWN_SYSTEM"},
        {KEEL_SCHED_DUPLICATE_SYSTEM, "SCHED_DUPLICATE_SYSTEM"},
        {KEEL_SCHED_CYCLE, "SCHED_CYCLE"},
        {KEEL_SCHED_WRITE_CONFLICT, "SCHED_WRITE_CONFLICT"},
        {KEEL_SCHED_READ_CONFLICT, "SCHED_READ_CONFLICT"},
        {KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, "SCHED_SNAPSHOT_NOT_VERSIONED"},
        {KEEL_SCHED_EXCLUSIVE_CONFLICT, "SCHED_EXCLUSIVE_CONFLICT"},
        {KEEL_SCHED_UNKNOWN_TRACK, "SCHED_UNKNOWN_TRACK"},
        {KEEL_SCHED_RESERVED_TRACK, "SCHED_RESERVED_TRACK"},
        {KEEL_SCHED_BAD_SYSTEM, "SCHED_BAD_SYSTEM"},
        {KEEL_SCHED_READ_BEFORE_WRITE, "SCHED_READ_BEFORE_WRITE"},
    };
    /* the codes are stable numbers too */
    ck_assert_int_eq(KEEL_SCHED_UNKNOWN_SYSTEM, 1);
    ck_assert_int_eq(KEEL_SCHED_READ_BEFORE_WRITE, 11);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        ck_assert_int_eq(names[i].code, (int)i + 1);
        ck_assert_str_eq(keel_sched_code_name(names[i].code), names[i].name);
    }
    ck_assert_str_eq(keel_sched_code_name((keel_sched_code)0), "SCHED_?");
    ck_assert_str_eq(keel_sched_code_name((keel_sched_code)12), "SCHED_?");
    ck_assert_str_eq(keel_sched_code_name((keel_sched_code)-1), "SCHED_?");
}
END_TEST

static Suite *sched_build_suite(void)
{
    const TTest *const t[] = {test_empty_builds, test_null_arguments, test_build_twice_ebusy,
                              test_add_after_build_ebusy, test_add_system_invalid, test_add_system_copies_strings,
                              test_add_track_invalid, test_names_utf8, test_failed_build, test_last_error_names_first_error,
                              test_set_schedule_refusals, test_set_schedule_foreign, test_stale_schedule,
                              test_code_names};
    return tu_case_suite("sched_build", "build", t, sizeof t / sizeof t[0]);
}

/* ======================================================================
 * sched_rules
 * ====================================================================== */

START_TEST(test_unknown_system)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .after = {"b", "missing_after"}});
    add(f.s, (keel_system_desc){.name = "b", .before = {"missing_before"}});
    ck_assert_uint_eq(build_fails(f.s), 2);
    /* explicit edges in system order, "after" list before "before" list */
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, "a", "missing_after", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "system 'a' is after 'missing_after', which does not exist");
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, "b", "missing_before", NULL);
    ck_assert_str_eq(diag_at(f.s, 1)->message, "system 'b' is before 'missing_before', which does not exist");
    fx_close(&f);
}
END_TEST

START_TEST(test_duplicate_system)
{
    fx f = fx_new();
    add_cb(f.s, "z");
    add_cb(f.s, "dup");
    add_cb(f.s, "z");
    add_cb(f.s, "dup");
    add_cb(f.s, "dup");
    ck_assert_uint_eq(build_fails(f.s), 3);
    ck_assert_uint_eq(count_code(f.s, KEEL_SCHED_DUPLICATE_SYSTEM), 3);
    /* reported by name (sorted), each repeat once */
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_DUPLICATE_SYSTEM, KEEL_SCHED_ERROR, "dup", NULL);
    assert_contains(diag_at(f.s, 0)->message, "#1 and #3");
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_DUPLICATE_SYSTEM, KEEL_SCHED_ERROR, "dup", NULL);
    assert_contains(diag_at(f.s, 1)->message, "#3 and #4");
    assert_diag(diag_at(f.s, 2), KEEL_SCHED_DUPLICATE_SYSTEM, KEEL_SCHED_ERROR, "z", NULL);
    assert_contains(diag_at(f.s, 2)->message, "#0 and #2");
    fx_close(&f);
}
END_TEST

START_TEST(test_write_conflict_component)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "w1", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "w2", .access.side_writes = {f.pos}}); /* side_writes count as writes */
    ck_assert_uint_eq(build_fails(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_WRITE_CONFLICT, KEEL_SCHED_ERROR, "w1", "w2", "pos", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "systems 'w1' and 'w2' both write 'pos' with no ordering between them");
    fx_close(&f);
}
END_TEST

START_TEST(test_write_conflict_resource)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .access.resources_write = {"audio", "gold"}});
    add(f.s, (keel_system_desc){.name = "b", .access.resources_write = {"gold"}});
    add(f.s, (keel_system_desc){.name = "c", .access.resources_read = {"audio"}}); /* read vs a */
    ck_assert_uint_eq(build_fails(f.s), 2);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_WRITE_CONFLICT, KEEL_SCHED_ERROR, "a", "b", "gold", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_READ_CONFLICT, KEEL_SCHED_ERROR, "a", "c", "audio", NULL);
    fx_close(&f);
}
END_TEST

START_TEST(test_read_conflict)
{
    fx f = fx_new();
    /* the reader is registered first: names stay in registration order */
    add(f.s, (keel_system_desc){.name = "reader", .access.reads = {f.vel}});
    add(f.s, (keel_system_desc){.name = "writer", .access.writes = {f.vel}});
    ck_assert_uint_eq(build_fails(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_CONFLICT, KEEL_SCHED_ERROR, "reader", "writer", "vel", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message,
                     "systems 'reader' and 'writer' read and write 'vel' with no ordering between them");
    fx_close(&f);
}
END_TEST

/* Readers of one component never conflict with each other. */
START_TEST(test_readers_do_not_conflict)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "r1", .access.reads = {f.pos}, .access.resources_read = {"gold"}});
    add(f.s, (keel_system_desc){.name = "r2", .access.reads = {f.pos}, .access.reads_fresh = {f.vel}});
    add(f.s, (keel_system_desc){.name = "r3", .access.reads = {f.pos}, .access.resources_read = {"gold"}});
    assert_built_order(f.s, "r1,r2,r3");
    fx_close(&f);
}
END_TEST

START_TEST(test_no_conflict_when_ordered)
{
    fx f = fx_new();
    /* registered consumer-first; the explicit edge fixes the order */
    add(f.s, (keel_system_desc){.name = "second", .access.writes = {f.pos}, .access.reads = {f.vel},
                                .after = {"first"}});
    add(f.s, (keel_system_desc){.name = "first", .access.writes = {f.pos, f.vel}, .access.resources_write = {"gold"}});
    add(f.s, (keel_system_desc){.name = "third", .access.resources_write = {"gold"}, .after = {"second"}}); /* transitive */
    assert_built_order(f.s, "first,second,third");
    fx_close(&f);
}
END_TEST

START_TEST(test_phase_orders_conflicts)
{
    fx f = fx_new();
    /* same DAG, different phases: the lower phase goes first whatever the
     * registration order; a writer in phase 0 and a plain reader in phase 1
     * is no conflict and no warning */
    add(f.s, (keel_system_desc){.name = "late_writer", .phase = 2, .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "reader", .phase = 1, .access.reads = {f.vel}});
    add(f.s, (keel_system_desc){.name = "early_writer", .phase = 0, .access.writes = {f.pos, f.vel}});
    add(f.s, (keel_system_desc){.name = "bystander", .phase = 0});
    build_clean(f.s);
    /* edges early_writer -> late_writer and early_writer -> reader only;
     * among the ready systems the smallest registration index goes first */
    ck_assert_str_eq(order_str(f.s), "early_writer,late_writer,reader,bystander");
    ck_assert_uint_lt(order_pos(f.s, 2), order_pos(f.s, 0)); /* phase 0 writer before phase 2 writer */
    ck_assert_uint_lt(order_pos(f.s, 2), order_pos(f.s, 1)); /* phase 0 writer before phase 1 reader */
    fx_close(&f);
}
END_TEST

/* Phases order only where access conflicts: no all-to-all barrier. */
START_TEST(test_phase_no_barrier)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "p1", .phase = 1, .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "p0", .phase = 0, .access.writes = {f.vel}});
    build_clean(f.s);
    /* no edge between them: registration order wins */
    ck_assert_str_eq(order_str(f.s), "p1,p0");
    fx_close(&f);
}
END_TEST

START_TEST(test_reads_fresh_edge)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "reader", .access.reads_fresh = {f.pos}});
    add(f.s, (keel_system_desc){.name = "writer", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "side", .access.side_writes = {f.pos}, .after = {"writer"}});
    build_clean(f.s);
    /* after every writer (side_writes included), although registered first */
    ck_assert_str_eq(order_str(f.s), "writer,side,reader");

    /* the edge differs from the unordered plan: the hash shows it */
    keel_schedule *s2 = NULL;
    ck_assert_ok(keel_schedule_create(f.rt, &s2));
    add(s2, (keel_system_desc){.name = "reader"});
    add(s2, (keel_system_desc){.name = "writer", .access.writes = {f.pos}});
    add(s2, (keel_system_desc){.name = "side", .access.side_writes = {f.pos}, .after = {"writer"}});
    assert_built_order(s2, "reader,writer,side");
    ck_assert_uint_ne(keel_schedule_hash(s2), keel_schedule_hash(f.s));
    keel_schedule_destroy(s2);
    fx_close(&f);
}
END_TEST

/* A snapshot reader reads the tick-start version: no edge to the writer, no
 * conflict, no warning -- the two may run at the same time. */
START_TEST(test_reads_snapshot_edge)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "writer", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "snap", .access.reads_snapshot = {f.pos}});
    assert_built_order(f.s, "writer,snap");
    keel_schedule *s2;
    ck_assert_ok(keel_schedule_create(f.rt, &s2));
    add(s2, (keel_system_desc){.name = "writer", .access.writes = {f.pos}});
    add(s2, (keel_system_desc){.name = "snap"});
    build_clean(s2);
    ck_assert_uint_eq(keel_schedule_hash(s2), keel_schedule_hash(f.s)); /* the same (empty) edge set */
    keel_schedule_destroy(s2);
    fx_close(&f);
}
END_TEST

START_TEST(test_event_edge)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "consumer", .access.events_consume = {"hit"}});
    add(f.s, (keel_system_desc){.name = "other", .access.events_consume = {"miss"}});
    add(f.s, (keel_system_desc){.name = "producer", .access.events_produce = {"hit"}});
    assert_built_order(f.s, "other,producer,consumer");
    fx_close(&f);
}
END_TEST

START_TEST(test_snapshot_not_versioned)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "ok", .access.reads_snapshot = {f.pos, f.tag}});
    add(f.s, (keel_system_desc){.name = "single", .access.reads_snapshot = {f.pos, f.hp}});
    add(f.s, (keel_system_desc){.name = "transient", .access.reads_snapshot = {f.scratch}});
    ck_assert_uint_eq(build_fails(f.s), 2);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, KEEL_SCHED_ERROR, "single", "hp", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "system 'single' reads_snapshot component 'hp', which is not VERSIONED");
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, KEEL_SCHED_ERROR, "transient", "scratch", NULL);
    fx_close(&f);
}
END_TEST

START_TEST(test_exclusive_conflict)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "solo", .access.exclusive = true});
    add_cb(f.s, "plain"); /* no access at all: still overlaps the exclusive one */
    ck_assert_uint_eq(build_fails(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_EXCLUSIVE_CONFLICT, KEEL_SCHED_ERROR, "solo", "plain", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "system 'solo' or 'plain' is exclusive, but the two are not ordered");
    fx_close(&f);
}
END_TEST

START_TEST(test_exclusive_ordered)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "after_solo", .after = {"solo"}});
    add(f.s, (keel_system_desc){.name = "solo", .access.exclusive = true});
    add(f.s, (keel_system_desc){.name = "before_solo", .before = {"solo"}});
    add(f.s, (keel_system_desc){.name = "late", .phase = 2});
    add(f.s, (keel_system_desc){.name = "solo2", .phase = 1, .access.exclusive = true, .after = {"after_solo"}});
    /* Phases order the exclusive systems against everything of their DAG:
     * solo -> late, solo -> solo2, solo2 -> late, after_solo -> solo2,
     * before_solo -> solo2; plus the explicit edges. Kahn (smallest index
     * first): before_solo, solo, after_solo, solo2, late. */
    assert_built_order(f.s, "before_solo,solo,after_solo,solo2,late");
    fx_close(&f);
}
END_TEST

START_TEST(test_unknown_track)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add(f.s, (keel_system_desc){.name = "a", .track = "Late"});
    add(f.s, (keel_system_desc){.name = "b", .track = "late"}); /* names are case-sensitive */
    ck_assert_uint_eq(build_fails(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_UNKNOWN_TRACK, KEEL_SCHED_ERROR, "b", "late", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "system 'b' names track 'late', which is not declared");
    fx_close(&f);
}
END_TEST

START_TEST(test_reserved_track)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "pre", .track = KEEL_TRACK_ENGINE_PRE});
    add(f.s, (keel_system_desc){.name = "pub", .track = KEEL_TRACK_PUBLIC}); /* explicit Public is fine */
    add(f.s, (keel_system_desc){.name = "post", .track = KEEL_TRACK_ENGINE_POST});
    add(f.s, (keel_system_desc){.name = "other", .track = "Engine-Other"}); /* reserved, not "unknown" */
    ck_assert_uint_eq(build_fails(f.s), 3);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_RESERVED_TRACK, KEEL_SCHED_ERROR, "pre", "Engine-Pre", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_RESERVED_TRACK, KEEL_SCHED_ERROR, "post", "Engine-Post", NULL);
    ck_assert_str_eq(diag_at(f.s, 1)->message,
                     "system 'post' is on track 'Engine-Post': Engine- tracks are reserved for the engine");
    assert_diag(diag_at(f.s, 2), KEEL_SCHED_RESERVED_TRACK, KEEL_SCHED_ERROR, "other", "Engine-Other", NULL);
    fx_close(&f);
}
END_TEST

START_TEST(test_bad_system)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "q_ok", .kind = KEEL_SYSTEM_QUERY, .each_chunk = chunk_body,
                                .query.with = {f.pos}, .access.reads = {f.pos}});
    add(f.s, (keel_system_desc){.name = "p_ok", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = pipe_body,
                                .pipeline_count = 4});
    keel_system_desc no_run = {.name = "no_run"};
    ck_assert_ok(keel_schedule_add_system(f.s, &no_run, NULL)); /* stored; reported at build */
    add(f.s, (keel_system_desc){.name = "no_chunk", .kind = KEEL_SYSTEM_QUERY, .run = tu_sys_noop, .query.with = {f.pos}});
    add(f.s, (keel_system_desc){.name = "no_pipe", .kind = KEEL_SYSTEM_PIPELINE, .run = tu_sys_noop});
    add(f.s, (keel_system_desc){.name = "no_terms", .kind = KEEL_SYSTEM_QUERY, .each_chunk = chunk_body});
    add(f.s, (keel_system_desc){.name = "bad_term", .kind = KEEL_SYSTEM_QUERY, .each_chunk = chunk_body,
                                .query.with = {f.pos, 99}});
    add(f.s, (keel_system_desc){.name = "bad_kind", .kind = (keel_system_kind)7, .run = tu_sys_noop});
    add(f.s, (keel_system_desc){.name = "bad_access", .access.reads = {f.pos}, .access.writes = {200},
                                .access.reads_snapshot = {1000}});
    ck_assert_uint_eq(build_fails(f.s), 8);
    ck_assert_uint_eq(count_code(f.s, KEEL_SCHED_BAD_SYSTEM), 8);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "no_run", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "system 'no_run' has no 'run' body for its kind");
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "no_chunk", NULL);
    assert_contains(diag_at(f.s, 1)->message, "'each_chunk'");
    assert_diag(diag_at(f.s, 2), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "no_pipe", NULL);
    assert_contains(diag_at(f.s, 2)->message, "'pipeline'");
    assert_diag(diag_at(f.s, 3), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "no_terms", NULL);
    assert_contains(diag_at(f.s, 3)->message, "bad query");
    assert_diag(diag_at(f.s, 4), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "bad_term", NULL);
    assert_contains(diag_at(f.s, 4)->message, "bad query");
    assert_diag(diag_at(f.s, 5), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "bad_kind", NULL);
    assert_contains(diag_at(f.s, 5)->message, "unknown kind 7");
    /* reads_snapshot is summarised before writes */
    assert_diag(diag_at(f.s, 6), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "bad_access", NULL);
    ck_assert_str_eq(diag_at(f.s, 6)->message,
                     "system 'bad_access': reads_snapshot[0] = 1000 is not a registered component");
    assert_diag(diag_at(f.s, 7), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "bad_access", NULL);
    ck_assert_str_eq(diag_at(f.s, 7)->message, "system 'bad_access': writes[0] = 200 is not a registered component");
    fx_close(&f);
}
END_TEST

START_TEST(test_read_before_write_warning)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "writer", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "reader", .access.reads = {f.pos}, .before = {"writer"}});
    ck_assert_ok(keel_schedule_build(f.s));
    ck_assert_uint_ne(keel_schedule_hash(f.s), 0);
    ck_assert_uint_eq(keel_schedule_diag_count(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_BEFORE_WRITE, KEEL_SCHED_WARNING, "reader", "writer", "pos", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message,
                     "system 'reader' reads 'pos' before 'writer' writes it: it sees the previous tick's value");
    ck_assert_str_eq(order_str(f.s), "reader,writer");
    /* a schedule with only warnings installs and runs */
    ck_assert_ok(keel_runtime_set_schedule(f.rt, f.s));
    ck_assert_ok(keel_runtime_step(f.rt));
    fx_close(&f);
}
END_TEST

/* A reader in a lower phase than the writer is phase-ordered before it: no
 * error, but the same warning. */
START_TEST(test_read_before_write_by_phase)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "writer", .phase = 1, .access.resources_write = {"gold"}});
    add(f.s, (keel_system_desc){.name = "reader", .phase = 0, .access.resources_read = {"gold"}});
    ck_assert_ok(keel_schedule_build(f.s));
    ck_assert_uint_eq(keel_schedule_diag_count(f.s), 1);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_BEFORE_WRITE, KEEL_SCHED_WARNING, "reader", "writer", "gold", NULL);
    ck_assert_str_eq(order_str(f.s), "reader,writer");
    fx_close(&f);
}
END_TEST

/* Two systems that each read what the other writes: whichever runs first
 * reads something before the other writes it. The top comment of
 * schedule.c: "a reader ordered before the writer gets the warning
 * READ_BEFORE_WRITE" -- for every such component, in either direction. */
START_TEST(test_read_before_write_both_directions)
{
    for (int dir = 0; dir < 2; dir++) {
        fx f = fx_new();
        /* x writes pos, reads vel; y reads pos, writes vel */
        add(f.s, (keel_system_desc){.name = "x", .access.writes = {f.pos}, .access.reads = {f.vel},
                                    .after = {dir ? "y" : NULL}});
        add(f.s, (keel_system_desc){.name = "y", .access.reads = {f.pos}, .access.writes = {f.vel},
                                    .after = {dir ? NULL : "x"}});
        ck_assert_ok(keel_schedule_build(f.s));
        ck_assert_str_eq(order_str(f.s), dir ? "y,x" : "x,y");
        ck_assert_msg(keel_schedule_diag_count(f.s) == 1,
                      "dir %d: %u diagnostics, expected one READ_BEFORE_WRITE", dir, keel_schedule_diag_count(f.s));
        if (dir == 0) /* x runs first and reads vel before y writes it */
            assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_BEFORE_WRITE, KEEL_SCHED_WARNING, "x", "y", "vel", NULL);
        else /* y runs first and reads pos before x writes it */
            assert_diag(diag_at(f.s, 0), KEEL_SCHED_READ_BEFORE_WRITE, KEEL_SCHED_WARNING, "y", "x", "pos", NULL);
        fx_close(&f);
    }
}
END_TEST

START_TEST(test_different_dags_conflict)
{
    fx f = fx_new();
    /* different DAGs of one track: phases do not order them */
    add(f.s, (keel_system_desc){.name = "a", .dag = "physics", .phase = 0, .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "b", .dag = "ai", .phase = 1, .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "c", .dag = "ai", .phase = 0, .access.reads = {f.vel}});
    add(f.s, (keel_system_desc){.name = "d", .dag = "physics", .phase = 1, .access.writes = {f.vel}});
    add(f.s, (keel_system_desc){.name = "e", .dag = "net", .access.exclusive = true, .after = {"a", "b", "c", "d"}});
    ck_assert_uint_eq(build_fails(f.s), 2);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_WRITE_CONFLICT, KEEL_SCHED_ERROR, "a", "b", "pos", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_READ_CONFLICT, KEEL_SCHED_ERROR, "c", "d", "vel", NULL);
    fx_close(&f);
}
END_TEST

START_TEST(test_different_dags_ordered)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .dag = "physics", .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "b", .dag = "ai", .access.writes = {f.pos}, .before = {"a"}});
    /* reads_fresh derives its edge across DAGs of one track too */
    add(f.s, (keel_system_desc){.name = "c", .dag = "ui", .access.reads_fresh = {f.pos}});
    assert_built_order(f.s, "b,a,c");
    fx_close(&f);
}
END_TEST

START_TEST(test_different_tracks_never_conflict)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add(f.s, (keel_system_desc){.name = "late_w", .track = "Late", .access.writes = {f.pos}, .access.exclusive = true});
    add(f.s, (keel_system_desc){.name = "pub_w", .access.writes = {f.pos}, .access.reads = {f.vel}});
    add(f.s, (keel_system_desc){.name = "late_r", .track = "Late", .access.writes = {f.vel},
                                .access.reads_fresh = {f.hp}, .after = {"late_w"}});
    /* reads_fresh of a later track's writer: no cross-track edge (and no cycle) */
    add(f.s, (keel_system_desc){.name = "pub_fresh", .access.reads_fresh = {f.vel}, .access.writes = {f.hp}});
    assert_built_order(f.s, "pub_w,pub_fresh,late_w,late_r");
    fx_close(&f);
}
END_TEST

START_TEST(test_edge_against_track_order)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add(f.s, (keel_system_desc){.name = "pub"});
    add(f.s, (keel_system_desc){.name = "late", .track = "Late", .before = {"pub"}});
    add(f.s, (keel_system_desc){.name = "pub2", .after = {"late"}});
    ck_assert_uint_eq(build_fails(f.s), 2);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "late", "pub", NULL);
    ck_assert_str_eq(diag_at(f.s, 0)->message, "'late' must run before 'pub', but its track 'Late' runs after track 'Public'");
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "late", "pub2", NULL);
    fx_close(&f);
}
END_TEST

/* An explicit edge that agrees with track order is fine (and redundant). */
START_TEST(test_edge_with_track_order)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add(f.s, (keel_system_desc){.name = "late", .track = "Late", .after = {"pub"}});
    add(f.s, (keel_system_desc){.name = "pub", .before = {"late"}});
    assert_built_order(f.s, "pub,late");
    fx_close(&f);
}
END_TEST

static void declare_many_errors(keel_schedule *s, const fx *f)
{
    add(s, (keel_system_desc){.name = "w1", .access.writes = {f->pos}, .access.reads_snapshot = {f->hp}});
    add(s, (keel_system_desc){.name = "w2", .access.writes = {f->pos}, .after = {"nobody"}});
    add(s, (keel_system_desc){.name = "w1"});
    add(s, (keel_system_desc){.name = "t", .track = "Nowhere", .kind = KEEL_SYSTEM_PIPELINE});
    add(s, (keel_system_desc){.name = "r", .access.reads = {f->pos}, .access.exclusive = true, .after = {"w1"}});
}

START_TEST(test_many_errors_in_one_build)
{
    fx f = fx_new();
    declare_many_errors(f.s, &f);
    /* step 1: duplicates; then per system: track, body, access; step 2:
     * explicit edges; step 4: ordering needs, in pair order. "r after w1"
     * resolves to the first w1. */
    ck_assert_uint_eq(build_fails(f.s), 10);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_DUPLICATE_SYSTEM, KEEL_SCHED_ERROR, "w1", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, KEEL_SCHED_ERROR, "w1", "hp", NULL);
    assert_diag(diag_at(f.s, 2), KEEL_SCHED_UNKNOWN_TRACK, KEEL_SCHED_ERROR, "t", "Nowhere", NULL);
    assert_diag(diag_at(f.s, 3), KEEL_SCHED_BAD_SYSTEM, KEEL_SCHED_ERROR, "t", NULL);
    assert_diag(diag_at(f.s, 4), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, "w2", "nobody", NULL);
    /* pairs: (w1,w2) write pos; (w1,r) ordered by "after"; (w2,r) read pos
     * + exclusive; (second w1,r) and (t,r) exclusive */
    assert_diag(diag_at(f.s, 5), KEEL_SCHED_WRITE_CONFLICT, KEEL_SCHED_ERROR, "w1", "w2", "pos", NULL);
    assert_diag(diag_at(f.s, 6), KEEL_SCHED_READ_CONFLICT, KEEL_SCHED_ERROR, "w2", "r", "pos", NULL);
    assert_diag(diag_at(f.s, 7), KEEL_SCHED_EXCLUSIVE_CONFLICT, KEEL_SCHED_ERROR, "w2", "r", NULL);
    assert_diag(diag_at(f.s, 8), KEEL_SCHED_EXCLUSIVE_CONFLICT, KEEL_SCHED_ERROR, "w1", "r", NULL);
    /* t's unknown track leaves it on Public, where it overlaps exclusive r */
    assert_diag(diag_at(f.s, 9), KEEL_SCHED_EXCLUSIVE_CONFLICT, KEEL_SCHED_ERROR, "t", "r", NULL);
    assert_contains(keel_last_error(), "SCHED_DUPLICATE_SYSTEM");
    assert_contains(keel_last_error(), "(10 diagnostics)");
    fx_close(&f);
}
END_TEST

START_TEST(test_diagnostics_deterministic)
{
    fx f1, f2;
    fx_open(&f1);
    fx_open(&f2);
    declare_many_errors(f1.s, &f1);
    declare_many_errors(f2.s, &f2);
    uint32_t n = build_fails(f1.s);
    ck_assert_uint_eq(build_fails(f2.s), n);
    for (uint32_t i = 0; i < n; i++) {
        const keel_sched_diag *a = diag_at(f1.s, i), *b = diag_at(f2.s, i);
        ck_assert_int_eq(a->code, b->code);
        ck_assert_int_eq(a->severity, b->severity);
        ck_assert_str_eq(a->message, b->message);
        ck_assert_uint_eq(a->name_count, b->name_count);
        for (uint32_t k = 0; k < a->name_count; k++)
            ck_assert_str_eq(a->names[k], b->names[k]);
    }
    fx_close(&f1);
    fx_close(&f2);
}
END_TEST

/* More diagnostics than fit the first allocation; names stay valid. */
START_TEST(test_many_diagnostics)
{
    fx f = fx_new();
    char name[32], target[32];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "s%02d", i);
        snprintf(target, sizeof target, "ghost%02d", i);
        add(f.s, (keel_system_desc){.name = name, .after = {target}});
    }
    ck_assert_uint_eq(build_fails(f.s), 40);
    for (uint32_t i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "s%02u", i);
        snprintf(target, sizeof target, "ghost%02u", i);
        assert_diag(diag_at(f.s, i), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, name, target, NULL);
    }
    fx_close(&f);
}
END_TEST

static Suite *sched_rules_suite(void)
{
    const TTest *const t[] = {test_unknown_system, test_duplicate_system, test_write_conflict_component,
                              test_write_conflict_resource, test_read_conflict, test_readers_do_not_conflict,
                              test_no_conflict_when_ordered, test_phase_orders_conflicts, test_phase_no_barrier,
                              test_reads_fresh_edge, test_reads_snapshot_edge, test_event_edge,
                              test_snapshot_not_versioned, test_exclusive_conflict, test_exclusive_ordered,
                              test_unknown_track, test_reserved_track, test_bad_system, test_read_before_write_warning,
                              test_read_before_write_by_phase, test_read_before_write_both_directions,
                              test_different_dags_conflict, test_different_dags_ordered,
                              test_different_tracks_never_conflict, test_edge_against_track_order,
                              test_edge_with_track_order, test_many_errors_in_one_build, test_diagnostics_deterministic,
                              test_many_diagnostics};
    return tu_case_suite("sched_rules", "rules", t, sizeof t / sizeof t[0]);
}

/* ======================================================================
 * sched_cycle
 *
 * report_cycle (schedule.c): after Kahn, start from the lowest-index system
 * left unordered (on a cycle or behind one), repeatedly step to its
 * lowest-index unordered predecessor until a system repeats; report that
 * loop forwards, starting at its lowest registration index, first name
 * repeated last. Only one CYCLE diagnostic per build.
 * ====================================================================== */

/* Build, expect exactly one CYCLE diagnostic (the only one) with this text. */
static const keel_sched_diag *expect_only_cycle(keel_schedule *s, const char *message)
{
    ck_assert_uint_eq(build_fails(s), 1);
    const keel_sched_diag *d = diag_at(s, 0);
    ck_assert_int_eq(d->code, KEEL_SCHED_CYCLE);
    ck_assert_int_eq(d->severity, KEEL_SCHED_ERROR);
    ck_assert_str_eq(d->message, message);
    assert_contains(keel_last_error(), "SCHED_CYCLE");
    assert_contains(keel_last_error(), message);
    return d;
}

/* expect_only_cycle, and the cycle's systems are the names given, in order
 * from where it is reported back to that system. */
#define assert_only_cycle(s, message, ...) \
    assert_diag(expect_only_cycle((s), (message)), KEEL_SCHED_CYCLE, KEEL_SCHED_ERROR, __VA_ARGS__, (const char *)NULL)

START_TEST(test_cycle_self_edge)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .after = {"a"}});
    add_cb(f.s, "free");
    assert_only_cycle(f.s, "cycle: a -> a", "a", "a");
    fx_close(&f);

    fx_open(&f);
    add_cb(f.s, "free");
    add(f.s, (keel_system_desc){.name = "b", .before = {"b"}});
    assert_only_cycle(f.s, "cycle: b -> b", "b", "b");
    fx_close(&f);
}
END_TEST

START_TEST(test_cycle_two)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .after = {"b"}});
    add(f.s, (keel_system_desc){.name = "b", .after = {"a"}});
    assert_only_cycle(f.s, "cycle: a -> b -> a", "a", "b", "a");
    fx_close(&f);
}
END_TEST

START_TEST(test_cycle_three)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "A", .after = {"C"}});
    add(f.s, (keel_system_desc){.name = "B", .after = {"A"}});
    add(f.s, (keel_system_desc){.name = "C", .after = {"B"}});
    assert_only_cycle(f.s, "cycle: A -> B -> C -> A", "A", "B", "C", "A");
    fx_close(&f);
}
END_TEST

/* Same cycle A -> B -> C -> A, registered C, A, B: it is reported from C,
 * the lowest registration index, still forwards. */
START_TEST(test_cycle_starts_at_lowest_index)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "C", .before = {"A"}});
    add(f.s, (keel_system_desc){.name = "A", .before = {"B"}});
    add(f.s, (keel_system_desc){.name = "B", .before = {"C"}});
    add(f.s, (keel_system_desc){.name = "Z", .before = {"A"}}); /* feeds the cycle, not on it */
    assert_only_cycle(f.s, "cycle: C -> A -> B -> C", "C", "A", "B", "C");
    fx_close(&f);
}
END_TEST

/* A system behind a cycle is unordered too, but not part of the report. */
START_TEST(test_cycle_excludes_downstream)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "down", .after = {"c2"}});
    add(f.s, (keel_system_desc){.name = "c1", .after = {"c2"}});
    add(f.s, (keel_system_desc){.name = "c2", .after = {"c1"}});
    /* start at "down" (index 0), step back to c2, then c1, then c2 again:
     * the loop {c2, c1}, reported from c1 (index 1) */
    assert_only_cycle(f.s, "cycle: c1 -> c2 -> c1", "c1", "c2", "c1");
    fx_close(&f);
}
END_TEST

START_TEST(test_cycle_plus_chain)
{
    fx f = fx_new();
    add_cb(f.s, "x");
    add(f.s, (keel_system_desc){.name = "y", .after = {"x"}});
    add(f.s, (keel_system_desc){.name = "p", .after = {"q"}});
    add(f.s, (keel_system_desc){.name = "q", .after = {"p"}});
    add(f.s, (keel_system_desc){.name = "z", .after = {"y"}});
    assert_only_cycle(f.s, "cycle: p -> q -> p", "p", "q", "p");
    fx_close(&f);
}
END_TEST

/* Two disjoint cycles, p <-> q (indices 1, 2) and r <-> t (3, 4), and s (0)
 * behind r. The walk starts at s, the lowest unordered index, and so finds
 * r <-> t -- not the cycle with the lowest indices. Without s it is p <-> q. */
START_TEST(test_cycle_choice_deterministic)
{
    for (int with_s = 1; with_s >= 0; with_s--) {
        for (int round = 0; round < 2; round++) { /* twice: same answer */
            fx f = fx_new();
            if (with_s)
                add(f.s, (keel_system_desc){.name = "s", .after = {"r"}});
            add(f.s, (keel_system_desc){.name = "p", .after = {"q"}});
            add(f.s, (keel_system_desc){.name = "q", .after = {"p"}});
            add(f.s, (keel_system_desc){.name = "r", .after = {"t"}});
            add(f.s, (keel_system_desc){.name = "t", .after = {"r"}});
            if (with_s)
                assert_only_cycle(f.s, "cycle: r -> t -> r", "r", "t", "r");
            else
                assert_only_cycle(f.s, "cycle: p -> q -> p", "p", "q", "p");
            fx_close(&f);
        }
    }
}
END_TEST

/* Derived edges take part: an explicit edge against a phase edge. */
START_TEST(test_cycle_with_phase_edge)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "w_hi", .phase = 1, .access.writes = {f.pos}, .before = {"w_lo"}});
    add(f.s, (keel_system_desc){.name = "w_lo", .phase = 0, .access.writes = {f.pos}});
    assert_only_cycle(f.s, "cycle: w_hi -> w_lo -> w_hi", "w_hi", "w_lo", "w_hi");
    fx_close(&f);
}
END_TEST

/* Cycles made only of access-derived edges. */
START_TEST(test_cycle_from_access)
{
    fx f = fx_new();
    /* a -> b (b reads_fresh pos), b -> a (a reads_fresh vel) */
    add(f.s, (keel_system_desc){.name = "a", .access.writes = {f.pos}, .access.reads_fresh = {f.vel}});
    add(f.s, (keel_system_desc){.name = "b", .access.writes = {f.vel}, .access.reads_fresh = {f.pos}});
    assert_only_cycle(f.s, "cycle: a -> b -> a", "a", "b", "a");
    fx_close(&f);

    fx_open(&f);
    /* events: e1 -> e2 (ping), e2 -> e3 (pong); fresh read: e3's write of vel before e1 */
    add(f.s, (keel_system_desc){.name = "e1", .access.events_produce = {"ping"}, .access.reads_fresh = {f.vel}});
    add(f.s, (keel_system_desc){.name = "e2", .access.events_consume = {"ping"}, .access.events_produce = {"pong"}});
    add(f.s, (keel_system_desc){.name = "e3", .access.events_consume = {"pong"}, .access.writes = {f.vel}});
    assert_only_cycle(f.s, "cycle: e1 -> e2 -> e3 -> e1", "e1", "e2", "e3", "e1");
    fx_close(&f);
}
END_TEST

/* Errors of the earlier steps are reported along with the cycle. */
START_TEST(test_cycle_with_other_errors)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "a", .after = {"b", "ghost"}});
    add(f.s, (keel_system_desc){.name = "b", .after = {"a"}, .access.reads_snapshot = {f.scratch}});
    ck_assert_uint_eq(build_fails(f.s), 3);
    assert_diag(diag_at(f.s, 0), KEEL_SCHED_SNAPSHOT_NOT_VERSIONED, KEEL_SCHED_ERROR, "b", "scratch", NULL);
    assert_diag(diag_at(f.s, 1), KEEL_SCHED_UNKNOWN_SYSTEM, KEEL_SCHED_ERROR, "a", "ghost", NULL);
    assert_diag(diag_at(f.s, 2), KEEL_SCHED_CYCLE, KEEL_SCHED_ERROR, "a", "b", "a", NULL);
    ck_assert_str_eq(diag_at(f.s, 2)->message, "cycle: a -> b -> a");
    assert_contains(keel_last_error(), "SCHED_SNAPSHOT_NOT_VERSIONED");
    fx_close(&f);
}
END_TEST

/* A cycle longer than KEEL_SCHED_DIAG_NAMES: names are cut at 8, the
 * message holds the whole cycle. */
START_TEST(test_cycle_long)
{
    fx f = fx_new();
    char name[8], prev[8];
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "c%d", i);
        snprintf(prev, sizeof prev, "c%d", (i + 9) % 10);
        add(f.s, (keel_system_desc){.name = name, .after = {prev}});
    }
    const keel_sched_diag *d =
        expect_only_cycle(f.s, "cycle: c0 -> c1 -> c2 -> c3 -> c4 -> c5 -> c6 -> c7 -> c8 -> c9 -> c0");
    ck_assert_uint_eq(d->name_count, KEEL_SCHED_DIAG_NAMES);
    for (uint32_t i = 0; i < KEEL_SCHED_DIAG_NAMES; i++) {
        snprintf(name, sizeof name, "c%u", i);
        ck_assert_str_eq(d->names[i], name);
    }
    fx_close(&f);
}
END_TEST

/* 300 systems on one cycle, registered backwards: a long walk, a message
 * cut to its buffer, names cut at 8; no crash, deterministic. */
START_TEST(test_cycle_huge)
{
    fx f = fx_new();
    char name[16], prev[16];
    for (int k = 0; k < 300; k++) {
        int i = 299 - k; /* cycle position */
        snprintf(name, sizeof name, "c%03d", i);
        snprintf(prev, sizeof prev, "c%03d", (i + 299) % 300);
        add(f.s, (keel_system_desc){.name = name, .after = {prev}});
    }
    ck_assert_uint_eq(build_fails(f.s), 1);
    const keel_sched_diag *d = diag_at(f.s, 0);
    assert_diag(d, KEEL_SCHED_CYCLE, KEEL_SCHED_ERROR, "c299", "c000", "c001", "c002", "c003", "c004", "c005", "c006",
                NULL);
    ck_assert_int_eq(strncmp(d->message, "cycle: c299 -> c000 -> c001 -> ", 31), 0);
    ck_assert_uint_lt(strlen(d->message), 512);
    fx_close(&f);
}
END_TEST

static Suite *sched_cycle_suite(void)
{
    const TTest *const t[] = {test_cycle_self_edge, test_cycle_two, test_cycle_three, test_cycle_starts_at_lowest_index,
                              test_cycle_excludes_downstream, test_cycle_plus_chain, test_cycle_choice_deterministic,
                              test_cycle_with_phase_edge, test_cycle_from_access, test_cycle_with_other_errors,
                              test_cycle_long, test_cycle_huge};
    return tu_case_suite("sched_cycle", "cycle", t, sizeof t / sizeof t[0]);
}

/* ======================================================================
 * sched_order
 * ====================================================================== */

START_TEST(test_order_independent_registration)
{
    fx f = fx_new();
    /* names deliberately not sorted: order is registration order */
    add_cb(f.s, "zeta");
    add_cb(f.s, "alpha");
    add_cb(f.s, "mid");
    add(f.s, (keel_system_desc){.name = "query", .kind = KEEL_SYSTEM_QUERY, .each_chunk = chunk_body,
                                .query.with = {f.pos}});
    add(f.s, (keel_system_desc){.name = "pipe", .kind = KEEL_SYSTEM_PIPELINE, .pipeline = pipe_body, .pipeline_count = 3});
    assert_built_order(f.s, "zeta,alpha,mid,query,pipe");
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_uint_eq(keel_schedule_order(f.s, i), i);
    ck_assert_uint_eq(keel_schedule_order(f.s, 5), UINT32_MAX);
    fx_close(&f);
}
END_TEST

/* Diamond A -> {B, C} -> D. Registered A, B, C, D: A, B, C, D. Registered
 * D, C, B, A (indices 0..3): A is the only root; popping it readies C (1)
 * and B (2); C has the smaller index; D waits for B. So A, C, B, D. */
START_TEST(test_order_diamond)
{
    fx f = fx_new();
    add_cb(f.s, "A");
    add(f.s, (keel_system_desc){.name = "B", .after = {"A"}});
    add(f.s, (keel_system_desc){.name = "C", .after = {"A"}});
    add(f.s, (keel_system_desc){.name = "D", .after = {"B", "C"}});
    assert_built_order(f.s, "A,B,C,D");
    uint64_t h1 = keel_schedule_hash(f.s);
    fx_close(&f);

    fx_open(&f);
    add(f.s, (keel_system_desc){.name = "D", .after = {"B", "C"}});
    add(f.s, (keel_system_desc){.name = "C", .after = {"A"}});
    add(f.s, (keel_system_desc){.name = "B", .after = {"A"}});
    add_cb(f.s, "A");
    assert_built_order(f.s, "A,C,B,D");
    ck_assert_uint_eq(keel_schedule_order(f.s, 0), 3);
    ck_assert_uint_eq(keel_schedule_order(f.s, 1), 1);
    ck_assert_uint_eq(keel_schedule_order(f.s, 2), 2);
    ck_assert_uint_eq(keel_schedule_order(f.s, 3), 0);
    ck_assert_uint_ne(keel_schedule_hash(f.s), h1); /* a different order hashes differently */
    fx_close(&f);
}
END_TEST

/* The ready set is a min-heap, not a FIFO: a system readied late but with a
 * smaller index overtakes one that was ready earlier. x (0) waits for y (1);
 * z (2) is ready from the start: y, then x (0 < 2), then z. */
START_TEST(test_order_min_index_not_fifo)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "x", .after = {"y"}});
    add_cb(f.s, "y");
    add_cb(f.s, "z");
    assert_built_order(f.s, "y,x,z");
    fx_close(&f);
}
END_TEST

/* "a after b" and "b before a" are the same edge. */
START_TEST(test_order_after_equals_before)
{
    fx f1, f2;
    fx_open(&f1);
    fx_open(&f2);
    add(f1.s, (keel_system_desc){.name = "a", .after = {"b"}});
    add_cb(f1.s, "b");
    add_cb(f2.s, "a");
    add(f2.s, (keel_system_desc){.name = "b", .before = {"a"}});
    build_clean(f1.s);
    build_clean(f2.s);
    ck_assert_str_eq(order_str(f1.s), "b,a");
    ck_assert_str_eq(order_str(f2.s), "b,a");
    ck_assert_uint_eq(keel_schedule_hash(f1.s), keel_schedule_hash(f2.s));
    fx_close(&f1);
    fx_close(&f2);
}
END_TEST

START_TEST(test_order_tracks)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "U2"));
    ck_assert_ok(keel_schedule_add_track(f.s, "U1"));
    add(f.s, (keel_system_desc){.name = "u1a", .track = "U1"});
    add(f.s, (keel_system_desc){.name = "u2a", .track = "U2"});
    add(f.s, (keel_system_desc){.name = "pub"});
    add(f.s, (keel_system_desc){.name = "u1b", .track = "U1", .before = {"u1a"}});
    add(f.s, (keel_system_desc){.name = "u2b", .track = "U2"});
    add(f.s, (keel_system_desc){.name = "pub2", .track = KEEL_TRACK_PUBLIC});
    build_clean(f.s);
    /* Public, then user tracks in declaration order (U2 before U1) */
    ck_assert_str_eq(order_str(f.s), "pub,pub2,u2a,u2b,u1b,u1a");
    fx_close(&f);
}
END_TEST

/* Nothing of the application runs in the engine tracks: a system declared
 * on Engine-Pre or Engine-Post fails the build. */
START_TEST(test_order_engine_tracks_refused)
{
    const char *tracks[] = {KEEL_TRACK_ENGINE_PRE, KEEL_TRACK_ENGINE_POST};
    for (int i = 0; i < 2; i++) {
        fx f = fx_new();
        add_cb(f.s, "pub");
        add(f.s, (keel_system_desc){.name = "engine", .track = tracks[i]});
        ck_assert_uint_eq(build_fails(f.s), 1);
        assert_diag(diag_at(f.s, 0), KEEL_SCHED_RESERVED_TRACK, KEEL_SCHED_ERROR, "engine", tracks[i], NULL);
        fx_close(&f);
    }
}
END_TEST

/* One small schedule, declared with one change at a time. */
typedef enum variant {
    V_BASE,
    V_BODY,       /* other bodies, user pointers, DAG name: not part of the plan */
    V_EDGE,       /* one explicit edge less */
    V_NAME,       /* one system renamed */
    V_PHASE,      /* writer phases swapped: the derived edge flips */
    V_TRACK_EDGE, /* an extra explicit edge that track order implies anyway */
} variant;

static int other_body(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 1;
}

static int user_token;

static void declare_variant(fx *f, variant v)
{
    ck_assert_ok(keel_schedule_add_track(f->s, "Late"));
    add(f->s, (keel_system_desc){.name = "input", .run = v == V_BODY ? other_body : tu_sys_noop,
                                 .user = v == V_BODY ? &user_token : NULL});
    add(f->s, (keel_system_desc){.name = v == V_NAME ? "movement" : "move", .after = {v == V_EDGE ? NULL : "input"},
                                 .phase = v == V_PHASE ? 1 : 0, .access.writes = {f->pos},
                                 .dag = v == V_BODY ? "main" : NULL});
    add(f->s, (keel_system_desc){.name = "collide", .phase = v == V_PHASE ? 0 : 1, .access.writes = {f->pos}});
    add(f->s, (keel_system_desc){.name = "render", .track = "Late", .access.reads = {f->pos},
                                 .after = {v == V_TRACK_EDGE ? "collide" : NULL}});
}

static uint64_t variant_hash(variant v, const char *expect_order)
{
    fx f = fx_new();
    declare_variant(&f, v);
    build_clean(f.s);
    ck_assert_str_eq(order_str(f.s), expect_order);
    uint64_t h = keel_schedule_hash(f.s);
    fx_close(&f);
    return h;
}

START_TEST(test_hash_identical_registrations)
{
    /* two runtimes, identical registrations: identical hash */
    uint64_t a = variant_hash(V_BASE, "input,move,collide,render");
    uint64_t b = variant_hash(V_BASE, "input,move,collide,render");
    ck_assert_uint_eq(a, b);
    ck_assert_uint_ne(a, EMPTY_SCHEDULE_HASH);
    /* bodies, user data and an explicit default DAG name are not in the plan */
    ck_assert_uint_eq(variant_hash(V_BODY, "input,move,collide,render"), a);
    /* an edge implied by track order adds no edge to the plan */
    ck_assert_uint_eq(variant_hash(V_TRACK_EDGE, "input,move,collide,render"), a);
}
END_TEST

START_TEST(test_hash_changes)
{
    uint64_t base = variant_hash(V_BASE, "input,move,collide,render");
    /* same order, one edge less */
    uint64_t edge = variant_hash(V_EDGE, "input,move,collide,render");
    /* same edges, one name changed */
    uint64_t name = variant_hash(V_NAME, "input,movement,collide,render");
    /* phase-derived edge reversed: collide -> move */
    uint64_t phase = variant_hash(V_PHASE, "input,collide,move,render");
    ck_assert_uint_ne(edge, base);
    ck_assert_uint_ne(name, base);
    ck_assert_uint_ne(phase, base);
    ck_assert_uint_ne(edge, name);
    ck_assert_uint_ne(edge, phase);
    ck_assert_uint_ne(name, phase);
}
END_TEST

/* Known answer. Plan: Public = a, b, c, e; Late = d. Edges a->b, a->c
 * (explicit), c->e (both write pos, phases 0 and 1 of DAG main). Kahn order:
 * a, b, c, e | d, so a's successors are at positions 1, 2 and c's at 3.
 * FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3) over
 *   b"Engine-Pre\0" b"Public\0"
 *   b"a\0" u32le(1) u32le(2) ff ff ff ff   b"b\0" ff ff ff ff
 *   b"c\0" u32le(3) ff ff ff ff           b"e\0" ff ff ff ff
 *   b"Late\0" b"d\0" ff ff ff ff   b"Engine-Post\0"
 * computed with Python:
 *   import struct
 *   h = 0xcbf29ce484222325
 *   for x in data: h = ((h ^ x) * 0x100000001b3) % 2**64
 * = 0x214c015bb803edba. */
START_TEST(test_hash_known_answer)
{
    fx f = fx_new();
    ck_assert_ok(keel_schedule_add_track(f.s, "Late"));
    add_cb(f.s, "a");
    add(f.s, (keel_system_desc){.name = "b", .after = {"a"}});
    add(f.s, (keel_system_desc){.name = "c", .after = {"a"}, .phase = 0, .access.writes = {f.pos}});
    add(f.s, (keel_system_desc){.name = "d", .track = "Late"});
    add(f.s, (keel_system_desc){.name = "e", .phase = 1, .access.writes = {f.pos}});
    assert_built_order(f.s, "a,b,c,e,d");
    ck_assert_uint_eq(keel_schedule_hash(f.s), 0x214c015bb803edbaull);
    fx_close(&f);
}
END_TEST

static Suite *sched_order_suite(void)
{
    const TTest *const t[] = {test_order_independent_registration, test_order_diamond, test_order_min_index_not_fifo,
                              test_order_after_equals_before, test_order_tracks, test_order_engine_tracks_refused,
                              test_hash_identical_registrations, test_hash_changes, test_hash_known_answer};
    return tu_case_suite("sched_order", "order", t, sizeof t / sizeof t[0]);
}

/* ======================================================================
 * sched_edge_cases
 * ====================================================================== */

/* Plan of one system "only" on Public: see test_hash_known_answer for the
 * encoding; Python over b"Engine-Pre\0Public\0only\0\xff\xff\xff\xffEngine-Post\0". */
#define ONE_SYSTEM_HASH 0xf1aab4c566d3abc7ull
/* s000 -> s001 -> ... -> s299 on Public: system i's successor is at
 * position i + 1 (u32le; positions >= 256 exercise the second byte). */
#define CHAIN300_HASH 0x86e52e492a18b99full
/* i000 ... i299 on Public, no edges. */
#define INDEP300_HASH 0xdee08489bf89281bull

START_TEST(test_one_system)
{
    fx f = fx_new();
    int runs = 0;
    add(f.s, (keel_system_desc){.name = "only", .run = count_body, .user = &runs});
    build_clean(f.s);
    ck_assert_uint_eq(keel_schedule_system_count(f.s), 1);
    ck_assert_uint_eq(keel_schedule_order(f.s, 0), 0);
    ck_assert_uint_eq(keel_schedule_order(f.s, 1), UINT32_MAX);
    ck_assert_uint_eq(keel_schedule_hash(f.s), ONE_SYSTEM_HASH);
    ck_assert_ok(keel_runtime_set_schedule(f.rt, f.s));
    ck_assert_ok(keel_runtime_step(f.rt));
    ck_assert_ok(keel_runtime_step(f.rt));
    ck_assert_int_eq(runs, 2);
    fx_close(&f);
}
END_TEST

static void chain_name(char *buf, size_t n, const char *prefix, int i)
{
    snprintf(buf, n, "%s%03d", prefix, i);
}

START_TEST(test_chain_300)
{
    for (int reversed = 0; reversed < 2; reversed++) {
        fx f = fx_new();
        char name[16], prev[16];
        for (int k = 0; k < 300; k++) {
            int i = reversed ? 299 - k : k; /* chain position of the k-th registration */
            chain_name(name, sizeof name, "s", i);
            chain_name(prev, sizeof prev, "s", i - 1);
            add(f.s, (keel_system_desc){.name = name, .after = {i ? prev : NULL}});
        }
        build_clean(f.s);
        ck_assert_uint_eq(keel_schedule_system_count(f.s), 300);
        assert_permutation(f.s);
        for (uint32_t pos = 0; pos < 300; pos++) {
            keel_system sys = keel_schedule_order(f.s, pos);
            ck_assert_uint_eq(sys, reversed ? 299 - pos : pos);
            chain_name(name, sizeof name, "s", (int)pos);
            ck_assert_str_eq(keel_schedule_system_name(f.s, sys), name);
        }
        /* the plan (names in order + edges) is the same either way */
        ck_assert_uint_eq(keel_schedule_hash(f.s), CHAIN300_HASH);
        fx_close(&f);
    }
}
END_TEST

START_TEST(test_independent_300)
{
    fx f = fx_new();
    char name[16];
    for (int i = 0; i < 300; i++) {
        chain_name(name, sizeof name, "i", i);
        ck_assert_uint_eq(add_cb(f.s, name), (keel_system)i);
    }
    build_clean(f.s);
    for (uint32_t pos = 0; pos < 300; pos++)
        ck_assert_uint_eq(keel_schedule_order(f.s, pos), pos);
    ck_assert_uint_eq(keel_schedule_hash(f.s), INDEP300_HASH);
    fx_close(&f);
}
END_TEST

/* ---- random access ------------------------------------------------------------ */

#define RND_COMPS 16
#define RND_RES 8

typedef struct rnd_sys {
    uint32_t phase;
    uint32_t rd, wr, rrd, rwr; /* component / resource masks */
} rnd_sys;

static keel_runtime *rnd_runtime(keel_component *ids)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    char name[16];
    for (int c = 0; c < RND_COMPS; c++) {
        snprintf(name, sizeof name, "c%02d", c);
        ids[c] = tu_reg(keel_runtime_world(rt), name, 4, KEEL_VERSIONED, u32_fields, 1);
    }
    return rt;
}

static const char *const res_names[RND_RES] = {"res0", "res1", "res2", "res3", "res4", "res5", "res6", "res7"};

/* n systems "sys000"... in one DAG with distinct phases (a seeded
 * permutation) and random reads / writes / side_writes / resource access:
 * every conflicting pair is phase-ordered, so the build must succeed. */
static keel_schedule *build_phased_random(keel_runtime *rt, const keel_component *ids, uint64_t seed, uint32_t n,
                                          rnd_sys *out)
{
    keel_schedule *s = NULL;
    ck_assert_ok(keel_schedule_create(rt, &s));
    uint32_t *perm = malloc(n * sizeof *perm);
    ck_assert_ptr_nonnull(perm);
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = tu_rng_below(&seed, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint32_t i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "sys%03u", i);
        keel_system_desc d = {.name = name, .run = tu_sys_noop, .phase = perm[i]};
        rnd_sys r = {.phase = perm[i]};
        uint32_t nr = tu_rng_below(&seed, 4), nw = tu_rng_below(&seed, 3);
        for (uint32_t k = 0; k < nr; k++) {
            uint32_t c = tu_rng_below(&seed, RND_COMPS);
            d.access.reads[k] = ids[c];
            r.rd |= 1u << c;
        }
        for (uint32_t k = 0; k < nw; k++) {
            uint32_t c = tu_rng_below(&seed, RND_COMPS);
            d.access.writes[k] = ids[c];
            r.wr |= 1u << c;
        }
        if (tu_rng_below(&seed, 4) == 0) {
            uint32_t c = tu_rng_below(&seed, RND_COMPS);
            d.access.side_writes[0] = ids[c];
            r.wr |= 1u << c;
        }
        if (tu_rng_below(&seed, 3) == 0) {
            uint32_t x = tu_rng_below(&seed, RND_RES);
            d.access.resources_read[0] = res_names[x];
            r.rrd |= 1u << x;
        }
        if (tu_rng_below(&seed, 5) == 0) {
            uint32_t x = tu_rng_below(&seed, RND_RES);
            d.access.resources_write[0] = res_names[x];
            r.rwr |= 1u << x;
        }
        ck_assert_ok(keel_schedule_add_system(s, &d, NULL));
        out[i] = r;
    }
    free(perm);
    ck_assert_ok(keel_schedule_build(s));
    return s;
}

static bool rnd_conflict(const rnd_sys *a, const rnd_sys *b)
{
    return (a->wr & (b->wr | b->rd)) || (b->wr & a->rd) || (a->rwr & (b->rwr | b->rrd)) || (b->rwr & a->rrd);
}

/* Does system r read key (component c.. or resource) and w write it? */
static bool rnd_reads_writes(const rnd_sys *r, const rnd_sys *w, const char *key)
{
    if (key[0] == 'c') {
        uint32_t bit = 1u << atoi(key + 1);
        return (r->rd & bit) && !(r->wr & bit) && (w->wr & bit);
    }
    ck_assert_int_eq(strncmp(key, "res", 3), 0);
    uint32_t bit = 1u << atoi(key + 3);
    return (r->rrd & bit) && !(r->rwr & bit) && (w->rwr & bit);
}

START_TEST(test_random_phased_access)
{
    enum { N = 288 };
    keel_component ids1[RND_COMPS], ids2[RND_COMPS];
    keel_runtime *rt1 = rnd_runtime(ids1), *rt2 = rnd_runtime(ids2);
    rnd_sys *sys = calloc(N, sizeof *sys), *sys2 = calloc(N, sizeof *sys2);
    ck_assert_ptr_nonnull(sys);
    ck_assert_ptr_nonnull(sys2);
    keel_schedule *s1 = build_phased_random(rt1, ids1, 0x5eed1234u, N, sys);
    keel_schedule *s2 = build_phased_random(rt2, ids2, 0x5eed1234u, N, sys2);
    ck_assert_int_eq(memcmp(sys, sys2, N * sizeof *sys), 0);

    /* deterministic: same plan, same hash, same diagnostics */
    ck_assert_uint_ne(keel_schedule_hash(s1), 0);
    ck_assert_uint_eq(keel_schedule_hash(s1), keel_schedule_hash(s2));
    ck_assert_uint_eq(keel_schedule_diag_count(s1), keel_schedule_diag_count(s2));
    for (uint32_t i = 0; i < N; i++)
        ck_assert_uint_eq(keel_schedule_order(s1, i), keel_schedule_order(s2, i));
    for (uint32_t i = 0; i < keel_schedule_diag_count(s1); i++)
        ck_assert_str_eq(diag_at(s1, i)->message, diag_at(s2, i)->message);
    assert_permutation(s1);

    /* every conflicting pair runs in phase order */
    uint32_t pos[N], conflicts = 0;
    for (uint32_t i = 0; i < N; i++)
        pos[keel_schedule_order(s1, i)] = i;
    for (uint32_t i = 0; i < N; i++)
        for (uint32_t j = i + 1; j < N; j++) {
            if (!rnd_conflict(&sys[i], &sys[j]))
                continue;
            conflicts++;
            uint32_t lo = sys[i].phase < sys[j].phase ? i : j, hi = lo == i ? j : i;
            ck_assert_msg(pos[lo] < pos[hi], "sys%03u (phase %u) runs after sys%03u (phase %u)", lo, sys[lo].phase, hi,
                          sys[hi].phase);
        }
    ck_assert_uint_gt(conflicts, 1000);

    /* only warnings, each about a real read ordered before a real write */
    uint32_t nd = keel_schedule_diag_count(s1);
    ck_assert_uint_gt(nd, 0);
    for (uint32_t i = 0; i < nd; i++) {
        const keel_sched_diag *d = diag_at(s1, i);
        ck_assert_int_eq(d->code, KEEL_SCHED_READ_BEFORE_WRITE);
        ck_assert_int_eq(d->severity, KEEL_SCHED_WARNING);
        ck_assert_uint_eq(d->name_count, 3);
        uint32_t r = (uint32_t)atoi(d->names[0] + 3), w = (uint32_t)atoi(d->names[1] + 3);
        ck_assert_uint_lt(r, N);
        ck_assert_uint_lt(w, N);
        ck_assert_uint_lt(sys[r].phase, sys[w].phase);
        ck_assert_uint_lt(pos[r], pos[w]);
        ck_assert_msg(rnd_reads_writes(&sys[r], &sys[w], d->names[2]), "%s", d->message);
    }

    keel_schedule_destroy(s1);
    keel_schedule_destroy(s2);
    keel_runtime_close(rt1);
    keel_runtime_close(rt2);
    free(sys);
    free(sys2);
}
END_TEST

/* Anything goes: random DAGs, phases, every kind of access, explicit edges
 * (some to missing systems), exclusive systems, a SINGLE_VERSION snapshot
 * now and then. The build may fail; it must not crash, and two runtimes
 * must agree on every diagnostic, the hash and the order. */
static keel_schedule *build_chaos(keel_runtime *rt, const keel_component *ids, uint64_t seed, uint32_t n)
{
    static const char *const dags[] = {NULL, "b", "c"};
    static const char *const events[] = {"ev0", "ev1", "ev2", "ev3"};
    keel_schedule *s = NULL;
    ck_assert_ok(keel_schedule_create(rt, &s));
    ck_assert_ok(keel_schedule_add_track(s, "Late"));
    for (uint32_t i = 0; i < n; i++) {
        char name[16], after[16];
        snprintf(name, sizeof name, "sys%03u", i);
        snprintf(after, sizeof after, "sys%03u", tu_rng_below(&seed, n + 5)); /* sometimes missing */
        keel_system_desc d = {.name = name, .run = tu_sys_noop, .dag = dags[tu_rng_below(&seed, 3)],
                              .phase = tu_rng_below(&seed, 4), .track = tu_rng_below(&seed, 8) ? NULL : "Late"};
        if (tu_rng_below(&seed, 10) == 0)
            d.after[0] = after;
        keel_component *lists[] = {d.access.reads, d.access.reads_fresh, d.access.reads_snapshot, d.access.writes,
                                   d.access.side_writes};
        for (int l = 0; l < 5; l++)
            for (uint32_t k = 0, m = tu_rng_below(&seed, 3); k < m; k++)
                lists[l][k] = ids[tu_rng_below(&seed, RND_COMPS)];
        const char **names[] = {d.access.resources_read, d.access.resources_write, d.access.events_produce,
                                d.access.events_consume};
        for (int l = 0; l < 4; l++)
            if (tu_rng_below(&seed, 4) == 0)
                names[l][0] = l < 2 ? res_names[tu_rng_below(&seed, RND_RES)] : events[tu_rng_below(&seed, 4)];
        d.access.exclusive = tu_rng_below(&seed, 60) == 0;
        ck_assert_ok(keel_schedule_add_system(s, &d, NULL));
    }
    int rc = keel_schedule_build(s);
    ck_assert_msg(rc == KEEL_OK || rc == KEEL_EINVAL, "build returned %d", rc);
    ck_assert_int_eq(rc == KEEL_OK, keel_schedule_hash(s) != 0);
    if (rc)
        ck_assert_uint_ge(keel_schedule_diag_count(s), 1);
    return s;
}

START_TEST(test_random_chaos_deterministic)
{
    enum { N = 300 };
    for (uint64_t seed = 1; seed <= 3; seed++) {
        keel_component ids1[RND_COMPS], ids2[RND_COMPS];
        keel_runtime *rt1 = rnd_runtime(ids1), *rt2 = rnd_runtime(ids2);
        /* make one component SINGLE_VERSION in both: snapshots of it fail */
        keel_component_desc sv = {.name = "single", .size = 4, .discipline = KEEL_SINGLE_VERSION,
                                  .fields = u32_fields, .field_count = 1};
        ck_assert_ok(keel_component_register(keel_runtime_world(rt1), &sv, &ids1[0]));
        ck_assert_ok(keel_component_register(keel_runtime_world(rt2), &sv, &ids2[0]));
        keel_schedule *s1 = build_chaos(rt1, ids1, seed, N), *s2 = build_chaos(rt2, ids2, seed, N);
        ck_assert_uint_eq(keel_schedule_hash(s1), keel_schedule_hash(s2));
        uint32_t nd = keel_schedule_diag_count(s1);
        ck_assert_uint_eq(keel_schedule_diag_count(s2), nd);
        for (uint32_t i = 0; i < nd; i++) {
            const keel_sched_diag *a = diag_at(s1, i), *b = diag_at(s2, i);
            ck_assert_int_eq(a->code, b->code);
            ck_assert_str_eq(a->message, b->message);
            ck_assert_uint_eq(a->name_count, b->name_count);
            ck_assert_uint_ge(a->name_count, 1);
            ck_assert_str_eq(keel_sched_code_name(a->code), keel_sched_code_name(b->code));
            ck_assert_str_ne(keel_sched_code_name(a->code), "SCHED_?");
        }
        for (uint32_t i = 0; i <= N; i++)
            ck_assert_uint_eq(keel_schedule_order(s1, i), keel_schedule_order(s2, i));
        if (keel_schedule_hash(s1))
            assert_permutation(s1);
        keel_schedule_destroy(s1);
        keel_schedule_destroy(s2);
        keel_runtime_close(rt1);
        keel_runtime_close(rt2);
    }
}
END_TEST

/* Diamond from event edges only, registered D, C, B, A: as the explicit
 * diamond, the order is A, C, B, D. */
START_TEST(test_diamond_via_events)
{
    fx f = fx_new();
    add(f.s, (keel_system_desc){.name = "D", .access.events_consume = {"joined"}});
    add(f.s, (keel_system_desc){.name = "C", .access.events_consume = {"split"}, .access.events_produce = {"joined"}});
    add(f.s, (keel_system_desc){.name = "B", .access.events_consume = {"split"}, .access.events_produce = {"joined"}});
    add(f.s, (keel_system_desc){.name = "A", .access.events_produce = {"split"}});
    assert_built_order(f.s, "A,C,B,D");

    /* same plan as the explicit diamond registered the same way */
    keel_schedule *s2 = NULL;
    ck_assert_ok(keel_schedule_create(f.rt, &s2));
    add(s2, (keel_system_desc){.name = "D", .after = {"B", "C"}});
    add(s2, (keel_system_desc){.name = "C", .after = {"A"}});
    add(s2, (keel_system_desc){.name = "B", .after = {"A"}});
    add_cb(s2, "A");
    build_clean(s2);
    ck_assert_uint_eq(keel_schedule_hash(s2), keel_schedule_hash(f.s));
    keel_schedule_destroy(s2);
    fx_close(&f);
}
END_TEST

/* 200 systems chained only by reads_fresh: link i writes k_i and
 * reads_fresh k_(i-1); registered last link first. */
START_TEST(test_long_fresh_chain)
{
    enum { N = 200 };
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_world *w = keel_runtime_world(rt);
    keel_component ids[N];
    char name[16], cname[16];
    for (int i = 0; i < N; i++) {
        snprintf(cname, sizeof cname, "k%03d", i);
        ids[i] = tu_reg(w, cname, 4, KEEL_VERSIONED, u32_fields, 1);
    }
    keel_schedule *s = NULL;
    ck_assert_ok(keel_schedule_create(rt, &s));
    for (int k = 0; k < N; k++) {
        int i = N - 1 - k;
        snprintf(name, sizeof name, "link%03d", i);
        keel_system_desc d = {.name = name, .run = tu_sys_noop, .access.writes = {ids[i]},
                              .access.reads_fresh = {i ? ids[i - 1] : 0}};
        ck_assert_ok(keel_schedule_add_system(s, &d, NULL));
    }
    build_clean(s);
    for (uint32_t pos = 0; pos < N; pos++) {
        keel_system sys = keel_schedule_order(s, pos);
        ck_assert_uint_eq(sys, N - 1 - pos);
        snprintf(name, sizeof name, "link%03u", pos);
        ck_assert_str_eq(keel_schedule_system_name(s, sys), name);
    }
    keel_schedule_destroy(s);
    keel_runtime_close(rt);
}
END_TEST

static Suite *sched_edge_cases_suite(void)
{
    const TTest *const t[] = {test_one_system, test_chain_300, test_independent_300, test_random_phased_access,
                              test_random_chaos_deterministic, test_diamond_via_events, test_long_fresh_chain};
    return tu_case_suite("sched_edge_cases", "edge_cases", t, sizeof t / sizeof t[0]);
}

KEEL_TEST_MAIN(sched_build_suite, sched_rules_suite, sched_cycle_suite, sched_order_suite, sched_edge_cases_suite)
