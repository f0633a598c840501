/*
 * runtime/telemetry.c -- the telemetry ring, counters and the Chrome
 * trace-event export.
 *
 * The ring holds `capacity` ticks (a power of two): tick t lives at slot
 * t & mask, with its per-system records in a parallel array. It is written
 * by the stepping thread at tick end from the systems' run state (which
 * stays until a system is made ready again next tick); readers use the ring
 * between ticks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "runtime/runtime_internal.h"

const char *keel_skip_reason_name(keel_skip_reason r)
{
    switch (r) {
    case KEEL_SKIP_NONE:              return "NONE";
    case KEEL_SKIP_FAILED:            return "FAILED";
    case KEEL_SKIP_DEPENDENCY_FAILED: return "DEPENDENCY_FAILED";
    case KEEL_SKIP_THROTTLED:         return "THROTTLED";
    default:                          return "?";
    }
}

int telemetry_init(keel_runtime *rt, uint32_t capacity)
{
    rt_telemetry *t = &rt->tel;
    t->capacity = capacity;
    t->mask = capacity - 1;
    t->ticks = calloc(capacity, sizeof *t->ticks);
    return t->ticks ? KEEL_OK : core_fail(KEEL_ENOMEM, "keel_runtime_create: out of memory for telemetry");
}

int telemetry_size(keel_runtime *rt, uint32_t nsys)
{
    rt_telemetry *t = &rt->tel;
    /* Fresh zeroed arrays rather than a memset of the old ring: the records
     * of the old schedule are gone, and calloc can hand out fresh zero pages
     * without touching them (a large ring stays unresident until used). */
    keel_system_record *sys = calloc((size_t)t->capacity * (nsys ? nsys : 1), sizeof *sys);
    keel_tick_record *ticks = calloc(t->capacity, sizeof *ticks);
    if (!sys || !ticks) {
        free(sys);
        free(ticks);
        return core_fail(KEEL_ENOMEM, "out of memory for system telemetry");
    }
    free(t->systems);
    free(t->ticks);
    t->systems = sys;
    t->ticks = ticks;
    t->nsys = nsys;
    return KEEL_OK;
}

void telemetry_record(keel_runtime *rt, keel_tick_record *tick)
{
    rt_telemetry *t = &rt->tel;
    uint32_t slot = (uint32_t)(tick->tick & t->mask);
    keel_system_record *out = &t->systems[(size_t)slot * t->nsys];
    for (uint32_t i = 0; i < t->nsys; i++) {
        const sched_run *st = &rt->ex.st[i];
        bool skipped = st->skip == KEEL_SKIP_DEPENDENCY_FAILED || st->skip == KEEL_SKIP_THROTTLED;
        uint32_t watchdog = atomic_load(&st->watchdog_tick) == tick->tick;
        out[i] = (keel_system_record){
            .system = i,
            .worker = st->worker,
            .start_ns = skipped ? 0 : st->start_ns,
            .end_ns = st->end_ns,
            .rows = atomic_load_explicit(&st->rows, memory_order_relaxed),
            .tasks = skipped ? 0 : st->ntasks,
            .skip = st->skip,
            .watchdog = (uint8_t)watchdog,
            .deferred = skipped ? 0 : st->deferred,
        };
        tick->watchdog_reports += watchdog;
        tick->deferred_rows += out[i].deferred;
        if (out[i].start_ns && out[i].end_ns > out[i].start_ns) { /* its one writer: no locked add */
            _Atomic uint64_t *ns = &rt->met.sys_ns[i];
            atomic_store_explicit(ns, atomic_load_explicit(ns, memory_order_relaxed) + out[i].end_ns - out[i].start_ns,
                                  memory_order_relaxed);
        }
    }
    t->ticks[slot] = *tick;
}

void telemetry_mark_checkpoint(keel_runtime *rt, uint64_t tick)
{
    keel_tick_record *r = &rt->tel.ticks[tick & rt->tel.mask];
    if (r->tick == tick)
        r->checkpoint = 1;
}

void telemetry_fini(keel_runtime *rt)
{
    free(rt->tel.ticks);
    free(rt->tel.systems);
}

