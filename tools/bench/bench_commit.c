/*
 * tools/bench/bench_commit.c -- the figures measured against one synced
 * LMDB commit per record (the "one fsync per commit" baseline): immediate
 * (IMMEDIATE side transactions from submitting threads), commit (durable
 * ticks in GROUP and IMMEDIATE mode), and recovery (replay rate against
 * reading the same WAL with libkeel_wal alone).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "keel_wal/wal.h"
#include "keel_repl/repl.h"

#define IMM_THREADS 8u
#define IMM_ACCOUNTS 1024u
#define IMM_WINDOW 64u             /* transfers in flight per submitting thread (headline figure) */
#define IMM_SECONDS 1.0            /* submitting time per measurement */
#define IMM_RECORD 96u             /* payload bytes of the baseline's one record per commit */
#define IMM_BASE_SECONDS 0.5       /* baseline commit loop per measurement */
#define COMMIT_ROWS 64u            /* rows the commit figure's system changes per tick */
#define COMMIT_SECONDS 0.5         /* stepping time per measurement of the commit figure */
#define RECOVERY_ENTITIES 1000000u
#define RECOVERY_TURN 100u         /* 1M entities, 1%: the same 20k changed rows per tick as the wal figure */
#define RECOVERY_TICKS 1000u
#define RECOVERY_OFF_TICKS 100u    /* ticks timed with the WAL off, for the record */

/* ---- immediate -------------------------------------------------------------- */

typedef struct imm_run imm_run;

typedef struct imm_transfer {
    imm_run *run;
    keel_entity from, to;
} imm_transfer;

typedef struct imm_thread {
    imm_run *run;
    uint32_t id;
    double *lat;               /* ms, one per completed transfer */
    size_t nlat, cap;
    uint64_t failed;
    pthread_t th;
} imm_thread;

struct imm_run {
    keel_runtime *rt;
    keel_component coins;
    keel_entity acct[IMM_ACCOUNTS];
    uint32_t window;
    _Atomic bool stop;
    _Atomic uint32_t running;
    imm_thread th[IMM_THREADS];
};

/* Record n spawns of an entity whose i64 component c holds value. */
static int spawn_i64(keel_ctx *ctx, keel_component c, uint32_t n, int64_t value)
{
    for (uint32_t i = 0; i < n; i++) {
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){ { c, &value } }, 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int imm_accounts(keel_ctx *ctx, void *user)
{
    return spawn_i64(ctx, ((imm_run *)user)->coins, IMM_ACCOUNTS, 1000000);
}

static int imm_idle(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 0;
}

static int imm_transfer_fn(keel_side_txn *tx, void *arg)
{
    const imm_transfer *t = arg;
    int64_t a, b;
    int rc = keel_side_get(tx, t->from, t->run->coins, &a);
    if (!rc)
        rc = keel_side_get(tx, t->to, t->run->coins, &b);
    if (rc)
        return rc;
    a -= 1;
    b += 1;
    rc = keel_side_set(tx, t->from, t->run->coins, &a);
    return rc ? rc : keel_side_set(tx, t->to, t->run->coins, &b);
}

static void imm_record(imm_thread *t, double ms)
{
    if (t->nlat == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
        if (!t->lat) {
            fprintf(stderr, "keel-bench: out of memory\n");
            exit(1);
        }
    }
    t->lat[t->nlat++] = ms;
}

/* A submitting thread: keeps `window` transfers in flight (submit until
 * the window is full, then wait for the oldest ticket), until told to stop;
 * then drains. Latency = submit to the return of keel_ticket_wait. */
static void *imm_thread_main(void *arg)
{
    imm_thread *t = arg;
    imm_run *r = t->run;
    uint32_t W = r->window;
    imm_transfer *tr = xmalloc(W * sizeof *tr);
    keel_ticket **tk = xmalloc(W * sizeof *tk);
    uint64_t *sub = xmalloc(W * sizeof *sub);
    uint64_t rng = 0x696d6d6564696174ull ^ ((uint64_t)t->id << 32);
    uint32_t head = 0, inflight = 0;
    for (;;) {
        while (!atomic_load_explicit(&r->stop, memory_order_relaxed) && inflight < W) {
            uint32_t slot = (head + inflight) % W;
            uint64_t x = splitmix64(&rng);
            uint32_t i = (uint32_t)(x % IMM_ACCOUNTS), j = (uint32_t)((x >> 32) % (IMM_ACCOUNTS - 1));
            j += j >= i;
            tr[slot] = (imm_transfer){ r, r->acct[i], r->acct[j] };
            sub[slot] = now_ns();
            check(keel_submit(r->rt, imm_transfer_fn, &tr[slot], KEEL_DURABLE_IMMEDIATE, &tk[slot]), "keel_submit");
            inflight++;
        }
        if (!inflight)
            break;
        int rc = keel_ticket_wait(tk[head], -1);
        uint64_t done = now_ns();
        keel_ticket_release(tk[head]);
        if (rc == 0)
            imm_record(t, (double)(done - sub[head]) / 1e6);
        else
            t->failed++;
        head = (head + 1) % W;
        inflight--;
    }
    free(tr);
    free(tk);
    free(sub);
    atomic_fetch_sub(&r->running, 1);
    return NULL;
}

typedef struct imm_sample {
    double tps, p50, p99, fsyncs_per_s;
    double ticks_per_s, wal_mb_per_s;  /* of the stepping loop, the WAL writer */
    double records_per_s;              /* WAL records (LSNs) the run logged */
    uint64_t failed;
} imm_sample;

/* IMM_THREADS threads submit IMMEDIATE transfers (window in flight each)
 * for IMM_SECONDS while this thread steps the runtime unthrottled. */
static imm_sample imm_measure(uint32_t window, double rate_hz, const keel_replication_desc *repl)
{
    char *dir = make_tmpdir("imm");
    imm_run *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "keel-bench: out of memory\n");
        exit(1);
    }
    r->window = window;
    keel_runtime_desc desc = {
        .workers = 1, .tick_rate_hz = rate_hz, .on_first_tick = imm_accounts, .hook_user = r,
        .durable = { .dir = dir, .checkpoint_every_ticks = -1 },
        .overload = { .disabled = true }, /* at 1 kHz: measure the rate asked for, not a modulated one */
        .replication = repl ? *repl : (keel_replication_desc){ 0 },
    };
    check(keel_runtime_create(&desc, &r->rt), "keel_runtime_create");
    keel_world *w = keel_runtime_world(r->rt);
    static const keel_field f[] = { { .name = "coins", .type = KEEL_I64 } };
    check(keel_component_register(w, &(keel_component_desc){ .name = "coins", .size = 8, .fields = f,
                                                             .field_count = 1 }, &r->coins), "register");
    keel_schedule *s;
    check(keel_schedule_create(r->rt, &s), "keel_schedule_create");
    keel_system_desc idle = { .name = "idle", .kind = KEEL_SYSTEM_CALLBACK, .run = imm_idle };
    check(keel_schedule_add_system(s, &idle, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(r->rt, s), "keel_runtime_set_schedule");
    step(r->rt);
    check(keel_flush(r->rt), "keel_flush");
    keel_query *q;
    check(keel_query_create(w, &(keel_query_desc){ .with = { r->coins } }, &q), "keel_query_create");
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        for (uint32_t i = 0; i < it.count && n < IMM_ACCOUNTS; i++)
            r->acct[n++] = it.entities[i];
    keel_query_destroy(q);
    if (n != IMM_ACCOUNTS) {
        fprintf(stderr, "keel-bench: immediate: %u accounts, expected %u\n", n, IMM_ACCOUNTS);
        exit(1);
    }
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(r->rt, &s0);
    uint64_t lsn0 = keel_runtime_tick_lsn(r->rt);
    atomic_store(&r->running, IMM_THREADS);
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        r->th[i] = (imm_thread){ .run = r, .id = i };
        if (pthread_create(&r->th[i].th, NULL, imm_thread_main, &r->th[i])) {
            fprintf(stderr, "keel-bench: pthread_create failed\n");
            exit(1);
        }
    }
    uint64_t stop_at = t0 + (uint64_t)(IMM_SECONDS * 1e9);
    if (rate_hz > 0) { /* the TickDriver at rate_hz instead of an unthrottled loop */
        check(keel_runtime_start(r->rt), "keel_runtime_start");
        struct timespec ts = { (time_t)IMM_SECONDS, (long)((IMM_SECONDS - (double)(time_t)IMM_SECONDS) * 1e9) };
        nanosleep(&ts, NULL);
        atomic_store(&r->stop, true);
        while (atomic_load(&r->running)) {
            struct timespec ms = { 0, 1000000 };
            nanosleep(&ms, NULL);
        }
        check(keel_runtime_stop(r->rt), "keel_runtime_stop");
    }
    while (atomic_load(&r->running)) {
        step(r->rt);
        if (!atomic_load_explicit(&r->stop, memory_order_relaxed) && now_ns() >= stop_at)
            atomic_store(&r->stop, true);
    }
    uint64_t t1 = now_ns();
    keel_runtime_stats_get(r->rt, &s1);
    double secs = (double)(t1 - t0) / 1e9;
    imm_sample out = { .records_per_s = (double)(keel_runtime_tick_lsn(r->rt) - lsn0) / secs,
                       .fsyncs_per_s = (double)(s1.fsyncs - s0.fsyncs) / secs,
                       .ticks_per_s = (double)(s1.ticks - s0.ticks) / secs,
                       .wal_mb_per_s = (double)(s1.wal_bytes - s0.wal_bytes) / 1e6 / secs };
    size_t total = 0;
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        pthread_join(r->th[i].th, NULL);
        total += r->th[i].nlat;
        out.failed += r->th[i].failed;
    }
    double *all = xmalloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (uint32_t i = 0; i < IMM_THREADS; i++) {
        memcpy(all + k, r->th[i].lat, r->th[i].nlat * sizeof *all);
        k += r->th[i].nlat;
        free(r->th[i].lat);
    }
    out.tps = (double)total / ((double)(t1 - t0) / 1e9);
    out.p50 = percentile(all, total, 0.50);
    out.p99 = percentile(all, total, 0.99);
    free(all);
    keel_runtime_close(r->rt);
    free(r);
    remove_tmpdir(dir);
    return out;
}

