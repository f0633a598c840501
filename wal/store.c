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
#include <stdarg.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
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
    int lock_fd;               /* KW_OPEN_OWN: DIR/keel.lock, flocked; -1 otherwise */
    bool made_dir, made_file;  /* this open made the directory; ... data.mdb (under its lock) */
    bool unmake;               /* kw_store_forget: the close removes what this open made */
    /* LMDB may change the map's size only while no transaction of this
     * process is open: every transaction holds `remap` shared, a resize
     * holds it exclusively (threads read beside the WAL writer) */
    pthread_rwlock_t remap;
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
    uint8_t snap;              /* kw_snap_iter: index in SNAP_ORDER of the next prefix (0: a plain iterator) */
};

/* The snap db's key prefixes in the order a checkpoint loads: the table
 * list, the slot pages, the chunks, the idempotency keys (kw_snap_iter). */
static const char SNAP_ORDER[] = "TSCK";

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

/* ---- the data file's own meta pages -------------------------------------------- */

/* LMDB maps data.mdb whole and trusts its meta pages: a file cut short
 * faults (SIGBUS) at the first page past its end, and an empty file is
 * initialised as a new environment in place. So keel reads the two meta
 * pages itself first. lmdb.h does not publish their layout; it is mdb.c's
 * MDB_page header followed by MDB_meta, unchanged since LMDB data version
 * 1: page number (size_t), pad (u16), flags (u16), lower/upper (u16 each);
 * then magic, version (u32), address, map size (size_t), the free and the
 * main database (each u32 pad = page size in the free one, u16 flags, u16
 * depth, 5 size_t: branch, leaf and overflow pages, entries, root), last
 * page and transaction id (size_t). */
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_DATA_VERSION 1u
#define LMDB_P_META 0x08u
#define LMDB_P_INVALID ((uint64_t)(size_t)~(size_t)0)
#define LMDB_Z sizeof(size_t)
#define LMDB_HDR (LMDB_Z + 8)                         /* the page header */
#define LMDB_DB0 (LMDB_HDR + 8 + 2 * LMDB_Z)          /* the free database's MDB_db */
#define LMDB_DBSIZE (8 + 5 * LMDB_Z)
#define LMDB_LAST (LMDB_DB0 + 2 * LMDB_DBSIZE)        /* mm_last_pg */
#define LMDB_META_END (LMDB_LAST + 2 * LMDB_Z)

#define LMDB_P_BRANCH 0x01u
#define LMDB_P_LEAF 0x02u
#define LMDB_F_BIGDATA 0x01u
#define LMDB_NODE 8                                   /* MDB_node: lo, hi, flags, ksize (u16 each), then data */

/* A tree's record (MDB_db): in a meta page for the free and the main tree,
 * as a main-tree value for each named database. */
typedef struct lmdb_db {
    uint16_t flags, depth;
    uint64_t branch, leaf, overflow, entries, root;
} lmdb_db;

typedef struct lmdb_meta {
    uint64_t pgno, last_pg, txnid;
    lmdb_db db[2]; /* the free tree, the main tree */
    uint32_t flags, magic, version, psize;
} lmdb_meta;

static uint64_t rd_size(const unsigned char *p)
{
    size_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t rd_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint16_t rd_u16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* An MDB_db at p: u32 pad, u16 flags, u16 depth, then five size_t. */
static lmdb_db read_db(const unsigned char *p)
{
    const unsigned char *z = p + 8;
    return (lmdb_db){.flags = rd_u16(p + 4), .depth = rd_u16(p + 6), .branch = rd_size(z),
                     .leaf = rd_size(z + LMDB_Z), .overflow = rd_size(z + 2 * LMDB_Z),
                     .entries = rd_size(z + 3 * LMDB_Z), .root = rd_size(z + 4 * LMDB_Z)};
}

static void parse_meta(const unsigned char *b, lmdb_meta *m)
{
    *m = (lmdb_meta){.pgno = rd_size(b), .flags = rd_u16(b + LMDB_Z + 2), .magic = rd_u32(b + LMDB_HDR),
                     .version = rd_u32(b + LMDB_HDR + 4), .psize = rd_u32(b + LMDB_DB0),
                     .db = {read_db(b + LMDB_DB0), read_db(b + LMDB_DB0 + LMDB_DBSIZE)},
                     .last_pg = rd_size(b + LMDB_LAST), .txnid = rd_size(b + LMDB_LAST + LMDB_Z)};
}

/* The meta page at offset off; false when the file ends before it. */
static bool read_meta(int fd, uint64_t off, lmdb_meta *m)
{
    unsigned char b[LMDB_META_END];
    if (pread(fd, b, sizeof b, (off_t)off) != (ssize_t)sizeof b)
        return false;
    parse_meta(b, m);
    return true;
}

/* ---- the free pages past the end of the file ----------------------------------- */

/* A meta's last page is not always in the file: pages a transaction
 * allocated at the end and freed again before its commit (LMDB's "loose"
 * pages) are never written, yet count in the last page number. They are
 * free, and every free page is listed in the free-page tree (the free
 * database: transaction id -> a list of page numbers, the list counted by
 * its first word). So the pages between the file's end and the last page
 * must all be listed there; a page past the end that is not is one the
 * trees may use, and the file is truncated. The walk reads the free tree
 * only -- a few pages -- with pread, never through a map. */
typedef struct free_walk {
    int fd;
    uint32_t psize;
    uint64_t npages;           /* whole pages in the file */
    uint64_t tail;             /* pages npages..last_pg */
    unsigned char *seen;       /* one byte per tail page: listed free */
    unsigned char *page;       /* psize bytes */
    uint64_t bad;              /* a page of the free tree itself past the end (+1), or 0 */
    uint64_t visits;           /* pages read: a damaged tree could name a page twice (a cycle) */
    bool oom;                  /* out of memory: no verdict on the file */
} free_walk;

static bool read_page(free_walk *w, uint64_t pgno, unsigned char *buf)
{
    if (pgno >= w->npages) {
        w->bad = pgno + 1;
        return false;
    }
    return pread(w->fd, buf, w->psize, (off_t)(pgno * w->psize)) == (ssize_t)w->psize;
}

static void mark_free(free_walk *w, const unsigned char *ids, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t pg = rd_size(ids + i * LMDB_Z);
        if (pg >= w->npages && pg - w->npages < w->tail)
            w->seen[pg - w->npages] = 1;
    }
}

/* One free-list value of dsize bytes: in the leaf at `data`, or (BIGDATA)
 * in the overflow pages starting at the page number stored there. */
static bool walk_value(free_walk *w, const unsigned char *data, uint64_t dsize, bool big)
{
    if (!big) {
        mark_free(w, data + LMDB_Z, dsize / LMDB_Z ? dsize / LMDB_Z - 1 : 0);
        return true;
    }
    uint64_t first = rd_size(data), npg = (LMDB_HDR + dsize + w->psize - 1) / w->psize;
    if (first >= w->npages || npg > w->npages - first) {
        w->bad = (first >= w->npages ? first : w->npages) + 1;
        return false;
    }
    unsigned char *buf = malloc(npg * w->psize);
    if (!buf) {
        w->oom = true;
        return false;
    }
    bool ok = pread(w->fd, buf, npg * w->psize, (off_t)(first * w->psize)) == (ssize_t)(npg * w->psize);
    if (ok)
        mark_free(w, buf + LMDB_HDR + LMDB_Z, dsize / LMDB_Z ? dsize / LMDB_Z - 1 : 0);
    free(buf);
    return ok;
}

