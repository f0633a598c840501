/*
 * test_idem.c -- idempotency keys of side transactions and the durability
 * waits (keel/txn.h, keel/durability.h; docs/transactions.md "Idempotency
 * keys", docs/durability.md "Waiting for durability"):
 *
 *   idem_keys   the key set itself (txn/keys.c): window expiry by ticks at
 *               its exact boundaries, re-commits after expiry, growth and
 *               deletion checked against a naive model, the snapshot a
 *               checkpoint writes;
 *   idem_run    keys in a runtime: a key committed twice (in memory and with
 *               a data directory) applies once and the second commit returns
 *               KEEL_EALREADY naming the key, whatever it read; a keyed
 *               read-only transaction; keys across close/reopen, across a
 *               checkpoint that deleted the keyed record, across the window;
 *               threads racing one key apply it exactly once; the SIDE
 *               record's key on disk and in keel-wal dump / verify;
 *   idem_crash  a child process commits keyed IMMEDIATE transactions and is
 *               SIGKILLed; the parent reopens and runs every key again: each
 *               applies exactly once (against an oracle of the balances);
 *   dur_wait    keel_wait_durable, keel_side_txn_commit_lsn, keel_ticket_lsn,
 *               keel_ticket_wait_durable and keel_runtime_tick_lsn: their
 *               LSNs, waiting for DEFERRED and GROUP records, timeouts, the
 *               fatal latch and bad arguments.
 *
 * No sleeps as synchronisation and no timing assertions: a stuck writer is
 * made with a delay failpoint many times longer than the timeout tested.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "test_util.h"
#include "txn/txn_internal.h"

static bool has(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

/* ---- idem_keys: the set ------------------------------------------------------------------- */

START_TEST(test_keys_window_boundaries)
{
    txn_keys k;
    keys_init(&k, 10);
    ck_assert_uint_eq(k.window, 10);
    ck_assert(!keys_find(&k, 5, 100));
    ck_assert_ok(keys_reserve(&k, 1));
    keys_add(&k, 5, 100, 31);
    const txn_key *e;
    /* remembered from its tick through tick + window - 1, forgotten at tick + window */
    for (uint64_t now = 100; now < 110; now++) {
        ck_assert_msg((e = keys_find(&k, 5, now)), "forgotten at %" PRIu64, now);
        ck_assert_uint_eq(e->tick, 100);
        ck_assert_uint_eq(e->lsn, 31); /* the record that holds it: what a retry waits for */
    }
    ck_assert(!keys_find(&k, 5, 110));
    ck_assert(keys_find(&k, 5, 99)); /* a tick ahead of now (replayed): as young as can be */
    ck_assert(!keys_find(&k, 6, 100));
    ck_assert(!keys_find(&k, 0, 100));
    keys_expire(&k, 109);
    ck_assert_uint_eq(keys_count(&k), 1);
    keys_expire(&k, 110);
    ck_assert_uint_eq(keys_count(&k), 0);
    /* committed again after it expired: a new window from the new tick */
    ck_assert_ok(keys_reserve(&k, 1));
    keys_add(&k, 5, 110, 0);
    ck_assert((e = keys_find(&k, 5, 119)));
    ck_assert_uint_eq(e->tick, 110);
    ck_assert_uint_eq(e->lsn, 0);
    ck_assert(!keys_find(&k, 5, 120));
    keys_fini(&k);

    keys_init(&k, 0);
    ck_assert_uint_eq(k.window, TXN_KEYS_DEFAULT_WINDOW);
    ck_assert_uint_eq(TXN_KEYS_DEFAULT_WINDOW, 216000);
    keys_fini(&k);
    /* window 1: only the tick it committed in */
    keys_init(&k, 1);
    ck_assert_ok(keys_reserve(&k, 1));
    keys_add(&k, 9, 7, 0);
    ck_assert(keys_find(&k, 9, 7));
    ck_assert(!keys_find(&k, 9, 8));
    keys_fini(&k);
}
END_TEST

/* Random keys over ticks, against a plain array of (key, last tick). */
START_TEST(test_keys_against_model)
{
    enum { W = 50, TICKS = 2000, UNIVERSE = 3000 };
    static uint64_t model[UNIVERSE + 1]; /* key -> tick + 1 of its last commit, 0 = never */
    memset(model, 0, sizeof model);
    txn_keys k;
    keys_init(&k, W);
    uint64_t rng = 42;
    for (uint64_t tick = 1; tick <= TICKS; tick++) {
        keys_expire(&k, tick);
        uint32_t n = tu_rng_below(&rng, 6);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t key = 1 + tu_rng_below(&rng, UNIVERSE);
            bool live = model[key] && tick - (model[key] - 1) < W;
            const txn_key *e = keys_find(&k, key, tick);
            ck_assert_int_eq(e != NULL, live);
            if (live) {
                ck_assert_uint_eq(e->tick, model[key] - 1);
                ck_assert_uint_eq(e->lsn, e->tick * 7 + key); /* the record of its last commit */
                continue; /* KEEL_EALREADY: nothing recorded */
            }
            ck_assert_ok(keys_reserve(&k, 1));
            keys_add(&k, key, tick, tick * 7 + key);
            model[key] = tick + 1;
        }
        if (tick % 97 == 0) { /* every key, and the snapshot */
            uint32_t live_n = 0;
            for (uint64_t key = 1; key <= UNIVERSE; key++) {
                bool live = model[key] && tick - (model[key] - 1) < W;
                live_n += live;
                ck_assert_int_eq(keys_find(&k, key, tick) != NULL, live);
            }
            ck_assert_uint_eq(keys_count(&k), live_n);
            txn_key *snap;
            uint32_t sn;
            ck_assert_ok(keys_snapshot(&k, tick, &snap, &sn));
            ck_assert_uint_eq(sn, live_n);
            for (uint32_t i = 0; i < sn; i++) {
                ck_assert_uint_eq(snap[i].tick, model[snap[i].key] - 1);
                if (i)
                    ck_assert_uint_le(snap[i - 1].tick, snap[i].tick); /* commit order */
            }
            free(snap);
        }
    }
    keys_fini(&k);
}
END_TEST

/* The keyed SIDE payload and SNAP_KEYS, encoded and decoded in wal/: round
 * trips and the malformed forms they refuse. */