void runtime_fence_join(keel_runtime *rt)
{
    fence_done f;
    if (!rt->dur || !fence_join(rt->dur, &f))
        return;
    keel_tick_record *r = rt->tel.ticks ? &rt->tel.ticks[f.tick & rt->tel.mask] : NULL;
    if (r && r->tick == f.tick) {
        r->wal_stored_bytes = f.stored;
        r->fence_ns = f.ns;
    }
}

/* Readers are on the stepping thread (keel/telemetry.h): the last tick's
 * record is completed first when its unit was serialised between ticks. */
static const keel_tick_record *find_tick(const keel_runtime *rt, uint64_t tick)
{
    if (rt)
        runtime_fence_join((keel_runtime *)rt);
    if (!rt || !rt->tel.ticks || !tick)
        return NULL;
    const keel_tick_record *r = &rt->tel.ticks[tick & rt->tel.mask];
    return r->tick == tick ? r : NULL;
}

int keel_telemetry_tick(const keel_runtime *rt, uint64_t tick, keel_tick_record *out)
{
    if (!rt || !out)
        return core_fail(KEEL_EINVAL, "keel_telemetry_tick: runtime or out is NULL");
    const keel_tick_record *r = find_tick(rt, tick);
    if (!r)
        return core_fail(KEEL_ENOENT, "keel_telemetry_tick: tick %" PRIu64 " is not in the ring (capacity %u)", tick,
                         rt->tel.capacity);
    *out = *r;
    return KEEL_OK;
}

int keel_telemetry_system(const keel_runtime *rt, uint64_t tick, keel_system sys, keel_system_record *out)
{
    if (!rt || !out)
        return core_fail(KEEL_EINVAL, "keel_telemetry_system: runtime or out is NULL");
    if (sys >= rt->tel.nsys)
        return core_fail(KEEL_EINVAL, "keel_telemetry_system: system %u does not exist", sys);
    const keel_tick_record *r = find_tick(rt, tick);
    if (!r)
        return core_fail(KEEL_ENOENT, "keel_telemetry_system: tick %" PRIu64 " is not in the ring", tick);
    *out = rt->tel.systems[(size_t)(tick & rt->tel.mask) * rt->tel.nsys + sys];
    return KEEL_OK;
}

void stats_compose(const keel_runtime *rt, const keel_runtime_stats *base, const dur_state *d, keel_runtime_stats *out)
{
    keel_runtime *m = (keel_runtime *)rt; /* atomic loads take non-const pointers */
    *out = *base;
    out->commits += atomic_load(&m->txn.counts.commits); /* side transactions */
    out->aborts += atomic_load(&m->txn.counts.aborts);
    out->conflicts += atomic_load(&m->txn.counts.conflicts);
    if (d) {
        dur_state *dm = (dur_state *)d;
        out->wal_bytes = atomic_load(&dm->wal_bytes);
        out->fsyncs = atomic_load(&dm->fsyncs);
        out->checkpoints = atomic_load(&dm->ckpt_taken);
        /* from the last checkpoint recorded: failed attempts leave the age growing */
        uint64_t tick = atomic_load(&m->tick), ckpt_tick = atomic_load(&dm->ckpt_recorded_tick);
        out->checkpoint_age_ticks = tick > ckpt_tick ? tick - ckpt_tick : 0;
    }
    out->overload_level = (uint32_t)keel_runtime_overload(rt, &out->multiplier);
}

void keel_runtime_stats_get(const keel_runtime *rt, keel_runtime_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!rt)
        return;
    keel_runtime_stats base = rt->stats;
    base.recovery_ns = rt->recovery.ns;
    stats_compose(rt, &base, rt->dur, out);
}

/* ---- trace export --------------------------------------------------------------- */

/* Write s as a JSON string body (names are user text). */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static double us(uint64_t ns, uint64_t origin)
{
    return (double)(ns - origin) / 1000.0;
}

static void trace_slice(FILE *f, bool *first, const char *name, uint32_t tid, double ts, double dur, uint64_t tick)
{
    fputs(*first ? "\n" : ",\n", f);
    *first = false;
    fputs("{\"ph\":\"X\",\"pid\":1,\"tid\":", f);
    fprintf(f, "%u,\"name\":", tid);
    json_string(f, name);
    fprintf(f, ",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"tick\":%" PRIu64 "}}", ts, dur, tick);
}

