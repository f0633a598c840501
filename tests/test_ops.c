/*
 * test_ops.c -- the operator's guarantees of a data directory, through the
 * library (docs/operations.md):
 *
 *   ops_lock     a runtime owns its directory: a second one, in another
 *                process or in this one, fails at once with KEEL_EBUSY
 *                naming the holder's pid; read-only opens and keel-wal
 *                (KEEL_WAL_BIN) work beside the holder; SIGKILL of the
 *                holder releases the lock (the kernel drops it)
 *   ops_damage   a damaged data.mdb (empty, one page short, half, only the
 *                two meta pages, a torn meta page 0 or 1, a meta pointing
 *                past the end, a root past the last page, a newer LMDB data
 *                version, ...: tu_damage_apply) is refused with KEEL_ECORRUPT and a sentence
 *                naming the file and the damage, by the runtime and by a
 *                read-only open, before anything maps or writes it: the
 *                file keeps its bytes and mtime and LMDB never made its
 *                lock.mdb; a whole file whose last page lies past its end
 *                (free pages LMDB never wrote) opens
 *   ops_backup   kw_store_backup: the copy recovers to the original's tick
 *                and hash; a destination that exists and is not an empty
 *                directory, a file, or a missing parent is refused; a
 *                damaged source leaves no data.mdb in the destination; the
 *                copies keep their sources' permission bits; another
 *                backup's data.mdb.new, also one made between the check of
 *                DEST and the claim (backup.claim's observer), is refused
 *                with KEEL_EBUSY and left as it was; a copy failing
 *                (backup.copy=eio) leaves DEST as it found it, made or
 *                empty; a map another process grew before the copy
 *                (backup.copy's observer) is taken up
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/failpoint.h"
#include "keel_test.h"
#include "keel_wal/wal.h"
#include "test_util.h"
#include "wworld.h"

#define TICKS 12

/* A wworld (no_side: without side transactions) on the data directory dir, one worker, not yet
 * recovered. */
static wworld *w_open_dir(const char *dir, bool no_side)
{
    keel_runtime_desc d = {.workers = 1, .tick_rate_hz = -1};
    d.durable.dir = dir;
    wworld *w = w_new(no_side);
    w_open(w, &d, false);
    return w;
}

/* A directory of workload W: TICKS ticks with a checkpoint half way (so
 * the file has free pages), closed. Its final tick's hash in *hash. */
static void make_world(const char *dir, uint64_t *hash)
{
    wworld *w = w_open_dir(dir, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    for (uint64_t t = 1; t <= TICKS; t++) {
        w_drive(w, t);
        if (t == TICKS / 2)
            ck_assert_ok(keel_checkpoint(w->rt));
    }
    ck_assert_ok(keel_flush(w->rt));
    if (hash)
        *hash = keel_world_hash(keel_runtime_world(w->rt));
    w_close(w);
    free(w);
}

/* Open dir with a fresh W runtime: keel_runtime_recover's code; on success
 * the recovered tick and hash. The runtime is closed again. */
static int open_world(const char *dir, uint64_t *tick, uint64_t *hash, char *err, size_t cap)
{
    wworld *w = w_open_dir(dir, false);
    int rc = keel_runtime_recover(w->rt, NULL);
    if (err)
        snprintf(err, cap, "%s", keel_last_error());
    if (!rc && tick)
        *tick = keel_runtime_tick(w->rt);
    if (!rc && hash)
        *hash = keel_world_hash(keel_runtime_world(w->rt));
    w_close(w);
    free(w);
    return rc;
}

/* dir opens (open_world) at this tick with this world hash. */
static void expect_world(const char *dir, uint64_t tick, uint64_t hash)
{
    uint64_t t = 0, h = 0;
    ck_assert_ok(open_world(dir, &t, &h, NULL, 0));
    ck_assert_uint_eq(t, tick);
    ck_assert_uint_eq(h, hash);
}

static void file_in(char *out, size_t n, const char *dir, const char *name)
{
    ck_assert_int_lt(snprintf(out, n, "%s/%s", dir, name), (int)n);
}

/* A backup's source: a world in dir and an application's own file, its path in params
 * (dir/world.params). */
static void make_source(const char *dir, char *params, size_t cap)
{
    make_world(dir, NULL);
    file_in(params, cap, dir, "world.params");
    tu_write_file(params, "seed=5\n", 7);
}

static int backup(const char *src, const char *dest)
{
    return kw_store_backup(&(kw_backup_desc){.dir = src, .dest = dest});
}

/* ---- ops_lock ------------------------------------------------------------------------------- */

/* A child process that opens dir with a runtime, says 'H' on held_w, and
 * then waits (on go_r) until it is killed. */
static pid_t fork_holder(const char *dir)
{
    int held[2], go[2];
    ck_assert_int_eq(pipe(held), 0);
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(held[0]);
        close(go[1]);
        wworld *w = w_open_dir(dir, true);
        char c = keel_runtime_recover(w->rt, NULL) ? 'E' : 'H';
        if (write(held[1], &c, 1) != 1)
            _exit(3);
        (void)read(go[0], &c, 1); /* EOF never comes while the parent holds go[1]: killed here */
        _exit(0);
    }
    close(held[1]);
    close(go[0]);
    char c = 0;
    ck_assert_int_eq(read(held[0], &c, 1), 1);
    ck_assert_msg(c == 'H', "the holder could not open %s", dir);
    close(held[0]);
    /* go[1] stays open in this process until the test's process ends: the child never returns by itself */
    return pid;
}

