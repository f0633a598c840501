/*
 * Overload management (keel/runtime.h, docs/overload.md).
 *
 *   overload_machine  the detector as a pure state machine, fed synthetic
 *                     duration sequences: every transition up and down,
 *                     hysteresis, thresholds, caps and floors of the
 *                     multiplier, one shedding event per entry, config
 *                     defaults and errors
 *   overload_config   the runtime and schedule fields: validation, defaults,
 *                     disabled / unthrottled / stepped runtimes never move
 *   overload_runtime  a runtime driven by keel_runtime_run whose tick
 *                     durations come from a test seam (runtime_test_set_tick_cost)
 *                     and whose metronome waits on a fake clock: throttled
 *                     skips and their successors, the divisor's cadence, entity
 *                     budgets resuming (every row once per pass, serial and
 *                     parallel, rewrites), dt and the driver's interval under
 *                     modulation, telemetry, stats, the trace, on_critical_overload
 *
 * No sleeps, no timing assertions: durations are injected.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "runtime/overload.h"
#include "runtime/runtime_internal.h"

#define BUDGET 1000000ull /* ns: the synthetic budget of the state-machine tests */

/* =============================================================================
 * overload_machine
 * ============================================================================= */

static ovl_state machine(double base_hz, double min_hz)
{
    ovl_config c;
    keel_overload_desc d = {.min_tick_rate_hz = min_hz};
    ck_assert_ok(ovl_config_resolve(&d, base_hz, &c));
    ovl_state s;
    ovl_init(&s, &c);
    return s;
}

/* Feed n ticks of `permille` / 1000 of the budget; returns the last change
 * and counts shedding entries into *shed (may be NULL). */
static ovl_change feed(ovl_state *s, uint32_t n, uint64_t permille, uint32_t *shed)
{
    ovl_change c = OVL_STAY;
    for (uint32_t i = 0; i < n; i++) {
        c = ovl_feed(s, BUDGET * permille / 1000, BUDGET);
        if (shed && c == OVL_LEVEL_UP && s->level == KEEL_OVERLOAD_PLAYER_SHEDDING)
            (*shed)++;
    }
    return c;
}

#define OVER 2000u  /* 2x the budget: an overrun */
#define CALM 300u   /* 0.3x: calm */
#define FIT 900u    /* 0.9x: neither */

/* n - 1 ticks change nothing, the n-th makes `want`. */
static void expect_after(ovl_state *s, uint32_t n, uint64_t permille, ovl_change want, keel_overload_level level,
                         uint32_t mult)
{
    keel_overload_level before = s->level;
    uint32_t mult_before = ovl_multiplier(s);
    ck_assert_int_eq(feed(s, n - 1, permille, NULL), OVL_STAY);
    ck_assert_int_eq(s->level, before);
    ck_assert_uint_eq(ovl_multiplier(s), mult_before);
    ck_assert_int_eq(feed(s, 1, permille, NULL), want);
    ck_assert_msg(s->level == level && ovl_multiplier(s) == mult,
                  "after %u ticks at %llu permille: level %s x%u, want %s x%u", n, (unsigned long long)permille,
                  keel_overload_level_name(s->level), ovl_multiplier(s), keel_overload_level_name(level), mult);
}

START_TEST(test_defaults)
{
    ovl_config c;
    keel_overload_desc zero = {0};
    ck_assert_ok(ovl_config_resolve(&zero, 60, &c));
    ck_assert(c.overrun_threshold == 1.2);
    ck_assert(c.calm_ratio == 0.6);
    ck_assert_uint_eq(c.escalation_ticks, 5);
    ck_assert_uint_eq(c.deescalation_ticks, 20);
    ck_assert_uint_eq(c.mult_cap, 4); /* 60 Hz over the 10 Hz default floor: 6x */
    ovl_state s;
    ovl_init(&s, &c);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
    ck_assert_uint_eq(ovl_multiplier(&s), 1);
    ck_assert_str_eq(keel_overload_level_name(KEEL_OVERLOAD_NORMAL), "NORMAL");
    ck_assert_str_eq(keel_overload_level_name(KEEL_OVERLOAD_SYSTEM_THROTTLING), "SYSTEM_THROTTLING");
    ck_assert_str_eq(keel_overload_level_name(KEEL_OVERLOAD_SCOPE_REDUCTION), "SCOPE_REDUCTION");
    ck_assert_str_eq(keel_overload_level_name(KEEL_OVERLOAD_TICK_RATE_MODULATION), "TICK_RATE_MODULATION");
    ck_assert_str_eq(keel_overload_level_name(KEEL_OVERLOAD_PLAYER_SHEDDING), "PLAYER_SHEDDING");
    ck_assert_str_eq(keel_overload_level_name((keel_overload_level)7), "?");
}
END_TEST

START_TEST(test_resolve_errors)
{
    ovl_config c;
    const keel_overload_desc bad[] = {
        {.overrun_threshold = -1},
        {.overrun_threshold = 0.0 / 0.0},
        {.overrun_threshold = 1e7},
        {.deescalation_ratio = -0.5},
        {.deescalation_ratio = 1.2},               /* not below the default threshold */
        {.overrun_threshold = 0.5},                /* below the default ratio 0.6 */
        {.overrun_threshold = 2, .deescalation_ratio = 2},
        {.min_tick_rate_hz = -10},
        {.min_tick_rate_hz = 1e6},
        {.min_tick_rate_hz = 0.0 / 0.0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_rc(ovl_config_resolve(&bad[i], 60, &c), KEEL_EINVAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "overload."));
    }
    keel_overload_desc ok = {.overrun_threshold = 2, .deescalation_ratio = 1.5, .escalation_ticks = 1,
                             .deescalation_ticks = 3, .min_tick_rate_hz = 15};
    ck_assert_ok(ovl_config_resolve(&ok, 60, &c));
    ck_assert(c.overrun_threshold == 2 && c.calm_ratio == 1.5);
    ck_assert_uint_eq(c.escalation_ticks, 1);
    ck_assert_uint_eq(c.deescalation_ticks, 3);
    ck_assert_uint_eq(c.mult_cap, 3); /* 60 / 15 = 4x */
}
END_TEST