typedef struct fsync_base {
    kw_codec_ctx *codec;
    kw_buf rec;
    uint64_t lsn;
} fsync_base;

static int fsync_fill(kw_wtxn *txn, void *arg)
{
    fsync_base *b = arg;
    return kw_put_wal(txn, b->lsn, b->rec.p, b->rec.len);
}

/* Baseline: one synced LMDB commit per record (one IMM_RECORD-byte
 * SIDE-like record per kw_store_write) into a directory of its own, for
 * IMM_BASE_SECONDS; commits/s and per-commit latency percentiles. */
static imm_sample fsync_measure(void)
{
    char *dir = make_tmpdir("fsync");
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_CREATE }, &st), "kw_store_open");
    fsync_base b = { .lsn = 0 };
    check(kw_codec_create(&(kw_codec_desc){ 0 }, &b.codec), "kw_codec_create");
    unsigned char payload[IMM_RECORD];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (unsigned char)(i * 37u);
    size_t cap = 1024, n = 0;
    double *lat = xmalloc(cap * sizeof *lat);
    uint64_t t0 = now_ns(), stop_at = t0 + (uint64_t)(IMM_BASE_SECONDS * 1e9), t = t0;
    while (t < stop_at) {
        b.rec.len = 0;
        b.lsn++;
        check(kw_record_build(b.codec, &b.rec, KW_KIND_SIDE, b.lsn, 0, 0, payload, sizeof payload), "kw_record_build");
        check(kw_store_write(st, fsync_fill, &b), "kw_store_write");
        uint64_t t2 = now_ns();
        if (n == cap) {
            cap *= 2;
            lat = realloc(lat, cap * sizeof *lat);
            if (!lat)
                exit(1);
        }
        lat[n++] = (double)(t2 - t) / 1e6;
        t = t2;
    }
    imm_sample out = { .tps = (double)n / ((double)(t - t0) / 1e9), .fsyncs_per_s = (double)n / ((double)(t - t0) / 1e9) };
    out.p50 = percentile(lat, n, 0.50);
    out.p99 = percentile(lat, n, 0.99);
    free(lat);
    kw_buf_free(&b.rec);
    kw_codec_destroy(b.codec);
    kw_store_close(st);
    remove_tmpdir(dir);
    return out;
}

/* Median over R samples of the double at byte offset `off` of each. */
static double imm_median(const imm_sample *v, uint32_t R, size_t off)
{
    double *x = xmalloc(R * sizeof *x);
    for (uint32_t r = 0; r < R; r++)
        memcpy(&x[r], (const char *)&v[r] + off, sizeof x[r]);
    double m = median(x, R);
    free(x);
    return m;
}

