/*
 * test_walcli.c -- the keel-wal tool (info, dump, verify, stats, tail,
 * backup and the argument and directory handling), run as a child process
 * against data directories the runtime produced.
 *
 * The workload (W, 11 ticks, one worker, no checkpoint unless asked) makes
 * every kind of record with values the tests know exactly:
 *   tick 1   spawn E0..E3 with acct, pos, link (acct_of(i), pos_of(i))
 *   tick t   (2..11) acct.coins of the entity at index t % 4 := 1000*t + index
 *            (skipped at tick 7: index 3 is free then)
 *   tick 3   a side transaction: E0.coins -= 7, E1.coins += 7
 *   tick 4   link of E0 := {E2, -4, 4, -1, 200}
 *   tick 5   destroy E3        tick 6  add the tag `marked` to E0
 *   tick 7   remove it         tick 8  spawn E4 (slot 3 again, generation 2)
 * so the WAL holds: 1 schema, 12 tick_commit (tick 1 has an empty HOOK unit
 * first), 9 tick_chunk, 5 lifecycle, 1 side = 28 records, LSN 1..28. The
 * tick_chunk of tick 3 also holds E0's and E1's rows: the fence logs the
 * rows that differ from the tick's start, and the side transaction changed
 * them during the tick.
 *
 * keel-wal's path comes from CMake (KEEL_WAL_BIN). Output is read through
 * pipes, never a terminal, so the TTY-only progress must stay off: every
 * successful run is checked to leave stderr empty. No sleeps: tail -f is
 * synchronised by the lines it prints, a backup held at a failpoint's
 * delay by its nanosleep.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/keel.h"
#include "keel_test.h"
#include "keel_wal/wal.h"
#include "test_util.h"

#ifndef KEEL_WAL_BIN
#error "KEEL_WAL_BIN (the keel-wal executable) must be defined by the build"
#endif

/* ---- directories and running keel-wal (test_util.h) ------------------------------------ */

/* The fixture's base is shared by the tests of a case (each runs in its own
 * forked process): the pid keeps their directories apart. */
static void tdir(char *out, size_t n, const char *name)
{
    char own[128];
    ck_assert_int_lt(snprintf(own, sizeof own, "%s-%d", name, (int)getpid()), (int)sizeof own);
    tu_path(out, n, own);
}

/* keel-wal with args (NULL-terminated): stdout and stderr captured. */
static tu_run wal_argv(const char *const *args)
{
    return tu_run_argv(KEEL_WAL_BIN, args);
}

#define wal(...) wal_argv((const char *const[]){__VA_ARGS__, NULL})

/* A run that must succeed quietly (no progress or messages in a pipe). */
static tu_run wal_ok_argv(const char *const *args)
{
    tu_run r = wal_argv(args);
    ck_assert_msg(r.status == 0, "keel-wal %s %s exited %d: %s", args[0], args[1] ? args[1] : "", r.status, r.err);
    ck_assert_msg(r.errlen == 0, "keel-wal %s wrote to stderr in a pipe: %s", args[0], r.err);
    return r;
}

#define wal_ok(...) wal_ok_argv((const char *const[]){__VA_ARGS__, NULL})

/* ---- reading the output: lines and a minimal JSON reader ---------------------------------- */

/* The next line of *p (NUL-terminated copy in buf), false at the end. */
static bool next_line(const char **p, char *buf, size_t n)
{
    if (!**p)
        return false;
    const char *e = strchr(*p, '\n');
    size_t len = e ? (size_t)(e - *p) : strlen(*p);
    ck_assert_uint_lt(len, n);
    memcpy(buf, *p, len);
    buf[len] = 0;
    *p += len + (e ? 1 : 0);
    return true;
}

static const char *js_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

static const char *js_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    for (; *p && *p != '"'; p++) {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\' && !*++p)
            return NULL;
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *js_digits(const char *p)
{
    if (!isdigit((unsigned char)*p))
        return NULL;
    while (isdigit((unsigned char)*p))
        p++;
    return p;
}

static const char *js_number(const char *p)
{
    if (*p == '-')
        p++;
    if (!(p = js_digits(p)))
        return NULL;
    if (*p == '.' && !(p = js_digits(p + 1)))
        return NULL;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        p = js_digits(p);
    }
    return p;
}

/* One JSON value at p; the end of it, or NULL when it is not JSON. */
static const char *js_value(const char *p, int depth)
{
    p = js_ws(p);
    if (depth > 32)
        return NULL;
    if (*p == '{' || *p == '[') {
        bool obj = *p == '{';
        char close = obj ? '}' : ']';
        p = js_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (obj) {
                if (!(p = js_string(p)))
                    return NULL;
                p = js_ws(p);
                if (*p++ != ':')
                    return NULL;
            }
            if (!(p = js_value(p, depth + 1)))
                return NULL;
            p = js_ws(p);
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
            p = js_ws(p);
        }
    }
    if (*p == '"')
        return js_string(p);
    if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))
        return p + 4;
    if (!strncmp(p, "false", 5))
        return p + 5;
    return js_number(p);
}

static void assert_json(const char *text)
{
    const char *e = js_value(text, 0);
    ck_assert_msg(e && !*js_ws(e), "not one JSON value: %.300s", text);
}

/* The unsigned number after the first "key": in s (the top-level keys come first). */
static uint64_t js_u64(const char *s, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    ck_assert_msg(p != NULL, "no %s in %.300s", k, s);
    return strtoull(p + strlen(k), NULL, 10);
}

static bool js_has(const char *s, const char *fragment)
{
    return strstr(s, fragment) != NULL;
}

/* The JSON string after the first "key": (copied into buf). */
static const char *js_str(const char *s, const char *key, char *buf, size_t n)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":\"", key);
    const char *p = strstr(s, k);
    ck_assert_msg(p != NULL, "no %s in %.300s", k, s);
    p += strlen(k);
    const char *e = strchr(p, '"');
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_lt((size_t)(e - p), n);
    memcpy(buf, p, (size_t)(e - p));
    buf[e - p] = 0;
    return buf;
}

/* ---- the workload --------------------------------------------------------------------------- */

typedef struct w_acct {
    int64_t coins;
    uint32_t level;
    uint8_t vip;
    char code[3];
} w_acct;

typedef struct w_pos {
    double x;
    float v[2];
} w_pos;

typedef struct w_link {
    keel_entity target;
    int16_t delta;
    uint16_t n;
    int8_t s;
    uint8_t b;
    uint8_t pad[2];
} w_link;

static const keel_field acct_fields[] = {
    {.name = "coins", .type = KEEL_I64, .offset = 0},
    {.name = "level", .type = KEEL_U32, .offset = 8},
    {.name = "vip", .type = KEEL_BOOL, .offset = 12},
    {.name = "code", .type = KEEL_BYTES, .offset = 13, .count = 3},
};
static const keel_field pos_fields[] = {
    {.name = "x", .type = KEEL_F64, .offset = 0},
    {.name = "v", .type = KEEL_F32, .offset = 8, .count = 2},
};
static const keel_field link_fields[] = {
    {.name = "target", .type = KEEL_ENTITY, .offset = 0},
    {.name = "delta", .type = KEEL_I16, .offset = 8},
    {.name = "n", .type = KEEL_U16, .offset = 10},
    {.name = "s", .type = KEEL_I8, .offset = 12},
    {.name = "b", .type = KEEL_U8, .offset = 13},
    {.name = "pad", .type = KEEL_BYTES, .offset = 14, .count = 2},
};

#define W_TICKS 11

typedef struct wl {
    keel_runtime *rt;
    keel_component ACCT, POS, LINK, MARK;
    keel_entity e[5];          /* E0..E3, then E4 in slot 3 */
    uint32_t bad;
    char msg[256];
} wl;

