/*
 * test_keel_crash.c -- keel-crash, the crash harness, as a black box: the
 * built binary (KEEL_CRASH_BIN) run in a child process, judged by its exit
 * status and its last line `crashes=<N> lost_acknowledged=<n>
 * hash_mismatches=<n> invariant_violations=<n>` (docs/reliability.md).
 *
 *   keel_crash         a few rounds of each mode (kill, failpoint, powerloss,
 *                      failover on a 3-node nats-server cluster it starts)
 *                      and of all four against keel-world: exit 0, crashes
 *                      happened, nothing lost, no mismatch, no violation (in
 *                      a sanitizer build, powerloss mode must refuse to run:
 *                      the shim cannot act there)
 *   keel_crash_oracle  the oracle can fail: KEEL_CRASH_SELFTEST skews one of
 *                      its inputs (hash: the reference runs another seed;
 *                      ack: acknowledgements are booked a tick late; money:
 *                      it expects one coin more; epoch: failover mode books
 *                      every acknowledgement in epoch 0, as if a deposed
 *                      primary had sent it), and keel-crash must then count
 *                      mismatches, lost trades, violations and exit 1; bad
 *                      arguments, a keel-world that cannot be run and
 *                      failover mode without nats-server exit 2
 */
#include <check.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/failpoint.h"
#include "keel_test.h"
#include "test_util.h"

/* Small and short: the sanitizer builds run these too. */
#define SMALL "--entities", "2000", "--until-tick", "60"

typedef struct summary {
    int status;            /* exit status; 128 + the signal when killed */
    bool have;             /* the last line parsed */
    uint64_t crashes, lost, mismatches, violations;
    char out[1 << 16];     /* the end of stdout and stderr, for failure messages */
} summary;

/* Run keel-crash with args (NULL-terminated), KEEL_CRASH_SELFTEST = selftest
 * (NULL: unset; each test runs in its own forked process, so the variable
 * reaches this run only). */
static void run_keel_crash(const char *selftest, const char *const *args, summary *s)
{
    memset(s, 0, sizeof *s);
    if (selftest)
        setenv("KEEL_CRASH_SELFTEST", selftest, 1);
    else
        unsetenv("KEEL_CRASH_SELFTEST");
    tu_run r = tu_run_argv(KEEL_CRASH_BIN, args);
    unsetenv("KEEL_CRASH_SELFTEST");
    s->status = r.status;
    size_t keep = sizeof s->out / 2 - 1;
    snprintf(s->out, sizeof s->out, "%s%s", r.outlen > keep ? r.out + r.outlen - keep : r.out,
             r.errlen > keep ? r.err + r.errlen - keep : r.err);
    const char *last = NULL;
    for (const char *q = r.out; (q = strstr(q, "crashes=")); q++)
        if (q == r.out || q[-1] == '\n')
            last = q;
    s->have = last && sscanf(last, "crashes=%" SCNu64 " lost_acknowledged=%" SCNu64 " hash_mismatches=%" SCNu64
                             " invariant_violations=%" SCNu64, &s->crashes, &s->lost, &s->mismatches,
                             &s->violations) == 4;
    tu_run_free(&r);
}

static void assert_clean(const summary *s, uint64_t min_crashes)
{
    ck_assert_msg(s->have, "no summary line; output:\n%s", s->out);
    ck_assert_msg(s->status == 0 && s->lost == 0 && s->mismatches == 0 && s->violations == 0,
                  "exit %d, lost %" PRIu64 ", mismatches %" PRIu64 ", violations %" PRIu64 "; output:\n%s", s->status,
                  s->lost, s->mismatches, s->violations, s->out);
    ck_assert_msg(s->crashes >= min_crashes, "only %" PRIu64 " crashes (expected >= %" PRIu64 "); output:\n%s",
                  s->crashes, min_crashes, s->out);
}

