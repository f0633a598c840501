/*
 * test_powerloss.c -- simulated power loss (libkeel_powerloss, LD_PRELOAD):
 * the shim itself, then a durable runtime cut at many points.
 *
 *   powerloss_shim     powerloss_helper (a tiny program, exec'd with the shim
 *                      preloaded) performs a list of file operations; the cut
 *                      replaces its N-th tracked write. Synced data survives,
 *                      unsynced writes are undone exactly (bytes and size),
 *                      O_DSYNC / RWF_DSYNC writes and msync(MS_SYNC) ranges
 *                      survive page by page, sync_file_range is no barrier,
 *                      a new file whose entry was never synced disappears,
 *                      ftruncate and O_TRUNC are undone, closing or dup'ing a
 *                      descriptor changes nothing, files outside the directory
 *                      are not touched, a file mapped writable is left as it
 *                      is, and tear mode keeps a deterministic subset of pages.
 *   powerloss_runtime  the crash workload of crash_util.[ch] in children
 *                      exec'd with the shim: a sweep of cut points N on fresh
 *                      directories (the first writes of a new directory, then
 *                      spread over a run), in drop and tear mode, each cut
 *                      followed by an unshimmed child that must recover a
 *                      reference state holding every acknowledged transfer and
 *                      continue to the reference's end; and rounds of cuts on
 *                      one directory (checkpoints, a map that grows, IMMEDIATE
 *                      and GROUP ticks), then a clean run to the end.
 *
 * The runtime suite execs the test binary itself (it is the crash child), so
 * it is skipped in sanitizer builds: a sanitizer runtime must come first in
 * the library list, before a preloaded library. The shim and the helper are
 * built without sanitizers, so powerloss_shim runs everywhere.
 * KEEL_CRASH_SEED changes the cut points of the rounds; KEEL_CRASH_VERBOSE=1
 * prints every child's story; KEEL_POWERLOSS_VERBOSE=1 (inherited) the shim's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crash_util.h"
#include "keel_test.h"

#ifndef KEEL_POWERLOSS_LIB
#error "KEEL_POWERLOSS_LIB (the shim's path) must be defined by the build"
#endif
#ifndef KEEL_POWERLOSS_HELPER
#error "KEEL_POWERLOSS_HELPER (powerloss_helper's path) must be defined by the build"
#endif

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PL_SANITIZED 1
#endif
#endif
#ifndef PL_SANITIZED
#define PL_SANITIZED 0
#endif

/* ---- the shim's environment ------------------------------------------------------------- */

typedef struct plenv {
    char v[6][4200];
    const char *list[7];
} plenv;

/* The variables that load the shim on dir, cutting at write `cut` (0: never). */
static const char *const *plenv_make(plenv *e, const char *dir, uint64_t cut, const char *mode, uint64_t seed,
                                     const char *stats)
{
    snprintf(e->v[0], sizeof e->v[0], "LD_PRELOAD=%s", KEEL_POWERLOSS_LIB);
    snprintf(e->v[1], sizeof e->v[1], "KEEL_POWERLOSS_DIR=%s", dir);
    snprintf(e->v[2], sizeof e->v[2], "KEEL_POWERLOSS_CUT=%" PRIu64, cut);
    snprintf(e->v[3], sizeof e->v[3], "KEEL_POWERLOSS_MODE=%s", mode);
    snprintf(e->v[4], sizeof e->v[4], "KEEL_POWERLOSS_SEED=%" PRIu64, seed);
    snprintf(e->v[5], sizeof e->v[5], "KEEL_POWERLOSS_STATS=%s", stats);
    for (int i = 0; i < 6; i++)
        e->list[i] = e->v[i];
    e->list[6] = NULL;
    return e->list;
}

/* The value of `key=` in a stats line, or UINT64_MAX. */
static uint64_t stat_of(const char *stats, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "%s=", key);
    for (const char *p = stats; (p = strstr(p, pat)); p++)
        if (p == stats || p[-1] == ' ')
            return strtoull(p + strlen(pat), NULL, 10);
    return UINT64_MAX;
}