#define WL_CHECK(w, expr)                                                                           \
    do {                                                                                            \
        int wl_rc_ = (expr);                                                                        \
        if (wl_rc_ && (w)->bad++ == 0)                                                              \
            snprintf((w)->msg, sizeof (w)->msg, "%s: %s (%s)", #expr, keel_strerror(wl_rc_), keel_last_error()); \
    } while (0)

static w_acct acct_of(uint32_t i)
{
    return (w_acct){.coins = 100 * (int64_t)i, .level = i, .vip = (uint8_t)(i % 2), .code = {'a', 'b', (char)('0' + i)}};
}

static w_pos pos_of(uint32_t i)
{
    return (w_pos){.x = i + 0.5, .v = {(float)i * 0.25f, -(float)i}};
}

static void spawn(wl *w, keel_cmdbuf *cb, uint32_t i)
{
    w_acct a = acct_of(i);
    w_pos p = pos_of(i);
    w_link l = {0};
    keel_init in[3] = {{w->ACCT, &a}, {w->POS, &p}, {w->LINK, &l}};
    WL_CHECK(w, keel_cmd_spawn(cb, in, 3));
}

/* The entity at index i at tick t (0 when the slot is free). */
static keel_entity at(const wl *w, uint32_t i, uint64_t t)
{
    if (i == 3)
        return t <= 5 ? w->e[3] : t >= 9 ? w->e[4] : 0;
    return w->e[i];
}

static int life(keel_ctx *ctx, void *user)
{
    wl *w = user;
    uint64_t t = keel_ctx_tick(ctx);
    keel_cmdbuf *cb = keel_ctx_commands(ctx);
    if (t == 1)
        for (uint32_t i = 0; i < 4; i++)
            spawn(w, cb, i);
    keel_entity e = t >= 2 ? at(w, (uint32_t)(t % 4), t) : 0;
    if (e) {
        w_acct a;
        WL_CHECK(w, keel_txn_get(ctx, e, w->ACCT, &a));
        a.coins = 1000 * (int64_t)t + (int64_t)(t % 4);
        WL_CHECK(w, keel_txn_set(ctx, e, w->ACCT, &a));
    }
    if (t == 4) {
        w_link l = {.target = w->e[2], .delta = -4, .n = 4, .s = -1, .b = 200};
        WL_CHECK(w, keel_txn_set(ctx, w->e[0], w->LINK, &l));
    }
    if (t == 5)
        WL_CHECK(w, keel_cmd_destroy(cb, w->e[3]));
    if (t == 6)
        WL_CHECK(w, keel_cmd_add(cb, w->e[0], w->MARK, NULL));
    if (t == 7)
        WL_CHECK(w, keel_cmd_remove(cb, w->e[0], w->MARK));
    if (t == 8)
        spawn(w, cb, 4);
    return 0;
}

static int bank(keel_ctx *ctx, void *user)
{
    wl *w = user;
    if (keel_ctx_tick(ctx) != 3)
        return 0;
    keel_side_txn *tx = NULL;
    w_acct a, b;
    WL_CHECK(w, keel_side_txn_begin(ctx, KEEL_DURABLE_IMMEDIATE, &tx));
    if (!tx)
        return 0;
    WL_CHECK(w, keel_side_get(tx, w->e[0], w->ACCT, &a));
    WL_CHECK(w, keel_side_get(tx, w->e[1], w->ACCT, &b));
    a.coins -= 7;
    b.coins += 7;
    WL_CHECK(w, keel_side_set(tx, w->e[0], w->ACCT, &a));
    WL_CHECK(w, keel_side_set(tx, w->e[1], w->ACCT, &b));
    WL_CHECK(w, keel_side_txn_commit(tx));
    return 0;
}

typedef struct wl_opts {
    bool retain;
    uint64_t checkpoint_after; /* 0 = none */
    bool keep_open;            /* leave the runtime open (a live directory) */
} wl_opts;

/* Run W for 11 ticks into DIR. Returns the runtime when keep_open. */
static wl *wl_run(const char *dir, wl_opts o)
{
    wl *w = calloc(1, sizeof *w);
    ck_assert_ptr_nonnull(w);
    for (uint32_t i = 0; i < 4; i++)
        w->e[i] = KEEL_ENTITY_MAKE(i, 1);
    w->e[4] = KEEL_ENTITY_MAKE(3, 2);
    keel_runtime_desc d = {.workers = 1, .tick_rate_hz = -1};
    d.durable.dir = dir;
    d.durable.checkpoint_every_ticks = -1;
    d.durable.checkpoint_every_bytes = -1;
    d.durable.checkpoint_every_seconds = -1;
    d.durable.wal_retain = o.retain;
    ck_assert_ok(keel_runtime_create(&d, &w->rt));
    keel_world *wd = keel_runtime_world(w->rt);
    keel_component_desc ca = {.name = "acct", .size = sizeof(w_acct), .fields = acct_fields, .field_count = 4};
    keel_component_desc cp = {.name = "pos", .size = sizeof(w_pos), .fields = pos_fields, .field_count = 2};
    keel_component_desc cl = {.name = "link", .size = sizeof(w_link), .fields = link_fields, .field_count = 6};
    keel_component_desc cm = {.name = "marked"};
    ck_assert_ok(keel_component_register(wd, &ca, &w->ACCT));
    ck_assert_ok(keel_component_register(wd, &cp, &w->POS));
    ck_assert_ok(keel_component_register(wd, &cl, &w->LINK));
    ck_assert_ok(keel_component_register(wd, &cm, &w->MARK));
    keel_schedule *s = sched_new(w->rt);
    keel_system_desc sl = {.name = "life", .kind = KEEL_SYSTEM_CALLBACK, .run = life, .user = w,
                           .access = {.writes = {w->ACCT, w->LINK}}};
    keel_system_desc sb = {.name = "bank", .kind = KEEL_SYSTEM_CALLBACK, .run = bank, .user = w,
                           .access = {.side_writes = {w->ACCT}}, .after = {"life"}};
    add_sys(s, &sl);
    add_sys(s, &sb);
    tu_install(w->rt, s);
    for (uint64_t t = 1; t <= W_TICKS; t++) {
        ck_assert_ok(keel_runtime_step(w->rt));
        ck_assert_msg(w->bad == 0, "tick %llu: %s", (unsigned long long)t, w->msg);
        if (t == o.checkpoint_after)
            ck_assert_ok(keel_checkpoint(w->rt));
    }
    ck_assert_ok(keel_flush(w->rt));
    if (o.keep_open)
        return w;
    keel_runtime_close(w->rt);
    free(w);
    return NULL;
}

static void wl_close(wl *w)
{
    if (!w)
        return;
    keel_runtime_close(w->rt);
    free(w);
}

/* Run W into a fresh directory named name under the base. */
static void make_dir(char *dir, size_t n, const char *name, wl_opts o)
{
    tdir(dir, n, name);
    ck_assert_ptr_null(wl_run(dir, o));
}

/* ---- suite walcli_args: --help, bad arguments, directories that are not keel's ---------------- */

static const char *const commands[] = {"info", "dump", "verify", "stats", "tail", "replay", "diff", "backup", "detach"};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

START_TEST(test_help)
{
    tu_run r = wal_ok("--help");
    for (size_t i = 0; i < NCOMMANDS; i++)
        ck_assert_msg(strstr(r.out, commands[i]), "keel-wal --help does not list %s: %s", commands[i], r.out);
    tu_run_free(&r);
    for (size_t i = 0; i < NCOMMANDS; i++) {
        r = wal_ok(commands[i], "--help");
        char want[64];
        snprintf(want, sizeof want, "keel-wal %s", commands[i]);
        ck_assert_msg(strstr(r.out, want), "%s --help: no usage line: %s", commands[i], r.out);
        tu_run_free(&r);
        r = wal_ok("help", commands[i]);
        ck_assert_msg(strstr(r.out, want), "help %s: no usage line: %s", commands[i], r.out);
        tu_run_free(&r);
    }
    r = wal_argv((const char *const[]){NULL});
    ck_assert_int_eq(r.status, 2);
    ck_assert(strstr(r.err, "usage: keel-wal"));
    tu_run_free(&r);
}
END_TEST

START_TEST(test_bad_arguments)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    /* "@" stands for the data directory */
    static const char *const bad[][6] = {
        {"frobnicate", "@", NULL},
        {"info", NULL},
        {"info", "@", "--bogus", NULL},
        {"info", "@", "@", NULL},
        {"dump", NULL},
        {"dump", "@", "--kind", "nosuchkind", NULL},
        {"dump", "@", "--kind", "snap_chunk", NULL},
        {"dump", "@", "--component", "nosuchcomp", NULL},
        {"dump", "@", "--entity", "xyz", NULL},
        {"dump", "@", "--entity", "1:99999999999", NULL},
        {"dump", "@", "--from-lsn", "-3", NULL},
        {"dump", "@", "--to-tick", NULL},
        {"verify", "@", "--fast", NULL},
        {"stats", "@", "--top", "x", NULL},
        {"stats", "@", "--bucket", "0", NULL},
        {"tail", "@", "--interval", "0", NULL},
        {"backup", NULL},
        {"backup", "@", NULL},
        {"backup", "@", "@", NULL},                 /* DEST exists and is not empty */
        {"backup", "@", "/nonexistent/parent/bk", NULL},
        {"backup", "@", "x", "y", NULL},
        {"backup", "@", "--fast", NULL},
        {"detach", NULL},
        {"detach", "@", "@", NULL},
        {"detach", "@", "--force", NULL},
        {"detach", "nats://127.0.0.1:1/w", NULL},   /* a stream has nothing to detach */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *args[8] = {0};
        for (size_t n = 0; bad[i][n]; n++)
            args[n] = strcmp(bad[i][n], "@") ? bad[i][n] : dir;
        tu_run r = wal_argv(args);
        ck_assert_msg(r.status == 2, "keel-wal %s %s: exit %d (want 2); stderr: %s", args[0], args[1] ? args[1] : "",
                      r.status, r.err);
        ck_assert_msg(r.errlen > 0 && strstr(r.err, "keel-wal"), "no message for case %zu", i);
        ck_assert_msg(r.outlen == 0, "case %zu printed on stdout: %s", i, r.out);
        tu_run_free(&r);
    }
}
END_TEST

