/*
 * test_durable.c -- durability: the data directory, the WAL, checkpoints and
 * recovery (keel/durability.h, SPEC §2, §4, §6, §8):
 *
 *   dur_api       open a fresh directory, run a workload with every kind of
 *                 change (spawn, destroy, add, remove, VERSIONED /
 *                 SINGLE_VERSION / TRANSIENT values, tags, side transactions
 *                 in systems and through keel_submit, in each mode), close,
 *                 reopen: the same hash, tick and entity handles as an
 *                 uninterrupted in-memory reference run at every later tick;
 *                 TRANSIENT values empty after open; checkpoints (WAL
 *                 records they cover dropped unless wal_retain; incremental:
 *                 only changed chunks rewritten); keel_uow_flush; stats and
 *                 the telemetry's WAL fields checked against the records on
 *                 disk; on_first_tick after every open; on_shutdown's
 *                 IMMEDIATE side transaction; writes between ticks refused;
 *                 keel_runtime_recover's results and refusals; the durable
 *                 lag while another process holds the LMDB write lock;
 *   dur_recovery  a flipped byte in a WAL record (every copy in data.mdb):
 *                 refused with KEEL_ECORRUPT naming the LSN, nothing on disk
 *                 changed, or dropped with truncate_bad_tail (state = the
 *                 reference at the last complete tick); the stored schema
 *                 (an added component works, a changed one is a clear error
 *                 that touches nothing); bad data directories; map growth;
 *   dur_errors    the fatal latch: injected EIO / ENOSPC on a WAL commit,
 *                 an acknowledged IMMEDIATE commit that outlives the failed
 *                 tick after it, a fence that cannot log its tick, a real
 *                 ENOSPC from a tiny map_max; bad descriptor fields;
 *   dur_writer    8 threads submitting IMMEDIATE transfers while the main
 *                 thread steps: every acknowledged ticket is durable (after
 *                 a normal close, and after a child process that ran the
 *                 same workload died without closing), money is conserved
 *                 and equals the reference arithmetic, group commit.
 *
 * Real files: every test works in its own directory under a mkdtemp base
 * that the suite's unchecked fixture removes (also after a failure). No
 * sleeps as synchronisation, no timing assertions: where the test needs the
 * WAL writer to be stuck it holds the LMDB write lock from a child process.
 * Bodies that run on workers record what they saw; the test thread asserts.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "keel_wal/wal.h"
#include "runtime/runtime_internal.h"

/* ---- temporary directories --------------------------------------------------------- */

static char g_base[128];

static int rm_chmod(const char *path, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    if (flag == FTW_D || flag == FTW_DNR)
        chmod(path, 0700);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

/* Unchecked fixture: runs in the runner process, so the base directory is
 * removed even when a test failed (or crashed) half way. */
static void base_setup(void)
{
    snprintf(g_base, sizeof g_base, "/tmp/keel-durable-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_base));
}

static void base_teardown(void)
{
    if (!g_base[0])
        return;
    nftw(g_base, rm_chmod, 16, FTW_PHYS);
    nftw(g_base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    g_base[0] = 0;
}

/* A path under the base; not created (the runtime creates its directory). */
static void tdir(char *out, size_t n, const char *name)
{
    ck_assert_int_lt(snprintf(out, n, "%s/%s", g_base, name), (int)n);
}

static bool path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void mdb_path(char *out, size_t n, const char *dir)
{
    ck_assert_int_lt(snprintf(out, n, "%s/data.mdb", dir), (int)n);
}

/* The bytes of a file: size and a 64-bit FNV-1a over the content. */
typedef struct fdigest {
    uint64_t size, hash;
} fdigest;

static fdigest file_digest(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    fdigest d = {0, 1469598103934665603ull};
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++)
            d.hash = (d.hash ^ buf[i]) * 1099511628211ull;
        d.size += n;
    }
    fclose(f);
    return d;
}

static fdigest dir_digest(const char *dir)
{
    char p[512];
    mdb_path(p, sizeof p, dir);
    return file_digest(p);
}

#define ck_assert_digest_eq(a, b)                                                                         \
    ck_assert_msg((a).size == (b).size && (a).hash == (b).hash, "data.mdb changed: %llu bytes %016llx -> " \
                  "%llu bytes %016llx", (unsigned long long)(a).size, (unsigned long long)(a).hash,         \
                  (unsigned long long)(b).size, (unsigned long long)(b).hash)

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
} snap_info;