/* The whole file at path (NULL when it does not exist); *n gets its size. */
static unsigned char *slurp(const char *path, size_t *n)
{
    *n = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    unsigned char *b = malloc((size_t)st.st_size + 1);
    ck_assert_ptr_nonnull(b);
    ssize_t r = st.st_size ? pread(fd, b, (size_t)st.st_size, 0) : 0;
    ck_assert_int_eq(r, st.st_size);
    close(fd);
    *n = (size_t)st.st_size;
    return b;
}

/* ---- powerloss_shim: the helper --------------------------------------------------------- */

typedef struct shimdir {
    tmpdir t;
    char stats[128];
} shimdir;

static void shimdir_make(shimdir *d)
{
    tmpdir_make(&d->t);
    ck_assert_int_eq(mkdir(d->t.data, 0755), 0);
    snprintf(d->stats, sizeof d->stats, "%s/stats", d->t.base);
}

typedef struct hrun {
    int status;
    char stats[512];
} hrun;

/* Run powerloss_helper on d with the operations ops (NULL-terminated),
 * preloading the shim, cut at write `cut`. */
static hrun helper_run(shimdir *d, uint64_t cut, const char *mode, uint64_t seed, const char *const *ops)
{
    plenv e;
    const char *const *env = plenv_make(&e, d->t.data, cut, mode, seed, d->stats);
    const char *argv[64] = {"powerloss_helper", d->t.data};
    int n = 2;
    for (; ops[n - 2]; n++) {
        ck_assert_int_lt(n, 63);
        argv[n] = ops[n - 2];
    }
    argv[n] = NULL;
    unlink(d->stats);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (int i = 0; env[i]; i++)
            putenv((char *)env[i]);
        execv(KEEL_POWERLOSS_HELPER, (char *const *)argv);
        _exit(127);
    }
    hrun r = {0};
    ck_assert_int_eq(waitpid(pid, &r.status, 0), pid);
    size_t sn;
    unsigned char *s = slurp(d->stats, &sn);
    if (s) {
        snprintf(r.stats, sizeof r.stats, "%.*s", (int)sn, (const char *)s);
        free(s);
    }
    return r;
}

#define OPS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void assert_cut(const hrun *r, uint64_t n)
{
    ck_assert_msg(WIFSIGNALED(r->status) && WTERMSIG(r->status) == SIGKILL,
                  "the helper was not cut by SIGKILL (status 0x%x, exit %d)", r->status,
                  WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1);
    ck_assert_msg(stat_of(r->stats, "cut") == n && stat_of(r->stats, "writes") == n,
                  "stats after a cut at write %" PRIu64 ": '%s'", n, r->stats);
}

static void assert_exit0(const hrun *r)
{
    ck_assert_msg(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0, "the helper ended with status 0x%x", r->status);
    ck_assert_msg(stat_of(r->stats, "cut") == 0, "stats of a run without a cut: '%s'", r->stats);
}

/* Run ops in drop mode, cut at write n (checked). */
static hrun cut_drop(shimdir *d, uint64_t n, const char *const *ops)
{
    hrun r = helper_run(d, n, "drop", 0, ops);
    assert_cut(&r, n);
    return r;
}

/* The file `name` of d holds exactly what `layout` says: spans
 * "OFF:LEN:C" separated by spaces (C a letter, or '.' for zero bytes); its
 * size is where the last span ends ("" : an empty file). */