/* Every subcommand on dir exits 2 with "keel-wal: <dir>..." and the cause. */
static void assert_cannot_open(const char *dir, const char *cause)
{
    static const char *const cmds[][3] = {{"info"}, {"dump"}, {"dump", "--json"}, {"verify"}, {"stats"}, {"tail"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *args[5] = {cmds[i][0], dir, cmds[i][1], NULL};
        tu_run r = wal_argv(args);
        char want[320];
        snprintf(want, sizeof want, "keel-wal: %s", dir);
        ck_assert_msg(r.status == 2, "keel-wal %s %s: exit %d (want 2): %s", cmds[i][0], dir, r.status, r.err);
        ck_assert_msg(!strncmp(r.err, want, strlen(want)), "keel-wal %s: message does not name %s: %s", cmds[i][0],
                      dir, r.err);
        ck_assert_msg(strstr(r.err, cause), "keel-wal %s %s: '%s' not in: %s", cmds[i][0], dir, cause, r.err);
        ck_assert_uint_eq(r.outlen, 0);
        tu_run_free(&r);
    }
}

/* Every command on dir, whose data.mdb is damaged: exit 1, nothing on stdout, one sentence naming the
 * directory, data.mdb and `cause`; the file is left as it was (bytes and mtime). */
static void assert_damaged(const char *dir, const char *cause)
{
    char dest[300], p[300];
    snprintf(dest, sizeof dest, "%s-backup", dir);
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    tu_digest d0 = tu_file_digest(p);
    uint64_t m0 = tu_file_mtime_ns(p);
    const char *const cmds[][5] = {
        {"info"}, {"dump"}, {"dump", "--json"}, {"verify"}, {"stats"}, {"tail"}, {"tail", "-n", "0"},
        {"replay", "--to-tick", "1"}, {"diff", "--from-tick", "0", "--to-tick", "1"}, {"backup", dest}, {"detach"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *args[8] = {cmds[i][0], dir, cmds[i][1], cmds[i][2], cmds[i][3], cmds[i][4], NULL};
        tu_run r = wal_argv(args);
        char want[320];
        snprintf(want, sizeof want, "keel-wal: %s: data.mdb is damaged: ", dir);
        ck_assert_msg(r.status == 1, "keel-wal %s %s: exit %d (want 1): %s", cmds[i][0], dir, r.status, r.err);
        ck_assert_msg(!strncmp(r.err, want, strlen(want)), "keel-wal %s: '%s' does not start: %s", cmds[i][0], want,
                      r.err);
        ck_assert_msg(strstr(r.err, cause), "keel-wal %s %s: '%s' not in: %s", cmds[i][0], dir, cause, r.err);
        ck_assert_uint_eq(tu_count_lines(r.err), 1);
        ck_assert_uint_eq(r.outlen, 0);
        tu_run_free(&r);
    }
    tu_assert_digest_eq(d0, tu_file_digest(p));
    ck_assert_uint_eq(m0, tu_file_mtime_ns(p));
    ck_assert_int_eq(access(dest, F_OK), -1); /* the refused backup created nothing */
}

/* An LMDB environment in dir holding one key in its main database: LMDB, not keel. */
static void make_plain_lmdb(const char *dir)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_open(env, dir, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_val k = {1, "k"}, v = {1, "v"};
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

/* Rewrite meta "format" of a keel directory (no process has it open). */
static void set_format(const char *dir, uint32_t version)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    unsigned char f[4] = {(unsigned char)version, (unsigned char)(version >> 8), (unsigned char)(version >> 16),
                          (unsigned char)(version >> 24)};
    ck_assert_int_eq(mdb_env_create(&env), 0);
    ck_assert_int_eq(mdb_env_set_maxdbs(env, 8), 0);
    ck_assert_int_eq(mdb_env_open(env, dir, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val k = {6, "format"}, v = {4, f};
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

START_TEST(test_bad_directories)
{
    char missing[256], empty[256], garbage[256], plain[256], file[256], newer[256], p[300];
    tdir(missing, sizeof missing, "missing");
    assert_cannot_open(missing, "No such file or directory");

    tdir(empty, sizeof empty, "empty");
    ck_assert_int_eq(mkdir(empty, 0755), 0);
    assert_cannot_open(empty, "not a keel data directory");

    tdir(garbage, sizeof garbage, "garbage");
    ck_assert_int_eq(mkdir(garbage, 0755), 0);
    snprintf(p, sizeof p, "%s/data.mdb", garbage);
    char junk[20000];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(i * 131 + 7);
    tu_write_file(p, junk, sizeof junk);
    assert_cannot_open(garbage, "not an LMDB file");
    tu_write_file(p, "", 0); /* an empty data.mdb: damage (exit 1), never a directory to create */
    assert_damaged(garbage, "the file is empty");

    tdir(plain, sizeof plain, "plain");
    make_plain_lmdb(plain);
    assert_cannot_open(plain, "not a keel data directory");

    tdir(file, sizeof file, "file");
    tu_write_file(file, "x", 1);
    assert_cannot_open(file, "not a directory");

    make_dir(newer, sizeof newer, "newer", (wl_opts){0});
    set_format(newer, 2);
    assert_cannot_open(newer, "format version 2");
}
END_TEST

/* A data.mdb cut short: refused before LMDB maps it (which would fault); every command exits 1 saying so. */
START_TEST(test_truncated_file)
{
    char dir[256], p[300];
    make_dir(dir, sizeof dir, "cut", (wl_opts){0});
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(truncate(p, 3 * 4096), 0); /* the meta pages survive, the trees do not */
    assert_damaged(dir, "it is truncated");
}
END_TEST

/* Each damage of tu_damage_apply, to a compacted copy of W's directory: every command refuses it (exit 1,
 * one sentence naming data.mdb and the damage), the file unchanged. */
START_TEST(test_damaged_files)
{
    char dir[256], compact[256], good[300];
    make_dir(dir, sizeof dir, "whole", (wl_opts){.checkpoint_after = 6});
    tdir(compact, sizeof compact, "compact");
    tu_run r = wal_ok("backup", dir, compact);
    tu_run_free(&r);
    snprintf(good, sizeof good, "%s/data.mdb", compact);
    for (int d = 0; d < TU_DAMAGE_COUNT; d++) {
        char name[32], bad[256], mdb[300];
        snprintf(name, sizeof name, "damaged-%d", d);
        tdir(bad, sizeof bad, name);
        ck_assert_int_eq(mkdir(bad, 0755), 0);
        snprintf(mdb, sizeof mdb, "%s/data.mdb", bad);
        tu_copy_file(good, mdb);
        tu_damage_apply(mdb, (tu_damage)d);
        assert_damaged(bad, tu_damages[d].says);
    }
}
END_TEST

/* ---- suite walcli_read: info, dump, stats against W ------------------------------------------ */

START_TEST(test_info)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run r = wal_ok("info", dir, "--json");
    assert_json(r.out);
    ck_assert_uint_eq(tu_count_lines(r.out), 1);
    ck_assert(js_has(r.out, "\"format\":1"));
    ck_assert(js_has(r.out, "\"checkpoint\":null"));
    ck_assert_uint_eq(js_u64(r.out, "records"), 0); /* the snapshot's: there is no checkpoint */
    const char *wal = strstr(r.out, "\"wal\":");
    ck_assert_ptr_nonnull(wal);
    ck_assert_uint_eq(js_u64(wal, "records"), 28);
    ck_assert_uint_eq(js_u64(wal, "invalid"), 0);
    ck_assert_uint_eq(js_u64(wal, "first_lsn"), 1);
    ck_assert_uint_eq(js_u64(wal, "last_lsn"), 28);
    ck_assert_uint_eq(js_u64(wal, "first_tick"), 1);
    ck_assert_uint_eq(js_u64(wal, "last_tick"), 11);
    ck_assert_uint_eq(js_u64(wal, "last_committed_tick"), 11);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"tick_chunk\":"), "records"), 9);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"tick_commit\":"), "records"), 12);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"side\":"), "records"), 1);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"lifecycle\":"), "records"), 5);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"schema\":"), "records"), 1);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"checkpoint\":"), "records"), 0);
    /* the side record is raw: 16 bytes of header + 2 writes of 8 + 4 + 4 + 16 */
    ck_assert_uint_eq(js_u64(strstr(wal, "\"side\":"), "raw_bytes"), 16 + 2 * 32);
    ck_assert_uint_eq(js_u64(strstr(wal, "\"tick_commit\":"), "raw_bytes"), 12 * 16);
    /* the schema, with fields by type */
    ck_assert(js_has(r.out, "{\"id\":1,\"name\":\"acct\",\"size\":16,\"align\":8,\"discipline\":\"versioned\",\"fields\":["
                            "{\"name\":\"coins\",\"type\":\"i64\",\"offset\":0,\"count\":1},"
                            "{\"name\":\"level\",\"type\":\"u32\",\"offset\":8,\"count\":1},"
                            "{\"name\":\"vip\",\"type\":\"bool\",\"offset\":12,\"count\":1},"
                            "{\"name\":\"code\",\"type\":\"bytes\",\"offset\":13,\"count\":3}]}"));
    ck_assert(js_has(r.out, "{\"id\":4,\"name\":\"marked\",\"size\":0,"));
    tu_run_free(&r);

    r = wal_ok("info", dir);
    ck_assert(js_has(r.out, "LSN 1..28, 28 records"));
    ck_assert(js_has(r.out, "last committed tick 11"));
    ck_assert(js_has(r.out, "tick_chunk 9, tick_commit 12, side 1, lifecycle 5, schema 1, checkpoint 0"));
    ck_assert(js_has(r.out, "checkpoint   none"));
    ck_assert(js_has(r.out, "        code             bytes[3] @13"));
    tu_run_free(&r);

    /* output that cannot be written is an error, named, not a success */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int full = open("/dev/full", O_WRONLY);
        if (full < 0 || dup2(full, 1) < 0)
            _exit(99);
        execl(KEEL_WAL_BIN, KEEL_WAL_BIN, "info", dir, (char *)NULL);
        _exit(98);
    }
    ck_assert_int_eq(tu_wait(pid), 2);
}
END_TEST

/* The LSNs and ticks of dump --json's lines, each checked to be JSON. */
typedef struct dumped {
    uint32_t n;
    uint64_t lsn[64], tick[64];
    char kind[64][16];
} dumped;

static dumped parse_dump(const char *out)
{
    dumped l = {0};
    char line[8192];
    const char *p = out;
    while (next_line(&p, line, sizeof line)) {
        ck_assert_uint_lt(l.n, 64);
        assert_json(line);
        l.lsn[l.n] = js_u64(line, "lsn");
        l.tick[l.n] = js_u64(line, "tick");
        js_str(line, "kind", l.kind[l.n], sizeof l.kind[0]);
        l.n++;
    }
    return l;
}

/* The dump line of LSN lsn in out (copied into buf). */
static const char *line_of(const char *out, uint64_t lsn, char *buf, size_t n)
{
    const char *p = out;
    while (next_line(&p, buf, n))
        if (js_u64(buf, "lsn") == lsn)
            return buf;
    ck_abort_msg("no line for LSN %llu", (unsigned long long)lsn);
    return NULL;
}

