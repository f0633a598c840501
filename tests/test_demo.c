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
 *   demo_server    keel-world as a server: contradictory flags and options
 *                  naming what cannot be had (a closed --report-fd, a
 *                  --trace path that cannot be created) are refused before
 *                  anything starts, one line each; world.params records the
 *                  seed and entities, a run contradicting it exits 2, a run
 *                  without them continues the recorded world; --until-tick
 *                  below the recovered tick exits 2; a second server on a
 *                  held directory exits 1 naming the holder while the first
 *                  runs on; `keel-wal backup` (KEEL_WAL_BIN) of the live
 *                  server, which is then killed, recovers and ends on the
 *                  reference hash; a damaged data.mdb exits 1, untouched;
 *                  on a terminal (a pty) every status line fits its width,
 *                  a resize (SIGWINCH) is followed, --memory shows no WAL
 *                  fields; in a pipe there is no status line at --quiet
 */
#include <check.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
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
    /* the smallest pipe: the child runs at most a few ticks ahead of what
       the test read, so a kill after a report line lands before its end */
    ck_assert_int_ge(fcntl(rep[1], F_SETPIPE_SZ, 4096), 4096);
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
        {"--report-fd", "x", NULL},    {"--failpoints", NULL},          {"--failpoints", "no.such.point=crash", NULL},
    };
    static const char *const culprit[] = {"--workers", "--durability", "--until-tick", "--bogus",
                                          "--forever", "--data", "--report-fd", "--failpoints", "no.such.point"};
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

/* --failpoints arms what keel accepts (a hit that never comes: the run ends
 * normally) and refuses, with exit 2, what it does not: keel-crash's probe. */
START_TEST(cli_failpoints_probe)
{
    char err[600];
    const char *const base[] = {"--memory", "--until-tick", "1", "--entities", "0", "--quiet", "--failpoints"};
    const char *specs[] = {"wal.before_commit=eio@1000000000", "wal.after_commit=crash@1000000000",
                           "wal.after_commit=eio@1000000000"};
    const int want[] = {0, 0, 2};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        const char *args[9];
        memcpy(args, base, sizeof base);
        args[7] = specs[i];
        args[8] = NULL;
        int st = run_status(args, err, sizeof err);
        ck_assert_msg(st == (keel_failpoints_compiled() ? want[i] : 2), "%s: exit %d (%s)", specs[i], st, err);
        if (st == 2) /* the flag and the spec it refused (compiled out: every spec) */
            ck_assert_msg(strstr(err, "--failpoints") && strstr(err, "wal."), "stderr '%s' names no culprit", err);
    }
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
    /* --failpoints, not KEEL_FAILPOINTS: a spec keel-world cannot arm
     * fails the run (exit 2) instead of being ignored with a warning */
    child c;
    child_start(&c, (const char *const[]){"--data", data, "--entities", ENTITIES, "--until-tick", "40", "--tick-rate",
                                          "0", "--quiet", "--checkpoint-every", "0", "--failpoints",
                                          "wal.before_commit=delay:40", NULL});
    uint64_t t, id, last_id = 0, last_tick = 0, most_behind = 0;
    unsigned acks = 0;
    bool final = false;
    while (child_line(&c, buf, sizeof buf)) {
        if (sscanf(buf, "ack id=%" SCNu64 " t=%" SCNu64, &id, &t) == 2) {
            ck_assert_uint_gt(id, last_id); /* trade order, each once */
            ck_assert_uint_eq((id - 1) / 8, t);
            ck_assert_msg(!final, "an acknowledgement after the final line");
            ck_assert_uint_ge(last_tick + 1, t); /* acknowledged in its own tick's settle or later */
            if (last_tick + 1 - t > most_behind)
                most_behind = last_tick + 1 - t; /* the acknowledging tick's distance from the trade's */
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
    /* trades were acknowledged ticks after their own, never more than the
     * settle's limit behind */
    ck_assert_uint_ge(most_behind, 2);
    ck_assert_uint_le(most_behind, 7);
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

    /* the restart starts from the stop tick's final checkpoint and ends on the reference (past the stop tick,
       however far the unthrottled run got before the signal landed) */
    char until[32];
    snprintf(until, sizeof until, "%" PRIu64, stop_tick + 48);
    const char *const args[] = {"--data", data, "--entities", ENTITIES, "--until-tick", until, "--tick-rate", "0",
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
    uint64_t ref = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", until,
                                                   "--tick-rate", "0", "--quiet", NULL});
    ck_assert_uint_eq(final, ref);
}
END_TEST

