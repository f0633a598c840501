/*
 * test_demo.c -- keel-world, the demo world server, as a black box: the
 * built binary (KEEL_WORLD_BIN) run in child processes, read through its
 * report protocol (--report-fd, docs/demo.md) and its stdout.
 *
 *   demo_cli       bad arguments exit 2 naming the culprit; --help exits 0
 *   demo_runs      the same final hash in memory on 1 and 2 workers, with
 *                  a data directory, and at a tick rate beyond the machine; the economy's totals hold; the
 *                  trade prefix hashes chain (prefix j=0 of tick t+1 is
 *                  tick t's hash: the market runs first)
 *   demo_crash     SIGKILL after an acknowledged trade, restart: the
 *                  restarted run reports the acknowledged trade's ledgers
 *                  and values, and ends with the reference hash (the
 *                  TRANSIENT grid was rebuilt, or foraging would diverge)
 *   demo_slowdisk  every WAL commit delayed 40 ms (failpoint): ticks run
 *                  ahead of the disk, `settle` acknowledges trades ticks
 *                  later, in trade order, never more than 7 ticks behind
 *                  (it waits only then), and every trade by the final line
 *   demo_sigint    SIGINT stops a --forever run cleanly: exit 0, a final
 *                  line, a final checkpoint at the stop tick; a restart
 *                  continues to the reference hash
 */
#include <check.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel_test.h"
#include "test_util.h"

#define ENTITIES "3000"

typedef struct child {
    pid_t pid;
    FILE *report; /* the read end of --report-fd */
    FILE *out;    /* stdout */
} child;

/* Start keel-world with args (NULL-terminated) plus --report-fd 3. */
static void child_start(child *c, const char *const *args)
{
    int rep[2], out[2];
    ck_assert_int_eq(pipe(rep), 0);
    ck_assert_int_eq(pipe(out), 0);
    c->pid = fork();
    ck_assert_int_ge(c->pid, 0);
    if (c->pid == 0) {
        const char *argv[40] = {KEEL_WORLD_BIN};
        int n = 1;
        for (; args[n - 1] && n < 36; n++)
            argv[n] = args[n - 1];
        argv[n++] = "--report-fd";
        argv[n++] = "3";
        argv[n] = NULL;
        dup2(out[1], 1);
        dup2(rep[1], 3);
        for (int fd = 4; fd < 64; fd++)
            close(fd);
        execv(KEEL_WORLD_BIN, (char *const *)argv);
        _exit(127);
    }
    close(rep[1]);
    close(out[1]);
    c->report = fdopen(rep[0], "r");
    c->out = fdopen(out[0], "r");
    ck_assert_ptr_nonnull(c->report);
    ck_assert_ptr_nonnull(c->out);
}

/* Next report line (without its newline) into buf; false at EOF. */
static bool child_line(child *c, char *buf, size_t cap)
{
    if (!fgets(buf, (int)cap, c->report))
        return false;
    buf[strcspn(buf, "\n")] = 0;
    return true;
}

/* Read the rest of the report and stdout, reap the child; its wait status. */
static int child_finish(child *c, char *last_out, size_t cap)
{
    char buf[600];
    while (child_line(c, buf, sizeof buf))
        ;
    if (last_out)
        last_out[0] = 0;
    while (fgets(buf, sizeof buf, c->out))
        if (last_out)
            snprintf(last_out, cap, "%s", buf);
    fclose(c->report);
    fclose(c->out);
    int st = 0;
    ck_assert_int_eq(waitpid(c->pid, &st, 0), c->pid);
    return st;
}

/* Run to completion; the `final` line's hash (fails the test on a bad exit). */
static uint64_t run_final(const char *const *args)
{
    child c;
    child_start(&c, args);
    char buf[600];
    uint64_t hash = 0, tick;
    bool seen = false;
    while (child_line(&c, buf, sizeof buf))
        if (sscanf(buf, "final tick=%" SCNu64 " hash=%" SCNx64, &tick, &hash) == 2)
            seen = true;
    int st = child_finish(&c, NULL, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "keel-world exited with status %d", st);
    ck_assert_msg(seen, "no final line in the report");
    return hash;
}

/* keel-world with args: its exit status; the first line of its stderr in err_line. */
static int run_status(const char *const *args, char *err_line, size_t cap)
{
    tu_run r = tu_run_argv(KEEL_WORLD_BIN, args);
    size_t n = strcspn(r.err, "\n");
    snprintf(err_line, cap, "%.*s", (int)(n + (r.err[n] == '\n')), r.err);
    int status = r.status;
    tu_run_free(&r);
    return status;
}