START_TEST(lock_second_process_refused)
{
    char dir[256], err[1024], want[64], lock[300];
    tu_path(dir, sizeof dir, "held");
    make_world(dir, NULL);
    uint64_t t0 = 0, h0 = 0;
    ck_assert_ok(open_world(dir, &t0, &h0, NULL, 0));
    pid_t pid = fork_holder(dir);

    /* the holder's pid is in its lock file and in the refusal */
    file_in(lock, sizeof lock, dir, "keel.lock");
    FILE *f = fopen(lock, "r");
    ck_assert_ptr_nonnull(f);
    long in_file = 0;
    ck_assert_int_eq(fscanf(f, "%ld", &in_file), 1);
    fclose(f);
    ck_assert_int_eq(in_file, pid);
    ck_assert_int_eq(open_world(dir, NULL, NULL, err, sizeof err), KEEL_EBUSY);
    snprintf(want, sizeof want, "in use by process %ld", (long)pid);
    ck_assert_msg(strstr(err, want) && strstr(err, dir), "the refusal does not name the holder: %s", err);

    /* readers are unaffected: a read-only store, and keel-wal */
    kw_store *st = NULL;
    ck_assert_ok(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &st));
    kw_store_close(st);
    tu_run r = tu_run_argv(KEEL_WAL_BIN, (const char *const[]){"verify", dir, NULL});
    ck_assert_msg(r.status == 0, "keel-wal verify beside the holder: exit %d: %s", r.status, r.err);
    tu_run_free(&r);

    /* a crash releases the lock: the kernel drops it with the process */
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(tu_wait(pid), 128 + SIGKILL);
    expect_world(dir, t0, h0);
}
END_TEST

/* Two runtimes of one process: the lock belongs to the open file, not the
 * process, so the second is refused too (naming this process); once the
 * first closes, the directory is free. */
START_TEST(lock_same_process_refused)
{
    char dir[256], want[64];
    tu_path(dir, sizeof dir, "twice");
    wworld *a = w_open_dir(dir, true);
    ck_assert_ok(keel_runtime_recover(a->rt, NULL));
    w_drive(a, 1);
    char err[1024];
    ck_assert_int_eq(open_world(dir, NULL, NULL, err, sizeof err), KEEL_EBUSY);
    snprintf(want, sizeof want, "in use by process %ld", (long)getpid());
    ck_assert_msg(strstr(err, want), "%s", err);
    w_drive(a, 2); /* the holder runs on undisturbed */
    w_close(a);
    free(a);
    uint64_t t = 0;
    ck_assert_ok(open_world(dir, &t, NULL, NULL, 0));
    ck_assert_uint_eq(t, 2);
}
END_TEST

/* A holder that has the lock but has not written its pid yet (or whose file was
 * emptied): still refused, "by another process". */
