/*
 * test_util.c -- time and waiting, runtimes, temporary directories, tools
 * run as child processes and WAL records on disk, for every test program
 * (test_util.h says what each helper does).
 */
#include "test_util.h"

#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/hash.h"
#include "keel_test.h"
#include "keel_wal/wal.h"

/* ---- time and waiting ---------------------------------------------------------------------- */

uint64_t tu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool tu_reached_u32(void *v, uint64_t target)
{
    return atomic_load((_Atomic uint32_t *)v) >= target;
}

static bool tu_reached_u64(void *v, uint64_t target)
{
    return atomic_load((_Atomic uint64_t *)v) >= target;
}

static bool tu_wait_until(bool (*reached)(void *v, uint64_t target), void *v, uint64_t target)
{
    uint64_t deadline = tu_now_ns() + 30ull * 1000000000ull;
    while (!reached(v, target)) {
        if (tu_now_ns() > deadline)
            return false;
        sched_yield();
    }
    return true;
}

bool tu_wait_at_least_u32(_Atomic uint32_t *v, uint32_t target)
{
    return tu_wait_until(tu_reached_u32, (void *)v, target);
}

bool tu_wait_at_least_u64(_Atomic uint64_t *v, uint64_t target)
{
    return tu_wait_until(tu_reached_u64, (void *)v, target);
}

/* How many of this process's threads are named `name` (/proc/self/task);
 * *first: the id of one of them (0: none). */
static int threads_named(const char *name, pid_t *first)
{
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    *first = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread ended meanwhile */
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        if (!strcmp(comm, name) && !n++)
            *first = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

int tu_threads_named(const char *name)
{
    pid_t first;
    return threads_named(name, &first);
}

pid_t tu_thread_id(const char *name)
{
    pid_t first;
    threads_named(name, &first);
    return first;
}

/* A joined thread's /proc entry can outlive pthread_join by a moment (the
 * kernel clears the tid before it unlists the task): poll, up to 60 s, for
 * no thread to be named `name` -- a condition, not a guess at a duration --
 * and say whether that happened. */
bool tu_threads_gone(const char *name)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (!tu_threads_named(name))
            return true;
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 60);
    return false;
}

/* Whether every thread of pid is stopped: 'T' in its /proc stat (a
 * job-control stop; 't' under a tracer), or a thread that can never run
 * again ('Z', 'X', or gone meanwhile). */
static bool all_threads_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "process %d is gone", (int)pid);
    bool stopped = true;
    for (struct dirent *e; stopped && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[400], fields[512] = "";
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(fields, 1, sizeof fields - 1, f);
        fclose(f);
        fields[n] = '\0';
        const char *paren = strrchr(fields, ')'); /* the name may hold spaces and parentheses */
        stopped = !paren || paren[1] != ' ' || (paren[2] && strchr("TtZX", paren[2]));
    }
    closedir(d);
    return stopped;
}

/* SIGSTOP stops a process's threads one by one: the kernel wakes one,
 * which then tells the others, and a thread already running goes on
 * until it next enters the kernel -- kill() returning says nothing about
 * that. Poll until every thread shows the stop (a condition, with a
 * generous 30 s guard). */
void tu_stop_process(pid_t pid)
{
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    uint64_t deadline = tu_now_ns() + 30ull * 1000000000ull;
    while (!all_threads_stopped(pid)) {
        ck_assert_msg(tu_now_ns() < deadline, "process %d did not stop within 30 s", (int)pid);
        sched_yield();
    }
}

/* ---- runtimes -------------------------------------------------------------------------------- */

keel_runtime *tu_rt_new(keel_runtime_desc d)
{
    keel_runtime *rt = NULL;
    ck_assert_ok(keel_runtime_create(&d, &rt));
    ck_assert_ptr_nonnull(rt);
    if (d.workers > 0)
        ck_assert_uint_eq(keel_runtime_workers(rt), (uint32_t)d.workers);
    return rt;
}

void tu_step_n(keel_runtime *rt, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        ck_assert_ok(keel_runtime_step(rt));
}

void tu_print_diags(const keel_schedule *s)
{
    for (uint32_t i = 0; i < keel_schedule_diag_count(s); i++) {
        const keel_sched_diag *d = keel_schedule_diag(s, i);
        fprintf(stderr, "diag %s: %s\n", keel_sched_code_name(d->code), d->message);
    }
}