void bench_immediate(const config *cfg)
{
    keep_heap_resident();
    /* Only the target's configuration (8 threads, 64 in flight each,
     * unthrottled stepping) carries the target. immediate_w1 shows
     * the latency-bound case: with one transfer in flight per thread, a
     * synced commit can carry at most 8 transfers, so it cannot exceed about
     * 8x the one-fsync-per-commit rate by construction; group commit needs
     * transfers in flight to have anything to group. */
    static const struct { const char *name; uint32_t window; double rate; bool spec; } runs[] = {
        { "immediate", IMM_WINDOW, -1, true },        /* the target: unthrottled stepping */
        { "immediate_w1", 1, -1, false },             /* one transfer in flight per thread */
        { "immediate_1khz", IMM_WINDOW, 1000, false },/* the TickDriver at 1 kHz instead */
    };
    enum { NRUNS = sizeof runs / sizeof runs[0] };
    uint32_t R = cfg->rounds;
    imm_sample *b = xmalloc(R * sizeof *b), *s[NRUNS];
    for (int k = 0; k < NRUNS; k++)
        s[k] = xmalloc(R * sizeof *s[k]);
    (void)fsync_measure(); /* warm-up */
    (void)imm_measure(IMM_WINDOW, -1, NULL);
    for (uint32_t r = 0; r < R; r++) {
        if (r % 2 == 0)
            b[r] = fsync_measure();
        for (int k = 0; k < NRUNS; k++)
            s[k][r] = imm_measure(runs[k].window, runs[k].rate, NULL);
        if (r % 2 == 1)
            b[r] = fsync_measure();
    }
    double base = imm_median(b, R, offsetof(imm_sample, tps));
    double base50 = imm_median(b, R, offsetof(imm_sample, p50)), base99 = imm_median(b, R, offsetof(imm_sample, p99));
    uint64_t failed = 0;
    for (int k = 0; k < NRUNS; k++) {
        for (uint32_t r = 0; r < R; r++)
            failed += s[k][r].failed;
        figure f = { .name = runs[k].name, .unit = "commits/s", .value = imm_median(s[k], R, offsetof(imm_sample, tps)),
                     .baseline = base, .target = 50, .target_on_ratio = true, .at_least = true,
                     .no_target = !runs[k].spec };
        report(cfg, &f);
        char n50[32], n99[32];
        snprintf(n50, sizeof n50, "%s_p50", runs[k].name);
        snprintf(n99, sizeof n99, "%s_p99", runs[k].name);
        figure l50 = { .name = n50, .unit = "ms", .value = imm_median(s[k], R, offsetof(imm_sample, p50)),
                       .baseline = base50, .no_target = true };
        figure l99 = { .name = n99, .unit = "ms", .value = imm_median(s[k], R, offsetof(imm_sample, p99)),
                       .baseline = base99, .no_target = true };
        report(cfg, &l50);
        report(cfg, &l99);
        double fs = imm_median(s[k], R, offsetof(imm_sample, fsyncs_per_s));
        note(cfg, "%s: %u threads x %u transfers in flight, %s; %.0f ticks/s, %.0f synced LMDB commits/s by the "
                  "WAL writer (%.1f transfers per commit), %.1f MB/s of WAL", runs[k].name, IMM_THREADS,
             runs[k].window, runs[k].rate > 0 ? "TickDriver at 1 kHz (overload detector off)" : "unthrottled keel_runtime_step loop",
             imm_median(s[k], R, offsetof(imm_sample, ticks_per_s)), fs, fs > 0 ? f.value / fs : 0,
             imm_median(s[k], R, offsetof(imm_sample, wal_mb_per_s)));
        free(s[k]);
    }
    if (failed)
        fprintf(stderr, "keel-bench: immediate: %llu transfers failed\n", (unsigned long long)failed);
    note(cfg, "immediate: value = IMMEDIATE two-account transfers/s (keel_submit + keel_ticket_wait from %u "
              "threads for %.1f s, latency = submit to the return of the wait) while the main thread steps the "
              "runtime (1 worker, %u accounts, GROUP ticks, tick-count checkpoints off); baseline = one synced "
              "LMDB commit per %u-byte record (kw_store_write loop, a directory of its own, %.1f s): commits/s "
              "and per-commit latency", IMM_THREADS, IMM_SECONDS, IMM_ACCOUNTS, IMM_RECORD, IMM_BASE_SECONDS);
    free(b);
}

/* ---- commit ------------------------------------------------------------------ */

/* Durable ticks: a system changes COMMIT_ROWS rows of a VERSIONED i64 every
 * tick; the runtime steps unthrottled for COMMIT_SECONDS in GROUP mode (the
 * final keel_flush timed) or IMMEDIATE mode (every tick returns once it
 * is on disk). Durable ticks per second, against the one-synced-commit-per-
 * record rate of fsync_measure. */
typedef struct commit_run {
    keel_component v;
} commit_run;

/* on_first_tick: the rows the system changes. */
static int commit_spawn(keel_ctx *ctx, void *user)
{
    return spawn_i64(ctx, ((commit_run *)user)->v, COMMIT_ROWS, 0);
}

static int commit_bump(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    int64_t *v = KEEL_COLUMN(it, int64_t, 0);
    for (uint32_t i = 0; i < it->count; i++)
        v[i]++;
    return 0;
}

typedef struct commit_sample {
    double tps;                /* durable ticks per second */
    double ticks_per_fsync;
} commit_sample;

static commit_sample commit_measure(keel_durability mode)
{
    char *dir = make_tmpdir("commit");
    commit_run c = { 0 };
    keel_runtime *rt;
    keel_runtime_desc desc = { .workers = 1, .tick_rate_hz = -1, .durability = mode, .on_first_tick = commit_spawn,
                               .hook_user = &c, .durable = { .dir = dir, .checkpoint_every_ticks = -1 } };
    check(keel_runtime_create(&desc, &rt), "keel_runtime_create");
    static const keel_field f[] = { { .name = "v", .type = KEEL_I64 } };
    check(keel_component_register(keel_runtime_world(rt), &(keel_component_desc){ .name = "v", .size = 8,
                                  .fields = f, .field_count = 1 }, &c.v), "register");
    keel_schedule *s;
    check(keel_schedule_create(rt, &s), "keel_schedule_create");
    keel_system_desc bump = { .name = "bump", .kind = KEEL_SYSTEM_QUERY, .each_chunk = commit_bump,
                              .query = { .with = { c.v } }, .access = { .writes = { c.v } } };
    check(keel_schedule_add_system(s, &bump, NULL), "keel_schedule_add_system");
    check(keel_schedule_build(s), "keel_schedule_build");
    check(keel_runtime_set_schedule(rt, s), "keel_runtime_set_schedule");
    step(rt);
    check(keel_flush(rt), "keel_flush");
    keel_runtime_stats s0, s1;
    keel_runtime_stats_get(rt, &s0);
    uint64_t t0 = now_ns(), stop_at = t0 + (uint64_t)(COMMIT_SECONDS * 1e9), n = 0;
    do {
        step(rt);
        n++;
    } while (now_ns() < stop_at);
    check(keel_flush(rt), "keel_flush");
    uint64_t t1 = now_ns();
    keel_runtime_stats_get(rt, &s1);
    commit_sample out = { .tps = (double)n / ((double)(t1 - t0) / 1e9) };
    out.ticks_per_fsync = s1.fsyncs > s0.fsyncs ? (double)n / (double)(s1.fsyncs - s0.fsyncs) : 0;
    keel_runtime_close(rt);
    remove_tmpdir(dir);
    return out;
}