START_TEST(lock_without_pid_refused)
{
    char dir[256], lock[300], err[1024];
    tu_path(dir, sizeof dir, "nopid");
    make_world(dir, NULL);
    file_in(lock, sizeof lock, dir, "keel.lock");
    int fd = open(lock, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
    ck_assert_int_eq(open_world(dir, NULL, NULL, err, sizeof err), KEEL_EBUSY);
    ck_assert_msg(strstr(err, "in use by another process"), "%s", err);
    close(fd);
    ck_assert_ok(open_world(dir, NULL, NULL, NULL, 0));
}
END_TEST

/* ---- ops_damage ----------------------------------------------------------------------------- */

START_TEST(damage_refused_untouched)
{
    char src[256], copy[256];
    tu_path(src, sizeof src, "src");
    make_world(src, NULL);
    tu_path(copy, sizeof copy, "compact");
    ck_assert_ok(backup(src, copy));
    char good[300];
    file_in(good, sizeof good, copy, "data.mdb");
    ck_assert_ok(kw_store_check_file(copy));

    for (int d = 0; d < TU_DAMAGE_COUNT; d++) {
        char dir[256], mdb[300], lockmdb[300], name[32], err[1024];
        snprintf(name, sizeof name, "damaged-%d", d);
        tu_path(dir, sizeof dir, name);
        ck_assert_int_eq(mkdir(dir, 0755), 0);
        file_in(mdb, sizeof mdb, dir, "data.mdb");
        file_in(lockmdb, sizeof lockmdb, dir, "lock.mdb");
        tu_copy_file(good, mdb);
        tu_damage_apply(mdb, (tu_damage)d);
        tu_digest before = tu_file_digest(mdb);
        uint64_t mtime = tu_file_mtime_ns(mdb);

        /* the runtime: KEEL_ECORRUPT, the file and the damage named */
        ck_assert_int_eq(open_world(dir, NULL, NULL, err, sizeof err), KEEL_ECORRUPT);
        ck_assert_msg(strstr(err, mdb) && strstr(err, "is damaged") && strstr(err, tu_damages[d].says),
                      "%s: the sentence does not name the file and '%s': %s", tu_damages[d].name, tu_damages[d].says, err);
        /* a read-only open (the tools') says the same; the check of the meta pages alone finds their damage */
        kw_store *st = NULL;
        ck_assert_int_eq(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &st), KEEL_ECORRUPT);
        ck_assert_ptr_null(st);
        ck_assert_msg(strstr(keel_last_error(), tu_damages[d].says), "%s", keel_last_error());
        ck_assert_int_eq(kw_store_check_file(dir), tu_damages[d].tree ? KEEL_OK : KEEL_ECORRUPT);
        if (!tu_damages[d].tree)
            ck_assert_msg(strstr(keel_last_error(), tu_damages[d].says), "%s", keel_last_error());

        /* nothing written: same bytes, same mtime; a damaged meta page never mapped (a tree page's damage is
           found in a read transaction, through LMDB's map, before LMDB reads a tree page) */
        tu_assert_digest_eq(before, tu_file_digest(mdb));
        ck_assert_uint_eq(mtime, tu_file_mtime_ns(mdb));
        if (!tu_damages[d].tree)
            ck_assert_msg(access(lockmdb, F_OK) != 0, "%s: LMDB opened the file (lock.mdb exists)", tu_damages[d].name);
    }
}
END_TEST

/* A whole file whose newest meta counts pages past its end: a checkpoint
 * at the end of a run (as keel-world takes when it stops) deletes WAL
 * records, and LMDB frees pages it had allocated at the end in the same
 * transaction (its "loose" pages) without writing them. They are listed in
 * the free tree, so the file opens, to the same state. */