static bool walk_tree(free_walk *w, uint64_t pgno, int depth)
{
    unsigned char *p = malloc(w->psize);
    w->oom |= !p;
    if (!p || depth > 32 || ++w->visits > w->npages || !read_page(w, pgno, p)) {
        free(p);
        return false;
    }
    uint16_t flags, lower;
    memcpy(&flags, p + LMDB_Z + 2, 2);
    memcpy(&lower, p + LMDB_Z + 4, 2);
    bool ok = (flags & (LMDB_P_BRANCH | LMDB_P_LEAF)) && lower >= LMDB_HDR && lower <= w->psize;
    for (unsigned i = 0; ok && i < (lower - LMDB_HDR) / 2u; i++) {
        uint16_t off, n[4];
        memcpy(&off, p + LMDB_HDR + 2 * i, 2);
        if ((uint32_t)off + LMDB_NODE > w->psize) {
            ok = false;
            break;
        }
        memcpy(n, p + off, sizeof n);
        if (flags & LMDB_P_BRANCH) {
            uint64_t child = (uint64_t)n[0] | (uint64_t)n[1] << 16 | (LMDB_Z > 4 ? (uint64_t)n[2] << 32 : 0);
            ok = walk_tree(w, child, depth + 1);
        } else {
            uint64_t dsize = (uint64_t)n[0] | (uint64_t)n[1] << 16;
            size_t at = off + LMDB_NODE + n[3];
            bool big = n[2] & LMDB_F_BIGDATA;
            ok = at + (big ? LMDB_Z : dsize) <= w->psize && walk_value(w, p + at, dsize, big);
        }
    }
    free(p);
    return ok;
}

/* 1 when the free tree of m lists every page from npages (the file's end)
 * to m's last page; 0 when it does not, *missing then naming the first page
 * it leaves out (or a page of the free tree itself past the end); a KEEL_E*
 * code (out of memory) when it could not tell. */
static int tail_is_free(int fd, const lmdb_meta *m, uint64_t npages, uint64_t *missing)
{
    free_walk w = {.fd = fd, .psize = m->psize, .npages = npages, .tail = m->last_pg + 1 - npages};
    *missing = npages;
    if (w.tail > (1u << 24)) /* 16 Mi pages missing: no free list explains that */
        return 0;
    w.seen = calloc(w.tail, 1);
    if (!w.seen)
        return core_fail(KEEL_ENOMEM, "out of memory checking data.mdb's free pages");
    bool ok = m->db[0].root != LMDB_P_INVALID && walk_tree(&w, m->db[0].root, 0);
    uint64_t i = 0;
    while (ok && i < w.tail && w.seen[i])
        i++;
    free(w.seen);
    if (w.oom) /* never a damaged file for lack of memory */
        return core_fail(KEEL_ENOMEM, "out of memory checking data.mdb's free pages");
    if (!ok) {
        *missing = w.bad ? w.bad - 1 : npages;
        return 0;
    }
    *missing = npages + i;
    return i == w.tail;
}

static int damaged(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int damaged(const char *path, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return core_fail(KEEL_ECORRUPT, "%s is damaged: %s; keel refuses it untouched (restore the directory from a backup)",
                     path, why);
}

static int meta_ok(int fd, const char *path, int i, const lmdb_meta *m, uint32_t psize, uint64_t size, bool newest)
{
    static const char *const tree[2] = {"free-page", "main"};
    if (m->magic != LMDB_MAGIC)
        return damaged(path, "meta page %d has no LMDB magic (0x%08x)", i, m->magic);
    if (!(m->flags & LMDB_P_META) || m->pgno != (uint64_t)i)
        return damaged(path, "meta page %d is not marked as one (page number %llu, flags 0x%x)", i,
                       (unsigned long long)m->pgno, m->flags);
    if (m->version != LMDB_DATA_VERSION)
        return damaged(path, "meta page %d has LMDB data version %u (this LMDB reads version %u)", i, m->version,
                       LMDB_DATA_VERSION);
    if (m->psize != psize)
        return damaged(path, "meta page %d says pages are %u bytes, meta page 0 says %u", i, m->psize, psize);
    if (m->last_pg < 1)
        return damaged(path, "meta page %d says the last page is %llu, below the meta pages", i,
                       (unsigned long long)m->last_pg);
    for (int t = 0; t < 2; t++)
        if (m->db[t].root != LMDB_P_INVALID && (m->db[t].root < 2 || m->db[t].root > m->last_pg))
            return damaged(path, "meta page %d puts the root of the %s tree at page %llu, outside pages 2..%llu", i,
                           tree[t], (unsigned long long)m->db[t].root, (unsigned long long)m->last_pg);
    for (int t = 0; t < 2; t++)
        if (m->db[t].root != LMDB_P_INVALID && m->db[t].root >= size / psize)
            return damaged(path, "meta page %d puts the root of the %s tree at page %llu, but the file ends at page "
                           "%llu: it is truncated", i, tree[t], (unsigned long long)m->db[t].root,
                           (unsigned long long)(size / psize));
    /* the pages past the end must all be free; LMDB opens the newest meta,
     * and the older one's free tree may since have been reused */
    uint64_t missing;
    int fr = newest && m->last_pg >= size / psize ? tail_is_free(fd, m, size / psize, &missing) : 1;
    if (fr < 0)
        return fr;
    if (!fr)
        return damaged(path, "meta page %d says the last page is %llu (%llu bytes of %u-byte pages), the file has "
                       "%llu bytes, and page %llu past its end is not a free page: the file is truncated", i,
                       (unsigned long long)m->last_pg, (unsigned long long)(m->last_pg + 1) * psize, psize,
                       (unsigned long long)size, (unsigned long long)missing);
    return KEEL_OK;
}

static int check_fd(int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st))
        return core_fail(KEEL_EIO, "cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return KEEL_OK; /* not a file: LMDB's open says what it is */
    if (st.st_size == 0)
        return damaged(path, "the file is empty (0 bytes): it has no meta page, and an empty file is never taken "
                       "for a new world");
    lmdb_meta m[2];
    if (!read_meta(fd, 0, &m[0]))
        return damaged(path, "the file has %llu bytes, fewer than its first meta page", (unsigned long long)st.st_size);
    if (m[0].magic != LMDB_MAGIC) {
        /* page 0 is not LMDB's: damage when page 1 (at the usual page size) is, else no LMDB file at all */
        if (read_meta(fd, 4096, &m[1]) && m[1].magic == LMDB_MAGIC && m[1].pgno == 1)
            return damaged(path, "meta page 0 has no LMDB magic (0x%08x) while meta page 1 has it", m[0].magic);
        return KEEL_OK; /* LMDB says "not an LMDB file" */
    }
    uint32_t psize = m[0].psize;
    if (psize < 512 || psize > 65536 || (psize & (psize - 1)))
        return damaged(path, "meta page 0 gives a page size of %u bytes (LMDB's are powers of two from 512 to 65536)",
                       psize);
    if (!read_meta(fd, psize, &m[1]))
        return damaged(path, "the file has %llu bytes, fewer than its two meta pages of %u bytes: it is truncated",
                       (unsigned long long)st.st_size, psize);
    /* the size after the metas: a live writer writes its pages before the meta naming them */
    if (fstat(fd, &st))
        return core_fail(KEEL_EIO, "cannot stat %s: %s", path, strerror(errno));
    int rc = KEEL_OK;
    int newest = m[1].txnid > m[0].txnid; /* the one LMDB opens */
    for (int i = 0; i < 2 && !rc; i++)
        rc = meta_ok(fd, path, i, &m[i], psize, (uint64_t)st.st_size, i == newest);
    return rc;
}