START_TEST(test_kill_mode)
{
    summary s;
    const char *args[] = {"--rounds", "8", "--mode", "kill", "--seed", "3", SMALL, NULL};
    run_keel_crash(NULL, args, &s);
    assert_clean(&s, 8);
    /* the table has the mode's row and the total */
    ck_assert_msg(strstr(s.out, "\nkill ") && strstr(s.out, "\nall "), "no table rows; output:\n%s", s.out);
}
END_TEST

/* The power-loss shim cannot act in a sanitizer build (the sanitizer's
 * runtime comes first and its interceptors bypass the shim). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

START_TEST(test_failpoint_mode)
{
    summary s;
    const char *args[] = {"--rounds", "10", "--mode", "failpoint", "--seed", "3", SMALL, NULL};
    run_keel_crash(NULL, args, &s);
    if (!keel_failpoints_compiled()) { /* -DKEEL_FAILPOINTS=OFF: refused, saying why */
        ck_assert_msg(s.status == 2 && strstr(s.out, "lists none (built with -DKEEL_FAILPOINTS=OFF?)") &&
                          strstr(s.out, "built with KEEL_FAILPOINTS=OFF: no failpoints"),
                      "exit %d; output:\n%s", s.status, s.out);
        return;
    }
    assert_clean(&s, 5);
    ck_assert_msg(strstr(s.out, "failpoints fired/armed"), "no failpoint counts; output:\n%s", s.out);
}
END_TEST

START_TEST(test_powerloss_mode)
{
    summary s;
    const char *args[] = {"--rounds", "8", "--mode", "powerloss", "--seed", "3", SMALL, NULL};
    run_keel_crash(NULL, args, &s);
    if (SANITIZED) { /* refused, never a run that cuts nothing */
        ck_assert_msg(s.status == 2 && strstr(s.out, "does not act"), "exit %d; output:\n%s", s.status, s.out);
        return;
    }
    assert_clean(&s, 6);
    ck_assert_msg(strstr(s.out, "powerloss: ") && strstr(s.out, " cuts ("), "no cut statistics; output:\n%s", s.out);
}
END_TEST

/* Failover mode and its own counters: promotions happened, none of them
 * left two primaries acknowledging. */
static void assert_failover(const summary *s)
{
    const char *line = strstr(s->out, "keel-crash: failover: ");
    uint64_t promotions = 0, two = 1;
    ck_assert_msg(line && sscanf(line, "keel-crash: failover: %" SCNu64 " promotions", &promotions) == 1 &&
                      promotions >= 1,
                  "no promotion counted; output:\n%s", s->out);
    const char *t = strstr(line, "two_primaries=");
    ck_assert_msg(t && sscanf(t, "two_primaries=%" SCNu64, &two) == 1 && two == 0, "two primaries; output:\n%s",
                  s->out);
}

START_TEST(test_failover_mode)
{
    summary s;
    const char *args[] = {"--rounds", "4", "--mode", "failover", "--seed", "3", SMALL, NULL};
    run_keel_crash(NULL, args, &s);
    assert_clean(&s, 2);
    assert_failover(&s);
    ck_assert_msg(strstr(s.out, "\nfailover "), "no table row; output:\n%s", s.out);
}
END_TEST

START_TEST(test_all_modes)
{
    if (SANITIZED || !keel_failpoints_compiled())
        return; /* the modes one by one above */
    summary s;
    const char *args[] = {"--rounds", "10", "--mode", "all", "--seed", "11", SMALL, NULL};
    run_keel_crash(NULL, args, &s);
    assert_clean(&s, 6);
    ck_assert_msg(strstr(s.out, "\nkill ") && strstr(s.out, "\nfailpoint ") && strstr(s.out, "\npowerloss ") &&
                      strstr(s.out, "\nfailover "),
                  "a mode is missing; output:\n%s", s.out);
}
END_TEST

/* The oracle can fail: run with the skew `selftest`; the count at `field`
 * must rise and the exit status be 1. With `alone`, the other counts stay 0
 * (the skew touches one input of the oracle only). */