START_TEST(test_keys_wal_codec)
{
    kw_buf b = {0};
    uint32_t flags = 0;
    int64_t v = 5;
    ck_assert_ok(kw_side_begin(&b, 9, KEEL_DURABLE_IMMEDIATE, 1));
    ck_assert_ok(kw_side_put_write(&b, 0x100000002ull, 3, 8, &v));
    ck_assert_ok(kw_side_end(&b, 0, &flags)); /* no key: nothing added */
    ck_assert_uint_eq(flags, 0);
    size_t unkeyed = b.len;
    ck_assert_ok(kw_side_end(&b, 0xabcdef0123ull, &flags));
    ck_assert_uint_eq(flags, KW_FLAG_KEY);
    ck_assert_uint_eq(b.len, unkeyed + 8);
    kw_header h = {.kind = KW_KIND_SIDE, .lsn = 7, .flags = flags, .raw_len = (uint32_t)b.len};
    kw_decoder d;
    kw_change ch;
    ck_assert_ok(kw_decode_record(&d, &h, b.p, NULL));
    ck_assert_uint_eq(d.side_key, 0xabcdef0123ull);
    ck_assert_uint_eq(d.side_seq, 9);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_uint_eq(ch.entity, 0x100000002ull);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    /* without the flag the same bytes are refused, not misread */
    h.flags = 0;
    ck_assert_ok(kw_decode_record(&d, &h, b.p, NULL));
    ck_assert_uint_eq(d.side_key, 0);
    ck_assert_int_eq(kw_decode_next(&d, &ch), 1);
    ck_assert_rc(kw_decode_next(&d, &ch), KEEL_ECORRUPT);
    /* key 0 and a payload too short for the key are corrupt */
    h.flags = KW_FLAG_KEY;
    memset(b.p + b.len - 8, 0, 8);
    ck_assert_rc(kw_decode_record(&d, &h, b.p, NULL), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "LSN 7") && has(keel_last_error(), "key is 0"), "%s", keel_last_error());
    h.raw_len = 20;
    ck_assert_rc(kw_decode_record(&d, &h, b.p, NULL), KEEL_ECORRUPT);
    /* the flag means nothing on other kinds */
    kw_buf lc = {0};
    ck_assert_ok(kw_lifecycle_begin(&lc));
    kw_lifecycle_end(&lc, 0);
    kw_header hl = {.kind = KW_KIND_LIFECYCLE, .lsn = 8, .flags = KW_FLAG_KEY, .raw_len = (uint32_t)lc.len};
    ck_assert_ok(kw_decode_record(&d, &hl, lc.p, NULL));
    ck_assert_int_eq(kw_decode_next(&d, &ch), 0);
    kw_buf_free(&lc);

    uint64_t keys[3] = {11, 12, 0xffffffffffffffffull}, ticks[3] = {1, 1, 9};
    ck_assert_ok(kw_snap_keys_encode(&b, 3, keys, ticks));
    ck_assert_uint_eq(b.len, 4 + 3 * 16);
    kw_snap_keys sk;
    ck_assert_ok(kw_snap_keys_decode(b.p, b.len, &sk));
    ck_assert_uint_eq(sk.n, 3);
    for (uint32_t i = 0; i < 3; i++) {
        uint64_t k, t;
        kw_snap_keys_get(&sk, i, &k, &t);
        ck_assert_uint_eq(k, keys[i]);
        ck_assert_uint_eq(t, ticks[i]);
    }
    ck_assert_rc(kw_snap_keys_decode(b.p, b.len - 1, &sk), KEEL_ECORRUPT);
    ck_assert_rc(kw_snap_keys_decode(b.p, 2, &sk), KEEL_ECORRUPT);
    keys[1] = 0;
    ck_assert_ok(kw_snap_keys_encode(&b, 3, keys, ticks));
    ck_assert_rc(kw_snap_keys_decode(b.p, b.len, &sk), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "key 1 is 0"), "%s", keel_last_error());
    ck_assert_ok(kw_snap_keys_encode(&b, 0, NULL, NULL));
    ck_assert_ok(kw_snap_keys_decode(b.p, b.len, &sk));
    ck_assert_uint_eq(sk.n, 0);
    ck_assert_str_eq(kw_kind_name(KW_KIND_SNAP_KEYS), "snap_keys");
    kw_buf_free(&b);
}
END_TEST

