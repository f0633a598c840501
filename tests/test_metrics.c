/*
 * test_metrics.c -- the Prometheus exposition (keel/metrics.h) and
 * keel-world --metrics.
 *
 *   metrics_lib       the library call: families with HELP and TYPE lines,
 *                     values equal to keel_runtime_stats_get, counters
 *                     monotonic across ticks, histograms cumulative with
 *                     _count equal to the +Inf bucket, label escaping, the
 *                     error paths, and scrapes from another thread while the
 *                     driver ticks;
 *   metrics_promtool  `promtool check metrics` accepts the exposition of a
 *                     durable runtime with a system named with `"`, `\` and
 *                     UTF-8 beyond ASCII;
 *   metrics_http      keel-world --metrics on a loopback port the kernel
 *                     picks: scraped with curl during the run (promtool
 *                     passes, other paths 404, another method 405 with
 *                     Allow), stopped with the server; one address holding
 *                     more connections than its limit closed past it while
 *                     another address scrapes, nothing on stderr; bad
 *                     addresses and a port in use refused up front, no
 *                     --trace file made.
 *
 * promtool (Debian package prometheus) and curl run as child processes.
 * Without them the suites that need them exit 77 (skipped) -- unless the
 * environment variable CI is set: CI installs them, so there their absence
 * fails the suite.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel_test.h"
#include "test_util.h"

/* ---- reading an exposition ------------------------------------------------------------ */

#define MAX_SAMPLES 512

typedef struct sample {
    char series[256];              /* name{labels} as written */
    double v;
} sample;

typedef struct expo {
    char *text;
    sample s[MAX_SAMPLES];
    uint32_t n;
} expo;

/* Parse every sample line; every line must be a comment or `series value`. */
static void expo_parse(expo *e, char *text)
{
    e->text = text;
    e->n = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        ck_assert_msg(nl != NULL, "the exposition does not end with a line feed");
        if (*line != '#') {
            char *sp = nl;
            while (sp > line && sp[-1] != ' ')
                sp--;
            ck_assert_msg(sp > line + 1, "a sample line without a value: %.*s", (int)(nl - line), line);
            ck_assert_uint_lt(e->n, MAX_SAMPLES);
            size_t len = (size_t)(sp - 1 - line);
            ck_assert_uint_lt(len, sizeof e->s[0].series);
            memcpy(e->s[e->n].series, line, len);
            e->s[e->n].series[len] = 0;
            char *end;
            e->s[e->n].v = strtod(sp, &end);
            ck_assert_msg(end == nl, "not a number: %.*s", (int)(nl - line), line);
            e->n++;
        }
        line = nl + 1;
    }
}

static const sample *expo_find(const expo *e, const char *series)
{
    for (uint32_t i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].series, series))
            return &e->s[i];
    return NULL;
}

static double val(const expo *e, const char *series)
{
    const sample *s = expo_find(e, series);
    ck_assert_msg(s != NULL, "no sample %s in the exposition", series);
    return s->v;
}

/* The family's TYPE ("counter", ...) from its TYPE line, which must follow
 * its HELP line; NULL when the family is absent. */
static const char *family_type(const expo *e, const char *name, char *out, size_t n)
{
    char help[160], type[160];
    snprintf(help, sizeof help, "# HELP %s ", name);
    snprintf(type, sizeof type, "# TYPE %s ", name);
    const char *h = strstr(e->text, help);
    if (!h)
        return NULL;
    const char *t = strchr(h, '\n');
    ck_assert_msg(t && !strncmp(t + 1, type, strlen(type)), "%s: the TYPE line does not follow the HELP line", name);
    t += 1 + strlen(type);
    size_t len = strcspn(t, "\n");
    ck_assert_uint_lt(len, n);
    memcpy(out, t, len);
    out[len] = 0;
    return out;
}

static void expect_family(const expo *e, const char *name, const char *type)
{
    char t[32];
    ck_assert_msg(family_type(e, name, t, sizeof t) != NULL, "family %s missing", name);
    ck_assert_msg(!strcmp(t, type), "%s is a %s, expected a %s", name, t, type);
}

/* The family a series belongs to, and whether its values only grow (a
 * counter, a histogram's buckets, sum and count). */
static bool series_grows(const expo *e, const char *series)
{
    char name[256], t[32];
    size_t len = strcspn(series, "{");
    memcpy(name, series, len);
    name[len] = 0;
    if (family_type(e, name, t, sizeof t))
        return !strcmp(t, "counter");
    static const char *const parts[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t pl = strlen(parts[i]);
        if (len > pl && !strcmp(name + len - pl, parts[i])) {
            name[len - pl] = 0;
            return family_type(e, name, t, sizeof t) && !strcmp(t, "histogram");
        }
    }
    ck_abort_msg("series %s belongs to no family", series);
    return false;
}