static void assert_layout(const shimdir *d, const char *name, const char *layout)
{
    static unsigned char want[80000];
    size_t wn = 0, off, len;
    char ch;
    int used;
    memset(want, 0, sizeof want);
    for (const char *p = layout; sscanf(p, " %zu:%zu:%c%n", &off, &len, &ch, &used) == 3; p += used) {
        ck_assert_uint_le(off + len, sizeof want);
        memset(want + off, ch == '.' ? 0 : ch, len);
        wn = off + len > wn ? off + len : wn;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/%s", d->t.data, name);
    size_t n;
    unsigned char *b = slurp(path, &n);
    ck_assert_msg(b != NULL, "%s does not exist", name);
    ck_assert_msg(n == wn, "%s has %zu bytes, expected %zu (%s)", name, n, wn, layout);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(b[i] == want[i], "%s: byte %zu is 0x%02x, expected 0x%02x (%s)", name, i, b[i], want[i], layout);
    free(b);
}

static bool file_exists(const shimdir *d, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", d->t.data, name);
    return access(path, F_OK) == 0;
}

START_TEST(test_drop_undoes_unsynced)
{
    shimdir d;
    shimdir_make(&d);
    /* writes: 1 A, 2 B (overwrites page 1), 3 C (extends), 4 D (page 0), 5 E: the cut */
    hrun r = cut_drop(&d, 5, OPS("open", "f", "create", "pw", "0", "8192", "A", "fsync", "pw", "4096", "4096", "B", "pw",
                                 "8192", "4096", "C", "pw", "100", "10", "D", "pw", "0", "1", "E"));
    assert_layout(&d, "f", "0:8192:A");
    ck_assert_msg(stat_of(r.stats, "syncs") == 1 && stat_of(r.stats, "pages_dropped") == 3 &&
                      stat_of(r.stats, "bytes_undone") == 8202 && stat_of(r.stats, "files_removed") == 0 &&
                      stat_of(r.stats, "pages_torn") == 0,
                  "stats: '%s'", r.stats);
    tmpdir_remove(&d.t);
}
END_TEST

/* A drop-mode case: the operations, the write they are cut at, what the file
 * then holds (or that it is gone), and optionally one counter's value. The
 * comments count the tracked writes; Z is always the cut. */
typedef struct drop_case {
    const char *what;
    uint64_t cut;
    const char *const *ops;
    const char *file, *layout; /* layout NULL: the file does not exist */
    const char *stat;
    uint64_t value;
} drop_case;

/* 1 A at the position, 2 B+C (writev), 3 D (O_APPEND), 4 Z (O_APPEND after a seek) */
#define APPEND_OPS                                                                                                     \
    OPS("open", "f", "create", "w", "100", "A", "wv", "50", "B", "50", "C", "fsync", "open", "f", "append", "w", "10", \
        "D", "seek", "0", "w", "10", "Z")

static const drop_case drop_cases[] = {
    /* 1 A, 2 B, 3 C, 4 Z */
    {"fdatasync is a barrier", 4,
     OPS("open", "g", "create", "pw", "0", "100", "A", "fdatasync", "pw", "100", "100", "B", "fdatasync", "pw", "200",
         "100", "C", "pw", "0", "1", "Z"),
     "g", "0:100:A 100:100:B", "syncs", 2},
    /* 1 A, 2 X (page 0), 3 W (page 1, size 5010), 4 B through O_DSYNC (page 1:
     * with W, and the size), 5 Y (page 1 again, size 6010), 6 Z */
    {"an O_DSYNC write makes its pages and the size durable", 6,
     OPS("open", "f", "create", "pw", "0", "4096", "A", "fsync", "pw", "0", "10", "X", "pw", "5000", "10", "W", "open",
         "f", "dsync", "pw", "4096", "100", "B", "open", "f", "-", "pw", "6000", "10", "Y", "pw", "0", "1", "Z"),
     "f", "0:4096:A 4096:100:B 4196:804:. 5000:10:W", "syncs", 2},
    /* 1 A (RWF_DSYNC, on a new file: its entry too), 2 B, 3 Z */
    {"pwritev2 with RWF_DSYNC", 3,
     OPS("open", "g", "create", "pwv2", "0", "100", "A", "dsync", "pwv2", "100", "100", "B", "0", "pw", "0", "1", "Z"),
     "g", "0:100:A", NULL, 0},
    /* 1 A, 2 B (page 0), 3 C (page 1), msync of page 1, 4 Z */
    {"msync(MS_SYNC) makes its range durable", 4,
     OPS("open", "m", "create", "pw", "0", "8192", "A", "fsync", "pw", "0", "10", "B", "pw", "4096", "10", "C", "msync",
         "4096", "4096", "pw", "0", "1", "Z"),
     "m", "0:8192:A 4096:10:C", NULL, 0},
    /* 1 A, 2 shrink, 3 B into the cut-off part, 4 Z */
    {"ftruncate shrinking is undone", 4,
     OPS("open", "f", "create", "pw", "0", "12288", "A", "fsync", "trunc", "100", "pw", "50", "10", "B", "pw", "0", "1",
         "Z"),
     "f", "0:12288:A", NULL, 0},
    {"ftruncate growing is undone", 3,
     OPS("open", "g", "create", "pw", "0", "100", "A", "fsync", "trunc", "20000", "pw", "0", "1", "Z"), "g", "0:100:A",
     NULL, 0},
    /* 1 A, 2 the O_TRUNC open, 3 B, 4 Z */
    {"an O_TRUNC open is undone", 4,
     OPS("open", "h", "create", "pw", "0", "5000", "A", "fsync", "open", "h", "trunc", "pw", "0", "10", "B", "pw", "0",
         "1", "Z"),
     "h", "0:5000:A", NULL, 0},
    /* 1 A (h, fsynced), 2 B (g, new, never synced), 3 Z */
    {"a new file never synced disappears", 3,
     OPS("open", "h", "create", "pw", "0", "100", "A", "fsync", "open", "g", "create", "pw", "0", "100", "B", "pw", "0",
         "1", "Z"),
     "g", NULL, "files_removed", 1},
    {"a new file fsynced stays", 3,
     OPS("open", "h", "create", "pw", "0", "100", "A", "fsync", "open", "g", "create", "pw", "0", "100", "B", "pw", "0",
         "1", "Z"),
     "h", "0:100:A", NULL, 0},
    /* 1 A, fsync of the directory, 2 B, 3 Z: the entry stays, the data not */
    {"an fsync of the directory keeps the entry", 3,
     OPS("open", "k", "create", "pw", "0", "10", "A", "dirsync", "pw", "10", "10", "B", "pw", "0", "1", "Z"), "k", "",
     NULL, 0},
    {"sync_file_range is no barrier", 3,
     OPS("open", "f", "create", "pw", "0", "4096", "A", "fsync", "pw", "0", "4096", "B", "sfr", "pw", "0", "1", "Z"),
     "f", "0:4096:A", "ignored_syncs", 1},
    /* 1 A, 2 B, close, 3 C through a dup, 4 Z: the journal outlives descriptors */
    {"close and dup are no barriers", 4,
     OPS("open", "f", "create", "pw", "0", "4096", "A", "fsync", "pw", "0", "100", "B", "close", "open", "f", "-", "dup",
         "pw", "200", "10", "C", "close", "open", "f", "-", "pw", "0", "1", "Z"),
     "f", "0:4096:A", NULL, 0},
    {"file positions and O_APPEND", 4, APPEND_OPS, "f", "0:100:A 100:50:B 150:50:C", NULL, 0},
    /* 1 A, a store through a shared writable map, 2 B, 3 Z: left as it is */
    {"a file mapped writable is left as it is", 3,
     OPS("open", "m", "create", "pw", "0", "100", "A", "fsync", "mapw", "M", "pw", "200", "10", "B", "pw", "0", "1",
         "Z"),
     "m", "0:100:A 0:1:M 200:10:B", "mapped", 1},
};

START_TEST(test_drop_cases)
{
    const drop_case *c = &drop_cases[_i];
    shimdir d;
    shimdir_make(&d);
    hrun r = cut_drop(&d, c->cut, c->ops);
    if (c->layout)
        assert_layout(&d, c->file, c->layout);
    else
        ck_assert_msg(!file_exists(&d, c->file), "%s: %s survived the cut", c->what, c->file);
    if (c->stat)
        ck_assert_msg(stat_of(r.stats, c->stat) == c->value, "%s: expected %s=%" PRIu64 " in '%s'", c->what, c->stat,
                      c->value, r.stats);
    tmpdir_remove(&d.t);
}
END_TEST

/* Without a cut, operations run as they would without the shim; O_APPEND
 * writes go to the end whatever the position. */
START_TEST(test_no_cut)
{
    shimdir d;
    shimdir_make(&d);
    hrun r = helper_run(&d, 0, "drop", 0, APPEND_OPS);
    assert_exit0(&r);
    assert_layout(&d, "f", "0:100:A 100:50:B 150:50:C 200:10:D 210:10:Z");
    ck_assert_msg(stat_of(r.stats, "writes") == 4 && stat_of(r.stats, "syncs") == 1, "stats: '%s'", r.stats);
    tmpdir_remove(&d.t);
}
END_TEST

/* Files outside the directory are not tracked, also when a tracked
 * descriptor was closed where the shim does not see it (fclose of an
 * fdopen'ed one) and its number reused for one. */
START_TEST(test_untracked)
{
    shimdir d;
    shimdir_make(&d);
    char outside[160];
    snprintf(outside, sizeof outside, "%s/outside", d.t.base);
    /* 1 B, 2 Z */
    cut_drop(&d, 2, OPS("open", outside, "create", "pw", "0", "100", "A", "open", "f", "create", "pw", "0", "100", "B",
                        "fsync", "pw", "0", "1", "Z"));
    assert_layout(&d, "../outside", "0:100:A");
    /* 1 D, (fclose; `outside` gets the number) C, 2 Z */
    cut_drop(&d, 2, OPS("open", "f", "-", "pw", "0", "100", "D", "fclose", "open", outside, "-", "pw", "0", "10", "C",
                        "open", "f", "-", "pw", "0", "1", "Z"));
    assert_layout(&d, "../outside", "0:100:A 0:10:C");
    assert_layout(&d, "f", "0:100:B");
    tmpdir_remove(&d.t);
}
END_TEST

/* Tear mode: every page ends as one of its versions, chosen from the seed:
 * the durable one (A), the unsynced one (B), or the call in flight (D);
 * the same seed gives the same file; the seeds together keep and drop. */
START_TEST(test_tear_deterministic)
{
    shimdir d;
    shimdir_make(&d);
    const char *const *ops = OPS("open", "f", "create", "pw", "0", "65536", "A", "fsync", "pw", "0", "65536", "B", "pw",
                                 "65536", "8192", "C", "pw", "0", "65536", "D");
    unsigned seen[256] = {0};
    unsigned char *first[6] = {0};
    size_t firstn[6] = {0};
    unsigned distinct = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        for (int rep = 0; rep < 2; rep++) {
            hrun r = helper_run(&d, 0, "drop", 0, OPS("open", "f", "create", "trunc", "0", "fsync"));
            assert_exit0(&r);
            r = helper_run(&d, 4, "tear", seed, ops);
            assert_cut(&r, 4);
            ck_assert_msg(stat_of(r.stats, "pages_dropped") + stat_of(r.stats, "pages_torn") == 18, "stats: '%s'",
                          r.stats);
            char path[160];
            snprintf(path, sizeof path, "%s/f", d.t.data);
            size_t n;
            unsigned char *b = slurp(path, &n);
            ck_assert_ptr_nonnull(b);
            ck_assert_msg(n == 65536 || n == 73728, "seed %" PRIu64 ": size %zu", seed, n);
            for (size_t p = 0; p < n / 4096; p++) {
                unsigned char c = b[p * 4096];
                for (size_t i = 1; i < 4096; i++)
                    ck_assert_msg(b[p * 4096 + i] == c, "seed %" PRIu64 ": page %zu is not one version", seed, p);
                if (p < 16)
                    ck_assert_msg(c == 'A' || c == 'B' || c == 'D', "seed %" PRIu64 ": page %zu holds '%c'", seed, p, c);
                else
                    ck_assert_msg(c == 'C' || c == 0, "seed %" PRIu64 ": page %zu holds 0x%02x", seed, p, c);
                seen[c]++;
            }
            if (rep == 0) {
                first[seed - 1] = b;
                firstn[seed - 1] = n;
                bool dup = false;
                for (uint64_t s = 1; s < seed; s++)
                    dup |= firstn[s - 1] == n && !memcmp(first[s - 1], b, n);
                distinct += !dup;
            } else {
                ck_assert_msg(n == firstn[seed - 1] && !memcmp(b, first[seed - 1], n),
                              "seed %" PRIu64 " tore differently the second time", seed);
                free(b);
            }
        }
    }
    ck_assert_msg(seen['A'] && seen['B'] && seen['D'], "the seeds never kept (or never dropped) a page: A %u B %u D %u",
                  seen['A'], seen['B'], seen['D']);
    ck_assert_uint_ge(distinct, 4);
    for (int i = 0; i < 6; i++)
        free(first[i]);
    /* drop mode on the same operations: A only */
    hrun r = helper_run(&d, 0, "drop", 0, OPS("open", "f", "create", "trunc", "0", "fsync"));
    assert_exit0(&r);
    cut_drop(&d, 4, ops);
    assert_layout(&d, "f", "0:65536:A");
    tmpdir_remove(&d.t);
}
END_TEST