static Suite *idem_keys(void)
{
    Suite *s = suite_create("idem_keys");
    TCase *tc = tcase_create("keys");
    tcase_add_test(tc, test_keys_window_boundaries);
    tcase_add_test(tc, test_keys_against_model);
    tcase_add_test(tc, test_keys_wal_codec);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- a small economy: accounts with a balance --------------------------------------------- */

#define NACC 8
#define INIT 1000

static const keel_field bal_fields[] = {{.name = "v", .type = KEEL_I64, .offset = 0, .count = 0}};

typedef struct econ {
    keel_runtime *rt;
    keel_component bal;
} econ;

/* Account i: spawned i-th by the first open's hook (index i, generation 1). */
static keel_entity acc(uint32_t i)
{
    return (keel_entity)1 << 32 | i;
}

static int hook_accounts(keel_ctx *ctx, void *user)
{
    econ *e = user;
    if (keel_alive(keel_ctx_world(ctx), acc(0)))
        return 0; /* recovered */
    int64_t v = INIT;
    for (uint32_t i = 0; i < NACC; i++) {
        keel_init in = {e->bal, &v};
        int rc = keel_cmd_spawn(keel_ctx_commands(ctx), &in, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* A runtime over dir (NULL: in memory) with the accounts after one step. */
static void econ_open(econ *e, const char *dir, uint64_t window, keel_durable_desc extra)
{
    keel_durable_desc dd = extra;
    dd.dir = dir;
    dd.idempotency_window_ticks = window;
    e->rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .durable = dd,
                                          .on_first_tick = hook_accounts, .hook_user = e});
    e->bal = tu_reg(keel_runtime_world(e->rt), "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    tu_install(e->rt, sched_new(e->rt));
    ck_assert_ok(keel_runtime_step(e->rt));
    ck_assert(keel_alive(keel_runtime_world(e->rt), acc(NACC - 1)));
}

static int64_t bal(econ *e, uint32_t i)
{
    int64_t v = -1;
    ck_assert_ok(keel_get(keel_runtime_world(e->rt), acc(i), e->bal, &v));
    return v;
}

/* A keyed transfer, run as a submitted closure. */
typedef struct xfer {
    econ *e;
    uint64_t key;
    uint32_t from, to;
    int64_t amount;
} xfer;

static int closure_xfer(keel_side_txn *tx, void *arg)
{
    xfer *x = arg;
    int64_t a, b;
    int rc = keel_side_txn_set_key(tx, x->key);
    if (!rc)
        rc = keel_side_get(tx, acc(x->from), x->e->bal, &a);
    if (!rc)
        rc = keel_side_get(tx, acc(x->to), x->e->bal, &b);
    a -= x->amount;
    b += x->amount;
    if (!rc)
        rc = keel_side_set(tx, acc(x->from), x->e->bal, &a);
    if (!rc)
        rc = keel_side_set(tx, acc(x->to), x->e->bal, &b);
    return rc;
}

/* Submit x, step, and return the ticket's result. */
static int run_xfer(econ *e, xfer *x, keel_durability mode)
{
    keel_ticket *t = NULL;
    ck_assert_ok(keel_submit(e->rt, closure_xfer, x, mode, &t));
    ck_assert_ok(keel_runtime_step(e->rt));
    int rc = keel_ticket_wait(t, -1);
    keel_ticket_release(t);
    return rc;
}

/* ---- idem_run ------------------------------------------------------------------------------ */

static void twice_in_one_run(const char *dir)
{
    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){0});
    xfer x = {&e, 4242, 0, 1, 10};
    ck_assert_ok(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE));
    ck_assert_int_eq(bal(&e, 0), INIT - 10);
    ck_assert_int_eq(bal(&e, 1), INIT + 10);
    keel_runtime_stats before = tu_stats(e.rt);
    /* the same key again (a retry, a duplicated request): nothing applied */
    ck_assert_rc(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY);
    ck_assert_msg(has(keel_last_error(), "key 4242") && has(keel_last_error(), "already committed"), "%s",
                  keel_last_error());
    ck_assert_int_eq(bal(&e, 0), INIT - 10);
    ck_assert_int_eq(bal(&e, 1), INIT + 10);
    keel_runtime_stats after = tu_stats(e.rt);
    ck_assert_uint_eq(after.commits - before.commits, 0);
    ck_assert_uint_eq(after.conflicts - before.conflicts, 0);
    /* another key applies; key 0 means none, so it applies every time */
    xfer y = {&e, 4243, 1, 2, 5}, z = {&e, 0, 2, 3, 1};
    ck_assert_ok(run_xfer(&e, &y, KEEL_DURABLE_GROUP));
    ck_assert_ok(run_xfer(&e, &z, KEEL_DURABLE_DEFERRED));
    ck_assert_ok(run_xfer(&e, &z, KEEL_DURABLE_DEFERRED));
    ck_assert_int_eq(bal(&e, 1), INIT + 5);
    ck_assert_int_eq(bal(&e, 2), INIT + 5 - 2);
    ck_assert_int_eq(bal(&e, 3), INIT + 2);
    ck_assert_rc(run_xfer(&e, &y, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY);
    ck_assert_int_eq(bal(&e, 1), INIT + 5);
    keel_runtime_close(e.rt);
}

START_TEST(test_key_twice_in_memory)
{
    twice_in_one_run(NULL);
}
END_TEST

START_TEST(test_key_twice_durable)
{
    char dir[512];
    tu_path(dir, sizeof dir, "twice");
    twice_in_one_run(dir);
    tu_rmtree(dir);
}
END_TEST

/* Inside a system: the key is checked before the read set, so a
 * transaction whose read moved gets KEEL_EALREADY, not KEEL_ECONFLICT (its
 * LSN one at or after the key's commit); through keel_side_txn_commit_async
 * a ticket that completes with KEEL_EALREADY; argument errors. */
static struct {
    econ *e;
    int rc_first, rc_stale, rc_nulltx, rc_nulllsn, rc_ro, rc_async;
    uint64_t lsn_first, lsn_ro;
    keel_ticket *again;        /* key 77 committed again through keel_side_txn_commit_async */
} g_sys;

static int sys_keyed(keel_ctx *ctx, void *user)
{
    (void)user;
    econ *e = g_sys.e;
    if (keel_ctx_tick(ctx) != 3)
        return 0;
    keel_side_txn *a = NULL, *b = NULL, *c = NULL;
    int64_t v;
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &a);
    rc = rc ? rc : keel_side_txn_set_key(a, 77);
    rc = rc ? rc : keel_side_get(a, acc(4), e->bal, &v);
    v += 1;
    rc = rc ? rc : keel_side_set(a, acc(4), e->bal, &v);
    g_sys.rc_first = rc ? rc : keel_side_txn_commit_lsn(a, &g_sys.lsn_first);
    /* b reads acc 5, c changes it, then b commits with the committed key */
    if (keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &b) || keel_side_get(b, acc(5), e->bal, &v))
        return KEEL_EINVAL;
    if (keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &c) || keel_side_set(c, acc(5), e->bal, &v) ||
        keel_side_txn_commit(c))
        return KEEL_EINVAL;
    keel_side_txn_set_key(b, 77);
    uint64_t lsn = 0;
    g_sys.rc_stale = keel_side_txn_commit_lsn(b, &lsn);
    if (lsn < g_sys.lsn_first)
        g_sys.rc_stale = KEEL_EINVAL; /* nothing logged: an LSN at or after the key's commit, to wait for */
    /* through commit_async: a ticket that completes with KEEL_EALREADY */
    keel_side_txn *again = NULL;
    if (keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &again) || keel_side_txn_set_key(again, 77))
        return KEEL_EINVAL;
    g_sys.rc_async = keel_side_txn_commit_async(again, &g_sys.again);
    g_sys.rc_nulltx = keel_side_txn_set_key(NULL, 1);
    keel_side_txn *d = NULL;
    if (keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &d))
        return KEEL_EINVAL;
    g_sys.rc_nulllsn = keel_side_txn_commit_lsn(d, NULL); /* aborts d */
    /* a keyed read-only transaction logs its key */
    keel_side_txn *ro = NULL;
    if (keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &ro) || keel_side_get(ro, acc(6), e->bal, &v))
        return KEEL_EINVAL;
    keel_side_txn_set_key(ro, 78);
    g_sys.rc_ro = keel_side_txn_commit_lsn(ro, &g_sys.lsn_ro);
    return 0;
}

