/*
 * test_durable.c -- durability: the data directory, the WAL, checkpoints and
 * recovery (keel/durability.h, docs/durability.md):
 *
 *   dur_api       open a fresh directory, run a workload with every kind of
 *                 change (spawn, destroy, add, remove, VERSIONED /
 *                 SINGLE_VERSION / TRANSIENT values, tags, side transactions
 *                 in systems and through keel_submit, in each mode), close,
 *                 reopen: the same hash, tick and entity handles as an
 *                 uninterrupted in-memory reference run at every later tick;
 *                 TRANSIENT values empty after open; checkpoints (WAL
 *                 records they cover dropped unless wal_retain; incremental:
 *                 only changed chunks rewritten); keel_flush; stats and
 *                 the telemetry's WAL fields checked against the records on
 *                 disk; on_first_tick after every open; on_shutdown's
 *                 IMMEDIATE side transaction; writes between ticks refused;
 *                 keel_runtime_recover's results and refusals; the durable
 *                 lag while another process holds the LMDB write lock;
 *                 a checkpoint of 200 tables and three slot pages, reopened
 *                 from the checkpoint alone; idle ticks around a checkpoint
 *                 while the writer is held (the recovered tick is the last
 *                 one);
 *   dur_recovery  a flipped byte in a WAL record (every copy in data.mdb),
 *                 or a record with a valid CRC that does not decode:
 *                 refused with KEEL_ECORRUPT naming the LSN, nothing on disk
 *                 changed, or dropped with truncate_bad_tail (state = the
 *                 reference at the last complete tick, nothing of the
 *                 dropped unit applied); the stored schema
 *                 (an added component works, a changed one is a clear error
 *                 that touches nothing); a checkpoint whose table list
 *                 claims slots its pages lack (one page more, or 2^32):
 *                 refused before anything of the claim's size is
 *                 allocated; bad data directories; map growth;
 *   dur_errors    the fatal latch: injected EIO / ENOSPC on a WAL commit,
 *                 an acknowledged IMMEDIATE commit that outlives the failed
 *                 tick after it, a fence that cannot log its tick, a real
 *                 ENOSPC from a tiny map_max; bad descriptor fields;
 *                 keel_runtime_sync_retry after a sync point's or
 *                 on_first_tick's commands failed part-way (the world's
 *                 injected command failure): the retried commands are
 *                 durable;
 *   dur_writer    8 threads submitting IMMEDIATE transfers while the main
 *                 thread steps: every acknowledged ticket is durable (after
 *                 a normal close, and after a child process that ran the
 *                 same workload died without closing), money is conserved
 *                 and equals the reference arithmetic, group commit.
 *
 * Real files: every test works in its own directory under a mkdtemp base
 * that the suite's unchecked fixture removes (also after a failure). No
 * sleeps as synchronisation, no timing assertions: where the test needs the
 * WAL writer to be stuck it holds the LMDB write lock from a child process
 * (and, to keep the checkpoint thread from queueing its record, the
 * checkpoint pin's mutex); the timed waits (for a TickDriver that cannot
 * report having stopped, for the WAL writer to take its queue) only turn a
 * hang into a failure. Failures are injected with the store's
 * test seam (kw_store_test_fail_write), a real map limit, and the unit of
 * work's out-of-memory flag, the world's injected command failure
 * (world_test_inject_failure).
 * Bodies that run on workers record what they saw; the test thread asserts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "core/hash.h"
#include "keel_wal/wal.h"
#include "runtime/runtime_internal.h"
#include "test_util.h"
#include "wworld.h"

/* ---- files ------------------------------------------------------------------------ */

static bool path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void mdb_path(char *out, size_t n, const char *dir)
{
    ck_assert_int_lt(snprintf(out, n, "%s/data.mdb", dir), (int)n);
}

/* The bytes of dir's data.mdb (tu_file_digest). */
static tu_digest dir_digest(const char *dir)
{
    char p[512];
    mdb_path(p, sizeof p, dir);
    return tu_file_digest(p);
}

/* ---- diagnostics ------------------------------------------------------------------------ */

/* Structured diagnostics captured (the writer thread logs too). */
typedef struct logcap {
    pthread_mutex_t mu;
    char buf[8192];
    size_t len;
} logcap;

static logcap g_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void log_capture(const keel_log_event *ev, void *user)
{
    logcap *c = user;
    pthread_mutex_lock(&c->mu);
    int n = snprintf(c->buf + c->len, sizeof c->buf - c->len, "%s/%s %s\n", ev->subsystem, ev->event, ev->fields);
    if (n > 0 && (size_t)n < sizeof c->buf - c->len)
        c->len += (size_t)n;
    pthread_mutex_unlock(&c->mu);
}

static void log_capture_on(void)
{
    pthread_mutex_lock(&g_log.mu);
    g_log.len = 0;
    g_log.buf[0] = 0;
    pthread_mutex_unlock(&g_log.mu);
    keel_log_set(log_capture, &g_log, KEEL_LOG_DEBUG);
}

/* An event "subsystem/event" whose fields contain `field` was logged. */
static bool log_has(const char *event, const char *field)
{
    pthread_mutex_lock(&g_log.mu);
    bool found = false;
    for (const char *p = strstr(g_log.buf, event); p && !found; p = strstr(p + 1, event)) {
        const char *eol = strchr(p, '\n');
        const char *f = strstr(p, field);
        found = f && (!eol || f < eol);
    }
    pthread_mutex_unlock(&g_log.mu);
    return found;
}

#define ck_assert_logged(event, field) \
    ck_assert_msg(log_has((event), (field)), "no diagnostic %s with %s; logged:\n%s", (event), (field), g_log.buf)

/* ---- reading a data directory with libkeel_wal ------------------------------------- */

typedef struct rec_info {
    uint64_t lsn, tick;
    uint32_t kind, flags, raw_len, stored_len;
    uint32_t side_mode;        /* SIDE records: the mode in the payload */
    size_t len;                /* whole record */
} rec_info;

typedef struct snap_info {
    unsigned char key[16];
    size_t klen;
    uint32_t kind;
    uint64_t tick;
    uint32_t codec, raw_len;
} snap_info;

typedef struct dir_view {
    rec_info *r;
    uint64_t n;
    uint64_t kinds[32];
    uint64_t side_modes[4];    /* side transactions by mode (a SIDES record counts each) */
    uint64_t side_txns;
    bool consecutive;
    bool has_ckpt;
    kw_checkpoint_meta ckpt;
    snap_info *snap;
    uint32_t nsnap;
    uint32_t schema_ncomps;
    char schema_names[8][KW_NAME_MAX + 1];
    uint32_t schema_disc[8];
} dir_view;

static void dir_view_free(dir_view *v)
{
    free(v->r);
    free(v->snap);
    memset(v, 0, sizeof *v);
}

/* Read everything the directory holds (read-only; the runtime must be closed:
 * LMDB forbids opening one environment twice in a process). */
static void dir_read(const char *dir, dir_view *v)
{
    memset(v, 0, sizeof *v);
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    tu_wal_reader w;
    tu_wal_open(&w, dir, 0);
    kw_rtxn *r = w.r;
    kw_walit *it = w.it;
    uint64_t lsn = 0, cap = 0;
    const void *rec;
    size_t len;
    int rc;
    v->consecutive = true;
    while ((rc = kw_wal_next(it, &lsn, &rec, &len)) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(rec, len, &h));
        ck_assert_uint_eq(h.lsn, lsn);
        if (v->n == cap) {
            cap = cap ? cap * 2 : 256;
            v->r = realloc(v->r, cap * sizeof *v->r);
            ck_assert_ptr_nonnull(v->r);
        }
        rec_info *ri = &v->r[v->n];
        *ri = (rec_info){.lsn = lsn, .tick = h.tick, .kind = h.kind, .flags = h.flags, .raw_len = h.raw_len,
                         .stored_len = h.stored_len, .len = len};
        if (v->n && lsn != v->r[v->n - 1].lsn + 1)
            v->consecutive = false;
        if (h.kind == KW_KIND_SIDE || h.kind == KW_KIND_SIDES) {
            const void *p, *tp;
            ck_assert_ok(kw_record_payload(c, rec, &h, &p));
            kw_side_iter si;
            kw_header txn;
            ck_assert_ok(kw_side_iter_begin(&si, &h, p));
            while ((rc = kw_side_iter_next(&si, &txn, &tp)) == 1) {
                kw_cursor cur = kw_cursor_make(tp, txn.raw_len);
                kw_get_u64(&cur);
                ri->side_mode = kw_get_u32(&cur); /* the transactions of a SIDES record share their mode */
                ck_assert(!cur.bad);
                v->side_txns++;
                if (ri->side_mode < 4)
                    v->side_modes[ri->side_mode]++;
            }
            ck_assert_int_eq(rc, 0);
        }
        v->kinds[h.kind < 32 ? h.kind : 0]++;
        v->n++;
    }
    ck_assert_int_eq(rc, 0);
    kw_wal_iter_end(it);
    const void *val;
    size_t vlen;
    if (kw_get(r, KW_DB_META, KW_META_CHECKPOINT, strlen(KW_META_CHECKPOINT), &val, &vlen) == 0) {
        v->has_ckpt = true;
        ck_assert_ok(kw_checkpoint_meta_decode(val, vlen, &v->ckpt));
    }
    ck_assert_ok(kw_db_iter(r, KW_DB_SNAP, "", 0, &it));
    const void *key;
    size_t klen;
    uint32_t scap = 0;
    while ((rc = kw_db_next(it, &key, &klen, &val, &vlen)) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(val, vlen, &h));
        if (v->nsnap == scap) {
            scap = scap ? scap * 2 : 64;
            v->snap = realloc(v->snap, scap * sizeof *v->snap);
            ck_assert_ptr_nonnull(v->snap);
        }
        snap_info *si = &v->snap[v->nsnap++];
        ck_assert_uint_le(klen, sizeof si->key);
        memcpy(si->key, key, klen);
        si->klen = klen;
        si->kind = h.kind;
        si->tick = h.tick;
        si->codec = h.codec;
        si->raw_len = h.raw_len;
    }
    ck_assert_int_eq(rc, 0);
    kw_wal_iter_end(it);
    if (kw_get(r, KW_DB_SCHEMA, KW_SCHEMA_KEY, strlen(KW_SCHEMA_KEY), &val, &vlen) == 0) {
        kw_header h;
        const void *p;
        kw_schema s;
        ck_assert_ok(kw_record_check(val, vlen, &h));
        ck_assert_uint_eq(h.kind, KW_KIND_SCHEMA);
        ck_assert_ok(kw_record_payload(c, val, &h, &p));
        ck_assert_ok(kw_schema_decode(p, h.raw_len, &s));
        v->schema_ncomps = s.ncomps;
        for (uint32_t i = 0; i < s.ncomps && i < 8; i++) {
            snprintf(v->schema_names[i], sizeof v->schema_names[i], "%s", s.comps[i].name);
            v->schema_disc[i] = s.comps[i].discipline;
        }
        kw_schema_free(&s);
    }
    w.it = NULL; /* ended above */
    tu_wal_close(&w);
    kw_codec_destroy(c);
}

static uint64_t count_kind_tick(const dir_view *v, uint32_t kind, uint64_t tick, bool hook)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < v->n; i++)
        n += v->r[i].kind == kind && v->r[i].tick == tick && !!(v->r[i].flags & KW_FLAG_HOOK) == hook;
    return n;
}

static uint64_t max_tick_of(const dir_view *v)
{
    uint64_t m = 0;
    for (uint64_t i = 0; i < v->n; i++)
        if (v->r[i].tick > m)
            m = v->r[i].tick;
    return m;
}

static uint32_t snap_count_tick(const dir_view *v, uint64_t tick)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->nsnap; i++)
        n += v->snap[i].tick == tick;
    return n;
}

/* ---- runtime helpers ---------------------------------------------------------------- */

static keel_runtime_desc desc_dir(const char *dir, int32_t workers, uint32_t chunk_rows, keel_durability mode)
{
    keel_runtime_desc d = {
        .world = {.chunk_rows = chunk_rows},
        .workers = workers,
        .tick_rate_hz = -1,
        .durability = mode,
    };
    d.durable.dir = dir;
    /* no checkpoint unless a test asks: WAL contents stay exact */
    d.durable.checkpoint_every_ticks = -1;
    d.durable.checkpoint_every_bytes = -1;
    d.durable.checkpoint_every_seconds = -1;
    return d;
}

/* desc_dir for one worker and 16-row chunks on the new data directory `name` (its path into dir). */
static keel_runtime_desc desc_named(char dir[256], const char *name, keel_durability mode)
{
    tu_path(dir, 256, name);
    return desc_dir(dir, 1, 16, mode);
}

/* A wworld (one worker, 16-row chunks) opened on the new data directory `name` (its path into
 * dir, its descriptor into *d, kept for a reopen), having driven ticks 1..ticks. */
static wworld *w_open_driven(keel_runtime_desc *d, char dir[256], const char *name, keel_durability mode,
                             uint64_t ticks)
{
    *d = desc_named(dir, name, mode);
    wworld *w = w_new(false);
    w_open(w, d, false);
    for (uint64_t t = 1; t <= ticks; t++)
        w_drive(w, t);
    return w;
}

static int64_t get_i64(keel_runtime *rt, keel_entity e, keel_component c)
{
    int64_t v = -999999;
    ck_assert_ok(keel_get(keel_runtime_world(rt), e, c, &v));
    return v;
}

/* ---- the workload W (wworld.h): references ------------------------------------------ */

/* What an uninterrupted in-memory run looks like after each tick. */
typedef struct wref {
    uint64_t hash[W_MAXT + 1];
    uint32_t count[W_MAXT + 1];
    keel_entity born[W_MAXT + 1][4];
    uint32_t nborn[W_MAXT + 1];
} wref;

static uint32_t born_at(wworld *w, uint64_t t, keel_entity out[4])
{
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(w->q_pos, &it);
    while (keel_iter_next(&it)) {
        const pos_t *p = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++)
            if (p[r].born == (int64_t)t && n < 4)
                out[n++] = it.entities[r];
    }
    qsort(out, n, sizeof *out, cmp_entity);
    return n;
}

static void w_reference_hook(wref *ref, uint64_t ticks, int32_t workers, bool no_side, uint32_t hook_spawn)
{
    wworld *w = w_new(no_side);
    w->hook_spawn = hook_spawn;
    keel_runtime_desc d = {.world = {.chunk_rows = 16}, .workers = workers, .tick_rate_hz = -1};
    w_open(w, &d, false);
    memset(ref, 0, sizeof *ref);
    ref->hash[0] = keel_world_hash(keel_runtime_world(w->rt));
    for (uint64_t t = 1; t <= ticks; t++) {
        w_drive(w, t);
        ref->hash[t] = keel_world_hash(keel_runtime_world(w->rt));
        ref->count[t] = keel_world_count(keel_runtime_world(w->rt));
        ref->nborn[t] = born_at(w, t, ref->born[t]);
    }
    ck_assert_uint_eq(w->hook_calls, 1);
    w_close(w);
    free(w);
}

static void w_reference(wref *ref, uint64_t ticks, int32_t workers, bool no_side)
{
    w_reference_hook(ref, ticks, workers, no_side, 0);
}

/* The runtime is at tick t and matches the reference there. */
static void w_expect(wworld *w, const wref *ref, uint64_t t)
{
    keel_world *wd = keel_runtime_world(w->rt);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), t);
    uint64_t h = keel_world_hash(wd);
    ck_assert_msg(h == ref->hash[t], "tick %llu: hash %016llx, reference %016llx", (unsigned long long)t,
                  (unsigned long long)h, (unsigned long long)ref->hash[t]);
    ck_assert_uint_eq(keel_world_count(wd), ref->count[t]);
    keel_entity b[4];
    uint32_t n = born_at(w, t, b);
    ck_assert_uint_eq(n, ref->nborn[t]);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(b[i] == ref->born[t][i], "tick %llu: spawn %u got handle %016llx, reference %016llx",
                      (unsigned long long)t, i, (unsigned long long)b[i], (unsigned long long)ref->born[t][i]);
}

/* After an open: every entity kept its TRANSIENT component, with value 0. */
static void w_expect_transient_empty(wworld *w)
{
    keel_world *wd = keel_runtime_world(w->rt);
    uint32_t n = 0, with = 0;
    keel_iter it;
    keel_query_iter(w->q_pos, &it);
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++) {
            n++;
            with += keel_has(wd, it.entities[r], w->TMP) == 1;
        }
    ck_assert_uint_gt(n, 0);
    ck_assert_uint_eq(with, n);
    uint32_t rows = 0;
    keel_query_iter(w->q_tmp, &it);
    while (keel_iter_next(&it)) {
        const int64_t *v = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++, rows++)
            ck_assert_msg(v[r] == 0, "entity %016llx: TRANSIENT value %lld after open, expected 0",
                          (unsigned long long)it.entities[r], (long long)v[r]);
    }
    ck_assert_uint_eq(rows, n);
}

static void recovery_eq(const keel_recovery *a, const keel_recovery *b)
{
    ck_assert_int_eq(a->fresh, b->fresh);
    ck_assert_uint_eq(a->tick, b->tick);
    ck_assert_uint_eq(a->checkpoint_tick, b->checkpoint_tick);
    ck_assert_uint_eq(a->last_lsn, b->last_lsn);
    ck_assert_uint_eq(a->records, b->records);
    ck_assert_uint_eq(a->raw_bytes, b->raw_bytes);
    ck_assert_uint_eq(a->side_txns, b->side_txns);
    ck_assert_uint_eq(a->truncated, b->truncated);
    ck_assert_uint_eq(a->ns, b->ns);
}

/* Expected SIDE records of W ticks [from, to]: the bank's and the closure's,
 * by mode. */
static void w_expected_side_modes(uint64_t from, uint64_t to, uint64_t out[4])
{
    memset(out, 0, 4 * sizeof *out);
    for (uint64_t t = from < 2 ? 2 : from; t <= to; t++) {
        out[1 + t % 3]++;       /* bank */
        out[1 + (t + 1) % 3]++; /* closure */
    }
}

/* ==== dur_api ======================================================================== */

/* Open a fresh directory, run, close, reopen: the same world, tick and
 * handles as an uninterrupted in-memory run, at every later tick. */
START_TEST(test_reopen_matches_reference)
{
    static wref ref;
    w_reference(&ref, 12, 1, false);
    char dir[256];
    tu_path(dir, sizeof dir, "reopen");
    ck_assert(!path_exists(dir));
    keel_runtime_desc d = desc_dir(dir, 2, 16, KEEL_DURABLE_DEFAULT);
    wworld *w = w_new(false);
    w_open(w, &d, false);
    keel_recovery info, again;
    memset(&info, 0xab, sizeof info);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert(info.fresh);
    ck_assert_uint_eq(info.tick, 0);
    ck_assert_uint_eq(info.checkpoint_tick, 0);
    ck_assert_uint_eq(info.records, 0);
    ck_assert_uint_eq(info.side_txns, 0);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(info.raw_bytes, 0);
    ck_assert_uint_gt(info.ns, 0);
    ck_assert(path_exists(dir)); /* created when missing */
    /* idempotent: a second call reports the first result */
    memset(&again, 0xcd, sizeof again);
    ck_assert_ok(keel_runtime_recover(w->rt, &again));
    recovery_eq(&info, &again);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    keel_runtime_stats st = tu_stats(w->rt);
    ck_assert_uint_eq(st.recovery_ns, info.ns);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), ref.hash[0]);
    for (uint64_t t = 1; t <= 6; t++) {
        w_drive(w, t);
        w_expect(w, &ref, t);
    }
    /* on_first_tick ran once, at tick 1, before any system */
    ck_assert_uint_eq(w->hook_calls, 1);
    ck_assert_uint_eq(w->hook_tick, 1);
    ck_assert_uint_eq(w->hook_sys_before, 0);
    for (int m = 1; m <= 3; m++)
        ck_assert_uint_ge(w->bank_commits[m], 1);
    w_close(w);

    /* on disk: the schema, 6 ticks + the hook's unit, every side transaction */
    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.consecutive);
    ck_assert_uint_eq(v.r[0].lsn, 1);
    ck_assert_uint_eq(v.r[0].kind, KW_KIND_SCHEMA);
    ck_assert_uint_eq(v.kinds[KW_KIND_SCHEMA], 1);
    ck_assert_uint_eq(v.kinds[KW_KIND_TICK_COMMIT], 7);
    ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, 1, true), 1);
    for (uint64_t t = 1; t <= 6; t++)
        ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, t, false), 1);
    ck_assert_uint_eq(v.kinds[KW_KIND_CHECKPOINT], 0);
    ck_assert_uint_eq(v.nsnap, 0);
    ck_assert(!v.has_ckpt);
    uint64_t modes[4];
    w_expected_side_modes(1, 6, modes);
    ck_assert_uint_eq(v.kinds[KW_KIND_SIDE], modes[1] + modes[2] + modes[3]);
    for (int m = 1; m <= 3; m++)
        ck_assert_msg(v.side_modes[m] == modes[m], "mode %d: %llu side transactions, expected %llu", m,
                      (unsigned long long)v.side_modes[m], (unsigned long long)modes[m]);
    ck_assert_uint_eq(v.schema_ncomps, 5);
    ck_assert_str_eq(v.schema_names[0], "pos");
    ck_assert_str_eq(v.schema_names[2], "tmp");
    ck_assert_uint_eq(v.schema_disc[1], KEEL_SINGLE_VERSION);
    ck_assert_uint_eq(v.schema_disc[2], KEEL_TRANSIENT);
    uint64_t nrec = v.n, last = v.r[v.n - 1].lsn, nside = v.kinds[KW_KIND_SIDE];
    dir_view_free(&v);

    /* reopen with the same registrations */
    w_reset(w, false);
    w_open(w, &d, false);
    memset(&info, 0xab, sizeof info);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert(!info.fresh);
    ck_assert_uint_eq(info.tick, 6);
    ck_assert_uint_eq(info.checkpoint_tick, 0);
    ck_assert_uint_eq(info.records, nrec);
    ck_assert_uint_eq(info.last_lsn, last);
    ck_assert_uint_eq(info.side_txns, nside);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_gt(info.raw_bytes, 0);
    ck_assert_uint_eq(tu_stats(w->rt).recovery_ns, info.ns);
    ck_assert_uint_eq(keel_durable_lsn(w->rt), last);
    w_expect(w, &ref, 6);
    w_expect_transient_empty(w);

    /* with a data directory, writes between ticks are refused: nothing
     * would log them */
    keel_world *wd = keel_runtime_world(w->rt);
    keel_entity some[4];
    ck_assert_uint_gt(born_at(w, 6, some), 0);
    int64_t val = 12345;
    ck_assert_rc(keel_set(wd, some[0], w->HP, &val), KEEL_EBUSY);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "hp"));
    pos_t pv = {1, 2};
    ck_assert_rc(keel_set(wd, some[0], w->POS, &pv), KEEL_EBUSY);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(wd, &cb));
    keel_init in[1] = {{w->MONEY, &val}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 1));
    ck_assert_ok(keel_cmd_destroy(cb, some[0]));
    ck_assert_rc(keel_cmdbuf_apply(cb), KEEL_EBUSY);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).spawned, 0);
    ck_assert_uint_eq(keel_cmdbuf_result(cb).destroyed, 0);
    keel_cmdbuf_destroy(cb);
    ck_assert(keel_alive(wd, some[0]));
    ck_assert_int_ne(get_i64(w->rt, some[0], w->HP), 12345);
    w_expect(w, &ref, 6); /* nothing changed */

    for (uint64_t t = 7; t <= 12; t++) {
        w_drive(w, t);
        w_expect(w, &ref, t);
    }
    /* the hook ran once after this open too, before any system, and saw the
     * TRANSIENT column empty */
    ck_assert_uint_eq(w->hook_calls, 1);
    ck_assert_uint_eq(w->hook_tick, 7);
    ck_assert_uint_eq(w->hook_sys_before, 0);
    ck_assert_uint_eq(w->hook_rows, ref.count[6] - 2); /* every entity but the two accounts */
    ck_assert_uint_eq(w->hook_nonzero, 0);
    w_close(w);

    /* and once more */
    w_reset(w, false);
    w_open(w, &d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 12);
    w_expect(w, &ref, 12);
    w_close(w);
    free(w);
}
END_TEST

/* keel_checkpoint, then reopen from it: the WAL it covers is gone, unless
 * wal_retain keeps it. */
