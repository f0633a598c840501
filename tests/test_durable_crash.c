/*
 * test_durable_crash.c -- crash recovery of a durable runtime with real
 * processes, real files and SIGKILL (docs/durability.md, docs/reliability.md):
 * entity allocation is part of the durable state, every durability mode keeps
 * its promise, on_first_tick runs after every recovery, and a crash during
 * recovery, or right after it, is recovered again with nothing lost (double
 * crash, destroy then crash twice, a spawn never written again, a crash
 * during a checkpoint).
 *
 * The workload, its children and the oracle are in crash_util.[ch] (shared
 * with test_powerloss); the scenarios are here:
 *
 *   crash_kill   one data directory, rounds of children killed at varied
 *                points (after n acknowledgements, on checkpoint ticks --
 *                every 7 ticks --, on random ticks, right after recovery,
 *                during recovery, right after keel_checkpoint returned, during
 *                keel_checkpoint), some with a 256 KiB map that must grow,
 *                some with wal_retain, on 1 or 2 workers, sync or async bank;
 *                then a run to the end tick and a clean reopen. And kills
 *                while a 100-tick WAL is replayed;
 *   crash_cases  (a) a destroyed entity stays destroyed across two crashes in
 *                a row, slot generation as in the reference; (b) a spawned
 *                entity never written again keeps its values after a crash,
 *                and after a checkpoint and a crash; (c) a crash right after
 *                recovery loses nothing; (d) crashes with a checkpoint every
 *                tick; (e) durability modes IMMEDIATE / GROUP / DEFERRED; (f)
 *                keel_flush with DEFERRED ticks.
 *
 * KEEL_CRASH_SEED=<n> changes the kill points; KEEL_CRASH_VERBOSE=1 prints every
 * child's story; KEEL_CRASH_KEEP=1 keeps the data directories.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "crash_util.h"
#include "keel/keel.h"
#include "keel_test.h"


/* ---- crash_kill ------------------------------------------------------------------------------- */

START_TEST(test_kill_rounds)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "crash_kill");
    static const int kinds[] = {0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7};
    const uint64_t end = 140;
    crash_rounds(&o, d.data, KEEL_DURABLE_GROUP, 7, 20, end, 1, kinds, (int)(sizeof kinds / sizeof kinds[0]));
    /* every kind at least once, whatever the seed picked */
    for (int k = 0; k <= 7 && o.max_ran + 3 < end; k++) {
        int one[] = {k};
        crash_rounds(&o, d.data, KEEL_DURABLE_GROUP, 7, 1, end, 100 + (uint64_t)k, one, 1);
    }
    finish(&o, d.data, KEEL_DURABLE_GROUP, 7, end);
    if (!o.failed && o.kills < 10)
        ofail(&o, "only %u kills happened", o.kills);
    scenario_end(&o, &d, ref);
}
END_TEST

/* Kills while a long WAL (no checkpoint: 100 ticks) is being replayed, and right
 * after; every recovery reaches the same state. */
START_TEST(test_kill_during_recovery)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "crash_kill during recovery");
    plan p = base_plan(d.data, KEEL_DURABLE_GROUP, -1, 110);
    run_child(&o, &p, (trigger){TRIG_TICK, 100});
    p.until = 0;
    for (int r = 0; r < 8 && !o.failed; r++) {
        outcome out = run_child(&o, &p, (trigger){r < 6 ? TRIG_STARTED : TRIG_RECOVERED, 0});
        if (!o.failed && out.recovered && out.rec.hash != o.last_rec.hash)
            ofail(&o, "kill %d during recovery changed the recovered state", r);
    }
    if (!o.failed && o.last_rec.aux)
        ofail(&o, "recovered from checkpoint tick %" PRIu64 " although none was taken", o.last_rec.aux);
    finish(&o, d.data, KEEL_DURABLE_GROUP, -1, 120);
    scenario_end(&o, &d, ref);
}
END_TEST

/* ---- crash_cases ------------------------------------------------------------------------------ */

/* (a) destroy at tick k, crash, recover, crash right after recovery, recover:
 * still dead, slot generation as in the reference. Once with the destroy in
 * the WAL (the last checkpoint before it), once inside a checkpoint. */