START_TEST(test_mult_caps)
{
    static const struct { double base, floor; uint32_t mult; } cases[] = {
        {60, 10, 6}, {30, 10, 3}, {60, 15, 4}, {60, 20, 3}, {20, 10, 2}, {19.9, 10, 1}, {15, 10, 1},
        {10, 10, 1}, {5, 10, 1}, {120, 10, 6}, {1000, 10, 6}, {60, 7, 6}, {50, 10, 4}, {-1, 10, 1},
    };
    static const uint32_t mults[] = {1, 2, 3, 4, 6};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t cap = ovl_mult_cap(cases[i].base, cases[i].floor);
        ck_assert_msg(mults[cap] == cases[i].mult, "base %g Hz, floor %g Hz: cap %ux, want %ux", cases[i].base,
                      cases[i].floor, mults[cap], cases[i].mult);
    }
}
END_TEST

/* 60 Hz, 10 Hz floor: every step up, five overruns each. */
START_TEST(test_escalate_every_step)
{
    ovl_state s = machine(60, 10);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_SYSTEM_THROTTLING, 1);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_SCOPE_REDUCTION, 1);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2); /* entered at 2x */
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 4);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 6);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_PLAYER_SHEDDING, 6); /* the multiplier stays */
    ck_assert_int_eq(feed(&s, 100, OVER, NULL), OVL_STAY); /* nothing above the last resort */
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_PLAYER_SHEDDING);
    ck_assert_uint_eq(ovl_multiplier(&s), 6);
}
END_TEST

/* From PLAYER_SHEDDING at 6x back to NORMAL, twenty calm ticks per step:
 * the multiplier walks down to 1x before TICK_RATE_MODULATION is left. */
START_TEST(test_deescalate_every_step)
{
    ovl_state s = machine(60, 10);
    feed(&s, 35, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_PLAYER_SHEDDING);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 6);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 4);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_SCOPE_REDUCTION, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_SYSTEM_THROTTLING, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_NORMAL, 1);
    ck_assert_int_eq(feed(&s, 100, CALM, NULL), OVL_STAY);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
}
END_TEST

/* Part-way down, load comes back: up again from where it is. */
START_TEST(test_turnaround_inside_modulation)
{
    ovl_state s = machine(60, 10);
    feed(&s, 25, OVER, NULL); /* TICK_RATE_MODULATION at 4x */
    ck_assert_uint_eq(ovl_multiplier(&s), 4);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 4);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 1);
    /* at 1x inside the level, an escalation takes the next multiplier, 2x */
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2);
}
END_TEST

START_TEST(test_hysteresis_overruns)
{
    ovl_state s = machine(60, 10);
    /* 4 overruns then a calm tick: no escalation, and the streak is gone */
    feed(&s, 4, OVER, NULL);
    feed(&s, 1, CALM, NULL);
    feed(&s, 4, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
    /* 4 overruns then a tick that fits (between the thresholds): the same */
    feed(&s, 1, FIT, NULL);
    feed(&s, 4, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
    ck_assert_int_eq(feed(&s, 1, OVER, NULL), OVL_LEVEL_UP); /* the fifth in a row */
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
    /* a step starts the streak afresh: the sixth overrun in a row is the first */
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_SCOPE_REDUCTION, 1);
}
END_TEST

START_TEST(test_hysteresis_calm)
{
    ovl_state s = machine(60, 10);
    feed(&s, 5, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
    /* a calm streak interrupted by a tick that fits restarts */
    feed(&s, 19, CALM, NULL);
    feed(&s, 1, FIT, NULL);
    feed(&s, 19, CALM, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
    /* ... and so does one interrupted by an overrun */
    feed(&s, 1, OVER, NULL);
    feed(&s, 19, CALM, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
    ck_assert_int_eq(feed(&s, 1, CALM, NULL), OVL_LEVEL_DOWN);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
    /* ticks between the thresholds hold any level forever */
    feed(&s, 5, OVER, NULL);
    ck_assert_int_eq(feed(&s, 1000, FIT, NULL), OVL_STAY);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
}
END_TEST

/* The thresholds themselves: overrun is strictly above 1.2x, calm is at or
 * below 0.6x. */
START_TEST(test_threshold_edges)
{
    ovl_state s = machine(60, 10);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(ovl_feed(&s, 1200, 1000), OVL_STAY);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
    for (int i = 0; i < 4; i++)
        ovl_feed(&s, 1201, 1000);
    ck_assert_int_eq(ovl_feed(&s, 1201, 1000), OVL_LEVEL_UP);
    for (int i = 0; i < 40; i++)
        ovl_feed(&s, 601, 1000);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
    for (int i = 0; i < 19; i++)
        ovl_feed(&s, 600, 1000);
    ck_assert_int_eq(ovl_feed(&s, 600, 1000), OVL_LEVEL_DOWN);
}
END_TEST

/* Without a budget nothing moves, and a streak does not survive it. */
START_TEST(test_no_budget)
{
    ovl_state s = machine(60, 10);
    feed(&s, 4, OVER, NULL);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(ovl_feed(&s, 5000000000ull, 0), OVL_STAY);
    feed(&s, 4, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_NORMAL);
}
END_TEST

/* 30 Hz over a 10 Hz floor: the multiplier caps at 3x. */
START_TEST(test_cap_30hz)
{
    ovl_state s = machine(30, 10);
    feed(&s, 15, OVER, NULL);
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_TICK_RATE_MODULATION);
    ck_assert_uint_eq(ovl_multiplier(&s), 2);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_PLAYER_SHEDDING, 3); /* no 4x */
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2);
    expect_after(&s, 20, CALM, OVL_MULT_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_SCOPE_REDUCTION, 1);
}
END_TEST

/* 60 Hz over a 15 Hz floor caps at 4x; 60 over 20 at 3x. */
START_TEST(test_cap_floor_15)
{
    ovl_state s = machine(60, 15);
    feed(&s, 15, OVER, NULL);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 3);
    expect_after(&s, 5, OVER, OVL_MULT_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 4);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_PLAYER_SHEDDING, 4);
}
END_TEST