START_TEST(test_key_checked_first_and_read_only_keys)
{
    char dir[512];
    tu_path(dir, sizeof dir, "sys");
    econ e;
    g_sys.e = &e;
    keel_durable_desc dd = {.dir = dir};
    e.rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .durable = dd,
                                         .on_first_tick = hook_accounts, .hook_user = &e});
    e.bal = tu_reg(keel_runtime_world(e.rt), "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    keel_schedule *s = sched_new(e.rt);
    keel_system_desc sd = {.name = "keyed", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_keyed,
                           .access = {.side_writes = {e.bal}}};
    add_sys(s, &sd);
    tu_install(e.rt, s);
    tu_step_n(e.rt, 3);
    ck_assert_ok(g_sys.rc_first);
    ck_assert_uint_gt(g_sys.lsn_first, 0);
    ck_assert_uint_ge(keel_durable_lsn(e.rt), g_sys.lsn_first); /* IMMEDIATE: durable at return */
    ck_assert_rc(g_sys.rc_stale, KEEL_EALREADY);
    ck_assert_ok(g_sys.rc_async);
    ck_assert_rc(keel_ticket_wait(g_sys.again, -1), KEEL_EALREADY);
    ck_assert_rc(keel_ticket_wait_durable(g_sys.again, -1), KEEL_EALREADY);
    ck_assert_uint_eq(keel_ticket_lsn(g_sys.again), 0); /* it logged nothing */
    keel_ticket_release(g_sys.again);
    ck_assert_rc(g_sys.rc_nulltx, KEEL_EINVAL);
    ck_assert_rc(g_sys.rc_nulllsn, KEEL_EINVAL);
    ck_assert_ok(g_sys.rc_ro);
    ck_assert_uint_gt(g_sys.lsn_ro, g_sys.lsn_first);
    ck_assert_int_eq(bal(&e, 4), INIT + 1);
    keel_runtime_close(e.rt);

    /* on disk: the keyed SIDE records carry flag KEY and their key, the
     * read-only one with no writes */
    tu_wal_reader w;
    tu_wal_open(&w, dir, 1);
    uint64_t lsn, seen = 0;
    const void *rec;
    size_t len;
    kw_codec_ctx *cc = NULL;
    ck_assert_ok(kw_codec_create(&(kw_codec_desc){0}, &cc));
    while (kw_wal_next(w.it, &lsn, &rec, &len) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(rec, len, &h));
        if (h.kind != KW_KIND_SIDE || !(h.flags & KW_FLAG_KEY))
            continue;
        const void *p;
        ck_assert_ok(kw_record_payload(cc, rec, &h, &p));
        kw_decoder d;
        ck_assert_ok(kw_decode_record(&d, &h, p, NULL));
        kw_change ch;
        uint32_t n = 0;
        while (kw_decode_next(&d, &ch) == 1)
            n++;
        if (lsn == g_sys.lsn_first) {
            ck_assert_uint_eq(d.side_key, 77);
            ck_assert_uint_eq(n, 1);
            seen |= 1;
        } else if (lsn == g_sys.lsn_ro) {
            ck_assert_uint_eq(d.side_key, 78);
            ck_assert_uint_eq(n, 0);
            seen |= 2;
        }
        /* a reader that ignores the flag refuses the record instead of misreading it */
        ck_assert_rc(kw_decode_begin(&d, h.kind, lsn, p, h.raw_len, NULL), KEEL_OK);
        int rc;
        while ((rc = kw_decode_next(&d, &ch)) == 1)
            ;
        ck_assert_rc(rc, KEEL_ECORRUPT);
    }
    ck_assert_uint_eq(seen, 3);
    kw_codec_destroy(cc);
    tu_wal_close(&w);

    /* keel-wal shows the key and verifies the directory */
    char lsnarg[32];
    snprintf(lsnarg, sizeof lsnarg, "%" PRIu64, g_sys.lsn_first);
    tu_run r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"dump", dir, "--json", NULL});
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(has(r.out, "\"key\":77") && has(r.out, "\"key\":78"), "%s", r.out);
    tu_run_free(&r);
    r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"dump", dir, NULL});
    ck_assert_msg(r.status == 0 && has(r.out, "key=77"), "%s%s", r.out, r.err);
    tu_run_free(&r);
    /* the tools that decode every record read keyed ones */
    static const char *const readers[] = {"verify", "stats", "replay"};
    for (int i = 0; i < 3; i++) {
        r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){readers[i], dir, i == 2 ? "--to-tick" : NULL, "3", NULL});
        ck_assert_msg(r.status == 0, "keel-wal %s: exit %d: %s%s", readers[i], r.status, r.out, r.err);
        tu_run_free(&r);
    }
    tu_rmtree(dir);
}
END_TEST

/* Keys survive close and reopen, and a checkpoint that deleted the keyed
 * record from the WAL; the window counts ticks across reopens too. */