START_TEST(test_checkpoint_reopen)
{
    static wref ref;
    w_reference(&ref, 10, 1, false);
    for (int retain = 0; retain <= 1; retain++) {
        char dir[256];
        keel_runtime_desc d = desc_named(dir, retain ? "ckpt-retain" : "ckpt", KEEL_DURABLE_GROUP);
        d.durable.wal_retain = retain;
        wworld *w = w_new(false);
        w_open(w, &d, false);
        ck_assert_ok(keel_runtime_recover(w->rt, NULL));
        for (uint64_t t = 1; t <= 5; t++)
            w_drive(w, t);
        ck_assert_uint_eq(tu_stats(w->rt).checkpoints, 0);
        ck_assert_ok(keel_checkpoint(w->rt));
        keel_runtime_stats st = tu_stats(w->rt);
        ck_assert_uint_eq(st.checkpoints, 1);
        ck_assert_uint_eq(st.checkpoint_age_ticks, 0);
        for (uint64_t t = 6; t <= 8; t++)
            w_drive(w, t);
        st = tu_stats(w->rt);
        ck_assert_uint_eq(st.checkpoints, 1);
        ck_assert_uint_eq(st.checkpoint_age_ticks, 3);
        w_expect(w, &ref, 8);
        w_close(w);

        dir_view v;
        dir_read(dir, &v);
        ck_assert(v.has_ckpt);
        ck_assert_uint_eq(v.ckpt.tick, 5);
        ck_assert_uint_eq(v.ckpt.count, 1);
        ck_assert_uint_gt(v.ckpt.created_ns, 0);
        ck_assert_uint_eq(v.kinds[KW_KIND_CHECKPOINT], 1);
        ck_assert(v.consecutive);
        uint64_t after = 0;
        for (uint64_t i = 0; i < v.n; i++) {
            after += v.r[i].lsn > v.ckpt.lsn;
            if (v.r[i].kind == KW_KIND_CHECKPOINT) {
                ck_assert_uint_eq(v.r[i].tick, 5);
                ck_assert_uint_gt(v.r[i].lsn, v.ckpt.lsn);
            }
        }
        if (!retain) {
            /* every record the checkpoint covers is gone */
            ck_assert_uint_eq(after, v.n);
            ck_assert_uint_eq(v.r[0].lsn, v.ckpt.lsn + 1);
            ck_assert_uint_eq(v.kinds[KW_KIND_SCHEMA], 0);
            ck_assert_uint_eq(v.kinds[KW_KIND_TICK_COMMIT], 3);
            for (uint64_t t = 1; t <= 5; t++)
                ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, t, false), 0);
        } else {
            ck_assert_uint_eq(v.r[0].lsn, 1);
            ck_assert_uint_eq(v.kinds[KW_KIND_SCHEMA], 1);
            ck_assert_uint_eq(v.kinds[KW_KIND_TICK_COMMIT], 9);
            ck_assert_uint_lt(after, v.n);
        }
        /* snap holds the tables, the slots and the chunks of tick 5 */
        uint32_t kinds[3] = {0};
        for (uint32_t i = 0; i < v.nsnap; i++) {
            ck_assert_uint_eq(v.snap[i].tick, 5);
            ck_assert(v.snap[i].kind >= KW_KIND_SNAP_TABLES && v.snap[i].kind <= KW_KIND_SNAP_CHUNK);
            kinds[v.snap[i].kind - KW_KIND_SNAP_TABLES]++;
        }
        ck_assert_uint_eq(kinds[0], 1);
        ck_assert_uint_ge(kinds[1], 1);
        ck_assert_uint_ge(kinds[2], 2);
        dir_view_free(&v);

        w_reset(w, false);
        w_open(w, &d, false);
        keel_recovery info;
        ck_assert_ok(keel_runtime_recover(w->rt, &info));
        ck_assert(!info.fresh);
        ck_assert_uint_eq(info.checkpoint_tick, 5);
        ck_assert_uint_eq(info.tick, 8);
        ck_assert_uint_eq(info.records, after);
        w_expect(w, &ref, 8);
        w_expect_transient_empty(w);
        st = tu_stats(w->rt);
        ck_assert_uint_eq(st.checkpoints, 0); /* recorded by this runtime */
        ck_assert_uint_eq(st.checkpoint_age_ticks, 3);
        for (uint64_t t = 9; t <= 10; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        w_close(w);
        free(w);
    }
}
END_TEST

/* Checkpoints taken by the tick count (checkpoint_every_ticks). */
START_TEST(test_checkpoint_periodic)
{
    static wref ref;
    w_reference(&ref, 14, 1, false);
    char dir[256];
    tu_path(dir, sizeof dir, "ckpt-periodic");
    keel_runtime_desc d = desc_dir(dir, 2, 16, KEEL_DURABLE_IMMEDIATE);
    d.durable.checkpoint_every_ticks = 4;
    wworld *w = w_new(false);
    w_open(w, &d, false);
    for (uint64_t t = 1; t <= 10; t++)
        w_drive(w, t);
    w_close(w);
    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.has_ckpt);
    ck_assert_uint_ge(v.ckpt.count, 1);
    ck_assert_uint_ge(v.ckpt.tick, 4);
    ck_assert_uint_le(v.ckpt.tick, 10);
    ck_assert_uint_gt(v.nsnap, 0);
    for (uint64_t i = 0; i < v.n; i++)
        ck_assert_uint_gt(v.r[i].lsn, v.ckpt.lsn);
    for (uint64_t t = 1; t <= v.ckpt.tick; t++)
        ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, t, false), 0);
    uint64_t ckpt_tick = v.ckpt.tick;
    dir_view_free(&v);
    w_reset(w, false);
    w_open(w, &d, false);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, ckpt_tick);
    ck_assert_uint_eq(info.tick, 10);
    w_expect(w, &ref, 10);
    for (uint64_t t = 11; t <= 14; t++) {
        w_drive(w, t);
        w_expect(w, &ref, t);
    }
    w_close(w);
    free(w);
}
END_TEST

/* ---- incremental checkpoints ------------------------------------------------------ */

typedef struct iworld {
    keel_runtime *rt;
    keel_component V;
    int64_t poke;              /* entity index written this tick, -1: none */
    uint32_t kill_from, kill_to;
    berr err;
} iworld;

static int i_sys(keel_ctx *ctx, void *user)
{
    iworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    if (t == 1)
        for (int64_t i = 0; i < 200; i++) {
            int64_t v = i * 10;
            keel_init in[1] = {{w->V, &v}};
            B_CHECK(&w->err, keel_cmd_spawn(cb, in, 1));
        }
    if (w->poke >= 0) {
        int64_t v = 100000 + (int64_t)t;
        B_CHECK(&w->err, keel_txn_set(ctx, KEEL_ENTITY_MAKE((uint32_t)w->poke, 1), w->V, &v));
    }
    for (uint32_t i = w->kill_from; i < w->kill_to; i++)
        B_CHECK(&w->err, keel_cmd_destroy(cb, KEEL_ENTITY_MAKE(i, 1)));
    return 0;
}

static void i_open(iworld *w, const keel_runtime_desc *d)
{
    memset(w, 0, sizeof *w);
    w->poke = -1;
    w->rt = tu_rt_new(*d);
    w->V = reg_i64(w->rt, "v", KEEL_VERSIONED);
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sd = {.name = "inc", .kind = KEEL_SYSTEM_CALLBACK, .run = i_sys, .user = w,
                           .access = {.writes = {w->V}}};
    add_sys(s, &sd);
    tu_install(w->rt, s);
}

static void i_step(iworld *w)
{
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_berr(&w->err);
}

/* The chunk index of a snap chunk key "C" + table u32 BE + chunk u32 BE. */
static uint32_t key_chunk(const snap_info *s)
{
    return (uint32_t)s->key[5] << 24 | (uint32_t)s->key[6] << 16 | (uint32_t)s->key[7] << 8 | s->key[8];
}

static uint64_t snap_chunk_tick(const dir_view *v, uint32_t chunk, bool *found)
{
    *found = false;
    for (uint32_t i = 0; i < v->nsnap; i++)
        if (v->snap[i].kind == KW_KIND_SNAP_CHUNK && key_chunk(&v->snap[i]) == chunk) {
            *found = true;
            return v->snap[i].tick;
        }
    return 0;
}

/* A second checkpoint after one chunk changed rewrites that chunk only;
 * one after nothing changed rewrites nothing; a shrunk table's vanished
 * chunk is deleted; a reopened runtime keeps skipping what snap holds.
 * (Each run ends with a tick after its last checkpoint: reopening right
 * after a checkpoint is test_reopen_right_after_checkpoint's.) */
START_TEST(test_incremental_checkpoint)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "incremental", KEEL_DURABLE_GROUP);
    iworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    i_open(w, &d);
    i_step(w); /* 200 entities: chunks 0..12 of 16 rows */
    i_step(w);
    ck_assert_ok(keel_checkpoint(w->rt)); /* tick 2: everything */
    w->poke = 37;                         /* row 37: chunk 2 */
    i_step(w);
    w->poke = -1;
    ck_assert_ok(keel_checkpoint(w->rt)); /* tick 3: chunk 2 only */
    i_step(w);
    ck_assert_ok(keel_checkpoint(w->rt)); /* tick 4: nothing changed */
    w->kill_from = 180;
    w->kill_to = 200;
    i_step(w); /* rows 180..199 go: chunk 11 shrinks to 4 rows, chunk 12 vanishes */
    w->kill_from = w->kill_to = 0;
    ck_assert_ok(keel_checkpoint(w->rt)); /* tick 5: tables, slots, chunk 11; chunk 12 deleted */
    ck_assert_uint_eq(tu_stats(w->rt).checkpoints, 4);
    i_step(w); /* tick 6 changes nothing */
    uint64_t h6 = keel_world_hash(keel_runtime_world(w->rt));
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(w->rt)), 180);
    keel_runtime_close(w->rt);

    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.has_ckpt);
    ck_assert_uint_eq(v.ckpt.tick, 5);
    ck_assert_uint_eq(v.ckpt.count, 4);
    ck_assert_uint_eq(v.nsnap, 14); /* T, one slot page, chunks 0..11 */
    ck_assert_uint_eq(snap_count_tick(&v, 2), 10);
    ck_assert_uint_eq(snap_count_tick(&v, 3), 1);
    ck_assert_uint_eq(snap_count_tick(&v, 4), 0);
    ck_assert_uint_eq(snap_count_tick(&v, 5), 3);
    bool found;
    ck_assert_uint_eq(snap_chunk_tick(&v, 2, &found), 3);
    ck_assert(found);
    ck_assert_uint_eq(snap_chunk_tick(&v, 11, &found), 5);
    ck_assert(found);
    snap_chunk_tick(&v, 12, &found);
    ck_assert_msg(!found, "the vanished chunk 12 is still in snap");
    /* the WAL keeps the last checkpoint's marker and tick 6 */
    ck_assert_uint_eq(v.n, 2);
    ck_assert_uint_eq(v.r[0].kind, KW_KIND_CHECKPOINT);
    ck_assert_uint_eq(v.r[0].tick, 5);
    ck_assert_uint_eq(v.r[0].lsn, v.ckpt.lsn + 1);
    ck_assert_uint_eq(v.r[1].kind, KW_KIND_TICK_COMMIT);
    ck_assert_uint_eq(v.r[1].tick, 6);
    dir_view_free(&v);

    i_open(w, &d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, 5);
    ck_assert_uint_eq(info.tick, 6);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h6);
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(w->rt)), 180);
    ck_assert_int_eq(get_i64(w->rt, KEEL_ENTITY_MAKE(37, 1), w->V), 100003);
    ck_assert_int_eq(get_i64(w->rt, KEEL_ENTITY_MAKE(179, 1), w->V), 1790);
    ck_assert(!keel_alive(keel_runtime_world(w->rt), KEEL_ENTITY_MAKE(180, 1)));
    w->poke = 100; /* chunk 6 */
    i_step(w);     /* tick 7 */
    w->poke = -1;
    ck_assert_ok(keel_checkpoint(w->rt));
    i_step(w);     /* tick 8 */
    uint64_t h8 = keel_world_hash(keel_runtime_world(w->rt));
    keel_runtime_close(w->rt);
    dir_read(dir, &v);
    ck_assert_uint_eq(v.ckpt.tick, 7);
    ck_assert_uint_eq(v.ckpt.count, 5);
    ck_assert_uint_eq(v.nsnap, 14);
    ck_assert_uint_eq(snap_count_tick(&v, 7), 1); /* what snap held was known after the reopen */
    ck_assert_uint_eq(snap_chunk_tick(&v, 6, &found), 7);
    ck_assert_uint_eq(snap_count_tick(&v, 2), 9);
    dir_view_free(&v);
    i_open(w, &d);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, 7);
    ck_assert_uint_eq(info.tick, 8);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h8);
    ck_assert_int_eq(get_i64(w->rt, KEEL_ENTITY_MAKE(100, 1), w->V), 100007);
    keel_runtime_close(w->rt);
    free(w);
}
END_TEST

/* Close right after keel_checkpoint (nothing in the WAL after it but the
 * marker): the reopened runtime is at the checkpoint's tick and goes on
 * like the reference from there. */
START_TEST(test_reopen_right_after_checkpoint)
{
    static wref ref;
    w_reference(&ref, 8, 1, false);
    char dir[256];
    keel_runtime_desc d;
    wworld *w = w_open_driven(&d, dir, "ckpt-last", KEEL_DURABLE_GROUP, 5);
    ck_assert_ok(keel_checkpoint(w->rt));
    w_close(w);
    dir_view v;
    dir_read(dir, &v);
    ck_assert_uint_eq(v.ckpt.tick, 5);
    ck_assert_uint_eq(v.n, 1);
    ck_assert_uint_eq(v.r[0].kind, KW_KIND_CHECKPOINT);
    dir_view_free(&v);
    w_reset(w, false);
    w_open(w, &d, false);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, 5);
    ck_assert_msg(info.tick == 5 && keel_runtime_tick(w->rt) == 5,
                  "reopened at a checkpoint of tick 5 with no later tick in the WAL: info.tick %llu, "
                  "keel_runtime_tick %llu", (unsigned long long)info.tick,
                  (unsigned long long)keel_runtime_tick(w->rt));
    w_expect(w, &ref, 5);
    for (uint64_t t = 6; t <= 8; t++) {
        w_drive(w, t);
        w_expect(w, &ref, t);
    }
    w_close(w);
    free(w);
}
END_TEST

/* ---- a checkpoint of many tables ---------------------------------------------------- */

#define MT_KINDS 8        /* components k0..k7: the sets 1..200 of them make 200 tables */
#define MT_TABLES 200
#define MT_PER_TABLE 12   /* 2400 entities at tick 1: three pages of 1024 slots */
#define MT_SPAWNS 5       /* spawned on every tick after the third */
#define MT_MAXT 8

typedef struct mtworld {
    keel_runtime *rt;
    keel_component BORN, K[MT_KINDS];
    keel_query *q_born, *q_k0;
    berr err;
} mtworld;

typedef struct mtref {
    uint64_t hash[MT_MAXT + 1];
    uint32_t count[MT_MAXT + 1];
    keel_entity born[MT_MAXT + 1][MT_SPAWNS];
    uint32_t nborn[MT_MAXT + 1];
} mtref;

/* One spawn into the table of set m (bit i: k_i), born at tick `born`. */
static void mt_spawn(mtworld *w, keel_cmdbuf *cb, uint32_t m, int64_t born, int64_t salt)
{
    int64_t vals[MT_KINDS];
    keel_init in[MT_KINDS + 1] = {{w->BORN, &born}};
    uint32_t n = 1;
    for (uint32_t i = 0; i < MT_KINDS; i++)
        if (m & (1u << i)) {
            vals[i] = (int64_t)m * 1000 + salt * 10 + (int64_t)i;
            in[n++] = (keel_init){w->K[i], &vals[i]};
        }
    B_CHECK(&w->err, keel_cmd_spawn(cb, in, n));
}

/* Tick 1 fills 200 tables; tick 2 destroys every 7th slot (holes in every
 * table and every slot page); tick 3 writes k0; later ticks spawn into
 * varying tables and destroy a few. Decided by handle and tick only. */
static int mt_sys(keel_ctx *ctx, void *user)
{
    mtworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    if (t == 1) {
        for (uint32_t m = 1; m <= MT_TABLES; m++)
            for (uint32_t r = 0; r < MT_PER_TABLE; r++)
                mt_spawn(w, cb, m, 1, r);
        return 0;
    }
    keel_iter it;
    if (t == 3) {
        keel_txn_iter(ctx, w->q_k0, &it);
        while (keel_txn_next(ctx, &it)) {
            int64_t *v = it.columns[0];
            for (uint32_t r = 0; r < it.count; r++)
                v[r] += (int64_t)KEEL_ENTITY_INDEX(it.entities[r]) * 3 + 1;
        }
    }
    keel_txn_iter(ctx, w->q_born, &it);
    while (keel_txn_next(ctx, &it))
        for (uint32_t r = 0; r < it.count; r++) {
            uint64_t idx = KEEL_ENTITY_INDEX(it.entities[r]);
            if ((t == 2 && idx % 7 == 3) || (t > 3 && idx % 97 == t))
                B_CHECK(&w->err, keel_cmd_destroy(cb, it.entities[r]));
        }
    if (t > 3)
        for (uint32_t j = 0; j < MT_SPAWNS; j++)
            mt_spawn(w, cb, (uint32_t)(t * 7 + j * 11) % MT_TABLES + 1, (int64_t)t, j);
    return 0;
}

static void mt_open(mtworld *w, const keel_runtime_desc *d)
{
    memset(w, 0, sizeof *w);
    w->rt = tu_rt_new(*d);
    w->BORN = reg_i64(w->rt, "born", KEEL_VERSIONED);
    for (int i = 0; i < MT_KINDS; i++) {
        char name[8];
        snprintf(name, sizeof name, "k%d", i);
        /* k1 SINGLE_VERSION: the checkpoint copies it at capture */
        w->K[i] = reg_i64(w->rt, name, i == 1 ? KEEL_SINGLE_VERSION : KEEL_VERSIONED);
    }
    keel_world *wd = keel_runtime_world(w->rt);
    keel_query_desc qb = {.with = {w->BORN}}, qk = {.with = {w->K[0]}};
    ck_assert_ok(keel_query_create(wd, &qb, &w->q_born));
    ck_assert_ok(keel_query_create(wd, &qk, &w->q_k0));
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sd = {.name = "tables", .kind = KEEL_SYSTEM_CALLBACK, .run = mt_sys, .user = w,
                           .access = {.writes = {w->K[0]}}};
    add_sys(s, &sd);
    tu_install(w->rt, s);
}

static void mt_close(mtworld *w)
{
    keel_query_destroy(w->q_born);
    keel_query_destroy(w->q_k0);
    keel_runtime_close(w->rt);
    w->rt = NULL;
}

static void mt_step(mtworld *w)
{
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_berr(&w->err);
}

/* The entities born at tick t, sorted. */
static uint32_t mt_born_at(mtworld *w, uint64_t t, keel_entity out[MT_SPAWNS])
{
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(w->q_born, &it);
    while (keel_iter_next(&it)) {
        const int64_t *b = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++)
            if (b[r] == (int64_t)t && n < MT_SPAWNS)
                out[n++] = it.entities[r];
    }
    qsort(out, n, sizeof *out, cmp_entity);
    return n;
}

static void mt_expect(mtworld *w, const mtref *ref, uint64_t t)
{
    keel_world *wd = keel_runtime_world(w->rt);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), t);
    uint64_t h = keel_world_hash(wd);
    ck_assert_msg(h == ref->hash[t], "tick %llu: hash %016llx, reference %016llx", (unsigned long long)t,
                  (unsigned long long)h, (unsigned long long)ref->hash[t]);
    ck_assert_uint_eq(keel_world_count(wd), ref->count[t]);
    keel_entity b[MT_SPAWNS];
    uint32_t n = mt_born_at(w, t, b);
    ck_assert_uint_eq(n, ref->nborn[t]);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(b[i] == ref->born[t][i], "tick %llu: spawn %u got handle %016llx, reference %016llx",
                      (unsigned long long)t, i, (unsigned long long)b[i], (unsigned long long)ref->born[t][i]);
}

/* A checkpoint of a world with 200 archetype tables (their list is a
 * compressed SNAP_TABLES record, longer than a page of slots) and three
 * slot pages, then close and reopen from it alone: the same hash and
 * tick, and the next spawns get the reference's handles. The table list
 * must survive the slot pages being decompressed after it (they once
 * overwrote it in the codec's scratch: KEEL_ECORRUPT "repeats the
 * component set"). */
START_TEST(test_checkpoint_many_tables)
{
    static mtref ref;
    mtworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    keel_runtime_desc mem = {.world = {.chunk_rows = 64}, .workers = 2, .tick_rate_hz = -1};
    mt_open(w, &mem);
    for (uint64_t t = 1; t <= MT_MAXT; t++) {
        mt_step(w);
        keel_world *wd = keel_runtime_world(w->rt);
        ref.hash[t] = keel_world_hash(wd);
        ref.count[t] = keel_world_count(wd);
        ref.nborn[t] = mt_born_at(w, t, ref.born[t]);
    }
    ck_assert_uint_eq(ref.count[1], MT_TABLES * MT_PER_TABLE);
    ck_assert_uint_lt(ref.count[2], ref.count[1]);
    ck_assert_uint_eq(ref.nborn[4], MT_SPAWNS);
    mt_close(w);

    char dir[256];
    tu_path(dir, sizeof dir, "many-tables");
    keel_runtime_desc d = desc_dir(dir, 2, 64, KEEL_DURABLE_GROUP);
    mt_open(w, &d);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    for (uint64_t t = 1; t <= 3; t++) {
        mt_step(w);
        mt_expect(w, &ref, t);
    }
    ck_assert_ok(keel_checkpoint(w->rt));
    uint64_t h3 = keel_world_hash(keel_runtime_world(w->rt));
    mt_close(w);

    /* what the test needs: the reopen reads the checkpoint alone; its table
     * list is compressed, and compressed slot pages, none longer than the
     * list (each is decompressed into the same scratch), follow it */
    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.has_ckpt);
    ck_assert_uint_eq(v.ckpt.tick, 3);
    ck_assert_uint_eq(v.n, 1);
    ck_assert_uint_eq(v.r[0].kind, KW_KIND_CHECKPOINT);
    uint32_t tables = 0, pages = 0, tables_len = 0, page_max = 0;
    for (uint32_t i = 0; i < v.nsnap; i++) {
        const snap_info *si = &v.snap[i];
        if (si->kind == KW_KIND_SNAP_TABLES) {
            tables++;
            tables_len = si->raw_len;
            ck_assert_uint_eq(si->codec, KW_CODEC_ZSTD);
        }
        if (si->kind == KW_KIND_SNAP_SLOTS) {
            pages++;
            ck_assert_uint_eq(si->codec, KW_CODEC_ZSTD);
            page_max = si->raw_len > page_max ? si->raw_len : page_max;
        }
    }
    ck_assert_uint_eq(tables, 1);
    ck_assert_uint_ge(pages, 3);
    ck_assert_uint_gt(tables_len, page_max);
    dir_view_free(&v);

    mt_open(w, &d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, 3);
    ck_assert_uint_eq(info.tick, 3);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h3);
    mt_expect(w, &ref, 3);
    for (uint64_t t = 4; t <= MT_MAXT; t++) {
        mt_step(w);
        mt_expect(w, &ref, t);
    }
    mt_close(w);
    free(w);
}
END_TEST

/* ---- stats and telemetry against the records on disk ------------------------------- */

typedef struct bworld {
    keel_runtime *rt;
    keel_component A, B;
    keel_query *q;
    uint32_t spawn_n, kill_n;
    bool rewrite;
    berr err;
} bworld;

static int b_sys(keel_ctx *ctx, void *user)
{
    bworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    for (uint32_t i = 0; i < w->spawn_n; i++) {
        pos_t p = {(int64_t)i, (int64_t)t};
        int64_t b = (int64_t)i * 3;
        keel_init in[2] = {{w->A, &p}, {w->B, &b}};
        B_CHECK(&w->err, keel_cmd_spawn(cb, in, 2));
    }
    if (w->rewrite) {
        keel_iter it;
        keel_txn_iter(ctx, w->q, &it);
        while (keel_txn_next(ctx, &it)) {
            pos_t *p = it.columns[0];
            for (uint32_t r = 0; r < it.count; r++)
                p[r].x += (int64_t)t;
        }
    }
    for (uint32_t i = 0; i < w->kill_n; i++)
        B_CHECK(&w->err, keel_cmd_destroy(cb, KEEL_ENTITY_MAKE(i, 1)));
    return 0;
}

static void b_open(bworld *w, const keel_runtime_desc *d)
{
    memset(w, 0, sizeof *w);
    w->rt = tu_rt_new(*d);
    keel_component_desc a = {.name = "a", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(keel_runtime_world(w->rt), &a, &w->A));
    w->B = reg_i64(w->rt, "b", KEEL_SINGLE_VERSION);
    keel_query_desc qd = {.with = {w->A}};
    ck_assert_ok(keel_query_create(keel_runtime_world(w->rt), &qd, &w->q));
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sd = {.name = "big", .kind = KEEL_SYSTEM_CALLBACK, .run = b_sys, .user = w,
                           .access = {.writes = {w->A, w->B}}};
    add_sys(s, &sd);
    tu_install(w->rt, s);
}