void bench_commit(const config *cfg)
{
    keep_heap_resident();
    uint32_t R = cfg->rounds;
    double *base = xmalloc(R * sizeof *base), *grp = xmalloc(R * sizeof *grp), *imm = xmalloc(R * sizeof *imm);
    double *gpf = xmalloc(R * sizeof *gpf), *ipf = xmalloc(R * sizeof *ipf);
    (void)fsync_measure(); /* warm-up */
    (void)commit_measure(KEEL_DURABLE_GROUP);
    for (uint32_t r = 0; r < R; r++) {
        if (r % 2 == 0)
            base[r] = fsync_measure().tps;
        commit_sample g = commit_measure(KEEL_DURABLE_GROUP), i = commit_measure(KEEL_DURABLE_IMMEDIATE);
        grp[r] = g.tps;
        gpf[r] = g.ticks_per_fsync;
        imm[r] = i.tps;
        ipf[r] = i.ticks_per_fsync;
        if (r % 2 == 1)
            base[r] = fsync_measure().tps;
    }
    double b = median(base, R);
    figure g = { .name = "commit_group", .unit = "ticks/s", .value = median(grp, R), .baseline = b, .no_target = true };
    figure i = { .name = "commit_immediate", .unit = "ticks/s", .value = median(imm, R), .baseline = b,
                 .no_target = true };
    report(cfg, &g);
    report(cfg, &i);
    note(cfg, "commit: durable ticks/s of a tick that changes %u rows of a VERSIONED i64 (1 worker, unthrottled "
              "keel_runtime_step for %.1f s, checkpoints off): GROUP (the final keel_flush timed; %.1f ticks "
              "per synced commit) and IMMEDIATE (each tick waits for its sync; %.1f ticks per synced commit); "
              "baseline = one synced LMDB commit per %u-byte record (kw_store_write loop), commits/s",
         COMMIT_ROWS, COMMIT_SECONDS, median(gpf, R), median(ipf, R), IMM_RECORD);
    free(base);
    free(grp);
    free(imm);
    free(gpf);
    free(ipf);
}

/* ---- recovery --------------------------------------------------------------- */

typedef struct rec_sample {
    double wall_s, cpu_s, raw_mb;
    uint64_t records, tick, checkpoint_tick, hash;
} rec_sample;

/* Recover `dir` into a fresh runtime (components registered, no schedule). */
static rec_sample recovery_measure(const char *dir)
{
    demo d;
    demo_open(&d, &(demo_opts){ .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .dir = dir, .ckpt_ticks = -1 });
    keel_recovery rec;
    double c0 = process_cpu_s();
    uint64_t t0 = now_ns();
    check(keel_runtime_recover(d.rt, &rec), "keel_runtime_recover");
    uint64_t t1 = now_ns();
    double c1 = process_cpu_s();
    rec_sample s = { .wall_s = (double)(t1 - t0) / 1e9, .cpu_s = c1 - c0, .raw_mb = (double)rec.raw_bytes / 1e6,
                     .records = rec.records, .tick = rec.tick, .checkpoint_tick = rec.checkpoint_tick, .hash = keel_world_hash(keel_runtime_world(d.rt)) };
    demo_close(&d);
    return s;
}

/* Sums the raw bytes read and one byte of each payload (so that none is dead). */
typedef struct read_sum {
    double raw, sum;
} read_sum;

static void add_payload(const kw_header *h, const void *payload, void *arg)
{
    read_sum *s = arg;
    s->raw += h->raw_len;
    if (h->raw_len)
        s->sum += ((const unsigned char *)payload)[h->raw_len - 1];
}

/* Read, CRC-check and decompress every WAL record of dir through
 * libkeel_wal alone: what any replay must at least do. MB/s of raw payload
 * per CPU second. */
static double wal_read_mbps(const char *dir)
{
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_READONLY }, &st), "kw_store_open");
    kw_codec_ctx *c;
    check(kw_codec_create(&(kw_codec_desc){ 0 }, &c), "kw_codec_create");
    read_sum s = { 0 };
    double c0 = process_cpu_s();
    wal_each_payload(st, c, add_payload, &s);
    double c1 = process_cpu_s();
    g_sink = s.sum;
    kw_codec_destroy(c);
    kw_store_close(st);
    return s.raw / 1e6 / (c1 - c0);
}

/* The apply's floor: the same read, then each logged value row written the
 * way any replay must at least write it -- its slot read, its handle
 * compared with the one its row holds, its value stored -- into plain
 * arrays (a row per slot index, one value array per component) rather than
 * keel's tables. A group goes in two passes, like keel's replay: its rows
 * resolved (slots requested, then read and their entries requested, then
 * the handles compared), then its values stored (cells requested, then
 * written), each step over a block of FLOOR_BLOCK rows so that a block's
 * misses are in flight together; a group with its predecessor's handles
 * reuses their rows. The floor keeps keel's data model -- a handle names a
 * slot, the slot a row -- and nothing else. */
#define FLOOR_BLOCK 64
#define FLOOR_COMPS 64

typedef struct plain_apply {
    uint32_t nslots;
    uint64_t *slot;                       /* the row of each slot index (here: the index) */
    uint64_t *entity;                     /* the handle at each row */
    unsigned char *cells[FLOOR_COMPS];    /* per component: a value per row */
    uint32_t size[FLOOR_COMPS];
    double raw;
    kw_decoder dec;
    uint64_t *rows;                       /* the rows of the last group resolved */
    uint32_t cap;
} plain_apply;

/* Make room for slot index idx (the untimed pass sees every index first). */
static void plain_grow(plain_apply *a, uint32_t idx)
{
    uint32_t n = idx + 1 > a->nslots * 2 ? idx + 1 : a->nslots * 2;
    if (!(a->slot = realloc(a->slot, (size_t)n * 8)) || !(a->entity = realloc(a->entity, (size_t)n * 8)))
        check(KEEL_ENOMEM, "recovery_floor");
    for (uint32_t i = a->nslots; i < n; i++) {
        a->slot[i] = i;
        a->entity[i] = 0;
    }
    for (uint32_t c = 0; c < FLOOR_COMPS; c++)
        if (a->cells[c] && !(a->cells[c] = realloc(a->cells[c], (size_t)n * a->size[c])))
            check(KEEL_ENOMEM, "recovery_floor");
    a->nslots = n;
}

/* Group g's component checked as keel's replay checks it (one it holds,
 * with the size it first had), its value array made on first sight. */
static void plain_comp(plain_apply *a, const kw_group *g)
{
    if (g->component >= FLOOR_COMPS || (a->cells[g->component] && a->size[g->component] != g->size)) {
        fprintf(stderr, "keel-bench: recovery_floor: component %u of size %u does not fit\n", g->component, g->size);
        exit(1);
    }
    if (!a->cells[g->component] && g->size) {
        size_t bytes = (size_t)(a->nslots ? a->nslots : 1) * g->size;
        a->size[g->component] = g->size;
        a->cells[g->component] = xmalloc(bytes);
        memset(a->cells[g->component], 0, bytes);
    }
}

/* The end of the block of rows that starts at row b of n. */
static uint32_t floor_block_end(uint32_t b, uint32_t n)
{
    return n - b < FLOOR_BLOCK ? n : b + FLOOR_BLOCK;
}

/* A value's store, as fixed-size moves for the common sizes. */
static inline void plain_copy(void *dst, const void *src, uint32_t size)
{
    switch (size) {
    case 4:  memcpy(dst, src, 4); break;
    case 8:  memcpy(dst, src, 8); break;
    case 12: memcpy(dst, src, 12); break;
    case 16: memcpy(dst, src, 16); break;
    default: memcpy(dst, src, size); break;
    }
}

static uint64_t plain_handle(const kw_group *g, uint32_t i)
{
    uint64_t e;
    memcpy(&e, g->entities + (size_t)i * 8, 8);
    return e;
}