/* ---- demo_server ------------------------------------------------------------------------------ */

/* keel-world with args: exit 2, one line on stderr naming culprit, nothing on stdout. */
static void refused(const char *const *args, const char *culprit)
{
    tu_run r = tu_run_argv(KEEL_WORLD_BIN, args);
    ck_assert_msg(r.status == 2, "'%s ...': exit %d (want 2): %s", args[0], r.status, r.err);
    ck_assert_msg(strstr(r.err, culprit), "stderr does not name '%s': %s", culprit, r.err);
    ck_assert_msg(tu_count_lines(r.err) == 1, "want one line on stderr: %s", r.err);
    ck_assert_msg(r.outlen == 0, "stdout: %s", r.out);
    tu_run_free(&r);
}

START_TEST(server_refusals)
{
    char data[300], trace[300];
    tu_path(data, sizeof data, "never");
    tu_path(trace, sizeof trace, "no-such-dir/trace.json");
    refused((const char *const[]){"--memory", "--data", data, NULL}, "--memory and --data exclude each other");
    refused((const char *const[]){"--forever", "--until-tick", "9", NULL}, "--forever and --until-tick");
    refused((const char *const[]){"--memory", "--report-prefix", NULL}, "--report-prefix needs --report-fd");
    refused((const char *const[]){"--memory", "--report-fd", "1000", NULL}, "--report-fd 1000: descriptor 1000 is not open");
    refused((const char *const[]){"--data", data, "--trace", trace, NULL}, "--trace");
    refused((const char *const[]){"--workers", "1000", NULL}, "--workers needs -1 or a number in [1, 64], got '1000'");
    /* the replication flags' syntax: refused before anything connects or opens */
    refused((const char *const[]){"--data", data, "--replicate", "sync", "--nats", "http://127.0.0.1:1", "--world",
                                  "w1", NULL}, "'http://127.0.0.1:1' is not nats://HOST:PORT");
    refused((const char *const[]){"--data", data, "--follow", "--nats", "nats://127.0.0.1:1", "--world", "two words",
                                  NULL}, "the world's name 'two words'");
    /* two bad options: a line for each */
    tu_run r = tu_run_argv(KEEL_WORLD_BIN, (const char *const[]){"--workers", "0", "--seed", "x", NULL});
    ck_assert_int_eq(r.status, 2);
    ck_assert_uint_eq(tu_count_lines(r.err), 2);
    ck_assert(strstr(r.err, "--workers") && strstr(r.err, "--seed"));
    tu_run_free(&r);
    /* nothing started: the data directory was never made */
    ck_assert_int_ne(access(data, F_OK), 0);
}
END_TEST

/* A run's exit status and its stdout and stderr (freed by the caller). */
static tu_run world(const char *const *args)
{
    return tu_run_argv(KEEL_WORLD_BIN, args);
}

static uint64_t final_hash(const char *out)
{
    const char *f = strstr(out, "final tick=");
    uint64_t t, h = 0;
    ck_assert_msg(f && sscanf(f, "final tick=%" SCNu64 " hash=%" SCNx64, &t, &h) == 2, "no final line: %s", out);
    return h;
}