START_TEST(test_key_across_reopen_and_checkpoint)
{
    char dir[512];
    tu_path(dir, sizeof dir, "reopen");
    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){.checkpoint_every_ticks = -1, .checkpoint_every_bytes = -1,
                                               .checkpoint_every_seconds = -1});
    xfer a = {&e, 1001, 0, 1, 7}, b = {&e, 1002, 2, 3, 9};
    ck_assert_ok(run_xfer(&e, &a, KEEL_DURABLE_IMMEDIATE));
    ck_assert_ok(run_xfer(&e, &b, KEEL_DURABLE_GROUP));
    keel_runtime_close(e.rt);

    econ_open(&e, dir, 0, (keel_durable_desc){.checkpoint_every_ticks = -1});
    ck_assert_rc(run_xfer(&e, &a, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY);
    ck_assert_rc(run_xfer(&e, &b, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY);
    ck_assert_int_eq(bal(&e, 0), INIT - 7);
    ck_assert_int_eq(bal(&e, 3), INIT + 9);
    /* a checkpoint covers both records and deletes them (wal_retain off) */
    ck_assert_ok(keel_checkpoint(e.rt));
    keel_runtime_close(e.rt);
    tu_wal_reader w;
    tu_wal_open(&w, dir, 1);
    uint64_t lsn;
    const void *rec;
    size_t len;
    uint32_t keyed = 0;
    while (kw_wal_next(w.it, &lsn, &rec, &len) == 1) {
        kw_header h;
        ck_assert_ok(kw_record_check(rec, len, &h));
        keyed += h.kind == KW_KIND_SIDE && (h.flags & KW_FLAG_KEY);
    }
    ck_assert_uint_eq(keyed, 0);
    const void *kv;
    size_t kl;
    ck_assert_ok(kw_get(w.r, KW_DB_SNAP, KW_SNAP_KEYS_KEY, 1, &kv, &kl));
    tu_wal_close(&w);
    tu_run r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", dir, NULL});
    ck_assert_msg(r.status == 0, "%s%s", r.out, r.err);
    tu_run_free(&r);

    econ_open(&e, dir, 0, (keel_durable_desc){0});
    ck_assert_rc(run_xfer(&e, &a, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY);
    ck_assert_rc(run_xfer(&e, &b, KEEL_DURABLE_DEFERRED), KEEL_EALREADY);
    ck_assert_int_eq(bal(&e, 0), INIT - 7);
    ck_assert_int_eq(bal(&e, 1), INIT + 7);
    ck_assert_int_eq(bal(&e, 2), INIT - 9);
    ck_assert_int_eq(bal(&e, 3), INIT + 9);
    keel_runtime_close(e.rt);
    tu_rmtree(dir);
}
END_TEST

static int fill_snap_keys(kw_wtxn *t, void *arg)
{
    const kw_buf *rec = arg;
    return kw_put(t, KW_DB_SNAP, KW_SNAP_KEYS_KEY, 1, rec->p, rec->len);
}

/* A damaged SNAP_KEYS (a key 0 under a valid CRC): keel-wal verify reports
 * it, and recovery refuses the checkpoint instead of forgetting keys. */
START_TEST(test_key_damaged_snapshot_refused)
{
    char dir[512];
    tu_path(dir, sizeof dir, "badkeys");
    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){.checkpoint_every_ticks = -1});
    xfer a = {&e, 3003, 0, 1, 7};
    ck_assert_ok(run_xfer(&e, &a, KEEL_DURABLE_IMMEDIATE));
    ck_assert_ok(keel_checkpoint(e.rt));
    uint64_t ckpt_tick = keel_runtime_tick(e.rt);
    keel_runtime_close(e.rt);
    uint64_t keys[1] = {0}, ticks[1] = {ckpt_tick};
    kw_buf payload = {0}, rec = {0};
    ck_assert_ok(kw_snap_keys_encode(&payload, 1, keys, ticks));
    kw_codec_ctx *cc = NULL;
    ck_assert_ok(kw_codec_create(&(kw_codec_desc){0}, &cc));
    ck_assert_ok(kw_record_build(cc, &rec, KW_KIND_SNAP_KEYS, 0, ckpt_tick, 0, payload.p, payload.len));
    kw_store *st = NULL;
    ck_assert_ok(kw_store_open(dir, &(kw_store_desc){0}, &st));
    ck_assert_ok(kw_store_write(st, fill_snap_keys, &rec));
    kw_store_close(st);
    kw_codec_destroy(cc);
    kw_buf_free(&payload);
    kw_buf_free(&rec);

    tu_run r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", dir, NULL});
    ck_assert_msg(r.status == 1 && has(r.out, "snap K") && has(r.out, "key 0 is 0"), "exit %d: %s%s", r.status, r.out,
                  r.err);
    tu_run_free(&r);
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .durable = {.dir = dir}});
    tu_reg(keel_runtime_world(rt), "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    ck_assert_rc(keel_runtime_recover(rt, NULL), KEEL_ECORRUPT);
    ck_assert_msg(has(keel_last_error(), "checkpoint") && has(keel_last_error(), "key 0 is 0"), "%s",
                  keel_last_error());
    keel_runtime_close(rt);
    tu_rmtree(dir);
}
END_TEST

/* A key older than the window applies again: exactly at tick + window, in
 * memory and across a reopen (the record's tick is what counts). */
static void window_expiry(const char *dir)
{
    enum { W = 4 };
    econ e;
    econ_open(&e, dir, W, (keel_durable_desc){0});
    xfer x = {&e, 55, 0, 1, 3};
    ck_assert_ok(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE));
    uint64_t t1 = keel_runtime_tick(e.rt); /* the tick the closure committed in */
    if (dir) { /* the key's tick comes back from the WAL */
        keel_runtime_close(e.rt);
        econ_open(&e, dir, W, (keel_durable_desc){0}); /* its first step: tick t1 + 1 */
    }
    while (keel_runtime_tick(e.rt) + 1 < t1 + W - 1)
        ck_assert_ok(keel_runtime_step(e.rt));
    ck_assert_rc(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY); /* at tick t1 + W - 1 */
    ck_assert_uint_eq(keel_runtime_tick(e.rt), t1 + W - 1);
    ck_assert_int_eq(bal(&e, 0), INIT - 3);
    ck_assert_ok(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE)); /* at tick t1 + W */
    ck_assert_uint_eq(keel_runtime_tick(e.rt), t1 + W);
    ck_assert_int_eq(bal(&e, 0), INIT - 6);
    ck_assert_rc(run_xfer(&e, &x, KEEL_DURABLE_IMMEDIATE), KEEL_EALREADY); /* a new window */
    keel_runtime_close(e.rt);
}

START_TEST(test_key_window_expiry)
{
    window_expiry(NULL);
    char dir[512];
    tu_path(dir, sizeof dir, "window");
    window_expiry(dir);
    tu_rmtree(dir);
}
END_TEST

/* Every chunk task of a parallel query system commits the same key at
 * once: exactly one applies. */
static struct {
    keel_component bal, row;
    _Atomic uint32_t ok, already, other;
} g_race;