START_TEST(test_bad_environment)
{
    shimdir d;
    shimdir_make(&d);
    hrun r = helper_run(&d, 1, "sideways", 0, OPS("open", "f", "create"));
    ck_assert_msg(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 2, "a bad KEEL_POWERLOSS_MODE: status 0x%x",
                  r.status);
    tmpdir_remove(&d.t);
}
END_TEST

/* ---- powerloss_runtime ---------------------------------------------------------------------- */

#define SWEEP_END 10u  /* the shimmed child's last tick */
#define SWEEP_CHECK 14u /* the recovering child runs to here */

static bool runtime_skipped(void)
{
    if (PL_SANITIZED)
        fprintf(stderr, "powerloss_runtime: skipped in a sanitizer build (the shim cannot be preloaded before the "
                        "sanitizer runtime); powerloss_shim still runs\n");
    return PL_SANITIZED;
}

static char g_stats[160]; /* KEEL_POWERLOSS_STATS of the current directory (inside its tmpdir) */

static uint64_t read_stat(const char *key)
{
    size_t n;
    unsigned char *s = slurp(g_stats, &n);
    if (!s)
        return UINT64_MAX;
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)n, (const char *)s);
    free(s);
    return stat_of(line, key);
}

/* One shimmed child on dir cut at write `cut` (mode, seed); the outcome. */
static outcome shimmed_child(oracle *o, plan p, uint64_t cut, const char *mode, uint64_t seed)
{
    plenv e;
    p.exec_env = plenv_make(&e, p.dir, cut, mode, seed, g_stats);
    p.may_die = true;
    unlink(g_stats);
    return run_child(o, &p, (trigger){TRIG_NONE, 0});
}