static void b_close(bworld *w)
{
    keel_query_destroy(w->q);
    keel_runtime_close(w->rt);
    w->rt = NULL;
}

/* The runtime's threads carry names (top -H, perf, gdb): one per worker
 * beyond the stepping thread, the watchdog, and once the directory is open
 * the WAL writer and the checkpoint thread; the driver while started; all
 * gone after close. */
START_TEST(test_threads_are_named)
{
    char dir[256];
    tu_path(dir, sizeof dir, "names");
    keel_runtime_desc d = desc_dir(dir, 3, 1024, KEEL_DURABLE_GROUP);
    bworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    b_open(w, &d);
    ck_assert_int_eq(tu_threads_named("keel-worker-1"), 1);
    ck_assert_int_eq(tu_threads_named("keel-worker-2"), 1);
    ck_assert_int_eq(tu_threads_named("keel-worker-3"), 0); /* the stepping thread is worker 0 */
    ck_assert_int_eq(tu_threads_named("keel-watchdog"), 1);
    ck_assert_int_eq(tu_threads_named("keel-wal-writer"), 0);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_int_eq(tu_threads_named("keel-wal-writer"), 1);
    ck_assert_int_eq(tu_threads_named("keel-checkpoint"), 1);
    ck_assert_int_eq(tu_threads_named("keel-driver"), 0);
    ck_assert_ok(keel_runtime_start(w->rt));
    ck_assert_int_eq(tu_threads_named("keel-driver"), 1);
    ck_assert_ok(keel_runtime_stop(w->rt));
    ck_assert(tu_threads_gone("keel-driver"));
    b_close(w);
    free(w);
    ck_assert(tu_threads_gone("keel-worker-1") && tu_threads_gone("keel-worker-2") && tu_threads_gone("keel-watchdog") &&
              tu_threads_gone("keel-wal-writer") && tu_threads_gone("keel-checkpoint"));
}
END_TEST

/* keel_flush; keel_runtime_stats_get's WAL counters; the telemetry
 * tick record's wal_raw_bytes / wal_stored_bytes / durable_lag -- each
 * compared with what the records on disk say. Tick 1 spawns enough
 * entities for several LIFECYCLE records, tick 2 rewrites enough rows for
 * several TICK_CHUNK records (compressed in parallel on 2 workers). */
START_TEST(test_stats_and_telemetry)
{
    char dir[256];
    tu_path(dir, sizeof dir, "stats");
    keel_runtime_desc d = desc_dir(dir, 2, 1024, KEEL_DURABLE_GROUP);
    bworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    b_open(w, &d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    const uint64_t T = 5;
    keel_tick_record rec[6];
    for (uint64_t t = 1; t <= T; t++) {
        w->spawn_n = t == 1 ? 3000 : t == 5 ? 10 : 0;
        w->rewrite = t == 2 || t == 3;
        w->kill_n = t == 3 ? 100 : 0;
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
        ck_assert_ok(keel_telemetry_tick(w->rt, t, &rec[t]));
        ck_assert_uint_eq(rec[t].tick, t);
        ck_assert_uint_le(rec[t].durable_lag, t); /* the writer cannot be ahead, nor behind the open */
        ck_assert_uint_gt(rec[t].wal_stored_bytes, 0); /* every tick logs at least its commit marker */
    }
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(w->rt)), 2910);
    ck_assert_ok(keel_flush(w->rt));
    uint64_t durable = keel_durable_lsn(w->rt);
    ck_assert_uint_eq(durable, dur_last_lsn(w->rt->dur));
    keel_runtime_stats st = tu_stats(w->rt);
    ck_assert_uint_gt(st.wal_bytes, 0);
    ck_assert_uint_ge(st.fsyncs, 1);
    ck_assert_uint_eq(st.checkpoints, 0);
    ck_assert_uint_eq(st.checkpoint_age_ticks, T);
    ck_assert_uint_eq(st.recovery_ns, info.ns);
    ck_assert_uint_eq(st.ticks, T);
    /* the next tick after a flush lags by one tick at most */
    ck_assert_ok(keel_runtime_step(w->rt));
    keel_tick_record r6;
    ck_assert_ok(keel_telemetry_tick(w->rt, T + 1, &r6));
    ck_assert_uint_le(r6.durable_lag, 1);
    ck_assert_ok(keel_flush(w->rt));
    st = tu_stats(w->rt);
    durable = keel_durable_lsn(w->rt);
    b_close(w);

    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.consecutive);
    ck_assert_uint_eq(v.r[v.n - 1].lsn, durable); /* nothing was written after the flush */
    uint64_t bytes = 0, raw[7] = {0}, stored[7] = {0}, nlife[7] = {0}, nchunk[7] = {0};
    for (uint64_t i = 0; i < v.n; i++) {
        const rec_info *r = &v.r[i];
        if (r->kind != KW_KIND_SCHEMA)
            bytes += r->len;
        if (r->flags & KW_FLAG_HOOK || r->tick > T + 1)
            continue;
        if (r->kind == KW_KIND_TICK_CHUNK || r->kind == KW_KIND_LIFECYCLE || r->kind == KW_KIND_TICK_COMMIT)
            stored[r->tick] += r->len;
        if (r->kind == KW_KIND_TICK_CHUNK || r->kind == KW_KIND_LIFECYCLE)
            raw[r->tick] += r->raw_len;
        nlife[r->tick] += r->kind == KW_KIND_LIFECYCLE;
        nchunk[r->tick] += r->kind == KW_KIND_TICK_CHUNK;
    }
    ck_assert_msg(st.wal_bytes == bytes, "stats wal_bytes %llu, the WAL holds %llu bytes of records",
                  (unsigned long long)st.wal_bytes, (unsigned long long)bytes);
    ck_assert_uint_ge(nlife[1], 2);  /* the workload does what the test needs */
    ck_assert_uint_ge(nchunk[2], 2);
    for (uint64_t t = 1; t <= T; t++) {
        ck_assert_msg(rec[t].wal_stored_bytes == stored[t],
                      "tick %llu: telemetry wal_stored_bytes %llu, its records on disk %llu bytes",
                      (unsigned long long)t, (unsigned long long)rec[t].wal_stored_bytes,
                      (unsigned long long)stored[t]);
        ck_assert_msg(rec[t].wal_raw_bytes == raw[t],
                      "tick %llu: telemetry wal_raw_bytes %llu, its records' payloads %llu bytes raw "
                      "(%llu LIFECYCLE, %llu TICK_CHUNK records)",
                      (unsigned long long)t, (unsigned long long)rec[t].wal_raw_bytes, (unsigned long long)raw[t],
                      (unsigned long long)nlife[t], (unsigned long long)nchunk[t]);
    }
    dir_view_free(&v);
    free(w);
}
END_TEST

/* The fence cuts big groups across records: 20 000 rows of a 16-byte
 * component rewritten in one tick (chunk columns of 8 192 rows: 196 KB of
 * rows each) become an even number of TICK_CHUNK records of at most about
 * DUR_RECORD_TARGET payload bytes each; the records are the same on 1 and
 * on 2 workers (captured and compressed in parallel or not), and a reopen
 * recovers the state the run ended with. */
START_TEST(test_fence_splits_groups)
{
    uint64_t lens[2][64], nrec[2], hash[2];
    for (int k = 0; k < 2; k++) {
        char dir[256];
        tu_path(dir, sizeof dir, k ? "split2" : "split1");
        keel_runtime_desc d = desc_dir(dir, k + 1, 8192, KEEL_DURABLE_GROUP);
        bworld *w = calloc(1, sizeof *w);
        ck_assert_ptr_nonnull(w);
        b_open(w, &d);
        ck_assert_ok(keel_runtime_recover(w->rt, NULL));
        w->spawn_n = 20000;
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
        w->spawn_n = 0;
        w->rewrite = true;
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
        ck_assert_uint_eq(w->rt->txn.uow.nrows, 20000);
        hash[k] = keel_world_hash(keel_runtime_world(w->rt));
        b_close(w);
        dir_view v;
        dir_read(dir, &v);
        nrec[k] = 0;
        for (uint64_t i = 0; i < v.n; i++) {
            if (v.r[i].kind != KW_KIND_TICK_CHUNK || v.r[i].tick != 2)
                continue;
            ck_assert_uint_le(v.r[i].raw_len, DUR_RECORD_TARGET + 64);
            ck_assert_uint_lt(nrec[k], 64);
            lens[k][nrec[k]++] = (uint64_t)v.r[i].raw_len << 32 | v.r[i].stored_len;
        }
        ck_assert_uint_ge(nrec[k], 4);
        ck_assert_uint_eq(nrec[k] % 2, 0);
        dir_view_free(&v);
        b_open(w, &d);
        ck_assert_ok(keel_runtime_recover(w->rt, NULL));
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), hash[k]);
        b_close(w);
        free(w);
    }
    ck_assert_uint_eq(nrec[0], nrec[1]);
    ck_assert_mem_eq(lens[0], lens[1], nrec[0] * sizeof lens[0][0]);
    ck_assert_uint_eq(hash[0], hash[1]);
}
END_TEST

/* The WAL does not depend on the worker count: two parallel query systems
 * write 40 000 rows (40 chunks of 1 024) a tick, enough for the capture to
 * run on the pool with each worker capturing the chunk columns its own
 * tasks wrote (uow.c, capture_home_task); on 1, 2 and 4 workers the
 * TICK_CHUNK payloads are the same bytes, and so is the world. */
#define WB_N 40000u
typedef struct wb_world {
    keel_component A, B;
} wb_world;

static int wb_spawn(keel_ctx *ctx, void *user)
{
    const wb_world *w = user;
    for (uint32_t i = 0; keel_ctx_tick(ctx) == 1 && i < WB_N; i++) {
        pos_t p = {(int64_t)i, -(int64_t)i};
        int64_t b = (int64_t)i * 7;
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{w->A, &p}, {w->B, &b}}, 2);
        if (rc)
            return rc;
    }
    return 0;
}

/* A: two rows in three move (x += tick); B: every other row, by tick parity */
static int wb_move(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    pos_t *p = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++)
        if ((KEEL_ENTITY_INDEX(it->entities[r]) + t) % 3)
            p[r].x += (int64_t)t;
    return 0;
}

static int wb_grow(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    uint64_t t = keel_ctx_tick(ctx);
    int64_t *b = it->columns[0];
    for (uint32_t r = 0; r < it->count; r++)
        if (KEEL_ENTITY_INDEX(it->entities[r]) % 2 == t % 2)
            b[r] += 1;
    return 0;
}

/* FNV-1a over the raw payloads of dir's TICK_CHUNK records, in LSN order;
 * *n their count. */
static uint64_t tick_chunk_digest(const char *dir, uint32_t *n)
{
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    tu_wal_reader w;
    tu_wal_open(&w, dir, 0);
    uint64_t lsn = 0, h = 14695981039346656037ull;
    const void *rec, *payload;
    size_t len;
    int rc;
    *n = 0;
    while ((rc = kw_wal_next(w.it, &lsn, &rec, &len)) == 1) {
        kw_header hd;
        ck_assert_ok(kw_record_check(rec, len, &hd));
        if (hd.kind != KW_KIND_TICK_CHUNK)
            continue;
        ck_assert_ok(kw_record_payload(c, rec, &hd, &payload));
        h = core_fnv1a64(h, payload, hd.raw_len);
        ++*n;
    }
    ck_assert_int_eq(rc, 0);
    tu_wal_close(&w);
    kw_codec_destroy(c);
    return h;
}

START_TEST(test_wal_same_on_any_worker_count)
{
    static const int32_t workers[3] = {1, 2, 4};
    uint64_t digest[3], hash[3];
    uint32_t records[3];
    for (int k = 0; k < 3; k++) {
        char dir[256], name[16];
        snprintf(name, sizeof name, "wb%d", workers[k]);
        tu_path(dir, sizeof dir, name);
        keel_runtime_desc d = desc_dir(dir, workers[k], 1024, KEEL_DURABLE_GROUP);
        keel_runtime *rt = tu_rt_new(d);
        static wb_world w;
        keel_component_desc a = {.name = "a", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
        ck_assert_ok(keel_component_register(keel_runtime_world(rt), &a, &w.A));
        w.B = reg_i64(rt, "b", KEEL_VERSIONED);
        keel_schedule *s = sched_new(rt);
        add_sys(s, &(keel_system_desc){.name = "spawn", .run = wb_spawn, .user = &w});
        add_sys(s, &(keel_system_desc){.name = "move", .kind = KEEL_SYSTEM_QUERY, .each_chunk = wb_move,
                                       .parallel = true, .query = {.with = {w.A}}, .access = {.writes = {w.A}}});
        add_sys(s, &(keel_system_desc){.name = "grow", .kind = KEEL_SYSTEM_QUERY, .each_chunk = wb_grow,
                                       .parallel = true, .query = {.with = {w.B}}, .access = {.writes = {w.B}}});
        tu_install(rt, s);
        ck_assert_ok(keel_runtime_recover(rt, NULL));
        for (int t = 0; t < 4; t++) {
            ck_assert_ok(keel_runtime_step(rt));
            if (t > 0) /* the pool captured, by the writers' homes */
                ck_assert_uint_eq(rt->txn.uow.nhomes, workers[k] > 1 ? (uint32_t)workers[k] : 0);
        }
        ck_assert_ok(keel_flush(rt));
        hash[k] = keel_world_hash(keel_runtime_world(rt));
        keel_runtime_close(rt);
        digest[k] = tick_chunk_digest(dir, &records[k]);
        ck_assert_uint_ge(records[k], 3);
    }
    for (int k = 1; k < 3; k++) {
        ck_assert_uint_eq(records[k], records[0]);
        ck_assert_msg(digest[k] == digest[0], "TICK_CHUNK payloads on %d workers differ from 1 worker's", workers[k]);
        ck_assert_uint_eq(hash[k], hash[0]);
    }
}
END_TEST

/* keel_flush forces DEFERRED ticks and side transactions to disk; the
 * calls without a data directory. */
START_TEST(test_flush_deferred_and_no_dir)
{
    static wref ref;
    w_reference(&ref, 4, 1, false);
    char dir[256];
    keel_runtime_desc d;
    wworld *w = w_open_driven(&d, dir, "deferred", KEEL_DURABLE_DEFERRED, 4);
    ck_assert_ok(keel_flush(w->rt));
    uint64_t last = dur_last_lsn(w->rt->dur);
    ck_assert_uint_eq(keel_durable_lsn(w->rt), last);
    ck_assert_ok(keel_flush(w->rt)); /* nothing pending: at once */
    ck_assert_uint_eq(keel_durable_lsn(w->rt), last);
    w_close(w);
    dir_view v;
    dir_read(dir, &v);
    ck_assert_uint_eq(v.r[v.n - 1].lsn, last);
    ck_assert_uint_eq(v.kinds[KW_KIND_TICK_COMMIT], 5);
    dir_view_free(&v);
    w_reset(w, false);
    w_open(w, &d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    w_expect(w, &ref, 4);
    w_close(w);

    /* no data directory */
    keel_runtime_desc m = {.workers = 1, .tick_rate_hz = -1};
    w_reset(w, false);
    w_open(w, &m, false);
    keel_recovery info;
    memset(&info, 0xab, sizeof info);
    ck_assert_rc(keel_runtime_recover(w->rt, &info), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "durable.dir"));
    ck_assert_rc(keel_checkpoint(w->rt), KEEL_EINVAL);
    w_drive(w, 1);
    ck_assert_ok(keel_flush(w->rt));
    ck_assert_uint_eq(keel_durable_lsn(w->rt), 0);
    ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
    keel_runtime_stats st = tu_stats(w->rt);
    ck_assert_uint_eq(st.wal_bytes, 0);
    ck_assert_uint_eq(st.fsyncs, 0);
    ck_assert_uint_eq(st.checkpoints, 0);
    ck_assert_uint_eq(st.recovery_ns, 0);
    keel_tick_record r1;
    ck_assert_ok(keel_telemetry_tick(w->rt, 1, &r1));
    ck_assert_uint_eq(r1.wal_raw_bytes, 0);
    ck_assert_uint_eq(r1.wal_stored_bytes, 0);
    ck_assert_uint_eq(r1.durable_lag, 0);
    w_close(w);
    ck_assert_rc(keel_runtime_recover(NULL, &info), KEEL_EINVAL);
    ck_assert_rc(keel_flush(NULL), KEEL_EINVAL);
    ck_assert_rc(keel_checkpoint(NULL), KEEL_EINVAL);
    ck_assert_int_eq(keel_runtime_fatal(NULL), 0);
    ck_assert_uint_eq(keel_durable_lsn(NULL), 0);
    free(w);
}
END_TEST

/* ---- hooks ------------------------------------------------------------------------ */

/* on_shutdown runs in keel_runtime_close in an IMMEDIATE side transaction:
 * its writes are on disk and come back; a failing on_shutdown writes
 * nothing; on_first_tick runs once per open, before any system. */
START_TEST(test_hooks_first_tick_and_shutdown)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "hooks", KEEL_DURABLE_GROUP);
    wworld *w = w_new(false);
    w_open(w, &d, true);
    for (uint64_t t = 1; t <= 3; t++)
        w_drive(w, t);
    ck_assert_uint_eq(w->hook_calls, 1);
    ck_assert_uint_eq(w->hook_tick, 1);
    ck_assert_uint_eq(w->hook_sys_before, 0);
    keel_entity a[8];
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    int64_t m0 = get_i64(w->rt, a[0], w->MONEY), m1 = get_i64(w->rt, a[1], w->MONEY);
    ck_assert_int_eq(m0 + m1, 2000);
    w->shutdown_xfer = (xfer){a[0], a[1], 500, w->MONEY};
    ck_assert_ok(w_close(w));
    ck_assert_uint_eq(w->shutdown_calls, 1);
    dir_view v;
    dir_read(dir, &v);
    const rec_info *lastr = &v.r[v.n - 1];
    ck_assert_uint_eq(lastr->kind, KW_KIND_SIDE);
    ck_assert_uint_eq(lastr->side_mode, KEEL_DURABLE_IMMEDIATE);
    uint64_t nside = v.kinds[KW_KIND_SIDE];
    dir_view_free(&v);

    /* reopen: the shutdown transfer is there; this time on_shutdown fails */
    w_reset(w, false);
    w->shutdown_ret = KEEL_ERANGE;
    log_capture_on();
    w_open(w, &d, true);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 3);
    ck_assert_uint_eq(info.side_txns, nside);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 500);
    ck_assert_int_eq(get_i64(w->rt, a[1], w->MONEY), m1 + 500);
    ck_assert_uint_eq(w->hook_calls, 0); /* not before the first tick */
    w_drive(w, 4);
    ck_assert_uint_eq(w->hook_calls, 1);
    ck_assert_uint_eq(w->hook_tick, 4);
    ck_assert_uint_eq(w->hook_sys_before, 0);
    w_drive(w, 5);
    ck_assert_uint_eq(w->hook_calls, 1);
    int64_t n0 = get_i64(w->rt, a[0], w->MONEY), n1 = get_i64(w->rt, a[1], w->MONEY);
    ck_assert_int_eq(n0 + n1, 2000);
    ck_assert_rc(w_close(w), KEEL_ERANGE); /* on_shutdown's own code reaches the caller */
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_runtime_close: on_shutdown returned"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "its writes are not applied"));
    ck_assert_uint_eq(w->shutdown_calls, 1);
    ck_assert_logged("runtime/on_shutdown_failed", "code=KEEL_ERANGE");
    dir_read(dir, &v);
    ck_assert_uint_eq(v.kinds[KW_KIND_SIDE], nside + 4); /* ticks 4 and 5: bank + closure each */
    ck_assert_uint_eq(v.r[v.n - 1].kind, KW_KIND_TICK_COMMIT);
    ck_assert_uint_eq(v.r[v.n - 1].tick, 5);
    dir_view_free(&v);
    w_reset(w, false);
    w_open(w, &d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 5);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), n0);
    ck_assert_int_eq(get_i64(w->rt, a[1], w->MONEY), n1);
    w_close(w);

    /* on_shutdown runs without a data directory too */
    keel_runtime_desc m = {.workers = 1, .tick_rate_hz = -1};
    w_reset(w, false);
    w_open(w, &m, true);
    w_drive(w, 1);
    w_drive(w, 2);
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    w->shutdown_xfer = (xfer){a[0], a[1], 1, w->MONEY};
    ck_assert_ok(w_close(w));
    ck_assert_uint_eq(w->shutdown_calls, 1);
    /* ... and its failure is close's result there too */
    w_reset(w, false);
    w->shutdown_ret = KEEL_ERANGE;
    w_open(w, &m, true);
    w_drive(w, 1);
    ck_assert_rc(w_close(w), KEEL_ERANGE);
    ck_assert_uint_eq(w->shutdown_calls, 1);
    free(w);
}
END_TEST

/* With a data directory nothing may change the world unlogged, also
 * before recovery (keel/durability.h): such a change would be lost. */
START_TEST(test_writes_before_recover_refused)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "before-recover", KEEL_DURABLE_GROUP);
    keel_runtime *rt = tu_rt_new(d);
    keel_component V = reg_i64(rt, "v", KEEL_VERSIONED);
    keel_world *wd = keel_runtime_world(rt);
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(wd, &cb));
    int64_t val = 42;
    keel_init in[1] = {{V, &val}};
    ck_assert_ok(keel_cmd_spawn(cb, in, 1));
    int rc = keel_cmdbuf_apply(cb);
    uint32_t applied = keel_cmdbuf_result(cb).spawned;
    keel_cmdbuf_destroy(cb);
    if (rc == KEEL_OK) {
        /* show what it costs: the entity lives in memory and is never logged */
        uint32_t before = keel_world_count(wd);
        ck_assert_ok(keel_runtime_recover(rt, NULL));
        keel_runtime_close(rt);
        rt = tu_rt_new(d);
        reg_i64(rt, "v", KEEL_VERSIONED);
        keel_recovery info;
        int rrc = keel_runtime_recover(rt, &info);
        uint32_t after = keel_world_count(keel_runtime_world(rt));
        keel_runtime_close(rt);
        ck_abort_msg("keel_cmdbuf_apply before keel_runtime_recover on a runtime with a data directory returned 0 "
                     "(spawned %u): the change was applied unlogged (%u entities before close, %u after reopen, "
                     "recover %s); expected KEEL_EBUSY", applied, before, after, keel_strerror(rrc));
    }
    ck_assert_rc(rc, KEEL_EBUSY);
    ck_assert_uint_eq(keel_world_count(wd), 0);
    keel_runtime_close(rt);
}
END_TEST

/* ---- keel_runtime_recover's refusals ---------------------------------------------- */

typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    uint64_t ticks_seen;
} gate;

/* The driver's clock: blocks the driver thread before its first tick until
 * the test opens the gate. */
static uint64_t gate_clock(void *user)
{
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return core_now_ns();
}

static int gate_sys(keel_ctx *ctx, void *user)
{
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->ticks_seen = keel_ctx_tick(ctx);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static void gate_init(gate *g, bool open)
{
    memset(g, 0, sizeof *g);
    g->open = open;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

/* Open the gate and wait for the driver's tick `n`. The deadline only turns
 * a driver that stopped (it cannot tell) into a failure instead of a hang. */
static uint64_t gate_wait_ticks(gate *g, uint64_t n)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 60;
    while (g->ticks_seen < n && pthread_cond_timedwait(&g->cv, &g->mu, &dl) != ETIMEDOUT)
        ;
    uint64_t seen = g->ticks_seen;
    pthread_mutex_unlock(&g->mu);
    return seen;
}

static keel_runtime *gate_runtime(const keel_runtime_desc *d, gate *g)
{
    keel_runtime *rt = tu_rt_new(*d);
    reg_i64(rt, "v", KEEL_VERSIONED);
    keel_schedule *s = sched_new(rt);
    keel_system_desc sd = {.name = "gate", .kind = KEEL_SYSTEM_CALLBACK, .run = gate_sys, .user = g};
    add_sys(s, &sd);
    tu_install(rt, s);
    return rt;
}

/* keel_runtime_start without keel_runtime_recover first: a
 * keel_runtime_recover from the controlling thread while the driver runs
 * is refused with KEEL_EBUSY and opens nothing (unless start already
 * recovered: then it reports that result); either way the driver must be
 * able to open the directory and tick (keel_runtime_step recovers "when
 * the application did not"). With a data directory no tick runs before
 * recovery, so "ticks already ran" can only be this case. */
START_TEST(test_recover_busy_while_driver_starts)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "driver-first", KEEL_DURABLE_GROUP);
    gate g;
    gate_init(&g, false);
    keel_runtime *rt = gate_runtime(&d, &g);
    runtime_test_set_clock(rt, gate_clock, NULL, &g); /* holds the driver before its first tick */
    ck_assert_ok(keel_runtime_start(rt));
    keel_recovery info;
    memset(&info, 0xab, sizeof info);
    int rc = keel_runtime_recover(rt, &info);
    if (rc == KEEL_EBUSY) { /* refused: nothing opened, nothing reported */
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_runtime_recover"));
        ck_assert_uint_eq(info.tick, 0xababababababababull);
        ck_assert(!path_exists(dir));
    } else { /* or keel_runtime_start opened the directory itself: its result */
        ck_assert_rc(rc, KEEL_OK);
        ck_assert(info.fresh);
        ck_assert(path_exists(dir));
    }
    ck_assert_rc(keel_checkpoint(rt), KEEL_EBUSY);
    uint64_t seen = gate_wait_ticks(&g, 3);
    int stop = keel_runtime_stop(rt);
    char why[512];
    snprintf(why, sizeof why, "%s", keel_last_error());
    keel_runtime_close(rt);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    ck_assert_msg(stop == 0 && seen >= 3,
                  "keel_runtime_start without an earlier keel_runtime_recover: the driver stopped with %s after %llu "
                  "ticks (%s)", keel_strerror(stop), (unsigned long long)seen, why);
}
END_TEST