/* Every histogram: buckets non-decreasing in `le` order, the last one
 * +Inf, equal to _count. */
static void check_histograms(const expo *e)
{
    uint32_t histograms = 0;
    for (const char *p = e->text; (p = strstr(p, "# TYPE ")) != NULL; p++) {
        char name[128], type[32];
        ck_assert_int_eq(sscanf(p, "# TYPE %127s %31s", name, type), 2);
        if (strcmp(type, "histogram"))
            continue;
        histograms++;
        char prefix[160];
        int pl = snprintf(prefix, sizeof prefix, "%s_bucket{", name);
        double last = -1;
        const sample *inf = NULL;
        uint32_t buckets = 0;
        for (uint32_t i = 0; i < e->n; i++) {
            if (strncmp(e->s[i].series, prefix, (size_t)pl))
                continue;
            ck_assert_msg(!inf, "%s: a bucket after +Inf", name);
            ck_assert_msg(e->s[i].v >= last, "%s: buckets not cumulative at %s", name, e->s[i].series);
            last = e->s[i].v;
            buckets++;
            if (strstr(e->s[i].series, "le=\"+Inf\""))
                inf = &e->s[i];
        }
        ck_assert_msg(inf != NULL, "%s has no +Inf bucket", name);
        ck_assert_uint_ge(buckets, 2);
        char count[160], sum[160];
        snprintf(count, sizeof count, "%s_count", name);
        snprintf(sum, sizeof sum, "%s_sum", name);
        ck_assert_msg(val(e, count) == inf->v, "%s: _count %g, +Inf bucket %g", name, val(e, count), inf->v);
        ck_assert(val(e, sum) >= 0);
    }
    ck_assert_uint_gt(histograms, 0);
}

/* b was scraped after a: no counter or histogram series went down or went
 * away. */
static void check_monotonic(const expo *a, const expo *b)
{
    for (uint32_t i = 0; i < a->n; i++) {
        if (!series_grows(a, a->s[i].series))
            continue;
        const sample *s = expo_find(b, a->s[i].series);
        ck_assert_msg(s != NULL, "%s disappeared", a->s[i].series);
        ck_assert_msg(s->v >= a->s[i].v, "%s went down: %g -> %g", a->s[i].series, a->s[i].v, s->v);
    }
}

/* The exposition of rt, parsed (e->text is malloc'd). */
static void scrape(const keel_runtime *rt, expo *e)
{
    size_t len = 0;
    ck_assert_rc(keel_metrics_text(rt, NULL, 0, &len), KEEL_ENOSPC);
    size_t cap = 2 * len + 1;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ok(keel_metrics_text(rt, buf, cap, &len));
    ck_assert_uint_eq(strlen(buf), len);
    expo_parse(e, buf);
}

/* ---- runtimes --------------------------------------------------------------------------- */

static int sys_fail(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return KEEL_EINVAL;
}

/* Systems "alpha" (does nothing), "beta" (fails) and `third` (does nothing). */
static keel_runtime *rt_with_systems(keel_runtime_desc d, const char *third)
{
    keel_runtime *rt = tu_rt_new(d);
    keel_schedule *s = sched_new(rt);
    add_sys(s, &(keel_system_desc){.name = "alpha", .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop});
    add_sys(s, &(keel_system_desc){.name = "beta", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_fail});
    add_sys(s, &(keel_system_desc){.name = third, .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop});
    tu_install(rt, s);
    return rt;
}

static int side_noop(keel_side_txn *tx, void *arg)
{
    (void)tx;
    (void)arg;
    return KEEL_OK;
}

/* One side transaction through keel_submit, committed by the next step. */
static void submit_one(keel_runtime *rt)
{
    keel_ticket *t = NULL;
    ck_assert_ok(keel_submit(rt, side_noop, NULL, KEEL_DURABLE_GROUP, &t));
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_ok(keel_ticket_wait(t, -1));
    keel_ticket_release(t);
}

/* keel_system_seconds_total of system sys (its registration index) as the
 * telemetry of ticks 1..ticks says: first task's start to last task's end. */