static void destroyed_twice(const refdata *ref, bool checkpointed)
{
    tmpdir d;
    tmpdir_make(&d);
    oracle o;
    oracle_init(&o, ref, checkpointed ? "(a) destroy, checkpoint, crash twice" : "(a) destroy, crash twice");
    const uint64_t k = PROBE_DESTROY_TICK;
    plan p = base_plan(d.data, KEEL_DURABLE_IMMEDIATE, 10, k);
    p.hold_at_end = true;
    p.checkpoint_at = checkpointed ? k : 0;
    p.probe[0] = ref->probe[0];
    run_child(&o, &p, (trigger){TRIG_NONE, 0}); /* runs to k, holds, killed */
    for (int crash = 0; crash < 3 && !o.failed; crash++) {
        plan q = base_plan(d.data, KEEL_DURABLE_IMMEDIATE, 10, k);
        q.hold_after_recover = crash < 2; /* killed right after recovery, twice */
        q.until = crash < 2 ? k : 40;
        q.probe[0] = ref->probe[0];
        outcome out = run_child(&o, &q, (trigger){TRIG_NONE, 0});
        if (o.failed)
            break;
        const msg *m = &out.rec;
        if (m->tick != k)
            ofail(&o, "recovery %d: tick %" PRIu64 ", expected %" PRIu64, crash + 1, m->tick, k);
        else if (m->probe_alive[0] || m->probe_gen[0] != ref->probe_gen[0][k])
            ofail(&o, "recovery %d: entity 0x%016" PRIx64 " destroyed at tick %" PRIu64 " is %s, slot generation %u "
                  "(reference: dead, generation %u)", crash + 1, ref->probe[0], k,
                  m->probe_alive[0] ? "alive" : "dead", m->probe_gen[0], ref->probe_gen[0][k]);
        if (checkpointed && !o.failed && m->aux != k)
            ofail(&o, "recovery %d: checkpoint tick %" PRIu64 ", expected %" PRIu64, crash + 1, m->aux, k);
    }
    oracle_assert(&o, &d);
}

START_TEST(test_destroy_crash_twice)
{
    refdata *ref = reference_run();
    destroyed_twice(ref, false);
    destroyed_twice(ref, true);
    munmap(ref, sizeof *ref);
}
END_TEST

/* (b) an entity spawned at tick s and never written again: its values after a
 * crash (from the WAL), then after a checkpoint and a crash (from the checkpoint). */
START_TEST(test_spawn_never_written)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "(b) spawn never written again");
    const uint64_t s = PROBE_STATIC_TICK, c = 20;
    ck_assert_msg(ref->probe_alive[1][c + 5], "reference: the probe static died; pick another tick");
    plan p = base_plan(d.data, KEEL_DURABLE_IMMEDIATE, -1, s + 2);
    p.hold_at_end = true;
    p.probe[1] = ref->probe[1];
    run_child(&o, &p, (trigger){TRIG_NONE, 0});
    for (int step = 0; step < 3 && !o.failed; step++) {
        plan q = base_plan(d.data, KEEL_DURABLE_IMMEDIATE, -1, step == 0 ? c : c + 5);
        q.probe[1] = ref->probe[1];
        q.checkpoint_at = step == 0 ? c : 0; /* step 0 checkpoints at c and holds; step 1 recovers it */
        q.hold_at_end = step < 2;
        q.hold_after_recover = step == 1;
        outcome out = run_child(&o, &q, (trigger){TRIG_NONE, 0});
        if (o.failed)
            break;
        const msg *m = &out.rec;
        uint64_t want = step == 0 ? s + 2 : c;
        if (m->tick != want)
            ofail(&o, "step %d: recovered tick %" PRIu64 ", expected %" PRIu64, step, m->tick, want);
        else if (!m->probe_alive[1] || m->probe_born.tick != ref->probe_born.tick ||
                 m->probe_born.salt != ref->probe_born.salt)
            ofail(&o, "step %d: static entity 0x%016" PRIx64 " spawned at tick %" PRIu64 " is %s with born {%" PRIu64
                  ", %016" PRIx64 "}, spawned as {%" PRIu64 ", %016" PRIx64 "}", step, ref->probe[1], s,
                  m->probe_alive[1] ? "alive" : "dead", m->probe_born.tick, m->probe_born.salt, ref->probe_born.tick,
                  ref->probe_born.salt);
        else if (step > 0 && m->aux != c)
            ofail(&o, "step %d: recovered from checkpoint tick %" PRIu64 ", expected %" PRIu64, step, m->aux, c);
    }
    scenario_end(&o, &d, ref);
}
END_TEST