/* Recover, run ticks on the driver, recover again: the first result, not
 * an error and not a second open. */
START_TEST(test_recover_again_after_ticks)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "driver-after", KEEL_DURABLE_GROUP);
    gate g;
    gate_init(&g, true);
    keel_runtime *rt = gate_runtime(&d, &g);
    keel_recovery first, again;
    ck_assert_ok(keel_runtime_recover(rt, &first));
    ck_assert(first.fresh);
    ck_assert_ok(keel_runtime_start(rt));
    ck_assert_uint_ge(gate_wait_ticks(&g, 3), 3);
    ck_assert_ok(keel_runtime_stop(rt));
    uint64_t ticks = keel_runtime_tick(rt);
    ck_assert_uint_ge(ticks, 3);
    memset(&again, 0xcd, sizeof again);
    ck_assert_ok(keel_runtime_recover(rt, &again));
    recovery_eq(&first, &again);
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_uint_eq(keel_runtime_tick(rt), ticks + 1);
    keel_runtime_close(rt);
    rt = gate_runtime(&d, &g);
    ck_assert_ok(keel_runtime_recover(rt, &again));
    ck_assert(!again.fresh);
    ck_assert_uint_eq(again.tick, ticks + 1);
    keel_runtime_close(rt);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
}
END_TEST

/* ---- the durable lag while the writer cannot commit -------------------------------- */

/* A child process that holds the LMDB write lock of dir while the parent
 * ticks: the parent's WAL writer blocks in LMDB, deterministically. The
 * child is forked before the runtime exists (a single-threaded fork). */
typedef struct holder {
    pid_t pid;
    int go_w, held_r;
} holder;

typedef struct hold_arg {
    int go_r, held_w;
} hold_arg;

static int hold_fill(kw_wtxn *t, void *arg)
{
    (void)t;
    hold_arg *h = arg;
    char c = 'H';
    if (write(h->held_w, &c, 1) != 1)
        return KEEL_EIO;
    if (read(h->go_r, &c, 1) < 0) /* 'R', or EOF when the parent died */
        return KEEL_EIO;
    return KEEL_EINVAL; /* abort: nothing written */
}

static void holder_fork(holder *h, const char *dir)
{
    int go[2], held[2];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(held), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(go[1]);
        close(held[0]);
        char c;
        if (read(go[0], &c, 1) != 1)
            _exit(0);
        kw_store *st = NULL;
        kw_store_desc sd = {0};
        if (kw_store_open(dir, &sd, &st)) {
            c = 'E';
            if (write(held[1], &c, 1) != 1)
                _exit(4);
            _exit(2);
        }
        hold_arg a = {go[0], held[1]};
        int rc = kw_store_write(st, hold_fill, &a);
        kw_store_close(st);
        _exit(rc == KEEL_EINVAL ? 0 : 3);
    }
    close(go[0]);
    close(held[1]);
    *h = (holder){pid, go[1], held[0]};
}

static void holder_hold(holder *h)
{
    char c = 'G';
    ck_assert_int_eq(write(h->go_w, &c, 1), 1);
    ck_assert_int_eq(read(h->held_r, &c, 1), 1);
    ck_assert_msg(c == 'H', "the holder could not open the data directory");
}

static void holder_release(holder *h)
{
    char c = 'R';
    ck_assert_int_eq(write(h->go_w, &c, 1), 1);
    close(h->go_w);
    close(h->held_r);
    int status = 0;
    ck_assert_int_eq(waitpid(h->pid, &status, 0), h->pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "holder exited with status %d", status);
}

typedef struct read_arg {
    keel_entity e;
    keel_component c;
    int64_t value;
} read_arg;

/* A side transaction that only reads. */
static int closure_read(keel_side_txn *tx, void *arg)
{
    read_arg *r = arg;
    return keel_side_get(tx, r->e, r->c, &r->value);
}

/* While the WAL writer is stuck, GROUP ticks run on and their telemetry
 * shows the growing durable lag; an IMMEDIATE ticket is not acknowledged;
 * the durable LSN does not move. Then everything catches up. A read-only
 * IMMEDIATE transaction that read the stuck transfer is not acknowledged
 * either (it logs nothing, but waits for what it read); once everything
 * is durable, one is acknowledged at once, and neither logs a record. */
/* A recovered GROUP world on the fresh directory `name` (dir), with a
 * holder forked on it to stop its WAL writer. No side transaction inside a
 * system: they would wait for the writer. */
static wworld *held_world(char dir[256], const char *name, holder *h, keel_runtime_desc *d)
{
    tu_path(dir, 256, name);
    holder_fork(h, dir);
    *d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    wworld *w = w_new(true);
    w_open(w, d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    return w;
}

START_TEST(test_durable_lag_while_writer_blocked)
{
    char dir[256];
    holder h;
    keel_runtime_desc d;
    wworld *w = held_world(dir, "lag", &h, &d);
    w_drive(w, 1);
    w_drive(w, 2);
    ck_assert_ok(keel_flush(w->rt));
    uint64_t l0 = keel_durable_lsn(w->rt);
    ck_assert_uint_eq(l0, dur_last_lsn(w->rt->dur));
    uint64_t f0 = tu_stats(w->rt).fsyncs;
    keel_entity a[8];
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    int64_t m0 = get_i64(w->rt, a[0], w->MONEY);

    holder_hold(&h);
    xfer x = {a[0], a[1], 25, w->MONEY};
    keel_ticket *tk = NULL;
    ck_assert_ok(keel_submit(w->rt, closure_xfer, &x, KEEL_DURABLE_IMMEDIATE, &tk));
    read_arg ra = {a[0], w->MONEY, 0};
    keel_ticket *rk = NULL;
    ck_assert_ok(keel_submit(w->rt, closure_read, &ra, KEEL_DURABLE_IMMEDIATE, &rk));
    for (uint64_t t = 3; t <= 5; t++) {
        w_drive(w, t);
        keel_tick_record r;
        ck_assert_ok(keel_telemetry_tick(w->rt, t, &r));
        ck_assert_msg(r.durable_lag == t - 2, "tick %llu: durable_lag %llu, expected %llu", (unsigned long long)t,
                      (unsigned long long)r.durable_lag, (unsigned long long)(t - 2));
        ck_assert_uint_gt(r.wal_stored_bytes, 0);
    }
    ck_assert_uint_eq(keel_durable_lsn(w->rt), l0);
    ck_assert_uint_gt(dur_last_lsn(w->rt->dur), l0);
    ck_assert_rc(keel_ticket_wait(tk, 0), KEEL_ETIMEDOUT); /* applied, not yet durable: not acknowledged */
    ck_assert_rc(keel_ticket_wait(rk, 0), KEEL_ETIMEDOUT); /* read-only, but it read the transfer */
    ck_assert_int_eq(ra.value, m0 - 25); /* it ran after the transfer, and saw it */
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 25);
    ck_assert_uint_eq(tu_stats(w->rt).fsyncs, f0);
    holder_release(&h);

    ck_assert_ok(keel_ticket_wait(tk, -1));
    keel_ticket_release(tk);
    ck_assert_ok(keel_ticket_wait(rk, -1));
    keel_ticket_release(rk);
    ck_assert_ok(keel_flush(w->rt));
    ck_assert_uint_eq(keel_durable_lsn(w->rt), dur_last_lsn(w->rt->dur));
    ck_assert_uint_gt(tu_stats(w->rt).fsyncs, f0);
    /* everything durable: a read-only IMMEDIATE closure is acknowledged
     * although the writer is stuck again, since it read nothing unsynced */
    holder h2;
    holder_fork(&h2, dir);
    holder_hold(&h2);
    ck_assert_ok(keel_submit(w->rt, closure_read, &ra, KEEL_DURABLE_IMMEDIATE, &rk));
    w_drive(w, 6);
    ck_assert_ok(keel_ticket_wait(rk, 0));
    keel_ticket_release(rk);
    holder_release(&h2);
    ck_assert_ok(keel_flush(w->rt));
    keel_tick_record r6;
    ck_assert_ok(keel_telemetry_tick(w->rt, 6, &r6));
    ck_assert_uint_le(r6.durable_lag, 1);
    uint64_t h6 = keel_world_hash(keel_runtime_world(w->rt));
    w_close(w);
    w_reset(w, true);
    w_open(w, &d, false);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 6);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h6);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 25);
    ck_assert_uint_eq(info.side_txns, 1); /* the transfer; the read logged nothing */
    w_close(w);
    free(w);
}
END_TEST

/* A transfer with an idempotency key (keyed_xfer.key). */
typedef struct keyed_xfer {
    xfer x;
    uint64_t key;
} keyed_xfer;

static int closure_keyed_xfer(keel_side_txn *tx, void *arg)
{
    keyed_xfer *k = arg;
    int rc = keel_side_txn_set_key(tx, k->key);
    return rc ? rc : closure_xfer(tx, &k->x);
}

/* Side transactions committed while the WAL writer is busy share a record:
 * the writer takes its queue once and then waits for the LMDB lock the
 * holder has, so of the five transfers the tick commits after that, those
 * it did not take join one SIDES record (one LSN). Every transfer is
 * acknowledged, recovered with its value, and the keyed one's key is
 * remembered (committing it again is KEEL_EALREADY). */
START_TEST(test_side_transactions_share_a_record_while_the_writer_is_busy)
{
    char dir[256];
    holder h;
    keel_runtime_desc d;
    wworld *w = held_world(dir, "sides", &h, &d);
    w_drive(w, 1);
    ck_assert_ok(keel_flush(w->rt));
    keel_entity a[8];
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    int64_t m0 = get_i64(w->rt, a[0], w->MONEY), m1 = get_i64(w->rt, a[1], w->MONEY);

    enum { N = 5 };
    keyed_xfer x[N];
    keel_ticket *tk[N];
    holder_hold(&h);
    for (int i = 0; i < N; i++) {
        x[i] = (keyed_xfer){{a[0], a[1], i + 1, w->MONEY}, i == 2 ? 0xfeedull : 0};
        ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x[i], KEEL_DURABLE_IMMEDIATE, &tk[i]));
    }
    w_drive(w, 2);
    holder_release(&h);
    uint64_t lsn[N];
    bool shared = false;
    for (int i = 0; i < N; i++) {
        ck_assert_ok(keel_ticket_wait(tk[i], -1));
        lsn[i] = keel_ticket_lsn(tk[i]);
        keel_ticket_release(tk[i]);
        ck_assert_uint_gt(lsn[i], 0);
        if (i) {
            ck_assert_uint_ge(lsn[i], lsn[i - 1]); /* commit order is LSN order */
            shared |= lsn[i] == lsn[i - 1];
        }
    }
    ck_assert_msg(shared, "no two of %d transfers queued behind a busy writer share a record", N);
    ck_assert_ok(keel_flush(w->rt));
    uint64_t h2 = keel_world_hash(keel_runtime_world(w->rt));
    w_close(w);

    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.consecutive);
    ck_assert_uint_eq(v.side_txns, N);
    ck_assert_uint_eq(v.side_modes[KEEL_DURABLE_IMMEDIATE], N);
    ck_assert_uint_ge(v.kinds[KW_KIND_SIDES], 1);
    ck_assert_uint_le(v.kinds[KW_KIND_SIDE] + v.kinds[KW_KIND_SIDES], 2); /* the writer took its queue once */
    for (uint64_t i = 0; i < v.n; i++)
        if (v.r[i].kind == KW_KIND_SIDES)
            ck_assert_uint_eq(v.r[i].flags, 0); /* the keys are the transactions' flags */
    dir_view_free(&v);

    w_reset(w, true);
    w_open(w, &d, false);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 2);
    ck_assert_uint_eq(info.side_txns, N);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h2);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 15);
    ck_assert_int_eq(get_i64(w->rt, a[1], w->MONEY), m1 + 15);
    keel_ticket *again = NULL;
    ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x[2], KEEL_DURABLE_IMMEDIATE, &again));
    w_drive(w, 3);
    ck_assert_rc(keel_ticket_wait(again, -1), KEEL_EALREADY);
    keel_ticket_release(again);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 15);
    w_close(w);
    free(w);
}
END_TEST

/* A retried idempotency key is answered KEEL_EALREADY as the commit that
 * holds the key is acknowledged: IMMEDIATE, only once that commit is
 * durable. While the writer is held, the retry's ticket has not completed
 * either; released, it completes with KEEL_EALREADY (its durable step too).
 * A retry whose original never becomes durable (the writer's commit fails:
 * the runtime latches) gets KEEL_EFATAL, not KEEL_EALREADY; reopened, the
 * key is free and the transfer absent. */
START_TEST(test_idempotent_retry_waits_for_the_original)
{
    char dir[256];
    holder h;
    keel_runtime_desc d;
    wworld *w = held_world(dir, "retry", &h, &d);
    w_drive(w, 1);
    ck_assert_ok(keel_flush(w->rt));
    keel_entity a[8];
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    int64_t m0 = get_i64(w->rt, a[0], w->MONEY);
    keyed_xfer x = {{a[0], a[1], 7, w->MONEY}, 0xabcull}, y = {{a[0], a[1], 9, w->MONEY}, 0xdefull};
    keel_ticket *first, *retry;
    holder_hold(&h);
    ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x, KEEL_DURABLE_IMMEDIATE, &first));
    ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x, KEEL_DURABLE_IMMEDIATE, &retry));
    w_drive(w, 2);
    ck_assert_rc(keel_ticket_wait(first, 0), KEEL_ETIMEDOUT);
    ck_assert_rc(keel_ticket_wait(retry, 0), KEEL_ETIMEDOUT); /* not "already" before the original is on disk */
    holder_release(&h);
    ck_assert_ok(keel_ticket_wait(first, -1));
    ck_assert_rc(keel_ticket_wait(retry, -1), KEEL_EALREADY);
    ck_assert_rc(keel_ticket_wait_durable(retry, -1), KEEL_EALREADY);
    keel_ticket_release(first);
    keel_ticket_release(retry);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 7);

    /* the key's record on disk, an unrelated commit logged after it held by the writer: the retry waits for
       the key's record only, so it is answered within the tick */
    holder h3;
    keel_ticket *other;
    keyed_xfer z = {{a[0], a[1], 1, w->MONEY}, 0x123ull};
    holder_fork(&h3, dir);
    holder_hold(&h3);
    ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &z, KEEL_DURABLE_IMMEDIATE, &other));
    ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x, KEEL_DURABLE_IMMEDIATE, &retry));
    w_drive(w, 3);
    ck_assert_rc(keel_ticket_wait(retry, 0), KEEL_EALREADY);
    ck_assert_rc(keel_ticket_wait(other, 0), KEEL_ETIMEDOUT);
    holder_release(&h3);
    ck_assert_ok(keel_ticket_wait(other, -1));
    keel_ticket_release(other);
    keel_ticket_release(retry);
    ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 8);

    if (keel_failpoints_compiled()) { /* the original never durable: the retry is no "already" */
        holder h2;
        holder_fork(&h2, dir);
        holder_hold(&h2);
        ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &y, KEEL_DURABLE_IMMEDIATE, &first));
        ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &y, KEEL_DURABLE_IMMEDIATE, &retry));
        w_drive(w, 4);
        ck_assert_ok(keel_failpoints_set("wal.before_commit=eio@1"));
        holder_release(&h2);
        ck_assert_rc(keel_ticket_wait(first, -1), KEEL_EFATAL);
        ck_assert_rc(keel_ticket_wait(retry, -1), KEEL_EFATAL);
        ck_assert_ok(keel_failpoints_set(""));
        keel_ticket_release(first);
        keel_ticket_release(retry);
        (void)w_close(w);
        w_reset(w, true);
        w_open(w, &d, false);
        keel_recovery info;
        ck_assert_ok(keel_runtime_recover(w->rt, &info));
        ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 8);
        ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &y, KEEL_DURABLE_IMMEDIATE, &first));
        w_drive(w, info.tick + 1);
        ck_assert_ok(keel_ticket_wait(first, -1)); /* the key is free: it never was durable */
        keel_ticket_release(first);
        ck_assert_int_eq(get_i64(w->rt, a[0], w->MONEY), m0 - 17);
        /* a key recovered from the log: on disk, so a retry is "already" at once */
        ck_assert_ok(keel_submit(w->rt, closure_keyed_xfer, &x, KEEL_DURABLE_IMMEDIATE, &retry));
        w_drive(w, info.tick + 2);
        ck_assert_rc(keel_ticket_wait(retry, 0), KEEL_EALREADY);
        keel_ticket_release(retry);
    }
    (void)w_close(w);
    free(w);
}
END_TEST

/* ---- a side write that a later system undoes ------------------------------------------------ */

/* UNDO_N entities with x (i64, VERSIONED) = 0 in 16-row chunks, spawned by
 * on_first_tick. In a tick, two closures (Engine-Pre) set x = 5 on some of
 * them in side transactions (one row twice), and the system `undo`, which
 * runs after them, sets every 5 back to 0 and entity 5's x to the tick:
 * the rows the closures wrote end the tick where they started, so the
 * capture's comparison with the tick-start values finds only entity 5
 * changed, while the SIDE records (x = 5) are in the log before the tick's. */
#define UNDO_N 40

typedef struct undo_world {
    keel_component x;
    keel_query *q;
    keel_entity e[UNDO_N];
    uint64_t tick;
} undo_world;

static int undo_hook(keel_ctx *ctx, void *user)
{
    undo_world *u = user;
    int64_t zero = 0;
    keel_init init = {u->x, &zero};
    for (int i = 0; i < UNDO_N; i++) {
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), &init, 1);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

static const int undo_first[] = {0, 3, 17, 33}, undo_second[] = {17, 20};

static int set_five(keel_side_txn *tx, const undo_world *u, const int *which, size_t n)
{
    int64_t five = 5;
    int rc = KEEL_OK;
    for (size_t i = 0; !rc && i < n; i++)
        rc = keel_side_set(tx, u->e[which[i]], u->x, &five);
    return rc;
}

static int set_five_first(keel_side_txn *tx, void *arg)
{
    return set_five(tx, arg, undo_first, sizeof undo_first / sizeof *undo_first);
}

static int set_five_second(keel_side_txn *tx, void *arg)
{
    return set_five(tx, arg, undo_second, sizeof undo_second / sizeof *undo_second);
}

static int undo_sys(keel_ctx *ctx, void *user)
{
    undo_world *u = user;
    int rc = KEEL_OK;
    for (int i = 0; !rc && u->e[0] && i < UNDO_N; i++) {
        int64_t v;
        rc = keel_txn_get(ctx, u->e[i], u->x, &v);
        if (!rc && (v == 5 || i == 5)) {
            v = i == 5 ? (int64_t)u->tick : 0;
            rc = keel_txn_set(ctx, u->e[i], u->x, &v);
        }
    }
    return rc;
}

/* A runtime on dir (mode) whose on_first_tick spawns u's entities and whose
 * one callback system `name` runs `run` (user u), writing x (side_writes:
 * in side transactions only). */
static keel_runtime *undo_open_with(const char *dir, undo_world *u, keel_durability mode, const char *name,
                                    keel_system_fn run, bool side_writes)
{
    keel_runtime_desc d = desc_dir(dir, 1, 16, mode);
    d.on_first_tick = undo_hook;
    d.hook_user = u;
    keel_runtime *rt = tu_rt_new(d);
    u->x = reg_i64(rt, "x", KEEL_VERSIONED);
    ck_assert_ok(keel_query_create(keel_runtime_world(rt), &(keel_query_desc){.with = {u->x}}, &u->q));
    keel_schedule *s;
    ck_assert_ok(keel_schedule_create(rt, &s));
    keel_system_desc sd = {.name = name, .kind = KEEL_SYSTEM_CALLBACK, .run = run, .user = u,
                           .access = side_writes ? (keel_access){.side_writes = {u->x}}
                                                 : (keel_access){.writes = {u->x}}};
    ck_assert_ok(keel_schedule_add_system(s, &sd, NULL));
    tu_install(rt, s);
    return rt;
}

static keel_runtime *undo_open(const char *dir, undo_world *u)
{
    return undo_open_with(dir, u, KEEL_DURABLE_IMMEDIATE, "undo", undo_sys, false);
}

static int64_t undo_x(keel_runtime *rt, const undo_world *u, int i)
{
    int64_t v = -1;
    ck_assert_ok(keel_get(keel_runtime_world(rt), u->e[i], u->x, &v));
    return v;
}

/* The tick's records must set the rows back to 0 after the SIDE records:
 * recovered, the world is the live one (every x 0 but entity 5's), not
 * the side transactions' 5s. */
START_TEST(test_side_write_undone_by_a_later_system)
{
    char dir[256];
    tu_path(dir, sizeof dir, "undo");
    static undo_world u;
    u = (undo_world){0};
    keel_runtime *rt = undo_open(dir, &u);
    ck_assert_ok(keel_runtime_recover(rt, NULL));
    ck_assert_ok(keel_runtime_step(rt)); /* tick 1: the hook spawns them */
    ck_assert_uint_eq(query_entities(u.q, u.e, UNDO_N), UNDO_N);
    keel_ticket *tk[2] = {NULL, NULL};
    ck_assert_ok(keel_submit(rt, set_five_first, &u, KEEL_DURABLE_IMMEDIATE, &tk[0]));
    ck_assert_ok(keel_submit(rt, set_five_second, &u, KEEL_DURABLE_IMMEDIATE, &tk[1]));
    u.tick = 2;
    ck_assert_ok(keel_runtime_step(rt)); /* tick 2: 5s by the closures, back to 0 by undo */
    for (int k = 0; k < 2; k++) {
        ck_assert_ok(keel_ticket_wait(tk[k], -1));
        keel_ticket_release(tk[k]);
    }
    for (int i = 0; i < UNDO_N; i++)
        ck_assert_int_eq(undo_x(rt, &u, i), i == 5 ? 2 : 0);
    uint64_t hash = keel_world_hash(keel_runtime_world(rt));
    keel_query_destroy(u.q);
    ck_assert_ok(keel_runtime_close(rt));

    keel_entity e[UNDO_N];
    memcpy(e, u.e, sizeof e);
    u = (undo_world){0};
    rt = undo_open(dir, &u);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(rt, &info));
    ck_assert_uint_eq(info.tick, 2);
    ck_assert_uint_eq(info.side_txns, 2);
    memcpy(u.e, e, sizeof e);
    for (int i = 0; i < UNDO_N; i++)
        ck_assert_msg(undo_x(rt, &u, i) == (i == 5 ? 2 : 0), "entity %d: x = %lld", i, (long long)undo_x(rt, &u, i));
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), hash);
    keel_query_destroy(u.q);
    ck_assert_ok(keel_runtime_close(rt));
}
END_TEST

/* keel_side_txn_commit_async of a key whose commit is not durable yet: at
 * tick 2 a system commits key 91 (IMMEDIATE) and the same key again, each
 * through commit_async, while a holder stalls the WAL writer. The retry's
 * ticket is pending as long as the first is, then completes with
 * KEEL_EALREADY; the value is written once. */
typedef struct keyed_async {
    keel_ticket *t[2];
    int rc[2];
} keyed_async;
static keyed_async g_ka;

static int keyed_twice(keel_ctx *ctx, void *user)
{
    undo_world *u = user;
    if (keel_ctx_tick(ctx) != 2)
        return KEEL_OK;
    for (int k = 0; k < 2; k++) {
        keel_side_txn *tx = NULL;
        int64_t v = 0;
        int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx);
        rc = rc ? rc : keel_side_txn_set_key(tx, 91);
        rc = rc ? rc : keel_side_get(tx, u->e[0], u->x, &v);
        v += 10;
        rc = rc ? rc : keel_side_set(tx, u->e[0], u->x, &v);
        g_ka.rc[k] = rc ? rc : keel_side_txn_commit_async(tx, &g_ka.t[k]);
    }
    return KEEL_OK;
}

