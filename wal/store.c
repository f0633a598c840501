/*
 * wal/store.c -- the LMDB environment of one data directory.
 *
 * Databases (docs/wal-format.md): meta, schema, wal (u64 big-endian LSN
 * keys, appended with MDB_APPEND), snap, dict. Every write is one LMDB
 * write transaction committed with LMDB's default sync, so a commit that
 * returned is on disk; the runtime batches (group commit) to amortise it.
 * When the map is full the transaction is aborted, the map doubled and the
 * caller's fill function run again (kw_store_write). Readers in other
 * processes see the larger map on their next transaction (MDB_MAP_RESIZED
 * is handled in kw_read_begin). MDB_NOTLS: read transactions are not tied
 * to threads, and stale reader slots are cleared at open.
 *
 * Failpoints (docs/testing.md): wal.put before every write into a write
 * transaction, wal.before_commit and wal.after_commit around
 * mdb_txn_commit. LMDB's commit writes the dirty pages, fdatasyncs them and
 * writes the meta page through an O_DSYNC descriptor; keel cannot stop
 * between those steps and need not: a failed write or sync makes LMDB abort
 * the transaction, which is what an injected failure at wal.before_commit
 * does, and wal.after_commit is the instant after the meta page's sync.
 */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/failpoint.h"
#include "keel_wal/wal.h"

static const char *const db_names[KW_DB_COUNT_] = {"meta", "schema", "wal", "snap", "dict"};

struct kw_store {
    MDB_env *env;
    MDB_dbi dbi[KW_DB_COUNT_];
    char dir[4096];
    bool readonly;
    uint64_t map_size, map_max;
    uint32_t fail_countdown;   /* test seam */
    int fail_rc;
};

struct kw_wtxn {
    kw_store *s;
    MDB_txn *txn;
    int mdb_rc;                /* the LMDB error that ended the fill (MDB_MAP_FULL: grow and retry) */
};

struct kw_rtxn {
    kw_store *s;
    MDB_txn *txn;
};

struct kw_walit {
    kw_rtxn *r;
    MDB_cursor *cur;
    bool first;
    MDB_val start;
    unsigned char startbuf[16];
    size_t plen;
    bool wal;
};

static int from_mdb(int rc, const char *what, const kw_store *s)
{
    int code = rc == ENOSPC || rc == MDB_MAP_FULL ? KEEL_ENOSPC
             : rc == ENOMEM                       ? KEEL_ENOMEM
             : rc == MDB_BAD_VALSIZE || rc == EINVAL ? KEEL_EINVAL
             : rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_VERSION_MISMATCH
                 ? KEEL_ECORRUPT
                 : KEEL_EIO;
    return core_fail(code, "%s %s/data.mdb: %s", what, s->dir, mdb_strerror(rc));
}

static void be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static int bad_wal_key(const kw_store *s, size_t klen)
{
    return core_fail(KEEL_ECORRUPT, "a key of %zu bytes in the wal database of %s (LSN keys are 8 bytes)", klen, s->dir);
}

static uint64_t rdbe64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* ---- open / close ------------------------------------------------------------ */