/* (c) a crash right after recovery (before any new checkpoint or tick) loses
 * nothing: the same tick and state again, twice; also right after a checkpoint. */
static void recover_same(oracle *o, const char *dir, int times)
{
    msg first = o->last_rec;
    for (int i = 0; i < times && !o->failed; i++) {
        plan q = base_plan(dir, KEEL_DURABLE_GROUP, 5, 0);
        q.hold_after_recover = true;
        outcome out = run_child(o, &q, (trigger){TRIG_NONE, 0});
        if (o->failed)
            break;
        if (out.rec.tick != first.tick || out.rec.hash != first.hash ||
            memcmp(out.rec.ledger, first.ledger, sizeof first.ledger) ||
            memcmp(out.rec.bal, first.bal, sizeof first.bal))
            ofail(o, "recovering again after a crash right after recovery: tick %" PRIu64 " hash %016" PRIx64
                  ", the first recovery: tick %" PRIu64 " hash %016" PRIx64, out.rec.tick, out.rec.hash, first.tick,
                  first.hash);
    }
}

START_TEST(test_crash_right_after_recovery)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "(c) crash right after recovery");
    /* GROUP ticks, killed mid-run (after transfers of tick 13) */
    plan p = base_plan(d.data, KEEL_DURABLE_GROUP, 5, 30);
    run_child(&o, &p, (trigger){TRIG_ACKS, 13 * SLOTS + 2});
    /* the first recovery, killed at once; then twice more, the same */
    plan q = base_plan(d.data, KEEL_DURABLE_GROUP, 5, 0);
    q.hold_after_recover = true;
    run_child(&o, &q, (trigger){TRIG_NONE, 0});
    recover_same(&o, d.data, 2);
    /* an IMMEDIATE run held at tick 17: exactly 17, three times */
    p = base_plan(d.data, KEEL_DURABLE_IMMEDIATE, 5, 17);
    p.hold_at_end = true;
    run_child(&o, &p, (trigger){TRIG_NONE, 0});
    run_child(&o, &q, (trigger){TRIG_NONE, 0});
    if (!o.failed && o.last_rec.tick != 17)
        ofail(&o, "an IMMEDIATE run held after tick 17 recovered tick %" PRIu64, o.last_rec.tick);
    recover_same(&o, d.data, 2);
    /* a checkpoint at tick 24 (keel_checkpoint returned), held, killed: 24, three times */
    p = base_plan(d.data, KEEL_DURABLE_GROUP, 5, 24);
    p.checkpoint_at = 24;
    p.hold_at_end = true;
    run_child(&o, &p, (trigger){TRIG_NONE, 0});
    run_child(&o, &q, (trigger){TRIG_NONE, 0});
    if (!o.failed && (o.last_rec.tick != 24 || o.last_rec.aux != 24))
        ofail(&o, "after keel_checkpoint at tick 24: recovered tick %" PRIu64 " from checkpoint tick %" PRIu64,
              o.last_rec.tick, o.last_rec.aux);
    recover_same(&o, d.data, 2);
    finish(&o, d.data, KEEL_DURABLE_GROUP, 5, 40);
    scenario_end(&o, &d, ref);
}
END_TEST

/* (d) a checkpoint every tick; killed at varied points: always a reference state. */
START_TEST(test_crash_during_checkpoint)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "(d) checkpoint every tick");
    static const int kinds[] = {0, 0, 2, 2, 1, 3, 5, 6, 7};
    crash_rounds(&o, d.data, KEEL_DURABLE_GROUP, 1, 12, 70, 2, kinds, (int)(sizeof kinds / sizeof kinds[0]));
    finish(&o, d.data, KEEL_DURABLE_GROUP, 1, 70);
    if (!o.failed && o.ckpt_recoveries == 0)
        ofail(&o, "no recovery started from a checkpoint");
    scenario_end(&o, &d, ref);
}
END_TEST

/* (e) IMMEDIATE: every tick reported as returned from keel_runtime_step is
 * recovered; GROUP (and DEFERRED): never past the last tick that ran, state as
 * the reference. */