START_TEST(test_idempotent_retry_async_waits_for_the_original)
{
    char dir[256];
    tu_path(dir, sizeof dir, "retry-async");
    holder h;
    holder_fork(&h, dir);
    static undo_world u;
    u = (undo_world){0};
    g_ka = (keyed_async){0};
    keel_runtime *rt = undo_open_with(dir, &u, KEEL_DURABLE_GROUP, "keyed_twice", keyed_twice, true);
    ck_assert_ok(keel_runtime_recover(rt, NULL));
    ck_assert_ok(keel_runtime_step(rt));
    ck_assert_ok(keel_flush(rt));
    ck_assert_uint_eq(query_entities(u.q, u.e, UNDO_N), UNDO_N);
    holder_hold(&h);
    ck_assert_ok(keel_runtime_step(rt)); /* tick 2: GROUP, so the step does not wait for the writer */
    ck_assert_ok(g_ka.rc[0]);
    ck_assert_ok(g_ka.rc[1]); /* a ticket, whose result is KEEL_EALREADY */
    ck_assert_rc(keel_ticket_wait(g_ka.t[0], 0), KEEL_ETIMEDOUT);
    ck_assert_rc(keel_ticket_wait(g_ka.t[1], 0), KEEL_ETIMEDOUT); /* not "already" before the original is on disk */
    holder_release(&h);
    ck_assert_ok(keel_ticket_wait(g_ka.t[0], -1));
    ck_assert_rc(keel_ticket_wait(g_ka.t[1], -1), KEEL_EALREADY);
    ck_assert_rc(keel_ticket_wait_durable(g_ka.t[1], -1), KEEL_EALREADY);
    ck_assert_uint_eq(keel_ticket_lsn(g_ka.t[1]), 0); /* it logged nothing */
    for (int k = 0; k < 2; k++)
        keel_ticket_release(g_ka.t[k]);
    int64_t v = -1;
    ck_assert_ok(keel_get(keel_runtime_world(rt), u.e[0], u.x, &v));
    ck_assert_int_eq(v, 10);
    keel_query_destroy(u.q);
    ck_assert_ok(keel_runtime_close(rt));
}
END_TEST

/* ---- steps marked for the checkpoint thread ------------------------------------------------ */

/* The checkpoint thread serialises between steps: the runtime counts every
 * step's start and end (odd while one runs), also of a step it refuses. A
 * count left odd would make every checkpoint record wait (docs/durability.md,
 * "Checkpoints"). */
/* ---- the fence between ticks ------------------------------------------------------- */

#define BG_N 300

typedef struct bg_world {
    keel_component x;
} bg_world;

static int bg_hook(keel_ctx *ctx, void *user)
{
    bg_world *b = user;
    for (int64_t i = 0; i < BG_N; i++) {
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), (keel_init[]){{b->x, &i}}, 1);
        if (rc)
            return rc;
    }
    return KEEL_OK;
}

static int bg_bump(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    int64_t *x = KEEL_COLUMN(it, int64_t, 0);
    for (uint32_t i = 0; i < it->count; i++)
        x[i]++;
    return KEEL_OK;
}

/* BG_N entities (x = i, spawned by on_first_tick); a parallel query system
 * adds 1 to every x each tick. */
static keel_runtime *bg_open(const char *dir, bg_world *b, int32_t workers, keel_durability mode)
{
    keel_runtime_desc d = desc_dir(dir, workers, 16, mode);
    d.on_first_tick = bg_hook;
    d.hook_user = b;
    keel_runtime *rt = tu_rt_new(d);
    b->x = reg_i64(rt, "x", KEEL_VERSIONED);
    keel_schedule *s;
    ck_assert_ok(keel_schedule_create(rt, &s));
    keel_system_desc sd = {.name = "bump", .kind = KEEL_SYSTEM_QUERY, .each_chunk = bg_bump, .parallel = true,
                           .min_chunk_rows = 16, .query = {.with = {b->x}}, .access = {.writes = {b->x}}};
    ck_assert_ok(keel_schedule_add_system(s, &sd, NULL));
    tu_install(rt, s);
    ck_assert_ok(keel_runtime_recover(rt, NULL));
    return rt;
}

/* With GROUP durability on two workers a step returns with its tick's
 * records still being built (posted; with failpoints compiled in,
 * fence.after_compress holds the worker that finishes them for 300 ms, so
 * what follows happens while they are pending): keel_flush waits for them,
 * reading the tick's telemetry completes its record, the WAL holds the
 * tick's unit whole under the LSNs handed out at the step, a checkpoint
 * taken while a unit is pending follows it, and reopens recover the same
 * world. With IMMEDIATE durability, or one worker, the fence runs on the
 * tick. */
START_TEST(test_fence_between_ticks)
{
    static const struct {
        const char *name;
        int32_t workers;
        keel_durability mode;
        bool posted;
    } v[] = {{"bg-group", 2, KEEL_DURABLE_GROUP, true},
             {"bg-immediate", 2, KEEL_DURABLE_IMMEDIATE, false},
             {"bg-one-worker", 1, KEEL_DURABLE_GROUP, false}};
    bool fp = keel_failpoints_compiled();
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        char dir[256];
        tu_path(dir, sizeof dir, v[k].name);
        static bg_world b;
        keel_runtime *rt = bg_open(dir, &b, v[k].workers, v[k].mode);
        ck_assert_ok(keel_runtime_step(rt)); /* tick 1: the hook's unit, then the tick's */
        ck_assert_ok(keel_runtime_step(rt)); /* joins tick 1's */
        if (fp)
            ck_assert_ok(keel_failpoints_set("fence.after_compress=delay:300"));
        ck_assert_ok(keel_runtime_step(rt)); /* tick 3 */
        ck_assert_int_eq(fence_posted(rt->dur), v[k].posted);
        uint64_t marker = atomic_load(&rt->dur->tick_lsn);
        ck_assert_uint_eq(dur_last_lsn(rt->dur), marker); /* its LSNs are handed out already */
        ck_assert_ok(keel_flush(rt));
        ck_assert_uint_ge(keel_durable_lsn(rt), marker);
        ck_assert(fence_posted(rt->dur) == v[k].posted); /* keel_flush waited without joining */
        keel_tick_record rec;
        ck_assert_ok(keel_telemetry_tick(rt, 3, &rec)); /* joins */
        ck_assert(!fence_posted(rt->dur));
        ck_assert_uint_gt(rec.wal_stored_bytes, 0);
        ck_assert_uint_gt(rec.wal_raw_bytes, BG_N * 16);
        ck_assert_uint_gt(rec.fence_ns, 0);
        ck_assert_ok(keel_runtime_step(rt)); /* tick 4 (held too) */
        uint64_t hash = keel_world_hash(keel_runtime_world(rt));
        ck_assert_ok(keel_runtime_close(rt)); /* joins tick 4's */

        /* tick 3's unit: TICK_CHUNK records, then its marker, at consecutive LSNs ending at `marker` */
        tu_wal_reader rd;
        tu_wal_open(&rd, dir, 0);
        uint64_t lsn, prev = 0, first3 = 0, last3 = 0, chunks3 = 0;
        const void *r;
        size_t len;
        while (kw_wal_next(rd.it, &lsn, &r, &len) == 1) {
            kw_header h;
            ck_assert_ok(kw_record_check(r, len, &h));
            ck_assert_uint_eq(h.lsn, lsn);
            ck_assert_uint_eq(lsn, prev + 1);
            prev = lsn;
            if (h.tick != 3 || (h.flags & KW_FLAG_HOOK))
                continue;
            first3 = first3 ? first3 : lsn;
            last3 = lsn;
            chunks3 += h.kind == KW_KIND_TICK_CHUNK;
            ck_assert(h.kind == KW_KIND_TICK_CHUNK || h.kind == KW_KIND_TICK_COMMIT);
        }
        tu_wal_close(&rd);
        ck_assert_uint_eq(last3, marker);
        ck_assert_uint_ge(chunks3, 1);
        ck_assert_uint_eq(last3 - first3, chunks3);

        rt = bg_open(dir, &b, v[k].workers, v[k].mode);
        ck_assert_uint_eq(keel_runtime_tick(rt), 4);
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), hash);
        ck_assert_ok(keel_runtime_step(rt)); /* tick 5, held */
        ck_assert_int_eq(fence_posted(rt->dur), v[k].posted);
        ck_assert_ok(keel_checkpoint(rt)); /* covers tick 5: recorded after its records */
        ck_assert_ok(keel_flush(rt));
        ck_assert_uint_ge(keel_durable_lsn(rt), atomic_load(&rt->dur->tick_lsn));
        if (fp)
            ck_assert_ok(keel_failpoints_set(NULL));
        hash = keel_world_hash(keel_runtime_world(rt));
        ck_assert_ok(keel_runtime_close(rt));
        rt = bg_open(dir, &b, v[k].workers, v[k].mode);
        ck_assert_uint_eq(keel_runtime_tick(rt), 5);
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(rt)), hash);
        ck_assert_ok(keel_runtime_close(rt));
    }
}
END_TEST

START_TEST(test_steps_are_marked_for_the_checkpoint_thread)
{
    char dir[256];
    tu_path(dir, sizeof dir, "step-marks");
    keel_runtime_desc d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    d.durable.checkpoint_every_ticks = 2;
    wworld *w = w_new(true);
    w_open(w, &d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    uint64_t seq0 = atomic_load(&w->rt->dur->step_seq);
    w_drive(w, 1);
    w_drive(w, 2);
    w_drive(w, 3);
    ck_assert_uint_eq(atomic_load(&w->rt->dur->step_seq), seq0 + 6);
    ck_assert_ok(keel_checkpoint(w->rt)); /* waits for the periodic one in progress, then takes its own */
    ck_assert_uint_ge(tu_stats(w->rt).checkpoints, 2);
    dur_latch_fatal(w->rt->dur, KEEL_EIO);
    ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL); /* refused */
    ck_assert_uint_eq(atomic_load(&w->rt->dur->step_seq), seq0 + 8);
    (void)w_close(w);
    free(w);
}
END_TEST

/* ---- idle ticks around a checkpoint ------------------------------------------------- */

/* Wait until the WAL writer has taken everything queued: it is then in its
 * LMDB write transaction, where a holder keeps it, and takes nothing more
 * until the holder lets go. The deadline only turns a writer that never
 * comes into a failure instead of a hang. */
static void wait_writer_took_queue(keel_runtime *rt)
{
    dur_state *d = rt->dur;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        bool taken = d->head == NULL;
        pthread_mutex_unlock(&d->mu);
        if (taken)
            return;
        clock_gettime(CLOCK_MONOTONIC, &now);
        ck_assert_msg(now.tv_sec - t0.tv_sec < 60, "the WAL writer did not take its queue");
        sched_yield();
    }
}

/* The writer queue holds the marker of `tick` with no checkpoint ahead of
 * it: the checkpoint thread had not queued its record when the tick's
 * marker was queued. */
static bool tick_marker_before_checkpoint(keel_runtime *rt, uint64_t tick)
{
    dur_state *d = rt->dur;
    bool found = false;
    pthread_mutex_lock(&d->mu);
    for (dur_item *it = d->head; it && it->kind != DUR_CHECKPOINT && !found; it = it->next)
        found = it->kind == DUR_RECORDS && it->tick == tick;
    pthread_mutex_unlock(&d->mu);
    return found;
}

/* Ticks that change nothing, a checkpoint every 3 ticks, and a WAL writer
 * held up (a child process holds the LMDB write lock) so that the idle
 * ticks' markers wait in the queue: tick 2's marker is in the writer's
 * blocked transaction, tick 3's is queued and the checkpoint taken at the
 * end of tick 3 covers it, then tick 4 runs before the checkpoint thread
 * queues its record (the test holds the checkpoint pin's mutex, which the
 * checkpoint thread takes once it has read the checkpoint, before it
 * queues its record; an idle tick never takes it). Flushed, closed and
 * reopened, the runtime is at tick 4, the tick keel_runtime_tick said
 * before the close. (Tick 4's marker once coalesced into tick 3's, which
 * the checkpoint covers and deletes: the recovered tick went back to 3.) */
START_TEST(test_idle_ticks_checkpoint)
{
    char dir[256];
    tu_path(dir, sizeof dir, "idle-ckpt");
    holder h;
    holder_fork(&h, dir);
    keel_runtime_desc d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    d.durable.checkpoint_every_ticks = 3;
    iworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    i_open(w, &d);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    i_step(w); /* tick 1: 200 spawns */
    ck_assert_ok(keel_flush(w->rt));
    ck_assert_uint_eq(tu_stats(w->rt).checkpoints, 0);
    holder_hold(&h);
    i_step(w); /* tick 2, idle: the writer takes its marker and blocks in LMDB */
    wait_writer_took_queue(w->rt);
    dur_state *ds = w->rt->dur;
    pthread_mutex_lock(&ds->pin_mu);
    i_step(w); /* tick 3, idle: its marker waits in the queue; the due checkpoint covers it */
    i_step(w); /* tick 4, idle */
    bool held_off = tick_marker_before_checkpoint(w->rt, 4);
    pthread_mutex_unlock(&ds->pin_mu);
    ck_assert_msg(held_off, "the checkpoint's record was queued before tick 4's marker: the scenario is not set up");
    holder_release(&h);
    ck_assert_ok(keel_flush(w->rt));
    uint64_t tick = keel_runtime_tick(w->rt), hash = keel_world_hash(keel_runtime_world(w->rt));
    ck_assert_uint_eq(tick, 4);
    keel_runtime_close(w->rt);

    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.has_ckpt);
    ck_assert_uint_eq(v.ckpt.tick, 3);
    ck_assert_uint_eq(v.ckpt.count, 1);
    ck_assert(v.consecutive);
    dir_view_free(&v);
    i_open(w, &d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.checkpoint_tick, 3);
    ck_assert_msg(info.tick == tick && keel_runtime_tick(w->rt) == tick,
                  "keel_runtime_tick was %llu before the close, the reopened runtime is at tick %llu "
                  "(keel_recovery.tick %llu)", (unsigned long long)tick,
                  (unsigned long long)keel_runtime_tick(w->rt), (unsigned long long)info.tick);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), hash);
    i_step(w);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), tick + 1);
    keel_runtime_close(w->rt);
    free(w);
}
END_TEST

/* ==== dur_recovery =================================================================== */

/* The raw payload of the WAL record at lsn of dir (malloc'd, one spare byte
 * at its end) and its header. */
static unsigned char *record_raw(const char *dir, uint64_t lsn, kw_header *h)
{
    size_t len = 0;
    unsigned char *rec = tu_record_copy(dir, lsn, &len);
    ck_assert_ok(kw_record_check(rec, len, h));
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    const void *p;
    ck_assert_ok(kw_record_payload(c, rec, h, &p));
    unsigned char *raw = malloc((size_t)h->raw_len + 1);
    ck_assert_ptr_nonnull(raw);
    memcpy(raw, p, h->raw_len);
    kw_codec_destroy(c);
    free(rec);
    return raw;
}

/* Store raw (len bytes) as the record at lsn of dir, with h's kind, tick
 * and flags, through every check of the record layer. */
static void record_put_raw(const char *dir, uint64_t lsn, const kw_header *h, const void *raw, size_t len)
{
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    kw_buf out = {0};
    ck_assert_ok(kw_record_build(c, &out, h->kind, lsn, h->tick, h->flags, raw, len));
    kw_header nh;
    ck_assert_ok(kw_record_check(out.p, out.len, &nh));
    ck_assert_uint_eq(nh.lsn, lsn);
    ck_assert_uint_eq(nh.kind, h->kind);
    tu_wal_put(dir, lsn, out.p, out.len);
    kw_buf_free(&out);
    kw_codec_destroy(c);
}

/* Replace the WAL record at lsn by one that passes every check of the
 * record layer (magic, lengths, CRC) but whose payload does not decode:
 * its real payload and one trailing byte, as a bug writing records (not
 * the disk) would leave it. */
static void rewrite_undecodable(const char *dir, uint64_t lsn)
{
    kw_header h;
    unsigned char *bad = record_raw(dir, lsn, &h);
    bad[h.raw_len] = 0xee;
    /* the premise: the payload does not decode */
    kw_decoder dec;
    kw_change ch;
    int rc = kw_decode_begin(&dec, h.kind, lsn, bad, (size_t)h.raw_len + 1, NULL);
    while (rc == KEEL_OK && (rc = kw_decode_next(&dec, &ch)) == 1)
        rc = KEEL_OK;
    ck_assert_rc(rc, KEEL_ECORRUPT);
    record_put_raw(dir, lsn, &h, bad, (size_t)h.raw_len + 1);
    free(bad);
}

/* Rewrite the WAL record at lsn (a TICK_CHUNK) with row `row` of its first
 * group naming entity e instead: a record every check of the record layer
 * and the decoder accepts, whose row cannot apply. The first group's
 * component goes to *comp. */
static void rewrite_row_entity(const char *dir, uint64_t lsn, uint32_t row, keel_entity e, keel_component *comp)
{
    kw_header h;
    unsigned char *raw = record_raw(dir, lsn, &h);
    ck_assert_uint_eq(h.kind, KW_KIND_TICK_CHUNK);
    uint32_t c0, size, n;
    kw_group_header_get(raw + 4, &c0, &size, &n);
    ck_assert_uint_gt(n, row);
    memcpy(raw + 4 + KW_GROUP_HDR + (size_t)row * 8, &e, 8);
    *comp = c0;
    record_put_raw(dir, lsn, &h, raw, h.raw_len);
    free(raw);
}

/* One group of one row (entity e, value: size bytes, zeros when NULL) in
 * the TICK_CHUNK layout at q; returns the byte after it. */
static unsigned char *put_row_group(unsigned char *q, keel_component c, uint32_t size, keel_entity e, const void *v)
{
    kw_group_header_put(q, c, size, 1);
    memcpy(q + KW_GROUP_HDR, &e, 8);
    if (v)
        memcpy(q + KW_GROUP_HDR + 8, v, size);
    return q + KW_GROUP_HDR + 8 + size;
}

/* Replace the TICK_CHUNK record at lsn by groups of one row each: with
 * `first`, its first group's first row, then a row of component c (size
 * zero bytes) for the same entity -- replay resolves the second group's
 * handles from the first's (world/restore.c, the memo); without, only the
 * row of c, for entity e. */
static void rewrite_row_groups(const char *dir, uint64_t lsn, bool first, keel_component c, uint32_t size,
                               keel_entity e)
{
    kw_header h;
    unsigned char *raw = record_raw(dir, lsn, &h);
    ck_assert_uint_eq(h.kind, KW_KIND_TICK_CHUNK);
    uint32_t c0, size0, n;
    kw_group_header_get(raw + 4, &c0, &size0, &n);
    ck_assert_uint_ge(n, 1);
    unsigned char *out = calloc(1, 4 + 2 * (KW_GROUP_HDR + 8) + size0 + size), *q = out + 4;
    ck_assert_ptr_nonnull(out);
    uint32_t groups = first ? 2 : 1;
    memcpy(out, &groups, 4);
    if (first) {
        memcpy(&e, raw + 4 + KW_GROUP_HDR, 8);
        q = put_row_group(q, c0, size0, e, raw + 4 + KW_GROUP_HDR + (size_t)n * 8);
    }
    q = put_row_group(q, c, size, e, NULL);
    record_put_raw(dir, lsn, &h, out, (size_t)(q - out));
    free(out);
    free(raw);
}

/* Reopen dir (w reset to the flavour without side transactions): the open
 * must be refused with KEEL_ECORRUPT at tick 0, and the directory must be
 * left as it was; the refusal's sentence goes to msg. */
static void open_refused_untouched(wworld *w, const keel_runtime_desc *d, const char *dir, char *msg, size_t cap)
{
    tu_digest d1 = dir_digest(dir);
    w_reset(w, true);
    w_open(w, d, false);
    ck_assert_rc(keel_runtime_recover(w->rt, NULL), KEEL_ECORRUPT);
    snprintf(msg, cap, "%s", keel_last_error());
    ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
    w_close(w);
    tu_assert_digest_eq(d1, dir_digest(dir));
}

/* A world of the default flavour in a new directory `name` (into dir, cap
 * bytes; *d its description), driven through ticks 1-4 and checkpointed,
 * left open. */
static wworld *checkpointed_world(char *dir, size_t cap, const char *name, keel_runtime_desc *d)
{
    tu_path(dir, cap, name);
    *d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    wworld *w = w_new(true);
    w_open(w, d, false);
    for (uint64_t t = 1; t <= 4; t++)
        w_drive(w, t);
    ck_assert_ok(keel_checkpoint(w->rt));
    return w;
}

/* Reopen dir (w reset) under max_entities = cap: the open is refused with
 * KEEL_ENOSPC naming the maximum (and `also`, when given), the world then
 * holding `refused_live` entities (-1: not checked), the directory as it
 * was; reopened under d it recovers to tick, live entities and hash. */
static void refused_under_cap(wworld *w, const keel_runtime_desc *d, const char *dir, uint32_t cap, const char *also,
                              int64_t refused_live, uint64_t tick, uint32_t live, uint64_t hash)
{
    tu_digest d1 = dir_digest(dir);
    keel_runtime_desc small = *d;
    small.world.max_entities = cap;
    w_reset(w, true);
    w_open(w, &small, false);
    ck_assert_rc(keel_runtime_recover(w->rt, NULL), KEEL_ENOSPC);
    char want[64];
    snprintf(want, sizeof want, "maximum of %u live entities", cap);
    ck_assert_msg(strstr(keel_last_error(), want) && (!also || strstr(keel_last_error(), also)), "%s",
                  keel_last_error());
    if (refused_live >= 0)
        ck_assert_uint_eq(keel_world_count(keel_runtime_world(w->rt)), (uint64_t)refused_live);
    w_close(w);
    tu_assert_digest_eq(d1, dir_digest(dir));

    w_reset(w, true);
    w_open(w, d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    ck_assert_uint_eq(keel_runtime_tick(w->rt), tick);
    ck_assert_uint_eq(keel_world_count(keel_runtime_world(w->rt)), live);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), hash);
    w_close(w);
}

/* A checkpoint of more entity slots than the reopening world's
 * max_entities is refused with KEEL_ENOSPC naming the maximum, and the
 * directory stays as it was; the same directory then recovers into a world
 * without the limit, to the state it held. */
START_TEST(test_checkpoint_over_max_entities)
{
    char dir[256];
    keel_runtime_desc d;
    wworld *w = checkpointed_world(dir, sizeof dir, "ckpt-max-entities", &d);
    uint32_t live = keel_world_count(keel_runtime_world(w->rt));
    uint64_t hash = keel_world_hash(keel_runtime_world(w->rt)), tick = keel_runtime_tick(w->rt);
    ck_assert_uint_gt(live, 2);
    w_close(w);
    refused_under_cap(w, &d, dir, live - 1, NULL, 0, tick, live, hash);
    free(w);
}
END_TEST

/* WAL spawns past the reopening world's max_entities (at least the
 * checkpoint's slots): recovery loads the checkpoint, then refuses the
 * spawn with KEEL_ENOSPC naming the maximum (a cap is no damage: not
 * KEEL_ECORRUPT), the directory as it was; without the cap the same
 * directory recovers to the state it held. */
START_TEST(test_wal_over_max_entities)
{
    char dir[256];
    keel_runtime_desc d;
    wworld *w = checkpointed_world(dir, sizeof dir, "wal-max-entities", &d);
    uint32_t slots = keel_runtime_world(w->rt)->nslots, most = 0;
    for (uint64_t t = 5; t <= 12; t++) {
        w_drive(w, t);
        uint32_t live = keel_world_count(keel_runtime_world(w->rt));
        most = live > most ? live : most;
    }
    ck_assert_ok(keel_flush(w->rt));
    uint32_t live = keel_world_count(keel_runtime_world(w->rt));
    uint64_t hash = keel_world_hash(keel_runtime_world(w->rt)), tick = keel_runtime_tick(w->rt);
    ck_assert_uint_gt(most, slots); /* the test's premise: the WAL goes past the cap */
    w_close(w);
    refused_under_cap(w, &d, dir, slots, "WAL record at LSN", -1, tick, live, hash);
    free(w);
}
END_TEST

/* A checkpoint chunk whose second row names its first row's entity again:
 * loading it finds that entity's slot taken, and the open is refused with
 * KEEL_ECORRUPT naming the entity, the directory untouched. */