/* A base rate below twice the floor allows no multiplier: the level is
 * entered at 1x and the next step is PLAYER_SHEDDING; 20 Hz allows 2x only. */
START_TEST(test_floor_allows_nothing)
{
    ovl_state s = machine(15, 10);
    feed(&s, 10, OVER, NULL);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_TICK_RATE_MODULATION, 1);
    expect_after(&s, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_PLAYER_SHEDDING, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_TICK_RATE_MODULATION, 1);
    expect_after(&s, 20, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_SCOPE_REDUCTION, 1);

    ovl_state t = machine(20, 10);
    feed(&t, 15, OVER, NULL);
    ck_assert_uint_eq(ovl_multiplier(&t), 2);
    expect_after(&t, 5, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_PLAYER_SHEDDING, 2);
}
END_TEST

/* Exactly one shedding entry per entry into the level, however long it lasts. */
START_TEST(test_shedding_once_per_entry)
{
    ovl_state s = machine(60, 10);
    uint32_t shed = 0;
    feed(&s, 35, OVER, &shed);
    ck_assert_uint_eq(shed, 1);
    feed(&s, 500, OVER, &shed);
    ck_assert_uint_eq(shed, 1);
    feed(&s, 20, CALM, &shed); /* back to TICK_RATE_MODULATION at 6x */
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_TICK_RATE_MODULATION);
    feed(&s, 5, OVER, &shed);  /* and in again */
    ck_assert_int_eq(s.level, KEEL_OVERLOAD_PLAYER_SHEDDING);
    ck_assert_uint_eq(shed, 2);
    feed(&s, 19, CALM, &shed);
    feed(&s, 5, OVER, &shed);  /* never left: no new entry */
    ck_assert_uint_eq(shed, 2);
}
END_TEST

/* Custom streak lengths. */
START_TEST(test_custom_streaks)
{
    ovl_config c;
    keel_overload_desc d = {.escalation_ticks = 2, .deescalation_ticks = 3};
    ck_assert_ok(ovl_config_resolve(&d, 60, &c));
    ovl_state s;
    ovl_init(&s, &c);
    expect_after(&s, 2, OVER, OVL_LEVEL_UP, KEEL_OVERLOAD_SYSTEM_THROTTLING, 1);
    expect_after(&s, 3, CALM, OVL_LEVEL_DOWN, KEEL_OVERLOAD_NORMAL, 1);
}
END_TEST

static Suite *machine_suite(void)
{
    Suite *s = suite_create("overload_machine");
    TCase *tc = tcase_create("machine");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_resolve_errors);
    tcase_add_test(tc, test_mult_caps);
    tcase_add_test(tc, test_escalate_every_step);
    tcase_add_test(tc, test_deescalate_every_step);
    tcase_add_test(tc, test_turnaround_inside_modulation);
    tcase_add_test(tc, test_hysteresis_overruns);
    tcase_add_test(tc, test_hysteresis_calm);
    tcase_add_test(tc, test_threshold_edges);
    tcase_add_test(tc, test_no_budget);
    tcase_add_test(tc, test_cap_30hz);
    tcase_add_test(tc, test_cap_floor_15);
    tcase_add_test(tc, test_floor_allows_nothing);
    tcase_add_test(tc, test_shedding_once_per_entry);
    tcase_add_test(tc, test_custom_streaks);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * shared runtime helpers
 * ============================================================================= */

#define HZ 60.0
#define INTERVAL ((uint64_t)(1e9 / HZ))

/* The injected cost of each tick, in permille of its budget: the interval
 * times the multiplier the tick runs at (the detector moves it only after
 * the tick, so keel_runtime_overload still gives the tick's own). */
typedef struct script {
    _Atomic uint32_t permille;
    keel_runtime *rt;
} script;

static uint64_t scripted_cost(void *user, uint64_t tick, uint64_t measured_ns)
{
    (void)tick;
    (void)measured_ns;
    script *sc = user;
    uint32_t mult;
    keel_runtime_overload(sc->rt, &mult);
    return INTERVAL * mult * atomic_load(&sc->permille) / 1000;
}

/* A fake metronome clock: waiting jumps to the deadline and records it. */
#define MAX_WAITS 4096
typedef struct fake_clock {
    uint64_t now;
    uint32_t nwaits;
    uint64_t deadline[MAX_WAITS];
} fake_clock;

static uint64_t fake_now(void *user)
{
    return ((fake_clock *)user)->now;
}