/* A sweep of cut points on fresh directories: calibrate the number of
 * tracked writes of a run to SWEEP_END, then cut at 1..6 (creating the
 * directory and the first commits) and at points spread over the run. */
static void sweep(const refdata *ref, const char *mode, uint64_t salt)
{
    tmpdir d;
    tmpdir_make(&d);
    snprintf(g_stats, sizeof g_stats, "%s/stats", d.base);
    oracle o;
    oracle_init(&o, ref, "calibration");
    outcome out = shimmed_child(&o, base_plan(d.data, KEEL_DURABLE_GROUP, 4, SWEEP_END), 0, mode, 0);
    uint64_t total = read_stat("writes");
    if (!o.failed && (!out.done || total == UINT64_MAX || total < 30))
        ofail(&o, "the calibration run: done %d, %" PRIu64 " tracked writes", out.done, total);
    oracle_assert(&o, &d);
    uint64_t rng = rng_seed(salt);
    unsigned cuts = 0, points = 0, removed = 0, torn = 0;
    for (uint64_t k = 0; k < 22; k++, points++) {
        uint64_t n = k < 6 ? k + 1 : 7 + (total - 7) * (k - 6) / 16 + rng_next(&rng) % ((total - 7) / 16 + 1);
        char name[96];
        snprintf(name, sizeof name, "%s cut at write %" PRIu64 " of %" PRIu64, mode, n, total);
        tmpdir_make(&d);
        snprintf(g_stats, sizeof g_stats, "%s/stats", d.base);
        oracle_init(&o, ref, name);
        plan p = base_plan(d.data, k % 3 == 1 ? KEEL_DURABLE_IMMEDIATE : KEEL_DURABLE_GROUP, 4, SWEEP_END);
        p.workers = 1 + (int32_t)(k & 1);
        p.async_bank = k % 4 == 3;
        out = shimmed_child(&o, p, n, mode, crash_mix(n ^ salt));
        cuts += out.died;
        uint64_t acked = o.nacks;
        removed += read_stat("files_removed") != UINT64_MAX && read_stat("files_removed") > 0;
        torn += read_stat("pages_torn") != UINT64_MAX && read_stat("pages_torn") > 0;
        if (!o.failed && !out.died && !out.done)
            ofail(&o, "the shimmed child neither finished nor died at its cut");
        /* recover without the shim: a reference state with every acknowledged
         * transfer (checked on RECOVERED), then the reference's ticks */
        out = run_child(&o, &(plan){.dir = d.data, .mode = KEEL_DURABLE_GROUP, .ckpt_every = 4, .workers = 2,
                                    .until = SWEEP_CHECK},
                        (trigger){TRIG_NONE, 0});
        if (!o.failed && (!out.done || out.last_tick != SWEEP_CHECK))
            ofail(&o, "the recovering child ended at tick %" PRIu64 " (done %d)", out.last_tick, out.done);
        if (getenv("KEEL_CRASH_VERBOSE"))
            fprintf(stderr, "[%s] recovered tick %" PRIu64 " (+%d transfers), %" PRIu64 " acknowledged before the cut\n",
                    name, o.last_rec.tick, o.last_j, acked);
        oracle_assert(&o, &d);
    }
    ck_assert_msg(cuts >= points * 3 / 4, "%s: only %u of %u children were cut", mode, cuts, points);
    ck_assert_msg(removed > 0, "%s: no cut removed a new file", mode); /* lock.mdb, or data.mdb early on */
    if (!strcmp(mode, "tear"))
        ck_assert_msg(torn > 0, "tear: no cut kept an unsynced page");
}