START_TEST(test_checkpoint_row_refused)
{
    char dir[256];
    keel_runtime_desc d;
    wworld *w = checkpointed_world(dir, sizeof dir, "ckpt-dup-row", &d);
    w_close(w);

    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.has_ckpt);
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    bool done = false;
    for (uint32_t i = 0; i < v.nsnap && !done; i++) {
        if (v.snap[i].kind != KW_KIND_SNAP_CHUNK)
            continue;
        tu_wal_reader rd;
        tu_wal_open(&rd, dir, 0);
        const void *val, *p;
        size_t vlen, plen;
        ck_assert_ok(kw_get(rd.r, KW_DB_SNAP, v.snap[i].key, v.snap[i].klen, &val, &vlen));
        kw_header h;
        ck_assert_ok(kw_record_check(val, vlen, &h));
        ck_assert_ok(kw_snap_payload(c, val, vlen, KW_KIND_SNAP_CHUNK, &p, &plen));
        unsigned char *raw = malloc(plen);
        ck_assert_ptr_nonnull(raw);
        memcpy(raw, p, plen);
        tu_wal_close(&rd);
        kw_snap_chunk k;
        ck_assert_ok(kw_snap_chunk_decode(raw, plen, &k));
        if (k.count >= 2) {
            size_t at = (size_t)(k.ents - raw);
            memcpy(raw + at + 8, raw + at, 8);
            kw_buf out = {0};
            ck_assert_ok(kw_record_build(c, &out, h.kind, h.lsn, h.tick, h.flags, raw, plen));
            tu_db_put(dir, KW_DB_SNAP, v.snap[i].key, v.snap[i].klen, out.p, out.len);
            kw_buf_free(&out);
            done = true;
        }
        free(raw);
    }
    kw_codec_destroy(c);
    dir_view_free(&v);
    ck_assert_msg(done, "no checkpoint chunk of two rows or more");

    char msg[1024];
    open_refused_untouched(w, &d, dir, msg, sizeof msg);
    ck_assert_msg(strstr(msg, "not a free slot") && strstr(msg, dir), "%s", msg);
    free(w);
}
END_TEST

/* A checkpoint whose table list claims more entity slots than its slot
 * pages hold -- one page more, or 2^32 - 256 -- is refused with
 * KEEL_ECORRUPT naming the shortfall and the directory, which stays
 * untouched; nothing the size of the claim is allocated first (outside
 * the sanitizers the huge claim runs under an address-space limit of
 * 2 GiB more than the process has, which a 16 GiB allocation breaks). */
START_TEST(test_checkpoint_slots_claim_refused)
{
    char dir[256];
    keel_runtime_desc d;
    wworld *w = checkpointed_world(dir, sizeof dir, "ckpt-slots-claim", &d);
    w_close(w);
    uint32_t held = tu_checkpoint_slots(dir, NULL), claim = held + 1024;
    tu_checkpoint_slots(dir, &claim);
    char msg[1024], want[96];
    open_refused_untouched(w, &d, dir, msg, sizeof msg);
    snprintf(want, sizeof want, "slot pages cover %u of its %u slots", held, claim);
    ck_assert_msg(strstr(msg, want) && strstr(msg, dir), "%s", msg);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    claim = UINT32_MAX - 256;
    tu_checkpoint_slots(dir, &claim);
    tu_digest d1 = dir_digest(dir);
    w_reset(w, true);
    w_open(w, &d, false);
    struct rlimit old, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = tu_vm_size() + (2ull << 30);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
    int rc = keel_runtime_recover(w->rt, NULL); /* nothing asserts under the limit */
    snprintf(msg, sizeof msg, "%s", keel_last_error());
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
    ck_assert_rc(rc, KEEL_ECORRUPT);
    snprintf(want, sizeof want, "slot pages cover %u of its %u slots", held, claim);
    ck_assert_msg(strstr(msg, want), "%s", msg);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
    w_close(w);
    tu_assert_digest_eq(d1, dir_digest(dir));
#endif
    tu_checkpoint_slots(dir, &held); /* as it was: the directory recovers */
    w_reset(w, true);
    w_open(w, &d, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    ck_assert_uint_eq(keel_runtime_tick(w->rt), 4);
    w_close(w);
    free(w);
}
END_TEST

/* A TICK_CHUNK whose row names a stale handle (variant 0), or a live
 * entity without the row's component (variant 1; variant 2: in a second
 * group with the first group's handles, which replay does not resolve
 * again; variant 3: a tag's row), decodes but does not apply: the open is
 * refused with KEEL_ECORRUPT naming the LSN, the row's fault and the
 * directory, and writes nothing. */
START_TEST(test_value_row_refused)
{
    static const char *const name[] = {"row-stale", "row-no-component", "row-no-component-memo", "row-no-tag"};
    for (int variant = 0; variant < 4; variant++) {
        char dir[256];
        tu_path(dir, sizeof dir, name[variant]);
        keel_runtime_desc d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
        wworld *w = w_new(true);
        w_open(w, &d, false);
        for (uint64_t t = 1; t <= 8; t++)
            w_drive(w, t);
        keel_entity acct[8];
        ck_assert_uint_ge(query_entities(w->q_money, acct, 8), 1);
        keel_component pos = w->POS;
        ck_assert_int_eq(keel_has(keel_runtime_world(w->rt), acct[0], pos), 0);
        w_close(w);

        dir_view v;
        dir_read(dir, &v);
        uint64_t bad = 0;
        for (uint64_t i = 0; i < v.n && !bad; i++)
            if (v.r[i].tick == 5 && v.r[i].kind == KW_KIND_TICK_CHUNK && !(v.r[i].flags & KW_FLAG_HOOK))
                bad = v.r[i].lsn;
        dir_view_free(&v);
        ck_assert_uint_ne(bad, 0);
        keel_component comp = 0;
        if (variant == 0) { /* the first row's handle, one generation on */
            kw_header h;
            unsigned char *raw = record_raw(dir, bad, &h);
            keel_entity e;
            memcpy(&e, raw + 4 + KW_GROUP_HDR, 8);
            free(raw);
            rewrite_row_entity(dir, bad, 0, e + (1ull << 32), &comp);
        } else if (variant == 1) {
            rewrite_row_entity(dir, bad, 0, acct[0], &comp);
            ck_assert_uint_eq(comp, pos); /* the account has no pos */
        } else if (variant == 2) {
            rewrite_row_groups(dir, bad, true, w->MONEY, 8, 0); /* a mover has no money */
        } else {
            rewrite_row_groups(dir, bad, false, w->FLAG, 0, acct[0]); /* an account has no flag */
        }
        char msg[1024];
        open_refused_untouched(w, &d, dir, msg, sizeof msg);
        ck_assert_msg(tu_names_lsn(msg, bad), "the error does not name LSN %llu: %s", (unsigned long long)bad, msg);
        ck_assert_msg(strstr(msg, "a value row does not apply") && strstr(msg, dir) &&
                      strstr(msg, variant ? "has no component" : "stale"), "%s", msg);
        free(w);
    }
}
END_TEST

/* A bad tick-5 record: the open is refused naming the LSN and changes
 * nothing; with truncate_bad_tail the record's whole unit and everything
 * after it go, nothing of that unit stays applied, and the state is the
 * reference's at tick 4 exactly. Variant 0 flips a byte of the unit's
 * first record (a TICK_CHUNK; every copy on disk), variant 1 of one in its
 * middle (a LIFECYCLE record, after the TICK_CHUNK records). Variant 2
 * rewrites that LIFECYCLE record with a valid CRC and a payload that does
 * not decode: only decoding finds it, after the unit's TICK_CHUNK records
 * checked fine (their rows were once applied before the unit was dropped,
 * leaving tick 5's values on the tick-4 state). */
START_TEST(test_corrupt_record)
{
    static wref ref;
    w_reference(&ref, 8, 1, true);
    /* variant 3 breaks the magic: the record is no record at all, and the
     * refusal must still name its LSN (from the key) */
    static const char *const names[4] = {"corrupt-chunk", "corrupt-life", "undecodable-life", "bad-magic"};
    for (int variant = 0; variant < 4; variant++) {
        bool life = variant == 1 || variant == 2;
        uint32_t kind = life ? KW_KIND_LIFECYCLE : KW_KIND_TICK_CHUNK;
        char dir[256], mdb[300];
        tu_path(dir, sizeof dir, names[variant]);
        mdb_path(mdb, sizeof mdb, dir);
        keel_runtime_desc d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
        wworld *w = w_new(true);
        w_open(w, &d, false);
        for (uint64_t t = 1; t <= 8; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        w_close(w);

        dir_view v;
        dir_read(dir, &v);
        ck_assert(v.consecutive);
        uint64_t bad = 0, unit_first = UINT64_MAX, last = v.r[v.n - 1].lsn;
        for (uint64_t i = 0; i < v.n; i++) {
            const rec_info *r = &v.r[i];
            if (r->tick != 5 || (r->flags & KW_FLAG_HOOK))
                continue;
            if (r->lsn < unit_first)
                unit_first = r->lsn;
            if (r->kind == kind && !bad)
                bad = r->lsn;
        }
        ck_assert_uint_ne(bad, 0);
        if (life) /* TICK_CHUNK records of the unit precede it */
            ck_assert_uint_gt(bad, unit_first);
        else
            ck_assert_uint_eq(bad, unit_first);
        uint64_t expect_trunc = last - unit_first + 1;
        dir_view_free(&v);
        if (variant != 2) {
            size_t len = 0;
            unsigned char *rec = tu_record_copy(dir, bad, &len);
            ck_assert_uint_gt(len, KW_HEADER_SIZE);
            uint32_t copies = tu_flip_copies(mdb, rec, len, variant == 3 ? 0 : KW_HEADER_SIZE + (len - KW_HEADER_SIZE) / 2);
            ck_assert_uint_ge(copies, 1);
            free(rec);
        } else {
            rewrite_undecodable(dir, bad);
        }
        tu_digest d1 = dir_digest(dir);

        /* refused by default */
        w_reset(w, true);
        w_open(w, &d, false);
        keel_recovery info;
        ck_assert_rc(keel_runtime_recover(w->rt, &info), KEEL_ECORRUPT);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", keel_last_error());
        ck_assert_msg(tu_names_lsn(msg, bad), "the error does not name LSN %llu: %s", (unsigned long long)bad, msg);
        ck_assert_msg(strstr(msg, dir) != NULL, "the error does not name the directory: %s", msg);
        ck_assert_rc(keel_runtime_recover(w->rt, NULL), KEEL_ECORRUPT); /* the same result again */
        ck_assert_str_eq(keel_last_error(), msg);
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_ECORRUPT);
        ck_assert_rc(keel_checkpoint(w->rt), KEEL_ECORRUPT);
        ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
        tu_assert_digest_eq(d1, dir_digest(dir));
        w_close(w);
        tu_assert_digest_eq(d1, dir_digest(dir));

        /* truncate_bad_tail: the bad unit and everything after it go */
        keel_runtime_desc dt = d;
        dt.durable.truncate_bad_tail = true;
        log_capture_on();
        w_reset(w, true);
        w_open(w, &dt, false);
        ck_assert_ok(keel_runtime_recover(w->rt, &info));
        ck_assert_uint_eq(info.truncated, expect_trunc);
        char field[64];
        snprintf(field, sizeof field, "from_lsn=%llu", (unsigned long long)unit_first);
        ck_assert_logged("wal/truncated", field);
        ck_assert_uint_eq(info.tick, 4);
        ck_assert_uint_eq(info.last_lsn, unit_first - 1);
        ck_assert(!info.fresh);
        uint64_t h4 = keel_world_hash(keel_runtime_world(w->rt));
        ck_assert_msg(h4 == ref.hash[4], "%s: after dropping tick 5's unit the hash is %016llx, the reference's at "
                      "tick 4 %016llx: part of the dropped unit stayed applied", names[variant],
                      (unsigned long long)h4, (unsigned long long)ref.hash[4]);
        w_expect(w, &ref, 4);
        for (uint64_t t = 5; t <= 8; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        w_close(w);
        dir_read(dir, &v); /* every record checks again */
        ck_assert(v.consecutive);
        ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, 5, false), 1);
        dir_view_free(&v);
        w_reset(w, true);
        w_open(w, &d, false);
        ck_assert_ok(keel_runtime_recover(w->rt, &info));
        ck_assert_uint_eq(info.tick, 8);
        ck_assert_uint_eq(info.truncated, 0);
        w_expect(w, &ref, 8);
        w_close(w);
        free(w);
    }
}
END_TEST

/* A record that checks and decodes but names a component the schema does
 * not have (a SIDE value row, variant 0, or a LIFECYCLE add closed by its
 * marker, variant 1): the open is refused with KEEL_ECORRUPT naming the
 * record's LSN and why. */
START_TEST(test_change_of_an_unknown_component)
{
    static wref ref;
    w_reference(&ref, 3, 1, true);
    static const char *const names[2] = {"unknown-side", "unknown-life"};
    for (int variant = 0; variant < 2; variant++) {
        char dir[256];
        keel_runtime_desc d = desc_named(dir, names[variant], KEEL_DURABLE_GROUP);
        wworld *w = w_new(true);
        w_open(w, &d, false);
        for (uint64_t t = 1; t <= 3; t++)
            w_drive(w, t);
        w_close(w);
        dir_view v;
        dir_read(dir, &v);
        uint64_t lsn = v.r[v.n - 1].lsn + 1, tick = v.r[v.n - 1].tick;
        dir_view_free(&v);

        kw_codec_ctx *c = NULL;
        ck_assert_ok(kw_codec_create(NULL, &c));
        kw_buf p = {0}, rec = {0};
        if (variant == 0) {
            ck_assert_ok(kw_side_begin(&p, 1, KEEL_DURABLE_IMMEDIATE, 1));
            ck_assert_ok(kw_side_put_write(&p, KEEL_ENTITY_MAKE(0, 1), 200, 4, "abcd"));
            ck_assert_ok(kw_record_build(c, &rec, KW_KIND_SIDE, lsn, tick, 0, p.p, p.len));
        } else {
            ck_assert_ok(kw_lifecycle_begin(&p));
            ck_assert_ok(kw_lifecycle_put_op(&p, KW_OP_ADD, KEEL_ENTITY_MAKE(0, 1), 1, &(kw_value){200, 4, "abcd"}));
            kw_lifecycle_end(&p, 1);
            ck_assert_ok(kw_record_build(c, &rec, KW_KIND_LIFECYCLE, lsn, tick + 1, 0, p.p, p.len));
            unsigned char m[KW_COMMIT_SIZE];
            kw_commit_encode(&(kw_commit_info){.nrecords = 1}, m);
            ck_assert_ok(kw_record_build(c, &rec, KW_KIND_TICK_COMMIT, lsn + 1, tick + 1, 0, m, sizeof m));
        }
        size_t first = kw_record_peek_len(rec.p);
        tu_wal_put(dir, lsn, rec.p, first);
        if (variant == 1)
            tu_wal_put(dir, lsn + 1, rec.p + first, rec.len - first);
        kw_buf_free(&p);
        kw_buf_free(&rec);
        kw_codec_destroy(c);

        w_reset(w, true);
        w_open(w, &d, false);
        ck_assert_rc(keel_runtime_recover(w->rt, NULL), KEEL_ECORRUPT);
        const char *msg = keel_last_error();
        ck_assert_msg(tu_names_lsn(msg, lsn) && strstr(msg, "names an unknown component"), "%s: %s", names[variant],
                      msg);
        w_close(w);
        free(w);
    }
}
END_TEST

/* ---- the stored schema -------------------------------------------------------------- */

enum {
    SV_BASE,
    SV_EXTEND,          /* + "delta", registered last */
    SV_SIZE,            /* beta grows a field: 24 bytes */
    SV_FIELD_NAME,      /* beta.born renamed */
    SV_FIELD_TYPE,      /* beta.born u64 */
    SV_FIELD_OFFSET,    /* beta's fields swapped */
    SV_DISC,            /* gamma VERSIONED instead of SINGLE_VERSION */
    SV_DISC_TRANSIENT,  /* alpha TRANSIENT */
    SV_ORDER,           /* beta registered before alpha */
    SV_MISSING,         /* gamma not registered */
    SV_COUNT
};

static const char *const sv_culprit[SV_COUNT] = {
    [SV_SIZE] = "'beta'", [SV_FIELD_NAME] = "'beta'", [SV_FIELD_TYPE] = "'beta'", [SV_FIELD_OFFSET] = "'beta'",
    [SV_DISC] = "'gamma'", [SV_DISC_TRANSIENT] = "'alpha'", [SV_ORDER] = "'alpha'", [SV_MISSING] = "'gamma'",
};

/* ... what differs, types and disciplines by name, and what to do */
#define SV_FIX "register the stored layout, or start a new data directory"
static const char *const sv_says[SV_COUNT][2] = {
    [SV_SIZE] = {"component 'beta': stored size 16 bytes, registered 24; stored 2 fields, registered 3", SV_FIX},
    [SV_FIELD_NAME] = {"component 'beta': field 1: stored 'born', registered 'birth'", SV_FIX},
    [SV_FIELD_TYPE] = {"component 'beta': field 'born': stored type i64, registered u64", SV_FIX},
    [SV_FIELD_OFFSET] = {"component 'beta': field 'x': stored at offset 0, registered at 8", SV_FIX},
    [SV_DISC] = {"component 'gamma': stored discipline single_version, registered versioned", SV_FIX},
    [SV_DISC_TRANSIENT] = {"component 'alpha': stored discipline versioned, registered transient", SV_FIX},
    [SV_ORDER] = {"component id 1 is 'alpha' in the data directory but 'beta' is registered with that id",
                  "register stored components in the stored order, new ones last, or start a new data directory"},
    [SV_MISSING] = {"component 'gamma' (id 3, single_version) is stored in the data directory but not registered",
                    "register every stored component, in the stored order"},
};

typedef struct sworld {
    keel_runtime *rt;
    keel_component alpha, beta, gamma, delta;
    bool spawn_delta;
    berr err;
} sworld;

static int s_sys(keel_ctx *ctx, void *user)
{
    sworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    keel_entity e = KEEL_ENTITY_MAKE(0, 1);
    if (t == 1) {
        int64_t a = 1, g = 2;
        pos_t b = {3, 1};
        keel_init in[3] = {{w->alpha, &a}, {w->beta, &b}, {w->gamma, &g}};
        B_CHECK(&w->err, keel_cmd_spawn(cb, in, 3));
    } else {
        int64_t a = (int64_t)t, g = 2 * (int64_t)t;
        B_CHECK(&w->err, keel_txn_set(ctx, e, w->alpha, &a));
        B_CHECK(&w->err, keel_txn_set(ctx, e, w->gamma, &g));
    }
    if (w->spawn_delta) {
        int64_t dv = 44;
        keel_init in[1] = {{w->delta, &dv}};
        B_CHECK(&w->err, keel_cmd_spawn(cb, in, 1));
    }
    return 0;
}

static void s_open(sworld *w, const keel_runtime_desc *d, int variant)
{
    memset(w, 0, sizeof *w);
    w->rt = tu_rt_new(*d);
    keel_world *wd = keel_runtime_world(w->rt);
    keel_field bf[3] = {
        {.name = "x", .type = KEEL_I64, .offset = 0},
        {.name = "born", .type = KEEL_I64, .offset = 8},
        {.name = "pad", .type = KEEL_U64, .offset = 16},
    };
    keel_component_desc beta = {.name = "beta", .size = 16, .fields = bf, .field_count = 2};
    if (variant == SV_SIZE)
        beta.size = 24, beta.field_count = 3;
    if (variant == SV_FIELD_NAME)
        bf[1].name = "birth";
    if (variant == SV_FIELD_TYPE)
        bf[1].type = KEEL_U64;
    if (variant == SV_FIELD_OFFSET)
        bf[0].offset = 8, bf[1].offset = 0;
    if (variant == SV_ORDER)
        ck_assert_ok(keel_component_register(wd, &beta, &w->beta));
    w->alpha = reg_i64(w->rt, "alpha", variant == SV_DISC_TRANSIENT ? KEEL_TRANSIENT : KEEL_VERSIONED);
    if (variant != SV_ORDER)
        ck_assert_ok(keel_component_register(wd, &beta, &w->beta));
    if (variant != SV_MISSING)
        w->gamma = reg_i64(w->rt, "gamma", variant == SV_DISC ? KEEL_VERSIONED : KEEL_SINGLE_VERSION);
    if (variant == SV_EXTEND)
        w->delta = reg_i64(w->rt, "delta", KEEL_VERSIONED);
    keel_schedule *s = sched_new(w->rt);
    if (variant == SV_BASE || variant == SV_EXTEND) {
        keel_system_desc sd = {.name = "sch", .kind = KEEL_SYSTEM_CALLBACK, .run = s_sys, .user = w,
                               .access = {.writes = {w->alpha, w->gamma}}};
        add_sys(s, &sd);
    } else {
        keel_system_desc sd = {.name = "noop", .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop};
        add_sys(s, &sd);
    }
    tu_install(w->rt, s);
}

/* A new component registered last is added to the stored schema; a stored
 * component whose layout, discipline or order changed (or that is missing)
 * is refused with a sentence naming it, and the directory is not touched. */
START_TEST(test_schema_extend_and_mismatch)
{
    char dir[256];
    keel_runtime_desc d = desc_named(dir, "schema", KEEL_DURABLE_GROUP);
    sworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    s_open(w, &d, SV_BASE);
    for (int t = 1; t <= 3; t++) {
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
    }
    uint64_t h3 = keel_world_hash(keel_runtime_world(w->rt));
    keel_runtime_close(w->rt);
    dir_view v;
    dir_read(dir, &v);
    ck_assert_uint_eq(v.schema_ncomps, 3);
    ck_assert_str_eq(v.schema_names[0], "alpha");
    ck_assert_str_eq(v.schema_names[1], "beta");
    ck_assert_str_eq(v.schema_names[2], "gamma");
    ck_assert_uint_eq(v.kinds[KW_KIND_SCHEMA], 1);
    dir_view_free(&v);
    tu_digest d0 = dir_digest(dir);

    for (int variant = SV_SIZE; variant < SV_COUNT; variant++) {
        s_open(w, &d, variant);
        keel_recovery info;
        memset(&info, 0xab, sizeof info);
        ck_assert_rc(keel_runtime_recover(w->rt, &info), KEEL_EINVAL);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", keel_last_error());
        ck_assert_msg(strstr(msg, sv_culprit[variant]) != NULL, "variant %d: the error does not name %s: %s",
                      variant, sv_culprit[variant], msg);
        ck_assert_msg(strstr(msg, dir) != NULL, "variant %d: the error does not name the directory: %s", variant,
                      msg);
        for (int k = 0; k < 2; k++)
            ck_assert_msg(strstr(msg, sv_says[variant][k]) != NULL, "variant %d: the error does not say \"%s\": %s",
                          variant, sv_says[variant][k], msg);
        ck_assert_rc(keel_runtime_recover(w->rt, NULL), KEEL_EINVAL);
        ck_assert_str_eq(keel_last_error(), msg);
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_EINVAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), sv_culprit[variant]));
        ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
        tu_assert_digest_eq(d0, dir_digest(dir));
        keel_runtime_close(w->rt);
        tu_assert_digest_eq(d0, dir_digest(dir));
    }

    /* a new component, registered last: stored, usable, durable */
    s_open(w, &d, SV_EXTEND);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 3);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h3);
    w->spawn_delta = true;
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_berr(&w->err);
    w->spawn_delta = false;
    keel_entity de = KEEL_ENTITY_MAKE(1, 1);
    ck_assert_int_eq(get_i64(w->rt, de, w->delta), 44);
    uint64_t h4 = keel_world_hash(keel_runtime_world(w->rt));
    keel_runtime_close(w->rt);
    dir_read(dir, &v);
    ck_assert_uint_eq(v.schema_ncomps, 4);
    ck_assert_str_eq(v.schema_names[3], "delta");
    ck_assert_uint_eq(v.kinds[KW_KIND_SCHEMA], 2);
    dir_view_free(&v);
    s_open(w, &d, SV_EXTEND);
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 4);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h4);
    ck_assert_int_eq(get_i64(w->rt, de, w->delta), 44);
    keel_runtime_close(w->rt);
    /* now delta is stored: opening without it is refused */
    tu_digest d1 = dir_digest(dir);
    s_open(w, &d, SV_BASE);
    ck_assert_rc(keel_runtime_recover(w->rt, &info), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'delta'"));
    keel_runtime_close(w->rt);
    tu_assert_digest_eq(d1, dir_digest(dir));
    free(w);
}
END_TEST

/* ---- bad data directories ------------------------------------------------------------- */

/* Open dir, expect recovery to fail with one of the codes, a sentence naming
 * `names`, the same result from a step; close cleanly. */
static int try_bad_dir(const char *dir, const char *names, const int *codes, int ncodes)
{
    keel_runtime_desc d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    keel_runtime *rt = tu_rt_new(d);
    reg_i64(rt, "v", KEEL_VERSIONED);
    keel_schedule *s = sched_new(rt);
    keel_system_desc sd = {.name = "noop", .kind = KEEL_SYSTEM_CALLBACK, .run = tu_sys_noop};
    add_sys(s, &sd);
    tu_install(rt, s);
    keel_recovery info;
    int rc = keel_runtime_recover(rt, &info);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", keel_last_error());
    bool ok = false;
    for (int i = 0; i < ncodes; i++)
        ok |= rc == codes[i];
    ck_assert_msg(ok, "%s: keel_runtime_recover returned %s (%d): %s", dir, keel_strerror(rc), rc, msg);
    ck_assert_msg(strstr(msg, names) != NULL, "the error does not name %s: %s", names, msg);
    ck_assert_rc(keel_runtime_step(rt), rc);
    ck_assert_uint_eq(keel_runtime_tick(rt), 0);
    keel_runtime_close(rt);
    return rc;
}