/* Pass 1: group g's rows into a->rows, each handle compared with its row's. */
static void plain_resolve(plain_apply *a, const kw_group *g)
{
    if (g->n > a->cap) {
        a->cap = g->n * 2;
        if (!(a->rows = realloc(a->rows, a->cap * sizeof *a->rows)))
            check(KEEL_ENOMEM, "recovery_floor");
    }
    for (uint32_t b = 0; b < g->n; b += FLOOR_BLOCK) {
        uint32_t end = floor_block_end(b, g->n);
        for (uint32_t i = b; i < end; i++) {
            uint32_t idx = KEEL_ENTITY_INDEX(plain_handle(g, i));
            if (idx >= a->nslots)
                plain_grow(a, idx);
            __builtin_prefetch(&a->slot[idx]);
        }
        for (uint32_t i = b; i < end; i++) {
            a->rows[i] = a->slot[KEEL_ENTITY_INDEX(plain_handle(g, i))];
            __builtin_prefetch(&a->entity[a->rows[i]]);
        }
        for (uint32_t i = b; i < end; i++) {
            uint64_t e = plain_handle(g, i);
            if (a->entity[a->rows[i]] != e) /* the slot was reused: its new handle from now on */
                a->entity[a->rows[i]] = e;
        }
    }
}

/* Pass 2: group g's values into the rows pass 1 found. */
static void plain_store(plain_apply *a, const kw_group *g)
{
    if (!g->size)
        return;
    unsigned char *base = a->cells[g->component], *cell[FLOOR_BLOCK];
    for (uint32_t b = 0; b < g->n; b += FLOOR_BLOCK) {
        uint32_t end = floor_block_end(b, g->n);
        for (uint32_t i = b; i < end; i++) {
            cell[i - b] = base + a->rows[i] * g->size;
            __builtin_prefetch(cell[i - b], 1);
        }
        for (uint32_t i = b; i < end; i++)
            plain_copy(cell[i - b], g->values + (size_t)i * g->size, g->size);
    }
}

static void plain_record(const kw_header *h, const void *payload, void *arg)
{
    plain_apply *a = arg;
    a->raw += h->raw_len;
    if (h->kind != KW_KIND_TICK_CHUNK)
        return;
    check(kw_decode_record(&a->dec, h, payload, NULL), "kw_decode_record");
    kw_group g, prev = { 0 };
    int rc;
    while ((rc = kw_decode_group(&a->dec, &g)) == 1) {
        plain_comp(a, &g);
        if (!(prev.entities && prev.n == g.n && memcmp(prev.entities, g.entities, (size_t)g.n * 8) == 0))
            plain_resolve(a, &g);
        plain_store(a, &g);
        prev = g;
    }
    check(rc, "kw_decode_group");
}

/* One pass of plain_record over dir's WAL in a store of its own (a fresh
 * map, as the ceiling's): CPU seconds. */
static double plain_pass(const char *dir, plain_apply *a)
{
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_READONLY }, &st), "kw_store_open");
    kw_codec_ctx *c;
    check(kw_codec_create(&(kw_codec_desc){ 0 }, &c), "kw_codec_create");
    a->raw = 0;
    double c0 = process_cpu_s();
    wal_each_payload(st, c, plain_record, a);
    double c1 = process_cpu_s();
    kw_codec_destroy(c);
    kw_store_close(st);
    return c1 - c0;
}

/* MB of raw WAL per CPU second of the read ceiling's work plus the plain
 * apply of its value rows, after an untimed pass that sizes the arrays. */
static double plain_apply_mbps(const char *dir, plain_apply *a)
{
    if (!a->nslots)
        (void)plain_pass(dir, a);
    double cpu = plain_pass(dir, a);
    return a->raw / 1e6 / cpu;
}

static void plain_apply_free(plain_apply *a)
{
    free(a->slot);
    free(a->entity);
    for (uint32_t c = 0; c < FLOOR_COMPS; c++)
        free(a->cells[c]);
    free(a->rows);
}