START_TEST(test_dump_json_values)
{
    char dir[256], line[8192];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run r = wal_ok("dump", dir, "--json");
    dumped l = parse_dump(r.out);
    ck_assert_uint_eq(l.n, 28);
    for (uint32_t i = 0; i < l.n; i++)
        ck_assert_uint_eq(l.lsn[i], i + 1);
    ck_assert_str_eq(l.kind[0], "schema");
    ck_assert(js_has(line_of(r.out, 1, line, sizeof line), "\"components\":[{\"id\":1,\"name\":\"acct\""));

    /* tick 1: four spawns with every value by field name */
    uint64_t spawn_lsn = 0, side_lsn = 0, t4_chunk = 0, t8_spawn = 0, t11_chunk = 0;
    for (uint32_t i = 0; i < l.n; i++) {
        if (l.tick[i] == 1 && !strcmp(l.kind[i], "lifecycle"))
            spawn_lsn = l.lsn[i];
        if (!strcmp(l.kind[i], "side"))
            side_lsn = l.lsn[i];
        if (l.tick[i] == 4 && !strcmp(l.kind[i], "tick_chunk"))
            t4_chunk = l.lsn[i];
        if (l.tick[i] == 8 && !strcmp(l.kind[i], "lifecycle"))
            t8_spawn = l.lsn[i];
        if (l.tick[i] == 11 && !strcmp(l.kind[i], "tick_chunk"))
            t11_chunk = l.lsn[i];
    }
    ck_assert(spawn_lsn && side_lsn && t4_chunk && t8_spawn && t11_chunk);
    line_of(r.out, spawn_lsn, line, sizeof line);
    ck_assert_msg(js_has(line, "{\"op\":\"spawn\",\"entity\":\"0000000100000001\",\"components\":{"
                               "\"acct\":{\"coins\":100,\"level\":1,\"vip\":true,\"code\":\"616231\"},"
                               "\"pos\":{\"x\":1.5,\"v\":[0.25,-1]},"
                               "\"link\":{\"target\":\"0000000000000000\",\"delta\":0,\"n\":0,\"s\":0,\"b\":0,"
                               "\"pad\":\"0000\"}}}"), "%s", line);
    ck_assert(js_has(line, "\"entity\":\"0000000100000003\""));
    /* tick 3's side transaction, before tick 3's unit */
    ck_assert_uint_eq(l.tick[side_lsn - 1], 3);
    line_of(r.out, side_lsn, line, sizeof line);
    ck_assert(js_has(line, "\"mode\":\"immediate\""));
    ck_assert_msg(js_has(line, "\"changes\":[{\"op\":\"set\",\"entity\":\"0000000100000000\",\"component\":\"acct\","
                               "\"value\":{\"coins\":-7,\"level\":0,\"vip\":false,\"code\":\"616230\"}},"
                               "{\"op\":\"set\",\"entity\":\"0000000100000001\",\"component\":\"acct\","
                               "\"value\":{\"coins\":107,\"level\":1,\"vip\":true,\"code\":\"616231\"}}]"), "%s", line);
    /* tick 4: E0's coins and its link to E2 (entity, i16, u16, i8, u8 fields) */
    line_of(r.out, t4_chunk, line, sizeof line);
    ck_assert_msg(js_has(line, "{\"op\":\"set\",\"entity\":\"0000000100000000\",\"component\":\"acct\",\"value\":"
                               "{\"coins\":4000,\"level\":0,\"vip\":false,\"code\":\"616230\"}}"), "%s", line);
    ck_assert_msg(js_has(line, "{\"op\":\"set\",\"entity\":\"0000000100000000\",\"component\":\"link\",\"value\":"
                               "{\"target\":\"0000000100000002\",\"delta\":-4,\"n\":4,\"s\":-1,\"b\":200,"
                               "\"pad\":\"0000\"}}"), "%s", line);
    /* tick 8: E4 takes slot 3 with generation 2 */
    line_of(r.out, t8_spawn, line, sizeof line);
    ck_assert_msg(js_has(line, "{\"op\":\"spawn\",\"entity\":\"0000000200000003\",\"components\":{\"acct\":"
                               "{\"coins\":400,\"level\":4,\"vip\":false,\"code\":\"616234\"},"
                               "\"pos\":{\"x\":4.5,\"v\":[1,-4]}"), "%s", line);
    line_of(r.out, t11_chunk, line, sizeof line);
    ck_assert(js_has(line, "\"entity\":\"0000000200000003\",\"component\":\"acct\",\"value\":{\"coins\":11003,"));
    /* the lifecycle commands of ticks 5, 6, 7 */
    tu_run_free(&r);
    r = wal_ok("dump", dir, "--json", "--kind", "lifecycle", "--from-tick", "5", "--to-tick", "7");
    l = parse_dump(r.out);
    ck_assert_uint_eq(l.n, 3);
    ck_assert(js_has(r.out, "\"changes\":[{\"op\":\"destroy\",\"entity\":\"0000000100000003\"}]"));
    ck_assert(js_has(r.out, "\"changes\":[{\"op\":\"add\",\"entity\":\"0000000100000000\",\"component\":\"marked\","
                            "\"value\":{}}]"));
    ck_assert(js_has(r.out, "\"changes\":[{\"op\":\"remove\",\"entity\":\"0000000100000000\",\"component\":"
                            "\"marked\"}]"));
    tu_run_free(&r);
    /* tick commits carry their counts */
    r = wal_ok("dump", dir, "--json", "--kind", "tick_commit", "--from-tick", "8", "--to-tick", "8");
    ck_assert_uint_eq(tu_count_lines(r.out), 1);
    ck_assert(js_has(r.out, "\"nrecords\":2,\"nlive\":4,\"nslots\":4"));
    tu_run_free(&r);
}
END_TEST

/* The records dump selects with the filter args, as "tick:kind ..." */
static void assert_selects(const char *dir, const char *const *filter, const char *want)
{
    const char *args[16] = {"dump", dir, "--json"};
    size_t n = 3;
    for (; *filter; filter++)
        args[n++] = *filter;
    tu_run r = wal_ok_argv(args);
    dumped l = parse_dump(r.out);
    char got[1024] = "";
    for (uint32_t i = 0; i < l.n; i++) {
        size_t k = strlen(got);
        snprintf(got + k, sizeof got - k, "%s%" PRIu64 ":%s", i ? " " : "", l.tick[i], l.kind[i]);
    }
    ck_assert_msg(!strcmp(got, want), "dump %s %s...: got [%s], want [%s]", args[3] ? args[3] : "",
                  args[4] ? args[4] : "", got, want);
    tu_run_free(&r);
}

#define SELECTS(dir, want, ...) assert_selects(dir, (const char *const[]){__VA_ARGS__, NULL}, want)

START_TEST(test_dump_filters)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    /* entity E0: its spawn, the side write (and its row in tick 3's chunk), ticks 4 and 8 (acct,
     * link), the tag's add and remove */
    const char *e0 = "1:lifecycle 3:side 3:tick_chunk 4:tick_chunk 6:lifecycle 7:lifecycle 8:tick_chunk";
    SELECTS(dir, e0, "--entity", "0000000100000000");
    SELECTS(dir, e0, "--entity", "0:1"); /* INDEX:GEN */
    SELECTS(dir, e0, "--entity=0x100000000");
    /* E4 (slot 3, generation 2), not E3 (slot 3, generation 1) */
    SELECTS(dir, "8:lifecycle 11:tick_chunk", "--entity", "0x200000003");
    SELECTS(dir, "1:lifecycle 3:tick_chunk 5:lifecycle", "--entity", "3:1");
    SELECTS(dir, "", "--entity", "7:1"); /* never existed */
    /* components: link in the spawns and tick 4's set; the tag; pos by id */
    SELECTS(dir, "1:lifecycle 4:tick_chunk 8:lifecycle", "--component", "link");
    SELECTS(dir, "6:lifecycle 7:lifecycle", "--component", "marked");
    SELECTS(dir, "1:lifecycle 8:lifecycle", "--component", "2");
    /* kinds */
    SELECTS(dir, "3:side", "--kind", "side");
    SELECTS(dir, "0:schema 3:side", "--kind", "schema,side");
    SELECTS(dir, "0:schema 3:side", "--kind", "5", "--kind", "side");
    SELECTS(dir, "1:lifecycle 5:lifecycle 6:lifecycle 7:lifecycle 8:lifecycle", "--kind", "lifecycle");
    /* ticks: 4..6 (tick 7 writes no value: slot 3 is free then) */
    SELECTS(dir, "4:tick_chunk 4:tick_commit 5:tick_chunk 5:lifecycle 5:tick_commit 6:tick_chunk 6:lifecycle "
                 "6:tick_commit", "--from-tick", "4", "--to-tick", "6");
    SELECTS(dir, "7:lifecycle 7:tick_commit", "--from-tick", "7", "--to-tick", "7");
    SELECTS(dir, "0:schema", "--to-tick", "0");
    /* combined: the tick_chunks of ticks 2..5 that touch acct */
    SELECTS(dir, "2:tick_chunk 3:tick_chunk 4:tick_chunk 5:tick_chunk", "--from-tick", "2", "--to-tick", "5",
            "--kind", "tick_chunk", "--component", "acct");

    /* LSN range: exactly those LSNs */
    tu_run r = wal_ok("dump", dir, "--json", "--from-lsn", "5", "--to-lsn", "9");
    dumped l = parse_dump(r.out);
    ck_assert_uint_eq(l.n, 5);
    for (uint32_t i = 0; i < 5; i++)
        ck_assert_uint_eq(l.lsn[i], 5 + i);
    tu_run_free(&r);
    r = wal_ok("dump", dir, "--from-lsn=27");
    ck_assert_uint_eq(tu_count_lines(r.out), 2);
    ck_assert(!strncmp(r.out, "lsn=27 ", 7));
    tu_run_free(&r);
    r = wal_ok("dump", dir, "--from-lsn", "100");
    ck_assert_uint_eq(r.outlen, 0);
    tu_run_free(&r);

    /* --entity in text mode lists only the matching changes */
    r = wal_ok("dump", dir, "--kind", "side", "--entity", "1:1");
    ck_assert_uint_eq(tu_count_lines(r.out), 1);
    ck_assert_msg(js_has(r.out, "kind=side flags=0 codec=raw raw=80 stored=80 seq=") &&
                  js_has(r.out, "mode=immediate writes=1 | set 0000000100000001 acct={\"coins\":107,"), "%s", r.out);
    ck_assert(!js_has(r.out, "0000000100000000"));
    tu_run_free(&r);

    /* a dump of 11 ticks has at least 10 lines (the acceptance floor) */
    r = wal_ok("dump", dir, "--from-tick", "1", "--to-tick", "11");
    ck_assert_uint_ge(tu_count_lines(r.out), 10);
    ck_assert_uint_eq(tu_count_lines(r.out), 27);
    tu_run_free(&r);
}
END_TEST