static int fill_format(kw_wtxn *t, void *arg)
{
    (void)arg;
    unsigned char f[4] = {99, 0, 0, 0};
    return kw_put(t, KW_DB_META, KW_META_FORMAT, strlen(KW_META_FORMAT), f, 4);
}

/* A data directory that is not one: a clear error, never a crash, nothing
 * overwritten. The codes are those keel_runtime_recover documents. */
START_TEST(test_bad_data_dirs)
{
    static const int io[] = {KEEL_EIO, KEEL_EINVAL};
    static const int corrupt[] = {KEEL_ECORRUPT};
    char plain[256], under[300], isdir[256], sub[300], garbage[256], mdb[300], newer[256];
    /* a path under a plain file (the plain file itself: test_data_dir_is_plain_file) */
    tu_path(plain, sizeof plain, "a-file");
    tu_write_file(plain, "not a directory\n", 16);
    tu_digest fd0 = tu_file_digest(plain);
    snprintf(under, sizeof under, "%s/sub", plain);
    try_bad_dir(under, under, io, 2);
    tu_assert_digest_eq(fd0, tu_file_digest(plain));
    /* data.mdb is a directory */
    tu_path(isdir, sizeof isdir, "mdb-is-dir");
    ck_assert_int_eq(mkdir(isdir, 0755), 0);
    snprintf(sub, sizeof sub, "%s/data.mdb", isdir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    try_bad_dir(isdir, isdir, io, 2);
    /* data.mdb is not LMDB */
    tu_path(garbage, sizeof garbage, "garbage");
    ck_assert_int_eq(mkdir(garbage, 0755), 0);
    mdb_path(mdb, sizeof mdb, garbage);
    unsigned char junk[65536];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)(i * 131 + 7);
    tu_write_file(mdb, junk, sizeof junk);
    tu_digest g0 = tu_file_digest(mdb);
    try_bad_dir(garbage, garbage, corrupt, 1);
    tu_assert_digest_eq(g0, tu_file_digest(mdb));
    /* a format version from the future */
    tu_path(newer, sizeof newer, "newer-format");
    {
        keel_runtime_desc d = desc_dir(newer, 1, 16, KEEL_DURABLE_GROUP);
        keel_runtime *rt = tu_rt_new(d);
        reg_i64(rt, "v", KEEL_VERSIONED);
        ck_assert_ok(keel_runtime_recover(rt, NULL));
        keel_runtime_close(rt);
        kw_store *st = NULL;
        kw_store_desc sd = {0};
        ck_assert_ok(kw_store_open(newer, &sd, &st));
        ck_assert_ok(kw_store_write(st, fill_format, NULL));
        kw_store_close(st);
    }
    tu_digest n0 = dir_digest(newer);
    try_bad_dir(newer, "99", corrupt, 1);
    tu_assert_digest_eq(n0, dir_digest(newer));
    /* an unreadable directory (root reads everything: only checked as a user) */
    if (geteuid() != 0) {
        char locked[256];
        tu_path(locked, sizeof locked, "locked");
        ck_assert_int_eq(mkdir(locked, 0755), 0);
        ck_assert_int_eq(chmod(locked, 0), 0);
        try_bad_dir(locked, locked, io, 2);
        chmod(locked, 0700);
    }
}
END_TEST

/* The data directory names a plain file. */
START_TEST(test_data_dir_is_plain_file)
{
    static const int io[] = {KEEL_EIO, KEEL_EINVAL};
    char plain[256];
    tu_path(plain, sizeof plain, "plain-file");
    tu_write_file(plain, "not a directory\n", 16);
    tu_digest fd0 = tu_file_digest(plain);
    try_bad_dir(plain, plain, io, 2);
    tu_assert_digest_eq(fd0, tu_file_digest(plain));
}
END_TEST

/* ---- map growth ------------------------------------------------------------------------ */

#define BLOB 256

typedef struct gworld {
    keel_runtime *rt;
    keel_component BLOBC;
    keel_query *q;
    uint32_t n;
    berr err;
} gworld;

static void blob_fill(unsigned char *p, uint64_t idx, uint64_t t)
{
    uint64_t x = (idx + 1) * 0x9E3779B97F4A7C15ull ^ (t + 1) * 0xD1B54A32D192ED03ull;
    for (int i = 0; i < BLOB; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* Rewrites every blob each tick with incompressible bytes. */
static int g_sys(keel_ctx *ctx, void *user)
{
    gworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    if (t == 1) {
        unsigned char b[BLOB];
        for (uint32_t i = 0; i < w->n; i++) {
            blob_fill(b, i, 0);
            keel_init in[1] = {{w->BLOBC, b}};
            B_CHECK(&w->err, keel_cmd_spawn(keel_ctx_commands(ctx), in, 1));
        }
        return 0;
    }
    keel_iter it;
    keel_txn_iter(ctx, w->q, &it);
    while (keel_txn_next(ctx, &it)) {
        unsigned char *p = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++)
            blob_fill(p + (size_t)r * BLOB, KEEL_ENTITY_INDEX(it.entities[r]), t);
    }
    return 0;
}

static void g_open(gworld *w, const keel_runtime_desc *d, uint32_t n)
{
    memset(w, 0, sizeof *w);
    w->n = n;
    w->rt = tu_rt_new(*d);
    static const keel_field bf[] = {{.name = "bytes", .type = KEEL_BYTES, .offset = 0, .count = BLOB}};
    keel_component_desc cd = {.name = "blob", .size = BLOB, .fields = bf, .field_count = 1};
    ck_assert_ok(keel_component_register(keel_runtime_world(w->rt), &cd, &w->BLOBC));
    keel_query_desc qd = {.with = {w->BLOBC}};
    ck_assert_ok(keel_query_create(keel_runtime_world(w->rt), &qd, &w->q));
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sd = {.name = "blobs", .kind = KEEL_SYSTEM_CALLBACK, .run = g_sys, .user = w,
                           .access = {.writes = {w->BLOBC}}};
    add_sys(s, &sd);
    tu_install(w->rt, s);
}

static void g_close(gworld *w)
{
    keel_query_destroy(w->q);
    keel_runtime_close(w->rt);
    w->rt = NULL;
}

/* A 1 MiB initial map and a workload writing several MiB: the map grows
 * (doubling) and nothing is lost. */
START_TEST(test_map_growth)
{
    char dir[256], mdb[300];
    tu_path(dir, sizeof dir, "growth");
    mdb_path(mdb, sizeof mdb, dir);
    keel_runtime_desc d = desc_dir(dir, 1, 64, KEEL_DURABLE_GROUP);
    d.durable.map_size = 1u << 20;
    gworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    g_open(w, &d, 100);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    ck_assert_uint_eq(kw_store_map_size(w->rt->dur->store), 1u << 20);
    for (int t = 1; t <= 160; t++) {
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
    }
    ck_assert_ok(keel_flush(w->rt));
    ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
    ck_assert_uint_gt(kw_store_map_size(w->rt->dur->store), 1u << 20);
    ck_assert_uint_gt(tu_stats(w->rt).wal_bytes, 3u << 20);
    uint64_t h = keel_world_hash(keel_runtime_world(w->rt));
    g_close(w);
    tu_digest f = tu_file_digest(mdb);
    ck_assert_msg(f.size > (1u << 20), "data.mdb is %llu bytes", (unsigned long long)f.size);
    g_open(w, &d, 100);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, 160);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h);
    ck_assert_ok(keel_runtime_step(w->rt));
    g_close(w);
    free(w);
}
END_TEST

/* ==== dur_errors ===================================================================== */

enum { F_NORMAL, F_IMMEDIATE_TWICE, F_IMMEDIATE_ONCE, F_FENCE_OOM };

typedef struct fworld {
    keel_runtime *rt;
    keel_component MONEY, POS;
    keel_query *q_money;
    uint64_t fail_tick;
    int mode;
    int rc_imm1, rc_imm2, rc_group;
    uint32_t fail_runs;
    uint32_t shutdown_calls;
    berr err;
} fworld;

static int f_transfer(keel_ctx *ctx, fworld *w, keel_durability mode, int64_t amount)
{
    keel_entity a[8];
    if (query_entities(w->q_money, a, 8) < 2)
        return KEEL_ENOENT;
    keel_side_txn *tx = NULL;
    int rc = keel_side_txn_begin(ctx, mode, &tx);
    if (rc)
        return rc;
    int64_t x = 0, y = 0;
    rc = keel_side_get(tx, a[0], w->MONEY, &x);
    rc = rc ? rc : keel_side_get(tx, a[1], w->MONEY, &y);
    x -= amount;
    y += amount;
    rc = rc ? rc : keel_side_set(tx, a[0], w->MONEY, &x);
    rc = rc ? rc : keel_side_set(tx, a[1], w->MONEY, &y);
    if (rc) {
        keel_side_txn_abort(tx);
        return rc;
    }
    return keel_side_txn_commit(tx);
}

static int f_sys(keel_ctx *ctx, void *user)
{
    fworld *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    if (t == 1) {
        int64_t m = 500;
        pos_t p = {0, 1};
        keel_init acct[1] = {{w->MONEY, &m}}, pe[1] = {{w->POS, &p}};
        B_CHECK(&w->err, keel_cmd_spawn(keel_ctx_commands(ctx), acct, 1));
        B_CHECK(&w->err, keel_cmd_spawn(keel_ctx_commands(ctx), acct, 1));
        B_CHECK(&w->err, keel_cmd_spawn(keel_ctx_commands(ctx), pe, 1));
        return 0;
    }
    pos_t p = {(int64_t)t, 1};
    B_CHECK(&w->err, keel_txn_set(ctx, KEEL_ENTITY_MAKE(2, 1), w->POS, &p));
    if (t != w->fail_tick || w->mode == F_NORMAL) {
        B_CHECK(&w->err, f_transfer(ctx, w, KEEL_DURABLE_GROUP, 1));
        return 0;
    }
    w->fail_runs++;
    switch (w->mode) {
    case F_IMMEDIATE_TWICE:
        w->rc_imm1 = f_transfer(ctx, w, KEEL_DURABLE_IMMEDIATE, 3);
        w->rc_imm2 = f_transfer(ctx, w, KEEL_DURABLE_IMMEDIATE, 5);
        w->rc_group = f_transfer(ctx, w, KEEL_DURABLE_GROUP, 9);
        break;
    case F_IMMEDIATE_ONCE:
        w->rc_imm1 = f_transfer(ctx, w, KEEL_DURABLE_IMMEDIATE, 11);
        break;
    case F_FENCE_OOM:
        /* the unit of work ran out of memory capturing the tick: the fence
         * cannot log it (txn/uow.c sets this flag when an allocation fails) */
        ctx->rt->txn.uow.oom = true;
        break;
    }
    return 0;
}

static int f_shutdown(keel_side_txn *tx, void *arg)
{
    (void)tx;
    fworld *w = arg;
    w->shutdown_calls++;
    return 0;
}

static void f_open(fworld *w, const keel_runtime_desc *base)
{
    memset(w, 0, sizeof *w);
    keel_runtime_desc d = *base;
    d.durable.on_shutdown = f_shutdown;
    d.durable.shutdown_arg = w;
    w->rt = tu_rt_new(d);
    w->MONEY = reg_i64(w->rt, "money", KEEL_VERSIONED);
    keel_component_desc pos = {.name = "pos", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(keel_runtime_world(w->rt), &pos, &w->POS));
    keel_query_desc qd = {.with = {w->MONEY}};
    ck_assert_ok(keel_query_create(keel_runtime_world(w->rt), &qd, &w->q_money));
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sd = {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = f_sys, .user = w,
                           .access = {.writes = {w->POS}, .side_writes = {w->MONEY}}};
    add_sys(s, &sd);
    tu_install(w->rt, s);
}

static void f_close(fworld *w)
{
    keel_query_destroy(w->q_money);
    keel_runtime_close(w->rt);
    w->rt = NULL;
}

static void f_money(fworld *w, int64_t out[2])
{
    keel_entity a[8];
    ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
    out[0] = get_i64(w->rt, a[0], w->MONEY);
    out[1] = get_i64(w->rt, a[1], w->MONEY);
}

/* Three good ticks, made durable. */
static void f_prefix(fworld *w, uint64_t *hash, int64_t money[2], uint64_t *lsn)
{
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    for (int t = 1; t <= 3; t++) {
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_berr(&w->err);
    }
    ck_assert_ok(keel_flush(w->rt));
    *hash = keel_world_hash(keel_runtime_world(w->rt));
    f_money(w, money);
    *lsn = keel_durable_lsn(w->rt);
    ck_assert_uint_eq(*lsn, dur_last_lsn(w->rt->dur));
}

/* Reopen: the runtime is at `tick` with this hash (0: not checked) and
 * these balances, and runs on. */
static void f_expect_reopen(const keel_runtime_desc *d, uint64_t tick, uint64_t hash, const int64_t money[2])
{
    fworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    f_open(w, d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, tick);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), tick);
    if (hash)
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), hash);
    int64_t m[2];
    f_money(w, m);
    ck_assert_int_eq(m[0], money[0]);
    ck_assert_int_eq(m[1], money[1]);
    ck_assert_int_eq(m[0] + m[1], 1000);
    /* and it runs on */
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_berr(&w->err);
    ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
    f_close(w);
    free(w);
}

/* The fatal tests' common start: a fresh directory `name`, a world that
 * fails at tick 4 in `mode`, ticks 1-3 run and durable (their hash, money
 * and last LSN in the out-parameters). */
static fworld *f_start(char dir[256], const char *name, int mode, keel_runtime_desc *d, uint64_t *h3, int64_t m3[2],
                       uint64_t *l3)
{
    tu_path(dir, 256, name);
    *d = desc_dir(dir, 1, 16, KEEL_DURABLE_GROUP);
    fworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    f_open(w, d);
    w->fail_tick = 4;
    w->mode = mode;
    f_prefix(w, h3, m3, l3);
    return w;
}

/* An I/O error on a WAL commit latches the runtime: nothing is acknowledged
 * any more (side commits, tickets, ticks, flush, checkpoint), on_shutdown
 * does not run, and the directory reopens at the last durable tick. */
START_TEST(test_fatal_injected)
{
    static const int codes[2] = {KEEL_EIO, KEEL_ENOSPC};
    for (int i = 0; i < 2; i++) {
        char dir[256];
        keel_runtime_desc d;
        uint64_t h3, l3;
        int64_t m3[2];
        fworld *w = f_start(dir, i ? "fatal-enospc" : "fatal-eio", F_IMMEDIATE_TWICE, &d, &h3, m3, &l3);
        ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
        log_capture_on();
        /* the writer is idle (flushed): the next commit is the closure's */
        kw_store_test_fail_write(w->rt->dur->store, 1, codes[i]);
        keel_entity a[8];
        ck_assert_uint_eq(query_entities(w->q_money, a, 8), 2);
        xfer x = {a[0], a[1], 7, w->MONEY};
        keel_ticket *tk = NULL;
        ck_assert_ok(keel_submit(w->rt, closure_xfer, &x, KEEL_DURABLE_IMMEDIATE, &tk));
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
        ck_assert_uint_eq(w->fail_runs, 1);
        ck_assert_rc(w->rc_imm1, KEEL_EFATAL);
        ck_assert_rc(w->rc_imm2, KEEL_EFATAL);
        ck_assert_rc(w->rc_group, KEEL_EFATAL);
        ck_assert_int_eq(keel_runtime_fatal(w->rt), codes[i]);
        ck_assert_rc(keel_ticket_wait(tk, -1), KEEL_EFATAL);
        keel_ticket_release(tk);
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "fatal"));
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
        ck_assert_rc(keel_flush(w->rt), KEEL_EFATAL);
        ck_assert_rc(keel_checkpoint(w->rt), KEEL_EFATAL);
        ck_assert_uint_eq(keel_durable_lsn(w->rt), l3); /* nothing more acknowledged */
        ck_assert_int_eq(keel_runtime_fatal(w->rt), codes[i]); /* the first code stays */
        /* a closure submitted now would never run: refused (test_failpoint's
         * fp_io covers closures queued before the latch) */
        tk = NULL;
        ck_assert_rc(keel_submit(w->rt, closure_xfer, &x, KEEL_DURABLE_IMMEDIATE, &tk), KEEL_EFATAL);
        ck_assert_ptr_null(tk);
        f_close(w); /* joins the writer: its diagnostics are all out */
        char field[64];
        snprintf(field, sizeof field, "code=%s", keel_strerror(codes[i]));
        ck_assert_logged("wal/fatal", field);
        ck_assert_logged("wal/commit_failed", "injected");
        ck_assert_uint_eq(w->shutdown_calls, 0);
        dir_view v;
        dir_read(dir, &v);
        ck_assert_uint_eq(v.r[v.n - 1].lsn, l3);
        ck_assert_uint_eq(max_tick_of(&v), 3);
        dir_view_free(&v);
        f_expect_reopen(&d, 3, h3, m3);
        free(w);
    }
}
END_TEST

/* An IMMEDIATE side commit acknowledged in tick 4, then tick 4's own batch
 * fails to commit: the acknowledged transfer is recovered, tick 4 is not. */
START_TEST(test_fatal_after_acknowledged_immediate)
{
    char dir[256];
    keel_runtime_desc d;
    uint64_t h3, l3;
    int64_t m3[2];
    fworld *w = f_start(dir, "fatal-acked", F_IMMEDIATE_ONCE, &d, &h3, m3, &l3);
    /* commit 1: the side record (acknowledged); commit 2 fails (the tick's
     * batch, or an empty flush before it) */
    log_capture_on();
    kw_store_test_fail_write(w->rt->dur->store, 2, KEEL_EIO);
    int rc = keel_runtime_step(w->rt);
    ck_assert_msg(rc == KEEL_OK || rc == KEEL_EFATAL, "step: %s", keel_strerror(rc));
    ck_assert_rc(w->rc_imm1, KEEL_OK);
    keel_flush(w->rt); /* returns once the failure latched (see test_fatal_fence_oom for its code) */
    ck_assert_int_eq(keel_runtime_fatal(w->rt), KEEL_EIO);
    ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
    f_close(w);
    ck_assert_logged("wal/fatal", "code=KEEL_EIO");
    dir_view v;
    dir_read(dir, &v);
    ck_assert_uint_eq(count_kind_tick(&v, KW_KIND_TICK_COMMIT, 4, false), 0);
    uint64_t side4 = 0;
    for (uint64_t i = 0; i < v.n; i++)
        side4 += v.r[i].kind == KW_KIND_SIDE && v.r[i].tick == 4 && v.r[i].side_mode == KEEL_DURABLE_IMMEDIATE;
    ck_assert_uint_eq(side4, 1);
    dir_view_free(&v);
    int64_t m[2] = {m3[0] - 11, m3[1] + 11};
    f_expect_reopen(&d, 3, 0, m);
    free(w);
}
END_TEST

/* The fence cannot log tick 4 (its unit of work ran out of memory): the
 * runtime latches, and keel_flush -- "wait until every tick completed
 * so far is durable" -- must not report success for it. */
START_TEST(test_fatal_fence_oom)
{
    char dir[256];
    keel_runtime_desc d;
    uint64_t h3, l3;
    int64_t m3[2];
    fworld *w = f_start(dir, "fatal-oom", F_FENCE_OOM, &d, &h3, m3, &l3);
    log_capture_on();
    ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
    ck_assert_int_eq(keel_runtime_fatal(w->rt), KEEL_ENOMEM);
    ck_assert_logged("txn/uow_capture_oom", "tick=4");
    ck_assert_logged("wal/fatal", "code=KEEL_ENOMEM");
    ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
    ck_assert_rc(keel_checkpoint(w->rt), KEEL_EFATAL);
    uint64_t tick = keel_runtime_tick(w->rt);
    int flush = keel_flush(w->rt);
    f_close(w);
    ck_assert_uint_eq(w->shutdown_calls, 0);
    f_expect_reopen(&d, 3, h3, m3);
    free(w);
    ck_assert_msg(flush == KEEL_EFATAL, "keel_flush on a runtime latched fatal returned %s although tick %llu "
                  "(keel_runtime_tick) was never logged; expected KEEL_EFATAL", keel_strerror(flush),
                  (unsigned long long)tick);
}
END_TEST

/* A real ENOSPC: map_max too small for the workload. IMMEDIATE ticks, so
 * every step that returned 0 is durable; the failing one latches. */
START_TEST(test_map_max_enospc)
{
    char dir[256], mdb[300];
    tu_path(dir, sizeof dir, "map-max");
    mdb_path(mdb, sizeof mdb, dir);
    keel_runtime_desc d = desc_dir(dir, 1, 64, KEEL_DURABLE_IMMEDIATE);
    d.durable.map_max = 512u << 10;
    gworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    g_open(w, &d, 100);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    log_capture_on();
    static uint64_t hash[401];
    int rc = 0;
    uint64_t t = 0;
    while (t < 400) {
        rc = keel_runtime_step(w->rt);
        ck_assert_berr(&w->err);
        if (rc)
            break;
        hash[++t] = keel_world_hash(keel_runtime_world(w->rt));
    }
    ck_assert_rc(rc, KEEL_EFATAL);
    ck_assert_uint_ge(t, 2);
    ck_assert_int_eq(keel_runtime_fatal(w->rt), KEEL_ENOSPC);
    ck_assert_rc(keel_runtime_step(w->rt), KEEL_EFATAL);
    ck_assert_rc(keel_flush(w->rt), KEEL_EFATAL);
    g_close(w);
    ck_assert_logged("wal/commit_failed", "full");
    ck_assert_logged("wal/fatal", "code=KEEL_ENOSPC");
    tu_digest f = tu_file_digest(mdb);
    ck_assert_uint_le(f.size, 512u << 10);
    /* reopen with room: the last tick whose step returned 0 */
    keel_runtime_desc d2 = d;
    d2.durable.map_max = 0;
    g_open(w, &d2, 100);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(w->rt, &info));
    ck_assert_uint_eq(info.tick, t);
    ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), hash[t]);
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
    g_close(w);
    free(w);
}
END_TEST