void bench_recovery(const config *cfg)
{
    keep_heap_resident();
    demo_opts o = { .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .churn = DEMO_CHURN, .ckpt_ticks = -1,
                    .telemetry = 1024, .schedule = true };
    demo d;
    /* For the record: the same ticks without a data directory. */
    demo_open(&d, &o);
    for (uint32_t t = 0; t <= WAL_WARM_TICKS; t++)
        step(d.rt);
    uint64_t m0 = now_ns();
    for (uint32_t t = 0; t < RECOVERY_OFF_TICKS; t++)
        step(d.rt);
    double off_ms = (double)(now_ns() - m0) / 1e6 / RECOVERY_OFF_TICKS;
    demo_close(&d);
    /* Build: populate 1M (the first tick's hook), checkpoint, close: dir
     * `ckpt`; a copy of it, `full`, then gets RECOVERY_TICKS ticks of WAL. */
    uint64_t b0 = now_ns();
    char *ckpt = make_tmpdir("rec-ckpt"), *full = make_tmpdir("rec-full");
    o.dir = ckpt;
    demo_open(&d, &o);
    step(d.rt);
    check(keel_checkpoint(d.rt), "keel_checkpoint");
    uint64_t ckpt_hash = keel_world_hash(keel_runtime_world(d.rt)), ckpt_tick = keel_runtime_tick(d.rt);
    demo_close(&d);
    copy_tmpdir(ckpt, full);
    uint64_t b1 = now_ns();
    o.dir = full;
    demo_open(&d, &o);
    for (uint32_t t = 0; t < RECOVERY_TICKS; t++)
        step(d.rt);
    check(keel_flush(d.rt), "keel_flush");
    uint64_t full_hash = keel_world_hash(keel_runtime_world(d.rt)), full_tick = keel_runtime_tick(d.rt);
    keel_runtime_stats bs;
    keel_runtime_stats_get(d.rt, &bs);
    demo_close(&d);
    uint64_t b2 = now_ns();
    note(cfg, "recovery: built in %.1f s: populate %u, checkpoint of tick %llu, copy: %.1f s; %u ticks with the WAL "
              "on: %.1f s (%.1f ms/tick, flush included; the same ticks with the WAL off: %.1f ms/tick); "
              "%.1f MB WAL stored", (double)(b2 - b0) / 1e9, RECOVERY_ENTITIES, (unsigned long long)ckpt_tick,
         (double)(b1 - b0) / 1e9, RECOVERY_TICKS, (double)(b2 - b1) / 1e9, (double)(b2 - b1) / 1e6 / RECOVERY_TICKS,
         off_ms, (double)bs.wal_bytes / 1e6);

    uint32_t R = cfg->rounds;
    double *bw = xmalloc(R * sizeof *bw), *sw = xmalloc(R * sizeof *sw), *sc = xmalloc(R * sizeof *sc);
    double *rp = xmalloc(R * sizeof *rp), *rd = xmalloc(R * sizeof *rd), *fl = xmalloc(R * sizeof *fl);
    plain_apply pa = { 0 };
    rec_sample last = { 0 };
    (void)recovery_measure(ckpt); /* warm-up: the page cache holds both directories */
    (void)recovery_measure(full);
    for (uint32_t r = 0; r < R; r++) {
        rec_sample a, b;
        if (r % 2 == 0) {
            a = recovery_measure(ckpt);
            b = recovery_measure(full);
        } else {
            b = recovery_measure(full);
            a = recovery_measure(ckpt);
        }
        if (a.hash != ckpt_hash || b.hash != full_hash || b.tick != full_tick) {
            fprintf(stderr, "keel-bench: recovery: recovered state differs (tick %llu, expected %llu; "
                    "hashes %s/%s)\n", (unsigned long long)b.tick, (unsigned long long)full_tick,
                    a.hash == ckpt_hash ? "ok" : "DIFFER", b.hash == full_hash ? "ok" : "DIFFER");
            exit(1);
        }
        if (r == 0 && a.tick != ckpt_tick) /* not fatal for the figure: the state is the checkpoint's */
            fprintf(stderr, "keel-bench: recovery: the checkpoint-only directory (checkpoint of tick %llu, no WAL "
                    "after it) recovers to tick %llu\n", (unsigned long long)ckpt_tick, (unsigned long long)a.tick);
        bw[r] = a.wall_s;
        sw[r] = b.wall_s;
        sc[r] = b.raw_mb / b.cpu_s;
        rp[r] = b.cpu_s > a.cpu_s ? b.raw_mb / (b.cpu_s - a.cpu_s) : NAN;
        if (r % 2 == 0) {
            rd[r] = wal_read_mbps(full);
            fl[r] = plain_apply_mbps(full, &pa);
        } else {
            fl[r] = plain_apply_mbps(full, &pa);
            rd[r] = wal_read_mbps(full);
        }
        last = b;
    }
    double read_rate = median(rd, R);
    figure t = { .name = "recovery", .unit = "s", .value = median(sw, R), .baseline = median(bw, R), .no_target = true };
    report(cfg, &t);
    figure m = { .name = "recovery_mbps", .unit = "MB/s", .value = median(sc, R), .baseline = read_rate,
                 .target = 0.5, .target_on_ratio = true, .at_least = true };
    report(cfg, &m);
    figure p = { .name = "recovery_replay", .unit = "MB/s", .value = median(rp, R), .baseline = read_rate,
                 .no_target = true };
    report(cfg, &p);
    figure f = { .name = "recovery_floor", .unit = "MB/s", .value = median(fl, R), .baseline = read_rate,
                 .no_target = true };
    report(cfg, &f);
    note(cfg, "recovery: %u entities + %u ticks (rows with (index + tick) %% %u == 0 of pos and vel, %u spawns + "
              "%u destroys per tick): checkpoint of tick %llu, then %.1f MB raw WAL in %llu records replayed "
              "to tick %llu", RECOVERY_ENTITIES, RECOVERY_TICKS, RECOVERY_TURN, DEMO_CHURN, DEMO_CHURN,
         (unsigned long long)last.checkpoint_tick, last.raw_mb, (unsigned long long)last.records,
         (unsigned long long)last.tick);
    note(cfg, "recovery: value = keel_runtime_recover seconds (checkpoint + WAL), baseline = the same "
              "checkpoint without the WAL; recovery_mbps = raw WAL MB per CPU second of the whole recovery "
              "(checkpoint load included); recovery_replay = raw WAL MB / (recovery - checkpoint-only) "
              "CPU seconds; their baseline: reading, CRC-checking and decompressing the same records with "
              "libkeel_wal alone, MB per CPU second; page cache warm");
    note(cfg, "recovery_floor: the read ceiling's work plus each value row written into plain arrays (its slot "
              "read, its handle compared, its value stored; a group in two passes of %u-row blocks, as keel's "
              "replay), MB per CPU second; no checkpoint, no lifecycle record applied; recovery_replay / "
              "recovery_floor = %.3f (recovery_mbps, the checkpoint included: %.3f)", FLOOR_BLOCK,
         median(rp, R) / median(fl, R), median(sc, R) / median(fl, R));
    plain_apply_free(&pa);
    free(fl);
    free(bw);
    free(sw);
    free(sc);
    free(rp);
    free(rd);
    remove_tmpdir(ckpt);
    remove_tmpdir(full);
}

/* ---- repl ---------------------------------------------------------------------- */

/* A fresh world on the cluster per measurement (a stream of its own). */
static keel_replication_desc repl_world(const bench_nats *nats, keel_repl_mode mode, char *name, size_t cap)
{
    static unsigned serial;
    snprintf(name, cap, "bench%u-%d", serial++, (int)getpid());
    return (keel_replication_desc){ .nats = nats->urls, .world = name, .mode = mode };
}

/* The stream's own ceiling: IMM_RECORD-byte records published through the
 * pipeline (kr_pipe_send, up to CEIL_WINDOW in flight, each expecting its
 * predecessor) to a fresh stream for about IMM_SECONDS; records/s. */
#define CEIL_WINDOW 2048u
#define REPL_TICK_HZ 1000.0 /* the repl figures' TickDriver rate */
typedef struct ceil_acks {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t acked;
    bool failed;
} ceil_acks;

static void ceil_on_ack(void *arg, uint64_t lsn, bool ok)
{
    ceil_acks *a = arg;
    pthread_mutex_lock(&a->mu);
    if (!ok)
        a->failed = true;
    else if (lsn > a->acked)
        a->acked = lsn;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static double stream_ceiling(const bench_nats *nats)
{
    char name[64];
    keel_replication_desc d = repl_world(nats, KEEL_REPL_SYNC, name, sizeof name);
    kr_node *n;
    check(kr_connect(&(kr_desc){ .urls = d.nats, .world = d.world, .create = true }, &n), "kr_connect");
    ceil_acks a = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    check(kr_pipe_open(n, ceil_on_ack, &a), "kr_pipe_open");
    unsigned char payload[IMM_RECORD];
    memset(payload, 0x5a, sizeof payload);
    uint64_t sent = 0, t0 = now_ns(), stop = t0 + (uint64_t)(IMM_SECONDS * 1e9);
    pthread_mutex_lock(&a.mu);
    while (!a.failed && (now_ns() < stop || a.acked < sent)) {
        if (now_ns() < stop && sent - a.acked < CEIL_WINDOW) {
            pthread_mutex_unlock(&a.mu);
            check(kr_pipe_send(n, 1, sent + 1, sent > 0, payload, sizeof payload), "kr_pipe_send");
            sent++;
            pthread_mutex_lock(&a.mu);
        } else {
            pthread_cond_wait(&a.cv, &a.mu);
        }
    }
    bool failed = a.failed;
    pthread_mutex_unlock(&a.mu);
    if (failed) {
        fprintf(stderr, "keel-bench: repl_stream_ceiling: the stream refused a record\n");
        exit(1);
    }
    double rate = (double)sent / ((double)(now_ns() - t0) / 1e9);
    kr_close(n);
    return rate;
}

/* ---- repl_bootstrap ---- */

#define BOOT_SAMPLES 3 /* bootstraps (and local recoveries) of each published world */

/* A fresh read replica of a world whose stream was purged to its published
 * checkpoint of RECOVERY_ENTITIES entities, BOOT_SAMPLES times, each into a
 * new directory: keel_runtime_recover copies the checkpoint from the stream
 * and loads it (boot[i], s); alternated with local[i]: the same checkpoint
 * recovered from a copy of the primary's own directory (s). */
/* CPU seconds the NATS servers used so far (/proc, in clock ticks). */
static double servers_cpu_s(const bench_nats *nats)
{
    double ticks = 0;
    for (int i = 0; i < nats->n; i++) {
        char path[64], buf[1024];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)nats->pid[i]);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[len] = '\0';
        const char *p = strrchr(buf, ')'); /* the fields after the command's name */
        unsigned long utime = 0, stime = 0;
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) == 2)
            ticks += (double)(utime + stime);
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}