START_TEST(cli_bad_arguments)
{
    char err[600];
    static const char *const cases[][4] = {
        {"--workers", "0", NULL},      {"--durability", "sometimes", NULL}, {"--until-tick", "-3", NULL},
        {"--bogus", NULL},             {"--forever", "--until-tick", "5", NULL}, {"--data", NULL},
        {"--report-fd", "x", NULL},
    };
    static const char *const culprit[] = {"--workers", "--durability", "--until-tick", "--bogus",
                                          "--forever", "--data", "--report-fd"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_int_eq(run_status(cases[i], err, sizeof err), 2);
        ck_assert_msg(strstr(err, culprit[i]), "stderr '%s' does not name %s", err, culprit[i]);
    }
    ck_assert_int_eq(run_status((const char *const[]){"--help", NULL}, err, sizeof err), 0);

    /* --list-failpoints: keel_failpoint_name's list, one per line */
    tu_run r = tu_run_argv(KEEL_WORLD_BIN, (const char *const[]){"--list-failpoints", NULL});
    ck_assert_int_eq(r.status, 0);
    size_t n = 0;
    for (const char *p = r.out; *p; p++)
        n += *p == '\n';
    if (keel_failpoints_compiled()) {
        ck_assert_ptr_nonnull(strstr(r.out, "wal.before_commit\n"));
        ck_assert_ptr_nonnull(strstr(r.out, "recover.mid_replay\n"));
        size_t want = 0;
        while (keel_failpoint_name(want))
            want++;
        ck_assert_uint_eq(n, want);
    }
    tu_run_free(&r);
}
END_TEST

START_TEST(runs_same_hash_everywhere)
{
    char data[300];
    tu_path(data, sizeof data, "w");
    uint64_t h1 = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "60",
                                                  "--tick-rate", "0", "--quiet", "--workers", "1", NULL});
    uint64_t h2 = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "60",
                                                  "--tick-rate", "0", "--quiet", "--workers", "2", NULL});
    uint64_t h3 = run_final((const char *const[]){"--data", data, "--entities", ENTITIES, "--until-tick", "60",
                                                  "--tick-rate", "0", "--quiet", "--workers", "2", NULL});
    /* a tick rate the machine cannot hold: the overload detector may throttle
     * and modulate, but the world's systems are HIGH/CRITICAL and world time
     * is per tick, so the hash cannot move */
    uint64_t h5 = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "60",
                                                  "--tick-rate", "20000", "--quiet", NULL});
    ck_assert_uint_eq(h1, h2);
    ck_assert_uint_eq(h1, h3);
    ck_assert_uint_eq(h1, h5);
    uint64_t h4 = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "60",
                                                  "--tick-rate", "0", "--quiet", "--seed", "2", NULL});
    ck_assert_uint_ne(h1, h4); /* the seed matters */
}
END_TEST

/* The report of one run: prefix hashes chain with tick hashes, every trade
 * is acknowledged once, the final state-end keeps the economy's totals. */