int kw_store_check_file(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/data.mdb", dir ? dir : "");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? KEEL_OK : core_fail(KEEL_EIO, "cannot open %s: %s", path, strerror(errno));
    int rc = check_fd(fd, path);
    close(fd);
    return rc;
}

/* ---- the trees ---------------------------------------------------------------------- */

/* LMDB trusts every page it reads as much as its meta pages: a page with a
 * wrong type, a node outside its page, a child or a value past the file's
 * end makes it assert (abort), fault, or read and write the wrong pages.
 * So an open walks every tree of the snapshot it is about to use -- the
 * free-page tree, the main tree, and each named database the main tree
 * records -- before LMDB reads a tree page, and refuses the file at the
 * first page LMDB could not use safely:
 *   - every page lies in the file and names itself (its page number);
 *   - a page at depth d of a tree of depth D is a branch page when d < D,
 *     a leaf page when d = D, its node table inside the page;
 *   - every node lies inside its page, with its key and (unless BIGDATA)
 *     its value; a branch has a child; a leaf node's flags are BIGDATA or
 *     (in the main tree only) SUBDATA with a database record as value:
 *     keel makes no duplicate-key database;
 *   - a BIGDATA value's overflow run starts with an overflow page naming
 *     itself, long enough for the value, inside the file (LMDB frees and
 *     copies as many pages as that page says);
 *   - the pages and entries counted match the tree's record (a lost or
 *     doubled subtree).
 * The walk runs in a read transaction, whose snapshot a live writer leaves
 * alone (keel-wal beside a server), from the meta page of that snapshot,
 * with pread (never through a map: a damaged page number past the file's
 * end reads nothing): the branch and leaf pages and the first bytes of
 * each overflow run. */
#define LMDB_P_OVERFLOW 0x04u
#define LMDB_P_TYPES 0x6fu /* branch, leaf, overflow, meta, LEAF2, sub-page: the page's type bits */
#define LMDB_F_SUBDATA 0x02u
#define LMDB_DEPTH_MAX 32  /* LMDB's cursor stack */

typedef struct tree_walk {
    int fd;
    const char *path, *tree;   /* tree: the name in messages */
    uint32_t psize;
    uint64_t npages;           /* pages a tree may use: in the file, in the map, up to the meta's last page */
    uint64_t visits;           /* every tree's pages: a damaged tree naming a page twice stops here */
    bool main;                 /* the main tree: its leaves record the named databases */
    lmdb_db counted;
    unsigned char *page[LMDB_DEPTH_MAX]; /* the page read at each depth */
    lmdb_db *subs;             /* the main tree's databases, walked after it */
    char (*names)[64];
    uint32_t nsubs, subcap;
} tree_walk;

static int tree_page(tree_walk *w, uint64_t pgno, unsigned level, const lmdb_db *db);

/* n bytes of page pgno into buf. */
static int page_read(const tree_walk *w, uint64_t pgno, unsigned char *buf, size_t n)
{
    if (pread(w->fd, buf, n, (off_t)(pgno * w->psize)) == (ssize_t)n)
        return KEEL_OK;
    return core_fail(KEEL_EIO, "cannot read page %llu of %s: %s", (unsigned long long)pgno, w->path,
                     errno ? strerror(errno) : "the file ends before it");
}

static int sub_db(tree_walk *w, const unsigned char *key, uint16_t ksize, const unsigned char *val, uint64_t vsize,
                  uint64_t pgno)
{
    if (vsize != LMDB_DBSIZE)
        return damaged(w->path, "leaf page %llu of the main tree records a database in %llu bytes (LMDB's record "
                       "has %zu)", (unsigned long long)pgno, (unsigned long long)vsize, (size_t)LMDB_DBSIZE);
    if (w->nsubs == w->subcap) {
        uint32_t cap = w->subcap ? 2 * w->subcap : 16;
        lmdb_db *subs = realloc(w->subs, cap * sizeof *subs);
        if (subs)
            w->subs = subs;
        char(*names)[64] = subs ? realloc(w->names, cap * sizeof *names) : NULL;
        if (!names)
            return core_fail(KEEL_ENOMEM, "out of memory checking %s", w->path);
        w->names = names;
        w->subcap = cap;
    }
    w->subs[w->nsubs] = read_db(val);
    snprintf(w->names[w->nsubs++], 64, "%.*s", ksize < 63 ? (int)ksize : 63, (const char *)key);
    return KEEL_OK;
}

/* The overflow run of a value of vsize bytes starting at page `first`. */
static int overflow_run(tree_walk *w, uint64_t first, uint64_t vsize, uint64_t pgno)
{
    uint64_t need = (LMDB_HDR + vsize + w->psize - 1) / w->psize;
    if (first < 2 || first >= w->npages || need > w->npages - first)
        return damaged(w->path, "a value of %llu bytes on leaf page %llu of the %s tree lies in pages %llu..%llu, "
                       "outside pages 2..%llu", (unsigned long long)vsize, (unsigned long long)pgno, w->tree,
                       (unsigned long long)first, (unsigned long long)(first + need - 1),
                       (unsigned long long)(w->npages - 1));
    unsigned char h[LMDB_HDR];
    errno = 0;
    int rc = page_read(w, first, h, sizeof h);
    if (rc)
        return rc;
    uint32_t pages = rd_u32(h + LMDB_Z + 4);
    if (rd_size(h) != first || (rd_u16(h + LMDB_Z + 2) & LMDB_P_TYPES) != LMDB_P_OVERFLOW || pages < need ||
        pages > w->npages - first)
        return damaged(w->path, "page %llu, the overflow run of a value of %llu bytes on leaf page %llu of the %s "
                       "tree, is not one (it names page %llu, flags 0x%x, %u pages)", (unsigned long long)first,
                       (unsigned long long)vsize, (unsigned long long)pgno, w->tree,
                       (unsigned long long)rd_size(h), rd_u16(h + LMDB_Z + 2), pages);
    w->counted.overflow += pages;
    return KEEL_OK;
}