static int race_chunk(keel_ctx *ctx, const keel_iter *it, void *user)
{
    (void)user;
    for (uint32_t r = 0; r < it->count; r++) {
        keel_side_txn *tx = NULL;
        int64_t v = 0;
        int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_DEFAULT, &tx);
        rc = rc ? rc : keel_side_txn_set_key(tx, 0xfeed0000ull + keel_ctx_tick(ctx));
        rc = rc ? rc : keel_side_get(tx, acc(0), g_race.bal, &v);
        v += 1;
        rc = rc ? rc : keel_side_set(tx, acc(0), g_race.bal, &v);
        rc = rc ? (keel_side_txn_abort(tx), rc) : keel_side_txn_commit(tx);
        atomic_fetch_add(rc == 0 ? &g_race.ok : rc == KEEL_EALREADY ? &g_race.already : &g_race.other, 1);
    }
    return 0;
}

START_TEST(test_key_race_applies_once)
{
    enum { ROWS = 256, TICKS = 20 };
    econ e = {0};
    e.rt = tu_rt_new((keel_runtime_desc){.world = {.chunk_rows = 16}, .workers = 2, .tick_rate_hz = -1,
                                         .on_first_tick = hook_accounts, .hook_user = &e});
    keel_world *w = keel_runtime_world(e.rt);
    e.bal = g_race.bal = tu_reg(w, "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    g_race.row = tu_reg(w, "row", 8, KEEL_VERSIONED, bal_fields, 1);
    keel_schedule *s = sched_new(e.rt);
    keel_system_desc d = {.name = "racers", .kind = KEEL_SYSTEM_QUERY, .each_chunk = race_chunk,
                          .query = {.with = {g_race.row}}, .parallel = true, .min_chunk_rows = 16,
                          .access = {.side_writes = {g_race.bal}}};
    add_sys(s, &d);
    tu_install(e.rt, s);
    ck_assert_ok(keel_runtime_step(e.rt)); /* the accounts first (indices 0..NACC-1); no rows yet */
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    int64_t zero = 0;
    for (int i = 0; i < ROWS; i++)
        ck_assert_ok(keel_cmd_spawn(cb, &(keel_init){g_race.row, &zero}, 1));
    tu_cmdbuf_apply_created(cb, ROWS, NULL);
    for (int t = 1; t <= TICKS; t++) {
        ck_assert_ok(keel_runtime_step(e.rt));
        ck_assert_uint_eq(atomic_load(&g_race.ok), (uint32_t)t); /* one per tick: each tick has its own key */
        ck_assert_uint_eq(atomic_load(&g_race.already), (uint32_t)t * (ROWS - 1));
        ck_assert_uint_eq(atomic_load(&g_race.other), 0);
        ck_assert_int_eq(bal(&e, 0), INIT + t);
    }
    keel_runtime_close(e.rt);
}
END_TEST

static Suite *idem_run(void)
{
    Suite *s = suite_create("idem_run");
    TCase *tc = tcase_create("run");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_add_test(tc, test_key_twice_in_memory);
    tcase_add_test(tc, test_key_twice_durable);
    tcase_add_test(tc, test_key_checked_first_and_read_only_keys);
    tcase_add_test(tc, test_key_across_reopen_and_checkpoint);
    tcase_add_test(tc, test_key_damaged_snapshot_refused);
    tcase_add_test(tc, test_key_window_expiry);
    tcase_add_test(tc, test_key_race_applies_once);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- idem_crash: kill -9 ------------------------------------------------------------------- */

#define CRASH_KEYS 120
#define CRASH_KILL_AFTER 25

/* Key k moves k units from account k % NACC to account (k + 3) % NACC. */
static xfer crash_xfer(econ *e, uint64_t k)
{
    return (xfer){e, k, (uint32_t)(k % NACC), (uint32_t)((k + 3) % NACC), (int64_t)k};
}

/* The child: commits keys 1.. (three closures per step, IMMEDIATE) and
 * writes each acknowledged key to fd; the parent kills it. Each step takes
 * a byte from `tokens` first: the parent hands out steps enough to pass
 * CRASH_KILL_AFTER, never all of them, so the kill cannot come after a
 * clean end however the two are scheduled. */
#define CRASH_STEPS_GIVEN ((CRASH_KILL_AFTER + 6) / 3 + 1)
static void crash_child(const char *dir, int fd, int tokens)
{
    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){.checkpoint_every_ticks = 7});
    static xfer xs[CRASH_KEYS + 1];
    for (uint64_t k = 1; k <= CRASH_KEYS; k += 3) {
        keel_ticket *t[3] = {0};
        char token;
        if (read(tokens, &token, 1) != 1)
            _exit(6);
        for (uint64_t j = 0; j < 3 && k + j <= CRASH_KEYS; j++) {
            xs[k + j] = crash_xfer(&e, k + j);
            if (keel_submit(e.rt, closure_xfer, &xs[k + j], KEEL_DURABLE_IMMEDIATE, &t[j]))
                _exit(2);
        }
        if (keel_runtime_step(e.rt))
            _exit(3);
        for (uint64_t j = 0; j < 3 && t[j]; j++) {
            if (keel_ticket_wait(t[j], -1))
                _exit(4);
            keel_ticket_release(t[j]);
            uint64_t acked = k + j;
            if (write(fd, &acked, sizeof acked) != sizeof acked)
                _exit(5);
        }
    }
    _exit(0);
}