void tu_install(keel_runtime *rt, keel_schedule *s)
{
    int rc = keel_schedule_build(s);
    if (rc)
        tu_print_diags(s);
    ck_assert_msg(rc == KEEL_OK, "keel_schedule_build: %s: %s", keel_strerror(rc), keel_last_error());
    ck_assert_ok(keel_runtime_set_schedule(rt, s));
}

keel_world *tu_world_new(keel_world_desc d)
{
    keel_world *w = NULL;
    ck_assert_ok(keel_world_create(&d, &w));
    ck_assert_ptr_nonnull(w);
    return w;
}

keel_cmdbuf *tu_cmdbuf_new(keel_world *w)
{
    keel_cmdbuf *cb = NULL;
    ck_assert_ok(keel_cmdbuf_create(w, &cb));
    ck_assert_ptr_nonnull(cb);
    return cb;
}

void tu_cmdbuf_apply_created(keel_cmdbuf *cb, uint32_t n, keel_entity *out)
{
    ck_assert_ok(keel_cmdbuf_apply(cb));
    keel_cmd_result r = keel_cmdbuf_result(cb);
    ck_assert_uint_eq(r.created_count, n);
    if (out)
        memcpy(out, r.created, n * sizeof *out);
    keel_cmdbuf_destroy(cb);
}

void tu_destroy_now(keel_world *w, keel_entity e)
{
    keel_cmdbuf *cb = tu_cmdbuf_new(w);
    ck_assert_ok(keel_cmd_destroy(cb, e));
    ck_assert_ok(keel_cmdbuf_apply(cb));
    ck_assert_uint_eq(keel_cmdbuf_result(cb).destroyed, 1);
    keel_cmdbuf_destroy(cb);
    ck_assert(!keel_alive(w, e));
}

keel_component tu_reg(keel_world *w, const char *name, uint32_t size, keel_discipline disc,
                      const keel_field *fields, uint32_t nfields)
{
    keel_component_desc d = {.name = name, .size = size, .discipline = disc, .fields = fields, .field_count = nfields};
    keel_component id = 0;
    ck_assert_ok(keel_component_register(w, &d, &id));
    ck_assert_uint_ne(id, 0);
    return id;
}

keel_query *tu_query_new(keel_world *w, keel_component c0, keel_component c1)
{
    keel_query_desc d = {.with = {c0, c1}};
    keel_query *q = NULL;
    ck_assert_ok(keel_query_create(w, &d, &q));
    return q;
}

keel_system_record tu_sysrec(keel_runtime *rt, uint64_t tick, keel_system sys)
{
    keel_system_record r;
    memset(&r, 0, sizeof r);
    ck_assert_ok(keel_telemetry_system(rt, tick, sys, &r));
    ck_assert_uint_eq(r.system, sys);
    return r;
}

keel_runtime_stats tu_stats(const keel_runtime *rt)
{
    keel_runtime_stats st;
    memset(&st, 0xab, sizeof st);
    keel_runtime_stats_get(rt, &st);
    return st;
}

int tu_sys_noop(keel_ctx *ctx, void *user)
{
    (void)ctx;
    (void)user;
    return 0;
}

uint64_t tu_rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return core_mix64(*state);
}

uint32_t tu_rng_below(uint64_t *state, uint32_t n)
{
    return (uint32_t)(tu_rng_next(state) % n);
}

/* ---- temporary directories ------------------------------------------------------------- */

static char tu_base_dir[128];

/* "walcli" for test_walcli: names the base and the KEEP variable. */
static const char *tu_program(void)
{
    const char *p = program_invocation_short_name;
    return strncmp(p, "test_", 5) ? p : p + 5;
}

void tu_base_setup(void)
{
    ck_assert_int_lt(snprintf(tu_base_dir, sizeof tu_base_dir, "/tmp/keel-%s-XXXXXX", tu_program()),
                     (int)sizeof tu_base_dir);
    ck_assert_ptr_nonnull(mkdtemp(tu_base_dir));
}

static bool tu_keep(void)
{
    char var[128];
    snprintf(var, sizeof var, "KEEL_%s_KEEP", tu_program());
    for (char *v = var; *v; v++)
        *v = (char)toupper((unsigned char)*v);
    return getenv(var) != NULL;
}

void tu_base_teardown(void)
{
    if (tu_base_dir[0] && !tu_keep())
        tu_rmtree(tu_base_dir);
    tu_base_dir[0] = 0;
}