START_TEST(runs_report_protocol)
{
    child c;
    child_start(&c, (const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "30", "--tick-rate",
                                          "0", "--quiet", "--report-prefix", NULL});
    char buf[600];
    uint64_t tick_hash[32] = {0}, t, h, id, last_id = 0;
    unsigned j, items, dups, acks = 0, prefixes = 0, chained = 0;
    int64_t money = -1;
    while (child_line(&c, buf, sizeof buf)) {
        if (sscanf(buf, "tick t=%" SCNu64 " hash=%" SCNx64, &t, &h) == 2 && t < 32) {
            tick_hash[t] = h;
        } else if (sscanf(buf, "prefix t=%" SCNu64 " j=%u hash=%" SCNx64, &t, &j, &h) == 3) {
            prefixes++;
            if (j == 0 && t >= 2 && t < 32) {
                ck_assert_uint_eq(h, tick_hash[t - 1]);
                chained++;
            }
        } else if (sscanf(buf, "ack id=%" SCNu64 " t=%" SCNu64, &id, &t) == 2) {
            ck_assert_uint_gt(id, last_id); /* acknowledged in trade order, each once */
            ck_assert_uint_eq((id - 1) / 8, t);
            last_id = id;
            acks++;
        } else if (sscanf(buf, "state-end money=%" SCNd64 " items=%u dups=%u", &money, &items, &dups) == 3) {
            ;
        }
    }
    int st = child_finish(&c, NULL, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_uint_eq(acks, 30 * 8);          /* every trade of every tick, refused ones included */
    ck_assert_uint_eq(prefixes, 30 * (8 + 1)); /* j = 0..8 per tick */
    ck_assert_uint_eq(chained, 29);
    ck_assert_int_eq(money, 64 * 1000 + 8 * 5000);
    ck_assert_uint_eq(items, 48);
    ck_assert_uint_eq(dups, 0);
}
END_TEST

typedef struct acked {
    uint64_t id, a, b;
    int64_t a_coins, b_coins;
} acked;

/* Kill a durable run right after its n-th acknowledgement; restart it to
 * the end and check the acknowledged trades and the final hash. */
static void crash_after_ack(unsigned n, uint64_t ref)
{
    char name[32], data[300], buf[600];
    snprintf(name, sizeof name, "crash-%u", n);
    tu_path(data, sizeof data, name);
    const char *const args[] = {"--data", data, "--entities", ENTITIES, "--until-tick", "80", "--tick-rate", "0",
                                "--quiet", "--checkpoint-every", "25", NULL};
    child c;
    child_start(&c, args);
    acked last = {0};
    unsigned acks = 0;
    while (acks < n && child_line(&c, buf, sizeof buf))
        if (sscanf(buf, "ack id=%" SCNu64 " t=%*u a=%" SCNx64 " b=%" SCNx64 " a_coins=%" SCNd64 " b_coins=%" SCNd64,
                   &last.id, &last.a, &last.b, &last.a_coins, &last.b_coins) == 5)
            acks++;
    ck_assert_uint_eq(acks, n);
    kill(c.pid, SIGKILL);
    int st = child_finish(&c, NULL, 0);
    ck_assert(WIFSIGNALED(st));

    child_start(&c, args);
    uint64_t e, ledger, final = 0, t;
    int64_t coins;
    bool saw_a = false, saw_b = false, started = false;
    while (child_line(&c, buf, sizeof buf)) {
        if (!strncmp(buf, "start fresh=0", 13))
            started = true;
        if (sscanf(buf, "acct e=%" SCNx64 " kind=%*s coins=%" SCNd64 " ledger=%" SCNu64, &e, &coins, &ledger) == 3 &&
            !final) {
            if (e == last.a || e == last.b) {
                /* the acknowledged trade survived: ledger at least its id,
                 * and exactly its values when nothing later touched it */
                ck_assert_uint_ge(ledger, last.id);
                if (ledger == last.id)
                    ck_assert_int_eq(coins, e == last.a ? last.a_coins : last.b_coins);
                *(e == last.a ? &saw_a : &saw_b) = true;
            }
        }
        sscanf(buf, "final tick=%" SCNu64 " hash=%" SCNx64, &t, &final);
    }
    st = child_finish(&c, NULL, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "restart exited with status %d", st);
    ck_assert(started && saw_a && saw_b);
    ck_assert_uint_eq(final, ref);
}

START_TEST(crash_after_acknowledgements)
{
    uint64_t ref = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "80",
                                                   "--tick-rate", "0", "--quiet", NULL});
    const unsigned n[] = {1, 37, 203, 401};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
        crash_after_ack(n[i], ref);
}
END_TEST

START_TEST(slow_disk_acknowledges_later)
{
    if (!keel_failpoints_compiled())
        return; /* -DKEEL_FAILPOINTS=OFF: no way to slow the disk down */
    char data[300], buf[600];
    tu_path(data, sizeof data, "slow");
    setenv("KEEL_FAILPOINTS", "wal.before_commit=delay:40", 1);
    child c;
    child_start(&c, (const char *const[]){"--data", data, "--entities", ENTITIES, "--until-tick", "40", "--tick-rate",
                                          "0", "--quiet", "--checkpoint-every", "0", NULL});
    unsetenv("KEEL_FAILPOINTS");
    uint64_t t, id, last_id = 0, last_tick = 0;
    unsigned acks = 0;
    bool final = false;
    while (child_line(&c, buf, sizeof buf)) {
        if (sscanf(buf, "ack id=%" SCNu64 " t=%" SCNu64, &id, &t) == 2) {
            ck_assert_uint_gt(id, last_id); /* trade order, each once */
            ck_assert_uint_eq((id - 1) / 8, t);
            ck_assert_msg(!final, "an acknowledgement after the final line");
            last_id = id;
            acks++;
        } else if (sscanf(buf, "tick t=%" SCNu64, &t) == 1) {
            /* after tick t's settle at most the trades of ticks t-6..t are
             * in flight: every trade of tick t-7 and before is acknowledged */
            if (t > 7)
                ck_assert_msg(last_id >= (t - 6) * 8, "tick %" PRIu64 ": trades acknowledged up to id %" PRIu64
                              " only", t, last_id);
            last_tick = t;
        } else if (!strncmp(buf, "final ", 6)) {
            ck_assert_uint_eq(acks, 40 * 8); /* every trade, before the final line */
            final = true;
        }
    }
    int st = child_finish(&c, NULL, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "keel-world exited with status %d", st);
    ck_assert(final);
    ck_assert_uint_eq(last_tick, 40);
}
END_TEST