static void expect_system_seconds(const expo *e, keel_runtime *rt, keel_system sys, const char *name, uint64_t ticks)
{
    uint64_t ns = 0;
    for (uint64_t t = 1; t <= ticks; t++) {
        keel_system_record r = tu_sysrec(rt, t, sys);
        if (r.start_ns && r.end_ns > r.start_ns)
            ns += r.end_ns - r.start_ns;
    }
    char key[96];
    snprintf(key, sizeof key, "keel_system_seconds_total{system=\"%s\"}", name);
    double got = val(e, key);
    ck_assert_msg(ns > 0 && fabs(got - (double)ns / 1e9) < 1e-9, "%s = %.9f, the telemetry says %.9f", key, got,
                  (double)ns / 1e9);
}

static void expect_counters_as_stats(const expo *e, const keel_runtime *rt)
{
    keel_runtime_stats st = tu_stats(rt);
    ck_assert_uint_eq((uint64_t)val(e, "keel_tick"), keel_runtime_tick(rt));
    ck_assert_uint_eq((uint64_t)val(e, "keel_ticks_total"), st.ticks);
    ck_assert_uint_eq((uint64_t)val(e, "keel_tick_duration_seconds_count"), st.ticks);
    ck_assert_uint_eq((uint64_t)val(e, "keel_systems_run_total"), st.systems_run);
    ck_assert_uint_eq((uint64_t)val(e, "keel_systems_failed_total"), st.systems_failed);
    ck_assert_uint_eq((uint64_t)val(e, "keel_systems_skipped_total"), st.systems_skipped);
    ck_assert_uint_eq((uint64_t)val(e, "keel_systems_throttled_total"), st.systems_throttled);
    ck_assert_uint_eq((uint64_t)val(e, "keel_commands_applied_total"), st.commands_applied);
    ck_assert_uint_eq((uint64_t)val(e, "keel_transaction_commits_total{kind=\"system\"}") +
                          (uint64_t)val(e, "keel_transaction_commits_total{kind=\"side\"}"),
                      st.commits);
    ck_assert_uint_eq((uint64_t)val(e, "keel_transaction_aborts_total{kind=\"system\"}") +
                          (uint64_t)val(e, "keel_transaction_aborts_total{kind=\"side\"}"),
                      st.aborts);
    ck_assert_uint_eq((uint64_t)val(e, "keel_side_conflicts_total"), st.conflicts);
    ck_assert_uint_eq((uint64_t)val(e, "keel_overload_level"), st.overload_level);
    ck_assert_uint_eq((uint64_t)val(e, "keel_tick_multiplier"), st.multiplier);
    ck_assert_uint_eq((uint64_t)val(e, "keel_overload_ticks_total{level=\"NORMAL\"}"),
                      st.ticks_at_level[KEEL_OVERLOAD_NORMAL]);
}

/* ---- metrics_lib ------------------------------------------------------------------------ */

START_TEST(test_memory_runtime)
{
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 1}, "gamma");
    tu_step_n(rt, 3);
    expo e;
    scrape(rt, &e);
    static const char *const counters[] = {
        "keel_ticks_total", "keel_ticks_skipped_total", "keel_ticks_throttled_total", "keel_overload_ticks_total",
        "keel_systems_run_total", "keel_systems_failed_total", "keel_systems_skipped_total",
        "keel_systems_throttled_total", "keel_system_seconds_total", "keel_transaction_commits_total",
        "keel_transaction_aborts_total", "keel_side_conflicts_total", "keel_overload_escalations_total",
        "keel_watchdog_reports_total", "keel_commands_applied_total", "keel_rows_deferred_total",
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        expect_family(&e, counters[i], "counter");
    static const char *const gauges[] = {"keel_tick", "keel_overload_level", "keel_tick_multiplier", "keel_entities"};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
        expect_family(&e, gauges[i], "gauge");
    expect_family(&e, "keel_tick_duration_seconds", "histogram");
    /* no data directory: no durability families */
    char t[32];
    ck_assert_ptr_null(family_type(&e, "keel_wal_records_total", t, sizeof t));
    ck_assert_ptr_null(family_type(&e, "keel_durable_lag_ticks", t, sizeof t));
    ck_assert_ptr_null(strstr(e.text, "keel_wal_"));
    expect_counters_as_stats(&e, rt);
    ck_assert_uint_eq((uint64_t)val(&e, "keel_ticks_total"), 3);
    ck_assert_uint_eq((uint64_t)val(&e, "keel_systems_failed_total"), 3); /* beta, every tick */
    ck_assert_uint_eq((uint64_t)val(&e, "keel_transaction_aborts_total{kind=\"system\"}"), 3);
    ck_assert_uint_eq((uint64_t)val(&e, "keel_entities"), keel_world_count(keel_runtime_world(rt)));
    expect_system_seconds(&e, rt, 0, "alpha", 3); /* registered first */
    expect_system_seconds(&e, rt, 2, "gamma", 3);
    check_histograms(&e);
    free(e.text);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_label_escaping)
{
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 1}, "say \"hi\" \\ bye");
    tu_step_n(rt, 1);
    expo e;
    scrape(rt, &e);
    ck_assert_ptr_nonnull(expo_find(&e, "keel_system_seconds_total{system=\"say \\\"hi\\\" \\\\ bye\"}"));
    free(e.text);
    keel_runtime_close(rt);
}
END_TEST