static void fake_wait(uint64_t deadline, void *user)
{
    fake_clock *fc = user;
    if (fc->nwaits < MAX_WAITS)
        fc->deadline[fc->nwaits] = deadline;
    fc->nwaits++;
    if (fc->now < deadline)
        fc->now = deadline;
}

/* Run ticks on the metronome one call at a time (so the script can change
 * between them) until the runtime reaches `level` x `mult`; fails after
 * `limit` ticks. Returns the ticks it took. */
static uint32_t run_until(keel_runtime *rt, keel_overload_level level, uint32_t mult, uint32_t limit)
{
    for (uint32_t n = 0; n < limit; n++) {
        uint32_t m;
        if (keel_runtime_overload(rt, &m) == level && m == mult)
            return n;
        ck_assert_ok(keel_runtime_run(rt, 1));
    }
    uint32_t m;
    keel_overload_level l = keel_runtime_overload(rt, &m);
    ck_abort_msg("after %u ticks the runtime is at %s x%u, not %s x%u", limit, keel_overload_level_name(l), m,
                 keel_overload_level_name(level), mult);
    return limit;
}

/* =============================================================================
 * overload_config
 * ============================================================================= */

START_TEST(test_runtime_desc_errors)
{
    const keel_overload_desc bad[] = {
        {.overrun_threshold = -2},
        {.deescalation_ratio = 5},
        {.min_tick_rate_hz = -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        keel_runtime *rt = NULL;
        ck_assert_rc(keel_runtime_create(&(keel_runtime_desc){.workers = 1, .overload = bad[i]}, &rt), KEEL_EINVAL);
        ck_assert_ptr_null(rt);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "overload."));
    }
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    uint32_t m = 0;
    ck_assert_int_eq(keel_runtime_overload(rt, &m), KEEL_OVERLOAD_NORMAL);
    ck_assert_uint_eq(m, 1);
    ck_assert_int_eq(keel_runtime_overload(rt, NULL), KEEL_OVERLOAD_NORMAL);
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.overload_level, 0);
    ck_assert_uint_eq(st.multiplier, 1);
    keel_runtime_close(rt);
    ck_assert_int_eq(keel_runtime_overload(NULL, &m), KEEL_OVERLOAD_NORMAL);
    ck_assert_uint_eq(m, 1);
}
END_TEST

START_TEST(test_schedule_fields)
{
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1});
    keel_component c = 0;
    static const keel_field f[] = {{.name = "v", .type = KEEL_I64}};
    ck_assert_ok(keel_component_register(keel_runtime_world(rt),
                                         &(keel_component_desc){.name = "v", .size = 8, .fields = f, .field_count = 1},
                                         &c));
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "prio", .run = tu_sys_noop, .priority = (keel_priority)7});
    add_sys(s, &(keel_system_desc){.name = "budget_cb", .run = tu_sys_noop, .entity_budget = 10});
    ck_assert_rc(keel_schedule_build(s), KEEL_EINVAL);
    ck_assert_uint_eq(keel_schedule_diag_count(s), 2);
    const keel_sched_diag *d0 = keel_schedule_diag(s, 0), *d1 = keel_schedule_diag(s, 1);
    ck_assert_int_eq(d0->code, KEEL_SCHED_BAD_SYSTEM);
    ck_assert_str_eq(d0->names[0], "prio");
    ck_assert_ptr_nonnull(strstr(d0->message, "priority"));
    ck_assert_int_eq(d1->code, KEEL_SCHED_BAD_SYSTEM);
    ck_assert_str_eq(d1->names[0], "budget_cb");
    ck_assert_ptr_nonnull(strstr(d1->message, "entity_budget"));
    keel_schedule_destroy(s);
    /* every priority, and a budget on a query system, build */
    s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "low", .run = tu_sys_noop, .priority = KEEL_PRIORITY_LOW});
    add_sys(s, &(keel_system_desc){.name = "normal", .run = tu_sys_noop, .priority = KEEL_PRIORITY_NORMAL});
    add_sys(s, &(keel_system_desc){.name = "high", .run = tu_sys_noop, .priority = KEEL_PRIORITY_HIGH});
    add_sys(s, &(keel_system_desc){.name = "crit", .run = tu_sys_noop, .priority = KEEL_PRIORITY_CRITICAL});
    ck_assert_ok(keel_schedule_build(s));
    keel_schedule_destroy(s);
    keel_runtime_close(rt);
}
END_TEST

static uint32_t g_critical_calls;

static void on_critical(keel_runtime *rt, uint64_t tick, void *user)
{
    (void)rt;
    (void)tick;
    (void)user;
    g_critical_calls++;
}

/* A runtime that would escalate at once (every tick 10x its budget) but
 * cannot: the detector is off, the runtime is unthrottled, or it is stepped. */
static void never_moves(keel_runtime_desc d, bool stepped)
{
    d.workers = 1;
    d.overload.escalation_ticks = 1;
    d.overload.on_critical_overload = on_critical;
    keel_runtime *rt = tu_rt_new(d);
    script sc = {.permille = 10000, .rt = rt};
    runtime_test_set_tick_cost(rt, scripted_cost, &sc);
    fake_clock *fc = calloc(1, sizeof *fc);
    runtime_test_set_clock(rt, fake_now, fake_wait, fc);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "low", .run = tu_sys_noop, .priority = KEEL_PRIORITY_LOW});
    tu_install(rt, s);
    g_critical_calls = 0;
    for (int i = 0; i < 30; i++)
        ck_assert_ok(stepped ? keel_runtime_step(rt) : keel_runtime_run(rt, 1));
    uint32_t m;
    ck_assert_int_eq(keel_runtime_overload(rt, &m), KEEL_OVERLOAD_NORMAL);
    ck_assert_uint_eq(m, 1);
    keel_runtime_stats st;
    keel_runtime_stats_get(rt, &st);
    ck_assert_uint_eq(st.ticks_at_level[0], 30);
    ck_assert_uint_eq(st.systems_throttled, 0);
    ck_assert_uint_eq(st.systems_run, 30);
    ck_assert_uint_eq(st.overload_escalations, 0);
    ck_assert_uint_eq(g_critical_calls, 0);
    keel_tick_record rec;
    ck_assert_ok(keel_telemetry_tick(rt, 30, &rec));
    ck_assert_uint_eq(rec.overload_level, 0);
    ck_assert_uint_eq(rec.multiplier, 1);
    keel_runtime_close(rt);
    free(fc);
}