static int open_dbs(kw_store *s, bool create)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, s->readonly ? MDB_RDONLY : 0, &txn);
    if (rc)
        return from_mdb(rc, "cannot begin a transaction on", s);
    for (int i = 0; i < KW_DB_COUNT_; i++) {
        rc = mdb_dbi_open(txn, db_names[i], create ? MDB_CREATE : 0, &s->dbi[i]);
        if (rc == MDB_NOTFOUND) {
            mdb_txn_abort(txn);
            return core_fail(KEEL_ENOENT, "%s is not a keel data directory (no '%s' database)", s->dir, db_names[i]);
        }
        if (rc) {
            mdb_txn_abort(txn);
            return from_mdb(rc, "cannot open the databases of", s);
        }
    }
    MDB_val k = {strlen(KW_META_FORMAT), (void *)KW_META_FORMAT}, v;
    rc = mdb_get(txn, s->dbi[KW_DB_META], &k, &v);
    if (rc == MDB_NOTFOUND && create) {
        unsigned char f[4] = {KEEL_WAL_FORMAT_VERSION & 0xff, 0, 0, 0};
        v = (MDB_val){4, f};
        rc = mdb_put(txn, s->dbi[KW_DB_META], &k, &v, 0);
        if (rc) {
            mdb_txn_abort(txn);
            return from_mdb(rc, "cannot write the format version to", s);
        }
        return (rc = mdb_txn_commit(txn)) ? from_mdb(rc, "cannot commit to", s) : KEEL_OK;
    }
    if (rc == MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return core_fail(KEEL_ENOENT, "%s is not a keel data directory (no format version in 'meta')", s->dir);
    }
    uint32_t fmt = 0;
    if (!rc && v.mv_size == 4)
        fmt = (uint32_t)((unsigned char *)v.mv_data)[0] | (uint32_t)((unsigned char *)v.mv_data)[1] << 8 |
              (uint32_t)((unsigned char *)v.mv_data)[2] << 16 | (uint32_t)((unsigned char *)v.mv_data)[3] << 24;
    /* commit, also read-only: aborting would close the handles opened in it */
    if ((rc = mdb_txn_commit(txn)))
        return from_mdb(rc, "cannot commit to", s);
    if (fmt != KEEL_WAL_FORMAT_VERSION)
        return core_fail(KEEL_ECORRUPT, "%s has WAL format version %u; this build reads version %u", s->dir, fmt,
                         KEEL_WAL_FORMAT_VERSION);
    return KEEL_OK;
}

/* A new data.mdb gets its name only once it is whole on disk. LMDB writes a
 * new file's two meta pages without a sync (the first commit's fdatasync
 * covers them), so a power cut before that commit could leave a file of the
 * right size with a missing or torn meta page, which LMDB then refuses for
 * good (found by the power-loss shim, docs/testing.md). So the file is made
 * as data.mdb.new (MDB_NOSUBDIR), the databases and the format version are
 * committed in it (a synced commit), and only then is it renamed to
 * data.mdb and the directory synced: a cut leaves no data.mdb (the next
 * open starts over, removing the leftovers) or a whole one. */