START_TEST(test_durable_runtime)
{
    char dir[512];
    tu_path(dir, sizeof dir, "d");
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 2, .durable.dir = dir}, "gamma");
    ck_assert_ok(keel_runtime_recover(rt, NULL));
    tu_step_n(rt, 5);
    submit_one(rt);
    ck_assert_ok(keel_flush(rt)); /* the writer is idle: its counters hold still */
    expo a;
    scrape(rt, &a);
    static const char *const counters[] = {"keel_wal_records_total", "keel_wal_raw_bytes_total",
                                           "keel_wal_stored_bytes_total", "keel_wal_fsyncs_total",
                                           "keel_checkpoints_total"};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        expect_family(&a, counters[i], "counter");
    static const char *const hists[] = {"keel_wal_group_commit_records", "keel_wal_commit_latency_seconds",
                                        "keel_wal_fsync_seconds", "keel_checkpoint_duration_seconds"};
    for (size_t i = 0; i < sizeof hists / sizeof hists[0]; i++)
        expect_family(&a, hists[i], "histogram");
    static const char *const gauges[] = {"keel_durable_lag_ticks", "keel_durable_lsn", "keel_durable_fatal",
                                         "keel_checkpoint_age_ticks", "keel_recovery_seconds"};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
        expect_family(&a, gauges[i], "gauge");
    expect_counters_as_stats(&a, rt);
    keel_runtime_stats st = tu_stats(rt);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_transaction_commits_total{kind=\"side\"}"), 1);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_wal_stored_bytes_total"), st.wal_bytes);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_wal_fsyncs_total"), st.fsyncs);
    ck_assert_uint_gt(st.fsyncs, 0);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_wal_fsync_seconds_count"), st.fsyncs);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_wal_group_commit_records_count"), st.fsyncs);
    /* the group-commit buckets: every power of two from 1 to 4096 records */
    for (uint32_t k = 0; k <= 12; k++) {
        char series[96];
        snprintf(series, sizeof series, "keel_wal_group_commit_records_bucket{le=\"%u\"}", 1u << k);
        ck_assert_msg(expo_find(&a, series), "no %s", series);
    }
    /* every committed record is in exactly one group commit */
    ck_assert_uint_eq((uint64_t)val(&a, "keel_wal_group_commit_records_sum"),
                      (uint64_t)val(&a, "keel_wal_records_total"));
    ck_assert_uint_eq((uint64_t)val(&a, "keel_durable_lsn"), keel_durable_lsn(rt));
    ck_assert_uint_eq((uint64_t)val(&a, "keel_durable_lag_ticks"), 0);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_durable_fatal"), 0);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_checkpoints_total"), st.checkpoints);
    ck_assert_uint_eq((uint64_t)val(&a, "keel_checkpoint_age_ticks"), st.checkpoint_age_ticks);
    check_histograms(&a);

    ck_assert_ok(keel_checkpoint(rt));
    tu_step_n(rt, 4);
    submit_one(rt);
    ck_assert_ok(keel_flush(rt));
    expo b;
    scrape(rt, &b);
    check_monotonic(&a, &b);
    check_histograms(&b);
    expect_counters_as_stats(&b, rt);
    st = tu_stats(rt);
    ck_assert_uint_eq(st.checkpoints, (uint64_t)val(&a, "keel_checkpoints_total") + 1);
    ck_assert_uint_eq((uint64_t)val(&b, "keel_checkpoints_total"), st.checkpoints);
    ck_assert_uint_eq((uint64_t)val(&b, "keel_checkpoint_duration_seconds_count"), st.checkpoints);
    ck_assert_uint_eq((uint64_t)val(&b, "keel_wal_fsyncs_total"), st.fsyncs);
    ck_assert_uint_gt((uint64_t)val(&b, "keel_wal_records_total"), (uint64_t)val(&a, "keel_wal_records_total"));
    ck_assert_uint_eq((uint64_t)val(&b, "keel_transaction_commits_total{kind=\"side\"}"), 2);
    ck_assert_uint_eq((uint64_t)val(&b, "keel_ticks_total"), 11);
    free(a.text);
    free(b.text);
    keel_runtime_close(rt);
}
END_TEST