/* The published checkpoint of world `name` read from the stream alone, as
 * a bootstrap reads it (connect, find it, fetch every message, walk its
 * entries), nothing decoded or written (s): the part of a bootstrap no
 * work on the replica's side can remove. */
static double stream_read_measure(const bench_nats *nats, const char *name)
{
    char *dir = make_tmpdir("boots");
    kw_store *s;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_CREATE }, &s), "kw_store_open");
    uint64_t t0 = now_ns();
    kr_node *n;
    check(kr_connect(&(kr_desc){ .urls = nats->urls, .world = name }, &n), "kr_connect");
    kr_boot *b;
    check(kr_boot_begin(n, s, &b), "kr_boot_begin");
    const void *k, *v;
    size_t kn, vn;
    int rc;
    while ((rc = kr_boot_next(b, &k, &kn, &v, &vn)) == 1)
        ;
    check(rc, "reading the published checkpoint");
    double t = (double)(now_ns() - t0) / 1e9;
    kr_boot_end(b, KEEL_EBUSY); /* nothing written */
    (void)kr_boot_settle(b);
    kr_close(n);
    kw_store_close(s);
    remove_tmpdir(dir);
    return t;
}

/* CPU seconds the bootstraps used, in this process and in the NATS servers. */
typedef struct boot_cpu {
    double replica, servers;
} boot_cpu;

static void bootstrap_measure(const bench_nats *nats, double *boot, double *local, double *stream, boot_cpu *cpu)
{
    char name[64];
    keel_replication_desc pd = repl_world(nats, KEEL_REPL_ASYNC, name, sizeof name);
    pd.retain_records = 1; /* the stream keeps nothing before the checkpoint: a new replica must load it */
    char *pdir = make_tmpdir("bootp"), *copy = make_tmpdir("bootc");
    demo d;
    demo_open(&d, &(demo_opts){ .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .dir = pdir, .ckpt_ticks = -1,
                                .telemetry = 1024, .schedule = true, .repl = pd });
    step(d.rt);
    check(keel_checkpoint(d.rt), "keel_checkpoint");
    keel_repl_status st;
    do { /* the publisher sends the checkpoint once the stream holds its marker */
        struct timespec ms = { 0, 10000000 };
        nanosleep(&ms, NULL);
        keel_repl_status_get(d.rt, &st);
    } while (!st.checkpoint_lsn);
    uint64_t hash = keel_world_hash(keel_runtime_world(d.rt));
    demo_close(&d);
    copy_tmpdir(pdir, copy);
    for (int i = 0; i < BOOT_SAMPLES; i++) {
        char *fdir = make_tmpdir("bootf");
        keel_replication_desc fd = { .nats = nats->urls, .world = name, .role = KEEL_ROLE_FOLLOWER };
        demo_open(&d, &(demo_opts){ .n = RECOVERY_ENTITIES, .turn = RECOVERY_TURN, .dir = fdir, .ckpt_ticks = -1,
                                    .repl = fd });
        double c0 = process_cpu_s(), s0 = servers_cpu_s(nats);
        uint64_t t0 = now_ns();
        check(keel_runtime_recover(d.rt, NULL), "bootstrapping the read replica");
        boot[i] = (double)(now_ns() - t0) / 1e9;
        cpu->replica += process_cpu_s() - c0;
        cpu->servers += servers_cpu_s(nats) - s0;
        keel_repl_status_get(d.rt, &st);
        if (!st.bootstrapped || keel_world_hash(keel_runtime_world(d.rt)) != hash) {
            fprintf(stderr, "keel-bench: repl_bootstrap: the replica %s, its hash %s the primary's\n",
                    st.bootstrapped ? "bootstrapped" : "did not bootstrap",
                    keel_world_hash(keel_runtime_world(d.rt)) == hash ? "equals" : "differs from");
            exit(1);
        }
        demo_close(&d); /* waits for the directory's copy of the checkpoint */
        remove_tmpdir(fdir);
        rec_sample r = recovery_measure(copy);
        local[i] = r.wall_s;
        if (r.hash != hash) {
            fprintf(stderr, "keel-bench: repl_bootstrap: the local recovery's hash differs from the primary's\n");
            exit(1);
        }
        stream[i] = stream_read_measure(nats, name);
    }
    remove_tmpdir(pdir);
    remove_tmpdir(copy);
}

static void repl_bootstrap(const config *cfg, const bench_nats *nats)
{
    uint32_t R = cfg->rounds, n = R * BOOT_SAMPLES;
    double *boot = xmalloc(n * sizeof *boot), *loc = xmalloc(n * sizeof *loc), *str = xmalloc(n * sizeof *str);
    boot_cpu cpu = {0};
    for (uint32_t r = 0; r < R; r++)
        bootstrap_measure(nats, &boot[r * BOOT_SAMPLES], &loc[r * BOOT_SAMPLES], &str[r * BOOT_SAMPLES], &cpu);
    double local = median(loc, n);
    figure fb = { .name = "repl_bootstrap", .unit = "s", .value = median(boot, n), .baseline = local,
                  .target = 2, .target_on_ratio = true };
    figure fs = { .name = "repl_bootstrap_stream", .unit = "s", .value = median(str, n), .baseline = local,
                  .no_target = true };
    report(cfg, &fb);
    report(cfg, &fs);
    note(cfg, "repl_bootstrap: a fresh read replica of a %u-entity world whose stream keeps nothing before its "
              "published checkpoint: keel_runtime_recover (connect, load the checkpoint as the stream delivers it; "
              "the directory's copy commits in the background); baseline: keel_runtime_recover of the same "
              "checkpoint in a copy of the primary's directory; %u of each per published world, alternated, the "
              "first right after publishing; target: at least half the local speed (ratio <= 2)",
         RECOVERY_ENTITIES, BOOT_SAMPLES);
    note(cfg, "repl_bootstrap_stream: the same checkpoint read from the stream alone (connect, find it, fetch "
              "every message; nothing decoded or written), in the same rounds");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double per = (cpu.replica + cpu.servers) / n;
    note(cfg, "repl_bootstrap: CPU per bootstrap %.1f ms in the replica's process + %.1f ms in the NATS servers: "
              "on %ld cores at least %.1f ms of wall time, %.2fx the local recovery", cpu.replica / n * 1e3,
         cpu.servers / n * 1e3, cores, per / (double)cores * 1e3, local > 0 ? per / (double)cores / local : 0.0);
    free(boot);
    free(loc);
    free(str);
}