const char *tu_base(void)
{
    return tu_base_dir;
}

void tu_path(char *out, size_t n, const char *name)
{
    ck_assert_int_lt(snprintf(out, n, "%s/%s", tu_base_dir, name), (int)n);
}

/* Pre-order: a directory a test made unreadable gets its mode back before
 * the walk needs to read it. */
static int tu_chmod_entry(const char *path, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    if (flag == FTW_D || flag == FTW_DNR)
        chmod(path, 0700);
    return 0;
}

static int tu_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

void tu_rmtree(const char *dir)
{
    nftw(dir, tu_chmod_entry, 16, FTW_PHYS);
    nftw(dir, tu_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void tu_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* A test case `name` of suite s holding the n tests. */
static TCase *case_of(Suite *s, const char *name, const TTest *const *tests, size_t n)
{
    TCase *tc = tcase_create(name);
    for (size_t i = 0; i < n; i++)
        tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return tc;
}

Suite *tu_suite_with(const char *name, const TTest *const *tests, size_t n, int timeout, void (*setup)(void),
                     void (*teardown)(void))
{
    Suite *s = suite_create(name);
    TCase *tc = case_of(s, name, tests, n);
    tcase_add_unchecked_fixture(tc, tu_base_setup, tu_base_teardown);
    if (setup || teardown)
        tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, timeout);
    return s;
}

Suite *tu_suite(const char *name, const TTest *const *tests, size_t n, int timeout)
{
    return tu_suite_with(name, tests, n, timeout, NULL, NULL);
}

Suite *tu_case_suite(const char *suite_name, const char *case_name, const TTest *const *tests, size_t n)
{
    Suite *s = suite_create(suite_name);
    case_of(s, case_name, tests, n);
    return s;
}

tu_digest tu_file_digest(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    tu_digest d = {0, 1469598103934665603ull};
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

void tu_copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    ck_assert_msg(in && out, "cannot copy %s to %s: %s", src, dst, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    ck_assert_int_eq(fclose(out), 0);
}

/* LMDB's meta page on a 64-bit build (wal/store.c reads the same): a 16-byte page
 * header, then magic (u32), version (u32), ..., the page size at 40, the main tree's root at 128, the last
 * page at 136, the transaction id at 144; pages of 4096 bytes. */
#define MDB_META_MAGIC 16
#define MDB_META_VERSION 20
#define MDB_META_PSIZE 40      /* the free database's pad */
#define MDB_META_MAIN_ROOT 128
#define MDB_META_LAST_PG 136
#define MDB_META_TXNID 144
#define MDB_PAGE 4096

const struct tu_damage_info tu_damages[TU_DAMAGE_COUNT] = {
    {"empty", "the file is empty", false},
    {"one page short", "it is truncated", false},
    {"half", "it is truncated", false},
    {"only the meta pages", "it is truncated", false},
    {"torn meta page 0", "meta page 0 has no LMDB magic", false},
    {"torn meta page 1", "meta page 1 has no LMDB magic", false},
    {"a meta pointing past the end", "is not a free page: the file is truncated", false},
    {"a root past the last page", "puts the root of the main tree at page", false},
    {"a newer LMDB data version", "has LMDB data version 2", false},
    {"100 bytes", "fewer than its first meta page", false},
    {"a page size of 1000", "gives a page size of 1000 bytes", false},
    {"two page sizes", "meta page 1 says pages are 8192 bytes, meta page 0 says 4096", false},
    {"a meta page numbered 7", "meta page 1 is not marked as one (page number 7", false},
    {"a last page of 0", "says the last page is 0, below the meta pages", false},
    {"a tree page naming another", "(it names page 12345", true},
    {"a tree page of the wrong type", "of the wal tree, at depth 1 of ", true},
    {"a node in a page's header", "of the wal tree is at offset 2, outside the page's nodes", true},
};

static uint64_t mdb_rd64(const char *path, long off)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    uint64_t v = 0;
    ck_assert_int_eq(pread(fd, &v, sizeof v, off), (ssize_t)sizeof v);
    close(fd);
    return v;
}

static void mdb_wr(const char *path, long off, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, p, n, off), (ssize_t)n);
    close(fd);
}

/* The root page of the named database `name` in the newest snapshot (the
 * main tree a single leaf page, as in every test world): its leaf nodes are
 * u16 offsets after the 16-byte page header, each node u16 lo, hi, flags,
 * key size, the key, then the database's record, whose root is at 40. */