START_TEST(test_key_exactly_once_across_kill)
{
    char dir[512];
    tu_path(dir, sizeof dir, "kill");
    int pfd[2], tok[2];
    ck_assert_int_eq(pipe(pfd), 0);
    ck_assert_int_eq(pipe(tok), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        close(tok[1]);
        crash_child(dir, pfd[1], tok[0]);
    }
    close(pfd[1]);
    close(tok[0]);
    char tokens[CRASH_STEPS_GIVEN] = {0};
    ck_assert_int_eq(write(tok[1], tokens, sizeof tokens), (ssize_t)sizeof tokens);
    uint64_t acked = 0, k;
    while (acked < CRASH_KILL_AFTER && read(pfd[0], &k, sizeof k) == sizeof k) {
        ck_assert_uint_eq(k, acked + 1); /* acknowledged in order */
        acked = k;
    }
    kill(pid, SIGKILL);
    int status = tu_wait(pid);
    close(pfd[0]);
    close(tok[1]);
    ck_assert_msg(status == 128 + SIGKILL, "the child ended with %d before it was killed", status);
    ck_assert_uint_eq(acked, CRASH_KILL_AFTER);

    /* run every key again: the applied ones (a prefix, at least the
     * acknowledged ones) return KEEL_EALREADY, the rest apply */
    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){0});
    uint64_t applied_before = 0;
    bool in_prefix = true;
    for (k = 1; k <= CRASH_KEYS; k++) {
        xfer x = crash_xfer(&e, k);
        int rc = run_xfer(&e, &x, k % 2 ? KEEL_DURABLE_IMMEDIATE : KEEL_DURABLE_GROUP);
        if (rc == KEEL_EALREADY) {
            ck_assert_msg(in_prefix, "key %" PRIu64 " was applied after a key that was not", k);
            applied_before = k;
        } else {
            ck_assert_rc(rc, KEEL_OK);
            in_prefix = false;
        }
    }
    ck_assert_uint_ge(applied_before, acked);
    /* the oracle: every key applied exactly once */
    int64_t want[NACC], total = 0;
    for (int i = 0; i < NACC; i++)
        want[i] = INIT;
    for (k = 1; k <= CRASH_KEYS; k++) {
        want[k % NACC] -= (int64_t)k;
        want[(k + 3) % NACC] += (int64_t)k;
    }
    for (int i = 0; i < NACC; i++) {
        ck_assert_msg(bal(&e, (uint32_t)i) == want[i], "account %d holds %lld, every key once gives %lld", i,
                      (long long)bal(&e, (uint32_t)i), (long long)want[i]);
        total += bal(&e, (uint32_t)i);
    }
    ck_assert_int_eq(total, (int64_t)NACC * INIT);
    keel_runtime_close(e.rt);
    tu_rmtree(dir);
}
END_TEST

static Suite *idem_crash(void)
{
    Suite *s = suite_create("idem_crash");
    TCase *tc = tcase_create("crash");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_add_test(tc, test_key_exactly_once_across_kill);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- dur_wait ------------------------------------------------------------------------------ */

START_TEST(test_wait_lsns_and_arguments)
{
    /* without a data directory: nothing to wait for */
    econ m;
    econ_open(&m, NULL, 0, (keel_durable_desc){0});
    ck_assert_ok(keel_wait_durable(m.rt, 0, 0));
    ck_assert_ok(keel_wait_durable(m.rt, 12345, 0));
    ck_assert_uint_eq(keel_runtime_tick_lsn(m.rt), 0);
    keel_ticket *t = NULL;
    xfer x = {&m, 0, 0, 1, 1};
    ck_assert_ok(keel_submit(m.rt, closure_xfer, &x, KEEL_DURABLE_GROUP, &t));
    ck_assert_uint_eq(keel_ticket_lsn(t), 0);
    ck_assert_ok(keel_runtime_step(m.rt));
    ck_assert_ok(keel_ticket_wait_durable(t, -1));
    ck_assert_uint_eq(keel_ticket_lsn(t), 0);
    keel_ticket_release(t);
    /* a closure not run yet: its ticket times out, then completes when it runs */
    ck_assert_ok(keel_submit(m.rt, closure_xfer, &x, KEEL_DURABLE_DEFERRED, &t));
    ck_assert_rc(keel_ticket_wait_durable(t, 0), KEEL_ETIMEDOUT);
    ck_assert_msg(has(keel_last_error(), "not completed"), "%s", keel_last_error());
    ck_assert_ok(keel_runtime_step(m.rt));
    ck_assert_ok(keel_ticket_wait_durable(t, 0));
    keel_ticket_release(t);
    keel_runtime_close(m.rt);
    ck_assert_rc(keel_wait_durable(NULL, 1, 0), KEEL_EINVAL);
    ck_assert_rc(keel_ticket_wait_durable(NULL, 0), KEEL_EINVAL);
    ck_assert_uint_eq(keel_ticket_lsn(NULL), 0);
    ck_assert_uint_eq(keel_runtime_tick_lsn(NULL), 0);

    char dir[512];
    tu_path(dir, sizeof dir, "lsns");
    keel_runtime *rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .durable = {.dir = dir}});
    tu_reg(keel_runtime_world(rt), "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    ck_assert_rc(keel_wait_durable(rt, 1, 0), KEEL_EINVAL); /* not open yet */
    keel_runtime_close(rt);

    econ e;
    econ_open(&e, dir, 0, (keel_durable_desc){.checkpoint_every_ticks = -1});
    uint64_t tl = keel_runtime_tick_lsn(e.rt);
    ck_assert_uint_gt(tl, 0);
    ck_assert_ok(keel_wait_durable(e.rt, tl, -1));
    ck_assert_uint_ge(keel_durable_lsn(e.rt), tl);
    ck_assert_rc(keel_wait_durable(e.rt, tl + 1000, 0), KEEL_EINVAL);
    ck_assert_msg(has(keel_last_error(), "never handed out"), "%s", keel_last_error());
    /* each mode's ticket carries its record's LSN; every one can be waited durable */
    static xfer xs[3];
    keel_ticket *tk[3];
    for (int i = 0; i < 3; i++) {
        xs[i] = (xfer){&e, 500 + (uint64_t)i, 0, 1, 1};
        ck_assert_ok(keel_submit(e.rt, closure_xfer, &xs[i], (keel_durability)(i + 1), &tk[i]));
    }
    ck_assert_ok(keel_runtime_step(e.rt));
    uint64_t prev = tl;
    for (int i = 0; i < 3; i++) {
        ck_assert_ok(keel_ticket_wait(tk[i], -1));
        uint64_t l = keel_ticket_lsn(tk[i]);
        ck_assert_uint_gt(l, prev); /* closures commit in order, before the tick's marker */
        prev = l;
        ck_assert_ok(keel_ticket_wait_durable(tk[i], -1));
        ck_assert_uint_ge(keel_durable_lsn(e.rt), l);
        keel_ticket_release(tk[i]);
    }
    ck_assert_uint_gt(keel_runtime_tick_lsn(e.rt), prev); /* the marker follows the tick's side records */
    ck_assert_ok(keel_wait_durable(e.rt, keel_runtime_tick_lsn(e.rt), -1));
    /* a failed commit's ticket: its error, LSN 0 */
    ck_assert_ok(keel_submit(e.rt, closure_xfer, &xs[0], KEEL_DURABLE_GROUP, &tk[0]));
    ck_assert_ok(keel_runtime_step(e.rt));
    ck_assert_rc(keel_ticket_wait_durable(tk[0], -1), KEEL_EALREADY);
    ck_assert_uint_eq(keel_ticket_lsn(tk[0]), 0);
    keel_ticket_release(tk[0]);
    keel_runtime_close(e.rt);
    tu_rmtree(dir);
}
END_TEST