START_TEST(test_durability_modes)
{
    static const int kinds[] = {0, 2, 2, 2};
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "(e) IMMEDIATE");
    crash_rounds(&o, d.data, KEEL_DURABLE_IMMEDIATE, 10, 8, 60, 3, kinds, 4);
    finish(&o, d.data, KEEL_DURABLE_IMMEDIATE, 10, 60);
    if (!o.failed && o.min_durable < 10)
        ofail(&o, "the IMMEDIATE rounds made no progress (min durable %" PRIu64 ")", o.min_durable);
    oracle_assert(&o, &d);

    tmpdir_make(&d);
    oracle_init(&o, ref, "(e) GROUP");
    crash_rounds(&o, d.data, KEEL_DURABLE_GROUP, 10, 8, 60, 4, kinds, 4);
    /* a GROUP child that holds after tick 47: recovery never goes past 47 */
    if (!o.failed && o.max_ran < 47) {
        plan p = base_plan(d.data, KEEL_DURABLE_GROUP, 10, 47);
        p.hold_at_end = true;
        run_child(&o, &p, (trigger){TRIG_NONE, 0}); /* slack 0 afterwards: R <= 47 is checked */
    }
    finish(&o, d.data, KEEL_DURABLE_GROUP, 10, 60);
    oracle_assert(&o, &d);

    /* DEFERRED ticks promise nothing before a flush, checkpoint or close: every
     * recovery is still a reference state, never past what ran, no acknowledged
     * (IMMEDIATE) transfer lost */
    tmpdir_make(&d);
    oracle_init(&o, ref, "(e) DEFERRED");
    crash_rounds(&o, d.data, KEEL_DURABLE_DEFERRED, 10, 6, 60, 5, kinds, 4);
    finish(&o, d.data, KEEL_DURABLE_DEFERRED, 10, 60);
    scenario_end(&o, &d, ref);
}
END_TEST

/* (f) keel_flush with DEFERRED ticks: after it returns a SIGKILL loses nothing. */
START_TEST(test_uow_flush)
{
    tmpdir d;
    oracle o;
    refdata *ref = scenario_begin(&d, &o, "(f) keel_flush");
    static const uint64_t at[] = {9, 21, 34};
    for (size_t i = 0; i < 3 && !o.failed; i++) {
        plan p = base_plan(d.data, KEEL_DURABLE_DEFERRED, -1, at[i]);
        p.flush_at = at[i];
        p.hold_at_end = true;
        run_child(&o, &p, (trigger){TRIG_NONE, 0});
        plan q = base_plan(d.data, KEEL_DURABLE_DEFERRED, -1, 0);
        q.hold_after_recover = true;
        run_child(&o, &q, (trigger){TRIG_NONE, 0});
        if (!o.failed && o.last_rec.tick != at[i])
            ofail(&o, "keel_flush returned after tick %" PRIu64 ", the child stopped there; recovered tick %" PRIu64,
                  at[i], o.last_rec.tick);
    }
    /* flush at 40, three more DEFERRED ticks, killed: somewhere in [40, 43] */
    plan p = base_plan(d.data, KEEL_DURABLE_DEFERRED, -1, 43);
    p.flush_at = 40;
    p.hold_at_end = true;
    run_child(&o, &p, (trigger){TRIG_NONE, 0});
    plan q = base_plan(d.data, KEEL_DURABLE_DEFERRED, -1, 0);
    q.hold_after_recover = true;
    run_child(&o, &q, (trigger){TRIG_NONE, 0});
    finish(&o, d.data, KEEL_DURABLE_DEFERRED, -1, 50);
    scenario_end(&o, &d, ref);
}
END_TEST

static Suite *crash_kill_suite(void)
{
    Suite *s = suite_create("crash_kill");
    TCase *tc = tcase_create("kill");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_kill_rounds);
    tcase_add_test(tc, test_kill_during_recovery);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *crash_cases_suite(void)
{
    Suite *s = suite_create("crash_cases");
    TCase *tc = tcase_create("cases");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_destroy_crash_twice);
    tcase_add_test(tc, test_spawn_never_written);
    tcase_add_test(tc, test_crash_right_after_recovery);
    tcase_add_test(tc, test_crash_during_checkpoint);
    tcase_add_test(tc, test_durability_modes);
    tcase_add_test(tc, test_uow_flush);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(crash_kill_suite, crash_cases_suite)