static int create_data_file(kw_store *s, const char *final)
{
    char tmp[4200], lock[4220];
    snprintf(tmp, sizeof tmp, "%s/data.mdb.new", s->dir);
    snprintf(lock, sizeof lock, "%s-lock", tmp);
    unlink(tmp);
    unlink(lock);
    int rc = mdb_env_create(&s->env);
    if (rc)
        return core_fail(KEEL_ENOMEM, "cannot create an LMDB environment: %s", mdb_strerror(rc));
    mdb_env_set_maxdbs(s->env, KW_DB_COUNT_ + 2);
    mdb_env_set_mapsize(s->env, s->map_size);
    rc = mdb_env_open(s->env, tmp, MDB_NOSUBDIR | MDB_NOTLS, 0644);
    rc = rc ? from_mdb(rc, "cannot create", s) : open_dbs(s, true);
    mdb_env_close(s->env);
    s->env = NULL;
    unlink(lock);
    if (!rc && rename(tmp, final))
        rc = core_fail(KEEL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    int dfd = rc ? -1 : open(s->dir, O_RDONLY | O_DIRECTORY);
    if (!rc && (dfd < 0 || fsync(dfd)))
        rc = core_fail(KEEL_EIO, "cannot sync data directory %s: %s", s->dir, strerror(errno));
    if (dfd >= 0)
        close(dfd);
    if (rc)
        unlink(tmp);
    return rc;
}

int kw_store_open(const char *dir, const kw_store_desc *desc, kw_store **out)
{
    kw_store_desc d = desc ? *desc : (kw_store_desc){0};
    if (!dir || !*dir || strlen(dir) >= 4000 || !out)
        return core_fail(KEEL_EINVAL, "kw_store_open: the directory name is missing or too long");
    bool create = d.flags & KW_OPEN_CREATE, readonly = d.flags & KW_OPEN_READONLY;
    struct stat st;
    if (stat(dir, &st)) {
        if (errno != ENOENT || !create || readonly)
            return core_fail(errno == ENOENT ? KEEL_ENOENT : KEEL_EIO, "cannot open data directory %s: %s", dir,
                             strerror(errno));
        if (mkdir(dir, 0755) && errno != EEXIST)
            return core_fail(KEEL_EIO, "cannot create data directory %s: %s", dir, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return core_fail(KEEL_ENOENT, "%s is a file, not a data directory", dir);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    if (!create && stat(path, &st))
        return core_fail(KEEL_ENOENT, "%s is not a keel data directory (no data.mdb)", dir);
    kw_store *s = calloc(1, sizeof *s);
    if (!s)
        return core_fail(KEEL_ENOMEM, "out of memory opening %s", dir);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    s->readonly = readonly;
    s->map_size = d.map_size ? d.map_size : 64ull << 20;
    s->map_max = d.map_max ? d.map_max : 1ull << 40;
    if (s->map_size > s->map_max)
        s->map_size = s->map_max;
    int rc = create && !readonly && stat(path, &st) ? create_data_file(s, path) : KEEL_OK;
    if (rc) {
        free(s);
        return rc;
    }
    rc = mdb_env_create(&s->env);
    if (rc) {
        free(s);
        return core_fail(KEEL_ENOMEM, "cannot create an LMDB environment: %s", mdb_strerror(rc));
    }
    mdb_env_set_maxdbs(s->env, KW_DB_COUNT_ + 2);
    mdb_env_set_maxreaders(s->env, 126);
    if (!readonly)
        mdb_env_set_mapsize(s->env, s->map_size);
    rc = mdb_env_open(s->env, dir, MDB_NOTLS | (readonly ? MDB_RDONLY : 0), 0644);
    if (rc) {
        int r = from_mdb(rc, "cannot open", s);
        mdb_env_close(s->env);
        free(s);
        return r;
    }
    MDB_envinfo info;
    if (!mdb_env_info(s->env, &info) && info.me_mapsize > s->map_size)
        s->map_size = info.me_mapsize; /* the file is larger than asked: keep its size */
    int dead = 0;
    mdb_reader_check(s->env, &dead);
    rc = open_dbs(s, create && !readonly);
    if (rc) {
        mdb_env_close(s->env);
        free(s);
        return rc;
    }
    *out = s;
    return KEEL_OK;
}

void kw_store_close(kw_store *s)
{
    if (!s)
        return;
    mdb_env_close(s->env);
    free(s);
}

const char *kw_store_dir(const kw_store *s)
{
    return s->dir;
}

uint64_t kw_store_file_size(const kw_store *s)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/data.mdb", s->dir);
    return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

uint64_t kw_store_map_size(const kw_store *s)
{
    return s->map_size;
}

void kw_store_test_fail_write(kw_store *s, uint32_t nth, int rc)
{
    s->fail_countdown = nth;
    s->fail_rc = rc;
}

/* ---- writing ----------------------------------------------------------------- */

static int wtxn_err(kw_wtxn *t, int rc, const char *what)
{
    t->mdb_rc = rc;
    return from_mdb(rc, what, t->s);
}

/* wal.put: an injected error stands for the write's own (a spilled page
 * that could not be written), named like one. */
static int put_failpoint(kw_wtxn *t)
{
    int rc = KEEL_FAILPOINT(WAL_PUT);
    if (!rc)
        return KEEL_OK;
    return core_fail_prefix(rc, "cannot write to %s/data.mdb", t->s->dir);
}

int kw_put(kw_wtxn *t, kw_db db, const void *key, size_t klen, const void *val, size_t vlen)
{
    MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
    int rc = put_failpoint(t);
    if (rc)
        return rc;
    rc = mdb_put(t->txn, t->s->dbi[db], &k, &v, 0);
    return rc ? wtxn_err(t, rc, "cannot write to") : KEEL_OK;
}

int kw_put_wal(kw_wtxn *t, uint64_t lsn, const void *rec, size_t len)
{
    unsigned char kb[8];
    be64(kb, lsn);
    MDB_val k = {8, kb}, v = {len, (void *)rec};
    int rc = put_failpoint(t);
    if (rc)
        return rc;
    rc = mdb_put(t->txn, t->s->dbi[KW_DB_WAL], &k, &v, MDB_APPEND);
    if (rc == MDB_KEYEXIST)
        return core_fail(KEEL_EINVAL, "WAL record LSN %llu is not above the last LSN in %s", (unsigned long long)lsn,
                         t->s->dir);
    return rc ? wtxn_err(t, rc, "cannot append to the WAL of") : KEEL_OK;
}

int kw_del(kw_wtxn *t, kw_db db, const void *key, size_t klen)
{
    MDB_val k = {klen, (void *)key};
    int rc = put_failpoint(t);
    if (rc)
        return rc;
    rc = mdb_del(t->txn, t->s->dbi[db], &k, NULL);
    return rc && rc != MDB_NOTFOUND ? wtxn_err(t, rc, "cannot delete from") : KEEL_OK;
}

/* Delete the WAL records with from <= LSN <= to. */
static int del_wal_range(kw_wtxn *t, uint64_t from, uint64_t to, uint64_t *deleted)
{
    MDB_cursor *cur;
    uint64_t n = 0;
    int rc = put_failpoint(t);
    if (rc)
        return rc;
    rc = mdb_cursor_open(t->txn, t->s->dbi[KW_DB_WAL], &cur);
    if (rc)
        return wtxn_err(t, rc, "cannot open a cursor on");
    unsigned char kb[8];
    be64(kb, from);
    MDB_val k = {8, kb}, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); !rc; rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)) {
        if (k.mv_size != 8 || rdbe64(k.mv_data) > to || (rc = mdb_cursor_del(cur, 0)))
            break;
        n++;
        k = (MDB_val){8, kb};
    }
    mdb_cursor_close(cur);
    if (deleted)
        *deleted = n;
    return rc && rc != MDB_NOTFOUND ? wtxn_err(t, rc, "cannot delete WAL records from") : KEEL_OK;
}