/* Node i of leaf page pgno, its header at node (inside the page). */
static int leaf_node(tree_walk *w, const unsigned char *node, const unsigned char *end, uint64_t pgno, unsigned i)
{
    uint16_t flags = rd_u16(node + 4), ksize = rd_u16(node + 6);
    uint64_t vsize = (uint64_t)rd_u16(node) | (uint64_t)rd_u16(node + 2) << 16;
    const unsigned char *key = node + LMDB_NODE;
    bool big = flags & LMDB_F_BIGDATA, sub = flags & LMDB_F_SUBDATA;
    if ((flags & ~(LMDB_F_BIGDATA | LMDB_F_SUBDATA)) || (sub && (big || !w->main)))
        return damaged(w->path, "node %u of leaf page %llu of the %s tree has flags 0x%x", i,
                       (unsigned long long)pgno, w->tree, flags);
    if ((uint64_t)(end - key) < ksize || (uint64_t)(end - key) - ksize < (big ? LMDB_Z : vsize))
        return damaged(w->path, "node %u of leaf page %llu of the %s tree ends past the page (a %u-byte key, a "
                       "%llu-byte value)", i, (unsigned long long)pgno, w->tree, ksize, (unsigned long long)vsize);
    const unsigned char *val = key + ksize;
    w->counted.entries++;
    if (big)
        return overflow_run(w, rd_size(val), vsize, pgno);
    return sub ? sub_db(w, key, ksize, val, vsize, pgno) : KEEL_OK;
}

static int tree_nodes(tree_walk *w, const unsigned char *p, uint64_t pgno, unsigned level, const lmdb_db *db)
{
    bool leaf = level + 1 == db->depth;
    uint16_t lower = rd_u16(p + LMDB_Z + 4), upper = rd_u16(p + LMDB_Z + 6);
    unsigned n = lower >= LMDB_HDR ? (lower - LMDB_HDR) / 2u : 0;
    if (lower < LMDB_HDR || lower > upper || upper > w->psize || (lower - LMDB_HDR) % 2 || (!leaf && !n))
        return damaged(w->path, "%s page %llu of the %s tree has a damaged node table (lower %u, upper %u)",
                       leaf ? "leaf" : "branch", (unsigned long long)pgno, w->tree, lower, upper);
    int rc = KEEL_OK;
    for (unsigned i = 0; i < n && !rc; i++) {
        uint16_t off = rd_u16(p + LMDB_HDR + 2 * i);
        if (off < upper || (uint32_t)off + LMDB_NODE > w->psize)
            return damaged(w->path, "node %u of %s page %llu of the %s tree is at offset %u, outside the page's "
                           "nodes (%u..%u)", i, leaf ? "leaf" : "branch", (unsigned long long)pgno, w->tree, off,
                           upper, w->psize);
        const unsigned char *node = p + off;
        if (leaf) {
            rc = leaf_node(w, node, p + w->psize, pgno, i);
        } else if ((uint32_t)off + LMDB_NODE + rd_u16(node + 6) > w->psize) {
            rc = damaged(w->path, "node %u of branch page %llu of the %s tree has a key past the page", i,
                         (unsigned long long)pgno, w->tree);
        } else {
            uint64_t child = (uint64_t)rd_u16(node) | (uint64_t)rd_u16(node + 2) << 16 |
                             (LMDB_Z > 4 ? (uint64_t)rd_u16(node + 4) << 32 : 0);
            rc = tree_page(w, child, level + 1, db);
        }
    }
    return rc;
}

static int tree_page(tree_walk *w, uint64_t pgno, unsigned level, const lmdb_db *db)
{
    if (++w->visits > w->npages)
        return damaged(w->path, "the %s tree reaches more pages than the file holds (it names a page twice)",
                       w->tree);
    if (pgno < 2 || pgno >= w->npages)
        return damaged(w->path, "the %s tree names page %llu, outside pages 2..%llu", w->tree,
                       (unsigned long long)pgno, (unsigned long long)(w->npages - 1));
    unsigned char *p = w->page[level];
    errno = 0;
    int rc = page_read(w, pgno, p, w->psize);
    if (rc)
        return rc;
    bool leaf = level + 1 == db->depth;
    uint16_t type = rd_u16(p + LMDB_Z + 2) & LMDB_P_TYPES;
    if (rd_size(p) != pgno || type != (leaf ? LMDB_P_LEAF : LMDB_P_BRANCH))
        return damaged(w->path, "page %llu of the %s tree, at depth %u of %u, is no %s page (it names page %llu, "
                       "flags 0x%x)", (unsigned long long)pgno, w->tree, level + 1, db->depth,
                       leaf ? "leaf" : "branch", (unsigned long long)rd_size(p), rd_u16(p + LMDB_Z + 2));
    if (leaf)
        w->counted.leaf++;
    else
        w->counted.branch++;
    return tree_nodes(w, p, pgno, level, db);
}

static int walk_db(tree_walk *w, const char *tree, const lmdb_db *db, bool main)
{
    w->tree = tree;
    w->main = main;
    w->counted = (lmdb_db){0};
    if (db->root == LMDB_P_INVALID)
        return db->depth || db->entries ? damaged(w->path, "the %s tree has no root but a depth of %u and %llu "
                                                  "entries", tree, db->depth, (unsigned long long)db->entries)
                                        : KEEL_OK;
    if (!db->depth || db->depth > LMDB_DEPTH_MAX)
        return damaged(w->path, "the %s tree has a depth of %u", tree, db->depth);
    int rc = tree_page(w, db->root, 0, db);
    const lmdb_db *c = &w->counted;
    if (!rc && (c->branch != db->branch || c->leaf != db->leaf || c->overflow != db->overflow ||
                c->entries != db->entries))
        rc = damaged(w->path, "the %s tree holds %llu branch, %llu leaf and %llu overflow pages and %llu entries; "
                     "its record says %llu, %llu, %llu and %llu", tree, (unsigned long long)c->branch,
                     (unsigned long long)c->leaf, (unsigned long long)c->overflow, (unsigned long long)c->entries,
                     (unsigned long long)db->branch, (unsigned long long)db->leaf, (unsigned long long)db->overflow,
                     (unsigned long long)db->entries);
    return rc;
}

static int walk_trees(tree_walk *w, const lmdb_meta *m)
{
    int rc = walk_db(w, "free-page", &m->db[0], false);
    if (!rc)
        rc = walk_db(w, "main", &m->db[1], true);
    for (uint32_t i = 0; i < w->nsubs && !rc; i++)
        rc = walk_db(w, w->names[i], &w->subs[i], false);
    return rc;
}

/* The meta page of snapshot txnid, read twice alike (a writer may be
 * writing it); false when neither is it any more. */
static bool snapshot_meta(int fd, uint32_t psize, uint64_t txnid, lmdb_meta *out)
{
    for (int i = 0; i < 2; i++) {
        unsigned char a[LMDB_META_END], b[LMDB_META_END];
        off_t off = (off_t)i * psize;
        if (pread(fd, a, sizeof a, off) != (ssize_t)sizeof a || pread(fd, b, sizeof b, off) != (ssize_t)sizeof b ||
            memcmp(a, b, sizeof a))
            continue;
        parse_meta(a, out);
        if (out->txnid == txnid)
            return true;
    }
    return false;
}

/* One read transaction's walk: *found false when the meta page of its
 * snapshot was gone. */