typedef struct sink_log {
    int calls, rc;
} sink_log;

static int refusing_sink(void *user, const char *data, size_t len)
{
    (void)data;
    ck_assert_uint_gt(len, 0);
    sink_log *l = user;
    l->calls++;
    return l->rc;
}

START_TEST(test_errors)
{
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 1}, "gamma");
    tu_step_n(rt, 1);
    sink_log l = {.rc = KEEL_EIO};
    ck_assert_rc(keel_metrics_write(NULL, refusing_sink, &l), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_metrics_write"));
    ck_assert_rc(keel_metrics_write(rt, NULL, &l), KEEL_EINVAL);
    ck_assert_int_eq(l.calls, 0);
    /* a sink's refusal ends the write at once and comes back as it was */
    ck_assert_rc(keel_metrics_write(rt, refusing_sink, &l), KEEL_EIO);
    ck_assert_int_eq(l.calls, 1);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "sink"));

    size_t len = 1;
    char buf[64];
    ck_assert_rc(keel_metrics_text(NULL, buf, sizeof buf, &len), KEEL_EINVAL);
    ck_assert_rc(keel_metrics_text(rt, buf, sizeof buf, NULL), KEEL_EINVAL);
    ck_assert_rc(keel_metrics_text(rt, NULL, sizeof buf, &len), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "buf"));
    /* too small: the length it needs, a NUL-terminated prefix */
    memset(buf, 'x', sizeof buf);
    ck_assert_rc(keel_metrics_text(rt, buf, sizeof buf, &len), KEEL_ENOSPC);
    ck_assert_uint_gt(len, sizeof buf);
    ck_assert_uint_eq(strlen(buf), sizeof buf - 1);
    ck_assert(!strncmp(buf, "# HELP keel_", 12));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "bytes"));
    /* exactly the length, no room for the NUL: still too small */
    char *exact = malloc(len + 1);
    ck_assert_ptr_nonnull(exact);
    ck_assert_rc(keel_metrics_text(rt, exact, len, &len), KEEL_ENOSPC);
    ck_assert_ok(keel_metrics_text(rt, exact, len + 1, &len));
    ck_assert_uint_eq(strlen(exact), len);
    free(exact);
    keel_runtime_close(rt);
}
END_TEST

/* Scrapes from another thread while the driver ticks (TSan runs this
 * suite): every scrape succeeds, parses, and no counter goes down. */
typedef struct scraper {
    keel_runtime *rt;
    _Atomic bool stop;
    _Atomic uint32_t scrapes;
    uint32_t failures;
} scraper;

static void *scrape_loop(void *arg)
{
    scraper *s = arg;
    char *buf = malloc(1 << 16);
    expo *prev = calloc(1, sizeof *prev), *cur = calloc(1, sizeof *cur);
    char *prev_text = NULL;
    while (!atomic_load(&s->stop)) {
        size_t len;
        if (keel_metrics_text(s->rt, buf, 1 << 16, &len)) {
            s->failures++;
            break;
        }
        char *copy = strdup(buf);
        expo_parse(cur, copy);
        if (prev_text)
            check_monotonic(prev, cur);
        check_histograms(cur);
        free(prev_text);
        prev_text = copy;
        expo *t = prev;
        prev = cur;
        cur = t;
        atomic_fetch_add(&s->scrapes, 1);
    }
    free(prev_text);
    free(prev);
    free(cur);
    free(buf);
    return NULL;
}

START_TEST(test_scrape_while_ticking)
{
    char dir[512];
    tu_path(dir, sizeof dir, "live");
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 2, .tick_rate_hz = 1000, .durable.dir = dir},
                                       "gamma");
    ck_assert_ok(keel_runtime_recover(rt, NULL));
    scraper s = {.rt = rt};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, scrape_loop, &s), 0);
    ck_assert_ok(keel_runtime_start(rt));
    /* both sides make progress: 3 scrapes, then ticks past the tick seen now */
    ck_assert(tu_wait_at_least(&s.scrapes, 3));
    uint64_t t0 = keel_runtime_tick(rt);
    uint32_t seen = atomic_load(&s.scrapes);
    while (keel_runtime_tick(rt) < t0 + 20)
        ck_assert(tu_wait_at_least(&s.scrapes, ++seen));
    ck_assert_ok(keel_runtime_stop(rt));
    atomic_store(&s.stop, true);
    pthread_join(th, NULL);
    ck_assert_uint_eq(s.failures, 0);
    expo e;
    scrape(rt, &e);
    expect_counters_as_stats(&e, rt);
    free(e.text);
    keel_runtime_close(rt);
}
END_TEST