START_TEST(damage_free_tail_accepted)
{
    char dir[256], mdb[300];
    tu_path(dir, sizeof dir, "tail");
    wworld *w = w_open_dir(dir, false);
    ck_assert_ok(keel_runtime_recover(w->rt, NULL));
    for (uint64_t t = 1; t <= TICKS; t++) {
        w_drive(w, t);
        ck_assert_ok(keel_flush(w->rt)); /* one commit per tick, as the disk allows: the same pages every run */
    }
    ck_assert_ok(keel_checkpoint(w->rt));
    uint64_t hash = keel_world_hash(keel_runtime_world(w->rt));
    w_close(w);
    free(w);
    file_in(mdb, sizeof mdb, dir, "data.mdb");
    /* the newest meta's last page (64-bit LMDB: at 136, the transaction id at 144) */
    int fd = open(mdb, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    uint64_t m[2][2];
    ck_assert_int_eq(pread(fd, m[0], 16, 136), 16);
    ck_assert_int_eq(pread(fd, m[1], 16, 4096 + 136), 16);
    close(fd);
    uint64_t last = m[1][1] > m[0][1] ? m[1][0] : m[0][0];
    struct stat st;
    ck_assert_int_eq(stat(mdb, &st), 0);
    ck_assert_msg(last >= (uint64_t)st.st_size / 4096, "the last page %llu is inside the file (%lld bytes): the "
                  "case this test is for did not arise", (unsigned long long)last, (long long)st.st_size);
    ck_assert_ok(kw_store_check_file(dir));
    expect_world(dir, TICKS, hash);
}
END_TEST

/* A fresh directory holding an empty data.mdb is not a new world: the
 * create-and-rename path never runs over it. */
START_TEST(damage_empty_never_new_world)
{
    char dir[256], mdb[300], err[1024];
    tu_path(dir, sizeof dir, "empty");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    file_in(mdb, sizeof mdb, dir, "data.mdb");
    tu_write_file(mdb, "", 0);
    ck_assert_int_eq(open_world(dir, NULL, NULL, err, sizeof err), KEEL_ECORRUPT);
    ck_assert_msg(strstr(err, "empty"), "%s", err);
    struct stat st;
    ck_assert_int_eq(stat(mdb, &st), 0);
    ck_assert_int_eq(st.st_size, 0);
    kw_store *s = NULL;
    ck_assert_int_eq(kw_store_open(dir, &(kw_store_desc){.flags = KW_OPEN_CREATE}, &s), KEEL_ECORRUPT);
    ck_assert_int_eq(stat(mdb, &st), 0);
    ck_assert_int_eq(st.st_size, 0);
}
END_TEST

/* ---- ops_backup ----------------------------------------------------------------------------- */

START_TEST(backup_recovers_and_refuses)
{
    char src[256], dest[256], app[300], copy[300];
    tu_path(src, sizeof src, "src");
    uint64_t hash = 0;
    make_world(src, &hash);
    /* an application's own file travels with the data */
    file_in(app, sizeof app, src, "world.params");
    tu_write_file(app, "seed=5\n", 7);
    tu_path(dest, sizeof dest, "bk");
    ck_assert_ok(backup(src, dest));
    file_in(copy, sizeof copy, dest, "world.params");
    tu_digest a = tu_file_digest(app), b = tu_file_digest(copy);
    tu_assert_digest_eq(a, b);
    file_in(copy, sizeof copy, dest, "data.mdb.new");
    ck_assert_int_ne(access(copy, F_OK), 0);
    file_in(copy, sizeof copy, dest, "keel.lock");
    ck_assert_int_ne(access(copy, F_OK), 0);
    uint64_t t = 0, h = 0;
    ck_assert_ok(open_world(dest, &t, &h, NULL, 0));
    ck_assert_uint_eq(t, TICKS);
    ck_assert_uint_eq(h, hash);

    /* an empty directory is a fine destination */
    char empty[256];
    tu_path(empty, sizeof empty, "empty-dest");
    ck_assert_int_eq(mkdir(empty, 0755), 0);
    ck_assert_ok(backup(src, empty));

    /* refused: not empty (the backup just made), a file, a missing parent */
    ck_assert_rc(backup(src, dest), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), "not empty"), "%s", keel_last_error());
    ck_assert_rc(backup(src, app), KEEL_EINVAL);
    ck_assert_msg(strstr(keel_last_error(), "is a file"), "%s", keel_last_error());
    char deep[300];
    tu_path(deep, sizeof deep, "no/such/parent");
    ck_assert_rc(backup(src, deep), KEEL_ENOENT);
    ck_assert_rc(backup(src, NULL), KEEL_EINVAL);

    /* a damaged source: refused, and the destination holds no data.mdb */
    char mdb[300], bad[256];
    file_in(mdb, sizeof mdb, src, "data.mdb");
    tu_damage_apply(mdb, TU_DAMAGE_METAS_ONLY);
    tu_path(bad, sizeof bad, "bk-bad");
    ck_assert_rc(backup(src, bad), KEEL_ECORRUPT);
    file_in(copy, sizeof copy, bad, "data.mdb");
    ck_assert_int_ne(access(copy, F_OK), 0);
}
END_TEST

/* The copies keep their sources' permission bits: a backup never widens who may read the data. */
START_TEST(backup_keeps_modes)
{
    char src[256], dest[256], p[300];
    tu_path(src, sizeof src, "modes-src");
    make_source(src, p, sizeof p);
    ck_assert_int_eq(chmod(p, 0640), 0);
    file_in(p, sizeof p, src, "data.mdb");
    ck_assert_int_eq(chmod(p, 0600), 0);
    mode_t old = umask(022);
    tu_path(dest, sizeof dest, "modes-bk");
    ck_assert_ok(backup(src, dest));
    umask(old);
    struct stat st;
    file_in(p, sizeof p, dest, "data.mdb");
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0600);
    file_in(p, sizeof p, dest, "world.params");
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0640);
}
END_TEST