START_TEST(test_disabled_never_moves)
{
    never_moves((keel_runtime_desc){.tick_rate_hz = HZ, .overload = {.disabled = true}}, false);
}
END_TEST

START_TEST(test_unthrottled_never_moves)
{
    never_moves((keel_runtime_desc){.tick_rate_hz = -1}, false);
}
END_TEST

START_TEST(test_stepped_never_moves)
{
    never_moves((keel_runtime_desc){.tick_rate_hz = HZ}, true);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("overload_config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_runtime_desc_errors);
    tcase_add_test(tc, test_schedule_fields);
    tcase_add_test(tc, test_disabled_never_moves);
    tcase_add_test(tc, test_unthrottled_never_moves);
    tcase_add_test(tc, test_stepped_never_moves);
    suite_add_tcase(s, tc);
    return s;
}

/* =============================================================================
 * overload_runtime
 * ============================================================================= */

#define NROWS 1000u
#define BUDGET_ROWS 300u
#define MAX_TICKS 512u

/* What the systems saw, per tick (index = tick number). */
typedef struct world_log {
    uint8_t ran[8][MAX_TICKS];      /* per callback system id */
    float dt[MAX_TICKS];
    _Atomic uint64_t rows[MAX_TICKS];
} world_log;

typedef struct cb_arg {
    world_log *log;
    uint32_t id;
} cb_arg;

static int sys_mark(keel_ctx *ctx, void *user)
{
    cb_arg *a = user;
    uint64_t t = keel_ctx_tick(ctx);
    if (t < MAX_TICKS) {
        a->log->ran[a->id][t] = 1;
        if (a->id == 0)
            a->log->dt[t] = keel_ctx_dt(ctx);
    }
    return 0;
}

/* The budgeted scan: adds 1 to every row it visits (rewrites: a fresh
 * version from the previous values). */
static int scan_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    world_log *log = user;
    int64_t *out = KEEL_COLUMN(it, int64_t, 0);
    const int64_t *prev = it->prev[0];
    for (uint32_t i = 0; i < it->count; i++)
        out[i] = prev[i] + 1;
    uint64_t t = keel_ctx_tick(ctx);
    if (t < MAX_TICKS)
        atomic_fetch_add(&log->rows[t], it->count);
    return 0;
}

enum { S_CLOCK, S_LOW, S_NORMAL_A, S_NORMAL_B, S_HIGH_AFTER_LOW, S_CRIT, S_NCB };

typedef struct rig {
    keel_runtime *rt;
    keel_component v;
    keel_entity ents[NROWS];
    keel_system id[S_NCB + 1];      /* registration indices; [S_NCB] = the scan */
    cb_arg args[S_NCB];
    world_log *log;
    script sc;
    fake_clock *fc;
} rig;

/* A 60 Hz runtime: callbacks of every priority (a HIGH one after the LOW
 * one), a budgeted query system `scan` (rewrites v) over NROWS entities in
 * 64-row chunks, injected tick costs and a fake metronome clock. */
static void rig_open(rig *r, int32_t workers, bool parallel_scan)
{
    memset(r, 0, sizeof *r);
    r->log = calloc(1, sizeof *r->log);
    r->fc = calloc(1, sizeof *r->fc);
    ck_assert(r->log && r->fc);
    r->fc->now = 1000000000ull;
    r->rt = tu_rt_new((keel_runtime_desc){
        .workers = workers, .tick_rate_hz = HZ, .world = {.chunk_rows = 64}, .telemetry_capacity = 1024,
        .overload = {.throttled_tick_divisor = 3, .on_critical_overload = on_critical, .user = r}});
    r->sc = (script){.permille = 500, .rt = r->rt};
    runtime_test_set_tick_cost(r->rt, scripted_cost, &r->sc);
    runtime_test_set_clock(r->rt, fake_now, fake_wait, r->fc);
    keel_world *w = keel_runtime_world(r->rt);
    static const keel_field f[] = {{.name = "v", .type = KEEL_I64}};
    ck_assert_ok(keel_component_register(w, &(keel_component_desc){.name = "v", .size = 8, .fields = f,
                                                                   .field_count = 1}, &r->v));
    keel_cmdbuf *cb;
    ck_assert_ok(keel_cmdbuf_create(w, &cb));
    int64_t zero = 0;
    for (uint32_t i = 0; i < NROWS; i++)
        ck_assert_ok(keel_cmd_spawn(cb, (keel_init[]){{r->v, &zero}}, 1));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    memcpy(r->ents, keel_cmdbuf_result(cb).created, sizeof r->ents);
    keel_cmdbuf_destroy(cb);

    static const char *const names[S_NCB] = {"clock", "low", "normal_a", "normal_b", "high_after_low", "crit"};
    static const keel_priority prio[S_NCB] = {KEEL_PRIORITY_CRITICAL, KEEL_PRIORITY_LOW, KEEL_PRIORITY_NORMAL,
                                              KEEL_PRIORITY_NORMAL, KEEL_PRIORITY_HIGH, KEEL_PRIORITY_CRITICAL};
    keel_schedule *s = sched_new(r->rt);
    for (uint32_t i = 0; i < S_NCB; i++) {
        r->args[i] = (cb_arg){r->log, i};
        keel_system_desc d = {.name = names[i], .run = sys_mark, .user = &r->args[i], .priority = prio[i]};
        if (i == S_HIGH_AFTER_LOW)
            d.after[0] = "low";
        r->id[i] = add_sys(s, &d);
    }
    keel_system_desc scan = {.name = "scan", .kind = KEEL_SYSTEM_QUERY, .each_chunk = scan_chunk, .user = r->log,
                             .query = {.with = {r->v}}, .access = {.rewrites = {r->v}}, .priority = KEEL_PRIORITY_HIGH,
                             .entity_budget = BUDGET_ROWS, .parallel = parallel_scan, .min_chunk_rows = 16};
    r->id[S_NCB] = add_sys(s, &scan);
    tu_install(r->rt, s);
}