int kw_del_wal_upto(kw_wtxn *t, uint64_t upto, uint64_t *deleted)
{
    return del_wal_range(t, 0, upto, deleted);
}

int kw_del_wal_from(kw_wtxn *t, uint64_t from, uint64_t *deleted)
{
    return del_wal_range(t, from, UINT64_MAX, deleted);
}

int kw_del_prefix(kw_wtxn *t, kw_db db, const void *prefix, size_t plen,
                  bool (*keep)(const void *key, size_t klen, void *arg), void *arg)
{
    MDB_cursor *cur;
    int rc = put_failpoint(t);
    if (rc)
        return rc;
    rc = mdb_cursor_open(t->txn, t->s->dbi[db], &cur);
    if (rc)
        return wtxn_err(t, rc, "cannot open a cursor on");
    MDB_val k = {plen, (void *)prefix}, v;
    rc = mdb_cursor_get(cur, &k, &v, plen ? MDB_SET_RANGE : MDB_FIRST);
    while (!rc && k.mv_size >= plen && !memcmp(k.mv_data, prefix, plen)) {
        if (!keep || !keep(k.mv_data, k.mv_size, arg)) {
            if ((rc = mdb_cursor_del(cur, 0)))
                break;
            rc = mdb_cursor_get(cur, &k, &v, MDB_GET_CURRENT);
            if (rc == EINVAL || rc == MDB_NOTFOUND) /* deleted the last key */
                rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
            continue;
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    return rc && rc != MDB_NOTFOUND ? wtxn_err(t, rc, "cannot delete keys from") : KEEL_OK;
}

static int grow(kw_store *s)
{
    if (s->map_size >= s->map_max)
        return core_fail(KEEL_ENOSPC, "%s/data.mdb is full: the map reached its maximum of %llu bytes", s->dir,
                         (unsigned long long)s->map_max);
    uint64_t size = s->map_size * 2 > s->map_max ? s->map_max : s->map_size * 2;
    int rc = mdb_env_set_mapsize(s->env, size);
    if (rc)
        return from_mdb(rc, "cannot grow the map of", s);
    s->map_size = size;
    return KEEL_OK;
}

int kw_store_write(kw_store *s, int (*fill)(kw_wtxn *txn, void *arg), void *arg)
{
    if (s->readonly)
        return core_fail(KEEL_EINVAL, "%s is open read-only", s->dir);
    for (;;) {
        kw_wtxn t = {.s = s};
        int rc = mdb_txn_begin(s->env, NULL, 0, &t.txn);
        if (rc)
            return from_mdb(rc, "cannot begin a write transaction on", s);
        rc = fill(&t, arg);
        if (!rc && s->fail_countdown && --s->fail_countdown == 0) {
            mdb_txn_abort(t.txn);
            return core_fail(s->fail_rc, "injected %s writing %s/data.mdb", keel_strerror(s->fail_rc), s->dir);
        }
        if (!rc && (rc = KEEL_FAILPOINT(WAL_BEFORE_COMMIT))) { /* as a failed page write or sync: aborted */
            mdb_txn_abort(t.txn);
            return core_fail_prefix(rc, "cannot commit to %s/data.mdb", s->dir);
        }
        if (rc) {
            mdb_txn_abort(t.txn);
            if (t.mdb_rc == MDB_MAP_FULL && !(rc = grow(s)))
                continue;
            return rc;
        }
        rc = mdb_txn_commit(t.txn); /* frees the transaction whatever the outcome */
        if (rc == MDB_MAP_FULL) {
            if ((rc = grow(s)))
                return rc;
            continue;
        }
        if (rc)
            return from_mdb(rc, "cannot commit to", s);
        (void)KEEL_FAILPOINT(WAL_AFTER_COMMIT); /* on disk, nobody told yet */
        return KEEL_OK;
    }
}

/* ---- reading ----------------------------------------------------------------- */

int kw_read_begin(kw_store *s, kw_rtxn **out)
{
    kw_rtxn *r = calloc(1, sizeof *r);
    if (!r)
        return core_fail(KEEL_ENOMEM, "out of memory for a read transaction");
    r->s = s;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r->txn);
    if (rc == MDB_MAP_RESIZED) { /* another process grew the map */
        mdb_env_set_mapsize(s->env, 0);
        rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r->txn);
    }
    if (rc) {
        free(r);
        return from_mdb(rc, "cannot begin a read transaction on", s);
    }
    *out = r;
    return KEEL_OK;
}