START_TEST(test_stats_match_info)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run ri = wal_ok("info", dir, "--json");
    tu_run rs = wal_ok("stats", dir, "--json", "--top", "3");
    assert_json(rs.out);
    const char *wal = strstr(ri.out, "\"wal\":");
    /* totals and per kind equal info's */
    ck_assert_uint_eq(js_u64(rs.out, "records"), js_u64(wal, "records"));
    ck_assert_uint_eq(js_u64(rs.out, "raw_bytes"), js_u64(wal, "raw_bytes"));
    ck_assert_uint_eq(js_u64(rs.out, "stored_bytes"), js_u64(wal, "stored_bytes"));
    static const char *const kinds[] = {"\"tick_chunk\":", "\"tick_commit\":", "\"side\":", "\"lifecycle\":",
                                        "\"schema\":"};
    const char *sk = strstr(rs.out, "\"kinds\":");
    for (size_t i = 0; i < 5; i++) {
        const char *a = strstr(sk, kinds[i]), *b = strstr(wal, kinds[i]);
        ck_assert_uint_eq(js_u64(a, "records"), js_u64(b, "records"));
        ck_assert_uint_eq(js_u64(a, "raw_bytes"), js_u64(b, "raw_bytes"));
        ck_assert_uint_eq(js_u64(a, "stored_bytes"), js_u64(b, "stored_bytes"));
    }
    /* per component: acct 4 + 1 spawns, 9 tick sets, 2 side writes and their 2 rows in tick 3's
     * chunk; link 5 spawns + 1 set */
    const char *c = strstr(rs.out, "\"components\":");
    ck_assert_uint_eq(js_u64(strstr(c, "\"acct\":"), "changes"), 18);
    ck_assert_uint_eq(js_u64(strstr(c, "\"acct\":"), "value_bytes"), 18 * 16);
    ck_assert_uint_eq(js_u64(strstr(c, "\"link\":"), "changes"), 6);
    ck_assert_uint_eq(js_u64(strstr(c, "\"pos\":"), "changes"), 5);
    ck_assert_uint_eq(js_u64(strstr(c, "\"marked\":"), "changes"), 2);
    ck_assert_uint_eq(js_u64(strstr(c, "\"marked\":"), "value_bytes"), 0);
    /* the tick ranges add up to the total; ticks 0..11 fit one-tick ranges */
    ck_assert_uint_eq(js_u64(rs.out, "bucket_ticks"), 1);
    const char *p = strstr(rs.out, "\"tick_ranges\":[");
    const char *end = strstr(rs.out, "\"top_ticks\":");
    uint64_t sum = 0, ranges = 0, max = 0, max_tick = 0;
    for (p = strstr(p, "{\"from_tick\":"); p && p < end; p = strstr(p + 1, "{\"from_tick\":")) {
        sum += js_u64(p, "records");
        ranges++;
        if (js_u64(p, "stored_bytes") > max) {
            max = js_u64(p, "stored_bytes");
            max_tick = js_u64(p, "from_tick");
        }
    }
    ck_assert_uint_eq(sum, 28);
    ck_assert_uint_eq(ranges, 12);
    /* top ticks: three, in descending stored bytes, the first the largest one-tick range */
    ck_assert_uint_eq(js_u64(end, "tick"), max_tick);
    ck_assert_uint_eq(js_u64(end, "stored_bytes"), max);
    uint64_t prev = UINT64_MAX, n = 0;
    for (p = strstr(end, "{\"tick\":"); p; p = strstr(p + 1, "{\"tick\":"), n++) {
        ck_assert_uint_le(js_u64(p, "stored_bytes"), prev);
        prev = js_u64(p, "stored_bytes");
    }
    ck_assert_uint_eq(n, 3);
    tu_run_free(&ri);
    tu_run_free(&rs);

    rs = wal_ok("stats", dir, "--bucket", "5");
    ck_assert(js_has(rs.out, "by tick range (5 ticks)"));
    ck_assert(js_has(rs.out, "  0..4 "));
    ck_assert(js_has(rs.out, "  10..14 "));
    tu_run_free(&rs);
    rs = wal_ok("stats", dir);
    ck_assert(js_has(rs.out, ": 28 records, "));
    ck_assert(js_has(rs.out, "by tick range (1 tick)"));
    ck_assert(js_has(rs.out, "\n  tick 11 "));
    ck_assert(js_has(rs.out, "\n  side                            1             80             80    1.00x\n"));
    tu_run_free(&rs);
}
END_TEST

/* ---- suite walcli_verify ----------------------------------------------------------------------- */

/* Flip one payload byte of the record at lsn wherever its bytes sit in
 * data.mdb (as ../shared/acceptance/tools does). */
static void corrupt_record(const char *dir, uint64_t lsn)
{
    size_t len;
    unsigned char *rec = tu_record_copy(dir, lsn, &len);
    char p[300];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    ck_assert_uint_ge(tu_flip_copies(p, rec, len, len - 8), 1);
    free(rec);
}

static bool has_lsn_line(const char *out, uint64_t lsn, const char *why)
{
    char want[64], line[2048];
    snprintf(want, sizeof want, "LSN %" PRIu64 ": ", lsn);
    const char *p = out;
    while (next_line(&p, line, sizeof line))
        if (!strncmp(line, want, strlen(want)) && strstr(line, why))
            return true;
    return false;
}

START_TEST(test_verify_good)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run r = wal_ok("verify", dir);
    ck_assert_uint_eq(tu_count_lines(r.out), 1);
    ck_assert_msg(js_has(r.out, ": 28 WAL records (LSN 1..28), 0 snapshot records: ok"), "%s", r.out);
    tu_run_free(&r);
}
END_TEST

/* A SIDES record (side transactions queued together) after the last unit:
 * dump lists its transactions with their keys, verify accepts it, stats
 * and info count it, replay applies it. Two keyed transactions that wrote
 * nothing (a transaction's key is logged even so). */
START_TEST(test_sides_record)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    kw_buf a = {0}, b = {0}, sides = {0}, rec = {0};
    uint32_t fa = 0, fb = 0;
    ck_assert_ok(kw_side_begin(&a, 90, KEEL_DURABLE_IMMEDIATE, 0));
    ck_assert_ok(kw_side_end(&a, 0x51, &fa));
    ck_assert_ok(kw_side_begin(&b, 91, KEEL_DURABLE_IMMEDIATE, 0));
    ck_assert_ok(kw_side_end(&b, 0x52, &fb));
    ck_assert_ok(kw_sides_begin(&sides));
    ck_assert_ok(kw_sides_put(&sides, fa, a.p, a.len));
    ck_assert_ok(kw_sides_put(&sides, fb, b.p, b.len));
    kw_sides_end(&sides, 2);
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    ck_assert_ok(kw_record_build(c, &rec, KW_KIND_SIDES, 29, 11, 0, sides.p, sides.len));
    tu_wal_put(dir, 29, rec.p, rec.len);

    tu_run r = wal_ok("dump", dir, "--json", "--kind", "sides");
    ck_assert_uint_eq(tu_count_lines(r.out), 1);
    ck_assert_msg(js_has(r.out, "\"lsn\":29,\"tick\":11,\"kind\":\"sides\",\"flags\":0") &&
                      js_has(r.out, "\"transactions\":[{\"index\":0,\"seq\":90,\"mode\":\"immediate\",\"key\":81,"
                                    "\"changes\":[]},{\"index\":1,\"seq\":91,\"mode\":\"immediate\",\"key\":82,"
                                    "\"changes\":[]}]"),
                  "%s", r.out);
    tu_run_free(&r);
    r = wal_ok("dump", dir, "--kind", "sides");
    ck_assert_msg(js_has(r.out, "lsn=29 tick=11 kind=sides flags=0") &&
                      js_has(r.out, " transactions=2 writes=0 | seq=90 mode=immediate writes=0 key=81 | seq=91 "
                                   "mode=immediate writes=0 key=82"),
                  "%s", r.out);
    tu_run_free(&r);
    r = wal_ok("verify", dir);
    ck_assert_msg(js_has(r.out, ": 29 WAL records (LSN 1..29), 0 snapshot records: ok"), "%s", r.out);
    tu_run_free(&r);
    r = wal_ok("stats", dir, "--json");
    ck_assert_msg(js_has(r.out, "\"sides\":"), "%s", r.out);
    tu_run_free(&r);
    r = wal_ok("replay", dir, "--to-tick", "11");
    ck_assert_msg(js_has(r.out, "tick=11 hash="), "%s", r.out);
    tu_run_free(&r);

    /* the same record with a transaction's flags damaged (and the CRC made good) */
    kw_buf_free(&rec);
    sides.p[4] = 4;
    ck_assert_ok(kw_record_build(c, &rec, KW_KIND_SIDES, 29, 11, 0, sides.p, sides.len));
    tu_wal_put(dir, 29, rec.p, rec.len);
    r = wal("verify", dir);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(has_lsn_line(r.out, 29, "flags other than KEY"), "%s", r.out);
    tu_run_free(&r);
    kw_codec_destroy(c);
    kw_buf_free(&a);
    kw_buf_free(&b);
    kw_buf_free(&sides);
    kw_buf_free(&rec);
}
END_TEST

START_TEST(test_verify_corrupt_record)
{
    char dir[256], line[8192];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run r = wal_ok("dump", dir, "--json", "--kind", "side");
    uint64_t lsn = js_u64(r.out, "lsn");
    tu_run_free(&r);
    corrupt_record(dir, lsn);

    r = wal("verify", dir);
    ck_assert_msg(r.status == 1, "verify on a corrupted record: exit %d: %s %s", r.status, r.out, r.err);
    ck_assert_msg(has_lsn_line(r.out, lsn, "CRC32C"), "no line naming LSN %llu: %s", (unsigned long long)lsn, r.out);
    ck_assert_msg(js_has(r.out, ": 1 problem\n"), "%s", r.out);
    tu_run_free(&r);

    /* dump skips it (saying so) and prints the rest; exit 1 */
    r = wal("dump", dir, "--json");
    ck_assert_int_eq(r.status, 1);
    ck_assert_uint_eq(tu_count_lines(r.out), 27);
    snprintf(line, sizeof line, "LSN %" PRIu64 ": ", lsn);
    ck_assert_msg(strstr(r.err, line) && strstr(r.err, "CRC32C"), "%s", r.err);
    tu_run_free(&r);
    r = wal("info", dir);
    ck_assert_int_eq(r.status, 1);
    ck_assert(js_has(r.out, "28 records (1 INVALID"));
    tu_run_free(&r);
    r = wal("stats", dir, "--json");
    ck_assert_int_eq(r.status, 1);
    ck_assert_uint_eq(js_u64(r.out, "invalid"), 1);
    tu_run_free(&r);
}
END_TEST