static void rig_close(rig *r)
{
    keel_runtime_close(r->rt);
    free(r->log);
    free(r->fc);
}

static int64_t value_of(const rig *r, uint32_t i)
{
    int64_t v = -1;
    ck_assert_ok(keel_get(keel_runtime_world(r->rt), r->ents[i], r->v, &v));
    return v;
}

/* Every entity's value equals want[i]. */
static void expect_values(const rig *r, const int64_t *want)
{
    for (uint32_t i = 0; i < NROWS; i++)
        ck_assert_msg(value_of(r, i) == want[i], "entity %u: v = %lld, want %lld", i, (long long)value_of(r, i),
                      (long long)want[i]);
}

static keel_tick_record tick_rec(const rig *r, uint64_t t)
{
    keel_tick_record rec;
    ck_assert_ok(keel_telemetry_tick(r->rt, t, &rec));
    return rec;
}

static keel_system_record sys_rec(const rig *r, uint64_t t, uint32_t which)
{
    keel_system_record rec;
    ck_assert_ok(keel_telemetry_system(r->rt, t, r->id[which], &rec));
    return rec;
}

/* Overrun up to SCOPE_REDUCTION and check what each tick did on the way:
 * NORMAL ticks run everything; SYSTEM_THROTTLING ticks skip `low` and run
 * each NORMAL system on one tick in 3, staggered by registration index;
 * the HIGH successor of the throttled `low` still runs. */
static void climb_to_scope_reduction(rig *r, uint64_t *tick)
{
    atomic_store(&r->sc.permille, 2000);
    ck_assert_uint_eq(run_until(r->rt, KEEL_OVERLOAD_SYSTEM_THROTTLING, 1, 10), 5);
    for (uint64_t t = 1; t <= 5; t++) {
        keel_tick_record rec = tick_rec(r, t);
        ck_assert_uint_eq(rec.overload_level, KEEL_OVERLOAD_NORMAL);
        ck_assert_uint_eq(rec.multiplier, 1);
        ck_assert_uint_eq(rec.target_ns, INTERVAL);
        ck_assert_uint_eq(rec.actual_ns, 2 * INTERVAL);
        ck_assert(rec.overrun == 2.0);
        ck_assert_uint_eq(rec.systems_throttled, 0);
        for (uint32_t k = 0; k < S_NCB; k++)
            ck_assert_msg(r->log->ran[k][t], "tick %llu: system %u did not run at NORMAL", (unsigned long long)t, k);
        ck_assert_uint_eq(sys_rec(r, t, S_NCB).rows, NROWS); /* no budget below SCOPE_REDUCTION */
        ck_assert_uint_eq(sys_rec(r, t, S_NCB).deferred, 0);
    }
    ck_assert_uint_eq(run_until(r->rt, KEEL_OVERLOAD_SCOPE_REDUCTION, 1, 10), 5);
    for (uint64_t t = 6; t <= 10; t++) {
        keel_tick_record rec = tick_rec(r, t);
        ck_assert_uint_eq(rec.overload_level, KEEL_OVERLOAD_SYSTEM_THROTTLING);
        ck_assert(!r->log->ran[S_LOW][t]);
        ck_assert_int_eq(sys_rec(r, t, S_LOW).skip, KEEL_SKIP_THROTTLED);
        ck_assert_uint_eq(sys_rec(r, t, S_LOW).start_ns, 0);
        ck_assert_uint_eq(sys_rec(r, t, S_LOW).tasks, 0);
        ck_assert_msg(r->log->ran[S_HIGH_AFTER_LOW][t], "tick %llu: the successor of a throttled system did not run",
                      (unsigned long long)t);
        ck_assert_int_eq(sys_rec(r, t, S_HIGH_AFTER_LOW).skip, KEEL_SKIP_NONE);
        ck_assert(r->log->ran[S_CLOCK][t] && r->log->ran[S_CRIT][t]);
        uint32_t throttled = 1;
        for (uint32_t k = S_NORMAL_A; k <= S_NORMAL_B; k++) {
            bool due = (t + r->id[k]) % 3 == 0;
            ck_assert_msg(r->log->ran[k][t] == due, "tick %llu: NORMAL system %u (index %u) ran=%d, due=%d",
                          (unsigned long long)t, k, r->id[k], r->log->ran[k][t], due);
            ck_assert_int_eq(sys_rec(r, t, k).skip, due ? KEEL_SKIP_NONE : KEEL_SKIP_THROTTLED);
            throttled += !due;
        }
        ck_assert_uint_eq(rec.systems_throttled, throttled);
        ck_assert_uint_eq(rec.systems_skipped, throttled);
        ck_assert_uint_eq(rec.systems_failed, 0);
        ck_assert_uint_eq(sys_rec(r, t, S_NCB).rows, NROWS);
    }
    *tick = 10;
}