/* Bad durable descriptor fields are refused at create, naming the field. */
START_TEST(test_bad_desc)
{
    char dir[256];
    tu_path(dir, sizeof dir, "desc");
    struct {
        keel_durable_desc dd;
        const char *field;
    } cases[] = {
        {{.dir = ""}, "durable.dir"},
        {{.dir = dir, .zstd_level = 23}, "zstd_level"},
        {{.dir = dir, .zstd_level = -131073}, "zstd_level"},
        {{.dir = dir, .map_size = 2u << 20, .map_max = 1u << 20}, "map_size"},
        {{.dir = dir, .checkpoint_every_seconds = NAN}, "checkpoint_every_seconds"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        keel_runtime_desc d = {.workers = 1, .durable = cases[i].dd};
        keel_runtime *rt = (keel_runtime *)&d; /* must stay untouched */
        ck_assert_rc(keel_runtime_create(&d, &rt), KEEL_EINVAL);
        ck_assert_ptr_eq(rt, (keel_runtime *)&d);
        ck_assert_msg(strstr(keel_last_error(), cases[i].field) != NULL, "case %zu: the error does not name %s: %s", i,
                      cases[i].field, keel_last_error());
    }
    ck_assert(!path_exists(dir));
    /* the edges that are allowed: zstd's fast levels, its top level, map_size == map_max */
    static wref ref;
    w_reference(&ref, 3, 1, false);
    const int32_t levels[3] = {-5, 19, 0};
    for (int i = 0; i < 3; i++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s-%d", dir, i);
        keel_runtime_desc d = desc_dir(sub, 1, 16, KEEL_DURABLE_GROUP);
        d.durable.zstd_level = levels[i];
        if (i == 2)
            d.durable.map_size = d.durable.map_max = 8u << 20;
        wworld *w = w_new(false);
        w_open(w, &d, false);
        for (uint64_t t = 1; t <= 3; t++)
            w_drive(w, t);
        w_close(w);
        w_reset(w, false);
        w_open(w, &d, false);
        ck_assert_ok(keel_runtime_recover(w->rt, NULL));
        w_expect(w, &ref, 3);
        w_close(w);
        free(w);
    }
}
END_TEST

/* A sync point whose commands fail part-way (the world's injected failure
 * of its nth command), then keel_runtime_sync_retry: the commands the
 * retry applies are durable like the tick's others. Variant 0 fails tick
 * 4's sync point; variant 1 the first step's on_first_tick commands (the
 * hook spawns 6 entities when the world is empty; the 3rd spawn fails).
 * After the retry the runtime runs on, closes, and reopens at the same
 * tick and hash, with the reference's handles for later spawns. (The
 * retried commands were once never logged: the directory then failed to
 * open, "a spawn created a different entity handle than the one logged".) */
START_TEST(test_sync_retry_durable)
{
    for (int variant = 0; variant < 2; variant++) {
        bool hook = variant == 1;
        const uint32_t nspawn = hook ? 6 : 0;
        const uint64_t fail_tick = hook ? 1 : 4, last = 7, more = 10;
        static wref ref;
        w_reference_hook(&ref, more, 1, true, nspawn);
        char dir[256];
        tu_path(dir, sizeof dir, hook ? "retry-hook" : "retry-sync");
        keel_runtime_desc d = desc_dir(dir, 2, 16, KEEL_DURABLE_GROUP);
        wworld *w = w_new(true);
        w->hook_spawn = nspawn;
        w_open(w, &d, false);
        ck_assert_ok(keel_runtime_recover(w->rt, NULL));
        keel_world *wd = keel_runtime_world(w->rt);
        for (uint64_t t = 1; t < fail_tick; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        if (hook)
            w->hook_inject = 3; /* set by the hook itself, during the step */
        else
            world_test_inject_failure(wd, 3, KEEL_ENOMEM);
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_ENOMEM);
        ck_assert_berr(&w->err);
        if (hook) { /* the hook's first two spawns applied; no system ran, the tick did not count */
            ck_assert_uint_eq(keel_runtime_tick(w->rt), 0);
            ck_assert_uint_eq(keel_world_count(wd), 2);
            ck_assert_uint_eq(w->sys_runs, 0);
        } else { /* part-way: the tick counts, its state is not the reference's yet */
            ck_assert_uint_eq(keel_runtime_tick(w->rt), fail_tick);
            ck_assert_uint_ne(keel_world_hash(wd), ref.hash[fail_tick]);
        }
        ck_assert_rc(keel_runtime_step(w->rt), KEEL_EBUSY); /* the rest is pending */
        uint64_t seq = atomic_load(&w->rt->dur->step_seq);
        ck_assert_uint_eq(seq % 2, 0);
        ck_assert_ok(keel_runtime_sync_retry(w->rt));
        ck_assert_uint_eq(atomic_load(&w->rt->dur->step_seq), seq + 2); /* marked as a step for the checkpoint thread */
        ck_assert_int_eq(keel_runtime_fatal(w->rt), 0);
        if (hook) {
            ck_assert_uint_eq(keel_world_count(wd), nspawn);
        } else {
            w_expect(w, &ref, fail_tick);
        }
        for (uint64_t t = hook ? 1 : fail_tick + 1; t <= last; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        ck_assert_uint_eq(w->hook_calls, 1);
        uint64_t h = keel_world_hash(wd);
        w_close(w);

        w_reset(w, true);
        w->hook_spawn = nspawn; /* the world is not empty: the hook spawns nothing */
        w_open(w, &d, false);
        keel_recovery info;
        ck_assert_ok(keel_runtime_recover(w->rt, &info));
        ck_assert_uint_eq(info.tick, last);
        ck_assert_uint_eq(keel_runtime_tick(w->rt), last);
        ck_assert_uint_eq(keel_world_hash(keel_runtime_world(w->rt)), h);
        w_expect(w, &ref, last);
        for (uint64_t t = last + 1; t <= more; t++) {
            w_drive(w, t);
            w_expect(w, &ref, t);
        }
        w_close(w);
        free(w);
    }
}
END_TEST

/* ==== dur_writer ===================================================================== */

#define WR_THREADS 8
#define WR_ACCOUNTS 8
#define WR_INIT 1000000

typedef struct wr_report {
    int fail_line;
    char msg[320];
    uint64_t ok, bad, fsyncs, commits, ticks, side_in_ticks;
    int first_bad_rc;
} wr_report;

typedef struct wr_env {
    keel_runtime *rt;
    keel_component MONEY, CLOCK;
    keel_query *q_money, *q_clock;
    keel_entity acct[WR_ACCOUNTS];
    uint32_t per_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t submitted;
    uint32_t done;
    _Atomic uint64_t ok, bad;
    _Atomic int first_bad_rc;
    berr err;
} wr_env;

typedef struct wr_arg {
    wr_env *e;
    uint32_t id;
} wr_arg;

/* Thread i's j-th transfer: deterministic, so the final balances are plain
 * arithmetic whatever order the closures ran in. */
static void wr_plan(uint32_t i, uint32_t j, uint32_t *from, uint32_t *to, int64_t *amount)
{
    *from = i % WR_ACCOUNTS;
    *to = (i + 1 + j % (WR_ACCOUNTS - 1)) % WR_ACCOUNTS;
    *amount = 1 + (int64_t)((i * 3 + j) % 11);
}

static void wr_expected(uint32_t per_thread, int64_t out[WR_ACCOUNTS])
{
    for (int a = 0; a < WR_ACCOUNTS; a++)
        out[a] = WR_INIT;
    for (uint32_t i = 0; i < WR_THREADS; i++)
        for (uint32_t j = 0; j < per_thread; j++) {
            uint32_t f, t;
            int64_t amt;
            wr_plan(i, j, &f, &t, &amt);
            out[f] -= amt;
            out[t] += amt;
        }
}

static void *wr_thread(void *p)
{
    wr_arg *arg = p;
    wr_env *e = arg->e;
    for (uint32_t j = 0; j < e->per_thread; j++) {
        uint32_t f, t;
        xfer x = {.c = e->MONEY};
        wr_plan(arg->id, j, &f, &t, &x.amount);
        x.from = e->acct[f];
        x.to = e->acct[t];
        keel_ticket *tk = NULL;
        int rc = keel_submit(e->rt, closure_xfer, &x, KEEL_DURABLE_IMMEDIATE, &tk);
        pthread_mutex_lock(&e->mu);
        e->submitted++;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        if (!rc) {
            rc = keel_ticket_wait(tk, -1);
            keel_ticket_release(tk);
        }
        if (rc == 0) {
            atomic_fetch_add(&e->ok, 1);
        } else {
            int zero = 0;
            atomic_compare_exchange_strong(&e->first_bad_rc, &zero, rc);
            atomic_fetch_add(&e->bad, 1);
        }
    }
    pthread_mutex_lock(&e->mu);
    e->done++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Tick 1 opens the accounts and a clock entity; every tick writes the
 * clock (the tick's own VERSIONED row). */
static int wr_sys(keel_ctx *ctx, void *user)
{
    wr_env *e = user;
    uint64_t t = keel_ctx_tick(ctx);
    int64_t v = (int64_t)t;
    if (t == 1) {
        int64_t m = WR_INIT;
        keel_init acct[1] = {{e->MONEY, &m}}, clk[1] = {{e->CLOCK, &v}};
        for (int a = 0; a < WR_ACCOUNTS; a++)
            B_CHECK(&e->err, keel_cmd_spawn(keel_ctx_commands(ctx), acct, 1));
        B_CHECK(&e->err, keel_cmd_spawn(keel_ctx_commands(ctx), clk, 1));
        return 0;
    }
    keel_entity c[2];
    if (query_entities(e->q_clock, c, 2) == 1)
        B_CHECK(&e->err, keel_txn_set(ctx, c[0], e->CLOCK, &v));
    return 0;
}

/* No Check calls here: it also runs in a child process. 0 or the failing line. */
static int wr_open(wr_env *e, const keel_runtime_desc *d)
{
    keel_world *w;
    keel_schedule *s = NULL;
    if (keel_runtime_create(d, &e->rt))
        return __LINE__;
    w = keel_runtime_world(e->rt);
    keel_component_desc cm = {.name = "money", .size = 8, .fields = i64_fields, .field_count = 1};
    keel_component_desc cc = {.name = "clock", .size = 8, .fields = i64_fields, .field_count = 1};
    if (keel_component_register(w, &cm, &e->MONEY) || keel_component_register(w, &cc, &e->CLOCK))
        return __LINE__;
    keel_query_desc qm = {.with = {e->MONEY}}, qc = {.with = {e->CLOCK}};
    if (keel_query_create(w, &qm, &e->q_money) || keel_query_create(w, &qc, &e->q_clock))
        return __LINE__;
    keel_system_desc sd = {.name = "clock", .kind = KEEL_SYSTEM_CALLBACK, .run = wr_sys, .user = e,
                           .access = {.writes = {e->CLOCK}}};
    if (keel_schedule_create(e->rt, &s) || keel_schedule_add_system(s, &sd, NULL) || keel_schedule_build(s) ||
        keel_runtime_set_schedule(e->rt, s))
        return __LINE__;
    return 0;
}

static void wr_close(wr_env *e)
{
    keel_query_destroy(e->q_money);
    keel_query_destroy(e->q_clock);
    keel_runtime_close(e->rt);
    e->rt = NULL;
}

#define WR_FAIL(rep, cond)                                                                   \
    do {                                                                                     \
        if (!(cond) && !(rep)->fail_line) {                                                  \
            (rep)->fail_line = __LINE__;                                                     \
            snprintf((rep)->msg, sizeof (rep)->msg, "%s (%s)", #cond, keel_last_error());    \
        }                                                                                    \
    } while (0)

/* The workload, reporting into rep instead of asserting: it also runs in a
 * child process that must not call into Check. With crash, it ends the
 * process at once (no close, no flush) once every ticket returned. */
static void wr_run(const char *dir, uint32_t per_thread, wr_report *rep, bool crash)
{
    wr_env *e = calloc(1, sizeof *e);
    if (!e) {
        rep->fail_line = __LINE__;
        return;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->per_thread = per_thread;
    keel_runtime_desc d = {.world = {.chunk_rows = 64}, .workers = 2, .tick_rate_hz = -1};
    d.durable.dir = dir;
    d.durable.checkpoint_every_ticks = d.durable.checkpoint_every_bytes = -1;
    d.durable.checkpoint_every_seconds = -1;
    if ((rep->fail_line = wr_open(e, &d)) != 0) {
        snprintf(rep->msg, sizeof rep->msg, "wr_open: %s", keel_last_error());
        return;
    }
    WR_FAIL(rep, keel_runtime_step(e->rt) == 0);
    WR_FAIL(rep, query_entities(e->q_money, e->acct, WR_ACCOUNTS) == WR_ACCOUNTS);
    pthread_t th[WR_THREADS];
    wr_arg args[WR_THREADS];
    for (uint32_t i = 0; i < WR_THREADS; i++) {
        args[i] = (wr_arg){e, i};
        WR_FAIL(rep, pthread_create(&th[i], NULL, wr_thread, &args[i]) == 0);
    }
    /* step whenever something was submitted since the last step */
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (e->submitted == seen && e->done < WR_THREADS)
            pthread_cond_wait(&e->cv, &e->mu);
        bool fin = e->done == WR_THREADS;
        seen = e->submitted;
        pthread_mutex_unlock(&e->mu);
        if (fin)
            break;
        int rc = keel_runtime_step(e->rt);
        WR_FAIL(rep, rc == 0);
        if (rc)
            break;
    }
    for (uint32_t i = 0; i < WR_THREADS; i++)
        pthread_join(th[i], NULL);
    keel_runtime_stats st;
    keel_runtime_stats_get(e->rt, &st);
    rep->ok = atomic_load(&e->ok);
    rep->bad = atomic_load(&e->bad);
    rep->first_bad_rc = atomic_load(&e->first_bad_rc);
    rep->fsyncs = st.fsyncs;
    rep->commits = st.commits;
    rep->ticks = keel_runtime_tick(e->rt);
    WR_FAIL(rep, e->err.bad == 0);
    if (crash)
        _exit(0); /* as if killed: every acknowledged ticket must be on disk already */
    wr_close(e);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* Reopen after wr_run: every acknowledged transfer is there, nothing else. */
static void wr_verify(const char *dir, uint32_t per_thread, const wr_report *rep, bool crashed)
{
    ck_assert_msg(rep->fail_line == 0, "workload line %d: %s", rep->fail_line, rep->msg);
    uint64_t n = (uint64_t)WR_THREADS * per_thread;
    ck_assert_msg(rep->ok == n && rep->bad == 0, "%llu tickets acknowledged, %llu failed (first %s)",
                  (unsigned long long)rep->ok, (unsigned long long)rep->bad, keel_strerror(rep->first_bad_rc));
    if (getenv("KEEL_TEST_VERBOSE"))
        fprintf(stderr, "writer: %llu tickets, %llu fsyncs, %llu ticks, %llu commits\n", (unsigned long long)rep->ok,
                (unsigned long long)rep->fsyncs, (unsigned long long)rep->ticks, (unsigned long long)rep->commits);
    /* group commit: fewer syncs than IMMEDIATE commits */
    ck_assert_msg(rep->fsyncs < n, "%llu fsyncs for %llu IMMEDIATE commits: no group commit",
                  (unsigned long long)rep->fsyncs, (unsigned long long)n);
    dir_view v;
    dir_read(dir, &v);
    ck_assert(v.consecutive);
    ck_assert_uint_eq(v.side_txns, n);
    ck_assert_uint_eq(v.side_modes[KEEL_DURABLE_IMMEDIATE], n);
    ck_assert_uint_le(v.kinds[KW_KIND_SIDE] + v.kinds[KW_KIND_SIDES], n);
    dir_view_free(&v);
    wr_env *e = calloc(1, sizeof *e);
    ck_assert_ptr_nonnull(e);
    keel_runtime_desc d = desc_dir(dir, 1, 64, KEEL_DURABLE_GROUP);
    ck_assert_msg(wr_open(e, &d) == 0, "wr_open: %s", keel_last_error());
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(e->rt, &info));
    ck_assert_uint_eq(info.side_txns, n);
    ck_assert_uint_ge(info.tick, 1);
    if (crashed)
        ck_assert_uint_le(info.tick, rep->ticks); /* GROUP ticks may be lost in a crash */
    else
        ck_assert_uint_eq(info.tick, rep->ticks);
    keel_entity acct[WR_ACCOUNTS], clk[2];
    ck_assert_uint_eq(query_entities(e->q_money, acct, WR_ACCOUNTS), WR_ACCOUNTS);
    ck_assert_uint_eq(query_entities(e->q_clock, clk, 2), 1);
    ck_assert_int_eq(get_i64(e->rt, clk[0], e->CLOCK), (int64_t)info.tick); /* ticks are whole */
    int64_t want[WR_ACCOUNTS], sum = 0;
    wr_expected(per_thread, want);
    for (int a = 0; a < WR_ACCOUNTS; a++) {
        int64_t got = get_i64(e->rt, acct[a], e->MONEY);
        ck_assert_msg(got == want[a], "account %d: %lld, expected %lld", a, (long long)got, (long long)want[a]);
        sum += got;
    }
    ck_assert_int_eq(sum, (int64_t)WR_ACCOUNTS * WR_INIT);
    /* and it runs on from there */
    ck_assert_ok(keel_runtime_step(e->rt));
    ck_assert_berr(&e->err);
    wr_close(e);
    free(e);
}

START_TEST(test_writer_transfers_close_reopen)
{
    char dir[256];
    tu_path(dir, sizeof dir, "writer");
    wr_report rep;
    memset(&rep, 0, sizeof rep);
    wr_run(dir, 100, &rep, false);
    wr_verify(dir, 100, &rep, false);
}
END_TEST

/* The same workload in a child process that ends without closing (as if
 * killed) once all tickets returned: acknowledged means on disk. */
START_TEST(test_writer_transfers_crash)
{
    char dir[256];
    tu_path(dir, sizeof dir, "writer-crash");
    wr_report *rep = mmap(NULL, sizeof *rep, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(rep, MAP_FAILED);
    memset(rep, 0, sizeof *rep);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        wr_run(dir, 100, rep, true);
        _exit(1); /* not reached */
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d (line %d: %s)", status,
                  rep->fail_line, rep->msg);
    wr_report copy = *rep;
    munmap(rep, sizeof *rep);
    wr_verify(dir, 100, &copy, true);
}
END_TEST

/* ---- recycling with checkpoints (world/version.c "Recycling") ------------------------ */

/* A world whose VERSIONED a, b (a + b == K) are rewritten every tick by a
 * parallel query system while periodic checkpoints run in the background:
 * publication must not recycle a buffer a running checkpoint still reads.
 * RCK_BULK more entities hold only `bulk`, never written after the spawn:
 * they lengthen every checkpoint's serialisation, so that some
 * publications happen while buffers are pinned (how many depends on the
 * threads' timing: the checks hold either way). Spawned on tick 1 with
 * a = i; after tick T every a is i + T - 1; the state recovered from the
 * last checkpoint and the WAL after it is the same. */
enum { RCK_N = 2000, RCK_BULK = 120000 };
#define RCK_K 1000000000ll

typedef struct rck_world {
    keel_runtime *rt;
    keel_component a, b, bulk;
    keel_query *q;
} rck_world;

static int rck_spawn(keel_ctx *ctx, void *user)
{
    rck_world *r = user;
    if (keel_ctx_tick(ctx) != 1)
        return 0;
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    for (int64_t i = 0; i < RCK_N; i++) {
        int64_t a = i, b = RCK_K - i;
        int rc = keel_cmd_spawn(cb, (keel_init[]){{r->a, &a}, {r->b, &b}}, 2);
        if (rc)
            return rc;
    }
    for (int64_t i = 0; i < RCK_BULK; i++) {
        int rc = keel_cmd_spawn(cb, (keel_init[]){{r->bulk, &i}}, 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int rck_rewrite(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)ctx;
    (void)user;
    int64_t *a = KEEL_COLUMN(it, int64_t, 0), *b = KEEL_COLUMN(it, int64_t, 1);
    const int64_t *a0 = it->prev[0], *b0 = it->prev[1];
    for (uint32_t i = 0; i < it->count; i++) {
        a[i] = a0[i] + 1;
        b[i] = b0[i] - 1;
    }
    return 0;
}

static void rck_open(rck_world *r, const keel_runtime_desc *d)
{
    r->rt = tu_rt_new(*d);
    r->a = reg_i64(r->rt, "a", KEEL_VERSIONED);
    r->b = reg_i64(r->rt, "b", KEEL_VERSIONED);
    r->bulk = reg_i64(r->rt, "bulk", KEEL_VERSIONED);
    ck_assert_ok(keel_query_create(keel_runtime_world(r->rt), &(keel_query_desc){.with = {r->a, r->b}}, &r->q));
    keel_schedule *s = NULL;
    ck_assert_ok(keel_schedule_create(r->rt, &s));
    keel_system_desc rw = {.name = "rewrite", .kind = KEEL_SYSTEM_QUERY, .each_chunk = rck_rewrite,
                           .query = {.with = {r->a, r->b}}, .parallel = true,
                           .access = {.rewrites = {r->a, r->b}}};
    keel_system_desc sp = {.name = "spawn", .run = rck_spawn, .user = r};
    ck_assert_ok(keel_schedule_add_system(s, &rw, NULL));
    ck_assert_ok(keel_schedule_add_system(s, &sp, NULL));
    tu_install(r->rt, s);
}

static void rck_close(rck_world *r)
{
    keel_query_destroy(r->q);
    keel_runtime_close(r->rt);
}

/* Every entity is at tick t: a == i + t - 1 for the i-th value, a + b == K. */
static void rck_expect(const rck_world *r, uint64_t t)
{
    static uint8_t seen[RCK_N];
    memset(seen, 0, sizeof seen);
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(r->q, &it);
    while (keel_iter_next(&it)) {
        const int64_t *a = KEEL_COLUMN(&it, const int64_t, 0), *b = KEEL_COLUMN(&it, const int64_t, 1);
        for (uint32_t k = 0; k < it.count; k++, n++) {
            int64_t i = a[k] - (int64_t)t + 1;
            ck_assert_msg(i >= 0 && i < RCK_N && !seen[i], "tick %llu: a = %lld", (unsigned long long)t,
                          (long long)a[k]);
            seen[i] = 1;
            ck_assert_int_eq(a[k] + b[k], RCK_K);
        }
    }
    ck_assert_uint_eq(n, RCK_N);
}

START_TEST(test_recycle_with_checkpoints)
{
    /* at least TICKS ticks and 4 checkpoints taken: a checkpoint falls due
       every 2 ticks, but one in progress defers the next and yields to the
       steps, so how many ticks 4 take is the threads' timing (CAP: a guard) */
    enum { TICKS = 60, CHECKPOINTS = 4, CAP = 200000, MORE = 10 };
    char dir[256];
    tu_path(dir, sizeof dir, "recycle-ckpt");
    keel_runtime_desc d = desc_dir(dir, 2, 256, KEEL_DURABLE_DEFERRED);
    d.durable.checkpoint_every_ticks = 2;
    rck_world r;
    rck_open(&r, &d);
    ck_assert_ok(keel_runtime_recover(r.rt, NULL));
    uint64_t ticks = 0;
    while (ticks < TICKS || (tu_stats(r.rt).checkpoints < CHECKPOINTS && ticks < CAP)) {
        ck_assert_ok(keel_runtime_step(r.rt));
        if (++ticks >= 2)
            rck_expect(&r, ticks);
    }
    ck_assert_uint_ge(tu_stats(r.rt).checkpoints, CHECKPOINTS);
    ck_assert_ok(keel_flush(r.rt));
    rck_close(&r);

    /* the last checkpoint and the WAL after it give the same state back */
    rck_open(&r, &d);
    keel_recovery info;
    ck_assert_ok(keel_runtime_recover(r.rt, &info));
    ck_assert_uint_eq(info.tick, ticks);
    ck_assert_uint_gt(info.checkpoint_tick, 0);
    rck_expect(&r, ticks);
    for (uint64_t t = ticks + 1; t <= ticks + MORE; t++) {
        ck_assert_ok(keel_runtime_step(r.rt));
        rck_expect(&r, t);
    }
    rck_close(&r);
}
END_TEST

/* ==== suites ========================================================================== */

static TCase *tcase_with_dirs(const char *name, int timeout)
{
    TCase *tc = tcase_create(name);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_set_timeout(tc, timeout);
    return tc;
}

static Suite *dur_api(void)
{
    Suite *s = suite_create("dur_api");
    TCase *tc = tcase_with_dirs("api", 300);
    tcase_add_test(tc, test_reopen_matches_reference);
    tcase_add_test(tc, test_checkpoint_reopen);
    tcase_add_test(tc, test_checkpoint_periodic);
    tcase_add_test(tc, test_incremental_checkpoint);
    tcase_add_test(tc, test_reopen_right_after_checkpoint);
    tcase_add_test(tc, test_checkpoint_many_tables);
    tcase_add_test(tc, test_stats_and_telemetry);
    tcase_add_test(tc, test_threads_are_named);
    tcase_add_test(tc, test_fence_splits_groups);
    tcase_add_test(tc, test_wal_same_on_any_worker_count);
    tcase_add_test(tc, test_flush_deferred_and_no_dir);
    tcase_add_test(tc, test_hooks_first_tick_and_shutdown);
    tcase_add_test(tc, test_writes_before_recover_refused);
    tcase_add_test(tc, test_recover_busy_while_driver_starts);
    tcase_add_test(tc, test_recover_again_after_ticks);
    tcase_add_test(tc, test_durable_lag_while_writer_blocked);
    tcase_add_test(tc, test_side_transactions_share_a_record_while_the_writer_is_busy);
    tcase_add_test(tc, test_side_write_undone_by_a_later_system);
    tcase_add_test(tc, test_idempotent_retry_waits_for_the_original);
    tcase_add_test(tc, test_idempotent_retry_async_waits_for_the_original);
    tcase_add_test(tc, test_steps_are_marked_for_the_checkpoint_thread);
    tcase_add_test(tc, test_fence_between_ticks);
    tcase_add_test(tc, test_idle_ticks_checkpoint);
    tcase_add_test(tc, test_recycle_with_checkpoints);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *dur_recovery(void)
{
    Suite *s = suite_create("dur_recovery");
    TCase *tc = tcase_with_dirs("recovery", 300);
    tcase_add_test(tc, test_corrupt_record);
    tcase_add_test(tc, test_value_row_refused);
    tcase_add_test(tc, test_checkpoint_over_max_entities);
    tcase_add_test(tc, test_wal_over_max_entities);
    tcase_add_test(tc, test_checkpoint_row_refused);
    tcase_add_test(tc, test_checkpoint_slots_claim_refused);
    tcase_add_test(tc, test_change_of_an_unknown_component);
    tcase_add_test(tc, test_schema_extend_and_mismatch);
    tcase_add_test(tc, test_bad_data_dirs);
    tcase_add_test(tc, test_data_dir_is_plain_file);
    tcase_add_test(tc, test_map_growth);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *dur_errors(void)
{
    Suite *s = suite_create("dur_errors");
    TCase *tc = tcase_with_dirs("errors", 300);
    tcase_add_test(tc, test_fatal_injected);
    tcase_add_test(tc, test_fatal_after_acknowledged_immediate);
    tcase_add_test(tc, test_fatal_fence_oom);
    tcase_add_test(tc, test_map_max_enospc);
    tcase_add_test(tc, test_bad_desc);
    tcase_add_test(tc, test_sync_retry_durable);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *dur_writer(void)
{
    Suite *s = suite_create("dur_writer");
    TCase *tc = tcase_with_dirs("writer", 600);
    tcase_add_test(tc, test_writer_transfers_close_reopen);
    tcase_add_test(tc, test_writer_transfers_crash);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(dur_api, dur_recovery, dur_errors, dur_writer)