static int walk_txn(kw_store *s, tree_walk *w, bool *found)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return from_mdb(rc, "cannot begin a transaction on", s);
    lmdb_meta m;
    struct stat fs;
    w->visits = 0;
    w->nsubs = 0;
    *found = snapshot_meta(w->fd, w->psize, mdb_txn_id(txn), &m);
    if (*found && fstat(w->fd, &fs)) {
        rc = core_fail(KEEL_EIO, "cannot stat %s: %s", w->path, strerror(errno));
    } else if (*found) {
        uint64_t n = (uint64_t)fs.st_size / w->psize;
        w->npages = m.last_pg + 1 < n ? m.last_pg + 1 : n;
        rc = walk_trees(w, &m);
    }
    mdb_txn_abort(txn);
    return rc;
}

int kw_store_check_trees(kw_store *s)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/data.mdb", s->dir);
    MDB_stat st;
    if (mdb_env_stat(s->env, &st))
        return core_fail(KEEL_EIO, "cannot read the page size of %s", path);
    tree_walk w = {.fd = open(path, O_RDONLY | O_CLOEXEC), .path = path, .psize = st.ms_psize};
    int rc = w.fd < 0 ? core_fail(KEEL_EIO, "cannot open %s: %s", path, strerror(errno)) : KEEL_OK;
    for (int i = 0; i < LMDB_DEPTH_MAX && !rc; i++)
        if (!(w.page[i] = malloc(w.psize)))
            rc = core_fail(KEEL_ENOMEM, "out of memory checking %s", path);
    bool found = false;
    for (int tries = 0; !rc && !found && tries < 100; tries++) /* a writer committed twice meanwhile: again */
        rc = walk_txn(s, &w, &found);
    if (!rc && !found)
        rc = core_fail(KEEL_EBUSY, "%s: no meta page held a read transaction's snapshot in 100 tries (a writer "
                       "committing without pause)", path);
    for (int i = 0; i < LMDB_DEPTH_MAX; i++)
        free(w.page[i]);
    free(w.subs);
    free(w.names);
    if (w.fd >= 0)
        close(w.fd);
    return rc;
}

/* ---- owning the directory --------------------------------------------------------- */

/* One runtime owns a data directory: two would both number WAL records after
 * the same last LSN (LMDB serialises their writes, not their numbering) and
 * the second would die with KEEL_EFATAL. The lock is flock(2) on
 * DIR/keel.lock: it belongs to the open file description, so a second
 * store in the same process is refused too, and the kernel drops it when
 * the process dies, so a crash leaves nothing stale behind. The pid in the
 * file only names the holder in the refusal; the lock decides. Read-only
 * opens never take it (keel-wal works beside a server). */
static int own_dir(kw_store *s)
{
    char path[4200], pid[32] = {0};
    snprintf(path, sizeof path, "%s/keel.lock", s->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return core_fail(KEEL_EIO, "cannot open the lock file %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        ssize_t n = e == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : -1;
        close(fd);
        if (e != EWOULDBLOCK)
            return core_fail(KEEL_EIO, "cannot lock %s: %s", path, strerror(e));
        long holder = n > 0 ? strtol(pid, NULL, 10) : 0;
        if (holder > 0)
            return core_fail(KEEL_EBUSY, "data directory %s is in use by process %ld (it holds %s): one runtime "
                             "owns a directory at a time", s->dir, holder, path);
        return core_fail(KEEL_EBUSY, "data directory %s is in use by another process (it holds %s): one runtime "
                         "owns a directory at a time", s->dir, path);
    }
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return core_fail(KEEL_EIO, "cannot write the lock file %s: %s", path, strerror(e));
    }
    s->lock_fd = fd;
    return KEEL_OK;
}

static int sync_fail(const char *what, const char *path)
{
    return core_fail(errno == ENOSPC ? KEEL_ENOSPC : KEEL_EIO, "cannot %s %s: %s", what, path, strerror(errno));
}

/* path's directory entries to disk: a new name in it survives a power cut. */
static int sync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd < 0 || fsync(fd) ? sync_fail("sync", path) : KEEL_OK;
    if (fd >= 0)
        close(fd);
    return rc;
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
    rc = rc ? rc : sync_dir(s->dir);
    if (rc)
        unlink(tmp);
    return rc;
}