/* Delete the WAL record at lsn (no process has dir open). */
static int del_fill(kw_wtxn *t, void *arg)
{
    unsigned char k[8];
    uint64_t lsn = *(uint64_t *)arg;
    for (int i = 0; i < 8; i++)
        k[i] = (unsigned char)(lsn >> (56 - 8 * i));
    return kw_del(t, KW_DB_WAL, k, 8);
}

static void delete_record(const char *dir, uint64_t lsn)
{
    kw_store *st = NULL;
    ck_assert_ok(kw_store_open(dir, NULL, &st));
    ck_assert_ok(kw_store_write(st, del_fill, &lsn));
    kw_store_close(st);
}

START_TEST(test_verify_gap_and_unit)
{
    char dir[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tu_run r = wal_ok("dump", dir, "--json", "--kind", "tick_chunk", "--from-tick", "6", "--to-tick", "6");
    uint64_t lsn = js_u64(r.out, "lsn");
    tu_run_free(&r);
    delete_record(dir, lsn);
    r = wal("verify", dir);
    ck_assert_int_eq(r.status, 1);
    /* the gap is named at the LSN after it, and tick 6's commit counts a record that is gone */
    ck_assert_msg(has_lsn_line(r.out, lsn + 1, "not consecutive"), "%s", r.out);
    ck_assert_msg(js_has(r.out, "the tick_commit of tick 6 counts 2 records, 1 precede it"), "%s", r.out);
    tu_run_free(&r);

    /* the first records gone without a checkpoint */
    char dir2[256];
    make_dir(dir2, sizeof dir2, "w2", (wl_opts){0});
    delete_record(dir2, 1);
    r = wal("verify", dir2);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(has_lsn_line(r.out, 2, "LSNs 1..1 are missing"), "%s", r.out);
    tu_run_free(&r);
}
END_TEST

START_TEST(test_verify_checkpoint)
{
    char keep[256], drop[256], line[4096];
    make_dir(keep, sizeof keep, "retain", (wl_opts){.retain = true, .checkpoint_after = 6});
    make_dir(drop, sizeof drop, "drop", (wl_opts){.checkpoint_after = 6});
    for (int i = 0; i < 2; i++) {
        const char *dir = i ? drop : keep;
        tu_run r = wal_ok("info", dir, "--json");
        const char *ck = strstr(r.out, "\"checkpoint\":{");
        ck_assert_ptr_nonnull(ck);
        ck_assert_uint_eq(js_u64(ck, "tick"), 6);
        ck_assert_uint_eq(js_u64(ck, "count"), 1);
        uint64_t covered = js_u64(ck, "lsn");
        ck_assert_uint_eq(covered, 17); /* schema, the hook unit, ticks 1..6 (the side record included) */
        ck_assert_uint_gt(js_u64(strstr(r.out, "\"snapshot\":"), "records"), 1);
        const char *wal = strstr(r.out, "\"wal\":");
        ck_assert_uint_eq(js_u64(wal, "first_lsn"), i ? covered + 1 : 1);
        ck_assert_uint_eq(js_u64(wal, "last_lsn"), 29); /* 28 + the checkpoint marker */
        tu_run_free(&r);
        r = wal_ok("dump", dir, "--json", "--kind", "checkpoint");
        ck_assert_uint_eq(tu_count_lines(r.out), 1);
        next_line(&(const char *){r.out}, line, sizeof line);
        ck_assert_uint_eq(js_u64(line, "covered_lsn"), covered);
        ck_assert_uint_eq(js_u64(line, "checkpoint_tick"), 6);
        ck_assert_uint_gt(js_u64(line, "lsn"), covered);
        tu_run_free(&r);
        r = wal_ok("verify", dir);
        ck_assert_msg(js_has(r.out, "snapshot records: ok"), "%s", r.out);
        tu_run_free(&r);
    }
}
END_TEST

/* The names in dir, sorted and joined with spaces. */
static void list_dir(const char *dir, char *out, size_t n)
{
    struct dirent **names;
    int k = scandir(dir, &names, NULL, alphasort);
    ck_assert_int_ge(k, 0);
    out[0] = 0;
    for (int i = 0; i < k; i++) {
        if (names[i]->d_name[0] != '.') {
            ck_assert_uint_lt(strlen(out) + strlen(names[i]->d_name) + 2, n);
            strcat(strcat(out, " "), names[i]->d_name);
        }
        free(names[i]);
    }
    free(names);
}

/* A directory on read-only media (a backup on a read-only mount, without
 * its lock.mdb): keel-wal reads it and finds what it finds on the writable
 * original (LMDB runs without its lock file there, since no writer can
 * exist); the runtime refuses to open it with KEEL_EIO naming the file; and
 * nothing is created in it. The read-only medium is a read-only bind mount
 * in a mount namespace private to this test's process (Check forks each
 * test). That needs CAP_SYS_ADMIN, which root has on the CI machines;
 * without it the test says so on stderr and checks nothing. */
START_TEST(test_read_only_media)
{
    char dir[256], mnt[256], path[300], before[512], after[512];
    make_dir(dir, sizeof dir, "rw", (wl_opts){.checkpoint_after = 6});
    tdir(mnt, sizeof mnt, "ro");
    ck_assert_int_eq(mkdir(mnt, 0755), 0);
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        fprintf(stderr, "test_read_only_media: SKIPPED, no private mount namespace (%s)\n", strerror(errno));
        return;
    }
    ck_assert_int_eq(mount(dir, mnt, NULL, MS_BIND, NULL), 0);
    ck_assert_int_eq(mount(NULL, mnt, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0);
    tu_run rw = wal_ok("dump", dir, "--json"); /* the original, writable: LMDB makes lock.mdb */
    snprintf(path, sizeof path, "%s/lock.mdb", dir);
    ck_assert_int_eq(unlink(path), 0); /* a backup copies data.mdb only */
    snprintf(path, sizeof path, "%s/keel.lock", dir);
    ck_assert_int_eq(unlink(path), 0); /* and no runtime's lock */
    snprintf(path, sizeof path, "%s/probe", mnt);
    errno = 0;
    ck_assert_int_eq(open(path, O_CREAT | O_WRONLY, 0644), -1);
    ck_assert_int_eq(errno, EROFS);
    list_dir(dir, before, sizeof before);
    ck_assert_str_eq(before, " data.mdb");

    tu_run ro = wal_ok("dump", mnt, "--json");
    ck_assert_uint_gt(tu_count_lines(ro.out), 10);
    ck_assert_str_eq(ro.out, rw.out);
    tu_run_free(&rw);
    tu_run_free(&ro);
    ro = wal_ok("verify", mnt);
    ck_assert_msg(js_has(ro.out, "snapshot records: ok"), "%s", ro.out);
    tu_run_free(&ro);
    ro = wal_ok("info", mnt, "--json");
    ck_assert_uint_eq(js_u64(strstr(ro.out, "\"checkpoint\":{"), "tick"), 6);
    ck_assert_uint_eq(js_u64(strstr(ro.out, "\"wal\":"), "last_lsn"), 29);
    tu_run_free(&ro);

    keel_runtime_desc d = {.workers = 1, .tick_rate_hz = -1};
    d.durable.dir = mnt;
    keel_runtime *rt;
    ck_assert_ok(keel_runtime_create(&d, &rt));
    ck_assert_rc(keel_runtime_recover(rt, NULL), KEEL_EIO);
    ck_assert_msg(strstr(keel_last_error(), mnt) && strstr(keel_last_error(), "Read-only file system"), "%s",
                  keel_last_error());
    keel_runtime_close(rt);
    list_dir(dir, after, sizeof after);
    ck_assert_str_eq(after, before);
    ck_assert_int_eq(umount2(mnt, MNT_DETACH), 0); /* the namespace ends with this process, but tidily */
}
END_TEST

/* ---- suite walcli_live: beside an open runtime; tail and tail -f ------------------------------ */

/* keel-wal tail -f with stdout on a pipe (read end returned); stderr to a file. */
static pid_t spawn_tail(const char *dir, const char *lines, FILE **out)
{
    char errpath[300];
    snprintf(errpath, sizeof errpath, "%s/tail.err", tu_base());
    return tu_spawn_reader(KEEL_WAL_BIN, (const char *const[]){"tail", dir, "-f", "-n", lines, "--interval", "20", NULL},
                           errpath, NULL, NULL, out);
}

START_TEST(test_live_read)
{
    char dir[256];
    tdir(dir, sizeof dir, "live");
    wl *w = wl_run(dir, (wl_opts){.keep_open = true});
    /* the runtime holds the directory open: the tools read it beside it */
    tu_run r = wal_ok("info", dir, "--json");
    ck_assert_uint_eq(js_u64(strstr(r.out, "\"wal\":"), "last_lsn"), 28);
    tu_run_free(&r);
    r = wal_ok("verify", dir);
    ck_assert(js_has(r.out, ": ok\n"));
    tu_run_free(&r);
    /* tail without -f: the last records */
    r = wal_ok("tail", dir, "-n", "3");
    ck_assert_uint_eq(tu_count_lines(r.out), 3);
    ck_assert(!strncmp(r.out, "lsn=26 ", 7));
    ck_assert(js_has(r.out, "lsn=28 tick=11 kind=tick_commit "));
    tu_run_free(&r);
    r = wal_ok("tail", dir, "-n", "2", "--json");
    dumped l = parse_dump(r.out);
    ck_assert_uint_eq(l.n, 2);
    ck_assert_uint_eq(l.lsn[1], 28);
    tu_run_free(&r);
    /* a backup beside the runtime that owns the directory: the copy holds the same records and verifies */
    char bk[300];
    snprintf(bk, sizeof bk, "%s-backup", dir);
    r = wal_ok("backup", dir, bk);
    ck_assert_msg(js_has(r.out, "WAL LSN 1..28)"), "%s", r.out);
    tu_run_free(&r);
    wl_close(w);
    r = wal_ok("verify", bk);
    ck_assert(js_has(r.out, ": ok\n"));
    tu_run_free(&r);
    tu_run a = wal_ok("dump", dir, "--json"), b = wal_ok("dump", bk, "--json");
    ck_assert_str_eq(a.out, b.out);
    tu_run_free(&a);
    tu_run_free(&b);
}
END_TEST

/* keel-wal ARGS succeeds and its output holds `want`. */
static void wal_says_argv(const char *want, const char *const *args)
{
    tu_run r = wal_ok_argv(args);
    ck_assert_msg(js_has(r.out, want), "keel-wal %s %s: '%s' not in: %s", args[0], args[1] ? args[1] : "", want, r.out);
    tu_run_free(&r);
}

#define wal_says(want, ...) wal_says_argv(want, (const char *const[]){__VA_ARGS__, NULL})

static int mark_fill(kw_wtxn *t, void *arg)
{
    static const unsigned char id[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int rc = kw_put(t, KW_DB_META, KW_META_REPLICATED, strlen(KW_META_REPLICATED), arg, strlen(arg));
    return rc ? rc : kw_put(t, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID), id, sizeof id);
}

/* detach removes a replicated world's mark (meta "replicated", which info
 * shows as its stream, and "stream_id") and nothing else: the same records before and after;
 * it is refused while a runtime holds the directory (exit 2, the file
 * unchanged), and a directory of no stream is left as it was. */
START_TEST(test_detach)
{
    char dir[256], mdb[300];
    make_dir(dir, sizeof dir, "detach", (wl_opts){.checkpoint_after = 6});
    snprintf(mdb, sizeof mdb, "%s/data.mdb", dir);
    tu_digest d0 = tu_file_digest(mdb);
    wal_says("the directory of no stream (nothing to do)", "detach", dir);
    tu_assert_digest_eq(d0, tu_file_digest(mdb));
    wal_says("\"stream\":null", "info", dir, "--json");

    kw_store *st = NULL;
    ck_assert_ok(kw_store_open(dir, NULL, &st));
    ck_assert_ok(kw_store_write(st, mark_fill, "KEEL_w9"));
    kw_store_close(st);
    wal_says("\nstream       KEEL_w9 (the directory of a replicated world)\n", "info", dir);
    wal_says("\"stream\":\"KEEL_w9\"", "info", dir, "--json");
    tu_run before = wal_ok("dump", dir, "--json"), info_before = wal_ok("info", dir);

    kw_store *owner = NULL; /* held as a server holds it (keel.lock): refused, nothing written */
    ck_assert_ok(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_OWN}, &owner));
    d0 = tu_file_digest(mdb);
    tu_run r = wal("detach", dir);
    ck_assert_msg(r.status == 2 && js_has(r.err, "is in use by"), "exit %d: %s", r.status, r.err);
    ck_assert_uint_eq(r.outlen, 0);
    tu_run_free(&r);
    kw_store_close(owner);
    tu_assert_digest_eq(d0, tu_file_digest(mdb));

    wal_says("no longer the directory of stream KEEL_w9\n", "detach", dir);
    wal_says("\"stream\":null", "info", dir, "--json");
    ck_assert_ok(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &st));
    ck_assert_int_eq(kw_store_has(st, KW_DB_META, KW_META_STREAM_ID, strlen(KW_META_STREAM_ID)), 0);
    kw_store_close(st);
    tu_run after = wal_ok("dump", dir, "--json"), info_after = wal_ok("info", dir);
    ck_assert_str_eq(after.out, before.out);
    /* the checkpoint and its snapshot too: info's lines from "checkpoint" on are the same */
    ck_assert_ptr_nonnull(strstr(info_before.out, "\ncheckpoint   tick 6,"));
    ck_assert_str_eq(strstr(info_after.out, "\ncheckpoint"), strstr(info_before.out, "\ncheckpoint"));
    tu_run_free(&after);
    tu_run_free(&before);
    tu_run_free(&info_after);
    tu_run_free(&info_before);
    wal_says("nothing to do", "detach", dir);
}
END_TEST