static uint64_t mdb_db_root(const char *path, long newest, const char *name)
{
    unsigned char page[MDB_PAGE];
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    uint64_t main_root = mdb_rd64(path, newest + MDB_META_MAIN_ROOT), root = 0;
    ck_assert_int_eq(pread(fd, page, sizeof page, (off_t)(main_root * MDB_PAGE)), (ssize_t)sizeof page);
    close(fd);
    uint16_t lower, off, ksize;
    memcpy(&lower, page + 12, 2);
    for (unsigned i = 0; i < (lower - 16u) / 2 && !root; i++) {
        memcpy(&off, page + 16 + 2 * i, 2);
        memcpy(&ksize, page + off + 6, 2);
        if (ksize == strlen(name) && !memcmp(page + off + 8, name, ksize))
            memcpy(&root, page + off + 8 + ksize + 40, 8);
    }
    ck_assert_msg(root >= 2, "no database '%s' in the main tree of %s", name, path);
    return root;
}

void tu_damage_apply(const char *mdb, tu_damage d)
{
    struct stat st;
    ck_assert_int_eq(stat(mdb, &st), 0);
    uint64_t size = (uint64_t)st.st_size, v64;
    uint32_t v32 = 0;
    long newest = mdb_rd64(mdb, MDB_PAGE + MDB_META_TXNID) > mdb_rd64(mdb, MDB_META_TXNID) ? MDB_PAGE : 0;
    switch (d) {
    case TU_DAMAGE_EMPTY:
    case TU_DAMAGE_PAGE_SHORT:
    case TU_DAMAGE_HALF:
    case TU_DAMAGE_METAS_ONLY: {
        off_t to = d == TU_DAMAGE_EMPTY ? 0 : d == TU_DAMAGE_PAGE_SHORT ? (off_t)(size - MDB_PAGE)
                 : d == TU_DAMAGE_HALF ? (off_t)(size / 2) : 2 * MDB_PAGE;
        ck_assert_int_eq(truncate(mdb, to), 0);
        break;
    }
    case TU_DAMAGE_TORN_META0:
    case TU_DAMAGE_TORN_META1:
        mdb_wr(mdb, (d == TU_DAMAGE_TORN_META1 ? MDB_PAGE : 0) + MDB_META_MAGIC, &v32, 4);
        break;
    case TU_DAMAGE_LAST_PAST_END:
        v64 = size / MDB_PAGE + 10;
        mdb_wr(mdb, newest + MDB_META_LAST_PG, &v64, 8);
        break;
    case TU_DAMAGE_ROOT_PAST_LAST:
        v64 = mdb_rd64(mdb, MDB_META_LAST_PG) + 1;
        mdb_wr(mdb, MDB_META_MAIN_ROOT, &v64, 8);
        break;
    case TU_DAMAGE_VERSION:
        v32 = 2;
        mdb_wr(mdb, newest + MDB_META_VERSION, &v32, 4);
        break;
    case TU_DAMAGE_TINY:
        ck_assert_int_eq(truncate(mdb, 100), 0);
        break;
    case TU_DAMAGE_PAGE_SIZE:
    case TU_DAMAGE_PAGE_SIZES:
        v32 = d == TU_DAMAGE_PAGE_SIZE ? 1000 : 8192;
        mdb_wr(mdb, (d == TU_DAMAGE_PAGE_SIZE ? 0 : MDB_PAGE) + MDB_META_PSIZE, &v32, 4);
        break;
    case TU_DAMAGE_PAGE_NUMBER:
        v64 = 7;
        mdb_wr(mdb, MDB_PAGE, &v64, 8);
        break;
    case TU_DAMAGE_LAST_ZERO:
        v64 = 0;
        mdb_wr(mdb, newest + MDB_META_LAST_PG, &v64, 8);
        break;
    case TU_DAMAGE_TREE_SELF:
        v64 = 12345;
        mdb_wr(mdb, (long)(mdb_db_root(mdb, newest, "wal") * MDB_PAGE), &v64, 8);
        break;
    case TU_DAMAGE_TREE_TYPE: { /* the page flags at 10: branch 1 <-> leaf 2 */
        long at = (long)(mdb_db_root(mdb, newest, "wal") * MDB_PAGE) + 10;
        uint16_t flags = (uint16_t)mdb_rd64(mdb, at);
        flags ^= 3;
        mdb_wr(mdb, at, &flags, 2);
        break;
    }
    case TU_DAMAGE_TREE_NODE: {
        uint16_t off = 2;
        mdb_wr(mdb, (long)(mdb_db_root(mdb, newest, "wal") * MDB_PAGE) + 16, &off, 2);
        break;
    }
    default:
        ck_abort();
    }
}

