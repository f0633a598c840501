/*
 * tools/bench/bench_world.c -- the durability cost measured on the demo
 * itself: keel-world's world (tools/keel-world/world.c, the same code the
 * demo runs) at 100k agents, WAL on vs off.
 *
 * The world is the "demo-like workload" in data and in work: an
 * agent acts on one tick in ten, so about 10% of the durable rows (pos,
 * energy) change per tick, and every tick also moves, feeds, kills and
 * replaces agents and runs 8 IMMEDIATE trades that `settle` acknowledges once
 * they are on disk (in the same tick or a later one). bench_demo.c's
 * synthetic workload changes the same share of rows with almost no work per
 * tick, which isolates the WAL's own cost (wal_min).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "world.h"
#include "keel_wal/wal.h"

#define WORLD_AGENTS 100000u
#define WORLD_SEED 1u

/* Open the demo world as keel-world does (its setup(), without the report
 * protocol and the status line), unthrottled, checkpoints off. */
static keel_system g_settle;      /* the settle system's index */

static void world_open(world_app *app, const char *dir, int32_t level)
{
    *app = (world_app){ .seed = WORLD_SEED, .initial_entities = WORLD_AGENTS, .report_fd = -1 };
    keel_runtime_desc desc = {
        .workers = -1, .tick_rate_hz = -1, .telemetry_capacity = pow2_at_least(WAL_TICKS + WAL_WARM_TICKS + 2),
        .on_first_tick = world_first_tick, .hook_user = app,
        .durable = { .dir = dir, .zstd_level = level, .checkpoint_every_ticks = -1,
                     .checkpoint_every_bytes = -1, .checkpoint_every_seconds = -1 },
    };
    check(keel_runtime_create(&desc, &app->rt), "keel_runtime_create");
    app->w = keel_runtime_world(app->rt);
    keel_schedule *s;
    if (world_register(app))
        check(KEEL_EINVAL, "world_register");
    check(keel_schedule_create(app->rt, &s), "keel_schedule_create");
    if (world_add_systems(app, s))
        check(KEEL_EINVAL, "world_add_systems");
    for (keel_system i = 0; i < keel_schedule_system_count(s); i++)
        if (!strcmp(keel_schedule_system_name(s, i), "settle"))
            g_settle = i;
    check(keel_runtime_set_schedule(app->rt, s), "keel_runtime_set_schedule");
}

/* Mean wall time per timed tick of `settle`, which acknowledges the trades
 * already durable (telemetry of the last WAL_TICKS ticks). */
static double settle_ms(const world_app *app)
{
    uint64_t last = keel_runtime_tick(app->rt);
    double sum = 0;
    for (uint64_t t = last - WAL_TICKS + 1; t <= last; t++) {
        keel_system_record rec;
        check(keel_telemetry_system(app->rt, t, g_settle, &rec), "keel_telemetry_system");
        sum += (double)(rec.end_ns - rec.start_ns) / 1e6;
    }
    return sum / WAL_TICKS;
}

static void world_close(world_app *app)
{
    world_settle_all(app, true);
    keel_query_destroy(app->players);
    keel_query_destroy(app->merchants);
    keel_query_destroy(app->agents);
    keel_runtime_close(app->rt);
}

/* One measurement, WAL off (level WAL_OFF) or on (GROUP) at a zstd level. */
static wal_sample world_measure(int32_t level, double *settle)
{
    char *dir = level == WAL_OFF ? NULL : make_tmpdir("world");
    world_app app;
    world_open(&app, dir, level == WAL_OFF ? 0 : level);
    wal_sample r;
    wal_time_ticks(app.rt, &r);
    *settle = settle_ms(&app);
    uint64_t trades = atomic_load(&app.trades) + atomic_load(&app.refused);
    if (trades < (uint64_t)TRADES_PER_TICK * WAL_TICKS) {
        fprintf(stderr, "keel-bench: wal_world: %llu trades settled, expected at least %u\n",
                (unsigned long long)trades, TRADES_PER_TICK * WAL_TICKS);
        exit(1);
    }
    world_close(&app);
    if (dir)
        remove_tmpdir(dir);
    return r;
}

/* ---- the disk's bound ------------------------------------------------------- */

#define DISK_TICKS_PER_COMMIT 8u   /* generous: the writer groups fewer ticks at these rates */
#define DISK_SECONDS 1.0