START_TEST(sigint_stops_cleanly)
{
    char data[300], buf[600], out[600];
    tu_path(data, sizeof data, "w");
    child c;
    child_start(&c, (const char *const[]){"--data", data, "--entities", ENTITIES, "--forever", "--tick-rate", "0",
                                          "--quiet", NULL});
    uint64_t t = 0, h, stop_tick = 0, stop_hash = 0;
    while (child_line(&c, buf, sizeof buf)) {
        if (sscanf(buf, "tick t=%" SCNu64, &t) == 1 && t == 12)
            kill(c.pid, SIGINT);
        if (sscanf(buf, "final tick=%" SCNu64 " hash=%" SCNx64, &stop_tick, &h) == 2)
            stop_hash = h;
    }
    int st = child_finish(&c, out, sizeof out);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGINT: status %d", st);
    ck_assert_uint_ge(stop_tick, 12);
    ck_assert_msg(strstr(out, "final tick="), "last stdout line '%s'", out);
    ck_assert(stop_hash != 0);

    /* the restart starts from the stop tick's final checkpoint and ends on the reference */
    const char *const args[] = {"--data", data, "--entities", ENTITIES, "--until-tick", "60", "--tick-rate", "0",
                                "--quiet", NULL};
    child_start(&c, args);
    uint64_t start_tick = 0, final = 0;
    while (child_line(&c, buf, sizeof buf)) {
        sscanf(buf, "start fresh=0 tick=%" SCNu64, &start_tick);
        sscanf(buf, "final tick=%" SCNu64 " hash=%" SCNx64, &t, &final);
    }
    uint64_t rec_tick = 0, ckpt_tick = 0;
    ck_assert_msg(fgets(out, sizeof out, c.out) && sscanf(out, "recovered tick=%" SCNu64 " in %*f ms (checkpoint tick %"
                  SCNu64, &rec_tick, &ckpt_tick) == 2, "first stdout line '%s'", out);
    st = child_finish(&c, out, sizeof out);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_uint_eq(start_tick, stop_tick);
    ck_assert_uint_eq(rec_tick, stop_tick);
    ck_assert_uint_eq(ckpt_tick, stop_tick); /* the final checkpoint of the clean stop */
    uint64_t ref = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", "60",
                                                   "--tick-rate", "0", "--quiet", NULL});
    ck_assert_uint_eq(final, ref);
}
END_TEST

/* A suite of one case holding test; its data directories live under the
 * case's base directory, removed by the fixture (after a failure too). */
static Suite *one_case(const char *name, const TTest *test, int timeout)
{
    Suite *s = suite_create(name);
    TCase *t = tcase_create(name);
    tcase_add_unchecked_fixture(t, tu_base_setup, tu_base_teardown);
    tcase_set_timeout(t, timeout);
    tcase_add_test(t, test);
    suite_add_tcase(s, t);
    return s;
}

static Suite *demo_cli(void)
{
    return one_case("demo_cli", cli_bad_arguments, 60);
}

static Suite *demo_runs(void)
{
    Suite *s = one_case("demo_runs", runs_same_hash_everywhere, 300);
    TCase *t = tcase_create("report");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, runs_report_protocol);
    suite_add_tcase(s, t);
    return s;
}

static Suite *demo_crash(void)
{
    return one_case("demo_crash", crash_after_acknowledgements, 300);
}

static Suite *demo_slowdisk(void)
{
    return one_case("demo_slowdisk", slow_disk_acknowledges_later, 300);
}

static Suite *demo_sigint(void)
{
    return one_case("demo_sigint", sigint_stops_cleanly, 300);
}

KEEL_TEST_MAIN(demo_cli, demo_runs, demo_crash, demo_slowdisk, demo_sigint)