static void oracle_must_fail(const char *selftest, size_t field, const char *what, bool alone)
{
    summary s;
    const char *mode = strcmp(selftest, "epoch") ? "kill" : "failover";
    const char *args[] = {"--rounds", "4", "--mode", mode, "--seed", "5", SMALL, NULL};
    run_keel_crash(selftest, args, &s);
    uint64_t counts = s.lost + s.mismatches + s.violations, mine = *(const uint64_t *)((const char *)&s + field);
    ck_assert_msg(s.have && s.status == 1 && mine > 0, "KEEL_CRASH_SELFTEST=%s (%s) went unnoticed: exit %d, "
                  "count %" PRIu64 "; output:\n%s", selftest, what, s.status, mine, s.out);
    ck_assert_msg(!alone || counts == mine, "KEEL_CRASH_SELFTEST=%s should only raise one count; output:\n%s",
                  selftest, s.out);
}

START_TEST(test_oracle_detects_wrong_reference)
{
    oracle_must_fail("hash", offsetof(summary, mismatches), "a reference run with another seed", false);
}
END_TEST

START_TEST(test_oracle_detects_lost_acks)
{
    oracle_must_fail("ack", offsetof(summary, lost), "acknowledgements booked a tick late", true);
}
END_TEST

START_TEST(test_oracle_detects_broken_economy)
{
    oracle_must_fail("money", offsetof(summary, violations), "one coin more expected", true);
}
END_TEST

START_TEST(test_oracle_detects_two_primaries)
{
    oracle_must_fail("epoch", offsetof(summary, lost), "acknowledgements booked in epoch 0", true);
}
END_TEST

START_TEST(test_bad_arguments)
{
    static const char *const bad[][8] = {
        {"--rounds", "0", NULL},
        {"--rounds", "x", NULL},
        {"--mode", "flood", NULL},
        {"--workload", "bank", NULL},
        {"--until-tick", NULL},
        {"--frobnicate", "1", NULL},
        {"--world", "/nonexistent/keel-world", NULL},
        {"--world", "/bin/true", "--mode", "kill", NULL}, /* runs, but reports nothing: no oracle */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        summary s;
        run_keel_crash(NULL, bad[i], &s);
        ck_assert_msg(s.status == 2 && !s.have, "keel-crash %s %s: exit %d (expected 2); output:\n%s", bad[i][0],
                      bad[i][1] ? bad[i][1] : "", s.status, s.out);
        ck_assert_msg(strstr(s.out, "keel-crash: "), "keel-crash %s: no message naming the problem", bad[i][0]);
    }
    summary s;
    setenv("PATH", "/nonexistent", 1); /* this test's own process */
    const char *fo[] = {"--mode", "failover", NULL};
    run_keel_crash(NULL, fo, &s);
    ck_assert_msg(s.status == 2 && strstr(s.out, "needs nats-server on the PATH"), "failover without nats-server: "
                  "exit %d; output:\n%s", s.status, s.out);
    const char *help[] = {"--help", NULL};
    run_keel_crash(NULL, help, &s);
    ck_assert_msg(s.status == 0 && strstr(s.out, "usage: keel-crash"), "--help: exit %d; output:\n%s", s.status,
                  s.out);
}
END_TEST

static Suite *keel_crash_suite(void)
{
    Suite *s = suite_create("keel_crash");
    TCase *tc = tcase_create("modes");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_kill_mode);
    tcase_add_test(tc, test_failpoint_mode);
    tcase_add_test(tc, test_powerloss_mode);
    tcase_add_test(tc, test_failover_mode);
    tcase_add_test(tc, test_all_modes);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *keel_crash_oracle_suite(void)
{
    Suite *s = suite_create("keel_crash_oracle");
    TCase *tc = tcase_create("oracle");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_oracle_detects_wrong_reference);
    tcase_add_test(tc, test_oracle_detects_lost_acks);
    tcase_add_test(tc, test_oracle_detects_broken_economy);
    tcase_add_test(tc, test_oracle_detects_two_primaries);
    tcase_add_test(tc, test_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(keel_crash_suite, keel_crash_oracle_suite)