START_TEST(test_tail_follow)
{
    char dir[256], line[8192];
    tdir(dir, sizeof dir, "follow");
    wl *w = wl_run(dir, (wl_opts){.keep_open = true});
    FILE *out;
    pid_t pid = spawn_tail(dir, "1", &out);
    /* the first line is the last record: tail has taken its snapshot */
    ck_assert_ptr_nonnull(fgets(line, sizeof line, out));
    ck_assert_msg(!strncmp(line, "lsn=28 tick=11 kind=tick_commit", 31), "%s", line);
    /* two more ticks, committed while tail follows */
    for (int t = 12; t <= 13; t++)
        ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_ok(keel_flush(w->rt));
    uint64_t expect = 29;
    bool seen13 = false;
    while (!seen13 && fgets(line, sizeof line, out)) {
        char want[32];
        snprintf(want, sizeof want, "lsn=%" PRIu64 " ", expect++);
        ck_assert_msg(!strncmp(line, want, strlen(want)), "want %s..., got %s", want, line);
        seen13 = strstr(line, " tick=13 kind=tick_commit ") != NULL;
    }
    ck_assert_msg(seen13, "tail -f ended before tick 13's commit");
    /* tick 12 sets slot 0 (E0), tick 13 slot 1: two chunks and two commits */
    ck_assert_uint_eq(expect, 33);
    ck_assert_int_eq(kill(pid, SIGINT), 0);
    ck_assert_int_eq(tu_wait(pid), 0);
    fclose(out);

    /* a reader that goes away ends it too, quietly, with exit 0 */
    pid = spawn_tail(dir, "1", &out);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, out));
    ck_assert_msg(!strncmp(line, "lsn=32 ", 7), "%s", line);
    fclose(out);
    ck_assert_int_eq(tu_wait(pid), 0);
    char errpath[300];
    snprintf(errpath, sizeof errpath, "%s/tail.err", tu_base());
    struct stat st;
    ck_assert_int_eq(stat(errpath, &st), 0);
    ck_assert_int_eq(st.st_size, 0);
    wl_close(w);
}
END_TEST

/* tail -f that falls behind a checkpoint (stopped while the checkpoint
 * deletes the WAL it covers) says which LSNs went before it read them and
 * follows on from the first record left; exit 0. */
START_TEST(test_tail_follow_gap)
{
    char dir[256], line[8192], errpath[300];
    tdir(dir, sizeof dir, "followgap");
    wl *w = wl_run(dir, (wl_opts){.keep_open = true});
    FILE *out;
    pid_t pid = spawn_tail(dir, "1", &out);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, out));
    ck_assert_msg(!strncmp(line, "lsn=28 ", 7), "%s", line);
    int st;
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    ck_assert_int_eq(waitpid(pid, &st, WUNTRACED), pid);
    ck_assert(WIFSTOPPED(st));
    for (int t = 12; t <= 13; t++) /* LSN 29..32, then the checkpoint deletes 1..32 */
        ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_ok(keel_checkpoint(w->rt));
    ck_assert_ok(keel_runtime_step(w->rt));
    ck_assert_ok(keel_flush(w->rt));
    ck_assert_int_eq(kill(pid, SIGCONT), 0);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, out));
    ck_assert_msg(!strncmp(line, "lsn=33 tick=13 kind=checkpoint ", 31), "%s", line);
    bool seen14 = false;
    while (!seen14 && fgets(line, sizeof line, out))
        seen14 = strstr(line, " tick=14 kind=tick_commit ") != NULL;
    ck_assert_msg(seen14, "tail -f ended before tick 14's commit");
    ck_assert_int_eq(kill(pid, SIGINT), 0);
    ck_assert_int_eq(tu_wait(pid), 0);
    fclose(out);
    snprintf(errpath, sizeof errpath, "%s/tail.err", tu_base());
    FILE *f = fopen(errpath, "r");
    ck_assert_ptr_nonnull(f);
    char err[4096];
    size_t n = fread(err, 1, sizeof err - 1, f);
    err[n] = 0;
    fclose(f);
    ck_assert_msg(strstr(err, "LSN 29..32 went before this tail read them (deleted by a checkpoint); following from "
                              "LSN 33\n"), "%s", err);
    wl_close(w);
}
END_TEST

/* ---- suite walcli_backup: the claim of DEST, a signal, damage met by the copy -------------------- */

static void set_failpoints(void *spec)
{
    setenv("KEEL_FAILPOINTS", spec, 1);
}