/* At SCOPE_REDUCTION the scan visits BUDGET_ROWS rows per tick, resuming
 * where it stopped: windows [0,300) [300,600) [600,900) [900,1000), then a
 * new pass. Every row is visited exactly once per pass. */
static void check_budget_pass(rig *r, uint64_t *tick, bool parallel)
{
    int64_t want[NROWS];
    for (uint32_t i = 0; i < NROWS; i++)
        want[i] = (int64_t)*tick; /* one visit per tick so far */
    expect_values(r, want);
    atomic_store(&r->sc.permille, 1000); /* fits: stay at SCOPE_REDUCTION */
    static const uint32_t windows[][2] = {{0, 300}, {300, 600}, {600, 900}, {900, 1000}, {0, 300}};
    for (uint32_t k = 0; k < 5; k++) {
        ck_assert_ok(keel_runtime_run(r->rt, 1));
        uint64_t t = ++*tick;
        uint32_t lo = windows[k][0], hi = windows[k][1];
        for (uint32_t i = lo; i < hi; i++)
            want[i]++;
        expect_values(r, want);
        keel_system_record sr = sys_rec(r, t, S_NCB);
        ck_assert_uint_eq(sr.rows, hi - lo);
        ck_assert_uint_eq(sr.deferred, NROWS - (hi - lo));
        if (parallel) /* the window's chunks are split into tasks */
            ck_assert_uint_gt(sr.tasks, 1);
        ck_assert_uint_eq(atomic_load(&r->log->rows[t]), hi - lo);
        keel_tick_record rec = tick_rec(r, t);
        ck_assert_uint_eq(rec.overload_level, KEEL_OVERLOAD_SCOPE_REDUCTION);
        ck_assert_uint_eq(rec.deferred_rows, NROWS - (hi - lo));
    }
}

START_TEST(test_levels_in_a_runtime)
{
    rig r;
    rig_open(&r, 1, false);
    g_critical_calls = 0;
    uint64_t tick = 0;
    climb_to_scope_reduction(&r, &tick);
    check_budget_pass(&r, &tick, false);

    /* TICK_RATE_MODULATION: entered at 2x; dt and the driver's interval follow */
    atomic_store(&r.sc.permille, 2000);
    uint64_t entered = tick + run_until(r.rt, KEEL_OVERLOAD_TICK_RATE_MODULATION, 2, 10);
    r.fc->nwaits = 0;
    uint64_t start = r.fc->now;
    ck_assert_ok(keel_runtime_run(r.rt, 6)); /* 5 ticks at 2x, then one at 3x */
    /* six waits: the first tick waits too, for the grid point the runs
     * before left (runs called back to back share the grid: driver.c) */
    ck_assert_uint_eq(r.fc->nwaits, 6);
    ck_assert_uint_eq(r.fc->deadline[0] - start, 2 * INTERVAL);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_eq(r.fc->deadline[i + 1] - r.fc->deadline[i], 2 * INTERVAL);
    ck_assert_uint_eq(r.fc->deadline[5] - r.fc->deadline[4], 3 * INTERVAL); /* after the step to 3x */
    uint32_t m;
    ck_assert_int_eq(keel_runtime_overload(r.rt, &m), KEEL_OVERLOAD_TICK_RATE_MODULATION);
    ck_assert_uint_eq(m, 3);
    for (uint64_t t = entered + 1; t <= entered + 6; t++) {
        uint32_t mult = t <= entered + 5 ? 2 : 3;
        keel_tick_record rec = tick_rec(&r, t);
        ck_assert_uint_eq(rec.overload_level, KEEL_OVERLOAD_TICK_RATE_MODULATION);
        ck_assert_uint_eq(rec.multiplier, mult);
        ck_assert_uint_eq(rec.target_ns, mult * INTERVAL);
        ck_assert_msg(r.log->dt[t] == (float)(1.0 / HZ) * (float)mult, "tick %llu: dt %g, want %u/60",
                      (unsigned long long)t, (double)r.log->dt[t], mult);
    }
    ck_assert(r.log->dt[1] == (float)(1.0 / HZ));

    /* up to PLAYER_SHEDDING: on_critical_overload once, however long it lasts */
    tick = entered + 6;
    tick += run_until(r.rt, KEEL_OVERLOAD_PLAYER_SHEDDING, 6, 20);
    ck_assert_uint_eq(g_critical_calls, 1);
    ck_assert_ok(keel_runtime_run(r.rt, 30));
    ck_assert_uint_eq(g_critical_calls, 1);

    /* calm: back down one step per 20 calm ticks, the multiplier first */
    atomic_store(&r.sc.permille, 300);
    static const struct { keel_overload_level l; uint32_t m; } down[] = {
        {KEEL_OVERLOAD_TICK_RATE_MODULATION, 6}, {KEEL_OVERLOAD_TICK_RATE_MODULATION, 4},
        {KEEL_OVERLOAD_TICK_RATE_MODULATION, 3}, {KEEL_OVERLOAD_TICK_RATE_MODULATION, 2},
        {KEEL_OVERLOAD_TICK_RATE_MODULATION, 1}, {KEEL_OVERLOAD_SCOPE_REDUCTION, 1},
        {KEEL_OVERLOAD_SYSTEM_THROTTLING, 1}, {KEEL_OVERLOAD_NORMAL, 1},
    };
    for (size_t k = 0; k < sizeof down / sizeof down[0]; k++)
        ck_assert_uint_eq(run_until(r.rt, down[k].l, down[k].m, 25), 20);
    /* and in again: a second call */
    atomic_store(&r.sc.permille, 2000);
    run_until(r.rt, KEEL_OVERLOAD_PLAYER_SHEDDING, 6, 40);
    ck_assert_uint_eq(g_critical_calls, 2);

    keel_runtime_stats st;
    keel_runtime_stats_get(r.rt, &st);
    ck_assert_uint_eq(st.critical_overloads, 2);
    ck_assert_uint_eq(st.overload_escalations, 14);  /* 7 steps up, twice */
    ck_assert_uint_eq(st.overload_deescalations, 8);
    ck_assert_uint_eq(st.overload_level, KEEL_OVERLOAD_PLAYER_SHEDDING);
    ck_assert_uint_eq(st.multiplier, 6);
    uint64_t sum = 0;
    for (int l = 0; l < KEEL_OVERLOAD_LEVELS; l++)
        sum += st.ticks_at_level[l];
    ck_assert_uint_eq(sum, st.ticks);
    ck_assert_uint_eq(st.ticks_at_level[KEEL_OVERLOAD_NORMAL], 5 + 5);
    ck_assert_uint_gt(st.systems_throttled, 0);
    ck_assert_uint_gt(st.rows_deferred, 0);
    ck_assert_uint_eq(st.systems_failed, 0);

    /* the trace carries the level and multiplier as a counter track */
    char path[] = "/tmp/keel-ovl-trace-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_ok(keel_trace_export(r.rt, path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(path);
    ck_assert_ptr_nonnull(strstr(text, "\"ph\":\"C\",\"pid\":1,\"name\":\"overload\""));
    ck_assert_ptr_nonnull(strstr(text, "\"args\":{\"level\":4,\"multiplier\":6}"));
    ck_assert_ptr_nonnull(strstr(text, "\"args\":{\"level\":0,\"multiplier\":1}"));
    rig_close(&r);
}
END_TEST