void bench_repl(const config *cfg)
{
    keep_heap_resident();
    bench_nats nats;
    if (!bench_nats_start(&nats, 3)) {
        fprintf(stderr, "keel-bench: repl: no NATS JetStream cluster (nats-server installed?): figures skipped\n");
        return;
    }
    uint32_t R = cfg->rounds;
    imm_sample *local = xmalloc(R * sizeof *local), *sync = xmalloc(R * sizeof *sync),
               *async = xmalloc(R * sizeof *async), *local_u = xmalloc(R * sizeof *local_u),
               *sync_u = xmalloc(R * sizeof *sync_u);
    double *ceiling = xmalloc(R * sizeof *ceiling);
    char name[64];
    keel_replication_desc d = repl_world(&nats, KEEL_REPL_SYNC, name, sizeof name);
    (void)imm_measure(IMM_WINDOW, REPL_TICK_HZ, &d); /* warm-up */
    for (uint32_t r = 0; r < R; r++) {
        if (r % 2 == 0)
            local[r] = imm_measure(IMM_WINDOW, REPL_TICK_HZ, NULL);
        d = repl_world(&nats, KEEL_REPL_SYNC, name, sizeof name);
        sync[r] = imm_measure(IMM_WINDOW, REPL_TICK_HZ, &d);
        d = repl_world(&nats, KEEL_REPL_ASYNC, name, sizeof name);
        async[r] = imm_measure(IMM_WINDOW, REPL_TICK_HZ, &d);
        if (r % 2 == 1)
            local[r] = imm_measure(IMM_WINDOW, REPL_TICK_HZ, NULL);
        local_u[r] = imm_measure(IMM_WINDOW, -1, NULL);
        d = repl_world(&nats, KEEL_REPL_SYNC, name, sizeof name);
        sync_u[r] = imm_measure(IMM_WINDOW, -1, &d);
        ceiling[r] = stream_ceiling(&nats);
    }
    double base = imm_median(local, R, offsetof(imm_sample, tps));
    figure fs = { .name = "repl_sync_immediate", .unit = "commits/s", .value = imm_median(sync, R, offsetof(imm_sample, tps)),
                  .baseline = base, .target = 0.5, .target_on_ratio = true, .at_least = true };
    figure fa = { .name = "repl_async_immediate", .unit = "commits/s",
                  .value = imm_median(async, R, offsetof(imm_sample, tps)), .baseline = base, .no_target = true };
    figure l50 = { .name = "repl_sync_immediate_p50", .unit = "ms", .value = imm_median(sync, R, offsetof(imm_sample, p50)),
                   .baseline = imm_median(local, R, offsetof(imm_sample, p50)), .no_target = true };
    figure l99 = { .name = "repl_sync_immediate_p99", .unit = "ms", .value = imm_median(sync, R, offsetof(imm_sample, p99)),
                   .baseline = imm_median(local, R, offsetof(imm_sample, p99)), .no_target = true };
    figure fu = { .name = "repl_sync_immediate_unthrottled", .unit = "commits/s",
                  .value = imm_median(sync_u, R, offsetof(imm_sample, tps)),
                  .baseline = imm_median(local_u, R, offsetof(imm_sample, tps)), .no_target = true };
    report(cfg, &fs);
    report(cfg, &fa);
    report(cfg, &l50);
    report(cfg, &l99);
    report(cfg, &fu);
    figure fc = { .name = "repl_stream_ceiling", .unit = "records/s", .value = median(ceiling, R), .baseline = base,
                  .no_target = true };
    report(cfg, &fc);
    note(cfg, "repl_stream_ceiling: %u-byte records published to the 3-node stream alone, up to %u in flight "
              "(each expecting its predecessor), for %.1f s: the most records/s sync replication can carry here; "
              "baseline: local-only IMMEDIATE transfers/s", IMM_RECORD, CEIL_WINDOW, IMM_SECONDS);
    note(cfg, "repl: value = IMMEDIATE transfers/s (%u threads x %u in flight, as immediate) with sync / async "
              "replication to a 3-node JetStream cluster on loopback (R3, file storage), the TickDriver at %.0f Hz "
              "as a server runs it; baseline = the same without replication, in the same rounds", IMM_THREADS,
         IMM_WINDOW, REPL_TICK_HZ);
    double ur = imm_median(sync_u, R, offsetof(imm_sample, records_per_s));
    note(cfg, "repl_sync_immediate_unthrottled: the same, sync, with the unthrottled keel_runtime_step loop of "
              "immediate, against local-only with that loop: the loop spins one of the machine's cores, which the "
              "three NATS servers then lack; %.0f records/s of %.1f transfers (%.0f ticks/s)", ur,
         ur > 0 ? fu.value / ur : 0.0, imm_median(sync_u, R, offsetof(imm_sample, ticks_per_s)));
    double sr = imm_median(sync, R, offsetof(imm_sample, records_per_s)),
           lr = imm_median(local, R, offsetof(imm_sample, records_per_s));
    note(cfg, "repl: WAL records (stream messages) per second: sync %.0f (%.1f transfers per record, %.0f ticks/s), "
              "local-only %.0f (%.1f transfers per record, %.0f ticks/s)", sr,
         sr > 0 ? imm_median(sync, R, offsetof(imm_sample, tps)) / sr : 0.0,
         imm_median(sync, R, offsetof(imm_sample, ticks_per_s)), lr, lr > 0 ? base / lr : 0.0,
         imm_median(local, R, offsetof(imm_sample, ticks_per_s)));
    free(local);
    free(local_u);
    free(sync_u);
    free(sync);
    free(async);
    free(ceiling);
    /* each family of figures on a fresh cluster: the transfer rounds leave a dozen full R3 streams behind,
       whose Raft groups keep the servers busy */
    bench_nats_stop(&nats);
    if (!bench_nats_start(&nats, 3)) {
        fprintf(stderr, "keel-bench: repl: the NATS cluster did not start again: lag and bootstrap skipped\n");
        return;
    }
    bench_repl_lag(cfg, nats.urls);
    repl_bootstrap(cfg, &nats);
    bench_nats_stop(&nats);
}

void bench_lag(const config *cfg)
{
    bench_nats nats;
    if (!bench_nats_start(&nats, 3)) {
        fprintf(stderr, "keel-bench: lag: no NATS JetStream cluster (nats-server installed?): figures skipped\n");
        return;
    }
    bench_repl_lag(cfg, nats.urls);
    bench_nats_stop(&nats);
}

void bench_bootstrap(const config *cfg)
{
    keep_heap_resident();
    bench_nats nats;
    if (!bench_nats_start(&nats, 3)) {
        fprintf(stderr, "keel-bench: bootstrap: no NATS JetStream cluster (nats-server installed?): figure skipped\n");
        return;
    }
    repl_bootstrap(cfg, &nats);
    bench_nats_stop(&nats);
}