typedef struct disk_fill {
    const kw_buf *recs;            /* a commit's records */
    uint32_t nrec;
    size_t rec_len;
    uint64_t lsn;
} disk_fill;

static int disk_fill_fn(kw_wtxn *txn, void *arg)
{
    disk_fill *f = arg;
    for (uint32_t i = 0; i < f->nrec; i++) {
        int rc = kw_put_wal(txn, f->lsn + 1 + i, f->recs->p + (size_t)i * f->rec_len, f->rec_len);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

/* Synced MB/s of appending `stored_per_tick` bytes per tick as records of
 * about 64 KB (incompressible payload, stored raw), `ticks` ticks per LMDB
 * commit, into a fresh directory for DISK_SECONDS: with
 * DISK_TICKS_PER_COMMIT, the write bandwidth the WAL writer could get from
 * this disk at best. The process CPU per tick those appends took goes to
 * *cpu_ms unless NULL: LMDB's copy into its pages, the kernel's pwrite and
 * fdatasync. */
static double disk_mb_per_s(double stored_per_tick, double ticks, double *cpu_ms)
{
    char *dir = make_tmpdir("disk");
    kw_store *st;
    check(kw_store_open(dir, &(kw_store_desc){ .flags = KW_OPEN_CREATE }, &st), "kw_store_open");
    kw_codec_ctx *codec;
    check(kw_codec_create(&(kw_codec_desc){ .level = 0 }, &codec), "kw_codec_create");
    size_t total = (size_t)(stored_per_tick * ticks), chunk = 64u << 10;
    uint32_t nrec = (uint32_t)((total + chunk - 1) / chunk);
    unsigned char *payload = xmalloc(chunk);
    uint64_t st64 = 42;
    for (size_t i = 0; i < chunk; i += 8) {
        uint64_t x = splitmix64(&st64);
        memcpy(payload + i, &x, 8);
    }
    kw_buf recs = { 0 }, one = { 0 };
    check(kw_record_build(codec, &one, KW_KIND_TICK_CHUNK, 1, 1, 0, payload, total / nrec), "kw_record_build");
    for (uint32_t i = 0; i < nrec; i++)
        check(kw_put_bytes(&recs, one.p, one.len), "kw_put_bytes");
    disk_fill f = { .recs = &recs, .nrec = nrec, .rec_len = one.len };
    uint64_t t0 = now_ns(), stop_at = t0 + (uint64_t)(DISK_SECONDS * 1e9), t = t0, bytes = 0, commits = 0;
    double c0 = process_cpu_s();
    while (t < stop_at) {
        check(kw_store_write(st, disk_fill_fn, &f), "kw_store_write");
        f.lsn += nrec;
        bytes += recs.len;
        commits++;
        t = now_ns();
    }
    if (cpu_ms)
        *cpu_ms = (process_cpu_s() - c0) * 1e3 / ((double)commits * ticks);
    kw_buf_free(&recs);
    kw_buf_free(&one);
    free(payload);
    kw_codec_destroy(codec);
    kw_store_close(st);
    remove_tmpdir(dir);
    return (double)bytes / 1e6 / ((double)(t - t0) / 1e9);
}

/* ---- the codec on the demo's own payloads ------------------------------------ */

/* The codec runs on the payloads of the ticks the wal figures time (after
 * the same warm-up), every CODEC_EVERY-th of them: the world's values drift
 * from their initial layout, and with them the codec's speed and ratio. */
#define CODEC_EVERY 7u

/* The tick_chunk payloads collected from a directory, back to back in all,
 * their lengths in lens. */
typedef struct payloads {
    kw_buf *all;
    size_t *lens;
    uint32_t n, cap;
} payloads;

static void keep_tick_chunk(const kw_header *h, const void *payload, void *arg)
{
    payloads *p = arg;
    uint64_t first = 2 + WAL_WARM_TICKS; /* tick 1 populates the world */
    if (h->kind != KW_KIND_TICK_CHUNK || h->tick < first || (h->tick - first) % CODEC_EVERY)
        return;
    check(kw_put_bytes(p->all, payload, h->raw_len), "kw_put_bytes");
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        size_t *grown = realloc(p->lens, p->cap * sizeof *p->lens);
        if (!grown)
            check(KEEL_ENOMEM, "realloc");
        p->lens = grown;
    }
    p->lens[p->n++] = h->raw_len;
}

/* The tick_chunk payloads of every CODEC_EVERY-th tick the wal figures
 * time, back to back in *all, their lengths in lens. */
static uint32_t demo_payloads(kw_buf *all, size_t **lens)
{
    char *dir = make_tmpdir("codec");
    world_app app;
    world_open(&app, dir, 0);
    for (uint32_t t = 0; t <= WAL_WARM_TICKS + WAL_TICKS; t++)
        step(app.rt);
    world_close(&app);
    kw_store *st;
    kw_codec_ctx *c;
    check(kw_store_open(dir, &(kw_store_desc){ 0 }, &st), "kw_store_open");
    check(kw_codec_create(NULL, &c), "kw_codec_create");
    payloads p = { .all = all };
    wal_each_payload(st, c, keep_tick_chunk, &p);
    kw_codec_destroy(c);
    kw_store_close(st);
    remove_tmpdir(dir);
    *lens = p.lens;
    return p.n;
}

/* Build every payload as a record with codec context c, back to back into
 * recs, record i ending at ends[i]; seconds taken. */
static double codec_write(kw_codec_ctx *c, const kw_buf *all, const size_t *lens, uint32_t n, kw_buf *recs,
                          size_t *ends)
{
    uint64_t t0 = now_ns();
    recs->len = 0;
    for (uint32_t i = 0, off = 0; i < n; off += (uint32_t)lens[i++]) {
        check(kw_record_build(c, recs, KW_KIND_TICK_CHUNK, i + 1, 2, 0, all->p + off, lens[i]), "kw_record_build");
        ends[i] = recs->len;
    }
    return (double)(now_ns() - t0) / 1e9;
}

/* Read every record of recs back as recovery does (check + payload);
 * seconds taken. */
static double codec_read(kw_codec_ctx *c, const kw_buf *recs, const size_t *ends, uint32_t n)
{
    uint64_t t0 = now_ns();
    for (uint32_t i = 0, off = 0; i < n; off = (uint32_t)ends[i++]) {
        kw_header h;
        const void *p;
        check(kw_record_check(recs->p + off, ends[i] - off, &h), "kw_record_check");
        check(kw_record_payload(c, recs->p + off, &h, &p), "kw_record_payload");
        g_sink += ((const unsigned char *)p)[h.raw_len / 2];
    }
    return (double)(now_ns() - t0) / 1e9;
}

/* The planar form (codec 2, docs/wal-format.md) against plain zstd (codec
 * 1) on the demo's own tick_chunk payloads, at the default level, in
 * alternating rounds: write and read MB/s of raw payload, and compression.
 * Returns the planar write MB/s (the codec alone, one thread). */
static double codec_figures(const config *cfg)
{
    kw_buf all = { 0 }, recs[2] = { { 0 } };
    size_t *lens;
    uint32_t n = demo_payloads(&all, &lens), R = cfg->rounds;
    kw_codec_ctx *c[2];
    /* the fence's own settings (src/durable/recover.c): level -1, hashLog 10 */
    check(kw_codec_create(&(kw_codec_desc){ .level = -1, .hash_log = 10, .plain = true }, &c[0]), "kw_codec_create");
    check(kw_codec_create(&(kw_codec_desc){ .level = -1, .hash_log = 10 }, &c[1]), "kw_codec_create");
    double *w[2], *rd[2], mb = (double)all.len / 1e6;
    size_t *ends[2];
    for (int k = 0; k < 2; k++) {
        w[k] = xmalloc(R * sizeof *w[k]);
        rd[k] = xmalloc(R * sizeof *rd[k]);
        ends[k] = xmalloc((n ? n : 1) * sizeof *ends[k]);
        codec_write(c[k], &all, lens, n, &recs[k], ends[k]); /* warm-up */
    }
    for (uint32_t r = 0; r < R; r++)
        for (int j = 0; j < 2; j++) {
            int k = r % 2 == 0 ? j : 1 - j;
            w[k][r] = mb / codec_write(c[k], &all, lens, n, &recs[k], ends[k]);
            rd[k][r] = mb / codec_read(c[k], &recs[k], ends[k], n);
        }
    double planar_mbps = median(w[1], R);
    figure fw = { .name = "codec_planar", .unit = "MB/s", .value = planar_mbps, .baseline = median(w[0], R),
                  .no_target = true };
    report(cfg, &fw);
    figure fr = { .name = "codec_planar_read", .unit = "MB/s", .value = median(rd[1], R),
                  .baseline = median(rd[0], R), .no_target = true };
    report(cfg, &fr);
    figure fz = { .name = "codec_planar_ratio", .unit = "x", .value = (double)all.len / (double)recs[1].len,
                  .baseline = (double)all.len / (double)recs[0].len, .no_target = true };
    report(cfg, &fz);
    note(cfg, "codec_planar: the demo's tick_chunk payloads of every %uth tick from %u to %u, the ticks the wal figures "
              "time (%u records, %.1f MB raw), built into "
              "records at zstd level -1, hashLog 10 (the fence's settings) as their planar form (codec 2, value) "
              "and as they are (codec 1, baseline): MB/s of raw payload written (kw_record_build) and read back "
              "(kw_record_check + kw_record_payload), and raw / stored bytes (48-byte headers included)",
         CODEC_EVERY, 2 + WAL_WARM_TICKS, 1 + WAL_WARM_TICKS + WAL_TICKS, n, mb);
    for (int k = 0; k < 2; k++) {
        free(w[k]);
        free(rd[k]);
        free(ends[k]);
        kw_buf_free(&recs[k]);
        kw_codec_destroy(c[k]);
    }
    kw_buf_free(&all);
    free(lens);
    return planar_mbps;
}

void bench_wal_world(const config *cfg)
{
    keep_heap_resident();
    uint32_t R = cfg->rounds;
    double *tps[2], *cpu[2], *wait[2], *fence = xmalloc(R * sizeof *fence), *raw = xmalloc(R * sizeof *raw),
           *stored = xmalloc(R * sizeof *stored), *syncs = xmalloc(R * sizeof *syncs);
    for (int k = 0; k < 2; k++) {
        tps[k] = xmalloc(R * sizeof *tps[k]);
        cpu[k] = xmalloc(R * sizeof *cpu[k]);
        wait[k] = xmalloc(R * sizeof *wait[k]);
    }
    double ignored;
    (void)world_measure(WAL_OFF, &ignored); /* untimed warm-up of each side */
    (void)world_measure(0, &ignored);
    for (uint32_t r = 0; r < R; r++)
        for (int j = 0; j < 2; j++) {
            int k = r % 2 == 0 ? j : 1 - j; /* WAL off first in even rounds */
            wal_sample s = world_measure(k ? 0 : WAL_OFF, &wait[k][r]);
            tps[k][r] = s.tps;
            cpu[k][r] = s.cpu_ms;
            if (k) {
                fence[r] = s.fence_ms;
                raw[r] = s.raw / WAL_TICKS / 1024;
                stored[r] = s.stored / WAL_TICKS / 1024;
                syncs[r] = s.fsyncs;
            }
        }
    double off = median(tps[0], R);
    figure f = { .name = "wal", .unit = "ticks/s", .value = median(tps[1], R), .baseline = off, .no_target = true };
    report(cfg, &f);
    figure c = { .name = "wal_cpu", .unit = "ms/tick", .value = median(cpu[1], R), .baseline = median(cpu[0], R),
                 .no_target = true };
    report(cfg, &c);
    double extra_ms = c.value - c.baseline, raw_kb = median(raw, R);
    figure st = { .name = "wal_settle", .unit = "ms/tick", .value = median(wait[1], R), .baseline = median(wait[0], R),
                  .no_target = true };
    report(cfg, &st);
    figure fe = { .name = "fence", .unit = "ms/tick", .value = median(fence, R), .baseline = off > 0 ? 1e3 / off : 0,
                  .no_target = true };
    report(cfg, &fe);
    /* The most ticks/s this disk admits at this tick's stored WAL bytes. */
    double per_tick = median(stored, R) * 1024, *mbps = xmalloc(R * sizeof *mbps), *io = xmalloc(R * sizeof *io);
    /* The floor's grouping: the wal side's, but at most one commit per tick
     * counted. The demo's trades are IMMEDIATE: each is acknowledged once
     * synced, so a WAL that does not hold them back syncs in every tick. */
    double nsyncs = median(syncs, R), ticks_per_sync = nsyncs < WAL_TICKS ? WAL_TICKS / (nsyncs > 1 ? nsyncs : 1) : 1;
    for (uint32_t r = 0; r < R; r++) {
        mbps[r] = disk_mb_per_s(per_tick, DISK_TICKS_PER_COMMIT, NULL);
        (void)disk_mb_per_s(per_tick, ticks_per_sync, &io[r]);
    }
    double io_ms = median(io, R);
    free(io);
    free(syncs);
    double disk = median(mbps, R);
    figure b = { .name = "wal_disk_bound", .unit = "ticks/s", .value = disk * 1e6 / per_tick, .baseline = off,
                 .no_target = true };
    report(cfg, &b);
    note(cfg, "wal_disk_bound: synced LMDB appends of %.0f KB per tick (incompressible, as 64 KB records, %u ticks per "
              "commit) reach %.0f MB/s on this disk: no WAL implementation exceeds that many ticks/s here",
         per_tick / 1024, DISK_TICKS_PER_COMMIT, disk);
    free(mbps);
    note(cfg, "wal: the demo (tools/keel-world/world.c): %u agents, seed %u, an agent acts on one tick in ten (about "
              "10%% of the durable rows change per tick), %u IMMEDIATE trades per tick that `settle` acknowledges once on disk; "
              "%u workers, unthrottled keel_runtime_step, %u timed ticks after %u untimed, a fresh runtime and "
              "directory per measurement, checkpoints off; WAL %.0f KB raw, %.0f KB stored per tick",
         WORLD_AGENTS, WORLD_SEED, TRADES_PER_TICK, (unsigned)sysconf(_SC_NPROCESSORS_ONLN), WAL_TICKS, WAL_WARM_TICKS,
         median(raw, R), median(stored, R));
    note(cfg, "wal: value = ticks/s with the WAL on (GROUP, default zstd level; the final keel_flush is timed), "
              "baseline = the same world with durable.dir NULL; wal_cpu: process CPU per tick (all threads); "
              "wal_settle: wall time per tick of `settle`, which acknowledges the trades already on disk (it waits only "
              "when 8 ticks of trades are in flight); fence: the fence's wall time per tick vs the whole WAL-off tick");
    for (int k = 0; k < 2; k++) {
        free(tps[k]);
        free(cpu[k]);
        free(wait[k]);
    }
    /* The WAL's extra CPU per tick against the codec alone on the same
     * bytes: the codec's own MB/s on the demo's payloads, measured below in
     * this run, applied to this run's raw WAL bytes per tick. */
    double planar_mbps = codec_figures(cfg);
    figure x = { .name = "wal_extra_cpu", .unit = "ms/tick", .value = extra_ms,
                 .baseline = planar_mbps > 0 ? raw_kb * 1024 / 1e6 / planar_mbps * 1e3 : 0, .target = 1.5,
                 .target_on_ratio = true };
    report(cfg, &x);
    note(cfg, "wal_extra_cpu: process CPU per tick with the WAL on minus with it off (wal_cpu's two sides), "
              "baseline: the time the codec alone (codec_planar, one thread) takes for the same %.0f KB of raw "
              "WAL per tick", raw_kb);
    figure fl = { .name = "wal_extra_floor", .unit = "ms/tick", .value = x.baseline + io_ms, .baseline = x.baseline,
                  .no_target = true };
    report(cfg, &fl);
    note(cfg, "wal_extra_floor: the codec alone plus the process CPU per tick of synced appends of the same stored "
              "bytes, %.2f ticks per commit (the wal side made %.2f synced commits per tick; at most one counted) "
              "(%.3f ms: LMDB's copy, the kernel's pwrite and fdatasync): what compressing and durably writing these "
              "bytes takes without the capture or keel; wal_extra_cpu / wal_extra_floor = %.2f",
         ticks_per_sync, nsyncs / WAL_TICKS, io_ms, fl.value > 0 ? extra_ms / fl.value : 0);
    free(fence);
    free(raw);
    free(stored);
}

/* ---- repl_follower_lag --------------------------------------------------------------- */

#define LAG_SECONDS 5.0
#define LAG_WARM_TICKS 30u

/* A read replica of the demo world: its registrations, no systems. */
static void follower_open(world_app *app, const char *dir, const char *urls, const char *name)
{
    *app = (world_app){ .seed = WORLD_SEED, .initial_entities = WORLD_AGENTS, .report_fd = -1 };
    keel_runtime_desc desc = {
        .workers = 1, .durable = { .dir = dir },
        .replication = { .nats = urls, .world = name, .role = KEEL_ROLE_FOLLOWER },
    };
    check(keel_runtime_create(&desc, &app->rt), "keel_runtime_create");
    app->w = keel_runtime_world(app->rt);
    if (world_register(app))
        check(KEEL_EINVAL, "world_register");
    check(keel_runtime_recover(app->rt, NULL), "opening the read replica");
}

/* One measurement: the demo at 60 Hz on the TickDriver, an async primary,
 * and a read replica polling the stream in this thread; the lag (primary's
 * tick minus the replica's applied tick) sampled once per 1/60 s. The
 * replica opens once the stream holds the warm-up's ticks. */
static void lag_measure(const char *urls, double *p50, double *p99)
{
    static unsigned serial;
    char name[64];
    snprintf(name, sizeof name, "lag%u-%d", serial++, (int)getpid());
    char *pdir = make_tmpdir("lagp"), *fdir = make_tmpdir("lagf");
    world_app prim, fol;
    prim = (world_app){ .seed = WORLD_SEED, .initial_entities = WORLD_AGENTS, .report_fd = -1 };
    keel_runtime_desc desc = {
        .workers = -1, .tick_rate_hz = 60, .on_first_tick = world_first_tick, .hook_user = &prim,
        .durable = { .dir = pdir, .checkpoint_every_ticks = -1, .checkpoint_every_bytes = -1,
                     .checkpoint_every_seconds = -1 },
        .overload = { .disabled = true },
        .replication = { .nats = urls, .world = name, .mode = KEEL_REPL_ASYNC },
    };
    check(keel_runtime_create(&desc, &prim.rt), "keel_runtime_create");
    prim.w = keel_runtime_world(prim.rt);
    keel_schedule *s;
    if (world_register(&prim))
        check(KEEL_EINVAL, "world_register");
    check(keel_schedule_create(prim.rt, &s), "keel_schedule_create");
    if (world_add_systems(&prim, s))
        check(KEEL_EINVAL, "world_add_systems");
    check(keel_runtime_set_schedule(prim.rt, s), "keel_runtime_set_schedule");
    check(keel_runtime_run(prim.rt, LAG_WARM_TICKS), "keel_runtime_run");
    /* the warm-up ran unthrottled: let the stream take all of it, so the samples see 60 Hz from the start */
    check(keel_flush(prim.rt), "keel_flush");
    for (keel_repl_status st;; nanosleep(&(struct timespec){ 0, 1000000 }, NULL)) {
        keel_repl_status_get(prim.rt, &st);
        if (st.published_lsn >= keel_durable_lsn(prim.rt))
            break;
    }
    follower_open(&fol, fdir, urls, name);
    check(keel_runtime_start(prim.rt), "keel_runtime_start");
    size_t cap = (size_t)(LAG_SECONDS * 60 * 2) + 16, n = 0;
    double *lag = xmalloc(cap * sizeof *lag);
    uint64_t t0 = now_ns(), next = t0, end = t0 + (uint64_t)(LAG_SECONDS * 1e9);
    while (now_ns() < end) {
        check(keel_replica_poll(fol.rt, 2, NULL), "keel_replica_poll");
        uint64_t t = now_ns();
        if (t >= next && n < cap) {
            uint64_t pt = keel_runtime_tick(prim.rt), ft = keel_runtime_tick(fol.rt);
            lag[n++] = pt > ft ? (double)(pt - ft) : 0;
            next += 1000000000ull / 60;
        }
    }
    check(keel_runtime_stop(prim.rt), "keel_runtime_stop");
    *p50 = percentile(lag, n, 0.50);
    *p99 = percentile(lag, n, 0.99);
    free(lag);
    world_close(&fol);
    world_close(&prim);
    remove_tmpdir(pdir);
    remove_tmpdir(fdir);
}

void bench_repl_lag(const config *cfg, const char *urls)
{
    uint32_t R = cfg->rounds;
    double *p50 = xmalloc(R * sizeof *p50), *p99 = xmalloc(R * sizeof *p99);
    for (uint32_t r = 0; r < R; r++)
        lag_measure(urls, &p50[r], &p99[r]);
    figure f99 = { .name = "repl_follower_lag_p99", .unit = "ticks", .value = median(p99, R), .baseline = 1,
                   .target = 2 };
    figure f50 = { .name = "repl_follower_lag_p50", .unit = "ticks", .value = median(p50, R), .baseline = 1,
                   .no_target = true };
    report(cfg, &f99);
    report(cfg, &f50);
    note(cfg, "repl_follower_lag: the demo world (%u agents) at 60 Hz on the TickDriver, an async primary and a read "
              "replica in the same process polling the 3-node stream; value = the primary's tick minus the replica's "
              "applied tick, sampled every 1/60 s for %.0f s (p99, p50); baseline: one tick",
         WORLD_AGENTS, LAG_SECONDS);
    free(p50);
    free(p99);
}