int tu_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot open directory %s: %s", dir, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

uint64_t tu_file_mtime_ns(const char *path)
{
    struct stat st;
    ck_assert_msg(stat(path, &st) == 0, "cannot stat %s: %s", path, strerror(errno));
    return (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
}

uint64_t tu_vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    unsigned long long kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

uint32_t tu_count_lines(const char *s)
{
    uint32_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* ---- running a tool ---------------------------------------------------------------------- */

static void tu_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = realloc(*buf, *cap);
        ck_assert_ptr_nonnull(*buf);
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
}

/* Fork; the child gets pipes for stdout and stderr and runs run(arg), which
 * execs or exits; the parent reads both pipes to their end and reaps it. */
static tu_run tu_run_child(void (*run)(void *arg), void *arg)
{
    int po[2], pe[2];
    ck_assert_int_eq(pipe(po), 0);
    ck_assert_int_eq(pipe(pe), 0);
    fflush(NULL); /* nothing buffered here is written twice by the child */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]);
        close(pe[0]);
        close(po[1]);
        close(pe[1]);
        run(arg);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    tu_run r = {0};
    size_t ocap = 0, ecap = 0;
    tu_append(&r.out, &r.outlen, &ocap, "", 0);
    tu_append(&r.err, &r.errlen, &ecap, "", 0);
    /* both pipes at once: a tool filling one while the test waits on the other would hang */
    struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
    int open_fds = 2;
    char buf[65536];
    while (open_fds) {
        ck_assert_int_ge(poll(fds, 2, -1), 0);
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k > 0) {
                if (i == 0)
                    tu_append(&r.out, &r.outlen, &ocap, buf, (size_t)k);
                else
                    tu_append(&r.err, &r.errlen, &ecap, buf, (size_t)k);
            } else if (k == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    r.status = tu_wait(pid);
    return r;
}

static void tu_exec(void *arg)
{
    char *const *argv = arg;
    execv(argv[0], argv);
}