typedef struct dir_view {
    rec_info *r;
    uint64_t n;
    uint64_t kinds[32];
    uint64_t side_modes[4];
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
    kw_store *st = NULL;
    kw_store_desc sd = {.flags = KW_OPEN_READONLY};
    ck_assert_ok(kw_store_open(dir, &sd, &st));
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    kw_rtxn *r = NULL;
    ck_assert_ok(kw_read_begin(st, &r));
    kw_walit *it = NULL;
    ck_assert_ok(kw_wal_iter(r, 0, &it));
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
        if (h.kind == KW_KIND_SIDE) {
            const void *p;
            ck_assert_ok(kw_record_payload(c, rec, &h, &p));
            kw_cursor cur = kw_cursor_make(p, h.raw_len);
            kw_get_u64(&cur);
            ri->side_mode = kw_get_u32(&cur);
            ck_assert(!cur.bad);
            if (ri->side_mode < 4)
                v->side_modes[ri->side_mode]++;
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
    kw_read_end(r);
    kw_codec_destroy(c);
    kw_store_close(st);
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

/* Flip byte `at` of every copy of the record's bytes in the file, as an
 * offline attacker (or a bad disk) would; LMDB may hold stale copies of a
 * page, so all of them. Returns the number of copies. */
static uint32_t flip_copies(const char *path, const void *needle, size_t n, size_t at)
{
    int fd = open(path, O_RDWR);
    ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size ? size : 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(pread(fd, buf, size, 0), (ssize_t)size);
    uint32_t copies = 0;
    for (size_t off = 0; off + n <= size;) {
        unsigned char *p = memmem(buf + off, size - off, needle, n);
        if (!p)
            break;
        p[at] ^= 0x5a;
        copies++;
        off = (size_t)(p - buf) + n;
    }
    ck_assert_int_eq(pwrite(fd, buf, size, 0), (ssize_t)size);
    ck_assert_int_eq(fsync(fd), 0);
    close(fd);
    free(buf);
    return copies;
}

/* A copy of the record with LSN lsn. */
static void *record_copy(const char *dir, uint64_t lsn, size_t *len)
{
    kw_store *st = NULL;
    kw_store_desc sd = {.flags = KW_OPEN_READONLY};
    ck_assert_ok(kw_store_open(dir, &sd, &st));
    kw_rtxn *r = NULL;
    ck_assert_ok(kw_read_begin(st, &r));
    kw_walit *it = NULL;
    ck_assert_ok(kw_wal_iter(r, lsn, &it));
    uint64_t got = 0;
    const void *rec = NULL;
    ck_assert_int_eq(kw_wal_next(it, &got, &rec, len), 1);
    ck_assert_uint_eq(got, lsn);
    void *copy = malloc(*len);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, rec, *len);
    kw_wal_iter_end(it);
    kw_read_end(r);
    kw_store_close(st);
    return copy;
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

static keel_runtime *rt_create(const keel_runtime_desc *d)
{
    keel_runtime *rt = NULL;
    ck_assert_ok(keel_runtime_create(d, &rt));
    ck_assert_ptr_nonnull(rt);
    return rt;
}

static keel_runtime_stats stats_of(const keel_runtime *rt)
{
    keel_runtime_stats st;
    memset(&st, 0xab, sizeof st);
    keel_runtime_stats_get(rt, &st);
    return st;
}

static void install(keel_runtime *rt, keel_schedule *s)
{
    ck_assert_ok(keel_schedule_build(s));
    ck_assert_ok(keel_runtime_set_schedule(rt, s));
}

static bool has_lsn_text(const char *msg, uint64_t lsn)
{
    char want[40];
    snprintf(want, sizeof want, "LSN %llu", (unsigned long long)lsn);
    for (const char *p = strstr(msg, want); p; p = strstr(p + 1, want))
        if (p[strlen(want)] < '0' || p[strlen(want)] > '9')
            return true;
    return false;
}

static const keel_field i64_fields[] = {{.name = "v", .type = KEEL_I64, .offset = 0, .count = 0}};

static keel_component reg_i64(keel_runtime *rt, const char *name, keel_discipline disc)
{
    keel_component c = 0;
    keel_component_desc cd = {.name = name, .size = 8, .discipline = disc, .fields = i64_fields, .field_count = 1};
    ck_assert_ok(keel_component_register(keel_runtime_world(rt), &cd, &c));
    return c;
}

static int cmp_entity(const void *a, const void *b)
{
    keel_entity x = *(const keel_entity *)a, y = *(const keel_entity *)b;
    return x < y ? -1 : x > y;
}

/* Entities matching q (world read), sorted, at most max. */
static uint32_t query_entities(const keel_query *q, keel_entity *out, uint32_t max)
{
    uint32_t n = 0;
    keel_iter it;
    keel_query_iter(q, &it);
    while (keel_iter_next(&it))
        for (uint32_t r = 0; r < it.count; r++)
            if (n < max)
                out[n++] = it.entities[r];
    qsort(out, n, sizeof *out, cmp_entity);
    return n;
}

static int64_t get_i64(keel_runtime *rt, keel_entity e, keel_component c)
{
    int64_t v = -999999;
    ck_assert_ok(keel_get(keel_runtime_world(rt), e, c, &v));
    return v;
}

/* ---- the workload W: every kind of change ------------------------------------------ */

typedef struct pos_t {
    int64_t x;
    int64_t born;              /* tick of the spawn */
} pos_t;

static const keel_field pos_fields[] = {
    {.name = "x", .type = KEEL_I64, .offset = 0, .count = 0},
    {.name = "born", .type = KEEL_I64, .offset = 8, .count = 0},
};

/* What bodies saw go wrong (they may run on workers: the test thread asserts). */
typedef struct berr {
    uint32_t bad;
    char msg[320];
} berr;

static void berr_note(berr *b, int line, const char *what, int rc)
{
    if (b->bad++ == 0)
        snprintf(b->msg, sizeof b->msg, "line %d: %s: %s (%s)", line, what, keel_strerror(rc), keel_last_error());
}

#define B_CHECK(b, expr)                                \
    do {                                                \
        int b_rc_ = (expr);                             \
        if (b_rc_)                                      \
            berr_note((b), __LINE__, #expr, b_rc_);     \
    } while (0)

#define ck_assert_berr(b) ck_assert_msg((b)->bad == 0, "%u bad checks in the bodies, first: %s", (b)->bad, (b)->msg)

typedef struct xfer {
    keel_entity from, to;
    int64_t amount;
    keel_component c;
} xfer;

/* A transfer in a side transaction (closures and on_shutdown). */
static int closure_xfer(keel_side_txn *tx, void *arg)
{
    xfer *x = arg;
    int64_t a = 0, b = 0;
    int rc = keel_side_get(tx, x->from, x->c, &a);
    rc = rc ? rc : keel_side_get(tx, x->to, x->c, &b);
    if (rc)
        return rc;
    a -= x->amount;
    b += x->amount;
    rc = keel_side_set(tx, x->from, x->c, &a);
    return rc ? rc : keel_side_set(tx, x->to, x->c, &b);
}

#define W_MAXT 40

typedef struct wworld {
    keel_runtime *rt;
    keel_component POS, HP, TMP, FLAG, MONEY;
    keel_query *q_pos, *q_money, *q_tmp;
    bool no_side;              /* no side transactions (bank off, no closures) */
    uint32_t sys_runs;
    uint32_t hook_calls, hook_rows, hook_nonzero, hook_sys_before;
    uint64_t hook_tick;
    berr err;
    uint32_t bank_commits[4];  /* by mode */
    xfer xf[W_MAXT + 1];       /* the closure of each tick */
    keel_durability xf_mode[W_MAXT + 1];
    uint32_t shutdown_calls;
    int shutdown_ret;
    xfer shutdown_xfer;
} wworld;

#define W_CHECK(w, expr) B_CHECK(&(w)->err, expr)

/* on_first_tick: rebuild the TRANSIENT column (tmp = 7 everywhere). */
static int w_hook(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->hook_calls++;
    w->hook_tick = keel_ctx_tick(ctx);
    w->hook_sys_before = w->sys_runs;
    keel_iter it;
    keel_txn_iter(ctx, w->q_tmp, &it);
    while (keel_txn_next(ctx, &it)) {
        int64_t *v = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            w->hook_nonzero += v[r] != 0;
            v[r] = 7;
            w->hook_rows++;
        }
    }
    return 0;
}

/* life: moves, damages, tags, kills and spawns, decided by handle and tick
 * only (never by TRANSIENT values), so the durable state is a function of
 * the history. */
static int w_life(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->sys_runs++;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    keel_iter it;
    keel_txn_iter(ctx, w->q_pos, &it);
    while (keel_txn_next(ctx, &it)) {
        pos_t *p = it.columns[0];
        for (uint32_t r = 0; r < it.count; r++) {
            keel_entity e = it.entities[r];
            uint64_t idx = KEEL_ENTITY_INDEX(e);
            p[r].x += (int64_t)idx + 1;
            if ((idx + t) % 3 == 0) { /* SINGLE_VERSION, in place */
                int64_t hp = 0;
                W_CHECK(w, keel_txn_get(ctx, e, w->HP, &hp));
                hp += (int64_t)t;
                W_CHECK(w, keel_txn_set(ctx, e, w->HP, &hp));
            }
            if ((idx + t) % 4 == 0) { /* TRANSIENT: never durable */
                int64_t v = 1000 + (int64_t)t;
                W_CHECK(w, keel_txn_set(ctx, e, w->TMP, &v));
            }
            if ((idx * 7 + t) % 11 == 0)
                W_CHECK(w, keel_cmd_destroy(cb, e));
            else if ((idx + t) % 5 == 0)
                W_CHECK(w, keel_cmd_add(cb, e, w->FLAG, NULL));
            else if ((idx + t) % 5 == 2)
                W_CHECK(w, keel_cmd_remove(cb, e, w->FLAG));
        }
    }
    for (int k = 0; k < 3; k++) {
        pos_t p = {(int64_t)t * 100 + k, (int64_t)t};
        int64_t hp = (int64_t)t, tmp = 5;
        keel_init in[4] = {{w->POS, &p}, {w->HP, &hp}, {w->TMP, &tmp}, {w->FLAG, NULL}};
        W_CHECK(w, keel_cmd_spawn(cb, in, k == 1 ? 4 : 3));
    }
    if (t == 1) { /* the bank's two accounts */
        int64_t m = 1000;
        keel_init in[1] = {{w->MONEY, &m}};
        W_CHECK(w, keel_cmd_spawn(cb, in, 1));
        W_CHECK(w, keel_cmd_spawn(cb, in, 1));
    }
    return 0;
}

/* bank: one side transaction per tick, the mode cycling IMMEDIATE, GROUP,
 * DEFERRED. */
static int w_bank(keel_ctx *ctx, void *user)
{
    wworld *w = user;
    w->sys_runs++;
    keel_entity a[8];
    if (w->no_side || query_entities(w->q_money, a, 8) < 2)
        return 0;
    uint64_t t = keel_ctx_tick(ctx);
    keel_durability mode = (keel_durability)(1 + t % 3);
    keel_entity from = a[t % 2], to = a[1 - t % 2];
    int64_t amount = (int64_t)(t % 7) + 1, fv = 0, tv = 0;
    keel_side_txn *tx = NULL;
    W_CHECK(w, keel_side_txn_begin(ctx, mode, &tx));
    if (!tx)
        return 0;
    W_CHECK(w, keel_side_get(tx, from, w->MONEY, &fv));
    W_CHECK(w, keel_side_get(tx, to, w->MONEY, &tv));
    fv -= amount;
    tv += amount;
    W_CHECK(w, keel_side_set(tx, from, w->MONEY, &fv));
    W_CHECK(w, keel_side_set(tx, to, w->MONEY, &tv));
    int rc = keel_side_txn_commit(tx);
    if (rc)
        berr_note(&w->err, __LINE__, "keel_side_txn_commit", rc);
    else
        w->bank_commits[mode]++;
    return 0;
}

static int w_shutdown(keel_side_txn *tx, void *arg)
{
    wworld *w = arg;
    w->shutdown_calls++;
    if (w->shutdown_ret)
        return w->shutdown_ret;
    return closure_xfer(tx, &w->shutdown_xfer);
}

static void w_register(wworld *w)
{
    keel_world *wd = keel_runtime_world(w->rt);
    keel_component_desc pos = {.name = "pos", .size = sizeof(pos_t), .fields = pos_fields, .field_count = 2};
    ck_assert_ok(keel_component_register(wd, &pos, &w->POS));
    w->HP = reg_i64(w->rt, "hp", KEEL_SINGLE_VERSION);
    w->TMP = reg_i64(w->rt, "tmp", KEEL_TRANSIENT);
    keel_component_desc flag = {.name = "flag"};
    ck_assert_ok(keel_component_register(wd, &flag, &w->FLAG));
    w->MONEY = reg_i64(w->rt, "money", KEEL_VERSIONED);
    keel_query_desc qp = {.with = {w->POS}}, qm = {.with = {w->MONEY}}, qt = {.with = {w->TMP}};
    ck_assert_ok(keel_query_create(wd, &qp, &w->q_pos));
    ck_assert_ok(keel_query_create(wd, &qm, &w->q_money));
    ck_assert_ok(keel_query_create(wd, &qt, &w->q_tmp));
}

static void w_install(wworld *w)
{
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc life = {.name = "life", .kind = KEEL_SYSTEM_CALLBACK, .run = w_life, .user = w,
                             .access = {.writes = {w->POS, w->HP, w->TMP}}};
    keel_system_desc bank = {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = w_bank, .user = w,
                             .access = {.side_writes = {w->MONEY}}, .after = {"life"}};
    add_sys(s, &life);
    add_sys(s, &bank);
    install(w->rt, s);
}

/* Create the runtime (hooks wired to w), register, install. */
static void w_open(wworld *w, const keel_runtime_desc *base, bool with_shutdown)
{
    keel_runtime_desc d = *base;
    d.on_first_tick = w_hook;
    d.hook_user = w;
    if (with_shutdown) {
        d.durable.on_shutdown = w_shutdown;
        d.durable.shutdown_arg = w;
    }
    w->rt = rt_create(&d);
    w_register(w);
    w_install(w);
}

static void w_close(wworld *w)
{
    keel_query_destroy(w->q_pos);
    keel_query_destroy(w->q_money);
    keel_query_destroy(w->q_tmp);
    w->q_pos = w->q_money = w->q_tmp = NULL;
    keel_runtime_close(w->rt);
    w->rt = NULL;
}

static wworld *w_new(bool no_side)
{
    wworld *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->no_side = no_side;
    return w;
}

/* Reset what bodies recorded (a reopened runtime starts counting afresh). */
static void w_reset(wworld *w, bool no_side)
{
    memset(w, 0, sizeof *w);
    w->no_side = no_side;
}

/* Tick t: queue this tick's closure (once the accounts exist), step, wait
 * for the ticket. */
static void w_drive(wworld *w, uint64_t t)
{
    ck_assert_uint_le(t, W_MAXT);
    ck_assert_uint_eq(keel_runtime_tick(w->rt), t - 1);
    keel_ticket *tk = NULL;
    keel_entity a[8];
    if (!w->no_side && query_entities(w->q_money, a, 8) >= 2) {
        w->xf[t] = (xfer){a[0], a[1], (int64_t)t, w->MONEY};
        w->xf_mode[t] = (keel_durability)(1 + (t + 1) % 3);
        ck_assert_ok(keel_submit(w->rt, closure_xfer, &w->xf[t], w->xf_mode[t], &tk));
    }
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_msg(w->err.bad == 0, "tick %llu: %u bad checks in the bodies, first: %s", (unsigned long long)t,
                  w->err.bad, w->err.msg);
    if (tk) {
        ck_assert_ok(keel_ticket_wait(tk, -1));
        keel_ticket_release(tk);
    }
}

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

static void w_reference(wref *ref, uint64_t ticks, int32_t workers, bool no_side)
{
    wworld *w = w_new(no_side);
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