/* DEFERRED records are held by the writer: keel_wait_durable and a
 * DEFERRED ticket's durable wait ask for the sync (no periodic sync
 * needed), and time out while the writer is stuck. */
static struct {
    econ *e;
    uint64_t lsn;
    int rc;
    keel_ticket *async;
} g_def;

static int sys_deferred(keel_ctx *ctx, void *user)
{
    (void)user;
    keel_side_txn *tx = NULL;
    int64_t v = 0;
    int rc = keel_side_txn_begin(ctx, KEEL_DURABLE_DEFERRED, &tx);
    rc = rc ? rc : keel_side_get(tx, acc(2), g_def.e->bal, &v);
    v++;
    rc = rc ? rc : keel_side_set(tx, acc(2), g_def.e->bal, &v);
    g_def.rc = rc ? rc : keel_side_txn_commit_lsn(tx, &g_def.lsn);
    if (!g_def.async) {
        keel_side_txn *b = NULL;
        if (!keel_side_txn_begin(ctx, KEEL_DURABLE_DEFERRED, &b) && !keel_side_get(b, acc(3), g_def.e->bal, &v)) {
            v++;
            if (keel_side_set(b, acc(3), g_def.e->bal, &v) || keel_side_txn_commit_async(b, &g_def.async))
                g_def.rc = KEEL_EINVAL;
        }
    }
    return 0;
}

START_TEST(test_wait_deferred_timeout_and_fatal)
{
    if (!keel_failpoints_compiled())
        return;
    char dir[512];
    tu_path(dir, sizeof dir, "deferred");
    econ e;
    g_def.e = &e;
    g_def.async = NULL;
    keel_durable_desc dd = {.dir = dir, .checkpoint_every_ticks = -1};
    e.rt = tu_rt_new((keel_runtime_desc){.workers = 1, .tick_rate_hz = -1, .durability = KEEL_DURABLE_DEFERRED,
                                         .durable = dd, .on_first_tick = hook_accounts, .hook_user = &e});
    e.bal = tu_reg(keel_runtime_world(e.rt), "balance", 8, KEEL_VERSIONED, bal_fields, 1);
    keel_schedule *s = sched_new(e.rt);
    keel_system_desc sd = {.name = "deferred", .kind = KEEL_SYSTEM_CALLBACK, .run = sys_deferred,
                           .access = {.side_writes = {e.bal}}};
    add_sys(s, &sd);
    tu_install(e.rt, s);
    ck_assert_ok(keel_runtime_step(e.rt));
    ck_assert_ok(g_def.rc);
    ck_assert_uint_gt(g_def.lsn, 0);
    ck_assert_ok(keel_ticket_wait(g_def.async, -1)); /* DEFERRED: complete at commit */
    uint64_t alsn = keel_ticket_lsn(g_def.async);
    /* the next record, or the same one when it joined the first before
     * the writer took that (side transactions queued together share one) */
    ck_assert_uint_ge(alsn, g_def.lsn);
    ck_assert_uint_le(alsn, g_def.lsn + 1);
    /* a writer stuck far longer than the timeouts asked for */
    ck_assert_ok(keel_failpoints_set("wal.before_commit=delay:3000@1"));
    uint64_t tl = keel_runtime_tick_lsn(e.rt);
    ck_assert_uint_gt(tl, alsn);
    if (keel_durable_lsn(e.rt) < tl) { /* held (unless the writer's 1 s window passed meanwhile) */
        ck_assert_rc(keel_wait_durable(e.rt, tl, 1000000), KEEL_ETIMEDOUT);
        ck_assert_msg(has(keel_last_error(), "not durable yet"), "%s", keel_last_error());
        ck_assert_rc(keel_ticket_wait_durable(g_def.async, 1000000), KEEL_ETIMEDOUT);
    }
    ck_assert_ok(keel_wait_durable(e.rt, g_def.lsn, -1));
    ck_assert_ok(keel_ticket_wait_durable(g_def.async, -1));
    ck_assert_ok(keel_wait_durable(e.rt, tl, -1));
    ck_assert_uint_ge(keel_durable_lsn(e.rt), tl);
    keel_ticket_release(g_def.async);
    g_def.async = NULL;
    ck_assert_ok(keel_failpoints_set(NULL));

    /* the next tick's records cannot be written: the waits report the latch */
    ck_assert_ok(keel_runtime_step(e.rt));
    ck_assert_ok(g_def.rc);
    keel_ticket *held = g_def.async;
    ck_assert_ptr_nonnull(held);
    ck_assert_ok(keel_failpoints_set("wal.before_commit=eio"));
    uint64_t l2 = keel_runtime_tick_lsn(e.rt);
    if (keel_durable_lsn(e.rt) < keel_ticket_lsn(held)) { /* held (unless the writer's 1 s window passed) */
        ck_assert_rc(keel_wait_durable(e.rt, l2, -1), KEEL_EFATAL);
        ck_assert_rc(keel_ticket_wait_durable(held, -1), KEEL_EFATAL);
        ck_assert_ok(keel_ticket_wait(held, 0)); /* it committed: only its durability failed */
        ck_assert_int_eq(keel_runtime_fatal(e.rt), KEEL_EIO);
    }
    ck_assert_ok(keel_wait_durable(e.rt, tl, -1)); /* durable before the latch: still on disk */
    ck_assert_ok(keel_failpoints_set(NULL));
    keel_ticket_release(held);
    keel_runtime_close(e.rt);
    tu_rmtree(dir);
}
END_TEST

static Suite *dur_wait(void)
{
    Suite *s = suite_create("dur_wait");
    TCase *tc = tcase_create("wait");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_add_test(tc, test_wait_lsns_and_arguments);
    tcase_add_test(tc, test_wait_deferred_timeout_and_fatal);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(idem_keys, idem_run, idem_crash, dur_wait)