int kw_store_open(const char *dir, const kw_store_desc *desc, kw_store **out)
{
    kw_store_desc d = desc ? *desc : (kw_store_desc){0};
    if (!dir || !*dir || strlen(dir) >= 4000 || !out)
        return core_fail(KEEL_EINVAL, "kw_store_open: the directory name is missing or too long");
    bool create = d.flags & KW_OPEN_CREATE, readonly = d.flags & KW_OPEN_READONLY, made_dir = false;
    if ((d.flags & KW_OPEN_NOLOCK) && !readonly)
        return core_fail(KEEL_EINVAL, "kw_store_open: KW_OPEN_NOLOCK is for a read-only open (%s)", dir);
    struct stat st;
    if (stat(dir, &st)) {
        if (errno != ENOENT || !create || readonly)
            return core_fail(errno == ENOENT ? KEEL_ENOENT : KEEL_EIO, "cannot open data directory %s: %s", dir,
                             strerror(errno));
        int mk = mkdir(dir, 0755);
        if (mk && errno != EEXIST)
            return core_fail(KEEL_EIO, "cannot create data directory %s: %s", dir, strerror(errno));
        made_dir = mk == 0;
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
    s->lock_fd = -1;
    s->made_dir = made_dir;
    pthread_rwlock_init(&s->remap, NULL);
    s->map_size = d.map_size ? d.map_size : 64ull << 20;
    s->map_max = d.map_max ? d.map_max : 1ull << 40;
    if (s->map_size > s->map_max)
        s->map_size = s->map_max;
    /* the lock before anything is created: two creators would share data.mdb.new */
    int rc = (d.flags & KW_OPEN_OWN) && !readonly ? own_dir(s) : KEEL_OK;
    if (!rc && create && !readonly && stat(path, &st))
        s->made_file = !(rc = create_data_file(s, path));
    else if (!rc)
        rc = kw_store_check_file(dir);
    if (!rc && (rc = mdb_env_create(&s->env)))
        rc = core_fail(KEEL_ENOMEM, "cannot create an LMDB environment: %s", mdb_strerror(rc));
    if (rc) {
        kw_store_close(s);
        return rc;
    }
    mdb_env_set_maxdbs(s->env, KW_DB_COUNT_ + 2);
    mdb_env_set_maxreaders(s->env, 126);
    if (!readonly)
        mdb_env_set_mapsize(s->env, s->map_size);
    rc = mdb_env_open(s->env, dir,
                      MDB_NOTLS | (readonly ? MDB_RDONLY : 0) | (d.flags & KW_OPEN_NOLOCK ? MDB_NOLOCK : 0), 0644);
    if (rc) {
        int r = from_mdb(rc, "cannot open", s);
        kw_store_close(s);
        return r;
    }
    MDB_envinfo info;
    if (!mdb_env_info(s->env, &info) && info.me_mapsize > s->map_size)
        s->map_size = info.me_mapsize; /* the file is larger than asked: keep its size */
    int dead = 0;
    mdb_reader_check(s->env, &dead);
    bool walk = !s->made_file && !(d.flags & KW_OPEN_TREES_LATER);
    rc = walk ? kw_store_check_trees(s) : KEEL_OK;
    if (!rc)
        rc = open_dbs(s, create && !readonly);
    if (rc) {
        kw_store_close(s);
        return rc;
    }
    *out = s;
    return KEEL_OK;
}

void kw_store_forget(kw_store *s)
{
    if (s)
        s->unmake = s->made_file && s->lock_fd >= 0;
}

/* The close of a forgotten store: still under its lock (no other process
 * can have opened the directory since), data.mdb and LMDB's lock file go,
 * then keel.lock, then the directory if this open made it and it is empty. */
static void unmake(kw_store *s)
{
    static const char *const files[] = {"data.mdb", "lock.mdb", "keel.lock"};
    char p[4200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", s->dir, files[i]);
        unlink(p);
    }
}

void kw_store_close(kw_store *s)
{
    if (!s)
        return;
    if (s->env)
        mdb_env_close(s->env);
    if (s->unmake)
        unmake(s);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* after LMDB let go of the files: releases the lock */
    if (s->unmake && s->made_dir)
        rmdir(s->dir); /* only when empty: never an application's own file */
    pthread_rwlock_destroy(&s->remap);
    free(s);
}

/* ---- backup ------------------------------------------------------------------------- */

/* One backup run: every file it may make in dest (data.mdb.new, data.mdb,
 * then the application's files, whose sources are srcs[2..]), and which of
 * them it made. The claim makes dest its own: a run writes into dest only
 * after creating dest/data.mdb.new exclusively and finding nothing else
 * there, so another run following the same steps never writes beside it,
 * and what a failure (or a caller's signal handler) removes is this run's. */
typedef struct backup_run {
    const kw_backup_desc *desc;
    kw_store *src;
    size_t nfiles;
    char **files;              /* nfiles + 1, NULL-terminated */
    char **srcs;               /* nfiles: the source of files[i], NULL for the first two */
    volatile sig_atomic_t *made;
    kw_backup_made rec;
} backup_run;

enum { BK_TMP, BK_FINAL, BK_APP };

/* The files of a data directory that belong to LMDB or to the store; the
 * others (an application's own) travel with a backup. */
static bool store_file(const char *name)
{
    return !strcmp(name, "data.mdb") || !strcmp(name, "lock.mdb") || !strcmp(name, "keel.lock") ||
           !strncmp(name, "data.mdb.new", 12);
}

static char *path_of(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Add dest/name (from dir/name, when an application's file) to the run's list. */
static int add_file(backup_run *b, const char *name, bool app)
{
    char **f = realloc(b->files, (b->nfiles + 2) * sizeof *f), **s;
    if (f)
        b->files = f;
    s = f ? realloc(b->srcs, (b->nfiles + 1) * sizeof *s) : NULL;
    if (s)
        b->srcs = s;
    if (!f || !s)
        return core_fail(KEEL_ENOMEM, "out of memory listing the files of %s", b->desc->dir);
    size_t i = b->nfiles++;
    b->srcs[i] = app ? path_of(b->desc->dir, name) : NULL;
    b->files[i] = path_of(b->desc->dest, name);
    b->files[i + 1] = NULL;
    if (!b->files[i] || (app && !b->srcs[i]))
        return core_fail(KEEL_ENOMEM, "out of memory listing the files of %s", b->desc->dir);
    return KEEL_OK;
}

/* dir's regular files that are not the store's, as found at the backup's start. */
static int list_files(backup_run *b)
{
    int rc = add_file(b, "data.mdb.new", false);
    rc = rc ? rc : add_file(b, "data.mdb", false);
    DIR *dp = rc ? NULL : opendir(b->desc->dir);
    if (!rc && !dp)
        return core_fail(KEEL_EIO, "cannot read data directory %s: %s", b->desc->dir, strerror(errno));
    struct dirent *e;
    struct stat st;
    char src[4200];
    while (!rc && (errno = 0, e = readdir(dp))) {
        snprintf(src, sizeof src, "%s/%s", b->desc->dir, e->d_name);
        if (!store_file(e->d_name) && !stat(src, &st) && S_ISREG(st.st_mode))
            rc = add_file(b, e->d_name, true);
    }
    if (!rc && errno)
        rc = core_fail(KEEL_EIO, "cannot read data directory %s: %s", b->desc->dir, strerror(errno));
    if (dp)
        closedir(dp);
    if (!rc && !(b->made = calloc(b->nfiles, sizeof *b->made)))
        rc = core_fail(KEEL_ENOMEM, "out of memory listing the files of %s", b->desc->dir);
    return rc;
}

/* dest holds nothing but a data.mdb.new -- another run's claim before this
 * run's (it then refuses this one), this run's own after: a backup never
 * mixes with another directory's files, nor with another run's. */
static int dest_empty(const char *dest)
{
    DIR *dp = opendir(dest);
    if (!dp)
        return core_fail(KEEL_EIO, "cannot read backup destination %s: %s", dest, strerror(errno));
    struct dirent *e;
    const char *first = NULL;
    while (!first && (errno = 0, e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "data.mdb.new"))
            first = e->d_name;
    int rc = first ? core_fail(KEEL_EINVAL, "backup destination %s is not empty (it holds %s): give a new or empty "
                                             "directory", dest, first)
           : errno ? core_fail(KEEL_EIO, "cannot read backup destination %s: %s", dest, strerror(errno))
                   : KEEL_OK;
    closedir(dp);
    return rc;
}

/* dest made (rec.dir set), or an existing empty directory. */
static int take_dest(backup_run *b)
{
    const char *dest = b->desc->dest;
    struct stat st;
    if (stat(dest, &st)) {
        if (errno != ENOENT)
            return core_fail(KEEL_EIO, "cannot use backup destination %s: %s", dest, strerror(errno));
        if (mkdir(dest, 0755))
            return core_fail(errno == ENOENT ? KEEL_ENOENT : KEEL_EIO, "cannot create backup destination %s: %s",
                             dest, strerror(errno));
        b->rec.dir = dest;
        return KEEL_OK;
    }
    if (!S_ISDIR(st.st_mode))
        return core_fail(KEEL_EINVAL, "backup destination %s exists and is a file: give a new directory", dest);
    return dest_empty(dest);
}

/* Create files[i] exclusively with mode: the file is this run's from here. */
static int create_file(backup_run *b, size_t i, mode_t mode)
{
    int fd = open(b->files[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 07777);
    if (fd < 0 && errno == EEXIST && i == BK_TMP)
        return core_fail(KEEL_EBUSY, "backup destination %s holds data.mdb.new: another backup is writing into it "
                         "(or one was killed there: remove the directory)", b->desc->dest);
    if (fd < 0)
        return sync_fail("create", b->files[i]);
    b->made[i] = 1;
    return fd;
}

static int write_all(int fd, const char *buf, size_t n)
{
    while (n) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!w)
                errno = EIO; /* nothing written and no error said: errno is stale */
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Copy the application's file srcs[i] to files[i], synced, with its permission bits. */
static int copy_file(backup_run *b, size_t i)
{
    const char *src = b->srcs[i], *dst = b->files[i];
    struct stat st;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0 || fstat(in, &st)) {
        int rc = sync_fail("read", src);
        if (in >= 0)
            close(in);
        return rc;
    }
    int out = create_file(b, i, st.st_mode);
    if (out < 0) {
        close(in);
        return out;
    }
    char buf[65536];
    ssize_t n;
    int rc = KEEL_OK;
    while (!rc && (n = read(in, buf, sizeof buf)) != 0)
        if (n < 0 ? errno != EINTR : write_all(out, buf, (size_t)n))
            rc = n < 0 ? sync_fail("read", src) : sync_fail("write", dst);
    if (!rc && fsync(out))
        rc = sync_fail("sync", dst);
    close(in);
    close(out);
    return rc;
}

/* LMDB's compacting copy, in a read transaction of its own. A server that
 * grew its map since the source was opened makes that transaction's begin
 * fail with MDB_MAP_RESIZED before a byte is written: the copy takes the new
 * size and starts again, as kw_read_begin does. Damage its tree walk meets
 * (a page past the end, a damaged page) is KEEL_ECORRUPT (from_mdb). */
static int copy_data(backup_run *b, int fd)
{
    int rc = KEEL_FAILPOINT(BACKUP_COPY);
    if (rc)
        return rc;
    rc = mdb_env_copyfd2(b->src->env, fd, MDB_CP_COMPACT);
    if (rc == MDB_MAP_RESIZED && !(rc = mdb_env_set_mapsize(b->src->env, 0)))
        rc = mdb_env_copyfd2(b->src->env, fd, MDB_CP_COMPACT);
    return rc ? from_mdb(rc, "cannot copy", b->src) : KEEL_OK;
}

/* dest's parent, which holds the name of the dest this run made. */
static int sync_parent(const char *dest)
{
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dest);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
        parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash)
        return sync_dir(".");
    slash[slash == parent] = 0; /* "/dest": the root */
    return sync_dir(parent);
}

/* The data file as data.mdb.new, synced, then renamed: a failed or
 * interrupted backup never leaves a data.mdb (create_data_file's rule). */
static int write_data(backup_run *b)
{
    char src[4200];
    struct stat st;
    snprintf(src, sizeof src, "%s/data.mdb", b->desc->dir);
    if (stat(src, &st))
        return sync_fail("read", src);
    int fd = KEEL_FAILPOINT(BACKUP_CLAIM);
    fd = fd ? fd : create_file(b, BK_TMP, st.st_mode);
    if (fd < 0)
        return fd;
    int rc = dest_empty(b->desc->dest); /* the claim: another run's files here, and this one refuses */
    if (!rc && b->desc->made)
        b->desc->made(&b->rec, b->desc->arg);
    for (size_t i = BK_APP; !rc && i < b->nfiles; i++)
        rc = copy_file(b, i);
    rc = rc ? rc : copy_data(b, fd);
    if (!rc && fsync(fd))
        rc = sync_fail("sync", b->files[BK_TMP]);
    close(fd);
    if (!rc)
        b->made[BK_FINAL] = 1; /* before the rename: a signal meanwhile removes either name */
    if (!rc && rename(b->files[BK_TMP], b->files[BK_FINAL]))
        rc = sync_fail("rename the copy to", b->files[BK_FINAL]);
    if (!rc)
        b->made[BK_TMP] = 0;
    rc = rc ? rc : sync_dir(b->desc->dest);
    return rc || !b->rec.dir ? rc : sync_parent(b->desc->dest);
}

void kw_backup_unmake(const kw_backup_made *m)
{
    for (size_t i = 0; m->files[i]; i++)
        if (m->made[i])
            unlink(m->files[i]);
    if (m->dir)
        rmdir(m->dir); /* only when empty: never another run's file */
}

static void backup_free(backup_run *b)
{
    for (size_t i = 0; i < b->nfiles; i++) {
        free(b->files[i]);
        free(b->srcs[i]);
    }
    free(b->files);
    free(b->srcs);
    free((void *)b->made);
}

/* LMDB's compacting copy runs in one read transaction of its own, so it
 * copies exactly one committed state: every unit of work in it is whole
 * and recovery from the copy is recovery after a crash at that commit. It
 * omits free pages, so the copy is also the smallest form of the data. */
int kw_store_backup(const kw_backup_desc *desc)
{
    if (!desc || !desc->dir || !*desc->dir || !desc->dest || !*desc->dest || strlen(desc->dest) >= 4000)
        return core_fail(KEEL_EINVAL, "kw_store_backup: a directory name is missing or too long");
    core_fp_env_init(); /* KEEL_FAILPOINTS, as a runtime's create reads it: keel-wal makes no runtime */
    backup_run b = {.desc = desc};
    int rc = kw_store_open(desc->dir, &(kw_store_desc){.flags = KW_OPEN_READONLY}, &b.src);
    rc = rc ? rc : list_files(&b);
    b.rec = (kw_backup_made){.files = (const char *const *)b.files, .made = b.made};
    rc = rc ? rc : take_dest(&b);
    rc = rc ? rc : write_data(&b);
    if (rc && b.made)
        kw_backup_unmake(&b.rec);
    if (desc->made)
        desc->made(NULL, desc->arg);
    backup_free(&b);
    kw_store_close(b.src);
    return rc;
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

/* Delete the WAL records with from <= LSN <= to; the last EPOCH record
 * among them is copied to *epoch when asked (epoch->len 0: none). */
static int del_wal_range(kw_wtxn *t, uint64_t from, uint64_t to, uint64_t *deleted, kw_buf *epoch)
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
        if (k.mv_size != 8 || rdbe64(k.mv_data) > to)
            break;
        /* the kind byte of the header (the page is read anyway: the delete frees it) */
        if (epoch && kw_record_peek_kind(v.mv_data, v.mv_size) == KW_KIND_EPOCH) {
            epoch->len = 0;
            if ((rc = kw_put_bytes(epoch, v.mv_data, v.mv_size))) {
                mdb_cursor_close(cur);
                return rc;
            }
        }
        if ((rc = mdb_cursor_del(cur, 0)))
            break;
        n++;
        k = (MDB_val){8, kb};
    }
    mdb_cursor_close(cur);
    if (deleted)
        *deleted = n;
    return rc && rc != MDB_NOTFOUND ? wtxn_err(t, rc, "cannot delete WAL records from") : KEEL_OK;
}

