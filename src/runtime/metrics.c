/*
 * runtime/metrics.c -- the Prometheus text exposition (keel/metrics.h;
 * docs/operations.md "Monitor" lists the metrics).
 *
 * A scrape runs on any thread while the runtime ticks, so it reads only
 * what is safe to read there:
 *   - atomics: the tick, the overload level, the side transactions'
 *     counters, the WAL writer's counters, the durable tick and LSN, the
 *     fatal latch, the per-system run times;
 *   - fixed-bucket histograms (core/hist.h): the tick's here, the writer's
 *     and the checkpoints' in dur_state;
 *   - rt->met.pub, the tick thread's plain counters (rt->stats) as the last
 *     step published them under met.mu.
 * The scrape holds met.mu while it writes. A step only trylocks it, so a
 * tick never waits for a scrape (a scrape then sees the counters of the
 * step before, until the next step); the end of a driven run
 * (keel_runtime_run, the driver thread) waits, so a stopped runtime shows
 * its final counters. keel_runtime_set_schedule
 * and closing the data directory lock it, so the schedule's names, the
 * per-system counters and the durability state stay valid under a scrape.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/metrics.h"

#include "core/core.h"
#include "runtime/runtime_internal.h"

/* Tick durations: around the 16.7 ms budget of 60 Hz, and far enough past
 * it for a tick an overload or a stall stretched. */
static const uint64_t tick_bounds[] = {
    500000, 1000000, 2000000, 4000000, 8000000, 12000000, 16000000, 20000000, 25000000, 33000000, 50000000,
    100000000, 250000000, 1000000000,
};

void metrics_init(keel_runtime *rt)
{
    pthread_mutex_init(&rt->met.mu, NULL);
    core_hist_init(&rt->met.tick_hist, tick_bounds, (uint32_t)(sizeof tick_bounds / sizeof tick_bounds[0]));
}

void metrics_fini(keel_runtime *rt)
{
    free((void *)rt->met.sys_ns);
    pthread_mutex_destroy(&rt->met.mu);
}

void metrics_lock(keel_runtime *rt)
{
    pthread_mutex_lock(&rt->met.mu);
}

void metrics_unlock(keel_runtime *rt)
{
    pthread_mutex_unlock(&rt->met.mu);
}

int metrics_size(keel_runtime *rt, uint32_t nsys)
{
    _Atomic uint64_t *a = calloc(nsys ? nsys : 1, sizeof *a);
    if (!a)
        return core_fail(KEEL_ENOMEM, "out of memory for the systems' metrics");
    free((void *)rt->met.sys_ns);
    rt->met.sys_ns = a;
    return KEEL_OK;
}

void metrics_publish(keel_runtime *rt, bool wait)
{
    rt_metrics *m = &rt->met;
    if (wait)
        pthread_mutex_lock(&m->mu);
    else if (pthread_mutex_trylock(&m->mu))
        return; /* a scrape is reading: the next step publishes */
    m->pub = rt->stats;
    m->pub.recovery_ns = rt->recovery.ns;
    m->dur = rt->dur;
    m->pub_entities = keel_world_count(rt->world);
    m->pub_skipped = m->skipped;
    pthread_mutex_unlock(&m->mu);
}

void metrics_forget_dur(keel_runtime *rt)
{
    pthread_mutex_lock(&rt->met.mu);
    rt->met.dur = NULL;
    pthread_mutex_unlock(&rt->met.mu);
}

/* ---- the writer: pieces of up to a buffer's size go to the sink -------------------- */

typedef struct mw {
    keel_metrics_sink sink;
    void *user;
    int rc;                        /* the sink's first nonzero return */
    size_t len;
    char buf[4096];
} mw;

static void mw_flush(mw *w)
{
    if (w->len && !w->rc)
        w->rc = w->sink(w->user, w->buf, w->len);
    w->len = 0;
}