/* backup.claim's observer: another backup creates its data.mdb.new in DEST (arg) after this run found DEST
 * empty and before it claims it. */
static void other_claims(const char *name, const char *action, uint64_t hit, void *arg)
{
    (void)name, (void)action, (void)hit;
    char p[300];
    file_in(p, sizeof p, arg, "data.mdb.new");
    tu_write_file(p, "another run's copy", 18);
}

/* DEST holds d/data.mdb.new with the other run's bytes and nothing else. */
static void holds_other_claim(const char *d)
{
    char p[300], other[300];
    file_in(p, sizeof p, d, "data.mdb.new");
    file_in(other, sizeof other, d, "other");
    tu_write_file(other, "another run's copy", 18);
    tu_assert_digest_eq(tu_file_digest(p), tu_file_digest(other));
    ck_assert_int_eq(unlink(other), 0);
    file_in(p, sizeof p, d, "world.params");
    ck_assert_int_ne(access(p, F_OK), 0);
}

/* Two backups into one DEST: the exclusive creation of data.mdb.new decides, and the run that did not
 * create it refuses with KEEL_EBUSY, touching nothing of the other's -- also when both found DEST empty. */
START_TEST(backup_claim_is_exclusive)
{
    char src[256], dest[256], p[300];
    tu_path(src, sizeof src, "claim-src");
    make_source(src, p, sizeof p);

    /* another run's claim already there */
    tu_path(dest, sizeof dest, "claim-held");
    ck_assert_int_eq(mkdir(dest, 0755), 0);
    other_claims(NULL, NULL, 0, dest);
    ck_assert_rc(backup(src, dest), KEEL_EBUSY);
    holds_other_claim(dest);

    if (!keel_failpoints_compiled())
        return; /* -DKEEL_FAILPOINTS=OFF: no instant between the check and the claim to reach */
    /* the other run claims between this run's check of a DEST it made and its own claim */
    tu_path(dest, sizeof dest, "claim-raced");
    core_fp_set_observer(other_claims, dest);
    ck_assert_ok(keel_failpoints_set("backup.claim=delay:0@1"));
    int rc = backup(src, dest);
    ck_assert_ok(keel_failpoints_set(""));
    core_fp_set_observer(NULL, NULL);
    ck_assert_rc(rc, KEEL_EBUSY);
    holds_other_claim(dest);
}
END_TEST

/* DEST holds nothing at all, or is missing when made is false. */
static void left_as_found(const char *dest, bool existed)
{
    if (!existed) {
        ck_assert_int_ne(access(dest, F_OK), 0);
        return;
    }
    DIR *dp = opendir(dest);
    ck_assert_ptr_nonnull(dp);
    struct dirent *e;
    while ((e = readdir(dp)))
        ck_assert_msg(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."), "%s left in %s", e->d_name, dest);
    closedir(dp);
}

/* A copy that fails after the application's files were copied: DEST as it was, made by the run or empty,
 * so that the retry runs. */
START_TEST(backup_failure_leaves_dest)
{
    if (!keel_failpoints_compiled())
        return; /* -DKEEL_FAILPOINTS=OFF: no way to fail the copy on purpose */
    char src[256], dest[256], p[300];
    tu_path(src, sizeof src, "fail-src");
    make_source(src, p, sizeof p);
    for (int existed = 0; existed < 2; existed++) {
        tu_path(dest, sizeof dest, existed ? "fail-empty" : "fail-new");
        if (existed)
            ck_assert_int_eq(mkdir(dest, 0755), 0);
        ck_assert_ok(keel_failpoints_set("backup.copy=eio@1"));
        int rc = backup(src, dest);
        ck_assert_ok(keel_failpoints_set(""));
        ck_assert_rc(rc, KEEL_EIO);
        left_as_found(dest, existed);
        ck_assert_ok(backup(src, dest));
    }
}
END_TEST

#define SMALL_MAP (1u << 20)

static int put_big(kw_wtxn *t, void *arg)
{
    (void)arg;
    static char v[1 << 19];
    memset(v, 0x5a, sizeof v);
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++) {
        char k[16];
        snprintf(k, sizeof k, "big%d", i);
        rc = kw_put(t, KW_DB_META, k, strlen(k), v, sizeof v);
    }
    return rc;
}