/* The last WAL record with LSN <= upto as meta "trimmed" (mark: LSN, then
 * its header); *lsn 0 when there is none. */
static int trim_mark(kw_wtxn *t, uint64_t upto, unsigned char *mark, uint64_t *lsn)
{
    MDB_cursor *cur;
    *lsn = 0;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[KW_DB_WAL], &cur);
    if (rc)
        return wtxn_err(t, rc, "cannot open a cursor on");
    unsigned char kb[8];
    be64(kb, upto < UINT64_MAX ? upto + 1 : upto);
    MDB_val k = {8, kb}, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    rc = mdb_cursor_get(cur, &k, &v, rc == MDB_NOTFOUND ? MDB_LAST : MDB_PREV);
    if (!rc && k.mv_size == 8 && rdbe64(k.mv_data) <= upto) {
        *lsn = rdbe64(k.mv_data);
        for (int i = 0; i < 8; i++)
            mark[i] = (unsigned char)(*lsn >> (8 * i));
        memset(mark + 8, 0, KW_HEADER_SIZE);
        memcpy(mark + 8, v.mv_data, v.mv_size < KW_HEADER_SIZE ? v.mv_size : KW_HEADER_SIZE);
    }
    mdb_cursor_close(cur);
    return rc && rc != MDB_NOTFOUND ? wtxn_err(t, rc, "cannot read the WAL of") : KEEL_OK;
}