static void trace_thread_names(FILE *f, bool *first, uint32_t workers)
{
    fputs(*first ? "\n" : ",\n", f);
    *first = false;
    fputs("{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"keel\"}},\n"
          "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"thread_name\",\"args\":{\"name\":\"driver\"}}",
          f);
    for (uint32_t w = 0; w < workers; w++)
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":\"worker-%u\"}}",
                w + 1, w);
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%u,\"name\":\"thread_name\",\"args\":{\"name\":\"wal-writer\"}}",
            workers + 1);
}

/* The WAL writer's commits (one slice per synced LMDB transaction) that
 * fall in the exported ticks' time range. */
static void trace_writer(const keel_runtime *rt, FILE *f, bool *first, uint64_t origin)
{
    if (!rt->dur)
        return;
    struct dur_span *spans = malloc(DUR_SPANS * sizeof *spans);
    uint32_t n = spans ? dur_spans(rt->dur, spans, DUR_SPANS) : 0;
    for (uint32_t i = 0; i < n; i++)
        if (spans[i].start_ns >= origin)
            trace_slice(f, first, "wal commit", rt->ex.workers + 1, us(spans[i].start_ns, origin),
                        (double)spans[i].ns / 1000.0, spans[i].last_lsn);
    free(spans);
}

/* The overload counter track: the level and multiplier each tick ran at,
 * so a throttled or slowed-down runtime does not look like a stalled one. */
static void trace_overload(FILE *f, const keel_tick_record *t, uint64_t origin)
{
    fprintf(f, ",\n{\"ph\":\"C\",\"pid\":1,\"name\":\"overload\",\"ts\":%.3f,\"args\":{\"level\":%u,"
               "\"multiplier\":%u}}",
            us(t->start_ns, origin), t->overload_level, t->multiplier);
}

static void trace_tick(const keel_runtime *rt, FILE *f, bool *first, const keel_tick_record *t, uint64_t origin)
{
    trace_slice(f, first, "tick", 0, us(t->start_ns, origin), (double)t->actual_ns / 1000.0, t->tick);
    trace_overload(f, t, origin);
    uint64_t sync_start = t->sync_start_ns;
    trace_slice(f, first, "sync", 0, us(sync_start, origin), (double)t->sync_ns / 1000.0, t->tick);
    if (t->fence_ns)
        trace_slice(f, first, "fence", 0, us(sync_start + t->sync_ns, origin), (double)t->fence_ns / 1000.0, t->tick);
    const keel_system_record *sys = &rt->tel.systems[(size_t)(t->tick & rt->tel.mask) * rt->tel.nsys];
    for (uint32_t i = 0; i < rt->tel.nsys; i++) {
        if (!sys[i].start_ns || sys[i].end_ns < sys[i].start_ns)
            continue;
        trace_slice(f, first, rt->ex.sched->sys[i].d.name, sys[i].worker + 1, us(sys[i].start_ns, origin),
                    (double)(sys[i].end_ns - sys[i].start_ns) / 1000.0, t->tick);
    }
}

int keel_trace_export(const keel_runtime *rt, const char *path)
{
    if (!rt || !path)
        return core_fail(KEEL_EINVAL, "keel_trace_export: runtime or path is NULL");
    FILE *f = fopen(path, "w");
    if (!f)
        return core_fail(errno == ENOMEM ? KEEL_ENOMEM : KEEL_EIO, "keel_trace_export: cannot open '%s': %s", path,
                         strerror(errno));
    /* the ring's ticks in tick order, oldest first */
    uint64_t last = atomic_load(&rt->tick);
    uint64_t first_tick = last >= rt->tel.capacity ? last - rt->tel.capacity + 1 : 1;
    const keel_tick_record *origin_rec = find_tick(rt, first_tick);
    uint64_t origin = origin_rec ? origin_rec->start_ns : 0;
    bool first = true;
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f);
    trace_thread_names(f, &first, rt->ex.workers);
    for (uint64_t t = first_tick; rt->ex.sched && t <= last; t++) {
        const keel_tick_record *rec = find_tick(rt, t);
        if (rec)
            trace_tick(rt, f, &first, rec, origin);
    }
    trace_writer(rt, f, &first, origin);
    fputs("\n]}\n", f);
    if (ferror(f) | fclose(f))
        return core_fail(KEEL_EIO, "keel_trace_export: writing '%s' failed: %s", path, strerror(errno));
    return KEEL_OK;
}