/* backup.copy's observer: another process grows the map of the source (arg) past what the backup mapped
 * and commits 2 MiB there, as a server does. */
static void other_grows_map(const char *name, const char *action, uint64_t hit, void *arg)
{
    (void)name, (void)action, (void)hit;
    pid_t pid = fork();
    if (pid == 0) {
        kw_store *s = NULL;
        int rc = kw_store_open(arg, &(kw_store_desc){.map_size = 16u * SMALL_MAP}, &s);
        rc = rc ? rc : kw_store_write(s, put_big, NULL);
        kw_store_close(s);
        _exit(rc ? 1 : 0);
    }
    ck_assert_int_eq(tu_wait(pid), 0);
}

/* A server that grew its map after the backup opened the source: the copy's read transaction meets
 * MDB_MAP_RESIZED, takes the new size and copies the grown file. */
START_TEST(backup_map_grown)
{
    if (!keel_failpoints_compiled())
        return; /* -DKEEL_FAILPOINTS=OFF: no instant before the copy to grow the map at */
    char src[256], dest[256];
    tu_path(src, sizeof src, "grown-src");
    kw_store *s = NULL;
    ck_assert_ok(kw_store_open(src, &(kw_store_desc){.flags = KW_OPEN_CREATE, .map_size = SMALL_MAP}, &s));
    kw_store_close(s);
    tu_path(dest, sizeof dest, "grown-bk");
    core_fp_set_observer(other_grows_map, src);
    ck_assert_ok(keel_failpoints_set("backup.copy=delay:0@1"));
    int rc = backup(src, dest);
    ck_assert_ok(keel_failpoints_set(""));
    core_fp_set_observer(NULL, NULL);
    ck_assert_msg(rc == KEEL_OK, "backup: %s", keel_last_error());
    ck_assert_ok(kw_store_open(dest, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &s));
    kw_rtxn *r = NULL;
    ck_assert_ok(kw_read_begin(s, &r));
    const void *v;
    size_t vlen = 0;
    ck_assert_ok(kw_get(r, KW_DB_META, "big3", 4, &v, &vlen));
    ck_assert_uint_eq(vlen, 1u << 19);
    kw_read_end(r);
    kw_store_close(s);
}
END_TEST

/* kw_store_forget: the close of a store whose open made the directory and
 * its data.mdb removes them (a refused first start leaves nothing); one
 * that found data.mdb -- its own world of an earlier start -- removes
 * nothing; a second open refused for the lock has no store to forget, and
 * the holder's files stay. */
START_TEST(lock_forget_removes_only_what_it_made)
{
    char dir[256], mdb[300];
    tu_path(dir, sizeof dir, "forget");
    file_in(mdb, sizeof mdb, dir, "data.mdb");
    kw_store_desc own = {.flags = KW_OPEN_CREATE | KW_OPEN_OWN};
    kw_store *s = NULL, *t = NULL;
    ck_assert_ok(kw_store_open(dir, &own, &s));
    kw_store_forget(s);
    kw_store_close(s);
    ck_assert_int_ne(access(dir, F_OK), 0);
    ck_assert_ok(kw_store_open(dir, &own, &s)); /* made again, kept */
    kw_store_close(s);
    ck_assert_ok(kw_store_open(dir, &own, &s)); /* found: forgetting removes nothing */
    ck_assert_rc(kw_store_open(dir, &own, &t), KEEL_EBUSY);
    kw_store_forget(s);
    kw_store_close(s);
    ck_assert_int_eq(access(mdb, F_OK), 0);
}
END_TEST

static Suite *ops_lock(void)
{
    const TTest *t[] = {lock_second_process_refused, lock_same_process_refused, lock_without_pid_refused,
                        lock_forget_removes_only_what_it_made};
    return tu_suite("ops_lock", t, 4, 120);
}

static Suite *ops_damage(void)
{
    const TTest *t[] = {damage_refused_untouched, damage_empty_never_new_world, damage_free_tail_accepted};
    return tu_suite("ops_damage", t, 3, 120);
}

static Suite *ops_backup(void)
{
    const TTest *t[] = {backup_recovers_and_refuses, backup_keeps_modes, backup_claim_is_exclusive,
                        backup_failure_leaves_dest, backup_map_grown};
    return tu_suite("ops_backup", t, 5, 120);
}

KEEL_TEST_MAIN(ops_lock, ops_damage, ops_backup)