int kw_trimmed_get(kw_rtxn *r, uint64_t *lsn, const void **header)
{
    const unsigned char *v;
    size_t len;
    int rc = kw_get(r, KW_DB_META, KW_META_TRIMMED, strlen(KW_META_TRIMMED), (const void **)&v, &len);
    if (rc)
        return rc;
    if (len != 8 + KW_HEADER_SIZE)
        return core_fail(KEEL_ECORRUPT, "%s/data.mdb: meta \"%s\" holds %zu bytes, not %u", r->s->dir,
                         KW_META_TRIMMED, len, 8 + KW_HEADER_SIZE);
    *lsn = 0;
    for (int i = 0; i < 8; i++)
        *lsn |= (uint64_t)v[i] << (8 * i);
    *header = v + 8;
    return KEEL_OK;
}

int kw_trimmed_epoch_get(kw_rtxn *r, const void **rec, size_t *len)
{
    return kw_get(r, KW_DB_META, KW_META_TRIMMED_EPOCH, strlen(KW_META_TRIMMED_EPOCH), rec, len);
}

int kw_del_wal_upto(kw_wtxn *t, uint64_t upto, uint64_t *deleted)
{
    unsigned char mark[8 + KW_HEADER_SIZE];
    uint64_t last;
    kw_buf epoch = {0};
    int rc = trim_mark(t, upto, mark, &last);
    if (!rc)
        rc = del_wal_range(t, 0, upto, deleted, &epoch);
    if (!rc && last)
        rc = kw_put(t, KW_DB_META, KW_META_TRIMMED, strlen(KW_META_TRIMMED), mark, sizeof mark);
    if (!rc && epoch.len) /* else the one an earlier trim deleted (if any) is still the last */
        rc = kw_put(t, KW_DB_META, KW_META_TRIMMED_EPOCH, strlen(KW_META_TRIMMED_EPOCH), epoch.p, epoch.len);
    kw_buf_free(&epoch);
    return rc;
}

int kw_del_wal_from(kw_wtxn *t, uint64_t from, uint64_t *deleted)
{
    int rc = del_wal_range(t, from, UINT64_MAX, deleted, NULL);
    if (!rc && from <= 1) /* the whole WAL goes: what its front lost no longer describes it */
        rc = kw_del(t, KW_DB_META, KW_META_TRIMMED, strlen(KW_META_TRIMMED));
    if (!rc && from <= 1)
        rc = kw_del(t, KW_DB_META, KW_META_TRIMMED_EPOCH, strlen(KW_META_TRIMMED_EPOCH));
    return rc;
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

/* Read transactions this thread holds (any store). A thread that holds
 * one cannot wait for `remap` exclusively (it would wait for itself): it
 * resizes as LMDB lets a single thread do, under its own transactions. */
static _Thread_local uint32_t tl_reads;

/* Resize the map to size (0: to the file's size) with no other thread's
 * transaction open: the caller holds `remap` shared once (its write, or the
 * read it is beginning) and holds it so again afterwards. */
static int remap_to(kw_store *s, uint64_t size)
{
    if (tl_reads)
        return mdb_env_set_mapsize(s->env, size);
    pthread_rwlock_unlock(&s->remap);
    pthread_rwlock_wrlock(&s->remap);
    int rc = mdb_env_set_mapsize(s->env, size);
    pthread_rwlock_unlock(&s->remap);
    pthread_rwlock_rdlock(&s->remap);
    return rc;
}

/* Called holding `remap` shared (a write transaction just ended). */
static int grow(kw_store *s)
{
    if (s->map_size >= s->map_max)
        return core_fail(KEEL_ENOSPC, "%s/data.mdb is full: the map reached its maximum of %llu bytes", s->dir,
                         (unsigned long long)s->map_max);
    uint64_t size = s->map_size * 2 > s->map_max ? s->map_max : s->map_size * 2;
    int rc = remap_to(s, size);
    if (rc)
        return from_mdb(rc, "cannot grow the map of", s);
    s->map_size = size;
    return KEEL_OK;
}

static int store_write(kw_store *s, int (*fill)(kw_wtxn *txn, void *arg), void *arg);

int kw_store_write(kw_store *s, int (*fill)(kw_wtxn *txn, void *arg), void *arg)
{
    if (s->readonly)
        return core_fail(KEEL_EINVAL, "%s is open read-only", s->dir);
    pthread_rwlock_rdlock(&s->remap);
    int rc = store_write(s, fill, arg);
    pthread_rwlock_unlock(&s->remap);
    return rc;
}

static int store_write(kw_store *s, int (*fill)(kw_wtxn *txn, void *arg), void *arg)
{
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
    pthread_rwlock_rdlock(&s->remap);
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r->txn);
    if (rc == MDB_MAP_RESIZED) { /* another process grew the map */
        remap_to(s, 0);
        rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r->txn);
    }
    if (rc) {
        pthread_rwlock_unlock(&s->remap);
        free(r);
        return from_mdb(rc, "cannot begin a read transaction on", s);
    }
    tl_reads++;
    *out = r;
    return KEEL_OK;
}

void kw_read_end(kw_rtxn *r)
{
    if (!r)
        return;
    mdb_txn_abort(r->txn);
    pthread_rwlock_unlock(&r->s->remap);
    tl_reads--;
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

int kw_store_has(kw_store *s, kw_db db, const void *key, size_t klen)
{
    kw_rtxn *r;
    const void *v;
    size_t n;
    int rc = kw_read_begin(s, &r);
    if (rc)
        return rc;
    rc = kw_get(r, db, key, klen, &v, &n);
    kw_read_end(r);
    return rc == KEEL_ENOENT ? 0 : rc ? rc : 1;
}

static int iter_open(kw_rtxn *r, kw_db db, const void *start, size_t slen, size_t plen, kw_walit **out)
{
    *out = NULL; /* kw_wal_iter_end(NULL) is a no-op: a caller may end what failed to begin */
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
    *out = NULL;
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

int kw_snap_iter(kw_rtxn *r, kw_walit **out)
{
    int rc = iter_open(r, KW_DB_SNAP, SNAP_ORDER, 1, 1, out);
    if (!rc)
        (*out)->snap = 1;
    return rc;
}

int kw_db_next(kw_walit *it, const void **key, size_t *klen, const void **val, size_t *vlen)
{
    MDB_val k, v;
    int rc = step(it, &k, &v);
    while (rc == 0 && it->snap && SNAP_ORDER[it->snap]) { /* the next prefix of a snap iterator */
        it->startbuf[0] = (unsigned char)SNAP_ORDER[it->snap++];
        it->first = true;
        rc = step(it, &k, &v);
    }
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