START_TEST(test_cut_sweep)
{
    if (runtime_skipped())
        return;
    refdata *ref = reference_run();
    sweep(ref, "drop", 11);
    sweep(ref, "tear", 12);
    munmap(ref, sizeof *ref);
}
END_TEST

/* Rounds of cuts on one directory: each shimmed child recovers the previous
 * cut (checked) and runs until its own; then a clean run to the end. */
static void chain(const refdata *ref, const char *mode, uint64_t salt)
{
    tmpdir d;
    tmpdir_make(&d);
    snprintf(g_stats, sizeof g_stats, "%s/stats", d.base);
    oracle o;
    oracle_init(&o, ref, mode);
    uint64_t rng = rng_seed(salt), end = 60;
    unsigned cuts = 0;
    /* the directory is created without the shim: cuts while it is being
     * created are the sweep's */
    run_child(&o, &(plan){.dir = d.data, .mode = KEEL_DURABLE_GROUP, .ckpt_every = 5, .workers = 1, .until = 2},
              (trigger){TRIG_NONE, 0});
    for (int r = 0; r < 14 && !o.failed && o.max_ran + 3 < end; r++) {
        plan p = base_plan(d.data, r % 3 == 0 ? KEEL_DURABLE_IMMEDIATE : KEEL_DURABLE_GROUP, 5, end);
        p.workers = 1 + (int32_t)(r & 1);
        p.map_size = (r & 2) ? 256u << 10 : 0; /* a small map: it grows while running */
        p.async_bank = r % 3 == 2;
        p.wal_retain = r % 5 == 4;
        uint64_t n = 1 + rng_next(&rng) % 240;
        outcome out = shimmed_child(&o, p, n, mode, rng_next(&rng));
        cuts += out.died;
    }
    finish(&o, d.data, KEEL_DURABLE_GROUP, 5, end + 10);
    if (!o.failed && cuts < 5)
        ofail(&o, "only %u cuts happened", cuts);
    oracle_assert(&o, &d);
}

START_TEST(test_cut_chain)
{
    if (runtime_skipped())
        return;
    refdata *ref = reference_run();
    chain(ref, "drop", 21);
    chain(ref, "tear", 22);
    munmap(ref, sizeof *ref);
}
END_TEST

static Suite *shim_suite(void)
{
    Suite *s = suite_create("powerloss_shim");
    TCase *tc = tcase_create("shim");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_drop_undoes_unsynced);
    tcase_add_loop_test(tc, test_drop_cases, 0, (int)(sizeof drop_cases / sizeof drop_cases[0]));
    tcase_add_test(tc, test_no_cut);
    tcase_add_test(tc, test_untracked);
    tcase_add_test(tc, test_tear_deterministic);
    tcase_add_test(tc, test_bad_environment);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *runtime_suite(void)
{
    Suite *s = suite_create("powerloss_runtime");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cut_sweep);
    tcase_add_test(tc, test_cut_chain);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], CRASH_CHILD_ARG))
        crash_child_exec(argc, argv); /* a crash child exec'd with the shim */
    keel_suite_fn suites[] = {shim_suite, runtime_suite};
    return keel_test_run(suites, 2);
}