/* ---- child processes: promtool, curl, keel-world ------------------------------------- */

/* The path of a program on PATH into out; false when it is not there. */
static bool find_program(const char *name, char *out, size_t n)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/%s", d, name);
        if (access(out, X_OK) == 0)
            return true;
    }
    return false;
}

/* `promtool check metrics` on text: must pass. */
static void promtool_check(const char *text)
{
    char prom[1024], file[600], cmd[2048];
    ck_assert(find_program("promtool", prom, sizeof prom));
    tu_path(file, sizeof file, "exposition.txt");
    tu_write_file(file, text, strlen(text));
    snprintf(cmd, sizeof cmd, "exec '%s' check metrics < '%s'", prom, file);
    tu_run r = tu_run_argv("/bin/sh", (const char *[]){"-c", cmd, NULL});
    ck_assert_msg(r.status == 0, "promtool check metrics failed (%d):\n%s%s", r.status, r.out, r.err);
    tu_run_free(&r);
}

START_TEST(test_promtool_accepts)
{
    char dir[512];
    tu_path(dir, sizeof dir, "p");
    /* a system name with the characters the label format escapes, and UTF-8 beyond ASCII */
    keel_runtime *rt = rt_with_systems((keel_runtime_desc){.workers = 2, .durable.dir = dir},
                                       "g\xc3\xa4mma \"\xe6\x88\x98\" \\ \xf0\x9f\x8c\x8d");
    tu_step_n(rt, 3);
    submit_one(rt);
    ck_assert_ok(keel_checkpoint(rt));
    expo e;
    scrape(rt, &e);
    ck_assert_ptr_nonnull(
        strstr(e.text, "{system=\"g\xc3\xa4mma \\\"\xe6\x88\x98\\\" \\\\ \xf0\x9f\x8c\x8d\"}"));
    promtool_check(e.text);
    free(e.text);
    keel_runtime_close(rt);
}
END_TEST

/* curl URL: its exit status, the body in *body (malloc'd). */
static int curl_get(const char *url, char **body, const char *write_out)
{
    char curl[1024];
    ck_assert(find_program("curl", curl, sizeof curl));
    tu_run r = write_out ? tu_run_argv(curl, (const char *[]){"-s", "-o", "/dev/null", "-w", write_out, url, NULL})
                         : tu_run_argv(curl, (const char *[]){"-sf", url, NULL});
    *body = strdup(r.out);
    int status = r.status;
    tu_run_free(&r);
    return status;
}

typedef struct server {
    pid_t pid;
    int out;                       /* its stdout */
    char url[256];                 /* http://127.0.0.1:PORT/metrics */
    int port;
} server;

/* Start keel-world with --metrics 127.0.0.1:0 and read the line naming the
 * port. It dies with the test process (PR_SET_PDEATHSIG), so a failing
 * assertion never leaves it running. */