static void mw_put(mw *w, const char *s, size_t n)
{
    while (n && !w->rc) {
        size_t k = sizeof w->buf - w->len < n ? sizeof w->buf - w->len : n;
        memcpy(w->buf + w->len, s, k);
        w->len += k;
        s += k;
        n -= k;
        if (w->len == sizeof w->buf)
            mw_flush(w);
    }
}

CORE_PRINTF(2, 3) static void mw_printf(mw *w, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) /* the formats here are short: a line never reaches the limit */
        mw_put(w, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* The HELP and TYPE lines of a family. */
static void family(mw *w, const char *name, const char *type, const char *help)
{
    mw_printf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_u64(mw *w, const char *name, const char *type, const char *help, uint64_t v)
{
    family(w, name, type, help);
    mw_printf(w, "%s %" PRIu64 "\n", name, v);
}

/* Nanoseconds as decimal seconds, exactly ("0.016000000"); trim drops the
 * trailing zeros (and the point) for `le` labels ("0.016", "1"). */
static const char *seconds(char *out, size_t n, uint64_t ns, bool trim)
{
    snprintf(out, n, "%" PRIu64 ".%09" PRIu64, ns / 1000000000u, ns % 1000000000u);
    if (trim) {
        char *e = out + strlen(out) - 1;
        while (*e == '0')
            *e-- = 0;
        if (*e == '.')
            *e = 0;
    }
    return out;
}

static void sample_seconds(mw *w, const char *name, const char *type, const char *help, uint64_t ns)
{
    char s[32];
    family(w, name, type, help);
    mw_printf(w, "%s %s\n", name, seconds(s, sizeof s, ns, false));
}

/* A histogram family from h; `ns`: its values are nanoseconds, exposed as
 * seconds (otherwise plain counts). */
static void histogram(mw *w, const char *name, const char *help, const core_hist *h, bool ns)
{
    core_hist_snap s;
    core_hist_read(h, &s);
    char a[32];
    family(w, name, "histogram", help);
    for (uint32_t i = 0; i < s.n; i++) {
        if (ns)
            mw_printf(w, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", name, seconds(a, sizeof a, s.bounds[i], true), s.cum[i]);
        else
            mw_printf(w, "%s_bucket{le=\"%" PRIu64 "\"} %" PRIu64 "\n", name, s.bounds[i], s.cum[i]);
    }
    mw_printf(w, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, s.count);
    if (ns)
        mw_printf(w, "%s_sum %s\n", name, seconds(a, sizeof a, s.sum, false));
    else
        mw_printf(w, "%s_sum %" PRIu64 "\n", name, s.sum);
    mw_printf(w, "%s_count %" PRIu64 "\n", name, s.count);
}

/* A label value as the format wants it: backslash, double quote and line
 * feed escaped (system names are user text). */
static void label_value(mw *w, const char *v)
{
    for (; *v; v++) {
        const char *esc = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
        if (esc)
            mw_put(w, esc, 2);
        else
            mw_put(w, v, 1);
    }
}

/* ---- the families --------------------------------------------------------------- */

static void write_ticks(mw *w, const keel_runtime *rt, const keel_runtime_stats *st)
{
    sample_u64(w, "keel_tick", "gauge", "The last completed tick.", keel_runtime_tick(rt));
    histogram(w, "keel_tick_duration_seconds", "Duration of each tick, start to end (seconds).", &rt->met.tick_hist, true);
    sample_u64(w, "keel_ticks_total", "counter", "Ticks this runtime ran.", st->ticks);
    sample_u64(w, "keel_ticks_skipped_total", "counter",
               "Grid ticks left out because TICK_RATE_MODULATION stretched the interval (multiplier - 1 per tick).",
               rt->met.pub_skipped);
    uint64_t throttled = 0;
    for (uint32_t l = KEEL_OVERLOAD_SYSTEM_THROTTLING; l < KEEL_OVERLOAD_LEVELS; l++)
        throttled += st->ticks_at_level[l];
    sample_u64(w, "keel_ticks_throttled_total", "counter", "Ticks run at overload level SYSTEM_THROTTLING or above.",
               throttled);
    family(w, "keel_overload_ticks_total", "counter", "Ticks run at each overload level.");
    for (uint32_t l = 0; l < KEEL_OVERLOAD_LEVELS; l++)
        mw_printf(w, "keel_overload_ticks_total{level=\"%s\"} %" PRIu64 "\n",
                  keel_overload_level_name((keel_overload_level)l), st->ticks_at_level[l]);
    sample_u64(w, "keel_overload_level", "gauge",
               "Overload level the next tick runs at: 0 NORMAL, 1 SYSTEM_THROTTLING, 2 SCOPE_REDUCTION, "
               "3 TICK_RATE_MODULATION, 4 PLAYER_SHEDDING.",
               st->overload_level);
    sample_u64(w, "keel_tick_multiplier", "gauge", "Tick interval multiplier the next tick runs at (1, 2, 3, 4 or 6).",
               st->multiplier);
    sample_u64(w, "keel_overload_escalations_total", "counter", "Steps up of the overload detector.",
               st->overload_escalations);
    sample_u64(w, "keel_overload_deescalations_total", "counter", "Steps down of the overload detector.",
               st->overload_deescalations);
    sample_u64(w, "keel_critical_overloads_total", "counter", "Entries into PLAYER_SHEDDING.", st->critical_overloads);
    sample_u64(w, "keel_entities", "gauge", "Live entities at the last tick's end.", rt->met.pub_entities);
}

static void write_systems(mw *w, const keel_runtime *rt, const keel_runtime_stats *st)
{
    sample_u64(w, "keel_systems_run_total", "counter", "System runs (failed ones included).", st->systems_run);
    sample_u64(w, "keel_systems_failed_total", "counter", "System runs that failed and were rolled back.",
               st->systems_failed);
    sample_u64(w, "keel_systems_skipped_total", "counter",
               "Systems not run: a predecessor failed, or overload throttling shed them.", st->systems_skipped);
    sample_u64(w, "keel_systems_throttled_total", "counter", "Systems not run because overload throttling shed them.",
               st->systems_throttled);
    sample_u64(w, "keel_rows_deferred_total", "counter", "Rows entity budgets left for later ticks.", st->rows_deferred);
    sample_u64(w, "keel_watchdog_reports_total", "counter", "System runs that outran the watchdog.",
               st->watchdog_reports);
    sample_u64(w, "keel_commands_applied_total", "counter", "Commands taken at sync points.", st->commands_applied);
    const keel_schedule *sc = rt->ex.sched;
    if (!sc || !rt->met.sys_ns)
        return;
    char s[32];
    family(w, "keel_system_seconds_total", "counter", "Time each system ran, first task's start to last task's end.");
    for (uint32_t i = 0; i < rt->tel.nsys; i++) {
        static const char open[] = "keel_system_seconds_total{system=\"";
        mw_put(w, open, sizeof open - 1);
        label_value(w, sc->sys[i].d.name);
        uint64_t ns = atomic_load_explicit(&rt->met.sys_ns[i], memory_order_relaxed);
        mw_printf(w, "\"} %s\n", seconds(s, sizeof s, ns, false));
    }
}

static void write_txns(mw *w, const keel_runtime *rt, const keel_runtime_stats *st)
{
    /* by kind: the published base holds the system transactions' counts, and
     * st (base + side) was composed from side counters read once, so the
     * difference is the side counts st holds, never a later value */
    const keel_runtime_stats *sys = &rt->met.pub;
    family(w, "keel_transaction_commits_total", "counter", "Transactions committed, by kind (system or side).");
    mw_printf(w, "keel_transaction_commits_total{kind=\"system\"} %" PRIu64 "\n", sys->commits);
    mw_printf(w, "keel_transaction_commits_total{kind=\"side\"} %" PRIu64 "\n", st->commits - sys->commits);
    family(w, "keel_transaction_aborts_total", "counter",
           "Transactions rolled back, by kind (system: failed; side: aborted or refused).");
    mw_printf(w, "keel_transaction_aborts_total{kind=\"system\"} %" PRIu64 "\n", sys->aborts);
    mw_printf(w, "keel_transaction_aborts_total{kind=\"side\"} %" PRIu64 "\n", st->aborts - sys->aborts);
    sample_u64(w, "keel_side_conflicts_total", "counter", "Side transactions refused with KEEL_ECONFLICT.",
               st->conflicts);
}

static void write_durable(mw *w, const keel_runtime *rt, const keel_runtime_stats *st, dur_state *d)
{
    uint64_t tick = keel_runtime_tick(rt), durable = atomic_load_explicit(&d->durable_tick, memory_order_acquire);
    sample_u64(w, "keel_wal_records_total", "counter", "WAL records committed to LMDB.", atomic_load(&d->wal_records));
    sample_u64(w, "keel_wal_raw_bytes_total", "counter",
               "Payload bytes of the WAL records handed to the writer, before compression.",
               atomic_load(&d->wal_raw_bytes));
    sample_u64(w, "keel_wal_stored_bytes_total", "counter",
               "Bytes of the WAL records committed to LMDB, as stored (headers, zstd).", st->wal_bytes);
    sample_u64(w, "keel_wal_fsyncs_total", "counter", "Synced LMDB commits of the WAL writer (one per group commit).",
               st->fsyncs);
    histogram(w, "keel_wal_group_commit_records", "WAL records per synced commit.", &d->group_hist, false);
    histogram(w, "keel_wal_commit_latency_seconds",
              "From a batch of records being handed to the WAL writer until they are durable (seconds).",
              &d->commit_hist, true);
    histogram(w, "keel_wal_fsync_seconds", "Duration of the LMDB commit: page writes, fdatasync, meta page sync.",
              &d->fsync_hist, true);
    sample_u64(w, "keel_durable_lag_ticks", "gauge", "Ticks completed but not yet durable.",
               tick > durable ? tick - durable : 0);
    sample_u64(w, "keel_durable_lsn", "gauge", "The last LSN on disk.",
               atomic_load_explicit(&d->durable_lsn, memory_order_acquire));
    sample_u64(w, "keel_durable_fatal", "gauge",
               "1 once the runtime latched fatal: nothing more becomes durable until it is reopened.",
               dur_fatal(d) ? 1 : 0);
    sample_u64(w, "keel_checkpoints_total", "counter", "Checkpoints this runtime recorded.", st->checkpoints);
    histogram(w, "keel_checkpoint_duration_seconds", "From a checkpoint's capture until it is recorded (seconds).",
              &d->ckpt_hist, true);
    sample_u64(w, "keel_checkpoint_age_ticks", "gauge",
               "Ticks since the last checkpoint recorded (failed attempts do not reset it).", st->checkpoint_age_ticks);
    sample_seconds(w, "keel_recovery_seconds", "gauge", "Time opening the data directory took (checkpoint load and WAL replay).",
                   st->recovery_ns);
}

/* A replicated runtime: its role (one sample per role, 1 for the current),
 * epoch, lag and failures (keel_repl_status). */
static void write_replication(mw *w, keel_runtime *rt)
{
    keel_repl_status r;
    keel_repl_status_get(rt, &r);
    family(w, "keel_repl_role", "gauge", "1 for the node's replication role (primary, standby, follower), 0 otherwise.");
    static const keel_repl_role roles[] = {KEEL_ROLE_PRIMARY, KEEL_ROLE_STANDBY, KEEL_ROLE_FOLLOWER};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        mw_printf(w, "keel_repl_role{role=\"%s\"} %d\n", keel_repl_role_name(roles[i]), r.role == roles[i]);
    sample_u64(w, "keel_repl_epoch", "gauge", "The epoch this node took (a primary) or last applied.", r.epoch);
    sample_u64(w, "keel_repl_stream_lsn", "gauge", "The stream's last LSN as last seen.", r.stream_lsn);
    sample_u64(w, "keel_repl_lag_records", "gauge",
               "A primary: records committed but not yet on the stream; a replica: on the stream, not applied.",
               r.lag_records);
    sample_u64(w, "keel_repl_lag_ticks", "gauge", "A replica: ticks received but not yet applied.", r.lag_ticks);
    sample_u64(w, "keel_repl_lag_bytes", "gauge",
               "keel_repl_lag_records times the mean record size (an estimate).", r.lag_bytes);
    sample_u64(w, "keel_repl_discarded_records_total", "counter",
               "Records this directory held beyond the stream, dropped when it opened.", r.discarded);
    sample_u64(w, "keel_repl_errors_total", "counter",
               "Publishes, lease renewals and replica polls that failed and were retried.",
               r.errors);
    sample_u64(w, "keel_repl_degraded", "gauge", "1 while the stream is out of reach (sync acknowledges nothing).",
               r.degraded ? 1 : 0);
    sample_u64(w, "keel_repl_fenced", "gauge", "1 once another primary took over: this node acknowledges nothing.",
               r.fenced ? 1 : 0);
}

int keel_metrics_write(const keel_runtime *rt, keel_metrics_sink sink, void *user)
{
    if (!rt || !sink)
        return core_fail(KEEL_EINVAL, "keel_metrics_write: runtime or sink is NULL");
    keel_runtime *m = (keel_runtime *)rt;
    mw *w = malloc(sizeof *w); /* its buffer is too large for a caller's small stack */
    if (!w)
        return core_fail(KEEL_ENOMEM, "keel_metrics_write: out of memory");
    *w = (mw){.sink = sink, .user = user};
    pthread_mutex_lock(&m->met.mu);
    keel_runtime_stats st;
    stats_compose(rt, &m->met.pub, m->met.dur, &st);
    write_ticks(w, rt, &st);
    write_systems(w, rt, &st);
    write_txns(w, rt, &st);
    if (m->met.dur)
        write_durable(w, rt, &st, m->met.dur);
    if (m->repl)
        write_replication(w, m);
    mw_flush(w);
    pthread_mutex_unlock(&m->met.mu);
    int rc = w->rc;
    free(w);
    return rc ? core_fail(rc, "keel_metrics_write: the sink returned %d", rc) : KEEL_OK;
}

typedef struct text_out {
    char *buf;
    size_t cap, len;
} text_out;

static int text_sink(void *user, const char *data, size_t len)
{
    text_out *t = user;
    if (t->len < t->cap) {
        size_t room = t->cap - t->len;
        memcpy(t->buf + t->len, data, len < room ? len : room);
    }
    t->len += len;
    return 0;
}

int keel_metrics_text(const keel_runtime *rt, char *buf, size_t cap, size_t *len)
{
    if (!rt || !len || (!buf && cap))
        return core_fail(KEEL_EINVAL, "keel_metrics_text: %s", !rt ? "runtime is NULL" : !len ? "len is NULL"
                                                                                   : "buf is NULL with a capacity");
    text_out t = {buf, cap, 0};
    int rc = keel_metrics_write(rt, text_sink, &t);
    *len = t.len;
    if (rc)
        return rc;
    if (t.len >= cap) {
        if (cap)
            buf[cap - 1] = 0;
        return core_fail(KEEL_ENOSPC, "keel_metrics_text: the exposition needs %zu bytes and a NUL, the buffer holds %zu",
                         t.len, cap);
    }
    buf[t.len] = 0;
    return KEEL_OK;
}