/* argv for an exec: bin, then args up to their NULL. */
static void argv_of(const char *bin, const char *const *args, const char *argv[64])
{
    argv[0] = bin;
    int n = 1;
    for (; args[n - 1]; n++) {
        ck_assert_int_lt(n, 63);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
}

tu_run tu_run_argv(const char *bin, const char *const *args)
{
    const char *argv[64];
    argv_of(bin, args, argv);
    return tu_run_child(tu_exec, (void *)argv);
}

typedef struct tu_fn {
    void (*fn)(void);
} tu_fn;

static void tu_call(void *arg)
{
    ((tu_fn *)arg)->fn();
    exit(0); /* not _exit: a sanitizer build's leak check runs in the child too */
}

tu_run tu_run_fn(void (*fn)(void))
{
    tu_fn f = {fn};
    return tu_run_child(tu_call, &f);
}

void tu_run_free(tu_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

pid_t tu_spawn_reader(const char *bin, const char *const *args, const char *errpath, void (*setup)(void *arg),
                      void *arg, FILE **out)
{
    const char *argv[64];
    argv_of(bin, args, argv);
    int po[2];
    ck_assert_int_eq(pipe(po), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(po[1], 1);
        close(po[0]);
        close(po[1]);
        if (!freopen(errpath ? errpath : "/dev/null", "w", stderr))
            _exit(126);
        if (setup)
            setup(arg);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    *out = fdopen(po[0], "r");
    ck_assert_ptr_nonnull(*out);
    return pid;
}

void tu_wait_nanosleep(pid_t pid, const char *what)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    for (uint64_t until = tu_now_ns() + 60000000000ull; tu_now_ns() < until;) {
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        bool got = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        long nr = got ? strtol(buf, NULL, 10) : -1;
        if (nr == SYS_nanosleep || nr == SYS_clock_nanosleep)
            return;
        sched_yield();
    }
    ck_abort_msg("%s never slept", what);
}

int tu_wait(pid_t pid)
{
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- WAL records on disk ------------------------------------------------------------------- */

void tu_wal_open(tu_wal_reader *w, const char *dir, uint64_t from)
{
    *w = (tu_wal_reader){0};
    kw_store_desc sd = {.flags = KW_OPEN_READONLY};
    ck_assert_ok(kw_store_open(dir, &sd, &w->st));
    ck_assert_ok(kw_read_begin(w->st, &w->r));
    ck_assert_ok(kw_wal_iter(w->r, from, &w->it));
}

void tu_wal_close(tu_wal_reader *w)
{
    if (w->it)
        kw_wal_iter_end(w->it);
    kw_read_end(w->r);
    kw_store_close(w->st);
    *w = (tu_wal_reader){0};
}

void *tu_record_copy(const char *dir, uint64_t lsn, size_t *len)
{
    tu_wal_reader w;
    tu_wal_open(&w, dir, lsn);
    uint64_t got = 0;
    const void *rec = NULL;
    ck_assert_int_eq(kw_wal_next(w.it, &got, &rec, len), 1);
    ck_assert_uint_eq(got, lsn);
    void *copy = malloc(*len);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, rec, *len);
    tu_wal_close(&w);
    return copy;
}

uint32_t tu_flip_copies(const char *path, const void *needle, size_t n, size_t at)
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

typedef struct tu_put {
    kw_db db;
    const void *key, *val;
    size_t klen, vlen;
} tu_put;

static int tu_fill_put(kw_wtxn *t, void *arg)
{
    const tu_put *p = arg;
    return kw_put(t, p->db, p->key, p->klen, p->val, p->vlen);
}

void tu_db_put(const char *dir, kw_db db, const void *key, size_t klen, const void *val, size_t vlen)
{
    kw_store *st = NULL;
    kw_store_desc sd = {0};
    ck_assert_ok(kw_store_open(dir, &sd, &st));
    tu_put p = {db, key, val, klen, vlen};
    ck_assert_ok(kw_store_write(st, tu_fill_put, &p));
    kw_store_close(st);
}

void tu_wal_put(const char *dir, uint64_t lsn, const void *rec, size_t len)
{
    unsigned char key[8]; /* the WAL's keys: big-endian LSNs */
    for (int i = 0; i < 8; i++)
        key[i] = (unsigned char)(lsn >> (56 - 8 * i));
    tu_db_put(dir, KW_DB_WAL, key, sizeof key, rec, len);
}

uint32_t tu_checkpoint_slots(const char *dir, const uint32_t *forge)
{
    kw_codec_ctx *c = NULL;
    ck_assert_ok(kw_codec_create(NULL, &c));
    tu_wal_reader rd;
    tu_wal_open(&rd, dir, 0);
    const void *val, *p;
    size_t vlen, plen;
    ck_assert_ok(kw_get(rd.r, KW_DB_SNAP, "T", 1, &val, &vlen));
    kw_header h;
    ck_assert_ok(kw_record_check(val, vlen, &h));
    ck_assert_ok(kw_snap_payload(c, val, vlen, KW_KIND_SNAP_TABLES, &p, &plen));
    ck_assert_uint_ge(plen, 12); /* u32 ntables, u32 nslots, u32 nlive (little-endian) */
    unsigned char *raw = malloc(plen);
    ck_assert_ptr_nonnull(raw);
    memcpy(raw, p, plen);
    tu_wal_close(&rd);
    uint32_t held = (uint32_t)raw[4] | (uint32_t)raw[5] << 8 | (uint32_t)raw[6] << 16 | (uint32_t)raw[7] << 24;
    if (forge) {
        for (int b = 0; b < 4; b++)
            raw[4 + b] = (unsigned char)(*forge >> (8 * b));
        kw_buf out = {0};
        ck_assert_ok(kw_record_build(c, &out, h.kind, h.lsn, h.tick, h.flags, raw, plen));
        tu_db_put(dir, KW_DB_SNAP, "T", 1, out.p, out.len);
        kw_buf_free(&out);
    }
    free(raw);
    kw_codec_destroy(c);
    return held;
}

bool tu_names_lsn(const char *msg, uint64_t lsn)
{
    char want[40];
    snprintf(want, sizeof want, "LSN %" PRIu64, lsn);
    for (const char *p = strstr(msg, want); p; p = strstr(p + 1, want))
        if (p[strlen(want)] < '0' || p[strlen(want)] > '9')
            return true;
    return false;
}