void kw_read_end(kw_rtxn *r)
{
    if (!r)
        return;
    mdb_txn_abort(r->txn);
    free(r);
}

int kw_get(kw_rtxn *r, kw_db db, const void *key, size_t klen, const void **val, size_t *vlen)
{
    MDB_val k = {klen, (void *)key}, v;
    int rc = mdb_get(r->txn, r->s->dbi[db], &k, &v);
    if (rc == MDB_NOTFOUND)
        return KEEL_ENOENT;
    if (rc)
        return from_mdb(rc, "cannot read", r->s);
    *val = v.mv_data;
    *vlen = v.mv_size;
    return KEEL_OK;
}

static int iter_open(kw_rtxn *r, kw_db db, const void *start, size_t slen, size_t plen, kw_walit **out)
{
    kw_walit *it = calloc(1, sizeof *it);
    if (!it)
        return core_fail(KEEL_ENOMEM, "out of memory for a cursor");
    int rc = mdb_cursor_open(r->txn, r->s->dbi[db], &it->cur);
    if (rc) {
        free(it);
        return from_mdb(rc, "cannot open a cursor on", r->s);
    }
    it->r = r;
    it->first = true;
    if (slen)
        memcpy(it->startbuf, start, slen);
    it->start = (MDB_val){slen, it->startbuf};
    it->plen = plen;
    it->wal = db == KW_DB_WAL;
    *out = it;
    return KEEL_OK;
}