/* The same budget walk with a parallel scan on 2 workers: the window's
 * chunks are split into tasks, and still every row is visited once a pass. */
START_TEST(test_budget_parallel)
{
    rig r;
    rig_open(&r, 2, true);
    uint64_t tick = 0;
    climb_to_scope_reduction(&r, &tick);
    check_budget_pass(&r, &tick, true);
    rig_close(&r);
}
END_TEST

/* Keeping ticks between the thresholds holds SCOPE_REDUCTION; when the load
 * goes away the budget does too, and a later reduction starts a fresh pass. */
START_TEST(test_budget_resets_below_scope_reduction)
{
    rig r;
    rig_open(&r, 1, false);
    uint64_t tick = 0;
    climb_to_scope_reduction(&r, &tick);
    atomic_store(&r.sc.permille, 1000);
    ck_assert_ok(keel_runtime_run(r.rt, 2)); /* windows [0,300) [300,600) */
    tick += 2;
    ck_assert_uint_eq(sys_rec(&r, tick, S_NCB).rows, BUDGET_ROWS);
    atomic_store(&r.sc.permille, 300);
    tick += run_until(r.rt, KEEL_OVERLOAD_SYSTEM_THROTTLING, 1, 25);
    ck_assert_ok(keel_runtime_run(r.rt, 1));
    tick++;
    ck_assert_uint_eq(sys_rec(&r, tick, S_NCB).rows, NROWS); /* every row again */
    ck_assert_uint_eq(sys_rec(&r, tick, S_NCB).deferred, 0);
    atomic_store(&r.sc.permille, 2000);
    tick += run_until(r.rt, KEEL_OVERLOAD_SCOPE_REDUCTION, 1, 10);
    int64_t before = value_of(&r, 0), mid = value_of(&r, 300);
    atomic_store(&r.sc.permille, 1000);
    ck_assert_ok(keel_runtime_run(r.rt, 1)); /* a fresh pass: [0,300) */
    ck_assert_int_eq(value_of(&r, 0), before + 1);
    ck_assert_int_eq(value_of(&r, 300), mid);
    rig_close(&r);
}
END_TEST

/* keel_runtime_step between metronome runs keeps the level the metronome
 * left, and does not move it. */
START_TEST(test_step_keeps_level)
{
    rig r;
    rig_open(&r, 1, false);
    uint64_t tick = 0;
    climb_to_scope_reduction(&r, &tick);
    for (int i = 0; i < 10; i++)
        ck_assert_ok(keel_runtime_step(r.rt));
    uint32_t m;
    ck_assert_int_eq(keel_runtime_overload(r.rt, &m), KEEL_OVERLOAD_SCOPE_REDUCTION);
    ck_assert_uint_eq(tick_rec(&r, tick + 10).overload_level, KEEL_OVERLOAD_SCOPE_REDUCTION);
    ck_assert_uint_eq(sys_rec(&r, tick + 10, S_NCB).rows, BUDGET_ROWS);
    rig_close(&r);
}
END_TEST

static Suite *runtime_suite(void)
{
    Suite *s = suite_create("overload_runtime");
    TCase *tc = tcase_create("runtime");
    tcase_add_test(tc, test_levels_in_a_runtime);
    tcase_add_test(tc, test_budget_parallel);
    tcase_add_test(tc, test_budget_resets_below_scope_reduction);
    tcase_add_test(tc, test_step_keeps_level);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(machine_suite, config_suite, runtime_suite)