static void server_start(server *s, const char *dir)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    char err[600];
    tu_path(err, sizeof err, "server.err");
    fflush(NULL);
    pid_t parent = getpid();
    s->pid = fork();
    ck_assert_int_ge(s->pid, 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        if (!freopen(err, "w", stderr))
            _exit(127);
        execl(KEEL_WORLD_BIN, KEEL_WORLD_BIN, "--data", dir, "--entities", "2000", "--forever", "--tick-rate",
              "60", "--workers", "2", "--metrics", "127.0.0.1:0", "--quiet", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    s->out = p[0];
    char line[512];
    size_t n = 0;
    for (;;) { /* the first line names the address (blocking read: the server writes it before it starts) */
        ck_assert_uint_lt(n, sizeof line - 1);
        ssize_t k = read(s->out, line + n, 1);
        ck_assert_msg(k == 1, "keel-world ended before naming its metrics address");
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    ck_assert_msg(sscanf(line, "metrics http://127.0.0.1:%d/metrics", &s->port) == 1, "first line: %s", line);
    ck_assert_int_gt(s->port, 0);
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d/metrics", s->port);
}

/* SIGTERM: a clean stop; its exit status and the rest of its stdout. */
static int server_stop(server *s, char *rest, size_t n)
{
    ck_assert_int_eq(kill(s->pid, SIGTERM), 0);
    size_t len = 0;
    ssize_t k;
    while (len < n - 1 && (k = read(s->out, rest + len, n - 1 - len)) > 0)
        len += (size_t)k;
    rest[len] = 0;
    close(s->out);
    return tu_wait(s->pid);
}

START_TEST(test_http_scrape)
{
    char dir[512];
    tu_path(dir, sizeof dir, "world");
    server s;
    server_start(&s, dir);
    char *body = NULL;
    ck_assert_int_eq(curl_get(s.url, &body, NULL), 0);
    expo a;
    expo_parse(&a, body);
    ck_assert_ptr_nonnull(strstr(body, "_bucket{"));
    expect_family(&a, "keel_tick_duration_seconds", "histogram");
    expect_family(&a, "keel_wal_records_total", "counter"); /* the directory is open before serving */
    expect_family(&a, "keel_durable_lag_ticks", "gauge");
    check_histograms(&a);
    promtool_check(body);
    /* a second scrape: nothing went down */
    char *body2 = NULL;
    ck_assert_int_eq(curl_get(s.url, &body2, NULL), 0);
    expo b;
    expo_parse(&b, body2);
    check_monotonic(&a, &b);
    /* other paths */
    char other[300], *code = NULL;
    snprintf(other, sizeof other, "http://127.0.0.1:%d/", s.port);
    ck_assert_int_eq(curl_get(other, &code, "%{http_code}"), 0);
    ck_assert_str_eq(code, "404");
    free(code);
    snprintf(other, sizeof other, "http://127.0.0.1:%d/metrics/x", s.port);
    ck_assert_int_eq(curl_get(other, &code, "%{http_code}"), 0);
    ck_assert_str_eq(code, "404");
    free(code);
    /* another method: 405, naming the ones it takes */
    char curl[1024];
    ck_assert(find_program("curl", curl, sizeof curl));
    tu_run post = tu_run_argv(curl, (const char *[]){"-s", "-o", "/dev/null", "-D", "-", "-X", "POST", s.url, NULL});
    ck_assert_int_eq(post.status, 0);
    ck_assert_msg(strstr(post.out, " 405 ") && strstr(post.out, "Allow: GET, HEAD\r\n"), "%s", post.out);
    tu_run_free(&post);
    char rest[4096];
    ck_assert_int_eq(server_stop(&s, rest, sizeof rest), 0);
    ck_assert_msg(strstr(rest, "final tick=") != NULL, "no final line: %s", rest);
    /* the server stopped with it: nothing listens on the port any more */
    ck_assert_int_ne(curl_get(s.url, &code, NULL), 0);
    free(code);
    free(body);
    free(body2);
}
END_TEST

/* A TCP connection to 127.0.0.1:port from the source address src (any of
 * 127/8 on loopback), bound before it connects. */
static int connect_from(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    ck_assert_int_eq(inet_pton(AF_INET, src, &from.sin_addr), 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
    return fd;
}

/* Read fd to its end (the server closes it, or resets it): what came. The
 * 30 s bound only ends a test whose server never closes it. */
static size_t read_to_end(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ck_assert_msg(poll(&p, 1, 30000) == 1, "the server kept the connection open");
        ssize_t k = read(fd, buf + len, cap - 1 - len);
        if (k <= 0)
            break; /* 0: closed; -1: ECONNRESET, closed too */
        len += (size_t)k;
        ck_assert_uint_lt(len, cap - 1);
    }
    buf[len] = 0;
    return len;
}

/* One client holding idle connections cannot take the server from another:
 * past its per-address limit (8) the server closes its connections at
 * once, and a scrape from another address gets through, with 40 of the
 * first one's open (more than the server's 32 in all). Refused clients
 * leave nothing on keel-world's stderr. */
START_TEST(test_http_per_address_limit)
{
    char dir[512], err[600];
    tu_path(dir, sizeof dir, "world");
    tu_path(err, sizeof err, "server.err");
    server s;
    server_start(&s, dir);
    enum { HELD = 40, LIMIT = 8 };
    int held[HELD];
    for (int i = 0; i < HELD; i++)
        held[i] = connect_from("127.0.0.1", s.port);
    /* the server takes connections in the order they came: once it closed the last, it met every one */
    static char buf[1 << 20];
    ck_assert_uint_eq(read_to_end(held[HELD - 1], buf, sizeof buf), 0);
    int fd = connect_from("127.0.0.2", s.port);
    static const char get[] = "GET /metrics HTTP/1.0\r\n\r\n";
    ck_assert_int_eq(write(fd, get, sizeof get - 1), (ssize_t)(sizeof get - 1));
    read_to_end(fd, buf, sizeof buf);
    close(fd);
    ck_assert_msg(!strncmp(buf, "HTTP/1.", 7) && !strncmp(buf + 8, " 200 ", 5), "reply: %.200s", buf);
    ck_assert_ptr_nonnull(strstr(buf, "\nkeel_tick "));
    for (int i = LIMIT; i < HELD - 1; i++) /* past the limit: closed without a reply */
        ck_assert_uint_eq(read_to_end(held[i], buf, sizeof buf), 0);
    for (int i = 0; i < HELD; i++)
        close(held[i]);
    char rest[4096];
    ck_assert_int_eq(server_stop(&s, rest, sizeof rest), 0);
    FILE *f = fopen(err, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, 4096, f);
    fclose(f);
    buf[n] = 0;
    ck_assert_msg(n == 0, "keel-world's stderr: %s", buf);
}
END_TEST

/* keel-world with --metrics addr must exit 2 before anything starts, with
 * one line on stderr containing `says`, and neither the data directory nor
 * the --trace file made. */
static void expect_refused(const char *addr, const char *says)
{
    char dir[512], trace[512];
    tu_path(dir, sizeof dir, "never");
    tu_path(trace, sizeof trace, "never.json");
    tu_run r = tu_run_argv(KEEL_WORLD_BIN, (const char *[]){"--data", dir, "--until-tick", "3", "--tick-rate", "0",
                                                             "--trace", trace, "--metrics", addr, "--quiet", NULL});
    ck_assert_msg(r.status == 2, "--metrics '%s': exit %d, stderr %s", addr, r.status, r.err);
    ck_assert_msg(strstr(r.err, says) != NULL, "--metrics '%s': stderr '%s' lacks '%s'", addr, r.err, says);
    ck_assert_uint_eq(tu_count_lines(r.err), 1);
    ck_assert_str_eq(r.out, "");
    struct stat st;
    ck_assert_int_ne(stat(dir, &st), 0); /* nothing was created */
    ck_assert_int_ne(stat(trace, &st), 0);
    tu_run_free(&r);
}

START_TEST(test_http_refused)
{
    expect_refused("nope", "HOST:PORT");
    expect_refused("127.0.0.1:", "HOST:PORT");
    expect_refused(":9100", "HOST:PORT");
    expect_refused("127.0.0.1:65536", "HOST:PORT");
    expect_refused("127.0.0.1:12x", "HOST:PORT");
    expect_refused("[::1:80", "HOST:PORT");
    expect_refused("", "HOST:PORT");
    expect_refused("no-such-host.invalid:9100", "cannot resolve");
    /* a port in use: this process listens on it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    socklen_t al = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", ntohs(a.sin_port));
    expect_refused(addr, "cannot listen: Address already in use");
    close(fd);
}
END_TEST

/* ---- suites --------------------------------------------------------------------------- */

static Suite *lib_suite(void)
{
    const TTest *t[] = {test_memory_runtime, test_label_escaping, test_durable_runtime, test_errors,
                        test_scrape_while_ticking};
    return tu_suite("metrics_lib", t, sizeof t / sizeof t[0], 120);
}

static Suite *promtool_suite(void)
{
    const TTest *t[] = {test_promtool_accepts};
    return tu_suite("metrics_promtool", t, 1, 120);
}

static Suite *http_suite(void)
{
    const TTest *t[] = {test_http_scrape, test_http_per_address_limit, test_http_refused};
    return tu_suite("metrics_http", t, sizeof t / sizeof t[0], 120);
}

int main(void)
{
    const char *suite = getenv("CK_RUN_SUITE");
    bool needs_tools = suite && (!strcmp(suite, "metrics_promtool") || !strcmp(suite, "metrics_http"));
    char path[1024];
    const char *missing = !find_program("promtool", path, sizeof path) ? "promtool (Debian package prometheus)"
                          : !find_program("curl", path, sizeof path)   ? "curl"
                                                                       : NULL;
    if (needs_tools && missing) {
        bool ci = getenv("CI") && *getenv("CI");
        printf("test_metrics: suite %s %s: %s is not installed\n", suite, ci ? "fails (CI is set)" : "skipped",
               missing);
        return ci ? EXIT_FAILURE : 77;
    }
    keel_suite_fn suites[] = {lib_suite, promtool_suite, http_suite};
    return keel_test_run(suites, (int)(sizeof suites / sizeof suites[0]));
}