int kw_wal_iter(kw_rtxn *r, uint64_t from, kw_walit **out)
{
    unsigned char kb[8];
    be64(kb, from);
    return iter_open(r, KW_DB_WAL, kb, 8, 0, out);
}

int kw_db_iter(kw_rtxn *r, kw_db db, const void *prefix, size_t plen, kw_walit **out)
{
    if (plen > 16)
        return core_fail(KEEL_EINVAL, "kw_db_iter: prefix longer than 16 bytes");
    return iter_open(r, db, prefix, plen, plen, out);
}

static int step(kw_walit *it, MDB_val *k, MDB_val *v)
{
    int rc;
    if (it->first) {
        it->first = false;
        *k = it->start;
        rc = it->start.mv_size ? mdb_cursor_get(it->cur, k, v, MDB_SET_RANGE) : mdb_cursor_get(it->cur, k, v, MDB_FIRST);
    } else {
        rc = mdb_cursor_get(it->cur, k, v, MDB_NEXT);
    }
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc)
        return from_mdb(rc, "cannot read", it->r->s);
    if (it->plen && (k->mv_size < it->plen || memcmp(k->mv_data, it->startbuf, it->plen)))
        return 0;
    return 1;
}

int kw_wal_next(kw_walit *it, uint64_t *lsn, const void **rec, size_t *len)
{
    MDB_val k, v;
    int rc = step(it, &k, &v);
    if (rc <= 0)
        return rc;
    if (k.mv_size != 8)
        return bad_wal_key(it->r->s, k.mv_size);
    *lsn = rdbe64(k.mv_data);
    *rec = v.mv_data;
    *len = v.mv_size;
    return 1;
}

int kw_db_next(kw_walit *it, const void **key, size_t *klen, const void **val, size_t *vlen)
{
    MDB_val k, v;
    int rc = step(it, &k, &v);
    if (rc <= 0)
        return rc;
    *key = k.mv_data;
    *klen = k.mv_size;
    *val = v.mv_data;
    *vlen = v.mv_size;
    return 1;
}

void kw_wal_iter_end(kw_walit *it)
{
    if (!it)
        return;
    mdb_cursor_close(it->cur);
    free(it);
}

int kw_wal_bounds(kw_rtxn *r, uint64_t *first, uint64_t *last, uint64_t *count)
{
    MDB_stat st;
    int rc = mdb_stat(r->txn, r->s->dbi[KW_DB_WAL], &st);
    if (rc)
        return from_mdb(rc, "cannot stat the WAL of", r->s);
    if (count)
        *count = st.ms_entries;
    if (!st.ms_entries)
        return KEEL_ENOENT;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(r->txn, r->s->dbi[KW_DB_WAL], &cur)))
        return from_mdb(rc, "cannot open a cursor on", r->s);
    MDB_val k, v;
    uint64_t lsn[2] = {0, 0};
    for (int i = 0; i < 2 && !rc; i++) {
        rc = mdb_cursor_get(cur, &k, &v, i ? MDB_LAST : MDB_FIRST);
        if (!rc && k.mv_size != 8) { /* a damaged directory: there is no LSN to read */
            mdb_cursor_close(cur);
            return bad_wal_key(r->s, k.mv_size);
        }
        if (!rc)
            lsn[i] = rdbe64(k.mv_data);
    }
    mdb_cursor_close(cur);
    if (rc)
        return from_mdb(rc, "cannot read the WAL of", r->s);
    if (first)
        *first = lsn[0];
    if (last)
        *last = lsn[1];
    return KEEL_OK;
}