START_TEST(server_params)
{
    char data[300], params[340], mdb[340];
    tu_path(data, sizeof data, "w");
    snprintf(params, sizeof params, "%s/world.params", data);
    snprintf(mdb, sizeof mdb, "%s/data.mdb", data);
    tu_run r = world((const char *const[]){"--data", data, "--seed", "3", "--entities", ENTITIES, "--until-tick", "20",
                                           "--tick-rate", "0", "--quiet", NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    tu_run_free(&r);
    FILE *f = fopen(params, "r");
    ck_assert_ptr_nonnull(f);
    char text[400] = {0};
    ck_assert_uint_gt(fread(text, 1, sizeof text - 1, f), 0);
    fclose(f);
    ck_assert_msg(strstr(text, "\nseed=3\n") && strstr(text, "\nentities=" ENTITIES "\n"), "%s", text);

    /* another seed or entity count: refused, the directory untouched */
    tu_digest d0 = tu_file_digest(mdb);
    refused((const char *const[]){"--data", data, "--seed", "7", "--until-tick", "30", "--tick-rate", "0", "--quiet",
                                  NULL}, "--seed 7 contradicts the world");
    r = world((const char *const[]){"--data", data, "--seed", "7", NULL});
    ck_assert(strstr(r.err, "created with --seed 3") && strstr(r.err, "fresh --data DIR"));
    tu_run_free(&r);
    refused((const char *const[]){"--data", data, "--entities", "5000", NULL}, "--entities 5000 contradicts the world");
    tu_assert_digest_eq(d0, tu_file_digest(mdb));

    /* without them the recorded ones hold: the run ends on the seed-3 world's hash; the same seed continues too */
    r = world((const char *const[]){"--data", data, "--until-tick", "30", "--tick-rate", "0", "--quiet", NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    tu_run_free(&r);
    r = world((const char *const[]){"--data", data, "--seed", "3", "--until-tick", "40", "--tick-rate", "0", "--quiet",
                                    NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    uint64_t h = final_hash(r.out);
    tu_run_free(&r);
    ck_assert_uint_eq(h, run_final((const char *const[]){"--memory", "--seed", "3", "--entities", ENTITIES,
                                                         "--until-tick", "40", "--tick-rate", "0", "--quiet", NULL}));

    /* a world without its record: its schema still names its parameters (the tag "world seed=S
       entities=N"), so a run giving others is refused at open (exit 1, naming both) and records nothing;
       this run's flags, the world's, are recorded with a note */
    ck_assert_int_eq(unlink(params), 0);
    r = world((const char *const[]){"--data", data, "--seed", "3", "--until-tick", "41", "--tick-rate", "0", "--quiet",
                                    NULL});
    ck_assert_msg(r.status == 1 && strstr(r.err, "'world seed=3 entities=" ENTITIES "' in the data directory") &&
                      strstr(r.err, "'world seed=3 entities=100000' is registered"), "%d %s", r.status, r.err);
    tu_run_free(&r);
    ck_assert_int_ne(access(params, F_OK), 0);
    r = world((const char *const[]){"--data", data, "--seed", "3", "--entities", ENTITIES, "--until-tick", "41",
                                    "--tick-rate", "0", "--quiet", NULL});
    ck_assert_msg(r.status == 0 && strstr(r.err, "has no world.params: recording --seed 3"), "%s", r.err);
    tu_run_free(&r);
    ck_assert_int_eq(access(params, F_OK), 0);
    refused((const char *const[]){"--data", data, "--seed", "4", NULL}, "--seed 4 contradicts the world");
    /* an unreadable record: exit 1 naming the file and the line */
    tu_write_file(params, "seed=3\nentities=lots\n", 21);
    r = world((const char *const[]){"--data", data, "--until-tick", "42", NULL});
    ck_assert_msg(r.status == 1 && strstr(r.err, "world.params: unreadable line 'entities=lots'"), "%d %s", r.status,
                  r.err);
    tu_run_free(&r);
    tu_write_file(params, "seed=3\n", 7);
    r = world((const char *const[]){"--data", data, "--until-tick", "42", NULL});
    ck_assert_msg(r.status == 1 && strstr(r.err, "world.params lacks entities="), "%d %s", r.status, r.err);
    tu_run_free(&r);
    tu_write_file(params, "seed=3\nentities=" ENTITIES "\n", strlen("seed=3\nentities=" ENTITIES "\n"));

    /* a tick the world is past: exit 2, saying so, no final line */
    r = world((const char *const[]){"--data", data, "--until-tick", "25", "--quiet", NULL});
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "is at tick 41, past --until-tick 25"), "%s", r.err);
    ck_assert_ptr_null(strstr(r.out, "final tick="));
    tu_run_free(&r);
}
END_TEST

START_TEST(server_owned_and_backup)
{
    char data[300], bk[300], buf[600], want[64];
    tu_path(data, sizeof data, "live");
    tu_path(bk, sizeof bk, "backup");
    child c;
    child_start(&c, (const char *const[]){"--data", data, "--entities", ENTITIES, "--forever", "--tick-rate", "0",
                                          "--quiet", "--checkpoint-every", "15", NULL});
    uint64_t t = 0;
    while (t < 30 && child_line(&c, buf, sizeof buf))
        sscanf(buf, "tick t=%" SCNu64, &t);
    ck_assert_uint_ge(t, 30);

    /* a second server: refused at once, naming the holder; the first runs on */
    tu_run r = world((const char *const[]){"--data", data, "--until-tick", "200", "--tick-rate", "0", "--quiet", NULL});
    snprintf(want, sizeof want, "in use by process %ld", (long)c.pid);
    ck_assert_msg(r.status == 1 && strstr(r.err, want), "second server: exit %d: %s", r.status, r.err);
    tu_run_free(&r);
    uint64_t t2 = t;
    while (t2 < t + 5 && child_line(&c, buf, sizeof buf))
        sscanf(buf, "tick t=%" SCNu64, &t2);
    ck_assert_uint_ge(t2, t + 5);

    /* a backup of the live directory, then the server dies */
    r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"backup", data, bk, NULL});
    ck_assert_msg(r.status == 0 && strstr(r.out, "backup: "), "keel-wal backup: exit %d: %s", r.status, r.err);
    tu_run_free(&r);
    kill(c.pid, SIGKILL);
    int st = child_finish(&c, NULL, 0);
    ck_assert(WIFSIGNALED(st));

    /* the backup recovers a completed tick and ends where an uninterrupted run ends (the server ran unthrottled
       until the backup: the end lies past the backup's last tick, however far it got). That tick is the WAL's last
       committed one, or the checkpoint's when none after it is (a backup right after a checkpoint) */
    r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"info", bk, NULL});
    const char *last = strstr(r.out, "last committed tick "), *ckpt = strstr(r.out, "checkpoint   tick ");
    uint64_t committed = 0, checkpointed = 0;
    bool read = (last || ckpt) && (!last || sscanf(last, "last committed tick %" SCNu64, &committed) == 1) &&
                (!ckpt || sscanf(ckpt, "checkpoint   tick %" SCNu64, &checkpointed) == 1);
    ck_assert_msg(r.status == 0 && read, "%s%s", r.out, r.err);
    uint64_t backed = committed > checkpointed ? committed : checkpointed;
    tu_run_free(&r);
    char until[32];
    snprintf(until, sizeof until, "%" PRIu64, backed + 40);
    uint64_t ref = run_final((const char *const[]){"--memory", "--entities", ENTITIES, "--until-tick", until,
                                                   "--tick-rate", "0", "--quiet", NULL});
    r = world((const char *const[]){"--data", bk, "--until-tick", until, "--tick-rate", "0", "--quiet", NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    uint64_t rec = 0;
    const char *line = strstr(r.out, "recovered tick=");
    ck_assert_msg(line && sscanf(line, "recovered tick=%" SCNu64, &rec) == 1, "%s", r.out);
    ck_assert_uint_ge(rec, 30);
    ck_assert_uint_eq(rec, backed); /* the backup's last completed tick, nothing more or less */
    ck_assert_uint_eq(final_hash(r.out), ref);
    tu_run_free(&r);
}
END_TEST

START_TEST(server_damaged_file)
{
    char made[300], compact[300], good[340];
    tu_path(made, sizeof made, "made");
    tu_path(compact, sizeof compact, "compact");
    snprintf(good, sizeof good, "%s/data.mdb", compact);
    tu_run r = world((const char *const[]){"--data", made, "--entities", ENTITIES, "--until-tick", "20", "--tick-rate",
                                           "0", "--quiet", NULL});
    ck_assert_int_eq(r.status, 0);
    tu_run_free(&r);
    /* compacted: no free pages, so each cut takes pages the trees use (a free page past a live file's end is no
     * damage) */
    r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"backup", made, compact, NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    tu_run_free(&r);
    for (int d = 0; d < TU_DAMAGE_COUNT; d++) {
        char name[32], data[300], mdb[340], params[340], src[340];
        snprintf(name, sizeof name, "damaged-%d", d);
        tu_path(data, sizeof data, name);
        ck_assert_int_eq(mkdir(data, 0755), 0);
        snprintf(mdb, sizeof mdb, "%s/data.mdb", data);
        snprintf(params, sizeof params, "%s/world.params", data);
        snprintf(src, sizeof src, "%s/world.params", compact);
        tu_copy_file(good, mdb);
        tu_copy_file(src, params);
        tu_damage_apply(mdb, (tu_damage)d);
        tu_digest d0 = tu_file_digest(mdb);
        uint64_t m0 = tu_file_mtime_ns(mdb);
        r = world((const char *const[]){"--data", data, "--until-tick", "40", "--tick-rate", "0", "--quiet", NULL});
        ck_assert_msg(r.status == 1, "%s: exit %d (want 1, never a signal): %s", tu_damages[d].name, r.status, r.err);
        ck_assert_msg(strstr(r.err, "KEEL_ECORRUPT") && strstr(r.err, "data.mdb is damaged") &&
                      strstr(r.err, tu_damages[d].says), "%s: %s", tu_damages[d].name, r.err);
        ck_assert_ptr_null(strstr(r.out, "final tick="));
        tu_run_free(&r);
        tu_assert_digest_eq(d0, tu_file_digest(mdb));
        ck_assert_uint_eq(m0, tu_file_mtime_ns(mdb));
    }
}
END_TEST

/* keel-world on a pseudo-terminal of `cols` columns as its stdout and
 * controlling terminal (so a resize sends it SIGWINCH). */
typedef struct pty_child {
    pid_t pid;
    int master;
    char buf[1 << 16];
    size_t len;
} pty_child;

static void pty_start(pty_child *p, unsigned short cols, const char *const *args)
{
    p->len = 0;
    p->master = posix_openpt(O_RDWR | O_NOCTTY);
    ck_assert_int_ge(p->master, 0);
    ck_assert_int_eq(grantpt(p->master), 0);
    ck_assert_int_eq(unlockpt(p->master), 0);
    struct winsize ws = {.ws_row = 24, .ws_col = cols};
    ck_assert_int_eq(ioctl(p->master, TIOCSWINSZ, &ws), 0);
    const char *slave = ptsname(p->master);
    ck_assert_ptr_nonnull(slave);
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        setsid();
        int fd = open(slave, O_RDWR);
        if (fd < 0 || ioctl(fd, TIOCSCTTY, 0) < 0)
            _exit(126);
        dup2(fd, 1);
        const char *argv[24] = {KEEL_WORLD_BIN};
        for (int n = 0; args[n] && n < 22; n++)
            argv[n + 1] = args[n];
        execv(KEEL_WORLD_BIN, (char *const *)argv);
        _exit(127);
    }
}

/* Read until `want` appears after offset `from` (true) or the child's end (false). */
static bool pty_until(pty_child *p, size_t from, const char *want)
{
    for (;;) {
        p->buf[p->len] = 0;
        if (p->len > from && strstr(p->buf + from, want))
            return true;
        if (p->len + 1 >= sizeof p->buf)
            return false;
        ssize_t n = read(p->master, p->buf + p->len, sizeof p->buf - 1 - p->len);
        if (n <= 0) /* EIO once the child closed the terminal */
            return false;
        p->len += (size_t)n;
    }
}

/* Every status line in buf[from, to): they are drawn as "\r<line>\033[K". */
static void status_lines_fit(const pty_child *p, size_t from, size_t to, size_t cols, unsigned *n, bool *wide)
{
    for (size_t i = from; i < to; i++) {
        if (p->buf[i] != '\r' || strncmp(p->buf + i + 1, "tick=", 5))
            continue;
        const char *end = strstr(p->buf + i + 1, "\033[K");
        ck_assert_ptr_nonnull(end);
        size_t len = (size_t)(end - (p->buf + i + 1));
        ck_assert_msg(len < cols, "a status line of %zu columns on a terminal of %zu: %.*s", len, cols, (int)len,
                      p->buf + i + 1);
        ck_assert_msg(!memchr(p->buf + i + 1, '\n', len), "a status line holds a newline");
        *wide |= memmem(p->buf + i + 1, len, "entities=", 9) != NULL;
        (*n)++;
    }
}

START_TEST(server_status_line_fits)
{
    char data[300];
    tu_path(data, sizeof data, "tty");
    pty_child p;
    pty_start(&p, 40, (const char *const[]){"--data", data, "--entities", ENTITIES, "--forever", "--tick-rate", "60",
                                            NULL});
    /* 40 columns: the first fields of the priority order only */
    ck_assert(pty_until(&p, 0, "\033[K"));
    size_t narrow_end = p.len;
    unsigned n = 0;
    bool wide = false;
    status_lines_fit(&p, 0, narrow_end, 40, &n, &wide);
    ck_assert_uint_ge(n, 1);
    ck_assert(!wide);
    /* widened: the next lines show more, and still fit */
    struct winsize ws = {.ws_row = 24, .ws_col = 160};
    ck_assert_int_eq(ioctl(p.master, TIOCSWINSZ, &ws), 0);
    ck_assert_msg(pty_until(&p, narrow_end, "entities="), "no wider line after the resize: %s", p.buf + narrow_end);
    ck_assert(pty_until(&p, narrow_end, "\033[K"));
    kill(p.pid, SIGINT);
    while (pty_until(&p, p.len, "\n\n\n")) /* to the end */
        ;
    ck_assert_int_eq(tu_wait(p.pid), 0);
    close(p.master);
    n = 0;
    wide = false;
    status_lines_fit(&p, narrow_end, p.len, 160, &n, &wide);
    ck_assert(wide);
    ck_assert_msg(strstr(p.buf, "wal_mb="), "a durable run shows the WAL: %s", p.buf);
    ck_assert_ptr_nonnull(strstr(p.buf, "final tick="));

    /* --memory: no WAL fields, however wide */
    pty_start(&p, 250, (const char *const[]){"--memory", "--entities", ENTITIES, "--forever", "--tick-rate", "60",
                                             NULL});
    ck_assert(pty_until(&p, 0, "\033[K"));
    kill(p.pid, SIGINT);
    while (pty_until(&p, p.len, "\n\n\n"))
        ;
    ck_assert_int_eq(tu_wait(p.pid), 0);
    close(p.master);
    ck_assert_msg(strstr(p.buf, "busiest_cell=") && !strstr(p.buf, "wal_") && !strstr(p.buf, "durable_lag"),
                  "--memory status: %s", p.buf);
}
END_TEST

/* A suite of one case holding test, its data directories under the case's
 * base directory (tu_suite's fixture removes them, after a failure too). */
static Suite *one_case(const char *name, const TTest *test, int timeout)
{
    return tu_suite(name, &test, 1, timeout);
}

static Suite *demo_cli(void)
{
    const TTest *t[] = {cli_bad_arguments, cli_failpoints_probe};
    return tu_suite("demo_cli", t, sizeof t / sizeof t[0], 60);
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

static Suite *demo_server(void)
{
    const TTest *t[] = {server_refusals, server_params, server_owned_and_backup, server_damaged_file,
                        server_status_line_fits};
    return tu_suite("demo_server", t, sizeof t / sizeof t[0], 300);
}

KEEL_TEST_MAIN(demo_cli, demo_runs, demo_crash, demo_slowdisk, demo_sigint, demo_server)