static mode_t mode_of(const char *dir, const char *name)
{
    char p[300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_int_eq(stat(p, &st), 0);
    return st.st_mode & 07777;
}

/* A backup held by a failpoint's delay after it claimed DEST and copied the application's file: a second
 * backup into DEST is refused (exit 2) and leaves the first one's files as they were; SIGTERM, SIGINT or
 * SIGHUP ends the first by that signal, leaving DEST as it found it (made by it: gone; empty: empty); the
 * retry then runs, and the backup keeps the sources' permission bits and holds no lock.mdb. */
START_TEST(test_backup_claim_and_signals)
{
    if (!keel_failpoints_compiled())
        return; /* -DKEEL_FAILPOINTS=OFF: no way to hold a backup on purpose */
    char dir[256], dest[256], p[300];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    snprintf(p, sizeof p, "%s/app.conf", dir);
    tu_write_file(p, "x=1\n", 4);
    ck_assert_int_eq(chmod(p, 0640), 0);
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    ck_assert_int_eq(chmod(p, 0600), 0);
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        bool existed = i == 1;
        tdir(dest, sizeof dest, existed ? "bk-empty" : "bk");
        if (existed)
            ck_assert_int_eq(mkdir(dest, 0755), 0);
        FILE *out;
        const char *args[] = {"backup", dir, dest, NULL};
        pid_t pid = tu_spawn_reader(KEEL_WAL_BIN, args, NULL, set_failpoints, "backup.copy=delay:600000", &out);
        tu_wait_nanosleep(pid, "keel-wal backup at backup.copy");
        snprintf(p, sizeof p, "%s/data.mdb.new", dest);
        tu_digest held = tu_file_digest(p);
        tu_run r = wal("backup", dir, dest);
        ck_assert_msg(r.status == 2, "the second backup: exit %d: %s", r.status, r.err);
        tu_run_free(&r);
        tu_assert_digest_eq(held, tu_file_digest(p));
        ck_assert_int_eq(tu_dir_entries(dest), 2); /* data.mdb.new, app.conf: the first's, as they were */
        ck_assert_int_eq(kill(pid, sigs[i]), 0);
        ck_assert_int_eq(tu_wait(pid), 128 + sigs[i]);
        fclose(out);
        if (existed)
            ck_assert_int_eq(tu_dir_entries(dest), 0);
        else
            ck_assert_int_eq(access(dest, F_OK), -1);
    }
    tu_run r = wal_ok("backup", dir, dest);
    tu_run_free(&r);
    snprintf(p, sizeof p, "%s/lock.mdb", dest);
    ck_assert_int_eq(access(p, F_OK), -1); /* describing the copy left no file in it */
    ck_assert_int_eq(tu_dir_entries(dest), 2);
    ck_assert_uint_eq(mode_of(dest, "data.mdb"), 0600);
    ck_assert_uint_eq(mode_of(dest, "app.conf"), 0640);
    r = wal_ok("verify", dest);
    tu_run_free(&r);
}
END_TEST

/* Point the wal database's root in dir/data.mdb past the file's end: the meta pages and the databases
 * every command opens stay sound; only a walk of the WAL's tree (the compacting copy's) meets the damage.
 * The node is the main tree's leaf entry: 48 bytes of MDB_db (F_SUBDATA), key "wal", the root last. */
static void damage_wal_root(const char *dir)
{
    char p[300];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    unsigned char *b = malloc((size_t)st.st_size);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
    static const unsigned char node[] = {48, 0, 0, 0, 0x02, 0, 3, 0, 'w', 'a', 'l'};
    off_t at = -1;
    for (off_t i = 0; i + (off_t)sizeof node + 48 <= st.st_size; i++)
        if (!memcmp(b + i, node, sizeof node)) {
            ck_assert_msg(at < 0, "two wal database entries in %s", p);
            at = i + (off_t)sizeof node + 40;
        }
    ck_assert_msg(at >= 0, "no wal database entry in %s", p);
    size_t root = 0x7fffffff;
    ck_assert_int_eq(pwrite(fd, &root, sizeof root, at), (ssize_t)sizeof root);
    free(b);
    close(fd);
}

/* A damaged tree (the wal database's root past the file's end, which the open's walk of the trees finds
 * before LMDB's copy would meet it) is a damaged DIR: exit 1, DEST as it was (made: gone; an empty
 * directory: empty). A stream address is refused at once: backup copies directories. */
START_TEST(test_backup_damage_and_stream)
{
    char dir[256], compact[256], dest[256];
    make_dir(dir, sizeof dir, "w", (wl_opts){0});
    tdir(compact, sizeof compact, "compact");
    tu_run r = wal_ok("backup", dir, compact);
    tu_run_free(&r);
    damage_wal_root(compact);
    for (int existed = 0; existed < 2; existed++) {
        tdir(dest, sizeof dest, existed ? "bk-empty" : "bk");
        if (existed)
            ck_assert_int_eq(mkdir(dest, 0755), 0);
        r = wal("backup", compact, dest);
        ck_assert_msg(r.status == 1, "exit %d: %s", r.status, r.err);
        ck_assert_msg(strstr(r.err, "data.mdb is damaged: the wal tree names page 2147483647"), "%s", r.err);
        tu_run_free(&r);
        if (existed)
            ck_assert_int_eq(tu_dir_entries(dest), 0);
        else
            ck_assert_int_eq(access(dest, F_OK), -1);
    }
    /* port 1: nothing listens there, and nothing must be tried */
    r = wal("backup", "nats://127.0.0.1:1/w", dest);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "is a stream address") && strstr(r.err, "keel-wal restore"), "%s", r.err);
    tu_run_free(&r);
}
END_TEST

/* ---- suites --------------------------------------------------------------------------------- */

/* ---- suite walcli_oom: every allocation of keel-wal failed in turn ------------------------------ */

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) /* the test is skipped there */
/* keel-wal args with the k-th allocation of the process failing
 * (libkeel_oom_preload, oom_shim.c); *fired: whether it did. */
static tu_run wal_oom(const char *const *args, long k, const char *report, bool *fired)
{
    char kbuf[32], line[32] = "";
    snprintf(kbuf, sizeof kbuf, "%ld", k);
    unlink(report);
    ck_assert_int_eq(setenv("LD_PRELOAD", KEEL_OOM_PRELOAD_LIB, 1), 0);
    ck_assert_int_eq(setenv("OOM_FAIL_AT", kbuf, 1), 0);
    ck_assert_int_eq(setenv("OOM_REPORT", report, 1), 0);
    tu_run r = wal_argv(args);
    unsetenv("LD_PRELOAD");
    unsetenv("OOM_FAIL_AT");
    unsetenv("OOM_REPORT");
    FILE *f = fopen(report, "r");
    ck_assert_msg(f && fgets(line, sizeof line, f), "keel-wal %s, allocation %ld failing: no report (status %d: %s)",
                  args[0], k, r.status, r.err);
    fclose(f);
    *fired = !strcmp(line, "fired=1\n");
    return r;
}
#endif

/* Each command, run again and again with its k-th allocation failing, for
 * k = 1, 2, ... until a run does not reach it: it exits 0 with exactly
 * the output of a normal run, or 2 saying it ran out of memory -- never a
 * signal, never 1 (what it found wrong in the directory), never "damaged"
 * (keel-wal's answer to a fault inside LMDB), never a partial success. */
START_TEST(test_oom_every_allocation)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    fprintf(stderr, "test_oom_every_allocation: SKIPPED: the sanitizer runtime must come first, before a "
                    "preloaded malloc\n");
#else
    char dir[256], report[300];
    make_dir(dir, sizeof dir, "oom", (wl_opts){.retain = true, .checkpoint_after = 6});
    snprintf(report, sizeof report, "%s.report", dir);
    const char *const cmds[][7] = {
        {"info", dir, "--json", NULL},
        {"dump", dir, "--json", NULL},
        {"verify", dir, NULL},
        {"stats", dir, "--top", "3", NULL},
        {"replay", dir, "--to-tick", "9", "--json", NULL},
        {"diff", dir, "--from-tick", "3", "--to-tick", "9", NULL},
        {"tail", dir, "-n", "5", NULL},
    };
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        tu_run ref = wal_ok_argv(cmds[c]);
        long k;
        bool fired = true;
        for (k = 1; fired; k++) {
            tu_run r = wal_oom(cmds[c], k, report, &fired);
            const char *what = cmds[c][0];
            ck_assert_msg(r.status == 0 || r.status == 2, "keel-wal %s, allocation %ld failing: status %d: %s", what,
                          k, r.status, r.err);
            if (r.status == 0) {
                ck_assert_msg(!strcmp(r.out, ref.out), "keel-wal %s, allocation %ld failing: exit 0, other output",
                              what, k);
            } else {
                ck_assert_msg(strstr(r.err, "memory") && !strstr(r.err, "damaged"),
                              "keel-wal %s, allocation %ld failing: %s", what, k, r.err);
            }
            tu_run_free(&r);
        }
        fprintf(stderr, "keel-wal %s: %ld allocations failed in turn\n", cmds[c][0], k - 2);
        ck_assert_int_gt(k, 10);
        tu_run_free(&ref);
    }
#endif
}
END_TEST

static TCase *tcase(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    tcase_set_timeout(tc, 120);
    return tc;
}

static Suite *args_suite(void)
{
    Suite *s = suite_create("walcli_args");
    TCase *tc = tcase("args");
    tcase_add_test(tc, test_help);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_bad_directories);
    tcase_add_test(tc, test_truncated_file);
    tcase_add_test(tc, test_damaged_files);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *read_suite(void)
{
    Suite *s = suite_create("walcli_read");
    TCase *tc = tcase("read");
    tcase_add_test(tc, test_info);
    tcase_add_test(tc, test_dump_json_values);
    tcase_add_test(tc, test_dump_filters);
    tcase_add_test(tc, test_stats_match_info);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *verify_suite(void)
{
    Suite *s = suite_create("walcli_verify");
    TCase *tc = tcase("verify");
    tcase_add_test(tc, test_verify_good);
    tcase_add_test(tc, test_verify_corrupt_record);
    tcase_add_test(tc, test_sides_record);
    tcase_add_test(tc, test_verify_gap_and_unit);
    tcase_add_test(tc, test_verify_checkpoint);
    tcase_add_test(tc, test_read_only_media);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *live_suite(void)
{
    Suite *s = suite_create("walcli_live");
    TCase *tc = tcase("live");
    tcase_add_test(tc, test_live_read);
    tcase_add_test(tc, test_tail_follow);
    tcase_add_test(tc, test_tail_follow_gap);
    tcase_add_test(tc, test_detach);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *backup_suite(void)
{
    Suite *s = suite_create("walcli_backup");
    TCase *tc = tcase("backup");
    tcase_add_test(tc, test_backup_claim_and_signals);
    tcase_add_test(tc, test_backup_damage_and_stream);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *oom_suite(void)
{
    Suite *s = suite_create("walcli_oom");
    TCase *tc = tcase("oom");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_oom_every_allocation);
    suite_add_tcase(s, tc);
    return s;
}

KEEL_TEST_MAIN(args_suite, read_suite, verify_suite, live_suite, backup_suite, oom_suite)
